/* sl_load: the phases (docs/DESIGN.md#data-flow).
 *   phase 1  every rank resolves the plan against the manifest (loader_plan.c); all agree on
 *            OK or on the first error before anything is allocated or any byte moves
 *            (loader_agree.c); every-rank reads also agree on the files; then shards are bound
 *            or allocated and the ranks agree again;
 *   phase 2  the pipelined data path (loader_data.c) over the schedule (loader_xfer.c);
 *   closing  every rank returns OK only if every rank placed every byte. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loader.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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
      L->o.read_mode > SL_READ_EVERY_RANK)
    return sl__fail(ctx, SL_ERR_INVALID, "sl_load: cpu_offload, strategy or read_mode out of range");
  if (L->o.pipeline_slots < 0 || L->o.pipeline_slots > SL__MAX_SLOTS)
    return sl__fail(ctx, SL_ERR_INVALID, "sl_load: pipeline_slots is %d; use 0 (default %d) to %d", L->o.pipeline_slots,
                    SL__DEFAULT_SLOTS, SL__MAX_SLOTS);
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
  double t0 = now_s();
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
  if ((st = sl__loader_agree(&L, st, "planning")) != SL_OK) goto out_fail;
  if (L.o.read_mode == SL_READ_EVERY_RANK) {
    /* opens a manifest-built source's files; OK at once where they are open (rank 0); refuses a
     * source in rank 0's memory on every rank, world 1 included, with a message saying so */
    st = sl__source_open_files(src);
    /* alone, a rank has no one to compare its copy with */
    if (L.world > 1 && (st = sl__loader_agree_files(&L, st)) != SL_OK) goto out_fail;
    if (st != SL_OK) goto out_fail;
  }
  /* the caller's bind sees a tensor only from here on: every failure above leaves its
   * buffers untouched (the contract at sl_bind_fn) */
  st = sl__loader_bind(&L);
  if ((st = sl__loader_agree(&L, st, "preparation (binding and allocating shards)")) != SL_OK) goto out_fail;
  L.st->stats.seconds_phase1 = now_s() - t0;

  /* phase 2: the data path */
  if ((st = sl__loader_data(&L)) != SL_OK) {
    /* the data plane failed, so the job did. A device data plane may still run operations on
     * this rank's staging (an NCCL kernel waiting for a lost peer): abort it before the staging
     * is freed, so that nothing writes into freed memory and the peers fail at once. The
     * context's data plane is then unusable: destroy the context (sl_load's contract). */
    if (L.data_started && !ctx->data_is_ctl && SL_HAS_OP(ctx->data, abort)) ctx->data->abort(ctx->data_comm);
    goto out_fail;
  }
  /* the shards are complete only once the streams drained: wherever the data path ordered its
   * work on streams (a real device, or the device route on a host-memory backend) */
  if (L.deferred == SL_OK && (L.s_copy || L.s_comm) && (st = ctx->be->synchronize(ctx->be_ctx)) != SL_OK)
    sl__loader_defer(&L, NULL, st);
  if (L.deferred == SL_OK && (st = sl__state_index(L.st)) != SL_OK) {
    L.deferred = st;
    snprintf(L.deferred_msg, sizeof L.deferred_msg, "out of memory indexing the state");
  }
  /* the closing agreement: every rank returns OK only if every rank placed every byte */
  if (L.deferred != SL_OK) sl__fail(ctx, L.deferred, "%s", L.deferred_msg);
  if ((st = sl__loader_agree(&L, L.deferred, "loading")) != SL_OK) goto out_fail;
  sl__loader_data_release(&L);
  free(L.jobs);
  L.st->stats.seconds = now_s() - t0;
  pthread_mutex_destroy(&L.lock);
  pthread_cond_destroy(&L.cond);
  *out = L.st;
  return SL_OK;

out_fail:
  sl__loader_data_release(&L);
  free(L.jobs);
  sl_state_destroy(L.st);
  pthread_mutex_destroy(&L.lock);
  pthread_cond_destroy(&L.cond);
  return st;
}
