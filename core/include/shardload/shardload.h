/* shardload — load a full safetensors checkpoint into sharded, placed, per-rank tensors.
 *
 * Public C API. Everything exported is prefixed sl_; handles are opaque; every
 * create has a destroy that accepts NULL; functions return sl_status and leave
 * the specific message in the context (sl_context_errmsg). */
#ifndef SHARDLOAD_H
#define SHARDLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "shardload/status.h"
#include "shardload/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define SL_API __declspec(dllexport)
#else
#define SL_API __attribute__((visibility("default")))
#endif

#define SL_MAX_DIMS 8      /* tensor rank limit (safetensors has none; 8 covers every model) */
#define SL_MAX_MESH_DIMS 4 /* device-mesh rank limit */
/* The most ranks one job may have: what the rendezvous serves (every rank's Gloo mesh holds a
 * connection to each other rank, and rank 0's store up to 192 W^2 bytes of their addresses:
 * docs/DESIGN.md#rendezvous). A larger world, from the launcher or the options, is refused. */
#define SL_MAX_WORLD_SIZE 4096

/* ---- version ------------------------------------------------------------ */
SL_API unsigned sl_version(void);              /* SL_VERSION at run time */
SL_API const char *sl_version_string(void);    /* "MAJOR.MINOR.PATCH" */

/* ---- dtypes ------------------------------------------------------------- */
/* Never renumbered: values may be stored in plan files and manifests. */
typedef enum sl_dtype {
  SL_DTYPE_INVALID = 0,
  SL_DTYPE_F64 = 1,
  SL_DTYPE_F32 = 2,
  SL_DTYPE_F16 = 3,
  SL_DTYPE_BF16 = 4,
  SL_DTYPE_F8_E4M3 = 5,
  SL_DTYPE_F8_E5M2 = 6,
  SL_DTYPE_I64 = 7,
  SL_DTYPE_I32 = 8,
  SL_DTYPE_I16 = 9,
  SL_DTYPE_I8 = 10,
  SL_DTYPE_U8 = 11,
  SL_DTYPE_BOOL = 12,
  SL_DTYPE_U16 = 13,
  SL_DTYPE_U32 = 14,
  SL_DTYPE_U64 = 15,
  SL_DTYPE_COUNT_
} sl_dtype;

SL_API const char *sl_dtype_name(sl_dtype dt);  /* safetensors spelling: "BF16" */
/* Accepts safetensors names, lower case and torch spellings ("bfloat16", "torch.float32"). */
SL_API sl_dtype sl_dtype_from_name(const char *name);
SL_API size_t sl_dtype_size(sl_dtype dt);      /* bytes per element; 0 for INVALID */
SL_API int sl_dtype_is_floating(sl_dtype dt);  /* F64/F32/F16/BF16/F8: true */
SL_API int sl_dtype_is_castable(sl_dtype dt);  /* F64/F32/F16/BF16 only */
/* Host conversion between castable dtypes, round-to-nearest-even, NaN kept NaN:
 * the same bits as torch.Tensor.to. Same dtype is a copy. */
SL_API sl_status sl_convert(void *dst, sl_dtype dst_dt, const void *src, sl_dtype src_dt,
                            size_t count);

/* ---- placement contract -------------------------------------------------- */
typedef enum sl_cpu_offload {
  SL_CPU_OFFLOAD_INFER = 0, /* zero value: follow the offload policy */
  SL_CPU_OFFLOAD_ON = 1,
  SL_CPU_OFFLOAD_OFF = 2
} sl_cpu_offload;

typedef enum sl_offload_kind {
  SL_OFFLOAD_NONE = 0, /* no policy: parameters live on the accelerator */
  SL_OFFLOAD_CPU = 1   /* FSDP2 CPUOffloadPolicy */
} sl_offload_kind;

typedef struct sl_offload_policy {
  sl_offload_kind kind;
  int pin_memory; /* CPUOffloadPolicy(pin_memory=True) */
} sl_offload_policy;

typedef enum sl_device_kind {
  SL_DEVICE_CPU = 1,        /* host memory */
  SL_DEVICE_ACCELERATOR = 2 /* the rank's accelerator; host memory on the cpu backend */
} sl_device_kind;

typedef enum sl_placement_rule {
  SL_RULE_EXPLICIT_ON = 1,      /* cpu_offload ON -> CPU */
  SL_RULE_EXPLICIT_OFF = 2,     /* cpu_offload OFF -> accelerator */
  SL_RULE_INFER_POLICY_CPU = 3, /* INFER under a CPU offload policy -> CPU */
  SL_RULE_INFER_NO_POLICY = 4   /* INFER without policy -> accelerator */
} sl_placement_rule;

typedef struct sl_placement_decision {
  sl_device_kind device;
  sl_placement_rule rule;
  int pin_memory; /* CPU placement under a pinned CPU policy wants page-locked memory */
} sl_placement_decision;

/* The contract of docs/DESIGN.md#placement as a pure function; policy NULL means no policy. */
SL_API sl_status sl_resolve_placement(sl_cpu_offload cpu_offload, const sl_offload_policy *policy,
                                      sl_placement_decision *out);
SL_API const char *sl_placement_rule_describe(sl_placement_rule rule); /* "cpu_offload=on" ... */
SL_API const char *sl_device_kind_name(sl_device_kind kind);            /* "cpu" / "device" */

/* ---- versioned options structs --------------------------------------------
 * sl_context_options and sl_load_options begin with `size`, which the caller sets to sizeof()
 * as it compiled them. The library reads only the fields within that size and takes the zero
 * value for the rest, so a caller built against an older, shorter struct keeps working. New
 * fields are only ever appended, in whole 8-byte units, so the sizeof() of every published
 * version is distinct. */

/* ---- context ------------------------------------------------------------- */
typedef struct sl_context sl_context;

typedef enum sl_log_level { SL_LOG_ERROR = 0, SL_LOG_WARN = 1, SL_LOG_INFO = 2, SL_LOG_DEBUG = 3 } sl_log_level;
typedef void (*sl_log_fn)(void *user, sl_log_level level, const char *msg);

typedef struct sl_context_options {
  size_t size;             /* sizeof(sl_context_options) as the caller compiled it */
  const char *backend;     /* "cpu", "sim", "sim:strict", "cuda", any NAME of a module libshardload-NAME.so, or NULL/"auto": the best probe */
  /* The data plane. NULL/"auto": the backend's device collective (nccl for cuda, simccl for
   * sim) when every rank can run it, each on a device of its own, else host staging: "shm"
   * (shared memory) where every rank shares one host, "hier" (shm within each host, Gloo
   * between the hosts) where they span hosts and some host has several, else "gloo"; one rank
   * stages through host memory ("local"). "shm" forced on ranks of several hosts fails on
   * every rank naming the ranks on other hosts. Ranks agree on it at creation over the
   * control plane, and sl_context_collective_reason says why. A name forces it: creation fails
   * on every rank, naming a rank that cannot run it and why, or two ranks that share a device
   * (SL_ERR_UNSUPPORTED). */
  const char *collective;
  int world_size;          /* 0 (the zero value): rank, world size, local rank and rendezvous
                              come from the launcher environment (torchrun, Slurm, Open MPI;
                              none: rank 0 of 1). > 0 (at most SL_MAX_WORLD_SIZE): the three
                              fields below are used. */
  int rank;
  int local_rank;          /* selects the device: local_rank % device count */
  const char *rendezvous;  /* "file://DIR" or "tcp://HOST:PORT"; NULL: from the environment */
  int timeout_ms;          /* collective / rendezvous timeout; 0: 300000 */
  /* NULL: silent. Called from the library's threads too, and from whichever thread releases an
   * export or frees a state of this context (sl_state_export: a garbage collector's), until
   * sl_context_destroy returns (it waits for a call in flight); never after. Calls may be
   * concurrent; it must not call into the library. */
  sl_log_fn log;
  void *log_user;
  sl_log_level log_level;
  /* When creation fails there is no context to ask: the specific message goes here
   * (truncated to ERRBUF_SIZE, NUL-terminated) as well as to the logger. */
  char *errbuf;
  size_t errbuf_size;
  /* Names the job among others that may share a rendezvous (a file:// directory on a shared
   * filesystem, a long-lived store): every rank of one job passes the same string and
   * unrelated jobs pass different ones, e.g. the checkpoint path with the plan and load
   * options (the shardload command does so). Hashed into the rendezvous key prefix, beside
   * the launcher's job id (SHARDLOAD_JOB_ID, TORCHELASTIC_RUN_ID with its restart count,
   * SLURM_JOB_ID, OMPI_MCA_ess_base_jobid) and the world size, so ranks of different jobs
   * never see each other's keys; a rank that waits for a peer under another key names the
   * first differing ';'-separated field of the two keys. NULL (or ""): the launcher's job id
   * and the world size alone; jobs that share those and a rendezvous then meet, and
   * sl_source_open refuses the ranks whose checkpoint differs from rank 0's (a rank may then
   * be given another path to the same checkpoint, see sl_source_open). */
  const char *job_key;
  /* An explicit device ordinal on the rank's node (the zero value 0 is ordinal 0 only with
   * device_set = 1); otherwise local_rank % device count. */
  int device;
  int device_set;
} sl_context_options;

SL_API sl_status sl_context_create(const sl_context_options *opts, sl_context **out);
SL_API void sl_context_destroy(sl_context *ctx);
/* The specific message of the last failure on this context ("" when none). */
SL_API const char *sl_context_errmsg(const sl_context *ctx);
SL_API int sl_context_rank(const sl_context *ctx);
SL_API int sl_context_world_size(const sl_context *ctx);
SL_API const char *sl_context_backend_name(const sl_context *ctx);
/* Why this backend: "cpu: auto, cuda: no CUDA driver (libcuda.so.1 not found: ...)" when
 * "auto" chose it (each loadable backend it beat, with the reason its probe gave), or
 * "NAME: asked for". */
SL_API const char *sl_context_backend_reason(const sl_context *ctx);
/* The data collective (tensor bytes) the ranks agreed on, and why ("simccl: preferred by backend
 * sim and every rank runs it", "gloo: rank 1 cannot run simccl (simccl: moves sim device memory
 * only; this rank's backend is cpu)", "gloo: backend cpu of rank 0 stages through host memory",
 * "nccl: forced (--collective, sl_context_options.collective)"). The control plane
 * (agreements, manifests, status) is always host memory (Gloo, or local for one rank). */
SL_API const char *sl_context_collective_name(const sl_context *ctx);
SL_API const char *sl_context_collective_reason(const sl_context *ctx);
/* For a caller's signal handler: makes pending and later collective operations of this
 * context fail within the timeout (ncclCommAbort-shaped), sl_context_agree included; the
 * context is then only good for sl_context_destroy. Async-signal-safe as far as the modules'
 * abort is (Gloo's sets a flag and shuts its sockets down). */
SL_API void sl_context_abort(sl_context *ctx);
/* A one-line description of the rank's device ("sim:0 (simulated accelerator)"). */
SL_API const char *sl_context_device_description(const sl_context *ctx);

/* Memory through the rank's backend, for callers that bring their own buffers and
 * for reading placed tensors back. ACCELERATOR memory is only touched through these. */
SL_API sl_status sl_alloc(sl_context *ctx, sl_device_kind where, int pinned, size_t bytes, void **out);
SL_API void sl_free(sl_context *ctx, sl_device_kind where, int pinned, void *ptr);
SL_API sl_status sl_copy_to_host(sl_context *ctx, void *dst, const void *src, sl_device_kind src_where,
                                 size_t bytes);
SL_API sl_status sl_copy_from_host(sl_context *ctx, void *dst, sl_device_kind dst_where, const void *src,
                                   size_t bytes);

/* ---- modules: what this machine can run ---------------------------------- */
/* Every backend and collective module this process could use (docs/DESIGN.md#modules, and
 * what `shardload backends` prints): the built-in ones; the loadable ones the core knows by
 * name (cuda, hip, level_zero; nccl, rccl), installed or not; and every other
 * libshardload-NAME.so in the search directories ($SHARDLOAD_MODULE_PATH's entries, then the
 * library's directory), at most SL_MODULE_LIST_MAX of them in name order (the others are
 * counted). For each: built in or the file it was loaded from, its ABI version, whether it can
 * run here and why not, and for a backend that runs, its devices; and what backend
 * and collective "auto" would choose here.
 *
 * It opens every module it lists (a file is listed as a backend or a collective by the entry
 * symbols it defines), probes it, starts a backend that can run on each of its devices in
 * turn (init with device 0, 1, ... where the module says how many it has, else once with device
 * -1, the device local rank 0 would get), describes it and stops it; nothing is left open. Not
 * collective: it looks at this process's machine only. CTX may be NULL (silent); a context
 * lends its logger (backend auto's verdicts come at INFO) and takes the message of a failure,
 * and nothing else of it is touched. Fails only for a bad argument or want of memory: what is
 * missing on the machine is in the list, not an error. */
typedef struct sl_module_list sl_module_list;

#define SL_MODULE_LIST_MAX 256 /* installed files listed beyond the names the core knows */

typedef enum sl_module_kind { SL_MODULE_BACKEND = 1, SL_MODULE_COLLECTIVE = 2 } sl_module_kind;

/* Never renumbered. */
typedef enum sl_module_state {
  SL_MODULE_RUNS = 1,       /* built in, or loaded and its probe (and a backend's init) said yes */
  SL_MODULE_CANNOT_RUN = 2, /* loaded, and its probe or a backend's init said no: REASON says why */
  SL_MODULE_ABSENT = 3,     /* a name the core knows, and no file for it anywhere it looked */
  SL_MODULE_UNLOADABLE = 4, /* a file that does not load (a vendor runtime it links is missing) */
  SL_MODULE_BAD_ABI = 5     /* a file whose table the core refuses, or that is no module */
} sl_module_state;
/* "runs", "cannot_run", "absent", "unloadable", "bad_abi"; "unknown" for any other value. */
SL_API const char *sl_module_state_name(sl_module_state s);

typedef struct sl_module_info {
  size_t size; /* sizeof(sl_module_info) as the caller compiled it; the library writes within it */
  sl_module_kind kind;
  sl_module_state state;
  const char *name;
  int builtin;
  const char *path;     /* the file it was loaded from, as the loader names it; NULL: built in, absent */
  unsigned abi_version; /* of the entry symbol it came through (1 or 2); 0 when no table was read */
  int probe;            /* its probe's score: > 0 it can run here (backend auto keeps the best); 0 */
  /* Why it cannot run, was not loaded or is refused; for one that runs, what its probe said if
   * it said 0 (sim: auto never takes it); "" when nothing was said. Module text, escaped. */
  const char *reason;
  /* A backend that runs: describe() of the device it would use, with its memory where the module
   * gives it ("cuda:0 NVIDIA H200, 141 GiB, sm_90"); "" otherwise. Module text, escaped. */
  const char *device;
  /* A backend that runs: its device's memory in bytes where the core knows it (the host's memory,
   * for a backend whose device memory is host memory: cpu); 0 when unknown (DEVICE may say). */
  uint64_t memory_bytes;
  const char *pairs_with;  /* a backend's preferred collective, a collective's device_backend; or NULL */
  uint32_t domains;        /* a collective's memory domains (module.h's sl_mem_domain bits); 0 */
  const char *probed_with; /* a collective: the backend its probe was asked about; NULL for a backend */
  /* A backend that runs: describe() of each of its devices, ordinal 0 first (DEVICES[0] is
   * DEVICE), one started and stopped after the other, at most SL_MODULE_DEVICES_MAX; a device
   * that would not start reads "NAME:I: cannot start: why". A module that does not say how many
   * devices it has (module.h: SL_EXT_DEVICE_COUNT) has one. DEVICE_COUNT 0 and DEVICES NULL
   * otherwise, and for a caller whose SIZE ends before them. Module text, escaped. */
  size_t device_count;
  const char *const *devices;
  size_t devices_not_listed; /* devices past SL_MODULE_DEVICES_MAX the module said it has */
} sl_module_info;

#define SL_MODULE_DEVICES_MAX 64 /* devices of one backend the listing describes */

typedef struct sl_module_summary {
  size_t size; /* sizeof(sl_module_summary) as the caller compiled it; the library writes within it */
  /* Backend auto here, and why (as sl_context_backend_reason); NULL when no backend can run,
   * and the reason says why. */
  const char *auto_backend;
  const char *auto_backend_reason;
  /* The data collective auto takes for a job of several ranks here, each rank on a device of its
   * own (the auto backend's preferred collective where this machine runs it, else host staging),
   * and why; and for a job of one rank (host staging, local). */
  const char *auto_collective;
  const char *auto_collective_reason;
  const char *auto_collective_one_rank;
  const char *auto_collective_one_rank_reason;
  const char *const *dirs; /* the directories searched for module files, in order */
  size_t dir_count;
  size_t not_listed; /* installed module files past SL_MODULE_LIST_MAX */
} sl_module_summary;

SL_API sl_status sl_module_list_create(sl_context *ctx, sl_module_list **out);
SL_API void sl_module_list_destroy(sl_module_list *list); /* NULL is a no-op */
/* The modules: backends first (built in, the known names, the others in name order), then
 * collectives in the same order. The strings belong to the list. */
SL_API size_t sl_module_list_count(const sl_module_list *list);
SL_API sl_status sl_module_list_get(const sl_module_list *list, size_t i, sl_module_info *out);
SL_API sl_status sl_module_list_summary(const sl_module_list *list, sl_module_summary *out);

/* ---- source (checkpoint metadata) ---------------------------------------- */
typedef struct sl_source sl_source;

typedef struct sl_source_tensor {
  const char *name;
  sl_dtype dtype;
  int ndim;
  int64_t shape[SL_MAX_DIMS];
  uint64_t nbytes;
  const char *file;     /* path of the .safetensors file holding it */
  uint64_t file_offset; /* absolute offset of its first byte in that file */
} sl_source_tensor;

/* PATH: a .safetensors file, a model.safetensors.index.json, or a directory holding one of
 * them. Validates every header (phase 1). Tensors are listed in file order.
 * Collective over the context's ranks: rank 0 reads the headers, and so, at the same time, does
 * every rank that can read its own PATH, which reads its own copy from then on; rank 0 sends
 * its table to the ranks that cannot. The ranks agree
 * that they are one job: the same world size and the same checkpoint (rank 0's headers byte
 * for byte wherever a rank can read its PATH; a PATH other than rank 0's only where that rank
 * can read it and sampled tensor data match too). Otherwise every rank fails with
 * SL_ERR_MISMATCH naming the first differing rank and both paths (docs/DESIGN.md#identity). */
SL_API sl_status sl_source_open(sl_context *ctx, const char *path, sl_source **out);

/* One tensor of an in-memory source (rank 0's). */
typedef struct sl_memory_tensor {
  size_t size;        /* sizeof(sl_memory_tensor) as the caller compiled it */
  const char *name;   /* copied */
  sl_dtype dtype;
  int ndim;           /* 0..SL_MAX_DIMS */
  int64_t shape[SL_MAX_DIMS];
  const void *data;   /* host pointer to its C-contiguous bytes, valid until the source is
                         destroyed; NULL: bytes come from the read callback */
} sl_memory_tensor;

/* Fills DST with BYTES bytes of tensor INDEX (position in the array given at open) starting
 * at byte OFFSET of the tensor. Called on rank 0 only, possibly from a library thread (the
 * pipeline's reader), never concurrently with itself. Return SL_OK, or a failure with a
 * message in MSG (MSG_LEN bytes): the load then fails on every rank naming the tensor. */
typedef sl_status (*sl_source_read_fn)(void *user, size_t index, uint64_t offset, void *dst,
                                       size_t bytes, char *msg, size_t msg_len);

/* A source whose tensors are in rank 0's memory (a state dict), in the given order. Collective
 * like sl_source_open: rank 0 passes the table (and READ where some data is NULL); the other
 * ranks' TENSORS/COUNT/READ are ignored (pass NULL, 0, NULL) and they receive rank 0's table.
 * LABEL names the source in messages (e.g. "state dict"; NULL: "memory"). Loads from it read
 * on rank 0 only: SL_READ_EVERY_RANK fails with a message saying so. */
SL_API sl_status sl_source_open_memory(sl_context *ctx, const char *label,
                                       const sl_memory_tensor *tensors, size_t count,
                                       sl_source_read_fn read, void *read_user,
                                       sl_source **out);
SL_API void sl_source_destroy(sl_source *src);
SL_API size_t sl_source_tensor_count(const sl_source *src);
SL_API const sl_source_tensor *sl_source_tensor_at(const sl_source *src, size_t i);
SL_API const sl_source_tensor *sl_source_find(const sl_source *src, const char *name);
SL_API size_t sl_source_file_count(const sl_source *src);
SL_API const char *sl_source_file_at(const sl_source *src, size_t i);
SL_API uint64_t sl_source_total_bytes(const sl_source *src);
/* __metadata__ of the (first) file: key/value pairs, NULL past the end. */
SL_API size_t sl_source_metadata_count(const sl_source *src);
SL_API sl_status sl_source_metadata_at(const sl_source *src, size_t i, const char **key, const char **value);

/* ---- plan (how tensors are sharded, cast and offloaded) ------------------ */
typedef struct sl_plan sl_plan;

typedef enum sl_shard_kind { SL_REPLICATE = 0, SL_SHARD = 1 } sl_shard_kind;
typedef struct sl_mesh_placement {
  sl_shard_kind kind;
  int dim; /* tensor dim for SL_SHARD; may be negative (from the end) */
} sl_mesh_placement;

/* One placement per mesh dim, e.g. "shard(0)", "replicate", "[replicate, shard(0)]",
 * "R", "S(1)". A single placement on an N-D mesh applies to every mesh dim. */
SL_API sl_status sl_placement_parse(const char *spec, int mesh_ndim, sl_mesh_placement *out);

SL_API sl_status sl_plan_create(sl_context *ctx, sl_plan **out);
SL_API void sl_plan_destroy(sl_plan *plan);
/* Mesh shape; product must equal the world size at load. Default: 1-D [world]. */
SL_API sl_status sl_plan_set_mesh(sl_plan *plan, int ndim, const int *dims);
SL_API sl_status sl_plan_set_offload_policy(sl_plan *plan, const sl_offload_policy *policy);
SL_API sl_status sl_plan_set_param_dtype(sl_plan *plan, sl_dtype dt); /* INVALID: the file's */
SL_API sl_status sl_plan_set_default_placement(sl_plan *plan, const char *spec); /* NULL: FSDP2 */
/* Later rules win over earlier ones; exact entries win over rules. placement or dtype may be
 * NULL / SL_DTYPE_INVALID to leave that part alone. PATTERN is a shell glob over the whole name. */
SL_API sl_status sl_plan_add_rule(sl_plan *plan, const char *pattern, const char *placement,
                                  sl_dtype dtype);
/* An exact name the checkpoint must hold (strict plans): missing ones fail the load. */
SL_API sl_status sl_plan_add_entry(sl_plan *plan, const char *name, const char *placement,
                                   sl_dtype dtype);
/* Checkpoint tensors the plan does not name: skipped and reported (0) or an error (1).
 * Only meaningful once the plan has entries; a plan without entries takes every tensor. */
SL_API sl_status sl_plan_set_strict(sl_plan *plan, int strict);
/* Read a JSON plan file (format in README.md) into the plan. */
SL_API sl_status sl_plan_load_json(sl_plan *plan, const char *path);

/* ---- dry run: per-rank geometry ------------------------------------------ */
typedef struct sl_shard_geometry {
  size_t size; /* sizeof(sl_shard_geometry) as the caller compiled it; the library writes within it */
  int ndim;
  int64_t local_shape[SL_MAX_DIMS];
  int64_t global_offset[SL_MAX_DIMS];
  sl_dtype dtype; /* parameter dtype */
  int replicated; /* every mesh dim replicate */
  uint64_t nbytes;
  int skipped;    /* the plan names tensors and not this one: a load skips it */
} sl_shard_geometry;

/* The mesh a load of WORLD ranks would use (the plan's, or 1-D [WORLD]); returns its ndim
 * and fills DIMS (SL_MAX_MESH_DIMS entries). */
SL_API int sl_plan_mesh(const sl_plan *plan, int world, int *dims);
/* The plan checks of sl_load's phase 1 for a job of WORLD_SIZE ranks (the mesh, tensors the
 * plan names that SRC lacks, strictness, every taken tensor's placement and dtype), without
 * loading: a dry run fails exactly where a load would, with the same status and message. */
SL_API sl_status sl_plan_check(sl_plan *plan, const sl_source *src, int world_size);
/* Resolve the plan for tensor T as rank RANK of WORLD would see it. */
SL_API sl_status sl_plan_geometry(sl_plan *plan, const sl_source_tensor *t, int rank, int world,
                                  sl_shard_geometry *out);
/* Placement string of tensor T under the plan, e.g. "[replicate, shard(0)]". */
SL_API sl_status sl_plan_describe(sl_plan *plan, const sl_source_tensor *t, char *buf, size_t len);

/* ---- load ---------------------------------------------------------------- */
typedef struct sl_state sl_state;

typedef enum sl_strategy { SL_STRATEGY_SCATTER = 0, SL_STRATEGY_BROADCAST = 1 } sl_strategy;
/* Who reads the checkpoint's bytes from storage (docs/DESIGN.md#readers):
 * RANK0       rank 0 alone, and sends every byte (RAM-efficient loading; the default);
 * EVERY_RANK  every rank reads its own parts from its own copy; nothing crosses the network;
 * READERS     distributed readers: R ranks (sl_load_options.readers; default one per host, its
 *             lowest rank) each read a disjoint share of the tensors, balanced by bytes and in
 *             file order, and send every piece to the ranks that own it. Every byte is read
 *             once in the job; each reader's NIC carries about 1/R of the checkpoint. */
typedef enum sl_read_mode { SL_READ_RANK0 = 0, SL_READ_EVERY_RANK = 1, SL_READ_READERS = 2 } sl_read_mode;

typedef struct sl_tensor {
  const char *name;
  sl_dtype dtype;      /* in memory: the parameter dtype */
  sl_dtype file_dtype; /* in the checkpoint */
  int ndim;
  int64_t global_shape[SL_MAX_DIMS];
  int64_t local_shape[SL_MAX_DIMS];
  int64_t global_offset[SL_MAX_DIMS];
  sl_device_kind device;  /* where it was placed */
  sl_placement_rule rule; /* which row of the contract chose it */
  int pinned;             /* page-locked host memory from the backend */
  int caller_buffer;      /* filled in place in a caller's buffer */
  void *data;             /* host pointer, or a backend device pointer */
  uint64_t nbytes;        /* local bytes */
  /* DLPack's device (DLDeviceType, device_id): kDLCPU 1, kDLCUDA 2, kDLCUDAHost 3, kDLROCM 10,
   * kDLROCMHost 11, kDLOneAPI 14, as the backend's table says (module.h, dlpack_device_type);
   * kDLExtDev 12 for device memory of a backend that does not say (the sim backend's). */
  int device_type;
  int device_id;
} sl_tensor;
/* Tensors belong to their state (sl_state_destroy frees them, once no export of them is live:
 * see sl_state_export), and the state keeps alive what it needs to free them: it may outlive its
 * context (sl_context_destroy first is fine). */

/* Called once per tensor, in file order, once every rank agreed on the plan (and, reading on
 * every rank, on the checkpoint's bytes) and before any byte moves. Return a buffer of at least
 * t->nbytes at t->device (and pinned if t->pinned) to have it filled in place, or NULL to let
 * the state own one. Caller buffers stay the caller's: the library never frees them. The
 * buffers of a load must not overlap (empty shards aside: zero bytes overlap nothing): two that
 * share a byte fail the load in phase 1 with SL_ERR_BUFFER naming both tensors.
 *
 * Caller buffers on failure (sl_load returns an error and no state):
 * - Phase 1 (everything until every rank has bound or allocated every shard and they agreed;
 *   on any rank): no byte of any caller buffer was written, whether or not bind was called.
 * - Data phase: tensors load one after another in file order. On a rank, the buffers of the
 *   tensors before the one it was loading when it learned of the failure may hold their new
 *   bytes, that tensor's may hold part of them (any mix of old and new bytes), and the buffers
 *   of later tensors are untouched. Rank 0 learns of its own read failures at once; the other
 *   ranks learn of them once per status window (16 transfers, docs/DESIGN.md#data-flow), and
 *   until then place what rank 0 sent instead (zeros, or on the device route whatever its
 *   staging held). A failure that only one rank sees (a copy to its device, a
 *   cast, its own read in every-rank mode) stops that rank placing bytes at once, but reaches
 *   the others only at the closing agreement: their buffers may hold every tensor. Distributed
 *   readers load their shares side by side, and in rounds (docs/DESIGN.md#readers) a round's
 *   transfers land together: a placement that fails inside a round may leave the round's later
 *   tensors holding their new bytes too.
 * - Never, in any case, a byte outside [data, data + t->nbytes) of a buffer. */
typedef void *(*sl_bind_fn)(void *user, const sl_tensor *t);

/* The bind callback that can fail and says what it gave (same timing and buffer contract as
 * sl_bind_fn; it wins over bind when both are set). Return SL_OK with out->data set to have the
 * tensor filled in place, SL_OK with out->data NULL to let the state own a buffer, or a failure
 * with out->message: the load then fails on every rank before any byte moves, naming this rank,
 * the tensor and the message. out->pinned: the buffer is page-locked host memory (a CPU
 * placement); when the placement wants pinned memory and it is not, the library registers it
 * with the backend for the load where the backend can (register_host) and reports t->pinned as
 * it ends up. */
typedef struct sl_binding {
  size_t size; /* set by the library */
  void *data;
  int pinned;
  char message[256];
} sl_binding;
typedef sl_status (*sl_bind_buffer_fn)(void *user, const sl_tensor *t, sl_binding *out);

typedef struct sl_load_options {
  size_t size;                /* sizeof(sl_load_options) as the caller compiled it */
  sl_cpu_offload cpu_offload; /* tri-state; INFER (0) follows the plan's offload policy */
  sl_strategy strategy;
  sl_read_mode read_mode;     /* RANK0 is RAM-efficient loading: it never changes placement */
  size_t staging_bytes;       /* staging budget per rank; 0: 64 MiB */
  sl_bind_fn bind;
  void *bind_user;
  /* progress: called on rank 0 after each tensor (may be NULL) */
  void (*progress)(void *user, uint64_t done_bytes, uint64_t total_bytes);
  void *progress_user;
  sl_bind_buffer_fn bind_buffer; /* wins over bind */
  void *bind_buffer_user;
  /* Staging slots of the pipeline (rank 0 reads transfer k+1 while transfer k moves); 0: 2,
   * at most 8; 1 runs every stage strictly after the previous one (the baseline benchmarks
   * compare against). The staging budget is split between them. */
  int pipeline_slots;
  /* READERS: how many readers (1 to the world size); 0: one per host. Chosen alike on every
   * rank: the lowest rank of each host first, then the next lowest of each, and so on. A
   * reader reads its own path (it must see the checkpoint; the others need not); in READERS
   * the default pipeline_slots is R + 1 (at most 8), so that each reader reads ahead while the
   * others send, and 2R + 1 (at most 17) where the data collective moves several readers'
   * transfers at once (its scatterv_group: rounds of up to 8 readers' transfers, one each, with
   * a slot in flight and one reading ahead for each, docs/DESIGN.md#readers).
   * Ignored by the other modes. */
  int readers;
  /* The progress callback that can fail the load (it wins over progress, and takes
   * progress_user): called on rank 0 after each tensor, as progress. A status other than SL_OK,
   * with MESSAGE (NUL-terminated within MESSAGE_LEN, may be left empty), fails the load on every
   * rank within one status window (docs/DESIGN.md#data-flow) as a failure of rank 0's, naming
   * the message; it is not called again in that load. The context stays usable. */
  sl_status (*progress_status)(void *user, uint64_t done_bytes, uint64_t total_bytes, char *message,
                               size_t message_len);
} sl_load_options;

/* Collective over the context's ranks. opts NULL, or from an older smaller struct, means the
 * zero value for every missing field (INFER, scatter, rank0, 64 MiB, no binding). What a
 * failure leaves in caller buffers: see sl_bind_fn. A failure of the data plane itself in the
 * data phase (a lost peer, a timeout) aborts a device data plane (NCCL, simccl): the context
 * is then only good for sl_context_destroy. */
SL_API sl_status sl_load(sl_context *ctx, sl_plan *plan, sl_source *src, const sl_load_options *opts,
                         sl_state **out);
/* Distributed readers, as sl_load chooses them (docs/DESIGN.md#readers), for planners that show
 * a load before it runs (`shardload plan --hosts`). sl_readers_choose: the readers of a world
 * whose rank r runs on host HOST_OF[r] (0 to world-1), READERS of them (0: one per host):
 * their ranks, ascending, into READER_RANK (room for the world); returns how many, or -1 for a
 * bad argument or no memory. sl_readers_share: which reader (0 to READERS-1) reads each of N
 * tensors, the tensors a load takes in file order (OUT[i] for TENSORS[i]). */
SL_API int sl_readers_choose(int world, const int *host_of, int readers, int *reader_rank);
SL_API void sl_readers_share(size_t n, const sl_source_tensor *const *tensors, int readers, int *out);
SL_API void sl_state_destroy(sl_state *st);
SL_API size_t sl_state_count(const sl_state *st);
SL_API const sl_tensor *sl_state_tensor(const sl_state *st, size_t i);
SL_API const sl_tensor *sl_state_find(const sl_state *st, const char *name);
/* Checkpoint tensors the (non-strict) plan skipped. */
SL_API size_t sl_state_skipped_count(const sl_state *st);
SL_API const char *sl_state_skipped_at(const sl_state *st, size_t i);

typedef struct sl_load_stats {
  size_t size;             /* sizeof(sl_load_stats) as the caller compiled it; the library writes within it */
  uint64_t bytes_read;     /* from storage by this rank */
  uint64_t bytes_sent;     /* by this rank through the collective */
  uint64_t bytes_received;
  uint64_t bytes_h2d;      /* host to accelerator copies */
  uint64_t staging_bytes;  /* host staging buffers held at the peak */
  double seconds;          /* wall time of sl_load on this rank */
  uint64_t bytes_d2h;      /* accelerator to host copies (CPU placements under a device collective) */
  uint64_t device_staging_bytes; /* device staging buffers held at the peak */
  uint64_t transfers;      /* data collective operations (small tensors share one) */
  double seconds_read;     /* of which reading storage */
  double seconds_wait;     /* of which waiting for the data plane (collectives, copies) */
  double seconds_phase1;   /* of which agreeing, planning and allocating */
  uint64_t rounds;         /* of the transfers, group ops that moved several distributed readers' at once */
} sl_load_stats;
SL_API sl_status sl_state_stats(const sl_state *st, sl_load_stats *out);

/* ---- lending a tensor to a consumer (DLPack) ------------------------------ */
/* An export lends one tensor of a state to a consumer that views its memory without a copy (a
 * framework tensor made through DLPack; sl_export_release is what a DLManagedTensor's deleter
 * calls). It holds a reference on the state: the state's memory is freed once sl_state_destroy
 * was called AND every export of it was released, on whichever thread comes last.
 *
 * Ordering: a consumer queues work that reads or writes the memory on its own stream, and that
 * work may still be pending when it releases the export (a torch kernel queued on the tensor when
 * its last view dies). The export records, at release, what the consumer's stream has queued so
 * far, and the free of the state's device memory waits ON THE DEVICE for every release's record:
 * it is enqueued behind them and never blocks the releasing thread (nor the thread of
 * sl_state_destroy). The data is ready for the consumer at export with no wait (sl_load returns
 * once every byte is in place), so nothing is queued on the consumer's stream.
 *
 * Fallback: a backend without the ops for it (module.h: event_record_native, free_device_after),
 * or a release whose record failed, has the free wait on the freeing thread instead: for the
 * records made (event_sync) and then for the backend's synchronize (its own streams; bounded by
 * the backend's timeout) before the memory goes.
 *
 * Host memory (CPU placements, every tensor of a backend whose device memory is host memory,
 * such as cpu) is not ordered by any stream: its stream must be NULL, and a consumer that queued
 * device work on it (a non-blocking copy from pinned memory) finishes that work before release.
 * Caller buffers (sl_bind_fn) stay the caller's: their exports order nothing. */
typedef struct sl_export sl_export;

typedef struct sl_export_options {
  size_t size; /* sizeof(sl_export_options) as the caller compiled it */
  /* The consumer's stream: a stream of the API the backend wraps, live during sl_state_export
   * and sl_export_release (it may be destroyed after). cuda: a cudaStream_t of the backend's
   * device; (void *)1 is cudaStreamLegacy and (void *)2 cudaStreamPerThread, as DLPack numbers
   * them (the per-thread one is ordered through the legacy stream, which waits for every
   * thread's: the release may run on another thread than the consumer's); NULL is the
   * runtime's default stream (the legacy one). sim: one of its own streams (stream_create), NULL
   * its default stream. Must be NULL for host memory (see above). */
  void *stream;
  /* When the export fails, the specific message goes here (truncated to ERRBUF_SIZE,
   * NUL-terminated): the state has no message buffer, and its context may be gone. */
  char *errbuf;
  size_t errbuf_size;
} sl_export_options;

/* Lends tensor INDEX of ST (sl_state_tensor's numbering). OPTS NULL: the zero value (stream
 * NULL). Fails with SL_ERR_INVALID for a bad argument or a stream given for host memory, and
 * with the backend's status when it cannot record on the stream (a stream of another device);
 * nothing is lent then. Thread safety: sl_state_export and sl_export_release may be called from
 * any thread, concurrently with each other and with sl_state_destroy, but sl_state_export not
 * once sl_state_destroy was called (the handle is then no longer the caller's). */
SL_API sl_status sl_state_export(sl_state *st, size_t index, const sl_export_options *opts, sl_export **out);
/* The tensor lent (its data, shape and dtype for a DLManagedTensor); valid until the release. */
SL_API const sl_tensor *sl_export_tensor(const sl_export *ex);
/* The consumer's last use of the tensor has been queued on its stream: records that work
 * (enqueued, never waits for it) and drops the export's reference on the state; the last
 * reference frees the state (see above). NULL is a no-op. */
SL_API void sl_export_release(sl_export *ex);

/* ---- agreement on a caller's outcome ------------------------------------- */
/* Collective over the context's ranks, for work done outside the library (writing a dump,
 * checking a result): every rank passes its own outcome LOCAL (SL_OK or a failure whose
 * message is the context's, see sl_context_errmsg) and every rank returns the same answer:
 * SL_OK when all succeeded, else the status of the lowest failing rank R with "rank R:
 * <its message>" as this context's message. Bounded by the context's timeout; a lost peer
 * or a timeout returns the collective's own error. */
SL_API sl_status sl_context_agree(sl_context *ctx, sl_status local);
/* Records S with MSG as this context's message (sl_context_errmsg) and returns S: how a caller
 * whose own step failed hands its message to sl_context_agree. */
SL_API sl_status sl_context_set_error(sl_context *ctx, sl_status s, const char *msg);

#ifdef __cplusplus
}
#endif
#endif
