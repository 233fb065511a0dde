/* The HIP backend's launch path without an AMD GPU: the kernels' object (what hipcc made of
 * cuda_kernels.cu, linked in with hip_rt.c and hip_launch.c, as in the module) against a fake
 * libamdhip64 (fake/fake_hip.c) that the runtime table's own dlopen finds on LD_LIBRARY_PATH.
 * The constructor clang emitted registered the kernels before main; they reach the runtime
 * only when it is opened, each launch reaches it with the kernel its launcher names, the
 * configuration pushed for it and its arguments, and a launcher that launches nothing (no
 * elements, a dtype pair without a kernel) calls nothing. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_kernels.h" /* sl_cuda_launch_cast, sl_cuda_launch_sgd; the HIP map (SL_VENDOR_HIP) */
#include "shardload/shardload.h"
#include "testutil.h"

static const char *(*last_launch)(uint32_t *grid, uint32_t *block, void **stream, uint64_t *n, int *launches);
static int (*registered)(void);

typedef struct launch {
  const char *kernel;
  uint32_t grid, block;
  void *stream;
  uint64_t n;
  int launches;
} launch;

static launch last(void) {
  launch l;
  l.kernel = last_launch(&l.grid, &l.block, &l.stream, &l.n, &l.launches);
  return l;
}

#define STREAM ((hipStream_t)(uintptr_t)0x5150)
#define ALIGNED ((void *)(uintptr_t)0x10000)
#define ODD ((void *)(uintptr_t)0x20001)

/* Every kernel of the file was held until the runtime opened, then handed to it: 12 cast
 * pairs, aligned and not, and 4 SGD kernels. */
static void test_registrations_reach_the_runtime_when_it_opens(void **state) {
  assert_int_equal(registered(), 12 * 2 + 4);
}

static void test_sgd_launches_its_kernel(void **state) {
  const struct {
    sl_dtype dt;
    const char *kernel;
  } cases[] = {{SL_DTYPE_F64, "sgd_f64"}, {SL_DTYPE_F32, "sgd_f32"}, {SL_DTYPE_F16, "sgd_halfILb0E"},
               {SL_DTYPE_BF16, "sgd_halfILb1E"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int before = last().launches;
    assert_int_equal(sl_cuda_launch_sgd(ALIGNED, ALIGNED, (int)cases[i].dt, 1000, 0.5f, STREAM), hipSuccess);
    launch l = last();
    printf("# SGD %s: %s, grid %u x %u, n %llu\n", sl_dtype_name(cases[i].dt), l.kernel, l.grid, l.block,
           (unsigned long long)l.n);
    assert_int_equal(l.launches, before + 1);
    assert_non_null(strstr(l.kernel, cases[i].kernel));
    assert_int_equal(l.grid, 4); /* ceil(1000 / 256) */
    assert_int_equal(l.block, 256);
    assert_ptr_equal(l.stream, STREAM);
    assert_int_equal(l.n, 1000);
  }
}

static void test_cast_launches_the_kernel_of_its_pair_and_alignment(void **state) {
  char want[64];
  assert_int_equal(sl_cuda_launch_cast(ALIGNED, SL_DTYPE_F16, ALIGNED, SL_DTYPE_F32, 300, STREAM), hipSuccess);
  launch l = last();
  snprintf(want, sizeof want, "cast_kernelILi%dELi%dELb1E", (int)SL_DTYPE_F32, (int)SL_DTYPE_F16);
  printf("# cast F32 -> F16: %s\n", l.kernel);
  assert_non_null(strstr(l.kernel, want));
  assert_int_equal(l.grid, 2);
  assert_int_equal(l.n, 300);
  /* a source at an odd address: the byte-wise kernel */
  assert_int_equal(sl_cuda_launch_cast(ALIGNED, SL_DTYPE_F64, ODD, SL_DTYPE_BF16, 7, STREAM), hipSuccess);
  l = last();
  snprintf(want, sizeof want, "cast_kernelILi%dELi%dELb0E", (int)SL_DTYPE_BF16, (int)SL_DTYPE_F64);
  assert_non_null(strstr(l.kernel, want));
  /* the grid is capped; the grid-stride loop covers the rest */
  assert_int_equal(sl_cuda_launch_cast(ALIGNED, SL_DTYPE_F32, ALIGNED, SL_DTYPE_F64, (size_t)1 << 30, STREAM),
                   hipSuccess);
  assert_int_equal(last().grid, 65536);
}

static void test_nothing_to_launch_calls_nothing(void **state) {
  int before = last().launches;
  assert_int_equal(sl_cuda_launch_cast(ALIGNED, SL_DTYPE_F16, ALIGNED, SL_DTYPE_F32, 0, STREAM), hipSuccess);
  assert_int_equal(sl_cuda_launch_sgd(ALIGNED, ALIGNED, (int)SL_DTYPE_F32, 0, 1.0f, STREAM), hipSuccess);
  assert_int_equal(sl_cuda_launch_cast(ALIGNED, SL_DTYPE_F32, ALIGNED, SL_DTYPE_F32, 5, STREAM), hipErrorInvalidValue);
  assert_int_equal(sl_cuda_launch_sgd(ALIGNED, ALIGNED, (int)SL_DTYPE_I32, 5, 1.0f, STREAM), hipErrorInvalidValue);
  assert_int_equal(last().launches, before);
}

int main(void) {
  /* the kernels' constructor ran, and registered with hip_launch.c only: no runtime yet */
  if (sl__hip_state != 0 || dlopen(SL_HIP_LIB, RTLD_NOW | RTLD_NOLOAD)) {
    fprintf(stderr, "the runtime was opened before main\n");
    return 1;
  }
  if (!sl__hip_open()) {
    fprintf(stderr, "the fake HIP runtime did not open: %s (LD_LIBRARY_PATH must name its directory)\n",
            sl__hip_why());
    return 1;
  }
  void *h = dlopen(SL_HIP_LIB, RTLD_NOW | RTLD_NOLOAD);
  registered = h ? (int (*)(void))dlsym(h, "fakehip_registered") : NULL;
  last_launch = h ? (const char *(*)(uint32_t *, uint32_t *, void **, uint64_t *, int *))dlsym(h, "fakehip_last_launch")
                  : NULL;
  if (!registered || !last_launch) {
    fprintf(stderr, SL_HIP_LIB " as loaded is not the fake (LD_LIBRARY_PATH must name its directory first)\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registrations_reach_the_runtime_when_it_opens),
      cmocka_unit_test(test_sgd_launches_its_kernel),
      cmocka_unit_test(test_cast_launches_the_kernel_of_its_pair_and_alignment),
      cmocka_unit_test(test_nothing_to_launch_calls_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
