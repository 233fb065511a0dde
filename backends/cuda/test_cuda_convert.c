/* The CUDA kernels' element math (cuda_convert.h), compiled here as host code, against the
 * library's sl_convert: every 16-bit pattern of F16 and BF16 to every other castable dtype, and
 * millions of F32 and F64 values (random bit patterns, every rounding boundary of the 16-bit
 * types, double-rounding ties, NaN payloads) down to the narrower ones. The kernels run the same
 * source, so this proves them bit-exact without a GPU (test_cuda_gpu repeats it on a device). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_convert.h"
#include "testutil.h"

#define CHUNK (1u << 20)

typedef void (*mine_fn)(void *dst, const void *src, size_t n);

#define MINE(name, ST, DT, fn)                                                  \
  static void name(void *d, const void *s, size_t n) {                         \
    for (size_t i = 0; i < n; i++) {                                           \
      ST x;                                                                    \
      memcpy(&x, (const char *)s + i * sizeof(ST), sizeof(ST));               \
      DT y = fn(x);                                                            \
      memcpy((char *)d + i * sizeof(DT), &y, sizeof(DT));                      \
    }                                                                          \
  }
MINE(m_f64_f32, uint64_t, uint32_t, slc_f64_to_f32)
MINE(m_f64_f16, uint64_t, uint16_t, slc_f64_to_f16)
MINE(m_f64_bf16, uint64_t, uint16_t, slc_f64_to_bf16)
MINE(m_f32_f64, uint32_t, uint64_t, slc_f32_to_f64)
MINE(m_f32_f16, uint32_t, uint16_t, slc_f32_to_f16)
MINE(m_f32_bf16, uint32_t, uint16_t, slc_f32_to_bf16)
MINE(m_f16_f64, uint16_t, uint64_t, slc_f16_to_f64)
MINE(m_f16_f32, uint16_t, uint32_t, slc_f16_to_f32)
MINE(m_f16_bf16, uint16_t, uint16_t, slc_f16_to_bf16)
MINE(m_bf16_f64, uint16_t, uint64_t, slc_bf16_to_f64)
MINE(m_bf16_f32, uint16_t, uint32_t, slc_bf16_to_f32)
MINE(m_bf16_f16, uint16_t, uint16_t, slc_bf16_to_f16)
#undef MINE

static uint64_t elem(const void *p, size_t i, size_t size) {
  uint64_t v = 0;
  memcpy(&v, (const char *)p + i * size, size); /* little-endian host */
  return v;
}

/* Converts N elements both ways and fails at the first difference, naming the input bits. */
static void compare(const char *what, sl_dtype sdt, sl_dtype ddt, mine_fn mine, const void *src, size_t n) {
  size_t ds = sl_dtype_size(ddt), ss = sl_dtype_size(sdt);
  unsigned char *want = malloc(n * ds), *got = malloc(n * ds);
  assert_non_null(want);
  assert_non_null(got);
  memset(want, 0xA5, n * ds);
  memset(got, 0x5A, n * ds);
  assert_int_equal(sl_convert(want, ddt, src, sdt, n), SL_OK);
  mine(got, src, n);
  if (memcmp(want, got, n * ds) != 0) {
    for (size_t i = 0; i < n; i++) {
      if (memcmp(want + i * ds, got + i * ds, ds) == 0) continue;
      fail_msg("%s (%s -> %s): input 0x%0*llx: sl_convert gives 0x%0*llx, the kernel math 0x%0*llx", what,
               sl_dtype_name(sdt), sl_dtype_name(ddt), (int)ss * 2, (unsigned long long)elem(src, i, ss), (int)ds * 2,
               (unsigned long long)elem(want, i, ds), (int)ds * 2, (unsigned long long)elem(got, i, ds));
    }
  }
  free(want);
  free(got);
}

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) { /* xorshift64*: reproducible */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1Dull;
}

/* ---- 16-bit sources: exhaustive -------------------------------------------------------------- */
static void test_f16_bf16_sources_exhaustive(void **state) {
  (void)state;
  uint16_t all[65536];
  for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
  compare("every F16 pattern", SL_DTYPE_F16, SL_DTYPE_F32, m_f16_f32, all, 65536);
  compare("every F16 pattern", SL_DTYPE_F16, SL_DTYPE_F64, m_f16_f64, all, 65536);
  compare("every F16 pattern", SL_DTYPE_F16, SL_DTYPE_BF16, m_f16_bf16, all, 65536);
  compare("every BF16 pattern", SL_DTYPE_BF16, SL_DTYPE_F32, m_bf16_f32, all, 65536);
  compare("every BF16 pattern", SL_DTYPE_BF16, SL_DTYPE_F64, m_bf16_f64, all, 65536);
  compare("every BF16 pattern", SL_DTYPE_BF16, SL_DTYPE_F16, m_bf16_f16, all, 65536);
}

/* ---- back from F32: every 16-bit value, its neighbours and the ties between them ------------- */
static void test_f32_boundaries(void **state) {
  (void)state;
  uint32_t *v = malloc(65536 * 16 * sizeof *v);
  assert_non_null(v);
  size_t n = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    /* BF16: the value, the tie below and above it, one ulp either side of each */
    uint32_t b = h << 16;
    const uint32_t bo[] = {0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
    for (size_t k = 0; k < 6; k++) v[n++] = b + bo[k];
    /* F16: the F32 image of every F16 pattern, and the tie to the next one (+-1 ulp) */
    uint32_t f = slc_f32_bits_from_f16((uint16_t)h);
    const uint32_t fo[] = {0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF};
    for (size_t k = 0; k < 6; k++) v[n++] = f + fo[k];
    v[n++] = f - 1;
    v[n++] = (uint32_t)rnd();
    v[n++] = (uint32_t)rnd() | 0x7F800000u; /* NaN payloads (and inf) of both signs */
    v[n++] = (uint32_t)rnd() & 0x807FFFFFu; /* F32 subnormals */
  }
  compare("F32 boundaries", SL_DTYPE_F32, SL_DTYPE_F16, m_f32_f16, v, n);
  compare("F32 boundaries", SL_DTYPE_F32, SL_DTYPE_BF16, m_f32_bf16, v, n);
  compare("F32 boundaries", SL_DTYPE_F32, SL_DTYPE_F64, m_f32_f64, v, n);
  free(v);
}

static void test_f32_random(void **state) {
  (void)state;
  uint32_t *v = malloc(CHUNK * sizeof *v);
  assert_non_null(v);
  for (int round = 0; round < 16; round++) { /* 16 Mi values */
    for (size_t i = 0; i < CHUNK; i++) v[i] = (uint32_t)rnd();
    compare("random F32", SL_DTYPE_F32, SL_DTYPE_F16, m_f32_f16, v, CHUNK);
    compare("random F32", SL_DTYPE_F32, SL_DTYPE_BF16, m_f32_bf16, v, CHUNK);
    compare("random F32", SL_DTYPE_F32, SL_DTYPE_F64, m_f32_f64, v, CHUNK);
  }
  free(v);
}

/* ---- back from F64 ---------------------------------------------------------------------------- */
/* Random doubles whose exponents cover F32's and F16's whole range (subnormals, overflow) and
 * beyond, with mantissas that are random, or end in zeros so that the F64 -> F32 step lands on a
 * tie (the double rounding dtype.c keeps), plus raw 64-bit patterns (NaN payloads, inf, zero). */
static uint64_t rnd_f64(void) {
  uint64_t r = rnd(), sign = r & 0x8000000000000000ull;
  switch (r & 7) {
    case 0: return rnd(); /* any pattern: mostly huge or tiny */
    case 1: return sign | 0x7FF0000000000000ull | (rnd() & 0xFFFFFFFFFFFFFull); /* NaN (or inf) */
    default: {
      uint64_t e = 1023 - 160 + rnd() % 300; /* 2^-160 .. 2^140 */
      uint64_t m = rnd() & 0xFFFFFFFFFFFFFull;
      if ((r >> 3) & 1) m &= ~((1ull << 28) - 1); /* ties and near-ties for F64 -> F32 */
      if ((r >> 4) & 1) m |= 1ull << 28;
      return sign | e << 52 | m;
    }
  }
}

static void test_f64_random(void **state) {
  (void)state;
  uint64_t *v = malloc(CHUNK * sizeof *v);
  assert_non_null(v);
  for (int round = 0; round < 8; round++) { /* 8 Mi values */
    for (size_t i = 0; i < CHUNK; i++) v[i] = rnd_f64();
    compare("random F64", SL_DTYPE_F64, SL_DTYPE_F32, m_f64_f32, v, CHUNK);
    compare("random F64", SL_DTYPE_F64, SL_DTYPE_F16, m_f64_f16, v, CHUNK);
    compare("random F64", SL_DTYPE_F64, SL_DTYPE_BF16, m_f64_bf16, v, CHUNK);
  }
  /* every F32 boundary value above, widened: F64 images of 16-bit values and their ties */
  size_t n = 0;
  for (uint32_t h = 0; h < 65536 && n + 4 <= CHUNK; h++) {
    v[n++] = slc_f16_to_f64((uint16_t)h);
    v[n++] = slc_bf16_to_f64((uint16_t)h);
    v[n++] = slc_f16_to_f64((uint16_t)h) + (1ull << 41); /* half an F16 ulp above a normal F16 */
    v[n++] = slc_bf16_to_f64((uint16_t)h) + (1ull << 44); /* half a BF16 ulp */
  }
  compare("F64 boundaries", SL_DTYPE_F64, SL_DTYPE_F16, m_f64_f16, v, n);
  compare("F64 boundaries", SL_DTYPE_F64, SL_DTYPE_BF16, m_f64_bf16, v, n);
  compare("F64 boundaries", SL_DTYPE_F64, SL_DTYPE_F32, m_f64_f32, v, n);
  free(v);
}

/* The NaN rules written out, so a change to either side that breaks them is named here. */
static void test_nan_rules(void **state) {
  (void)state;
  assert_int_equal(slc_f32_to_bf16(0x7FA00001u), 0xFFFF);              /* F32 -> BF16: 0xFFFF */
  assert_int_equal(slc_f64_to_bf16(0xFFF4000000000001ull), 0xFFFF);    /* F64 -> BF16: 0xFFFF */
  assert_int_equal(slc_f16_to_bf16(0x7D01), 0x7FC0);                   /* F16 -> BF16: 0x7FC0 */
  assert_int_equal(slc_f32_to_f16(0xFFA02000u), 0xFF01);               /* sign | 0x7E00 | payload */
  assert_int_equal(slc_f16_to_f32(0x7C01), 0x7FC02000u);               /* quiet bit set, payload kept */
  assert_int_equal(slc_bf16_to_f32(0x7F81), 0x7F810000u);              /* unchanged: stays signalling */
  assert_int_equal(slc_f32_to_f64(0xFF800001u), 0xFFF8000020000000ull); /* x86 cvtss2sd */
  assert_int_equal(slc_f64_to_f32(0x7FF0000020000000ull), 0x7FC00001u); /* x86 cvtsd2ss */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nan_rules),
      cmocka_unit_test(test_f16_bf16_sources_exhaustive),
      cmocka_unit_test(test_f32_boundaries),
      cmocka_unit_test(test_f32_random),
      cmocka_unit_test(test_f64_random),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
