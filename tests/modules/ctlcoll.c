/* An out-of-tree ABI v2 data collective that no shardload build lists (tests/test_modules.c):
 * host memory, synchronous, any world size, moving the bytes through the control plane the
 * core lends a data collective to bootstrap through (sl_collective_init.control). A backend
 * that prefers it (hostmem.c built with SL_TEST_PREFERRED="ctlcoll") shows that `auto` takes
 * a backend's preferred collective by what its file says, not by the core's list of names.
 * Built against the installed headers alone, like any vendor module. */
#include <stdlib.h>
#include <string.h>

#include <shardload/module.h>

typedef struct ctlcoll {
  const sl_module_host *host;
  const sl_control_plane *cp;
  int rank, world;
} ctlcoll;

static int cc_probe(const char *backend, char *reason, size_t len) { return 1; }

static sl_status cc_init(const sl_collective_init *init, void **comm) {
  const sl_module_host *h = init->host;
  *comm = NULL;
  if (init->size < offsetof(sl_collective_init, control) + sizeof init->control)
    return h->fail(h->core, SL_ERR_ABI, "ctlcoll: sl_collective_init of %u bytes has no control plane", init->size);
  if (init->world_size > 1 && (!init->control || !init->control->broadcast || !init->control->allgather))
    return h->fail(h->core, SL_ERR_INVALID, "ctlcoll init on rank %d: no control plane to move bytes through",
                   init->rank);
  ctlcoll *c = calloc(1, sizeof *c);
  if (!c) return h->fail(h->core, SL_ERR_NOMEM, "ctlcoll: out of memory");
  *c = (ctlcoll){h, init->control, init->rank, init->world_size};
  *comm = c;
  return SL_OK;
}

static void cc_fini(void *comm) { free(comm); }

static sl_status cc_broadcast(void *comm, void *buf, size_t bytes, int root, void *stream) {
  ctlcoll *c = comm;
  if (c->world == 1 || !bytes) return SL_OK;
  return c->cp->broadcast(c->cp->ctx, buf, bytes, root);
}

/* The root's counts and displacements first, then the part of its buffer they span. */
static sl_status cc_scatterv(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs,
                             void *recvbuf, size_t recvbytes, int root, void *stream) {
  ctlcoll *c = comm;
  if (c->world == 1) {
    if (recvbytes) memmove(recvbuf, (const char *)sendbuf + displs[0], recvbytes);
    return SL_OK;
  }
  size_t n = (size_t)c->world, *layout = calloc(2 * n, sizeof *layout);
  if (!layout) return c->host->fail(c->host->core, SL_ERR_NOMEM, "ctlcoll scatterv: out of memory");
  if (c->rank == root) {
    memcpy(layout, counts, n * sizeof *layout);
    memcpy(layout + n, displs, n * sizeof *layout);
  }
  sl_status st = c->cp->broadcast(c->cp->ctx, layout, 2 * n * sizeof *layout, root);
  size_t extent = 0;
  for (size_t r = 0; st == SL_OK && r < n; r++)
    if (layout[r] && layout[n + r] + layout[r] > extent) extent = layout[n + r] + layout[r];
  char *all = st == SL_OK && extent ? malloc(extent) : NULL;
  if (st == SL_OK && extent && !all) st = c->host->fail(c->host->core, SL_ERR_NOMEM, "ctlcoll scatterv: out of memory");
  if (st == SL_OK && extent) {
    if (c->rank == root) memcpy(all, sendbuf, extent);
    st = c->cp->broadcast(c->cp->ctx, all, extent, root);
  }
  if (st == SL_OK && recvbytes) memcpy(recvbuf, all + layout[n + (size_t)c->rank], recvbytes);
  free(all);
  free(layout);
  return st;
}

static sl_status cc_allgather(void *comm, const void *sendbuf, void *recvbuf, size_t bytes, void *stream) {
  ctlcoll *c = comm;
  if (!bytes) return SL_OK;
  if (c->world == 1) {
    memmove(recvbuf, sendbuf, bytes);
    return SL_OK;
  }
  return c->cp->allgather(c->cp->ctx, sendbuf, recvbuf, bytes);
}

static sl_status cc_barrier(void *comm) {
  ctlcoll *c = comm;
  if (c->world == 1) return SL_OK;
  char one = 1, *all = malloc((size_t)c->world);
  if (!all) return c->host->fail(c->host->core, SL_ERR_NOMEM, "ctlcoll barrier: out of memory");
  sl_status st = c->cp->allgather(c->cp->ctx, &one, all, 1);
  free(all);
  return st;
}

static const sl_collective_ops ctlcoll_ops = {
    .abi_version = SL_COLLECTIVE_ABI_VERSION,
    .size = sizeof(sl_collective_ops),
    .name = "ctlcoll",
    .flags = SL_COLL_SYNC,
    .domains = SL_MEM_HOST | SL_MEM_PINNED,
    .probe = cc_probe,
    .init = cc_init,
    .fini = cc_fini,
    .broadcast = cc_broadcast,
    .scatterv = cc_scatterv,
    .allgather = cc_allgather,
    .barrier = cc_barrier,
};

__attribute__((visibility("default"))) const sl_collective_ops *sl_collective_module_v2(void) { return &ctlcoll_ops; }
