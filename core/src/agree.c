/* Agreement on a caller's outcome across the ranks of a context: the step a job takes after
 * work done outside the library (writing a dump, checking a result), so that no rank reports
 * success while another failed. The same shape as the loader's agreements (loader.c): one
 * fixed-size record per rank through the context's allgather, bounded by the context's
 * timeout like every collective. See docs/DESIGN.md#data-flow. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Room for the message of one rank; a longer one is cut (the failing rank has the whole of
 * it in its own context and prints it itself). */
#define AGREE_MSG 496

typedef struct agree_rec {
  int32_t status;
  int32_t rank;
  char msg[AGREE_MSG];
} agree_rec;

SL_API sl_status sl_context_set_error(sl_context *ctx, sl_status s, const char *msg) {
  if (!ctx) return SL_ERR_INVALID;
  return sl__fail(ctx, s, "%s", msg ? msg : "");
}

SL_API sl_status sl_context_agree(sl_context *ctx, sl_status local) {
  if (!ctx) return SL_ERR_INVALID;
  if (ctx->world_size <= 1 || !ctx->coll || !ctx->comm) {
    if (ctx->world_size > 1)
      return sl__fail(ctx, SL_ERR_INVALID, "sl_context_agree: the context has no collective");
    if (local != SL_OK) {
      char msg[SL__ERRMSG_LEN];
      snprintf(msg, sizeof msg, "%s", ctx->errmsg[0] ? ctx->errmsg : sl_strerror(local));
      sl__fail(ctx, local, "rank %d: %s", ctx->rank, msg);
    }
    return local;
  }
  agree_rec mine;
  memset(&mine, 0, sizeof mine);
  mine.status = (int32_t)local;
  mine.rank = ctx->rank;
  if (local != SL_OK) {
    const char *m = ctx->errmsg[0] ? ctx->errmsg : sl_strerror(local);
    snprintf(mine.msg, sizeof mine.msg, "%.*s", (int)sizeof mine.msg - 1, m);
  }
  agree_rec *all = calloc((size_t)ctx->world_size, sizeof *all);
  if (!all) return sl__fail(ctx, SL_ERR_NOMEM, "cannot allocate the agreement table of %d ranks", ctx->world_size);
  sl_status st = ctx->coll->allgather(ctx->comm, &mine, all, sizeof mine);
  if (st != SL_OK) {
    /* the collective's own message (a timeout, a lost peer) says what went wrong */
    free(all);
    return st;
  }
  for (int r = 0; r < ctx->world_size; r++) {
    if (all[r].status == SL_OK) continue;
    sl_status s = (sl_status)all[r].status;
    /* a status this version of the library does not know is still a failure */
    if (s <= SL_OK || s >= SL_STATUS_COUNT_) s = SL_ERR_PEER;
    all[r].msg[AGREE_MSG - 1] = 0;
    sl__fail(ctx, s, "rank %d: %s", r, all[r].msg);
    free(all);
    return s;
  }
  free(all);
  return SL_OK;
}
