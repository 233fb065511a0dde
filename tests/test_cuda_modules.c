/* The CUDA backend and NCCL collective modules, built with -DSHARDLOAD_WITH_CUDA=ON,
 * and with --vendor hip their twins built from the same sources, the HIP backend and the RCCL
 * collective (-DSHARDLOAD_WITH_HIP=ON).
 *
 *   test_cuda_modules [--vendor hip]        what needs no device: the modules load where there
 *                              is no driver and no NCCL/RCCL, their probes say why they cannot
 *                              run, and every path that asks for them fails at once on every
 *                              rank with that reason.
 *   test_cuda_modules [--vendor hip] --gpu  what needs one GPU of the vendor (CTest label "gpu";
 *                              "amdgpu" for hip): exits 77, SKIPPED, when the backend's probe
 *                              says no, so it is never reported as passed on a machine without.
 *
 * $SHARDLOAD_CUDA_MODULES is the directory holding libshardload-cuda.so / -nccl.so (or -hip.so
 * / -rccl.so; the build root, next to libshardload.so); CTest also puts it on
 * SHARDLOAD_MODULE_PATH for this static executable. The command ($SHARDLOAD_BIN) is run without
 * SHARDLOAD_MODULE_PATH, so it has to find the modules next to its library, as an installed
 * tree does. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h" /* sl__data_route */
#include "shardload/module.h"
#include "testutil.h"

/* The vendor whose modules are tested: their names, and the libraries they must not link. */
typedef struct vendor {
  const char *backend, *collective, *platform;
  const char *unlinked[3];
} vendor;
static const vendor vendors[] = {
    {"cuda", "nccl", "CUDA", {"libcuda.so", "libcudart", "libnccl"}},
    {"hip", "rccl", "ROCm", {"libamdhip64", "libhsa-runtime", "librccl"}},
};
static const vendor *V = &vendors[0];

static const char *mod_dir;
static char gpu_reason[512]; /* the backend's probe's reason when it says no ("" when usable) */
static int gpu_usable;

/* ---- the modules as the registry sees them ------------------------------------------------ */

typedef struct opened {
  void *dl;
  const sl_backend_ops *be;
  const sl_collective_ops *coll;
} opened;

/* dlopen libshardload-NAME.so as the registry does (RTLD_NOW: every symbol must resolve now,
 * which fails where the module links libcuda or libnccl directly) and call its entry. */
static opened open_module(const char *name, int collective) {
  opened o = {0};
  char path[4096];
  snprintf(path, sizeof path, "%s/libshardload-%s.so", mod_dir, name);
  o.dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!o.dl) fail_msg("dlopen %s: %s", path, dlerror());
  void *entry = dlsym(o.dl, collective ? SL_COLLECTIVE_ENTRY : SL_BACKEND_ENTRY);
  if (!entry) fail_msg("%s: no entry symbol %s", path, collective ? SL_COLLECTIVE_ENTRY : SL_BACKEND_ENTRY);
  if (collective)
    o.coll = ((sl_collective_entry_fn)entry)();
  else
    o.be = ((sl_backend_entry_fn)entry)();
  assert_true(o.be || o.coll);
  return o;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Both modules open without a driver, report ABI v2 and the right names, and the cuda backend
 * wants nccl while nccl moves the memory of the cuda backend's native API (hip: rccl, hip's):
 * that pairing (by native API, module.h) is what "auto" collective relies on. */
static void test_modules_load_and_describe_themselves(void **state) {
  opened c = open_module(V->backend, 0), n = open_module(V->collective, 1);
  assert_int_equal(c.be->abi_version, SL_BACKEND_ABI_VERSION);
  assert_true(c.be->size >= offsetof(sl_backend_ops, free_device) + sizeof(void *));
  assert_string_equal(c.be->name, V->backend);
  assert_non_null(c.be->preferred_collective);
  assert_string_equal(c.be->preferred_collective, V->collective);
  assert_int_equal(n.coll->abi_version, SL_COLLECTIVE_ABI_VERSION);
  assert_string_equal(n.coll->name, V->collective);
  assert_non_null(n.coll->device_backend);
  assert_string_equal(n.coll->device_backend, V->backend);
  assert_string_equal(sl_backend_native_api(c.be), n.coll->device_backend);
  char why[256] = "";
  assert_int_equal(sl__data_route(n.coll, c.be, why, sizeof why), SL__ROUTE_DEVICE);
  assert_non_null(n.coll->abort); /* a lost peer must be able to end a pending NCCL op */
  dlclose(n.dl);
  dlclose(c.dl);
}

/* Loading never needs the driver, NCCL or the shared CUDA runtime: none is a DT_NEEDED entry
 * (cudart is linked statically; libcuda.so.1 and libnccl.so.2 are dlopen'ed by the probes).
 * hip: neither the HIP runtime, its HSA runtime nor RCCL (all dlopen'ed). */
static void test_modules_need_no_vendor_library_to_load(void **state) {
  const char *names[] = {V->backend, V->collective};
  for (int i = 0; i < 2; i++) {
    char *out = NULL;
    int rc = sl_test_run(&out, "readelf -d '%s/libshardload-%s.so' | grep NEEDED", mod_dir, names[i]);
    assert_int_equal(rc, 0);
    fprintf(stderr, "libshardload-%s.so needs:\n%s", names[i], out);
    for (int k = 0; k < 3; k++) assert_null(strstr(out, V->unlinked[k]));
    free(out);
  }
}

/* Probes answer with a reason naming the module, never an empty or generic line, and nccl
 * refuses every backend but cuda (rccl: but hip) whatever the machine has. */
static void test_probes_say_why(void **state) {
  opened c = open_module(V->backend, 0), n = open_module(V->collective, 1);
  char why[512] = "", prefix[16];
  int score = c.be->probe(why, sizeof why);
  fprintf(stderr, "%s probe: %d: %s\n", V->backend, score, why);
  snprintf(prefix, sizeof prefix, "%s: ", V->backend);
  if (score == 0) {
    assert_true(strncmp(why, prefix, strlen(prefix)) == 0);
    assert_true(strlen(why) > 10);
  }
  snprintf(prefix, sizeof prefix, "%s: ", V->collective);
  const char *others[] = {"cpu", "sim"};
  for (int i = 0; i < 2; i++) {
    why[0] = 0;
    assert_int_equal(n.coll->probe(others[i], why, sizeof why), 0);
    fprintf(stderr, "%s probe with %s: %s\n", V->collective, others[i], why);
    assert_true(strncmp(why, prefix, strlen(prefix)) == 0);
    assert_non_null(strstr(why, others[i])); /* names the rank's backend */
  }
  why[0] = 0;
  score = n.coll->probe(V->backend, why, sizeof why);
  fprintf(stderr, "%s probe with %s: %d: %s\n", V->collective, V->backend, score, why);
  if (!gpu_usable) {
    assert_int_equal(score, 0); /* no driver: NCCL cannot run either, and says which is missing */
    assert_true(strncmp(why, prefix, strlen(prefix)) == 0);
  }
  dlclose(n.dl);
  dlclose(c.dl);
}

/* --backend cuda without a device: SL_ERR_NO_DEVICE, no context, and the message carries the
 * probe's own reason (so the module was found and loaded: "not available here" would mean the
 * registry never opened it). */
static void test_backend_cuda_fails_with_the_probe_reason(void **state) {
  if (gpu_usable) skip();
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = V->backend, .world_size = 1, .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  assert_int_equal(sl_context_create(&co, &ctx), SL_ERR_NO_DEVICE);
  assert_null(ctx);
  fprintf(stderr, "backend %s: %s\n", V->backend, err);
  assert_non_null(strstr(err, "cannot run on this machine"));
  assert_non_null(strstr(err, gpu_reason));
  assert_non_null(strstr(err, "--backend cpu")); /* what to do */
}

typedef struct logbuf {
  char text[8192];
} logbuf;

static void collect(void *user, sl_log_level level, const char *msg) {
  logbuf *b = user;
  size_t used = strlen(b->text);
  snprintf(b->text + used, sizeof b->text - used, "%d %s\n", (int)level, msg);
}

/* --backend auto without a device: cpu, and at INFO the log says why not cuda (its reason). */
static void test_auto_picks_cpu_and_says_why(void **state) {
  if (gpu_usable) skip();
  logbuf log = {""};
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = "auto", .world_size = 1, .log = collect, .log_user = &log,
                           .log_level = SL_LOG_INFO, .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  assert_int_equal(sl_context_create(&co, &ctx), SL_OK);
  fprintf(stderr, "%s", log.text);
  assert_string_equal(sl_context_backend_name(ctx), "cpu");
  sl_context_destroy(ctx);
  char want[600];
  snprintf(want, sizeof want, "backend auto: %s", gpu_reason);
  assert_non_null(strstr(log.text, want));
  char absent[64];
  snprintf(absent, sizeof absent, "backend auto: %s: not available", V->backend);
  assert_null(strstr(log.text, absent)); /* it was loaded and probed */
  assert_non_null(strstr(log.text, "backend auto: chose cpu"));
}

/* ---- nccl asked for where a rank cannot run it: every rank fails, none hangs -------------- */

typedef struct nccl_job {
  char *rdzv;
  const char *backend;
  char reason[512]; /* what the nccl module's probe says for this backend */
} nccl_job;

static int nccl_rank(int rank, int world, void *arg) {
  const nccl_job *j = arg;
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = j->backend, .collective = V->collective, .world_size = world,
                           .rank = rank, .rendezvous = j->rdzv, .timeout_ms = 20000, .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  double t0 = now_s();
  sl_status s = sl_context_create(&co, &ctx);
  double took = now_s() - t0;
  fprintf(stderr, "rank %d (%s, %s): %s in %.2f s: %s\n", rank, j->backend, V->collective, sl_status_name(s), took,
          err);
  SL_CHILD_CHECK(s == SL_ERR_NO_DEVICE, "rank %d: %s, expected SL_ERR_NO_DEVICE", rank, sl_status_name(s));
  SL_CHILD_CHECK(ctx == NULL, "rank %d: a context after a failure", rank);
  SL_CHILD_CHECK(took < 10.0, "rank %d took %.1f s: the failure must be agreed, not timed out", rank, took);
  char want[96];
  snprintf(want, sizeof want, "the collective %s was asked for, but rank ", V->collective);
  SL_CHILD_CHECK(strstr(err, want) != NULL, "rank %d: %s", rank, err);
  /* the module's own reason: it was loaded and probed, not merely missing */
  SL_CHILD_CHECK(strstr(err, j->reason) != NULL, "rank %d: lacks the %s probe's '%s': %s", rank, V->collective,
                 j->reason, err);
  return 0;
}

static void test_nccl_on_sim_fails_on_every_rank(void **state) {
  nccl_job j = {.rdzv = sl_test_rendezvous("nccl-sim"), .backend = "sim"};
  opened n = open_module(V->collective, 1);
  assert_int_equal(n.coll->probe(j.backend, j.reason, sizeof j.reason), 0);
  dlclose(n.dl);
  int codes[2];
  int killed = sl_test_spawn(2, nccl_rank, &j, 40000, codes);
  assert_int_equal(killed, 0); /* nothing hung */
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  free(j.rdzv);
}

/* ---- the command ---------------------------------------------------------------------------- */

static char *checkpoint(void) {
  static char *ck;
  if (ck) return ck;
  char *d = sl_test_dir("ck");
  assert_non_null(d);
  ck = sl_test_path(d, "model");
  free(d);
  char *out = NULL;
  int rc = sl_test_run(&out, "'%s' synth '%s' --size 4MiB --shards 2", sl_test_bin(), ck);
  if (rc != 0) fail_msg("synth: %s", out);
  free(out);
  return ck;
}

/* The command with no SHARDLOAD_MODULE_PATH: the modules must be found next to libshardload. */
#define CLI "env -u SHARDLOAD_MODULE_PATH '%s' "

static void test_cli_backend_cuda_exits_1_with_the_reason(void **state) {
  if (gpu_usable) skip();
  char *out = NULL;
  int rc = sl_test_run(&out, CLI "load '%s' --backend %s", sl_test_bin(), checkpoint(), V->backend);
  fprintf(stderr, "%s", out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, "SL_ERR_NO_DEVICE"));
  assert_non_null(strstr(out, gpu_reason));
  assert_ptr_equal(strchr(out, '\n'), out + strlen(out) - 1); /* one line */
  free(out);
}

/* --nproc 2: exit 1 with the reason; and two explicitly started ranks sharing a rendezvous
 * both exit 1 with it within seconds (neither waits for the other in the rendezvous). */
static void test_cli_every_rank_fails(void **state) {
  if (gpu_usable) skip();
  char *out = NULL;
  int rc = sl_test_run(&out, CLI "load '%s' --backend %s --nproc 2 --timeout 20", sl_test_bin(), checkpoint(),
                       V->backend);
  fprintf(stderr, "--nproc 2: %s", out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, gpu_reason));
  assert_non_null(strstr(out, "rank "));
  free(out);

  char *d = sl_test_dir("ranks");
  double t0 = now_s();
  rc = sl_test_run(&out,
                   "cd '%s' && for r in 0 1; do (timeout 60 env -u SHARDLOAD_MODULE_PATH '%s' load '%s' --backend %s "
                   "--rank $r --world-size 2 --rendezvous file://'%s'/rdzv --timeout 20 >out$r 2>&1; echo $? >rc$r) & "
                   "done; wait; for r in 0 1; do echo \"rank $r exit $(cat rc$r): $(cat out$r)\"; done",
                   d, sl_test_bin(), checkpoint(), V->backend, d);
  double took = now_s() - t0;
  fprintf(stderr, "explicit ranks (%.1f s):\n%s", took, out);
  assert_int_equal(rc, 0);
  assert_true(took < 15.0);
  for (int r = 0; r < 2; r++) {
    char want[64];
    snprintf(want, sizeof want, "rank %d exit 1: ", r);
    char *line = strstr(out, want);
    assert_non_null(line);
    char *end = strchr(line, '\n');
    if (end) *end = 0;
    assert_non_null(strstr(line, gpu_reason));
    if (end) *end = '\n';
  }
  free(out);
  free(d);
}

/* ---- with a GPU (label gpu; amdgpu for hip) ---------------------------------------------- */

static void test_gpu_context_and_memory(void **state) {
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = V->backend, .world_size = 1, .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  if (sl_context_create(&co, &ctx) != SL_OK) fail_msg("backend %s: %s", V->backend, err);
  const char *desc = sl_context_device_description(ctx);
  fprintf(stderr, "device: %s\ncollective: %s: %s\n", desc, sl_context_collective_name(ctx),
          sl_context_collective_reason(ctx));
  assert_true(strncmp(desc, V->backend, strlen(V->backend)) == 0 && desc[strlen(V->backend)] == ':');
  /* a round trip through device memory, and pinned host memory from the backend */
  enum { N = 3 << 20 };
  unsigned char *src = malloc(N), *back = malloc(N);
  for (size_t i = 0; i < N; i++) src[i] = sl_test_pattern_byte("gpu", i);
  void *dev = NULL, *pinned = NULL;
  assert_int_equal(sl_alloc(ctx, SL_DEVICE_ACCELERATOR, 0, N, &dev), SL_OK);
  assert_int_equal(sl_alloc(ctx, SL_DEVICE_CPU, 1, N, &pinned), SL_OK);
  assert_int_equal(sl_copy_from_host(ctx, dev, SL_DEVICE_ACCELERATOR, src, N), SL_OK);
  assert_int_equal(sl_copy_to_host(ctx, pinned, dev, SL_DEVICE_ACCELERATOR, N), SL_OK);
  memcpy(back, pinned, N);
  assert_memory_equal(back, src, N);
  sl_free(ctx, SL_DEVICE_CPU, 1, pinned);
  sl_free(ctx, SL_DEVICE_ACCELERATOR, 0, dev);
  free(src);
  free(back);
  sl_context_destroy(ctx);

  /* auto prefers the accelerator */
  co.backend = "auto";
  if (sl_context_create(&co, &ctx) != SL_OK) fail_msg("backend auto: %s", err);
  assert_string_equal(sl_context_backend_name(ctx), V->backend);
  sl_context_destroy(ctx);
}

/* The same load on cuda (hip) and on cpu writes byte-identical dumps (read back through the
 * backend): every placement rule, device casts (F32), world 1 and two ranks over Gloo staging.
 * CUDA_ARGS: what the GPU load adds (a collective the cpu backend cannot run). */
static void dump_equal_with(const char *tag, const char *args, const char *cuda_args, int world) {
  char *d = sl_test_dir(tag), *out = NULL;
  const char *backends[] = {"cpu", V->backend};
  for (int b = 0; b < 2; b++) {
    int rc = sl_test_run(&out, CLI "load '%s' --backend %s %s %s --dump '%s/%s' --timeout 120", sl_test_bin(),
                         checkpoint(), backends[b], args, b ? cuda_args : "", d, backends[b]);
    if (rc != 0) fail_msg("%s on %s: exit %d: %s", args, backends[b], rc, out);
    free(out);
  }
  for (int r = 0; r < world; r++) {
    int rc = sl_test_run(&out, "cmp '%s/cpu/rank-%d.safetensors' '%s/%s/rank-%d.safetensors'", d, r, d, V->backend, r);
    if (rc != 0) fail_msg("%s: rank %d differs between cpu and %s: %s", args, r, V->backend, out);
    free(out);
  }
  fprintf(stderr, "%s == cpu: %s %s\n", V->backend, args, cuda_args);
  free(d);
}

static void dump_equal(const char *tag, const char *args, int world) { dump_equal_with(tag, args, "", world); }

static void test_gpu_placements_match_cpu(void **state) {
  const char *offload[] = {"on", "off", "infer"}, *policy[] = {"none", "cpu", "cpu-pinned"};
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 3; k++) {
      char args[160], tag[64];
      snprintf(args, sizeof args, "--cpu-offload %s --offload-policy %s --param-dtype F32", offload[i], policy[k]);
      snprintf(tag, sizeof tag, "place-%s-%s", offload[i], policy[k]);
      dump_equal(tag, args, 1);
    }
}

static void test_gpu_two_ranks_gloo_match_cpu(void **state) {
  dump_equal("two-gloo", "--nproc 2 --collective gloo", 2);
  dump_equal("two-gloo-cast", "--nproc 2 --collective gloo --param-dtype F32 --cpu-offload off", 2);
}

/* World 1 on cuda stages through host memory under auto (local: no one-rank NCCL communicator
 * to start); forced, NCCL runs there too (the device route), and both give cpu's bytes. */
static void test_gpu_nccl_one_rank_matches_cpu(void **state) {
  char *out = NULL, want[160], forced[64];
  int rc = sl_test_run(&out, CLI "load '%s' --backend %s --json", sl_test_bin(), checkpoint(), V->backend);
  if (rc != 0) fail_msg("%s, world 1: exit %d: %s", V->backend, rc, out);
  assert_non_null(strstr(out, "\"name\": \"local\""));
  snprintf(want, sizeof want, "local: one rank stages through host memory (backend %s's %s only when forced",
           V->backend, V->collective);
  assert_non_null(strstr(out, want));
  free(out);
  rc = sl_test_run(&out, CLI "load '%s' --backend %s --collective %s --json", sl_test_bin(), checkpoint(), V->backend,
                   V->collective);
  if (rc != 0) fail_msg("%s, world 1, --collective %s: exit %d: %s", V->backend, V->collective, rc, out);
  snprintf(want, sizeof want, "\"name\": \"%s\"", V->collective);
  assert_non_null(strstr(out, want));
  free(out);
  dump_equal("local-one", "--collective auto --cpu-offload off", 1);
  snprintf(forced, sizeof forced, "--collective %s", V->collective);
  dump_equal_with("nccl-one", "--cpu-offload off", forced, 1);
}

int main(int argc, char **argv) {
  int gpu = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--gpu") == 0) {
      gpu = 1;
    } else if (strcmp(argv[i], "--vendor") == 0 && i + 1 < argc && strcmp(argv[i + 1], "hip") == 0) {
      V = &vendors[1];
      i++;
    } else {
      fprintf(stderr, "usage: test_cuda_modules [--vendor hip] [--gpu]\n");
      return 2;
    }
  }
  mod_dir = getenv("SHARDLOAD_CUDA_MODULES");
  if (!mod_dir || !*mod_dir) {
    fprintf(stderr, "test_cuda_modules: SHARDLOAD_CUDA_MODULES is not set (CTest sets it to the build root)\n");
    return 1;
  }
  /* the backend's probe decides which half applies on this machine */
  char path[4096];
  snprintf(path, sizeof path, "%s/libshardload-%s.so", mod_dir, V->backend);
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  sl_backend_entry_fn entry = dl ? (sl_backend_entry_fn)dlsym(dl, SL_BACKEND_ENTRY) : NULL;
  if (!entry) {
    fprintf(stderr, "test_cuda_modules: cannot load %s: %s\n", path, dl ? "no entry symbol" : dlerror());
    return 1;
  }
  gpu_usable = entry()->probe(gpu_reason, sizeof gpu_reason) > 0;
  if (gpu_usable) gpu_reason[0] = 0;
  dlclose(dl);
  if (gpu) {
    if (!gpu_usable) {
      printf("SKIPPED: no usable %s device: %s\n", V->platform, gpu_reason);
      return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_context_and_memory),
        cmocka_unit_test(test_gpu_placements_match_cpu),
        cmocka_unit_test(test_gpu_two_ranks_gloo_match_cpu),
        cmocka_unit_test(test_gpu_nccl_one_rank_matches_cpu),
    };
    return cmocka_run_group_tests_name(V == vendors ? "cuda_modules_gpu" : "hip_modules_gpu", tests, NULL, NULL);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_modules_load_and_describe_themselves),
      cmocka_unit_test(test_modules_need_no_vendor_library_to_load),
      cmocka_unit_test(test_probes_say_why),
      cmocka_unit_test(test_backend_cuda_fails_with_the_probe_reason),
      cmocka_unit_test(test_auto_picks_cpu_and_says_why),
      cmocka_unit_test(test_nccl_on_sim_fails_on_every_rank),
      cmocka_unit_test(test_cli_backend_cuda_exits_1_with_the_reason),
      cmocka_unit_test(test_cli_every_rank_fails),
  };
  return cmocka_run_group_tests_name(V == vendors ? "cuda_modules" : "hip_modules", tests, NULL, NULL);
}
