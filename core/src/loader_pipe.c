/* Phase 2 of sl_load: the pipeline (docs/DESIGN.md#data-flow).
 *
 * The schedule (loader_xfer.c) is a list of transfers; each runs through one of N staging
 * slots, so rank 0's reader thread reads transfer k+1 while transfer k is copied up, cast,
 * packed and sent (loader_move.c). A slot's memory is rewritten only after the events recorded
 * after its last use completed (retire_slot), as module.h's asynchronous contract requires.
 *
 * Rank 0 shares the outcome of its reads once per SL__STATUS_WINDOW transfers over the control
 * plane; a transfer whose read failed is sent as zeros, rank 0 places nothing more, and the
 * window's verdict fails every rank (sl_bind_fn's contract says what that leaves). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loader.h"
#include "ranks_agree.h"

double sl__now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void sl__loader_defer(loader *L, const char *name, sl_status st) {
  if (L->deferred != SL_OK) return;
  /* the reader reads no more: later transfers may read straight into caller buffers */
  pthread_mutex_lock(&L->lock);
  L->reader_halt = true;
  pthread_mutex_unlock(&L->lock);
  L->deferred = st;
  if (name) snprintf(L->deferred_msg, sizeof L->deferred_msg, "%.200s: %.800s", name, L->ctx->errmsg);
  else snprintf(L->deferred_msg, sizeof L->deferred_msg, "%s", L->ctx->errmsg);
}

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
  sl_context *ctx = L->ctx;
  for (size_t i = s->pending_first; i < s->pending_first + s->pending_count; i++) {
    const host_finish *f = &L->finish[i];
    const tensor_job *j = &L->jobs[f->job];
    if (L->deferred != SL_OK) break;
    size_t ep = sl_dtype_size(j->res.dtype);
    unsigned char *dst = (unsigned char *)j->out->data + f->la * ep;
    if (j->wire == j->res.dtype) memcpy(dst, s->host + f->off, f->count * ep);
    else if (sl_convert(dst, j->res.dtype, s->host + f->off, j->wire, f->count) != SL_OK)
      sl__loader_defer(L, j->src->name, sl__fail(ctx, SL_ERR_DTYPE, "cannot cast %s to %s", sl_dtype_name(j->wire),
                                                  sl_dtype_name(j->res.dtype)));
  }
  s->pending_count = 0;
  pthread_mutex_lock(&L->lock);
  s->state = SLOT_FREE;
  pthread_cond_broadcast(&L->cond);
  pthread_mutex_unlock(&L->lock);
  return SL_OK;
}

/* ---- the reader (rank 0) ----------------------------------------------------------------- */
/* World 1 on the host route: a single-piece transfer whose shard is host memory of the file's
 * dtype is read straight into the shard. */
static unsigned char *solo_target(const loader *L, const transfer *x) {
  if (L->world != 1 || L->device_route || x->count != 1) return NULL;
  const piece *p = &L->pieces[x->first];
  const tensor_job *j = sl__job_of(L, p);
  if (!sl__shard_on_host(L, j) || j->src->dtype != j->res.dtype) return NULL;
  return (unsigned char *)j->out->data + p->a * sl_dtype_size(j->res.dtype);
}

static sl_status read_transfer(loader *L, const transfer *x, slot *s) {
  unsigned char *into = solo_target(L, x);
  s->direct = into != NULL;
  unsigned char *dst = into ? into : s->host;
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &L->pieces[i];
    const tensor_job *j = sl__job_of(L, p);
    size_t ef = sl_dtype_size(j->src->dtype);
    sl_status st = sl__source_pread(L->src, j->src_index, p->a * ef, dst, (p->b - p->a) * ef);
    if (st != SL_OK) return st;
    dst += x->plain ? (p->b - p->a) * ef : SL__A16((p->b - p->a) * ef);
  }
  return SL_OK;
}

static void *reader_main(void *arg) {
  loader *L = arg;
  sl_status failed = SL_OK;
  for (size_t k = 0; k < L->nxfers; k++) {
    slot *s = &L->slots[k % (size_t)L->nslots];
    pthread_mutex_lock(&L->lock);
    while (s->state != SLOT_FREE && !L->stop) pthread_cond_wait(&L->cond, &L->lock);
    if (L->stop) {
      pthread_mutex_unlock(&L->lock);
      break;
    }
    s->state = SLOT_READING;
    pthread_mutex_unlock(&L->lock);
    double t0 = sl__now_s();
    /* The source reports through the context's message buffer, which belongs to the main
     * thread: read with a private copy of the message and hand it over in the slot. */
    sl__thread_errbuf(s->read_msg, sizeof s->read_msg);
    s->read_msg[0] = 0;
    /* after a failed read nothing more is read: later transfers may read straight into caller
     * buffers, which must stay untouched (sl_bind_fn's contract) */
    sl_status st = failed;
    s->direct = false;
    pthread_mutex_lock(&L->lock);
    if (L->reader_halt && st == SL_OK) st = failed = SL_ERR_PEER;
    pthread_mutex_unlock(&L->lock);
    if (st == SL_OK) st = failed = read_transfer(L, &L->xfers[k], s);
    else snprintf(s->read_msg, sizeof s->read_msg, "not read after an earlier failure on rank 0");
    sl__thread_errbuf(NULL, 0);
    double dt = sl__now_s() - t0;
    pthread_mutex_lock(&L->lock);
    L->read_seconds += dt;
    s->read_st = st;
    s->xfer = k;
    s->state = SLOT_READY;
    pthread_cond_broadcast(&L->cond);
    pthread_mutex_unlock(&L->lock);
  }
  return NULL;
}

/* ---- the pipeline ----------------------------------------------------------------------- */
static void stop_reader(loader *L) {
  if (!L->reader_running) return;
  pthread_mutex_lock(&L->lock);
  L->stop = true;
  pthread_cond_broadcast(&L->cond);
  pthread_mutex_unlock(&L->lock);
  pthread_join(L->reader, NULL);
  L->reader_running = false;
}

/* Retires every transfer before UPTO (exclusive) that is still in flight, oldest first; stops
 * at a verdict of the data plane. */
static sl_status retire_until(loader *L, size_t upto) {
  while (L->retired < upto) {
    slot *s = &L->slots[L->retired % (size_t)L->nslots];
    sl_status st = s->state == SLOT_INFLIGHT ? retire_slot(L, s) : SL_OK;
    if (st != SL_OK) return st;
    L->retired++;
  }
  return SL_OK;
}

/* Rank 0: waits for the reader to have transfer K ready in its slot. */
static void wait_ready(loader *L, slot *s, size_t k) {
  double t0 = sl__now_s();
  pthread_mutex_lock(&L->lock);
  while (!(s->state == SLOT_READY && s->xfer == k)) pthread_cond_wait(&L->cond, &L->lock);
  pthread_mutex_unlock(&L->lock);
  L->st->stats.seconds_wait += sl__now_s() - t0;
}

static sl_status record_slot(loader *L, slot *s) {
  sl_context *ctx = L->ctx;
  sl_status st = SL_OK;
  if (SL__KEEP(5) && s->ev_copy) st = ctx->be->event_record(ctx->be_ctx, s->ev_copy, L->s_copy);
  if (st == SL_OK && SL__KEEP(6) && s->ev_comm) st = ctx->be->event_record(ctx->be_ctx, s->ev_comm, L->s_comm);
  pthread_mutex_lock(&L->lock);
  s->state = SLOT_INFLIGHT;
  pthread_mutex_unlock(&L->lock);
  return st;
}

static sl_status setup_hsdp(loader *L) {
  sl_context *ctx = L->ctx;
  bool any = false;
  for (size_t i = 0; i < L->njobs; i++) any |= L->jobs[i].hsdp;
  if (!any || L->o.strategy != SL_STRATEGY_SCATTER || L->o.read_mode != SL_READ_RANK0 || !SL_HAS_OP(ctx->data, split))
    return SL_OK;
  int R = L->mesh[0], SR = L->world / R, r = L->coord[0], sh = L->rank % SR;
  L->replicas = R;
  L->shard_ranks = SR;
  L->my_replica = r;
  int ca = -1, ka = 0, cb = -1, kb = 0;
  if (r % 2 == 0 && r + 1 < R) ca = (r / 2) * SR + sh, ka = 0;
  if (r % 2 == 1) ca = ((r - 1) / 2) * SR + sh, ka = 1;
  if (r % 2 == 1 && r + 1 < R) cb = ((r - 1) / 2) * SR + sh, kb = 0;
  if (r % 2 == 0 && r >= 2) cb = ((r - 2) / 2) * SR + sh, kb = 1;
  sl_status st = ctx->data->split(ctx->data_comm, r == 0 ? 0 : -1, L->rank, &L->g_shard0);
  if (st == SL_OK) st = ctx->data->split(ctx->data_comm, ca, ka, &L->g_pair_a);
  if (st == SL_OK) st = ctx->data->split(ctx->data_comm, cb, kb, &L->g_pair_b);
  if (st != SL_OK) return st;
  L->hsdp_ready = true;
  return SL_OK;
}

/* Which pairs the backend casts on its device: cast_async of no elements asks (module.h); a
 * pair it refuses is cast on the host. */
static void ask_device_casts(loader *L) {
  sl_context *ctx = L->ctx;
  memset(L->cast_on_device, 0, sizeof L->cast_on_device);
  if (!L->can_cast_device) return;
  const sl_dtype f[] = {SL_DTYPE_F64, SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};
  for (size_t a = 0; a < 4; a++)
    for (size_t b = 0; b < 4; b++)
      L->cast_on_device[f[a]][f[b]] =
          a == b || ctx->be->cast_async(ctx->be_ctx, NULL, f[b], NULL, f[a], 0, NULL) == SL_OK;
}

static sl_status setup(loader *L) {
  sl_context *ctx = L->ctx;
  const sl_backend_ops *be = ctx->be;
  L->device_is_host = sl__device_is_host(ctx);
  /* the route by what both tables declare; the data-plane agreement refused a pair no route
   * serves (sl__collective_probe), so this is the same verdict, said again for safety */
  char why[384];
  sl__route route = sl__data_route(ctx->data, be, why, sizeof why);
  if (route == SL__ROUTE_NONE) return sl__fail(ctx, SL_ERR_UNSUPPORTED, "%s", why);
  L->device_route = route == SL__ROUTE_DEVICE && L->o.read_mode == SL_READ_RANK0;
  L->can_cast_device = SL_HAS_OP(be, cast_async);
  L->can_2d = SL_HAS_OP(be, copy_2d_async);
  ask_device_casts(L);
  if (L->device_route)
    for (size_t i = 0; i < L->njobs; i++) {
      const tensor_job *j = &L->jobs[i];
      if ((j->wire != j->res.dtype && !L->cast_on_device[j->wire][j->res.dtype]) ||
          (j->wire != j->src->dtype && !L->cast_on_device[j->src->dtype][j->wire]))
        return sl__fail(ctx, SL_ERR_UNSUPPORTED,
                        "%s: the data collective %s moves device memory and needs device casts (%s to %s to %s), "
                        "which backend %s %s; choose host staging (--collective gloo)",
                        j->src->name, ctx->data->name, sl_dtype_name(j->src->dtype), sl_dtype_name(j->wire),
                        sl_dtype_name(j->res.dtype), be->name,
                        L->can_cast_device ? "does not run on its device" : "lacks");
    }
  L->nslots = L->o.pipeline_slots <= 0 ? SL__DEFAULT_SLOTS : L->o.pipeline_slots;

  if (L->nslots > SL__MAX_SLOTS) L->nslots = SL__MAX_SLOTS;

  /* Slot size: the budget split between the slots, or less when the whole checkpoint needs
   * less — a small checkpoint should not pay for populating 64 MiB. Every rank computes the same
   * figure from the same plan, so transfers agree. */
  const uint64_t reserve = SL__SLOT_SLACK + 16 * (uint64_t)L->world; /* see loader_xfer.c */
  uint64_t need = reserve;
  for (size_t i = 0; i < L->njobs && need < L->o.staging_bytes; i++) {
    uint64_t b;
    if (!sl__mul_u64(L->jobs[i].elems, sl__loader_cost_per_elem(L, &L->jobs[i]), &b) ||
        !sl__add_u64(need, b + SL__PIECE_PAD, &need))
      need = L->o.staging_bytes;
  }
  uint64_t per_slot = L->o.staging_bytes / (size_t)L->nslots;
  if (need < per_slot) per_slot = need;
  /* one slot is one allocation (host, pinned or device): under every rank's backend limit (a
   * Level Zero device without relaxed limits), the transfers then split finer */
  if (L->alloc_cap && per_slot > L->alloc_cap) per_slot = L->alloc_cap;
  if (per_slot < SL__MIN_SLOT + reserve) per_slot = SL__MIN_SLOT + reserve;
  L->slot_bytes = (size_t)per_slot;
  sl_status st = sl__loader_schedule(L);
  if (st != SL_OK) return st;
  size_t alloc = L->slot_bytes; /* the schedule kept the alignment slack inside it */
  /* memory only for the slots transfers will use (a small checkpoint needs one) */
  int filled = L->nxfers < (size_t)L->nslots ? (int)L->nxfers : L->nslots;

  /* The device route stages in device memory and orders it by streams and events on every
   * backend: one whose device memory is host memory (cpu) hands it host memory from its own
   * alloc_device and token streams. Host staging needs them only on a real device. */
  bool dev_part = L->device_route, ordered = L->device_route || !L->device_is_host;
  if (!L->device_is_host)
    for (size_t i = 0; i < L->njobs && !dev_part; i++)
      if (L->jobs[i].out->device == SL_DEVICE_ACCELERATOR &&
          ((L->jobs[i].wire != L->jobs[i].res.dtype && L->cast_on_device[L->jobs[i].wire][L->jobs[i].res.dtype]) ||
           (L->jobs[i].src->dtype != L->jobs[i].res.dtype &&
            L->cast_on_device[L->jobs[i].src->dtype][L->jobs[i].res.dtype])))
        dev_part = true;
  L->host_pinned = sl__has_pinned(ctx);
  if (ordered) {
    if ((st = be->stream_create(ctx->be_ctx, &L->s_copy)) != SL_OK) return st;
    if ((st = be->stream_create(ctx->be_ctx, &L->s_comm)) != SL_OK) return st;
  }
  for (int i = 0; i < filled; i++) {
    slot *s = &L->slots[i];
    if ((st = sl_alloc(ctx, SL_DEVICE_CPU, L->host_pinned, alloc, (void **)&s->host)) != SL_OK)
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
  size_t w = (size_t)L->world;
  L->counts = calloc(w, sizeof *L->counts);
  L->displs = calloc(w, sizeof *L->displs);
  L->group = calloc(w, sizeof *L->group);
  L->regions = calloc(w, sizeof *L->regions);
  L->part_off = calloc(w, sizeof *L->part_off);
  L->group_of_key = calloc(w, sizeof *L->group_of_key);
  if (!L->counts || !L->displs || !L->group || !L->regions || !L->part_off || !L->group_of_key)
    return sl__fail(ctx, SL_ERR_NOMEM, "out of memory for %d ranks' scatter tables", L->world);
  return SL_OK;
}

/* Rank 0, after transfer X: the caller's progress callback for every tensor X completed. A
 * progress_status callback that fails is rank 0's own failure: the status window tells every
 * rank, and it is not called again. */
static void report_progress(loader *L, const transfer *x) {
  if (!L->o.progress && !L->o.progress_status) return;
  for (size_t i = x->first; i < x->first + x->count; i++) {
    const piece *p = &L->pieces[i];
    if (p->b != L->jobs[p->job].elems) continue;
    L->done_bytes += L->jobs[p->job].src->nbytes;
    if (!L->o.progress_status) {
      L->o.progress(L->o.progress_user, L->done_bytes, L->total_bytes);
      continue;
    }
    if (L->root_st != SL_OK) continue;
    char msg[512] = "";
    sl_status st = L->o.progress_status(L->o.progress_user, L->done_bytes, L->total_bytes, msg, sizeof msg);
    if (st == SL_OK) continue;
    msg[sizeof msg - 1] = 0;
    char why[SL__ERRMSG_LEN];
    snprintf(why, sizeof why, "the caller's progress callback failed after %llu of %llu bytes: %s",
             (unsigned long long)L->done_bytes, (unsigned long long)L->total_bytes, msg[0] ? msg : sl_strerror(st));
    sl__loader_root_failed(L, st, why);
  }
}

sl_status sl__loader_data(loader *L) {
  sl_context *ctx = L->ctx;
  sl_status st = setup(L);
  bool reader = L->rank == 0 && L->o.read_mode == SL_READ_RANK0 && L->nxfers > 0;
  if (st == SL_OK && reader) {
    if (pthread_create(&L->reader, NULL, reader_main, L) != 0)
      st = sl__fail(ctx, SL_ERR_NOMEM, "cannot start the reader thread");
    else L->reader_running = true;
  }
  /* staging, streams and the reader are local: a rank that could not set them up (its device
   * out of memory) fails every rank here, before any of them waits in a data operation */
  if ((st = sl__loader_agree(L, st, "preparing the data path (staging, streams)")) != SL_OK) goto out_fail;
  L->data_started = true;
  if ((st = setup_hsdp(L)) != SL_OK) goto out_fail; /* collective: a failure is every rank's */
  for (size_t k = 0; k < L->nxfers; k++) {
    slot *s = &L->slots[k % (size_t)L->nslots];
    /* free this transfer's slot (it held transfer k-N) and, on rank 0, the one the reader fills
     * while this transfer moves (it held k+1-N) */
    size_t ahead = reader && L->nslots >= 2 ? 2 : 1; /* one slot: strictly one stage after another */
    if ((st = retire_until(L, k + ahead > (size_t)L->nslots ? k + ahead - (size_t)L->nslots : 0)) != SL_OK)
      goto out_fail;
    if (reader) wait_ready(L, s, k);
    if ((st = sl__loader_run_transfer(L, k, s)) != SL_OK) goto out_fail;
    if ((st = record_slot(L, s)) != SL_OK) sl__loader_defer(L, NULL, st);
    if (L->rank == 0) report_progress(L, &L->xfers[k]);
    if (L->o.read_mode == SL_READ_RANK0 && ((k + 1) % SL__STATUS_WINDOW == 0 || k + 1 == L->nxfers)) {
      /* rank 0's reads of this window, told to every rank (docs/DESIGN.md#data-flow) */
      if (L->rank == 0 && L->root_st != SL_OK) sl__fail(ctx, L->root_st, "%s", L->root_msg);
      double t0 = sl__now_s();
      st = sl__share_root_status(ctx, L->rank == 0 ? L->root_st : SL_OK, 0);
      L->st->stats.seconds_wait += sl__now_s() - t0;
      if (st != SL_OK) goto out_fail;
    }
  }
  if ((st = retire_until(L, L->nxfers)) != SL_OK) goto out_fail;
  stop_reader(L);
  L->st->stats.seconds_read += L->read_seconds;
  /* A stream-ordered data collective may report a failure of its last operations only at its
   * next call (an NCCL watchdog's abort lets the stream drain): its barrier is that call. */
  if (!(ctx->data->flags & SL_COLL_SYNC) && L->o.read_mode == SL_READ_RANK0 && L->nxfers &&
      (st = ctx->data->barrier(ctx->data_comm)) != SL_OK)
    return st;
  return SL_OK;
out_fail:
  stop_reader(L);
  return st;
}

void sl__loader_data_release(loader *L) {
  sl_context *ctx = L->ctx;
  stop_reader(L);
  /* Nothing may still run on staging that is about to be freed. What this wait reports (a
   * sticky error of the streams, reported again) is not what sl_load returns: it must not
   * replace the message of the status that is returned (a lost peer's, say), or the status
   * and the message would tell of two different failures. */
  if (L->s_copy || L->s_comm) {
    char keep[SL__ERRMSG_LEN];
    memcpy(keep, ctx->errmsg, sizeof keep);
    ctx->be->synchronize(ctx->be_ctx);
    memcpy(ctx->errmsg, keep, sizeof keep);
  }
  if (L->g_pair_b) ctx->data->fini(L->g_pair_b);
  if (L->g_pair_a) ctx->data->fini(L->g_pair_a);
  if (L->g_shard0) ctx->data->fini(L->g_shard0);
  for (int i = 0; i < SL__MAX_SLOTS; i++) {
    slot *s = &L->slots[i];
    if (s->host) sl_free(ctx, SL_DEVICE_CPU, L->host_pinned, s->host);
    if (s->dev) ctx->be->free_device(ctx->be_ctx, s->dev);
    if (s->ev_copy) ctx->be->event_destroy(ctx->be_ctx, s->ev_copy);
    if (s->ev_comm) ctx->be->event_destroy(ctx->be_ctx, s->ev_comm);
  }
  if (L->s_copy) ctx->be->stream_destroy(ctx->be_ctx, L->s_copy);
  if (L->s_comm) ctx->be->stream_destroy(ctx->be_ctx, L->s_comm);
  free(L->counts);
  free(L->displs);
  free(L->group);
  free(L->regions);
  free(L->part_off);
  free(L->group_of_key);
  free(L->finish);
  free(L->pieces);
  free(L->xfers);
}

