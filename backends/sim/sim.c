/* A simulated accelerator in host memory, so CPU-only machines can prove device placement.
 *
 * Every buffer it hands out is tagged (device or pinned host) in a table; copies check that
 * their device side is a live device buffer and their host side is not, and count the bytes
 * moved each way. In strict mode ("sim:strict") device memory is mmap'd PROT_NONE and opened
 * only inside the backend's own calls, so a core that touched device memory directly would
 * crash instead of passing. This is a test instrument, never a stand-in for a real backend. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

typedef struct sim_buf {
  unsigned char *base;
  size_t bytes;   /* as asked */
  size_t mapped;  /* page-rounded, strict mode */
  sl__sim_kind kind;
} sim_buf;

typedef struct sim_backend {
  const sl_module_host *host;
  int strict;
  int device_index;
  pthread_mutex_t lock;
  sim_buf *bufs;
  size_t nbufs, cap;
  uint64_t h2d, d2h, d2d;
} sim_backend;

static int sim_score(void) { return 0; /* never chosen by "auto": it only simulates */ }

static sl_status sim_init(const sl_backend_init *init, void **be) {
  sim_backend *s = calloc(1, sizeof *s);
  if (!s) return SL_ERR_NOMEM;
  s->host = init->host;
  s->device_index = init->local_rank < 0 ? 0 : init->local_rank;
  if (init->variant && strcmp(init->variant, "strict") == 0) {
    s->strict = 1;
  } else if (init->variant && *init->variant) {
    free(s);
    return init->host->fail(init->host->core, SL_ERR_INVALID,
                            "sim backend: unknown variant '%s'; use sim or sim:strict", init->variant);
  }
  pthread_mutex_init(&s->lock, NULL);
  *be = s;
  return SL_OK;
}

static void sim_fini(void *be) {
  sim_backend *s = be;
  /* Buffers still live here are leaks of the caller; release them so tools see the real ones. */
  for (size_t i = 0; i < s->nbufs; i++) {
    if (s->bufs[i].mapped) munmap(s->bufs[i].base, s->bufs[i].mapped);
    else free(s->bufs[i].base);
  }
  free(s->bufs);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

static void sim_describe(void *be, char *buf, size_t len) {
  sim_backend *s = be;
  snprintf(buf, len, "sim:%d (simulated accelerator%s)", s->device_index, s->strict ? ", strict" : "");
}

/* Index of the buffer containing [p, p+n), or -1. Called with the lock held. */
static ssize_t find_buf(sim_backend *s, const void *p, size_t n) {
  const unsigned char *c = p;
  for (size_t i = 0; i < s->nbufs; i++) {
    if (c >= s->bufs[i].base && c + n <= s->bufs[i].base + (s->bufs[i].bytes ? s->bufs[i].bytes : 1))
      return (ssize_t)i;
  }
  return -1;
}

sl__sim_kind sl__sim_query(void *be, const void *ptr) {
  sim_backend *s = be;
  pthread_mutex_lock(&s->lock);
  ssize_t i = find_buf(s, ptr, 0);
  sl__sim_kind k = i < 0 ? SL__SIM_NONE : s->bufs[i].kind;
  pthread_mutex_unlock(&s->lock);
  return k;
}

static sl_status track(sim_backend *s, unsigned char *base, size_t bytes, size_t mapped, sl__sim_kind kind) {
  pthread_mutex_lock(&s->lock);
  if (s->nbufs == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    sim_buf *nb = realloc(s->bufs, cap * sizeof *nb);
    if (!nb) {
      pthread_mutex_unlock(&s->lock);
      return SL_ERR_NOMEM;
    }
    s->bufs = nb;
    s->cap = cap;
  }
  s->bufs[s->nbufs++] = (sim_buf){base, bytes, mapped, kind};
  pthread_mutex_unlock(&s->lock);
  return SL_OK;
}

static sl_status sim_alloc_device(void *be, size_t bytes, void **ptr) {
  sim_backend *s = be;
  unsigned char *p;
  size_t mapped = 0;
  if (s->strict) {
    long page = sysconf(_SC_PAGESIZE);
    mapped = ((bytes ? bytes : 1) + (size_t)page - 1) / (size_t)page * (size_t)page;
    p = mmap(NULL, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) p = NULL;
  } else {
    void *q = NULL;
    p = posix_memalign(&q, 256, bytes ? bytes : 1) == 0 ? q : NULL;
  }
  if (!p) return s->host->fail(s->host->core, SL_ERR_NOMEM, "sim:%d: out of device memory (%zu bytes)", s->device_index, bytes);
  if (track(s, p, bytes, mapped, SL__SIM_DEVICE) != SL_OK) {
    if (mapped) munmap(p, mapped);
    else free(p);
    return SL_ERR_NOMEM;
  }
  *ptr = p;
  return SL_OK;
}

static sl_status sim_alloc_pinned(void *be, size_t bytes, void **ptr) {
  sim_backend *s = be;
  void *p = NULL;
  if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0)
    return s->host->fail(s->host->core, SL_ERR_NOMEM, "sim:%d: cannot allocate %zu bytes of pinned host memory",
                         s->device_index, bytes);
  if (track(s, p, bytes, 0, SL__SIM_PINNED) != SL_OK) {
    free(p);
    return SL_ERR_NOMEM;
  }
  *ptr = p;
  return SL_OK;
}

static void untrack_free(sim_backend *s, void *ptr, sl__sim_kind kind) {
  if (!ptr) return;
  pthread_mutex_lock(&s->lock);
  for (size_t i = 0; i < s->nbufs; i++) {
    if (s->bufs[i].base == ptr && s->bufs[i].kind == kind) {
      sim_buf b = s->bufs[i];
      s->bufs[i] = s->bufs[--s->nbufs];
      pthread_mutex_unlock(&s->lock);
      if (b.mapped) munmap(b.base, b.mapped);
      else free(b.base);
      return;
    }
  }
  pthread_mutex_unlock(&s->lock);
  /* Freeing something we never handed out is a core bug; crash loudly in a test instrument. */
  abort();
}

static void sim_free_device(void *be, void *ptr) { untrack_free(be, ptr, SL__SIM_DEVICE); }
static void sim_free_pinned(void *be, void *ptr) { untrack_free(be, ptr, SL__SIM_PINNED); }

/* Opens (prot = PROT_READ|PROT_WRITE) or closes (PROT_NONE) the device buffer holding p. */
static void set_access(sim_backend *s, const void *p, int prot) {
  if (!s->strict) return;
  pthread_mutex_lock(&s->lock);
  ssize_t i = find_buf(s, p, 0);
  if (i >= 0) mprotect(s->bufs[i].base, s->bufs[i].mapped, prot);
  pthread_mutex_unlock(&s->lock);
}

static sl_status check_side(sim_backend *s, const void *p, size_t n, int want_device, const char *what) {
  pthread_mutex_lock(&s->lock);
  ssize_t i = find_buf(s, p, n);
  int is_device = i >= 0 && s->bufs[i].kind == SL__SIM_DEVICE;
  pthread_mutex_unlock(&s->lock);
  if (want_device && !is_device)
    return s->host->fail(s->host->core, SL_ERR_BACKEND,
                         "sim:%d: %s %p (+%zu bytes) is not inside a device buffer of this backend",
                         s->device_index, what, p, n);
  if (!want_device && is_device)
    return s->host->fail(s->host->core, SL_ERR_BACKEND, "sim:%d: %s %p is device memory, host memory expected",
                         s->device_index, what, p);
  return SL_OK;
}

static sl_status sim_h2d(void *be, void *dst, const void *src, size_t bytes) {
  sim_backend *s = be;
  sl_status st;
  if (!bytes) return SL_OK;
  if ((st = check_side(s, dst, bytes, 1, "h2d destination")) != SL_OK) return st;
  if ((st = check_side(s, src, bytes, 0, "h2d source")) != SL_OK) return st;
  set_access(s, dst, PROT_READ | PROT_WRITE);
  memcpy(dst, src, bytes);
  set_access(s, dst, PROT_NONE);
  __atomic_add_fetch(&s->h2d, bytes, __ATOMIC_RELAXED);
  return SL_OK;
}

static sl_status sim_d2h(void *be, void *dst, const void *src, size_t bytes) {
  sim_backend *s = be;
  sl_status st;
  if (!bytes) return SL_OK;
  if ((st = check_side(s, src, bytes, 1, "d2h source")) != SL_OK) return st;
  if ((st = check_side(s, dst, bytes, 0, "d2h destination")) != SL_OK) return st;
  set_access(s, src, PROT_READ);
  memcpy(dst, src, bytes);
  set_access(s, src, PROT_NONE);
  __atomic_add_fetch(&s->d2h, bytes, __ATOMIC_RELAXED);
  return SL_OK;
}

static sl_status sim_d2d(void *be, void *dst, const void *src, size_t bytes) {
  sim_backend *s = be;
  sl_status st;
  if (!bytes) return SL_OK;
  if ((st = check_side(s, src, bytes, 1, "d2d source")) != SL_OK) return st;
  if ((st = check_side(s, dst, bytes, 1, "d2d destination")) != SL_OK) return st;
  set_access(s, src, PROT_READ | PROT_WRITE);
  set_access(s, dst, PROT_READ | PROT_WRITE);
  memmove(dst, src, bytes);
  set_access(s, src, PROT_NONE);
  set_access(s, dst, PROT_NONE);
  __atomic_add_fetch(&s->d2d, bytes, __ATOMIC_RELAXED);
  return SL_OK;
}

static sl_status sim_sync(void *be) { return SL_OK; }

static sl_status sim_cast(void *be, void *dst, sl_dtype dst_dt, const void *src, sl_dtype src_dt,
                          size_t count) {
  sim_backend *s = be;
  sl_status st;
  if (!count) return SL_OK;
  if ((st = check_side(s, src, count * sl_dtype_size(src_dt), 1, "cast source")) != SL_OK) return st;
  if ((st = check_side(s, dst, count * sl_dtype_size(dst_dt), 1, "cast destination")) != SL_OK) return st;
  set_access(s, src, PROT_READ | PROT_WRITE);
  set_access(s, dst, PROT_READ | PROT_WRITE);
  st = sl_convert(dst, dst_dt, src, src_dt, count);
  set_access(s, src, PROT_NONE);
  set_access(s, dst, PROT_NONE);
  return st;
}

static sl_status sim_sgd(void *be, void *x, const void *g, sl_dtype dt, size_t count, float lr) {
  sim_backend *s = be;
  sl_status st;
  if (!count) return SL_OK;
  if ((st = check_side(s, x, count * sl_dtype_size(dt), 1, "sgd parameter")) != SL_OK) return st;
  if ((st = check_side(s, g, count * sl_dtype_size(dt), 1, "sgd gradient")) != SL_OK) return st;
  set_access(s, x, PROT_READ | PROT_WRITE);
  set_access(s, g, PROT_READ | PROT_WRITE);
  st = sl__host_sgd_step(x, g, dt, count, lr);
  set_access(s, x, PROT_NONE);
  set_access(s, g, PROT_NONE);
  return st;
}

static int sim_is_device_ptr(void *be, const void *ptr, size_t bytes) {
  sim_backend *s = be;
  pthread_mutex_lock(&s->lock);
  ssize_t i = find_buf(s, ptr, bytes);
  int ok = i >= 0 && s->bufs[i].kind == SL__SIM_DEVICE;
  pthread_mutex_unlock(&s->lock);
  return ok;
}

static void sim_traffic(void *be, uint64_t *h2d, uint64_t *d2h) {
  sim_backend *s = be;
  *h2d = __atomic_load_n(&s->h2d, __ATOMIC_RELAXED);
  *d2h = __atomic_load_n(&s->d2h, __ATOMIC_RELAXED);
}

static const sl_backend_ops sim_ops = {
    .abi_version = SL_BACKEND_ABI_VERSION,
    .size = sizeof(sl_backend_ops),
    .name = "sim",
    .flags = SL_BACKEND_HAS_PINNED,
    .preferred_collective = "gloo",
    .score = sim_score,
    .init = sim_init,
    .fini = sim_fini,
    .describe = sim_describe,
    .alloc_device = sim_alloc_device,
    .free_device = sim_free_device,
    .alloc_pinned = sim_alloc_pinned,
    .free_pinned = sim_free_pinned,
    .copy_h2d = sim_h2d,
    .copy_d2h = sim_d2h,
    .copy_d2d = sim_d2d,
    .synchronize = sim_sync,
    .cast_device = sim_cast,
    .sgd_step = sim_sgd,
    .is_device_ptr = sim_is_device_ptr,
    .traffic = sim_traffic,
};

const sl_backend_ops *sl__backend_sim(void) { return &sim_ops; }
