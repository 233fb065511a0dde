/* The fake HIP runtime's other functions (fake_hip.c says what it is for): every function the
 * module's table resolves (hip_rt_fns.h), exported weak and failing with hipErrorNotSupported
 * (801); fake_hip.c defines the few the launch test answers. No HIP header: the names only. */
#include "hip_rt_fns.h"

#define STUB(n) \
  __attribute__((weak, visibility("default"))) int hip##n(void) { return 801; }
SL_HIP_FUNCTIONS(STUB)
STUB(HostMalloc)
STUB(HostFree)
