/* simccl: the device-memory collective of the sim backend, the stand-in for NCCL on machines
 * without a GPU, so that CI drives the loader's whole device route (docs/DESIGN.md#modules,
 * #data-flow). Like NCCL it moves device memory only, its ops are stream-ordered (enqueued
 * on a sim stream, complete when an event recorded after them completes), it bootstraps
 * through the control plane and it aborts. Underneath, a Gloo communicator of its own moves
 * the bytes: each op is a host function on the stream (the backend's launch_host_fn, as
 * cudaLaunchHostFunc) that opens the buffers for host access (SL_EXT_HOST_ACCESS: sim:strict
 * keeps device memory unreadable otherwise), runs the Gloo call on the raw pointers and closes
 * them again. A caller that does not make the stream wait for the copy that filled a send
 * buffer therefore sends stale bytes, as it would with NCCL.
 *
 * Wiring: like NCCL it is paired with its backend by the native API ("sim", device_backend)
 * and reaches the backend only through its table and extensions (module.h), never through the
 * sim's internals: any backend of native API "sim" that offers launch_host_fn, is_device_ptr
 * and SL_EXT_HOST_ACCESS serves. The host function takes the backend's own streams, so no
 * native stream is needed (NCCL needs one for its kernels; sim's native streams are its
 * streams).
 *
 * Ordering: the ops of one communicator must be issued in the same order on every rank (as
 * with NCCL). They run on the inner communicator one at a time and in that order, whatever
 * streams carry them: each takes a ticket when it is issued and waits for its turn when its
 * stream reaches it, so two streams cannot make ranks pair different calls. A turn that does
 * not come within the timeout (a stream waits for work queued after an op of another stream)
 * fails that op and every later one.
 *
 * Threads: tasks run on the sim's stream workers. They never write the context's message
 * (module.h, Threads: the host's fail belongs to the threads of the core's calls): the inner
 * Gloo communicator reports into a per-thread buffer, and a failed task writes that message
 * into its host function's ERR, which the backend reports, as the stream's sticky error, at
 * the next sync. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "shardload/module_util.h"

typedef struct simccl_comm {
  const sl_module_host *host; /* the core's: messages on the caller's thread only */
  sl_module_host inner_host;  /* what the inner Gloo communicator reports through */
  const sl_backend_ops *be_ops;
  void *be;
  sl_ext_host_access_fn access; /* the backend's SL_EXT_HOST_ACCESS */
  int rank, world, timeout_ms;
  int job_rank; /* this rank in the job (a sub's rank is its place in its group) */
  const sl_collective_ops *gloo;
  void *inner; /* the Gloo communicator; NULL for a job of one rank */
  struct simccl_comm *parent;
  pthread_mutex_t run_mu;  /* one inner call at a time, whichever thread makes it */
  pthread_mutex_t pend_mu; /* guards PENDING, ISSUED, TURN, OUT_OF_ORDER */
  pthread_cond_t changed;  /* PENDING or TURN moved */
  int pending;             /* tasks enqueued and not yet freed */
  uint64_t issued, turn;   /* tickets handed out at the call; the ticket whose turn it is */
  bool out_of_order;       /* a turn never came: the sequence is broken for good */
  atomic_int aborted;
} simccl_comm;

/* What the inner communicator last reported on this thread. */
static _Thread_local char t_msg[SL__ERRMSG_LEN];

static sl_status inner_fail(void *core, sl_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_msg, sizeof t_msg, fmt, ap);
  va_end(ap);
  return s;
}

/* The core's logger may be called from any thread (module.h). */
static void inner_log(void *core, sl_log_level level, const char *fmt, ...) {
  const sl_module_host *h = ((simccl_comm *)core)->host;
  if (!h->log) return;
  char buf[SL__ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  h->log(h->core, level, "simccl: %s", buf);
}

static bool is_aborted(const simccl_comm *c) {
  for (; c; c = c->parent)
    if (atomic_load(&c->aborted)) return true;
  return false;
}

/* ---- the table's cheap parts ---------------------------------------------------------------- */

/* "sim" (or "sim:VARIANT"): BACKEND is the native API of the rank's backend (module.h, probe). */
static bool is_sim(const char *backend) {
  return backend && strncmp(backend, "sim", 3) == 0 && (backend[3] == 0 || backend[3] == ':');
}

static int simccl_probe(const char *backend, char *reason, size_t len) {
  if (is_sim(backend)) return 1;
  if (reason && len)
    snprintf(reason, len, "simccl: moves sim device memory only; this rank's backend is %s",
             backend ? backend : "(none)");
  return 0;
}

static simccl_comm *comm_new(const sl_module_host *host, const sl_backend_ops *be_ops, void *be,
                             sl_ext_host_access_fn access, int timeout_ms) {
  simccl_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->host = host;
  c->inner_host = (sl_module_host){sizeof(sl_module_host), c, inner_log, inner_fail};
  c->be_ops = be_ops;
  c->be = be;
  c->access = access;
  c->timeout_ms = timeout_ms;
  c->world = 1;
  pthread_mutex_init(&c->run_mu, NULL);
  pthread_mutex_init(&c->pend_mu, NULL);
  pthread_condattr_t ca; /* waits are bounded by the monotonic clock: a clock step does not stretch them */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->changed, &ca);
  pthread_condattr_destroy(&ca);
  atomic_init(&c->aborted, 0);
#ifdef SHARDLOAD_HAVE_GLOO
  c->gloo = sl__collective_gloo();
#endif
  return c;
}

static void comm_free(simccl_comm *c) {
  pthread_cond_destroy(&c->changed);
  pthread_mutex_destroy(&c->pend_mu);
  pthread_mutex_destroy(&c->run_mu);
  free(c);
}

/* ---- init and fini ------------------------------------------------------------------------ */

/* The rank's backend is one of native API "sim" (what the core paired it by) and offers what
 * this module reaches its streams and memory through; *ACCESS gets its SL_EXT_HOST_ACCESS. */
static sl_status backend_usable(const sl_collective_init *in, sl_ext_host_access_fn *access) {
  const sl_module_host *h = in->host;
  const sl_backend_ops *b = in->backend;
  if (!b || !in->backend_handle || !is_sim(sl_backend_native_api(b)))
    return h->fail(h->core, SL_ERR_INVALID,
                   "simccl init on rank %d: needs this rank's backend, of native API sim (sl_collective_init.backend "
                   "and backend_handle); it has %s%s%s",
                   in->rank, b ? b->name : "none", b && SL_HAS_OP(b, native_api) ? ", native API " : "",
                   b && SL_HAS_OP(b, native_api) ? b->native_api : "");
  const char *lacks = !SL_HAS_OP(b, launch_host_fn) ? "launch_host_fn"
                      : !SL_HAS_OP(b, is_device_ptr) ? "is_device_ptr"
                      : !SL_HAS_OP(b, get_proc) || !(*access = (sl_ext_host_access_fn)b->get_proc(SL_EXT_HOST_ACCESS))
                          ? "the extension " SL_EXT_HOST_ACCESS
                          : NULL;
  if (lacks)
    return h->fail(h->core, SL_ERR_UNSUPPORTED,
                   "simccl init on rank %d: backend %s offers no %s, through which simccl runs its work on the "
                   "backend's streams; use --collective gloo",
                   in->rank, b->name, lacks);
  return SL_OK;
}

static sl_status simccl_init(const sl_collective_init *in, void **out) {
  if (!in || !out || !in->host) return SL_ERR_INVALID;
  *out = NULL;
  const sl_module_host *h = in->host;
  if (!SL_INIT_HAS(in, control))
    return h->fail(h->core, SL_ERR_ABI,
                   "simccl: sl_collective_init of %u bytes lacks the backend and control plane of module ABI 2; "
                   "rebuild the caller against this shardload's shardload/module.h",
                   in->size);
  if (in->world_size < 1 || in->rank < 0 || in->rank >= in->world_size)
    return h->fail(h->core, SL_ERR_INVALID, "simccl: rank %d is not in a job of %d ranks", in->rank, in->world_size);
  sl_ext_host_access_fn access = NULL;
  sl_status st = backend_usable(in, &access);
  if (st != SL_OK) return st;
  if (in->world_size > 1 && (!in->control || !in->control->allgather))
    return h->fail(h->core, SL_ERR_INVALID,
                   "simccl init on rank %d of %d: no control plane to bootstrap through (sl_collective_init.control)",
                   in->rank, in->world_size);
#ifndef SHARDLOAD_HAVE_GLOO
  if (in->world_size > 1)
    return h->fail(h->core, SL_ERR_UNSUPPORTED,
                   "simccl: this shardload was built without Gloo, so simccl serves a job of one rank; this job has "
                   "%d (rebuild with -DSHARDLOAD_WITH_GLOO=ON)",
                   in->world_size);
#endif
  simccl_comm *c = comm_new(h, in->backend, in->backend_handle, access, in->timeout_ms);
  if (!c) return h->fail(h->core, SL_ERR_NOMEM, "simccl: out of memory");
  c->rank = c->job_rank = in->rank;
  c->world = in->world_size;
  if (c->world > 1) {
    /* The inner Gloo communicator meets its peers through the control plane: the pair
     * addresses are its unique id (NCCL broadcasts one and connects through it). A second
     * store-based communicator cannot join a tcp:// rendezvous, whose store admits each rank
     * once and whose port rank 0's control plane already serves. */
    sl_collective_init gi = {
        .size = sizeof gi,
        .host = &c->inner_host,
        .rank = in->rank,
        .world_size = in->world_size,
        .rendezvous = in->rendezvous, /* only where the Gloo device listens */
        .prefix = in->prefix,
        .timeout_ms = in->timeout_ms,
        .control = in->control,
    };
    t_msg[0] = 0;
    st = c->gloo->init(&gi, &c->inner);
    if (st != SL_OK) {
      comm_free(c);
      /* A control-plane failure keeps the control plane's own message (it names the rank). */
      return t_msg[0] ? h->fail(h->core, st, "simccl init: %s", t_msg) : st;
    }
  }
  *out = c;
  return SL_OK;
}

static int wait_ms(const simccl_comm *c) { return sl_timeout_ms(c->timeout_ms); }

/* Waits until no task of C is queued or running, for at most MS milliseconds; returns how
 * many still are. */
static int drain(simccl_comm *c, int ms) {
  sl_deadline until = sl_deadline_in_ms(ms); /* the condition variable's clock: monotonic */
  pthread_mutex_lock(&c->pend_mu);
  while (c->pending > 0)
    if (pthread_cond_timedwait(&c->changed, &c->pend_mu, &until.at) != 0) break;
  int left = c->pending;
  pthread_mutex_unlock(&c->pend_mu);
  return left;
}

static void simccl_abort(void *comm);

/* The core synchronises the streams before it finishes a collective; a task still queued
 * would use C after it is freed, so fini waits for them (aborting them after one timeout) and,
 * if some never finish (a stream stuck behind an event nobody records), leaks C rather than
 * crash. */
static void simccl_fini(void *comm) {
  simccl_comm *c = comm;
  if (!c) return;
  if (drain(c, wait_ms(c)) > 0) {
    simccl_abort(c);
    int left = drain(c, wait_ms(c));
    if (left > 0) {
      if (c->host->log)
        c->host->log(c->host->core, SL_LOG_ERROR,
                     "simccl fini on rank %d: %d operations still queued on sim streams; leaking the "
                     "communicator",
                     c->job_rank, left);
      return;
    }
  }
  if (c->inner) c->gloo->fini(c->inner);
  comm_free(c);
}

/* Async-signal-safe: atomic stores, and Gloo's abort (module.h). Queued tasks fail as they
 * start; a running one ends within the timeout (at once on a root communicator). */
static void simccl_abort(void *comm) {
  simccl_comm *c = comm;
  if (!c) return;
  atomic_store(&c->aborted, 1);
  if (c->inner && c->gloo->abort) c->gloo->abort(c->inner);
}

/* ---- the stream tasks ---------------------------------------------------------------------- */

typedef enum simccl_op { OP_BROADCAST, OP_SCATTERV, OP_ALLGATHER } simccl_op;
static const char *const op_name[] = {"broadcast", "scatterv", "allgather"};

typedef struct simccl_task {
  simccl_comm *c;
  simccl_op op;
  int root;
  void *send;        /* broadcast: the buffer; scatterv: root's send buffer; allgather: input */
  size_t send_bytes; /* how far the op reads SEND (scatterv: the furthest count + displacement) */
  void *recv;
  size_t recv_bytes;
  size_t bytes;              /* broadcast: size; allgather: bytes per rank */
  size_t *counts, *displs;   /* scatterv on the root: copies */
  uint64_t seq;              /* its ticket (see Ordering at the head) */
} simccl_task;

/* The message of a task's failure, into its host function's ERR (module.h, launch_host_fn). */
static void task_error(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void task_error(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static sl_status run_inner(simccl_task *t) {
  simccl_comm *c = t->c;
  switch (t->op) {
  case OP_BROADCAST: return c->gloo->broadcast(c->inner, t->send, t->bytes, t->root, NULL);
  case OP_SCATTERV:
    return c->gloo->scatterv(c->inner, t->send, t->counts, t->displs, t->recv, t->recv_bytes, t->root, NULL);
  case OP_ALLGATHER: return c->gloo->allgather(c->inner, t->send, t->recv, t->bytes, NULL);
  }
  return SL_ERR_INVALID;
}

/* T's turn: opens the buffers, runs the Gloo call, closes them. */
static sl_status run_turn(simccl_task *t, char *err, size_t errlen) {
  simccl_comm *c = t->c;
  /* sim device memory is host-addressable only while open (sim:strict) */
  const void *open_ptr[2] = {0};
  size_t open_len[2] = {0};
  int opened = 0;
  sl_status st = SL_OK;
  if (t->send && t->send_bytes) {
    if ((st = c->access(c->be, t->send, t->send_bytes, 1)) == SL_OK) {
      open_ptr[opened] = t->send;
      open_len[opened++] = t->send_bytes;
    }
  }
  if (st == SL_OK && t->recv && t->recv_bytes) {
    if ((st = c->access(c->be, t->recv, t->recv_bytes, 1)) == SL_OK) {
      open_ptr[opened] = t->recv;
      open_len[opened++] = t->recv_bytes;
    }
  }
  if (st == SL_OK) {
    pthread_mutex_lock(&c->run_mu);
    t_msg[0] = 0;
    st = run_inner(t);
    pthread_mutex_unlock(&c->run_mu);
    if (st != SL_OK) task_error(err, errlen, "simccl: %s", t_msg[0] ? t_msg : sl_strerror(st));
  } else if (!err[0]) { /* the backend's extension writes why the range cannot be opened */
    task_error(err, errlen, "simccl %s on rank %d: cannot open its buffers for host access (%s)", op_name[t->op],
               c->job_rank, sl_status_name(st));
  }
  while (opened-- > 0) c->access(c->be, open_ptr[opened], open_len[opened], 0);
  return st;
}


/* Waits until T's ticket is served (true) or the sequence is broken or aborted (false). */
static bool wait_turn(simccl_task *t) {
  simccl_comm *c = t->c;
  sl_deadline until = sl_deadline_in_ms(wait_ms(c));
  bool mine = false;
  pthread_mutex_lock(&c->pend_mu);
  for (;;) {
    if ((mine = c->turn == t->seq) || c->out_of_order || is_aborted(c)) break;
    if (pthread_cond_timedwait(&c->changed, &c->pend_mu, &until.at) != 0) {
      mine = c->turn == t->seq;
      if (!mine) c->out_of_order = true;
      break;
    }
  }
  pthread_mutex_unlock(&c->pend_mu);
  return mine;
}

static void end_turn(simccl_comm *c) {
  pthread_mutex_lock(&c->pend_mu);
  c->turn++;
  pthread_cond_broadcast(&c->changed);
  pthread_mutex_unlock(&c->pend_mu);
}

/* Its accounting ends: a fini or barrier waiting for the queued tasks may go on. */
static void free_task(simccl_task *t) {
  simccl_comm *c = t->c;
  free(t->counts);
  free(t->displs);
  free(t);
  pthread_mutex_lock(&c->pend_mu);
  if (--c->pending == 0) pthread_cond_broadcast(&c->changed);
  pthread_mutex_unlock(&c->pend_mu);
}

/* The host function (launch_host_fn): runs on the stream's worker once the work queued before
 * it on that stream is done, and frees T before it returns, so that a sync covers its end. */
static sl_status run_task(void *arg, char *err, size_t errlen) {
  simccl_task *t = arg;
  simccl_comm *c = t->c;
  const char *op = op_name[t->op];
  sl_status st;
  if (wait_turn(t)) {
    st = run_turn(t, err, errlen);
    end_turn(c);
  } else if (is_aborted(c)) {
    task_error(err, errlen, "simccl %s on rank %d: aborted (sl_context_abort)", op, c->job_rank);
    st = SL_ERR_COMM;
  } else {
    task_error(err, errlen,
               "simccl %s on rank %d: an operation issued before it on this communicator did not run within %d "
               "ms, or could not be queued: its stream may wait for work queued after this one (make streams "
               "wait only for work issued earlier)",
               op, c->job_rank, wait_ms(c));
    st = SL_ERR_TIMEOUT;
  }
  free_task(t);
  return st;
}

/* Queues T on STREAM as a host function of the backend's; T is freed whatever happens. */
static sl_status submit(simccl_comm *c, simccl_task *t, void *stream) {
  pthread_mutex_lock(&c->pend_mu);
  c->pending++;
  t->seq = c->issued++;
  pthread_mutex_unlock(&c->pend_mu);
  sl_status st = c->be_ops->launch_host_fn(c->be, stream, run_task, t);
  if (st != SL_OK) { /* the other ranks run this op, this one never will: the sequence is broken */
    pthread_mutex_lock(&c->pend_mu);
    c->out_of_order = true;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->pend_mu);
    free_task(t); /* never ran: the backend said why */
  }
  return st;
}

/* ---- argument checks, at the call (returned at once) ---------------------------------------- */

static sl_status refuse_aborted(simccl_comm *c, const char *op) {
  return c->host->fail(c->host->core, SL_ERR_COMM, "simccl %s on rank %d: aborted (sl_context_abort)", op,
                       c->job_rank);
}

static sl_status check_device(simccl_comm *c, const char *op, const char *what, const void *p, size_t bytes) {
  if (!bytes) return SL_OK;
  if (p && c->be_ops->is_device_ptr(c->be, p, bytes)) return SL_OK;
  return c->host->fail(c->host->core, SL_ERR_INVALID,
                       "simccl %s on rank %d: the %s buffer %p (%zu bytes) is not sim device memory; simccl moves "
                       "device memory only (copy the data to the device first, or use the gloo collective)",
                       op, c->job_rank, what, p, bytes);
}

static sl_status check_root(simccl_comm *c, const char *op, int root) {
  if (root >= 0 && root < c->world) return SL_OK;
  return c->host->fail(c->host->core, SL_ERR_INVALID, "simccl %s on rank %d: root %d is not a rank of %d", op,
                       c->job_rank, root, c->world);
}

static simccl_task *task_new(simccl_comm *c, simccl_op op) {
  simccl_task *t = calloc(1, sizeof *t);
  if (t) {
    t->c = c;
    t->op = op;
  } else {
    c->host->fail(c->host->core, SL_ERR_NOMEM, "simccl %s: out of memory", op_name[op]);
  }
  return t;
}

/* ---- the ops ------------------------------------------------------------------------------ */

static sl_status simccl_broadcast(void *comm, void *buf, size_t bytes, int root, void *stream) {
  simccl_comm *c = comm;
  sl_status st;
  if (is_aborted(c)) return refuse_aborted(c, "broadcast");
  if ((st = check_root(c, "broadcast", root)) != SL_OK) return st;
  if ((st = check_device(c, "broadcast", "data", buf, bytes)) != SL_OK) return st;
  if (c->world == 1 || bytes == 0) return SL_OK;
  simccl_task *t = task_new(c, OP_BROADCAST);
  if (!t) return SL_ERR_NOMEM;
  t->root = root;
  t->send = buf;
  t->send_bytes = t->bytes = bytes;
  return submit(c, t, stream);
}

static sl_status simccl_scatterv(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs,
                                 void *recvbuf, size_t recvbytes, int root, void *stream) {
  simccl_comm *c = comm;
  sl_status st;
  if (is_aborted(c)) return refuse_aborted(c, "scatterv");
  if ((st = check_root(c, "scatterv", root)) != SL_OK) return st;
  size_t extent = 0;
  if (c->rank == root) {
    if (counts[root] != recvbytes)
      return c->host->fail(c->host->core, SL_ERR_INVALID,
                           "simccl scatterv on rank %d: the root sends itself %zu bytes but receives %zu", c->job_rank,
                           counts[root], recvbytes);
    for (int r = 0; r < c->world; r++) {
      size_t end;
      if (!counts[r]) continue;
      if (__builtin_add_overflow(displs[r], counts[r], &end))
        return c->host->fail(c->host->core, SL_ERR_INVALID,
                             "simccl scatterv on rank %d: rank %d's share overflows the address space", c->job_rank, r);
      if (end > extent) extent = end;
    }
    if ((st = check_device(c, "scatterv", "send", sendbuf, extent)) != SL_OK) return st;
  }
  if ((st = check_device(c, "scatterv", "receive", recvbuf, recvbytes)) != SL_OK) return st;
  if (c->world == 1) {
    const char *src = (const char *)sendbuf + displs[0];
    if (!recvbytes || src == recvbuf) return SL_OK;
    return c->be_ops->copy_async(c->be, recvbuf, src, recvbytes, SL_COPY_D2D, stream);
  }
  simccl_task *t = task_new(c, OP_SCATTERV);
  if (!t) return SL_ERR_NOMEM;
  t->root = root;
  t->recv = recvbuf;
  t->recv_bytes = recvbytes;
  if (c->rank == root) {
    /* read on the root only, and only until this call returns (module.h) */
    t->send = (void *)sendbuf;
    t->send_bytes = extent;
    t->counts = malloc(sizeof(size_t) * (size_t)c->world);
    t->displs = malloc(sizeof(size_t) * (size_t)c->world);
    if (!t->counts || !t->displs) {
      free(t->counts);
      free(t->displs);
      free(t);
      return c->host->fail(c->host->core, SL_ERR_NOMEM, "simccl scatterv: out of memory");
    }
    memcpy(t->counts, counts, sizeof(size_t) * (size_t)c->world);
    memcpy(t->displs, displs, sizeof(size_t) * (size_t)c->world);
  }
  return submit(c, t, stream);
}

static sl_status simccl_allgather(void *comm, const void *sendbuf, void *recvbuf, size_t bytes, void *stream) {
  simccl_comm *c = comm;
  sl_status st;
  size_t total;
  if (is_aborted(c)) return refuse_aborted(c, "allgather");
  if (__builtin_mul_overflow(bytes, (size_t)c->world, &total))
    return c->host->fail(c->host->core, SL_ERR_INVALID, "simccl allgather on rank %d: %zu bytes x %d ranks overflows",
                         c->job_rank, bytes, c->world);
  if ((st = check_device(c, "allgather", "send", sendbuf, bytes)) != SL_OK) return st;
  if ((st = check_device(c, "allgather", "receive", recvbuf, total)) != SL_OK) return st;
  if (bytes == 0) return SL_OK;
  if (c->world == 1)
    return sendbuf == recvbuf ? SL_OK : c->be_ops->copy_async(c->be, recvbuf, sendbuf, bytes, SL_COPY_D2D, stream);
  simccl_task *t = task_new(c, OP_ALLGATHER);
  if (!t) return SL_ERR_NOMEM;
  t->send = (void *)sendbuf;
  t->send_bytes = t->bytes = bytes;
  t->recv = recvbuf;
  t->recv_bytes = total;
  return submit(c, t, stream);
}

/* Complete on return, on the caller's thread: the inner communicator must be idle first (its
 * calls are sequenced by tag on every rank), so the tasks already queued are waited for. */
static sl_status quiesce(simccl_comm *c, const char *op) {
  if (drain(c, wait_ms(c)) == 0) return SL_OK;
  return c->host->fail(c->host->core, SL_ERR_TIMEOUT,
                       "simccl %s on rank %d: operations queued before it did not finish within %d ms; their "
                       "streams wait for work that never completes (synchronise the streams first)",
                       op, c->job_rank, wait_ms(c));
}

static sl_status simccl_barrier(void *comm) {
  simccl_comm *c = comm;
  sl_status st;
  if (is_aborted(c)) return refuse_aborted(c, "barrier");
  if (c->world == 1) return SL_OK;
  if ((st = quiesce(c, "barrier")) != SL_OK) return st;
  pthread_mutex_lock(&c->run_mu);
  t_msg[0] = 0;
  st = c->gloo->barrier(c->inner);
  pthread_mutex_unlock(&c->run_mu);
  return st == SL_OK ? st : c->host->fail(c->host->core, st, "simccl: %s", t_msg);
}

/* Collective over C, complete on return: the inner communicator splits (module.h: ordered by
 * key, then rank) and the sub wraps it. The same (color, key) go round first so that this
 * module knows its place in the group (the Gloo table does not say). */
static sl_status simccl_split(void *comm, int color, int key, void **sub) {
  simccl_comm *c = comm;
  sl_status st;
  *sub = NULL;
  if (is_aborted(c)) return refuse_aborted(c, "split");
  if (c->world == 1) {
    if (color < 0) return SL_OK;
    simccl_comm *s = comm_new(c->host, c->be_ops, c->be, c->access, c->timeout_ms);
    if (!s) return c->host->fail(c->host->core, SL_ERR_NOMEM, "simccl split: out of memory");
    s->job_rank = c->job_rank;
    s->parent = c;
    *sub = s;
    return SL_OK;
  }
  if ((st = quiesce(c, "split")) != SL_OK) return st;
  int32_t mine[2] = {color < 0 ? -1 : color, key};
  int32_t *all = malloc(sizeof mine * (size_t)c->world);
  if (!all) return c->host->fail(c->host->core, SL_ERR_NOMEM, "simccl split: out of memory");
  void *inner = NULL;
  pthread_mutex_lock(&c->run_mu);
  t_msg[0] = 0;
  st = c->gloo->allgather(c->inner, mine, all, sizeof mine, NULL);
  if (st == SL_OK) st = c->gloo->split(c->inner, color, key, &inner);
  pthread_mutex_unlock(&c->run_mu);
  if (st != SL_OK) {
    free(all);
    return c->host->fail(c->host->core, st, "simccl: %s", t_msg);
  }
  if (color < 0) {
    free(all);
    return SL_OK;
  }
  simccl_comm *s = comm_new(c->host, c->be_ops, c->be, c->access, c->timeout_ms);
  if (!s) {
    free(all);
    c->gloo->fini(inner);
    return c->host->fail(c->host->core, SL_ERR_NOMEM, "simccl split: out of memory");
  }
  /* my place: members before me by (key, rank) */
  int n = 0, place = 0;
  for (int r = 0; r < c->world; r++) {
    if (all[2 * r] != mine[0]) continue;
    n++;
    if (all[2 * r + 1] < key || (all[2 * r + 1] == key && r < c->rank)) place++;
  }
  free(all);
  s->world = n;
  s->rank = place;
  s->job_rank = c->job_rank;
  s->parent = c;
  s->inner = inner;
  *sub = s;
  return SL_OK;
}

static const sl_collective_ops simccl_ops = {
    .abi_version = SL_COLLECTIVE_ABI_VERSION,
    .size = sizeof(sl_collective_ops),
    .name = "simccl",
    .flags = 0, /* stream-ordered */
    .domains = SL_MEM_DEVICE,
    .device_backend = "sim",
    .probe = simccl_probe,
    .init = simccl_init,
    .fini = simccl_fini,
    .abort = simccl_abort,
    .split = simccl_split,
    .broadcast = simccl_broadcast,
    .scatterv = simccl_scatterv,
    .allgather = simccl_allgather,
    .barrier = simccl_barrier,
};

const sl_collective_ops *sl__collective_simccl(void) { return &simccl_ops; }
