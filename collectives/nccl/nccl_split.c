/* nccl: split. A non-blocking ncclCommSplit returns ncclInProgress at once, and NCCL writes the
 * child into *newcomm later, from a thread of its own, when the split's job ends — done or
 * failed. That is before the parent settles when all goes well, but after a failure it can be
 * after the call that started the split returned: when the parent's abort outlived its bound
 * (nccl_end.c) and ends later, the job it joins writes the child then. So the slot is never on
 * the stack: it is a heap slot owned by the parent, freed only once NCCL is done with it, and
 * a child that lands in it after a failure is aborted — at the parent's fini, or by a later
 * fini's sweep. A slot NCCL may still write when its parent goes is kept for the process's
 * life (a few bytes per failed split, at most one per communicator: the failure kills it). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>

#include "nccl_internal.h"

typedef struct nccl_slot {
  ncclComm_t child; /* written by NCCL's thread (an atomic store): read with __atomic_* only */
  const sl_nccl_lib *L;
  bool want_child; /* color >= 0: the job ends by writing a child (never NULL) */
  int timeout_ms;  /* the bound of the child's abort */
  struct nccl_slot *next; /* on the kept list */
} nccl_slot;

/* Slots of failed splits that NCCL may still write: reachable, never freed while it may. */
static pthread_mutex_t g_kept_mu = PTHREAD_MUTEX_INITIALIZER;
static nccl_slot *g_kept;

static ncclComm_t landed(nccl_slot *s) { return __atomic_load_n(&s->child, __ATOMIC_ACQUIRE); }

/* Aborts the child that landed in S, if one did, as part of C's teardown (nccl_end.c). True
 * when NCCL is done with S: its job wrote the child, and writes nothing after. */
static bool reap(nccl_comm *c, nccl_slot *s) {
  ncclComm_t child = __atomic_exchange_n(&s->child, NULL, __ATOMIC_ACQ_REL);
  if (!child) return false;
  int left_ms; /* a child whose abort outlives its bound is left to finish on its own */
  (void)sl__nccl_end(c, child, false, s->timeout_ms, &left_ms);
  return true;
}

static void keep(nccl_slot *s) {
  pthread_mutex_lock(&g_kept_mu);
  s->next = g_kept;
  g_kept = s;
  pthread_mutex_unlock(&g_kept_mu);
}

/* The kept slots a child has landed in: unlinked under the lock, reaped outside it (an abort
 * may take up to the timeout). NOCOLOR slots stay: their job ends by writing NULL, unseen. */
static void sweep_kept(nccl_comm *c) {
  nccl_slot *ready = NULL;
  pthread_mutex_lock(&g_kept_mu);
  for (nccl_slot **p = &g_kept; *p;) {
    nccl_slot *s = *p;
    if (s->want_child && landed(s)) {
      *p = s->next;
      s->next = ready;
      ready = s;
    } else {
      p = &s->next;
    }
  }
  pthread_mutex_unlock(&g_kept_mu);
  while (ready) { /* earlier communicators' children: C's teardown is not theirs */
    nccl_slot *s = ready;
    ready = s->next;
    ncclComm_t child = __atomic_exchange_n(&s->child, NULL, __ATOMIC_ACQ_REL);
    if (child) (void)sl__nccl_end_alone(c->L, child, s->timeout_ms);
    free(s);
  }
}

void sl__nccl_settle_children(nccl_comm *c) {
  nccl_slot *s = c->split_slot;
  c->split_slot = NULL;
  if (s && reap(c, s)) free(s);
  else if (s) keep(s);
  sweep_kept(c);
}

/* After a failed split (caller holds MU): the parent dies — the peers are in the same split,
 * and a live parent would let them wait on it. Its abort ends the split's job (NCCL 2.19+
 * joins it), so the child has landed once the abort returns, and is aborted too; when the
 * abort outlived its bound, the slot stays with the parent for the child that lands later. */
static sl_status split_failed(nccl_comm *c, nccl_slot *slot, sl_status st, const char *what) {
  sl__nccl_kill(c, st, SL_CCL_NAME " split on rank %d (" SL_GPU_NAME ":%d): ncclCommSplit failed (%s); the "
                       "communicator was aborted",
                c->job_rank, c->device, what);
  if (reap(c, slot)) free(slot);
  else if (!c->split_slot) c->split_slot = slot;
  else keep(slot); /* not reached: a dead parent splits no more */
  pthread_mutex_unlock(&c->mu);
  return sl__nccl_report_dead(c, "split");
}

/* The split itself, one deadline for all of it (caller holds MU, COMM live): the parent
 * settles once the split's job ended (the child written by then), then the child's own state.
 * *SUB is the child (NULL for COLOR < 0). */
static sl_status split_settle(nccl_comm *c, nccl_slot *slot, int color, int key, ncclComm_t *sub, int *n, int *me,
                              char *what, size_t len) {
  ncclConfig_t cfg;
  sl__nccl_config(&cfg);
  struct timespec until;
  until = sl_deadline_in_ms(sl__nccl_wait_ms(c)).at;
  ncclResult_t r = c->L->CommSplit(c->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &slot->child, &cfg);
  sl_status st = SL_OK;
  if (r == ncclInProgress) st = sl__nccl_settle_until(c, c->comm, &until, what, len);
  else if (r != ncclSuccess) st = SL_ERR_COMM, sl__nccl_describe(c->L, c->comm, r, what, len);
  if (st != SL_OK) return st;
  *sub = landed(slot);
  if (!*sub) {
    if (color < 0) return SL_OK;
    snprintf(what, len, SL_CCL_PRODUCT " settled the split without a new communicator");
    return SL_ERR_COMM;
  }
  if ((st = sl__nccl_settle_until(c, *sub, &until, what, len)) != SL_OK) return st;
  if (c->L->CommCount(*sub, n) != ncclSuccess || c->L->CommUserRank(*sub, me) != ncclSuccess) {
    snprintf(what, len, "cannot read the new communicator's size and rank");
    return SL_ERR_COMM;
  }
  return SL_OK;
}

/* SUB wrapped like its parent (its own watchdog; an abort of the parent reaches it through
 * PARENT). On failure SUB is aborted: this rank leaves the group, whose peers time out. */
static sl_status wrap_child(nccl_comm *c, ncclComm_t sub, int n, int me, void **out) {
  int left_ms;
  nccl_comm *s = sl__nccl_comm_new(c->host, c->L, c->be_ops, c->be, c->device, c->timeout_ms);
  if (!s) {
    (void)sl__nccl_end(c, sub, false, sl__nccl_wait_ms(c), &left_ms);
    return c->host->fail(c->host->core, SL_ERR_NOMEM, SL_CCL_NAME " split on rank %d: out of memory", c->job_rank);
  }
  s->comm = sub;
  s->rank = me;
  s->world = n;
  s->job_rank = c->job_rank;
  s->parent = c;
  sl_status st = sl__nccl_comm_resources(s);
  if (st != SL_OK) {
    (void)sl__nccl_end(c, sub, false, sl__nccl_wait_ms(c), &left_ms); /* no op was issued on it */
    s->comm = NULL;
    sl__nccl_comm_free(s);
    return st;
  }
  *out = s;
  return SL_OK;
}

sl_status sl__nccl_split(nccl_comm *c, int color, int key, void **out) {
  sl__nccl_bind(c);
  *out = NULL;
  if (atomic_load(&c->dead) || sl__nccl_aborted(c)) return sl__nccl_report_dead(c, "split");
  nccl_slot *slot = calloc(1, sizeof *slot);
  pthread_mutex_lock(&c->mu);
  if (!c->comm) {
    pthread_mutex_unlock(&c->mu);
    free(slot);
    return sl__nccl_report_dead(c, "split");
  }
  if (!slot) {
    sl__nccl_kill(c, SL_ERR_NOMEM, SL_CCL_NAME " split on rank %d (" SL_GPU_NAME ":%d): out of memory; the "
                                   "communicator was aborted",
                  c->job_rank, c->device);
    pthread_mutex_unlock(&c->mu);
    return sl__nccl_report_dead(c, "split");
  }
  *slot = (nccl_slot){.L = c->L, .want_child = color >= 0, .timeout_ms = sl__nccl_wait_ms(c)};
  ncclComm_t sub = NULL;
  int n = 0, me = 0;
  char what[NCCL_MSG_LEN / 2] = "";
  sl_status st = split_settle(c, slot, color, key, &sub, &n, &me, what, sizeof what);
  if (st != SL_OK) return split_failed(c, slot, st, what); /* unlocks */
  pthread_mutex_unlock(&c->mu);
  free(slot); /* the split's job ended (the parent settled): NCCL writes it no more */
  return sub ? wrap_child(c, sub, n, me, out) : SL_OK;
}
