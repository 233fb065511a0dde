/* Phase 1 across ranks: rank 0 must read and validate the checkpoint's headers; every other
 * rank that can read its own path does the same with its copy, at the same time. Other ranks
 * need not see the files at all (the RAM-efficient path): those that do not take rank 0's
 * manifest instead, which rank 0 broadcasts only when some rank needs it. Every rank returns
 * rank 0's error when it had one, quickly, instead of waiting in a collective that will never
 * come.
 *
 * Then the ranks agree on a job identity before any data moves (docs/DESIGN.md#identity):
 * the world size each was started for, the checkpoint path each was given and,
 * where a rank can read that path itself, the digest of its headers. A rank that can read its
 * path must find rank 0's headers there, byte for byte. Ranks of one job may be given another
 * path string than rank 0's (the same checkpoint mounted elsewhere on another node) only when
 * they can read it, its headers match, and so do sampled tensor data blocks (a fine-tune of the
 * same model has the same headers); a rank that cannot read its path must have been given
 * rank 0's. So a stray rank of another job that met this one on a shared rendezvous fails every
 * rank, before any byte of data moves.
 *
 * sl_source_open_memory takes the same path with a table in rank 0's memory instead of files
 * (source_memory.c): the same verdict, no copy of its own on other ranks, so always the manifest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <xxhash.h>

#include "ranks_agree.h"
#include "source_impl.h" /* the source's context, for messages */

#define MANIFEST_PIECE ((size_t)1 << 20) /* bytes per broadcast of rank 0's manifest */

typedef struct open_verdict {
  int32_t status;
  uint32_t pad;
  uint64_t manifest_len;
  char msg[496];
} open_verdict;

/* Facts each rank contributes to the identity agreement. */
enum {
  ID_WORLD = 0,
  ID_PATH = 1,
  ID_HEADERS = 2, /* 0: this rank could not read its path */
  ID_FILE = 3     /* its first file as opened (absolute), for the log: 0 where it reads no copy */
};

/* A rank other than 0 tries its own path: when it can read it, it reads its own copy from then
 * on (every-rank reads) and its headers prove which checkpoint it was given. Not being able to
 * is no error here; rank 0 reads for it.
 *
 * It parses and validates its copy as rank 0 does its own, at the same time as rank 0 (so the
 * open takes one parse on every rank, not rank 0's parse, then a manifest, then its decoding):
 * the copy's table is its own, from its own bytes, whoever else reads what. */
static sl_source *open_own_copy(sl_context *ctx, const char *path) {
  struct stat sb;
  if (!path || !*path || stat(path, &sb) != 0) return NULL;
  sl_source *own = NULL;
  if (sl__source_open_local(ctx, path, &own) != SL_OK) {
    sl__log(ctx, SL_LOG_INFO, "rank %d: cannot read %s itself (%s); rank 0's reading stands for it", ctx->rank,
            path, ctx->errmsg);
    ctx->errmsg[0] = 0;
    return NULL;
  }
  return own;
}

/* Rank BAD is not in rank 0's job (see the head of this file): every rank fails, with both
 * paths as given; they go as texts of any length. */
static sl_status identity_mismatch(sl_context *ctx, const char *path, const uint64_t *table, int bad) {
  const uint64_t *r0 = table, *rb = table + (size_t)bad * SL__AGREE_FACTS;
  char *p0 = ctx->rank == 0 ? (char *)path : NULL, *pb = ctx->rank == bad ? (char *)path : NULL;
  sl_status st = sl__bcast_text(ctx, &p0, 0);
  sl_status st2 = sl__bcast_text(ctx, &pb, bad);
  if (st == SL_OK) st = st2;
  if (st == SL_OK) {
    char why[160];
    if (rb[ID_WORLD] != r0[ID_WORLD])
      snprintf(why, sizeof why, "it was started for a world of %llu ranks, rank 0 for %llu",
               (unsigned long long)rb[ID_WORLD], (unsigned long long)r0[ID_WORLD]);
    else if (rb[ID_HEADERS] == 0)
      snprintf(why, sizeof why, "it was given another path and cannot read it to show it is the same checkpoint");
    else if (rb[ID_HEADERS] != r0[ID_HEADERS])
      snprintf(why, sizeof why, "the checkpoint it reads has other safetensors headers than rank 0's");
    else
      snprintf(why, sizeof why,
               "its copy has rank 0's headers but other tensor data (another checkpoint of the same model?)");
    st = sl__fail(ctx, SL_ERR_MISMATCH,
                  "rank %d is not in the same job as rank 0: %s; rank 0 was given '%.300s'%s, rank %d '%.300s'%s. "
                  "Start every rank of a job with the same checkpoint (a path may differ only where that rank "
                  "can read it); jobs that share a rendezvous need different job keys or rendezvous",
                  bad, why, p0 ? p0 : "?", p0 && strlen(p0) > 300 ? "..." : "", bad, pb ? pb : "?",
                  pb && strlen(pb) > 300 ? "..." : "");
  }
  if (ctx->rank != 0) free(p0);
  if (ctx->rank != bad) free(pb);
  return st;
}

sl_status sl__source_fingerprint_all(sl_source *src, uint64_t *combined, uint64_t *per_file) {
  size_t nf = sl__source_file_count(src);
  XXH3_state_t *h = XXH3_createState();
  if (!h) return sl__fail(src->ctx, SL_ERR_NOMEM, "out of memory while fingerprinting the checkpoint files");
  XXH3_64bits_reset(h);
  XXH3_64bits_update(h, &nf, sizeof nf);
  sl_status st = SL_OK;
  for (size_t f = 0; f < nf && st == SL_OK; f++) {
    uint64_t fp[2];
    if ((st = sl__source_file_fingerprint(src, f, fp)) != SL_OK) break;
    XXH3_64bits_update(h, fp, sizeof fp);
    if (per_file) memcpy(per_file + 2 * f, fp, sizeof fp);
  }
  *combined = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return st;
}

/* The first rank whose identity does not fit rank 0's, or -1. */
static int first_stranger(const sl_context *ctx, const uint64_t *table) {
  const uint64_t *r0 = table;
  for (int r = 1; r < ctx->world_size; r++) {
    const uint64_t *f = table + (size_t)r * SL__AGREE_FACTS;
    if (f[ID_WORLD] != r0[ID_WORLD]) return r;
    if (f[ID_HEADERS] ? f[ID_HEADERS] != r0[ID_HEADERS] : f[ID_PATH] != r0[ID_PATH]) return r;
  }
  return -1;
}

/* Ranks given another path than rank 0's passed first_stranger with rank 0's headers: the same
 * checkpoint mounted elsewhere, or another checkpoint of the same model (a fine-tune has its
 * base model's headers). Sampled tensor data tells them apart; only those ranks and rank 0 read
 * it, and only when there are such ranks. *BAD: the first whose data differs, or -1. */
static sl_status compare_other_copies(sl_context *ctx, sl_source *mine, uint64_t *table, int *bad) {
  *bad = -1;
  bool any = false;
  for (int r = 1; r < ctx->world_size; r++) any |= table[(size_t)r * SL__AGREE_FACTS + ID_PATH] != table[ID_PATH];
  if (!any) return SL_OK;
  bool reads = ctx->rank == 0 || table[(size_t)ctx->rank * SL__AGREE_FACTS + ID_PATH] != table[ID_PATH];
  uint64_t facts[SL__AGREE_FACTS] = {0}, *fps = NULL;
  sl_status st = reads ? sl__source_fingerprint_all(mine, &facts[0], NULL) : SL_OK;
  if ((st = sl__agree(ctx, st, facts, "comparing copies of the checkpoint", &fps)) != SL_OK) return st;
  for (int r = 1; r < ctx->world_size && *bad < 0; r++)
    if (table[(size_t)r * SL__AGREE_FACTS + ID_PATH] != table[ID_PATH] && fps[(size_t)r * SL__AGREE_FACTS] != fps[0])
      *bad = r;
  free(fps);
  return SL_OK;
}

/* How rank 0 builds its local source: from a path (sl_source_open) or from the caller's table
 * (sl_source_open_memory). */
typedef sl_status (*local_open_fn)(sl_context *ctx, const void *arg, sl_source **out);

/* Rank 0's manifest for the ranks that read no copy of their own (NEED: one of them at least;
 * every rank knows who they are from the identity agreement): rank 0 serializes its source,
 * every rank takes part in the broadcast, those ranks build their source from it into *OUT; then
 * all agree, so a rank that could not take it fails every rank with its message. */
static sl_status send_manifest(sl_context *ctx, sl_source *src0, bool memory, bool need, sl_source **out) {
  open_verdict v = {0};
  void *manifest = NULL;
  if (ctx->rank == 0) {
    sl_status st = sl__source_serialize(src0, &manifest, &v.manifest_len);
    if (st == SL_OK && v.manifest_len == 0) st = sl__fail(ctx, SL_ERR_FORMAT, "empty manifest");
    v.status = (int32_t)st;
    if (st != SL_OK) snprintf(v.msg, sizeof v.msg, "%.*s", (int)sizeof v.msg - 1, ctx->errmsg);
  }
  sl_status st = sl__ctl_broadcast(ctx, &v, sizeof v, 0);
  if (st == SL_OK && v.status != SL_OK) {
    st = (sl_status)v.status;
    if (ctx->rank != 0) {
      v.msg[sizeof v.msg - 1] = 0;
      sl__fail(ctx, st, "rank 0: %s", v.msg);
    }
  }
  if (st != SL_OK) {
    free(manifest);
    return st;
  }
  /* Every rank takes part in every piece (a rank that broadcast fewer bytes than the others
   * would fall out of step with them): those that build from it into their buffer, the rest
   * (ranks with a copy of their own, or one that could not allocate the manifest) into a
   * scratch piece. A rank without even that aborts its control plane: the others fail at once,
   * naming it, instead of waiting for it. */
  const size_t len = (size_t)v.manifest_len, piece = len < MANIFEST_PIECE ? len : MANIFEST_PIECE;
  unsigned char *scratch = NULL;
  if (ctx->rank != 0 && need && !(manifest = malloc(len)))
    st = sl__fail(ctx, SL_ERR_NOMEM, "cannot allocate a %zu-byte manifest", len);
  if (ctx->rank != 0 && !manifest && !(scratch = malloc(piece))) {
    st = sl__fail(ctx, SL_ERR_NOMEM, "cannot allocate %zu bytes to take part in rank 0's manifest", piece);
    if (SL_HAS_OP(ctx->ctl, abort)) ctx->ctl->abort(ctx->ctl_comm);
    return st;
  }
  sl_status bs = SL_OK;
  for (size_t off = 0; off < len && bs == SL_OK; off += piece) {
    size_t n = len - off < piece ? len - off : piece;
    bs = sl__ctl_broadcast(ctx, manifest ? (unsigned char *)manifest + off : scratch, n, 0);
  }
  free(scratch);
  if (st == SL_OK) st = bs;
  if (st == SL_OK && need) st = sl__source_deserialize_ex(ctx, manifest, len, memory, out);
  free(manifest);
  if (bs != SL_OK) return bs;
  return sl__agree(ctx, st, NULL, "taking rank 0's manifest", NULL);
}

/* The collective open: rank 0 builds its source with OPEN_LOCAL(ARG) while every other rank
 * that can read its PATH opens its own copy; every rank gets rank 0's verdict (its failure as
 * "rank 0: ..."); then the identity agreement; then rank 0's manifest, only where some rank
 * has no copy of its own. PATH is what this rank was given (the path, or a memory source's
 * label): it names the job in mismatch messages. A memory source (MEMORY) exists on rank 0
 * only: the other ranks build theirs from the manifest, marked as memory, and never look for a
 * copy of their own; its identity is the kind of source, not the label, so ranks may label it
 * differently. */
static sl_status open_collective(sl_context *ctx, const char *path, bool memory, local_open_fn open_local,
                                 const void *arg, sl_source **out) {
  if (ctx->world_size == 1) return open_local(ctx, arg, out);

  sl_source *src = NULL; /* rank 0's own; elsewhere the one rank 0's manifest builds */
  sl_source *own = NULL; /* a rank's own copy */
  uint64_t *table = NULL;
  open_verdict v = {0};
  if (ctx->rank == 0) {
    sl_status st = open_local(ctx, arg, &src);
    v.status = (int32_t)st;
    if (st != SL_OK) snprintf(v.msg, sizeof v.msg, "%.*s", (int)sizeof v.msg - 1, ctx->errmsg);
  } else if (!memory) {
    own = open_own_copy(ctx, path);
  }
  sl_status st = sl__ctl_broadcast(ctx, &v, sizeof v, 0);
  if (st != SL_OK) goto out_free;
  if (v.status != SL_OK) {
    st = (sl_status)v.status;
    if (ctx->rank != 0) {
      v.msg[sizeof v.msg - 1] = 0;
      sl__fail(ctx, st, "rank 0: %s", v.msg);
    }
    goto out_free;
  }

  /* the identity (see the head of this file) */
  const sl_source *mine = ctx->rank == 0 ? src : own;
  static const char memory_tag[] = "\0shardload memory source";
  uint64_t path_fact = memory ? XXH3_64bits(memory_tag, sizeof memory_tag)
                              : XXH3_64bits(path ? path : "", path ? strlen(path) : 0);
  const char *file0 = mine ? sl_source_file_at(mine, 0) : NULL;
  uint64_t facts[SL__AGREE_FACTS] = {(uint64_t)ctx->world_size, path_fact, mine ? sl__source_headers_digest(mine) : 0,
                                     file0 ? XXH3_64bits(file0, strlen(file0)) : 0};
  if ((st = sl__agree(ctx, SL_OK, facts, "opening the checkpoint", &table)) != SL_OK) goto out_free;
  int bad = first_stranger(ctx, table);
  if (bad < 0 && (st = compare_other_copies(ctx, ctx->rank == 0 ? src : own, table, &bad)) != SL_OK) goto out_free;
  if (bad >= 0) {
    st = identity_mismatch(ctx, path, table, bad);
    goto out_free;
  }
  /* a rank without a copy of its own takes rank 0's table; every rank sees who they are */
  bool any_without = false;
  for (int r = 1; r < ctx->world_size; r++) any_without |= table[(size_t)r * SL__AGREE_FACTS + ID_HEADERS] == 0;
  if (any_without && (st = send_manifest(ctx, src, memory, ctx->rank != 0 && !own, &src)) != SL_OK) goto out_free;
  if (own) {
    if (file0 && table[(size_t)ctx->rank * SL__AGREE_FACTS + ID_FILE] != table[ID_FILE])
      sl__log(ctx, SL_LOG_INFO, "rank %d reads its own copy %s (rank 0's headers, other files: %s)", ctx->rank, path,
              file0);
    src = own;
    own = NULL;
  }
out_free:
  free(table);
  sl_source_destroy(own);
  if (st != SL_OK) {
    sl_source_destroy(src);
    return st;
  }
  *out = src;
  return SL_OK;
}

static sl_status open_path(sl_context *ctx, const void *arg, sl_source **out) {
  return sl__source_open_local(ctx, (const char *)arg, out);
}

SL_API sl_status sl_source_open(sl_context *ctx, const char *path, sl_source **out) {
  if (!ctx) return SL_ERR_INVALID;
  if (!out) return sl__fail(ctx, SL_ERR_INVALID, "sl_source_open: out is NULL");
  *out = NULL;
  return open_collective(ctx, path, false, open_path, path, out);
}

typedef struct memory_args {
  const char *label;
  const sl_memory_tensor *tensors;
  size_t count;
  sl_source_read_fn read;
  void *read_user;
} memory_args;

static sl_status open_memory(sl_context *ctx, const void *arg, sl_source **out) {
  const memory_args *a = arg;
  return sl__source_open_memory_local(ctx, a->label, a->tensors, a->count, a->read, a->read_user, out);
}

SL_API sl_status sl_source_open_memory(sl_context *ctx, const char *label, const sl_memory_tensor *tensors,
                                       size_t count, sl_source_read_fn read, void *read_user, sl_source **out) {
  if (!ctx) return SL_ERR_INVALID;
  if (!out) return sl__fail(ctx, SL_ERR_INVALID, "sl_source_open_memory: out is NULL");
  *out = NULL;
  if (!label || !*label) label = "memory";
  memory_args a = {label, tensors, count, read, read_user};
  return open_collective(ctx, label, true, open_memory, &a, out);
}
