/* The asynchronous half of the sim backend (sim.c has the overview): streams, each a FIFO of
 * tasks run by its own worker thread after a random delay; the task queue and its bookkeeping;
 * events; sticky errors of enqueued work, reported by the next sync on the caller's thread;
 * host functions (launch_host_fn: how the simccl collective runs its work in stream order); the
 * stream, event and synchronisation ops; and sim__fail, which routes a failure to the host or,
 * on a worker, into the running task's message. Shared definitions and the locking rules are in
 * sim_internal.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim_internal.h"

#define SIM_STREAM_MAGIC 0x53494d5354524d31ull
#define SIM_EVENT_MAGIC 0x53494d4556454e31ull

/* The stream whose worker runs on this thread (NULL on caller threads). */
static __thread sim_stream *tl_stream;

/* Reports a failure of a call: through the host on a caller's thread; inside a task (a host
 * function calling SL_EXT_HOST_ACCESS) into the task's message, since a worker must never call
 * the host's fail (module.h, Threads). */
__attribute__((format(printf, 3, 4))) sl_status sim__fail(sim_backend *s, sl_status st, const char *fmt, ...) {
  char msg[SL__ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (tl_stream && tl_stream->s == s) {
    snprintf(tl_stream->task_msg, sizeof tl_stream->task_msg, "%s", msg);
    return st;
  }
  return s->host->fail(s->host->core, st, "%s", msg);
}

static uint64_t next_rand(sim_backend *s) { /* called with the lock held */
  uint64_t x = s->rng;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return s->rng = x;
}

/* ---- deadlines ----------------------------------------------------------------------------- */
/* The monotonic time (the condition variables' clock) US microseconds from now. */
static struct timespec after_us(uint64_t us) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  t.tv_sec += (time_t)(us / 1000000);
  t.tv_nsec += (long)(us % 1000000) * 1000;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

/* Lock held: waits on s->progress until woken or UNTIL; false once UNTIL has passed. */
static bool wait_progress(sim_backend *s, const struct timespec *until) {
  return pthread_cond_timedwait(&s->progress, &s->lock, until) != ETIMEDOUT;
}

/* Lock held: the first failure wins (CUDA's sticky errors); everyone waiting is woken, so that
 * pausing workers stop pausing (see sim_pause). */
static void set_sticky_locked(sim_backend *s, sl_status st, const char *msg) {
  if (s->err == SL_OK) {
    s->err = st;
    snprintf(s->errmsg, sizeof s->errmsg, "%s", msg);
  }
  pthread_cond_broadcast(&s->progress);
}

/* ---- workers ------------------------------------------------------------------------------- */
/* A task's random delay, lock held (dropped while asleep). Once the backend has failed (a
 * sticky error) nothing pauses any more: the queues only drain, so that the syncs and stream
 * destruction after a failure end at once rather than a slow simulated device later. */
static void sim_pause(sim_backend *s, uint64_t r) {
  if (s->delay_us == 0) {
    if ((r & 15) == 0) { /* still shuffle interleavings a little */
      pthread_mutex_unlock(&s->lock);
      sched_yield();
      pthread_mutex_lock(&s->lock);
    }
    return;
  }
  uint64_t us = s->min_delay_us + r % ((uint64_t)(s->delay_us - s->min_delay_us) + 1);
  if (!us) return;
  struct timespec until = after_us(us);
  while (s->err == SL_OK && wait_progress(s, &until)) {
  }
}

static void open_task_bufs(sim_backend *s, sim_task *t, int open) {
  pthread_mutex_lock(&s->lock);
  for (int i = 0; i < 2; i++) {
    if (!t->bufs[i] || t->bufs[i]->kind != SL__SIM_DEVICE) continue;
    if (open) sim__buf_open(s, t->bufs[i]);
    else sim__buf_close(s, t->bufs[i]);
  }
  pthread_mutex_unlock(&s->lock);
}

/* What a wait that ran past its bound says (into MSG): which wait, on what, and the timeout. */
static void timeout_msg(const sim_backend *s, char *msg, size_t len, const char *wait, const char *on) {
  snprintf(msg, len,
           "sim:%d: %s %s: the work it waits for did not complete within %d ms (the job's timeout of %d ms and a "
           "grace); the simulated device is slower than the timeout (SHARDLOAD_SIM_DELAY_US=%u) or a collective is "
           "stuck: raise the timeout (--timeout, sl_context_options.timeout_ms) if the work is only slow",
           s->device_index, wait, on, s->wait_ms, s->timeout_ms, s->delay_us);
}

/* Waits until the event's record T->seq has run, for at most the wait bound. */
static sl_status run_wait(sim_backend *s, sim_stream *q, sim_task *t) {
  sl_status st = SL_OK;
  pthread_mutex_lock(&s->lock);
  struct timespec until = after_us((uint64_t)s->wait_ms * 1000);
  while (t->ev->completed < t->seq) {
    if (wait_progress(s, &until) || t->ev->completed >= t->seq) continue;
    char on[96];
    snprintf(on, sizeof on, "on stream %p (event %p, record %llu)", (void *)q, (void *)t->ev,
             (unsigned long long)t->seq);
    timeout_msg(s, q->task_msg, sizeof q->task_msg, "stream_wait_event", on);
    st = SL_ERR_TIMEOUT;
    break;
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

/* Runs a task without the lock (except to open and close buffers); a failure leaves its
 * message in q->task_msg. */
static sl_status run_task(sim_backend *s, sim_stream *q, sim_task *t) {
  sl_status st = SL_OK;
  switch (t->op) {
    case OP_COPY:
    case OP_COPY_2D:
      open_task_bufs(s, t, 1);
      for (size_t r = 0; r < t->height; r++) memmove(t->dst + r * t->dpitch, t->src + r * t->spitch, t->width);
      open_task_bufs(s, t, 0);
      break;
    case OP_CAST:
      if (!sl_dtype_is_castable(t->dst_dt) || !sl_dtype_is_castable(t->src_dt)) {
        snprintf(q->task_msg, sizeof q->task_msg,
                 "sim:%d: cast_async on stream %p: cannot cast %s to %s (only F64, F32, F16 and BF16 are castable)",
                 s->device_index, (void *)q, sl_dtype_name(t->src_dt), sl_dtype_name(t->dst_dt));
        return SL_ERR_DTYPE;
      }
      open_task_bufs(s, t, 1);
      st = sl_convert(t->dst, t->dst_dt, t->src, t->src_dt, t->count);
      open_task_bufs(s, t, 0);
      if (st != SL_OK)
        snprintf(q->task_msg, sizeof q->task_msg, "sim:%d: cast_async on stream %p: %s to %s failed (%s)",
                 s->device_index, (void *)q, sl_dtype_name(t->src_dt), sl_dtype_name(t->dst_dt),
                 sl_status_name(st));
      break;
    case OP_WAIT:
      st = run_wait(s, q, t);
      break;
    case OP_FN:
      q->task_msg[0] = 0;
      st = t->fn(t->arg, q->task_msg, sizeof q->task_msg);
      if (st != SL_OK && !q->task_msg[0])
        snprintf(q->task_msg, sizeof q->task_msg, "sim:%d: a task on stream %p failed (%s)", s->device_index,
                 (void *)q, sl_status_name(st));
      break;
    case OP_RECORD:
      break; /* completes in finish_task, with the other bookkeeping, under the lock */
  }
  return st;
}

/* Bookkeeping after a task ran: buffer references, events, counters, the sticky error. Called
 * with the lock held. */
static void finish_task(sim_backend *s, sim_stream *q, sim_task *t, sl_status st) {
  for (int i = 0; i < 2; i++)
    if (t->bufs[i]) t->bufs[i]->refs--;
  if (t->op == OP_RECORD) {
    if (t->ev->completed < t->seq) t->ev->completed = t->seq;
    t->ev->pending--;
  } else if (t->op == OP_WAIT) {
    t->ev->pending--;
  }
  if (st == SL_OK && (t->op == OP_COPY || t->op == OP_COPY_2D)) {
    uint64_t bytes = (uint64_t)t->width * t->height;
    if (t->kind == SL_COPY_H2D) {
      s->c.h2d += bytes;
      if (t->host_pageable) s->c.h2d_pageable += bytes;
    } else if (t->kind == SL_COPY_D2H) {
      s->c.d2h += bytes;
      if (t->host_pageable) s->c.d2h_pageable += bytes;
    } else {
      s->c.d2d += bytes;
    }
  }
  if (st != SL_OK) set_sticky_locked(s, st, q->task_msg);
  s->c.tasks++;
  s->completed++;
  q->done++;
  pthread_cond_broadcast(&s->progress);
}

static void *worker_main(void *arg) {
  sim_stream *q = arg;
  sim_backend *s = q->s;
  tl_stream = q;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (!q->head && !q->stop) pthread_cond_wait(&q->work, &s->lock);
    sim_task *t = q->head;
    if (!t) break; /* stopped and drained */
    q->head = t->next;
    if (!q->head) q->tail = NULL;
    sim_pause(s, next_rand(s));
    pthread_mutex_unlock(&s->lock);
    sl_status st = run_task(s, q, t);
    if (t->free_arg) t->free_arg(t->arg); /* before the task counts as done: a sync covers it */
    pthread_mutex_lock(&s->lock);
    finish_task(s, q, t, st);
    pthread_mutex_unlock(&s->lock);
    free(t);
    pthread_mutex_lock(&s->lock);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

/* Appends T to Q (lock held): takes its buffer references; enqueue never blocks. */
void sim__enqueue_locked(sim_backend *s, sim_stream *q, sim_task *t) {
  for (int i = 0; i < 2; i++)
    if (t->bufs[i]) t->bufs[i]->refs++;
  t->next = NULL;
  if (q->tail) q->tail->next = t;
  else q->head = t;
  q->tail = t;
  q->queued++;
  pthread_cond_signal(&q->work);
}

sim_stream *sim__stream_of(sim_backend *s, void *stream) {
  sim_stream *q = stream ? stream : s->def;
  if (q->magic != SIM_STREAM_MAGIC || q->s != s) sim__abort(s, "%p is not a live stream of this backend", stream);
  return q;
}

static sim_event *event_of(sim_backend *s, void *event) {
  sim_event *e = event;
  if (!e || e->magic != SIM_EVENT_MAGIC) sim__abort(s, "%p is not a live event of this backend", event);
  return e;
}

sl_status sim__stream_start(sim_backend *s, sim_stream **out) {
  sim_stream *q = calloc(1, sizeof *q);
  if (!q) return sim__fail(s, SL_ERR_NOMEM, "sim:%d: out of memory creating a stream", s->device_index);
  q->magic = SIM_STREAM_MAGIC;
  q->s = s;
  pthread_cond_init(&q->work, NULL);
  /* Workers take no asynchronous signals: a caller's handler (sl_context_abort) runs on the
   * caller's threads. Faults (strict mode) are still delivered to the faulting thread. */
  sigset_t all, old;
  sigfillset(&all);
  sigdelset(&all, SIGSEGV);
  sigdelset(&all, SIGBUS);
  sigdelset(&all, SIGFPE);
  sigdelset(&all, SIGILL);
  sigdelset(&all, SIGABRT);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&q->thread, NULL, worker_main, q);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    pthread_cond_destroy(&q->work);
    free(q);
    return sim__fail(s, SL_ERR_BACKEND, "sim:%d: cannot start a stream worker thread: %s", s->device_index,
                     strerror(rc));
  }
  pthread_mutex_lock(&s->lock);
  q->next = s->streams;
  if (s->streams) s->streams->prev = q;
  s->streams = q;
  pthread_mutex_unlock(&s->lock);
  *out = q;
  return SL_OK;
}

/* Drains the stream's queue, joins its worker and frees it. */
void sim__stream_stop(sim_backend *s, sim_stream *q) {
  pthread_mutex_lock(&s->lock);
  q->stop = 1;
  pthread_cond_signal(&q->work);
  pthread_mutex_unlock(&s->lock);
  pthread_join(q->thread, NULL);
  pthread_mutex_lock(&s->lock);
  if (q->prev) q->prev->next = q->next;
  else s->streams = q->next;
  if (q->next) q->next->prev = q->prev;
  pthread_mutex_unlock(&s->lock);
  pthread_cond_destroy(&q->work);
  q->magic = 0;
  free(q);
}

/* FN runs on the stream's worker without the backend's lock, its ERR the task's message: it
 * may call SL_EXT_HOST_ACCESS (a failure there writes ERR), never the host's fail (module.h,
 * Threads) and never a sync (it would wait for itself). Each stream has a worker of its own, so
 * FN may wait, bounded, for a host function of another stream. */
sl_status sim__launch_host_fn(void *be, void *stream, sim_fn fn, void *arg) {
  sim_backend *s = be;
  sim_stream *q = sim__stream_of(s, stream);
  if (!fn) return sim__fail(s, SL_ERR_INVALID, "sim:%d: launch_host_fn: no function", s->device_index);
  sim_task *t = calloc(1, sizeof *t);
  if (!t) return sim__fail(s, SL_ERR_NOMEM, "sim:%d: out of memory queueing a host function", s->device_index);
  *t = (sim_task){.op = OP_FN, .fn = fn, .arg = arg};
  pthread_mutex_lock(&s->lock);
  sim__enqueue_locked(s, q, t);
  pthread_mutex_unlock(&s->lock);
  return SL_OK;
}

/* Every task is allocated before the first is queued, so that a failure leaves nothing behind:
 * a queued wait would keep its event pending, and the caller, which keeps the events on
 * failure, could not destroy them. Waits for records already complete are not queued, as in
 * stream_wait_event. */
sl_status sim__enqueue_after_events(sim_backend *s, sim_stream *q, void *const *events, size_t n, sim_fn fn,
                                    void *arg, void (*free_arg)(void *)) {
  sim_event **evs = calloc(n ? n : 1, sizeof *evs);
  sim_task **waits = calloc(n ? n : 1, sizeof *waits), *run = calloc(1, sizeof *run);
  int ok = evs && waits && run;
  for (size_t i = 0; ok && i < n; i++) {
    evs[i] = event_of(s, events[i]);
    ok = (waits[i] = calloc(1, sizeof **waits)) != NULL;
  }
  if (!ok) {
    for (size_t i = 0; waits && i < n; i++) free(waits[i]);
    free(waits);
    free(evs);
    free(run);
    return sim__fail(s, SL_ERR_NOMEM, "sim:%d: out of memory queueing a free behind %zu event(s)", s->device_index, n);
  }
  *run = (sim_task){.op = OP_FN, .fn = fn, .arg = arg, .free_arg = free_arg};
  pthread_mutex_lock(&s->lock);
  for (size_t i = 0; i < n; i++) {
    sim_task *t = waits[i];
    *t = (sim_task){.op = OP_WAIT, .ev = evs[i], .seq = evs[i]->recorded};
    if (t->seq > evs[i]->completed) {
      evs[i]->pending++;
      sim__enqueue_locked(s, q, t);
      waits[i] = NULL;
    }
  }
  sim__enqueue_locked(s, q, run);
  pthread_mutex_unlock(&s->lock);
  for (size_t i = 0; i < n; i++) free(waits[i]); /* not queued: nothing to wait for */
  free(waits);
  free(evs);
  return SL_OK;
}

/* ---- streams, events, synchronisation ------------------------------------------------------- */
sl_status sim__stream_create(void *be, void **stream) {
  sim_stream *q;
  sl_status st = sim__stream_start(be, &q);
  if (st == SL_OK) *stream = q;
  return st;
}

/* The NULL stream is the backend's own; another stream drains before it goes. */
void sim__stream_destroy(void *be, void *stream) {
  if (stream) sim__stream_stop(be, sim__stream_of(be, stream));
}

sl_status sim__event_create(void *be, void **event) {
  sim_backend *s = be;
  sim_event *e = calloc(1, sizeof *e);
  if (!e) return sim__fail(s, SL_ERR_NOMEM, "sim:%d: out of memory creating an event", s->device_index);
  e->magic = SIM_EVENT_MAGIC;
  pthread_mutex_lock(&s->lock);
  e->next = s->events;
  if (s->events) s->events->prev = e;
  s->events = e;
  pthread_mutex_unlock(&s->lock);
  *event = e;
  return SL_OK;
}

void sim__event_destroy(void *be, void *event) {
  sim_backend *s = be;
  if (!event) return;
  sim_event *e = event_of(s, event);
  pthread_mutex_lock(&s->lock);
  if (e->pending)
    sim__abort(s, "event_destroy(%p) while %d record(s) or wait(s) on it are still queued: sync first", event,
               e->pending);
  if (e->prev) e->prev->next = e->next;
  else s->events = e->next;
  if (e->next) e->next->prev = e->prev;
  pthread_mutex_unlock(&s->lock);
  e->magic = 0;
  free(e);
}

sl_status sim__event_record(void *be, void *event, void *stream) {
  sim_backend *s = be;
  sim_event *e = event_of(s, event);
  sim_stream *q = sim__stream_of(s, stream);
  sim_task *t = calloc(1, sizeof *t);
  if (!t) return sim__fail(s, SL_ERR_NOMEM, "sim:%d: event_record: out of memory", s->device_index);
  t->op = OP_RECORD;
  t->ev = e;
  pthread_mutex_lock(&s->lock);
  t->seq = ++e->recorded;
  e->pending++;
  sim__enqueue_locked(s, q, t);
  pthread_mutex_unlock(&s->lock);
  return SL_OK;
}

sl_status sim__stream_wait_event(void *be, void *stream, void *event) {
  sim_backend *s = be;
  sim_event *e = event_of(s, event);
  sim_stream *q = sim__stream_of(s, stream);
  sim_task *t = calloc(1, sizeof *t);
  if (!t) return sim__fail(s, SL_ERR_NOMEM, "sim:%d: stream_wait_event: out of memory", s->device_index);
  t->op = OP_WAIT;
  t->ev = e;
  pthread_mutex_lock(&s->lock);
  t->seq = e->recorded; /* the record current at the call, as cudaStreamWaitEvent */
  if (t->seq > e->completed) {
    e->pending++;
    sim__enqueue_locked(s, q, t);
    t = NULL;
  }
  pthread_mutex_unlock(&s->lock);
  free(t); /* never recorded, or already complete: nothing to wait for */
  return SL_OK;
}

/* With the lock held: the sticky error (message copied to MSG), or SL_OK. */
static sl_status sticky_locked(sim_backend *s, char *msg, size_t len) {
  if (s->err != SL_OK) snprintf(msg, len, "%s", s->errmsg);
  return s->err;
}

static sl_status report(sim_backend *s, sl_status st, const char *msg) {
  return st == SL_OK ? SL_OK : sim__fail(s, st, "%s", msg);
}

int sim__event_query(void *be, void *event) {
  sim_backend *s = be;
  sim_event *e = event_of(s, event);
  char msg[SL__ERRMSG_LEN];
  pthread_mutex_lock(&s->lock);
  sl_status st = sticky_locked(s, msg, sizeof msg);
  int done = e->completed >= e->recorded;
  pthread_mutex_unlock(&s->lock);
  if (st != SL_OK) {
    report(s, st, msg);
    return -1;
  }
  return done;
}

/* The caller's waits, each bounded by the job's timeout and a grace (wait_ms, from the call):
 * past it the wait fails with SL_ERR_TIMEOUT naming itself, and that failure is sticky like any
 * other, so the work still queued drains at once (sim_pause) and a later synchronize, before
 * the caller frees what it used, ends promptly. */

/* Lock held: waits on s->progress while DONE(ARG) is false, until UNTIL; false past it. */
static bool wait_until_locked(sim_backend *s, bool (*done)(sim_backend *, const void *), const void *arg,
                              const struct timespec *until) {
  while (!done(s, arg))
    if (!wait_progress(s, until) && !done(s, arg)) return false;
  return true;
}

/* Lock held: the outcome of a caller's wait, reported on the caller's thread after unlocking. */
static sl_status finish_wait_locked(sim_backend *s, bool in_time, const char *wait, const char *on, char *msg,
                                    size_t len) {
  if (!in_time) {
    timeout_msg(s, msg, len, wait, on);
    set_sticky_locked(s, SL_ERR_TIMEOUT, msg);
    return SL_ERR_TIMEOUT;
  }
  return sticky_locked(s, msg, len);
}

typedef struct event_target {
  const sim_event *e;
  uint64_t record;
} event_target;

static bool event_done(sim_backend *s, const void *arg) {
  const event_target *t = arg;
  return t->e->completed >= t->record;
}

sl_status sim__event_sync(void *be, void *event) {
  sim_backend *s = be;
  sim_event *e = event_of(s, event);
  char msg[SL__ERRMSG_LEN], on[64];
  snprintf(on, sizeof on, "on event %p", event);
  struct timespec until = after_us((uint64_t)s->wait_ms * 1000);
  pthread_mutex_lock(&s->lock);
  event_target t = {e, e->recorded};
  sl_status st = finish_wait_locked(s, wait_until_locked(s, event_done, &t, &until), "event_sync", on, msg, sizeof msg);
  pthread_mutex_unlock(&s->lock);
  return report(s, st, msg);
}

typedef struct stream_target {
  const sim_stream *q;
  uint64_t queued;
} stream_target;

static bool stream_done(sim_backend *s, const void *arg) {
  const stream_target *t = arg;
  return t->q->done >= t->queued;
}

sl_status sim__stream_sync(void *be, void *stream) {
  sim_backend *s = be;
  sim_stream *q = sim__stream_of(s, stream);
  char msg[SL__ERRMSG_LEN], on[64];
  snprintf(on, sizeof on, "on stream %p", (void *)q);
  struct timespec until = after_us((uint64_t)s->wait_ms * 1000);
  pthread_mutex_lock(&s->lock);
  stream_target t = {q, q->queued};
  sl_status st = finish_wait_locked(s, wait_until_locked(s, stream_done, &t, &until), "stream_sync", on, msg, sizeof msg);
  pthread_mutex_unlock(&s->lock);
  return report(s, st, msg);
}

/* Every stream idle (the list may change while the lock is dropped: it is walked afresh). */
static bool all_done(sim_backend *s, const void *arg) {
  (void)arg;
  for (sim_stream *q = s->streams; q; q = q->next)
    if (q->done < q->queued) return false;
  return true;
}

sl_status sim__synchronize(void *be) {
  sim_backend *s = be;
  char msg[SL__ERRMSG_LEN];
  struct timespec until = after_us((uint64_t)s->wait_ms * 1000);
  pthread_mutex_lock(&s->lock);
  sl_status st = finish_wait_locked(s, wait_until_locked(s, all_done, NULL, &until), "synchronize", "on every stream",
                                    msg, sizeof msg);
  pthread_mutex_unlock(&s->lock);
  return report(s, st, msg);
}
