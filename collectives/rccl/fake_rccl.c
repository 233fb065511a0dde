/* A fake librccl.so.1 for test_rccl_module: what the module's loader reads of a real one (the
 * functions it resolves, ncclGetVersion) and nothing more; every other call fails. Built twice:
 * as RCCL 2.18.3 (ROCm 6.0, the oldest the module runs on) and, with SL_FAKE_RCCL_OLD, as
 * RCCL 2.17.3 (ROCm 5.7), which has no ncclCommSplit. Needs no HIP runtime (a real RCCL does). */
#include "rccl_abi.h"

#define API __attribute__((visibility("default")))

#ifdef SL_FAKE_RCCL_OLD
#define FAKE_VERSION NCCL_VERSION(2, 17, 3)
#else
#define FAKE_VERSION NCCL_VERSION(2, 18, 3)
#endif

API ncclResult_t ncclGetVersion(int *version) {
  *version = FAKE_VERSION;
  return ncclSuccess;
}
API const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "fake RCCL: no device"; }
API const char *ncclGetLastError(ncclComm_t comm) { return ""; }

/* the rest fail: the module must not reach them without a device */
#define FAIL(name) \
  API ncclResult_t name(void) { return ncclSystemError; }
FAIL(ncclGetUniqueId)
FAIL(ncclCommInitRankConfig)
FAIL(ncclCommGetAsyncError)
FAIL(ncclCommAbort)
FAIL(ncclCommFinalize)
FAIL(ncclCommDestroy)
FAIL(ncclCommCount)
FAIL(ncclCommUserRank)
FAIL(ncclBroadcast)
FAIL(ncclSend)
FAIL(ncclRecv)
FAIL(ncclAllGather)
FAIL(ncclGroupStart)
FAIL(ncclGroupEnd)
#ifndef SL_FAKE_RCCL_OLD
FAIL(ncclCommSplit)
#endif
