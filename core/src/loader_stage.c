/* The staging slots of phase 2 and their memory bound (docs/DESIGN.md#memory): the slots'
 * size, the carve-up of a slot for one transfer, the schedule of transfers through them
 * (docs/DESIGN.md#data-flow), and their allocation.
 *
 * The bound. A rank's staging is N slots (pipeline_slots, default SL__DEFAULT_SLOTS) of
 * slot_bytes each in host memory (pinned where the backend has it), and the same again in
 * device memory where the device route or a cast on the device needs it; only the slots
 * transfers use are allocated (sl__loader_stage_setup). slot_bytes is the budget split
 * between the slots (staging / N), or less when the whole checkpoint needs less, or less
 * under the smallest maximum allocation of any rank's backend (agreed.alloc_cap); never less
 * than SL__MIN_SLOT plus the reserve below, so a budget under N * (SL__MIN_SLOT + reserve)
 * (1280 bytes + 16 a rank each) is raised to that; every-rank reads that all land in place
 * allocate none (uses_slots). So host staging is at most
 * max(staging, N * (SL__MIN_SLOT + reserve)), device staging the same, whatever the size of
 * the checkpoint or of its largest tensor.
 *
 * Why every transfer fits its slot. A transfer's carve-up (carve_of) takes, one after another
 * at 64-byte boundaries: READ (pieces of the file dtype at multiples of 16), WIRE (dense wire
 * dtype, only where rank 0 casts), PACKED (dense wire dtype, each rank's block at a multiple of
 * 16), RECV (dense wire dtype) and LANDING (the larger of file and parameter dtype, pieces at
 * multiples of 16, only for the pieces that need it). cost_per_elem charges each element for
 * exactly those areas, so the elements of a transfer cost at most slot_bytes - reserve: the
 * schedule admits a piece of n elements only while used + n * cost + SL__PIECE_PAD stays under
 * that. What rounding adds on top is covered by the reserve: SL__PIECE_PAD per piece (its
 * 16-byte alignment in each area), SL__SLOT_SLACK per slot (the areas' 64-byte alignment) and
 * 16 bytes per rank (the packed blocks' alignment). A piece too large for one slot is cut
 * into several transfers. What the senders and receivers take of a slot (loader_send.c,
 * loader_recv.c) stays inside the areas this carve-up gives them. */
#include <stdlib.h>
#include <string.h>

#include "loader.h"

#define SL__MIN_SLOT 1024u
/* per slot: room for the carve-up's 64-byte area alignment */
#define SL__SLOT_SLACK 256
/* per piece: its 16-byte alignment in each of the five areas */
#define SL__PIECE_PAD 80
#define MAX_PIECES_PER_TRANSFER 4096 /* bounds the per-transfer tables */

/* What a slot keeps beyond its transfer's elements: the areas' alignment and each rank's
 * packed block's. */
static uint64_t reserve_of(const loader *L) { return SL__SLOT_SLACK + 16 * (uint64_t)L->world; }

static size_t align64(uint64_t x) { return (size_t)((x + 63) & ~(uint64_t)63); }

/* ---- the carve-up ------------------------------------------------------------------------ */
static carve carve_of(const transfer *x, int world) {
  carve c;
  c.read = 0;
  c.wire = align64(x->read_bytes);
  c.packed = c.wire + (x->plain ? 0 : align64(x->wire_bytes)); /* wire: only where rank 0 casts */
  c.recv = c.packed + align64(x->wire_bytes + 16 * (uint64_t)world); /* packed blocks start at multiples of 16 */
  c.landing = c.recv + align64(x->wire_bytes);
  return c;
}

carve sl__loader_carve(const loader *L, const transfer *x) {
  /* every-rank reads: the read area, then the landing area right after it (nothing crosses
   * the network, so the wire areas are unused) */
  if (L->o.read_mode == SL_READ_EVERY_RANK) return (carve){.read = 0, .landing = align64(x->read_bytes)};
  return carve_of(x, L->world);
}

/* ---- what a piece costs -------------------------------------------------------------------- */
/* Whether rank 0 casts a piece of this tensor on its way to the wire. Transfers never mix
 * such tensors with the others (the class says so), so a transfer's wire area exists exactly
 * when every piece needs it. */
static bool casts_to_wire(const tensor_job *j) { return j->src->dtype != j->wire; }

/* Whether a piece needs the landing area: host-side casts of received bytes (the parameter
 * dtype differs from the wire's), device-to-host landings of CPU placements on the device
 * route, and every-rank reads (which stage the file's dtype there). */
static bool needs_landing(const loader *L, const tensor_job *j) {
  return L->o.read_mode == SL_READ_EVERY_RANK || j->wire != j->res.dtype ||
         (L->pipe.device_route && sl__shard_on_host(L, j));
}

static size_t landing_elem(const loader *L, const tensor_job *j) {
  if (!needs_landing(L, j)) return 0;
  size_t ef = sl_dtype_size(j->src->dtype), ep = sl_dtype_size(j->res.dtype);
  return ef > ep ? ef : ep;
}

/* Staging bytes per element of a piece: the read (file dtype), the cast to the wire dtype
 * (wire, only when it casts), packed parts and the received part (packed, recv: wire dtype)
 * and the landing area (the larger of file and parameter dtype, only where needed). */
static uint64_t cost_per_elem(const loader *L, const tensor_job *j) {
  size_t ew = sl_dtype_size(j->wire);
  return sl_dtype_size(j->src->dtype) + (casts_to_wire(j) ? ew : 0) + 2 * ew + landing_elem(L, j);
}

/* ---- the slots' size ------------------------------------------------------------------------ */
/* The budget split between the slots, or less when the whole checkpoint needs less — a small
 * checkpoint should not pay for populating 64 MiB. Every rank computes the same figure from
 * the same plan, so transfers agree. */
static size_t slot_size(const loader *L) {
  const uint64_t reserve = reserve_of(L);
  uint64_t need = reserve;
  for (size_t i = 0; i < L->njobs && need < L->o.staging_bytes; i++) {
    uint64_t b;
    if (!sl__mul_u64(L->jobs[i].elems, cost_per_elem(L, &L->jobs[i]), &b) ||
        !sl__add_u64(need, b + SL__PIECE_PAD, &need))
      need = L->o.staging_bytes;
  }
  uint64_t per_slot = L->o.staging_bytes / (size_t)L->stage.nslots;
  if (need < per_slot) per_slot = need;
  /* one slot is one allocation (host, pinned or device): under every rank's backend limit (a
   * Level Zero device without relaxed limits), the transfers then split finer */
  if (L->agreed.alloc_cap && per_slot > L->agreed.alloc_cap) per_slot = L->agreed.alloc_cap;
  if (per_slot < SL__MIN_SLOT + reserve) per_slot = SL__MIN_SLOT + reserve;
  return (size_t)per_slot;
}

/* ---- the schedule ------------------------------------------------------------------------ */
/* Tensors in file order, cut into pieces that fit one staging slot, and consecutive pieces of
 * one placement class bucketed into one transfer, so that 10^5 small tensors cost a few
 * hundred collective operations rather than 10^5 round trips. Every rank derives the same
 * schedule from the agreed plan and staging size. */
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
  piece *p = L->stage.pieces + x->first;
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

/* Distributed readers: each reader's transfers (its share, in file order) are taken in turn,
 * one of each reader per round, so that while one reader's transfer moves the others read
 * their next ones (docs/DESIGN.md#readers). Each reader still reads its share front to back. */
static sl_status interleave(loader *L) {
  loader_stage *g = &L->stage;
  if (L->nreaders < 2 || g->nxfers < 2) return SL_OK;
  size_t R = (size_t)L->nreaders;
  size_t *next = calloc(R, sizeof *next); /* per reader: its next transfer in file order */
  int *idx = calloc((size_t)L->world, sizeof *idx);
  transfer *out = malloc(g->nxfers * sizeof *out);
  if (!next || !idx || !out) {
    free(next);
    free(idx);
    free(out);
    return sl__fail(L->ctx, SL_ERR_NOMEM, "out of memory ordering %zu transfers between readers", g->nxfers);
  }
  for (size_t i = 0; i < R; i++) idx[L->reader_rank[i]] = (int)i;
  /* per reader, the first transfer of its share; shares are contiguous in file order */
  for (size_t i = 0; i < R; i++) next[i] = SIZE_MAX;
  for (size_t k = g->nxfers; k-- > 0;) next[idx[g->xfers[k].root]] = k;
  size_t n = 0;
  while (n < g->nxfers)
    for (size_t i = 0; i < R; i++) {
      size_t k = next[i];
      if (k >= g->nxfers) continue;
      out[n++] = g->xfers[k];
      int root = g->xfers[k].root;
      for (k++; k < g->nxfers && g->xfers[k].root != root; k++) {}
      next[i] = k;
    }
  free(g->xfers);
  g->xfers = out;
  free(next);
  free(idx);
  return SL_OK;
}

static sl_status schedule(loader *L) {
  loader_stage *g = &L->stage;
  size_t cap_p = 0, cap_x = 0;
  /* room kept for the alignment of the carve-up and of each rank's packed block */
  const uint64_t cap = g->slot_bytes - reserve_of(L);
  transfer *cur = NULL;
  uint64_t used = 0;
  uint32_t klass = 0;
  for (size_t ji = 0; ji < L->njobs; ji++) {
    const tensor_job *j = &L->jobs[ji];
    const uint64_t c = cost_per_elem(L, j);
    const uint32_t k = j->klass | (uint32_t)casts_to_wire(j) << 9;
    const int root = L->nreaders ? L->reader_rank[j->reader] : 0;
    uint64_t a = 0;
    while (a < j->elems) {
      uint64_t room = cur && cap - used > SL__PIECE_PAD ? (cap - used - SL__PIECE_PAD) / c : 0;
      if (cur && (klass != k || cur->root != root || room == 0 || cur->count >= MAX_PIECES_PER_TRANSFER)) {
        order_pieces(L, cur);
        cur = NULL;
      }
      if (!cur) {
        if (!grow((void **)&g->xfers, &cap_x, g->nxfers + 1, sizeof *g->xfers)) goto nomem;
        cur = &g->xfers[g->nxfers++];
        *cur = (transfer){.first = g->npieces, .hsdp = j->hsdp, .plain = true, .root = root};
        used = 0;
        klass = k;
        room = (cap - SL__PIECE_PAD) / c ? (cap - SL__PIECE_PAD) / c : 1;
      }
      uint64_t n = j->elems - a < room ? j->elems - a : room;
      if (!grow((void **)&g->pieces, &cap_p, g->npieces + 1, sizeof *g->pieces)) goto nomem;
      g->pieces[g->npieces++] = (piece){ji, a, a + n};
      cur->count++;
      cur->read_bytes += SL__A16(n * sl_dtype_size(j->src->dtype));
      cur->wire_bytes += n * sl_dtype_size(j->wire);
      cur->plain &= j->src->dtype == j->wire;
      cur->landing_bytes += SL__A16(n * landing_elem(L, j));
      cur->file_bytes += n * sl_dtype_size(j->src->dtype);
      used += n * c + SL__PIECE_PAD;
      a += n;
    }
  }
  order_pieces(L, cur);
  return interleave(L);
nomem:
  return sl__fail(L->ctx, SL_ERR_NOMEM, "out of memory scheduling %zu tensors", L->njobs);
}

/* ---- allocation ---------------------------------------------------------------------------- */
/* Whether this load's reads use the slots. Rank-0 reads always do (the wire's bytes). Every-rank
 * reads use a slot only for a piece that must be cast or copied to a device
 * (loader_recv.c:read_own_run); the rest are read straight into their shards, and allocating
 * (and populating) slots for them would cost the rank its first touch of 64 MiB for nothing. */
static bool uses_slots(const loader *L) {
  if (L->o.read_mode != SL_READ_EVERY_RANK) return true;
  for (size_t i = 0; i < L->njobs; i++)
    if (!sl__reads_in_place(L, &L->jobs[i])) return true;
  return false;
}

sl_status sl__loader_stage_setup(loader *L) {
  sl_context *ctx = L->ctx;
  const sl_backend_ops *be = ctx->be;
  const loader_pipe *p = &L->pipe;
  loader_stage *g = &L->stage;
  g->nslots = L->o.pipeline_slots <= 0 ? SL__DEFAULT_SLOTS : L->o.pipeline_slots;
  /* distributed readers: a slot for each reader's read ahead, and the one in flight; in rounds
   * (sl__loader_rounds) a slot in flight for each reader of a round too, up to
   * SL_SCATTER_GROUP_MAX readers a round */
  bool rounds = sl__loader_rounds(L);
  if (L->o.pipeline_slots <= 0 && L->nreaders > 1) g->nslots = L->nreaders * (rounds ? 2 : 1) + 1;
  int most = L->o.pipeline_slots <= 0 && rounds ? SL__MAX_ROUND_SLOTS : SL__MAX_SLOTS;
  if (g->nslots > most) g->nslots = most;

  g->slot_bytes = slot_size(L);
  sl_status st = schedule(L);
  if (st != SL_OK) return st;
  size_t alloc = g->slot_bytes; /* the schedule kept the alignment slack inside it */
  /* memory only for the slots transfers will use (a small checkpoint needs one; every-rank
   * reads that land straight in their shards need none) */
  int filled = g->nxfers < (size_t)g->nslots ? (int)g->nxfers : g->nslots;
  if (!uses_slots(L)) filled = 0;

  /* The device route stages in device memory and orders it by streams and events on every
   * backend: one whose device memory is host memory (cpu) hands it host memory from its own
   * alloc_device and token streams. Host staging needs them only on a real device. */
  bool dev_part = p->device_route, ordered = p->device_route || !p->device_is_host;
  if (!p->device_is_host)
    for (size_t i = 0; i < L->njobs && !dev_part; i++)
      if (L->jobs[i].out->device == SL_DEVICE_ACCELERATOR &&
          ((L->jobs[i].wire != L->jobs[i].res.dtype && p->cast_on_device[L->jobs[i].wire][L->jobs[i].res.dtype]) ||
           (L->jobs[i].src->dtype != L->jobs[i].res.dtype &&
            p->cast_on_device[L->jobs[i].src->dtype][L->jobs[i].res.dtype])))
        dev_part = true;
  g->host_pinned = sl__has_pinned(ctx);
  if (ordered) {
    if ((st = be->stream_create(ctx->be_ctx, &g->s_copy)) != SL_OK) return st;
    if ((st = be->stream_create(ctx->be_ctx, &g->s_comm)) != SL_OK) return st;
  }
  for (int i = 0; i < filled; i++) {
    slot *s = &g->slots[i];
    if ((st = sl_alloc(ctx, SL_DEVICE_CPU, g->host_pinned, alloc, (void **)&s->host)) != SL_OK)
      return sl__fail(ctx, st, "cannot allocate %zu bytes of staging: %s", alloc, ctx->errmsg);
    L->st->stats.staging_bytes += alloc;
    if (dev_part) {
      if ((st = be->alloc_device(ctx->be_ctx, alloc, (void **)&s->dev)) != SL_OK)
        return sl__fail(ctx, st, "cannot allocate %zu bytes of device staging: %s", alloc, ctx->errmsg);
      L->st->stats.device_staging_bytes += alloc;
    }
    if (ordered) {
      if ((st = be->event_create(ctx->be_ctx, &s->ev_copy)) != SL_OK) return st;
      if ((st = be->event_create(ctx->be_ctx, &s->ev_comm)) != SL_OK) return st;
    }
  }
  return SL_OK;
}

void sl__loader_stage_drain(loader *L) {
  sl_context *ctx = L->ctx;
  /* Nothing may still run on staging that is about to be freed. What this wait reports (a
   * sticky error of the streams, reported again) is not what sl_load returns: it must not
   * replace the message of the status that is returned (a lost peer's, say), or the status
   * and the message would tell of two different failures. */
  if (L->stage.s_copy || L->stage.s_comm) {
    char keep[SL__ERRMSG_LEN];
    memcpy(keep, ctx->errmsg, sizeof keep);
    ctx->be->synchronize(ctx->be_ctx);
    memcpy(ctx->errmsg, keep, sizeof keep);
  }
}

void sl__loader_stage_release(loader *L) {
  sl_context *ctx = L->ctx;
  loader_stage *g = &L->stage;
  for (int i = 0; i < SL__MAX_ROUND_SLOTS; i++) {
    slot *s = &g->slots[i];
    if (s->host) sl_free(ctx, SL_DEVICE_CPU, g->host_pinned, s->host);
    if (s->dev) ctx->be->free_device(ctx->be_ctx, s->dev);
    if (s->ev_copy) ctx->be->event_destroy(ctx->be_ctx, s->ev_copy);
    if (s->ev_comm) ctx->be->event_destroy(ctx->be_ctx, s->ev_comm);
  }
  if (g->s_copy) ctx->be->stream_destroy(ctx->be_ctx, g->s_copy);
  if (g->s_comm) ctx->be->stream_destroy(ctx->be_ctx, g->s_comm);
  free(g->pieces);
  free(g->xfers);
}
