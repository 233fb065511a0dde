/* The world-size-1 collective: the loader always moves data through a collective, so a single
 * rank runs the same code path as a job of thousands. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int local_score(void) { return 1; }

static sl_status local_init(const sl_collective_init *init, void **comm) {
  if (init->world_size != 1)
    return init->host->fail(init->host->core, SL_ERR_INVALID,
                            "the local collective serves one rank; this job has %d", init->world_size);
  *comm = (void *)init->host;
  return SL_OK;
}

static void local_fini(void *comm) {}

static sl_status local_broadcast(void *comm, void *buf, size_t bytes, int root) { return SL_OK; }

static sl_status local_scatterv(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs,
                                void *recvbuf, size_t recvbytes, int root) {
  if (counts[0] != recvbytes) return SL_ERR_INVALID;
  const char *src = (const char *)sendbuf + displs[0];
  if (recvbytes && src != recvbuf) memmove(recvbuf, src, recvbytes);
  return SL_OK;
}

static sl_status local_allgather(void *comm, const void *sendbuf, void *recvbuf, size_t bytes) {
  if (bytes && sendbuf != recvbuf) memmove(recvbuf, sendbuf, bytes);
  return SL_OK;
}

static sl_status local_barrier(void *comm) { return SL_OK; }

static const sl_collective_ops local_ops = {
    .abi_version = SL_COLLECTIVE_ABI_VERSION,
    .size = sizeof(sl_collective_ops),
    .name = "local",
    .device_backend = NULL,
    .score = local_score,
    .init = local_init,
    .fini = local_fini,
    .broadcast = local_broadcast,
    .scatterv = local_scatterv,
    .allgather = local_allgather,
    .barrier = local_barrier,
};

const sl_collective_ops *sl__collective_local(void) { return &local_ops; }
