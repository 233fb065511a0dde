/* Agreement on a caller's outcome across the ranks of a context: the step a job takes after
 * work done outside the library (writing a dump, checking a result), so that no rank reports
 * success while another failed. It is the loader's agreement (sl__agree, ranks_agree.c),
 * bounded by the context's timeout like every collective, with the wording the public API
 * documents. See docs/DESIGN.md#data-flow. */
#include <stdio.h>

#include "internal.h"
#include "ranks_agree.h"

#define AGREE_PHASE "the caller's step"

SL_API sl_status sl_context_set_error(sl_context *ctx, sl_status s, const char *msg) {
  if (!ctx) return SL_ERR_INVALID;
  return sl__fail(ctx, s, "%s", msg ? msg : "");
}

SL_API sl_status sl_context_agree(sl_context *ctx, sl_status local) {
  if (!ctx) return SL_ERR_INVALID;
  /* even with one rank, where there is nobody to wait for: an aborted context agrees on nothing */
  if (__atomic_load_n(&ctx->aborted, __ATOMIC_ACQUIRE))
    return sl__fail(ctx, SL_ERR_COMM, "sl_context_agree: the context was aborted (sl_context_abort); destroy it");
  if (ctx->world_size > 1 && (!ctx->ctl || !ctx->ctl_comm))
    return sl__fail(ctx, SL_ERR_INVALID, "sl_context_agree: the context has no control plane");
  /* A failing rank's record already reads "rank R: message", the form every rank reports. */
  if (local != SL_OK)
    sl__fail(ctx, local, "rank %d: %s", ctx->rank, ctx->errmsg[0] ? ctx->errmsg : sl_strerror(local));
  if (ctx->world_size <= 1) return local;
  sl_status s = sl__agree(ctx, local, NULL, AGREE_PHASE, NULL);
  if (s == SL_OK) return SL_OK;
  /* A status this version of the library does not know is still a failure. */
  if (s <= SL_OK || s >= SL_STATUS_COUNT_) s = SL_ERR_PEER;
  /* sl__agree words a lower rank's failure "rank R failed in PHASE: <its record>": keep the
   * record. Otherwise this rank failed lowest (its own record stays) or the collective did
   * (its own message says what went wrong: a timeout, a lost peer). */
  int peer, n = -1;
  if (sscanf(ctx->errmsg, "rank %d failed in " AGREE_PHASE ": %n", &peer, &n) == 1 && n > 0)
    return sl__fail(ctx, s, "%s", ctx->errmsg + n);
  return s;
}
