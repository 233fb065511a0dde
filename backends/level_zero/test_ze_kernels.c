/* The Level Zero kernels (kernels.cl) as host C, run by name as the test driver runs them
 * (kernels_host.h), against the library: every cast kernel ze_kernels.h names, aligned and at
 * byte offsets, over every 16-bit pattern and millions of F32/F64 values (rounding boundaries,
 * ties, NaN payloads, subnormals), on grids smaller than, equal to and larger than the data,
 * bit-exact with sl_convert; every SGD kernel bit-exact with the host SGD step. The SPIR-V
 * modules are the same source (test_ze_spirv reads them), so this is the proof of their math
 * that a machine without an Intel GPU can give.
 *
 * Built twice: over kernels_host.c (test_ze_kernels) and over the SPIR-V modules translated back
 * (spirv_run.c: test_ze_spirv_run). Also: the F32-denormal rule of ze_kernels.h both ways, the
 * name table, and spirv_scan.c on the embedded modules and malformed ones.
 *
 * ARGS: the base and F64 .spv files, which the embedded modules (ze_spirv.h) must equal.
 * `test_ze_kernels --names base|f64` prints one module's kernel names (for test_ze_spirv). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "cuda_convert.h"
#include "internal.h"
#include "kernels_host.h"
#include "testutil.h"
#include "ze_spirv.h"

static const char *spv_files[2];

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { /* xorshift64*: reproducible */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1Dull;
}

/* ---- inputs per source dtype ------------------------------------------------------------------ */
typedef struct input {
  unsigned char *data;
  size_t n;
} input;

static input make_input(sl_dtype dt) {
  input in = {0};
  size_t cap = (size_t)3 << 20;
  size_t es = sl_dtype_size(dt);
  in.data = malloc(cap * es);
  assert_non_null(in.data);
  if (dt == SL_DTYPE_F16 || dt == SL_DTYPE_BF16) {
    for (uint32_t i = 0; i < 65536; i++) ((uint16_t *)in.data)[i] = (uint16_t)i;
    in.n = 65536;
  } else if (dt == SL_DTYPE_F32) {
    uint32_t *v = (uint32_t *)in.data;
    for (uint32_t h = 0; h < 65536; h++) {
      const uint32_t bo[] = {0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
      for (size_t k = 0; k < 6; k++) v[in.n++] = (h << 16) + bo[k];       /* BF16 values, ties, neighbours */
      const uint32_t f = slc_f32_bits_from_f16((uint16_t)h);
      const uint32_t fo[] = {0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF};
      for (size_t k = 0; k < 6; k++) v[in.n++] = f + fo[k];               /* F16 values, ties, neighbours */
      v[in.n++] = f - 1;
      v[in.n++] = (uint32_t)rnd() | 0x7F800000u;                          /* NaN payloads, inf */
      v[in.n++] = (uint32_t)rnd() & 0x807FFFFFu;                          /* subnormals */
    }
    while (in.n < cap) v[in.n++] = (uint32_t)rnd();
  } else { /* F64 */
    uint64_t *v = (uint64_t *)in.data;
    for (uint32_t h = 0; h < 65536; h++) {
      v[in.n++] = slc_f16_to_f64((uint16_t)h);
      v[in.n++] = slc_bf16_to_f64((uint16_t)h);
      v[in.n++] = slc_f16_to_f64((uint16_t)h) + (1ull << 41); /* half an F16 ulp above */
      v[in.n++] = slc_bf16_to_f64((uint16_t)h) + (1ull << 44); /* half a BF16 ulp above */
    }
    while (in.n < cap) {
      uint64_t r = rnd(), sign = r & 0x8000000000000000ull;
      if ((r & 7) == 0) v[in.n++] = rnd();
      else if ((r & 7) == 1) v[in.n++] = sign | 0x7FF0000000000000ull | (rnd() & 0xFFFFFFFFFFFFFull);
      else {
        uint64_t m = rnd() & 0xFFFFFFFFFFFFFull;
        if ((r >> 3) & 1) m &= ~((1ull << 28) - 1); /* F64 -> F32 ties */
        v[in.n++] = sign | (1023 - 160 + rnd() % 300) << 52 | m;
      }
    }
  }
  return in;
}

/* ---- one launch by name, as the driver makes it ----------------------------------------------- */
static const sl__ze_host_kernel *kernel(const char *name, int module) {
  assert_non_null(name);
  const sl__ze_host_kernel *k = sl__ze_host_kernel_find(name, module);
  if (!k) fail_msg("%s: no such kernel in module %d of the host build", name, module);
  return k;
}

static void launch(const sl__ze_host_kernel *k, void *a0, const void *a1, uint64_t n, const float *lr, size_t gsize) {
  const void *args[SL_ZE_KERNEL_MAX_ARGS] = {&a0, &a1, &n, lr};
  assert_int_equal(k->arg_size[0], sizeof a0);
  assert_int_equal(k->arg_size[2], sizeof n);
  assert_int_equal(k->nargs, lr ? 4 : 3);
  sl__ze_host_kernel_launch(k, args, gsize);
}

/* The cast kernel for SRC -> DST (aligned or at byte offsets) over IN, on grids of several
 * sizes, against sl_convert; fails at the first difference, naming the kernel and input. */
static void check_cast(sl_dtype sdt, sl_dtype ddt, const input *in, int aligned) {
  int module = -1;
  const char *name = sl__ze_cast_kernel(sdt, ddt, aligned, &module);
  const sl__ze_host_kernel *k = kernel(name, module);
  assert_int_equal(module, sdt == SL_DTYPE_F64 || ddt == SL_DTYPE_F64 ? SL_ZE_MODULE_F64 : SL_ZE_MODULE_BASE);
  const size_t ss = sl_dtype_size(sdt), ds = sl_dtype_size(ddt);
  const size_t soff = aligned ? 0 : 1, doff = aligned ? 0 : 3;
  unsigned char *src = malloc(in->n * ss + 8), *got = malloc(in->n * ds + 8), *want = malloc(in->n * ds);
  assert_non_null(src);
  assert_non_null(got);
  assert_non_null(want);
  memcpy(src + soff, in->data, in->n * ss);
  assert_int_equal(sl_convert(want, ddt, in->data, sdt, in->n), SL_OK);
  const size_t grids[] = {1, 7, 256 * 64, in->n + 5}; /* one item, a ragged stride, many, more items than elements */
  for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++) {
    size_t n = g == 0 ? in->n / 64 : in->n; /* a single work-item walks a sixty-fourth */
    memset(got, 0x5A, in->n * ds + 8);
    launch(k, got + doff, src + soff, n, NULL, grids[g]);
    for (size_t i = 0; i < n; i++) {
      if (memcmp(want + i * ds, got + doff + i * ds, ds) == 0) continue;
      uint64_t x = 0, w = 0, m = 0;
      memcpy(&x, in->data + i * ss, ss);
      memcpy(&w, want + i * ds, ds);
      memcpy(&m, got + doff + i * ds, ds);
      fail_msg("%s (grid %zu): input 0x%0*llx: sl_convert gives 0x%0*llx, the kernel 0x%0*llx", name, grids[g],
               (int)ss * 2, (unsigned long long)x, (int)ds * 2, (unsigned long long)w, (int)ds * 2,
               (unsigned long long)m);
    }
    for (size_t b = 0; b < doff; b++) assert_int_equal(got[b], 0x5A);              /* nothing before */
    for (size_t b = doff + n * ds; b < in->n * ds + 8; b++) assert_int_equal(got[b], 0x5A); /* nor past COUNT */
  }
  free(src);
  free(got);
  free(want);
}

static void test_casts(void **state) {
  (void)state;
  const sl_dtype dts[] = {SL_DTYPE_F64, SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};
  for (size_t s = 0; s < 4; s++) {
    input in = make_input(dts[s]);
    for (size_t d = 0; d < 4; d++) {
      if (s == d) continue;
      check_cast(dts[s], dts[d], &in, 1);
      check_cast(dts[s], dts[d], &in, 0);
    }
    free(in.data);
  }
}

/* F32 denormals (ze_kernels.h): OpenCL lets a device flush F32 subnormals, inputs and results.
 * Each cast kernel runs here with x86's flush-to-zero and denormals-are-zero on, against
 * sl_convert computed without: the kernels SL_ZE_NEEDS_F32_DENORMALS says need no denormals
 * must give the same bits, and those it says need them must differ somewhere (or the rule is
 * looser than it need be, and the test could not tell). The SGD steps likewise, below. */
#if defined(__x86_64__) || defined(__i386__)
#define FLUSHING_CSR 0x8040u /* FTZ (bit 15) | DAZ (bit 6) */
static void launch_flushing(const sl__ze_host_kernel *k, void *a0, const void *a1, uint64_t n, const float *lr) {
  volatile float sub = 1e-40f, one = 1.0f;
  const unsigned int csr = _mm_getcsr();
  _mm_setcsr(csr | FLUSHING_CSR);
  const float flushed = sub * one;
  launch(k, a0, a1, n, lr, 4096);
  _mm_setcsr(csr);
  assert_true(flushed == 0.0f); /* the mode took: these tests can fail */
}
#endif

static void test_casts_flush_to_zero(void **state) {
  (void)state;
#if defined(__x86_64__) || defined(__i386__)
  const sl_dtype dts[] = {SL_DTYPE_F64, SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};
  int differs[SL_ZE_MODULE_COUNT] = {0};
  for (size_t s = 0; s < 4; s++) {
    input in = make_input(dts[s]);
    for (size_t d = 0; d < 4; d++) {
      if (s == d) continue;
      int module = -1;
      const char *name = sl__ze_cast_kernel(dts[s], dts[d], 1, &module);
      const sl__ze_host_kernel *k = kernel(name, module);
      const size_t ds = sl_dtype_size(dts[d]);
      unsigned char *want = malloc(in.n * ds), *got = malloc(in.n * ds);
      assert_non_null(want);
      assert_non_null(got);
      assert_int_equal(sl_convert(want, dts[d], in.data, dts[s], in.n), SL_OK);
      launch_flushing(k, got, in.data, in.n, NULL);
      for (size_t i = 0; i < in.n; i++) {
        if (memcmp(want + i * ds, got + i * ds, ds) == 0) continue;
        if (!SL_ZE_NEEDS_F32_DENORMALS(module, 0))
          fail_msg("%s: element %zu differs from sl_convert when F32 denormals are flushed, and "
                   "SL_ZE_NEEDS_F32_DENORMALS says it needs none", name, i);
        differs[module] = 1;
        break;
      }
      free(want);
      free(got);
    }
    free(in.data);
  }
  for (int m = 0; m < SL_ZE_MODULE_COUNT; m++)
    if (SL_ZE_NEEDS_F32_DENORMALS(m, 0) && !differs[m])
      fail_msg("module %d: no cast differs with F32 denormals flushed, yet SL_ZE_NEEDS_F32_DENORMALS says they need them", m);
#else
  skip();
#endif
}

static void fill_sgd(unsigned char *p, sl_dtype dt, size_t n, int values);

/* Every SGD step differs somewhere when F32 subnormals are flushed. F32 and BF16 through
 * subnormal data; F64 only through lr, widened from F32; F16, whose values are all normal in
 * F32, through a subnormal product: 0 - lr * g is -0 kept, +0 flushed. Hence a subnormal lr
 * for those two. */
static void test_sgd_flush_to_zero(void **state) {
  (void)state;
#if defined(__x86_64__) || defined(__i386__)
  const sl_dtype dts[] = {SL_DTYPE_F64, SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};
  const size_t n = 1 << 16;
  for (size_t t = 0; t < 4; t++) {
    int module = -1;
    const char *name = sl__ze_sgd_kernel(dts[t], &module);
    const sl__ze_host_kernel *k = kernel(name, module);
    assert_true(SL_ZE_NEEDS_F32_DENORMALS(module, 1));
    const size_t es = sl_dtype_size(dts[t]);
    unsigned char *x = malloc(n * es), *g = malloc(n * es), *want = malloc(n * es);
    assert_non_null(x);
    assert_non_null(g);
    assert_non_null(want);
    fill_sgd(x, dts[t], n, 1);
    fill_sgd(g, dts[t], n, 1);
    const float lr = dts[t] == SL_DTYPE_F64 || dts[t] == SL_DTYPE_F16 ? 1e-40f : 0.01f;
    memcpy(want, x, n * es);
    assert_int_equal(sl__host_sgd_step(want, g, dts[t], n, lr), SL_OK);
    launch_flushing(k, x, g, n, &lr);
    if (memcmp(want, x, n * es) == 0)
      fail_msg("%s: identical with F32 denormals flushed: the data has no subnormal step", name);
    free(x);
    free(g);
    free(want);
  }
#else
  skip();
#endif
}

/* ---- the SGD step --------------------------------------------------------------------------------- */
/* x and g as random bit patterns of DT (NaN, inf, subnormals), and as values of similar size
 * where the step rounds. */
static void fill_sgd(unsigned char *p, sl_dtype dt, size_t n, int values) {
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rnd();
    if (values) {
      float f = (float)((int64_t)(r >> 11) - (1ll << 52)) / (float)(1ll << 52) * (float)(1 << (r & 15));
      if ((r & 0x30) == 0) f *= 1e-39f; /* F32 subnormals */
      if (sl_convert(p + i * sl_dtype_size(dt), dt, &f, SL_DTYPE_F32, 1) != SL_OK) fail();
    } else {
      memcpy(p + i * sl_dtype_size(dt), &r, sl_dtype_size(dt));
    }
  }
}

static void test_sgd(void **state) {
  (void)state;
  const sl_dtype dts[] = {SL_DTYPE_F64, SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};
  const float lrs[] = {0.01f, 3.0f, 1e-30f};
  const size_t n = 1 << 18;
  for (size_t t = 0; t < 4; t++) {
    int module = -1;
    const char *name = sl__ze_sgd_kernel(dts[t], &module);
    const sl__ze_host_kernel *k = kernel(name, module);
    assert_int_equal(module, dts[t] == SL_DTYPE_F64 ? SL_ZE_MODULE_F64 : SL_ZE_MODULE_BASE);
    const size_t es = sl_dtype_size(dts[t]);
    unsigned char *x = malloc(n * es), *g = malloc(n * es), *want = malloc(n * es);
    assert_non_null(x);
    assert_non_null(g);
    assert_non_null(want);
    for (size_t l = 0; l < 3 * 2; l++) {
      fill_sgd(x, dts[t], n, l % 2);
      fill_sgd(g, dts[t], n, l % 2);
      memcpy(want, x, n * es);
      assert_int_equal(sl__host_sgd_step(want, g, dts[t], n, lrs[l / 2]), SL_OK);
      launch(k, x, g, n, &lrs[l / 2], 1000 + l);
      for (size_t i = 0; i < n; i++)
        if (memcmp(want + i * es, x + i * es, es) != 0)
          fail_msg("%s (lr %g): element %zu differs from the host SGD step", name, (double)lrs[l / 2], i);
    }
    free(x);
    free(g);
    free(want);
  }
}

/* ---- the table ------------------------------------------------------------------------------------ */
/* Every name ze_kernels.h gives resolves in its module and in no other, names are unique, and
 * the pairs no kernel casts have none. */
static void test_names(void **state) {
  (void)state;
  const sl_dtype dts[] = {SL_DTYPE_F64, SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};
  size_t found = 0;
  for (size_t s = 0; s < 4; s++) {
    for (size_t d = 0; d < 4; d++) {
      for (int aligned = 0; aligned < 2; aligned++) {
        int module = -1;
        const char *name = sl__ze_cast_kernel(dts[s], dts[d], aligned, &module);
        if (s == d) {
          assert_null(name);
          continue;
        }
        assert_non_null(kernel(name, module));
        assert_null(sl__ze_host_kernel_find(name, !module)); /* in one module only */
        found++;
      }
    }
    int module = -1;
    assert_non_null(kernel(sl__ze_sgd_kernel(dts[s], &module), module));
    found++;
  }
  assert_int_equal(found, sl__ze_host_kernel_count()); /* 24 casts, 4 SGD steps: nothing else */
  for (size_t i = 0; i < sl__ze_host_kernel_count(); i++)
    for (size_t j = 0; j < i; j++) assert_string_not_equal(sl__ze_host_kernel_at(i)->name, sl__ze_host_kernel_at(j)->name);
  int module = -1;
  assert_null(sl__ze_cast_kernel(SL_DTYPE_I32, SL_DTYPE_F32, 1, &module));
  assert_null(sl__ze_sgd_kernel(SL_DTYPE_I64, &module));
  assert_null(sl__ze_host_kernel_find("sl_cast_f32_f8", -1));
  assert_null(sl__ze_host_kernel_at(sl__ze_host_kernel_count()));
}

static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("%s: cannot open the SPIR-V module", path);
  unsigned char *buf = NULL;
  size_t cap = 0;
  *n = 0;
  for (;;) {
    if (*n == cap) {
      cap = cap ? cap * 2 : 1 << 16;
      buf = realloc(buf, cap);
      assert_non_null(buf);
    }
    size_t got = fread(buf + *n, 1, cap - *n, f);
    if (got == 0) break;
    *n += got;
  }
  fclose(f);
  return buf;
}

/* The modules the Level Zero module embeds are the files spirv-val passed and test_ze_spirv reads. */
static void test_embedded(void **state) {
  (void)state;
  const unsigned char *mods[2] = {sl__ze_spirv_base, sl__ze_spirv_f64};
  const size_t sizes[2] = {sl__ze_spirv_base_size, sl__ze_spirv_f64_size};
  for (int m = 0; m < 2; m++) {
    size_t n = 0;
    unsigned char *file = read_file(spv_files[m], &n);
    assert_non_null(file);
    assert_int_equal(sizes[m], n);
    assert_memory_equal(mods[m], file, n);
    const uint32_t magic = (uint32_t)mods[m][0] | (uint32_t)mods[m][1] << 8 | (uint32_t)mods[m][2] << 16 |
                           (uint32_t)mods[m][3] << 24;
    assert_int_equal(magic, 0x07230203u); /* SPIR-V, little-endian */
    assert_int_equal(n % 4, 0);
    free(file);
  }
}

/* What the test driver's zeModuleCreate reads of a module: the embedded ones hold exactly the
 * kernels the table gives them, Float64 only in the F64 one; a malformed module is refused with
 * its reason. */
static void test_spirv_scan(void **state) {
  (void)state;
  const unsigned char *mods[2] = {sl__ze_spirv_base, sl__ze_spirv_f64};
  const size_t sizes[2] = {sl__ze_spirv_base_size, sl__ze_spirv_f64_size};
  char why[160];
  for (int m = 0; m < 2; m++) {
    sl__ze_spirv_info info;
    assert_int_equal(sl__ze_spirv_scan(mods[m], sizes[m], &info, why, sizeof why), 0);
    assert_int_equal(info.version, 0x00010000u);
    assert_int_equal(info.float64, m == SL_ZE_MODULE_F64);
    size_t want = 0;
    for (size_t i = 0; i < sl__ze_host_kernel_count(); i++) want += sl__ze_host_kernel_at(i)->module == m;
    assert_int_equal(info.nkernels, want);
    for (size_t k = 0; k < info.nkernels; k++)
      if (!sl__ze_host_kernel_find(info.kernel[k], m)) fail_msg("module %d: kernel %s is not in the table", m, info.kernel[k]);
  }
  /* malformed: each refused, saying why */
  const size_t n = sl__ze_spirv_base_size;
  unsigned char *bad = malloc(n);
  assert_non_null(bad);
  sl__ze_spirv_info info;
  assert_int_equal(sl__ze_spirv_scan(sl__ze_spirv_base, 0, &info, why, sizeof why), -1);
  assert_non_null(strstr(why, "not a module"));
  assert_int_equal(sl__ze_spirv_scan(sl__ze_spirv_base, n - 2, &info, why, sizeof why), -1); /* not whole words */
  memcpy(bad, sl__ze_spirv_base, n);
  bad[0] ^= 1;
  assert_int_equal(sl__ze_spirv_scan(bad, n, &info, why, sizeof why), -1);
  assert_non_null(strstr(why, "magic"));
  memcpy(bad, sl__ze_spirv_base, n);
  memset(bad + 20, 0, 4); /* the first instruction: zero words */
  assert_int_equal(sl__ze_spirv_scan(bad, n, &info, why, sizeof why), -1);
  assert_non_null(strstr(why, "word 5"));
  /* truncated inside its first instruction (OpCapability: two words) */
  assert_int_equal(sl__ze_spirv_scan(sl__ze_spirv_base, 24, &info, why, sizeof why), -1);
  assert_non_null(strstr(why, "remain"));
  /* an entry point whose name runs to the end of its instruction, unterminated */
  memcpy(bad, sl__ze_spirv_base, n);
  size_t i = 5;
  uint32_t w = 0;
  for (; i < n / 4; i += w >> 16) {
    memcpy(&w, bad + 4 * i, 4);
    if ((w & 0xFFFFu) == 15) break;
  }
  assert_true(i < n / 4);
  const size_t count = w >> 16;
  memset(bad + 4 * (i + 3), 'x', 4 * (count - 3)); /* the name and the interface ids after it */
  assert_int_equal(sl__ze_spirv_scan(bad, n, &info, why, sizeof why), -1);
  assert_non_null(strstr(why, "not terminated"));
  free(bad);
}

static int print_names(const char *module) {
  int m = strcmp(module, "base") == 0 ? SL_ZE_MODULE_BASE : strcmp(module, "f64") == 0 ? SL_ZE_MODULE_F64 : -1;
  if (m < 0) {
    fprintf(stderr, "test_ze_kernels --names: say base or f64, not '%s'\n", module);
    return 2;
  }
  for (size_t i = 0; i < sl__ze_host_kernel_count(); i++)
    if (sl__ze_host_kernel_at(i)->module == m) printf("%s\n", sl__ze_host_kernel_at(i)->name);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--names") == 0) return print_names(argv[2]);
  if (argc != 3) {
    fprintf(stderr, "usage: test_ze_kernels BASE.spv F64.spv | --names base|f64\n");
    return 2;
  }
  spv_files[0] = argv[1];
  spv_files[1] = argv[2];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_embedded),
      cmocka_unit_test(test_spirv_scan),
      cmocka_unit_test(test_casts),
      cmocka_unit_test(test_casts_flush_to_zero),
      cmocka_unit_test(test_sgd),
      cmocka_unit_test(test_sgd_flush_to_zero),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
