/* The manifest: a compact, self-describing byte image of a validated source (tensor table,
 * file names, metadata) that rank 0 broadcasts; other ranks rebuild a source from it without
 * touching the files. It is network input: every length is checked. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "source_impl.h"

/* ---- manifest ------------------------------------------------------------------------- */
/* Layout, all integers little-endian:
 *   "SLMF" u32 version
 *   u64 tensor_count  u64 file_count  u64 meta_count  u64 headers_digest
 *   u32 flags (bit 0: the metadata are the index's, not the header's)
 *   tensor_count x { str name, u32 dtype, u32 ndim, ndim x i64 shape, u64 nbytes,
 *                    u32 file_index, u64 file_offset }
 *   file_count x { str path, str name }
 *   meta_count x { str key, str value }
 * where str = u32 length + bytes (no NUL). It crosses the network: the reader checks every
 * length against what is left and every value against what it must be. */
#define MANIFEST_MAGIC "SLMF"
#define MANIFEST_VERSION 3u /* 2: headers digest, file names as the index gives them; 3: flags */
#define MANIFEST_META_FROM_INDEX 1u
#define MIN_TENSOR_BYTES (4 + 4 + 4 + 8 + 4 + 8)

typedef struct wbuf {
  uint8_t *p;
  size_t len, cap;
  bool oom;
} wbuf;

static void put(wbuf *w, const void *b, size_t n) {
  if (w->oom) return;
  if (w->cap - w->len < n) {
    size_t cap = w->cap ? w->cap : 256;
    while (cap - w->len < n) cap *= 2;
    uint8_t *np = realloc(w->p, cap);
    if (!np) {
      w->oom = true;
      return;
    }
    w->p = np;
    w->cap = cap;
  }
  memcpy(w->p + w->len, b, n);
  w->len += n;
}

static void put_u32(wbuf *w, uint32_t v) {
  uint8_t b[4];
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
  put(w, b, 4);
}

static void put_u64(wbuf *w, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  put(w, b, 8);
}

static void put_str(wbuf *w, const char *s) {
  size_t n = strlen(s);
  if (n > UINT32_MAX) {
    w->oom = true;
    return;
  }
  put_u32(w, (uint32_t)n);
  put(w, s, n);
}

sl_status sl__source_serialize(const sl_source *src, void **buf, size_t *len) {
  if (!src || !buf || !len) return SL_ERR_INVALID;
  *buf = NULL;
  *len = 0;
  wbuf w = {0};
  put(&w, MANIFEST_MAGIC, 4);
  put_u32(&w, MANIFEST_VERSION);
  put_u64(&w, src->count);
  put_u64(&w, src->file_count);
  put_u64(&w, src->meta_count);
  put_u64(&w, src->headers_digest);
  put_u32(&w, src->meta_from_index ? MANIFEST_META_FROM_INDEX : 0);
  for (size_t i = 0; i < src->count; i++) {
    const sl_source_tensor *t = &src->tensors[i];
    put_str(&w, t->name);
    put_u32(&w, (uint32_t)t->dtype);
    put_u32(&w, (uint32_t)t->ndim);
    for (int d = 0; d < t->ndim; d++) put_u64(&w, (uint64_t)t->shape[d]);
    put_u64(&w, t->nbytes);
    put_u32(&w, (uint32_t)src->file_of[i]);
    put_u64(&w, t->file_offset);
  }
  for (size_t i = 0; i < src->file_count; i++) {
    put_str(&w, src->files[i].path);
    put_str(&w, src->files[i].name);
  }
  for (size_t i = 0; i < src->meta_count; i++) {
    put_str(&w, src->meta_keys[i]);
    put_str(&w, src->meta_values[i]);
  }
  if (w.oom) {
    free(w.p);
    return sl__fail(src->ctx, SL_ERR_NOMEM, "out of memory serializing the manifest");
  }
  *buf = w.p;
  *len = w.len;
  return SL_OK;
}

typedef struct rbuf {
  const uint8_t *p;
  size_t left;
} rbuf;

static bool get(rbuf *r, void *b, size_t n) {
  if (r->left < n) return false;
  memcpy(b, r->p, n);
  r->p += n;
  r->left -= n;
  return true;
}

static bool get_u32(rbuf *r, uint32_t *v) {
  uint8_t b[4];
  if (!get(r, b, 4)) return false;
  *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
  return true;
}

static bool get_u64(rbuf *r, uint64_t *v) {
  uint8_t b[8];
  if (!get(r, b, 8)) return false;
  *v = 0;
  for (int i = 7; i >= 0; i--) *v = (*v << 8) | b[i];
  return true;
}

/* A malloc'd C string; fails on truncation or an embedded NUL. */
static bool get_str(rbuf *r, char **s) {
  uint32_t n;
  if (!get_u32(r, &n) || r->left < n || memchr(r->p, 0, n)) return false;
  if (!(*s = malloc((size_t)n + 1))) return false;
  memcpy(*s, r->p, n);
  (*s)[n] = 0;
  r->p += n;
  r->left -= n;
  return true;
}

#define BAD(...) \
  do { s = sl__fail(ctx, SL_ERR_FORMAT, "manifest: " __VA_ARGS__); goto out_src; } while (0)

static sl_status read_tensor(sl_context *ctx, rbuf *r, sl_source *src, uint64_t file_count) {
  sl_status s = SL_OK;
  size_t i = src->count;
  sl_source_tensor *t = &src->tensors[i];
  char *name = NULL;
  uint32_t dt, nd, fi;
  if (!get_str(r, &name)) BAD("truncated or malformed name of tensor %zu", i);
  t->name = name;
  src->count++; /* owned from here on */
  if (!get_u32(r, &dt) || !get_u32(r, &nd)) BAD("truncated at tensor '%s'", name);
  if (dt == SL_DTYPE_INVALID || dt >= SL_DTYPE_COUNT_) BAD("tensor '%s' has dtype code %" PRIu32, name, dt);
  if (nd > SL_MAX_DIMS) BAD("tensor '%s' has %" PRIu32 " dims", name, nd);
  t->dtype = (sl_dtype)dt;
  t->ndim = (int)nd;
  uint64_t elems = 1, nbytes;
  bool overflow = false;
  for (uint32_t d = 0; d < nd; d++) {
    uint64_t v;
    if (!get_u64(r, &v)) BAD("truncated at tensor '%s'", name);
    if (v > INT64_MAX) BAD("tensor '%s' has a negative extent", name);
    t->shape[d] = (int64_t)v;
    if (!overflow && !sl__mul_u64(elems, v, &elems)) overflow = true;
  }
  if (!get_u64(r, &t->nbytes) || !get_u32(r, &fi) || !get_u64(r, &t->file_offset))
    BAD("truncated at tensor '%s'", name);
  if (overflow || !sl__mul_u64(elems, sl_dtype_size(t->dtype), &nbytes) || nbytes != t->nbytes)
    BAD("tensor '%s' has %" PRIu64 " bytes, which does not match its shape and dtype", name, t->nbytes);
  uint64_t end;
  if (fi >= file_count || !sl__add_u64(t->file_offset, t->nbytes, &end))
    BAD("tensor '%s' has an invalid file index or offset", name);
  src->file_of[i] = fi;
  if (!sl__add_u64(src->total_bytes, t->nbytes, &src->total_bytes)) BAD("total size overflows");
out_src:
  return s;
}

sl_status sl__source_deserialize(sl_context *ctx, const void *buf, size_t len, sl_source **out) {
  return sl__source_deserialize_ex(ctx, buf, len, false, out);
}

sl_status sl__source_deserialize_ex(sl_context *ctx, const void *buf, size_t len, bool memory, sl_source **out) {
  if (!out || (!buf && len)) return sl__fail(ctx, SL_ERR_INVALID, "manifest: invalid arguments");
  *out = NULL;
  rbuf r = {buf, len};
  sl_status s = SL_OK;
  sl_source *src = sl__source_new(ctx);
  if (!src) return sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
  src->memory = memory;
  char magic[4];
  uint32_t version;
  uint64_t nt, nf, nm, digest;
  uint32_t flags;
  if (!get(&r, magic, 4) || memcmp(magic, MANIFEST_MAGIC, 4)) BAD("bad magic (not a shardload manifest)");
  if (!get_u32(&r, &version)) BAD("truncated header");
  if (version != MANIFEST_VERSION)
    BAD("version %" PRIu32 ", this build reads %u (mixed shardload versions across ranks?)", version,
        MANIFEST_VERSION);
  if (!get_u64(&r, &nt) || !get_u64(&r, &nf) || !get_u64(&r, &nm) || !get_u64(&r, &digest) || !get_u32(&r, &flags))
    BAD("truncated header");
  if (flags & ~MANIFEST_META_FROM_INDEX) BAD("unknown flags %08" PRIx32, flags);
  src->meta_from_index = flags & MANIFEST_META_FROM_INDEX;
  /* a source with files has a digest of their headers, and only such a source has one */
  if ((nf == 0) != (digest == 0)) BAD("headers digest %016" PRIx64 " for %" PRIu64 " files", digest, nf);
  src->headers_digest = digest;
  /* Every entry takes some bytes, so the counts are bounded by what is left: a short, hostile
   * manifest cannot make us allocate much. */
  if (nt > r.left / MIN_TENSOR_BYTES || nf > r.left / 8 || nm > r.left / 8 ||
      nt * MIN_TENSOR_BYTES + nf * 8 + nm * 8 > r.left)
    BAD("counts (%" PRIu64 " tensors, %" PRIu64 " files, %" PRIu64 " metadata) exceed its %zu bytes", nt, nf, nm,
        len);
  if (nt) {
    src->tensors = calloc(nt, sizeof *src->tensors);
    src->file_of = calloc(nt, sizeof *src->file_of);
  }
  if (nf) src->files = calloc(nf, sizeof *src->files);
  if (nm) sl__alloc_pairs(nm, &src->meta_keys, &src->meta_values); /* checked just below */
  if ((nt && (!src->tensors || !src->file_of)) || (nf && !src->files) ||
      (nm && (!src->meta_keys || !src->meta_values))) {
    s = sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
    goto out_src;
  }
  for (uint64_t i = 0; i < nt; i++)
    if ((s = read_tensor(ctx, &r, src, nf)) != SL_OK) goto out_src;
  for (uint64_t i = 0; i < nf; i++) {
    src_file *f = &src->files[i];
    f->fd = -1;
    src->file_count++; /* owned from here on; path and name start NULL */
    if (!get_str(&r, &f->path) || !get_str(&r, &f->name)) BAD("truncated or malformed file name %" PRIu64, i);
    /* a memory source's one file is its label, which is no path */
    if (memory && (nf != 1 || !f->path[0] || !f->name[0])) BAD("a memory source needs one labelled file");
    if (!memory && f->path[0] != '/') BAD("file %" PRIu64 " ('%s') has no absolute path", i, f->path);
    if (!memory && (!f->name[0] || strchr(f->name, '/') == f->name))
      BAD("file %" PRIu64 " has an empty or absolute name", i);
  }
  for (size_t i = 0; i < src->count; i++) src->tensors[i].file = src->files[src->file_of[i]].path;
  for (uint64_t i = 0; i < nm; i++) {
    size_t k = src->meta_count++;
    if (!get_str(&r, &src->meta_keys[k]) || !get_str(&r, &src->meta_values[k]))
      BAD("truncated or malformed metadata entry %zu", k);
  }
  if (r.left) BAD("%zu trailing bytes", r.left);
  size_t dup = 0;
  s = sl__source_build_index(src, &dup);
  if (s == SL_ERR_NOMEM) {
    s = sl__fail(ctx, s, "out of memory");
    goto out_src;
  }
  if (s != SL_OK) BAD("tensor '%s' appears twice", src->tensors[dup].name);
  *out = src;
  return SL_OK;
out_src:
  sl_source_destroy(src);
  return s;
}

sl_status sl__source_open_files(sl_source *src, bool readers) {
  if (!src) return SL_ERR_INVALID;
  if (src->memory)
    return sl__source_memory_refuse(src, readers ? "reading by distributed readers (read_mode readers)"
                                                 : "every-rank reading (read_mode every_rank)");
  if (src->has_files) return SL_OK;
  sl_context *ctx = src->ctx;
  sl_status s = SL_OK;
  for (size_t f = 0; f < src->file_count; f++) {
    src_file *sf = &src->files[f];
    uint64_t need = 0;
    const char *last = NULL;
    for (size_t i = 0; i < src->count; i++) {
      if (src->file_of[i] != f) continue;
      uint64_t end = src->tensors[i].file_offset + src->tensors[i].nbytes;
      if (end > need) need = end, last = src->tensors[i].name;
    }
    int fd;
    struct stat st;
    s = sl__source_open_regular(ctx, sf->path,
                                readers ? " on this rank, a reader (distributed readers need the checkpoint on "
                                          "every reader: give this host a copy, or choose --readers to match)"
                                        : " on this rank (every-rank reading needs the checkpoint on a filesystem "
                                          "every rank sees)",
                                &fd, &st);
    if (s != SL_OK) goto out_close;
    if ((uint64_t)st.st_size < need) {
      s = sl__fail(ctx, SL_ERR_FORMAT,
                   "%s: %" PRIu64 " bytes on this rank, but tensor '%s' ends at byte %" PRIu64
                   " in the file rank 0 validated (a different or truncated copy?)",
                   sf->path, (uint64_t)st.st_size, last, need);
      close(fd);
      goto out_close;
    }
    /* records what this rank opened; later reopens (the open files are bounded) must match */
    sl__source_adopt_fd(src, f, fd, &st);
  }
  src->has_files = true;
  return SL_OK;
out_close:
  for (size_t k = 0; k < src->file_count; k++) {
    src_file *sf = &src->files[k];
    if (sf->fd >= 0) close(sf->fd);
    sf->fd = -1;
  }
  src->open_count = 0;
  return s;
}
