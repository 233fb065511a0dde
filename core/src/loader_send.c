/* Phase 2 of sl_load: moving one transfer (docs/DESIGN.md#data-flow). Two routes, chosen by
 * the memory domains the data plane accepts:
 * - host route (Gloo): rank 0 reads, casts and packs in host memory, the collective moves host
 *   bytes, receivers place them: CPU shards by memcpy/cast, device shards by an asynchronous
 *   copy up from the (pinned) slot, widening on the device where it can cast;
 * - device route (NCCL, simccl): rank 0 reads into the pinned slot and copies it up on the copy
 *   stream; the data stream waits for that copy, casts and packs on the device and runs the
 *   collective; receivers land straight in their device shards when they can, or in device
 *   staging then cast/unpack on the device; CPU shards come down by a device-to-host copy
 *   into the slot, placed on the host once that copy's event completed (loader_data.c). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"

static sl_status add_finish(loader *L, slot *s, size_t job, size_t off, uint64_t la, uint64_t count) {
  if (s->pending_count == 0) s->pending_first = L->nfinish;
  if (L->nfinish == L->cap_finish) {
    size_t c = L->cap_finish ? 2 * L->cap_finish : 256;
    host_finish *f = realloc(L->finish, c * sizeof *f);
    if (!f) return sl__fail(L->ctx, SL_ERR_NOMEM, "out of memory");
    L->finish = f;
    L->cap_finish = c;
  }
  L->finish[L->nfinish++] = (host_finish){job, off, la, count};
  s->pending_count++;
  return SL_OK;
}

/* ---- device-side helpers ------------------------------------------------------------------ */
/* Packs a region's part of a piece on the device. SRC holds the piece's global elements [a, b)
 * contiguously; the region's runs go to DST one after another, equally long runs at a constant
 * stride as one 2-D copy. (In host memory sl__region_extract does it.) */
typedef struct packer {
  loader *L;
  unsigned char *dst;
  const unsigned char *src;
  uint64_t a;
  size_t es;
  void *stream;
  uint64_t done;              /* elements written */
  uint64_t row0, prev, len, stride, rows; /* the pending batch of runs */
} packer;

static sl_status flush_rows(packer *k) {
  sl_context *ctx = k->L->ctx;
  if (!k->rows) return SL_OK;
  unsigned char *dst = k->dst + k->done * k->es;
  const unsigned char *src = k->src + (k->row0 - k->a) * k->es;
  size_t width = (size_t)(k->len * k->es);
  sl_status st = SL_OK;
  if (k->rows > 1 && k->L->can_2d) {
    st = ctx->be->copy_2d_async(ctx->be_ctx, dst, width, src, (size_t)(k->stride * k->es), width, (size_t)k->rows,
                                SL_COPY_D2D, k->stream);
  } else {
    for (uint64_t r = 0; r < k->rows && st == SL_OK; r++)
      st = ctx->be->copy_async(ctx->be_ctx, dst + r * width, src + r * k->stride * k->es, width, SL_COPY_D2D, k->stream);
  }
  k->done += k->rows * k->len;
  k->rows = 0;
  return st;
}

static sl_status pack_run(void *user, uint64_t gs, uint64_t ls, uint64_t count) {
  packer *k = user;
  if (k->rows && count == k->len && (k->rows == 1 || gs - k->prev == k->stride)) {
    if (k->rows == 1) k->stride = gs - k->prev;
    k->prev = gs;
    k->rows++;
    return SL_OK;
  }
  sl_status st = flush_rows(k);
  k->row0 = k->prev = gs;
  k->len = count;
  k->rows = 1;
  k->stride = 0;
  return st;
}

/* Region R's elements of [a, b) from SRC (the piece's data) to DST; returns the count. */
static sl_status pack(loader *L, const sl__region *r, size_t es, const unsigned char *src, uint64_t a, uint64_t b,
                      unsigned char *dst, bool device, uint64_t *count) {
  if (!device) {
    *count = sl__region_extract(r, es, src, a, b, dst);
    return SL_OK;
  }
  packer k = {.L = L, .dst = dst, .src = src, .a = a, .es = es, .stream = L->s_comm};
  sl_status st = sl__region_runs(r, a, b, pack_run, &k);
  if (st == SL_OK) st = flush_rows(&k);
  *count = k.done;
  return st;
}

/* ---- placement ------------------------------------------------------------------------------ */
/* BUF (the slot's host part, or its device part when ON_DEVICE) holds COUNT elements of dtype
 * DT of job J's shard from local element LA. *YOFF advances through the slot's Y area. A
 * failure is this rank's own (the caller defers it). */
static sl_status place(loader *L, slot *s, const carve *c, tensor_job *j, const unsigned char *buf, bool on_device,
                       sl_dtype dt, uint64_t la, uint64_t count, size_t *yoff) {
  sl_context *ctx = L->ctx;
  if (!count) return SL_OK;
  const size_t ep = sl_dtype_size(j->res.dtype), eb = sl_dtype_size(dt);
  unsigned char *dst = (unsigned char *)j->out->data + la * ep;
  /* the Y area, taken only by the branches that use it (the schedule reserved it for exactly
   * those pieces, loader_xfer.c); callers align each piece's start */
  const size_t y = c->Y + *yoff, ytake = (size_t)(count * (eb > ep ? eb : ep));
  sl_status st;
  if (!on_device && sl__shard_on_host(L, j)) {
    if (dt == j->res.dtype) memcpy(dst, buf, count * ep);
    else if ((st = sl_convert(dst, j->res.dtype, buf, dt, count)) != SL_OK) return st;
    return SL_OK;
  }
  if (!on_device) { /* host staging -> device shard, on the copy stream */
    if (dt == j->res.dtype) {
      st = ctx->be->copy_async(ctx->be_ctx, dst, buf, count * ep, SL_COPY_H2D, L->s_copy);
      L->st->stats.bytes_h2d += count * ep;
      return st;
    }
    *yoff += ytake;
    if (L->cast_on_device[dt][j->res.dtype] && s->dev) { /* cross the bus at the staging width, cast on the device */
      if ((st = ctx->be->copy_async(ctx->be_ctx, s->dev + y, buf, count * eb, SL_COPY_H2D, L->s_copy)) != SL_OK)
        return st;
      L->st->stats.bytes_h2d += count * eb;
      return ctx->be->cast_async(ctx->be_ctx, dst, j->res.dtype, s->dev + y, dt, count, L->s_copy);
    }
    if ((st = sl_convert(s->host + y, j->res.dtype, buf, dt, count)) != SL_OK) return st;
    L->st->stats.bytes_h2d += count * ep;
    return ctx->be->copy_async(ctx->be_ctx, dst, s->host + y, count * ep, SL_COPY_H2D, L->s_copy);
  }
  if (!sl__shard_on_host(L, j)) { /* device staging -> device shard, on the data stream */
    if (dt == j->res.dtype) return ctx->be->copy_async(ctx->be_ctx, dst, buf, count * ep, SL_COPY_D2D, L->s_comm);
    return ctx->be->cast_async(ctx->be_ctx, dst, j->res.dtype, buf, dt, count, L->s_comm);
  }
  /* device staging -> CPU shard: down into the slot's host part, placed once the copy completed
   * (retire_slot); never a whole tensor in device memory */
  *yoff += ytake;
  if ((st = ctx->be->copy_async(ctx->be_ctx, s->host + y, buf, count * eb, SL_COPY_D2H, L->s_comm)) != SL_OK) return st;
  L->st->stats.bytes_d2h += count * eb;
  return add_finish(L, s, (size_t)(j - L->jobs), y, la, count);
}

static void place_or_defer(loader *L, slot *s, const carve *c, tensor_job *j, const unsigned char *buf,
                           bool on_device, sl_dtype dt, uint64_t la, uint64_t count, size_t *yoff) {
  if (L->deferred != SL_OK) return; /* a failed rank places nothing more (sl_bind_fn's contract) */
  sl_status st = place(L, s, c, j, buf, on_device, dt, la, count, yoff);
  if (st != SL_OK) sl__loader_defer(L, j->src->name, st);
}

/* ---- rank 0: the wire bytes of a transfer ------------------------------------------------ */
/* The transfer's pieces in the wire dtype, contiguous, in the staging domain of the route. */
static sl_status root_wire(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char **S) {
  sl_context *ctx = L->ctx;
  const bool convert = !x->plain;
  bool host_cast = convert && (!L->device_route || !L->can_cast_device);
  if (host_cast) { /* narrowing on the host: pieces that need no cast are copied beside the rest */
    size_t ro = 0, wo = 0;
    for (size_t i = x->first; i < x->first + x->count; i++) {
      const piece *p = &L->pieces[i];
      const tensor_job *j = sl__job_of(L, p);
      uint64_t n = p->b - p->a;
      sl_status st = j->src->dtype == j->wire ? (memcpy(s->host + c->W + wo, s->host + c->R + ro, n * sl_dtype_size(j->wire)), SL_OK)
                                              : sl_convert(s->host + c->W + wo, j->wire, s->host + c->R + ro, j->src->dtype, n);
      if (st != SL_OK) return sl__fail(ctx, st, "%s: cannot cast %s to %s", j->src->name, sl_dtype_name(j->src->dtype),
                                       sl_dtype_name(j->wire));
      ro += SL__A16(n * sl_dtype_size(j->src->dtype));
      wo += n * sl_dtype_size(j->wire);
    }
  }
  if (!L->device_route) {
    *S = s->host + (convert ? c->W : c->R);
    return SL_OK;
  }
  /* device route: up on the copy stream; the data stream waits for it */
  size_t off = host_cast ? c->W : c->R;
  uint64_t bytes = host_cast || x->plain ? x->wire_bytes : x->read_bytes;
  sl_status st = ctx->be->copy_async(ctx->be_ctx, s->dev + off, s->host + off, bytes, SL_COPY_H2D, L->s_copy);
  if (st != SL_OK) return st;
  L->st->stats.bytes_h2d += bytes;
  if (SL__KEEP(3) && (st = ctx->be->event_record(ctx->be_ctx, s->ev_copy, L->s_copy)) != SL_OK) return st;
  if (SL__KEEP(4) && (st = ctx->be->stream_wait_event(ctx->be_ctx, L->s_comm, s->ev_copy)) != SL_OK) return st;
  if (!convert || host_cast) {
    *S = s->dev + off;
    return SL_OK;
  }
  size_t ro = 0, wo = 0;
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &L->pieces[i];
    const tensor_job *j = sl__job_of(L, p);
    uint64_t n = p->b - p->a;
    if (j->src->dtype == j->wire)
      st = ctx->be->copy_async(ctx->be_ctx, s->dev + c->W + wo, s->dev + c->R + ro, n * sl_dtype_size(j->wire),
                               SL_COPY_D2D, L->s_comm);
    else
      st = ctx->be->cast_async(ctx->be_ctx, s->dev + c->W + wo, j->wire, s->dev + c->R + ro, j->src->dtype, n, L->s_comm);
    if (st != SL_OK) return st;
    ro += SL__A16(n * sl_dtype_size(j->src->dtype));
    wo += n * sl_dtype_size(j->wire);
  }
  *S = s->dev + c->W;
  return SL_OK;
}

/* ---- one transfer -------------------------------------------------------------------------- */
/* Ranks that hold the same region of every piece of a transfer share packed bytes: those whose
 * coordinates agree on every sharded mesh dim (pieces of one transfer share one class). The
 * key of a rank is its coordinate over the sharded dims; linear in the number of ranks. */
static void compute_groups(loader *L, const tensor_job *j, int nranks) {
  for (int k = 0; k < L->world; k++) L->group_of_key[k] = -1;
  for (int r = 0; r < nranks; r++) {
    int coord[SL_MAX_MESH_DIMS], key = 0;
    sl__mesh_coord(r, L->mesh_ndim, L->mesh, coord);
    for (int m = 0; m < L->mesh_ndim; m++)
      if (j->res.placements[m].kind == SL_SHARD) key = key * L->mesh[m] + coord[m];
    if (L->group_of_key[key] < 0) L->group_of_key[key] = r;
    L->group[r] = L->group_of_key[key];
  }
}

typedef struct run_probe {
  uint64_t first_g, runs;
} run_probe;

static sl_status probe_run(void *user, uint64_t gs, uint64_t ls, uint64_t count) {
  run_probe *p = user;
  if (p->runs++ == 0) p->first_g = gs;
  return p->runs > 1 ? SL_ERR_UNSUPPORTED : SL_OK; /* stop early: two runs mean "pack" */
}

/* Whether region R's part of [a, b) is one contiguous run, and where it starts. */
static bool single_run(const sl__region *r, uint64_t a, uint64_t b, uint64_t *first) {
  run_probe p = {0, 0};
  sl__region_runs(r, a, b, probe_run, &p);
  *first = p.runs ? p.first_g : a;
  return p.runs <= 1;
}

static void region_of_rank(loader *L, const tensor_job *j, int r, sl__region *out) {
  int coord[SL_MAX_MESH_DIMS];
  sl__mesh_coord(r, L->mesh_ndim, L->mesh, coord);
  /* cannot fail: the same computation succeeded for every rank's own region in phase 1 */
  sl__region_compute(j->src->shape, j->src->ndim, L->mesh_ndim, L->mesh, j->res.placements, coord, out);
}

/* Rank 0: counts and displacements of the scatter to ranks [0, NRANKS) (every rank, or
 * replica 0's under HSDP). A rank's bytes are its parts of the pieces one after another (the
 * layout my_part gives; aligned because pieces are ordered by element size). When every part
 * already lies in S at exactly that layout they are sent from there; otherwise every distinct
 * part is packed once into P (the staging domain's pack area, each rank's block at a multiple
 * of 16). */
static sl_status root_layout(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char *S, int nranks,
                             const unsigned char **sendbuf) {
  compute_groups(L, sl__job_of(L, &L->pieces[x->first]), nranks);
  bool pack_all = false;
  sl_status pst = SL_OK;
  for (int r = 0; r < nranks; r++) {
    L->counts[r] = 0;
    L->displs[r] = 0;
    L->part_off[r] = UINT64_MAX;
  }
  uint64_t poff = 0; /* the piece's offset in S */
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &L->pieces[i];
    const tensor_job *j = sl__job_of(L, p);
    size_t ew = sl_dtype_size(j->wire);
    for (int r = 0; r < nranks; r++) {
      if (L->group[r] != r) continue;
      sl__region *g = &L->regions[r];
      region_of_rank(L, j, r, g);
      uint64_t n = sl__region_rank_of(g, p->b) - sl__region_rank_of(g, p->a), first;
      if (!n) continue;
      uint64_t o = L->counts[r]; /* where this part goes in the rank's layout */
      if (!single_run(g, p->a, p->b, &first)) {
        pack_all = true;
      } else {
        uint64_t at = poff + (first - p->a) * ew;
        if (L->part_off[r] == UINT64_MAX && o == 0) L->part_off[r] = at;
        else if (L->part_off[r] == UINT64_MAX || at != L->part_off[r] + o) pack_all = true;
      }
      L->counts[r] = (size_t)(o + n * ew);
    }
    poff += (p->b - p->a) * ew;
  }
  if (!pack_all) {
    for (int r = 0; r < nranks; r++)
      if (L->group[r] == r && L->counts[r]) L->displs[r] = (size_t)L->part_off[r];
    *sendbuf = S;
  } else {
    unsigned char *P = (L->device_route ? s->dev : s->host) + c->P;
    size_t off = 0;
    for (int r = 0; r < nranks; r++) {
      if (L->group[r] != r) continue;
      off = (size_t)SL__A16(off);
      L->displs[r] = off;
      uint64_t at = 0;
      poff = 0;
      for (size_t i = x->first; i < x->first + x->count; i++) {
        const piece *p = &L->pieces[i];
        const tensor_job *j = sl__job_of(L, p);
        size_t ew = sl_dtype_size(j->wire);
        uint64_t n = 0;
        region_of_rank(L, j, r, &L->regions[r]);
        if (sl__region_rank_of(&L->regions[r], p->b) > sl__region_rank_of(&L->regions[r], p->a)) {
          sl_status st = pack(L, &L->regions[r], ew, S + poff, p->a, p->b, P + off + at, L->device_route, &n);
          if (st != SL_OK && pst == SL_OK) pst = st; /* the layout is still completed: rank 0 takes part */
          at += n * ew;
        }
        poff += (p->b - p->a) * ew;
      }
      off += L->counts[r];
    }
    *sendbuf = P;
  }
  for (int r = 0; r < nranks; r++) {
    L->counts[r] = L->counts[L->group[r]];
    L->displs[r] = L->displs[L->group[r]];
  }
  return pst;
}

/* This rank's part of a transfer: its bytes per piece follow one another in the receive
 * buffer. Fills *BYTES; *DIRECT is the shard address when the part can land in place (one
 * piece, shard in the staging domain, no cast, this rank not failed). */
static uint64_t my_part(loader *L, const transfer *x, unsigned char **direct) {
  uint64_t bytes = 0;
  *direct = NULL;
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &L->pieces[i];
    const tensor_job *j = sl__job_of(L, p);
    uint64_t n = sl__region_rank_of(&j->mine, p->b) - sl__region_rank_of(&j->mine, p->a);
    bytes += n * sl_dtype_size(j->wire);
  }
  if (x->count == 1 && L->deferred == SL_OK) {
    const piece *p = &L->pieces[x->first];
    const tensor_job *j = sl__job_of(L, p);
    bool same_domain = L->device_route ? !sl__shard_on_host(L, j) : sl__shard_on_host(L, j);
    if (same_domain && j->wire == j->res.dtype)
      *direct = (unsigned char *)j->out->data + sl__region_rank_of(&j->mine, p->a) * sl_dtype_size(j->res.dtype);
  }
  return bytes;
}

/* Places this rank's parts of the pieces from RECV (laid out as my_part says). */
static void place_parts(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char *recv) {
  size_t yoff = 0;
  uint64_t off = 0;
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &L->pieces[i];
    tensor_job *j = &L->jobs[p->job];
    uint64_t la = sl__region_rank_of(&j->mine, p->a), n = sl__region_rank_of(&j->mine, p->b) - la;
    if (!n) continue;
    yoff = (size_t)SL__A16(yoff);
    place_or_defer(L, s, c, j, recv + off, L->device_route, j->wire, la, n, &yoff);
    off += n * sl_dtype_size(j->wire);
  }
}

/* Rank 0's own failure in phase 2: the first one is what the status window tells every rank;
 * rank 0 places nothing more from here on. */
void sl__loader_root_failed(loader *L, sl_status st, const char *msg) {
  if (L->root_st != SL_OK) return;
  L->root_st = st;
  snprintf(L->root_msg, sizeof L->root_msg, "%s", msg);
  sl__fail(L->ctx, st, "%s", L->root_msg);
  sl__loader_defer(L, NULL, st);
}

/* The collective's completion rule (module.h): a synchronous collective reads and writes device
 * buffers when it is called, so on the device route the data stream's earlier work (the copy
 * up, casts, packs) must be done first; a stream-ordered collective on the host route has not
 * filled the host buffer when it returns, so the stream must be done before the host reads it. */
static sl_status before_data_op(loader *L) {
  sl_context *ctx = L->ctx;
  if (L->device_route && (ctx->data->flags & SL_COLL_SYNC)) return ctx->be->stream_sync(ctx->be_ctx, L->s_comm);
  return SL_OK;
}

static sl_status after_data_op(loader *L) {
  sl_context *ctx = L->ctx;
  if (!L->device_route && !(ctx->data->flags & SL_COLL_SYNC)) return ctx->be->stream_sync(ctx->be_ctx, L->s_comm);
  return SL_OK;
}

/* HSDP sub-communicators: replica 0 (where rank 0 scatters) and the chain links between
 * neighbouring replicas (r even: link a, r odd: link b). */
static void *link_comm(loader *L, int lower_replica) { return lower_replica % 2 == 0 ? L->g_pair_a : L->g_pair_b; }

static sl_status scatter_transfer(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char *S) {
  sl_context *ctx = L->ctx;
  bool hsdp = x->hsdp && L->hsdp_ready;
  unsigned char *direct, *stage = L->device_route ? s->dev : s->host;
  uint64_t mine = my_part(L, x, &direct);
  unsigned char *recv = direct ? direct : stage + c->V;
  sl_status st = before_data_op(L);
  if (st != SL_OK) return st;
  if (!hsdp || L->my_replica == 0) {
    int nranks = hsdp ? L->shard_ranks : L->world;
    const unsigned char *sendbuf = NULL;
    if (L->rank == 0 && (st = root_layout(L, x, s, c, S, nranks, &sendbuf)) != SL_OK) {
      sl__loader_root_failed(L, st, L->ctx->errmsg); /* a pack that could not be enqueued: still take part */
      if (!sendbuf) sendbuf = S;
    }
    void *comm = hsdp ? L->g_shard0 : ctx->data_comm;
    st = ctx->data->scatterv(comm, sendbuf, L->counts, L->displs, recv, (size_t)mine, 0, L->s_comm);
    if (st != SL_OK) return st; /* the data plane failed: the job did (the others see it or lose this rank) */
    L->st->stats.transfers++;
    if (L->rank == 0)
      for (int r = 1; r < nranks; r++) L->st->stats.bytes_sent += L->counts[r];
    else
      L->st->stats.bytes_received += mine;
  }
  if (hsdp) {
    /* the chain: every replica passes its part on to the next, so rank 0 sends its own part
     * once whatever the number of replicas (docs/DESIGN.md#data-flow) */
    if (L->my_replica > 0) {
      st = ctx->data->broadcast(link_comm(L, L->my_replica - 1), recv, (size_t)mine, 0, L->s_comm);
      if (st != SL_OK) return st;
      L->st->stats.transfers++;
      L->st->stats.bytes_received += mine;
    }
    if (L->my_replica < L->replicas - 1) {
      st = ctx->data->broadcast(link_comm(L, L->my_replica), recv, (size_t)mine, 0, L->s_comm);
      if (st != SL_OK) return st;
      L->st->stats.transfers++;
      L->st->stats.bytes_sent += mine;
    }
  }
  if ((st = after_data_op(L)) != SL_OK) return st;
  if (!direct) place_parts(L, x, s, c, recv);
  return SL_OK;
}

/* Accelerate's algorithm, kept as the baseline: every rank receives the whole transfer and
 * keeps its parts. */
static sl_status broadcast_transfer(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char *S) {
  sl_context *ctx = L->ctx;
  unsigned char *stage = L->device_route ? s->dev : s->host;
  unsigned char *buf = L->rank == 0 ? (unsigned char *)S : stage + c->V;
  sl_status st = before_data_op(L);
  if (st == SL_OK) st = ctx->data->broadcast(ctx->data_comm, buf, (size_t)x->wire_bytes, 0, L->s_comm);
  if (st == SL_OK) st = after_data_op(L);
  if (st != SL_OK) return st;
  L->st->stats.transfers++;
  if (L->rank == 0) L->st->stats.bytes_sent += x->wire_bytes * (uint64_t)(L->world - 1);
  else L->st->stats.bytes_received += x->wire_bytes;
  size_t yoff = 0;
  uint64_t poff = 0, at = 0;
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &L->pieces[i];
    tensor_job *j = &L->jobs[p->job];
    size_t ew = sl_dtype_size(j->wire);
    uint64_t la = sl__region_rank_of(&j->mine, p->a), n = sl__region_rank_of(&j->mine, p->b) - la, first;
    const unsigned char *part = buf + poff;
    yoff = (size_t)SL__A16(yoff);
    if (n && single_run(&j->mine, p->a, p->b, &first)) {
      part = buf + poff + (first - p->a) * ew;
    } else if (n) {
      uint64_t got;
      if ((st = pack(L, &j->mine, ew, buf + poff, p->a, p->b, stage + c->P + at, L->device_route, &got)) != SL_OK) {
        sl__loader_defer(L, j->src->name, st);
        return SL_OK;
      }
      part = stage + c->P + at;
      at += got * ew;
    }
    place_or_defer(L, s, c, j, part, L->device_route, j->wire, la, n, &yoff);
    poff += (p->b - p->a) * ew;
  }
  return SL_OK;
}

/* Every-rank reads: no collective; each rank reads its own runs and places them. */
typedef struct own_read {
  loader *L;
  slot *s;
  const carve *c;
  tensor_job *j;
  size_t roff, yoff;
} own_read;

static sl_status read_own_run(void *user, uint64_t gs, uint64_t ls, uint64_t count) {
  own_read *o = user;
  loader *L = o->L;
  tensor_job *j = o->j;
  size_t ef = sl_dtype_size(j->src->dtype), ep = sl_dtype_size(j->res.dtype);
  double t0 = sl__now_s();
  sl_status st;
  if (sl__shard_on_host(L, j) && j->src->dtype == j->res.dtype) {
    /* straight from storage into the shard: no staging copy */
    st = sl__source_pread(L->src, j->src_index, gs * ef, (unsigned char *)j->out->data + ls * ep, count * ef);
    L->st->stats.seconds_read += sl__now_s() - t0;
  } else {
    unsigned char *buf = o->s->host + o->c->R + o->roff;
    st = sl__source_pread(L->src, j->src_index, gs * ef, buf, count * ef);
    L->st->stats.seconds_read += sl__now_s() - t0;
    o->roff += count * ef;
    /* nothing crosses the network in this mode: the cast happens here, from the file's dtype */
    if (st == SL_OK) st = place(L, o->s, o->c, j, buf, false, j->src->dtype, ls, count, &o->yoff);
  }
  if (st == SL_OK) L->st->stats.bytes_read += count * ef;
  return st;
}

static void every_rank_transfer(loader *L, const transfer *x, slot *s) {
  /* read area R, then the Y area right after it (the wire areas are unused in this mode) */
  carve c = {.R = 0, .Y = sl__align64(x->read_bytes)};
  own_read o = {.L = L, .s = s, .c = &c};
  for (size_t i = x->first; i < x->first + x->count && L->deferred == SL_OK; i++) {
    const piece *p = &L->pieces[i];
    o.j = &L->jobs[p->job];
    o.roff = (size_t)SL__A16(o.roff);
    o.yoff = (size_t)SL__A16(o.yoff);
    sl_status st = sl__region_runs(&o.j->mine, p->a, p->b, read_own_run, &o);
    if (st != SL_OK) sl__loader_defer(L, o.j->src->name, st);
  }
}

sl_status sl__loader_run_transfer(loader *L, size_t k, slot *s) {
  const transfer *x = &L->xfers[k];
  carve c = sl__carve_of(x, L->world);
  if (L->o.read_mode == SL_READ_EVERY_RANK) {
    every_rank_transfer(L, x, s);
    return SL_OK;
  }
  const unsigned char *S = NULL;
  if (L->rank == 0) {
    if (s->read_st != SL_OK) {
      /* the window's verdict fails every rank; until then the transfer goes out as zeros, and
       * rank 0 itself places nothing more */
      if (L->deferred != SL_OK) sl__loader_root_failed(L, L->deferred, L->deferred_msg); /* why the reader stopped */
      else sl__loader_root_failed(L, s->read_st, s->read_msg);
      memset(s->host, 0, sl__carve_of(x, L->world).Y);
      s->direct = false;
    }
    L->st->stats.bytes_read += x->file_bytes;
    if (s->direct) return SL_OK; /* world 1, read in place: nothing else to do */
    sl_status st = root_wire(L, x, s, &c, &S);
    if (st != SL_OK) {
      /* a local failure of rank 0 before sending: it still takes part (the others must not be
       * left waiting in this transfer), sending bytes that are not the checkpoint's (zeros,
       * or on the device route whatever its staging holds), and the window says why */
      sl__loader_root_failed(L, st, L->ctx->errmsg);
      memset(s->host, 0, sl__carve_of(x, L->world).Y);
      S = (L->device_route ? s->dev : s->host) + c.R;
    }
  }
  return L->o.strategy == SL_STRATEGY_BROADCAST ? broadcast_transfer(L, x, s, &c, S) : scatter_transfer(L, x, s, &c, S);
}

