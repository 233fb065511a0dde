/* Agreements of sl_load over the control plane (docs/DESIGN.md#data-flow): every rank ends each
 * phase with the same verdict, and a difference in what ranks would move is named, not hung on.
 * What the ranks compare lives here too: the digest of the plan, the options and the jobs, and
 * the canonical text that names the first difference when the digests differ. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"
#include "ranks_agree.h"

/* ---- what the ranks compare ------------------------------------------------------------- */
static uint64_t mix64(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 29);
}

void sl__loader_digest(loader *L) {
  uint64_t h = sl__plan_digest(L->plan), t = 0;
  h = mix64(h, (uint64_t)L->o.cpu_offload);
  h = mix64(h, (uint64_t)L->o.strategy);
  h = mix64(h, (uint64_t)L->o.read_mode);
  h = mix64(h, (uint64_t)L->o.staging_bytes);
  h = mix64(h, (uint64_t)L->o.pipeline_slots);
  h = mix64(h, (uint64_t)(L->o.read_mode == SL_READ_READERS ? L->o.readers : 0));
  h = mix64(h, (uint64_t)sl__loader_rounds(L)); /* it sizes the slots, so the schedule */
  for (size_t i = 0; i < L->njobs; i++) {
    const tensor_job *j = &L->jobs[i];
    h = mix64(h, j->src_index);
    h = mix64(h, (uint64_t)j->res.dtype);
    for (int m = 0; m < L->mesh_ndim; m++)
      h = mix64(h, (uint64_t)(j->res.placements[m].kind * 64 + j->res.placements[m].dim));
    /* the tensor as this rank's table has it: a copy's table is its own parse (source_dist.c),
     * so two copies whose headers only hash alike differ here, before any byte moves */
    t = mix64(t, j->src_index);
    t = mix64(t, (uint64_t)j->src->dtype);
    t = mix64(t, j->src->file_offset);
    t = mix64(t, j->src->nbytes);
    t = mix64(t, (uint64_t)j->src->ndim);
    for (int d = 0; d < j->src->ndim; d++) t = mix64(t, (uint64_t)j->src->shape[d]);
  }
  L->agreed.digest = h;
  L->agreed.table = t;
}

/* Canonical text of everything that decides data movement: the plan plus the load options. */
static char *load_canonical(const sl_plan *plan, const sl_load_options *o) {
  char *p = sl__plan_canonical(plan), *out = NULL;
  if (!p) return NULL;
  if (asprintf(&out, "%scpu_offload %d\nstrategy %d\nread_mode %d\nstaging %zu\npipeline_slots %d\nreaders %d\n", p,
               (int)o->cpu_offload, (int)o->strategy, (int)o->read_mode, o->staging_bytes, o->pipeline_slots,
               o->read_mode == SL_READ_READERS ? o->readers : 0) < 0)
    out = NULL;
  free(p);
  return out;
}

/* ---- agreement ---------------------------------------------------------------------------- */
/* Finds the first line where A and B differ and writes it (from B) into OUT. */
static void first_difference(const char *a, const char *b, int rank_b, char *out, size_t len) {
  while (*a && *b) {
    const char *ea = strchr(a, '\n'), *eb = strchr(b, '\n');
    size_t la = ea ? (size_t)(ea - a) : strlen(a), lb = eb ? (size_t)(eb - b) : strlen(b);
    if (la != lb || memcmp(a, b, la) != 0) {
      snprintf(out, len, "rank 0 has '%.*s', rank %d '%.*s'", (int)(la > 200 ? 200 : la), a, rank_b,
               (int)(lb > 200 ? 200 : lb), b);
      return;
    }
    a += la + (ea != NULL);
    b += lb + (eb != NULL);
  }
  snprintf(out, len, "rank %d's plan is %s", rank_b, *a ? "shorter" : "longer");
}

/* Every rank contributes its local status and a digest of what decides data movement; all
 * return the first failing rank's status (with its message) or SL_ERR_MISMATCH naming the
 * first difference, or SL_OK together. Each rank also tells its backend's maximum allocation
 * (SL_EXT_MAX_ALLOC), and every rank keeps the smallest (agreed.alloc_cap): staging slots are sized
 * under it alike on every rank, so that all schedule the same transfers. */
sl_status sl__loader_agree(loader *L, sl_status local, const char *phase) {
  uint64_t digest = L->agreed.digest;
  sl_context *ctx = L->ctx;
  uint64_t facts[SL__AGREE_FACTS] = {digest, sl__backend_max_alloc(ctx), L->agreed.table}, *table = NULL;
  sl_status st = sl__agree(ctx, local, facts, phase, &table);
  if (st != SL_OK) return st;
  loader_agreed *a = &L->agreed;
  a->alloc_cap = 0;
  for (int r = 0; r < ctx->world_size; r++) {
    uint64_t cap = table[(size_t)r * SL__AGREE_FACTS + 1];
    if (cap && (!a->alloc_cap || cap < a->alloc_cap)) a->alloc_cap = cap;
  }
  int bad = sl__agree_first_differing(ctx, table, 0);
  int bad_table = bad < 0 ? sl__agree_first_differing(ctx, table, 2) : -1;
  free(table);
  if (bad_table >= 0)
    return sl__fail(ctx, SL_ERR_MISMATCH,
                    "rank %d's copy of the checkpoint holds another tensor table than rank 0's (the same plan, "
                    "and headers whose digests are equal: two different headers of one XXH3 digest?); give "
                    "every rank the same checkpoint",
                    bad_table);
  if (bad < 0) return SL_OK;
  /* Ranks disagree on what to move (different plan, dtype or options: the mismatch that
   * deadlocks broadcast-based loaders). Name the first difference on every rank. */
  char *ref = L->rank == 0 ? load_canonical(L->plan, &L->o) : NULL;
  st = sl__bcast_text(ctx, &ref, 0);
  char *diff = NULL;
  if (L->rank == bad) {
    char *own = load_canonical(L->plan, &L->o);
    diff = malloc(512);
    if (own && ref && diff) first_difference(ref, own, bad, diff, 512);
    else if (diff) snprintf(diff, 512, "(out of memory describing it)");
    free(own);
  }
  free(ref);
  sl_status ds = sl__bcast_text(ctx, &diff, bad);
  if (st == SL_OK) st = ds;
  if (st == SL_OK)
    st = sl__fail(ctx, SL_ERR_MISMATCH,
                  "rank %d's load plan differs from rank 0's: %s; every rank must pass the same plan, "
                  "dtype and load options",
                  bad, diff ? diff : "?");
  free(diff);
  return st;
}

/* Every-rank reads: each rank reads its own copy of the files (its own path when it could open
 * the checkpoint itself, see source_dist.c), so before the data phase every rank proves that
 * its copy matches rank 0's: the header bytes and a fingerprint of sampled data blocks of every
 * file (what this catches and what it does not: docs/DESIGN.md#identity). One
 * combined digest per rank crosses the network whatever the file count; only on a mismatch
 * does rank 0 send its per-file table (16 bytes a file, in fixed pieces) so that the differing
 * rank can name the first file that differs. */
#define FP_PIECE 256 /* files per broadcast piece */

typedef struct fp_verdict {
  uint64_t file;
  int32_t header; /* 1: the header bytes differ; 0: only the sampled data */
  int32_t found;
} fp_verdict;

sl_status sl__loader_agree_files(loader *L, sl_status local) {
  sl_context *ctx = L->ctx;
  /* with distributed readers only the readers read: theirs are the copies compared */
  const bool readers = L->o.read_mode == SL_READ_READERS, reads = !readers || L->my_reader >= 0;
  size_t nf = sl__source_file_count(L->src);
  uint64_t *fp = local == SL_OK ? calloc(nf ? 2 * nf : 1, sizeof *fp) : NULL;
  if (local == SL_OK && !fp) local = sl__fail(ctx, SL_ERR_NOMEM, "out of memory fingerprinting %zu files", nf);
  uint64_t combined = 0;
  if (local == SL_OK && reads) local = sl__source_fingerprint_all(L->src, &combined, fp);
  uint64_t facts[SL__AGREE_FACTS] = {combined, nf}, *table = NULL;
  sl_status st = sl__agree(ctx, local, facts,
                           readers ? "checking every reader's copy of the checkpoint"
                                   : "checking every rank's copy of the checkpoint",
                           &table);
  if (st != SL_OK) goto out_free;
  int bad = -1;
  if (!readers) bad = sl__agree_first_differing(ctx, table, 0);
  for (int i = 1; readers && i < L->nreaders && bad < 0; i++) {
    int r = L->reader_rank[i];
    if (table[(size_t)r * SL__AGREE_FACTS] != table[0]) bad = r;
  }
  uint64_t nf0 = table[1];
  free(table);
  if (bad < 0) goto out_free;
  /* rank 0's table in pieces; the differing rank compares each piece as it arrives */
  fp_verdict v = {0, 0, 0};
  uint64_t fps[2 * FP_PIECE];
  for (uint64_t f0 = 0; f0 < nf0 && st == SL_OK; f0 += FP_PIECE) {
    size_t n = nf0 - f0 < FP_PIECE ? (size_t)(nf0 - f0) : FP_PIECE;
    if (L->rank == 0) memcpy(fps, fp + 2 * f0, n * 2 * sizeof *fp);
    st = sl__ctl_broadcast(ctx, fps, n * 2 * sizeof *fps, 0);
    for (size_t i = 0; st == SL_OK && L->rank == bad && !v.found && i < n; i++) {
      uint64_t f = f0 + i;
      if (f >= nf || fps[2 * i] != fp[2 * f] || fps[2 * i + 1] != fp[2 * f + 1])
        v = (fp_verdict){f, f >= nf || fps[2 * i] != fp[2 * f], 1};
    }
  }
  if (st == SL_OK && L->rank == bad && !v.found) v = (fp_verdict){nf0, 1, 1}; /* rank bad has more files */
  if (st == SL_OK) st = sl__ctl_broadcast(ctx, &v, sizeof v, bad);
  if (st != SL_OK) goto out_free;
  const char *name = v.file < nf ? sl__source_file_name(L->src, (size_t)v.file) : NULL;
  st = sl__fail(ctx, SL_ERR_MISMATCH,
                "%s: rank %d reads a different copy of this file than rank 0 (%s differ%s); %s needs the same bytes "
                "on every %s: replace rank %d's copy with rank 0's (check for a partial or modified download), or "
                "let rank 0 read alone (read mode rank0, --source rank0)",
                name ? name : "(a file rank 0 does not have)", bad,
                v.header ? "the safetensors headers" : "sampled tensor data blocks",
                v.header ? "" : " while the headers are identical", readers ? "reading by distributed readers" : "every-rank reading",
                readers ? "reader" : "rank", bad);
out_free:
  free(fp);
  return st;
}

