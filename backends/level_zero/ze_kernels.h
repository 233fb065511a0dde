/* The Level Zero backend's SPIR-V kernels by name: which kernels exist, in which of the two
 * SPIR-V modules each lives, and their arguments. One list, read by three parties:
 *   - kernels.cl, which defines every kernel named here (compiled to SPIR-V at build time, and
 *     as host C by kernels_host.c);
 *   - the module, which creates them by name (zeKernelCreate) from the module that holds them;
 *   - the test driver, which runs them by name through their host build (kernels_host.h).
 *
 * Two modules, because many Intel GPUs have no fp64 and a SPIR-V module that declares Float64
 * does not build there:
 *   SL_ZE_MODULE_BASE  casts and SGD steps between F32, F16 and BF16: every device;
 *   SL_ZE_MODULE_F64   those with an F64 side: only devices that report
 *                      ZE_DEVICE_MODULE_FLAG_FP64 (elsewhere the module runs them on the host).
 *
 * Arguments (zeKernelSetArgumentValue index: type):
 *   casts  "sl_cast_<src>_<dst>" (element-aligned pointers), "sl_cast_<src>_<dst>_bytes" (any
 *          byte offset: moves bytes, as a misaligned wide access faults on a GPU):
 *          0: global uchar *dst, 1: const global uchar *src, 2: ulong count
 *   SGD    "sl_sgd_<dt>" (x -= lr * g, rounded as core/src/hostops.c: F16/BF16 in F32):
 *          0: global <dt> *x, 1: const global <dt> *g, 2: ulong count, 3: float lr
 * F32 subnormals: OpenCL lets a device flush them (a device that keeps them reports
 * ZE_DEVICE_FP_FLAG_DENORM in ze_device_module_properties_t.fp32flags; the module must never
 * build with -cl-denorms-are-zero). The base module's casts give the same bits either way
 * (their only FPU steps neither take nor make a subnormal that changes a result); the F64
 * casts ((float)double, (double)float) and every SGD step do not, so the module runs those on
 * the host where the device flushes (SL_ZE_NEEDS_F32_DENORMALS; test_ze_kernels proves both
 * sides with x86's flush-to-zero on).
 * Every kernel strides over the whole grid (i = global id; i < count; i += global size), so any
 * group size and group count cover COUNT elements; the global offset must be zero.
 *
 * Compiles as C (the module, the test driver) and as OpenCL C (kernels.cl). */
#ifndef SHARDLOAD_ZE_KERNELS_H
#define SHARDLOAD_ZE_KERNELS_H

#define SL_ZE_MODULE_BASE 0
#define SL_ZE_MODULE_F64 1
#define SL_ZE_MODULE_COUNT 2

/* X(src, dst): the casts, by dtype token (f64 f32 f16 bf16, as cuda_convert.h's slc_<s>_to_<d>) */
#define SL_ZE_CASTS_BASE(X) X(f32, f16) X(f32, bf16) X(f16, f32) X(f16, bf16) X(bf16, f32) X(bf16, f16)
#define SL_ZE_CASTS_F64(X) X(f64, f32) X(f64, f16) X(f64, bf16) X(f32, f64) X(f16, f64) X(bf16, f64)
/* X(dt): the SGD steps */
#define SL_ZE_SGD_BASE(X) X(f32) X(f16) X(bf16)
#define SL_ZE_SGD_F64(X) X(f64)

/* Whether the kernels of MODULE (SGD: SGD steps, else casts) need the device to keep F32
 * subnormals (above). */
#define SL_ZE_NEEDS_F32_DENORMALS(module, sgd) ((sgd) || (module) == SL_ZE_MODULE_F64)

#define SL_ZE_CAST_NAME(s, d) "sl_cast_" #s "_" #d
#define SL_ZE_CAST_BYTES_NAME(s, d) "sl_cast_" #s "_" #d "_bytes"
#define SL_ZE_SGD_NAME(dt) "sl_sgd_" #dt

#ifndef __OPENCL_C_VERSION__
#include <stddef.h>
#include <string.h>

#include "shardload/shardload.h"

/* The dtype of a token above (f64 -> SL_DTYPE_F64, ...). */
#define SL_ZE_DTYPE_f64 SL_DTYPE_F64
#define SL_ZE_DTYPE_f32 SL_DTYPE_F32
#define SL_ZE_DTYPE_f16 SL_DTYPE_F16
#define SL_ZE_DTYPE_bf16 SL_DTYPE_BF16

/* The kernel that casts SRC_DT to DST_DT (ALIGNED: both pointers element-aligned), and its
 * module in *MODULE; NULL for a pair no kernel casts (same dtype, or not castable). */
static inline const char *sl__ze_cast_kernel(sl_dtype src_dt, sl_dtype dst_dt, int aligned, int *module) {
#define SL_ZE_CAST_CASE(s, d, mod)                                                                   \
  if (src_dt == SL_ZE_DTYPE_##s && dst_dt == SL_ZE_DTYPE_##d)                                        \
    return *module = (mod), aligned ? SL_ZE_CAST_NAME(s, d) : SL_ZE_CAST_BYTES_NAME(s, d);
#define SL_ZE_CAST_CASE_BASE(s, d) SL_ZE_CAST_CASE(s, d, SL_ZE_MODULE_BASE)
#define SL_ZE_CAST_CASE_F64(s, d) SL_ZE_CAST_CASE(s, d, SL_ZE_MODULE_F64)
  SL_ZE_CASTS_BASE(SL_ZE_CAST_CASE_BASE)
  SL_ZE_CASTS_F64(SL_ZE_CAST_CASE_F64)
#undef SL_ZE_CAST_CASE_F64
#undef SL_ZE_CAST_CASE_BASE
#undef SL_ZE_CAST_CASE
  return NULL;
}

/* The SGD step's kernel for DT and its module in *MODULE; NULL where DT has none. */
static inline const char *sl__ze_sgd_kernel(sl_dtype dt, int *module) {
#define SL_ZE_SGD_CASE_BASE(t) \
  if (dt == SL_ZE_DTYPE_##t) return *module = SL_ZE_MODULE_BASE, SL_ZE_SGD_NAME(t);
#define SL_ZE_SGD_CASE_F64(t) \
  if (dt == SL_ZE_DTYPE_##t) return *module = SL_ZE_MODULE_F64, SL_ZE_SGD_NAME(t);
  SL_ZE_SGD_BASE(SL_ZE_SGD_CASE_BASE)
  SL_ZE_SGD_F64(SL_ZE_SGD_CASE_F64)
#undef SL_ZE_SGD_CASE_F64
#undef SL_ZE_SGD_CASE_BASE
  return NULL;
}
#endif /* !__OPENCL_C_VERSION__ */
#endif
