/* The SPIR-V modules themselves, run on the host: each module the build made (and spirv-val
 * passed) is translated back to LLVM IR (llvm-spirv -r), retargeted to this host
 * (spirv_to_host.cmake) and compiled by clang, so that test_ze_spirv_run runs test_ze_kernels'
 * checks on what the translator wrote, not only on the source it started from. This file gives
 * those kernels the OpenCL built-ins they call and the by-name table (kernels_table.h).
 *
 * The built-ins by their Itanium-mangled OpenCL names: the work-item of the launch in progress
 * (one thread launches at a time), and mad as a fused multiply-add, the contraction a device may
 * make: a kernel that came to use it would differ from the host SGD step here too. A built-in
 * not given here is an undefined symbol at link time, which names it. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels_map.h"
#include "ze_kernels.h"

static _Thread_local size_t cur_gid, cur_gsize;

size_t _Z13get_global_idj(unsigned dim);
size_t _Z15get_global_sizej(unsigned dim);
float _Z3madfff(float a, float b, float c);
double _Z3madddd(double a, double b, double c);
size_t _Z13get_global_idj(unsigned dim) { return dim == 0 ? cur_gid : 0; }
size_t _Z15get_global_sizej(unsigned dim) { return dim == 0 ? cur_gsize : 1; }
float _Z3madfff(float a, float b, float c) { return fmaf(a, b, c); }
double _Z3madddd(double a, double b, double c) { return fma(a, b, c); }

/* The kernels as the modules define them (OpenCL C's signatures without address spaces). */
#define SLZ_DECL_CAST(s, d)                                                    \
  void sl_cast_##s##_##d(uint8_t *dst, const uint8_t *src, uint64_t n);        \
  void sl_cast_##s##_##d##_bytes(uint8_t *dst, const uint8_t *src, uint64_t n);
#define SLZ_DECL_SGD(dt) void sl_sgd_##dt(SLZ_BITS_##dt *x, const SLZ_BITS_##dt *g, uint64_t n, float lr);
SL_ZE_CASTS_BASE(SLZ_DECL_CAST)
SL_ZE_CASTS_F64(SLZ_DECL_CAST)
SL_ZE_SGD_BASE(SLZ_DECL_SGD)
SL_ZE_SGD_F64(SLZ_DECL_SGD)

#define SLZ_INVOKE(fn, gid, gsize, ...) \
  do {                                  \
    cur_gid = (gid);                    \
    cur_gsize = (gsize);                \
    fn(__VA_ARGS__);                    \
  } while (0)
#include "kernels_table.h"
