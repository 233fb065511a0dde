/* Module registry: built-in modules are listed here; GPU modules are shared objects
 * (libshardload-<name>.so) found next to libshardload, in $SHARDLOAD_MODULE_PATH, or on the
 * loader's path, and opened only when asked for (or probed for "auto"). A machine without a
 * vendor runtime thus reports that module unavailable instead of failing to start. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct builtin_backend {
  const char *name;
  const sl_backend_ops *(*get)(void);
} builtin_backend;

typedef struct builtin_collective {
  const char *name;
  const sl_collective_ops *(*get)(void);
} builtin_collective;

static const builtin_backend builtin_backends[] = {
    {"cpu", sl__backend_cpu},
    {"sim", sl__backend_sim},
};
static const char *const loadable_backends[] = {"cuda", "hip", "level_zero"};

static const builtin_collective builtin_collectives[] = {
    {"local", sl__collective_local},
#ifdef SHARDLOAD_HAVE_GLOO
    {"gloo", sl__collective_gloo},
#endif
};
static const char *const loadable_collectives[] = {"nccl", "rccl"};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Levenshtein distance, for "did you mean" suggestions on mistyped module names. */
static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 32 || lb > 32) return SIZE_MAX;
  size_t row[33];
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t prev = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t cur = row[j];
      size_t sub = prev + (a[i - 1] != b[j - 1]);
      size_t del = row[j] + 1, ins = row[j - 1] + 1;
      row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
      prev = cur;
    }
  }
  return row[lb];
}

static const char *nearest(const char *name, const char *const *names, size_t n) {
  const char *best = NULL;
  size_t bd = 3; /* suggest only close names */
  for (size_t i = 0; i < n; i++) {
    size_t d = edit_distance(name, names[i]);
    if (d < bd) {
      bd = d;
      best = names[i];
    }
  }
  return best;
}

/* dlopen libshardload-NAME.so: $SHARDLOAD_MODULE_PATH entries, then the directory of this
 * library, then the dynamic loader's own search. Records dlerror() of the last try. */
static void *open_module(const char *name, char *why, size_t whylen) {
  char file[128], path[PATH_MAX];
  snprintf(file, sizeof file, "libshardload-%s.so", name);
  const char *env = getenv("SHARDLOAD_MODULE_PATH");
  if (env && *env) {
    char *copy = sl__strdup(env), *save = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
      snprintf(path, sizeof path, "%s/%s", dir, file);
      void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h) {
        free(copy);
        return h;
      }
    }
    free(copy);
  }
  Dl_info info;
  if (dladdr((void *)open_module, &info) && info.dli_fname) {
    const char *slash = strrchr(info.dli_fname, '/');
    if (slash) {
      snprintf(path, sizeof path, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname, file);
      void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h) return h;
    }
  }
  void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(why, whylen, "%s", e ? e : "not found");
  }
  return h;
}

static bool backend_table_ok(const sl_backend_ops *o) {
  return o && o->abi_version == SL_BACKEND_ABI_VERSION &&
         o->size >= offsetof(sl_backend_ops, synchronize) + sizeof(o->synchronize) && o->name && o->score &&
         o->init && o->fini && o->alloc_device && o->free_device && o->copy_h2d && o->copy_d2h &&
         o->copy_d2d && o->synchronize;
}

static bool collective_table_ok(const sl_collective_ops *o) {
  return o && o->abi_version == SL_COLLECTIVE_ABI_VERSION &&
         o->size >= offsetof(sl_collective_ops, barrier) + sizeof(o->barrier) && o->name && o->init &&
         o->fini && o->broadcast && o->scatterv && o->allgather && o->barrier;
}

static sl_status load_backend(sl_context *ctx, const char *name, const sl_backend_ops **ops, void **dl) {
  char why[512] = "";
  void *h = open_module(name, why, sizeof why);
  if (!h)
    return sl__fail(ctx, SL_ERR_NO_DEVICE,
                    "backend '%s' is not available here (%s); build it with -DSHARDLOAD_WITH_%s=ON on a "
                    "machine with its runtime, or use --backend cpu",
                    name, why, strcmp(name, "level_zero") == 0 ? "LEVEL_ZERO" : strcmp(name, "hip") == 0 ? "HIP" : "CUDA");
  sl_backend_entry_fn entry = (sl_backend_entry_fn)dlsym(h, SL_BACKEND_ENTRY);
  const sl_backend_ops *o = entry ? entry() : NULL;
  if (!backend_table_ok(o)) {
    dlclose(h);
    return sl__fail(ctx, SL_ERR_ABI,
                    "libshardload-%s.so does not export a usable %s table of ABI version %u; rebuild the "
                    "module with this shardload",
                    name, SL_BACKEND_ENTRY, SL_BACKEND_ABI_VERSION);
  }
  *ops = o;
  *dl = h;
  return SL_OK;
}

sl_status sl__backend_select(sl_context *ctx, const char *spec, const sl_backend_ops **ops, void **dl,
                             char *variant, size_t variant_len) {
  *ops = NULL;
  *dl = NULL;
  variant[0] = 0;
  if (!spec || !*spec || strcmp(spec, "auto") == 0) {
    /* best score wins; GPU modules are probed first so a tie keeps the accelerator */
    int best = 0;
    for (size_t i = 0; i < COUNT(loadable_backends); i++) {
      const sl_backend_ops *o;
      void *h;
      char saved[SL__ERRMSG_LEN];
      memcpy(saved, ctx->errmsg, sizeof saved);
      if (load_backend(ctx, loadable_backends[i], &o, &h) != SL_OK) {
        memcpy(ctx->errmsg, saved, sizeof saved); /* absent modules are not errors for auto */
        continue;
      }
      int sc = o->score();
      if (sc > best) {
        if (*dl) dlclose(*dl);
        best = sc;
        *ops = o;
        *dl = h;
      } else {
        dlclose(h);
      }
    }
    for (size_t i = 0; i < COUNT(builtin_backends); i++) {
      const sl_backend_ops *o = builtin_backends[i].get();
      int sc = o->score();
      if (sc > best) {
        if (*dl) dlclose(*dl);
        *dl = NULL;
        best = sc;
        *ops = o;
      }
    }
    return *ops ? SL_OK : sl__fail(ctx, SL_ERR_NO_DEVICE, "no usable backend on this machine");
  }
  char name[64];
  const char *colon = strchr(spec, ':');
  size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);
  if (nlen >= sizeof name) nlen = sizeof name - 1;
  memcpy(name, spec, nlen);
  name[nlen] = 0;
  if (colon) snprintf(variant, variant_len, "%s", colon + 1);
  for (size_t i = 0; i < COUNT(builtin_backends); i++) {
    if (strcmp(name, builtin_backends[i].name) == 0) {
      *ops = builtin_backends[i].get();
      return SL_OK;
    }
  }
  for (size_t i = 0; i < COUNT(loadable_backends); i++) {
    if (strcmp(name, loadable_backends[i]) == 0) {
      sl_status st = load_backend(ctx, name, ops, dl);
      if (st != SL_OK) return st;
      if ((*ops)->score() <= 0) {
        dlclose(*dl);
        *dl = NULL;
        *ops = NULL;
        return sl__fail(ctx, SL_ERR_NO_DEVICE,
                        "backend '%s' found no usable device on this machine (driver or device missing); "
                        "use --backend cpu", name);
      }
      return SL_OK;
    }
  }
  const char *all[] = {"auto", "cpu", "sim", "sim:strict", "cuda", "hip", "level_zero"};
  const char *near = nearest(spec, all, COUNT(all));
  return sl__fail(ctx, SL_ERR_INVALID, "unknown backend '%s'%s%s%s; choose one of auto, cpu, sim, sim:strict, cuda, hip, level_zero",
                  spec, near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
}

sl_status sl__collective_select(sl_context *ctx, const char *spec, const sl_collective_ops **ops, void **dl) {
  *ops = NULL;
  *dl = NULL;
  for (size_t i = 0; i < COUNT(builtin_collectives); i++) {
    if (strcmp(spec, builtin_collectives[i].name) == 0) {
      *ops = builtin_collectives[i].get();
      return SL_OK;
    }
  }
  for (size_t i = 0; i < COUNT(loadable_collectives); i++) {
    if (strcmp(spec, loadable_collectives[i]) == 0) {
      char why[512] = "";
      void *h = open_module(spec, why, sizeof why);
      if (!h) return sl__fail(ctx, SL_ERR_NO_DEVICE, "collective '%s' is not available here (%s)", spec, why);
      sl_collective_entry_fn entry = (sl_collective_entry_fn)dlsym(h, SL_COLLECTIVE_ENTRY);
      const sl_collective_ops *o = entry ? entry() : NULL;
      if (!collective_table_ok(o)) {
        dlclose(h);
        return sl__fail(ctx, SL_ERR_ABI, "libshardload-%s.so does not export a usable %s table of ABI version %u",
                        spec, SL_COLLECTIVE_ENTRY, SL_COLLECTIVE_ABI_VERSION);
      }
      *ops = o;
      *dl = h;
      return SL_OK;
    }
  }
  const char *all[] = {"local", "gloo", "nccl", "rccl"};
  const char *near = nearest(spec, all, COUNT(all));
#ifdef SHARDLOAD_HAVE_GLOO
  const char *gloo_note = "";
#else
  const char *gloo_note = " (this build has no Gloo: -DSHARDLOAD_WITH_GLOO=ON)";
#endif
  return sl__fail(ctx, SL_ERR_INVALID, "unknown or unavailable collective '%s'%s%s%s; choose local, gloo, nccl or rccl%s",
                  spec, near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "", gloo_note);
}
