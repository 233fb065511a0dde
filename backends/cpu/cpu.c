/* The pure CPU backend: the rank's "accelerator" is host memory, as Accelerate's
 * accelerator.device is cpu on such a rank. It has no page-locked memory to offer (no DMA
 * engine to benefit from it), so pinned placement is reported as not pinned. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct cpu_backend {
  const sl_module_host *host;
} cpu_backend;

static int cpu_score(void) { return 1; }

static sl_status cpu_init(const sl_backend_init *init, void **be) {
  /* it has no variants: "cpu:strict" must not quietly mean plain cpu */
  if (init->variant && *init->variant)
    return init->host->fail(init->host->core, SL_ERR_INVALID,
                            "cpu backend: unknown variant '%s'; use cpu (sim:strict is the checking one)",
                            init->variant);
  cpu_backend *c = calloc(1, sizeof *c);
  if (!c) return SL_ERR_NOMEM;
  c->host = init->host;
  *be = c;
  return SL_OK;
}

static void cpu_fini(void *be) { free(be); }

static void cpu_describe(void *be, char *buf, size_t len) {
  snprintf(buf, len, "cpu (host memory)");
}

static sl_status cpu_alloc(void *be, size_t bytes, void **ptr) {
  cpu_backend *c = be;
  /* the core's host allocator: 64-byte aligned, large blocks pre-faulted */
  void *p = sl__host_alloc(bytes);
  if (!p) return c->host->fail(c->host->core, SL_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
  *ptr = p;
  return SL_OK;
}

static void cpu_free(void *be, void *ptr) { sl__host_free(ptr); }

static sl_status cpu_copy(void *be, void *dst, const void *src, size_t bytes) {
  if (bytes) memmove(dst, src, bytes);
  return SL_OK;
}

static sl_status cpu_sync(void *be) { return SL_OK; }

static sl_status cpu_cast(void *be, void *dst, sl_dtype dst_dt, const void *src, sl_dtype src_dt,
                          size_t count) {
  return sl_convert(dst, dst_dt, src, src_dt, count);
}

static sl_status cpu_sgd(void *be, void *x, const void *g, sl_dtype dt, size_t count, float lr) {
  return sl__host_sgd_step(x, g, dt, count, lr);
}

static const sl_backend_ops cpu_ops = {
    .abi_version = SL_BACKEND_ABI_VERSION,
    .size = sizeof(sl_backend_ops),
    .name = "cpu",
    .flags = SL_BACKEND_DEVICE_IS_HOST,
    .preferred_collective = "gloo",
    .score = cpu_score,
    .init = cpu_init,
    .fini = cpu_fini,
    .describe = cpu_describe,
    .alloc_device = cpu_alloc,
    .free_device = cpu_free,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy,
    .synchronize = cpu_sync,
    .cast_device = cpu_cast,
    .sgd_step = cpu_sgd,
};

const sl_backend_ops *sl__backend_cpu(void) { return &cpu_ops; }
