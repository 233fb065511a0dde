/* The kernel launchers of cuda_kernels.cu, called by the host code in cuda.c. Private to the
 * CUDA backend module. Each returns the CUDA error of the launch (cudaSuccess when queued); the
 * caller names the call, the device and the error. */
#ifndef SHARDLOAD_CUDA_KERNELS_H
#define SHARDLOAD_CUDA_KERNELS_H

#include <stddef.h>

#include "vendor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueued on STREAM: COUNT elements of SRC_DT at SRC cast to DST_DT at DST (castable dtypes,
 * different ones; the caller copies same-dtype casts). Any alignment. */
cudaError_t sl_cuda_launch_cast(void *dst, int dst_dt, const void *src, int src_dt, size_t count,
                                cudaStream_t stream);

/* Enqueued on STREAM: x -= lr * g over COUNT elements of DT, rounded as core/src/hostops.c does
 * (F16/BF16 computed in F32). */
cudaError_t sl_cuda_launch_sgd(void *x, const void *g, int dt, size_t count, float lr, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
