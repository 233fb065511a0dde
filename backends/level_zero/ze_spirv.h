/* The Level Zero backend's two SPIR-V modules (kernels.cl built at compile time; ze_kernels.h
 * names their kernels), embedded for zeModuleCreate (ZE_MODULE_FORMAT_IL_SPIRV):
 *   sl__ze_spirv_base  casts and SGD steps without F64: declares no Float64, builds everywhere;
 *   sl__ze_spirv_f64   those with an F64 side: declares Float64; create it only on a device that
 *                      reports ZE_DEVICE_MODULE_FLAG_FP64.
 * SPIR-V 1.0 (any ze_device_module_properties_t.spirvVersionSupported), the OpenCL environment,
 * every entry point ContractionOff. Build them with no build flags: -cl-mad-enable,
 * -cl-fast-relaxed-math, -cl-unsafe-math-optimizations and -cl-denorms-are-zero each undo a
 * rule the kernels' bit-exactness rests on (ze_kernels.h: F32 subnormals). */
#ifndef SHARDLOAD_ZE_SPIRV_H
#define SHARDLOAD_ZE_SPIRV_H

#include <stddef.h>

extern const unsigned char sl__ze_spirv_base[];
extern const size_t sl__ze_spirv_base_size;
extern const unsigned char sl__ze_spirv_f64[];
extern const size_t sl__ze_spirv_f64_size;

#endif
