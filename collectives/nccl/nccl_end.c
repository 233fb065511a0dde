/* Ending a communicator within a bound. ncclCommAbort and ncclCommDestroy free the
 * communicator's device memory (cudaFree synchronises the whole device) and join NCCL's own
 * threads, so a kernel that never ends — one of another communicator waiting for a dead peer,
 * or any stuck kernel on the device — holds them, and the rank's teardown, forever. Each runs
 * on a thread of its own and the caller waits at most the timeout; past it the thread is left
 * to finish when it can and the communicator behind (leaked): at teardown, a leak is better
 * than a hung job. Once a call of one teardown was left behind (a communicator and those split
 * from it: one job's, ended children first), the device (or NCCL) is stuck for that job, and
 * its later calls are waited for only briefly: teardown does not wait out the timeout once per
 * communicator. Another job's teardown later waits in full again: what held this one may have
 * passed, and a healthy communicator must not be leaked for it.
 *
 * Only from NCCL 2.19 on: there ncclCommAbort joins the communicator's pending job (an init or
 * a split in progress) from any thread. NCCL 2.18 joins only the calling thread's, and would
 * free the communicator under a job started on another, so there the call stays on the
 * caller's thread, unbounded, as before. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <time.h>

#include "nccl_internal.h"

#define NCCL_ANY_THREAD_ABORT 21900 /* 2.19.0 */
#define NCCL_STUCK_GRACE_MS 250      /* the wait for a call once another of its teardown was left behind */

typedef struct end_job {
  const sl_nccl_lib *L;
  ncclComm_t comm;
  bool destroy;
  pthread_mutex_t mu;
  pthread_cond_t done_cv;
  bool done;
  ncclResult_t r;
  int refs; /* the waiter's and the thread's: the last to let go frees the job */
} end_job;

static void job_put(end_job *j) {
  pthread_mutex_lock(&j->mu);
  bool last = --j->refs == 0;
  pthread_mutex_unlock(&j->mu);
  if (!last) return;
  pthread_cond_destroy(&j->done_cv);
  pthread_mutex_destroy(&j->mu);
  free(j);
}

static void *end_main(void *arg) {
  end_job *j = arg;
  ncclResult_t r = j->destroy ? j->L->CommDestroy(j->comm) : j->L->CommAbort(j->comm);
  pthread_mutex_lock(&j->mu);
  j->r = r;
  j->done = true;
  pthread_cond_signal(&j->done_cv);
  pthread_mutex_unlock(&j->mu);
  job_put(j);
  return NULL;
}

/* The job, its thread started detached; NULL when either cannot be had. */
static end_job *job_start(const sl_nccl_lib *L, ncclComm_t comm, bool destroy) {
  end_job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  *j = (end_job){.L = L, .comm = comm, .destroy = destroy, .refs = 2};
  pthread_mutex_init(&j->mu, NULL);
  pthread_condattr_t ca; /* the bound follows the monotonic clock, as every wait of the module */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&j->done_cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_attr_t ta;
  pthread_attr_init(&ta);
  pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  int rc = pthread_create(&t, &ta, end_main, j);
  pthread_attr_destroy(&ta);
  if (rc != 0) {
    pthread_cond_destroy(&j->done_cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
    return NULL;
  }
  return j;
}

/* The communicator a teardown is counted on: C's root (children end before their parent, so it
 * outlives every call of its teardown). */
static nccl_comm *teardown_of(nccl_comm *c) {
  while (c->parent) c = c->parent;
  return c;
}

/* The end of COMM, counted on ROOT's teardown (NULL: on none). */
static ncclResult_t end_on(const sl_nccl_lib *L, nccl_comm *root, ncclComm_t comm, bool destroy, int ms,
                           int *left_ms) {
  *left_ms = 0;
  end_job *j = L->version >= NCCL_ANY_THREAD_ABORT ? job_start(L, comm, destroy) : NULL;
  if (!j) return destroy ? L->CommDestroy(comm) : L->CommAbort(comm); /* 2.18, or no thread to spare */
  if (root && atomic_load(&root->left_behind) && ms > NCCL_STUCK_GRACE_MS) ms = NCCL_STUCK_GRACE_MS;
  struct timespec until;
  until = sl_deadline_in_ms(ms).at;
  pthread_mutex_lock(&j->mu);
  while (!j->done && pthread_cond_timedwait(&j->done_cv, &j->mu, &until) == 0) {
  }
  bool done = j->done;
  ncclResult_t r = j->r;
  pthread_mutex_unlock(&j->mu);
  if (!done && root) atomic_store(&root->left_behind, true);
  job_put(j);
  if (!done) {
    *left_ms = ms;
    return ncclInProgress;
  }
  return r;
}

ncclResult_t sl__nccl_end(nccl_comm *c, ncclComm_t comm, bool destroy, int ms, int *left_ms) {
  return end_on(c->L, teardown_of(c), comm, destroy, ms, left_ms);
}

ncclResult_t sl__nccl_end_alone(const sl_nccl_lib *L, ncclComm_t comm, int ms) {
  int left_ms;
  return end_on(L, NULL, comm, false, ms, &left_ms);
}
