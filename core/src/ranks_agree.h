/* Agreement across ranks: the one place where ranks exchange a status, its message and the
 * facts that must match, so that every rank ends a phase with the same verdict
 * (docs/DESIGN.md#data-flow). Used by sl_source_open (job identity) and sl_load (plan, files,
 * closing). */
#ifndef SHARDLOAD_RANKS_AGREE_H
#define SHARDLOAD_RANKS_AGREE_H

#include "internal.h"

#define SL__AGREE_FACTS 4 /* facts per rank; unused ones are 0 */

/* Collective. Every rank contributes LOCAL (with the context's message when it is not OK) and
 * FACTS (SL__AGREE_FACTS values, or NULL for none). When some rank failed, every rank returns
 * the first failing rank's status; the others' message reads "rank R failed in PHASE: ...",
 * the failing rank keeps its own. When all succeeded, returns SL_OK and, if TABLE is given,
 * hands every rank's facts to the caller to judge (rank-major, world x SL__AGREE_FACTS,
 * malloc'd; the caller frees). */
sl_status sl__agree(sl_context *ctx, sl_status local, const uint64_t *facts, const char *phase,
                    uint64_t **table);
/* The first rank whose fact K differs from rank 0's in TABLE, or -1. */
int sl__agree_first_differing(const sl_context *ctx, const uint64_t *table, int k);
/* Collective. ROOT's status (and message) on every rank: for a step only ROOT can fail, such
 * as rank 0's read of a chunk, before the data of that step moves. */
sl_status sl__share_root_status(sl_context *ctx, sl_status local, int root);
/* Collective. ROOT's NUL-terminated *TEXT to every rank; the others receive a malloc'd copy
 * in *TEXT (NULL and SL_ERR_NOMEM when they could not allocate it: they still take part in
 * every step, so ROOT is never left waiting). */
sl_status sl__bcast_text(sl_context *ctx, char **text, int root);

/* ---- checkpoint identity (source_dist.c) -------------------------------------------------- */
/* Fingerprints every file of SRC as this rank reads it (sl__source_file_fingerprint; SRC must
 * have its files open) and combines them in file order into *COMBINED; PER_FILE, when given,
 * receives the 2 x file-count values. Every rank combines the same way, so equal bytes give
 * equal values. */
sl_status sl__source_fingerprint_all(sl_source *src, uint64_t *combined, uint64_t *per_file);

#endif
