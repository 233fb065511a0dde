/* The plan: placement parsing, default placements, rules and entries, dtype resolution,
 * JSON plan files, checks against a checkpoint, digests, geometry. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "internal.h"
#include "testutil.h"

/* ---- fixtures -------------------------------------------------------------------------- */

typedef struct fx {
  sl_context *ctx;
  sl_plan *plan;
  char *dir;
} fx;

static int setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  if (!f) return -1;
  sl_context_options o = {.size = sizeof o, .backend = "cpu", .rank = 0, .world_size = 1, .local_rank = 0};
  if (sl_context_create(&o, &f->ctx) != SL_OK) return -1;
  if (sl_plan_create(f->ctx, &f->plan) != SL_OK) return -1;
  f->dir = sl_test_dir("test_plan");
  if (!f->dir) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx *f = *state;
  sl_plan_destroy(f->plan);
  sl_context_destroy(f->ctx);
  free(f->dir);
  free(f);
  return 0;
}

static sl_source_tensor tensor(const char *name, sl_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  sl_source_tensor t = {.name = name, .dtype = dt, .ndim = ndim};
  int64_t d[3] = {d0, d1, d2};
  for (int i = 0; i < ndim && i < 3; i++) t.shape[i] = d[i];
  return t;
}

/* "[replicate, shard(0)]"-style text of a resolved tensor, for compact assertions. */
static const char *describe(fx *f, const sl_source_tensor *t) {
  static char buf[128];
  sl_status s = sl_plan_describe(f->plan, t, buf, sizeof buf);
  if (s != SL_OK) fail_msg("describe %s: %s: %s", t->name, sl_status_name(s), sl_context_errmsg(f->ctx));
  return buf;
}

static void assert_msg_has(fx *f, const char *needle) {
  const char *m = sl_context_errmsg(f->ctx);
  if (!strstr(m, needle)) fail_msg("message '%s' lacks '%s'", m, needle);
}

static char *write_file(fx *f, const char *name, const char *text) {
  char *p = sl_test_path(f->dir, name);
  assert_non_null(p);
  assert_int_equal(sl_test_write_bytes(p, text, strlen(text)), 0);
  return p;
}

/* ---- placement parsing ------------------------------------------------------------------- */

#define R_ {SL_REPLICATE, 0}
#define S_(d) {SL_SHARD, d}

static void test_parse_good(void **state) {
  (void)state;
  static const struct { const char *spec; int mesh; sl_mesh_placement want[4]; } ok[] = {
      {"shard(0)", 1, {S_(0)}},
      {"Shard(1)", 1, {S_(1)}},
      {"S(0)", 1, {S_(0)}},
      {"s(2)", 1, {S_(2)}},
      {" shard( -1 ) ", 1, {S_(-1)}},
      {"Shard(dim=2)", 1, {S_(2)}},
      {"replicate", 1, {R_}},
      {"Replicate()", 1, {R_}},
      {"R", 1, {R_}},
      {"[shard(0)]", 1, {S_(0)}},
      {"[replicate, shard(0)]", 2, {R_, S_(0)}},
      {"R,S(0)", 2, {R_, S_(0)}},
      {"(Replicate(), Shard(dim=0))", 2, {R_, S_(0)}},
      {"[S(1),R]", 2, {S_(1), R_}},
      {"shard(0)", 2, {S_(0), S_(0)}}, /* a single placement applies to every mesh dim */
      {"R", 3, {R_, R_, R_}},
      {"[R, R, R, S(-2)]", 4, {R_, R_, R_, S_(-2)}},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    sl_mesh_placement got[SL_MAX_MESH_DIMS];
    memset(got, 0x55, sizeof got);
    sl_status s = sl_placement_parse(ok[i].spec, ok[i].mesh, got);
    if (s != SL_OK) fail_msg("'%s' on a %d-D mesh: %s", ok[i].spec, ok[i].mesh, sl_status_name(s));
    for (int m = 0; m < ok[i].mesh; m++)
      if (got[m].kind != ok[i].want[m].kind || (got[m].kind == SL_SHARD && got[m].dim != ok[i].want[m].dim))
        fail_msg("'%s' mesh dim %d: kind %d dim %d", ok[i].spec, m, got[m].kind, got[m].dim);
  }
}

static void test_parse_bad(void **state) {
  (void)state;
  static const struct { const char *spec; int mesh; } bad[] = {
      {"", 1},          {"   ", 1},         {"shard", 1},       {"shard()", 1},   {"shard(x)", 1},
      {"shard(0", 1},   {"shard 0", 1},     {"[R, S(0)", 2},    {"R,", 2},        {",R", 2},
      {"[]", 1},        {"[R,,S(0)]", 2},   {"replicate(0)", 1}, {"sharded(0)", 1}, {"S(0) S(1)", 2},
      {"R,R,R,R,R", 4}, {"shard(999999999999)", 1},   {"[R, S(0)] x", 2}, {"shard(1.5)", 1}, {"partial", 1},
      {"[R, S(0)]", 1}, /* list of the wrong length */
      {"[shard(0)]", 2}, {"R,R,R", 2},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    sl_mesh_placement got[SL_MAX_MESH_DIMS];
    sl_status s = sl_placement_parse(bad[i].spec, bad[i].mesh, got);
    if (s != SL_ERR_PLAN) fail_msg("'%s' on %d-D mesh gave %s, want SL_ERR_PLAN", bad[i].spec, bad[i].mesh, sl_status_name(s));
  }
  sl_mesh_placement got[SL_MAX_MESH_DIMS];
  assert_int_equal(sl_placement_parse(NULL, 1, got), SL_ERR_INVALID);
  assert_int_equal(sl_placement_parse("R", 0, got), SL_ERR_INVALID);
  assert_int_equal(sl_placement_parse("R", SL_MAX_MESH_DIMS + 1, got), SL_ERR_INVALID);
  assert_int_equal(sl_placement_parse("R", 1, NULL), SL_ERR_INVALID);
}

/* ---- defaults, rules, entries ------------------------------------------------------------ */

static void test_defaults(void **state) {
  fx *f = *state;
  sl_source_tensor w = tensor("w", SL_DTYPE_F32, 2, 10, 4, 0), b = tensor("b", SL_DTYPE_F32, 1, 4, 0, 0),
                   s = tensor("step", SL_DTYPE_I64, 0, 0, 0, 0);
  assert_string_equal(describe(f, &w), "[shard(0)]"); /* FSDP2 on the default 1-D mesh */
  assert_string_equal(describe(f, &b), "[shard(0)]");
  assert_string_equal(describe(f, &s), "[replicate]"); /* 0-d: replicated */
  assert_int_equal(sl_plan_set_mesh(f->plan, 2, (int[]){2, 2}), SL_OK);
  assert_string_equal(describe(f, &w), "[replicate, shard(0)]"); /* HSDP */
  assert_string_equal(describe(f, &s), "[replicate, replicate]");
  assert_int_equal(sl_plan_set_mesh(f->plan, 3, (int[]){1, 2, 2}), SL_OK);
  assert_string_equal(describe(f, &w), "[replicate, replicate, shard(0)]");
  assert_int_equal(sl_plan_set_mesh(f->plan, 1, (int[]){4}), SL_OK);
  assert_string_equal(describe(f, &w), "[shard(0)]");
  /* a user default: applies to every tensor, but never shards a scalar */
  assert_int_equal(sl_plan_set_default_placement(f->plan, "shard(1)"), SL_OK);
  assert_string_equal(describe(f, &w), "[shard(1)]");
  assert_string_equal(describe(f, &s), "[replicate]");
  char buf[64];
  assert_int_equal(sl_plan_describe(f->plan, &b, buf, sizeof buf), SL_ERR_PLAN); /* 1-D has no dim 1 */
  assert_msg_has(f, "b: shard(1) from the default placement is out of range for a 1-d tensor");
  assert_int_equal(sl_plan_set_default_placement(f->plan, NULL), SL_OK); /* back to FSDP2 */
  assert_string_equal(describe(f, &b), "[shard(0)]");
  assert_int_equal(sl_plan_set_default_placement(f->plan, "shard(x)"), SL_ERR_PLAN);
  assert_msg_has(f, "'shard(x)' is not a placement; use shard(N) or replicate");
  /* offload policy: stored, pin normalised away without a CPU policy */
  const sl_offload_policy *p = sl__plan_policy(f->plan);
  assert_int_equal(p->kind, SL_OFFLOAD_NONE);
  assert_int_equal(sl_plan_set_offload_policy(f->plan, &(sl_offload_policy){SL_OFFLOAD_CPU, 1}), SL_OK);
  assert_int_equal(p->kind, SL_OFFLOAD_CPU);
  assert_int_equal(p->pin_memory, 1);
  assert_int_equal(sl_plan_set_offload_policy(f->plan, &(sl_offload_policy){SL_OFFLOAD_NONE, 1}), SL_OK);
  assert_int_equal(p->pin_memory, 0);
  assert_int_equal(sl_plan_set_offload_policy(f->plan, &(sl_offload_policy){(sl_offload_kind)7, 0}), SL_ERR_INVALID);
}

static void test_mesh(void **state) {
  fx *f = *state;
  int dims[SL_MAX_MESH_DIMS];
  assert_int_equal(sl__plan_mesh(f->plan, 6, dims), 1);
  assert_int_equal(dims[0], 6);
  assert_int_equal(sl__plan_mesh_explicit(f->plan, dims), 0);
  assert_int_equal(sl_plan_set_mesh(f->plan, 2, (int[]){2, 3}), SL_OK);
  assert_int_equal(sl__plan_mesh(f->plan, 6, dims), 2);
  assert_int_equal(dims[0], 2);
  assert_int_equal(dims[1], 3);
  assert_int_equal(sl_plan_set_mesh(f->plan, 2, (int[]){2, 0}), SL_ERR_PLAN);
  assert_int_equal(sl_plan_set_mesh(f->plan, 0, (int[]){2}), SL_ERR_PLAN);
  assert_int_equal(sl_plan_set_mesh(f->plan, SL_MAX_MESH_DIMS + 1, (int[]){1, 1, 1, 1, 1}), SL_ERR_PLAN);
  assert_int_equal(sl__plan_mesh(f->plan, 6, dims), 2); /* failures leave it alone */
  assert_int_equal(sl_plan_set_mesh(f->plan, 0, NULL), SL_OK); /* back to the default */
  assert_int_equal(sl__plan_mesh(f->plan, 5, dims), 1);
  assert_int_equal(dims[0], 5);
}

static void test_rules_order(void **state) {
  fx *f = *state;
  sl_source_tensor w = tensor("a.weight", SL_DTYPE_F32, 2, 8, 8, 0), b = tensor("a.bias", SL_DTYPE_F32, 1, 8, 0, 0),
                   n = tensor("model.layers.1.norm.weight", SL_DTYPE_F32, 1, 8, 0, 0);
  assert_int_equal(sl_plan_add_rule(f->plan, "*", "shard(-1)", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_rule(f->plan, "*.bias", "replicate", SL_DTYPE_INVALID), SL_OK);
  assert_string_equal(describe(f, &w), "[shard(1)]"); /* negative dim normalised */
  assert_string_equal(describe(f, &b), "[replicate]");
  assert_string_equal(describe(f, &n), "[shard(0)]");
  assert_int_equal(sl_plan_add_rule(f->plan, "a.*", "shard(0)", SL_DTYPE_INVALID), SL_OK); /* later wins */
  assert_string_equal(describe(f, &b), "[shard(0)]");
  assert_string_equal(describe(f, &w), "[shard(0)]");
  /* globs match the whole name */
  assert_int_equal(sl_plan_add_rule(f->plan, "layers.1*", "replicate", SL_DTYPE_INVALID), SL_OK);
  assert_string_equal(describe(f, &n), "[shard(0)]");
  assert_int_equal(sl_plan_add_rule(f->plan, "*layers.[0-9].*norm*", "replicate", SL_DTYPE_INVALID), SL_OK);
  assert_string_equal(describe(f, &n), "[replicate]");
  /* field by field: a dtype-only rule leaves the placement, a placement-only rule the dtype */
  assert_int_equal(sl_plan_add_rule(f->plan, "*", NULL, SL_DTYPE_BF16), SL_OK);
  assert_int_equal(sl_plan_add_rule(f->plan, "*.weight", "replicate", SL_DTYPE_INVALID), SL_OK);
  sl__resolved r;
  assert_int_equal(sl__plan_resolve(f->plan, &w, &r), SL_OK);
  assert_int_equal(r.placements[0].kind, SL_REPLICATE);
  assert_int_equal(r.dtype, SL_DTYPE_BF16);
  assert_int_equal(sl__plan_resolve(f->plan, &b, &r), SL_OK);
  assert_int_equal(r.placements[0].kind, SL_SHARD);
  assert_int_equal(r.placements[0].dim, 0);
  assert_int_equal(r.dtype, SL_DTYPE_BF16);
  /* a later rule's dtype wins too; a rule that does not match changes nothing */
  assert_int_equal(sl_plan_add_rule(f->plan, "a.w*", NULL, SL_DTYPE_F16), SL_OK);
  assert_int_equal(sl_plan_add_rule(f->plan, "b.*", NULL, SL_DTYPE_F64), SL_OK);
  assert_int_equal(sl__plan_resolve(f->plan, &w, &r), SL_OK);
  assert_int_equal(r.dtype, SL_DTYPE_F16);
  assert_int_equal(sl__plan_resolve(f->plan, &b, &r), SL_OK);
  assert_int_equal(r.dtype, SL_DTYPE_BF16);
  assert_int_equal(sl_plan_add_rule(f->plan, "", "replicate", SL_DTYPE_INVALID), SL_ERR_PLAN);
  assert_int_equal(sl_plan_add_rule(f->plan, NULL, "replicate", SL_DTYPE_INVALID), SL_ERR_PLAN);
  assert_int_equal(sl_plan_add_rule(f->plan, "*", "S(", SL_DTYPE_INVALID), SL_ERR_PLAN);
  assert_int_equal(sl_plan_add_rule(f->plan, "*", NULL, (sl_dtype)77), SL_ERR_INVALID);
}

static void test_entries_over_rules(void **state) {
  fx *f = *state;
  sl_source_tensor w = tensor("w", SL_DTYPE_F32, 2, 8, 8, 0), v = tensor("v", SL_DTYPE_F32, 2, 8, 8, 0);
  assert_int_equal(sl_plan_add_entry(f->plan, "w", "shard(1)", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_rule(f->plan, "*", "replicate", SL_DTYPE_F16), SL_OK); /* added later, still loses */
  assert_string_equal(describe(f, &w), "[shard(1)]");
  assert_string_equal(describe(f, &v), "[replicate]");
  sl__resolved r;
  assert_int_equal(sl__plan_resolve(f->plan, &w, &r), SL_OK);
  assert_int_equal(r.dtype, SL_DTYPE_F16); /* the entry sets no dtype: the rule's stands */
  /* adding the same entry again merges field by field */
  assert_int_equal(sl_plan_add_entry(f->plan, "w", NULL, SL_DTYPE_BF16), SL_OK);
  assert_int_equal(sl__plan_resolve(f->plan, &w, &r), SL_OK);
  assert_int_equal(r.dtype, SL_DTYPE_BF16);
  assert_int_equal(r.placements[0].kind, SL_SHARD);
  assert_int_equal(r.placements[0].dim, 1);
  assert_int_equal(sl_plan_add_entry(f->plan, "w", "R", SL_DTYPE_INVALID), SL_OK);
  assert_string_equal(describe(f, &w), "[replicate]");
  assert_int_equal(sl_plan_add_entry(f->plan, "", "R", SL_DTYPE_INVALID), SL_ERR_PLAN);
  assert_int_equal(sl_plan_add_entry(f->plan, "x", "shard(q)", SL_DTYPE_INVALID), SL_ERR_PLAN);
  /* many entries: the name index keeps working as it grows */
  char name[32];
  for (int i = 0; i < 1000; i++) {
    snprintf(name, sizeof name, "t.%d", i);
    assert_int_equal(sl_plan_add_entry(f->plan, name, i % 2 ? "shard(1)" : "replicate", SL_DTYPE_INVALID), SL_OK);
  }
  for (int i = 0; i < 1000; i++) {
    snprintf(name, sizeof name, "t.%d", i);
    sl_source_tensor t = tensor(name, SL_DTYPE_F32, 2, 4, 4, 0);
    assert_string_equal(describe(f, &t), i % 2 ? "[shard(1)]" : "[replicate]");
  }
}

static void test_dtype_resolution(void **state) {
  fx *f = *state;
  sl_source_tensor f32 = tensor("f32", SL_DTYPE_F32, 1, 4, 0, 0), f16 = tensor("f16", SL_DTYPE_F16, 1, 4, 0, 0),
                   i64 = tensor("pos_ids", SL_DTYPE_I64, 1, 4, 0, 0), f8 = tensor("q.w", SL_DTYPE_F8_E4M3, 1, 4, 0, 0),
                   bl = tensor("mask", SL_DTYPE_BOOL, 1, 4, 0, 0), f64 = tensor("f64", SL_DTYPE_F64, 1, 4, 0, 0);
  sl__resolved r;
  assert_int_equal(sl__plan_resolve(f->plan, &f32, &r), SL_OK);
  assert_int_equal(r.dtype, SL_DTYPE_F32); /* no param dtype: the file's */
  assert_int_equal(sl_plan_set_param_dtype(f->plan, SL_DTYPE_BF16), SL_OK);
  const struct { sl_source_tensor *t; sl_dtype want; } global[] = {
      {&f32, SL_DTYPE_BF16}, {&f16, SL_DTYPE_BF16}, {&f64, SL_DTYPE_BF16},
      {&i64, SL_DTYPE_I64},  {&f8, SL_DTYPE_F8_E4M3}, {&bl, SL_DTYPE_BOOL}, /* never cast */
  };
  for (size_t i = 0; i < sizeof global / sizeof global[0]; i++) {
    assert_int_equal(sl__plan_resolve(f->plan, global[i].t, &r), SL_OK);
    assert_int_equal(r.dtype, global[i].want);
  }
  assert_int_equal(sl_plan_set_param_dtype(f->plan, SL_DTYPE_I64), SL_ERR_DTYPE);
  assert_int_equal(sl_plan_set_param_dtype(f->plan, SL_DTYPE_F8_E5M2), SL_ERR_DTYPE);
  /* explicit dtypes */
  assert_int_equal(sl_plan_add_entry(f->plan, "f32", NULL, SL_DTYPE_F64), SL_OK);
  assert_int_equal(sl__plan_resolve(f->plan, &f32, &r), SL_OK);
  assert_int_equal(r.dtype, SL_DTYPE_F64); /* entry beats param dtype */
  assert_int_equal(sl_plan_add_entry(f->plan, "pos_ids", NULL, SL_DTYPE_I64), SL_OK);
  assert_int_equal(sl__plan_resolve(f->plan, &i64, &r), SL_OK); /* asking for what it is: fine */
  assert_int_equal(r.dtype, SL_DTYPE_I64);
  assert_int_equal(sl_plan_add_entry(f->plan, "q.w", NULL, SL_DTYPE_BF16), SL_OK);
  assert_int_equal(sl__plan_resolve(f->plan, &f8, &r), SL_ERR_DTYPE);
  assert_msg_has(f, "q.w: its plan entry asks for dtype BF16 but the checkpoint holds F8_E4M3");
  assert_int_equal(sl_plan_add_rule(f->plan, "*mask*", NULL, SL_DTYPE_F32), SL_OK);
  assert_int_equal(sl__plan_resolve(f->plan, &bl, &r), SL_ERR_DTYPE);
  assert_msg_has(f, "mask: rule 1 ('*mask*') asks for dtype F32 but the checkpoint holds BOOL");
  assert_int_equal(sl_plan_add_rule(f->plan, "f16", NULL, SL_DTYPE_F8_E5M2), SL_OK);
  assert_int_equal(sl__plan_resolve(f->plan, &f16, &r), SL_ERR_DTYPE); /* nothing casts to F8 */
  assert_msg_has(f, "f16");
  assert_int_equal(sl_plan_set_param_dtype(f->plan, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl__plan_resolve(f->plan, &f64, &r), SL_OK);
  assert_int_equal(r.dtype, SL_DTYPE_F64);
}

static void test_dims_out_of_range(void **state) {
  fx *f = *state;
  sl_source_tensor w = tensor("model.w", SL_DTYPE_F32, 2, 8, 6, 0), x = tensor("x", SL_DTYPE_F32, 3, 2, 3, 4),
                   s = tensor("scale", SL_DTYPE_F32, 0, 0, 0, 0);
  assert_int_equal(sl_plan_add_rule(f->plan, "*", "shard(-2)", SL_DTYPE_INVALID), SL_OK);
  assert_string_equal(describe(f, &w), "[shard(0)]");
  assert_string_equal(describe(f, &x), "[shard(1)]");
  sl__resolved r;
  assert_int_equal(sl__plan_resolve(f->plan, &s, &r), SL_ERR_PLAN); /* a rule sharding a scalar */
  assert_msg_has(f, "scale: rule 1 ('*') shards a 0-d (scalar) tensor");
  assert_int_equal(sl_plan_add_entry(f->plan, "model.w", "shard(2)", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl__plan_resolve(f->plan, &w, &r), SL_ERR_PLAN);
  assert_msg_has(f, "model.w: shard(2) from its plan entry is out of range for a 2-d tensor of shape [8, 6]");
  assert_int_equal(sl_plan_add_entry(f->plan, "model.w", "shard(-3)", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl__plan_resolve(f->plan, &w, &r), SL_ERR_PLAN);
  assert_msg_has(f, "shard(-3)");
  assert_int_equal(sl_plan_add_entry(f->plan, "model.w", "shard(-1)", SL_DTYPE_INVALID), SL_OK);
  assert_string_equal(describe(f, &w), "[shard(1)]");
  /* a dim past any tensor's rank is still a placement: the tensor it meets says it is out of
   * range (naming the tensor, the dim and its ndim), not "cannot parse" */
  sl_mesh_placement pl[SL_MAX_MESH_DIMS];
  assert_int_equal(sl_placement_parse("shard(99)", 1, pl), SL_OK);
  assert_int_equal(pl[0].dim, 99);
  assert_int_equal(sl_plan_add_rule(f->plan, "x", "shard(99)", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl__plan_resolve(f->plan, &x, &r), SL_ERR_PLAN);
  assert_msg_has(f, "x: shard(99) from rule 2 ('x') is out of range for a 3-d tensor of shape [2, 3, 4]");
}

static void test_list_lengths(void **state) {
  fx *f = *state;
  sl_source_tensor w = tensor("w", SL_DTYPE_F32, 2, 8, 6, 0);
  /* no mesh yet: a 2-list is kept for a mesh to come, and fails if none comes */
  assert_int_equal(sl_plan_add_rule(f->plan, "w", "[R, S(1)]", SL_DTYPE_INVALID), SL_OK);
  sl__resolved r;
  assert_int_equal(sl__plan_resolve(f->plan, &w, &r), SL_ERR_PLAN);
  assert_msg_has(f, "w: placement '[replicate, shard(1)]' from rule 1 ('w') has 2 placements but the mesh has 1 dim");
  assert_int_equal(sl_plan_set_mesh(f->plan, 2, (int[]){2, 2}), SL_OK);
  assert_string_equal(describe(f, &w), "[replicate, shard(1)]");
  /* a mesh that does not fit the stored list is refused, naming the rule */
  assert_int_equal(sl_plan_set_mesh(f->plan, 3, (int[]){2, 2, 2}), SL_ERR_PLAN);
  assert_msg_has(f, "rule 1 ('w')");
  assert_string_equal(describe(f, &w), "[replicate, shard(1)]");
  /* with a mesh set, a wrong list fails at once */
  assert_int_equal(sl_plan_add_rule(f->plan, "*", "[R, R, R]", SL_DTYPE_INVALID), SL_ERR_PLAN);
  assert_msg_has(f, "has 3 placements but mesh 2x2 has 2 dims");
  assert_int_equal(sl_plan_add_entry(f->plan, "w", "[S(0)]", SL_DTYPE_INVALID), SL_ERR_PLAN);
  assert_int_equal(sl_plan_set_default_placement(f->plan, "[S(0)]"), SL_ERR_PLAN);
  assert_int_equal(sl_plan_add_entry(f->plan, "w", "S(0)", SL_DTYPE_INVALID), SL_OK); /* single: every dim */
  assert_string_equal(describe(f, &w), "[shard(0), shard(0)]");
}

static void test_describe_and_geometry(void **state) {
  fx *f = *state;
  sl_source_tensor w = tensor("w", SL_DTYPE_F32, 2, 10, 6, 0), s = tensor("s", SL_DTYPE_F32, 0, 0, 0, 0);
  char small[8];
  assert_int_equal(sl_plan_describe(f->plan, &w, small, sizeof small), SL_ERR_INVALID);
  assert_int_equal(sl_plan_set_mesh(f->plan, 2, (int[]){2, 2}), SL_OK);
  assert_int_equal(sl_plan_set_param_dtype(f->plan, SL_DTYPE_BF16), SL_OK);
  sl_shard_geometry g = {.size = sizeof g};
  /* [replicate, shard(0)]: rows split over the second mesh dim; coordinates are row-major */
  static const int64_t rows[4] = {5, 5, 5, 5}, offs[4] = {0, 5, 0, 5};
  for (int rank = 0; rank < 4; rank++) {
    assert_int_equal(sl_plan_geometry(f->plan, &w, rank, 4, &g), SL_OK);
    assert_int_equal(g.ndim, 2);
    assert_int_equal(g.local_shape[0], rows[rank]);
    assert_int_equal(g.local_shape[1], 6);
    assert_int_equal(g.global_offset[0], offs[rank]);
    assert_int_equal(g.global_offset[1], 0);
    assert_int_equal(g.dtype, SL_DTYPE_BF16);
    assert_int_equal(g.replicated, 0);
    assert_int_equal(g.nbytes, (uint64_t)rows[rank] * 6 * 2);
  }
  /* [shard(0), shard(0)] re-chunks: 10 rows on 2x2 give 3,2,3,2 (docs/DESIGN.md#geometry) */
  assert_int_equal(sl_plan_set_default_placement(f->plan, "shard(0)"), SL_OK);
  static const int64_t rows2[4] = {3, 2, 3, 2}, offs2[4] = {0, 3, 5, 8};
  for (int rank = 0; rank < 4; rank++) {
    assert_int_equal(sl_plan_geometry(f->plan, &w, rank, 4, &g), SL_OK);
    assert_int_equal(g.local_shape[0], rows2[rank]);
    assert_int_equal(g.global_offset[0], offs2[rank]);
  }
  assert_int_equal(sl_plan_geometry(f->plan, &s, 3, 4, &g), SL_OK);
  assert_int_equal(g.ndim, 0);
  assert_int_equal(g.replicated, 1);
  assert_int_equal(g.nbytes, 2);
  assert_int_equal(sl_plan_geometry(f->plan, &w, 0, 8, &g), SL_ERR_PLAN);
  assert_msg_has(f, "mesh 2x2 has 4 ranks but the job has 8");
  assert_int_equal(sl_plan_geometry(f->plan, &w, 4, 4, &g), SL_ERR_INVALID);
  assert_int_equal(sl_plan_geometry(f->plan, &w, -1, 4, &g), SL_ERR_INVALID);
  /* the default mesh follows the world given */
  assert_int_equal(sl_plan_set_mesh(f->plan, 0, NULL), SL_OK);
  assert_int_equal(sl_plan_geometry(f->plan, &w, 3, 4, &g), SL_OK);
  assert_int_equal(g.local_shape[0], 1); /* 10 over 4: 3,3,3,1 */
  assert_int_equal(g.global_offset[0], 9);
  int dims[SL_MAX_MESH_DIMS];
  assert_int_equal(sl_plan_mesh(f->plan, 4, dims), 1);
  assert_int_equal(dims[0], 4);
  /* without entries every tensor loads; once the plan names some, the others are skipped */
  assert_int_equal(g.skipped, 0);
  assert_int_equal(sl_plan_add_entry(f->plan, "s", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_geometry(f->plan, &w, 3, 4, &g), SL_OK);
  assert_int_equal(g.skipped, 1);
  assert_int_equal(sl_plan_geometry(f->plan, &s, 3, 4, &g), SL_OK);
  assert_int_equal(g.skipped, 0);
}

/* ---- JSON plan files --------------------------------------------------------------------- */

static void test_json_good(void **state) {
  fx *f = *state;
  /* rules before mesh in the file: the mesh is applied first anyway */
  char *p = write_file(f, "plan.json",
                       "{\"rules\": [{\"match\": \"*norm*\", \"placement\": \"replicate\", \"dtype\": \"F32\"},\n"
                       "            {\"match\": \"*.bias\", \"placement\": \"[R, S(0)]\"}],\n"
                       " \"mesh\": [2, 4], \"offload_policy\": \"cpu-pinned\", \"param_dtype\": \"bfloat16\",\n"
                       " \"default_placement\": \"[replicate, shard(0)]\", \"strict\": true,\n"
                       " \"tensors\": {\"model.embed.weight\": {\"placement\": \"shard(1)\", \"dtype\": \"BF16\"},\n"
                       "             \"lm_head.weight\": {}, \"final_norm.weight\": null}}");
  assert_int_equal(sl_plan_load_json(f->plan, p), SL_OK);
  int dims[4];
  assert_int_equal(sl__plan_mesh(f->plan, 8, dims), 2);
  assert_int_equal(dims[0] * 10 + dims[1], 24);
  assert_int_equal(sl__plan_policy(f->plan)->kind, SL_OFFLOAD_CPU);
  assert_int_equal(sl__plan_policy(f->plan)->pin_memory, 1);
  sl_source_tensor e = tensor("model.embed.weight", SL_DTYPE_F32, 2, 8, 8, 0),
                   n = tensor("final_norm.weight", SL_DTYPE_F16, 1, 8, 0, 0),
                   h = tensor("lm_head.weight", SL_DTYPE_F32, 2, 8, 8, 0);
  assert_string_equal(describe(f, &e), "[shard(1), shard(1)]");
  assert_string_equal(describe(f, &n), "[replicate, replicate]");
  assert_string_equal(describe(f, &h), "[replicate, shard(0)]");
  sl__resolved r;
  assert_int_equal(sl__plan_resolve(f->plan, &n, &r), SL_OK);
  assert_int_equal(r.dtype, SL_DTYPE_F32);
  assert_int_equal(sl__plan_resolve(f->plan, &h, &r), SL_OK);
  assert_int_equal(r.dtype, SL_DTYPE_BF16);

  /* the same plan through the API digests the same */
  sl_plan *q = NULL;
  assert_int_equal(sl_plan_create(f->ctx, &q), SL_OK);
  assert_int_equal(sl_plan_set_mesh(q, 2, (int[]){2, 4}), SL_OK);
  assert_int_equal(sl_plan_set_offload_policy(q, &(sl_offload_policy){SL_OFFLOAD_CPU, 1}), SL_OK);
  assert_int_equal(sl_plan_set_param_dtype(q, SL_DTYPE_BF16), SL_OK);
  assert_int_equal(sl_plan_set_default_placement(q, "R,S(0)"), SL_OK);
  assert_int_equal(sl_plan_set_strict(q, 1), SL_OK);
  assert_int_equal(sl_plan_add_rule(q, "*norm*", "R", SL_DTYPE_F32), SL_OK);
  assert_int_equal(sl_plan_add_rule(q, "*.bias", "[replicate, shard(0)]", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_entry(q, "lm_head.weight", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_entry(q, "final_norm.weight", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_entry(q, "model.embed.weight", "Shard(1)", SL_DTYPE_BF16), SL_OK);
  char *a = sl__plan_canonical(f->plan), *b = sl__plan_canonical(q);
  assert_non_null(a);
  assert_non_null(b);
  assert_string_equal(a, b);
  assert_true(sl__plan_digest(f->plan) == sl__plan_digest(q));
  free(a);
  free(b);
  sl_plan_destroy(q);
  free(p);
}

static void test_json_policies_and_merge(void **state) {
  fx *f = *state;
  char *p = write_file(f, "p1.json", "{\"offload_policy\": {\"kind\": \"cpu\", \"pin_memory\": false}}");
  assert_int_equal(sl_plan_load_json(f->plan, p), SL_OK);
  assert_int_equal(sl__plan_policy(f->plan)->kind, SL_OFFLOAD_CPU);
  assert_int_equal(sl__plan_policy(f->plan)->pin_memory, 0);
  free(p);
  p = write_file(f, "p2.json", "{\"offload_policy\": \"none\"}");
  assert_int_equal(sl_plan_load_json(f->plan, p), SL_OK);
  assert_int_equal(sl__plan_policy(f->plan)->kind, SL_OFFLOAD_NONE);
  free(p);
  p = write_file(f, "p3.json", "{\"offload_policy\": \"cpu\"}");
  assert_int_equal(sl_plan_load_json(f->plan, p), SL_OK);
  assert_int_equal(sl__plan_policy(f->plan)->kind, SL_OFFLOAD_CPU);
  free(p);
  /* a file adds to a plan: its rules come after the plan's, its settings win, the rest stays */
  sl_source_tensor w = tensor("w", SL_DTYPE_F32, 2, 8, 8, 0);
  assert_int_equal(sl_plan_set_mesh(f->plan, 2, (int[]){1, 2}), SL_OK);
  assert_int_equal(sl_plan_add_rule(f->plan, "*", "shard(1)", SL_DTYPE_INVALID), SL_OK);
  p = write_file(f, "p4.json", "{\"rules\": [{\"match\": \"w\", \"placement\": \"[R, S(0)]\"}]}");
  assert_int_equal(sl_plan_load_json(f->plan, p), SL_OK); /* checked against the plan's 2-D mesh */
  assert_string_equal(describe(f, &w), "[replicate, shard(0)]");
  assert_int_equal(sl__plan_policy(f->plan)->kind, SL_OFFLOAD_CPU);
  free(p);
  /* a file mesh that the plan's own placements do not fit: refused, plan unchanged */
  uint64_t before = sl__plan_digest(f->plan);
  p = write_file(f, "p5.json", "{\"mesh\": [2, 2, 2], \"strict\": true}");
  assert_int_equal(sl_plan_load_json(f->plan, p), SL_ERR_PLAN);
  assert_msg_has(f, p);
  assert_true(sl__plan_digest(f->plan) == before);
  free(p);
}

static void expect_json_error(fx *f, const char *text, sl_status want, const char *needle) {
  char *p = write_file(f, "bad.json", text);
  uint64_t before = sl__plan_digest(f->plan);
  sl_status s = sl_plan_load_json(f->plan, p);
  if (s != want) fail_msg("%s: got %s (%s), want %s", text, sl_status_name(s), sl_context_errmsg(f->ctx), sl_status_name(want));
  const char *m = sl_context_errmsg(f->ctx);
  if (strncmp(m, p, strlen(p)) != 0) fail_msg("message '%s' does not start with the file name", m);
  if (!strstr(m, needle)) fail_msg("message '%s' lacks '%s'", m, needle);
  if (sl__plan_digest(f->plan) != before) fail_msg("%s: a failed load changed the plan", text);
  free(p);
}

static void test_json_bad(void **state) {
  fx *f = *state;
  assert_int_equal(sl_plan_add_rule(f->plan, "*", "replicate", SL_DTYPE_INVALID), SL_OK);
  /* unknown keys, at every level */
  expect_json_error(f, "{\"mseh\": [2]}", SL_ERR_PLAN, "unknown key 'mseh' (the plan's keys are: mesh, ");
  expect_json_error(f, "{\"rules\": [{\"match\": \"*\", \"placment\": \"R\"}]}", SL_ERR_PLAN,
                    "rules[0]: unknown key 'placment' (a rule's keys are: match, placement, dtype)");
  expect_json_error(f, "{\"tensors\": {\"a.b\": {\"dtpye\": \"F32\"}}}", SL_ERR_PLAN, "tensors[\"a.b\"]: unknown key 'dtpye'");
  expect_json_error(f, "{\"offload_policy\": {\"kind\": \"cpu\", \"pin\": true}}", SL_ERR_PLAN,
                    "offload_policy: unknown key 'pin'");
  /* bad placements and dtypes */
  expect_json_error(f,
                    "{\"rules\": [{\"match\": \"a\"}, {\"match\": \"b\", \"placement\": \"R\"},\n"
                    "            {\"match\": \"c\", \"placement\": \"shard(x)\"}]}",
                    SL_ERR_PLAN, ": rules[2].placement: 'shard(x)' is not a placement; use shard(N) or replicate");
  expect_json_error(f, "{\"default_placement\": \"sharded\"}", SL_ERR_PLAN, "default_placement: 'sharded' is not a placement");
  expect_json_error(f, "{\"tensors\": {\"w\": {\"placement\": \"S(\"}}}", SL_ERR_PLAN, "tensors[\"w\"].placement: 'S(' is not");
  expect_json_error(f, "{\"mesh\": [2, 4], \"default_placement\": \"[R, S(0), S(1)]\"}", SL_ERR_PLAN,
                    "default_placement: placement '[R, S(0), S(1)]' has 3 placements but mesh 2x4 has 2 dims");
  expect_json_error(f, "{\"param_dtype\": \"bf17\"}", SL_ERR_DTYPE, "param_dtype: 'bf17' is not a dtype");
  expect_json_error(f, "{\"param_dtype\": \"int64\"}", SL_ERR_DTYPE, "param_dtype: param dtype I64 cannot be cast to");
  expect_json_error(f, "{\"rules\": [{\"match\": \"*\", \"dtype\": \"float99\"}]}", SL_ERR_DTYPE, "rules[0].dtype: 'float99'");
  expect_json_error(f, "{\"tensors\": {\"w\": {\"dtype\": 16}}}", SL_ERR_PLAN, "tensors[\"w\"].dtype: expected a string");
  /* wrong types */
  expect_json_error(f, "{\"mesh\": \"2x4\"}", SL_ERR_PLAN, "mesh: expected an array of 1 to 4 positive integers");
  expect_json_error(f, "{\"mesh\": []}", SL_ERR_PLAN, "mesh: expected an array");
  expect_json_error(f, "{\"mesh\": [1, 1, 1, 1, 1]}", SL_ERR_PLAN, "got an array of 5");
  expect_json_error(f, "{\"mesh\": [2, 0]}", SL_ERR_PLAN, "mesh[1]: expected a positive integer");
  expect_json_error(f, "{\"mesh\": [2, \"4\"]}", SL_ERR_PLAN, "mesh[1]: expected a positive integer");
  expect_json_error(f, "{\"strict\": \"yes\"}", SL_ERR_PLAN, "strict: expected true or false, got a string");
  expect_json_error(f, "{\"strict\": 1}", SL_ERR_PLAN, "strict: expected true or false, got an integer");
  expect_json_error(f, "{\"rules\": {\"match\": \"*\"}}", SL_ERR_PLAN, "rules: expected an array");
  expect_json_error(f, "{\"rules\": [\"*\"]}", SL_ERR_PLAN, "rules[0]: expected an object");
  expect_json_error(f, "{\"rules\": [{\"placement\": \"R\"}]}", SL_ERR_PLAN, "rules[0]: a rule needs \"match\"");
  expect_json_error(f, "{\"rules\": [{\"match\": 3}]}", SL_ERR_PLAN, "rules[0].match: expected a non-empty string");
  expect_json_error(f, "{\"rules\": [{\"match\": \"*\", \"placement\": [\"R\"]}]}", SL_ERR_PLAN,
                    "rules[0].placement: expected a string");
  expect_json_error(f, "{\"tensors\": [\"a\"]}", SL_ERR_PLAN, "tensors: expected an object");
  expect_json_error(f, "{\"tensors\": {\"a\": \"R\"}}", SL_ERR_PLAN, "tensors[\"a\"]: expected an object");
  expect_json_error(f, "{\"offload_policy\": 5}", SL_ERR_PLAN, "offload_policy: expected a string or an object");
  expect_json_error(f, "{\"offload_policy\": \"gpu\"}", SL_ERR_PLAN, "offload_policy: 'gpu' is not an offload policy");
  expect_json_error(f, "{\"offload_policy\": {\"pin_memory\": true}}", SL_ERR_PLAN, "offload_policy.kind: expected");
  expect_json_error(f, "{\"offload_policy\": {\"kind\": \"cpu\", \"pin_memory\": 1}}", SL_ERR_PLAN,
                    "offload_policy.pin_memory: expected true or false");
  /* not a plan at all */
  expect_json_error(f, "[1, 2]", SL_ERR_PLAN, "holds one JSON object");
  expect_json_error(f, "{\"mesh\": [2,]}", SL_ERR_PLAN, ":1:");
  expect_json_error(f, "{\"strict\": true, \"strict\": false}", SL_ERR_PLAN, "duplicate");
  char *missing = sl_test_path(f->dir, "nope.json");
  assert_int_equal(sl_plan_load_json(f->plan, missing), SL_ERR_IO);
  assert_msg_has(f, missing);
  free(missing);
  assert_int_equal(sl_plan_load_json(f->plan, NULL), SL_ERR_INVALID);
  /* a read that fails is said as such, not as text cut short ("'[' or '{' expected") */
  assert_int_equal(sl_plan_load_json(f->plan, f->dir), SL_ERR_IO);
  assert_msg_has(f, "cannot read the plan file: ");
  assert_msg_has(f, strerror(EISDIR));
}

/* Running out of memory at any point of jansson's parse of a valid plan file is reported as out
 * of memory, naming the file and its size, and leaves the plan as it was; never as "not valid
 * JSON" (which, with jansson's empty error, read "PATH:-1:-1: not valid JSON: ", or a syntax
 * error where a string's copy could not be allocated). Every allocation is made to fail in
 * turn, until the parse needs none that fails. */
static void test_json_out_of_memory_every_allocation(void **state) {
  fx *f = *state;
  const char *text = "{\"mesh\": [2], \"default_placement\": \"shard(0)\",\n"
                     " \"rules\": [{\"match\": \"*.input_layernorm.weight\", \"placement\": \"replicate\", \"dtype\": \"F32\"}],\n"
                     " \"tensors\": {\"model.embed_tokens.weight\": {\"placement\": \"shard(1)\"}, \"lm_head.weight\": {}}}";
  char *p = write_file(f, "nomem.json", text);
  char want[PATH_MAX + 96];
  snprintf(want, sizeof want, "%s: out of memory parsing its %zu-byte plan; free memory or raise", p, strlen(text));
  uint64_t before = sl__plan_digest(f->plan);
  long budget = 0;
  for (;; budget++) {
    sl_test_json_alloc_budget(budget);
    sl_status s = sl_plan_load_json(f->plan, p);
    sl_test_json_alloc_budget(-1);
    if (s == SL_OK) break;
    const char *m = sl_context_errmsg(f->ctx);
    if (s != SL_ERR_NOMEM || strncmp(m, want, strlen(want)) != 0)
      fail_msg("allocation %ld of the plan's parse failed: got %s '%s', want SL_ERR_NOMEM '%s...'", budget,
               sl_status_name(s), m, want);
    if (sl__plan_digest(f->plan) != before) fail_msg("allocation %ld: a failed load changed the plan", budget);
  }
  assert_true(budget > 10); /* the file's parse took that many allocations, each failed once */
  sl_source_tensor e = tensor("model.embed_tokens.weight", SL_DTYPE_F32, 2, 8, 8, 0);
  assert_string_equal(describe(f, &e), "[shard(1)]");
  free(p);
}

/* ---- checks against a checkpoint ---------------------------------------------------------- */

static sl_source *open_source(fx *f) {
  static const sl_test_tensor ts[] = {
      {"a", "F32", 2, {4, 4}, NULL}, {"b", "BF16", 1, {4}, NULL}, {"c", "I64", 1, {3}, NULL},
      {"d", "F16", 0, {0}, NULL},    {"e", "F32", 2, {2, 3}, NULL},
  };
  char *p = sl_test_path(f->dir, "model.safetensors");
  assert_int_equal(sl_test_write_st(p, ts, sizeof ts / sizeof ts[0], NULL), 0);
  sl_source *src = NULL;
  sl_status s = sl_source_open(f->ctx, p, &src);
  if (s != SL_OK) fail_msg("sl_source_open: %s", sl_context_errmsg(f->ctx));
  free(p);
  assert_int_equal(sl_source_tensor_count(src), 5);
  return src;
}

static size_t index_of(const sl_source *src, const char *name) {
  for (size_t i = 0; i < sl_source_tensor_count(src); i++)
    if (strcmp(sl_source_tensor_at(src, i)->name, name) == 0) return i;
  fail_msg("no tensor %s", name);
  return 0;
}

static void test_check(void **state) {
  fx *f = *state;
  sl_source *src = open_source(f);
  unsigned char take[5];
  /* no entries: everything is taken */
  memset(take, 7, sizeof take);
  assert_int_equal(sl__plan_check(f->plan, src, 1, take), SL_OK);
  for (int i = 0; i < 5; i++) assert_int_equal(take[i], 1);
  assert_int_equal(sl__plan_check(f->plan, src, 1, NULL), SL_OK);

  /* entries the checkpoint lacks */
  assert_int_equal(sl_plan_add_entry(f->plan, "a", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_entry(f->plan, "x", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_entry(f->plan, "y", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl__plan_check(f->plan, src, 1, take), SL_ERR_MISSING);
  assert_string_equal(sl_context_errmsg(f->ctx),
                      "plan names 2 tensors the checkpoint lacks (of 3 in the plan; the checkpoint has 5): x, y");
  const char *more[] = {"m1", "m2", "m3", "m4", "m5", "m6"};
  for (int i = 0; i < 6; i++) assert_int_equal(sl_plan_add_entry(f->plan, more[i], NULL, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl__plan_check(f->plan, src, 1, take), SL_ERR_MISSING);
  assert_string_equal(sl_context_errmsg(f->ctx),
                      "plan names 8 tensors the checkpoint lacks (of 9 in the plan; the checkpoint has 5): "
                      "x, y, m1, m2, m3, ...");
  sl_plan_destroy(f->plan);
  assert_int_equal(sl_plan_create(f->ctx, &f->plan), SL_OK);

  /* non-strict: unnamed tensors are skipped */
  assert_int_equal(sl_plan_add_entry(f->plan, "a", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_entry(f->plan, "c", NULL, SL_DTYPE_INVALID), SL_OK);
  memset(take, 7, sizeof take);
  assert_int_equal(sl__plan_check(f->plan, src, 1, take), SL_OK);
  for (const char *n = "abcde"; *n; n++) {
    char name[2] = {*n, 0};
    assert_int_equal(take[index_of(src, name)], *n == 'a' || *n == 'c');
  }
  /* strict: they are an error, named */
  assert_int_equal(sl_plan_set_strict(f->plan, 1), SL_OK);
  assert_int_equal(sl__plan_check(f->plan, src, 1, take), SL_ERR_UNEXPECTED);
  assert_msg_has(f, "checkpoint holds 3 tensors the strict plan does not name (the plan names 2; the checkpoint has 5)");
  assert_msg_has(f, ": b, d, e");
  /* a plan-resolution error on a taken tensor surfaces in the check; on a skipped one it does not */
  assert_int_equal(sl_plan_set_strict(f->plan, 0), SL_OK);
  assert_int_equal(sl_plan_add_rule(f->plan, "[be]", "shard(5)", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl__plan_check(f->plan, src, 1, take), SL_OK);
  assert_int_equal(sl_plan_add_rule(f->plan, "c", NULL, SL_DTYPE_F32), SL_OK);
  assert_int_equal(sl__plan_check(f->plan, src, 1, take), SL_ERR_DTYPE);
  assert_msg_has(f, "c: rule 2 ('c') asks for dtype F32 but the checkpoint holds I64");
  sl_plan_destroy(f->plan);
  assert_int_equal(sl_plan_create(f->ctx, &f->plan), SL_OK);

  /* the 0-d tensor: replicated by the default, an error when a rule shards it */
  assert_int_equal(sl_plan_add_rule(f->plan, "d", "shard(0)", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl__plan_check(f->plan, src, 1, take), SL_ERR_PLAN);
  assert_msg_has(f, "d: rule 1 ('d') shards a 0-d (scalar) tensor");
  sl_plan_destroy(f->plan);
  assert_int_equal(sl_plan_create(f->ctx, &f->plan), SL_OK);

  /* the mesh must cover the job */
  assert_int_equal(sl_plan_set_mesh(f->plan, 2, (int[]){2, 4}), SL_OK);
  assert_int_equal(sl__plan_check(f->plan, src, 2, take), SL_ERR_PLAN);
  assert_msg_has(f, "mesh 2x4 has 8 ranks but the job has 2");
  assert_int_equal(sl__plan_check(f->plan, src, 8, take), SL_OK);
  sl_source_destroy(src);
}

/* The public dry-run check is the load's phase-1 check: the same status and message for a
 * plan naming a tensor the checkpoint lacks (the dry run used to pass it with "0 tensors"). */
static void test_public_check_is_the_loads(void **state) {
  fx *f = *state;
  sl_source *src = open_source(f);
  assert_int_equal(sl_plan_check(f->plan, src, 1), SL_OK);
  assert_int_equal(sl_plan_add_entry(f->plan, "nope", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_check(f->plan, src, 1), SL_ERR_MISSING);
  char dry[SL__ERRMSG_LEN];
  snprintf(dry, sizeof dry, "%s", sl_context_errmsg(f->ctx));
  assert_non_null(strstr(dry, "nope"));
  sl_state *st = NULL;
  assert_int_equal(sl_load(f->ctx, f->plan, src, NULL, &st), SL_ERR_MISSING);
  assert_null(st);
  assert_string_equal(sl_context_errmsg(f->ctx), dry);
  assert_int_equal(sl_plan_check(NULL, src, 1), SL_ERR_INVALID);
  assert_int_equal(sl_plan_check(f->plan, src, 0), SL_ERR_INVALID);
  sl_source_destroy(src);
}

/* ---- digests ----------------------------------------------------------------------------- */

typedef void (*mutator)(sl_plan *p);
static void base(sl_plan *p) {
  assert_int_equal(sl_plan_set_mesh(p, 2, (int[]){2, 2}), SL_OK);
  assert_int_equal(sl_plan_set_offload_policy(p, &(sl_offload_policy){SL_OFFLOAD_CPU, 0}), SL_OK);
  assert_int_equal(sl_plan_set_param_dtype(p, SL_DTYPE_BF16), SL_OK);
  assert_int_equal(sl_plan_add_rule(p, "*norm*", "replicate", SL_DTYPE_F32), SL_OK);
  assert_int_equal(sl_plan_add_rule(p, "*.bias", "replicate", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_entry(p, "a", "shard(1)", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_entry(p, "b", NULL, SL_DTYPE_INVALID), SL_OK);
}
static void m_mesh(sl_plan *p) { sl_plan_set_mesh(p, 2, (int[]){1, 4}); }
static void m_mesh_default(sl_plan *p) { sl_plan_set_mesh(p, 0, NULL); }
static void m_policy(sl_plan *p) { sl_plan_set_offload_policy(p, NULL); }
static void m_pin(sl_plan *p) { sl_plan_set_offload_policy(p, &(sl_offload_policy){SL_OFFLOAD_CPU, 1}); }
static void m_dtype(sl_plan *p) { sl_plan_set_param_dtype(p, SL_DTYPE_F16); }
static void m_dtype_file(sl_plan *p) { sl_plan_set_param_dtype(p, SL_DTYPE_INVALID); }
static void m_default(sl_plan *p) { sl_plan_set_default_placement(p, "replicate"); }
static void m_rule(sl_plan *p) { sl_plan_add_rule(p, "x", "replicate", SL_DTYPE_INVALID); }
static void m_rule_noop_dtype(sl_plan *p) { sl_plan_add_rule(p, "*", NULL, SL_DTYPE_BF16); }
static void m_entry(sl_plan *p) { sl_plan_add_entry(p, "c", NULL, SL_DTYPE_INVALID); }
static void m_entry_pl(sl_plan *p) { sl_plan_add_entry(p, "b", "shard(0)", SL_DTYPE_INVALID); }
static void m_entry_dt(sl_plan *p) { sl_plan_add_entry(p, "b", NULL, SL_DTYPE_F32); }
static void m_strict(sl_plan *p) { sl_plan_set_strict(p, 1); }

static void test_digest(void **state) {
  fx *f = *state;
  sl_plan *a = NULL, *b = NULL;
  assert_int_equal(sl_plan_create(f->ctx, &a), SL_OK);
  assert_int_equal(sl_plan_create(f->ctx, &b), SL_OK);
  assert_true(sl__plan_digest(a) == sl__plan_digest(b)); /* two empty plans */
  base(a);
  /* the same plan, entries in another order and placements spelled differently */
  assert_int_equal(sl_plan_add_entry(b, "b", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_entry(b, "a", "S(1)", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_rule(b, "*norm*", "R", SL_DTYPE_F32), SL_OK);
  assert_int_equal(sl_plan_add_rule(b, "*.bias", "Replicate()", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_set_param_dtype(b, SL_DTYPE_BF16), SL_OK);
  assert_int_equal(sl_plan_set_offload_policy(b, &(sl_offload_policy){SL_OFFLOAD_CPU, 0}), SL_OK);
  assert_int_equal(sl_plan_set_mesh(b, 2, (int[]){2, 2}), SL_OK);
  const uint64_t d = sl__plan_digest(a);
  assert_true(d == sl__plan_digest(b));
  char *ca = sl__plan_canonical(a);
  assert_non_null(ca);
  assert_non_null(strstr(ca, "mesh 2x2"));
  free(ca);
  assert_true(d != sl__plan_digest(f->plan));

  const mutator ms[] = {m_mesh, m_mesh_default, m_policy, m_pin, m_dtype, m_dtype_file, m_default,
                        m_rule, m_rule_noop_dtype, m_entry, m_entry_pl, m_entry_dt, m_strict};
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
    sl_plan *c = NULL;
    assert_int_equal(sl_plan_create(f->ctx, &c), SL_OK);
    base(c);
    assert_true(sl__plan_digest(c) == d);
    ms[i](c);
    if (sl__plan_digest(c) == d) fail_msg("mutation %zu left the digest unchanged", i);
    sl_plan_destroy(c);
  }
  /* rule order matters */
  sl_plan *c = NULL;
  assert_int_equal(sl_plan_create(f->ctx, &c), SL_OK);
  assert_int_equal(sl_plan_set_mesh(c, 2, (int[]){2, 2}), SL_OK);
  assert_int_equal(sl_plan_set_offload_policy(c, &(sl_offload_policy){SL_OFFLOAD_CPU, 0}), SL_OK);
  assert_int_equal(sl_plan_set_param_dtype(c, SL_DTYPE_BF16), SL_OK);
  assert_int_equal(sl_plan_add_rule(c, "*.bias", "replicate", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_rule(c, "*norm*", "replicate", SL_DTYPE_F32), SL_OK);
  assert_int_equal(sl_plan_add_entry(c, "a", "shard(1)", SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_entry(c, "b", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_true(sl__plan_digest(c) != d);
  /* a name cannot pose as two: lengths are part of the text */
  sl_plan *x = NULL, *y = NULL;
  assert_int_equal(sl_plan_create(f->ctx, &x), SL_OK);
  assert_int_equal(sl_plan_create(f->ctx, &y), SL_OK);
  assert_int_equal(sl_plan_add_entry(x, "p placement - dtype -\nentry 1:q", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_entry(y, "p", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_int_equal(sl_plan_add_entry(y, "q", NULL, SL_DTYPE_INVALID), SL_OK);
  assert_true(sl__plan_digest(x) != sl__plan_digest(y));
  sl_plan_destroy(x);
  sl_plan_destroy(y);
  sl_plan_destroy(c);
  sl_plan_destroy(a);
  sl_plan_destroy(b);
  assert_ptr_equal(sl__plan_context(f->plan), f->ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_good),
      cmocka_unit_test(test_parse_bad),
      cmocka_unit_test_setup_teardown(test_defaults, setup, teardown),
      cmocka_unit_test_setup_teardown(test_mesh, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rules_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_entries_over_rules, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dtype_resolution, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dims_out_of_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_list_lengths, setup, teardown),
      cmocka_unit_test_setup_teardown(test_describe_and_geometry, setup, teardown),
      cmocka_unit_test_setup_teardown(test_json_good, setup, teardown),
      cmocka_unit_test_setup_teardown(test_json_policies_and_merge, setup, teardown),
      cmocka_unit_test_setup_teardown(test_json_bad, setup, teardown),
      cmocka_unit_test_setup_teardown(test_json_out_of_memory_every_allocation, setup, teardown),
      cmocka_unit_test_setup_teardown(test_check, setup, teardown),
      cmocka_unit_test_setup_teardown(test_public_check_is_the_loads, setup, teardown),
      cmocka_unit_test_setup_teardown(test_digest, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
