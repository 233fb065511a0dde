/* simccl, the sim backend's device-memory collective, driven through its ops table by real
 * processes over loopback: each rank builds its own sim backend, a Gloo control plane, and
 * simccl over it; data lives in sim device memory, filled by asynchronous H2D copies and read
 * back by D2H after a sync.
 *
 * What every collective owes the contract (broadcast, scatterv, allgather, barrier, split, abort,
 * a lost rank named, ops ordered on their streams: a scatterv that does not wait for the copy
 * filling its send buffer sends stale bytes) is tested by the collective conformance suite
 * (tests/conformance/collective_suite.c), run on simccl over sim (worlds 1 and 2) and sim:strict
 * (world 4). Here is what is simccl's own: a tcp:// rendezvous whose store admits each rank once
 * (simccl meets its peers through the control plane), a rank killed mid-transfer becoming the
 * stream's sticky error naming it, host memory refused at the call.
 *
 * Ranks are forked children (sl_test_spawn); they check with CHECK (print, _exit(1)). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

#include "gloo_testlib.h"

/* ---- one rank's world ------------------------------------------------------------------------ */

typedef struct env {
  const sl_backend_ops *be_ops;
  void *be;
  const sl_collective_ops *gloo; /* the control plane */
  void *ctl;
  sl_control_plane cp;
  const sl_collective_ops *ops; /* simccl */
  void *comm;
  void *s1, *s2; /* two streams */
  int rank, world;
} env;

static sl_status cp_broadcast(void *ctx, void *buf, size_t bytes, int root) {
  env *e = ctx;
  return e->gloo->broadcast(e->ctl, buf, bytes, root, NULL);
}
static sl_status cp_allgather(void *ctx, const void *sendbuf, void *recvbuf, size_t bytes) {
  env *e = ctx;
  return e->gloo->allgather(e->ctl, sendbuf, recvbuf, bytes, NULL);
}

typedef struct scenario {
  const char *url;
  int timeout_ms;
  bool strict;
  const char *delay_us; /* SHARDLOAD_SIM_DELAY_US of every rank, or NULL */
  int victim;
  bool tcp; /* a tcp:// rendezvous (rank 0 serves the store) instead of file:// */
  bool twin; /* the sim under another name, its host functions and host access counted (twin_ops) */
  int (*body)(env *e, const struct scenario *s);
} scenario;

/* The sim's table under another name, as a vendor's backend of native API "sim" would be, with
 * the two ways simccl reaches it for its work counted: the table's launch_host_fn and the
 * SL_EXT_HOST_ACCESS its get_proc gives. simccl must pair with it and use them, knowing nothing
 * of the sim but its table. */
static sl_backend_ops twin_table;
static int twin_host_fns, twin_accesses;
static sl_status twin_launch(void *be, void *stream, sl_status (*fn)(void *, char *, size_t), void *arg) {
  __atomic_add_fetch(&twin_host_fns, 1, __ATOMIC_RELAXED);
  return sl__backend_sim()->launch_host_fn(be, stream, fn, arg);
}
static sl_status twin_access(void *be, const void *ptr, size_t bytes, int open) {
  __atomic_add_fetch(&twin_accesses, 1, __ATOMIC_RELAXED);
  return ((sl_ext_host_access_fn)sl__backend_sim()->get_proc(SL_EXT_HOST_ACCESS))(be, ptr, bytes, open);
}
static void *twin_get_proc(const char *name) {
  return strcmp(name, SL_EXT_HOST_ACCESS) == 0 ? (void *)(sl_ext_host_access_fn)twin_access
                                                : sl__backend_sim()->get_proc(name);
}
static const sl_backend_ops *twin_ops(void) {
  twin_table = *sl__backend_sim();
  twin_table.name = "twin";
  twin_table.launch_host_fn = twin_launch;
  twin_table.get_proc = twin_get_proc;
  return &twin_table;
}

static void setup(env *e, int rank, int world, const scenario *s) {
  memset(e, 0, sizeof *e);
  g_rank = e->rank = rank;
  e->world = world;
  if (s->delay_us) setenv("SHARDLOAD_SIM_DELAY_US", s->delay_us, 1);
  e->be_ops = s->twin ? twin_ops() : sl__backend_sim();
  sl_backend_init bi = {.size = sizeof bi, .host = &g_host, .local_rank = rank, .local_world_size = world,
                        .device = -1, .variant = s->strict ? "strict" : NULL};
  CHECK(e->be_ops->init(&bi, &e->be) == SL_OK, "sim init");
  if (world > 1) {
    e->gloo = gloo_ops();
    CHECK(e->gloo, "gloo");
    sl_collective_init gi = {.size = sizeof gi, .host = &g_host, .rank = rank, .world_size = world,
                             .rendezvous = s->url, .prefix = "test/", .timeout_ms = s->timeout_ms};
    CHECK(e->gloo->init(&gi, &e->ctl) == SL_OK, "control plane init");
  }
  e->cp = (sl_control_plane){sizeof e->cp, e, cp_broadcast, cp_allgather};
  e->ops = sl__collective_simccl();
  sl_collective_init ci = {.size = sizeof ci, .host = &g_host, .rank = rank, .world_size = world,
                           .rendezvous = s->url, .prefix = "test/", .timeout_ms = s->timeout_ms,
                           .backend = e->be_ops, .backend_handle = e->be, .device = 0, .local_rank = rank,
                           .local_world_size = world, .control = world > 1 ? &e->cp : NULL};
  CHECK(e->ops->init(&ci, &e->comm) == SL_OK, "simccl init");
  CHECK(e->be_ops->stream_create(e->be, &e->s1) == SL_OK && e->be_ops->stream_create(e->be, &e->s2) == SL_OK,
        "streams");
}

static void teardown(env *e) {
  e->be_ops->stream_destroy(e->be, e->s1);
  e->be_ops->stream_destroy(e->be, e->s2);
  e->ops->fini(e->comm);
  if (e->ctl) e->gloo->fini(e->ctl);
  e->be_ops->fini(e->be);
}

static int rank_main(int rank, int world, void *arg) {
  const scenario *s = arg;
  alarm(120); /* never outlive the parent long */
  env e;
  setup(&e, rank, world, s);
  int rc = s->body(&e, s);
  teardown(&e);
  return rc;
}

/* Runs WORLD ranks of S; EXPECT (NULL: all 0) gives each rank's exit code. */
static void spawn(int world, scenario *s, const char *name, const int *expect) {
  NEED_GLOO();
  char *url = NULL;
  if (s->tcp) assert_true(asprintf(&url, "tcp://127.0.0.1:%d", sl_test_free_port()) > 0);
  else url = sl_test_rendezvous(name);
  assert_non_null(url);
  s->url = url;
  int codes[8];
  int hung = sl_test_spawn(world, rank_main, s, 90000, codes);
  free(url);
  assert_int_equal(hung, 0);
  for (int r = 0; r < world; r++) {
    int want = expect ? expect[r] : 0;
    if (codes[r] != want) fail_msg("rank %d exited %d, expected %d", r, codes[r], want);
  }
}

/* ---- device memory helpers ------------------------------------------------------------------- */

static uint8_t pat(uint64_t seed, size_t i) { return (uint8_t)((i * 2654435761u + seed * 97u) >> 7); }
static void fill(uint8_t *p, size_t n, uint64_t seed, size_t start) {
  for (size_t i = 0; i < n; i++) p[i] = pat(seed, start + i);
}
static long differs(const uint8_t *p, size_t n, uint64_t seed, size_t start) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != pat(seed, start + i)) return (long)i;
  return -1;
}

static void *dev_alloc(env *e, size_t n) {
  void *p = NULL;
  CHECK(e->be_ops->alloc_device(e->be, n ? n : 1, &p) == SL_OK, "alloc_device %zu", n);
  return p;
}
/* Device buffer of N bytes holding pattern SEED (from START), uploaded on STREAM (not synced). */
static void *dev_filled(env *e, size_t n, uint64_t seed, size_t start, void *stream, uint8_t **host) {
  void *d = dev_alloc(e, n);
  *host = malloc(n ? n : 1);
  CHECK(*host, "malloc");
  fill(*host, n, seed, start);
  if (n) CHECK(e->be_ops->copy_async(e->be, d, *host, n, SL_COPY_H2D, stream) == SL_OK, "h2d");
  return d;
}
/* Copies N device bytes back on STREAM and syncs it. */
static uint8_t *dev_read(env *e, const void *d, size_t n, void *stream) {
  uint8_t *h = malloc(n ? n : 1);
  CHECK(h, "malloc");
  if (n) CHECK(e->be_ops->copy_async(e->be, h, d, n, SL_COPY_D2H, stream) == SL_OK, "d2h");
  CHECK(e->be_ops->stream_sync(e->be, stream) == SL_OK, "stream sync: %s", g_msg);
  return h;
}

/* ---- data movement ----------------------------------------------------------------------------- */

static size_t share(int r, int world) { return r == 1 ? 0 : (size_t)(r + 1) * 4099 + (r == world - 1 ? 65536 : 0); }

static int data_body(env *e, const scenario *s) {
  int rank = e->rank, world = e->world;
  const sl_collective_ops *ops = e->ops;
  /* broadcast from every root */
  for (int root = 0; root < world; root++) {
    size_t n = 100003;
    uint8_t *h;
    void *d = rank == root ? dev_filled(e, n, 7 + (uint64_t)root, 0, e->s1, &h) : dev_alloc(e, n);
    if (rank != root) h = NULL;
    CHECK(ops->broadcast(e->comm, d, n, root, e->s1) == SL_OK, "broadcast from %d: %s", root, g_msg);
    uint8_t *got = dev_read(e, d, n, e->s1);
    long at = differs(got, n, 7 + (uint64_t)root, 0);
    CHECK(at < 0, "broadcast from %d differs at %ld", root, at);
    free(got);
    free(h);
    e->be_ops->free_device(e->be, d);
  }
  /* scatterv, uneven with an empty rank, from root 0 and from the last rank */
  int roots[2] = {0, world - 1};
  for (int k = 0; k < (world > 1 ? 2 : 1); k++) {
    int root = roots[k];
    size_t counts[8], displs[8], total = 0;
    for (int r = 0; r < world; r++) {
      counts[r] = share(r, world);
      displs[r] = total + 3; /* gaps: displacements are honoured */
      total += counts[r] + 3;
    }
    uint8_t *h = NULL;
    void *send = rank == root ? dev_filled(e, total, 50 + (uint64_t)root, 0, e->s1, &h) : NULL;
    size_t mine = counts[rank];
    void *recv = dev_alloc(e, mine);
    const size_t *c = rank == root ? counts : NULL, *dp = rank == root ? displs : NULL;
    sl_status st = ops->scatterv(e->comm, send, c, dp, mine ? recv : NULL, mine, root, e->s1);
    CHECK(st == SL_OK, "scatterv from %d: %s", root, g_msg);
    uint8_t *got = dev_read(e, recv, mine, e->s1);
    long at = differs(got, mine, 50 + (uint64_t)root, displs[rank]);
    CHECK(at < 0, "scatterv from %d: share of %zu bytes differs at %ld", root, mine, at);
    free(got);
    free(h);
    if (send) e->be_ops->free_device(e->be, send);
    e->be_ops->free_device(e->be, recv);
  }
  /* allgather, out of place and in place */
  for (int in_place = 0; in_place < 2; in_place++) {
    size_t n = 5003;
    void *out = dev_alloc(e, n * (size_t)world);
    uint8_t *h;
    void *in = in_place ? (uint8_t *)out + (size_t)rank * n : dev_alloc(e, n);
    h = malloc(n);
    fill(h, n, 1000 + (uint64_t)rank, 0);
    CHECK(e->be_ops->copy_async(e->be, in, h, n, SL_COPY_H2D, e->s1) == SL_OK, "h2d");
    CHECK(ops->allgather(e->comm, in, out, n, e->s1) == SL_OK, "allgather: %s", g_msg);
    uint8_t *got = dev_read(e, out, n * (size_t)world, e->s1);
    for (int r = 0; r < world; r++) {
      long at = differs(got + (size_t)r * n, n, 1000 + (uint64_t)r, 0);
      CHECK(at < 0, "allgather (in place %d): rank %d's part differs at %ld", in_place, r, at);
    }
    free(got);
    free(h);
    if (!in_place) e->be_ops->free_device(e->be, in);
    e->be_ops->free_device(e->be, out);
  }
  CHECK(ops->barrier(e->comm) == SL_OK, "barrier: %s", g_msg);
  return 0;
}

/* tcp://: the control plane's store admits each rank once, so simccl's own communicator must
 * meet its peers through the control plane, not through a second store client */
static void test_world2(void **state) {
  scenario s = {.timeout_ms = 20000, .tcp = true, .body = data_body};
  spawn(2, &s, "simccl2", NULL);
}
/* simccl pairs with any backend of native API "sim" and moves its data only through the
 * backend's table: a renamed sim whose host functions and host access are counted serves (in
 * strict mode, so a task that skipped the table's host access would crash). */
static int twin_body(env *e, const scenario *s) {
  int rc = data_body(e, s);
  CHECK(twin_host_fns > 0, "rank %d: simccl queued no work through the table's launch_host_fn", e->rank);
  CHECK(twin_accesses > 0, "rank %d: simccl opened no buffer through the table's " SL_EXT_HOST_ACCESS, e->rank);
  fprintf(stderr, "rank %d: %d host functions, %d host accesses through the table\n", e->rank, twin_host_fns,
          twin_accesses);
  return rc;
}
static void test_world2_any_backend_of_native_api_sim(void **state) {
  scenario s = {.timeout_ms = 20000, .strict = true, .twin = true, .body = twin_body};
  spawn(2, &s, "simccl2twin", NULL);
}
/* ---- failures ---------------------------------------------------------------------------------- */

/* The victim is killed (SIGKILL) while its 64 MiB share is on its way: the root's stream sync
 * fails within the timeout, naming it. */
static int killed_body(env *e, const scenario *s) {
  size_t n = (size_t)64 << 20, counts[2] = {0, n}, displs[2] = {0, 0};
  uint8_t *h = NULL, own;
  void *send = e->rank == 0 ? dev_filled(e, n, 3, 0, e->s1, &h) : dev_alloc(e, n);
  CHECK(e->be_ops->stream_sync(e->be, e->s1) == SL_OK, "upload");
  CHECK(e->gloo->barrier(e->ctl) == SL_OK, "start together");
  if (e->rank == s->victim) {
    CHECK(e->ops->scatterv(e->comm, NULL, NULL, NULL, send, n, 0, e->s1) == SL_OK, "scatterv");
    usleep(20 * 1000); /* while its share is on its way */
    kill(getpid(), SIGKILL);
  }
  double t0 = now_ms();
  sl_status st = e->ops->scatterv(e->comm, send, counts, displs, &own, 0, 0, e->s1);
  if (st == SL_OK) st = e->be_ops->stream_sync(e->be, e->s1);
  if (st == SL_OK) st = e->ops->barrier(e->comm); /* the bytes may all have left before the death */
  double took = now_ms() - t0;
  fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", e->rank, sl_status_name(st), took, g_msg);
  CHECK(st != SL_OK, "the lost rank went unnoticed");
  CHECK(sl_test_names_rank(g_msg, s->victim), "message does not name rank %d", s->victim);
  CHECK(took < s->timeout_ms + 2500, "took %.0f ms with a timeout of %d ms", took, s->timeout_ms);
  /* sticky: the next sync says it again */
  CHECK(e->be_ops->stream_sync(e->be, e->s1) != SL_OK, "the error is not sticky");
  free(h);
  e->be_ops->free_device(e->be, send);
  return 0;
}

static void test_rank_killed(void **state) {
  scenario s = {.timeout_ms = 3000, .victim = 1, .body = killed_body};
  int expect[2] = {0, 128 + SIGKILL};
  spawn(2, &s, "killed", expect);
}

/* ---- in one process: the table, the checks made at the call ---------------------------------- */

static void test_table_and_probe(void **state) {
  const sl_collective_ops *ops = sl__collective_simccl();
  assert_string_equal(ops->name, "simccl");
  assert_int_equal(ops->flags & SL_COLL_SYNC, 0);
  assert_int_equal(ops->domains, SL_MEM_DEVICE);
  assert_string_equal(ops->device_backend, "sim");
  char why[256] = "";
  assert_true(ops->probe("sim", why, sizeof why) > 0);
  assert_true(ops->probe("sim:strict", why, sizeof why) > 0);
  assert_int_equal(ops->probe("cpu", why, sizeof why), 0);
  assert_string_equal(why, "simccl: moves sim device memory only; this rank's backend is cpu");
  assert_int_equal(ops->probe("simulator", why, sizeof why), 0);
}

static void test_refusals(void **state) {
  const sl_collective_ops *ops = sl__collective_simccl();
  const sl_backend_ops *cpu = sl__backend_cpu(), *sim = sl__backend_sim();
  sl_backend_init bi = {.size = sizeof bi, .host = &g_host, .device = -1};
  void *be = NULL, *cbe = NULL, *comm = (void *)1;
  assert_int_equal(sim->init(&bi, &be), SL_OK);
  assert_int_equal(cpu->init(&bi, &cbe), SL_OK);
  sl_collective_init ci = {.size = sizeof ci, .host = &g_host, .rank = 0, .world_size = 1, .timeout_ms = 1000,
                           .backend = cpu, .backend_handle = cbe};
  assert_int_equal(ops->init(&ci, &comm), SL_ERR_INVALID); /* not a sim */
  assert_null(comm);
  assert_non_null(strstr(g_msg, "needs this rank's backend, of native API sim"));
  assert_non_null(strstr(g_msg, "it has cpu"));
  /* called sim, but of another native API; of native API sim, but without what simccl needs */
  static sl_backend_ops other, lacking;
  other = *sim;
  other.native_api = "cuda";
  ci.backend = &other;
  ci.backend_handle = be;
  assert_int_equal(ops->init(&ci, &comm), SL_ERR_INVALID);
  assert_non_null(strstr(g_msg, "it has sim, native API cuda"));
  lacking = *sim;
  lacking.name = "oldsim";
  lacking.size = (uint32_t)offsetof(sl_backend_ops, launch_host_fn); /* built before the op */
  ci.backend = &lacking;
  assert_int_equal(ops->init(&ci, &comm), SL_ERR_UNSUPPORTED);
  assert_non_null(strstr(g_msg, "simccl init on rank 0: backend oldsim offers no launch_host_fn"));
  assert_null(comm);
  ci.backend = cpu;
  ci.backend_handle = cbe;
  ci.backend = sim;
  ci.backend_handle = be;
  ci.world_size = 2;
  assert_int_equal(ops->init(&ci, &comm), SL_ERR_INVALID); /* no control plane */
  assert_non_null(strstr(g_msg, "control plane"));
  ci.world_size = 1;
  ci.size = offsetof(sl_collective_init, backend); /* a caller of an older ABI */
  assert_int_equal(ops->init(&ci, &comm), SL_ERR_ABI);
  ci.size = sizeof ci;
  assert_int_equal(ops->init(&ci, &comm), SL_OK);

  /* host and pinned memory are refused at the call, naming the op and the pointer */
  unsigned char host[64];
  void *pinned = NULL, *dev = NULL;
  assert_int_equal(sim->alloc_pinned(be, 64, &pinned), SL_OK);
  assert_int_equal(sim->alloc_device(be, 64, &dev), SL_OK);
  assert_int_equal(ops->broadcast(comm, host, sizeof host, 0, NULL), SL_ERR_INVALID);
  char want[64];
  snprintf(want, sizeof want, "%p", (void *)host);
  assert_non_null(strstr(g_msg, "simccl broadcast"));
  assert_non_null(strstr(g_msg, want));
  assert_non_null(strstr(g_msg, "not sim device memory"));
  size_t counts[1] = {64}, displs[1] = {0};
  assert_int_equal(ops->scatterv(comm, pinned, counts, displs, dev, 64, 0, NULL), SL_ERR_INVALID);
  assert_non_null(strstr(g_msg, "send buffer"));
  assert_int_equal(ops->allgather(comm, dev, host, 64, NULL), SL_ERR_INVALID);
  assert_non_null(strstr(g_msg, "receive buffer"));
  assert_int_equal(ops->broadcast(comm, dev, 64, 1, NULL), SL_ERR_INVALID);
  assert_non_null(strstr(g_msg, "root 1"));
  /* world 1 split and abort */
  void *sub = (void *)1;
  assert_int_equal(ops->split(comm, -1, 0, &sub), SL_OK);
  assert_null(sub);
  assert_int_equal(ops->split(comm, 0, 0, &sub), SL_OK);
  assert_non_null(sub);
  assert_int_equal(ops->allgather(sub, dev, dev, 64, NULL), SL_OK);
  ops->fini(sub);
  ops->abort(comm);
  assert_int_equal(ops->broadcast(comm, dev, 64, 0, NULL), SL_ERR_COMM);
  assert_non_null(strstr(g_msg, "aborted (sl_context_abort)"));
  ops->fini(comm);
  sim->free_device(be, dev);
  sim->free_pinned(be, pinned);
  sim->fini(be);
  cpu->fini(cbe);
}

int main(void) {
  /* the Gloo devices listen on loopback only (a file:// rendezvous would pick the host's name) */
  setenv("SHARDLOAD_GLOO_IFACE_ADDR", "127.0.0.1", 1);
  if (getenv("SL_TEST_FILTER")) cmocka_set_test_filter(getenv("SL_TEST_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table_and_probe),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_world2),
      cmocka_unit_test(test_world2_any_backend_of_native_api_sim),
      cmocka_unit_test(test_rank_killed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
