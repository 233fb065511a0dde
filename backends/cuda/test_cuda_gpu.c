/* libshardload-cuda.so on a device (ctest label "gpu"; exits 77, skipped, where the module's
 * probe finds no usable device): what is CUDA's own. Every op against the contract (casts
 * bit-exact with sl_convert, copies and 2-D copies between pageable, pinned, registered and
 * device memory ordered by streams and events, is_device_ptr, the SGD and traffic extensions,
 * sticky errors, frees of lent memory behind a consumer's stream) is a case of the backend
 * conformance suite (tests/conformance/, conformance_backend_cuda). Here: DLPack's special
 * stream values, which only a CUDA backend reads — the legacy (1) and the per-thread (2)
 * default stream — recorded on natively. Argument: the module's path. */
#define _GNU_SOURCE
#include <dlfcn.h>
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

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/libshardload-cuda.so\n", argv[0]);
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
  sl_backend_init in = {.size = sizeof in, .host = &host, .local_rank = 0, .local_world_size = 1, .device = -1,
                        .ops = ops};
  if (ops->init(&in, &be) != SL_OK) {
    fprintf(stderr, "init failed: %s\n", last_msg);
    return 1;
  }
  char desc[256];
  ops->describe(be, desc, sizeof desc);
  printf("# %s\n", desc);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_special_native_streams),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  ops->fini(be);
  return rc;
}
