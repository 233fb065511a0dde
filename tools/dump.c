/* --dump: one rank's shards as a safetensors file (global shape and offset in __metadata__),
 * read back through the backend, written atomically: a temporary file in the directory,
 * synced, renamed over the destination. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/* Bytes copied back from the backend at a time while dumping: bounded so a dump never holds
 * a second copy of the rank's state. */
#define DUMP_CHUNK (16u << 20)

static int make_dirs(const char *dir) {
  char *p = strdup(dir);
  if (!p) return -1;
  for (char *c = p + 1; *c; c++) {
    if (*c != '/') continue;
    *c = 0;
    if (mkdir(p, 0777) != 0 && errno != EEXIST) goto out_fail;
    *c = '/';
  }
  if (mkdir(p, 0777) != 0 && errno != EEXIST) goto out_fail;
  free(p);
  return 0;
out_fail:
  free(p);
  return -1;
}

/* Sets META[NAME SUFFIX] to the dims as a string; 0 on success. The key is as long as the name
 * (a fixed buffer would cut a long name: two keys would collide, or a cut UTF-8 sequence would
 * make jansson refuse the key and the dump silently lose it). */
static int dump_meta_dims(json_t *meta, const char *name, const char *suffix, int ndim, const int64_t *dims) {
  char *key = NULL, val[256];
  if (asprintf(&key, "%s%s", name, suffix) < 0) return -1;
  int rc = json_object_set_new(meta, key, json_string(cli_dims_str(val, sizeof val, ndim, dims)));
  free(key);
  return rc;
}

/* The safetensors header of the dump: tensors in state order with contiguous offsets, and the
 * global geometry in __metadata__ (whose values must be strings). NULL when it cannot be
 * built, with the tensor it failed at in *FAILED_AT (NULL: none in particular). */
static json_t *dump_header(const sl_state *st, int rank, int world, const char **failed_at) {
  json_t *hdr = json_object(), *meta = json_object();
  char val[256];
  size_t n = sl_state_count(st);
  *failed_at = NULL;
  if (json_object_set_new(hdr, "__metadata__", meta) != 0) goto fail;
  for (size_t i = 0; i < n; i++) {
    const sl_tensor *t = sl_state_tensor(st, i);
    *failed_at = t->name;
    if (dump_meta_dims(meta, t->name, ".global_shape", t->ndim, t->global_shape) != 0 ||
        dump_meta_dims(meta, t->name, ".global_offset", t->ndim, t->global_offset) != 0)
      goto fail;
  }
  *failed_at = NULL;
  snprintf(val, sizeof val, "%d", rank);
  if (json_object_set_new(meta, "rank", json_string(val)) != 0) goto fail;
  snprintf(val, sizeof val, "%d", world);
  if (json_object_set_new(meta, "world_size", json_string(val)) != 0) goto fail;

  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    const sl_tensor *t = sl_state_tensor(st, i);
    *failed_at = t->name;
    if (cli_st_header_add(hdr, t->name, sl_dtype_name(t->dtype), t->ndim, t->local_shape, off, t->nbytes) != 0)
      goto fail;
    off += t->nbytes;
  }
  *failed_at = NULL;
  return hdr;
fail:
  json_decref(hdr);
  return NULL;
}

/* A dump failure: prints the error line and leaves "SUBJECT: message" as the context's message,
 * which sl_context_agree hands to the other ranks. */
static sl_status dump_fail(sl_context *ctx, const char *subject, sl_status s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static sl_status dump_fail(sl_context *ctx, const char *subject, sl_status s, const char *fmt, ...) {
  char msg[1024], both[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  cli_error(subject, s, "%s", msg);
  snprintf(both, sizeof both, "%s: %s", subject, msg);
  sl_context_set_error(ctx, s, both);
  return s;
}

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len) {
    ssize_t k = write(fd, p, len);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = EIO;
      return -1;
    }
    p += k;
    len -= (size_t)k;
  }
  return 0;
}

/* A temporary file of its own in DIRFD, named TMP (".rank-R.safetensors.<random>.tmp"): never
 * an existing file, never through a symlink. */
static int create_temp(int dirfd, int rank, char *tmp, size_t tmp_len) {
  for (int attempt = 0; attempt < 16; attempt++) {
    unsigned char rnd[8];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) return -1;
    char hex[17];
    for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
    snprintf(tmp, tmp_len, ".rank-%d.safetensors.%s.tmp", rank, hex);
    int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

/* Writes DIR/rank-<r>.safetensors atomically: into a temporary file of the directory, synced,
 * then renamed over the destination (rename replaces a symlink there instead of following
 * it), so a full disk, a killed rank or a failed copy never leaves a file claiming the full
 * size. Device memory is read back only through the backend, one bounded chunk at a time.
 * Prints the error line itself and leaves the message in the context. */
sl_status cli_dump_rank(sl_context *ctx, const sl_state *st, const char *dir, int rank, int world, char *path,
                        size_t path_len) {
  sl_status rc = SL_ERR_IO;
  char name[64], tmp[96];
  snprintf(name, sizeof name, "rank-%d.safetensors", rank);
  snprintf(path, path_len, "%s/%s", dir, name);
  if (make_dirs(dir) != 0)
    return dump_fail(ctx, dir, SL_ERR_IO, "cannot create the dump directory: %s; give a writable --dump DIR",
                     strerror(errno));
  int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0)
    return dump_fail(ctx, dir, SL_ERR_IO, "cannot open the dump directory: %s; give a writable --dump DIR",
                     strerror(errno));
  const char *failed_at = NULL;
  json_t *hdr = dump_header(st, rank, world, &failed_at);
  char *text = hdr ? json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(hdr);
  char *buf = NULL;
  int fd = -1;
  if (!text) {
    /* every key is a tensor name and valid UTF-8 (it came from a JSON header), so only a lack
     * of memory makes jansson refuse one */
    if (failed_at)
      rc = dump_fail(ctx, path, SL_ERR_NOMEM, "cannot build the dump header at tensor '%s' (out of memory); "
                     "free memory and load again", failed_at);
    else
      rc = dump_fail(ctx, path, SL_ERR_NOMEM, "cannot build the dump header (out of memory); free memory and "
                     "load again");
    goto out_dir;
  }
  buf = malloc(DUMP_CHUNK);
  if (!buf) {
    rc = dump_fail(ctx, path, SL_ERR_NOMEM, "cannot allocate the %u-byte dump buffer", DUMP_CHUNK);
    goto out_dir;
  }
  if ((fd = create_temp(dirfd, rank, tmp, sizeof tmp)) < 0) {
    rc = dump_fail(ctx, dir, SL_ERR_IO, "cannot create a temporary dump file: %s; give a writable --dump DIR",
                   strerror(errno));
    goto out_dir;
  }
  size_t hlen = strlen(text);
  size_t padded = (hlen + 7) & ~(size_t)7; /* the data section starts 8-byte aligned */
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  memset(buf, ' ', 8);
  int ok = write_all(fd, le, 8) == 0 && write_all(fd, text, hlen) == 0 &&
           write_all(fd, buf, padded - hlen) == 0;
  for (size_t i = 0; ok && i < sl_state_count(st); i++) {
    const sl_tensor *t = sl_state_tensor(st, i);
    for (uint64_t done = 0; ok && done < t->nbytes;) {
      size_t n = t->nbytes - done < DUMP_CHUNK ? (size_t)(t->nbytes - done) : DUMP_CHUNK;
      sl_status s = sl_copy_to_host(ctx, buf, (const char *)t->data + done, t->device, n);
      if (s != SL_OK) {
        rc = dump_fail(ctx, t->name, s, "%s", sl_context_errmsg(ctx)[0] ? sl_context_errmsg(ctx) : sl_strerror(s));
        goto out_unlink;
      }
      ok = write_all(fd, buf, n) == 0;
      done += n;
    }
  }
  /* the data must be on disk before the name says the file is complete */
  if (!ok || fsync(fd) != 0) {
    rc = dump_fail(ctx, path, SL_ERR_IO, "cannot write the dump: %s; check the space in the --dump DIR",
                   strerror(errno));
    goto out_unlink;
  }
  int cr = close(fd);
  fd = -1;
  if (cr != 0) {
    rc = dump_fail(ctx, path, SL_ERR_IO, "cannot write the dump: %s; check the space in the --dump DIR",
                   strerror(errno));
    goto out_unlink;
  }
  if (renameat(dirfd, tmp, dirfd, name) != 0) {
    rc = dump_fail(ctx, path, SL_ERR_IO, "cannot put the dump in place: %s; remove what is at that path",
                   strerror(errno));
    goto out_unlink;
  }
  fsync(dirfd); /* the rename itself: best effort, the file is complete either way */
  rc = SL_OK;
  goto out_dir;

out_unlink:
  if (fd >= 0) close(fd);
  unlinkat(dirfd, tmp, 0);
out_dir:
  close(dirfd);
  free(buf);
  free(text);
  return rc;
}

