/* An ABI v1 backend, compiled against the frozen v1 tables (shardload/module_v1.h) and exporting
 * only the v1 entry symbol, as a module built for the first shardload would: the registry must
 * adapt it (tests/test_modules.c). Its "device" memory is host memory it allocates itself, and
 * it counts what it copies, so a test can see the core's copies go through it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <shardload/module_v1.h>

#ifndef SL_TEST_NAME
#define SL_TEST_NAME "v1host"
#endif

#define LIVE 0x76316c697665ull /* "v1live": a finalised instance must never be used again */

typedef struct v1host {
  uint64_t magic;
  struct v1host *next_dead;
  const sl_module_host_v1 *host;
  int device;
  uint64_t h2d, d2h;
} v1host;

static v1host *live(void *be) {
  v1host *b = be;
  if (b->magic != LIVE) {
    fprintf(stderr, "v1host: used after fini\n");
    abort();
  }
  return b;
}

/* SL_TEST_V1_SCORE=0 plays a machine without the device: v1 has no way to say why. */
static int v1_score(void) {
  const char *e = getenv("SL_TEST_V1_SCORE");
  return e ? atoi(e) : 1;
}

static sl_status v1_init(const sl_backend_init_v1 *init, void **be) {
  if (init->variant && strcmp(init->variant, "fail") == 0) /* the v1 host reaches the core */
    return init->host->fail(init->host->core, SL_ERR_BACKEND, SL_TEST_NAME ": asked to fail (variant 'fail')");
  v1host *b = calloc(1, sizeof *b);
  if (!b) return SL_ERR_NOMEM;
  b->magic = LIVE;
  b->host = init->host;
  b->device = init->local_rank;
  init->host->log(init->host->core, SL_LOG_DEBUG, SL_TEST_NAME ": device %d ready", b->device);
  *be = b;
  return SL_OK;
}

/* The instance is poisoned, not freed, so that a later use aborts instead of reading freed
 * memory; the dead are freed when the module is unloaded (a test instrument: a real module
 * frees at fini and keeps no global state). */
static v1host *dead;

static void v1_fini(void *be) {
  v1host *b = live(be);
  b->magic = 0;
  b->next_dead = __atomic_exchange_n(&dead, b, __ATOMIC_ACQ_REL);
}

__attribute__((destructor)) static void v1_unload(void) {
  for (v1host *b = dead, *next; b; b = next) {
    next = b->next_dead;
    free(b);
  }
}

static void v1_describe(void *be, char *buf, size_t len) {
  snprintf(buf, len, SL_TEST_NAME ":%d (ABI v1 test backend)", live(be)->device);
}

static sl_status v1_alloc(void *be, size_t bytes, void **ptr) {
  v1host *b = live(be);
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (!p) return b->host->fail(b->host->core, SL_ERR_NOMEM, "v1host: cannot allocate %zu bytes", bytes);
  *ptr = p;
  return SL_OK;
}

static void v1_free(void *be, void *ptr) {
  live(be);
  free(ptr);
}

static sl_status v1_h2d(void *be, void *dst, const void *src, size_t bytes) {
  live(be)->h2d += bytes;
  memmove(dst, src, bytes);
  return SL_OK;
}

static sl_status v1_d2h(void *be, void *dst, const void *src, size_t bytes) {
  live(be)->d2h += bytes;
  memmove(dst, src, bytes);
  return SL_OK;
}

static sl_status v1_d2d(void *be, void *dst, const void *src, size_t bytes) {
  live(be);
  memmove(dst, src, bytes);
  return SL_OK;
}

static sl_status v1_sync(void *be) {
  live(be);
  return SL_OK;
}

static sl_status v1_sgd(void *be, void *x, const void *g, sl_dtype dt, size_t count, float lr) {
  v1host *b = live(be);
  if (dt != SL_DTYPE_F32) return b->host->fail(b->host->core, SL_ERR_DTYPE, "v1host: sgd_step takes F32 only");
  float *xf = x;
  const float *gf = g;
  for (size_t i = 0; i < count; i++) xf[i] -= lr * gf[i];
  return SL_OK;
}

static void v1_traffic(void *be, uint64_t *h2d, uint64_t *d2h) {
  v1host *b = live(be);
  *h2d = b->h2d;
  *d2h = b->d2h;
}

static const sl_backend_ops_v1 v1host_ops = {
    .abi_version = 1,
    .size = sizeof(sl_backend_ops_v1),
    .name = SL_TEST_NAME,
    .flags = SL_BACKEND_HAS_PINNED,
    .preferred_collective = "gloo",
    .score = v1_score,
    .init = v1_init,
    .fini = v1_fini,
    .describe = v1_describe,
    .alloc_device = v1_alloc,
    .free_device = v1_free,
    .alloc_pinned = v1_alloc,
    .free_pinned = v1_free,
    .copy_h2d = v1_h2d,
    .copy_d2h = v1_d2h,
    .copy_d2d = v1_d2d,
    .synchronize = v1_sync,
    .sgd_step = v1_sgd,
    .traffic = v1_traffic,
};

__attribute__((visibility("default"))) const sl_backend_ops_v1 *sl_backend_module(void) { return &v1host_ops; }
