/* Phase 2's schedule (docs/DESIGN.md#data-flow): tensors in file order, cut into pieces that
 * fit one staging slot, and consecutive pieces of one placement class bucketed into one
 * transfer, so that 10^5 small tensors cost a few hundred collective operations rather than
 * 10^5 round trips. Every rank derives the same schedule from the agreed plan and staging
 * size. */
#include <stdlib.h>

#include "loader.h"

/* Whether rank 0 casts a piece of this tensor on its way to the wire. Transfers never mix
 * such tensors with the others (the class says so), so a transfer's W area exists exactly when
 * every piece needs it. */
static bool casts_to_wire(const tensor_job *j) { return j->src->dtype != j->wire; }

/* Whether a piece needs the Y area: host-side casts of received bytes (the parameter dtype
 * differs from the wire's), device-to-host landings of CPU placements on the device route, and
 * every-rank reads (which stage the file's dtype there). */
static bool needs_y(const loader *L, const tensor_job *j) {
  return L->o.read_mode == SL_READ_EVERY_RANK || j->wire != j->res.dtype ||
         (L->device_route && sl__shard_on_host(L, j));
}

static size_t ymax(const loader *L, const tensor_job *j) {
  if (!needs_y(L, j)) return 0;
  size_t ef = sl_dtype_size(j->src->dtype), ep = sl_dtype_size(j->res.dtype);
  return ef > ep ? ef : ep;
}

/* Staging bytes per element of a piece: the read (file dtype), the cast to the wire dtype (W,
 * only when it casts), packed parts and the received part (P, V: wire dtype) and the Y area
 * (the larger of file and parameter dtype, only where needed). */
uint64_t sl__loader_cost_per_elem(const loader *L, const tensor_job *j) {
  size_t ew = sl_dtype_size(j->wire);
  return sl_dtype_size(j->src->dtype) + (casts_to_wire(j) ? ew : 0) + 2 * ew + ymax(L, j);
}

#define MAX_PIECES_PER_TRANSFER 4096 /* bounds the per-transfer tables */

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t c = *cap ? *cap * 2 : 64;
  while (c < need) c *= 2;
  void *q = realloc(*p, c * elem);
  if (!q) return false;
  *p = q;
  *cap = c;
  return true;
}

/* Orders a transfer's pieces by wire element size, largest first (stable: file order within
 * one size). Element sizes are powers of two, so a dense run of such parts keeps every element
 * aligned to its size. */
static void order_pieces(loader *L, transfer *x) {
  if (!x) return;
  piece *p = L->pieces + x->first;
  for (size_t i = 1; i < x->count; i++) { /* insertion sort: transfers are short or already ordered */
    piece v = p[i];
    size_t ev = sl_dtype_size(L->jobs[v.job].wire), k = i;
    while (k > 0 && sl_dtype_size(L->jobs[p[k - 1].job].wire) < ev) {
      p[k] = p[k - 1];
      k--;
    }
    p[k] = v;
  }
}

sl_status sl__loader_schedule(loader *L) {
  size_t cap_p = 0, cap_x = 0;
  /* room kept for the alignment of the carve-up and of each rank's packed block */
  const uint64_t cap = L->slot_bytes - SL__SLOT_SLACK - 16 * (uint64_t)L->world;
  transfer *cur = NULL;
  uint64_t used = 0;
  uint32_t klass = 0;
  for (size_t ji = 0; ji < L->njobs; ji++) {
    const tensor_job *j = &L->jobs[ji];
    const uint64_t c = sl__loader_cost_per_elem(L, j);
    const uint32_t k = j->klass | (uint32_t)casts_to_wire(j) << 9;
    uint64_t a = 0;
    while (a < j->elems) {
      uint64_t room = cur && cap - used > SL__PIECE_PAD ? (cap - used - SL__PIECE_PAD) / c : 0;
      if (cur && (klass != k || room == 0 || cur->count >= MAX_PIECES_PER_TRANSFER)) {
        order_pieces(L, cur);
        cur = NULL;
      }
      if (!cur) {
        if (!grow((void **)&L->xfers, &cap_x, L->nxfers + 1, sizeof *L->xfers)) goto nomem;
        cur = &L->xfers[L->nxfers++];
        *cur = (transfer){.first = L->npieces, .hsdp = j->hsdp, .plain = true};
        used = 0;
        klass = k;
        room = (cap - SL__PIECE_PAD) / c ? (cap - SL__PIECE_PAD) / c : 1;
      }
      uint64_t n = j->elems - a < room ? j->elems - a : room;
      if (!grow((void **)&L->pieces, &cap_p, L->npieces + 1, sizeof *L->pieces)) goto nomem;
      L->pieces[L->npieces++] = (piece){ji, a, a + n};
      cur->count++;
      cur->read_bytes += SL__A16(n * sl_dtype_size(j->src->dtype));
      cur->wire_bytes += n * sl_dtype_size(j->wire);
      cur->plain &= j->src->dtype == j->wire;
      cur->y_bytes += SL__A16(n * ymax(L, j));
      cur->file_bytes += n * sl_dtype_size(j->src->dtype);
      used += n * c + SL__PIECE_PAD;
      a += n;
    }
  }
  order_pieces(L, cur);
  return SL_OK;
nomem:
  return sl__fail(L->ctx, SL_ERR_NOMEM, "out of memory scheduling %zu tensors", L->njobs);
}
