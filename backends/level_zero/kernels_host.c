/* kernels.cl compiled as host C (kernels_map.h's host half), and the table that finds its
 * kernels by name (kernels_host.h). Built with -fno-strict-aliasing: the aligned kernels read
 * the driver's untyped buffers through typed pointers, as the device does. */
#include <string.h>

#include "kernels_host.h"
#include "kernels.cl"

/* One thunk per kernel: the arguments out of the driver's bytes, then the kernel for one item. */
#define SLZ_ARG(T, v, i) \
  T v;                   \
  memcpy(&v, args[i], sizeof v)
#define SLZ_CAST_THUNK(fn)                                                     \
  static void run_##fn(size_t gid, size_t gsize, const void *const *args) {    \
    const slz_item it = {gid, gsize};                                          \
    SLZ_ARG(uint8_t *, dst, 0);                                                \
    SLZ_ARG(const uint8_t *, src, 1);                                          \
    SLZ_ARG(uint64_t, n, 2);                                                   \
    fn(&it, dst, src, n);                                                      \
  }
#define SLZ_CAST_THUNKS(s, d)          \
  SLZ_CAST_THUNK(sl_cast_##s##_##d)    \
  SLZ_CAST_THUNK(sl_cast_##s##_##d##_bytes)
#define SLZ_SGD_THUNK(dt)                                                      \
  static void run_sl_sgd_##dt(size_t gid, size_t gsize, const void *const *args) { \
    const slz_item it = {gid, gsize};                                          \
    SLZ_ARG(SLZ_BITS_##dt *, x, 0);                                            \
    SLZ_ARG(const SLZ_BITS_##dt *, g, 1);                                      \
    SLZ_ARG(uint64_t, n, 2);                                                   \
    SLZ_ARG(float, lr, 3);                                                     \
    sl_sgd_##dt(&it, x, g, n, lr);                                             \
  }
SL_ZE_CASTS_BASE(SLZ_CAST_THUNKS)
SL_ZE_CASTS_F64(SLZ_CAST_THUNKS)
SL_ZE_SGD_BASE(SLZ_SGD_THUNK)
SL_ZE_SGD_F64(SLZ_SGD_THUNK)

#define SLZ_PTR sizeof(void *)
#define SLZ_CAST_ENTRIES(s, d, mod)                                                                     \
  {SL_ZE_CAST_NAME(s, d), mod, 3, {SLZ_PTR, SLZ_PTR, 8}, run_sl_cast_##s##_##d},                        \
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
