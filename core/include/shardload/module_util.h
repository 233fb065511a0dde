/* Small helpers every shardload module needs (docs/MODULES.md), installed beside
 * shardload/module.h so that out-of-tree modules use them too. Header only: every function is
 * static inline, so a module links nothing of libshardload and exports nothing more.
 *
 * - Init structs: the core and the module may be built against different versions of
 *   module.h, and every struct that crosses the boundary starts with the size its builder saw.
 *   SL_INIT_HAS tells whether the caller's struct holds a member; read nothing that is not.
 * - Time: a deadline on the monotonic clock (the one a module's condition variables and
 *   bounded waits use), the milliseconds left to it, and the job's timeout with the core's
 *   default for a caller that gives none.
 * - A bounded poll: asks N items "done yet?" until all are, one failed, or a deadline passed;
 *   the shape of every wait that must end behind a kernel that never ends. */
#ifndef SHARDLOAD_MODULE_UTIL_H
#define SHARDLOAD_MODULE_UTIL_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "shardload/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- init structs ------------------------------------------------------------------------ */

/* True when *IN (a struct that starts with its builder's size: sl_backend_init,
 * sl_collective_init, sl_module_host, sl_control_plane) is long enough to hold MEMBER. */
#define SL_INIT_HAS(in, member) \
  ((in)->size >= offsetof(__typeof__(*(in)), member) + sizeof((in)->member))

/* MEMBER of *IN, or DFLT when the caller's struct is too short to hold it. */
#define SL_INIT_GET(in, member, dflt) (SL_INIT_HAS(in, member) ? (in)->member : (dflt))

/* The N items of a scatterv group (module.h: sl_scatter_item) as this module knows them, into
 * OUT (room for N): what both the caller's items (ITEMS[0].size bytes apart) and this module's
 * struct hold, the rest zero. False when N is out of 1..SL_SCATTER_GROUP_MAX, or the caller's
 * items are too short to hold every member up to ROOT (the module fails the op with SL_ERR_ABI). */
static inline bool sl_scatter_items_read(const sl_scatter_item *items, int n, sl_scatter_item *out) {
  if (!items || n < 1 || n > SL_SCATTER_GROUP_MAX) return false;
  size_t step = items[0].size;
  if (step < offsetof(sl_scatter_item, root) + sizeof(int)) return false;
  size_t take = step < sizeof(sl_scatter_item) ? step : sizeof(sl_scatter_item);
  for (int i = 0; i < n; i++) {
    const unsigned char *at = (const unsigned char *)items + (size_t)i * step;
    unsigned char *to = (unsigned char *)&out[i];
    for (size_t b = 0; b < sizeof(sl_scatter_item); b++) to[b] = b < take ? at[b] : 0;
    out[i].size = sizeof(sl_scatter_item);
  }
  return true;
}

/* ---- time ----------------------------------------------------------------------------------- */

/* The core's job timeout when sl_context_options.timeout_ms is 0 (shardload.h). */
#define SL_DEFAULT_TIMEOUT_MS 300000

/* The job's timeout as a module should bound its waits by: TIMEOUT_MS (from its init struct)
 * when positive, else the core's default. */
static inline int sl_timeout_ms(int timeout_ms) { return timeout_ms > 0 ? timeout_ms : SL_DEFAULT_TIMEOUT_MS; }

/* A point in time on CLOCK_MONOTONIC. AT is what pthread_cond_timedwait takes for a condition
 * variable whose clock attribute is CLOCK_MONOTONIC. */
typedef struct sl_deadline {
  struct timespec at;
} sl_deadline;

static inline struct timespec sl_monotonic_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t;
}

/* Seconds on the monotonic clock (for measuring, not for deadlines). */
static inline double sl_monotonic_s(void) {
  struct timespec t = sl_monotonic_now();
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Milliseconds since T (a sl_monotonic_now() reading); negative when T is ahead. */
static inline double sl_ms_since(const struct timespec *t) {
  struct timespec now = sl_monotonic_now();
  return (double)(now.tv_sec - t->tv_sec) * 1e3 + (double)(now.tv_nsec - t->tv_nsec) / 1e6;
}

/* MS milliseconds from now (0 or less: now, i.e. already due). */
static inline sl_deadline sl_deadline_in_ms(long ms) {
  sl_deadline d;
  d.at = sl_monotonic_now();
  if (ms <= 0) return d;
  d.at.tv_sec += ms / 1000;
  d.at.tv_nsec += (ms % 1000) * 1000000L;
  if (d.at.tv_nsec >= 1000000000L) {
    d.at.tv_sec++;
    d.at.tv_nsec -= 1000000000L;
  }
  return d;
}

/* Whole milliseconds left until D, rounded up (a wait of what is left never ends early); 0 once
 * it has passed. */
static inline long sl_deadline_left_ms(sl_deadline d) {
  struct timespec now = sl_monotonic_now();
  long long ns = ((long long)d.at.tv_sec - (long long)now.tv_sec) * 1000000000LL + (d.at.tv_nsec - now.tv_nsec);
  return ns <= 0 ? 0 : (long)((ns + 999999) / 1000000);
}

static inline bool sl_deadline_passed(sl_deadline d) {
  struct timespec now = sl_monotonic_now();
  return now.tv_sec > d.at.tv_sec || (now.tv_sec == d.at.tv_sec && now.tv_nsec >= d.at.tv_nsec);
}

/* ---- a bounded poll ----------------------------------------------------------------------- */

/* Item I of a wait: 1 once it has completed, 0 while not yet, < 0 when it failed. Never blocks
 * (cudaEventQuery, hipStreamQuery, zeEventQueryStatus). */
typedef int (*sl_poll_fn)(void *arg, size_t i);

typedef enum sl_poll_result { SL_POLL_DONE = 0, SL_POLL_FAILED = 1, SL_POLL_TIMEOUT = 2 } sl_poll_result;

/* Asks items 0..N-1 until every one has completed (DONE), one failed (FAILED) or DEADLINE
 * passed (TIMEOUT); *AT (may be NULL) is then the item that failed or is still pending. An item
 * that completed is not asked again, and items after a pending one wait their turn. Spins
 * briefly (a staging slot's copy ends in tens of microseconds), then sleeps up to 100 us
 * between rounds. A DEADLINE already past makes one round and no wait: how a device known to
 * be stuck is asked. */
static inline sl_poll_result sl_poll(sl_poll_fn query, void *arg, size_t n, sl_deadline deadline, size_t *at) {
  size_t next = 0; /* the items before it have completed */
  long sleep_ns = 1000;
  for (unsigned round = 0;; round++) {
    for (; next < n; next++) {
      int r = query(arg, next);
      if (r < 0) {
        if (at) *at = next;
        return SL_POLL_FAILED;
      }
      if (r == 0) break;
    }
    if (next == n) return SL_POLL_DONE;
    if (sl_deadline_passed(deadline)) {
      if (at) *at = next;
      return SL_POLL_TIMEOUT;
    }
    if (round < 64) {
      sched_yield();
      continue;
    }
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 100000) sleep_ns *= 2;
  }
}

#ifdef __cplusplus
}
#endif
#endif
