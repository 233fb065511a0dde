/* A source whose tensors are in rank 0's memory (sl_source_open_memory): a state dict that
 * exists only on rank 0. Rank 0 validates the caller's table the way the safetensors parser
 * validates a header and builds a source with one pseudo file named by the label, so that the
 * whole loader (plan, manifest, scatter, pipeline, casts) and every message that names a file
 * work on it unchanged. Tensor bytes come from the caller's pointers or its read callback;
 * only rank 0 reads, so every-rank access (opening files, fingerprints) is refused. The
 * collective part (verdict, manifest, identity) is source_dist.c's. */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "source_impl.h"

/* The first version of sl_memory_tensor ends with its data pointer. */
#define MEM_TENSOR_V1_SIZE (offsetof(sl_memory_tensor, data) + sizeof(const void *))

static void hash_bytes(XXH3_state_t *h, const void *p, size_t n) { XXH3_64bits_update(h, p, n); }

static void hash_u64(XXH3_state_t *h, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  hash_bytes(h, b, 8);
}

/* Checks tensor I of the table (T) and appends it to SRC; LABEL names the source. */
static sl_status add_memory_tensor(sl_source *src, const char *label, size_t i, const sl_memory_tensor *t,
                                   sl_source_read_fn read, uint64_t *offset) {
  sl_context *ctx = src->ctx;
  if (!t->name || !t->name[0])
    return sl__fail(ctx, SL_ERR_FORMAT, "%s: tensor %zu has %s name; every tensor needs a non-empty, unique name",
                    label, i, t->name ? "an empty" : "a NULL");
  const char *name = t->name;
  if ((int)t->dtype <= (int)SL_DTYPE_INVALID || (int)t->dtype >= (int)SL_DTYPE_COUNT_)
    return sl__fail(ctx, SL_ERR_DTYPE, "%s: tensor '%s' has dtype code %d, which is not an sl_dtype (1..%d)", label,
                    name, (int)t->dtype, (int)SL_DTYPE_COUNT_ - 1);
  if (t->ndim < 0 || t->ndim > SL_MAX_DIMS)
    return sl__fail(ctx, t->ndim < 0 ? SL_ERR_FORMAT : SL_ERR_UNSUPPORTED,
                    "%s: tensor '%s' has %d dims; 0 to %d are supported", label, name, t->ndim, SL_MAX_DIMS);
  uint64_t nbytes = sl_dtype_size(t->dtype);
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] < 0)
      return sl__fail(ctx, SL_ERR_FORMAT, "%s: tensor '%s': shape entry %d is %" PRId64 ", not a non-negative integer",
                      label, name, d, t->shape[d]);
    if (!sl__mul_u64(nbytes, (uint64_t)t->shape[d], &nbytes))
      return sl__fail(ctx, SL_ERR_FORMAT, "%s: tensor '%s': its shape overflows 64-bit byte counts", label, name);
  }
  uint64_t end;
  if (nbytes > SIZE_MAX || !sl__add_u64(*offset, nbytes, &end))
    return sl__fail(ctx, SL_ERR_FORMAT, "%s: tensor '%s': %" PRIu64 " bytes do not fit this process's address space",
                    label, name, nbytes);
  if (!t->data && !read && nbytes)
    return sl__fail(ctx, SL_ERR_INVALID,
                    "%s: tensor '%s' has no data pointer and no read callback was given; pass its bytes or a "
                    "read callback",
                    label, name);
  sl_source_tensor *st = &src->tensors[src->count];
  memset(st, 0, sizeof *st);
  if (!(st->name = sl__strdup(name))) return sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
  src->count++; /* owned from here on */
  st->dtype = t->dtype;
  st->ndim = t->ndim;
  for (int d = 0; d < t->ndim; d++) st->shape[d] = t->shape[d];
  st->nbytes = nbytes;
  st->file = src->files[0].path;
  st->file_offset = *offset;
  src->file_of[i] = 0;
  src->mem_data[i] = t->data;
  src->total_bytes = end;
  *offset = end;
  return SL_OK;
}

/* Rank 0's "headers digest" of a memory source: its table (names, dtypes, shapes) in order.
 * Never 0: only a source without files has 0 (the manifest checks it). */
static uint64_t table_digest(const sl_source *src) {
  XXH3_state_t h;
  XXH3_64bits_reset(&h);
  hash_bytes(&h, "shardload memory source", 23);
  hash_u64(&h, src->count);
  for (size_t i = 0; i < src->count; i++) {
    const sl_source_tensor *t = &src->tensors[i];
    hash_u64(&h, strlen(t->name));
    hash_bytes(&h, t->name, strlen(t->name));
    hash_u64(&h, (uint64_t)t->dtype);
    hash_u64(&h, (uint64_t)t->ndim);
    for (int d = 0; d < t->ndim; d++) hash_u64(&h, (uint64_t)t->shape[d]);
  }
  uint64_t v = XXH3_64bits_digest(&h);
  return v ? v : 1;
}

sl_status sl__source_open_memory_local(sl_context *ctx, const char *label, const sl_memory_tensor *tensors,
                                       size_t count, sl_source_read_fn read, void *read_user, sl_source **out) {
  *out = NULL;
  if (!label || !*label) label = "memory";
  if (count && !tensors)
    return sl__fail(ctx, SL_ERR_INVALID, "sl_source_open_memory: %s: %zu tensors but the table is NULL", label,
                    count);
  /* The caller's array steps by the struct size it was compiled with (tensors[0].size); every
   * element must say the same, and be at least the first version's. */
  size_t stride = count ? tensors[0].size : sizeof(sl_memory_tensor);
  if (stride < MEM_TENSOR_V1_SIZE)
    return sl__fail(ctx, SL_ERR_INVALID,
                    "sl_source_open_memory: %s: tensor 0 has size %zu; set every entry's size to "
                    "sizeof(sl_memory_tensor) (%zu)",
                    label, stride, sizeof(sl_memory_tensor));
  sl_source *src = sl__source_new(ctx);
  if (!src) return sl__fail(ctx, SL_ERR_NOMEM, "out of memory");
  sl_status s = SL_ERR_NOMEM;
  src->memory = true;
  src->mem_read = read;
  src->mem_user = read_user;
  src->files = calloc(1, sizeof *src->files);
  if (count) {
    src->tensors = calloc(count, sizeof *src->tensors);
    src->file_of = calloc(count, sizeof *src->file_of);
    src->mem_data = calloc(count, sizeof *src->mem_data);
  }
  if (!src->files || (count && (!src->tensors || !src->file_of || !src->mem_data))) goto out_nomem;
  src->files[0].fd = -1;
  src->file_count = 1; /* owned from here on */
  if (!(src->files[0].path = sl__strdup(label)) || !(src->files[0].name = sl__strdup(label))) goto out_nomem;
  uint64_t offset = 0;
  for (size_t i = 0; i < count; i++) {
    const sl_memory_tensor *t = (const sl_memory_tensor *)(const void *)((const char *)tensors + i * stride);
    if (t->size != stride) {
      s = sl__fail(ctx, SL_ERR_INVALID,
                   "sl_source_open_memory: %s: tensor %zu has size %zu, tensor 0 %zu; set every entry's size to "
                   "sizeof(sl_memory_tensor)",
                   label, i, t->size, stride);
      goto out_src;
    }
    if ((s = add_memory_tensor(src, label, i, t, read, &offset)) != SL_OK) goto out_src;
  }
  size_t dup = 0;
  s = sl__source_build_index(src, &dup);
  if (s == SL_ERR_NOMEM) goto out_nomem;
  if (s != SL_OK) {
    size_t first = 0;
    while (first < dup && strcmp(src->tensors[first].name, src->tensors[dup].name)) first++;
    s = sl__fail(ctx, s, "%s: tensor '%s' appears twice (entries %zu and %zu); names must be unique", label,
                 src->tensors[dup].name, first, dup);
    goto out_src;
  }
  src->headers_digest = table_digest(src);
  src->has_files = true;
  *out = src;
  return SL_OK;
out_nomem:
  s = sl__fail(ctx, SL_ERR_NOMEM, "out of memory building the memory source %s", label);
out_src:
  sl_source_destroy(src);
  return s;
}

sl_status sl__source_memory_refuse(sl_source *src, const char *what) {
  return sl__fail(src->ctx, SL_ERR_INVALID,
                  "%s: %s is not possible: the source is in rank 0's memory: use read_mode rank0 (SL_READ_RANK0, "
                  "--source rank0)",
                  src->file_count ? src->files[0].path : "memory", what);
}

sl_status sl__source_memory_pread(sl_source *src, size_t i, uint64_t offset_in_tensor, void *dst, size_t bytes) {
  const sl_source_tensor *t = &src->tensors[i];
  const char *label = src->files[0].path;
  if (!src->has_files || !src->mem_data)
    return sl__fail(src->ctx, SL_ERR_INVALID,
                    "%s: read of tensor '%s' on rank %d: the source is in rank 0's memory; only rank 0 reads it "
                    "(read_mode rank0)",
                    label, t->name, src->ctx->rank);
  if (!bytes) return SL_OK;
  if (src->mem_data[i]) {
    memcpy(dst, (const unsigned char *)src->mem_data[i] + offset_in_tensor, bytes);
    return SL_OK;
  }
  char msg[SL__ERRMSG_LEN / 2];
  msg[0] = 0;
  sl_status s = src->mem_read(src->mem_user, i, offset_in_tensor, dst, bytes, msg, sizeof msg);
  if (s == SL_OK) return SL_OK;
  msg[sizeof msg - 1] = 0;
  return sl__fail(src->ctx, SL_ERR_IO, "%s: read of tensor '%s' at byte %" PRIu64 " failed: %s", label, t->name,
                  offset_in_tensor, msg[0] ? msg : "(the read callback gave no message)");
}
