/* What sim.c (the ops table, buffers, allocation, strict-mode access, domain checks, counters,
 * extensions, init/fini) and sim_stream.c (streams, workers, the task queue, events, sticky
 * errors, synchronisation) share: the backend's structures and the functions one file calls in
 * the other. Internal to the sim backend; nothing here leaves the library (cmake/shardload.map).
 *
 * Locking: one mutex (s->lock) guards the buffer table, every queue, every event and the
 * counters; workers drop it while they sleep and while they move bytes, so streams really run
 * concurrently. s->progress is broadcast whenever any task completes: syncs and event waits
 * wait on it. */
#ifndef SHARDLOAD_SIM_INTERNAL_H
#define SHARDLOAD_SIM_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

typedef struct sim_buf {
  unsigned char *base;
  size_t bytes;  /* as asked */
  size_t mapped; /* page-rounded, strict-mode device memory */
  sl__sim_kind kind;
  int owned; /* 0: a caller's range registered with register_host */
  int opens; /* host access opens in progress (strict mode: mapped RW while > 0) */
  int refs;  /* queued or running tasks that use it */
  int released; /* handed to free_device_after: no new work may use it */
} sim_buf;

typedef struct sim_event {
  uint64_t magic;
  uint64_t recorded;  /* records enqueued */
  uint64_t completed; /* highest record whose marker has run */
  int pending;        /* queued markers and waits that name it */
  struct sim_event *prev, *next;
} sim_event;

typedef enum sim_op { OP_COPY, OP_COPY_2D, OP_CAST, OP_RECORD, OP_WAIT, OP_FN } sim_op;

/* A host function (module.h, launch_host_fn): writes the message of its failure into ERR. */
typedef sl_status (*sim_fn)(void *arg, char *err, size_t errlen);

typedef struct sim_task {
  struct sim_task *next;
  sim_op op;
  sl_copy_kind kind;
  unsigned char *dst;
  const unsigned char *src;
  size_t width, height, dpitch, spitch; /* OP_COPY: width bytes, height 1 */
  sl_dtype dst_dt, src_dt;
  size_t count;
  sim_event *ev;
  uint64_t seq;
  sim_fn fn;
  void *arg;
  void (*free_arg)(void *);
  sim_buf *bufs[2];  /* device or pinned buffers it uses (NULL: none), held by refs */
  int host_pageable; /* h2d/d2h whose host side is neither pinned nor registered */
} sim_task;

struct sim_backend;
typedef struct sim_stream {
  uint64_t magic;
  struct sim_backend *s;
  pthread_t thread;
  pthread_cond_t work; /* a task was queued, or stop */
  sim_task *head, *tail;
  uint64_t queued, done;
  int stop;
  /* The message of the failure of the task running: an OP_FN task's ERR (launch_host_fn), and
   * what a failed op it called wrote (sim__fail); written by the worker only. */
  char task_msg[SL__ERRMSG_LEN];
  struct sim_stream *prev, *next;
} sim_stream;

typedef struct sim_backend {
  const sl_module_host *host;
  int strict;
  int device_index;
  unsigned delay_us, min_delay_us; /* each task waits a random min_delay_us..delay_us first */
  int timeout_ms; /* the job's (sl_backend_init.timeout_ms) */
  int wait_ms;    /* the bound of every wait: the job's timeout and a grace (sim.c) */
  pthread_mutex_t lock;
  pthread_cond_t progress; /* CLOCK_MONOTONIC */
  sim_buf **bufs;          /* sorted by base, never overlapping */
  size_t nbufs, cap;
  sim_stream *def; /* the NULL stream */
  sim_stream *release; /* free_device_after's frees, each behind its waits (started at init) */
  sim_stream *streams;
  sim_event *events;
  uint64_t rng;       /* xorshift64 state */
  uint64_t completed; /* tasks completed on every stream */
  sl__sim_counters c;
  sl_status err; /* sticky: the first failure of enqueued work */
  char errmsg[SL__ERRMSG_LEN];
} sim_backend;

/* ---- sim.c ---------------------------------------------------------------------------------- */
/* A core bug a test must not survive: say what and crash. */
__attribute__((noreturn, format(printf, 2, 3))) void sim__abort(sim_backend *s, const char *fmt, ...);
/* Host access to a device buffer, counted (lock held); strict mode maps it on the first open
 * and unmaps it on the last close. */
void sim__buf_open(sim_backend *s, sim_buf *b);
void sim__buf_close(sim_backend *s, sim_buf *b);
/* SL_EXT_HOST_ACCESS: opens (OPEN 1) or closes (0) device memory [PTR, PTR+BYTES) for host
 * access (strict mode maps it; in every mode the range must lie inside one device buffer and
 * opens are counted per buffer: freeing an open buffer aborts). SL_ERR_BACKEND, with the
 * message through the host or, inside a task, into the task's message, when the range is not
 * inside one device buffer. */
sl_status sim__host_access(void *be, const void *ptr, size_t bytes, int open);

/* ---- sim_stream.c --------------------------------------------------------------------------- */
/* Reports a failure of a call: through the host on a caller's thread, into the running task's
 * message on a worker. */
__attribute__((format(printf, 3, 4))) sl_status sim__fail(sim_backend *s, sl_status st, const char *fmt, ...);
/* Appends T to Q (lock held): takes its buffer references; enqueue never blocks. */
void sim__enqueue_locked(sim_backend *s, sim_stream *q, sim_task *t);
/* The stream STREAM names (NULL: the default one); aborts on anything else. */
sim_stream *sim__stream_of(sim_backend *s, void *stream);
/* Starts a stream and its worker; stopping drains its queue, joins the worker and frees it. */
sl_status sim__stream_start(sim_backend *s, sim_stream **out);
void sim__stream_stop(sim_backend *s, sim_stream *q);
/* Queues on Q a wait for the current record of each of the N EVENTS, then FN(ARG), all or
 * nothing: on failure (out of memory) nothing was queued and ARG was not freed. FREE_ARG(ARG)
 * runs after FN. */
sl_status sim__enqueue_after_events(sim_backend *s, sim_stream *q, void *const *events, size_t n, sim_fn fn,
                                    void *arg, void (*free_arg)(void *));
/* launch_host_fn (module.h): FN(ARG) in stream order on STREAM's worker, without the lock; it
 * may call sim__host_access (SL_EXT_HOST_ACCESS), whose failure lands in its ERR. */
sl_status sim__launch_host_fn(void *be, void *stream, sim_fn fn, void *arg);
/* The stream, event and synchronisation ops of the table in sim.c. */
sl_status sim__stream_create(void *be, void **stream);
void sim__stream_destroy(void *be, void *stream);
sl_status sim__event_create(void *be, void **event);
void sim__event_destroy(void *be, void *event);
sl_status sim__event_record(void *be, void *event, void *stream);
sl_status sim__stream_wait_event(void *be, void *stream, void *event);
int sim__event_query(void *be, void *event);
sl_status sim__event_sync(void *be, void *event);
sl_status sim__stream_sync(void *be, void *stream);
sl_status sim__synchronize(void *be);

#endif
