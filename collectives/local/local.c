/* The world-size-1 collective: the loader always moves data through a collective, so a single
 * rank runs the same code path as a job of thousands. Host memory, synchronous
 * (docs/DESIGN.md#modules): every op is complete on return and ignores its stream. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct local_comm {
  const sl_module_host *host;
  atomic_int aborted;
} local_comm;

/* Runs with any backend: nothing crosses a boundary. */
static int local_probe(const char *backend, char *reason, size_t len) { return 1; }

static sl_status local_new(const sl_module_host *host, void **comm) {
  local_comm *c = calloc(1, sizeof *c);
  if (!c) return host->fail(host->core, SL_ERR_NOMEM, "local collective: out of memory");
  c->host = host;
  atomic_init(&c->aborted, 0);
  *comm = c;
  return SL_OK;
}

static sl_status local_init(const sl_collective_init *init, void **comm) {
  *comm = NULL;
  if (!init->host) return SL_ERR_INVALID;
  if (init->size < offsetof(sl_collective_init, backend))
    return init->host->fail(init->host->core, SL_ERR_ABI,
                            "local collective: sl_collective_init of %u bytes is older than module ABI 2; rebuild "
                            "the caller against this shardload's shardload/module.h",
                            init->size);
  if (init->world_size != 1)
    return init->host->fail(init->host->core, SL_ERR_INVALID,
                            "the local collective serves one rank; this job has %d", init->world_size);
  return local_new(init->host, comm);
}

static void local_fini(void *comm) { free(comm); }

/* Async-signal-safe: one atomic store. */
static void local_abort(void *comm) {
  if (comm) atomic_store(&((local_comm *)comm)->aborted, 1);
}

/* Every op of an aborted communicator fails, as with every other collective. */
static sl_status check(local_comm *c, const char *op) {
  if (!atomic_load(&c->aborted)) return SL_OK;
  return c->host->fail(c->host->core, SL_ERR_COMM, "local %s: aborted (sl_context_abort)", op);
}

/* One rank: the group of every color >= 0 is this rank alone. */
static sl_status local_split(void *comm, int color, int key, void **sub) {
  local_comm *c = comm;
  *sub = NULL;
  sl_status st = check(c, "split");
  if (st != SL_OK || color < 0) return st;
  return local_new(c->host, sub);
}

static sl_status bad_root(local_comm *c, const char *op, int root) {
  return c->host->fail(c->host->core, SL_ERR_INVALID, "local %s: root %d is not a rank of 1", op, root);
}

static sl_status local_broadcast(void *comm, void *buf, size_t bytes, int root, void *stream) {
  sl_status st = check(comm, "broadcast");
  if (st == SL_OK && root != 0) st = bad_root(comm, "broadcast", root);
  return st;
}

static sl_status local_scatterv(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs,
                                void *recvbuf, size_t recvbytes, int root, void *stream) {
  local_comm *c = comm;
  sl_status st = check(c, "scatterv");
  if (st != SL_OK) return st;
  if (root != 0) return bad_root(c, "scatterv", root);
  if (counts[0] != recvbytes)
    return c->host->fail(c->host->core, SL_ERR_INVALID,
                         "local scatterv: the root sends itself %zu bytes but receives %zu", counts[0], recvbytes);
  const char *src = (const char *)sendbuf + displs[0];
  if (recvbytes && src != recvbuf) memmove(recvbuf, src, recvbytes);
  return SL_OK;
}

static sl_status local_allgather(void *comm, const void *sendbuf, void *recvbuf, size_t bytes, void *stream) {
  sl_status st = check(comm, "allgather");
  if (st == SL_OK && bytes && sendbuf != recvbuf) memmove(recvbuf, sendbuf, bytes);
  return st;
}

static sl_status local_barrier(void *comm) { return check(comm, "barrier"); }

static const sl_collective_ops local_ops = {
    .abi_version = SL_COLLECTIVE_ABI_VERSION,
    .size = sizeof(sl_collective_ops),
    .name = "local",
    .flags = SL_COLL_SYNC,
    .domains = SL_MEM_HOST | SL_MEM_PINNED,
    .device_backend = NULL,
    .probe = local_probe,
    .init = local_init,
    .fini = local_fini,
    .abort = local_abort,
    .split = local_split,
    .broadcast = local_broadcast,
    .scatterv = local_scatterv,
    .allgather = local_allgather,
    .barrier = local_barrier,
};

const sl_collective_ops *sl__collective_local(void) { return &local_ops; }
