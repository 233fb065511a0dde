/* The pure CPU backend: the rank's "accelerator" is host memory, as Accelerate's
 * accelerator.device is cpu on such a rank. It has no page-locked memory to offer (no DMA
 * engine to benefit from it), so pinned placement is reported as not pinned.
 *
 * Everything is synchronous, which meets the asynchronous contract of shardload/module.h
 * trivially: every "enqueued" op is complete on return, so streams and events are one static
 * token each, records and waits do nothing and every query says done. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct cpu_backend {
  const sl_module_host *host;
} cpu_backend;

/* Non-NULL tokens for streams and events: nothing to create, nothing to free. */
static char cpu_stream_token, cpu_event_token;

static int cpu_probe(char *reason, size_t len) { return 1; }

static sl_status cpu_init(const sl_backend_init *init, void **be) {
  /* it has no variants: "cpu:strict" must not quietly mean plain cpu */
  if (init->variant && *init->variant)
    return init->host->fail(init->host->core, SL_ERR_INVALID,
                            "cpu backend: unknown variant '%s'; use cpu (sim:strict is the checking one)",
                            init->variant);
  /* One device, host memory, ordinal 0: an explicit other ordinal names a device that is not
   * there (as cuda refuses one past its count; sim simulates whichever ordinal it is given).
   * Without one every local rank shares ordinal 0 (local_rank % 1). */
  if (init->device > 0)
    return init->host->fail(init->host->core, SL_ERR_NO_DEVICE,
                            "cpu (local rank %d): device %d requested but the cpu backend has one device, host "
                            "memory (ordinal 0); pass --device 0 or leave it out",
                            init->local_rank < 0 ? 0 : init->local_rank, init->device);
  cpu_backend *c = calloc(1, sizeof *c);
  if (!c) return SL_ERR_NOMEM;
  c->host = init->host;
  *be = c;
  return SL_OK;
}

static void cpu_fini(void *be) { free(be); }

static void cpu_describe(void *be, char *buf, size_t len) { snprintf(buf, len, "cpu (host memory)"); }

static int cpu_device_ordinal(void *be) { return 0; }

static sl_status cpu_alloc(void *be, size_t bytes, void **ptr) {
  cpu_backend *c = be;
  /* the core's host allocator: 64-byte aligned, large blocks pre-faulted */
  void *p = sl__host_alloc(bytes);
  if (!p) return c->host->fail(c->host->core, SL_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
  *ptr = p;
  return SL_OK;
}

static void cpu_free(void *be, void *ptr) { sl__host_free(ptr); }

static sl_status cpu_stream_create(void *be, void **stream) {
  *stream = &cpu_stream_token;
  return SL_OK;
}
static void cpu_stream_destroy(void *be, void *stream) {}
static sl_status cpu_event_create(void *be, void **event) {
  *event = &cpu_event_token;
  return SL_OK;
}
static void cpu_event_destroy(void *be, void *event) {}
static sl_status cpu_event_record(void *be, void *event, void *stream) { return SL_OK; }
static sl_status cpu_stream_wait_event(void *be, void *stream, void *event) { return SL_OK; }
static int cpu_event_query(void *be, void *event) { return 1; }
static sl_status cpu_event_sync(void *be, void *event) { return SL_OK; }
static sl_status cpu_stream_sync(void *be, void *stream) { return SL_OK; }
static sl_status cpu_synchronize(void *be) { return SL_OK; }

static sl_status cpu_copy_async(void *be, void *dst, const void *src, size_t bytes, sl_copy_kind kind,
                                void *stream) {
  if (bytes) memmove(dst, src, bytes);
  return SL_OK;
}

static sl_status cpu_cast_async(void *be, void *dst, sl_dtype dst_dt, const void *src, sl_dtype src_dt,
                                size_t count, void *stream) {
  cpu_backend *c = be;
  sl_status st = sl_convert(dst, dst_dt, src, src_dt, count);
  if (st != SL_OK)
    return c->host->fail(c->host->core, st, "cpu backend: cannot cast %s to %s (only F64, F32, F16 and BF16 are castable)",
                         sl_dtype_name(src_dt), sl_dtype_name(dst_dt));
  return SL_OK;
}

static sl_status cpu_copy_2d_async(void *be, void *dst, size_t dpitch, const void *src, size_t spitch,
                                   size_t width, size_t height, sl_copy_kind kind, void *stream) {
  for (size_t r = 0; r < height && width; r++)
    memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
  return SL_OK;
}

static sl_status cpu_sgd(void *be, void *x, const void *g, sl_dtype dt, size_t count, float lr) {
  return sl__host_sgd_step(x, g, dt, count, lr);
}

static void *cpu_get_proc(const char *name) {
  if (strcmp(name, SL_EXT_SGD_STEP) == 0) return (void *)(sl_ext_sgd_step_fn)cpu_sgd;
  return NULL;
}

static const sl_backend_ops cpu_ops = {
    .abi_version = SL_BACKEND_ABI_VERSION,
    .size = sizeof(sl_backend_ops),
    .name = "cpu",
    .flags = SL_BACKEND_DEVICE_IS_HOST,
    .preferred_collective = "gloo",
    .probe = cpu_probe,
    .init = cpu_init,
    .fini = cpu_fini,
    .describe = cpu_describe,
    .device_ordinal = cpu_device_ordinal,
    .alloc_device = cpu_alloc,
    .free_device = cpu_free,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_query = cpu_event_query,
    .event_sync = cpu_event_sync,
    .stream_sync = cpu_stream_sync,
    .synchronize = cpu_synchronize,
    .copy_async = cpu_copy_async,
    .cast_async = cpu_cast_async,
    .copy_2d_async = cpu_copy_2d_async,
    .get_proc = cpu_get_proc,
    /* native_api NULL: its device memory is host memory, no API's; collectives pair by its name */
};

const sl_backend_ops *sl__backend_cpu(void) { return &cpu_ops; }
