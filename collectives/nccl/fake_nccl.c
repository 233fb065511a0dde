/* A fake libnccl.so.2 for `test_nccl_module --fake`: what NCCL 2.19+ does with non-blocking
 * communicators (src/init.cc, src/group.cc), without a GPU, loaded by the module through its
 * own dlopen("libnccl.so.2") (the test puts this file's directory on LD_LIBRARY_PATH). Never
 * more lenient than NCCL; where NCCL would crash or corrupt, it counts a violation instead.
 *
 *  - ncclCommInitRankConfig writes *comm at once; the communicator is ncclInProgress for a few
 *    milliseconds (its init job). ncclCommFinalize is the same.
 *  - ncclCommSplit sets *newcomm = NULL, returns ncclInProgress and starts the split's job on a
 *    thread of its own, which writes the child into *newcomm (an atomic store, as NCCL's) when
 *    it ends: after SPLIT_MS, or, with SPLIT_MS < 0 (a peer that never arrives), only once the
 *    parent is aborted — then the child is written in a failed state. NOCOLOR writes NULL. The
 *    parent is ncclInProgress until the job ended. A job notices an abort only ABORT_LAG_MS
 *    later (its bootstrap sits in a blocking step).
 *  - ncclCommAbort sets the abort flag, joins the communicator's job from any thread (2.19+),
 *    then frees it. It, and ncclCommDestroy, then block while STUCK is set: NCCL's cudaFree
 *    synchronises the device, and a kernel that never ends holds it.
 *  - A call on a communicator that was aborted or destroyed, or where NCCL's
 *    ncclCommEnsureReady refuses one still in progress (ncclCommSplit, ncclCommCount,
 *    ncclCommUserRank, ncclCommFinalize, ncclCommDestroy, and the send and receive), fails and
 *    counts a violation.
 *  - Communicators of one unique id are the ranks of one job (in one process: the test's
 *    threads). ncclSend and ncclRecv move bytes between them: each is posted at the end of its
 *    group (the outermost ncclGroupEnd; one outside a group is a group of its own, as in NCCL;
 *    fakenccl_groups counts them), and a send meets the oldest receive of its pair of ranks,
 *    posted before or after it, whatever the group; the receive then has its bytes. A pair
 *    whose sizes differ is a violation (it fails both communicators, ncclInvalidUsage); so is
 *    an ncclGroupEnd without its ncclGroupStart, and a group still open when the test asks for
 *    the violations. The memory is host memory (no device); fakenccl_stream_busy says whether
 *    a stream's posted operations have all met theirs (the test's fake runtime completes its
 *    events by it). An abort or destroy drops its communicator's operations that met none
 *    (their kernels exit).
 *  - ncclBroadcast and ncclAllGather refuse (no data moves through them).
 *
 * fakenccl_* are the test's handles on it. */
#define _GNU_SOURCE
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))

typedef struct fcomm {
  int nranks, rank;
  ncclUniqueId id; /* the job's: communicators of one id exchange bytes */
  atomic_int state; /* the asynchronous result (ncclResult_t) */
  double ready_at;  /* an init or finalize in progress: ncclSuccess from then on */
  atomic_int abort_flag;
  bool ending; /* handed to ncclCommAbort/Destroy: no call may name it again (under g_mu) */
  pthread_t job; /* a split's job, run on this communicator (the parent) */
  bool has_job;
  struct fcomm *next; /* the live list */
} fcomm;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* the live list and the counters */
static pthread_mutex_t g_stuck_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_unstick = PTHREAD_COND_INITIALIZER;
static fcomm *g_live;
static int g_nlive, g_violations, g_children;
static int g_split_ms = 20, g_abort_lag_ms = 0, g_stuck = 0;
static char g_last[256];
static int g_next_id;     /* the unique ids given out */
static int g_open_groups; /* threads inside ncclGroupStart ... ncclGroupEnd */
static int g_groups;      /* groups posted (a send or receive outside one is one) */
static cudaStream_t g_last_stream; /* the stream the last data op was given */
static int g_data_ops;

/* A send or receive, in its thread's open group until it is posted, then on the pending list
 * until the other side of its pair is posted too. */
typedef struct p2p {
  fcomm *comm;
  bool send;
  int peer;
  void *buf; /* a send's bytes are only read */
  size_t bytes;
  cudaStream_t stream;
  unsigned long seq; /* when it was posted */
  struct p2p *next;
} p2p;
static p2p *g_pending;                       /* posted, not met, oldest first (under g_mu) */
static unsigned long g_seq;                  /* operations posted so far */
static __thread int t_depth;                 /* this thread's ncclGroupStart nesting */
static __thread p2p *t_group, *t_group_last; /* its operations in the open group, in call order */

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void nap_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static fcomm *comm_new(int nranks, int rank, const ncclUniqueId *id, ncclResult_t state, double ready_at) {
  fcomm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->nranks = nranks;
  c->rank = rank;
  if (id) c->id = *id;
  atomic_init(&c->state, state);
  c->ready_at = ready_at;
  pthread_mutex_lock(&g_mu);
  c->next = g_live;
  g_live = c;
  g_nlive++;
  pthread_mutex_unlock(&g_mu);
  return c;
}

/* Whether C is a live communicator no abort or destroy has taken (caller holds g_mu). */
static bool live_locked(const fcomm *c) {
  const fcomm *l = g_live;
  while (l && l != c) l = l->next;
  return l && !l->ending;
}

/* Whether COMM is a live communicator no abort or destroy has taken (with END, takes it); a
 * violation, and WHY kept, when not: NCCL would use freed memory. */
static bool live_ex(ncclComm_t comm, const char *why, bool end) {
  pthread_mutex_lock(&g_mu);
  fcomm *c = g_live;
  while (c && c != (fcomm *)comm) c = c->next;
  bool ok = c && !c->ending;
  if (!ok) {
    g_violations++;
    snprintf(g_last, sizeof g_last, "%s on a communicator that was aborted or destroyed (%p)", why, (void *)comm);
  } else if (end) {
    c->ending = true;
  }
  pthread_mutex_unlock(&g_mu);
  return ok;
}
static bool live(ncclComm_t comm, const char *why) { return live_ex(comm, why, false); }

/* The end of an abort or destroy: NCCL's cudaFree waits for the device (while STUCK, for a
 * kernel that never ends), then the communicator is gone. */
static void free_comm(fcomm *c) {
  pthread_mutex_lock(&g_stuck_mu);
  while (g_stuck) pthread_cond_wait(&g_unstick, &g_stuck_mu);
  pthread_mutex_unlock(&g_stuck_mu);
  pthread_mutex_lock(&g_mu);
  for (fcomm **p = &g_live; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      g_nlive--;
      break;
    }
  for (p2p **p = &g_pending; *p;) { /* its kernels exited: what they waited for never comes */
    p2p *o = *p;
    if (o->comm == c) {
      *p = o->next;
      free(o);
    } else {
      p = &o->next;
    }
  }
  pthread_mutex_unlock(&g_mu);
  free(c);
}

static ncclResult_t async_state(fcomm *c) {
  int s = atomic_load(&c->state);
  if (s == ncclInProgress && c->ready_at > 0 && now_ms() >= c->ready_at) {
    atomic_store(&c->state, ncclSuccess);
    s = ncclSuccess;
  }
  return (ncclResult_t)s;
}

/* ncclCommEnsureReady: a communicator still in progress is refused. */
static ncclResult_t ensure_ready(ncclComm_t comm, const char *call) {
  if (!live(comm, call)) return ncclInvalidArgument;
  if (async_state((fcomm *)comm) == ncclInProgress) {
    pthread_mutex_lock(&g_mu);
    g_violations++;
    snprintf(g_last, sizeof g_last, "%s before the previous operation returned ncclSuccess", call);
    pthread_mutex_unlock(&g_mu);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* ---- the test's handles ------------------------------------------------------------------ */
API void fakenccl_config(int split_ms, int abort_lag_ms) {
  pthread_mutex_lock(&g_mu);
  g_split_ms = split_ms;
  g_abort_lag_ms = abort_lag_ms;
  pthread_mutex_unlock(&g_mu);
}
API void fakenccl_stick(int stuck) {
  pthread_mutex_lock(&g_stuck_mu);
  g_stuck = stuck;
  pthread_cond_broadcast(&g_unstick);
  pthread_mutex_unlock(&g_stuck_mu);
}
API int fakenccl_live(void) {
  pthread_mutex_lock(&g_mu);
  int n = g_nlive;
  pthread_mutex_unlock(&g_mu);
  return n;
}
API int fakenccl_violations(char *last, size_t len) {
  pthread_mutex_lock(&g_mu);
  int n = g_violations + g_open_groups;
  if (last && len)
    snprintf(last, len, "%s", g_open_groups ? "a group left open (ncclGroupStart without its ncclGroupEnd)" : g_last);
  pthread_mutex_unlock(&g_mu);
  return n;
}
API int fakenccl_children_written(void) { return __atomic_load_n(&g_children, __ATOMIC_ACQUIRE); }
/* The stream the last data op was enqueued on, and how many data ops were called. */
API cudaStream_t fakenccl_last_stream(int *ops) {
  pthread_mutex_lock(&g_mu);
  cudaStream_t s = g_last_stream;
  if (ops) *ops = g_data_ops;
  pthread_mutex_unlock(&g_mu);
  return s;
}
/* The groups posted so far. */
API int fakenccl_groups(void) {
  pthread_mutex_lock(&g_mu);
  int n = g_groups;
  pthread_mutex_unlock(&g_mu);
  return n;
}
/* The operations posted so far, and whether any posted on STREAM up to the UPTO'th has not met
 * its other side yet (an event recorded after them on STREAM is not complete). */
API unsigned long fakenccl_posted(void) {
  pthread_mutex_lock(&g_mu);
  unsigned long n = g_seq;
  pthread_mutex_unlock(&g_mu);
  return n;
}
API int fakenccl_stream_busy(cudaStream_t stream, unsigned long upto) {
  pthread_mutex_lock(&g_mu);
  int busy = 0;
  for (p2p *o = g_pending; o && !busy; o = o->next) busy = o->stream == stream && o->seq <= upto;
  pthread_mutex_unlock(&g_mu);
  return busy;
}
static void saw_stream(cudaStream_t st) {
  pthread_mutex_lock(&g_mu);
  g_last_stream = st;
  g_data_ops++;
  pthread_mutex_unlock(&g_mu);
}

/* ---- the API ------------------------------------------------------------------------------ */
API ncclResult_t ncclGetVersion(int *v) {
  if (!v) return ncclInvalidArgument;
  *v = 22703; /* 2.27.3, as the nvidia-nccl-cu13 wheel */
  return ncclSuccess;
}
API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return ncclInvalidArgument;
  memset(id, 0, sizeof *id);
  pthread_mutex_lock(&g_mu);
  snprintf(id->internal, sizeof id->internal, "fakenccl %d", ++g_next_id); /* a job of its own */
  pthread_mutex_unlock(&g_mu);
  return ncclSuccess;
}
API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *cfg) {
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  bool blocking = !cfg || cfg->blocking != 0;
  fcomm *c = comm_new(nranks, rank, &id, blocking ? ncclSuccess : ncclInProgress, blocking ? 0 : now_ms() + 5);
  if (!c) return ncclSystemError;
  *comm = (ncclComm_t)c;
  return blocking ? ncclSuccess : ncclInProgress;
}
API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *r) {
  if (!r || !live(comm, "ncclCommGetAsyncError")) return ncclInvalidArgument;
  *r = async_state((fcomm *)comm);
  return ncclSuccess;
}

typedef struct split_job {
  fcomm *parent;
  ncclComm_t *newcomm;
  bool nocolor;
  int split_ms, abort_lag_ms;
} split_job;

static void *split_main(void *arg) {
  split_job *j = arg;
  double start = now_ms(), aborted_at = -1;
  ncclResult_t res = ncclSuccess;
  for (;;) {
    if (atomic_load(&j->parent->abort_flag) && aborted_at < 0) aborted_at = now_ms();
    if (aborted_at >= 0 && now_ms() - aborted_at >= j->abort_lag_ms) {
      res = ncclInternalError; /* the child's init was aborted */
      break;
    }
    if (j->split_ms >= 0 && now_ms() - start >= j->split_ms) break;
    nap_ms(1);
  }
  fcomm *child = j->nocolor ? NULL : comm_new(1, 0, NULL, res, 0);
  if (!j->nocolor) __atomic_add_fetch(&g_children, 1, __ATOMIC_RELEASE);
  __atomic_store_n(j->newcomm, (ncclComm_t)child, __ATOMIC_RELEASE); /* NCCL's write, at the job's end */
  atomic_store(&j->parent->state, res);
  free(j);
  return NULL;
}

API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *cfg) {
  if (!newcomm) return ncclInvalidArgument;
  ncclResult_t r = ensure_ready(comm, "ncclCommSplit");
  if (r != ncclSuccess) return r;
  fcomm *p = (fcomm *)comm;
  if (cfg && cfg->blocking) return ncclInvalidUsage; /* this fake does non-blocking splits only */
  *newcomm = NULL; /* NULL until the split is complete */
  split_job *j = calloc(1, sizeof *j);
  if (!j) return ncclSystemError;
  pthread_mutex_lock(&g_mu);
  *j = (split_job){p, newcomm, color == NCCL_SPLIT_NOCOLOR, g_split_ms, g_abort_lag_ms};
  pthread_mutex_unlock(&g_mu);
  if (p->has_job) pthread_join(p->job, NULL); /* the previous split's job, long ended */
  p->ready_at = 0; /* in progress until the job ends */
  atomic_store(&p->state, ncclInProgress);
  if (pthread_create(&p->job, NULL, split_main, j) != 0) {
    free(j);
    atomic_store(&p->state, ncclSuccess);
    return ncclSystemError;
  }
  p->has_job = true;
  return ncclInProgress;
}

API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (!live_ex(comm, "ncclCommAbort", true)) return ncclInvalidArgument;
  fcomm *c = (fcomm *)comm;
  atomic_store(&c->abort_flag, 1);
  if (c->has_job) pthread_join(c->job, NULL); /* 2.19+: the pending job is joined, from any thread */
  free_comm(c);
  return ncclSuccess;
}
API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ncclResult_t r = ensure_ready(comm, "ncclCommFinalize");
  if (r != ncclSuccess) return r;
  fcomm *c = (fcomm *)comm;
  c->ready_at = now_ms() + 5;
  atomic_store(&c->state, ncclInProgress);
  return ncclInProgress;
}
API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  ncclResult_t r = ensure_ready(comm, "ncclCommDestroy");
  if (r != ncclSuccess) return r;
  if (!live_ex(comm, "ncclCommDestroy", true)) return ncclInvalidArgument;
  fcomm *c = (fcomm *)comm;
  if (c->has_job) pthread_join(c->job, NULL);
  free_comm(c);
  return ncclSuccess;
}
API ncclResult_t ncclCommCount(const ncclComm_t comm, int *n) {
  ncclResult_t r = ensure_ready(comm, "ncclCommCount");
  if (r == ncclSuccess) *n = ((fcomm *)comm)->nranks;
  return r;
}
API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  ncclResult_t r = ensure_ready(comm, "ncclCommUserRank");
  if (r == ncclSuccess) *rank = ((fcomm *)comm)->rank;
  return r;
}
/* The collectives refuse, after noting the stream they were given (what the module must take
 * from the backend: its streams' cudaStream_t); the send and receive below do the same. */
API ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                               cudaStream_t st) {
  saw_stream(st);
  return ncclInvalidUsage;
}
API ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  saw_stream(st);
  return ncclInvalidUsage;
}
/* Posts O (under g_mu): it meets the oldest posted operation of the other side of its pair in
 * its job, whose bytes then move, or waits on the pending list. */
static void post_locked(p2p *o) {
  o->seq = ++g_seq;
  p2p **at = &g_pending;
  for (; *at; at = &(*at)->next) {
    p2p *q = *at;
    if (q->send != o->send && q->comm->rank == o->peer && q->peer == o->comm->rank &&
        q->comm->nranks == o->comm->nranks && memcmp(&q->comm->id, &o->comm->id, sizeof q->comm->id) == 0)
      break;
  }
  if (!*at) {
    *at = o; /* the end of the list: oldest first */
    o->next = NULL;
    return;
  }
  p2p *q = *at, *snd = o->send ? o : q, *rcv = o->send ? q : o;
  *at = q->next;
  if (snd->bytes == rcv->bytes) {
    if (snd->bytes) memcpy(rcv->buf, snd->buf, snd->bytes);
  } else { /* NCCL's kernels would read or write past one of the buffers, or wait forever */
    g_violations++;
    snprintf(g_last, sizeof g_last, "ncclSend of %zu bytes from rank %d met an ncclRecv of %zu bytes on rank %d",
             snd->bytes, snd->comm->rank, rcv->bytes, rcv->comm->rank);
    atomic_store(&snd->comm->state, ncclInvalidUsage);
    atomic_store(&rcv->comm->state, ncclInvalidUsage);
  }
  free(o);
  free(q);
}

/* A send or receive: into this thread's open group, or, outside one, a group of its own. */
static ncclResult_t p2p_call(bool send, const char *call, void *buf, size_t n, ncclDataType_t t, int peer,
                             ncclComm_t comm, cudaStream_t st) {
  saw_stream(st);
  ncclResult_t r = ensure_ready(comm, call);
  if (r != ncclSuccess) return r;
  fcomm *c = (fcomm *)comm;
  if (peer < 0 || peer >= c->nranks) return ncclInvalidArgument;
  if (t != ncclUint8 && t != ncclInt8) return ncclInvalidUsage; /* this fake moves bytes only */
  if (n && !buf) return ncclInvalidArgument;
  p2p *o = calloc(1, sizeof *o);
  if (!o) return ncclSystemError;
  *o = (p2p){c, send, peer, buf, n, st, 0, NULL};
  if (t_depth > 0) {
    if (t_group_last) t_group_last->next = o;
    else t_group = o;
    t_group_last = o;
    return ncclSuccess;
  }
  pthread_mutex_lock(&g_mu);
  g_groups++;
  post_locked(o);
  pthread_mutex_unlock(&g_mu);
  return ncclSuccess;
}
API ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  return p2p_call(true, "ncclSend", (void *)s, n, t, peer, c, st);
}
API ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  return p2p_call(false, "ncclRecv", r, n, t, peer, c, st);
}

API ncclResult_t ncclGroupStart(void) {
  if (t_depth++ == 0) {
    pthread_mutex_lock(&g_mu);
    g_open_groups++;
    pthread_mutex_unlock(&g_mu);
  }
  return ncclSuccess;
}
/* The outermost ends the group: its operations are posted in the order they were called. */
API ncclResult_t ncclGroupEnd(void) {
  pthread_mutex_lock(&g_mu);
  if (t_depth == 0) {
    g_violations++;
    snprintf(g_last, sizeof g_last, "ncclGroupEnd without ncclGroupStart");
    pthread_mutex_unlock(&g_mu);
    return ncclInvalidUsage;
  }
  if (--t_depth == 0) {
    g_open_groups--;
    g_groups++;
    p2p *o = t_group;
    t_group = t_group_last = NULL;
    while (o) {
      p2p *next = o->next;
      if (live_locked(o->comm)) {
        post_locked(o);
      } else { /* aborted or destroyed inside the group: NCCL would use freed memory */
        g_violations++;
        snprintf(g_last, sizeof g_last, "ncclGroupEnd of an operation on a communicator that was aborted or destroyed");
        free(o);
      }
      o = next;
    }
  }
  pthread_mutex_unlock(&g_mu);
  return ncclSuccess;
}
API const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unhandled error";
  }
}
API const char *ncclGetLastError(ncclComm_t comm) { return ""; }
