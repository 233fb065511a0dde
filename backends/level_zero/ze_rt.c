/* The Level Zero loader table (ze_rt.h): libze_loader.so.1 opened and initialised once per
 * process, on the first call, and what the module says when it cannot be. */
#define _GNU_SOURCE
#include "ze_rt.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

sl_ze_rt sl__ze;
static int g_state; /* 1 usable, -1 cannot be, 0 not tried (atomic) */
static ze_result_t g_init_result = ZE_RESULT_SUCCESS;
static char g_why[512];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

const char *sl__ze_result_name(ze_result_t r, char *buf, size_t len) {
  switch (r) {
#define SL_ZE_NAME(n) \
  case n: return #n;
    SL_ZE_NAME(ZE_RESULT_SUCCESS) SL_ZE_NAME(ZE_RESULT_NOT_READY) SL_ZE_NAME(ZE_RESULT_ERROR_DEVICE_LOST)
    SL_ZE_NAME(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY) SL_ZE_NAME(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)
    SL_ZE_NAME(ZE_RESULT_ERROR_MODULE_BUILD_FAILURE) SL_ZE_NAME(ZE_RESULT_ERROR_MODULE_LINK_FAILURE)
    SL_ZE_NAME(ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET) SL_ZE_NAME(ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE)
    SL_ZE_NAME(ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS) SL_ZE_NAME(ZE_RESULT_ERROR_NOT_AVAILABLE)
    SL_ZE_NAME(ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE) SL_ZE_NAME(ZE_RESULT_ERROR_UNINITIALIZED)
    SL_ZE_NAME(ZE_RESULT_ERROR_UNSUPPORTED_VERSION) SL_ZE_NAME(ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)
    SL_ZE_NAME(ZE_RESULT_ERROR_INVALID_ARGUMENT) SL_ZE_NAME(ZE_RESULT_ERROR_INVALID_NULL_HANDLE)
    SL_ZE_NAME(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE) SL_ZE_NAME(ZE_RESULT_ERROR_INVALID_NULL_POINTER)
    SL_ZE_NAME(ZE_RESULT_ERROR_INVALID_SIZE) SL_ZE_NAME(ZE_RESULT_ERROR_UNSUPPORTED_SIZE)
    SL_ZE_NAME(ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT) SL_ZE_NAME(ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT)
    SL_ZE_NAME(ZE_RESULT_ERROR_INVALID_ENUMERATION) SL_ZE_NAME(ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION)
    SL_ZE_NAME(ZE_RESULT_ERROR_INVALID_NATIVE_BINARY) SL_ZE_NAME(ZE_RESULT_ERROR_INVALID_KERNEL_NAME)
    SL_ZE_NAME(ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE) SL_ZE_NAME(ZE_RESULT_ERROR_OVERLAPPING_REGIONS)
    SL_ZE_NAME(ZE_RESULT_ERROR_UNKNOWN)
#undef SL_ZE_NAME
  default:
    snprintf(buf, len, "ze_result_t 0x%x", (unsigned)r);
    return buf;
  }
}

int sl__ze_open_lib(const char *soname, sl_ze_rt *rt, char *why, size_t len) {
  memset(rt, 0, sizeof *rt);
  dlerror();
  /* RTLD_LOCAL: the loader's symbols stay out of the process's namespace (torch may bring its
   * own); NODELETE: a loader with drivers loaded is never unloaded */
  void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!h) {
    const char *e = dlerror();
    snprintf(why, len, "%s not found (%s): install the Level Zero loader (Debian: libze1) and an Intel GPU "
             "driver (intel-level-zero-gpu), or add their lib directory to LD_LIBRARY_PATH",
             soname, e ? e : "dlopen failed");
    return 0;
  }
  struct {
    const char *name;
    void **slot;
  } fns[] = {
#define SL_ZE_SLOT(n) {"ze" #n, (void **)&rt->n},
      SL_ZE_FUNCTIONS(SL_ZE_SLOT)
#undef SL_ZE_SLOT
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
    if (!(*fns[i].slot = dlsym(h, fns[i].name))) {
      snprintf(why, len, "%s lacks %s: this module needs a Level Zero loader of API 1.3 or later (libze1 1.8 or "
               "later)", soname, fns[i].name);
      return 0;
    }
  return 1;
}

static void open_once(void) {
  sl_ze_rt rt;
  if (!sl__ze_open_lib(SL_ZE_LIB, &rt, g_why, sizeof g_why)) {
    __atomic_store_n(&g_state, -1, __ATOMIC_RELEASE);
    return;
  }
  /* GPU drivers only: the module drives GPUs (a VPU or an FPGA driver is not for it). The
   * loader reads ZE_ENABLE_ALT_DRIVERS (the test driver) here. */
  ze_result_t r = rt.Init(ZE_INIT_FLAG_GPU_ONLY);
  g_init_result = r;
  if (r != ZE_RESULT_SUCCESS) {
    char nb[32];
    snprintf(g_why, sizeof g_why, "no driver (%s from zeInit: no Level Zero GPU driver is installed or none "
             "loads; install intel-level-zero-gpu, check that this user may open /dev/dri/renderD* (the render "
             "group), and ZE_ENABLE_ALT_DRIVERS if set)", sl__ze_result_name(r, nb, sizeof nb));
    __atomic_store_n(&g_state, -1, __ATOMIC_RELEASE);
    return;
  }
  sl__ze = rt;
  __atomic_store_n(&g_state, 1, __ATOMIC_RELEASE);
}

int sl__ze_ready(void) {
  if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) > 0) return 1;
  pthread_once(&g_once, open_once);
  return __atomic_load_n(&g_state, __ATOMIC_ACQUIRE) > 0;
}

const char *sl__ze_why(void) { return __atomic_load_n(&g_state, __ATOMIC_ACQUIRE) < 0 ? g_why : ""; }

ze_result_t sl__ze_init_result(void) { return g_init_result; }

int sl__ze_probe(char *reason, size_t len) {
  char buf[640], nb[32];
  int score = 0;
  uint32_t ndrv = 0, ngpu = 0;
  if (!sl__ze_ready()) {
    snprintf(buf, sizeof buf, "level_zero: %s", g_why); /* the core appends what to do */
    goto out;
  }
  ze_result_t r = sl__ze.DriverGet(&ndrv, NULL);
  if (r != ZE_RESULT_SUCCESS || ndrv == 0) {
    snprintf(buf, sizeof buf, "level_zero: no driver (%s from zeDriverGet; install intel-level-zero-gpu)",
             r == ZE_RESULT_SUCCESS ? "no driver" : sl__ze_result_name(r, nb, sizeof nb));
    goto out;
  }
  ze_driver_handle_t drv[16];
  if (ndrv > 16) ndrv = 16;
  if ((r = sl__ze.DriverGet(&ndrv, drv)) != ZE_RESULT_SUCCESS) {
    snprintf(buf, sizeof buf, "level_zero: no driver (%s from zeDriverGet)", sl__ze_result_name(r, nb, sizeof nb));
    goto out;
  }
  for (uint32_t d = 0; d < ndrv; d++) {
    uint32_t n = 0;
    if (sl__ze.DeviceGet(drv[d], &n, NULL) != ZE_RESULT_SUCCESS || n == 0) continue;
    ze_device_handle_t dev[64];
    if (n > 64) n = 64;
    if (sl__ze.DeviceGet(drv[d], &n, dev) != ZE_RESULT_SUCCESS) continue;
    for (uint32_t i = 0; i < n; i++) {
      ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
      if (sl__ze.DeviceGetProperties(dev[i], &p) == ZE_RESULT_SUCCESS && p.type == ZE_DEVICE_TYPE_GPU) ngpu++;
    }
  }
  if (ngpu == 0) {
    snprintf(buf, sizeof buf, "level_zero: no GPU device (%u driver%s, none with a GPU; check ZE_AFFINITY_MASK and "
             "that this user may open /dev/dri/renderD*: the render group)", ndrv, ndrv == 1 ? "" : "s");
    goto out;
  }
  snprintf(buf, sizeof buf, "level_zero: %u GPU device%s", ngpu, ngpu == 1 ? "" : "s");
  score = 10; /* above cpu's 1: a GPU wins "auto" */
out:
  if (reason && len) snprintf(reason, len, "%s", buf);
  return score;
}
