/* Preloaded into the `shardload` command by test_cli_output: it stands in for a vendor
 * library that prints to stdout in the middle of a load, as NCCL does with NCCL_DEBUG set and
 * no NCCL_DEBUG_FILE (its "NCCL INFO" lines go to the C stream stdout). It wraps sl_load: a
 * line on stdout, flushed, then the real load. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#include "shardload/shardload.h"

typedef sl_status (*load_fn)(sl_context *, sl_plan *, sl_source *, const sl_load_options *, sl_state **);

__attribute__((visibility("default"))) sl_status sl_load(sl_context *ctx, sl_plan *plan, sl_source *src,
                                                         const sl_load_options *opts, sl_state **out) {
  load_fn real = (load_fn)dlsym(RTLD_NEXT, "sl_load");
  printf("noise:%d NCCL INFO a vendor library's line on stdout\n", sl_context_rank(ctx));
  fflush(stdout);
  return real ? real(ctx, plan, src, opts, out) : SL_ERR_INVALID;
}
