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

/* The caller guarantees no pending work uses PTR (shardload/module.h), so the free is ordered on
 * the allocation stream alone. */
void cu__free_device(void *be, void *ptr) {
  cu_backend *s = be;
  if (!ptr) return;
  pthread_mutex_lock(&s->lock);
  ptrdiff_t i = index_le(s, (uintptr_t)ptr);
  int found = i >= 0 && s->allocs[i].base == (uintptr_t)ptr;
  if (found) {
    memmove(s->allocs + i, s->allocs + i + 1, (s->nallocs - (size_t)i - 1) * sizeof *s->allocs);
    s->nallocs--;
  }
  int last = found && s->nallocs == 0;
  pthread_mutex_unlock(&s->lock);
  if (!found) {
    /* a core bug; free returns nothing, so say it loudly and leave the memory alone */
    s->host->log(s->host->core, SL_LOG_ERROR, "cuda:%d: free_device(%p): not a device allocation of this backend",
                 s->dev, ptr);
    return;
  }
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = cudaFreeAsync(ptr, s->alloc_stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s->alloc_stream);
  /* nothing is live: give the cached memory back, so the pool's peak does not outlive the load */
  if (e == cudaSuccess && last) e = cudaMemPoolTrimTo(s->pool, 0);
  if (e != cudaSuccess) cu__fail_cuda(s, 1, "cudaFreeAsync", e, "freeing device buffer %p", ptr);
}

/* ---- pinned and registered host memory ----------------------------------------------------- */
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
 * whose peer died and whose abort did not end it) it would never return. So the buffer is
 * freed only once the backend's streams are quiet (cu__quiet: at once after the core's
 * synchronize), and otherwise left to the process's exit, with a warning: at teardown a
 * leaked staging buffer is better than a hung job. */
void cu__free_pinned(void *be, void *ptr) {
  cu_backend *s = be;
  if (!ptr) return;
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess && !cu__quiet(s, "free_pinned")) {
    s->host->log(s->host->core, SL_LOG_WARN,
                 "cuda:%d (local rank %d): pinned buffer %p is not freed: work queued on the device has not "
                 "completed (a stuck kernel) and cudaFreeHost would wait for it without bound; it is left to the "
                 "process's exit (leaked)", s->dev, s->local_rank, ptr);
    return;
  }
  if (e == cudaSuccess) e = cudaFreeHost(ptr);
  if (e != cudaSuccess) cu__fail_cuda(s, 1, "cudaFreeHost", e, "freeing pinned buffer %p", ptr);
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

void cu__unregister_host(void *be, void *ptr) {
  cu_backend *s = be;
  if (!ptr) return;
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = cudaHostUnregister(ptr);
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
  if (a.type != cudaMemoryTypeDevice || a.device != s->dev || !s->get_range) return 0;
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
  return b.type == cudaMemoryTypeDevice && b.device == s->dev;
}
