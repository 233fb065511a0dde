/* libshardload-demo.so: a complete small shardload backend module (docs/MODULES.md), as a
 * vendor would start one. Its "device" is host memory it allocates itself, so it runs anywhere;
 * a real backend maps the same ops onto its runtime (cudaMemcpyAsync, hipMemcpyAsync,
 * zeCommandListAppendMemoryCopy) and its streams and events onto the runtime's.
 *
 * What it shows:
 * - one const table per ABI version, each behind its entry symbol: sl_backend_module_v2 (the
 *   current ABI, shardload/module.h) and sl_backend_module (the frozen ABI v1, for a shardload
 *   of that time); the core takes the newest it knows and adapts an older one;
 * - probe: cheap, no allocation, and a reason naming the module when it says no;
 * - the init struct read only as far as both sides know it (SL_INIT_HAS, module_util.h);
 * - failures through the host the core lends (host->fail), never printed;
 * - the asynchronous contract met the simplest way: every op is complete on return, so streams
 *   and events are tokens, records and waits do nothing and every query says done;
 * - optional members (copy_2d_async, is_device_ptr, get_proc) and an extension by name
 *   (SL_EXT_TRAFFIC: the bytes copied each way).
 *
 * Build it out of tree against an installed shardload (examples/module/CMakeLists.txt, with
 * shardload_add_module), check it with the conformance suites, use it with
 * `shardload load CKPT --backend demo` and SHARDLOAD_MODULE_PATH pointing at its directory. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <shardload/module.h>
#include <shardload/module_util.h>
#include <shardload/module_v1.h> /* the frozen ABI v1 tables, installed */

#define DEMO_NAME "demo"

/* ---- the device: host memory, with a list of what it handed out (is_device_ptr) ------------ */
typedef struct demo_buf {
  unsigned char *p;
  size_t bytes;
  struct demo_buf *next;
} demo_buf;

typedef struct demo {
  const sl_module_host *host; /* NULL for an instance made through the v1 entry's init */
  int ordinal;
  pthread_mutex_t mu; /* guards bufs and the counters: ops may come from several threads */
  demo_buf *bufs;
  uint64_t h2d, d2h;
  char token; /* &token is every stream and every event */
} demo;

static sl_status demo_fail(demo *d, sl_status s, const char *what) {
  return d->host ? d->host->fail(d->host->core, s, DEMO_NAME ":%d: %s", d->ordinal, what) : s;
}

static int demo_probe(char *reason, size_t len) {
  (void)reason, (void)len; /* host memory is always there: nothing to say no about */
  return 1;                /* usable; an accelerator would return more, to win "auto" */
}

static demo *demo_new(const sl_module_host *host, int ordinal) {
  demo *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  d->host = host;
  d->ordinal = ordinal;
  pthread_mutex_init(&d->mu, NULL);
  return d;
}

static sl_status demo_init(const sl_backend_init *in, void **be) {
  const sl_module_host *h = in->host;
  /* a core built against an older module.h passes a shorter struct: read what both know */
  if (!SL_INIT_HAS(in, variant))
    return h->fail(h->core, SL_ERR_ABI, DEMO_NAME ": sl_backend_init of %u bytes is older than this module", in->size);
  if (in->variant && *in->variant)
    return h->fail(h->core, SL_ERR_INVALID, DEMO_NAME ": unknown variant '%s'; use --backend " DEMO_NAME, in->variant);
  if (in->device > 0)
    return h->fail(h->core, SL_ERR_NO_DEVICE, DEMO_NAME ": device %d requested, this module has one (0)", in->device);
  demo *d = demo_new(h, 0);
  if (!d) return h->fail(h->core, SL_ERR_NOMEM, DEMO_NAME ": out of memory");
  *be = d;
  return SL_OK;
}

/* The core has synchronised first; what the core did not free is freed here. */
static void demo_fini(void *be) {
  demo *d = be;
  for (demo_buf *b = d->bufs, *next; b; b = next) {
    next = b->next;
    free(b->p);
    free(b);
  }
  pthread_mutex_destroy(&d->mu);
  free(d);
}

static void demo_describe(void *be, char *buf, size_t len) {
  snprintf(buf, len, DEMO_NAME ":%d (example module: host memory, synchronous)", ((demo *)be)->ordinal);
}

static int demo_ordinal(void *be) { return ((demo *)be)->ordinal; }

static sl_status demo_alloc(void *be, size_t bytes, void **ptr) {
  demo *d = be;
  demo_buf *b = malloc(sizeof *b);
  unsigned char *p = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (!b || !p) {
    free(b);
    free(p);
    return demo_fail(d, SL_ERR_NOMEM, "alloc_device: out of memory");
  }
  *b = (demo_buf){p, bytes, NULL};
  pthread_mutex_lock(&d->mu);
  b->next = d->bufs;
  d->bufs = b;
  pthread_mutex_unlock(&d->mu);
  *ptr = p;
  return SL_OK;
}

static void demo_free(void *be, void *ptr) {
  demo *d = be;
  pthread_mutex_lock(&d->mu);
  for (demo_buf **at = &d->bufs; *at; at = &(*at)->next)
    if ((*at)->p == ptr) {
      demo_buf *b = *at;
      *at = b->next;
      free(b->p);
      free(b);
      break;
    }
  pthread_mutex_unlock(&d->mu);
}

/* ---- streams and events: tokens, since every op is complete on return ---------------------- */
static sl_status demo_token(void *be, void **out) {
  *out = &((demo *)be)->token;
  return SL_OK;
}
static void demo_token_destroy(void *be, void *token) { (void)be, (void)token; }
static sl_status demo_record(void *be, void *event, void *stream) { return SL_OK; }
static sl_status demo_wait(void *be, void *stream, void *event) { return SL_OK; }
static int demo_query(void *be, void *event) { return 1; }
static sl_status demo_event_sync(void *be, void *event) { return SL_OK; }
static sl_status demo_stream_sync(void *be, void *stream) { return SL_OK; }
static sl_status demo_synchronize(void *be) { return SL_OK; }

static void count(demo *d, sl_copy_kind kind, size_t bytes) {
  pthread_mutex_lock(&d->mu);
  if (kind == SL_COPY_H2D) d->h2d += bytes;
  else if (kind == SL_COPY_D2H) d->d2h += bytes;
  pthread_mutex_unlock(&d->mu);
}

/* Complete on return, which meets the enqueued contract. */
static sl_status demo_copy(void *be, void *dst, const void *src, size_t bytes, sl_copy_kind kind, void *stream) {
  if (bytes) memmove(dst, src, bytes);
  count(be, kind, bytes);
  return SL_OK;
}

static sl_status demo_copy_2d(void *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t height, sl_copy_kind kind, void *stream) {
  if (height > 1 && (width > dpitch || width > spitch))
    return demo_fail(be, SL_ERR_INVALID, "copy_2d_async: rows wider than their pitch");
  for (size_t r = 0; r < height && width; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
  count(be, kind, width * height);
  return SL_OK;
}

static int demo_is_device_ptr(void *be, const void *ptr, size_t bytes) {
  demo *d = be;
  const unsigned char *p = ptr;
  int inside = 0;
  pthread_mutex_lock(&d->mu);
  for (demo_buf *b = d->bufs; b && !inside; b = b->next)
    inside = p >= b->p && p < b->p + b->bytes && bytes <= (size_t)(b->p + b->bytes - p);
  pthread_mutex_unlock(&d->mu);
  return inside;
}

static void demo_traffic(void *be, uint64_t *h2d, uint64_t *d2h) {
  demo *d = be;
  pthread_mutex_lock(&d->mu);
  *h2d = d->h2d;
  *d2h = d->d2h;
  pthread_mutex_unlock(&d->mu);
}

/* Extensions by name: what the core or a test may ask for beyond the table. */
static void *demo_get_proc(const char *name) {
  if (strcmp(name, SL_EXT_TRAFFIC) == 0) return (void *)(sl_ext_traffic_fn)demo_traffic;
  return NULL;
}

/* ---- ABI v2: the table a current core takes ---------------------------------------------------- */
static const sl_backend_ops demo_ops = {
    .abi_version = SL_BACKEND_ABI_VERSION,
    .size = sizeof(sl_backend_ops),
    .name = DEMO_NAME, /* the NAME of libshardload-NAME.so: the core checks it */
    .flags = SL_BACKEND_DEVICE_IS_HOST,
    .preferred_collective = "gloo", /* host memory: staged through the control plane's Gloo */
    .probe = demo_probe,
    .init = demo_init,
    .fini = demo_fini,
    .describe = demo_describe,
    .device_ordinal = demo_ordinal,
    .alloc_device = demo_alloc,
    .free_device = demo_free,
    .stream_create = demo_token,
    .stream_destroy = demo_token_destroy,
    .event_create = demo_token,
    .event_destroy = demo_token_destroy,
    .event_record = demo_record,
    .stream_wait_event = demo_wait,
    .event_query = demo_query,
    .event_sync = demo_event_sync,
    .stream_sync = demo_stream_sync,
    .synchronize = demo_synchronize,
    .copy_async = demo_copy,
    .copy_2d_async = demo_copy_2d,
    .is_device_ptr = demo_is_device_ptr,
    .get_proc = demo_get_proc,
};

__attribute__((visibility("default"))) const sl_backend_ops *sl_backend_module_v2(void) { return &demo_ops; }

/* ---- ABI v1: the same device for a core that knows only the first ABI ----------------------------- */
static int demo_v1_score(void) { return demo_probe(NULL, 0); }

static sl_status demo_v1_init(const sl_backend_init_v1 *in, void **be) {
  if (in->variant && *in->variant)
    return in->host->fail(in->host->core, SL_ERR_INVALID, DEMO_NAME ": unknown variant '%s'", in->variant);
  demo *d = demo_new(NULL, 0); /* the v1 host has another layout: failures return their status only */
  if (!d) return SL_ERR_NOMEM;
  *be = d;
  return SL_OK;
}

static sl_status demo_v1_h2d(void *be, void *dst, const void *src, size_t bytes) {
  return demo_copy(be, dst, src, bytes, SL_COPY_H2D, NULL);
}
static sl_status demo_v1_d2h(void *be, void *dst, const void *src, size_t bytes) {
  return demo_copy(be, dst, src, bytes, SL_COPY_D2H, NULL);
}
static sl_status demo_v1_d2d(void *be, void *dst, const void *src, size_t bytes) {
  return demo_copy(be, dst, src, bytes, SL_COPY_D2D, NULL);
}

static const sl_backend_ops_v1 demo_ops_v1 = {
    .abi_version = 1,
    .size = sizeof(sl_backend_ops_v1),
    .name = DEMO_NAME,
    .flags = SL_BACKEND_DEVICE_IS_HOST,
    .preferred_collective = "gloo",
    .score = demo_v1_score,
    .init = demo_v1_init,
    .fini = demo_fini,
    .describe = demo_describe,
    .alloc_device = demo_alloc,
    .free_device = demo_free,
    .copy_h2d = demo_v1_h2d,
    .copy_d2h = demo_v1_d2h,
    .copy_d2d = demo_v1_d2d,
    .synchronize = demo_synchronize,
    .is_device_ptr = demo_is_device_ptr,
    .traffic = demo_traffic,
};

__attribute__((visibility("default"))) const sl_backend_ops_v1 *sl_backend_module(void) { return &demo_ops_v1; }
