/* Module ABI: backends (memory, copies) and collectives (data movement between ranks).
 *
 * Every module is one const ops struct that starts with its ABI version and its size and is
 * exported by one symbol (built-in modules are listed in registry.c; loadable ones export
 * sl_backend_module / sl_collective_module from a shared object). The core tests optional
 * members with SL_HAS_OP so a module built against an older, shorter struct keeps working.
 * Modules never print: they report through the sl_module_host the core hands them. */
#ifndef SHARDLOAD_MODULE_H
#define SHARDLOAD_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include "shardload/shardload.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SL_BACKEND_ABI_VERSION 1u
#define SL_COLLECTIVE_ABI_VERSION 1u

/* True when the module's table is long enough to hold member M and M is set. */
#define SL_HAS_OP(ops, M) \
  ((ops)->size >= offsetof(__typeof__(*(ops)), M) + sizeof((ops)->M) && (ops)->M != NULL)

/* What the core lends a module: a logger and an error sink (the context's message buffer). */
typedef struct sl_module_host {
  void *core;
  void (*log)(void *core, sl_log_level level, const char *fmt, ...)
      __attribute__((format(printf, 3, 4)));
  /* Records the specific message and returns s, so modules write `return host->fail(...)`. */
  sl_status (*fail)(void *core, sl_status s, const char *fmt, ...)
      __attribute__((format(printf, 3, 4)));
} sl_module_host;

/* ---- backends --------------------------------------------------------------------------- */
enum {
  SL_BACKEND_DEVICE_IS_HOST = 1u << 0, /* "device" memory is plain host memory (cpu backend) */
  SL_BACKEND_HAS_PINNED = 1u << 1      /* alloc_pinned gives page-locked host memory */
};

typedef struct sl_backend_init {
  const sl_module_host *host;
  int local_rank; /* picks the device: local_rank % device count */
  const char *variant; /* text after ':' in the backend name ("strict" in "sim:strict"), or NULL */
} sl_backend_init;

typedef struct sl_backend_ops {
  uint32_t abi_version; /* SL_BACKEND_ABI_VERSION */
  uint32_t size;        /* sizeof(sl_backend_ops) as the module was built */
  const char *name;
  uint32_t flags;
  /* "nccl", "rccl", or "gloo" (host staging). Not consulted yet: "auto" picks gloo until ranks
   * can agree on a device collective (with the GPU modules). */
  const char *preferred_collective;
  /* 0: unusable on this machine; higher wins for backend "auto". Cheap, no side effects. */
  int (*score)(void);
  sl_status (*init)(const sl_backend_init *init, void **be);
  void (*fini)(void *be);
  /* One line naming the device ("cuda:0 NVIDIA H200, 141 GiB"). */
  void (*describe)(void *be, char *buf, size_t len);
  sl_status (*alloc_device)(void *be, size_t bytes, void **ptr);
  void (*free_device)(void *be, void *ptr);
  sl_status (*alloc_pinned)(void *be, size_t bytes, void **ptr);
  void (*free_pinned)(void *be, void *ptr);
  sl_status (*copy_h2d)(void *be, void *dst, const void *src, size_t bytes);
  sl_status (*copy_d2h)(void *be, void *dst, const void *src, size_t bytes);
  sl_status (*copy_d2d)(void *be, void *dst, const void *src, size_t bytes);
  sl_status (*synchronize)(void *be);
  /* Optional: cast COUNT elements in device memory (dst and src may not overlap). */
  sl_status (*cast_device)(void *be, void *dst, sl_dtype dst_dt, const void *src, sl_dtype src_dt,
                           size_t count);
  /* Optional: one plain SGD step x -= lr * g over F64/F32/F16/BF16
   * device data, used by tests to prove placed shards are usable by the backend. */
  sl_status (*sgd_step)(void *be, void *x, const void *g, sl_dtype dt, size_t count, float lr);
  /* Optional: whether [ptr, ptr+bytes) is device memory of this backend (checks caller buffers). */
  int (*is_device_ptr)(void *be, const void *ptr, size_t bytes);
  /* Optional: bytes moved host->device and device->host since init (simulators count). */
  void (*traffic)(void *be, uint64_t *h2d, uint64_t *d2h);
} sl_backend_ops;

/* ---- collectives ------------------------------------------------------------------------ */
typedef struct sl_collective_init {
  const sl_module_host *host;
  int rank;
  int world_size;
  const char *rendezvous; /* "file://DIR", "tcp://HOST:PORT" or "c10d://HOST:PORT"; NULL for world size 1 */
  const char *prefix;     /* store key prefix, unique per job */
  int timeout_ms;
  /* Appended (module ABI 1 keeps loading: a module that does not know them ignores them; no
   * loadable collective exists yet, and the next ABI version gives this struct a size so that
   * a newer module can tell an older core's shorter struct).
   * LOBBY: a key prefix shared by every job with the same launcher job id and world size, where
   * each rank leaves JOB_KEY (the caller's sl_context_options.job_key, "" when none) so that a
   * rank waiting for peers that joined under another job key can say so at once instead of
   * timing out (docs/DESIGN.md#rendezvous). */
  const char *lobby;
  const char *job_key;
} sl_collective_init;

typedef struct sl_collective_ops {
  uint32_t abi_version; /* SL_COLLECTIVE_ABI_VERSION */
  uint32_t size;
  const char *name;
  /* Memory the buffers live in: 0 host memory; otherwise the backend name it needs. */
  const char *device_backend;
  int (*score)(void);
  sl_status (*init)(const sl_collective_init *init, void **comm);
  void (*fini)(void *comm);
  /* All collectives block until done, fail with SL_ERR_TIMEOUT/SL_ERR_PEER past timeout_ms,
   * and name the rank they lost in the host's message. */
  sl_status (*broadcast)(void *comm, void *buf, size_t bytes, int root);
  /* Root sends counts[r] bytes at sendbuf + displs[r] to rank r; every rank receives
   * recvbytes (== counts[rank]) into recvbuf. sendbuf/counts/displs are read on root only. */
  sl_status (*scatterv)(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs,
                        void *recvbuf, size_t recvbytes, int root);
  /* Every rank contributes BYTES; recvbuf holds world_size * BYTES in rank order. */
  sl_status (*allgather)(void *comm, const void *sendbuf, void *recvbuf, size_t bytes);
  sl_status (*barrier)(void *comm);
} sl_collective_ops;

/* Entry symbols of loadable modules. */
typedef const sl_backend_ops *(*sl_backend_entry_fn)(void);
typedef const sl_collective_ops *(*sl_collective_entry_fn)(void);
#define SL_BACKEND_ENTRY "sl_backend_module"
#define SL_COLLECTIVE_ENTRY "sl_collective_module"

#ifdef __cplusplus
}
#endif
#endif
