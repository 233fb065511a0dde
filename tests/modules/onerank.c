/* An ABI v2 collective for one rank (tests/test_modules.c), built in variants:
 *   SL_TEST_NAME            the name its table gives (default "onerank")
 *   SL_TEST_TRACE           its constructor appends the real path of its file to $SL_TEST_TRACE,
 *                           so a test sees every process that opened it, whatever else happens
 *   SL_TEST_DEVICE_BACKEND  it moves only that backend's device memory (domains SL_MEM_DEVICE)
 *                           and its probe says yes to any backend, as the ABI lets a table say
 *   SL_TEST_INIT_SILENT     init fails without a message */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <shardload/module.h>

#ifndef SL_TEST_NAME
#define SL_TEST_NAME "onerank"
#endif

#ifdef SL_TEST_TRACE
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

typedef struct onerank {
  const sl_module_host *host;
} onerank;

static int or_probe(const char *backend, char *reason, size_t len) { return 1; }

static sl_status or_init(const sl_collective_init *init, void **comm) {
  const sl_module_host *h = init->host;
#ifdef SL_TEST_INIT_SILENT
  if (h) return SL_ERR_COMM; /* and says nothing */
#endif
  if (init->world_size != 1)
    return h->fail(h->core, SL_ERR_INVALID, "%s: world size %d; this test collective serves one rank", SL_TEST_NAME,
                   init->world_size);
  onerank *c = calloc(1, sizeof *c);
  if (!c) return h->fail(h->core, SL_ERR_NOMEM, "%s: out of memory", SL_TEST_NAME);
  c->host = h;
  *comm = c;
  return SL_OK;
}

static void or_fini(void *comm) { free(comm); }

static sl_status or_broadcast(void *comm, void *buf, size_t bytes, int root, void *stream) { return SL_OK; }

static sl_status or_scatterv(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs,
                             void *recvbuf, size_t recvbytes, int root, void *stream) {
  if (recvbytes) memmove(recvbuf, (const char *)sendbuf + displs[0], recvbytes);
  return SL_OK;
}

static sl_status or_allgather(void *comm, const void *sendbuf, void *recvbuf, size_t bytes, void *stream) {
  if (bytes) memmove(recvbuf, sendbuf, bytes);
  return SL_OK;
}

static sl_status or_barrier(void *comm) { return SL_OK; }

static const sl_collective_ops onerank_ops = {
    .abi_version = SL_COLLECTIVE_ABI_VERSION,
    .size = sizeof(sl_collective_ops),
    .name = SL_TEST_NAME,
    .flags = SL_COLL_SYNC,
#ifdef SL_TEST_DEVICE_BACKEND
    .domains = SL_MEM_DEVICE,
    .device_backend = SL_TEST_DEVICE_BACKEND,
#else
    .domains = SL_MEM_HOST | SL_MEM_PINNED,
#endif
    .probe = or_probe,
    .init = or_init,
    .fini = or_fini,
    .broadcast = or_broadcast,
    .scatterv = or_scatterv,
    .allgather = or_allgather,
    .barrier = or_barrier,
};

__attribute__((visibility("default"))) const sl_collective_ops *sl_collective_module_v2(void) { return &onerank_ops; }
