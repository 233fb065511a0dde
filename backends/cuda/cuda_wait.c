/* The bounded wait (cuda_wait.h): every wait of the CUDA backend polls through it, so none
 * blocks past its deadline, not even behind a kernel that never ends. */
#define _GNU_SOURCE
#include "cuda_wait.h"

#include <sched.h>
#include <time.h>

double cu__now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

cu_wait cu__poll(cu_query_fn query, void *arg, size_t n, double deadline, size_t *at) {
  size_t next = 0; /* items before it have completed */
  long sleep_ns = 1000;
  for (unsigned round = 0;; round++) {
    for (; next < n; next++) {
      int r = query(arg, next);
      if (r < 0) {
        if (at) *at = next;
        return CU_WAIT_FAILED;
      }
      if (r == 0) break;
    }
    if (next == n) return CU_WAIT_DONE;
    if (cu__now_s() >= deadline) {
      if (at) *at = next;
      return CU_WAIT_TIMEOUT;
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
