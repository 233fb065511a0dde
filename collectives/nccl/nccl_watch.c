/* The watchdog of a communicator (what PyTorch's ProcessGroupNCCL does): NCCL kernels wait
 * for their peers forever, so a rank that dies mid-load would hang every survivor's stream.
 * Each enqueued op records an event after itself; while some are outstanding a thread polls
 * every 100 ms and aborts the communicator (ncclCommAbort makes the kernels exit) when NCCL
 * reports an asynchronous error, when an event fails, when no op completed for longer than the
 * timeout, or when abort() asked for it. It only remembers why: messages reach the core on the
 * caller's thread (the next op, barrier or fini), as module.h wants. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "nccl_internal.h"

#define POLL_MS 100

int sl__nccl_wait_ms(const nccl_comm *c) { return sl_timeout_ms(c->timeout_ms); }

bool sl__nccl_aborted(const nccl_comm *c) {
  for (; c; c = c->parent)
    if (atomic_load(&c->abort_req)) return true;
  return false;
}

void sl__nccl_kill(nccl_comm *c, sl_status why, const char *fmt, ...) {
  if (!atomic_load(&c->dead)) {
    c->why_status = why;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    atomic_store(&c->dead, 1);
  }
  if (c->comm) {
    /* the kernels of every op queued on this communicator exit; their data is not valid.
     * Bounded (nccl_end.c): behind a kernel that never ends the communicator is left behind,
     * and fini says so. */
    int left_ms;
    (void)sl__nccl_end(c, c->comm, false, sl__nccl_wait_ms(c), &left_ms);
    if (left_ms) {
      c->leaked = true;
      c->leaked_call = "ncclCommAbort";
      c->leaked_ms = left_ms;
    }
    c->comm = NULL;
  }
  pthread_cond_broadcast(&c->wake);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* One look at the communicator (caller holds MU): completed ops leave the queue; an error, a
 * stall past the timeout or an abort request kills it. */
static void poll_locked(nccl_comm *c) {
  if (atomic_load(&c->dead)) return;
  if (sl__nccl_aborted(c)) {
    sl__nccl_kill(c, SL_ERR_COMM, SL_CCL_NAME " on rank %d (" SL_GPU_NAME ":%d): aborted (sl_context_abort)",
                                  c->job_rank, c->device);
    return;
  }
  ncclResult_t a = ncclSuccess;
  if (c->comm && c->L->CommGetAsyncError(c->comm, &a) == ncclSuccess && a != ncclSuccess && a != ncclInProgress) {
    char what[NCCL_MSG_LEN / 2];
    sl__nccl_describe(c->L, c->comm, a, what, sizeof what);
    sl__nccl_kill(c, SL_ERR_PEER, SL_CCL_NAME " on rank %d (" SL_GPU_NAME ":%d): " SL_CCL_PRODUCT " reported an error "
                                  "(%s); a peer rank may have failed", c->job_rank,
                  c->device, what);
    return;
  }
  while (c->q_len > 0) {
    nccl_pending *p = &c->q[c->q_head];
    cudaError_t e = c->rt->EventQuery(p->ev);
    if (e == cudaErrorNotReady) break;
    if (e != cudaSuccess) {
      sl__nccl_kill(c, SL_ERR_BACKEND, SL_CCL_NAME " %s on rank %d (" SL_GPU_NAME ":%d): the stream failed (%s: %s)",
                    p->op, c->job_rank, c->device, cudaGetErrorName(e), cudaGetErrorString(e));
      return;
    }
    c->spare[c->n_spare++] = p->ev;
    c->q_head = (c->q_head + 1) % NCCL_MAX_PENDING;
    c->q_len--;
    clock_gettime(CLOCK_MONOTONIC, &c->last_progress);
    pthread_cond_broadcast(&c->wake);
  }
  if (c->q_len > 0 && sl_ms_since(&c->last_progress) > sl__nccl_wait_ms(c)) {
    sl__nccl_kill(c, SL_ERR_TIMEOUT,
                  SL_CCL_NAME " %s on rank %d (" SL_GPU_NAME ":%d): no operation completed within %d ms; a peer rank "
                  "died or stalled (raise --timeout if the data is just slow), the communicator was aborted",
                  c->q[c->q_head].op, c->job_rank, c->device, sl__nccl_wait_ms(c));
  }
}

sl_status sl__nccl_track(nccl_comm *c, const char *op, cudaStream_t stream) {
  /* back-pressure: a bounded queue; the oldest op completes (or the timeout kills it) first */
  while (c->q_len == NCCL_MAX_PENDING && !atomic_load(&c->dead)) {
    poll_locked(c);
    if (c->q_len < NCCL_MAX_PENDING) break;
    pthread_mutex_unlock(&c->mu);
    sleep_ms(1);
    pthread_mutex_lock(&c->mu);
  }
  if (atomic_load(&c->dead)) return SL_ERR_COMM;
  cudaEvent_t ev = NULL;
  cudaError_t e = c->n_spare > 0 ? (ev = c->spare[--c->n_spare], cudaSuccess)
                                 : c->rt->EventCreate(&ev);
  if (e == cudaSuccess) e = c->rt->EventRecord(ev, stream);
  if (e != cudaSuccess) {
    if (ev) c->spare[c->n_spare++] = ev;
    /* the op is queued on this rank and cannot be watched: kill rather than risk a hang */
    sl__nccl_kill(c, SL_ERR_BACKEND, SL_CCL_NAME " %s on rank %d (" SL_GPU_NAME ":%d): cannot record an event after "
                                     "it (%s: %s)", op, c->job_rank,
                  c->device, cudaGetErrorName(e), cudaGetErrorString(e));
    return SL_ERR_BACKEND;
  }
  if (c->q_len == 0) clock_gettime(CLOCK_MONOTONIC, &c->last_progress);
  c->q[(c->q_head + c->q_len) % NCCL_MAX_PENDING] = (nccl_pending){ev, op};
  c->q_len++;
  pthread_cond_broadcast(&c->wake);
  return SL_OK;
}

sl_status sl__nccl_drain(nccl_comm *c, const char *op) {
  /* the watchdog's timeout kills a stalled op; twice it bounds this loop should that fail */
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  int nap = 1;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    poll_locked(c);
    bool done = c->q_len == 0, dead = atomic_load(&c->dead);
    pthread_mutex_unlock(&c->mu);
    if (dead) return SL_ERR_COMM;
    if (done) return SL_OK;
    if (sl_ms_since(&start) > 2.0 * sl__nccl_wait_ms(c)) {
      pthread_mutex_lock(&c->mu);
      sl__nccl_kill(c, SL_ERR_TIMEOUT, SL_CCL_NAME " %s on rank %d (" SL_GPU_NAME ":%d): earlier operations did not "
                                       "complete within %d ms", op,
                    c->job_rank, c->device, 2 * sl__nccl_wait_ms(c));
      pthread_mutex_unlock(&c->mu);
      return SL_ERR_TIMEOUT;
    }
    sleep_ms(nap);
    if (nap < 8) nap *= 2;
  }
}

static void *watch(void *arg) {
  nccl_comm *c = arg;
  cudaSetDevice(c->device); /* this thread's event queries and NCCL calls act on the comm's device */
  pthread_mutex_lock(&c->mu);
  while (!c->stop) {
    struct timespec until;
    until = sl_deadline_in_ms(POLL_MS).at;
    /* idle while nothing is outstanding and no abort is asked for: woken by track() */
    pthread_cond_timedwait(&c->wake, &c->mu, &until);
    if (c->stop) break;
    if (c->q_len > 0 || sl__nccl_aborted(c)) poll_locked(c);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

sl_status sl__nccl_watch_start(nccl_comm *c) {
  if (pthread_create(&c->watchdog, NULL, watch, c) != 0) return SL_ERR_NOMEM;
  c->watching = true;
  return SL_OK;
}

void sl__nccl_watch_stop(nccl_comm *c) {
  if (!c->watching) return;
  pthread_mutex_lock(&c->mu);
  c->stop = true;
  pthread_cond_broadcast(&c->wake);
  pthread_mutex_unlock(&c->mu);
  pthread_join(c->watchdog, NULL);
  c->watching = false;
}
