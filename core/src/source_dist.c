/* Phase 1 across ranks: rank 0 alone reads and validates the checkpoint's headers (the
 * RAM-efficient path: other ranks need not even see the files), then broadcasts a manifest;
 * every rank builds its source from it. Every rank returns rank 0's error when it had one,
 * quickly, instead of waiting in a collective that will never come. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct open_verdict {
  int32_t status;
  uint32_t pad;
  uint64_t manifest_len;
  char msg[496];
} open_verdict;

SL_API sl_status sl_source_open(sl_context *ctx, const char *path, sl_source **out) {
  if (!ctx) return SL_ERR_INVALID;
  if (!out) return sl__fail(ctx, SL_ERR_INVALID, "sl_source_open: out is NULL");
  *out = NULL;
  if (ctx->world_size == 1) return sl__source_open_local(ctx, path, out);

  sl_source *src = NULL;
  void *manifest = NULL;
  open_verdict v = {0};
  if (ctx->rank == 0) {
    sl_status st = sl__source_open_local(ctx, path, &src);
    if (st == SL_OK) st = sl__source_serialize(src, &manifest, &v.manifest_len);
    if (st == SL_OK && v.manifest_len == 0) st = sl__fail(ctx, SL_ERR_FORMAT, "empty manifest");
    v.status = (int32_t)st;
    if (st != SL_OK) snprintf(v.msg, sizeof v.msg, "%.*s", (int)sizeof v.msg - 1, ctx->errmsg);
  }
  sl_status st = ctx->coll->broadcast(ctx->comm, &v, sizeof v, 0);
  if (st != SL_OK) goto out_free;
  if (v.status != SL_OK) {
    st = (sl_status)v.status;
    if (ctx->rank != 0) {
      v.msg[sizeof v.msg - 1] = 0;
      sl__fail(ctx, st, "rank 0: %s", v.msg);
    }
    goto out_free;
  }
  if (ctx->rank != 0 && !(manifest = malloc(v.manifest_len))) {
    /* still take part in the broadcast below so rank 0 is not left waiting, then fail */
    st = sl__fail(ctx, SL_ERR_NOMEM, "cannot allocate a %llu-byte manifest", (unsigned long long)v.manifest_len);
  }
  char small[1];
  sl_status bs = ctx->coll->broadcast(ctx->comm, manifest ? manifest : small,
                                      manifest ? (size_t)v.manifest_len : 0, 0);
  if (st == SL_OK) st = bs;
  if (st == SL_OK && ctx->rank != 0) st = sl__source_deserialize(ctx, manifest, (size_t)v.manifest_len, &src);
  if (bs != SL_OK) goto out_free;
  /* agree: a rank that could not take the manifest fails everyone, with its message */
  {
    struct {
      int32_t status;
      char msg[252];
    } mine = {(int32_t)st, ""}, *all = calloc((size_t)ctx->world_size, sizeof mine);
    if (st != SL_OK) snprintf(mine.msg, sizeof mine.msg, "%.*s", (int)sizeof mine.msg - 1, ctx->errmsg);
    if (!all) {
      st = sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
      goto out_free;
    }
    sl_status gs = ctx->coll->allgather(ctx->comm, &mine, all, sizeof mine);
    if (gs != SL_OK) st = gs;
    for (int r = 0; gs == SL_OK && r < ctx->world_size; r++) {
      if (all[r].status == SL_OK) continue;
      st = (sl_status)all[r].status;
      all[r].msg[sizeof all[r].msg - 1] = 0;
      if (r != ctx->rank) sl__fail(ctx, st, "rank %d: %s", r, all[r].msg);
      break;
    }
    free(all);
  }
out_free:
  free(manifest);
  if (st != SL_OK) {
    sl_source_destroy(src);
    return st;
  }
  *out = src;
  return SL_OK;
}
