/* DTensor shard geometry and region arithmetic.
 *
 * A rank's local shard is a hyperrectangle of the global tensor (per dim an offset and a
 * length). Its elements, in local row-major order, are a monotone subsequence of the global
 * row-major order, so any contiguous global range [a, b) maps to a contiguous local range.
 * That is what lets the loader stream a tensor in bounded global chunks and hand every rank
 * exactly its bytes of each chunk, for a shard on any dim. */
#include <string.h>

#include "internal.h"

void sl__mesh_coord(int rank, int mesh_ndim, const int *mesh, int *coord) {
  for (int m = mesh_ndim - 1; m >= 0; m--) {
    coord[m] = rank % mesh[m];
    rank /= mesh[m];
  }
}

sl_status sl__region_compute(const int64_t *shape, int ndim, int mesh_ndim, const int *mesh,
                             const sl_mesh_placement *pl, const int *coord, sl__region *out) {
  if (ndim < 0 || ndim > SL_MAX_DIMS || mesh_ndim < 1 || mesh_ndim > SL_MAX_MESH_DIMS)
    return SL_ERR_INVALID;
  memset(out, 0, sizeof *out);
  out->ndim = ndim;
  for (int d = 0; d < ndim; d++) {
    out->shape[d] = shape[d];
    out->len[d] = shape[d];
  }
  /* Placements apply left to right; each shard re-chunks the extent left by the previous
   * ones, with torch.chunk's rule (chunk = ceil(n/k); trailing ranks may be empty, their
   * offset then being the end of the extent, as DTensor reports it). */
  for (int m = 0; m < mesh_ndim; m++) {
    if (pl[m].kind != SL_SHARD) continue;
    int d = pl[m].dim < 0 ? pl[m].dim + ndim : pl[m].dim;
    if (d < 0 || d >= ndim || mesh[m] < 1 || coord[m] < 0 || coord[m] >= mesh[m]) return SL_ERR_INVALID;
    /* Without n + k - 1 or start + chunk: a zero-element tensor may have one dim near
     * INT64_MAX (the header allows it), and those sums would overflow. chunk * coord cannot:
     * it is at most n for such n. */
    int64_t n = out->len[d], k = mesh[m];
    int64_t chunk = n / k + (n % k != 0);
    int64_t start = chunk * coord[m];
    if (start > n) start = n;
    int64_t end = n - start < chunk ? n : start + chunk;
    out->off[d] += start;
    out->len[d] = end - start;
  }
  return SL_OK;
}

uint64_t sl__region_elems(const sl__region *r) {
  uint64_t n = 1;
  for (int d = 0; d < r->ndim; d++) n *= (uint64_t)r->len[d];
  return n;
}

static uint64_t global_elems(const sl__region *r) {
  uint64_t n = 1;
  for (int d = 0; d < r->ndim; d++) n *= (uint64_t)r->shape[d];
  return n;
}

uint64_t sl__region_rank_of(const sl__region *r, uint64_t g) {
  uint64_t total = global_elems(r), elems = sl__region_elems(r);
  if (elems == 0) return 0;
  if (g >= total) return elems;
  int64_t gi[SL_MAX_DIMS];
  for (int d = r->ndim - 1; d >= 0; d--) {
    gi[d] = (int64_t)(g % (uint64_t)r->shape[d]);
    g /= (uint64_t)r->shape[d];
  }
  uint64_t count = 0, inner = elems;
  for (int d = 0; d < r->ndim; d++) {
    inner /= (uint64_t)r->len[d];
    int64_t x = gi[d] - r->off[d];
    if (x < 0) return count;
    if (x >= r->len[d]) return count + (uint64_t)r->len[d] * inner;
    count += (uint64_t)x * inner;
  }
  return count;
}

sl_status sl__region_runs(const sl__region *r, uint64_t a, uint64_t b, sl__run_fn fn, void *user) {
  uint64_t elems = sl__region_elems(r);
  if (elems == 0 || a >= b) return SL_OK;
  /* j: the innermost dim that is not full; every dim inside it is full, so a run spans
   * len[j] * (product of the full inner extents) consecutive global elements. */
  int j = r->ndim - 1;
  uint64_t inner = 1;
  while (j >= 0 && r->len[j] == r->shape[j]) {
    inner *= (uint64_t)r->shape[j];
    j--;
  }
  uint64_t run = j >= 0 ? (uint64_t)r->len[j] * inner : inner;
  uint64_t stride[SL_MAX_DIMS];
  uint64_t s = 1;
  for (int d = r->ndim - 1; d >= 0; d--) {
    stride[d] = s;
    s *= (uint64_t)r->shape[d];
  }
  uint64_t nruns = elems / run;
  uint64_t first = sl__region_rank_of(r, a) / run;
  /* multi-index of run FIRST over the outer dims [0, j) */
  int64_t idx[SL_MAX_DIMS] = {0};
  uint64_t q = first;
  for (int d = j - 1; d >= 0; d--) {
    idx[d] = (int64_t)(q % (uint64_t)r->len[d]);
    q /= (uint64_t)r->len[d];
  }
  for (uint64_t k = first; k < nruns; k++) {
    uint64_t gs = 0;
    for (int d = 0; d < j; d++) gs += (uint64_t)(r->off[d] + idx[d]) * stride[d];
    if (j >= 0) gs += (uint64_t)r->off[j] * stride[j];
    if (gs >= b) break;
    uint64_t ge = gs + run;
    uint64_t cs = gs < a ? a : gs, ce = ge > b ? b : ge;
    if (cs < ce) {
      sl_status st = fn(user, cs, k * run + (cs - gs), ce - cs);
      if (st != SL_OK) return st;
    }
    for (int d = j - 1; d >= 0; d--) {
      if (++idx[d] < r->len[d]) break;
      idx[d] = 0;
    }
  }
  return SL_OK;
}

typedef struct extract_ctx {
  const unsigned char *chunk;
  unsigned char *dst;
  uint64_t a, written;
  size_t esize;
} extract_ctx;

static sl_status extract_run(void *user, uint64_t gs, uint64_t ls, uint64_t count) {
  extract_ctx *x = user;
  memcpy(x->dst + x->written * x->esize, x->chunk + (gs - x->a) * x->esize, count * x->esize);
  x->written += count;
  return SL_OK;
}

uint64_t sl__region_extract(const sl__region *r, size_t esize, const void *chunk, uint64_t a,
                            uint64_t b, void *dst) {
  extract_ctx x = {chunk, dst, a, 0, esize};
  sl__region_runs(r, a, b, extract_run, &x);
  return x.written;
}

sl_status sl__shard_of(sl_plan *plan, const sl_source_tensor *t, int mesh_ndim, const int *mesh, const int *coord,
                       sl__resolved *res, sl__region *reg, uint64_t *nbytes) {
  sl_status st = sl__plan_resolve(plan, t, res);
  return st != SL_OK ? st : sl__shard_geometry(plan, t, mesh_ndim, mesh, coord, res, reg, nbytes);
}

sl_status sl__shard_geometry(sl_plan *plan, const sl_source_tensor *t, int mesh_ndim, const int *mesh,
                             const int *coord, const sl__resolved *res, sl__region *reg, uint64_t *nbytes) {
  sl_context *ctx = sl__plan_context(plan);
  if (sl__region_compute(t->shape, t->ndim, mesh_ndim, mesh, res->placements, coord, reg) != SL_OK)
    return sl__fail(ctx, SL_ERR_PLAN, "%s: placement does not fit its shape (ndim %d)", t->name, t->ndim);
  uint64_t elems = 1;
  for (int d = 0; d < t->ndim; d++)
    if (!sl__mul_u64(elems, (uint64_t)reg->len[d], &elems))
      return sl__fail(ctx, SL_ERR_SHAPE, "%s: shard size overflows", t->name);
  if (!sl__mul_u64(elems, sl_dtype_size(res->dtype), nbytes))
    return sl__fail(ctx, SL_ERR_SHAPE, "%s: shard size overflows", t->name);
  return SL_OK;
}
