/* What the CUDA backend's host files share: the backend's state, error reporting and the
 * bounded waits. cuda.c holds the ops table, probe, init/fini, describe and the extensions;
 * cuda_mem.c memory and the allocation table; cuda_stream.c streams, events, copies, casts and
 * synchronisation. Private to the module (shardload_add_module's version script exports only the
 * entry symbols). */
#ifndef SHARDLOAD_CUDA_INTERNAL_H
#define SHARDLOAD_CUDA_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "vendor.h" /* cuda_runtime_api.h, or the HIP map */

#include "shardload/module.h"
#include "shardload/module_util.h" /* SL_INIT_GET, sl_poll, deadlines */

#define CU_MSG_LEN 1024
/* How long a sync waits before it gives up; the backend has no job timeout of its own (the
 * NCCL module's watchdog aborts hung collectives long before this). */
#define CU_DEFAULT_SYNC_TIMEOUT_S 600u

typedef struct cu_alloc {
  uintptr_t base;
  size_t bytes;
} cu_alloc;

typedef struct cu_backend {
  const sl_module_host *host;
  int dev;
  size_t max_pitch; /* cudaDeviceProp.memPitch: the largest pitch cudaMemcpy2DAsync takes */
  int local_rank;
  unsigned sync_timeout_s;
  cudaStream_t alloc_stream; /* allocations and frees only: completes on return */
  cudaStream_t def;          /* the ABI's NULL stream: non-blocking, never CUDA's legacy stream */
  /* free_device_after's frees, each behind waits for a consumer's events: never synchronised by
   * the module (the work it waits for is another API's), left to the driver at fini */
  cudaStream_t release_stream;
  cudaMemPool_t pool;        /* the module's own pool, so trimming it touches nobody else's */
  void *libcuda;             /* for cuMemGetAddressRange (is_device_ptr on foreign pointers) */
  int (*get_range)(unsigned long long *base, size_t *size, unsigned long long ptr);
  /* cuCtxGetCurrent / cuCtxSetCurrent: what cu__enter saves and cu__leave restores (NULL: not
   * found, nothing is restored) */
  int (*ctx_get)(void **ctx);
  int (*ctx_set)(void *ctx);
  pthread_mutex_t lock; /* the tables below and the sticky error */
  cu_alloc *allocs;     /* live device allocations, sorted by base */
  size_t nallocs, cap;
  cudaStream_t *streams; /* streams created through the ABI (synchronize polls them) */
  size_t nstreams, scap;
  /* streams given up with their work (SL_EXT_STREAM_ABANDON: a communicator left behind): no
   * wait of the module waits for them, never destroyed; cu__quiet still looks at them */
  cudaStream_t *abandoned;
  size_t nabandoned, acap;
  /* pinned buffers whose cudaFreeHost waits for a quiet device (cu__free_pinned) */
  void **deferred;
  size_t ndeferred, dcap;
  /* a deferred free emptied the table: the pool gives its memory back at the next synchronize
   * (release threshold 0) until the next allocation restores the caching */
  int release_due;
  sl_status err; /* sticky: the first failure of enqueued work */
  int stuck;     /* a wait gave up on queued work (a kernel that does not end): later waits ask
                    once and do not wait again (atomic; cuda_stream.c) */
  char errmsg[CU_MSG_LEN];
  uint64_t h2d, d2h; /* bytes copied each way (atomics) */
  char desc[256];
  char busid[32]; /* the device's PCI address, "0000:3b:00.0": its identity on this machine */
} cu_backend;

/* Dtype names and sizes without calling into libshardload: the module is self-contained (linked
 * with -z defs), so it loads even where the core was opened RTLD_LOCAL. 0 / "?" when not one
 * of the castable dtypes. */
static inline size_t cu__dt_size(sl_dtype dt) {
  return dt == SL_DTYPE_F64 ? 8 : dt == SL_DTYPE_F32 ? 4 : dt == SL_DTYPE_F16 || dt == SL_DTYPE_BF16 ? 2 : 0;
}
static inline const char *cu__dt_name(sl_dtype dt) {
  return dt == SL_DTYPE_F64 ? "F64" : dt == SL_DTYPE_F32 ? "F32" : dt == SL_DTYPE_F16 ? "F16" : dt == SL_DTYPE_BF16 ? "BF16" : "a non-castable dtype";
}

/* Makes S's device current on the calling thread (CUDA's current device is per thread, and the
 * core calls from several); returns the CUDA error. */
cudaError_t cu__bind(cu_backend *s);

/* What an op run on a caller's thread (a state's free or an export's release, on a user's or a
 * garbage collector's thread) changes there and gives back: the thread's current context, so
 * that the caller's current device (torch's) stays what it was, and its stream-capture mode,
 * relaxed meanwhile so that the op's calls are legal while a thread captures a CUDA graph. */
typedef struct cu_saved {
  void *ctx;
  int has_ctx;
  enum cudaStreamCaptureMode mode;
} cu_saved;
/* cu__bind after saving into SV; every cu__enter is paired with one cu__leave. */
cudaError_t cu__enter(cu_backend *s, cu_saved *sv);
void cu__leave(cu_backend *s, const cu_saved *sv);

/* Reports a failure through the host: "cuda:DEV: CALL failed: cudaErrorX (text); WHAT". With
 * STICKY the failure is also remembered and returned by later syncs. */
__attribute__((format(printf, 5, 6))) sl_status cu__fail_cuda(cu_backend *s, int sticky, const char *call,
                                                              cudaError_t e, const char *fmt, ...);
/* A failure that is not a CUDA error (bad argument, timeout). */
__attribute__((format(printf, 4, 5))) sl_status cu__fail(cu_backend *s, int sticky, sl_status st, const char *fmt,
                                                         ...);
/* The sticky error (reported again through the host), or SL_OK. */
sl_status cu__sticky(cu_backend *s);
/* Records MSG as the sticky error if none is, without reporting it (teardown's own findings
 * must not replace the message of the failure being returned). */
void cu__set_sticky(cu_backend *s, sl_status st, const char *msg);

/* ---- cuda_mem.c ---------------------------------------------------------------------------- */
sl_status cu__alloc_device(void *be, size_t bytes, void **ptr);
void cu__free_device(void *be, void *ptr);
sl_status cu__free_device_after(void *be, void *const *ptrs, size_t n, void *const *events, size_t nevents);
sl_status cu__alloc_pinned(void *be, size_t bytes, void **ptr);
void cu__free_pinned(void *be, void *ptr);
sl_status cu__register_host(void *be, void *ptr, size_t bytes);
void cu__unregister_host(void *be, void *ptr);
int cu__is_device_ptr(void *be, const void *ptr, size_t bytes);
/* Whether [p, p+n) lies inside one live allocation of the table (lock taken inside); with
 * INSIDE, whether P itself lies in one (whatever N). */
int cu__in_table(cu_backend *s, const void *p, size_t n);
int cu__in_table_ex(cu_backend *s, const void *p, size_t n, int *inside);

/* ---- cuda_stream.c ------------------------------------------------------------------------- */
cudaStream_t cu__stream_of(cu_backend *s, void *stream);
sl_status cu__stream_create(void *be, void **stream);
void cu__stream_destroy(void *be, void *stream);
sl_status cu__event_create(void *be, void **event);
void cu__event_destroy(void *be, void *event);
sl_status cu__event_record(void *be, void *event, void *stream);
sl_status cu__event_record_native(void *be, void *event, void *native);
sl_status cu__stream_wait_event(void *be, void *stream, void *event);
int cu__event_query(void *be, void *event);
sl_status cu__event_sync(void *be, void *event);
sl_status cu__stream_sync(void *be, void *stream);
sl_status cu__synchronize(void *be);
sl_status cu__copy_async(void *be, void *dst, const void *src, size_t bytes, sl_copy_kind kind, void *stream);
sl_status cu__copy_2d_async(void *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                            size_t height, sl_copy_kind kind, void *stream);
sl_status cu__cast_async(void *be, void *dst, sl_dtype dst_dt, const void *src, sl_dtype src_dt, size_t count,
                         void *stream);
sl_status cu__launch_host_fn(void *be, void *stream, sl_status (*fn)(void *arg, char *err, size_t errlen), void *arg);
/* Polls STREAM (cudaStreamQuery) until it is idle, within the sync timeout; WHAT names the wait. */
sl_status cu__wait_stream(cu_backend *s, cudaStream_t stream, const char *what);
/* Whether every stream of S, abandoned ones included, is idle now: one look under the lock (no
 * stream is destroyed meanwhile), no wait, nothing latched. What would synchronise the whole
 * device (cudaFreeHost) is done only when it is. Lock held by the caller. */
int cu__quiet_locked(cu_backend *s);
/* SL_EXT_STREAM_ABANDON (module.h): STREAM leaves the module's waits, with its work. */
void cu__stream_abandon(void *be, void *stream);

/* ---- cuda_mem.c, continued ------------------------------------------------------------------ */
/* Frees the deferred pinned buffers when the device is quiet now (after a synchronize); with
 * AT_FINI, says how many are left to the process's exit when it is not. */
void cu__free_deferred(cu_backend *s, int at_fini);

#endif
