/* nccl: the data collective of the cuda backend (docs/DESIGN.md#modules), a loadable module
 * (libshardload-nccl.so) in the shape of simccl: it moves CUDA device memory only, its ops are
 * stream-ordered (ENQUEUED on the stream they are given, module.h), it bootstraps through the
 * control plane (nccl_init.c) and it aborts. NCCL itself is opened at run time (nccl_lib.c),
 * so the module loads, and probe() explains, where NCCL or the driver is missing. A scatterv is
 * one NCCL group of sends and receives; a scatterv group (module.h) is one group of them all,
 * so that each root's sends run beside the other roots'.
 *
 * Streams: the module pairs with any backend of native API "cuda" (module.h, Native handles)
 * and asks the backend for the cudaStream_t of each stream it is given (SL_EXT_NATIVE_STREAM;
 * NULL, the backend's default stream, included), so the kernels are ordered on the caller's
 * stream as the backend's own ops are. It assumes nothing of what a stream handle is.
 *
 * Failures: every NCCL call is non-blocking (config.blocking = 0) and polled against the
 * timeout; a watchdog thread (nccl_watch.c) aborts the communicator when an op stalls or NCCL
 * reports an error, and the next call on the caller's thread reports why. Aborts and destroys
 * are bounded too (nccl_end.c), and a split's child is written where it outlives the call
 * (nccl_split.c). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_internal.h"

/* "cuda" or "cuda:VARIANT" (SL_GPU_NAME: "hip" for rccl): the native API the rank's backend
 * pairs by (module.h, probe). */
static bool is_cuda(const char *backend) {
  const size_t n = sizeof SL_GPU_NAME - 1;
  return backend && strncmp(backend, SL_GPU_NAME, n) == 0 && (backend[n] == 0 || backend[n] == ':');
}

static int nccl_probe(const char *backend, char *reason, size_t len) {
  char buf[512];
  if (!is_cuda(backend)) {
    snprintf(buf, sizeof buf, SL_CCL_NAME ": moves " SL_GPU_PLATFORM " device memory only; this rank's backend is %s",
             backend ? backend : "(none)");
    goto no;
  }
  if (!sl__nccl_lib(buf, sizeof buf)) goto no;
  /* counts devices without creating a context (the runtime opens libcuda.so.1 here) */
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(buf, sizeof buf, SL_CCL_NAME ": no " SL_GPU_PLATFORM " driver/device (%s: %s)",
                              cudaGetErrorName(e), cudaGetErrorString(e));
    goto no;
  }
  if (n == 0) {
    snprintf(buf, sizeof buf, SL_CCL_NAME ": no " SL_GPU_PLATFORM " driver/device (no device visible; check "
                              SL_GPU_VISIBLE_ENV ")");
    goto no;
  }
  return 1;
no:
  if (reason && len) snprintf(reason, len, "%s", buf);
  return 0;
}

static sl_status nccl_init(const sl_collective_init *in, void **out) {
  if (!in || !out || !in->host) return SL_ERR_INVALID;
  *out = NULL;
  const sl_module_host *h = in->host;
  if (!SL_INIT_HAS(in, control))
    return h->fail(h->core, SL_ERR_ABI,
                   SL_CCL_NAME ": sl_collective_init of %u bytes lacks the backend and control plane of module ABI 2; "
                   "rebuild the caller against this shardload's shardload/module.h",
                   in->size);
  if (in->world_size < 1 || in->rank < 0 || in->rank >= in->world_size)
    return h->fail(h->core, SL_ERR_INVALID, SL_CCL_NAME ": rank %d is not in a job of %d ranks",
                                            in->rank, in->world_size);
  const sl_backend_ops *b = in->backend;
  if (!b || !in->backend_handle || !is_cuda(sl_backend_native_api(b)))
    return h->fail(h->core, SL_ERR_INVALID,
                   SL_CCL_NAME " init on rank %d: needs this rank's backend, of native API " SL_GPU_NAME
                   " (sl_collective_init.backend and backend_handle); it has %s%s%s (use --backend " SL_GPU_NAME
                   ", or --collective gloo)",
                   in->rank, b ? b->name : "none", b && SL_HAS_OP(b, native_api) ? ", native API " : "",
                   b && SL_HAS_OP(b, native_api) ? b->native_api : "");
  if (!SL_HAS_OP(b, get_proc) || !b->get_proc(SL_EXT_NATIVE_STREAM))
    return h->fail(h->core, SL_ERR_UNSUPPORTED,
                   SL_CCL_NAME " init on rank %d: backend %s does not give the " SL_GPU_STREAM_TYPE " of its "
                   "streams (the extension " SL_EXT_NATIVE_STREAM "), which " SL_CCL_PRODUCT "'s kernels must be "
                   "enqueued on; rebuild it against this shardload, or use --collective gloo",
                   in->rank, b->name);
  if (in->world_size > 1 && (!in->control || !in->control->broadcast || !in->control->allgather))
    return h->fail(h->core, SL_ERR_INVALID,
                   SL_CCL_NAME " init on rank %d of %d: no control plane to bootstrap through "
                   "(sl_collective_init.control)",
                   in->rank, in->world_size);
  nccl_comm *c = NULL;
  sl_status st = sl__nccl_init(in, &c);
  if (st == SL_OK) *out = c;
  return st;
}

/* ---- reporting a dead communicator (the caller's thread) ------------------------------------ */

/* Why C died, on every call after. The module never asks the control plane itself: peers that
 * are fine would not make the same call, and the job-wide control plane's sequence would break.
 * The core's next agreement over the control plane (the status window, the closing one) is what
 * names a lost rank, through Gloo's diagnosis. */
sl_status sl__nccl_report_dead(nccl_comm *c, const char *op) {
  const sl_module_host *h = c->host;
  pthread_mutex_lock(&c->mu);
  if (!atomic_load(&c->dead)) /* abort() was called and the watchdog has not acted yet */
    sl__nccl_kill(c, SL_ERR_COMM, SL_CCL_NAME " on rank %d (" SL_GPU_NAME ":%d): aborted (sl_context_abort)",
                                  c->job_rank, c->device);
  sl_status why_st = c->why_status ? c->why_status : SL_ERR_COMM;
  char why[NCCL_MSG_LEN];
  snprintf(why, sizeof why, "%s", c->why);
  pthread_mutex_unlock(&c->mu);
  return h->fail(h->core, why_st, SL_CCL_NAME " %s: %s", op, why);
}

/* ---- issuing an op (caller holds MU) ------------------------------------------------------- */

/* After an NCCL call: waits out ncclInProgress (the enqueue itself, bounded) and kills the
 * communicator on failure (a rank that skips an op would leave its peers' kernels waiting). */
static sl_status after_call(nccl_comm *c, const char *op, ncclResult_t r) {
  char what[NCCL_MSG_LEN / 2];
  sl_status st = SL_OK;
  if (r == ncclInProgress) {
    st = sl__nccl_settle(c, c->comm, what, sizeof what);
  } else if (r != ncclSuccess) {
    sl__nccl_describe(c->L, c->comm, r, what, sizeof what);
    st = SL_ERR_COMM;
  }
  if (st != SL_OK)
    sl__nccl_kill(c, st, SL_CCL_NAME " %s on rank %d (" SL_GPU_NAME ":%d): " SL_CCL_PRODUCT " failed (%s); the "
                         "communicator was aborted", op,
                  c->job_rank, c->device, what);
  return st;
}

static sl_status cuda_step(nccl_comm *c, const char *op, cudaError_t e) {
  if (e == cudaSuccess) return SL_OK;
  sl__nccl_kill(c, SL_ERR_BACKEND, SL_CCL_NAME " %s on rank %d (" SL_GPU_NAME ":%d): %s: %s",
                                   op, c->job_rank, c->device,
                cudaGetErrorName(e), cudaGetErrorString(e));
  return SL_ERR_BACKEND;
}

typedef struct nccl_args {
  const void *send;
  void *recv;
  size_t bytes;
  int root;
  /* scatterv, scatterv group: the items (one for scatterv), read before issue() returns */
  const sl_scatter_item *items;
  int n;
} nccl_args;

typedef enum nccl_op { OP_BROADCAST, OP_SCATTERV, OP_SCATTERV_GROUP, OP_ALLGATHER } nccl_op;
static const char *const op_name[] = {"broadcast", "scatterv", "scatterv group", "allgather"};

/* The NCCL calls of one scatterv inside an open group: its root sends each other rank with
 * bytes its part (its own part is a device copy, after the group); the others receive. */
static ncclResult_t scatter_calls(nccl_comm *c, const sl_scatter_item *it, cudaStream_t s) {
  const sl_nccl_lib *L = c->L;
  ncclResult_t r = ncclSuccess;
  if (c->rank == it->root) {
    for (int p = 0; p < c->world && r == ncclSuccess; p++)
      if (p != it->root && it->counts[p])
        r = L->Send((const char *)it->sendbuf + it->displs[p], it->counts[p], ncclUint8, p, c->comm, s);
  } else if (it->recvbytes) {
    r = L->Recv(it->recvbuf, it->recvbytes, ncclUint8, it->root, c->comm, s);
  }
  return r;
}

/* The NCCL calls of one op on S (caller holds MU, COMM is live). */
static sl_status enqueue(nccl_comm *c, nccl_op op, const nccl_args *a, cudaStream_t s) {
  const sl_nccl_lib *L = c->L;
  const char *name = op_name[op];
  switch (op) {
  case OP_BROADCAST:
    return after_call(c, name, L->Broadcast(a->send, a->recv, a->bytes, ncclUint8, a->root, c->comm, s));
  case OP_ALLGATHER:
    return after_call(c, name, L->AllGather(a->send, a->recv, a->bytes, ncclUint8, c->comm, s));
  case OP_SCATTERV:
  case OP_SCATTERV_GROUP: {
    /* every item's calls in one group, so that each root's sends run beside the others' (a
     * scatterv is a group of one); the root's own part is a copy after it on the stream */
    ncclResult_t r = L->GroupStart();
    if (r == ncclSuccess) {
      for (int i = 0; i < a->n && r == ncclSuccess; i++) r = scatter_calls(c, &a->items[i], s);
      ncclResult_t e = L->GroupEnd(); /* always closes the group it opened */
      if (r == ncclSuccess) r = e;
    }
    sl_status st = after_call(c, name, r);
    for (int i = 0; i < a->n && st == SL_OK; i++) {
      const sl_scatter_item *it = &a->items[i];
      if (c->rank != it->root || !it->recvbytes) continue;
      const char *own = (const char *)it->sendbuf + it->displs[it->root];
      if (own != it->recvbuf)
        st = cuda_step(c, name, c->rt->CopyAsync(it->recvbuf, own, it->recvbytes, s));
    }
    return st;
  }
  }
  return SL_ERR_INVALID;
}

/* Enqueues OP on STREAM and hands it to the watchdog. */
static sl_status issue(nccl_comm *c, nccl_op op, const nccl_args *a, void *stream) {
  const char *name = op_name[op];
  sl__nccl_bind(c);
  pthread_mutex_lock(&c->mu);
  if (atomic_load(&c->dead) || !c->comm) {
    pthread_mutex_unlock(&c->mu);
    return sl__nccl_report_dead(c, name);
  }
  cudaStream_t s = sl__nccl_stream(c, stream);
  sl_status st = enqueue(c, op, a, s);
  if (st == SL_OK) st = sl__nccl_track(c, name, s);
  pthread_mutex_unlock(&c->mu);
  if (atomic_load(&c->dead)) return sl__nccl_report_dead(c, name);
  return st;
}

/* ---- the ops ---------------------------------------------------------------------------- */

static sl_status check_root(nccl_comm *c, const char *op, int root) {
  if (root >= 0 && root < c->world) return SL_OK;
  return c->host->fail(c->host->core, SL_ERR_INVALID, SL_CCL_NAME " %s on rank %d: root %d is not a rank of %d", op,
                       c->job_rank, root, c->world);
}

static sl_status nccl_broadcast(void *comm, void *buf, size_t bytes, int root, void *stream) {
  nccl_comm *c = comm;
  sl_status st;
  if (atomic_load(&c->dead) || sl__nccl_aborted(c)) return sl__nccl_report_dead(c, "broadcast");
  if ((st = check_root(c, "broadcast", root)) != SL_OK) return st;
  if (bytes == 0) return SL_OK;
  nccl_args a = {.send = buf, .recv = buf, .bytes = bytes, .root = root};
  return issue(c, OP_BROADCAST, &a, stream);
}

/* The items of a scatterv (one) or a scatterv group (module.h): 1 to SL_SCATTER_GROUP_MAX of
 * them, from distinct roots of C, and the item this rank roots sends it what it receives. */
static sl_status check_items(nccl_comm *c, const char *op, const sl_scatter_item *it, int n) {
  if (n < 1 || n > SL_SCATTER_GROUP_MAX || !it)
    return c->host->fail(c->host->core, SL_ERR_INVALID, SL_CCL_NAME " %s on rank %d: %d items; give 1 to %d", op,
                         c->job_rank, n, SL_SCATTER_GROUP_MAX);
  sl_status st;
  for (int i = 0; i < n; i++) {
    if ((st = check_root(c, op, it[i].root)) != SL_OK) return st;
    for (int k = 0; k < i; k++)
      if (it[k].root == it[i].root)
        return c->host->fail(c->host->core, SL_ERR_INVALID,
                             SL_CCL_NAME " %s on rank %d: items %d and %d have the same root %d", op, c->job_rank, k,
                             i, it[i].root);
    if (it[i].root == c->rank && it[i].counts[c->rank] != it[i].recvbytes)
      return c->host->fail(c->host->core, SL_ERR_INVALID,
                           SL_CCL_NAME " %s on rank %d: the root sends itself %zu bytes but receives %zu", op,
                           c->job_rank, it[i].counts[c->rank], it[i].recvbytes);
  }
  return SL_OK;
}

/* counts and displs are read before issue() returns: nothing keeps them (module.h) */
static sl_status nccl_scatterv(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs,
                               void *recvbuf, size_t recvbytes, int root, void *stream) {
  nccl_comm *c = comm;
  sl_status st;
  if (atomic_load(&c->dead) || sl__nccl_aborted(c)) return sl__nccl_report_dead(c, "scatterv");
  sl_scatter_item it = {sizeof it, sendbuf, counts, displs, recvbuf, recvbytes, root};
  if ((st = check_items(c, "scatterv", &it, 1)) != SL_OK) return st;
  nccl_args a = {.items = &it, .n = 1};
  return issue(c, OP_SCATTERV, &a, stream);
}

/* N scatterv's as one NCCL group (module.h): this rank's sends, as the root of its item, and its
 * receives from every other item's root are enqueued together, so that no root's bytes wait for
 * another's. Items and their counts and displs are read before issue() returns. */
static sl_status nccl_scatterv_group(void *comm, const sl_scatter_item *given, int n, void *stream) {
  nccl_comm *c = comm;
  sl_status st;
  if (atomic_load(&c->dead) || sl__nccl_aborted(c)) return sl__nccl_report_dead(c, "scatterv group");
  sl_scatter_item items[SL_SCATTER_GROUP_MAX];
  if (n >= 1 && n <= SL_SCATTER_GROUP_MAX && given && !sl_scatter_items_read(given, n, items))
    return c->host->fail(c->host->core, SL_ERR_ABI,
                         SL_CCL_NAME " scatterv group on rank %d: items of %zu bytes are older than this module "
                         "knows; rebuild the caller against this shardload's shardload/module.h",
                         c->job_rank, given[0].size);
  if ((st = check_items(c, "scatterv group", given ? items : NULL, n)) != SL_OK) return st;
  nccl_args a = {.items = items, .n = n};
  return issue(c, OP_SCATTERV_GROUP, &a, stream);
}

static sl_status nccl_allgather(void *comm, const void *sendbuf, void *recvbuf, size_t bytes, void *stream) {
  nccl_comm *c = comm;
  size_t total;
  if (atomic_load(&c->dead) || sl__nccl_aborted(c)) return sl__nccl_report_dead(c, "allgather");
  if (__builtin_mul_overflow(bytes, (size_t)c->world, &total))
    return c->host->fail(c->host->core, SL_ERR_INVALID, SL_CCL_NAME " allgather on rank %d: %zu bytes x %d ranks "
                                                        "overflows",
                         c->job_rank, bytes, c->world);
  if (bytes == 0) return SL_OK;
  nccl_args a = {.send = sendbuf, .recv = recvbuf, .bytes = bytes};
  return issue(c, OP_ALLGATHER, &a, stream);
}

/* Complete on return: every op issued before it completed here, then a one-byte allgather on
 * the module's stream completed on every rank. Both waits are bounded by the watchdog. */
static sl_status nccl_barrier(void *comm) {
  nccl_comm *c = comm;
  sl__nccl_bind(c);
  if (atomic_load(&c->dead) || sl__nccl_aborted(c)) return sl__nccl_report_dead(c, "barrier");
  if (sl__nccl_drain(c, "barrier") != SL_OK) return sl__nccl_report_dead(c, "barrier");
  nccl_args a = {.send = (char *)c->barrier_buf + c->rank, .recv = c->barrier_buf, .bytes = 1};
  pthread_mutex_lock(&c->mu);
  sl_status st = SL_ERR_COMM;
  if (!atomic_load(&c->dead) && c->comm) {
    cudaStream_t s = sl__nccl_stream(c, c->own_stream);
    st = enqueue(c, OP_ALLGATHER, &a, s);
    if (st == SL_OK) st = sl__nccl_track(c, "barrier", s);
  }
  pthread_mutex_unlock(&c->mu);
  if (st == SL_OK) st = sl__nccl_drain(c, "barrier");
  return st == SL_OK ? SL_OK : sl__nccl_report_dead(c, "barrier");
}

/* Async-signal-safe: one atomic store. The watchdog sees it within 100 ms and calls
 * ncclCommAbort (which is not signal-safe); a caller polling NCCL sees it at once. */
static void nccl_abort(void *comm) {
  nccl_comm *c = comm;
  if (c) atomic_store(&c->abort_req, 1);
}

/* Healthy: ncclCommFinalize (flushes NCCL's work, polled) then ncclCommDestroy; else
 * ncclCommAbort. Each bounded by the timeout (nccl_end.c): a communicator that a stuck kernel
 * keeps from ending is left behind with a warning, so teardown ends. Then the children of a
 * failed split that have landed since (nccl_split.c). */
static void nccl_fini(void *comm) {
  nccl_comm *c = comm;
  if (!c) return;
  sl__nccl_bind(c);
  if (!atomic_load(&c->dead)) sl__nccl_drain(c, "fini");
  sl__nccl_watch_stop(c); /* from here on only this thread calls NCCL */
  if (c->comm && !atomic_load(&c->dead) && !sl__nccl_aborted(c)) {
    char what[NCCL_MSG_LEN / 2];
    ncclResult_t r = c->L->CommFinalize(c->comm);
    sl_status st = r == ncclSuccess || r == ncclInProgress ? sl__nccl_settle(c, c->comm, what, sizeof what) : SL_ERR_COMM;
    int left_ms = 0;
    if (st == SL_OK && (sl__nccl_end(c, c->comm, true, sl__nccl_wait_ms(c), &left_ms) == ncclSuccess || left_ms)) {
      c->comm = NULL;
      if (left_ms) {
        c->leaked = true;
        c->leaked_call = "ncclCommDestroy";
        c->leaked_ms = left_ms;
      }
    } else {
      sl__nccl_kill(c, st != SL_OK ? st : SL_ERR_COMM,
                    SL_CCL_NAME " fini on rank %d (" SL_GPU_NAME ":%d): ncclCommFinalize failed; aborted",
                    c->job_rank, c->device);
    }
  }
  if (c->comm) sl__nccl_kill(c, SL_ERR_COMM, SL_CCL_NAME " fini on rank %d (" SL_GPU_NAME ":%d): aborted",
                                             c->job_rank, c->device);
  sl__nccl_settle_children(c);
  const sl_module_host *h = c->host;
  if (atomic_load(&c->dead) && h->log)
    h->log(h->core, SL_LOG_DEBUG, SL_CCL_NAME " fini on rank %d: communicator was aborted (%s)", c->job_rank, c->why);
  if (c->leaked && h->log)
    h->log(h->core, SL_LOG_WARN,
           SL_CCL_NAME " fini on rank %d (" SL_GPU_NAME ":%d): %s did not return within %d ms (what it waits for, a "
           "kernel on the device or a peer, did not end); the communicator and its stream are left behind (leaked) so "
           "that teardown ends",
           c->job_rank, c->device, c->leaked_call, c->leaked_ms);
  sl__nccl_comm_free(c);
}

/* Collective over C, complete on return (nccl_split.c). */
static sl_status nccl_split(void *comm, int color, int key, void **out) {
  return sl__nccl_split(comm, color, key, out);
}

static const sl_collective_ops nccl_ops = {
    .abi_version = SL_COLLECTIVE_ABI_VERSION,
    .size = sizeof(sl_collective_ops),
    .name = SL_CCL_NAME,
    .flags = 0, /* stream-ordered */
    .domains = SL_MEM_DEVICE,
    .device_backend = SL_GPU_NAME,
    .probe = nccl_probe,
    .init = nccl_init,
    .fini = nccl_fini,
    .abort = nccl_abort,
    .split = nccl_split,
    .broadcast = nccl_broadcast,
    .scatterv = nccl_scatterv,
    .allgather = nccl_allgather,
    .barrier = nccl_barrier,
    .scatterv_group = nccl_scatterv_group,
};

__attribute__((visibility("default"))) const sl_collective_ops *sl_collective_module_v2(void) { return &nccl_ops; }
