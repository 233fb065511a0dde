/* The module ABI (docs/DESIGN.md#modules): versioned entry symbols, the ABI v1 adapter, probe
 * reasons, extension lookup, ABI errors naming the file, and the sizes of structs that cross
 * the public boundary. The modules are real shared objects built from tests/modules/ into
 * $SHARDLOAD_TEST_MODULES (tests/CMakeLists.txt). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

#include "internal.h"
#include "loader.h"
#include "planes.h"
#include "registry_v1.h"

static const char *moddir;

/* ---- a bare context: the registry only uses its message buffer and logger ------------------ */
typedef struct logbuf {
  char text[16384];
} logbuf;

static void capture(void *user, sl_log_level level, const char *msg) {
  logbuf *lb = user;
  size_t used = strlen(lb->text);
  snprintf(lb->text + used, sizeof lb->text - used, "[%d] %s\n", (int)level, msg);
}

static sl_context *bare_ctx(logbuf *lb) {
  sl_context *c = calloc(1, sizeof *c);
  assert_non_null(c);
  c->log = capture;
  c->log_user = lb;
  c->log_level = SL_LOG_INFO;
  c->rank = 0;
  c->world_size = 1;
  return c;
}

static void host_log(void *core, sl_log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sl__vlog(core, level, fmt, ap);
  va_end(ap);
}

static sl_status host_fail(void *core, sl_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sl__vfail(core, s, fmt, ap);
  va_end(ap);
  return s;
}

static sl_module_host host_of(sl_context *c) { return (sl_module_host){sizeof(sl_module_host), c, host_log, host_fail}; }

static void use_modules(void) { setenv("SHARDLOAD_MODULE_PATH", moddir, 1); }

/* Registry select + init through the v2 table, as the context does. */
typedef struct opened {
  const sl_backend_ops *ops;
  void *dl, *shim, *be;
  sl_module_host host;
} opened;

static sl_status open_backend(sl_context *c, const char *spec, opened *o) {
  memset(o, 0, sizeof *o);
  char variant[64];
  sl_status st = sl__backend_select(c, spec, &o->ops, &o->dl, &o->shim, variant, sizeof variant);
  if (st != SL_OK) return st;
  o->host = host_of(c);
  sl_backend_init bi = {.size = sizeof bi,
                        .host = &o->host,
                        .local_rank = 0,
                        .local_world_size = 1,
                        .device = -1,
                        .variant = variant[0] ? variant : NULL,
                        .ops = o->ops};
  st = o->ops->init(&bi, &o->be);
  if (st != SL_OK) {
    free(o->shim);
    if (o->dl) dlclose(o->dl);
    memset(o, 0, sizeof *o);
  }
  return st;
}

static void close_backend(opened *o) {
  o->ops->fini(o->be);
  free(o->shim);
  if (o->dl) dlclose(o->dl);
}

/* ---- entry symbols ------------------------------------------------------------------------ */

/* A module exporting both entries is used through the newest one, unadapted. */
static void test_v2_entry_is_preferred(void **state) {
  use_modules();
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  opened o;
  assert_int_equal(open_backend(c, "dual", &o), SL_OK);
  assert_null(o.shim);
  assert_int_equal(o.ops->abi_version, SL_BACKEND_ABI_VERSION);
  char desc[128];
  o.ops->describe(o.be, desc, sizeof desc);
  assert_non_null(strstr(desc, "ABI v2 entry"));
  /* the same binary's v1 entry still serves a core that knows only v1 (here: the adapter) */
  typedef const sl_backend_ops_v1 *(*entry_v1)(void);
  entry_v1 e1 = (entry_v1)dlsym(o.dl, SL_BACKEND_ENTRY_V1);
  assert_non_null(e1);
  const sl_backend_ops_v1 *t1 = e1();
  assert_int_equal(t1->abi_version, 1);
  sl_backend_ops *adapted = sl__v1_backend_adapt(t1);
  assert_non_null(adapted);
  sl_backend_init bi = {.size = sizeof bi, .host = &o.host, .device = -1, .ops = adapted};
  void *be1 = NULL;
  assert_int_equal(adapted->init(&bi, &be1), SL_OK);
  adapted->describe(be1, desc, sizeof desc);
  assert_non_null(strstr(desc, "ABI v1 entry"));
  adapted->fini(be1);
  free(adapted);
  close_backend(&o);
  free(c);
}

/* A v1-only backend is adapted: the core sees a v2 table whose ops reach the v1 module. */
static void test_v1_backend_adapted(void **state) {
  use_modules();
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  c->log_level = SL_LOG_DEBUG;
  opened o;
  assert_int_equal(open_backend(c, "v1host", &o), SL_OK);
  assert_non_null(o.shim);
  assert_ptr_equal(o.shim, o.ops); /* the core frees the shim: the table is its first member */
  assert_int_equal(o.ops->abi_version, SL_BACKEND_ABI_VERSION);
  assert_int_equal(o.ops->size, sizeof(sl_backend_ops));
  assert_string_equal(o.ops->name, "v1host");
  assert_true(o.ops->flags & SL_BACKEND_HAS_PINNED);
  assert_true(SL_HAS_OP(o.ops, alloc_pinned));
  assert_false(SL_HAS_OP(o.ops, cast_async)); /* v1host has no cast_device */
  assert_false(SL_HAS_OP(o.ops, register_host));
  assert_non_null(strstr(lb.text, "v1host: device 0 ready")); /* the v1 host logs through the core */
  char desc[128];
  o.ops->describe(o.be, desc, sizeof desc);
  assert_string_equal(desc, "v1host:0 (ABI v1 test backend)");

  /* its ops (tokens for streams and events, copies complete on return, 2-D copies, the sgd and
   * traffic extensions) are conformance cases: tests/conformance/, conformance_backend_v1host */
  assert_true(SL_HAS_OP(o.ops, get_proc));
  assert_non_null(o.ops->get_proc(SL_EXT_TRAFFIC));
  assert_non_null(o.ops->get_proc(SL_EXT_SGD_STEP));
  close_backend(&o);
  free(c);
}

/* The v1 module's failure message, through the v1 host the adapter built, reaches the core. */
static void test_v1_host_reaches_core(void **state) {
  use_modules();
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  opened o;
  assert_int_equal(open_backend(c, "v1host:fail", &o), SL_ERR_BACKEND);
  assert_string_equal(c->errmsg, "v1host: asked to fail (variant 'fail')");
  free(c);
}

/* Two v1 modules at once: each adapted table serves its own module (no global state). */
static void test_two_v1_modules_at_once(void **state) {
  use_modules();
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  opened a, b;
  assert_int_equal(open_backend(c, "v1host", &a), SL_OK);
  const sl_collective_ops *cops;
  void *cdl, *cshim, *comm = NULL;
  assert_int_equal(sl__collective_select(c, "v1local", &cops, &cdl, &cshim), SL_OK);
  assert_int_equal(open_backend(c, "v1other", &b), SL_OK);
  assert_ptr_not_equal(a.shim, b.shim);
  sl_module_host h = host_of(c);
  sl_collective_init ci = {.size = sizeof ci, .host = &h, .rank = 0, .world_size = 1, .prefix = "t/", .timeout_ms = 1000,
                           .device = -1, .ops = cops};
  assert_int_equal(cops->init(&ci, &comm), SL_OK);
  char d1[64], d2[64];
  a.ops->describe(a.be, d1, sizeof d1);
  b.ops->describe(b.be, d2, sizeof d2);
  assert_string_equal(d1, "v1host:0 (ABI v1 test backend)");
  assert_string_equal(d2, "v1other:0 (ABI v1 test backend)");
  close_backend(&a);
  b.ops->describe(b.be, d2, sizeof d2); /* still its own after the other one closed */
  assert_string_equal(d2, "v1other:0 (ABI v1 test backend)");
  uint32_t x = 0x01020304, y = 0;
  assert_int_equal(cops->allgather(comm, &x, &y, sizeof x, NULL), SL_OK);
  assert_int_equal(y, x);
  cops->fini(comm);
  free(cshim);
  dlclose(cdl);
  close_backend(&b);
  free(c);
}

/* Test instruments are extensions found by name, not members of the production table. */
static void test_production_extensions_by_name(void **state) {
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  opened o;
  assert_int_equal(open_backend(c, "cpu", &o), SL_OK);
  assert_true(SL_HAS_OP(o.ops, get_proc));
  sl_ext_sgd_step_fn sgd = (sl_ext_sgd_step_fn)o.ops->get_proc(SL_EXT_SGD_STEP);
  assert_non_null(sgd);
  assert_null(o.ops->get_proc(SL_EXT_TRAFFIC)); /* cpu copies nothing it could count */
  assert_null(o.ops->get_proc("sl_ext_no_such_thing"));
  float x[2] = {1.0f, 2.0f}, g[2] = {1.0f, 1.0f};
  assert_int_equal(sgd(o.be, x, g, SL_DTYPE_F32, 2, 0.5f), SL_OK);
  assert_true(x[0] == 0.5f && x[1] == 1.5f);
  close_backend(&o);
  const sl_backend_ops *sim = sl__backend_sim();
  assert_true(SL_HAS_OP(sim, get_proc));
  assert_non_null(sim->get_proc(SL_EXT_SGD_STEP));
  assert_non_null(sim->get_proc(SL_EXT_TRAFFIC));
  /* a module without extensions leaves get_proc out */
  use_modules();
  assert_int_equal(open_backend(c, "hostmem", &o), SL_OK);
  assert_false(SL_HAS_OP(o.ops, get_proc));
  close_backend(&o);
  free(c);
}

/* ---- collectives -------------------------------------------------------------------------- */

static void test_v1_collective_adapted(void **state) {
  use_modules();
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  const sl_collective_ops *ops;
  void *dl, *shim, *comm = NULL;
  assert_int_equal(sl__collective_select(c, "v1local", &ops, &dl, &shim), SL_OK);
  assert_non_null(shim);
  assert_non_null(dl);
  assert_int_equal(ops->abi_version, SL_COLLECTIVE_ABI_VERSION);
  assert_int_equal(ops->flags & SL_COLL_SYNC, SL_COLL_SYNC);
  assert_int_equal(ops->domains, SL_MEM_HOST | SL_MEM_PINNED);
  assert_null(ops->device_backend);
  assert_false(SL_HAS_OP(ops, split));
  assert_false(SL_HAS_OP(ops, abort));
  sl_module_host h = host_of(c);
  /* the v1 init learns every field it knew, and its failure message reaches the core */
  sl_collective_init ci = {.size = sizeof ci, .host = &h, .rank = 0, .world_size = 2, .prefix = "t/", .timeout_ms = 1000,
                           .device = -1, .ops = ops};
  assert_int_equal(ops->init(&ci, &comm), SL_ERR_INVALID);
  assert_string_equal(c->errmsg, "v1local: world size 2; this test collective serves one rank");
  ci.world_size = 1;
  assert_int_equal(ops->init(&ci, &comm), SL_OK); /* its ops: conformance_collective_v1local */
  ops->fini(comm);
  free(shim);
  dlclose(dl);

  /* a table handed to init without the core's adapted table is refused, not guessed */
  assert_int_equal(sl__collective_select(c, "v1local", &ops, &dl, &shim), SL_OK);
  ci.ops = NULL;
  assert_int_equal(ops->init(&ci, &comm), SL_ERR_ABI);
  free(shim);
  dlclose(dl);
  free(c);
}

static void test_collective_names_and_probe(void **state) {
  use_modules();
  const char *names[16], *two[2];
  size_t n = sl__collective_names(names, 16);
  const char *want[] = {"local", "simccl", "nccl", "rccl"};
  for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
    size_t i = 0;
    while (i < n && strcmp(names[i], want[w]) != 0) i++;
    assert_true(i < n);
  }
  assert_int_equal(sl__collective_names(two, 2), 2); /* bounded by MAX */
  /* every built-in table passes the check loadable ones must pass */
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  for (size_t i = 0; i + 2 < n; i++) { /* built-ins first, then nccl and rccl */
    const sl_collective_ops *ops;
    void *dl, *shim;
    sl_status st = sl__collective_select(c, names[i], &ops, &dl, &shim);
    if (st != SL_OK) fprintf(stderr, "%s: %s\n", names[i], c->errmsg);
    assert_int_equal(st, SL_OK);
    assert_null(dl);
    assert_null(shim);
  }
  assert_string_equal(names[n - 2], "nccl");
  opened o;
  assert_int_equal(open_backend(c, "sim", &o), SL_OK);
  close_backend(&o);
  free(c);
  char reason[512];
  uint32_t domains = 0;
  assert_true(sl__collective_probe_domains("local", sl__backend_cpu(), reason, sizeof reason, &domains) > 0);
  assert_int_equal(domains, SL_MEM_HOST | SL_MEM_PINNED); /* what its table declares */
  assert_true(sl__collective_probe_domains("simccl", sl__backend_sim(), reason, sizeof reason, &domains) > 0);
  assert_int_equal(domains, SL_MEM_DEVICE);
  /* no route */
  assert_int_equal(sl__collective_probe_domains("simccl", sl__backend_cpu(), reason, sizeof reason, &domains), 0);
  assert_int_equal(domains, SL_MEM_DEVICE);
  assert_true(sl__collective_probe("v1local", sl__backend_cpu(), reason, sizeof reason) > 0);
  /* an absent loadable module: its reason names it and the file the loader could not find */
  assert_int_equal(sl__collective_probe_domains("nccl", sl__backend_cpu(), reason, sizeof reason, &domains), -1);
  assert_int_equal(domains, 0); /* no table read */
  assert_non_null(strstr(reason, "nccl: not available here (libshardload-nccl.so"));
  assert_int_equal(sl__collective_probe("Bad Name", sl__backend_cpu(), reason, sizeof reason), -1);
  assert_non_null(strstr(reason, "not a collective name"));
  /* a backend module is not a collective module */
  assert_int_equal(sl__collective_probe("hostmem", sl__backend_cpu(), reason, sizeof reason), 0);
  assert_non_null(strstr(reason, "exports neither sl_collective_module_v2 nor sl_collective_module"));
}

static void test_unknown_collective(void **state) {
  use_modules();
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  const sl_collective_ops *ops;
  void *dl, *shim;
  assert_int_equal(sl__collective_select(c, "glo", &ops, &dl, &shim), SL_ERR_INVALID);
  assert_non_null(strstr(c->errmsg, "unknown collective 'glo'"));
  assert_non_null(strstr(c->errmsg, "did you mean"));
  assert_int_equal(sl__collective_select(c, "rccl", &ops, &dl, &shim), SL_ERR_NO_DEVICE);
  assert_non_null(strstr(c->errmsg, "collective 'rccl' is not available here"));
  free(c);
}

/* ---- probe reasons and errors --------------------------------------------------------------- */

static void test_probe_reasons_reach_the_message(void **state) {
  use_modules();
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  opened o;
  assert_int_equal(open_backend(c, "probeno", &o), SL_ERR_NO_DEVICE);
  assert_non_null(strstr(c->errmsg, "backend 'probeno' cannot run on this machine: probeno: no widget on this machine"));
  /* a v1 module cannot say why: the message says so */
  setenv("SL_TEST_V1_SCORE", "0", 1);
  assert_int_equal(open_backend(c, "v1host", &o), SL_ERR_NO_DEVICE);
  unsetenv("SL_TEST_V1_SCORE");
  assert_non_null(strstr(c->errmsg, "v1host: score() returned 0 (ABI v1 module gives no reason)"));
  free(c);
}

static void test_wrong_abi_names_the_file(void **state) {
  use_modules();
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  opened o;
  assert_int_equal(open_backend(c, "badabi", &o), SL_ERR_ABI);
  char want[4200];
  snprintf(want, sizeof want, "%s/libshardload-badabi.so: its table says ABI version 99", moddir);
  assert_non_null(strstr(c->errmsg, want));
  assert_non_null(strstr(c->errmsg, "rebuild it"));
  /* a collective module is not a backend */
  assert_int_equal(open_backend(c, "v1local", &o), SL_ERR_ABI);
  assert_non_null(strstr(c->errmsg, "exports neither sl_backend_module_v2 nor sl_backend_module"));
  free(c);
}

static void test_unknown_and_absent_backends(void **state) {
  use_modules();
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  opened o;
  assert_int_equal(open_backend(c, "cpx", &o), SL_ERR_INVALID);
  assert_non_null(strstr(c->errmsg, "unknown backend 'cpx'"));
  assert_non_null(strstr(c->errmsg, "did you mean 'cpu'?"));
  assert_non_null(strstr(c->errmsg, "choose one of auto, cpu, sim, sim:strict, cuda, hip, level_zero"));
  assert_int_equal(open_backend(c, "Bad-Name", &o), SL_ERR_INVALID);
  assert_non_null(strstr(c->errmsg, "unknown backend 'Bad-Name'"));
  assert_int_equal(open_backend(c, "../../etc/x", &o), SL_ERR_INVALID); /* never a path */
  assert_int_equal(open_backend(c, "level_zero", &o), SL_ERR_NO_DEVICE);
  assert_non_null(strstr(c->errmsg, "backend 'level_zero' is not available here (libshardload-level_zero.so"));
  assert_non_null(strstr(c->errmsg, "-DSHARDLOAD_WITH_LEVEL_ZERO=ON"));
  /* any valid name is a module: found on SHARDLOAD_MODULE_PATH, used as is */
  assert_int_equal(open_backend(c, "hostmem", &o), SL_OK);
  assert_null(o.shim);
  close_backend(&o);
  free(c);
}

/* "auto" probes the accelerator modules first, keeps the best (an accelerator wins a tie) and
 * logs why each other one was not taken. Accelerator names are played by test modules whose
 * tables carry those names, linked into a directory of their own. */
static void test_auto_probes_and_logs_reasons(void **state) {
  char *dir = sl_test_dir("auto");
  char target[4200], link[4200];
  snprintf(target, sizeof target, "%s/libshardload-fakecuda.so", moddir);
  snprintf(link, sizeof link, "%s/libshardload-cuda.so", dir);
  assert_int_equal(symlink(target, link), 0);
  /* a table that gives another name than its file's is refused, loudly */
  snprintf(target, sizeof target, "%s/libshardload-probeno.so", moddir);
  snprintf(link, sizeof link, "%s/libshardload-level_zero.so", dir);
  assert_int_equal(symlink(target, link), 0);
  setenv("SHARDLOAD_MODULE_PATH", dir, 1);
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  opened o;
  assert_int_equal(open_backend(c, "auto", &o), SL_OK);
  assert_string_equal(o.ops->name, "cpu");
  close_backend(&o);
  assert_non_null(strstr(lb.text, "backend auto: cuda: no widget on this machine"));
  assert_non_null(strstr(lb.text, "backend auto: hip: not available (libshardload-hip.so"));
  assert_non_null(strstr(lb.text, "[1] backend auto: level_zero: unusable ("));
  assert_non_null(strstr(lb.text, "its table calls itself 'probeno', not 'level_zero'"));
  assert_non_null(strstr(lb.text, "backend auto: chose cpu"));
  assert_non_null(strstr(lb.text, "backend auto: sim: ")); /* sim says why it is never chosen */
  /* a usable accelerator module beats the built-ins */
  snprintf(target, sizeof target, "%s/libshardload-fakehip.so", moddir);
  snprintf(link, sizeof link, "%s/libshardload-hip.so", dir);
  assert_int_equal(symlink(target, link), 0);
  lb.text[0] = 0;
  assert_int_equal(open_backend(c, "auto", &o), SL_OK);
  assert_string_equal(o.ops->name, "hip");
  assert_non_null(strstr(lb.text, "backend auto: cpu: usable (probe 1), hip probes 1"));
  close_backend(&o);
  free(c);
  free(dir);
}

/* ---- sizes of structs that cross the public boundary ---------------------------------------- */

/* A caller compiled against a shorter sl_load_stats gets only what it knows: nothing past its
 * size is written. */
static void test_stats_write_within_size(void **state) {
  sl_state *st = calloc(1, sizeof *st);
  assert_non_null(st);
  st->stats.bytes_read = 11;
  st->stats.bytes_sent = 22;
  st->stats.seconds_phase1 = 3.5;
  unsigned char raw[sizeof(sl_load_stats) + 16];
  memset(raw, 0xA5, sizeof raw);
  sl_load_stats *out = (sl_load_stats *)raw;
  size_t old = offsetof(sl_load_stats, bytes_sent); /* an old caller: size + bytes_read */
  out->size = old;
  assert_int_equal(sl_state_stats(st, out), SL_OK);
  assert_int_equal(out->size, old);
  assert_int_equal(out->bytes_read, 11);
  assert_true(sl_test_all_bytes(raw + old, sizeof raw - old, 0xA5));
  out->size = sizeof(sl_load_stats);
  assert_int_equal(sl_state_stats(st, out), SL_OK);
  assert_true(out->seconds_phase1 == 3.5);
  assert_true(sl_test_all_bytes(raw + sizeof(sl_load_stats), 16, 0xA5));
  out->size = 0;
  assert_int_equal(sl_state_stats(st, out), SL_ERR_INVALID);
  sl_state_destroy(st);
}

static void test_geometry_writes_within_size(void **state) {
  sl_context_options o = {.size = sizeof o, .backend = "cpu", .world_size = 1};
  sl_context *ctx = NULL;
  assert_int_equal(sl_context_create(&o, &ctx), SL_OK);
  sl_plan *plan = NULL;
  assert_int_equal(sl_plan_create(ctx, &plan), SL_OK);
  sl_source_tensor t = {.name = "w", .dtype = SL_DTYPE_F32, .ndim = 2, .shape = {10, 6}};
  unsigned char raw[sizeof(sl_shard_geometry) + 16];
  memset(raw, 0xA5, sizeof raw);
  sl_shard_geometry *g = (sl_shard_geometry *)raw;
  size_t old = offsetof(sl_shard_geometry, local_shape); /* size + ndim (+ padding) */
  g->size = old;
  assert_int_equal(sl_plan_geometry(plan, &t, 3, 4, g), SL_OK);
  assert_int_equal(g->ndim, 2);
  assert_int_equal(g->size, old);
  assert_true(sl_test_all_bytes(raw + old, sizeof raw - old, 0xA5));
  g->size = sizeof *g;
  assert_int_equal(sl_plan_geometry(plan, &t, 3, 4, g), SL_OK);
  assert_int_equal(g->local_shape[0], 1); /* 10 over 4: 3,3,3,1 */
  assert_true(sl_test_all_bytes(raw + sizeof *g, 16, 0xA5));
  g->size = 2;
  assert_int_equal(sl_plan_geometry(plan, &t, 3, 4, g), SL_ERR_INVALID);
  assert_non_null(strstr(sl_context_errmsg(ctx), "set sl_shard_geometry.size"));
  sl_plan_destroy(plan);
  sl_context_destroy(ctx);
}

/* ---- a whole load on an ABI v1 backend -------------------------------------------------------- */

static void test_world1_load_on_v1_modules(void **state) {
  use_modules();
  char *dir = sl_test_dir("v1load");
  char *path = sl_test_path(dir, "m.safetensors");
  const sl_test_tensor ts[] = {
      {"a.weight", "F32", 2, {6, 4}, NULL},
      {"b.bias", "BF16", 1, {3}, NULL},
      {"scale", "F32", 0, {0}, NULL},
  };
  assert_int_equal(sl_test_write_st(path, ts, 3, NULL), 0);
  char err[1024] = "";
  /* both modules ABI v1: the v1 collective is the data plane the loader moves bytes through */
  sl_context_options co = {.size = sizeof co, .backend = "v1host", .collective = "v1local", .world_size = 1,
                           .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  sl_status s = sl_context_create(&co, &ctx);
  if (s != SL_OK) fprintf(stderr, "context: %s\n", err);
  assert_int_equal(s, SL_OK);
  assert_string_equal(sl_context_backend_name(ctx), "v1host");
  assert_string_equal(sl_context_device_description(ctx), "v1host:0 (ABI v1 test backend)");
  assert_string_equal(sl_context_collective_name(ctx), "v1local");
  sl_source *src = NULL;
  sl_plan *plan = NULL;
  sl_state *st = NULL;
  assert_int_equal(sl_source_open(ctx, path, &src), SL_OK);
  assert_int_equal(sl_plan_create(ctx, &plan), SL_OK);
  sl_load_options lo = {.size = sizeof lo, .cpu_offload = SL_CPU_OFFLOAD_OFF};
  s = sl_load(ctx, plan, src, &lo, &st);
  if (s != SL_OK) fprintf(stderr, "load: %s\n", sl_context_errmsg(ctx));
  assert_int_equal(s, SL_OK);
  assert_int_equal(sl_state_count(st), 3);
  uint64_t total = 0;
  for (size_t i = 0; i < 3; i++) {
    const sl_tensor *t = sl_state_find(st, ts[i].name);
    assert_non_null(t);
    assert_int_equal(t->device, SL_DEVICE_ACCELERATOR);
    unsigned char *back = malloc(t->nbytes + 1);
    assert_int_equal(sl_copy_to_host(ctx, back, t->data, SL_DEVICE_ACCELERATOR, t->nbytes), SL_OK);
    for (uint64_t b = 0; b < t->nbytes; b++) assert_int_equal(back[b], sl_test_pattern_byte(ts[i].name, b));
    total += t->nbytes;
    free(back);
  }
  /* the bytes went through the v1 module's copies (its traffic extension counts them) */
  sl_ext_traffic_fn traffic = (sl_ext_traffic_fn)ctx->be->get_proc(SL_EXT_TRAFFIC);
  assert_non_null(traffic);
  uint64_t h2d = 0, d2h = 0;
  traffic(ctx->be_ctx, &h2d, &d2h);
  assert_true(h2d >= total);
  sl_load_stats stats = {.size = sizeof stats};
  assert_int_equal(sl_state_stats(st, &stats), SL_OK);
  /* the state outlives its context: it frees its shards through its own backend reference (the
   * v1host module aborts on any use after its fini) */
  sl_source_destroy(src);
  sl_plan_destroy(plan);
  sl_context_destroy(ctx);
  assert_non_null(sl_state_find(st, "a.weight"));
  sl_state_destroy(st);
  free(path);
  free(dir);
}

/* ---- what is opened, and from where ---------------------------------------------------------- */

static void copy_file(const char *from, const char *to) {
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  assert_non_null(in);
  assert_non_null(out);
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
  fclose(in);
  assert_int_equal(fclose(out), 0);
}

/* The whole file as a string, or NULL when there is none. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *text = calloc(1, 1 << 16);
  assert_non_null(text);
  size_t n = fread(text, 1, (1 << 16) - 1, f);
  text[n] = 0;
  fclose(f);
  return text;
}

static void plant(const char *dir, const char *as, const char *module) {
  char target[4200], link[4200];
  snprintf(target, sizeof target, "%s/libshardload-%s.so", moddir, module);
  snprintf(link, sizeof link, "%s/libshardload-%s.so", dir, as);
  assert_int_equal(symlink(target, link), 0);
}

/* A forked rank dies of its own crash: cmocka's handlers would carry on with the parent's
 * tests inside the child. */
static void child_signals(void) {
  const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
}

/* A process that opens libshardload by a relative path, then changes directory. */
typedef struct reldir_job {
  const char *libdir, *cwd;
} reldir_job;

static int reldir_rank(int rank, int world, void *arg) {
  child_signals();
  const reldir_job *j = arg;
  SL_CHILD_CHECK(chdir(j->libdir) == 0, "chdir %s", j->libdir);
  void *lib = dlopen("./libshardload.so", RTLD_NOW | RTLD_LOCAL);
  SL_CHILD_CHECK(lib != NULL, "dlopen ./libshardload.so: %s", dlerror());
  typedef sl_status (*create_fn)(const sl_context_options *, sl_context **);
  typedef const char *(*name_fn)(const sl_context *);
  typedef void (*destroy_fn)(sl_context *);
  create_fn create = (create_fn)dlsym(lib, "sl_context_create");
  name_fn collective = (name_fn)dlsym(lib, "sl_context_collective_name");
  destroy_fn destroy = (destroy_fn)dlsym(lib, "sl_context_destroy");
  SL_CHILD_CHECK(create && collective && destroy, "the library lacks its entry points");
  SL_CHILD_CHECK(chdir(j->cwd) == 0, "chdir %s", j->cwd);
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .collective = "plant", .world_size = 1,
                           .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  sl_status s = create(&co, &ctx);
  SL_CHILD_CHECK(s == SL_OK, "%s: %s", sl_status_name(s), err);
  SL_CHILD_CHECK(strcmp(collective(ctx), "plant") == 0, "collective %s", collective(ctx));
  destroy(ctx);
  return 0;
}

/* The directory next to the library is where the library was when it was loaded, as an
 * absolute path: a process that opened it by a relative path and then changed directory does
 * not load a module planted in the new working directory. $SHARDLOAD_MODULE_PATH comes first
 * (README, Modules). Each copy of the test module writes its real path into the trace. */
static void test_library_dir_resolved_once(void **state) {
  const char *lib = getenv("SHARDLOAD_TEST_LIBRARY");
  if (!lib || !*lib) fail_msg("SHARDLOAD_TEST_LIBRARY is not set (CTest sets it)");
  char *libdir = sl_test_dir("reldir-lib"), *cwd = sl_test_dir("reldir-cwd"), *early = sl_test_dir("reldir-path");
  char *tdir = sl_test_dir("reldir-trace"), *trace = sl_test_path(tdir, "trace");
  char plant_so[4200], to[4200], mine[3][PATH_MAX];
  snprintf(plant_so, sizeof plant_so, "%s/libshardload-plant.so", moddir);
  snprintf(to, sizeof to, "%s/libshardload.so", libdir);
  copy_file(lib, to);
  const char *dirs[3] = {libdir, cwd, early};
  for (int i = 0; i < 3; i++) { /* copies, not links: each has a real path of its own */
    snprintf(to, sizeof to, "%s/libshardload-plant.so", dirs[i]);
    copy_file(plant_so, to);
    assert_non_null(realpath(to, mine[i]));
  }
  unsetenv("SHARDLOAD_MODULE_PATH");
  setenv("SL_TEST_TRACE", trace, 1);
  reldir_job j = {libdir, cwd};
  int code = -1;
  assert_int_equal(sl_test_spawn(1, reldir_rank, &j, 60000, &code), 0);
  assert_int_equal(code, 0);
  char *got = slurp(trace);
  assert_non_null(got);
  fprintf(stderr, "opened:\n%s", got);
  assert_non_null(strstr(got, mine[0]));  /* next to the library */
  assert_null(strstr(got, mine[1]));      /* never the working directory's */
  free(got);
  unlink(trace);
  setenv("SHARDLOAD_MODULE_PATH", early, 1);
  assert_int_equal(sl_test_spawn(1, reldir_rank, &j, 60000, &code), 0);
  assert_int_equal(code, 0);
  got = slurp(trace);
  assert_non_null(got);
  assert_non_null(strstr(got, mine[2]));
  assert_null(strstr(got, mine[0]));
  free(got);
  unsetenv("SL_TEST_TRACE");
  free(trace);
  free(tdir);
  free(early);
  free(cwd);
  free(libdir);
}

/* A context of WORLD ranks (real processes, real Gloo), and what every rank must see. */
typedef struct ctx_job {
  int world;
  const char *backend, *collective;
  sl_status expect;
  const char *name;    /* with SL_OK: the data collective */
  const char *want[2]; /* substrings of every rank's message */
  char *rdzv;
} ctx_job;

static int ctx_rank(int rank, int world, void *arg) {
  child_signals();
  const ctx_job *j = arg;
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = j->backend, .collective = j->collective, .world_size = world,
                           .rank = rank, .local_rank = rank, .rendezvous = j->rdzv, .timeout_ms = 20000,
                           .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  sl_status s = sl_context_create(&co, &ctx);
  fprintf(stderr, "rank %d/%d (%s, %s): %s: %s\n", rank, world, j->backend, j->collective ? j->collective : "auto",
          sl_status_name(s), ctx ? sl_context_collective_reason(ctx) : err);
  SL_CHILD_CHECK(s == j->expect, "rank %d: %s, expected %s (%s)", rank, sl_status_name(s), sl_status_name(j->expect),
                 err);
  for (int k = 0; k < 2 && j->want[k]; k++)
    SL_CHILD_CHECK(strstr(err, j->want[k]) != NULL, "rank %d: message '%s' lacks '%s'", rank, err, j->want[k]);
  if (s != SL_OK) return 0;
  const char *name = sl_context_collective_name(ctx);
  SL_CHILD_CHECK(!j->name || strcmp(name, j->name) == 0, "rank %d: collective %s, expected %s", rank, name, j->name);
  sl_context_destroy(ctx);
  return 0;
}

static void run_job(ctx_job *j, const char *sub) {
  j->rdzv = j->world > 1 ? sl_test_rendezvous(sub) : NULL;
  int codes[4];
  assert_int_equal(sl_test_spawn(j->world, ctx_rank, j, 60000, codes), 0); /* none hung */
  for (int r = 0; r < j->world; r++) assert_int_equal(codes[r], 0);
  free(j->rdzv);
  j->rdzv = NULL;
}

/* A collective module that leaves a trace when opened is planted under every loadable name the
 * core knows, and an installed backend that leaves one beside them: a job on an explicit cpu or
 * sim backend opens none of them (world 1 and world 2); asking for the collective opens it;
 * backend auto opens the installed backend (probing installed backends is what auto means) and
 * none of the collectives, whatever their files are called (their entry symbols say what they
 * are: tests/test_modules_installed.c). */
static void test_probes_only_what_the_choice_needs(void **state) {
  char *dir = sl_test_dir("planted"), *trace = sl_test_path(dir, "trace");
  const char *names[] = {"nccl", "rccl", "cuda", "hip", "level_zero"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) plant(dir, names[i], "tracenccl");
  plant(dir, "tracebe", "tracebe");
  setenv("SHARDLOAD_MODULE_PATH", dir, 1);
  setenv("SL_TEST_TRACE", trace, 1);
  ctx_job quiet[] = {
      {.world = 1, .backend = "cpu", .expect = SL_OK, .name = "local"},
      {.world = 2, .backend = "cpu", .expect = SL_OK, .name = "shm"},
      {.world = 2, .backend = "cpu", .collective = "gloo", .expect = SL_OK, .name = "gloo"},
      {.world = 1, .backend = "sim", .expect = SL_OK, .name = "local"},
      {.world = 1, .backend = "sim", .collective = "simccl", .expect = SL_OK, .name = "simccl"},
      {.world = 2, .backend = "sim", .expect = SL_OK, .name = "simccl"},
  };
  for (size_t i = 0; i < sizeof quiet / sizeof quiet[0]; i++) {
    run_job(&quiet[i], "quiet");
    char *got = slurp(trace);
    if (got) fprintf(stderr, "job %zu (%s, world %d) opened:\n%s", i, quiet[i].backend, quiet[i].world, got);
    assert_null(got);
  }
  ctx_job asked = {.world = 1, .backend = "cpu", .collective = "nccl", .expect = SL_OK, .name = "nccl"};
  run_job(&asked, "asked");
  char *got = slurp(trace);
  assert_non_null(got);
  assert_non_null(strstr(got, "libshardload-tracenccl.so"));
  assert_null(strstr(got, "libshardload-tracebe.so"));
  free(got);
  unlink(trace);
  ctx_job any = {.world = 1, .backend = "auto", .expect = SL_OK, .name = "local"};
  run_job(&any, "auto"); /* auto means: probe the installed backends */
  got = slurp(trace);
  assert_non_null(got);
  assert_non_null(strstr(got, "libshardload-tracebe.so"));
  assert_null(strstr(got, "libshardload-tracenccl.so")); /* no collective, under any name */
  free(got);
  unsetenv("SL_TEST_TRACE");
  free(trace);
  free(dir);
}

/* ---- a small checkpoint ------------------------------------------------------------------ */

static const sl_test_tensor route_tensors[] = {
    {"a.weight", "F32", 2, {6, 4}, NULL},
    {"b.bias", "BF16", 1, {3}, NULL},
    {"c.proj", "F16", 2, {5, 3}, NULL},
    {"scale", "F32", 0, {0}, NULL},
};
#define ROUTE_TENSORS (sizeof route_tensors / sizeof route_tensors[0])

/* ---- routes: what both tables declare ----------------------------------------------------- */

/* Loads PATH twice on CTX (accelerator shards in the file's dtypes; CPU shards as F32) and
 * checks every byte against the file's pattern, cast as torch would. */
static int load_and_check(sl_context *ctx, const char *path) {
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, path, &src) == SL_OK, "%s", sl_context_errmsg(ctx));
  for (int pass = 0; pass < 2; pass++) {
    sl_plan *plan = NULL;
    SL_CHILD_CHECK(sl_plan_create(ctx, &plan) == SL_OK, "%s", sl_context_errmsg(ctx));
    if (pass) SL_CHILD_CHECK(sl_plan_set_param_dtype(plan, SL_DTYPE_F32) == SL_OK, "%s", sl_context_errmsg(ctx));
    sl_load_options lo = {.size = sizeof lo, .cpu_offload = pass ? SL_CPU_OFFLOAD_ON : SL_CPU_OFFLOAD_OFF};
    sl_state *st = NULL;
    sl_status s = sl_load(ctx, plan, src, &lo, &st);
    SL_CHILD_CHECK(s == SL_OK, "load %d: %s: %s", pass, sl_status_name(s), sl_context_errmsg(ctx));
    for (size_t i = 0; i < ROUTE_TENSORS; i++) {
      const sl_test_tensor *t = &route_tensors[i];
      const sl_tensor *got = sl_state_find(st, t->name);
      SL_CHILD_CHECK(got != NULL, "%s missing", t->name);
      sl_dtype fdt = sl_dtype_from_name(t->dtype), pdt = pass ? SL_DTYPE_F32 : fdt;
      uint64_t n = 1;
      for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
      unsigned char file[256], want[256], back[256];
      for (uint64_t b = 0; b < n * sl_dtype_size(fdt); b++) file[b] = sl_test_pattern_byte(t->name, b);
      SL_CHILD_CHECK(sl_convert(want, pdt, file, fdt, n) == SL_OK, "convert");
      SL_CHILD_CHECK(got->nbytes == n * sl_dtype_size(pdt), "%s: %llu bytes", t->name, (unsigned long long)got->nbytes);
      SL_CHILD_CHECK(sl_copy_to_host(ctx, back, got->data, got->device, got->nbytes) == SL_OK, "copy");
      SL_CHILD_CHECK(memcmp(back, want, got->nbytes) == 0, "load %d: %s: wrong bytes", pass, t->name);
    }
    sl_state_destroy(st);
    sl_plan_destroy(plan);
  }
  sl_source_destroy(src);
  return 0;
}

static int devcpu_rank(int rank, int world, void *arg) {
  child_signals();
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .collective = "v1devcpu", .world_size = 1,
                           .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  sl_status s = sl_context_create(&co, &ctx);
  SL_CHILD_CHECK(s == SL_OK, "%s: %s", sl_status_name(s), err);
  SL_CHILD_CHECK(strcmp(sl_context_collective_name(ctx), "v1devcpu") == 0, "collective %s",
                 sl_context_collective_name(ctx));
  int rc = load_and_check(ctx, arg);
  sl_context_destroy(ctx);
  return rc;
}

/* An ABI v1 collective that moves the cpu backend's device memory (legal in v1) takes the
 * device route, whose device staging on cpu is host memory from the backend's alloc_device.
 * In a child: the defect this pins was a crash. */
static void test_device_route_on_a_host_backend(void **state) {
  use_modules();
  char *dir = sl_test_dir("devcpu"), *path = sl_test_path(dir, "m.safetensors");
  assert_int_equal(sl_test_write_st(path, route_tensors, ROUTE_TENSORS, NULL), 0);
  int code = -1;
  assert_int_equal(sl_test_spawn(1, devcpu_rank, path, 60000, &code), 0);
  assert_int_equal(code, 0);
  free(path);
  free(dir);
}

/* A collective that moves only another backend's device memory, though its probe says yes
 * to any: no route serves it with cpu, and every rank refuses it up front naming both. */
static void test_no_route_refused_everywhere(void **state) {
  use_modules();
  for (int world = 1; world <= 2; world++) {
    ctx_job j = {.world = world, .backend = "cpu", .collective = "devcuda", .expect = SL_ERR_NO_DEVICE,
                 .want = {"devcuda: moves cuda device memory only, and this rank's backend is cpu",
                          "no route serves the pair"}};
    run_job(&j, "noroute");
  }
  char why[512] = "";
  const sl_collective_ops *local = sl__collective_local();
  assert_int_equal(sl__data_route(local, sl__backend_sim(), why, sizeof why), SL__ROUTE_HOST);
  assert_int_equal(sl__data_route(sl__collective_simccl(), sl__backend_sim(), why, sizeof why), SL__ROUTE_DEVICE);
  assert_int_equal(sl__data_route(sl__collective_simccl(), sl__backend_cpu(), why, sizeof why), SL__ROUTE_NONE);
  assert_non_null(strstr(why, "simccl: moves sim device memory only, and this rank's backend is cpu"));
}

/* A collective moves the device memory of a native API, and pairs with any backend of that API
 * (module.h, native_api and device_backend), never by the backend's name: a sim table under
 * another name pairs with simccl, one called sim that declares another API does not, and a
 * table built before native_api (or one whose device memory is host memory) pairs by its name. */
static void test_pairing_by_native_api(void **state) {
  const sl_collective_ops *simccl = sl__collective_simccl();
  static sl_backend_ops twin, other, older;
  char why[512] = "";
  twin = *sl__backend_sim();
  twin.name = "twin";
  assert_string_equal(sl_backend_native_api(&twin), "sim");
  assert_int_equal(sl__data_route(simccl, &twin, why, sizeof why), SL__ROUTE_DEVICE);
  assert_true(sl__collective_probe_domains("simccl", &twin, why, sizeof why, &(uint32_t){0}) > 0);
  other = *sl__backend_sim();
  other.native_api = "level_zero";
  assert_int_equal(sl__data_route(simccl, &other, why, sizeof why), SL__ROUTE_NONE);
  assert_non_null(strstr(why, "simccl: moves sim device memory only, and this rank's backend is sim (native API "
                              "level_zero): no route serves the pair"));
  assert_int_equal(sl__collective_probe_domains("simccl", &other, why, sizeof why, &(uint32_t){0}), 0);
  /* too short to hold native_api: the name stands for it */
  older = twin;
  older.size = (uint32_t)offsetof(sl_backend_ops, native_api);
  assert_string_equal(sl_backend_native_api(&older), "twin");
  assert_int_equal(sl__data_route(simccl, &older, why, sizeof why), SL__ROUTE_NONE);
  older.name = "sim";
  assert_int_equal(sl__data_route(simccl, &older, why, sizeof why), SL__ROUTE_DEVICE);
  /* host memory: no native API, its name */
  assert_null(sl__backend_cpu()->native_api);
  assert_string_equal(sl_backend_native_api(sl__backend_cpu()), "cpu");
  /* an adapted ABI v1 table too: v1 had no native API */
  use_modules();
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  opened o;
  assert_int_equal(open_backend(c, "v1host", &o), SL_OK);
  assert_non_null(o.shim);
  assert_string_equal(sl_backend_native_api(o.ops), "v1host");
  close_backend(&o);
  free(c);
}

/* Backend auto's data plane is the collective the backend's table prefers, found as a module
 * file like any other, though no shardload build lists its name: an out-of-tree collective
 * (tests/modules/ctlcoll.c) preferred by an out-of-tree backend moves a two-rank load. */
static int preferred_rank(int rank, int world, void *arg) {
  child_signals();
  const char *path = ((char **)arg)[0], *rdzv = ((char **)arg)[1];
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = "prefout", .world_size = world, .rank = rank,
                           .local_rank = rank, .rendezvous = rdzv, .timeout_ms = 20000, .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  sl_status s = sl_context_create(&co, &ctx);
  SL_CHILD_CHECK(s == SL_OK, "rank %d: %s: %s", rank, sl_status_name(s), err);
  const char *why = sl_context_collective_reason(ctx);
  SL_CHILD_CHECK(strcmp(sl_context_collective_name(ctx), "ctlcoll") == 0, "rank %d: collective %s (%s)", rank,
                 sl_context_collective_name(ctx), why);
  SL_CHILD_CHECK(strstr(why, "ctlcoll: preferred by backend prefout and every rank runs it"), "rank %d: %s", rank, why);
  sl_source *src = NULL;
  sl_plan *plan = NULL;
  sl_state *st = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, path, &src) == SL_OK, "%s", sl_context_errmsg(ctx));
  SL_CHILD_CHECK(sl_plan_create(ctx, &plan) == SL_OK, "%s", sl_context_errmsg(ctx));
  SL_CHILD_CHECK(sl_plan_set_default_placement(plan, "replicate") == SL_OK, "%s", sl_context_errmsg(ctx));
  s = sl_load(ctx, plan, src, NULL, &st);
  SL_CHILD_CHECK(s == SL_OK, "rank %d: load: %s: %s", rank, sl_status_name(s), sl_context_errmsg(ctx));
  for (size_t i = 0; i < ROUTE_TENSORS; i++) {
    const sl_tensor *t = sl_state_find(st, route_tensors[i].name);
    SL_CHILD_CHECK(t != NULL, "%s missing", route_tensors[i].name);
    unsigned char back[256];
    SL_CHILD_CHECK(t->nbytes <= sizeof back, "size");
    SL_CHILD_CHECK(sl_copy_to_host(ctx, back, t->data, t->device, t->nbytes) == SL_OK, "copy");
    for (uint64_t b = 0; b < t->nbytes; b++)
      SL_CHILD_CHECK(back[b] == sl_test_pattern_byte(t->name, b), "rank %d: %s byte %llu", rank, t->name,
                     (unsigned long long)b);
  }
  sl_state_destroy(st);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_auto_takes_an_unlisted_preferred_collective(void **state) {
  use_modules();
  char *dir = sl_test_dir("prefout"), *path = sl_test_path(dir, "m.safetensors");
  assert_int_equal(sl_test_write_st(path, route_tensors, ROUTE_TENSORS, NULL), 0);
  const char *names[8];
  size_t n = sl__collective_names(names, 8);
  for (size_t i = 0; i < n; i++) assert_string_not_equal(names[i], "ctlcoll"); /* no build lists it */
  char *arg[2] = {path, sl_test_rendezvous("prefout_rdzv")};
  int codes[2] = {-1, -1};
  assert_int_equal(sl_test_spawn(2, preferred_rank, arg, 60000, codes), 0);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  free(arg[1]);
  free(path);
  free(dir);
}

/* What names a rank's device in the data-plane agreement (core/src/planes.c): the backend's
 * device_identity; the ordinal for a table too short to hold the op (a module built before it)
 * or a backend that cannot tell; nothing for a backend whose device memory is host memory. */
static char *identity_of(sl_context *c, const sl_backend_ops *ops, void *be, int ordinal) {
  static char id[SL__PLANE_DEVICE_ID];
  c->be = ops;
  c->be_ctx = be;
  c->device_ordinal = ordinal;
  memset(id, 'x', sizeof id);
  sl__plane_device_id(c, id, sizeof id);
  return id;
}

static void test_device_identity(void **state) {
  use_modules();
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  opened o;
  assert_int_equal(open_backend(c, "sim", &o), SL_OK);
  assert_string_equal(identity_of(c, o.ops, o.be, 0), "sim:0");
  sl_backend_ops older = *o.ops;
  older.size = (uint32_t)offsetof(sl_backend_ops, device_identity);
  assert_string_equal(identity_of(c, &older, o.be, 4), "ordinal 4");
  close_backend(&o);
  assert_int_equal(open_backend(c, "hostmem", &o), SL_OK);
  assert_string_equal(identity_of(c, o.ops, o.be, 0), "");
  close_backend(&o);
  assert_int_equal(open_backend(c, "cpu", &o), SL_OK);
  assert_string_equal(identity_of(c, o.ops, o.be, 0), "");
  close_backend(&o);
  free(c);
}

/* ---- what a module's table says of itself -------------------------------------------------- */

static void test_table_names_checked(void **state) {
  use_modules();
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  opened o;
  /* a backend calling itself sim would pass for the built-in one wherever it is named */
  assert_int_equal(open_backend(c, "impostor", &o), SL_ERR_ABI);
  assert_non_null(strstr(c->errmsg, "libshardload-impostor.so: its table calls itself 'sim', not 'impostor'"));
  /* a name with a newline would forge a line wherever it is printed */
  assert_int_equal(open_backend(c, "forgedname", &o), SL_ERR_ABI);
  assert_non_null(strstr(c->errmsg, "its table calls itself 'forgedname\\nshardload: forged line', not 'forgedname'"));
  assert_null(strchr(c->errmsg, '\n'));
  /* a native API collectives pair by must be a name, and a DLPack device type one */
  assert_int_equal(open_backend(c, "badapi", &o), SL_ERR_ABI);
  assert_non_null(strstr(c->errmsg, "libshardload-badapi.so: its table's native_api 'cu da' is not a module name"));
  assert_int_equal(open_backend(c, "baddlpack", &o), SL_ERR_ABI);
  assert_non_null(strstr(c->errmsg, "its table's dlpack_device_type -3 is not a DLPack device type"));
  /* a collective's file and table disagreeing */
  char *dir = sl_test_dir("renamed");
  plant(dir, "renamed", "plant");
  setenv("SHARDLOAD_MODULE_PATH", dir, 1);
  const sl_collective_ops *ops;
  void *dl, *shim;
  assert_int_equal(sl__collective_select(c, "renamed", &ops, &dl, &shim), SL_ERR_ABI);
  assert_non_null(strstr(c->errmsg, "its table calls itself 'plant', not 'renamed'"));
  free(dir);
  free(c);
  /* and a context refuses it before anything pairs with it */
  use_modules();
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = "impostor", .world_size = 1, .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  assert_int_equal(sl_context_create(&co, &ctx), SL_ERR_ABI);
  assert_non_null(strstr(err, "backend 'impostor':"));
}

/* Whether S is printable ASCII only. */
static bool printable(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) return false;
  return true;
}

/* Text a module gives (describe(), a probe's reason) is kept escaped, so neither the report's
 * header nor a JSON field can carry a forged line or a terminal control. */
static void test_module_text_escaped(void **state) {
  use_modules();
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = "forgedtext", .world_size = 1, .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  assert_int_equal(sl_context_create(&co, &ctx), SL_OK);
  const char *desc = sl_context_device_description(ctx);
  fprintf(stderr, "device: %s\n", desc);
  assert_true(printable(desc));
  assert_non_null(strstr(desc, "ABI v2 entry)\\nshardload: forged line\\x1b[2J\\xff"));
  sl_context_destroy(ctx);
  /* the reasons auto gives for the candidates it passed over */
  char *dir = sl_test_dir("forgedauto");
  plant(dir, "cuda", "fakecuda");
  setenv("SHARDLOAD_MODULE_PATH", dir, 1);
  co.backend = "auto";
  assert_int_equal(sl_context_create(&co, &ctx), SL_OK);
  const char *why = sl_context_backend_reason(ctx);
  fprintf(stderr, "backend: %s\n", why);
  assert_true(printable(why));
  assert_non_null(strstr(why, "cuda: no widget on this machine (test module)\\nshardload: forged line"));
  sl_context_destroy(ctx);
  free(dir);
  /* the command's header: one line each, whatever the module wrote */
  char *ck = sl_test_dir("forgedcli"), *path = sl_test_path(ck, "m.safetensors");
  assert_int_equal(sl_test_write_st(path, route_tensors, ROUTE_TENSORS, NULL), 0);
  char *out = NULL;
  int rc = sl_test_run(&out, "SHARDLOAD_MODULE_PATH='%s' '%s' load '%s' --backend forgedtext 2>&1", moddir,
                       sl_test_bin(), path);
  fprintf(stderr, "%s", out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "device forgedtext (out-of-tree host-memory backend, ABI v2 entry)\\nshardload: forged"));
  assert_null(strstr(out, "\nshardload: forged"));
  assert_null(strchr(out, '\x1b'));
  free(out);
  free(path);
  free(ck);
}

/* ---- init failures, invalid names ------------------------------------------------------------ */

/* A module's init that fails without a message: the message names the module and the status. */
static void test_silent_init_names_the_module(void **state) {
  use_modules();
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = "silentbe", .world_size = 1, .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  assert_int_equal(sl_context_create(&co, &ctx), SL_ERR_BACKEND);
  assert_string_equal(err, "backend silentbe: init failed (SL_ERR_BACKEND) and gave no reason");
  co.backend = "cpu";
  co.collective = "silentcoll";
  err[0] = 0;
  assert_int_equal(sl_context_create(&co, &ctx), SL_ERR_COMM);
  assert_string_equal(err, "collective silentcoll: init failed (SL_ERR_COMM) and gave no reason");
}

/* The module file is suggested only for a name that could be one; the nearest name always. */
static void test_no_module_file_for_invalid_names(void **state) {
  use_modules();
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(&lb);
  opened o;
  assert_int_equal(open_backend(c, "../x", &o), SL_ERR_INVALID);
  assert_non_null(strstr(c->errmsg, "unknown backend '../x': not a module name"));
  assert_null(strstr(c->errmsg, "libshardload-"));
  assert_int_equal(open_backend(c, "Cuda", &o), SL_ERR_INVALID);
  assert_non_null(strstr(c->errmsg, "unknown backend 'Cuda' (did you mean 'cuda'?): not a module name"));
  assert_null(strstr(c->errmsg, "libshardload-"));
  assert_int_equal(open_backend(c, "cpx", &o), SL_ERR_INVALID); /* a valid name: it could be a module */
  assert_non_null(strstr(c->errmsg, "libshardload-NAME.so"));
  const sl_collective_ops *ops;
  void *dl, *shim;
  assert_int_equal(sl__collective_select(c, "Gloo", &ops, &dl, &shim), SL_ERR_INVALID);
  assert_non_null(strstr(c->errmsg, "did you mean 'gloo'?"));
  assert_null(strstr(c->errmsg, "libshardload-"));
  free(c);
  /* the data-plane agreement says the same */
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .collective = "Gloo", .world_size = 1,
                           .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  assert_int_equal(sl_context_create(&co, &ctx), SL_ERR_INVALID);
  assert_non_null(strstr(err, "collective 'Gloo' is unknown (did you mean 'gloo'?)"));
  assert_null(strstr(err, "libshardload-"));
  co.collective = "nosuch";
  assert_int_equal(sl_context_create(&co, &ctx), SL_ERR_INVALID);
  assert_non_null(strstr(err, "or a module libshardload-nosuch.so on SHARDLOAD_MODULE_PATH"));
}

int main(void) {
  moddir = getenv("SHARDLOAD_TEST_MODULES");
  if (!moddir || !*moddir) {
    fprintf(stderr, "test_modules: set SHARDLOAD_TEST_MODULES to the test modules' directory (CTest does)\n");
    return 2;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_v2_entry_is_preferred),
      cmocka_unit_test(test_v1_backend_adapted),
      cmocka_unit_test(test_v1_host_reaches_core),
      cmocka_unit_test(test_two_v1_modules_at_once),
      cmocka_unit_test(test_production_extensions_by_name),
      cmocka_unit_test(test_v1_collective_adapted),
      cmocka_unit_test(test_collective_names_and_probe),
      cmocka_unit_test(test_unknown_collective),
      cmocka_unit_test(test_probe_reasons_reach_the_message),
      cmocka_unit_test(test_wrong_abi_names_the_file),
      cmocka_unit_test(test_unknown_and_absent_backends),
      cmocka_unit_test(test_auto_probes_and_logs_reasons),
      cmocka_unit_test(test_stats_write_within_size),
      cmocka_unit_test(test_geometry_writes_within_size),
      cmocka_unit_test(test_world1_load_on_v1_modules),
      cmocka_unit_test(test_library_dir_resolved_once),
      cmocka_unit_test(test_probes_only_what_the_choice_needs),
      cmocka_unit_test(test_device_route_on_a_host_backend),
      cmocka_unit_test(test_no_route_refused_everywhere),
      cmocka_unit_test(test_pairing_by_native_api),
      cmocka_unit_test(test_auto_takes_an_unlisted_preferred_collective),
      cmocka_unit_test(test_device_identity),
      cmocka_unit_test(test_table_names_checked),
      cmocka_unit_test(test_module_text_escaped),
      cmocka_unit_test(test_silent_init_names_the_module),
      cmocka_unit_test(test_no_module_file_for_invalid_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
