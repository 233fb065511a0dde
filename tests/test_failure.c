/* Failures across real ranks over Gloo: every rank must end with a clear error, quickly, and
 * no process may hang. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#include "internal.h"

static char *dir;
static char *good;    /* a 16 MiB checkpoint: long enough to die in the middle of */
static char *corrupt; /* valid length prefix, broken JSON */

static int setup(void **state) {
  dir = sl_test_dir("failure");
  good = sl_test_path(dir, "good.safetensors");
  corrupt = sl_test_path(dir, "corrupt.safetensors");
  sl_test_tensor ts[] = {
      {"a.weight", "F32", 2, {2048, 1024}, NULL},
      {"b.weight", "F32", 2, {2048, 1024}, NULL},
  };
  if (sl_test_write_st(good, ts, 2, NULL)) return -1;
  return sl_test_write_raw(corrupt, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]", 4);
}

static int teardown(void **state) {
  free(good);
  free(corrupt);
  free(dir);
  return 0;
}

#define CANARY_STOP 0xA7 /* the stopped-peer test's fill of shard buffers, before data arrives */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct fjob {
  char *rdzv;
  const char *path;
  int timeout_ms;
  int die_rank;       /* rank that _exits during phase 2, or -1 */
  int differ_rank;    /* rank whose plan asks another dtype, or -1 */
  sl_status want;     /* expected status on every surviving rank */
  const char *want_in_msg; /* substring each surviving rank's message must hold (rank 0's for deaths) */
  double max_seconds; /* each surviving rank must be done within this */
  const char *collective; /* the data plane (NULL: auto) */
  sl_dtype param;         /* parameter dtype (INVALID: the file's) */
} fjob;

static void *die_soon(void *arg) {
  usleep(150 * 1000);
  _exit(7);
  return NULL;
}

typedef struct bind_probe {
  int rank, die;
  int calls;
} bind_probe;

static void *bind_cb(void *user, const sl_tensor *t) {
  bind_probe *b = user;
  if (b->calls++ == 0 && b->rank == b->die) {
    pthread_t th;
    pthread_create(&th, NULL, die_soon, NULL);
  }
  return NULL;
}

static int rank_main(int rank, int world, void *arg) {
  fjob *j = arg;
  double t0 = now_s();
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .world_size = world, .rank = rank,
                           .rendezvous = j->rdzv, .timeout_ms = j->timeout_ms};
  sl_context *ctx = NULL;
  sl_status s = sl_context_create(&co, &ctx);
  SL_CHILD_CHECK(s == SL_OK, "rank %d: context %s", rank, sl_status_name(s));
  sl_source *src = NULL;
  s = sl_source_open(ctx, j->path, &src);
  if (s == SL_OK) {
    sl_plan *plan = NULL;
    sl_plan_create(ctx, &plan);
    if (rank == j->differ_rank) sl_plan_set_param_dtype(plan, SL_DTYPE_BF16);
    bind_probe bp = {rank, j->die_rank, 0};
    sl_load_options lo = {.size = sizeof lo, .staging_bytes = 4096, .bind = bind_cb, .bind_user = &bp};
    sl_state *st = NULL;
    s = sl_load(ctx, plan, src, &lo, &st);
    if (j->differ_rank >= 0) SL_CHILD_CHECK(bp.calls == 0, "rank %d: bind called %d times before agreement", rank, bp.calls);
    sl_state_destroy(st);
    sl_plan_destroy(plan);
    sl_source_destroy(src);
  }
  double dt = now_s() - t0;
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "rank %d: %s: %s (%.2f s)\n", rank, sl_status_name(s), msg, dt);
  SL_CHILD_CHECK(dt < j->max_seconds, "rank %d took %.1f s", rank, dt);
  if (j->die_rank >= 0) {
    SL_CHILD_CHECK(s == SL_ERR_PEER || s == SL_ERR_TIMEOUT || s == SL_ERR_COMM, "rank %d: %s", rank, sl_status_name(s));
    if (rank == 0) SL_CHILD_CHECK(strstr(msg, j->want_in_msg) != NULL, "rank 0 message '%s' lacks '%s'", msg, j->want_in_msg);
    else SL_CHILD_CHECK(strstr(msg, "rank ") != NULL, "rank %d message '%s' names no rank", rank, msg);
  } else {
    SL_CHILD_CHECK(s == j->want, "rank %d: got %s, want %s", rank, sl_status_name(s), sl_status_name(j->want));
    SL_CHILD_CHECK(strstr(msg, j->want_in_msg) != NULL, "rank %d message '%s' lacks '%s'", rank, msg, j->want_in_msg);
  }
  sl_context_destroy(ctx);
  return 0;
}

static void run(fjob *j, int world, const char *sub) {
  j->rdzv = sl_test_rendezvous(sub);
  int codes[8];
  int killed = sl_test_spawn(world, rank_main, j, (int)(j->max_seconds * 1000) + 20000, codes);
  free(j->rdzv);
  assert_int_equal(killed, 0); /* nothing hung */
  for (int r = 0; r < world; r++) {
    if (r == j->die_rank) assert_int_equal(codes[r], 7);
    else assert_int_equal(codes[r], 0);
  }
}

static void test_rank0_cannot_open(void **state) {
  char *missing = sl_test_path(dir, "nope.safetensors");
  fjob j = {.path = missing, .timeout_ms = 60000, .die_rank = -1, .differ_rank = -1, .want = SL_ERR_NOT_FOUND,
            .want_in_msg = "nope.safetensors", .max_seconds = 10};
  run(&j, 3, "fail-open");
  free(missing);
}

static void test_rank0_cannot_parse(void **state) {
  fjob j = {.path = corrupt, .timeout_ms = 60000, .die_rank = -1, .differ_rank = -1, .want = SL_ERR_FORMAT,
            .want_in_msg = "corrupt.safetensors", .max_seconds = 10};
  run(&j, 3, "fail-parse");
}

static void test_plans_differ(void **state) {
  fjob j = {.path = good, .timeout_ms = 60000, .die_rank = -1, .differ_rank = 1, .want = SL_ERR_MISMATCH,
            .want_in_msg = "rank 1", .max_seconds = 10};
  run(&j, 3, "fail-differ");
}

static void test_rank_dies_mid_load(void **state) {
  fjob j = {.path = good, .timeout_ms = 3000, .die_rank = 2, .differ_rank = -1, .want_in_msg = "rank 2",
            .max_seconds = 3 + 5};
  run(&j, 3, "fail-die");
}

/* A peer that stops (SIGSTOP: its sockets stay open, so nobody sees it leave) in the middle of
 * the data phase. The others learn of it on the data plane within the timeout — at an event on
 * the device route (simccl, stream-ordered, as NCCL), at the call on the host route (Gloo) —
 * and must end within about one timeout of the stop, not wait a second one in a control-plane
 * agreement for the rank they already lost (< 1.6x: a second timeout makes it >= 2x). Every
 * survivor fails with a status that matches its message and names a rank; the victim's
 * neighbour (the rank that sends to it) names the victim. The victim is killed 3 timeouts
 * after it stopped, well after the survivors should have ended, so that one waiting a second
 * timeout still finds it stopped. */
#define STOP_MAX_WORLD 4

typedef struct stop_shared {
  double stopped_at;           /* CLOCK_MONOTONIC seconds when the victim stopped; 0 until then */
  int named[STOP_MAX_WORLD];   /* survivors whose message names the victim */
} stop_shared;

typedef struct stop_job {
  char *rdzv;
  const char *path;
  const char *collective; /* NULL: auto (simccl on sim) */
  int timeout_ms;
  int victim;
  int namer;           /* the survivor that talks to the victim directly: it must name it */
  int replicas;        /* > 1: HSDP, mesh [replicas, world / replicas] */
  bool kill;           /* the victim dies (SIGKILL) instead of stopping */
  stop_shared *shared; /* MAP_SHARED: written by the ranks, read by the parent */
} stop_job;

typedef struct stop_watch {
  const stop_job *j;
  volatile unsigned char *first; /* the start of the victim's first shard, which arrives first */
  size_t n;
} stop_watch;

/* The victim's watcher: once bytes of its first shard have arrived (the data phase is under
 * way, more transfers follow), it stops the whole process; a helper kills it later. */
static void *stop_when_data_arrives(void *arg) {
  stop_watch *w = arg;
  for (bool arrived = false; !arrived; usleep(500))
    for (size_t i = 0; i < w->n && !arrived; i++) arrived = w->first[i] != CANARY_STOP;
  pid_t me = getpid();
  if (w->j->kill) kill(me, SIGKILL);
  if (fork() == 0) {
    usleep((useconds_t)(3 * w->j->timeout_ms) * 1000);
    kill(me, SIGKILL);
    _exit(0);
  }
  w->j->shared->stopped_at = now_s();
  kill(me, SIGSTOP);
  return NULL;
}

typedef struct stop_binder {
  stop_watch watch; /* .j set on the victim only */
  sl_context *ctx;
  pthread_t thread;
  bool started;
  void *bufs[4];
  int n;
} stop_binder;

static void *stop_bind(void *user, const sl_tensor *t) {
  stop_binder *b = user;
  if (b->n >= 4) return NULL;
  unsigned char *p = malloc((size_t)t->nbytes);
  if (!p) return NULL;
  memset(p, CANARY_STOP, (size_t)t->nbytes);
  b->bufs[b->n++] = p;
  if (b->watch.j && !b->started) {
    b->watch.first = p;
    b->watch.n = t->nbytes < 64 ? (size_t)t->nbytes : 64;
    b->started = pthread_create(&b->thread, NULL, stop_when_data_arrives, &b->watch) == 0;
  }
  return p;
}

/* Whether MSG's status S is the one its words tell (a timeout reads "timed out", a lost peer
 * "lost ... connection closed"). */
static bool status_matches(sl_status s, const char *msg) {
  if (s == SL_ERR_TIMEOUT) return strstr(msg, "timed out") || strstr(msg, "stopped responding");
  if (s == SL_ERR_PEER) return strstr(msg, "lost rank") && !strstr(msg, "timed out");
  return false;
}

static int stopped_peer_main(int rank, int world, void *arg) {
  stop_job *j = arg;
  sl_context_options co = {.size = sizeof co, .backend = "sim", .world_size = world, .rank = rank,
                           .local_rank = rank, .rendezvous = j->rdzv, .timeout_ms = j->timeout_ms,
                           .collective = j->collective};
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "rank %d: context", rank);
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, j->path, &src) == SL_OK, "rank %d: source", rank);
  sl_plan *plan = NULL;
  sl_plan_create(ctx, &plan);
  if (j->replicas > 1) {
    int mesh[2] = {j->replicas, world / j->replicas};
    SL_CHILD_CHECK(sl_plan_set_mesh(plan, 2, mesh) == SL_OK, "rank %d: mesh", rank);
  }
  stop_binder b = {.watch = {.j = rank == j->victim ? j : NULL}};
  sl_load_options lo = {.size = sizeof lo, .staging_bytes = 1 << 16, .cpu_offload = SL_CPU_OFFLOAD_ON,
                        .bind = stop_bind, .bind_user = &b};
  sl_state *st = NULL;
  sl_status s = sl_load(ctx, plan, src, &lo, &st);
  double end = now_s(), stopped = j->shared->stopped_at;
  const char *msg = sl_context_errmsg(ctx);
  double after = stopped > 0 ? end - stopped : -1, limit = 1.6 * j->timeout_ms / 1000.0;
  fprintf(stderr, "rank %d (%s%s): %s %.2f s after the stop (timeout %.1f s): %s\n", rank,
          j->collective ? j->collective : "auto", j->replicas > 1 ? ", hsdp" : "", sl_status_name(s), after,
          j->timeout_ms / 1000.0, msg);
  SL_CHILD_CHECK(rank != j->victim, "the victim returned from sl_load");
  SL_CHILD_CHECK(s != SL_OK && st == NULL, "rank %d: the load succeeded without rank %d", rank, j->victim);
  SL_CHILD_CHECK(stopped > 0, "rank %d: failed before rank %d stopped: %s", rank, j->victim, msg);
  SL_CHILD_CHECK(s == SL_ERR_PEER || s == SL_ERR_TIMEOUT, "rank %d: got %s", rank, sl_status_name(s));
  SL_CHILD_CHECK(status_matches(s, msg), "rank %d: status %s does not match its message '%s'", rank,
                 sl_status_name(s), msg);
  SL_CHILD_CHECK(after < limit, "rank %d ended %.2f s after the stop, want < %.2f s (1.6x the timeout)", rank, after,
                 limit);
  SL_CHILD_CHECK(strstr(msg, "rank ") != NULL, "rank %d: message '%s' names no rank", rank, msg);
  j->shared->named[rank] = sl_test_names_rank(msg, j->victim);
  for (int i = 0; i < b.n; i++) free(b.bufs[i]);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

/* TCP: a tcp:// rendezvous (rank 0's process serves the store), else file://. */
static void run_stopped_peer(const char *collective, int world, int replicas, int victim, int namer, bool tcp) {
  assert_true(world <= STOP_MAX_WORLD);
  stop_shared *shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(shared != MAP_FAILED);
  memset(shared, 0, sizeof *shared);
  stop_job j = {.path = good, .collective = collective, .timeout_ms = 3000, .victim = victim, .namer = namer,
                .replicas = replicas, .shared = shared};
  if (tcp) assert_true(asprintf(&j.rdzv, "tcp://127.0.0.1:%d", sl_test_free_port()) > 0);
  else j.rdzv = sl_test_rendezvous("fail-stopped-peer");
  int codes[STOP_MAX_WORLD];
  int killed = sl_test_spawn(world, stopped_peer_main, &j, 60000, codes);
  free(j.rdzv);
  int named = shared->named[namer];
  munmap(shared, sizeof *shared);
  assert_int_equal(killed, 0);
  for (int r = 0; r < world; r++) {
    if (r == victim) assert_int_equal(codes[r], 128 + SIGKILL);
    else assert_int_equal(codes[r], 0);
  }
  if (!named) fail_msg("rank %d did not name the stopped rank %d", namer, victim);
}

static void test_stopped_peer_device_route(void **state) {
  run_stopped_peer(NULL, 2, 1, 1, 0, false);
  run_stopped_peer(NULL, 3, 1, 1, 0, true);
}

static void test_stopped_peer_host_route(void **state) { run_stopped_peer("gloo", 3, 1, 1, 0, false); }

/* A failure's status and its message tell of the same failure. Rank 1 holds a failure of
 * its own device first (a sticky error of its sim streams, "injected device fault": a local
 * failure, which it carries to the closing agreement), then loses rank 0, which dies in the
 * middle of the data phase. Rank 1 fails with the lost peer's status, and its message must be
 * that failure's: the wait that drains its streams before the staging is freed reports the
 * device fault again, and must not put that message beside the lost peer's status. */
static sl_status injected_fault(void *arg, char *err, size_t errlen) {
  snprintf(err, errlen, "injected device fault");
  return SL_ERR_BACKEND;
}

static void *fault_bind(void *user, const sl_tensor *t) {
  stop_binder *b = user;
  if (b->n == 0 && !b->watch.j) { /* rank 1: the fault, before any data moves */
    sl_context *ctx = b->ctx;
    if (ctx->be->launch_host_fn(ctx->be_ctx, NULL, injected_fault, NULL) != SL_OK) return NULL;
  }
  return stop_bind(user, t);
}

static int fault_then_lost_main(int rank, int world, void *arg) {
  stop_job *j = arg;
  sl_context_options co = {.size = sizeof co, .backend = "sim", .world_size = world, .rank = rank,
                           .local_rank = rank, .rendezvous = j->rdzv, .timeout_ms = j->timeout_ms};
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "rank %d: context", rank);
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, j->path, &src) == SL_OK, "rank %d: source", rank);
  sl_plan *plan = NULL;
  sl_plan_create(ctx, &plan);
  stop_binder b = {.watch = {.j = rank == j->victim ? j : NULL}, .ctx = ctx};
  sl_load_options lo = {.size = sizeof lo, .staging_bytes = 1 << 16, .cpu_offload = SL_CPU_OFFLOAD_ON,
                        .bind = fault_bind, .bind_user = &b};
  sl_state *st = NULL;
  sl_status s = sl_load(ctx, plan, src, &lo, &st);
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "rank %d: %s: %s\n", rank, sl_status_name(s), msg);
  SL_CHILD_CHECK(rank != j->victim, "the victim returned from sl_load");
  SL_CHILD_CHECK(s == SL_ERR_PEER || s == SL_ERR_TIMEOUT, "rank %d: got %s", rank, sl_status_name(s));
  SL_CHILD_CHECK(status_matches(s, msg) && !strstr(msg, "injected"),
                 "rank %d: status %s beside the message of another failure: '%s'", rank, sl_status_name(s), msg);
  SL_CHILD_CHECK(sl_test_names_rank(msg, j->victim), "rank %d: message '%s' does not name rank %d", rank, msg, j->victim);
  for (int i = 0; i < b.n; i++) free(b.bufs[i]);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_status_matches_message_after_local_fault(void **state) {
  stop_shared *shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(shared != MAP_FAILED);
  memset(shared, 0, sizeof *shared);
  stop_job j = {.path = good, .timeout_ms = 20000, .victim = 0, .kill = true, .shared = shared,
                .rdzv = sl_test_rendezvous("fail-fault-then-lost")};
  int codes[2];
  int killed = sl_test_spawn(2, fault_then_lost_main, &j, 60000, codes);
  free(j.rdzv);
  munmap(shared, sizeof *shared);
  assert_int_equal(killed, 0);
  assert_int_equal(codes[0], 128 + SIGKILL);
  assert_int_equal(codes[1], 0);
}

/* HSDP [2, 2]: rank 3 ends the replica chain (rank 1 passes it its part over a link of two);
 * rank 1 is also in replica 0, where rank 0 scatters. */
static void test_stopped_peer_hsdp(void **state) {
  run_stopped_peer(NULL, 4, 2, 3, 1, true);
  run_stopped_peer(NULL, 4, 2, 1, 0, true);
  run_stopped_peer("gloo", 4, 2, 3, 1, true);
}

/* A very slow simulated device (every task of the sim waits up to 10 s) on every rank of a
 * job with a 2 s timeout: the backend bounds its waits by the job's timeout (module.h), so the
 * load fails with SL_ERR_TIMEOUT near the timeout — within 3x, against the minutes the queued
 * work would take — naming the wait and the timeout, and no rank succeeds. */
static int slow_device_main(int rank, int world, void *arg) {
  fjob *j = arg;
  /* every task 10 s: with a random 0..10 s one, a wait could end just under its bound and the
   * next begin late, each within the timeout (a slow device that progresses is not stuck) */
  setenv("SHARDLOAD_SIM_DELAY_US", "10000000", 1);
  setenv("SHARDLOAD_SIM_MIN_DELAY_US", "10000000", 1);
  sl_context_options co = {.size = sizeof co, .backend = "sim", .world_size = world, .rank = rank,
                           .local_rank = rank, .rendezvous = j->rdzv, .timeout_ms = j->timeout_ms};
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "rank %d: context", rank);
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, j->path, &src) == SL_OK, "rank %d: source", rank);
  sl_plan *plan = NULL;
  sl_plan_create(ctx, &plan);
  sl_load_options lo = {.size = sizeof lo, .staging_bytes = 1 << 16};
  sl_state *st = NULL;
  double t0 = now_s();
  sl_status s = sl_load(ctx, plan, src, &lo, &st);
  double dt = now_s() - t0;
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "rank %d: %s after %.2f s (timeout %.1f s): %s\n", rank, sl_status_name(s), dt,
          j->timeout_ms / 1000.0, msg);
  SL_CHILD_CHECK(s != SL_OK && st == NULL, "rank %d: the load succeeded", rank);
  SL_CHILD_CHECK(dt < j->max_seconds, "rank %d: sl_load took %.1f s with a timeout of %.1f s", rank, dt,
                 j->timeout_ms / 1000.0);
  SL_CHILD_CHECK(s == SL_ERR_TIMEOUT || s == SL_ERR_PEER, "rank %d: got %s", rank, sl_status_name(s));
  SL_CHILD_CHECK(status_matches(s, msg) || (s == SL_ERR_TIMEOUT && strstr(msg, "did not complete within")),
                 "rank %d: status %s does not match '%s'", rank, sl_status_name(s), msg);
  if (rank == 0)
    SL_CHILD_CHECK(strstr(msg, "sim:0: ") && strstr(msg, "job's timeout of 2000 ms"),
                   "rank 0: message '%s' does not name the sim's wait and the timeout", msg);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_slow_device_fails_near_the_timeout(void **state) {
  fjob j = {.path = good, .timeout_ms = 2000, .max_seconds = 6, .rdzv = sl_test_rendezvous("fail-slow-device")};
  int codes[2];
  int killed = sl_test_spawn(2, slow_device_main, &j, 60000, codes);
  free(j.rdzv);
  assert_int_equal(killed, 0);
  for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
}

/* The same slow device on rank 1 alone, behind a synchronous collective (Gloo: the host route),
 * with a short timeout on that rank only (its sim gives up its wait after about 2 s; rank 0
 * would wait 30 s for it). The wait's SL_ERR_TIMEOUT is rank 1's own failure there, not the
 * data plane's verdict (no collective is ordered on its streams): rank 1 keeps taking part
 * and every rank fails at the closing agreement with rank 1's message, well before rank 0's
 * timeout — not with "lost rank 1" once rank 1 has left phase 2 on its own. */
static int slow_device_one_rank_main(int rank, int world, void *arg) {
  fjob *j = arg;
  if (rank == 1) { /* every task 10 s (see slow_device_main) */
    setenv("SHARDLOAD_SIM_DELAY_US", "10000000", 1);
    setenv("SHARDLOAD_SIM_MIN_DELAY_US", "10000000", 1);
  }
  sl_context_options co = {.size = sizeof co, .backend = "sim", .collective = "gloo", .world_size = world,
                           .rank = rank, .local_rank = rank, .rendezvous = j->rdzv,
                           .timeout_ms = rank == 1 ? 1000 : 30000};
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "rank %d: context", rank);
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, j->path, &src) == SL_OK, "rank %d: source", rank);
  sl_plan *plan = NULL;
  sl_plan_create(ctx, &plan);
  sl_load_options lo = {.size = sizeof lo, .staging_bytes = 1 << 16};
  sl_state *st = NULL;
  double t0 = now_s();
  sl_status s = sl_load(ctx, plan, src, &lo, &st);
  double dt = now_s() - t0;
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "rank %d: %s after %.2f s: %s\n", rank, sl_status_name(s), dt, msg);
  SL_CHILD_CHECK(s == SL_ERR_TIMEOUT && st == NULL, "rank %d: got %s", rank, sl_status_name(s));
  SL_CHILD_CHECK(strstr(msg, "sim:1: ") && strstr(msg, "did not complete within"),
                 "rank %d: message '%s' is not rank 1's own", rank, msg);
  SL_CHILD_CHECK(dt < j->max_seconds, "rank %d: sl_load took %.1f s", rank, dt);
  /* the context outlives the failure, as a caller's would: nobody may be left to wait for it */
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_slow_device_on_one_rank_behind_gloo(void **state) {
  fjob j = {.path = good, .max_seconds = 15, .rdzv = sl_test_rendezvous("fail-slow-device-one")};
  int codes[2];
  int killed = sl_test_spawn(2, slow_device_one_rank_main, &j, 90000, codes);
  free(j.rdzv);
  assert_int_equal(killed, 0);
  for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
}

/* A failure that only one rank sees in the data phase (here: rank 1's first device buffer is
 * released behind the loader's back, so its host-to-device copy fails on the host route, its
 * device cast on the device route): that rank keeps taking part in the collectives, and every
 * rank ends with its error, quickly. */
typedef struct sabotage {
  sl_context *ctx;
  int rank;
  void *first;
  int calls;
} sabotage;

static void *sabotage_bind(void *user, const sl_tensor *t) {
  sabotage *s = user;
  void *p = NULL;
  if (sl_alloc(s->ctx, t->device, 0, t->nbytes, &p) != SL_OK) return NULL;
  if (s->calls++ == 0) s->first = p;
  else if (s->calls == 2 && s->rank == 1) sl_free(s->ctx, SL_DEVICE_ACCELERATOR, 0, s->first);
  return p;
}

static int local_failure_main(int rank, int world, void *arg) {
  fjob *j = arg;
  double t0 = now_s();
  sl_context_options co = {.size = sizeof co, .backend = "sim:strict", .world_size = world, .rank = rank,
                           .local_rank = rank, .rendezvous = j->rdzv, .timeout_ms = j->timeout_ms,
                           .collective = j->collective};
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "rank %d: context", rank);
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, j->path, &src) == SL_OK, "rank %d: source", rank);
  sl_plan *plan = NULL;
  sl_plan_create(ctx, &plan);
  if (j->param != SL_DTYPE_INVALID) sl_plan_set_param_dtype(plan, j->param);
  sabotage sb = {ctx, rank, NULL, 0};
  sl_load_options lo = {.size = sizeof lo, .staging_bytes = 1 << 16, .bind = sabotage_bind, .bind_user = &sb,
                        .read_mode = j->differ_rank == 1 ? SL_READ_EVERY_RANK : SL_READ_RANK0};
  sl_state *st = NULL;
  sl_status s = sl_load(ctx, plan, src, &lo, &st);
  double dt = now_s() - t0;
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "rank %d: %s: %s (%.2f s)\n", rank, sl_status_name(s), msg, dt);
  SL_CHILD_CHECK(s == SL_ERR_BACKEND, "rank %d: got %s", rank, sl_status_name(s));
  SL_CHILD_CHECK(st == NULL, "rank %d: a state despite the failure", rank);
  SL_CHILD_CHECK(strstr(msg, "a.weight") != NULL, "rank %d: message '%s' does not name the tensor", rank, msg);
  if (rank != 1) SL_CHILD_CHECK(strstr(msg, "rank 1") != NULL, "rank %d: message '%s' does not name rank 1", rank, msg);
  SL_CHILD_CHECK(dt < j->max_seconds, "rank %d took %.1f s", rank, dt);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_one_rank_fails_in_data_phase(void **state) {
  for (int every = 0; every < 3; every++) {
    /* a long timeout: the others must learn of the failure from rank 1, not by timing out.
     * 0: host staging; 1: every-rank reads; 2: the device route (simccl), F32 -> F64 so that the
     * cast on the device is what fails */
    fjob j = {.path = good, .timeout_ms = 60000, .die_rank = -1, .differ_rank = every == 1 ? 1 : -1, .max_seconds = 20,
              .collective = every == 0 ? "gloo" : NULL, .param = every == 2 ? SL_DTYPE_F64 : SL_DTYPE_INVALID};
    char sub[32];
    snprintf(sub, sizeof sub, "fail-local-%d", every);
    j.rdzv = sl_test_rendezvous(sub);
    int codes[3];
    int killed = sl_test_spawn(3, local_failure_main, &j, 60000, codes);
    free(j.rdzv);
    assert_int_equal(killed, 0);
    for (int r = 0; r < 3; r++) assert_int_equal(codes[r], 0);
  }
}

/* A caller error that only one rank makes (here rank 1 passes a strategy out of range) is a
 * phase-1 failure: every rank ends with that rank's error, quickly, and not with a lost or
 * timed-out peer. */
static int bad_options_main(int rank, int world, void *arg) {
  fjob *j = arg;
  double t0 = now_s();
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .world_size = world, .rank = rank,
                           .rendezvous = j->rdzv, .timeout_ms = j->timeout_ms};
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "rank %d: context", rank);
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, j->path, &src) == SL_OK, "rank %d: source", rank);
  sl_plan *plan = NULL;
  sl_plan_create(ctx, &plan);
  sl_load_options lo = {.size = sizeof lo, .staging_bytes = 4096,
                        .strategy = rank == 1 ? (sl_strategy)7 : SL_STRATEGY_SCATTER};
  sl_state *st = NULL;
  sl_status s = sl_load(ctx, plan, src, &lo, &st);
  double dt = now_s() - t0;
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "rank %d: %s: %s (%.2f s)\n", rank, sl_status_name(s), msg, dt);
  SL_CHILD_CHECK(s == SL_ERR_INVALID, "rank %d: got %s", rank, sl_status_name(s));
  SL_CHILD_CHECK(st == NULL, "rank %d: a state despite the failure", rank);
  SL_CHILD_CHECK(strstr(msg, "out of range") != NULL, "rank %d: message '%s' lacks the cause", rank, msg);
  if (rank != 1) SL_CHILD_CHECK(strstr(msg, "rank 1") != NULL, "rank %d: message '%s' does not name rank 1", rank, msg);
  SL_CHILD_CHECK(dt < j->max_seconds, "rank %d took %.1f s", rank, dt);
  /* every rank stays until all have their verdict: a rank that left early would look lost */
  SL_CHILD_CHECK(sl__ctl_barrier(ctx) == SL_OK, "rank %d: barrier", rank);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_one_rank_bad_options(void **state) {
  fjob j = {.path = good, .timeout_ms = 60000, .die_rank = -1, .differ_rank = -1, .max_seconds = 10};
  j.rdzv = sl_test_rendezvous("fail-bad-options");
  int codes[3];
  int killed = sl_test_spawn(3, bad_options_main, &j, 40000, codes);
  free(j.rdzv);
  assert_int_equal(killed, 0);
  for (int r = 0; r < 3; r++) assert_int_equal(codes[r], 0);
}

static void *device_binder(void *user, const sl_tensor *t) { return user; }

static void test_caller_device_buffer_for_cpu_placement_rejected(void **state) {
  sl_context_options co = {.size = sizeof co, .backend = "sim:strict", .world_size = 1};
  sl_context *ctx = NULL;
  assert_int_equal(sl_context_create(&co, &ctx), SL_OK);
  sl_source *src = NULL;
  assert_int_equal(sl_source_open(ctx, good, &src), SL_OK);
  sl_plan *plan = NULL;
  assert_int_equal(sl_plan_create(ctx, &plan), SL_OK);
  /* CPU placement, but the caller hands over device memory: refused before any byte moves */
  void *dev = NULL;
  assert_int_equal(sl_alloc(ctx, SL_DEVICE_ACCELERATOR, 0, 8u << 20, &dev), SL_OK);
  sl_load_options lo = {.size = sizeof lo, .cpu_offload = SL_CPU_OFFLOAD_ON, .bind = device_binder, .bind_user = dev};
  sl_state *st = NULL;
  assert_int_equal(sl_load(ctx, plan, src, &lo, &st), SL_ERR_BUFFER);
  assert_null(st);
  assert_non_null(strstr(sl_context_errmsg(ctx), "placed on the CPU"));
  sl_free(ctx, SL_DEVICE_ACCELERATOR, 0, dev);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
}

/* ---- caller buffers on failure, across ranks (the contract at sl_bind_fn in shardload.h) --- */
#define CANARY 0xC5
#define GUARD 64

typedef struct cjob {
  char *rdzv;
  char *path;
  int data_phase; /* 0: rank 1 binds a wrong buffer (phase 1); 1: rank 0's file is cut short */
  int readers;    /* the file-cut tests: 0 every-rank reads, else that many distributed readers */
  const char *collective; /* the data collective, or NULL: auto (shm here) */
} cjob;

typedef struct canaries {
  sl_context *ctx;
  int rank, data_phase, calls;
  void *device; /* rank 1's wrong buffer in the phase-1 case */
  unsigned char *bufs[3];
  uint64_t nbytes[3];
  int64_t row0[3]; /* first global row of the rank's shard */
} canaries;

/* A caller buffer for T with GUARD canary bytes either side, recorded for the checks (its
 * allocation, first global row and size); counts the call. */
static void *guarded_buffer(const sl_tensor *t, unsigned char **buf, int64_t *row0, uint64_t *nbytes, int *calls) {
  unsigned char *p = malloc((size_t)t->nbytes + 2 * GUARD);
  if (!p) return NULL;
  memset(p, CANARY, (size_t)t->nbytes + 2 * GUARD);
  *buf = p;
  *row0 = t->global_offset[0];
  *nbytes = t->nbytes;
  ++*calls;
  return p + GUARD;
}

static void *canary_bind(void *user, const sl_tensor *t) {
  canaries *c = user;
  if (c->calls >= 3) return NULL;
  if (!c->data_phase && c->rank == 1 && c->calls == 1) {
    /* device memory for a CPU placement: refused in preparation, after rank 0 bound all of its */
    c->calls++;
    return sl_alloc(c->ctx, SL_DEVICE_ACCELERATOR, 0, t->nbytes, &c->device) == SL_OK ? c->device : NULL;
  }
  return guarded_buffer(t, &c->bufs[c->calls], &c->row0[c->calls], &c->nbytes[c->calls], &c->calls);
}

/* Whether N bytes at P all still hold the canary. */
static int all_canary(const unsigned char *p, size_t n) { return sl_test_all_bytes(p, n, CANARY); }

static int canary_main(int rank, int world, void *arg) {
  cjob *j = arg;
  sl_context_options co = {.size = sizeof co, .backend = j->data_phase ? "cpu" : "sim:strict", .world_size = world,
                           .rank = rank, .local_rank = rank, .rendezvous = j->rdzv, .timeout_ms = 20000};
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "rank %d: context", rank);
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, j->path, &src) == SL_OK, "rank %d: source", rank);
  if (j->data_phase && rank == 0) {
    /* every rank has opened it (sl_source_open agrees): rank 0's reads of t.b now fail */
    const sl_source_tensor *b = sl_source_find(src, "t.b");
    SL_CHILD_CHECK(truncate(j->path, (off_t)(b->file_offset + b->nbytes / 2)) == 0, "truncate");
  }
  sl_plan *plan = NULL;
  sl_plan_create(ctx, &plan);
  canaries c = {.ctx = ctx, .rank = rank, .data_phase = j->data_phase};
  sl_load_options lo = {.size = sizeof lo, .staging_bytes = 4096, .bind = canary_bind, .bind_user = &c,
                        .cpu_offload = SL_CPU_OFFLOAD_ON};
  sl_state *st = NULL;
  sl_status s = sl_load(ctx, plan, src, &lo, &st);
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "rank %d: %s: %s\n", rank, sl_status_name(s), msg);
  SL_CHILD_CHECK(s != SL_OK && st == NULL, "rank %d: the load did not fail", rank);
  if (!j->data_phase) {
    SL_CHILD_CHECK(s == SL_ERR_BUFFER, "rank %d: got %s", rank, sl_status_name(s));
    if (rank == 0) SL_CHILD_CHECK(strstr(msg, "rank 1") != NULL, "rank 0: message '%s' names no rank 1", msg);
  } else {
    SL_CHILD_CHECK(strstr(msg, "t.b") != NULL, "rank %d: message '%s' does not name t.b", rank, msg);
  }
  for (int i = 0; i < 3; i++) {
    if (!c.bufs[i]) continue;
    size_t n = (size_t)c.nbytes[i];
    SL_CHILD_CHECK(all_canary(c.bufs[i], GUARD) && all_canary(c.bufs[i] + GUARD + n, GUARD),
                   "rank %d: bytes written outside tensor %d's buffer", rank, i);
    if (!j->data_phase || (i == 2 && rank == 0)) {
      /* phase 1 failed: untouched; data phase: on rank 0, which saw its read fail, the tensor
       * after the failing one is untouched */
      SL_CHILD_CHECK(all_canary(c.bufs[i] + GUARD, n), "rank %d: tensor %d's buffer was written", rank, i);
    } else if (i == 2) {
      /* the others learn of it at the end of the status window: until then rank 0 sent zeros
       * in place of what it could not read (sl_bind_fn's contract) */
      for (size_t k = 0; k < n; k++)
        SL_CHILD_CHECK(c.bufs[i][GUARD + k] == CANARY || c.bufs[i][GUARD + k] == 0,
                       "rank %d: t.c byte %zu is neither untouched nor zero", rank, k);
    } else if (i == 0) {
      for (size_t k = 0; k < n; k++)
        SL_CHILD_CHECK(c.bufs[i][GUARD + k] == sl_test_pattern_byte("t.a", (uint64_t)c.row0[i] * 64 + k),
                       "rank %d: t.a byte %zu is not the checkpoint's", rank, k);
    }
    free(c.bufs[i]);
  }
  if (c.device) sl_free(ctx, SL_DEVICE_ACCELERATOR, 0, c.device);
  SL_CHILD_CHECK(c.calls == 3 || (!j->data_phase && rank == 1), "rank %d: bind called %d times", rank, c.calls);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_caller_buffers_on_failure_across_ranks(void **state) {
  for (int data_phase = 0; data_phase < 2; data_phase++) {
    cjob j = {.rdzv = sl_test_rendezvous(data_phase ? "fail-canary-data" : "fail-canary-phase1"),
              .path = sl_test_path(dir, "canary.safetensors"), .data_phase = data_phase};
    const sl_test_tensor ts[] = {
        {"t.a", "F32", 2, {64, 16}, NULL}, {"t.b", "F32", 2, {64, 16}, NULL}, {"t.c", "F32", 2, {64, 16}, NULL}};
    assert_int_equal(sl_test_write_st(j.path, ts, 3, NULL), 0);
    int codes[2];
    int killed = sl_test_spawn(2, canary_main, &j, 60000, codes);
    free(j.rdzv);
    free(j.path);
    assert_int_equal(killed, 0);
    for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
  }
}

/* Every-rank reads of many small tensors go into their shards in coalesced preadv calls
 * (source_files.c, sl__source_read_add): when the file is cut short in the middle of one, every
 * rank fails naming the tensor at the cut, the tensors before it hold their bytes, the ones
 * after it are untouched, and nothing outside any buffer is written. */
#define CUT_N 64  /* F32 [8, 16]: 256 bytes a rank at world 2, a 256-byte gap between */
#define CUT_AT 40 /* the tensor the file ends in */

typedef struct cut_binder {
  const char *path;
  uint64_t cut;
  int calls, truncated;
  unsigned char *bufs[CUT_N];
  uint64_t nbytes[CUT_N];
  int64_t row0[CUT_N];
} cut_binder;

static void *cut_bind(void *user, const sl_tensor *t) {
  cut_binder *c = user;
  /* binding comes after the files agreement, so every rank has opened and fingerprinted the
   * file: each cuts it here, to the same length, before any of them reads */
  if (c->calls == 0) c->truncated = truncate(c->path, (off_t)c->cut) == 0;
  if (c->calls >= CUT_N) return NULL;
  return guarded_buffer(t, &c->bufs[c->calls], &c->row0[c->calls], &c->nbytes[c->calls], &c->calls);
}

static int cut_main(int rank, int world, void *arg) {
  cjob *j = arg;
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .collective = j->collective, .world_size = world,
                           .rank = rank, .local_rank = rank, .rendezvous = j->rdzv, .timeout_ms = 20000};
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "rank %d: context", rank);
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, j->path, &src) == SL_OK, "rank %d: source", rank);
  char name[16];
  snprintf(name, sizeof name, "t.%03d", CUT_AT);
  const sl_source_tensor *cut_in = sl_source_find(src, name);
  SL_CHILD_CHECK(cut_in != NULL, "rank %d: no %s", rank, name);
  sl_plan *plan = NULL;
  sl_plan_create(ctx, &plan);
  cut_binder c = {.path = j->path, .cut = cut_in->file_offset + 100};
  /* one transfer for all 64 (the staging budget holds them), so one batch meets the cut */
  sl_load_options lo = {.size = sizeof lo, .staging_bytes = 1 << 20, .bind = cut_bind, .bind_user = &c,
                        .cpu_offload = SL_CPU_OFFLOAD_ON,
                        .read_mode = j->readers ? SL_READ_READERS : SL_READ_EVERY_RANK, .readers = j->readers};
  sl_state *st = NULL;
  sl_status s = sl_load(ctx, plan, src, &lo, &st);
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "rank %d: %s: %s\n", rank, sl_status_name(s), msg);
  SL_CHILD_CHECK(c.truncated, "rank %d: truncate failed", rank);
  SL_CHILD_CHECK(s != SL_OK && st == NULL, "rank %d: the load did not fail", rank);
  SL_CHILD_CHECK(strstr(msg, name) && strstr(msg, j->path), "rank %d: message '%s' does not name %s and the file", rank,
                 msg, name);
  /* distributed readers: the cut lies in reader 1's share (the second half), which every rank
   * names; the tensors of reader 0's share hold their bytes */
  if (j->readers)
    SL_CHILD_CHECK(strstr(msg, rank == 1 ? "a distributed reader could not read its share"
                                          : "rank 1: a distributed reader could not read its share"),
                   "rank %d: message '%s' does not name reader 1", rank, msg);
  else
    SL_CHILD_CHECK(strstr(msg, "truncated after it was opened"), "rank %d: message '%s' does not name the cut", rank,
                   msg);
  const int good = j->readers ? CUT_N / 2 : CUT_AT;
  SL_CHILD_CHECK(c.calls == CUT_N, "rank %d: bind called %d times", rank, c.calls);
  for (int i = 0; i < CUT_N; i++) {
    size_t n = (size_t)c.nbytes[i];
    SL_CHILD_CHECK(all_canary(c.bufs[i], GUARD) && all_canary(c.bufs[i] + GUARD + n, GUARD),
                   "rank %d: bytes written outside tensor %d's buffer", rank, i);
    snprintf(name, sizeof name, "t.%03d", i);
    if (i < good) {
      for (size_t k = 0; k < n; k++)
        SL_CHILD_CHECK(c.bufs[i][GUARD + k] == sl_test_pattern_byte(name, (uint64_t)c.row0[i] * 64 + k),
                       "rank %d: %s byte %zu is not the checkpoint's", rank, name, k);
    } else if (i > CUT_AT && !j->readers) {
      SL_CHILD_CHECK(all_canary(c.bufs[i] + GUARD, n), "rank %d: %s was written past the cut", rank, name);
    }
    free(c.bufs[i]);
  }
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void file_cut(int readers, const char *collective) {
  cjob j = {.rdzv = sl_test_rendezvous(readers ? "fail-cut-readers" : "fail-cut-batch"),
            .path = sl_test_path(dir, "cut-batch.safetensors"), .readers = readers, .collective = collective};
  sl_test_tensor ts[CUT_N];
  char names[CUT_N][16];
  for (int i = 0; i < CUT_N; i++) {
    snprintf(names[i], sizeof names[i], "t.%03d", i);
    ts[i] = (sl_test_tensor){names[i], "F32", 2, {8, 16}, NULL};
  }
  assert_int_equal(sl_test_write_st(j.path, ts, CUT_N, NULL), 0);
  int codes[2];
  int killed = sl_test_spawn(2, cut_main, &j, 60000, codes);
  free(j.rdzv);
  free(j.path);
  assert_int_equal(killed, 0);
  for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
}

static void test_every_rank_file_cut_mid_batch(void **state) { file_cut(0, NULL); }

/* Distributed readers (two): the file is cut short inside reader 1's share once every reader
 * has proved its copy; reader 1's read fails, and every rank fails within the status window
 * naming rank 1, the tensor and the file. */
static void test_reader_cannot_read_its_share(void **state) { file_cut(2, NULL); }

/* The same over Gloo, whose readers' transfers move in rounds (one group op for both readers'):
 * reader 1's failed read still takes part in its round, with zeros, and the status window after
 * it fails every rank alike. */
static void test_reader_cannot_read_its_share_in_rounds(void **state) { file_cut(2, "gloo"); }

/* The progress callback that can fail (sl_load_options.progress_status): rank 0's callback
 * fails after its first tensor, so every rank fails the load with its message within one
 * status window (as a failure of rank 0's), the callback is not called again, and the context
 * is still good for another load, which succeeds. */
typedef struct progress_probe {
  int calls;
  int fail_at; /* the call that fails (1-based), or 0 */
} progress_probe;

static sl_status failing_progress(void *user, uint64_t done, uint64_t total, char *msg, size_t len) {
  progress_probe *p = user;
  if (++p->calls == p->fail_at) {
    snprintf(msg, len, "stop after %llu of %llu bytes", (unsigned long long)done, (unsigned long long)total);
    return SL_ERR_INVALID;
  }
  return SL_OK;
}

static int progress_main(int rank, int world, void *arg) {
  const char *rdzv = arg;
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .world_size = world, .rank = rank,
                           .rendezvous = rdzv, .timeout_ms = 60000};
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "rank %d: context", rank);
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, good, &src) == SL_OK, "rank %d: open: %s", rank, sl_context_errmsg(ctx));
  sl_plan *plan = NULL;
  sl_plan_create(ctx, &plan);
  progress_probe pp = {0, 1};
  sl_load_options lo = {.size = sizeof lo, .staging_bytes = 1 << 20, .progress_status = failing_progress,
                        .progress_user = &pp};
  sl_state *st = NULL;
  sl_status s = sl_load(ctx, plan, src, &lo, &st);
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "rank %d: %s: %s\n", rank, sl_status_name(s), msg);
  SL_CHILD_CHECK(s == SL_ERR_INVALID && st == NULL, "rank %d: got %s", rank, sl_status_name(s));
  SL_CHILD_CHECK(strstr(msg, "progress callback") && strstr(msg, "stop after"), "rank %d: message '%s'", rank, msg);
  SL_CHILD_CHECK(pp.calls == (rank == 0 ? 1 : 0), "rank %d: progress called %d times", rank, pp.calls);
  /* the same context loads again: the failure was the caller's, not the job's */
  pp = (progress_probe){0, 0};
  s = sl_load(ctx, plan, src, &lo, &st);
  SL_CHILD_CHECK(s == SL_OK, "rank %d: second load: %s: %s", rank, sl_status_name(s), sl_context_errmsg(ctx));
  SL_CHILD_CHECK(pp.calls == (rank == 0 ? 2 : 0), "rank %d: progress called %d times", rank, pp.calls);
  sl_state_destroy(st);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_progress_callback_fails_every_rank(void **state) {
  char *rdzv = sl_test_rendezvous("fail-progress");
  int codes[2];
  int killed = sl_test_spawn(2, progress_main, rdzv, 60000, codes);
  free(rdzv);
  assert_int_equal(killed, 0);
  for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
}

int main(void) {
  if (getenv("SL_TEST_FILTER")) cmocka_set_test_filter(getenv("SL_TEST_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rank0_cannot_open),
      cmocka_unit_test(test_rank0_cannot_parse),
      cmocka_unit_test(test_plans_differ),
      cmocka_unit_test(test_rank_dies_mid_load),
      cmocka_unit_test(test_one_rank_fails_in_data_phase),
      cmocka_unit_test(test_stopped_peer_device_route),
      cmocka_unit_test(test_stopped_peer_host_route),
      cmocka_unit_test(test_stopped_peer_hsdp),
      cmocka_unit_test(test_status_matches_message_after_local_fault),
      cmocka_unit_test(test_slow_device_fails_near_the_timeout),
      cmocka_unit_test(test_slow_device_on_one_rank_behind_gloo),
      cmocka_unit_test(test_one_rank_bad_options),
      cmocka_unit_test(test_caller_device_buffer_for_cpu_placement_rejected),
      cmocka_unit_test(test_caller_buffers_on_failure_across_ranks),
      cmocka_unit_test(test_every_rank_file_cut_mid_batch),
      cmocka_unit_test(test_reader_cannot_read_its_share),
      cmocka_unit_test(test_reader_cannot_read_its_share_in_rounds),
      cmocka_unit_test(test_progress_callback_fails_every_rank),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
