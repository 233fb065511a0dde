/* Host-memory kernels shared by backends whose memory the host addresses (cpu, sim). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

sl_status sl__host_sgd_step(void *x, const void *g, sl_dtype dt, size_t count, float lr) {
  switch (dt) {
    case SL_DTYPE_F64: {
      double *xd = x;
      const double *gd = g;
      for (size_t i = 0; i < count; i++) xd[i] -= (double)lr * gd[i];
      return SL_OK;
    }
    case SL_DTYPE_F32: {
      float *xf = x;
      const float *gf = g;
      for (size_t i = 0; i < count; i++) xf[i] -= lr * gf[i];
      return SL_OK;
    }
    case SL_DTYPE_F16:
    case SL_DTYPE_BF16: {
      /* compute in F32 and round back, as torch does for reduced-precision parameters */
      enum { BLOCK = 1024 };
      float xf[BLOCK], gf[BLOCK];
      const size_t es = sl_dtype_size(dt);
      for (size_t i = 0; i < count; i += BLOCK) {
        size_t n = count - i < BLOCK ? count - i : BLOCK;
        sl_convert(xf, SL_DTYPE_F32, (char *)x + i * es, dt, n);
        sl_convert(gf, SL_DTYPE_F32, (const char *)g + i * es, dt, n);
        for (size_t k = 0; k < n; k++) xf[k] -= lr * gf[k];
        sl_convert((char *)x + i * es, dt, xf, SL_DTYPE_F32, n);
      }
      return SL_OK;
    }
    default:
      return SL_ERR_DTYPE;
  }
}

/* ---- host memory ---------------------------------------------------------------------------
 * Shards are written once, right after allocation, so the cost of a load on a fresh process is
 * dominated by page faults: measured here ~0.7 GB/s faulting 4 KiB pages on first write, ~1.3-3
 * GB/s when the kernel populates the mapping up front (MAP_POPULATE), and 9-20 GB/s populating
 * it with transparent huge pages (one fault and one 2 MiB clear per 512 small ones), warm memcpy
 * ~15 GB/s. Large blocks are therefore mapped on their own, 2 MiB aligned, asked for huge pages
 * (MADV_HUGEPAGE: the kernel's "madvise" mode, the common default, gives them only when asked)
 * and populated before they are returned; a 64-byte header records how to release the block.
 * The mapping is the block's size rounded to pages, not to huge pages: its last partial 2 MiB
 * stays in small pages, so the resident set is what it was. Where the kernel gives no huge
 * pages (THP "never", PR_SET_THP_DISABLE, none free) the same calls give small pages. */
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#define HOST_HDR 64u
#define HOST_MAGIC_MMAP 0x534C4D4D41500001ull
#define HOST_MAGIC_HEAP 0x534C484541500001ull
#define HOST_POPULATE_MIN (1u << 20)
#define HOST_HUGE (2u << 20)
#define HOST_HUGE_MIN HOST_HUGE /* a block that can hold one whole huge page */

typedef struct host_hdr {
  uint64_t magic;
  uint64_t mapped; /* bytes mapped (mmap) or 0 */
} host_hdr;

/* A mapping of BYTES (a multiple of the page size) at a 2 MiB boundary, with huge pages where
 * the kernel gives them, populated; NULL when it cannot be had. */
static unsigned char *map_huge(size_t bytes) {
  size_t extra = HOST_HUGE;
  unsigned char *raw = mmap(NULL, bytes + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return NULL;
  unsigned char *at = (unsigned char *)(((uintptr_t)raw + HOST_HUGE - 1) & ~(uintptr_t)(HOST_HUGE - 1));
  if (at > raw) munmap(raw, (size_t)(at - raw));
  if (raw + bytes + extra > at + bytes) munmap(at + bytes, (size_t)(raw + bytes + extra - (at + bytes)));
  (void)madvise(at, bytes, MADV_HUGEPAGE); /* advice: refused where THP is off, and that is fine */
  if (madvise(at, bytes, MADV_POPULATE_WRITE) != 0) {
    if (errno == ENOMEM) { /* over a limit: fail now, as MAP_POPULATE's mmap would not */
      munmap(at, bytes);
      return NULL;
    }
    /* an older kernel (EINVAL), or a filter that refuses the advice (seccomp's EPERM): one
     * write per small page (within a huge page, after its first, a plain write) */
    long pg = sysconf(_SC_PAGESIZE);
    for (size_t off = 0; off < bytes; off += (size_t)(pg > 0 ? pg : 4096)) ((volatile unsigned char *)at)[off] = 0;
  }
  return at;
}

void *sl__host_alloc(size_t bytes) {
  size_t total;
  if (__builtin_add_overflow(bytes, (size_t)HOST_HDR, &total)) return NULL;
  unsigned char *base;
  host_hdr h;
  if (total >= HOST_HUGE_MIN) {
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = (size_t)(pg > 0 ? pg : 4096);
    if (__builtin_add_overflow(total, page - 1, &total) || total > SIZE_MAX - HOST_HUGE) return NULL;
    total &= ~(page - 1);
    if (!(base = map_huge(total))) return NULL;
    h = (host_hdr){HOST_MAGIC_MMAP, total};
  } else if (total >= HOST_POPULATE_MIN) {
    base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (base == MAP_FAILED) return NULL;
    h = (host_hdr){HOST_MAGIC_MMAP, total};
  } else {
    void *p = NULL;
    if (posix_memalign(&p, HOST_HDR, total) != 0) return NULL;
    base = p;
    h = (host_hdr){HOST_MAGIC_HEAP, 0};
  }
  memcpy(base, &h, sizeof h);
  return base + HOST_HDR;
}

#ifdef SL__HOST_ASAN
#include <sanitizer/asan_interface.h>
void sl__host_poison(void *p, size_t bytes, int on) {
  if (on) ASAN_POISON_MEMORY_REGION(p, bytes);
  else ASAN_UNPOISON_MEMORY_REGION(p, bytes);
}
#else
void sl__host_poison(void *p, size_t bytes, int on) {
  (void)p, (void)bytes, (void)on;
}
#endif

void sl__host_free(void *ptr) {
  if (!ptr) return;
  unsigned char *base = (unsigned char *)ptr - HOST_HDR;
  host_hdr h;
  memcpy(&h, base, sizeof h);
  if (h.magic == HOST_MAGIC_MMAP) munmap(base, h.mapped);
  else if (h.magic == HOST_MAGIC_HEAP) free(base);
  else abort(); /* not ours: freeing it would corrupt the heap; fail loudly */
}
