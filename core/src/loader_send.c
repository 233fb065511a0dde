/* Phase 2 of sl_load: the sending side of a transfer (docs/DESIGN.md#data-flow). Its root (rank
 * 0, or the transfer's distributed reader: docs/DESIGN.md#readers) reads it from storage (on
 * the reader thread), casts it to the wire dtype and packs each rank's part; every rank then
 * takes part in the collective that moves it: the scatter (HSDP: within the root's replica,
 * then along the replica chain) or the baseline's broadcast. Two routes, chosen by the memory
 * domains the data plane accepts:
 * - host route (Gloo): the root reads, casts and packs in host memory, the collective moves
 *   host bytes;
 * - device route (NCCL, simccl): the root reads into the pinned slot and copies it up on the
 *   copy stream; the data stream waits for that copy, casts and packs on the device and runs
 *   the collective.
 * Where the received bytes go from there is loader_recv.c's. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"

/* ---- packing ------------------------------------------------------------------------------ */
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
  if (k->rows > 1 && k->L->pipe.can_2d) {
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

sl_status sl__loader_pack(loader *L, const sl__region *r, size_t es, const unsigned char *src, uint64_t a, uint64_t b,
                          unsigned char *dst, bool device, uint64_t *count) {
  if (!device) {
    *count = sl__region_extract(r, es, src, a, b, dst);
    return SL_OK;
  }
  packer k = {.L = L, .dst = dst, .src = src, .a = a, .es = es, .stream = L->stage.s_comm};
  sl_status st = sl__region_runs(r, a, b, pack_run, &k);
  if (st == SL_OK) st = flush_rows(&k);
  *count = k.done;
  return st;
}

typedef struct run_probe {
  uint64_t first_g, runs;
} run_probe;

static sl_status probe_run(void *user, uint64_t gs, uint64_t ls, uint64_t count) {
  run_probe *p = user;
  if (p->runs++ == 0) p->first_g = gs;
  return p->runs > 1 ? SL_ERR_UNSUPPORTED : SL_OK; /* stop early: two runs mean "pack" */
}

bool sl__loader_single_run(const sl__region *r, uint64_t a, uint64_t b, uint64_t *first) {
  run_probe p = {0, 0};
  sl__region_runs(r, a, b, probe_run, &p);
  *first = p.runs ? p.first_g : a;
  return p.runs <= 1;
}

/* ---- rank 0: the read ----------------------------------------------------------------------- */
/* World 1 on the host route: a single-piece transfer whose shard is host memory of the file's
 * dtype is read straight into the shard. */
static unsigned char *solo_target(const loader *L, const transfer *x) {
  if (L->world != 1 || L->pipe.device_route || x->count != 1) return NULL;
  const piece *p = &L->stage.pieces[x->first];
  const tensor_job *j = sl__job_of(L, p);
  if (!sl__shard_on_host(L, j) || j->src->dtype != j->res.dtype) return NULL;
  return (unsigned char *)j->out->data + p->a * sl_dtype_size(j->res.dtype);
}

sl_status sl__loader_root_read(loader *L, const transfer *x, slot *s, bool *direct) {
  unsigned char *into = solo_target(L, x);
  *direct = into != NULL;
  unsigned char *dst = into ? into : s->host;
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &L->stage.pieces[i];
    const tensor_job *j = sl__job_of(L, p);
    size_t ef = sl_dtype_size(j->src->dtype);
    sl_status st = sl__source_pread(L->src, j->src_index, p->a * ef, dst, (p->b - p->a) * ef);
    if (st != SL_OK) return st;
    dst += x->plain ? (p->b - p->a) * ef : SL__A16((p->b - p->a) * ef);
  }
  return SL_OK;
}

/* ---- rank 0: the wire bytes of a transfer ------------------------------------------------ */
/* The transfer's pieces in the wire dtype, contiguous, in the staging domain of the route. */
static sl_status cast_to_wire(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char **S) {
  sl_context *ctx = L->ctx;
  const loader_pipe *pp = &L->pipe;
  const loader_stage *g = &L->stage;
  const bool convert = !x->plain;
  bool host_cast = convert && (!pp->device_route || !pp->can_cast_device);
  if (host_cast) { /* narrowing on the host: pieces that need no cast are copied beside the rest */
    size_t ro = 0, wo = 0;
    for (size_t i = x->first; i < x->first + x->count; i++) {
      const piece *p = &g->pieces[i];
      const tensor_job *j = sl__job_of(L, p);
      uint64_t n = p->b - p->a;
      sl_status st = j->src->dtype == j->wire
                         ? (memcpy(s->host + c->wire + wo, s->host + c->read + ro, n * sl_dtype_size(j->wire)), SL_OK)
                         : sl_convert(s->host + c->wire + wo, j->wire, s->host + c->read + ro, j->src->dtype, n);
      if (st != SL_OK) return sl__fail(ctx, st, "%s: cannot cast %s to %s", j->src->name, sl_dtype_name(j->src->dtype),
                                       sl_dtype_name(j->wire));
      ro += SL__A16(n * sl_dtype_size(j->src->dtype));
      wo += n * sl_dtype_size(j->wire);
    }
  }
  if (!pp->device_route) {
    *S = s->host + (convert ? c->wire : c->read);
    return SL_OK;
  }
  /* device route: up on the copy stream; the data stream waits for it */
  size_t off = host_cast ? c->wire : c->read;
  uint64_t bytes = host_cast || x->plain ? x->wire_bytes : x->read_bytes;
  sl_status st = ctx->be->copy_async(ctx->be_ctx, s->dev + off, s->host + off, bytes, SL_COPY_H2D, g->s_copy);
  if (st != SL_OK) return st;
  L->st->stats.bytes_h2d += bytes;
  if (SL__KEEP(3) && (st = ctx->be->event_record(ctx->be_ctx, s->ev_copy, g->s_copy)) != SL_OK) return st;
  if (SL__KEEP(4) && (st = ctx->be->stream_wait_event(ctx->be_ctx, g->s_comm, s->ev_copy)) != SL_OK) return st;
  if (!convert || host_cast) {
    *S = s->dev + off;
    return SL_OK;
  }
  size_t ro = 0, wo = 0;
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &g->pieces[i];
    const tensor_job *j = sl__job_of(L, p);
    uint64_t n = p->b - p->a;
    if (j->src->dtype == j->wire)
      st = ctx->be->copy_async(ctx->be_ctx, s->dev + c->wire + wo, s->dev + c->read + ro, n * sl_dtype_size(j->wire),
                               SL_COPY_D2D, g->s_comm);
    else
      st = ctx->be->cast_async(ctx->be_ctx, s->dev + c->wire + wo, j->wire, s->dev + c->read + ro, j->src->dtype, n,
                               g->s_comm);
    if (st != SL_OK) return st;
    ro += SL__A16(n * sl_dtype_size(j->src->dtype));
    wo += n * sl_dtype_size(j->wire);
  }
  *S = s->dev + c->wire;
  return SL_OK;
}

bool sl__loader_root_wire(loader *L, const transfer *x, slot *s, const carve *c, const slot_read *rd,
                          const unsigned char **S) {
  bool direct = rd->direct;
  if (rd->st != SL_OK) {
    /* the window's verdict fails every rank; until then the transfer goes out as zeros, and
     * rank 0 itself places nothing more */
    const loader_fail *f = &L->fail;
    if (f->deferred != SL_OK) sl__loader_root_failed(L, f->deferred, f->deferred_msg); /* why the reader stopped */
    else if (L->nreaders > 1) { /* the status window names this rank; say what it failed at */
      char why[SL__ERRMSG_LEN];
      snprintf(why, sizeof why, "a distributed reader could not read its share of the checkpoint: %s", rd->msg);
      sl__loader_root_failed(L, rd->st, why);
    } else sl__loader_root_failed(L, rd->st, rd->msg);
    memset(s->host, 0, c->landing);
    direct = false;
  }
  L->st->stats.bytes_read += x->file_bytes;
  if (direct) return true; /* world 1, read in place: nothing else to do */
  sl_status st = cast_to_wire(L, x, s, c, S);
  if (st != SL_OK) {
    /* a local failure of rank 0 before sending: it still takes part (the others must not be
     * left waiting in this transfer), sending bytes that are not the checkpoint's (zeros,
     * or on the device route whatever its staging holds), and the window says why */
    sl__loader_root_failed(L, st, L->ctx->errmsg);
    memset(s->host, 0, c->landing);
    *S = (L->pipe.device_route ? s->dev : s->host) + c->read;
  }
  return false;
}

/* ---- rank 0: the scatter's layout ----------------------------------------------------------- */
/* Ranks that hold the same region of every piece of a transfer share packed bytes: those whose
 * coordinates agree on every sharded mesh dim (pieces of one transfer share one class). The
 * key of a rank is its coordinate over the sharded dims; linear in the number of ranks. */
static void compute_groups(loader *L, const tensor_job *j, int nranks) {
  loader_send *d = &L->send;
  for (int k = 0; k < L->world; k++) d->group_of_key[k] = -1;
  for (int r = 0; r < nranks; r++) {
    int coord[SL_MAX_MESH_DIMS], key = 0;
    sl__mesh_coord(r, L->mesh_ndim, L->mesh, coord);
    for (int m = 0; m < L->mesh_ndim; m++)
      if (j->res.placements[m].kind == SL_SHARD) key = key * L->mesh[m] + coord[m];
    if (d->group_of_key[key] < 0) d->group_of_key[key] = r;
    d->group[r] = d->group_of_key[key];
  }
}

static void region_of_rank(loader *L, const tensor_job *j, int r, sl__region *out) {
  int coord[SL_MAX_MESH_DIMS];
  sl__mesh_coord(r, L->mesh_ndim, L->mesh, coord);
  /* cannot fail: the same computation succeeded for every rank's own region in phase 1 */
  sl__region_compute(j->src->shape, j->src->ndim, L->mesh_ndim, L->mesh, j->res.placements, coord, out);
}

/* The root: counts and displacements of the scatter to ranks [0, NRANKS) (every rank, or
 * replica 0's under HSDP). A rank's bytes are its parts of the pieces one after another (the
 * layout sl__loader_my_part gives; aligned because pieces are ordered by element size). When
 * every part already lies in S at exactly that layout they are sent from there; otherwise
 * every distinct part is packed once into the packed area (of the staging domain, each rank's
 * block at a multiple of 16). */
static sl_status root_layout(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char *S, int nranks,
                             const unsigned char **sendbuf) {
  loader_send *d = &L->send;
  const bool device = L->pipe.device_route;
  compute_groups(L, sl__job_of(L, &L->stage.pieces[x->first]), nranks);
  bool pack_all = false;
  sl_status pst = SL_OK;
  for (int r = 0; r < nranks; r++) {
    d->counts[r] = 0;
    d->displs[r] = 0;
    d->part_off[r] = UINT64_MAX;
  }
  uint64_t poff = 0; /* the piece's offset in S */
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &L->stage.pieces[i];
    const tensor_job *j = sl__job_of(L, p);
    size_t ew = sl_dtype_size(j->wire);
    for (int r = 0; r < nranks; r++) {
      if (d->group[r] != r) continue;
      sl__region *g = &d->regions[r];
      region_of_rank(L, j, r, g);
      uint64_t n = sl__region_rank_of(g, p->b) - sl__region_rank_of(g, p->a), first;
      if (!n) continue;
      uint64_t o = d->counts[r]; /* where this part goes in the rank's layout */
      if (!sl__loader_single_run(g, p->a, p->b, &first)) {
        pack_all = true;
      } else {
        uint64_t at = poff + (first - p->a) * ew;
        if (d->part_off[r] == UINT64_MAX && o == 0) d->part_off[r] = at;
        else if (d->part_off[r] == UINT64_MAX || at != d->part_off[r] + o) pack_all = true;
      }
      d->counts[r] = (size_t)(o + n * ew);
    }
    poff += (p->b - p->a) * ew;
  }
  if (!pack_all) {
    for (int r = 0; r < nranks; r++)
      if (d->group[r] == r && d->counts[r]) d->displs[r] = (size_t)d->part_off[r];
    *sendbuf = S;
  } else {
    unsigned char *packed = (device ? s->dev : s->host) + c->packed;
    size_t off = 0;
    for (int r = 0; r < nranks; r++) {
      if (d->group[r] != r) continue;
      off = (size_t)SL__A16(off);
      d->displs[r] = off;
      uint64_t at = 0;
      poff = 0;
      for (size_t i = x->first; i < x->first + x->count; i++) {
        const piece *p = &L->stage.pieces[i];
        const tensor_job *j = sl__job_of(L, p);
        size_t ew = sl_dtype_size(j->wire);
        uint64_t n = 0;
        region_of_rank(L, j, r, &d->regions[r]);
        if (sl__region_rank_of(&d->regions[r], p->b) > sl__region_rank_of(&d->regions[r], p->a)) {
          sl_status st = sl__loader_pack(L, &d->regions[r], ew, S + poff, p->a, p->b, packed + off + at, device, &n);
          if (st != SL_OK && pst == SL_OK) pst = st; /* the layout is still completed: rank 0 takes part */
          at += n * ew;
        }
        poff += (p->b - p->a) * ew;
      }
      off += d->counts[r];
    }
    *sendbuf = packed;
  }
  for (int r = 0; r < nranks; r++) {
    d->counts[r] = d->counts[d->group[r]];
    d->displs[r] = d->displs[d->group[r]];
  }
  return pst;
}

/* ---- the collectives ---------------------------------------------------------------------- */
/* The collective's completion rule (module.h): a synchronous collective reads and writes device
 * buffers when it is called, so on the device route the data stream's earlier work (the copy
 * up, casts, packs) must be done first; a stream-ordered collective on the host route has not
 * filled the host buffer when it returns, so the stream must be done before the host reads it. */
static sl_status before_data_op(loader *L) {
  sl_context *ctx = L->ctx;
  if (L->pipe.device_route && (ctx->data->flags & SL_COLL_SYNC))
    return ctx->be->stream_sync(ctx->be_ctx, L->stage.s_comm);
  return SL_OK;
}

static sl_status after_data_op(loader *L) {
  sl_context *ctx = L->ctx;
  if (!L->pipe.device_route && !(ctx->data->flags & SL_COLL_SYNC))
    return ctx->be->stream_sync(ctx->be_ctx, L->stage.s_comm);
  return SL_OK;
}

/* HSDP sub-communicators: the chain links between neighbouring replicas (r even: link a, r
 * odd: link b); in each, the lower replica's rank is 0 and the upper's 1. */
static void *link_comm(loader *L, int lower_replica) {
  return lower_replica % 2 == 0 ? L->send.g_pair_a : L->send.g_pair_b;
}

/* One hop of the HSDP chain over the link between replicas LOWER and LOWER + 1: FROM_LOWER
 * says which way the part goes. */
static sl_status chain_hop(loader *L, int lower, bool from_lower, unsigned char *buf, uint64_t bytes) {
  sl_context *ctx = L->ctx;
  sl_status st = ctx->data->broadcast(link_comm(L, lower), buf, (size_t)bytes, from_lower ? 0 : 1, L->stage.s_comm);
  if (st != SL_OK) return st;
  L->st->stats.transfers++;
  bool sends = (L->send.my_replica == lower) == from_lower;
  if (sends) L->st->stats.bytes_sent += bytes;
  else L->st->stats.bytes_received += bytes;
  return SL_OK;
}

sl_status sl__loader_scatter(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char *S,
                             unsigned char *recv, uint64_t mine) {
  sl_context *ctx = L->ctx;
  const loader_send *d = &L->send;
  void *stream = L->stage.s_comm;
  bool hsdp = x->hsdp && d->hsdp_ready;
  /* HSDP: the root scatters within its own replica Q, and the chain carries the parts away
   * from Q both ways (rank 0's replica is 0: down the chain only) */
  int q = hsdp ? x->root / d->shard_ranks : 0, r = d->my_replica;
  sl_status st = before_data_op(L);
  if (st != SL_OK) return st;
  if (!hsdp || r == q) {
    int nranks = hsdp ? d->shard_ranks : L->world, root = hsdp ? x->root % d->shard_ranks : x->root;
    const unsigned char *sendbuf = NULL;
    if (L->rank == x->root && (st = root_layout(L, x, s, c, S, nranks, &sendbuf)) != SL_OK) {
      sl__loader_root_failed(L, st, L->ctx->errmsg); /* a pack that could not be enqueued: still take part */
      if (!sendbuf) sendbuf = S;
    }
    void *comm = hsdp ? d->g_shard : ctx->data_comm;
    st = ctx->data->scatterv(comm, sendbuf, d->counts, d->displs, recv, (size_t)mine, root, stream);
    if (st != SL_OK) return st; /* the data plane failed: the job did (the others see it or lose this rank) */
    L->st->stats.transfers++;
    if (L->rank == x->root)
      for (int k = 0; k < nranks; k++) L->st->stats.bytes_sent += k == root ? 0 : d->counts[k];
    else
      L->st->stats.bytes_received += mine;
  }
  if (hsdp) {
    /* the chain: every replica passes its part on to the next one away from Q, so the root
     * sends its own part once whatever the number of replicas (docs/DESIGN.md#data-flow) */
    if (r > q && (st = chain_hop(L, r - 1, true, recv, mine)) != SL_OK) return st;
    if (r < q && (st = chain_hop(L, r, false, recv, mine)) != SL_OK) return st;
    if (r >= q && r < d->replicas - 1 && (st = chain_hop(L, r, true, recv, mine)) != SL_OK) return st;
    if (r <= q && r > 0 && (st = chain_hop(L, r - 1, false, recv, mine)) != SL_OK) return st;
  }
  return after_data_op(L);
}

/* Every rank: the scatters of a round of M transfers X[i] from distinct roots (distributed
 * readers, loader_pipe.c; none HSDP) as one group op of the data plane, so that every reader's
 * bytes move at once: transfer X[i] through slot SL[i] with carve C[i] and its root's wire
 * bytes S[i], received into RECV[i] (MINE[i] bytes). A rank roots one item at most, so the
 * root's scatter tables serve it alone. A failure is the data plane's. */
sl_status sl__loader_scatter_round(loader *L, const transfer *const *x, slot *const *sl, const carve *c,
                                   const unsigned char *const *S, unsigned char *const *recv, const uint64_t *mine,
                                   size_t m) {
  sl_context *ctx = L->ctx;
  const loader_send *d = &L->send;
  sl_scatter_item it[SL_SCATTER_GROUP_MAX];
  sl_status st = before_data_op(L);
  if (st != SL_OK) return st;
  for (size_t i = 0; i < m; i++) {
    it[i] = (sl_scatter_item){
        .size = sizeof it[i], .recvbuf = recv[i], .recvbytes = (size_t)mine[i], .root = x[i]->root};
    if (L->rank != x[i]->root) continue;
    const unsigned char *sendbuf = NULL;
    if ((st = root_layout(L, x[i], sl[i], &c[i], S[i], L->world, &sendbuf)) != SL_OK) {
      sl__loader_root_failed(L, st, L->ctx->errmsg); /* a pack that could not be enqueued: still take part */
      if (!sendbuf) sendbuf = S[i];
    }
    it[i].sendbuf = sendbuf, it[i].counts = d->counts, it[i].displs = d->displs;
  }
  st = ctx->data->scatterv_group(ctx->data_comm, it, (int)m, L->stage.s_comm);
  if (st != SL_OK) return st; /* the data plane failed: the job did */
  L->st->stats.rounds++;
  for (size_t i = 0; i < m; i++) {
    L->st->stats.transfers++;
    if (L->rank == x[i]->root)
      for (int k = 0; k < L->world; k++) L->st->stats.bytes_sent += k == L->rank ? 0 : d->counts[k];
    else
      L->st->stats.bytes_received += mine[i];
  }
  return after_data_op(L);
}

/* Accelerate's algorithm, kept as the baseline: every rank receives the whole transfer (and
 * keeps its parts, loader_recv.c). */
sl_status sl__loader_broadcast(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char *S,
                               const unsigned char **buf) {
  sl_context *ctx = L->ctx;
  unsigned char *stage = L->pipe.device_route ? s->dev : s->host;
  unsigned char *b = L->rank == x->root ? (unsigned char *)S : stage + c->recv;
  *buf = b;
  sl_status st = before_data_op(L);
  if (st == SL_OK) st = ctx->data->broadcast(ctx->data_comm, b, (size_t)x->wire_bytes, x->root, L->stage.s_comm);
  if (st == SL_OK) st = after_data_op(L);
  if (st != SL_OK) return st;
  L->st->stats.transfers++;
  if (L->rank == x->root) L->st->stats.bytes_sent += x->wire_bytes * (uint64_t)(L->world - 1);
  else L->st->stats.bytes_received += x->wire_bytes;
  return SL_OK;
}

/* ---- setup and release ---------------------------------------------------------------------- */
sl_status sl__loader_send_setup(loader *L) {
  loader_send *d = &L->send;
  size_t w = (size_t)L->world;
  d->counts = calloc(w, sizeof *d->counts);
  d->displs = calloc(w, sizeof *d->displs);
  d->group = calloc(w, sizeof *d->group);
  d->regions = calloc(w, sizeof *d->regions);
  d->part_off = calloc(w, sizeof *d->part_off);
  d->group_of_key = calloc(w, sizeof *d->group_of_key);
  if (!d->counts || !d->displs || !d->group || !d->regions || !d->part_off || !d->group_of_key)
    return sl__fail(L->ctx, SL_ERR_NOMEM, "out of memory for %d ranks' scatter tables", L->world);
  return SL_OK;
}

sl_status sl__loader_hsdp_setup(loader *L) {
  sl_context *ctx = L->ctx;
  loader_send *d = &L->send;
  bool any = false;
  for (size_t i = 0; i < L->njobs; i++) any |= L->jobs[i].hsdp;
  if (!any || L->o.strategy != SL_STRATEGY_SCATTER || L->o.read_mode == SL_READ_EVERY_RANK || !SL_HAS_OP(ctx->data, split))
    return SL_OK;
  int nrep = L->mesh[0], SR = L->world / nrep, r = L->coord[0], sh = L->rank % SR;
  d->replicas = nrep;
  d->shard_ranks = SR;
  d->my_replica = r;
  int ca = -1, ka = 0, cb = -1, kb = 0;
  if (r % 2 == 0 && r + 1 < nrep) ca = (r / 2) * SR + sh, ka = 0;
  if (r % 2 == 1) ca = ((r - 1) / 2) * SR + sh, ka = 1;
  if (r % 2 == 1 && r + 1 < nrep) cb = ((r - 1) / 2) * SR + sh, kb = 0;
  if (r % 2 == 0 && r >= 2) cb = ((r - 2) / 2) * SR + sh, kb = 1;
  /* the replicas a root scatters in: replica 0 where rank 0 reads alone, each one's own with
   * distributed readers (a reader of any replica scatters within it) */
  sl_status st = ctx->data->split(ctx->data_comm, r == 0 || L->nreaders > 1 ? r : -1, L->rank, &d->g_shard);
  if (st == SL_OK) st = ctx->data->split(ctx->data_comm, ca, ka, &d->g_pair_a);
  if (st == SL_OK) st = ctx->data->split(ctx->data_comm, cb, kb, &d->g_pair_b);
  if (st != SL_OK) return st;
  d->hsdp_ready = true;
  return SL_OK;
}

void sl__loader_send_release(loader *L) {
  sl_context *ctx = L->ctx;
  loader_send *d = &L->send;
  if (d->g_pair_b) ctx->data->fini(d->g_pair_b);
  if (d->g_pair_a) ctx->data->fini(d->g_pair_a);
  if (d->g_shard) ctx->data->fini(d->g_shard);
  free(d->counts);
  free(d->displs);
  free(d->group);
  free(d->regions);
  free(d->part_off);
  free(d->group_of_key);
}
