/* Internal declarations shared by core/ files. Nothing here is exported. */
#ifndef SHARDLOAD_INTERNAL_H
#define SHARDLOAD_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "module.h"
#include "shardload/shardload.h"

#define SL__ERRMSG_LEN 1024

/* A backend instance shared by the context and every state it loaded: states free their
 * tensors through it and may outlive the context (sl_tensor's rule in shardload.h). fini and
 * dlclose run when the last reference goes (backend_ref.c). */
typedef struct sl__backend_ref {
  const sl_backend_ops *ops;
  void *handle;
  void *dl;   /* dlopen handle of a loadable backend, or NULL */
  void *shim; /* the registry's v1 adapter, freed with the reference, or NULL */
  int refs;   /* atomic */
  /* The host lent to the backend: it reports to the context while one is attached and is
   * silent after sl__backend_ref_detach (a state freeing tensors after its context is gone). */
  sl_module_host host;
  sl_context *ctx;
  /* Guards CTX: held by every report through the host (on whatever thread frees a state or
   * releases an export) and by detach, so that the context is never used once it may be gone. */
  pthread_mutex_t mu;
} sl__backend_ref;
sl__backend_ref *sl__backend_ref_new(const sl_backend_ops *ops, void *handle, void *dl, void *shim, sl_context *ctx);
void sl__backend_ref_detach(sl__backend_ref *r);
void sl__backend_ref_get(sl__backend_ref *r);
void sl__backend_ref_put(sl__backend_ref *r);
/* Until called again with NULL, the backend's failures reported on this thread go to BUF
 * (cleared here) instead of the context (backend_ref.c). */
void sl__backend_ref_capture(char *buf, size_t len);
/* Frees memory of the backend (device, pinned or plain host) through a reference. */
void sl__backend_free(sl__backend_ref *r, sl_device_kind where, int pinned, void *ptr);

struct sl_context {
  char errmsg[SL__ERRMSG_LEN];
  sl_log_fn log;
  void *log_user;
  sl_log_level log_level;
  int rank, world_size, local_rank, local_world_size;
  int timeout_ms;
  char *rendezvous;
  sl_module_host host;
  sl__backend_ref *beref;
  const sl_backend_ops *be; /* == beref->ops */
  void *be_ctx;             /* == beref->handle */
  int device_ordinal;
  /* Control plane: agreements, manifests, status; host memory, synchronous (Gloo, or local for
   * one rank). Data plane: tensor bytes; may be a device collective. When the data plane is
   * the control plane's module (host staging), they share one communicator. */
  const sl_collective_ops *ctl;
  void *ctl_comm;
  void *ctl_dl;
  void *ctl_shim; /* the registry's v1 adapter for ctl, freed after fini, or NULL */
  const sl_collective_ops *data;
  void *data_comm;
  void *data_dl;
  void *data_shim; /* same for data (NULL when data_is_ctl) */
  bool data_is_ctl;
  sl_control_plane control; /* what data modules bootstrap through */
  /* The hosts, as the host staging counts them (docs/DESIGN.md#readers): HOST_OF[r] is rank
   * r's host, numbered by first rank; NHOSTS of them. Agreed at creation from every rank's
   * evidence (one boot id, host name, user and namespaces), so alike on every rank. */
  int *host_of;
  int nhosts;
  char data_reason[256];
  char backend_reason[512]; /* "cpu: auto, cuda: no CUDA driver (...)"; "NAME: asked for" */
  char device_desc[256];
  volatile int aborted;
};

/* Control-plane collectives (synchronous, host memory): what agreements and manifests use. */
sl_status sl__ctl_broadcast(sl_context *ctx, void *buf, size_t bytes, int root);
sl_status sl__ctl_allgather(sl_context *ctx, const void *sendbuf, void *recvbuf, size_t bytes);
sl_status sl__ctl_barrier(sl_context *ctx);

/* Records the specific message in ctx (when ctx is not NULL) and returns s. */
sl_status sl__fail(sl_context *ctx, sl_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void sl__log(sl_context *ctx, sl_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
sl_status sl__vfail(sl_context *ctx, sl_status s, const char *fmt, va_list ap);
/* The module host of CTX: modules report through its logger and message buffer. */
sl_module_host sl__module_host_of(sl_context *ctx);
/* Redirects this thread's sl__fail messages into BUF (NULL: back to the context). For helper
 * threads of the core, whose messages the owning thread hands over itself. */
void sl__thread_errbuf(char *buf, size_t len);
void sl__vlog(sl_context *ctx, sl_log_level level, const char *fmt, va_list ap);
/* Formats a message into ERR (when given) and returns s: for parsers that report to a caller's
 * buffer rather than a context. */
sl_status sl__errbuf(char *err, size_t errlen, sl_status s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* pread until LEN bytes or end of file; returns the bytes read, or -1 with errno set. */
ssize_t sl__pread_full(int fd, void *buf, size_t len, uint64_t off);
/* CLOCK_MONOTONIC seconds (loader.c): the load's statistics, the source's read times */
double sl__now_s(void);
/* preadv until every byte of the IOVCNT iovecs or end of file, resuming after short reads and
 * EINTR; returns the bytes read, or -1 with errno set. IOV is consumed in place as it reads (each
 * entry's base advanced, its length lowered, down to 0), so that the bytes left unread are the
 * sum of the lengths on return, after a failure too. */
ssize_t sl__preadv_full(int fd, struct iovec *iov, int iovcnt, uint64_t off);

/* Copies the options struct a caller compiled against (OPTS_SIZE bytes, possibly older and
 * shorter than ours) into a zero-initialised full struct. NULL means all zero. */
void sl__copy_sized(void *dst, size_t dst_size, const void *src, size_t src_size);

/* ---- safetensors header (safetensors.c) ---------------------------------------------------- */
#define SL__ST_MAX_HEADER 100000000ull /* the reference implementation's limit */

typedef struct sl__st_tensor {
  char *name;
  sl_dtype dtype;
  int ndim;
  int64_t shape[SL_MAX_DIMS];
  uint64_t begin, end; /* data_offsets, relative to the data section */
} sl__st_tensor;

typedef struct sl__st_header {
  sl__st_tensor *tensors; /* sorted by begin: file order */
  size_t count;
  char **meta_keys, **meta_values;
  size_t meta_count;
  uint64_t data_offset; /* 8 + N */
  uint64_t data_size;   /* file size - data_offset */
  uint64_t header_digest; /* XXH3-64 of the 8 + N header bytes (checkpoint identity) */
} sl__st_header;

/* Parses and validates a whole file image header: BUF holds the first LEN bytes of a file of
 * FILE_SIZE bytes (LEN >= 8; LEN may be less than 8+N, then SL_ERR_FORMAT says truncated).
 * On failure writes a specific message to err (no file name; the caller adds it). */
sl_status sl__st_parse(const uint8_t *buf, size_t len, uint64_t file_size, sl__st_header *out,
                       char *err, size_t errlen);
/* Whether sl__st_parse and sl__st_read try the scan that reads the common header without a JSON
 * tree (safetensors.c) before jansson's tree; true unless a test turns it off, to compare the
 * two (fuzz/fuzz_header.c) or to fail jansson's allocations one by one. */
extern bool sl__st_scan;
/* Reads the header of an open file descriptor and parses it. */
sl_status sl__st_read(int fd, sl__st_header *out, char *err, size_t errlen);
void sl__st_header_free(sl__st_header *h);

/* ---- source (source.c, source_files.c, source_manifest.c) -------------------------------- */
/* Positional read of BYTES at OFFSET of tensor I's file; loops over short reads. */
sl_status sl__source_pread(sl_source *src, size_t i, uint64_t offset_in_tensor, void *dst,
                           size_t bytes);
/* Coalesced reads (every-rank mode's in-place reads: many small runs of one file, in file
 * order). A request joins the pending batch when it is in the batch's file, starts at or after
 * its end with at most SL__READ_GAP bytes between (read into GAP and dropped: a sharded
 * tensor's runs of other ranks, a skipped tensor), and the batch stays within SL__READ_IOV
 * iovecs and SL__READ_SPAN file bytes; otherwise the batch is flushed first. A zero batch is
 * empty; it lives where its caller puts it (about 56 KiB) and holds no resources. */
#define SL__READ_IOV 1024        /* iovecs per preadv: Linux's IOV_MAX */
#define SL__READ_GAP (16u << 10) /* the widest gap read and dropped rather than skipped */
#define SL__READ_SPAN (8u << 20) /* file bytes per preadv at most */
typedef struct sl__read_batch {
  size_t file;         /* the file of every pending request */
  uint64_t start, end; /* the file bytes [start, end) the pending requests and gaps cover */
  int niov;
  size_t nreq;
  struct {
    size_t tensor;
    uint64_t off; /* in the file */
    size_t bytes;
  } req[SL__READ_IOV];
  struct iovec iov[SL__READ_IOV];
  /* Tensor bytes read since the caller last cleared it (requests read whole; gaps not
   * counted): what the caller's statistics count. */
  uint64_t done;
  double seconds; /* the same for the seconds its reads took, failed ones included */
  /* After a failed add or flush: the tensor of the first request not read whole (the failing
   * byte may lie in the gap in front of it), for the caller to name; NULL after a success. */
  const char *failed;
  unsigned char gap[SL__READ_GAP];
} sl__read_batch;
/* Queues BYTES at OFFSET of tensor I's file into DST (which must stay valid until the flush),
 * after the same checks, with the same messages, as sl__source_pread; flushes first when the
 * request does not join. A memory source, a source without files and a request wider than
 * SL__READ_SPAN are read at once (sl__source_pread). DST holds its bytes only once a flush
 * succeeded. */
sl_status sl__source_read_add(sl_source *src, sl__read_batch *b, size_t i, uint64_t offset_in_tensor, void *dst,
                              size_t bytes);
/* Reads the pending requests in one sl__preadv_full; the batch is empty again on return,
 * whatever happened. A failure names the file and the tensor of the first request not read
 * whole, in sl__source_pread's words. */
sl_status sl__source_read_flush(sl_source *src, sl__read_batch *b);
/* Drops the pending requests unread (a rank that failed places nothing more). */
void sl__source_read_discard(sl__read_batch *b);
/* Whether this rank has the files open (rank 0 always; others in every-rank mode). */
bool sl__source_has_files(const sl_source *src);
/* Manifest: a byte image of the tensor table + metadata that rank 0 broadcasts and other
 * ranks turn back into a source without files. Free with free(). */
sl_status sl__source_serialize(const sl_source *src, void **buf, size_t *len);
sl_status sl__source_deserialize(sl_context *ctx, const void *buf, size_t len, sl_source **out);
/* Opens the files named in a manifest-built source (every-rank read mode). */
sl_status sl__source_open_files(sl_source *src, bool readers);
sl_status sl__source_open_local(sl_context *ctx, const char *path, sl_source **out);
/* Checkpoint identity (docs/DESIGN.md#identity). XXH3-64 over every file's 8-byte header length + header
 * bytes, combined in file order; rank 0's value travels in the manifest, so a source built
 * from a manifest returns rank 0's digest. 0 only for a source with no files. */
uint64_t sl__source_headers_digest(const sl_source *src);
size_t sl__source_file_count(const sl_source *src);
/* Name of file F as the index names it (or the file's own name for a single file). */
const char *sl__source_file_name(const sl_source *src, size_t f);
/* Fingerprint of file F as THIS rank reads it (it must have its files open):
 * out[0] = XXH3-64 of the header length + header bytes, out[1] = XXH3-64 over sampled data
 * blocks (first, last and evenly spaced blocks of the data section plus the file size).
 * Deterministic for identical bytes; docs/DESIGN.md#identity says what it does and does not catch. */
sl_status sl__source_file_fingerprint(sl_source *src, size_t f, uint64_t out[2]);

/* ---- index.json (source_index.c) ---------------------------------------------------------- */
/* A parsed model.safetensors.index.json. Factored out of sl__source_open_local so the fuzzer can
 * reach it with a buffer. */
typedef struct sl__index {
  char **files; /* distinct weight_map file names, sorted (this is the file order) */
  size_t file_count;
  char **names;    /* weight_map tensor names, in the index's order */
  size_t *file_of; /* names[i] is in files[file_of[i]] */
  size_t count;
  char **meta_keys, **meta_values; /* "metadata"; non-string values as compact JSON */
  size_t meta_count;
} sl__index;
/* On failure writes a specific message to err (no path; the caller adds it). */
sl_status sl__index_parse(const char *buf, size_t len, sl__index *out, char *err, size_t errlen);
/* NULL when a weight_map file name (LEN bytes) stays inside the index's directory by its
 * spelling (relative; no '.', '..' or empty component; no backslash or NUL), else what is
 * wrong ("is an absolute path"). sl__index_parse refuses entries that fail it. */
const char *sl__index_entry_problem(const char *entry, size_t len);
void sl__index_free(sl__index *ix);

/* ---- dtypes (dtype.c) --------------------------------------------------------------------- */
sl_dtype sl__dtype_from_st(const char *name); /* exact safetensors spelling only */

/* ---- plan (plan.c) ------------------------------------------------------------------------ */
typedef struct sl__resolved {
  sl_mesh_placement placements[SL_MAX_MESH_DIMS];
  sl_dtype dtype; /* parameter dtype */
} sl__resolved;
int sl__plan_mesh(const sl_plan *plan, int world_size, int *dims); /* returns ndim */
const sl_offload_policy *sl__plan_policy(const sl_plan *plan);
/* Placement and dtype of tensor T (rules, entries, defaults applied; dims normalised). Fails
 * with a message naming the tensor when a shard dim is out of range or a cast is not allowed. */
sl_status sl__plan_resolve(sl_plan *plan, const sl_source_tensor *t, sl__resolved *out);
/* Checks the plan against the source: the world, missing entries (SL_ERR_MISSING),
 * strictness; fills take[i] (1 = load tensor i). Then resolves every tensor it takes, in file
 * order, failing at the first that does not resolve. sl__plan_check_names is its first half:
 * the loader resolves each tensor itself, once, into the tensor's job, in the same order. */
sl_status sl__plan_check(sl_plan *plan, const sl_source *src, int world_size, unsigned char *take);
sl_status sl__plan_check_names(sl_plan *plan, const sl_source *src, int world_size, unsigned char *take);
/* A digest of everything in the plan that decides what moves (for cross-rank comparison) and
 * a canonical text form (for naming the first difference). */
uint64_t sl__plan_digest(const sl_plan *plan);
char *sl__plan_canonical(const sl_plan *plan); /* malloc'd */
sl_context *sl__plan_context(const sl_plan *plan);

/* ---- plan internals shared by plan.c and plan_json.c --------------------------------------- */
/* Mesh dims when set explicitly (returns ndim); 0 when the plan uses the default 1-D [world]. */
int sl__plan_mesh_explicit(const sl_plan *plan, int *dims);
/* Moves everything SRC set explicitly into DST (SRC's settings win; rules are appended, entries
 * merged field by field). A mesh in SRC that DST's placements do not fit fails before DST
 * changes. SRC is left for sl_plan_destroy. */
sl_status sl__plan_merge(sl_plan *dst, sl_plan *src);

/* ---- geometry (geometry.c) ---------------------------------------------------------------- */
typedef struct sl__region {
  int ndim;
  int64_t shape[SL_MAX_DIMS]; /* global */
  int64_t off[SL_MAX_DIMS];
  int64_t len[SL_MAX_DIMS];
} sl__region;

/* Mesh coordinate of RANK (row-major). */
void sl__mesh_coord(int rank, int mesh_ndim, const int *mesh, int *coord);
/* DTensor local region of a tensor for the rank at COORD. */
sl_status sl__region_compute(const int64_t *shape, int ndim, int mesh_ndim, const int *mesh,
                             const sl_mesh_placement *pl, const int *coord, sl__region *out);
uint64_t sl__region_elems(const sl__region *r);
/* Number of region elements whose global flat index is < G. */
uint64_t sl__region_rank_of(const sl__region *r, uint64_t g);
/* Copies the region's elements with global flat index in [A, B) from CHUNK (which holds the
 * global elements [A, B) contiguously) to DST, in local row-major order. Returns the count. */
uint64_t sl__region_extract(const sl__region *r, size_t esize, const void *chunk, uint64_t a,
                            uint64_t b, void *dst);
/* Calls FN(user, global_start, local_start, count) for each maximal contiguous run of the
 * region clipped to [A, B), in order. Returns the first non-OK status of FN. */
/* The one computation of a tensor's shard (the loader and sl_plan_geometry both use it): the
 * resolved placement and dtype, the region of the rank at COORD, and its local bytes, with
 * overflow checks; failures name the tensor. */
sl_status sl__shard_of(sl_plan *plan, const sl_source_tensor *t, int mesh_ndim, const int *mesh, const int *coord,
                       sl__resolved *res, sl__region *reg, uint64_t *nbytes);
/* Its second half, for a placement RES already resolved (sl__plan_resolve). */
sl_status sl__shard_geometry(sl_plan *plan, const sl_source_tensor *t, int mesh_ndim, const int *mesh,
                             const int *coord, const sl__resolved *res, sl__region *reg, uint64_t *nbytes);
typedef sl_status (*sl__run_fn)(void *user, uint64_t gstart, uint64_t lstart, uint64_t count);
sl_status sl__region_runs(const sl__region *r, uint64_t a, uint64_t b, sl__run_fn fn, void *user);

/* ---- utilities ---------------------------------------------------------------------------- */
char *sl__strdup(const char *s);
/* Frees N key/value string pairs and both arrays (metadata maps). */
void sl__free_pairs(char **keys, char **values, size_t n);
/* Allocates the two zeroed arrays of a map of N key/value strings; false when out of memory
 * (whatever was allocated stays in *KEYS / *VALUES for sl__free_pairs). */
bool sl__alloc_pairs(size_t n, char ***keys, char ***values);
/* JSON text, read with jansson, duplicate keys refused. Returns the tree, or NULL with JERR set
 * and *NOMEM telling an allocation that failed (jansson says so with no error text, or with a
 * syntax error of valid text where a string's copy failed) from text that is not valid JSON
 * (JERR says where). Every parse of the core goes through these, so running out of memory is
 * reported as such (sl__errbuf_nomem), never as a malformed file. _loadf: from an open stream;
 * a read error (ferror) is not out of memory. */
struct json_t;
struct json_error_t;
struct json_t *sl__json_loadb(const char *text, size_t len, struct json_error_t *jerr, bool *nomem);
struct json_t *sl__json_loadf(FILE *f, struct json_error_t *jerr, bool *nomem);
/* "out of memory DOING its N-byte WHAT; free memory or raise the process's memory limit" into
 * ERR, SL_ERR_NOMEM: with the size of what was being read, which is what it costs. */
sl_status sl__errbuf_nomem(char *err, size_t errlen, const char *doing, size_t n, const char *what);
/* Checked multiply; returns false on overflow. */
static inline bool sl__mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}
static inline bool sl__add_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_add_overflow(a, b, out);
}

/* ---- built-in modules (backends/, collectives/) ------------------------------------------- */
const sl_backend_ops *sl__backend_cpu(void);
const sl_backend_ops *sl__backend_sim(void);
const sl_collective_ops *sl__collective_local(void);
const sl_collective_ops *sl__collective_shm(void); /* collectives/shm/shm.c */
#ifdef SHARDLOAD_HAVE_GLOO
const sl_collective_ops *sl__collective_gloo(void); /* collectives/gloo/gloo.cc */
const sl_collective_ops *sl__collective_hier(void); /* collectives/hier/hier.c */
/* Sets the timeout of COMM, a Gloo communicator (one of the module's own, a split's included),
 * for the ops that follow: hier's leaders' verdict, which must come within a grace, not a
 * whole timeout (collectives/hier/hier.c). */
void sl__gloo_set_timeout(void *comm, int timeout_ms);
/* Every member of the Gloo communicator COMM sends BYTES of MINE to every other, each peer on
 * its own, within COMM's timeout; ALL gets world x BYTES, GOT[r] 1 where rank r's arrived (this
 * rank's included), 2 where its connection refused or closed, 0 where it stayed silent. A
 * silent or dead peer costs only its slot. COMM is unusable afterwards.
 * Returns how many peers' bytes arrived. */
int sl__gloo_exchange(void *comm, const void *mine, size_t bytes, void *all, unsigned char *got);
/* Closes the Gloo communicator COMM's own connections, so that a peer waiting on this rank in
 * it fails at once; COMM is unusable afterwards. */
void sl__gloo_hang_up(void *comm);
#endif
/* One plain SGD step x -= lr * g on host memory (F64/F32/F16/BF16), for backends whose
 * memory the host can address. */
sl_status sl__host_sgd_step(void *x, const void *g, sl_dtype dt, size_t count, float lr);

/* sim backend introspection for tests: what kind of buffer PTR is (or lies inside). The rest
 * of what tests and the simccl collective use of sim goes through its ops table and its
 * extensions (launch_host_fn, SL_EXT_HOST_ACCESS, SL_EXT_NATIVE_STREAM), as a vendor's would. */
typedef enum sl__sim_kind { SL__SIM_NONE = 0, SL__SIM_DEVICE = 1, SL__SIM_PINNED = 2 } sl__sim_kind;
sl__sim_kind sl__sim_query(void *be, const void *ptr);
/* Host copies counted by kind and whether the host side was pinned (benchmarks, tests). */
typedef struct sl__sim_counters {
  uint64_t h2d, d2h, d2d, h2d_pageable, d2h_pageable, tasks;
} sl__sim_counters;
void sl__sim_counters_get(void *be, sl__sim_counters *out);
const sl_collective_ops *sl__collective_simccl(void);

/* ---- registry (registry.c) ---------------------------------------------------------------- */
/* SPEC: "auto", "NAME" or "NAME:VARIANT". DL receives the dlopen handle of a loadable module;
 * SHIM the v1 adapter's allocation (NULL for v2 modules), freed after the module is done with.
 * *OPS is always a v2 table (a v1 module's is adapted, see module.h). For "auto" the best probe
 * wins and the reasons the others gave are logged at INFO. */
sl_status sl__backend_select(sl_context *ctx, const char *spec, const sl_backend_ops **ops, void **dl,
                             void **shim, char *variant, size_t variant_len);
/* A collective by exact name (built-in or loadable), adapted to v2 like backends. */
sl_status sl__collective_select(sl_context *ctx, const char *spec, const sl_collective_ops **ops, void **dl,
                                void **shim);
/* The collective names this build knows (built-in first, then loadable), for the data-plane
 * agreement: at most MAX, returns the count. Stable order on every rank of one build. */
size_t sl__collective_names(const char **names, size_t max);
/* Whether this rank could run collective NAME with the backend whose table is BACKEND (its
 * probe, told the backend's native API, after loading the module if it is loadable, and a
 * route for the pair, sl__data_route; the module is closed again): > 0 yes; 0 no, and REASON
 * says why; -1 no such module (not a module name, or no file libshardload-NAME.so anywhere the
 * registry looks), and REASON says so. */
int sl__collective_probe(const char *name, const sl_backend_ops *backend, char *reason, size_t len);
/* The same, and DOMAINS gets the memory domains its table declares (sl_mem_domain bits; 0 when
 * no table could be read): what the data-plane agreement needs to tell a device collective. */
int sl__collective_probe_domains(const char *name, const sl_backend_ops *backend, char *reason, size_t len,
                                 uint32_t *domains);
/* The loader's route for collective C on a rank whose backend's table is BE
 * (docs/DESIGN.md#data-flow, Routes): host staging when C moves host memory, the device route
 * when it moves only device memory and that memory is BE's (C's device_backend is BE's native
 * API, sl_backend_native_api: a pairing by capability, never by the backend's name); otherwise
 * none, and WHY (when given) names both modules. A backend whose device memory is host memory
 * is served like any other: it pairs by its name, and the device route stages in what its
 * alloc_device gives. */
typedef enum { SL__ROUTE_NONE = 0, SL__ROUTE_HOST = 1, SL__ROUTE_DEVICE = 2 } sl__route;
sl__route sl__data_route(const sl_collective_ops *c, const sl_backend_ops *be, char *why, size_t len);
/* After a module's init of KIND ("backend", "collective") returned ST: when it gave no message
 * (the caller emptied the context's message before the call, and it is still empty), the
 * message names the module and the status, as every message must. Returns ST. */
sl_status sl__module_init_failed(sl_context *ctx, sl_status st, const char *kind, const char *name);
/* Whether NAME is of the module-name form [a-z0-9_]{1,32} (it becomes part of a file name). */
bool sl__module_name_ok(const char *name);
/* The name of NAMES within two edits of NAME, for "did you mean", or NULL. */
const char *sl__nearest_name(const char *name, const char *const *names, size_t n);
/* Text a module gave (a probe's reason, describe(), a name in a message), kept in place in S (a
 * buffer of CAP bytes) as printable ASCII: control characters read \n, \r, \t or \xNN as in the
 * command's error lines (docs/DESIGN.md#outputs), and so does every byte past 0x7e, so that the
 * text can neither forge a line nor drive a terminal and is valid UTF-8 (JSON) wherever it goes.
 * Cut to fit, never inside an escape. */
void sl__module_text(char *s, size_t cap);

/* ---- context helpers (context.c) ---------------------------------------------------------- */
bool sl__device_is_host(const sl_context *ctx);
bool sl__has_pinned(const sl_context *ctx);
/* The backend's largest single allocation (SL_EXT_MAX_ALLOC), 0 when it has no limit of its own. */
uint64_t sl__backend_max_alloc(const sl_context *ctx);

/* ---- launcher environment and rendezvous URLs (launch.c) ----------------------------------- */
/* Where this process sits in the job, as the launcher said (torchrun, Slurm, Open MPI). */
typedef struct sl__launch_info {
  int rank, world_size, local_rank;
  char *rendezvous;   /* malloc'd "tcp://HOST:PORT" / "c10d://HOST:PORT" / "file://DIR", or NULL; caller frees */
  const char *source; /* static: "torchrun", "slurm", "openmpi" or "default" */
} sl__launch_info;
/* Reads the launcher variables (torchrun, then Slurm, then Open MPI; none: rank 0 of 1) and
 * SHARDLOAD_RENDEZVOUS; every malformed value is SL_ERR_INVALID naming the variable: a world
 * past SL_MAX_WORLD_SIZE, a local rank not below the launcher's count of the node's ranks. */
sl_status sl__launch_env(sl_context *ctx, sl__launch_info *out);
/* SL_ERR_INVALID naming FROM (the option that gave it) and the bound when WORLD is past
 * SL_MAX_WORLD_SIZE, as sl__launch_env says it of a launcher's variable: every world size a
 * context takes passes one or the other. */
sl_status sl__world_size_check(sl_context *ctx, const char *from, long world);
/* Ranks of this job on this node: LOCAL_WORLD_SIZE (torchrun), SLURM_NTASKS_PER_NODE
 * (when a plain integer), OMPI_COMM_WORLD_LOCAL_SIZE, else 1; a malformed value is
 * SL_ERR_INVALID naming the variable. */
sl_status sl__launch_local_world_size(sl_context *ctx, int *out);
/* The rendezvous the environment names: SHARDLOAD_RENDEZVOUS, else MASTER_ADDR/MASTER_PORT (under
 * Slurm, the launch node and port 29500 stand in). Under torchrun's agent store
 * (TORCHELASTIC_USE_AGENT_STORE=True, torch's default) MASTER_ADDR/MASTER_PORT name the agent's
 * c10d store, which gives c10d://; otherwise tcp://. *URL (malloc'd) is NULL when it names none;
 * a malformed one is SL_ERR_INVALID naming the variable. */
sl_status sl__launch_rendezvous(sl_context *ctx, bool slurm, char **url);

/* FILE: Gloo's FileStore in a shared directory. TCP: shardload's own store, served by rank 0.
 * C10D: a client of an existing torch c10d TCPStore (torchrun's agent); nobody serves. */
typedef enum sl__rdzv_kind { SL__RDZV_FILE = 1, SL__RDZV_TCP = 2, SL__RDZV_C10D = 3 } sl__rdzv_kind;
typedef struct sl__rendezvous {
  sl__rdzv_kind kind;
  char path[4096]; /* file: the directory */
  char host[256];  /* tcp, c10d: host name or address, IPv6 brackets removed */
  int port;        /* tcp, c10d: 1..65535 */
} sl__rendezvous;
/* Parses "file://DIR", "tcp://HOST:PORT" or "c10d://HOST:PORT" ("tcp://[::1]:PORT" for IPv6). On
 * failure returns SL_ERR_INVALID with a message in ERR saying what is wrong and the accepted forms. */
sl_status sl__rendezvous_parse(const char *url, sl__rendezvous *out, char *err, size_t errlen);


/* ---- host memory (hostops.c) ------------------------------------------------------------- */
/* 64-byte aligned host memory; blocks of 1 MiB and more are mapped pre-faulted. */
void *sl__host_alloc(size_t bytes);
void sl__host_free(void *ptr);
/* Under AddressSanitizer: mark BYTES at P unaddressable (ON) or addressable again; a no-op
 * otherwise. Memory carved out of one block (the shard arena) poisons what lies between its
 * pieces, so an overrun of one shard is reported as it would be for a block of its own. */
void sl__host_poison(void *p, size_t bytes, int on);
#if defined(__SANITIZE_ADDRESS__)
#define SL__HOST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SL__HOST_ASAN 1
#endif
#endif
#ifdef SL__HOST_ASAN
#define SL__HOST_GUARD 64u /* a poisoned gap after each carved piece */
#else
#define SL__HOST_GUARD 0u
#endif

#endif
