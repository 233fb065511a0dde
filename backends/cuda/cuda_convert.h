/* Element conversions between the castable dtypes (F64, F32, F16, BF16) for the CUDA backend's
 * cast and SGD kernels, written once so the SAME source compiles as device code (cuda_kernels.cu)
 * and as host code (test_cuda_convert.c proves it bit-exact against sl_convert over every 16-bit
 * pattern and millions of F32/F64 values, without a GPU).
 *
 * They replicate core/src/dtype.c bit for bit, NaN rules included (see its header comment for
 * why those rules are torch's): the same integer rounding for BF16, ryg's float_to_half with
 * F16C NaN payloads for F16. dtype.c leans on x86 for two things a GPU does differently:
 *   - (float)double and (double)float of a NaN: x86 keeps sign and payload (truncated or
 *     shifted) and sets the quiet bit; a GPU's cvt returns a canonical NaN. So NaNs take an
 *     integer path here that writes x86's result, and only non-NaN values use the FPU.
 *   - the 0.5f addition that rounds F16 subnormals: plain IEEE adds on both sides (nvcc does not
 *     flush subnormals unless built with -ftz=true or --use_fast_math; never build so).
 * No intrinsic conversions (__float2bfloat16 and friends): their NaN results differ.
 *
 * The Level Zero backend compiles this same file as OpenCL C for SPIR-V
 * (backends/level_zero/kernels.cl, through its map kernels_map.h, which gives the fixed-width
 * integer types): there the bit casts are OpenCL's as_*(), and the functions with an F64 side
 * exist only where the compiler offers cl_khr_fp64 (SLC_HAS_F64; the F64 kernels are a module
 * of their own, since many Intel GPUs have no fp64). */
#ifndef SHARDLOAD_CUDA_CONVERT_H
#define SHARDLOAD_CUDA_CONVERT_H

#ifndef __OPENCL_C_VERSION__
#include <stdint.h>
#include <string.h>
#endif

#ifdef __HIPCC__
#include <hip/hip_runtime.h> /* __host__, __device__, __forceinline__: nvcc predefines CUDA's */
#endif
#if defined(__CUDACC__) || defined(__HIPCC__)
#define SLC_FN static __host__ __device__ __forceinline__
#else
#define SLC_FN static inline
#endif
/* device code: CUDA's, or HIP's (the HIP backend compiles cuda_kernels.cu with clang) */
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define SLC_DEVICE_CODE 1
#endif
/* F64 arithmetic: everywhere but OpenCL C without cl_khr_fp64 */
#if !defined(__OPENCL_C_VERSION__) || defined(cl_khr_fp64)
#define SLC_HAS_F64 1
#endif

SLC_FN uint32_t slc_f32_bits(float f) {
#ifdef SLC_DEVICE_CODE
  return __float_as_uint(f);
#elif defined(__OPENCL_C_VERSION__)
  return as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}
SLC_FN float slc_f32_from(uint32_t u) {
#ifdef SLC_DEVICE_CODE
  return __uint_as_float(u);
#elif defined(__OPENCL_C_VERSION__)
  return as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}
#ifdef SLC_HAS_F64
SLC_FN uint64_t slc_f64_bits(double d) {
#ifdef SLC_DEVICE_CODE
  return (uint64_t)__double_as_longlong(d);
#elif defined(__OPENCL_C_VERSION__)
  return as_ulong(d);
#else
  uint64_t u;
  memcpy(&u, &d, 8);
  return u;
#endif
}
SLC_FN double slc_f64_from(uint64_t u) {
#ifdef SLC_DEVICE_CODE
  return __longlong_as_double((long long)u);
#elif defined(__OPENCL_C_VERSION__)
  return as_double(u);
#else
  double d;
  memcpy(&d, &u, 8);
  return d;
#endif
}

/* F64 -> F32: round to nearest even by the FPU; NaN as x86 cvtsd2ss (quiet bit set, the top 22
 * payload bits kept, sign kept). */
SLC_FN uint32_t slc_f32_from_f64_bits(uint64_t d) {
  if ((d & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull)
    return (uint32_t)((d >> 32) & 0x80000000u) | 0x7FC00000u | (uint32_t)((d >> 29) & 0x7FFFFFu);
  return slc_f32_bits((float)slc_f64_from(d));
}

/* F32 -> F64: exact; NaN as x86 cvtss2sd (quiet bit set, payload shifted up, sign kept). */
SLC_FN uint64_t slc_f64_from_f32_bits(uint32_t u) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    return ((uint64_t)(u & 0x80000000u) << 32) | 0x7FF8000000000000ull | ((uint64_t)(u & 0x7FFFFFu) << 29);
  return slc_f64_bits((double)slc_f32_from(u));
}
#endif /* SLC_HAS_F64 */

/* dtype.c's bf16_from_f32_bits: RNE by adding 0x7FFF plus the kept lsb; NaN -> NAN_BITS. */
SLC_FN uint16_t slc_bf16_from_f32_bits(uint32_t u, uint16_t nan_bits) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return nan_bits;
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* dtype.c's f16_from_f32_bits (ryg's float_to_half_fast3_rtne, F16C NaN payloads). */
SLC_FN uint16_t slc_f16_from_f32_bits(uint32_t u) {
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  uint32_t r;
  if (a > 0x7F800000u)
    r = 0x7E00u | ((a >> 13) & 0x3FFu);                    /* NaN: quiet, top payload bits */
  else if (a >= 0x47800000u)
    r = 0x7C00u;                                            /* >= 2^16 (and inf): inf */
  else if (a < 0x38800000u)
    r = slc_f32_bits(slc_f32_from(a) + 0.5f) - 0x3F000000u; /* subnormal grid via the FPU */
  else
    r = (a + 0xC8000FFFu + ((a >> 13) & 1u)) >> 13;         /* rebias, round 13 bits to even */
  return (uint16_t)(sign | r);
}

/* dtype.c's f32_bits_from_f16: exact; NaN keeps sign and payload and gains the quiet bit. */
SLC_FN uint32_t slc_f32_bits_from_f16(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;
  uint32_t r;
  if (em >= 0x7C00u)
    r = (em << 13) | 0x7F800000u | (em > 0x7C00u ? 0x00400000u : 0u);
  else if (em < 0x0400u)
    r = slc_f32_bits(slc_f32_from(0x3F000000u | em) - 0.5f);
  else
    r = (em << 13) + 0x38000000u;
  return sign | r;
}

SLC_FN uint32_t slc_f32_bits_from_bf16(uint16_t b) { return (uint32_t)b << 16; }

/* The twelve conversions, as dtype.c's KERNEL table composes them. Values travel as raw bits
 * (uint64_t / uint32_t / uint16_t) so no float register ever canonicalises a NaN. */
#ifdef SLC_HAS_F64
SLC_FN uint32_t slc_f64_to_f32(uint64_t x) { return slc_f32_from_f64_bits(x); }
SLC_FN uint16_t slc_f64_to_f16(uint64_t x) { return slc_f16_from_f32_bits(slc_f32_from_f64_bits(x)); }
SLC_FN uint16_t slc_f64_to_bf16(uint64_t x) { return slc_bf16_from_f32_bits(slc_f32_from_f64_bits(x), 0xFFFFu); }
SLC_FN uint64_t slc_f32_to_f64(uint32_t x) { return slc_f64_from_f32_bits(x); }
SLC_FN uint64_t slc_f16_to_f64(uint16_t x) { return slc_f64_from_f32_bits(slc_f32_bits_from_f16(x)); }
SLC_FN uint64_t slc_bf16_to_f64(uint16_t x) { return slc_f64_from_f32_bits(slc_f32_bits_from_bf16(x)); }
#endif
SLC_FN uint16_t slc_f32_to_f16(uint32_t x) { return slc_f16_from_f32_bits(x); }
SLC_FN uint16_t slc_f32_to_bf16(uint32_t x) { return slc_bf16_from_f32_bits(x, 0xFFFFu); }
SLC_FN uint32_t slc_f16_to_f32(uint16_t x) { return slc_f32_bits_from_f16(x); }
SLC_FN uint16_t slc_f16_to_bf16(uint16_t x) { return slc_bf16_from_f32_bits(slc_f32_bits_from_f16(x), 0x7FC0u); }
SLC_FN uint32_t slc_bf16_to_f32(uint16_t x) { return slc_f32_bits_from_bf16(x); }
SLC_FN uint16_t slc_bf16_to_f16(uint16_t x) { return slc_f16_from_f32_bits(slc_f32_bits_from_bf16(x)); }

#endif
