/* dtype table and host conversions: names, sizes, and bit-exactness with torch.Tensor.to
 * (the expected bits below were produced by torch 2.x on x86; tools/crosscheck_dtype.py
 * repeats the comparison against an installed torch). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"

/* ---- helpers -------------------------------------------------------------------------- */

static uint32_t bits_f(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float f_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint64_t bits_d(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
static double d_bits(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }

static uint16_t f32_to(sl_dtype dt, uint32_t u) {
  uint16_t out = 0xAAAA;
  assert_int_equal(sl_convert(&out, dt, &u, SL_DTYPE_F32, 1), SL_OK);
  return out;
}
static uint16_t f64_to(sl_dtype dt, double d) {
  uint16_t out = 0xAAAA;
  assert_int_equal(sl_convert(&out, dt, &d, SL_DTYPE_F64, 1), SL_OK);
  return out;
}
static uint32_t to_f32(sl_dtype dt, uint16_t h) {
  uint32_t out = 0xAAAAAAAA;
  assert_int_equal(sl_convert(&out, SL_DTYPE_F32, &h, dt, 1), SL_OK);
  return out;
}
static uint64_t to_f64(sl_dtype dt, uint16_t h) {
  uint64_t out = 0xAAAAAAAAAAAAAAAAull;
  assert_int_equal(sl_convert(&out, SL_DTYPE_F64, &h, dt, 1), SL_OK);
  return out;
}
static uint16_t h16(sl_dtype dst, sl_dtype src, uint16_t h) {
  uint16_t out = 0xAAAA;
  assert_int_equal(sl_convert(&out, dst, &h, src, 1), SL_OK);
  return out;
}

/* Independent references, written the slow and obvious way: scale by a power of two (exact)
 * and round with nearbyint (the FPU's round-to-nearest-even). */
static uint16_t ref_narrow(uint32_t u, int mant_bits, int emin, int emax, int ebias,
                           uint16_t nan_bits, bool keep_payload) {
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t a = u & 0x7FFFFFFF;
  const uint16_t inf = (uint16_t)(((unsigned)(emax + ebias + 1)) << mant_bits);
  if (a > 0x7F800000) {
    if (!keep_payload) return nan_bits;
    return (uint16_t)(sign | inf | (1u << (mant_bits - 1)) | ((a >> (23 - mant_bits)) & ((1u << mant_bits) - 1)));
  }
  if (a == 0x7F800000) return sign | inf;
  double x = (double)f_bits(a);
  if (x < ldexp(1, emin)) /* subnormal grid, step 2^(emin - mant_bits); may round up to min normal */
    return (uint16_t)(sign | (uint16_t)nearbyint(ldexp(x, mant_bits - emin)));
  int e = ilogb(x);
  double m = nearbyint(ldexp(x, mant_bits - e));
  if (m == ldexp(1, mant_bits + 1)) m /= 2, e++;
  if (e > emax) return sign | inf;
  return (uint16_t)(sign | ((unsigned)(e + ebias) << mant_bits) | ((unsigned)m - (1u << mant_bits)));
}
static uint16_t ref_f16(uint32_t u) { return ref_narrow(u, 10, -14, 15, 15, 0, true); }
static uint16_t ref_bf16(uint32_t u) { return ref_narrow(u, 7, -126, 127, 127, 0xFFFF, false); }

static double ref_f16_value(uint16_t h) {
  int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double s = (h & 0x8000) ? -1 : 1;
  if (e == 0) return s * ldexp(m, -24);
  if (e == 31) return m ? NAN : s * INFINITY;
  return s * ldexp(1024 + m, e - 25);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1Dull;
}

/* ---- names and table ----------------------------------------------------------------- */

static void test_names(void **state) {
  (void)state;
  static const struct { sl_dtype dt; const char *st; size_t size; int fl, cast; } t[] = {
      {SL_DTYPE_F64, "F64", 8, 1, 1},      {SL_DTYPE_F32, "F32", 4, 1, 1},
      {SL_DTYPE_F16, "F16", 2, 1, 1},      {SL_DTYPE_BF16, "BF16", 2, 1, 1},
      {SL_DTYPE_F8_E4M3, "F8_E4M3", 1, 1, 0}, {SL_DTYPE_F8_E5M2, "F8_E5M2", 1, 1, 0},
      {SL_DTYPE_I64, "I64", 8, 0, 0},      {SL_DTYPE_I32, "I32", 4, 0, 0},
      {SL_DTYPE_I16, "I16", 2, 0, 0},      {SL_DTYPE_I8, "I8", 1, 0, 0},
      {SL_DTYPE_U8, "U8", 1, 0, 0},        {SL_DTYPE_BOOL, "BOOL", 1, 0, 0},
      {SL_DTYPE_U16, "U16", 2, 0, 0},      {SL_DTYPE_U32, "U32", 4, 0, 0},
      {SL_DTYPE_U64, "U64", 8, 0, 0},
  };
  assert_int_equal(sizeof t / sizeof t[0], SL_DTYPE_COUNT_ - 1);
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    assert_string_equal(sl_dtype_name(t[i].dt), t[i].st);
    assert_int_equal(sl_dtype_from_name(t[i].st), t[i].dt);
    assert_int_equal(sl__dtype_from_st(t[i].st), t[i].dt);
    assert_int_equal(sl_dtype_size(t[i].dt), t[i].size);
    assert_int_equal(!!sl_dtype_is_floating(t[i].dt), t[i].fl);
    assert_int_equal(!!sl_dtype_is_castable(t[i].dt), t[i].cast);
  }
  assert_int_equal(sl_dtype_size(SL_DTYPE_INVALID), 0);
  assert_int_equal(sl_dtype_size((sl_dtype)99), 0);
  assert_string_equal(sl_dtype_name((sl_dtype)99), "INVALID");
  assert_false(sl_dtype_is_floating(SL_DTYPE_INVALID));
  assert_false(sl_dtype_is_castable((sl_dtype)-1));
}

static void test_name_spellings(void **state) {
  (void)state;
  static const struct { const char *name; sl_dtype dt; } ok[] = {
      {"bf16", SL_DTYPE_BF16}, {"f8_e4m3", SL_DTYPE_F8_E4M3}, {"bool", SL_DTYPE_BOOL},
      {"float32", SL_DTYPE_F32}, {"float", SL_DTYPE_F32}, {"torch.float32", SL_DTYPE_F32},
      {"float64", SL_DTYPE_F64}, {"double", SL_DTYPE_F64}, {"torch.double", SL_DTYPE_F64},
      {"float16", SL_DTYPE_F16}, {"half", SL_DTYPE_F16}, {"torch.half", SL_DTYPE_F16},
      {"bfloat16", SL_DTYPE_BF16}, {"torch.bfloat16", SL_DTYPE_BF16},
      {"float8_e4m3fn", SL_DTYPE_F8_E4M3}, {"torch.float8_e5m2", SL_DTYPE_F8_E5M2},
      {"int64", SL_DTYPE_I64}, {"long", SL_DTYPE_I64}, {"int32", SL_DTYPE_I32}, {"int", SL_DTYPE_I32},
      {"int16", SL_DTYPE_I16}, {"short", SL_DTYPE_I16}, {"int8", SL_DTYPE_I8}, {"uint8", SL_DTYPE_U8},
      {"torch.bool", SL_DTYPE_BOOL}, {"uint16", SL_DTYPE_U16}, {"uint32", SL_DTYPE_U32},
      {"uint64", SL_DTYPE_U64}, {"Float32", SL_DTYPE_F32},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    sl_dtype got = sl_dtype_from_name(ok[i].name);
    if (got != ok[i].dt) fail_msg("'%s' parsed as %d, want %d", ok[i].name, (int)got, (int)ok[i].dt);
  }
  static const char *const bad[] = {"", "F31", "bf17", "torch.", "torch.F99", "float8", "F8", "int128",
                                    " F32", "F32 "};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    if (sl_dtype_from_name(bad[i]) != SL_DTYPE_INVALID) fail_msg("'%s' should not parse", bad[i]);
  assert_int_equal(sl_dtype_from_name(NULL), SL_DTYPE_INVALID);
  /* The safetensors reader takes the exact spelling only. */
  assert_int_equal(sl__dtype_from_st("bf16"), SL_DTYPE_INVALID);
  assert_int_equal(sl__dtype_from_st("float32"), SL_DTYPE_INVALID);
  assert_int_equal(sl__dtype_from_st("INVALID"), SL_DTYPE_INVALID);
  assert_int_equal(sl__dtype_from_st(NULL), SL_DTYPE_INVALID);
}

/* ---- F32 -> BF16 ------------------------------------------------------------------------ */

static void test_f32_to_bf16(void **state) {
  (void)state;
  static const uint32_t cases[][2] = {
      {0x3F800000, 0x3F80}, {0x3F808000, 0x3F80}, /* tie, even stays */
      {0x3F818000, 0x3F82},                       /* tie, odd rounds up */
      {0x3F808001, 0x3F81}, {0x3F807FFF, 0x3F80}, {0xBF818000, 0xBF82}, {0xBF808000, 0xBF80},
      {0x00000000, 0x0000}, {0x80000000, 0x8000},
      {0x00000001, 0x0000}, {0x00008000, 0x0000}, {0x00018000, 0x0002}, /* subnormals */
      {0x00010000, 0x0001}, {0x007FFFFF, 0x0080},                       /* up into min normal */
      {0x7F800000, 0x7F80}, {0xFF800000, 0xFF80},                       /* infinities */
      {0x7F7FFFFF, 0x7F80}, {0xFF7FFFFF, 0xFF80}, {0x7F7F8000, 0x7F80}, /* overflow to inf */
      {0x7F7F7FFF, 0x7F7F},                                            /* largest finite stays */
      /* NaN: torch's CPU kernel writes 0xFFFF for every NaN */
      {0x7FC00000, 0xFFFF}, {0xFFC00000, 0xFFFF}, {0x7F800001, 0xFFFF}, {0x7FFFFFFF, 0xFFFF},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint16_t got = f32_to(SL_DTYPE_BF16, cases[i][0]);
    if (got != cases[i][1]) fail_msg("F32 0x%08x -> BF16 0x%04x, want 0x%04x", cases[i][0], got, cases[i][1]);
  }
}

/* ---- F32 -> F16 ------------------------------------------------------------------------- */

static void test_f32_to_f16(void **state) {
  (void)state;
  const struct { float f; uint16_t h; } vals[] = {
      {1.0f, 0x3C00},           {-2.0f, 0xC000},          {65504.0f, 0x7BFF},
      {65519.99f, 0x7BFF},      {65520.0f, 0x7C00},       {-65520.0f, 0xFC00},
      {1e10f, 0x7C00},          {INFINITY, 0x7C00},       {-INFINITY, 0xFC00},
      {1.0f + 0x1p-11f, 0x3C00}, /* tie to even (down) */ {1.0f + 3 * 0x1p-11f, 0x3C02}, /* tie up */
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01},
      {0x1p-14f, 0x0400},       {0x1p-24f, 0x0001},       {0x1p-25f, 0x0000}, /* tie to 0 */
      {3 * 0x1p-25f, 0x0002},   {0x1p-25f + 0x1p-40f, 0x0001}, {-0x1p-24f, 0x8001},
      {0x1p-14f - 0x1p-25f, 0x0400}, /* 1023.5 steps: ties up to the min normal */
      {0x1p-14f - 0x1p-24f, 0x03FF}, {1e-30f, 0x0000}, {-1e-30f, 0x8000}, {0x1p-130f, 0x0000},
      {-0.0f, 0x8000},
  };
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    uint16_t got = f32_to(SL_DTYPE_F16, bits_f(vals[i].f));
    if (got != vals[i].h) fail_msg("F32 %a -> F16 0x%04x, want 0x%04x", (double)vals[i].f, got, vals[i].h);
  }
  /* NaN keeps its sign and the top 10 payload bits, quiet bit set (torch's F16C path). */
  static const uint32_t nans[][2] = {
      {0x7FC00000, 0x7E00}, {0xFFC00000, 0xFE00}, {0x7FC12345, 0x7E09},
      {0x7F800001, 0x7E00}, {0x7FA00000, 0x7F00}, {0xFFFFFFFF, 0xFFFF},
  };
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    uint16_t got = f32_to(SL_DTYPE_F16, nans[i][0]);
    if (got != nans[i][1]) fail_msg("F32 0x%08x -> F16 0x%04x, want 0x%04x", nans[i][0], got, nans[i][1]);
  }
}

/* ---- widening: exact --------------------------------------------------------------------- */

static void test_widen(void **state) {
  (void)state;
  assert_int_equal(to_f32(SL_DTYPE_F16, 0x0001), bits_f(0x1p-24f)); /* subnormal, exact */
  assert_int_equal(to_f32(SL_DTYPE_F16, 0x03FF), 0x387FC000);
  assert_int_equal(to_f32(SL_DTYPE_F16, 0x8001), 0xB3800000);
  assert_int_equal(to_f32(SL_DTYPE_F16, 0x0400), bits_f(0x1p-14f));
  assert_int_equal(to_f32(SL_DTYPE_F16, 0x3C00), bits_f(1.0f));
  assert_int_equal(to_f32(SL_DTYPE_F16, 0x7BFF), bits_f(65504.0f));
  assert_int_equal(to_f32(SL_DTYPE_F16, 0x7C00), 0x7F800000);
  assert_int_equal(to_f32(SL_DTYPE_F16, 0xFC00), 0xFF800000);
  assert_int_equal(to_f32(SL_DTYPE_F16, 0x8000), 0x80000000);
  assert_int_equal(to_f32(SL_DTYPE_F16, 0x7C01), 0x7FC02000); /* NaN quieted, payload kept */
  assert_int_equal(to_f32(SL_DTYPE_F16, 0xFE00), 0xFFC00000);
  assert_int_equal(to_f32(SL_DTYPE_F16, 0x7D23), 0x7FE46000);
  assert_int_equal(to_f64(SL_DTYPE_F16, 0x0001), bits_d(0x1p-24));
  assert_int_equal(to_f64(SL_DTYPE_F16, 0x7C01), 0x7FF8040000000000ull);
  assert_int_equal(to_f64(SL_DTYPE_F16, 0xFC00), bits_d(-INFINITY));
  /* BF16 -> F32 is a shift: even a signalling NaN comes through unchanged. */
  assert_int_equal(to_f32(SL_DTYPE_BF16, 0x7F81), 0x7F810000);
  assert_int_equal(to_f32(SL_DTYPE_BF16, 0x0001), 0x00010000);
  assert_int_equal(to_f32(SL_DTYPE_BF16, 0xBF80), bits_f(-1.0f));
  assert_int_equal(to_f64(SL_DTYPE_BF16, 0x7F81), 0x7FF8200000000000ull);
  assert_int_equal(to_f64(SL_DTYPE_BF16, 0x0001), bits_d(0x1p-133));
  /* F32 <-> F64 */
  float f = 0x1.fffffep127f;
  double d = 0;
  assert_int_equal(sl_convert(&d, SL_DTYPE_F64, &f, SL_DTYPE_F32, 1), SL_OK);
  assert_true(d == (double)f);
  f = 0x1p-149f;
  assert_int_equal(sl_convert(&d, SL_DTYPE_F64, &f, SL_DTYPE_F32, 1), SL_OK);
  assert_true(d == 0x1p-149);
}

/* ---- F64 -> narrower: torch rounds through F32 first -------------------------------------- */

static void test_f64_narrowing(void **state) {
  (void)state;
  float f;
  double d = 1 + 0x1p-24; /* tie in F32 -> even */
  assert_int_equal(sl_convert(&f, SL_DTYPE_F32, &d, SL_DTYPE_F64, 1), SL_OK);
  assert_true(f == 1.0f);
  d = 1 + 0x1p-24 + 0x1p-50;
  assert_int_equal(sl_convert(&f, SL_DTYPE_F32, &d, SL_DTYPE_F64, 1), SL_OK);
  assert_true(f == 1.0f + 0x1p-23f);
  d = 1e300;
  assert_int_equal(sl_convert(&f, SL_DTYPE_F32, &d, SL_DTYPE_F64, 1), SL_OK);
  assert_int_equal(bits_f(f), 0x7F800000);
  d = 0x1p-160; /* below F32's smallest subnormal / 2 */
  assert_int_equal(sl_convert(&f, SL_DTYPE_F32, &d, SL_DTYPE_F64, 1), SL_OK);
  assert_int_equal(bits_f(f), 0);
  d = d_bits(0x7FF8123456789ABCull);
  assert_int_equal(sl_convert(&f, SL_DTYPE_F32, &d, SL_DTYPE_F64, 1), SL_OK);
  assert_int_equal(bits_f(f), 0x7FC091A2);
  d = d_bits(0xFFF4000000000000ull); /* signalling: quieted */
  assert_int_equal(sl_convert(&f, SL_DTYPE_F32, &d, SL_DTYPE_F64, 1), SL_OK);
  assert_int_equal(bits_f(f), 0xFFE00000);

  /* Double rounding, as torch does it: a direct rounding would give 0x3C01 and 0x3F81. */
  assert_int_equal(f64_to(SL_DTYPE_F16, 1 + 0x1p-11 + 0x1p-40), 0x3C00);
  assert_int_equal(f64_to(SL_DTYPE_BF16, 1 + 0x1p-8 + 0x1p-40), 0x3F80);
  /* ... and where F32 keeps the difference, both agree with a direct rounding. */
  assert_int_equal(f64_to(SL_DTYPE_F16, 1 + 0x1p-11 + 0x1p-20), 0x3C01);
  assert_int_equal(f64_to(SL_DTYPE_BF16, 1 + 0x1p-8 + 0x1p-20), 0x3F81);
  assert_int_equal(f64_to(SL_DTYPE_F16, 65520.0), 0x7C00);
  assert_int_equal(f64_to(SL_DTYPE_F16, 65519.99), 0x7BFF);
  assert_int_equal(f64_to(SL_DTYPE_F16, -1e300), 0xFC00);
  assert_int_equal(f64_to(SL_DTYPE_BF16, 1e300), 0x7F80);
  assert_int_equal(f64_to(SL_DTYPE_BF16, -INFINITY), 0xFF80);
  assert_int_equal(f64_to(SL_DTYPE_F16, 0x1p-24), 0x0001);
  assert_int_equal(f64_to(SL_DTYPE_F16, 0x1p-25), 0x0000);
  assert_int_equal(f64_to(SL_DTYPE_BF16, 0x1p-133), 0x0001);
  assert_int_equal(f64_to(SL_DTYPE_F16, d_bits(0x7FF8123456789ABCull)), 0x7E04);
  assert_int_equal(f64_to(SL_DTYPE_F16, d_bits(0xFFF4000000000000ull)), 0xFF00);
  assert_int_equal(f64_to(SL_DTYPE_BF16, NAN), 0xFFFF);
  assert_int_equal(f64_to(SL_DTYPE_BF16, -NAN), 0xFFFF);
}

/* ---- F16 <-> BF16: through F32 ------------------------------------------------------------ */

static void test_half_bfloat(void **state) {
  (void)state;
  assert_int_equal(h16(SL_DTYPE_BF16, SL_DTYPE_F16, 0x3C00), 0x3F80);
  assert_int_equal(h16(SL_DTYPE_BF16, SL_DTYPE_F16, 0x3C01), 0x3F80); /* 1 + 2^-10 rounds down */
  assert_int_equal(h16(SL_DTYPE_BF16, SL_DTYPE_F16, 0x3C03), 0x3F80); /* below the tie */
  assert_int_equal(h16(SL_DTYPE_BF16, SL_DTYPE_F16, 0x3C04), 0x3F80); /* tie 1+2^-8: even */
  assert_int_equal(h16(SL_DTYPE_BF16, SL_DTYPE_F16, 0x3C05), 0x3F81); /* above the tie */
  assert_int_equal(h16(SL_DTYPE_BF16, SL_DTYPE_F16, 0x3C0C), 0x3F82); /* tie 1+3*2^-8: up */
  assert_int_equal(h16(SL_DTYPE_BF16, SL_DTYPE_F16, 0x3C18), 0x3F83); /* exact */
  assert_int_equal(h16(SL_DTYPE_BF16, SL_DTYPE_F16, 0x7BFF), 0x4780); /* 65504 -> 65536 */
  assert_int_equal(h16(SL_DTYPE_BF16, SL_DTYPE_F16, 0x0001), 0x3380);
  assert_int_equal(h16(SL_DTYPE_BF16, SL_DTYPE_F16, 0xFC00), 0xFF80);
  /* torch's Half -> BFloat16 goes through c10's scalar rounding: NaN is 0x7FC0, sign dropped. */
  assert_int_equal(h16(SL_DTYPE_BF16, SL_DTYPE_F16, 0x7E00), 0x7FC0);
  assert_int_equal(h16(SL_DTYPE_BF16, SL_DTYPE_F16, 0xFC01), 0x7FC0);
  assert_int_equal(h16(SL_DTYPE_F16, SL_DTYPE_BF16, 0x4780), 0x7C00); /* 65536 overflows */
  assert_int_equal(h16(SL_DTYPE_F16, SL_DTYPE_BF16, 0x477F), 0x7BF8); /* 65280 */
  assert_int_equal(h16(SL_DTYPE_F16, SL_DTYPE_BF16, 0x3380), 0x0001);
  assert_int_equal(h16(SL_DTYPE_F16, SL_DTYPE_BF16, 0x3300), 0x0000); /* 2^-25: tie to 0 */
  assert_int_equal(h16(SL_DTYPE_F16, SL_DTYPE_BF16, 0x0001), 0x0000);
  assert_int_equal(h16(SL_DTYPE_F16, SL_DTYPE_BF16, 0x8001), 0x8000);
  assert_int_equal(h16(SL_DTYPE_F16, SL_DTYPE_BF16, 0x7F81), 0x7E08);
  assert_int_equal(h16(SL_DTYPE_F16, SL_DTYPE_BF16, 0xFFC5), 0xFE28);
}

/* ---- sweeps --------------------------------------------------------------------------------- */

static bool f16_is_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF); }
static bool bf16_is_nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F); }

/* Every F16 and BF16 pattern survives a round trip through F32 and F64, and widens to the
 * value the format defines. */
static void test_sweep_16bit(void **state) {
  (void)state;
  enum { N = 1 << 16 };
  static uint16_t src[N], back[N];
  static float f32[N];
  static double f64[N];
  for (uint32_t i = 0; i < N; i++) src[i] = (uint16_t)i;

  assert_int_equal(sl_convert(f32, SL_DTYPE_F32, src, SL_DTYPE_F16, N), SL_OK);
  assert_int_equal(sl_convert(f64, SL_DTYPE_F64, src, SL_DTYPE_F16, N), SL_OK);
  for (uint32_t i = 0; i < N; i++) {
    double want = ref_f16_value(src[i]);
    if (isnan(want)) {
      if (!isnan(f32[i]) || !isnan(f64[i]) || (signbit(f32[i]) != 0) != ((i & 0x8000) != 0))
        fail_msg("F16 NaN 0x%04x widened to non-NaN or lost its sign", i);
    } else if ((double)f32[i] != want || f64[i] != want || !!signbit(f32[i]) != !!signbit(want)) {
      fail_msg("F16 0x%04x widened to %a / %a, want %a", i, (double)f32[i], f64[i], want);
    }
  }
  assert_int_equal(sl_convert(back, SL_DTYPE_F16, f32, SL_DTYPE_F32, N), SL_OK);
  for (uint32_t i = 0; i < N; i++) {
    uint16_t want = f16_is_nan((uint16_t)i) ? (uint16_t)(i | 0x0200) : (uint16_t)i; /* quieted */
    if (back[i] != want) fail_msg("F16 0x%04x -> F32 -> F16 gave 0x%04x", i, back[i]);
  }
  assert_int_equal(sl_convert(back, SL_DTYPE_F16, f64, SL_DTYPE_F64, N), SL_OK);
  for (uint32_t i = 0; i < N; i++) {
    uint16_t want = f16_is_nan((uint16_t)i) ? (uint16_t)(i | 0x0200) : (uint16_t)i;
    if (back[i] != want) fail_msg("F16 0x%04x -> F64 -> F16 gave 0x%04x", i, back[i]);
  }

  assert_int_equal(sl_convert(f32, SL_DTYPE_F32, src, SL_DTYPE_BF16, N), SL_OK);
  assert_int_equal(sl_convert(f64, SL_DTYPE_F64, src, SL_DTYPE_BF16, N), SL_OK);
  for (uint32_t i = 0; i < N; i++) {
    if (bits_f(f32[i]) != i << 16) fail_msg("BF16 0x%04x -> F32 0x%08x", i, bits_f(f32[i]));
    if (!bf16_is_nan((uint16_t)i) && f64[i] != (double)f_bits(i << 16))
      fail_msg("BF16 0x%04x -> F64 %a", i, f64[i]);
    if (bf16_is_nan((uint16_t)i) && !isnan(f64[i])) fail_msg("BF16 NaN 0x%04x -> F64 not NaN", i);
  }
  assert_int_equal(sl_convert(back, SL_DTYPE_BF16, f32, SL_DTYPE_F32, N), SL_OK);
  for (uint32_t i = 0; i < N; i++) {
    uint16_t want = bf16_is_nan((uint16_t)i) ? 0xFFFF : (uint16_t)i;
    if (back[i] != want) fail_msg("BF16 0x%04x -> F32 -> BF16 gave 0x%04x", i, back[i]);
  }
  assert_int_equal(sl_convert(back, SL_DTYPE_BF16, f64, SL_DTYPE_F64, N), SL_OK);
  for (uint32_t i = 0; i < N; i++) {
    uint16_t want = bf16_is_nan((uint16_t)i) ? 0xFFFF : (uint16_t)i;
    if (back[i] != want) fail_msg("BF16 0x%04x -> F64 -> BF16 gave 0x%04x", i, back[i]);
  }
}

/* Random F32 patterns (plus every exponent with edge mantissas) against the slow references. */
static void test_sweep_f32_random(void **state) {
  (void)state;
  enum { N = 1 << 20 };
  static uint32_t src[N];
  static uint16_t h[N], b[N];
  size_t n = 0;
  for (uint32_t e = 0; e < 256; e++) {
    static const uint32_t mants[] = {0, 1, 0x1000, 0x1FFF, 0x2000, 0x3000, 0x7FFF, 0x8000, 0x18000, 0x7FFFFF, 0x400000};
    for (size_t m = 0; m < sizeof mants / sizeof mants[0]; m++) {
      src[n++] = (e << 23) | mants[m];
      src[n++] = 0x80000000u | (e << 23) | mants[m];
    }
  }
  while (n < N) {
    uint64_t r = rnd();
    /* half the samples near the F16 range, where rounding is interesting */
    uint32_t u = (uint32_t)r;
    if (r >> 63) u = (u & 0x807FFFFFu) | ((uint32_t)(96 + (r >> 40) % 56) << 23);
    src[n++] = u;
  }
  assert_int_equal(sl_convert(h, SL_DTYPE_F16, src, SL_DTYPE_F32, N), SL_OK);
  assert_int_equal(sl_convert(b, SL_DTYPE_BF16, src, SL_DTYPE_F32, N), SL_OK);
  for (size_t i = 0; i < N; i++) {
    if (h[i] != ref_f16(src[i])) fail_msg("F32 0x%08x -> F16 0x%04x, want 0x%04x", src[i], h[i], ref_f16(src[i]));
    if (b[i] != ref_bf16(src[i])) fail_msg("F32 0x%08x -> BF16 0x%04x, want 0x%04x", src[i], b[i], ref_bf16(src[i]));
  }
  /* F64 -> F16/BF16 equals F64 -> F32 -> F16/BF16 for random doubles near the ranges. */
  static double d[4096];
  static float f[4096];
  static uint16_t via[4096], direct[4096];
  for (size_t i = 0; i < 4096; i++) {
    uint64_t r = rnd();
    d[i] = d_bits((r & 0x800FFFFFFFFFFFFFull) | ((uint64_t)(1023 - 30 + (r >> 52) % 50) << 52));
  }
  assert_int_equal(sl_convert(f, SL_DTYPE_F32, d, SL_DTYPE_F64, 4096), SL_OK);
  for (int t = 0; t < 2; t++) {
    sl_dtype dt = t ? SL_DTYPE_BF16 : SL_DTYPE_F16;
    assert_int_equal(sl_convert(via, dt, f, SL_DTYPE_F32, 4096), SL_OK);
    assert_int_equal(sl_convert(direct, dt, d, SL_DTYPE_F64, 4096), SL_OK);
    for (size_t i = 0; i < 4096; i++)
      if (via[i] != direct[i]) fail_msg("F64 %a -> %s 0x%04x, through F32 0x%04x", d[i], sl_dtype_name(dt), direct[i], via[i]);
  }
}

/* The vector loops and their tails give the same bits as one-element calls, at any length
 * and any (mis)alignment of source and destination. */
static void test_lengths_and_alignment(void **state) {
  (void)state;
  static const sl_dtype cast[] = {SL_DTYPE_F64, SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};
  static unsigned char src[8 * 80 + 8], dst[8 * 80 + 8];
  _Alignas(8) unsigned char one[8];
  for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)rnd();
  for (int s = 0; s < 4; s++)
    for (int d = 0; d < 4; d++) {
      size_t ss = sl_dtype_size(cast[s]), ds = sl_dtype_size(cast[d]);
      for (size_t n = 1; n <= 67; n += 11)
        for (int so = 0; so < 3; so++)
          for (int dof = 0; dof < 3; dof++) {
            memset(dst, 0xCD, sizeof dst);
            assert_int_equal(sl_convert(dst + dof, cast[d], src + so, cast[s], n), SL_OK);
            for (size_t i = 0; i < n; i++) {
              _Alignas(8) unsigned char in[8];
              memcpy(in, src + so + i * ss, ss); /* the element alone, aligned */
              assert_int_equal(sl_convert(one, cast[d], in, cast[s], 1), SL_OK);
              if (memcmp(one, dst + dof + i * ds, ds) != 0)
                fail_msg("%s -> %s element %zu of %zu differs (offsets %d/%d)", sl_dtype_name(cast[s]),
                         sl_dtype_name(cast[d]), i, n, so, dof);
            }
            assert_int_equal(dst[dof + n * ds], 0xCD); /* nothing written past the end */
            if (dof) assert_int_equal(dst[dof - 1], 0xCD);
          }
    }
}

static void test_copy_and_errors(void **state) {
  (void)state;
  uint16_t a[5] = {1, 2, 0x7E01, 0xFFFF, 5}, b[5] = {0};
  assert_int_equal(sl_convert(b, SL_DTYPE_BF16, a, SL_DTYPE_BF16, 5), SL_OK);
  assert_memory_equal(a, b, sizeof a); /* same dtype: an exact copy, NaN payloads and all */
  assert_int_equal(sl_convert(b, SL_DTYPE_F16, a, SL_DTYPE_F16, 5), SL_OK);
  assert_memory_equal(a, b, sizeof a);
  assert_int_equal(sl_convert(NULL, SL_DTYPE_F32, NULL, SL_DTYPE_F16, 0), SL_OK);
  assert_int_equal(sl_convert(NULL, SL_DTYPE_F32, a, SL_DTYPE_F16, 1), SL_ERR_INVALID);
  static const sl_dtype bad[] = {SL_DTYPE_INVALID, SL_DTYPE_F8_E4M3, SL_DTYPE_F8_E5M2, SL_DTYPE_I32,
                                 SL_DTYPE_BOOL, SL_DTYPE_U64, (sl_dtype)99};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(sl_convert(b, SL_DTYPE_F32, a, bad[i], 1), SL_ERR_DTYPE);
    assert_int_equal(sl_convert(b, bad[i], a, SL_DTYPE_F32, 1), SL_ERR_DTYPE);
    assert_int_equal(sl_convert(b, bad[i], a, bad[i], 1), SL_ERR_DTYPE); /* not even a copy */
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_name_spellings),
      cmocka_unit_test(test_f32_to_bf16),
      cmocka_unit_test(test_f32_to_f16),
      cmocka_unit_test(test_widen),
      cmocka_unit_test(test_f64_narrowing),
      cmocka_unit_test(test_half_bfloat),
      cmocka_unit_test(test_sweep_16bit),
      cmocka_unit_test(test_sweep_f32_random),
      cmocka_unit_test(test_lengths_and_alignment),
      cmocka_unit_test(test_copy_and_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
