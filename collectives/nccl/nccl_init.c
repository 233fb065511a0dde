/* nccl: bootstrap. Every rank first reports over the control plane whether it can run NCCL
 * and on which GPU (so one rank's missing driver, or two ranks on one GPU, fails every rank at
 * once with the same message instead of leaving the others in ncclCommInitRank until the
 * timeout), then rank 0's unique id goes round and the communicator forms non-blocking, polled
 * against the timeout. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_internal.h"

#define BUSID_LEN 32
#define HOST_LEN 64
#define WHY_LEN 320

/* What each rank says about itself before NCCL starts (fixed size: an allgather record). */
typedef struct nccl_ready {
  int32_t ok;
  int32_t device;
  char busid[BUSID_LEN];
  char host[HOST_LEN];
  char why[WHY_LEN];
} nccl_ready;

/* Rank 0's unique id, or why it has none. */
typedef struct nccl_uid {
  int32_t ok;
  ncclUniqueId id;
  char why[WHY_LEN];
} nccl_uid;

static void nap(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The vendor runtime's calls of the data path (sl_nccl_rt), wrapped: under HIP their names are
 * macros over the runtime opened at run time (vendor_hip.h), which have no address. */
static cudaError_t rt_event_create(cudaEvent_t *ev) { return cudaEventCreateWithFlags(ev, cudaEventDisableTiming); }
static cudaError_t rt_event_record(cudaEvent_t ev, cudaStream_t s) { return cudaEventRecord(ev, s); }
static cudaError_t rt_event_query(cudaEvent_t ev) { return cudaEventQuery(ev); }
static cudaError_t rt_event_destroy(cudaEvent_t ev) { return cudaEventDestroy(ev); }
static cudaError_t rt_copy_async(void *dst, const void *src, size_t bytes, cudaStream_t s) {
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
}
const sl_nccl_rt sl__nccl_rt = {rt_event_create, rt_event_record, rt_event_query, rt_event_destroy, rt_copy_async};

nccl_comm *sl__nccl_comm_new(const sl_module_host *host, const sl_nccl_lib *L, const sl_backend_ops *be_ops, void *be,
                             int device, int timeout_ms) {
  nccl_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->host = host;
  c->L = L;
  c->rt = &sl__nccl_rt;
  c->be_ops = be_ops;
  c->be = be;
  /* checked at init (nccl.c): a backend of native API cuda hands out its streams' handles */
  if (be_ops && SL_HAS_OP(be_ops, get_proc))
    c->native = (sl_ext_native_stream_fn)be_ops->get_proc(SL_EXT_NATIVE_STREAM);
  c->device = device;
  c->timeout_ms = timeout_ms;
  c->world = 1;
  pthread_mutex_init(&c->mu, NULL);
  pthread_condattr_t ca; /* the watchdog's naps follow the monotonic clock: a clock step cannot stretch them */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->wake, &ca);
  pthread_condattr_destroy(&ca);
  atomic_init(&c->abort_req, 0);
  atomic_init(&c->dead, 0);
  atomic_init(&c->left_behind, false);
  return c;
}

/* The module's own (static) CUDA runtime has its own current device per thread: every entry
 * from a caller's thread selects the communicator's device before any CUDA call, so that events
 * and copies land on it (not on device 0, where a context would cost every rank memory). */
void sl__nccl_bind(const nccl_comm *c) {
  if (c && c->device >= 0) (void)cudaSetDevice(c->device);
}

cudaStream_t sl__nccl_stream(const nccl_comm *c, void *stream) { return (cudaStream_t)c->native(c->be, stream); }

/* Frees what the communicator owns besides COMM (destroyed or aborted by the caller, so no
 * kernel of it still waits for a peer): the watchdog, the events, the barrier's buffer and the
 * module's stream (the backend's stream_destroy finishes its work first, bounded). */
void sl__nccl_comm_free(nccl_comm *c) {
  sl__nccl_bind(c);
  sl__nccl_watch_stop(c);
  for (int i = 0; i < c->q_len; i++) c->rt->EventDestroy(c->q[(c->q_head + i) % NCCL_MAX_PENDING].ev);
  for (int i = 0; i < c->n_spare; i++) c->rt->EventDestroy(c->spare[i]);
  /* An abort or destroy that outlived its bound (nccl_end.c) leaves kernels of COMM that may
   * still run on the module's stream, reading the barrier's buffer and waiting on its events:
   * those stay behind with it, since destroying the stream would first wait for kernels that do
   * not end. The backend is told to give the stream up (SL_EXT_STREAM_ABANDON), or each of its
   * later waits (the loader's, the synchronize before its fini) would wait its sync timeout for
   * it; a backend without the extension waits, bounded. */
  if (c->leaked && c->own_stream) {
    sl_ext_stream_abandon_fn abandon =
        SL_HAS_OP(c->be_ops, get_proc) ? (sl_ext_stream_abandon_fn)c->be_ops->get_proc(SL_EXT_STREAM_ABANDON) : NULL;
    if (abandon) abandon(c->be, c->own_stream);
  }
  if (!c->leaked) {
    /* stream-ordered: no device-wide synchronisation (cudaFree's) that a stuck kernel could hang */
    if (c->barrier_buf) cudaFreeAsync(c->barrier_buf, sl__nccl_stream(c, c->own_stream));
    /* an aborted communicator's kernels have exited (ncclCommAbort), so this does not hang */
    if (c->own_stream) c->be_ops->stream_destroy(c->be, c->own_stream);
  }
  pthread_cond_destroy(&c->wake);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* Polls a non-blocking communicator until its pending call (init, split, finalize) is done.
 * SL_OK, or the communicator is left for the caller to abort and WHAT says what NCCL said. */
sl_status sl__nccl_settle(nccl_comm *c, ncclComm_t comm, char *what, size_t len) {
  struct timespec until;
  until = sl_deadline_in_ms(sl__nccl_wait_ms(c)).at;
  return sl__nccl_settle_until(c, comm, &until, what, len);
}

sl_status sl__nccl_settle_until(nccl_comm *c, ncclComm_t comm, const struct timespec *until, char *what,
                                size_t len) {
  int ms = 1;
  for (;;) {
    ncclResult_t a = ncclInProgress;
    ncclResult_t r = c->L->CommGetAsyncError(comm, &a);
    if (r != ncclSuccess) a = r;
    if (a == ncclSuccess) return SL_OK;
    if (a != ncclInProgress) {
      sl__nccl_describe(c->L, comm, a, what, len);
      return SL_ERR_COMM;
    }
    if (sl__nccl_aborted(c)) { /* this communicator's abort, or its parent's */
      snprintf(what, len, "aborted (sl_context_abort)");
      return SL_ERR_COMM;
    }
    if (sl_ms_since(until) > 0) {
      snprintf(what, len, "no answer within %d ms", sl__nccl_wait_ms(c));
      return SL_ERR_TIMEOUT;
    }
    nap(ms);
    if (ms < 16) ms *= 2;
  }
}

/* This rank's verdict before NCCL starts: the library, the device, the GPU's bus id. */
static void ready_here(const sl_collective_init *in, int device, const sl_nccl_lib *L, const char *lib_why,
                       nccl_ready *me) {
  memset(me, 0, sizeof *me);
  me->device = device;
  gethostname(me->host, sizeof me->host - 1);
  if (!L) {
    snprintf(me->why, sizeof me->why, "%s", lib_why);
    return;
  }
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaDeviceGetPCIBusId(me->busid, sizeof me->busid, device);
  if (e != cudaSuccess) {
    snprintf(me->why, sizeof me->why, "cannot use " SL_GPU_NAME ":%d (%s: %s); check the driver and the device "
                                      "ordinal (--device, " SL_GPU_VISIBLE_ENV "), or use --collective gloo",
             device, cudaGetErrorName(e), cudaGetErrorString(e));
    return;
  }
  me->ok = 1;
}

/* Every rank's verdict; fails identically on every rank when one cannot run NCCL or two share
 * a GPU (NCCL refuses that, after a long hang on some versions). */
static sl_status agree_ready(const sl_collective_init *in, nccl_ready *me) {
  const sl_module_host *h = in->host;
  int W = in->world_size, R = in->rank;
  if (W == 1)
    return me->ok ? SL_OK : h->fail(h->core, SL_ERR_NO_DEVICE, SL_CCL_NAME " init on rank %d: %s", R, me->why);
  nccl_ready *all = calloc((size_t)W, sizeof *all);
  if (!all) return h->fail(h->core, SL_ERR_NOMEM, SL_CCL_NAME " init on rank %d: out of memory", R);
  sl_status st = in->control->allgather(in->control->ctx, me, all, sizeof *me);
  if (st != SL_OK) goto out; /* the control plane's message names the rank it lost */
  for (int r = 0; r < W && st == SL_OK; r++) {
    all[r].why[WHY_LEN - 1] = 0;
    all[r].busid[BUSID_LEN - 1] = all[r].host[HOST_LEN - 1] = 0;
    if (!all[r].ok)
      st = h->fail(h->core, r == R ? SL_ERR_NO_DEVICE : SL_ERR_PEER, SL_CCL_NAME " init on rank %d: rank %d cannot "
                                                                     "run " SL_CCL_PRODUCT ": %s",
                   R, r, all[r].why);
  }
  for (int a = 0; a < W && st == SL_OK; a++)
    for (int b = a + 1; b < W && st == SL_OK; b++)
      if (strcmp(all[a].busid, all[b].busid) == 0 && strcmp(all[a].host, all[b].host) == 0)
        st = h->fail(h->core, SL_ERR_UNSUPPORTED,
                     SL_CCL_NAME ": ranks %d and %d share GPU %s on %s; " SL_CCL_PRODUCT " needs one GPU per rank "
                     "(use --collective gloo, or give each rank its own --device)",
                     a, b, all[a].busid, all[a].host);
out:
  free(all);
  return st;
}

/* Rank 0's unique id to every rank (a failure to make one fails every rank). */
static sl_status share_uid(const sl_collective_init *in, const sl_nccl_lib *L, ncclUniqueId *id) {
  const sl_module_host *h = in->host;
  nccl_uid u;
  memset(&u, 0, sizeof u);
  if (in->rank == 0) {
    ncclResult_t r = L->GetUniqueId(&u.id);
    if (r == ncclSuccess) u.ok = 1;
    else sl__nccl_describe(L, NULL, r, u.why, sizeof u.why);
  }
  if (in->world_size > 1) {
    sl_status st = in->control->broadcast(in->control->ctx, &u, sizeof u, 0);
    if (st != SL_OK) return st;
  }
  u.why[WHY_LEN - 1] = 0;
  if (!u.ok)
    return h->fail(h->core, SL_ERR_COMM, SL_CCL_NAME " init on rank %d: rank 0 could not make an " SL_CCL_PRODUCT " "
                                         "unique id (%s)", in->rank,
                   u.why);
  *id = u.id;
  return SL_OK;
}

/* The non-blocking config every communicator of this module uses. */
void sl__nccl_config(ncclConfig_t *cfg) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0; /* calls return ncclInProgress; this module polls them against the timeout */
  *cfg = c;
}

/* The resources of a formed communicator: the barrier's stream and buffer, the watchdog. */
sl_status sl__nccl_comm_resources(nccl_comm *c) {
  const sl_module_host *h = c->host;
  sl__nccl_bind(c);
  sl_status st = c->be_ops->stream_create(c->be, &c->own_stream);
  if (st != SL_OK) return st; /* the backend has said why */
  /* stream-ordered on the stream the barrier runs on, and freed the same way (comm_free) */
  cudaError_t e = cudaMallocAsync(&c->barrier_buf, (size_t)c->world, sl__nccl_stream(c, c->own_stream));
  if (e != cudaSuccess) {
    c->barrier_buf = NULL;
    return h->fail(h->core, SL_ERR_NOMEM, SL_CCL_NAME " init on rank %d (" SL_GPU_NAME ":%d): cannot allocate %d "
                                          "bytes (%s)", c->job_rank,
                   c->device, c->world, cudaGetErrorString(e));
  }
  if (sl__nccl_watch_start(c) != SL_OK)
    return h->fail(h->core, SL_ERR_NOMEM, SL_CCL_NAME " init on rank %d: cannot start the watchdog thread",
                                          c->job_rank);
  return SL_OK;
}

sl_status sl__nccl_init(const sl_collective_init *in, nccl_comm **out) {
  const sl_module_host *h = in->host;
  char lib_why[512] = "";
  const sl_nccl_lib *L = sl__nccl_lib(lib_why, sizeof lib_why);
  int device = in->device;
  if (device < 0 && in->backend->device_ordinal) device = in->backend->device_ordinal(in->backend_handle);
  if (device < 0) device = 0;

  nccl_ready me;
  ready_here(in, device, L, lib_why, &me);
  sl_status st = agree_ready(in, &me);
  if (st != SL_OK) return st;
  ncclUniqueId id;
  if ((st = share_uid(in, L, &id)) != SL_OK) return st;

  nccl_comm *c = sl__nccl_comm_new(h, L, in->backend, in->backend_handle, device, in->timeout_ms);
  if (!c) return h->fail(h->core, SL_ERR_NOMEM, SL_CCL_NAME " init on rank %d: out of memory", in->rank);
  c->rank = c->job_rank = in->rank;
  c->world = in->world_size;
  c->control = in->control;
  ncclConfig_t cfg;
  sl__nccl_config(&cfg);
  ncclComm_t comm = NULL;
  char what[512] = "";
  ncclResult_t r = L->CommInitRankConfig(&comm, c->world, id, c->rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    sl__nccl_describe(L, comm, r, what, sizeof what);
    st = SL_ERR_COMM;
  } else {
    st = sl__nccl_settle(c, comm, what, sizeof what);
  }
  if (st != SL_OK) {
    int left_ms; /* nothing of COMM runs on the module's stream yet (it has none) */
    if (comm) (void)sl__nccl_end(c, comm, false, sl__nccl_wait_ms(c), &left_ms);
    sl__nccl_comm_free(c);
    return h->fail(h->core, st,
                   SL_CCL_NAME " init on rank %d of %d (" SL_GPU_NAME ":%d, GPU %s): the communicator did not form: "
                   "%s; a peer rank may have failed or be unreachable (check NCCL_SOCKET_IFNAME, run with "
                   "NCCL_DEBUG=WARN), or use --collective gloo",
                   in->rank, in->world_size, device, me.busid, what);
  }
  c->comm = comm;
  if ((st = sl__nccl_comm_resources(c)) != SL_OK) {
    int left_ms; /* no op was issued: nothing of COMM runs on the module's stream */
    (void)sl__nccl_end(c, comm, false, sl__nccl_wait_ms(c), &left_ms);
    c->comm = NULL;
    sl__nccl_comm_free(c);
    return st;
  }
  int ver = 0;
  L->GetVersion(&ver);
  if (h->log)
    h->log(h->core, SL_LOG_DEBUG, SL_CCL_NAME ": rank %d of %d on " SL_GPU_NAME ":%d (GPU %s), " SL_CCL_PRODUCT " %d",
           c->rank, c->world, device, me.busid, ver);
  *out = c;
  return SL_OK;
}
