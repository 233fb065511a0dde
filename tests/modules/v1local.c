/* An ABI v1 collective for one rank, compiled against the frozen v1 tables (shardload/module_v1.h)
 * and exporting only the v1 entry symbol (tests/test_modules.c). Variants:
 *   SL_TEST_NAME            the name its table gives (default "v1local")
 *   SL_TEST_DEVICE_BACKEND  it moves that backend's device memory (v1's device_backend), e.g.
 *                           "cpu", whose device memory is host memory: legal under v1 */
#include <stdlib.h>
#include <string.h>

#include <shardload/module_v1.h>

#ifndef SL_TEST_NAME
#define SL_TEST_NAME "v1local"
#endif
#ifndef SL_TEST_DEVICE_BACKEND
#define SL_TEST_DEVICE_BACKEND NULL
#endif

typedef struct v1local {
  const sl_module_host_v1 *host;
} v1local;

static int v1_score(void) { return 1; }

static sl_status v1_init(const sl_collective_init_v1 *init, void **comm) {
  if (init->world_size != 1) /* the v1 host reaches the core */
    return init->host->fail(init->host->core, SL_ERR_INVALID,
                            SL_TEST_NAME ": world size %d; this test collective serves one rank", init->world_size);
  v1local *c = calloc(1, sizeof *c);
  if (!c) return SL_ERR_NOMEM;
  c->host = init->host;
  *comm = c;
  return SL_OK;
}

static void v1_fini(void *comm) { free(comm); }

static sl_status v1_broadcast(void *comm, void *buf, size_t bytes, int root) { return SL_OK; }

static sl_status v1_scatterv(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs,
                             void *recvbuf, size_t recvbytes, int root) {
  v1local *c = comm;
  if (counts[0] != recvbytes)
    return c->host->fail(c->host->core, SL_ERR_INVALID, SL_TEST_NAME ": scatterv of %zu bytes into %zu", counts[0],
                         recvbytes);
  if (recvbytes) memmove(recvbuf, (const char *)sendbuf + displs[0], recvbytes);
  return SL_OK;
}

static sl_status v1_allgather(void *comm, const void *sendbuf, void *recvbuf, size_t bytes) {
  if (bytes) memmove(recvbuf, sendbuf, bytes);
  return SL_OK;
}

static sl_status v1_barrier(void *comm) { return SL_OK; }

static const sl_collective_ops_v1 v1local_ops = {
    .abi_version = 1,
    .size = sizeof(sl_collective_ops_v1),
    .name = SL_TEST_NAME,
    .device_backend = SL_TEST_DEVICE_BACKEND,
    .score = v1_score,
    .init = v1_init,
    .fini = v1_fini,
    .broadcast = v1_broadcast,
    .scatterv = v1_scatterv,
    .allgather = v1_allgather,
    .barrier = v1_barrier,
};

__attribute__((visibility("default"))) const sl_collective_ops_v1 *sl_collective_module(void) { return &v1local_ops; }
