/* Loader internals shared by loader*.c and state.c.
 *
 * sl_load runs in phases (docs/DESIGN.md#data-flow):
 *   loader.c        arguments, the phase sequence, closing
 *   loader_agree.c  agreements over the control plane (plan digest, files, closing)
 *   loader_plan.c   phase 1: plan -> tensor jobs (geometry computed once), binding/allocating
 *   loader_data.c   phase 2: the pipelined data path over the data plane
 *   loader_xfer.c   phase 2's schedule: tensors cut and bucketed into transfers */
#ifndef SHARDLOAD_LOADER_H
#define SHARDLOAD_LOADER_H

#include <pthread.h>

#include "internal.h"

typedef struct sl__name_index {
  const char *name;
  size_t index;
} sl__name_index;

struct sl_state {
  sl__backend_ref *be; /* a reference of its own: the state may outlive the context */
  sl_tensor *tensors;  /* file order */
  size_t count;
  sl__name_index *by_name; /* sorted by name, for sl_state_find */
  char **skipped;
  size_t nskipped;
  sl_load_stats stats;
  /* caller host buffers the load registered with the backend (unregistered at destroy) */
  void **registered;
  size_t nregistered;
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
#define SL__MIN_SLOT 1024u
#define SL__DEFAULT_SLOTS 2
#define SL__MAX_SLOTS 8
/* Rank 0 shares the outcome of its reads once per this many transfers (and at the end), not
 * per chunk: the status round trip stays off the critical path (docs/DESIGN.md#data-flow). */
#define SL__STATUS_WINDOW 16
#define SL__A16(x) (((uint64_t)(x) + 15) & ~(uint64_t)15)
/* per slot: room for the carve-up's 64-byte area alignment (loader_data.c) */
#define SL__SLOT_SLACK 256
/* per piece: its 16-byte alignment in each of the five areas */
#define SL__PIECE_PAD 80

typedef struct tensor_job {
  size_t src_index;
  const sl_source_tensor *src;
  sl__resolved res;
  sl__region mine;
  sl_tensor *out;
  sl_dtype wire;    /* dtype on the wire: the smaller of file and parameter dtype */
  bool hsdp;        /* mesh dim 0 replicate on a 2-D+ mesh: scatter in replica 0, then chain */
  uint32_t klass;   /* placement class: transfers bucket only tensors of one class */
  uint64_t elems;
} tensor_job;

/* A piece: global elements [a, b) of one tensor. A transfer: consecutive pieces moved by one
 * collective operation (a large tensor is cut into several transfers, small tensors of one
 * class share one). Every rank builds the same list from the agreed plan. */
typedef struct piece {
  size_t job;
  uint64_t a, b;
} piece;

typedef struct transfer {
  size_t first, count; /* into loader.pieces */
  /* The pieces of a transfer are ordered by wire element size, largest first, so that in
   * every dense concatenation of wire-dtype parts (the send buffer, each rank's part) every
   * element is aligned to its size. Areas local to a rank (the read area when it casts, the Y
   * area) start each piece at a multiple of 16 instead (SL__A16). */
  uint64_t read_bytes;  /* file dtype, pieces at multiples of 16 (an upper bound when plain) */
  uint64_t wire_bytes;  /* wire dtype, dense: the send buffer S and a broadcast's size */
  uint64_t y_bytes;     /* max(file, parameter) dtype where needed, pieces at multiples of 16 */
  uint64_t file_bytes;  /* bytes read from storage */
  bool plain;           /* no piece is cast on the way: the read area is S, dense */
  bool hsdp;
} transfer;

typedef enum slot_state { SLOT_FREE = 0, SLOT_READING, SLOT_READY, SLOT_INFLIGHT } slot_state;

/* One staging slot of the pipeline. Host part (pinned when the backend has pinned memory):
 * rank 0 reads into it, host routes send and receive through it, and device-to-host copies of
 * CPU placements land in it. Device part (device route only): the same carve-up in device
 * memory. */
typedef struct slot {
  unsigned char *host;
  unsigned char *dev;
  void *ev_copy; /* recorded on the copy stream after the last op reading or writing this slot */
  void *ev_comm; /* recorded on the data stream after the last op touching this slot */
  /* reader thread handshake (rank 0) */
  slot_state state;
  size_t xfer;       /* transfer being read / ready */
  sl_status read_st;
  char read_msg[512];
  bool direct;       /* the reader read straight into the tensor (world 1) */
  /* CPU placements waiting for this slot's device-to-host copy */
  size_t pending_first, pending_count; /* into loader.finish */
} slot;

/* A host-side placement that must wait for a device-to-host copy (device route, CPU shard). */
typedef struct host_finish {
  size_t job;
  size_t off;        /* in the slot's host part */
  uint64_t la, count; /* local elements */
} host_finish;

typedef struct loader {
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
  uint64_t total_bytes, done_bytes;
  uint64_t digest;

  /* phase 2 schedule */
  piece *pieces;
  size_t npieces;
  transfer *xfers;
  size_t nxfers;

  /* data path */
  bool device_route;   /* the data plane moves device memory (docs/DESIGN.md#data-flow) */
  bool device_is_host; /* cpu backend */
  bool can_cast_device, can_2d;
  /* [from][to]: the backend casts the pair on the device (cast_async of 0 elements said SL_OK) */
  bool cast_on_device[SL_DTYPE_COUNT_][SL_DTYPE_COUNT_];
  int nslots;
  slot slots[SL__MAX_SLOTS];
  size_t slot_bytes;
  /* the smallest maximum allocation of any rank's backend (SL_EXT_MAX_ALLOC), 0: none; known
   * from the planning agreement on, so that every rank sizes its slots (and so its schedule) alike */
  uint64_t alloc_cap;
  bool host_pinned;
  void *s_copy, *s_comm; /* backend streams: host<->device copies; data collective + device work */
  /* HSDP: sub-communicators of the data plane (NULL when unused) */
  void *g_shard0;        /* replica 0's ranks: rank 0 scatters within it */
  void *g_pair_a, *g_pair_b; /* replica chain links (r even -> a, r odd -> b) */
  int replicas, shard_ranks, my_replica;
  bool hsdp_ready;
  /* rank 0's per-rank scratch */
  size_t *counts, *displs;
  int *group;          /* per rank: the first rank holding the same region (it packs once) */
  int *group_of_key;
  sl__region *regions; /* per rank, rank 0 only */
  uint64_t *part_off;  /* per rank: where its part of the current piece starts in the send buffer */
  size_t retired;      /* transfers [0, retired) have been retired */
  sl_status root_st;   /* rank 0: first read failure of the current status window */
  char root_msg[SL__ERRMSG_LEN];
  host_finish *finish;
  size_t nfinish, cap_finish;
  /* reader thread (rank 0) */
  pthread_t reader;
  bool reader_running;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool stop;
  bool reader_halt; /* rank 0 failed on its own: the reader reads no more (under lock) */
  bool data_started; /* every rank set up its data path: data operations may be pending */
  double read_seconds;

  /* The first failure local to this rank in phase 2 (a copy to the device, a cast, a read in
   * every-rank mode). The rank keeps taking part in every collective so the others are not
   * left waiting, places nothing more, and reports it at the closing agreement. */
  sl_status deferred;
  char deferred_msg[SL__ERRMSG_LEN];
} loader;

/* loader_agree.c */
sl_status sl__loader_agree(loader *L, sl_status local, const char *phase);
sl_status sl__loader_agree_files(loader *L, sl_status local);
/* loader_plan.c */
sl_status sl__loader_plan(loader *L);
sl_status sl__loader_bind(loader *L);
/* loader_xfer.c */
sl_status sl__loader_schedule(loader *L);
uint64_t sl__loader_cost_per_elem(const loader *L, const tensor_job *j);
/* loader_data.c */
sl_status sl__loader_data(loader *L);
void sl__loader_data_release(loader *L);
/* loader_data.c: records this rank's first own failure of phase 2 (NAME: the tensor, or NULL
 * when the context's message names it) */
void sl__loader_defer(loader *L, const char *name, sl_status st);

/* ---- shared by loader_data.c and loader_move.c ------------------------------------------ */
/* Mutation hooks for the test that proves the matrix catches a missing wait or record
 * (tests/mutants.cmake builds the data path again with SL__MUTANT=n). 0 in every real build. */
#ifndef SL__MUTANT
#define SL__MUTANT 0
#endif
#define SL__KEEP(n) (SL__MUTANT != (n))

double sl__now_s(void); /* CLOCK_MONOTONIC seconds */

/* The carve-up of a slot for one transfer (offsets into its host and device parts): R the
 * read (file dtype), W the wire bytes S, P packed parts, V this rank's received part, Y host
 * casts and device-to-host landings. Every-rank reads use only R and Y (at W). */
typedef struct carve {
  size_t R, W, P, V, Y;
} carve;

static inline size_t sl__align64(uint64_t x) { return (size_t)((x + 63) & ~(uint64_t)63); }

static inline carve sl__carve_of(const transfer *x, int world) {
  carve c;
  c.R = 0;
  c.W = sl__align64(x->read_bytes);
  c.P = c.W + (x->plain ? 0 : sl__align64(x->wire_bytes)); /* W: only where rank 0 casts */
  c.V = c.P + sl__align64(x->wire_bytes + 16 * (uint64_t)world); /* packed blocks start at multiples of 16 */
  c.Y = c.V + sl__align64(x->wire_bytes);
  return c;
}

/* Where shard bytes live as the host sees them: host memory (CPU placement, or the cpu
 * backend's "device") or device memory only the backend may touch. */
static inline bool sl__shard_on_host(const loader *L, const tensor_job *j) {
  return j->out->device == SL_DEVICE_CPU || L->device_is_host;
}

static inline const tensor_job *sl__job_of(const loader *L, const piece *p) { return &L->jobs[p->job]; }

/* loader_move.c: rank 0's own failure in phase 2 (a read, a pack, the caller's progress
 * callback): the first one is what the next status window tells every rank; rank 0 places
 * nothing more from here on. */
void sl__loader_root_failed(loader *L, sl_status st, const char *msg);
/* loader_move.c: one transfer through slot S (rank 0 sends, every rank receives and places) */
sl_status sl__loader_run_transfer(loader *L, size_t k, slot *s);

#endif
