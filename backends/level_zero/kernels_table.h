/* The by-name table of kernels_host.h over one implementation of the kernels, included by the
 * file that provides it after it defines
 *   SLZ_INVOKE(fn, gid, gsize, args...)  run kernel FN as work-item GID of GSIZE with ARGS;
 * kernels_host.c (the kernels as host C) and spirv_run.c (the SPIR-V modules translated back
 * and compiled for the host) are the two. */
#ifndef SLZ_INVOKE
#error "define SLZ_INVOKE before including kernels_table.h"
#endif
#include <string.h>

#include "kernels_host.h"
#include "kernels_map.h"

/* One thunk per kernel: the arguments out of the driver's bytes, then the kernel for one item. */
#define SLZ_ARG(T, v, i) \
  T v;                   \
  memcpy(&v, args[i], sizeof v)
#define SLZ_CAST_THUNK(fn)                                                  \
  static void run_##fn(size_t gid, size_t gsize, const void *const *args) { \
    SLZ_ARG(uint8_t *, dst, 0);                                             \
    SLZ_ARG(const uint8_t *, src, 1);                                       \
    SLZ_ARG(uint64_t, n, 2);                                                \
    SLZ_INVOKE(fn, gid, gsize, dst, src, n);                                \
  }
#define SLZ_CAST_THUNKS(s, d)       \
  SLZ_CAST_THUNK(sl_cast_##s##_##d) \
  SLZ_CAST_THUNK(sl_cast_##s##_##d##_bytes)
#define SLZ_SGD_THUNK(dt)                                                          \
  static void run_sl_sgd_##dt(size_t gid, size_t gsize, const void *const *args) { \
    SLZ_ARG(SLZ_BITS_##dt *, x, 0);                                                \
    SLZ_ARG(const SLZ_BITS_##dt *, g, 1);                                          \
    SLZ_ARG(uint64_t, n, 2);                                                       \
    SLZ_ARG(float, lr, 3);                                                         \
    SLZ_INVOKE(sl_sgd_##dt, gid, gsize, x, g, n, lr);                              \
  }
SL_ZE_CASTS_BASE(SLZ_CAST_THUNKS)
SL_ZE_CASTS_F64(SLZ_CAST_THUNKS)
SL_ZE_SGD_BASE(SLZ_SGD_THUNK)
SL_ZE_SGD_F64(SLZ_SGD_THUNK)

#define SLZ_PTR sizeof(void *)
#define SLZ_CAST_ENTRIES(s, d, mod)                                                              \
  {SL_ZE_CAST_NAME(s, d), mod, 3, {SLZ_PTR, SLZ_PTR, 8}, run_sl_cast_##s##_##d},                 \
      {SL_ZE_CAST_BYTES_NAME(s, d), mod, 3, {SLZ_PTR, SLZ_PTR, 8}, run_sl_cast_##s##_##d##_bytes},
#define SLZ_CAST_BASE(s, d) SLZ_CAST_ENTRIES(s, d, SL_ZE_MODULE_BASE)
#define SLZ_CAST_F64(s, d) SLZ_CAST_ENTRIES(s, d, SL_ZE_MODULE_F64)
#define SLZ_SGD_ENTRY(dt, mod) {SL_ZE_SGD_NAME(dt), mod, 4, {SLZ_PTR, SLZ_PTR, 8, 4}, run_sl_sgd_##dt},
#define SLZ_SGD_BASE(dt) SLZ_SGD_ENTRY(dt, SL_ZE_MODULE_BASE)
#define SLZ_SGD_F64(dt) SLZ_SGD_ENTRY(dt, SL_ZE_MODULE_F64)

static const sl__ze_host_kernel kernels[] = {
    SL_ZE_CASTS_BASE(SLZ_CAST_BASE) SL_ZE_SGD_BASE(SLZ_SGD_BASE)
    SL_ZE_CASTS_F64(SLZ_CAST_F64) SL_ZE_SGD_F64(SLZ_SGD_F64)};

size_t sl__ze_host_kernel_count(void) { return sizeof kernels / sizeof kernels[0]; }

const sl__ze_host_kernel *sl__ze_host_kernel_at(size_t i) {
  return i < sl__ze_host_kernel_count() ? &kernels[i] : NULL;
}

const sl__ze_host_kernel *sl__ze_host_kernel_find(const char *name, int module) {
  for (size_t i = 0; name && i < sl__ze_host_kernel_count(); i++)
    if (strcmp(kernels[i].name, name) == 0) return module < 0 || kernels[i].module == module ? &kernels[i] : NULL;
  return NULL;
}

void sl__ze_host_kernel_launch(const sl__ze_host_kernel *k, const void *const *args, size_t gsize) {
  for (size_t gid = 0; gid < gsize; gid++) k->run(gid, gsize, args);
}
