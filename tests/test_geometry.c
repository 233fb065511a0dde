/* Shard geometry (docs/DESIGN.md#geometry examples) and the region arithmetic the loader streams with,
 * checked against a brute-force enumeration of every global element. */
#include <stdlib.h>

#include "testutil.h"

#include "internal.h"

static void rows(int64_t n, int mesh_ndim, const int *mesh, const sl_mesh_placement *pl, const int64_t *want_len,
                 const int64_t *want_off) {
  int world = 1;
  for (int m = 0; m < mesh_ndim; m++) world *= mesh[m];
  int64_t shape[1] = {n};
  for (int r = 0; r < world; r++) {
    int coord[SL_MAX_MESH_DIMS];
    sl__region reg;
    sl__mesh_coord(r, mesh_ndim, mesh, coord);
    assert_int_equal(sl__region_compute(shape, 1, mesh_ndim, mesh, pl, coord, &reg), SL_OK);
    assert_int_equal(reg.len[0], want_len[r]);
    assert_int_equal(reg.off[0], want_off[r]);
  }
}

static void test_chunk_rule_1d(void **state) {
  int mesh[] = {4};
  sl_mesh_placement s0[] = {{SL_SHARD, 0}};
  rows(10, 1, mesh, s0, (int64_t[]){3, 3, 3, 1}, (int64_t[]){0, 3, 6, 9});
  rows(9, 1, mesh, s0, (int64_t[]){3, 3, 3, 0}, (int64_t[]){0, 3, 6, 9});
  rows(3, 1, mesh, s0, (int64_t[]){1, 1, 1, 0}, (int64_t[]){0, 1, 2, 3});
  rows(5, 1, mesh, s0, (int64_t[]){2, 2, 1, 0}, (int64_t[]){0, 2, 4, 5});
  rows(0, 1, mesh, s0, (int64_t[]){0, 0, 0, 0}, (int64_t[]){0, 0, 0, 0});
  sl_mesh_placement rep[] = {{SL_REPLICATE, 0}};
  rows(10, 1, mesh, rep, (int64_t[]){10, 10, 10, 10}, (int64_t[]){0, 0, 0, 0});
}

/* A zero-element tensor may have a dim near INT64_MAX ([0, 9223372036854775807] is a valid
 * header): torch.chunk's rule must hold there without overflowing. */
static void test_chunk_rule_near_int64_max(void **state) {
  int mesh[] = {4};
  sl_mesh_placement s0[] = {{SL_SHARD, 0}};
  const int64_t c = INT64_C(1) << 61; /* ceil((2^63 - 1) / 4) */
  rows(INT64_MAX, 1, mesh, s0, (int64_t[]){c, c, c, c - 1}, (int64_t[]){0, c, 2 * c, 3 * c});
  int mesh3[] = {3};
  const int64_t c3 = INT64_MAX / 3 + 1; /* 2^63 - 1 is 1 mod 3 */
  rows(INT64_MAX, 1, mesh3, s0, (int64_t[]){c3, c3, INT64_MAX - 2 * c3}, (int64_t[]){0, c3, 2 * c3});
  int mesh22[] = {2, 2};
  sl_mesh_placement ss[] = {{SL_SHARD, 0}, {SL_SHARD, 0}};
  const int64_t h = INT64_C(1) << 62; /* ceil((2^63 - 1) / 2) */
  rows(INT64_MAX, 2, mesh22, ss, (int64_t[]){h / 2, h / 2, h / 2, h / 2 - 1},
       (int64_t[]){0, h / 2, h, h + h / 2});
}

static void test_nested_shards_rechunk(void **state) {
  int mesh[] = {2, 2};
  sl_mesh_placement ss[] = {{SL_SHARD, 0}, {SL_SHARD, 0}};
  rows(10, 2, mesh, ss, (int64_t[]){3, 2, 3, 2}, (int64_t[]){0, 3, 5, 8});
  sl_mesh_placement hsdp[] = {{SL_REPLICATE, 0}, {SL_SHARD, 0}};
  rows(10, 2, mesh, hsdp, (int64_t[]){5, 5, 5, 5}, (int64_t[]){0, 5, 0, 5});
  /* 3 rows on [shard(0), shard(0)] 2x2: 2,1 then 1,1 / 1,0 (empty at the end of its extent) */
  rows(3, 2, mesh, ss, (int64_t[]){1, 1, 1, 0}, (int64_t[]){0, 1, 2, 3});
}

static void test_dim1_and_negative(void **state) {
  int mesh[] = {3};
  int64_t shape[] = {4, 7};
  sl_mesh_placement s1[] = {{SL_SHARD, -1}};
  int64_t want_len[] = {3, 3, 1}, want_off[] = {0, 3, 6};
  for (int r = 0; r < 3; r++) {
    int coord[1];
    sl__region reg;
    sl__mesh_coord(r, 1, mesh, coord);
    assert_int_equal(sl__region_compute(shape, 2, 1, mesh, s1, coord, &reg), SL_OK);
    assert_int_equal(reg.len[0], 4);
    assert_int_equal(reg.off[0], 0);
    assert_int_equal(reg.len[1], want_len[r]);
    assert_int_equal(reg.off[1], want_off[r]);
  }
  sl_mesh_placement bad[] = {{SL_SHARD, 2}};
  int coord[1] = {0};
  sl__region reg;
  assert_int_equal(sl__region_compute(shape, 2, 1, mesh, bad, coord, &reg), SL_ERR_INVALID);
}

static void test_mesh_coord_row_major(void **state) {
  int mesh[] = {2, 3}, c[2];
  sl__mesh_coord(4, 2, mesh, c);
  assert_int_equal(c[0], 1);
  assert_int_equal(c[1], 1);
  sl__mesh_coord(2, 2, mesh, c);
  assert_int_equal(c[0], 0);
  assert_int_equal(c[1], 2);
}

/* ---- brute force ---------------------------------------------------------------------- */
static int in_region(const sl__region *r, uint64_t g) {
  for (int d = r->ndim - 1; d >= 0; d--) {
    int64_t i = (int64_t)(g % (uint64_t)r->shape[d]);
    g /= (uint64_t)r->shape[d];
    if (i < r->off[d] || i >= r->off[d] + r->len[d]) return 0;
  }
  return 1;
}

typedef struct collect {
  uint64_t *g, *l;
  uint64_t n;
} collect;

static sl_status collect_run(void *user, uint64_t gs, uint64_t ls, uint64_t count) {
  collect *c = user;
  for (uint64_t k = 0; k < count; k++) {
    c->g[c->n] = gs + k;
    c->l[c->n] = ls + k;
    c->n++;
  }
  return SL_OK;
}

static void test_region_arithmetic_brute_force(void **state) {
  srand(12345);
  for (int iter = 0; iter < 400; iter++) {
    sl__region r = {0};
    r.ndim = rand() % 5; /* 0-d included */
    uint64_t total = 1;
    for (int d = 0; d < r.ndim; d++) {
      r.shape[d] = 1 + rand() % 6;
      if (rand() % 11 == 0) r.shape[d] = 0;
      r.off[d] = r.shape[d] ? rand() % (r.shape[d] + 1) : 0;
      r.len[d] = rand() % (r.shape[d] - r.off[d] + 1);
      if (rand() % 3 == 0) r.off[d] = 0, r.len[d] = r.shape[d]; /* full dims make runs merge */
      total *= (uint64_t)r.shape[d];
    }
    uint64_t *g = malloc((total + 1) * sizeof *g), *l = malloc((total + 1) * sizeof *l);
    unsigned char *src = malloc(total + 1), *out = malloc(total + 1), *want = malloc(total + 1);
    for (uint64_t i = 0; i < total; i++) src[i] = (unsigned char)(i * 7 + 3);
    /* expected: region members in global order */
    uint64_t members = 0;
    for (uint64_t i = 0; i < total; i++) {
      assert_int_equal(sl__region_rank_of(&r, i), members);
      if (in_region(&r, i)) want[members++] = src[i];
    }
    assert_int_equal(sl__region_elems(&r), members);
    assert_int_equal(sl__region_rank_of(&r, total), members);
    /* every sub-range [a, b) */
    for (int k = 0; k < 8 && total; k++) {
      uint64_t a = (uint64_t)rand() % (total + 1), b = (uint64_t)rand() % (total + 1);
      if (a > b) {
        uint64_t t = a;
        a = b;
        b = t;
      }
      collect c = {g, l, 0};
      assert_int_equal(sl__region_runs(&r, a, b, collect_run, &c), SL_OK);
      uint64_t la = sl__region_rank_of(&r, a), lb = sl__region_rank_of(&r, b);
      assert_int_equal(c.n, lb - la);
      for (uint64_t q = 0; q < c.n; q++) {
        assert_true(in_region(&r, c.g[q]));
        assert_true(c.g[q] >= a && c.g[q] < b);
        assert_int_equal(c.l[q], la + q);
        if (q) assert_true(c.g[q] > c.g[q - 1]);
      }
      uint64_t n = sl__region_extract(&r, 1, src + a, a, b, out);
      assert_int_equal(n, lb - la);
      assert_memory_equal(out, want + la, n);
    }
    free(g);
    free(l);
    free(src);
    free(out);
    free(want);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chunk_rule_1d),
      cmocka_unit_test(test_chunk_rule_near_int64_max),
      cmocka_unit_test(test_nested_shards_rechunk),
      cmocka_unit_test(test_dim1_and_negative),
      cmocka_unit_test(test_mesh_coord_row_major),
      cmocka_unit_test(test_region_arithmetic_brute_force),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
