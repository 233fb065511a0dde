/* The module listing (shardload.h, sl_module_list; what `shardload backends` prints): every
 * backend and collective module this process could use, what each is and whether it runs
 * here, and what "auto" would choose. Opening, probing and auto are the registry's own
 * (registry.c, module_scan.c): the listing reports them, it has no rules of its own but the
 * order of the list and which backend a collective is probed with. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "module_scan.h"

#define TEXT_LEN 512

struct sl_module_list {
  sl_module_info *items;
  size_t count, cap;
  void **owned; /* every string and array the items and the summary point to */
  size_t nowned, owned_cap;
  bool oom;
  sl_module_summary summary;
  const char *auto_pairs_by; /* the native API (or name) of auto's backend: what collectives are probed with */
  sl__module_dirs dirs;
};

/* ---- strings and items the list owns ------------------------------------------------------ */

/* P, from now on freed with the list; false (P freed, l->oom set) when out of memory. */
static bool keep(sl_module_list *l, void *p) {
  if (!p) {
    l->oom = true;
    return false;
  }
  if (l->nowned == l->owned_cap) {
    size_t cap = l->owned_cap ? 2 * l->owned_cap : 64;
    void **grown = realloc(l->owned, cap * sizeof *grown);
    if (!grown) {
      free(p);
      l->oom = true;
      return false;
    }
    l->owned = grown;
    l->owned_cap = cap;
  }
  l->owned[l->nowned++] = p;
  return true;
}

/* A copy of S owned by the list; NULL for NULL, and NULL (with l->oom) when out of memory. */
static const char *own(sl_module_list *l, const char *s) {
  if (!s) return NULL;
  char *copy = sl__strdup(s);
  return keep(l, copy) ? copy : NULL;
}

/* N string pointers owned by the list, all NULL; NULL (with l->oom) when out of memory. */
static const char **own_array(sl_module_list *l, size_t n) {
  const char **a = calloc(n ? n : 1, sizeof *a);
  return keep(l, (void *)a) ? a : NULL;
}

static sl_module_info *add(sl_module_list *l, sl_module_kind kind, const char *name) {
  if (l->count == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    sl_module_info *grown = realloc(l->items, cap * sizeof *grown);
    if (!grown) {
      l->oom = true;
      return NULL;
    }
    l->items = grown;
    l->cap = cap;
  }
  sl_module_info *m = &l->items[l->count++];
  *m = (sl_module_info){.size = sizeof *m, .kind = kind, .name = own(l, name), .reason = "", .device = ""};
  return m;
}

/* ---- a context of the listing's own: the caller's logger, nothing of its job --------------- */

static sl_context *scratch_context(const sl_context *user) {
  sl_context *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  if (user) {
    c->log = user->log;
    c->log_user = user->log_user;
    c->log_level = user->log_level;
  }
  c->world_size = c->local_world_size = 1;
  c->timeout_ms = user && user->timeout_ms > 0 ? user->timeout_ms : 300000;
  c->host = sl__module_host_of(c);
  return c;
}

/* ---- backends ----------------------------------------------------------------------------- */

/* Backend O started on DEVICE (-1: the one local rank 0 would get), described into DESC and
 * stopped again; on failure sc->errmsg says why. */
static sl_status describe_one(sl_context *sc, const sl_backend_ops *o, int device, char *desc, size_t len) {
  sl_backend_init bi = {.size = sizeof bi, .host = &sc->host, .local_rank = 0, .local_world_size = 1,
                        .device = device, .ops = o, .timeout_ms = sc->timeout_ms};
  void *be = NULL;
  sc->errmsg[0] = 0;
  desc[0] = 0;
  sl_status st = o->init(&bi, &be);
  if (st != SL_OK) {
    sl__module_init_failed(sc, st, "backend", o->name);
    return st;
  }
  if (SL_HAS_OP(o, describe)) {
    o->describe(be, desc, len);
    desc[len - 1] = 0;
    sl__module_text(desc, len);
  }
  (void)o->synchronize(be); /* fini's contract: the core has synchronised first (nothing was queued) */
  o->fini(be);
  return SL_OK;
}

/* How many devices the listing starts O on: what the module says (SL_EXT_DEVICE_COUNT), at most
 * SL_MODULE_DEVICES_MAX (*MORE: the rest), else one; *ORDINALS: whether they are named by
 * ordinal (0, 1, ...) or, for a module that does not count, by local rank 0's choice (-1). */
static size_t device_count(const sl_backend_ops *o, bool *ordinals, size_t *more) {
  sl_ext_device_count_fn f =
      SL_HAS_OP(o, get_proc) ? (sl_ext_device_count_fn)o->get_proc(SL_EXT_DEVICE_COUNT) : NULL;
  int n = f ? f() : 0;
  *ordinals = n > 0;
  *more = n > SL_MODULE_DEVICES_MAX ? (size_t)n - SL_MODULE_DEVICES_MAX : 0;
  return n <= 0 ? 1 : n > SL_MODULE_DEVICES_MAX ? SL_MODULE_DEVICES_MAX : (size_t)n;
}

/* A backend that probes yes, started on each of its devices in turn, described and stopped
 * again: its device lines (the first is DEVICE), or, where the first will not start, why (the
 * state becomes CANNOT_RUN). A later device that will not start is listed with why. */
static void describe_backend(sl_module_list *l, sl_context *sc, const sl_backend_ops *o, sl_module_info *m) {
  bool ordinals;
  size_t more, n = device_count(o, &ordinals, &more);
  const char **devs = own_array(l, n);
  if (!devs) return;
  char desc[256], why[TEXT_LEN];
  for (size_t i = 0; i < n && !l->oom; i++) {
    if (describe_one(sc, o, ordinals ? (int)i : -1, desc, sizeof desc) == SL_OK) {
      devs[i] = own(l, desc);
      continue;
    }
    if (i == 0) {
      snprintf(why, sizeof why, "init on its first device failed: %.440s", sc->errmsg);
      sl__module_text(why, sizeof why);
      m->state = SL_MODULE_CANNOT_RUN;
      m->reason = own(l, why);
      return;
    }
    snprintf(why, sizeof why, "%.40s:%zu: cannot start: %.440s", o->name, i, sc->errmsg);
    sl__module_text(why, sizeof why);
    devs[i] = own(l, why);
  }
  m->device = devs[0];
  m->devices = devs;
  m->device_count = n;
  m->devices_not_listed = more;
  if (o->flags & SL_BACKEND_DEVICE_IS_HOST) { /* its device memory is this machine's memory */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    m->memory_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
  }
}

static void fill_backend(sl_module_list *l, sl_context *sc, sl_module_info *m, const sl_backend_ops *o,
                         const void *shim) {
  char reason[TEXT_LEN];
  m->abi_version = shim ? 1u : o->abi_version;
  m->pairs_with = own(l, o->preferred_collective);
  m->probe = sl__module_probe_backend(o, shim, reason, sizeof reason);
  /* a built-in runs anywhere: a probe of 0 only keeps it out of auto (sim) */
  m->state = m->probe > 0 || m->builtin ? SL_MODULE_RUNS : SL_MODULE_CANNOT_RUN;
  m->reason = own(l, m->probe > 0 ? "" : reason);
  if (m->state == SL_MODULE_RUNS) describe_backend(l, sc, o, m);
}

/* A module that did not open (E: sl__module_open's answer, WHY its message), worded as auto's
 * verdicts are. */
static void refused(sl_module_list *l, sl_module_info *m, const char *name, int e, const char *why) {
  char reason[TEXT_LEN];
  m->state = e == SL__MODULE_ABSENT ? SL_MODULE_ABSENT : e == SL__MODULE_UNLOADABLE ? SL_MODULE_UNLOADABLE
                                                                                     : SL_MODULE_BAD_ABI;
  if (e == SL__MODULE_BAD_ABI) snprintf(reason, sizeof reason, "%s", why); /* names the file already */
  else
    snprintf(reason, sizeof reason, "%s: %s (%.440s)", name,
             e == SL__MODULE_ABSENT ? "not available" : "cannot be loaded", why);
  m->reason = own(l, reason);
  if (e != SL__MODULE_ABSENT) { /* the file that would not do, where the search found it */
    char *path = sl__module_locate(name);
    m->path = own(l, path);
    free(path);
  }
}

static void list_loadable_backend(sl_module_list *l, sl_context *sc, const char *name) {
  sl_module_info *m = add(l, SL_MODULE_BACKEND, name);
  if (!m) return;
  sl__module mod;
  char why[TEXT_LEN];
  int e = sl__module_open(name, false, &mod, why, sizeof why);
  if (e) {
    refused(l, m, name, e, why);
    return;
  }
  m->path = own(l, mod.path);
  fill_backend(l, sc, m, mod.ops, mod.shim);
  sl__module_close(&mod);
}

/* ---- collectives -------------------------------------------------------------------------- */

/* A collective is probed with a backend of the native API whose device memory it moves when it
 * moves device memory only (nccl with cuda, simccl with sim), else with the backend auto chose:
 * a table that gives only what the pairing reads (module.h: sl_backend_native_api). */
static void fill_collective(sl_module_list *l, sl_module_info *m, const sl_collective_ops *o, const void *shim,
                            const char *auto_backend) {
  char reason[TEXT_LEN];
  m->abi_version = shim ? 1u : o->abi_version;
  m->domains = o->domains;
  m->pairs_with = own(l, o->device_backend);
  bool device_only = (o->domains & SL_MEM_DEVICE) && !(o->domains & (SL_MEM_HOST | SL_MEM_PINNED));
  const char *with = device_only && o->device_backend ? o->device_backend : auto_backend;
  const char *api = device_only && o->device_backend ? o->device_backend
                    : l->auto_pairs_by                ? l->auto_pairs_by
                                                      : auto_backend;
  sl_backend_ops pairs = {.abi_version = SL_BACKEND_ABI_VERSION, .size = sizeof pairs, .name = api};
  m->probed_with = own(l, with);
  m->probe = sl__module_probe_collective(o, shim, &pairs, reason, sizeof reason);
  m->state = m->probe > 0 ? SL_MODULE_RUNS : SL_MODULE_CANNOT_RUN;
  m->reason = own(l, m->probe > 0 ? "" : reason);
}

static void list_loadable_collective(sl_module_list *l, const char *name, const char *auto_backend) {
  sl_module_info *m = add(l, SL_MODULE_COLLECTIVE, name);
  if (!m) return;
  sl__module mod;
  char why[TEXT_LEN];
  int e = sl__module_open(name, true, &mod, why, sizeof why);
  if (e) {
    refused(l, m, name, e, why);
    return;
  }
  m->path = own(l, mod.path);
  fill_collective(l, m, mod.ops, mod.shim, auto_backend);
  sl__module_close(&mod);
}

/* ---- installed files the core does not know by name ---------------------------------------- */

/* A file whose entry symbols say it is no module (or that is not a regular file) is listed as a
 * backend that is refused, with what it is: nothing opens it. */
static void list_not_a_module(sl_module_list *l, const sl__module_file *f, unsigned bits, const char *why) {
  sl_module_info *m = add(l, SL_MODULE_BACKEND, f->name);
  if (!m) return;
  char reason[TEXT_LEN];
  if (bits & SL__ENTRY_NOT_A_FILE)
    snprintf(reason, sizeof reason, "%.300s %.150s: not opened", f->path, why);
  else
    snprintf(reason, sizeof reason, "%.300s exports no entry symbol of a shardload module (%s, %s): not opened",
             f->path, SL_BACKEND_ENTRY, SL_COLLECTIVE_ENTRY);
  sl__module_text(reason, sizeof reason);
  m->state = bits & SL__ENTRY_NOT_A_FILE ? SL_MODULE_UNLOADABLE : SL_MODULE_BAD_ABI;
  m->path = own(l, f->path);
  m->reason = own(l, reason);
}

static void list_installed(sl_module_list *l, sl_context *sc, const sl__module_files *scan, bool collectives,
                           const char *auto_backend) {
  for (size_t i = 0; i < scan->count && !l->oom; i++) {
    char why[256];
    unsigned bits = sl__module_entries(scan->files[i].path, why, sizeof why);
    bool backend = bits & (SL__ENTRY_BACKEND | SL__ENTRY_UNKNOWN), collective = bits & SL__ENTRY_COLLECTIVE;
    if (!collectives && !backend && !collective) list_not_a_module(l, &scan->files[i], bits, why);
    else if (!collectives && backend) list_loadable_backend(l, sc, scan->files[i].name);
    else if (collectives && collective) list_loadable_collective(l, scan->files[i].name, auto_backend);
  }
}

/* ---- what auto would choose --------------------------------------------------------------- */

/* Backend auto as a context runs it (its verdicts go to the logger), then the data collective
 * its choice leads to (docs/DESIGN.md#modules, The data-plane agreement): its preferred
 * collective when this machine runs it (every rank of one machine on a device of its own),
 * else host staging; a job of one rank stages through host memory. */
static void choose_auto(sl_module_list *l, sl_context *sc) {
  const sl_backend_ops *ops = NULL;
  void *dl = NULL, *shim = NULL;
  char variant[8], why[TEXT_LEN];
  sl_module_summary *s = &l->summary;
  if (sl__backend_select(sc, "auto", &ops, &dl, &shim, variant, sizeof variant) != SL_OK) {
    s->auto_backend_reason = own(l, sc->errmsg);
    s->auto_collective = s->auto_collective_one_rank = NULL;
    s->auto_collective_reason = s->auto_collective_one_rank_reason = own(l, "no backend can run here");
    return;
  }
  s->auto_backend = own(l, ops->name);
  s->auto_backend_reason = own(l, sc->backend_reason);
  l->auto_pairs_by = own(l, sl_backend_native_api(ops));
  const char *pref = ops->preferred_collective;
  if (!pref || strcmp(pref, "gloo") == 0) {
    snprintf(why, sizeof why, "shm: backend %s stages through host memory (ranks of this host; hier where they span hosts, gloo where each host has one)",
             ops->name);
    s->auto_collective = own(l, "shm");
    s->auto_collective_reason = own(l, why);
    snprintf(why, sizeof why, "local: backend %s stages through host memory", ops->name);
  } else {
    char reason[TEXT_LEN];
    bool runs = sl__collective_probe(pref, ops, reason, sizeof reason) > 0;
    if (runs)
      snprintf(why, sizeof why, "%s: preferred by backend %s and this machine runs it (with a device per rank)", pref,
               ops->name);
    else
      snprintf(why, sizeof why,
               "shm: this machine cannot run %s, backend %s's preferred collective (%.300s); host staging (ranks of "
               "this host; hier where they span hosts, gloo where each host has one)",
               pref, ops->name, reason);
    s->auto_collective = own(l, runs ? pref : "shm");
    s->auto_collective_reason = own(l, why);
    snprintf(why, sizeof why, "local: one rank stages through host memory (backend %s's %s only when forced: "
             "--collective %s)", ops->name, pref, pref);
  }
  s->auto_collective_one_rank = own(l, "local");
  s->auto_collective_one_rank_reason = own(l, why);
  free(shim);
  if (dl) dlclose(dl);
}

/* ---- the list ----------------------------------------------------------------------------- */

static void list_all(sl_module_list *l, sl_context *sc) {
  choose_auto(l, sc);
  const char *with = l->summary.auto_backend ? l->summary.auto_backend : "cpu";
  const char *skip[16];
  size_t nskip = 0;
  for (size_t i = 0; sl__builtin_backend_name(i) && nskip < 16; i++) skip[nskip++] = sl__builtin_backend_name(i);
  for (size_t i = 0; sl__builtin_collective_name(i) && nskip < 16; i++) skip[nskip++] = sl__builtin_collective_name(i);
  for (size_t i = 0; sl__known_backend(i) && nskip < 16; i++) skip[nskip++] = sl__known_backend(i);
  for (size_t i = 0; sl__known_collective(i) && nskip < 16; i++) skip[nskip++] = sl__known_collective(i);
  sl__module_files scan;
  if (sl__module_scan(skip, nskip, SL_MODULE_LIST_MAX, &scan) != SL_OK) {
    l->oom = true;
    return;
  }
  l->summary.not_listed = scan.more;
  for (size_t i = 0; sl__builtin_backend_name(i) && !l->oom; i++) {
    sl_module_info *m = add(l, SL_MODULE_BACKEND, sl__builtin_backend_name(i));
    if (!m) break;
    m->builtin = 1;
    fill_backend(l, sc, m, sl__builtin_backend_ops(i), NULL);
  }
  for (size_t i = 0; sl__known_backend(i) && !l->oom; i++) list_loadable_backend(l, sc, sl__known_backend(i));
  list_installed(l, sc, &scan, false, with);
  for (size_t i = 0; sl__builtin_collective_name(i) && !l->oom; i++) {
    sl_module_info *m = add(l, SL_MODULE_COLLECTIVE, sl__builtin_collective_name(i));
    if (!m) break;
    m->builtin = 1;
    fill_collective(l, m, sl__builtin_collective_ops(i), NULL, with);
  }
  for (size_t i = 0; sl__known_collective(i) && !l->oom; i++)
    list_loadable_collective(l, sl__known_collective(i), with);
  list_installed(l, sc, &scan, true, with);
  sl__module_scan_free(&scan);
}

SL_API sl_status sl_module_list_create(sl_context *ctx, sl_module_list **out) {
  if (!out) return sl__fail(ctx, SL_ERR_INVALID, "sl_module_list_create: OUT is NULL");
  *out = NULL;
  sl_module_list *l = calloc(1, sizeof *l);
  sl_context *sc = scratch_context(ctx);
  if (!l || !sc || sl__module_dirs_get(&l->dirs) != SL_OK) goto out_nomem;
  l->summary.size = sizeof l->summary;
  l->summary.dirs = (const char *const *)l->dirs.dir;
  l->summary.dir_count = l->dirs.count;
  list_all(l, sc);
  if (l->oom) goto out_nomem;
  free(sc);
  *out = l;
  return SL_OK;
out_nomem:
  free(sc);
  sl_module_list_destroy(l);
  return sl__fail(ctx, SL_ERR_NOMEM, "out of memory listing the modules");
}

SL_API void sl_module_list_destroy(sl_module_list *l) {
  if (!l) return;
  for (size_t i = 0; i < l->nowned; i++) free(l->owned[i]);
  free(l->owned);
  free(l->items);
  sl__module_dirs_free(&l->dirs);
  free(l);
}

SL_API size_t sl_module_list_count(const sl_module_list *l) { return l ? l->count : 0; }

SL_API sl_status sl_module_list_get(const sl_module_list *l, size_t i, sl_module_info *out) {
  if (!l || !out || out->size < sizeof out->size || i >= l->count) return SL_ERR_INVALID;
  sl_module_info full = l->items[i];
  full.size = out->size; /* the caller's own value stays */
  memcpy(out, &full, out->size < sizeof full ? out->size : sizeof full);
  return SL_OK;
}

SL_API sl_status sl_module_list_summary(const sl_module_list *l, sl_module_summary *out) {
  if (!l || !out || out->size < sizeof out->size) return SL_ERR_INVALID;
  sl_module_summary full = l->summary;
  full.size = out->size;
  memcpy(out, &full, out->size < sizeof full ? out->size : sizeof full);
  return SL_OK;
}

SL_API const char *sl_module_state_name(sl_module_state s) {
  switch (s) {
  case SL_MODULE_RUNS: return "runs";
  case SL_MODULE_CANNOT_RUN: return "cannot_run";
  case SL_MODULE_ABSENT: return "absent";
  case SL_MODULE_UNLOADABLE: return "unloadable";
  case SL_MODULE_BAD_ABI: return "bad_abi";
  }
  return "unknown";
}
