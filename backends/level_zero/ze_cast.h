/* The level_zero backend's kernels on one device: its two SPIR-V modules (ze_spirv.h) built with
 * zeModuleCreate, and every kernel of ze_kernels.h created by name, with its group size, once at
 * init (ze_cast.c). Which of them run on the device is decided here, from what the device
 * reports (ze_device_module_properties_t):
 *   - the F64 module only where flags has ZE_DEVICE_MODULE_FLAG_FP64 (its SPIR-V declares
 *     Float64 and does not build elsewhere);
 *   - the kernels that need F32 subnormals (SL_ZE_NEEDS_F32_DENORMALS: the F64 casts, every SGD
 *     step) only where fp32flags has ZE_DEVICE_FP_FLAG_DENORM;
 * the rest run on the host (the core's casts, the module's own SGD fallback).
 *
 * Private to the module (hidden). Not thread-safe: built at init, read-only after, destroyed at
 * fini; a kernel's arguments are set and its launch appended under the backend's append lock. */
#ifndef SHARDLOAD_ZE_CAST_H
#define SHARDLOAD_ZE_CAST_H

#include <stddef.h>
#include <stdint.h>

#include "shardload/module.h"
#include "ze_kernels.h"
#include "ze_rt.h"

/* The most groups a launch takes: the kernels stride over the grid, so a larger COUNT reuses
 * the work-items (ze_kernels.h) rather than asking the device for millions of groups. */
#define SL_ZE_MAX_GROUPS 1024u

typedef struct sl_ze_kernel {
  const char *name;
  int module, sgd;
  ze_kernel_handle_t k; /* NULL: not on this device */
  uint32_t group_size;  /* zeKernelSuggestGroupSize's, set on K at creation */
} sl_ze_kernel;

typedef struct sl_ze_kernels {
  ze_module_handle_t mod[SL_ZE_MODULE_COUNT]; /* NULL: not built on this device */
  int fp64, f32_denorms;                      /* what the device reports */
  uint32_t max_groups;
  size_t n;
  sl_ze_kernel *tab; /* every kernel of ze_kernels.h */
} sl_ze_kernels;

/* Builds the modules and creates the kernels the device runs. SL_OK, or the failure with WHY
 * ("zeModuleCreate of the base cast module failed: ...: <build log>"); *K is then cleared. */
sl_status sl__ze_kernels_init(sl_ze_kernels *K, ze_context_handle_t ctx, ze_device_handle_t dev, char *why,
                              size_t len);
void sl__ze_kernels_fini(sl_ze_kernels *K);

/* Whether the kernels of MODULE (SGD: the SGD steps, else the casts) run on this device. */
int sl__ze_kernels_run(const sl_ze_kernels *K, int module, int sgd);
/* The kernel NAME when it runs on this device, else NULL. */
const sl_ze_kernel *sl__ze_kernel_get(const sl_ze_kernels *K, const char *name);
/* Why MODULE's kernels (SGD or casts) do not run here: "no fp64", "F32 subnormals flushed". */
const char *sl__ze_kernels_why_not(const sl_ze_kernels *K, int module, int sgd);
/* For describe: "casts on the device", "casts on the device (F64 on the host: no fp64)", ... */
void sl__ze_kernels_describe(const sl_ze_kernels *K, char *buf, size_t len);

#endif
