/* The Level Zero test driver's own semantics, through the REAL Level Zero loader (linked here;
 * ZE_ENABLE_ALT_DRIVERS names the driver): what a module's tests rely on is proven here, apart
 * from any module, so a lenient driver cannot make a module look right. Each test checks the
 * driver's misuse count (zedrvGetMisuseCount) moved by exactly what the test provoked.
 *
 * Deterministic by construction: a command that must not have run yet sits behind a wait on a
 * "gate" event that only the host signals, so no assertion depends on the random delay
 * (ZEDRV_DELAY_US only shuffles everything else). */
#define _GNU_SOURCE
#include <level_zero/loader/ze_loader.h>
#include <level_zero/ze_api.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define ZE_OK(call) assert_int_equal((call), ZE_RESULT_SUCCESS)
/* "Until done", bounded: a driver that never signals fails an assertion in 10 s instead of
 * hanging the test until CTest's timeout. */
#define FOREVER 10000000000ull

typedef ze_result_t(ZE_APICALL *misuse_fn)(ze_driver_handle_t, uint64_t *);
typedef ze_result_t(ZE_APICALL *delay_fn)(ze_driver_handle_t, uint32_t, uint32_t);
typedef ze_result_t(ZE_APICALL *import_fn)(ze_driver_handle_t, void *, size_t);
typedef ze_result_t(ZE_APICALL *release_fn)(ze_driver_handle_t, void *);
typedef ze_result_t(ZE_APICALL *base_fn)(ze_driver_handle_t, void *, void **);

static struct {
  ze_driver_handle_t driver;
  ze_device_handle_t device;
  ze_context_handle_t ctx;
  uint32_t copy_ordinal, compute_ordinal;
  uint32_t copy_queues;
  misuse_fn misuse;
  ze_event_pool_handle_t pool;
  uint32_t next_event;
} g;

#define POOL_EVENTS 256

static uint64_t misuse_count(void) {
  uint64_t n = 0;
  ZE_OK(g.misuse(g.driver, &n));
  return n;
}

/* A fresh host-visible event of the shared pool (each test takes its own indices). */
static ze_event_handle_t new_event(void) {
  ze_event_desc_t d = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC,
                       .index = g.next_event++,
                       .signal = ZE_EVENT_SCOPE_FLAG_HOST,
                       .wait = ZE_EVENT_SCOPE_FLAG_HOST};
  ze_event_handle_t e = NULL;
  assert_true(d.index < POOL_EVENTS);
  ZE_OK(zeEventCreate(g.pool, &d, &e));
  return e;
}

static ze_command_list_handle_t immediate(uint32_t ordinal, uint32_t index) {
  ze_command_queue_desc_t d = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                               .ordinal = ordinal,
                               .index = index,
                               .mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS};
  ze_command_list_handle_t l = NULL;
  ZE_OK(zeCommandListCreateImmediate(g.ctx, g.device, &d, &l));
  return l;
}

static void *device_alloc(size_t size) {
  ze_device_mem_alloc_desc_t d = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  void *p = NULL;
  ZE_OK(zeMemAllocDevice(g.ctx, &d, size, 64, g.device, &p));
  return p;
}

static void *host_alloc(size_t size) {
  ze_host_mem_alloc_desc_t d = {.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC};
  void *p = NULL;
  ZE_OK(zeMemAllocHost(g.ctx, &d, size, 64, &p));
  return p;
}

static void fill_u32(uint32_t *p, size_t n, uint32_t base) {
  for (size_t i = 0; i < n; i++) p[i] = base + (uint32_t)i;
}

static int setup(void **state) {
  if (!getenv("ZE_ENABLE_ALT_DRIVERS")) {
    fprintf(stderr, "test_ze_driver: ZE_ENABLE_ALT_DRIVERS is not set: run it through ctest, which names the driver\n");
    return -1;
  }
  if (zeInit(0) != ZE_RESULT_SUCCESS) return -1;
  uint32_t n = 1;
  if (zeDriverGet(&n, &g.driver) != ZE_RESULT_SUCCESS || n != 1) return -1;
  n = 1;
  if (zeDeviceGet(g.driver, &n, &g.device) != ZE_RESULT_SUCCESS || n != 1) return -1;
  ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
  if (zeContextCreate(g.driver, &cd, &g.ctx) != ZE_RESULT_SUCCESS) return -1;
  if (zeDriverGetExtensionFunctionAddress(g.driver, "zedrvGetMisuseCount", (void **)&g.misuse) != ZE_RESULT_SUCCESS)
    return -1;
  /* the groups by their flags, never by index (ZEDRV_GROUPS=copy-first swaps them) */
  ze_command_queue_group_properties_t groups[8];
  n = 8;
  for (uint32_t i = 0; i < 8; i++)
    groups[i] = (ze_command_queue_group_properties_t){.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES};
  if (zeDeviceGetCommandQueueGroupProperties(g.device, &n, groups) != ZE_RESULT_SUCCESS) return -1;
  g.copy_ordinal = g.compute_ordinal = UINT32_MAX;
  for (uint32_t i = 0; i < n; i++) {
    ze_command_queue_group_property_flags_t f = groups[i].flags;
    if ((f & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY) && !(f & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE) &&
        g.copy_ordinal == UINT32_MAX) {
      g.copy_ordinal = i;
      g.copy_queues = groups[i].numQueues;
    }
    if ((f & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE) && g.compute_ordinal == UINT32_MAX) g.compute_ordinal = i;
  }
  ze_event_pool_desc_t pd = {
      .stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, .flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE, .count = POOL_EVENTS};
  if (zeEventPoolCreate(g.ctx, &pd, 1, &g.device, &g.pool) != ZE_RESULT_SUCCESS) return -1;
  return 0;
}

static int teardown(void **state) {
  /* events are destroyed by each test; the pool and the context must now be empty */
  if (zeEventPoolDestroy(g.pool) != ZE_RESULT_SUCCESS) return -1;
  if (zeContextDestroy(g.ctx) != ZE_RESULT_SUCCESS) return -1;
  return 0;
}

/* ---- discovery --------------------------------------------------------------------------- */

static void test_discovery(void **state) {
  ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
  ZE_OK(zeDeviceGetProperties(g.device, &p));
  assert_int_equal(p.type, ZE_DEVICE_TYPE_GPU);
  assert_true(strlen(p.name) > 0);
  assert_int_equal(p.maxMemAllocSize, 1048576); /* ZEDRV_MAX_ALLOC of the ctest environment */
  assert_true(p.numSlices * p.numSubslicesPerSlice * p.numEUsPerSubslice > 0);

  uint32_t n = 0;
  ZE_OK(zeDeviceGetMemoryProperties(g.device, &n, NULL));
  assert_int_equal(n, 1);
  ze_device_memory_properties_t m = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES};
  ZE_OK(zeDeviceGetMemoryProperties(g.device, &n, &m));
  assert_true(m.totalSize >= p.maxMemAllocSize);

  ze_device_compute_properties_t c = {.stype = ZE_STRUCTURE_TYPE_DEVICE_COMPUTE_PROPERTIES};
  ZE_OK(zeDeviceGetComputeProperties(g.device, &c));
  assert_true(c.maxTotalGroupSize >= 256);

  ze_pci_ext_properties_t pci = {.stype = ZE_STRUCTURE_TYPE_PCI_EXT_PROPERTIES};
  ZE_OK(zeDevicePciGetPropertiesExt(g.device, &pci));
  assert_int_equal(pci.address.bus, 0x3a);

  /* one copy-only group (with two engines) and one compute group, where the environment put them */
  assert_int_not_equal(g.copy_ordinal, UINT32_MAX);
  assert_int_not_equal(g.compute_ordinal, UINT32_MAX);
  assert_int_not_equal(g.copy_ordinal, g.compute_ordinal);
  const char *order = getenv("ZEDRV_GROUPS");
  assert_int_equal(g.copy_ordinal, order && strcmp(order, "copy-first") == 0 ? 0 : 1);
  assert_int_equal(g.copy_queues, 2);

  n = 0;
  ZE_OK(zeDeviceGetSubDevices(g.device, &n, NULL));
  assert_int_equal(n, 0);
}

/* ZEDRV_DEVICES=n: n devices, told apart by UUID, name and PCI address; an allocation knows its
 * device, and a host allocation none. */
static void test_devices(void **state) {
  const char *env = getenv("ZEDRV_DEVICES");
  uint32_t want = env ? (uint32_t)atoi(env) : 1, n = 0;
  ZE_OK(zeDeviceGet(g.driver, &n, NULL));
  assert_int_equal(n, want);
  ze_device_handle_t devs[8];
  assert_true(n <= 8);
  ZE_OK(zeDeviceGet(g.driver, &n, devs));
  assert_ptr_equal(devs[0], g.device);
  ze_device_properties_t p[8];
  ze_pci_ext_properties_t pci[8];
  for (uint32_t i = 0; i < n; i++) {
    p[i] = (ze_device_properties_t){.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    pci[i] = (ze_pci_ext_properties_t){.stype = ZE_STRUCTURE_TYPE_PCI_EXT_PROPERTIES};
    ZE_OK(zeDeviceGetProperties(devs[i], &p[i]));
    ZE_OK(zeDevicePciGetPropertiesExt(devs[i], &pci[i]));
    for (uint32_t j = 0; j < i; j++) {
      assert_memory_not_equal(p[i].uuid.id, p[j].uuid.id, sizeof p[i].uuid.id);
      assert_string_not_equal(p[i].name, p[j].name);
      assert_int_not_equal(pci[i].address.bus, pci[j].address.bus);
    }
    ze_device_mem_alloc_desc_t dd = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
    void *ptr = NULL;
    ZE_OK(zeMemAllocDevice(g.ctx, &dd, 256, 64, devs[i], &ptr));
    ze_memory_allocation_properties_t mp = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ze_device_handle_t owner = NULL;
    ZE_OK(zeMemGetAllocProperties(g.ctx, ptr, &mp, &owner));
    assert_ptr_equal(owner, devs[i]);
    ZE_OK(zeMemFree(g.ctx, ptr));
  }
  void *h = host_alloc(64);
  ze_memory_allocation_properties_t mp = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
  ze_device_handle_t owner = devs[0];
  ZE_OK(zeMemGetAllocProperties(g.ctx, h, &mp, &owner));
  assert_null(owner);
  ZE_OK(zeMemFree(g.ctx, h));
}

/* Under ZE_ENABLE_VALIDATION_LAYER=1 the loader really put its layer in between (it lists the
 * layer's version), and parameter validation refuses what the driver would never see. */
static void test_validation_layer(void **state) {
  const char *v = getenv("ZE_ENABLE_VALIDATION_LAYER");
  bool on = v && strcmp(v, "1") == 0;
  size_t n = 0;
  ZE_OK(zelLoaderGetVersions(&n, NULL));
  zel_component_version_t *vers = calloc(n, sizeof *vers);
  assert_non_null(vers);
  ZE_OK(zelLoaderGetVersions(&n, vers));
  bool found = false;
  for (size_t i = 0; i < n; i++) found |= strstr(vers[i].component_name, "validation") != NULL;
  free(vers);
  assert_int_equal(found, on);
  if (!on) {
    skip();
    return;
  }
  void *p = NULL;
  assert_int_equal(zeMemAllocDevice(g.ctx, NULL, 64, 64, g.device, &p), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
  assert_int_equal(zeEventHostSignal(NULL), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
}

/* ---- memory ------------------------------------------------------------------------------ */

static void check_props(const void *ptr, ze_memory_type_t want) {
  ze_memory_allocation_properties_t mp = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
  ze_device_handle_t dev = NULL;
  ZE_OK(zeMemGetAllocProperties(g.ctx, ptr, &mp, &dev));
  assert_int_equal(mp.type, want);
}

static void test_memory(void **state) {
  uint64_t misuse = misuse_count();
  char *d = device_alloc(4096);
  char *h = host_alloc(4096);
  ze_device_mem_alloc_desc_t dd = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  ze_host_mem_alloc_desc_t hd = {.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC};
  void *s = NULL;
  ZE_OK(zeMemAllocShared(g.ctx, &dd, &hd, 4096, 64, g.device, &s));
  check_props(d, ZE_MEMORY_TYPE_DEVICE);
  check_props(d + 4095, ZE_MEMORY_TYPE_DEVICE);
  check_props(h + 100, ZE_MEMORY_TYPE_HOST);
  check_props(s, ZE_MEMORY_TYPE_SHARED);
  int on_stack = 0;
  check_props(&on_stack, ZE_MEMORY_TYPE_UNKNOWN);

  void *base = NULL;
  size_t size = 0;
  ZE_OK(zeMemGetAddressRange(g.ctx, d + 1000, &base, &size));
  assert_ptr_equal(base, d);
  assert_int_equal(size, 4096);
  assert_int_not_equal(zeMemGetAddressRange(g.ctx, &on_stack, &base, &size), ZE_RESULT_SUCCESS);

  ZE_OK(zeMemFree(g.ctx, d));
  ZE_OK(zeMemFree(g.ctx, h));
  ZE_OK(zeMemFree(g.ctx, s));
  check_props(d, ZE_MEMORY_TYPE_UNKNOWN);

  /* past maxMemAllocSize: refused, unless the relaxed-limit descriptor asks where the driver lists
   * the extension (ZEDRV_NO_RELAXED_ALLOC=1: it does not, and the descriptor changes nothing) */
  const char *nr = getenv("ZEDRV_NO_RELAXED_ALLOC");
  bool relax_offered = !(nr && strcmp(nr, "1") == 0), listed = false;
  ze_driver_extension_properties_t ext[16];
  uint32_t next = 16;
  ZE_OK(zeDriverGetExtensionProperties(g.driver, &next, ext));
  for (uint32_t i = 0; i < next; i++) listed |= strcmp(ext[i].name, ZE_RELAXED_ALLOCATION_LIMITS_EXP_NAME) == 0;
  assert_int_equal(listed, relax_offered);
  ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
  ZE_OK(zeDeviceGetProperties(g.device, &p));
  void *big = NULL;
  assert_int_equal(zeMemAllocDevice(g.ctx, &dd, p.maxMemAllocSize + 4096, 64, g.device, &big),
                   ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
  assert_int_equal(zeMemAllocHost(g.ctx, &(ze_host_mem_alloc_desc_t){.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC},
                                  p.maxMemAllocSize + 4096, 64, &big),
                   ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
  ze_relaxed_allocation_limits_exp_desc_t relaxed = {.stype = ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC,
                                                     .flags = ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE};
  dd.pNext = &relaxed;
  if (relax_offered) {
    ZE_OK(zeMemAllocDevice(g.ctx, &dd, p.maxMemAllocSize + 4096, 64, g.device, &big));
    ZE_OK(zeMemFree(g.ctx, big));
  } else {
    assert_int_equal(zeMemAllocDevice(g.ctx, &dd, p.maxMemAllocSize + 4096, 64, g.device, &big),
                     ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
  }
  assert_int_equal(misuse_count(), misuse);
}

static void test_import(void **state) {
  import_fn imp = NULL;
  release_fn rel = NULL;
  base_fn base = NULL;
  ZE_OK(zeDriverGetExtensionFunctionAddress(g.driver, "zexDriverImportExternalPointer", (void **)&imp));
  ZE_OK(zeDriverGetExtensionFunctionAddress(g.driver, "zexDriverReleaseImportedPointer", (void **)&rel));
  ZE_OK(zeDriverGetExtensionFunctionAddress(g.driver, "zexDriverGetHostPointerBaseAddress", (void **)&base));
  void *nothing = NULL;
  assert_int_not_equal(zeDriverGetExtensionFunctionAddress(g.driver, "zexNoSuchFunction", &nothing), ZE_RESULT_SUCCESS);
  char *buf = malloc(1 << 16);
  assert_non_null(buf);
  void *b = NULL;
  assert_int_not_equal(base(g.driver, buf + 10, &b), ZE_RESULT_SUCCESS); /* not imported yet */
  ZE_OK(imp(g.driver, buf, 1 << 16));
  ZE_OK(base(g.driver, buf + 1234, &b));
  assert_ptr_equal(b, buf);
  assert_int_not_equal(imp(g.driver, buf + 100, 100), ZE_RESULT_SUCCESS); /* overlaps the import */
  check_props(buf, ZE_MEMORY_TYPE_UNKNOWN);                               /* an import is not a USM allocation */

  /* a copy from the imported range lands */
  ze_command_list_handle_t l = immediate(g.copy_ordinal, 0);
  ze_event_handle_t done = new_event();
  char *dst = host_alloc(1 << 16);
  memset(buf, 0x3c, 1 << 16);
  ZE_OK(zeCommandListAppendMemoryCopy(l, dst, buf, 1 << 16, done, 0, NULL));
  ZE_OK(zeEventHostSynchronize(done, FOREVER));
  assert_memory_equal(dst, buf, 1 << 16);

  ZE_OK(rel(g.driver, buf));
  assert_int_not_equal(base(g.driver, buf + 10, &b), ZE_RESULT_SUCCESS);
  ZE_OK(zeEventDestroy(done));
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeMemFree(g.ctx, dst));
  free(buf);
}

/* ---- command lists, events, ordering ----------------------------------------------------- */

/* An appended command runs later: behind a gate it has not run after the append returned, nor
 * 20 ms later; it runs once the host opens the gate. */
static void test_runs_later(void **state) {
  uint64_t misuse = misuse_count();
  enum { N = 4096 };
  ze_command_list_handle_t l = immediate(g.compute_ordinal, 0);
  ze_event_handle_t gate = new_event(), done = new_event();
  uint32_t *src = host_alloc(N * 4), *dst = host_alloc(N * 4);
  fill_u32(src, N, 7);
  memset(dst, 0, N * 4);
  ZE_OK(zeCommandListAppendWaitOnEvents(l, 1, &gate));
  ZE_OK(zeCommandListAppendMemoryCopy(l, dst, src, N * 4, done, 0, NULL));
  assert_int_equal(zeEventQueryStatus(done), ZE_RESULT_NOT_READY);
  usleep(20000);
  assert_int_equal(zeEventQueryStatus(done), ZE_RESULT_NOT_READY);
  assert_int_equal(zeEventHostSynchronize(done, 1000000), ZE_RESULT_NOT_READY); /* a 1 ms bound times out */
  assert_int_equal(dst[0], 0);
  assert_int_equal(dst[N - 1], 0);
  ZE_OK(zeEventHostSignal(gate));
  ZE_OK(zeEventHostSynchronize(done, FOREVER));
  assert_memory_equal(dst, src, N * 4);
  ZE_OK(zeEventDestroy(gate));
  ZE_OK(zeEventDestroy(done));
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeMemFree(g.ctx, src));
  ZE_OK(zeMemFree(g.ctx, dst));
  assert_int_equal(misuse_count(), misuse);
}

/* Without any gate a command still runs later, on a worker: with a 50 ms delay it has not run
 * when the append returns (the driver's delay knob, zedrvSetDelayUs, set for this test only). */
static void test_runs_later_ungated(void **state) {
  delay_fn set_delay = NULL;
  ZE_OK(zeDriverGetExtensionFunctionAddress(g.driver, "zedrvSetDelayUs", (void **)&set_delay));
  unsigned lo = 0, hi = 300;
  const char *env = getenv("ZEDRV_DELAY_US");
  if (env) assert_int_equal(sscanf(env, "%u:%u", &lo, &hi), 2);
  enum { N = 1024 };
  ze_command_list_handle_t l = immediate(g.copy_ordinal, 0);
  ze_event_handle_t done = new_event();
  uint32_t *src = host_alloc(N * 4), *dst = host_alloc(N * 4);
  fill_u32(src, N, 1);
  memset(dst, 0, N * 4);
  ZE_OK(set_delay(g.driver, 50000, 50000));
  ZE_OK(zeCommandListAppendMemoryCopy(l, dst, src, N * 4, done, 0, NULL));
  /* not also dst[0] == 0: that read would race with the worker (test_runs_later reads the
   * destination behind a gate instead) */
  assert_int_equal(zeEventQueryStatus(done), ZE_RESULT_NOT_READY);
  ZE_OK(zeEventHostSynchronize(done, FOREVER));
  ZE_OK(set_delay(g.driver, lo, hi));
  assert_memory_equal(dst, src, N * 4);
  ZE_OK(zeEventDestroy(done));
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeMemFree(g.ctx, src));
  ZE_OK(zeMemFree(g.ctx, dst));
}

/* ZEDRV_STRICT=1: device memory faults when the host touches it outside the driver's commands
 * (a child process reads it and dies of SIGSEGV); otherwise the read returns the fresh-memory
 * pattern. Either way the driver's own copies of it work. */
static void test_strict_device_memory(void **state) {
  const char *env = getenv("ZEDRV_STRICT");
  bool strict = env && strcmp(env, "1") == 0;
  volatile unsigned char *dev = device_alloc(4096);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL); /* not cmocka's handler, which would go on running tests */
    _exit(dev[100] == 0xa5 ? 0 : 1);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (strict) {
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGSEGV);
  } else {
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
  ze_command_list_handle_t l = immediate(g.copy_ordinal, 1);
  ze_event_handle_t done = new_event();
  unsigned char *host = host_alloc(4096);
  ZE_OK(zeCommandListAppendMemoryFill(l, (void *)dev, "\x42", 1, 4096, NULL, 0, NULL));
  ZE_OK(zeCommandListAppendBarrier(l, NULL, 0, NULL)); /* the copy reads what the fill wrote */
  ZE_OK(zeCommandListAppendMemoryCopy(l, host, (void *)dev, 4096, done, 0, NULL));
  ZE_OK(zeEventHostSynchronize(done, FOREVER));
  for (int i = 0; i < 4096; i++) assert_int_equal(host[i], 0x42);
  ZE_OK(zeEventDestroy(done));
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeMemFree(g.ctx, (void *)dev));
  ZE_OK(zeMemFree(g.ctx, host));
}

/* Signal-once: an event stays signalled until the HOST resets it (a later wait on it passes at
 * once, the stale-event hazard), a second signal before the reset is misuse, and after the
 * reset the event is not ready until signalled again. */
static void test_signal_once(void **state) {
  uint64_t misuse = misuse_count();
  ze_command_list_handle_t l = immediate(g.compute_ordinal, 0);
  ze_event_handle_t e = new_event(), after = new_event();
  assert_int_equal(zeEventQueryStatus(e), ZE_RESULT_NOT_READY);
  ZE_OK(zeCommandListAppendSignalEvent(l, e));
  ZE_OK(zeEventHostSynchronize(e, FOREVER));
  usleep(5000);
  ZE_OK(zeEventQueryStatus(e)); /* still signalled */
  /* a wait on the old signal passes without anyone signalling again */
  ZE_OK(zeCommandListAppendBarrier(l, after, 1, &e));
  ZE_OK(zeEventHostSynchronize(after, FOREVER));
  assert_int_equal(misuse_count(), misuse);

  /* signalling it again without a reset is misuse, and does not "re-arm" it */
  ZE_OK(zeEventHostSignal(e));
  assert_int_equal(misuse_count(), misuse + 1);

  ZE_OK(zeEventHostReset(e));
  assert_int_equal(zeEventQueryStatus(e), ZE_RESULT_NOT_READY);
  ZE_OK(zeEventHostReset(after));
  ZE_OK(zeCommandListAppendBarrier(l, after, 1, &e));
  usleep(20000);
  assert_int_equal(zeEventQueryStatus(after), ZE_RESULT_NOT_READY); /* waits for the new signal */
  ZE_OK(zeEventHostSignal(e));
  ZE_OK(zeEventHostSynchronize(after, FOREVER));

  /* a reset while a queued command still signals the event is misuse */
  ze_event_handle_t gate = new_event();
  ZE_OK(zeEventHostReset(e));
  ZE_OK(zeCommandListAppendBarrier(l, e, 1, &gate));
  ZE_OK(zeEventHostReset(e));
  assert_int_equal(misuse_count(), misuse + 2);
  ZE_OK(zeEventHostSignal(gate));
  ZE_OK(zeEventHostSynchronize(e, FOREVER));

  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeEventDestroy(e));
  ZE_OK(zeEventDestroy(after));
  ZE_OK(zeEventDestroy(gate));
  assert_int_equal(misuse_count(), misuse + 2);
}

/* Two engines: B's read of what A writes is ordered by a wait on A's event, and only by it.
 * Without the wait B reads the stale contents (the device's fresh-memory pattern). */
static void copy_after(bool wait) {
  uint64_t misuse = misuse_count();
  enum { N = 8192 };
  ze_command_list_handle_t a = immediate(g.copy_ordinal, 0), b = immediate(g.copy_ordinal, 1);
  ze_event_handle_t gate = new_event(), a_done = new_event(), b_done = new_event();
  uint32_t *src = host_alloc(N * 4), *dst = host_alloc(N * 4);
  uint32_t *dev = device_alloc(N * 4);
  fill_u32(src, N, 1000);
  memset(dst, 0, N * 4);
  ZE_OK(zeCommandListAppendMemoryCopy(a, dev, src, N * 4, a_done, 1, &gate));
  ZE_OK(zeCommandListAppendMemoryCopy(b, dst, dev, N * 4, b_done, wait ? 1 : 0, wait ? &a_done : NULL));
  if (wait) {
    usleep(10000);
    assert_int_equal(zeEventQueryStatus(b_done), ZE_RESULT_NOT_READY);
    ZE_OK(zeEventHostSignal(gate));
    ZE_OK(zeEventHostSynchronize(b_done, FOREVER));
    assert_memory_equal(dst, src, N * 4);
  } else {
    ZE_OK(zeEventHostSynchronize(b_done, FOREVER));
    for (size_t i = 0; i < N; i++) assert_int_equal(dst[i], 0xa5a5a5a5u);
    ZE_OK(zeEventHostSignal(gate));
    ZE_OK(zeEventHostSynchronize(a_done, FOREVER));
  }
  ZE_OK(zeCommandListDestroy(a));
  ZE_OK(zeCommandListDestroy(b));
  ZE_OK(zeEventDestroy(gate));
  ZE_OK(zeEventDestroy(a_done));
  ZE_OK(zeEventDestroy(b_done));
  ZE_OK(zeMemFree(g.ctx, src));
  ZE_OK(zeMemFree(g.ctx, dst));
  ZE_OK(zeMemFree(g.ctx, dev));
  assert_int_equal(misuse_count(), misuse);
}

static void test_wait_orders(void **state) {
  copy_after(true);
}

static void test_missing_wait_reads_stale(void **state) {
  copy_after(false);
}

/* Ordering inside one list. A list orders its commands only through barriers, events and the
 * in-order flag (ZE_COMMAND_QUEUE_FLAG_IN_ORDER, spec 1.7): otherwise two commands overlap and
 * complete in any order ("there is no implicit definition of the order of completion"). */
typedef enum { UNORDERED, BARRIER, EVENT, IN_ORDER_FLAG } order_by;

static ze_command_list_handle_t list_for(order_by how) {
  ze_command_queue_desc_t d = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                               .ordinal = g.copy_ordinal,
                               .flags = how == IN_ORDER_FLAG ? ZE_BIT(1) /* ZE_COMMAND_QUEUE_FLAG_IN_ORDER */ : 0,
                               .mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS};
  ze_command_list_handle_t l = NULL;
  ze_result_t r = zeCommandListCreateImmediate(g.ctx, g.device, &d, &l);
  const char *v = getenv("ZE_ENABLE_VALIDATION_LAYER");
  if (how == IN_ORDER_FLAG && v && strcmp(v, "1") == 0) {
    /* the 1.8.12 validation layer knows API 1.4 and refuses the 1.7 flag (what keeps the module
     * from relying on it) */
    assert_int_equal(r, ZE_RESULT_ERROR_INVALID_ENUMERATION);
    return NULL;
  }
  ZE_OK(r);
  return l;
}

/* TRIES times: copy A (a big one) then copy B (a small one) into the same destination, ordered
 * by HOW or not at all; returns in how many tries the result was not B's (A completed last,
 * or the two overlapped and tore it). */
static int tries_out_of_order(order_by how, int tries) {
  enum { N = 1 << 14 };
  ze_command_list_handle_t l = list_for(how);
  if (!l) return 0;
  uint32_t *a = host_alloc(N * 4), *b = host_alloc(N * 4), *dst = host_alloc(N * 4);
  fill_u32(a, N, 1u << 20);
  fill_u32(b, N, 7);
  ze_event_handle_t a_done = new_event(), all_done = new_event();
  int out_of_order = 0;
  for (int t = 0; t < tries; t++) {
    memset(dst, 0, N * 4);
    ZE_OK(zeCommandListAppendMemoryCopy(l, dst, a, N * 4, how == EVENT ? a_done : NULL, 0, NULL));
    if (how == BARRIER) ZE_OK(zeCommandListAppendBarrier(l, NULL, 0, NULL));
    ZE_OK(zeCommandListAppendMemoryCopy(l, dst, b, N * 4, NULL, how == EVENT ? 1 : 0, how == EVENT ? &a_done : NULL));
    ZE_OK(zeCommandListAppendBarrier(l, all_done, 0, NULL)); /* both completed */
    ZE_OK(zeEventHostSynchronize(all_done, FOREVER));
    out_of_order += memcmp(dst, b, N * 4) != 0;
    ZE_OK(zeEventHostReset(all_done));
    ZE_OK(zeEventHostReset(a_done));
  }
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeEventDestroy(a_done));
  ZE_OK(zeEventDestroy(all_done));
  ZE_OK(zeMemFree(g.ctx, a));
  ZE_OK(zeMemFree(g.ctx, b));
  ZE_OK(zeMemFree(g.ctx, dst));
  return out_of_order;
}

static void with_delay(unsigned lo, unsigned hi) {
  delay_fn set_delay = NULL;
  ZE_OK(zeDriverGetExtensionFunctionAddress(g.driver, "zedrvSetDelayUs", (void **)&set_delay));
  ZE_OK(set_delay(g.driver, lo, hi));
}

static void restore_delay(void) {
  unsigned lo = 0, hi = 300;
  const char *env = getenv("ZEDRV_DELAY_US");
  if (env) assert_int_equal(sscanf(env, "%u:%u", &lo, &hi), 2);
  with_delay(lo, hi);
}

/* Unordered, the later copy completes first at least once in 40 tries (each try about even odds
 * under random delays); ordered by a barrier, an event or the in-order flag, never. */
static void test_list_order(void **state) {
  uint64_t misuse = misuse_count();
  with_delay(0, 2000);
  int unordered = tries_out_of_order(UNORDERED, 40);
  int barrier = tries_out_of_order(BARRIER, 20), event = tries_out_of_order(EVENT, 20);
  int in_order = tries_out_of_order(IN_ORDER_FLAG, 20);
  restore_delay();
  print_message("out of order: %d/40 unordered, %d/20 with a barrier, %d/20 with an event, %d/20 in-order\n",
                unordered, barrier, event, in_order);
  assert_true(unordered > 0);
  assert_int_equal(barrier, 0);
  assert_int_equal(event, 0);
  assert_int_equal(in_order, 0);
  assert_int_equal(misuse_count(), misuse);
}

/* A command that waits for nothing does not wait behind an earlier one that waits for a gate
 * (nothing orders them), but one behind a barrier does; a barrier with waits does not wait for
 * the commands before it ("This is not the case when numWaitEvents is non-zero"). */
static void test_list_reorders(void **state) {
  uint64_t misuse = misuse_count();
  enum { N = 1024 };
  ze_command_list_handle_t l = immediate(g.copy_ordinal, 0);
  ze_event_handle_t gate = new_event(), a_done = new_event(), b_done = new_event(), c_done = new_event();
  ze_event_handle_t gate2 = new_event(), d_done = new_event();
  uint32_t *src = host_alloc(N * 4), *x = host_alloc(N * 4), *y = host_alloc(N * 4), *z = host_alloc(N * 4);
  fill_u32(src, N, 3);
  ZE_OK(zeCommandListAppendMemoryCopy(l, x, src, N * 4, a_done, 1, &gate));
  ZE_OK(zeCommandListAppendMemoryCopy(l, y, src, N * 4, b_done, 0, NULL));
  ZE_OK(zeEventHostSynchronize(b_done, FOREVER)); /* B completed while A still waits */
  assert_int_equal(zeEventQueryStatus(a_done), ZE_RESULT_NOT_READY);
  /* a barrier with waits passes once they are signalled, A still pending */
  ZE_OK(zeCommandListAppendBarrier(l, c_done, 1, &b_done));
  ZE_OK(zeEventHostSynchronize(c_done, FOREVER));
  assert_int_equal(zeEventQueryStatus(a_done), ZE_RESULT_NOT_READY);
  /* behind a barrier without waits, a copy waits for A */
  ZE_OK(zeCommandListAppendBarrier(l, NULL, 0, NULL));
  ZE_OK(zeCommandListAppendMemoryCopy(l, z, src, N * 4, d_done, 0, NULL));
  usleep(20000);
  assert_int_equal(zeEventQueryStatus(d_done), ZE_RESULT_NOT_READY);
  ZE_OK(zeEventHostSignal(gate));
  ZE_OK(zeEventHostSynchronize(d_done, FOREVER));
  ZE_OK(zeEventQueryStatus(a_done));
  assert_memory_equal(z, src, N * 4);
  /* a wait (zeCommandListAppendWaitOnEvents) blocks what follows it */
  ZE_OK(zeEventHostReset(d_done));
  ZE_OK(zeCommandListAppendWaitOnEvents(l, 1, &gate2));
  ZE_OK(zeCommandListAppendMemoryCopy(l, z, src, N * 4, d_done, 0, NULL));
  usleep(20000);
  assert_int_equal(zeEventQueryStatus(d_done), ZE_RESULT_NOT_READY);
  ZE_OK(zeEventHostSignal(gate2));
  ZE_OK(zeEventHostSynchronize(d_done, FOREVER));
  ZE_OK(zeCommandListDestroy(l));
  ze_event_handle_t all[] = {gate, a_done, b_done, c_done, gate2, d_done};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) ZE_OK(zeEventDestroy(all[i]));
  ZE_OK(zeMemFree(g.ctx, src));
  ZE_OK(zeMemFree(g.ctx, x));
  ZE_OK(zeMemFree(g.ctx, y));
  ZE_OK(zeMemFree(g.ctx, z));
  assert_int_equal(misuse_count(), misuse);
}

/* A host reset, or a destruction, of an event that a queued command not yet started waits for
 * is misuse (the wait would see the reset or the signal depending on when it runs); once the
 * command started, the reset is fine. */
static void test_reset_under_wait(void **state) {
  uint64_t misuse = misuse_count();
  ze_command_list_handle_t l = immediate(g.copy_ordinal, 0);
  ze_event_handle_t gate = new_event(), other = new_event(), done = new_event();
  ZE_OK(zeCommandListAppendBarrier(l, done, 2, (ze_event_handle_t[]){gate, other}));
  ZE_OK(zeEventHostSignal(gate));
  ZE_OK(zeEventHostReset(gate)); /* the barrier, still waiting for OTHER, names it */
  assert_int_equal(misuse_count(), misuse + 1);
  assert_int_equal(zeEventDestroy(gate), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
  assert_int_equal(misuse_count(), misuse + 2);
  ZE_OK(zeEventHostSignal(gate));
  ZE_OK(zeEventHostSignal(other));
  ZE_OK(zeEventHostSynchronize(done, FOREVER));
  ZE_OK(zeEventHostReset(gate)); /* the barrier has run: nothing waits for it any more */
  ZE_OK(zeEventHostReset(other));
  assert_int_equal(misuse_count(), misuse + 2);
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeEventDestroy(gate));
  ZE_OK(zeEventDestroy(other));
  ZE_OK(zeEventDestroy(done));
  assert_int_equal(misuse_count(), misuse + 2);
}

/* Destroying an event, or its pool, while a queued command still signals it is misuse ("The
 * application must ensure the device is not currently referencing the any event within the pool
 * before it is deleted"), refused with ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE. */
static void test_destroy_busy_pool(void **state) {
  uint64_t misuse = misuse_count();
  ze_event_pool_desc_t pd = {.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, .flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE, .count = 1};
  ze_event_pool_handle_t pool = NULL;
  ZE_OK(zeEventPoolCreate(g.ctx, &pd, 1, &g.device, &pool));
  ze_event_desc_t ed = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC, .index = 0};
  ze_event_handle_t e = NULL, gate = new_event();
  ZE_OK(zeEventCreate(pool, &ed, &e));
  ze_command_list_handle_t l = immediate(g.copy_ordinal, 0);
  ZE_OK(zeCommandListAppendBarrier(l, e, 1, &gate));
  assert_int_equal(zeEventDestroy(e), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
  assert_int_equal(zeEventPoolDestroy(pool), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
  assert_int_equal(misuse_count(), misuse + 2);
  ZE_OK(zeEventHostSignal(gate));
  ZE_OK(zeEventHostSynchronize(e, FOREVER));
  ZE_OK(zeEventDestroy(e));
  ZE_OK(zeEventPoolDestroy(pool));
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeEventDestroy(gate));
  assert_int_equal(misuse_count(), misuse + 2);
}

/* A 2-D and a 3-D box between pitched buffers; the bytes outside the box are untouched. */
static void test_region_copy(void **state) {
  uint64_t misuse = misuse_count();
  enum { SP = 64, SH = 16, DP = 40, DH = 12, DEPTH = 3 };
  unsigned char *src = host_alloc(SP * SH * DEPTH), *dst = host_alloc(DP * DH * DEPTH);
  unsigned char *want = malloc(DP * DH * DEPTH);
  assert_non_null(want);
  for (int i = 0; i < SP * SH * DEPTH; i++) src[i] = (unsigned char)(i * 7 + 1);
  memset(dst, 0, DP * DH * DEPTH);
  memset(want, 0, DP * DH * DEPTH);
  ze_command_list_handle_t l = immediate(g.copy_ordinal, 0);
  ze_event_handle_t done = new_event();

  /* 2-D: 20 bytes x 5 rows from (3, 2) of src to (8, 4) of dst */
  ze_copy_region_t sr = {3, 2, 0, 20, 5, 0}, dr = {8, 4, 0, 20, 5, 0};
  ZE_OK(zeCommandListAppendMemoryCopyRegion(l, dst, &dr, DP, 0, src, &sr, SP, 0, done, 0, NULL));
  ZE_OK(zeEventHostSynchronize(done, FOREVER));
  for (int y = 0; y < 5; y++) memcpy(want + (4 + y) * DP + 8, src + (2 + y) * SP + 3, 20);
  assert_memory_equal(dst, want, DP * DH * DEPTH);

  /* 3-D: 10 x 3 x 2 from (1, 1, 1) to (0, 0, 0) */
  ZE_OK(zeEventHostReset(done));
  ze_copy_region_t sr3 = {1, 1, 1, 10, 3, 2}, dr3 = {0, 0, 0, 10, 3, 2};
  ZE_OK(zeCommandListAppendMemoryCopyRegion(l, dst, &dr3, DP, DP * DH, src, &sr3, SP, SP * SH, done, 0, NULL));
  ZE_OK(zeEventHostSynchronize(done, FOREVER));
  for (int z = 0; z < 2; z++)
    for (int y = 0; y < 3; y++) memcpy(want + z * DP * DH + y * DP, src + (1 + z) * SP * SH + (1 + y) * SP + 1, 10);
  assert_memory_equal(dst, want, DP * DH * DEPTH);

  /* boxes of different shapes, and a row wider than its pitch, are refused at append */
  ze_copy_region_t other = {0, 0, 0, 21, 5, 0};
  assert_int_equal(zeCommandListAppendMemoryCopyRegion(l, dst, &other, DP, 0, src, &sr, SP, 0, NULL, 0, NULL),
                   ZE_RESULT_ERROR_INVALID_ARGUMENT);
  ze_copy_region_t wide = {30, 0, 0, 20, 1, 0};
  assert_int_equal(zeCommandListAppendMemoryCopyRegion(l, dst, &wide, DP, 0, src, &wide, SP, 0, NULL, 0, NULL),
                   ZE_RESULT_ERROR_INVALID_ARGUMENT);
  ZE_OK(zeEventDestroy(done));
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeMemFree(g.ctx, src));
  ZE_OK(zeMemFree(g.ctx, dst));
  free(want);
  assert_int_equal(misuse_count(), misuse);
}

/* A copy that runs past the end of its allocation is refused (a device would fault). */
static void test_copy_past_end(void **state) {
  uint64_t misuse = misuse_count();
  ze_command_list_handle_t l = immediate(g.copy_ordinal, 0);
  char *d = device_alloc(256), *h = host_alloc(512);
  assert_int_equal(zeCommandListAppendMemoryCopy(l, d + 128, h, 256, NULL, 0, NULL), ZE_RESULT_ERROR_INVALID_SIZE);
  assert_int_equal(misuse_count(), misuse + 1);
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeMemFree(g.ctx, d));
  ZE_OK(zeMemFree(g.ctx, h));
}

/* Regular lists on a command queue, completed by a fence; a fence reused unreset is misuse. */
static void test_queue_and_fence(void **state) {
  uint64_t misuse = misuse_count();
  enum { N = 4096 };
  ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                .ordinal = g.copy_ordinal,
                                .mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS};
  ze_command_queue_handle_t q = NULL;
  ZE_OK(zeCommandQueueCreate(g.ctx, g.device, &qd, &q));
  ze_command_list_desc_t ld = {.stype = ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC,
                               .commandQueueGroupOrdinal = g.copy_ordinal};
  ze_command_list_handle_t l = NULL;
  ZE_OK(zeCommandListCreate(g.ctx, g.device, &ld, &l));
  ze_fence_desc_t fd = {.stype = ZE_STRUCTURE_TYPE_FENCE_DESC};
  ze_fence_handle_t f = NULL;
  ZE_OK(zeFenceCreate(q, &fd, &f));
  ze_event_handle_t gate = new_event();
  uint32_t *src = host_alloc(N * 4), *dst = host_alloc(N * 4);
  fill_u32(src, N, 99);
  memset(dst, 0, N * 4);
  ZE_OK(zeCommandListAppendWaitOnEvents(l, 1, &gate));
  ZE_OK(zeCommandListAppendMemoryCopy(l, dst, src, N * 4, NULL, 0, NULL));
  /* an open list cannot be executed */
  assert_int_not_equal(zeCommandQueueExecuteCommandLists(q, 1, &l, f), ZE_RESULT_SUCCESS);
  ZE_OK(zeCommandListClose(l));
  ZE_OK(zeCommandQueueExecuteCommandLists(q, 1, &l, f));
  usleep(10000);
  assert_int_equal(zeFenceQueryStatus(f), ZE_RESULT_NOT_READY);
  assert_int_equal(dst[0], 0);
  ZE_OK(zeEventHostSignal(gate));
  ZE_OK(zeFenceHostSynchronize(f, FOREVER));
  assert_memory_equal(dst, src, N * 4);

  /* again, after resets, with a queue synchronize */
  ZE_OK(zeEventHostReset(gate));
  ZE_OK(zeFenceReset(f));
  memset(dst, 0, N * 4);
  ZE_OK(zeCommandQueueExecuteCommandLists(q, 1, &l, f));
  assert_int_equal(zeCommandQueueSynchronize(q, 1000000), ZE_RESULT_NOT_READY);
  ZE_OK(zeEventHostSignal(gate));
  ZE_OK(zeCommandQueueSynchronize(q, FOREVER));
  ZE_OK(zeFenceQueryStatus(f));
  assert_memory_equal(dst, src, N * 4);
  assert_int_equal(misuse_count(), misuse);

  /* a fence reused without a reset */
  ZE_OK(zeCommandQueueExecuteCommandLists(q, 1, &l, f));
  assert_int_equal(misuse_count(), misuse + 1);
  ZE_OK(zeCommandQueueSynchronize(q, FOREVER));

  /* a list made for the compute group does not go to a copy queue */
  ze_command_list_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC,
                               .commandQueueGroupOrdinal = g.compute_ordinal};
  ze_command_list_handle_t cl = NULL;
  ZE_OK(zeCommandListCreate(g.ctx, g.device, &cd, &cl));
  ZE_OK(zeCommandListClose(cl));
  assert_int_not_equal(zeCommandQueueExecuteCommandLists(q, 1, &cl, NULL), ZE_RESULT_SUCCESS);

  ZE_OK(zeCommandListDestroy(cl));
  ZE_OK(zeFenceDestroy(f));
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeCommandQueueDestroy(q));
  ZE_OK(zeEventDestroy(gate));
  ZE_OK(zeMemFree(g.ctx, src));
  ZE_OK(zeMemFree(g.ctx, dst));
  assert_int_equal(misuse_count(), misuse + 1);
}

/* A synchronous immediate list has run a command when the append returns. */
static void test_synchronous_list(void **state) {
  ze_command_queue_desc_t d = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                               .ordinal = g.copy_ordinal,
                               .mode = ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS};
  ze_command_list_handle_t l = NULL;
  ZE_OK(zeCommandListCreateImmediate(g.ctx, g.device, &d, &l));
  uint32_t *src = host_alloc(4096), *dst = host_alloc(4096);
  fill_u32(src, 1024, 3);
  ZE_OK(zeCommandListAppendMemoryCopy(l, dst, src, 4096, NULL, 0, NULL));
  assert_memory_equal(dst, src, 4096);
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeMemFree(g.ctx, src));
  ZE_OK(zeMemFree(g.ctx, dst));
}

/* ---- modules and kernels ----------------------------------------------------------------- */

static unsigned char *read_spv(const char *var, size_t *size) {
  const char *path = getenv(var);
  assert_non_null(path);
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("%s: cannot open the example SPIR-V module (built by sl_ze_example_spv)", path);
  unsigned char *buf = malloc(1 << 20);
  assert_non_null(buf);
  *size = fread(buf, 1, 1 << 20, f);
  fclose(f);
  assert_true(*size > 20);
  return buf;
}

static void test_kernel(void **state) {
  uint64_t misuse = misuse_count();
  size_t size = 0;
  unsigned char *spv = read_spv("ZEDRV_TEST_SPV", &size);
  ze_module_desc_t md = {.stype = ZE_STRUCTURE_TYPE_MODULE_DESC,
                         .format = ZE_MODULE_FORMAT_IL_SPIRV,
                         .inputSize = size,
                         .pInputModule = spv};
  ze_module_handle_t m = NULL;
  ze_module_build_log_handle_t log = NULL;
  ZE_OK(zeModuleCreate(g.ctx, g.device, &md, &m, &log));
  ZE_OK(zeModuleBuildLogDestroy(log));
  uint32_t n = 0;
  ZE_OK(zeModuleGetKernelNames(m, &n, NULL));
  assert_int_equal(n, 1);
  const char *name = NULL;
  ZE_OK(zeModuleGetKernelNames(m, &n, &name));
  assert_string_equal(name, "zedrv_add_u32");

  ze_kernel_desc_t kd = {.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC, .pKernelName = "zedrv_no_such_kernel"};
  ze_kernel_handle_t k = NULL;
  assert_int_equal(zeKernelCreate(m, &kd, &k), ZE_RESULT_ERROR_INVALID_KERNEL_NAME);
  kd.pKernelName = "zedrv_add_u32";
  ZE_OK(zeKernelCreate(m, &kd, &k));

  enum { N = 1000 };
  uint32_t *src = device_alloc(N * 4), *dst = device_alloc(N * 4), *host = host_alloc(N * 4);
  fill_u32(host, N, 10);
  ze_command_list_handle_t l = immediate(g.compute_ordinal, 0), copy = immediate(g.copy_ordinal, 0);
  ze_event_handle_t up = new_event(), ran = new_event(), down = new_event();
  ZE_OK(zeCommandListAppendMemoryCopy(copy, src, host, N * 4, up, 0, NULL));

  uint32_t gx = 0, gy = 0, gz = 0;
  ZE_OK(zeKernelSuggestGroupSize(k, 1024, 1, 1, &gx, &gy, &gz));
  ZE_OK(zeKernelSetGroupSize(k, gx, 1, 1));
  ze_group_count_t groups = {(N + gx - 1) / gx, 1, 1};
  uint32_t add = 5, count = N;
  ZE_OK(zeKernelSetArgumentValue(k, 0, sizeof dst, &dst));
  ZE_OK(zeKernelSetArgumentValue(k, 1, sizeof src, &src));
  ZE_OK(zeKernelSetArgumentValue(k, 2, sizeof add, &add));
  /* argument 3 unset: refused */
  assert_int_equal(zeCommandListAppendLaunchKernel(l, k, &groups, ran, 1, &up), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  assert_int_equal(zeKernelSetArgumentValue(k, 3, 8, &count), ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE);
  assert_int_equal(zeKernelSetArgumentValue(k, 4, 4, &count), ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX);
  ZE_OK(zeKernelSetArgumentValue(k, 3, sizeof count, &count));
  /* a copy engine runs no kernels */
  assert_int_not_equal(zeCommandListAppendLaunchKernel(copy, k, &groups, NULL, 0, NULL), ZE_RESULT_SUCCESS);
  ZE_OK(zeCommandListAppendLaunchKernel(l, k, &groups, ran, 1, &up));
  /* the launch took the arguments as they were: this does not change it */
  add = 1000000;
  ZE_OK(zeKernelSetArgumentValue(k, 2, sizeof add, &add));
  ZE_OK(zeCommandListAppendMemoryCopy(copy, host, dst, N * 4, down, 1, &ran));
  ZE_OK(zeEventHostSynchronize(down, FOREVER));
  for (uint32_t i = 0; i < N; i++) assert_int_equal(host[i], 10 + i + 5);

  ZE_OK(zeKernelDestroy(k));
  ZE_OK(zeModuleDestroy(m));
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeCommandListDestroy(copy));
  ZE_OK(zeEventDestroy(up));
  ZE_OK(zeEventDestroy(ran));
  ZE_OK(zeEventDestroy(down));
  ZE_OK(zeMemFree(g.ctx, src));
  ZE_OK(zeMemFree(g.ctx, dst));
  ZE_OK(zeMemFree(g.ctx, host));

  /* not SPIR-V: a build failure with a log that says why */
  spv[0] ^= 0xff;
  log = NULL;
  assert_int_equal(zeModuleCreate(g.ctx, g.device, &md, &m, &log), ZE_RESULT_ERROR_MODULE_BUILD_FAILURE);
  assert_non_null(log);
  size_t len = 0;
  ZE_OK(zeModuleBuildLogGetString(log, &len, NULL));
  char text[256] = "";
  assert_true(len > 1 && len <= sizeof text);
  ZE_OK(zeModuleBuildLogGetString(log, &len, text));
  assert_non_null(strstr(text, "SPIR-V"));
  ZE_OK(zeModuleBuildLogDestroy(log));
  free(spv);
  assert_int_equal(misuse_count(), misuse);
}

static ze_module_handle_t build_module(const char *var, ze_result_t want, const char *log_says) {
  size_t size = 0;
  unsigned char *spv = read_spv(var, &size);
  ze_module_desc_t md = {.stype = ZE_STRUCTURE_TYPE_MODULE_DESC,
                         .format = ZE_MODULE_FORMAT_IL_SPIRV,
                         .inputSize = size,
                         .pInputModule = spv};
  ze_module_handle_t m = NULL;
  ze_module_build_log_handle_t log = NULL;
  assert_int_equal(zeModuleCreate(g.ctx, g.device, &md, &m, &log), want);
  free(spv);
  assert_non_null(log);
  char text[256] = "";
  size_t len = sizeof text;
  ZE_OK(zeModuleBuildLogGetString(log, &len, text));
  if (log_says) assert_non_null(strstr(text, log_says));
  ZE_OK(zeModuleBuildLogDestroy(log));
  return want == ZE_RESULT_SUCCESS ? m : NULL;
}

/* An fp64 module builds and runs where the device reports fp64, and fails to build, saying why,
 * where it does not (ZEDRV_NO_FP64=1). */
static void test_kernel_f64(void **state) {
  ze_device_module_properties_t mp = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MODULE_PROPERTIES};
  ZE_OK(zeDeviceGetModuleProperties(g.device, &mp));
  const char *env = getenv("ZEDRV_NO_FP64");
  bool fp64 = !(env && strcmp(env, "1") == 0);
  assert_int_equal(!!(mp.flags & ZE_DEVICE_MODULE_FLAG_FP64), fp64);
  if (!fp64) {
    build_module("ZEDRV_TEST_SPV_F64", ZE_RESULT_ERROR_MODULE_BUILD_FAILURE, "Float64");
    return;
  }
  ze_module_handle_t m = build_module("ZEDRV_TEST_SPV_F64", ZE_RESULT_SUCCESS, NULL);
  ze_kernel_desc_t kd = {.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC, .pKernelName = "zedrv_scale_f64"};
  ze_kernel_handle_t k = NULL;
  ZE_OK(zeKernelCreate(m, &kd, &k));
  enum { N = 300 };
  double *buf = device_alloc(N * sizeof(double)), *host = host_alloc(N * sizeof(double));
  for (int i = 0; i < N; i++) host[i] = i * 0.5;
  double factor = 2.5;
  uint32_t n = N;
  ZE_OK(zeKernelSetArgumentValue(k, 0, sizeof buf, &buf));
  ZE_OK(zeKernelSetArgumentValue(k, 1, sizeof factor, &factor));
  ZE_OK(zeKernelSetArgumentValue(k, 2, sizeof n, &n));
  ZE_OK(zeKernelSetGroupSize(k, 64, 1, 1));
  ze_group_count_t groups = {(N + 63) / 64, 1, 1};
  ze_command_list_handle_t l = immediate(g.compute_ordinal, 0);
  ze_event_handle_t done = new_event();
  ZE_OK(zeCommandListAppendMemoryCopy(l, buf, host, N * sizeof(double), NULL, 0, NULL));
  ZE_OK(zeCommandListAppendBarrier(l, NULL, 0, NULL)); /* a list orders nothing by itself */
  ZE_OK(zeCommandListAppendLaunchKernel(l, k, &groups, NULL, 0, NULL));
  ZE_OK(zeCommandListAppendBarrier(l, NULL, 0, NULL));
  ZE_OK(zeCommandListAppendMemoryCopy(l, host, buf, N * sizeof(double), done, 0, NULL));
  ZE_OK(zeEventHostSynchronize(done, FOREVER));
  for (int i = 0; i < N; i++) assert_true(host[i] == i * 0.5 * 2.5);
  ZE_OK(zeEventDestroy(done));
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeKernelDestroy(k));
  ZE_OK(zeModuleDestroy(m));
  ZE_OK(zeMemFree(g.ctx, buf));
  ZE_OK(zeMemFree(g.ctx, host));
}

/* The project's own kernels (project_kernels.c, linked where the Level Zero module's kernels are
 * built; ZEDRV_TEST_SPV_PROJECT names their base SPIR-V module): one runs by its name through the
 * real loader, over a strided grid smaller than its count, with the arguments of its append; a
 * name the module lacks (an F64 kernel, in the base module) is refused; its launches are counted. */
typedef ze_result_t(ZE_APICALL *launch_count_fn)(ze_driver_handle_t, const char *, uint64_t *);

static uint16_t ref_f32_to_bf16(uint32_t u) { /* round to nearest even; the test's values are finite */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void test_project_kernel(void **state) {
  if (!getenv("ZEDRV_TEST_SPV_PROJECT")) skip(); /* built without SHARDLOAD_WITH_LEVEL_ZERO */
  uint64_t misuse = misuse_count();
  launch_count_fn launches = NULL;
  ZE_OK(zeDriverGetExtensionFunctionAddress(g.driver, "zedrvGetLaunchCount", (void **)&launches));
  ze_module_handle_t m = build_module("ZEDRV_TEST_SPV_PROJECT", ZE_RESULT_SUCCESS, NULL);
  ze_kernel_desc_t kd = {.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC, .pKernelName = "sl_cast_f64_f32"};
  ze_kernel_handle_t k = NULL;
  assert_int_equal(zeKernelCreate(m, &kd, &k), ZE_RESULT_ERROR_INVALID_KERNEL_NAME); /* the F64 module's */
  kd.pKernelName = "sl_cast_f32_bf16_nope";
  assert_int_equal(zeKernelCreate(m, &kd, &k), ZE_RESULT_ERROR_INVALID_KERNEL_NAME);
  kd.pKernelName = "sl_cast_f32_bf16";
  ZE_OK(zeKernelCreate(m, &kd, &k));
  uint64_t before = 0, after = 0;
  ZE_OK(launches(g.driver, "sl_cast_f32_bf16", &before));
  assert_int_equal(launches(g.driver, "zedrv_no_such_kernel", &after), ZE_RESULT_ERROR_INVALID_KERNEL_NAME);

  enum { N = 1001 };
  float *src = device_alloc(N * 4), *host = host_alloc(N * 4);
  uint16_t *dst = device_alloc(N * 2), *back = host_alloc(N * 2);
  for (int i = 0; i < N; i++) host[i] = (float)i * 1.37f - 400.0f;
  ze_command_list_handle_t l = immediate(g.compute_ordinal, 0);
  ze_event_handle_t up = new_event(), ran = new_event(), down = new_event();
  ZE_OK(zeCommandListAppendMemoryCopy(l, src, host, N * 4, up, 0, NULL));
  uint64_t count = N;
  ZE_OK(zeKernelSetArgumentValue(k, 0, sizeof dst, &dst));
  ZE_OK(zeKernelSetArgumentValue(k, 1, sizeof src, &src));
  assert_int_equal(zeKernelSetArgumentValue(k, 2, 4, &count), ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE);
  assert_int_equal(zeKernelSetArgumentValue(k, 3, 8, &count), ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX);
  ZE_OK(zeKernelSetArgumentValue(k, 2, sizeof count, &count));
  ZE_OK(zeKernelSetGroupSize(k, 64, 1, 1));
  ze_group_count_t groups = {3, 1, 1}; /* 192 work-items stride over 1001 elements */
  ZE_OK(zeCommandListAppendLaunchKernel(l, k, &groups, ran, 1, &up));
  count = 0; /* the launch keeps the count of its append */
  ZE_OK(zeKernelSetArgumentValue(k, 2, sizeof count, &count));
  ZE_OK(zeCommandListAppendMemoryCopy(l, back, dst, N * 2, down, 1, &ran));
  ZE_OK(zeEventHostSynchronize(down, FOREVER));
  for (int i = 0; i < N; i++) {
    uint32_t u;
    memcpy(&u, &host[i], 4);
    if (back[i] != ref_f32_to_bf16(u)) fail_msg("element %d: bf16 0x%04x, want 0x%04x", i, back[i], ref_f32_to_bf16(u));
  }
  ZE_OK(launches(g.driver, "sl_cast_f32_bf16", &after));
  assert_int_equal(after, before + 1);
  ZE_OK(zeEventDestroy(up));
  ZE_OK(zeEventDestroy(ran));
  ZE_OK(zeEventDestroy(down));
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeKernelDestroy(k));
  ZE_OK(zeModuleDestroy(m));
  ZE_OK(zeMemFree(g.ctx, src));
  ZE_OK(zeMemFree(g.ctx, dst));
  ZE_OK(zeMemFree(g.ctx, host));
  ZE_OK(zeMemFree(g.ctx, back));
  assert_int_equal(misuse_count(), misuse);
}

/* ---- device loss (each case in a process of its own: a loss is for good) ------------------ */

/* After a loss: syncs answer DEVICE_LOST (none hangs, not even one behind a wait that will never
 * be met), so do new work and the device's status; objects can still be destroyed. */
static void check_lost(ze_event_handle_t lost_event) {
  assert_int_equal(zeEventHostSynchronize(lost_event, FOREVER), ZE_RESULT_ERROR_DEVICE_LOST);
  assert_int_equal(zeDeviceGetStatus(g.device), ZE_RESULT_ERROR_DEVICE_LOST);
  ze_command_list_handle_t l = immediate(g.copy_ordinal, 0);
  ze_event_handle_t never = new_event(), behind = new_event();
  char a[64], b[64];
  assert_int_equal(zeCommandListAppendMemoryCopy(l, a, b, sizeof a, behind, 1, &never), ZE_RESULT_ERROR_DEVICE_LOST);
  void *p = NULL;
  ze_device_mem_alloc_desc_t dd = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  assert_int_equal(zeMemAllocDevice(g.ctx, &dd, 64, 64, g.device, &p), ZE_RESULT_ERROR_DEVICE_LOST);
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeEventDestroy(never));
  ZE_OK(zeEventDestroy(behind));
}

/* A kernel that faults (add_u32 on NULL pointers) loses the device; a command queued on another
 * engine behind it fails too instead of waiting forever. */
static void test_lost_kernel_fault(void **state) {
  ze_module_handle_t m = build_module("ZEDRV_TEST_SPV", ZE_RESULT_SUCCESS, NULL);
  ze_kernel_desc_t kd = {.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC, .pKernelName = "zedrv_add_u32"};
  ze_kernel_handle_t k = NULL;
  ZE_OK(zeKernelCreate(m, &kd, &k));
  void *null = NULL;
  uint32_t add = 1, n = 10;
  ZE_OK(zeKernelSetArgumentValue(k, 0, sizeof null, NULL));
  ZE_OK(zeKernelSetArgumentValue(k, 1, sizeof null, &null));
  ZE_OK(zeKernelSetArgumentValue(k, 2, sizeof add, &add));
  ZE_OK(zeKernelSetArgumentValue(k, 3, sizeof n, &n));
  ze_command_list_handle_t l = immediate(g.compute_ordinal, 0), other = immediate(g.copy_ordinal, 1);
  ze_event_handle_t ran = new_event(), after = new_event();
  ze_group_count_t groups = {1, 1, 1};
  ZE_OK(zeKernelSetGroupSize(k, 16, 1, 1));
  char a[64], b[64] = {0};
  ZE_OK(zeCommandListAppendLaunchKernel(l, k, &groups, ran, 0, NULL));
  ZE_OK(zeCommandListAppendMemoryCopy(other, a, b, sizeof a, after, 1, &ran));
  assert_int_equal(zeEventHostSynchronize(after, FOREVER), ZE_RESULT_ERROR_DEVICE_LOST);
  check_lost(ran);
  ZE_OK(zeCommandListDestroy(l));
  ZE_OK(zeCommandListDestroy(other));
  ZE_OK(zeEventDestroy(ran));
  ZE_OK(zeEventDestroy(after));
  ZE_OK(zeKernelDestroy(k));
  ZE_OK(zeModuleDestroy(m));
}

/* ZEDRV_LOSE_AFTER=3: the third command completes, then the device is gone. */
static void test_lost_after_three(void **state) {
  ze_command_list_handle_t l = immediate(g.copy_ordinal, 0);
  char a[64], b[64] = {1};
  ze_event_handle_t ev[4];
  for (int i = 0; i < 3; i++) {
    ev[i] = new_event();
    ZE_OK(zeCommandListAppendMemoryCopy(l, a, b, sizeof a, ev[i], 0, NULL));
    ZE_OK(zeEventHostSynchronize(ev[i], FOREVER));
  }
  ev[3] = new_event();
  assert_int_equal(zeCommandListAppendMemoryCopy(l, a, b, sizeof a, ev[3], 0, NULL), ZE_RESULT_ERROR_DEVICE_LOST);
  check_lost(ev[3]);
  ZE_OK(zeCommandListDestroy(l));
  for (int i = 0; i < 4; i++) ZE_OK(zeEventDestroy(ev[i]));
}

/* ZEDRV_DEVICE_TYPE=cpu: a driver without a GPU. zeInit(0) succeeds and the device says CPU;
 * zeInit(ZE_INIT_FLAG_GPU_ONLY) fails (what a module's "no GPU device" probe meets). */
static int no_gpu(void) {
  ze_driver_handle_t d = NULL;
  ze_device_handle_t dev = NULL;
  uint32_t n = 1;
  ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
  if (zeInit(0) != ZE_RESULT_SUCCESS || zeDriverGet(&n, &d) != ZE_RESULT_SUCCESS || n != 1 ||
      zeDeviceGet(d, &n, &dev) != ZE_RESULT_SUCCESS || n != 1 || zeDeviceGetProperties(dev, &p) != ZE_RESULT_SUCCESS) {
    fprintf(stderr, "test_ze_driver --no-gpu: the driver did not come up\n");
    return 1;
  }
  if (p.type != ZE_DEVICE_TYPE_CPU) {
    fprintf(stderr, "test_ze_driver --no-gpu: the device reports type %d, not CPU (ZEDRV_DEVICE_TYPE=cpu)\n", p.type);
    return 1;
  }
  ze_result_t r = zeInit(ZE_INIT_FLAG_GPU_ONLY);
  if (r != ZE_RESULT_ERROR_UNINITIALIZED) {
    fprintf(stderr, "test_ze_driver --no-gpu: zeInit(GPU_ONLY) answered 0x%x, not ZE_RESULT_ERROR_UNINITIALIZED\n", r);
    return 1;
  }
  printf("no-gpu: ok\n");
  return 0;
}

/* Leaves a context and an allocation behind: the driver reports the leak at exit (CTest looks
 * for its line). */
static int leak(void) {
  if (setup(NULL) != 0) return 1;
  host_alloc(64);
  printf("leak: exiting with a context and an allocation alive\n");
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--no-gpu") == 0) return no_gpu();
  if (argc == 2 && strcmp(argv[1], "--leak") == 0) return leak();
  if (argc == 3 && strcmp(argv[1], "--device-lost") == 0) {
    const struct CMUnitTest fault[] = {cmocka_unit_test(test_lost_kernel_fault)};
    const struct CMUnitTest after[] = {cmocka_unit_test(test_lost_after_three)};
    if (strcmp(argv[2], "kernel-fault") == 0) return cmocka_run_group_tests(fault, setup, teardown);
    if (strcmp(argv[2], "lose-after") == 0) {
      if (!getenv("ZEDRV_LOSE_AFTER")) {
        fprintf(stderr, "test_ze_driver --device-lost lose-after: set ZEDRV_LOSE_AFTER=3 (ctest does)\n");
        return 1;
      }
      return cmocka_run_group_tests(after, setup, teardown);
    }
    fprintf(stderr, "test_ze_driver: --device-lost %s: expected kernel-fault or lose-after\n", argv[2]);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_discovery),
      cmocka_unit_test(test_devices),
      cmocka_unit_test(test_validation_layer),
      cmocka_unit_test(test_memory),
      cmocka_unit_test(test_import),
      cmocka_unit_test(test_runs_later),
      cmocka_unit_test(test_runs_later_ungated),
      cmocka_unit_test(test_strict_device_memory),
      cmocka_unit_test(test_signal_once),
      cmocka_unit_test(test_wait_orders),
      cmocka_unit_test(test_missing_wait_reads_stale),
      cmocka_unit_test(test_list_order),
      cmocka_unit_test(test_list_reorders),
      cmocka_unit_test(test_reset_under_wait),
      cmocka_unit_test(test_destroy_busy_pool),
      cmocka_unit_test(test_region_copy),
      cmocka_unit_test(test_copy_past_end),
      cmocka_unit_test(test_queue_and_fence),
      cmocka_unit_test(test_synchronous_list),
      cmocka_unit_test(test_kernel),
      cmocka_unit_test(test_kernel_f64),
      cmocka_unit_test(test_project_kernel),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
