/* The shardload test driver for Level Zero (tests only, never installed).
 *
 * A driver library that the real Level Zero loader (libze_loader.so.1) loads when it is named
 * in ZE_ENABLE_ALT_DRIVERS: one GPU device (ZEDRV_DEVICES for more) whose memory is host memory, command lists whose
 * commands run LATER on a worker thread per engine after a random delay, signal-once events,
 * fences, a copy-only and a compute queue group, region copies, host-pointer import, and
 * modules whose kernels run by name through host implementations (kernels.c).
 *
 * It is as strict as the API: nothing orders two commands of one list except events, barriers
 * and the in-order flag (they overlap and complete in any order otherwise: engine.c), nothing
 * orders two engines except events, nothing runs at append time (unless the list is
 * synchronous), and an event once signalled stays signalled until the host resets it. Uses the API leaves undefined (signalling an event that is already
 * signalled or has a signal pending, resetting an event a queued command still signals or a
 * queued command not yet started waits for,
 * synchronizing on a pool that is not host-visible, destroying a busy object, leaving contexts or
 * memory alive at exit) are counted as
 * misuse: zedrvGetMisuseCount (through zeDriverGetExtensionFunctionAddress) reads the count,
 * ZEDRV_MISUSE=abort aborts at the first one, and each prints one line to stderr.
 *
 * Environment (read at the first zeInit):
 *   ZEDRV_DELAY_US=min:max   random delay before each command runs (default 0:300)
 *   ZEDRV_DEVICES=n          n devices (default 1, at most 8), each with its own name, UUID and PCI
 *                            address (memory is shared host memory; allocations know their device)
 *   ZEDRV_DEVICE_TYPE=t      what the devices report: gpu (default), cpu, fpga or vpu
 *   ZEDRV_GROUPS=copy-first  ordinal 0 is the copy-only group (default: compute first), so a
 *                            client that takes group 0 for copies or kernels blindly is caught
 *   ZEDRV_MAX_ALLOC=bytes    the device's maxMemAllocSize (default 4 GiB), enforced on device, host
 *                            and shared allocations unless the relaxed-limit descriptor is chained
 *   ZEDRV_NO_RELAXED_ALLOC=1 the driver does not list ZE_experimental_relaxed_allocation_limits and
 *                            ignores its descriptor (maxMemAllocSize holds for every allocation)
 *   ZEDRV_MEMORY=bytes       the device's memory (default 16 GiB; allocations are counted)
 *   ZEDRV_NO_FP64=1          the device reports no fp64 support
 *   ZEDRV_NO_F32_DENORMS=1   the device's fp32flags lack ZE_DEVICE_FP_FLAG_DENORM (it may flush
 *                            F32 subnormals; the host kernels still keep them)
 *   ZEDRV_NO_IMPORT=1        zexDriverImportExternalPointer is not offered
 *   ZEDRV_MISUSE=abort       abort at the first misuse instead of counting it
 *   ZEDRV_LOSE_AFTER=n       the device is lost once n commands have run (every later call that
 *                            touches it answers ZE_RESULT_ERROR_DEVICE_LOST)
 *   ZEDRV_STRICT=1           device memory is unreadable to the host outside the driver's own
 *                            commands (mapped PROT_NONE, opened by an engine while a command that
 *                            names it runs, as sim:strict): a host read of it faults
 *
 * Test-only extensions (zeDriverGetExtensionFunctionAddress):
 *   zedrvGetMisuseCount(hDriver, uint64_t *count)
 *   zedrvLoseDevice(hDriver)                               the device is lost now
 *   zedrvSetDelayUs(hDriver, uint32_t min, uint32_t max)   the delay of the commands that start from now
 *   zedrvGetLaunchCount(hDriver, const char *name, uint64_t *count)   launches of the project's
 *                            kernel NAME run so far (project_kernels.c; offered where it is built)
 *
 * One mutex (zd.lock) guards every object; workers and host waits sleep on one condition
 * variable (zd.cond), broadcast whenever an event, fence or queue changes state. It is a test
 * driver: simple and obviously correct beats fast. */
#ifndef ZEDRV_H
#define ZEDRV_H

#include <level_zero/ze_api.h>
#include <level_zero/ze_ddi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ZEDRV_MAX_ARGS 16
#define ZEDRV_MAX_ARG_SIZE 64
#define ZEDRV_NUM_GROUPS 2
#define ZEDRV_MAX_DEVICES 8

/* ---- objects (the opaque handle types of ze_api.h are these structs) ---------------------- */

struct _ze_driver_handle_t {
  int magic;
};
struct _ze_device_handle_t {
  int magic;
  uint32_t index; /* of ZEDRV_DEVICES */
};
struct _ze_context_handle_t {
  int magic;
  int live_objects; /* lists, pools, modules, allocations made in it: destroy refuses if > 0 */
};

typedef struct zedrv_engine zedrv_engine;

struct _ze_event_pool_handle_t {
  int magic;
  ze_context_handle_t ctx;
  ze_event_pool_flags_t flags;
  uint32_t count;
  struct _ze_event_handle_t **slots; /* the event created at each index, or NULL */
};

struct _ze_event_handle_t {
  int magic;
  ze_event_pool_handle_t pool;
  uint32_t index;
  bool signalled;
  int pending_signals; /* queued commands that will signal it */
  int pending_waits;   /* queued commands, not yet started, that wait for it */
};

struct _ze_fence_handle_t {
  int magic;
  ze_command_queue_handle_t queue;
  bool signalled;
  bool pending;
};

/* The flags of spec 1.7 that the 1.8.12 headers (API 1.4) lack: honoured here, as by the
 * drivers that report 1.7 or later. */
#ifndef ZE_COMMAND_QUEUE_FLAG_IN_ORDER
#define ZE_COMMAND_QUEUE_FLAG_IN_ORDER ((ze_command_queue_flags_t)ZE_BIT(1))
#endif
#ifndef ZE_COMMAND_LIST_FLAG_IN_ORDER
#define ZE_COMMAND_LIST_FLAG_IN_ORDER ((ze_command_list_flags_t)ZE_BIT(3))
#endif

#define ZEDRV_WORKERS 3 /* worker threads per engine: unordered commands overlap */

typedef enum {
  ZEDRV_CMD_COPY,
  ZEDRV_CMD_COPY_REGION,
  ZEDRV_CMD_FILL,
  ZEDRV_CMD_BARRIER, /* zeCommandListAppendBarrier / WaitOnEvents: blocks every later command */
  ZEDRV_CMD_SIGNAL,  /* zeCommandListAppendSignalEvent: no work, no ordering of its own */
  ZEDRV_CMD_KERNEL,
  ZEDRV_CMD_FENCE, /* queue-internal: signals a fence once everything before it completed */
} zedrv_cmd_kind;

typedef struct zedrv_kernel_args {
  uint32_t set_mask;
  uint32_t size[ZEDRV_MAX_ARGS];
  unsigned char value[ZEDRV_MAX_ARGS][ZEDRV_MAX_ARG_SIZE];
} zedrv_kernel_args;

typedef struct zedrv_cmd {
  struct zedrv_cmd *next;
  zedrv_cmd_kind kind;
  uint64_t seq;  /* append order on its engine */
  bool ordered;  /* from an in-order list or queue: starts once everything before it completed */
  uint32_t nopened;
  void *opened[ZEDRV_MAX_ARGS + 2]; /* strict mode: the allocations an engine opened for it */
  uint32_t nwait;
  ze_event_handle_t *wait;
  ze_event_handle_t signal;
  ze_fence_handle_t fence;
  union {
    struct {
      void *dst;
      const void *src;
      size_t size;
    } copy;
    struct {
      char *dst;
      const char *src;
      ze_copy_region_t dr, sr;
      uint32_t dpitch, dslice, spitch, sslice;
    } region;
    struct {
      char *dst;
      unsigned char pattern[128];
      size_t pattern_size, size;
    } fill;
    struct {
      const struct zedrv_host_kernel *fn;
      zedrv_kernel_args args;
      uint32_t group_size[3];
      ze_group_count_t groups;
    } kernel;
  } u;
} zedrv_cmd;

/* One engine: the commands queued on it in append order (not yet started), those running, and
 * ZEDRV_WORKERS worker threads, each of which starts ANY queued command that nothing orders
 * after another (engine.c says what orders them), picked at random. */
struct zedrv_engine {
  pthread_t threads[ZEDRV_WORKERS];
  int nthreads;
  zedrv_cmd *head, *tail; /* queued */
  zedrv_cmd *running;     /* started, not yet retired (unordered) */
  int in_flight;          /* queued + running */
  uint64_t next_seq;
  unsigned seed;
  bool stop;
  bool copy_only;
  bool in_order; /* ZE_COMMAND_QUEUE_FLAG_IN_ORDER / ZE_COMMAND_LIST_FLAG_IN_ORDER */
};

struct _ze_command_queue_handle_t {
  int magic;
  ze_context_handle_t ctx;
  zedrv_engine engine;
  ze_command_queue_mode_t mode;
};

struct _ze_command_list_handle_t {
  int magic;
  ze_context_handle_t ctx;
  bool immediate;
  bool closed;
  bool copy_only;
  zedrv_engine engine; /* immediate lists: their own engine */
  ze_command_queue_mode_t mode;
  bool in_order;          /* ZE_COMMAND_LIST_FLAG_IN_ORDER (regular lists) */
  zedrv_cmd *head, *tail; /* regular lists: the recorded commands */
  int executing;          /* regular lists: times queued and not yet finished */
};

struct _ze_module_handle_t {
  int magic;
  ze_context_handle_t ctx;
  char **names; /* the SPIR-V module's kernel entry points */
  uint32_t nnames;
  int kernels; /* live kernels */
};

struct _ze_kernel_handle_t {
  int magic;
  ze_module_handle_t module;
  const struct zedrv_host_kernel *fn;
  char *name;
  uint32_t group_size[3];
  zedrv_kernel_args args;
};

/* ---- the host kernels (kernels.c): the hook for the project's SPIR-V kernels --------------- */

/* One launch as a host function sees it: each work-item's global id is derived from the group
 * size and count, as a device would; the function loops over them. */
typedef struct zedrv_launch {
  const zedrv_kernel_args *args;
  uint32_t group_size[3];
  ze_group_count_t groups;
} zedrv_launch;

typedef struct zedrv_host_kernel {
  const char *name;                  /* the SPIR-V entry point it implements */
  uint32_t nargs;                    /* every one must be set before a launch */
  uint32_t arg_size[ZEDRV_MAX_ARGS]; /* each argument's size in bytes (8 for a pointer) */
  /* Runs the whole launch on the worker; returns ZE_RESULT_SUCCESS or an error that makes
     * the device lost (a kernel fault). */
  ze_result_t (*run)(const zedrv_launch *launch);
} zedrv_host_kernel;

const zedrv_host_kernel *zedrv_find_host_kernel(const char *name);
/* Another source's table of host kernels (kernels.c says how to add one); weak: may be absent. */
const zedrv_host_kernel *zedrv_extra_host_kernels(size_t *count) __attribute__((weak, visibility("hidden")));
/* zedrvGetLaunchCount (project_kernels.c, linked where the Level Zero module's kernels are
 * built); weak: may be absent. ZE_RESULT_ERROR_INVALID_KERNEL_NAME for a name it does not run. */
ze_result_t ZE_APICALL zedrv_get_launch_count(ze_driver_handle_t d, const char *name, uint64_t *count)
    __attribute__((weak, visibility("hidden")));
/* An argument's value as a pointer / a uint32 (the host function's accessors). */
void *zedrv_arg_ptr(const zedrv_launch *l, uint32_t i);
uint32_t zedrv_arg_u32(const zedrv_launch *l, uint32_t i);

/* ---- the driver's state ------------------------------------------------------------------- */

typedef struct zedrv_alloc {
  char *base;
  size_t size;
  ze_memory_type_t type;     /* ZE_MEMORY_TYPE_UNKNOWN: an imported host range */
  ze_context_handle_t ctx;   /* NULL for an imported range */
  ze_device_handle_t device; /* device and shared allocations */
  uint64_t id;
  size_t charged; /* bytes counted against the device's memory */
  /* ZEDRV_STRICT=1: a device allocation is its own mapping, PROT_NONE unless an engine has it
     * open (opens > 0) */
  void *map_base;
  size_t map_len;
  int opens;
} zedrv_alloc;

typedef struct zedrv_state {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool initialized;
  unsigned delay_min_us, delay_max_us;
  bool copy_first, no_fp64, no_f32_denorms, no_import, abort_on_misuse, strict, no_relaxed;
  uint64_t max_alloc, memory, used;
  uint64_t misuse;
  int live_contexts; /* what is still alive at exit is reported as misuse (a leak) */
  uint64_t commands_run, lose_after; /* ZEDRV_LOSE_AFTER (0: never) */
  uint64_t next_alloc_id;
  bool device_lost;
  zedrv_alloc *allocs; /* sorted by base */
  size_t nallocs, cap_allocs;
  struct _ze_driver_handle_t driver;
  struct _ze_device_handle_t devices[ZEDRV_MAX_DEVICES];
  uint32_t ndevices;            /* ZEDRV_DEVICES (default 1) */
  ze_device_type_t device_type; /* ZEDRV_DEVICE_TYPE (default gpu) */
} zedrv_state;

extern zedrv_state zd;

#define ZEDRV_MAGIC_LIVE 0x5a454456 /* "ZEDV" */
#define ZEDRV_MAGIC_DEAD 0x44454144

/* Counts one misuse (see the header comment); call with zd.lock held. */
void zedrv_misuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void zedrv_env_init(void);
/* One of the driver's devices (not a sub-device, not a stale pointer). */
bool zedrv_is_device(ze_device_handle_t d);

/* memory (mem.c); call with zd.lock held */
const zedrv_alloc *zedrv_alloc_find(const void *ptr);
/* Strict mode: makes the device allocation holding ptr accessible while an engine uses it
 * (counted); returns its base for zedrv_alloc_close, or NULL where there is nothing to open. */
void *zedrv_alloc_open(const void *ptr);
void zedrv_alloc_close(void *base);

/* engines and commands (queue.c) */
ze_result_t zedrv_engine_start(zedrv_engine *e, bool copy_only, bool in_order);
void zedrv_engine_stop(zedrv_engine *e);
/* Queues a command (nothing runs here); zd.lock held. */
void zedrv_engine_push(zedrv_engine *e, zedrv_cmd *cmd);
void zedrv_cmd_free(zedrv_cmd *cmd);
/* Waits until the engine has run everything queued; zd.lock held. */
ze_result_t zedrv_engine_sync(zedrv_engine *e, uint64_t timeout_ns);

/* Waits, zd.lock held, until done(arg) or the device is lost, up to timeout_ns (0: a query;
 * UINT64_MAX: no bound). SUCCESS, NOT_READY on the timeout, or DEVICE_LOST. */
ze_result_t zedrv_wait(bool (*done)(const void *arg), const void *arg, uint64_t timeout_ns);

/* events (event.c); zd.lock held */
void zedrv_event_add_pending(ze_event_handle_t ev);
void zedrv_event_fire(ze_event_handle_t ev);
bool zedrv_event_is_signalled(ze_event_handle_t ev);
bool zedrv_group_is_copy_only(uint32_t ordinal);

/* the table-filling functions each source exports to ddi.c */
ze_result_t ZE_APICALL zedrv_init(ze_init_flags_t flags);
ze_result_t zedrv_fill_driver(ze_driver_dditable_t *t);
ze_result_t zedrv_fill_device(ze_device_dditable_t *t);
ze_result_t zedrv_fill_context(ze_context_dditable_t *t);
ze_result_t zedrv_fill_command_queue(ze_command_queue_dditable_t *t);
ze_result_t zedrv_fill_command_list(ze_command_list_dditable_t *t);
ze_result_t zedrv_fill_event(ze_event_dditable_t *t);
ze_result_t zedrv_fill_event_pool(ze_event_pool_dditable_t *t);
ze_result_t zedrv_fill_fence(ze_fence_dditable_t *t);
ze_result_t zedrv_fill_mem(ze_mem_dditable_t *t);
ze_result_t zedrv_fill_module(ze_module_dditable_t *t);
ze_result_t zedrv_fill_module_build_log(ze_module_build_log_dditable_t *t);
ze_result_t zedrv_fill_kernel(ze_kernel_dditable_t *t);

/* the zex extension (mem.c), reached through zeDriverGetExtensionFunctionAddress */
ze_result_t ZE_APICALL zedrv_import_external_pointer(ze_driver_handle_t d, void *ptr, size_t size);
ze_result_t ZE_APICALL zedrv_release_imported_pointer(ze_driver_handle_t d, void *ptr);
ze_result_t ZE_APICALL zedrv_get_host_pointer_base_address(ze_driver_handle_t d, void *ptr, void **base);

#endif
