/* Phase 2 of sl_load: the receiving side of a transfer (docs/DESIGN.md#data-flow): where this
 * rank's part lands, and its placement into the rank's buffers (docs/DESIGN.md#placement).
 * - host route: CPU shards by memcpy/cast, device shards by an asynchronous copy up from the
 *   (pinned) slot, widening on the device where it can cast;
 * - device route: the part lands straight in its device shard when it can, or in device staging
 *   then is cast/unpacked on the device; CPU shards come down by a device-to-host copy into the
 *   slot's landing area, placed on the host once that copy's event completed (host finishes,
 *   run when the pipe retires the slot).
 * Every-rank reads are here too: no collective, each rank reads its own runs and places them.
 * A failure here is this rank's own: deferred (loader.c), never left for the others to wait on. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"

/* ---- host finishes ------------------------------------------------------------------------- */
static sl_status add_finish(loader *L, const slot *s, size_t job, size_t off, uint64_t la, uint64_t count) {
  loader_recv *v = &L->recv;
  size_t si = (size_t)(s - L->stage.slots);
  if (v->pending[si].count == 0) v->pending[si].first = v->nfinish;
  if (v->nfinish == v->cap_finish) {
    size_t c = v->cap_finish ? 2 * v->cap_finish : 256;
    host_finish *f = realloc(v->finish, c * sizeof *f);
    if (!f) return sl__fail(L->ctx, SL_ERR_NOMEM, "out of memory");
    v->finish = f;
    v->cap_finish = c;
  }
  v->finish[v->nfinish++] = (host_finish){job, off, la, count};
  v->pending[si].count++;
  return SL_OK;
}

void sl__loader_finish_host(loader *L, const slot *s) {
  sl_context *ctx = L->ctx;
  loader_recv *v = &L->recv;
  size_t si = (size_t)(s - L->stage.slots);
  for (size_t i = v->pending[si].first; i < v->pending[si].first + v->pending[si].count; i++) {
    const host_finish *f = &v->finish[i];
    const tensor_job *j = &L->jobs[f->job];
    if (L->fail.deferred != SL_OK) break;
    size_t ep = sl_dtype_size(j->res.dtype);
    unsigned char *dst = (unsigned char *)j->out->data + f->la * ep;
    if (j->wire == j->res.dtype) memcpy(dst, s->host + f->off, f->count * ep);
    else if (sl_convert(dst, j->res.dtype, s->host + f->off, j->wire, f->count) != SL_OK)
      sl__loader_defer(L, j->src->name, sl__fail(ctx, SL_ERR_DTYPE, "cannot cast %s to %s", sl_dtype_name(j->wire),
                                                  sl_dtype_name(j->res.dtype)));
  }
  v->pending[si].count = 0;
}

/* ---- placement ------------------------------------------------------------------------------ */
/* BUF (the slot's host part, or its device part when ON_DEVICE) holds COUNT elements of dtype
 * DT of job J's shard from local element LA. *LOFF advances through the slot's landing area.
 * A failure is this rank's own (the caller defers it). */
static sl_status place(loader *L, const slot *s, const carve *c, tensor_job *j, const unsigned char *buf,
                       bool on_device, sl_dtype dt, uint64_t la, uint64_t count, size_t *loff) {
  sl_context *ctx = L->ctx;
  void *s_copy = L->stage.s_copy, *s_comm = L->stage.s_comm;
  if (!count) return SL_OK;
  const size_t ep = sl_dtype_size(j->res.dtype), eb = sl_dtype_size(dt);
  unsigned char *dst = (unsigned char *)j->out->data + la * ep;
  /* the landing area, taken only by the branches that use it (the schedule reserved it for
   * exactly those pieces, loader_stage.c); callers align each piece's start */
  const size_t y = c->landing + *loff, ytake = (size_t)(count * (eb > ep ? eb : ep));
  sl_status st;
  if (!on_device && sl__shard_on_host(L, j)) {
    if (dt == j->res.dtype) memcpy(dst, buf, count * ep);
    else if ((st = sl_convert(dst, j->res.dtype, buf, dt, count)) != SL_OK) return st;
    return SL_OK;
  }
  if (!on_device) { /* host staging -> device shard, on the copy stream */
    if (dt == j->res.dtype) {
      st = ctx->be->copy_async(ctx->be_ctx, dst, buf, count * ep, SL_COPY_H2D, s_copy);
      L->st->stats.bytes_h2d += count * ep;
      return st;
    }
    *loff += ytake;
    /* cross the bus at the staging width, cast on the device */
    if (L->pipe.cast_on_device[dt][j->res.dtype] && s->dev) {
      if ((st = ctx->be->copy_async(ctx->be_ctx, s->dev + y, buf, count * eb, SL_COPY_H2D, s_copy)) != SL_OK) return st;
      L->st->stats.bytes_h2d += count * eb;
      return ctx->be->cast_async(ctx->be_ctx, dst, j->res.dtype, s->dev + y, dt, count, s_copy);
    }
    if ((st = sl_convert(s->host + y, j->res.dtype, buf, dt, count)) != SL_OK) return st;
    L->st->stats.bytes_h2d += count * ep;
    return ctx->be->copy_async(ctx->be_ctx, dst, s->host + y, count * ep, SL_COPY_H2D, s_copy);
  }
  if (!sl__shard_on_host(L, j)) { /* device staging -> device shard, on the data stream */
    if (dt == j->res.dtype) return ctx->be->copy_async(ctx->be_ctx, dst, buf, count * ep, SL_COPY_D2D, s_comm);
    return ctx->be->cast_async(ctx->be_ctx, dst, j->res.dtype, buf, dt, count, s_comm);
  }
  /* device staging -> CPU shard: down into the slot's host part, placed once the copy completed
   * (sl__loader_finish_host); never a whole tensor in device memory */
  *loff += ytake;
  if ((st = ctx->be->copy_async(ctx->be_ctx, s->host + y, buf, count * eb, SL_COPY_D2H, s_comm)) != SL_OK) return st;
  L->st->stats.bytes_d2h += count * eb;
  return add_finish(L, s, (size_t)(j - L->jobs), y, la, count);
}

static void place_or_defer(loader *L, const slot *s, const carve *c, tensor_job *j, const unsigned char *buf,
                           bool on_device, sl_dtype dt, uint64_t la, uint64_t count, size_t *loff) {
  if (L->fail.deferred != SL_OK) return; /* a failed rank places nothing more (sl_bind_fn's contract) */
  sl_status st = place(L, s, c, j, buf, on_device, dt, la, count, loff);
  if (st != SL_OK) sl__loader_defer(L, j->src->name, st);
}

/* ---- this rank's part of a transfer --------------------------------------------------------- */
/* Its bytes per piece follow one another in the receive buffer. *DIRECT is the shard address
 * when the part can land in place (one piece, shard in the staging domain, no cast, this rank
 * not failed). */
uint64_t sl__loader_my_part(loader *L, const transfer *x, unsigned char **direct) {
  uint64_t bytes = 0;
  *direct = NULL;
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &L->stage.pieces[i];
    const tensor_job *j = sl__job_of(L, p);
    sl__region mine;
    sl__job_region(j, &mine);
    uint64_t n = sl__region_rank_of(&mine, p->b) - sl__region_rank_of(&mine, p->a);
    bytes += n * sl_dtype_size(j->wire);
  }
  if (x->count == 1 && L->fail.deferred == SL_OK) {
    const piece *p = &L->stage.pieces[x->first];
    const tensor_job *j = sl__job_of(L, p);
    bool same_domain = L->pipe.device_route ? !sl__shard_on_host(L, j) : sl__shard_on_host(L, j);
    if (same_domain && j->wire == j->res.dtype) {
      sl__region mine;
      sl__job_region(j, &mine);
      *direct = (unsigned char *)j->out->data + sl__region_rank_of(&mine, p->a) * sl_dtype_size(j->res.dtype);
    }
  }
  return bytes;
}

void sl__loader_place_parts(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char *recv) {
  size_t loff = 0;
  uint64_t off = 0;
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &L->stage.pieces[i];
    tensor_job *j = &L->jobs[p->job];
    sl__region mine;
    sl__job_region(j, &mine);
    uint64_t la = sl__region_rank_of(&mine, p->a), n = sl__region_rank_of(&mine, p->b) - la;
    if (!n) continue;
    loff = (size_t)SL__A16(loff);
    place_or_defer(L, s, c, j, recv + off, L->pipe.device_route, j->wire, la, n, &loff);
    off += n * sl_dtype_size(j->wire);
  }
}

/* The broadcast baseline: every rank holds the whole transfer in BUF and keeps its parts,
 * unpacking into the packed area a part that is not one run. */
void sl__loader_place_broadcast(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char *buf) {
  const bool device = L->pipe.device_route;
  unsigned char *stage = device ? s->dev : s->host;
  size_t loff = 0;
  uint64_t poff = 0, at = 0;
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &L->stage.pieces[i];
    tensor_job *j = &L->jobs[p->job];
    size_t ew = sl_dtype_size(j->wire);
    sl__region mine;
    sl__job_region(j, &mine);
    uint64_t la = sl__region_rank_of(&mine, p->a), n = sl__region_rank_of(&mine, p->b) - la, first;
    const unsigned char *part = buf + poff;
    loff = (size_t)SL__A16(loff);
    if (n && sl__loader_single_run(&mine, p->a, p->b, &first)) {
      part = buf + poff + (first - p->a) * ew;
    } else if (n) {
      uint64_t got;
      sl_status st = sl__loader_pack(L, &mine, ew, buf + poff, p->a, p->b, stage + c->packed + at, device, &got);
      if (st != SL_OK) {
        sl__loader_defer(L, j->src->name, st);
        return;
      }
      part = stage + c->packed + at;
      at += got * ew;
    }
    place_or_defer(L, s, c, j, part, device, j->wire, la, n, &loff);
    poff += (p->b - p->a) * ew;
  }
}

/* ---- every-rank reads ----------------------------------------------------------------------- */
typedef struct own_read {
  loader *L;
  slot *s;
  const carve *c;
  tensor_job *j;
  size_t roff, loff;
  const char *failed; /* the tensor a failed coalesced read names (not always J: an earlier one) */
} own_read;

/* What the batch read whole since the last call, and the seconds its reads took: bytes_read
 * counts tensor bytes read, never the gaps read around them. */
static void count_batch(loader *L) {
  L->st->stats.bytes_read += L->recv.batch->done;
  L->st->stats.seconds_read += L->recv.batch->seconds;
  L->recv.batch->done = 0;
  L->recv.batch->seconds = 0;
}

static sl_status read_own_run(void *user, uint64_t gs, uint64_t ls, uint64_t count) {
  own_read *o = user;
  loader *L = o->L;
  tensor_job *j = o->j;
  sl__read_batch *b = L->recv.batch;
  size_t ef = sl_dtype_size(j->src->dtype), ep = sl_dtype_size(j->res.dtype);
  sl_status st;
  if (sl__reads_in_place(L, j)) {
    /* straight from storage into the shard: no staging copy; runs that follow one another in
     * the file go in one preadv, flushed when a run does not join or the transfer ends (the
     * batch times its reads: no clock per run) */
    st = sl__source_read_add(L->src, b, j->src_index, gs * ef, (unsigned char *)j->out->data + ls * ep, count * ef);
    count_batch(L);
    if (st != SL_OK) o->failed = b->failed;
    return st;
  }
  /* place() needs these bytes now: what is queued is read first, so reads stay in file order */
  st = sl__source_read_flush(L->src, b);
  count_batch(L);
  if (st != SL_OK) {
    o->failed = b->failed;
    return st;
  }
  double t0 = sl__now_s();
  unsigned char *buf = o->s->host + o->c->read + o->roff;
  st = sl__source_pread(L->src, j->src_index, gs * ef, buf, count * ef);
  L->st->stats.seconds_read += sl__now_s() - t0;
  o->roff += count * ef;
  if (st == SL_OK) L->st->stats.bytes_read += count * ef;
  /* nothing crosses the network in this mode: the cast happens here, from the file's dtype */
  if (st == SL_OK) st = place(L, o->s, o->c, j, buf, false, j->src->dtype, ls, count, &o->loff);
  return st;
}

void sl__loader_read_own(loader *L, const transfer *x, slot *s, const carve *c) {
  if (!L->recv.batch && L->fail.deferred == SL_OK && !(L->recv.batch = calloc(1, sizeof *L->recv.batch))) {
    sl__loader_defer(L, NULL,
                     sl__fail(L->ctx, SL_ERR_NOMEM, "out of memory for the every-rank read batch (%zu bytes)",
                              sizeof *L->recv.batch));
    return;
  }
  own_read o = {.L = L, .s = s, .c = c};
  for (size_t i = x->first; i < x->first + x->count && L->fail.deferred == SL_OK; i++) {
    const piece *p = &L->stage.pieces[i];
    o.j = &L->jobs[p->job];
    o.roff = (size_t)SL__A16(o.roff);
    o.loff = (size_t)SL__A16(o.loff);
    sl__region mine;
    sl__job_region(o.j, &mine);
    sl_status st = sl__region_runs(&mine, p->a, p->b, read_own_run, &o);
    if (st != SL_OK) sl__loader_defer(L, o.failed ? o.failed : o.j->src->name, st);
  }
  if (!L->recv.batch) return;
  /* the transfer's bytes are all in place when it ends; a rank that failed places nothing more */
  if (L->fail.deferred != SL_OK) {
    sl__source_read_discard(L->recv.batch);
    return;
  }
  sl_status st = sl__source_read_flush(L->src, L->recv.batch);
  count_batch(L);
  if (st != SL_OK) sl__loader_defer(L, L->recv.batch->failed, st);
}

void sl__loader_recv_release(loader *L) {
  free(L->recv.finish);
  free(L->recv.batch);
  L->recv.batch = NULL;
}
