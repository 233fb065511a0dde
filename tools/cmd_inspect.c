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

static int print_json(const char *path, const sl_source *src) {
  json_t *root = json_object();
  cli_json_set_path(root, "path", path);

  /* "files": one string per file, in order, as "path" is written; when some name is not
   * valid UTF-8, "files_bytes_hex" holds at the same index its exact bytes (null for the
   * others) */
  json_t *files = json_array(), *files_hex = json_array();
  int any_hex = 0;
  for (size_t i = 0; i < sl_source_file_count(src); i++) {
    json_t *value, *hex;
    cli_json_path_values(sl_source_file_at(src, i), &value, &hex);
    any_hex |= hex != NULL;
    json_array_append_new(files, value ? value : json_null());
    json_array_append_new(files_hex, hex ? hex : json_null());
  }
  json_object_set_new(root, "files", files);
  if (any_hex)
    json_object_set_new(root, "files_bytes_hex", files_hex);
  else
    json_decref(files_hex);

  json_t *meta = json_object();
  for (size_t i = 0; i < sl_source_metadata_count(src); i++) {
    const char *k = NULL, *v = NULL;
    if (sl_source_metadata_at(src, i, &k, &v) == SL_OK && k)
      json_object_set_new(meta, k, json_string(v ? v : ""));
  }
  json_object_set_new(root, "metadata", meta);

  json_t *tensors = json_array();
  size_t n = sl_source_tensor_count(src);
  for (size_t i = 0; i < n; i++) {
    const sl_source_tensor *t = sl_source_tensor_at(src, i);
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(t->name));
    json_object_set_new(o, "dtype", json_string(sl_dtype_name(t->dtype)));
    json_object_set_new(o, "shape", cli_json_dims(t->ndim, t->shape));
    json_object_set_new(o, "bytes", json_integer((json_int_t)t->nbytes));
    cli_json_set_path(o, "file", t->file);
    json_object_set_new(o, "offset", json_integer((json_int_t)t->file_offset));
    json_array_append_new(tensors, o);
  }
  json_object_set_new(root, "tensors", tensors);
  json_object_set_new(root, "tensor_count", json_integer((json_int_t)n));
  json_object_set_new(root, "file_count", json_integer((json_int_t)sl_source_file_count(src)));
  json_object_set_new(root, "total_bytes", json_integer((json_int_t)sl_source_total_bytes(src)));

  int rc = cli_json_print(stdout, root);
  json_decref(root);
  return rc;
}

/* Names, metadata and file names come from the checkpoint: printed with control characters
 * escaped (cli_escape_dup), so a name cannot fake rows or drive the terminal. */
static int print_table(const char *path, const sl_source *src) {
  size_t n = sl_source_tensor_count(src), nfiles = sl_source_file_count(src);
  char hb[32], dims[160];
  uint64_t total = sl_source_total_bytes(src);
  char **names = calloc(n ? n : 1, sizeof *names);
  char *esc_path = cli_escape_dup(path);
  int rc = -1;
  if (!names || !esc_path) goto out;
  for (size_t i = 0; i < n; i++)
    if (!(names[i] = cli_escape_dup(sl_source_tensor_at(src, i)->name))) goto out;

  printf("%s: %zu tensors, %llu bytes (%s) in %zu file%s\n", esc_path, n, (unsigned long long)total,
         cli_human_bytes(hb, sizeof hb, total), nfiles, nfiles == 1 ? "" : "s");

  size_t nmeta = sl_source_metadata_count(src);
  if (nmeta) {
    printf("metadata:\n");
    for (size_t i = 0; i < nmeta; i++) {
      const char *k = NULL, *v = NULL;
      if (sl_source_metadata_at(src, i, &k, &v) != SL_OK || !k) continue;
      char *ek = cli_escape_dup(k), *ev = cli_escape_dup(v ? v : "");
      if (ek && ev) printf("  %s: %s\n", ek, ev);
      free(ek);
      free(ev);
    }
  }

  /* Column widths from the content so long names stay aligned without truncation. */
  int wname = 4, wshape = 5;
  for (size_t i = 0; i < n; i++) {
    const sl_source_tensor *t = sl_source_tensor_at(src, i);
    int l = (int)strlen(names[i]);
    if (l > wname) wname = l;
    l = (int)strlen(cli_dims_str(dims, sizeof dims, t->ndim, t->shape));
    if (l > wshape) wshape = l;
  }
  printf("%-*s  %-7s  %-*s  %14s  %s\n", wname, "NAME", "DTYPE", wshape, "SHAPE", "BYTES", "FILE");
  for (size_t i = 0; i < n; i++) {
    const sl_source_tensor *t = sl_source_tensor_at(src, i);
    char *file = cli_escape_dup(base_name(t->file));
    printf("%-*s  %-7s  %-*s  %14llu  %s\n", wname, names[i], sl_dtype_name(t->dtype), wshape,
           cli_dims_str(dims, sizeof dims, t->ndim, t->shape), (unsigned long long)t->nbytes,
           file ? file : "?");
    free(file);
  }
  rc = 0;
out:
  for (size_t i = 0; names && i < n; i++) free(names[i]);
  free(names);
  free(esc_path);
  return rc;
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
    case 'h': fputs(HELP, stdout); return CLI_EXIT_OK;
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
  if (json) {
    if (print_json(path, src) != 0) {
      cli_error(path, SL_ERR_IO, "cannot write the JSON report to stdout; check the output stream");
      rc = CLI_EXIT_ERROR;
    }
  } else if (print_table(path, src) != 0) {
    cli_error(path, SL_ERR_NOMEM, "out of memory listing %zu tensors", sl_source_tensor_count(src));
    rc = CLI_EXIT_ERROR;
  }
  sl_source_destroy(src);
out_ctx:
  sl_context_destroy(ctx);
  return rc;
}
