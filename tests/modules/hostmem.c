/* A loadable backend of ABI v2 whose "device" is host memory, like the built-in cpu backend.
 * It needs only the installed headers (shardload/module.h), so tests/package/check.sh builds
 * it out of tree, as a vendor would, and loads it with `shardload load --backend hostmem`.
 *
 * The in-tree test build compiles variants of it for tests/test_modules.c:
 *   SL_TEST_DUAL      also exports the ABI v1 entry (one binary serving two core versions)
 *   SL_TEST_PROBE_NO  probe says no, with a reason
 *   SL_TEST_BAD_ABI   a table that claims an ABI version no core knows
 *   SL_TEST_TABLE_NAME the name its table gives, when not SL_TEST_NAME (an impostor: "sim")
 *   SL_TEST_NAME_FORGED its table's name holds a newline and a forged "shardload:" line
 *   SL_TEST_FORGED    its probe's reason and describe() hold control characters and a byte
 *                     past ASCII, a forged "shardload:" line among them
 *   SL_TEST_INIT_SILENT init fails without a message
 *   SL_TEST_PREFERRED the data collective its table prefers, when not gloo
 *   SL_TEST_NATIVE_API its table's native_api (a backend of host memory gives none)
 *   SL_TEST_DLPACK    its table's dlpack_device_type
 *   SL_TEST_SCORE     what its probe says when it says yes (default 1, as cpu's)
 *   SL_TEST_DEVICES   it says it has that many devices (SL_EXT_DEVICE_COUNT), each described
 *                     with its ordinal; init refuses ordinal SL_TEST_BROKEN_DEVICE, and any past
 *                     the count
 *   SL_TEST_TRACE     its constructor appends the real path of its file to $SL_TEST_TRACE, as
 *                     onerank.c's does, so a test sees every process that opened it */
#ifdef SL_TEST_TRACE
#define _GNU_SOURCE /* dladdr */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <shardload/module.h>
#ifdef SL_TEST_DUAL
#include <shardload/module_v1.h> /* the frozen v1 tables, installed */
#endif

#ifndef SL_TEST_NAME
#define SL_TEST_NAME "hostmem"
#endif
#ifdef SL_TEST_NAME_FORGED
#define SL_TEST_TABLE_NAME SL_TEST_NAME "\nshardload: forged line"
#endif
#ifndef SL_TEST_TABLE_NAME
#define SL_TEST_TABLE_NAME SL_TEST_NAME
#endif
#ifndef SL_TEST_PREFERRED
#define SL_TEST_PREFERRED "gloo"
#endif
#ifdef SL_TEST_FORGED
#define SL_TEST_FORGERY "\nshardload: forged line\x1b[2J\xff"
#else
#define SL_TEST_FORGERY ""
#endif

#ifndef SL_TEST_SCORE
#define SL_TEST_SCORE 1
#endif

#ifdef SL_TEST_TRACE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

__attribute__((constructor)) static void trace_open(void) {
  const char *trace = getenv("SL_TEST_TRACE");
  Dl_info info;
  if (!trace || !*trace || !dladdr((void *)trace_open, &info) || !info.dli_fname) return;
  char real[PATH_MAX], line[PATH_MAX + 2];
  if (!realpath(info.dli_fname, real)) snprintf(real, sizeof real, "%s", info.dli_fname);
  int n = snprintf(line, sizeof line, "%s\n", real);
  int fd = open(trace, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  ssize_t w = write(fd, line, (size_t)n); /* a short write shows as a short line */
  (void)w;
  close(fd);
}
#endif

typedef struct hostmem {
  const sl_module_host *host;
  int ordinal;
  char token; /* &token is every stream and event: copies complete on return */
} hostmem;

static int hm_probe(char *reason, size_t len) {
#ifdef SL_TEST_PROBE_NO
  snprintf(reason, len, "%s: no widget on this machine (test module)%s", SL_TEST_NAME, SL_TEST_FORGERY);
  return 0;
#else
  return SL_TEST_SCORE;
#endif
}

static sl_status hm_init(const sl_backend_init *init, void **be) {
  /* the core's struct may be older or newer than ours: read only what both hold */
  if (init->size < offsetof(sl_backend_init, variant) + sizeof init->variant) return SL_ERR_ABI;
  const sl_module_host *h = init->host;
#ifdef SL_TEST_INIT_SILENT
  if (h) return SL_ERR_BACKEND; /* and says nothing */
#endif
  if (init->variant && *init->variant)
    return h->fail(h->core, SL_ERR_INVALID, "%s backend: unknown variant '%s'", SL_TEST_NAME, init->variant);
#ifdef SL_TEST_DEVICES
  if (init->device >= SL_TEST_DEVICES || init->device == SL_TEST_BROKEN_DEVICE)
    return h->fail(h->core, SL_ERR_NO_DEVICE, "%s:%d: this device does not start (test module)", SL_TEST_NAME,
                   init->device);
#endif
  hostmem *b = calloc(1, sizeof *b);
  if (!b) return h->fail(h->core, SL_ERR_NOMEM, "%s backend: out of memory", SL_TEST_NAME);
  b->host = h;
#ifdef SL_TEST_DEVICES
  b->ordinal = init->device < 0 ? 0 : init->device;
#endif
  *be = b;
  return SL_OK;
}

static void hm_fini(void *be) { free(be); }

static void hm_describe(void *be, char *buf, size_t len) {
#ifdef SL_TEST_DEVICES
  snprintf(buf, len, "%s:%d (test device)", SL_TEST_NAME, ((hostmem *)be)->ordinal);
#else
  snprintf(buf, len, "%s (out-of-tree host-memory backend, ABI v2 entry)%s", SL_TEST_NAME, SL_TEST_FORGERY);
#endif
}

static int hm_ordinal(void *be) { return ((hostmem *)be)->ordinal; }

#ifdef SL_TEST_DEVICES
static int hm_device_count(void) { return SL_TEST_DEVICES; }
static void *hm_get_proc(const char *name) {
  return name && strcmp(name, SL_EXT_DEVICE_COUNT) == 0 ? (void *)(sl_ext_device_count_fn)hm_device_count : NULL;
}
#endif

static sl_status hm_alloc(void *be, size_t bytes, void **ptr) {
  hostmem *b = be;
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (!p && !b->host) return SL_ERR_NOMEM; /* the v1 entry's instance has no v2 host */
  if (!p) return b->host->fail(b->host->core, SL_ERR_NOMEM, "%s backend: cannot allocate %zu bytes", SL_TEST_NAME, bytes);
  *ptr = p;
  return SL_OK;
}

static void hm_free(void *be, void *ptr) { free(ptr); }

static sl_status hm_token_create(void *be, void **token) {
  *token = &((hostmem *)be)->token;
  return SL_OK;
}
static void hm_token_destroy(void *be, void *token) {}
static sl_status hm_record(void *be, void *event, void *stream) { return SL_OK; }
static sl_status hm_wait(void *be, void *stream, void *event) { return SL_OK; }
static int hm_query(void *be, void *event) { return 1; }
static sl_status hm_event_sync(void *be, void *event) { return SL_OK; }
static sl_status hm_stream_sync(void *be, void *stream) { return SL_OK; }
static sl_status hm_synchronize(void *be) { return SL_OK; }

/* Complete on return, which meets the enqueued contract. */
static sl_status hm_copy(void *be, void *dst, const void *src, size_t bytes, sl_copy_kind kind, void *stream) {
  if (bytes) memmove(dst, src, bytes);
  return SL_OK;
}

static const sl_backend_ops hostmem_ops = {
#ifdef SL_TEST_BAD_ABI
    .abi_version = 99,
#else
    .abi_version = SL_BACKEND_ABI_VERSION,
#endif
    .size = sizeof(sl_backend_ops),
    .name = SL_TEST_TABLE_NAME,
    .flags = SL_BACKEND_DEVICE_IS_HOST,
    .preferred_collective = SL_TEST_PREFERRED,
    .probe = hm_probe,
    .init = hm_init,
    .fini = hm_fini,
    .describe = hm_describe,
    .device_ordinal = hm_ordinal,
    .alloc_device = hm_alloc,
    .free_device = hm_free,
    .stream_create = hm_token_create,
    .stream_destroy = hm_token_destroy,
    .event_create = hm_token_create,
    .event_destroy = hm_token_destroy,
    .event_record = hm_record,
    .stream_wait_event = hm_wait,
    .event_query = hm_query,
    .event_sync = hm_event_sync,
    .stream_sync = hm_stream_sync,
    .synchronize = hm_synchronize,
    .copy_async = hm_copy,
#ifdef SL_TEST_NATIVE_API
    .native_api = SL_TEST_NATIVE_API,
#endif
#ifdef SL_TEST_DLPACK
    .dlpack_device_type = SL_TEST_DLPACK,
#endif
#ifdef SL_TEST_DEVICES
    .get_proc = hm_get_proc,
#endif
};

__attribute__((visibility("default"))) const sl_backend_ops *sl_backend_module_v2(void) { return &hostmem_ops; }

#ifdef SL_TEST_DUAL
/* The same device for a core that knows only ABI v1. */
static int v1_score(void) { return 1; }
static sl_status v1_init(const sl_backend_init_v1 *init, void **be) {
  hostmem *b = calloc(1, sizeof *b);
  if (!b) return SL_ERR_NOMEM;
  *be = b;
  return SL_OK;
}
static void v1_describe(void *be, char *buf, size_t len) {
  snprintf(buf, len, "%s (out-of-tree host-memory backend, ABI v1 entry)", SL_TEST_NAME);
}
static sl_status v1_copy(void *be, void *dst, const void *src, size_t bytes) { return hm_copy(be, dst, src, bytes, SL_COPY_H2D, NULL); }

static const sl_backend_ops_v1 hostmem_ops_v1 = {
    .abi_version = 1,
    .size = sizeof(sl_backend_ops_v1),
    .name = SL_TEST_NAME,
    .flags = SL_BACKEND_DEVICE_IS_HOST,
    .preferred_collective = "gloo",
    .score = v1_score,
    .init = v1_init,
    .fini = hm_fini,
    .describe = v1_describe,
    .alloc_device = hm_alloc,
    .free_device = hm_free,
    .copy_h2d = v1_copy,
    .copy_d2h = v1_copy,
    .copy_d2d = v1_copy,
    .synchronize = hm_synchronize,
};

__attribute__((visibility("default"))) const sl_backend_ops_v1 *sl_backend_module(void) { return &hostmem_ops_v1; }
#endif
