/* The map that compiles kernels.cl twice from one text, as vendor_hip.h maps the CUDA sources:
 *   - as OpenCL C for SPIR-V (clang -cl-std=CL2.0 -target spir64, then llvm-spirv): the
 *     fixed-width integer types cuda_convert.h uses, and OpenCL's own kernel words;
 *   - as host C (kernels_host.c, for the Level Zero test driver and test_ze_kernels): a kernel
 *     is a plain function that takes its work-item (global id and size) as a first argument,
 *     so the driver runs the very kernels the device would, by name, one work-item at a time.
 * SLZ_KERNEL     a kernel's storage and kind;
 * SLZ_ITEM       the host's leading work-item parameter (nothing in OpenCL C);
 * SLZ_GID/GSIZE  the work-item's global id and the grid's global size (dimension 0);
 * SLZ_GLOBAL     the address space of the kernels' buffers;
 * SLZ_FN         a helper function;
 * SLZ_BITS_<dt>  the raw bits of a dtype token of ze_kernels.h (values never pass through float
 *                registers unconverted). */
#ifndef SHARDLOAD_ZE_KERNELS_MAP_H
#define SHARDLOAD_ZE_KERNELS_MAP_H

#ifdef __OPENCL_C_VERSION__
typedef uchar uint8_t;
typedef ushort uint16_t;
typedef uint uint32_t;
typedef ulong uint64_t;
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#define SLZ_KERNEL kernel
#define SLZ_ITEM
#define SLZ_GID get_global_id(0)
#define SLZ_GSIZE get_global_size(0)
#define SLZ_GLOBAL global
#define SLZ_FN static inline
#else
#include <stddef.h>
#include <stdint.h>

typedef struct slz_item {
  size_t gid;   /* this work-item's global id: 0 .. gsize - 1 */
  size_t gsize; /* the grid's work-items: group count times group size */
} slz_item;
#define SLZ_KERNEL static
#define SLZ_ITEM const slz_item *slz_it,
#define SLZ_GID (slz_it->gid)
#define SLZ_GSIZE (slz_it->gsize)
#define SLZ_GLOBAL
#define SLZ_FN static inline
#endif

#define SLZ_BITS_f64 uint64_t
#define SLZ_BITS_f32 uint32_t
#define SLZ_BITS_f16 uint16_t
#define SLZ_BITS_bf16 uint16_t

#endif
