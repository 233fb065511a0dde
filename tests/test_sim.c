/* The sim backend as a faithful asynchronous device (docs/DESIGN.md#modules: sim;
 * shardload/module.h, "The asynchronous contract"), driven through its ops table with a host of
 * our own, and what the cpu backend's table holds of its own.
 *
 * What every backend owes the contract (events, streams, stale reads without a wait, sticky
 * errors, copies, casts, pinned and registered memory, extensions, lent memory) is tested by
 * the backend conformance suite (tests/conformance/backend_suite.c), run on sim, sim:strict
 * and cpu among the others. Here is what only sim does, the instruments the core's tests rely
 * on: a host source is read when the copy runs, tasks wait a random delay, strict mode keeps
 * device memory out of the host's reach, failures of enqueued work reach the caller's thread
 * (never through the host from a worker), pageable copies are counted, every wait is bounded by
 * the job's timeout, and freeing memory that queued work uses crashes. Crashes are checked in
 * forked children (the backend is created after the fork: worker threads do not survive one). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

/* ---- a host of our own ---------------------------------------------------------------------- */
typedef struct test_host {
  sl_module_host h;
  pthread_t owner; /* the only thread allowed to report errors through the host */
  int off_thread;  /* fail calls from any other thread (a worker): must stay 0 */
  int fails;
  sl_status last;
  char msg[SL__ERRMSG_LEN];
} test_host;

static test_host th;

static void t_log(void *core, sl_log_level level, const char *fmt, ...) {}

static sl_status t_fail(void *core, sl_status s, const char *fmt, ...) {
  test_host *t = core;
  if (!pthread_equal(pthread_self(), t->owner)) {
    __atomic_add_fetch(&t->off_thread, 1, __ATOMIC_RELAXED);
    return s; /* do not touch the buffer from a foreign thread */
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->msg, sizeof t->msg, fmt, ap);
  va_end(ap);
  t->last = s;
  t->fails++;
  return s;
}

static void host_reset(void) {
  memset(&th, 0, sizeof th);
  th.h = (sl_module_host){sizeof(sl_module_host), &th, t_log, t_fail};
  th.owner = pthread_self();
}

static const sl_backend_ops *sim(void) { return sl__backend_sim(); }

static sl_backend_init init_for(const sl_backend_ops *ops, const char *variant, int local_rank) {
  return (sl_backend_init){.size = sizeof(sl_backend_init), .host = &th.h, .local_rank = local_rank,
                           .local_world_size = 1, .device = -1, .variant = variant, .ops = ops};
}

/* A sim backend with the given variant and task delay (SHARDLOAD_SIM_DELAY_US). */
static void *open_sim(const char *variant, unsigned delay_us) {
  char d[32];
  snprintf(d, sizeof d, "%u", delay_us);
  setenv("SHARDLOAD_SIM_DELAY_US", d, 1);
  host_reset();
  sl_backend_init bi = init_for(sim(), variant, 0);
  void *be = NULL;
  assert_int_equal(sim()->init(&bi, &be), SL_OK);
  assert_non_null(be);
  return be;
}

static void close_sim(void *be) {
  sim()->fini(be);
  assert_int_equal(th.off_thread, 0);
}

static void *dev_alloc(void *be, size_t n) {
  void *p = NULL;
  assert_int_equal(sim()->alloc_device(be, n, &p), SL_OK);
  return p;
}

/* Reads device memory back through the backend (D2H on the default stream, then sync). */
static void read_back(void *be, void *host, const void *dev, size_t n) {
  assert_int_equal(sim()->copy_async(be, host, dev, n, SL_COPY_D2H, NULL), SL_OK);
  assert_int_equal(sim()->stream_sync(be, NULL), SL_OK);
}

/* A task that blocks its stream until the test opens it (bounded: 10 s). */
typedef struct gate {
  pthread_mutex_t m;
  pthread_cond_t c;
  int open;
  int ms; /* > 0: just sleep this long instead */
} gate;

static sl_status gate_fn(void *arg, char *err, size_t errlen) {
  gate *g = arg;
  if (g->ms > 0) {
    struct timespec ts = {g->ms / 1000, (long)(g->ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
    return SL_OK;
  }
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += 10;
  pthread_mutex_lock(&g->m);
  while (!g->open && pthread_cond_timedwait(&g->c, &g->m, &dl) != ETIMEDOUT) {
  }
  pthread_mutex_unlock(&g->m);
  return SL_OK;
}

static void gate_open(gate *g) {
  pthread_mutex_lock(&g->m);
  g->open = 1;
  pthread_cond_broadcast(&g->c);
  pthread_mutex_unlock(&g->m);
}

/* Runs FN in a forked child with default signal dispositions (cmocka's handlers would catch
 * the crash we look for) and its stderr in ERR. Returns the exit code, 128 + the signal that
 * ended it, or -1 when it hung for 30 s (then it is killed). */
static int run_child(int (*fn)(void), char *err, size_t errlen) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);
    signal(SIGBUS, SIG_DFL);
    signal(SIGABRT, SIG_DFL);
    close(fds[0]);
    dup2(fds[1], 2);
    _exit(fn());
  }
  close(fds[1]);
  int status = 0, waited = 0;
  pid_t r;
  while ((r = waitpid(pid, &status, WNOHANG)) == 0 && waited < 3000) {
    usleep(10000);
    waited++;
  }
  if (r == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  ssize_t n = read(fds[0], err, errlen - 1);
  err[n > 0 ? n : 0] = 0;
  close(fds[0]);
  if (r == 0) return -1;
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

/* ---- (a) an h2d reads its host source when it runs ------------------------------------------- */
static void test_h2d_reads_source_when_it_runs(void **state) {
  void *be = open_sim(NULL, 50000); /* up to 50 ms before each task */
  enum { N = 4096 };
  unsigned char *dev = dev_alloc(be, N), host[N], out[N];
  memset(host, 0x11, N);
  /* a gate ahead of the copy makes "not yet run" certain however loaded the machine is */
  gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  assert_int_equal(sim()->launch_host_fn(be, NULL, gate_fn, &g), SL_OK);
  assert_int_equal(sim()->copy_async(be, dev, host, N, SL_COPY_H2D, NULL), SL_OK);
  memset(host, 0x22, N); /* the caller broke the contract: the copy has not run yet */
  gate_open(&g);
  assert_int_equal(sim()->stream_sync(be, NULL), SL_OK);
  read_back(be, out, dev, N);
  assert_true(sl_test_all_bytes(out, N, 0x22));

  /* with the event waited for before the overwrite, the device keeps what was copied */
  void *ev;
  assert_int_equal(sim()->event_create(be, &ev), SL_OK);
  memset(host, 0x33, N);
  assert_int_equal(sim()->copy_async(be, dev, host, N, SL_COPY_H2D, NULL), SL_OK);
  assert_int_equal(sim()->event_record(be, ev, NULL), SL_OK);
  assert_int_equal(sim()->event_sync(be, ev), SL_OK);
  memset(host, 0x44, N);
  read_back(be, out, dev, N);
  assert_true(sl_test_all_bytes(out, N, 0x33));
  sim()->event_destroy(be, ev);
  sim()->free_device(be, dev);
  close_sim(be);
}

/* Each task waits a random 0..D us before it runs (a forgotten wait then reads stale data); with
 * D = 0 nothing sleeps, so thousands of small tasks stay cheap. */
static sl_status noop_fn(void *arg, char *err, size_t errlen) { return SL_OK; }

static double run_noops(unsigned delay_us, int n) {
  void *be = open_sim(NULL, delay_us);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < n; i++) assert_int_equal(sim()->launch_host_fn(be, NULL, noop_fn, NULL), SL_OK);
  assert_int_equal(sim()->stream_sync(be, NULL), SL_OK);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  sl__sim_counters c;
  sl__sim_counters_get(be, &c);
  assert_int_equal(c.tasks, n);
  close_sim(be);
  return (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
}

static void test_tasks_run_after_a_random_delay(void **state) {
  /* 40 tasks of uniform 0..20 ms: 0.4 s on average, 5 standard deviations above 0.2 s */
  double slow = run_noops(20000, 40);
  assert_true(slow > 0.2 && slow < 5.0);
  assert_true(run_noops(0, 5000) < 2.0);
  /* with a floor at the ceiling every task takes the whole 20 ms: 20 tasks, at least 0.4 s */
  setenv("SHARDLOAD_SIM_MIN_DELAY_US", "20000", 1);
  double floor = run_noops(20000, 20);
  unsetenv("SHARDLOAD_SIM_MIN_DELAY_US");
  assert_true(floor >= 0.4 && floor < 5.0);
}

/* The event rule (module.h, Events): an event stands for its last record. A wait queued before
 * a re-record keeps waiting for the record it saw, and is released when that one completes
 * though the new one is still pending; the event itself completes only with the new one. */
typedef struct flag_arg {
  int set;
} flag_arg;
static sl_status set_flag(void *arg, char *err, size_t errlen) {
  __atomic_store_n(&((flag_arg *)arg)->set, 1, __ATOMIC_RELEASE);
  return SL_OK;
}
static bool flag_within(flag_arg *f, int ms) {
  for (int i = 0; i < ms && !__atomic_load_n(&f->set, __ATOMIC_ACQUIRE); i++) usleep(1000);
  return __atomic_load_n(&f->set, __ATOMIC_ACQUIRE);
}

static void test_rerecord_of_a_pending_event(void **state) {
  void *be = open_sim(NULL, 0);
  void *a, *b, *c, *ev;
  assert_int_equal(sim()->stream_create(be, &a), SL_OK);
  assert_int_equal(sim()->stream_create(be, &b), SL_OK);
  assert_int_equal(sim()->stream_create(be, &c), SL_OK);
  assert_int_equal(sim()->event_create(be, &ev), SL_OK);
  gate g1 = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  gate g2 = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  flag_arg first = {0}, second = {0};
  assert_int_equal(sim()->launch_host_fn(be, a, gate_fn, &g1), SL_OK);
  assert_int_equal(sim()->event_record(be, ev, a), SL_OK); /* record 1, pending behind g1 */
  assert_int_equal(sim()->stream_wait_event(be, b, ev), SL_OK); /* sees record 1 */
  assert_int_equal(sim()->launch_host_fn(be, b, set_flag, &first), SL_OK);
  assert_int_equal(sim()->launch_host_fn(be, a, gate_fn, &g2), SL_OK);
  assert_int_equal(sim()->event_record(be, ev, a), SL_OK); /* record 2, while record 1 is pending */
  assert_int_equal(sim()->stream_wait_event(be, c, ev), SL_OK); /* sees record 2 */
  assert_int_equal(sim()->launch_host_fn(be, c, set_flag, &second), SL_OK);
  assert_false(flag_within(&first, 50)); /* record 1 has not completed */
  gate_open(&g1);
  assert_true(flag_within(&first, 10000)); /* released by record 1, record 2 still pending */
  assert_int_equal(sim()->event_query(be, ev), 0);
  assert_false(flag_within(&second, 50));
  gate_open(&g2);
  assert_int_equal(sim()->event_sync(be, ev), SL_OK);
  assert_int_equal(sim()->event_query(be, ev), 1);
  assert_true(flag_within(&second, 10000));
  assert_int_equal(sim()->synchronize(be), SL_OK);
  sim()->event_destroy(be, ev);
  sim()->stream_destroy(be, a);
  sim()->stream_destroy(be, b);
  sim()->stream_destroy(be, c);
  close_sim(be);
}

/* ---- host functions (launch_host_fn) and native handles ---------------------------------------- */
/* A host function runs on a worker, after the work queued before it and before the work after it:
 * it sees what an earlier H2D wrote (through SL_EXT_HOST_ACCESS, which it may call), and a later
 * D2H sees what it wrote. */
typedef struct host_step {
  void *be;
  unsigned char *dev;
  size_t n;
  int saw_old;       /* every byte was 0x11 when it ran */
  pthread_t owner;   /* the caller's thread */
  int on_caller;     /* it ran on the caller's thread */
} host_step;

static sl_status host_step_fn(void *arg, char *err, size_t errlen) {
  host_step *h = arg;
  h->on_caller = pthread_equal(pthread_self(), h->owner);
  sl_ext_host_access_fn access = (sl_ext_host_access_fn)sim()->get_proc(SL_EXT_HOST_ACCESS);
  sl_status st = access(h->be, h->dev, h->n, 1);
  if (st != SL_OK) return st;
  h->saw_old = sl_test_all_bytes(h->dev, h->n, 0x11);
  memset(h->dev, 0x22, h->n);
  return access(h->be, h->dev, h->n, 0);
}

static void test_host_fn_runs_in_stream_order(void **state) {
  void *be = open_sim("strict", 20000); /* tasks wait up to 20 ms: order is not luck */
  enum { N = 4096 };
  unsigned char *dev = dev_alloc(be, N), host[N], out[N];
  memset(host, 0x11, N);
  void *s;
  assert_int_equal(sim()->stream_create(be, &s), SL_OK);
  host_step h = {be, dev, N, 0, pthread_self(), 1};
  assert_int_equal(sim()->copy_async(be, dev, host, N, SL_COPY_H2D, s), SL_OK);
  assert_int_equal(sim()->launch_host_fn(be, s, host_step_fn, &h), SL_OK);
  memset(out, 0, N);
  assert_int_equal(sim()->copy_async(be, out, dev, N, SL_COPY_D2H, s), SL_OK);
  assert_int_equal(sim()->stream_sync(be, s), SL_OK);
  assert_true(h.saw_old);
  assert_false(h.on_caller);
  assert_true(sl_test_all_bytes(out, N, 0x22));
  sim()->stream_destroy(be, s);
  sim()->free_device(be, dev);
  close_sim(be);
}

/* The table names its native API and DLPack types, and SL_EXT_NATIVE_STREAM gives its streams
 * themselves (the default one for NULL), which its native ops take. */
static void test_native_handles(void **state) {
  const sl_backend_ops *o = sim();
  assert_true(SL_HAS_OP(o, native_api));
  assert_string_equal(o->native_api, "sim");
  assert_int_equal(o->dlpack_device_type, 12);
  assert_false(SL_HAS_OP(o, dlpack_pinned_type)); /* plain host memory to a consumer */
  assert_true(SL_HAS_OP(o, launch_host_fn));
  sl_ext_native_stream_fn native = (sl_ext_native_stream_fn)o->get_proc(SL_EXT_NATIVE_STREAM);
  assert_non_null(native);
  assert_non_null(o->get_proc(SL_EXT_HOST_ACCESS));
  assert_null(o->get_proc("sl_ext_no_such_thing"));
  void *be = open_sim(NULL, 0), *s, *ev;
  assert_int_equal(o->stream_create(be, &s), SL_OK);
  assert_ptr_equal(native(be, s), s);
  void *def = native(be, NULL);
  assert_non_null(def);
  assert_ptr_not_equal(def, s);
  assert_int_equal(o->event_create(be, &ev), SL_OK);
  assert_int_equal(o->event_record_native(be, ev, def), SL_OK); /* a live stream of its own */
  assert_int_equal(o->event_sync(be, ev), SL_OK);
  o->event_destroy(be, ev);
  o->stream_destroy(be, s);
  close_sim(be);
}

/* ---- (d) strict mode -------------------------------------------------------------------------- */
static int strict_child(const char *variant) {
  void *be = NULL;
  host_reset();
  setenv("SHARDLOAD_SIM_DELAY_US", "0", 1);
  sl_backend_init bi = init_for(sim(), variant, 0);
  if (sim()->init(&bi, &be) != SL_OK) return 2;
  enum { N = 8192 };
  unsigned char *dev = NULL, host[N], out[N];
  if (sim()->alloc_device(be, N, (void **)&dev) != SL_OK) return 2;
  memset(host, 0x77, N);
  /* the backend's own ops work */
  if (sim()->copy_async(be, dev, host, N, SL_COPY_H2D, NULL) != SL_OK) return 2;
  if (sim()->copy_async(be, out, dev, N, SL_COPY_D2H, NULL) != SL_OK) return 2;
  if (sim()->synchronize(be) != SL_OK || !sl_test_all_bytes(out, N, 0x77)) return 2;
  sl_ext_host_access_fn access = (sl_ext_host_access_fn)sim()->get_proc(SL_EXT_HOST_ACCESS);
  if (!access || access(be, dev, N, 1) != SL_OK || dev[5] != 0x77) return 2; /* opened: readable */
  if (access(be, dev, N, 0) != SL_OK) return 2;
  volatile unsigned char *touch = dev;
  touch[100] = 1; /* the core must never do this */
  return 3;
}
static int strict_child_strict(void) { return strict_child("strict"); }
static int strict_child_plain(void) { return strict_child(NULL); }

static void test_strict_host_touch_crashes(void **state) {
  char err[4096];
  assert_int_equal(run_child(strict_child_strict, err, sizeof err), 128 + SIGSEGV);
  assert_int_equal(run_child(strict_child_plain, err, sizeof err), 3); /* only strict mode crashes */
}

/* Two workers read one device buffer at once: the first to finish must not close it under the
 * other (opens are counted per buffer). */
static int strict_shared_child(void) {
  void *be = NULL;
  host_reset();
  setenv("SHARDLOAD_SIM_DELAY_US", "0", 1);
  sl_backend_init bi = init_for(sim(), "strict", 0);
  if (sim()->init(&bi, &be) != SL_OK) return 2;
  enum { N = 8 << 20, STREAMS = 3, ROUNDS = 20 };
  unsigned char *src = NULL, *dst[STREAMS], *host = malloc(N);
  void *st[STREAMS];
  if (!host || sim()->alloc_device(be, N, (void **)&src) != SL_OK) return 2;
  memset(host, 0x3C, N);
  if (sim()->copy_async(be, src, host, N, SL_COPY_H2D, NULL) != SL_OK || sim()->synchronize(be) != SL_OK) return 2;
  for (int i = 0; i < STREAMS; i++)
    if (sim()->alloc_device(be, N, (void **)&dst[i]) != SL_OK || sim()->stream_create(be, &st[i]) != SL_OK) return 2;
  for (int r = 0; r < ROUNDS; r++)
    for (int i = 0; i < STREAMS; i++)
      if (sim()->copy_async(be, dst[i], src, N, SL_COPY_D2D, st[i]) != SL_OK) return 2;
  if (sim()->synchronize(be) != SL_OK) return 2;
  for (int i = 0; i < STREAMS; i++) {
    memset(host, 0, N);
    if (sim()->copy_async(be, host, dst[i], N, SL_COPY_D2H, NULL) != SL_OK || sim()->synchronize(be) != SL_OK ||
        !sl_test_all_bytes(host, N, 0x3C))
      return 4;
  }
  sim()->fini(be);
  free(host);
  return 0;
}

static void test_strict_concurrent_opens_are_counted(void **state) {
  char err[4096];
  assert_int_equal(run_child(strict_shared_child, err, sizeof err), 0);
}

/* ---- (e) failures of enqueued work: sticky, reported on the caller's thread -------------------- */
static void test_sticky_error_from_worker(void **state) {
  void *be = open_sim(NULL, 1000);
  int32_t *a = dev_alloc(be, 64 * 4);
  float *b = dev_alloc(be, 64 * 4);
  void *ev;
  assert_int_equal(sim()->event_create(be, &ev), SL_OK);
  /* I32 is not castable: the enqueue succeeds (a kernel fails on the device, not at launch) */
  assert_int_equal(sim()->cast_async(be, b, SL_DTYPE_F32, a, SL_DTYPE_I32, 64, NULL), SL_OK);
  assert_int_equal(th.fails, 0);
  assert_int_equal(sim()->event_record(be, ev, NULL), SL_OK);
  /* query never blocks: 0 until the cast ran, then < 0 with the message */
  int q;
  for (int i = 0; i < 2000 && (q = sim()->event_query(be, ev)) == 0; i++) usleep(1000);
  assert_true(q < 0);
  assert_non_null(strstr(th.msg, "sim:0"));
  assert_non_null(strstr(th.msg, "cast_async"));
  assert_non_null(strstr(th.msg, "I32"));
  th.msg[0] = 0;
  assert_int_equal(sim()->stream_sync(be, NULL), SL_ERR_DTYPE);
  assert_non_null(strstr(th.msg, "cannot cast I32 to F32"));
  /* sticky: every later sync says it again */
  th.msg[0] = 0;
  assert_int_equal(sim()->synchronize(be), SL_ERR_DTYPE);
  assert_int_equal(sim()->event_sync(be, ev), SL_ERR_DTYPE);
  assert_non_null(strstr(th.msg, "cannot cast"));
  sim()->event_destroy(be, ev);
  sim()->free_device(be, a);
  sim()->free_device(be, b);
  close_sim(be); /* asserts that no worker called the host */
}

/* A host function's failure (launch_host_fn) is the stream's sticky error, with the message it
 * wrote into ERR, reported on the caller's thread (close_sim: no worker called the host). */
typedef struct failing_task {
  int ran;
} failing_task;
static sl_status failing_fn(void *arg, char *err, size_t errlen) {
  failing_task *f = arg;
  f->ran = 1;
  snprintf(err, errlen, "simccl: rank %d lost during scatterv", 3);
  return SL_ERR_PEER;
}

static void test_task_error_message_reaches_sync(void **state) {
  void *be = open_sim(NULL, 0);
  failing_task f = {0};
  assert_int_equal(sim()->launch_host_fn(be, NULL, failing_fn, &f), SL_OK);
  assert_int_equal(sim()->stream_sync(be, NULL), SL_ERR_PEER);
  assert_int_equal(f.ran, 1);
  assert_string_equal(th.msg, "simccl: rank 3 lost during scatterv");
  th.msg[0] = 0;
  assert_int_equal(sim()->synchronize(be), SL_ERR_PEER); /* sticky */
  assert_non_null(strstr(th.msg, "lost during scatterv"));
  close_sim(be);
}

/* SL_EXT_HOST_ACCESS from inside a host function reports into its ERR, not through the host */
static sl_status bad_access_fn(void *arg, char *err, size_t errlen) {
  static unsigned char not_device[16];
  sl_ext_host_access_fn access = (sl_ext_host_access_fn)sim()->get_proc(SL_EXT_HOST_ACCESS);
  return access(arg, not_device, sizeof not_device, 1);
}

static void test_access_failure_in_task_is_sticky(void **state) {
  void *be = open_sim(NULL, 0);
  assert_int_equal(sim()->launch_host_fn(be, NULL, bad_access_fn, be), SL_OK);
  assert_int_equal(sim()->stream_sync(be, NULL), SL_ERR_BACKEND);
  assert_non_null(strstr(th.msg, "not inside a live device buffer"));
  close_sim(be);
}

/* Checks that can be made at enqueue fail the enqueuing call at once, naming the op and pointer. */
static void test_enqueue_checks_fail_at_once(void **state) {
  void *be = open_sim(NULL, 0);
  unsigned char *dev = dev_alloc(be, 256), host[256] = {0};
  char want[64];
  assert_int_equal(sim()->copy_async(be, host, host + 128, 64, SL_COPY_H2D, NULL), SL_ERR_BACKEND);
  snprintf(want, sizeof want, "%p", (void *)host);
  assert_non_null(strstr(th.msg, "sim:0: copy_async (H2D): destination"));
  assert_non_null(strstr(th.msg, want));
  /* the host side of an h2d is device memory */
  assert_int_equal(sim()->copy_async(be, dev, dev + 128, 64, SL_COPY_H2D, NULL), SL_ERR_BACKEND);
  assert_non_null(strstr(th.msg, "is device memory"));
  /* past the end of the buffer */
  assert_int_equal(sim()->copy_async(be, host, dev + 200, 64, SL_COPY_D2H, NULL), SL_ERR_BACKEND);
  assert_non_null(strstr(th.msg, "source"));
  assert_int_equal(sim()->copy_2d_async(be, dev, 16, host, 16, 32, 2, SL_COPY_H2D, NULL), SL_ERR_INVALID);
  assert_int_equal(sim()->cast_async(be, dev, SL_DTYPE_F32, dev + 8, SL_DTYPE_F32, 8, NULL), SL_ERR_INVALID);
  assert_int_equal(sim()->cast_async(be, dev, SL_DTYPE_F32, host, SL_DTYPE_F32, 8, NULL), SL_ERR_BACKEND);
  /* nothing was queued, nothing is sticky */
  assert_int_equal(sim()->synchronize(be), SL_OK);
  sl__sim_counters c;
  sl__sim_counters_get(be, &c);
  assert_int_equal(c.tasks, 0);
  sim()->free_device(be, dev);
  close_sim(be);
}

/* ---- (f) pageable vs pinned counters ---------------------------------------------------------- */
static void test_pageable_and_pinned_counters(void **state) {
  void *be = open_sim(NULL, 0);
  enum { N = 1000 };
  unsigned char *dev = dev_alloc(be, N), *pinned, *caller = malloc(N), pageable[N];
  assert_int_equal(sim()->alloc_pinned(be, N, (void **)&pinned), SL_OK);
  memset(pageable, 1, N);
  memset(pinned, 2, N);
  memset(caller, 3, N);
  assert_int_equal(sim()->copy_async(be, dev, pageable, N, SL_COPY_H2D, NULL), SL_OK);
  assert_int_equal(sim()->copy_async(be, dev, pinned, N, SL_COPY_H2D, NULL), SL_OK);
  assert_int_equal(sim()->register_host(be, caller, N), SL_OK);
  assert_int_equal(sl__sim_query(be, caller + 10), SL__SIM_PINNED);
  assert_int_equal(sim()->copy_async(be, dev, caller, N, SL_COPY_H2D, NULL), SL_OK);
  assert_int_equal(sim()->copy_async(be, caller, dev, N, SL_COPY_D2H, NULL), SL_OK);
  assert_int_equal(sim()->copy_async(be, pageable, dev, N / 2, SL_COPY_D2H, NULL), SL_OK);
  assert_int_equal(sim()->copy_2d_async(be, dev, 100, pinned, 50, 10, 7, SL_COPY_H2D, NULL), SL_OK);
  assert_int_equal(sim()->copy_async(be, dev + 500, dev, 100, SL_COPY_D2D, NULL), SL_OK);
  assert_int_equal(sim()->synchronize(be), SL_OK);
  sl__sim_counters c;
  sl__sim_counters_get(be, &c);
  assert_int_equal(c.h2d, 3 * N + 70);
  assert_int_equal(c.h2d_pageable, N);
  assert_int_equal(c.d2h, N + N / 2);
  assert_int_equal(c.d2h_pageable, N / 2);
  assert_int_equal(c.d2d, 100);
  assert_int_equal(c.tasks, 7);
  uint64_t h2d, d2h;
  ((sl_ext_traffic_fn)sim()->get_proc(SL_EXT_TRAFFIC))(be, &h2d, &d2h);
  assert_int_equal(h2d, c.h2d);
  assert_int_equal(d2h, c.d2h);
  /* unregistered, the caller's range is pageable again; overlapping or empty ranges are refused */
  assert_int_equal(sim()->register_host(be, caller + 10, 10), SL_ERR_INVALID);
  assert_non_null(strstr(th.msg, "overlaps the registered range"));
  assert_int_equal(sim()->register_host(be, pageable, 0), SL_ERR_INVALID);
  sim()->unregister_host(be, caller);
  assert_int_equal(sl__sim_query(be, caller), SL__SIM_NONE);
  assert_int_equal(sim()->copy_async(be, dev, caller, N, SL_COPY_H2D, NULL), SL_OK);
  assert_int_equal(sim()->synchronize(be), SL_OK);
  sl__sim_counters_get(be, &c);
  assert_int_equal(c.h2d_pageable, 2 * N);
  sim()->free_pinned(be, pinned);
  sim()->free_device(be, dev);
  free(caller);
  close_sim(be);
}

/* ---- (g) freeing memory that queued work uses is a core bug ------------------------------------ */
enum { VICTIM_DEVICE, VICTIM_PINNED, VICTIM_REGISTERED, VICTIM_EVENT, VICTIM_NONE };
static int victim;

static int free_pending_child(void) {
  void *be = NULL;
  host_reset();
  setenv("SHARDLOAD_SIM_DELAY_US", "0", 1);
  sl_backend_init bi = init_for(sim(), NULL, 0);
  if (sim()->init(&bi, &be) != SL_OK) return 2;
  static unsigned char caller[4096];
  unsigned char *dev = NULL, *pinned = NULL;
  void *ev = NULL;
  if (sim()->alloc_device(be, 4096, (void **)&dev) != SL_OK || sim()->alloc_pinned(be, 4096, (void **)&pinned) != SL_OK ||
      sim()->register_host(be, caller, sizeof caller) != SL_OK || sim()->event_create(be, &ev) != SL_OK)
    return 2;
  gate slow = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 200};
  sim()->launch_host_fn(be, NULL, gate_fn, &slow);
  sim()->copy_async(be, dev, pinned, 4096, SL_COPY_H2D, NULL);
  sim()->copy_async(be, caller, dev, 4096, SL_COPY_D2H, NULL);
  sim()->event_record(be, ev, NULL);
  switch (victim) {
    case VICTIM_DEVICE: sim()->free_device(be, dev); break;
    case VICTIM_PINNED: sim()->free_pinned(be, pinned); break;
    case VICTIM_REGISTERED: sim()->unregister_host(be, caller); break;
    case VICTIM_EVENT: sim()->event_destroy(be, ev); break;
    default: /* the correct order: wait, then free */
      if (sim()->event_sync(be, ev) != SL_OK) return 2;
      sim()->free_device(be, dev);
      sim()->free_pinned(be, pinned);
      sim()->unregister_host(be, caller);
      sim()->event_destroy(be, ev);
      sim()->fini(be);
      return 0;
  }
  return 3;
}

static void test_free_with_pending_work_aborts(void **state) {
  const char *ops[] = {"free_device", "free_pinned", "unregister_host", "event_destroy"};
  char err[4096];
  for (victim = VICTIM_DEVICE; victim <= VICTIM_EVENT; victim++) {
    assert_int_equal(run_child(free_pending_child, err, sizeof err), 128 + SIGABRT);
    assert_non_null(strstr(err, ops[victim]));
    assert_non_null(strstr(err, "sim:0"));
  }
  victim = VICTIM_NONE;
  assert_int_equal(run_child(free_pending_child, err, sizeof err), 0);
}

/* ---- (h) fini with queued work drains it; leaked memory is released --------------------------- */
static void test_fini_drains_queued_work(void **state) {
  void *be = open_sim(NULL, 100);
  enum { PAIRS = 300, N = 512 };
  unsigned char *in = malloc(PAIRS * N), *out = calloc(PAIRS, N);
  unsigned char *dev = dev_alloc(be, PAIRS * N);
  void *s2, *ev;
  assert_int_equal(sim()->stream_create(be, &s2), SL_OK);
  assert_int_equal(sim()->event_create(be, &ev), SL_OK);
  for (size_t i = 0; i < PAIRS * N; i++) in[i] = (unsigned char)(i * 7 + 1);
  for (int p = 0; p < PAIRS; p++) {
    void *s = p % 2 ? s2 : NULL;
    assert_int_equal(sim()->copy_async(be, dev + p * N, in + p * N, N, SL_COPY_H2D, s), SL_OK);
    assert_int_equal(sim()->copy_async(be, out + p * N, dev + p * N, N, SL_COPY_D2H, s), SL_OK);
  }
  assert_int_equal(sim()->event_record(be, ev, s2), SL_OK);
  /* no sync, no free, no destroy: fini must finish the work and release it all */
  sim()->fini(be);
  assert_memory_equal(out, in, PAIRS * N);
  assert_int_equal(th.off_thread, 0);
  free(in);
  free(out);
}

/* ---- bounded waits ----------------------------------------------------------------------------- */
/* A sim backend whose job timeout is TIMEOUT_MS (sl_backend_init.timeout_ms). */
static void *open_sim_timeout(unsigned delay_us, int timeout_ms) {
  char d[32];
  snprintf(d, sizeof d, "%u", delay_us);
  setenv("SHARDLOAD_SIM_DELAY_US", d, 1);
  host_reset();
  sl_backend_init bi = init_for(sim(), NULL, 0);
  bi.timeout_ms = timeout_ms;
  void *be = NULL;
  assert_int_equal(sim()->init(&bi, &be), SL_OK);
  return be;
}

static double secs_since(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

/* A stream waiting for an event whose producer is stuck gives up after the job's timeout and
 * its grace (1000 ms + 1000 ms): a sticky SL_ERR_TIMEOUT naming the wait and the timeout. */
static void test_wait_is_bounded(void **state) {
  void *be = open_sim_timeout(0, 1000);
  void *ps, *ev;
  assert_int_equal(sim()->stream_create(be, &ps), SL_OK);
  assert_int_equal(sim()->event_create(be, &ev), SL_OK);
  gate stuck = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0}; /* a stuck producer */
  assert_int_equal(sim()->launch_host_fn(be, ps, gate_fn, &stuck), SL_OK);
  assert_int_equal(sim()->event_record(be, ev, ps), SL_OK);
  assert_int_equal(sim()->stream_wait_event(be, NULL, ev), SL_OK);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  /* the stream's own wait is what gives up: watch it without a bounded wait of the caller's */
  while (sim()->event_query(be, ev) == 0 && secs_since(&t0) < 5.0) usleep(10 * 1000);
  double secs = secs_since(&t0);
  assert_true(secs >= 1.9 && secs < 3.5); /* gave up after the bound, before the producer ended */
  assert_non_null(strstr(th.msg, "stream_wait_event"));
  assert_non_null(strstr(th.msg, "did not complete within 2000 ms (the job's timeout of 1000 ms"));
  assert_int_equal(th.last, SL_ERR_TIMEOUT);
  assert_int_equal(sim()->stream_sync(be, NULL), SL_ERR_TIMEOUT);
  gate_open(&stuck); /* the producer ends: everything drains, the failure stays */
  assert_int_equal(sim()->synchronize(be), SL_ERR_TIMEOUT);
  sim()->event_destroy(be, ev);
  sim()->stream_destroy(be, ps);
  close_sim(be);
}

/* A very slow simulated device (every task waits up to 10 s): each of the caller's waits
 * (event_sync, stream_sync, synchronize) gives up after the job's timeout and its grace, with
 * SL_ERR_TIMEOUT naming the wait and the timeout, and not after the device's 50-odd seconds of
 * queued work. The failure is sticky: what is still queued drains at once, so the waits after
 * it, stream destruction and fini end promptly too. */
static void test_syncs_bounded_by_the_timeout(void **state) {
  static const char *const waits[] = {"event_sync", "stream_sync", "synchronize"};
  for (int w = 0; w < 3; w++) {
    void *be = open_sim_timeout(10000000, 1000);
    enum { N = 64, TASKS = 10 };
    unsigned char *dev = dev_alloc(be, N), in[N];
    memset(in, 0x5A, N);
    void *q, *ev;
    assert_int_equal(sim()->stream_create(be, &q), SL_OK);
    assert_int_equal(sim()->event_create(be, &ev), SL_OK);
    for (int i = 0; i < TASKS; i++) assert_int_equal(sim()->copy_async(be, dev, in, N, SL_COPY_H2D, q), SL_OK);
    assert_int_equal(sim()->event_record(be, ev, q), SL_OK);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sl_status st = w == 0 ? sim()->event_sync(be, ev) : w == 1 ? sim()->stream_sync(be, q) : sim()->synchronize(be);
    double secs = secs_since(&t0);
    fprintf(stderr, "%s on a slow device: %s after %.2f s: %s\n", waits[w], sl_status_name(st), secs, th.msg);
    assert_int_equal(st, SL_ERR_TIMEOUT);
    assert_true(secs >= 1.9 && secs < 4.0);
    assert_non_null(strstr(th.msg, waits[w]));
    assert_non_null(strstr(th.msg, "within 2000 ms (the job's timeout of 1000 ms"));
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(sim()->synchronize(be), SL_ERR_TIMEOUT); /* drained, the failure kept */
    assert_int_equal(sim()->event_sync(be, ev), SL_ERR_TIMEOUT);
    sim()->event_destroy(be, ev);
    sim()->stream_destroy(be, q);
    sim()->free_device(be, dev);
    close_sim(be);
    secs = secs_since(&t0);
    assert_true(secs < 1.5);
  }
  unsetenv("SHARDLOAD_SIM_DELAY_US");
}

/* ---- the SGD instrument under strict access -------------------------------------------------- */
/* (Its arithmetic, the 2-D copies, casts and the event pipeline are conformance cases,
 * tests/conformance/backend_suite.c, run on sim and sim:strict.) Strict mode refuses a gradient in
 * host memory: the instrument steps device memory only. */
static void test_sgd_refuses_host_memory(void **state) {
  void *be = open_sim("strict", 20);
  sl_ext_sgd_step_fn sgd = (sl_ext_sgd_step_fn)sim()->get_proc(SL_EXT_SGD_STEP);
  assert_non_null(sgd);
  float x[4] = {1, 2, 3, 4}, g[4] = {10, 10, 10, 10}, r[4];
  float *dx = dev_alloc(be, sizeof x), *dg = dev_alloc(be, sizeof g);
  assert_int_equal(sim()->copy_async(be, dx, x, sizeof x, SL_COPY_H2D, NULL), SL_OK);
  assert_int_equal(sim()->copy_async(be, dg, g, sizeof g, SL_COPY_H2D, NULL), SL_OK);
  assert_int_equal(sgd(be, dx, dg, SL_DTYPE_F32, 4, 0.5f), SL_OK);
  read_back(be, r, dx, sizeof r);
  assert_true(r[0] == -4 && r[3] == -1);
  assert_int_equal(sgd(be, dx, x, SL_DTYPE_F32, 4, 0.5f), SL_ERR_BACKEND); /* g is host memory */
  sim()->free_device(be, dx);
  sim()->free_device(be, dg);
  close_sim(be);
}

/* ---- the table, variants, description ------------------------------------------------------------ */
static void test_sim_table_and_variants(void **state) {
  const sl_backend_ops *o = sim();
  assert_int_equal(o->abi_version, SL_BACKEND_ABI_VERSION);
  assert_string_equal(o->preferred_collective, "simccl");
  assert_true(o->flags & SL_BACKEND_HAS_PINNED);
  char reason[128] = "";
  assert_int_equal(o->probe(reason, sizeof reason), 0); /* never picked by "auto" */
  assert_non_null(strstr(reason, "sim"));

  host_reset();
  void *be = NULL;
  sl_backend_init bi = init_for(sim(), "fast", 0);
  assert_int_equal(o->init(&bi, &be), SL_ERR_INVALID);
  assert_non_null(strstr(th.msg, "'fast'"));
  setenv("SHARDLOAD_SIM_DELAY_US", "soon", 1);
  bi.variant = NULL;
  assert_int_equal(o->init(&bi, &be), SL_ERR_INVALID);
  assert_non_null(strstr(th.msg, "SHARDLOAD_SIM_DELAY_US='soon'"));
  setenv("SHARDLOAD_SIM_DELAY_US", "100", 1); /* a floor above the ceiling */
  setenv("SHARDLOAD_SIM_MIN_DELAY_US", "101", 1);
  host_reset();
  assert_int_equal(o->init(&bi, &be), SL_ERR_INVALID);
  assert_non_null(strstr(th.msg, "SHARDLOAD_SIM_MIN_DELAY_US='101' is not a number from 0 to 100"));
  setenv("SHARDLOAD_SIM_MIN_DELAY_US", "50", 1);
  host_reset();
  assert_int_equal(o->init(&bi, &be), SL_OK);
  char dd[256];
  o->describe(be, dd, sizeof dd);
  assert_string_equal(dd, "sim:0 (simulated accelerator, async, delay 50..100 us)");
  close_sim(be);
  unsetenv("SHARDLOAD_SIM_MIN_DELAY_US");

  be = open_sim("strict", 35);
  char d[256];
  o->describe(be, d, sizeof d);
  assert_string_equal(d, "sim:0 (simulated accelerator, async, delay <= 35 us, strict)");
  assert_int_equal(o->device_ordinal(be), 0);
  close_sim(be);
  setenv("SHARDLOAD_SIM_DELAY_US", "0", 1);
  host_reset();
  bi = init_for(sim(), NULL, 3);
  assert_int_equal(o->init(&bi, &be), SL_OK);
  o->describe(be, d, sizeof d);
  assert_string_equal(d, "sim:3 (simulated accelerator, async, delay <= 0 us)");
  assert_int_equal(o->device_ordinal(be), 3);
  close_sim(be);
}

/* ---- the cpu backend: what is its own ------------------------------------------------------------ */
/* (Its ops against the contract are conformance cases, tests/conformance/backend_suite.c.) */
static void test_cpu_backend_v2(void **state) {
  const sl_backend_ops *o = sl__backend_cpu();
  assert_int_equal(o->abi_version, SL_BACKEND_ABI_VERSION);
  assert_string_equal(o->preferred_collective, "gloo");
  assert_true(o->flags & SL_BACKEND_DEVICE_IS_HOST);
  assert_false(o->flags & SL_BACKEND_HAS_PINNED);
  assert_int_equal(o->probe(NULL, 0), 1);
  host_reset();
  void *be = NULL;
  sl_backend_init bi = init_for(o, "strict", 0);
  assert_int_equal(o->init(&bi, &be), SL_ERR_INVALID);
  bi.variant = NULL;
  assert_int_equal(o->init(&bi, &be), SL_OK);
  assert_int_equal(o->device_ordinal(be), 0);
  float src[2] = {1, 2}, dev[2];
  assert_int_equal(o->cast_async(be, dev, SL_DTYPE_I32, src, SL_DTYPE_F32, 2, NULL), SL_ERR_DTYPE);
  assert_non_null(strstr(th.msg, "cpu backend: cannot cast F32 to I32"));
  assert_non_null(o->get_proc(SL_EXT_SGD_STEP));
  assert_null(o->get_proc(SL_EXT_TRAFFIC)); /* it copies nothing it could count */
  o->fini(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_h2d_reads_source_when_it_runs),
      cmocka_unit_test(test_tasks_run_after_a_random_delay),
      cmocka_unit_test(test_rerecord_of_a_pending_event),
      cmocka_unit_test(test_host_fn_runs_in_stream_order),
      cmocka_unit_test(test_native_handles),
      cmocka_unit_test(test_strict_host_touch_crashes),
      cmocka_unit_test(test_strict_concurrent_opens_are_counted),
      cmocka_unit_test(test_sticky_error_from_worker),
      cmocka_unit_test(test_task_error_message_reaches_sync),
      cmocka_unit_test(test_access_failure_in_task_is_sticky),
      cmocka_unit_test(test_enqueue_checks_fail_at_once),
      cmocka_unit_test(test_pageable_and_pinned_counters),
      cmocka_unit_test(test_free_with_pending_work_aborts),
      cmocka_unit_test(test_fini_drains_queued_work),
      cmocka_unit_test(test_wait_is_bounded),
      cmocka_unit_test(test_syncs_bounded_by_the_timeout),
      cmocka_unit_test(test_sgd_refuses_host_memory),
      cmocka_unit_test(test_sim_table_and_variants),
      cmocka_unit_test(test_cpu_backend_v2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
