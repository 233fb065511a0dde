/* libFuzzer target for the two parsers that read untrusted checkpoint metadata.
 *
 * The first byte picks the parser: 'I' feeds the rest to the index.json parser (the code the
 * source uses for model.safetensors.index.json); 'M' to the manifest reader (what a rank
 * takes from rank 0 over the network); anything else feeds the rest to the safetensors header
 * parser as a whole file image. Accepted inputs are checked against the
 * invariants the loader relies on, so a parser that lets a bad layout through, or an index
 * entry that escapes its directory, crashes here. A header is parsed twice, with the scan that
 * reads the common header without a JSON tree and with jansson's tree alone: any difference in
 * verdict, message or table crashes too. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

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

/* Two parses of one image hold the same table, in the same order, and the same metadata. */
static void check_same(const sl__st_header *a, const sl__st_header *b) {
  if (a->count != b->count || a->meta_count != b->meta_count || a->data_offset != b->data_offset ||
      a->data_size != b->data_size || a->header_digest != b->header_digest)
    __builtin_trap();
  for (size_t i = 0; i < a->count; i++) {
    const sl__st_tensor *x = &a->tensors[i], *y = &b->tensors[i];
    if (strcmp(x->name, y->name) || x->dtype != y->dtype || x->ndim != y->ndim || x->begin != y->begin ||
        x->end != y->end || memcmp(x->shape, y->shape, sizeof x->shape))
      __builtin_trap();
  }
  for (size_t i = 0; i < a->meta_count; i++)
    if (strcmp(a->meta_keys[i], b->meta_keys[i]) || strcmp(a->meta_values[i], b->meta_values[i])) __builtin_trap();
}

static void check_index(const sl__index *ix) {
  if (!ix->count || !ix->file_count) __builtin_trap();
  for (size_t f = 1; f < ix->file_count; f++)
    if (strcmp(ix->files[f - 1], ix->files[f]) >= 0) __builtin_trap(); /* sorted, distinct */
  for (size_t f = 0; f < ix->file_count; f++) {
    /* confined by its spelling: relative, no '.', '..' or empty component, no backslash */
    const char *c = ix->files[f];
    if (sl__index_entry_problem(c, strlen(c)) || c[0] == '/' || strchr(c, '\\')) __builtin_trap();
    for (;;) {
      const char *slash = strchr(c, '/');
      size_t k = slash ? (size_t)(slash - c) : strlen(c);
      if (!k || (k == 1 && c[0] == '.') || (k == 2 && c[0] == '.' && c[1] == '.')) __builtin_trap();
      if (!slash) break;
      c = slash + 1;
    }
  }
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
  if (data[0] == 'M') {
    /* an accepted manifest is canonical: written back, it is the same bytes */
    sl_source *src = NULL;
    if (sl__source_deserialize(NULL, body, len, &src) == SL_OK) {
      void *again = NULL;
      size_t n = 0;
      if (sl__source_serialize(src, &again, &n) != SL_OK || n != len || memcmp(again, body, len))
        __builtin_trap();
      free(again);
      sl_source_destroy(src);
    } else if (src) {
      __builtin_trap();
    }
    return 0;
  }
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
  sl__st_header h, t;
  sl_status s = sl__st_parse(body, len, len, &h, err, sizeof err);
  /* the same image through jansson's tree alone: the scan takes only what the tree takes, with
   * the same table, and hands everything else to it (so the verdict and message are the same) */
  char terr[512];
  sl__st_scan = false;
  sl_status ts = sl__st_parse(body, len, len, &t, terr, sizeof terr);
  sl__st_scan = true;
  if (ts != s || (s != SL_OK && strcmp(err, terr))) __builtin_trap();
  if (s == SL_OK) {
    check_header(&h, len);
    if (h.header_digest != XXH3_64bits(body, (size_t)h.data_offset)) __builtin_trap();
    check_same(&h, &t);
    sl__st_header_free(&h);
    sl__st_header_free(&t);
  } else if (!err[0] || h.tensors || h.count || h.meta_keys) {
    __builtin_trap();
  }
  return 0;
}
