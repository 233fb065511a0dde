/* The hierarchical host-staging collective: shm within each host, Gloo between the hosts'
 * leaders (docs/DESIGN.md#hier). Host memory, synchronous (SL_COLL_SYNC).
 *
 * At its start the ranks tell each other their host, as the shm collective tells hosts apart
 * (sl__shm_host_key: boot id, host name, namespaces, uid), over the control plane. A host is
 * numbered by its first rank, a rank within its host by its rank; the host's first rank is its
 * leader. One Gloo communicator spans the whole communicator (opened over the control plane, as
 * simccl's is); it is split into one per host (the control plane of that host's shm
 * communicator) and one of the leaders, whose rank h is host h's leader. A host of one rank has
 * no shm communicator.
 *
 * broadcast: the root's host over shm, the leaders over Gloo from the root's host's leader,
 * every other host over shm from its leader (a leader root sends to the leaders first).
 * scatterv from a leader root (the loader's: root 0 of any communicator is the lowest key, its
 * host's leader): the leaders learn the count table, the root sends each other leader its
 * host's parts in one piece (straight from the send buffer where they lie in order, else packed
 * into a scratch buffer kept on the communicator), and each leader scatters them over its
 * host's shm; the root's host scatters straight from the send buffer. From a root that leads
 * no host: the whole communicator's Gloo scatterv (correct, slower). allgather, barrier: the
 * whole communicator's Gloo.
 *
 * Failures: every step's module names the rank it lost; a leader whose Gloo step failed breaks
 * its host's shm communicator (sl__shm_break), so that the ranks of its host waiting on it fail
 * at once naming the rank it lost. While in a Gloo step a leader is away (sl__shm_away): a rank
 * of its host whose wait on it runs out then waits for that step's end rather than name its
 * leader, alive. On more than two hosts the root of a failed leaders' step tells the leaders
 * waiting on it whom it lost (the verdict), so that they name the silent host rather than the
 * root. Any failure breaks the communicator for good. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../shm/shm.h"
#include "internal.h"
#include "shardload/module_util.h" /* sl_scatter_items_read */

#define HIER_KEY 256 /* a host key (sl__shm_host_key) */
#define HIER_WHY SHM_WHY

/* The host the parts report through (shm.h's keeping host): it passes every message on and
 * keeps the last failure's, so that a later op of a broken communicator can say what broke it.
 * One per init, shared by its splits (Gloo's and shm's sub-communicators keep their parent's
 * host). */
typedef keeping_host keeper;

typedef struct hier_comm {
  const sl_module_host *host;     /* the keeper's */
  keeper *kp;                     /* init's own (NULL for a split: its parent's) */
  const sl_collective_ops *g, *s; /* gloo, shm */
  int rank, n;
  int *job;      /* communicator rank -> the job's rank (what messages name) */
  int *host_of;  /* communicator rank -> its host */
  int *local_of; /* communicator rank -> its rank within its host */
  int *members;  /* host h's ranks, in order, at members + first_of[h] */
  int *first_of; /* host -> where its ranks start in members (nhosts + 1 entries) */
  int nhosts, myhost;
  void *world;   /* Gloo over the whole communicator */
  void *hostg;   /* Gloo over this host (the shm communicator's control plane; init's only) */
  void *leaders; /* Gloo over the hosts' leaders (NULL unless this rank leads and nhosts > 1) */
  void *verdict; /* Gloo over the leaders too, for a failed step's verdict (init's, nhosts > 2) */
  int grace_ms;  /* the verdicts' grace (verdict_grace_ms) */
  bool cut_off;  /* its verdicts found this host cut off from every other (step_failed) */
  void *local;   /* shm over this host (NULL for a host of one rank) */
  sl_control_plane hostctl;
  uint64_t *table;           /* n counts: a scatterv's, as the leaders learn them */
  size_t *hcounts, *hdispls; /* a host's or the leaders' counts and displacements */
  unsigned char *scratch;
  size_t cap;
  sl_status broken;
  char why[HIER_WHY]; /* what broke it */
  int lost[8];        /* job ranks the leaders' Gloo lost (its `lost`), for hier_lost */
  int nlost;
  atomic_int aborted;
} hier_comm;

static int size_of(const hier_comm *c, int h) { return c->first_of[h + 1] - c->first_of[h]; }
static int leader_of(const hier_comm *c, int h) { return c->members[c->first_of[h]]; }
static bool leads(const hier_comm *c) { return leader_of(c, c->myhost) == c->rank; }

static void comm_free(hier_comm *c) {
  if (!c) return;
  free(c->job), free(c->host_of), free(c->local_of), free(c->members), free(c->first_of);
  free(c->table), free(c->hcounts), free(c->hdispls), free(c->scratch);
  free(c->kp);
  free(c);
}

/* A communicator of N ranks whose hosts are HOST (by rank: any ints, equal for one host) and
 * whose job ranks are JOB: the hosts numbered by first appearance. */
static hier_comm *comm_new(const sl_module_host *host, int n, int rank, const int *hostkey, const int *job) {
  hier_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->host = host;
  c->g = sl__collective_gloo();
  c->s = sl__collective_shm();
  c->n = n;
  c->rank = rank;
  atomic_init(&c->aborted, 0);
  size_t k = (size_t)n;
  c->job = calloc(k, sizeof *c->job), c->host_of = calloc(k, sizeof *c->host_of);
  c->local_of = calloc(k, sizeof *c->local_of), c->members = calloc(k, sizeof *c->members);
  c->first_of = calloc(k + 1, sizeof *c->first_of), c->table = calloc(k, sizeof *c->table);
  c->hcounts = calloc(k, sizeof *c->hcounts), c->hdispls = calloc(k, sizeof *c->hdispls);
  if (!c->job || !c->host_of || !c->local_of || !c->members || !c->first_of || !c->table || !c->hcounts ||
      !c->hdispls) {
    comm_free(c);
    return NULL;
  }
  /* hosts in order of first appearance; members by host, in rank order */
  int *first = calloc(k, sizeof *first), *count = calloc(k, sizeof *count);
  if (!first || !count) {
    free(first), free(count);
    comm_free(c);
    return NULL;
  }
  for (int r = 0; r < n; r++) {
    c->job[r] = job[r];
    int h = 0;
    while (h < c->nhosts && hostkey[first[h]] != hostkey[r]) h++;
    if (h == c->nhosts) first[c->nhosts++] = r;
    c->host_of[r] = h;
  }
  free(first);
  for (int r = 0; r < n; r++) count[c->host_of[r]]++;
  c->first_of[0] = 0;
  for (int h = 0; h < c->nhosts; h++) c->first_of[h + 1] = c->first_of[h] + count[h], count[h] = 0;
  for (int r = 0; r < n; r++) {
    int h = c->host_of[r];
    c->local_of[r] = count[h];
    c->members[c->first_of[h] + count[h]++] = r;
  }
  free(count);
  c->myhost = c->host_of[rank];
  return c;
}

/* ---- the host's shm communicator's control plane: the host's Gloo ---------------------------- */

static sl_status hostctl_broadcast(void *ctx, void *buf, size_t bytes, int root) {
  hier_comm *c = ctx;
  return c->g->broadcast(c->hostg, buf, bytes, root, NULL);
}

static sl_status hostctl_allgather(void *ctx, const void *sendbuf, void *recvbuf, size_t bytes) {
  hier_comm *c = ctx;
  return c->g->allgather(c->hostg, sendbuf, recvbuf, bytes, NULL);
}

static void hier_fini(void *comm) {
  hier_comm *c = comm;
  if (!c) return;
  /* sub-communicators before their parents (module.h) */
  if (c->local) c->s->fini(c->local);
  if (c->verdict) c->g->fini(c->verdict);
  if (c->leaders) c->g->fini(c->leaders);
  if (c->hostg) c->g->fini(c->hostg);
  if (c->world) c->g->fini(c->world);
  comm_free(c);
}

/* The job's ranks of host H, for the shm communicator's messages. */
static sl_status label_host(hier_comm *c) {
  int k = size_of(c, c->myhost);
  int *labels = malloc((size_t)k * sizeof *labels);
  if (!labels) return c->host->fail(c->host->core, SL_ERR_NOMEM, "hier: out of memory");
  for (int i = 0; i < k; i++) labels[i] = c->job[c->members[c->first_of[c->myhost] + i]];
  sl_status st = sl__shm_label(c->local, labels);
  free(labels);
  return st;
}

/* How long a leader that failed waiting on a leaders' step's root waits for the root's verdict:
 * the root's own wait on the host it lost ran out about when this rank's did (it started it
 * when this rank started waiting on the root, or a moment before), and every rank must be out
 * within the timeout and little more. */
static int verdict_grace_ms(int timeout_ms) {
  int t = timeout_ms > 0 ? timeout_ms / 4 : 2000;
  return t < 100 ? 100 : t > 2000 ? 2000 : t;
}

static sl_status hier_init(const sl_collective_init *init, void **comm) {
  *comm = NULL;
  if (!init->host) return SL_ERR_INVALID;
  const sl_module_host *host = init->host;
  if (init->size < offsetof(sl_collective_init, ops) || !init->control)
    return host->fail(host->core, SL_ERR_INVALID,
                      "the hier collective is a data collective: it starts over a control plane (sl_collective_init."
                      "control), which this caller did not give");
  int n = init->world_size, me = init->rank;
  if (n < 1 || me < 0 || me >= n) return host->fail(host->core, SL_ERR_INVALID, "hier: rank %d of %d", me, n);
  const sl_control_plane *ctl = init->control;
  /* every rank's host */
  char mine[HIER_KEY] = "";
  sl__shm_host_key(mine, sizeof mine);
  char(*all)[HIER_KEY] = calloc((size_t)n, sizeof *all);
  int *key = calloc((size_t)n, sizeof *key), *job = calloc((size_t)n, sizeof *job);
  sl_status st = all && key && job ? ctl->allgather(ctl->ctx, mine, all, sizeof mine)
                                   : host->fail(host->core, SL_ERR_NOMEM, "hier: out of memory for %d ranks", n);
  for (int r = 0; st == SL_OK && r < n; r++) {
    all[r][HIER_KEY - 1] = 0; /* a peer's text: terminated before it is compared */
    key[r] = r;
    for (int q = 0; q < r; q++)
      if (strcmp(all[q], all[r]) == 0) {
        key[r] = key[q];
        break;
      }
    job[r] = r;
  }
  keeper *kp = st == SL_OK ? calloc(1, sizeof *kp) : NULL;
  hier_comm *c = kp ? comm_new(&kp->h, n, me, key, job) : NULL;
  free(all), free(key), free(job);
  if (st == SL_OK && !c) st = host->fail(host->core, SL_ERR_NOMEM, "hier: out of memory for %d ranks", n);
  if (st != SL_OK) {
    free(kp);
    return st;
  }
  sl__keeping_host_init(kp, host);
  c->kp = kp;
  /* the whole communicator's Gloo, bootstrapped over the control plane, in a key space of its own */
  char prefix[320], lobby[320];
  snprintf(prefix, sizeof prefix, "%shier/", init->prefix ? init->prefix : "");
  snprintf(lobby, sizeof lobby, "%shier/", init->lobby ? init->lobby : "");
  sl_collective_init gi;
  memset(&gi, 0, sizeof gi);
  memcpy(&gi, init, init->size < sizeof gi ? init->size : sizeof gi);
  gi.size = sizeof gi;
  gi.host = c->host;
  gi.prefix = prefix;
  gi.lobby = lobby;
  gi.ops = c->g;
  st = c->g->init(&gi, &c->world);
  if (st == SL_OK) st = c->g->split(c->world, c->myhost, me, &c->hostg);
  if (st == SL_OK && c->nhosts > 1) st = c->g->split(c->world, leads(c) ? 0 : -1, me, &c->leaders);
  /* where a leaders' step has more than one peer to wait on, a leader that waited on the step's
   * root learns from it whom it lost, within a grace (leader_failed) */
  if (st == SL_OK && c->nhosts > 2) st = c->g->split(c->world, leads(c) ? 0 : -1, me, &c->verdict);
  c->grace_ms = verdict_grace_ms(init->timeout_ms);
  if (st == SL_OK && c->verdict) sl__gloo_set_timeout(c->verdict, c->grace_ms);
  if (st == SL_OK && size_of(c, c->myhost) > 1) {
    c->hostctl = (sl_control_plane){sizeof c->hostctl, c, hostctl_broadcast, hostctl_allgather};
    sl_collective_init si = gi;
    si.rank = c->local_of[me];
    si.world_size = size_of(c, c->myhost);
    si.rendezvous = NULL;
    si.control = &c->hostctl;
    si.ops = c->s;
    st = c->s->init(&si, &c->local);
    if (st != SL_OK) c->local = NULL;
    if (st == SL_OK) st = label_host(c);
  }
  /* a rank that failed here fails every rank: the core agrees on the start (planes.c, open_data) */
  if (st != SL_OK) {
    hier_fini(c);
    return st;
  }
  host->log(host->core, SL_LOG_DEBUG, "hier: rank %d is rank %d of host %d (%d ranks) of %d hosts", me, c->local_of[me],
            c->myhost, size_of(c, c->myhost), c->nhosts);
  *comm = c;
  return SL_OK;
}

/* ---- the ops -------------------------------------------------------------------------------- */

/* An op's outcome: a failure breaks the communicator for good. */
static sl_status done(hier_comm *c, sl_status st) {
  if (st != SL_OK && c->broken == SL_OK) {
    c->broken = st;
    keeper *k = c->host->core;
    snprintf(c->why, sizeof c->why, "%s", k->last);
  }
  return st;
}

static sl_status usable(hier_comm *c, const char *op) {
  if (atomic_load(&c->aborted))
    return done(c, c->host->fail(c->host->core, SL_ERR_COMM, "hier %s: aborted (sl_context_abort) on rank %d", op,
                                 c->job[c->rank]));
  if (c->broken == SL_OK) {
    ((keeper *)c->host->core)->last[0] = 0; /* what this op's steps say, and nothing older */
    return SL_OK;
  }
  return c->host->fail(c->host->core, c->broken, "hier %s: the data plane failed earlier: %s", op, c->why);
}

/* This leader is away between the hosts (a leaders' Gloo step) or back: a rank of its host
 * whose wait on it runs out meanwhile waits for the step's end (sl__shm_away), which its Gloo
 * timeout bounds, rather than name this rank, alive, when it is another host that is silent. */
static void away(hier_comm *c, bool on) {
  if (c->local) sl__shm_away(c->local, on);
}

/* The job's rank LOST's communicator rank, or -1. */
static int comm_rank_of(const hier_comm *c, int lost) {
  for (int r = 0; r < c->n && lost >= 0; r++)
    if (c->job[r] == lost) return r;
  return -1;
}

/* This leader failed (ST, having lost the job's rank LOST, or -1: this rank's own finding; a
 * Gloo step's failure comes through step_failed, with its verdicts): the ranks of its host
 * that wait on it in shm fail at once rather than at the timeout, naming whom it lost. */
static sl_status leader_failed(hier_comm *c, sl_status st, const char *op, int lost) {
  /* whom the leaders' Gloo blamed, for the control plane (hier_lost) */
  if (c->leaders && SL_HAS_OP(c->g, lost) && c->nlost == 0)
    c->nlost = c->g->lost(c->leaders, c->lost, (int)(sizeof c->lost / sizeof c->lost[0]));
  /* the rank the step's own message names, where it names one (Gloo's "lost rank N"), else
   * the one Gloo blamed (a timeout's "waiting for rank N") */
  char last[HIER_WHY];
  snprintf(last, sizeof last, "%s", ((keeper *)c->host->core)->last);
  const char *at = strstr(last, "lost rank ");
  int named;
  if (at && sscanf(at, "lost rank %d", &named) == 1 && named >= 0) lost = named;
  int q = comm_rank_of(c, lost);
  /* another host's leader leaves the job when it loses a rank of its host, which only its
   * own message names: say whom it leads (docs/DESIGN.md#hier) */
  if (!c->cut_off && q >= 0 && c->host_of[q] != c->myhost && leader_of(c, c->host_of[q]) == q &&
      size_of(c, c->host_of[q]) > 1) {
    char list[96] = "";
    int h = c->host_of[q], k = size_of(c, h);
    size_t used = 0;
    for (int i = 0; i < k && i < 8; i++) {
      int w = snprintf(list + used, sizeof list - used, "%s%d", i ? ", " : "", c->job[c->members[c->first_of[h] + i]]);
      if (w > 0 && (size_t)w < sizeof list - used) used += (size_t)w;
    }
    st = c->host->fail(c->host->core, st,
                       "%s (rank %d leads the ranks %s%s of its host, and fails when it loses one of them: see its own "
                       "message)",
                       last, lost, list, k > 8 ? " ..." : "");
  }
  if (c->local) {
    char why[160];
    snprintf(why, sizeof why, "hier %s: leader rank %d of its host failed between the hosts", op, c->job[c->rank]);
    sl__shm_break(c->local, st, lost, why);
  }
  return st;
}

/* A failed leaders' step's verdicts. Whom a leader's Gloo blames can mislead: it waited on a
 * leader that may itself only wait on another, silent, host (a step's root stuck sending to
 * it; in a group, a leader still stuck in the last group while this one went on to the next),
 * and that leader, once failed, is gone to it too. So every leader whose Gloo step failed
 * tells every other whom it blames, each peer on its own within the grace
 * (sl__gloo_exchange over the verdict communicator: a silent host costs only its own slot,
 * where a collective would stop at it, and a leader that has exited refuses at once):
 * - a leader whose blamed leader told a verdict (it is alive: it failed too) names whom that
 *   one blames, or, where it blames this rank back, a leader that told nothing (silent);
 * - a leader that heard no other leader at all, none having refused, is the one cut off (its
 *   link down, a partition): it names every other host, so that its control plane (rank 0's
 *   store) waits for none of them;
 * - else its own finding stands (docs/DESIGN.md#hier, Failures). */
typedef struct verdict {
  int32_t magic, lost, check;
} verdict;
#define HIER_VERDICT 0x76726476 /* "vdrv" */

/* Whom this leader's failed Gloo step blames: the job rank its message names ("lost rank N"),
 * else LOST (what the step knows: the root it waited on), else the first its Gloo noted. */
static int blamed(hier_comm *c, int lost) {
  const char *at = strstr(((keeper *)c->host->core)->last, "lost rank");
  int named;
  if (at && (sscanf(at, "lost rank %d", &named) == 1 || sscanf(at, "lost ranks %d", &named) == 1) &&
      comm_rank_of(c, named) >= 0)
    return named;
  return lost >= 0 ? lost : c->nlost > 0 ? c->lost[0] : -1;
}

/* A leader's Gloo step between the hosts failed (ST; LOST: whom the step blames, or -1): the
 * verdicts, then its host hears whom it lost (leader_failed). */
static sl_status step_failed(hier_comm *c, sl_status st, const char *op, int lost) {
  if (c->leaders && SL_HAS_OP(c->g, lost) && c->nlost == 0)
    c->nlost = c->g->lost(c->leaders, c->lost, (int)(sizeof c->lost / sizeof c->lost[0]));
  int b = blamed(c, lost);
  if (!c->verdict) return leader_failed(c, st, op, b);
  const int H = c->nhosts;
  verdict mine = {HIER_VERDICT, b, HIER_VERDICT ^ ~b}, *all = calloc((size_t)H, sizeof *all);
  unsigned char *got = calloc((size_t)H, 1);
  char last[HIER_WHY], was[HIER_WHY];
  snprintf(was, sizeof was, "%s", ((keeper *)c->host->core)->last);
  if (!all || !got) {
    free(all), free(got);
    return leader_failed(c, st, op, b);
  }
  /* a leader that waits on this one in the failed step takes part only once it fails too */
  sl__gloo_hang_up(c->leaders);
  sl__gloo_exchange(c->verdict, &mine, sizeof mine, all, got);
  int heard = 0, refused = 0, theirs = -1;
  for (int h = 0; h < H; h++)
    if (h != c->myhost) heard += got[h] == 1, refused += got[h] == 2;
  int qb = comm_rank_of(c, b), bh = qb >= 0 ? c->host_of[qb] : -1;
  if (heard == 0 && refused == 0 && H > 2) { /* cut off: every other host is silent to this one */
    int n = 0;
    char list[96] = "";
    size_t used = 0;
    for (int h = 0; h < H; h++) {
      if (h == c->myhost) continue;
      if (n < (int)(sizeof c->lost / sizeof c->lost[0])) c->lost[n++] = c->job[leader_of(c, h)];
      int w = snprintf(list + used, sizeof list - used, "%s%d", used ? ", " : "", c->job[leader_of(c, h)]);
      if (w > 0 && (size_t)w < sizeof list - used) used += (size_t)w;
    }
    c->nlost = n;
    c->cut_off = true;
    theirs = c->lost[0];
    snprintf(last, sizeof last,
             "hier %s: lost rank %d and every other host's leader (ranks %s): none answered within %d ms after the "
             "failure, so rank %d's host is cut off from them (a link down, a partition) or they all failed: %.*s",
             op, theirs, list, c->grace_ms, c->job[c->rank], (int)sizeof last - 220, was);
  } else if (bh >= 0 && bh != c->myhost && leader_of(c, bh) == qb && got[bh] == 1) {
    /* the blamed leader told its verdict: alive, and failed too */
    const verdict *v = &all[bh];
    int q = v->magic == HIER_VERDICT && v->check == (HIER_VERDICT ^ ~v->lost) ? comm_rank_of(c, v->lost) : -1;
    /* trust no peer: a rank of the communicator, on neither this host nor the teller's */
    if (q >= 0 && c->host_of[q] != c->myhost && c->host_of[q] != bh) theirs = v->lost;
    if (q >= 0 && c->host_of[q] == c->myhost) /* it blames this one back: a leader that told nothing */
      for (int h = 0; theirs < 0 && h < H; h++)
        if (h != c->myhost && h != bh && got[h] == 0) theirs = c->job[leader_of(c, h)];
    if (theirs >= 0) {
      snprintf(last, sizeof last, "hier %s: rank %d lost rank %d and failed; rank %d waited on it: %.*s", op, b, theirs,
               c->job[c->rank], (int)sizeof last - 120, was); /* the head says it all */
      c->lost[0] = theirs, c->nlost = 1;                      /* the host behind it is the one lost (hier_lost) */
    }
  }
  free(all), free(got);
  if (theirs < 0) return leader_failed(c, st, op, b);
  c->host->fail(c->host->core, st, "%s", last);
  return leader_failed(c, st, op, theirs);
}

/* The leaders' broadcast from host RH's leader: Gloo's scatterv of the one buffer to each
 * (flat), whose sends are watched, so that a leader that died fails the root at once, where a
 * send of Gloo's own broadcast to a dead peer may wait out the timeout. */
static sl_status leaders_bcast(hier_comm *c, void *buf, size_t bytes, int rh) {
  sl_status st;
  away(c, true);
  if (c->myhost != rh) {
    st = c->g->scatterv(c->leaders, NULL, NULL, NULL, buf, bytes, rh, NULL);
  } else {
    for (int h = 0; h < c->nhosts; h++) c->hcounts[h] = h == rh ? 0 : bytes, c->hdispls[h] = 0;
    st = c->g->scatterv(c->leaders, buf, c->hcounts, c->hdispls, NULL, 0, rh, NULL);
  }
  if (st == SL_OK) away(c, false); /* failed: it stays away until leader_failed breaks its shm */
  return st;
}

/* The leaders' scatterv of a host's parts in one piece from host RH's leader, away as above. */
static sl_status leaders_scatterv(hier_comm *c, const void *send, void *recv, size_t recvbytes, int rh) {
  away(c, true);
  sl_status st = c->g->scatterv(c->leaders, send, c->hcounts, c->hdispls, recv, recvbytes, rh, NULL);
  if (st == SL_OK) away(c, false);
  return st;
}

static sl_status bad_root(hier_comm *c, const char *op, int root) {
  return done(c, c->host->fail(c->host->core, SL_ERR_INVALID, "hier %s: root %d is not a rank of %d", op, root, c->n));
}

static sl_status hier_broadcast(void *comm, void *buf, size_t bytes, int root, void *stream) {
  hier_comm *c = comm;
  sl_status st = usable(c, "broadcast");
  if (st != SL_OK) return st;
  if (root < 0 || root >= c->n) return bad_root(c, "broadcast", root);
  int rh = c->host_of[root];
  bool lead = c->leaders && leads(c);
  if (c->myhost == rh) {
    /* a leader root sends to the other hosts first: they work while its own host takes it */
    bool first = leader_of(c, rh) == root;
    if (first && lead && (st = leaders_bcast(c, buf, bytes, rh)) != SL_OK)
      return done(c, step_failed(c, st, "broadcast", -1));
    if (st == SL_OK && c->local) st = c->s->broadcast(c->local, buf, bytes, c->local_of[root], NULL);
    /* the last step: nobody of this host waits on it now, but its next op would wait on this
     * rank, which no longer takes part: its host hears whom it lost at once */
    if (st == SL_OK && !first && lead && (st = leaders_bcast(c, buf, bytes, rh)) != SL_OK)
      return done(c, step_failed(c, st, "broadcast", -1));
    return done(c, st);
  }
  if (lead && (st = leaders_bcast(c, buf, bytes, rh)) != SL_OK)
    return done(c, step_failed(c, st, "broadcast", c->job[leader_of(c, rh)]));
  if (c->local) st = c->s->broadcast(c->local, buf, bytes, 0, NULL);
  return done(c, st);
}

/* Room for BYTES in the scratch buffer, grown (never shrunk) across ops. */
static sl_status scratch_for(hier_comm *c, uint64_t bytes, const char *op) {
  if (bytes <= c->cap) return SL_OK;
  if (bytes > SIZE_MAX)
    return c->host->fail(c->host->core, SL_ERR_NOMEM, "hier %s: %llu bytes", op, (unsigned long long)bytes);
  unsigned char *p = realloc(c->scratch, (size_t)bytes);
  if (!p)
    return c->host->fail(c->host->core, SL_ERR_NOMEM, "hier %s: out of memory for a staging buffer of %llu bytes", op,
                         (unsigned long long)bytes);
  c->scratch = p;
  c->cap = (size_t)bytes;
  return SL_OK;
}

/* The root (a leader): the count table to the leaders, each other host's parts to its leader
 * in one piece, then its own host's parts over shm. */
static sl_status scatter_root(hier_comm *c, const unsigned char *send, const size_t *counts, const size_t *displs,
                              void *recv, size_t recvbytes) {
  int rh = c->myhost;
  sl_status st = SL_OK;
  if (c->leaders) {
    for (int r = 0; r < c->n; r++) c->table[r] = counts[r];
    st = leaders_bcast(c, c->table, (size_t)c->n * sizeof *c->table, rh);
    /* each host's parts in its order: straight from SEND where every host's lie so, else packed */
    bool in_place = true;
    for (int h = 0; h < c->nhosts; h++) {
      size_t at = 0, len = 0;
      for (int i = 0; h != rh && i < size_of(c, h); i++) {
        int r = c->members[c->first_of[h] + i];
        if (i == 0) at = displs[r];
        else if (counts[r] && displs[r] != at + len) in_place = false;
        len += counts[r];
      }
      c->hcounts[h] = len, c->hdispls[h] = at;
    }
    const unsigned char *base = send;
    if (!in_place && st == SL_OK) {
      uint64_t total = 0;
      for (int h = 0; h < c->nhosts; h++) total += c->hcounts[h];
      if ((st = scratch_for(c, total, "scatterv")) == SL_OK) {
        size_t at = 0;
        for (int h = 0; h < c->nhosts; h++) {
          c->hdispls[h] = at;
          for (int i = 0; h != rh && i < size_of(c, h); i++) {
            int r = c->members[c->first_of[h] + i];
            if (counts[r]) memcpy(c->scratch + at, send + displs[r], counts[r]);
            at += counts[r];
          }
        }
        base = c->scratch;
      }
    }
    if (st == SL_OK) st = leaders_scatterv(c, base, NULL, 0, rh);
  }
  if (st != SL_OK) return step_failed(c, st, "scatterv", -1);
  if (!c->local) {
    if (recvbytes && send + displs[c->rank] != recv) memmove(recv, send + displs[c->rank], recvbytes);
    return SL_OK;
  }
  for (int i = 0; i < size_of(c, rh); i++) {
    int r = c->members[c->first_of[rh] + i];
    c->hcounts[i] = counts[r], c->hdispls[i] = displs[r];
  }
  return c->s->scatterv(c->local, send, c->hcounts, c->hdispls, recv, recvbytes, c->local_of[c->rank], NULL);
}

/* Another host's leader: the count table, its host's parts in one piece, then over its shm. */
static sl_status scatter_leader(hier_comm *c, void *recv, size_t recvbytes, int root) {
  int rh = c->host_of[root], lost = c->job[root];
  sl_status st = leaders_bcast(c, c->table, (size_t)c->n * sizeof *c->table, rh);
  if (st != SL_OK) return step_failed(c, st, "scatterv", lost);
  /* trust no peer: the table must add up, and give this rank what it was called with */
  uint64_t total = 0;
  int k = size_of(c, c->myhost);
  for (int i = 0; i < k && st == SL_OK; i++) {
    uint64_t v = c->table[c->members[c->first_of[c->myhost] + i]];
    if (__builtin_add_overflow(total, v, &total) || v > SIZE_MAX || total > SIZE_MAX)
      st = c->host->fail(c->host->core, SL_ERR_MISMATCH,
                         "hier scatterv: root rank %d's count table gives host %d more bytes than this rank can hold",
                         lost, c->myhost);
    c->hcounts[i] = (size_t)v;
  }
  if (st == SL_OK && c->table[c->rank] != recvbytes)
    st = c->host->fail(c->host->core, SL_ERR_MISMATCH,
                       "hier scatterv: rank %d expects %zu bytes but root rank %d sends it %llu", c->job[c->rank],
                       recvbytes, lost, (unsigned long long)c->table[c->rank]);
  /* this rank's own finding, not a rank lost: its host hears that it failed */
  if (st != SL_OK) return leader_failed(c, st, "scatterv", -1);
  if (!c->local) { /* a host of one rank: straight into its buffer */
    st = leaders_scatterv(c, NULL, recv, recvbytes, rh);
    return st != SL_OK ? step_failed(c, st, "scatterv", lost) : SL_OK;
  }
  /* out of memory: this rank's own failure, naming no rank lost */
  if ((st = scratch_for(c, total, "scatterv")) != SL_OK) return leader_failed(c, st, "scatterv", -1);
  if ((st = leaders_scatterv(c, NULL, c->scratch, (size_t)total, rh)) != SL_OK)
    return step_failed(c, st, "scatterv", lost);
  size_t at = 0;
  for (int i = 0; i < k; i++) c->hdispls[i] = at, at += c->hcounts[i];
  return c->s->scatterv(c->local, c->scratch, c->hcounts, c->hdispls, recv, recvbytes, 0, NULL);
}

static sl_status hier_scatterv(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs,
                               void *recvbuf, size_t recvbytes, int root, void *stream) {
  hier_comm *c = comm;
  sl_status st = usable(c, "scatterv");
  if (st != SL_OK) return st;
  if (root < 0 || root >= c->n) return bad_root(c, "scatterv", root);
  if (c->rank == root && counts[root] != recvbytes)
    return done(c, c->host->fail(c->host->core, SL_ERR_INVALID,
                                 "hier scatterv: the root sends itself %zu bytes but receives %zu", counts[root],
                                 recvbytes));
  int rh = c->host_of[root];
  if (c->nhosts == 1) { /* one host: its shm alone, whose ranks are this communicator's */
    if (c->local) return done(c, c->s->scatterv(c->local, sendbuf, counts, displs, recvbuf, recvbytes, root, NULL));
    const unsigned char *own = (const unsigned char *)sendbuf + displs[root];
    if (recvbytes && own != recvbuf) memmove(recvbuf, own, recvbytes);
    return SL_OK;
  }
  /* a root that leads no host: the whole communicator's Gloo (correct; every byte over TCP) */
  if (leader_of(c, rh) != root)
    return done(c, c->g->scatterv(c->world, sendbuf, counts, displs, recvbuf, recvbytes, root, NULL));
  if (c->rank == root) return done(c, scatter_root(c, sendbuf, counts, displs, recvbuf, recvbytes));
  if (c->myhost == rh || !leads(c))
    return done(c, c->s->scatterv(c->local, NULL, NULL, NULL, recvbuf, recvbytes,
                                  c->myhost == rh ? c->local_of[root] : 0, NULL));
  return done(c, scatter_leader(c, recvbuf, recvbytes, root));
}

/* Several scatterv's from distinct roots as one op (module.h). Where every root leads its host
 * (the loader's distributed readers, one per host) across hosts: each root tells the leaders
 * its count table and the leaders' Gloo moves every root's host parts, each step one group of
 * every root's at once (its scatterv_group), then each host scatters each item over its shm in
 * item order (the root's host from the root's send buffer). Else each item is a scatterv in
 * turn. A failure between the hosts names whom the leaders' verdicts name (step_failed). */
static sl_status hier_scatterv_group(void *comm, const sl_scatter_item *given, int n, void *stream) {
  hier_comm *c = comm;
  sl_status st = usable(c, "scatterv group");
  if (st != SL_OK) return st;
  if (n < 1 || n > SL_SCATTER_GROUP_MAX || !given)
    return done(c, c->host->fail(c->host->core, SL_ERR_INVALID, "hier scatterv group: %d items; give 1 to %d", n,
                                 SL_SCATTER_GROUP_MAX));
  sl_scatter_item it[SL_SCATTER_GROUP_MAX];
  if (!sl_scatter_items_read(given, n, it))
    return done(c, c->host->fail(c->host->core, SL_ERR_ABI,
                                 "hier scatterv group: items of %zu bytes are older than this module knows; rebuild "
                                 "the caller against this shardload's shardload/module.h",
                                 given[0].size));
  bool grouped = c->nhosts > 1 && SL_HAS_OP(c->g, scatterv_group) && n > 1;
  for (int i = 0; i < n; i++) {
    if (it[i].root < 0 || it[i].root >= c->n) return bad_root(c, "scatterv group", it[i].root);
    for (int k = 0; k < i; k++)
      if (it[k].root == it[i].root)
        return done(c, c->host->fail(c->host->core, SL_ERR_INVALID,
                                     "hier scatterv group: items %d and %d have the same root %d", k, i, it[i].root));
    grouped &= leader_of(c, c->host_of[it[i].root]) == it[i].root;
  }
  if (!grouped) {
    for (int i = 0; i < n && st == SL_OK; i++)
      st = hier_scatterv(comm, it[i].sendbuf, it[i].counts, it[i].displs, it[i].recvbuf, it[i].recvbytes, it[i].root,
                         stream);
    return st;
  }
  int mine = -1;
  for (int i = 0; i < n; i++)
    if (it[i].root == c->rank) mine = i;
  if (mine >= 0 && it[mine].counts[c->rank] != it[mine].recvbytes)
    return done(c, c->host->fail(c->host->core, SL_ERR_INVALID,
                                 "hier scatterv group: the root sends itself %zu bytes but receives %zu",
                                 it[mine].counts[c->rank], it[mine].recvbytes));
  const size_t H = (size_t)c->nhosts, N = (size_t)c->n, K = (size_t)size_of(c, c->myhost);
  /* per item: the count table (N), each host's count and displacement between the leaders (H
   * each), this host's ranks' counts and displacements over shm (K each), where its host's part
   * lands in the scratch and how long it is */
  uint64_t *table = NULL, *at = NULL, *len = NULL;
  size_t *hc = NULL, *hd = NULL, *lc = NULL, *ld = NULL;
  if (leads(c)) {
    table = calloc((size_t)n * N, sizeof *table), hc = calloc((size_t)n * H, sizeof *hc);
    hd = calloc((size_t)n * H, sizeof *hd), at = calloc((size_t)n, sizeof *at), len = calloc((size_t)n, sizeof *len);
  }
  lc = calloc(K, sizeof *lc), ld = calloc(K, sizeof *ld);
  if (!lc || !ld || (leads(c) && (!table || !hc || !hd || !at || !len))) {
    st = c->host->fail(c->host->core, SL_ERR_NOMEM, "hier scatterv group: out of memory for %d items' tables", n);
    if (leads(c)) st = leader_failed(c, st, "scatterv group", -1);
    goto out;
  }
  if (leads(c)) {
    /* the count tables, every root's at once (a group of the leaders' Gloo, so that every
     * leader waits on every root itself: a silent host is met by each, not behind another
     * root); HC and HD serve as its counts and displacements, then as the data's */
    sl_scatter_item tg[SL_SCATTER_GROUP_MAX];
    if (mine >= 0)
      for (size_t r = 0; r < N; r++) table[(size_t)mine * N + r] = it[mine].counts[r];
    for (size_t h = 0; h < H; h++) hc[h] = (int)h == c->myhost ? 0 : N * sizeof *table;
    for (int i = 0; i < n; i++) {
      tg[i] = (sl_scatter_item){.size = sizeof tg[i], .root = c->host_of[it[i].root]};
      if (i == mine) tg[i].sendbuf = table + (size_t)i * N, tg[i].counts = hc, tg[i].displs = hd;
      else tg[i].recvbuf = table + (size_t)i * N, tg[i].recvbytes = N * sizeof *table;
    }
    away(c, true);
    if ((st = c->g->scatterv_group(c->leaders, tg, n, NULL)) != SL_OK) {
      st = step_failed(c, st, "scatterv group", -1);
      goto out;
    }
    away(c, false);
    memset(hc, 0, (size_t)n * H * sizeof *hc);
    /* each host's part of each item in one piece: the tables must add up */
    for (int i = 0; i < n && st == SL_OK; i++) {
      const uint64_t *t = table + (size_t)i * N;
      int rh = c->host_of[it[i].root];
      uint64_t total = 0;
      for (size_t h = 0; h < H; h++) {
        uint64_t sum = 0;
        for (int k = 0; k < size_of(c, (int)h); k++) {
          uint64_t v = t[c->members[c->first_of[h] + k]];
          if (__builtin_add_overflow(sum, v, &sum) || v > SIZE_MAX || sum > SIZE_MAX) st = SL_ERR_MISMATCH;
        }
        hc[(size_t)i * H + h] = (int)h == rh ? 0 : (size_t)sum;
        if (st == SL_OK && (int)h != rh && __builtin_add_overflow(total, sum, &total)) st = SL_ERR_MISMATCH;
      }
      if (st == SL_OK && i != mine && t[c->rank] != it[i].recvbytes) st = SL_ERR_MISMATCH;
      if (st != SL_OK) {
        st = c->host->fail(c->host->core, SL_ERR_MISMATCH,
                           "hier scatterv group: root rank %d's count table does not add up for host %d (rank %d "
                           "expects %zu bytes)",
                           c->job[it[i].root], c->myhost, c->job[c->rank], it[i].recvbytes);
        st = leader_failed(c, st, "scatterv group", -1);
        goto out;
      }
      len[i] = i == mine ? total : hc[(size_t)i * H + (size_t)c->myhost];
    }
    /* the scratch: this rank's own item packed by host where its parts do not lie so in its
     * send buffer, and each other item's part of this host (a host of one rank receives
     * straight into its buffer) */
    uint64_t need = 0;
    for (int i = 0; i < n; i++) {
      bool in_place = true;
      if (i == mine)
        for (size_t h = 0; h < H; h++) {
          size_t p = 0, l = 0;
          for (int k = 0; (int)h != c->myhost && k < size_of(c, (int)h); k++) {
            int r = c->members[c->first_of[h] + k];
            if (k == 0) p = it[i].displs[r];
            else if (it[i].counts[r] && it[i].displs[r] != p + l) in_place = false;
            l += it[i].counts[r];
          }
          hd[(size_t)i * H + h] = p;
        }
      at[i] = need;
      if ((i == mine && !in_place) || (i != mine && c->local)) {
        /* each len is one host's sum of a peer's table: their sum must not wrap (the scratch
         * would be smaller than what the leaders' Gloo writes into it) */
        if (__builtin_add_overflow(need, len[i], &need)) need = UINT64_MAX;
      } else {
        at[i] = UINT64_MAX; /* not in the scratch */
      }
    }
    if ((st = scratch_for(c, need, "scatterv group")) != SL_OK) {
      st = leader_failed(c, st, "scatterv group", -1);
      goto out;
    }
    sl_scatter_item g[SL_SCATTER_GROUP_MAX];
    for (int i = 0; i < n; i++) {
      int rh = c->host_of[it[i].root];
      g[i] = (sl_scatter_item){.size = sizeof g[i], .root = rh};
      if (i == mine) {
        const unsigned char *base = it[i].sendbuf;
        if (at[i] != UINT64_MAX) { /* packed: each other host's parts in its order */
          size_t p = (size_t)at[i];
          base = c->scratch + p;
          for (size_t h = 0; h < H; h++) {
            hd[(size_t)i * H + h] = p - (size_t)at[i];
            for (int k = 0; (int)h != c->myhost && k < size_of(c, (int)h); k++) {
              int r = c->members[c->first_of[h] + k];
              if (it[i].counts[r])
                memcpy(c->scratch + p, (const unsigned char *)it[i].sendbuf + it[i].displs[r], it[i].counts[r]);
              p += it[i].counts[r];
            }
          }
        }
        g[i].sendbuf = base, g[i].counts = hc + (size_t)i * H, g[i].displs = hd + (size_t)i * H;
      } else {
        g[i].recvbuf = at[i] != UINT64_MAX ? c->scratch + at[i] : it[i].recvbuf;
        g[i].recvbytes = (size_t)len[i];
      }
    }
    away(c, true);
    if ((st = c->g->scatterv_group(c->leaders, g, n, NULL)) != SL_OK) {
      st = step_failed(c, st, "scatterv group", -1);
      goto out;
    }
    away(c, false);
  }
  /* each item over this host's shm, in item order */
  for (int i = 0; i < n && st == SL_OK; i++) {
    int root = it[i].root, rh = c->host_of[root];
    if (!c->local) { /* a host of one rank: the root's own part, or what its Gloo brought */
      const unsigned char *own = i == mine ? (const unsigned char *)it[i].sendbuf + it[i].displs[c->rank] : NULL;
      if (own && it[i].recvbytes && own != it[i].recvbuf) memmove(it[i].recvbuf, own, it[i].recvbytes);
      continue;
    }
    if (c->myhost == rh) {
      if (c->rank == root)
        for (size_t k = 0; k < K; k++) {
          int r = c->members[c->first_of[c->myhost] + k];
          lc[k] = it[i].counts[r], ld[k] = it[i].displs[r];
        }
      st = c->s->scatterv(c->local, c->rank == root ? it[i].sendbuf : NULL, lc, ld, it[i].recvbuf, it[i].recvbytes,
                          c->local_of[root], NULL);
    } else if (leads(c)) {
      size_t p = 0;
      for (size_t k = 0; k < K; k++) {
        lc[k] = (size_t)table[(size_t)i * N + (size_t)c->members[c->first_of[c->myhost] + k]];
        ld[k] = p, p += lc[k];
      }
      st = c->s->scatterv(c->local, c->scratch + at[i], lc, ld, it[i].recvbuf, it[i].recvbytes, 0, NULL);
    } else {
      st = c->s->scatterv(c->local, NULL, NULL, NULL, it[i].recvbuf, it[i].recvbytes, 0, NULL);
    }
  }
out:
  free(table), free(hc), free(hd), free(at), free(len), free(lc), free(ld);
  return done(c, st);
}

/* One host: its shm, whose ranks are this communicator's (and which names a silent rank, which
 * a Gloo communicator bootstrapped over the control plane cannot). More: the whole
 * communicator's Gloo (small, rare). */
static sl_status hier_allgather(void *comm, const void *sendbuf, void *recvbuf, size_t bytes, void *stream) {
  hier_comm *c = comm;
  sl_status st = usable(c, "allgather");
  if (st != SL_OK) return st;
  if (c->nhosts == 1 && c->local) return done(c, c->s->allgather(c->local, sendbuf, recvbuf, bytes, NULL));
  return done(c, c->g->allgather(c->world, sendbuf, recvbuf, bytes, NULL));
}

/* Each host's ranks meet, then the leaders, then each host's ranks again: a silent rank is
 * named by its host's shm; a leader that fails between the hosts breaks its host's shm. */
static sl_status hier_barrier(void *comm) {
  hier_comm *c = comm;
  sl_status st = usable(c, "barrier");
  if (st != SL_OK) return st;
  if (c->local) st = c->s->barrier(c->local);
  if (st == SL_OK && c->leaders) {
    away(c, true);
    if ((st = c->g->barrier(c->leaders)) != SL_OK) return done(c, step_failed(c, st, "barrier", -1));
    away(c, false);
  }
  if (st == SL_OK && c->local && c->nhosts > 1) st = c->s->barrier(c->local);
  return done(c, st);
}

/* Callable from any thread: the parts' aborts are. */
static void hier_abort(void *comm) {
  hier_comm *c = comm;
  if (!c) return;
  atomic_store(&c->aborted, 1);
  if (c->local) c->s->abort(c->local);
  if (c->verdict) c->g->abort(c->verdict);
  if (c->leaders) c->g->abort(c->leaders);
  if (c->hostg) c->g->abort(c->hostg);
  if (c->world) c->g->abort(c->world);
}

/* Collective over COMM: the group of each color, ordered by (key, rank), as Gloo and shm order
 * theirs; its Gloo a split of COMM's, its shm on each host a split of that host's (a rank alone
 * of its group on its host takes none), its leaders the first of each host in the group. */
static sl_status hier_split(void *comm, int color, int key, void **sub) {
  hier_comm *c = comm;
  *sub = NULL;
  sl_status st = usable(c, "split");
  if (st != SL_OK) return st;
  if (color < 0) color = -1;
  int32_t mine[2] = {color, key}, *all = calloc((size_t)c->n, sizeof mine);
  int *order = calloc((size_t)c->n, sizeof *order), *hk = calloc((size_t)c->n, sizeof *hk),
      *jr = calloc((size_t)c->n, sizeof *jr);
  void *sw = NULL, *sl = NULL, *sld = NULL;
  hier_comm *s = NULL;
  if (!all || !order || !hk || !jr) {
    st = c->host->fail(c->host->core, SL_ERR_NOMEM, "hier split: out of memory for %d ranks", c->n);
    goto out; /* the others fail in the allgather below, or at the timeout */
  }
  if ((st = c->g->allgather(c->world, mine, all, sizeof mine, NULL)) != SL_OK) goto out;
  /* the group, by (key, rank) */
  int size = 0, pos = -1, alone = 1;
  for (int r = 0; color >= 0 && r < c->n; r++) {
    if (all[2 * r] != color) continue;
    int at = size++;
    while (at > 0 && all[2 * order[at - 1] + 1] > all[2 * r + 1]) order[at] = order[at - 1], at--;
    order[at] = r;
  }
  for (int i = 0; i < size; i++) {
    if (order[i] == c->rank) pos = i;
    hk[i] = c->host_of[order[i]];
    jr[i] = c->job[order[i]];
  }
  /* whether another member of this rank's group shares its host: its shm split needs that */
  for (int r = 0; color >= 0 && r < c->n; r++)
    if (r != c->rank && all[2 * r] == color && c->host_of[r] == c->myhost) alone = 0;
  if ((st = c->g->split(c->world, color, key, &sw)) != SL_OK) goto out;
  if (c->local && (st = c->s->split(c->local, color >= 0 && !alone ? color : -1, key, &sl)) != SL_OK) goto out;
  if (color < 0) goto out;
  s = comm_new(c->host, size, pos, hk, jr);
  if (!s) {
    st = c->host->fail(c->host->core, SL_ERR_NOMEM, "hier split: out of memory for %d ranks", size);
    goto out; /* the group's leaders' split below is missing: its members fail at the timeout */
  }
  if (s->nhosts > 1 && (st = c->g->split(sw, leads(s) ? 0 : -1, pos, &sld)) != SL_OK) goto out;
  s->world = sw, s->local = sl, s->leaders = sld;
  sw = sl = sld = NULL;
  *sub = s;
  s = NULL;
out:
  if (sl) c->s->fini(sl);
  if (sld) c->g->fini(sld);
  if (sw) c->g->fini(sw);
  comm_free(s);
  free(all), free(order), free(hk), free(jr);
  return done(c, st);
}

/* What it needs of this machine: the shm collective's (within a host) and Gloo (built in). */
static int hier_probe(const char *backend, char *reason, size_t len) {
  char why[256];
  if (sl__collective_shm()->probe(backend, why, sizeof why) > 0) return 1;
  snprintf(reason, len, "hier: needs shm within each host: %s", why);
  return 0;
}

/* The ranks of every host whose leader the leaders' Gloo lost: a host that went silent is lost
 * whole (its other ranks reach the job only through that leader). */
static int hier_lost(void *comm, int *ranks, int cap) {
  hier_comm *c = comm;
  int n = 0;
  if (!c || !ranks || cap <= 0) return 0;
  for (int i = 0; i < c->nlost && i < (int)(sizeof c->lost / sizeof c->lost[0]); i++) {
    int q = -1;
    for (int r = 0; r < c->n && q < 0; r++)
      if (c->job[r] == c->lost[i]) q = r;
    if (q < 0) continue;
    int h = c->host_of[q];
    for (int k = 0; k < size_of(c, h) && n < cap; k++) ranks[n++] = c->job[c->members[c->first_of[h] + k]];
  }
  return n;
}

static const sl_collective_ops hier_ops = {
    .abi_version = SL_COLLECTIVE_ABI_VERSION,
    .size = sizeof(sl_collective_ops),
    .name = "hier",
    .flags = SL_COLL_SYNC,
    .domains = SL_MEM_HOST | SL_MEM_PINNED,
    .device_backend = NULL,
    .probe = hier_probe,
    .init = hier_init,
    .fini = hier_fini,
    .abort = hier_abort,
    .split = hier_split,
    .broadcast = hier_broadcast,
    .scatterv = hier_scatterv,
    .allgather = hier_allgather,
    .barrier = hier_barrier,
    .lost = hier_lost,
    .scatterv_group = hier_scatterv_group,
};

const sl_collective_ops *sl__collective_hier(void) { return &hier_ops; }
