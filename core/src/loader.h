/* Loader internals shared by loader*.c and state.c.
 *
 * sl_load runs in phases (docs/DESIGN.md#data-flow); one file per noun:
 *   loader.c        sl_load's arguments, the phase sequence, closing; the rank's own failure
 *   loader_agree.c  every agreement over the control plane, the plan digest and canonical text
 *   loader_plan.c   phase 1: plan -> tensor jobs (geometry computed once), binding/allocating
 *   loader_readers.c who reads: the readers and each one's share of the tensors
 *   loader_stage.c  the staging slots and their memory bound: sizing, carve-up, schedule
 *   loader_pipe.c   phase 2's pipeline: the reader thread, slot states, the main loop
 *   loader_send.c   the sending side: the root (rank 0, or a distributed reader) reads, casts,
 *                   packs; scatter, broadcast, HSDP chain
 *   loader_recv.c   the receiving side: placement, host finishes, every-rank reads
 *
 * struct loader is cut into parts, each written by the one file named at it; any loader file
 * may read any part. Where another file must change a part it calls a function of the owner. */
#ifndef SHARDLOAD_LOADER_H
#define SHARDLOAD_LOADER_H

#include <pthread.h>

#include "internal.h"

struct sl_state {
  sl__backend_ref *be; /* a reference of its own: the state may outlive the context */
  sl_tensor *tensors;  /* file order */
  size_t count;
  /* sl_state_find's index: open addressing on the names' XXH3, each slot a tensor's index + 1
   * (0: empty); NAME_MASK + 1 slots, a power of two at least twice the count */
  size_t *by_name;
  size_t name_mask;
  char *names; /* every tensor's name, NUL-terminated one after another: one block, not one each */
  char **skipped;
  size_t nskipped;
  sl_load_stats stats;
  /* caller host buffers the load registered with the backend (unregistered at destroy) */
  void **registered;
  size_t nregistered;
  /* Small host shards the state owns are carved out of a few blocks (loader_plan.c at
   * carve_arena): IN_ARENA marks them (per tensor, NULL when none), ARENAS the blocks the state
   * frees once each. A shard is never freed alone: an export holds the state, not a tensor. */
  struct sl__arena {
    void *base;
    size_t bytes;
  } *arenas;
  size_t narenas;
  unsigned char *in_arena;
  /* Lending (state.c; shardload.h at sl_state_export). REFS: the references beyond the owner's
   * (calloc's zero is the owner alone), one per live export; the last one frees the state.
   * FENCES: released exports whose events recorded the consumers' work, pushed without a lock
   * (releases run on any thread); each release drops those whose work has completed. WAIT_FREE: a release the backend could not order on the
   * device, so the free waits on its own thread. All three atomics. */
  int refs;
  struct sl_export *fences;
  int wait_free;
};

sl_status sl__state_index(sl_state *st);
/* The fences ST holds now (state.c; a test reads it: the count must stay bounded). */
size_t sl__state_fence_count(sl_state *st);

/* ---- loader ------------------------------------------------------------------------------ */
#define SL__DEFAULT_STAGING (64u << 20)
#define SL__MIN_STAGING 4096u
#define SL__DEFAULT_SLOTS 2
#define SL__MAX_SLOTS 8 /* what sl_load_options.pipeline_slots may ask for */
/* distributed readers in rounds (loader_pipe.c): a slot in flight and one reading ahead for
 * each of up to SL_SCATTER_GROUP_MAX readers, and one more */
#define SL__MAX_ROUND_SLOTS (2 * SL_SCATTER_GROUP_MAX + 1)
#define SL__A16(x) (((uint64_t)(x) + 15) & ~(uint64_t)15)

typedef struct tensor_job {
  size_t src_index;
  const sl_source_tensor *src;
  sl__resolved res;
  sl_tensor *out; /* its shard's region is there too: sl__job_region */
  sl_dtype wire;    /* dtype on the wire: the smaller of file and parameter dtype */
  bool hsdp;        /* mesh dim 0 replicate on a 2-D+ mesh: scatter in replica 0, then chain */
  uint32_t klass;   /* placement class: transfers bucket only tensors of one class */
  int reader;       /* which reader reads it (loader_readers.c; 0 where rank 0 reads alone) */
  uint64_t elems;
} tensor_job;

/* This rank's region of J's tensor (what sl__region_compute gave the plan), rebuilt from its
 * sl_tensor: a job keeps no copy of its own, so the table the passes walk stays small (88
 * bytes a tensor, where a region is 200). */
static inline void sl__job_region(const tensor_job *j, sl__region *r) {
  const sl_tensor *o = j->out;
  r->ndim = o->ndim;
  for (int d = 0; d < SL_MAX_DIMS; d++) {
    bool in = d < o->ndim;
    r->shape[d] = in ? o->global_shape[d] : 0;
    r->off[d] = in ? o->global_offset[d] : 0;
    r->len[d] = in ? o->local_shape[d] : 0;
  }
}

/* A piece: global elements [a, b) of one tensor. A transfer: consecutive pieces moved by one
 * collective operation (a large tensor is cut into several transfers, small tensors of one
 * class share one). Every rank builds the same list from the agreed plan. */
typedef struct piece {
  size_t job;
  uint64_t a, b;
} piece;

typedef struct transfer {
  size_t first, count; /* into loader.stage.pieces */
  /* The pieces of a transfer are ordered by wire element size, largest first, so that in
   * every dense concatenation of wire-dtype parts (the send buffer, each rank's part) every
   * element is aligned to its size. Areas local to a rank (the read area when it casts, the
   * landing area) start each piece at a multiple of 16 instead (SL__A16). */
  uint64_t read_bytes;    /* file dtype, pieces at multiples of 16 (an upper bound when plain) */
  uint64_t wire_bytes;    /* wire dtype, dense: the send buffer S and a broadcast's size */
  uint64_t landing_bytes; /* max(file, parameter) dtype where needed, pieces at multiples of 16 */
  uint64_t file_bytes;    /* bytes read from storage */
  bool plain;             /* no piece is cast on the way: the read area is S, dense */
  bool hsdp;
  int root; /* the rank that reads it and sends it (rank 0, or its reader) */
} transfer;

/* The carve-up of a slot for one transfer (offsets into its host and device parts;
 * loader_stage.c computes it): READ the file's bytes (file dtype), WIRE the wire bytes S where
 * rank 0 casts, PACKED each rank's packed part, RECV this rank's received part, LANDING host
 * casts and device-to-host landings. Every-rank reads use only READ and LANDING. */
typedef struct carve {
  size_t read, wire, packed, recv, landing;
} carve;

/* One staging slot's memory (loader_stage.c). Host part (pinned when the backend has pinned
 * memory): the transfer's root reads into it, host routes send and receive through it, and device-to-host
 * copies of CPU placements land in it. Device part (device route only): the same carve-up in
 * device memory. */
typedef struct slot {
  unsigned char *host;
  unsigned char *dev;
  void *ev_copy; /* recorded on the copy stream after the last op reading or writing this slot */
  void *ev_comm; /* recorded on the data stream after the last op touching this slot */
} slot;

typedef enum slot_state { SLOT_FREE = 0, SLOT_READING, SLOT_READY, SLOT_INFLIGHT } slot_state;

/* The reader thread's handshake over one slot (loader_pipe.c; under loader.lock). */
typedef struct slot_read {
  slot_state state;
  size_t xfer;       /* transfer being read / ready */
  size_t free_for;   /* the first transfer that may use the slot now (its last one retired + N) */
  sl_status st;      /* the read's outcome */
  char msg[512];     /* its message (the reader's private error buffer) */
  bool direct;       /* the reader read straight into the tensor (world 1) */
} slot_read;

/* A host-side placement that must wait for a device-to-host copy (device route, CPU shard). */
typedef struct host_finish {
  size_t job;
  size_t off;         /* in the slot's host part */
  uint64_t la, count; /* local elements */
} host_finish;

/* What the ranks agreed on (loader_agree.c). */
typedef struct loader_agreed {
  uint64_t digest; /* of everything that decides data movement (sl__loader_digest) */
  uint64_t table;  /* of the loaded tensors as this rank's source has them (sl__loader_digest) */
  /* the smallest maximum allocation of any rank's backend (SL_EXT_MAX_ALLOC), 0: none; known
   * from the planning agreement on, so that every rank sizes its slots (and so its schedule) alike */
  uint64_t alloc_cap;
} loader_agreed;

/* The staging slots, their streams and the schedule through them (loader_stage.c). */
typedef struct loader_stage {
  piece *pieces;
  size_t npieces;
  transfer *xfers;
  size_t nxfers;
  int nslots;
  slot slots[SL__MAX_ROUND_SLOTS];
  size_t slot_bytes;
  bool host_pinned;
  void *s_copy, *s_comm; /* backend streams: host<->device copies; data collective + device work */
} loader_stage;

/* The pipeline: its route, the reader thread and the slots' handshake (loader_pipe.c). */
typedef struct loader_pipe {
  bool device_route;   /* the data plane moves device memory (docs/DESIGN.md#data-flow) */
  bool device_is_host; /* cpu backend */
  bool can_cast_device, can_2d;
  /* distributed readers' transfers run in rounds, one group op each (the data collective has
   * scatterv_group): ROUND_MAX transfers from distinct roots at most, else 1 */
  size_t round_max;
  /* [from][to]: the backend casts the pair on the device (cast_async of 0 elements said SL_OK) */
  bool cast_on_device[SL_DTYPE_COUNT_][SL_DTYPE_COUNT_];
  slot_read reads[SL__MAX_ROUND_SLOTS]; /* beside stage.slots, index for index */
  size_t retired;      /* transfers [0, retired) have been retired */
  uint64_t done_bytes; /* rank 0: of total_bytes, what progress reported done */
  /* reader thread (rank 0) */
  pthread_t reader;
  bool reader_running;
  bool stop; /* under lock */
  bool data_started; /* every rank set up its data path: data operations may be pending */
  double read_seconds;
} loader_pipe;

/* The root's per-rank scratch and the HSDP sub-communicators (loader_send.c). */
typedef struct loader_send {
  size_t *counts, *displs;
  int *group;          /* per rank: the first rank holding the same region (it packs once) */
  int *group_of_key;
  sl__region *regions; /* per rank, rank 0 only */
  uint64_t *part_off;  /* per rank: where its part of the current piece starts in the send buffer */
  /* HSDP: sub-communicators of the data plane (NULL when unused) */
  void *g_shard;         /* this rank's replica (where rank 0 reads alone: replica 0's only) */
  void *g_pair_a, *g_pair_b; /* replica chain links (r even -> a, r odd -> b) */
  int replicas, shard_ranks, my_replica;
  bool hsdp_ready;
} loader_send;

/* Placements waiting for a slot's device-to-host copy; every-rank mode's coalesced in-place
 * reads, allocated at the first transfer, empty between transfers (loader_recv.c). */
typedef struct loader_recv {
  host_finish *finish;
  size_t nfinish, cap_finish;
  struct {
    size_t first, count; /* into finish */
  } pending[SL__MAX_ROUND_SLOTS]; /* per slot of stage.slots */
  sl__read_batch *batch;
} loader_recv;

/* The rank's own failure in phase 2 (loader.c). DEFERRED: the first failure local to this rank
 * (a copy to the device, a cast, a read in every-rank mode); the rank keeps taking part in
 * every collective so the others are not left waiting, places nothing more, and reports it at
 * the closing agreement. ROOT: rank 0's first failure of the current status window, what the
 * window tells every rank. READER_HALT (under loader.lock): the reader reads no more. */
typedef struct loader_fail {
  sl_status deferred;
  char deferred_msg[SL__ERRMSG_LEN];
  sl_status root_st;
  char root_msg[SL__ERRMSG_LEN];
  bool reader_halt;
  int32_t *window; /* distributed readers: every rank's status word of a status window */
} loader_fail;

typedef struct loader {
  /* Phase 1's facts, read-only from phase 2 on: the arguments (loader.c), the mesh, the jobs
   * and their total (loader_plan.c). L->st is the state being built: loader_plan.c fills its
   * tensors, and each file adds its own counters to st->stats. */
  sl_context *ctx;
  sl_plan *plan;
  sl_source *src;
  sl_load_options o;
  sl_placement_decision place;
  bool pinned; /* CPU placements get page-locked memory from the backend */
  int rank, world;
  int mesh_ndim;
  int mesh[SL_MAX_MESH_DIMS];
  int coord[SL_MAX_MESH_DIMS];
  sl_state *st;
  tensor_job *jobs;
  size_t njobs;
  uint64_t total_bytes;
  /* Who reads (loader_readers.c): READER_RANK[i] is reader i's rank, NREADERS of them (where
   * rank 0 reads alone: one, rank 0; every-rank reads: none); MY_READER this rank's index, or -1. */
  int *reader_rank;
  int nreaders;
  int my_reader;
  /* created and destroyed by loader.c; guards pipe.reads, pipe.stop and fail.reader_halt */
  pthread_mutex_t lock;
  pthread_cond_t cond;

  loader_agreed agreed;
  loader_stage stage;
  loader_pipe pipe;
  loader_send send;
  loader_recv recv;
  loader_fail fail;
} loader;

/* ---- loader.c ---------------------------------------------------------------------------- */
/* Records this rank's first own failure of phase 2 (NAME: the tensor, or NULL when the
 * context's message names it); the reader reads no more. */
void sl__loader_defer(loader *L, const char *name, sl_status st);
/* A root's own failure in phase 2 (a read, a pack, rank 0's progress callback): the first
 * one is what the next status window tells every rank; rank 0 places nothing more from here on. */
void sl__loader_root_failed(loader *L, sl_status st, const char *msg);
/* Whether this rank failed on its own: the reader stops reading (called by the reader thread). */
bool sl__loader_reader_halted(loader *L);
/* After transfer K: at the end of a status window, rank 0 (or every distributed reader) tells
 * every rank how its reads went; a failure there is every rank's. */
sl_status sl__loader_status_window(loader *L, size_t k);

/* ---- loader_agree.c ---------------------------------------------------------------------- */
/* The digest of the plan, the options and the jobs (loader.agreed.digest), once planning
 * succeeded. */
void sl__loader_digest(loader *L);
sl_status sl__loader_agree(loader *L, sl_status local, const char *phase);
sl_status sl__loader_agree_files(loader *L, sl_status local);

/* ---- loader_plan.c ----------------------------------------------------------------------- */
sl_status sl__loader_plan(loader *L);
sl_status sl__loader_bind(loader *L);

/* ---- loader_readers.c -------------------------------------------------------------------- */
/* The readers of this load and each job's reader (after sl__loader_plan). */
sl_status sl__loader_readers(loader *L);
/* Which of R readers reads each of N tensors in file order (AT(U, i) the i-th): contiguous
 * shares in file order balanced by bytes, by whole files where there are at least 2R files,
 * else by tensors (each unit goes to the share its middle byte falls in). OUT[i]: 0 to R-1. */
void sl__readers_share(size_t n, const sl_source_tensor *(*at)(void *u, size_t i), void *u, int R, int *out);

/* ---- loader_stage.c ---------------------------------------------------------------------- */
/* Sizes the slots, builds the schedule, creates the streams and allocates the slots that
 * transfers will use (after the pipe chose the route). */
sl_status sl__loader_stage_setup(loader *L);
/* The carve-up of a slot for transfer X in this load's read mode. */
carve sl__loader_carve(const loader *L, const transfer *x);
/* Waits until nothing runs on the staging any more, keeping the context's message. */
void sl__loader_stage_drain(loader *L);
void sl__loader_stage_release(loader *L);

/* ---- loader_pipe.c ----------------------------------------------------------------------- */
/* Whether distributed readers' transfers run in rounds, each one group op of the data
 * collective (its scatterv_group), which takes a slot per reader in flight and one per reader
 * reading ahead (loader_stage.c sizes them so). */
bool sl__loader_rounds(const loader *L);
sl_status sl__loader_pipe(loader *L);
void sl__loader_pipe_release(loader *L);

/* ---- loader_send.c ----------------------------------------------------------------------- */
sl_status sl__loader_send_setup(loader *L);
/* collective: the HSDP sub-communicators, where a transfer chains */
sl_status sl__loader_hsdp_setup(loader *L);
void sl__loader_send_release(loader *L);
/* The root's reader thread: transfer X from storage into slot S's read area, or straight into
 * its tensor (*DIRECT). */
sl_status sl__loader_root_read(loader *L, const transfer *x, slot *s, bool *direct);
/* The root: the wire bytes *S of transfer X, after the read RD; true when nothing is left to move
 * (world 1, read in place). A failure is rank 0's own: it still takes part. */
bool sl__loader_root_wire(loader *L, const transfer *x, slot *s, const carve *c, const slot_read *rd,
                          const unsigned char **S);
/* Every rank: the scatter of transfer X (HSDP: in replica 0, then the chain) into RECV, MINE
 * bytes; the broadcast of X into *BUF. A failure is the data plane's. */
sl_status sl__loader_scatter(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char *S,
                             unsigned char *recv, uint64_t mine);
sl_status sl__loader_broadcast(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char *S,
                               const unsigned char **buf);
/* Every rank: the scatters of a round of M transfers from distinct roots (none HSDP) as one
 * group op of the data plane (sl_collective_ops.scatterv_group). A failure is the data plane's. */
sl_status sl__loader_scatter_round(loader *L, const transfer *const *x, slot *const *sl, const carve *c,
                                   const unsigned char *const *S, unsigned char *const *recv, const uint64_t *mine,
                                   size_t m);
/* Region R's elements of [a, b) from SRC (the piece's data) to DST, on the device or the host;
 * *COUNT: how many. */
sl_status sl__loader_pack(loader *L, const sl__region *r, size_t es, const unsigned char *src, uint64_t a, uint64_t b,
                          unsigned char *dst, bool device, uint64_t *count);
/* Whether region R's part of [a, b) is one contiguous run, and where it starts. */
bool sl__loader_single_run(const sl__region *r, uint64_t a, uint64_t b, uint64_t *first);

/* ---- loader_recv.c ----------------------------------------------------------------------- */
/* This rank's part of transfer X: its bytes (the return) and *DIRECT, the shard address when
 * the part can land in place. */
uint64_t sl__loader_my_part(loader *L, const transfer *x, unsigned char **direct);
/* Places this rank's parts from RECV (a scatter's layout) or from BUF (a whole broadcast). */
void sl__loader_place_parts(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char *recv);
void sl__loader_place_broadcast(loader *L, const transfer *x, slot *s, const carve *c, const unsigned char *buf);
/* Every-rank reads: this rank reads its own runs of X and places them. */
void sl__loader_read_own(loader *L, const transfer *x, slot *s, const carve *c);
/* Once slot S's last use completed: places the CPU shards whose bytes came down into it. */
void sl__loader_finish_host(loader *L, const slot *s);
void sl__loader_recv_release(loader *L);

/* ---- shared by the data path ------------------------------------------------------------- */
/* Mutation hooks for the test that proves the matrix catches a missing wait or record
 * (tests/mutants.cmake builds SL_MUTANT_SOURCES again with SL__MUTANT=n). 0 in every real build. */
#ifndef SL__MUTANT
#define SL__MUTANT 0
#endif
#define SL__KEEP(n) (SL__MUTANT != (n))

/* Where shard bytes live as the host sees them: host memory (CPU placement, or the cpu
 * backend's "device") or device memory only the backend may touch. */
static inline bool sl__shard_on_host(const loader *L, const tensor_job *j) {
  return j->out->device == SL_DEVICE_CPU || L->pipe.device_is_host;
}

/* Every-rank reads: whether J's runs are read from the file straight into its shard (host
 * memory, no cast), with no staging (loader_recv.c:read_own_run; loader_stage.c sizes the
 * staging by it). */
static inline bool sl__reads_in_place(const loader *L, const tensor_job *j) {
  return sl__shard_on_host(L, j) && j->src->dtype == j->res.dtype;
}

static inline const tensor_job *sl__job_of(const loader *L, const piece *p) { return &L->jobs[p->job]; }

#endif
