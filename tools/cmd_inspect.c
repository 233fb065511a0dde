/* shardload inspect: what a checkpoint holds (tensors, dtypes, shapes, bytes, files,
 * metadata), from the library's validated view of the headers. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char HELP[] =
    "usage: shardload inspect PATH [--json]\n"
    "\n"
    "List every tensor of a checkpoint with its dtype, shape, bytes and file, the metadata,\n"
    "and the totals. PATH is a .safetensors file, a model.safetensors.index.json, or a\n"
    "directory holding one. Every header is validated. Control characters in names,\n"
    "metadata and paths are printed escaped (\\n, \\t, \\xNN).\n"
    "\n"
    "options:\n"
    "  --json       one JSON object on stdout instead of the table; a path that is not\n"
    "               UTF-8 is kept: \"path\" (or a tensor's \"file\") has each invalid byte\n"
    "               as U+FFFD and \"path_bytes_hex\" (\"file_bytes_hex\") the exact bytes\n"

    "  -h, --help   show this help\n";

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* The JSON report; NULL when out of memory (a document with parts left out would be read as
 * the checkpoint's). */
static json_t *report_json(const char *path, const sl_source *src) {
  json_t *root = json_object(), *files = json_array(), *files_hex = json_array(), *meta = json_object(),
         *tensors = json_array();
  int bad = !root || !files || !files_hex || !meta || !tensors;
  bad |= cli_json_set_path(root, "path", path);

  /* "files": one string per file, in order, as "path" is written; when some name is not
   * valid UTF-8, "files_bytes_hex" holds at the same index its exact bytes (null for the
   * others) */
  int any_hex = 0;
  for (size_t i = 0; i < sl_source_file_count(src) && !bad; i++) {
    json_t *value, *hex;
    bad |= cli_json_path_values(sl_source_file_at(src, i), &value, &hex);
    any_hex |= hex != NULL;
    bad |= json_array_append_new(files, value ? value : json_null());
    bad |= json_array_append_new(files_hex, hex ? hex : json_null());
  }
  bad |= json_object_set_new(root, "files", files);
  if (any_hex)
    bad |= json_object_set_new(root, "files_bytes_hex", files_hex);
  else
    json_decref(files_hex);

  for (size_t i = 0; i < sl_source_metadata_count(src) && !bad; i++) {
    const char *k = NULL, *v = NULL;
    if (sl_source_metadata_at(src, i, &k, &v) == SL_OK && k)
      bad |= json_object_set_new(meta, k, json_string(v ? v : ""));
  }
  bad |= json_object_set_new(root, "metadata", meta);

  size_t n = sl_source_tensor_count(src);
  for (size_t i = 0; i < n && !bad; i++) {
    const sl_source_tensor *t = sl_source_tensor_at(src, i);
    json_t *o = json_object();
    bad |= json_object_set_new(o, "name", json_string(t->name));
    bad |= json_object_set_new(o, "dtype", json_string(sl_dtype_name(t->dtype)));
    bad |= json_object_set_new(o, "shape", cli_json_dims(t->ndim, t->shape));
    bad |= json_object_set_new(o, "bytes", json_integer((json_int_t)t->nbytes));
    bad |= cli_json_set_path(o, "file", t->file);
    bad |= json_object_set_new(o, "offset", json_integer((json_int_t)t->file_offset));
    bad |= json_array_append_new(tensors, o); /* takes o, NULL included */
  }
  bad |= json_object_set_new(root, "tensors", tensors);
  bad |= json_object_set_new(root, "tensor_count", json_integer((json_int_t)n));
  bad |= json_object_set_new(root, "file_count", json_integer((json_int_t)sl_source_file_count(src)));
  bad |= json_object_set_new(root, "total_bytes", json_integer((json_int_t)sl_source_total_bytes(src)));
  if (!bad) return root;
  json_decref(root);
  return NULL;
}

static int print_json(cli_out *o, const char *path, const sl_source *src) {
  json_t *root = report_json(path, src);
  if (!root) {
    cli_error(path, SL_ERR_NOMEM, "out of memory writing the JSON report of %zu tensors", sl_source_tensor_count(src));
    return CLI_EXIT_ERROR;
  }
  int rc = cli_out_json_document(o, root);
  json_decref(root);
  return rc == 0 ? CLI_EXIT_OK : cli_out_fail(path, o, "the JSON report");
}

/* Names, metadata and file names come from the checkpoint: printed with control characters
 * escaped (cli_out_escaped), so a name cannot fake rows or drive the terminal. */
static int print_table(cli_out *o, const char *path, const sl_source *src) {
  size_t n = sl_source_tensor_count(src), nfiles = sl_source_file_count(src);
  char hb[32], dims[160];
  uint64_t total = sl_source_total_bytes(src);

  cli_out_escaped(o, path, 0);
  cli_out_printf(o, ": %zu tensors, %llu bytes (%s) in %zu file%s\n", n, (unsigned long long)total,
                 cli_human_bytes(hb, sizeof hb, total), nfiles, nfiles == 1 ? "" : "s");

  size_t nmeta = sl_source_metadata_count(src);
  if (nmeta) cli_out_puts(o, "metadata:\n");
  for (size_t i = 0; i < nmeta; i++) {
    const char *k = NULL, *v = NULL;
    if (sl_source_metadata_at(src, i, &k, &v) != SL_OK || !k) continue;
    cli_out_puts(o, "  ");
    cli_out_escaped(o, k, 0);
    cli_out_puts(o, ": ");
    cli_out_escaped(o, v ? v : "", 0);
    cli_out_puts(o, "\n");
  }

  /* Column widths from the content so long names stay aligned without truncation. */
  int wname = 4, wshape = 5;
  for (size_t i = 0; i < n; i++) {
    const sl_source_tensor *t = sl_source_tensor_at(src, i);
    int l = (int)cli_escaped_len(t->name);
    if (l > wname) wname = l;
    l = (int)strlen(cli_dims_str(dims, sizeof dims, t->ndim, t->shape));
    if (l > wshape) wshape = l;
  }
  cli_out_printf(o, "%-*s  %-7s  %-*s  %14s  %s\n", wname, "NAME", "DTYPE", wshape, "SHAPE", "BYTES", "FILE");
  /* every write is checked: after a failure the rest fail at once, and the flush says why */
  for (size_t i = 0; i < n && !o->err; i++) {
    const sl_source_tensor *t = sl_source_tensor_at(src, i);
    cli_out_escaped(o, t->name, wname);
    cli_out_printf(o, "  %-7s  %-*s  %14llu  ", sl_dtype_name(t->dtype), wshape,
                   cli_dims_str(dims, sizeof dims, t->ndim, t->shape), (unsigned long long)t->nbytes);
    cli_out_escaped(o, base_name(t->file), 0);
    cli_out_puts(o, "\n");
  }
  return cli_out_flush(o) == 0 ? CLI_EXIT_OK : cli_out_fail(path, o, "the table");
}

int cli_cmd_inspect(int argc, char **argv) {
  static const struct option longopts[] = {
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0},
  };
  int json = 0, c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 'j': json = 1; break;
    case 'h': return cli_print_help(HELP);
    default: return cli_bad_option("inspect", c, argv);
    }
  }
  if (argc - optind != 1)
    return cli_usage_error("inspect", "%s; run 'shardload inspect --help'",
                           argc - optind ? "takes exactly one PATH" : "needs a PATH");
  const char *path = argv[optind];

  sl_context *ctx = NULL;
  if (cli_local_context(&ctx) != CLI_EXIT_OK) return CLI_EXIT_ERROR;
  int rc = CLI_EXIT_OK;
  sl_source *src = NULL;
  sl_status s = sl_source_open(ctx, path, &src);
  if (s != SL_OK) {
    rc = cli_fail(path, s, ctx);
    goto out_ctx;
  }
  cli_out o;
  cli_out_init(&o, cli_report(), "stdout");
  rc = json ? print_json(&o, path, src) : print_table(&o, path, src);
  sl_source_destroy(src);
out_ctx:
  sl_context_destroy(ctx);
  return rc;
}
