/* shardload module ABI, version 1, frozen as published: never edit. Installed beside the
 * current ABI (shardload/module.h) so that a module built out of tree can export both
 * versions from one binary: sl_backend_module_v2 returning the current table for a core that
 * knows it, and sl_backend_module (sl_collective_module) returning a v1 table for a core that
 * knows only v1. A core that knows both takes v2 first and adapts a v1 table otherwise
 * (docs/DESIGN.md#modules). Every op of v1 is complete on return; v1 has no streams. The
 * constants both versions share (the SL_BACKEND_* flags, SL_HAS_OP) are shardload/module.h's. */
#ifndef SHARDLOAD_MODULE_V1_H
#define SHARDLOAD_MODULE_V1_H

#include <stddef.h>
#include <stdint.h>

#include "shardload/module.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sl_module_host_v1 {
  void *core;
  void (*log)(void *core, sl_log_level level, const char *fmt, ...);
  sl_status (*fail)(void *core, sl_status s, const char *fmt, ...);
} sl_module_host_v1;

typedef struct sl_backend_init_v1 {
  const sl_module_host_v1 *host;
  int local_rank;
  const char *variant;
} sl_backend_init_v1;

typedef struct sl_backend_ops_v1 {
  uint32_t abi_version; /* 1 */
  uint32_t size;
  const char *name;
  uint32_t flags;
  const char *preferred_collective;
  int (*score)(void);
  sl_status (*init)(const sl_backend_init_v1 *init, void **be);
  void (*fini)(void *be);
  void (*describe)(void *be, char *buf, size_t len);
  sl_status (*alloc_device)(void *be, size_t bytes, void **ptr);
  void (*free_device)(void *be, void *ptr);
  sl_status (*alloc_pinned)(void *be, size_t bytes, void **ptr);
  void (*free_pinned)(void *be, void *ptr);
  sl_status (*copy_h2d)(void *be, void *dst, const void *src, size_t bytes);
  sl_status (*copy_d2h)(void *be, void *dst, const void *src, size_t bytes);
  sl_status (*copy_d2d)(void *be, void *dst, const void *src, size_t bytes);
  sl_status (*synchronize)(void *be);
  sl_status (*cast_device)(void *be, void *dst, sl_dtype dst_dt, const void *src, sl_dtype src_dt,
                           size_t count);
  sl_status (*sgd_step)(void *be, void *x, const void *g, sl_dtype dt, size_t count, float lr);
  int (*is_device_ptr)(void *be, const void *ptr, size_t bytes);
  void (*traffic)(void *be, uint64_t *h2d, uint64_t *d2h);
} sl_backend_ops_v1;

typedef struct sl_collective_init_v1 {
  const sl_module_host_v1 *host;
  int rank;
  int world_size;
  const char *rendezvous;
  const char *prefix;
  int timeout_ms;
  const char *lobby;
  const char *job_key;
} sl_collective_init_v1;

typedef struct sl_collective_ops_v1 {
  uint32_t abi_version; /* 1 */
  uint32_t size;
  const char *name;
  const char *device_backend;
  int (*score)(void);
  sl_status (*init)(const sl_collective_init_v1 *init, void **comm);
  void (*fini)(void *comm);
  sl_status (*broadcast)(void *comm, void *buf, size_t bytes, int root);
  sl_status (*scatterv)(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs,
                        void *recvbuf, size_t recvbytes, int root);
  sl_status (*allgather)(void *comm, const void *sendbuf, void *recvbuf, size_t bytes);
  sl_status (*barrier)(void *comm);
} sl_collective_ops_v1;

#ifdef __cplusplus
}
#endif
#endif
