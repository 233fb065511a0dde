/* Sources in rank 0's memory (sl_source_open_memory): a state dict that exists only on rank 0
 * loads through the whole loader exactly as the same tensors do from a safetensors file —
 * worlds 1, 2 and 3 (an uneven dim 0), a BF16 -> F32 cast, CPU placement, bytes from pointers
 * and from the read callback — and its failures (the callback's, rank 0's validation, every-rank
 * reading, a plan entry it lacks) reach every rank with a message naming what failed. Multi-rank
 * cases are real processes talking real Gloo over loopback. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <unistd.h>

#include "testutil.h"

#define LABEL "state dict"

static uint16_t emb[7 * 5]; /* BF16, dim 0 uneven over 2 and 3 ranks */
static float norm[6] = {1.0f, -2.5f, 0.0f, 3.25f, 1e-3f, 42.0f};
static float scalar[1] = {0.5f};
static int64_t ids[5] = {1, -2, 3, 1LL << 40, 5};
static float head[4 * 3];
static float big[37 * 41]; /* more than a staging slot: read in several pieces at offsets */

static const sl_test_tensor file_tensors[] = {
    {"model.embed.weight", "BF16", 2, {7, 5}, emb},
    {"model.norm.weight", "F32", 1, {6}, norm},
    {"model.scale", "F32", 0, {0}, scalar},
    {"model.position_ids", "I64", 1, {5}, ids},
    {"model.empty", "F32", 2, {0, 3}, NULL},
    {"lm_head.weight", "F32", 2, {4, 3}, head},
    {"model.big.weight", "F32", 2, {37, 41}, big},
};
#define NT (sizeof file_tensors / sizeof file_tensors[0])

static char *dir, *ckpt;

static int setup(void **state) {
  for (size_t i = 0; i < 7 * 5; i++) emb[i] = (uint16_t)(0x3F80 + (i % 40) - 20 + (i & 1 ? 0x8000 : 0));
  for (size_t i = 0; i < 4 * 3; i++) head[i] = (float)i * 0.25f - 1.0f;
  for (size_t i = 0; i < 37 * 41; i++) big[i] = (float)i * 0.5f + 3.0f;
  dir = sl_test_dir("memory_source");
  ckpt = sl_test_path(dir, "model.safetensors");
  return sl_test_write_st(ckpt, file_tensors, NT, NULL);
}

static int teardown(void **state) {
  free(ckpt);
  free(dir);
  return 0;
}

/* The same tensors as the file, as a state dict: every tensor from a pointer, or those whose
 * bit in FROM_CALLBACK is set through the read callback. */
static void memory_table(sl_memory_tensor *m, unsigned from_callback) {
  for (size_t i = 0; i < NT; i++) {
    const sl_test_tensor *t = &file_tensors[i];
    memset(&m[i], 0, sizeof m[i]);
    m[i].size = sizeof m[i];
    m[i].name = t->name;
    m[i].dtype = sl_dtype_from_name(t->dtype);
    m[i].ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) m[i].shape[d] = t->shape[d];
    m[i].data = from_callback & (1u << i) ? NULL : t->data;
  }
}

/* The read callback: serves the file tensors' bytes, or fails on tensor FAIL_AT. */
typedef struct reader {
  long fail_at; /* index, or -1 */
  int calls;
  int concurrent, max_concurrent;
} reader;

static sl_status read_cb(void *user, size_t index, uint64_t offset, void *dst, size_t bytes, char *msg,
                         size_t msg_len) {
  reader *r = user;
  r->calls++;
  if (++r->concurrent > r->max_concurrent) r->max_concurrent = r->concurrent;
  sl_status s = SL_OK;
  if ((long)index == r->fail_at) {
    snprintf(msg, msg_len, "torch says: storage was freed");
    s = SL_ERR_IO;
  } else if (index >= NT || !file_tensors[index].data) {
    snprintf(msg, msg_len, "no such tensor %zu", index);
    s = SL_ERR_INVALID;
  } else {
    memcpy(dst, (const unsigned char *)file_tensors[index].data + offset, bytes);
  }
  r->concurrent--;
  return s;
}

/* ---- one rank: load from the file and from memory, compare ------------------------------ */

typedef struct job {
  char *rdzv;
  const char *label;      /* rank 0's label; NULL: LABEL */
  unsigned from_callback; /* tensors served by the callback */
  long fail_at;           /* tensor whose callback read fails, or -1 */
  sl_read_mode mode;
  const char *missing_entry; /* a strict plan entry the checkpoint lacks, or NULL */
  int bad;                   /* rank 0 passes a bad table: 1 duplicate, 2 dtype, 3 negative dim */
  sl_status expect;          /* what the memory load (or open) returns on every rank */
  const char *want[3];       /* substrings of every rank's message on failure */
  const char *want_peer;     /* and of every other rank's than 0 */
} job;

static sl_status make_plan(sl_context *ctx, const job *j, sl_plan **plan) {
  sl_status s = sl_plan_create(ctx, plan);
  if (s == SL_OK) s = sl_plan_add_rule(*plan, "model.embed.*", NULL, SL_DTYPE_F32); /* BF16 file -> F32 */
  if (s == SL_OK && j->missing_entry) {
    for (size_t i = 0; i < NT && s == SL_OK; i++) s = sl_plan_add_entry(*plan, file_tensors[i].name, NULL, SL_DTYPE_INVALID);
    if (s == SL_OK) s = sl_plan_add_entry(*plan, j->missing_entry, NULL, SL_DTYPE_INVALID);
    if (s == SL_OK) s = sl_plan_set_strict(*plan, 1);
  }
  return s;
}

static sl_status load(sl_context *ctx, const job *j, sl_source *src, sl_state **st) {
  sl_plan *plan = NULL;
  sl_status s = make_plan(ctx, j, &plan);
  /* CPU placement, and a small staging budget so the pipeline runs several transfers */
  sl_load_options lo = {.size = sizeof lo, .cpu_offload = SL_CPU_OFFLOAD_ON, .read_mode = j->mode,
                        .staging_bytes = 64};
  if (s == SL_OK) s = sl_load(ctx, plan, src, &lo, st);
  sl_plan_destroy(plan);
  return s;
}

/* Every tensor of A and B alike: names in order, geometry, dtype, placement, bytes. */
static int same_states(int rank, const sl_state *a, const sl_state *b) {
  SL_CHILD_CHECK(sl_state_count(a) == NT && sl_state_count(b) == NT, "rank %d: %zu and %zu tensors", rank,
                 sl_state_count(a), sl_state_count(b));
  for (size_t i = 0; i < NT; i++) {
    const sl_tensor *x = sl_state_tensor(a, i), *y = sl_state_tensor(b, i);
    SL_CHILD_CHECK(!strcmp(x->name, y->name), "rank %d: tensor %zu is %s / %s", rank, i, x->name, y->name);
    SL_CHILD_CHECK(x->dtype == y->dtype && x->file_dtype == y->file_dtype && x->ndim == y->ndim,
                   "rank %d: %s: dtype or ndim differ", rank, x->name);
    SL_CHILD_CHECK(x->device == SL_DEVICE_CPU && y->device == SL_DEVICE_CPU, "rank %d: %s not on the CPU", rank,
                   x->name);
    for (int d = 0; d < x->ndim; d++)
      SL_CHILD_CHECK(x->local_shape[d] == y->local_shape[d] && x->global_offset[d] == y->global_offset[d] &&
                         x->global_shape[d] == y->global_shape[d],
                     "rank %d: %s: geometry differs in dim %d", rank, x->name, d);
    SL_CHILD_CHECK(x->nbytes == y->nbytes, "rank %d: %s: %llu vs %llu bytes", rank, x->name,
                   (unsigned long long)x->nbytes, (unsigned long long)y->nbytes);
    SL_CHILD_CHECK(!x->nbytes || !memcmp(x->data, y->data, (size_t)x->nbytes), "rank %d: %s: bytes differ", rank,
                   x->name);
  }
  /* and the cast really happened: the embedding is F32, bf16 bits << 16 */
  const sl_tensor *e = sl_state_find(b, "model.embed.weight");
  SL_CHILD_CHECK(e && e->dtype == SL_DTYPE_F32 && e->file_dtype == SL_DTYPE_BF16, "rank %d: no cast", rank);
  for (int64_t k = 0; k < e->local_shape[0] * 5; k++) {
    uint32_t bits;
    memcpy(&bits, (const unsigned char *)e->data + 4 * k, 4);
    SL_CHILD_CHECK(bits == (uint32_t)emb[e->global_offset[0] * 5 + k] << 16, "rank %d: element %lld", rank,
                   (long long)k);
  }
  return 0;
}

static sl_status open_memory(sl_context *ctx, const job *j, reader *r, sl_source **src) {
  sl_memory_tensor m[NT];
  memory_table(m, j->from_callback);
  size_t n = NT;
  if (j->bad == 1) m[3].name = m[1].name;     /* duplicate name */
  if (j->bad == 2) m[2].dtype = (sl_dtype)99; /* no such dtype */
  if (j->bad == 3) m[5].shape[1] = -3;        /* negative dim */
  if (sl_context_rank(ctx) != 0) { /* only rank 0's table counts; the others pass none, and any label */
    const char *label = j->label ? j->label : sl_context_rank(ctx) == 1 ? "another label" : NULL;
    return sl_source_open_memory(ctx, label, NULL, 0, NULL, NULL, src);
  }
  return sl_source_open_memory(ctx, j->label ? j->label : LABEL, m, n, j->from_callback ? read_cb : NULL, r, src);
}

static int check_failure(int rank, const job *j, sl_status s, const char *msg) {
  fprintf(stderr, "rank %d: %s: %s\n", rank, sl_status_name(s), msg);
  if (j->expect != SL_ERR_PEER) /* PEER: any failure status on the other ranks */
    SL_CHILD_CHECK(s == j->expect || (rank != 0 && s != SL_OK), "rank %d: %s, expected %s", rank,
                   sl_status_name(s), sl_status_name(j->expect));
  SL_CHILD_CHECK(s != SL_OK, "rank %d succeeded", rank);
  for (int k = 0; k < 3 && j->want[k]; k++)
    SL_CHILD_CHECK(strstr(msg, j->want[k]) != NULL, "rank %d: message '%s' lacks '%s'", rank, msg, j->want[k]);
  if (rank != 0 && j->want_peer)
    SL_CHILD_CHECK(strstr(msg, j->want_peer) != NULL, "rank %d: message '%s' lacks '%s'", rank, msg, j->want_peer);
  return 0;
}

static int rank_main(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .world_size = world, .rank = rank,
                           .rendezvous = j->rdzv, .timeout_ms = 20000, .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(sl_context_create(&co, &ctx) == SL_OK, "rank %d: context: %s", rank, err);
  int rc = 1;
  sl_source *fsrc = NULL, *msrc = NULL;
  sl_state *fst = NULL, *mst = NULL;
  reader r = {.fail_at = j->fail_at};
  sl_status s = SL_OK;

  char file_msg[1024] = "";
  if (j->expect == SL_OK || j->missing_entry) {
    /* the reference: the same tensors from the file, same plan and options */
    SL_CHILD_CHECK(sl_source_open(ctx, ckpt, &fsrc) == SL_OK, "rank %d: open file: %s", rank, sl_context_errmsg(ctx));
    job jf = *j;
    jf.mode = SL_READ_RANK0;
    s = load(ctx, &jf, fsrc, &fst);
    if (j->missing_entry) {
      SL_CHILD_CHECK(s == j->expect, "rank %d: file load: %s", rank, sl_status_name(s));
      if (check_failure(rank, j, s, sl_context_errmsg(ctx))) goto out;
      snprintf(file_msg, sizeof file_msg, "%s", sl_context_errmsg(ctx));
    } else {
      SL_CHILD_CHECK(s == SL_OK, "rank %d: file load: %s", rank, sl_context_errmsg(ctx));
    }
  }

  s = open_memory(ctx, j, &r, &msrc);
  if (s == SL_OK) {
    /* what the source says of itself, on every rank: rank 0's table under rank 0's label */
    SL_CHILD_CHECK(sl_source_tensor_count(msrc) == NT, "rank %d: %zu tensors", rank, sl_source_tensor_count(msrc));
    const char *label = j->label ? j->label : LABEL;
    SL_CHILD_CHECK(sl_source_file_count(msrc) == 1 && !strcmp(sl_source_file_at(msrc, 0), label),
                   "rank %d: files %zu '%s'", rank, sl_source_file_count(msrc), sl_source_file_at(msrc, 0));
    SL_CHILD_CHECK(sl_source_metadata_count(msrc) == 0, "rank %d: metadata", rank);
    uint64_t off = 0;
    for (size_t i = 0; i < NT; i++) {
      const sl_source_tensor *t = sl_source_tensor_at(msrc, i);
      SL_CHILD_CHECK(!strcmp(t->name, file_tensors[i].name) && !strcmp(t->file, label) && t->file_offset == off,
                     "rank %d: tensor %zu: %s in %s at %llu", rank, i, t->name, t->file,
                     (unsigned long long)t->file_offset);
      const sl_source_tensor *ft = fsrc ? sl_source_find(fsrc, t->name) : NULL;
      SL_CHILD_CHECK(!fsrc || (ft && ft->nbytes == t->nbytes && ft->dtype == t->dtype), "rank %d: %s", rank, t->name);
      off += t->nbytes;
    }
    SL_CHILD_CHECK(sl_source_total_bytes(msrc) == off, "rank %d: total bytes", rank);
    s = load(ctx, j, msrc, &mst);
  }
  const char *msg = sl_context_errmsg(ctx);
  if (j->expect == SL_OK) {
    SL_CHILD_CHECK(s == SL_OK, "rank %d: memory load: %s: %s", rank, sl_status_name(s), msg);
    if (same_states(rank, fst, mst)) goto out;
    if (rank == 0 && j->from_callback) {
      SL_CHILD_CHECK(r.calls > 0, "rank 0: the callback was never called");
      SL_CHILD_CHECK(r.max_concurrent == 1, "rank 0: the callback ran %d at once", r.max_concurrent);
    }
    SL_CHILD_CHECK(rank == 0 || r.calls == 0, "rank %d called the read callback", rank);
  } else if (check_failure(rank, j, s, msg)) {
    goto out;
  } else if (j->missing_entry) {
    /* a plan entry the state dict lacks fails exactly as it does for the file */
    SL_CHILD_CHECK(!strcmp(msg, file_msg), "rank %d: '%s' from memory, '%s' from the file", rank, msg, file_msg);
  }
  rc = 0;
out:
  sl_state_destroy(fst);
  sl_state_destroy(mst);
  sl_source_destroy(fsrc);
  sl_source_destroy(msrc);
  sl_context_destroy(ctx);
  return rc;
}

static void run(job *j, int world, const char *sub) {
  j->rdzv = sl_test_rendezvous(sub);
  int codes[4];
  int killed = sl_test_spawn(world, rank_main, j, 60000, codes);
  assert_int_equal(killed, 0); /* nothing hung */
  for (int r = 0; r < world; r++) assert_int_equal(codes[r], 0);
  free(j->rdzv);
}

/* ---- the loads ------------------------------------------------------------------------ */

static void test_world1_matches_file(void **state) {
  job j = {.fail_at = -1, .expect = SL_OK};
  run(&j, 1, "mem_w1");
  j.from_callback = 0x7f; /* every tensor through the callback */
  run(&j, 1, "mem_w1_cb");
}

static void test_world2_matches_file(void **state) {
  job j = {.fail_at = -1, .expect = SL_OK};
  run(&j, 2, "mem_w2");
  j.from_callback = 0x61; /* embedding, head and big through the callback, the rest from pointers */
  run(&j, 2, "mem_w2_cb");
  /* a label that is a path rank 1 could read: it still reads nothing of its own */
  j.label = ckpt;
  run(&j, 2, "mem_w2_label");
}

static void test_world3_uneven_matches_file(void **state) {
  job j = {.fail_at = -1, .from_callback = 0x41, .expect = SL_OK};
  run(&j, 3, "mem_w3");
}

/* ---- failures on every rank ------------------------------------------------------------- */

static void test_callback_failure_reaches_every_rank(void **state) {
  for (int world = 1; world <= 2; world++) {
    job j = {.fail_at = 5, .from_callback = 0x21, .expect = SL_ERR_IO,
             .want = {"lm_head.weight", LABEL ": read of tensor", "storage was freed"}, .want_peer = "rank 0: "};
    run(&j, world, world == 1 ? "mem_cbfail1" : "mem_cbfail2");
  }
}

static void test_validation_reaches_every_rank(void **state) {
  job dup = {.fail_at = -1, .bad = 1, .expect = SL_ERR_FORMAT,
             .want = {"model.norm.weight", "appears twice (entries 1 and 3)", LABEL}};
  job dt = {.fail_at = -1, .bad = 2, .expect = SL_ERR_DTYPE, .want = {"model.scale", "dtype code 99", LABEL}};
  job neg = {.fail_at = -1, .bad = 3, .expect = SL_ERR_FORMAT, .want = {"lm_head.weight", "-3", LABEL}};
  job *jobs[] = {&dup, &dt, &neg};
  for (int k = 0; k < 3; k++) {
    run(jobs[k], 1, "mem_bad1");
    jobs[k]->want_peer = "rank 0: " LABEL; /* the other ranks say whose verdict it is */
    run(jobs[k], 3, "mem_bad3");
  }
}

static void test_every_rank_mode_refused(void **state) {
  for (int world = 1; world <= 2; world++) {
    job j = {.fail_at = -1, .mode = SL_READ_EVERY_RANK, .expect = SL_ERR_INVALID,
             .want = {LABEL, "in rank 0's memory", "read_mode rank0"}};
    run(&j, world, world == 1 ? "mem_every1" : "mem_every2");
  }
}

static void test_missing_plan_entry_fails_like_file(void **state) {
  job j = {.fail_at = -1, .missing_entry = "model.layers.0.weight", .expect = SL_ERR_MISSING,
           .want = {"model.layers.0.weight"}};
  run(&j, 2, "mem_missing");
}

/* ---- rank 0's table checks that need no ranks --------------------------------------------- */

static void test_table_checks(void **state) {
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .world_size = 1};
  sl_context *ctx = NULL;
  assert_int_equal(sl_context_create(&co, &ctx), SL_OK);
  sl_memory_tensor m[NT];
  sl_source *src = NULL;

  memory_table(m, 0);
  m[1].data = NULL; /* no bytes and no callback */
  assert_int_equal(sl_source_open_memory(ctx, LABEL, m, NT, NULL, NULL, &src), SL_ERR_INVALID);
  assert_non_null(strstr(sl_context_errmsg(ctx), "model.norm.weight"));
  assert_null(src);

  memory_table(m, 0);
  for (size_t i = 0; i < NT; i++) m[i].size = 8; /* not a size of the struct */
  assert_int_equal(sl_source_open_memory(ctx, LABEL, m, NT, NULL, NULL, &src), SL_ERR_INVALID);
  assert_non_null(strstr(sl_context_errmsg(ctx), "sizeof(sl_memory_tensor)"));

  memory_table(m, 0);
  m[4].name = "";
  assert_int_equal(sl_source_open_memory(ctx, LABEL, m, NT, NULL, NULL, &src), SL_ERR_FORMAT);
  assert_non_null(strstr(sl_context_errmsg(ctx), "tensor 4 has an empty name"));

  memory_table(m, 0);
  m[3].ndim = SL_MAX_DIMS + 1;
  assert_int_equal(sl_source_open_memory(ctx, LABEL, m, NT, NULL, NULL, &src), SL_ERR_UNSUPPORTED);
  assert_non_null(strstr(sl_context_errmsg(ctx), "model.position_ids"));

  memory_table(m, 0);
  m[5].ndim = 3;
  m[5].shape[0] = m[5].shape[1] = m[5].shape[2] = INT64_C(1) << 30; /* 2^90 elements */
  assert_int_equal(sl_source_open_memory(ctx, LABEL, m, NT, NULL, NULL, &src), SL_ERR_FORMAT);
  assert_non_null(strstr(sl_context_errmsg(ctx), "overflows"));

  /* NULL label: "memory"; an empty table is a valid (empty) source */
  assert_int_equal(sl_source_open_memory(ctx, NULL, NULL, 0, NULL, NULL, &src), SL_OK);
  assert_string_equal(sl_source_file_at(src, 0), "memory");
  assert_int_equal(sl_source_tensor_count(src), 0);
  sl_source_destroy(src);
  src = NULL;
  assert_int_equal(sl_source_open_memory(ctx, LABEL, NULL, 2, NULL, NULL, &src), SL_ERR_INVALID);
  assert_int_equal(sl_source_open_memory(ctx, LABEL, m, NT, NULL, NULL, NULL), SL_ERR_INVALID);
  sl_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table_checks),
      cmocka_unit_test(test_world1_matches_file),
      cmocka_unit_test(test_world2_matches_file),
      cmocka_unit_test(test_world3_uneven_matches_file),
      cmocka_unit_test(test_callback_failure_reaches_every_rank),
      cmocka_unit_test(test_validation_reaches_every_rank),
      cmocka_unit_test(test_every_rank_mode_refused),
      cmocka_unit_test(test_missing_plan_entry_fails_like_file),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
