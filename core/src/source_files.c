/* The source's file access layer: opening only regular files, without blocking; the bounded,
 * least-recently-used set of open descriptors, with the same-file check on reopen
 * (docs/DESIGN.md#files); positional reads of tensor bytes; and the per-file fingerprint that
 * checkpoint identity compares across ranks (docs/DESIGN.md#identity). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "source_impl.h"

/* ---- open files: regular files only, a bounded number at once -------------------------- */

/* A quarter of the descriptor limit, at most SL__SOURCE_MAX_OPEN: the rest stays for the
 * collectives' sockets, the backend and the caller. */
size_t sl__source_open_bound(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return SL__SOURCE_MAX_OPEN;
  rlim_t quarter = rl.rlim_cur / 4;
  if (quarter > SL__SOURCE_MAX_OPEN) return SL__SOURCE_MAX_OPEN;
  return quarter ? (size_t)quarter : 1;
}

static const char *file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "a special file";
}

static sl_status not_regular(sl_context *ctx, const char *path, mode_t mode) {
  return sl__fail(ctx, SL_ERR_INVALID,
                  "%s: is %s, not a regular file; checkpoint files must be regular files (or symlinks to "
                  "regular files)",
                  path, file_kind(mode));
}

sl_status sl__source_open_regular(sl_context *ctx, const char *path, const char *why, int *fd, struct stat *st) {
  *fd = -1;
  /* Opening a device can act on it (a tape rewinds, a terminal becomes the controlling one):
   * refuse what is not a regular file by name first. The fstat below stays the authority,
   * since the name can change between the two. */
  if (stat(path, st) == 0 && !S_ISREG(st->st_mode)) return not_regular(ctx, path, st->st_mode);
  /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever;
   * O_NOCTTY: a terminal opened anyway never becomes the process's controlling one. */
  int f = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (f < 0) {
    int e = errno;
    /* a socket cannot be opened at all (ENXIO): say what it is rather than "no such device" */
    if (e == ENXIO && stat(path, st) == 0 && !S_ISREG(st->st_mode))
      return not_regular(ctx, path, st->st_mode);
    return sl__fail(ctx, e == ENOENT ? SL_ERR_NOT_FOUND : SL_ERR_IO, "%s: cannot open%s: %s%s", path, why,
                    strerror(e),
                    e == EMFILE || e == ENFILE ? " (too many open files: raise the limit, e.g. ulimit -n 4096)"
                                               : "");
  }
  sl_status s = SL_OK;
  if (fstat(f, st) != 0) {
    s = sl__fail(ctx, SL_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    goto out_close;
  }
  if (!S_ISREG(st->st_mode)) {
    s = not_regular(ctx, path, st->st_mode);
    goto out_close;
  }
  /* reads from a regular file never block; clear the flag anyway so nothing later sees EAGAIN */
  int fl = fcntl(f, F_GETFL);
  if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    s = sl__fail(ctx, SL_ERR_IO, "%s: cannot set the descriptor blocking: %s", path, strerror(errno));
    goto out_close;
  }
  *fd = f;
  return SL_OK;
out_close:
  close(f);
  return s;
}

/* Closes the least recently used open file other than KEEP; false when there is none. */
static bool evict_one(sl_source *src, size_t keep) {
  size_t victim = SIZE_MAX;
  for (size_t f = 0; f < src->file_count; f++) {
    if (f == keep || src->files[f].fd < 0) continue;
    if (victim == SIZE_MAX || src->files[f].last_use < src->files[victim].last_use) victim = f;
  }
  if (victim == SIZE_MAX) return false;
  close(src->files[victim].fd);
  src->files[victim].fd = -1;
  src->open_count--;
  return true;
}

void sl__source_adopt_fd(sl_source *src, size_t f, int fd, const struct stat *st) {
  src_file *sf = &src->files[f];
  while (src->open_count >= src->max_open && evict_one(src, f)) {
  }
  sf->fd = fd;
  sf->last_use = ++src->use_clock;
  src->open_count++;
  /* On a reopen sl__source_fd has checked that these are unchanged. */
  sf->dev = st->st_dev;
  sf->ino = st->st_ino;
  sf->size = (uint64_t)st->st_size;
  sf->mtime = st->st_mtim;
  sf->ctime = st->st_ctim;
}

static bool same_time(struct timespec a, struct timespec b) { return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec; }

void sl__source_set_max_open(sl_source *src, size_t n) {
  src->max_open = n ? n : 1;
  while (src->open_count > src->max_open && evict_one(src, SIZE_MAX)) {
  }
}

sl_status sl__source_fd(sl_source *src, size_t f, int *fd) {
  src_file *sf = &src->files[f];
  if (sf->fd >= 0) {
    sf->last_use = ++src->use_clock;
    *fd = sf->fd;
    return SL_OK;
  }
  struct stat st;
  int nfd;
  sl_status s = sl__source_open_regular(src->ctx, sf->path, " again", &nfd, &st);
  if (s != SL_OK) return s;
  /* It was closed only to bound the open files: what we reopen must be what we validated. */
  if (st.st_dev != sf->dev || st.st_ino != sf->ino || (uint64_t)st.st_size != sf->size ||
      !same_time(st.st_mtim, sf->mtime) || !same_time(st.st_ctim, sf->ctime)) {
    close(nfd);
    return sl__fail(src->ctx, SL_ERR_IO,
                    "%s: the file changed during the load (first opened as inode %ju, %" PRIu64
                    " bytes, modified at %lld.%09ld; now inode %ju, %" PRIu64
                    " bytes, modified at %lld.%09ld): it was replaced or rewritten; load again once the "
                    "checkpoint is stable",
                    sf->path, (uintmax_t)sf->ino, sf->size, (long long)sf->mtime.tv_sec, sf->mtime.tv_nsec,
                    (uintmax_t)st.st_ino, (uint64_t)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  }
  sl__source_adopt_fd(src, f, nfd, &st);
  *fd = nfd;
  return SL_OK;
}

/* ---- checkpoint identity ---------------------------------------------------------------- */

#define FP_BLOCK (64u * 1024u) /* bytes per sampled data block */
#define FP_SAMPLES 18u          /* first, last and 16 evenly spaced between */

static void hash_u64(XXH3_state_t *h, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  XXH3_64bits_update(h, b, 8);
}

uint64_t sl__source_combine_digests(const uint64_t *digests, size_t n) {
  if (!n) return 0;
  XXH3_state_t h;
  XXH3_64bits_reset(&h);
  for (size_t f = 0; f < n; f++) hash_u64(&h, digests[f]);
  return XXH3_64bits_digest(&h);
}

uint64_t sl__source_headers_digest(const sl_source *src) { return src ? src->headers_digest : 0; }

size_t sl__source_file_count(const sl_source *src) { return src ? src->file_count : 0; }

const char *sl__source_file_name(const sl_source *src, size_t f) {
  return src && f < src->file_count ? src->files[f].name : NULL;
}

/* Hashes LEN bytes of FD from OFF into H through BUF (FP_BLOCK bytes); a short read means the
 * file shrank under us. */
static sl_status hash_range(sl_source *src, const char *path, int fd, uint64_t off, uint64_t len, uint8_t *buf,
                            XXH3_state_t *h) {
  while (len) {
    size_t n = len < FP_BLOCK ? (size_t)len : FP_BLOCK;
    ssize_t r = sl__pread_full(fd, buf, n, off);
    if (r < 0) return sl__fail(src->ctx, SL_ERR_IO, "%s: read at byte %" PRIu64 " failed: %s", path, off, strerror(errno));
    if ((size_t)r < n)
      return sl__fail(src->ctx, SL_ERR_IO, "%s: file ends at byte %" PRIu64 ": it was truncated while open", path,
                      off + (uint64_t)r);
    XXH3_64bits_update(h, buf, n);
    off += n;
    len -= n;
  }
  return SL_OK;
}

sl_status sl__source_file_fingerprint(sl_source *src, size_t f, uint64_t out[2]) {
  if (!src || f >= src->file_count || !out)
    return sl__fail(src ? src->ctx : NULL, SL_ERR_INVALID, "file fingerprint: invalid arguments");
  sl_context *ctx = src->ctx;
  const char *path = src->files[f].path;
  if (src->memory) return sl__source_memory_refuse(src, "fingerprinting its file for every-rank reading");
  if (!src->has_files)
    return sl__fail(ctx, SL_ERR_INVALID, "file fingerprint of %s: the file is not open on this rank", path);
  int fd;
  sl_status s = sl__source_fd(src, f, &fd);
  if (s != SL_OK) return s;
  struct stat st;
  if (fstat(fd, &st) != 0) return sl__fail(ctx, SL_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
  uint64_t size = (uint64_t)st.st_size;
  uint8_t *buf = malloc(FP_BLOCK);
  XXH3_state_t *h = XXH3_createState();
  if (!buf || !h) {
    s = sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
    goto out_buf;
  }
  uint8_t head[8] = {0};
  ssize_t r = size >= 8 ? sl__pread_full(fd, head, 8, 0) : 0;
  if (r < 0) {
    s = sl__fail(ctx, SL_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    goto out_buf;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | head[i];
  if (r < 8 || n > SL__ST_MAX_HEADER || n > size - 8) {
    s = sl__fail(ctx, SL_ERR_FORMAT, "%s: on this rank the file (%" PRIu64 " bytes) does not start with a valid "
                 "safetensors header length (a different or damaged copy?)", path, size);
    goto out_buf;
  }
  /* out[0]: the same bytes, hashed the same way, as the header digest taken at open */
  XXH3_64bits_reset(h);
  XXH3_64bits_update(h, head, 8);
  if ((s = hash_range(src, path, fd, 8, n, buf, h)) != SL_OK) goto out_buf;
  out[0] = XXH3_64bits_digest(h);
  /* out[1]: the size, then each sampled block with its offset; small data sections whole */
  uint64_t data = 8 + n, dlen = size - data;
  XXH3_64bits_reset(h);
  hash_u64(h, size);
  if (dlen <= (uint64_t)FP_SAMPLES * FP_BLOCK) {
    s = hash_range(src, path, fd, data, dlen, buf, h);
  } else {
    uint64_t span = dlen - FP_BLOCK, step = span / (FP_SAMPLES - 1), rem = span % (FP_SAMPLES - 1);
    for (uint64_t i = 0; i < FP_SAMPLES && s == SL_OK; i++) {
      uint64_t off = step * i + rem * i / (FP_SAMPLES - 1); /* i * span / 17 without overflow */
      hash_u64(h, off);
      s = hash_range(src, path, fd, data + off, FP_BLOCK, buf, h);
    }
  }
  if (s == SL_OK) out[1] = XXH3_64bits_digest(h);
out_buf:
  XXH3_freeState(h);
  free(buf);
  return s;
}

/* ---- reading -------------------------------------------------------------------------- */

/* The checks every read of tensor I's bytes passes first: the caller's arguments and the
 * tensor's bounds. */
static sl_status check_read(sl_source *src, size_t i, uint64_t offset_in_tensor, const void *dst, size_t bytes) {
  if (!src || i >= src->count || (!dst && bytes))
    return sl__fail(src ? src->ctx : NULL, SL_ERR_INVALID, "source read: invalid arguments");
  const sl_source_tensor *t = &src->tensors[i];
  uint64_t end;
  if (!sl__add_u64(offset_in_tensor, bytes, &end) || end > t->nbytes)
    return sl__fail(src->ctx, SL_ERR_INVALID,
                    "source read of tensor '%s': bytes [%" PRIu64 ",%" PRIu64 ") are outside its %" PRIu64 " bytes",
                    t->name, offset_in_tensor, end, t->nbytes);
  return SL_OK;
}

/* A read of tensor T's bytes from file F failed at byte AT: an error (ERR, errno's), or the end
 * of the file (ERR 0). */
static sl_status read_failed(sl_source *src, const src_file *f, const sl_source_tensor *t, uint64_t at, int err) {
  if (err && at < t->file_offset) /* a coalesced read, in the gap before the tensor */
    return sl__fail(src->ctx, SL_ERR_IO, "%s: read at byte %" PRIu64 ", before tensor '%s' (bytes %" PRIu64 "..%" PRIu64 "), failed: %s",
                    f->path, at, t->name, t->file_offset, t->file_offset + t->nbytes, strerror(err));
  if (err)
    return sl__fail(src->ctx, SL_ERR_IO, "%s: read of tensor '%s' at byte %" PRIu64 " failed: %s", f->path, t->name, at,
                    strerror(err));
  /* a coalesced read may meet the end in the gap before the tensor: say so rather than "inside" */
  return sl__fail(src->ctx, SL_ERR_IO,
                  "%s: file ends at byte %" PRIu64 ", %s tensor '%s' (bytes %" PRIu64 "..%" PRIu64
                  "): the file was truncated after it was opened",
                  f->path, at, at < t->file_offset ? "before" : "inside", t->name, t->file_offset,
                  t->file_offset + t->nbytes);
}

sl_status sl__source_pread(sl_source *src, size_t i, uint64_t offset_in_tensor, void *dst, size_t bytes) {
  sl_status s = check_read(src, i, offset_in_tensor, dst, bytes);
  if (s != SL_OK) return s;
  const sl_source_tensor *t = &src->tensors[i];
  if (src->memory) return sl__source_memory_pread(src, i, offset_in_tensor, dst, bytes);
  const src_file *f = &src->files[src->file_of[i]];
  if (!src->has_files)
    return sl__fail(src->ctx, SL_ERR_INVALID, "source read of tensor '%s': file '%s' is not open on this rank",
                    t->name, f->path);
  int fd;
  if ((s = sl__source_fd(src, src->file_of[i], &fd)) != SL_OK) return s;
  uint64_t off = t->file_offset + offset_in_tensor;
  ssize_t r = sl__pread_full(fd, dst, bytes, off);
  if (r < 0) return read_failed(src, f, t, off, errno);
  if ((size_t)r < bytes) return read_failed(src, f, t, off + (uint64_t)r, 0);
  return SL_OK;
}

/* ---- coalesced reads ---------------------------------------------------------------------- */
/* At 50,000 tensors of a few KiB, one pread per run is most of an every-rank load's CPU time:
 * runs that follow one another in a file (with small gaps: the other ranks' rows, tensors this
 * rank skips) go in one preadv instead. */

void sl__source_read_discard(sl__read_batch *b) {
  b->nreq = 0;
  b->niov = 0;
}

sl_status sl__source_read_add(sl_source *src, sl__read_batch *b, size_t i, uint64_t offset_in_tensor, void *dst,
                              size_t bytes) {
  b->failed = NULL;
  sl_status s = check_read(src, i, offset_in_tensor, dst, bytes);
  if (s != SL_OK) {
    b->failed = src && i < src->count ? src->tensors[i].name : NULL;
    return s;
  }
  if (!bytes) return SL_OK;
  const sl_source_tensor *t = &src->tensors[i];
  if (src->memory || !src->has_files || bytes > SL__READ_SPAN) {
    /* nothing to coalesce (no file), or a read as wide as a whole batch: at once, in order */
    if ((s = sl__source_read_flush(src, b)) != SL_OK) return s;
    double t0 = sl__now_s();
    s = sl__source_pread(src, i, offset_in_tensor, dst, bytes);
    b->seconds += sl__now_s() - t0;
    if (s != SL_OK) {
      b->failed = t->name;
      return s;
    }
    b->done += bytes;
    return SL_OK;
  }
  size_t f = src->file_of[i];
  uint64_t off = t->file_offset + offset_in_tensor, end = off + bytes; /* within the file: checked at open */
  if (b->nreq && !(f == b->file && off >= b->end && off - b->end <= SL__READ_GAP && end - b->start <= SL__READ_SPAN &&
                   b->niov + (off > b->end) + 1 <= SL__READ_IOV)) {
    if ((s = sl__source_read_flush(src, b)) != SL_OK) return s;
  }
  if (!b->nreq) {
    b->file = f;
    b->start = b->end = off;
  }
  /* every gap reads into the one scratch buffer: its bytes are nobody's */
  if (off > b->end) b->iov[b->niov++] = (struct iovec){b->gap, (size_t)(off - b->end)};
  b->iov[b->niov++] = (struct iovec){dst, bytes};
  b->req[b->nreq].tensor = i;
  b->req[b->nreq].off = off;
  b->req[b->nreq++].bytes = bytes;
  b->end = end;
  return SL_OK;
}

sl_status sl__source_read_flush(sl_source *src, sl__read_batch *b) {
  b->failed = NULL;
  if (!b->nreq) return SL_OK;
  const src_file *f = &src->files[b->file];
  int fd;
  sl_status s = sl__source_fd(src, b->file, &fd);
  if (s != SL_OK) {
    b->failed = src->tensors[b->req[0].tensor].name;
    sl__source_read_discard(b);
    return s;
  }
  double t0 = sl__now_s();
  ssize_t r = sl__preadv_full(fd, b->iov, b->niov, b->start);
  int err = r < 0 ? errno : 0;
  b->seconds += sl__now_s() - t0;
  /* how far it got, after a failure too: the bytes the iovecs still want (the last iovec is
   * always a request's, so a failure leaves a request not read whole) */
  uint64_t left = 0;
  for (int k = 0; k < b->niov; k++) left += b->iov[k].iov_len;
  uint64_t at = b->end - left;
  size_t k = 0;
  for (; k < b->nreq && b->req[k].off + b->req[k].bytes <= at; k++) b->done += b->req[k].bytes;
  if (k < b->nreq) {
    const sl_source_tensor *t = &src->tensors[b->req[k].tensor];
    b->failed = t->name;
    s = read_failed(src, f, t, at, err);
  }
  sl__source_read_discard(b);
  return s;
}
