/* Host-memory kernels shared by backends whose memory the host addresses (cpu, sim). */
#include <math.h>
#include <stdlib.h>

#include "internal.h"

sl_status sl__host_sgd_step(void *x, const void *g, sl_dtype dt, size_t count, float lr) {
  switch (dt) {
    case SL_DTYPE_F64: {
      double *xd = x;
      const double *gd = g;
      for (size_t i = 0; i < count; i++) xd[i] -= (double)lr * gd[i];
      return SL_OK;
    }
    case SL_DTYPE_F32: {
      float *xf = x;
      const float *gf = g;
      for (size_t i = 0; i < count; i++) xf[i] -= lr * gf[i];
      return SL_OK;
    }
    case SL_DTYPE_F16:
    case SL_DTYPE_BF16: {
      /* compute in F32 and round back, as torch does for reduced-precision parameters */
      enum { BLOCK = 1024 };
      float xf[BLOCK], gf[BLOCK];
      const size_t es = sl_dtype_size(dt);
      for (size_t i = 0; i < count; i += BLOCK) {
        size_t n = count - i < BLOCK ? count - i : BLOCK;
        sl_convert(xf, SL_DTYPE_F32, (char *)x + i * es, dt, n);
        sl_convert(gf, SL_DTYPE_F32, (const char *)g + i * es, dt, n);
        for (size_t k = 0; k < n; k++) xf[k] -= lr * gf[k];
        sl_convert((char *)x + i * es, dt, xf, SL_DTYPE_F32, n);
      }
      return SL_OK;
    }
    default:
      return SL_ERR_DTYPE;
  }
}
