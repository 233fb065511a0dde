/* shardload load: load this rank's shards the way a trainer would (world from the launcher
 * environment), report where every tensor went and by which rule, and optionally dump the
 * rank's shards as a safetensors file that independent tools can check.
 *
 * The work of one rank is cli_load_rank(), so the launcher of local ranks (`--nproc`,
 * launch.c) runs it once per rank with an explicit rank/world/rendezvous. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"

_Static_assert(SL_MAX_WORLD_SIZE == 4096 && CLI_MAX_NPROC == 1024, "HELP states both bounds");
static const char HELP[] =
    "usage: shardload load PATH [options]\n"
    "       shardload load PATH --nproc N [options]\n"
    "\n"
    "Load this rank's shards of a checkpoint, as every rank of a job does. Rank and world\n"
    "size come from the launcher environment (torchrun RANK/WORLD_SIZE/LOCAL_RANK and\n"
    "MASTER_ADDR/MASTER_PORT, Slurm, Open MPI); without one the world size is 1. Prints,\n"
    "per tensor: dtype (file->param), local shape, global offset, placement and device, the\n"
    "rule of the placement contract that chose it, pinned-ness and bytes; then the totals\n"
    "(GB/s is checkpoint bytes per second of the load) and the transfer statistics. The\n"
    "header names the data collective the ranks agreed on and why.\n"
    "\n"
    "With --nproc N, starts N ranks on this host instead (local rank r = rank r), which meet\n"
    "through a private rendezvous directory and Gloo over loopback; when one rank fails the\n"
    "others are stopped and its error is printed. Prints one summary line per rank (tensors,\n"
    "local bytes, placement and rule, bytes sent and received, seconds, peak RSS) and the\n"
    "totals (wall time, GB/s = checkpoint bytes / wall time, bytes rank 0 sent per\n"
    "checkpoint byte); --json prints {world_size, collective: {name, reason}, wall_seconds,\n"
    "checkpoint_bytes, ranks: [each rank's report]}.\n"
    "\n"
    "options:\n"
    "  --backend NAME          cpu, sim, sim:strict, cuda, ... or auto (default: auto)\n"
    "  --collective NAME       the data collective that moves tensor bytes: shm (host\n"
    "                          staging, every rank on one host), hier (shm within each host,\n"
    "                          gloo between hosts), gloo (host staging over TCP), simccl (sim\n"
    "                          device memory), nccl, ... or auto (default: the backend's\n"
    "                          device collective when every rank can run it on a device of\n"
    "                          its own, else shm where every rank shares one host, hier where\n"
    "                          they span hosts and a host has several, else gloo; local for\n"
    "                          one rank; the report says which and\n"
    "                          why). A name fails on every rank,\n"
    "                          naming one that cannot run it, or two that share a device\n"
    "  --device N              device ordinal on this node (default: the local rank modulo\n"
    "                          the node's device count)\n"
    "  --cpu-offload MODE      on, off or infer (default: infer: follow the offload policy)\n"
    "  --offload-policy P      none, cpu or cpu-pinned (default: none, or the plan file's)\n"
    "  --param-dtype DT        cast floating tensors to DT (F32, BF16, F16, F64, torch names)\n"
    "  --plan FILE             read a JSON plan file first; the options override it\n"
    "  --placement SPEC        default placement, e.g. 'shard(0)' or '[replicate, shard(0)]'\n"
    "  --replicate PATTERN     replicate tensors whose whole name matches the glob (repeatable)\n"
    "  --mesh AxB              device mesh, row-major; its product must be the world size\n"
    "  --staging SIZE          staging budget per rank, e.g. 64MiB, 512K (default 64MiB)\n"
    "  --strict                checkpoint tensors the plan does not name are an error\n"
    "  --strategy S            scatter (each rank receives only its shard; default) or\n"
    "                          broadcast (every rank receives whole tensors: Accelerate's\n"
    "                          algorithm, the baseline)\n"
    "  --source S              rank0 (only rank 0 reads the checkpoint; default), every-rank\n"
    "                          (each rank reads its own byte ranges; nothing is sent) or\n"
    "                          readers (distributed readers: the lowest rank of each host, or\n"
    "                          --readers N ranks, each read a share and send it; each reader\n"
    "                          needs the checkpoint, the other ranks need not see it)\n"
    "  --readers N             with --source readers: N readers (default: one per host)\n"
    "  --timeout SECONDS       rendezvous and collective timeout (default 300)\n"
    "  --dump DIR              write this rank's shards to DIR/rank-<r>.safetensors (through a\n"
    "                          temporary file in DIR renamed into place; when one rank's dump\n"
    "                          fails, every rank fails)\n"
    "  --json                  one JSON object on stdout instead of the table; a path that is\n"
    "                          not UTF-8 is kept: \"path\" has each invalid byte as U+FFFD and\n"
    "                          \"path_bytes_hex\" the exact bytes in hex\n"
    "  --nproc N               start N local ranks (at most 1024) and load on all of them\n"
    "  --rank R --world-size N this process is rank R of N (instead of the launcher\n"
    "                          environment; N at most 4096); --local-rank L picks the device\n"
    "                          (default R)\n"
    "  --rendezvous URL        file://DIR (shared filesystem), tcp://HOST:PORT (rank 0\n"
    "                          serves), or c10d://HOST:PORT (an existing torch c10d TCPStore,\n"
    "                          e.g. torchrun's agent store); default: SHARDLOAD_RENDEZVOUS, or\n"
    "                          MASTER_ADDR/PORT (c10d:// under torchrun's agent store)\n"
    "                          (secret: SHARDLOAD_TOKEN or SHARDLOAD_TOKEN_FILE, same on\n"
    "                          every rank; required for tcp:// off loopback)\n"
    "  --insecure-rendezvous   allow a tcp:// rendezvous on a non-loopback address without the\n"
    "                          job's secret (sets SHARDLOAD_INSECURE_RENDEZVOUS=1): anyone who\n"
    "                          can reach the port can join. Otherwise every rank needs the\n"
    "                          secret in SHARDLOAD_TOKEN; --nproc draws a fresh random one per\n"
    "                          job and hands it to its ranks\n"
    "  -v, --verbose           with --nproc: print the ranks' pids (stderr) and every rank's\n"
    "                          per-tensor table\n"
    "  -h, --help              show this help\n";

/* ---- progress line --------------------------------------------------------------------- */

typedef struct progress_line {
  double start, last;
  int drawn;
} progress_line;

/* Drawn only once a load has run for a while, and at most ten times a second. */
static void on_progress(void *user, uint64_t done, uint64_t total) {
  progress_line *p = user;
  double now = cli_now();
  if (now - p->start < 0.5 || (now - p->last < 0.1 && done < total)) return;
  p->last = now;
  char a[32], b[32];
  double pct = total ? 100.0 * (double)done / (double)total : 100.0;
  double rate = (double)done / (now - p->start) / 1e9;
  fprintf(stderr, "\rloading: %5.1f%%  %s of %s  %.2f GB/s", pct, cli_human_bytes(a, sizeof a, done),
          cli_human_bytes(b, sizeof b, total), rate);
  fflush(stderr);
  p->drawn = 1;
}

static void progress_clear(progress_line *p) {
  if (!p->drawn) return;
  fputs("\r\033[K", stderr);
  fflush(stderr);
  p->drawn = 0;
}

/* ---- the report ------------------------------------------------------------------------- */

typedef struct load_totals {
  uint64_t bytes, checkpoint_bytes;
  double seconds;
  sl_load_stats stats;
  int have_stats;
  uint64_t peak_rss;
} load_totals;

uint64_t cli_peak_rss_bytes(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return (uint64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

static const char *strategy_name(sl_strategy s) { return s == SL_STRATEGY_BROADCAST ? "broadcast" : "scatter"; }
static const char *source_name(sl_read_mode m) {
  return m == SL_READ_EVERY_RANK ? "every-rank" : m == SL_READ_READERS ? "readers" : "rank0";
}

static const char *where_desc(const sl_context *ctx, const sl_tensor *t) {
  return t->device == SL_DEVICE_ACCELERATOR ? sl_context_device_description(ctx) : "host memory";
}

static double gbps(const load_totals *tot) {
  return tot->seconds > 0 ? (double)tot->checkpoint_bytes / tot->seconds / 1e9 : 0.0;
}

/* The report's "stats": what moved (from storage, through the data collective, between host
 * and device), the staging held (host and device), where the time went, and this process's
 * peak resident set at the end of the load (and dump). */
static json_t *stats_json(const load_totals *tot) {
  json_t *sj = json_object();
  int bad = 0;
  if (tot->have_stats) {
    const sl_load_stats *s = &tot->stats;
    bad |= json_object_set_new(sj, "bytes_read", json_integer((json_int_t)s->bytes_read));
    bad |= json_object_set_new(sj, "bytes_sent", json_integer((json_int_t)s->bytes_sent));
    bad |= json_object_set_new(sj, "bytes_received", json_integer((json_int_t)s->bytes_received));
    bad |= json_object_set_new(sj, "bytes_h2d", json_integer((json_int_t)s->bytes_h2d));
    bad |= json_object_set_new(sj, "bytes_d2h", json_integer((json_int_t)s->bytes_d2h));
    bad |= json_object_set_new(sj, "staging_bytes", json_integer((json_int_t)s->staging_bytes));
    bad |= json_object_set_new(sj, "device_staging_bytes", json_integer((json_int_t)s->device_staging_bytes));
    bad |= json_object_set_new(sj, "transfers", json_integer((json_int_t)s->transfers));
    bad |= json_object_set_new(sj, "rounds", json_integer((json_int_t)s->rounds));
    bad |= json_object_set_new(sj, "seconds", json_real(s->seconds));
    bad |= json_object_set_new(sj, "seconds_read", json_real(s->seconds_read));
    bad |= json_object_set_new(sj, "seconds_wait", json_real(s->seconds_wait));
    bad |= json_object_set_new(sj, "seconds_phase1", json_real(s->seconds_phase1));
  }
  bad |= json_object_set_new(sj, "peak_rss_bytes", json_integer((json_int_t)tot->peak_rss));
  if (!bad) return sj;
  json_decref(sj);
  return NULL;
}

static json_t *tensor_json(const sl_context *ctx, const sl_tensor *t) {
  json_t *o = json_object();
  int bad = json_object_set_new(o, "name", json_string(t->name));
  bad |= json_object_set_new(o, "file_dtype", json_string(sl_dtype_name(t->file_dtype)));
  bad |= json_object_set_new(o, "dtype", json_string(sl_dtype_name(t->dtype)));
  bad |= json_object_set_new(o, "global_shape", cli_json_dims(t->ndim, t->global_shape));
  bad |= json_object_set_new(o, "local_shape", cli_json_dims(t->ndim, t->local_shape));
  bad |= json_object_set_new(o, "global_offset", cli_json_dims(t->ndim, t->global_offset));
  bad |= json_object_set_new(o, "placement", json_string(sl_device_kind_name(t->device)));
  bad |= json_object_set_new(o, "device", cli_json_text(where_desc(ctx, t)));
  bad |= json_object_set_new(o, "rule", json_string(sl_placement_rule_describe(t->rule)));
  bad |= json_object_set_new(o, "pinned", json_boolean(t->pinned));
  bad |= json_object_set_new(o, "caller_buffer", json_boolean(t->caller_buffer));
  bad |= json_object_set_new(o, "bytes", json_integer((json_int_t)t->nbytes));
  if (!bad) return o;
  json_decref(o);
  return NULL;
}

/* The summary of where the rank's tensors went, for the launcher's one line per rank: one entry
 * {placement, rule, tensors, pinned} for each (placement, rule) pair the tensors used, in the
 * order of their first tensor. A few pairs at most, whatever the tensor count. */
static json_t *placements_json(const sl_state *st) {
  typedef struct group {
    const char *placement, *rule;
    size_t count, pinned;
  } group;
  size_t n = sl_state_count(st), ng = 0;
  group *g = calloc(n ? n : 1, sizeof *g);
  json_t *arr = json_array();
  int bad = !g || !arr;
  for (size_t i = 0; i < n && !bad; i++) {
    const sl_tensor *t = sl_state_tensor(st, i);
    const char *pl = sl_device_kind_name(t->device), *rule = sl_placement_rule_describe(t->rule);
    size_t k = 0;
    while (k < ng && (strcmp(g[k].placement, pl) || strcmp(g[k].rule, rule))) k++;
    if (k == ng) g[ng++] = (group){pl, rule, 0, 0};
    g[k].count++;
    g[k].pinned += t->pinned != 0;
  }
  for (size_t k = 0; k < ng && !bad; k++) {
    json_t *o = json_object();
    bad |= json_object_set_new(o, "placement", json_string(g[k].placement));
    bad |= json_object_set_new(o, "rule", json_string(g[k].rule));
    bad |= json_object_set_new(o, "tensors", json_integer((json_int_t)g[k].count));
    bad |= json_object_set_new(o, "pinned", json_integer((json_int_t)g[k].pinned));
    bad |= json_array_append_new(arr, o);
  }
  free(g);
  if (!bad) return arr;
  json_decref(arr);
  return NULL;
}

/* The rank's JSON report, in three parts so that a report of every tensor can be streamed
 * (write_json_report): the head, from "rank" to "source"; then "placements" (the summary) or
 * "tensors" and "skipped"; then the tail, from "totals" to "dump". Each adds its members to
 * ROOT in order and returns nonzero when out of memory (a report with parts left out would be
 * read as the load's). Text that a backend or collective module gives is kept as valid UTF-8. */
static int report_head(json_t *root, const sl_context *ctx, const cli_load_args *a) {
  json_t *cj = json_object();
  int bad = !root || !cj;
  bad |= json_object_set_new(root, "rank", json_integer(sl_context_rank(ctx)));
  bad |= json_object_set_new(root, "world_size", json_integer(sl_context_world_size(ctx)));
  bad |= cli_json_set_path(root, "path", a->path);
  bad |= json_object_set_new(root, "backend", cli_json_text(sl_context_backend_name(ctx)));
  bad |= json_object_set_new(root, "backend_reason", cli_json_text(sl_context_backend_reason(ctx)));
  bad |= json_object_set_new(cj, "name", cli_json_text(sl_context_collective_name(ctx)));
  bad |= json_object_set_new(cj, "reason", cli_json_text(sl_context_collective_reason(ctx)));
  bad |= json_object_set_new(root, "collective", cj);
  bad |= json_object_set_new(root, "device", cli_json_text(sl_context_device_description(ctx)));
  bad |= json_object_set_new(root, "strategy", json_string(strategy_name(a->strategy)));
  bad |= json_object_set_new(root, "source", json_string(source_name(a->read_mode)));
  return bad;
}

static int report_tail(json_t *root, const sl_state *st, const load_totals *tot, const char *dump_path) {
  json_t *to = json_object();
  int bad = !root || !to;
  bad |= json_object_set_new(to, "tensors", json_integer((json_int_t)sl_state_count(st)));
  bad |= json_object_set_new(to, "bytes", json_integer((json_int_t)tot->bytes));
  bad |= json_object_set_new(to, "checkpoint_bytes", json_integer((json_int_t)tot->checkpoint_bytes));
  bad |= json_object_set_new(to, "seconds", json_real(tot->seconds));
  bad |= json_object_set_new(to, "gb_per_s", json_real(gbps(tot)));
  bad |= json_object_set_new(to, "skipped", json_integer((json_int_t)sl_state_skipped_count(st)));
  bad |= json_object_set_new(root, "totals", to);

  bad |= json_object_set_new(root, "stats", stats_json(tot));
  if (dump_path)
    bad |= cli_json_set_path(root, "dump", dump_path);
  else
    bad |= json_object_set_new(root, "dump", json_null());
  return bad;
}

/* The elements of "tensors" and "skipped", one at a time (cli_out_json_items). */
typedef struct report_items {
  const sl_context *ctx;
  const sl_state *st;
} report_items;

static json_t *tensor_item(void *user, size_t i) {
  const report_items *it = user;
  return tensor_json(it->ctx, sl_state_tensor(it->st, i));
}

static json_t *skipped_item(void *user, size_t i) {
  const report_items *it = user;
  return json_string(sl_state_skipped_at(it->st, i));
}

/* The human table. Every write goes through O, which keeps the first failure (the caller
 * flushes and reports it). Names from the checkpoint are printed escaped. */
static void report_table(cli_out *o, const sl_context *ctx, const sl_state *st, const load_totals *tot,
                         const char *dump_path) {
  size_t n = sl_state_count(st);
  char a[160], b[160], dt[32], h1[32], h2[32];
  int wname = 4, wdt = 5, wls = 11, wgo = 13, wdev = 6, wrule = 4;
  for (size_t i = 0; i < n; i++) {
    const sl_tensor *t = sl_state_tensor(st, i);
    int l = (int)cli_escaped_len(t->name);
    if (l > wname) wname = l;
    l = t->dtype == t->file_dtype
            ? snprintf(dt, sizeof dt, "%s", sl_dtype_name(t->dtype))
            : snprintf(dt, sizeof dt, "%s->%s", sl_dtype_name(t->file_dtype), sl_dtype_name(t->dtype));
    if (l > wdt) wdt = l;
    l = (int)strlen(cli_dims_str(a, sizeof a, t->ndim, t->local_shape));
    if (l > wls) wls = l;
    l = (int)strlen(cli_dims_str(a, sizeof a, t->ndim, t->global_offset));
    if (l > wgo) wgo = l;
    l = (int)strlen(where_desc(ctx, t));
    if (l > wdev) wdev = l;
    l = (int)strlen(sl_placement_rule_describe(t->rule));
    if (l > wrule) wrule = l;
  }
  cli_out_printf(o, "rank %d of %d: backend %s, collective %s, device %s\n", sl_context_rank(ctx),
                 sl_context_world_size(ctx), sl_context_backend_name(ctx), sl_context_collective_name(ctx),
                 sl_context_device_description(ctx));
  cli_out_printf(o, "backend: %s\n", sl_context_backend_reason(ctx));
  cli_out_printf(o, "collective: %s\n", sl_context_collective_reason(ctx));
  cli_out_printf(o, "%-*s  %-*s  %-*s  %-*s  %-9s  %-*s  %-*s  %-6s  %12s\n", wname, "NAME", wdt, "DTYPE", wls,
                 "LOCAL SHAPE", wgo, "GLOBAL OFFSET", "PLACEMENT", wdev, "DEVICE", wrule, "RULE", "PINNED", "BYTES");
  for (size_t i = 0; i < n; i++) {
    const sl_tensor *t = sl_state_tensor(st, i);
    if (t->dtype == t->file_dtype)
      snprintf(dt, sizeof dt, "%s", sl_dtype_name(t->dtype));
    else
      snprintf(dt, sizeof dt, "%s->%s", sl_dtype_name(t->file_dtype), sl_dtype_name(t->dtype));
    cli_out_escaped(o, t->name, wname); /* names come from the checkpoint */
    cli_out_printf(o, "  %-*s  %-*s  %-*s  %-9s  %-*s  %-*s  %-6s  %12llu\n", wdt, dt, wls,
                   cli_dims_str(a, sizeof a, t->ndim, t->local_shape), wgo,
                   cli_dims_str(b, sizeof b, t->ndim, t->global_offset), sl_device_kind_name(t->device), wdev,
                   where_desc(ctx, t), wrule, sl_placement_rule_describe(t->rule), t->pinned ? "yes" : "no",
                   (unsigned long long)t->nbytes);
  }
  size_t nskip = sl_state_skipped_count(st);
  cli_out_printf(o,
                 "total: %zu tensors, %llu bytes (%s) on this rank; checkpoint %s loaded in %.3f s "
                 "(%.2f GB/s); %zu skipped\n",
                 n, (unsigned long long)tot->bytes, cli_human_bytes(h1, sizeof h1, tot->bytes),
                 cli_human_bytes(h2, sizeof h2, tot->checkpoint_bytes), tot->seconds, gbps(tot), nskip);
  /* One line: a plan that names few tensors can skip thousands; --json lists them all. */
  if (nskip) {
    cli_out_printf(o, "skipped:");
    for (size_t i = 0; i < nskip && i < 8; i++) {
      cli_out_puts(o, i ? ", " : " ");
      cli_out_escaped(o, sl_state_skipped_at(st, i), 0);
    }
    if (nskip > 8) cli_out_printf(o, ", ... (%zu more; --json lists them all)", nskip - 8);
    cli_out_puts(o, "\n");
  }
  if (tot->have_stats) {
    char h3[32], h4[32], h5[32], h6[32], h7[32], h8[32], rounds[64] = "";
    const sl_load_stats *s = &tot->stats;
    /* distributed readers' transfers that moved several at once (docs/DESIGN.md#readers) */
    if (s->rounds) snprintf(rounds, sizeof rounds, " (%llu rounds of several readers')", (unsigned long long)s->rounds);
    cli_out_printf(o,
                   "stats: read %s, sent %s, received %s in %llu transfers%s, host to device %s, device to host "
                   "%s, staging %s host + %s device, peak RSS %s\n",
                   cli_human_bytes(h1, sizeof h1, s->bytes_read), cli_human_bytes(h2, sizeof h2, s->bytes_sent),
                   cli_human_bytes(h3, sizeof h3, s->bytes_received), (unsigned long long)s->transfers, rounds,
                   cli_human_bytes(h4, sizeof h4, s->bytes_h2d), cli_human_bytes(h5, sizeof h5, s->bytes_d2h),
                   cli_human_bytes(h6, sizeof h6, s->staging_bytes),
                   cli_human_bytes(h7, sizeof h7, s->device_staging_bytes),
                   cli_human_bytes(h8, sizeof h8, tot->peak_rss));
    cli_out_printf(o,
                   "time: %.3f s, of which agreeing and planning %.3f s, reading %.3f s, waiting for the data "
                   "plane %.3f s\n",
                   s->seconds, s->seconds_phase1, s->seconds_read, s->seconds_wait);
  }
  if (dump_path) {
    cli_out_puts(o, "dump: ");
    cli_out_escaped(o, dump_path, 0);
    cli_out_puts(o, "\n");
  }
}

/* The JSON report (the summary, or every tensor) as a whole document on F (called NAME). FULL,
 * when not NULL, is the whole report written before it (a rank of --nproc --json): the summary
 * then carries its length and XXH3-64 digest, which the launcher checks before it copies the
 * whole report into the merged one; when FULL is NULL and DIGEST is not, the length and digest
 * of what this writes go to FULL_BYTES and *DIGEST. */
static int write_json_report(const cli_load_args *a, const sl_context *ctx, const sl_state *st, const load_totals *tot,
                             const char *dump_path, int summary, FILE *f, const char *name, const uint64_t *full,
                             uint64_t *full_bytes, uint64_t *digest) {
  cli_out o;
  cli_out_init(&o, f, name);
  /* The summary is one small tree. The whole report's tensors and skipped names are streamed
   * between its head and its tail, one element at a time: a tree of tens of thousands of
   * tensors cost more to build and free than the load of their bytes. */
  json_t *root = json_object(), *tail = json_object();
  int bad = report_head(root, ctx, a);
  if (summary) bad |= json_object_set_new(root, "placements", placements_json(st));
  bad |= report_tail(summary ? root : tail, st, tot, dump_path);
  if (!bad && full) {
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)*full);
    bad |= json_object_set_new(summary ? root : tail, "report_bytes", json_integer((json_int_t)*full_bytes));
    bad |= json_object_set_new(summary ? root : tail, "report_xxh3", json_string(hex));
  }
  if (!bad && digest && !full && cli_out_digest_begin(&o) != 0) bad = 1;
  if (bad) {
    json_decref(root);
    json_decref(tail);
    cli_error(a->path, SL_ERR_NOMEM, "out of memory writing the JSON report of %zu tensors", sl_state_count(st));
    return CLI_EXIT_ERROR;
  }
  int r;
  if (summary) {
    r = cli_out_json_document(&o, root);
  } else {
    report_items it = {ctx, st};
    r = cli_out_json_open_array(&o, root, "tensors");
    if (r == 0) r = cli_out_json_items(&o, sl_state_count(st), tensor_item, &it);
    if (r == 0) r = cli_out_json_next_array(&o, "skipped");
    if (r == 0) r = cli_out_json_items(&o, sl_state_skipped_count(st), skipped_item, &it);
    if (r == 0) r = cli_out_json_close_document(&o, tail);
  }
  json_decref(root);
  json_decref(tail);
  if (o.digest) *digest = cli_out_digest_end(&o, full_bytes);
  return r == 0 ? CLI_EXIT_OK : cli_out_fail(a->path, &o, "the JSON report");
}

/* The rank's report on OUT (JSON, its summary for the launcher, or the table), the whole JSON
 * report on A->full_out and the table on A->table_out too when set. A report that cannot be
 * written fails the command with the reason: the load is done, but a caller reading the
 * report would read a part of it. */
static int write_reports(const cli_load_args *a, const sl_context *ctx, const sl_state *st, const load_totals *tot,
                         const char *dump_path, FILE *out, const char *out_name) {
  cli_out o;
  int rc = CLI_EXIT_OK;
  /* the whole report first: the summary after it says how long it is and its digest */
  uint64_t full_bytes = 0, digest = 0;
  if (a->full_out)
    rc = write_json_report(a, ctx, st, tot, dump_path, 0, a->full_out,
                           a->full_out_name ? a->full_out_name : "the JSON report file", NULL, &full_bytes, &digest);
  if (rc != CLI_EXIT_OK) return rc;
  if (a->json) {
    rc = write_json_report(a, ctx, st, tot, dump_path, a->report_summary, out, out_name, a->full_out ? &digest : NULL,
                           &full_bytes, NULL);
  } else {
    cli_out_init(&o, out, out_name);
    report_table(&o, ctx, st, tot, dump_path);
    if (cli_out_flush(&o) != 0) return cli_out_fail(a->path, &o, "the report");
  }
  if (rc == CLI_EXIT_OK && a->table_out) {
    cli_out_init(&o, a->table_out, a->table_out_name ? a->table_out_name : "the per-tensor table file");
    report_table(&o, ctx, st, tot, dump_path);
    if (cli_out_flush(&o) != 0) return cli_out_fail(a->path, &o, "the per-tensor table");
  }
  return rc;
}

/* ---- job key --------------------------------------------------------------------------------- */

static void key_str(FILE *f, const char *field, const char *value) {
  if (value) fprintf(f, "; %s '%s'", field, value);
  else fprintf(f, "; %s -", field);
}

/* The job key (sl_context_options.job_key): what every rank of one job is given alike — the
 * world size as given, the checkpoint path as given, the plan arguments and the load options —
 * so that unrelated jobs sharing a rendezvous use different key namespaces. What may differ
 * between the ranks of one job (backend, local rank, device, timeout, dump, output) stays out,
 * and so does --collective: the ranks compare it themselves when they agree on the data
 * collective, and name the rank that differs. Written
 * as readable "; "-separated fields: the library hashes it into the key prefix, and a rank that
 * meets a peer under another key names the first field that differs. Returns a malloc'd
 * string, or NULL when out of memory. */
static char *job_key(const cli_load_args *a) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return NULL;
  static const char *const offload[] = {"infer", "on", "off"};
  static const char *const strategy[] = {"scatter", "broadcast"};
  static const char *const source[] = {"rank0", "every-rank", "readers"};
  const cli_plan_args *p = &a->plan;
  fprintf(f, "shardload job 1; world size %d", a->world_size);
  key_str(f, "checkpoint", a->path);
  key_str(f, "plan file", p->plan_file);
  key_str(f, "placement", p->placement);
  fprintf(f, "; replicate");
  for (int i = 0; i < p->replicate_count; i++) fprintf(f, "%s'%s'", i ? "," : " ", p->replicate[i]);
  if (!p->replicate_count) fprintf(f, " -");
  fprintf(f, "; param dtype %s; mesh", p->param_dtype == SL_DTYPE_INVALID ? "-" : sl_dtype_name(p->param_dtype));
  for (int d = 0; d < p->mesh_ndim; d++) fprintf(f, "%s%d", d ? "x" : " ", p->mesh[d]);
  if (!p->mesh_ndim) fprintf(f, " -");
  fprintf(f, "; strict %d; offload policy ", p->strict);
  if (p->has_policy) fprintf(f, "%d%s", (int)p->policy.kind, p->policy.pin_memory ? " pinned" : "");
  else fprintf(f, "-");
  fprintf(f, "; cpu offload %s; strategy %s; source %s; staging %llu",
          (unsigned)a->cpu_offload < 3 ? offload[a->cpu_offload] : "?",
          (unsigned)a->strategy < 2 ? strategy[a->strategy] : "?",
          (unsigned)a->read_mode < 3 ? source[a->read_mode] : "?", (unsigned long long)a->staging_bytes);
  if (a->read_mode == SL_READ_READERS) fprintf(f, "; readers %d", a->readers);
  if (fclose(f) != 0) {
    free(text);
    return NULL;
  }
  return text;
}

/* ---- one rank ----------------------------------------------------------------------------- */

int cli_load_rank(const cli_load_args *a, FILE *out, const char *out_name) {
  sl_context_options co;
  memset(&co, 0, sizeof co);
  co.size = sizeof co;
  co.backend = a->backend && strcmp(a->backend, "auto") != 0 ? a->backend : NULL;
  co.collective = a->collective; /* NULL or "auto": the ranks choose */
  co.device = a->device;
  co.device_set = a->device_set;
  co.rank = a->rank;
  co.world_size = a->world_size;
  co.local_rank = a->local_rank;
  co.rendezvous = a->rendezvous;
  co.timeout_ms = a->timeout_ms;
  cli_captured cap = {""};
  co.log = cli_log_capture;
  co.log_user = &cap;
  co.log_level = SL_LOG_ERROR;
  char *key = job_key(a);
  if (!key) {
    cli_error(a->path, SL_ERR_NOMEM, "out of memory writing the job key");
    return CLI_EXIT_ERROR;
  }
  co.job_key = key;

  int rc = CLI_EXIT_ERROR;
  sl_context *ctx = NULL;
  sl_source *src = NULL;
  sl_plan *plan = NULL;
  sl_state *st = NULL;
  sl_status s = sl_context_create(&co, &ctx);
  free(key); /* the context keeps what it needs of it */
  if (s != SL_OK) {
    cli_fail_captured(a->path, s, &cap);
    goto out_ctx;
  }
  if ((s = sl_source_open(ctx, a->path, &src)) != SL_OK) {
    cli_fail(a->path, s, ctx);
    goto out_ctx;
  }
  rc = cli_plan_build(ctx, &a->plan, &plan);
  /* --mesh against the world size: known only now that the rank knows its world */
  if (rc == CLI_EXIT_OK && a->plan.mesh_ndim) {
    long ranks = 1;
    for (int d = 0; d < a->plan.mesh_ndim; d++) ranks *= a->plan.mesh[d];
    if (ranks != sl_context_world_size(ctx))
      rc = cli_usage_error("--mesh", "mesh holds %ld ranks but the job has %d; give a mesh whose sizes "
                           "multiply to %d", ranks, sl_context_world_size(ctx), sl_context_world_size(ctx));
  }
  /* A plan that fails on one rank only (a --plan file unreadable on its node) must not leave
   * the others waiting in sl_load's first agreement until the timeout: all agree on it first.
   * The failing rank printed its own line; the others name it. */
  if (sl_context_world_size(ctx) > 1) {
    if (rc != CLI_EXIT_OK) {
      char why[1200];
      snprintf(why, sizeof why, "its plan could not be built: %s",
               sl_context_errmsg(ctx)[0] ? sl_context_errmsg(ctx) : "a usage error (see its error line)");
      sl_context_set_error(ctx, SL_ERR_PLAN, why);
    }
    if ((s = sl_context_agree(ctx, rc == CLI_EXIT_OK ? SL_OK : SL_ERR_PLAN)) != SL_OK && rc == CLI_EXIT_OK) {
      cli_fail(a->path, s, ctx);
      rc = CLI_EXIT_ERROR;
    }
  }
  if (rc != CLI_EXIT_OK) goto out_plan;
  rc = CLI_EXIT_ERROR;

  progress_line pl = {0};
  sl_load_options lo;
  memset(&lo, 0, sizeof lo);
  lo.size = sizeof lo;
  lo.cpu_offload = a->cpu_offload;
  lo.staging_bytes = (size_t)a->staging_bytes;
  lo.strategy = a->strategy;
  lo.read_mode = a->read_mode;
  lo.readers = a->readers;
  if (a->test_hooks) cli_hook_load(ctx, &lo);
  if (a->progress) {
    lo.progress = on_progress;
    lo.progress_user = &pl;
  }
  double t0 = cli_now();
  pl.start = pl.last = t0;
  s = sl_load(ctx, plan, src, &lo, &st);
  double t1 = cli_now();
  progress_clear(&pl);
  if (s != SL_OK) {
    cli_fail(a->path, s, ctx);
    goto out_plan;
  }

  load_totals tot;
  memset(&tot, 0, sizeof tot);
  tot.stats.size = sizeof tot.stats; /* the library writes within what this build knows */
  tot.checkpoint_bytes = sl_source_total_bytes(src);
  tot.seconds = t1 - t0;
  if (sl_state_stats(st, &tot.stats) == SL_OK) {
    tot.have_stats = 1;
    if (tot.stats.seconds > 0) tot.seconds = tot.stats.seconds;
  }
  for (size_t i = 0; i < sl_state_count(st); i++) tot.bytes += sl_state_tensor(st, i)->nbytes;

  /* Every rank agrees on the dump's outcome (every rank takes part, dump or not, so that no
   * rank waits for another), so none exits 0 while another's dump failed. */
  char dump_path[4096];
  sl_status ds = SL_OK;
  if (a->dump_dir)
    ds = cli_dump_rank(ctx, st, a->dump_dir, sl_context_rank(ctx), sl_context_world_size(ctx), dump_path,
                       sizeof dump_path);
  s = sl_context_agree(ctx, ds);
  if (ds != SL_OK) goto out_state; /* this rank printed its own line */
  if (s != SL_OK && a->dump_dir) {
    cli_error(a->dump_dir, SL_ERR_PEER, "%s; the job's dump is incomplete: fix that rank's problem and load again",
              sl_context_errmsg(ctx));
    goto out_state;
  }
  if (s != SL_OK) {
    cli_fail(a->path, s, ctx);
    goto out_state;
  }

  tot.peak_rss = cli_peak_rss_bytes();
  rc = write_reports(a, ctx, st, &tot, a->dump_dir ? dump_path : NULL, out, out_name);

out_state:
  sl_state_destroy(st);
out_plan:
  sl_plan_destroy(plan);
  sl_source_destroy(src);
out_ctx:
  sl_context_destroy(ctx);
  return rc;
}

/* ---- arguments ---------------------------------------------------------------------------- */

enum {
  OPT_BACKEND = 512,
  OPT_COLLECTIVE,
  OPT_DEVICE,
  OPT_CPU_OFFLOAD,
  OPT_POLICY,
  OPT_STAGING,
  OPT_STRICT,
  OPT_DUMP,
  OPT_JSON,
  OPT_STRATEGY,
  OPT_SOURCE,
  OPT_READERS,
  OPT_TIMEOUT,
  OPT_NPROC,
  OPT_RANK,
  OPT_WORLD,
  OPT_LOCAL_RANK,
  OPT_RENDEZVOUS,
  OPT_INSECURE_RENDEZVOUS,
};

/* Seconds, possibly fractional, as milliseconds in [1, INT_MAX]: 0 on success. */
static int parse_timeout(const char *s, int *ms) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v > 0) || v * 1000.0 > 2147483647.0) return -1;
  *ms = v * 1000.0 < 1.0 ? 1 : (int)(v * 1000.0);
  return 0;
}

int cli_cmd_load(int argc, char **argv) {
  static const struct option longopts[] = {
      {"backend", required_argument, NULL, OPT_BACKEND},
      {"collective", required_argument, NULL, OPT_COLLECTIVE},
      {"device", required_argument, NULL, OPT_DEVICE},
      {"cpu-offload", required_argument, NULL, OPT_CPU_OFFLOAD},
      {"offload-policy", required_argument, NULL, OPT_POLICY},
      {"staging", required_argument, NULL, OPT_STAGING},
      {"strict", no_argument, NULL, OPT_STRICT},
      {"dump", required_argument, NULL, OPT_DUMP},
      {"json", no_argument, NULL, OPT_JSON},
      {"strategy", required_argument, NULL, OPT_STRATEGY},
      {"source", required_argument, NULL, OPT_SOURCE},
      {"readers", required_argument, NULL, OPT_READERS},
      {"timeout", required_argument, NULL, OPT_TIMEOUT},
      {"nproc", required_argument, NULL, OPT_NPROC},
      {"rank", required_argument, NULL, OPT_RANK},
      {"world-size", required_argument, NULL, OPT_WORLD},
      {"local-rank", required_argument, NULL, OPT_LOCAL_RANK},
      {"rendezvous", required_argument, NULL, OPT_RENDEZVOUS},
      {"insecure-rendezvous", no_argument, NULL, OPT_INSECURE_RENDEZVOUS},
      {"verbose", no_argument, NULL, 'v'},
      {"help", no_argument, NULL, 'h'},
      CLI_PLAN_LONGOPTS,
      {0, 0, 0, 0},
  };
  cli_load_args a;
  memset(&a, 0, sizeof a);
  a.rank = -1;
  a.world_size = 0;
  a.local_rank = -1;
  a.cpu_offload = SL_CPU_OFFLOAD_INFER;
  int c, r;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":hv", longopts, NULL)) != -1) {
    if ((r = cli_plan_option(&a.plan, c, optarg)) != 0) {
      if (r < 0) return -r;
      continue;
    }
    long n;
    switch (c) {
    case OPT_BACKEND:
      if (!*optarg) return cli_usage_error("--backend", "empty name; use cpu, sim, sim:strict or auto");
      a.backend = optarg;
      break;
    case OPT_COLLECTIVE:
      if (!*optarg) return cli_usage_error("--collective", "empty name; use shm, hier, gloo, simccl, nccl, ... or auto");
      a.collective = optarg;
      break;
    case OPT_DEVICE:
      if (cli_parse_int(optarg, 0, 1 << 20, &n))
        return cli_usage_error("--device", "'%s' is not a device ordinal; give an integer from 0", optarg);
      a.device = (int)n;
      a.device_set = 1;
      break;
    case OPT_CPU_OFFLOAD:
      if (!strcmp(optarg, "on")) a.cpu_offload = SL_CPU_OFFLOAD_ON;
      else if (!strcmp(optarg, "off")) a.cpu_offload = SL_CPU_OFFLOAD_OFF;
      else if (!strcmp(optarg, "infer")) a.cpu_offload = SL_CPU_OFFLOAD_INFER;
      else return cli_usage_error("--cpu-offload", "'%s' is not a mode; use on, off or infer", optarg);
      break;
    case OPT_POLICY:
      a.plan.has_policy = 1;
      if (!strcmp(optarg, "none")) a.plan.policy = (sl_offload_policy){SL_OFFLOAD_NONE, 0};
      else if (!strcmp(optarg, "cpu")) a.plan.policy = (sl_offload_policy){SL_OFFLOAD_CPU, 0};
      else if (!strcmp(optarg, "cpu-pinned")) a.plan.policy = (sl_offload_policy){SL_OFFLOAD_CPU, 1};
      else return cli_usage_error("--offload-policy", "'%s' is not a policy; use none, cpu or cpu-pinned", optarg);
      break;
    case OPT_STAGING:
      if (cli_parse_size(optarg, &a.staging_bytes) || a.staging_bytes == 0)
        return cli_usage_error("--staging", "'%s' is not a size; give bytes or e.g. 64MiB, 512K, 1GiB",
                               optarg);
      break;
    case OPT_STRICT: a.plan.strict = 1; break;
    case OPT_DUMP:
      if (!*optarg) return cli_usage_error("--dump", "empty directory name");
      a.dump_dir = optarg;
      break;
    case OPT_JSON: a.json = 1; break;
    case OPT_STRATEGY:
      if (!strcmp(optarg, "scatter")) a.strategy = SL_STRATEGY_SCATTER;
      else if (!strcmp(optarg, "broadcast")) a.strategy = SL_STRATEGY_BROADCAST;
      else return cli_usage_error("--strategy", "'%s' is not a strategy; use scatter or broadcast", optarg);
      break;
    case OPT_SOURCE:
      if (!strcmp(optarg, "rank0")) a.read_mode = SL_READ_RANK0;
      else if (!strcmp(optarg, "every-rank")) a.read_mode = SL_READ_EVERY_RANK;
      else if (!strcmp(optarg, "readers")) a.read_mode = SL_READ_READERS;
      else return cli_usage_error("--source", "'%s' is not a source; use rank0, every-rank or readers", optarg);
      break;
    case OPT_READERS:
      if (cli_parse_int(optarg, 1, SL_MAX_WORLD_SIZE, &n))
        return cli_usage_error("--readers", "'%s' is not a reader count; give an integer from 1 to the world size",
                               optarg);
      a.readers = (int)n;
      break;
    case OPT_TIMEOUT:
      if (parse_timeout(optarg, &a.timeout_ms))
        return cli_usage_error("--timeout", "'%s' is not a timeout; give positive seconds such as 30 or 2.5",
                               optarg);
      break;
    case OPT_NPROC:
      if (cli_parse_int(optarg, 1, CLI_MAX_NPROC, &n))
        return cli_usage_error("--nproc", "'%s' is not a rank count; give an integer from 1 to %d (processes on "
                               "this host, each connected to every other one)", optarg, CLI_MAX_NPROC);
      a.nproc = (int)n;
      break;
    case OPT_RANK:
      if (cli_parse_int(optarg, 0, SL_MAX_WORLD_SIZE - 1, &n))
        return cli_usage_error("--rank", "'%s' is not a rank; give an integer from 0 to %d", optarg,
                               SL_MAX_WORLD_SIZE - 1);
      a.rank = (int)n;
      break;
    case OPT_WORLD:
      if (cli_parse_int(optarg, 1, SL_MAX_WORLD_SIZE, &n))
        return cli_usage_error("--world-size", "'%s' is not a world size; give an integer from 1 to %d (the most "
                               "ranks shardload's rendezvous serves: docs/DESIGN.md#rendezvous)", optarg,
                               SL_MAX_WORLD_SIZE);
      a.world_size = (int)n;
      break;
    case OPT_LOCAL_RANK:
      if (cli_parse_int(optarg, 0, SL_MAX_WORLD_SIZE - 1, &n))
        return cli_usage_error("--local-rank", "'%s' is not a local rank; give an integer from 0 to %d", optarg,
                               SL_MAX_WORLD_SIZE - 1);
      a.local_rank = (int)n;
      break;
    case OPT_RENDEZVOUS:
      if (strncmp(optarg, "file://", 7) != 0 && strncmp(optarg, "tcp://", 6) != 0 &&
          strncmp(optarg, "c10d://", 7) != 0)
        return cli_usage_error("--rendezvous",
                               "'%s' is not a rendezvous; use file://DIR, tcp://HOST:PORT or c10d://HOST:PORT",
                               optarg);
      a.rendezvous = optarg;
      break;
    case OPT_INSECURE_RENDEZVOUS:
      /* read by the collective when a context is created: set before any exists; the ranks
       * of --nproc inherit it */
      if (setenv("SHARDLOAD_INSECURE_RENDEZVOUS", "1", 1) != 0)
        return cli_usage_error("--insecure-rendezvous", "cannot set SHARDLOAD_INSECURE_RENDEZVOUS: %s",
                               strerror(errno));
      break;
    case 'v': a.verbose = 1; break;
    case 'h': return cli_print_help(HELP);
    default: return cli_bad_option("load", c, argv);
    }
  }
  if (argc - optind != 1)
    return cli_usage_error("load", "%s; run 'shardload load --help'",
                           argc - optind ? "takes exactly one PATH" : "needs a PATH");
  a.path = argv[optind];
  if ((r = cli_plan_args_check(&a.plan)) != CLI_EXIT_OK) return r;
  if ((a.rank >= 0) != (a.world_size > 0))
    return cli_usage_error(a.rank >= 0 ? "--rank" : "--world-size", "give --rank and --world-size together");
  if (a.world_size && a.rank >= a.world_size)
    return cli_usage_error("--rank", "rank %d is outside a world of %d; give 0..%d", a.rank, a.world_size,
                           a.world_size - 1);
  if (a.readers && a.read_mode != SL_READ_READERS)
    return cli_usage_error("--readers", "counts distributed readers; give it with --source readers");
  if (a.readers && a.nproc && a.readers > a.nproc)
    return cli_usage_error("--readers", "%d readers in a world of %d ranks; give 1..%d", a.readers, a.nproc, a.nproc);
  if (a.readers && a.world_size && a.readers > a.world_size)
    return cli_usage_error("--readers", "%d readers in a world of %d ranks; give 1..%d", a.readers, a.world_size,
                           a.world_size);
  if (a.nproc && (a.world_size || a.rendezvous))
    return cli_usage_error("--nproc", "starts its own ranks and rendezvous; drop --rank, --world-size and "
                           "--rendezvous");
  if (a.world_size && a.local_rank < 0) a.local_rank = a.rank;
  if (a.nproc) return cli_launch(&a);
  a.progress = isatty(STDERR_FILENO);
  return cli_load_rank(&a, cli_report(), "stdout");
}
