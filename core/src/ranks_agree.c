/* Agreement across ranks (see ranks_agree.h). Fixed-size records, so one allgather serves any
 * world; messages are cut to what fits a record, texts of any length go by sl__bcast_text. All
 * of it runs on the control plane (host memory, synchronous; docs/DESIGN.md#modules), never on
 * the data collective, which may move device memory only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ranks_agree.h"

#define AGREE_MSG 472

typedef struct agree_rec {
  int32_t status;
  int32_t rank;
  uint64_t facts[SL__AGREE_FACTS];
  char msg[AGREE_MSG];
} agree_rec;

sl_status sl__agree(sl_context *ctx, sl_status local, const uint64_t *facts, const char *phase,
                    uint64_t **table) {
  if (table) *table = NULL;
  int world = ctx->world_size;
  agree_rec mine = {.status = (int32_t)local, .rank = ctx->rank};
  if (facts) memcpy(mine.facts, facts, sizeof mine.facts);
  if (local != SL_OK) snprintf(mine.msg, sizeof mine.msg, "%.*s", (int)sizeof mine.msg - 1, ctx->errmsg);
  agree_rec *all = calloc((size_t)world, sizeof *all);
  if (!all) {
    /* without the table this rank cannot take part; its peers learn of it by timeout */
    return sl__fail(ctx, SL_ERR_NOMEM, "cannot allocate the agreement table of %d ranks in %s", world, phase);
  }
  sl_status st = sl__ctl_allgather(ctx, &mine, all, sizeof mine);
  if (st != SL_OK) goto out_free;
  for (int r = 0; r < world; r++) {
    if (all[r].status == SL_OK) continue;
    st = (sl_status)all[r].status;
    if (r != ctx->rank) {
      all[r].msg[AGREE_MSG - 1] = 0;
      sl__fail(ctx, st, "rank %d failed in %s: %s", r, phase, all[r].msg);
    }
    goto out_free;
  }
  if (table) {
    uint64_t *t = malloc((size_t)world * SL__AGREE_FACTS * sizeof *t);
    if (!t) {
      st = sl__fail(ctx, SL_ERR_NOMEM, "out of memory in %s", phase);
      goto out_free;
    }
    for (int r = 0; r < world; r++) memcpy(t + (size_t)r * SL__AGREE_FACTS, all[r].facts, sizeof all[r].facts);
    *table = t;
  }
out_free:
  free(all);
  return st;
}

int sl__agree_first_differing(const sl_context *ctx, const uint64_t *table, int k) {
  for (int r = 1; r < ctx->world_size; r++)
    if (table[(size_t)r * SL__AGREE_FACTS + (size_t)k] != table[k]) return r;
  return -1;
}

/* The same record as sl__agree's, broadcast from ROOT instead of gathered from all: one record
 * shape for every status and message the ranks exchange. */
sl_status sl__share_root_status(sl_context *ctx, sl_status local, int root) {
  if (ctx->world_size == 1) return local;
  agree_rec c = {.status = (int32_t)local, .rank = root};
  if (ctx->rank == root && local != SL_OK) snprintf(c.msg, sizeof c.msg, "%.*s", (int)sizeof c.msg - 1, ctx->errmsg);
  sl_status st = sl__ctl_broadcast(ctx, &c, sizeof c, root);
  if (st != SL_OK) return st;
  if (c.status != SL_OK && ctx->rank != root) {
    c.msg[sizeof c.msg - 1] = 0;
    return sl__fail(ctx, (sl_status)c.status, "rank %d: %s", root, c.msg);
  }
  return (sl_status)c.status;
}

/* In pieces of a fixed size, so that a rank that cannot allocate the text still receives
 * every piece (into a scratch buffer) and the root never waits on it. */
#define TEXT_PIECE 4096

sl_status sl__bcast_text(sl_context *ctx, char **text, int root) {
  bool is_root = ctx->rank == root;
  uint64_t len = is_root ? (*text ? strlen(*text) : 0) + 1 : 0;
  sl_status st = sl__ctl_broadcast(ctx, &len, sizeof len, root);
  if (st != SL_OK) return st;
  char *buf = is_root ? *text : malloc((size_t)len);
  char scratch[TEXT_PIECE];
  for (uint64_t off = 0; off < len && st == SL_OK; off += TEXT_PIECE) {
    size_t n = len - off < TEXT_PIECE ? (size_t)(len - off) : TEXT_PIECE;
    char *piece = buf ? buf + off : scratch;
    if (is_root && !*text) piece = (char *)"";
    st = sl__ctl_broadcast(ctx, piece, n, root);
  }
  if (is_root) return st;
  if (st != SL_OK || !buf) {
    free(buf);
    *text = NULL;
    return st != SL_OK ? st : sl__fail(ctx, SL_ERR_NOMEM, "cannot allocate %llu bytes of rank %d's text",
                                       (unsigned long long)len, root);
  }
  buf[len - 1] = 0;
  *text = buf;
  return SL_OK;
}
