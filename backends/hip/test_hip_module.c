/* libshardload-hip.so on the machine at hand, without an AMD GPU (CI: Debian's ROCm 5.2
 * runtime installed, no device): loading it opens no ROCm library, its table is the CUDA
 * module's under HIP's names, its probe and init say why they cannot run in HIP's words, and
 * the runtime table (hip_rt.c, linked in) explains a runtime that is missing or not a HIP
 * runtime. Also the vendor map's accessors and the module's target check. argv[1]: the module. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardload/module.h"
#include "testutil.h"
#include "vendor.h" /* the HIP map (SL_VENDOR_HIP): hip_rt.h, sl_vendor_call, SL_PTR_ATTR_TYPE */

static const char *module_path;
static void *module;
static const sl_backend_ops *ops;

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

static sl_status try_init(int local_rank, const char *variant, void **be) {
  sl_backend_init in = {.size = sizeof in, .host = &host, .local_rank = local_rank, .local_world_size = 1,
                        .device = -1, .variant = variant, .ops = ops};
  last_msg[0] = 0;
  return ops->init(&in, be);
}

/* Whether the process has the HIP runtime (or the HSA runtime under it) loaded. */
static int rocm_loaded(void) {
  const char *libs[] = {SL_HIP_LIB, "libhsa-runtime64.so.1"};
  for (int i = 0; i < 2; i++) {
    void *h = dlopen(libs[i], RTLD_NOW | RTLD_NOLOAD);
    if (h) {
      dlclose(h);
      return 1;
    }
  }
  return 0;
}

static int runtime_installed(void) {
  sl_hip_rt rt;
  char why[512];
  return sl__hip_open_lib(SL_HIP_LIB, &rt, why, sizeof why);
}

/* Loading the module and reading its table touch no ROCm library: the module loads where
 * there is none (its kernels' registrations wait for the runtime; hip_launch.c). First. */
static void test_loading_opens_no_rocm_library(void **state) {
  assert_false(rocm_loaded());
  assert_string_equal(ops->name, "hip");
  assert_false(rocm_loaded());
}

static void test_table(void **state) {
  assert_int_equal(ops->abi_version, SL_BACKEND_ABI_VERSION);
  assert_int_equal(ops->size, sizeof(sl_backend_ops));
  assert_string_equal(ops->name, "hip");
  assert_string_equal(ops->preferred_collective, "rccl");
  assert_true(ops->flags & SL_BACKEND_HAS_PINNED);
  assert_false(ops->flags & SL_BACKEND_DEVICE_IS_HOST);
  assert_true(SL_HAS_OP(ops, probe) && SL_HAS_OP(ops, init) && SL_HAS_OP(ops, fini) && SL_HAS_OP(ops, describe));
  assert_true(SL_HAS_OP(ops, alloc_device) && SL_HAS_OP(ops, free_device) && SL_HAS_OP(ops, alloc_pinned));
  assert_true(SL_HAS_OP(ops, stream_create) && SL_HAS_OP(ops, event_record) && SL_HAS_OP(ops, stream_wait_event));
  assert_true(SL_HAS_OP(ops, copy_async) && SL_HAS_OP(ops, cast_async) && SL_HAS_OP(ops, copy_2d_async));
  assert_true(SL_HAS_OP(ops, is_device_ptr) && SL_HAS_OP(ops, device_identity) && SL_HAS_OP(ops, free_device_after));
  assert_non_null(ops->get_proc(SL_EXT_SGD_STEP));
  assert_non_null(ops->get_proc(SL_EXT_TRAFFIC));
  assert_non_null(ops->get_proc(SL_EXT_STREAM_ABANDON));
  assert_non_null(ops->get_proc(SL_EXT_DEVICE_COUNT)); /* `shardload backends` lists each device */
  /* native handles (module.h): RCCL pairs by the API and enqueues on the streams' hipStream_t;
   * DLPack's types come from the table; host functions as hipLaunchHostFunc */
  assert_true(SL_HAS_OP(ops, native_api) && SL_HAS_OP(ops, launch_host_fn));
  assert_string_equal(sl_backend_native_api(ops), "hip");
  assert_non_null(ops->get_proc(SL_EXT_NATIVE_STREAM));
  assert_int_equal(ops->dlpack_device_type, 10); /* kDLROCM */
  assert_int_equal(ops->dlpack_pinned_type, 11); /* kDLROCMHost */
  /* the module's internals stay inside: the runtime table and the launch ABI it defines */
  assert_null(dlsym(module, "sl__hip_rt"));
  assert_null(dlsym(module, "hipLaunchKernel"));
  assert_null(dlsym(module, "__hipRegisterFatBinary"));
  assert_null(dlsym(module, SL_BACKEND_ENTRY_V1));
}

/* The probe opens the runtime and says, in HIP's words, why it cannot run here. */
static void test_probe(void **state) {
  char reason[640] = "";
  int score = ops->probe(reason, sizeof reason);
  int loaded = rocm_loaded(), installed = runtime_installed();
  printf("# probe: %d \"%s\"\n", score, reason);
  assert_int_equal(strncmp(reason, "hip: ", 5), 0);
  if (!installed) {
    assert_int_equal(score, 0);
    assert_non_null(strstr(reason, "hip: libamdhip64.so not found (" SL_HIP_LIB ": cannot open shared object file"));
  } else if (score == 0) {
    assert_true(loaded); /* the probe opened it */
    assert_true(strstr(reason, "hip: no ROCm device (hipErrorNoDevice; check HIP_VISIBLE_DEVICES") ||
                strstr(reason, "hip: no ROCm device (the runtime sees none") || strstr(reason, "hip: no ROCm driver ("));
  } else {
    assert_true(score > 1); /* beats cpu for "auto" */
    assert_non_null(strstr(reason, "device"));
  }
  assert_int_equal(ops->probe(NULL, 0), score);
  char tiny[8];
  assert_int_equal(ops->probe(tiny, sizeof tiny), score);
  assert_int_equal(strlen(tiny), sizeof tiny - 1);
}

/* What the probe says where the runtime is missing, or is not a HIP runtime. */
static void test_runtime_missing_or_wrong(void **state) {
  sl_hip_rt rt;
  char why[640];
  assert_int_equal(sl__hip_open_lib("libamdhip64.so.404", &rt, why, sizeof why), 0);
  printf("# %s\n", why);
  assert_non_null(strstr(why, "libamdhip64.so not found (libamdhip64.so.404: cannot open shared object file"));
  assert_non_null(strstr(why, "this module was built against " SL_HIP_BUILT_WITH));
  assert_int_equal(sl__hip_open_lib("libm.so.6", &rt, why, sizeof why), 0);
  printf("# %s\n", why);
  assert_non_null(strstr(why, "libm.so.6 lacks hipGetErrorName: this module needs the HIP runtime of "
                              SL_HIP_BUILT_WITH));
}

/* Without a device init fails before allocating, with the runtime's own names. */
static void test_init_without_device(void **state) {
  char reason[640];
  void *be = NULL;
  if (ops->probe(reason, sizeof reason) > 0) skip(); /* test_hip_gpu covers a device */
  assert_int_equal(((sl_ext_device_count_fn)ops->get_proc(SL_EXT_DEVICE_COUNT))(), 0); /* none to list */
  assert_int_equal(try_init(3, NULL, &be), SL_ERR_NO_DEVICE);
  printf("# init: %s\n", last_msg);
  assert_null(be);
  if (runtime_installed())
    assert_non_null(strstr(last_msg, "hip (local rank 3): hipGetDeviceCount failed: hipErrorNoDevice ("));
  else
    assert_non_null(strstr(last_msg, "hip (local rank 3): hipGetDeviceCount failed: hipErrorInsufficientDriver "
                                     "(libamdhip64.so not found"));
  assert_non_null(strstr(last_msg, "install ROCm"));
}

static void test_init_rejects_bad_requests(void **state) {
  void *be = NULL;
  assert_int_equal(try_init(0, "strict", &be), SL_ERR_INVALID);
  assert_non_null(strstr(last_msg, "hip backend: unknown variant 'strict'; use --backend hip"));
  setenv("SHARDLOAD_HIP_SYNC_TIMEOUT_S", "ten", 1);
  sl_status st = try_init(0, NULL, &be);
  unsetenv("SHARDLOAD_HIP_SYNC_TIMEOUT_S");
  assert_int_equal(st, SL_ERR_INVALID);
  assert_non_null(strstr(last_msg, "hip backend: SHARDLOAD_HIP_SYNC_TIMEOUT_S='ten' is not a number of seconds"));
  assert_null(be);
}

/* A device the module has no code object for is refused (HIP has no JIT): the processor of
 * its gcnArchName is compared, its features are not. */
static void test_target_check(void **state) {
  printf("# built for %s\n", sl__hip_archs());
  assert_string_equal(sl__hip_archs(), SL_HIP_ARCHS);
  char first[32];
  snprintf(first, sizeof first, "%.*s", (int)strcspn(SL_HIP_ARCHS, ";:"), SL_HIP_ARCHS);
  char with_features[64];
  snprintf(with_features, sizeof with_features, "%s:sramecc+:xnack-", first);
  assert_true(sl__hip_has_code_for(first));
  assert_true(sl__hip_has_code_for(with_features));
  char longer[40];
  snprintf(longer, sizeof longer, "%sx", first);
  assert_false(sl__hip_has_code_for(longer));
  char shorter[32];
  snprintf(shorter, sizeof shorter, "%.*s", (int)strlen(first) - 1, first);
  assert_false(sl__hip_has_code_for(shorter));
  assert_false(sl__hip_has_code_for("gfx803"));
  assert_false(sl__hip_has_code_for(""));
}

/* The map's accessors: call names in messages, and the pointer attribute's memory type. */
static void test_vendor_map(void **state) {
  const char *rest, *pre = sl_vendor_call("cudaMemcpy2DAsync", &rest);
  assert_string_equal(pre, "hip");
  assert_string_equal(rest, "Memcpy2DAsync");
  pre = sl_vendor_call("cudaHostAlloc", &rest);
  assert_string_equal(pre, "");
  assert_string_equal(rest, "hipHostMalloc");
  pre = sl_vendor_call("sgd kernel launch", &rest);
  assert_string_equal(pre, "");
  assert_string_equal(rest, "sgd kernel launch");
  hipPointerAttribute_t a;
  memset(&a, 0, sizeof a);
  SL_PTR_ATTR_TYPE(a) = hipMemoryTypeDevice; /* the field this ROCm's header has */
  assert_int_equal(SL_PTR_ATTR_TYPE(a), hipMemoryTypeDevice);
  /* a mapped call works with or without a runtime: an error name either way, never a crash */
  int n = -1;
  hipError_t e = cudaGetDeviceCount(&n);
  printf("# cudaGetDeviceCount -> %s (%s)\n", cudaGetErrorName(e), cudaGetErrorString(e));
  assert_true(e == hipSuccess || e == hipErrorNoDevice || e == hipErrorInsufficientDriver);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/libshardload-hip.so\n", argv[0]);
    return 2;
  }
  module_path = argv[1];
  module = dlopen(module_path, RTLD_NOW | RTLD_LOCAL);
  sl_backend_entry_fn entry = module ? (sl_backend_entry_fn)dlsym(module, SL_BACKEND_ENTRY) : NULL;
  if (!entry || !(ops = entry())) {
    fprintf(stderr, "cannot load %s: %s\n", module_path, module ? "no entry symbol" : dlerror());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loading_opens_no_rocm_library), /* before anything opens the runtime */
      cmocka_unit_test(test_table),
      cmocka_unit_test(test_probe),
      cmocka_unit_test(test_runtime_missing_or_wrong),
      cmocka_unit_test(test_init_without_device),
      cmocka_unit_test(test_init_rejects_bad_requests),
      cmocka_unit_test(test_target_check),
      cmocka_unit_test(test_vendor_map),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
