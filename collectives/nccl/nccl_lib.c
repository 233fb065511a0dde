/* libnccl.so.2, opened at run time: the module must load, and its probe explain, on machines
 * without NCCL (module.h: a missing vendor runtime is a reason, not a load failure). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_internal.h"

static sl_nccl_lib g_lib;
static const sl_nccl_lib *g_ok;
static char g_why[512];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void load(void) {
  /* RTLD_LOCAL: NCCL's symbols stay out of the process's global namespace (another copy, e.g.
   * torch's, may be loaded beside it). Never closed: NCCL starts threads of its own.
   * Inside a torch job the copy torch loaded is found by its soname, whatever its directory;
   * else the loader's search; else $SL_CCL_ENV, which the Python package points at the
   * nvidia-nccl wheel's library (a pip-installed torch's NCCL, not on the loader's path). */
  void *h = dlopen(SL_CCL_LIB, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    char first[256];
    snprintf(first, sizeof first, "%s", e ? e : "dlopen failed");
    const char *alt = getenv(SL_CCL_ENV);
    if (alt && *alt) {
      h = dlopen(alt, RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        e = dlerror();
        snprintf(g_why, sizeof g_why, SL_CCL_NAME ": " SL_CCL_LIB " not found (%s), and $" SL_CCL_ENV "=%s does not "
                                      "load (%s); install " SL_CCL_PRODUCT ", fix or unset " SL_CCL_ENV ", or use "
                                      "--collective gloo", first, alt, e ? e : "dlopen failed");
        return;
      }
    } else {
      snprintf(g_why, sizeof g_why, SL_CCL_NAME ": " SL_CCL_LIB " not found (%s); install " SL_CCL_PRODUCT " (inside "
                                    "a torch job: import torch first, or pip install the nvidia NCCL wheel) or add "
                                    "its directory to LD_LIBRARY_PATH, or use --collective gloo", first);
      return;
    }
  }
  /* the release first: an older one lacks functions, and its number says more than which */
  ncclResult_t (*version)(int *) = (ncclResult_t(*)(int *))dlsym(h, "ncclGetVersion");
  int v = 0;
  if (version && version(&v) == ncclSuccess && v < SL_CCL_MIN_VERSION) {
    int major = v >= 20900 ? v / 10000 : v / 1000, minor = v >= 20900 ? v / 100 % 100 : v / 100 % 10;
    snprintf(g_why, sizeof g_why, SL_CCL_NAME ": " SL_CCL_LIB " is " SL_CCL_PRODUCT " %d.%d.%d, older than the "
                                  SL_CCL_MIN_TEXT " this module needs (ncclCommSplit, non-blocking init); install a "
                                  "newer one, or use --collective gloo", major, minor, v % 100);
    return;
  }
  struct {
    const char *name;
    void **slot;
  } fns[] = {
#define FN(n) {"nccl" #n, (void **)&g_lib.n} /* RCCL keeps NCCL's names */
      FN(GetVersion),   FN(GetUniqueId), FN(CommInitRankConfig), FN(CommGetAsyncError), FN(CommAbort),
      FN(CommFinalize), FN(CommDestroy), FN(CommSplit),          FN(CommCount),         FN(CommUserRank),
      FN(Broadcast),    FN(Send),        FN(Recv),               FN(AllGather),         FN(GroupStart),
      FN(GroupEnd),     FN(GetErrorString), FN(GetLastError),
#undef FN
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    *fns[i].slot = dlsym(h, fns[i].name);
    if (!*fns[i].slot) {
      snprintf(g_why, sizeof g_why, SL_CCL_NAME ": " SL_CCL_LIB " lacks %s (older than " SL_CCL_MIN_TEXT "?); install "
                                    SL_CCL_MIN_TEXT " or newer, or use --collective gloo", fns[i].name);
      return; /* H stays open: harmless, and closing NCCL is not safe once it ran */
    }
  }
  if (g_lib.GetVersion(&g_lib.version) != ncclSuccess) g_lib.version = 0;
  g_ok = &g_lib;
}

const sl_nccl_lib *sl__nccl_lib(char *why, size_t len) {
  pthread_once(&g_once, load);
  if (!g_ok && why && len) snprintf(why, len, "%s", g_why);
  return g_ok;
}

void sl__nccl_describe(const sl_nccl_lib *L, ncclComm_t comm, ncclResult_t r, char *buf, size_t len) {
  const char *last = L->GetLastError ? L->GetLastError(comm) : NULL;
  snprintf(buf, len, "%s%s%s", L->GetErrorString(r), last && *last ? ": " : "", last && *last ? last : "");
}
