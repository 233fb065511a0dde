/* The compiler's launch ABI, defined in the module (hip_rt.h says why the runtime is not
 * linked). For a file with kernels, clang emits a constructor that, when the module is loaded,
 * calls __hipRegisterFatBinary with the embedded code objects and __hipRegisterFunction once
 * per kernel (its host stub and its name), and, for each <<<>>> launch,
 * __hipPushCallConfiguration before the stub and __hipPopCallConfiguration + hipLaunchKernel
 * inside it. Here the constructor's registrations are kept (the module may be loaded where
 * there is no runtime, and is, to be probed) and handed to the runtime when it is opened
 * (sl__hip_launch_attach, from sl__hip_open); the launch calls forward to it. Hidden, as
 * everything of the module but its entry. The runtime loads a kernel's code object lazily, at
 * its first launch, as it does for a registration made at load time (ROCm's deferred loading).
 *
 * No lock: registration runs in the module's constructor, before any other thread can reach
 * the module, and attach runs once, inside sl__hip_open's pthread_once. */
#define _GNU_SOURCE
#include "hip_rt.h"

#define MAX_KERNELS 64 /* cuda_kernels.cu has 28 */

typedef struct kernel_reg {
  const void *host_fn;
  char *device_fn;
  const char *device_name;
  unsigned int thread_limit;
} kernel_reg;

static const void *g_wrapper; /* the fat binary the constructor registered */
static void *g_ours;          /* its handle as the constructor holds it: this variable's address */
static void **g_runtime;      /* the runtime's handle for it, once attached */
static kernel_reg g_kernels[MAX_KERNELS];
static int g_nkernels;
static int g_lost; /* registrations past MAX_KERNELS: attach refuses to pretend */

void **__hipRegisterFatBinary(const void *wrapper) {
  g_wrapper = wrapper;
  return &g_ours;
}

void __hipRegisterFunction(void **handle, const void *host_fn, char *device_fn, const char *device_name,
                           unsigned int thread_limit, void *tid, void *bid, dim3 *block, dim3 *grid, int *wsize) {
  if (handle != &g_ours) return; /* not a fat binary of this module's: cannot happen */
  if (g_nkernels == MAX_KERNELS) {
    g_lost++;
    return;
  }
  g_kernels[g_nkernels++] = (kernel_reg){host_fn, device_fn, device_name, thread_limit};
}

/* At exit (the constructor's atexit); the runtime may already have shut down its devices then,
 * as for any HIP program: the call is what every compiled HIP file makes. */
void __hipUnregisterFatBinary(void **handle) {
  if (handle == &g_ours && g_runtime) sl__hip_rt.UnregisterFatBinary(g_runtime);
  g_runtime = NULL;
}

void sl__hip_launch_attach(void) {
  if (!g_wrapper || g_lost) return; /* no kernels (the rccl module), or more than were kept: launches fail */
  g_runtime = sl__hip_rt.RegisterFatBinary(g_wrapper);
  if (!g_runtime) return;
  for (int i = 0; i < g_nkernels; i++)
    sl__hip_rt.RegisterFunction(g_runtime, g_kernels[i].host_fn, g_kernels[i].device_fn, g_kernels[i].device_name,
                                g_kernels[i].thread_limit, NULL, NULL, NULL, NULL, NULL);
}

/* A launch before the runtime is open cannot happen (the backend's init opened it); it fails
 * with the reason rather than calling through an empty table. */
hipError_t __hipPushCallConfiguration(dim3 grid, dim3 block, size_t shared, hipStream_t stream) {
  return sl__hip_ready() ? sl__hip_rt.PushCallConfiguration(grid, block, shared, stream) : hipErrorInsufficientDriver;
}

hipError_t __hipPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared, hipStream_t *stream) {
  return sl__hip_ready() ? sl__hip_rt.PopCallConfiguration(grid, block, shared, stream) : hipErrorInsufficientDriver;
}

hipError_t hipLaunchKernel(const void *fn, dim3 grid, dim3 block, void **args, size_t shared, hipStream_t stream) {
  if (!sl__hip_ready()) return hipErrorInsufficientDriver;
  /* the kernels were not handed to the runtime: say so instead of the runtime's "invalid
   * device function" */
  if (!g_runtime) return hipErrorNoBinaryForGpu;
  return sl__hip_rt.LaunchKernel(fn, grid, block, args, shared, stream);
}
