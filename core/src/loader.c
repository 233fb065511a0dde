/* The loader: phase 1 (every rank resolves the plan against the manifest; all agree on OK or
 * on the first error before any byte moves), then phase 2 (per tensor, in file order, in
 * bounded chunks: read on rank 0 or on every rank, move through the collective, cast on the
 * side that moves fewer bytes, place by the one placement decision).
 *
 * Staging is one host arena of the configured budget, carved per tensor; with the final
 * shards it is all the memory a rank holds, rank 0 included. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loader.h"
#include "ranks_agree.h"

#define SL__DEFAULT_STAGING (64u << 20)
#define SL__MIN_STAGING 4096u

typedef struct tensor_job {
  size_t src_index;
  const sl_source_tensor *src;
  sl__resolved res;
  sl__region mine;
  sl_tensor *out;
  sl_dtype wire; /* dtype on the wire: the smaller of file and parameter dtype */
  bool replicated;
} tensor_job;

typedef struct loader {
  sl_context *ctx;
  sl_plan *plan;
  sl_source *src;
  sl_load_options o;
  sl_placement_decision place;
  bool pinned; /* CPU placements get page-locked memory from the backend */
  int rank, world;
  int mesh_ndim;
  int mesh[SL_MAX_MESH_DIMS];
  int coord[SL_MAX_MESH_DIMS];
  sl_state *st;
  tensor_job *jobs;
  size_t njobs;
  unsigned char *staging;
  size_t staging_bytes;
  bool staging_pinned;
  void *dev_staging; /* device buffer for widening casts done on the device, or NULL */
  /* rank 0's per-rank scratch for scatterv */
  sl__region *regions;
  size_t *counts, *displs;
  int *group; /* first rank with the same region (replicas share packed bytes) */
  int *group_of_key;
  uint64_t total_bytes, done_bytes;
  /* The first failure local to this rank in phase 2 (a copy to the device, a cast, a read in
   * every-rank mode). The rank keeps taking part in every collective so the others are not
   * left waiting, places nothing more, and reports it at the closing agreement. */
  sl_status deferred;
  char deferred_msg[SL__ERRMSG_LEN];
  /* staging carve-up for the current tensor */
  unsigned char *R, *W, *P, *V, *Y;
} loader;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix64(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 29);
}

static uint64_t tensor_elems(const sl_source_tensor *t) {
  uint64_t n = 1; /* the reader checked that this product times the element size fits */
  for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
  return n;
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
 * first difference, or SL_OK together. */
static sl_status agree(loader *L, sl_status local, uint64_t digest, const char *phase) {
  sl_context *ctx = L->ctx;
  uint64_t facts[SL__AGREE_FACTS] = {digest}, *table = NULL;
  sl_status st = sl__agree(ctx, local, facts, phase, &table);
  if (st != SL_OK) return st;
  int bad = sl__agree_first_differing(ctx, table, 0);
  free(table);
  if (bad < 0) return SL_OK;
  /* Ranks disagree on what to move (different plan, dtype or options: the mismatch that
   * deadlocks broadcast-based loaders). Name the first difference on every rank. */
  char *ref = L->rank == 0 ? sl__load_canonical(L->plan, &L->o) : NULL;
  st = sl__bcast_text(ctx, &ref, 0);
  char *diff = NULL;
  if (L->rank == bad) {
    char *own = sl__load_canonical(L->plan, &L->o);
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

/* Rank 0's verdict on a chunk it read, shared before the chunk's data moves so that an I/O
 * error fails every rank at once instead of leaving them waiting in the collective. */
static sl_status share_root_status(loader *L, sl_status local) {
  return sl__share_root_status(L->ctx, local, 0);
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

static sl_status agree_files(loader *L, sl_status local) {
  sl_context *ctx = L->ctx;
  size_t nf = sl__source_file_count(L->src);
  uint64_t *fp = local == SL_OK ? calloc(nf ? 2 * nf : 1, sizeof *fp) : NULL;
  if (local == SL_OK && !fp) local = sl__fail(ctx, SL_ERR_NOMEM, "out of memory fingerprinting %zu files", nf);
  uint64_t combined = 0;
  if (local == SL_OK) local = sl__source_fingerprint_all(L->src, &combined, fp);
  uint64_t facts[SL__AGREE_FACTS] = {combined, nf}, *table = NULL;
  sl_status st = sl__agree(ctx, local, facts, "checking every rank's copy of the checkpoint", &table);
  if (st != SL_OK) goto out_free;
  int bad = sl__agree_first_differing(ctx, table, 0);
  uint64_t nf0 = table[1];
  free(table);
  if (bad < 0) goto out_free;
  /* rank 0's table in pieces; the differing rank compares each piece as it arrives */
  fp_verdict v = {0, 0, 0};
  uint64_t piece[2 * FP_PIECE];
  for (uint64_t f0 = 0; f0 < nf0 && st == SL_OK; f0 += FP_PIECE) {
    size_t n = nf0 - f0 < FP_PIECE ? (size_t)(nf0 - f0) : FP_PIECE;
    if (L->rank == 0) memcpy(piece, fp + 2 * f0, n * 2 * sizeof *fp);
    st = ctx->coll->broadcast(ctx->comm, piece, n * 2 * sizeof *piece, 0);
    for (size_t i = 0; st == SL_OK && L->rank == bad && !v.found && i < n; i++) {
      uint64_t f = f0 + i;
      if (f >= nf || piece[2 * i] != fp[2 * f] || piece[2 * i + 1] != fp[2 * f + 1])
        v = (fp_verdict){f, f >= nf || piece[2 * i] != fp[2 * f], 1};
    }
  }
  if (st == SL_OK && L->rank == bad && !v.found) v = (fp_verdict){nf0, 1, 1}; /* rank bad has more files */
  if (st == SL_OK) st = ctx->coll->broadcast(ctx->comm, &v, sizeof v, bad);
  if (st != SL_OK) goto out_free;
  const char *name = v.file < nf ? sl__source_file_name(L->src, (size_t)v.file) : NULL;
  st = sl__fail(ctx, SL_ERR_MISMATCH,
                "%s: rank %d reads a different copy of this file than rank 0 (%s differ%s); every-rank reading "
                "needs the same bytes on every rank: replace rank %d's copy with rank 0's (check for a partial or "
                "modified download), or let rank 0 read alone (read mode rank0, --source rank0)",
                name ? name : "(a file rank 0 does not have)", bad,
                v.header ? "the safetensors headers" : "sampled tensor data blocks",
                v.header ? "" : " while the headers are identical", bad);
out_free:
  free(fp);
  return st;
}

/* ---- placement of received bytes ---------------------------------------------------------- */
/* Whether bytes can land straight in the shard. Not on a rank that already failed: it keeps
 * taking part in the collectives but places nothing more (the caller-buffer contract at
 * sl_bind_fn), so its bytes go to staging and are dropped. */
static bool host_direct(const loader *L, const tensor_job *j) {
  return j->out->device == SL_DEVICE_CPU && j->wire == j->res.dtype && L->deferred == SL_OK;
}

/* BUF holds COUNT elements of dtype BUF_DT (the wire dtype, or the file's when this rank read
 * them itself) of the local shard starting at local element LA. */
static sl_status place_part(loader *L, tensor_job *j, const void *buf, sl_dtype buf_dt, uint64_t la,
                            uint64_t count) {
  sl_context *ctx = L->ctx;
  if (!count) return SL_OK;
  size_t ep = sl_dtype_size(j->res.dtype);
  unsigned char *dst = (unsigned char *)j->out->data + la * ep;
  sl_status st;
  if (j->out->device == SL_DEVICE_CPU) {
    /* sl_convert refuses non-castable dtypes even as a copy, and F8/integer tensors arrive here */
    if (buf_dt == j->res.dtype) memcpy(dst, buf, count * ep);
    else if ((st = sl_convert(dst, j->res.dtype, buf, buf_dt, count)) != SL_OK) return st;
    return SL_OK;
  }
  const void *from = buf;
  if (buf_dt != j->res.dtype && L->dev_staging && sl_dtype_size(buf_dt) < ep) {
    /* widening cast: move the narrow bytes over the bus and widen on the device */
    size_t eb = sl_dtype_size(buf_dt);
    if ((st = ctx->be->copy_h2d(ctx->be_ctx, L->dev_staging, buf, count * eb)) != SL_OK) return st;
    L->st->stats.bytes_h2d += count * eb;
    return ctx->be->cast_device(ctx->be_ctx, dst, j->res.dtype, L->dev_staging, buf_dt, count);
  }
  if (buf_dt != j->res.dtype) {
    if ((st = sl_convert(L->Y, j->res.dtype, buf, buf_dt, count)) != SL_OK) return st;
    from = L->Y;
  }
  st = ctx->be->copy_h2d(ctx->be_ctx, dst, from, count * ep);
  if (st != SL_OK) return st;
  L->st->stats.bytes_h2d += count * ep;
  return SL_OK;
}

static void defer(loader *L, tensor_job *j, sl_status st) {
  if (L->deferred != SL_OK) return;
  L->deferred = st;
  snprintf(L->deferred_msg, sizeof L->deferred_msg, "%.200s: %.800s", j->src->name, L->ctx->errmsg);
}

/* place_part for data that arrived through a collective: a failure here is this rank's alone */
static sl_status finish_part(loader *L, tensor_job *j, const void *buf, uint64_t la, uint64_t count) {
  if (L->deferred != SL_OK) return SL_OK;
  sl_status st = place_part(L, j, buf, j->wire, la, count);
  if (st != SL_OK) defer(L, j, st);
  return SL_OK;
}

/* ---- rank 0 reads a chunk ----------------------------------------------------------------- */
/* Reads global elements [a, a+n) and converts them to the wire dtype. INTO, when set, is
 * where the bytes should land if no conversion is needed (a world of one reading straight
 * into its shard). */
static sl_status read_chunk(loader *L, tensor_job *j, uint64_t a, uint64_t n, unsigned char *into,
                            const unsigned char **out) {
  size_t ef = sl_dtype_size(j->src->dtype);
  bool convert = j->wire != j->src->dtype;
  unsigned char *dst = into && !convert ? into : L->R;
  sl_status st = sl__source_pread(L->src, j->src_index, a * ef, dst, n * ef);
  if (st != SL_OK) return st;
  L->st->stats.bytes_read += n * ef;
  if (convert) {
    if ((st = sl_convert(L->W, j->wire, L->R, j->src->dtype, n)) != SL_OK) return st;
    *out = L->W;
  } else {
    *out = dst;
  }
  return SL_OK;
}

/* A world of one holds the whole tensor: with host placement and no cast, rank 0 can read
 * straight into its shard and every later copy degenerates to a no-op. */
static unsigned char *solo_target(loader *L, tensor_job *j, uint64_t a) {
  if (L->world != 1 || !host_direct(L, j)) return NULL;
  return (unsigned char *)j->out->data + a * sl_dtype_size(j->res.dtype);
}

/* ---- run bookkeeping ---------------------------------------------------------------------- */
typedef struct run_probe {
  uint64_t first_g, runs;
} run_probe;

static sl_status probe_run(void *user, uint64_t gs, uint64_t ls, uint64_t count) {
  run_probe *p = user;
  if (p->runs++ == 0) p->first_g = gs;
  return p->runs > 1 ? SL_ERR_UNSUPPORTED : SL_OK; /* stop early: two runs mean "pack" */
}

/* Where region R's part of chunk [a, b) lies in the chunk, if it is one contiguous run. */
static bool single_run(const sl__region *r, uint64_t a, uint64_t b, uint64_t *first) {
  run_probe p = {0, 0};
  sl__region_runs(r, a, b, probe_run, &p);
  *first = p.runs ? p.first_g : a;
  return p.runs <= 1;
}

/* ---- phase 2 strategies ------------------------------------------------------------------- */
static sl_status scatter_chunk(loader *L, tensor_job *j, uint64_t a, uint64_t b) {
  sl_context *ctx = L->ctx;
  const uint64_t n = b - a;
  const size_t ew = sl_dtype_size(j->wire), ep = sl_dtype_size(j->res.dtype);
  const unsigned char *S = NULL;
  unsigned char *solo = solo_target(L, j, a);
  sl_status st = L->rank == 0 ? read_chunk(L, j, a, n, solo, &S) : SL_OK;
  if ((st = share_root_status(L, st)) != SL_OK) return st;

  if (j->replicated) {
    /* every rank wants the whole chunk: one broadcast */
    void *buf = L->rank == 0 ? (void *)S : host_direct(L, j) ? (unsigned char *)j->out->data + a * ep : L->V;
    if ((st = ctx->coll->broadcast(ctx->comm, buf, n * ew, 0)) != SL_OK) return st;
    if (L->rank == 0) L->st->stats.bytes_sent += n * ew * (uint64_t)(L->world - 1);
    else L->st->stats.bytes_received += n * ew;
    if ((L->rank != 0 && host_direct(L, j)) || buf == solo) return SL_OK;
    return finish_part(L, j, buf, a, n);
  }

  const void *sendbuf = S;
  if (L->rank == 0) {
    bool pack = false;
    for (int r = 0; r < L->world; r++) {
      uint64_t la = sl__region_rank_of(&L->regions[r], a), lb = sl__region_rank_of(&L->regions[r], b);
      uint64_t first;
      L->counts[r] = (size_t)((lb - la) * ew);
      if (!single_run(&L->regions[r], a, b, &first)) pack = true;
      L->displs[r] = (size_t)((first - a) * ew);
    }
    if (pack) {
      /* regions are either identical (replicas) or disjoint: pack each distinct one once */
      size_t off = 0;
      for (int r = 0; r < L->world; r++) {
        if (L->group[r] != r) {
          L->displs[r] = L->displs[L->group[r]];
          continue;
        }
        sl__region_extract(&L->regions[r], ew, S, a, b, L->P + off);
        L->displs[r] = off;
        off += L->counts[r];
      }
      sendbuf = L->P;
    }
    for (int r = 1; r < L->world; r++) L->st->stats.bytes_sent += L->counts[r];
  }
  uint64_t la = sl__region_rank_of(&j->mine, a), lb = sl__region_rank_of(&j->mine, b);
  uint64_t count = lb - la;
  bool direct = host_direct(L, j);
  /* a world of one receives in place: the local collective then copies nothing */
  void *recv = direct ? (unsigned char *)j->out->data + la * ep
               : L->world == 1 ? (void *)((const unsigned char *)sendbuf + L->displs[0])
                               : L->V;
  st = ctx->coll->scatterv(ctx->comm, sendbuf, L->counts, L->displs, recv, (size_t)(count * ew), 0);
  if (st != SL_OK) return st;
  if (L->rank != 0) L->st->stats.bytes_received += count * ew;
  return direct ? SL_OK : finish_part(L, j, recv, la, count);
}

static sl_status broadcast_chunk(loader *L, tensor_job *j, uint64_t a, uint64_t b) {
  /* Accelerate's algorithm, kept as the baseline: the whole chunk goes to every rank, which
   * keeps its slice. */
  sl_context *ctx = L->ctx;
  const uint64_t n = b - a;
  const size_t ew = sl_dtype_size(j->wire);
  const unsigned char *S = NULL;
  sl_status st = L->rank == 0 ? read_chunk(L, j, a, n, NULL, &S) : SL_OK;
  if ((st = share_root_status(L, st)) != SL_OK) return st;
  unsigned char *buf = L->rank == 0 ? (unsigned char *)S : L->V;
  if ((st = ctx->coll->broadcast(ctx->comm, buf, n * ew, 0)) != SL_OK) return st;
  if (L->rank == 0) L->st->stats.bytes_sent += n * ew * (uint64_t)(L->world - 1);
  else L->st->stats.bytes_received += n * ew;
  uint64_t la = sl__region_rank_of(&j->mine, a), lb = sl__region_rank_of(&j->mine, b), first;
  const unsigned char *part = buf;
  if (single_run(&j->mine, a, b, &first)) {
    part = buf + (first - a) * ew;
  } else {
    sl__region_extract(&j->mine, ew, buf, a, b, L->P);
    part = L->P;
  }
  return finish_part(L, j, part, la, lb - la);
}

typedef struct own_read {
  loader *L;
  tensor_job *j;
} own_read;

static sl_status read_own_run(void *user, uint64_t gs, uint64_t ls, uint64_t count) {
  own_read *o = user;
  loader *L = o->L;
  tensor_job *j = o->j;
  size_t ef = sl_dtype_size(j->src->dtype), ep = sl_dtype_size(j->res.dtype);
  sl_status st;
  if (j->out->device == SL_DEVICE_CPU && j->src->dtype == j->res.dtype) {
    /* straight from storage into the shard: no staging copy */
    st = sl__source_pread(L->src, j->src_index, gs * ef, (unsigned char *)j->out->data + ls * ep, count * ef);
  } else {
    /* nothing crosses the network in this mode: the cast happens here, from the file's dtype */
    st = sl__source_pread(L->src, j->src_index, gs * ef, L->R, count * ef);
    if (st == SL_OK) st = place_part(L, j, L->R, j->src->dtype, ls, count);
  }
  if (st == SL_OK) L->st->stats.bytes_read += count * ef;
  return st;
}

static sl_status load_tensor(loader *L, tensor_job *j) {
  const uint64_t total = tensor_elems(j->src);
  /* carve the arena: R (file dtype), W, P, V (wire dtype), Y (parameter dtype) */
  size_t ef = sl_dtype_size(j->src->dtype), ew = sl_dtype_size(j->wire), ep = sl_dtype_size(j->res.dtype);
  uint64_t chunk = L->staging_bytes / (ef + 3 * ew + ep);
  if (chunk == 0) chunk = 1;
  L->R = L->staging;
  L->W = L->R + chunk * ef;
  L->P = L->W + chunk * ew;
  L->V = L->P + chunk * ew;
  L->Y = L->V + chunk * ew;

  if (L->rank == 0 && !j->replicated && L->o.read_mode == SL_READ_RANK0) {
    /* ranks whose coordinates agree on every sharded mesh dim hold the same region */
    int nkeys = 1;
    for (int m = 0; m < L->mesh_ndim; m++)
      if (j->res.placements[m].kind == SL_SHARD) nkeys *= L->mesh[m];
    for (int k = 0; k < nkeys; k++) L->group_of_key[k] = -1;
    for (int r = 0; r < L->world; r++) {
      int coord[SL_MAX_MESH_DIMS], key = 0;
      sl__mesh_coord(r, L->mesh_ndim, L->mesh, coord);
      sl__region_compute(j->src->shape, j->src->ndim, L->mesh_ndim, L->mesh, j->res.placements, coord,
                         &L->regions[r]);
      for (int m = 0; m < L->mesh_ndim; m++)
        if (j->res.placements[m].kind == SL_SHARD) key = key * L->mesh[m] + coord[m];
      if (L->group_of_key[key] < 0) L->group_of_key[key] = r;
      L->group[r] = L->group_of_key[key];
    }
  }

  if (L->o.read_mode == SL_READ_EVERY_RANK) {
    /* no collective runs in this mode: any failure is this rank's, told at the agreement */
    own_read o = {L, j};
    for (uint64_t a = 0; a < total && L->deferred == SL_OK; a += chunk) {
      uint64_t b = a + chunk < total ? a + chunk : total;
      sl_status st = sl__region_runs(&j->mine, a, b, read_own_run, &o);
      if (st != SL_OK) defer(L, j, st);
    }
    return SL_OK;
  }
  for (uint64_t a = 0; a < total; a += chunk) {
    uint64_t b = a + chunk < total ? a + chunk : total;
    sl_status st = L->o.strategy == SL_STRATEGY_BROADCAST ? broadcast_chunk(L, j, a, b) : scatter_chunk(L, j, a, b);
    if (st != SL_OK) return st;
  }
  return SL_OK;
}

char *sl__load_canonical(const sl_plan *plan, const sl_load_options *o) {
  char *p = sl__plan_canonical(plan), *out = NULL;
  if (!p) return NULL;
  if (asprintf(&out, "%scpu_offload %d\nstrategy %d\nread_mode %d\nstaging %zu\n", p, (int)o->cpu_offload,
               (int)o->strategy, (int)o->read_mode, o->staging_bytes) < 0)
    out = NULL;
  free(p);
  return out;
}

/* ---- phase 1 ------------------------------------------------------------------------------ */
static sl_status plan_jobs(loader *L, uint64_t *digest) {
  sl_context *ctx = L->ctx;
  size_t n = sl_source_tensor_count(L->src);
  unsigned char *take = calloc(n ? n : 1, 1);
  if (!take) return sl__fail(ctx, SL_ERR_NOMEM, "out of memory planning %zu tensors", n);
  sl_status st = sl__plan_check(L->plan, L->src, L->world, take);
  if (st != SL_OK) goto out_free_take;
  L->mesh_ndim = sl__plan_mesh(L->plan, L->world, L->mesh);
  sl__mesh_coord(L->rank, L->mesh_ndim, L->mesh, L->coord);
  size_t ntake = 0, nskip = 0;
  for (size_t i = 0; i < n; i++) ntake += take[i], nskip += !take[i];
  L->jobs = calloc(ntake ? ntake : 1, sizeof *L->jobs);
  L->st->tensors = calloc(ntake ? ntake : 1, sizeof *L->st->tensors);
  L->st->skipped = calloc(nskip ? nskip : 1, sizeof *L->st->skipped);
  if (!L->jobs || !L->st->tensors || !L->st->skipped) {
    st = sl__fail(ctx, SL_ERR_NOMEM, "out of memory planning %zu tensors", n);
    goto out_free_take;
  }
  uint64_t h = sl__plan_digest(L->plan);
  h = mix64(h, (uint64_t)L->o.cpu_offload);
  h = mix64(h, (uint64_t)L->o.strategy);
  h = mix64(h, (uint64_t)L->o.read_mode);
  h = mix64(h, (uint64_t)L->o.staging_bytes);
  for (size_t i = 0; i < n; i++) {
    const sl_source_tensor *t = sl_source_tensor_at(L->src, i);
    if (!take[i]) {
      if (!(L->st->skipped[L->st->nskipped++] = sl__strdup(t->name))) {
        st = sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
        goto out_free_take;
      }
      continue;
    }
    tensor_job *j = &L->jobs[L->njobs];
    sl_tensor *o = &L->st->tensors[L->njobs];
    j->src_index = i;
    j->src = t;
    j->out = o;
    if ((st = sl__plan_resolve(L->plan, t, &j->res)) != SL_OK) goto out_free_take;
    if ((st = sl__region_compute(t->shape, t->ndim, L->mesh_ndim, L->mesh, j->res.placements, L->coord,
                                 &j->mine)) != SL_OK) {
      st = sl__fail(ctx, SL_ERR_PLAN, "%s: placement does not fit shape (ndim %d)", t->name, t->ndim);
      goto out_free_take;
    }
    j->replicated = true;
    for (int m = 0; m < L->mesh_ndim; m++)
      if (j->res.placements[m].kind == SL_SHARD) j->replicated = false;
    j->wire = sl_dtype_size(j->res.dtype) < sl_dtype_size(t->dtype) ? j->res.dtype : t->dtype;
    if (!(o->name = sl__strdup(t->name))) {
      st = sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
      goto out_free_take;
    }
    L->njobs++;
    L->st->count = L->njobs;
    o->dtype = j->res.dtype;
    o->file_dtype = t->dtype;
    o->ndim = t->ndim;
    o->nbytes = sl__region_elems(&j->mine) * sl_dtype_size(j->res.dtype);
    for (int d = 0; d < t->ndim; d++) {
      o->global_shape[d] = t->shape[d];
      o->local_shape[d] = j->mine.len[d];
      o->global_offset[d] = j->mine.off[d];
    }
    o->device = L->place.device;
    o->rule = L->place.rule;
    o->pinned = o->device == SL_DEVICE_CPU && L->pinned;
    L->total_bytes += t->nbytes;
    h = mix64(h, i);
    h = mix64(h, (uint64_t)j->res.dtype);
    for (int m = 0; m < L->mesh_ndim; m++)
      h = mix64(h, (uint64_t)(j->res.placements[m].kind * 64 + j->res.placements[m].dim));
  }
  *digest = h;
out_free_take:
  free(take);
  return st;
}

static sl_status allocate(loader *L) {
  sl_context *ctx = L->ctx;
  for (size_t i = 0; i < L->njobs; i++) {
    sl_tensor *t = L->jobs[i].out;
    void *p = L->o.bind ? L->o.bind(L->o.bind_user, t) : NULL;
    if (p) {
      t->data = p;
      t->caller_buffer = 1;
      if (t->device == SL_DEVICE_CPU && SL_HAS_OP(ctx->be, is_device_ptr) && !sl__device_is_host(ctx) &&
          ctx->be->is_device_ptr(ctx->be_ctx, p, 1))
        return sl__fail(ctx, SL_ERR_BUFFER,
                        "%s: the caller's buffer is device memory of backend %s, but the tensor is placed "
                        "on the CPU; pass host memory (sl_alloc(ctx, SL_DEVICE_CPU, ...))",
                        t->name, ctx->be->name);
      if (t->device == SL_DEVICE_ACCELERATOR && SL_HAS_OP(ctx->be, is_device_ptr) &&
          !ctx->be->is_device_ptr(ctx->be_ctx, p, (size_t)t->nbytes)) {
        /* device memory that ends before the shard does is a size mistake, not a kind mistake */
        if (t->nbytes > 1 && ctx->be->is_device_ptr(ctx->be_ctx, p, 1))
          return sl__fail(ctx, SL_ERR_BUFFER,
                          "%s: the caller's device buffer ends before the tensor's %llu bytes; bind a "
                          "buffer of at least t->nbytes",
                          t->name, (unsigned long long)t->nbytes);
        return sl__fail(ctx, SL_ERR_BUFFER,
                        "%s: the caller's buffer is not device memory of backend %s; allocate it with "
                        "sl_alloc(ctx, SL_DEVICE_ACCELERATOR, ...)",
                        t->name, ctx->be->name);
      }
      continue;
    }
    sl_status st = sl_alloc(ctx, t->device, t->pinned, (size_t)t->nbytes, &t->data);
    if (st != SL_OK)
      return sl__fail(ctx, st, "%s: cannot allocate %llu bytes on %s: %s", t->name, (unsigned long long)t->nbytes,
                      sl_device_kind_name(t->device), ctx->errmsg);
  }
  /* Staging: the budget, or less when the largest tensor's carve-up (see load_tensor) needs
   * less — a small checkpoint should not pay for populating 64 MiB. Every rank computes the
   * same figure from the same plan, so chunk boundaries still agree. */
  size_t need = SL__MIN_STAGING;
  for (size_t i = 0; i < L->njobs; i++) {
    const tensor_job *j = &L->jobs[i];
    uint64_t elems = tensor_elems(j->src), bytes;
    uint64_t per = sl_dtype_size(j->src->dtype) + 3 * sl_dtype_size(j->wire) + sl_dtype_size(j->res.dtype);
    if (!sl__mul_u64(elems, per, &bytes) || bytes >= L->o.staging_bytes) {
      need = L->o.staging_bytes;
      break;
    }
    if (bytes > need) need = (size_t)bytes;
  }
  L->staging_bytes = need;
  /* A device that is not host memory and can cast gets a small device staging buffer, so a
   * widening cast (BF16 -> F32) crosses the bus at the narrow width. A chunk's wire bytes are
   * at most a quarter of the staging (see load_tensor's carve-up). */
  bool widen_on_device = false;
  for (size_t i = 0; i < L->njobs; i++)
    if (L->jobs[i].out->device == SL_DEVICE_ACCELERATOR &&
        sl_dtype_size(L->jobs[i].wire) < sl_dtype_size(L->jobs[i].res.dtype))
      widen_on_device = true;
  if (widen_on_device && !sl__device_is_host(ctx) && SL_HAS_OP(ctx->be, cast_device)) {
    sl_status st = ctx->be->alloc_device(ctx->be_ctx, need / 4, &L->dev_staging);
    if (st != SL_OK) return sl__fail(ctx, st, "cannot allocate %zu bytes of device staging", need / 4);
  }
  L->staging_pinned = sl__has_pinned(ctx);
  sl_status st = sl_alloc(ctx, SL_DEVICE_CPU, L->staging_pinned, need, (void **)&L->staging);
  if (st != SL_OK) return sl__fail(ctx, st, "cannot allocate %zu bytes of staging", need);
  L->st->stats.staging_bytes = need;
  if (L->rank == 0) {
    size_t w = (size_t)L->world;
    L->regions = calloc(w, sizeof *L->regions);
    L->counts = calloc(w, sizeof *L->counts);
    L->displs = calloc(w, sizeof *L->displs);
    L->group = calloc(w, sizeof *L->group);
    L->group_of_key = calloc(w, sizeof *L->group_of_key);
    if (!L->regions || !L->counts || !L->displs || !L->group || !L->group_of_key)
      return sl__fail(ctx, SL_ERR_NOMEM, "out of memory for %d ranks' scatter tables", L->world);
  } else {
    /* non-root ranks pass these to scatterv, which reads them on the root only */
    L->counts = calloc(1, sizeof *L->counts);
    L->displs = calloc(1, sizeof *L->displs);
    if (!L->counts || !L->displs) return sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
  }
  return SL_OK;
}

static void loader_release(loader *L) {
  if (L->staging) sl_free(L->ctx, SL_DEVICE_CPU, L->staging_pinned, L->staging);
  if (L->dev_staging) L->ctx->be->free_device(L->ctx->be_ctx, L->dev_staging);
  free(L->regions);
  free(L->counts);
  free(L->displs);
  free(L->group);
  free(L->group_of_key);
  free(L->jobs);
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
  if (L->o.staging_bytes == 0) L->o.staging_bytes = SL__DEFAULT_STAGING;
  if (L->o.staging_bytes < SL__MIN_STAGING) L->o.staging_bytes = SL__MIN_STAGING;
  sl_status st = sl_resolve_placement(L->o.cpu_offload, sl__plan_policy(L->plan), &L->place);
  if (st != SL_OK) return sl__fail(ctx, st, "sl_load: invalid offload policy");
  if (!(L->st = calloc(1, sizeof *L->st))) return sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
  return SL_OK;
}

SL_API sl_status sl_load(sl_context *ctx, sl_plan *plan, sl_source *src, const sl_load_options *opts,
                         sl_state **out) {
  if (!ctx) return SL_ERR_INVALID;
  if (out) *out = NULL;
  double t0 = now_s();
  loader L = {.ctx = ctx, .plan = plan, .src = src, .rank = ctx->rank, .world = ctx->world_size};
  sl_status st = check_args(&L, opts, out);
  /* A caller error on one rank is a phase-1 failure like any other: the rank still takes part
   * in the planning agreement, so the others fail at once with its message instead of waiting
   * in it until they time out or lose the rank. */
  if (st != SL_OK) return agree(&L, st, 0, "planning");
  L.pinned = L.place.pin_memory && sl__has_pinned(ctx);
  L.st->ctx = ctx;

  /* phase 1: metadata, plan, agreement — nothing is allocated or bound before all agree */
  uint64_t digest = 0;
  st = plan_jobs(&L, &digest);
  if ((st = agree(&L, st, digest, "planning")) != SL_OK) goto out_fail;
  if (L.o.read_mode == SL_READ_EVERY_RANK) {
    if (!sl__source_has_files(src)) st = sl__source_open_files(src);
    /* alone, a rank has no one to compare its copy with */
    if (L.world > 1 && (st = agree_files(&L, st)) != SL_OK) goto out_fail;
    if (st != SL_OK) goto out_fail;
  }
  /* the caller's bind sees a tensor only from here on: every failure above leaves its
   * buffers untouched (the contract at sl_bind_fn) */
  st = allocate(&L);
  if ((st = agree(&L, st, digest, "preparation (allocating shards)")) != SL_OK) goto out_fail;

  /* phase 2: data, tensor by tensor in file order */
  for (size_t i = 0; i < L.njobs; i++) {
    if ((st = load_tensor(&L, &L.jobs[i])) != SL_OK) {
      if (!strstr(ctx->errmsg, L.jobs[i].src->name)) {
        char prev[SL__ERRMSG_LEN];
        snprintf(prev, sizeof prev, "%s", ctx->errmsg);
        sl__fail(ctx, st, "%s: %s", L.jobs[i].src->name, prev);
      }
      goto out_fail;
    }
    L.done_bytes += L.jobs[i].src->nbytes;
    if (L.o.progress && L.rank == 0) L.o.progress(L.o.progress_user, L.done_bytes, L.total_bytes);
  }
  if (L.deferred == SL_OK && (st = ctx->be->synchronize(ctx->be_ctx)) != SL_OK) {
    L.deferred = st;
    snprintf(L.deferred_msg, sizeof L.deferred_msg, "%s", ctx->errmsg);
  }
  if (L.deferred == SL_OK && (st = sl__state_index(L.st)) != SL_OK) {
    L.deferred = st;
    snprintf(L.deferred_msg, sizeof L.deferred_msg, "out of memory indexing the state");
  }
  /* the closing agreement: every rank returns OK only if every rank placed every byte */
  if (L.deferred != SL_OK) sl__fail(ctx, L.deferred, "%s", L.deferred_msg);
  if ((st = agree(&L, L.deferred, digest, "loading")) != SL_OK) goto out_fail;
  L.st->stats.seconds = now_s() - t0;
  loader_release(&L);
  *out = L.st;
  return SL_OK;

out_fail:
  loader_release(&L);
  sl_state_destroy(L.st);
  return st;
}
