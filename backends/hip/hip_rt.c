/* The HIP runtime table (hip_rt.h): libamdhip64 opened once per process, on the first mapped
 * call, and what the modules say when it cannot be. */
#define _GNU_SOURCE
#include "hip_rt.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

sl_hip_rt sl__hip_rt;
int sl__hip_state;
static char g_why[512];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* The first of NAMES the runtime has, or NULL. */
static void *first_of(void *h, const char *const *names, size_t n) {
  for (size_t i = 0; i < n; i++) {
    void *f = dlsym(h, names[i]);
    if (f) return f;
  }
  return NULL;
}

int sl__hip_open_lib(const char *soname, sl_hip_rt *rt, char *why, size_t len) {
  memset(rt, 0, sizeof *rt);
  dlerror();
  /* RTLD_LOCAL: the runtime's symbols stay out of the process's namespace (torch may load its
   * own ROCm beside it); NODELETE: an initialised runtime is never unloaded */
  void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!h) {
    const char *e = dlerror();
    snprintf(why, len, "libamdhip64.so not found (%s); this module was built against " SL_HIP_BUILT_WITH
             " and needs its HIP runtime, %s: install that ROCm release (or add its lib directory to "
             "LD_LIBRARY_PATH)", e ? e : "dlopen failed", soname);
    return 0;
  }
  struct {
    const char *name;
    void **slot;
  } fns[] = {
  /* the name after macro expansion: ROCm 6 renames some (hipGetDeviceProperties ->
   * hipGetDevicePropertiesR0600) in its header, and the library exports the new name */
#define SL_HIP_SLOT(n) {SL_HIP_STR(hip##n), (void **)&rt->n},
      SL_HIP_FUNCTIONS(SL_HIP_SLOT)
#undef SL_HIP_SLOT
#define SL_HIP_SLOT(n) {"__hip" #n, (void **)&rt->n},
      SL_HIP_LAUNCH_FUNCTIONS(SL_HIP_SLOT)
#undef SL_HIP_SLOT
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
    if (!(*fns[i].slot = dlsym(h, fns[i].name))) {
      snprintf(why, len, "%s lacks %s: this module needs the HIP runtime of " SL_HIP_BUILT_WITH " or a later "
               SL_HIP_STR(HIP_VERSION_MAJOR) ".x", soname, fns[i].name);
      return 0;
    }
  /* both spellings exist in every release and do the same; the undeprecated one first */
#if HIP_VERSION_MAJOR >= 6
  const char *alloc[] = {"hipHostAlloc", "hipHostMalloc"}, *free_host[] = {"hipFreeHost", "hipHostFree"};
#else
  const char *alloc[] = {"hipHostMalloc", "hipHostAlloc"}, *free_host[] = {"hipHostFree", "hipFreeHost"};
#endif
  rt->HostAlloc = (hipError_t(*)(void **, size_t, unsigned int))first_of(h, alloc, 2);
  rt->FreeHost = (hipError_t(*)(void *))first_of(h, free_host, 2);
  if (!rt->HostAlloc || !rt->FreeHost) {
    snprintf(why, len, "%s lacks hipHostMalloc/hipHostFree: not a HIP runtime?", soname);
    return 0;
  }
  rt->LaunchHostFunc = (hipError_t(*)(hipStream_t, hipHostFn_t, void *))dlsym(h, "hipLaunchHostFunc");
  rt->ThreadExchangeStreamCaptureMode =
      (hipError_t(*)(hipStreamCaptureMode *))dlsym(h, "hipThreadExchangeStreamCaptureMode");
  return 1;
}

static void open_once(void) {
  sl_hip_rt rt;
  if (!sl__hip_open_lib(SL_HIP_LIB, &rt, g_why, sizeof g_why)) {
    __atomic_store_n(&sl__hip_state, -1, __ATOMIC_RELEASE);
    return;
  }
  sl__hip_rt = rt;
  sl__hip_launch_attach(); /* before any launch can go through the table */
  __atomic_store_n(&sl__hip_state, 1, __ATOMIC_RELEASE);
}

int sl__hip_open(void) {
  pthread_once(&g_once, open_once);
  return __atomic_load_n(&sl__hip_state, __ATOMIC_ACQUIRE) > 0;
}

const char *sl__hip_why(void) { return __atomic_load_n(&sl__hip_state, __ATOMIC_ACQUIRE) < 0 ? g_why : ""; }

const char *sl__hip_error_name(hipError_t e) {
  if (sl__hip_ready()) return sl__hip_rt.GetErrorName(e);
  return e == hipErrorInsufficientDriver ? "hipErrorInsufficientDriver" : "hipError (no HIP runtime)";
}

const char *sl__hip_error_string(hipError_t e) {
  if (sl__hip_ready()) return sl__hip_rt.GetErrorString(e);
  return e == hipErrorInsufficientDriver ? g_why : "no HIP runtime";
}

hipError_t sl__hip_get_last_error(void) {
  return sl__hip_ready() ? sl__hip_rt.GetLastError() : hipErrorInsufficientDriver;
}

hipError_t sl__hip_launch_host_func(hipStream_t stream, hipHostFn_t fn, void *user) {
  if (!sl__hip_ready()) return hipErrorInsufficientDriver;
  return sl__hip_rt.LaunchHostFunc ? sl__hip_rt.LaunchHostFunc(stream, fn, user) : hipErrorNotSupported;
}

hipError_t sl__hip_exchange_capture_mode(hipStreamCaptureMode *mode) {
  if (!sl__hip_ready()) return hipErrorInsufficientDriver;
  return sl__hip_rt.ThreadExchangeStreamCaptureMode ? sl__hip_rt.ThreadExchangeStreamCaptureMode(mode)
                                                    : hipErrorNotSupported;
}

#ifndef SL_HIP_ARCHS
#define SL_HIP_ARCHS "" /* a module without kernels (rccl) */
#endif
const char *sl__hip_archs(void) { return SL_HIP_ARCHS; }

int sl__hip_has_code_for(const char *arch) {
  size_t n = strcspn(arch, ":"); /* the processor; its features (sramecc, xnack) are not compared */
  for (const char *t = SL_HIP_ARCHS; *t;) {
    size_t m = strcspn(t, ":;");
    if (m == n && strncmp(t, arch, n) == 0) return 1;
    t += strcspn(t, ";");
    if (*t) t++;
  }
  return 0;
}

int sl__hip_probe(char *reason, size_t len) {
  char buf[640];
  int score = 0, n = 0;
  if (!sl__hip_open()) {
    snprintf(buf, sizeof buf, "hip: %s", g_why); /* the core appends what to do ("use --backend cpu") */
    goto out;
  }
  hipError_t e = sl__hip_rt.GetDeviceCount(&n);
  if (e == hipErrorNoDevice || (e == hipSuccess && n <= 0)) {
    snprintf(buf, sizeof buf, "hip: no ROCm device (%s; check HIP_VISIBLE_DEVICES and ROCR_VISIBLE_DEVICES, and that "
             "this user may open /dev/kfd and /dev/dri: the video and render groups)",
             e == hipSuccess ? "the runtime sees none" : "hipErrorNoDevice");
    goto out;
  }
  if (e != hipSuccess) {
    snprintf(buf, sizeof buf, "hip: no ROCm driver (hipGetDeviceCount: %s, error %d)", sl__hip_rt.GetErrorName(e),
             (int)e);
    goto out;
  }
  snprintf(buf, sizeof buf, "hip: %d device%s", n, n == 1 ? "" : "s");
  score = 10; /* above cpu's 1: a GPU wins "auto" */
out:
  if (reason && len) snprintf(reason, len, "%s", buf);
  return score;
}
