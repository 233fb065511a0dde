/* The placement contract across real ranks: real processes, real Gloo over loopback.
 *
 * World 2 and 4 (1-D FSDP mesh) and a 2x2 HSDP mesh [replicate, shard(0)], over source
 * rank0/every-rank x strategy scatter/broadcast x cpu_offload on/off/infer x offload policy
 * none/cpu/cpu-pinned x backend sim/cpu, on a checkpoint that mixes sharded and replicated
 * tensors, uneven rows, empty shards, a dim-1 shard, a 0-d tensor, BF16->F32 and F32->BF16
 * casts, an F8 tensor and an integer tensor. For every rank and tensor the data is compared
 * bit for bit with the slice this file computes on its own from the data it wrote, the
 * placement with the contract's table, the rule, and the pinned-ness; then one SGD step runs
 * through the backend on every floating shard. Owned and caller buffers alternate. */
#define _GNU_SOURCE
#include <link.h>
#include <math.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#include "internal.h"

typedef struct spec {
  const char *name;
  const char *dtype;
  int ndim;
  int64_t shape[2];
  const char *param; /* expected parameter dtype */
} spec;

static const spec specs[] = {
    {"layers.0.attn.q.weight", "BF16", 2, {10, 8}, "F32"},   /* BF16 -> F32, 10 rows: 3,3,3,1 */
    {"layers.0.mlp.up.weight", "F32", 2, {9, 5}, "BF16"},    /* F32 -> BF16, 9 rows: empty shard */
    {"layers.0.mlp.tiny.bias", "F32", 1, {3}, "BF16"},       /* 3 over 4 */
    {"layers.0.colwise.weight", "F32", 2, {4, 7}, "F32"},    /* shard(1) */
    {"layers.0.input_layernorm.weight", "F32", 1, {6}, "F32"}, /* replicated by rule */
    {"scale", "F32", 0, {0}, "F32"},                           /* 0-d: replicated */
    {"position_ids", "I64", 1, {5}, "I64"},
    {"q.fp8", "F8_E4M3", 2, {6, 2}, "F8_E4M3"},
    {"big.weight", "BF16", 2, {257, 33}, "BF16"}, /* many chunks with the small staging */
};
#define NS (sizeof specs / sizeof specs[0])

static unsigned char *data[NS];
static char *ckpt;

static size_t esize(const char *dt) {
  if (!strcmp(dt, "F64") || !strcmp(dt, "I64")) return 8;
  if (!strcmp(dt, "F32")) return 4;
  if (!strcmp(dt, "BF16")) return 2;
  return 1;
}

static uint64_t elems(const spec *s) {
  uint64_t n = 1;
  for (int d = 0; d < s->ndim; d++) n *= (uint64_t)s->shape[d];
  return n;
}

static int setup(void **state) {
  uint64_t x = 0x12345678;
  for (size_t i = 0; i < NS; i++) {
    uint64_t n = elems(&specs[i]);
    size_t es = esize(specs[i].dtype);
    data[i] = malloc(n * es + 1);
    for (uint64_t k = 0; k < n; k++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      if (!strcmp(specs[i].dtype, "BF16")) {
        uint16_t v = (uint16_t)(0x3C00 + (x % 0x0600)) | (uint16_t)(x & 0x10000 ? 0x8000 : 0); /* finite */
        memcpy(data[i] + k * 2, &v, 2);
      } else if (!strcmp(specs[i].dtype, "F32")) {
        float f = (float)((int64_t)(x % 2000001) - 1000000) / 4096.0f + (float)(x % 7) * 1e-7f;
        memcpy(data[i] + k * 4, &f, 4);
      } else if (!strcmp(specs[i].dtype, "I64")) {
        int64_t v = (int64_t)x;
        memcpy(data[i] + k * 8, &v, 8);
      } else {
        data[i][k] = (unsigned char)(x & 0x7E); /* E4M3 without NaN */
      }
    }
  }
  sl_test_tensor ts[NS];
  for (size_t i = 0; i < NS; i++) {
    ts[i] = (sl_test_tensor){specs[i].name, specs[i].dtype, specs[i].ndim, {0}, data[i]};
    for (int d = 0; d < specs[i].ndim; d++) ts[i].shape[d] = specs[i].shape[d];
  }
  char *dir = sl_test_dir("matrix");
  ckpt = sl_test_path(dir, "model.safetensors");
  free(dir);
  return sl_test_write_st(ckpt, ts, NS, NULL);
}

static int teardown(void **state) {
  for (size_t i = 0; i < NS; i++) free(data[i]);
  free(ckpt);
  return 0;
}

/* ---- the expectation, computed here independently of the library ------------------------ */
typedef struct expect {
  int64_t off[2], len[2];
} expect;

/* torch.chunk's rule on one extent: chunk = ceil(n/k), empty trailing shards at offset n */
static void chunk_rule(int64_t n, int k, int i, int64_t *off, int64_t *len) {
  int64_t c = (n + k - 1) / k, s = c * i, e = c * (i + 1);
  if (s > n) s = n;
  if (e > n) e = n;
  *off = s;
  *len = e - s;
}

/* placement per tensor as the test's plan says: hsdp = mesh [2,2] with [R, S(d)] */
static int shard_dim(const spec *s) {
  if (s->ndim == 0 || strstr(s->name, "norm")) return -1; /* replicated */
  if (strstr(s->name, "colwise")) return 1;
  return 0;
}

static expect expected_region(const spec *s, int rank, int world, int hsdp) {
  expect e = {{0, 0}, {s->shape[0], s->shape[1]}};
  int d = shard_dim(s);
  if (d < 0) return e;
  int k = hsdp ? 2 : world, i = hsdp ? rank % 2 : rank; /* HSDP shards over the inner mesh dim */
  int64_t off, len;
  chunk_rule(s->shape[d], k, i, &off, &len);
  e.off[d] = off;
  e.len[d] = len;
  return e;
}

static uint16_t f32_to_bf16_rne(uint32_t u) { return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16); }

/* expected element bytes at global index g of tensor i in parameter dtype */
static void expected_elem(size_t i, uint64_t g, unsigned char *out) {
  const spec *s = &specs[i];
  size_t es = esize(s->dtype);
  const unsigned char *p = data[i] + g * es;
  if (!strcmp(s->dtype, "BF16") && !strcmp(s->param, "F32")) {
    uint16_t b;
    memcpy(&b, p, 2);
    uint32_t u = (uint32_t)b << 16;
    memcpy(out, &u, 4);
  } else if (!strcmp(s->dtype, "F32") && !strcmp(s->param, "BF16")) {
    uint32_t u;
    memcpy(&u, p, 4);
    uint16_t b = f32_to_bf16_rne(u);
    memcpy(out, &b, 2);
  } else {
    memcpy(out, p, es);
  }
}

/* ---- one rank's run of the whole matrix ------------------------------------------------- */
typedef struct job {
  const char *backend;
  int hsdp;
  char *rdzv;
  const char *collective; /* NULL: auto (simccl, the device route, for sim; else shm); "gloo": host staging */
  const char *want_collective;
  int slots;
} job;

typedef struct bind_ctx {
  sl_context *ctx;
  void *bufs[NS];
  sl_device_kind where[NS];
  int pinned[NS];
  int n;
} bind_ctx;

static void *bind_cb(void *user, const sl_tensor *t) {
  bind_ctx *b = user;
  void *p = NULL;
  if (sl_alloc(b->ctx, t->device, t->pinned, t->nbytes, &p) != SL_OK) return NULL;
  b->bufs[b->n] = p;
  b->where[b->n] = t->device;
  b->pinned[b->n] = t->pinned;
  b->n++;
  return p;
}

/* x -= lr * g for a device shard where the backend has no device step: both down, the host's
 * step, x up again (each copy synced: the bytes are the host's only after the sync). */
static sl_status host_step_of_device(sl_context *ctx, const sl_tensor *t, void *g_dev, uint64_t n) {
  void *x = malloc(t->nbytes), *g = malloc(t->nbytes);
  sl_status s = x && g ? SL_OK : SL_ERR_NOMEM;
  if (s == SL_OK) s = sl_copy_to_host(ctx, x, t->data, t->device, t->nbytes);
  if (s == SL_OK) s = sl_copy_to_host(ctx, g, g_dev, t->device, t->nbytes);
  if (s == SL_OK) s = sl__host_sgd_step(x, g, t->dtype, n, 0.01f);
  if (s == SL_OK) s = ctx->be->copy_async(ctx->be_ctx, t->data, x, t->nbytes, SL_COPY_H2D, NULL);
  if (s == SL_OK) s = ctx->be->stream_sync(ctx->be_ctx, NULL);
  free(x);
  free(g);
  return s;
}

static int check_state(job *jb, sl_context *ctx, const sl_state *st, int rank, int world, sl_cpu_offload o,
                       sl_offload_policy pol, const char *combo) {
  sl_placement_decision want;
  sl_resolve_placement(o, &pol, &want);
  /* the table, written out again here so a wrong resolver cannot pass by agreeing with itself */
  sl_device_kind dev = o == SL_CPU_OFFLOAD_ON    ? SL_DEVICE_CPU
                       : o == SL_CPU_OFFLOAD_OFF ? SL_DEVICE_ACCELERATOR
                       : pol.kind == SL_OFFLOAD_CPU ? SL_DEVICE_CPU
                                                    : SL_DEVICE_ACCELERATOR;
  sl_placement_rule rule = o == SL_CPU_OFFLOAD_ON    ? SL_RULE_EXPLICIT_ON
                           : o == SL_CPU_OFFLOAD_OFF ? SL_RULE_EXPLICIT_OFF
                           : pol.kind == SL_OFFLOAD_CPU ? SL_RULE_INFER_POLICY_CPU
                                                        : SL_RULE_INFER_NO_POLICY;
  int is_sim = strncmp(jb->backend, "sim", 3) == 0;
  /* pinned only where the backend declares pinned host memory (sim, level_zero; not cpu) */
  int has_pinned = (ctx->be->flags & SL_BACKEND_HAS_PINNED) != 0;
  SL_CHILD_CHECK(has_pinned == (strcmp(jb->backend, "cpu") != 0), "%s: backend %s declares pinned memory %d", combo,
                 jb->backend, has_pinned);
  int pinned = dev == SL_DEVICE_CPU && pol.kind == SL_OFFLOAD_CPU && pol.pin_memory && has_pinned;
  /* where the module can tell device memory from host memory, the bytes are where the placement says */
  int tells = !is_sim && SL_HAS_OP(ctx->be, is_device_ptr) && !(ctx->be->flags & SL_BACKEND_DEVICE_IS_HOST);
  SL_CHILD_CHECK(tells == (strcmp(jb->backend, "level_zero") == 0), "%s: backend %s: is_device_ptr %d", combo,
                 jb->backend, tells);
  SL_CHILD_CHECK(sl_state_count(st) == NS, "%s: %zu tensors", combo, sl_state_count(st));
  for (size_t i = 0; i < NS; i++) {
    const sl_tensor *t = sl_state_tensor(st, i);
    const spec *s = &specs[i];
    SL_CHILD_CHECK(strcmp(t->name, s->name) == 0, "%s: order %s", combo, t->name);
    SL_CHILD_CHECK(t->device == dev, "%s: %s on %s", combo, t->name, sl_device_kind_name(t->device));
    SL_CHILD_CHECK(t->rule == rule, "%s: %s rule %d", combo, t->name, t->rule);
    SL_CHILD_CHECK(t->pinned == pinned, "%s: %s pinned %d", combo, t->name, t->pinned);
    if (is_sim) {
      sl__sim_kind k = sl__sim_query(ctx->be_ctx, t->data);
      SL_CHILD_CHECK(k == (dev == SL_DEVICE_ACCELERATOR ? SL__SIM_DEVICE : pinned ? SL__SIM_PINNED : SL__SIM_NONE),
                     "%s: %s memory kind %d", combo, t->name, (int)k);
    } else if (tells && t->nbytes) {
      int on_dev = ctx->be->is_device_ptr(ctx->be_ctx, t->data, t->nbytes);
      SL_CHILD_CHECK(on_dev == (dev == SL_DEVICE_ACCELERATOR), "%s: %s is %s device memory of %s", combo, t->name,
                     on_dev ? "in" : "not in", jb->backend);
    }
    SL_CHILD_CHECK(t->dtype == sl_dtype_from_name(s->param), "%s: %s dtype %s", combo, t->name, sl_dtype_name(t->dtype));
    expect e = expected_region(s, rank, world, jb->hsdp);
    uint64_t n = 1;
    for (int d = 0; d < s->ndim; d++) {
      SL_CHILD_CHECK(t->local_shape[d] == e.len[d] && t->global_offset[d] == e.off[d],
                     "%s: %s dim %d local %lld@%lld, expected %lld@%lld", combo, t->name, d,
                     (long long)t->local_shape[d], (long long)t->global_offset[d], (long long)e.len[d],
                     (long long)e.off[d]);
      n *= (uint64_t)e.len[d];
    }
    size_t ep = esize(s->param);
    SL_CHILD_CHECK(t->nbytes == n * ep, "%s: %s nbytes %llu", combo, t->name, (unsigned long long)t->nbytes);
    unsigned char *h = malloc(t->nbytes + 1), want_b[8];
    SL_CHILD_CHECK(sl_copy_to_host(ctx, h, t->data, t->device, t->nbytes) == SL_OK, "%s: read back", combo);
    uint64_t k = 0;
    int64_t rows = s->ndim >= 1 ? e.len[0] : 1, cols = s->ndim == 2 ? e.len[1] : 1;
    for (int64_t r = 0; r < rows; r++) {
      for (int64_t c = 0; c < cols; c++, k++) {
        uint64_t g = s->ndim == 2 ? (uint64_t)((e.off[0] + r) * s->shape[1] + e.off[1] + c)
                     : s->ndim == 1 ? (uint64_t)(e.off[0] + r)
                                    : 0;
        expected_elem(i, g, want_b);
        if (memcmp(h + k * ep, want_b, ep) != 0) {
          free(h);
          SL_CHILD_CHECK(0, "%s: %s local element %llu (global %llu) differs", combo, t->name,
                         (unsigned long long)k, (unsigned long long)g);
        }
      }
    }
    free(h);
    /* one SGD step through the backend: x -= 0.01 * x, values stay finite */
    if (sl_dtype_is_castable(t->dtype) && n) {
      void *g = NULL;
      SL_CHILD_CHECK(sl_alloc(ctx, t->device, 0, t->nbytes, &g) == SL_OK, "%s: grad alloc", combo);
      if (t->device == SL_DEVICE_ACCELERATOR) {
        SL_CHILD_CHECK(ctx->be->copy_async(ctx->be_ctx, g, t->data, t->nbytes, SL_COPY_D2D, NULL) == SL_OK &&
                           ctx->be->stream_sync(ctx->be_ctx, NULL) == SL_OK,
                       "%s: grad copy", combo);
      } else {
        memcpy(g, t->data, t->nbytes);
      }
      sl_status ss;
      if (t->device == SL_DEVICE_ACCELERATOR) {
        sl_ext_sgd_step_fn sgd =
            SL_HAS_OP(ctx->be, get_proc) ? (sl_ext_sgd_step_fn)ctx->be->get_proc(SL_EXT_SGD_STEP) : NULL;
        /* sim has its device step; a module that has none yet (level_zero before its kernels)
         * steps on the host between two copies */
        SL_CHILD_CHECK(sgd != NULL || !is_sim, "%s: backend %s offers no SGD step", combo, jb->backend);
        ss = sgd ? sgd(ctx->be_ctx, t->data, g, t->dtype, n, 0.01f) : host_step_of_device(ctx, t, g, n);
      } else {
        ss = sl__host_sgd_step(t->data, g, t->dtype, n, 0.01f);
      }
      SL_CHILD_CHECK(ss == SL_OK, "%s: sgd on %s", combo, t->name);
      float *f = malloc(n * 4);
      unsigned char *raw = malloc(t->nbytes);
      sl_copy_to_host(ctx, raw, t->data, t->device, t->nbytes);
      sl_convert(f, SL_DTYPE_F32, raw, t->dtype, n);
      for (uint64_t q = 0; q < n; q++) SL_CHILD_CHECK(isfinite(f[q]), "%s: %s not finite after sgd", combo, t->name);
      free(f);
      free(raw);
      sl_free(ctx, t->device, 0, g);
    }
  }
  return 0;
}

static int rank_main(int rank, int world, void *arg) {
  job *jb = arg;
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = jb->backend, .collective = jb->collective,
                           .world_size = world, .rank = rank, .local_rank = rank, .rendezvous = jb->rdzv,
                           .timeout_ms = 60000, .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  sl_status s = sl_context_create(&co, &ctx);
  SL_CHILD_CHECK(s == SL_OK, "rank %d: context: %s %s", rank, sl_status_name(s), err);
  /* the route under test is the one the ranks agreed on */
  SL_CHILD_CHECK(strcmp(sl_context_collective_name(ctx), jb->want_collective) == 0, "rank %d: collective %s (%s), want %s",
                 rank, sl_context_collective_name(ctx), sl_context_collective_reason(ctx), jb->want_collective);
  sl_source *src = NULL;
  s = sl_source_open(ctx, ckpt, &src);
  SL_CHILD_CHECK(s == SL_OK, "rank %d: source: %s %s", rank, sl_status_name(s), sl_context_errmsg(ctx));
  static const sl_offload_policy policies[] = {{SL_OFFLOAD_NONE, 0}, {SL_OFFLOAD_CPU, 0}, {SL_OFFLOAD_CPU, 1}};
  static const char *pnames[] = {"none", "cpu", "cpu-pinned"};
  static const char *onames[] = {"infer", "on", "off"};
  int combo_no = 0;
  for (int mode = 0; mode < 2; mode++) {
    for (int strat = 0; strat < 2; strat++) {
      for (int o = 0; o < 3; o++) {
        for (int p = 0; p < 3; p++, combo_no++) {
          char combo[160];
          snprintf(combo, sizeof combo, "world %d%s %s/%s %s %s cpu_offload=%s policy=%s %s", world,
                   jb->hsdp ? " hsdp" : "", jb->backend, jb->want_collective, mode ? "every-rank" : "rank0",
                   strat ? "broadcast" : "scatter", onames[o], pnames[p], combo_no % 2 ? "caller" : "owned");
          sl_plan *plan = NULL;
          SL_CHILD_CHECK(sl_plan_create(ctx, &plan) == SL_OK, "plan");
          if (jb->hsdp) {
            int mesh[2] = {2, 2};
            SL_CHILD_CHECK(sl_plan_set_mesh(plan, 2, mesh) == SL_OK, "mesh");
            sl_plan_add_rule(plan, "*colwise*", "[replicate, shard(1)]", SL_DTYPE_INVALID);
          } else {
            sl_plan_add_rule(plan, "*colwise*", "shard(1)", SL_DTYPE_INVALID);
          }
          sl_plan_add_rule(plan, "*norm*", "replicate", SL_DTYPE_INVALID);
          sl_plan_add_rule(plan, "*.attn.*", NULL, SL_DTYPE_F32);
          sl_plan_add_rule(plan, "*.mlp.*", NULL, SL_DTYPE_BF16);
          sl_plan_set_offload_policy(plan, &policies[p]);
          bind_ctx b = {.ctx = ctx};
          sl_load_options lo = {.size = sizeof lo,
                                .cpu_offload = (sl_cpu_offload)o,
                                .strategy = (sl_strategy)strat,
                                .read_mode = (sl_read_mode)mode,
                                .staging_bytes = 4096,
                                .pipeline_slots = jb->slots,
                                .bind = combo_no % 2 ? bind_cb : NULL,
                                .bind_user = &b};
          sl_state *st = NULL;
          s = sl_load(ctx, plan, src, &lo, &st);
          SL_CHILD_CHECK(s == SL_OK, "%s: rank %d: load: %s %s", combo, rank, sl_status_name(s), sl_context_errmsg(ctx));
          if (combo_no % 2) {
            for (size_t i = 0; i < NS; i++)
              SL_CHILD_CHECK(sl_state_tensor(st, i)->data == b.bufs[i] && sl_state_tensor(st, i)->caller_buffer,
                             "%s: caller buffer %zu not used", combo, i);
          }
          int rc = check_state(jb, ctx, st, rank, world, (sl_cpu_offload)o, policies[p], combo);
          sl_state_destroy(st);
          for (int i = 0; i < b.n; i++) sl_free(ctx, b.where[i], b.pinned[i], b.bufs[i]);
          sl_plan_destroy(plan);
          if (rc) return rc;
        }
      }
    }
  }
  if (rank == 0)
    fprintf(stderr, "world %d%s: %d loads checked on %s (%s), collective %s\n", world, jb->hsdp ? " hsdp" : "",
            combo_no, sl_context_backend_name(ctx), sl_context_device_description(ctx), jb->want_collective);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void run_job(const char *backend, const char *coll, const char *want, int world, int hsdp, int slots) {
  char sub[96];
  snprintf(sub, sizeof sub, "matrix-rdzv-%s-%s-%d-%d-%d", backend, coll ? coll : "auto", world, hsdp, slots);
  for (char *c = sub; *c; c++)
    if (*c == ':') *c = '-';
  job jb = {backend, hsdp, sl_test_rendezvous(sub), coll, want, slots};
  int codes[8];
  int killed = sl_test_spawn(world, rank_main, &jb, 240000, codes);
  free(jb.rdzv);
  assert_int_equal(killed, 0);
  for (int r = 0; r < world; r++) assert_int_equal(codes[r], 0);
}

/* sim: the device route (simccl, the ranks' own choice) and host staging (gloo, forced); the
 * others: host staging, shm (the ranks' own choice: they share this host) and gloo (forced) */
static void run_world(const char *backend, int world, int hsdp) {
  if (strncmp(backend, "sim", 3) == 0) {
    run_job(backend, NULL, "simccl", world, hsdp, 0);
    run_job(backend, "gloo", "gloo", world, hsdp, 3);
  } else {
    run_job(backend, NULL, "shm", world, hsdp, 0); /* host staging among ranks of one host */
    run_job(backend, "gloo", "gloo", world, hsdp, 3);
  }
}

/* Explicit rank and world size with no rendezvous option: the rendezvous comes from the
 * environment (SHARDLOAD_RENDEZVOUS here), as sl_context_options says, and a load works. */
static int env_rendezvous_main(int rank, int world, void *arg) {
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .world_size = world, .rank = rank,
                           .local_rank = rank, .timeout_ms = 60000};
  sl_context *ctx = NULL;
  char err[512] = "";
  co.errbuf = err;
  co.errbuf_size = sizeof err;
  sl_status s = sl_context_create(&co, &ctx);
  SL_CHILD_CHECK(s == SL_OK, "rank %d: context: %s %s", rank, sl_status_name(s), err);
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, ckpt, &src) == SL_OK, "rank %d: source %s", rank, sl_context_errmsg(ctx));
  sl_plan *plan = NULL;
  SL_CHILD_CHECK(sl_plan_create(ctx, &plan) == SL_OK, "plan");
  sl_state *st = NULL;
  s = sl_load(ctx, plan, src, NULL, &st);
  SL_CHILD_CHECK(s == SL_OK, "rank %d: load: %s %s", rank, sl_status_name(s), sl_context_errmsg(ctx));
  const sl_tensor *t = sl_state_find(st, "big.weight");
  SL_CHILD_CHECK(t && t->local_shape[0] == (rank == 0 ? 129 : 128), "rank %d: big.weight shard", rank);
  sl_state_destroy(st);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_explicit_ranks_rendezvous_from_env(void **state) {
  char *rdzv = sl_test_rendezvous("matrix-rdzv-env");
  setenv("SHARDLOAD_RENDEZVOUS", rdzv, 1);
  int codes[2];
  int killed = sl_test_spawn(2, env_rendezvous_main, NULL, 60000, codes);
  unsetenv("SHARDLOAD_RENDEZVOUS");
  free(rdzv);
  assert_int_equal(killed, 0);
  for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
  /* a malformed one is named, not reported as missing */
  setenv("SHARDLOAD_RENDEZVOUS", "nfs://x", 1);
  char err[512] = "";
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .world_size = 2, .rank = 0,
                           .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  assert_int_equal(sl_context_create(&co, &ctx), SL_ERR_INVALID);
  unsetenv("SHARDLOAD_RENDEZVOUS");
  assert_null(ctx);
  assert_non_null(strstr(err, "SHARDLOAD_RENDEZVOUS"));
  assert_non_null(strstr(err, "nfs://x"));
}

/* HSDP: rank 0 scatters within replica 0 and the replicas pass their parts down a chain, so
 * rank 0 sends each checkpoint byte once whatever the number of replicas (the floor:
 * (k-1)/k in the scatter plus its own shard to the next replica), each replica but the last
 * forwards exactly its shard, and every rank still gets the right bytes. */
typedef struct hsdp_job {
  const char *path;
  char *rdzv;
  int replicas;
  const char *backend;
  uint64_t total;
} hsdp_job;

static int hsdp_main(int rank, int world, void *arg) {
  hsdp_job *h = arg;
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = h->backend, .world_size = world, .rank = rank,
                           .local_rank = rank, .rendezvous = h->rdzv, .timeout_ms = 60000, .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "rank %d: context: %s", rank, err);
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, h->path, &src) == SL_OK, "rank %d: source %s", rank, sl_context_errmsg(ctx));
  sl_plan *plan = NULL;
  int mesh[2] = {h->replicas, world / h->replicas};
  SL_CHILD_CHECK(sl_plan_create(ctx, &plan) == SL_OK && sl_plan_set_mesh(plan, 2, mesh) == SL_OK, "plan");
  sl_load_options lo = {.size = sizeof lo, .cpu_offload = SL_CPU_OFFLOAD_ON, .staging_bytes = 8192};
  sl_state *st = NULL;
  sl_status s = sl_load(ctx, plan, src, &lo, &st);
  SL_CHILD_CHECK(s == SL_OK, "rank %d: load: %s %s", rank, sl_status_name(s), sl_context_errmsg(ctx));
  sl_load_stats stats = {.size = sizeof stats};
  sl_state_stats(st, &stats);
  int shard = rank % mesh[1], replica = rank / mesh[1];
  uint64_t mine = 0;
  for (size_t i = 0; i < sl_state_count(st); i++) {
    const sl_tensor *t = sl_state_tensor(st, i);
    /* [replicate, shard(0)]: rows split over the shard dim only, the same on every replica */
    int64_t rows = t->global_shape[0], chunk = (rows + mesh[1] - 1) / mesh[1];
    int64_t r0 = chunk * shard < rows ? chunk * shard : rows, r1 = chunk * (shard + 1) < rows ? chunk * (shard + 1) : rows;
    SL_CHILD_CHECK(t->global_offset[0] == r0 && t->local_shape[0] == r1 - r0, "rank %d: %s rows", rank, t->name);
    uint64_t row_bytes = t->nbytes / (uint64_t)(r1 - r0 ? r1 - r0 : 1);
    for (uint64_t k = 0; k < t->nbytes; k++)
      SL_CHILD_CHECK(((unsigned char *)t->data)[k] == sl_test_pattern_byte(t->name, (uint64_t)r0 * row_bytes + k),
                     "rank %d: %s byte %llu", rank, t->name, (unsigned long long)k);
    mine += t->nbytes;
  }
  uint64_t want_sent = rank == 0 ? h->total : replica < h->replicas - 1 ? mine : 0;
  uint64_t want_recv = rank == 0 ? 0 : replica == 0 ? mine : mine;
  SL_CHILD_CHECK(stats.bytes_sent == want_sent, "rank %d: sent %llu, expected %llu", rank,
                 (unsigned long long)stats.bytes_sent, (unsigned long long)want_sent);
  SL_CHILD_CHECK(stats.bytes_received == want_recv, "rank %d: received %llu, expected %llu", rank,
                 (unsigned long long)stats.bytes_received, (unsigned long long)want_recv);
  sl_state_destroy(st);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void run_hsdp_bytes(const char *backend, int replicas, int world) {
  char *dir = sl_test_dir("matrix-hsdp");
  char *path = sl_test_path(dir, "hsdp.safetensors");
  free(dir);
  const sl_test_tensor ts[] = {{"a.weight", "F32", 2, {37, 12}, NULL},
                               {"b.weight", "BF16", 2, {64, 33}, NULL},
                               {"c.bias", "F32", 1, {7}, NULL}};
  assert_int_equal(sl_test_write_st(path, ts, 3, NULL), 0);
  char sub[96];
  snprintf(sub, sizeof sub, "matrix-hsdp-%s-%d-%d", backend, replicas, world);
  hsdp_job h = {path, sl_test_rendezvous(sub), replicas, backend, 37 * 12 * 4 + 64 * 33 * 2 + 7 * 4};
  int codes[8];
  int killed = sl_test_spawn(world, hsdp_main, &h, 120000, codes);
  free(h.rdzv);
  free(path);
  assert_int_equal(killed, 0);
  for (int r = 0; r < world; r++) assert_int_equal(codes[r], 0);
}

static void test_hsdp_rank0_sends_each_byte_once(void **state) {
  run_hsdp_bytes("cpu", 2, 4);
  run_hsdp_bytes("cpu", 3, 6);
  run_hsdp_bytes("cpu", 4, 4); /* a mesh of replicas only: [4, 1] */
  run_hsdp_bytes("sim", 3, 6);
}

/* Many small pieces of mixed dtypes in one transfer, sharded on dim 1 (every rank's part of
 * every piece is two or more runs, so everything is packed), through both strategies and both
 * routes: the packed parts must neither overlap what is being received nor each other. */
enum { NSMALL = 3000 };
static char small_names[NSMALL][32];
static const char *small_dt(int i) { return i % 3 == 0 ? "I8" : i % 3 == 1 ? "BF16" : "F32"; }

typedef struct small_job {
  const char *path, *backend;
  char *rdzv;
} small_job;

static int small_main(int rank, int world, void *arg) {
  small_job *sj = arg;
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = sj->backend, .world_size = world, .rank = rank,
                           .local_rank = rank, .rendezvous = sj->rdzv, .timeout_ms = 60000, .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "rank %d: context: %s", rank, err);
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, sj->path, &src) == SL_OK, "rank %d: source %s", rank, sl_context_errmsg(ctx));
  for (int strat = 0; strat < 2; strat++) {
    sl_plan *plan = NULL;
    SL_CHILD_CHECK(sl_plan_create(ctx, &plan) == SL_OK, "plan");
    sl_plan_set_default_placement(plan, "shard(1)");
    sl_load_options lo = {.size = sizeof lo, .strategy = (sl_strategy)strat, .staging_bytes = 1 << 20};
    sl_state *st = NULL;
    sl_status s = sl_load(ctx, plan, src, &lo, &st);
    SL_CHILD_CHECK(s == SL_OK, "rank %d: load: %s %s", rank, sl_status_name(s), sl_context_errmsg(ctx));
    sl_load_stats stats = {.size = sizeof stats};
    sl_state_stats(st, &stats);
    SL_CHILD_CHECK(stats.transfers < NSMALL / 10, "rank %d: %llu transfers", rank, (unsigned long long)stats.transfers);
    for (int i = 0; i < NSMALL; i++) {
      const sl_tensor *t = sl_state_find(st, small_names[i]);
      SL_CHILD_CHECK(t != NULL, "rank %d: %s missing", rank, small_names[i]);
      size_t es = sl_dtype_size(t->dtype);
      int64_t rows = t->global_shape[0], cols = t->global_shape[1], c0 = t->global_offset[1], lc = t->local_shape[1];
      unsigned char *h = malloc(t->nbytes + 1);
      SL_CHILD_CHECK(sl_copy_to_host(ctx, h, t->data, t->device, t->nbytes) == SL_OK, "read back");
      for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < lc; c++)
          for (size_t b = 0; b < es; b++) {
            uint64_t g = (uint64_t)((r * cols + c0 + c) * (int64_t)es) + b;
            if (h[(size_t)((r * lc + c) * (int64_t)es) + b] != sl_test_pattern_byte(small_names[i], g)) {
              free(h);
              SL_CHILD_CHECK(0, "rank %d %s: %s byte differs at row %lld col %lld", rank, strat ? "broadcast" : "scatter",
                             small_names[i], (long long)r, (long long)(c0 + c));
            }
          }
      free(h);
    }
    sl_state_destroy(st);
    sl_plan_destroy(plan);
  }
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_many_small_pieces_packed(void **state) {
  static sl_test_tensor ts[NSMALL];
  for (int i = 0; i < NSMALL; i++) {
    snprintf(small_names[i], sizeof small_names[i], "small.%04d", i);
    ts[i] = (sl_test_tensor){small_names[i], small_dt(i), 2, {2 + i % 3, 3 + i % 5}, NULL};
  }
  char *dir = sl_test_dir("matrix-small");
  char *path = sl_test_path(dir, "small.safetensors");
  free(dir);
  assert_int_equal(sl_test_write_st(path, ts, NSMALL, NULL), 0);
  const char *backends[] = {"cpu", "sim"};
  for (int b = 0; b < 2; b++) {
    char sub[64];
    snprintf(sub, sizeof sub, "matrix-small-%s", backends[b]);
    small_job sj = {path, backends[b], sl_test_rendezvous(sub)};
    int codes[2];
    int killed = sl_test_spawn(2, small_main, &sj, 120000, codes);
    free(sj.rdzv);
    assert_int_equal(killed, 0);
    for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
  }
  free(path);
}

static void test_world2_sim(void **state) { run_world("sim", 2, 0); }
static void test_world2_cpu(void **state) { run_world("cpu", 2, 0); }
static void test_world4_sim(void **state) { run_world("sim", 4, 0); }
static void test_world4_cpu(void **state) { run_world("cpu", 4, 0); }
static void test_hsdp_2x2_sim(void **state) { run_world("sim", 4, 1); }
static void test_hsdp_2x2_cpu(void **state) { run_world("cpu", 4, 1); }
static void test_world2_sim_strict(void **state) { run_world("sim:strict", 2, 0); }
static void test_hsdp_2x2_sim_strict(void **state) { run_world("sim:strict", 4, 1); }

#ifdef SL_MATRIX_MUTANT
/* Built against a loader with one wait or record removed (tests/mutants.cmake): the device
 * route and host staging on sim, world 2 and the 2x2 HSDP mesh, run several times (the race a
 * mutant opens is random); any failing rank kills the mutant. */
static int run_mutant(void) {
  static const struct { const char *coll, *want; int world, hsdp, slots; } runs[] = {
      {NULL, "simccl", 2, 0, 0}, {"gloo", "gloo", 2, 0, 3}, {NULL, "simccl", 4, 1, 2}};
  for (int rep = 0; rep < 3; rep++) {
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
      char sub[96];
      snprintf(sub, sizeof sub, "mutant-%d-%d-%zu", SL_MATRIX_MUTANT, rep, i);
      job jb = {"sim", runs[i].hsdp, sl_test_rendezvous(sub), runs[i].coll, runs[i].want, runs[i].slots};
      int codes[8];
      int killed = sl_test_spawn(runs[i].world, rank_main, &jb, 240000, codes);
      free(jb.rdzv);
      int bad = killed;
      for (int r = 0; r < runs[i].world; r++) bad |= codes[r] != 0;
      if (bad) {
        printf("MUTANT KILLED: mutant %d failed the matrix (%s, world %d, repetition %d)\n", SL_MATRIX_MUTANT,
               runs[i].want, runs[i].world, rep);
        return 0;
      }
    }
  }
  printf("mutant %d SURVIVED: the matrix passed without that wait or record\n", SL_MATRIX_MUTANT);
  return 1;
}
#endif

/* ---- one loadable backend's matrix: test_matrix --backend NAME --world N [--hsdp] ----------- */

static const char *sel_backend;
static int sel_world, sel_hsdp, sel_mutant;

/* The module file a mutant's run must have loaded: its own directory's (ze-mutants/N/). */
static int find_module(struct dl_phdr_info *info, size_t size, void *arg) {
  char want[64];
  snprintf(want, sizeof want, "/ze-mutants/%d/libshardload-", sel_mutant);
  if (info->dlpi_name && strstr(info->dlpi_name, want)) *(int *)arg = 1;
  return 0;
}

static int probe_rank(int rank, int world, void *arg) {
  char err[512] = "";
  sl_context_options co = {.size = sizeof co, .backend = arg, .world_size = 1, .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  if (sl_context_create(&co, &ctx) != SL_OK) {
    fprintf(stderr, "backend %s does not start here: %s\n", (const char *)arg, err);
    return 1;
  }
  int mutant_loaded = 0;
  dl_iterate_phdr(find_module, &mutant_loaded);
  sl_context_destroy(ctx);
  if (sel_mutant && !mutant_loaded) {
    fprintf(stderr, "mutant %d: the module loaded is not the mutant's (set SHARDLOAD_MODULE_PATH to ze-mutants/%d)\n",
            sel_mutant, sel_mutant);
    return 1;
  }
  return 0;
}

/* The selected backend's matrix, host staging (its collective is Gloo), without and with a
 * pipeline. A backend that does not start here is skipped only where nothing promised a device:
 * with ZE_ENABLE_ALT_DRIVERS naming a driver, a level_zero that cannot start is a failure. */
static void test_selected_backend(void **state) {
  int code = 1;
  int promised = strncmp(sel_backend, "level_zero", 10) == 0 && getenv("ZE_ENABLE_ALT_DRIVERS") &&
                 getenv("ZE_ENABLE_ALT_DRIVERS")[0];
  /* in a child: a device runtime is never started in the parent that forks the ranks */
  if (sl_test_spawn(1, probe_rank, (void *)sel_backend, 60000, &code) != 0 || code != 0) {
    if (promised) fail_msg("%s: ZE_ENABLE_ALT_DRIVERS=%s names a driver, but the backend does not start", sel_backend,
                           getenv("ZE_ENABLE_ALT_DRIVERS"));
    skip();
  }
  run_job(sel_backend, NULL, "shm", sel_world, sel_hsdp, 0);
  run_job(sel_backend, "gloo", "gloo", sel_world, sel_hsdp, 3);
}

/* A module mutant (backends/level_zero/CMakeLists.txt, sl_ze_mutants): the selected job, without
 * and with a pipeline, several times (the race a mutant opens is random); any failing rank kills
 * it. A mutant that does not start, or is not the module loaded, is neither killed nor survived. */
static int run_module_mutant(void) {
  int code = 1;
  if (sl_test_spawn(1, probe_rank, (void *)sel_backend, 60000, &code) != 0 || code != 0) {
    printf("mutant %d: cannot run the matrix on it (see above)\n", sel_mutant);
    return 1;
  }
  for (int rep = 0; rep < 3; rep++) {
    for (int slots = 0; slots <= 3; slots += 3) {
      char sub[96];
      snprintf(sub, sizeof sub, "ze-mutant-%d-%d-%d", sel_mutant, rep, slots);
      job jb = {sel_backend, sel_hsdp, sl_test_rendezvous(sub), NULL, "shm", slots};
      int codes[8];
      int bad = sl_test_spawn(sel_world, rank_main, &jb, 240000, codes);
      free(jb.rdzv);
      for (int r = 0; r < sel_world; r++) bad |= codes[r] != 0;
      if (bad) {
        printf("MUTANT KILLED: %s mutant %d failed the matrix (world %d%s, %d pipeline slots, repetition %d)\n",
               sel_backend, sel_mutant, sel_world, sel_hsdp ? " hsdp" : "", slots, rep);
        return 0;
      }
    }
  }
  printf("%s mutant %d SURVIVED: the matrix passed without that wait or record\n", sel_backend, sel_mutant);
  return 1;
}

static int run_selected(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--backend") && i + 1 < argc) sel_backend = argv[++i];
    else if (!strcmp(argv[i], "--world") && i + 1 < argc) sel_world = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--hsdp")) sel_hsdp = 1;
    else if (!strcmp(argv[i], "--mutant") && i + 1 < argc) sel_mutant = atoi(argv[++i]);
    else sel_backend = NULL, i = argc;
  }
  if (!sel_backend || (sel_world != 2 && sel_world != 4) || (sel_hsdp && sel_world != 4)) {
    fprintf(stderr, "usage: %s [--backend NAME --world 2|4 [--hsdp] [--mutant N]]\n", argv[0]);
    return 2;
  }
  if (sel_mutant) {
    if (setup(NULL) != 0) return 1;
    int rc = run_module_mutant();
    teardown(NULL);
    return rc;
  }
  char name[96];
  snprintf(name, sizeof name, "matrix_%s_w%d%s", sel_backend, sel_world, sel_hsdp ? "_hsdp" : "");
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_selected_backend)};
  return cmocka_run_group_tests_name(name, tests, setup, teardown);
}

int main(int argc, char **argv) {
  if (argc > 1) return run_selected(argc, argv);
#ifdef SL_MATRIX_MUTANT
  if (setup(NULL) != 0) return 1;
  int rc = run_mutant();
  teardown(NULL);
  return rc;
#endif
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_world2_sim),  cmocka_unit_test(test_world2_cpu),
      cmocka_unit_test(test_world4_sim),  cmocka_unit_test(test_world4_cpu),
      cmocka_unit_test(test_hsdp_2x2_sim), cmocka_unit_test(test_hsdp_2x2_cpu),
      cmocka_unit_test(test_world2_sim_strict), cmocka_unit_test(test_hsdp_2x2_sim_strict),
      cmocka_unit_test(test_hsdp_rank0_sends_each_byte_once),
      cmocka_unit_test(test_many_small_pieces_packed),
      cmocka_unit_test(test_explicit_ranks_rendezvous_from_env),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
