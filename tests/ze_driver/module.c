/* Modules and kernels. zeModuleCreate takes a SPIR-V binary, checks its header, reads its kernel
 * entry points and its capabilities (an fp64 module does not build where ZEDRV_NO_FP64=1), and
 * keeps the names; zeKernelCreate binds a name to its host implementation (kernels.c). */
#define _GNU_SOURCE
#include "zedrv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPIRV_MAGIC 0x07230203u
#define SPIRV_OP_CAPABILITY 17u
#define SPIRV_OP_ENTRY_POINT 15u
#define SPIRV_CAP_FLOAT64 10u
#define SPIRV_EXEC_MODEL_KERNEL 6u

struct _ze_module_build_log_handle_t {
  int magic;
  char text[256];
};

static bool live(const void *obj) {
  return obj && *(const int *)obj == ZEDRV_MAGIC_LIVE;
}

static void set_log(ze_module_build_log_handle_t *out, const char *text) {
  if (!out) return;
  *out = calloc(1, sizeof **out);
  if (!*out) return;
  (*out)->magic = ZEDRV_MAGIC_LIVE;
  snprintf((*out)->text, sizeof(*out)->text, "%s", text);
}

static void free_names(ze_module_handle_t m) {
  for (uint32_t i = 0; i < m->nnames; i++) free(m->names[i]);
  free(m->names);
}

/* Reads the kernel entry points of a SPIR-V module (a literal string is NUL-terminated within
 * its words); returns a build-log message or NULL. */
static const char *parse_spirv(ze_module_handle_t m, const uint32_t *w, size_t nwords) {
  if (nwords < 5 || w[0] != SPIRV_MAGIC) return "not a SPIR-V module (bad magic number)";
  for (size_t i = 5; i < nwords;) {
    uint32_t count = w[i] >> 16, op = w[i] & 0xffff;
    if (count == 0 || i + count > nwords) return "truncated SPIR-V instruction stream";
    if (op == SPIRV_OP_CAPABILITY && count == 2 && w[i + 1] == SPIRV_CAP_FLOAT64 && zd.no_fp64)
      return "the module needs Float64 and the device has no fp64";
    if (op == SPIRV_OP_ENTRY_POINT && count >= 4 && w[i + 1] == SPIRV_EXEC_MODEL_KERNEL) {
      const char *name = (const char *)&w[i + 3];
      size_t max = (count - 3) * 4;
      if (strnlen(name, max) == max) return "an entry point name is not terminated";
      char **n = realloc(m->names, (m->nnames + 1) * sizeof *n);
      if (!n) return "out of host memory";
      m->names = n;
      if (!(m->names[m->nnames] = strdup(name))) return "out of host memory";
      m->nnames++;
    }
    i += count;
  }
  return NULL;
}

static ze_result_t ZE_APICALL module_create(ze_context_handle_t ctx, ze_device_handle_t dev,
                                            const ze_module_desc_t *desc, ze_module_handle_t *out,
                                            ze_module_build_log_handle_t *log) {
  if (log) *log = NULL;
  if (!live(ctx) || !zedrv_is_device(dev)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc->format != ZE_MODULE_FORMAT_IL_SPIRV) {
    set_log(log, "the test driver builds SPIR-V modules only");
    return ZE_RESULT_ERROR_INVALID_NATIVE_BINARY;
  }
  if (!desc->pInputModule || desc->inputSize % 4) return ZE_RESULT_ERROR_INVALID_SIZE;
  ze_module_handle_t m = calloc(1, sizeof *m);
  if (!m) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  /* copy to aligned words: the caller's buffer has no alignment promise */
  size_t nwords = desc->inputSize / 4;
  uint32_t *w = malloc(desc->inputSize ? desc->inputSize : 4);
  if (!w) {
    free(m);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  memcpy(w, desc->pInputModule, desc->inputSize);
  const char *err = parse_spirv(m, w, nwords);
  free(w);
  if (err) {
    set_log(log, err);
    free_names(m);
    free(m);
    return ZE_RESULT_ERROR_MODULE_BUILD_FAILURE;
  }
  set_log(log, "");
  m->magic = ZEDRV_MAGIC_LIVE;
  m->ctx = ctx;
  pthread_mutex_lock(&zd.lock);
  ctx->live_objects++;
  pthread_mutex_unlock(&zd.lock);
  *out = m;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL module_destroy(ze_module_handle_t m) {
  if (!live(m)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&zd.lock);
  if (m->kernels > 0) {
    zedrv_misuse("zeModuleDestroy: %d kernels of the module are still alive", m->kernels);
    pthread_mutex_unlock(&zd.lock);
    return ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
  }
  m->ctx->live_objects--;
  pthread_mutex_unlock(&zd.lock);
  m->magic = ZEDRV_MAGIC_DEAD;
  free_names(m);
  free(m);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL module_get_kernel_names(ze_module_handle_t m, uint32_t *count, const char **names) {
  if (!live(m)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (*count == 0 || !names) {
    *count = m->nnames;
    return ZE_RESULT_SUCCESS;
  }
  if (*count > m->nnames) *count = m->nnames;
  for (uint32_t i = 0; i < *count; i++) names[i] = m->names[i];
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL module_get_properties(ze_module_handle_t m, ze_module_properties_t *p) {
  p->flags = 0;
  return ZE_RESULT_SUCCESS;
}

ze_result_t zedrv_fill_module(ze_module_dditable_t *t) {
  t->pfnCreate = module_create;
  t->pfnDestroy = module_destroy;
  t->pfnGetKernelNames = module_get_kernel_names;
  t->pfnGetProperties = module_get_properties;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL log_destroy(ze_module_build_log_handle_t l) {
  if (!live(l)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  l->magic = ZEDRV_MAGIC_DEAD;
  free(l);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL log_get_string(ze_module_build_log_handle_t l, size_t *size, char *text) {
  if (!live(l)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  size_t need = strlen(l->text) + 1;
  if (*size == 0 || !text) {
    *size = need;
    return ZE_RESULT_SUCCESS;
  }
  snprintf(text, *size, "%s", l->text);
  return ZE_RESULT_SUCCESS;
}

ze_result_t zedrv_fill_module_build_log(ze_module_build_log_dditable_t *t) {
  t->pfnDestroy = log_destroy;
  t->pfnGetString = log_get_string;
  return ZE_RESULT_SUCCESS;
}

/* ---- kernels ----------------------------------------------------------------------------- */

static ze_result_t ZE_APICALL kernel_create(ze_module_handle_t m, const ze_kernel_desc_t *desc,
                                            ze_kernel_handle_t *out) {
  if (!live(m)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!desc->pKernelName) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  bool in_module = false;
  for (uint32_t i = 0; i < m->nnames && !in_module; i++) in_module = strcmp(m->names[i], desc->pKernelName) == 0;
  if (!in_module) return ZE_RESULT_ERROR_INVALID_KERNEL_NAME;
  const zedrv_host_kernel *fn = zedrv_find_host_kernel(desc->pKernelName);
  if (!fn) {
    fprintf(stderr,
            "zedrv: kernel %s is in the module but has no host implementation: add one to "
            "tests/ze_driver/kernels.c\n",
            desc->pKernelName);
    return ZE_RESULT_ERROR_INVALID_KERNEL_NAME;
  }
  ze_kernel_handle_t k = calloc(1, sizeof *k);
  if (!k || !(k->name = strdup(desc->pKernelName))) {
    free(k);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  k->magic = ZEDRV_MAGIC_LIVE;
  k->module = m;
  k->fn = fn;
  k->group_size[0] = k->group_size[1] = k->group_size[2] = 1;
  pthread_mutex_lock(&zd.lock);
  m->kernels++;
  pthread_mutex_unlock(&zd.lock);
  *out = k;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL kernel_destroy(ze_kernel_handle_t k) {
  if (!live(k)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&zd.lock);
  k->module->kernels--;
  pthread_mutex_unlock(&zd.lock);
  k->magic = ZEDRV_MAGIC_DEAD;
  free(k->name);
  free(k);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL kernel_set_group_size(ze_kernel_handle_t k, uint32_t x, uint32_t y, uint32_t z) {
  if (!live(k)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!x || !y || !z || (uint64_t)x * y * z > 1024 || z > 64) return ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION;
  k->group_size[0] = x;
  k->group_size[1] = y;
  k->group_size[2] = z;
  return ZE_RESULT_SUCCESS;
}

static uint32_t largest_divisor(uint32_t n, uint32_t max) {
  for (uint32_t d = n < max ? n : max; d > 1; d--)
    if (n % d == 0) return d;
  return 1;
}

static ze_result_t ZE_APICALL kernel_suggest_group_size(ze_kernel_handle_t k, uint32_t gx, uint32_t gy, uint32_t gz,
                                                        uint32_t *x, uint32_t *y, uint32_t *z) {
  if (!live(k)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  *x = largest_divisor(gx ? gx : 1, 256);
  *y = largest_divisor(gy ? gy : 1, 1024 / *x);
  *z = largest_divisor(gz ? gz : 1, 1024 / (*x * *y) < 64 ? 1024 / (*x * *y) : 64);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL kernel_set_argument_value(ze_kernel_handle_t k, uint32_t index, size_t size,
                                                        const void *value) {
  if (!live(k)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (index >= k->fn->nargs) return ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX;
  if (size != k->fn->arg_size[index]) return ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE;
  if (value)
    memcpy(k->args.value[index], value, size);
  else
    memset(k->args.value[index], 0, size); /* a NULL pointer argument */
  k->args.size[index] = (uint32_t)size;
  k->args.set_mask |= 1u << index;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL kernel_set_indirect_access(ze_kernel_handle_t k, ze_kernel_indirect_access_flags_t f) {
  return live(k) ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

static ze_result_t ZE_APICALL kernel_set_cache_config(ze_kernel_handle_t k, ze_cache_config_flags_t f) {
  return live(k) ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

static ze_result_t ZE_APICALL kernel_get_properties(ze_kernel_handle_t k, ze_kernel_properties_t *p) {
  if (!live(k)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  p->numKernelArgs = k->fn->nargs;
  p->requiredGroupSizeX = p->requiredGroupSizeY = p->requiredGroupSizeZ = 0;
  p->requiredNumSubGroups = 0;
  p->requiredSubgroupSize = 0;
  p->maxSubgroupSize = 32;
  p->maxNumSubgroups = 64;
  p->localMemSize = 0;
  p->privateMemSize = 0;
  p->spillMemSize = 0;
  memset(&p->uuid, 0, sizeof p->uuid);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL kernel_get_name(ze_kernel_handle_t k, size_t *size, char *name) {
  if (!live(k)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  size_t need = strlen(k->name) + 1;
  if (*size == 0 || !name) {
    *size = need;
    return ZE_RESULT_SUCCESS;
  }
  snprintf(name, *size, "%s", k->name);
  return ZE_RESULT_SUCCESS;
}

ze_result_t zedrv_fill_kernel(ze_kernel_dditable_t *t) {
  t->pfnCreate = kernel_create;
  t->pfnDestroy = kernel_destroy;
  t->pfnSetCacheConfig = kernel_set_cache_config;
  t->pfnSetGroupSize = kernel_set_group_size;
  t->pfnSuggestGroupSize = kernel_suggest_group_size;
  t->pfnSetArgumentValue = kernel_set_argument_value;
  t->pfnSetIndirectAccess = kernel_set_indirect_access;
  t->pfnGetProperties = kernel_get_properties;
  t->pfnGetName = kernel_get_name;
  return ZE_RESULT_SUCCESS;
}
