/* shardload plan: a dry run of the shard geometry (every rank's local shape and global offset
 * of every tensor, and its bytes) and, with --hosts/--readers/--traffic, of the bytes a load
 * moves (plan_traffic.c); plus the plan options `plan` and `load` share. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char HELP[] =
    "usage: shardload plan PATH --world N [options]\n"
    "\n"
    "Dry run: resolve the plan for every rank of a world of N ranks and print each tensor's\n"
    "placement, local shape, global offset and bytes, and the bytes each rank holds. Nothing\n"
    "is read but the headers. The plan is checked as a load checks it (tensors the plan\n"
    "names that the checkpoint lacks, strictness, every placement and dtype): a plan that\n"
    "fails here fails the load the same way.\n"
    "\n"
    "options:\n"
    "  --world N             world size (default: the product of --mesh)\n"
    "  --mesh AxB            device mesh, row-major (default: 1-D [N])\n"
    "  --placement SPEC      default placement, e.g. 'shard(0)', 'replicate',\n"
    "                        '[replicate, shard(0)]' (default: FSDP2, shard(0); 0-d replicated)\n"
    "  --replicate PATTERN   replicate tensors whose whole name matches the glob (repeatable;\n"
    "                        later rules win)\n"
    "  --param-dtype DT      cast floating tensors to DT (F32, BF16, F16, F64, torch names)\n"
    "  --plan FILE           read a JSON plan file first; the options above override it\n"
    "  --rank R              show only rank R (in the traffic section too)\n"
    "  --hosts H             the world runs on H hosts of N/H consecutive ranks each (H must\n"
    "                        divide N; default 1); shows the traffic section\n"
    "  --readers R           distributed readers, 1..N, chosen as `load --source readers\n"
    "                        --readers R` chooses them (the lowest rank of each host, then the\n"
    "                        next lowest...; default one per host); shows the traffic section\n"
    "  --traffic             the traffic section alone: no per-rank tensor tables (fast at any\n"
    "                        world)\n"
    "  --json                one JSON object on stdout instead of the tables; a path that\n"
    "                        is not UTF-8 is kept: \"path\" has each invalid byte as U+FFFD\n"
    "                        and \"path_bytes_hex\" the exact bytes in hex. Written rank by\n"
    "                        rank (memory does not grow with --world); an error, a full disk\n"
    "                        included, ends it there with exit status 1\n"
    "  -h, --help            show this help\n"
    "\n"
    "The traffic section (--hosts, --readers or --traffic): the bytes a load with the scatter\n"
    "strategy moves, side by side for rank 0 reading alone (--source rank0) and for distributed\n"
    "readers (--source readers). A reader sends every other rank exactly its part of each tensor\n"
    "of its share, in the wire dtype (the smaller of the file's and --param-dtype's); under HSDP\n"
    "(a 2-D+ mesh whose dim 0 is replicate) it scatters within its own replica and each rank\n"
    "passes its part to the same position in the next replica away from the reader's, one hop\n"
    "per replica. A host's link carries only bytes between ranks of different hosts. Shown:\n"
    "each reader's rank, host, bytes read and bytes sent (every byte its rank sends, chain\n"
    "hops included); each host's link bytes out and in;\n"
    "bytes received per rank as min/median/max (the median is the lower middle value), and\n"
    "every rank when N <= 64 (or rank R with --rank); the largest share read, what rank 0 and\n"
    "the busiest sender send, and the busiest link. With --json, the document holds a\n"
    "\"traffic\" object after \"mesh\": {\"strategy\": \"scatter\", \"hosts\", \"ranks_per_host\",\n"
    "\"tensors\", \"read_bytes\", \"rank0\": MODE, \"readers\": MODE}, MODE being {\"reader_count\",\n"
    "\"largest_read_bytes\", \"rank0_sent_bytes\", \"max_sent_bytes\", \"busiest_link\": {\"host\",\n"
    "\"direction\" (\"out\"/\"in\"), \"bytes\"} (host and direction null when no byte crosses a\n"
    "link), \"received_bytes\": {\"min\", \"median\", \"max\"}, \"readers\": [{\"rank\", \"host\",\n"
    "\"read_bytes\", \"sent_bytes\"}], \"hosts\": [{\"host\", \"first_rank\", \"link_sent_bytes\",\n"
    "\"link_received_bytes\"}], \"rank_received_bytes\" and \"rank_sent_bytes\": one integer per\n"
    "rank}; with --traffic the document ends there, with no \"ranks\" array.\n";

/* ---- plan options shared with `load` ---------------------------------------------------- */

int cli_plan_option(cli_plan_args *a, int c, const char *arg) {
  switch (c) {
  case CLI_OPT_PLAN: a->plan_file = arg; return 1;
  case CLI_OPT_PLACEMENT: a->placement = arg; return 1;
  case CLI_OPT_REPLICATE:
    if (a->replicate_count == CLI_MAX_RULES) {
      cli_usage_error("--replicate", "more than %d patterns; put the rules in a --plan file",
                      CLI_MAX_RULES);
      return -CLI_EXIT_USAGE;
    }
    if (!*arg) {
      cli_usage_error("--replicate", "empty pattern; give a glob such as '*.bias'");
      return -CLI_EXIT_USAGE;
    }
    a->replicate[a->replicate_count++] = arg;
    return 1;
  case CLI_OPT_PARAM_DTYPE:
    a->param_dtype = cli_parse_dtype("--param-dtype", arg);
    return a->param_dtype == SL_DTYPE_INVALID ? -CLI_EXIT_USAGE : 1;
  case CLI_OPT_MESH:
    a->mesh_ndim = cli_parse_mesh(arg, a->mesh);
    if (a->mesh_ndim < 0) {
      a->mesh_ndim = 0;
      cli_usage_error("--mesh", "cannot parse '%s'; give up to %d positive sizes such as 8 or 2x4",
                      arg, SL_MAX_MESH_DIMS);
      return -CLI_EXIT_USAGE;
    }
    return 1;
  default: return 0;
  }
}

int cli_plan_args_check(const cli_plan_args *a) {
  if (a->placement) {
    sl_mesh_placement pl[SL_MAX_MESH_DIMS];
    int nd = a->mesh_ndim ? a->mesh_ndim : 1;
    if (sl_placement_parse(a->placement, nd, pl) != SL_OK)
      return cli_usage_error("--placement",
                             "cannot parse '%s' for a %d-D mesh; give one placement per mesh dim "
                             "such as 'shard(0)', 'replicate' or '[replicate, shard(0)]'",
                             a->placement, nd);
  }
  return CLI_EXIT_OK;
}

int cli_plan_build(sl_context *ctx, const cli_plan_args *a, sl_plan **out) {
  sl_plan *plan = NULL;
  const char *subject = "plan";
  int usage = 0; /* the failing setting came from a command-line option, not the plan file */
  sl_status s = sl_plan_create(ctx, &plan);
  if (s != SL_OK) goto out_fail;
  /* The file first, so options given on the command line override it. */
  if (a->plan_file) {
    subject = a->plan_file;
    if ((s = sl_plan_load_json(plan, a->plan_file)) != SL_OK) goto out_fail;
  }
  if (a->mesh_ndim) {
    subject = "--mesh";
    usage = 1;
    if ((s = sl_plan_set_mesh(plan, a->mesh_ndim, a->mesh)) != SL_OK) goto out_fail;
  }
  if (a->has_policy) {
    subject = "--offload-policy";
    usage = 1;
    if ((s = sl_plan_set_offload_policy(plan, &a->policy)) != SL_OK) goto out_fail;
  }
  if (a->param_dtype != SL_DTYPE_INVALID) {
    subject = "--param-dtype";
    usage = 1;
    if ((s = sl_plan_set_param_dtype(plan, a->param_dtype)) != SL_OK) goto out_fail;
  }
  if (a->placement) {
    subject = "--placement";
    usage = 1;
    if ((s = sl_plan_set_default_placement(plan, a->placement)) != SL_OK) goto out_fail;
  }
  for (int i = 0; i < a->replicate_count; i++) {
    subject = a->replicate[i];
    usage = 1;
    if ((s = sl_plan_add_rule(plan, a->replicate[i], "replicate", SL_DTYPE_INVALID)) != SL_OK)
      goto out_fail;
  }
  if (a->strict) {
    subject = "--strict";
    usage = 1;
    if ((s = sl_plan_set_strict(plan, 1)) != SL_OK) goto out_fail;
  }
  *out = plan;
  return CLI_EXIT_OK;

out_fail:
  cli_fail(subject, s, ctx);
  sl_plan_destroy(plan);
  /* an option the library refuses (--param-dtype I32) is a usage error wherever it is found,
   * in `plan`, in `load`, or in a rank that `load --nproc` started */
  return usage ? CLI_EXIT_USAGE : CLI_EXIT_ERROR;
}

/* ---- the dry run ------------------------------------------------------------------------- */

typedef struct plan_row {
  const sl_source_tensor *t;
  sl_shard_geometry g;
  char placement[96];
} plan_row;

/* Resolves every tensor for RANK. On failure prints the line naming the tensor. */
/* Rows for the tensors a load would take; *kept counts them (tensors a plan with entries does
 * not name are skipped by the load, so the dry run leaves them out too). */
static int resolve_rank(sl_context *ctx, sl_plan *plan, const sl_source *src, int rank, int world,
                        plan_row *rows, size_t *kept, uint64_t *total) {
  size_t n = sl_source_tensor_count(src), k = 0;
  *total = 0;
  for (size_t i = 0; i < n; i++) {
    plan_row *w = &rows[k];
    w->t = sl_source_tensor_at(src, i);
    w->g.size = sizeof w->g;
    sl_status s = sl_plan_geometry(plan, w->t, rank, world, &w->g);
    if (s == SL_OK && w->g.skipped) continue;
    if (s == SL_OK) s = sl_plan_describe(plan, w->t, w->placement, sizeof w->placement);
    if (s != SL_OK) return cli_fail(w->t->name, s, ctx);
    *total += w->g.nbytes;
    k++;
  }
  *kept = k;
  return CLI_EXIT_OK;
}

/* RANK's object of the JSON report; NULL when out of memory (every value here is valid UTF-8:
 * tensor names passed the header's UTF-8 check, the rest is ASCII). */
static json_t *rank_json(int rank, const plan_row *rows, size_t n, uint64_t total) {
  json_t *r = json_object(), *ts = json_array();
  int bad = !r || !ts;
  for (size_t i = 0; i < n && !bad; i++) {
    const plan_row *w = &rows[i];
    json_t *o = json_object();
    bad |= json_object_set_new(o, "name", json_string(w->t->name));
    bad |= json_object_set_new(o, "file_dtype", json_string(sl_dtype_name(w->t->dtype)));
    bad |= json_object_set_new(o, "dtype", json_string(sl_dtype_name(w->g.dtype)));
    bad |= json_object_set_new(o, "placement", json_string(w->placement));
    bad |= json_object_set_new(o, "replicated", json_boolean(w->g.replicated));
    bad |= json_object_set_new(o, "global_shape", cli_json_dims(w->t->ndim, w->t->shape));
    bad |= json_object_set_new(o, "local_shape", cli_json_dims(w->g.ndim, w->g.local_shape));
    bad |= json_object_set_new(o, "global_offset", cli_json_dims(w->g.ndim, w->g.global_offset));
    bad |= json_object_set_new(o, "bytes", json_integer((json_int_t)w->g.nbytes));
    bad |= json_array_append_new(ts, o); /* takes o (NULL included) */
  }
  bad |= json_object_set_new(r, "rank", json_integer(rank));
  bad |= json_object_set_new(r, "tensors", ts); /* takes ts */
  bad |= json_object_set_new(r, "tensor_count", json_integer((json_int_t)n));
  bad |= json_object_set_new(r, "total_bytes", json_integer((json_int_t)total));
  if (!bad) return r;
  json_decref(r);
  return NULL;
}

static void rank_table(cli_out *o, int rank, int world, const plan_row *rows, size_t n, uint64_t total) {
  char hb[32], a[160], b[160], dt[32];
  int wname = 4, wdt = 5, wpl = 9, wls = 11;
  for (size_t i = 0; i < n; i++) {
    const plan_row *w = &rows[i];
    int l = (int)cli_escaped_len(w->t->name);
    if (l > wname) wname = l;
    l = w->t->dtype == w->g.dtype
            ? snprintf(dt, sizeof dt, "%s", sl_dtype_name(w->g.dtype))
            : snprintf(dt, sizeof dt, "%s->%s", sl_dtype_name(w->t->dtype), sl_dtype_name(w->g.dtype));
    if (l > wdt) wdt = l;
    l = (int)strlen(w->placement);
    if (l > wpl) wpl = l;
    l = (int)strlen(cli_dims_str(a, sizeof a, w->g.ndim, w->g.local_shape));
    if (l > wls) wls = l;
  }
  cli_out_printf(o, "rank %d of %d: %zu tensors, %llu bytes (%s)\n", rank, world, n, (unsigned long long)total,
                 cli_human_bytes(hb, sizeof hb, total));
  cli_out_printf(o, "  %-*s  %-*s  %-*s  %-*s  %-13s  %12s\n", wname, "NAME", wdt, "DTYPE", wpl, "PLACEMENT", wls,
                 "LOCAL SHAPE", "GLOBAL OFFSET", "BYTES");
  for (size_t i = 0; i < n && !o->err; i++) {
    const plan_row *w = &rows[i];
    if (w->t->dtype == w->g.dtype)
      snprintf(dt, sizeof dt, "%s", sl_dtype_name(w->g.dtype));
    else
      snprintf(dt, sizeof dt, "%s->%s", sl_dtype_name(w->t->dtype), sl_dtype_name(w->g.dtype));
    cli_out_puts(o, "  ");
    cli_out_escaped(o, w->t->name, wname); /* names come from the checkpoint */
    cli_out_printf(o, "  %-*s  %-*s  %-*s  %-13s  %12llu\n", wdt, dt, wpl, w->placement, wls,
                   cli_dims_str(a, sizeof a, w->g.ndim, w->g.local_shape),
                   cli_dims_str(b, sizeof b, w->g.ndim, w->g.global_offset), (unsigned long long)w->g.nbytes);
  }
}

/* ---- the JSON report, streamed ------------------------------------------------------------
 * One rank's object at a time, so memory does not grow with the world (a world of 16384 held
 * 1.7 GB as one document). The bytes are those jansson writes for the whole document
 * (cli_out_json_document: JSON_INDENT(2), JSON_PRESERVE_ORDER): the head object is dumped
 * without its closing brace, and each rank object, dumped on its own, is indented to its depth
 * in "ranks" (cli_out's indent: four spaces after every newline; strings hold no raw newline). */

/* {"path", ["path_bytes_hex",] "world_size", "mesh", ["traffic",] then "ranks": [ up to the
 * first rank. */
/* TRAFFIC (NULL: none) comes after "mesh"; with TRAFFIC_ONLY the document ends after it, with
 * no "ranks". */
static int json_stream_head(cli_out *o, const char *path, long world, int mesh_ndim, const int64_t *mesh,
                            const cli_traffic *traffic, int traffic_only) {
  json_t *head = json_object(), *value = NULL, *hex = NULL;
  int bad = cli_json_path_values(path, &value, &hex);
  bad |= json_object_set_new(head, "path", value);
  if (hex) bad |= json_object_set_new(head, "path_bytes_hex", hex);
  bad |= json_object_set_new(head, "world_size", json_integer(world));
  bad |= json_object_set_new(head, "mesh", cli_json_dims(mesh_ndim, mesh));
  if (traffic) bad |= json_object_set_new(head, "traffic", cli_traffic_json(traffic));
  int rc = bad ? -1 : traffic_only ? cli_out_json_document(o, head) : cli_out_json_open_array(o, head, "ranks");
  json_decref(head);
  return rc == 0 ? CLI_EXIT_OK : cli_out_fail(path, o, "the JSON report");
}

/* One rank's object, the COUNT-th written (from 0). */
static int json_stream_rank(cli_out *o, const char *path, size_t count, int rank, const plan_row *rows, size_t n,
                            uint64_t total) {
  json_t *r = rank_json(rank, rows, n, total);
  if (!r) {
    cli_error(path, SL_ERR_NOMEM, "out of memory writing rank %d of the JSON report", rank);
    return CLI_EXIT_ERROR;
  }
  int rc = cli_out_puts(o, count ? ",\n    " : "\n    ");
  o->indent = "    ";
  if (rc == 0) rc = cli_out_json(o, r);
  o->indent = "";
  json_decref(r);
  return rc == 0 ? CLI_EXIT_OK : cli_out_fail(path, o, "the JSON report");
}

/* Closes "ranks" and the document; the last write is checked by the flush. */
static int json_stream_end(cli_out *o, const char *path, size_t count) {
  int rc = cli_out_puts(o, count ? "\n  ]\n}\n" : "]\n}\n");
  if (rc == 0) rc = cli_out_flush(o);
  return rc == 0 ? CLI_EXIT_OK : cli_out_fail(path, o, "the JSON report");
}

/* The tables are written rank by rank too: each one flushed and checked, so a full disk
 * ends the run with its reason instead of exit status 0. */
static int table_flush(cli_out *o, const char *path, int rank) {
  return cli_out_flush(o) == 0 ? CLI_EXIT_OK : cli_out_fail(path, o, "the plan of rank %d", rank);
}

int cli_cmd_plan(int argc, char **argv) {
  static const struct option longopts[] = {
      {"world", required_argument, NULL, 'w'},
      {"rank", required_argument, NULL, 'r'},
      {"json", no_argument, NULL, 'j'},
      {"hosts", required_argument, NULL, 'H'},
      {"readers", required_argument, NULL, 'R'},
      {"traffic", no_argument, NULL, 'T'},
      {"help", no_argument, NULL, 'h'},
      CLI_PLAN_LONGOPTS,
      {0, 0, 0, 0},
  };
  cli_plan_args pa;
  memset(&pa, 0, sizeof pa);
  long world = 0, only_rank = -1, hosts = 0, readers = 0;
  int json = 0, traffic_only = 0, c, r;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    if ((r = cli_plan_option(&pa, c, optarg)) != 0) {
      if (r < 0) return -r;
      continue;
    }
    switch (c) {
    case 'w':
      if (cli_parse_int(optarg, 1, 1 << 20, &world))
        return cli_usage_error("--world", "'%s' is not a world size; give a positive integer", optarg);
      break;
    case 'r':
      if (cli_parse_int(optarg, 0, 1 << 20, &only_rank))
        return cli_usage_error("--rank", "'%s' is not a rank; give an integer from 0", optarg);
      break;
    case 'j': json = 1; break;
    case 'H':
      if (cli_parse_int(optarg, 1, 1 << 20, &hosts))
        return cli_usage_error("--hosts", "'%s' is not a number of hosts; give a positive integer", optarg);
      break;
    case 'R':
      if (cli_parse_int(optarg, 1, 1 << 20, &readers))
        return cli_usage_error("--readers", "'%s' is not a number of readers; give an integer from 1 to the world size",
                               optarg);
      break;
    case 'T': traffic_only = 1; break;
    case 'h': return cli_print_help(HELP);
    default: return cli_bad_option("plan", c, argv);
    }
  }
  if (argc - optind != 1)
    return cli_usage_error("plan", "%s; run 'shardload plan --help'",
                           argc - optind ? "takes exactly one PATH" : "needs a PATH");
  const char *path = argv[optind];

  long mesh_product = 1;
  for (int d = 0; d < pa.mesh_ndim; d++) mesh_product *= pa.mesh[d];
  if (!world && !pa.mesh_ndim)
    return cli_usage_error("plan", "needs --world N (the number of ranks) or --mesh");
  if (!world) world = mesh_product;
  if (pa.mesh_ndim && mesh_product != world)
    return cli_usage_error("--mesh", "mesh holds %ld ranks but --world is %ld; make them agree",
                           mesh_product, world);
  if (only_rank >= world)
    return cli_usage_error("--rank", "rank %ld is outside a world of %ld; give 0..%ld", only_rank,
                           world, world - 1);
  if (hosts && world % hosts)
    return cli_usage_error("--hosts", "a world of %ld ranks does not split into %ld hosts of equal size; give a "
                           "divisor of %ld (each host holds world/H consecutive ranks)", world, hosts, world);
  if (readers > world)
    return cli_usage_error("--readers", "%ld readers in a world of %ld ranks; give 1..%ld", readers, world, world);
  const int traffic_on = hosts || readers || traffic_only;
  if ((r = cli_plan_args_check(&pa)) != CLI_EXIT_OK) return r;

  sl_context *ctx = NULL;
  if (cli_local_context(&ctx) != CLI_EXIT_OK) return CLI_EXIT_ERROR;
  int rc = CLI_EXIT_OK;
  sl_source *src = NULL;
  sl_plan *plan = NULL;
  plan_row *rows = NULL;
  cli_traffic traffic;
  memset(&traffic, 0, sizeof traffic);
  cli_out o;
  cli_out_init(&o, cli_report(), "stdout");
  sl_status s = sl_source_open(ctx, path, &src);
  if (s != SL_OK) {
    rc = cli_fail(path, s, ctx);
    goto out_ctx;
  }
  if ((rc = cli_plan_build(ctx, &pa, &plan)) != CLI_EXIT_OK) goto out_source;
  /* what sl_load's phase 1 checks (tensors the plan names that the checkpoint lacks,
   * strictness, every placement and dtype), by the same code: `plan` fails where `load` would */
  if ((s = sl_plan_check(plan, src, (int)world)) != SL_OK) {
    rc = cli_fail(path, s, ctx);
    goto out_plan;
  }

  size_t n = sl_source_tensor_count(src);
  rows = calloc(n ? n : 1, sizeof *rows);
  if (!rows) {
    cli_error(path, SL_ERR_NOMEM, "out of memory for %zu tensors", n);
    rc = CLI_EXIT_ERROR;
    goto out_plan;
  }

  /* the mesh the plan resolved to: --mesh, a plan file's, or 1-D [world] */
  int plan_mesh[SL_MAX_MESH_DIMS];
  int mesh_ndim = sl_plan_mesh(plan, (int)world, plan_mesh);
  int64_t mesh[SL_MAX_MESH_DIMS];
  for (int d = 0; d < mesh_ndim; d++) mesh[d] = plan_mesh[d];
  if (traffic_on) {
    rc = cli_traffic_compute(ctx, path, plan, src, (int)world, hosts ? (int)hosts : 1, (int)readers, &traffic);
    if (rc != CLI_EXIT_OK) goto out_rows;
  }
  if (json) {
    rc = json_stream_head(&o, path, world, mesh_ndim, mesh, traffic_on ? &traffic : NULL, traffic_only);
    if (rc != CLI_EXIT_OK || traffic_only) goto out_rows;
  } else {
    char m[160];
    cli_out_puts(&o, "plan for ");
    cli_out_escaped(&o, path, 0);
    cli_out_printf(&o, ": world %ld, mesh %s, %zu tensors\n", world, cli_dims_str(m, sizeof m, mesh_ndim, mesh), n);
    if (traffic_on) {
      cli_traffic_table(&o, &traffic, (int)only_rank);
      if (cli_out_flush(&o) != 0) {
        rc = cli_out_fail(path, &o, "the traffic section");
        goto out_rows;
      }
      if (traffic_only) goto out_rows;
    }
  }
  size_t written = 0;
  for (long rank = 0; rank < world; rank++) {
    if (only_rank >= 0 && rank != only_rank) continue;
    uint64_t total = 0;
    size_t kept = 0;
    if ((rc = resolve_rank(ctx, plan, src, (int)rank, (int)world, rows, &kept, &total)) != CLI_EXIT_OK)
      goto out_rows;
    if (json) {
      rc = json_stream_rank(&o, path, written, (int)rank, rows, kept, total);
    } else {
      rank_table(&o, (int)rank, (int)world, rows, kept, total);
      rc = table_flush(&o, path, (int)rank);
    }
    written++;
    if (rc != CLI_EXIT_OK) goto out_rows; /* a failed write stops here, not after every rank */
  }
  if (json) rc = json_stream_end(&o, path, written);

out_rows:
  cli_traffic_free(&traffic);
  free(rows);
out_plan:
  sl_plan_destroy(plan);
out_source:
  sl_source_destroy(src);
out_ctx:
  sl_context_destroy(ctx);
  return rc;
}
