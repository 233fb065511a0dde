/* libshardload-nccl.so without a GPU: it loads (no driver, NCCL opened at run time), its table
 * is a valid ABI v2 stream-ordered device collective, probe says why it cannot run, and init
 * fails cleanly on every rank (no hang: the ranks agree over the control plane before NCCL
 * starts). argv[1]: the module file. The registry finds it through SHARDLOAD_MODULE_PATH.
 * On a machine where the probe says yes, the no-device cases skip (the gpu test covers it).
 *
 * With --fake: the module's code (its objects, linked in) against a fake libnccl.so.2
 * (fake_nccl.c) that its own dlopen finds on LD_LIBRARY_PATH, for the paths only a GPU reaches
 * otherwise: a non-blocking split whose child NCCL writes late, teardown behind a stuck
 * kernel, and a scatterv group's bytes between the ranks of a job (threads; the fake moves
 * sends and receives, and the module's events and copies run on a fake runtime, sl_nccl_rt). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "internal.h"
#include "nccl_internal.h"
#include "shardload/module.h"

static const char *g_path;
static const sl_collective_ops *g_ops;

/* ---- a host per rank: the context's message buffer ---------------------------------------- */
typedef struct rank_host {
  sl_module_host host;
  char msg[1024];
  char warn[1024]; /* the last warning logged (fini may log it on a thread of the test's) */
} rank_host;

static sl_status host_fail(void *core, sl_status s, const char *fmt, ...) {
  rank_host *h = core;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->msg, sizeof h->msg, fmt, ap);
  va_end(ap);
  return s;
}

static void host_log(void *core, sl_log_level level, const char *fmt, ...) {
  rank_host *h = core;
  if (level > SL_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->warn, sizeof h->warn, fmt, ap);
  va_end(ap);
}

static void host_init(rank_host *h) {
  memset(h, 0, sizeof *h);
  h->host = (sl_module_host){sizeof(sl_module_host), h, host_log, host_fail};
}

/* ---- an in-process control plane for N threads (real data exchange, pthread barriers) ------ */
#define MAX_RANKS 4
typedef struct mini_plane {
  pthread_barrier_t bar;
  int world;
  unsigned char slot[MAX_RANKS][1024];
} mini_plane;

typedef struct mini_rank {
  mini_plane *p;
  int rank;
  sl_control_plane cp;
} mini_rank;

static sl_status mini_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  mini_rank *r = ctx;
  if (bytes > sizeof r->p->slot[0]) return SL_ERR_INVALID;
  memcpy(r->p->slot[r->rank], send, bytes);
  pthread_barrier_wait(&r->p->bar);
  for (int i = 0; i < r->p->world; i++) memcpy((char *)recv + (size_t)i * bytes, r->p->slot[i], bytes);
  pthread_barrier_wait(&r->p->bar);
  return SL_OK;
}

static sl_status mini_broadcast(void *ctx, void *buf, size_t bytes, int root) {
  mini_rank *r = ctx;
  if (bytes > sizeof r->p->slot[0]) return SL_ERR_INVALID;
  if (r->rank == root) memcpy(r->p->slot[root], buf, bytes);
  pthread_barrier_wait(&r->p->bar);
  if (r->rank != root) memcpy(buf, r->p->slot[root], bytes);
  pthread_barrier_wait(&r->p->bar);
  return SL_OK;
}

/* The cuda backend as the collective sees it before it touches a device: its native API, its
 * streams' native handles (SL_EXT_NATIVE_STREAM: a token's cudaStream_t is another address, so
 * that a module taking the token itself for one is caught) and its ordinal. (The real module
 * cannot init without a driver, so its handle cannot be had here.) */
static int fake_ordinal(void *be) { return 0; }
static char g_native_default; /* the cudaStream_t of the backend's default (NULL) stream */
static void *fake_native_stream(void *be, void *stream) {
  return stream ? (void *)((uintptr_t)stream + 0x100000) : (void *)&g_native_default;
}
static void *fake_get_proc(const char *name) {
  return strcmp(name, SL_EXT_NATIVE_STREAM) == 0 ? (void *)(sl_ext_native_stream_fn)fake_native_stream : NULL;
}
static const sl_backend_ops fake_cuda = {
    .abi_version = SL_BACKEND_ABI_VERSION, .size = sizeof(sl_backend_ops), .name = "cuda",
    .device_ordinal = fake_ordinal, .get_proc = fake_get_proc, .native_api = "cuda"};
static const sl_backend_ops fake_cpu = {
    .abi_version = SL_BACKEND_ABI_VERSION, .size = sizeof(sl_backend_ops), .name = "cpu"};
/* a backend of native API cuda under another name, and one that gives no native streams */
static const sl_backend_ops fake_mycuda = {
    .abi_version = SL_BACKEND_ABI_VERSION, .size = sizeof(sl_backend_ops), .name = "mycuda",
    .device_ordinal = fake_ordinal, .get_proc = fake_get_proc, .native_api = "cuda"};
static const sl_backend_ops fake_cuda_no_streams = {
    .abi_version = SL_BACKEND_ABI_VERSION, .size = sizeof(sl_backend_ops), .name = "oldcuda",
    .device_ordinal = fake_ordinal, .native_api = "cuda"};
static int g_dummy_handle;

static bool has_gpu(void) {
  char why[512];
  return g_ops->probe("cuda", why, sizeof why) > 0;
}

/* ---- tests ------------------------------------------------------------------------------ */

static void table_is_valid(void **state) {
  assert_int_equal(g_ops->abi_version, SL_COLLECTIVE_ABI_VERSION);
  assert_int_equal(g_ops->size, sizeof(sl_collective_ops));
  assert_string_equal(g_ops->name, "nccl");
  assert_int_equal(g_ops->flags, 0); /* stream-ordered, not SL_COLL_SYNC */
  assert_int_equal(g_ops->domains, SL_MEM_DEVICE);
  assert_string_equal(g_ops->device_backend, "cuda");
  assert_non_null(g_ops->probe);
  assert_non_null(g_ops->init);
  assert_non_null(g_ops->fini);
  assert_non_null(g_ops->abort);
  assert_non_null(g_ops->split);
  assert_non_null(g_ops->broadcast);
  assert_non_null(g_ops->scatterv);
  assert_non_null(g_ops->allgather);
  assert_non_null(g_ops->barrier);
  assert_true(SL_HAS_OP(g_ops, scatterv_group));
  assert_non_null(g_ops->scatterv_group);
}

/* Only the entry symbol is exported: internal names and the static CUDA runtime are not. */
static void exports_entry_only(void **state) {
  void *h = dlopen(g_path, RTLD_NOW | RTLD_LOCAL);
  assert_non_null(h);
  assert_non_null(dlsym(h, "sl_collective_module_v2"));
  assert_null(dlsym(h, "sl__nccl_lib"));
  assert_null(dlsym(h, "sl__nccl_init"));
  assert_null(dlsym(h, "cudaGetDeviceCount"));
  dlclose(h);
}

static void probe_names_the_backend(void **state) {
  char why[512] = "";
  assert_int_equal(g_ops->probe("cpu", why, sizeof why), 0);
  assert_string_equal(why, "nccl: moves CUDA device memory only; this rank's backend is cpu");
  assert_int_equal(g_ops->probe("sim:strict", why, sizeof why), 0);
  assert_string_equal(why, "nccl: moves CUDA device memory only; this rank's backend is sim:strict");
  assert_int_equal(g_ops->probe("cudax", why, sizeof why), 0); /* not a cuda variant */
  assert_int_equal(g_ops->probe(NULL, why, sizeof why), 0);
}

/* On cuda: the reason this machine has. Which one is expected depends on what is installed. */
static void probe_says_what_is_missing(void **state) {
  char why[512] = "";
  int score = g_ops->probe("cuda", why, sizeof why);
  void *nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (score > 0) {
    print_message("probe(cuda) = %d here (a GPU and NCCL): the no-device checks skip\n", score);
    if (nccl) dlclose(nccl);
    skip();
  }
  print_message("probe(cuda): %s\n", why);
  if (!nccl) {
    assert_non_null(strstr(why, "nccl: libnccl.so.2 not found ("));
  } else {
    dlclose(nccl);
    assert_non_null(strstr(why, "nccl: no CUDA driver/device ("));
  }
  /* a second probe says the same (the library is opened once) */
  char again[512] = "";
  assert_int_equal(g_ops->probe("cuda", again, sizeof again), 0);
  assert_string_equal(why, again);
}

/* The core's way in: the registry opens libshardload-nccl.so from SHARDLOAD_MODULE_PATH. */
static void registry_finds_the_module(void **state) {
  char why[512] = "";
  assert_int_equal(sl__collective_probe("nccl", sl__backend_cpu(), why, sizeof why), 0);
  print_message("registry probe(nccl, cpu): %s\n", why);
  assert_non_null(strstr(why, "moves CUDA device memory only; this rank's backend is cpu"));
}

static void init_refuses_other_backends(void **state) {
  rank_host h;
  host_init(&h);
  void *comm = (void *)1;
  sl_collective_init in = {.size = sizeof in, .host = &h.host, .rank = 0, .world_size = 1, .timeout_ms = 5000,
                           .backend = &fake_cpu, .backend_handle = &g_dummy_handle, .device = -1};
  assert_int_equal(g_ops->init(&in, &comm), SL_ERR_INVALID);
  assert_null(comm);
  assert_non_null(strstr(h.msg, "nccl init on rank 0: needs this rank's backend, of native API cuda"));
  assert_non_null(strstr(h.msg, "it has cpu"));
  /* of native API cuda, but without the cudaStream_t of its streams: nothing to enqueue on */
  in.backend = &fake_cuda_no_streams;
  assert_int_equal(g_ops->init(&in, &comm), SL_ERR_UNSUPPORTED);
  assert_null(comm);
  assert_non_null(strstr(h.msg, "nccl init on rank 0: backend oldcuda does not give the cudaStream_t of its streams"));
  assert_non_null(strstr(h.msg, SL_EXT_NATIVE_STREAM));
  in.backend = &fake_cpu;
  /* an init struct from an ABI v1 core (no backend, no control plane) */
  in.size = offsetof(sl_collective_init, backend);
  assert_int_equal(g_ops->init(&in, &comm), SL_ERR_ABI);
  assert_non_null(strstr(h.msg, "module ABI 2"));
  /* two ranks need a control plane to bootstrap through */
  in.size = sizeof in;
  in.backend = &fake_cuda;
  in.world_size = 2;
  assert_int_equal(g_ops->init(&in, &comm), SL_ERR_INVALID);
  assert_non_null(strstr(h.msg, "no control plane"));
}

static void init_without_device_fails_cleanly(void **state) {
  if (has_gpu()) skip();
  rank_host h;
  host_init(&h);
  void *comm = (void *)1;
  sl_collective_init in = {.size = sizeof in, .host = &h.host, .rank = 0, .world_size = 1, .timeout_ms = 5000,
                           .backend = &fake_cuda, .backend_handle = &g_dummy_handle, .device = -1};
  sl_status st = g_ops->init(&in, &comm);
  print_message("init: %s: %s\n", sl_status_name(st), h.msg);
  assert_int_equal(st, SL_ERR_NO_DEVICE);
  assert_null(comm);
  assert_non_null(strstr(h.msg, "nccl init on rank 0: "));
  assert_true(strstr(h.msg, "cannot use cuda:0") || strstr(h.msg, "libnccl.so.2 not found"));
  g_ops->fini(NULL); /* fini of NULL is a no-op */
}

typedef struct rank_run {
  mini_rank mr;
  rank_host h;
  sl_status st;
  void *comm;
} rank_run;

static void *run_rank(void *arg) {
  rank_run *r = arg;
  host_init(&r->h);
  r->comm = (void *)1;
  sl_collective_init in = {.size = sizeof in, .host = &r->h.host, .rank = r->mr.rank, .world_size = r->mr.p->world,
                           .timeout_ms = 5000, .backend = &fake_cuda, .backend_handle = &g_dummy_handle,
                           .device = r->mr.rank, .control = &r->mr.cp};
  r->st = g_ops->init(&in, &r->comm);
  return NULL;
}

/* Every rank of a job without a device fails at once, and each names a rank that cannot run
 * NCCL (its own, or rank 0 for the others), instead of waiting in ncclCommInitRank. */
static void every_rank_fails_together(void **state) {
  if (has_gpu()) skip();
  enum { W = 3 };
  mini_plane p = {.world = W};
  pthread_barrier_init(&p.bar, NULL, W);
  rank_run run[W];
  pthread_t t[W];
  for (int i = 0; i < W; i++) {
    memset(&run[i], 0, sizeof run[i]);
    run[i].mr = (mini_rank){&p, i, {sizeof(sl_control_plane), &run[i].mr, mini_broadcast, mini_allgather}};
    assert_int_equal(pthread_create(&t[i], NULL, run_rank, &run[i]), 0);
  }
  for (int i = 0; i < W; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&p.bar);
  for (int i = 0; i < W; i++) {
    print_message("rank %d: %s: %s\n", i, sl_status_name(run[i].st), run[i].h.msg);
    assert_null(run[i].comm);
    char want[64];
    snprintf(want, sizeof want, "nccl init on rank %d: rank 0 cannot run NCCL: ", i);
    assert_non_null(strstr(run[i].h.msg, want));
    assert_int_equal(run[i].st, i == 0 ? SL_ERR_NO_DEVICE : SL_ERR_PEER);
  }
}

/* ---- --fake: the module's code against a fake libnccl.so.2 ------------------------------- */

typedef struct fake_api {
  void (*config)(int split_ms, int abort_lag_ms);
  void (*stick)(int stuck);
  int (*live)(void);
  int (*violations)(char *last, size_t len);
  int (*children_written)(void);
  cudaStream_t (*last_stream)(int *ops);
  unsigned long (*posted)(void);
  int (*stream_busy)(cudaStream_t stream, unsigned long upto);
  int (*groups)(void);
} fake_api;
static fake_api F;
static const sl_nccl_lib *g_L;
const sl_collective_ops *sl_collective_module_v2(void); /* the module's entry, linked in */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Polls COND for up to S seconds; whether it came true. */
#define WAIT_FOR(cond, s)                                                                                              \
  ({                                                                                                                   \
    double until_ = now_s() + (s);                                                                                     \
    while (!(cond) && now_s() < until_) usleep(2000);                                                                  \
    (bool)(cond);                                                                                                      \
  })

/* The cuda backend's stream and event ops as the module's resources use them, with tokens (no
 * device: cudaMallocAsync of the barrier's buffer fails after them). */
static char g_tokens[64];
static sl_status fb_create(void *be, void **out) {
  static int next;
  *out = &g_tokens[__atomic_fetch_add(&next, 1, __ATOMIC_RELAXED) % 64];
  return SL_OK;
}
static void *g_stream_destroyed, *g_stream_abandoned; /* the last stream each op was given */
static void fb_destroy(void *be, void *x) {}
static void fb_stream_destroy(void *be, void *x) { __atomic_store_n(&g_stream_destroyed, x, __ATOMIC_RELEASE); }
static sl_status fb_record(void *be, void *ev, void *stream) { return SL_OK; }
static sl_status fb_wait(void *be, void *stream, void *ev) { return SL_OK; }
/* SL_EXT_STREAM_ABANDON, as the cuda backend offers it */
static void fb_abandon(void *be, void *stream) { __atomic_store_n(&g_stream_abandoned, stream, __ATOMIC_RELEASE); }
static void *fb_get_proc(const char *name) {
  if (name && strcmp(name, SL_EXT_STREAM_ABANDON) == 0) return (void *)(sl_ext_stream_abandon_fn)fb_abandon;
  return fake_get_proc(name); /* the native streams */
}
static const sl_backend_ops fake_cuda_streams = {
    .abi_version = SL_BACKEND_ABI_VERSION, .size = sizeof(sl_backend_ops), .name = "cuda",
    .device_ordinal = fake_ordinal, .stream_create = fb_create, .stream_destroy = fb_stream_destroy,
    .event_create = fb_create, .event_destroy = fb_destroy, .event_record = fb_record, .stream_wait_event = fb_wait,
    .get_proc = fb_get_proc, .native_api = "cuda"};

/* A formed one-rank communicator of the fake, wrapped as init wraps one (its watchdog runs). */
static nccl_comm *fake_parent(rank_host *h, int timeout_ms) {
  nccl_comm *c = sl__nccl_comm_new(&h->host, g_L, &fake_cuda_streams, &g_dummy_handle, 0, timeout_ms);
  assert_non_null(c);
  ncclUniqueId id;
  assert_int_equal(g_L->GetUniqueId(&id), ncclSuccess);
  ncclConfig_t cfg;
  sl__nccl_config(&cfg);
  ncclComm_t comm = NULL;
  assert_int_equal(g_L->CommInitRankConfig(&comm, 1, id, 0, &cfg), ncclInProgress);
  char what[256];
  assert_int_equal(sl__nccl_settle(c, comm, what, sizeof what), SL_OK);
  c->comm = comm;
  c->world = 1;
  assert_int_equal(sl__nccl_watch_start(c), SL_OK);
  return c;
}

static void assert_no_violation(void) {
  char last[256] = "";
  int n = F.violations(last, sizeof last);
  if (n) fail_msg("the module misused NCCL %d time(s); last: %s", n, last);
}

/* A split whose peers never arrive fails within the timeout, and the child NCCL writes when the
 * parent's abort ends the split's job is aborted too: nothing of the split is left alive. */
static void split_that_never_completes_fails_within_the_timeout(void **state) {
  enum { T = 1500 };
  rank_host h;
  host_init(&h);
  F.config(-1, 0);
  int written = F.children_written(), live0 = F.live();
  nccl_comm *c = fake_parent(&h, T);
  void *sub = (void *)1;
  double t0 = now_s();
  sl_status st = g_ops->split(c, 0, 0, &sub);
  double dt = now_s() - t0;
  print_message("split: %s after %.2f s: %s\n", sl_status_name(st), dt, h.msg);
  assert_int_equal(st, SL_ERR_TIMEOUT);
  assert_null(sub);
  assert_non_null(strstr(h.msg, "nccl split on rank 0 (cuda:0): ncclCommSplit failed (no answer within 1500 ms); "
                                "the communicator was aborted"));
  assert_true(dt < 1.6 * T / 1e3);
  assert_int_equal(F.children_written(), written + 1);
  assert_int_equal(F.live(), live0); /* the parent, and the child that landed in the slot, ended */
  g_ops->fini(c);
  assert_int_equal(F.live(), live0);
  assert_no_violation();
}

/* The parent's abort outlives its bound (the split's job sits in a blocking bootstrap step), so
 * the split returns before NCCL writes the child, and even the parent's fini comes first. The
 * late write lands in storage that outlives both (under ASan: no stack-use-after-return, no
 * heap-use-after-free), and the child is aborted by the next fini's sweep. */
static void split_child_that_lands_after_the_call_is_kept_and_aborted(void **state) {
  enum { T = 1000, LAG = 1500 };
  rank_host h;
  host_init(&h);
  F.config(-1, LAG);
  int written = F.children_written(), live0 = F.live();
  nccl_comm *c = fake_parent(&h, T);
  void *sub = (void *)1;
  double t0 = now_s();
  sl_status st = g_ops->split(c, 0, 0, &sub);
  double dt = now_s() - t0;
  print_message("split: %s after %.2f s: %s\n", sl_status_name(st), dt, h.msg);
  assert_int_equal(st, SL_ERR_TIMEOUT);
  assert_null(sub);
  assert_true(dt < 2.6 * T / 1e3); /* the settle's timeout, then the abort's */
  assert_int_equal(F.children_written(), written); /* NCCL writes it after the split returned */
  g_ops->fini(c);
  print_message("fini: %s\n", h.warn);
  assert_non_null(strstr(h.warn, "nccl fini on rank 0 (cuda:0): ncclCommAbort did not return within 1000 ms"));
  assert_true(WAIT_FOR(F.children_written() == written + 1, 10.0));
  rank_host h2;
  host_init(&h2);
  F.config(20, 0);
  nccl_comm *other = fake_parent(&h2, T);
  g_ops->fini(other); /* sweeps the kept slots: the late child is aborted */
  assert_true(WAIT_FOR(F.live() == live0, 10.0));
  assert_no_violation();
}

/* A split that completes: the parent settles, the child is read from the slot and settled, and
 * without a device its resources fail, so it is aborted (on a GPU machine: it is kept). A
 * NOCOLOR split gives no child. */
static void split_that_completes_reads_the_child(void **state) {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) skip(); /* the fake's tokens are no streams there */
  rank_host h;
  host_init(&h);
  F.config(30, 0);
  int written = F.children_written(), live0 = F.live();
  nccl_comm *c = fake_parent(&h, 5000);
  void *sub = (void *)1;
  assert_int_equal(g_ops->split(c, -1, 0, &sub), SL_OK);
  assert_null(sub);
  sub = (void *)1;
  sl_status st = g_ops->split(c, 0, 0, &sub);
  print_message("split: %s: %s\n", sl_status_name(st), h.msg);
  assert_int_equal(F.children_written(), written + 1);
  assert_int_equal(st, SL_ERR_NOMEM);
  assert_non_null(strstr(h.msg, "cannot allocate 1 bytes"));
  assert_null(sub);
  assert_int_equal(F.live(), live0 + 1); /* the parent: the child was aborted */
  g_ops->fini(c);
  assert_int_equal(F.live(), live0);
  assert_string_equal(h.warn, "");
  assert_no_violation();
}

typedef struct fini_run {
  nccl_comm *c[3];
  int n;
  double seconds;
} fini_run;

static void *fini_main(void *arg) {
  fini_run *r = arg;
  double t0 = now_s();
  for (int i = 0; i < r->n; i++) g_ops->fini(r->c[i]);
  r->seconds = now_s() - t0;
  return NULL;
}

/* The fini of R's communicators, in turn, on a thread while the fake's teardown is stuck: all
 * of it must return within 1.6 x BOUND_MS (the test waits at most 3 x, then unsticks the fake
 * so that a hung fini can end). */
static void fini_with_stuck_teardown(fini_run *r, int live0, int bound_ms) {
  F.stick(1);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fini_main, r), 0);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 3 * bound_ms / 1000;
  int rc = pthread_timedjoin_np(t, NULL, &until);
  F.stick(0);
  if (rc != 0) {
    pthread_join(t, NULL);
    fail_msg("fini did not return within %d ms behind a stuck ncclCommAbort/ncclCommDestroy", 3 * bound_ms);
  }
  print_message("fini of %d communicator(s) returned after %.2f s\n", r->n, r->seconds);
  assert_true(r->seconds < 1.6 * bound_ms / 1e3);
  assert_true(WAIT_FOR(F.live() == live0, 10.0)); /* unstuck, the calls left behind finished */
  assert_no_violation();
}

static void assert_left_behind(const rank_host *h, const char *call, int ms) {
  char want[256];
  print_message("warning: %s\n", h->warn);
  snprintf(want, sizeof want, "nccl fini on rank 0 (cuda:0): %s did not return within %d ms", call, ms);
  assert_non_null(strstr(h->warn, want));
  assert_non_null(strstr(h->warn, "left behind (leaked) so that teardown ends"));
}

/* After an abort, teardown ends within the timeout even when ncclCommAbort is held by a kernel
 * that never ends (NCCL's cudaFree synchronises the device): the communicator is left behind.
 * The rest of that teardown (the parent the aborted one was split from, ended after it) is not
 * waited for as long. */
static void fini_after_abort_ends_behind_a_stuck_kernel(void **state) {
  enum { T = 1500 };
  rank_host h, h2;
  host_init(&h);
  host_init(&h2);
  F.config(20, 0);
  int live0 = F.live();
  nccl_comm *root = fake_parent(&h2, T), *child = fake_parent(&h, T);
  child->parent = root; /* as split wraps a child */
  fini_run r = {{child, root}, 2, -1};
  g_ops->abort(child);
  fini_with_stuck_teardown(&r, live0, T);
  assert_left_behind(&h, "ncclCommAbort", T);
  assert_left_behind(&h2, "ncclCommDestroy", 250);
}

/* The short wait belongs to one teardown: another job's later teardown, while the first one's
 * call is still left behind, waits the full timeout again (a healthy communicator must not be
 * leaked after 250 ms for an earlier job's stuck one). */
static void a_later_teardown_waits_in_full(void **state) {
  enum { T = 1500 };
  rank_host h, h2;
  host_init(&h);
  host_init(&h2);
  F.config(20, 0);
  int live0 = F.live();
  fini_run r = {{fake_parent(&h, T), fake_parent(&h2, T)}, 2, -1};
  fini_with_stuck_teardown(&r, live0, 2 * T);
  assert_left_behind(&h, "ncclCommDestroy", T);
  assert_left_behind(&h2, "ncclCommDestroy", T);
}

/* The same for a healthy fini's ncclCommDestroy. The communicator's stream, left behind with
 * it, is given up to the backend (SL_EXT_STREAM_ABANDON) rather than destroyed, so that the
 * backend's later waits do not wait out their timeout for it. */
static void fini_ends_behind_a_stuck_destroy(void **state) {
  enum { T = 1500 };
  rank_host h;
  host_init(&h);
  F.config(20, 0);
  int live0 = F.live();
  nccl_comm *c = fake_parent(&h, T);
  void *stream;
  assert_int_equal(fb_create(NULL, &stream), SL_OK);
  c->own_stream = stream;
  __atomic_store_n(&g_stream_abandoned, NULL, __ATOMIC_RELEASE);
  __atomic_store_n(&g_stream_destroyed, NULL, __ATOMIC_RELEASE);
  fini_run r = {{c}, 1, -1};
  fini_with_stuck_teardown(&r, live0, T);
  assert_left_behind(&h, "ncclCommDestroy", T);
  assert_ptr_equal(__atomic_load_n(&g_stream_abandoned, __ATOMIC_ACQUIRE), stream);
  assert_null(__atomic_load_n(&g_stream_destroyed, __ATOMIC_ACQUIRE));
}

/* NCCL's kernels go on the cudaStream_t the backend gives for the stream they were handed
 * (SL_EXT_NATIVE_STREAM), the default stream's for NULL; never on the backend's handle taken
 * for one. The fake notes the stream of each data op (and refuses it, so the communicator dies:
 * a fresh one per case). */
static void data_ops_go_on_the_backends_native_streams(void **state) {
  rank_host h;
  host_init(&h);
  F.config(20, 0);
  void *stream = NULL;
  assert_int_equal(fb_create(NULL, &stream), SL_OK);
  struct {
    void *given;
    void *native;
  } cases[] = {{stream, fake_native_stream(NULL, stream)}, {NULL, &g_native_default}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int before = 0, after = 0;
    F.last_stream(&before);
    nccl_comm *c = fake_parent(&h, 5000);
    static char buf[64];
    sl_status st = g_ops->broadcast(c, buf, sizeof buf, 0, cases[i].given);
    cudaStream_t got = F.last_stream(&after);
    print_message("broadcast on %p: %s, NCCL got stream %p (want %p): %s\n", cases[i].given, sl_status_name(st),
                  (void *)got, cases[i].native, h.msg);
    assert_int_equal(after, before + 1);
    assert_ptr_equal(got, cases[i].native);
    assert_int_equal(st, SL_ERR_COMM); /* the fake refuses data ops */
    g_ops->fini(c);
  }
  /* the module pairs by native API: a backend of API cuda under another name is taken */
  nccl_comm *c = sl__nccl_comm_new(&h.host, g_L, &fake_mycuda, &g_dummy_handle, 0, 5000);
  assert_non_null(c);
  assert_ptr_equal(sl__nccl_stream(c, stream), fake_native_stream(NULL, stream));
  sl__nccl_comm_free(c);
  assert_no_violation();
}


/* ---- scatterv group: a job of the fake's ranks, ops run to their end -------------------- */

/* The device runtime of the module's data path (sl_nccl_rt) without a device: an event is
 * complete once every send and receive the fake had posted on its stream when it was recorded
 * has met its other side; the root's own part is copied at once (host memory; its buffers are
 * not the ones the sends read). */
typedef struct fake_event {
  cudaStream_t stream;
  unsigned long upto;
} fake_event;
static cudaError_t fr_event_create(cudaEvent_t *ev) {
  fake_event *e = calloc(1, sizeof *e);
  if (!e) return cudaErrorMemoryAllocation;
  *ev = (cudaEvent_t)e;
  return cudaSuccess;
}
static cudaError_t fr_event_record(cudaEvent_t ev, cudaStream_t s) {
  fake_event *e = (fake_event *)ev;
  e->stream = s;
  e->upto = F.posted();
  return cudaSuccess;
}
static cudaError_t fr_event_query(cudaEvent_t ev) {
  fake_event *e = (fake_event *)ev;
  return F.stream_busy(e->stream, e->upto) ? cudaErrorNotReady : cudaSuccess;
}
static cudaError_t fr_event_destroy(cudaEvent_t ev) {
  free(ev);
  return cudaSuccess;
}
static int g_copies; /* the root's own parts copied */
static cudaError_t fr_copy_async(void *dst, const void *src, size_t bytes, cudaStream_t s) {
  memmove(dst, src, bytes);
  __atomic_add_fetch(&g_copies, 1, __ATOMIC_RELAXED);
  return cudaSuccess;
}
static const sl_nccl_rt g_fake_rt = {fr_event_create, fr_event_record, fr_event_query, fr_event_destroy,
                                     fr_copy_async};

/* W communicators of one unique id, rank r's in C[r] (the fake forms them without a
 * bootstrap), wrapped as init wraps them but on the fake runtime, their watchdogs running. */
static void fake_job(rank_host *h, nccl_comm **c, int w, int timeout_ms) {
  ncclUniqueId id;
  assert_int_equal(g_L->GetUniqueId(&id), ncclSuccess);
  ncclConfig_t cfg;
  sl__nccl_config(&cfg);
  for (int r = 0; r < w; r++) {
    host_init(&h[r]);
    c[r] = sl__nccl_comm_new(&h[r].host, g_L, &fake_cuda_streams, &g_dummy_handle, r, timeout_ms);
    assert_non_null(c[r]);
    c[r]->rt = &g_fake_rt;
    ncclComm_t comm = NULL;
    assert_int_equal(g_L->CommInitRankConfig(&comm, w, id, r, &cfg), ncclInProgress);
    c[r]->comm = comm;
  }
  for (int r = 0; r < w; r++) {
    char what[256];
    assert_int_equal(sl__nccl_settle(c[r], c[r]->comm, what, sizeof what), SL_OK);
    c[r]->rank = c[r]->job_rank = r;
    c[r]->world = w;
    assert_int_equal(sl__nccl_watch_start(c[r]), SL_OK);
  }
}

/* One rank's scatterv group on its own thread, then a wait for its stream's events (the
 * watchdog's queue drained). Its count tables are scribbled over once the op returned: the
 * module must have read them by then (module.h). */
typedef struct group_run {
  nccl_comm *c;
  sl_scatter_item items[SL_SCATTER_GROUP_MAX];
  size_t counts[SL_SCATTER_GROUP_MAX][MAX_RANKS], displs[SL_SCATTER_GROUP_MAX][MAX_RANKS];
  int n;
  void *stream;
  sl_status st, drained;
} group_run;

static void *group_main(void *arg) {
  group_run *r = arg;
  r->st = g_ops->scatterv_group(r->c, r->items, r->n, r->stream);
  memset(r->counts, 0xA5, sizeof r->counts);
  memset(r->displs, 0x5A, sizeof r->displs);
  r->drained = r->st == SL_OK ? sl__nccl_drain(r->c, "test") : r->st;
  return NULL;
}

static void run_groups(group_run *runs, int w) {
  pthread_t t[MAX_RANKS];
  for (int r = 0; r < w; r++) assert_int_equal(pthread_create(&t[r], NULL, group_main, &runs[r]), 0);
  for (int r = 0; r < w; r++) pthread_join(t[r], NULL);
}

/* Three scatterv's from ranks 2, 0 and 3 of four as one op, one NCCL group on each rank (every
 * item's bytes at once): every rank gets each item's part, byte for byte and nothing past it,
 * from the root's displacement (gaps and a reversed order in its send buffer); an item that
 * sends a rank 0 bytes leaves its buffer alone; each root's own part is the device copy; rank
 * 1 roots none. sendbuf, counts and displs are given on their root only. */
static void scatterv_group_moves_every_items_bytes(void **state) {
  enum { W = 4, N = 3, GUARD = 16, FILL = 0xEE };
  static const int roots[N] = {2, 0, 3};
  static const size_t counts[N][W] = {{5, 0, 7, 3}, {4, 6, 2, 0}, {1, 9, 0, 8}};
  static const size_t displs[N][W] = {{40, 99, 20, 3}, {30, 10, 0, 90}, {60, 31, 0, 5}};
  static unsigned char send[N][128], recv[W][N][32];
  for (int i = 0; i < N; i++)
    for (size_t k = 0; k < sizeof send[i]; k++) send[i][k] = (unsigned char)(i * 64 + k * 7 + 1);
  memset(recv, FILL, sizeof recv);
  rank_host h[W];
  nccl_comm *c[W];
  F.config(20, 0);
  int live0 = F.live(), copies0 = __atomic_load_n(&g_copies, __ATOMIC_RELAXED);
  fake_job(h, c, W, 5000);
  static group_run runs[W];
  for (int r = 0; r < W; r++) {
    group_run *g = &runs[r];
    memset(g, 0, sizeof *g);
    g->c = c[r];
    g->n = N;
    assert_int_equal(fb_create(NULL, &g->stream), SL_OK); /* a stream of its own per rank */
    for (int i = 0; i < N; i++) {
      sl_scatter_item *it = &g->items[i];
      *it = (sl_scatter_item){
          .size = sizeof(sl_scatter_item), .recvbuf = recv[r][i], .recvbytes = counts[i][r], .root = roots[i]};
      if (r != roots[i]) continue;
      memcpy(g->counts[i], counts[i], sizeof counts[i]);
      memcpy(g->displs[i], displs[i], sizeof displs[i]);
      *it = (sl_scatter_item){sizeof(sl_scatter_item), send[i],     g->counts[i], g->displs[i],
                              recv[r][i],               counts[i][r], roots[i]};
    }
  }
  int groups0 = F.groups();
  run_groups(runs, W);
  assert_int_equal(F.groups(), groups0 + W); /* each rank's calls in one group: every item at once */
  for (int r = 0; r < W; r++) {
    print_message("rank %d: %s, drained %s: %s\n", r, sl_status_name(runs[r].st), sl_status_name(runs[r].drained),
                  h[r].msg);
    assert_int_equal(runs[r].st, SL_OK);
    assert_int_equal(runs[r].drained, SL_OK);
    for (int i = 0; i < N; i++) {
      size_t n = counts[i][r];
      if (n) assert_memory_equal(recv[r][i], send[i] + displs[i][r], n);
      for (size_t k = n; k < n + GUARD; k++)
        if (recv[r][i][k] != FILL) fail_msg("rank %d, item %d: byte %zu past its %zu was written", r, i, k, n);
    }
  }
  assert_int_equal(__atomic_load_n(&g_copies, __ATOMIC_RELAXED), copies0 + N); /* each root's own part */
  /* the communicators are fine after it: another group, now with rank 1 a root too */
  for (int r = 0; r < W; r++) {
    group_run *g = &runs[r];
    g->n = 1;
    g->items[0] =
        (sl_scatter_item){.size = sizeof(sl_scatter_item), .recvbuf = recv[r][0], .recvbytes = 2, .root = 1};
    if (r == 1) {
      for (int p = 0; p < W; p++) g->counts[0][p] = 2, g->displs[0][p] = (size_t)p * 2;
      g->items[0] = (sl_scatter_item){sizeof(sl_scatter_item), send[1], g->counts[0], g->displs[0], recv[r][0], 2, 1};
    }
  }
  run_groups(runs, W);
  for (int r = 0; r < W; r++) {
    assert_int_equal(runs[r].st, SL_OK);
    assert_int_equal(runs[r].drained, SL_OK);
    assert_memory_equal(recv[r][0], send[1] + r * 2, 2);
  }
  for (int r = 0; r < W; r++) g_ops->fini(c[r]);
  assert_int_equal(F.live(), live0);
  for (int r = 0; r < W; r++) assert_string_equal(h[r].warn, "");
  assert_no_violation();
}

/* The items' rules (module.h): 1 to SL_SCATTER_GROUP_MAX of them, roots of the communicator and
 * distinct, the root's own count its receive. Each is refused before NCCL is called, and the
 * communicator stays usable. */
static void scatterv_group_refuses_bad_items(void **state) {
  enum { W = 3 };
  rank_host h[W];
  nccl_comm *c[W];
  F.config(20, 0);
  int live0 = F.live(), ops0 = 0, ops1 = 0;
  fake_job(h, c, W, 5000);
  static char buf[16];
  size_t counts[W] = {4, 4, 4}, displs[W] = {0, 4, 8};
  sl_scatter_item it[SL_SCATTER_GROUP_MAX + 1];
  for (int i = 0; i <= SL_SCATTER_GROUP_MAX; i++)
    it[i] = (sl_scatter_item){.size = sizeof(sl_scatter_item), .recvbuf = buf, .recvbytes = 4, .root = 1};
  F.last_stream(&ops0);
  struct {
    const sl_scatter_item *items;
    int n;
    const char *want;
  } bad[] = {
      {it, 0, "nccl scatterv group on rank 0: 0 items; give 1 to 8"},
      {it, SL_SCATTER_GROUP_MAX + 1, "nccl scatterv group on rank 0: 9 items; give 1 to 8"},
      {NULL, 1, "nccl scatterv group on rank 0: 1 items; give 1 to 8"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(g_ops->scatterv_group(c[0], bad[i].items, bad[i].n, NULL), SL_ERR_INVALID);
    assert_string_equal(h[0].msg, bad[i].want);
  }
  /* items too short for the members this ABI has always had: a caller built against another
   * module.h, refused before anything is read past them */
  it[0].size = offsetof(sl_scatter_item, root);
  assert_int_equal(g_ops->scatterv_group(c[0], it, 1, NULL), SL_ERR_ABI);
  assert_non_null(strstr(h[0].msg, "items of"));
  it[0].size = sizeof(sl_scatter_item);
  it[1].root = 3;
  assert_int_equal(g_ops->scatterv_group(c[0], it, 2, NULL), SL_ERR_INVALID);
  assert_string_equal(h[0].msg, "nccl scatterv group on rank 0: root 3 is not a rank of 3");
  it[1].root = -1;
  assert_int_equal(g_ops->scatterv_group(c[0], it, 2, NULL), SL_ERR_INVALID);
  assert_string_equal(h[0].msg, "nccl scatterv group on rank 0: root -1 is not a rank of 3");
  it[1].root = 2;
  it[2].root = 1;
  assert_int_equal(g_ops->scatterv_group(c[0], it, 3, NULL), SL_ERR_INVALID);
  assert_string_equal(h[0].msg, "nccl scatterv group on rank 0: items 0 and 2 have the same root 1");
  /* this rank's own item sends it 4 bytes but receives 3 */
  it[2] = (sl_scatter_item){sizeof(sl_scatter_item), buf, counts, displs, buf, 3, 0};
  assert_int_equal(g_ops->scatterv_group(c[0], it, 3, NULL), SL_ERR_INVALID);
  assert_string_equal(h[0].msg, "nccl scatterv group on rank 0: the root sends itself 4 bytes but receives 3");
  F.last_stream(&ops1);
  assert_int_equal(ops1, ops0); /* no NCCL call was made */
  assert_false(atomic_load(&c[0]->dead));
  for (int r = 0; r < W; r++) g_ops->fini(c[r]);
  assert_int_equal(F.live(), live0);
  assert_no_violation();
}

/* A failure of any item fails the op, as scatterv's: on an aborted communicator it fails at
 * once, naming the abort; where a rank never joins, the ranks whose items wait on it are
 * aborted by their watchdog within the timeout, and their next op says so. */
static void scatterv_group_fails_as_scatterv_does(void **state) {
  enum { W = 3, T = 1000 };
  rank_host h[W];
  nccl_comm *c[W];
  F.config(20, 0);
  int live0 = F.live();
  fake_job(h, c, W, T);
  static char send[2][16], recv[W][2][8];
  size_t counts[W] = {4, 4, 4}, displs[W] = {0, 4, 8};
  /* rank 2 never calls: items from ranks 0 and 2 */
  static group_run runs[2];
  for (int r = 0; r < 2; r++) {
    group_run *g = &runs[r];
    memset(g, 0, sizeof *g);
    g->c = c[r];
    g->n = 2;
    assert_int_equal(fb_create(NULL, &g->stream), SL_OK);
    g->items[0] =
        (sl_scatter_item){.size = sizeof(sl_scatter_item), .recvbuf = recv[r][0], .recvbytes = 4, .root = 0};
    g->items[1] =
        (sl_scatter_item){.size = sizeof(sl_scatter_item), .recvbuf = recv[r][1], .recvbytes = 4, .root = 2};
    if (r == 0) {
      memcpy(g->counts[0], counts, sizeof counts);
      memcpy(g->displs[0], displs, sizeof displs);
      g->items[0] = (sl_scatter_item){sizeof(sl_scatter_item), send[0], g->counts[0], g->displs[0], recv[r][0], 4, 0};
    }
  }
  double t0 = now_s();
  run_groups(runs, 2);
  double dt = now_s() - t0;
  for (int r = 0; r < 2; r++) {
    assert_int_equal(runs[r].st, SL_OK); /* enqueued */
    assert_int_equal(runs[r].drained, SL_ERR_COMM);
    sl_status st = g_ops->scatterv_group(c[r], runs[r].items, 2, runs[r].stream);
    print_message("rank %d after %.2f s: %s: %s\n", r, dt, sl_status_name(st), h[r].msg);
    assert_int_equal(st, SL_ERR_TIMEOUT);
    char want[160];
    snprintf(want, sizeof want, "nccl scatterv group: nccl scatterv group on rank %d (cuda:%d): no operation completed "
                                "within 1000 ms", r, r);
    assert_non_null(strstr(h[r].msg, want));
  }
  assert_true(dt < 1.6 * T / 1e3);
  /* rank 2, aborted (sl_context_abort): its op fails before NCCL is called */
  g_ops->abort(c[2]);
  size_t own[W] = {0, 0, 0};
  sl_scatter_item mine = {sizeof mine, send[1], own, displs, recv[2][0], 0, 2};
  assert_int_equal(g_ops->scatterv_group(c[2], &mine, 1, NULL), SL_ERR_COMM);
  assert_string_equal(h[2].msg, "nccl scatterv group: nccl on rank 2 (cuda:2): aborted (sl_context_abort)");
  for (int r = 0; r < W; r++) g_ops->fini(c[r]);
  assert_int_equal(F.live(), live0);
  assert_no_violation();
}

static int run_fake(void) {
  char why[512] = "";
  g_ops = sl_collective_module_v2();
  if (!(g_L = sl__nccl_lib(why, sizeof why))) {
    fprintf(stderr, "the fake NCCL did not load: %s (LD_LIBRARY_PATH must name its directory)\n", why);
    return 1;
  }
  /* the very object the module's dlopen found, by its soname */
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  void *sym;
  if (!h || !(sym = dlsym(h, "fakenccl_live"))) {
    fprintf(stderr, "libnccl.so.2 as loaded is not the fake (LD_LIBRARY_PATH must name its directory first)\n");
    return 1;
  }
  F.live = (int (*)(void))sym;
  F.config = (void (*)(int, int))dlsym(h, "fakenccl_config");
  F.stick = (void (*)(int))dlsym(h, "fakenccl_stick");
  F.violations = (int (*)(char *, size_t))dlsym(h, "fakenccl_violations");
  F.children_written = (int (*)(void))dlsym(h, "fakenccl_children_written");
  F.last_stream = (cudaStream_t(*)(int *))dlsym(h, "fakenccl_last_stream");
  F.posted = (unsigned long (*)(void))dlsym(h, "fakenccl_posted");
  F.stream_busy = (int (*)(cudaStream_t, unsigned long))dlsym(h, "fakenccl_stream_busy");
  F.groups = (int (*)(void))dlsym(h, "fakenccl_groups");
  if (!F.config || !F.stick || !F.violations || !F.children_written || !F.last_stream || !F.posted ||
      !F.stream_busy || !F.groups) {
    fprintf(stderr, "the fake NCCL lacks its fakenccl_* handles\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(split_that_never_completes_fails_within_the_timeout),
      cmocka_unit_test(split_child_that_lands_after_the_call_is_kept_and_aborted),
      cmocka_unit_test(split_that_completes_reads_the_child),
      cmocka_unit_test(fini_after_abort_ends_behind_a_stuck_kernel),
      cmocka_unit_test(fini_ends_behind_a_stuck_destroy),
      cmocka_unit_test(a_later_teardown_waits_in_full),
      cmocka_unit_test(data_ops_go_on_the_backends_native_streams),
      cmocka_unit_test(scatterv_group_moves_every_items_bytes),
      cmocka_unit_test(scatterv_group_refuses_bad_items),
      cmocka_unit_test(scatterv_group_fails_as_scatterv_does),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s libshardload-nccl.so | --fake\n", argv[0]);
    return 2;
  }
  if (strcmp(argv[1], "--fake") == 0) return run_fake();
  g_path = argv[1];
  void *h = dlopen(g_path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "cannot load %s: %s\n", g_path, dlerror());
    return 1;
  }
  sl_collective_entry_fn entry = (sl_collective_entry_fn)dlsym(h, SL_COLLECTIVE_ENTRY);
  if (!entry || !(g_ops = entry())) {
    fprintf(stderr, "%s has no %s\n", g_path, SL_COLLECTIVE_ENTRY);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(table_is_valid),
      cmocka_unit_test(exports_entry_only),
      cmocka_unit_test(probe_names_the_backend),
      cmocka_unit_test(probe_says_what_is_missing),
      cmocka_unit_test(registry_finds_the_module),
      cmocka_unit_test(init_refuses_other_backends),
      cmocka_unit_test(init_without_device_fails_cleanly),
      cmocka_unit_test(every_rank_fails_together),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  dlclose(h);
  return failed;
}
