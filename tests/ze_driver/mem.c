/* Memory: device, host and shared allocations (all host memory underneath), their registry
 * (zeMemGetAllocProperties, zeMemGetAddressRange), and host-pointer import (the zex extension). */
#define _GNU_SOURCE
#include "zedrv.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Index of the first allocation whose base is > ptr; zd.lock held. */
static size_t upper_bound(const void *ptr) {
  size_t lo = 0, hi = zd.nallocs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if ((const char *)zd.allocs[mid].base <= (const char *)ptr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

const zedrv_alloc *zedrv_alloc_find(const void *ptr) {
  size_t i = upper_bound(ptr);
  if (i == 0) return NULL;
  const zedrv_alloc *a = &zd.allocs[i - 1];
  /* a zero-size import still names its base */
  if ((const char *)ptr < a->base + (a->size ? a->size : 1)) return a;
  return NULL;
}

static ze_result_t registry_add(char *base, size_t size, ze_memory_type_t type, ze_context_handle_t ctx) {
  if (zd.nallocs == zd.cap_allocs) {
    size_t cap = zd.cap_allocs ? zd.cap_allocs * 2 : 64;
    zedrv_alloc *n = realloc(zd.allocs, cap * sizeof *n);
    if (!n) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    zd.allocs = n;
    zd.cap_allocs = cap;
  }
  size_t i = upper_bound(base);
  memmove(&zd.allocs[i + 1], &zd.allocs[i], (zd.nallocs - i) * sizeof *zd.allocs);
  zd.allocs[i] = (zedrv_alloc){.base = base, .size = size, .type = type, .ctx = ctx, .id = ++zd.next_alloc_id};
  zd.nallocs++;
  return ZE_RESULT_SUCCESS;
}

static void registry_remove(const zedrv_alloc *a) {
  size_t i = (size_t)(a - zd.allocs);
  memmove(&zd.allocs[i], &zd.allocs[i + 1], (zd.nallocs - i - 1) * sizeof *zd.allocs);
  zd.nallocs--;
}

/* The relaxed-limit descriptor in an allocation's pNext chain lifts maxMemAllocSize, where the
 * driver offers the extension (a driver without it ignores a structure it does not know). */
static bool relaxed_max_size(const void *pnext) {
  if (zd.no_relaxed) return false;
  for (const ze_base_desc_t *d = pnext; d; d = d->pNext)
    if (d->stype == ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC &&
        (((const ze_relaxed_allocation_limits_exp_desc_t *)d)->flags & ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE))
      return true;
  return false;
}

/* Strict mode: a device allocation of its own pages, PROT_NONE but for the pattern written
 * first; the aligned start is returned, the mapping recorded by the caller. */
static char *strict_map(size_t size, size_t align, void **map_base, size_t *map_len) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t len = (size + page - 1) / page * page + (align > page ? align : 0);
  void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return NULL;
  char *p = (char *)(((uintptr_t)m + align - 1) / align * align);
  memset(m, 0xa5, len);
  if (mprotect(m, len, PROT_NONE) != 0) {
    munmap(m, len);
    return NULL;
  }
  *map_base = m;
  *map_len = len;
  return p;
}

static void set_protection(const zedrv_alloc *a, int prot) {
  if (mprotect(a->map_base, a->map_len, prot) != 0) {
    zedrv_misuse("mprotect of a strict device allocation failed (too many mappings? raise "
                 "vm.max_map_count or run without ZEDRV_STRICT)");
    abort(); /* a command would run on memory it cannot touch */
  }
}

void *zedrv_alloc_open(const void *ptr) {
  zedrv_alloc *a = (zedrv_alloc *)zedrv_alloc_find(ptr);
  if (!a || !a->map_base) return NULL;
  if (a->opens++ == 0) set_protection(a, PROT_READ | PROT_WRITE);
  return a->base;
}

void zedrv_alloc_close(void *base) {
  zedrv_alloc *a = (zedrv_alloc *)zedrv_alloc_find(base);
  if (!a || !a->map_base || a->base != base) return; /* freed while a command ran: misuse, counted by zeMemFree */
  if (--a->opens == 0) set_protection(a, PROT_NONE);
}

static ze_result_t alloc_common(ze_context_handle_t ctx, ze_device_handle_t dev, size_t size, size_t alignment,
                                ze_memory_type_t type, bool relaxed, void **out) {
  if (!ctx || ctx->magic != ZEDRV_MAGIC_LIVE) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!out) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (size == 0) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  if (alignment & (alignment - 1)) return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
  if (size > zd.max_alloc && !relaxed) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  size_t align = alignment > 64 ? alignment : 64;
  size_t rounded = (size + align - 1) / align * align;
  ze_result_t r = ZE_RESULT_SUCCESS;
  pthread_mutex_lock(&zd.lock);
  if (zd.device_lost) {
    r = ZE_RESULT_ERROR_DEVICE_LOST;
    goto out_unlock;
  }
  if (type == ZE_MEMORY_TYPE_DEVICE && zd.used + rounded > zd.memory) {
    r = ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
    goto out_unlock;
  }
  /* Fresh device memory is not zeroed on a real device either: a pattern makes a read of
     * memory nobody wrote visible in a test. */
  void *map_base = NULL;
  size_t map_len = 0;
  char *p;
  if (type == ZE_MEMORY_TYPE_DEVICE && zd.strict) {
    p = strict_map(size, align, &map_base, &map_len);
  } else {
    p = aligned_alloc(align, rounded);
    if (p) memset(p, 0xa5, rounded);
  }
  if (!p) {
    r = ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    goto out_unlock;
  }
  r = registry_add(p, size, type, ctx);
  if (r != ZE_RESULT_SUCCESS) {
    if (map_base)
      munmap(map_base, map_len);
    else
      free(p);
    goto out_unlock;
  }
  zedrv_alloc *a = (zedrv_alloc *)zedrv_alloc_find(p);
  a->map_base = map_base;
  a->device = dev;
  a->map_len = map_len;
  if (type == ZE_MEMORY_TYPE_DEVICE) {
    a->charged = rounded;
    zd.used += rounded;
  }
  ctx->live_objects++;
  *out = p;
out_unlock:
  pthread_mutex_unlock(&zd.lock);
  return r;
}

static ze_result_t ZE_APICALL mem_alloc_device(ze_context_handle_t ctx, const ze_device_mem_alloc_desc_t *desc,
                                               size_t size, size_t alignment, ze_device_handle_t dev, void **out) {
  if (!zedrv_is_device(dev)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  return alloc_common(ctx, dev, size, alignment, ZE_MEMORY_TYPE_DEVICE, relaxed_max_size(desc->pNext), out);
}

static ze_result_t ZE_APICALL mem_alloc_host(ze_context_handle_t ctx, const ze_host_mem_alloc_desc_t *desc, size_t size,
                                             size_t alignment, void **out) {
  return alloc_common(ctx, NULL, size, alignment, ZE_MEMORY_TYPE_HOST, relaxed_max_size(desc->pNext), out);
}

static ze_result_t ZE_APICALL mem_alloc_shared(ze_context_handle_t ctx, const ze_device_mem_alloc_desc_t *ddesc,
                                               const ze_host_mem_alloc_desc_t *hdesc, size_t size, size_t alignment,
                                               ze_device_handle_t dev, void **out) {
  if (dev && !zedrv_is_device(dev)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  return alloc_common(ctx, dev, size, alignment, ZE_MEMORY_TYPE_SHARED, relaxed_max_size(ddesc->pNext), out);
}

static ze_result_t ZE_APICALL mem_free(ze_context_handle_t ctx, void *ptr) {
  ze_result_t r = ZE_RESULT_SUCCESS;
  pthread_mutex_lock(&zd.lock);
  const zedrv_alloc *a = zedrv_alloc_find(ptr);
  if (!a || a->base != ptr || a->type == ZE_MEMORY_TYPE_UNKNOWN) {
    r = ZE_RESULT_ERROR_INVALID_ARGUMENT;
    goto out_unlock;
  }
  if (a->ctx != ctx) {
    zedrv_misuse("zeMemFree(%p): allocated in another context", ptr);
    r = ZE_RESULT_ERROR_INVALID_ARGUMENT;
    goto out_unlock;
  }
  if (a->opens > 0) zedrv_misuse("zeMemFree(%p): a running command still uses the allocation", ptr);
  zd.used -= a->charged;
  ctx->live_objects--;
  void *map_base = a->map_base;
  size_t map_len = a->map_len;
  registry_remove(a);
  if (map_base)
    munmap(map_base, map_len);
  else
    free(ptr);
out_unlock:
  pthread_mutex_unlock(&zd.lock);
  return r;
}

static ze_result_t ZE_APICALL mem_get_alloc_properties(ze_context_handle_t ctx, const void *ptr,
                                                       ze_memory_allocation_properties_t *p, ze_device_handle_t *dev) {
  pthread_mutex_lock(&zd.lock);
  const zedrv_alloc *a = zedrv_alloc_find(ptr);
  /* an imported host range is not a USM allocation: the real driver reports it unknown too */
  if (a && a->type != ZE_MEMORY_TYPE_UNKNOWN) {
    p->type = a->type;
    p->id = a->id;
    p->pageSize = 4096;
    if (dev) *dev = a->device;
  } else {
    p->type = ZE_MEMORY_TYPE_UNKNOWN;
    p->id = 0;
    p->pageSize = 0;
    if (dev) *dev = NULL;
  }
  pthread_mutex_unlock(&zd.lock);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL mem_get_address_range(ze_context_handle_t ctx, const void *ptr, void **base,
                                                    size_t *size) {
  ze_result_t r = ZE_RESULT_SUCCESS;
  pthread_mutex_lock(&zd.lock);
  const zedrv_alloc *a = zedrv_alloc_find(ptr);
  if (!a || a->type == ZE_MEMORY_TYPE_UNKNOWN) {
    r = ZE_RESULT_ERROR_UNKNOWN; /* what the Intel runtime answers for a pointer it does not know */
  } else {
    if (base) *base = a->base;
    if (size) *size = a->size;
  }
  pthread_mutex_unlock(&zd.lock);
  return r;
}

ze_result_t zedrv_fill_mem(ze_mem_dditable_t *t) {
  t->pfnAllocShared = mem_alloc_shared;
  t->pfnAllocDevice = mem_alloc_device;
  t->pfnAllocHost = mem_alloc_host;
  t->pfnFree = mem_free;
  t->pfnGetAllocProperties = mem_get_alloc_properties;
  t->pfnGetAddressRange = mem_get_address_range;
  return ZE_RESULT_SUCCESS;
}

/* ---- host-pointer import (Intel's zex extension, reached by name) ------------------------ */

ze_result_t ZE_APICALL zedrv_import_external_pointer(ze_driver_handle_t d, void *ptr, size_t size) {
  if (d != &zd.driver) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!ptr || size == 0) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  ze_result_t r;
  pthread_mutex_lock(&zd.lock);
  /* an overlap with a USM allocation or another import is refused, as by the real driver */
  const zedrv_alloc *a = zedrv_alloc_find(ptr);
  size_t next = upper_bound(ptr);
  if (a || (next < zd.nallocs && zd.allocs[next].base < (char *)ptr + size))
    r = ZE_RESULT_ERROR_INVALID_ARGUMENT;
  else
    r = registry_add(ptr, size, ZE_MEMORY_TYPE_UNKNOWN, NULL);
  pthread_mutex_unlock(&zd.lock);
  return r;
}

ze_result_t ZE_APICALL zedrv_release_imported_pointer(ze_driver_handle_t d, void *ptr) {
  ze_result_t r = ZE_RESULT_SUCCESS;
  pthread_mutex_lock(&zd.lock);
  const zedrv_alloc *a = zedrv_alloc_find(ptr);
  if (!a || a->type != ZE_MEMORY_TYPE_UNKNOWN || a->base != ptr)
    r = ZE_RESULT_ERROR_INVALID_ARGUMENT;
  else
    registry_remove(a);
  pthread_mutex_unlock(&zd.lock);
  return r;
}

ze_result_t ZE_APICALL zedrv_get_host_pointer_base_address(ze_driver_handle_t d, void *ptr, void **base) {
  ze_result_t r = ZE_RESULT_SUCCESS;
  pthread_mutex_lock(&zd.lock);
  const zedrv_alloc *a = zedrv_alloc_find(ptr);
  if (!a || a->type != ZE_MEMORY_TYPE_UNKNOWN)
    r = ZE_RESULT_ERROR_INVALID_ARGUMENT;
  else if (base)
    *base = a->base;
  pthread_mutex_unlock(&zd.lock);
  return r;
}
