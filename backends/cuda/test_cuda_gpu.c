/* libshardload-cuda.so on a device (ctest label "gpu"; exits 77, skipped, where the module's
 * probe finds no usable device): every cast pair on the GPU bit-exact with sl_convert (16-bit
 * sources exhaustively, aligned and misaligned buffers), copies and 2-D copies between pageable,
 * pinned, registered and device memory ordered by streams and events, is_device_ptr, the SGD
 * extension against the host step, the traffic counters, sticky errors, frees of lent memory
 * behind a consumer's stream, host functions in stream order, native streams, and synchronize
 * from another thread. Argument: the module's path. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* sl__host_sgd_step: the reference for the SGD kernel */
#include "shardload/module.h"
#include "testutil.h"

static void *module;
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

static sl_status open_backend(void **out) {
  sl_backend_init in = {.size = sizeof in, .host = &host, .local_rank = 0, .local_world_size = 1, .device = -1,
                        .ops = ops};
  return ops->init(&in, out);
}

#define OK(call) assert_int_equal((call), SL_OK)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 0x2545F4914F6CDD1Dull;
}

/* Source values of DT: every 16-bit pattern (twice, for 16-bit types) or random bit patterns
 * with NaNs, infinities, subnormals and values near the narrow types' range. */
static void fill(unsigned char *p, sl_dtype dt, size_t n) {
  size_t es = sl_dtype_size(dt);
  for (size_t i = 0; i < n; i++) {
    uint64_t v = rnd();
    if (es == 2) v = i & 0xFFFF;
    else if (es == 4 && (v & 3) == 0) v = (v >> 8 & 0x80000000u) | (uint32_t)(0x33000000u + (v >> 40) % 0x15000000u);
    else if (es == 8 && (v & 3) == 0) v = (v & 0x800FFFFFFFFFFFFFull) | (uint64_t)(1023 - 150 + (v >> 52) % 300) << 52;
    memcpy(p + i * es, &v, es);
  }
}

/* H2D (pageable) on stream A, cast on A at the given byte offsets, D2H into pinned memory on
 * stream B after an event: the bytes must equal sl_convert's. */
static void cast_case(sl_dtype sdt, sl_dtype ddt, size_t n, size_t soff, size_t doff) {
  size_t ss = sl_dtype_size(sdt), ds = sl_dtype_size(ddt);
  unsigned char *src = malloc(n * ss), *want = malloc(n * ds), *got = NULL;
  unsigned char *dsrc = NULL, *ddst = NULL;
  void *a = NULL, *b = NULL, *ev = NULL, *done = NULL;
  assert_non_null(src);
  assert_non_null(want);
  fill(src, sdt, n);
  OK(sl_convert(want, ddt, src, sdt, n));
  OK(ops->alloc_pinned(be, n * ds, (void **)&got));
  memset(got, 0xA5, n * ds);
  OK(ops->alloc_device(be, n * ss + soff, (void **)&dsrc));
  OK(ops->alloc_device(be, n * ds + doff, (void **)&ddst));
  OK(ops->stream_create(be, &a));
  OK(ops->stream_create(be, &b));
  OK(ops->event_create(be, &ev));
  OK(ops->event_create(be, &done));
  OK(ops->copy_async(be, dsrc + soff, src, n * ss, SL_COPY_H2D, a));
  OK(ops->cast_async(be, ddst + doff, ddt, dsrc + soff, sdt, n, a));
  OK(ops->event_record(be, ev, a));
  OK(ops->stream_wait_event(be, b, ev));
  OK(ops->copy_async(be, got, ddst + doff, n * ds, SL_COPY_D2H, b));
  OK(ops->event_record(be, done, b));
  OK(ops->event_sync(be, done));
  assert_int_equal(ops->event_query(be, done), 1);
  for (size_t i = 0; i < n; i++)
    if (memcmp(want + i * ds, got + i * ds, ds) != 0) {
      uint64_t in = 0, w = 0, g = 0;
      memcpy(&in, src + i * ss, ss);
      memcpy(&w, want + i * ds, ds);
      memcpy(&g, got + i * ds, ds);
      fail_msg("%s -> %s (offsets %zu/%zu) element %zu: input 0x%llx, sl_convert 0x%llx, GPU 0x%llx",
               sl_dtype_name(sdt), sl_dtype_name(ddt), soff, doff, i, (unsigned long long)in, (unsigned long long)w,
               (unsigned long long)g);
    }
  ops->event_destroy(be, done);
  ops->event_destroy(be, ev);
  ops->stream_destroy(be, b);
  ops->stream_destroy(be, a);
  ops->free_device(be, ddst);
  ops->free_device(be, dsrc);
  ops->free_pinned(be, got);
  free(want);
  free(src);
}

static void test_casts(void **state) {
  const sl_dtype dts[] = {SL_DTYPE_F64, SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) {
      cast_case(dts[i], dts[j], 1u << 20, 0, 0);  /* same dtype: a device copy */
      cast_case(dts[i], dts[j], 131073, 2, 1);    /* misaligned: the byte-wise kernels */
    }
}

static void test_copy_2d_and_memory(void **state) {
  enum { W = 300, H = 64, SP = 512, DP = 320 };
  unsigned char *host = malloc(SP * H), *back = malloc(DP * H), *dev = NULL;
  assert_non_null(host);
  assert_non_null(back);
  for (size_t i = 0; i < SP * H; i++) host[i] = (unsigned char)rnd();
  memset(back, 0, DP * H);
  OK(ops->register_host(be, host, SP * H));
  OK(ops->alloc_device(be, DP * H, (void **)&dev));
  assert_true(ops->is_device_ptr(be, dev, DP * H));
  assert_true(ops->is_device_ptr(be, dev + 10, DP * H - 10));
  assert_false(ops->is_device_ptr(be, dev + 10, DP * H));
  assert_false(ops->is_device_ptr(be, host, 16));
  uint64_t h2d0, d2h0, h2d1, d2h1;
  sl_ext_traffic_fn traffic = (sl_ext_traffic_fn)ops->get_proc(SL_EXT_TRAFFIC);
  traffic(be, &h2d0, &d2h0);
  OK(ops->copy_2d_async(be, dev, DP, host, SP, W, H, SL_COPY_H2D, NULL)); /* the NULL stream */
  OK(ops->copy_2d_async(be, back, DP, dev, DP, W, H, SL_COPY_D2H, NULL));
  OK(ops->stream_sync(be, NULL));
  traffic(be, &h2d1, &d2h1);
  assert_int_equal(h2d1 - h2d0, (uint64_t)W * H);
  assert_int_equal(d2h1 - d2h0, (uint64_t)W * H);
  for (size_t r = 0; r < H; r++) assert_memory_equal(back + r * DP, host + r * SP, W);
  ops->free_device(be, dev);
  ops->unregister_host(be, host);
  OK(ops->synchronize(be));
  free(back);
  free(host);
}

static void test_sgd(void **state) {
  const sl_dtype dts[] = {SL_DTYPE_F64, SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};
  sl_ext_sgd_step_fn sgd = (sl_ext_sgd_step_fn)ops->get_proc(SL_EXT_SGD_STEP);
  for (int k = 0; k < 4; k++) {
    size_t n = 100003, es = sl_dtype_size(dts[k]);
    float *xf = malloc(n * 4), *gf = malloc(n * 4);
    unsigned char *x = malloc(n * es), *g = malloc(n * es), *got = malloc(n * es), *dx = NULL, *dg = NULL;
    for (size_t i = 0; i < n; i++) {
      xf[i] = (float)((double)(rnd() % 2000001) / 1000.0 - 1000.0);
      gf[i] = (float)((double)(rnd() % 2000001) / 7000.0 - 140.0);
    }
    OK(sl_convert(x, dts[k], xf, SL_DTYPE_F32, n));
    OK(sl_convert(g, dts[k], gf, SL_DTYPE_F32, n));
    OK(ops->alloc_device(be, n * es, (void **)&dx));
    OK(ops->alloc_device(be, n * es, (void **)&dg));
    OK(ops->copy_async(be, dx, x, n * es, SL_COPY_H2D, NULL));
    OK(ops->copy_async(be, dg, g, n * es, SL_COPY_H2D, NULL));
    OK(sgd(be, dx, dg, dts[k], n, 0.01f)); /* complete on return: orders after the copies itself */
    OK(ops->copy_async(be, got, dx, n * es, SL_COPY_D2H, NULL));
    OK(ops->stream_sync(be, NULL));
    OK(sl__host_sgd_step(x, g, dts[k], n, 0.01f));
    if (memcmp(x, got, n * es) != 0) fail_msg("sgd step on %s differs from the host step", sl_dtype_name(dts[k]));
    ops->free_device(be, dg);
    ops->free_device(be, dx);
    free(got), free(g), free(x), free(gf), free(xf);
  }
}

/* A failed enqueue is returned at once and again by every later sync (its own backend: the
 * error never clears). */
static void test_sticky(void **state) {
  void *b2 = NULL, *d = NULL;
  OK(open_backend(&b2));
  OK(ops->alloc_device(b2, 64, &d));
  assert_int_equal(ops->cast_async(b2, d, SL_DTYPE_I32, (char *)d + 32, SL_DTYPE_F32, 4, NULL), SL_ERR_DTYPE);
  last_msg[0] = 0;
  assert_int_equal(ops->stream_sync(b2, NULL), SL_ERR_DTYPE);
  assert_non_null(strstr(last_msg, "cast_async: cannot cast"));
  assert_int_equal(ops->synchronize(b2), SL_ERR_DTYPE);
  ops->free_device(b2, d);
  ops->fini(b2);
}

/* Memory lent to a consumer (free_device_after, shardload.h at sl_state_export): the consumer's
 * stream (a CUDA stream the way torch's are: the module's ABI streams are CUDA streams) is kept
 * busy by a chain of large copies, then reads the lent buffer; the buffer is released behind an
 * event recorded natively on that stream, and a new allocation is filled at once. The consumer
 * must read the lent bytes: a free that did not wait would hand the memory to the new
 * allocation (wrong bytes) or trim it away (an illegal address). */
static void test_free_after_consumer(void **state) {
  enum { LENT = 64 << 20, SCRATCH = 256 << 20, CHAIN = 400 };
  unsigned char *pattern = malloc(LENT), *got = NULL, *lent = NULL, *x = NULL, *y = NULL, *fresh = NULL;
  void *consumer = NULL, *ev = NULL, *done = NULL, *legacy = NULL, *per_thread = NULL;
  assert_non_null(pattern);
  for (size_t i = 0; i < LENT; i++) pattern[i] = (unsigned char)(i * 7 + (i >> 12));
  OK(ops->alloc_pinned(be, LENT, (void **)&got));
  memset(got, 0, LENT);
  OK(ops->alloc_device(be, LENT, (void **)&lent));
  OK(ops->alloc_device(be, SCRATCH, (void **)&x));
  OK(ops->alloc_device(be, SCRATCH, (void **)&y));
  OK(ops->copy_async(be, lent, pattern, LENT, SL_COPY_H2D, NULL));
  OK(ops->stream_sync(be, NULL));
  OK(ops->stream_create(be, &consumer));
  OK(ops->event_create(be, &ev));
  OK(ops->event_create(be, &done));
  for (int i = 0; i < CHAIN; i++) OK(ops->copy_async(be, i & 1 ? x : y, i & 1 ? y : x, SCRATCH, SL_COPY_D2D, consumer));
  OK(ops->copy_async(be, got, lent, LENT, SL_COPY_D2H, consumer));
  OK(ops->event_record(be, done, consumer));
  OK(ops->event_record_native(be, ev, consumer));
  OK(ops->free_device_after(be, (void *const *)&lent, 1, (void *const *)&ev, 1)); /* takes ev */
  int pending = ops->event_query(be, done) == 0;
  /* a new allocation of the same size, written at once, while the consumer still reads */
  OK(ops->alloc_device(be, LENT, (void **)&fresh));
  unsigned char *ones = malloc(LENT);
  assert_non_null(ones);
  memset(ones, 0xFF, LENT);
  OK(ops->copy_async(be, fresh, ones, LENT, SL_COPY_H2D, NULL));
  OK(ops->stream_sync(be, NULL));
  OK(ops->event_sync(be, done));
  if (!pending) printf("# the consumer's chain ended before the free was queued: lengthen CHAIN\n");
  assert_true(pending); /* otherwise the test proves nothing */
  if (memcmp(got, pattern, LENT) != 0) fail_msg("the consumer read other bytes than the lent buffer's");
  /* DLPack's special streams: the legacy (1) and the per-thread (2) default stream */
  OK(ops->event_create(be, &legacy));
  OK(ops->event_create(be, &per_thread));
  OK(ops->event_record_native(be, legacy, (void *)(uintptr_t)1));
  OK(ops->event_record_native(be, per_thread, (void *)(uintptr_t)2));
  OK(ops->event_sync(be, legacy));
  OK(ops->event_sync(be, per_thread));
  OK(ops->synchronize(be));
  ops->event_destroy(be, per_thread);
  ops->event_destroy(be, legacy);
  ops->event_destroy(be, done);
  ops->stream_destroy(be, consumer);
  ops->free_device(be, fresh);
  ops->free_device(be, y);
  ops->free_device(be, x);
  ops->free_pinned(be, got);
  free(ones);
  free(pattern);
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
  assert_string_equal(ops->native_api, "cuda");
  assert_int_equal(ops->dlpack_device_type, 2);
  assert_int_equal(ops->dlpack_pinned_type, 3);
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
  OK(ops->launch_host_fn(be, s, host_step_fn, &h));
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
    fprintf(stderr, "usage: %s path/to/libshardload-cuda.so\n", argv[0]);
    return 2;
  }
  module = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  sl_backend_entry_fn entry = module ? (sl_backend_entry_fn)dlsym(module, SL_BACKEND_ENTRY) : NULL;
  ops = entry ? entry() : NULL;
  if (!ops) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  char reason[512];
  if (ops->probe(reason, sizeof reason) <= 0) {
    printf("SKIPPED: no usable CUDA device: %s\n", reason);
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
      cmocka_unit_test(test_casts),
      cmocka_unit_test(test_copy_2d_and_memory),
      cmocka_unit_test(test_sgd),
      cmocka_unit_test(test_sticky),
      cmocka_unit_test(test_free_after_consumer),
      cmocka_unit_test(test_host_fn_and_native_streams),
      cmocka_unit_test(test_synchronize_while_streams_come_and_go),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  ops->fini(be);
  return rc;
}
