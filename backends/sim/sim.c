/* A simulated accelerator in host memory, so CPU-only machines can prove the device data path
 * (docs/DESIGN.md#modules: sim). This is a test instrument, never
 * a stand-in for a real backend.
 *
 * - Every buffer it hands out is tagged (device or pinned host; caller ranges registered with
 *   register_host are pinned but not owned) in a table sorted by address. Copies check at
 *   enqueue that their device side is a live device buffer covering the range and that their
 *   host side is not device memory, and count the bytes moved each way, pageable ones apart.
 * - It is asynchronous the way a GPU is (shardload/module.h, "The asynchronous contract"): each
 *   stream is a FIFO of tasks run by its own worker thread, after a random delay of 0..D us
 *   (SHARDLOAD_SIM_DELAY_US, default 200). A task reads its sources when it RUNS, so a core that
 *   forgets a wait or an event reads stale or torn data and the tests catch it.
 * - In strict mode ("sim:strict") device memory is mapped PROT_NONE and opened only while the
 *   backend's own work touches it (counted per buffer: several workers may open one buffer),
 *   so a core that dereferenced device memory would crash instead of passing.
 * - Failures of enqueued work are sticky in the backend and reported by the next sync on the
 *   CALLER's thread (the context's message buffer belongs to it; workers never call the host).
 * - Every wait (a stream's stream_wait_event, the caller's event_sync, stream_sync and
 *   synchronize) is bounded by the job's timeout (sl_backend_init.timeout_ms) and a grace, as
 *   module.h asks of a backend; past it the wait fails with a sticky SL_ERR_TIMEOUT that names
 *   it, and once the backend has failed the queues drain without their random delays.
 * - Freeing a buffer that queued or running work still uses is a core bug: abort() with a
 *   message, so the tests crash loudly instead of passing by luck.
 *
 * This file holds the ops table, the buffer table (tracking and tagging), allocation, strict-mode
 * host access (SL_EXT_HOST_ACCESS), the enqueue-time domain checks of copies and casts, the
 * counters, the extensions, and describe/probe/init/fini. Streams, their worker threads, the task queue,
 * events, sticky errors and synchronisation are in sim_stream.c; what both share is in
 * sim_internal.h (the locking rules are there too). */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "sim_internal.h"

#define SIM_DEFAULT_DELAY_US 200u
#define SIM_MAX_DELAY_US 10000000u
#define SIM_DEFAULT_TIMEOUT_MS 300000 /* the core's default job timeout, for a caller that gives none */

/* A core bug a test must not survive: say what and crash. */
__attribute__((noreturn, format(printf, 2, 3))) void sim__abort(sim_backend *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "shardload: sim:%d: ", s ? s->device_index : -1);
  vfprintf(stderr, fmt, ap);
  fputs(" (a bug in the caller of the backend; aborting)\n", stderr);
  va_end(ap);
  abort();
}

/* ---- the buffer table (called with the lock held) ------------------------------------------ */
static unsigned char *buf_end(const sim_buf *b) { return b->base + (b->bytes ? b->bytes : 1); }

/* Index of the last buffer whose base is <= P, or -1. */
static ssize_t buf_index_le(sim_backend *s, const void *p) {
  size_t lo = 0, hi = s->nbufs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if ((const void *)s->bufs[mid]->base <= p) lo = mid + 1;
    else hi = mid;
  }
  return (ssize_t)lo - 1;
}

/* The buffer holding all of [p, p+n), or NULL. */
static sim_buf *buf_within(sim_backend *s, const void *p, size_t n) {
  ssize_t i = buf_index_le(s, p);
  if (i < 0) return NULL;
  sim_buf *b = s->bufs[i];
  const unsigned char *c = p;
  return c < buf_end(b) && n <= (size_t)(buf_end(b) - c) ? b : NULL;
}

/* A buffer of KIND (NONE: any) overlapping [p, p+n) (n = 0 counts as one byte), or NULL. */
static sim_buf *buf_overlapping(sim_backend *s, const void *p, size_t n, sl__sim_kind kind) {
  const unsigned char *a = p, *e = a + (n ? n : 1);
  for (ssize_t i = buf_index_le(s, e - 1); i >= 0; i--) {
    sim_buf *b = s->bufs[i];
    /* buffers are sorted and disjoint: once one ends before A, all earlier ones do */
    if (buf_end(b) <= a) break;
    if (kind == SL__SIM_NONE || b->kind == kind) return b;
  }
  return NULL;
}

static sl_status buf_insert(sim_backend *s, sim_buf *b) {
  if (s->nbufs == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    sim_buf **nb = realloc(s->bufs, cap * sizeof *nb);
    if (!nb) return SL_ERR_NOMEM;
    s->bufs = nb;
    s->cap = cap;
  }
  size_t at = (size_t)(buf_index_le(s, b->base) + 1);
  memmove(s->bufs + at + 1, s->bufs + at, (s->nbufs - at) * sizeof *s->bufs);
  s->bufs[at] = b;
  s->nbufs++;
  return SL_OK;
}

static void buf_remove(sim_backend *s, sim_buf *b) {
  ssize_t i = buf_index_le(s, b->base);
  memmove(s->bufs + i, s->bufs + i + 1, (s->nbufs - (size_t)i - 1) * sizeof *s->bufs);
  s->nbufs--;
}

static void buf_release(sim_buf *b) {
  if (b->owned) {
    if (b->mapped) munmap(b->base, b->mapped);
    else free(b->base);
  }
  free(b);
}

/* Host access to a device buffer, counted (called with the lock held). Strict mode maps it
 * readable on the first open and inaccessible on the last close. */
static void buf_protect(sim_backend *s, sim_buf *b, int prot) {
  /* a failure (the kernel's map count exhausted) would surface as a baffling fault later */
  if (mprotect(b->base, b->mapped, prot) != 0)
    sim__abort(s, "mprotect of device buffer %p (%zu bytes) failed: %s (too many strict-mode buffers? "
                  "raise vm.max_map_count or use plain sim)",
               (void *)b->base, b->mapped, strerror(errno));
}
void sim__buf_open(sim_backend *s, sim_buf *b) {
  if (b->opens++ == 0 && s->strict) buf_protect(s, b, PROT_READ | PROT_WRITE);
}
void sim__buf_close(sim_backend *s, sim_buf *b) {
  if (--b->opens == 0 && s->strict) buf_protect(s, b, PROT_NONE);
}

/* ---- init, fini, describe ------------------------------------------------------------------ */
static int sim_probe(char *reason, size_t len) {
  /* never chosen by "auto": it only simulates */
  if (reason && len) snprintf(reason, len, "sim: a simulated device for tests; ask for it by name (--backend sim)");
  return 0;
}

static sl_status env_uint(const sl_backend_init *init, const char *name, unsigned dflt, unsigned max,
                          unsigned *out) {
  const char *v = getenv(name);
  *out = dflt;
  if (!v || !*v) return SL_OK;
  char *end;
  errno = 0;
  unsigned long x = strtoul(v, &end, 10);
  if (*end || errno || v[0] == '-' || x > max)
    return init->host->fail(init->host->core, SL_ERR_INVALID, "sim backend: %s='%s' is not a number from 0 to %u",
                            name, v, max);
  *out = (unsigned)x;
  return SL_OK;
}

static void sim_fini(void *be);

static sl_status sim_init(const sl_backend_init *init, void **be) {
  int strict = 0;
  if (init->variant && strcmp(init->variant, "strict") == 0)
    strict = 1;
  else if (init->variant && *init->variant)
    return init->host->fail(init->host->core, SL_ERR_INVALID,
                            "sim backend: unknown variant '%s'; use sim or sim:strict", init->variant);
  unsigned delay_us, min_delay_us;
  sl_status st;
  if ((st = env_uint(init, "SHARDLOAD_SIM_DELAY_US", SIM_DEFAULT_DELAY_US, SIM_MAX_DELAY_US, &delay_us)) != SL_OK)
    return st;
  /* a floor under the random delay: a device that is slow on every task, not only on some
   * (with a floor at the ceiling every task takes exactly that long) */
  if ((st = env_uint(init, "SHARDLOAD_SIM_MIN_DELAY_US", 0, delay_us, &min_delay_us)) != SL_OK) return st;
  sim_backend *s = calloc(1, sizeof *s);
  if (!s) return SL_ERR_NOMEM;
  s->host = init->host;
  s->strict = strict;
  s->device_index = init->device >= 0 ? init->device : init->local_rank < 0 ? 0 : init->local_rank;
  s->delay_us = delay_us;
  s->min_delay_us = min_delay_us;
  /* Every wait is bounded by the job's timeout (module.h), and a grace: a collective on the
   * stream waited for is bounded by the same timeout and names the rank it lost, so it must
   * be the one to report, not the wait behind it. */
  bool has_timeout = init->size >= offsetof(sl_backend_init, timeout_ms) + sizeof init->timeout_ms;
  s->timeout_ms = has_timeout && init->timeout_ms > 0 ? init->timeout_ms : SIM_DEFAULT_TIMEOUT_MS;
  long long wait_ms = (long long)s->timeout_ms + (s->timeout_ms / 4 > 1000 ? s->timeout_ms / 4 : 1000);
  s->wait_ms = wait_ms > INT_MAX ? INT_MAX : (int)wait_ms;
  pthread_mutex_init(&s->lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->progress, &ca);
  pthread_condattr_destroy(&ca);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  s->rng = ((uint64_t)getpid() << 32) ^ (uint64_t)now.tv_nsec ^ ((uint64_t)now.tv_sec << 20) ^ (uintptr_t)s;
  if (!s->rng) s->rng = 0x9E3779B97F4A7C15ull;
  if ((st = sim__stream_start(s, &s->def)) != SL_OK || (st = sim__stream_start(s, &s->release)) != SL_OK) {
    sim_fini(s);
    return st;
  }
  *be = s;
  return SL_OK;
}

static void sim_fini(void *be) {
  sim_backend *s = be;
  /* Streams drain their queues first (the core synchronised, but a caller may not have). */
  while (s->streams) sim__stream_stop(s, s->streams);
  while (s->events) {
    sim_event *e = s->events;
    s->events = e->next;
    e->magic = 0;
    free(e);
  }
  /* Buffers still live here are leaks of the caller; release them so tools see the real ones. */
  for (size_t i = 0; i < s->nbufs; i++) buf_release(s->bufs[i]);
  free(s->bufs);
  pthread_cond_destroy(&s->progress);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

static void sim_describe(void *be, char *buf, size_t len) {
  sim_backend *s = be;
  if (s->min_delay_us)
    snprintf(buf, len, "sim:%d (simulated accelerator, async, delay %u..%u us%s)", s->device_index, s->min_delay_us,
             s->delay_us, s->strict ? ", strict" : "");
  else
    snprintf(buf, len, "sim:%d (simulated accelerator, async, delay <= %u us%s)", s->device_index, s->delay_us,
             s->strict ? ", strict" : "");
}

static int sim_device_ordinal(void *be) { return ((sim_backend *)be)->device_index; }

/* The simulated machine has one device per ordinal, the same in every process: two ranks given
 * one --device share it, as two CUDA ranks on one GPU do, so CI sees the core's refusal. */
static void sim_device_identity(void *be, char *buf, size_t len) {
  snprintf(buf, len, "sim:%d", ((sim_backend *)be)->device_index);
}

/* ---- memory -------------------------------------------------------------------------------- */
/* Adds a buffer to the table (lock held). */
static sl_status track_locked(sim_backend *s, unsigned char *base, size_t bytes, size_t mapped, sl__sim_kind kind,
                              int owned) {
  sim_buf *b = calloc(1, sizeof *b);
  if (!b) return SL_ERR_NOMEM;
  *b = (sim_buf){.base = base, .bytes = bytes, .mapped = mapped, .kind = kind, .owned = owned};
  sl_status st = buf_insert(s, b);
  if (st != SL_OK) free(b);
  return st;
}

static sl_status track(sim_backend *s, unsigned char *base, size_t bytes, size_t mapped, sl__sim_kind kind,
                       int owned) {
  pthread_mutex_lock(&s->lock);
  sl_status st = track_locked(s, base, bytes, mapped, kind, owned);
  pthread_mutex_unlock(&s->lock);
  return st;
}

static sl_status sim_alloc_device(void *be, size_t bytes, void **ptr) {
  sim_backend *s = be;
  unsigned char *p;
  size_t mapped = 0;
  if (s->strict) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    mapped = (bytes / page + 1) * page; /* whole pages, at least one */
    p = bytes > SIZE_MAX - page ? NULL : mmap(NULL, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) p = NULL;
  } else {
    void *q = NULL;
    p = posix_memalign(&q, 256, bytes ? bytes : 1) == 0 ? q : NULL;
  }
  if (!p) return sim__fail(s, SL_ERR_NOMEM, "sim:%d: out of device memory (%zu bytes)", s->device_index, bytes);
  if (track(s, p, bytes, mapped, SL__SIM_DEVICE, 1) != SL_OK) {
    if (mapped) munmap(p, mapped);
    else free(p);
    return sim__fail(s, SL_ERR_NOMEM, "sim:%d: out of memory tracking a device buffer", s->device_index);
  }
  *ptr = p;
  return SL_OK;
}

static sl_status sim_alloc_pinned(void *be, size_t bytes, void **ptr) {
  sim_backend *s = be;
  void *p = NULL;
  if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0)
    return sim__fail(s, SL_ERR_NOMEM, "sim:%d: cannot allocate %zu bytes of pinned host memory", s->device_index,
                     bytes);
  if (track(s, p, bytes, 0, SL__SIM_PINNED, 1) != SL_OK) {
    free(p);
    return sim__fail(s, SL_ERR_NOMEM, "sim:%d: out of memory tracking a pinned buffer", s->device_index);
  }
  *ptr = p;
  return SL_OK;
}

/* Removes a buffer from the table (it must start at PTR and be of KIND and ownership OWNED)
 * and releases it; anything else is a core bug. */
static void untrack(sim_backend *s, void *ptr, sl__sim_kind kind, int owned, const char *op) {
  pthread_mutex_lock(&s->lock);
  ssize_t i = buf_index_le(s, ptr);
  sim_buf *b = i >= 0 ? s->bufs[i] : NULL;
  if (!b || b->base != ptr || b->kind != kind || b->owned != owned)
    sim__abort(s, "%s(%p): not a %s of this backend", op, ptr,
               !owned ? "registered host range" : kind == SL__SIM_DEVICE ? "device buffer" : "pinned buffer");
  if (b->refs || b->opens)
    sim__abort(s, "%s(%p) while %d queued or running task(s) still use it%s: wait for an event recorded after them "
                  "first (shardload/module.h: free only when no pending work uses it)",
               op, ptr, b->refs, b->opens ? " and it is open for host access" : "");
  buf_remove(s, b);
  pthread_mutex_unlock(&s->lock);
  buf_release(b);
}

static void sim_free_device(void *be, void *ptr) {
  if (ptr) untrack(be, ptr, SL__SIM_DEVICE, 1, "free_device");
}

/* ---- frees behind a consumer's work (free_device_after) ------------------------------------ */
typedef struct sim_release {
  sim_backend *s;
  size_t n, nevents;
  void **ptrs, **events;
} sim_release;

static void release_free(void *arg) {
  sim_release *r = arg;
  free(r->ptrs);
  free(r->events);
  free(r);
}

/* On the release stream, after the waits: a buffer that work still uses aborts in untrack, so a
 * free that did not wait for the consumer crashes the test instead of passing. The waits before
 * this task have finished, so the events are idle and go too. */
static sl_status run_release(void *arg, char *err, size_t errlen) {
  sim_release *r = arg;
  for (size_t i = 0; i < r->n; i++) untrack(r->s, r->ptrs[i], SL__SIM_DEVICE, 1, "free_device_after");
  for (size_t i = 0; i < r->nevents; i++) sim__event_destroy(r->s, r->events[i]);
  return SL_OK;
}

/* The buffers are checked and marked released at the call (a core bug aborts here, on the
 * caller's stack), so work enqueued later on them fails at once; the frees run on the release
 * stream, behind a wait for each event. */
static sl_status sim_free_device_after(void *be, void *const *ptrs, size_t n, void *const *events, size_t nevents) {
  sim_backend *s = be;
  sim_release *r = calloc(1, sizeof *r);
  if (r)
    *r = (sim_release){s, n, nevents, malloc((n ? n : 1) * sizeof(void *)),
                       malloc((nevents ? nevents : 1) * sizeof(void *))};
  if (!r || !r->ptrs || !r->events) {
    if (r) release_free(r);
    return sim__fail(s, SL_ERR_NOMEM, "sim:%d: free_device_after: out of memory", s->device_index);
  }
  if (n) memcpy(r->ptrs, ptrs, n * sizeof *ptrs);
  if (nevents) memcpy(r->events, events, nevents * sizeof *events);
  pthread_mutex_lock(&s->lock);
  for (size_t i = 0; i < n; i++) {
    ssize_t k = buf_index_le(s, ptrs[i]);
    sim_buf *b = k >= 0 ? s->bufs[k] : NULL;
    if (!b || b->base != ptrs[i] || b->kind != SL__SIM_DEVICE || !b->owned || b->released)
      sim__abort(s, "free_device_after(%p): not a live device buffer of this backend%s", ptrs[i],
                 b && b->base == ptrs[i] && b->released ? " (already released)" : "");
    b->released = 1; /* before the free is queued: once it is, the buffer may be gone */
  }
  pthread_mutex_unlock(&s->lock);
  sl_status st = sim__enqueue_after_events(s, s->release, events, nevents, run_release, r, release_free);
  if (st != SL_OK) {
    pthread_mutex_lock(&s->lock); /* nothing was queued: the buffers are the caller's again */
    for (size_t i = 0; i < n; i++) buf_within(s, ptrs[i], 0)->released = 0;
    pthread_mutex_unlock(&s->lock);
    release_free(r);
  }
  return st;
}
static void sim_free_pinned(void *be, void *ptr) {
  if (ptr) untrack(be, ptr, SL__SIM_PINNED, 1, "free_pinned");
}

/* A caller's range becomes pinned (tracked, never freed by the backend). */
static sl_status sim_register_host(void *be, void *ptr, size_t bytes) {
  sim_backend *s = be;
  if (!ptr || !bytes || (uintptr_t)ptr + bytes < (uintptr_t)ptr)
    return sim__fail(s, SL_ERR_INVALID, "sim:%d: register_host(%p, %zu bytes): not a host range (NULL, empty or wrapping)",
                     s->device_index, ptr, bytes);
  /* check and insert in one critical section: two threads may register at once */
  pthread_mutex_lock(&s->lock);
  sim_buf *o = buf_overlapping(s, ptr, bytes, SL__SIM_NONE);
  void *obase = o ? o->base : NULL;
  const char *okind = !o                            ? ""
                      : o->kind == SL__SIM_DEVICE ? "device buffer"
                      : o->owned                  ? "pinned buffer"
                                                  : "registered range";
  sl_status st = o ? SL_ERR_INVALID : track_locked(s, ptr, bytes, 0, SL__SIM_PINNED, 0);
  pthread_mutex_unlock(&s->lock);
  if (o)
    return sim__fail(s, st, "sim:%d: register_host(%p, %zu bytes): overlaps the %s at %p", s->device_index, ptr,
                     bytes, okind, obase);
  if (st != SL_OK) return sim__fail(s, st, "sim:%d: out of memory registering a host range", s->device_index);
  return SL_OK;
}

static void sim_unregister_host(void *be, void *ptr) {
  if (ptr) untrack(be, ptr, SL__SIM_PINNED, 0, "unregister_host");
}

sl__sim_kind sl__sim_query(void *be, const void *ptr) {
  sim_backend *s = be;
  pthread_mutex_lock(&s->lock);
  sim_buf *b = buf_within(s, ptr, 0);
  sl__sim_kind k = b ? b->kind : SL__SIM_NONE;
  pthread_mutex_unlock(&s->lock);
  return k;
}

static int sim_is_device_ptr(void *be, const void *ptr, size_t bytes) {
  sim_backend *s = be;
  pthread_mutex_lock(&s->lock);
  sim_buf *b = buf_within(s, ptr, bytes);
  int ok = b && b->kind == SL__SIM_DEVICE;
  pthread_mutex_unlock(&s->lock);
  return ok;
}

/* ---- enqueue-time checks (lock held; a failure is written to MSG) --------------------------- */
/* The device side of an op: [p, p+n) inside one live device buffer. */
static sim_buf *check_device(sim_backend *s, const void *p, size_t n, const char *op, const char *side, char *msg,
                             size_t len) {
  sim_buf *b = buf_within(s, p, n);
  if (b && b->kind == SL__SIM_DEVICE && !b->released) return b;
  snprintf(msg, len, "sim:%d: %s: %s %p (+%zu bytes) is not inside a live device buffer of this backend%s",
           s->device_index, op, side, p, n,
           !b                           ? ""
           : b->kind != SL__SIM_DEVICE ? " (it is pinned host memory)"
                                        : " (its buffer was released: free_device_after)");
  return NULL;
}

/* The host side of an op: no byte of it is device memory. Sets *PINNED_BUF to the pinned
 * buffer or registered range holding it all (NULL: pageable). */
static int check_host(sim_backend *s, const void *p, size_t n, const char *op, const char *side, sim_buf **pinned_buf,
                      char *msg, size_t len) {
  sim_buf *d = buf_overlapping(s, p, n, SL__SIM_DEVICE);
  if (d) {
    snprintf(msg, len, "sim:%d: %s: %s %p (+%zu bytes) is device memory (buffer %p); the copy kind says host memory",
             s->device_index, op, side, p, n, (void *)d->base);
    return 0;
  }
  sim_buf *b = buf_within(s, p, n);
  *pinned_buf = b && b->kind == SL__SIM_PINNED ? b : NULL;
  return 1;
}

/* Extent in bytes of HEIGHT rows of WIDTH bytes PITCH apart; 0 on overflow or overlapping rows. */
static size_t extent_2d(size_t width, size_t height, size_t pitch) {
  size_t e;
  if (height > 1 && pitch < width) return 0;
  if (__builtin_mul_overflow(height - 1, pitch, &e) || __builtin_add_overflow(e, width, &e)) return 0;
  return e;
}

static const char *kind_name(sl_copy_kind k) {
  return k == SL_COPY_H2D ? "H2D" : k == SL_COPY_D2H ? "D2H" : k == SL_COPY_D2D ? "D2D" : "?";
}

/* Checks both sides of a (2-D) copy and queues it. */
static sl_status enqueue_copy(sim_backend *s, const char *op, void *dst, size_t dpitch, const void *src,
                              size_t spitch, size_t width, size_t height, sl_copy_kind kind, void *stream) {
  if (kind != SL_COPY_H2D && kind != SL_COPY_D2H && kind != SL_COPY_D2D)
    return sim__fail(s, SL_ERR_INVALID, "sim:%d: %s: unknown copy kind %d", s->device_index, op, (int)kind);
  if (!width || !height) return SL_OK;
  size_t dext = extent_2d(width, height, dpitch), sext = extent_2d(width, height, spitch);
  if (!dext || !sext)
    return sim__fail(s, SL_ERR_INVALID, "sim:%d: %s: rows of %zu bytes do not fit pitches %zu (dst) / %zu (src)",
                     s->device_index, op, width, dpitch, spitch);
  sim_stream *q = sim__stream_of(s, stream);
  sim_task *t = calloc(1, sizeof *t);
  if (!t) return sim__fail(s, SL_ERR_NOMEM, "sim:%d: %s: out of memory", s->device_index, op);
  *t = (sim_task){.op = height == 1 ? OP_COPY : OP_COPY_2D, .kind = kind, .dst = dst, .src = src, .width = width,
                  .height = height, .dpitch = dpitch, .spitch = spitch};
  char msg[512], opk[64];
  snprintf(opk, sizeof opk, "%s (%s)", op, kind_name(kind));
  sim_buf *pinned = NULL;
  int ok;
  pthread_mutex_lock(&s->lock);
  if (kind == SL_COPY_H2D) {
    ok = (t->bufs[0] = check_device(s, dst, dext, opk, "destination", msg, sizeof msg)) &&
         check_host(s, src, sext, opk, "source", &pinned, msg, sizeof msg);
    t->bufs[1] = pinned;
  } else if (kind == SL_COPY_D2H) {
    ok = (t->bufs[0] = check_device(s, src, sext, opk, "source", msg, sizeof msg)) &&
         check_host(s, dst, dext, opk, "destination", &pinned, msg, sizeof msg);
    t->bufs[1] = pinned;
  } else {
    ok = (t->bufs[0] = check_device(s, dst, dext, opk, "destination", msg, sizeof msg)) &&
         (t->bufs[1] = check_device(s, src, sext, opk, "source", msg, sizeof msg));
  }
  t->host_pageable = kind != SL_COPY_D2D && !pinned;
  if (ok) sim__enqueue_locked(s, q, t);
  pthread_mutex_unlock(&s->lock);
  if (!ok) {
    free(t);
    return sim__fail(s, SL_ERR_BACKEND, "%s", msg);
  }
  return SL_OK;
}

static sl_status sim_copy_async(void *be, void *dst, const void *src, size_t bytes, sl_copy_kind kind,
                                void *stream) {
  return enqueue_copy(be, "copy_async", dst, bytes, src, bytes, bytes, 1, kind, stream);
}

static sl_status sim_copy_2d_async(void *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                   size_t height, sl_copy_kind kind, void *stream) {
  return enqueue_copy(be, "copy_2d_async", dst, dpitch, src, spitch, width, height, kind, stream);
}

/* Castability is checked when the cast runs (a kernel fails on the device, not at launch):
 * the failure is sticky and the next sync reports it. */
static sl_status sim_cast_async(void *be, void *dst, sl_dtype dst_dt, const void *src, sl_dtype src_dt, size_t count,
                                void *stream) {
  sim_backend *s = be;
  size_t ds = sl_dtype_size(dst_dt), ss = sl_dtype_size(src_dt), dbytes, sbytes;
  if (!ds || !ss)
    return sim__fail(s, SL_ERR_DTYPE, "sim:%d: cast_async: invalid dtype (%d to %d)", s->device_index, (int)src_dt,
                     (int)dst_dt);
  if (__builtin_mul_overflow(count, ds, &dbytes) || __builtin_mul_overflow(count, ss, &sbytes))
    return sim__fail(s, SL_ERR_INVALID, "sim:%d: cast_async: %zu elements overflow", s->device_index, count);
  if (!count) return SL_OK;
  const unsigned char *d = dst, *c = src;
  if (d < c + sbytes && c < d + dbytes)
    return sim__fail(s, SL_ERR_INVALID, "sim:%d: cast_async: source %p and destination %p overlap", s->device_index,
                     src, dst);
  sim_stream *q = sim__stream_of(s, stream);
  sim_task *t = calloc(1, sizeof *t);
  if (!t) return sim__fail(s, SL_ERR_NOMEM, "sim:%d: cast_async: out of memory", s->device_index);
  *t = (sim_task){.op = OP_CAST, .dst = dst, .src = src, .dst_dt = dst_dt, .src_dt = src_dt, .count = count};
  char msg[512];
  pthread_mutex_lock(&s->lock);
  int ok = (t->bufs[0] = check_device(s, dst, dbytes, "cast_async", "destination", msg, sizeof msg)) &&
           (t->bufs[1] = check_device(s, src, sbytes, "cast_async", "source", msg, sizeof msg));
  if (ok) sim__enqueue_locked(s, q, t);
  pthread_mutex_unlock(&s->lock);
  if (!ok) {
    free(t);
    return sim__fail(s, SL_ERR_BACKEND, "%s", msg);
  }
  return SL_OK;
}

sl_status sim__host_access(void *be, const void *ptr, size_t bytes, int open) {
  sim_backend *s = be;
  char msg[512];
  pthread_mutex_lock(&s->lock);
  sim_buf *b = check_device(s, ptr, bytes, open ? "open for access" : "close access", "range", msg, sizeof msg);
  int unbalanced = b && !open && b->opens == 0;
  if (b && !unbalanced) {
    if (open) sim__buf_open(s, b);
    else sim__buf_close(s, b);
  }
  pthread_mutex_unlock(&s->lock);
  if (!b) return sim__fail(s, SL_ERR_BACKEND, "%s", msg);
  if (unbalanced)
    return sim__fail(s, SL_ERR_BACKEND, "sim:%d: close access to %p: it was not open", s->device_index, ptr);
  return SL_OK;
}

void sl__sim_counters_get(void *be, sl__sim_counters *out) {
  sim_backend *s = be;
  pthread_mutex_lock(&s->lock);
  *out = s->c;
  pthread_mutex_unlock(&s->lock);
}

/* ---- extensions ----------------------------------------------------------------------------- */
/* A test instrument (an optimizer step on device memory): synchronises, then steps with both
 * buffers open, so strict mode proves the core itself never touched them. */
static sl_status sim_sgd(void *be, void *x, const void *g, sl_dtype dt, size_t count, float lr) {
  sim_backend *s = be;
  sl_status st = sim__synchronize(s);
  if (st != SL_OK || !count) return st;
  size_t bytes = count * sl_dtype_size(dt);
  if ((st = sim__host_access(s, x, bytes, 1)) != SL_OK) return st;
  if ((st = sim__host_access(s, g, bytes, 1)) != SL_OK) {
    sim__host_access(s, x, bytes, 0);
    return st;
  }
  st = sl__host_sgd_step(x, g, dt, count, lr);
  sim__host_access(s, g, bytes, 0);
  sim__host_access(s, x, bytes, 0);
  if (st != SL_OK) return sim__fail(s, st, "sim:%d: sgd step: dtype %s is not a floating type", s->device_index, sl_dtype_name(dt));
  return SL_OK;
}

static void sim_traffic(void *be, uint64_t *h2d, uint64_t *d2h) {
  sl__sim_counters c;
  sl__sim_counters_get(be, &c);
  *h2d = c.h2d;
  *d2h = c.d2h;
}

/* The sim's streams are its own native streams (native_api "sim"): the stream itself, the
 * default one for NULL. */
static void *sim_native_stream(void *be, void *stream) { return sim__stream_of(be, stream); }

static void *sim_get_proc(const char *name) {
  if (!name) return NULL;
  if (strcmp(name, SL_EXT_SGD_STEP) == 0) return (void *)(sl_ext_sgd_step_fn)sim_sgd;
  if (strcmp(name, SL_EXT_TRAFFIC) == 0) return (void *)(sl_ext_traffic_fn)sim_traffic;
  if (strcmp(name, SL_EXT_NATIVE_STREAM) == 0) return (void *)(sl_ext_native_stream_fn)sim_native_stream;
  if (strcmp(name, SL_EXT_HOST_ACCESS) == 0) return (void *)(sl_ext_host_access_fn)sim__host_access;
  return NULL;
}

static const sl_backend_ops sim_ops = {
    .abi_version = SL_BACKEND_ABI_VERSION,
    .size = sizeof(sl_backend_ops),
    .name = "sim",
    .flags = SL_BACKEND_HAS_PINNED,
    .preferred_collective = "simccl",
    .probe = sim_probe,
    .init = sim_init,
    .fini = sim_fini,
    .describe = sim_describe,
    .device_ordinal = sim_device_ordinal,
    .alloc_device = sim_alloc_device,
    .free_device = sim_free_device,
    .alloc_pinned = sim_alloc_pinned,
    .free_pinned = sim_free_pinned,
    .stream_create = sim__stream_create,
    .stream_destroy = sim__stream_destroy,
    .event_create = sim__event_create,
    .event_destroy = sim__event_destroy,
    .event_record = sim__event_record,
    .stream_wait_event = sim__stream_wait_event,
    .event_query = sim__event_query,
    .event_sync = sim__event_sync,
    .stream_sync = sim__stream_sync,
    .synchronize = sim__synchronize,
    .copy_async = sim_copy_async,
    .cast_async = sim_cast_async,
    .copy_2d_async = sim_copy_2d_async,
    .register_host = sim_register_host,
    .unregister_host = sim_unregister_host,
    .is_device_ptr = sim_is_device_ptr,
    .get_proc = sim_get_proc,
    .device_identity = sim_device_identity,
    /* its streams are its own native streams */
    .event_record_native = sim__event_record,
    .free_device_after = sim_free_device_after,
    .native_api = "sim",
    .dlpack_device_type = 12, /* kDLExtDev: no consumer's device; pinned memory is plain kDLCPU */
    .launch_host_fn = sim__launch_host_fn,
};

const sl_backend_ops *sl__backend_sim(void) { return &sim_ops; }
