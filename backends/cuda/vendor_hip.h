/* The HIP map of the CUDA backend's and the NCCL collective's sources (vendor.h with
 * SL_VENDOR_HIP): CUDA runtime names to HIP's, calls through the runtime table of
 * backends/hip/hip_rt.h (libamdhip64 is opened at run time, never linked), and the accessors
 * and words that differ. It covers ROCm 5.2 (Debian 12, CI) and 6.x (MI300), whose
 * differences are handled here:
 *   - hipPointerAttribute_t's memory type is .memoryType before 6.0, .type from 6.0;
 *   - hipStreamLegacy exists from 6.x; before, HIP's NULL stream is the legacy stream;
 *   - hipGetDeviceProperties/hipDeviceProp_t are renamed ...R0600 by the 6.x header (the table
 *     resolves the renamed symbol), hipHostMalloc/hipHostFree are deprecated in 6.x for
 *     hipHostAlloc/hipFreeHost and the other way round in 5.x (the table takes the current one);
 *   - the stream-ordered allocator (hipMallocAsync, hipMallocFromPoolAsync, hipMemPool*) is in
 *     both (from 5.2's library on); hipLaunchHostFunc is declared by 5.2 but missing from its
 *     library (a call returns hipErrorNotSupported there); hipThreadExchangeStreamCaptureMode is
 *     in 5.2's library but not its header (found by dlsym; hipErrorNotSupported without it).
 * A mapped call made where the runtime cannot be opened returns hipErrorInsufficientDriver,
 * and sl__hip_error_string() of that says why. */
#ifndef SHARDLOAD_VENDOR_HIP_H
#define SHARDLOAD_VENDOR_HIP_H

#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include "hip_rt.h"

#define SL_GPU_NAME "hip"
#define SL_GPU_PLATFORM "ROCm"
#define SL_GPU_INSTALL_HINT "install ROCm (the amdgpu driver and its HIP runtime, libamdhip64)"
#define SL_GPU_VISIBLE_ENV "HIP_VISIBLE_DEVICES"
#define SL_GPU_SYNC_TIMEOUT_ENV "SHARDLOAD_HIP_SYNC_TIMEOUT_S"
#define SL_GPU_DLPACK_DEVICE 10 /* kDLROCM */
#define SL_GPU_STREAM_TYPE "hipStream_t"
#define SL_GPU_DLPACK_PINNED 11 /* kDLROCMHost */
#define SL_GPU_ARCH_FMT "%.64s"   /* "gfx942:sramecc+:xnack-" */
#define SL_GPU_ARCH_ARGS(prop) (prop).gcnArchName
#if HIP_VERSION_MAJOR >= 6
#define SL_PTR_ATTR_TYPE(attr) ((attr).type)
#else
#define SL_PTR_ATTR_TYPE(attr) ((attr).memoryType)
#endif

#define SL_CCL_NAME "rccl"
#define SL_CCL_PRODUCT "RCCL"
#define SL_CCL_LIB "librccl.so.1"
#define SL_CCL_ENV "SHARDLOAD_RCCL_LIBRARY"
#define SL_CCL_MIN_VERSION 21803
#define SL_CCL_MIN_TEXT "RCCL 2.18.3 (ROCm 6.0)"

/* A CUDA runtime call's name as HIP's, for messages, in two parts (printed "%s%s"): "cudaX"
 * is "hip" "X", but where HIP's name differs. */
static inline const char *sl_vendor_call(const char *cuda_name, const char **rest) {
  static const char *const renamed[][2] = {{"cudaHostAlloc", "hipHostMalloc"}, {"cudaFreeHost", "hipHostFree"}};
  for (unsigned i = 0; i < sizeof renamed / sizeof renamed[0]; i++)
    if (__builtin_strcmp(cuda_name, renamed[i][0]) == 0) return *rest = renamed[i][1], "";
  if (__builtin_strncmp(cuda_name, "cuda", 4) == 0) return *rest = cuda_name + 4, "hip";
  return *rest = cuda_name, "";
}

/* ---- types and constants ------------------------------------------------------------------- */
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaStream_t hipStream_t
#define cudaEvent_t hipEvent_t
#define cudaMemPool_t hipMemPool_t
#define cudaHostFn_t hipHostFn_t
#define cudaDeviceProp hipDeviceProp_t
#define cudaPointerAttributes hipPointerAttribute_t
#define cudaMemPoolProps hipMemPoolProps
#define cudaMemcpyKind hipMemcpyKind
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaHostAllocDefault 0u /* hipHostMallocDefault (5.x), hipHostAllocDefault (6.x) */
#define cudaHostRegisterDefault hipHostRegisterDefault
#define cudaMemAllocationTypePinned hipMemAllocationTypePinned
#define cudaMemHandleTypeNone hipMemHandleTypeNone
#define cudaMemLocationTypeDevice hipMemLocationTypeDevice
#define cudaMemPoolAttrReleaseThreshold hipMemPoolAttrReleaseThreshold
#define cudaMemPoolReuseAllowInternalDependencies hipMemPoolReuseAllowInternalDependencies
#define cudaMemoryTypeDevice hipMemoryTypeDevice
#define cudaStreamPerThread hipStreamPerThread
#ifdef hipStreamLegacy
#define cudaStreamLegacy hipStreamLegacy
#else
#define cudaStreamLegacy ((hipStream_t)0) /* the NULL stream synchronises with blocking streams */
#endif
#define cudaStreamCaptureMode hipStreamCaptureMode
#define cudaStreamCaptureModeRelaxed hipStreamCaptureModeRelaxed
#define cudaStreamCaptureStatus hipStreamCaptureStatus
#define cudaStreamCaptureStatusNone hipStreamCaptureStatusNone
#define cudaErrorStreamCaptureImplicit hipErrorStreamCaptureImplicit
#define cudaErrorNotReady hipErrorNotReady
#define cudaErrorNotSupported hipErrorNotSupported
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaErrorInsufficientDriver hipErrorInsufficientDriver
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaErrorInvalidDevice hipErrorInvalidDevice
#define cudaErrorDevicesUnavailable hipErrorContextAlreadyInUse /* exclusive mode: in use elsewhere */

/* ---- calls --------------------------------------------------------------------------------- */
#define cudaGetErrorName(e) sl__hip_error_name(e)
#define cudaGetErrorString(e) sl__hip_error_string(e)
#define cudaLaunchHostFunc(...) sl__hip_launch_host_func(__VA_ARGS__)
#ifdef __cplusplus
/* the kernels' file needs only this (and its launches go through hip_launch.c) */
#define cudaGetLastError() sl__hip_get_last_error()
#else
#define SL_HIP_CALL(n, ...) (sl__hip_ready() ? sl__hip_rt.n(__VA_ARGS__) : hipErrorInsufficientDriver)
#define cudaGetLastError() SL_HIP_CALL(GetLastError, )
#define cudaGetDeviceCount(...) SL_HIP_CALL(GetDeviceCount, __VA_ARGS__)
#define cudaGetDevice(...) SL_HIP_CALL(GetDevice, __VA_ARGS__)
#define cudaSetDevice(...) SL_HIP_CALL(SetDevice, __VA_ARGS__)
#define cudaGetDeviceProperties(...) SL_HIP_CALL(GetDeviceProperties, __VA_ARGS__)
#define cudaDeviceGetPCIBusId(...) SL_HIP_CALL(DeviceGetPCIBusId, __VA_ARGS__)
#define cudaStreamCreateWithFlags(...) SL_HIP_CALL(StreamCreateWithFlags, __VA_ARGS__)
#define cudaStreamDestroy(...) SL_HIP_CALL(StreamDestroy, __VA_ARGS__)
#define cudaStreamQuery(...) SL_HIP_CALL(StreamQuery, __VA_ARGS__)
#define cudaStreamIsCapturing(...) SL_HIP_CALL(StreamIsCapturing, __VA_ARGS__)
#define cudaThreadExchangeStreamCaptureMode(...) sl__hip_exchange_capture_mode(__VA_ARGS__)
#define cudaStreamSynchronize(...) SL_HIP_CALL(StreamSynchronize, __VA_ARGS__)
#define cudaStreamWaitEvent(...) SL_HIP_CALL(StreamWaitEvent, __VA_ARGS__)
#define cudaEventCreateWithFlags(...) SL_HIP_CALL(EventCreateWithFlags, __VA_ARGS__)
#define cudaEventDestroy(...) SL_HIP_CALL(EventDestroy, __VA_ARGS__)
#define cudaEventRecord(...) SL_HIP_CALL(EventRecord, __VA_ARGS__)
#define cudaEventQuery(...) SL_HIP_CALL(EventQuery, __VA_ARGS__)
#define cudaMemPoolCreate(...) SL_HIP_CALL(MemPoolCreate, __VA_ARGS__)
#define cudaMemPoolDestroy(...) SL_HIP_CALL(MemPoolDestroy, __VA_ARGS__)
#define cudaMemPoolSetAttribute(...) SL_HIP_CALL(MemPoolSetAttribute, __VA_ARGS__)
#define cudaMemPoolTrimTo(...) SL_HIP_CALL(MemPoolTrimTo, __VA_ARGS__)
#define cudaMallocFromPoolAsync(...) SL_HIP_CALL(MallocFromPoolAsync, __VA_ARGS__)
#define cudaMallocAsync(...) SL_HIP_CALL(MallocAsync, __VA_ARGS__)
#define cudaFreeAsync(...) SL_HIP_CALL(FreeAsync, __VA_ARGS__)
#define cudaHostAlloc(...) SL_HIP_CALL(HostAlloc, __VA_ARGS__)
#define cudaFreeHost(...) SL_HIP_CALL(FreeHost, __VA_ARGS__)
#define cudaHostRegister(...) SL_HIP_CALL(HostRegister, __VA_ARGS__)
#define cudaHostUnregister(...) SL_HIP_CALL(HostUnregister, __VA_ARGS__)
#define cudaPointerGetAttributes(...) SL_HIP_CALL(PointerGetAttributes, __VA_ARGS__)
#define cudaMemcpyAsync(...) SL_HIP_CALL(MemcpyAsync, __VA_ARGS__)
#define cudaMemcpy2DAsync(...) SL_HIP_CALL(Memcpy2DAsync, __VA_ARGS__)
#endif

#endif
