/* The CUDA backend as a loadable module (libshardload-cuda.so, ABI v2: shardload/module.h).
 *
 * It is thin on purpose: the loader's orchestration stays in the core, which the asynchronous
 * sim backend proves on CPU machines; this module maps the ABI onto CUDA one to one and must
 * keep sim's semantics (backends/sim/): ABI streams and events ARE CUDA streams and events
 * (SL_EXT_NATIVE_STREAM hands a stream's cudaStream_t to a collective of native API "cuda"),
 * the NULL stream is a module-created non-blocking stream (CUDA's legacy stream would
 * synchronise with every other stream), failures of enqueued work are sticky and reported by
 * the next sync, and no wait is unbounded (syncs poll; see cuda_stream.c).
 *
 * The module must LOAD on a machine without a driver: the CUDA runtime is linked statically
 * (it opens libcuda.so.1 itself, lazily) and probe opens libcuda.so.1 with dlopen so that it
 * can say why it cannot run. This file: errors, probe, init/fini, describe, the extensions and
 * the ops table. Memory is in cuda_mem.c; streams, events, copies and casts in cuda_stream.c. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "cuda_kernels.h"

/* ---- errors -------------------------------------------------------------------------------- */
static sl_status status_of(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation: return SL_ERR_NOMEM;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable: return SL_ERR_NO_DEVICE;
    default: return SL_ERR_BACKEND;
  }
}

/* Records MSG as the sticky error if none is (the first failure wins, like CUDA's own). */
void cu__set_sticky(cu_backend *s, sl_status st, const char *msg) {
  pthread_mutex_lock(&s->lock);
  if (s->err == SL_OK) {
    s->err = st;
    snprintf(s->errmsg, sizeof s->errmsg, "%s", msg);
  }
  pthread_mutex_unlock(&s->lock);
}

static sl_status report(cu_backend *s, int sticky, sl_status st, const char *msg) {
  if (sticky) cu__set_sticky(s, st, msg);
  return s->host->fail(s->host->core, st, "%s", msg);
}

sl_status cu__fail_cuda(cu_backend *s, int sticky, const char *call, cudaError_t e, const char *fmt, ...) {
  char what[CU_MSG_LEN / 2] = "", msg[CU_MSG_LEN];
  if (fmt && *fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
  }
  const char *rest, *pre = sl_vendor_call(call, &rest); /* the vendor's name of the call */
  snprintf(msg, sizeof msg, SL_GPU_NAME ":%d (local rank %d): %s%s failed: %s (%s)%s%s", s->dev, s->local_rank, pre,
           rest, cudaGetErrorName(e), cudaGetErrorString(e), what[0] ? "; " : "", what);
  return report(s, sticky, status_of(e), msg);
}

sl_status cu__fail(cu_backend *s, int sticky, sl_status st, const char *fmt, ...) {
  char what[CU_MSG_LEN - 64], msg[CU_MSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(msg, sizeof msg, SL_GPU_NAME ":%d (local rank %d): %s", s->dev, s->local_rank, what);
  return report(s, sticky, st, msg);
}

sl_status cu__sticky(cu_backend *s) {
  char msg[CU_MSG_LEN];
  pthread_mutex_lock(&s->lock);
  sl_status st = s->err;
  if (st != SL_OK) memcpy(msg, s->errmsg, sizeof msg);
  pthread_mutex_unlock(&s->lock);
  return st == SL_OK ? SL_OK : s->host->fail(s->host->core, st, "%s (an earlier failure on this device)", msg);
}

cudaError_t cu__bind(cu_backend *s) {
  int cur = -1;
  cudaError_t e = cudaGetDevice(&cur);
  if (e == cudaSuccess && cur == s->dev) return cudaSuccess;
  return cudaSetDevice(s->dev);
}

/* The driver's current context, not the runtime's current device: a thread with none current (a
 * fresh garbage collector's) gets none back, where cudaSetDevice(0) would make a context on
 * device 0. The capture mode: cudaThreadExchangeStreamCaptureMode, as torch's own guard does. */
cudaError_t cu__enter(cu_backend *s, cu_saved *sv) {
  sv->has_ctx = s->ctx_get && s->ctx_get(&sv->ctx) == 0;
  sv->mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&sv->mode) != cudaSuccess) sv->mode = cudaStreamCaptureModeRelaxed;
  return cu__bind(s);
}

void cu__leave(cu_backend *s, const cu_saved *sv) {
  enum cudaStreamCaptureMode mode = sv->mode;
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  if (sv->has_ctx) (void)s->ctx_set(sv->ctx);
}

/* ---- probe and the vendor's driver --------------------------------------------------------- */
#ifdef SL_VENDOR_HIP
/* HIP: the runtime through dlopen, then a device count (backends/hip/hip_rt.c). */
static int cu_probe(char *reason, size_t len) { return sl__hip_probe(reason, len); }

/* hipMemGetAddressRange, through the runtime table: is_device_ptr on foreign pointers. */
static int hip_range(unsigned long long *base, size_t *size, unsigned long long ptr) {
  hipDeviceptr_t b = NULL;
  int e = (int)sl__hip_rt.MemGetAddressRange(&b, size, (hipDeviceptr_t)(uintptr_t)ptr);
  *base = (unsigned long long)(uintptr_t)b;
  return e;
}
/* HIP's current device stands for CUDA's current context (cu__enter/cu__leave): hipGetDevice
 * on a thread that never chose one says 0 and makes nothing. */
static int hip_dev_get(void **saved) {
  int d = 0;
  int e = (int)cudaGetDevice(&d);
  *saved = (void *)(intptr_t)d;
  return e;
}
static int hip_dev_set(void *saved) { return (int)cudaSetDevice((int)(intptr_t)saved); }
static void open_range(cu_backend *s) {
  s->get_range = hip_range;
  s->ctx_get = hip_dev_get;
  s->ctx_set = hip_dev_set;
}

/* HIP has no JIT: a device whose processor the module has no code object for would fail every
 * kernel launch, so init refuses it, naming what was built. */
static sl_status check_device(cu_backend *s, const struct cudaDeviceProp *p) {
  if (sl__hip_has_code_for(p->gcnArchName)) return SL_OK;
  return cu__fail(s, 0, SL_ERR_NO_DEVICE, "the device is %.64s, and this module holds code for %s only; rebuild it "
                  "with -DSHARDLOAD_HIP_ARCHS naming the device's processor (gfx942 needs ROCm 6), or use --backend "
                  "cpu", p->gcnArchName, sl__hip_archs());
}
#else
#include <cuda.h>

/* Cheap and side-effect free for the process: the driver through dlopen (RTLD_NODELETE: the
 * runtime opens it again at init, and unloading an initialised driver is not safe), cuInit and
 * a device count. No context, no allocation. */
static int cu_probe(char *reason, size_t len) {
  char buf[512];
  int score = 0;
  dlerror();
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!h) {
    const char *e = dlerror();
    /* the core appends what to do ("use --backend cpu") */
    snprintf(buf, sizeof buf, "cuda: no CUDA driver (libcuda.so.1 not found: %s)", e ? e : "dlopen failed");
    goto out;
  }
  CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
  CUresult (*count)(int *) = (CUresult(*)(int *))dlsym(h, "cuDeviceGetCount");
  CUresult (*version)(int *) = (CUresult(*)(int *))dlsym(h, "cuDriverGetVersion");
  CUresult (*ename)(CUresult, const char **) = (CUresult(*)(CUresult, const char **))dlsym(h, "cuGetErrorName");
  if (!init || !count || !version) {
    snprintf(buf, sizeof buf, "cuda: no CUDA driver (libcuda.so.1 lacks cuInit/cuDeviceGetCount: not an NVIDIA driver?)");
    goto out_close;
  }
  int drv = 0;
  /* a driver of the same major version runs this runtime (CUDA minor version compatibility) */
  if (version(&drv) == CUDA_SUCCESS && drv / 1000 < CUDART_VERSION / 1000) {
    snprintf(buf, sizeof buf, "cuda: no CUDA driver (cudaErrorInsufficientDriver: the driver supports CUDA %d.%d, this "
                              "module needs %d.%d; update the NVIDIA driver)",
             drv / 1000, drv % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    goto out_close;
  }
  CUresult rc = init(0);
  const char *name = NULL;
  if (rc != CUDA_SUCCESS && (!ename || ename(rc, &name) != CUDA_SUCCESS)) name = NULL;
  if (rc == CUDA_ERROR_NO_DEVICE) {
    snprintf(buf, sizeof buf, "cuda: no device (cuInit: CUDA_ERROR_NO_DEVICE; check CUDA_VISIBLE_DEVICES)");
    goto out_close;
  }
  if (rc != CUDA_SUCCESS) {
    snprintf(buf, sizeof buf, "cuda: no CUDA driver (cuInit: %s, error %d)", name ? name : "unknown error", (int)rc);
    goto out_close;
  }
  int n = 0;
  if ((rc = count(&n)) != CUDA_SUCCESS) {
    if (!ename || ename(rc, &name) != CUDA_SUCCESS) name = NULL;
    snprintf(buf, sizeof buf, "cuda: no CUDA driver (cuDeviceGetCount: %s, error %d)", name ? name : "unknown error",
             (int)rc);
    goto out_close;
  }
  if (n <= 0) {
    snprintf(buf, sizeof buf, "cuda: no device (the driver sees none; check CUDA_VISIBLE_DEVICES)");
    goto out_close;
  }
  snprintf(buf, sizeof buf, "cuda: %d device%s", n, n == 1 ? "" : "s");
  score = 10; /* above cpu's 1: a GPU wins "auto" */
out_close:
  dlclose(h);
out:
  if (reason && len) snprintf(reason, len, "%s", buf);
  return score;
}

/* The driver is present (the runtime initialised): cuMemGetAddressRange for is_device_ptr, and
 * the current context's accessors for cu__enter/cu__leave. */
static void open_range(cu_backend *s) {
  s->libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!s->libcuda) return;
  s->get_range = (int (*)(unsigned long long *, size_t *, unsigned long long))dlsym(s->libcuda,
                                                                                    "cuMemGetAddressRange_v2");
  s->ctx_get = (int (*)(void **))dlsym(s->libcuda, "cuCtxGetCurrent");
  s->ctx_set = (int (*)(void *))dlsym(s->libcuda, "cuCtxSetCurrent");
  if (!s->ctx_get || !s->ctx_set) s->ctx_get = NULL, s->ctx_set = NULL;
}

/* Any device: the kernels carry PTX, which the driver compiles for a newer architecture. */
static sl_status check_device(cu_backend *s, const struct cudaDeviceProp *p) { return SL_OK; }
#endif

/* ---- init, fini, describe ------------------------------------------------------------------ */
static sl_status env_timeout(const sl_module_host *h, unsigned *out) {
  const char *v = getenv(SL_GPU_SYNC_TIMEOUT_ENV);
  *out = CU_DEFAULT_SYNC_TIMEOUT_S;
  if (!v || !*v) return SL_OK;
  char *end;
  errno = 0;
  unsigned long x = strtoul(v, &end, 10);
  if (*end || errno || v[0] == '-' || x == 0 || x > 86400)
    return h->fail(h->core, SL_ERR_INVALID, SL_GPU_NAME " backend: " SL_GPU_SYNC_TIMEOUT_ENV "='%s' is not a number "
                                            "of seconds from 1 to 86400", v);
  *out = (unsigned)x;
  return SL_OK;
}

static void cu_fini(void *be);

/* The device's identity among this machine's (module.h, device_identity): its PCI address, the
 * same in every process whatever CUDA_VISIBLE_DEVICES makes its ordinal there, written in one
 * spelling (lower-case hex, as NCCL writes bus ids) so that two ranks compare equal on one GPU.
 * The properties' address (function 0) when the runtime does not give the bus id. */
static void pci_identity(cu_backend *s, const struct cudaDeviceProp *p) {
  unsigned dom = (unsigned)p->pciDomainID, bus = (unsigned)p->pciBusID, dev = (unsigned)p->pciDeviceID, fn = 0;
  char raw[32] = "";
  unsigned a, b, c, d;
  if (cudaDeviceGetPCIBusId(raw, (int)sizeof raw - 1, s->dev) == cudaSuccess &&
      sscanf(raw, "%x:%x:%x.%x", &a, &b, &c, &d) == 4) {
    dom = a;
    bus = b;
    dev = c;
    fn = d;
  }
  snprintf(s->busid, sizeof s->busid, "%04x:%02x:%02x.%x", dom, bus, dev, fn);
}

/* Everything after the device is chosen; failures leave S for cu_fini to undo. */
static sl_status setup(cu_backend *s) {
  cudaError_t e;
  if ((e = cudaSetDevice(s->dev)) != cudaSuccess) return cu__fail_cuda(s, 0, "cudaSetDevice", e, NULL);
  if ((e = cudaStreamCreateWithFlags(&s->alloc_stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaStreamCreateWithFlags(&s->def, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaStreamCreateWithFlags(&s->release_stream, cudaStreamNonBlocking)) != cudaSuccess)
    return cu__fail_cuda(s, 0, "cudaStreamCreateWithFlags", e, "creating the module's streams");
  struct cudaMemPoolProps pp;
  memset(&pp, 0, sizeof pp);
  pp.allocType = cudaMemAllocationTypePinned;
  pp.handleTypes = cudaMemHandleTypeNone;
  pp.location.type = cudaMemLocationTypeDevice;
  pp.location.id = s->dev;
  if ((e = cudaMemPoolCreate(&s->pool, &pp)) != cudaSuccess)
    return cu__fail_cuda(s, 0, "cudaMemPoolCreate", e, "creating the module's memory pool");
  /* keep freed memory cached for the next allocation of the load; trimmed when none is live */
  uint64_t keep = UINT64_MAX;
  if ((e = cudaMemPoolSetAttribute(s->pool, cudaMemPoolAttrReleaseThreshold, &keep)) != cudaSuccess)
    return cu__fail_cuda(s, 0, "cudaMemPoolSetAttribute", e, "release threshold");
  /* memory freed behind a consumer's work (free_device_after) is not reused by an allocation on
   * another stream through a dependency the driver inserts: the allocation stream would wait for
   * the consumer's kernels. Reuse once the free has run (opportunistic) stays on. */
  int no = 0;
  if ((e = cudaMemPoolSetAttribute(s->pool, cudaMemPoolReuseAllowInternalDependencies, &no)) != cudaSuccess)
    return cu__fail_cuda(s, 0, "cudaMemPoolSetAttribute", e, "internal dependencies");
  struct cudaDeviceProp p;
  if ((e = cudaGetDeviceProperties(&p, s->dev)) != cudaSuccess)
    return cu__fail_cuda(s, 0, "cudaGetDeviceProperties", e, NULL);
  s->max_pitch = p.memPitch; /* cudaMemcpy2DAsync refuses larger pitches (copy_2d_async falls back) */
  sl_status st = check_device(s, &p);
  if (st != SL_OK) return st;
  pci_identity(s, &p);
  snprintf(s->desc, sizeof s->desc, SL_GPU_NAME ":%d %.120s, %.0f GiB, " SL_GPU_ARCH_FMT ", bus %04x:%02x:%02x.0",
           s->dev, p.name, (double)p.totalGlobalMem / (1024.0 * 1024 * 1024), SL_GPU_ARCH_ARGS(p),
           (unsigned)p.pciDomainID, (unsigned)p.pciBusID, (unsigned)p.pciDeviceID);
  open_range(s);
  return SL_OK;
}

static sl_status cu_init(const sl_backend_init *in, void **be) {
  const sl_module_host *h = in->host;
  if (in->variant && *in->variant)
    return h->fail(h->core, SL_ERR_INVALID, SL_GPU_NAME " backend: unknown variant '%s'; use --backend " SL_GPU_NAME
                                            " (and --device N to pick a device)", in->variant);
  unsigned timeout_s;
  sl_status st = env_timeout(h, &timeout_s);
  if (st != SL_OK) return st;
  /* without the variable: twice the job's timeout, so that the data collective's watchdog
   * (which aborts at the job's timeout) always fires first and says why */
  const char *env = getenv(SL_GPU_SYNC_TIMEOUT_ENV);
  if ((!env || !*env) && SL_INIT_GET(in, timeout_ms, 0) > 0)
    timeout_s = (unsigned)(2 * (in->timeout_ms / 1000) + 5);
  int local_rank = in->local_rank < 0 ? 0 : in->local_rank, count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    return h->fail(h->core, status_of(e) == SL_ERR_BACKEND ? SL_ERR_NO_DEVICE : status_of(e),
                   SL_GPU_NAME " (local rank %d): %sGetDeviceCount failed: %s (%s); " SL_GPU_INSTALL_HINT ", or use "
                   "--backend cpu", local_rank, SL_GPU_NAME, cudaGetErrorName(e), cudaGetErrorString(e));
  if (count <= 0)
    return h->fail(h->core, SL_ERR_NO_DEVICE, SL_GPU_NAME " (local rank %d): no device visible (" SL_GPU_VISIBLE_ENV
                                              "=%s); use --backend cpu", local_rank,
                   getenv(SL_GPU_VISIBLE_ENV) ? getenv(SL_GPU_VISIBLE_ENV) : "unset");
  int dev = in->device >= 0 ? in->device : local_rank % count;
  if (dev >= count)
    return h->fail(h->core, SL_ERR_NO_DEVICE, SL_GPU_NAME " (local rank %d): device %d requested but %d device%s "
                                              "visible (ordinals 0..%d, " SL_GPU_VISIBLE_ENV "=%s); pass --device "
                                              "within range",
                   local_rank, dev, count, count == 1 ? " is" : "s are", count - 1,
                   getenv(SL_GPU_VISIBLE_ENV) ? getenv(SL_GPU_VISIBLE_ENV) : "unset");
  cu_backend *s = calloc(1, sizeof *s);
  if (!s) return h->fail(h->core, SL_ERR_NOMEM, SL_GPU_NAME " (local rank %d): out of host memory", local_rank);
  s->host = h;
  s->dev = dev;
  s->local_rank = local_rank;
  s->sync_timeout_s = timeout_s;
  pthread_mutex_init(&s->lock, NULL);
  if ((st = setup(s)) != SL_OK) {
    cu_fini(s);
    return st;
  }
  *be = s;
  return SL_OK;
}

/* The core synchronised first; what is still live here was leaked by the caller and is freed so
 * the pool can go. Never cudaDeviceReset: other users of the device share this process. Every
 * wait is bounded, and once one gave up on a stuck kernel the others do not wait again
 * (cuda_stream.c), so fini ends even then. */
static void cu_fini(void *be) {
  cu_backend *s = be;
  if (!s) return;
  /* the last state may go on a caller's thread (a garbage collector's): its context stays */
  cu_saved sv;
  int (*ctx_set)(void *) = s->ctx_set;
  int entered = s->def || s->alloc_stream;
  if (entered) cu__enter(s, &sv);
  /* while the streams still exist to be asked: the core synchronised, so they are quiet unless
   * a kernel never ends */
  if (s->def && s->alloc_stream) cu__free_deferred(s, 1);
  while (s->nstreams) cu__stream_destroy(s, (void *)s->streams[s->nstreams - 1]);
  if (s->def) {
    cu__wait_stream(s, s->def, "fini");
    cudaStreamDestroy(s->def);
  }
  if (s->alloc_stream) {
    for (size_t i = 0; i < s->nallocs; i++) cudaFreeAsync((void *)s->allocs[i].base, s->alloc_stream);
    cu__wait_stream(s, s->alloc_stream, "fini");
    cudaStreamDestroy(s->alloc_stream);
  }
  /* frees still waiting for a consumer's work: the driver finishes them, then releases the stream
   * and (below) the pool, without this thread waiting */
  if (s->release_stream) cudaStreamDestroy(s->release_stream);
  if (s->pool) {
    cudaMemPoolTrimTo(s->pool, 0);
    cudaMemPoolDestroy(s->pool);
  }
  if (s->libcuda) dlclose(s->libcuda);
  free(s->allocs);
  free(s->streams);
  free(s->abandoned); /* the streams themselves stay with the work given up on them */
  free(s->deferred);
  pthread_mutex_destroy(&s->lock);
  free(s);
  if (entered) { /* cu__leave, without S */
    enum cudaStreamCaptureMode mode = sv.mode;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (sv.has_ctx) (void)ctx_set(sv.ctx);
  }
}

static void cu_describe(void *be, char *buf, size_t len) { snprintf(buf, len, "%s", ((cu_backend *)be)->desc); }

static int cu_device_ordinal(void *be) { return ((cu_backend *)be)->dev; }

static void cu_device_identity(void *be, char *buf, size_t len) { snprintf(buf, len, "%s", ((cu_backend *)be)->busid); }

/* ---- extensions ---------------------------------------------------------------------------- */
/* Complete on return: ordered after everything queued on every stream, then waited for. */
static sl_status cu_sgd(void *be, void *x, const void *g, sl_dtype dt, size_t count, float lr) {
  cu_backend *s = be;
  if (!cu__dt_size(dt))
    return cu__fail(s, 0, SL_ERR_DTYPE, "sgd step: dtype %d is not a floating type (F64, F32, F16, BF16)", (int)dt);
  sl_status st = cu__synchronize(s);
  if (st != SL_OK || !count) return st;
  size_t bytes = count * cu__dt_size(dt);
  if (!cu__in_table(s, x, bytes) || !cu__in_table(s, g, bytes))
    return cu__fail(s, 0, SL_ERR_INVALID, "sgd step: %p / %p (+%zu bytes) are not device buffers of this backend", x,
                    g, bytes);
  cudaError_t e = cu__bind(s);
  if (e == cudaSuccess) e = sl_cuda_launch_sgd(x, g, (int)dt, count, lr, s->def);
  if (e != cudaSuccess) return cu__fail_cuda(s, 1, "sgd kernel launch", e, "%zu %s elements", count, cu__dt_name(dt));
  return cu__wait_stream(s, s->def, "sgd step");
}

static void cu_traffic(void *be, uint64_t *h2d, uint64_t *d2h) {
  cu_backend *s = be;
  *h2d = __atomic_load_n(&s->h2d, __ATOMIC_RELAXED);
  *d2h = __atomic_load_n(&s->d2h, __ATOMIC_RELAXED);
}

/* SL_EXT_NATIVE_STREAM: an ABI stream IS a cudaStream_t (created here, non-blocking); NULL is
 * the module's own default stream, which is never CUDA's legacy one. */
static void *cu_native_stream(void *be, void *stream) { return (void *)cu__stream_of(be, stream); }

/* SL_EXT_DEVICE_COUNT: the visible devices init's DEVICE names; 0 where the runtime has none
 * or fails (the probe says why). Creates no context. */
static int cu_device_count(void) {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? n : 0;
}

static void *cu_get_proc(const char *name) {
  if (!name) return NULL;
  if (strcmp(name, SL_EXT_SGD_STEP) == 0) return (void *)(sl_ext_sgd_step_fn)cu_sgd;
  if (strcmp(name, SL_EXT_TRAFFIC) == 0) return (void *)(sl_ext_traffic_fn)cu_traffic;
  if (strcmp(name, SL_EXT_STREAM_ABANDON) == 0) return (void *)(sl_ext_stream_abandon_fn)cu__stream_abandon;
  if (strcmp(name, SL_EXT_NATIVE_STREAM) == 0) return (void *)(sl_ext_native_stream_fn)cu_native_stream;
  if (strcmp(name, SL_EXT_DEVICE_COUNT) == 0) return (void *)(sl_ext_device_count_fn)cu_device_count;
  return NULL;
}

static const sl_backend_ops cu_ops = {
    .abi_version = SL_BACKEND_ABI_VERSION,
    .size = sizeof(sl_backend_ops),
    .name = SL_GPU_NAME,
    .flags = SL_BACKEND_HAS_PINNED,
    .preferred_collective = SL_CCL_NAME,
    .probe = cu_probe,
    .init = cu_init,
    .fini = cu_fini,
    .describe = cu_describe,
    .device_ordinal = cu_device_ordinal,
    .alloc_device = cu__alloc_device,
    .free_device = cu__free_device,
    .alloc_pinned = cu__alloc_pinned,
    .free_pinned = cu__free_pinned,
    .stream_create = cu__stream_create,
    .stream_destroy = cu__stream_destroy,
    .event_create = cu__event_create,
    .event_destroy = cu__event_destroy,
    .event_record = cu__event_record,
    .stream_wait_event = cu__stream_wait_event,
    .event_query = cu__event_query,
    .event_sync = cu__event_sync,
    .stream_sync = cu__stream_sync,
    .synchronize = cu__synchronize,
    .copy_async = cu__copy_async,
    .cast_async = cu__cast_async,
    .copy_2d_async = cu__copy_2d_async,
    .register_host = cu__register_host,
    .unregister_host = cu__unregister_host,
    .is_device_ptr = cu__is_device_ptr,
    .get_proc = cu_get_proc,
    .device_identity = cu_device_identity,
    .event_record_native = cu__event_record_native,
    .free_device_after = cu__free_device_after,
    .native_api = SL_GPU_NAME,
    .dlpack_device_type = SL_GPU_DLPACK_DEVICE,
    .dlpack_pinned_type = SL_GPU_DLPACK_PINNED,
    .launch_host_fn = cu__launch_host_fn,
};

/* The only exported symbol (the version script of shardload_add_module). */
__attribute__((visibility("default"))) const sl_backend_ops *sl_backend_module_v2(void) { return &cu_ops; }
