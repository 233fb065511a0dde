/* What the Gloo tests share: a module host that records the last failure, the module's table
 * found the way the core finds it, and checks for forked ranks. Included by one test file per
 * executable (test_gloo.c, test_gloo_store.c, test_gloo_rdzv.c, test_gloo_simccl.c). */
#ifndef SHARDLOAD_GLOO_TESTLIB_H
#define SHARDLOAD_GLOO_TESTLIB_H

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

/* ---- the host a module gets from the core: here it records the last failure ------------ */
static char g_msg[SL__ERRMSG_LEN];
static int g_rank = -1;

static void t_log(void *core, sl_log_level level, const char *fmt, ...) {}
static sl_status t_fail(void *core, sl_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_msg, sizeof g_msg, fmt, ap);
  va_end(ap);
  return s;
}
static const sl_module_host g_host = {sizeof(sl_module_host), NULL, t_log, t_fail};

/* The table, found the way the core finds it; NULL in a build without Gloo. */
static const sl_collective_ops *gloo_ops(void) {
  static sl_context ctx;
  const sl_collective_ops *ops = NULL;
  void *dl = NULL, *shim = NULL;
  if (sl__collective_select(&ctx, "gloo", &ops, &dl, &shim) != SL_OK) return NULL;
  return ops;
}

#define NEED_GLOO()                                                                            \
  do {                                                                                         \
    if (!gloo_ops()) skip();                                                                   \
  } while (0)

#define CHECK(cond, ...)                                                                       \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "rank %d: line %d: check failed: %s: ", g_rank, __LINE__, #cond);        \
      fprintf(stderr, __VA_ARGS__);                                                            \
      fprintf(stderr, " [last message: %s]\n", g_msg);                                         \
      _exit(1);                                                                                \
    }                                                                                          \
  } while (0)

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- forked ranks ---------------------------------------------------------------------- */
/* Exit code of PID, killing it (and failing) past DEADLINE_MS from now. */
static inline int reap(pid_t pid, double deadline_ms) {
  double end = now_ms() + deadline_ms;
  int status = 0;
  while (now_ms() < end) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      if (!WIFEXITED(status)) fail_msg("child died of signal %d", WTERMSIG(status));
      return WEXITSTATUS(status);
    }
    usleep(5000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  fail_msg("child %d still running after %.0f ms: killed", (int)pid, deadline_ms);
  return -1;
}

/* Kills PID and reaps it. */
static inline void stop(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

#endif
