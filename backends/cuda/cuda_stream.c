/* The CUDA backend's asynchronous half: ABI streams and events mapped one to one onto CUDA
 * streams (non-blocking) and events (no timing), copies, 2-D copies and casts enqueued on them,
 * and the synchronisation ops.
 *
 * No wait is unbounded: syncs poll cudaEventQuery / cudaStreamQuery with a short back-off
 * (cu__poll, cuda_wait.c) instead of cudaEventSynchronize (which cannot be interrupted), and
 * give up after the sync timeout (SHARDLOAD_CUDA_SYNC_TIMEOUT_S, default 600 s) with a sticky
 * SL_ERR_TIMEOUT; after one has, later waits ask once and do not wait again. A failed enqueue
 * or sync is sticky too, as in sim: every later sync reports the first failure. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "cuda_kernels.h"
#include "cuda_wait.h"

cudaStream_t cu__stream_of(cu_backend *s, void *stream) { return stream ? (cudaStream_t)stream : s->def; }

/* Whether an earlier wait gave up on queued work: a kernel that does not end. Later waits then
 * ask once and do not wait again — at teardown above all, where every stream, buffer and
 * communicator would otherwise wait out the timeout in turn. */
static int wedged(cu_backend *s) { return __atomic_load_n(&s->stuck, __ATOMIC_ACQUIRE); }
static void gave_up(cu_backend *s) { __atomic_store_n(&s->stuck, 1, __ATOMIC_RELEASE); }

static int query_status(cudaError_t e) { return e == cudaSuccess ? 1 : e == cudaErrorNotReady ? 0 : -1; }

typedef struct one_query {
  cudaEvent_t event;
  cudaStream_t stream;
  cudaError_t e;
} one_query;

static int query_one(void *arg, size_t i) {
  one_query *q = arg;
  q->e = q->event ? cudaEventQuery(q->event) : cudaStreamQuery(q->stream);
  return query_status(q->e);
}

/* Polls EVENT (or STREAM when EVENT is NULL) until it completes (cu__poll), then returns the
 * sticky error. */
static sl_status poll_done(cu_backend *s, cudaEvent_t event, cudaStream_t stream, const char *what) {
  int stuck = wedged(s);
  one_query q = {event, stream, cudaSuccess};
  cu_wait w = cu__poll(query_one, &q, 1, cu__now_s() + (stuck ? 0 : s->sync_timeout_s), NULL);
  if (w == CU_WAIT_DONE) return cu__sticky(s);
  if (w == CU_WAIT_FAILED)
    return cu__fail_cuda(s, 1, event ? "cudaEventQuery" : "cudaStreamQuery", q.e, "%s: work queued before it failed",
                         what);
  if (stuck)
    return cu__fail(s, 1, SL_ERR_TIMEOUT, "%s: work queued on the device has still not completed (an earlier wait "
                                          "gave up on a stuck kernel); not waiting again", what);
  gave_up(s);
  return cu__fail(s, 1, SL_ERR_TIMEOUT,
                  "%s: work queued on the device did not complete within %u s (SHARDLOAD_CUDA_SYNC_TIMEOUT_S, "
                  "default %u): a kernel or a collective is stuck; check the other ranks",
                  what, s->sync_timeout_s, CU_DEFAULT_SYNC_TIMEOUT_S);
}

static int query_stream(void *arg, size_t i) { return query_status(cudaStreamQuery(((cudaStream_t *)arg)[i])); }

int cu__quiet(cu_backend *s, const char *what) {
  cudaStream_t two[2] = {s->def, s->alloc_stream}, *q = two;
  size_t n = 2;
  pthread_rwlock_rdlock(&s->streams_rw); /* the streams listed stay live while polled */
  pthread_mutex_lock(&s->lock);
  cudaStream_t *all = malloc((s->nstreams + 2) * sizeof *all);
  if (all) { /* without memory for the list: the module's own two, better than none */
    memcpy(all, two, sizeof two);
    memcpy(all + 2, s->streams, s->nstreams * sizeof *all);
    q = all;
    n += s->nstreams;
  }
  pthread_mutex_unlock(&s->lock);
  int stuck = wedged(s);
  cu_wait w = cu__poll(query_stream, q, n, cu__now_s() + (stuck ? 0 : s->sync_timeout_s), NULL);
  pthread_rwlock_unlock(&s->streams_rw);
  free(all);
  if (w != CU_WAIT_TIMEOUT) return 1; /* idle, or failed: either way nothing runs any more */
  if (!stuck) {
    gave_up(s);
    char msg[CU_MSG_LEN];
    snprintf(msg, sizeof msg, "cuda:%d (local rank %d): %s: work queued on the device did not complete within %u s: "
             "a kernel or a collective is stuck", s->dev, s->local_rank, what, s->sync_timeout_s);
    cu__set_sticky(s, SL_ERR_TIMEOUT, msg);
  }
  return 0;
}

sl_status cu__wait_stream(cu_backend *s, cudaStream_t stream, const char *what) {
  cudaError_t e = cu__bind(s);
  if (e != cudaSuccess) return cu__fail_cuda(s, 1, "cudaSetDevice", e, "%s", what);
  return poll_done(s, NULL, stream, what);
}

/* ---- streams and events -------------------------------------------------------------------- */
sl_status cu__stream_create(void *be, void **stream) {
  cu_backend *s = be;
  cudaStream_t q = NULL;
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&q, cudaStreamNonBlocking);
  if (e != cudaSuccess) return cu__fail_cuda(s, 0, "cudaStreamCreateWithFlags", e, NULL);
  pthread_mutex_lock(&s->lock);
  int ok = 1;
  if (s->nstreams == s->scap) {
    size_t cap = s->scap ? 2 * s->scap : 16;
    cudaStream_t *n = realloc(s->streams, cap * sizeof *n);
    if (n) {
      s->streams = n;
      s->scap = cap;
    } else {
      ok = 0;
    }
  }
  if (ok) s->streams[s->nstreams++] = q;
  pthread_mutex_unlock(&s->lock);
  if (!ok) {
    cudaStreamDestroy(q);
    return cu__fail(s, 0, SL_ERR_NOMEM, "out of host memory tracking a stream");
  }
  *stream = (void *)q;
  return SL_OK;
}

/* The NULL stream is the module's own. Another stream finishes its queued work first (the ABI
 * promises it; cudaStreamDestroy alone would return at once). */
void cu__stream_destroy(void *be, void *stream) {
  cu_backend *s = be;
  if (!stream) return;
  cudaStream_t q = (cudaStream_t)stream;
  cu__wait_stream(s, q, "stream_destroy");
  pthread_rwlock_wrlock(&s->streams_rw); /* no synchronize of another thread polls it now */
  pthread_mutex_lock(&s->lock);
  for (size_t i = 0; i < s->nstreams; i++)
    if (s->streams[i] == q) {
      s->streams[i] = s->streams[--s->nstreams];
      break;
    }
  pthread_mutex_unlock(&s->lock);
  cudaStreamDestroy(q);
  pthread_rwlock_unlock(&s->streams_rw);
}

sl_status cu__event_create(void *be, void **event) {
  cu_backend *s = be;
  cudaEvent_t ev = NULL;
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) return cu__fail_cuda(s, 0, "cudaEventCreateWithFlags", e, NULL);
  *event = (void *)ev;
  return SL_OK;
}

void cu__event_destroy(void *be, void *event) {
  cu_backend *s = be;
  if (!event) return;
  cu__bind(s);
  cudaError_t e = cudaEventDestroy((cudaEvent_t)event);
  if (e != cudaSuccess) cu__fail_cuda(s, 0, "cudaEventDestroy", e, "event %p", event);
}

sl_status cu__event_record(void *be, void *event, void *stream) {
  cu_backend *s = be;
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = cudaEventRecord((cudaEvent_t)event, cu__stream_of(s, stream));
  return e == cudaSuccess ? SL_OK : cu__fail_cuda(s, 1, "cudaEventRecord", e, "event %p on stream %p", event, stream);
}

/* NATIVE is the consumer's own stream (a torch stream; DLPack numbers cudaStreamLegacy 1 and
 * cudaStreamPerThread 2 as the runtime does). The per-thread default stream is the calling
 * thread's, and a release may run on another thread than the consumer's (a garbage collector):
 * its record goes on the legacy stream instead, which first waits for every blocking stream,
 * each thread's per-thread default stream included. A failure is the caller's (a stream of
 * another device or context): not sticky, and the runtime's last error is cleared so that the
 * consumer's own error checks do not trip on it. */
sl_status cu__event_record_native(void *be, void *event, void *native) {
  cu_backend *s = be;
  cudaStream_t q = (cudaStream_t)native == cudaStreamPerThread ? cudaStreamLegacy : (cudaStream_t)native;
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = cudaEventRecord((cudaEvent_t)event, q);
  if (e == cudaSuccess) return SL_OK;
  (void)cudaGetLastError();
  return cu__fail_cuda(s, 0, "cudaEventRecord", e, "on the consumer's stream %p: not a live stream of device %d?",
                       native, s->dev);
}

sl_status cu__stream_wait_event(void *be, void *stream, void *event) {
  cu_backend *s = be;
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(cu__stream_of(s, stream), (cudaEvent_t)event, 0);
  return e == cudaSuccess ? SL_OK
                          : cu__fail_cuda(s, 1, "cudaStreamWaitEvent", e, "stream %p waiting on event %p", stream, event);
}

int cu__event_query(void *be, void *event) {
  cu_backend *s = be;
  if (cu__sticky(s) != SL_OK) return -1;
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = cudaEventQuery((cudaEvent_t)event);
  if (e == cudaSuccess) return 1;
  if (e == cudaErrorNotReady) return 0;
  cu__fail_cuda(s, 1, "cudaEventQuery", e, "event %p: work queued before it failed", event);
  return -1;
}

sl_status cu__event_sync(void *be, void *event) {
  cu_backend *s = be;
  cudaError_t e = cu__bind(s);
  if (e != cudaSuccess) return cu__fail_cuda(s, 1, "cudaSetDevice", e, "event_sync");
  return poll_done(s, (cudaEvent_t)event, NULL, "event_sync");
}

sl_status cu__stream_sync(void *be, void *stream) {
  cu_backend *s = be;
  return cu__wait_stream(s, cu__stream_of(s, stream), "stream_sync");
}

/* Every stream of the module, one after the other: the module's two and those created through
 * the ABI (a stream created meanwhile may not be covered, as with any sync). Callable from any
 * thread: the streams it polls cannot be destroyed under it (streams_rw). */
sl_status cu__synchronize(void *be) {
  cu_backend *s = be;
  sl_status st = cu__wait_stream(s, s->def, "synchronize");
  if (st == SL_OK) st = cu__wait_stream(s, s->alloc_stream, "synchronize");
  pthread_rwlock_rdlock(&s->streams_rw);
  for (size_t i = 0; st == SL_OK; i++) {
    pthread_mutex_lock(&s->lock);
    cudaStream_t q = i < s->nstreams ? s->streams[i] : NULL;
    pthread_mutex_unlock(&s->lock);
    if (!q) break;
    st = cu__wait_stream(s, q, "synchronize");
  }
  pthread_rwlock_unlock(&s->streams_rw);
  return st;
}

/* ---- host functions ------------------------------------------------------------------------ */
typedef struct cu_host_call {
  cu_backend *s;
  sl_status (*fn)(void *arg, char *err, size_t errlen);
  void *arg;
} cu_host_call;

/* On the runtime's callback thread: no CUDA call and no host call (module.h); a failure becomes
 * the sticky error that the next sync reports on the caller's thread. */
static void CUDART_CB run_host_call(void *p) {
  cu_host_call *c = p;
  char err[CU_MSG_LEN] = "";
  sl_status st = c->fn(c->arg, err, sizeof err);
  if (st != SL_OK) {
    char msg[CU_MSG_LEN];
    if (err[0]) snprintf(msg, sizeof msg, "%s", err);
    else snprintf(msg, sizeof msg, "cuda:%d (local rank %d): a host function on a stream failed (status %d)", c->s->dev,
                  c->s->local_rank, (int)st);
    cu__set_sticky(c->s, st, msg);
  }
  free(c);
}

/* cudaLaunchHostFunc: the runtime runs the function once the stream reaches it (and never after
 * the context broke: C is then left to the process's exit, as module.h allows). */
sl_status cu__launch_host_fn(void *be, void *stream, sl_status (*fn)(void *arg, char *err, size_t errlen), void *arg) {
  cu_backend *s = be;
  if (!fn) return cu__fail(s, 0, SL_ERR_INVALID, "launch_host_fn: no function");
  cu_host_call *c = malloc(sizeof *c);
  if (!c) return cu__fail(s, 0, SL_ERR_NOMEM, "launch_host_fn: out of host memory");
  *c = (cu_host_call){s, fn, arg};
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = cudaLaunchHostFunc(cu__stream_of(s, stream), run_host_call, c);
  if (e != cudaSuccess) {
    free(c);
    return cu__fail_cuda(s, 1, "cudaLaunchHostFunc", e, "on stream %p", stream);
  }
  return SL_OK;
}

/* ---- copies and casts ---------------------------------------------------------------------- */
static const char *kind_name(sl_copy_kind k) {
  return k == SL_COPY_H2D ? "H2D" : k == SL_COPY_D2H ? "D2H" : k == SL_COPY_D2D ? "D2D" : "?";
}

static int cuda_kind(sl_copy_kind k, enum cudaMemcpyKind *out) {
  switch (k) {
    case SL_COPY_H2D: *out = cudaMemcpyHostToDevice; return 1;
    case SL_COPY_D2H: *out = cudaMemcpyDeviceToHost; return 1;
    case SL_COPY_D2D: *out = cudaMemcpyDeviceToDevice; return 1;
    default: return 0;
  }
}

static void count_traffic(cu_backend *s, sl_copy_kind kind, uint64_t bytes) {
  if (kind == SL_COPY_H2D) __atomic_fetch_add(&s->h2d, bytes, __ATOMIC_RELAXED);
  else if (kind == SL_COPY_D2H) __atomic_fetch_add(&s->d2h, bytes, __ATOMIC_RELAXED);
}

/* Host sides may be pageable: cudaMemcpyAsync stages them (an H2D returns once the source is
 * staged, a D2H waits for its stream), which honours the contract. */
sl_status cu__copy_async(void *be, void *dst, const void *src, size_t bytes, sl_copy_kind kind, void *stream) {
  cu_backend *s = be;
  enum cudaMemcpyKind k;
  if (!cuda_kind(kind, &k)) return cu__fail(s, 1, SL_ERR_INVALID, "copy_async: unknown copy kind %d", (int)kind);
  if (!bytes) return SL_OK;
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, k, cu__stream_of(s, stream));
  if (e != cudaSuccess)
    return cu__fail_cuda(s, 1, "cudaMemcpyAsync", e, "%s of %zu bytes from %p to %p on stream %p", kind_name(kind),
                         bytes, src, dst, stream);
  count_traffic(s, kind, bytes);
  return SL_OK;
}

sl_status cu__copy_2d_async(void *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                            size_t height, sl_copy_kind kind, void *stream) {
  cu_backend *s = be;
  enum cudaMemcpyKind k;
  if (!cuda_kind(kind, &k)) return cu__fail(s, 1, SL_ERR_INVALID, "copy_2d_async: unknown copy kind %d", (int)kind);
  if (!width || !height) return SL_OK;
  if (height == 1) return cu__copy_async(s, dst, src, width, kind, stream); /* pitches do not matter */
  uint64_t total;
  if (dpitch < width || spitch < width || __builtin_mul_overflow((uint64_t)width, (uint64_t)height, &total))
    return cu__fail(s, 1, SL_ERR_INVALID, "copy_2d_async (%s): rows of %zu bytes do not fit pitches %zu (dst) / %zu "
                                          "(src)", kind_name(kind), width, dpitch, spitch);
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess && spitch == width && dpitch == width) /* the rows touch: one plain copy */
    return cu__copy_async(s, dst, src, width * height, kind, stream);
  if (e == cudaSuccess && (spitch > s->max_pitch || dpitch > s->max_pitch)) {
    /* past the device's largest pitch cudaMemcpy2DAsync refuses: one copy per row instead */
    for (size_t r = 0; r < height; r++) {
      sl_status st = cu__copy_async(s, (char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind, stream);
      if (st != SL_OK) return st;
    }
    return SL_OK;
  }
  if (e == cudaSuccess) e = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, k, cu__stream_of(s, stream));
  if (e != cudaSuccess)
    return cu__fail_cuda(s, 1, "cudaMemcpy2DAsync", e, "%s of %zu rows of %zu bytes (pitches %zu/%zu) from %p to %p",
                         kind_name(kind), height, width, spitch, dpitch, src, dst);
  count_traffic(s, kind, total);
  return SL_OK;
}

sl_status cu__cast_async(void *be, void *dst, sl_dtype dst_dt, const void *src, sl_dtype src_dt, size_t count,
                         void *stream) {
  cu_backend *s = be;
  size_t ds = cu__dt_size(dst_dt), ss = cu__dt_size(src_dt), dbytes, sbytes;
  if (!ds || !ss)
    return cu__fail(s, 1, SL_ERR_DTYPE, "cast_async: cannot cast dtype %d to %d (only F64, F32, F16 and BF16 are "
                                        "castable)", (int)src_dt, (int)dst_dt);
  if (__builtin_mul_overflow(count, ds, &dbytes) || __builtin_mul_overflow(count, ss, &sbytes))
    return cu__fail(s, 1, SL_ERR_INVALID, "cast_async: %zu elements overflow", count);
  if (!count) return SL_OK;
  const unsigned char *d = dst, *c = src;
  if (d < c + sbytes && c < d + dbytes)
    return cu__fail(s, 1, SL_ERR_INVALID, "cast_async: source %p and destination %p overlap", src, dst);
  if (dst_dt == src_dt) return cu__copy_async(s, dst, src, dbytes, SL_COPY_D2D, stream);
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = sl_cuda_launch_cast(dst, (int)dst_dt, src, (int)src_dt, count, cu__stream_of(s, stream));
  if (e != cudaSuccess)
    return cu__fail_cuda(s, 1, "cast kernel launch", e, "%zu elements %s to %s from %p to %p on stream %p", count,
                         cu__dt_name(src_dt), cu__dt_name(dst_dt), src, dst, stream);
  return SL_OK;
}
