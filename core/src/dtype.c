/* The dtype table and host conversions between the castable dtypes (F64, F32, F16, BF16).
 *
 * The conversions reproduce torch.Tensor.to on the CPU bit for bit, including its quirks,
 * because a loaded shard is meant to equal what a torch-based loader would have produced:
 *
 *   - F32 -> BF16 and F32 -> F16 round to nearest, ties to even; overflow gives inf.
 *   - F64 -> F16 and F64 -> BF16 go through F32 first (torch's Half and BFloat16 are only
 *     constructible from float), so they round twice: 1 + 2^-11 + 2^-40 becomes 1.0 in F16,
 *     not 1 + 2^-10.
 *   - F16/BF16 -> wider types are exact.
 *   - NaN stays NaN, with the bit patterns torch's x86 CPU kernels produce (measured on
 *     torch 2.x; torch itself is not uniform here, since its vector and scalar paths differ):
 *       F32/F64 -> BF16: 0xFFFF for every NaN (the AVX2/AVX-512 kernel's blend constant);
 *       F16 -> BF16:     0x7FC0 (c10::BFloat16's scalar round_to_nearest_even);
 *       any -> F16:      sign | 0x7E00 | top 10 payload bits (F16C vcvtps2ph semantics);
 *       F16 -> F32/F64, F32 -> F64, F64 -> F32: quiet bit set, sign and payload kept;
 *       BF16 -> F32:     the bits shifted left by 16, unchanged (signalling NaNs stay so).
 *
 * The loops convert gigabytes, so each element conversion is written as straight-line
 * integer/float code with selects instead of branches, which GCC and Clang vectorise. The
 * float tricks used (adding 0.5f to align subnormal mantissas) stay correct under FTZ/DAZ. */
#include <string.h>
#include <strings.h>

#include "internal.h"

typedef struct dtype_info {
  const char *st_name; /* safetensors spelling */
  size_t size;
  bool floating, castable;
  const char *aliases[4]; /* torch spellings, matched case-insensitively, "torch." optional */
} dtype_info;

static const dtype_info dtype_table[SL_DTYPE_COUNT_] = {
    [SL_DTYPE_INVALID] = {"INVALID", 0, false, false, {NULL}},
    [SL_DTYPE_F64] = {"F64", 8, true, true, {"float64", "double", "fp64"}},
    [SL_DTYPE_F32] = {"F32", 4, true, true, {"float32", "float", "fp32"}},
    [SL_DTYPE_F16] = {"F16", 2, true, true, {"float16", "half", "fp16"}},
    [SL_DTYPE_BF16] = {"BF16", 2, true, true, {"bfloat16"}},
    [SL_DTYPE_F8_E4M3] = {"F8_E4M3", 1, true, false, {"float8_e4m3fn"}},
    [SL_DTYPE_F8_E5M2] = {"F8_E5M2", 1, true, false, {"float8_e5m2"}},
    [SL_DTYPE_I64] = {"I64", 8, false, false, {"int64", "long"}},
    [SL_DTYPE_I32] = {"I32", 4, false, false, {"int32", "int"}},
    [SL_DTYPE_I16] = {"I16", 2, false, false, {"int16", "short"}},
    [SL_DTYPE_I8] = {"I8", 1, false, false, {"int8"}},
    [SL_DTYPE_U8] = {"U8", 1, false, false, {"uint8"}},
    [SL_DTYPE_BOOL] = {"BOOL", 1, false, false, {"bool"}},
    [SL_DTYPE_U16] = {"U16", 2, false, false, {"uint16"}},
    [SL_DTYPE_U32] = {"U32", 4, false, false, {"uint32"}},
    [SL_DTYPE_U64] = {"U64", 8, false, false, {"uint64"}},
};

static bool dtype_valid(sl_dtype dt) { return dt > SL_DTYPE_INVALID && dt < SL_DTYPE_COUNT_; }

SL_API const char *sl_dtype_name(sl_dtype dt) {
  return dtype_valid(dt) ? dtype_table[dt].st_name : "INVALID";
}

sl_dtype sl__dtype_from_st(const char *name) {
  if (!name) return SL_DTYPE_INVALID;
  for (int i = 1; i < SL_DTYPE_COUNT_; i++)
    if (strcmp(name, dtype_table[i].st_name) == 0) return (sl_dtype)i;
  return SL_DTYPE_INVALID;
}

SL_API sl_dtype sl_dtype_from_name(const char *name) {
  if (!name) return SL_DTYPE_INVALID;
  if (strncmp(name, "torch.", 6) == 0) name += 6;
  for (int i = 1; i < SL_DTYPE_COUNT_; i++) {
    if (strcasecmp(name, dtype_table[i].st_name) == 0) return (sl_dtype)i;
    for (int a = 0; a < 4 && dtype_table[i].aliases[a]; a++)
      if (strcasecmp(name, dtype_table[i].aliases[a]) == 0) return (sl_dtype)i;
  }
  return SL_DTYPE_INVALID;
}

SL_API size_t sl_dtype_size(sl_dtype dt) { return dtype_valid(dt) ? dtype_table[dt].size : 0; }
SL_API int sl_dtype_is_floating(sl_dtype dt) { return dtype_valid(dt) && dtype_table[dt].floating; }
SL_API int sl_dtype_is_castable(sl_dtype dt) { return dtype_valid(dt) && dtype_table[dt].castable; }

/* ---- scalar kernels (inlined into the loops below) ------------------------------------- */

/* c ? a : b without a branch, so the compiler can if-convert and vectorise the loop even
 * though one side holds a float operation (which -ftrapping-math forbids speculating). */
static inline uint32_t sel(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - (uint32_t)c;
  return (a & m) | (b & ~m);
}

static inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float f32_from(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* RNE: add 0x7FFF plus the lsb of the kept part, then truncate. Carries into the exponent
 * are what makes the largest finite values round up to inf. */
static inline uint16_t bf16_from_f32_bits(uint32_t u, uint16_t nan_bits) {
  uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (uint16_t)sel((u & 0x7FFFFFFFu) > 0x7F800000u, nan_bits, r);
}

/* ryg's float_to_half_fast3_rtne, with the branches turned into selects and NaN payloads
 * kept as F16C does. */
static inline uint16_t f16_from_f32_bits(uint32_t u) {
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int32_t a = (int32_t)(u & 0x7FFFFFFFu);
  /* |x| < 2^-14: adding 0.5f (ulp 2^-24, the F16 subnormal step) makes the FPU round the
   * value onto the subnormal grid; the low bits are then the F16 encoding. */
  const uint32_t sub = f32_bits(f32_from((uint32_t)a) + 0.5f) - 0x3F000000u;
  /* Normal range: rebias the exponent and round the 13 dropped bits to even. */
  const uint32_t norm = ((uint32_t)a + 0xC8000FFFu + (((uint32_t)a >> 13) & 1u)) >> 13;
  const uint32_t nan = 0x7E00u | (((uint32_t)a >> 13) & 0x3FFu);
  uint32_t r = sel(a < 0x38800000, sub, norm);
  r = sel(a >= 0x47800000, 0x7C00u, r); /* >= 2^16 overflows (65520..65535 carry there too) */
  r = sel(a > 0x7F800000, nan, r);
  return (uint16_t)(sign | r);
}

static inline uint32_t f32_bits_from_f16(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const int32_t em = h & 0x7FFF;
  /* Subnormal: place the 10 mantissa bits under 0.5f's ulp (2^-24) and subtract 0.5f. */
  const uint32_t sub = f32_bits(f32_from(0x3F000000u | (uint32_t)em) - 0.5f);
  const uint32_t norm = ((uint32_t)em << 13) + 0x38000000u;
  const uint32_t special = ((uint32_t)em << 13) | 0x7F800000u | sel(em > 0x7C00, 0x00400000u, 0u);
  uint32_t r = sel(em < 0x0400, sub, norm);
  r = sel(em >= 0x7C00, special, r);
  return sign | r;
}

/* ---- loops ----------------------------------------------------------------------------- */
/* Loads and stores go through memcpy: safetensors data offsets, and so source and
 * destination buffers, need not be aligned; compilers turn these into plain (vector) moves. */

#define LOAD(T, p, i) ({ T v_; memcpy(&v_, (const char *)(p) + (i) * sizeof(T), sizeof(T)); v_; })
#define STORE(T, p, i, v) do { T s_ = (v); memcpy((char *)(p) + (i) * sizeof(T), &s_, sizeof(T)); } while (0)

/* The default -O2 of GCC 12 does not vectorise these loops; they are the hot path of a load,
 * so ask for full loop optimisation here only. Clang vectorises at -O2 already. */
#if defined(__GNUC__) && !defined(__clang__)
#define SL_HOT_LOOP __attribute__((optimize("O3")))
#else
#define SL_HOT_LOOP
#endif

typedef void (*convert_fn)(void *restrict dst, const void *restrict src, size_t n);

#define KERNEL(name, SRC_T, DST_T, expr)                                          \
  SL_HOT_LOOP static void name(void *restrict d, const void *restrict s, size_t n) {          \
    for (size_t i = 0; i < n; i++) {                                              \
      const SRC_T x = LOAD(SRC_T, s, i);                                          \
      STORE(DST_T, d, i, (expr));                                                 \
    }                                                                             \
  }

KERNEL(f64_to_f32, double, float, (float)x)
KERNEL(f64_to_f16, double, uint16_t, f16_from_f32_bits(f32_bits((float)x)))
KERNEL(f64_to_bf16, double, uint16_t, bf16_from_f32_bits(f32_bits((float)x), 0xFFFFu))
KERNEL(f32_to_f64, float, double, (double)x)
KERNEL(f32_to_f16, uint32_t, uint16_t, f16_from_f32_bits(x))
KERNEL(f32_to_bf16, uint32_t, uint16_t, bf16_from_f32_bits(x, 0xFFFFu))
KERNEL(f16_to_f64, uint16_t, double, (double)f32_from(f32_bits_from_f16(x)))
KERNEL(f16_to_f32, uint16_t, uint32_t, f32_bits_from_f16(x))
KERNEL(f16_to_bf16, uint16_t, uint16_t, bf16_from_f32_bits(f32_bits_from_f16(x), 0x7FC0u))
KERNEL(bf16_to_f64, uint16_t, double, (double)f32_from((uint32_t)x << 16))
KERNEL(bf16_to_f32, uint16_t, uint32_t, (uint32_t)x << 16)
KERNEL(bf16_to_f16, uint16_t, uint16_t, f16_from_f32_bits((uint32_t)x << 16))
#undef KERNEL

/* [src][dst], indexed by the castable dtypes F64=1 .. BF16=4 */
static const convert_fn kernels[5][5] = {
    [SL_DTYPE_F64] = {[SL_DTYPE_F32] = f64_to_f32, [SL_DTYPE_F16] = f64_to_f16, [SL_DTYPE_BF16] = f64_to_bf16},
    [SL_DTYPE_F32] = {[SL_DTYPE_F64] = f32_to_f64, [SL_DTYPE_F16] = f32_to_f16, [SL_DTYPE_BF16] = f32_to_bf16},
    [SL_DTYPE_F16] = {[SL_DTYPE_F64] = f16_to_f64, [SL_DTYPE_F32] = f16_to_f32, [SL_DTYPE_BF16] = f16_to_bf16},
    [SL_DTYPE_BF16] = {[SL_DTYPE_F64] = bf16_to_f64, [SL_DTYPE_F32] = bf16_to_f32, [SL_DTYPE_F16] = bf16_to_f16},
};

SL_API sl_status sl_convert(void *dst, sl_dtype dst_dt, const void *src, sl_dtype src_dt,
                            size_t count) {
  if (!sl_dtype_is_castable(dst_dt) || !sl_dtype_is_castable(src_dt))
    return sl__fail(NULL, SL_ERR_DTYPE,
                    "cannot convert %s to %s: only F64, F32, F16 and BF16 are castable",
                    sl_dtype_name(src_dt), sl_dtype_name(dst_dt));
  if (count == 0) return SL_OK;
  if (!dst || !src) return sl__fail(NULL, SL_ERR_INVALID, "sl_convert: NULL buffer");
  if (dst_dt == src_dt) {
    memmove(dst, src, count * sl_dtype_size(dst_dt));
    return SL_OK;
  }
  kernels[src_dt][dst_dt](dst, src, count);
  return SL_OK;
}
