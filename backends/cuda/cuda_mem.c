/* The CUDA backend's memory: device memory from the module's own stream-ordered pool (complete
 * on return: each allocation and free is waited for on the allocation stream, which carries
 * nothing else), trimmed back to the driver once no allocation is live; pinned host memory;
 * registration of caller ranges; and the table of live allocations that is_device_ptr and the
 * enqueue checks read (sorted by base, as sim's). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* ---- the allocation table (lock held) ------------------------------------------------------ */
/* Index of the last allocation whose base is <= P, or -1. */
static ptrdiff_t index_le(const cu_backend *s, uintptr_t p) {
  size_t lo = 0, hi = s->nallocs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->allocs[mid].base <= p) lo = mid + 1;
    else hi = mid;
  }
  return (ptrdiff_t)lo - 1;
}

static int table_insert(cu_backend *s, uintptr_t base, size_t bytes) {
  if (s->nallocs == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    cu_alloc *n = realloc(s->allocs, cap * sizeof *n);
    if (!n) return 0;
    s->allocs = n;
    s->cap = cap;
  }
  size_t at = (size_t)(index_le(s, base) + 1);
  memmove(s->allocs + at + 1, s->allocs + at, (s->nallocs - at) * sizeof *s->allocs);
  s->allocs[at] = (cu_alloc){base, bytes};
  s->nallocs++;
  return 1;
}

int cu__in_table_ex(cu_backend *s, const void *p, size_t n, int *inside) {
  uintptr_t a = (uintptr_t)p;
  pthread_mutex_lock(&s->lock);
  ptrdiff_t i = index_le(s, a);
  int in = i >= 0 && a - s->allocs[i].base < s->allocs[i].bytes;
  int ok = in && n <= s->allocs[i].bytes - (a - s->allocs[i].base);
  pthread_mutex_unlock(&s->lock);
  if (inside) *inside = in;
  return ok;
}

int cu__in_table(cu_backend *s, const void *p, size_t n) { return cu__in_table_ex(s, p, n, NULL); }

/* ---- device memory ------------------------------------------------------------------------- */
sl_status cu__alloc_device(void *be, size_t bytes, void **ptr) {
  cu_backend *s = be;
  void *p = NULL;
  size_t n = bytes ? bytes : 1; /* a zero-byte buffer still has a distinct address */
  cudaError_t e = cu__bind(s);
  pthread_mutex_lock(&s->lock);
  if (e == cudaSuccess && s->release_due) { /* cache freed memory again while allocations live */
    uint64_t keep = UINT64_MAX;
    e = cudaMemPoolSetAttribute(s->pool, cudaMemPoolAttrReleaseThreshold, &keep);
    s->release_due = 0;
  }
  pthread_mutex_unlock(&s->lock);
  if (e == cudaSuccess) e = cudaMallocFromPoolAsync(&p, n, s->pool, s->alloc_stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s->alloc_stream);
  if (e != cudaSuccess)
    return cu__fail_cuda(s, 0, "cudaMallocFromPoolAsync", e,
                         "%zu bytes of device memory (%zu live allocations); free device memory or lower --staging",
                         bytes, s->nallocs);
  pthread_mutex_lock(&s->lock);
  int ok = table_insert(s, (uintptr_t)p, n);
  pthread_mutex_unlock(&s->lock);
  if (!ok) {
    cudaFreeAsync(p, s->alloc_stream);
    cudaStreamSynchronize(s->alloc_stream);
    return cu__fail(s, 0, SL_ERR_NOMEM, "out of host memory tracking a device allocation");
  }
  *ptr = p;
  return SL_OK;
}

/* Takes PTR out of the table (lock held); false, said loudly, when it is not an allocation of
 * ours (a core bug: the memory is left alone). *LAST: the table is empty now. */
static int table_take_locked(cu_backend *s, void *ptr, const char *op, int *last) {
  ptrdiff_t i = index_le(s, (uintptr_t)ptr);
  int found = i >= 0 && s->allocs[i].base == (uintptr_t)ptr;
  if (found) {
    memmove(s->allocs + i, s->allocs + i + 1, (s->nallocs - (size_t)i - 1) * sizeof *s->allocs);
    s->nallocs--;
  } else {
    s->host->log(s->host->core, SL_LOG_ERROR, SL_GPU_NAME ":%d: %s(%p): not a device allocation of this backend",
                 s->dev, op, ptr);
  }
  *last = found && s->nallocs == 0;
  return found;
}

/* The caller guarantees no pending work uses PTR (shardload/module.h), so the free is ordered on
 * the allocation stream alone. A state's free may run on a caller's thread: its current device
 * stays (cu__enter). */
void cu__free_device(void *be, void *ptr) {
  cu_backend *s = be;
  if (!ptr) return;
  int last;
  pthread_mutex_lock(&s->lock);
  int found = table_take_locked(s, ptr, "free_device", &last);
  pthread_mutex_unlock(&s->lock);
  if (!found) return;
  cu_saved sv;
  cudaError_t e = cu__enter(s, &sv);
  if (e == cudaSuccess) e = cudaFreeAsync(ptr, s->alloc_stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s->alloc_stream);
  /* nothing is live: give the cached memory back, so the pool's peak does not outlive the load */
  if (e == cudaSuccess && last) e = cudaMemPoolTrimTo(s->pool, 0);
  cu__leave(s, &sv);
  if (e != cudaSuccess) cu__fail_cuda(s, 1, "cudaFreeAsync", e, "freeing device buffer %p", ptr);
}

/* Memory a consumer's streams may still use (shardload.h at sl_state_export): the release stream
 * waits for each consumer's event, then frees, so the pool hands the memory out again, and trim
 * gives it back to the driver, only once that work ran (a pending free counts as outstanding;
 * the pool's internal dependencies are off, so no allocation stream is made to wait for it).
 * Nothing here waits for the consumer. When every event has completed already (the usual case:
 * the consumer's work ran long ago) the frees are the synchronous ones, which also trim. Runs on
 * the releasing thread (a garbage collector's): its current device stays (cu__enter). */
sl_status cu__free_device_after(void *be, void *const *ptrs, size_t n, void *const *events, size_t nevents) {
  cu_backend *s = be;
  cu_saved sv;
  cudaError_t e = cu__enter(s, &sv);
  sl_status st = SL_OK;
  if (e != cudaSuccess) {
    st = cu__fail_cuda(s, 0, "cudaSetDevice", e, "free_device_after");
    goto out_leave;
  }
  int pending = 0;
  for (size_t i = 0; i < nevents && !pending; i++) {
    e = cudaEventQuery((cudaEvent_t)events[i]);
    if (e == cudaErrorNotReady) {
      pending = 1;
    } else if (e != cudaSuccess) { /* the consumer's work failed: the caller waits and frees instead */
      st = cu__fail_cuda(s, 0, "cudaEventQuery", e, "a consumer's event %p before freeing its memory", events[i]);
      goto out_leave;
    }
  }
  for (size_t i = 0; pending && i < nevents; i++)
    if ((e = cudaStreamWaitEvent(s->release_stream, (cudaEvent_t)events[i], 0)) != cudaSuccess) {
      /* the waits queued so far only hold the release stream back: nothing was freed */
      st = cu__fail_cuda(s, 0, "cudaStreamWaitEvent", e, "the release stream on a consumer's event %p", events[i]);
      goto out_leave;
    }
  if (!pending) {
    for (size_t i = 0; i < n; i++) cu__free_device(s, ptrs[i]);
  } else {
    for (size_t i = 0; i < n; i++) {
      pthread_mutex_lock(&s->lock);
      ptrdiff_t k = index_le(s, (uintptr_t)ptrs[i]);
      int ours = k >= 0 && s->allocs[k].base == (uintptr_t)ptrs[i];
      pthread_mutex_unlock(&s->lock);
      if (ours && (e = cudaFreeAsync(ptrs[i], s->release_stream)) != cudaSuccess) {
        if (i == 0) { /* nothing freed: the caller keeps buffers and events, and waits instead */
          st = cu__fail_cuda(s, 0, "cudaFreeAsync", e, "device buffer %p behind its consumers; nothing freed", ptrs[i]);
          goto out_leave;
        }
        /* some are queued already (the context failed meanwhile): the rest stay in the table,
         * which fini frees, and the failure is said, not hidden */
        cu__fail_cuda(s, 0, "cudaFreeAsync", e, "device buffer %p behind its consumers; it and %zu more stay "
                      "allocated until the backend's fini", ptrs[i], n - i - 1);
        break;
      }
      int last; /* not ours: said loudly there (a core bug), the memory left alone */
      pthread_mutex_lock(&s->lock);
      int found = table_take_locked(s, ptrs[i], "free_device_after", &last);
      pthread_mutex_unlock(&s->lock);
      if (found && last) {
        /* nothing live: let the pool give the memory back at the next synchronize after the frees ran */
        uint64_t release_all = 0;
        pthread_mutex_lock(&s->lock);
        if (cudaMemPoolSetAttribute(s->pool, cudaMemPoolAttrReleaseThreshold, &release_all) == cudaSuccess)
          s->release_due = 1;
        pthread_mutex_unlock(&s->lock);
      }
    }
  }
  /* the waits captured the records: destroying an event with a record pending is allowed, the
   * driver releases it once it completes */
  for (size_t i = 0; i < nevents; i++) cudaEventDestroy((cudaEvent_t)events[i]);
out_leave:
  cu__leave(s, &sv);
  return st;
}

/* ---- pinned and registered host memory ----------------------------------------------------- */
/* Room for one more in the deferred list (lock held); 0, the list unchanged, without memory. */
static int grow_deferred_locked(cu_backend *s) {
  size_t cap = s->dcap ? 2 * s->dcap : 16;
  void **n = realloc(s->deferred, cap * sizeof *n);
  if (!n) return 0;
  s->deferred = n;
  s->dcap = cap;
  return 1;
}

sl_status cu__alloc_pinned(void *be, size_t bytes, void **ptr) {
  cu_backend *s = be;
  void *p = NULL;
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
  if (e != cudaSuccess)
    return cu__fail_cuda(s, 0, "cudaHostAlloc", e, "%zu bytes of pinned host memory; lower --staging or raise the "
                                                   "locked-memory limit (ulimit -l)", bytes);
  *ptr = p;
  return SL_OK;
}

/* cudaFreeHost synchronises the whole device: behind a kernel that never ends (a collective
 * whose peer died and whose abort did not end it) it would never return, and behind a load that
 * another thread runs meanwhile it would wait for that load. A state's pinned tensors are freed
 * on whichever thread lets the state go, which must not block (shardload.h at
 * sl_state_export), nor fail anybody else's work. So the buffer is freed at once only when
 * every stream of the backend is idle now (one look under the lock, no wait: at once after the
 * core's synchronize), else deferred: freed at the next quiet point (a later pinned free, the
 * end of a synchronize, fini), and at fini left to the process's exit if the device is still
 * busy (a stuck kernel), with a warning. Nothing is latched: a busy device is no failure. */
static void free_host_now(cu_backend *s, void *ptr) {
  cudaError_t e = cudaFreeHost(ptr);
  if (e != cudaSuccess) cu__fail_cuda(s, 0, "cudaFreeHost", e, "freeing pinned buffer %p", ptr);
}

/* Takes the deferred list when the device is quiet now (lock held); NULL when not, or empty. */
static void **take_deferred_locked(cu_backend *s, size_t *n) {
  *n = 0;
  if (!s->ndeferred || !cu__quiet_locked(s)) return NULL;
  void **list = s->deferred;
  *n = s->ndeferred;
  s->deferred = NULL;
  s->ndeferred = s->dcap = 0;
  return list;
}

void cu__free_deferred(cu_backend *s, int at_fini) {
  size_t n;
  cu_saved sv;
  if (cu__enter(s, &sv) != cudaSuccess) goto out_leave;
  pthread_mutex_lock(&s->lock);
  void **list = take_deferred_locked(s, &n);
  size_t left = s->ndeferred;
  pthread_mutex_unlock(&s->lock);
  for (size_t i = 0; i < n; i++) free_host_now(s, list[i]);
  free(list);
  if (at_fini && left)
    s->host->log(s->host->core, SL_LOG_WARN,
                 SL_GPU_NAME ":%d (local rank %d): %zu pinned buffer(s) not freed: work queued on the device has not "
                 "completed (a stuck kernel) and the pinned free would wait for it without bound; left to the "
                 "process's exit (leaked)", s->dev, s->local_rank, left);
out_leave:
  cu__leave(s, &sv);
}

void cu__free_pinned(void *be, void *ptr) {
  cu_backend *s = be;
  if (!ptr) return;
  cu_saved sv;
  cudaError_t e = cu__enter(s, &sv);
  if (e != cudaSuccess) {
    cu__fail_cuda(s, 0, "cudaSetDevice", e, "freeing pinned buffer %p", ptr);
    goto out_leave;
  }
  size_t n = 0;
  void **list = NULL;
  int now = 0;
  pthread_mutex_lock(&s->lock);
  if (cu__quiet_locked(s)) {
    now = 1;
    list = take_deferred_locked(s, &n);
  } else if (s->ndeferred < s->dcap || grow_deferred_locked(s)) {
    s->deferred[s->ndeferred++] = ptr;
  } else {
    now = -1; /* no memory to remember it: leaked, said below */
  }
  pthread_mutex_unlock(&s->lock);
  if (now == 1) {
    for (size_t i = 0; i < n; i++) free_host_now(s, list[i]);
    free(list);
    free_host_now(s, ptr);
  } else if (now < 0) {
    s->host->log(s->host->core, SL_LOG_WARN, SL_GPU_NAME ":%d (local rank %d): pinned buffer %p is not freed: the device "
                 "is busy and there is no host memory to defer its free; leaked", s->dev, s->local_rank, ptr);
  }
out_leave:
  cu__leave(s, &sv);
}

sl_status cu__register_host(void *be, void *ptr, size_t bytes) {
  cu_backend *s = be;
  if (!ptr || !bytes || (uintptr_t)ptr + bytes < (uintptr_t)ptr)
    return cu__fail(s, 0, SL_ERR_INVALID, "register_host(%p, %zu bytes): not a host range (NULL, empty or wrapping)",
                    ptr, bytes);
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
  if (e != cudaSuccess)
    return cu__fail_cuda(s, 0, "cudaHostRegister", e, "page-locking %zu bytes at %p (already registered, or over the "
                                                      "locked-memory limit: ulimit -l)", bytes, ptr);
  return SL_OK;
}

/* A state's free may run on a caller's thread: its current device stays (cu__enter). */
void cu__unregister_host(void *be, void *ptr) {
  cu_backend *s = be;
  if (!ptr) return;
  cu_saved sv;
  cudaError_t e = cu__enter(s, &sv);
  if (e == cudaSuccess) e = cudaHostUnregister(ptr);
  cu__leave(s, &sv);
  if (e != cudaSuccess) cu__fail_cuda(s, 0, "cudaHostUnregister", e, "%p was not registered with register_host", ptr);
}

/* Device memory of this device: the table first (the module's own buffers); a foreign pointer
 * (a caller's device buffer) counts when the driver says its first byte is device memory of
 * this device and its last byte is too: inside one allocation, or across the physical chunks
 * PyTorch's expandable segments map into one contiguous range. */
int cu__is_device_ptr(void *be, const void *ptr, size_t bytes) {
  cu_backend *s = be;
  if (!ptr) return 0;
  int inside = 0;
  if (cu__in_table_ex(s, ptr, bytes, &inside)) return 1;
  /* one of ours, overrunning it: the driver's answer would be the pool's whole reservation */
  if (inside) return 0;
  struct cudaPointerAttributes a;
  if (cu__bind(s) != cudaSuccess || cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    (void)cudaGetLastError(); /* not an error of the load: clear it */
    return 0;
  }
  if (SL_PTR_ATTR_TYPE(a) != cudaMemoryTypeDevice || a.device != s->dev || !s->get_range) return 0;
  unsigned long long base = 0;
  size_t size = 0;
  if (s->get_range(&base, &size, (unsigned long long)(uintptr_t)ptr) != 0) return 0;
  uintptr_t off = (uintptr_t)ptr - (uintptr_t)base;
  if (off < size && bytes <= size - off) return 1;
  /* the range runs past this allocation: device memory of this device at its last byte too */
  if (bytes == 0 || (uintptr_t)ptr + (bytes - 1) < (uintptr_t)ptr) return 0;
  struct cudaPointerAttributes b;
  if (cudaPointerGetAttributes(&b, (const char *)ptr + (bytes - 1)) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return SL_PTR_ATTR_TYPE(b) == cudaMemoryTypeDevice && b.device == s->dev;
}
