/* The two planes (docs/DESIGN.md#modules): ranks agree on the data collective over the control
 * plane at context creation — a device collective only when every rank can run it on a device
 * of its own, a forced one failing on every rank with the reason of the rank that cannot (or of
 * the two that share a device), host staging for one rank unless forced — and sl_context_abort
 * ends a pending control-plane operation. Real processes, real Gloo over loopback. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define MAX_WORLD 4

/* One job: each rank's backend and --collective, and what every rank must see. */
typedef struct planes_job {
  char *rdzv;
  int world;
  const char *backend[MAX_WORLD];
  const char *collective[MAX_WORLD];
  int pin;                 /* 1: rank r runs on device[r] (--device); 0: local rank r, as a launcher gives */
  int device[MAX_WORLD];
  sl_status expect;        /* the status every rank gets from sl_context_create */
  const char *name;        /* with SL_OK: the data collective every rank reports */
  const char *want[4];     /* substrings of the reason (SL_OK) or of the error message */
} planes_job;

#define WANTS(j) (sizeof (j)->want / sizeof (j)->want[0])

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int planes_rank(int rank, int world, void *arg) {
  const planes_job *j = arg;
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = j->backend[rank], .collective = j->collective[rank],
                           .world_size = world, .rank = rank, .local_rank = rank, .rendezvous = j->rdzv,
                           .timeout_ms = 20000, .errbuf = err, .errbuf_size = sizeof err,
                           .device = j->device[rank], .device_set = j->pin};
  sl_context *ctx = NULL;
  double t0 = now_s();
  sl_status s = sl_context_create(&co, &ctx);
  double took = now_s() - t0;
  fprintf(stderr, "rank %d (%s): %s in %.2f s: %s\n", rank, j->backend[rank], sl_status_name(s), took,
          ctx ? sl_context_collective_name(ctx) : err);
  /* a failure is agreed at once, never found by a timeout */
  SL_CHILD_CHECK(took < 10.0, "rank %d took %.1f s", rank, took);
  SL_CHILD_CHECK(s == j->expect, "rank %d: %s, expected %s (%s)", rank, sl_status_name(s), sl_status_name(j->expect),
                 err);
  if (s != SL_OK) {
    for (size_t k = 0; k < WANTS(j) && j->want[k]; k++)
      SL_CHILD_CHECK(strstr(err, j->want[k]) != NULL, "rank %d: message '%s' lacks '%s'", rank, err, j->want[k]);
    return 0;
  }
  const char *name = sl_context_collective_name(ctx), *why = sl_context_collective_reason(ctx);
  fprintf(stderr, "rank %d: collective %s: %s\n", rank, name, why);
  SL_CHILD_CHECK(name && strcmp(name, j->name) == 0, "rank %d: collective %s, expected %s", rank, name, j->name);
  for (size_t k = 0; k < WANTS(j) && j->want[k]; k++)
    SL_CHILD_CHECK(why && strstr(why, j->want[k]) != NULL, "rank %d: reason '%s' lacks '%s'", rank, why, j->want[k]);
  /* the control plane still works after the agreement: every rank takes part in one more */
  SL_CHILD_CHECK(sl_context_agree(ctx, SL_OK) == SL_OK, "rank %d: agree: %s", rank, sl_context_errmsg(ctx));
  sl_context_destroy(ctx);
  return 0;
}

static void run(planes_job *j, const char *sub) {
  j->rdzv = sl_test_rendezvous(sub);
  int codes[MAX_WORLD];
  int killed = sl_test_spawn(j->world, planes_rank, j, 40000, codes);
  assert_int_equal(killed, 0); /* nothing hung */
  for (int r = 0; r < j->world; r++) assert_int_equal(codes[r], 0);
  free(j->rdzv);
}

/* Every rank runs sim, each on its own device (its local rank's, or the one it is given): its
 * device collective. */
static void test_sim_ranks_choose_simccl(void **state) {
  planes_job j = {.world = 2, .backend = {"sim", "sim"}, .expect = SL_OK, .name = "simccl",
                  .want = {"simccl: preferred by backend sim and every rank runs it"}};
  run(&j, "sim2");
  planes_job k = {.world = 2, .backend = {"sim", "sim"}, .pin = 1, .device = {3, 0}, .expect = SL_OK,
                  .name = "simccl", .want = {"simccl: preferred by backend sim and every rank runs it"}};
  run(&k, "sim2-devices");
}

/* ---- ranks that share a device -------------------------------------------------------------- */

/* "on HOST": the machine the reason names (every rank of these jobs runs here). */
static const char *this_host(void) {
  static char host[80];
  if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "(no host name)");
  return host;
}

/* Two ranks on one device (sim:0, as two CUDA ranks given --device 0 on one GPU): auto does not
 * choose the device collective, and every rank says which ranks share which device where. */
static void test_shared_device_chooses_gloo(void **state) {
  char on[128];
  snprintf(on, sizeof on, "sim:0 (sim) on %s;", this_host());
  planes_job j = {.world = 2, .backend = {"sim", "sim"}, .pin = 1, .device = {0, 0}, .expect = SL_OK,
                  .name = "shm", .want = {"shm: ranks 0 and 1 share device ", on, "simccl needs one device per rank"}};
  run(&j, "shared");
  /* the pair is found wherever it is in the job: ranks 0 and 2 here, rank 1 on its own device */
  planes_job k = {.world = 3, .backend = {"sim", "sim", "sim"}, .pin = 1, .device = {1, 0, 1}, .expect = SL_OK,
                  .name = "shm", .want = {"shm: ranks 0 and 2 share device sim:1 (sim)"}};
  run(&k, "shared3");
  /* host staging does not care */
  planes_job g = {.world = 2, .backend = {"sim", "sim"}, .collective = {"gloo", "gloo"}, .pin = 1, .device = {0, 0},
                  .expect = SL_OK, .name = "gloo", .want = {"gloo: forced"}};
  run(&g, "shared-gloo");
}

/* Forced onto ranks that share a device: every rank fails at creation, at once, naming both
 * ranks, the device and the machine, and saying what to do. */
static void test_shared_device_forced_fails_everywhere(void **state) {
  char on[128];
  snprintf(on, sizeof on, "share device sim:0 (sim) on %s,", this_host());
  planes_job j = {.world = 2, .backend = {"sim", "sim"}, .collective = {"simccl", "simccl"}, .pin = 1,
                  .device = {0, 0}, .expect = SL_ERR_UNSUPPORTED,
                  .want = {"the collective simccl was asked for, but ranks 0 and 1 ", on,
                           "simccl needs one device per rank", "use --collective gloo (host staging), or give each rank "
                                                               "its own device (--device"}};
  run(&j, "shared-forced");
  planes_job k = {.world = 3, .backend = {"sim", "sim", "sim"}, .collective = {"simccl", "simccl", "simccl"},
                  .pin = 1, .device = {2, 1, 1}, .expect = SL_ERR_UNSUPPORTED,
                  .want = {"ranks 1 and 2 share device sim:1 (sim)"}};
  run(&k, "shared-forced3");
}

/* One rank on cpu: host staging, and the reason names the rank that cannot and why. */
static void test_mixed_ranks_choose_gloo(void **state) {
  planes_job j = {.world = 2, .backend = {"sim", "cpu"}, .expect = SL_OK, .name = "shm",
                  .want = {"shm: rank 1 cannot run simccl", "backend is cpu"}};
  run(&j, "mixed");
  /* rank 0's backend decides what is preferred: cpu wants host staging */
  planes_job k = {.world = 3, .backend = {"cpu", "sim", "sim"}, .expect = SL_OK, .name = "shm",
                  .want = {"shm: backend cpu of rank 0 stages through host memory"}};
  run(&k, "mixed3");
}

/* Forced onto a rank that cannot run it: every rank fails at once with that rank's reason. */
static void test_forced_collective_fails_everywhere(void **state) {
  planes_job j = {.world = 3, .backend = {"sim", "sim", "cpu"}, .collective = {"simccl", "simccl", "simccl"},
                  .expect = SL_ERR_NO_DEVICE, .want = {"rank 2 cannot run it", "backend is cpu"}};
  run(&j, "forced");
}

static void test_forced_collective_runs(void **state) {
  planes_job j = {.world = 2, .backend = {"sim", "sim"}, .collective = {"gloo", "gloo"}, .expect = SL_OK,
                  .name = "gloo", .want = {"gloo: forced"}};
  run(&j, "forcedgloo");
}

static void test_unknown_collective_fails_everywhere(void **state) {
  planes_job j = {.world = 2, .backend = {"cpu", "cpu"}, .collective = {"nosuch", "nosuch"},
                  .expect = SL_ERR_INVALID, .want = {"collective 'nosuch' is unknown", "gloo"}};
  run(&j, "nosuch");
}

/* A data module whose init fails (local serves one rank): every rank fails at once with the
 * module's message, none waits in a bootstrap. */
static void test_data_init_failure_fails_everywhere(void **state) {
  planes_job j = {.world = 2, .backend = {"cpu", "cpu"}, .collective = {"local", "local"},
                  .expect = SL_ERR_INVALID, .want = {"serves one rank"}};
  run(&j, "initfail");
}

/* Ranks asked for different collectives would each choose their own: all refuse. */
static void test_ranks_asking_differently_fail(void **state) {
  planes_job j = {.world = 2, .backend = {"sim", "sim"}, .collective = {NULL, "gloo"}, .expect = SL_ERR_MISMATCH,
                  .want = {"rank 1 was asked for the data collective gloo, rank 0 for auto"}};
  run(&j, "differ");
}

/* One rank: host staging through local, whatever the backend (a one-rank device collective
 * would only cost its start: seconds for NCCL); a forced device collective still runs. */
static void test_one_rank(void **state) {
  planes_job j = {.world = 1, .backend = {"sim"}, .expect = SL_OK, .name = "local",
                  .want = {"local: one rank stages through host memory (backend sim's simccl only when forced: "
                           "--collective simccl)"}};
  run(&j, "one-sim");
  planes_job f = {.world = 1, .backend = {"sim"}, .collective = {"simccl"}, .expect = SL_OK, .name = "simccl",
                  .want = {"simccl: forced"}};
  run(&f, "one-sim-forced");
  planes_job k = {.world = 1, .backend = {"cpu"}, .expect = SL_OK, .name = "local",
                  .want = {"local: backend cpu of rank 0 stages through host memory"}};
  run(&k, "one-cpu");
}

/* options.device picks the device; a negative one is refused by name. */
static void test_device_option(void **state) {
  char err[512] = "";
  sl_context_options co = {.size = sizeof co, .backend = "sim", .world_size = 1, .device = 2, .device_set = 1,
                           .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  assert_int_equal(sl_context_create(&co, &ctx), SL_OK);
  assert_non_null(strstr(sl_context_device_description(ctx), "sim:2"));
  sl_context_destroy(ctx);
  co.device = -1;
  assert_int_equal(sl_context_create(&co, &ctx), SL_ERR_INVALID);
  assert_null(ctx);
  assert_non_null(strstr(err, "device -1 is not a device ordinal"));
}

/* ---- contexts one after another --------------------------------------------------------- */

/* Two contexts of the job in a row, and between them rank 1 makes a world-1 context of its own
 * (a script inspecting a checkpoint, a torch program's side context): the job's second context
 * still meets at once. A process-wide count of every context would number rank 1's second job
 * context differently from rank 0's, and both would wait out the timeout. */
static int side_rank(int rank, int world, void *arg) {
  const char *rdzv = arg;
  for (int round = 0; round < 2; round++) {
    if (round == 1 && rank == 1) {
      sl_context_options solo = {.size = sizeof solo, .backend = "cpu", .world_size = 1};
      sl_context *side = NULL;
      SL_CHILD_CHECK(sl_context_create(&solo, &side) == SL_OK, "rank 1: side context");
      sl_context_destroy(side);
    }
    char err[512] = "";
    sl_context_options co = {.size = sizeof co, .backend = "cpu", .world_size = world, .rank = rank,
                             .rendezvous = rdzv, .timeout_ms = 8000, .errbuf = err, .errbuf_size = sizeof err};
    sl_context *ctx = NULL;
    double t0 = now_s();
    sl_status s = sl_context_create(&co, &ctx);
    double took = now_s() - t0;
    SL_CHILD_CHECK(s == SL_OK, "rank %d round %d: %s: %s", rank, round, sl_status_name(s), err);
    SL_CHILD_CHECK(took < 5.0, "rank %d round %d: creation took %.1f s", rank, round, took);
    SL_CHILD_CHECK(sl_context_agree(ctx, SL_OK) == SL_OK, "rank %d round %d: agree: %s", rank, round,
                   sl_context_errmsg(ctx));
    sl_context_destroy(ctx);
  }
  return 0;
}

static void test_side_context_keeps_numbering(void **state) {
  char *rdzv = sl_test_rendezvous("side");
  int codes[2];
  assert_int_equal(sl_test_spawn(2, side_rank, rdzv, 40000, codes), 0);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  free(rdzv);
}

/* ---- sl_context_abort --------------------------------------------------------------------- */

static void *abort_later(void *arg) {
  usleep(300 * 1000);
  sl_context_abort(arg);
  return NULL;
}

/* Rank 0 waits in a control-plane agreement that rank 1 never joins; another thread aborts the
 * context: the wait ends within a second or two (the timeout is 30 s) saying it was aborted,
 * and so does every later operation. */
static int abort_rank(int rank, int world, void *arg) {
  const char *rdzv = arg;
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .world_size = world, .rank = rank,
                           .rendezvous = rdzv, .timeout_ms = 30000};
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "rank %d: create", rank);
  if (rank == 1) {
    /* stays away from rank 0's agreement until well after the abort must have ended it */
    usleep(4000 * 1000);
    sl_context_destroy(ctx);
    return 0;
  }
  pthread_t th;
  SL_CHILD_CHECK(pthread_create(&th, NULL, abort_later, ctx) == 0, "thread");
  double t0 = now_s();
  sl_status s = sl_context_agree(ctx, SL_OK);
  double took = now_s() - t0;
  pthread_join(th, NULL);
  fprintf(stderr, "rank 0: agree %s after %.2f s: %s\n", sl_status_name(s), took, sl_context_errmsg(ctx));
  SL_CHILD_CHECK(s != SL_OK, "the aborted agreement succeeded");
  SL_CHILD_CHECK(took < 2.5, "the abort took %.2f s to end the wait", took);
  SL_CHILD_CHECK(strstr(sl_context_errmsg(ctx), "aborted") != NULL, "message: %s", sl_context_errmsg(ctx));
  /* later operations fail at once, with the same word */
  t0 = now_s();
  s = sl_context_agree(ctx, SL_OK);
  SL_CHILD_CHECK(s != SL_OK && now_s() - t0 < 0.5, "after the abort: %s", sl_status_name(s));
  SL_CHILD_CHECK(strstr(sl_context_errmsg(ctx), "aborted") != NULL, "message: %s", sl_context_errmsg(ctx));
  sl_context_destroy(ctx);
  return 0;
}

/* One rank: nothing to wait for, but an aborted context still agrees on nothing. */
static void test_abort_one_rank(void **state) {
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .world_size = 1};
  sl_context *ctx = NULL;
  assert_int_equal(sl_context_create(&co, &ctx), SL_OK);
  assert_int_equal(sl_context_agree(ctx, SL_OK), SL_OK);
  sl_context_abort(ctx);
  assert_int_equal(sl_context_agree(ctx, SL_OK), SL_ERR_COMM);
  assert_non_null(strstr(sl_context_errmsg(ctx), "aborted"));
  sl_context_destroy(ctx);
  sl_context_abort(NULL); /* a no-op */
}

static void test_abort_ends_control_wait(void **state) {
  char *rdzv = sl_test_rendezvous("abort");
  int codes[2];
  assert_int_equal(sl_test_spawn(2, abort_rank, rdzv, 40000, codes), 0);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  free(rdzv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sim_ranks_choose_simccl),
      cmocka_unit_test(test_shared_device_chooses_gloo),
      cmocka_unit_test(test_shared_device_forced_fails_everywhere),
      cmocka_unit_test(test_mixed_ranks_choose_gloo),
      cmocka_unit_test(test_forced_collective_fails_everywhere),
      cmocka_unit_test(test_forced_collective_runs),
      cmocka_unit_test(test_unknown_collective_fails_everywhere),
      cmocka_unit_test(test_data_init_failure_fails_everywhere),
      cmocka_unit_test(test_ranks_asking_differently_fail),
      cmocka_unit_test(test_one_rank),
      cmocka_unit_test(test_side_context_keeps_numbering),
      cmocka_unit_test(test_device_option),
      cmocka_unit_test(test_abort_one_rank),
      cmocka_unit_test(test_abort_ends_control_wait),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
