/* World-size-1 loads through the public C API: the placement contract on every tensor, both
 * receive modes, option-struct compatibility, casts, chunked streaming, and the guarantee
 * that a failed phase 1 leaves caller buffers untouched. The sim backend proves device
 * placement (its strict variant faults on any direct touch of device memory by the core). */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

#include "internal.h"
#include "loader.h" /* the shard arena, white-box */

static char *ckpt;      /* mixed checkpoint */
static char *dir;

/* BF16 bits of small exact values, so F32 expectations are bf16 << 16 */
static uint16_t bf16_data[10 * 6];
static float f32_data[7] = {1.0f, -2.5f, 0.0f, 3.25f, 1e-3f, -0.0f, 42.0f};
static float scalar_data[1] = {0.5f};
static int64_t i64_data[5] = {1, -2, 3, 1LL << 40, 5};
static uint8_t f8_data[16];

static const sl_test_tensor tensors[] = {
    {"model.embed.weight", "BF16", 2, {10, 6}, bf16_data},
    {"model.norm.weight", "F32", 1, {7}, f32_data},
    {"model.scale", "F32", 0, {0}, scalar_data},
    {"model.position_ids", "I64", 1, {5}, i64_data},
    {"model.q.weight_fp8", "F8_E4M3", 2, {4, 4}, f8_data},
    {"model.empty", "F32", 2, {0, 3}, NULL},
};
#define NT (sizeof tensors / sizeof tensors[0])

static int setup(void **state) {
  for (size_t i = 0; i < 60; i++) bf16_data[i] = (uint16_t)(0x3F80 + (i % 40) - 20 + (i & 1 ? 0x8000 : 0));
  for (size_t i = 0; i < 16; i++) f8_data[i] = (uint8_t)(i * 13 + 1);
  dir = sl_test_dir("loader");
  ckpt = sl_test_path(dir, "model.safetensors");
  return sl_test_write_st(ckpt, tensors, NT, "{\"format\":\"pt\"}");
}

static int teardown(void **state) {
  free(ckpt);
  free(dir);
  return 0;
}

typedef struct env {
  sl_context *ctx;
  sl_source *src;
  sl_plan *plan;
} env;

/* One rank on BACKEND with data collective COLLECTIVE: NULL is auto (host staging through local
 * for one rank), "simccl" the device route on sim. */
static void open_env_on(env *e, const char *backend, const char *collective) {
  sl_context_options co = {.size = sizeof co, .backend = backend, .collective = collective, .world_size = 1};
  assert_int_equal(sl_context_create(&co, &e->ctx), SL_OK);
  assert_string_equal(sl_context_collective_name(e->ctx), collective ? collective : "local");
  assert_int_equal(sl_source_open(e->ctx, ckpt, &e->src), SL_OK);
  assert_int_equal(sl_plan_create(e->ctx, &e->plan), SL_OK);
}

static void open_env(env *e, const char *backend) { open_env_on(e, backend, NULL); }

static void close_env(env *e) {
  sl_plan_destroy(e->plan);
  sl_source_destroy(e->src);
  sl_context_destroy(e->ctx);
}

static const void *file_data(const char *name) {
  for (size_t i = 0; i < NT; i++)
    if (strcmp(tensors[i].name, name) == 0) return tensors[i].data;
  return NULL;
}

/* reads a loaded tensor back to host memory through the backend */
static void *read_back(env *e, const sl_tensor *t) {
  void *h = malloc(t->nbytes ? t->nbytes : 1);
  assert_int_equal(sl_copy_to_host(e->ctx, h, t->data, t->device, t->nbytes), SL_OK);
  return h;
}

static void check_same_as_file(env *e, const sl_state *st) {
  assert_int_equal(sl_state_count(st), NT);
  for (size_t i = 0; i < NT; i++) {
    const sl_tensor *t = sl_state_tensor(st, i);
    assert_string_equal(t->name, tensors[i].name); /* file order */
    assert_ptr_equal(sl_state_find(st, t->name), t);
    assert_int_equal(t->ndim, tensors[i].ndim);
    for (int d = 0; d < t->ndim; d++) {
      assert_int_equal(t->global_shape[d], tensors[i].shape[d]);
      assert_int_equal(t->local_shape[d], tensors[i].shape[d]);
      assert_int_equal(t->global_offset[d], 0);
    }
    void *h = read_back(e, t);
    const void *want = file_data(t->name);
    if (want) assert_memory_equal(h, want, t->nbytes);
    free(h);
  }
}

static void check_placement(env *e, const sl_state *st, sl_device_kind dev, sl_placement_rule rule, int pinned) {
  for (size_t i = 0; i < sl_state_count(st); i++) {
    const sl_tensor *t = sl_state_tensor(st, i);
    assert_int_equal(t->device, dev);
    assert_int_equal(t->rule, rule);
    assert_int_equal(t->pinned, pinned);
    if (strcmp(sl_context_backend_name(e->ctx), "sim") == 0) {
      sl__sim_kind k = sl__sim_query(e->ctx->be_ctx, t->data);
      assert_int_equal(k, dev == SL_DEVICE_ACCELERATOR ? SL__SIM_DEVICE : pinned ? SL__SIM_PINNED : SL__SIM_NONE);
    }
  }
}

static void test_null_options_infer_no_policy(void **state) {
  /* host staging on each backend, and sim's device route */
  const char *backends[] = {"cpu", "sim", "sim:strict", "sim:strict"}, *collectives[] = {NULL, NULL, NULL, "simccl"};
  for (size_t b = 0; b < 4; b++) {
    env e;
    open_env_on(&e, backends[b], collectives[b]);
    sl_state *st = NULL;
    assert_int_equal(sl_load(e.ctx, e.plan, e.src, NULL, &st), SL_OK);
    check_placement(&e, st, SL_DEVICE_ACCELERATOR, SL_RULE_INFER_NO_POLICY, 0);
    check_same_as_file(&e, st);
    /* a tiny checkpoint does not get the 64 MiB default staging: the whole checkpoint fits in
     * one slot of a few KiB */
    sl_load_stats stats = {.size = sizeof stats};
    assert_int_equal(sl_state_stats(st, &stats), SL_OK);
    assert_true(stats.staging_bytes <= 4096);
    assert_true(stats.staging_bytes > 0);
    if (strcmp(sl_context_backend_name(e.ctx), "sim") == 0) {
      uint64_t h2d, d2h, total = 0;
      for (size_t i = 0; i < NT; i++) total += sl_state_tensor(st, i)->nbytes;
      ((sl_ext_traffic_fn)e.ctx->be->get_proc(SL_EXT_TRAFFIC))(e.ctx->be_ctx, &h2d, &d2h);
      assert_int_equal(h2d, total); /* every byte reached the device through the backend */
    }
    sl_state_destroy(st);
    close_env(&e);
  }
}

static void test_contract_rows_on_sim(void **state) {
  struct {
    sl_cpu_offload o;
    sl_offload_policy p;
    sl_device_kind dev;
    sl_placement_rule rule;
    int pinned;
  } rows[] = {
      {SL_CPU_OFFLOAD_ON, {SL_OFFLOAD_NONE, 0}, SL_DEVICE_CPU, SL_RULE_EXPLICIT_ON, 0},
      {SL_CPU_OFFLOAD_ON, {SL_OFFLOAD_CPU, 1}, SL_DEVICE_CPU, SL_RULE_EXPLICIT_ON, 1},
      {SL_CPU_OFFLOAD_OFF, {SL_OFFLOAD_CPU, 1}, SL_DEVICE_ACCELERATOR, SL_RULE_EXPLICIT_OFF, 0},
      {SL_CPU_OFFLOAD_OFF, {SL_OFFLOAD_NONE, 0}, SL_DEVICE_ACCELERATOR, SL_RULE_EXPLICIT_OFF, 0},
      {SL_CPU_OFFLOAD_INFER, {SL_OFFLOAD_CPU, 0}, SL_DEVICE_CPU, SL_RULE_INFER_POLICY_CPU, 0},
      {SL_CPU_OFFLOAD_INFER, {SL_OFFLOAD_CPU, 1}, SL_DEVICE_CPU, SL_RULE_INFER_POLICY_CPU, 1},
      {SL_CPU_OFFLOAD_INFER, {SL_OFFLOAD_NONE, 0}, SL_DEVICE_ACCELERATOR, SL_RULE_INFER_NO_POLICY, 0},
  };
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    env e;
    open_env(&e, "sim:strict");
    assert_int_equal(sl_plan_set_offload_policy(e.plan, &rows[r].p), SL_OK);
    sl_load_options o = {.size = sizeof o, .cpu_offload = rows[r].o};
    sl_state *st = NULL;
    assert_int_equal(sl_load(e.ctx, e.plan, e.src, &o, &st), SL_OK);
    check_placement(&e, st, rows[r].dev, rows[r].rule, rows[r].pinned);
    check_same_as_file(&e, st);
    sl_state_destroy(st);
    close_env(&e);
  }
}

static void test_cpu_backend_has_no_pinned_memory(void **state) {
  env e;
  open_env(&e, "cpu");
  sl_offload_policy p = {SL_OFFLOAD_CPU, 1};
  assert_int_equal(sl_plan_set_offload_policy(e.plan, &p), SL_OK);
  sl_state *st = NULL;
  assert_int_equal(sl_load(e.ctx, e.plan, e.src, NULL, &st), SL_OK);
  check_placement(&e, st, SL_DEVICE_CPU, SL_RULE_INFER_POLICY_CPU, 0);
  sl_state_destroy(st);
  close_env(&e);
}

/* The cpu backend has one device, host memory, ordinal 0: an explicit other ordinal is
 * refused naming the backend and the ordinal, 0 is accepted, and without one every local rank
 * shares it. The sim backend simulates whichever ordinal it is given. */
static void test_cpu_backend_has_one_device(void **state) {
  char err[512] = "";
  sl_context *ctx = NULL;
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .world_size = 1, .device = 7, .device_set = 1,
                           .errbuf = err, .errbuf_size = sizeof err};
  assert_int_equal(sl_context_create(&co, &ctx), SL_ERR_NO_DEVICE);
  assert_null(ctx);
  assert_non_null(strstr(err, "cpu"));
  assert_non_null(strstr(err, "device 7 requested"));
  assert_non_null(strstr(err, "ordinal 0"));
  co.device = 0;
  assert_int_equal(sl_context_create(&co, &ctx), SL_OK);
  assert_string_equal(sl_context_backend_name(ctx), "cpu");
  sl_context_destroy(ctx);
  co.device_set = 0;
  co.device = 0;
  co.local_rank = 5; /* the sixth rank of a node: local_rank % 1 device */
  assert_int_equal(sl_context_create(&co, &ctx), SL_OK);
  sl_context_destroy(ctx);
  co.local_rank = 0;
  co.backend = "sim";
  co.device = 7;
  co.device_set = 1;
  assert_int_equal(sl_context_create(&co, &ctx), SL_OK);
  assert_non_null(strstr(sl_context_device_description(ctx), "sim:7"));
  sl_context_destroy(ctx);
}

static void test_older_smaller_options_mean_infer(void **state) {
  /* a caller compiled when the struct was just {size}: garbage after it must not be read */
  union {
    sl_load_options o;
    unsigned char raw[sizeof(sl_load_options)];
  } u;
  memset(&u, 0x5A, sizeof u);
  u.o.size = sizeof(size_t);
  env e;
  open_env(&e, "sim:strict");
  sl_offload_policy p = {SL_OFFLOAD_CPU, 0};
  assert_int_equal(sl_plan_set_offload_policy(e.plan, &p), SL_OK);
  sl_state *st = NULL;
  assert_int_equal(sl_load(e.ctx, e.plan, e.src, &u.o, &st), SL_OK);
  check_placement(&e, st, SL_DEVICE_CPU, SL_RULE_INFER_POLICY_CPU, 0);
  sl_state_destroy(st);
  /* size 0 is a caller bug, not "old": refused with a message */
  u.o.size = 0;
  assert_int_equal(sl_load(e.ctx, e.plan, e.src, &u.o, &st), SL_ERR_INVALID);
  assert_non_null(strstr(sl_context_errmsg(e.ctx), "sizeof(sl_load_options)"));
  close_env(&e);
}

/* On host staging (the narrow bytes copied up from the slot, widened on the device) and on the
 * device route (copied up, cast and packed on the device). */
static void cast_to_f32_and_tiny_staging(const char *collective) {
  env e;
  open_env_on(&e, "sim:strict", collective);
  assert_int_equal(sl_plan_set_param_dtype(e.plan, SL_DTYPE_F32), SL_OK);
  /* 4 KiB staging forces many chunks per tensor */
  sl_load_options o = {.size = sizeof o, .staging_bytes = 4096};
  sl_state *st = NULL;
  assert_int_equal(sl_load(e.ctx, e.plan, e.src, &o, &st), SL_OK);
  const sl_tensor *t = sl_state_find(st, "model.embed.weight");
  assert_non_null(t);
  assert_int_equal(t->dtype, SL_DTYPE_F32);
  assert_int_equal(t->file_dtype, SL_DTYPE_BF16);
  assert_int_equal(t->nbytes, 60 * 4);
  uint32_t *h = read_back(&e, t);
  for (int i = 0; i < 60; i++) assert_int_equal(h[i], (uint32_t)bf16_data[i] << 16);
  free(h);
  /* integers and float8 keep their dtype */
  t = sl_state_find(st, "model.position_ids");
  assert_int_equal(t->dtype, SL_DTYPE_I64);
  h = read_back(&e, t);
  assert_memory_equal(h, i64_data, sizeof i64_data);
  free(h);
  t = sl_state_find(st, "model.q.weight_fp8");
  assert_int_equal(t->dtype, SL_DTYPE_F8_E4M3);
  h = read_back(&e, t);
  assert_memory_equal(h, f8_data, sizeof f8_data);
  free(h);
  /* widening casts cross the bus at the narrow width and widen on the device: host-to-device
   * traffic is the file's bytes for the BF16 tensor, not its F32 size (before any read-back) */
  uint64_t want_h2d = 0, h2d, d2h;
  for (size_t i = 0; i < sl_state_count(st); i++) {
    const sl_tensor *x = sl_state_tensor(st, i);
    want_h2d += x->nbytes / sl_dtype_size(x->dtype) * sl_dtype_size(x->file_dtype);
  }
  sl_load_stats stats = {.size = sizeof stats};
  assert_int_equal(sl_state_stats(st, &stats), SL_OK);
  assert_int_equal(stats.bytes_h2d, want_h2d);
  ((sl_ext_traffic_fn)e.ctx->be->get_proc(SL_EXT_TRAFFIC))(e.ctx->be_ctx, &h2d, &d2h);
  assert_int_equal(h2d, want_h2d);
  assert_true(want_h2d < 60 * 4 + 7 * 4 + 4 + 40 + 16); /* less than the F32 state */
  sl_state_destroy(st);
  close_env(&e);
}

static void test_cast_to_f32_and_tiny_staging(void **state) {
  cast_to_f32_and_tiny_staging(NULL);
  cast_to_f32_and_tiny_staging("simccl");
}

static void test_cast_f32_to_bf16(void **state) {
  env e;
  open_env(&e, "cpu");
  assert_int_equal(sl_plan_set_param_dtype(e.plan, SL_DTYPE_BF16), SL_OK);
  sl_load_options o = {.size = sizeof o, .cpu_offload = SL_CPU_OFFLOAD_ON};
  sl_state *st = NULL;
  assert_int_equal(sl_load(e.ctx, e.plan, e.src, &o, &st), SL_OK);
  const sl_tensor *t = sl_state_find(st, "model.norm.weight");
  assert_int_equal(t->dtype, SL_DTYPE_BF16);
  /* these F32 values' low halves are zero except 1e-3: bf16 = top half, RNE for 1e-3 */
  const uint16_t *b = t->data;
  for (int i = 0; i < 7; i++) {
    uint32_t u;
    memcpy(&u, &f32_data[i], 4);
    uint32_t rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16;
    assert_int_equal(b[i], rounded);
  }
  sl_state_destroy(st);
  close_env(&e);
}

typedef struct binder {
  env *e;
  int calls;
  void *bufs[NT];
  int wrong_kind; /* hand out host memory for device tensors */
} binder;

static void *bind_cb(void *user, const sl_tensor *t) {
  binder *b = user;
  size_t i = (size_t)b->calls++;
  sl_device_kind where = b->wrong_kind ? SL_DEVICE_CPU : t->device;
  assert_int_equal(sl_alloc(b->e->ctx, where, 0, t->nbytes, &b->bufs[i]), SL_OK);
  if (where == SL_DEVICE_CPU) memset(b->bufs[i], 0xEE, t->nbytes);
  return b->bufs[i];
}

static void test_caller_buffers_filled_in_place(void **state) {
  const char *backends[] = {"cpu", "sim:strict"};
  for (size_t k = 0; k < 2; k++) {
    env e;
    open_env(&e, backends[k]);
    binder b = {.e = &e};
    sl_load_options o = {.size = sizeof o, .bind = bind_cb, .bind_user = &b};
    sl_state *st = NULL;
    assert_int_equal(sl_load(e.ctx, e.plan, e.src, &o, &st), SL_OK);
    assert_int_equal(b.calls, NT);
    for (size_t i = 0; i < NT; i++) {
      assert_ptr_equal(sl_state_tensor(st, i)->data, b.bufs[i]);
      assert_true(sl_state_tensor(st, i)->caller_buffer);
    }
    check_same_as_file(&e, st);
    sl_state_destroy(st); /* must not free caller buffers */
    for (size_t i = 0; i < NT; i++) {
      const sl_tensor fake = {.device = SL_DEVICE_ACCELERATOR};
      sl_free(e.ctx, fake.device, 0, b.bufs[i]);
    }
    close_env(&e);
  }
}

static void test_caller_buffer_wrong_memory_rejected(void **state) {
  env e;
  open_env(&e, "sim:strict");
  binder b = {.e = &e, .wrong_kind = 1};
  sl_load_options o = {.size = sizeof o, .bind = bind_cb, .bind_user = &b};
  sl_state *st = NULL;
  assert_int_equal(sl_load(e.ctx, e.plan, e.src, &o, &st), SL_ERR_BUFFER);
  assert_null(st);
  assert_non_null(strstr(sl_context_errmsg(e.ctx), "model.embed.weight"));
  /* nothing was written into the buffer before the load failed */
  unsigned char *p = b.bufs[0];
  for (size_t i = 0; i < 120; i++) assert_int_equal(p[i], 0xEE);
  for (int i = 0; i < b.calls; i++) sl_free(e.ctx, SL_DEVICE_CPU, 0, b.bufs[i]);
  close_env(&e);
}

typedef struct short_binder {
  env *e;
  void *buf;
} short_binder;

/* device memory, one byte shorter than the tensor */
static void *short_bind_cb(void *user, const sl_tensor *t) {
  short_binder *b = user;
  if (b->buf || t->nbytes < 2) return NULL;
  assert_int_equal(sl_alloc(b->e->ctx, SL_DEVICE_ACCELERATOR, 0, t->nbytes - 1, &b->buf), SL_OK);
  return b->buf;
}

static void test_caller_device_buffer_too_small_says_so(void **state) {
  env e;
  open_env(&e, "sim:strict");
  short_binder b = {.e = &e};
  sl_load_options o = {.size = sizeof o, .bind = short_bind_cb, .bind_user = &b};
  sl_state *st = NULL;
  assert_int_equal(sl_load(e.ctx, e.plan, e.src, &o, &st), SL_ERR_BUFFER);
  assert_null(st);
  const char *msg = sl_context_errmsg(e.ctx);
  assert_non_null(strstr(msg, "model.embed.weight"));
  /* it is device memory of the right backend: the message must be about its size */
  assert_null(strstr(msg, "not device memory"));
  assert_non_null(strstr(msg, "120 bytes"));
  sl_free(e.ctx, SL_DEVICE_ACCELERATOR, 0, b.buf);
  close_env(&e);
}

static void test_phase1_failure_leaves_caller_buffers_untouched(void **state) {
  env e;
  open_env(&e, "cpu");
  assert_int_equal(sl_plan_add_entry(e.plan, "model.embed.weight", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_entry(e.plan, "model.layers.0.missing", NULL, SL_DTYPE_INVALID), SL_OK);
  binder b = {.e = &e};
  sl_load_options o = {.size = sizeof o, .bind = bind_cb, .bind_user = &b};
  sl_state *st = NULL;
  assert_int_equal(sl_load(e.ctx, e.plan, e.src, &o, &st), SL_ERR_MISSING);
  assert_null(st);
  assert_int_equal(b.calls, 0); /* bind is only called once phase 1 agreed */
  assert_non_null(strstr(sl_context_errmsg(e.ctx), "model.layers.0.missing"));
  close_env(&e);
}

/* The data-phase half of the caller-buffer contract (shardload.h, sl_bind_fn): tensors load in
 * file order, so when the read of the second of three fails (the file was cut short after it
 * was opened), the first holds its data, the second may hold part of it, the third is
 * untouched — and no byte outside [data, data + nbytes) of any buffer is ever written. */
#define CANARY 0xC5
#define GUARD 64

typedef struct canary_binder {
  unsigned char *bufs[3];
  uint64_t nbytes[3];
  int calls;
} canary_binder;

static void *canary_bind(void *user, const sl_tensor *t) {
  canary_binder *c = user;
  if (c->calls >= 3) return NULL;
  unsigned char *p = malloc((size_t)t->nbytes + 2 * GUARD);
  assert_non_null(p);
  memset(p, CANARY, (size_t)t->nbytes + 2 * GUARD);
  c->bufs[c->calls] = p;
  c->nbytes[c->calls++] = t->nbytes;
  return p + GUARD;
}

/* Whether N bytes at P all still hold the canary. */
static int all_canary(const unsigned char *p, size_t n) { return sl_test_all_bytes(p, n, CANARY); }

static void test_data_phase_failure_leaves_later_buffers_untouched(void **state) {
  char *path = sl_test_path(dir, "cut.safetensors");
  const sl_test_tensor ts[] = {
      {"t.a", "F32", 2, {64, 16}, NULL}, {"t.b", "F32", 2, {64, 16}, NULL}, {"t.c", "F32", 2, {64, 16}, NULL}};
  assert_int_equal(sl_test_write_st(path, ts, 3, NULL), 0);
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .world_size = 1};
  env e;
  assert_int_equal(sl_context_create(&co, &e.ctx), SL_OK);
  assert_int_equal(sl_source_open(e.ctx, path, &e.src), SL_OK);
  assert_int_equal(sl_plan_create(e.ctx, &e.plan), SL_OK);
  const sl_source_tensor *b = sl_source_find(e.src, "t.b");
  assert_int_equal(truncate(path, (off_t)(b->file_offset + b->nbytes / 2)), 0);
  canary_binder c = {.calls = 0};
  sl_load_options o = {.size = sizeof o, .staging_bytes = 4096, .bind = canary_bind, .bind_user = &c};
  sl_state *st = NULL;
  assert_int_not_equal(sl_load(e.ctx, e.plan, e.src, &o, &st), SL_OK);
  assert_null(st);
  assert_non_null(strstr(sl_context_errmsg(e.ctx), "t.b"));
  assert_int_equal(c.calls, 3);
  for (int i = 0; i < 3; i++) {
    /* nothing outside the tensor's own bytes */
    assert_true(all_canary(c.bufs[i], GUARD));
    assert_true(all_canary(c.bufs[i] + GUARD + c.nbytes[i], GUARD));
  }
  for (uint64_t k = 0; k < c.nbytes[0]; k++) assert_int_equal(c.bufs[0][GUARD + k], sl_test_pattern_byte("t.a", k));
  assert_true(all_canary(c.bufs[2] + GUARD, (size_t)c.nbytes[2]));
  for (int i = 0; i < 3; i++) free(c.bufs[i]);
  close_env(&e);
  free(path);
}

static void test_non_strict_plan_skips_and_reports(void **state) {
  env e;
  open_env(&e, "cpu");
  assert_int_equal(sl_plan_add_entry(e.plan, "model.embed.weight", NULL, SL_DTYPE_INVALID), SL_OK);
  sl_state *st = NULL;
  assert_int_equal(sl_load(e.ctx, e.plan, e.src, NULL, &st), SL_OK);
  assert_int_equal(sl_state_count(st), 1);
  assert_int_equal(sl_state_skipped_count(st), NT - 1);
  assert_string_equal(sl_state_skipped_at(st, 0), "model.norm.weight");
  sl_state_destroy(st);
  assert_int_equal(sl_plan_set_strict(e.plan, 1), SL_OK);
  assert_int_equal(sl_load(e.ctx, e.plan, e.src, NULL, &st), SL_ERR_UNEXPECTED);
  close_env(&e);
}

static void test_sgd_step_through_backend(void **state) {
  env e;
  open_env(&e, "sim:strict");
  assert_int_equal(sl_plan_set_param_dtype(e.plan, SL_DTYPE_F32), SL_OK);
  sl_state *st = NULL;
  assert_int_equal(sl_load(e.ctx, e.plan, e.src, NULL, &st), SL_OK);
  for (size_t i = 0; i < sl_state_count(st); i++) {
    const sl_tensor *t = sl_state_tensor(st, i);
    if (!sl_dtype_is_castable(t->dtype) || t->nbytes == 0) continue;
    size_t n = t->nbytes / sl_dtype_size(t->dtype);
    void *g = NULL;
    assert_int_equal(sl_alloc(e.ctx, t->device, 0, t->nbytes, &g), SL_OK);
    assert_int_equal(e.ctx->be->copy_async(e.ctx->be_ctx, g, t->data, t->nbytes, SL_COPY_D2D, NULL), SL_OK);
    assert_int_equal(e.ctx->be->stream_sync(e.ctx->be_ctx, NULL), SL_OK); /* grad = x */
    sl_ext_sgd_step_fn sgd = (sl_ext_sgd_step_fn)e.ctx->be->get_proc(SL_EXT_SGD_STEP);
    assert_non_null(sgd);
    assert_int_equal(sgd(e.ctx->be_ctx, t->data, g, t->dtype, n, 0.5f), SL_OK);
    float *h = read_back(&e, t), *x0 = NULL;
    x0 = read_back(&e, &(sl_tensor){.data = g, .device = t->device, .nbytes = t->nbytes});
    for (size_t k = 0; k < n; k++) {
      assert_true(isfinite(h[k]));
      assert_true(h[k] == x0[k] * 0.5f); /* x - 0.5 x, exact for these values */
    }
    free(h);
    free(x0);
    sl_free(e.ctx, t->device, 0, g);
  }
  sl_state_destroy(st);
  close_env(&e);
}

/* 10^3 small tensors of mixed dtypes (F32, BF16 cast to F32, I64) load in a handful of
 * collective operations, not one per tensor, and every byte is right: the bucket's pieces are
 * ordered so that every element stays aligned (docs/DESIGN.md#data-flow). */
static void test_small_tensors_share_transfers(void **state) {
  enum { N = 1200 };
  static sl_test_tensor ts[N];
  static char names[N][32];
  static const char *dts[3] = {"F32", "BF16", "I64"};
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "layer.%04d.%s", i, i % 3 == 1 ? "bf16" : "w");
    ts[i] = (sl_test_tensor){names[i], dts[i % 3], 1, {1 + i % 37}, NULL};
  }
  char *path = sl_test_path(dir, "small.safetensors");
  assert_int_equal(sl_test_write_st(path, ts, N, NULL), 0);
  /* host staging on each backend, and sim's device route (packed on the device) */
  const char *backends[] = {"cpu", "sim", "sim:strict", "sim:strict"}, *collectives[] = {NULL, NULL, NULL, "simccl"};
  for (size_t b = 0; b < 4; b++) {
    sl_context_options co = {.size = sizeof co, .backend = backends[b], .collective = collectives[b], .world_size = 1};
    env e;
    assert_int_equal(sl_context_create(&co, &e.ctx), SL_OK);
    assert_string_equal(sl_context_collective_name(e.ctx), collectives[b] ? collectives[b] : "local");
    assert_int_equal(sl_source_open(e.ctx, path, &e.src), SL_OK);
    assert_int_equal(sl_plan_create(e.ctx, &e.plan), SL_OK);
    assert_int_equal(sl_plan_add_rule(e.plan, "*.bf16", NULL, SL_DTYPE_F32), SL_OK); /* BF16 -> F32 */
    sl_state *st = NULL;
    assert_int_equal(sl_load(e.ctx, e.plan, e.src, NULL, &st), SL_OK);
    sl_load_stats stats = {.size = sizeof stats};
    assert_int_equal(sl_state_stats(st, &stats), SL_OK);
    assert_true(stats.transfers >= 1 && stats.transfers <= 4);
    for (int i = 0; i < N; i++) {
      const sl_tensor *t = sl_state_find(st, names[i]);
      assert_non_null(t);
      unsigned char *h = read_back(&e, t);
      uint64_t n = (uint64_t)(1 + i % 37);
      for (uint64_t k = 0; k < n; k++) {
        if (i % 3 == 1) { /* BF16 file bytes widened: the high half of each F32 */
          uint32_t u;
          memcpy(&u, h + 4 * k, 4);
          uint16_t want = (uint16_t)(sl_test_pattern_byte(names[i], 2 * k) | sl_test_pattern_byte(names[i], 2 * k + 1) << 8);
          /* NaN payloads are canonicalised; the pattern may contain them, skip those */
          if ((want & 0x7F80) == 0x7F80 && (want & 0x7F)) continue;
          assert_int_equal(u, (uint32_t)want << 16);
        } else {
          size_t es = i % 3 == 0 ? 4 : 8;
          for (size_t q = 0; q < es; q++) assert_int_equal(h[k * es + q], sl_test_pattern_byte(names[i], k * es + q));
        }
      }
      free(h);
    }
    sl_state_destroy(st);
    close_env(&e);
  }
  free(path);
}

/* The small shards the state owns share a few blocks (loader_plan.c: the shard arena): each
 * 64-byte aligned and disjoint from every other, with its own bytes; a shard of 1 MiB or more,
 * a caller's buffer and sim's device memory stay out of them. The blocks outlive the owner's
 * reference while an export holds the state. On cpu both placements are host memory. */
typedef struct every_kth {
  sl_context *ctx;
  int k, calls;
  sl_device_kind where[4096];
  void *bufs[4096];
} every_kth;

static void *bind_every_kth(void *user, const sl_tensor *t) {
  every_kth *b = user;
  int i = b->calls++;
  if (i % b->k) return NULL;
  b->where[i] = t->device;
  assert_int_equal(sl_alloc(b->ctx, t->device, 0, t->nbytes ? (size_t)t->nbytes : 1, &b->bufs[i]), SL_OK);
  return b->bufs[i];
}

static int cmp_addr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)(*(const sl_tensor *const *)a)->data, y = (uintptr_t)(*(const sl_tensor *const *)b)->data;
  return x < y ? -1 : x > y;
}

static void test_small_shards_share_blocks(void **state) {
  enum { N = 3001, BIG = 2000, K = 7 };
  static sl_test_tensor ts[N];
  static char names[N][32];
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "expert.%04d.w", i);
    /* 0..900 F32 elements; one of 1.2 MB, one empty */
    uint64_t n = i == BIG ? 300000 : i == 17 ? 0 : (uint64_t)(i * 37 % 901);
    ts[i] = (sl_test_tensor){names[i], "F32", 1, {n}, NULL};
  }
  char *path = sl_test_path(dir, "experts.safetensors");
  assert_int_equal(sl_test_write_st(path, ts, N, NULL), 0);
  const char *backends[] = {"cpu", "cpu", "sim:strict", "sim:strict"};
  const sl_cpu_offload offload[] = {SL_CPU_OFFLOAD_INFER, SL_CPU_OFFLOAD_ON, SL_CPU_OFFLOAD_INFER, SL_CPU_OFFLOAD_ON};
  for (size_t b = 0; b < 4; b++) {
    sl_context_options co = {.size = sizeof co, .backend = backends[b], .world_size = 1};
    env e;
    assert_int_equal(sl_context_create(&co, &e.ctx), SL_OK);
    assert_int_equal(sl_source_open(e.ctx, path, &e.src), SL_OK);
    assert_int_equal(sl_plan_create(e.ctx, &e.plan), SL_OK);
    every_kth bind = {.ctx = e.ctx, .k = K};
    sl_load_options o = {.size = sizeof o, .cpu_offload = offload[b], .bind = bind_every_kth, .bind_user = &bind};
    sl_state *st = NULL;
    if (sl_load(e.ctx, e.plan, e.src, &o, &st) != SL_OK) fail_msg("%s: %s", backends[b], sl_context_errmsg(e.ctx));
    assert_int_equal(sl_state_count(st), N);
    assert_null(sl_state_find(st, "no such tensor"));
    assert_null(sl_state_find(st, ""));
    int device_memory = b == 2; /* sim's accelerator placement */
    size_t in_arena = 0, nown = 0;
    static const sl_tensor *own[N];
    for (int i = 0; i < N; i++) {
      const sl_tensor *t = sl_state_tensor(st, (size_t)i);
      assert_string_equal(t->name, names[i]);
      assert_ptr_equal(sl_state_find(st, names[i]), t); /* the name index, over 3,001 names */
      int arena = st->in_arena[i];
      in_arena += (size_t)arena;
      if (i % K == 0) {
        assert_true(t->caller_buffer);
        assert_ptr_equal(t->data, bind.bufs[i]);
        assert_false(arena);
      } else if (i == BIG || device_memory) {
        assert_false(arena);
      } else {
        assert_true(arena);
        assert_int_equal((uintptr_t)t->data % 64, 0);
        own[nown++] = t;
      }
      unsigned char *h = read_back(&e, t);
      for (uint64_t q = 0; q < t->nbytes; q++)
        if (h[q] != sl_test_pattern_byte(names[i], q)) fail_msg("%s: %s byte %llu wrong", backends[b], names[i], (unsigned long long)q);
      free(h);
    }
    assert_int_equal(in_arena, nown);
    if (device_memory) {
      assert_int_equal(st->narenas, 0);
    } else {
      /* ~5 MB of small shards: one block, not one per shard */
      assert_int_equal(st->narenas, 1);
      qsort(own, nown, sizeof *own, cmp_addr);
      for (size_t q = 1; q < nown; q++)
        assert_true((uintptr_t)own[q - 1]->data + (own[q - 1]->nbytes ? own[q - 1]->nbytes : 1) <= (uintptr_t)own[q]->data);
    }
    /* a lent shard of the arena outlives the owner's reference */
    sl_export *ex = NULL;
    assert_int_equal(sl_state_export(st, 1, NULL, &ex), SL_OK);
    sl_state_destroy(st);
    const sl_tensor *t = sl_export_tensor(ex);
    unsigned char *h = read_back(&e, t);
    for (uint64_t q = 0; q < t->nbytes; q++) assert_int_equal(h[q], sl_test_pattern_byte(names[1], q));
    free(h);
    sl_export_release(ex);
    for (int i = 0; i < N; i += K) sl_free(e.ctx, bind.where[i], 0, bind.bufs[i]);
    close_env(&e);
  }
  free(path);
}

/* Caller buffers carved from one allocation: SAME returns its start for every tensor (they
 * overlap), otherwise consecutive ranges that touch but do not overlap; the empty tensor is
 * given the start of the block either way (a zero-byte buffer overlaps nothing). */
#define ARENA 4096
typedef struct arena_binder {
  env *e;
  int same, calls;
  sl_device_kind where;
  unsigned char *base;
  size_t used;
} arena_binder;

static void *arena_take(arena_binder *a, const sl_tensor *t) {
  if (!a->base) {
    a->where = t->device;
    assert_int_equal(sl_alloc(a->e->ctx, a->where, 0, ARENA, (void **)&a->base), SL_OK);
    unsigned char fill[ARENA];
    memset(fill, 0xEE, sizeof fill);
    assert_int_equal(sl_copy_from_host(a->e->ctx, a->base, a->where, fill, ARENA), SL_OK);
  }
  assert_int_equal(t->device, a->where);
  a->calls++;
  if (a->same || !t->nbytes) return a->base;
  void *p = a->base + a->used;
  a->used += (size_t)t->nbytes;
  assert_true(a->used <= ARENA);
  return p;
}

static void *arena_bind(void *user, const sl_tensor *t) { return arena_take(user, t); }

static sl_status arena_bind_buffer(void *user, const sl_tensor *t, sl_binding *out) {
  out->data = arena_take(user, t);
  return SL_OK;
}

/* Overlapping caller buffers are refused before any byte moves, naming two of the tensors
 * (one buffer returned for every tensor used to load, leaving all but the last one wrong), on
 * host and device memory, through bind and bind_buffer; buffers that only touch load. */
static void test_overlapping_caller_buffers_refused(void **state) {
  const char *backends[] = {"cpu", "sim:strict"};
  for (size_t k = 0; k < 2; k++) {
    for (int via_buffer = 0; via_buffer < 2; via_buffer++) {
      env e;
      open_env(&e, backends[k]);
      arena_binder a = {.e = &e, .same = 1};
      sl_load_options o = {.size = sizeof o};
      if (via_buffer) o.bind_buffer = arena_bind_buffer, o.bind_buffer_user = &a;
      else o.bind = arena_bind, o.bind_user = &a;
      sl_state *st = NULL;
      assert_int_equal(sl_load(e.ctx, e.plan, e.src, &o, &st), SL_ERR_BUFFER);
      assert_null(st);
      assert_int_equal(a.calls, NT);
      const char *msg = sl_context_errmsg(e.ctx);
      /* the first two in file order share the start of the block */
      char want[256];
      snprintf(want, sizeof want, "%s and %s: the caller's buffers overlap on rank 0", tensors[0].name,
               tensors[1].name);
      if (!strstr(msg, want)) fail_msg("%s: expected '%s' in: %s", backends[k], want, msg);
      /* no byte of the buffer was written */
      unsigned char *h = malloc(ARENA);
      assert_int_equal(sl_copy_to_host(e.ctx, h, a.base, a.where, ARENA), SL_OK);
      assert_true(sl_test_all_bytes(h, ARENA, 0xEE));
      free(h);
      sl_free(e.ctx, a.where, 0, a.base);
      close_env(&e);

      /* adjacent ranges of one block: each tensor ends where the next begins */
      open_env(&e, backends[k]);
      arena_binder c = {.e = &e};
      if (via_buffer) o.bind_buffer_user = &c;
      else o.bind_user = &c;
      assert_int_equal(sl_load(e.ctx, e.plan, e.src, &o, &st), SL_OK);
      for (size_t i = 0; i < NT; i++) assert_true(sl_state_tensor(st, i)->caller_buffer);
      check_same_as_file(&e, st);
      sl_state_destroy(st);
      sl_free(e.ctx, c.where, 0, c.base);
      close_env(&e);
    }
  }
}

/* bind_buffer: a failure fails the load on every rank naming the tensor and the caller's
 * message, before any byte moves; pinned-ness is reported as it truly is. */
typedef struct buffer_binder {
  int calls, fail_at, pinned;
  void *bufs[NT];
} buffer_binder;

static sl_status bind_buffer_cb(void *user, const sl_tensor *t, sl_binding *out) {
  buffer_binder *b = user;
  assert_int_equal(out->size, sizeof *out);
  if (b->calls == b->fail_at) {
    snprintf(out->message, sizeof out->message, "no room left for %s in the model", t->name);
    return SL_ERR_NOMEM;
  }
  out->data = b->bufs[b->calls++] = malloc(t->nbytes ? t->nbytes : 1);
  out->pinned = b->pinned;
  return SL_OK;
}

static void test_bind_buffer_fails_and_reports_pinned(void **state) {
  env e;
  open_env(&e, "sim");
  sl_offload_policy pol = {SL_OFFLOAD_CPU, 1};
  assert_int_equal(sl_plan_set_offload_policy(e.plan, &pol), SL_OK);
  buffer_binder b = {.fail_at = 2};
  sl_load_options o = {.size = sizeof o, .bind_buffer = bind_buffer_cb, .bind_buffer_user = &b};
  sl_state *st = NULL;
  assert_int_equal(sl_load(e.ctx, e.plan, e.src, &o, &st), SL_ERR_NOMEM);
  assert_null(st);
  const char *msg = sl_context_errmsg(e.ctx);
  assert_non_null(strstr(msg, tensors[2].name));
  assert_non_null(strstr(msg, "no room left for"));
  assert_non_null(strstr(msg, "rank 0"));
  for (int i = 0; i < b.calls; i++) free(b.bufs[i]);
  /* a plain host buffer under a pinned CPU policy: registered with the backend for the state's
   * life and reported pinned; on cpu (no pinned memory) reported not pinned */
  for (int be = 0; be < 2; be++) {
    env f;
    open_env(&f, be ? "cpu" : "sim");
    assert_int_equal(sl_plan_set_offload_policy(f.plan, &pol), SL_OK);
    buffer_binder c = {.fail_at = -1};
    o.bind_buffer_user = &c;
    assert_int_equal(sl_load(f.ctx, f.plan, f.src, &o, &st), SL_OK);
    for (size_t i = 0; i < sl_state_count(st); i++) {
      const sl_tensor *t = sl_state_tensor(st, i);
      assert_true(t->caller_buffer);
      assert_int_equal(t->device, SL_DEVICE_CPU);
      assert_int_equal(t->pinned, be == 0 && t->nbytes > 0);
      assert_int_equal(t->device_type, 1); /* kDLCPU (sim has no pinned-host DLPack type) */
      if (be == 0 && t->nbytes) assert_int_equal(sl__sim_query(f.ctx->be_ctx, t->data), SL__SIM_PINNED);
    }
    check_same_as_file(&f, st);
    sl_state_destroy(st); /* unregisters before the caller frees */
    for (int i = 0; i < c.calls; i++) free(c.bufs[i]);
    close_env(&f);
  }
  close_env(&e);
}

/* A state may outlive its context: it keeps the backend alive and frees through it. DLPack
 * device types and ordinals are filled. */
static void test_state_outlives_context(void **state) {
  const char *backends[] = {"sim", "cpu"};
  for (int b = 0; b < 2; b++) {
    env e;
    open_env(&e, backends[b]);
    sl_state *st = NULL;
    assert_int_equal(sl_load(e.ctx, e.plan, e.src, NULL, &st), SL_OK);
    check_same_as_file(&e, st);
    const sl_tensor *t = sl_state_tensor(st, 0);
    assert_int_equal(t->device_type, b == 0 ? 12 : 1); /* sim device memory: kDLExtDev; cpu: kDLCPU */
    assert_int_equal(t->device_id, 0);
    close_env(&e); /* the context goes first */
    sl_state_destroy(st);
  }
}

/* The DLPack device type of a tensor is what the backend's table says (module.h,
 * dlpack_device_type and dlpack_pinned_type), not what its name suggests: a sim whose table
 * claims Level Zero's memory reports it, and one that is called cuda but gives none (a table
 * built before the members) reports kDLExtDev, never CUDA's. */
static void load_types(env *e, const sl_backend_ops *ops, int pinned, int *device_type) {
  const sl_backend_ops *was = e->ctx->be;
  e->ctx->be = e->ctx->beref->ops = ops;
  sl_offload_policy pol = {pinned ? SL_OFFLOAD_CPU : SL_OFFLOAD_NONE, pinned};
  assert_int_equal(sl_plan_set_offload_policy(e->plan, &pol), SL_OK);
  sl_state *st = NULL;
  assert_int_equal(sl_load(e->ctx, e->plan, e->src, NULL, &st), SL_OK);
  const sl_tensor *t = sl_state_tensor(st, 0);
  assert_int_equal(t->device, pinned ? SL_DEVICE_CPU : SL_DEVICE_ACCELERATOR);
  assert_int_equal(t->pinned, pinned);
  *device_type = t->device_type;
  sl_state_destroy(st);
  e->ctx->be = e->ctx->beref->ops = was;
}

static void test_dlpack_types_from_the_table(void **state) {
  env e;
  open_env(&e, "sim");
  static sl_backend_ops table;
  int type = 0;
  table = *e.ctx->be;
  table.dlpack_device_type = 14; /* kDLOneAPI */
  table.dlpack_pinned_type = 11; /* kDLROCMHost: any the table says */
  load_types(&e, &table, 0, &type);
  assert_int_equal(type, 14);
  load_types(&e, &table, 1, &type);
  assert_int_equal(type, 11);
  /* a table too short to hold them, whatever its name: not given */
  table.name = "cuda";
  table.size = (uint32_t)offsetof(sl_backend_ops, dlpack_device_type);
  load_types(&e, &table, 0, &type);
  assert_int_equal(type, 12); /* kDLExtDev */
  load_types(&e, &table, 1, &type);
  assert_int_equal(type, 1); /* kDLCPU */
  close_env(&e);
}

/* Why the backend: auto names what it beat and why, an explicit one says so. */
static void test_backend_reason(void **state) {
  env e;
  open_env(&e, "auto");
  const char *why = sl_context_backend_reason(e.ctx);
  assert_non_null(strstr(why, ": auto"));
  assert_non_null(strstr(why, "cuda: ")); /* absent here, or a probe's reason where built */
  assert_int_equal(strncmp(why, sl_context_backend_name(e.ctx), strlen(sl_context_backend_name(e.ctx))), 0);
  close_env(&e);
  open_env(&e, "sim");
  assert_string_equal(sl_context_backend_reason(e.ctx), "sim: asked for");
  close_env(&e);
}

static void test_context_errors(void **state) {
  sl_context *ctx = NULL;
  char err[256] = "";
  sl_context_options co = {.size = sizeof co, .backend = "simm", .world_size = 1, .errbuf = err,
                           .errbuf_size = sizeof err};
  assert_int_equal(sl_context_create(&co, &ctx), SL_ERR_INVALID);
  assert_null(ctx);
  assert_non_null(strstr(err, "unknown backend 'simm'"));
  assert_non_null(strstr(err, "(did you mean 'sim'?)"));
  co.backend = "cpu:strict"; /* only sim has a strict variant */
  assert_int_equal(sl_context_create(&co, &ctx), SL_ERR_INVALID);
  assert_null(ctx);
  assert_non_null(strstr(err, "unknown variant 'strict'"));
  co.backend = "cuda";
  sl_status s = sl_context_create(&co, &ctx);
  assert_true(s == SL_ERR_NO_DEVICE || s == SL_OK);
  sl_context_destroy(ctx);
  co.backend = "cpu";
  co.rank = 3;
  co.world_size = 2;
  assert_int_equal(sl_context_create(&co, &ctx), SL_ERR_INVALID);
  sl_context_destroy(NULL);
  sl_state_destroy(NULL);
  sl_plan_destroy(NULL);
  sl_source_destroy(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_null_options_infer_no_policy),
      cmocka_unit_test(test_contract_rows_on_sim),
      cmocka_unit_test(test_cpu_backend_has_no_pinned_memory),
      cmocka_unit_test(test_cpu_backend_has_one_device),
      cmocka_unit_test(test_older_smaller_options_mean_infer),
      cmocka_unit_test(test_cast_to_f32_and_tiny_staging),
      cmocka_unit_test(test_cast_f32_to_bf16),
      cmocka_unit_test(test_caller_buffers_filled_in_place),
      cmocka_unit_test(test_caller_buffer_wrong_memory_rejected),
      cmocka_unit_test(test_overlapping_caller_buffers_refused),
      cmocka_unit_test(test_caller_device_buffer_too_small_says_so),
      cmocka_unit_test(test_phase1_failure_leaves_caller_buffers_untouched),
      cmocka_unit_test(test_data_phase_failure_leaves_later_buffers_untouched),
      cmocka_unit_test(test_non_strict_plan_skips_and_reports),
      cmocka_unit_test(test_sgd_step_through_backend),
      cmocka_unit_test(test_context_errors),
      cmocka_unit_test(test_small_tensors_share_transfers),
      cmocka_unit_test(test_small_shards_share_blocks),
      cmocka_unit_test(test_bind_buffer_fails_and_reports_pinned),
      cmocka_unit_test(test_state_outlives_context),
      cmocka_unit_test(test_dlpack_types_from_the_table),
      cmocka_unit_test(test_backend_reason),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
