/* libshardload-cuda.so on the machine at hand, device or not: it loads with dlopen (no driver
 * needed), exports only its entry symbol, fills the ABI v2 table, and its probe and init say
 * exactly why they cannot run where there is no driver or device (and, on a GPU machine, that
 * they can, and that bad requests fail naming the device). Argument: the module's path.
 * (Its bounded wait is shardload/module_util.h's sl_poll, tested by tests/test_module_util.c.) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardload/module.h"
#include "testutil.h"

static const char *module_path;
static void *module;
static const sl_backend_ops *ops;

/* The core's side of sl_module_host: keeps the last failure's message. */
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

static sl_status try_init(int local_rank, int device, const char *variant, void **be) {
  sl_backend_init in = {.size = sizeof in, .host = &host, .local_rank = local_rank, .local_world_size = 1,
                        .device = device, .variant = variant, .ops = ops};
  last_msg[0] = 0;
  return ops->init(&in, be);
}

static int driver_present(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (h) dlclose(h);
  return h != NULL;
}

static int setup(void **state) {
  module = dlopen(module_path, RTLD_NOW | RTLD_LOCAL);
  if (!module) {
    fprintf(stderr, "dlopen(%s): %s\n", module_path, dlerror());
    return -1;
  }
  sl_backend_entry_fn entry = (sl_backend_entry_fn)dlsym(module, SL_BACKEND_ENTRY);
  ops = entry ? entry() : NULL;
  return ops ? 0 : -1;
}

static int teardown(void **state) {
  if (module) dlclose(module);
  return 0;
}

static void test_table(void **state) {
  assert_int_equal(ops->abi_version, SL_BACKEND_ABI_VERSION);
  assert_int_equal(ops->size, sizeof(sl_backend_ops));
  assert_string_equal(ops->name, "cuda");
  assert_string_equal(ops->preferred_collective, "nccl");
  assert_true(ops->flags & SL_BACKEND_HAS_PINNED);
  assert_false(ops->flags & SL_BACKEND_DEVICE_IS_HOST);
  /* every member, optional ones included: the core uses the device casts and 2-D copies */
  assert_true(SL_HAS_OP(ops, probe) && SL_HAS_OP(ops, init) && SL_HAS_OP(ops, fini) && SL_HAS_OP(ops, describe));
  assert_true(SL_HAS_OP(ops, device_ordinal) && SL_HAS_OP(ops, alloc_device) && SL_HAS_OP(ops, free_device));
  assert_true(SL_HAS_OP(ops, alloc_pinned) && SL_HAS_OP(ops, free_pinned) && SL_HAS_OP(ops, stream_create));
  assert_true(SL_HAS_OP(ops, stream_destroy) && SL_HAS_OP(ops, event_create) && SL_HAS_OP(ops, event_destroy));
  assert_true(SL_HAS_OP(ops, event_record) && SL_HAS_OP(ops, stream_wait_event) && SL_HAS_OP(ops, event_query));
  assert_true(SL_HAS_OP(ops, event_sync) && SL_HAS_OP(ops, stream_sync) && SL_HAS_OP(ops, synchronize));
  assert_true(SL_HAS_OP(ops, copy_async) && SL_HAS_OP(ops, cast_async) && SL_HAS_OP(ops, copy_2d_async));
  assert_true(SL_HAS_OP(ops, register_host) && SL_HAS_OP(ops, unregister_host) && SL_HAS_OP(ops, is_device_ptr));
  assert_true(SL_HAS_OP(ops, get_proc) && SL_HAS_OP(ops, device_identity));
  assert_non_null(ops->get_proc(SL_EXT_SGD_STEP));
  assert_non_null(ops->get_proc(SL_EXT_TRAFFIC));
  assert_non_null(ops->get_proc(SL_EXT_STREAM_ABANDON)); /* the NCCL module gives up a left-behind stream */
  assert_null(ops->get_proc("sl_ext_no_such_thing"));
  /* native handles (module.h): NCCL pairs by the API and enqueues on the streams' cudaStream_t;
   * DLPack's types come from the table; host functions as cudaLaunchHostFunc */
  assert_true(SL_HAS_OP(ops, native_api) && SL_HAS_OP(ops, launch_host_fn));
  assert_string_equal(sl_backend_native_api(ops), "cuda");
  assert_non_null(ops->get_proc(SL_EXT_NATIVE_STREAM));
  assert_int_equal(ops->dlpack_device_type, 2); /* kDLCUDA */
  assert_int_equal(ops->dlpack_pinned_type, 3); /* kDLCUDAHost */
  /* no v1 entry: the core adapts nothing */
  assert_null(dlsym(module, SL_BACKEND_ENTRY_V1));
}

/* Only the entry symbol is exported: not the static CUDA runtime, not a helper. */
static void test_exports(void **state) {
  char *out = NULL;
  int rc = sl_test_run(&out, "nm -D --defined-only '%s'", module_path);
  if (rc != 0) {
    free(out);
    skip(); /* no nm: test_symbols (the lead's) covers it where binutils are */
  }
  int entries = 0;
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    const char *sym = strrchr(line, ' ');
    sym = sym ? sym + 1 : line;
    if (strcmp(sym, SL_BACKEND_ENTRY) == 0) entries++;
    else fail_msg("libshardload-cuda.so exports '%s'; only %s may be exported", line, SL_BACKEND_ENTRY);
  }
  free(out);
  assert_int_equal(entries, 1);
}

/* Probe is cheap and says why; without a driver it names libcuda.so.1 and the loader's error. */
static void test_probe(void **state) {
  char reason[512] = "";
  int score = ops->probe(reason, sizeof reason);
  printf("# probe: %d \"%s\"\n", score, reason);
  assert_int_equal(strncmp(reason, "cuda: ", 6), 0);
  if (!driver_present()) {
    assert_int_equal(score, 0);
    assert_non_null(strstr(reason, "cuda: no CUDA driver (libcuda.so.1 not found: "));
    assert_non_null(strstr(reason, "libcuda.so.1")); /* dlerror's text follows */
  } else if (score == 0) {
    assert_true(strstr(reason, "cuda: no CUDA driver (") || strstr(reason, "cuda: no device"));
  } else {
    assert_true(score > 1); /* beats cpu for "auto" */
    assert_non_null(strstr(reason, "device"));
  }
  assert_int_equal(ops->probe(NULL, 0), score); /* a caller that wants no reason */
  char tiny[8];
  assert_int_equal(ops->probe(tiny, sizeof tiny), score);
  assert_int_equal(strlen(tiny), sizeof tiny - 1); /* truncated, terminated */
}

/* Bad requests fail before touching the device, naming what to do. */
static void test_init_rejects_bad_requests(void **state) {
  void *be = NULL;
  assert_int_equal(try_init(0, -1, "strict", &be), SL_ERR_INVALID);
  assert_non_null(strstr(last_msg, "unknown variant 'strict'"));
  setenv("SHARDLOAD_CUDA_SYNC_TIMEOUT_S", "ten", 1);
  sl_status st = try_init(0, -1, NULL, &be);
  unsetenv("SHARDLOAD_CUDA_SYNC_TIMEOUT_S");
  assert_int_equal(st, SL_ERR_INVALID);
  assert_non_null(strstr(last_msg, "SHARDLOAD_CUDA_SYNC_TIMEOUT_S='ten'"));
  assert_null(be);
}

/* Without a usable device init fails with SL_ERR_NO_DEVICE naming the call, the CUDA error and
 * the rank; with one, an ordinal out of range fails naming it and the count, and a good one
 * describes the device. */
static void test_init_device(void **state) {
  char reason[512];
  void *be = NULL;
  /* SL_EXT_DEVICE_COUNT (what `shardload backends` lists): the ordinals init takes */
  sl_ext_device_count_fn count = (sl_ext_device_count_fn)ops->get_proc(SL_EXT_DEVICE_COUNT);
  assert_non_null(count);
  int n = count();
  printf("# device count %d\n", n);
  if (ops->probe(reason, sizeof reason) == 0) {
    assert_int_equal(n, 0);
    assert_int_equal(try_init(3, -1, NULL, &be), SL_ERR_NO_DEVICE);
    printf("# init without a device: %s\n", last_msg);
    assert_non_null(strstr(last_msg, "cuda (local rank 3): cudaGetDeviceCount failed: cuda"));
    if (!driver_present()) assert_non_null(strstr(last_msg, "cudaErrorInsufficientDriver"));
    assert_null(be);
    return;
  }
  assert_int_equal(try_init(0, 4096, NULL, &be), SL_ERR_NO_DEVICE);
  assert_non_null(strstr(last_msg, "device 4096 requested"));
  assert_null(be);
  assert_true(n >= 1);
  assert_int_equal(try_init(0, n, NULL, &be), SL_ERR_NO_DEVICE); /* one past the count */
  assert_null(be);
  assert_int_equal(try_init(0, -1, NULL, &be), SL_OK);
  char desc[256];
  ops->describe(be, desc, sizeof desc);
  printf("# %s\n", desc);
  assert_int_equal(strncmp(desc, "cuda:", 5), 0);
  assert_non_null(strstr(desc, ", sm_"));
  assert_non_null(strstr(desc, ", bus "));
  assert_int_equal(ops->device_ordinal(be), 0);
  /* the identity the ranks compare: the PCI address in one spelling (lower-case hex), the one
   * describe() shows */
  char id[64];
  unsigned dom, bus, dev, fn;
  int end = 0;
  ops->device_identity(be, id, sizeof id);
  printf("# identity %s\n", id);
  assert_int_equal(sscanf(id, "%4x:%2x:%2x.%1x%n", &dom, &bus, &dev, &fn, &end), 4);
  assert_int_equal((size_t)end, strlen(id));
  for (const char *c = id; *c; c++) assert_false(*c >= 'A' && *c <= 'F');
  char shown[32];
  snprintf(shown, sizeof shown, ", bus %04x:%02x:%02x.", dom, bus, dev);
  assert_non_null(strstr(desc, shown));
  ops->fini(be);
}

/* The registry finds the module next to libshardload and calls its probe for an explicitly
 * named backend: without a device, `load --backend cuda` fails (exit 1) with the probe's
 * reason on every rank, and `--backend auto` falls back to cpu. */
static void test_cli(void **state) {
  char reason[512];
  if (ops->probe(reason, sizeof reason) > 0) skip(); /* test_cuda_gpu and bench/gpu-check.sh load on a device */
  char *dir = sl_test_dir("cuda_cli");
  char *ckpt = sl_test_path(dir, "model.safetensors");
  const sl_test_tensor t[] = {{"w", "F32", 2, {8, 4}, NULL}, {"b", "BF16", 1, {8}, NULL}};
  assert_int_equal(sl_test_write_st(ckpt, t, 2, NULL), 0);
  char *out = NULL;
  int rc = sl_test_run(&out, "'%s' load '%s' --backend cuda", sl_test_bin(), ckpt);
  printf("# --backend cuda: exit %d: %s", rc, out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, reason));
  free(out);
  rc = sl_test_run(&out, "'%s' load '%s' --backend cuda --nproc 2", sl_test_bin(), ckpt);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, reason));
  free(out);
  rc = sl_test_run(&out, "'%s' load '%s' --backend auto", sl_test_bin(), ckpt);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "backend cpu"));
  free(out);
  free(ckpt);
  free(dir);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/libshardload-cuda.so\n", argv[0]);
    return 2;
  }
  module_path = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table),
      cmocka_unit_test(test_exports),
      cmocka_unit_test(test_probe),
      cmocka_unit_test(test_init_rejects_bad_requests),
      cmocka_unit_test(test_init_device),
      cmocka_unit_test(test_cli),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
