/* The test hooks of the tests' build of the command (shardload-test-hooks; cli.h), in place of
 * the shipped command's no-ops (tools/hooks.c). Honoured only in a rank started by --nproc, the
 * only place the command calls them:
 *   SHARDLOAD_TEST_FAIL_RANK=R[:exit|signal|hang] makes rank R die (exit status 9, or SIGKILL)
 *     or hang once phase 1 has succeeded on every rank and the data phase begins (the first
 *     bind call), so the tests can check that the launcher stops the other ranks and reports
 *     the failed one;
 *   SHARDLOAD_TEST_REPORT_ENV=1 makes the rank say on stderr what it received from the
 *     launcher: the length of SHARDLOAD_TOKEN, whether it is hex and a digest of it (the tests
 *     tell that every rank of a job holds the same secret and that jobs differ, without the
 *     secret being printed), LOCAL_WORLD_SIZE and SHARDLOAD_INSECURE_RENDEZVOUS;
 *   SHARDLOAD_TEST_SLOW_EXIT_RANK=R makes rank R end 300 ms after its work, so the tests can
 *     order the ranks' exits;
 *   SHARDLOAD_TEST_HOST_TAGS=T0,T1,... gives rank R the SHARDLOAD_TEST_SHM_HOST_TAG TR (none
 *     where TR is empty or missing), before its context starts, so that the ranks of one
 *     command look like ranks of several hosts (the hier collective's tests);
 *   SHARDLOAD_TEST_KEEP_REPORTS=DIR makes each rank copy the reports it hands the launcher to
 *     DIR/rank-R.json (the summary) and, with --json, DIR/rank-R.full.json (the launcher
 *     removes its own), so the tests can see what they hold. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* header-only: the command links only the public library, which does not export xxhash */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cli.h"

/* 'e' exit, 's' signal, 'h' hang; static: sl_load calls the bind after cli_hook_load returns */
static char fail_mode;

static void *fail_at_bind(void *user, const sl_tensor *t) {
  (void)user;
  (void)t;
  fflush(NULL);
  if (fail_mode == 's') kill(getpid(), SIGKILL);
  if (fail_mode == 'h')
    for (;;) pause();
  _exit(9);
  return NULL;
}

static void report_env(int rank) {
  const char *v = getenv("SHARDLOAD_TEST_REPORT_ENV");
  if (!v || strcmp(v, "1") != 0) return;
  const char *tok = getenv("SHARDLOAD_TOKEN"), *insecure = getenv("SHARDLOAD_INSECURE_RENDEZVOUS");
  const char *lws = getenv("LOCAL_WORLD_SIZE");
  size_t n = tok ? strlen(tok) : 0;
  int hex = n && strspn(tok, "0123456789abcdef") == n;
  fprintf(stderr, "test-hook: rank %d: SHARDLOAD_TOKEN %zu %s digits, digest %016llx; LOCAL_WORLD_SIZE=%s; "
          "SHARDLOAD_INSECURE_RENDEZVOUS=%s\n", rank, n, hex ? "hex" : "non-hex",
          (unsigned long long)(tok ? XXH3_64bits(tok, n) : 0), lws ? lws : "(unset)", insecure ? insecure : "(unset)");
}

void cli_hook_rank_start(int rank) {
  const char *v = getenv("SHARDLOAD_TEST_HOST_TAGS");
  if (!v || !*v) return;
  for (int r = 0; r < rank && v; r++) {
    v = strchr(v, ',');
    if (v) v++;
  }
  char tag[64] = "";
  if (v) snprintf(tag, sizeof tag, "%.*s", (int)strcspn(v, ","), v);
  if (tag[0]) setenv("SHARDLOAD_TEST_SHM_HOST_TAG", tag, 1);
  else unsetenv("SHARDLOAD_TEST_SHM_HOST_TAG");
}

void cli_hook_load(sl_context *ctx, sl_load_options *lo) {
  int rank = sl_context_rank(ctx);
  report_env(rank);
  const char *v = getenv("SHARDLOAD_TEST_FAIL_RANK");
  if (!v || !*v) return;
  char *end = NULL;
  long r = strtol(v, &end, 10);
  if (end == v || r != rank) return;
  fail_mode = !strcmp(end, ":signal") ? 's' : !strcmp(end, ":hang") ? 'h' : 'e';
  lo->bind = fail_at_bind;
  lo->bind_user = NULL;
}

static void keep_report(int rank, const char *report_path, const char *kind) {
  const char *dir = getenv("SHARDLOAD_TEST_KEEP_REPORTS");
  if (!dir || !*dir || !report_path) return;
  char dst[4096];
  snprintf(dst, sizeof dst, "%s/rank-%d%s.json", dir, rank, kind);
  FILE *in = fopen(report_path, "rb"), *out = fopen(dst, "wb");
  char buf[8192];
  size_t n;
  while (in && out && (n = fread(buf, 1, sizeof buf, in)) > 0)
    if (fwrite(buf, 1, n, out) != n) break;
  if (in) fclose(in);
  if (out) fclose(out);
}

void cli_hook_rank_exit(int rank, const char *report_path, const char *full_path) {
  keep_report(rank, report_path, "");
  keep_report(rank, full_path, ".full");
  const char *slow = getenv("SHARDLOAD_TEST_SLOW_EXIT_RANK");
  if (slow && *slow && atoi(slow) == rank) usleep(300 * 1000);
}
