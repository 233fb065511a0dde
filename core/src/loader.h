/* Loader internals shared by loader.c and state.c. */
#ifndef SHARDLOAD_LOADER_H
#define SHARDLOAD_LOADER_H

#include "internal.h"

typedef struct sl__name_index {
  const char *name;
  size_t index;
} sl__name_index;

struct sl_state {
  sl_context *ctx;
  sl_tensor *tensors; /* file order */
  size_t count;
  sl__name_index *by_name; /* sorted by name, for sl_state_find */
  char **skipped;
  size_t nskipped;
  sl_load_stats stats;
};

void sl__state_free_tensors(sl_state *st);
sl_status sl__state_index(sl_state *st);

#endif
