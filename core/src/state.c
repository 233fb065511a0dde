/* The loaded state: a rank's local shards and how they were placed. It holds a reference of
 * its own on the backend (shardload.h at sl_tensor: tensors may outlive the context), so
 * freeing works after sl_context_destroy. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"

void sl__state_free_tensors(sl_state *st) {
  for (size_t i = 0; i < st->count; i++) {
    sl_tensor *t = &st->tensors[i];
    if (t->data && !t->caller_buffer) sl__backend_free(st->be, t->device, t->pinned, t->data);
    t->data = NULL;
  }
}

SL_API void sl_state_destroy(sl_state *st) {
  if (!st) return;
  sl__state_free_tensors(st);
  /* caller buffers the load page-locked for itself: the caller keeps the memory, not the pin */
  if (st->be && SL_HAS_OP(st->be->ops, unregister_host))
    for (size_t i = 0; i < st->nregistered; i++) st->be->ops->unregister_host(st->be->handle, st->registered[i]);
  free(st->registered);
  sl__backend_ref_put(st->be); /* the last reference (the context may be gone) finalises the backend */
  for (size_t i = 0; i < st->count; i++) free((char *)st->tensors[i].name);
  for (size_t i = 0; i < st->nskipped; i++) free(st->skipped[i]);
  free(st->tensors);
  free(st->skipped);
  free(st->by_name);
  free(st);
}

SL_API size_t sl_state_count(const sl_state *st) { return st ? st->count : 0; }

SL_API const sl_tensor *sl_state_tensor(const sl_state *st, size_t i) {
  return st && i < st->count ? &st->tensors[i] : NULL;
}

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const sl__name_index *)a)->name, ((const sl__name_index *)b)->name);
}

SL_API const sl_tensor *sl_state_find(const sl_state *st, const char *name) {
  if (!st || !name || !st->by_name) return NULL;
  sl__name_index key = {name, 0};
  const sl__name_index *hit = bsearch(&key, st->by_name, st->count, sizeof key, cmp_entry);
  return hit ? &st->tensors[hit->index] : NULL;
}

sl_status sl__state_index(sl_state *st) {
  st->by_name = malloc((st->count ? st->count : 1) * sizeof *st->by_name);
  if (!st->by_name) return SL_ERR_NOMEM;
  for (size_t i = 0; i < st->count; i++) st->by_name[i] = (sl__name_index){st->tensors[i].name, i};
  qsort(st->by_name, st->count, sizeof *st->by_name, cmp_entry);
  return SL_OK;
}

SL_API size_t sl_state_skipped_count(const sl_state *st) { return st ? st->nskipped : 0; }
SL_API const char *sl_state_skipped_at(const sl_state *st, size_t i) {
  return st && i < st->nskipped ? st->skipped[i] : NULL;
}

/* A caller compiled against an older, shorter sl_load_stats gets the members it knows: the
 * library writes only within out->size (shardload.h). */
SL_API sl_status sl_state_stats(const sl_state *st, sl_load_stats *out) {
  if (!st || !out || out->size < sizeof out->size) return SL_ERR_INVALID;
  size_t n = out->size < sizeof *out ? out->size : sizeof *out;
  sl_load_stats full = st->stats;
  full.size = out->size; /* the caller's own value stays */
  memcpy(out, &full, n);
  return SL_OK;
}
