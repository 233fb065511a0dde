/* nccl module internals: libnccl.so.2 opened at run time, the communicator, its watchdog.
 * Private to collectives/nccl; nothing here crosses the module boundary. */
#ifndef SL_NCCL_INTERNAL_H
#define SL_NCCL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "vendor.h" /* cuda_runtime_api.h, or the HIP map (backends/cuda) */
/* types and constants only: every function comes through sl_nccl_lib */
#ifdef SL_VENDOR_HIP
#include "rccl_abi.h" /* RCCL's (collectives/rccl) */
#else
#include <nccl.h>
#endif

#include "shardload/module.h"
#include "shardload/module_util.h" /* deadlines, sl_ms_since, sl_timeout_ms */

#define NCCL_MSG_LEN 1024

/* The NCCL functions this module calls, resolved with dlsym so that the module loads (and its
 * probe explains) on machines without NCCL. */
typedef struct sl_nccl_lib {
  ncclResult_t (*GetVersion)(int *);
  ncclResult_t (*GetUniqueId)(ncclUniqueId *);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommFinalize)(ncclComm_t);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
  ncclResult_t (*CommCount)(const ncclComm_t, int *);
  ncclResult_t (*CommUserRank)(const ncclComm_t, int *);
  ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*GroupStart)(void);
  ncclResult_t (*GroupEnd)(void);
  const char *(*GetErrorString)(ncclResult_t);
  const char *(*GetLastError)(ncclComm_t);
  int version; /* ncclGetVersion's, read once at load (2.19.0 = 21900) */
} sl_nccl_lib;

/* The library, opened once per process (never closed: NCCL keeps threads of its own); NULL
 * with WHY filled when it cannot be opened or lacks a function. */
const sl_nccl_lib *sl__nccl_lib(char *why, size_t len);

/* "what NCCL said": the result's string plus NCCL's last error text (COMM may be NULL). */
void sl__nccl_describe(const sl_nccl_lib *L, ncclComm_t comm, ncclResult_t r, char *buf, size_t len);

/* The device runtime calls of the data path: the events the watchdog waits on and the root's
 * own part of a scatterv (a device-to-device copy). Through a table so that the test of the
 * module against a fake NCCL (test_nccl_module --fake) runs ops to their end without a device;
 * every communicator starts with sl__nccl_rt, the vendor runtime's (nccl_init.c). */
typedef struct sl_nccl_rt {
  cudaError_t (*EventCreate)(cudaEvent_t *ev); /* cudaEventDisableTiming */
  cudaError_t (*EventRecord)(cudaEvent_t ev, cudaStream_t s);
  cudaError_t (*EventQuery)(cudaEvent_t ev);
  cudaError_t (*EventDestroy)(cudaEvent_t ev);
  cudaError_t (*CopyAsync)(void *dst, const void *src, size_t bytes, cudaStream_t s); /* device to device */
} sl_nccl_rt;
extern const sl_nccl_rt sl__nccl_rt;

/* An operation the watchdog waits for: an event recorded after it on its stream. */
typedef struct nccl_pending {
  cudaEvent_t ev;
  const char *op;
} nccl_pending;

#define NCCL_MAX_PENDING 64 /* past this many, the caller waits for the oldest (back-pressure) */

typedef struct nccl_comm {
  const sl_module_host *host;
  const sl_nccl_lib *L;
  const sl_nccl_rt *rt; /* sl__nccl_rt but in the fake test */
  const sl_backend_ops *be_ops;
  void *be;
  sl_ext_native_stream_fn native; /* the backend's SL_EXT_NATIVE_STREAM: its streams' cudaStream_t */
  const sl_control_plane *control; /* the root communicator's only: subs hold NULL */
  struct nccl_comm *parent;
  int rank, world, job_rank, device, timeout_ms;

  pthread_mutex_t mu;    /* guards COMM (calls into NCCL), the queue and the reason below */
  pthread_cond_t wake;   /* the queue or STOP changed */
  ncclComm_t comm;       /* NULL once aborted or destroyed */
  nccl_pending q[NCCL_MAX_PENDING];
  int q_head, q_len;
  struct timespec last_progress; /* when the oldest pending op was queued or the last one finished */
  cudaEvent_t spare[NCCL_MAX_PENDING];
  int n_spare;

  /* The slot of a failed split whose child NCCL may still write (nccl_split.c), and whether an
   * ncclCommAbort/Destroy of COMM outlived its bound (nccl_end.c): then its kernels may still
   * run on OWN_STREAM, which is left behind with it. */
  struct nccl_slot *split_slot;
  /* The root's only (nccl_end.c): a call of this communicator's teardown, or of one split from
   * it (freed first), was left behind, so the rest of that teardown waits only briefly. */
  atomic_bool left_behind;
  bool leaked;
  const char *leaked_call;
  int leaked_ms; /* the wait it outlived */

  atomic_int abort_req; /* set by abort(), possibly from a signal handler */
  atomic_int dead;      /* the communicator was aborted: every later call fails */
  char why[NCCL_MSG_LEN]; /* why it died (written under MU, once) */
  sl_status why_status;   /* and the status that says it */
  bool stop;              /* fini: the watchdog ends */
  pthread_t watchdog;
  bool watching;

  /* A backend stream of the module's own, for the barrier (which is no caller's work). */
  void *own_stream;
  void *barrier_buf; /* WORLD bytes of device memory for the barrier's allgather */
} nccl_comm;

/* nccl_init.c */
nccl_comm *sl__nccl_comm_new(const sl_module_host *host, const sl_nccl_lib *L, const sl_backend_ops *be_ops, void *be,
                             int device, int timeout_ms);
void sl__nccl_comm_free(nccl_comm *c); /* COMM already destroyed or aborted */
sl_status sl__nccl_settle(nccl_comm *c, ncclComm_t comm, char *what, size_t len);
/* The same against a deadline of the caller's (one bound for several settles). */
sl_status sl__nccl_settle_until(nccl_comm *c, ncclComm_t comm, const struct timespec *until, char *what,
                                size_t len);
void sl__nccl_config(ncclConfig_t *cfg);
sl_status sl__nccl_comm_resources(nccl_comm *c);
sl_status sl__nccl_init(const sl_collective_init *in, nccl_comm **out); /* arguments checked by the caller */

/* nccl_watch.c */
sl_status sl__nccl_watch_start(nccl_comm *c);
void sl__nccl_watch_stop(nccl_comm *c);
/* After enqueueing OP on STREAM: records an event there for the watchdog. Caller holds MU. */
sl_status sl__nccl_track(nccl_comm *c, const char *op, cudaStream_t stream);
/* Kills the communicator (caller holds MU): ncclCommAbort once, WHY remembered. */
void sl__nccl_kill(nccl_comm *c, sl_status why, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Waits until every tracked op completed or the communicator died, at most the timeout. Caller
 * does not hold MU. SL_OK when drained. */
sl_status sl__nccl_drain(nccl_comm *c, const char *op);
bool sl__nccl_aborted(const nccl_comm *c);
int sl__nccl_wait_ms(const nccl_comm *c);

/* nccl_end.c: ncclCommAbort (or, with DESTROY, ncclCommDestroy) of COMM, part of C's teardown
 * (COMM is C's, or one C made or reaps), waited for at most MS (less once a call of the same
 * teardown was left behind). ncclSuccess or NCCL's error; past the bound *LEFT_MS is the wait
 * that passed (0 otherwise) and COMM is left to finish, or not, on a thread of its own. COMM
 * must not be used again either way. */
ncclResult_t sl__nccl_end(nccl_comm *c, ncclComm_t comm, bool destroy, int ms, int *left_ms);
/* An abort of COMM that is no teardown's (a child of an earlier communicator, landed late):
 * bounded by MS, and a stuck one shortens no teardown's grace. */
ncclResult_t sl__nccl_end_alone(const sl_nccl_lib *L, ncclComm_t comm, int ms);

/* nccl.c: fails with why C died (the watchdog's or an abort's reason), on the caller's thread. */
sl_status sl__nccl_report_dead(nccl_comm *c, const char *op);

/* nccl_split.c: the split op, and the children of failed splits that land after it returned. */
sl_status sl__nccl_split(nccl_comm *c, int color, int key, void **out);
/* At C's fini: its pending slot (a child there is aborted; a slot NCCL may still write is kept
 * for the process's life), then every kept slot a child has landed in since. */
void sl__nccl_settle_children(nccl_comm *c);

/* Selects C's device on the calling thread (nccl_init.c). */
void sl__nccl_bind(const nccl_comm *c);
/* The cudaStream_t of the backend's STREAM (NULL: its default stream), through the backend's
 * SL_EXT_NATIVE_STREAM (nccl_init.c). */
cudaStream_t sl__nccl_stream(const nccl_comm *c, void *stream);

#endif
