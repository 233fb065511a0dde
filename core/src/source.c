/* The checkpoint source: one .safetensors file, a sharded model.safetensors.index.json, or a
 * directory holding one, validated as a whole before any byte moves (phase 1). This file holds
 * the handle with its name index and builds it from the files' headers; the files themselves
 * are opened and read through source_files.c (regular files only, never blocking, a bounded
 * number open: docs/DESIGN.md#files), the index is parsed and its names confined to its
 * directory in source_index.c, and the manifest that carries the validated tensor table from
 * rank 0 to the other ranks is in source_manifest.c. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "internal.h"

#define INDEX_NAME "model.safetensors.index.json"

#include "source_impl.h"

/* ---- the handle ----------------------------------------------------------------------- */

sl_source *sl__source_new(sl_context *ctx) {
  sl_source *src = calloc(1, sizeof *src);
  if (!src) return NULL;
  src->ctx = ctx;
  src->max_open = sl__source_open_bound();
  return src;
}

void sl_source_destroy(sl_source *src) {
  if (!src) return;
  for (size_t i = 0; i < src->count; i++) free((char *)src->tensors[i].name);
  free(src->tensors);
  free(src->file_of);
  for (size_t i = 0; i < src->file_count; i++) {
    if (src->files[i].fd >= 0) close(src->files[i].fd);
    free(src->files[i].path);
    free(src->files[i].name);
  }
  free(src->files);
  sl__free_pairs(src->meta_keys, src->meta_values, src->meta_count);
  free(src->slots);
  free(src->mem_data);
  free(src);
}

static uint64_t name_hash(const char *name) { return XXH3_64bits(name, strlen(name)); }

/* Builds the name index; a name seen twice is reported through *dup (index of the second). */
sl_status sl__source_build_index(sl_source *src, size_t *dup) {
  size_t cap = 8;
  while (cap < 2 * src->count) cap <<= 1;
  free(src->slots);
  src->slots = calloc(cap, sizeof *src->slots);
  if (!src->slots) return SL_ERR_NOMEM;
  src->slot_mask = cap - 1;
  for (size_t i = 0; i < src->count; i++) {
    size_t h = (size_t)name_hash(src->tensors[i].name) & src->slot_mask;
    while (src->slots[h]) {
      if (!strcmp(src->tensors[src->slots[h] - 1].name, src->tensors[i].name)) {
        *dup = i;
        return SL_ERR_FORMAT;
      }
      h = (h + 1) & src->slot_mask;
    }
    src->slots[h] = i + 1;
  }
  return SL_OK;
}

static size_t find_index(const sl_source *src, const char *name) {
  if (!src->slots) return SIZE_MAX;
  size_t h = (size_t)name_hash(name) & src->slot_mask;
  while (src->slots[h]) {
    if (!strcmp(src->tensors[src->slots[h] - 1].name, name)) return src->slots[h] - 1;
    h = (h + 1) & src->slot_mask;
  }
  return SIZE_MAX;
}

size_t sl_source_tensor_count(const sl_source *src) { return src ? src->count : 0; }

const sl_source_tensor *sl_source_tensor_at(const sl_source *src, size_t i) {
  return src && i < src->count ? &src->tensors[i] : NULL;
}

const sl_source_tensor *sl_source_find(const sl_source *src, const char *name) {
  if (!src || !name) return NULL;
  size_t i = find_index(src, name);
  return i == SIZE_MAX ? NULL : &src->tensors[i];
}

size_t sl_source_file_count(const sl_source *src) { return src ? src->file_count : 0; }

const char *sl_source_file_at(const sl_source *src, size_t i) {
  return src && i < src->file_count ? src->files[i].path : NULL;
}

uint64_t sl_source_total_bytes(const sl_source *src) { return src ? src->total_bytes : 0; }

size_t sl_source_metadata_count(const sl_source *src) { return src ? src->meta_count : 0; }

sl_status sl_source_metadata_at(const sl_source *src, size_t i, const char **key, const char **value) {
  if (key) *key = NULL;
  if (value) *value = NULL;
  if (!src || i >= src->meta_count) return SL_ERR_INVALID;
  if (key) *key = src->meta_keys[i];
  if (value) *value = src->meta_values[i];
  return SL_OK;
}

bool sl__source_has_files(const sl_source *src) { return src && src->has_files; }

/* ---- building from headers ------------------------------------------------------------ */

static sl_status add_file(sl_source *src, const char *path, const char *name) {
  src_file *nf = realloc(src->files, (src->file_count + 1) * sizeof *nf);
  if (!nf) return SL_ERR_NOMEM;
  src->files = nf;
  src_file *f = &nf[src->file_count];
  memset(f, 0, sizeof *f);
  f->fd = -1;
  f->path = sl__strdup(path);
  f->name = sl__strdup(name);
  src->file_count++; /* counted at once: destroy frees what was allocated */
  return f->path && f->name ? SL_OK : SL_ERR_NOMEM;
}

/* Appends the tensors of header H (file FILE) in file order, taking their names. */
static sl_status add_tensors(sl_source *src, size_t file, sl__st_header *h) {
  if (!h->count) return SL_OK;
  size_t n = src->count + h->count;
  sl_source_tensor *nt = realloc(src->tensors, n * sizeof *nt);
  if (!nt) return SL_ERR_NOMEM;
  src->tensors = nt;
  size_t *nf = realloc(src->file_of, n * sizeof *nf);
  if (!nf) return SL_ERR_NOMEM;
  src->file_of = nf;
  for (size_t k = 0; k < h->count; k++) {
    sl__st_tensor *st = &h->tensors[k];
    sl_source_tensor *t = &src->tensors[src->count];
    memset(t, 0, sizeof *t);
    t->name = st->name;
    st->name = NULL;
    t->dtype = st->dtype;
    t->ndim = st->ndim;
    memcpy(t->shape, st->shape, sizeof t->shape);
    t->nbytes = st->end - st->begin;
    t->file = src->files[file].path;
    t->file_offset = h->data_offset + st->begin;
    src->file_of[src->count] = file;
    src->total_bytes += t->nbytes;
    src->count++;
  }
  return SL_OK;
}

/* Opens PATH (named NAME by the index), reads and validates its header; the fd joins the
 * source's bounded set of open files. */
static sl_status open_st(sl_source *src, const char *path, const char *name, sl__st_header *h, size_t *file) {
  sl_context *ctx = src->ctx;
  int fd;
  struct stat st;
  sl_status s = sl__source_open_regular(ctx, path, "", &fd, &st);
  if (s != SL_OK) return s;
  if (add_file(src, path, name) != SL_OK) {
    close(fd);
    return sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
  }
  *file = src->file_count - 1;
  sl__source_adopt_fd(src, *file, fd, &st);
  char err[SL__ERRMSG_LEN - 128];
  s = sl__st_read(fd, h, err, sizeof err);
  if (s != SL_OK) return sl__fail(ctx, s, "%s: %s", path, err);
  src->files[*file].header_digest = h->header_digest;
  src->files[*file].data_offset = h->data_offset;
  return SL_OK;
}

/* The headers digest, then the name index. */
static sl_status finish(sl_source *src, bool from_index) {
  uint64_t *digests = malloc((src->file_count ? src->file_count : 1) * sizeof *digests);
  if (!digests) return sl__fail(src->ctx, SL_ERR_NOMEM, "out of memory");
  for (size_t f = 0; f < src->file_count; f++) digests[f] = src->files[f].header_digest;
  src->headers_digest = sl__source_combine_digests(digests, src->file_count);
  free(digests);
  src->meta_from_index = from_index;
  size_t dup = 0;
  sl_status s = sl__source_build_index(src, &dup);
  if (s == SL_ERR_NOMEM) return sl__fail(src->ctx, s, "out of memory");
  if (s != SL_OK)
    return sl__fail(src->ctx, s, "tensor '%s' appears twice in the checkpoint (second copy in %s)",
                    src->tensors[dup].name, src->tensors[dup].file);
  src->has_files = true;
  return SL_OK;
}

static sl_status open_single(sl_source *src, const char *path) {
  sl__st_header h;
  size_t file;
  const char *slash = strrchr(path, '/');
  sl_status s = open_st(src, path, slash ? slash + 1 : path, &h, &file);
  if (s != SL_OK) return s;
  if ((s = add_tensors(src, file, &h)) != SL_OK) {
    s = sl__fail(src->ctx, s, "out of memory");
    goto out_header;
  }
  /* take the metadata as it is */
  src->meta_keys = h.meta_keys;
  src->meta_values = h.meta_values;
  src->meta_count = h.meta_count;
  h.meta_keys = h.meta_values = NULL;
  h.meta_count = 0;
  s = finish(src, false);
out_header:
  sl__st_header_free(&h);
  return s;
}

/* ---- index.json: the files it names, checked against it -------------------------------- */

static sl_status read_whole(sl_context *ctx, const char *path, char **buf, size_t *len) {
  int fd;
  struct stat st;
  sl_status s = sl__source_open_regular(ctx, path, "", &fd, &st);
  if (s != SL_OK) return s;
  if ((uint64_t)st.st_size > SL__ST_MAX_HEADER) {
    s = sl__fail(ctx, SL_ERR_FORMAT, "%s: %" PRIu64 " bytes is too large for an index (limit %llu)", path,
                 (uint64_t)st.st_size, SL__ST_MAX_HEADER);
    goto out_fd;
  }
  *len = (size_t)st.st_size;
  if (!(*buf = malloc(*len + 1))) {
    s = sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
    goto out_fd;
  }
  ssize_t r = sl__pread_full(fd, *buf, *len, 0);
  if (r < 0 || (size_t)r != *len) {
    s = sl__fail(ctx, SL_ERR_IO, "%s: cannot read: %s", path, r < 0 ? strerror(errno) : "file shrank");
    free(*buf);
    *buf = NULL;
  }
out_fd:
  close(fd);
  return s;
}

static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return sl__strdup(".");
  if (slash == path) return sl__strdup("/");
  return strndup(path, (size_t)(slash - path));
}

/* DIR/NAME. NAME is always relative: a constant, a directory entry, a weight_map name (the
 * path rule refuses absolute ones, source_index.c) or a path without a leading '/'. */
static char *join(const char *dir, const char *name) {
  char *p = NULL;
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') n--;
  if (asprintf(&p, "%.*s/%s", (int)n, dir, name) < 0) return NULL;
  return p;
}

/* The first weight_map tensor that maps to file F (for messages). */
static const char *first_tensor_of(const sl__index *ix, size_t f) {
  for (size_t i = 0; i < ix->count; i++)
    if (ix->file_of[i] == f) return ix->names[i];
  return "?";
}

/* Every weight_map entry must be in the file it names, and every tensor in the files must be
 * in the weight_map: otherwise the checkpoint is inconsistent and we cannot tell which copy the
 * trainer meant. */
static sl_status check_against_index(sl_source *src, const sl__index *ix, const char *index_path) {
  sl_context *ctx = src->ctx;
  unsigned char *listed = calloc(src->count ? src->count : 1, 1);
  if (!listed) return sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
  sl_status s = SL_OK;
  for (size_t i = 0; i < ix->count; i++) {
    size_t t = find_index(src, ix->names[i]);
    const char *want = src->files[ix->file_of[i]].path;
    if (t == SIZE_MAX) {
      s = sl__fail(ctx, SL_ERR_FORMAT,
                   "%s: weight_map puts tensor '%s' in %s, but that file does not hold it (the checkpoint is "
                   "inconsistent; re-save it)",
                   index_path, ix->names[i], want);
      goto out_listed;
    }
    if (src->file_of[t] != ix->file_of[i]) {
      s = sl__fail(ctx, SL_ERR_FORMAT,
                   "%s: weight_map puts tensor '%s' in %s, but it is in %s (the checkpoint is inconsistent; re-save it)",
                   index_path, ix->names[i], want, src->tensors[t].file);
      goto out_listed;
    }
    listed[t] = 1;
  }
  for (size_t t = 0; t < src->count; t++) {
    if (!listed[t]) {
      s = sl__fail(ctx, SL_ERR_FORMAT,
                   "%s: file %s holds tensor '%s', which weight_map does not list (the checkpoint is "
                   "inconsistent; re-save it or fix the index)",
                   index_path, src->tensors[t].file, src->tensors[t].name);
      goto out_listed;
    }
  }
out_listed:
  free(listed);
  return s;
}

static sl_status open_index(sl_source *src, const char *path) {
  sl_context *ctx = src->ctx;
  char *text = NULL;
  size_t len = 0;
  sl_status s = read_whole(ctx, path, &text, &len);
  if (s != SL_OK) return s;
  sl__index ix;
  char err[SL__ERRMSG_LEN - 128];
  s = sl__index_parse(text, len, &ix, err, sizeof err);
  free(text);
  if (s != SL_OK) return sl__fail(ctx, s, "%s: %s", path, err);

  char *dir = dir_of(path);
  if (!dir) {
    s = sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
    goto out_index;
  }
  for (size_t f = 0; f < ix.file_count; f++) {
    char *fp = join(dir, ix.files[f]);
    if (!fp) {
      s = sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
      goto out_dir;
    }
    struct stat st;
    if (stat(fp, &st) != 0 && errno == ENOENT) {
      s = sl__fail(ctx, SL_ERR_NOT_FOUND,
                   "%s: weight_map puts tensor '%s' in %s, which does not exist (incomplete download?)", path,
                   first_tensor_of(&ix, f), fp);
      free(fp);
      goto out_dir;
    }
    sl__st_header h;
    size_t file;
    s = open_st(src, fp, ix.files[f], &h, &file);
    free(fp);
    if (s != SL_OK) goto out_dir;
    s = add_tensors(src, file, &h);
    sl__st_header_free(&h);
    if (s != SL_OK) {
      s = sl__fail(ctx, s, "out of memory");
      goto out_dir;
    }
  }
  src->meta_keys = ix.meta_keys;
  src->meta_values = ix.meta_values;
  src->meta_count = ix.meta_count;
  ix.meta_keys = ix.meta_values = NULL;
  ix.meta_count = 0;
  if ((s = finish(src, true)) != SL_OK) goto out_dir;
  s = check_against_index(src, &ix, path);
out_dir:
  free(dir);
out_index:
  sl__index_free(&ix);
  return s;
}

/* ---- opening by path ------------------------------------------------------------------ */

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

/* A directory: its model.safetensors.index.json, else its only *.safetensors.index.json, else
 * its only *.safetensors. Several candidates and no index is ambiguous: say so. */
static sl_status open_dir(sl_source *src, const char *path) {
  sl_context *ctx = src->ctx;
  char *ixp = join(path, INDEX_NAME);
  if (!ixp) return sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
  struct stat st;
  if (stat(ixp, &st) == 0) {
    sl_status s = open_index(src, ixp);
    free(ixp);
    return s;
  }
  free(ixp);

  DIR *d = opendir(path);
  if (!d) return sl__fail(ctx, SL_ERR_IO, "%s: cannot list the directory: %s", path, strerror(errno));
  char **st_names = NULL, **ix_names = NULL;
  size_t n_st = 0, n_ix = 0;
  sl_status s = SL_OK;
  struct dirent *e;
  while ((e = readdir(d))) {
    bool is_ix = !fnmatch("*.safetensors.index.json", e->d_name, 0);
    bool is_st = !fnmatch("*.safetensors", e->d_name, 0);
    if (!is_ix && !is_st) continue;
    char ***list = is_ix ? &ix_names : &st_names;
    size_t *n = is_ix ? &n_ix : &n_st;
    char **nl = realloc(*list, (*n + 1) * sizeof(char *));
    if (!nl || !(nl[*n] = sl__strdup(e->d_name))) {
      if (nl) *list = nl;
      s = sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
      goto out_lists;
    }
    *list = nl;
    (*n)++;
  }
  if (n_st > 1) qsort(st_names, n_st, sizeof(char *), sl__strp_cmp);
  if (n_ix == 1 || (n_ix == 0 && n_st == 1)) {
    char *p = join(path, n_ix ? ix_names[0] : st_names[0]);
    if (!p) {
      s = sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
      goto out_lists;
    }
    s = n_ix ? open_index(src, p) : open_single(src, p);
    free(p);
  } else if (n_ix > 1) {
    s = sl__fail(ctx, SL_ERR_INVALID, "%s holds %zu *.safetensors.index.json files and no %s: pass the index to use",
                 path, n_ix, INDEX_NAME);
  } else if (n_st == 0) {
    s = sl__fail(ctx, SL_ERR_NOT_FOUND, "%s holds no .safetensors file and no %s", path, INDEX_NAME);
  } else {
    s = sl__fail(ctx, SL_ERR_INVALID,
                 "%s holds %zu .safetensors files (%s, %s%s) and no %s: pass one file, or the index that joins them",
                 path, n_st, st_names[0], st_names[1], n_st > 2 ? ", ..." : "", INDEX_NAME);
  }
out_lists:
  for (size_t i = 0; i < n_st; i++) free(st_names[i]);
  for (size_t i = 0; i < n_ix; i++) free(ix_names[i]);
  free(st_names);
  free(ix_names);
  closedir(d);
  return s;
}

sl_status sl__source_open_local(sl_context *ctx, const char *path, sl_source **out) {
  if (!out) return sl__fail(ctx, SL_ERR_INVALID, "sl_source_open: out is NULL");
  *out = NULL;
  if (!path || !*path) return sl__fail(ctx, SL_ERR_INVALID, "sl_source_open: no path given");
  struct stat st;
  if (stat(path, &st) != 0) {
    int e = errno;
    return sl__fail(ctx, e == ENOENT ? SL_ERR_NOT_FOUND : SL_ERR_IO,
                    "%s: %s; give a .safetensors file, a model.safetensors.index.json, or a directory "
                    "holding one",
                    path, strerror(e));
  }
  /* File names go into the manifest, and other ranks may run elsewhere: make them absolute
   * (without resolving symlinks, so hub-cache names stay readable). */
  char *abs = NULL;
  if (path[0] == '/') {
    abs = sl__strdup(path);
  } else {
    char *cwd = getcwd(NULL, 0);
    if (cwd) abs = join(cwd, path);
    free(cwd);
  }
  if (!abs) return sl__fail(ctx, SL_ERR_NOMEM, "%s: cannot make the path absolute", path);
  sl_status s = SL_ERR_NOMEM;
  sl_source *src = sl__source_new(ctx);
  if (!src) {
    s = sl__fail(ctx, s, "out of memory");
    goto out_abs;
  }
  if (S_ISDIR(st.st_mode))
    s = open_dir(src, abs);
  else if (ends_with(abs, ".json"))
    s = open_index(src, abs);
  else
    s = open_single(src, abs);
  if (s != SL_OK) {
    sl_source_destroy(src);
    goto out_abs;
  }
  *out = src;
out_abs:
  free(abs);
  return s;
}
