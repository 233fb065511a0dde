/* The collective conformance suite: every op of shardload/module.h's collective table, on one
 * module named by its name or its file (docs/MODULES.md, "Testing a module"), run by real
 * processes (sl_test_spawn) that bootstrap through a real control plane (Gloo over a file://
 * rendezvous on loopback; local for one rank), as the core starts a data collective. Buffers
 * live where the module's table says it moves them (device memory of the paired backend, filled
 * and read back by its copies, for a device collective); a stream-ordered module's ops are
 * enqueued on the backend's streams and complete by their sync. Optional ops (split, abort,
 * scatterv_group) are tested only where SL_HAS_OP says the module offers them (else skipped).
 *
 *   conformance_collective [--backend B] [--worlds 1,2,4] [--hosts K] [--async] [--v1] [--xfail CASE@W] MODULE
 *
 * MODULE and B: NAME (built in, or on SHARDLOAD_MODULE_PATH) or DIR/libshardload-NAME.so; B is
 * the backend each rank runs (default cpu). --worlds: the world sizes to run each case with.
 * --async: B runs enqueued work later, so a collective that does not wait for its stream reads
 * stale bytes and the suite must see it. --hosts K: the ranks are K "hosts" of consecutive ranks
 * to a module that tells hosts apart as shm does (SHARDLOAD_TEST_SHM_HOST_TAG: hier's leaders
 * and its steps between hosts), each host's first rank rooting one item of a scatterv group
 * more. Exits 77 (skipped) when the module cannot run here with B (its probe, or the backend's,
 * says why). --xfail CASE@W (e.g. hung@4): a defect of the module known and reported, not yet
 * fixed: that job must fail (exit 1 on some rank, no hang); once it passes the suite fails,
 * saying to drop the flag.
 *
 * Ranks check with CHECK (print, exit 1): cmocka's asserts belong to the parent. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conformance.h"
#include "testutil.h"

static conf_module M, B;
static const sl_collective_ops *O;
static int worlds[8], nworlds;
static bool expect_async;
static int hosts = 1; /* --hosts */
/* --xfail CASE@WORLD: a known defect of the module (named in the registration, with the lead's
 * note): that job must fail on some rank; once it passes, the suite says to drop the flag. */
static const char *xfail[8];
static int nxfail;

#define MAX_WORLD 8
#define CHECK(cond, ...)                                                                             \
  do {                                                                                               \
    if (!(cond)) {                                                                                   \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", g_rank, __FILE__, __LINE__, #cond);     \
      fprintf(stderr, __VA_ARGS__);                                                                  \
      fprintf(stderr, " [last message: %s]\n", conf_msg());                                          \
      fflush(stderr);                                                                                \
      _exit(1);                                                                                      \
    }                                                                                                \
  } while (0)

static int g_rank = -1;

/* ---- one rank's world -------------------------------------------------------------------------- */
typedef struct env {
  const sl_backend_ops *bo;
  void *be;
  const sl_collective_ops *ctl_ops; /* the control plane: gloo, or local for one rank */
  void *ctl;
  sl_control_plane cp;
  void *comm;
  void *s1, *s2;
  int rank, world;
  bool sync;   /* SL_COLL_SYNC: complete on return, streams ignored */
  bool device; /* buffers in the backend's device memory */
} env;

typedef struct job {
  const char *base; /* the case: "broadcast", "hung", ... */
  const char *name;
  int timeout_ms;
  int victim;
  int (*body)(env *e, const struct job *j);
  char *url;
} job;

static sl_status cp_broadcast(void *ctx, void *buf, size_t bytes, int root) {
  env *e = ctx;
  return e->ctl_ops->broadcast(e->ctl, buf, bytes, root, NULL);
}
static sl_status cp_allgather(void *ctx, const void *sendbuf, void *recvbuf, size_t bytes) {
  env *e = ctx;
  return e->ctl_ops->allgather(e->ctl, sendbuf, recvbuf, bytes, NULL);
}

static void open_env(env *e, int rank, int world, const job *j) {
  memset(e, 0, sizeof *e);
  g_rank = e->rank = rank;
  e->world = world;
  e->bo = B.ops;
  sl_status st = conf_backend_init(&B, rank, world, j->timeout_ms, &e->be);
  CHECK(st == SL_OK, "backend %s init: %s", B.spec, sl_status_name(st));
  static sl_context bare; /* the registry writes only its message buffer */
  void *dl, *shim;
  st = sl__collective_select(&bare, world > 1 ? "gloo" : "local", &e->ctl_ops, &dl, &shim);
  CHECK(st == SL_OK, "the control plane's module");
  sl_collective_init ci = {.size = sizeof ci, .host = &conf_host, .rank = rank, .world_size = world,
                           .rendezvous = j->url, .prefix = "conf/", .timeout_ms = j->timeout_ms, .job_key = "",
                           .device = -1, .local_rank = rank, .local_world_size = world, .ops = e->ctl_ops};
  st = e->ctl_ops->init(&ci, &e->ctl);
  CHECK(st == SL_OK, "control plane init: %s", sl_status_name(st));
  e->cp = (sl_control_plane){sizeof e->cp, e, cp_broadcast, cp_allgather};
  e->sync = O->flags & SL_COLL_SYNC;
  e->device = !(O->domains & (SL_MEM_HOST | SL_MEM_PINNED));
  CHECK(e->bo->stream_create(e->be, &e->s1) == SL_OK && e->bo->stream_create(e->be, &e->s2) == SL_OK, "streams");
  if (strcmp(M.name, e->ctl_ops->name) == 0 && !M.v1) {
    /* the control plane's own module: the core moves data through that communicator */
    e->comm = e->ctl;
    return;
  }
  /* the module as the core starts a data collective (planes.c): the rank's backend and device,
   * a key prefix of its own, the control plane to bootstrap through */
  ci.prefix = "conf/data/";
  ci.backend = e->bo;
  ci.backend_handle = e->be;
  ci.device = SL_HAS_OP(e->bo, device_ordinal) ? e->bo->device_ordinal(e->be) : 0;
  ci.control = &e->cp;
  ci.ops = O;
  st = O->init(&ci, &e->comm);
  CHECK(st == SL_OK, "%s init: %s", M.name, sl_status_name(st));
}

static void close_env(env *e) {
  (void)e->bo->synchronize(e->be);
  e->bo->stream_destroy(e->be, e->s1);
  e->bo->stream_destroy(e->be, e->s2);
  if (e->comm != e->ctl) O->fini(e->comm);
  e->ctl_ops->fini(e->ctl);
  e->bo->fini(e->be);
}

static int rank_main(int rank, int world, void *arg) {
  const job *j = arg;
  const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL); /* not cmocka's */
  alarm(240); /* never outlive the parent long */
  if (hosts > 1) { /* rank r on host r * K / world, as shm and hier tell hosts apart */
    char tag[32];
    snprintf(tag, sizeof tag, "h%d", rank * hosts / world); /* short: it goes into the boot id's room */
    setenv("SHARDLOAD_TEST_SHM_HOST_TAG", tag, 1);
  }
  env e;
  open_env(&e, rank, world, j);
  int rc = j->body(&e, j);
  close_env(&e);
  /* module.h, Threads: fail() only on the thread of a call made to the module */
  const char *last;
  CHECK(conf_foreign_fails(&last) == 0, "a module called fail() from a thread of its own: %s", last);
  return rc;
}

/* Runs J on WORLD ranks; every rank must exit 0, but the victim (VICTIM_CODE when >= 0). */
static void spawn(job *j, int world, int victim_code) {
  j->url = sl_test_rendezvous(j->name);
  assert_non_null(j->url);
  int codes[MAX_WORLD];
  int hung = sl_test_spawn(world, rank_main, j, 180000, codes);
  free(j->url);
  j->url = NULL;
  assert_int_equal(hung, 0);
  char key[96];
  snprintf(key, sizeof key, "%s@%d", j->base, world);
  bool known = false, failed = false;
  for (int i = 0; i < nxfail; i++) known = known || strcmp(xfail[i], key) == 0;
  for (int r = 0; r < world; r++) {
    int want = victim_code >= 0 && r == j->victim ? victim_code : 0;
    if (codes[r] == want) continue;
    if (!known || codes[r] != 1) fail_msg("%s, world %d: rank %d exited %d, expected %d", j->name, world, r, codes[r], want);
    failed = true;
  }
  if (known && !failed) fail_msg("%s passes now: drop --xfail %s from its registration", key, key);
  if (known) printf("# KNOWN DEFECT (--xfail %s): failed as expected\n", key);
}

/* Runs BODY on every world size of --worlds of at least MIN_WORLD. */
static void each_world(const char *name, int (*body)(env *, const job *), int min_world, int timeout_ms) {
  int ran = 0;
  for (int w = 0; w < nworlds; w++) {
    if (worlds[w] < min_world) continue;
    char sub[96];
    snprintf(sub, sizeof sub, "%s_w%d", name, worlds[w]);
    job j = {.base = name, .name = sub, .timeout_ms = timeout_ms, .body = body, .victim = -1};
    spawn(&j, worlds[w], -1);
    ran++;
  }
  if (!ran) skip();
}

/* ---- buffers where the module moves them ---------------------------------------------------------- */
static void *buf_new(env *e, size_t n) {
  void *p = NULL;
  if (e->device) CHECK(e->bo->alloc_device(e->be, n + 1, &p) == SL_OK, "alloc_device %zu", n + 1);
  else p = malloc(n + 1);
  CHECK(p, "out of memory");
  return p;
}

static void buf_free(env *e, void *p) {
  if (!p) return;
  if (e->device) e->bo->free_device(e->be, p);
  else free(p);
}

/* Host bytes into a buffer, ordered before what is queued on S after it. */
static void buf_put(env *e, void *buf, const void *h, size_t n, void *s) {
  if (!n) return;
  if (e->device) CHECK(e->bo->copy_async(e->be, buf, h, n, SL_COPY_H2D, s) == SL_OK, "h2d");
  else memcpy(buf, h, n);
}

/* A buffer's bytes, once what S holds has run. */
static void buf_get(env *e, void *h, const void *buf, size_t n, void *s) {
  if (e->device) CHECK(e->bo->copy_async(e->be, h, buf, n, SL_COPY_D2H, s) == SL_OK, "d2h");
  CHECK(e->bo->stream_sync(e->be, s) == SL_OK, "stream_sync: %s", conf_msg());
  if (!e->device) memcpy(h, buf, n);
}

/* A buffer of N bytes (and a guard byte 0x5A after them) holding SEED's bytes, or 0xA5 when
 * !FILLED. */
static void *buf_pattern(env *e, size_t n, bool filled, uint64_t seed, size_t start, void *s) {
  unsigned char *h = malloc(n + 1);
  CHECK(h, "out of memory");
  if (filled) conf_fill(h, n, seed, start);
  else memset(h, 0xA5, n);
  h[n] = 0x5A;
  void *b = buf_new(e, n);
  buf_put(e, b, h, n + 1, s);
  if (e->device) CHECK(e->bo->stream_sync(e->be, s) == SL_OK, "upload: %s", conf_msg()); /* H is freed next */
  free(h);
  return b;
}

/* Checks that BUF holds SEED's bytes from START and its guard byte is untouched. */
static void buf_check(env *e, const void *buf, size_t n, uint64_t seed, size_t start, void *s, const char *what) {
  unsigned char *h = malloc(n + 1);
  CHECK(h, "out of memory");
  buf_get(e, h, buf, n + 1, s);
  long at = conf_differs(h, n, seed, start);
  CHECK(at < 0, "%s: byte %ld of %zu differs", what, at, n);
  CHECK(h[n] == 0x5A, "%s wrote past its %zu bytes", what, n);
  free(h);
}

/* The outcome of an op: a synchronous module's return, or a stream-ordered one's enqueue and
 * then its stream's sync. */
static sl_status finished(env *e, sl_status st, void *s) {
  if (st != SL_OK || e->sync) return st;
  return e->bo->stream_sync(e->be, s);
}

/* ---- the table ---------------------------------------------------------------------------------- */
static void test_table(void **state) {
  assert_int_equal(O->abi_version, SL_COLLECTIVE_ABI_VERSION);
  assert_true(O->size >= offsetof(sl_collective_ops, barrier) + sizeof O->barrier);
  assert_string_equal(O->name, M.name);
  assert_int_equal(O->flags & ~(uint32_t)SL_COLL_SYNC, 0); /* no flag module.h does not define */
  assert_int_equal(O->domains & ~(uint32_t)(SL_MEM_HOST | SL_MEM_PINNED | SL_MEM_DEVICE), 0);
  assert_true(O->domains != 0);
  if (O->domains & SL_MEM_DEVICE) assert_non_null(O->device_backend);
  char reason[256];
  memset(reason, 'x', sizeof reason);
  int score = O->probe(sl_backend_native_api(B.ops), reason, sizeof reason);
  assert_true(score > 0); /* main skipped otherwise */
  printf("# %s: %s, domains %#x%s%s; optional ops:%s%s%s; ranks run backend %s, on %d host%s\n", M.spec,
         O->flags & SL_COLL_SYNC ? "synchronous" : "stream-ordered", O->domains,
         O->device_backend ? ", device memory of " : "", O->device_backend ? O->device_backend : "",
         SL_HAS_OP(O, split) ? " split" : " !split", SL_HAS_OP(O, abort) ? " abort" : " !abort",
         SL_HAS_OP(O, scatterv_group) ? " scatterv_group" : " !scatterv_group", B.spec, hosts, hosts > 1 ? "s" : "");
}

/* ---- data movement ---------------------------------------------------------------------------------- */
static int broadcast_body(env *e, const job *j) {
  void *s = e->s1; /* a synchronous module ignores it */
  const size_t sizes[] = {13, 0, (1u << 20) + 5};
  for (int root = 0; root < e->world; root++)
    for (size_t k = 0; k < 3; k++) {
      if (k == 2 && root != e->world - 1) continue; /* the large one once, from the last rank */
      size_t n = sizes[k];
      uint64_t seed = 100 + (uint64_t)root * 10 + k;
      void *b = buf_pattern(e, n, e->rank == root, seed, 0, s);
      sl_status st = finished(e, O->broadcast(e->comm, b, n, root, s), s);
      CHECK(st == SL_OK, "broadcast of %zu bytes from %d: %s", n, root, sl_status_name(st));
      buf_check(e, b, n, seed, 0, s, "broadcast");
      buf_free(e, b);
    }
  return 0;
}
static void test_broadcast(void **state) { each_world("broadcast", broadcast_body, 1, 30000); }

/* Rank r's share: uneven, with empty ones (rank 1, and the last of more than two), one past a
 * megabyte. */
static size_t share(int r, int world) {
  if (r == 1 || (world > 2 && r == world - 1)) return 0;
  if (r == 0) return (1u << 20) + 3;
  return (size_t)r * 1000 + 7;
}

static int scatterv_body(env *e, const job *j) {
  void *s = e->s1;
  int roots[3] = {0, e->world - 1, e->world > 1 ? 1 : 0}; /* root 1's own share is empty */
  for (int k = 0; k < 3; k++) {
    int root = roots[k];
    size_t counts[MAX_WORLD], displs[MAX_WORLD], total = 0;
    for (int r = 0; r < e->world; r++) {
      counts[r] = share(r, e->world);
      displs[r] = total + 16; /* gaps: displacements are honoured */
      total += counts[r] + 16;
    }
    uint64_t seed = 200 + (uint64_t)k;
    void *send = e->rank == root ? buf_pattern(e, total, true, seed, 0, s) : NULL;
    size_t mine = counts[e->rank];
    void *recv = buf_pattern(e, mine, false, 0, 0, s);
    /* non-root ranks read only their own size: they pass no send arguments at all */
    sl_status st = O->scatterv(e->comm, send, e->rank == root ? counts : NULL, e->rank == root ? displs : NULL, recv,
                               mine, root, s);
    /* counts and displs are the caller's again once the call returned, even if it only enqueued */
    memset(counts, 0xFF, sizeof counts);
    memset(displs, 0xFF, sizeof displs);
    st = finished(e, st, s);
    CHECK(st == SL_OK, "scatterv from %d: %s", root, sl_status_name(st));
    size_t off = 0;
    for (int r = 0; r < e->rank; r++) off += share(r, e->world) + 16;
    unsigned char *h = malloc(mine + 1);
    CHECK(h, "out of memory");
    buf_get(e, h, recv, mine + 1, s);
    long at = conf_differs(h, mine, seed, off + 16);
    CHECK(at < 0, "scatterv from %d: the share of %zu bytes differs at byte %ld", root, mine, at);
    CHECK(h[mine] == 0x5A, "scatterv wrote past the share");
    free(h);
    buf_free(e, recv);
    buf_free(e, send);
  }
  return 0;
}
static void test_scatterv(void **state) { each_world("scatterv", scatterv_body, 1, 30000); }

/* ---- scatterv groups (optional) ------------------------------------------------------------------ */
/* A group as every rank plans it alike: item i's root and what it sends rank r, where in the
 * root's send buffer (parts in rank order for even items, reversed for odd ones, 16 bytes
 * apart). Receivers check their bytes against the plan; only an item's root hands its tables
 * to the module. */
typedef struct group_plan {
  int n;
  int roots[SL_SCATTER_GROUP_MAX];
  size_t counts[SL_SCATTER_GROUP_MAX][MAX_WORLD], displs[SL_SCATTER_GROUP_MAX][MAX_WORLD];
  size_t total[SL_SCATTER_GROUP_MAX]; /* each root's send buffer */
} group_plan;

#define GROUP_PLANS 5

/* What item I of group G sends rank R: uneven; the root's own part empty in odd groups; nothing
 * to a rank where (R + I + G) % 3 == 1 (so that a rank receives nothing from one root and
 * something from another item); one part past a megabyte in group 2. */
static size_t group_share(int g, int i, int r, int root, int world) {
  if (r == root) return g % 2 ? 0 : 700 + 13 * (size_t)i + (size_t)g;
  if ((r + i + g) % 3 == 1) return 0;
  if (g == 2 && i == 0 && r == (root + 1) % world) return (1u << 20) + 11;
  return (size_t)((r * 7 + i * 3 + g) % 5) * 1000 + 1 + (size_t)r + (size_t)i;
}

/* Whether rank R is its host's first (--hosts: rank r on host r * K / world). */
static bool host_first(int r, int world) { return r == 0 || (r - 1) * hosts / world != r * hosts / world; }

/* The groups of a world: one item from the last rank; two, the last rank's before rank 0's;
 * every rank (at most SL_SCATTER_GROUP_MAX) from the middle one down, round to the top; three
 * (or fewer), the even ranks up and then the odd ones down, so that some rank roots nothing;
 * each host's first rank (--hosts; rank 0 on one host), the last host's first: the loader's
 * distributed readers, one per host, which hier moves between the hosts at once. */
static void group_plans(int world, group_plan *p) {
  memset(p, 0, GROUP_PLANS * sizeof *p);
  int max = world < SL_SCATTER_GROUP_MAX ? world : SL_SCATTER_GROUP_MAX;
  p[0].n = 1, p[0].roots[0] = world - 1;
  p[1].n = world < 2 ? 1 : 2, p[1].roots[0] = world - 1, p[1].roots[1] = 0;
  p[2].n = max;
  for (int i = 0; i < max; i++) p[2].roots[i] = (world / 2 - i + world) % world;
  p[3].n = max < 3 ? max : 3;
  int evens = (world + 1) / 2, top_odd = world % 2 ? world - 2 : world - 1;
  for (int i = 0; i < p[3].n; i++) p[3].roots[i] = i < evens ? 2 * i : top_odd - 2 * (i - evens);
  for (int r = world - 1; r >= 0; r--)
    if (host_first(r, world) && p[4].n < SL_SCATTER_GROUP_MAX) p[4].roots[p[4].n++] = r;
  for (int g = 0; g < GROUP_PLANS; g++)
    for (int i = 0; i < p[g].n; i++) {
      size_t at = 0;
      for (int k = 0; k < world; k++) {
        int r = i % 2 ? world - 1 - k : k;
        p[g].counts[i][r] = group_share(g, i, r, p[g].roots[i], world);
        p[g].displs[i][r] = at + 16;
        at += p[g].counts[i][r] + 16;
      }
      p[g].total[i] = at;
    }
}

/* Each rank takes part in every group (sendbuf, counts and displs on the item's root only),
 * then checks every item's bytes and the guard byte after each receive buffer, and each root
 * that its send buffer is as it was. The root's receive buffer is its own, apart from its send
 * buffer. */
static int scatterv_group_body(env *e, const job *j) {
  void *s = e->s1;
  int me = e->rank, world = e->world;
  group_plan plan[GROUP_PLANS];
  group_plans(world, plan);
  /* the plans hold what the case claims to cover, at this world */
  bool own_empty = false, own_full = false, one_empty = world < 2;
  for (int g = 0; g < GROUP_PLANS; g++)
    for (int i = 0; i < plan[g].n; i++) {
      int root = plan[g].roots[i];
      own_empty |= plan[g].counts[i][root] == 0, own_full |= plan[g].counts[i][root] > 0;
      for (int r = 0; r < world; r++)
        for (int k = 0; k < plan[g].n; k++)
          one_empty |= r != root && plan[g].counts[i][r] == 0 && plan[g].counts[k][r] > 0;
    }
  CHECK(own_empty && own_full && one_empty, "the plans miss a case: own part empty %d, full %d, one root's empty %d",
        own_empty, own_full, one_empty);
  for (int g = 0; g < GROUP_PLANS; g++) {
    const group_plan *p = &plan[g];
    if (me == 0) {
      char roots[64] = "";
      for (int i = 0, at = 0; i < p->n; i++) at += snprintf(roots + at, sizeof roots - (size_t)at, " %d", p->roots[i]);
      printf("# scatterv group %d, world %d: %d items from ranks%s\n", g, world, p->n, roots);
      fflush(stdout);
    }
    sl_scatter_item items[SL_SCATTER_GROUP_MAX];
    size_t counts[SL_SCATTER_GROUP_MAX][MAX_WORLD], displs[SL_SCATTER_GROUP_MAX][MAX_WORLD];
    void *send[SL_SCATTER_GROUP_MAX] = {0}, *recv[SL_SCATTER_GROUP_MAX] = {0};
    memcpy(counts, p->counts, sizeof counts);
    memcpy(displs, p->displs, sizeof displs);
    for (int i = 0; i < p->n; i++) {
      bool root = p->roots[i] == me;
      uint64_t seed = 1000 + (uint64_t)g * 16 + (uint64_t)i;
      if (root) send[i] = buf_pattern(e, p->total[i], true, seed, 0, s);
      recv[i] = buf_pattern(e, p->counts[i][me], false, 0, 0, s);
      items[i] = (sl_scatter_item){.size = sizeof items[i], .sendbuf = send[i], .counts = root ? counts[i] : NULL,
                                   .displs = root ? displs[i] : NULL, .recvbuf = recv[i],
                                   .recvbytes = p->counts[i][me], .root = p->roots[i]};
    }
    sl_status st = O->scatterv_group(e->comm, items, p->n, s);
    /* the items and their tables are the caller's again once the call returned, even if it only
     * enqueued */
    memset(items, 0xFF, sizeof items);
    memset(counts, 0xFF, sizeof counts);
    memset(displs, 0xFF, sizeof displs);
    st = finished(e, st, s);
    CHECK(st == SL_OK, "scatterv group %d (%d items): %s", g, p->n, sl_status_name(st));
    for (int i = 0; i < p->n; i++) {
      uint64_t seed = 1000 + (uint64_t)g * 16 + (uint64_t)i;
      char what[96];
      snprintf(what, sizeof what, "scatterv group %d: item %d (from rank %d)", g, i, p->roots[i]);
      buf_check(e, recv[i], p->counts[i][me], seed, p->displs[i][me], s, what);
      if (send[i]) {
        snprintf(what, sizeof what, "scatterv group %d: item %d's send buffer", g, i);
        buf_check(e, send[i], p->total[i], seed, 0, s, what);
      }
      buf_free(e, recv[i]);
      buf_free(e, send[i]);
    }
  }
  return 0;
}
static void test_scatterv_group(void **state) {
  if (!SL_HAS_OP(O, scatterv_group)) skip();
  each_world("scatterv_group", scatterv_group_body, 1, 30000);
}

/* A group refused for its arguments: SL_ERR_INVALID on the calling rank, at once. Each kind is
 * a job of its own (a module may break its communicator on a failed op, and a later call would
 * then fail for that, whatever its arguments). The kinds every rank can see (the item count,
 * a root out of range, two items of one root) are called by every rank alike, refused before
 * any communication; a root's own count that is not its receive size only the root can see:
 * it calls alone, its only item its own. */
enum {
  BAD_NONE,
  BAD_TOO_MANY,
  BAD_ROOT_HIGH,
  BAD_ROOT_NEGATIVE,
  BAD_SAME_ROOT,
  BAD_OWN_COUNT,
  BAD_ITEM_SIZE,
  BAD_KINDS
};
static const char *const bad_names[BAD_KINDS] = {"no items",
                                                 "too many items",
                                                 "a root past the world",
                                                 "a negative root",
                                                 "two items of one root",
                                                 "the root's own count is not its receive size",
                                                 "items too short for their members (SL_ERR_ABI)"};
static int g_bad;

static int group_invalid_body(env *e, const job *j) {
  void *s = e->s1;
  int me = e->rank, world = e->world, n = 1;
  size_t counts[MAX_WORLD] = {0}, displs[MAX_WORLD] = {0};
  void *send = buf_pattern(e, 64, true, 1100, 0, s), *recv = buf_pattern(e, 64, false, 0, 0, s);
  sl_scatter_item items[SL_SCATTER_GROUP_MAX + 1];
  /* valid items but for the one argument under test: whichever rank roots an item has its
   * tables, every count is zero */
  for (int i = 0; i <= SL_SCATTER_GROUP_MAX; i++)
    items[i] =
        (sl_scatter_item){.size = sizeof items[i], .sendbuf = send, .counts = counts, .displs = displs, .recvbuf = recv,
                          .root = i % world};
  /* every rank past its start before any leaves: a rank that left straight after init could
   * fail a peer's init still under way (a barrier is what every case's ranks meet in) */
  CHECK(O->barrier(e->comm) == SL_OK, "the barrier before: %s", conf_msg());
  switch (g_bad) {
  case BAD_NONE: n = 0; break;
  case BAD_TOO_MANY: n = SL_SCATTER_GROUP_MAX + 1; break;
  case BAD_ROOT_HIGH: items[0].root = world; break;
  case BAD_ROOT_NEGATIVE: n = world < 2 ? 1 : 2, items[n - 1].root = -1; break;
  case BAD_SAME_ROOT: n = 2, items[1].root = items[0].root; break;
  case BAD_OWN_COUNT:
    if (me != world - 1) goto out; /* the others take no part */
    counts[me] = 8, items[0].root = me, items[0].recvbytes = 7;
    break;
  case BAD_ITEM_SIZE: /* a caller built against a module.h whose items end before ROOT */
    for (int i = 0; i <= SL_SCATTER_GROUP_MAX; i++) items[i].size = offsetof(sl_scatter_item, root);
    break;
  }
  conf_msg_clear();
  double t0 = conf_now_ms();
  sl_status st = finished(e, O->scatterv_group(e->comm, items, n, s), s);
  double took = conf_now_ms() - t0;
  CHECK(st == (g_bad == BAD_ITEM_SIZE ? SL_ERR_ABI : SL_ERR_INVALID), "scatterv group with %s: %s", bad_names[g_bad],
        sl_status_name(st));
  CHECK(conf_msg()[0], "scatterv group with %s: refused without a message", bad_names[g_bad]);
  CHECK(took < 2000, "scatterv group with %s: refused after %.0f ms", bad_names[g_bad], took);
  if (me == (g_bad == BAD_OWN_COUNT ? world - 1 : 0))
    printf("# scatterv group with %s, world %d: %s\n", bad_names[g_bad], world, conf_msg());
out:
  (void)e->bo->synchronize(e->be);
  buf_free(e, recv);
  buf_free(e, send);
  return 0;
}
static void test_scatterv_group_invalid(void **state) {
  if (!SL_HAS_OP(O, scatterv_group)) skip();
  for (g_bad = 0; g_bad < BAD_KINDS; g_bad++) {
    char name[48];
    snprintf(name, sizeof name, "group_invalid%d", g_bad);
    each_world(name, group_invalid_body, 1, 30000);
  }
}

static int allgather_body(env *e, const job *j) {
  void *s = e->s1;
  const size_t sizes[] = {5, 0, 5003};
  for (int in_place = 0; in_place < 2; in_place++)
    for (size_t k = 0; k < 3; k++) {
      size_t n = sizes[k], all = n * (size_t)e->world;
      unsigned char *out = buf_pattern(e, all, false, 0, 0, s), *in = NULL;
      uint64_t seed = 300 + (uint64_t)e->rank;
      unsigned char *h = malloc(n + 1);
      CHECK(h, "out of memory");
      conf_fill(h, n, seed, 0);
      if (in_place) {
        in = out + (size_t)e->rank * n;
        buf_put(e, in, h, n, s);
      } else {
        in = buf_new(e, n);
        buf_put(e, in, h, n, s);
      }
      sl_status st = finished(e, O->allgather(e->comm, in, out, n, s), s);
      CHECK(st == SL_OK, "allgather of %zu bytes (in place %d): %s", n, in_place, sl_status_name(st));
      unsigned char *got = malloc(all + 1);
      CHECK(got, "out of memory");
      buf_get(e, got, out, all + 1, s);
      for (int r = 0; r < e->world; r++) {
        long at = conf_differs(got + (size_t)r * n, n, 300 + (uint64_t)r, 0);
        CHECK(at < 0, "allgather of %zu bytes (in place %d): rank %d's part differs at byte %ld", n, in_place, r, at);
      }
      CHECK(got[all] == 0x5A, "allgather wrote past the buffer");
      free(got);
      free(h);
      if (!in_place) buf_free(e, in);
      buf_free(e, out);
    }
  return 0;
}
static void test_allgather(void **state) { each_world("allgather", allgather_body, 1, 30000); }

/* A barrier returns on no rank before every rank entered it. */
static int barrier_body(env *e, const job *j) {
  CHECK(O->barrier(e->comm) == SL_OK, "barrier: %s", conf_msg());
  if (e->rank == 1) usleep(500 * 1000);
  double t0 = conf_now_ms();
  CHECK(O->barrier(e->comm) == SL_OK, "barrier: %s", conf_msg());
  double took = conf_now_ms() - t0;
  if (e->world > 1 && e->rank != 1) CHECK(took >= 400, "the barrier returned after %.0f ms, before rank 1 (500 ms late) entered it", took);
  return 0;
}
static void test_barrier(void **state) { each_world("barrier", barrier_body, 1, 30000); }

/* ---- split ------------------------------------------------------------------------------------- */
/* A broadcast of N bytes from ROOT over C: every member holds ROOT's bytes after it. */
static void check_bcast(env *e, void *c, int me, int root, uint64_t seed, const char *what) {
  size_t n = 1000;
  void *b = buf_pattern(e, n, me == root, seed, 0, e->s1);
  sl_status st = finished(e, O->broadcast(c, b, n, root, e->s1), e->s1);
  CHECK(st == SL_OK, "%s broadcast: %s", what, sl_status_name(st));
  buf_check(e, b, n, seed, 0, e->s1, what);
  buf_free(e, b);
}

/* The member order of C: everyone's job rank, allgathered. */
static void members(env *e, void *c, int size, int32_t *order) {
  int32_t me = e->rank;
  void *in = buf_new(e, sizeof me), *out = buf_new(e, sizeof me * (size_t)size);
  buf_put(e, in, &me, sizeof me, e->s1);
  sl_status st = finished(e, O->allgather(c, in, out, sizeof me, e->s1), e->s1);
  CHECK(st == SL_OK, "allgather in a split group: %s", sl_status_name(st));
  buf_get(e, order, out, sizeof me * (size_t)size, e->s1);
  buf_free(e, in);
  buf_free(e, out);
}

static int split_body(env *e, const job *j) {
  int rank = e->rank, world = e->world;
  void *none = (void *)1, *solo = NULL;
  /* COLOR < 0: takes part, joins nothing */
  CHECK(O->split(e->comm, -1, 0, &none) == SL_OK && none == NULL, "a split with no color: %s", conf_msg());
  /* everyone alone: a group of one */
  CHECK(O->split(e->comm, rank, 0, &solo) == SL_OK && solo, "a group of one: %s", conf_msg());
  check_bcast(e, solo, 0, 0, 400 + (uint64_t)rank, "a group of one");
  CHECK(O->barrier(solo) == SL_OK, "barrier of a group of one");
  if (world >= 2) {
    /* two halves, the keys reversing the ranks: the larger key comes last */
    void *half = NULL;
    int color = rank % 2, size = (world + 1 - color) / 2;
    CHECK(O->split(e->comm, color, -rank, &half) == SL_OK && half, "halves: %s", conf_msg());
    int32_t order[MAX_WORLD];
    members(e, half, size, order);
    for (int i = 0; i < size; i++) {
      int want = world - 1 - ((world - 1 - color) % 2) - 2 * i; /* the largest rank of the color first */
      CHECK(order[i] == want, "half %d: member %d is job rank %d, expected %d", color, i, order[i], want);
    }
    int me = 0;
    while (order[me] != rank) me++;
    check_bcast(e, half, me, size - 1, 500 + (uint64_t)color, "a half");
    /* a sub of a sub: its first member alone, the others in none */
    void *first = (void *)1;
    CHECK(O->split(half, me == 0 ? 7 : -1, 0, &first) == SL_OK, "a split of a split: %s", conf_msg());
    CHECK((me == 0) == (first != NULL), "a split of a split gave %p", first);
    if (first) {
      check_bcast(e, first, 0, 0, 600 + (uint64_t)rank, "a split of a split");
      O->fini(first);
    }
    /* the last rank sits out; the others in job order */
    void *rest = (void *)1;
    CHECK(O->split(e->comm, rank == world - 1 ? -1 : 0, rank, &rest) == SL_OK, "rest: %s", conf_msg());
    CHECK((rank != world - 1) == (rest != NULL), "the rank sitting out got %p", rest);
    if (rest && world > 2) {
      members(e, rest, world - 1, order);
      for (int i = 0; i < world - 1; i++) CHECK(order[i] == i, "rest: member %d is job rank %d", i, order[i]);
    }
    if (rest) O->fini(rest);
    O->fini(half); /* subs before their parent */
  }
  O->fini(solo);
  CHECK(O->barrier(e->comm) == SL_OK, "the parent once its subs are gone: %s", conf_msg());
  check_bcast(e, e->comm, rank, 0, 700, "the parent");
  return 0;
}
static void test_split(void **state) {
  if (!SL_HAS_OP(O, split)) skip();
  each_world("split", split_body, 1, 30000);
}

/* ---- abort ------------------------------------------------------------------------------------- */
static void *g_abort_comm;
static void *abort_later(void *arg) {
  conf_suite_thread(); /* a thread of the application's, as sl_context_abort's caller */
  usleep(300 * 1000);
  O->abort(g_abort_comm);
  return NULL;
}

/* Rank 0 waits in a broadcast whose root (rank 1) never sends, and another thread aborts: the
 * op fails with SL_ERR_COMM well before the timeout (module.h: "pending and later ops fail
 * within the timeout"; a module that ignored the abort would end it at the timeout, with a
 * timeout), and so does every later op. The others, whom rank 0 left, fail within the timeout
 * naming it. One rank: abort, then every op fails. */
static int abort_body(env *e, const job *j) {
  void *s = e->s1;
  size_t n = 4096;
  double bound = j->timeout_ms / 2.0;
  void *b = buf_pattern(e, n, false, 0, 0, s);
  if (e->rank != 0) {
    usleep(1500 * 1000); /* never sends in rank 0's broadcast */
    double t0 = conf_now_ms();
    sl_status st = O->barrier(e->comm);
    double took = conf_now_ms() - t0;
    fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", e->rank, sl_status_name(st), took, conf_msg());
    CHECK(st != SL_OK, "a peer of an aborted rank: its barrier passed");
    CHECK(took < j->timeout_ms + 2500, "a peer of an aborted rank failed after %.0f ms (timeout %d ms)", took,
          j->timeout_ms);
    if (e->world == 2) CHECK(conf_names_rank(conf_msg(), 0), "the message does not name rank 0");
    buf_free(e, b);
    return 0;
  }
  sl_status st;
  if (e->world > 1) {
    g_abort_comm = e->comm;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, abort_later, NULL) == 0, "thread");
    double t0 = conf_now_ms();
    st = O->broadcast(e->comm, b, n, 1, s);
    sl_status done = finished(e, st, s);
    double took = conf_now_ms() - t0;
    pthread_join(t, NULL);
    fprintf(stderr, "rank 0: %s after %.0f ms: %s\n", sl_status_name(done), took, conf_msg());
    /* synchronous: the call itself fails; stream-ordered: its stream's sync does */
    CHECK(e->sync ? done == SL_ERR_COMM : done != SL_OK, "the aborted broadcast: %s", sl_status_name(done));
    CHECK(strcasestr(conf_msg(), "abort"), "the message does not say the communicator was aborted");
    CHECK(took < bound, "the aborted op took %.0f ms (timeout %d ms)", took, j->timeout_ms);
  } else {
    O->abort(e->comm);
  }
  /* later ops fail, saying why */
  double t0 = conf_now_ms();
  conf_msg_clear();
  st = O->barrier(e->comm);
  CHECK(st == SL_ERR_COMM, "a later barrier: %s", sl_status_name(st));
  CHECK(strcasestr(conf_msg(), "abort"), "the message does not say the communicator was aborted");
  st = finished(e, O->broadcast(e->comm, b, n, 0, s), s);
  CHECK(st != SL_OK, "a later broadcast passed");
  st = finished(e, O->allgather(e->comm, b, b, 0, s), s);
  CHECK(st != SL_OK, "a later allgather passed");
  if (SL_HAS_OP(O, split)) {
    void *sub = (void *)1;
    st = O->split(e->comm, 0, 0, &sub);
    CHECK(st != SL_OK && sub == NULL, "a later split: %s, sub %p", sl_status_name(st), sub);
  }
  double took = conf_now_ms() - t0;
  CHECK(took < bound, "later ops took %.0f ms", took);
  (void)e->bo->synchronize(e->be); /* the stream's sticky error is the abort's */
  buf_free(e, b);
  return 0;
}
static void test_abort(void **state) {
  if (!SL_HAS_OP(O, abort)) skip();
  each_world("abort", abort_body, 1, 20000);
}

/* ---- a lost rank ----------------------------------------------------------------------------------- */
/* The victim (the last rank) leaves after a barrier: dies (exit 42) or hangs (43, alive but
 * silent, for longer than the timeout). The others, in a broadcast and then a barrier, fail
 * within the timeout and a margin, naming it; a hung one is a timeout. Later ops fail at once. */
static int lost_body(env *e, const job *j, bool hang) {
  CHECK(O->barrier(e->comm) == SL_OK, "the barrier before: %s", conf_msg());
  if (e->rank == j->victim) {
    usleep(300 * 1000);
    if (!hang) _exit(42);
    usleep((useconds_t)(2 * j->timeout_ms + 1000) * 1000);
    _exit(43);
  }
  void *s = e->s1;
  size_t n = 64u << 10;
  void *b = buf_pattern(e, n, e->rank == 0, 800, 0, s);
  double t0 = conf_now_ms();
  sl_status st = finished(e, O->broadcast(e->comm, b, n, 0, s), s);
  if (st == SL_OK) st = O->barrier(e->comm); /* the data may all have left before the loss */
  double took = conf_now_ms() - t0;
  char first[SL__ERRMSG_LEN];
  snprintf(first, sizeof first, "%s", conf_msg());
  fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", e->rank, sl_status_name(st), took, first);
  CHECK(st == SL_ERR_PEER || st == SL_ERR_TIMEOUT, "status %s", sl_status_name(st));
  /* A dead rank's connections tell who it was. A silent one's tell nothing, and in a world of
   * more than two the first rank to time out closes its connections, so a peer may lose that
   * one first: the contract asks for a rank named, the one lost; the victim is certain only
   * with one peer (and a module with a way to ask, as Gloo's store reports, names it). */
  bool named = false;
  for (int r = 0; r < e->world; r++) named = named || (r != e->rank && conf_names_rank(first, r));
  CHECK(named, "the message names no rank");
  if (!hang || e->world == 2) CHECK(conf_names_rank(first, j->victim), "the message does not name rank %d", j->victim);
  if (hang && e->world == 2) CHECK(st == SL_ERR_TIMEOUT, "a rank alive but silent is reported as %s", sl_status_name(st));
  if (hang && !conf_names_rank(first, j->victim))
    printf("# rank %d: the silent rank %d is not the one named: %s\n", e->rank, j->victim, first);
  CHECK(took < j->timeout_ms + 2500, "failed after %.0f ms with a timeout of %d ms", took, j->timeout_ms);
  t0 = conf_now_ms();
  CHECK(O->barrier(e->comm) != SL_OK, "a later barrier passed");
  CHECK(conf_now_ms() - t0 < 1000, "a later barrier took %.0f ms", conf_now_ms() - t0);
  (void)e->bo->synchronize(e->be);
  buf_free(e, b);
  return 0;
}
static int dead_body(env *e, const job *j) { return lost_body(e, j, false); }
static int hung_body(env *e, const job *j) { return lost_body(e, j, true); }

/* The victim dies after a barrier while the others scatter, each part 64 KiB: in a scatterv from
 * rank 0 (the root loses a rank it sends to, the last; the others, whose parts may all have
 * arrived, then meet in a barrier), or in a scatterv group of two items, rank 0's and then the
 * victim's (the last rank, or with --hosts the last host's first: both roots lead their hosts,
 * as the loader's distributed readers), where every other rank waits on the victim's bytes
 * (and rank 0 sends to it too). Every other rank fails within the timeout and a margin naming
 * it, and later ops fail at once. */
static int dead_scatter_body(env *e, const job *j, bool group) {
  CHECK(O->barrier(e->comm) == SL_OK, "the barrier before: %s", conf_msg());
  if (e->rank == j->victim) {
    usleep(300 * 1000);
    _exit(42);
  }
  void *s = e->s1;
  size_t n = 64u << 10, counts[MAX_WORLD], displs[MAX_WORLD];
  for (int r = 0; r < e->world; r++) counts[r] = n, displs[r] = (size_t)r * n;
  bool root = e->rank == 0;
  void *send = root ? buf_pattern(e, n * (size_t)e->world, true, 810, 0, s) : NULL;
  void *from0 = buf_pattern(e, n, false, 0, 0, s), *from_victim = buf_pattern(e, n, false, 0, 0, s);
  sl_scatter_item items[2] = {
      {.size = sizeof(sl_scatter_item), .sendbuf = send, .counts = root ? counts : NULL,
       .displs = root ? displs : NULL, .recvbuf = from0, .recvbytes = n, .root = 0},
      {.size = sizeof(sl_scatter_item), .recvbuf = from_victim, .recvbytes = n, .root = j->victim},
  };
  double t0 = conf_now_ms();
  sl_status st;
  if (group) {
    st = finished(e, O->scatterv_group(e->comm, items, 2, s), s);
  } else {
    st = finished(e, O->scatterv(e->comm, send, root ? counts : NULL, root ? displs : NULL, from0, n, 0, s), s);
    if (st == SL_OK) st = O->barrier(e->comm);
  }
  double took = conf_now_ms() - t0;
  char first[SL__ERRMSG_LEN];
  snprintf(first, sizeof first, "%s", conf_msg());
  fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", e->rank, sl_status_name(st), took, first);
  CHECK(st == SL_ERR_PEER || st == SL_ERR_TIMEOUT, "status %s", sl_status_name(st));
  CHECK(conf_names_rank(first, j->victim), "the message does not name rank %d", j->victim);
  CHECK(took < j->timeout_ms + 2500, "failed after %.0f ms with a timeout of %d ms", took, j->timeout_ms);
  t0 = conf_now_ms();
  CHECK(O->barrier(e->comm) != SL_OK, "a later barrier passed");
  CHECK(conf_now_ms() - t0 < 1000, "a later barrier took %.0f ms", conf_now_ms() - t0);
  (void)e->bo->synchronize(e->be);
  buf_free(e, from_victim);
  buf_free(e, from0);
  buf_free(e, send);
  return 0;
}
static int dead_scatterv_body(env *e, const job *j) { return dead_scatter_body(e, j, false); }
static int dead_group_body(env *e, const job *j) { return dead_scatter_body(e, j, true); }

/* Runs BODY with a victim that exits CODE: the last rank, or with LEADER and --hosts, the last
 * host's first rank (a rank that leads its host, for a module that tells hosts apart). */
static void lost(const char *name, int (*body)(env *, const job *), int code, bool leader) {
  int ran = 0;
  for (int w = 0; w < nworlds; w++) {
    if (worlds[w] < 2) continue;
    char sub[96];
    snprintf(sub, sizeof sub, "%s_w%d", name, worlds[w]);
    int victim = worlds[w] - 1;
    while (leader && hosts > 1 && !host_first(victim, worlds[w])) victim--;
    job j = {.base = name, .name = sub, .timeout_ms = 3000, .body = body, .victim = victim};
    spawn(&j, worlds[w], code);
    ran++;
  }
  if (!ran) skip();
}
static void test_lost_rank_dead(void **state) { lost("dead", dead_body, 42, false); }
static void test_lost_rank_hung(void **state) { lost("hung", hung_body, 43, false); }
static void test_lost_rank_dead_scatterv(void **state) { lost("dead_scatterv", dead_scatterv_body, 42, false); }
static void test_lost_rank_dead_group(void **state) {
  if (!SL_HAS_OP(O, scatterv_group)) skip();
  lost("dead_group", dead_group_body, 42, true);
}

/* ---- stream order (stream-ordered modules) ------------------------------------------------------- */
/* Rank 0 uploads NEW bytes over OLD ones on stream 1, behind held work, records an event, and
 * scatters to rank 1 on stream 2. With stream 2 waiting for the event, rank 1 receives NEW;
 * without the wait the scatter ran first and sent OLD (on an asynchronous backend): the suite
 * tells the two apart, so a module that did not order its op on its stream would be seen. */
static int order_body(env *e, const job *j, bool wait) {
  size_t n = 65536;
  if (e->rank != 0) {
    size_t mine = e->rank == 1 ? n : 0;
    void *recv = buf_pattern(e, mine, false, 0, 0, e->s2);
    sl_status st = finished(e, O->scatterv(e->comm, NULL, NULL, NULL, recv, mine, 0, e->s2), e->s2);
    CHECK(st == SL_OK, "scatterv: %s", sl_status_name(st));
    if (e->rank == 1) {
      unsigned char *got = malloc(n);
      CHECK(got, "out of memory");
      buf_get(e, got, recv, n, e->s2);
      long fresh = conf_differs(got, n, 2, 0), stale = conf_differs(got, n, 1, 0);
      fprintf(stderr, "rank 1 (%s the event): %s\n", wait ? "waiting for" : "not waiting for",
              fresh < 0 ? "new bytes" : stale < 0 ? "old bytes" : "torn bytes");
      if (wait) CHECK(fresh < 0, "with the wait: the bytes differ from the upload at %ld", fresh);
      else if (expect_async) CHECK(fresh >= 0, "without the wait the new bytes arrived anyway: the suite cannot tell");
      free(got);
    }
    buf_free(e, recv);
    return 0;
  }
  size_t counts[MAX_WORLD] = {0}, displs[MAX_WORLD] = {0};
  counts[1] = n;
  void *send = buf_pattern(e, n, true, 1, 0, e->s1);
  CHECK(e->bo->stream_sync(e->be, e->s1) == SL_OK, "sync");
  unsigned char *fresh = malloc(n);
  CHECK(fresh, "out of memory");
  conf_fill(fresh, n, 2, 0);
  conf_blocker k;
  char why[512];
  void *held_ev = NULL, *ev = NULL;
  CHECK(conf_blocker_init(&k, e->bo, e->be, why, sizeof why) == SL_OK, "%s", why);
  CHECK(e->bo->event_create(e->be, &held_ev) == SL_OK && e->bo->event_create(e->be, &ev) == SL_OK, "events");
  CHECK(conf_block(&k, e->s1, held_ev) == SL_OK, "block");
  buf_put(e, send, fresh, n, e->s1);
  CHECK(e->bo->event_record(e->be, ev, e->s1) == SL_OK, "record");
  if (wait) CHECK(e->bo->stream_wait_event(e->be, e->s2, ev) == SL_OK, "wait");
  void *own_buf = buf_new(e, 0);
  sl_status st = finished(e, O->scatterv(e->comm, send, counts, displs, own_buf, 0, 0, e->s2), e->s2);
  CHECK(st == SL_OK, "scatterv: %s", sl_status_name(st));
  CHECK(e->bo->synchronize(e->be) == SL_OK, "synchronize: %s", conf_msg());
  e->bo->event_destroy(e->be, ev);
  e->bo->event_destroy(e->be, held_ev);
  conf_blocker_fini(&k);
  buf_free(e, own_buf);
  buf_free(e, send);
  free(fresh);
  return 0;
}
static int order_wait_body(env *e, const job *j) { return order_body(e, j, true); }
static int order_nowait_body(env *e, const job *j) { return order_body(e, j, false); }

static void test_stream_order(void **state) {
  if (O->flags & SL_COLL_SYNC) skip();
  each_world("order_wait", order_wait_body, 2, 30000);
  each_world("order_nowait", order_nowait_body, 2, 30000);
}

/* Two streams, one communicator: ops pair across ranks in the order they were issued, whatever
 * the streams' timing (here: two broadcasts, one per stream, twenty times). */
static int two_streams_body(env *e, const job *j) {
  size_t n = 4099;
  for (int round = 0; round < 20; round++) {
    uint64_t sa = 900 + 2 * (uint64_t)round, sb = sa + 1;
    void *a = buf_pattern(e, n, e->rank == 0, sa, 0, e->s1), *b = buf_pattern(e, n, e->rank == 0, sb, 0, e->s1);
    CHECK(e->bo->stream_sync(e->be, e->s1) == SL_OK, "upload");
    CHECK(O->broadcast(e->comm, a, n, 0, e->s1) == SL_OK, "broadcast a: %s", conf_msg());
    CHECK(O->broadcast(e->comm, b, n, 0, e->s2) == SL_OK, "broadcast b: %s", conf_msg());
    CHECK(e->bo->synchronize(e->be) == SL_OK, "synchronize: %s", conf_msg());
    buf_check(e, a, n, sa, 0, e->s1, "the broadcast on stream 1");
    buf_check(e, b, n, sb, 0, e->s1, "the broadcast on stream 2");
    buf_free(e, a);
    buf_free(e, b);
  }
  return 0;
}
static void test_issue_order_across_streams(void **state) {
  if (O->flags & SL_COLL_SYNC) skip();
  each_world("two_streams", two_streams_body, 2, 30000);
}

/* ---- main -------------------------------------------------------------------------------------- */
static bool parse_worlds(const char *s) {
  nworlds = 0;
  for (const char *p = s; *p && nworlds < 8;) {
    char *end;
    long w = strtol(p, &end, 10);
    if (end == p || w < 1 || w > MAX_WORLD) return false;
    worlds[nworlds++] = (int)w;
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return false;
  }
  return nworlds > 0;
}

int main(int argc, char **argv) {
  const char *spec = NULL, *backend = "cpu";
  bool v1 = false, usage = false;
  conf_suite_thread();
  worlds[0] = 1, worlds[1] = 2, nworlds = 2;
  for (int i = 1; i < argc && !usage; i++) {
    if (strcmp(argv[i], "--async") == 0) expect_async = true;
    else if (strcmp(argv[i], "--v1") == 0) v1 = true;
    else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) backend = argv[++i];
    else if (strcmp(argv[i], "--worlds") == 0 && i + 1 < argc) usage = !parse_worlds(argv[++i]);
    else if (strcmp(argv[i], "--hosts") == 0 && i + 1 < argc)
      usage = (hosts = atoi(argv[++i])) < 1 || hosts > MAX_WORLD;
    else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc) cmocka_set_test_filter(argv[++i]);
    else if (strcmp(argv[i], "--xfail") == 0 && i + 1 < argc && nxfail < 8) xfail[nxfail++] = argv[++i];
    else if (argv[i][0] != '-' && !spec) spec = argv[i];
    else usage = true;
  }
  if (!spec || usage) {
    fprintf(stderr, "usage: %s [--backend B] [--worlds 1,2,4] [--hosts K] [--async] [--v1] [--filter GLOB] NAME | "
                    "DIR/libshardload-NAME.so\n", argv[0]);
    return 2;
  }
  char why[1024];
  sl_status st = conf_module_open(backend, false, false, &B, why, sizeof why);
  if (st == SL_OK) st = conf_module_open(spec, true, v1, &M, why, sizeof why);
  if (st == SL_ERR_NO_DEVICE) {
    printf("SKIPPED: %s on %s cannot run here: %s\n", spec, backend, why);
    return 77;
  }
  if (st != SL_OK) {
    fprintf(stderr, "%s on %s: %s: %s\n", spec, backend, sl_status_name(st), why);
    return 1;
  }
  O = M.ops;
  /* the module's probe with the rank's backend, and the core's route for the pair */
  char reason[512];
  const char *pairs_by = sl_backend_native_api(B.ops); /* what the core passes the probe (module.h) */
  if (sl__collective_probe(M.name, B.ops, reason, sizeof reason) <= 0 || O->probe(pairs_by, reason, sizeof reason) <= 0) {
    printf("SKIPPED: %s cannot run with backend %s here: %s\n", spec, B.spec, reason);
    return 77;
  }
  void *be = NULL;
  st = conf_backend_init(&B, 0, 1, 10000, &be);
  if (st == SL_ERR_NO_DEVICE) {
    printf("SKIPPED: backend %s: %s\n", B.spec, conf_msg());
    return 77;
  }
  if (st != SL_OK) {
    fprintf(stderr, "backend %s: init: %s: %s\n", B.spec, sl_status_name(st), conf_msg());
    return 1;
  }
  ((const sl_backend_ops *)B.ops)->fini(be);
  signal(SIGPIPE, SIG_DFL); /* as a careless host application would leave it */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table),
      cmocka_unit_test(test_broadcast),
      cmocka_unit_test(test_scatterv),
      cmocka_unit_test(test_scatterv_group),
      cmocka_unit_test(test_scatterv_group_invalid),
      cmocka_unit_test(test_allgather),
      cmocka_unit_test(test_barrier),
      cmocka_unit_test(test_split),
      cmocka_unit_test(test_abort),
      cmocka_unit_test(test_lost_rank_dead),
      cmocka_unit_test(test_lost_rank_hung),
      cmocka_unit_test(test_lost_rank_dead_scatterv),
      cmocka_unit_test(test_lost_rank_dead_group),
      cmocka_unit_test(test_stream_order),
      cmocka_unit_test(test_issue_order_across_streams),
  };
  char group[200];
  snprintf(group, sizeof group, "%s on %s", M.spec, B.spec);
  int rc = cmocka_run_group_tests_name(group, tests, NULL, NULL);
  conf_module_close(&M);
  conf_module_close(&B);
  return rc;
}
