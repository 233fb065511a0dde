/* Lending loaded tensors to a consumer (sl_state_export / sl_export_release; shardload.h, the
 * DLPack export of the Python package): the free of exported device memory is ordered after the
 * work the consumer queued on its own stream, and never blocks the thread that releases.
 *
 * The sim backend is the proof: the consumer is a sim stream held shut by a gate, with a copy of
 * the exported memory queued behind it, and the export and the state are released while that
 * copy is still pending. sim aborts when memory is freed under queued work, so a free that did
 * not wait crashes the child; a right one leaves the copy to read the loaded bytes once the gate
 * opens, and frees the buffer after it. Each scenario runs in a forked child (sim's worker
 * threads do not survive a fork, so the context is made there), whose exit code or signal the
 * parent checks. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#include "internal.h"
#include "loader.h"

static char *dir, *ckpt;

#define W_ROWS 64
#define W_COLS 256 /* "w": F32 [64, 256], 64 KiB */
static const sl_test_tensor tensors[] = {
    {"w", "F32", 2, {W_ROWS, W_COLS}, NULL},
    {"b", "F32", 1, {16}, NULL},
};

static int setup(void **state) {
  dir = sl_test_dir("export");
  ckpt = sl_test_path(dir, "model.safetensors");
  return sl_test_write_st(ckpt, tensors, 2, NULL);
}

static int teardown(void **state) {
  free(ckpt);
  free(dir);
  return 0;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Whether the N bytes at P are tensor NAME's bytes as written to the file. */
static int file_bytes(const char *name, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != sl_test_pattern_byte(name, i)) return 0;
  return 1;
}

/* ---- a consumer stream that the test holds shut ---------------------------------------------- */
typedef struct gate {
  pthread_mutex_t m;
  pthread_cond_t c;
  int open;
  int after_ms; /* > 0: a thread of the test opens it after this long */
} gate;

/* A host function of the backend's (launch_host_fn) that holds its stream until the gate opens. */
static sl_status gate_fn(void *arg, char *err, size_t errlen) {
  gate *g = arg;
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += 20; /* bounded, so a broken test ends */
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

static void *gate_opener(void *arg) {
  gate *g = arg;
  usleep((useconds_t)g->after_ms * 1000);
  gate_open(g);
  return NULL;
}

/* A consumer: its own stream, shut by a gate until the test opens it. */
typedef struct consumer {
  void *stream;
  gate g;
  unsigned char *host;
} consumer;

static int consumer_open(sl_context *ctx, consumer *c) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->g.m, NULL);
  pthread_cond_init(&c->g.c, NULL);
  SL_CHILD_CHECK(ctx->be->stream_create(ctx->be_ctx, &c->stream) == SL_OK, "stream_create: %s", sl_context_errmsg(ctx));
  SL_CHILD_CHECK(ctx->be->launch_host_fn(ctx->be_ctx, c->stream, gate_fn, &c->g) == SL_OK, "gate");
  return 0;
}

/* The consumer's use of the lent memory: a copy of NBYTES of DEV to the host, queued behind
 * the gate (a kernel of the consumer's, still pending when it lets the tensor go). */
static int consumer_use(sl_context *ctx, consumer *c, const void *dev, size_t nbytes) {
  c->host = malloc(nbytes);
  SL_CHILD_CHECK(c->host, "out of memory");
  memset(c->host, 0xEE, nbytes);
  SL_CHILD_CHECK(ctx->be->copy_async(ctx->be_ctx, c->host, dev, nbytes, SL_COPY_D2H, c->stream) == SL_OK,
                 "the consumer's copy: %s", sl_context_errmsg(ctx));
  return 0;
}

static int open_ctx(const char *backend, sl_context **ctx, sl_source **src, sl_plan **plan) {
  sl_context_options co = {.size = sizeof co, .backend = backend, .world_size = 1};
  SL_CHILD_CHECK(sl_context_create(&co, ctx) == SL_OK, "context %s", backend);
  SL_CHILD_CHECK(sl_source_open(*ctx, ckpt, src) == SL_OK, "open: %s", sl_context_errmsg(*ctx));
  SL_CHILD_CHECK(sl_plan_create(*ctx, plan) == SL_OK, "plan");
  return 0;
}

/* Runs FN in a forked child with default signal dispositions and its stderr in ERR. Returns
 * the exit code, 128 + the signal that ended it, or -1 when it hung for 60 s (then killed). */
static int run_child(int (*fn)(void), char *err, size_t errlen) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);
    signal(SIGABRT, SIG_DFL);
    close(fds[0]);
    dup2(fds[1], 2);
    _exit(fn());
  }
  close(fds[1]);
  int status = 0, waited = 0;
  pid_t r;
  while ((r = waitpid(pid, &status, WNOHANG)) == 0 && waited < 6000) {
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

static void expect_child_ok(int (*fn)(void)) {
  char err[8192];
  int rc = run_child(fn, err, sizeof err);
  if (rc != 0) fprintf(stderr, "child exited %d:\n%s\n", rc, err);
  assert_int_equal(rc, 0);
}

/* ---- (a) the release waits, on the device, for the consumer's pending work ---------------------- */
static const char *scenario_backend = "sim";
static int destroy_first; /* the state goes before the export: the release drops the last reference */

static int release_with_pending_work(void) {
  sl_context *ctx;
  sl_source *src;
  sl_plan *plan;
  if (open_ctx(scenario_backend, &ctx, &src, &plan)) return 1;
  sl_state *st = NULL;
  SL_CHILD_CHECK(sl_load(ctx, plan, src, NULL, &st) == SL_OK, "load: %s", sl_context_errmsg(ctx));
  const sl_tensor *t = sl_state_find(st, "w");
  SL_CHILD_CHECK(t && t->device == SL_DEVICE_ACCELERATOR, "w on the device");
  SL_CHILD_CHECK(sl__sim_query(ctx->be_ctx, t->data) == SL__SIM_DEVICE, "w in sim device memory");
  void *data = t->data;
  size_t nbytes = (size_t)t->nbytes;
  consumer c;
  if (consumer_open(ctx, &c)) return 1;
  char err[512] = "";
  sl_export_options eo = {.size = sizeof eo, .stream = c.stream, .errbuf = err, .errbuf_size = sizeof err};
  sl_export *ex = NULL;
  SL_CHILD_CHECK(sl_state_export(st, 0, &eo, &ex) == SL_OK, "export: %s", err);
  SL_CHILD_CHECK(sl_export_tensor(ex) == t, "the export lends tensor 0");
  if (consumer_use(ctx, &c, data, nbytes)) return 1;
  /* the consumer lets the tensor go with its copy still queued; the owner drops the state */
  double t0 = now_s();
  if (destroy_first) {
    sl_state_destroy(st);
    SL_CHILD_CHECK(sl__sim_query(ctx->be_ctx, data) == SL__SIM_DEVICE, "a live export keeps the memory");
    sl_export_release(ex);
  } else {
    sl_export_release(ex);
    SL_CHILD_CHECK(sl__sim_query(ctx->be_ctx, data) == SL__SIM_DEVICE, "the state keeps the memory");
    sl_state_destroy(st);
  }
  double took = now_s() - t0;
  /* nothing waited on this thread: the gate is still shut (a wait here would have timed out) */
  SL_CHILD_CHECK(took < 2.0, "the release blocked for %.2f s", took);
  SL_CHILD_CHECK(sl__sim_query(ctx->be_ctx, data) == SL__SIM_DEVICE, "the free waits for the consumer");
  /* the consumer may not queue new work on what it released */
  unsigned char late[16];
  SL_CHILD_CHECK(ctx->be->copy_async(ctx->be_ctx, late, data, sizeof late, SL_COPY_D2H, c.stream) != SL_OK,
                 "work queued on released memory was taken");
  SL_CHILD_CHECK(strstr(sl_context_errmsg(ctx), "released"), "message: %s", sl_context_errmsg(ctx));
  gate_open(&c.g);
  SL_CHILD_CHECK(ctx->be->stream_sync(ctx->be_ctx, c.stream) == SL_OK, "consumer: %s", sl_context_errmsg(ctx));
  SL_CHILD_CHECK(file_bytes("w", c.host, nbytes), "the consumer read the loaded bytes after the release");
  SL_CHILD_CHECK(ctx->be->synchronize(ctx->be_ctx) == SL_OK, "synchronize: %s", sl_context_errmsg(ctx));
  SL_CHILD_CHECK(sl__sim_query(ctx->be_ctx, data) == SL__SIM_NONE, "freed once the consumer's work ran");
  ctx->be->stream_destroy(ctx->be_ctx, c.stream);
  free(c.host);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_release_waits_for_the_consumer(void **state) {
  const char *backends[] = {"sim", "sim:strict"};
  for (size_t b = 0; b < 2; b++)
    for (destroy_first = 0; destroy_first < 2; destroy_first++) {
      scenario_backend = backends[b];
      expect_child_ok(release_with_pending_work);
    }
  scenario_backend = "sim";
  destroy_first = 0;
}

/* ---- (b) two consumers on two streams, released in turn ----------------------------------- */
static int two_consumers(void) {
  sl_context *ctx;
  sl_source *src;
  sl_plan *plan;
  if (open_ctx("sim", &ctx, &src, &plan)) return 1;
  sl_state *st = NULL;
  SL_CHILD_CHECK(sl_load(ctx, plan, src, NULL, &st) == SL_OK, "load: %s", sl_context_errmsg(ctx));
  const sl_tensor *w = sl_state_tensor(st, 0), *b = sl_state_tensor(st, 1);
  void *wd = w->data, *bd = b->data;
  size_t wn = (size_t)w->nbytes, bn = (size_t)b->nbytes;
  consumer c1, c2;
  if (consumer_open(ctx, &c1) || consumer_open(ctx, &c2)) return 1;
  sl_export *e1, *e2, *e3;
  sl_export_options o1 = {.size = sizeof o1, .stream = c1.stream}, o2 = {.size = sizeof o2, .stream = c2.stream};
  SL_CHILD_CHECK(sl_state_export(st, 0, &o1, &e1) == SL_OK, "export w");
  SL_CHILD_CHECK(sl_state_export(st, 1, &o2, &e2) == SL_OK, "export b");
  SL_CHILD_CHECK(sl_state_export(st, 0, NULL, &e3) == SL_OK, "export w again, on the default stream");
  if (consumer_use(ctx, &c1, wd, wn) || consumer_use(ctx, &c2, bd, bn)) return 1;
  sl_export_release(e3);
  sl_export_release(e1);
  sl_state_destroy(st);
  sl_export_release(e2);
  void *be = ctx->be_ctx;
  SL_CHILD_CHECK(sl__sim_query(be, wd) == SL__SIM_DEVICE && sl__sim_query(be, bd) == SL__SIM_DEVICE,
                 "both buffers wait for both consumers");
  gate_open(&c1.g);
  SL_CHILD_CHECK(ctx->be->stream_sync(be, c1.stream) == SL_OK, "consumer 1");
  SL_CHILD_CHECK(file_bytes("w", c1.host, wn), "consumer 1 read w");
  /* consumer 2 still holds its gate: one free behind both consumers, so nothing went yet */
  SL_CHILD_CHECK(sl__sim_query(be, bd) == SL__SIM_DEVICE, "b waits for consumer 2");
  gate_open(&c2.g);
  SL_CHILD_CHECK(ctx->be->stream_sync(be, c2.stream) == SL_OK, "consumer 2");
  SL_CHILD_CHECK(file_bytes("b", c2.host, bn), "consumer 2 read b");
  SL_CHILD_CHECK(ctx->be->synchronize(be) == SL_OK, "synchronize: %s", sl_context_errmsg(ctx));
  SL_CHILD_CHECK(sl__sim_query(be, wd) == SL__SIM_NONE && sl__sim_query(be, bd) == SL__SIM_NONE, "both freed");
  ctx->be->stream_destroy(be, c1.stream);
  ctx->be->stream_destroy(be, c2.stream);
  free(c1.host);
  free(c2.host);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_two_consumers(void **state) { expect_child_ok(two_consumers); }

/* The context goes first, then the state: the export's release drops the backend's last
 * reference, and its free is still queued behind the consumer (on sim the backend's last
 * reference then drains every stream before fini, the consumer's too, so the gate opens from a
 * thread of the test). */
static int context_gone_first(void) {
  sl_context *ctx;
  sl_source *src;
  sl_plan *plan;
  if (open_ctx("sim", &ctx, &src, &plan)) return 1;
  sl_state *st = NULL;
  SL_CHILD_CHECK(sl_load(ctx, plan, src, NULL, &st) == SL_OK, "load: %s", sl_context_errmsg(ctx));
  const sl_tensor *w = sl_state_tensor(st, 0);
  size_t wn = (size_t)w->nbytes;
  consumer c;
  if (consumer_open(ctx, &c)) return 1;
  sl_export_options eo = {.size = sizeof eo, .stream = c.stream};
  sl_export *ex;
  SL_CHILD_CHECK(sl_state_export(st, 0, &eo, &ex) == SL_OK, "export w");
  if (consumer_use(ctx, &c, w->data, wn)) return 1;
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  sl_state_destroy(st);
  c.g.after_ms = 300;
  pthread_t opener;
  SL_CHILD_CHECK(pthread_create(&opener, NULL, gate_opener, &c.g) == 0, "thread");
  sl_export_release(ex); /* the last reference of all: frees, then finalises the backend */
  pthread_join(opener, NULL);
  SL_CHILD_CHECK(file_bytes("w", c.host, wn), "the consumer read w before the backend went");
  free(c.host);
  return 0;
}

static void test_context_gone_first(void **state) { expect_child_ok(context_gone_first); }

/* ---- one export per training step: the fences stay bounded ---------------------------------- */
/* A state lent again and again (to_torch() once per step), each consumer's work done before the
 * next step: the fences of completed work go at the next release, so the list (an event each)
 * does not grow with the steps. The last step's work is still pending at the end: its fence
 * stays and the free still waits for it. */
static int fences_stay_bounded(void) {
  enum { STEPS = 2000 };
  sl_context *ctx;
  sl_source *src;
  sl_plan *plan;
  if (open_ctx("sim", &ctx, &src, &plan)) return 1;
  sl_state *st = NULL;
  SL_CHILD_CHECK(sl_load(ctx, plan, src, NULL, &st) == SL_OK, "load: %s", sl_context_errmsg(ctx));
  const sl_tensor *w = sl_state_tensor(st, 0);
  void *wd = w->data;
  size_t wn = (size_t)w->nbytes, most = 0;
  void *stream;
  SL_CHILD_CHECK(ctx->be->stream_create(ctx->be_ctx, &stream) == SL_OK, "stream_create");
  sl_export_options eo = {.size = sizeof eo, .stream = stream};
  unsigned char head[16];
  for (int i = 0; i < STEPS; i++) {
    sl_export *ex;
    SL_CHILD_CHECK(sl_state_export(st, 0, &eo, &ex) == SL_OK, "step %d: export", i);
    SL_CHILD_CHECK(ctx->be->copy_async(ctx->be_ctx, head, wd, sizeof head, SL_COPY_D2H, stream) == SL_OK,
                   "step %d: the consumer's read", i);
    sl_export_release(ex);
    SL_CHILD_CHECK(ctx->be->stream_sync(ctx->be_ctx, stream) == SL_OK, "step %d: %s", i, sl_context_errmsg(ctx));
    size_t n = sl__state_fence_count(st);
    if (n > most) most = n;
  }
  SL_CHILD_CHECK(most <= 2, "%d released exports left %zu fences (events) on the state at once", STEPS, most);
  SL_CHILD_CHECK(file_bytes("w", head, sizeof head), "the consumer read w");
  /* the last consumer's work still pending at its release: ordered as ever */
  consumer c;
  if (consumer_open(ctx, &c)) return 1;
  sl_export_options co = {.size = sizeof co, .stream = c.stream};
  sl_export *ex;
  SL_CHILD_CHECK(sl_state_export(st, 0, &co, &ex) == SL_OK, "export w");
  if (consumer_use(ctx, &c, wd, wn)) return 1;
  sl_export_release(ex);
  sl_state_destroy(st);
  SL_CHILD_CHECK(sl__sim_query(ctx->be_ctx, wd) == SL__SIM_DEVICE, "the free waits for the pending consumer");
  gate_open(&c.g);
  SL_CHILD_CHECK(ctx->be->stream_sync(ctx->be_ctx, c.stream) == SL_OK, "consumer: %s", sl_context_errmsg(ctx));
  SL_CHILD_CHECK(file_bytes("w", c.host, wn), "the pending consumer read w");
  SL_CHILD_CHECK(ctx->be->synchronize(ctx->be_ctx) == SL_OK, "synchronize: %s", sl_context_errmsg(ctx));
  SL_CHILD_CHECK(sl__sim_query(ctx->be_ctx, wd) == SL__SIM_NONE, "freed once it ran");
  ctx->be->stream_destroy(ctx->be_ctx, stream);
  ctx->be->stream_destroy(ctx->be_ctx, c.stream);
  free(c.host);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_fences_stay_bounded(void **state) { expect_child_ok(fences_stay_bounded); }

/* ---- a release that logs on its own thread while the context goes -------------------------- */
/* The consumer's stream is refused at release (a record that fails, as a destroyed stream's
 * would), so the release logs its warning through the backend's host on the releasing thread
 * while the owner destroys the context on another. The log callback is the user's: it must never
 * run once sl_context_destroy has returned (shardload.h at sl_context_options.log), nor may the
 * report touch the freed context (ASan, TSan). */
static sl_backend_ops flaky_ops;
static sl_status (*real_record_native)(void *be, void *event, void *native);
static int refuse_records; /* atomic: the consumer's stream is refused from now on */

static sl_status flaky_record_native(void *be, void *event, void *native) {
  if (__atomic_load_n(&refuse_records, __ATOMIC_ACQUIRE)) return SL_ERR_BACKEND;
  return real_record_native(be, event, native);
}

typedef struct log_probe {
  int sleep_ms;  /* how long the callback takes */
  int in_log;    /* atomic: the release's warning is being logged */
  int destroyed; /* atomic: sl_context_destroy has returned */
  int late;      /* atomic: the callback was still running after that */
  int calls;     /* atomic */
  char line[512];
} log_probe;

static void probe_log(void *user, sl_log_level level, const char *msg) {
  log_probe *p = user;
  if (!strstr(msg, "cannot order its free")) return;
  if (__atomic_add_fetch(&p->calls, 1, __ATOMIC_ACQ_REL) == 1) snprintf(p->line, sizeof p->line, "%s", msg);
  __atomic_store_n(&p->in_log, 1, __ATOMIC_RELEASE);
  if (p->sleep_ms) usleep((useconds_t)p->sleep_ms * 1000);
  if (__atomic_load_n(&p->destroyed, __ATOMIC_ACQUIRE)) __atomic_store_n(&p->late, 1, __ATOMIC_RELEASE);
}

static void *release_main(void *arg) {
  sl_export_release(arg);
  return NULL;
}

/* One round: load, lend w to a consumer stream, refuse the stream, then release on a thread of
 * its own while this thread destroys the context (at once, or once the callback runs). */
static int release_racing_destroy(log_probe *p, int wait_for_log) {
  sl_context *ctx;
  sl_source *src;
  sl_plan *plan;
  sl_context_options co = {.size = sizeof co, .backend = "sim", .world_size = 1, .log = probe_log, .log_user = p,
                           .log_level = SL_LOG_WARN};
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "context");
  SL_CHILD_CHECK(sl_source_open(ctx, ckpt, &src) == SL_OK, "open: %s", sl_context_errmsg(ctx));
  SL_CHILD_CHECK(sl_plan_create(ctx, &plan) == SL_OK, "plan");
  flaky_ops = *ctx->be;
  real_record_native = flaky_ops.event_record_native;
  flaky_ops.event_record_native = flaky_record_native;
  ctx->be = ctx->beref->ops = &flaky_ops;
  __atomic_store_n(&refuse_records, 0, __ATOMIC_RELEASE);
  sl_state *st = NULL;
  SL_CHILD_CHECK(sl_load(ctx, plan, src, NULL, &st) == SL_OK, "load: %s", sl_context_errmsg(ctx));
  void *stream;
  SL_CHILD_CHECK(ctx->be->stream_create(ctx->be_ctx, &stream) == SL_OK, "stream_create");
  sl_export_options eo = {.size = sizeof eo, .stream = stream};
  sl_export *ex;
  SL_CHILD_CHECK(sl_state_export(st, 0, &eo, &ex) == SL_OK, "export w");
  __atomic_store_n(&refuse_records, 1, __ATOMIC_RELEASE);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  pthread_t t;
  SL_CHILD_CHECK(pthread_create(&t, NULL, release_main, ex) == 0, "thread");
  if (wait_for_log) {
    for (int i = 0; i < 2000 && !__atomic_load_n(&p->in_log, __ATOMIC_ACQUIRE); i++) usleep(1000);
    SL_CHILD_CHECK(__atomic_load_n(&p->in_log, __ATOMIC_ACQUIRE), "the release logged no warning");
  }
  sl_context_destroy(ctx);
  __atomic_store_n(&p->destroyed, 1, __ATOMIC_RELEASE);
  pthread_join(t, NULL);
  sl_state_destroy(st); /* waits on this thread (the release's record failed), then frees */
  return 0;
}

static int log_while_context_goes(void) {
  /* the callback is running when the owner destroys the context: destroy waits for it */
  log_probe p = {.sleep_ms = 300};
  if (release_racing_destroy(&p, 1)) return 1;
  SL_CHILD_CHECK(!p.late, "the log callback was still running after sl_context_destroy returned");
  SL_CHILD_CHECK(strstr(p.line, "tensor 'w': cannot order its free"), "warning: %s", p.line);
  /* and the two race freely: a report must never touch a context being freed (ASan, TSan) */
  for (int i = 0; i < 40; i++) {
    log_probe q = {0};
    if (release_racing_destroy(&q, 0)) return 1;
    SL_CHILD_CHECK(!q.late, "round %d: the log callback ran after sl_context_destroy returned", i);
  }
  return 0;
}

static void test_log_while_context_goes(void **state) { expect_child_ok(log_while_context_goes); }

/* ---- (c) a backend without the ops: the free waits on the releasing thread, and is safe --------- */
static sl_backend_ops no_native_ops;

static int fallback_without_ops(void) {
  sl_context *ctx;
  sl_source *src;
  sl_plan *plan;
  if (open_ctx("sim", &ctx, &src, &plan)) return 1;
  /* the same sim, through a table that lacks the two optional ops (a module built before them) */
  no_native_ops = *ctx->be;
  no_native_ops.event_record_native = NULL;
  no_native_ops.free_device_after = NULL;
  ctx->be = ctx->beref->ops = &no_native_ops;
  sl_state *st = NULL;
  SL_CHILD_CHECK(sl_load(ctx, plan, src, NULL, &st) == SL_OK, "load: %s", sl_context_errmsg(ctx));
  const sl_tensor *t = sl_state_tensor(st, 0);
  void *data = t->data;
  size_t nbytes = (size_t)t->nbytes;
  consumer c;
  if (consumer_open(ctx, &c)) return 1;
  sl_export_options eo = {.size = sizeof eo, .stream = c.stream};
  sl_export *ex;
  SL_CHILD_CHECK(sl_state_export(st, 0, &eo, &ex) == SL_OK, "export");
  if (consumer_use(ctx, &c, data, nbytes)) return 1;
  c.g.after_ms = 300;
  pthread_t opener;
  SL_CHILD_CHECK(pthread_create(&opener, NULL, gate_opener, &c.g) == 0, "thread");
  double t0 = now_s();
  sl_export_release(ex);
  sl_state_destroy(st); /* waits for every stream (the consumer's too, on sim) before the free */
  double took = now_s() - t0;
  pthread_join(opener, NULL);
  SL_CHILD_CHECK(took > 0.2, "the fallback did not wait (%.3f s)", took);
  SL_CHILD_CHECK(sl__sim_query(ctx->be_ctx, data) == SL__SIM_NONE, "freed by the time destroy returned");
  SL_CHILD_CHECK(file_bytes("w", c.host, nbytes), "the consumer read the loaded bytes");
  ctx->be->stream_destroy(ctx->be_ctx, c.stream);
  free(c.host);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_fallback_without_the_ops(void **state) { expect_child_ok(fallback_without_ops); }

/* ---- (d) host memory, arguments, lifetime --------------------------------------------------- */
static void test_host_memory_and_arguments(void **state) {
  const char *backends[] = {"cpu", "sim"};
  for (size_t b = 0; b < 2; b++) {
    sl_context *ctx;
    sl_source *src;
    sl_plan *plan;
    sl_context_options co = {.size = sizeof co, .backend = backends[b], .world_size = 1};
    assert_int_equal(sl_context_create(&co, &ctx), SL_OK);
    assert_int_equal(sl_source_open(ctx, ckpt, &src), SL_OK);
    assert_int_equal(sl_plan_create(ctx, &plan), SL_OK);
    /* host memory: the cpu backend's "device" memory, and a CPU placement on sim */
    sl_load_options lo = {.size = sizeof lo, .cpu_offload = b ? SL_CPU_OFFLOAD_ON : SL_CPU_OFFLOAD_INFER};
    sl_state *st;
    assert_int_equal(sl_load(ctx, plan, src, &lo, &st), SL_OK);
    char err[512];
    sl_export_options eo = {.size = sizeof eo, .stream = (void *)(uintptr_t)5, .errbuf = err,
                            .errbuf_size = sizeof err};
    sl_export *ex = (sl_export *)&eo;
    assert_int_equal(sl_state_export(st, 0, &eo, &ex), SL_ERR_INVALID);
    assert_null(ex);
    assert_non_null(strstr(err, "tensor 'w'"));
    assert_non_null(strstr(err, "host memory"));
    assert_non_null(strstr(err, "stream=None"));
    /* bad arguments: named, nothing lent */
    eo.stream = NULL;
    assert_int_equal(sl_state_export(st, 2, &eo, &ex), SL_ERR_INVALID);
    assert_non_null(strstr(err, "index out of range"));
    assert_int_equal(sl_state_export(NULL, 0, &eo, &ex), SL_ERR_INVALID);
    assert_int_equal(sl_state_export(st, 0, &eo, NULL), SL_ERR_INVALID);
    assert_non_null(strstr(err, "out is NULL"));
    /* an older caller's options, as short as their first member: the zero value for the rest */
    sl_export_options shortopts = {.size = sizeof(size_t), .stream = (void *)(uintptr_t)5};
    assert_int_equal(sl_state_export(st, 1, &shortopts, &ex), SL_OK);
    sl_export_release(ex);
    /* a live export keeps the memory: readable after sl_state_destroy (ASan sees a use after free) */
    assert_int_equal(sl_state_export(st, 0, NULL, &ex), SL_OK);
    const sl_tensor *t = sl_export_tensor(ex);
    assert_string_equal(t->name, "w");
    sl_state_destroy(st);
    assert_true(file_bytes("w", t->data, (size_t)t->nbytes));
    sl_export_release(ex);
    sl_export_release(NULL);
    sl_plan_destroy(plan);
    sl_source_destroy(src);
    sl_context_destroy(ctx);
  }
}

#ifdef SL_EXPORT_MUTANT
/* Built against core/src/state.c with SL__MUTANT_EXPORT (tests/mutants.cmake): some scenario
 * must fail (sim aborts on the free under pending work), or the tests cannot see the order. */
int main(void) {
  int (*scenarios[])(void) = {release_with_pending_work, two_consumers, context_gone_first, fallback_without_ops};
  const char *names[] = {"release_with_pending_work", "two_consumers", "context_gone_first", "fallback_without_ops"};
  setup(NULL);
  int killed = 0;
  for (size_t i = 0; i < 4; i++) {
    char err[8192];
    int rc = run_child(scenarios[i], err, sizeof err);
    if (rc != 0) {
      printf("MUTANT KILLED: export mutant %d failed %s (exit %d): %.300s\n", SL_EXPORT_MUTANT, names[i], rc, err);
      killed = 1;
    }
  }
  teardown(NULL);
  if (!killed) printf("export mutant %d SURVIVED: every scenario passed without that ordering\n", SL_EXPORT_MUTANT);
  return 0;
}
#else
int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_release_waits_for_the_consumer),
      cmocka_unit_test(test_two_consumers),
      cmocka_unit_test(test_context_gone_first),
      cmocka_unit_test(test_log_while_context_goes),
      cmocka_unit_test(test_fences_stay_bounded),
      cmocka_unit_test(test_fallback_without_the_ops),
      cmocka_unit_test(test_host_memory_and_arguments),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
#endif
