/* kernels.cl compiled as host C (kernels_map.h's host half), and the table that finds its
 * kernels by name (kernels_host.h, kernels_table.h). Built with -fno-strict-aliasing: the
 * aligned kernels read the driver's untyped buffers through typed pointers, as the device does. */
#include "kernels.cl"

/* a host kernel takes its work-item first */
#define SLZ_INVOKE(fn, gid, gsize, ...)   \
  do {                                    \
    const slz_item it = {(gid), (gsize)}; \
    fn(&it, __VA_ARGS__);                 \
  } while (0)
#include "kernels_table.h"
