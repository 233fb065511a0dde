/* bench_floor: the floor of every-rank reads — each of N processes reading its share of a
 * checkpoint from the page cache into memory of its own, and nothing else.
 *
 *   bench_floor CKPT [--nproc 2,4] [--rounds 7] [--json] [--check]
 *
 * The parent forks the N ranks of each world before any library call. Each rank opens the
 * checkpoint alone (a context of world 1: the headers, nothing else), and takes its byte
 * ranges from the library's own plan, as sl_load's every-rank mode computes them: the default
 * plan (FSDP2, shard(0) on a 1-D mesh of N), sl__plan_check's taken tensors, sl__shard_of's
 * region for the rank's mesh coordinate, sl__region_runs' contiguous runs (loader_plan.c,
 * loader_recv.c:sl__loader_read_own). Rank 0 then reads every file of the checkpoint once, so
 * the page cache is warm, and every rank waits at the barrier (a pipe). Per round, three
 * variants, in an order that rotates each round:
 *   fresh  allocate every shard with sl_alloc (the loader's own allocation: populated from
 *          1 MiB, huge pages from 2 MiB) and pread each run straight into it: pays the first
 *          touch of fresh memory, as a load does;
 *   warm   the same preads into shards allocated and written before the barrier: the copy
 *          out of the page cache alone;
 *   proc   fresh, in a process the rank forks for it, timed to that process's exit: fork, the
 *          fresh variant, and the kernel freeing the shards at exit, as a command's rank pays
 *          them (but not its start-up, rendezvous or report).
 * A variant's time runs from the parent's go (it writes a byte to every rank's pipe) to the
 * last rank done (each rank sends its CLOCK_MONOTONIC end); its CPU time is every rank's
 * user + system seconds over the same span. Medians over the rounds.
 * --check: exit 1 unless the ranks' shares add up to the checkpoint's bytes (the default plan
 * shards every tensor that has a dimension, so each byte is one rank's; a 0-d tensor every
 * rank's) and every read was whole. Always, whatever --check: a rank whose runs do not read
 * the shard sl_plan_geometry gives it, each byte into its place, fails before the rounds
 * (check_runs; exit 2). --json: one JSON
 * object with every sample on stdout instead of the table. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "internal.h" /* the loader's geometry: sl__plan_check, sl__shard_of, sl__region_runs */

#define MAX_WORLDS 8
#define MAX_WORLD 64
#define MAX_ROUNDS 100
#define NVARIANTS 3

static const char *const VARIANT[NVARIANTS] = {"fresh", "warm", "proc"};

typedef struct run {
  int fd;       /* the file's descriptor in this rank */
  uint64_t off; /* in the file */
  size_t dst;   /* in the shard */
  size_t bytes;
  size_t shard; /* index into the rank's shards */
} run;

typedef struct share {
  size_t *shard_bytes; /* per taken tensor of this rank */
  size_t nshards;
  run *runs;
  size_t nruns, cap;
  uint64_t bytes;      /* sum of the runs */
  uint64_t replicated; /* of them, tensors every rank holds whole (a 0-d tensor) */
  int *fds;
  size_t nfds;
} share;

typedef struct collect {
  share *s;
  const sl_source_tensor *t;
  int fd;
  size_t shard;
  size_t es;
} collect;

static void die(const char *what, const char *msg) {
  fprintf(stderr, "bench_floor: %s: %s\n", what, msg);
  exit(2);
}

static sl_status add_run(void *user, uint64_t gs, uint64_t ls, uint64_t count) {
  collect *c = user;
  share *s = c->s;
  if (s->nruns == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 256;
    if (!(s->runs = realloc(s->runs, s->cap * sizeof *s->runs))) die("runs", "out of memory");
  }
  s->runs[s->nruns++] = (run){c->fd, c->t->file_offset + gs * c->es, (size_t)(ls * c->es), (size_t)(count * c->es),
                              c->shard};
  s->bytes += count * c->es;
  return SL_OK;
}

/* The global element index, in T, of local element L of the shard G describes (row-major). */
static uint64_t global_of(const sl_source_tensor *t, const sl_shard_geometry *g, uint64_t l) {
  uint64_t idx[SL_MAX_DIMS], at = 0;
  for (int d = g->ndim - 1; d >= 0; d--) {
    idx[d] = l % (uint64_t)g->local_shape[d];
    l /= (uint64_t)g->local_shape[d];
  }
  for (int d = 0; d < g->ndim; d++) at = at * (uint64_t)t->shape[d] + idx[d] + (uint64_t)g->global_offset[d];
  return at;
}

/* The runs of T from FIRST on read the file's bytes of the shard that sl_plan_geometry gives
 * the rank (G), each into its place, and fill the shard: in order, one after another from its
 * first element to its last, each run's first element at the file offset of its global index
 * and its last COUNT - 1 elements further on (the map from local to global indices is
 * increasing, so every element between is where it belongs too). */
static void check_runs(const share *s, size_t first, const sl_source_tensor *t, const sl_shard_geometry *g, size_t es) {
  uint64_t next = 0, local = 1;
  if (g->ndim != t->ndim) die(t->name, "sl_plan_geometry gives the shard another rank than the tensor's");
  for (int d = 0; d < g->ndim; d++) local *= (uint64_t)g->local_shape[d];
  for (size_t k = first; k < s->nruns; k++) {
    const run *r = &s->runs[k];
    uint64_t ls = r->dst / es, n = r->bytes / es;
    if (!n) continue;
    uint64_t gs = global_of(t, g, ls);
    if (r->dst % es || r->bytes % es || ls != next || r->off != t->file_offset + gs * es ||
        global_of(t, g, ls + n - 1) - gs != n - 1)
      die(t->name, "a run is not where sl_plan_geometry puts the rank's shard");
    next = ls + n;
  }
  if (next != local || local * es != g->nbytes) die(t->name, "the runs do not fill the rank's shard");
}

/* This rank's share of PATH in a world of WORLD, from the library's plan; rank 0 also warms
 * the page cache. */
static void plan_share(const char *path, int rank, int world, sl_context **ctx_out, share *s) {
  char err[1024] = "";
  sl_context_options co =
      {.size = sizeof co, .backend = "cpu", .world_size = 1, .rank = 0, .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx;
  sl_source *src;
  sl_plan *plan;
  if (sl_context_create(&co, &ctx) != SL_OK) die("context", err);
  if (sl_source_open(ctx, path, &src) != SL_OK) die(path, sl_context_errmsg(ctx));
  if (sl_plan_create(ctx, &plan) != SL_OK) die("plan", sl_context_errmsg(ctx));
  size_t n = sl_source_tensor_count(src);
  unsigned char *take = calloc(n ? n : 1, 1);
  s->shard_bytes = calloc(n ? n : 1, sizeof *s->shard_bytes);
  s->nfds = sl_source_file_count(src);
  s->fds = calloc(s->nfds ? s->nfds : 1, sizeof *s->fds);
  if (!take || !s->shard_bytes || !s->fds) die("plan", "out of memory");
  for (size_t f = 0; f < s->nfds; f++)
    if ((s->fds[f] = open(sl_source_file_at(src, f), O_RDONLY | O_CLOEXEC)) < 0)
      die(sl_source_file_at(src, f), strerror(errno));
  if (sl__plan_check(plan, src, world, take) != SL_OK) die("plan", sl_context_errmsg(ctx));
  int mesh[SL_MAX_MESH_DIMS], coord[SL_MAX_MESH_DIMS];
  int ndim = sl__plan_mesh(plan, world, mesh);
  sl__mesh_coord(rank, ndim, mesh, coord);
  for (size_t i = 0; i < n; i++) {
    if (!take[i]) continue;
    const sl_source_tensor *t = sl_source_tensor_at(src, i);
    sl__resolved res;
    sl__region reg;
    uint64_t nbytes;
    if (sl__shard_of(plan, t, ndim, mesh, coord, &res, &reg, &nbytes) != SL_OK) die(t->name, sl_context_errmsg(ctx));
    if (res.dtype != t->dtype) die(t->name, "the plan casts; the floor reads the file's dtype");
    collect c = {.s = s, .t = t, .fd = -1, .shard = s->nshards, .es = sl_dtype_size(t->dtype)};
    for (size_t f = 0; f < s->nfds; f++)
      if (!strcmp(sl_source_file_at(src, f), t->file)) c.fd = s->fds[f];
    if (c.fd < 0) die(t->name, "its file is not among the source's files");
    uint64_t elems = 1;
    for (int d = 0; d < t->ndim; d++) elems *= (uint64_t)t->shape[d];
    size_t first = s->nruns;
    if (sl__region_runs(&reg, 0, elems, add_run, &c) != SL_OK) die(t->name, sl_context_errmsg(ctx));
    s->shard_bytes[s->nshards++] = (size_t)nbytes;
    sl_shard_geometry g = {.size = sizeof g};
    if (sl_plan_geometry(plan, t, rank, world, &g) != SL_OK) die(t->name, sl_context_errmsg(ctx));
    check_runs(s, first, t, &g, c.es);
    if (g.replicated) s->replicated += nbytes;
  }
  if (rank == 0) { /* the page cache, warm: every file read once */
    static unsigned char buf[1 << 20];
    for (size_t f = 0; f < s->nfds; f++)
      for (uint64_t off = 0;; off += sizeof buf) {
        ssize_t r = pread(s->fds[f], buf, sizeof buf, (off_t)off);
        if (r < 0) die(sl_source_file_at(src, f), strerror(errno));
        if (r == 0) break;
      }
  }
  free(take);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  *ctx_out = ctx;
}

static void alloc_shards(sl_context *ctx, const share *s, void **dst) {
  for (size_t i = 0; i < s->nshards; i++) {
    dst[i] = NULL;
    if (s->shard_bytes[i] && sl_alloc(ctx, SL_DEVICE_CPU, 0, s->shard_bytes[i], &dst[i]) != SL_OK)
      die("shard", sl_context_errmsg(ctx));
  }
}

static void free_shards(sl_context *ctx, const share *s, void **dst) {
  for (size_t i = 0; i < s->nshards; i++)
    if (dst[i]) sl_free(ctx, SL_DEVICE_CPU, 0, dst[i]);
}

/* Every run into its shard; false when a read came short. */
static bool read_share(const share *s, void **dst) {
  for (size_t i = 0; i < s->nruns; i++) {
    const run *r = &s->runs[i];
    if (sl__pread_full(r->fd, (unsigned char *)dst[r->shard] + r->dst, r->bytes, r->off) != (ssize_t)r->bytes)
      return false;
  }
  return true;
}

typedef struct msg {
  double end;     /* CLOCK_MONOTONIC, when this rank was done */
  double cpu;     /* its CPU seconds (user + system) from the go to done */
  uint64_t bytes; /* its share (the ready message) */
  uint64_t replicated;
  int ok; /* every read whole */
} msg;

static void put(int fd, const void *p, size_t n) {
  if (write(fd, p, n) != (ssize_t)n) _exit(3);
}

static bool get(int fd, void *p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += (size_t)r;
  }
  return true;
}

static double cpu_now(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

/* A rank: its share, ready, then per round and variant: wait for go, read, report. */
/* The warm variant's shards: written once before the rounds, and kept out of the proc variant's
 * forks (MADV_DONTFORK), whose page tables would otherwise copy them. */
static void warm_shards(const share *s, void **dst) {
  for (size_t i = 0; i < s->nshards; i++) {
    size_t n = s->shard_bytes[i] ? s->shard_bytes[i] : 1;
    dst[i] = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (dst[i] == MAP_FAILED) die("shards", strerror(errno));
    madvise(dst[i], n, MADV_DONTFORK);
    memset(dst[i], 0xA5, n);
  }
}

/* The proc variant: a fresh process allocates, reads and exits (the kernel frees its shards). */
static bool read_in_child(sl_context *ctx, const share *s, void **dst) {
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    alloc_shards(ctx, s, dst);
    _exit(read_share(s, dst) ? 0 : 1);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static double cpu_children(void) {
  struct rusage u;
  getrusage(RUSAGE_CHILDREN, &u);
  return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

/* A rank: its share, ready, then per round and variant: wait for go, read, report. */
static void rank_main(const char *path, int rank, int world, int rounds, int go, int up) {
  sl_context *ctx;
  share s = {0};
  plan_share(path, rank, world, &ctx, &s);
  void **dst = calloc(s.nshards ? s.nshards : 1, sizeof *dst);
  void **warm = calloc(s.nshards ? s.nshards : 1, sizeof *warm);
  if (!dst || !warm) die("shards", "out of memory");
  warm_shards(&s, warm);
  msg m = {.bytes = s.bytes, .replicated = s.replicated, .ok = 1};
  put(up, &m, sizeof m);
  for (int r = 0; r < rounds; r++)
    for (int k = 0; k < NVARIANTS; k++) {
      int v = (k + r) % NVARIANTS;
      char c;
      if (!get(go, &c, 1)) _exit(4);
      double c0 = cpu_now(), k0 = cpu_children();
      if (v == 0) {
        alloc_shards(ctx, &s, dst);
        m.ok = read_share(&s, dst);
      } else if (v == 1) {
        m.ok = read_share(&s, warm);
      } else {
        m.ok = read_in_child(ctx, &s, dst);
      }
      m.end = bench_now();
      m.cpu = cpu_now() - c0 + cpu_children() - k0;
      put(up, &m, sizeof m);
      if (v == 0) free_shards(ctx, &s, dst);
    }
  sl_context_destroy(ctx);
  _exit(0);
}

typedef struct result {
  int world;
  uint64_t share[MAX_WORLD];
  uint64_t replicated[MAX_WORLD];
  double t[NVARIANTS][MAX_ROUNDS];
  double cpu[NVARIANTS][MAX_ROUNDS]; /* every rank's CPU seconds */
  bool ok;
} result;

static void run_world(const char *path, int world, int rounds, result *res) {
  int go[MAX_WORLD], up[2];
  pid_t pid[MAX_WORLD];
  if (pipe(up) != 0) die("pipe", strerror(errno));
  for (int r = 0; r < world; r++) {
    int p[2];
    if (pipe(p) != 0) die("pipe", strerror(errno));
    fflush(NULL);
    if ((pid[r] = fork()) < 0) die("fork", strerror(errno));
    if (pid[r] == 0) {
      close(p[1]);
      close(up[0]);
      for (int q = 0; q < r; q++) close(go[q]);
      rank_main(path, r, world, rounds, p[0], up[1]);
    }
    close(p[0]);
    go[r] = p[1];
  }
  close(up[1]);
  res->world = world;
  res->ok = true;
  /* the ready messages say each share; a rank that died before its own says nothing, so the
   * pipe ends early and the world fails */
  for (int r = 0; r < world; r++) {
    msg m;
    if (!get(up[0], &m, sizeof m)) die("ranks", "a rank died before it was ready (its message is above)");
    res->share[r] = m.bytes; /* order of arrival: the sums are what count */
    res->replicated[r] = m.replicated;
  }
  for (int r = 0; r < rounds; r++)
    for (int k = 0; k < NVARIANTS; k++) {
      int v = (k + r) % NVARIANTS;
      double t0 = bench_now(), end = t0, cpu = 0;
      for (int q = 0; q < world; q++) put(go[q], "g", 1);
      for (int q = 0; q < world; q++) {
        msg m;
        if (!get(up[0], &m, sizeof m)) die("ranks", "a rank died in a round");
        if (m.end > end) end = m.end;
        cpu += m.cpu;
        res->ok &= m.ok != 0;
      }
      res->t[v][r] = end - t0;
      res->cpu[v][r] = cpu;
    }
  for (int r = 0; r < world; r++) {
    close(go[r]);
    int status;
    if (waitpid(pid[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) res->ok = false;
  }
  close(up[0]);
}

static int parse_list(const char *s, int *out, int max) {
  int n = 0;
  for (char *e; *s && n < max; s = *e ? e + 1 : e) {
    long v = strtol(s, &e, 10);
    if (e == s || v < 1 || v > MAX_WORLD || (*e && *e != ',')) return -1;
    out[n++] = (int)v;
  }
  return n;
}

static void usage(void) {
  fprintf(stderr, "usage: bench_floor CKPT [--nproc 2,4] [--rounds 7] [--json] [--check]\n");
  exit(2);
}

int main(int argc, char **argv) {
  const char *path = NULL;
  int worlds[MAX_WORLDS] = {2, 4}, nworlds = 2, rounds = 7;
  bool json = false, check = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--nproc") && i + 1 < argc) {
      if ((nworlds = parse_list(argv[++i], worlds, MAX_WORLDS)) <= 0) usage();
    } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = atoi(argv[++i]);
      if (rounds < 1 || rounds > MAX_ROUNDS) usage();
    } else if (!strcmp(argv[i], "--json")) json = true;
    else if (!strcmp(argv[i], "--check")) check = true;
    else if (argv[i][0] != '-' && !path) path = argv[i];
    else usage();
  }
  if (!path) usage();
  signal(SIGPIPE, SIG_IGN);
  static result res[MAX_WORLDS];
  for (int w = 0; w < nworlds; w++) run_world(path, worlds[w], rounds, &res[w]);

  /* the checkpoint's bytes, read by the parent only now: it made no library call before the forks */
  sl_context *ctx;
  sl_source *src;
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co,
                           .backend = "cpu",
                           .world_size = 1,
                           .errbuf = err,
                           .errbuf_size = sizeof err};
  if (sl_context_create(&co, &ctx) != SL_OK) die("context", err);
  if (sl_source_open(ctx, path, &src) != SL_OK) die(path, sl_context_errmsg(ctx));
  uint64_t total = sl_source_total_bytes(src);
  sl_source_destroy(src);
  sl_context_destroy(ctx);

  int bad = 0;
  if (json)
    printf("{\"checkpoint\": \"%s\", \"bytes\": %" PRIu64 ", \"rounds\": %d, \"worlds\": [", path, total, rounds);
  else
    printf("bench_floor %s: %.1f MiB, %d rounds, medians (from the go to the last rank done)\n", path,
           (double)total / (1 << 20), rounds);
  if (!json)
    printf("%-6s %-10s %-10s %-10s %-10s %-10s %-10s %-10s %-10s\n", "world", "share MiB", "fresh s", "fresh cpu",
           "warm s", "warm cpu", "proc s", "proc cpu", "fresh GB/s");
  for (int w = 0; w < nworlds; w++) {
    const result *r = &res[w];
    uint64_t sum = 0, most = 0, rep = 0;
    for (int q = 0; q < r->world; q++) {
      sum += r->share[q];
      rep += r->replicated[q];
      most = r->share[q] > most ? r->share[q] : most;
    }
    /* every byte is one rank's, but for the tensors every rank holds whole */
    uint64_t once = sum - rep + rep / (uint64_t)r->world;
    if (!r->ok) fprintf(stderr, "bench_floor: world %d: a read came short or a rank failed\n", r->world), bad = 1;
    if (check && (once != total || rep % (uint64_t)r->world))
      fprintf(stderr,
              "bench_floor: world %d: the shares add up to %" PRIu64 " bytes (%" PRIu64
              " of them replicated), the checkpoint has %" PRIu64 "\n",
              r->world, sum, rep, total),
          bad = 1;
    double f = bench_median(r->t[0], rounds);
    if (json) {
      printf("%s{\"world\": %d, \"share_bytes_max\": %" PRIu64 ", \"share_bytes_sum\": %" PRIu64, w ? ", " : "",
             r->world, most, sum);
      for (int v = 0; v < NVARIANTS; v++) {
        printf(", \"%s\": [", VARIANT[v]);
        for (int k = 0; k < rounds; k++) printf("%s%.6f", k ? ", " : "", r->t[v][k]);
        printf("], \"%s_cpu\": [", VARIANT[v]);
        for (int k = 0; k < rounds; k++) printf("%s%.6f", k ? ", " : "", r->cpu[v][k]);
        printf("]");
      }
      printf("}");
    } else {
      printf("%-6d %-10.1f", r->world, (double)most / (1 << 20));
      for (int v = 0; v < NVARIANTS; v++)
        printf(" %-10.4f %-10.4f", bench_median(r->t[v], rounds), bench_median(r->cpu[v], rounds));
      printf(" %-10.2f\n", (double)total / f / 1e9);
    }
  }
  if (json) printf("]}\n");
  else
    printf(
        "share: the largest rank's bytes; cpu: every rank's CPU seconds; GB/s: the checkpoint's bytes / the fresh "
        "median\n");
  return bad;
}
