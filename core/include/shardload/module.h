/* shardload module ABI, version 2: backends (memory, copies, streams and events) and
 * collectives (data movement between ranks). Installed with the public headers so that
 * vendor modules build out of tree against an installed shardload (docs/DESIGN.md#modules);
 * the frozen v1 tables are installed beside it (shardload/module_v1.h), so that one module can
 * export both versions.
 *
 * A module is one const ops table that starts with its ABI version and its size, exported by
 * a versioned entry symbol (sl_backend_module_v2 / sl_collective_module_v2; the core falls
 * back to the v1 symbols, so one core loads modules of both versions, and a module may export
 * several versions to serve several cores). The core tests optional members with SL_HAS_OP,
 * so a module built against an older, shorter table keeps working. Every struct that crosses
 * the boundary in either direction starts with (or, for tables, carries) its size. Modules
 * never print: they report through the sl_module_host the core lends them.
 *
 * ---- Threads -------------------------------------------------------------------------------
 * Not thread-safe except where stated. The core calls the ops of one instance (one init's
 * handle) from one thread at a time, which need not be the same thread from call to call (an
 * application may hand a context from thread to thread). Instances are independent: two
 * contexts on two threads call two instances at once, so whatever a module keeps for the
 * process (a library it opened, a counter) is its own to guard; probe and get_proc may be
 * called from any thread, concurrently with anything. The exceptions, marked "callable from
 * any thread" at each op:
 * - backends: what frees a loaded state and lends its memory (shardload.h: sl_state_destroy,
 *   sl_state_export and sl_export_release run on any thread, a garbage collector's included,
 *   while the context goes on loading on its own): free_device, free_pinned, unregister_host,
 *   event_create, event_destroy, event_record_native, event_query, event_sync, synchronize and
 *   free_device_after may be called from any thread, concurrently with each other and with any
 *   other op of the instance; fini from any thread, once every other call has returned (the
 *   last reference goes);
 * - collectives: abort, from any thread (a signal handler's included, as far as the transport
 *   allows), concurrently with any op of the communicator but never with or after its fini;
 * - the host: log from any thread; fail only on a thread inside a call the core made (it writes
 *   that thread's message). A module's own threads (stream workers, watchdogs, host functions)
 *   never call fail: they keep the failure for a later call to report on the caller's thread
 *   (the sticky error of enqueued work, a dead communicator's reason).
 *
 * ---- The asynchronous contract -------------------------------------------------------------
 * Device work is ordered on streams (CUDA streams, HIP streams, Level Zero command lists).
 * Every op below says in one sentence whether it is COMPLETE ON RETURN (its effects are
 * visible to the host and to every stream when it returns) or ENQUEUED (it returns once the
 * work is queued on the stream; it runs after the work queued on that stream before it and
 * before the work queued after it, and nothing else is promised). For an enqueued op:
 * - the memory it reads must not be written, and the memory it writes must not be read or
 *   written, by the host or by another stream, until an event recorded after it on its stream
 *   has completed (event_sync / event_query) or another stream waits for such an event;
 * - its failure may be reported by the enqueuing call or by any later call on the module; it
 *   is sticky: stream_sync, event_sync and synchronize return it.
 * The NULL stream is the backend's default stream and obeys the same rules (it does not
 * synchronise with other streams). A backend whose work is synchronous (cpu) meets this
 * contract trivially; the core must not rely on that (the sim backend runs enqueued work
 * later, on a worker thread, so a missing wait reads stale or torn data in tests).
 *
 * Events. An event stands for its LAST RECORD: stream_wait_event, event_query and event_sync
 * refer to the last event_record made before they were called, and a wait already queued keeps
 * waiting for the record it saw whatever is recorded later (as cudaStreamWaitEvent). Recording
 * an event again while its last record is still pending is allowed, and the core does it (a
 * staging slot's event is recorded after its upload and again after its last use): the earlier
 * record still completes for the waits that saw it, and the event completes once the new one
 * has. An event never recorded is complete. So a backend whose native events signal once and
 * are reset only by the host (Level Zero's) may back each record by an object of its own (from
 * a pool): the event holds its last record's object, a queued wait holds the one it saw, and an
 * object is reused only once it has signalled and nothing queued names it. The core relies on
 * nothing more: not on records completing in the order they were made (each completes with
 * the work before it on its own stream), not on a record ordering any work but the waits and
 * syncs that see it; and it destroys an event only once nothing queued records or waits on it.
 *
 * Collectives say whether they are synchronous (SL_COLL_SYNC: every op is complete on return
 * and its stream argument is ignored; the caller makes device buffers ready before calling) or
 * stream-ordered (ops enqueue on the stream they are given, as above).
 *
 * Native handles. A backend names the API its streams and device memory belong to
 * (sl_backend_ops.native_api: "cuda", "hip", "level_zero", "sim") and hands out the native
 * stream of each of its streams (SL_EXT_NATIVE_STREAM), so that a device collective can
 * enqueue its own work (NCCL's kernels) in the backend's stream order. A collective names the
 * native API whose device memory it moves (sl_collective_ops.device_backend), and the core
 * pairs it with any backend of that API, whatever the backend's name. */
#ifndef SHARDLOAD_MODULE_H
#define SHARDLOAD_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include "shardload/shardload.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SL_BACKEND_ABI_VERSION 2u
#define SL_COLLECTIVE_ABI_VERSION 2u

/* True when the module's table is long enough to hold member M and M is set (non-NULL, or for
 * a number, non-zero: 0 is every numeric member's "not given"). */
#define SL_HAS_OP(ops, M) \
  ((ops)->size >= offsetof(__typeof__(*(ops)), M) + sizeof((ops)->M) && (ops)->M)

/* What the core lends a module: a logger and an error sink (the context's message buffer).
 * Complete on return. log: callable from any thread. fail: only on a thread inside a call the
 * core made to the module (see Threads above). */
typedef struct sl_module_host {
  uint32_t size; /* sizeof(sl_module_host) as the core was built */
  void *core;
  void (*log)(void *core, sl_log_level level, const char *fmt, ...)
      __attribute__((format(printf, 3, 4)));
  /* Records the specific message and returns s, so modules write `return host->fail(...)`. */
  sl_status (*fail)(void *core, sl_status s, const char *fmt, ...)
      __attribute__((format(printf, 3, 4)));
} sl_module_host;

/* Memory domains: where a buffer lives, and which ones a collective can move. */
typedef enum sl_mem_domain {
  SL_MEM_HOST = 1u << 0,   /* pageable host memory */
  SL_MEM_PINNED = 1u << 1, /* page-locked host memory (alloc_pinned or register_host) */
  SL_MEM_DEVICE = 1u << 2  /* the backend's device memory */
} sl_mem_domain;

typedef enum sl_copy_kind { SL_COPY_H2D = 1, SL_COPY_D2H = 2, SL_COPY_D2D = 3 } sl_copy_kind;

/* ---- backends --------------------------------------------------------------------------- */
enum {
  SL_BACKEND_DEVICE_IS_HOST = 1u << 0, /* "device" memory is plain host memory (cpu backend) */
  SL_BACKEND_HAS_PINNED = 1u << 1      /* alloc_pinned gives page-locked host memory */
};

typedef struct sl_backend_init {
  uint32_t size; /* sizeof(sl_backend_init) as the core was built */
  const sl_module_host *host;
  int local_rank;       /* with device < 0 picks the device: local_rank % device count */
  int local_world_size; /* ranks of this job on this node (1 when unknown) */
  int device;           /* explicit device ordinal, or -1 */
  const char *variant;  /* text after ':' in the backend name ("strict" in "sim:strict"), or NULL */
  /* The table the core calls init through (what the entry symbol returned, or the core's
   * adapter of an older table); a module that exports one table may ignore it. */
  const struct sl_backend_ops *ops;
  /* The job's timeout (sl_context_options.timeout_ms): a backend bounds its own waits by it
   * (a sync that outlasts the data collective's watchdog would hide the collective's error). */
  int timeout_ms;
} sl_backend_init;

typedef struct sl_backend_ops {
  uint32_t abi_version; /* SL_BACKEND_ABI_VERSION */
  uint32_t size;        /* sizeof(sl_backend_ops) as the module was built */
  const char *name;
  uint32_t flags;
  /* The data collective this backend's device memory wants ("nccl", "rccl"); NULL or "gloo":
   * host staging. Ranks use it only when every rank can (docs/DESIGN.md#modules). */
  const char *preferred_collective;
  /* Complete on return; cheap: creates no context and allocates no device memory. > 0: usable
   * on this machine (higher wins for backend "auto"); 0: not usable, and REASON says why in
   * one line naming the module ("cuda: no device"). */
  int (*probe)(char *reason, size_t len);
  sl_status (*init)(const sl_backend_init *init, void **be); /* complete on return */
  /* Complete on return; the core has synchronised first. Bounded even behind a kernel that
   * never ends (what would wait for it is left behind, with a warning). Callable from any
   * thread, once every other call on BE has returned. */
  void (*fini)(void *be);
  /* Complete on return. One line naming the device ("cuda:0 NVIDIA H200, 141 GiB, sm_90"). */
  void (*describe)(void *be, char *buf, size_t len);
  /* Device ordinal in use (DLPack's device_id). Complete on return. */
  int (*device_ordinal)(void *be);
  /* Allocation: complete on return. free_*: the caller guarantees no pending work uses PTR.
   * free_device and free_pinned are callable from any thread (whichever frees a state) and
   * never wait for the module's own queued work: a free that would synchronise the device
   * (cudaFreeHost) while the module's streams are busy is deferred to a point where they are
   * idle (at the latest fini, which leaves it to the process's exit, with a warning, behind a
   * kernel that never ends). Such a free may still wait for other users' work on the device
   * (cudaFreeHost synchronises the whole device): callers that cannot wait free pinned memory
   * on their own thread. */
  sl_status (*alloc_device)(void *be, size_t bytes, void **ptr);
  void (*free_device)(void *be, void *ptr);
  sl_status (*alloc_pinned)(void *be, size_t bytes, void **ptr);
  void (*free_pinned)(void *be, void *ptr);
  /* Streams and events (the event rule is at the head of this file). Create/destroy: complete
   * on return. Destroying a stream first finishes its queued work; destroying an event that
   * queued work still records or waits on is a bug. event_create and event_destroy: callable
   * from any thread. */
  sl_status (*stream_create)(void *be, void **stream);
  void (*stream_destroy)(void *be, void *stream);
  sl_status (*event_create)(void *be, void **event);
  void (*event_destroy)(void *be, void *event);
  /* Enqueued: EVENT completes once every op queued on STREAM before it has completed; this
   * record becomes the one later waits, queries and syncs of EVENT see. */
  sl_status (*event_record)(void *be, void *event, void *stream);
  /* Enqueued: ops queued on STREAM after this call start only after EVENT's last record
   * completed (a never-recorded event: no wait). */
  sl_status (*stream_wait_event)(void *be, void *stream, void *event);
  /* Complete on return: 1 when EVENT's last record has completed (or it was never recorded), 0
   * when not yet, < 0 when the work before it failed. Never blocks. Callable from any thread. */
  int (*event_query)(void *be, void *event);
  /* Complete on return: blocks until EVENT's last record completed; returns sticky errors.
   * Callable from any thread. */
  sl_status (*event_sync)(void *be, void *event);
  /* Complete on return: blocks until everything queued on STREAM completed. */
  sl_status (*stream_sync)(void *be, void *stream);
  /* Complete on return: blocks until everything queued on every stream completed. Callable
   * from any thread (a stream another thread creates or destroys meanwhile may or may not be
   * covered, but is never used after its destruction). */
  sl_status (*synchronize)(void *be);
  /* Enqueued: copies BYTES from SRC to DST; KIND names the domains (host sides may be pinned or
   * pageable; a backend may stage pageable memory, but must still honour the contract). */
  sl_status (*copy_async)(void *be, void *dst, const void *src, size_t bytes, sl_copy_kind kind,
                          void *stream);
  /* ---- optional: the core falls back to host work when absent ---- */
  /* Enqueued: casts COUNT elements in device memory (no overlap), bit-exact with sl_convert.
   * SL_ERR_UNSUPPORTED (not sticky, nothing queued): this device does not cast SRC_DT to DST_DT
   * (a Level Zero GPU without fp64: the F64 pairs); the core casts that pair on the host. COUNT
   * 0 queues nothing and asks just that (DST and SRC may be NULL): SL_OK when the pair is cast
   * on the device; the core asks once per pair before it casts. */
  sl_status (*cast_async)(void *be, void *dst, sl_dtype dst_dt, const void *src, sl_dtype src_dt,
                          size_t count, void *stream);
  /* Enqueued: HEIGHT rows of WIDTH bytes, row r from SRC + r*SPITCH to DST + r*DPITCH (pack and
   * unpack of strided regions). */
  sl_status (*copy_2d_async)(void *be, void *dst, size_t dpitch, const void *src, size_t spitch,
                             size_t width, size_t height, sl_copy_kind kind, void *stream);
  /* Complete on return: page-locks a caller's host range (BYTES > 0) so copies treat it as
   * pinned; unregister before the caller frees it. SL_ERR_UNSUPPORTED (not sticky, with fail's
   * reason) where the runtime cannot pin that range (Level Zero without host-pointer import):
   * the range stays pageable, is not to be unregistered, and the core reports it not pinned.
   * unregister_host: callable from any thread. */
  sl_status (*register_host)(void *be, void *ptr, size_t bytes);
  void (*unregister_host)(void *be, void *ptr);
  /* Complete on return: whether [ptr, ptr+bytes) is device memory of this backend. */
  int (*is_device_ptr)(void *be, const void *ptr, size_t bytes);
  /* Complete on return: an extension function by name, or NULL (see SL_EXT_* below). Test
   * instruments live here, not in the production table. Callable from any thread. */
  void *(*get_proc)(const char *name);
  /* Complete on return; cheap (no allocation, no device work). Writes into BUF (NUL-terminated,
   * at most LEN bytes, printable ASCII) what names the device in use among the devices of this
   * machine, the same in every process that uses it whatever its ordinal there (CUDA: the PCI
   * bus id, "0000:3b:00.0"); "" when it cannot tell. The core adds the machine and compares the
   * ranks' identities, so that a device collective is not run by two ranks on one device
   * (docs/DESIGN.md#modules). Absent, or "": the core assumes the backend name and ordinal
   * name the device. Not called for a backend whose device memory is host memory. */
  void (*device_identity)(void *be, char *buf, size_t len);

  /* ---- optional: memory lent to a consumer's streams (DLPack; shardload.h at sl_state_export).
   * Appended as one block; a module offers both or neither. Without them the core frees exported
   * device memory only after event_sync of what it recorded and a synchronize, on the freeing
   * thread: that covers the module's own streams, not another API's, so a module whose device
   * memory other APIs' streams can read (any real accelerator) should offer both. ---- */
  /* Enqueued: as event_record, but on NATIVE, a stream of the API the module wraps rather than
   * one of stream_create (cuda: a cudaStream_t of the module's device, cudaStreamLegacy (1) and
   * cudaStreamPerThread (2) included, NULL the runtime's default stream; sim: its own streams).
   * The caller keeps NATIVE live during the call and the module keeps nothing of it. Callable from
   * any thread, and the consumer may have queued its work on another thread than this call's: a
   * per-thread stream must be recorded so that the record covers the consumer's thread's work
   * (cuda records cudaStreamPerThread's on the legacy stream, which waits for every thread's). A
   * failure is the caller's (a stream of another device), not sticky. */
  sl_status (*event_record_native)(void *be, void *event, void *native);
  /* Enqueued: frees the N device buffers PTRS (from alloc_device) once the last record, as of
   * this call, of each of the NEVENTS EVENTS has completed. Never waits for that work: it returns
   * once the frees are queued, and no allocation gets the memory before they ran. On SL_OK it
   * takes the events (the module destroys them once nothing waits on them; the caller never
   * touches them again); on failure nothing was freed and the caller keeps buffers and events.
   * Callable from any thread. synchronize need not wait for these frees (they wait for work the
   * module does not own), and fini may run while they are pending: the module settles them. */
  sl_status (*free_device_after)(void *be, void *const *ptrs, size_t n, void *const *events, size_t nevents);

  /* ---- optional: the native API (see Native handles at the head of this file). ---- */
  /* The API whose handles this backend's streams and device memory are: "cuda", "hip",
   * "level_zero", "sim" (a name of the module-name form). A collective whose device_backend is
   * the same string moves this backend's device memory, and the core pairs the two by it. NULL
   * for a backend whose device memory is host memory (cpu): it has no API of its own, and its
   * name stands in for one, as it does for a table built before this member (an older v2
   * module, or an ABI v1 module's adapted table): sl_backend_native_api() says which. A
   * backend with an API offers SL_EXT_NATIVE_STREAM. */
  const char *native_api;

  /* ---- optional: DLPack's device type of this backend's memory (DLDeviceType: kDLCUDA 2,
   * kDLCUDAHost 3, kDLROCM 10, kDLROCMHost 11, kDLExtDev 12, kDLOneAPI 14), what sl_tensor's
   * device_type says and what a consumer reading a DLPack capsule matches against its own
   * devices. 0: not given. ---- */
  /* Of alloc_device's memory. Not given: kDLExtDev (12), which no consumer takes for its own
   * device's memory. Not read for a backend whose device memory is host memory (kDLCPU). */
  int32_t dlpack_device_type;
  /* Of alloc_pinned's memory and of ranges register_host page-locked. Not given: kDLCPU (1),
   * plain host memory. */
  int32_t dlpack_pinned_type;

  /* ---- optional: host work in stream order (as cudaLaunchHostFunc, hipLaunchHostFunc). ---- */
  /* Enqueued: FN(ARG, ERR, ERRLEN) runs once, on a host thread of the backend's, after the work
   * queued on STREAM before it and before the work queued after it (which waits while FN runs).
   * FN must not call the host, nor any op of this backend (CUDA forbids API calls in a host
   * function, and a sync would wait for itself) except an extension that says it may be called
   * from a host function (SL_EXT_HOST_ACCESS). A status other than SL_OK from FN is STREAM's
   * sticky error, with the message FN wrote into ERR (ERRLEN bytes, empty on entry; a failed
   * extension call from FN may have written its own there): the next sync reports it on the
   * caller's thread. Host functions of different streams may run one at a time on one thread
   * (CUDA's do): FN must not wait without bound for another. After a device failure the backend
   * may never run FN (CUDA drops the work of a broken context): what ARG holds must not need FN
   * to be freed for the caller's teardown to end. On failure to enqueue, FN never runs;
   * SL_ERR_UNSUPPORTED (not sticky) says the runtime underneath has no host functions (ROCm 5.2). */
  sl_status (*launch_host_fn)(void *be, void *stream, sl_status (*fn)(void *arg, char *err, size_t errlen),
                              void *arg);
} sl_backend_ops;

/* The native API a collective pairs with (see sl_backend_ops.native_api): the table's own, or
 * its name where it gives none. */
static inline const char *sl_backend_native_api(const sl_backend_ops *o) {
  return SL_HAS_OP(o, native_api) ? o->native_api : o->name;
}

/* Extensions a backend may offer through get_proc. */
#define SL_EXT_SGD_STEP "sl_ext_sgd_step" /* sl_ext_sgd_step_fn: complete on return */
typedef sl_status (*sl_ext_sgd_step_fn)(void *be, void *x, const void *g, sl_dtype dt, size_t count, float lr);
#define SL_EXT_TRAFFIC "sl_ext_traffic" /* sl_ext_traffic_fn: bytes copied each way since init */
typedef void (*sl_ext_traffic_fn)(void *be, uint64_t *h2d, uint64_t *d2h);
/* sl_ext_stream_abandon_fn: complete on return, never waits. STREAM (from stream_create) is given
 * up with its queued work (a communicator left behind at teardown): no later wait of the module
 * (synchronize, fini) waits for it, and the caller never uses or destroys it again. */
#define SL_EXT_STREAM_ABANDON "sl_ext_stream_abandon"
typedef void (*sl_ext_stream_abandon_fn)(void *be, void *stream);
/* sl_ext_max_alloc_fn: complete on return, cheap. The largest BYTES one alloc_device or
 * alloc_pinned call can give (Level Zero's maxMemAllocSize where the driver cannot relax it),
 * or 0 for no limit of its own (absent: 0). The core sizes its staging slots under the smallest
 * limit of any rank, and a single buffer past it fails with the module's message. */
#define SL_EXT_MAX_ALLOC "sl_ext_max_alloc"
typedef uint64_t (*sl_ext_max_alloc_fn)(void *be);
/* sl_ext_native_stream_fn: the native handle of STREAM (one of stream_create's, or NULL for the
 * backend's default stream) in the backend's native API (native_api): a cudaStream_t for cuda,
 * a hipStream_t for hip, the stream itself for sim. Complete on return, cheap, callable from any
 * thread. Work the caller enqueues on it through the native API (an NCCL kernel) is ordered
 * with the backend's ops on STREAM as theirs are with each other; the handle lives as long as
 * STREAM and is the caller's to use, never to destroy. */
#define SL_EXT_NATIVE_STREAM "sl_ext_native_stream"
typedef void *(*sl_ext_native_stream_fn)(void *be, void *stream);
/* sl_ext_host_access_fn: opens (OPEN 1) or closes (0) device memory [PTR, PTR+BYTES) for host
 * access, for a backend whose device memory the host can address once opened (sim, whose
 * strict mode maps it inaccessible otherwise). Complete on return; callable from a host
 * function (launch_host_fn), where a failure writes its message into the function's ERR. The
 * range must lie inside one device buffer; opens and closes pair up. */
#define SL_EXT_HOST_ACCESS "sl_ext_host_access"
typedef sl_status (*sl_ext_host_access_fn)(void *be, const void *ptr, size_t bytes, int open);

/* sl_ext_device_count_fn: how many devices init's DEVICE can name on this machine (ordinals
 * 0..n-1 as init counts them: Level Zero's GPU devices of every driver, CUDA's visible ones), 0
 * when none or the runtime cannot tell. Complete on return; cheap as probe is (no context, no
 * allocation on a device); callable from any thread, before any init. The listing
 * (sl_module_list, `shardload backends`) starts and describes each device in turn. Absent: one
 * device (the one init picks for local rank 0), what a backend without a fixed count of its own
 * (sim, which simulates whatever ordinal it is given) leaves it at. */
#define SL_EXT_DEVICE_COUNT "sl_ext_device_count"
typedef int (*sl_ext_device_count_fn)(void);

/* ---- collectives ------------------------------------------------------------------------ */
/* The control plane as a module sees it: host memory, synchronous, bounded by the timeout.
 * A data collective bootstraps through it (an NCCL unique id from rank 0 to every rank). */
typedef struct sl_control_plane {
  uint32_t size;
  void *ctx;
  sl_status (*broadcast)(void *ctx, void *buf, size_t bytes, int root);
  sl_status (*allgather)(void *ctx, const void *sendbuf, void *recvbuf, size_t bytes);
} sl_control_plane;

typedef struct sl_collective_init {
  uint32_t size; /* sizeof(sl_collective_init) as the core was built */
  const sl_module_host *host;
  int rank;
  int world_size;
  const char *rendezvous; /* "file://DIR", "tcp://HOST:PORT" or "c10d://HOST:PORT"; NULL for world size 1 */
  const char *prefix;     /* store key prefix, unique per job */
  int timeout_ms;
  /* LOBBY: a key prefix shared by every job with the same launcher job id and world size, where
   * each rank leaves JOB_KEY (the caller's sl_context_options.job_key, "" when none) so that a
   * rank waiting for peers that joined under another job key can say so at once instead of
   * timing out (docs/DESIGN.md#rendezvous). */
  const char *lobby;
  const char *job_key;
  /* Data collectives: the rank's backend (its streams, events and memory), the device it uses,
   * and the control plane to bootstrap through (NULL for the control plane itself). */
  const sl_backend_ops *backend;
  void *backend_handle;
  int device;
  int local_rank;
  int local_world_size;
  const sl_control_plane *control;
  /* The table the core calls init through (see sl_backend_init.ops). */
  const struct sl_collective_ops *ops;
} sl_collective_init;

enum {
  SL_COLL_SYNC = 1u << 0 /* every op is complete on return; stream arguments are ignored */
};

/* One scatterv of a group (sl_collective_ops.scatterv_group). SIZE: sizeof(sl_scatter_item) as
 * the caller built it, the same in every item: the items lie SIZE bytes apart, and a module
 * reads of each what both know (sl_scatter_items_read in module_util.h). */
typedef struct sl_scatter_item {
  size_t size;
  const void *sendbuf;
  const size_t *counts, *displs;
  void *recvbuf;
  size_t recvbytes;
  int root;
} sl_scatter_item;
#define SL_SCATTER_GROUP_MAX 8

typedef struct sl_collective_ops {
  uint32_t abi_version; /* SL_COLLECTIVE_ABI_VERSION */
  uint32_t size;
  const char *name;
  uint32_t flags;
  uint32_t domains; /* sl_mem_domain bits its buffers may live in (Gloo: host|pinned; NCCL: device) */
  /* The native API whose device memory it moves ("cuda" for NCCL, "hip" for RCCL, "sim" for
   * simccl: sl_backend_ops.native_api), or NULL for host memory only. The core pairs it with
   * any backend of that API (sl_backend_native_api), never by the backend's name; an ABI v1
   * table's backend name reads the same way, since a backend without native_api pairs by its
   * name. It reaches that backend's streams and memory through the backend's table and
   * extensions (SL_EXT_NATIVE_STREAM), not through what a handle is assumed to be. */
  const char *device_backend;
  /* Complete on return; cheap (no communicator, no allocation): > 0 when this rank can run it
   * with its backend, else 0 and REASON says why. BACKEND is what the backend pairs by: its
   * native API, or its name where it has none (sl_backend_native_api: "cuda", "sim", "cpu").
   * The core also refuses a pair whose device memory does not match, whatever the probe says. */
  int (*probe)(const char *backend, char *reason, size_t len);
  sl_status (*init)(const sl_collective_init *init, void **comm); /* collective, complete on return */
  /* Complete on return, and bounded by the timeout (a small multiple of it), even when a
   * kernel never ends: a communicator it cannot end in time is left behind, with a warning.
   * NOT collective: each rank calls it on its own, when it is done with COMM — after the same
   * last op as its peers when all went well, but a rank that failed calls it while its peers
   * may still be in an op, and a rank that died never does — so it never waits for a peer's
   * fini. It waits (bounded) for this rank's own: the ops it issued on COMM (the core has
   * synchronised their streams first; work still queued is settled or, past the bound, left
   * behind) and what it serves the job (Gloo's rank 0 keeps the rendezvous store up until the
   * peers left it, or the timeout passed). A peer's op that needed this rank fails within the
   * timeout (SL_ERR_PEER, SL_ERR_TIMEOUT), never hangs. Sub-communicators are finalised before
   * their parent; no op, abort included, runs during or after fini. fini of NULL does nothing. */
  void (*fini)(void *comm);
  /* Optional. Callable from any thread (a signal handler's thread included, as far as the
   * transport allows): pending and later ops on COMM fail (SL_ERR_COMM) within the timeout. */
  void (*abort)(void *comm);
  /* Optional. Collective over COMM, complete on return: ranks with the same COLOR (>= 0) form a
   * sub-communicator ordered by KEY; COLOR < 0 takes part without joining one (*SUB = NULL).
   * Sub-communicators are freed with fini before their parent. */
  sl_status (*split)(void *comm, int color, int key, void **sub);
  /* Data ops (SL_COLL_SYNC or enqueued on STREAM, see the flags). All fail with
   * SL_ERR_TIMEOUT/SL_ERR_PEER past the timeout and name the rank they lost. */
  sl_status (*broadcast)(void *comm, void *buf, size_t bytes, int root, void *stream);
  /* Root sends counts[r] bytes at sendbuf + displs[r] to rank r; every rank receives
   * recvbytes (== counts[rank]) into recvbuf. sendbuf/counts/displs are read on root only
   * (stream-ordered modules copy counts and displs before returning). */
  sl_status (*scatterv)(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs,
                        void *recvbuf, size_t recvbytes, int root, void *stream);
  /* Every rank contributes BYTES; recvbuf holds world_size * BYTES in rank order. */
  sl_status (*allgather)(void *comm, const void *sendbuf, void *recvbuf, size_t bytes, void *stream);
  sl_status (*barrier)(void *comm); /* complete on return */
  /* Optional (a table of this size or more, SL_HAS_OP), neither collective nor blocking, on the
   * thread that runs the ops, between them. lost: the job's ranks that the failures of COMM's
   * ops were blamed on, up to CAP of them into RANKS; returns how many (0: none known).
   * note_lost: the job's ranks another plane lost (N of them): fini waits for none of them, as
   * for its own (Gloo's rank 0 keeps its store up for the others only). The core passes what
   * the data plane lost to the control plane when a load's data phase fails, so that the
   * control plane's fini does not wait a timeout more for ranks behind a dead link. */
  int (*lost)(void *comm, int *ranks, int cap);
  void (*note_lost)(void *comm, const int *ranks, int n);
  /* Optional (SL_HAS_OP): N scatterv's from N distinct roots as one op, their bytes moving at
   * once (each root's sends beside the others', not after them), so that distributed readers
   * on N hosts load N links at a time (docs/DESIGN.md#readers). Item i is scatterv's arguments
   * (same rules; sendbuf, counts and displs read on items[i].root only); every rank passes the
   * same N (at most SL_SCATTER_GROUP_MAX) and the same roots in the same order. As if the items
   * ran one after another in that order, except that none waits for another's bytes; a failure
   * of any item fails the op (its message names the rank lost). Items whose size is too small
   * for the members above fail with SL_ERR_ABI. Absent: the core moves one transfer at a time. */
  sl_status (*scatterv_group)(void *comm, const struct sl_scatter_item *items, int n, void *stream);
} sl_collective_ops;

/* Entry symbols of loadable modules (libshardload-<name>.so). The core looks for the newest
 * version it knows first. */
typedef const sl_backend_ops *(*sl_backend_entry_fn)(void);
typedef const sl_collective_ops *(*sl_collective_entry_fn)(void);
#define SL_BACKEND_ENTRY "sl_backend_module_v2"
#define SL_COLLECTIVE_ENTRY "sl_collective_module_v2"
#define SL_BACKEND_ENTRY_V1 "sl_backend_module"
#define SL_COLLECTIVE_ENTRY_V1 "sl_collective_module"

#ifdef __cplusplus
}
#endif
#endif
