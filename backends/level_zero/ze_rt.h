/* The Level Zero loader (libze_loader.so.1) as the level_zero backend sees it: opened with
 * dlopen on the first call, never linked, so that the module loads, and its probe says why it
 * cannot run, on a machine without Level Zero. Every loader call goes through the table below,
 * filled once by dlsym; a loader that lacks one of its functions is refused, naming it.
 *
 * Private to the module (hidden). */
#ifndef SHARDLOAD_ZE_RT_H
#define SHARDLOAD_ZE_RT_H

#include <stddef.h>

#include <level_zero/ze_api.h>

#define SL_ZE_LIB "libze_loader.so.1"

/* The loader functions the backend calls: X(Name) stands for zeName. Every one is in the
 * loader of Level Zero 1.x (the loader exports the whole core API whatever its drivers
 * implement; a driver that lacks one answers ZE_RESULT_ERROR_UNSUPPORTED_FEATURE). */
#define SL_ZE_FUNCTIONS(X)                                                                            \
  X(Init) X(DriverGet) X(DriverGetApiVersion) X(DriverGetExtensionFunctionAddress)                   \
  X(DriverGetExtensionProperties)                                                                     \
  X(DeviceGet) X(DeviceGetProperties) X(DeviceGetMemoryProperties) X(DeviceGetCommandQueueGroupProperties) \
  X(DevicePciGetPropertiesExt)                                                                        \
  X(ContextCreate) X(ContextDestroy)                                                                  \
  X(MemAllocDevice) X(MemAllocHost) X(MemFree) X(MemGetAllocProperties) X(MemGetAddressRange)         \
  X(CommandListCreateImmediate) X(CommandListDestroy) X(CommandListAppendMemoryCopy)                  \
  X(CommandListAppendMemoryCopyRegion)                                                                \
  X(CommandListAppendBarrier) X(CommandListAppendWaitOnEvents)                                        \
  X(EventPoolCreate) X(EventPoolDestroy) X(EventCreate) X(EventDestroy) X(EventHostSynchronize)       \
  X(EventQueryStatus) X(EventHostReset) X(EventHostSignal)                                           \
  X(DeviceGetModuleProperties) X(ModuleCreate) X(ModuleDestroy) X(ModuleBuildLogGetString)            \
  X(ModuleBuildLogDestroy) X(KernelCreate) X(KernelDestroy) X(KernelSuggestGroupSize)                 \
  X(KernelSetGroupSize) X(KernelSetArgumentValue) X(CommandListAppendLaunchKernel)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
/* Each member has the type of the header's declaration, so a call through it is checked as a
 * direct call would be. */
typedef struct sl_ze_rt {
#define SL_ZE_MEMBER(n) __typeof__(&ze##n) n;
  SL_ZE_FUNCTIONS(SL_ZE_MEMBER)
#undef SL_ZE_MEMBER
} sl_ze_rt;
#pragma GCC diagnostic pop

/* The table, valid once sl__ze_ready() said 1. */
extern sl_ze_rt sl__ze;

/* Opens SONAME into *RT: 1, or 0 with WHY ("libze_loader.so.1 not found (...)", not prefixed
 * with the module's name). Never closed (the loader keeps its drivers loaded). */
int sl__ze_open_lib(const char *soname, sl_ze_rt *rt, char *why, size_t len);

/* Opens SL_ZE_LIB and calls zeInit (GPU drivers only) once per process (thread-safe): 1 when
 * the table is usable and zeInit succeeded; else 0, and sl__ze_why() says why. */
int sl__ze_ready(void);
/* Why Level Zero cannot be used ("" while it can, or before sl__ze_ready). */
const char *sl__ze_why(void);
/* zeInit's result (ZE_RESULT_SUCCESS before it ran). */
ze_result_t sl__ze_init_result(void);

/* "ZE_RESULT_ERROR_DEVICE_LOST" (or "ze_result_t 0x..." for a code this header does not know). */
const char *sl__ze_result_name(ze_result_t r, char *buf, size_t len);

/* The backend's probe: "level_zero: N GPU devices" (10), or 0 and why not:
 * "level_zero: libze_loader.so.1 not found (...)", "level_zero: no driver
 * (ZE_RESULT_ERROR_UNINITIALIZED; ...)", "level_zero: no GPU device (...)". Creates no context
 * and allocates nothing. */
int sl__ze_probe(char *reason, size_t len);

#endif
