/* sl_load: the phases (docs/DESIGN.md#data-flow).
 *   phase 1  every rank resolves the plan against the manifest (loader_plan.c); all agree on
 *            OK or on the first error before anything is allocated or any byte moves
 *            (loader_agree.c); every-rank reads also agree on the files; then shards are bound
 *            or allocated and the ranks agree again;
 *   phase 2  the pipeline (loader_pipe.c) through the staging slots (loader_stage.c);
 *   closing  every rank returns OK only if every rank placed every byte.
 * Also the rank's own failure in phase 2 (loader.fail) and rank 0's status window. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loader.h"
#include "planes.h"
#include "ranks_agree.h"

/* Rank 0 shares the outcome of its reads once per this many transfers (and at the end), not
 * per chunk: the status round trip stays off the critical path (docs/DESIGN.md#data-flow). */
#define SL__STATUS_WINDOW 16

double sl__now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the rank's own failure ------------------------------------------------------------- */
void sl__loader_defer(loader *L, const char *name, sl_status st) {
  loader_fail *f = &L->fail;
  if (f->deferred != SL_OK) return;
  /* the reader reads no more: later transfers may read straight into caller buffers */
  pthread_mutex_lock(&L->lock);
  f->reader_halt = true;
  pthread_mutex_unlock(&L->lock);
  f->deferred = st;
  if (name) snprintf(f->deferred_msg, sizeof f->deferred_msg, "%.200s: %.800s", name, L->ctx->errmsg);
  else snprintf(f->deferred_msg, sizeof f->deferred_msg, "%s", L->ctx->errmsg);
}

void sl__loader_root_failed(loader *L, sl_status st, const char *msg) {
  loader_fail *f = &L->fail;
  if (f->root_st != SL_OK) return;
  f->root_st = st;
  snprintf(f->root_msg, sizeof f->root_msg, "%s", msg);
  sl__fail(L->ctx, st, "%s", f->root_msg);
  sl__loader_defer(L, NULL, st);
}

bool sl__loader_reader_halted(loader *L) {
  pthread_mutex_lock(&L->lock);
  bool halt = L->fail.reader_halt;
  pthread_mutex_unlock(&L->lock);
  return halt;
}

sl_status sl__loader_status_window(loader *L, size_t k) {
  if (L->o.read_mode == SL_READ_EVERY_RANK || ((k + 1) % SL__STATUS_WINDOW != 0 && k + 1 != L->stage.nxfers))
    return SL_OK;
  sl_context *ctx = L->ctx;
  if (L->nreaders > 1) {
    /* every reader's reads of this window, told to every rank (docs/DESIGN.md#readers): each
     * rank's status word, then the first failed reader's message from it */
    double t0 = sl__now_s();
    int32_t mine = L->my_reader >= 0 ? (int32_t)L->fail.root_st : (int32_t)SL_OK;
    sl_status st = sl__ctl_allgather(ctx, &mine, L->fail.window, sizeof mine);
    int bad = -1;
    for (int r = 0; st == SL_OK && r < L->world && bad < 0; r++)
      if (L->fail.window[r] != (int32_t)SL_OK) bad = r;
    if (st == SL_OK && bad >= 0) {
      if (bad == L->rank) sl__fail(ctx, L->fail.root_st, "%s", L->fail.root_msg);
      st = sl__share_root_status(ctx, bad == L->rank ? L->fail.root_st : SL_OK, bad);
    }
    L->st->stats.seconds_wait += sl__now_s() - t0;
    return st;
  }
  /* rank 0's reads of this window, told to every rank (docs/DESIGN.md#data-flow) */
  if (L->rank == 0 && L->fail.root_st != SL_OK) sl__fail(ctx, L->fail.root_st, "%s", L->fail.root_msg);
  double t0 = sl__now_s();
  sl_status st = sl__share_root_status(ctx, L->rank == 0 ? L->fail.root_st : SL_OK, 0);
  L->st->stats.seconds_wait += sl__now_s() - t0;
  return st;
}

/* ---- sl_load ---------------------------------------------------------------------------- */

/* The argument checks of sl_load; fills L's options, placement decision and empty state. */
static sl_status check_args(loader *L, const sl_load_options *opts, sl_state **out) {
  sl_context *ctx = L->ctx;
  if (!L->plan || !L->src || !out) return sl__fail(ctx, SL_ERR_INVALID, "sl_load: plan, source and out are required");
  if (opts && opts->size < sizeof(size_t))
    return sl__fail(ctx, SL_ERR_INVALID, "sl_load: options.size is %zu; set it to sizeof(sl_load_options)", opts->size);
  if (sl__plan_context(L->plan) != ctx)
    return sl__fail(ctx, SL_ERR_INVALID, "sl_load: the plan belongs to another context");
  sl__copy_sized(&L->o, sizeof L->o, opts, opts ? opts->size : 0);
  if (L->o.cpu_offload > SL_CPU_OFFLOAD_OFF || L->o.strategy > SL_STRATEGY_BROADCAST ||
      L->o.read_mode > SL_READ_READERS)
    return sl__fail(ctx, SL_ERR_INVALID, "sl_load: cpu_offload, strategy or read_mode out of range");
  if (L->o.pipeline_slots < 0 || L->o.pipeline_slots > SL__MAX_SLOTS)
    return sl__fail(ctx, SL_ERR_INVALID, "sl_load: pipeline_slots is %d; use 0 (default %d) to %d", L->o.pipeline_slots,
                    SL__DEFAULT_SLOTS, SL__MAX_SLOTS);
  if (L->o.read_mode == SL_READ_READERS && (L->o.readers < 0 || L->o.readers > L->world))
    return sl__fail(ctx, SL_ERR_INVALID, "sl_load: readers is %d; give 0 (one per host) to the world size %d",
                    L->o.readers, L->world);
  if (L->o.staging_bytes == 0) L->o.staging_bytes = SL__DEFAULT_STAGING;
  if (L->o.staging_bytes < SL__MIN_STAGING) L->o.staging_bytes = SL__MIN_STAGING;
  sl_status st = sl_resolve_placement(L->o.cpu_offload, sl__plan_policy(L->plan), &L->place);
  if (st != SL_OK) return sl__fail(ctx, st, "sl_load: invalid offload policy");
  if (!(L->st = calloc(1, sizeof *L->st))) return sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
  L->st->stats.size = sizeof L->st->stats;
  return SL_OK;
}

SL_API sl_status sl_load(sl_context *ctx, sl_plan *plan, sl_source *src, const sl_load_options *opts,
                         sl_state **out) {
  if (!ctx) return SL_ERR_INVALID;
  if (out) *out = NULL;
  double t0 = sl__now_s();
  loader L = {.ctx = ctx, .plan = plan, .src = src, .rank = ctx->rank, .world = ctx->world_size};
  pthread_mutex_init(&L.lock, NULL);
  pthread_cond_init(&L.cond, NULL);
  sl_status st = check_args(&L, opts, out);
  /* A caller error on one rank is a phase-1 failure like any other: the rank still takes part
   * in the planning agreement, so the others fail at once with its message instead of waiting
   * in it until they time out or lose the rank. */
  if (st != SL_OK) {
    st = sl__loader_agree(&L, st, "planning");
    goto out_fail;
  }
  L.pinned = L.place.pin_memory && sl__has_pinned(ctx);
  L.st->be = ctx->beref;
  sl__backend_ref_get(ctx->beref);

  /* phase 1: metadata, plan, agreement — nothing is allocated or bound before all agree */
  st = sl__loader_plan(&L);
  if (st == SL_OK) st = sl__loader_readers(&L);
  if (st == SL_OK) sl__loader_digest(&L); /* what the agreements compare */
  if ((st = sl__loader_agree(&L, st, "planning")) != SL_OK) goto out_fail;
  if (L.o.read_mode == SL_READ_EVERY_RANK || (L.o.read_mode == SL_READ_READERS && L.nreaders > 1)) {
    /* opens a manifest-built source's files; OK at once where they are open (rank 0, and every
     * rank that opened its own copy); refuses a source in rank 0's memory on every rank (every
     * reader), world 1 included, with a message saying so. With distributed readers only the
     * readers open them, and only their copies are compared; one reader is rank-0 reads (a
     * source in rank 0's memory included). */
    bool readers = L.o.read_mode == SL_READ_READERS;
    st = !readers || L.my_reader >= 0 ? sl__source_open_files(src, readers) : SL_OK;
    /* alone, a rank has no one to compare its copy with */
    if (L.world > 1 && (st = sl__loader_agree_files(&L, st)) != SL_OK) goto out_fail;
    if (st != SL_OK) goto out_fail;
  }
  /* the caller's bind sees a tensor only from here on: every failure above leaves its
   * buffers untouched (the contract at sl_bind_fn) */
  st = sl__loader_bind(&L);
  if ((st = sl__loader_agree(&L, st, "preparation (binding and allocating shards)")) != SL_OK) goto out_fail;
  L.st->stats.seconds_phase1 = sl__now_s() - t0;

  /* phase 2: the data path */
  if ((st = sl__loader_pipe(&L)) != SL_OK) {
    /* the data plane failed, so the job did. A device data plane may still run operations on
     * this rank's staging (an NCCL kernel waiting for a lost peer): abort it before the staging
     * is freed, so that nothing writes into freed memory and the peers fail at once. The
     * context's data plane is then unusable: destroy the context (sl_load's contract). A
     * synchronous one (shm) has nothing pending once its op returned, and breaks by itself
     * when an op failed: it is left as it is, so that a failure that was only the caller's (a
     * progress callback) leaves the context loading again, as with Gloo. */
    if (L.pipe.data_started && !ctx->data_is_ctl && !(ctx->data->flags & SL_COLL_SYNC) && SL_HAS_OP(ctx->data, abort))
      ctx->data->abort(ctx->data_comm);
    if (L.pipe.data_started) sl__planes_note_lost(ctx);
    goto out_fail;
  }
  /* the shards are complete only once the streams drained: wherever the data path ordered its
   * work on streams (a real device, or the device route on a host-memory backend) */
  loader_fail *f = &L.fail;
  if (f->deferred == SL_OK && (L.stage.s_copy || L.stage.s_comm) && (st = ctx->be->synchronize(ctx->be_ctx)) != SL_OK)
    sl__loader_defer(&L, NULL, st);
  if (f->deferred == SL_OK && (st = sl__state_index(L.st)) != SL_OK) {
    f->deferred = st;
    snprintf(f->deferred_msg, sizeof f->deferred_msg, "out of memory indexing the state");
  }
  /* the closing agreement: every rank returns OK only if every rank placed every byte */
  if (f->deferred != SL_OK) sl__fail(ctx, f->deferred, "%s", f->deferred_msg);
  if ((st = sl__loader_agree(&L, f->deferred, "loading")) != SL_OK) goto out_fail;
  sl__loader_pipe_release(&L);
  free(L.jobs);
  free(L.reader_rank);
  L.st->stats.seconds = sl__now_s() - t0;
  pthread_mutex_destroy(&L.lock);
  pthread_cond_destroy(&L.cond);
  *out = L.st;
  return SL_OK;

out_fail:
  sl__loader_pipe_release(&L);
  free(L.jobs);
  free(L.reader_rank);
  sl_state_destroy(L.st);
  pthread_mutex_destroy(&L.lock);
  pthread_cond_destroy(&L.cond);
  return st;
}
