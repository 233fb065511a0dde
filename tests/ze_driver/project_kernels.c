/* The project's own kernels (the Level Zero module's casts and SGD steps, ze_kernels.h) as the
 * driver's extra host kernels (kernels.c's hook): each entry runs the kernel's host build
 * (backends/level_zero/kernels_host.h: kernels.cl compiled as host C, the very source of the
 * SPIR-V) over every work-item of the launch. Argument counts and sizes come from that table,
 * so a module that sets an argument of the wrong size is refused as a real driver refuses it.
 *
 * Linked into the driver only where the Level Zero module's kernels are built
 * (SHARDLOAD_WITH_LEVEL_ZERO=ON: target sl_ze_host_kernels); elsewhere the hook stays unset.
 *
 * A launch:
 *   - its grid is group size x group count in each dimension; the kernels read dimension 0's
 *     global id and size and stride over the grid (ze_kernels.h), so every (y, z) work-item
 *     runs dimension 0's items again, as a device would, and any grid covers COUNT elements;
 *   - a NULL buffer (argument 0 or 1: ze_kernels.h) with COUNT (argument 2) > 0 is a device
 *     fault: the device is lost, as for the examples;
 *   - with ZEDRV_NO_F32_DENORMS=1 it runs with the host's flush-to-zero and denormals-are-zero
 *     on (x86), as a device that flushes subnormals, so a kernel launched there that needs them
 *     gives wrong bits;
 *   - it is counted by name (zedrvGetLaunchCount), so a test can tell which kernels ran. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#define ZK_HAVE_FTZ 1
#endif

#include "kernels_host.h"
#include "zedrv.h"

/* one trampoline per kernel name: the driver's run function gets the launch, not the kernel */
#define ZK_CAST_RUNS(s, d) ZK_RUN(SL_ZE_CAST_NAME(s, d)) ZK_RUN(SL_ZE_CAST_BYTES_NAME(s, d))
#define ZK_SGD_RUNS(dt) ZK_RUN(SL_ZE_SGD_NAME(dt))
#define ZK_ALL(X_CAST, X_SGD) \
  SL_ZE_CASTS_BASE(X_CAST) SL_ZE_SGD_BASE(X_SGD) SL_ZE_CASTS_F64(X_CAST) SL_ZE_SGD_F64(X_SGD)

enum {
#define ZK_RUN(name) +1
  ZK_COUNT = 0 ZK_ALL(ZK_CAST_RUNS, ZK_SGD_RUNS)
#undef ZK_RUN
};

static const char *const zk_names[ZK_COUNT] = {
#define ZK_RUN(name) name,
    ZK_ALL(ZK_CAST_RUNS, ZK_SGD_RUNS)
#undef ZK_RUN
};

static uint64_t zk_launches[ZK_COUNT]; /* atomic */

static ze_result_t run_one(size_t idx, const zedrv_launch *l) {
  const sl__ze_host_kernel *k = sl__ze_host_kernel_find(zk_names[idx], -1);
  if (!k) return ZE_RESULT_ERROR_INVALID_KERNEL_NAME; /* the table below refused to list it */
  __atomic_add_fetch(&zk_launches[idx], 1, __ATOMIC_RELAXED);
  const void *args[SL_ZE_KERNEL_MAX_ARGS] = {0};
  for (unsigned i = 0; i < k->nargs; i++) args[i] = l->args->value[i];
  void *dst, *src;
  uint64_t count;
  memcpy(&dst, l->args->value[0], sizeof dst);
  memcpy(&src, l->args->value[1], sizeof src);
  memcpy(&count, l->args->value[2], sizeof count);
  if (count && (!dst || !src)) return ZE_RESULT_ERROR_DEVICE_LOST; /* a device would fault on the NULL pointer */
  uint64_t gx = (uint64_t)l->group_size[0] * l->groups.groupCountX;
  uint64_t gyz = (uint64_t)l->group_size[1] * l->groups.groupCountY * l->group_size[2] * l->groups.groupCountZ;
#ifdef ZK_HAVE_FTZ
  unsigned csr = _mm_getcsr();
  if (zd.no_f32_denorms) _mm_setcsr(csr | 0x8040u); /* FTZ | DAZ */
#endif
  for (uint64_t yz = 0; yz < gyz; yz++)
    for (uint64_t gid = 0; gid < gx; gid++) k->run((size_t)gid, (size_t)gx, args);
#ifdef ZK_HAVE_FTZ
  _mm_setcsr(csr);
#endif
  return ZE_RESULT_SUCCESS;
}

#define ZK_FN(i) \
  static ze_result_t run_##i(const zedrv_launch *l) { return run_one(i, l); }
/* trampolines 0 .. ZK_MAX-1; the table uses the first ZK_COUNT */
#define ZK_MAX 32
ZK_FN(0) ZK_FN(1) ZK_FN(2) ZK_FN(3) ZK_FN(4) ZK_FN(5) ZK_FN(6) ZK_FN(7) ZK_FN(8) ZK_FN(9) ZK_FN(10) ZK_FN(11)
ZK_FN(12) ZK_FN(13) ZK_FN(14) ZK_FN(15) ZK_FN(16) ZK_FN(17) ZK_FN(18) ZK_FN(19) ZK_FN(20) ZK_FN(21) ZK_FN(22)
ZK_FN(23) ZK_FN(24) ZK_FN(25) ZK_FN(26) ZK_FN(27) ZK_FN(28) ZK_FN(29) ZK_FN(30) ZK_FN(31)
static ze_result_t (*const zk_runs[ZK_MAX])(const zedrv_launch *) = {
    run_0,  run_1,  run_2,  run_3,  run_4,  run_5,  run_6,  run_7,  run_8,  run_9,  run_10,
    run_11, run_12, run_13, run_14, run_15, run_16, run_17, run_18, run_19, run_20, run_21,
    run_22, run_23, run_24, run_25, run_26, run_27, run_28, run_29, run_30, run_31};
_Static_assert(ZK_COUNT <= ZK_MAX, "more project kernels than trampolines: add ZK_FN lines");

static zedrv_host_kernel zk_table[ZK_COUNT];
static size_t zk_n;
static pthread_once_t zk_once = PTHREAD_ONCE_INIT;

/* The driver's entries, from the host table's argument counts and sizes; a name of ze_kernels.h
 * the host build lacks (or one whose arguments the driver cannot hold) is left out, so that
 * zeKernelCreate refuses it and says so. */
static void build_table(void) {
  for (size_t i = 0; i < ZK_COUNT; i++) {
    const sl__ze_host_kernel *k = sl__ze_host_kernel_find(zk_names[i], -1);
    if (!k || k->nargs < 3 || k->nargs > ZEDRV_MAX_ARGS) {
      fprintf(stderr, "zedrv: project kernel %s: no host build with its arguments (kernels_host.h)\n", zk_names[i]);
      continue;
    }
    zedrv_host_kernel *e = &zk_table[zk_n++];
    e->name = k->name;
    e->nargs = k->nargs;
    for (unsigned a = 0; a < k->nargs; a++) e->arg_size[a] = (uint32_t)k->arg_size[a];
    e->run = zk_runs[i];
  }
}

const zedrv_host_kernel *zedrv_extra_host_kernels(size_t *count) {
  pthread_once(&zk_once, build_table);
  *count = zk_n;
  return zk_table;
}

ze_result_t ZE_APICALL zedrv_get_launch_count(ze_driver_handle_t d, const char *name, uint64_t *count) {
  if (!name || !count) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  for (size_t i = 0; i < ZK_COUNT; i++)
    if (strcmp(zk_names[i], name) == 0) {
      *count = __atomic_load_n(&zk_launches[i], __ATOMIC_RELAXED);
      return ZE_RESULT_SUCCESS;
    }
  return ZE_RESULT_ERROR_INVALID_KERNEL_NAME;
}
