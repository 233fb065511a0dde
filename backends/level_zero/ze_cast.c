/* The level_zero backend's kernels (ze_cast.h): its SPIR-V modules built on the device, and
 * their kernels by name, created once at init. */
#define _GNU_SOURCE
#include "ze_cast.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ze_spirv.h"

static const char *rn(ze_result_t r) {
  static __thread char buf[32];
  return sl__ze_result_name(r, buf, sizeof buf);
}

/* every kernel of ze_kernels.h: name, module, SGD or not */
#define SLZK_CAST(s, d, mod) {SL_ZE_CAST_NAME(s, d), mod, 0}, {SL_ZE_CAST_BYTES_NAME(s, d), mod, 0},
#define SLZK_CAST_BASE(s, d) SLZK_CAST(s, d, SL_ZE_MODULE_BASE)
#define SLZK_CAST_F64(s, d) SLZK_CAST(s, d, SL_ZE_MODULE_F64)
#define SLZK_SGD_BASE(dt) {SL_ZE_SGD_NAME(dt), SL_ZE_MODULE_BASE, 1},
#define SLZK_SGD_F64(dt) {SL_ZE_SGD_NAME(dt), SL_ZE_MODULE_F64, 1},
static const struct {
  const char *name;
  int module, sgd;
} all_kernels[] = {SL_ZE_CASTS_BASE(SLZK_CAST_BASE) SL_ZE_SGD_BASE(SLZK_SGD_BASE) SL_ZE_CASTS_F64(SLZK_CAST_F64)
                       SL_ZE_SGD_F64(SLZK_SGD_F64)};
#define SLZK_COUNT (sizeof all_kernels / sizeof all_kernels[0])

int sl__ze_kernels_run(const sl_ze_kernels *K, int module, int sgd) {
  if (module < 0 || module >= SL_ZE_MODULE_COUNT || !K->mod[module]) return 0;
  return !SL_ZE_NEEDS_F32_DENORMALS(module, sgd) || K->f32_denorms;
}

const char *sl__ze_kernels_why_not(const sl_ze_kernels *K, int module, int sgd) {
  if (module == SL_ZE_MODULE_F64 && !K->fp64) return "the device has no fp64";
  if (SL_ZE_NEEDS_F32_DENORMALS(module, sgd) && !K->f32_denorms)
    return "the device may flush F32 subnormals (no ZE_DEVICE_FP_FLAG_DENORM), which changes these results";
  return "its kernels were not built";
}

const sl_ze_kernel *sl__ze_kernel_get(const sl_ze_kernels *K, const char *name) {
  for (size_t i = 0; name && i < K->n; i++)
    if (strcmp(K->tab[i].name, name) == 0) return K->tab[i].k ? &K->tab[i] : NULL;
  return NULL;
}

void sl__ze_kernels_describe(const sl_ze_kernels *K, char *buf, size_t len) {
  int f64 = sl__ze_kernels_run(K, SL_ZE_MODULE_F64, 0), sgd = sl__ze_kernels_run(K, SL_ZE_MODULE_BASE, 1);
  if (f64 && sgd)
    snprintf(buf, len, "casts and SGD on the device");
  else if (!K->fp64)
    snprintf(buf, len, "casts on the device (F64 on the host: no fp64)%s", sgd ? "" : "; SGD on the host");
  else /* fp64, but F32 subnormals may be flushed: the F64 casts and the SGD steps differ there */
    snprintf(buf, len, "casts on the device (F64 and SGD on the host: F32 subnormals not kept)");
}

/* The build log of a failed zeModuleCreate, into WHY after what it already holds. */
static void append_log(ze_module_build_log_handle_t log, char *why, size_t len) {
  size_t n = 0, used = strlen(why);
  if (!log) return;
  if (sl__ze.ModuleBuildLogGetString(log, &n, NULL) == ZE_RESULT_SUCCESS && n > 1 && used + 3 < len) {
    char *text = malloc(n);
    if (text && sl__ze.ModuleBuildLogGetString(log, &n, text) == ZE_RESULT_SUCCESS) {
      text[n - 1] = 0;
      snprintf(why + used, len - used, ": %s", text);
    }
    free(text);
  }
}

/* Builds module M from its embedded SPIR-V; no build flags (ze_spirv.h says why). */
static sl_status build_module(sl_ze_kernels *K, ze_context_handle_t ctx, ze_device_handle_t dev, int m, char *why,
                              size_t len) {
  ze_module_desc_t md = {.stype = ZE_STRUCTURE_TYPE_MODULE_DESC,
                         .format = ZE_MODULE_FORMAT_IL_SPIRV,
                         .inputSize = m == SL_ZE_MODULE_BASE ? sl__ze_spirv_base_size : sl__ze_spirv_f64_size,
                         .pInputModule = m == SL_ZE_MODULE_BASE ? sl__ze_spirv_base : sl__ze_spirv_f64,
                         .pBuildFlags = ""};
  ze_module_build_log_handle_t log = NULL;
  ze_result_t r = sl__ze.ModuleCreate(ctx, dev, &md, &K->mod[m], &log);
  if (r != ZE_RESULT_SUCCESS) {
    K->mod[m] = NULL;
    snprintf(why, len, "zeModuleCreate of the %s cast kernels (SPIR-V, %zu bytes) failed: %s",
             m == SL_ZE_MODULE_BASE ? "base" : "F64", (size_t)md.inputSize, rn(r));
    append_log(log, why, len);
  }
  if (log) sl__ze.ModuleBuildLogDestroy(log);
  return r == ZE_RESULT_SUCCESS ? SL_OK : SL_ERR_BACKEND;
}

/* Kernel T by name from its module, with the group size the driver suggests for a large grid
 * (a power of two, which every suggestion divides). */
static sl_status create_kernel(sl_ze_kernels *K, sl_ze_kernel *t, char *why, size_t len) {
  ze_kernel_desc_t kd = {.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC, .pKernelName = t->name};
  ze_result_t r = sl__ze.KernelCreate(K->mod[t->module], &kd, &t->k);
  uint32_t x = 0, y = 0, z = 0;
  if (r == ZE_RESULT_SUCCESS) r = sl__ze.KernelSuggestGroupSize(t->k, 1u << 20, 1, 1, &x, &y, &z);
  if (r == ZE_RESULT_SUCCESS && !x) r = ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION;
  if (r == ZE_RESULT_SUCCESS) r = sl__ze.KernelSetGroupSize(t->k, x, 1, 1);
  if (r != ZE_RESULT_SUCCESS) {
    if (t->k) sl__ze.KernelDestroy(t->k);
    t->k = NULL;
    snprintf(why, len, "kernel %s (zeKernelCreate, its group size): %s", t->name, rn(r));
    return SL_ERR_BACKEND;
  }
  t->group_size = x;
  return SL_OK;
}

sl_status sl__ze_kernels_init(sl_ze_kernels *K, ze_context_handle_t ctx, ze_device_handle_t dev, char *why,
                              size_t len) {
  memset(K, 0, sizeof *K);
  ze_device_module_properties_t mp = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MODULE_PROPERTIES};
  ze_result_t r = sl__ze.DeviceGetModuleProperties(dev, &mp);
  if (r != ZE_RESULT_SUCCESS) {
    snprintf(why, len, "zeDeviceGetModuleProperties failed: %s", rn(r));
    return SL_ERR_BACKEND;
  }
  K->fp64 = (mp.flags & ZE_DEVICE_MODULE_FLAG_FP64) != 0;
  K->f32_denorms = (mp.fp32flags & ZE_DEVICE_FP_FLAG_DENORM) != 0;
  K->max_groups = SL_ZE_MAX_GROUPS;
  K->n = SLZK_COUNT;
  if (!(K->tab = calloc(K->n, sizeof *K->tab))) return snprintf(why, len, "out of memory"), SL_ERR_NOMEM;
  for (size_t i = 0; i < K->n; i++)
    K->tab[i] = (sl_ze_kernel){.name = all_kernels[i].name, .module = all_kernels[i].module, .sgd = all_kernels[i].sgd};
  sl_status s = build_module(K, ctx, dev, SL_ZE_MODULE_BASE, why, len);
  /* the F64 module only where it builds; where F32 subnormals are flushed none of its kernels
   * would run (they all need them), so it is not built either */
  if (s == SL_OK && K->fp64 && K->f32_denorms) s = build_module(K, ctx, dev, SL_ZE_MODULE_F64, why, len);
  for (size_t i = 0; s == SL_OK && i < K->n; i++)
    if (sl__ze_kernels_run(K, K->tab[i].module, K->tab[i].sgd)) s = create_kernel(K, &K->tab[i], why, len);
  if (s != SL_OK) sl__ze_kernels_fini(K);
  return s;
}

void sl__ze_kernels_fini(sl_ze_kernels *K) {
  for (size_t i = 0; K->tab && i < K->n; i++)
    if (K->tab[i].k) sl__ze.KernelDestroy(K->tab[i].k);
  free(K->tab);
  for (int m = 0; m < SL_ZE_MODULE_COUNT; m++)
    if (K->mod[m]) sl__ze.ModuleDestroy(K->mod[m]);
  memset(K, 0, sizeof *K);
}
