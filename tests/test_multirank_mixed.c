/* Jobs that mix vendors (docs/DESIGN.md#data-flow, "Jobs that mix vendors"): one job whose ranks
 * run different backends (cpu, sim, sim:strict, and a GPU vendor's module where this machine
 * has one) agrees on one data collective, Gloo with host staging as soon as one rank cannot
 * run the device collective of rank 0's backend, and places every tensor by the same contract
 * on each rank's own device. Real processes, real Gloo over loopback.
 *
 * Every job first runs on cpu alone (the reference: each rank writes what it got, geometry and
 * bytes); the mixed job's ranks then compare every shard with that, bit for bit, over worlds 3
 * and 4 and a 2x2 HSDP mesh, rank-0 and every-rank reads, scatter and broadcast, and device,
 * CPU and pinned-CPU placements; and each rank checks its own report: its backend, its device
 * (the one its local rank gives), the data collective and the reason that names the rank
 * that decided it, and per tensor the placement, the rule, the pinned-ness and (on sim) the
 * memory the bytes are really in. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#include "internal.h"

#define MAX_WORLD 4

/* A rank's check: says what failed and ends the rank (the parent sees its exit code); usable in
 * the helpers, where SL_CHILD_CHECK's return would not end the rank. */
#define CHECK(cond, ...)                                                                       \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "rank check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond);          \
      fprintf(stderr, __VA_ARGS__);                                                            \
      fputc('\n', stderr);                                                                     \
      fflush(stderr);                                                                          \
      _exit(1);                                                                                \
    }                                                                                          \
  } while (0)

typedef struct spec {
  const char *name;
  const char *dtype;
  int ndim;
  int64_t shape[2];
} spec;

/* sharded and replicated tensors, uneven rows and an empty shard, a dim-1 shard, a 0-d tensor,
 * both casts (the plan's rules below), an integer and an F8 tensor, and one large enough for
 * many staging chunks */
static const spec specs[] = {
    {"layers.0.attn.q.weight", "BF16", 2, {10, 8}},     /* -> F32 */
    {"layers.0.mlp.up.weight", "F32", 2, {9, 5}},       /* -> BF16; 9 rows over 4: an empty shard */
    {"layers.0.colwise.weight", "F32", 2, {4, 7}},      /* shard(1) */
    {"layers.0.input_layernorm.weight", "F32", 1, {6}}, /* replicated by rule */
    {"scale", "F32", 0, {0}},
    {"position_ids", "I64", 1, {5}},
    {"q.fp8", "F8_E4M3", 2, {6, 2}},
    {"big.weight", "BF16", 2, {257, 33}},
};
#define NS (sizeof specs / sizeof specs[0])

static char *ckpt, *refdir;

static size_t esize(const char *dt) {
  if (!strcmp(dt, "I64")) return 8;
  if (!strcmp(dt, "F32")) return 4;
  if (!strcmp(dt, "BF16")) return 2;
  return 1;
}

/* finite values (a NaN's payload is no part of the contract) */
static int setup(void **state) {
  uint64_t x = 0x9E3779B97F4A7C15ull;
  unsigned char *data[NS];
  sl_test_tensor ts[NS];
  for (size_t i = 0; i < NS; i++) {
    uint64_t n = 1;
    for (int d = 0; d < specs[i].ndim; d++) n *= (uint64_t)specs[i].shape[d];
    data[i] = malloc(n * esize(specs[i].dtype) + 1);
    for (uint64_t k = 0; k < n; k++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      if (!strcmp(specs[i].dtype, "BF16")) {
        uint16_t v = (uint16_t)(0x3C00 + (x % 0x0600)) | (uint16_t)(x & 0x10000 ? 0x8000 : 0);
        memcpy(data[i] + k * 2, &v, 2);
      } else if (!strcmp(specs[i].dtype, "F32")) {
        float f = (float)((int64_t)(x % 2000001) - 1000000) / 4096.0f + (float)(x % 7) * 1e-7f;
        memcpy(data[i] + k * 4, &f, 4);
      } else if (!strcmp(specs[i].dtype, "I64")) {
        memcpy(data[i] + k * 8, &x, 8);
      } else {
        data[i][k] = (unsigned char)(x & 0x7E);
      }
    }
    ts[i] = (sl_test_tensor){specs[i].name, specs[i].dtype, specs[i].ndim, {0}, data[i]};
    for (int d = 0; d < specs[i].ndim; d++) ts[i].shape[d] = specs[i].shape[d];
  }
  refdir = sl_test_dir("mixed");
  ckpt = sl_test_path(refdir, "model.safetensors");
  int rc = sl_test_write_st(ckpt, ts, NS, NULL);
  for (size_t i = 0; i < NS; i++) free(data[i]);
  return rc;
}

static int teardown(void **state) {
  free(ckpt);
  free(refdir);
  return 0;
}

/* ---- one job ------------------------------------------------------------------------------ */

typedef struct mixed_job {
  int world, hsdp;
  const char *backend[MAX_WORLD];
  const char *collective;  /* the data collective every rank must report */
  const char *reason;      /* a substring of the reason every rank must report */
  const char *reason_alt;  /* or this one, where the machine decides which rank cannot */
  int reference;           /* 1: the one-backend load that writes what the others compare with */
  char *rdzv;
} mixed_job;

/* The loads of one job: read mode x strategy x placement (device; CPU; CPU pinned by the
 * offload policy under infer). */
enum { PLACEMENTS = 3, COMBOS = 2 * 2 * PLACEMENTS };

static const char *pl_names[PLACEMENTS] = {"off", "on", "infer/cpu-pinned"};

/* What a rank writes per tensor of the reference load, then its bytes. */
typedef struct ref_rec {
  char name[64];
  int32_t dtype, device, rule, ndim;
  int64_t global_shape[2], local_shape[2], global_offset[2];
  uint64_t nbytes;
} ref_rec;

static void ref_path(char *buf, size_t len, const mixed_job *j, int combo, int rank) {
  snprintf(buf, len, "%s/ref-w%d-h%d-c%d-r%d.bin", refdir, j->world, j->hsdp, combo, rank);
}

/* The backend's name without its variant ("sim" for "sim:strict"). */
static void base_name(char *buf, size_t len, const char *backend) {
  snprintf(buf, len, "%s", backend);
  buf[strcspn(buf, ":")] = 0;
}

/* The rank's report: its backend, its own device, the data collective and why. */
static void check_rank_report(const mixed_job *j, sl_context *ctx, int rank) {
  const char *asked = j->backend[rank], *desc = sl_context_device_description(ctx);
  const char *coll = sl_context_collective_name(ctx), *why = sl_context_collective_reason(ctx);
  char base[40], dev[48];
  base_name(base, sizeof base, asked);
  fprintf(stderr, "rank %d: backend %s, device %s, collective %s (%s)\n", rank, sl_context_backend_name(ctx), desc,
          coll, why);
  CHECK(strcmp(sl_context_backend_name(ctx), base) == 0, "rank %d: backend %s, asked for %s", rank,
                 sl_context_backend_name(ctx), asked);
  CHECK(sl_context_rank(ctx) == rank && sl_context_world_size(ctx) == j->world, "rank %d: rank/world", rank);
  if (!strcmp(base, "cpu")) {
    CHECK(strcmp(desc, "cpu (host memory)") == 0, "rank %d: device %s", rank, desc);
  } else if (!strcmp(base, "sim")) {
    /* the local rank's own device (local rank r takes device r), strict where asked */
    snprintf(dev, sizeof dev, "sim:%d (", rank);
    CHECK(strncmp(desc, dev, strlen(dev)) == 0, "rank %d: device %s, expected %s...", rank, desc, dev);
    CHECK((strstr(desc, ", strict)") != NULL) == (strcmp(asked, "sim:strict") == 0),
                   "rank %d (%s): device %s", rank, asked, desc);
  } else if (!strcmp(base, "level_zero")) {
    /* the local rank's own device of the test driver's (CTest gives it ZEDRV_DEVICES=4) */
    const char *nd = getenv("ZEDRV_DEVICES");
    snprintf(dev, sizeof dev, "level_zero:%d ", nd && atoi(nd) > 0 ? rank % atoi(nd) : 0);
    CHECK(strncmp(desc, dev, strlen(dev)) == 0, "rank %d: device %s, expected %s...", rank, desc, dev);
  } else if (!strcmp(base, "hostmem")) {
    CHECK(strncmp(desc, "hostmem (out-of-tree", 20) == 0, "rank %d: device %s", rank, desc);
  } else {
    /* a GPU vendor's module: "cuda:0 (...)" */
    CHECK(strncmp(desc, base, strlen(base)) == 0 && desc[strlen(base)] == ':', "rank %d: device %s", rank,
                   desc);
  }
  CHECK(coll && strcmp(coll, j->collective) == 0, "rank %d: collective %s (%s), expected %s", rank, coll,
                 why, j->collective);
  CHECK(why && (strstr(why, j->reason) || (j->reason_alt && strstr(why, j->reason_alt))),
        "rank %d: reason '%s' lacks '%s'%s%s", rank, why, j->reason, j->reason_alt ? " and " : "",
        j->reason_alt ? j->reason_alt : "");
}

/* The contract's placement of every tensor, whatever the backend: the device for off, the CPU
 * for on and for infer under a CPU offload policy; pinned only where the backend has pinned
 * host memory (cpu's and hostmem's host memory is all there is: nothing pinned); on sim, the
 * bytes are in the memory the placement says. */
static void check_placement(const mixed_job *j, sl_context *ctx, const sl_tensor *t, int place, const char *combo) {
  static const sl_device_kind dev[PLACEMENTS] = {SL_DEVICE_ACCELERATOR, SL_DEVICE_CPU, SL_DEVICE_CPU};
  static const sl_placement_rule rule[PLACEMENTS] = {SL_RULE_EXPLICIT_OFF, SL_RULE_EXPLICIT_ON,
                                                     SL_RULE_INFER_POLICY_CPU};
  int rank = sl_context_rank(ctx);
  /* what the backend's table declares, pinned down for the backends this file knows */
  const char *be = sl_context_backend_name(ctx);
  int has_pinned = (ctx->be->flags & SL_BACKEND_HAS_PINNED) != 0;
  if (!strcmp(be, "cpu") || !strcmp(be, "hostmem") || !strcmp(be, "sim"))
    CHECK(has_pinned == !strcmp(be, "sim"), "rank %d: backend %s declares pinned memory %d", rank, be, has_pinned);
  int pinned = place == 2 && has_pinned;
  CHECK(t->device == dev[place], "%s: %s on %s", combo, t->name, sl_device_kind_name(t->device));
  CHECK(t->rule == rule[place], "%s: %s rule %s", combo, t->name, sl_placement_rule_describe(t->rule));
  CHECK(t->pinned == pinned, "%s: %s pinned %d, expected %d", combo, t->name, t->pinned, pinned);
  CHECK(!t->caller_buffer, "%s: %s caller buffer", combo, t->name);
  if (!strcmp(sl_context_backend_name(ctx), "sim") && t->nbytes) {
    sl__sim_kind k = sl__sim_query(ctx->be_ctx, t->data);
    sl__sim_kind want = place == 0 ? SL__SIM_DEVICE : pinned ? SL__SIM_PINNED : SL__SIM_NONE;
    CHECK(k == want, "%s: rank %d: %s is in sim memory kind %d, expected %d", combo, rank, t->name, (int)k,
                   (int)want);
  } else if (!strcmp(be, "level_zero") && t->nbytes) {
    /* the module tells its device memory (zeMemGetAllocProperties) from host memory */
    int on_dev = ctx->be->is_device_ptr(ctx->be_ctx, t->data, t->nbytes);
    CHECK(on_dev == (place == 0), "%s: rank %d: %s is %s level_zero device memory", combo, rank, t->name,
          on_dev ? "in" : "not in");
  }
  (void)j;
}

static void fill_rec(ref_rec *r, const sl_tensor *t) {
  memset(r, 0, sizeof *r);
  snprintf(r->name, sizeof r->name, "%s", t->name);
  r->dtype = t->dtype;
  r->device = t->device;
  r->rule = t->rule;
  r->ndim = t->ndim;
  for (int d = 0; d < t->ndim && d < 2; d++) {
    r->global_shape[d] = t->global_shape[d];
    r->local_shape[d] = t->local_shape[d];
    r->global_offset[d] = t->global_offset[d];
  }
  r->nbytes = t->nbytes;
}

/* The reference rank writes its state; a mixed rank compares its own with it, field by field
 * and byte by byte. */
static void record_or_compare(const mixed_job *j, sl_context *ctx, const sl_state *st, int combo, const char *what) {
  int rank = sl_context_rank(ctx);
  char path[512];
  ref_path(path, sizeof path, j, combo, rank);
  FILE *f = fopen(path, j->reference ? "wb" : "rb");
  CHECK(f != NULL, "%s: rank %d: %s: cannot open (did the reference run?)", what, rank, path);
  CHECK(sl_state_count(st) == NS, "%s: %zu tensors", what, sl_state_count(st));
  for (size_t i = 0; i < NS; i++) {
    const sl_tensor *t = sl_state_tensor(st, i);
    unsigned char *h = malloc(t->nbytes + 1), *ref = NULL;
    CHECK(sl_copy_to_host(ctx, h, t->data, t->device, t->nbytes) == SL_OK, "%s: %s: read back: %s", what,
                   t->name, sl_context_errmsg(ctx));
    ref_rec mine, theirs;
    fill_rec(&mine, t);
    if (j->reference) {
      CHECK(fwrite(&mine, sizeof mine, 1, f) == 1 && fwrite(h, 1, t->nbytes, f) == t->nbytes, "%s: write",
                     what);
    } else {
      CHECK(fread(&theirs, sizeof theirs, 1, f) == 1, "%s: rank %d: %s: reference too short", what, rank,
                     path);
      CHECK(memcmp(&mine, &theirs, sizeof mine) == 0,
                     "%s: rank %d: %s: %s %s local %lldx%lld at %lld,%lld (%llu bytes), cpu reference %s %s %s local "
                     "%lldx%lld at %lld,%lld (%llu bytes)",
                     what, rank, t->name, sl_dtype_name(mine.dtype), sl_device_kind_name(mine.device),
                     (long long)mine.local_shape[0], (long long)mine.local_shape[1], (long long)mine.global_offset[0],
                     (long long)mine.global_offset[1], (unsigned long long)mine.nbytes, theirs.name,
                     sl_dtype_name(theirs.dtype), sl_device_kind_name(theirs.device), (long long)theirs.local_shape[0],
                     (long long)theirs.local_shape[1], (long long)theirs.global_offset[0],
                     (long long)theirs.global_offset[1], (unsigned long long)theirs.nbytes);
      ref = malloc(t->nbytes + 1);
      CHECK(fread(ref, 1, t->nbytes, f) == t->nbytes, "%s: reference data short", what);
      for (uint64_t k = 0; k < t->nbytes; k++)
        CHECK(h[k] == ref[k], "%s: rank %d (%s): %s byte %llu is 0x%02x, the cpu load's 0x%02x", what, rank,
                       j->backend[rank], t->name, (unsigned long long)k, h[k], ref[k]);
    }
    free(ref);
    free(h);
  }
  if (!j->reference) CHECK(fgetc(f) == EOF, "%s: the reference has more tensors", what);
  CHECK(fclose(f) == 0, "%s: close %s", what, path);
}

static int mixed_rank(int rank, int world, void *arg) {
  const mixed_job *j = arg;
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = j->backend[rank], .world_size = world, .rank = rank,
                           .local_rank = rank, .rendezvous = j->rdzv,
                           .timeout_ms = 60000, .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  sl_status s = sl_context_create(&co, &ctx);
  CHECK(s == SL_OK, "rank %d (%s): context: %s %s", rank, j->backend[rank], sl_status_name(s), err);
  check_rank_report(j, ctx, rank);
  sl_source *src = NULL;
  CHECK(sl_source_open(ctx, ckpt, &src) == SL_OK, "rank %d: source: %s", rank, sl_context_errmsg(ctx));
  static const sl_cpu_offload offload[PLACEMENTS] = {SL_CPU_OFFLOAD_OFF, SL_CPU_OFFLOAD_ON, SL_CPU_OFFLOAD_INFER};
  static const sl_offload_policy policy[PLACEMENTS] = {{SL_OFFLOAD_NONE, 0}, {SL_OFFLOAD_NONE, 0},
                                                       {SL_OFFLOAD_CPU, 1}};
  int combo = 0;
  for (int mode = 0; mode < 2; mode++) {
    for (int strat = 0; strat < 2; strat++) {
      for (int p = 0; p < PLACEMENTS; p++, combo++) {
        char what[200];
        snprintf(what, sizeof what, "world %d%s rank %d (%s) %s %s cpu_offload=%s", world, j->hsdp ? " hsdp 2x2" : "",
                 rank, j->backend[rank], mode ? "every-rank" : "rank0", strat ? "broadcast" : "scatter",
                 pl_names[p]);
        sl_plan *plan = NULL;
        CHECK(sl_plan_create(ctx, &plan) == SL_OK, "plan");
        if (j->hsdp) {
          int mesh[2] = {2, 2};
          CHECK(sl_plan_set_mesh(plan, 2, mesh) == SL_OK, "mesh");
          sl_plan_add_rule(plan, "*colwise*", "[replicate, shard(1)]", SL_DTYPE_INVALID);
        } else {
          sl_plan_add_rule(plan, "*colwise*", "shard(1)", SL_DTYPE_INVALID);
        }
        sl_plan_add_rule(plan, "*norm*", "replicate", SL_DTYPE_INVALID);
        sl_plan_add_rule(plan, "*.attn.*", NULL, SL_DTYPE_F32);
        sl_plan_add_rule(plan, "*.mlp.*", NULL, SL_DTYPE_BF16);
        sl_plan_set_offload_policy(plan, &policy[p]);
        sl_load_options lo = {.size = sizeof lo, .cpu_offload = offload[p], .strategy = (sl_strategy)strat,
                              .read_mode = (sl_read_mode)mode, .staging_bytes = 4096};
        sl_state *st = NULL;
        s = sl_load(ctx, plan, src, &lo, &st);
        CHECK(s == SL_OK, "%s: load: %s %s", what, sl_status_name(s), sl_context_errmsg(ctx));
        for (size_t i = 0; i < sl_state_count(st); i++) check_placement(j, ctx, sl_state_tensor(st, i), p, what);
        record_or_compare(j, ctx, st, combo, what);
        sl_state_destroy(st);
        sl_plan_destroy(plan);
      }
    }
  }
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void spawn(mixed_job *j, const char *sub) {
  j->rdzv = sl_test_rendezvous(sub);
  int codes[MAX_WORLD];
  int killed = sl_test_spawn(j->world, mixed_rank, j, 240000, codes);
  free(j->rdzv);
  assert_int_equal(killed, 0); /* none hung */
  for (int r = 0; r < j->world; r++) assert_int_equal(codes[r], 0);
}

/* The same job on cpu alone first, then the mixed one against it. */
static void run_mixed(mixed_job *j, const char *sub) {
  mixed_job ref = {.world = j->world, .hsdp = j->hsdp, .collective = "shm",
                   .reason = "shm: backend cpu of rank 0 stages through host memory", .reference = 1};
  for (int r = 0; r < j->world; r++) ref.backend[r] = "cpu";
  char rsub[96];
  snprintf(rsub, sizeof rsub, "%s-ref", sub);
  spawn(&ref, rsub);
  spawn(j, sub);
}

/* ---- the jobs ------------------------------------------------------------------------------- */

/* Rank 0 on cpu: host staging from the start (cpu prefers no device collective), and the sim
 * ranks, strict or not, place on their own devices. */
static void test_world3_cpu_sim_strict(void **state) {
  mixed_job j = {.world = 3, .backend = {"cpu", "sim", "sim:strict"}, .collective = "shm",
                 .reason = "shm: backend cpu of rank 0 stages through host memory"};
  run_mixed(&j, "w3-cpu-first");
}

/* Rank 0 on sim prefers simccl, which rank 2 (cpu) cannot run: every rank stages through
 * Gloo, and the reason names that rank and its backend. */
static void test_world3_sim_first(void **state) {
  mixed_job j = {.world = 3, .backend = {"sim", "sim:strict", "cpu"}, .collective = "shm",
                 .reason = "shm: rank 2 cannot run simccl"};
  run_mixed(&j, "w3-sim-first");
}

static void test_world4(void **state) {
  mixed_job j = {.world = 4, .backend = {"sim:strict", "cpu", "sim", "cpu"}, .collective = "shm",
                 .reason = "shm: rank 1 cannot run simccl"};
  run_mixed(&j, "w4");
}

/* HSDP 2x2 [replicate, shard]: each replica mixes backends, and so does each shard group. */
static void test_hsdp_2x2(void **state) {
  mixed_job j = {.world = 4, .hsdp = 1, .backend = {"sim", "cpu", "cpu", "sim:strict"}, .collective = "shm",
                 .reason = "shm: rank 1 cannot run simccl"};
  run_mixed(&j, "hsdp");
  mixed_job k = {.world = 4, .hsdp = 1, .backend = {"cpu", "sim:strict", "sim", "cpu"}, .collective = "shm",
                 .reason = "shm: backend cpu of rank 0 stages through host memory"};
  run_mixed(&k, "hsdp-cpu-first");
}

/* sim and sim:strict are one vendor's device memory: the device collective, with the same
 * bytes as the cpu load. */
static void test_sim_variants_keep_simccl(void **state) {
  mixed_job j = {.world = 3, .backend = {"sim", "sim:strict", "sim"}, .collective = "simccl",
                 .reason = "simccl: preferred by backend sim and every rank runs it"};
  run_mixed(&j, "w3-sim-variants");
}

/* ---- a GPU vendor's rank, where this machine has one ------------------------------------------ */

static int probe_rank(int rank, int world, void *arg) {
  sl_context_options co = {.size = sizeof co, .backend = arg, .world_size = 1};
  sl_context *ctx = NULL;
  if (sl_context_create(&co, &ctx) != SL_OK) return 1;
  sl_context_destroy(ctx);
  return 0;
}

/* Whether a one-rank context on BACKEND starts here (in a child: a GPU runtime is never
 * started in the parent that forks the ranks). */
static int backend_runs(const char *backend) {
  int code = 1;
  if (sl_test_spawn(1, probe_rank, (void *)backend, 60000, &code) != 0) return 0;
  return code == 0;
}

/* One GPU rank among cpu and sim ranks (each vendor's module that this build and machine can
 * run; Level Zero joins the list when its module exists): Gloo with host staging, whichever
 * rank comes first, and the same bytes as the cpu load. */
static void test_gpu_vendor_rank(void **state) {
  static const char *vendors[] = {"cuda", "hip"}; /* level_zero: test_level_zero_ranks */
  int ran = 0;
  for (size_t v = 0; v < sizeof vendors / sizeof vendors[0]; v++) {
    if (!backend_runs(vendors[v])) continue;
    char sub[64];
    /* rank 1 (cpu) cannot run the vendor's collective, or rank 0 cannot either where that
     * module is not installed */
    mixed_job j = {.world = 3, .backend = {vendors[v], "cpu", "sim"}, .collective = "shm",
                   .reason = "shm: rank 1 cannot run", .reason_alt = "shm: rank 0 cannot run"};
    snprintf(sub, sizeof sub, "gpu-%s-first", vendors[v]);
    run_mixed(&j, sub);
    mixed_job k = {.world = 4, .hsdp = 1, .backend = {"sim", vendors[v], "sim:strict", "cpu"}, .collective = "shm",
                   .reason = "shm: rank 1 cannot run simccl"};
    snprintf(sub, sizeof sub, "gpu-%s-hsdp", vendors[v]);
    run_mixed(&k, sub);
    ran++;
  }
  if (!ran) skip();
}

/* ---- level_zero ranks, over the test driver ------------------------------------------------------ */

/* Whether this run promises a level_zero rank: ZE_ENABLE_ALT_DRIVERS names the test driver and
 * SHARDLOAD_LEVEL_ZERO_MODULES the module's directory (CTest sets both where the driver and the
 * module are built). Then a level_zero that does not start is a failure, never a skip. */
static int level_zero_promised(void) {
  const char *alt = getenv("ZE_ENABLE_ALT_DRIVERS"), *mods = getenv("SHARDLOAD_LEVEL_ZERO_MODULES");
  if (!alt || !*alt || !mods || !*mods) return 0;
  setenv("SHARDLOAD_MODULE_PATH", mods, 1);
  return 1;
}

/* cpu, sim, sim:strict and level_zero ranks in one job (each rank its own device: ZEDRV_DEVICES=4
 * gives rank r the driver's device r), over worlds 3 and 4 and the 2x2 HSDP mesh, with level_zero
 * first (it prefers no device collective: host staging from the start), second and twice; every
 * rank bit for bit against the cpu load and its own report checked. */
static void test_level_zero_ranks(void **state) {
  if (!level_zero_promised()) {
    fprintf(stderr, "no level_zero here (ZE_ENABLE_ALT_DRIVERS and SHARDLOAD_LEVEL_ZERO_MODULES unset)\n");
    skip();
  }
  if (!backend_runs("level_zero"))
    fail_msg("ZE_ENABLE_ALT_DRIVERS=%s names a driver, but level_zero does not start (see above)",
             getenv("ZE_ENABLE_ALT_DRIVERS"));
  mixed_job a = {.world = 3, .backend = {"level_zero", "cpu", "sim:strict"}, .collective = "shm",
                 .reason = "shm: backend level_zero of rank 0 stages through host memory"};
  run_mixed(&a, "lz-w3-first");
  mixed_job b = {.world = 4, .backend = {"sim", "level_zero", "sim:strict", "cpu"}, .collective = "shm",
                 .reason = "shm: rank 1 cannot run simccl"};
  run_mixed(&b, "lz-w4");
  mixed_job c = {.world = 4, .hsdp = 1, .backend = {"cpu", "sim:strict", "level_zero", "sim"}, .collective = "shm",
                 .reason = "shm: backend cpu of rank 0 stages through host memory"};
  run_mixed(&c, "lz-hsdp");
  mixed_job d = {.world = 4, .hsdp = 1, .backend = {"level_zero", "sim", "cpu", "level_zero"}, .collective = "shm",
                 .reason = "shm: backend level_zero of rank 0 stages through host memory"};
  run_mixed(&d, "lz-hsdp-twice");
  unsetenv("SHARDLOAD_MODULE_PATH");
}

/* ---- a loadable backend's rank ---------------------------------------------------------------- */

/* A backend the core does not build in (tests/modules/hostmem.c, ABI v2, as an out-of-tree
 * vendor builds one; level_zero will be another) joins a mixed job like a built-in one: first
 * among sim ranks (it prefers no device collective), then among them (it cannot run simccl). */
static void test_loadable_backend_rank(void **state) {
  const char *mods = getenv("SHARDLOAD_TEST_MODULES");
  if (!mods) {
    fprintf(stderr, "set SHARDLOAD_TEST_MODULES to the test modules' directory (CTest does)\n");
    skip();
  }
  setenv("SHARDLOAD_MODULE_PATH", mods, 1);
  mixed_job j = {.world = 3, .backend = {"hostmem", "sim:strict", "sim"}, .collective = "shm",
                 .reason = "shm: backend hostmem of rank 0 stages through host memory"};
  run_mixed(&j, "hostmem-first");
  mixed_job k = {.world = 4, .hsdp = 1, .backend = {"sim", "cpu", "hostmem", "sim:strict"}, .collective = "shm",
                 .reason = "shm: rank 1 cannot run simccl"};
  run_mixed(&k, "hostmem-hsdp");
  mixed_job m = {.world = 3, .backend = {"sim", "hostmem", "sim"}, .collective = "shm",
                 .reason = "shm: rank 1 cannot run simccl"};
  run_mixed(&m, "hostmem-second");
  unsetenv("SHARDLOAD_MODULE_PATH");
}

/* ---- a rank whose backend does not start -------------------------------------------------------- */

typedef struct failing_job {
  int world;
  const char *backend[MAX_WORLD];
  int bad;            /* the rank whose backend cannot start */
  sl_status expect;   /* what every rank gets */
  const char *why;    /* what the bad rank says, and every other rank repeats */
  char *rdzv;
} failing_job;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Every rank fails at creation, at once (the timeout is 30 s), with the bad rank's status;
 * the others name that rank and repeat its reason. */
static int failing_rank(int rank, int world, void *arg) {
  const failing_job *j = arg;
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = j->backend[rank], .world_size = world, .rank = rank,
                           .local_rank = rank, .rendezvous = j->rdzv, .timeout_ms = 30000, .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  double t0 = now_s();
  sl_status s = sl_context_create(&co, &ctx);
  double took = now_s() - t0;
  fprintf(stderr, "rank %d (%s): %s after %.2f s: %s\n", rank, j->backend[rank], sl_status_name(s), took, err);
  CHECK(s == j->expect && !ctx, "rank %d: %s, expected %s", rank, sl_status_name(s), sl_status_name(j->expect));
  CHECK(took < 10.0, "rank %d waited %.1f s for rank %d, whose backend never started", rank, took, j->bad);
  CHECK(strstr(err, j->why) != NULL, "rank %d: message '%s' lacks '%s'", rank, err, j->why);
  char who[48];
  snprintf(who, sizeof who, "rank %d failed in starting its backend", j->bad);
  if (rank != j->bad) CHECK(strncmp(err, who, strlen(who)) == 0, "rank %d: message '%s' lacks '%s'", rank, err, who);
  return 0;
}

static void run_failing(failing_job *j, const char *sub) {
  j->rdzv = sl_test_rendezvous(sub);
  int codes[MAX_WORLD];
  int killed = sl_test_spawn(j->world, failing_rank, j, 60000, codes);
  free(j->rdzv);
  assert_int_equal(killed, 0);
  for (int r = 0; r < j->world; r++) assert_int_equal(codes[r], 0);
}

/* One rank of a mixed job names a backend this machine cannot start (a mistyped name, a bad
 * variant, a module whose init fails: a GPU vendor's module on a rank without the GPU): the
 * rank still meets the others on the control plane and says why, so none waits out the
 * timeout at the rendezvous for a rank that is gone. */
static void test_rank_whose_backend_fails(void **state) {
  failing_job j = {.world = 3, .backend = {"cpu", "nosuch", "sim"}, .bad = 1, .expect = SL_ERR_INVALID,
                   .why = "unknown backend 'nosuch'"};
  run_failing(&j, "fail-unknown");
  failing_job k = {.world = 4, .backend = {"sim", "sim:strict", "sim:bogus", "cpu"}, .bad = 2,
                   .expect = SL_ERR_INVALID, .why = "sim backend: unknown variant 'bogus'"};
  run_failing(&k, "fail-variant");
  /* the command, its ranks started on their own: each exits 1 at once, rank 1 with its own
   * message, the others naming it (each is bounded by timeout(1) at 60 s; --timeout is 30 s) */
  char *d = sl_test_dir("cli-fail"), *out = NULL;
  double t0 = now_s();
  int rc = sl_test_run(&out,
                       "cd '%s' && r=0; for be in cpu nosuch sim:strict; do (timeout 60 '%s' load '%s' --backend $be "
                       "--rank $r --world-size 3 --rendezvous file://'%s'/rdzv --timeout 30 >out$r 2>&1; "
                       "echo $? >rc$r) & r=$((r+1)); done; wait; "
                       "for r in 0 1 2; do echo \"rank $r exit $(cat rc$r): $(cat out$r)\"; done",
                       d, sl_test_bin(), ckpt, d);
  double took = now_s() - t0;
  fprintf(stderr, "the command (%.1f s):\n%s", took, out);
  assert_int_equal(rc, 0);
  assert_true(took < 15.0);
  assert_non_null(strstr(out, "rank 1 exit 1: shardload: "));
  assert_non_null(strstr(out, "SL_ERR_INVALID: unknown backend 'nosuch'"));
  for (int r = 0; r < 3; r += 2) {
    char want[160];
    snprintf(want, sizeof want,
             "rank %d exit 1: shardload: %s: SL_ERR_INVALID: rank 1 failed in starting its backend and agreeing on the "
             "data collective: unknown backend 'nosuch'",
             r, ckpt);
    if (!strstr(out, want)) fail_msg("lacks '%s'", want);
  }
  free(out);
  free(d);
  const char *mods = getenv("SHARDLOAD_TEST_MODULES");
  if (!mods) return;
  setenv("SHARDLOAD_MODULE_PATH", mods, 1);
  failing_job m = {.world = 3, .backend = {"silentbe", "sim", "cpu"}, .bad = 0, .expect = SL_ERR_BACKEND,
                   .why = "backend silentbe: init failed (SL_ERR_BACKEND) and gave no reason"};
  run_failing(&m, "fail-init");
  unsetenv("SHARDLOAD_MODULE_PATH");
}

/* ---- the command: ranks started on their own, each with its --backend ------------------------ */

/* Starts one `shardload load` per backend in BACKENDS (rank r gets backends[r], the same
 * rendezvous and ARGS), each writing its JSON report and its --dump under DIR/TAG; every rank
 * must exit 0 (none waits forever: each is bounded by timeout(1)). */
static void cli_job(const char *dir, const char *tag, int world, const char *const *backends, const char *args) {
  char list[128] = "";
  for (int r = 0; r < world; r++) {
    strcat(list, backends[r]);
    strcat(list, " ");
  }
  char *out = NULL;
  int rc = sl_test_run(&out,
                       "cd '%s' && mkdir %s && r=0; for be in %s; do (timeout 60 '%s' load '%s' --backend $be --rank $r "
                       "--world-size %d --rendezvous file://'%s'/%s/rdzv --timeout 30 --json --dump %s/dump %s "
                       ">%s/out$r 2>%s/err$r; echo $? >%s/rc$r) & r=$((r+1)); done; wait; "
                       "for r in $(seq 0 %d); do echo \"rank $r exit $(cat %s/rc$r): $(cat %s/err$r)\"; done",
                       dir, tag, list, sl_test_bin(), ckpt, world, dir, tag, tag, args, tag, tag, tag, world - 1, tag,
                       tag);
  fprintf(stderr, "%s (%s): %s", tag, list, out);
  assert_int_equal(rc, 0);
  for (int r = 0; r < world; r++) {
    char want[32];
    snprintf(want, sizeof want, "rank %d exit 0:", r);
    if (!strstr(out, want)) fail_msg("%s: rank %d (%s) failed: %s", tag, r, backends[r], out);
  }
  free(out);
}

static json_t *load_report(const char *dir, const char *tag, int rank) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s/out%d", dir, tag, rank);
  json_error_t e;
  json_t *j = json_load_file(path, 0, &e);
  if (!j) fail_msg("%s: not JSON: %s", path, e.text);
  return j;
}

static const char *jstr(json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  if (!s) fail_msg("the report has no string '%s'", key);
  return s;
}

/* Rank R's report of the mixed run TAG against the cpu run REF: its own backend and device, the
 * agreed collective and why, every tensor's geometry and dtype as the cpu run's, its placement
 * by the contract (PLACEMENT: "device" or "cpu") on its own device, and its dump byte for byte
 * the cpu run's. */
static void check_cli_rank(const char *dir, const char *tag, const char *ref, int rank, const char *backend,
                           const char *placement, const char *reason) {
  json_t *m = load_report(dir, tag, rank), *c = load_report(dir, ref, rank);
  char base[40];
  base_name(base, sizeof base, backend);
  const char *desc = jstr(m, "device");
  assert_int_equal(json_integer_value(json_object_get(m, "rank")), rank);
  assert_string_equal(jstr(m, "backend"), base);
  if (!strcmp(base, "cpu")) {
    assert_string_equal(desc, "cpu (host memory)");
  } else if (!strcmp(base, "level_zero")) {
    if (strncmp(desc, "level_zero:", 11) != 0 || strstr(desc, "shardload Level Zero test device") == NULL)
      fail_msg("%s rank %d: device %s", tag, rank, desc);
  } else {
    char dev[32];
    snprintf(dev, sizeof dev, "sim:%d (", rank);
    if (strncmp(desc, dev, strlen(dev)) != 0) fail_msg("%s rank %d: device %s", tag, rank, desc);
    assert_int_equal(strstr(desc, ", strict)") != NULL, strcmp(backend, "sim:strict") == 0);
  }
  json_t *coll = json_object_get(m, "collective");
  assert_string_equal(jstr(coll, "name"), "shm");
  if (!strstr(jstr(coll, "reason"), reason)) fail_msg("%s rank %d: reason %s", tag, rank, jstr(coll, "reason"));
  json_t *mt = json_object_get(m, "tensors"), *ct = json_object_get(c, "tensors");
  assert_int_equal(json_array_size(mt), NS);
  assert_int_equal(json_array_size(ct), NS);
  for (size_t i = 0; i < NS; i++) {
    json_t *a = json_array_get(mt, i), *b = json_array_get(ct, i);
    static const char *same[] = {"name", "dtype", "global_shape", "local_shape", "global_offset", "bytes", "rule"};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++)
      if (!json_equal(json_object_get(a, same[k]), json_object_get(b, same[k])))
        fail_msg("%s rank %d (%s): %s: %s differs from the cpu run's", tag, rank, backend, jstr(a, "name"), same[k]);
    assert_string_equal(jstr(a, "placement"), placement);
    /* a device placement is on this rank's own device; a CPU one in host memory, unpinned
     * (no --offload-policy cpu-pinned) */
    assert_string_equal(jstr(a, "device"), !strcmp(placement, "device") ? desc : "host memory");
    assert_false(json_is_true(json_object_get(a, "pinned")));
  }
  json_decref(m);
  json_decref(c);
  char *out = NULL;
  int rc = sl_test_run(&out, "cmp '%s/%s/dump/rank-%d.safetensors' '%s/%s/dump/rank-%d.safetensors'", dir, tag, rank,
                       dir, ref, rank);
  if (rc != 0) fail_msg("%s rank %d (%s): its dump differs from the cpu run's: %s", tag, rank, backend, out);
  free(out);
}

/* Worlds 3 and 4 and the 2x2 HSDP mesh through the command, each rank given its own --backend:
 * every rank's report and dump against the same job on cpu. */
typedef struct cli_mixed {
  const char *tag;
  int world;
  const char *backends[MAX_WORLD];
  const char *args, *placement, *reason;
} cli_mixed;

static void run_cli_mixed(const char *dir, const cli_mixed *j) {
  char ref[40];
  snprintf(ref, sizeof ref, "%s-cpu", j->tag);
  const char *cpus[MAX_WORLD] = {"cpu", "cpu", "cpu", "cpu"};
  cli_job(dir, ref, j->world, cpus, j->args);
  cli_job(dir, j->tag, j->world, j->backends, j->args);
  for (int r = 0; r < j->world; r++) check_cli_rank(dir, j->tag, ref, r, j->backends[r], j->placement, j->reason);
}

static void test_cli_mixed_ranks(void **state) {
  char *dir = sl_test_dir("cli");
  static const cli_mixed jobs[] = {
      {"w3", 3, {"sim", "cpu", "sim:strict"}, "--cpu-offload off", "device", "shm: rank 1 cannot run simccl"},
      {"w3on", 3, {"cpu", "sim:strict", "sim"}, "--cpu-offload on --source every-rank --strategy broadcast", "cpu",
       "shm: backend cpu of rank 0 stages through host memory"},
      {"w4", 4, {"sim:strict", "sim", "cpu", "sim"}, "--cpu-offload off --source every-rank", "device",
       "shm: rank 2 cannot run simccl"},
      {"hsdp", 4, {"sim", "cpu", "sim:strict", "cpu"}, "--cpu-offload off --mesh 2x2", "device",
       "shm: rank 1 cannot run simccl"},
  };
  /* a level_zero rank over the test driver, where this run has one (required there) */
  static const cli_mixed lz_jobs[] = {
      {"lz3", 3, {"level_zero", "sim:strict", "cpu"}, "--cpu-offload off", "device",
       "shm: backend level_zero of rank 0 stages through host memory"},
      {"lzhsdp", 4, {"sim", "level_zero", "cpu", "sim:strict"}, "--cpu-offload off --mesh 2x2 --source every-rank",
       "device", "shm: rank 1 cannot run simccl"},
  };
  for (size_t k = 0; k < sizeof jobs / sizeof jobs[0]; k++) run_cli_mixed(dir, &jobs[k]);
  if (level_zero_promised()) {
    for (size_t k = 0; k < sizeof lz_jobs / sizeof lz_jobs[0]; k++) run_cli_mixed(dir, &lz_jobs[k]);
    unsetenv("SHARDLOAD_MODULE_PATH");
  }
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_world3_cpu_sim_strict),
      cmocka_unit_test(test_world3_sim_first),
      cmocka_unit_test(test_world4),
      cmocka_unit_test(test_hsdp_2x2),
      cmocka_unit_test(test_sim_variants_keep_simccl),
      cmocka_unit_test(test_loadable_backend_rank),
      cmocka_unit_test(test_gpu_vendor_rank),
      cmocka_unit_test(test_level_zero_ranks),
      cmocka_unit_test(test_rank_whose_backend_fails),
      cmocka_unit_test(test_cli_mixed_ranks),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
