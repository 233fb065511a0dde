/* Phase 2 of sl_load: the pipeline (docs/DESIGN.md#data-flow).
 *
 * The schedule (loader_stage.c) is a list of transfers; each runs through one of N staging
 * slots, so the reader thread (rank 0's, or each distributed reader's) reads ahead while
 * transfer k is copied up, cast, packed and sent (loader_send.c) and placed (loader_recv.c). A
 * slot's memory is rewritten only after the events recorded after its last use completed
 * (retire_slot), as module.h's asynchronous contract requires.
 *
 * Rank 0 (or every distributed reader) shares the outcome of its reads once per status window
 * (loader.c); a transfer whose read failed is sent as zeros, its root places nothing more, and
 * the window's verdict fails every rank (sl_bind_fn's contract says what that leaves). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"

/* ---- slots --------------------------------------------------------------------------------- */
/* Whether a failure that a wait on the streams reported (the sticky error of enqueued work) is
 * the data plane's verdict rather than this rank's own: a stream-ordered collective's op fails
 * there with SL_ERR_PEER or SL_ERR_TIMEOUT naming the rank it lost, or SL_ERR_COMM once aborted
 * (module.h), and a backend's wait that ran past the job's timeout is SL_ERR_TIMEOUT too. Like
 * a data op that fails at the call, it ends phase 2 at once: deferring it to the closing
 * agreement would wait a second timeout there for the rank already lost, and the others learn
 * of the failure on their own data plane (or from this rank's, which sl_load aborts). */
static bool data_plane_verdict(const loader *L, sl_status st) {
  /* only a stream-ordered collective leaves its verdict on the streams: behind a synchronous
   * one (Gloo, the host route) the streams hold this rank's own work alone, and its failure
   * (a device past its timeout) is this rank's, for the closing agreement */
  if (L->ctx->data->flags & SL_COLL_SYNC) return false;
  return st == SL_ERR_PEER || st == SL_ERR_TIMEOUT || st == SL_ERR_COMM;
}

/* A wait on EVENT: OK; a local failure, deferred (OK); or the data plane's verdict. */
static sl_status sync_event(loader *L, void *event) {
  sl_status st = L->ctx->be->event_sync(L->ctx->be_ctx, event);
  if (st == SL_OK || data_plane_verdict(L, st)) return st;
  sl__loader_defer(L, NULL, st);
  return SL_OK;
}

static slot_read *read_of(loader *L, const slot *s) { return &L->pipe.reads[s - L->stage.slots]; }

/* Waits until the slot's last use completed (both streams), then places the CPU shards whose
 * bytes came down into it. A local failure here is this rank's own: deferred. A verdict of the
 * data plane is returned (data_plane_verdict); the slot stays in flight, and sl_load aborts the
 * data plane before its staging is released. */
static sl_status retire_slot(loader *L, slot *s) {
  double t0 = sl__now_s();
  sl_status st = SL_OK;
  if (SL__KEEP(1) && s->ev_copy) st = sync_event(L, s->ev_copy);
  if (st == SL_OK && SL__KEEP(2) && s->ev_comm) st = sync_event(L, s->ev_comm);
  L->st->stats.seconds_wait += sl__now_s() - t0;
  if (st != SL_OK) return st;
  sl__loader_finish_host(L, s);
  pthread_mutex_lock(&L->lock);
  read_of(L, s)->state = SLOT_FREE;
  read_of(L, s)->free_for = L->pipe.retired + (size_t)L->stage.nslots; /* it held transfer `retired` */
  pthread_cond_broadcast(&L->cond);
  pthread_mutex_unlock(&L->lock);
  return SL_OK;
}

static sl_status record_slot(loader *L, slot *s) {
  sl_context *ctx = L->ctx;
  sl_status st = SL_OK;
  if (SL__KEEP(5) && s->ev_copy) st = ctx->be->event_record(ctx->be_ctx, s->ev_copy, L->stage.s_copy);
  if (st == SL_OK && SL__KEEP(6) && s->ev_comm) st = ctx->be->event_record(ctx->be_ctx, s->ev_comm, L->stage.s_comm);
  pthread_mutex_lock(&L->lock);
  read_of(L, s)->state = SLOT_INFLIGHT;
  pthread_mutex_unlock(&L->lock);
  return st;
}

/* ---- the reader (rank 0, or each distributed reader) --------------------------------------- */
/* It reads the transfers this rank sends, each into its slot once the slot's last transfer
 * retired (FREE_FOR: with distributed readers the slot's last transfer may have been another
 * reader's, received into it). */
static void *reader_main(void *arg) {
  loader *L = arg;
  loader_pipe *p = &L->pipe;
  sl_status failed = SL_OK;
  for (size_t k = 0; k < L->stage.nxfers; k++) {
    if (L->stage.xfers[k].root != L->rank) continue;
    slot *s = &L->stage.slots[k % (size_t)L->stage.nslots];
    slot_read *rd = read_of(L, s);
    pthread_mutex_lock(&L->lock);
    while ((rd->state != SLOT_FREE || rd->free_for != k) && !p->stop) pthread_cond_wait(&L->cond, &L->lock);
    if (p->stop) {
      pthread_mutex_unlock(&L->lock);
      break;
    }
    rd->state = SLOT_READING;
    pthread_mutex_unlock(&L->lock);
    double t0 = sl__now_s();
    /* The source reports through the context's message buffer, which belongs to the main
     * thread: read with a private copy of the message and hand it over in the slot. */
    sl__thread_errbuf(rd->msg, sizeof rd->msg);
    rd->msg[0] = 0;
    /* after a failed read nothing more is read: later transfers may read straight into caller
     * buffers, which must stay untouched (sl_bind_fn's contract) */
    sl_status st = failed;
    bool direct = false;
    bool halt = sl__loader_reader_halted(L);
    if (halt && st == SL_OK) st = failed = SL_ERR_PEER;
    if (st == SL_OK) st = failed = sl__loader_root_read(L, &L->stage.xfers[k], s, &direct);
    else snprintf(rd->msg, sizeof rd->msg, "not read after an earlier failure on rank %d", L->rank);
    rd->direct = direct;
    sl__thread_errbuf(NULL, 0);
    double dt = sl__now_s() - t0;
    pthread_mutex_lock(&L->lock);
    p->read_seconds += dt;
    rd->st = st;
    rd->xfer = k;
    rd->state = SLOT_READY;
    pthread_cond_broadcast(&L->cond);
    pthread_mutex_unlock(&L->lock);
  }
  return NULL;
}

static void stop_reader(loader *L) {
  loader_pipe *p = &L->pipe;
  if (!p->reader_running) return;
  pthread_mutex_lock(&L->lock);
  p->stop = true;
  pthread_cond_broadcast(&L->cond);
  pthread_mutex_unlock(&L->lock);
  pthread_join(p->reader, NULL);
  p->reader_running = false;
}

/* The transfer's root: waits for its reader thread to have transfer K ready in its slot. */
static void wait_ready(loader *L, slot *s, size_t k) {
  double t0 = sl__now_s();
  const slot_read *rd = read_of(L, s);
  pthread_mutex_lock(&L->lock);
  while (!(rd->state == SLOT_READY && rd->xfer == k)) pthread_cond_wait(&L->cond, &L->lock);
  pthread_mutex_unlock(&L->lock);
  L->st->stats.seconds_wait += sl__now_s() - t0;
}

/* ---- the pipeline ----------------------------------------------------------------------- */
/* Retires every transfer before UPTO (exclusive) that is still in flight, oldest first; stops
 * at a verdict of the data plane. */
static sl_status retire_until(loader *L, size_t upto) {
  loader_pipe *p = &L->pipe;
  while (p->retired < upto) {
    slot *s = &L->stage.slots[p->retired % (size_t)L->stage.nslots];
    sl_status st = read_of(L, s)->state == SLOT_INFLIGHT ? retire_slot(L, s) : SL_OK;
    if (st != SL_OK) return st;
    p->retired++;
  }
  return SL_OK;
}

/* Which pairs the backend casts on its device: cast_async of no elements asks (module.h); a
 * pair it refuses is cast on the host. */
static void ask_device_casts(loader *L) {
  sl_context *ctx = L->ctx;
  loader_pipe *p = &L->pipe;
  memset(p->cast_on_device, 0, sizeof p->cast_on_device);
  if (!p->can_cast_device) return;
  const sl_dtype f[] = {SL_DTYPE_F64, SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};
  for (size_t a = 0; a < 4; a++)
    for (size_t b = 0; b < 4; b++)
      p->cast_on_device[f[a]][f[b]] =
          a == b || ctx->be->cast_async(ctx->be_ctx, NULL, f[b], NULL, f[a], 0, NULL) == SL_OK;
}

/* The route the bytes take and what the backend casts on its device. */
static sl_status choose_route(loader *L) {
  sl_context *ctx = L->ctx;
  const sl_backend_ops *be = ctx->be;
  loader_pipe *p = &L->pipe;
  p->device_is_host = sl__device_is_host(ctx);
  /* the route by what both tables declare; the data-plane agreement refused a pair no route
   * serves (sl__collective_probe), so this is the same verdict, said again for safety */
  char why[384];
  sl__route route = sl__data_route(ctx->data, be, why, sizeof why);
  if (route == SL__ROUTE_NONE) return sl__fail(ctx, SL_ERR_UNSUPPORTED, "%s", why);
  p->device_route = route == SL__ROUTE_DEVICE && L->o.read_mode != SL_READ_EVERY_RANK;
  p->can_cast_device = SL_HAS_OP(be, cast_async);
  p->can_2d = SL_HAS_OP(be, copy_2d_async);
  ask_device_casts(L);
  if (p->device_route)
    for (size_t i = 0; i < L->njobs; i++) {
      const tensor_job *j = &L->jobs[i];
      if ((j->wire != j->res.dtype && !p->cast_on_device[j->wire][j->res.dtype]) ||
          (j->wire != j->src->dtype && !p->cast_on_device[j->src->dtype][j->wire]))
        return sl__fail(ctx, SL_ERR_UNSUPPORTED,
                        "%s: the data collective %s moves device memory and needs device casts (%s to %s to %s), "
                        "which backend %s %s; choose host staging (--collective gloo)",
                        j->src->name, ctx->data->name, sl_dtype_name(j->src->dtype), sl_dtype_name(j->wire),
                        sl_dtype_name(j->res.dtype), be->name,
                        p->can_cast_device ? "does not run on its device" : "lacks");
    }
  return SL_OK;
}

bool sl__loader_rounds(const loader *L) {
  return L->nreaders > 1 && L->o.read_mode == SL_READ_READERS && L->o.strategy == SL_STRATEGY_SCATTER &&
         SL_HAS_OP(L->ctx->data, scatterv_group);
}

/* How many transfers from K on run as one round: consecutive ones from distinct roots (the
 * schedule takes one of each reader in turn), none HSDP (its chain runs after its own scatter),
 * at most ROUND_MAX. */
static size_t round_len(const loader *L, size_t k) {
  const loader_stage *g = &L->stage;
  size_t m = 0;
  while (m < L->pipe.round_max && k + m < g->nxfers && !g->xfers[k + m].hsdp) {
    bool seen = false;
    for (size_t i = 0; i < m; i++) seen |= g->xfers[k + i].root == g->xfers[k + m].root;
    if (seen) break;
    m++;
  }
  return m > 1 ? m : 1;
}

static sl_status setup(loader *L) {
  /* the readers' status windows (loader.c): allocated here, so that a rank without the memory
   * fails the agreement that follows rather than a window */
  if (L->nreaders > 1 && !(L->fail.window = calloc((size_t)L->world, sizeof *L->fail.window)))
    return sl__fail(L->ctx, SL_ERR_NOMEM, "out of memory for %d ranks' read status", L->world);
  sl_status st = choose_route(L);
  if (st == SL_OK) st = sl__loader_stage_setup(L);
  if (st == SL_OK) st = sl__loader_send_setup(L);
  /* rounds: a slot in flight for each of their transfers, and one for each reader's read ahead */
  size_t half = (size_t)L->stage.nslots / 2, R = (size_t)L->nreaders;
  L->pipe.round_max = 1;
  if (sl__loader_rounds(L)) L->pipe.round_max = R < half ? R : half;
  if (L->pipe.round_max > SL_SCATTER_GROUP_MAX) L->pipe.round_max = SL_SCATTER_GROUP_MAX;
  return st;
}

/* Rank 0, after transfer X: the caller's progress callback for every tensor X completed. A
 * progress_status callback that fails is rank 0's own failure: the status window tells every
 * rank, and it is not called again. */
static void report_progress(loader *L, const transfer *x) {
  loader_pipe *pp = &L->pipe;
  if (!L->o.progress && !L->o.progress_status) return;
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &L->stage.pieces[i];
    if (p->b != L->jobs[p->job].elems) continue;
    pp->done_bytes += L->jobs[p->job].src->nbytes;
    if (!L->o.progress_status) {
      L->o.progress(L->o.progress_user, pp->done_bytes, L->total_bytes);
      continue;
    }
    if (L->fail.root_st != SL_OK) continue;
    char msg[512] = "";
    sl_status st = L->o.progress_status(L->o.progress_user, pp->done_bytes, L->total_bytes, msg, sizeof msg);
    if (st == SL_OK) continue;
    msg[sizeof msg - 1] = 0;
    char why[SL__ERRMSG_LEN];
    snprintf(why, sizeof why, "the caller's progress callback failed after %llu of %llu bytes: %s",
             (unsigned long long)pp->done_bytes, (unsigned long long)L->total_bytes, msg[0] ? msg : sl_strerror(st));
    sl__loader_root_failed(L, st, why);
  }
}

/* One transfer through slot S: rank 0 readies the wire bytes and every rank takes part in the
 * collective (loader_send.c), then places its part (loader_recv.c). */
static sl_status run_transfer(loader *L, size_t k, slot *s) {
  const transfer *x = &L->stage.xfers[k];
  carve c = sl__loader_carve(L, x);
  if (L->o.read_mode == SL_READ_EVERY_RANK) {
    sl__loader_read_own(L, x, s, &c);
    return SL_OK;
  }
  const unsigned char *S = NULL;
  if (L->rank == x->root && sl__loader_root_wire(L, x, s, &c, read_of(L, s), &S)) return SL_OK;
  sl_status st;
  if (L->o.strategy == SL_STRATEGY_BROADCAST) {
    const unsigned char *buf;
    if ((st = sl__loader_broadcast(L, x, s, &c, S, &buf)) != SL_OK) return st;
    sl__loader_place_broadcast(L, x, s, &c, buf);
    return SL_OK;
  }
  unsigned char *direct, *stage = L->pipe.device_route ? s->dev : s->host;
  uint64_t mine = sl__loader_my_part(L, x, &direct);
  unsigned char *recv = direct ? direct : stage + c.recv;
  if ((st = sl__loader_scatter(L, x, s, &c, S, recv, mine)) != SL_OK) return st;
  if (!direct) sl__loader_place_parts(L, x, s, &c, recv);
  return SL_OK;
}

/* A round of M > 1 transfers from K on (round_len): each root readies its wire bytes, then one
 * group op moves them all, then every rank places its parts of each. */
static sl_status run_round(loader *L, size_t k, size_t m, bool reader) {
  const transfer *x[SL_SCATTER_GROUP_MAX] = {0};
  slot *sl[SL_SCATTER_GROUP_MAX] = {0};
  carve c[SL_SCATTER_GROUP_MAX] = {0};
  const unsigned char *S[SL_SCATTER_GROUP_MAX] = {0};
  unsigned char *recv[SL_SCATTER_GROUP_MAX] = {0};
  bool direct[SL_SCATTER_GROUP_MAX] = {0};
  uint64_t mine[SL_SCATTER_GROUP_MAX] = {0};
  const sl_status before = L->fail.deferred;
  size_t own = m; /* the item this rank roots */
  for (size_t i = 0; i < m; i++) {
    x[i] = &L->stage.xfers[k + i];
    sl[i] = &L->stage.slots[(k + i) % (size_t)L->stage.nslots];
    c[i] = sl__loader_carve(L, x[i]);
    S[i] = NULL;
    if (L->rank == x[i]->root) {
      own = i;
      if (reader) wait_ready(L, sl[i], k + i);
      /* nothing is left to move only at world 1, which has one reader */
      (void)sl__loader_root_wire(L, x[i], sl[i], &c[i], read_of(L, sl[i]), &S[i]);
    }
    unsigned char *d, *stage = L->pipe.device_route ? sl[i]->dev : sl[i]->host;
    mine[i] = sl__loader_my_part(L, x[i], &d);
    direct[i] = d != NULL;
    recv[i] = d ? d : stage + c[i].recv;
  }
  sl_status st = sl__loader_scatter_round(L, x, sl, c, S, recv, mine, m);
  if (st != SL_OK) return st;
  /* A failure this rank met readying its own item (its read) stops it placing from that item
   * on, as when the transfers move one at a time: the round's items before it still land
   * (sl_bind_fn's contract: the tensors before the failure may hold their bytes, later ones
   * are untouched). */
  loader_fail *f = &L->fail;
  const sl_status now = f->deferred;
  const bool own_failed = before == SL_OK && now != SL_OK;
  char why[SL__ERRMSG_LEN];
  if (own_failed) memcpy(why, f->deferred_msg, sizeof why);
  for (size_t i = 0; i < m; i++) {
    if (own_failed) f->deferred = i < own ? SL_OK : now; /* what a placement fails with is dropped */
    if (!direct[i]) sl__loader_place_parts(L, x[i], sl[i], &c[i], recv[i]);
  }
  if (own_failed) f->deferred = now, memcpy(f->deferred_msg, why, sizeof why);
  return SL_OK;
}

sl_status sl__loader_pipe(loader *L) {
  sl_context *ctx = L->ctx;
  loader_pipe *p = &L->pipe;
  const loader_stage *g = &L->stage;
  sl_status st = setup(L);
  for (int i = 0; i < g->nslots; i++) p->reads[i].free_for = (size_t)i; /* slot i first serves transfer i */
  bool reader = L->my_reader >= 0 && g->nxfers > 0;
  if (st == SL_OK && reader) {
    if (pthread_create(&p->reader, NULL, reader_main, L) != 0)
      st = sl__fail(ctx, SL_ERR_NOMEM, "cannot start the reader thread");
    else p->reader_running = true;
  }
  /* staging, streams and the reader are local: a rank that could not set them up (its device
   * out of memory) fails every rank here, before any of them waits in a data operation */
  if ((st = sl__loader_agree(L, st, "preparing the data path (staging, streams)")) != SL_OK) goto out_fail;
  p->data_started = true;
  if ((st = sl__loader_hsdp_setup(L)) != SL_OK) goto out_fail; /* collective: a failure is every rank's */
  const size_t N = (size_t)g->nslots;
  size_t next_own = 0; /* a reader: the first transfer after K that it reads */
  for (size_t k = 0; k < g->nxfers;) {
    /* transfers [k, k + m): one, or a round of distributed readers' (run_round) */
    const size_t m = L->pipe.round_max > 1 ? round_len(L, k) : 1, last = k + m - 1;
    /* free these transfers' slots (each held its transfer's k-N) and, on a reader, the one its
     * reader thread fills next while they move (the slot of its next own transfer J, which
     * held J-N), as long as that is before K: one slot runs strictly one stage after another */
    size_t upto = last + 1 > N ? last + 1 - N : 0;
    if (reader && N >= 2) {
      if (next_own <= last)
        for (next_own = last + 1; next_own < g->nxfers && g->xfers[next_own].root != L->rank; next_own++) {}
      if (next_own < g->nxfers && next_own + 1 > N) {
        size_t want = next_own + 1 - N < k ? next_own + 1 - N : k;
        if (want > upto) upto = want;
      }
    }
    if ((st = retire_until(L, upto)) != SL_OK) goto out_fail;
    if (m > 1) {
      st = run_round(L, k, m, reader);
    } else {
      if (reader && g->xfers[k].root == L->rank) wait_ready(L, &L->stage.slots[k % N], k);
      st = run_transfer(L, k, &L->stage.slots[k % N]);
    }
    if (st != SL_OK) goto out_fail;
    for (size_t i = k; i <= last; i++) {
      if ((st = record_slot(L, &L->stage.slots[i % N])) != SL_OK) sl__loader_defer(L, NULL, st);
      if (L->rank == 0) report_progress(L, &g->xfers[i]);
      if ((st = sl__loader_status_window(L, i)) != SL_OK) goto out_fail;
    }
    k = last + 1;
  }
  if ((st = retire_until(L, g->nxfers)) != SL_OK) goto out_fail;
  stop_reader(L);
  L->st->stats.seconds_read += p->read_seconds;
  /* A stream-ordered data collective may report a failure of its last operations only at its
   * next call (an NCCL watchdog's abort lets the stream drain): its barrier is that call. */
  if (!(ctx->data->flags & SL_COLL_SYNC) && L->o.read_mode != SL_READ_EVERY_RANK && g->nxfers &&
      (st = ctx->data->barrier(ctx->data_comm)) != SL_OK)
    return st;
  return SL_OK;
out_fail:
  stop_reader(L);
  return st;
}

void sl__loader_pipe_release(loader *L) {
  stop_reader(L);
  free(L->fail.window);
  L->fail.window = NULL;
  sl__loader_stage_drain(L);
  sl__loader_send_release(L);
  sl__loader_stage_release(L);
  sl__loader_recv_release(L);
}
