/* bench_pipeline: the pipelined device data path (docs/DESIGN.md#data-flow) measured on one machine.
 *
 *   bench_pipeline [--dir DIR] [--size 512MiB] [--staging 16MiB] [--reps 5] [--parts 1,2,3]
 *                  [--bin SHARDLOAD] [--checkpoint PATH] [--sim-delay-us 0] [--timeout 300]
 *                  [--json PATH] [--check] [--baseline-bin OLD_SHARDLOAD]
 *
 * Three parts, each a set of loads by real rank processes (forked here before any library call,
 * meeting through a private file:// rendezvous, Gloo over loopback), the variants of a group
 * measured side by side by the same ranks in one run: one warm-up round of every variant, then
 * N rounds (variants interleaved within a round, so that drift of the VM hits them alike),
 * medians:
 *   1. overlap: pipeline_slots 1 (every stage strictly after the previous one: the serial
 *      baseline, the sum of its stages), 2 (the default) and 3, world 2, on the device route
 *      (sim + simccl), the host route (sim + gloo) and the cpu backend, with the checkpoint in
 *      the page cache (warm) and evicted from it before each load (cold: rank 0 reads storage);
 *      ratios pipelined / serial and pipelined / (rank 0's read time + its main thread's busy
 *      time);
 *   2. small tensors: 10^4 tensors of 4 KiB against the same bytes in 10 tensors, world 2,
 *      scatter: wall time and data collective operations (docs/DESIGN.md#data-flow: small
 *      tensors of one placement class share a transfer);
 *   3. HSDP 2x2 (world 4, [replicate, shard(0)]): rank 0's bytes sent against the checkpoint,
 *      scatter (within replica 0, then down the replica chain) against broadcast, beside the
 *      figure of a scatter that treats every replica as a separate target (computed from the
 *      plan's geometry: what the serial loader before the pipeline sent).
 * --baseline-bin runs the cpu loads of every part again with another shardload command (one
 * built from the serial loader before the pipeline) through `load --nproc --json`: rows "before7".
 * Load time is the slowest rank's sl_load seconds (its own clock; the ranks start each load
 * together after a barrier). The sim backend's artificial completion delay
 * (SHARDLOAD_SIM_DELAY_US, default 200 us per operation) is set to --sim-delay-us (default 0)
 * so that it does not dominate what is measured. --check fails the run when an invariant that
 * does not depend on timing breaks (pipeline_report.c); a ctest runs it on a small checkpoint. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_pipeline.h"
#include "bench_util.h"

/* What a rank tells the parent after each load (one write, below PIPE_BUF: atomic). */
typedef struct rank_record {
  int variant, round, rank;
  int status;              /* sl_status of the load (or of the step that failed) */
  sl_load_stats stats;
  uint64_t ckpt_bytes;     /* sl_source_total_bytes */
  uint64_t ckpt_tensors;
  uint64_t separate_bytes; /* rank 0: bytes a scatter to every other rank directly would send */
  char collective[32];
  char msg[512];
} rank_record;

_Static_assert(sizeof(rank_record) <= PIPE_BUF, "a rank's record must be one atomic pipe write");

/* ---- a rank --------------------------------------------------------------------------- */

static void send_record(int fd, rank_record *r) {
  ssize_t w = write(fd, r, sizeof *r);
  (void)w; /* the parent reports a missing record as the rank's failure */
}

/* Rank 0: what the serial loader before the pipeline sent for this plan (every other rank's shard of every
 * tensor, straight from rank 0, replicas included), from the plan's own geometry. */
static uint64_t separate_scatter_bytes(sl_plan *plan, sl_source *src, int world) {
  uint64_t sum = 0;
  for (size_t i = 0; i < sl_source_tensor_count(src); i++)
    for (int r = 1; r < world; r++) {
      sl_shard_geometry g;
      memset(&g, 0, sizeof g);
      g.size = sizeof g;
      if (sl_plan_geometry(plan, sl_source_tensor_at(src, i), r, world, &g) == SL_OK && !g.skipped) sum += g.nbytes;
    }
  return sum;
}

/* Drops SRC's files from the page cache, so that rank 0's reads come from storage: the read
 * stage then weighs what it does on a cold node, which a warm page cache (~15 GB/s here)
 * hides. Only this checkpoint's pages go; nothing needs root. */
static void evict_file(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return; /* the load itself then names the file */
  fdatasync(fd);      /* dirty pages would stay */
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

static void evict(sl_source *src) {
  for (size_t i = 0; i < sl_source_file_count(src); i++) evict_file(sl_source_file_at(src, i));
}

static sl_status make_plan(sl_context *ctx, const group *g, sl_plan **out) {
  sl_status s = sl_plan_create(ctx, out);
  if (s == SL_OK && g->mesh_ndim) s = sl_plan_set_mesh(*out, g->mesh_ndim, g->mesh);
  if (s == SL_OK && g->placement) s = sl_plan_set_default_placement(*out, g->placement);
  return s;
}

/* One rank of a group: a context, the group's checkpoints, then 1 + reps rounds of every
 * variant, a record after each load. Returns the exit status of the process. */
static int rank_main(const group *g, const options *o, const char *rdv, int rank, int fd) {
  rank_record rec;
  memset(&rec, 0, sizeof rec);
  rec.rank = rank;
  rec.variant = -1;
  sl_context *ctx = NULL;
  sl_source *src[MAX_CKPTS] = {NULL};
  sl_plan *plan = NULL;
  char errbuf[512] = "";
  sl_context_options co;
  memset(&co, 0, sizeof co);
  co.size = sizeof co;
  co.backend = g->backend;
  co.collective = g->collective;
  co.world_size = g->world;
  co.rank = rank;
  co.local_rank = rank;
  co.rendezvous = rdv;
  co.timeout_ms = o->timeout_s * 1000;
  co.errbuf = errbuf;
  co.errbuf_size = sizeof errbuf;
  co.job_key = rdv;
  sl_status s = sl_context_create(&co, &ctx);
  if (s != SL_OK) {
    snprintf(rec.msg, sizeof rec.msg, "creating the context: %s", errbuf[0] ? errbuf : sl_strerror(s));
    goto out_fail;
  }
  snprintf(rec.collective, sizeof rec.collective, "%s", sl_context_collective_name(ctx));
  for (int c = 0; c < g->nckpt; c++)
    if ((s = sl_source_open(ctx, g->ckpt[c], &src[c])) != SL_OK) {
      snprintf(rec.msg, sizeof rec.msg, "%s", sl_context_errmsg(ctx)); /* it names the file */
      goto out_fail;
    }
  for (int round = 0; round <= o->reps; round++)
    for (int v = 0; v < g->nv; v++) {
      const variant *x = &g->v[v];
      sl_state *st = NULL;
      rec.variant = v;
      rec.round = round;
      if ((s = make_plan(ctx, g, &plan)) != SL_OK) {
        snprintf(rec.msg, sizeof rec.msg, "plan: %s", sl_context_errmsg(ctx));
        goto out_fail;
      }
      sl_load_options lo;
      memset(&lo, 0, sizeof lo);
      lo.size = sizeof lo;
      lo.strategy = x->strategy;
      lo.staging_bytes = (size_t)(x->budget_div > 1 ? o->staging / (uint64_t)x->budget_div : o->staging);
      lo.pipeline_slots = x->slots;
      if (x->cold && rank == 0) evict(src[x->ckpt]);
      /* start together, so the slowest rank's seconds is the load's and not a late start */
      if ((s = sl_context_agree(ctx, SL_OK)) != SL_OK ||
          (s = sl_load(ctx, plan, src[x->ckpt], &lo, &st)) != SL_OK) {
        snprintf(rec.msg, sizeof rec.msg, "%s (%s): %s", g->ckpt[x->ckpt], x->label, sl_context_errmsg(ctx));
        goto out_fail;
      }
      memset(&rec.stats, 0, sizeof rec.stats);
      rec.stats.size = sizeof rec.stats;
      s = sl_state_stats(st, &rec.stats);
      sl_state_destroy(st);
      if (s != SL_OK) {
        snprintf(rec.msg, sizeof rec.msg, "stats: %s", sl_strerror(s));
        goto out_fail;
      }
      rec.ckpt_bytes = sl_source_total_bytes(src[x->ckpt]);
      rec.ckpt_tensors = sl_source_tensor_count(src[x->ckpt]);
      rec.separate_bytes = rank == 0 && round == 0 ? separate_scatter_bytes(plan, src[x->ckpt], g->world) : 0;
      sl_plan_destroy(plan);
      plan = NULL;
      rec.status = SL_OK;
      send_record(fd, &rec);
    }
  for (int c = 0; c < g->nckpt; c++) sl_source_destroy(src[c]);
  sl_context_destroy(ctx);
  return 0;
out_fail:
  rec.status = s;
  send_record(fd, &rec);
  sl_plan_destroy(plan);
  for (int c = 0; c < g->nckpt; c++) sl_source_destroy(src[c]);
  sl_context_destroy(ctx);
  return 1;
}

/* ---- the parent: spawn a group, gather its records ------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

static void kill_ranks(pid_t *pids, int world) {
  for (int r = 0; r < world; r++)
    if (pids[r] > 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], NULL, 0);
      pids[r] = 0;
    }
}

/* Reads exactly N bytes from FD before DEADLINE; 1: done, 0: end of file, -1: timeout/error. */
static int read_full(int fd, void *buf, size_t n, double deadline) {
  size_t got = 0;
  while (got < n) {
    int ms = (int)((deadline - bench_now()) * 1000);
    if (ms <= 0) return -1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int pr = poll(&p, 1, ms);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return -1;
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) return got ? -1 : 0;
    got += (size_t)r;
  }
  return 1;
}

static void add_record(measured *m, const rank_record *r, sl_load_stats *round_stats) {
  round_stats[r->rank] = r->stats;
  if (r->rank == 0) {
    snprintf(m->collective, sizeof m->collective, "%s", r->collective);
    m->ckpt_bytes = r->ckpt_bytes;
    m->ckpt_tensors = r->ckpt_tensors;
    if (r->round == 0) m->separate_bytes = r->separate_bytes;
  }
}

/* Runs group G (forks its ranks) and fills M[variant]. Returns 0, or 1 with a message printed. */
static int run_group(const group *g, const options *o, measured *m) {
  char tmpl[] = "/tmp/shardload-bench-rdv-XXXXXX";
  char *dir = mkdtemp(tmpl);
  if (!dir) {
    fprintf(stderr, "bench_pipeline: cannot create a rendezvous directory under /tmp: %s\n", strerror(errno));
    return 1;
  }
  char rdv[PATH_MAX + 16];
  snprintf(rdv, sizeof rdv, "file://%s", dir);
  int fds[2];
  if (pipe(fds) != 0) {
    fprintf(stderr, "bench_pipeline: pipe: %s\n", strerror(errno));
    rmdir(dir);
    return 1;
  }
  pid_t pids[MAX_WORLD] = {0};
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < g->world; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      close(fds[0]);
      _exit(rank_main(g, o, rdv, r, fds[1]));
    }
    if (pids[r] < 0) {
      fprintf(stderr, "bench_pipeline: fork: %s\n", strerror(errno));
      kill_ranks(pids, r);
      close(fds[0]);
      close(fds[1]);
      nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
      return 1;
    }
  }
  close(fds[1]);

  /* records arrive round by round; a round of a variant is complete when every rank sent it */
  static sl_load_stats stats[MAX_VARIANTS][MAX_REPS + 1][MAX_WORLD];
  static int seen[MAX_VARIANTS][MAX_REPS + 1];
  memset(seen, 0, sizeof seen);
  int expected = g->world * g->nv * (o->reps + 1), got = 0, rc = 0;
  double deadline = bench_now() + o->timeout_s;
  rank_record rec;
  while (got < expected) {
    int rr = read_full(fds[0], &rec, sizeof rec, deadline);
    if (rr < 0) {
      fprintf(stderr, "bench_pipeline: part %d, backend %s: no result within %d s (--timeout); the ranks "
              "were stopped\n", g->part, g->backend, o->timeout_s);
      rc = 1;
      break;
    }
    if (rr == 0) {
      fprintf(stderr, "bench_pipeline: part %d, backend %s: the ranks exited after %d of %d loads without "
              "saying why\n", g->part, g->backend, got / g->world, expected / g->world);
      rc = 1;
      break;
    }
    if (rec.status != SL_OK) {
      fprintf(stderr, "bench_pipeline: part %d, backend %s%s%s, rank %d: %s: %s\n", g->part, g->backend,
              g->collective ? ", collective " : "", g->collective ? g->collective : "", rec.rank,
              sl_status_name((sl_status)rec.status), rec.msg);
      rc = 1;
      break;
    }
    if (rec.variant < 0 || rec.variant >= g->nv || rec.round < 0 || rec.round > o->reps || rec.rank < 0 ||
        rec.rank >= g->world)
      continue;
    add_record(&m[rec.variant], &rec, stats[rec.variant][rec.round]);
    got++;
    if (++seen[rec.variant][rec.round] < g->world || rec.round == 0) continue;
    /* a whole measured round of this variant */
    measured *mv = &m[rec.variant];
    const sl_load_stats *rs = stats[rec.variant][rec.round];
    double slowest = 0;
    uint64_t sent = 0;
    for (int r = 0; r < g->world; r++) {
      if (rs[r].seconds > slowest) slowest = rs[r].seconds;
      sent += rs[r].bytes_sent;
    }
    double busy0 = rs[0].seconds - rs[0].seconds_wait;
    double stages = rs[0].seconds_read + busy0;
    mv->seconds[mv->n] = slowest;
    mv->overlap[mv->n] = stages > 0 ? rs[0].seconds / stages : 0.0;
    mv->rank0[mv->n] = rs[0];
    mv->sent_all[mv->n] = sent;
    mv->n++;
  }
  close(fds[0]);
  if (rc) kill_ranks(pids, g->world);
  for (int r = 0; r < g->world; r++) {
    int st;
    if (pids[r] <= 0) continue;
    if (waitpid(pids[r], &st, 0) == pids[r] && !(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !rc) {
      fprintf(stderr, "bench_pipeline: part %d, backend %s, rank %d exited abnormally (%s %d)\n", g->part,
              g->backend, r, WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      rc = 1;
    }
  }
  nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
  return rc;
}

/* ---- a baseline: another shardload command ---------------------------------------------- */

/* Evicts PATH's checkpoint files: PATH itself, or the .safetensors files of a directory. */
static void evict_path(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) return;
  if (!S_ISDIR(sb.st_mode)) {
    evict_file(path);
    return;
  }
  DIR *d = opendir(path);
  for (struct dirent *e; d && (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    char file[PATH_MAX];
    if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
    snprintf(file, sizeof file, "%s/%s", path, e->d_name);
    evict_file(file);
  }
  if (d) closedir(d);
}

static uint64_t json_u64(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
}

/* One `load --nproc --json` of the baseline command; fills *REC with what its JSON says (the
 * ranks' stats as they were before the pipeline: no transfers, no stage times) and *SLOWEST and
 * *SENT_ALL. Returns 0, or 1 with the command's error printed. */
/* Runs ARGV (no shell: paths may hold any byte), its stdout into *OUT (NUL-terminated, to be
 * freed; OUT NULL: discarded) and its stderr into ERRPATH; killed when DEADLINE passes. Returns
 * its exit status, 128 + the signal that ended it, or -1 when it could not run or timed out. */
static int spawn(char *const argv[], char **out, const char *errpath, double deadline) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int e = open(errpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (e < 0 || dup2(fds[1], 1) < 0 || dup2(e, 2) < 0) _exit(127);
    close(fds[0]);
    execvp(argv[0], argv);
    dprintf(2, "cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return -1;
  }
  size_t len = 0, cap = 1 << 16;
  char *buf = malloc(cap);
  int timed_out = 0;
  for (;;) {
    int ms = (int)((deadline - bench_now()) * 1000);
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    int pr = ms > 0 ? poll(&p, 1, ms) : 0;
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) {
      timed_out = 1;
      break;
    }
    if (buf && cap - len < 4096) {
      char *b = realloc(buf, cap *= 2);
      if (!b) free(buf);
      buf = b;
    }
    char sink[4096];
    ssize_t r = buf ? read(fds[0], buf + len, cap - len - 1) : read(fds[0], sink, sizeof sink);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (buf) len += (size_t)r;
  }
  close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  if (buf) buf[len] = 0;
  if (out) *out = buf;
  else free(buf);
  if (timed_out) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* One `load --nproc --json` of the baseline command; fills *RANK0 with what its JSON says (the
 * stats as they were before the pipeline: no transfers, no stage times), *SLOWEST and *SENT_ALL.
 * Returns 0, or 1 with the command's error printed. */
static int cli_load(const group *g, const variant *x, const options *o, sl_load_stats *rank0, double *slowest,
                    uint64_t *sent_all, uint64_t *ckpt_bytes, uint64_t *tensors) {
  char err[PATH_MAX], nproc[16], staging[32], timeout[16];
  snprintf(err, sizeof err, "%s/baseline.err", o->dir);
  snprintf(nproc, sizeof nproc, "%d", g->world);
  snprintf(staging, sizeof staging, "%llu", (unsigned long long)o->staging);
  snprintf(timeout, sizeof timeout, "%d", o->timeout_s);
  const char *argv[24] = {o->baseline, "load", g->ckpt[x->ckpt], "--nproc", nproc, "--backend", g->backend,
                          "--staging", staging, "--strategy",
                          x->strategy == SL_STRATEGY_BROADCAST ? "broadcast" : "scatter", "--timeout", timeout,
                          "--json"};
  int argc = 14;
  for (int i = 0; g->cli_args[i] && argc < 23; i++) argv[argc++] = g->cli_args[i];
  argv[argc] = NULL;
  if (x->cold) evict_path(g->ckpt[x->ckpt]);
  char *text = NULL;
  int st = spawn((char *const *)argv, &text, err, bench_now() + o->timeout_s);
  json_error_t je;
  json_t *root = text ? json_loads(text, 0, &je) : NULL;
  free(text);
  json_t *ranks = json_object_get(root, "ranks");
  if (st != 0 || !json_is_array(ranks) || json_array_size(ranks) != (size_t)g->world) {
    fprintf(stderr, "bench_pipeline: the baseline %s load %s --nproc %d ... %s (status %d); its errors:\n",
            o->baseline, g->ckpt[x->ckpt], g->world, st < 0 ? "did not finish within --timeout" : "failed", st);
    FILE *e = fopen(err, "r");
    for (int c; e && (c = fgetc(e)) != EOF;) fputc(c, stderr);
    if (e) fclose(e);
    json_decref(root);
    return 1;
  }
  *slowest = 0;
  *sent_all = 0;
  for (size_t r = 0; r < json_array_size(ranks); r++) {
    json_t *rj = json_array_get(ranks, r), *sj = json_object_get(rj, "stats");
    double sec = json_real_value(json_object_get(sj, "seconds"));
    if (sec > *slowest) *slowest = sec;
    *sent_all += json_u64(sj, "bytes_sent");
    if (r) continue;
    memset(rank0, 0, sizeof *rank0);
    rank0->size = sizeof *rank0;
    rank0->seconds = sec;
    rank0->bytes_read = json_u64(sj, "bytes_read");
    rank0->bytes_sent = json_u64(sj, "bytes_sent");
    rank0->staging_bytes = json_u64(sj, "staging_bytes");
    rank0->transfers = json_u64(sj, "transfers");
    *tensors = json_u64(json_object_get(rj, "totals"), "tensors");
  }
  *ckpt_bytes = json_u64(root, "checkpoint_bytes");
  json_decref(root);
  return 0;
}

/* Runs baseline group G like run_group: a warm-up round, then --reps rounds. */
static int run_cli_group(const group *g, const options *o, measured *m) {
  for (int round = 0; round <= o->reps; round++)
    for (int v = 0; v < g->nv; v++) {
      measured *mv = &m[v];
      sl_load_stats r0;
      double slowest;
      uint64_t sent_all, tensors = 0;
      if (cli_load(g, &g->v[v], o, &r0, &slowest, &sent_all, &mv->ckpt_bytes, &tensors)) return 1;
      snprintf(mv->collective, sizeof mv->collective, "gloo");
      mv->ckpt_tensors = tensors;
      if (round == 0) continue;
      mv->seconds[mv->n] = slowest;
      mv->overlap[mv->n] = 0;
      mv->rank0[mv->n] = r0;
      mv->sent_all[mv->n] = sent_all;
      mv->n++;
    }
  return 0;
}

/* ---- checkpoints ------------------------------------------------------------------------ */

/* A BF16 safetensors file of N tensors of shape [ROWS, COLS]: a small writer of its own, since
 * synth writes a transformer layout and part 2 needs a given tensor count. */
static int write_uniform(const char *path, int n, int64_t rows, int64_t cols) {
  uint64_t each = (uint64_t)rows * (uint64_t)cols * 2;
  json_t *hdr = json_object();
  json_object_set_new(hdr, "__metadata__", json_pack("{s:s}", "format", "pt"));
  for (int i = 0; i < n; i++) {
    char name[64];
    snprintf(name, sizeof name, "blocks.%05d.weight", i);
    json_object_set_new(hdr, name, json_pack("{s:s, s:[I,I], s:[I,I]}", "dtype", "BF16", "shape", (json_int_t)rows,
                                             (json_int_t)cols, "data_offsets", (json_int_t)(i * each),
                                             (json_int_t)((i + 1) * each)));
  }
  char *text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(hdr);
  if (!text) return -1;
  size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
  uint16_t *data = malloc(each);
  FILE *f = fopen(path, "wb");
  int rc = -1;
  if (!f || !data) goto out;
  uint64_t hlen = padded;
  if (fwrite(&hlen, 8, 1, f) != 1 || fwrite(text, 1, len, f) != len) goto out;
  for (size_t i = len; i < padded; i++)
    if (fputc(' ', f) == EOF) goto out;
  for (int i = 0; i < n; i++) {
    /* small finite BF16 values that differ per tensor and element */
    for (uint64_t e = 0; e < each / 2; e++) data[e] = (uint16_t)(0x3c00u + ((e * 31u + (uint64_t)i * 17u) & 0x3ffu));
    if (fwrite(data, 1, each, f) != each) goto out;
  }
  rc = 0;
out:
  if (f && fclose(f) != 0) rc = -1;
  if (rc) fprintf(stderr, "bench_pipeline: cannot write %s: %s\n", path, strerror(errno));
  free(data);
  free(text);
  return rc;
}

/* The shardload command beside this program (build/bench/bench_pipeline -> build/shardload). */
static const char *find_cli(const options *o, char *buf, size_t len) {
  if (o->bin) return o->bin;
  if (getenv("SHARDLOAD_BIN")) return getenv("SHARDLOAD_BIN");
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return NULL;
  self[n] = 0;
  char *slash = strrchr(self, '/');
  if (!slash) return NULL;
  *slash = 0;
  snprintf(buf, len, "%s/../shardload", self);
  return access(buf, X_OK) == 0 ? buf : NULL;
}

static int synth(const options *o, const char *path) {
  struct stat sb;
  if (stat(path, &sb) == 0) return 0; /* written whole by an earlier run (renamed into place): the same bytes */
  char cli[PATH_MAX + 32];
  const char *bin = find_cli(o, cli, sizeof cli);
  if (!bin) {
    fprintf(stderr, "bench_pipeline: cannot find the shardload command to write %s; build the target "
            "shardload_cli, or pass --bin PATH (or --checkpoint PATH)\n", path);
    return -1;
  }
  char tmp[PATH_MAX + 8], size[32], err[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  snprintf(size, sizeof size, "%llu", (unsigned long long)o->size);
  snprintf(err, sizeof err, "%s/synth.err", o->dir);
  const char *argv[] = {bin, "synth", tmp, "--size", size, NULL};
  fprintf(stderr, "bench_pipeline: writing %s (%s synth --size %s)\n", path, bin, size);
  int st = spawn((char *const *)argv, NULL, err, bench_now() + o->timeout_s);
  if (st != 0 || rename(tmp, path) != 0) {
    fprintf(stderr, "bench_pipeline: %s synth %s failed (status %d%s%s); see %s\n", bin, tmp, st,
            st == 0 ? ", rename: " : "", st == 0 ? strerror(errno) : "", err);
    unlink(tmp);
    return -1;
  }
  return 0;
}

/* ---- main ------------------------------------------------------------------------------ */

static void usage(FILE *f) {
  fprintf(f, "usage: bench_pipeline [--dir DIR] [--size 512MiB] [--staging 16MiB] [--reps N] [--parts 1,2,3]\n"
             "                      [--bin SHARDLOAD] [--checkpoint PATH] [--sim-delay-us N] [--timeout S]\n"
             "                      [--json PATH] [--check] [--baseline-bin OLD]\n"
             "  --dir DIR         where the checkpoints are written (default /tmp/shardload-bench)\n"
             "  --size SIZE       parts 1 and 3: `shardload synth` checkpoint size (default 512MiB)\n"
             "  --checkpoint P    parts 1 and 3: use this checkpoint instead of synthesizing one\n"
             "  --staging SIZE    staging budget per rank, split between the slots (default 16MiB)\n"
             "  --reps N          measured rounds after the warm-up round (default 5)\n"
             "  --parts LIST      which parts to run (default 1,2,3)\n"
             "  --bin PATH        the shardload command for synth (default: $SHARDLOAD_BIN, ../shardload)\n"
             "  --sim-delay-us N  SHARDLOAD_SIM_DELAY_US of the ranks (default 0)\n"
             "  --timeout S       per group of loads, and the ranks' collective timeout (default 300)\n"
             "  --json PATH       write every measurement and the ratios to PATH\n"
             "  --check           exit 1 when an invariant that does not depend on timing fails (rank 0\n"
             "                    reads the checkpoint once, small tensors share transfers, HSDP bytes)\n"
             "  --baseline-bin P  also run every part's cpu loads with the shardload command P (one built\n"
             "                    from the serial loader before the pipeline) through `load --nproc --json`: rows 'before7'\n");
}

static int parse_args(int argc, char **argv, options *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    }
    if (!strcmp(a, "--check")) {
      o->check = 1;
      continue;
    }
    if (!val) goto bad;
    i++;
    if (!strcmp(a, "--dir")) o->dir = val;
    else if (!strcmp(a, "--bin")) o->bin = val;
    else if (!strcmp(a, "--checkpoint")) o->checkpoint = val;
    else if (!strcmp(a, "--json")) o->json = val;
    else if (!strcmp(a, "--baseline-bin")) o->baseline = val;
    else if (!strcmp(a, "--size")) {
      if (bench_parse_size(val, &o->size)) goto bad_value;
    } else if (!strcmp(a, "--staging")) {
      if (bench_parse_size(val, &o->staging)) goto bad_value;
    } else if (!strcmp(a, "--reps")) {
      o->reps = atoi(val);
      if (o->reps < 1 || o->reps >= MAX_REPS) goto bad_value;
    } else if (!strcmp(a, "--sim-delay-us")) {
      o->sim_delay_us = atoi(val);
      if (o->sim_delay_us < 0) goto bad_value;
    } else if (!strcmp(a, "--timeout")) {
      o->timeout_s = atoi(val);
      if (o->timeout_s < 1) goto bad_value;
    } else if (!strcmp(a, "--parts")) {
      o->parts = 0;
      for (const char *p = val; *p; p++) {
        if (*p >= '1' && *p <= '3') o->parts |= 1 << (*p - '1');
        else if (*p != ',') goto bad_value;
      }
    } else {
      goto bad;
    }
    continue;
  bad_value:
    fprintf(stderr, "bench_pipeline: %s: cannot use '%s'\n", a, val);
    usage(stderr);
    return -1;
  }
  return 0;
bad:
  usage(stderr);
  return -1;
}

int main(int argc, char **argv) {
  options o = {.dir = "/tmp/shardload-bench", .size = 512ull << 20, .staging = 16ull << 20, .reps = 5,
               .parts = 7, .timeout_s = 300};
  if (parse_args(argc, argv, &o)) return 2;
  if (mkdir(o.dir, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "bench_pipeline: cannot create %s: %s; pass --dir DIR\n", o.dir, strerror(errno));
    return 1;
  }
  char delay[32];
  snprintf(delay, sizeof delay, "%d", o.sim_delay_us);
  setenv("SHARDLOAD_SIM_DELAY_US", delay, 1);

  char big[PATH_MAX], small[PATH_MAX], large[PATH_MAX];
  snprintf(big, sizeof big, "%s/synth-%llu.safetensors", o.dir, (unsigned long long)o.size);
  snprintf(small, sizeof small, "%s/small-10000x4KiB.safetensors", o.dir);
  snprintf(large, sizeof large, "%s/large-10x4000KiB.safetensors", o.dir);
  const char *ck = o.checkpoint ? o.checkpoint : big;
  if ((o.parts & 5) && !o.checkpoint && synth(&o, big)) return 1;
  /* 10^4 x [64, 32] BF16 = 4 KiB each; the same 40,960,000 bytes as 10 x [1000, 2048] */
  if ((o.parts & 2) && (write_uniform(small, 10000, 64, 32) || write_uniform(large, 10, 1000, 2048))) return 1;

  /* part 1: slots 1, 2 and 3 at one staging budget (the slots split it), and slots 1 at half the
   * budget: the slot size and transfers of slots 2, so that overlap alone differs */
#define P1_VARIANTS                                                                                    \
  {{"warm, slots 1", 1, 0, 0, 0, 0},     {"warm, slots 1, 1/2 budget", 1, 0, 0, 0, 2},                  \
   {"warm, slots 2", 2, 0, 0, 0, 0},     {"warm, slots 3", 3, 0, 0, 0, 0},                              \
   {"cold, slots 1", 1, 0, 0, 1, 0},     {"cold, slots 1, 1/2 budget", 1, 0, 0, 1, 2},                  \
   {"cold, slots 2", 2, 0, 0, 1, 0},     {"cold, slots 3", 3, 0, 0, 1, 0}}
  /* part 2: 10^4 x 4 KiB against 10 x 4000 KiB; part 3: scatter (the HSDP chain) and broadcast */
#define P2_VARIANTS {{"10^4 x 4 KiB", 0, 0, 0, 0, 0}, {"10 x 4000 KiB", 0, 0, 1, 0, 0}}
#define P3_VARIANTS {{"scatter", 0, SL_STRATEGY_SCATTER, 0, 0, 0}, {"broadcast", 0, SL_STRATEGY_BROADCAST, 0, 0, 0}}
  /* the serial loader before the pipeline had no pipeline_slots: slots 1 (serial) stands for it */
#define P1_BASELINE {{"warm", 1, 0, 0, 0, 0}, {"cold", 1, 0, 0, 1, 0}}
#define HSDP .world = 4, .mesh_ndim = 2, .mesh = {2, 2}, .placement = "[replicate, shard(0)]"
  static const char *const HSDP_ARGS[] = {"--mesh", "2x2", "--placement", "[replicate, shard(0)]", NULL};
  static const char *const NO_ARGS[] = {NULL};
  group groups[] = {
      {.part = 1, .backend = "sim", .world = 2, .ckpt = {ck}, .nckpt = 1, .v = P1_VARIANTS, .nv = 8},
      {.part = 1, .backend = "sim", .collective = "gloo", .world = 2, .ckpt = {ck}, .nckpt = 1, .v = P1_VARIANTS,
       .nv = 8},
      {.part = 1, .backend = "cpu", .world = 2, .ckpt = {ck}, .nckpt = 1, .v = P1_VARIANTS, .nv = 8},
      {.part = 1, .backend = "cpu", .cli_args = NO_ARGS, .tag = "before7", .world = 2, .ckpt = {ck}, .nckpt = 1,
       .v = P1_BASELINE, .nv = 2},
      {.part = 2, .backend = "cpu", .world = 2, .ckpt = {small, large}, .nckpt = 2, .v = P2_VARIANTS, .nv = 2},
      {.part = 2, .backend = "sim", .world = 2, .ckpt = {small, large}, .nckpt = 2, .v = P2_VARIANTS, .nv = 2},
      {.part = 2, .backend = "cpu", .cli_args = NO_ARGS, .tag = "before7", .world = 2, .ckpt = {small, large},
       .nckpt = 2, .v = P2_VARIANTS, .nv = 2},
      {.part = 3, .backend = "cpu", HSDP, .ckpt = {ck}, .nckpt = 1, .v = P3_VARIANTS, .nv = 2},
      {.part = 3, .backend = "sim", HSDP, .ckpt = {ck}, .nckpt = 1, .v = P3_VARIANTS, .nv = 2},
      {.part = 3, .backend = "cpu", .cli_args = HSDP_ARGS, .tag = "before7", HSDP, .ckpt = {ck}, .nckpt = 1,
       .v = P3_VARIANTS, .nv = 2},
  };
  const char *titles[] = {
      "part 1: overlap, pipelined (slots 2, 3) against serial (slots 1), world 2",
      "part 2: small tensors, world 2, scatter, default slots",
      "part 3: HSDP 2x2 (world 4, [replicate, shard(0)]), rank 0's bytes sent",
  };
  enum { NG = sizeof groups / sizeof groups[0] };
  static measured res[NG][MAX_VARIANTS];
  int ran[NG] = {0};
  double t0 = bench_now();
  int rc = 0;
  printf("staging %llu MiB per rank, %d measured rounds after one warm-up round (medians), "
         "SHARDLOAD_SIM_DELAY_US=%d\n", (unsigned long long)(o.staging >> 20), o.reps, o.sim_delay_us);
  fflush(stdout);
  for (size_t gi = 0; gi < NG && !rc; gi++) {
    const group *g = &groups[gi];
    if (!(o.parts & (1 << (g->part - 1))) || (g->cli_args && !o.baseline)) continue;
    double tg = bench_now();
    if ((rc = g->cli_args ? run_cli_group(g, &o, res[gi]) : run_group(g, &o, res[gi])) != 0) break;
    ran[gi] = 1;
    fprintf(stderr, "  measured part %d, %s%s%s: %.0f s\n", g->part, name_of(g), g->collective ? " + " : "",
            g->collective ? g->collective : "", bench_now() - tg);
  }
  /* made after the last fork: the ranks inherit no allocation of the parent's */
  json_t *rows = json_array(), *ratios = json_array();
  for (size_t gi = 0; gi < NG; gi++)
    for (int v = 0; ran[gi] && v < groups[gi].nv; v++)
      json_array_append_new(rows, row_json(&groups[gi], &groups[gi].v[v], &res[gi][v]));
  results R = {groups, NG, res, ran};
  for (int part = 1; part <= 3 && !rc; part++) {
    if (!(o.parts & (1 << (part - 1)))) continue;
    printf("\n%s\n", titles[part - 1]);
    if (part != 2) printf("checkpoint %s\n", ck);
    if (part == 1) print_part1(&R, ratios);
    if (part == 2) print_part2(&R, ratios);
    if (part == 3) print_part3(&R, ratios);
  }
  printf("\ntotal benchmark time: %.0f s\n", bench_now() - t0);
  /* every load ran: the figures are written whatever --check says of them */
  if (!rc && o.json) {
    json_t *root = json_pack("{s:I, s:i, s:i, s:o, s:o}", "staging_bytes", (json_int_t)o.staging, "reps", o.reps,
                             "sim_delay_us", o.sim_delay_us, "rows", rows, "ratios", ratios);
    rows = ratios = NULL;
    if (json_dump_file(root, o.json, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
      fprintf(stderr, "bench_pipeline: cannot write %s\n", o.json);
      rc = 1;
    }
    json_decref(root);
  }
  json_decref(rows);
  json_decref(ratios);
  fflush(stdout);
  if (!rc && o.check && check_results(&R)) rc = 1;
  return rc;
}
