/* The HIP runtime (libamdhip64) as the HIP backend and the RCCL collective see it: opened with
 * dlopen on the first call, never linked. HIP has no static runtime (CUDA's modules link
 * cudart_static, which opens libcuda.so.1 itself); linking libamdhip64 would make the module
 * fail to load, with the loader's error and no probe, wherever ROCm is missing, and a lazily
 * bound link cannot help: the constructor clang emits for a file with kernels registers them
 * with the runtime at load time. So every runtime call goes through the table below, filled
 * once by dlsym (vendor_hip.h maps cudaX(...) to it), and the compiler's launch ABI is
 * defined in the module itself (hip_launch.c), which holds the kernels' registrations until
 * the runtime is open and forwards launches to it.
 *
 * Private to the modules (hidden; each module links its own copy). */
#ifndef SHARDLOAD_HIP_RT_H
#define SHARDLOAD_HIP_RT_H

#include <stddef.h>

#include <hip/hip_runtime_api.h>

#include "hip_rt_fns.h"

#define SL_HIP_STR_(x) #x
#define SL_HIP_STR(x) SL_HIP_STR_(x)
/* The runtime the module was built against, by soname: its major version is HIP's ABI (6.0
 * changed hipDeviceProp_t and hipPointerAttribute_t), so a module runs on that major only. */
#define SL_HIP_LIB "libamdhip64.so." SL_HIP_STR(HIP_VERSION_MAJOR)
#define SL_HIP_BUILT_WITH "ROCm " SL_HIP_STR(HIP_VERSION_MAJOR) "." SL_HIP_STR(HIP_VERSION_MINOR)

#ifdef __cplusplus
extern "C" {
#endif

#ifndef __cplusplus
/* Each member has the type of the header's declaration, so a call through it is checked as a
 * direct call would be. (Only the type: a deprecated declaration is not called by name.) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
typedef struct sl_hip_rt {
#define SL_HIP_MEMBER(n) __typeof__(&hip##n) n;
  SL_HIP_FUNCTIONS(SL_HIP_MEMBER)
#undef SL_HIP_MEMBER
  /* pinned host memory: hipHostAlloc/hipFreeHost where the runtime has them undeprecated (6.x),
   * else hipHostMalloc/hipHostFree (5.x, where the former are the deprecated spellings) */
  hipError_t (*HostAlloc)(void **ptr, size_t bytes, unsigned int flags);
  hipError_t (*FreeHost)(void *ptr);
  /* declared by ROCm 5.2's header but not in its library: NULL there */
  hipError_t (*LaunchHostFunc)(hipStream_t stream, hipHostFn_t fn, void *user);
  /* in 5.2's library (hip_5.0) but not its header: NULL where missing */
  hipError_t (*ThreadExchangeStreamCaptureMode)(hipStreamCaptureMode *mode);
  /* the launch ABI (hip_launch.c); the registration calls are the runtime's, not in a header */
  void **(*RegisterFatBinary)(const void *wrapper);
  void (*RegisterFunction)(void **handle, const void *host_fn, char *device_fn, const char *device_name,
                           unsigned int thread_limit, void *tid, void *bid, dim3 *block, dim3 *grid, int *wsize);
  void (*UnregisterFatBinary)(void **handle);
  __typeof__(&__hipPushCallConfiguration) PushCallConfiguration;
  __typeof__(&__hipPopCallConfiguration) PopCallConfiguration;
} sl_hip_rt;
#pragma GCC diagnostic pop

/* The table, valid once sl__hip_ready() said 1. */
extern sl_hip_rt sl__hip_rt;

/* Opens SONAME into *RT: 1, or 0 with WHY ("libamdhip64.so not found (...); ...", not prefixed
 * with a module name). Never closed (the runtime keeps threads of its own). */
int sl__hip_open_lib(const char *soname, sl_hip_rt *rt, char *why, size_t len);
#endif

extern int sl__hip_state; /* 1 open, -1 cannot be, 0 not tried (atomic) */

/* Opens SL_HIP_LIB once per process (thread-safe); 1 when the table is usable. */
int sl__hip_open(void);
/* Why the runtime cannot be used ("" while it can, or before sl__hip_open). */
const char *sl__hip_why(void);

/* 1 when the table is usable, opening the runtime on the first call: every mapped call asks
 * first, as CUDA's static runtime opens libcuda.so.1 on its first call, so the code of the
 * modules needs no "is the runtime there" step of its own. */
static inline int sl__hip_ready(void) { return __atomic_load_n(&sl__hip_state, __ATOMIC_ACQUIRE) > 0 || sl__hip_open(); }

/* The runtime's names and texts for an error, also where it is missing: a mapped call then
 * fails with hipErrorInsufficientDriver, whose text here is why the runtime cannot be used. */
const char *sl__hip_error_name(hipError_t e);
const char *sl__hip_error_string(hipError_t e);
/* For the kernels' file (C++): hipGetLastError through the table. */
hipError_t sl__hip_get_last_error(void);
/* hipLaunchHostFunc, or hipErrorNotSupported where the runtime lacks it (ROCm 5.2). */
hipError_t sl__hip_launch_host_func(hipStream_t stream, hipHostFn_t fn, void *user);
/* hipThreadExchangeStreamCaptureMode, or hipErrorNotSupported where the runtime lacks it. */
hipError_t sl__hip_exchange_capture_mode(hipStreamCaptureMode *mode);

/* Whether the module holds code for ARCH (a device's gcnArchName, "gfx942:sramecc+:xnack-"):
 * its processor is one of the build's targets (SHARDLOAD_HIP_ARCHS, compiled in as
 * SL_HIP_ARCHS); and those targets, for messages. */
int sl__hip_has_code_for(const char *arch);
const char *sl__hip_archs(void);

/* The backend's probe: "hip: N devices" (10), or 0 and why not: "hip: libamdhip64.so not
 * found (...)", "hip: no ROCm device (hipErrorNoDevice; ...)". Opens the runtime; creates no
 * context and allocates nothing. */
int sl__hip_probe(char *reason, size_t len);

/* hip_launch.c: hands the kernels' registrations, held since the module loaded, to the runtime
 * (once, when it was opened, before the table is published). */
void sl__hip_launch_attach(void);

#ifdef __cplusplus
}
#endif
#endif
