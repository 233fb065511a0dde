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
 *    ncclCommUserRank, ncclCommFinalize, ncclCommDestroy), fails and counts a violation.
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
static cudaStream_t g_last_stream; /* the stream the last data op was given */
static int g_data_ops;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void nap_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static fcomm *comm_new(int nranks, int rank, ncclResult_t state, double ready_at) {
  fcomm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->nranks = nranks;
  c->rank = rank;
  atomic_init(&c->state, state);
  c->ready_at = ready_at;
  pthread_mutex_lock(&g_mu);
  c->next = g_live;
  g_live = c;
  g_nlive++;
  pthread_mutex_unlock(&g_mu);
  return c;
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
  int n = g_violations;
  if (last && len) snprintf(last, len, "%s", g_last);
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
  memcpy(id->internal, "fakenccl", 8);
  return ncclSuccess;
}
API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *cfg) {
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  bool blocking = !cfg || cfg->blocking != 0;
  fcomm *c = comm_new(nranks, rank, blocking ? ncclSuccess : ncclInProgress, blocking ? 0 : now_ms() + 5);
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
  fcomm *child = j->nocolor ? NULL : comm_new(1, 0, res, 0);
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
/* No data moves without a device: the data ops refuse, after noting the stream they were given
 * (what the module must take from the backend: its streams' cudaStream_t). */
API ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                               cudaStream_t st) {
  saw_stream(st);
  return ncclInvalidUsage;
}
API ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  saw_stream(st);
  return ncclInvalidUsage;
}
API ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  saw_stream(st);
  return ncclInvalidUsage;
}
API ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  saw_stream(st);
  return ncclInvalidUsage;
}
API ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
API ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
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
