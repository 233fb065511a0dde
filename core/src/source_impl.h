/* The source's private layout, shared by source.c (reading headers) and source_manifest.c
 * (the byte image rank 0 broadcasts). */
#ifndef SHARDLOAD_SOURCE_IMPL_H
#define SHARDLOAD_SOURCE_IMPL_H

#include "internal.h"

typedef struct src_file {
  char *path;
  int fd; /* -1 when not open */
} src_file;

struct sl_source {
  sl_context *ctx;
  sl_source_tensor *tensors; /* file order; names owned */
  size_t *file_of;           /* tensors[i] lives in files[file_of[i]] */
  size_t count;
  src_file *files;
  size_t file_count;
  char **meta_keys, **meta_values;
  size_t meta_count;
  size_t *slots; /* name hash: tensor index + 1, 0 = empty; slot_mask + 1 slots */
  size_t slot_mask;
  uint64_t total_bytes;
  bool has_files;
};

sl_source *sl__source_new(sl_context *ctx);
/* Builds the name hash; on a duplicate name sets *dup to its index and fails. */
sl_status sl__source_build_index(sl_source *src, size_t *dup);

#endif
