/* The shm collective's shared segment and what a process keeps of it (collectives/shm/shm.c;
 * docs/DESIGN.md#shm). A header of its own so that tests can write into the segment as a
 * buggy or hostile peer would (tests/test_multirank_shm.c). */
#ifndef SHARDLOAD_SHM_H
#define SHARDLOAD_SHM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "shardload/module.h"

#define SHM_WHY 320
#define LINE 64

/* ---- the segment's layout (every word is written by one rank and read by the others) ------- */

typedef struct seg_hdr {
  uint64_t magic;
  uint32_t nranks, channels;
  uint64_t chan_bytes, bytes;
  uint64_t chan_mask; /* channels held by a communicator (bit 0: the job's) */
} seg_hdr;

/* Per rank of the segment, on its own line: its abort word (0: fine; else FAIL_ABORT << 24 |
 * its rank + 1: sl_context_abort ends every communicator of the rank) and its pid as rank 0
 * saw it. */
typedef struct seg_rank {
  uint32_t fail;
  int32_t pid;
  char pad[LINE - 8];
} seg_rank;

enum { FAIL_ABORT = 1, FAIL_OP = 2, FAIL_LEFT = 3 }; /* FAIL_LEFT: it finished its communicator (fini) */

typedef struct chan_hdr {
  uint32_t gen; /* the current op's generation (op index + 1), stored last: the descriptor's flag */
  char pad0[LINE - 4];
  uint32_t pub;   /* chunks published in this channel (a count that runs across ops) */
  uint32_t claim; /* ops whose root has claimed the descriptor: one root per op */
  uint32_t refs;  /* members that have not finished their communicator (a split's channel) */
  char pad1[LINE - 12];
  uint32_t kind, root;
  uint64_t total;
  uint32_t chunk0, nchunks;
} chan_hdr;

typedef struct chan_rank {
  uint32_t done;   /* chunks this rank no longer needs (the root may refill their slots) */
  uint32_t opdone; /* ops it has finished */
  uint32_t bar;    /* barriers it has reached */
  uint32_t fail;   /* 0: fine; else FAIL_OP << 24 | the job's rank it lost + 1 (an op failed), or
                    * FAIL_LEFT << 24 | its rank + 1 (it finished the communicator) */
  uint32_t away;   /* nonzero: in a step outside the segment (sl__shm_away) */
  char pad[LINE - 20];
} chan_rank;

typedef struct chan_part {
  uint64_t off, len; /* rank's part of the op's byte stream */
} chan_part;

enum { OP_BCAST = 1, OP_SCATTER = 2 };

/* ---- what a process keeps ------------------------------------------------------------------ */

typedef struct shm_seg {
  unsigned char *base;
  size_t bytes;
  int n;           /* ranks of the segment (the world) */
  pid_t *pids;     /* by rank */
  int *pidfds;     /* by rank, -1 where pidfd_open failed (kill(pid, 0) then) */
  seg_rank *ranks; /* in the segment */
  int me;
  int *labels; /* by rank: the rank messages name (NULL: the segment's own; sl__shm_label) */
} shm_seg;

typedef struct shm_comm {
  const sl_module_host *host;
  shm_seg *seg;
  bool owns_seg;
  int rank, n;  /* in this communicator */
  int *members; /* communicator rank -> segment rank (the job's rank) */
  int channel;
  chan_hdr *hdr;
  chan_rank *words;
  chan_part *parts;
  unsigned char *slots;
  uint32_t ops, chunk, bars; /* what every member counts alike */
  int timeout_ms;
  atomic_int aborted;
  sl_status broken; /* sticky: an op failed */
  char why[SHM_WHY];
} shm_comm;

/* ---- for the hier collective (collectives/hier/hier.c), which runs one shm communicator per
 * host ------------------------------------------------------------------------------------------ */

/* A host that passes every message on to REAL and keeps the last failure's text in LAST (shm's
 * start: what a rank tells the others; hier: what broke a communicator). */
typedef struct keeping_host {
  sl_module_host h;
  const sl_module_host *real;
  char last[SHM_WHY];
} keeping_host;
void sl__keeping_host_init(keeping_host *k, const sl_module_host *real);

/* This process's host, as the shm collective tells hosts apart: the kernel's boot id (with
 * SHARDLOAD_TEST_SHM_HOST_TAG), the host name, the network and pid namespaces and the uid, in
 * one line. Ranks whose keys are equal may share one segment; a process whose boot id cannot
 * be read has a key of its own (it shares memory with no one). */
void sl__shm_host_key(char *key, size_t len);
/* Names the segment's ranks in messages by LABELS (by segment rank, world entries: the job's
 * ranks) rather than by their segment ranks. COMM: the communicator init made. */
sl_status sl__shm_label(void *comm, const int *labels);
/* Breaks COMM for good, as an op of its own that failed would, with the status ST and WHY: its
 * members in an op that needs this rank fail at once, saying that it lost LOST, a rank of the
 * job outside the segment (a hier leader that lost a rank of another host), or, with LOST < 0,
 * that this rank failed. Reports nothing through the host. */
void sl__shm_break(void *comm, sl_status st, int lost, const char *why);
/* Says that this rank is AWAY (or back): in a step outside the segment that is bounded by a
 * timeout of its own (a hier leader's Gloo step between the hosts), which a member waiting on
 * it cannot see progress in. A wait on a rank away that runs out gives it one timeout more,
 * ending as soon as it fails (sl__shm_break: its verdict, naming the rank it lost) or goes on,
 * rather than name a rank alive that only waits on another. */
void sl__shm_away(void *comm, bool away);

#endif
