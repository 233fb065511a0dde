/* The host implementations of SPIR-V kernels, by entry-point name: the test driver runs a
 * kernel of a module through the function of the same name.
 *
 * THE HOOK for the project's own kernels (the casts of backends/level_zero): a source of the
 * driver (add it to sl_ze_test_driver's list in CMakeLists.txt) defines
 *     const zedrv_host_kernel *zedrv_extra_host_kernels(size_t *count);
 * returning its table: one entry per SPIR-V entry point, with its argument count and sizes (8
 * for a pointer), and a run function that loops over every work-item of the launch and computes
 * what the kernel computes -- from the same element math the device kernels use
 * (backends/cuda/cuda_convert.h compiles as host code), so the host and the device share one
 * definition. It is looked up after the examples below (a weak symbol: absent, no table). A
 * module whose entry point has no entry still builds (a real device would build it), but
 * zeKernelCreate refuses the name and says so on stderr. */
#include "zedrv.h"

#include <string.h>

void *zedrv_arg_ptr(const zedrv_launch *l, uint32_t i) {
  void *p;
  memcpy(&p, l->args->value[i], sizeof p);
  return p;
}

uint32_t zedrv_arg_u32(const zedrv_launch *l, uint32_t i) {
  uint32_t v;
  memcpy(&v, l->args->value[i], sizeof v);
  return v;
}

/* The global work size of dimension 0: group size times group count. */
static uint64_t global_size_x(const zedrv_launch *l) {
  return (uint64_t)l->group_size[0] * l->groups.groupCountX;
}

/* kernels/example.cl: zedrv_add_u32(global uint *dst, global const uint *src, uint add, uint n):
 * dst[i] = src[i] + add for every global id i < n. */
static ze_result_t run_add_u32(const zedrv_launch *l) {
  uint32_t *dst = zedrv_arg_ptr(l, 0);
  const uint32_t *src = zedrv_arg_ptr(l, 1);
  uint32_t add = zedrv_arg_u32(l, 2), n = zedrv_arg_u32(l, 3);
  uint64_t gx = global_size_x(l);
  if (n && (!dst || !src)) return ZE_RESULT_ERROR_DEVICE_LOST; /* a device would fault on the NULL pointer */
  for (uint64_t i = 0; i < gx && i < n; i++) dst[i] = src[i] + add;
  return ZE_RESULT_SUCCESS;
}

/* kernels/example_f64.cl: zedrv_scale_f64(global double *dst, double factor, uint n). */
static ze_result_t run_scale_f64(const zedrv_launch *l) {
  double *dst = zedrv_arg_ptr(l, 0);
  double factor;
  memcpy(&factor, l->args->value[1], sizeof factor);
  uint32_t n = zedrv_arg_u32(l, 2);
  uint64_t gx = global_size_x(l);
  if (n && !dst) return ZE_RESULT_ERROR_DEVICE_LOST;
  for (uint64_t i = 0; i < gx && i < n; i++) dst[i] *= factor;
  return ZE_RESULT_SUCCESS;
}

static const zedrv_host_kernel zedrv_host_kernels[] = {
    {"zedrv_add_u32", 4, {8, 8, 4, 4}, run_add_u32}, {"zedrv_scale_f64", 3, {8, 8, 4}, run_scale_f64},
    /* the project's kernels come from zedrv_extra_host_kernels() */
};

const zedrv_host_kernel *zedrv_find_host_kernel(const char *name) {
  for (size_t i = 0; i < sizeof zedrv_host_kernels / sizeof zedrv_host_kernels[0]; i++)
    if (strcmp(zedrv_host_kernels[i].name, name) == 0) return &zedrv_host_kernels[i];
  if (zedrv_extra_host_kernels) {
    size_t n = 0;
    const zedrv_host_kernel *extra = zedrv_extra_host_kernels(&n);
    for (size_t i = 0; i < n; i++)
      if (strcmp(extra[i].name, name) == 0) return &extra[i];
  }
  return NULL;
}
