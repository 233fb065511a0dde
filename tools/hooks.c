/* The shipped command's test hooks (cli.h): they do nothing. The tests' build of the command
 * links tests/cli_hooks.c in place of this file. */
#include "cli.h"

void cli_hook_load(sl_context *ctx, sl_load_options *lo) {
  (void)ctx;
  (void)lo;
}

void cli_hook_rank_start(int rank) { (void)rank; }

void cli_hook_rank_exit(int rank, const char *report_path, const char *full_path) {
  (void)rank;
  (void)report_path;
  (void)full_path;
}
