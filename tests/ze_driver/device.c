/* The test driver's zeInit, its one driver and one GPU device, and contexts. */
#define _GNU_SOURCE
#include "zedrv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

zedrv_state zd = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .cond = PTHREAD_COND_INITIALIZER,
};

/* Timed waits use CLOCK_MONOTONIC deadlines (zedrv_wait); the static initializer cannot say so. */
__attribute__((constructor)) static void zedrv_cond_init(void) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&zd.cond, &a);
  pthread_condattr_destroy(&a);
}

/* A process that leaves contexts or memory behind leaks on a real driver too: reported as misuse
 * at exit (ZEDRV_MISUSE=abort turns it into a failed exit status). */
__attribute__((destructor)) static void zedrv_fini(void) {
  pthread_mutex_lock(&zd.lock);
  if (zd.live_contexts > 0 || zd.nallocs > 0)
    zedrv_misuse("at exit: %d contexts and %zu allocations or imported ranges were never freed", zd.live_contexts,
                 zd.nallocs);
  if (zd.misuse > 0) fprintf(stderr, "zedrv: %llu misuses in this process\n", (unsigned long long)zd.misuse);
  pthread_mutex_unlock(&zd.lock);
}

void zedrv_misuse(const char *fmt, ...) {
  va_list ap;
  zd.misuse++;
  fprintf(stderr, "zedrv: misuse: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  if (zd.abort_on_misuse) abort();
}

static uint64_t env_u64(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  return strtoull(v, NULL, 0);
}

static bool env_is(const char *name, const char *value) {
  const char *v = getenv(name);
  return v && strcmp(v, value) == 0;
}

void zedrv_env_init(void) {
  const char *d = getenv("ZEDRV_DELAY_US");
  zd.delay_min_us = 0;
  zd.delay_max_us = 300;
  if (d && *d) {
    unsigned lo = 0, hi = 0;
    int n = sscanf(d, "%u:%u", &lo, &hi);
    if (n == 1) hi = lo, lo = 0;
    if (n >= 1 && lo <= hi)
      zd.delay_min_us = lo, zd.delay_max_us = hi;
    else
      fprintf(stderr, "zedrv: ZEDRV_DELAY_US=%s: expected max or min:max in microseconds; using 0:300\n", d);
  }
  zd.copy_first = env_is("ZEDRV_GROUPS", "copy-first");
  zd.no_fp64 = env_is("ZEDRV_NO_FP64", "1");
  zd.no_f32_denorms = env_is("ZEDRV_NO_F32_DENORMS", "1");
  zd.no_import = env_is("ZEDRV_NO_IMPORT", "1");
  zd.abort_on_misuse = env_is("ZEDRV_MISUSE", "abort");
  zd.strict = env_is("ZEDRV_STRICT", "1");
  zd.no_relaxed = env_is("ZEDRV_NO_RELAXED_ALLOC", "1");
  zd.lose_after = env_u64("ZEDRV_LOSE_AFTER", 0);
  zd.max_alloc = env_u64("ZEDRV_MAX_ALLOC", 4ull << 30);
  zd.memory = env_u64("ZEDRV_MEMORY", 16ull << 30);
  zd.ndevices = (uint32_t)env_u64("ZEDRV_DEVICES", 1);
  if (zd.ndevices > ZEDRV_MAX_DEVICES) {
    fprintf(stderr, "zedrv: ZEDRV_DEVICES=%u: at most %d; using %d\n", zd.ndevices, ZEDRV_MAX_DEVICES,
            ZEDRV_MAX_DEVICES);
    zd.ndevices = ZEDRV_MAX_DEVICES;
  }
  static const struct {
    const char *name;
    ze_device_type_t type;
  } types[] = {{"gpu", ZE_DEVICE_TYPE_GPU},
               {"cpu", ZE_DEVICE_TYPE_CPU},
               {"fpga", ZE_DEVICE_TYPE_FPGA},
               {"vpu", ZE_DEVICE_TYPE_VPU}};
  const char *t = getenv("ZEDRV_DEVICE_TYPE");
  zd.device_type = ZE_DEVICE_TYPE_GPU;
  for (size_t i = 0; t && i < sizeof types / sizeof types[0]; i++)
    if (strcmp(t, types[i].name) == 0) zd.device_type = types[i].type;
}

bool zedrv_is_device(ze_device_handle_t d) {
  return d >= &zd.devices[0] && d < &zd.devices[zd.ndevices] && d->magic == ZEDRV_MAGIC_LIVE;
}

ze_result_t ZE_APICALL zedrv_init(ze_init_flags_t flags) {
  if (flags & ~(ze_init_flags_t)(ZE_INIT_FLAG_GPU_ONLY | ZE_INIT_FLAG_VPU_ONLY))
    return ZE_RESULT_ERROR_INVALID_ENUMERATION;
  pthread_mutex_lock(&zd.lock);
  if (!zd.initialized) {
    zedrv_env_init();
    zd.driver.magic = ZEDRV_MAGIC_LIVE;
    for (uint32_t i = 0; i < zd.ndevices; i++) zd.devices[i] = (struct _ze_device_handle_t){ZEDRV_MAGIC_LIVE, i};
    zd.initialized = true;
  }
  ze_device_type_t type = zd.device_type;
  pthread_mutex_unlock(&zd.lock);
  /* a driver whose devices are not of the kind asked for has nothing to offer */
  if ((flags == ZE_INIT_FLAG_GPU_ONLY && type != ZE_DEVICE_TYPE_GPU) ||
      (flags == ZE_INIT_FLAG_VPU_ONLY && type != ZE_DEVICE_TYPE_VPU))
    return ZE_RESULT_ERROR_UNINITIALIZED;
  return ZE_RESULT_SUCCESS;
}

/* ---- driver ------------------------------------------------------------------------------ */

static ze_result_t ZE_APICALL driver_get(uint32_t *count, ze_driver_handle_t *drivers) {
  if (!zd.initialized) return ZE_RESULT_ERROR_UNINITIALIZED;
  if (!count) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (*count == 0 || !drivers) {
    *count = 1;
    return ZE_RESULT_SUCCESS;
  }
  drivers[0] = &zd.driver;
  *count = 1;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL driver_get_api_version(ze_driver_handle_t d, ze_api_version_t *v) {
  *v = ZE_API_VERSION_1_4;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL driver_get_properties(ze_driver_handle_t d, ze_driver_properties_t *p) {
  memset(&p->uuid, 0, sizeof p->uuid);
  memcpy(p->uuid.id, "shardload-zedrv", 15);
  p->driverVersion = 1;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL driver_get_ipc_properties(ze_driver_handle_t d, ze_driver_ipc_properties_t *p) {
  p->flags = 0; /* no IPC */
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL driver_get_extension_properties(ze_driver_handle_t d, uint32_t *count,
                                                              ze_driver_extension_properties_t *p) {
  static const char *const names[] = {ZE_RELAXED_ALLOCATION_LIMITS_EXP_NAME};
  uint32_t n = zd.no_relaxed ? 0 : sizeof names / sizeof names[0]; /* ZEDRV_NO_RELAXED_ALLOC=1: none */
  if (*count == 0 || !p) {
    *count = n;
    return ZE_RESULT_SUCCESS;
  }
  if (*count > n) *count = n;
  for (uint32_t i = 0; i < *count; i++) {
    snprintf(p[i].name, sizeof p[i].name, "%s", names[i]);
    p[i].version = ZE_RELAXED_ALLOCATION_LIMITS_EXP_VERSION_CURRENT;
  }
  return ZE_RESULT_SUCCESS;
}

/* The test-only extension: how many misuses the driver has seen (see zedrv.h). */
static ze_result_t ZE_APICALL zedrv_get_misuse_count(ze_driver_handle_t d, uint64_t *count) {
  pthread_mutex_lock(&zd.lock);
  *count = zd.misuse;
  pthread_mutex_unlock(&zd.lock);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL zedrv_set_delay_us(ze_driver_handle_t d, uint32_t min, uint32_t max) {
  if (min > max) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  pthread_mutex_lock(&zd.lock);
  zd.delay_min_us = min;
  zd.delay_max_us = max;
  pthread_mutex_unlock(&zd.lock);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL zedrv_lose_device(ze_driver_handle_t d) {
  pthread_mutex_lock(&zd.lock);
  zd.device_lost = true;
  pthread_cond_broadcast(&zd.cond);
  pthread_mutex_unlock(&zd.lock);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL driver_get_extension_function_address(ze_driver_handle_t d, const char *name, void **fn) {
  *fn = NULL;
  if (!zd.no_import) {
    if (strcmp(name, "zexDriverImportExternalPointer") == 0)
      *fn = (void *)zedrv_import_external_pointer;
    else if (strcmp(name, "zexDriverReleaseImportedPointer") == 0)
      *fn = (void *)zedrv_release_imported_pointer;
    else if (strcmp(name, "zexDriverGetHostPointerBaseAddress") == 0)
      *fn = (void *)zedrv_get_host_pointer_base_address;
  }
  if (strcmp(name, "zedrvGetMisuseCount") == 0)
    *fn = (void *)zedrv_get_misuse_count;
  else if (strcmp(name, "zedrvLoseDevice") == 0)
    *fn = (void *)zedrv_lose_device;
  else if (strcmp(name, "zedrvSetDelayUs") == 0)
    *fn = (void *)zedrv_set_delay_us;
  else if (strcmp(name, "zedrvGetLaunchCount") == 0 && zedrv_get_launch_count)
    *fn = (void *)zedrv_get_launch_count;
  return *fn ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

ze_result_t zedrv_fill_driver(ze_driver_dditable_t *t) {
  t->pfnGet = driver_get;
  t->pfnGetApiVersion = driver_get_api_version;
  t->pfnGetProperties = driver_get_properties;
  t->pfnGetIpcProperties = driver_get_ipc_properties;
  t->pfnGetExtensionProperties = driver_get_extension_properties;
  t->pfnGetExtensionFunctionAddress = driver_get_extension_function_address;
  return ZE_RESULT_SUCCESS;
}

/* ---- device ------------------------------------------------------------------------------ */

static ze_result_t ZE_APICALL device_get(ze_driver_handle_t d, uint32_t *count, ze_device_handle_t *devs) {
  if (d != &zd.driver) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (*count == 0 || !devs) {
    *count = zd.ndevices;
    return ZE_RESULT_SUCCESS;
  }
  if (*count > zd.ndevices) *count = zd.ndevices;
  for (uint32_t i = 0; i < *count; i++) devs[i] = &zd.devices[i];
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL device_get_sub_devices(ze_device_handle_t d, uint32_t *count, ze_device_handle_t *s) {
  *count = 0;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL device_get_properties(ze_device_handle_t d, ze_device_properties_t *p) {
  if (!zedrv_is_device(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  p->type = zd.device_type;
  p->vendorId = 0x8086;
  p->deviceId = 0x0bd5; /* a Ponte Vecchio id: the module must not rely on it */
  p->flags = 0;         /* discrete, no ECC, no subdevice */
  p->subdeviceId = 0;
  p->coreClockRate = 1600;
  p->maxMemAllocSize = zd.max_alloc;
  p->maxHardwareContexts = 64;
  p->maxCommandQueuePriority = 0;
  p->numThreadsPerEU = 8;
  p->physicalEUSimdWidth = 16;
  p->numEUsPerSubslice = 8;
  p->numSubslicesPerSlice = 8;
  p->numSlices = 2;
  p->timerResolution = 1000;
  p->timestampValidBits = 64;
  p->kernelTimestampValidBits = 32;
  memset(&p->uuid, 0, sizeof p->uuid);
  snprintf((char *)p->uuid.id, sizeof p->uuid.id, "zedrv-device-%u", d->index);
  snprintf(p->name, sizeof p->name, "shardload Level Zero test device %u", d->index);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL device_get_compute_properties(ze_device_handle_t d, ze_device_compute_properties_t *p) {
  p->maxTotalGroupSize = 1024;
  p->maxGroupSizeX = 1024;
  p->maxGroupSizeY = 1024;
  p->maxGroupSizeZ = 64;
  p->maxGroupCountX = UINT32_MAX;
  p->maxGroupCountY = UINT32_MAX;
  p->maxGroupCountZ = UINT32_MAX;
  p->maxSharedLocalMemory = 64 * 1024;
  p->numSubGroupSizes = 2;
  p->subGroupSizes[0] = 16;
  p->subGroupSizes[1] = 32;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL device_get_module_properties(ze_device_handle_t d, ze_device_module_properties_t *p) {
  p->spirvVersionSupported = ZE_MAKE_VERSION(1, 2);
  p->flags = ZE_DEVICE_MODULE_FLAG_FP16 | ZE_DEVICE_MODULE_FLAG_INT64_ATOMICS;
  p->fp16flags = ZE_DEVICE_FP_FLAG_ROUND_TO_NEAREST | ZE_DEVICE_FP_FLAG_INF_NAN;
  /* F32 subnormals kept, as Intel's GPUs report; ZEDRV_NO_F32_DENORMS=1: a device that may flush them */
  p->fp32flags = ZE_DEVICE_FP_FLAG_ROUND_TO_NEAREST | ZE_DEVICE_FP_FLAG_INF_NAN |
                 (zd.no_f32_denorms ? 0 : ZE_DEVICE_FP_FLAG_DENORM);
  p->fp64flags = 0;
  if (!zd.no_fp64) {
    p->flags |= ZE_DEVICE_MODULE_FLAG_FP64;
    p->fp64flags = ZE_DEVICE_FP_FLAG_ROUND_TO_NEAREST | ZE_DEVICE_FP_FLAG_INF_NAN | ZE_DEVICE_FP_FLAG_DENORM |
                   ZE_DEVICE_FP_FLAG_FMA;
  }
  p->maxArgumentsSize = 2048;
  p->printfBufferSize = 0;
  memset(&p->nativeKernelSupported, 0, sizeof p->nativeKernelSupported);
  return ZE_RESULT_SUCCESS;
}

bool zedrv_group_is_copy_only(uint32_t ordinal) {
  return zd.copy_first ? ordinal == 0 : ordinal == 1;
}

static ze_result_t ZE_APICALL device_get_queue_groups(ze_device_handle_t d, uint32_t *count,
                                                      ze_command_queue_group_properties_t *p) {
  if (*count == 0 || !p) {
    *count = ZEDRV_NUM_GROUPS;
    return ZE_RESULT_SUCCESS;
  }
  if (*count > ZEDRV_NUM_GROUPS) *count = ZEDRV_NUM_GROUPS;
  for (uint32_t i = 0; i < *count; i++) {
    if (zedrv_group_is_copy_only(i)) {
      p[i].flags = ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY;
      p[i].numQueues = 2;
    } else {
      p[i].flags = ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE | ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY;
      p[i].numQueues = 1;
    }
    p[i].maxMemoryFillPatternSize = 128;
  }
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL device_get_memory_properties(ze_device_handle_t d, uint32_t *count,
                                                           ze_device_memory_properties_t *p) {
  if (*count == 0 || !p) {
    *count = 1;
    return ZE_RESULT_SUCCESS;
  }
  *count = 1;
  p->flags = 0;
  p->maxClockRate = 1600;
  p->maxBusWidth = 4096;
  p->totalSize = zd.memory;
  snprintf(p->name, sizeof p->name, "HBM");
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL device_get_memory_access_properties(ze_device_handle_t d,
                                                                  ze_device_memory_access_properties_t *p) {
  ze_memory_access_cap_flags_t rw = ZE_MEMORY_ACCESS_CAP_FLAG_RW;
  p->hostAllocCapabilities = rw;
  p->deviceAllocCapabilities = rw;
  p->sharedSingleDeviceAllocCapabilities = rw;
  p->sharedCrossDeviceAllocCapabilities = 0;
  p->sharedSystemAllocCapabilities = 0; /* malloc'd memory is not device-accessible */
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL device_get_status(ze_device_handle_t d) {
  pthread_mutex_lock(&zd.lock);
  bool lost = zd.device_lost;
  pthread_mutex_unlock(&zd.lock);
  return lost ? ZE_RESULT_ERROR_DEVICE_LOST : ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL device_can_access_peer(ze_device_handle_t d, ze_device_handle_t peer, ze_bool_t *can) {
  if (!zedrv_is_device(d) || !zedrv_is_device(peer)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  *can = 1; /* one host memory underneath */
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL device_get_cache_properties(ze_device_handle_t d, uint32_t *count,
                                                          ze_device_cache_properties_t *p) {
  if (*count == 0 || !p) {
    *count = 1;
    return ZE_RESULT_SUCCESS;
  }
  *count = 1;
  p->flags = 0;
  p->cacheSize = 64u << 20;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL device_get_global_timestamps(ze_device_handle_t d, uint64_t *host, uint64_t *device) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  *host = *device = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL device_pci_get_properties(ze_device_handle_t d, ze_pci_ext_properties_t *p) {
  p->address.domain = 0;
  if (!zedrv_is_device(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  p->address.bus = 0x3a + d->index;
  p->address.device = 0;
  p->address.function = 0;
  p->maxSpeed.genVersion = 5;
  p->maxSpeed.width = 16;
  p->maxSpeed.maxBandwidth = 64ll << 30;
  return ZE_RESULT_SUCCESS;
}

ze_result_t zedrv_fill_device(ze_device_dditable_t *t) {
  t->pfnGet = device_get;
  t->pfnGetSubDevices = device_get_sub_devices;
  t->pfnGetProperties = device_get_properties;
  t->pfnGetComputeProperties = device_get_compute_properties;
  t->pfnGetModuleProperties = device_get_module_properties;
  t->pfnGetCommandQueueGroupProperties = device_get_queue_groups;
  t->pfnGetMemoryProperties = device_get_memory_properties;
  t->pfnGetMemoryAccessProperties = device_get_memory_access_properties;
  t->pfnGetStatus = device_get_status;
  t->pfnCanAccessPeer = device_can_access_peer;
  t->pfnGetCacheProperties = device_get_cache_properties;
  t->pfnGetGlobalTimestamps = device_get_global_timestamps;
  t->pfnPciGetPropertiesExt = device_pci_get_properties;
  return ZE_RESULT_SUCCESS;
}

/* ---- context ----------------------------------------------------------------------------- */

static ze_result_t ZE_APICALL context_create(ze_driver_handle_t d, const ze_context_desc_t *desc,
                                             ze_context_handle_t *out) {
  if (d != &zd.driver) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  ze_context_handle_t c = calloc(1, sizeof *c);
  if (!c) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  c->magic = ZEDRV_MAGIC_LIVE;
  pthread_mutex_lock(&zd.lock);
  zd.live_contexts++;
  pthread_mutex_unlock(&zd.lock);
  *out = c;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL context_destroy(ze_context_handle_t c) {
  pthread_mutex_lock(&zd.lock);
  int live = c->live_objects;
  if (live > 0)
    zedrv_misuse("zeContextDestroy: %d objects made in the context are still alive", live);
  else
    zd.live_contexts--;
  pthread_mutex_unlock(&zd.lock);
  if (live > 0) return ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
  c->magic = ZEDRV_MAGIC_DEAD;
  free(c);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL context_get_status(ze_context_handle_t c) {
  return device_get_status(&zd.devices[0]);
}

ze_result_t zedrv_fill_context(ze_context_dditable_t *t) {
  t->pfnCreate = context_create;
  t->pfnDestroy = context_destroy;
  t->pfnGetStatus = context_get_status;
  return ZE_RESULT_SUCCESS;
}
