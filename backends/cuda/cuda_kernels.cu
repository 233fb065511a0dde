/* The CUDA backend's kernels: casts between F64/F32/F16/BF16 bit-exact with sl_convert (the
 * element math is cuda_convert.h, shared with the host test that proves it), and the SGD step
 * extension. One file, so nvcc runs once per architecture. */
#include <stdint.h>

#include "cuda_convert.h"
#include "cuda_kernels.h"
#include "shardload/shardload.h"

namespace {

/* Raw bit containers per dtype: values never pass through float registers unconverted. */
template <int DT> struct bits;
template <> struct bits<SL_DTYPE_F64> { typedef uint64_t type; };
template <> struct bits<SL_DTYPE_F32> { typedef uint32_t type; };
template <> struct bits<SL_DTYPE_F16> { typedef uint16_t type; };
template <> struct bits<SL_DTYPE_BF16> { typedef uint16_t type; };

template <int S, int D> struct conv;
#define SLC_CONV(S, D, fn)                                                                          \
  template <> struct conv<S, D> {                                                                   \
    static __device__ __forceinline__ bits<D>::type run(bits<S>::type x) { return fn(x); }          \
  };
SLC_CONV(SL_DTYPE_F64, SL_DTYPE_F32, slc_f64_to_f32)
SLC_CONV(SL_DTYPE_F64, SL_DTYPE_F16, slc_f64_to_f16)
SLC_CONV(SL_DTYPE_F64, SL_DTYPE_BF16, slc_f64_to_bf16)
SLC_CONV(SL_DTYPE_F32, SL_DTYPE_F64, slc_f32_to_f64)
SLC_CONV(SL_DTYPE_F32, SL_DTYPE_F16, slc_f32_to_f16)
SLC_CONV(SL_DTYPE_F32, SL_DTYPE_BF16, slc_f32_to_bf16)
SLC_CONV(SL_DTYPE_F16, SL_DTYPE_F64, slc_f16_to_f64)
SLC_CONV(SL_DTYPE_F16, SL_DTYPE_F32, slc_f16_to_f32)
SLC_CONV(SL_DTYPE_F16, SL_DTYPE_BF16, slc_f16_to_bf16)
SLC_CONV(SL_DTYPE_BF16, SL_DTYPE_F64, slc_bf16_to_f64)
SLC_CONV(SL_DTYPE_BF16, SL_DTYPE_F32, slc_bf16_to_f32)
SLC_CONV(SL_DTYPE_BF16, SL_DTYPE_F16, slc_bf16_to_f16)
#undef SLC_CONV

/* Loads and stores of one element. Device buffers handed out by the backend are aligned, but a
 * cast may start at any byte offset inside one (a region of a packed transfer): the unaligned
 * variant moves bytes, since a misaligned wide access faults on a GPU. */
template <typename T, bool ALIGNED> __device__ __forceinline__ T load(const unsigned char *p, size_t i) {
  if constexpr (ALIGNED) {
    return reinterpret_cast<const T *>(p)[i];
  } else {
    T v = 0;
    for (unsigned b = 0; b < sizeof(T); b++) v |= (T)((T)p[i * sizeof(T) + b] << (8 * b));
    return v;
  }
}
template <typename T, bool ALIGNED> __device__ __forceinline__ void store(unsigned char *p, size_t i, T v) {
  if constexpr (ALIGNED) {
    reinterpret_cast<T *>(p)[i] = v;
  } else {
    for (unsigned b = 0; b < sizeof(T); b++) p[i * sizeof(T) + b] = (unsigned char)(v >> (8 * b));
  }
}

template <int S, int D, bool ALIGNED>
__global__ void cast_kernel(unsigned char *__restrict__ dst, const unsigned char *__restrict__ src, size_t n) {
  typedef typename bits<S>::type ST;
  typedef typename bits<D>::type DT;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    store<DT, ALIGNED>(dst, i, conv<S, D>::run(load<ST, ALIGNED>(src, i)));
}

const unsigned kThreads = 256;

/* Enough blocks to fill any current GPU several times over; the grid-stride loop does the rest. */
unsigned grid_for(size_t n) {
  size_t blocks = (n + kThreads - 1) / kThreads;
  return (unsigned)(blocks < 65536 ? blocks : 65536);
}

template <int S, int D>
cudaError_t launch_cast(void *dst, const void *src, size_t n, cudaStream_t stream) {
  const bool aligned = (uintptr_t)dst % sizeof(typename bits<D>::type) == 0 &&
                       (uintptr_t)src % sizeof(typename bits<S>::type) == 0;
  unsigned char *d = static_cast<unsigned char *>(dst);
  const unsigned char *s = static_cast<const unsigned char *>(src);
  /* cudaGetLastError below must see this launch's error only, not one an earlier runtime call
   * left pending (a tolerated cudaHostRegister failure, say) */
  (void)cudaGetLastError();
  if (aligned) cast_kernel<S, D, true><<<grid_for(n), kThreads, 0, stream>>>(d, s, n);
  else cast_kernel<S, D, false><<<grid_for(n), kThreads, 0, stream>>>(d, s, n);
  return cudaGetLastError();
}

/* The SGD step as core/src/hostops.c computes it: no fused multiply-add (the host has none), so
 * the product and the difference are rounded separately (__fmul_rn/__dmul_rn are never
 * contracted). */
__global__ void sgd_f64(double *x, const double *g, size_t n, float lr) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = __dsub_rn(x[i], __dmul_rn((double)lr, g[i]));
}
__global__ void sgd_f32(float *x, const float *g, size_t n, float lr) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = __fsub_rn(x[i], __fmul_rn(lr, g[i]));
}
template <bool BF16> __global__ void sgd_half(uint16_t *x, const uint16_t *g, size_t n, float lr) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float xf = slc_f32_from(BF16 ? slc_bf16_to_f32(x[i]) : slc_f16_to_f32(x[i]));
    float gf = slc_f32_from(BF16 ? slc_bf16_to_f32(g[i]) : slc_f16_to_f32(g[i]));
    uint32_t r = slc_f32_bits(__fsub_rn(xf, __fmul_rn(lr, gf)));
    x[i] = BF16 ? slc_f32_to_bf16(r) : slc_f32_to_f16(r);
  }
}

} // namespace

extern "C" cudaError_t sl_cuda_launch_cast(void *dst, int dst_dt, const void *src, int src_dt, size_t count,
                                           cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
#define SLC_CASE(S, D) \
  if (src_dt == S && dst_dt == D) return launch_cast<S, D>(dst, src, count, stream);
  SLC_CASE(SL_DTYPE_F64, SL_DTYPE_F32)
  SLC_CASE(SL_DTYPE_F64, SL_DTYPE_F16)
  SLC_CASE(SL_DTYPE_F64, SL_DTYPE_BF16)
  SLC_CASE(SL_DTYPE_F32, SL_DTYPE_F64)
  SLC_CASE(SL_DTYPE_F32, SL_DTYPE_F16)
  SLC_CASE(SL_DTYPE_F32, SL_DTYPE_BF16)
  SLC_CASE(SL_DTYPE_F16, SL_DTYPE_F64)
  SLC_CASE(SL_DTYPE_F16, SL_DTYPE_F32)
  SLC_CASE(SL_DTYPE_F16, SL_DTYPE_BF16)
  SLC_CASE(SL_DTYPE_BF16, SL_DTYPE_F64)
  SLC_CASE(SL_DTYPE_BF16, SL_DTYPE_F32)
  SLC_CASE(SL_DTYPE_BF16, SL_DTYPE_F16)
#undef SLC_CASE
  return cudaErrorInvalidValue; /* the host code checks the pair first */
}

extern "C" cudaError_t sl_cuda_launch_sgd(void *x, const void *g, int dt, size_t count, float lr,
                                          cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  (void)cudaGetLastError(); /* see launch_cast */
  switch (dt) {
    case SL_DTYPE_F64:
      sgd_f64<<<grid_for(count), kThreads, 0, stream>>>((double *)x, (const double *)g, count, lr);
      break;
    case SL_DTYPE_F32:
      sgd_f32<<<grid_for(count), kThreads, 0, stream>>>((float *)x, (const float *)g, count, lr);
      break;
    case SL_DTYPE_F16:
      sgd_half<false><<<grid_for(count), kThreads, 0, stream>>>((uint16_t *)x, (const uint16_t *)g, count, lr);
      break;
    case SL_DTYPE_BF16:
      sgd_half<true><<<grid_for(count), kThreads, 0, stream>>>((uint16_t *)x, (const uint16_t *)g, count, lr);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
