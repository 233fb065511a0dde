/* The shared-memory data collective: host staging between ranks of one host through one shared
 * segment (docs/DESIGN.md#shm). Host memory, synchronous (SL_COLL_SYNC).
 *
 * Trust: ranks agree they share a host from evidence gathered over the control plane (which is
 * authenticated), never from launcher variables: the kernel's boot id, the host name, the
 * network and pid namespaces, the uid and the pid of every rank. The segment is a memfd (no name
 * anywhere: it goes with the last process that maps it, kill -9 included), made by rank 0 and
 * handed to each rank over a Unix socket of the abstract namespace with a random name, to a peer
 * whose SO_PEERCRED uid is rank 0's and whose pid is one of the job's, and which presents the
 * per-job random token rank 0 broadcast over the control plane; the socket closes once every
 * rank has its descriptor.
 *
 * Data: each communicator owns one channel of the segment: a descriptor of the current op, a
 * ring of SHM_SLOTS chunks, and per rank the count of chunks it has consumed and of ops it has
 * finished. The op's root waits for every rank to have finished the previous op, writes the
 * descriptor (its generation last), then fills the ring chunk by chunk, waiting for a slot only
 * until every rank has consumed the chunk it held; receivers copy from the ring straight into
 * their buffers. Every wait is a FUTEX_WAIT (shared, not private) on the word it needs, in
 * slices, between which it checks this rank's abort, the members' abort and failure words and
 * liveness (pidfd), of the members the op still needs; the timeout is one without progress. An
 * op that fails breaks the communicator for good (a late op never reads another op's bytes)
 * and says so in its channel, so that its peers fail at once naming the rank. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "shm.h"

#define SHM_MAGIC 0x31766d6873736c73ull /* "slsshmv1" */
#define SHM_CHUNK ((size_t)1 << 20)     /* one slot of the ring */
#define SHM_SLOTS 8u                    /* slots per ring: the root runs this far ahead */
#define SHM_MAX_CHANNELS 64             /* one bit each in a 64-bit mask */
#define SHM_SLICE_MS 20                 /* a wait's slice between liveness checks */
#define SHM_SERVE_LOOK_MS 100           /* rank 0's start: how often it looks at the ranks to come */
#define SHM_MAX_PIDFDS 256              /* peers watched by pidfd; beyond, by kill(pid, 0) */
#define SHM_TOKEN 32
#define SHM_NAME 48

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static size_t chan_ctl_bytes(int n) {
  return align_up(sizeof(chan_hdr), LINE) + (size_t)n * sizeof(chan_rank) + (size_t)n * sizeof(chan_part);
}
static size_t chan_bytes(int n) { return align_up(chan_ctl_bytes(n), 4096) + SHM_SLOTS * SHM_CHUNK; }
static size_t seg_ctl_bytes(int n) {
  return align_up(align_up(sizeof(seg_hdr), LINE) + (size_t)n * sizeof(seg_rank), 4096);
}
/* Channels a segment of N ranks holds: one per communicator at once. A group of one takes a
 * channel too, so there is room for every rank alone beside the job's, the HSDP chain's
 * groups and their splits (the conformance suite's pattern at world 2 needs 7); a channel's
 * ring is only touched by the communicator that uses it. */
static int channels_for(int n) { return 4 * n + 4 < SHM_MAX_CHANNELS ? 4 * n + 4 : SHM_MAX_CHANNELS; }

/* ---- futex words ----------------------------------------------------------------------------- */

static uint32_t load(const uint32_t *w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }

static void wake(uint32_t *w) { syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

static void store(uint32_t *w, uint32_t v) {
  __atomic_store_n(w, v, __ATOMIC_RELEASE);
  wake(w);
}

/* Not FUTEX_PRIVATE: the word is shared between processes. */
static void futex_wait(uint32_t *w, uint32_t seen, int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  syscall(SYS_futex, w, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Whether segment rank R's process has ended (its pidfd readable, or no such pid). */
static bool gone(const shm_seg *s, int r) {
  if (s->pidfds[r] >= 0) {
    struct pollfd p = {s->pidfds[r], POLLIN, 0};
    return poll(&p, 1, 0) > 0;
  }
  return kill(s->pids[r], 0) != 0 && errno == ESRCH;
}

/* Whether it is stopped (SIGSTOP, a debugger): state T or t in /proc/PID/stat. */
static bool stopped(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t k = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (k <= 0) return false;
  buf[k] = 0;
  const char *p = strrchr(buf, ')');
  return p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

/* Makes the communicator fail for good with ST and the message, and tells its peers (this
 * rank's failure word in the communicator's channel names LOST, the rank it lost, or itself):
 * the other communicators go on. */
static sl_status breaks(shm_comm *c, sl_status st, int lost, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static sl_status breaks(shm_comm *c, sl_status st, int lost, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->why, sizeof c->why, fmt, ap);
  va_end(ap);
  c->broken = st;
  uint32_t *mine = &c->words[c->rank].fail, expect = 0;
  __atomic_compare_exchange_n(mine, &expect, (uint32_t)FAIL_OP << 24 | (uint32_t)(lost + 1), false, __ATOMIC_ACQ_REL,
                              __ATOMIC_RELAXED);
  wake(mine);
  return c->host->fail(c->host->core, st, "%s", c->why);
}

/* The segment rank of communicator rank R (the job's rank, when the segment is the job's). */
static int job_rank(const shm_comm *c, int r) { return c->members[r]; }

/* What messages call segment rank R: the job's rank (the segment of one host of the hier
 * collective has labels: its ranks are not the job's). */
static int lbl(const shm_seg *s, int r) { return s->labels && r >= 0 && r < s->n ? s->labels[r] : r; }

/* Which members the wait still needs: a gone or failed member is fatal only then (a member
 * that got its part and left, which module.h allows, harms no one). NEED_ONE: member ARG (a
 * receiver needs only the root); NEED_OPS: members that have not finished op ARG (the root);
 * NEED_BAR: members that have not reached barrier ARG. */
enum { NEED_ONE, NEED_OPS, NEED_BAR };

static bool needed(const shm_comm *c, int i, int need, uint32_t arg) {
  if (need == NEED_ONE) return i == (int)arg;
  const uint32_t *w = need == NEED_OPS ? &c->words[i].opdone : &c->words[i].bar;
  return (int32_t)(load(w) - arg) < 0;
}

/* Whether member I is in trouble (failed, or its process ended) and the wait needs it; its
 * words are read after its state, so that a member that finished and then left is not needed. */
static bool in_trouble(const shm_comm *c, int i, int need, uint32_t arg) {
  const shm_seg *s = c->seg;
  int r = job_rank(c, i);
  if (r == s->me || !(load(&s->ranks[r].fail) || load(&c->words[i].fail) || gone(s, r))) return false;
  return needed(c, i, need, arg);
}

/* A member whose process ended without a word (no fail word of its own, so it never left or
 * failed: killed, or it crashed); -1 when none. */
static int killed_member(const shm_comm *c) {
  const shm_seg *s = c->seg;
  for (int i = 0; i < c->n; i++) {
    int r = job_rank(c, i);
    if (r != s->me && !load(&s->ranks[r].fail) && !load(&c->words[i].fail) && gone(s, r)) return i;
  }
  return -1;
}

/* Why this op cannot go on, apart from the word it waits for: this rank aborted, a member it
 * needs (NEED, ARG) said it failed, or its process ended. SL_OK when none. */
static sl_status trouble(shm_comm *c, const char *op, const uint32_t *w, uint32_t target, int need, uint32_t arg) {
  shm_seg *s = c->seg;
  bool bad = atomic_load(&c->aborted);
  for (int i = 0; i < c->n && !bad; i++) bad = in_trouble(c, i, need, arg);
  /* what it waited for may have come just before its peer ended (the root's last chunk) */
  if (!bad || (w && (int32_t)(load(w) - target) >= 0)) return SL_OK;
  if (atomic_load(&c->aborted))
    return breaks(c, SL_ERR_COMM, s->me, "shm %s: aborted (sl_context_abort) on rank %d", op, lbl(s, s->me));
  for (int i = 0; i < c->n; i++) {
    int r = job_rank(c, i);
    uint32_t f = load(&s->ranks[r].fail);
    if (!f) f = load(&c->words[i].fail);
    if (!f || !in_trouble(c, i, need, arg)) continue;
    int lost = (int)(f & 0xffffffu) - 1;
    /* a member that left or aborted after another's process ended without leaving (killed, or
     * it crashed): that one is what the job lost (the leaver failed on it elsewhere, on the
     * control plane) */
    int dead = (f >> 24) == FAIL_ABORT || (f >> 24) == FAIL_LEFT ? killed_member(c) : -1;
    if (dead >= 0)
      return breaks(c, SL_ERR_PEER, job_rank(c, dead),
                    "shm %s: lost rank %d (pid %d, exited without leaving the data plane); rank %d then %s while "
                    "rank %d still needed it",
                    op, lbl(s, job_rank(c, dead)), (int)s->pids[job_rank(c, dead)], lbl(s, r),
                    (f >> 24) == FAIL_ABORT ? "aborted its data plane" : "finished this communicator", lbl(s, s->me));
    if ((f >> 24) == FAIL_ABORT)
      return breaks(c, SL_ERR_PEER, r, "shm %s: rank %d aborted its data plane (sl_context_abort)", op, lbl(s, r));
    if ((f >> 24) == FAIL_LEFT)
      return breaks(c, SL_ERR_PEER, r, "shm %s: rank %d finished this communicator while rank %d still needed it", op,
                    lbl(s, r), lbl(s, s->me));
    /* never this rank: a peer that gave up on it failed, and that peer is what this rank lost */
    if (lost >= 0 && lost != r && lost != s->me && lost < s->n)
      return breaks(c, SL_ERR_PEER, lost, "shm %s: rank %d lost rank %d and failed (seen by rank %d)", op, lbl(s, r),
                    lbl(s, lost), lbl(s, s->me));
    /* a job's rank outside the segment (sl__shm_break: a hier leader lost a rank of another host) */
    if (lost >= s->n)
      return breaks(c, SL_ERR_PEER, r, "shm %s: rank %d lost rank %d and failed (seen by rank %d)", op, lbl(s, r),
                    lost - s->n, lbl(s, s->me));
    return breaks(c, SL_ERR_PEER, r, "shm %s: rank %d failed on the shm data plane (seen by rank %d)", op, lbl(s, r),
                  lbl(s, s->me));
  }
  for (int i = 0; i < c->n; i++) {
    int r = job_rank(c, i);
    if (in_trouble(c, i, need, arg))
      return breaks(c, SL_ERR_PEER, r, "shm %s: lost rank %d (pid %d, exited) while rank %d waited for it", op,
                    lbl(s, r), (int)s->pids[r], lbl(s, s->me));
  }
  return SL_OK;
}

/* Waits until the word W (communicator rank WHO's) has reached TARGET (counts wrap: compared
 * as a signed difference). The timeout is one without progress: the deadline moves whenever
 * the word moves (a big op whose data flows never times out). NEED, ARG: which members the
 * wait needs (trouble). */
static sl_status wait_for(shm_comm *c, uint32_t *w, uint32_t target, int who, int need, uint32_t arg, const char *op,
                          const char *what) {
  double deadline = now_ms() + c->timeout_ms;
  uint32_t last = load(w);
  bool graced = false;
  for (;;) {
    uint32_t v = load(w);
    if ((int32_t)(v - target) >= 0) return SL_OK;
    if (v != last) last = v, deadline = now_ms() + c->timeout_ms;
    sl_status st = trouble(c, op, w, target, need, arg);
    if (st != SL_OK) return st;
    double left = deadline - now_ms();
    /* the rank waited on is away in a step bounded by a timeout of its own (a hier leader
     * between the hosts), which may have started after this wait: that step fails first, and
     * its verdict (trouble, above) names whom it lost; one timeout more, once */
    if (left <= 0 && !graced && load(&c->words[who].away)) {
      graced = true;
      deadline = now_ms() + c->timeout_ms;
      continue;
    }
    if (left <= 0) {
      /* name a stopped member first: the rank waited on may itself wait for it */
      shm_seg *s = c->seg;
      for (int i = 0; i < c->n; i++) {
        int r = job_rank(c, i);
        if (r != s->me && stopped(s->pids[r]))
          return breaks(c, SL_ERR_TIMEOUT, r,
                        "shm %s: rank %d (pid %d) is stopped (SIGSTOP or a debugger) and did not take part within "
                        "the timeout (%d ms)",
                        op, lbl(s, r), (int)s->pids[r], c->timeout_ms);
      }
      return breaks(c, SL_ERR_TIMEOUT, job_rank(c, who),
                    "shm %s: rank %d did not %s within the timeout (%d ms without progress); rank %d waited for it", op,
                    lbl(s, job_rank(c, who)), what, c->timeout_ms, lbl(s, s->me));
    }
    futex_wait(w, v, left < SHM_SLICE_MS ? (int)left + 1 : SHM_SLICE_MS);
  }
}

static sl_status usable(shm_comm *c, const char *op) {
  if (c->broken != SL_OK)
    return c->host->fail(c->host->core, c->broken, "shm %s: the data plane failed earlier: %s", op, c->why);
  if (atomic_load(&c->aborted))
    return breaks(c, SL_ERR_COMM, c->seg->me, "shm %s: aborted (sl_context_abort) on rank %d", op,
                  lbl(c->seg, c->seg->me));
  return SL_OK; /* a gone or failed peer: the op's waits tell whether it needs that one */
}

static unsigned char *slot(shm_comm *c, uint32_t idx) { return c->slots + (size_t)(idx % SHM_SLOTS) * SHM_CHUNK; }

/* The most bytes one op moves: its chunks fit a 32-bit count with room for signed differences. */
#define SHM_MAX_OP ((uint64_t)UINT32_MAX * SHM_CHUNK / 2)

static uint64_t chunks_of(uint64_t bytes) { return (bytes + SHM_CHUNK - 1) / SHM_CHUNK; }

/* ---- one op: the root's side ----------------------------------------------------------------- */

/* The root's stream: what it sends, as runs of (source, length) in stream order. */
typedef struct stream_src {
  const unsigned char *const *src;
  const uint64_t *len;
  int nruns;
} stream_src;

/* Root: every member finished the previous op; the descriptor; the chunks. */
static sl_status root_op(shm_comm *c, uint32_t kind, uint64_t total, const chan_part *parts, const stream_src *in,
                         const char *op) {
  uint32_t g = c->ops;
  sl_status st;
  if (total > SHM_MAX_OP)
    return breaks(c, SL_ERR_INVALID, c->seg->me, "shm %s: %llu bytes in one op is more than it moves", op,
                  (unsigned long long)total);
  if (c->n == 1) return SL_OK; /* nobody to send to: no copy through the ring */
  for (int r = 0; r < c->n; r++)
    if (r != c->rank &&
        (st = wait_for(c, &c->words[r].opdone, g, r, NEED_OPS, g + 1, op, "finish the previous op")) != SL_OK)
      return st;
  chan_hdr *h = c->hdr;
  /* two ranks that both think they are this op's root: one claims it, the other fails */
  uint32_t expect = g;
  if (!__atomic_compare_exchange_n(&h->claim, &expect, g + 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return breaks(c, SL_ERR_MISMATCH, c->seg->me,
                  "shm %s: rank %d called op %u as its root, but another rank had claimed it as root: the ranks "
                  "called different collectives",
                  op, lbl(c->seg, c->seg->me), g + 1);
  uint32_t n = (uint32_t)chunks_of(total), c0 = c->chunk;
  h->kind = kind;
  h->root = (uint32_t)c->rank;
  h->total = total;
  h->chunk0 = c0;
  h->nchunks = n;
  if (parts) memcpy(c->parts, parts, (size_t)c->n * sizeof *parts);
  store(&h->gen, g + 1);
  int run = 0;
  uint64_t at = 0; /* within the run */
  for (uint32_t i = 0; i < n; i++) {
    uint32_t idx = c0 + i;
    /* the slot held chunk idx - SHM_SLOTS: every member must be done with it */
    for (int r = 0; r < c->n; r++)
      if (r != c->rank &&
          (st = wait_for(c, &c->words[r].done, idx - SHM_SLOTS + 1, r, NEED_OPS, g + 1, op, "take its part")) != SL_OK)
        return st;
    unsigned char *d = slot(c, idx);
    size_t want = (size_t)(total - (uint64_t)i * SHM_CHUNK < SHM_CHUNK ? total - (uint64_t)i * SHM_CHUNK : SHM_CHUNK);
    while (want) {
      while (run < in->nruns && at == in->len[run]) run++, at = 0;
      size_t k = (size_t)(in->len[run] - at < want ? in->len[run] - at : want);
      memcpy(d, in->src[run] + at, k);
      d += k;
      at += k;
      want -= k;
    }
    store(&h->pub, idx + 1);
  }
  c->chunk = c0 + n;
  c->ops = g + 1;
  store(&c->words[c->rank].done, c0 + n);
  store(&c->words[c->rank].opdone, g + 1);
  return SL_OK;
}

/* ---- one op: a receiver's side ----------------------------------------------------------------- */

/* Receiver: the descriptor of this op (checked against what this rank was called with), then
 * its part of the stream, chunk by chunk, into BUF. */
static sl_status recv_op(shm_comm *c, uint32_t kind, int root, uint64_t bytes, unsigned char *buf, const char *op) {
  uint32_t g = c->ops;
  chan_hdr *h = c->hdr;
  sl_status st = wait_for(c, &h->gen, g + 1, root, NEED_ONE, (uint32_t)root, op, "start the op");
  if (st != SL_OK) return st;
  int me = c->seg->me, jr = lbl(c->seg, job_rank(c, root)), name = lbl(c->seg, me);
  /* every value is read once from the segment and bounded before use: trust no peer */
  uint32_t gen = load(&h->gen), hkind = __atomic_load_n(&h->kind, __ATOMIC_RELAXED),
           hroot = __atomic_load_n(&h->root, __ATOMIC_RELAXED), c0 = __atomic_load_n(&h->chunk0, __ATOMIC_RELAXED),
           n = __atomic_load_n(&h->nchunks, __ATOMIC_RELAXED);
  uint64_t total = __atomic_load_n(&h->total, __ATOMIC_RELAXED), off = 0, len = total;
  if (kind == OP_SCATTER)
    off = __atomic_load_n(&c->parts[c->rank].off, __ATOMIC_RELAXED),
    len = __atomic_load_n(&c->parts[c->rank].len, __ATOMIC_RELAXED);
  if (gen != g + 1 || hkind != kind || hroot != (uint32_t)root || c0 != c->chunk || total > SHM_MAX_OP ||
      n != chunks_of(total) || off > total || len > total - off)
    return breaks(c, SL_ERR_MISMATCH, me,
                  "shm %s: rank %d and rank %d disagree on op %u (generation %u, kind %u, root %u, %llu bytes in %u "
                  "chunks from %u): the ranks called different collectives",
                  op, name, jr, g + 1, gen, hkind, hroot, (unsigned long long)total, n, c0);
  if (len != bytes)
    return breaks(c, SL_ERR_MISMATCH, me, "shm %s: rank %d expects %llu bytes but root rank %d sends it %llu", op, name,
                  (unsigned long long)bytes, jr, (unsigned long long)len);
  uint64_t first = len ? off / SHM_CHUNK : n, last = len ? (off + len - 1) / SHM_CHUNK : n;
  if (len && (first > last || last >= n))
    return breaks(c, SL_ERR_MISMATCH, me, "shm %s: root rank %d describes a part outside its %u chunks", op, jr, n);
  store(&c->words[c->rank].done, c0 + (uint32_t)first); /* chunks before its part: never needed */
  for (uint64_t i = first; len && i <= last; i++) {
    uint32_t idx = c0 + (uint32_t)i;
    if ((st = wait_for(c, &h->pub, idx + 1, root, NEED_ONE, (uint32_t)root, op, "send its chunks")) != SL_OK) return st;
    uint64_t lo = i * SHM_CHUNK, hi = lo + SHM_CHUNK;
    uint64_t a = off > lo ? off : lo, b = off + len < hi ? off + len : hi;
    if (a > b || a - lo > SHM_CHUNK || b - a > SHM_CHUNK - (a - lo)) /* cannot be, by the checks above */
      return breaks(c, SL_ERR_MISMATCH, me, "shm %s: root rank %d's chunk %llu is out of bounds", op, jr,
                    (unsigned long long)i);
    memcpy(buf + (a - off), slot(c, idx) + (a - lo), (size_t)(b - a));
    store(&c->words[c->rank].done, idx + 1);
  }
  c->chunk = c0 + n;
  c->ops = g + 1;
  store(&c->words[c->rank].done, c0 + n);
  store(&c->words[c->rank].opdone, g + 1);
  return SL_OK;
}

/* ---- the data ops ------------------------------------------------------------------------------ */

/* A rank's own error in an op (its arguments, its memory) breaks the communicator too: the
 * members in the op learn it at once from its failure word rather than wait the timeout. */
static sl_status bad_root(shm_comm *c, const char *op, int root) {
  return breaks(c, SL_ERR_INVALID, c->seg->me, "shm %s: root %d is not a rank of %d", op, root, c->n);
}

static sl_status bcast(shm_comm *c, const void *src, void *dst, size_t bytes, int root, const char *op) {
  if (root != c->rank) return recv_op(c, OP_BCAST, root, bytes, dst, op);
  uint64_t len = bytes;
  stream_src in = {(const unsigned char *const *)&src, &len, 1};
  return root_op(c, OP_BCAST, bytes, NULL, &in, op);
}

static sl_status shm_broadcast(void *comm, void *buf, size_t bytes, int root, void *stream) {
  shm_comm *c = comm;
  sl_status st = usable(c, "broadcast");
  if (st != SL_OK) return st;
  if (root < 0 || root >= c->n) return bad_root(c, "broadcast", root);
  return bcast(c, buf, buf, bytes, root, "broadcast");
}

static sl_status shm_scatterv(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs,
                              void *recvbuf, size_t recvbytes, int root, void *stream) {
  shm_comm *c = comm;
  sl_status st = usable(c, "scatterv");
  if (st != SL_OK) return st;
  if (root < 0 || root >= c->n) return bad_root(c, "scatterv", root);
  if (root != c->rank) return recv_op(c, OP_SCATTER, root, recvbytes, recvbuf, "scatterv");
  if (counts[root] != recvbytes)
    return breaks(c, SL_ERR_INVALID, c->seg->me, "shm scatterv: the root sends itself %zu bytes but receives %zu",
                  counts[root], recvbytes);
  chan_part *parts = calloc((size_t)c->n, sizeof *parts);
  const unsigned char **src = calloc((size_t)c->n, sizeof *src);
  uint64_t *len = calloc((size_t)c->n, sizeof *len);
  if (!parts || !src || !len) {
    free(parts), free(src), free(len);
    return breaks(c, SL_ERR_NOMEM, c->seg->me, "shm scatterv: out of memory for %d ranks' parts", c->n);
  }
  uint64_t total = 0;
  int nruns = 0;
  for (int r = 0; r < c->n; r++) {
    if (r == c->rank) continue;
    parts[r] = (chan_part){total, counts[r]};
    if (counts[r]) src[nruns] = (const unsigned char *)sendbuf + displs[r], len[nruns++] = counts[r];
    total += counts[r];
  }
  stream_src in = {src, len, nruns};
  st = root_op(c, OP_SCATTER, total, parts, &in, "scatterv");
  free(parts), free(src), free(len);
  /* its own part last: RECVBUF may overlap another rank's part of SENDBUF, which must go out
   * first as it was */
  const unsigned char *mine = (const unsigned char *)sendbuf + displs[root];
  if (st == SL_OK && recvbytes && mine != recvbuf) memmove(recvbuf, mine, recvbytes);
  return st;
}

/* Each rank in turn broadcasts its contribution. */
static sl_status shm_allgather(void *comm, const void *sendbuf, void *recvbuf, size_t bytes, void *stream) {
  shm_comm *c = comm;
  sl_status st = usable(c, "allgather");
  unsigned char *out = recvbuf;
  for (int r = 0; r < c->n && st == SL_OK; r++) {
    if (r == c->rank && bytes && sendbuf != out + (size_t)r * bytes) memmove(out + (size_t)r * bytes, sendbuf, bytes);
    st = bcast(c, sendbuf, out + (size_t)r * bytes, bytes, r, "allgather");
  }
  return st;
}

static sl_status shm_barrier(void *comm) {
  shm_comm *c = comm;
  sl_status st = usable(c, "barrier");
  if (st != SL_OK) return st;
  uint32_t b = ++c->bars;
  store(&c->words[c->rank].bar, b);
  for (int r = 0; r < c->n && st == SL_OK; r++)
    if (r != c->rank) st = wait_for(c, &c->words[r].bar, b, r, NEED_BAR, b, "barrier", "reach the barrier");
  return st;
}

/* Callable from any thread, a signal handler's included: atomic stores and futex wakes. Pending
 * ops of this rank fail at their next check (a slice at most); the peers', at theirs. */
static void shm_abort(void *comm) {
  shm_comm *c = comm;
  if (!c) return;
  atomic_store(&c->aborted, 1);
  uint32_t expect = 0;
  seg_rank *mine = &c->seg->ranks[c->seg->me];
  __atomic_compare_exchange_n(&mine->fail, &expect, (uint32_t)FAIL_ABORT << 24 | (uint32_t)(c->seg->me + 1), false,
                              __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
  wake(&c->hdr->gen);
  wake(&c->hdr->pub);
  for (int r = 0; r < c->n; r++) wake(&c->words[r].done), wake(&c->words[r].opdone), wake(&c->words[r].bar);
}

/* ---- evidence that the ranks share a host ------------------------------------------------------- */

typedef struct evidence {
  char boot_id[48];
  char host[72];
  uint64_t netns, pidns;
  uint32_t uid;
  int32_t pid;
} evidence;

static uint64_t ns_inode(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* SHARDLOAD_TEST_SHM_HOST_TAG (a test hook): appended to the boot id after a '/', which no boot
 * id holds, so that ranks given different tags look like ranks of different hosts. It can only
 * tell ranks apart, never make two hosts look like one. */
static void gather_mine(evidence *e) {
  memset(e, 0, sizeof *e);
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t k = read(fd, e->boot_id, 40);
    close(fd);
    e->boot_id[k > 0 ? k : 0] = 0;
    e->boot_id[strcspn(e->boot_id, "\n")] = 0;
  }
  const char *tag = getenv("SHARDLOAD_TEST_SHM_HOST_TAG");
  if (tag && *tag) {
    size_t used = strlen(e->boot_id);
    snprintf(e->boot_id + used, sizeof e->boot_id - used, "/%s", tag);
  }
  if (gethostname(e->host, sizeof e->host - 1) != 0) e->host[0] = 0;
  e->netns = ns_inode("/proc/self/ns/net");
  e->pidns = ns_inode("/proc/self/ns/pid");
  e->uid = (uint32_t)geteuid();
  e->pid = (int32_t)getpid();
}

/* Text from a peer: terminated and printable before it is printed. */
static void take(evidence *e) {
  e->boot_id[sizeof e->boot_id - 1] = 0;
  e->host[sizeof e->host - 1] = 0;
  sl__module_text(e->boot_id, sizeof e->boot_id);
  sl__module_text(e->host, sizeof e->host);
}

/* Appends ", R" for each rank r with BAD[r] set to LIST (at most 16 named). */
static int list_ranks(const bool *bad, int n, char *list, size_t len) {
  int count = 0;
  size_t used = 0;
  list[0] = 0;
  for (int r = 0; r < n; r++) {
    if (!bad[r]) continue;
    if (count < 16) {
      int k = snprintf(list + used, len - used, "%s%d", count ? ", " : "", r);
      if (k > 0 && (size_t)k < len - used) used += (size_t)k;
    }
    count++;
  }
  if (count > 16) snprintf(list + used, len - used, " and %d more", count - 16);
  return count;
}

/* Every rank judges the same table the same way: one host, one user, one network and pid
 * namespace, or the same failure everywhere, naming the ranks. */
static sl_status judge(const sl_module_host *host, const evidence *e, int n) {
  bool *bad = calloc((size_t)n, sizeof *bad);
  if (!bad) return host->fail(host->core, SL_ERR_NOMEM, "shm: out of memory for %d ranks", n);
  char list[160];
  sl_status st = SL_OK;
  int first = -1;
  for (int r = 1; r < n; r++) {
    bad[r] = !e[0].boot_id[0] || strcmp(e[r].boot_id, e[0].boot_id) != 0 || strcmp(e[r].host, e[0].host) != 0;
    if (bad[r] && first < 0) first = r;
  }
  int k = list_ranks(bad, n, list, sizeof list);
  if (k) {
    st = host->fail(host->core, SL_ERR_UNSUPPORTED,
                    "the shm collective needs every rank on one host, but rank%s %s run%s on another host than rank 0 "
                    "(rank %d: host %s, boot id %s; rank 0: host %s, boot id %s); use --collective gloo or auto",
                    k > 1 ? "s" : "", list, k > 1 ? "" : "s", first, e[first].host, e[first].boot_id, e[0].host,
                    e[0].boot_id[0] ? e[0].boot_id : "(unreadable)");
    goto out;
  }
  for (int r = 1; r < n; r++) bad[r] = e[r].uid != e[0].uid, first = bad[r] && first < 0 ? r : first;
  if ((k = list_ranks(bad, n, list, sizeof list))) {
    st = host->fail(host->core, SL_ERR_UNSUPPORTED,
                    "the shm collective shares memory only between processes of one user, but rank%s %s run%s as "
                    "another user than rank 0 (rank %d: uid %u, rank 0: uid %u); use --collective gloo",
                    k > 1 ? "s" : "", list, k > 1 ? "" : "s", first, e[first].uid, e[0].uid);
    goto out;
  }
  for (int r = 1; r < n; r++)
    bad[r] = e[r].netns != e[0].netns || e[r].pidns != e[0].pidns || !e[0].netns || !e[0].pidns,
    first = bad[r] && first < 0 ? r : first;
  if ((k = list_ranks(bad, n, list, sizeof list))) {
    st = host->fail(host->core, SL_ERR_UNSUPPORTED,
                    "the shm collective needs every rank in one network and pid namespace (one container), but rank%s "
                    "%s run%s in other namespaces than rank 0; use --collective gloo",
                    k > 1 ? "s" : "", list, k > 1 ? "" : "s");
    goto out;
  }
  for (int r = 0; r < n && st == SL_OK; r++)
    for (int q = r + 1; q < n && st == SL_OK; q++)
      if (e[r].pid == e[q].pid)
        st = host->fail(host->core, SL_ERR_INVALID, "shm: ranks %d and %d claim one pid (%d): one process per rank", r,
                        q, (int)e[r].pid);
out:
  free(bad);
  return st;
}

/* ---- the handover of the segment ------------------------------------------------------------------ */

/* What rank 0 broadcasts: whether it made the segment (else why not), the socket's name and the
 * token a rank shows to get the segment's descriptor. */
typedef struct offer {
  int32_t ok;
  uint32_t pad;
  uint64_t bytes;
  char name[SHM_NAME];
  unsigned char token[SHM_TOKEN];
  char why[SHM_WHY];
} offer;

typedef struct hello {
  int32_t rank;
  unsigned char token[SHM_TOKEN];
} hello;

static socklen_t abstract_addr(const char *name, struct sockaddr_un *a) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  size_t n = strnlen(name, SHM_NAME - 1);
  memcpy(a->sun_path + 1, name, n); /* sun_path[0] = 0: the abstract namespace */
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static bool same_token(const unsigned char *a, const unsigned char *b) {
  unsigned char d = 0;
  for (int i = 0; i < SHM_TOKEN; i++) d |= a[i] ^ b[i];
  return d == 0;
}

static int wait_fd(int fd, short events, double deadline) {
  for (;;) {
    double left = deadline - now_ms();
    if (left <= 0) return 0;
    struct pollfd p = {fd, events, 0};
    int k = poll(&p, 1, left > 1000 ? 1000 : (int)left + 1);
    if (k > 0) return 1;
    if (k < 0 && errno != EINTR) return -1;
  }
}

/* Rank 0: one connection. SL_OK when it was rank R's and R got the descriptor; else the
 * stranger is refused (closed) and the job goes on. */
#define SHM_REFUSALS_LOGGED 8 /* refused connections warned of one by one; the rest counted */

static bool serve_one(const sl_module_host *host, int conn, const evidence *e, int n, bool *served, int segfd,
                      const unsigned char *token, double deadline, int *refused) {
  struct ucred cr;
  socklen_t cl = sizeof cr;
  const char *why = NULL;
  int r = -1;
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0) why = "no peer credentials";
  else if (cr.uid != e[0].uid) why = "another user";
  if (!why) {
    for (int q = 1; q < n && r < 0; q++)
      if (e[q].pid == (int32_t)cr.pid) r = q;
    if (r < 0) why = "a process that is no rank of this job";
    else if (served[r]) why = "a rank that has its segment already";
  }
  hello h;
  double until = now_ms() + 2000 < deadline ? now_ms() + 2000 : deadline; /* a silent stranger: not for long */
  if (!why && (wait_fd(conn, POLLIN, until) <= 0 || recv(conn, &h, sizeof h, MSG_DONTWAIT) != (ssize_t)sizeof h))
    why = "no greeting";
  if (!why && (h.rank != r || !same_token(h.token, token))) why = "a wrong token";
  if (why) {
    if (++*refused <= SHM_REFUSALS_LOGGED)
      host->log(host->core, SL_LOG_WARN, "shm: refused a connection to the segment's socket from pid %d (uid %u): %s%s",
                (int)cr.pid, (unsigned)cr.uid, why,
                *refused == SHM_REFUSALS_LOGGED ? " (further refusals are counted, not logged)" : "");
    return false;
  }
  char byte = 1;
  struct iovec iov = {&byte, 1};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  memset(&u, 0, sizeof u);
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  struct cmsghdr *ch = CMSG_FIRSTHDR(&m);
  ch->cmsg_level = SOL_SOCKET;
  ch->cmsg_type = SCM_RIGHTS;
  ch->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(ch), &segfd, sizeof segfd);
  if (wait_fd(conn, POLLOUT, until) <= 0 || sendmsg(conn, &m, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) return false;
  served[r] = true;
  return true;
}

/* Rank 0: serves the ranks until every one has the descriptor, or the timeout. A rank whose
 * process ends before it came (killed between the offer and its fetch) fails the start at once,
 * named: its peers wait for rank 0 in the next step, so rank 0 must not wait out the timeout. */
static sl_status serve(const sl_module_host *host, int lis, const evidence *e, const shm_seg *seg, int n, int segfd,
                       const unsigned char *token, int timeout_ms) {
  bool *served = calloc((size_t)n, sizeof *served);
  struct pollfd *pf = calloc((size_t)n, sizeof *pf);
  if (!served || !pf) {
    free(served), free(pf);
    return host->fail(host->core, SL_ERR_NOMEM, "shm: out of memory for %d ranks", n);
  }
  served[0] = true;
  double deadline = now_ms() + timeout_ms;
  int left = n - 1, refused = 0;
  sl_status st = SL_OK;
  double looked = 0; /* when the ranks still to come were last looked at */
  while (left > 0) {
    int ended = -1;
    if (now_ms() - looked >= SHM_SERVE_LOOK_MS) {
      looked = now_ms();
      for (int r = 1; r < n && ended < 0; r++)
        if (!served[r] && gone(seg, r)) ended = r;
    }
    if (ended >= 0) {
      st = host->fail(host->core, SL_ERR_PEER,
                      "shm: lost rank %d (pid %d, exited) before it came for the shared segment; see that rank's log",
                      lbl(seg, ended), (int)e[ended].pid);
      break;
    }
    /* the socket and the pidfds of the ranks still to come; those without one are looked at
     * again after each slice */
    int np = 0;
    pf[np++] = (struct pollfd){lis, POLLIN, 0};
    for (int r = 1; r < n; r++)
      if (!served[r] && seg->pidfds[r] >= 0) pf[np++] = (struct pollfd){seg->pidfds[r], POLLIN, 0};
    double wait = deadline - now_ms();
    int k = wait <= 0 ? 0 : poll(pf, (nfds_t)np, wait > SHM_SERVE_LOOK_MS ? SHM_SERVE_LOOK_MS : (int)wait + 1);
    if (k < 0 && errno == EINTR) continue;
    for (int i = 1; i < np && k > 0; i++)
      if (pf[i].revents) looked = 0; /* a pidfd: a rank to come has ended; named above */
    if (k < 0 || (k == 0 && now_ms() >= deadline)) {
      char list[160];
      bool *missing = calloc((size_t)n, sizeof *missing);
      for (int r = 0; missing && r < n; r++) missing[r] = !served[r];
      if (missing) list_ranks(missing, n, list, sizeof list);
      free(missing);
      st = host->fail(host->core, k == 0 ? SL_ERR_TIMEOUT : SL_ERR_COMM,
                      "shm: rank%s %s did not come for the shared segment within the timeout (%d ms)",
                      left > 1 ? "s" : "", missing ? list : "?", timeout_ms);
      break;
    }
    if (!(pf[0].revents & POLLIN)) continue;
    int conn = accept4(lis, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) continue;
    if (serve_one(host, conn, e, n, served, segfd, token, deadline, &refused)) left--;
    close(conn);
  }
  if (refused > SHM_REFUSALS_LOGGED)
    host->log(host->core, SL_LOG_WARN, "shm: refused %d connections to the segment's socket in all", refused);
  free(served);
  free(pf);
  return st;
}

/* A rank: the descriptor from rank 0, over the socket OF, to rank 0's process only. */
static sl_status fetch(const sl_module_host *host, const offer *of, const evidence *e, int rank, int timeout_ms,
                       int *segfd) {
  *segfd = -1;
  const char *delay = getenv("SHARDLOAD_TEST_SHM_ATTACH_DELAY_MS");
  if (delay && atoi(delay) > 0) usleep((useconds_t)atoi(delay) * 1000u);
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) return host->fail(host->core, SL_ERR_IO, "shm: rank %d: socket: %s", rank, strerror(errno));
  /* blocking, each call bounded: a Unix connect waits for room in the backlog up to SO_SNDTIMEO */
  struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_un a;
  socklen_t al = abstract_addr(of->name, &a);
  sl_status st = SL_OK;
  struct ucred cr;
  socklen_t cl = sizeof cr;
  if (connect(s, (struct sockaddr *)&a, al) != 0) {
    st = host->fail(host->core, errno == EAGAIN ? SL_ERR_TIMEOUT : SL_ERR_COMM,
                    "shm: rank %d cannot reach rank 0's socket: %s", rank, strerror(errno));
  } else if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0) {
    st = host->fail(host->core, SL_ERR_COMM, "shm: rank %d: no credentials for rank 0's socket: %s", rank,
                    strerror(errno));
  } else if ((int32_t)cr.pid != e[0].pid || cr.uid != e[0].uid) {
    st = host->fail(host->core, SL_ERR_COMM,
                    "shm: rank %d: the segment's socket is held by pid %d (uid %u), not by rank 0 (pid %d); refusing "
                    "it",
                    rank, (int)cr.pid, (unsigned)cr.uid, (int)e[0].pid);
  } else {
    hello h = {.rank = rank};
    memcpy(h.token, of->token, SHM_TOKEN);
    char byte;
    struct iovec iov = {&byte, 1};
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    ssize_t k = -1;
    if (send(s, &h, sizeof h, MSG_NOSIGNAL) == (ssize_t)sizeof h) k = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
    struct cmsghdr *ch = k == 1 ? CMSG_FIRSTHDR(&m) : NULL;
    if (ch && ch->cmsg_level == SOL_SOCKET && ch->cmsg_type == SCM_RIGHTS && ch->cmsg_len == CMSG_LEN(sizeof(int)))
      memcpy(segfd, CMSG_DATA(ch), sizeof *segfd);
    if (*segfd < 0)
      st = host->fail(host->core, SL_ERR_COMM, "shm: rank %d did not get the shared segment from rank 0 (%s)", rank,
                      k < 0 ? strerror(errno) : "refused");
  }
  close(s);
  return st;
}

/* Rank 0: the memfd, sized and sealed (no peer can shrink it under another's mapping). */
static sl_status make_segment(const sl_module_host *host, size_t bytes, int *fd) {
  *fd = memfd_create("shardload-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (*fd < 0) return host->fail(host->core, SL_ERR_IO, "shm: memfd_create: %s", strerror(errno));
  if (ftruncate(*fd, (off_t)bytes) != 0 || fcntl(*fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int e = errno;
    close(*fd);
    *fd = -1;
    return host->fail(host->core, SL_ERR_IO, "shm: cannot size and seal a segment of %zu bytes: %s", bytes,
                      strerror(e));
  }
  return SL_OK;
}

/* A descriptor handed over: a sealed segment of the size rank 0 said. */
static sl_status check_segment(const sl_module_host *host, int fd, size_t bytes, int rank) {
  struct stat st;
  int seals = fcntl(fd, F_GET_SEALS);
  if (fstat(fd, &st) != 0 || (size_t)st.st_size != bytes || seals < 0 || !(seals & F_SEAL_SHRINK))
    return host->fail(host->core, SL_ERR_COMM, "shm: rank %d got a segment that is not the one rank 0 described", rank);
  return SL_OK;
}

/* ---- starting and ending ------------------------------------------------------------------------------ */

/* A host that keeps the last failure's text as well as passing it on (shm.h): what a rank
 * tells the others when its part of the start failed. */
static void kh_log(void *core, sl_log_level level, const char *fmt, ...) {
  keeping_host *k = core;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  k->real->log(k->real->core, level, "%s", buf);
}

static sl_status kh_fail(void *core, sl_status s, const char *fmt, ...) {
  keeping_host *k = core;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(k->last, sizeof k->last, fmt, ap);
  va_end(ap);
  return k->real->fail(k->real->core, s, "%s", k->last);
}

void sl__keeping_host_init(keeping_host *k, const sl_module_host *real) {
  k->real = real;
  k->last[0] = 0;
  k->h = (sl_module_host){sizeof k->h, k, kh_log, kh_fail};
}

static void chan_bind(shm_comm *c, int channel) {
  int n = c->seg->n;
  unsigned char *base = c->seg->base + seg_ctl_bytes(n) + (size_t)channel * chan_bytes(n);
  c->channel = channel;
  c->hdr = (chan_hdr *)base;
  c->words = (chan_rank *)(base + align_up(sizeof(chan_hdr), LINE));
  c->parts = (chan_part *)((unsigned char *)c->words + (size_t)n * sizeof(chan_rank));
  c->slots = base + align_up(chan_ctl_bytes(n), 4096);
}

static shm_comm *comm_new(const sl_module_host *host, shm_seg *seg, int n, int timeout_ms) {
  shm_comm *c = calloc(1, sizeof *c);
  if (!c || !(c->members = calloc((size_t)n, sizeof *c->members))) {
    free(c);
    return NULL;
  }
  c->host = host;
  c->seg = seg;
  c->n = n;
  c->timeout_ms = timeout_ms;
  atomic_init(&c->aborted, 0);
  return c;
}

static void seg_free(shm_seg *s) {
  if (!s) return;
  if (s->base) munmap(s->base, s->bytes);
  for (int r = 0; s->pidfds && r < s->n; r++)
    if (s->pidfds[r] >= 0) close(s->pidfds[r]);
  free(s->pidfds);
  free(s->pids);
  free(s->labels);
  free(s);
}

/* The segment mapped from FD, checked against what rank 0 described, with every rank's pid and
 * a pidfd to watch it by. */
static sl_status seg_map(const sl_module_host *host, int fd, size_t bytes, const evidence *e, int n, int me,
                         shm_seg **out) {
  *out = NULL;
  shm_seg *s = calloc(1, sizeof *s);
  if (s) s->pids = calloc((size_t)n, sizeof *s->pids), s->pidfds = calloc((size_t)n, sizeof *s->pidfds);
  if (!s || !s->pids || !s->pidfds) {
    seg_free(s);
    return host->fail(host->core, SL_ERR_NOMEM, "shm: out of memory for %d ranks", n);
  }
  s->n = n;
  s->me = me;
  s->bytes = bytes;
  for (int r = 0; r < n; r++) {
    s->pids[r] = e[r].pid;
    /* one descriptor per peer, in worlds small enough to spare them (kill(pid, 0) beyond) */
    s->pidfds[r] = r == me || n > SHM_MAX_PIDFDS ? -1 : (int)syscall(SYS_pidfd_open, (pid_t)e[r].pid, 0);
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    seg_free(s);
    return host->fail(host->core, SL_ERR_NOMEM, "shm: rank %d cannot map the segment (%zu bytes): %s", me, bytes,
                      strerror(errno));
  }
  /* a child the rank forks (a helper that outlives the job) does not keep the segment alive */
  madvise(p, bytes, MADV_DONTFORK);
  s->base = p;
  s->ranks = (seg_rank *)(s->base + align_up(sizeof(seg_hdr), LINE));
  *out = s;
  return SL_OK;
}

/* Rank 0: the segment, its socket and the offer. */
static sl_status lead(const sl_module_host *host, const evidence *e, int n, size_t bytes, offer *of, int *segfd,
                      int *lis, shm_seg **seg) {
  sl_status st = make_segment(host, bytes, segfd);
  if (st == SL_OK) st = seg_map(host, *segfd, bytes, e, n, 0, seg);
  if (st != SL_OK) return st;
  seg_hdr *h = (seg_hdr *)(*seg)->base;
  *h = (seg_hdr){SHM_MAGIC, (uint32_t)n, (uint32_t)channels_for(n), chan_bytes(n), bytes, 1};
  for (int r = 0; r < n; r++) (*seg)->ranks[r].pid = e[r].pid;
  if (n == 1) return SL_OK;
  unsigned char rnd[16];
  if (getrandom(of->token, SHM_TOKEN, 0) != SHM_TOKEN || getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
    return host->fail(host->core, SL_ERR_IO, "shm: getrandom: %s", strerror(errno));
  int used = snprintf(of->name, sizeof of->name, "shardload-shm-");
  for (size_t i = 0; i < sizeof rnd; i++)
    used += snprintf(of->name + used, sizeof of->name - (size_t)used, "%02x", rnd[i]);
  *lis = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  struct sockaddr_un a;
  socklen_t al = abstract_addr(of->name, &a);
  if (*lis < 0 || bind(*lis, (struct sockaddr *)&a, al) != 0 || listen(*lis, n + 16) != 0)
    return host->fail(host->core, SL_ERR_IO, "shm: cannot listen on an abstract Unix socket: %s", strerror(errno));
  return SL_OK;
}

static sl_status shm_init(const sl_collective_init *init, void **comm) {
  *comm = NULL;
  if (!init->host) return SL_ERR_INVALID;
  const sl_module_host *host = init->host;
  if (init->size < offsetof(sl_collective_init, ops) || !init->control)
    return host->fail(host->core, SL_ERR_INVALID,
                      "the shm collective is a data collective: it starts over a control plane (sl_collective_init."
                      "control), which this caller did not give");
  int n = init->world_size, me = init->rank;
  if (n < 1 || me < 0 || me >= n) return host->fail(host->core, SL_ERR_INVALID, "shm: rank %d of %d", me, n);
  keeping_host kh;
  sl__keeping_host_init(&kh, host);
  const sl_control_plane *ctl = init->control;
  evidence mine, *e = calloc((size_t)n, sizeof *e);
  if (!e) return host->fail(host->core, SL_ERR_NOMEM, "shm: out of memory for %d ranks", n);
  gather_mine(&mine);
  sl_status st = ctl->allgather(ctl->ctx, &mine, e, sizeof mine);
  if (st != SL_OK) {
    free(e);
    return st;
  }
  for (int r = 0; r < n; r++) take(&e[r]);
  e[me] = mine;
  if ((st = judge(host, e, n)) != SL_OK) { /* every rank has judged the same table */
    free(e);
    return st;
  }
  size_t bytes = seg_ctl_bytes(n) + (size_t)channels_for(n) * chan_bytes(n);
  offer of;
  memset(&of, 0, sizeof of);
  int segfd = -1, lis = -1;
  shm_seg *seg = NULL;
  /* While the segment's descriptor is in this process's table, a process of the same user could
   * open it through /proc/PID/fd (ptrace's read mode suffices there): not dumpable, it cannot.
   * Once the descriptor is closed, the mapping's /proc/PID/map_files needs CAP_SYS_ADMIN. */
  int dumpable = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  if (me == 0) {
    st = lead(&kh.h, e, n, bytes, &of, &segfd, &lis, &seg);
    of.ok = st == SL_OK;
    of.bytes = bytes;
    if (st != SL_OK) snprintf(of.why, sizeof of.why, "%s", kh.last);
  }
  sl_status bst = ctl->broadcast(ctl->ctx, &of, sizeof of, 0);
  if (bst != SL_OK && st == SL_OK) st = bst;
  of.name[sizeof of.name - 1] = of.why[sizeof of.why - 1] = 0;
  if (st == SL_OK && !of.ok) {
    sl__module_text(of.why, sizeof of.why);
    st = kh.h.fail(&kh, SL_ERR_COMM, "shm: rank 0 could not make the shared segment: %s", of.why);
  }
  if (st == SL_OK && me == 0 && n > 1) st = serve(&kh.h, lis, e, seg, n, segfd, of.token, init->timeout_ms);
  if (lis >= 0) close(lis); /* every rank has its descriptor (or the start failed): nobody else may come */
  if (st == SL_OK && me != 0) {
    if (of.bytes != bytes) st = kh.h.fail(&kh, SL_ERR_COMM, "shm: rank 0 offers a segment of another size");
    if (st == SL_OK) st = fetch(&kh.h, &of, e, me, init->timeout_ms, &segfd);
    if (st == SL_OK) st = check_segment(&kh.h, segfd, bytes, me);
    if (st == SL_OK) st = seg_map(&kh.h, segfd, bytes, e, n, me, &seg);
    const seg_hdr *h = seg ? (const seg_hdr *)seg->base : NULL;
    if (st == SL_OK && (h->magic != SHM_MAGIC || h->nranks != (uint32_t)n || h->bytes != bytes ||
                        h->channels != (uint32_t)channels_for(n)))
      st = kh.h.fail(&kh, SL_ERR_COMM, "shm: rank %d: the segment does not hold this job's header", me);
  }
  if (segfd >= 0) close(segfd); /* the mapping keeps it */
  if (dumpable == 1) prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
  /* every rank says how it went, so that all fail alike with the rank's own reason */
  struct {
    int32_t ok;
    char why[SHM_WHY];
  } say = {st == SL_OK, ""}, *all = calloc((size_t)n, sizeof say);
  if (st != SL_OK) snprintf(say.why, sizeof say.why, "%s", kh.last);
  sl_status ast = all ? ctl->allgather(ctl->ctx, &say, all, sizeof say) : SL_ERR_NOMEM;
  if (st == SL_OK && ast != SL_OK) st = ast;
  for (int r = 0; st == SL_OK && r < n; r++) {
    if (all[r].ok) continue;
    all[r].why[sizeof all[r].why - 1] = 0;
    sl__module_text(all[r].why, sizeof all[r].why);
    st = host->fail(host->core, SL_ERR_COMM, "shm: rank %d could not attach the shared segment: %s", r, all[r].why);
  }
  free(all);
  shm_comm *c = st == SL_OK ? comm_new(host, seg, n, init->timeout_ms) : NULL;
  if (st == SL_OK && !c) st = host->fail(host->core, SL_ERR_NOMEM, "shm: out of memory");
  if (st != SL_OK) {
    seg_free(seg);
    free(e);
    return st;
  }
  free(e);
  c->owns_seg = true;
  c->rank = me;
  for (int r = 0; r < n; r++) c->members[r] = r;
  chan_bind(c, 0);
  *comm = c;
  return SL_OK;
}

/* One member of a split's channel is done with it: the last frees it. */
static void chan_drop(shm_seg *seg, int channel) {
  shm_comm tmp = {.seg = seg};
  chan_bind(&tmp, channel);
  if (__atomic_sub_fetch(&tmp.hdr->refs, 1, __ATOMIC_ACQ_REL) == 0)
    __atomic_fetch_and(&((seg_hdr *)seg->base)->chan_mask, ~((uint64_t)1 << channel), __ATOMIC_ACQ_REL);
}

static void shm_fini(void *comm) {
  shm_comm *c = comm;
  if (!c) return;
  /* members in an op that still needs this rank fail at once (those that do not, go on) */
  uint32_t expect = 0;
  __atomic_compare_exchange_n(&c->words[c->rank].fail, &expect, (uint32_t)FAIL_LEFT << 24 | (uint32_t)(c->seg->me + 1),
                              false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
  wake(&c->words[c->rank].fail);
  if (c->owns_seg) seg_free(c->seg);
  else chan_drop(c->seg, c->channel);
  free(c->members);
  free(c);
}

/* Collective over COMM: ranks of one color form a group ordered by (key, rank); the group's
 * first member claims a free channel in the segment's mask (compare-and-swap: groups split from
 * any communicator at once never take one channel twice), clears its words and sets its count
 * of holders, and an allgather over COMM tells every member which; the last member to finish
 * its communicator frees the channel. */
static sl_status shm_split(void *comm, int color, int key, void **sub) {
  shm_comm *c = comm;
  *sub = NULL;
  sl_status st = usable(c, "split");
  if (st != SL_OK) return st;
  int32_t mine[2] = {color, key}, *all = calloc((size_t)c->n, 2 * sizeof(int32_t)),
          *chans = calloc((size_t)c->n, sizeof(int32_t));
  if (!all || !chans) {
    free(all), free(chans);
    return c->host->fail(c->host->core, SL_ERR_NOMEM, "shm split: out of memory for %d ranks", c->n);
  }
  if ((st = shm_allgather(c, mine, all, sizeof mine, NULL)) != SL_OK) goto out;
  int size = 0, pos = 0, leader = -1;
  for (int r = 0; color >= 0 && r < c->n; r++) {
    if (all[2 * r] != color) continue;
    size++;
    bool before = all[2 * r + 1] < key || (all[2 * r + 1] == key && r < c->rank);
    if (before) pos++;
    if (leader < 0 || all[2 * r + 1] < all[2 * leader + 1]) leader = r; /* the first (key, rank) */
  }
  seg_hdr *h = (seg_hdr *)c->seg->base;
  int nch = channels_for(c->seg->n), claimed = -1;
  if (color >= 0 && pos == 0) {
    uint64_t m = __atomic_load_n(&h->chan_mask, __ATOMIC_ACQUIRE);
    for (;;) {
      int ch = 0;
      while (ch < nch && (m >> ch & 1)) ch++;
      if (ch == nch) break;
      if (__atomic_compare_exchange_n(&h->chan_mask, &m, m | (uint64_t)1 << ch, false, __ATOMIC_ACQ_REL,
                                      __ATOMIC_ACQUIRE)) {
        claimed = ch;
        break;
      }
    }
    if (claimed >= 0) {
      shm_comm tmp = {.seg = c->seg};
      chan_bind(&tmp, claimed);
      memset(tmp.hdr, 0, chan_ctl_bytes(c->seg->n));
      __atomic_store_n(&tmp.hdr->refs, (uint32_t)size, __ATOMIC_RELEASE);
    }
  }
  int32_t say = color < 0 ? -1 : pos == 0 ? (claimed >= 0 ? claimed : -2) : -1;
  /* the channels are clear before anyone learns which is theirs */
  if ((st = shm_allgather(c, &say, chans, sizeof say, NULL)) != SL_OK) {
    if (claimed >= 0) chan_drop(c->seg, claimed); /* the leader's share (members that did learn it keep theirs) */
    goto out;
  }
  int full = -1;
  for (int r = 0; r < c->n && full < 0; r++)
    if (chans[r] == -2) full = r;
  if (full >= 0) { /* every rank fails alike; a channel claimed for nothing goes back */
    if (claimed >= 0) __atomic_fetch_and(&h->chan_mask, ~((uint64_t)1 << claimed), __ATOMIC_ACQ_REL);
    st = c->host->fail(c->host->core, SL_ERR_UNSUPPORTED,
                       "shm split: every one of the segment's %d channels is in use by a communicator; free "
                       "sub-communicators first",
                       nch);
    goto out;
  }
  if (color < 0) goto out;
  int ch = chans[leader];
  if (ch < 0 || ch >= nch || ch != (claimed >= 0 ? claimed : ch)) {
    if (claimed >= 0) chan_drop(c->seg, claimed);
    st = breaks(c, SL_ERR_COMM, job_rank(c, leader), "shm split: rank %d named no channel for its group",
                lbl(c->seg, job_rank(c, leader)));
    goto out;
  }
  shm_comm *s = comm_new(c->host, c->seg, size, c->timeout_ms);
  if (!s) {
    chan_drop(c->seg, ch); /* this member's share of the channel */
    st = c->host->fail(c->host->core, SL_ERR_NOMEM, "shm split: out of memory");
    goto out;
  }
  s->rank = pos;
  for (int r = 0; r < c->n; r++) {
    if (all[2 * r] != color) continue;
    int p = 0;
    for (int q = 0; q < c->n; q++)
      if (all[2 * q] == color && (all[2 * q + 1] < all[2 * r + 1] || (all[2 * q + 1] == all[2 * r + 1] && q < r))) p++;
    s->members[p] = job_rank(c, r);
  }
  chan_bind(s, ch);
  *sub = s;
out:
  free(all);
  free(chans);
  return st;
}

/* Linux with memfd and abstract Unix sockets (a seccomp filter or a sandbox may refuse either):
 * it tries both; any backend (it moves host memory). */
static int shm_probe(const char *backend, char *reason, size_t len) {
  int fd = memfd_create("shardload-shm-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    snprintf(reason, len, "shm: memfd_create is refused here: %s", strerror(errno));
    return 0;
  }
  close(fd);
  unsigned char rnd[8];
  char name[SHM_NAME];
  if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
    snprintf(reason, len, "shm: getrandom: %s", strerror(errno));
    return 0;
  }
  int used = snprintf(name, sizeof name, "shardload-shm-probe-");
  for (size_t i = 0; i < sizeof rnd; i++) used += snprintf(name + used, sizeof name - (size_t)used, "%02x", rnd[i]);
  struct sockaddr_un a;
  socklen_t al = abstract_addr(name, &a);
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  int ok = s >= 0 && bind(s, (struct sockaddr *)&a, al) == 0 && listen(s, 1) == 0;
  int e = errno;
  if (s >= 0) close(s);
  if (!ok) snprintf(reason, len, "shm: cannot listen on an abstract Unix socket here: %s", strerror(e));
  return ok;
}

static const sl_collective_ops shm_ops = {
    .abi_version = SL_COLLECTIVE_ABI_VERSION,
    .size = sizeof(sl_collective_ops),
    .name = "shm",
    .flags = SL_COLL_SYNC,
    .domains = SL_MEM_HOST | SL_MEM_PINNED,
    .device_backend = NULL,
    .probe = shm_probe,
    .init = shm_init,
    .fini = shm_fini,
    .abort = shm_abort,
    .split = shm_split,
    .broadcast = shm_broadcast,
    .scatterv = shm_scatterv,
    .allgather = shm_allgather,
    .barrier = shm_barrier,
};

const sl_collective_ops *sl__collective_shm(void) { return &shm_ops; }

/* ---- for the hier collective (shm.h) ------------------------------------------------------------ */

void sl__shm_host_key(char *key, size_t len) {
  evidence e;
  gather_mine(&e);
  /* a boot id it cannot read (only the test tag, if any): the start refuses it a segment, and
   * auto counts it a host of its own (core/src/planes.c:shm_host), so it shares its key with no
   * other process */
  if (!e.boot_id[0] || e.boot_id[0] == '/') {
    snprintf(key, len, "(boot id unreadable)|%s|%llu|%llu|%u|pid %d", e.host, (unsigned long long)e.netns,
             (unsigned long long)e.pidns, (unsigned)e.uid, (int)e.pid);
    return;
  }
  snprintf(key, len, "%s|%s|%llu|%llu|%u", e.boot_id, e.host, (unsigned long long)e.netns, (unsigned long long)e.pidns,
           (unsigned)e.uid);
}

sl_status sl__shm_label(void *comm, const int *labels) {
  shm_comm *c = comm;
  shm_seg *s = c->seg;
  int *l = malloc((size_t)s->n * sizeof *l);
  if (!l) return c->host->fail(c->host->core, SL_ERR_NOMEM, "shm: out of memory for %d ranks", s->n);
  memcpy(l, labels, (size_t)s->n * sizeof *l);
  free(s->labels);
  s->labels = l;
  return SL_OK;
}

void sl__shm_break(void *comm, sl_status st, int lost, const char *why) {
  shm_comm *c = comm;
  if (!c || c->broken != SL_OK) return;
  snprintf(c->why, sizeof c->why, "%s", why);
  c->broken = st;
  uint32_t *mine = &c->words[c->rank].fail, expect = 0;
  /* LOST < 0: no rank in particular (its peers say that this rank failed) */
  uint32_t named = lost < 0 ? (uint32_t)(c->seg->me + 1) : (uint32_t)(c->seg->n + lost + 1);
  __atomic_compare_exchange_n(mine, &expect, (uint32_t)FAIL_OP << 24 | named, false, __ATOMIC_ACQ_REL,
                              __ATOMIC_RELAXED);
  wake(mine);
}

void sl__shm_away(void *comm, bool away) {
  shm_comm *c = comm;
  if (c) store(&c->words[c->rank].away, away ? 1u : 0u);
}
