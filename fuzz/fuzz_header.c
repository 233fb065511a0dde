/* libFuzzer target for the two parsers that read untrusted checkpoint metadata.
 *
 * The first byte picks the parser: 'I' feeds the rest to the index.json parser (the code the
 * source uses for model.safetensors.index.json); anything else feeds the rest to the
 * safetensors header parser as a whole file image. Accepted inputs are checked against the
 * invariants the loader relies on, so a parser that lets a bad layout through crashes here. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void check_header(const sl__st_header *h, uint64_t file_size) {
  if (h->data_offset < 8 || h->data_offset > file_size || h->data_offset + h->data_size != file_size)
    __builtin_trap();
  uint64_t pos = 0;
  for (size_t i = 0; i < h->count; i++) {
    const sl__st_tensor *t = &h->tensors[i];
    if (!t->name || t->begin != pos || t->end < t->begin) __builtin_trap();
    if (t->dtype == SL_DTYPE_INVALID || t->ndim < 0 || t->ndim > SL_MAX_DIMS) __builtin_trap();
    uint64_t n = sl_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) {
      if (t->shape[d] < 0) __builtin_trap();
      n *= (uint64_t)t->shape[d]; /* cannot overflow: the parser checked */
    }
    if (n != t->end - t->begin) __builtin_trap();
    pos = t->end;
  }
  if (pos != h->data_size) __builtin_trap();
  for (size_t i = 0; i < h->meta_count; i++)
    if (!h->meta_keys[i] || !h->meta_values[i]) __builtin_trap();
}

static void check_index(const sl__index *ix) {
  if (!ix->count || !ix->file_count) __builtin_trap();
  for (size_t f = 1; f < ix->file_count; f++)
    if (strcmp(ix->files[f - 1], ix->files[f]) >= 0) __builtin_trap(); /* sorted, distinct */
  for (size_t i = 0; i < ix->count; i++)
    if (!ix->names[i] || ix->file_of[i] >= ix->file_count) __builtin_trap();
  for (size_t i = 0; i < ix->meta_count; i++)
    if (!ix->meta_keys[i] || !ix->meta_values[i]) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  char err[512];
  const uint8_t *body = data + 1;
  size_t len = size - 1;
  if (data[0] == 'I') {
    sl__index ix;
    if (sl__index_parse((const char *)body, len, &ix, err, sizeof err) == SL_OK) {
      check_index(&ix);
      sl__index_free(&ix);
    } else if (!err[0]) {
      __builtin_trap(); /* every failure says why */
    }
    return 0;
  }
  sl__st_header h;
  sl_status s = sl__st_parse(body, len, len, &h, err, sizeof err);
  if (s == SL_OK) {
    check_header(&h, len);
    sl__st_header_free(&h);
  } else if (!err[0] || h.tensors || h.count || h.meta_keys) {
    __builtin_trap();
  }
  return 0;
}
