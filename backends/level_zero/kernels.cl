/* The Level Zero backend's kernels: the casts between F64/F32/F16/BF16 and the SGD step, from
 * the element math the CUDA and HIP kernels use (backends/cuda/cuda_convert.h, bit-exact with
 * sl_convert). ze_kernels.h names them, their modules and their arguments.
 *
 * Compiled at build time as OpenCL C to SPIR-V, once per module (SL_ZE_MODULE = its id from
 * ze_kernels.h: the F64 module's kernels only where cl_khr_fp64 is on, the base module's with it
 * off so that it declares no Float64), and as host C by kernels_host.c (kernels_map.h says how).
 * FP contraction is off by the build (-ffp-contract=off, llvm-spirv --spirv-fp-contract=off:
 * each entry point is ContractionOff): the host's SGD step rounds the product and the
 * difference separately, and OpenCL's default contracts x - lr * g into one mad (test_ze_spirv
 * reads the SPIR-V for it, test_ze_spirv_run runs it, and both catch a contracting build). The
 * kernels add, subtract and multiply only (OpenCL rounds those correctly), and never divide or
 * take a square root (so -cl-fp32-correctly-rounded-divide-sqrt has nothing to do). */
#include "kernels_map.h"
#include "cuda_convert.h"
#include "ze_kernels.h"

/* Element I of T at any byte address, little-endian, one byte at a time (the _bytes kernels). */
#define SLZ_BYTE_ACCESS(T)                                                                       \
  SLZ_FN T slz_load_##T(SLZ_GLOBAL const uint8_t *p, size_t i) {                                 \
    T v = 0;                                                                                     \
    for (unsigned b = 0; b < sizeof(T); b++) v |= (T)((T)p[i * sizeof(T) + b] << (8 * b));       \
    return v;                                                                                    \
  }                                                                                              \
  SLZ_FN void slz_store_##T(SLZ_GLOBAL uint8_t *p, size_t i, T v) {                              \
    for (unsigned b = 0; b < sizeof(T); b++) p[i * sizeof(T) + b] = (uint8_t)(v >> (8 * b));     \
  }
SLZ_BYTE_ACCESS(uint16_t)
SLZ_BYTE_ACCESS(uint32_t)
#if SL_ZE_MODULE == SL_ZE_MODULE_F64 || !defined(__OPENCL_C_VERSION__)
SLZ_BYTE_ACCESS(uint64_t)
#endif
#define SLZ_LOAD(T) SLZ_LOAD_(T)
#define SLZ_LOAD_(T) slz_load_##T
#define SLZ_STORE(T) SLZ_STORE_(T)
#define SLZ_STORE_(T) slz_store_##T

/* sl_cast_<s>_<d> (element-aligned buffers) and sl_cast_<s>_<d>_bytes (any byte offset) */
#define SLZ_CAST_KERNELS(s, d)                                                                   \
  SLZ_KERNEL void sl_cast_##s##_##d(SLZ_ITEM SLZ_GLOBAL uint8_t *restrict dst,                   \
                                    SLZ_GLOBAL const uint8_t *restrict src, uint64_t n) {        \
    SLZ_GLOBAL SLZ_BITS_##d *out = (SLZ_GLOBAL SLZ_BITS_##d *)dst;                               \
    SLZ_GLOBAL const SLZ_BITS_##s *in = (SLZ_GLOBAL const SLZ_BITS_##s *)src;                    \
    for (size_t i = SLZ_GID; i < n; i += SLZ_GSIZE) out[i] = slc_##s##_to_##d(in[i]);            \
  }                                                                                              \
  SLZ_KERNEL void sl_cast_##s##_##d##_bytes(SLZ_ITEM SLZ_GLOBAL uint8_t *restrict dst,           \
                                            SLZ_GLOBAL const uint8_t *restrict src, uint64_t n) { \
    for (size_t i = SLZ_GID; i < n; i += SLZ_GSIZE)                                              \
      SLZ_STORE(SLZ_BITS_##d)(dst, i, slc_##s##_to_##d(SLZ_LOAD(SLZ_BITS_##s)(src, i)));         \
  }

/* The SGD step as core/src/hostops.c computes it: F64 in F64 (lr widened), F32 in F32, F16 and
 * BF16 widened to F32 and rounded back by the conversions above. */
#define SLZ_SGD_F32_IN(dt, to32, from32)                                                         \
  SLZ_KERNEL void sl_sgd_##dt(SLZ_ITEM SLZ_GLOBAL SLZ_BITS_##dt *restrict x,                     \
                              SLZ_GLOBAL const SLZ_BITS_##dt *restrict g, uint64_t n, float lr) { \
    for (size_t i = SLZ_GID; i < n; i += SLZ_GSIZE) {                                            \
      float xf = slc_f32_from(to32(x[i])), gf = slc_f32_from(to32(g[i]));                        \
      x[i] = from32(slc_f32_bits(xf - lr * gf));                                                 \
    }                                                                                            \
  }

#if SL_ZE_MODULE == SL_ZE_MODULE_BASE || !defined(__OPENCL_C_VERSION__)
SLZ_FN uint32_t slz_f32_same(uint32_t u) { return u; }
SL_ZE_CASTS_BASE(SLZ_CAST_KERNELS)
SLZ_SGD_F32_IN(f32, slz_f32_same, slz_f32_same)
SLZ_SGD_F32_IN(f16, slc_f16_to_f32, slc_f32_to_f16)
SLZ_SGD_F32_IN(bf16, slc_bf16_to_f32, slc_f32_to_bf16)
#endif

#if SL_ZE_MODULE == SL_ZE_MODULE_F64 || !defined(__OPENCL_C_VERSION__)
SL_ZE_CASTS_F64(SLZ_CAST_KERNELS)
SLZ_KERNEL void sl_sgd_f64(SLZ_ITEM SLZ_GLOBAL uint64_t *restrict x, SLZ_GLOBAL const uint64_t *restrict g,
                           uint64_t n, float lr) {
  for (size_t i = SLZ_GID; i < n; i += SLZ_GSIZE)
    x[i] = slc_f64_bits(slc_f64_from(x[i]) - (double)lr * slc_f64_from(g[i]));
}
#endif
