/* The CUDA backend's asynchronous half: ABI streams and events mapped one to one onto CUDA
 * streams (non-blocking) and events (no timing), copies, 2-D copies and casts enqueued on them,
 * and the synchronisation ops.
 *
 * No wait is unbounded: syncs poll cudaEventQuery / cudaStreamQuery with a short back-off
 * (sl_poll, shardload/module_util.h) instead of cudaEventSynchronize (which cannot be interrupted), and
 * give up after the sync timeout (SHARDLOAD_CUDA_SYNC_TIMEOUT_S, default 600 s) with a sticky
 * SL_ERR_TIMEOUT; after one has, later waits ask once and do not wait again. A failed enqueue
 * or sync is sticky too, as in sim: every later sync reports the first failure. Frees on a
 * state's behalf never wait for the module's own work and latch nothing (cu__quiet_locked,
 * cu__free_pinned); cudaFreeHost itself still waits for other users' work on the device. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "cuda_kernels.h"

cudaStream_t cu__stream_of(cu_backend *s, void *stream) { return stream ? (cudaStream_t)stream : s->def; }

/* Whether an earlier wait gave up on queued work: a kernel that does not end. Later waits then
 * ask once and do not wait again — at teardown above all, where every stream, buffer and
 * communicator would otherwise wait out the timeout in turn. */
static int wedged(cu_backend *s) { return __atomic_load_n(&s->stuck, __ATOMIC_ACQUIRE); }
static void gave_up(cu_backend *s) { __atomic_store_n(&s->stuck, 1, __ATOMIC_RELEASE); }

static int query_status(cudaError_t e) { return e == cudaSuccess ? 1 : e == cudaErrorNotReady ? 0 : -1; }

/* What a wait polls: EVENT, or STREAM when EVENT is NULL. With LISTED the stream is one of the
 * module's list (synchronize), asked under the lock and only while it is still there: another
 * thread's stream_destroy (an NCCL communicator's end) takes it out under the lock before it
 * destroys it, and a stream gone from the list had finished its work first (or was abandoned). */
typedef struct one_query {
  cu_backend *s;
  cudaEvent_t event;
  cudaStream_t stream;
  int listed;
  cudaError_t e;
} one_query;

static int in_list_locked(const cu_backend *s, cudaStream_t q) {
  for (size_t i = 0; i < s->nstreams; i++)
    if (s->streams[i] == q) return 1;
  return 0;
}

static int query_one(void *arg, size_t i) {
  one_query *q = arg;
  if (q->event) return query_status(q->e = cudaEventQuery(q->event));
  if (!q->listed) return query_status(q->e = cudaStreamQuery(q->stream));
  pthread_mutex_lock(&q->s->lock);
  q->e = in_list_locked(q->s, q->stream) ? cudaStreamQuery(q->stream) : cudaSuccess;
  pthread_mutex_unlock(&q->s->lock);
  return query_status(q->e);
}

/* Polls Q until it completes (sl_poll), then returns the sticky error. */
static sl_status poll_done(cu_backend *s, one_query *q, const char *what) {
  int stuck = wedged(s);
  q->s = s;
  sl_poll_result w = sl_poll(query_one, q, 1, sl_deadline_in_ms(stuck ? 0 : 1000L * s->sync_timeout_s), NULL);
  if (w == SL_POLL_DONE) return cu__sticky(s);
  if (w == SL_POLL_FAILED)
    return cu__fail_cuda(s, 1, q->event ? "cudaEventQuery" : "cudaStreamQuery", q->e,
                         "%s: work queued before it failed", what);
  if (stuck)
    return cu__fail(s, 1, SL_ERR_TIMEOUT, "%s: work queued on the device has still not completed (an earlier wait "
                                          "gave up on a stuck kernel); not waiting again", what);
  gave_up(s);
  return cu__fail(s, 1, SL_ERR_TIMEOUT,
                  "%s: work queued on the device did not complete within %u s (" SL_GPU_SYNC_TIMEOUT_ENV ", default "
                  "%u): a kernel or a collective is stuck; check the other ranks",
                  what, s->sync_timeout_s, CU_DEFAULT_SYNC_TIMEOUT_S);
}

static int busy(cudaStream_t q) {
  cudaError_t e = cudaStreamQuery(q);
  if (e != cudaSuccess && e != cudaErrorNotReady) (void)cudaGetLastError(); /* not the caller's error */
  return e == cudaErrorNotReady;
}

/* One look, no wait (frees on a state's behalf run on any thread, maybe while another load
 * keeps the streams busy: busy is no failure, and nothing is latched). A failed query counts as
 * idle: nothing runs there any more. */
int cu__quiet_locked(cu_backend *s) {
  if (busy(s->def) || busy(s->alloc_stream)) return 0;
  for (size_t i = 0; i < s->nstreams; i++)
    if (busy(s->streams[i])) return 0;
  for (size_t i = 0; i < s->nabandoned; i++) /* a left-behind kernel would hold cudaFreeHost */
    if (busy(s->abandoned[i])) return 0;
  return 1;
}

sl_status cu__wait_stream(cu_backend *s, cudaStream_t stream, const char *what) {
  cudaError_t e = cu__bind(s);
  if (e != cudaSuccess) return cu__fail_cuda(s, 1, "cudaSetDevice", e, "%s", what);
  one_query q = {.stream = stream};
  return poll_done(s, &q, what);
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

/* Its work is given up with it (a communicator left behind, whose kernels may never end): the
 * stream leaves the list that synchronize and fini wait for, and is never destroyed (destroying
 * it would not wait, but NCCL may still use it); cu__quiet_locked still looks at it, since
 * cudaFreeHost would wait for its kernels. Never waits. */
void cu__stream_abandon(void *be, void *stream) {
  cu_backend *s = be;
  cudaStream_t q = (cudaStream_t)stream;
  if (!q) return;
  pthread_mutex_lock(&s->lock);
  for (size_t i = 0; i < s->nstreams; i++)
    if (s->streams[i] == q) {
      s->streams[i] = s->streams[--s->nstreams];
      if (s->nabandoned == s->acap) {
        size_t cap = s->acap ? 2 * s->acap : 4;
        cudaStream_t *n = realloc(s->abandoned, cap * sizeof *n);
        if (n) {
          s->abandoned = n;
          s->acap = cap;
        }
      }
      /* without memory for the list it is only unwatched: cudaFreeHost may then wait for it */
      if (s->nabandoned < s->acap) s->abandoned[s->nabandoned++] = q;
      break;
    }
  pthread_mutex_unlock(&s->lock);
}

/* The NULL stream is the module's own. Another stream finishes its queued work first (the ABI
 * promises it; cudaStreamDestroy alone would return at once). */
void cu__stream_destroy(void *be, void *stream) {
  cu_backend *s = be;
  if (!stream) return;
  cudaStream_t q = (cudaStream_t)stream;
  cu__wait_stream(s, q, "stream_destroy");
  pthread_mutex_lock(&s->lock);
  for (size_t i = 0; i < s->nstreams; i++)
    if (s->streams[i] == q) {
      s->streams[i] = s->streams[--s->nstreams];
      break;
    }
  pthread_mutex_unlock(&s->lock);
  cudaStreamDestroy(q);
}

/* An export's on the caller's thread: its current device stays (cu__enter). */
sl_status cu__event_create(void *be, void **event) {
  cu_backend *s = be;
  cudaEvent_t ev = NULL;
  cu_saved sv;
  cudaError_t e = cu__enter(s, &sv);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  cu__leave(s, &sv);
  if (e != cudaSuccess) return cu__fail_cuda(s, 0, "cudaEventCreateWithFlags", e, NULL);
  *event = (void *)ev;
  return SL_OK;
}

void cu__event_destroy(void *be, void *event) {
  cu_backend *s = be;
  if (!event) return;
  cu_saved sv;
  cu__enter(s, &sv);
  cudaError_t e = cudaEventDestroy((cudaEvent_t)event);
  cu__leave(s, &sv);
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
 * each thread's per-thread default stream included. A stream being captured into a CUDA graph
 * (a tensor whose last view dies inside torch.cuda.graph) is refused: the record would become a
 * node of the graph, and the release stream's wait and the free would join the capture; the
 * legacy stream too while a blocking stream captures (cudaErrorStreamCaptureImplicit), since
 * using it would invalidate that capture. The core then falls back (shardload.h). A failure is
 * the caller's (a stream of another device or context): not sticky, and the runtime's last
 * error is cleared so that the consumer's own error checks do not trip on it. Runs on the
 * caller's thread: its current device stays (cu__enter). */
sl_status cu__event_record_native(void *be, void *event, void *native) {
  cu_backend *s = be;
  cudaStream_t q = (cudaStream_t)native == cudaStreamPerThread ? cudaStreamLegacy : (cudaStream_t)native;
  enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cu_saved sv;
  cudaError_t e = cu__enter(s, &sv), ce = cudaSuccess;
  if (e == cudaSuccess) ce = cudaStreamIsCapturing(q, &capture);
  if (e == cudaSuccess && ce == cudaSuccess && capture == cudaStreamCaptureStatusNone)
    e = cudaEventRecord((cudaEvent_t)event, q);
  cu__leave(s, &sv);
  if (e == cudaSuccess && ce == cudaSuccess && capture == cudaStreamCaptureStatusNone) return SL_OK;
  (void)cudaGetLastError();
  if (e == cudaSuccess && ce != cudaSuccess && ce != cudaErrorStreamCaptureImplicit)
    return cu__fail_cuda(s, 0, "cudaStreamIsCapturing", ce, "on the consumer's stream %p: not a live stream of "
                         "device %d?", native, s->dev);
  if (e == cudaSuccess)
    return cu__fail(s, 0, SL_ERR_UNSUPPORTED, "the consumer's stream %p is being captured into a " SL_GPU_PLATFORM " graph%s: a "
                    "record there would become a node of the graph, so the free is not ordered on the device",
                    native, ce == cudaErrorStreamCaptureImplicit ? " (the legacy stream, while a blocking stream "
                                                                   "captures)" : "");
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

/* Both run on whichever thread releases an export (prune_fences, wait_before_free): the
 * caller's current device and capture mode stay as they were (cu__enter); in the relaxed
 * capture mode a query is no unsafe call for another thread's global-mode graph capture. */
int cu__event_query(void *be, void *event) {
  cu_backend *s = be;
  if (cu__sticky(s) != SL_OK) return -1;
  cu_saved sv;
  cudaError_t e = cu__enter(s, &sv);
  if (e == cudaSuccess) e = cudaEventQuery((cudaEvent_t)event);
  cu__leave(s, &sv);
  if (e == cudaSuccess) return 1;
  if (e == cudaErrorNotReady) return 0;
  cu__fail_cuda(s, 1, "cudaEventQuery", e, "event %p: work queued before it failed", event);
  return -1;
}

sl_status cu__event_sync(void *be, void *event) {
  cu_backend *s = be;
  cu_saved sv;
  cudaError_t e = cu__enter(s, &sv);
  sl_status st;
  if (e != cudaSuccess) {
    st = cu__fail_cuda(s, 1, "cudaSetDevice", e, "event_sync");
  } else {
    one_query q = {.event = (cudaEvent_t)event};
    st = poll_done(s, &q, "event_sync");
  }
  cu__leave(s, &sv);
  return st;
}

sl_status cu__stream_sync(void *be, void *stream) {
  cu_backend *s = be;
  return cu__wait_stream(s, cu__stream_of(s, stream), "stream_sync");
}

/* Every stream of the module, one after the other: the module's two and those created through
 * the ABI (a snapshot: a stream created meanwhile is not covered, as with any sync; one
 * destroyed or abandoned meanwhile is not waited for), then the pinned frees that waited for a
 * quiet device. Callable from any thread. */
sl_status cu__synchronize(void *be) {
  cu_backend *s = be;
  cu_saved sv; /* the core's fallback and its last reference call from a caller's thread */
  cu__enter(s, &sv);
  sl_status st = cu__wait_stream(s, s->def, "synchronize");
  if (st == SL_OK) st = cu__wait_stream(s, s->alloc_stream, "synchronize");
  /* a copy of the list: a destroy or abandon on another thread moves the last entry into the
   * gap, which an index walk over the live list would skip; a copied stream is asked only
   * while it is still listed (query_one) */
  cudaStream_t *snap = NULL;
  size_t n = 0;
  if (st == SL_OK) {
    pthread_mutex_lock(&s->lock);
    n = s->nstreams;
    if (n && (snap = malloc(n * sizeof *snap))) memcpy(snap, s->streams, n * sizeof *snap);
    pthread_mutex_unlock(&s->lock);
    if (n && !snap)
      st = cu__fail(s, 0, SL_ERR_NOMEM, SL_GPU_NAME ":%d (local rank %d): synchronize: out of host memory", s->dev,
                    s->local_rank);
  }
  for (size_t i = 0; snap && i < n && st == SL_OK; i++) {
    one_query oq = {.stream = snap[i], .listed = 1};
    st = poll_done(s, &oq, "synchronize");
  }
  free(snap);
  if (st == SL_OK) cu__free_deferred(s, 0);
  cu__leave(s, &sv);
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
static void run_host_call(void *p) {
  cu_host_call *c = p;
  char err[CU_MSG_LEN] = "";
  sl_status st = c->fn(c->arg, err, sizeof err);
  if (st != SL_OK) {
    char msg[CU_MSG_LEN];
    if (err[0]) snprintf(msg, sizeof msg, "%s", err);
    else snprintf(msg, sizeof msg, SL_GPU_NAME ":%d (local rank %d): a host function on a stream failed (status %d)", c->s->dev,
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
  if (e == cudaErrorNotSupported) { /* ROCm 5.2's library lacks it: nothing was enqueued */
    free(c);
    (void)cudaGetLastError();
    return cu__fail(s, 0, SL_ERR_UNSUPPORTED, SL_GPU_NAME ":%d (local rank %d): launch_host_fn: this runtime has no "
                    "host functions on streams (ROCm 5.2's library lacks hipLaunchHostFunc)", s->dev, s->local_rank);
  }
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
