/* The Level Zero kernels run on the host by name: every kernel ze_kernels.h names, with its
 * module and argument sizes, runnable one work-item at a time. Two implementations of this API
 * (both through kernels_table.h):
 *   kernels_host.c  kernels.cl compiled as host C: for the Level Zero test driver, which runs
 *                   the project's own SPIR-V kernels by their names through the same source the
 *                   device runs, and for test_ze_kernels;
 *   spirv_run.c     the built SPIR-V modules translated back and compiled for the host: for
 *                   test_ze_spirv_run, the same checks on what the translator wrote.
 * Tests only: never part of the module.
 *
 * Arguments are passed as the driver received them from zeKernelSetArgumentValue: ARGS[i]
 * points at argument i's bytes (for a buffer, a pointer's value: the test driver's device
 * memory is host memory that its own calls may touch), of exactly arg_size[i] bytes. */
#ifndef SHARDLOAD_ZE_KERNELS_HOST_H
#define SHARDLOAD_ZE_KERNELS_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "ze_kernels.h"

#define SL_ZE_KERNEL_MAX_ARGS 4

typedef struct sl__ze_host_kernel {
  const char *name; /* as in the SPIR-V module, e.g. "sl_cast_f32_bf16" */
  int module;       /* SL_ZE_MODULE_BASE or SL_ZE_MODULE_F64: the module that holds it */
  unsigned nargs;
  size_t arg_size[SL_ZE_KERNEL_MAX_ARGS];
  /* Runs work-item GID of a grid of GSIZE work-items (GID < GSIZE); the items of one launch may
   * run in any order, or concurrently (each writes only its own elements). */
  void (*run)(size_t gid, size_t gsize, const void *const *args);
} sl__ze_host_kernel;

/* The kernel named NAME; NULL if there is none (zeKernelCreate's ZE_RESULT_ERROR_INVALID_KERNEL_NAME),
 * or if it is not in module MODULE (pass -1 for any module). */
const sl__ze_host_kernel *sl__ze_host_kernel_find(const char *name, int module);

/* Every kernel, I = 0 .. sl__ze_host_kernel_count() - 1 (the order of ze_kernels.h). */
size_t sl__ze_host_kernel_count(void);
const sl__ze_host_kernel *sl__ze_host_kernel_at(size_t i);

/* Runs every work-item of a grid of GSIZE items, in order. */
void sl__ze_host_kernel_launch(const sl__ze_host_kernel *k, const void *const *args, size_t gsize);

/* ---- what a SPIR-V module holds (spirv_scan.c) ----------------------------------------------
 * For the test driver's zeModuleCreate, which must accept only what a real driver would: a
 * well-formed module, whose kernels (its Kernel entry points) it can then create by name, and
 * that declares Float64 only where the device has fp64. */
#define SL_ZE_SPIRV_MAX_KERNELS 64

typedef struct sl__ze_spirv_info {
  uint32_t version; /* the header's: 0x00010000 is SPIR-V 1.0 */
  int float64;      /* declares the Float64 capability */
  size_t nkernels;
  const char *kernel[SL_ZE_SPIRV_MAX_KERNELS]; /* entry point names, NUL-terminated, inside IL */
} sl__ze_spirv_info;

/* Reads the SIZE bytes at IL (a SPIR-V module, host-endian words) into *INFO. 0 when well
 * formed; -1 otherwise, with the reason in WHY ("SPIR-V: ...", at most WHY_LEN bytes). Checks
 * the header, every instruction's length, and each entry point's name; not the semantics
 * (spirv-val did, at build time, for the project's own modules). */
int sl__ze_spirv_scan(const void *il, size_t size, sl__ze_spirv_info *info, char *why, size_t why_len);

#endif
