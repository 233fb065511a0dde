/* libshardload-level_zero.so on a machine without an Intel GPU (CI: Debian's Level Zero loader
 * libze1 installed, no driver): loading it opens no Level Zero library, its table is what the
 * core pairs and exports by, its probe says in Level Zero's words why it cannot run (through
 * the real loader: "no driver (ZE_RESULT_ERROR_UNINITIALIZED ...)"), init fails with that
 * reason, and so does every rank of a job that asks for it. The loader table (ze_rt.c, linked
 * in) explains a loader that is missing or is not a Level Zero loader. argv[1]: the module.
 *
 * Where a Level Zero GPU driver is present (a real one, or the test driver through
 * ZE_ENABLE_ALT_DRIVERS) the no-driver tests are skipped. With --device (argv[2]) it runs what
 * is the module's own on a device instead (exit 77, skipped, where the probe says no and
 * ZE_ENABLE_ALT_DRIVERS names no driver; with one named, a failure): its
 * description, records recycled through many waits across two streams, allocations past the
 * device's maximum, host-pointer import or its refusal, native streams, its casts (every pair,
 * aligned and not, against sl_convert; ordered with the stream's copies) and SGD step (against
 * the core's host step), which kernels ran (the test driver counts launches by name: none the
 * device cannot run, under ZEDRV_NO_FP64 / ZEDRV_NO_F32_DENORMS), and loads through the command
 * bit-exact against cpu. What every backend owes the ABI is the conformance suite's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h" /* sl__host_sgd_step: the core's SGD step, the reference */
#include "shardload/module.h"
#include "testutil.h"
#include "ze_kernels.h"
#include "ze_rt.h"

static const char *module_path;
static void *module;
static const sl_backend_ops *ops;
static char probe_reason[640];
static int probe_score = -1;

static char last_msg[2048];
static sl_status t_fail(void *core, sl_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof last_msg, fmt, ap);
  va_end(ap);
  return s;
}
static void t_log(void *core, sl_log_level level, const char *fmt, ...) {}
static const sl_module_host host = {sizeof(sl_module_host), NULL, t_log, t_fail};

static sl_status try_init(int local_rank, int device, void **be) {
  sl_backend_init in = {.size = sizeof in, .host = &host, .local_rank = local_rank, .local_world_size = 1,
                        .device = device, .ops = ops, .timeout_ms = 5000};
  last_msg[0] = 0;
  return ops->init(&in, be);
}

static int loader_loaded(void) {
  void *h = dlopen(SL_ZE_LIB, RTLD_NOW | RTLD_NOLOAD);
  if (h) dlclose(h);
  return h != NULL;
}

static int loader_installed(void) {
  sl_ze_rt rt;
  char why[512];
  return sl__ze_open_lib(SL_ZE_LIB, &rt, why, sizeof why);
}

/* Loading the module and reading its table open no Level Zero library. First. */
static void test_loading_opens_no_level_zero_library(void **state) {
  assert_false(loader_loaded());
  assert_string_equal(ops->name, "level_zero");
  assert_false(loader_loaded());
}

static void test_table(void **state) {
  assert_int_equal(ops->abi_version, SL_BACKEND_ABI_VERSION);
  assert_int_equal(ops->size, sizeof(sl_backend_ops));
  assert_string_equal(ops->name, "level_zero");
  /* host staging over Gloo: oneCCL is not packaged */
  assert_string_equal(ops->preferred_collective, "gloo");
  assert_true(ops->flags & SL_BACKEND_HAS_PINNED);
  assert_false(ops->flags & SL_BACKEND_DEVICE_IS_HOST);
  assert_true(SL_HAS_OP(ops, probe) && SL_HAS_OP(ops, init) && SL_HAS_OP(ops, fini) && SL_HAS_OP(ops, describe));
  assert_true(SL_HAS_OP(ops, alloc_device) && SL_HAS_OP(ops, free_device) && SL_HAS_OP(ops, alloc_pinned) &&
              SL_HAS_OP(ops, free_pinned));
  assert_true(SL_HAS_OP(ops, stream_create) && SL_HAS_OP(ops, stream_destroy) && SL_HAS_OP(ops, event_create) &&
              SL_HAS_OP(ops, event_destroy) && SL_HAS_OP(ops, event_record) && SL_HAS_OP(ops, stream_wait_event) &&
              SL_HAS_OP(ops, event_query) && SL_HAS_OP(ops, event_sync) && SL_HAS_OP(ops, stream_sync) &&
              SL_HAS_OP(ops, synchronize) && SL_HAS_OP(ops, copy_async));
  assert_true(SL_HAS_OP(ops, register_host) && SL_HAS_OP(ops, unregister_host) && SL_HAS_OP(ops, is_device_ptr) &&
              SL_HAS_OP(ops, device_identity) && SL_HAS_OP(ops, get_proc));
  /* the SPIR-V casts and SGD step */
  assert_true(SL_HAS_OP(ops, cast_async));
  assert_non_null(ops->get_proc(SL_EXT_SGD_STEP));
  assert_true(SL_HAS_OP(ops, copy_2d_async));
  /* native handles: streams are ze_command_list_handle_t; DLPack's kDLOneAPI */
  assert_true(SL_HAS_OP(ops, event_record_native) && SL_HAS_OP(ops, free_device_after));
  assert_true(SL_HAS_OP(ops, launch_host_fn));
  assert_true(SL_HAS_OP(ops, native_api));
  assert_string_equal(sl_backend_native_api(ops), "level_zero");
  assert_non_null(ops->get_proc(SL_EXT_NATIVE_STREAM));
  assert_non_null(ops->get_proc(SL_EXT_TRAFFIC));
  assert_null(ops->get_proc("sl_ext_no_such_thing"));
  assert_null(ops->get_proc(NULL));
  assert_int_equal(ops->dlpack_device_type, 14); /* kDLOneAPI */
  /* the module's internals stay inside: the loader table and its helpers */
  assert_null(dlsym(module, "sl__ze"));
  assert_null(dlsym(module, "sl__ze_probe"));
  assert_null(dlsym(module, "zeInit"));
  assert_null(dlsym(module, SL_BACKEND_ENTRY_V1));
}

/* The probe opens the loader and says, in Level Zero's words, why it cannot run here. */
static void test_probe(void **state) {
  char reason[640] = "";
  int score = ops->probe(reason, sizeof reason);
  printf("# probe: %d \"%s\"\n", score, reason);
  assert_int_equal(strncmp(reason, "level_zero: ", 12), 0);
  if (!loader_installed()) {
    assert_int_equal(score, 0);
    assert_non_null(strstr(reason, "level_zero: " SL_ZE_LIB " not found (" SL_ZE_LIB ": cannot open shared object"));
  } else if (score == 0) {
    assert_true(loader_loaded()); /* the probe opened it */
    assert_true(strstr(reason, "level_zero: no driver (ZE_RESULT_ERROR_UNINITIALIZED from zeInit") ||
                strstr(reason, "level_zero: no GPU device ("));
  } else {
    assert_true(score > 1); /* beats cpu for "auto" */
    assert_non_null(strstr(reason, "GPU device"));
  }
  assert_int_equal(ops->probe(NULL, 0), score);
  char tiny[8];
  assert_int_equal(ops->probe(tiny, sizeof tiny), score);
  assert_int_equal(strlen(tiny), sizeof tiny - 1);
}

/* Through the real loader with no driver, in a fresh process (zeInit runs once per process):
 * whatever ZE_ENABLE_ALT_DRIVERS names that is not a driver, "no driver". */
static void test_probe_no_driver_in_a_fresh_process(void **state) {
  if (!loader_installed() || probe_score > 0) skip();
  const char *alt[] = {NULL, "/nonexistent/libze_sl_nothing.so", "libm.so.6"};
  for (int i = 0; i < 3; i++) {
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      close(fd[0]);
      if (alt[i])
        setenv("ZE_ENABLE_ALT_DRIVERS", alt[i], 1);
      else
        unsetenv("ZE_ENABLE_ALT_DRIVERS");
      char r[640] = "";
      int sc = ops->probe(r, sizeof r);
      dprintf(fd[1], "%d %s", sc, r);
      _exit(0);
    }
    close(fd[1]);
    char got[700] = "";
    ssize_t n = read(fd[0], got, sizeof got - 1);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    assert_true(n > 0);
    printf("# ZE_ENABLE_ALT_DRIVERS=%s: %s\n", alt[i] ? alt[i] : "(unset)", got);
    assert_non_null(strstr(got, "0 level_zero: no driver (ZE_RESULT_ERROR_UNINITIALIZED from zeInit"));
  }
}

/* What the probe says where the loader is missing, or is not a Level Zero loader. */
static void test_loader_missing_or_wrong(void **state) {
  sl_ze_rt rt;
  char why[640];
  assert_int_equal(sl__ze_open_lib("libze_loader.so.404", &rt, why, sizeof why), 0);
  printf("# %s\n", why);
  assert_non_null(strstr(why, "libze_loader.so.404 not found (libze_loader.so.404: cannot open shared object file"));
  assert_non_null(strstr(why, "install the Level Zero loader"));
  assert_int_equal(sl__ze_open_lib("libm.so.6", &rt, why, sizeof why), 0);
  printf("# %s\n", why);
  assert_non_null(strstr(why, "libm.so.6 lacks zeInit: this module needs a Level Zero loader"));
}

static void test_result_names(void **state) {
  char b[32];
  assert_string_equal(sl__ze_result_name(ZE_RESULT_ERROR_UNINITIALIZED, b, sizeof b), "ZE_RESULT_ERROR_UNINITIALIZED");
  assert_string_equal(sl__ze_result_name(ZE_RESULT_ERROR_DEVICE_LOST, b, sizeof b), "ZE_RESULT_ERROR_DEVICE_LOST");
  assert_string_equal(sl__ze_result_name((ze_result_t)0x7ffffff0, b, sizeof b), "ze_result_t 0x7ffffff0");
}

/* Without a driver init fails before creating anything, with the probe's reason, on any rank. */
static void test_init_without_driver(void **state) {
  if (probe_score > 0) skip();
  for (int rank = 0; rank < 3; rank++) {
    void *be = (void *)&be;
    assert_int_equal(try_init(rank, rank == 2 ? 0 : -1, &be), SL_ERR_NO_DEVICE);
    printf("# init (local rank %d): %s\n", rank, last_msg);
    assert_null(be);
    assert_string_equal(last_msg, probe_reason);
  }
}

/* ---- through the core and the command ------------------------------------------------------ */

static char *checkpoint(void) {
  static char *ck;
  if (ck) return ck;
  char *d = sl_test_dir("ck");
  assert_non_null(d);
  ck = sl_test_path(d, "model");
  free(d);
  char *out = NULL;
  int rc = sl_test_run(&out, "'%s' synth '%s' --size 1MiB --shards 2", sl_test_bin(), ck);
  if (rc != 0) fail_msg("synth: %s", out);
  free(out);
  return ck;
}

/* --backend level_zero without a driver: SL_ERR_NO_DEVICE with the probe's own reason (the
 * registry found and loaded the module: "not available" would mean it never opened it). */
static void test_context_fails_with_the_probe_reason(void **state) {
  if (probe_score > 0) skip();
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = "level_zero", .world_size = 1, .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  assert_int_equal(sl_context_create(&co, &ctx), SL_ERR_NO_DEVICE);
  assert_null(ctx);
  printf("# context: %s\n", err);
  assert_non_null(strstr(err, probe_reason));
  assert_non_null(strstr(err, "--backend cpu"));
}

/* Two ranks started on their own, sharing a rendezvous: both exit 1 with the reason within
 * seconds (neither waits for the other), and so does --nproc 2. */
static void test_cli_every_rank_fails(void **state) {
  if (probe_score > 0) skip();
  char *out = NULL;
  int rc = sl_test_run(&out, "env -u SHARDLOAD_MODULE_PATH '%s' load '%s' --backend level_zero --nproc 2 --timeout 20",
                       sl_test_bin(), checkpoint());
  printf("# --nproc 2: %s", out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, probe_reason));
  free(out);

  char *d = sl_test_dir("ranks");
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  rc = sl_test_run(&out,
                   "cd '%s' && for r in 0 1 2; do (timeout 60 env -u SHARDLOAD_MODULE_PATH '%s' load '%s' --backend "
                   "level_zero --rank $r --world-size 3 --rendezvous file://'%s'/rdzv --timeout 20 >out$r 2>&1; "
                   "echo $? >rc$r) & done; wait; for r in 0 1 2; do echo \"rank $r exit $(cat rc$r): $(cat out$r)\"; done",
                   d, sl_test_bin(), checkpoint(), d);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("# explicit ranks (%.1f s):\n%s", took, out);
  assert_int_equal(rc, 0);
  assert_true(took < 15.0);
  for (int r = 0; r < 3; r++) {
    char want[64];
    snprintf(want, sizeof want, "rank %d exit 1: ", r);
    char *line = strstr(out, want);
    assert_non_null(line);
    char *end = strchr(line, '\n');
    if (end) *end = 0;
    assert_non_null(strstr(line, probe_reason));
    if (end) *end = '\n';
  }
  free(out);
  free(d);
}


/* ---- on a device (--device) ------------------------------------------------------------------ */

static void *g_be;

static int dev_setup(void **state) {
  g_be = NULL;
  sl_status s = try_init(0, -1, &g_be);
  if (s != SL_OK) fprintf(stderr, "init: %s\n", last_msg);
  return s == SL_OK ? 0 : -1;
}

static int dev_teardown(void **state) {
  ops->fini(g_be);
  g_be = NULL;
  return 0;
}

#define OK(call)                                                 \
  do {                                                           \
    sl_status st_ = (call);                                      \
    if (st_ != SL_OK) fail_msg("%s: %s: %s", #call, sl_status_name(st_), last_msg); \
  } while (0)

static void test_dev_describe(void **state) {
  char d[512] = "", id[64] = "";
  ops->describe(g_be, d, sizeof d);
  printf("# %s\n", d);
  assert_int_equal(strncmp(d, "level_zero:0 ", 13), 0);
  assert_non_null(strstr(d, " EUs, PCI "));
  /* which kernels run on the device follows what the device reports (ze_cast.h) */
  if (getenv("ZEDRV_NO_FP64"))
    assert_non_null(strstr(d, "; casts on the device (F64 on the host: no fp64)"));
  else if (getenv("ZEDRV_NO_F32_DENORMS"))
    assert_non_null(strstr(d, "; casts on the device (F64 and SGD on the host: F32 subnormals not kept)"));
  else
    assert_non_null(strstr(d, "; casts and SGD on the device"));
  assert_int_equal(ops->device_ordinal(g_be), 0);
  ops->device_identity(g_be, id, sizeof id);
  printf("# identity %s\n", id);
  assert_true(strlen(id) > 0);
}

static void test_dev_bad_device(void **state) {
  void *be = (void *)&be;
  assert_int_equal(try_init(0, 64, &be), SL_ERR_NO_DEVICE);
  printf("# %s\n", last_msg);
  assert_null(be);
  assert_non_null(strstr(last_msg, "level_zero: device 64 does not exist: this machine has "));
  /* SL_EXT_DEVICE_COUNT (what `shardload backends` lists) counts the devices init names: the
   * last of them starts, the next does not */
  sl_ext_device_count_fn count = (sl_ext_device_count_fn)ops->get_proc(SL_EXT_DEVICE_COUNT);
  assert_non_null(count);
  int n = count();
  char want[96];
  snprintf(want, sizeof want, "this machine has %d Level Zero GPU device%s (0..%d)", n, n == 1 ? "" : "s", n - 1);
  printf("# device count %d\n", n);
  assert_true(n >= 1);
  assert_non_null(strstr(last_msg, want));
  assert_int_equal(try_init(0, n, &be), SL_ERR_NO_DEVICE);
  assert_int_equal(try_init(0, n - 1, &be), SL_OK);
  ops->fini(be);
}

/* Many more records than a pool holds, each a wait another stream depends on: a record reset
 * or reused while a queued wait still names it lets a copy run early, and the chunk it copies
 * holds the wrong iteration's bytes. */
static void test_dev_records_recycle_through_waits(void **state) {
  enum { ITERS = 400, CHUNK = 256, RING = 6 };
  void *s1 = NULL, *s2 = NULL, *a = NULL, *b = NULL, *ev_up = NULL, *ev_cp = NULL, *slot_ev[RING];
  unsigned char *host[RING], *out = malloc((size_t)ITERS * CHUNK);
  assert_non_null(out);
  OK(ops->stream_create(g_be, &s1));
  OK(ops->stream_create(g_be, &s2));
  OK(ops->alloc_device(g_be, CHUNK, &a));
  OK(ops->alloc_device(g_be, (size_t)ITERS * CHUNK, &b));
  OK(ops->event_create(g_be, &ev_up));
  OK(ops->event_create(g_be, &ev_cp));
  for (int k = 0; k < RING; k++) {
    OK(ops->alloc_pinned(g_be, CHUNK, (void **)&host[k]));
    OK(ops->event_create(g_be, &slot_ev[k]));
  }
  for (int i = 0; i < ITERS; i++) {
    int k = i % RING;
    OK(ops->event_sync(g_be, slot_ev[k])); /* the slot's last upload has read it */
    memset(host[k], (unsigned char)(i * 7 + 1), CHUNK);
    OK(ops->stream_wait_event(g_be, s1, ev_cp)); /* A is free again: the last copy out of it ran */
    OK(ops->copy_async(g_be, a, host[k], CHUNK, SL_COPY_H2D, s1));
    OK(ops->event_record(g_be, slot_ev[k], s1));
    OK(ops->event_record(g_be, ev_up, s1));
    OK(ops->stream_wait_event(g_be, s2, ev_up));
    OK(ops->copy_async(g_be, (char *)b + (size_t)i * CHUNK, a, CHUNK, SL_COPY_D2D, s2));
    OK(ops->event_record(g_be, ev_cp, s2));
  }
  OK(ops->copy_async(g_be, out, b, (size_t)ITERS * CHUNK, SL_COPY_D2H, s2));
  OK(ops->stream_sync(g_be, s2));
  OK(ops->synchronize(g_be));
  for (int i = 0; i < ITERS; i++)
    for (int j = 0; j < CHUNK; j++)
      if (out[(size_t)i * CHUNK + j] != (unsigned char)(i * 7 + 1))
        fail_msg("chunk %d byte %d: %u, want %u (a wait let a copy run early)", i, j, out[(size_t)i * CHUNK + j],
                 (unsigned char)(i * 7 + 1));
  for (int k = 0; k < RING; k++) {
    ops->event_destroy(g_be, slot_ev[k]);
    ops->free_pinned(g_be, host[k]);
  }
  ops->event_destroy(g_be, ev_up);
  ops->event_destroy(g_be, ev_cp);
  ops->stream_destroy(g_be, s1);
  ops->stream_destroy(g_be, s2);
  ops->free_device(g_be, a);
  ops->free_device(g_be, b);
  free(out);
}

static int no_relaxed_limits(void) {
  const char *e = getenv("ZEDRV_NO_RELAXED_ALLOC");
  return e && strcmp(e, "1") == 0;
}

/* Past the device's maximum allocation (ZEDRV_MAX_ALLOC for the test driver): the relaxed-limit
 * descriptor where the driver lists the extension (SL_EXT_MAX_ALLOC then says no limit), never a
 * failed load the memory could hold; where it does not (ZEDRV_NO_RELAXED_ALLOC=1), a refusal
 * naming the limit, which SL_EXT_MAX_ALLOC reports so that the core sizes its staging under it. */
static void test_dev_alloc_past_the_maximum(void **state) {
  const char *m = getenv("ZEDRV_MAX_ALLOC");
  if (!m) skip();
  uint64_t limit = strtoull(m, NULL, 10);
  size_t n = (size_t)limit * 3 + 5;
  void *d = NULL, *p = NULL;
  sl_ext_max_alloc_fn max_alloc = (sl_ext_max_alloc_fn)ops->get_proc(SL_EXT_MAX_ALLOC);
  assert_non_null(max_alloc);
  if (no_relaxed_limits()) {
    assert_int_equal(max_alloc(g_be), limit);
    char want[160];
    snprintf(want, sizeof want, "of %zu bytes exceeds the device's maximum allocation of %llu bytes (maxMemAllocSize)",
             n, (unsigned long long)limit);
    assert_int_equal(ops->alloc_device(g_be, n, &d), SL_ERR_NOMEM);
    printf("# %s\n", last_msg);
    assert_non_null(strstr(last_msg, want));
    assert_non_null(strstr(last_msg, "ZE_experimental_relaxed_allocation_limits"));
    assert_null(d);
    assert_int_equal(ops->alloc_pinned(g_be, n, &p), SL_ERR_NOMEM);
    assert_non_null(strstr(last_msg, want));
    n = (size_t)limit; /* at the limit: fine */
  } else {
    assert_int_equal(max_alloc(g_be), 0);
  }
  OK(ops->alloc_device(g_be, n, &d));
  OK(ops->alloc_pinned(g_be, n, &p));
  assert_true(ops->is_device_ptr(g_be, d, n));
  assert_false(ops->is_device_ptr(g_be, p, n));
  memset(p, 0x5a, n);
  void *s = NULL;
  OK(ops->stream_create(g_be, &s));
  OK(ops->copy_async(g_be, d, p, n, SL_COPY_H2D, s));
  OK(ops->stream_sync(g_be, s));
  memset(p, 0, n);
  OK(ops->copy_async(g_be, p, d, n, SL_COPY_D2H, s));
  OK(ops->stream_sync(g_be, s));
  assert_int_equal(((unsigned char *)p)[n - 1], 0x5a);
  ops->stream_destroy(g_be, s);
  ops->free_device(g_be, d);
  ops->free_pinned(g_be, p);
}

/* The caller's host memory: imported where the driver offers it, else refused and left pageable. */
static void test_dev_register_host(void **state) {
  size_t n = 65536 + 3;
  unsigned char *h = malloc(n + 8), *r = h + 1;
  assert_non_null(h);
  sl_status st = ops->register_host(g_be, r, n);
  printf("# register_host: %s %s\n", sl_status_name(st), last_msg);
  if (getenv("ZEDRV_NO_IMPORT")) {
    assert_int_equal(st, SL_ERR_UNSUPPORTED);
    assert_non_null(strstr(last_msg, "level_zero:0: the driver offers no host-pointer import"));
  } else {
    assert_int_equal(st, SL_OK);
    ops->unregister_host(g_be, r);
  }
  free(h);
}

/* Region copies: strided both ways, contiguous as one copy, and rows wider than a pitch refused. */
static void test_dev_copy_2d(void **state) {
  enum { W = 100, H = 37, SP = 128, DP = 160 };
  unsigned char *h = malloc(SP * H), *back = malloc(DP * H);
  void *d = NULL, *s = NULL;
  assert_non_null(h);
  assert_non_null(back);
  for (size_t i = 0; i < SP * H; i++) h[i] = (unsigned char)(i * 13 + 5);
  memset(back, 0xee, DP * H);
  OK(ops->alloc_device(g_be, DP * H, &d));
  OK(ops->stream_create(g_be, &s));
  OK(ops->copy_async(g_be, d, back, DP * H, SL_COPY_H2D, s)); /* the gaps: 0xee */
  OK(ops->copy_2d_async(g_be, d, DP, h, SP, W, H, SL_COPY_H2D, s));
  OK(ops->copy_2d_async(g_be, back, DP, d, DP, DP, H, SL_COPY_D2H, s)); /* contiguous */
  OK(ops->stream_sync(g_be, s));
  for (size_t r = 0; r < H; r++)
    for (size_t x = 0; x < DP; x++)
      assert_int_equal(back[r * DP + x], x < W ? h[r * SP + x] : 0xee);
  assert_int_equal(ops->copy_2d_async(g_be, d, 64, h, SP, W, H, SL_COPY_H2D, s), SL_ERR_INVALID);
  printf("# %s\n", last_msg);
  assert_non_null(strstr(last_msg, "rows of 100 bytes do not fit pitches 64 (destination) and 128 (source)"));
  OK(ops->stream_sync(g_be, s)); /* a refused call is not sticky */
  ops->stream_destroy(g_be, s);
  ops->free_device(g_be, d);
  free(h);
  free(back);
}

static void test_dev_native_streams(void **state) {
  sl_ext_native_stream_fn ns = (sl_ext_native_stream_fn)ops->get_proc(SL_EXT_NATIVE_STREAM);
  void *s1 = NULL, *s2 = NULL;
  OK(ops->stream_create(g_be, &s1));
  OK(ops->stream_create(g_be, &s2));
  void *n0 = ns(g_be, NULL), *n1 = ns(g_be, s1), *n2 = ns(g_be, s2);
  assert_non_null(n0);
  assert_non_null(n1);
  assert_non_null(n2);
  assert_true(n0 != n1 && n1 != n2 && n0 != n2);
  assert_ptr_equal(ns(g_be, s1), n1); /* lives as long as the stream */
  ops->stream_destroy(g_be, s1);
  ops->stream_destroy(g_be, s2);
}

/* ---- casts and the SGD step on the device ------------------------------------------------------ */

static const sl_dtype k_dts[] = {SL_DTYPE_F64, SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};

/* Bits of every kind in SRC's dtype: NaNs with payloads and signs, infinities, zeros, subnormals
 * (of each dtype, as seen from the widest), values that round to each side, and random bits. */
static void fill_bits(unsigned char *p, sl_dtype dt, size_t n, unsigned seed) {
  static const uint64_t f64s[] = {0x7ff8000000000001ull, 0xfff4000000000abcull, 0x7ff0000000000000ull,
                                  0xfff0000000000000ull, 0x0000000000000001ull, 0x8000000000000000ull,
                                  0x36a0000000000000ull, 0x3810000000000000ull, 0x380fffffffffffffull,
                                  0x47efffffe0000000ull, 0x40effff000000000ull, 0x3e70000000000000ull};
  static const uint32_t f32s[] = {0x7fc00001u, 0xff812345u, 0x7f800000u, 0xff800000u, 0x00000001u, 0x807fffffu,
                                  0x00400000u, 0x33800000u, 0x387fc000u, 0x3f808000u, 0x3f818000u, 0x477ff000u};
  static const uint16_t h16s[] = {0x7c01u, 0xfe00u, 0x7c00u, 0xfc00u, 0x0001u, 0x83ffu, 0x7fc1u, 0xff81u,
                                  0x0040u, 0x8001u, 0x3c01u, 0x7bffu};
  uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
  size_t es = sl_dtype_size(dt);
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    uint64_t v = x;
    if (i % 3 == 0) { /* the special values, often */
      size_t k = (i / 3) % 12;
      v = dt == SL_DTYPE_F64 ? f64s[k] : dt == SL_DTYPE_F32 ? f32s[k] : h16s[k];
    }
    memcpy(p + i * es, &v, es); /* little-endian: the low bytes */
  }
}

typedef ze_result_t(ZE_APICALL *launch_count_fn)(ze_driver_handle_t, const char *, uint64_t *);

/* The test driver's count of launches of kernel NAME (0 where the driver does not count). */
static uint64_t launches_of(const char *name) {
  static launch_count_fn fn;
  static ze_driver_handle_t drv;
  if (!fn) {
    uint32_t n = 1;
    if (!sl__ze_ready() || sl__ze.DriverGet(&n, &drv) != ZE_RESULT_SUCCESS || n < 1 ||
        sl__ze.DriverGetExtensionFunctionAddress(drv, "zedrvGetLaunchCount", (void **)&fn) != ZE_RESULT_SUCCESS)
      fail_msg("the test driver offers no zedrvGetLaunchCount (built without the project's kernels?)");
  }
  uint64_t c = 0;
  if (fn(drv, name, &c) != ZE_RESULT_SUCCESS) fail_msg("zedrvGetLaunchCount(%s) failed", name);
  return c;
}

/* Whether the device runs the kernels of MODULE (casts or SGD), from the driver's switches. */
static int device_runs(int module, int sgd) {
  if (module == SL_ZE_MODULE_F64 && getenv("ZEDRV_NO_FP64")) return 0;
  return !(SL_ZE_NEEDS_F32_DENORMALS(module, sgd) && getenv("ZEDRV_NO_F32_DENORMS"));
}

/* One cast of N elements at byte offsets DOFF/SOFF through the device, against sl_convert. What
 * the device cannot run is refused with SL_ERR_UNSUPPORTED, queuing nothing. */
static void cast_once(void *s, sl_dtype from, sl_dtype to, size_t n, size_t soff, size_t doff, unsigned seed) {
  size_t es = sl_dtype_size(from), ed = sl_dtype_size(to);
  size_t sb = n * es + soff, db = n * ed + doff;
  unsigned char *h = malloc(sb + 1), *want = malloc(db + 1), *got = malloc(db + 1);
  void *d_src = NULL, *d_dst = NULL;
  assert_true(h && want && got);
  fill_bits(h + soff, from, n, seed);
  memset(want, 0x5c, db);
  OK(sl_convert(want + doff, to, h + soff, from, n));
  OK(ops->alloc_device(g_be, sb + 1, &d_src));
  OK(ops->alloc_device(g_be, db + 1, &d_dst));
  OK(ops->copy_async(g_be, d_dst, want, doff, SL_COPY_H2D, s)); /* the bytes before DOFF: untouched */
  OK(ops->copy_async(g_be, d_src, h, sb, SL_COPY_H2D, s));
  int module = 0;
  sl__ze_cast_kernel(from, to, 1, &module);
  sl_status st = ops->cast_async(g_be, (char *)d_dst + doff, to, (char *)d_src + soff, from, n, s);
  if (!device_runs(module, 0)) {
    assert_int_equal(st, SL_ERR_UNSUPPORTED);
    if (n) assert_non_null(strstr(last_msg, "does not run on this device")); /* 0 elements: a question */
  } else {
    if (st != SL_OK) fail_msg("cast %s -> %s of %zu: %s", sl_dtype_name(from), sl_dtype_name(to), n, last_msg);
    memset(got, 0xee, db);
    OK(ops->copy_async(g_be, got, d_dst, db, SL_COPY_D2H, s));
    OK(ops->stream_sync(g_be, s));
    for (size_t i = 0; i < db; i++)
      if (got[i] != want[i])
        fail_msg("cast %s -> %s of %zu elements (source +%zu, destination +%zu): byte %zu is 0x%02x, sl_convert "
                 "wrote 0x%02x", sl_dtype_name(from), sl_dtype_name(to), n, soff, doff, i, got[i], want[i]);
  }
  OK(ops->stream_sync(g_be, s));
  ops->free_device(g_be, d_src);
  ops->free_device(g_be, d_dst);
  free(h);
  free(want);
  free(got);
}

/* Every pair, aligned and not, sizes 0, 1, odd and past one grid (the group count's cap times
 * the largest group), bit-exact against sl_convert; the kernels that ran are the ones the
 * device can run, aligned or byte kernels by the pointers. */
static void test_dev_casts(void **state) {
  const size_t sizes[] = {0, 1, 7, 1001, (size_t)1024 * 1024 + 77};
  void *s = NULL;
  OK(ops->stream_create(g_be, &s));
  for (size_t a = 0; a < 4; a++)
    for (size_t b = 0; b < 4; b++) {
      sl_dtype from = k_dts[a], to = k_dts[b];
      if (from == to) continue;
      int module = 0;
      const char *aligned = sl__ze_cast_kernel(from, to, 1, &module), *bytes = sl__ze_cast_kernel(from, to, 0, &module);
      uint64_t la = launches_of(aligned), lb = launches_of(bytes);
      for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        if (n > 2000 && (a + b) % 2) continue; /* the large size on half the pairs: time */
        if (n > 2000 && no_relaxed_limits()) continue; /* 8 MiB buffers: past that variant's 512 KiB limit */
        cast_once(s, from, to, n, 0, 0, (unsigned)(a * 16 + b * 4 + k));
        cast_once(s, from, to, n, 1, 0, (unsigned)(a * 16 + b * 4 + k + 100)); /* misaligned source */
        cast_once(s, from, to, n, 0, 3, (unsigned)(a * 16 + b * 4 + k + 200)); /* misaligned destination */
      }
      uint64_t ra = launches_of(aligned) - la, rb = launches_of(bytes) - lb;
      printf("# %s -> %s: %" PRIu64 " aligned, %" PRIu64 " byte launches\n", sl_dtype_name(from), sl_dtype_name(to), ra,
             rb);
      if (device_runs(module, 0)) {
        assert_true(ra >= 3 && rb >= 6); /* sizes 1, 7, 1001: once aligned, twice not (0 launches nothing) */
      } else {
        assert_int_equal(ra, 0);
        assert_int_equal(rb, 0);
      }
    }
  /* a refused pair is not sticky, nor is a bad dtype */
  assert_int_equal(ops->cast_async(g_be, NULL, SL_DTYPE_I32, NULL, SL_DTYPE_F32, 4, s), SL_ERR_DTYPE);
  OK(ops->stream_sync(g_be, s));
  ops->stream_destroy(g_be, s);
}

/* The cast waits for the copy before it on its stream (two lists, one chain of events), and a
 * copy after it waits for it: with the driver's delays, a missing wait reads stale bytes. Many
 * rounds through one buffer pair, each with new contents. */
static void test_dev_cast_ordered_with_copies(void **state) {
  enum { N = 4099, ROUNDS = 60 };
  void *s = NULL, *d_src = NULL, *d_dst = NULL;
  float *h = malloc(N * 4);
  uint16_t *got = malloc(N * 2), *want = malloc(N * 2);
  assert_true(h && got && want);
  OK(ops->stream_create(g_be, &s));
  OK(ops->alloc_device(g_be, N * 4, &d_src));
  OK(ops->alloc_device(g_be, N * 2, &d_dst));
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < N; i++) h[i] = (float)(r * N + i) * 0.731f;
    OK(sl_convert(want, SL_DTYPE_BF16, h, SL_DTYPE_F32, N));
    OK(ops->copy_async(g_be, d_src, h, N * 4, SL_COPY_H2D, s));
    OK(ops->cast_async(g_be, d_dst, SL_DTYPE_BF16, d_src, SL_DTYPE_F32, N, s));
    OK(ops->copy_async(g_be, got, d_dst, N * 2, SL_COPY_D2H, s));
    OK(ops->stream_sync(g_be, s));
    if (memcmp(got, want, N * 2) != 0) fail_msg("round %d: the cast or the copy after it did not wait", r);
  }
  ops->stream_destroy(g_be, s);
  ops->free_device(g_be, d_src);
  ops->free_device(g_be, d_dst);
  free(h);
  free(got);
  free(want);
}

/* SL_EXT_SGD_STEP on every dtype against the core's host step, bit for bit (on the device where
 * it can run there, else the module's host fallback). */
static void test_dev_sgd(void **state) {
  sl_ext_sgd_step_fn sgd = (sl_ext_sgd_step_fn)ops->get_proc(SL_EXT_SGD_STEP);
  assert_non_null(sgd);
  const size_t n = 3001;
  for (size_t a = 0; a < 4; a++) {
    sl_dtype dt = k_dts[a];
    size_t es = sl_dtype_size(dt), bytes = n * es;
    unsigned char *x = malloc(bytes), *g = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes);
    void *dx = NULL, *dg = NULL;
    assert_true(x && g && want && got);
    fill_bits(x, dt, n, 7 + (unsigned)a);
    fill_bits(g, dt, n, 70 + (unsigned)a);
    memcpy(want, x, bytes);
    OK(sl__host_sgd_step(want, g, dt, n, 0.01f));
    OK(ops->alloc_device(g_be, bytes, &dx));
    OK(ops->alloc_device(g_be, bytes, &dg));
    OK(ops->copy_async(g_be, dx, x, bytes, SL_COPY_H2D, NULL));
    OK(ops->copy_async(g_be, dg, g, bytes, SL_COPY_H2D, NULL));
    int module = 0;
    const char *name = sl__ze_sgd_kernel(dt, &module);
    uint64_t before = launches_of(name);
    OK(sgd(g_be, dx, dg, dt, n, 0.01f)); /* after the copies: it synchronises first */
    OK(ops->copy_async(g_be, got, dx, bytes, SL_COPY_D2H, NULL));
    OK(ops->stream_sync(g_be, NULL));
    assert_int_equal(launches_of(name) - before, device_runs(module, 1) ? 1 : 0);
    for (size_t i = 0; i < bytes; i++)
      if (got[i] != want[i]) fail_msg("sgd %s: byte %zu is 0x%02x, the host step wrote 0x%02x", sl_dtype_name(dt), i, got[i], want[i]);
    OK(sgd(g_be, dx, dg, dt, 0, 0.01f)); /* nothing to do */
    ops->free_device(g_be, dx);
    ops->free_device(g_be, dg);
    free(x);
    free(g);
    free(want);
    free(got);
  }
}

static double mono_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int warned;
static void count_warn(void *core, sl_log_level level, const char *fmt, ...) { warned += level == SL_LOG_WARN; }

/* Work slower than the job's timeout (the test driver's zedrvSetDelayUs): a sync gives up after
 * the timeout with SL_ERR_TIMEOUT, not sticky (a later sync, once the work ran, succeeds). */
static void test_dev_syncs_bounded_by_the_timeout(void **state) {
  uint32_t n = 1;
  ze_driver_handle_t drv = NULL;
  ze_result_t (*delay)(ze_driver_handle_t, uint32_t, uint32_t) = NULL;
  assert_true(sl__ze_ready());
  if (sl__ze.DriverGet(&n, &drv) != ZE_RESULT_SUCCESS ||
      sl__ze.DriverGetExtensionFunctionAddress(drv, "zedrvSetDelayUs", (void **)&delay) != ZE_RESULT_SUCCESS || !delay)
    skip();
  static const sl_module_host warn_host = {sizeof(sl_module_host), NULL, count_warn, t_fail};
  sl_backend_init in = {.size = sizeof in, .host = &warn_host, .local_rank = 0, .local_world_size = 1, .device = -1,
                        .ops = ops, .timeout_ms = 300};
  void *be = NULL, *s = NULL, *d = NULL;
  static unsigned char h[4096];
  OK(ops->init(&in, &be));
  OK(ops->stream_create(be, &s));
  OK(ops->alloc_device(be, sizeof h, &d));
  assert_int_equal(delay(drv, 1500000, 1500000), ZE_RESULT_SUCCESS); /* 1.5 s a command */
  OK(ops->copy_async(be, d, h, sizeof h, SL_COPY_H2D, s));
  double t0 = mono_s();
  sl_status st = ops->stream_sync(be, s);
  double took = mono_s() - t0;
  printf("# sync behind 1.5 s of work, timeout 300 ms: %s after %.2f s: %s\n", sl_status_name(st), took, last_msg);
  assert_int_equal(st, SL_ERR_TIMEOUT);
  assert_true(took >= 0.25 && took < 1.2);
  assert_non_null(strstr(last_msg, "level_zero:0: stream_sync: the device's work did not complete within the job's "
                                   "timeout (300 ms)"));
  assert_int_equal(delay(drv, 0, 0), ZE_RESULT_SUCCESS);
  while (ops->stream_sync(be, s) == SL_ERR_TIMEOUT) /* the copy ends; the timeout was not sticky */
    assert_true(mono_s() - t0 < 10);
  OK(ops->synchronize(be));
  ops->stream_destroy(be, s);
  ops->free_device(be, d);
  ops->fini(be);
}

/* SL_EXT_STREAM_ABANDON on a stream whose work completes: synchronize does not wait for it, and
 * fini, finding it idle, destroys it (ZEDRV_MISUSE=abort: a list left in the context would be
 * misuse at the context's destruction). */
static void test_dev_abandon_idle_stream(void **state) {
  sl_ext_stream_abandon_fn abandon = (sl_ext_stream_abandon_fn)ops->get_proc(SL_EXT_STREAM_ABANDON);
  assert_non_null(abandon);
  void *s = NULL, *d = NULL;
  static unsigned char h[4096], back[4096];
  memset(h, 0x3c, sizeof h);
  OK(ops->stream_create(g_be, &s));
  OK(ops->alloc_device(g_be, sizeof h, &d));
  OK(ops->copy_async(g_be, d, h, sizeof h, SL_COPY_H2D, s));
  OK(ops->copy_async(g_be, back, d, sizeof h, SL_COPY_D2H, s));
  abandon(g_be, s);
  abandon(g_be, NULL); /* nothing */
  OK(ops->synchronize(g_be));
  /* the abandoned stream's work still runs to its end */
  double t0 = mono_s();
  while (back[sizeof back - 1] != 0x3c) {
    assert_true(mono_s() - t0 < 10);
    usleep(1000);
  }
  usleep(20000);
  ops->free_device(g_be, d);
}

/* fini behind 3 s of work: bounded by the timeout, leaving the work (and the context) behind
 * with a warning. A process of its own (--fini-behind): what is left behind is alive at exit,
 * which the test driver reports (ZEDRV_MISUSE must not abort there); nothing else may be. */
/* A backend (warnings counted, a job timeout of TIMEOUT_MS) whose stream *S has 3 s of work the
 * test driver's engine has already taken (zedrvSetDelayUs), and the driver in *DRV; 0 where the
 * driver lacks that switch (a real device). */
static int busy_backend(int timeout_ms, ze_driver_handle_t *drv, void **be, void **s) {
  uint32_t n = 1;
  ze_result_t (*delay)(ze_driver_handle_t, uint32_t, uint32_t) = NULL;
  assert_true(sl__ze_ready());
  if (sl__ze.DriverGet(&n, drv) != ZE_RESULT_SUCCESS ||
      sl__ze.DriverGetExtensionFunctionAddress(*drv, "zedrvSetDelayUs", (void **)&delay) != ZE_RESULT_SUCCESS || !delay)
    return 0;
  static const sl_module_host warn_host = {sizeof(sl_module_host), NULL, count_warn, t_fail};
  sl_backend_init in = {.size = sizeof in, .host = &warn_host, .local_rank = 0, .local_world_size = 1, .device = -1,
                        .ops = ops, .timeout_ms = timeout_ms};
  void *d = NULL;
  static unsigned char h[4096];
  OK(ops->init(&in, be));
  OK(ops->stream_create(*be, s));
  OK(ops->alloc_device(*be, sizeof h, &d)); /* goes with what fini leaves behind, or with the context */
  assert_int_equal(delay(*drv, 3000000, 3000000), ZE_RESULT_SUCCESS);
  OK(ops->copy_async(*be, d, h, sizeof h, SL_COPY_H2D, *s));
  usleep(50000); /* the engine took it with its 3 s */
  assert_int_equal(delay(*drv, 0, 0), ZE_RESULT_SUCCESS);
  return 1;
}

static void test_dev_fini_behind_slow_work(void **state) {
  ze_driver_handle_t drv = NULL;
  ze_result_t (*misuse)(ze_driver_handle_t, uint64_t *) = NULL;
  void *be = NULL, *s = NULL;
  if (!busy_backend(300, &drv, &be, &s) ||
      sl__ze.DriverGetExtensionFunctionAddress(drv, "zedrvGetMisuseCount", (void **)&misuse) != ZE_RESULT_SUCCESS ||
      !misuse)
    skip();
  warned = 0;
  double t0 = mono_s();
  ops->fini(be); /* stream s and its buffer go with what is left behind */
  double took = mono_s() - t0;
  uint64_t bad = 1;
  assert_int_equal(misuse(drv, &bad), ZE_RESULT_SUCCESS);
  printf("# fini behind 3 s of work: %.2f s, %d warning(s), %llu misuse(s)\n", took, warned, (unsigned long long)bad);
  assert_true(took < 1.5);
  assert_int_equal(warned, 1);
  assert_int_equal(bad, 0); /* leaving behind destroyed nothing under the work */
}

/* A consumer of the module's events (DLPack): a command list of its own whose work waits for a
 * gate that only the host opens, so that a record the module puts behind it (event_record_native)
 * is pending until the test says. (The test driver lets a list of another context signal the
 * module's event; a real driver would want the module's context.) */
typedef struct {
  ze_context_handle_t ctx;
  ze_command_list_handle_t list;
  ze_event_pool_handle_t pool;
  ze_event_handle_t gate, done;
} consumer;

static void consumer_open(consumer *c, ze_driver_handle_t drv) {
  uint32_t n = 1;
  ze_device_handle_t dev = NULL;
  assert_int_equal(sl__ze.DeviceGet(drv, &n, &dev), ZE_RESULT_SUCCESS);
  ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
  assert_int_equal(sl__ze.ContextCreate(drv, &cd, &c->ctx), ZE_RESULT_SUCCESS);
  ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, .mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS};
  assert_int_equal(sl__ze.CommandListCreateImmediate(c->ctx, dev, &qd, &c->list), ZE_RESULT_SUCCESS);
  ze_event_pool_desc_t pd = {.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, .flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE, .count = 2};
  assert_int_equal(sl__ze.EventPoolCreate(c->ctx, &pd, 1, &dev, &c->pool), ZE_RESULT_SUCCESS);
  ze_event_desc_t ed = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC, .index = 0};
  assert_int_equal(sl__ze.EventCreate(c->pool, &ed, &c->gate), ZE_RESULT_SUCCESS);
  ed.index = 1;
  assert_int_equal(sl__ze.EventCreate(c->pool, &ed, &c->done), ZE_RESULT_SUCCESS);
  /* the consumer's work: a wait for the gate (a barrier: what follows waits for it) */
  assert_int_equal(sl__ze.CommandListAppendBarrier(c->list, NULL, 1, &c->gate), ZE_RESULT_SUCCESS);
}

static void consumer_close(consumer *c) {
  assert_int_equal(sl__ze.CommandListAppendBarrier(c->list, c->done, 0, NULL), ZE_RESULT_SUCCESS);
  assert_int_equal(sl__ze.EventHostSynchronize(c->done, 10000000000ull), ZE_RESULT_SUCCESS);
  assert_int_equal(sl__ze.CommandListDestroy(c->list), ZE_RESULT_SUCCESS);
  assert_int_equal(sl__ze.EventDestroy(c->gate), ZE_RESULT_SUCCESS);
  assert_int_equal(sl__ze.EventDestroy(c->done), ZE_RESULT_SUCCESS);
  assert_int_equal(sl__ze.EventPoolDestroy(c->pool), ZE_RESULT_SUCCESS);
  assert_int_equal(sl__ze.ContextDestroy(c->ctx), ZE_RESULT_SUCCESS);
}

static void *open_gate_later(void *arg) {
  usleep(200000);
  sl__ze.EventHostSignal(((consumer *)arg)->gate);
  return NULL;
}

static uint64_t misuses(ze_driver_handle_t drv) {
  ze_result_t (*misuse)(ze_driver_handle_t, uint64_t *) = NULL;
  uint64_t n = 0;
  assert_int_equal(sl__ze.DriverGetExtensionFunctionAddress(drv, "zedrvGetMisuseCount", (void **)&misuse),
                   ZE_RESULT_SUCCESS);
  assert_int_equal(misuse(drv, &n), ZE_RESULT_SUCCESS);
  return n;
}

/* A record the module put on a consumer's list, its sl event destroyed already (the core's
 * DLPack path), behind the consumer's gate; fini with a timeout of TIMEOUT_MS, the gate opened
 * 200 ms in (GATE_LATER) or only after fini. fini waits for the record (bounded by the job's
 * timeout) before it destroys its event pools, or gives up in time and leaves them and its
 * context behind with one warning: never anything destroyed under the consumer's work (the
 * driver counts that as misuse). */
static void fini_behind_consumer_record(int timeout_ms, int gate_later, double min_s, double max_s, int want_warned) {
  uint32_t n = 1;
  ze_driver_handle_t drv = NULL;
  assert_true(sl__ze_ready());
  assert_int_equal(sl__ze.DriverGet(&n, &drv), ZE_RESULT_SUCCESS);
  uint64_t before = misuses(drv);
  static const sl_module_host warn_host = {sizeof(sl_module_host), NULL, count_warn, t_fail};
  sl_backend_init in = {.size = sizeof in, .host = &warn_host, .local_rank = 0, .local_world_size = 1, .device = -1,
                        .ops = ops, .timeout_ms = timeout_ms};
  void *be = NULL, *ev = NULL;
  consumer c;
  consumer_open(&c, drv);
  OK(ops->init(&in, &be));
  OK(ops->event_create(be, &ev));
  OK(ops->event_record_native(be, ev, c.list));
  ops->event_destroy(be, ev);
  pthread_t t;
  if (gate_later) assert_int_equal(pthread_create(&t, NULL, open_gate_later, &c), 0);
  warned = 0;
  double t0 = mono_s();
  ops->fini(be);
  double took = mono_s() - t0;
  if (gate_later) pthread_join(t, NULL);
  uint64_t bad = misuses(drv) - before;
  printf("# fini behind a consumer's record (gate %s, timeout %d ms): %.2f s, %d warning(s), %llu misuse(s)\n",
         gate_later ? "opened at 200 ms" : "shut", timeout_ms, took, warned, (unsigned long long)bad);
  assert_true(took >= min_s && took < max_s);
  assert_int_equal(warned, want_warned);
  assert_int_equal(bad, 0);
  if (!gate_later) assert_int_equal(sl__ze.EventHostSignal(c.gate), ZE_RESULT_SUCCESS);
  consumer_close(&c);
  assert_int_equal(misuses(drv) - before, 0);
}

/* The gate opened 200 ms in, within a 2 s timeout: fini waits and destroys everything, silently. */
static void test_dev_fini_waits_for_consumer_records(void **state) { fini_behind_consumer_record(2000, 1, 0.15, 1.9, 0); }

/* The gate shut past a 300 ms timeout: fini gives up in time, pools and context left behind. */
static void test_dev_fini_leaves_pools_behind_consumer_records(void **state) {
  fini_behind_consumer_record(300, 0, 0.25, 1.5, 1);
}

/* SL_EXT_STREAM_ABANDON: a stream given up with 3 s of work is waited for by no sync (synchronize
 * returns at once) and, still busy at fini, is left behind with the module's events and
 * context (a warning), nothing destroyed under it. */
static void test_dev_abandon_busy_stream(void **state) {
  ze_driver_handle_t drv = NULL;
  void *be = NULL, *s = NULL;
  sl_ext_stream_abandon_fn abandon = (sl_ext_stream_abandon_fn)ops->get_proc(SL_EXT_STREAM_ABANDON);
  assert_non_null(abandon);
  assert_true(sl__ze_ready());
  uint32_t n = 1;
  assert_int_equal(sl__ze.DriverGet(&n, &drv), ZE_RESULT_SUCCESS);
  uint64_t before = misuses(drv);
  assert_true(busy_backend(2000, &drv, &be, &s)); /* the test driver's switch: this case is the driver's */
  abandon(be, s);
  warned = 0;
  double t0 = mono_s();
  OK(ops->synchronize(be));
  double sync_took = mono_s() - t0;
  ops->fini(be);
  double took = mono_s() - t0;
  uint64_t bad = misuses(drv) - before;
  printf("# abandoned busy stream: synchronize %.2f s, fini %.2f s, %d warning(s), %llu misuse(s)\n", sync_took, took,
         warned, (unsigned long long)bad);
  assert_true(sync_took < 0.5);
  assert_true(took < 1.0);
  assert_int_equal(warned, 1);
  assert_int_equal(bad, 0);
}

/* The device lost under queued work (the test driver's zedrvLoseDevice): the loss is sticky, every
 * later sync returns it naming the device, and fini still ends. Last: the device stays lost. */
static void test_dev_device_lost_is_sticky(void **state) {
  uint32_t n = 1;
  ze_driver_handle_t drv = NULL;
  ze_result_t (*lose)(ze_driver_handle_t) = NULL;
  assert_true(sl__ze_ready()); /* the test's own table over the same loader and driver */
  if (sl__ze.DriverGet(&n, &drv) != ZE_RESULT_SUCCESS ||
      sl__ze.DriverGetExtensionFunctionAddress(drv, "zedrvLoseDevice", (void **)&lose) != ZE_RESULT_SUCCESS || !lose)
    skip(); /* a real device: not lost on purpose */
  void *s = NULL, *d = NULL, *ev = NULL;
  unsigned char h[4096] = {1};
  OK(ops->stream_create(g_be, &s));
  OK(ops->alloc_device(g_be, sizeof h, &d));
  OK(ops->event_create(g_be, &ev));
  OK(ops->copy_async(g_be, d, h, sizeof h, SL_COPY_H2D, s));
  OK(ops->stream_sync(g_be, s));
  assert_int_equal(lose(drv), ZE_RESULT_SUCCESS);
  sl_status st = ops->copy_async(g_be, h, d, sizeof h, SL_COPY_D2H, s);
  if (st == SL_OK) st = ops->event_record(g_be, ev, s);
  if (st == SL_OK) st = ops->stream_sync(g_be, s);
  printf("# after the loss: %s: %s\n", sl_status_name(st), last_msg);
  assert_int_equal(st, SL_ERR_BACKEND);
  assert_non_null(strstr(last_msg, "level_zero:0: "));
  assert_non_null(strstr(last_msg, "ZE_RESULT_ERROR_DEVICE_LOST"));
  last_msg[0] = 0;
  assert_int_equal(ops->synchronize(g_be), SL_ERR_BACKEND); /* sticky */
  assert_non_null(strstr(last_msg, "ZE_RESULT_ERROR_DEVICE_LOST"));
  assert_int_equal(ops->event_sync(g_be, ev), SL_ERR_BACKEND);
  assert_true(ops->event_query(g_be, ev) < 0);
  void *s2 = NULL;
  if (ops->stream_create(g_be, &s2) == SL_OK) {
    assert_int_equal(ops->copy_async(g_be, d, h, sizeof h, SL_COPY_H2D, s2), SL_ERR_BACKEND);
    ops->stream_destroy(g_be, s2);
  }
  ops->event_destroy(g_be, ev);
  ops->stream_destroy(g_be, s);
  ops->free_device(g_be, d);
}

/* Loads through the command: every rank's shards bit for bit those of the same load on cpu. */
/* Without the relaxed limits (ZEDRV_NO_RELAXED_ALLOC=1, 512 KiB): a tensor past the limit fails
 * the load on every rank, naming the tensor, its size and the device's limit. */
static void test_dev_tensor_past_the_limit(void **state) {
  if (!no_relaxed_limits()) skip();
  char *d = sl_test_dir("big");
  char *out = NULL;
  int rc = sl_test_run(&out,
                       "cd '%s' && '%s' synth big.safetensors --size 8MiB >/dev/null && for r in 0 1; do (timeout 60 "
                       "'%s' load big.safetensors --backend level_zero --placement replicate --rank $r --world-size 2 "
                       "--rendezvous file://'%s'/rdzv --timeout 20 >out$r 2>&1; echo $? >rc$r) & done; wait; "
                       "for r in 0 1; do echo \"rank $r exit $(cat rc$r): $(cat out$r)\"; done",
                       d, sl_test_bin(), sl_test_bin(), d);
  printf("# %s", out);
  assert_int_equal(rc, 0);
  for (int r = 0; r < 2; r++) {
    char want[64];
    snprintf(want, sizeof want, "rank %d exit 1: ", r);
    char *line = strstr(out, want);
    assert_non_null(line);
    char *end = strchr(line, '\n');
    if (end) *end = 0;
    assert_non_null(strstr(line, "model.embed_tokens.weight: cannot allocate "));
    assert_non_null(strstr(line, "exceeds the device's maximum allocation of 524288 bytes"));
    if (end) *end = '\n';
  }
  free(out);
  free(d);
}

/* A cpu rank (no allocation limit) and a level_zero rank without the relaxed limits (512 KiB)
 * size their staging slots alike (the smallest limit of any rank), so that both schedule the
 * same transfers: the load completes on both, with the same bytes as on the cpu alone. */
static void test_dev_mixed_ranks_agree_on_the_limit(void **state) {
  if (!no_relaxed_limits()) skip();
  char *d = sl_test_dir("mixed");
  char *out = NULL;
  int rc = sl_test_run(&out,
                       "cd '%s' && mkdir one two && '%s' load '%s' --backend cpu --nproc 2 --dump one >/dev/null; "
                       "for r in 0 1; do be=cpu; [ $r = 1 ] && be=level_zero; (timeout 60 '%s' load '%s' --backend $be "
                       "--rank $r --world-size 2 --rendezvous file://'%s'/rdzv --timeout 20 --dump two >out$r 2>&1; "
                       "echo $? >rc$r) & done; wait; for r in 0 1; do echo \"rank $r exit $(cat rc$r): $(tail -n 1 out$r)\"; "
                       "done; ls one | wc -l; for f in one/*; do cmp \"$f\" two/\"${f#one/}\" || echo DIFFERS; done",
                       d, sl_test_bin(), checkpoint(), sl_test_bin(), checkpoint(), d);
  printf("# %s", out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "rank 0 exit 0: "));
  assert_non_null(strstr(out, "rank 1 exit 0: "));
  assert_non_null(strstr(out, "\n2\n")); /* both ranks' dumps compared */
  assert_null(strstr(out, "DIFFERS"));
  free(out);
  free(d);
}

static void test_dev_cli_matches_cpu(void **state) {
  /* F64 parameters: widened on the device where it has fp64, else by the core on the host */
  const char *modes[] = {"--nproc 1 --param-dtype BF16", "--nproc 2 --param-dtype F64", "--nproc 2",
                         "--nproc 2 --source every-rank --param-dtype F16",
                         "--nproc 2 --strategy broadcast --offload-policy cpu-pinned",
                         "--nproc 4 --mesh 2x2 --placement '[replicate, shard(0)]'"};
  for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
    char *d = sl_test_dir("cli");
    char *out = NULL;
    int rc = sl_test_run(&out,
                         "cd '%s' && mkdir cpu ze && '%s' load '%s' --backend cpu %s --dump cpu >/dev/null && "
                         "'%s' load '%s' --backend level_zero %s --dump ze | grep -c 'on level_zero:' && "
                         "for f in cpu/*; do cmp \"$f\" ze/\"${f#cpu/}\" || exit 9; done && ls cpu | wc -l",
                         d, sl_test_bin(), checkpoint(), modes[m], sl_test_bin(), checkpoint(), modes[m]);
    printf("# %s: rc %d: %s", modes[m], rc, out);
    assert_int_equal(rc, 0);
    free(out);
    free(d);
  }
}

/* The device tests' exit where the probe says no: 77 (skipped) on a machine without a driver;
 * a failure where ZE_ENABLE_ALT_DRIVERS names one (CTest's runs over the test driver), so that
 * a driver the module cannot start never passes as "skipped". */
static int no_device(void) {
  const char *alt = getenv("ZE_ENABLE_ALT_DRIVERS");
  if (alt && *alt) {
    printf("FAILED: ZE_ENABLE_ALT_DRIVERS=%s names a driver, but the level_zero probe says no: %s\n", alt, probe_reason);
    return 1;
  }
  printf("SKIPPED: %s\n", probe_reason);
  return 77;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/libshardload-level_zero.so\n", argv[0]);
    return 2;
  }
  module_path = argv[1];
  module = dlopen(module_path, RTLD_NOW | RTLD_LOCAL);
  sl_backend_entry_fn entry = module ? (sl_backend_entry_fn)dlsym(module, SL_BACKEND_ENTRY) : NULL;
  if (!entry || !(ops = entry())) {
    fprintf(stderr, "cannot load %s: %s\n", module_path, module ? "no entry symbol" : dlerror());
    return 1;
  }
  if (argc > 2 && strcmp(argv[2], "--fini-behind") == 0) {
    probe_score = ops->probe(probe_reason, sizeof probe_reason);
    if (probe_score <= 0) return no_device();
    const struct CMUnitTest behind[] = {cmocka_unit_test(test_dev_fini_behind_slow_work),
                                        cmocka_unit_test(test_dev_fini_waits_for_consumer_records),
                                        cmocka_unit_test(test_dev_fini_leaves_pools_behind_consumer_records),
                                        cmocka_unit_test(test_dev_abandon_busy_stream)};
    return cmocka_run_group_tests_name("level_zero_fini_behind", behind, NULL, NULL);
  }
  if (argc > 2 && strcmp(argv[2], "--device") == 0) {
    probe_score = ops->probe(probe_reason, sizeof probe_reason);
    if (probe_score <= 0) return no_device();
    const struct CMUnitTest dev[] = {
        cmocka_unit_test_setup_teardown(test_dev_describe, dev_setup, dev_teardown),
        cmocka_unit_test(test_dev_bad_device),
        cmocka_unit_test_setup_teardown(test_dev_records_recycle_through_waits, dev_setup, dev_teardown),
        cmocka_unit_test_setup_teardown(test_dev_alloc_past_the_maximum, dev_setup, dev_teardown),
        cmocka_unit_test_setup_teardown(test_dev_register_host, dev_setup, dev_teardown),
        cmocka_unit_test_setup_teardown(test_dev_copy_2d, dev_setup, dev_teardown),
        cmocka_unit_test_setup_teardown(test_dev_native_streams, dev_setup, dev_teardown),
        cmocka_unit_test_setup_teardown(test_dev_casts, dev_setup, dev_teardown),
        cmocka_unit_test_setup_teardown(test_dev_cast_ordered_with_copies, dev_setup, dev_teardown),
        cmocka_unit_test_setup_teardown(test_dev_sgd, dev_setup, dev_teardown),
        cmocka_unit_test(test_dev_cli_matches_cpu),
        cmocka_unit_test(test_dev_tensor_past_the_limit),
        cmocka_unit_test(test_dev_mixed_ranks_agree_on_the_limit),
        cmocka_unit_test(test_dev_syncs_bounded_by_the_timeout),
        cmocka_unit_test_setup_teardown(test_dev_abandon_idle_stream, dev_setup, dev_teardown),
        cmocka_unit_test_setup_teardown(test_dev_device_lost_is_sticky, dev_setup, dev_teardown), /* last */
    };
    return cmocka_run_group_tests_name("level_zero_device", dev, NULL, NULL);
  }
  const struct CMUnitTest first[] = {cmocka_unit_test(test_loading_opens_no_level_zero_library)};
  int rc = cmocka_run_group_tests_name("level_zero_load", first, NULL, NULL);
  probe_score = ops->probe(probe_reason, sizeof probe_reason);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table),
      cmocka_unit_test(test_probe),
      cmocka_unit_test(test_probe_no_driver_in_a_fresh_process),
      cmocka_unit_test(test_loader_missing_or_wrong),
      cmocka_unit_test(test_result_names),
      cmocka_unit_test(test_init_without_driver),
      cmocka_unit_test(test_context_fails_with_the_probe_reason),
      cmocka_unit_test(test_cli_every_rank_fails),
  };
  return rc | cmocka_run_group_tests_name("level_zero_module", tests, NULL, NULL);
}
