/* libshardload-cuda.so on a device (ctest label "gpu"; exits 77, skipped, where the module's
 * probe finds no usable device): what is CUDA's own. Every op against the contract (casts
 * bit-exact with sl_convert, copies and 2-D copies between pageable, pinned, registered and
 * device memory ordered by streams and events, is_device_ptr, the SGD and traffic extensions,
 * sticky errors, frees of lent memory behind a consumer's stream) is a case of the backend
 * conformance suite (tests/conformance/, conformance_backend_cuda). Here: DLPack's special
 * stream values, which only a CUDA backend reads — the legacy (1) and the per-thread (2)
 * default stream — recorded on natively; host functions in stream order and native streams
 * through the ABI; synchronize from another thread while streams come and go. Argument: the
 * module's path. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardload/module.h"
#include "testutil.h"

/* DLPack's legacy default stream: 1 for CUDA; HIP has none before ROCm 6.1, its NULL stream (0)
 * is the legacy stream (backends/hip builds this test with 0) */
#ifndef SL_TEST_NATIVE_LEGACY_STREAM
#define SL_TEST_NATIVE_LEGACY_STREAM 1
#endif
/* the table's native API and DLPack types: CUDA's (kDLCUDA, kDLCUDAHost) unless the build says
 * (hip: "hip", kDLROCM 10, kDLROCMHost 11) */
#ifndef SL_TEST_NATIVE_API
#define SL_TEST_NATIVE_API "cuda"
#define SL_TEST_DLPACK_DEVICE 2
#define SL_TEST_DLPACK_PINNED 3
#endif

static const sl_backend_ops *ops;
static void *be;

static char last_msg[2048];
static sl_status t_fail(void *core, sl_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof last_msg, fmt, ap);
  va_end(ap);
  return s;
}
static void t_log(void *core, sl_log_level level, const char *fmt, ...) {}
static const sl_module_host host = {sizeof(sl_module_host), NULL, t_log, t_fail};

#define OK(call) assert_int_equal((call), SL_OK)

static sl_status open_backend(void **out) {
  sl_backend_init in = {.size = sizeof in, .host = &host, .local_rank = 0, .local_world_size = 1, .device = -1,
                        .ops = ops};
  return ops->init(&in, out);
}

/* An event recorded natively on the legacy and on the per-thread default stream completes
 * behind what those streams hold: here, an H2D copy each. */
static void test_special_native_streams(void **state) {
  void *legacy = NULL, *per_thread = NULL, *d = NULL;
  enum { N = 1 << 20 };
  unsigned char *h = malloc(N);
  assert_non_null(h);
  memset(h, 7, N);
  OK(ops->alloc_device(be, N, &d));
  OK(ops->event_create(be, &legacy));
  OK(ops->event_create(be, &per_thread));
  OK(ops->copy_async(be, d, h, N, SL_COPY_H2D, NULL));
  OK(ops->event_record_native(be, legacy, (void *)(uintptr_t)SL_TEST_NATIVE_LEGACY_STREAM));
  OK(ops->event_record_native(be, per_thread, (void *)(uintptr_t)2));
  OK(ops->event_sync(be, legacy));
  OK(ops->event_sync(be, per_thread));
  assert_int_equal(ops->event_query(be, legacy), 1);
  assert_int_equal(ops->event_query(be, per_thread), 1);
  OK(ops->synchronize(be));
  ops->event_destroy(be, per_thread);
  ops->event_destroy(be, legacy);
  ops->free_device(be, d);
  free(h);
}

/* launch_host_fn (cudaLaunchHostFunc): the function runs after the D2H queued before it (it
 * reads what landed in pinned memory) and before the H2D after it (which uploads what it wrote);
 * its failure is the stream's sticky error, with its message. SL_EXT_NATIVE_STREAM gives the
 * streams' cudaStream_t: the streams themselves, the module's default one for NULL. */
typedef struct host_step {
  unsigned char *seen, *next;
  size_t n;
  int saw;
} host_step;
static sl_status host_step_fn(void *arg, char *err, size_t errlen) {
  host_step *h = arg;
  h->saw = 1;
  for (size_t i = 0; i < h->n; i++) h->saw &= h->seen[i] == (unsigned char)i;
  for (size_t i = 0; i < h->n; i++) h->next[i] = (unsigned char)(255 - i);
  return SL_OK;
}
static sl_status failing_fn(void *arg, char *err, size_t errlen) {
  snprintf(err, errlen, "host function failed on purpose");
  return SL_ERR_PEER;
}

static void test_host_fn_and_native_streams(void **state) {
  enum { N = 1 << 20 };
  sl_ext_native_stream_fn native = (sl_ext_native_stream_fn)ops->get_proc(SL_EXT_NATIVE_STREAM);
  assert_non_null(native);
  assert_string_equal(ops->native_api, SL_TEST_NATIVE_API);
  assert_int_equal(ops->dlpack_device_type, SL_TEST_DLPACK_DEVICE);
  assert_int_equal(ops->dlpack_pinned_type, SL_TEST_DLPACK_PINNED);
  void *s = NULL;
  unsigned char *src = malloc(N), *seen = NULL, *next = NULL, *back = malloc(N), *d = NULL;
  assert_non_null(src);
  assert_non_null(back);
  for (size_t i = 0; i < N; i++) src[i] = (unsigned char)i;
  OK(ops->stream_create(be, &s));
  assert_ptr_equal(native(be, s), s);
  assert_non_null(native(be, NULL));
  OK(ops->alloc_pinned(be, N, (void **)&seen));
  OK(ops->alloc_pinned(be, N, (void **)&next));
  memset(seen, 0, N);
  memset(next, 0, N);
  OK(ops->alloc_device(be, N, (void **)&d));
  OK(ops->copy_async(be, d, src, N, SL_COPY_H2D, s));
  OK(ops->copy_async(be, seen, d, N, SL_COPY_D2H, s));
  host_step h = {seen, next, N, 0};
  sl_status lst = ops->launch_host_fn(be, s, host_step_fn, &h);
  if (lst == SL_ERR_UNSUPPORTED) { /* ROCm 5.2: no hipLaunchHostFunc in its library (module.h) */
    printf("# launch_host_fn: %s\n", last_msg);
    skip();
  }
  OK(lst);
  OK(ops->copy_async(be, d, next, N, SL_COPY_H2D, s));
  OK(ops->copy_async(be, back, d, N, SL_COPY_D2H, s));
  OK(ops->stream_sync(be, s));
  assert_true(h.saw);
  for (size_t i = 0; i < N; i++)
    if (back[i] != (unsigned char)(255 - i)) fail_msg("byte %zu: the H2D after the host function ran before it", i);
  ops->free_device(be, d);
  ops->free_pinned(be, next);
  ops->free_pinned(be, seen);
  ops->stream_destroy(be, s);
  /* a failure: sticky, with the function's message (its own backend: the error never clears) */
  void *b2 = NULL;
  OK(open_backend(&b2));
  OK(ops->launch_host_fn(b2, NULL, failing_fn, NULL));
  last_msg[0] = 0;
  assert_int_equal(ops->stream_sync(b2, NULL), SL_ERR_PEER);
  assert_non_null(strstr(last_msg, "host function failed on purpose"));
  assert_int_equal(ops->synchronize(b2), SL_ERR_PEER);
  ops->fini(b2);
  free(back);
  free(src);
}

/* What a state's release calls on whichever thread drops it (event_query and event_sync behind
 * an export, free_pinned) leaves that thread as it found it: one with no CUDA context current (a
 * fresh garbage collector's) has none after (cudaSetDevice alone would leave the device's
 * primary context current there). CUDA's driver API only: skipped for hip. */
typedef struct foreign_arg {
  int (*get)(void **ctx); /* cuCtxGetCurrent */
  void *ev, *pinned;
  int fresh, ok, none_after;
} foreign_arg;
static void *foreign_release(void *p) {
  foreign_arg *a = p;
  void *ctx = (void *)1;
  a->fresh = a->get(&ctx) == 0 && ctx == NULL;
  int q = ops->event_query(be, a->ev);
  sl_status st = ops->event_sync(be, a->ev);
  ops->free_pinned(be, a->pinned);
  a->ok = q >= 0 && st == SL_OK;
  ctx = (void *)1;
  a->none_after = a->get(&ctx) == 0 && ctx == NULL;
  return NULL;
}

static void test_release_thread_left_as_found(void **state) {
  if (strcmp(SL_TEST_NATIVE_API, "cuda") != 0) skip();
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  assert_non_null(lib);
  foreign_arg a = {.get = (int (*)(void **))dlsym(lib, "cuCtxGetCurrent")};
  assert_non_null(a.get);
  OK(ops->event_create(be, &a.ev));
  OK(ops->event_record(be, a.ev, NULL));
  OK(ops->alloc_pinned(be, 4096, &a.pinned));
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, foreign_release, &a), 0);
  pthread_join(t, NULL);
  assert_true(a.fresh); /* a new thread starts with no context: else the test proves nothing */
  assert_true(a.ok);
  if (!a.none_after) fail_msg("event_query/event_sync/free_pinned left a CUDA context current on a foreign thread");
  ops->event_destroy(be, a.ev);
  OK(ops->synchronize(be)); /* a deferred pinned free, if any, runs here */
  dlclose(lib);
}

/* synchronize is callable from any thread (module.h, Threads: a state freed by a garbage
 * collector), while the context's thread creates and destroys streams: it never polls a stream
 * destroyed under it. */
static int stop_syncing;
static void *sync_loop(void *arg) {
  long bad = 0;
  while (!__atomic_load_n(&stop_syncing, __ATOMIC_ACQUIRE)) bad += ops->synchronize(be) != SL_OK;
  return (void *)bad;
}

static void test_synchronize_while_streams_come_and_go(void **state) {
  pthread_t t;
  __atomic_store_n(&stop_syncing, 0, __ATOMIC_RELEASE);
  assert_int_equal(pthread_create(&t, NULL, sync_loop, NULL), 0);
  unsigned char *d = NULL, h[4096];
  memset(h, 1, sizeof h);
  OK(ops->alloc_device(be, sizeof h, (void **)&d));
  for (int i = 0; i < 500; i++) {
    void *s = NULL;
    OK(ops->stream_create(be, &s));
    OK(ops->copy_async(be, d, h, sizeof h, SL_COPY_H2D, s));
    ops->stream_destroy(be, s);
  }
  __atomic_store_n(&stop_syncing, 1, __ATOMIC_RELEASE);
  void *bad = NULL;
  pthread_join(t, &bad);
  assert_int_equal((long)bad, 0);
  ops->free_device(be, d);
  OK(ops->synchronize(be));
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/libshardload-cuda.so (or -hip.so)\n", argv[0]);
    return 2;
  }
  void *module = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  sl_backend_entry_fn entry = module ? (sl_backend_entry_fn)dlsym(module, SL_BACKEND_ENTRY) : NULL;
  ops = entry ? entry() : NULL;
  if (!ops) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  char reason[512];
  if (ops->probe(reason, sizeof reason) <= 0) {
    printf("SKIPPED: no usable %s device: %s\n", ops->name, reason);
    return 77;
  }
  if (open_backend(&be) != SL_OK) {
    fprintf(stderr, "init failed: %s\n", last_msg);
    return 1;
  }
  char desc[256];
  ops->describe(be, desc, sizeof desc);
  printf("# %s\n", desc);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_special_native_streams),
      cmocka_unit_test(test_host_fn_and_native_streams),
      cmocka_unit_test(test_synchronize_while_streams_come_and_go),
      cmocka_unit_test(test_release_thread_left_as_found),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  ops->fini(be);
  return rc;
}
