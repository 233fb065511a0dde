/* The vendor of the CUDA backend's and the NCCL collective's sources: CUDA by default, HIP when
 * built with SL_VENDOR_HIP (backends/hip, collectives/rccl build the same sources into
 * libshardload-hip.so and libshardload-rccl.so; ggml's vendors/hip.h approach). Everything
 * those sources need from their vendor comes from here: the runtime's names (vendor_hip.h maps
 * CUDA's onto HIP's), the few accessors that differ, and the words of their messages, so that
 * a change to the sources applies to both vendors and their messages name the right one.
 *
 * The sources include this header instead of cuda_runtime_api.h, and write vendor names in
 * messages as SL_GPU_NAME ":%d" (never "cuda:%d"), SL_CCL_NAME " init" (never "nccl init"). */
#ifndef SHARDLOAD_VENDOR_H
#define SHARDLOAD_VENDOR_H

#ifdef SL_VENDOR_HIP
#include "vendor_hip.h"
#else

#include <cuda_runtime_api.h>

/* the backend's module name, and the prefix of its messages ("cuda:0 (local rank 0): ...") */
#define SL_GPU_NAME "cuda"
/* the vendor's platform in prose ("no CUDA driver") */
#define SL_GPU_PLATFORM "CUDA"
/* what to install when the driver is missing or too old */
#define SL_GPU_INSTALL_HINT "install or update the NVIDIA driver"
/* the variable that selects the visible devices, named in "no device" messages */
#define SL_GPU_VISIBLE_ENV "CUDA_VISIBLE_DEVICES"
/* the backend's bound on a wait for queued work, in seconds */
#define SL_GPU_SYNC_TIMEOUT_ENV "SHARDLOAD_CUDA_SYNC_TIMEOUT_S"
/* DLPack's device types of the backend's memory (dlpack.h: kDLCUDA) and pinned memory
 * (kDLCUDAHost) */
#define SL_GPU_DLPACK_DEVICE 2
#define SL_GPU_DLPACK_PINNED 3
/* the native stream type, named in messages */
#define SL_GPU_STREAM_TYPE "cudaStream_t"
/* the device's architecture in describe(): "sm_90" */
#define SL_GPU_ARCH_FMT "sm_%d%d"
#define SL_GPU_ARCH_ARGS(prop) (prop).major, (prop).minor
/* the memory type of a struct cudaPointerAttributes (HIP before 6.0 calls the field memoryType) */
#define SL_PTR_ATTR_TYPE(attr) ((attr).type)
/* A runtime call's name in a message, in two parts (printed "%s%s"): CUDA's own. */
static inline const char *sl_vendor_call(const char *cuda_name, const char **rest) { return *rest = cuda_name, ""; }

/* the data collective: its module name, the library's name in prose, the library it opens, and
 * the oldest release it runs on (ncclCommSplit and non-blocking init; NCCL_VERSION() coding) */
#define SL_CCL_NAME "nccl"
#define SL_CCL_PRODUCT "NCCL"
#define SL_CCL_LIB "libnccl.so.2"
/* where the Python package names the nvidia-nccl wheel's copy, tried when the loader finds none
 * (a torch job without a system NCCL: docs/MODULES.md#how-a-module-is-found; python/shardload/_nccl.py sets it) */
#define SL_CCL_ENV "SHARDLOAD_NCCL_LIBRARY"
#define SL_CCL_MIN_VERSION 21800
#define SL_CCL_MIN_TEXT "NCCL 2.18"

#endif
#endif
