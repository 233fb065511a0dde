/* Module registry (docs/DESIGN.md#modules): built-in modules are listed here; other modules are
 * shared objects (libshardload-<name>.so) found in $SHARDLOAD_MODULE_PATH, next to
 * libshardload, or on the loader's path, and opened only when asked for (or probed for "auto").
 * A machine without a vendor runtime thus reports that module unavailable instead of failing
 * to start.
 *
 * Entry symbols are versioned: the newest the core knows first (sl_backend_module_v2), then
 * the older one (sl_backend_module), whose table registry_v1.c adapts, so every caller sees a
 * v2 table. A table is checked before use (its members, and that it carries the name it was
 * asked for), and a module that fails the check is named by its file. What a module writes is
 * escaped where the core takes it in (sl__module_text). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "module_scan.h"
#include "registry_v1.h"

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
/* Probed by "auto" first, in this order (an accelerator wins a tie with a built-in); then every
 * other backend module installed where names are looked for (select_auto, module_scan.c). */
static const char *const loadable_backends[] = {"cuda", "hip", "level_zero"};

static const builtin_collective builtin_collectives[] = {
    {"local", sl__collective_local},
#ifdef SHARDLOAD_HAVE_GLOO
    {"gloo", sl__collective_gloo},
#endif
    {"simccl", sl__collective_simccl}, {"shm", sl__collective_shm},
#ifdef SHARDLOAD_HAVE_GLOO
    {"hier", sl__collective_hier},
#endif
};
static const char *const loadable_collectives[] = {"nccl", "rccl"};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define NAME_MAX_LEN 32
#define REASON_LEN 512

/* A module name is [a-z0-9_]{1,32}: it becomes part of a file name. */
static bool valid_name(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n > NAME_MAX_LEN) return false;
  for (size_t i = 0; i < n; i++)
    if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') || name[i] == '_')) return false;
  return true;
}

static bool in_list(const char *name, const char *const *names, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(name, names[i]) == 0) return true;
  return false;
}

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

/* ---- module-provided text ---------------------------------------------------------------- */

void sl__module_text(char *s, size_t cap) {
  if (!cap) return;
  char raw[SL__ERRMSG_LEN];
  size_t n = 0;
  for (; n + 1 < sizeof raw && n + 1 < cap && s[n]; n++) raw[n] = s[n];
  raw[n] = 0;
  size_t used = 0;
  for (const unsigned char *c = (const unsigned char *)raw; *c; c++) {
    char esc[8];
    if (*c >= 0x20 && *c < 0x7f) esc[0] = (char)*c, esc[1] = 0;
    else if (*c == '\n' || *c == '\r' || *c == '\t')
      esc[0] = '\\', esc[1] = *c == '\n' ? 'n' : *c == '\r' ? 'r' : 't', esc[2] = 0;
    else snprintf(esc, sizeof esc, "\\x%02x", *c);
    size_t k = strlen(esc);
    if (used + k + 1 > cap) break; /* cut before an escape, never inside one */
    memcpy(s + used, esc, k);
    used += k;
  }
  s[used] = 0;
}

/* ---- finding and opening module files ---------------------------------------------------- */

/* The directory of this library (of the executable, when the core is linked in statically), as
 * an absolute real path, or "" when it cannot be made one: then it is not searched. Resolved
 * once, while the library is being loaded: the name the loader keeps (dladdr's dli_fname) is as
 * relative as the path the library was opened by ("./libshardload.so", a relative
 * SHARDLOAD_LIBRARY), and resolved at each lookup it would name whatever directory the process
 * has changed to since, so that a module planted there would run. */
static char library_dir[PATH_MAX];

__attribute__((constructor)) static void resolve_library_dir(void) {
  Dl_info info;
  if (!dladdr((void *)resolve_library_dir, &info) || !info.dli_fname) return;
  const char *slash = strrchr(info.dli_fname, '/');
  if (!slash) return; /* no directory of its own: the loader's path found it */
  char dir[PATH_MAX];
  if (slash == info.dli_fname) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - info.dli_fname), info.dli_fname);
  char *real = realpath(dir, NULL);
  if (real && real[0] == '/' && strlen(real) < sizeof library_dir) memcpy(library_dir, real, strlen(real) + 1);
  free(real);
}

/* dlopen DIR/FILE when it exists: false when there is no such file. A file that exists but
 * fails to load sets WHY and leaves *H NULL. */
static bool try_dir(const char *dir, const char *file, void **h, char *why, size_t whylen) {
  char cand[PATH_MAX];
  if (snprintf(cand, sizeof cand, "%s/%s", dir, file) >= (int)sizeof cand || access(cand, F_OK) != 0) return false;
  *h = dlopen(cand, RTLD_NOW | RTLD_LOCAL);
  if (!*h) {
    const char *e = dlerror();
    snprintf(why, whylen, "%s", e ? e : "dlopen failed");
  }
  return true;
}

/* dlopen libshardload-NAME.so: $SHARDLOAD_MODULE_PATH's entries in order (empty ones skipped),
 * then the directory of this library, then the dynamic loader's own search. PATH receives the
 * file that opened. A file that exists but fails to load stops the search (*FOUND = true): its
 * error is the useful one (a missing vendor runtime), not "not found" from the places after it. */
static void *open_module(const char *name, char *path, size_t pathlen, bool *found, char *why, size_t whylen) {
  char file[64];
  snprintf(file, sizeof file, "libshardload-%s.so", name);
  *found = false;
  void *h = NULL;
  const char *env = getenv("SHARDLOAD_MODULE_PATH");
  char *dirs = sl__strdup(env ? env : "");
  if (!dirs) {
    snprintf(why, whylen, "out of memory");
    return NULL;
  }
  char *save = NULL;
  for (char *dir = strtok_r(dirs, ":", &save); dir && !*found; dir = strtok_r(NULL, ":", &save))
    *found = try_dir(dir, file, &h, why, whylen);
  free(dirs);
  if (!*found && library_dir[0]) *found = try_dir(library_dir, file, &h, why, whylen);
  if (!*found) {
    h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char *e = dlerror();
      snprintf(why, whylen, "%s", e ? e : "not found");
      *found = e && !strstr(e, "No such file"); /* on the loader's path, but broken */
    }
  }
  if (h) {
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name)
      snprintf(path, pathlen, "%s", lm->l_name);
    else
      snprintf(path, pathlen, "%s", file);
  }
  return h;
}

/* What is wrong with a v2 table, or NULL. Built-in tables pass the same check. */
static bool backend_table_ok(const sl_backend_ops *o, char *problem, size_t len) {
  const char *missing = NULL;
  if (!o) missing = "the table (the entry returned NULL)";
  else if (o->abi_version != SL_BACKEND_ABI_VERSION) {
    snprintf(problem, len, "its table says ABI version %u under %s (this shardload loads 1 and %u)", o->abi_version,
             SL_BACKEND_ENTRY, SL_BACKEND_ABI_VERSION);
    return false;
  } else if (o->size < offsetof(sl_backend_ops, copy_async) + sizeof o->copy_async) {
    snprintf(problem, len, "its table is %u bytes, too short to hold the required members", o->size);
    return false;
  }
#define REQUIRE(m) else if (!o->m) missing = #m;
  REQUIRE(name) REQUIRE(probe) REQUIRE(init) REQUIRE(fini) REQUIRE(alloc_device) REQUIRE(free_device)
  REQUIRE(stream_create) REQUIRE(stream_destroy) REQUIRE(event_create) REQUIRE(event_destroy) REQUIRE(event_record)
  REQUIRE(stream_wait_event) REQUIRE(event_query) REQUIRE(event_sync) REQUIRE(stream_sync) REQUIRE(synchronize)
  REQUIRE(copy_async)
#undef REQUIRE
  if (missing) {
    snprintf(problem, len, "its table lacks %s", missing);
    return false;
  }
  /* DLPack's device types reach consumers as they are (sl_tensor.device_type): DLDeviceType's */
  const char *bad = SL_HAS_OP(o, dlpack_device_type) && (o->dlpack_device_type < 0 || o->dlpack_device_type > 255)
                        ? "dlpack_device_type"
                    : SL_HAS_OP(o, dlpack_pinned_type) && (o->dlpack_pinned_type < 0 || o->dlpack_pinned_type > 255)
                        ? "dlpack_pinned_type"
                        : NULL;
  if (bad) {
    snprintf(problem, len, "its table's %s %d is not a DLPack device type (DLDeviceType: 1 to 255, or 0 for none)",
             bad, strcmp(bad, "dlpack_device_type") == 0 ? o->dlpack_device_type : o->dlpack_pinned_type);
    return false;
  }
  return true;
}

static bool collective_table_ok(const sl_collective_ops *o, char *problem, size_t len) {
  const char *missing = NULL;
  if (!o) missing = "the table (the entry returned NULL)";
  else if (o->abi_version != SL_COLLECTIVE_ABI_VERSION) {
    snprintf(problem, len, "its table says ABI version %u under %s (this shardload loads 1 and %u)", o->abi_version,
             SL_COLLECTIVE_ENTRY, SL_COLLECTIVE_ABI_VERSION);
    return false;
  } else if (o->size < offsetof(sl_collective_ops, barrier) + sizeof o->barrier) {
    snprintf(problem, len, "its table is %u bytes, too short to hold the required members", o->size);
    return false;
  }
#define REQUIRE(m) else if (!o->m) missing = #m;
  REQUIRE(name) REQUIRE(probe) REQUIRE(init) REQUIRE(fini) REQUIRE(broadcast) REQUIRE(scatterv) REQUIRE(allgather)
  REQUIRE(barrier)
#undef REQUIRE
  if (missing) {
    snprintf(problem, len, "its table lacks %s", missing);
    return false;
  }
  /* the loader routes by these (sl__data_route): device memory is some backend's */
  if (!(o->domains & (SL_MEM_HOST | SL_MEM_PINNED | SL_MEM_DEVICE))) {
    snprintf(problem, len, "its table declares no memory domain it moves (domains %#x)", o->domains);
    return false;
  }
  if ((o->domains & SL_MEM_DEVICE) && !o->device_backend) {
    snprintf(problem, len, "its table moves device memory (SL_MEM_DEVICE) but names no device_backend");
    return false;
  }
  return true;
}

/* The names a checked table gives: its own must be the one it was asked for (a backend that
 * called itself "sim" would pass for the built-in one in every message, report and agreement),
 * and the names it gives of others must be of the module-name form. Built-in and adapted v1
 * tables pass the same check. */
static bool table_names_ok(const char *asked, const char *name, const char *other, const char *other_what,
                           char *problem, size_t len) {
  if (!valid_name(name) || strcmp(name, asked) != 0) {
    snprintf(problem, len, "its table calls itself '%.64s', not '%s' (a module's table carries the NAME of its file "
             "libshardload-NAME.so)", name, asked);
    return false;
  }
  if (other && !valid_name(other)) {
    snprintf(problem, len, "its table's %s '%.64s' is not a module name (a-z, 0-9, _; at most 32)", other_what, other);
    return false;
  }
  return true;
}

/* A backend's native API is a name as well: collectives are paired by it (sl__data_route), and
 * it reaches messages. */
static bool backend_names_ok(const char *asked, const sl_backend_ops *o, char *problem, size_t len) {
  if (!table_names_ok(asked, o->name, o->preferred_collective, "preferred_collective", problem, len)) return false;
  return table_names_ok(asked, o->name, SL_HAS_OP(o, native_api) ? o->native_api : NULL, "native_api", problem, len);
}

static bool collective_names_ok(const char *asked, const sl_collective_ops *o, char *problem, size_t len) {
  return table_names_ok(asked, o->name, o->device_backend, "device_backend", problem, len);
}

/* A module opened and its table checked (and adapted when it is v1). */
typedef struct loaded {
  void *dl;
  void *shim; /* the v1 adapter's allocation, or NULL */
  const void *ops;
  char path[PATH_MAX];
} loaded;

static void loaded_close(loaded *m) {
  free(m->shim);
  if (m->dl) dlclose(m->dl);
  *m = (loaded){0};
}

/* Why a module could not be taken: no such file anywhere (WHY is the loader's message); a file
 * that does not load (a missing vendor runtime: WHY is the loader's message); a table that is
 * unusable (WHY names the file and says what is wrong). */
typedef enum { MODULE_ABSENT = 1, MODULE_UNLOADABLE = 2, MODULE_BAD_ABI = 3 } module_error;

/* Opens libshardload-NAME.so and takes its table; on failure returns a module_error and leaves
 * nothing open. */
static int load_module(const char *name, bool collective, loaded *m, char *why, size_t whylen) {
  *m = (loaded){0};
  bool found;
  m->dl = open_module(name, m->path, sizeof m->path, &found, why, whylen);
  if (!m->dl) {
    sl__module_text(why, whylen); /* the loader's message names a path, which may hold anything */
    return found ? MODULE_UNLOADABLE : MODULE_ABSENT;
  }
  char problem[256];
  const char *entry = collective ? SL_COLLECTIVE_ENTRY : SL_BACKEND_ENTRY;
  const char *entry1 = collective ? SL_COLLECTIVE_ENTRY_V1 : SL_BACKEND_ENTRY_V1;
  void *e2 = dlsym(m->dl, entry), *e1 = e2 ? NULL : dlsym(m->dl, entry1);
  bool ok;
  if (e2) {
    m->ops = collective ? (const void *)((sl_collective_entry_fn)e2)() : (const void *)((sl_backend_entry_fn)e2)();
    ok = collective ? collective_table_ok(m->ops, problem, sizeof problem)
                    : backend_table_ok(m->ops, problem, sizeof problem);
  } else if (e1) {
    /* ABI v1: the entry returns the frozen v1 table (shardload/module_v1.h) */
    typedef const sl_backend_ops_v1 *(*entry_v1_b)(void);
    typedef const sl_collective_ops_v1 *(*entry_v1_c)(void);
    if (collective) {
      const sl_collective_ops_v1 *o1 = ((entry_v1_c)e1)();
      ok = sl__v1_collective_ok(o1, problem, sizeof problem);
      if (ok && !(m->ops = m->shim = sl__v1_collective_adapt(o1))) snprintf(problem, sizeof problem, "out of memory");
    } else {
      const sl_backend_ops_v1 *o1 = ((entry_v1_b)e1)();
      ok = sl__v1_backend_ok(o1, problem, sizeof problem);
      if (ok && !(m->ops = m->shim = sl__v1_backend_adapt(o1))) snprintf(problem, sizeof problem, "out of memory");
    }
    ok = ok && m->shim;
  } else {
    snprintf(problem, sizeof problem, "it exports neither %s nor %s: not a shardload %s module", entry, entry1,
             collective ? "collective" : "backend");
    ok = false;
  }
  if (ok)
    ok = collective ? collective_names_ok(name, m->ops, problem, sizeof problem)
                    : backend_names_ok(name, m->ops, problem, sizeof problem);
  if (!ok) {
    snprintf(why, whylen, "%.200s: %.200s; rebuild it against this shardload's shardload/module.h", m->path, problem);
    loaded_close(m);
    sl__module_text(why, whylen); /* the table's text, and a path that may hold anything */
    return MODULE_BAD_ABI;
  }
  return 0;
}

/* ---- probing ----------------------------------------------------------------------------- */

/* The module's probe, with a reason whatever it wrote (NUL-terminated, naming the module). */
static int probe_backend(const sl_backend_ops *o, const void *shim, char *reason, size_t len) {
  reason[0] = 0;
  int score = shim ? sl__v1_backend_probe(o, reason, len) : o->probe(reason, len);
  reason[len - 1] = 0;
  sl__module_text(reason, len);
  if (score <= 0 && !reason[0]) snprintf(reason, len, "%s: probe said no and gave no reason", o->name);
  return score > 0 ? score : 0;
}

/* The module's probe, told what BE pairs by (module.h: its native API), then whether the loader
 * has a route for the pair: a probe that says yes to a backend whose memory the collective does
 * not move is not the last word. */
static int probe_collective(const sl_collective_ops *o, const void *shim, const sl_backend_ops *be, char *reason,
                            size_t len) {
  reason[0] = 0;
  const char *api = be ? sl_backend_native_api(be) : NULL;
  int score = shim ? sl__v1_collective_probe(o, api, reason, len) : o->probe(api, reason, len);
  reason[len - 1] = 0;
  sl__module_text(reason, len);
  if (score <= 0 && !reason[0]) snprintf(reason, len, "%s: probe said no and gave no reason", o->name);
  if (score > 0 && sl__data_route(o, be, reason, len) == SL__ROUTE_NONE) return 0;
  return score > 0 ? score : 0;
}

/* ---- backends ---------------------------------------------------------------------------- */

static const char *vendor_option(const char *name) {
  return strcmp(name, "level_zero") == 0 ? "LEVEL_ZERO" : strcmp(name, "hip") == 0 ? "HIP" : "CUDA";
}

/* ---- backend "auto" ----------------------------------------------------------------------- */

/* Installed modules that "auto" looks at beyond the fixed list, in name order: a directory of
 * ten thousand module files costs one listing and this many reads, never ten thousand loads. */
#define AUTO_MAX_INSTALLED 32

typedef struct auto_cand {
  const char *name;
  char *path;   /* the file the search found (malloc'd), or NULL: built in, or for the loader's search */
  bool builtin; /* cpu, sim */
  bool fixed;   /* cuda, hip, level_zero: a file of that name that is no backend is worth a warning */
  bool not_backend; /* its file is no backend (a collective module, a FIFO): not a candidate beaten */
  sl_log_level level; /* of its verdict, when it is not chosen */
  loaded m;
  int score;
  char reason[REASON_LEN];
} auto_cand;

/* What a loadable candidate's file is, from the entry symbols it defines, before anything opens
 * it: a collective module, a file that exports no backend entry, or a FIFO is never opened as a
 * backend. True when the file may be a backend (or only loading it can tell). */
static bool auto_file_is_backend(auto_cand *c) {
  char why[256];
  unsigned bits = sl__module_entries(c->path, why, sizeof why);
  const char *what = NULL;
  if (bits & SL__ENTRY_NOT_A_FILE) what = why;
  else if (bits & (SL__ENTRY_BACKEND | SL__ENTRY_UNKNOWN)) return true;
  else if (bits & SL__ENTRY_COLLECTIVE)
    what = "is a collective module (it exports a collective entry and no backend one)";
  else what = "exports neither " SL_BACKEND_ENTRY " nor " SL_BACKEND_ENTRY_V1;
  snprintf(c->reason, REASON_LEN, "%s: %.200s %.200s: not a backend, not opened", c->name, c->path, what);
  sl__module_text(c->reason, REASON_LEN); /* the path may hold anything */
  c->level = c->fixed ? SL_LOG_WARN : SL_LOG_INFO;
  c->not_backend = true;
  return false;
}

static void auto_probe(auto_cand *c) {
  c->level = SL_LOG_INFO;
  if (c->builtin) {
    char problem[256];
    if (!backend_table_ok(c->m.ops, problem, sizeof problem) ||
        !backend_names_ok(c->name, c->m.ops, problem, sizeof problem)) {
      snprintf(c->reason, REASON_LEN, "%s: built-in table is broken: %s", c->name, problem);
      return;
    }
  } else {
    if (c->path && !auto_file_is_backend(c)) return;
    char why[REASON_LEN];
    int e = load_module(c->name, false, &c->m, why, sizeof why);
    if (e) {
      snprintf(c->reason, REASON_LEN, "%s: %s (%.440s)", c->name, e == MODULE_ABSENT ? "not available" : "unusable",
               why);
      if (e == MODULE_BAD_ABI) c->level = SL_LOG_WARN; /* an installed module is broken: worth more than INFO */
      return;
    }
  }
  c->score = probe_backend(c->m.ops, c->m.shim, c->reason, REASON_LEN);
}

/* The candidates in probe order: the fixed list (accelerators the core knows), then every other
 * installed module file in the search directories, in name order, up to AUTO_MAX_INSTALLED,
 * then the built-ins. NULL when out of memory. */
static auto_cand *auto_candidates(const sl__module_files *scan, size_t *n) {
  size_t nfixed = COUNT(loadable_backends);
  *n = nfixed + scan->count + COUNT(builtin_backends);
  auto_cand *cand = calloc(*n, sizeof *cand);
  if (!cand) return NULL;
  for (size_t i = 0; i < nfixed; i++) {
    cand[i].name = loadable_backends[i];
    cand[i].fixed = true;
    cand[i].path = sl__module_locate(cand[i].name); /* NULL: the loader's search may find it */
  }
  for (size_t i = 0; i < scan->count; i++) {
    cand[nfixed + i].name = scan->files[i].name;
    if (!(cand[nfixed + i].path = sl__strdup(scan->files[i].path))) goto out_free;
  }
  for (size_t i = 0; i < COUNT(builtin_backends); i++) {
    auto_cand *c = &cand[nfixed + scan->count + i];
    c->name = builtin_backends[i].name;
    c->builtin = true;
    c->m.ops = builtin_backends[i].get();
  }
  return cand;
out_free:
  for (size_t i = 0; i < *n; i++) free(cand[i].path);
  free(cand);
  return NULL;
}

/* What "auto" left unseen, said: the installed files past its bound, and directories whose
 * listing was cut. */
static void auto_log_bounds(sl_context *ctx, const sl__module_files *scan) {
  if (scan->more)
    sl__log(ctx, SL_LOG_WARN,
            "backend auto: %zu more installed module file%s not looked at: auto looks at %d besides %s, %s and %s, in "
            "name order (the last: %s); ask for another by name (--backend NAME)",
            scan->more, scan->more == 1 ? "" : "s", AUTO_MAX_INSTALLED, loadable_backends[0], loadable_backends[1],
            loadable_backends[2], scan->count ? scan->files[scan->count - 1].name : "none");
  if (scan->cut_dirs)
    sl__log(ctx, SL_LOG_WARN,
            "backend auto: %s%s: only the first %u entries of %s directory were listed; a module past them is "
            "not considered (ask for it by name: --backend NAME)",
            scan->first_cut ? scan->first_cut : "a module directory", scan->cut_dirs > 1 ? " and others" : "",
            SL__SCAN_MAX_ENTRIES, scan->cut_dirs > 1 ? "each" : "that");
}

/* "auto": the best probe among every candidate (auto_candidates) wins; a tie keeps the earlier,
 * so an accelerator beats cpu. Every other candidate's verdict is logged (INFO; WARN for a
 * broken module), and what the choice beat goes into the context's backend reason. */
static sl_status select_auto(sl_context *ctx, const sl_backend_ops **ops, void **dl, void **shim) {
  const char *skip[COUNT(loadable_backends) + COUNT(builtin_backends)];
  for (size_t i = 0; i < COUNT(loadable_backends); i++) skip[i] = loadable_backends[i];
  for (size_t i = 0; i < COUNT(builtin_backends); i++) skip[COUNT(loadable_backends) + i] = builtin_backends[i].name;
  sl__module_files scan;
  size_t n = 0;
  auto_cand *cand = NULL;
  if (sl__module_scan(skip, COUNT(skip), AUTO_MAX_INSTALLED, &scan) != SL_OK)
    return sl__fail(ctx, SL_ERR_NOMEM, "backend auto: out of memory listing the installed modules");
  if (!(cand = auto_candidates(&scan, &n))) {
    sl__module_scan_free(&scan);
    return sl__fail(ctx, SL_ERR_NOMEM, "backend auto: out of memory listing the installed modules");
  }
  int best = -1;
  for (size_t i = 0; i < n; i++) {
    auto_probe(&cand[i]);
    if (cand[i].score > 0 && (best < 0 || cand[i].score > cand[best].score)) best = (int)i;
  }
  for (size_t i = 0; i < n; i++) {
    if ((int)i == best) continue;
    if (cand[i].score > 0)
      sl__log(ctx, SL_LOG_INFO, "backend auto: %s: usable (probe %d), %s probes %d", cand[i].name, cand[i].score,
              cand[best].name, cand[best].score);
    else
      sl__log(ctx, cand[i].level, "backend auto: %s", cand[i].reason);
    loaded_close(&cand[i].m);
  }
  auto_log_bounds(ctx, &scan);
  sl_status st = SL_OK;
  if (best < 0) {
    char all[SL__ERRMSG_LEN - 64] = ""; /* the message buffer's size bounds it anyway */
    for (size_t i = 0; i < n; i++) {
      size_t used = strlen(all);
      snprintf(all + used, sizeof all - used, "%s%.*s", i ? "; " : "", (int)(sizeof all - used), cand[i].reason);
    }
    st = sl__fail(ctx, SL_ERR_NO_DEVICE, "no usable backend on this machine (%s)", all);
    goto out_free;
  }
  auto_cand *b = &cand[best];
  sl__log(ctx, SL_LOG_INFO, "backend auto: chose %s (probe %d)", b->name, b->score);
  /* why, for the report: the loadable candidates the choice beat, in probe order */
  size_t used = (size_t)snprintf(ctx->backend_reason, sizeof ctx->backend_reason, "%s: auto", b->name);
  for (size_t i = 0, first = 1; i < n && used < sizeof ctx->backend_reason; i++) {
    if ((int)i == best || cand[i].builtin || cand[i].not_backend) continue; /* the built-ins always load */
    used += (size_t)snprintf(ctx->backend_reason + used, sizeof ctx->backend_reason - used, "%s %s",
                             first ? "," : ";", cand[i].score > 0 ? cand[i].name : cand[i].reason);
    first = 0;
  }
  *ops = b->m.ops;
  *dl = b->m.dl;
  *shim = b->m.shim;
out_free:
  for (size_t i = 0; i < n; i++) free(cand[i].path);
  free(cand);
  sl__module_scan_free(&scan);
  return st;
}

/* An unknown backend: the nearest known name, and the module file only when SPEC could name one
 * (a module name, then an optional :VARIANT). */
static sl_status unknown_backend(sl_context *ctx, const char *spec, bool is_name, const char *why) {
  const char *all[] = {"auto", "cpu", "sim", "sim:strict", "cuda", "hip", "level_zero"};
  const char *near = nearest(spec, all, COUNT(all));
  const char *choices = "choose one of auto, cpu, sim, sim:strict, cuda, hip, level_zero";
  if (!is_name)
    return sl__fail(ctx, SL_ERR_INVALID,
                    "unknown backend '%s'%s%s%s: not a module name (a-z, 0-9, _; at most 32 characters, then an "
                    "optional :VARIANT); %s",
                    spec, near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "", choices);
  return sl__fail(ctx, SL_ERR_INVALID,
                  "unknown backend '%s'%s%s%s%s%s%s; %s, or NAME for a module libshardload-NAME.so (NAME: a-z, 0-9, "
                  "_) on SHARDLOAD_MODULE_PATH",
                  spec, why ? " (" : "", why ? why : "", why ? ")" : "", near ? " (did you mean '" : "",
                  near ? near : "", near ? "'?)" : "", choices);
}

sl_status sl__backend_select(sl_context *ctx, const char *spec, const sl_backend_ops **ops, void **dl, void **shim,
                             char *variant, size_t variant_len) {
  *ops = NULL;
  *dl = NULL;
  *shim = NULL;
  variant[0] = 0;
  if (!spec || !*spec || strcmp(spec, "auto") == 0) return select_auto(ctx, ops, dl, shim);
  char name[NAME_MAX_LEN + 1];
  const char *colon = strchr(spec, ':');
  size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);
  if (nlen > NAME_MAX_LEN) return unknown_backend(ctx, spec, false, NULL);
  memcpy(name, spec, nlen);
  name[nlen] = 0;
  if (!valid_name(name)) return unknown_backend(ctx, spec, false, NULL);
  if (colon) snprintf(variant, variant_len, "%s", colon + 1);
  for (size_t i = 0; i < COUNT(builtin_backends); i++) {
    if (strcmp(name, builtin_backends[i].name) != 0) continue;
    const sl_backend_ops *o = builtin_backends[i].get();
    char problem[256];
    if (!backend_table_ok(o, problem, sizeof problem) || !backend_names_ok(name, o, problem, sizeof problem))
      /* a core bug, said plainly */
      return sl__fail(ctx, SL_ERR_ABI, "built-in backend '%s': %s", name, problem);
    /* not probed: built-ins run anywhere, and a probe of 0 only keeps one out of "auto" (sim) */
    *ops = o;
    return SL_OK;
  }
  loaded m;
  char why[REASON_LEN], reason[REASON_LEN];
  int e = load_module(name, false, &m, why, sizeof why);
  if (e == MODULE_ABSENT && !in_list(name, loadable_backends, COUNT(loadable_backends)))
    return unknown_backend(ctx, spec, true, why);
  if (e == MODULE_ABSENT)
    return sl__fail(ctx, SL_ERR_NO_DEVICE,
                    "backend '%s' is not available here (%s); build it with -DSHARDLOAD_WITH_%s=ON on a machine with "
                    "its runtime and put it on SHARDLOAD_MODULE_PATH, or use --backend cpu",
                    name, why, vendor_option(name));
  if (e == MODULE_UNLOADABLE)
    return sl__fail(ctx, SL_ERR_NO_DEVICE, "backend '%s' cannot be loaded (%s); install its runtime or use --backend cpu",
                    name, why);
  if (e == MODULE_BAD_ABI) return sl__fail(ctx, SL_ERR_ABI, "backend '%s': %s", name, why);
  if (probe_backend(m.ops, m.shim, reason, sizeof reason) == 0) {
    loaded_close(&m);
    return sl__fail(ctx, SL_ERR_NO_DEVICE, "backend '%s' cannot run on this machine: %s; use --backend cpu", name,
                    reason);
  }
  *ops = m.ops;
  *dl = m.dl;
  *shim = m.shim;
  return SL_OK;
}

/* ---- collectives ------------------------------------------------------------------------- */

size_t sl__collective_names(const char **names, size_t max) {
  size_t n = 0;
  for (size_t i = 0; i < COUNT(builtin_collectives) && n < max; i++) names[n++] = builtin_collectives[i].name;
  for (size_t i = 0; i < COUNT(loadable_collectives) && n < max; i++) names[n++] = loadable_collectives[i];
  return n;
}

static const sl_collective_ops *builtin_collective_ops(const char *name) {
  for (size_t i = 0; i < COUNT(builtin_collectives); i++)
    if (strcmp(name, builtin_collectives[i].name) == 0) return builtin_collectives[i].get();
  return NULL;
}

static sl_status unknown_collective(sl_context *ctx, const char *spec, bool is_name, const char *why) {
  const char *all[] = {"local", "gloo", "shm", "hier", "simccl", "nccl", "rccl"};
  const char *near = nearest(spec, all, COUNT(all));
#ifdef SHARDLOAD_HAVE_GLOO
  const char *gloo_note = "";
#else
  const char *gloo_note = " (this build has no Gloo: -DSHARDLOAD_WITH_GLOO=ON)";
#endif
  if (!is_name)
    return sl__fail(ctx, SL_ERR_INVALID,
                    "unknown collective '%s'%s%s%s: not a module name (a-z, 0-9, _; at most 32 characters); choose "
                    "local, gloo, shm, hier, simccl, nccl or rccl%s",
                    spec, near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "", gloo_note);
  return sl__fail(ctx, SL_ERR_INVALID,
                  "unknown collective '%s'%s%s%s%s%s%s; choose local, gloo, shm, hier, simccl, nccl or rccl, or NAME "
                  "for a module "
                  "libshardload-NAME.so on SHARDLOAD_MODULE_PATH%s",
                  spec, why ? " (" : "", why ? why : "", why ? ")" : "", near ? " (did you mean '" : "",
                  near ? near : "", near ? "'?)" : "", gloo_note);
}

sl_status sl__collective_select(sl_context *ctx, const char *spec, const sl_collective_ops **ops, void **dl,
                                void **shim) {
  *ops = NULL;
  *dl = NULL;
  *shim = NULL;
  if (!spec || !valid_name(spec)) return unknown_collective(ctx, spec ? spec : "(null)", false, NULL);
  char problem[256];
  const sl_collective_ops *b = builtin_collective_ops(spec);
  if (b) {
    if (!collective_table_ok(b, problem, sizeof problem) || !collective_names_ok(spec, b, problem, sizeof problem))
      return sl__fail(ctx, SL_ERR_ABI, "built-in collective '%s': %s", spec, problem);
    *ops = b;
    return SL_OK;
  }
  loaded m;
  char why[REASON_LEN];
  int e = load_module(spec, true, &m, why, sizeof why);
  if (e == MODULE_ABSENT && !in_list(spec, loadable_collectives, COUNT(loadable_collectives)))
    return unknown_collective(ctx, spec, true, why);
  if (e == MODULE_ABSENT)
    return sl__fail(ctx, SL_ERR_NO_DEVICE, "collective '%s' is not available here (%s)", spec, why);
  if (e == MODULE_UNLOADABLE)
    return sl__fail(ctx, SL_ERR_NO_DEVICE, "collective '%s' cannot be loaded (%s); install its runtime", spec, why);
  if (e == MODULE_BAD_ABI) return sl__fail(ctx, SL_ERR_ABI, "collective '%s': %s", spec, why);
  *ops = m.ops;
  *dl = m.dl;
  *shim = m.shim;
  return SL_OK;
}

int sl__collective_probe_domains(const char *name, const sl_backend_ops *backend, char *reason, size_t len,
                                 uint32_t *domains) {
  *domains = 0;
  if (!len) return 0;
  reason[0] = 0;
  if (!name || !valid_name(name)) {
    snprintf(reason, len, "%s: not a collective name", name ? name : "(null)");
    return -1;
  }
  const sl_collective_ops *b = builtin_collective_ops(name);
  char problem[256];
  if (b) {
    if (!collective_table_ok(b, problem, sizeof problem) || !collective_names_ok(name, b, problem, sizeof problem)) {
      snprintf(reason, len, "%s: built-in table is broken: %s", name, problem);
      return 0;
    }
    *domains = b->domains;
    return probe_collective(b, NULL, backend, reason, len);
  }
  loaded m;
  char why[REASON_LEN];
  int e = load_module(name, true, &m, why, sizeof why);
  if (e) {
    snprintf(reason, len, "%s: %s (%s)", name, e == MODULE_ABSENT ? "not available here" : "unusable", why);
    return e == MODULE_ABSENT ? -1 : 0;
  }
  *domains = ((const sl_collective_ops *)m.ops)->domains;
  int score = probe_collective(m.ops, m.shim, backend, reason, len);
  loaded_close(&m);
  return score;
}

int sl__collective_probe(const char *name, const sl_backend_ops *backend, char *reason, size_t len) {
  uint32_t domains;
  return sl__collective_probe_domains(name, backend, reason, len, &domains);
}

sl__route sl__data_route(const sl_collective_ops *c, const sl_backend_ops *be, char *why, size_t len) {
  if (c->domains & SL_MEM_HOST) return SL__ROUTE_HOST;
  /* pinned host memory only: the host route's slots are pinned where the backend can pin */
  if (!(c->domains & SL_MEM_DEVICE)) return SL__ROUTE_HOST;
  /* the device route hands it the rank's backend's device memory (host memory, on a backend
   * whose device memory is host memory): it must be the memory it moves, which the two tables
   * name alike (module.h: device_backend is a native API, whatever the backend is called) */
  const char *api = be ? sl_backend_native_api(be) : NULL;
  if (c->device_backend && api && strcmp(c->device_backend, api) == 0) return SL__ROUTE_DEVICE;
  if (why && len) {
    char named[96] = "(none)";
    if (be && api && strcmp(api, be->name) != 0) snprintf(named, sizeof named, "%s (native API %s)", be->name, api);
    else if (be) snprintf(named, sizeof named, "%s", be->name);
    snprintf(why, len, "%s: moves %s device memory only, and this rank's backend is %s: no route serves the pair",
             c->name, c->device_backend ? c->device_backend : "(unnamed)", named);
  }
  return SL__ROUTE_NONE;
}

bool sl__module_name_ok(const char *name) { return name && valid_name(name); }

const char *sl__nearest_name(const char *name, const char *const *names, size_t n) { return nearest(name, names, n); }

sl_status sl__module_init_failed(sl_context *ctx, sl_status st, const char *kind, const char *name) {
  if (!ctx->errmsg[0])
    sl__fail(ctx, st, "%s %s: init failed (%s) and gave no reason", kind, name, sl_status_name(st));
  return st;
}

/* ---- for the module listing (module_list.c) and the scan (module_scan.c) ------------------ */

const char *sl__module_library_dir(void) { return library_dir; }

const char *sl__builtin_backend_name(size_t i) { return i < COUNT(builtin_backends) ? builtin_backends[i].name : NULL; }

const sl_backend_ops *sl__builtin_backend_ops(size_t i) {
  return i < COUNT(builtin_backends) ? builtin_backends[i].get() : NULL;
}

const char *sl__builtin_collective_name(size_t i) {
  return i < COUNT(builtin_collectives) ? builtin_collectives[i].name : NULL;
}

const sl_collective_ops *sl__builtin_collective_ops(size_t i) {
  return i < COUNT(builtin_collectives) ? builtin_collectives[i].get() : NULL;
}

const char *sl__known_backend(size_t i) { return i < COUNT(loadable_backends) ? loadable_backends[i] : NULL; }

const char *sl__known_collective(size_t i) { return i < COUNT(loadable_collectives) ? loadable_collectives[i] : NULL; }

int sl__module_open(const char *name, bool collective, sl__module *m, char *why, size_t whylen) {
  *m = (sl__module){0};
  if (!sl__module_name_ok(name)) {
    snprintf(why, whylen, "not a module name");
    return SL__MODULE_ABSENT;
  }
  loaded l;
  int e = load_module(name, collective, &l, why, whylen);
  if (e) return e == MODULE_ABSENT ? SL__MODULE_ABSENT : e == MODULE_UNLOADABLE ? SL__MODULE_UNLOADABLE
                                                                                   : SL__MODULE_BAD_ABI;
  m->dl = l.dl;
  m->shim = l.shim;
  m->ops = l.ops;
  _Static_assert(sizeof m->path == sizeof l.path, "one path size");
  memcpy(m->path, l.path, sizeof m->path);
  return 0;
}

void sl__module_close(sl__module *m) {
  free(m->shim);
  if (m->dl) dlclose(m->dl);
  *m = (sl__module){0};
}

int sl__module_probe_backend(const sl_backend_ops *o, const void *shim, char *reason, size_t len) {
  return probe_backend(o, shim, reason, len);
}

int sl__module_probe_collective(const sl_collective_ops *o, const void *shim, const sl_backend_ops *backend,
                                char *reason, size_t len) {
  return probe_collective(o, shim, backend, reason, len);
}
