/* The `shardload` command end to end: synth, inspect, plan and load (with --dump) run as real
 * processes. Everything they write is checked independently of the library: safetensors files
 * are parsed here with jansson + fread, shard slices and torch.chunk geometry are computed
 * here, and placements are checked against the table of docs/DESIGN.md#placement. */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_testlib.h"

/* World size 1 whatever launcher environment the test runs under. */
#define ENV1 "env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0"

static char *g_dir;     /* scratch directory of this test */
static char *g_single;  /* synth --size 2MiB --seed 7, one file */
static char *g_sharded; /* the same, --shards 3 */

/* ---- fixtures --------------------------------------------------------------------------------- */

static int setup(void **state) {
  g_dir = sl_test_dir("cli");
  if (!g_dir) return -1;
  g_single = sl_test_path(g_dir, "single.safetensors");
  g_sharded = sl_test_path(g_dir, "sharded");
  char *out = NULL;
  int rc = sl_test_run(&out, "%s synth '%s' --size 2MiB --seed 7", sl_test_bin(), g_single);
  if (rc != 0) fprintf(stderr, "synth failed (%d): %s\n", rc, out ? out : "");
  free(out);
  if (rc != 0) return -1;
  rc = sl_test_run(&out, "%s synth '%s' --size 2MiB --seed 7 --shards 3", sl_test_bin(), g_sharded);
  if (rc != 0) fprintf(stderr, "synth --shards failed (%d): %s\n", rc, out ? out : "");
  free(out);
  return rc == 0 ? 0 : -1;
}

static int teardown(void **state) {
  free(g_single);
  free(g_sharded);
  free(g_dir);
  return 0;
}

/* ---- tests -------------------------------------------------------------------------------------- */

static void test_help_and_version(void **state) {
  char *out = NULL;
  assert_int_equal(sl_test_run(&out, "%s --help", sl_test_bin()), 0);
  assert_non_null(strstr(out, "usage: shardload"));
  free(out);
  assert_int_equal(sl_test_run(&out, "%s --version", sl_test_bin()), 0);
  assert_non_null(strstr(out, sl_version_string()));
  free(out);
  static const char *cmds[] = {"inspect", "plan", "load", "synth"};
  for (size_t i = 0; i < 4; i++) {
    assert_int_equal(sl_test_run(&out, "%s %s --help", sl_test_bin(), cmds[i]), 0);
    char want[64];
    snprintf(want, sizeof want, "usage: shardload %s", cmds[i]);
    assert_non_null(strstr(out, want));
    free(out);
  }
  assert_int_equal(sl_test_run(&out, "%s", sl_test_bin()), 2);
  free(out);
  assert_int_equal(sl_test_run(&out, "%s frobnicate", sl_test_bin()), 2);
  assert_one_error_line(out, "frobnicate");
  free(out);
}

static int is_awkward(int64_t n) {
  for (int k = 2; k <= 8; k++)
    if (n % k == 0) return 0;
  return 1;
}

static void test_synth_single(void **state) {
  st_file f = {0};
  st_open(g_single, &f);
  size_t n = st_check_valid(&f);
  uint64_t total = f.file_size - f.data_off;
  assert_true(total <= 2u << 20);
  assert_true(total >= (2u << 20) * 9 / 10);

  st_tensor emb, head, gate, down, norm, scale, pos, qb;
  assert_int_equal(st_find(&f, "model.embed_tokens.weight", &emb), 0);
  assert_int_equal(st_find(&f, "lm_head.weight", &head), 0);
  assert_int_equal(st_find(&f, "model.norm.weight", &norm), 0);
  assert_int_equal(st_find(&f, "model.layers.0.mlp.gate_proj.weight", &gate), 0);
  assert_int_equal(st_find(&f, "model.layers.0.mlp.down_proj.weight", &down), 0);
  assert_int_equal(st_find(&f, "model.layers.0.self_attn.q_proj.bias", &qb), 0);
  assert_int_equal(st_find(&f, "model.layers.0.input_layernorm.weight", &norm), 0);
  assert_int_equal(st_find(&f, "model.layers.0.post_attention_layernorm.weight", &norm), 0);
  assert_int_equal(st_find(&f, "model.rotary_emb.scale", &scale), 0);
  assert_int_equal(st_find(&f, "model.position_ids", &pos), 0);
  assert_string_equal(emb.dtype, "BF16");
  assert_int_equal(emb.ndim, 2);
  assert_int_equal(head.shape[0], emb.shape[0]);
  assert_true(is_awkward(emb.shape[0])); /* vocab: no world size 2..8 divides it */
  assert_true(is_awkward(gate.shape[0])); /* intermediate */
  assert_int_equal(down.shape[1], gate.shape[0]);
  assert_int_equal(norm.ndim, 1);
  assert_int_equal(qb.ndim, 1);
  assert_string_equal(scale.dtype, "F32");
  assert_int_equal(scale.ndim, 0);
  assert_int_equal(scale.end - scale.begin, 4);
  assert_string_equal(pos.dtype, "I64");
  assert_int_equal(pos.ndim, 1);
  unsigned char *b = st_bytes(&f, &pos);
  for (int64_t i = 0; i < pos.shape[0]; i++) {
    int64_t v;
    memcpy(&v, b + 8 * i, 8);
    assert_int_equal(v, i);
  }
  free(b);
  assert_true(n > 10);

  /* every BF16 value finite and small; not all equal */
  size_t count;
  const char **names = st_names(&f, &count);
  for (size_t i = 0; i < count; i++) {
    st_tensor t = {0};
    st_find(&f, names[i], &t);
    if (strcmp(t.dtype, "BF16")) continue;
    unsigned char *d = st_bytes(&f, &t);
    size_t ne = (size_t)(t.end - t.begin) / 2, distinct = 0;
    for (size_t e = 0; e < ne; e++) {
      uint16_t v;
      memcpy(&v, d + 2 * e, 2);
      unsigned ex = (v >> 7) & 0xff;
      if (ex == 0xff || ex >= 127 + 2) fail_msg("%s[%zu] = 0x%04x: not finite and small", names[i], e, v);
      if (e && memcmp(d + 2 * e, d, 2)) distinct++;
    }
    assert_true(ne < 2 || distinct > 0);
    free(d);
  }
  free(names);
  st_close(&f);

  /* deterministic: the same seed gives the same bytes, another seed other bytes */
  char *again = sl_test_path(g_dir, "again.safetensors"), *other = sl_test_path(g_dir, "other.safetensors");
  char *out = NULL;
  assert_int_equal(sl_test_run(&out, "%s synth '%s' --size 2MiB --seed 7 && cmp '%s' '%s'", sl_test_bin(),
                               again, again, g_single), 0);
  free(out);
  assert_int_equal(sl_test_run(&out, "%s synth '%s' --size 2MiB --seed 8", sl_test_bin(), other), 0);
  free(out);
  assert_int_not_equal(sl_test_run(&out, "cmp -s '%s' '%s'", other, g_single), 0);
  free(out);
  /* an existing directory receives model.safetensors; other dtypes stay within their size */
  char *d = sl_test_path(g_dir, "into-dir");
  assert_int_equal(sl_test_run(&out, "mkdir -p '%s' && %s synth '%s' --size 300K --dtype F32 && "
                               "test -s '%s/model.safetensors'", d, sl_test_bin(), d, d), 0);
  free(out);
  char *p = sl_test_path(d, "model.safetensors");
  st_open(p, &f);
  st_check_valid(&f);
  assert_int_equal(st_find(&f, "lm_head.weight", &head), 0);
  assert_string_equal(head.dtype, "F32");
  assert_true(f.file_size - f.data_off <= 300u * 1024);
  st_close(&f);
  free(p);
  free(d);
  free(again);
  free(other);
}

static void test_synth_sharded(void **state) {
  char *idx = sl_test_path(g_sharded, "model.safetensors.index.json");
  json_t *j = load_json_file(idx);
  json_t *map = json_object_get(j, "weight_map");
  st_file single;
  st_open(g_single, &single);
  size_t n = st_check_valid(&single);
  assert_int_equal(json_object_size(map), n);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "metadata"), "total_size")),
                   single.file_size - single.data_off);
  size_t in_files = 0;
  for (int k = 1; k <= 3; k++) {
    char name[64];
    snprintf(name, sizeof name, "model-%05d-of-00003.safetensors", k);
    char *p = sl_test_path(g_sharded, name);
    st_file f = {0};
    st_open(p, &f);
    size_t m = st_check_valid(&f);
    assert_true(m > 0);
    in_files += m;
    size_t count;
    const char **names = st_names(&f, &count);
    for (size_t i = 0; i < count; i++) {
      assert_string_equal(json_string_value(json_object_get(map, names[i])), name);
      /* the same values as the single file: data depends on seed and name only */
      st_tensor a, b;
      assert_int_equal(st_find(&f, names[i], &a), 0);
      assert_int_equal(st_find(&single, names[i], &b), 0);
      unsigned char *x = st_bytes(&f, &a), *y = st_bytes(&single, &b);
      assert_int_equal(a.end - a.begin, b.end - b.begin);
      assert_memory_equal(x, y, a.end - a.begin);
      free(x);
      free(y);
    }
    free(names);
    st_close(&f);
    free(p);
  }
  assert_int_equal(in_files, n);
  st_close(&single);
  json_decref(j);
  free(idx);
}

static void check_inspect_json(const char *path, const char *json_path) {
  json_t *j = load_json_file(json_path);
  json_t *ts = json_object_get(j, "tensors");
  uint64_t sum = 0;
  for (size_t i = 0; i < json_array_size(ts); i++) {
    json_t *t = json_array_get(ts, i);
    const char *name = json_string_value(json_object_get(t, "name"));
    st_file f = {0};
    st_tensor want = {0};
    assert_non_null(name);
    if (source_find(path, name, &f, &want) != 0) fail_msg("%s: listed but not in the files", name);
    assert_string_equal(json_string_value(json_object_get(t, "dtype")), want.dtype);
    json_t *shape = json_object_get(t, "shape");
    assert_int_equal(json_array_size(shape), want.ndim);
    for (int d = 0; d < want.ndim; d++)
      assert_int_equal(json_integer_value(json_array_get(shape, (size_t)d)), want.shape[d]);
    assert_int_equal(json_integer_value(json_object_get(t, "bytes")), want.end - want.begin);
    assert_int_equal(json_integer_value(json_object_get(t, "offset")), f.data_off + want.begin);
    const char *file = json_string_value(json_object_get(t, "file"));
    const char *base = strrchr(f.path, '/');
    assert_non_null(file);
    assert_non_null(strstr(file, base + 1));
    sum += want.end - want.begin;
    st_close(&f);
  }
  assert_int_equal(json_integer_value(json_object_get(j, "tensor_count")), json_array_size(ts));
  assert_int_equal(json_integer_value(json_object_get(j, "total_bytes")), sum);
  st_file single;
  st_open(g_single, &single);
  assert_int_equal(json_array_size(ts), st_check_valid(&single));
  assert_int_equal(sum, single.file_size - single.data_off);
  st_close(&single);
  json_decref(j);
}

static void test_inspect(void **state) {
  char *out = NULL, *jp = sl_test_path(g_dir, "inspect.json"), cmd[2048];
  assert_int_equal(sl_test_run(&out, "%s inspect '%s'", sl_test_bin(), g_single), 0);
  assert_non_null(strstr(out, "model.embed_tokens.weight"));
  assert_non_null(strstr(out, "model.position_ids"));
  assert_non_null(strstr(out, "generator: shardload synth")); /* metadata */
  free(out);

  snprintf(cmd, sizeof cmd, "%s inspect '%s' --json", sl_test_bin(), g_single);
  assert_int_equal(run_to_file(jp, cmd), 0);
  check_inspect_json(g_single, jp);
  /* a directory with an index, and the index itself */
  snprintf(cmd, sizeof cmd, "%s inspect --json '%s'", sl_test_bin(), g_sharded);
  assert_int_equal(run_to_file(jp, cmd), 0);
  check_inspect_json(g_sharded, jp);
  json_t *j = load_json_file(jp);
  assert_int_equal(json_integer_value(json_object_get(j, "file_count")), 3);
  json_decref(j);
  snprintf(cmd, sizeof cmd, "%s inspect --json '%s/model.safetensors.index.json'", sl_test_bin(), g_sharded);
  assert_int_equal(run_to_file(jp, cmd), 0);
  check_inspect_json(g_sharded, jp);
  free(jp);
}

/* A hand-made checkpoint with uneven row counts. */
static char *write_uneven(void) {
  char *p = sl_test_path(g_dir, "uneven.safetensors");
  sl_test_tensor ts[] = {
      {"rows10", "F32", 2, {10, 3}, NULL},
      {"rows9", "BF16", 1, {9}, NULL},
      {"rows3", "F32", 2, {3, 2}, NULL},
      {"scalar", "F32", 0, {0}, NULL},
      {"ids", "I64", 1, {4}, NULL},
  };
  assert_int_equal(sl_test_write_st(p, ts, 5, "{\"format\":\"pt\"}"), 0);
  return p;
}

static json_t *plan_json(const char *path, const char *extra) {
  char *jp = sl_test_path(g_dir, "plan.json"), cmd[2048];
  snprintf(cmd, sizeof cmd, "%s plan '%s' --json %s", sl_test_bin(), path, extra);
  assert_int_equal(run_to_file(jp, cmd), 0);
  json_t *j = load_json_file(jp);
  free(jp);
  return j;
}

static json_t *plan_tensor(json_t *j, int rank, const char *name) {
  json_t *r = json_array_get(json_object_get(j, "ranks"), (size_t)rank);
  assert_int_equal(json_integer_value(json_object_get(r, "rank")), rank);
  json_t *ts = json_object_get(r, "tensors");
  for (size_t i = 0; i < json_array_size(ts); i++)
    if (!strcmp(json_string_value(json_object_get(json_array_get(ts, i), "name")), name))
      return json_array_get(ts, i);
  fail_msg("rank %d: %s not in the plan", rank, name);
  return NULL;
}

static void assert_dims(json_t *a, int n, const int64_t *want) {
  assert_int_equal(json_array_size(a), n);
  for (int d = 0; d < n; d++) assert_int_equal(json_integer_value(json_array_get(a, (size_t)d)), want[d]);
}

/* A plan file that names tensors: the dry run shows what a load would take (the named ones,
 * on the file's mesh), not every tensor of the checkpoint. */
static void test_plan_file_names_tensors(void **state) {
  char *p = write_uneven();
  char *pf = sl_test_path(g_dir, "names.plan.json");
  const char *text = "{\"mesh\":[2,2],\"tensors\":{\"rows10\":{},\"ids\":{\"placement\":\"replicate\"}}}";
  assert_int_equal(sl_test_write_bytes(pf, text, strlen(text)), 0);
  char extra[1024];
  snprintf(extra, sizeof extra, "--world 4 --plan '%s'", pf);
  json_t *j = plan_json(p, extra);
  json_t *mesh = json_object_get(j, "mesh");
  assert_int_equal(json_array_size(mesh), 2);
  assert_int_equal(json_integer_value(json_array_get(mesh, 0)), 2);
  for (int r = 0; r < 4; r++) {
    json_t *rank = json_array_get(json_object_get(j, "ranks"), (size_t)r);
    assert_int_equal(json_array_size(json_object_get(rank, "tensors")), 2);
    json_t *t = plan_tensor(j, r, "rows10"); /* HSDP default [R, S(0)]: 5 rows each */
    int64_t ls[2] = {5, 3}, off[2] = {(r % 2) * 5, 0};
    assert_dims(json_object_get(t, "local_shape"), 2, ls);
    assert_dims(json_object_get(t, "global_offset"), 2, off);
    assert_int_equal(json_integer_value(json_object_get(rank, "total_bytes")), 5 * 3 * 4 + 4 * 8);
  }
  json_decref(j);
  free(pf);
  free(p);
}

static void test_plan_chunk(void **state) {
  char *p = write_uneven();
  static const struct {
    const char *name;
    int ndim;
    int64_t shape[2];
    size_t esize;
  } T[] = {{"rows10", 2, {10, 3}, 4}, {"rows9", 1, {9}, 2}, {"rows3", 2, {3, 2}, 4},
           {"scalar", 0, {0}, 4}, {"ids", 1, {4}, 8}};

  json_t *j = plan_json(p, "--world 4");
  assert_int_equal(json_integer_value(json_object_get(j, "world_size")), 4);
  assert_int_equal(json_array_size(json_object_get(j, "ranks")), 4);
  for (int r = 0; r < 4; r++) {
    uint64_t total = 0;
    for (size_t i = 0; i < 5; i++) {
      json_t *t = plan_tensor(j, r, T[i].name);
      int64_t ls[2] = {T[i].shape[0], T[i].shape[1]}, off[2] = {0, 0};
      if (T[i].ndim) chunk(T[i].shape[0], 4, r, &off[0], &ls[0]); /* FSDP2: shard(0) */
      assert_dims(json_object_get(t, "local_shape"), T[i].ndim, ls);
      assert_dims(json_object_get(t, "global_offset"), T[i].ndim, off);
      uint64_t bytes = T[i].esize;
      for (int d = 0; d < T[i].ndim; d++) bytes *= (uint64_t)ls[d];
      assert_int_equal(json_integer_value(json_object_get(t, "bytes")), bytes);
      assert_int_equal(json_is_true(json_object_get(t, "replicated")), T[i].ndim == 0);
      total += bytes;
    }
    json_t *rank = json_array_get(json_object_get(j, "ranks"), (size_t)r);
    assert_int_equal(json_integer_value(json_object_get(rank, "total_bytes")), total);
  }
  /* the docs/DESIGN.md#geometry examples, spelled out: 10 -> 3,3,3,1; 9 -> 3,3,3,0 (offset 9); 3 -> 1,1,1,0 */
  static const int64_t r10[] = {3, 3, 3, 1}, r9[] = {3, 3, 3, 0}, r3[] = {1, 1, 1, 0};
  for (int r = 0; r < 4; r++) {
    assert_int_equal(json_integer_value(json_array_get(json_object_get(plan_tensor(j, r, "rows10"), "local_shape"), 0)), r10[r]);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(plan_tensor(j, r, "rows9"), "local_shape"), 0)), r9[r]);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(plan_tensor(j, r, "rows3"), "local_shape"), 0)), r3[r]);
  }
  assert_int_equal(json_integer_value(json_array_get(json_object_get(plan_tensor(j, 3, "rows9"), "global_offset"), 0)), 9);
  json_decref(j);

  /* --replicate: whole tensors everywhere */
  j = plan_json(p, "--world 4 --replicate 'rows*'");
  for (int r = 0; r < 4; r++) {
    static const int64_t full[] = {10, 3}, zero[] = {0, 0};
    assert_dims(json_object_get(plan_tensor(j, r, "rows10"), "local_shape"), 2, full);
    assert_dims(json_object_get(plan_tensor(j, r, "rows10"), "global_offset"), 2, zero);
    assert_true(json_is_true(json_object_get(plan_tensor(j, r, "rows10"), "replicated")));
    int64_t off, len;
    chunk(4, 4, r, &off, &len);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(plan_tensor(j, r, "ids"), "local_shape"), 0)), len);
  }
  json_decref(j);

  /* 2-D mesh, [shard(0), shard(0)]: 10 rows -> 3,2,3,2 (each shard re-chunks) */
  j = plan_json(p, "--world 4 --mesh 2x2 --placement '[shard(0), shard(0)]'");
  for (int r = 0; r < 4; r++) {
    int64_t o1, l1, o2, l2;
    chunk(10, 2, r / 2, &o1, &l1);
    chunk(l1, 2, r % 2, &o2, &l2);
    int64_t ls[2] = {l2, 3}, off[2] = {o1 + o2, 0};
    assert_dims(json_object_get(plan_tensor(j, r, "rows10"), "local_shape"), 2, ls);
    assert_dims(json_object_get(plan_tensor(j, r, "rows10"), "global_offset"), 2, off);
  }
  static const int64_t r10_2d[] = {3, 2, 3, 2};
  for (int r = 0; r < 4; r++)
    assert_int_equal(json_integer_value(json_array_get(json_object_get(plan_tensor(j, r, "rows10"), "local_shape"), 0)), r10_2d[r]);
  json_decref(j);

  /* --param-dtype: floating tensors cast, bytes follow */
  j = plan_json(p, "--world 4 --param-dtype F32");
  json_t *t = plan_tensor(j, 0, "rows9");
  assert_string_equal(json_string_value(json_object_get(t, "file_dtype")), "BF16");
  assert_string_equal(json_string_value(json_object_get(t, "dtype")), "F32");
  assert_int_equal(json_integer_value(json_object_get(t, "bytes")), 3 * 4);
  json_decref(j);

  /* human output, one rank */
  char *out = NULL;
  assert_int_equal(sl_test_run(&out, "%s plan '%s' --world 4 --rank 1", sl_test_bin(), p), 0);
  assert_non_null(strstr(out, "rank 1 of 4"));
  assert_null(strstr(out, "rank 0 of 4"));
  assert_non_null(strstr(out, "rows10"));
  free(out);
  /* usage errors */
  assert_int_equal(sl_test_run(&out, "%s plan '%s' --world 4 --mesh 2x3", sl_test_bin(), p), 2);
  assert_one_error_line(out, "--mesh");
  free(out);
  assert_int_equal(sl_test_run(&out, "%s plan '%s'", sl_test_bin(), p), 2);
  assert_one_error_line(out, "plan");
  free(out);
  assert_int_equal(sl_test_run(&out, "%s plan '%s' --world 4 --rank 4", sl_test_bin(), p), 2);
  assert_one_error_line(out, "--rank");
  free(out);
  free(p);
}

/* The placement contract (docs/DESIGN.md#placement), written out here. */
static void expected_placement(const char *co, const char *pol, const char **placement, sl_placement_rule *rule) {
  if (!strcmp(co, "on")) {
    *placement = "cpu";
    *rule = SL_RULE_EXPLICIT_ON;
  } else if (!strcmp(co, "off")) {
    *placement = "device";
    *rule = SL_RULE_EXPLICIT_OFF;
  } else if (strcmp(pol, "none") != 0) {
    *placement = "cpu";
    *rule = SL_RULE_INFER_POLICY_CPU;
  } else {
    *placement = "device";
    *rule = SL_RULE_INFER_NO_POLICY;
  }
}

static void run_load_and_check(const char *backend, const char *co, const char *pol, const char *source,
                               const char *extra, int cast_f32) {
  char *jp = sl_test_path(g_dir, "load.json"), *dump = sl_test_path(g_dir, "dump"), cmd[4096];
  char *rm = NULL;
  assert_int_equal(sl_test_run(&rm, "rm -rf '%s'", dump), 0);
  free(rm);
  snprintf(cmd, sizeof cmd, ENV1 " %s load '%s' --backend %s --cpu-offload %s --offload-policy %s "
           "--dump '%s' --json %s", sl_test_bin(), source, backend, co, pol, dump, extra);
  int rc = run_to_file(jp, cmd);
  if (rc != 0) {
    char *out = NULL;
    sl_test_run(&out, "%s", cmd);
    fail_msg("load %s/%s/%s exited %d: %s", backend, co, pol, rc, out ? out : "");
  }
  json_t *j = load_json_file(jp);
  assert_int_equal(json_integer_value(json_object_get(j, "rank")), 0);
  assert_int_equal(json_integer_value(json_object_get(j, "world_size")), 1);
  /* one rank: host staging through local, whatever the backend; sim's device collective (the
   * device route) only when forced */
  json_t *cj = json_object_get(j, "collective");
  const char *coll = strstr(extra, "--collective simccl") ? "simccl" : "local";
  assert_string_equal(json_string_value(json_object_get(cj, "name")), coll);
  assert_non_null(json_string_value(json_object_get(cj, "reason")));
  const char *want_pl;
  sl_placement_rule want_rule;
  expected_placement(co, pol, &want_pl, &want_rule);
  json_t *ts = json_object_get(j, "tensors");
  assert_true(json_array_size(ts) > 0);
  uint64_t sum = 0;
  for (size_t i = 0; i < json_array_size(ts); i++) {
    json_t *t = json_array_get(ts, i);
    const char *name = json_string_value(json_object_get(t, "name"));
    const char *pl = json_string_value(json_object_get(t, "placement"));
    const char *rule = json_string_value(json_object_get(t, "rule"));
    if (!pl || strcmp(pl, want_pl))
      fail_msg("%s %s/%s/%s: placement %s, want %s", name, backend, co, pol, pl ? pl : "(none)", want_pl);
    if (!rule || strcmp(rule, sl_placement_rule_describe(want_rule)))
      fail_msg("%s %s/%s/%s: rule %s, want %s", name, backend, co, pol, rule ? rule : "(none)",
               sl_placement_rule_describe(want_rule));
    /* pinned only for CPU placement under the pinned policy */
    if (json_is_true(json_object_get(t, "pinned")))
      assert_true(!strcmp(want_pl, "cpu") && !strcmp(pol, "cpu-pinned"));
    assert_non_null(json_string_value(json_object_get(t, "device")));
    sum += (uint64_t)json_integer_value(json_object_get(t, "bytes"));
  }
  json_t *tot = json_object_get(j, "totals");
  assert_int_equal(json_integer_value(json_object_get(tot, "tensors")), json_array_size(ts));
  assert_int_equal(json_integer_value(json_object_get(tot, "bytes")), sum);
  assert_int_equal(json_integer_value(json_object_get(tot, "skipped")), 0);
  assert_true(json_is_number(json_object_get(tot, "seconds")));
  /* world 1: rank 0 reads the whole checkpoint and sends nothing; RSS measured */
  json_t *stats = json_object_get(j, "stats");
  uint64_t ckpt = (uint64_t)json_integer_value(json_object_get(tot, "checkpoint_bytes"));
  assert_true(ckpt > 0);
  assert_int_equal(json_integer_value(json_object_get(stats, "bytes_read")), ckpt);
  assert_int_equal(json_integer_value(json_object_get(stats, "bytes_sent")), 0);
  assert_int_equal(json_integer_value(json_object_get(stats, "bytes_received")), 0);
  /* every-rank reads into host shards without a cast land in place: no staging at all */
  int in_place = strstr(extra, "--source every-rank") && !strstr(extra, "--param-dtype") &&
                  (!strcmp(backend, "cpu") || !strcmp(co, "on"));
  if (in_place) assert_int_equal(json_integer_value(json_object_get(stats, "staging_bytes")), 0);
  else assert_true(json_integer_value(json_object_get(stats, "staging_bytes")) > 0);
  assert_true(json_integer_value(json_object_get(stats, "peak_rss_bytes")) > 0);
  assert_true(json_is_number(json_object_get(stats, "seconds")));
  static const char *const more[] = {"bytes_d2h", "device_staging_bytes", "transfers"};
  for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
    if (!json_is_integer(json_object_get(stats, more[i]))) fail_msg("stats.%s is missing", more[i]);
  static const char *const times[] = {"seconds_read", "seconds_wait", "seconds_phase1"};
  for (size_t i = 0; i < sizeof times / sizeof times[0]; i++)
    if (!json_is_number(json_object_get(stats, times[i]))) fail_msg("stats.%s is missing", times[i]);
  assert_string_equal(json_string_value(json_object_get(j, "strategy")),
                      strstr(extra, "--strategy broadcast") ? "broadcast" : "scatter");
  assert_string_equal(json_string_value(json_object_get(j, "source")),
                      strstr(extra, "--source every-rank") ? "every-rank" : "rank0");

  char *dp = sl_test_path(dump, "rank-0.safetensors");
  assert_string_equal(json_string_value(json_object_get(j, "dump")), dp);
  size_t n = check_dump(dp, source, cast_f32, 0, 1, NULL);
  assert_int_equal(n, json_array_size(ts));
  json_decref(j);
  free(dp);
  free(jp);
  free(dump);
}

static void test_load_matrix(void **state) {
  /* sim:strict on both routes: host staging (auto, one rank) and the device route (forced) */
  static const char *backends[] = {"cpu", "sim", "sim:strict", "sim:strict"};
  static const char *extras[] = {"", "", "", "--collective simccl"};
  static const char *cos[] = {"on", "off", "infer"};
  static const char *pols[] = {"none", "cpu", "cpu-pinned"};
  for (size_t b = 0; b < 4; b++)
    for (size_t c = 0; c < 3; c++)
      for (size_t p = 0; p < 3; p++) run_load_and_check(backends[b], cos[c], pols[p], g_single, extras[b], 0);
}

static void test_load_cast_and_sharded(void **state) {
  /* BF16 -> F32: the F32 bits are bf16 << 16; I64 and F32 tensors unchanged (cast on the device
   * by the device route, and widened on the device after host staging) */
  run_load_and_check("sim:strict", "infer", "none", g_single, "--param-dtype F32 --collective simccl", 1);
  run_load_and_check("sim:strict", "infer", "none", g_single, "--param-dtype F32", 1);
  run_load_and_check("cpu", "on", "cpu", g_single, "--param-dtype float32", 1);
  /* many files through a small staging budget */
  run_load_and_check("sim:strict", "off", "none", g_sharded, "--staging 64K", 0);
  run_load_and_check("cpu", "infer", "cpu-pinned", g_sharded, "--staging 512K", 0);
  /* the multi-rank switches on a world of one: same shards */
  run_load_and_check("sim:strict", "off", "none", g_sharded, "--strategy broadcast --timeout 30 --collective simccl", 0);
  run_load_and_check("cpu", "on", "none", g_sharded, "--source every-rank --timeout 2.5 --staging 64K", 0);
}

static void test_load_human(void **state) {
  char *out = NULL;
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --backend sim --cpu-offload on", sl_test_bin(), g_single), 0);
  assert_non_null(strstr(out, "rank 0 of 1"));
  assert_non_null(strstr(out, "model.embed_tokens.weight"));
  assert_non_null(strstr(out, sl_placement_rule_describe(SL_RULE_EXPLICIT_ON)));
  assert_non_null(strstr(out, "total: "));
  assert_non_null(strstr(out, "GB/s"));
  assert_non_null(strstr(out, "stats: read "));
  assert_non_null(strstr(out, "peak RSS"));
  assert_non_null(strstr(out, "rank 0 of 1: backend sim, collective local, device sim:0"));
  assert_non_null(strstr(out, "\ncollective: local: one rank stages through host memory (backend sim's simccl only when "
                              "forced: --collective simccl)\n"));
  assert_non_null(strstr(out, " transfers, "));
  assert_non_null(strstr(out, "\ntime: "));
  free(out);
}

/* --collective: forced (and reported so), refused on a rank that cannot run it, unknown names
 * refused; --device picks the device. */
static void test_load_collective_and_device(void **state) {
  char *out = NULL, *jp = sl_test_path(g_dir, "coll.json"), cmd[4096];
  snprintf(cmd, sizeof cmd, ENV1 " %s load '%s' --backend sim --collective local --device 3 --json", sl_test_bin(),
           g_single);
  assert_int_equal(run_to_file(jp, cmd), 0);
  json_t *j = load_json_file(jp);
  json_t *cj = json_object_get(j, "collective");
  assert_string_equal(json_string_value(json_object_get(cj, "name")), "local");
  assert_non_null(strstr(json_string_value(json_object_get(cj, "reason")), "local: forced"));
  assert_non_null(strstr(json_string_value(json_object_get(j, "device")), "sim:3"));
  json_decref(j);

  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --backend cpu --collective simccl", sl_test_bin(), g_single), 1);
  assert_one_error_line(out, g_single);
  assert_non_null(strstr(out, "SL_ERR_NO_DEVICE"));
  assert_non_null(strstr(out, "rank 0 cannot run it"));
  assert_non_null(strstr(out, "backend is cpu"));
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --collective nosuch", sl_test_bin(), g_single), 1);
  assert_one_error_line(out, g_single);
  assert_non_null(strstr(out, "collective 'nosuch' is unknown"));
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --collective ''", sl_test_bin(), g_single), 2);
  assert_one_error_line(out, "--collective");
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --device -1", sl_test_bin(), g_single), 2);
  assert_one_error_line(out, "--device");
  free(out);
  /* the cpu backend has one device, ordinal 0: another is refused by name, 0 is taken */
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --backend cpu --device 7", sl_test_bin(), g_single), 1);
  assert_one_error_line(out, g_single);
  assert_non_null(strstr(out, "SL_ERR_NO_DEVICE"));
  assert_non_null(strstr(out, "cpu (local rank 0): device 7 requested"));
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --backend cpu --device 0 >/dev/null", sl_test_bin(), g_single),
                   0);
  free(out);
  /* the node's rank count: a malformed LOCAL_WORLD_SIZE fails a load by name (the launcher's
   * variables), never the one-rank commands that read no launcher variable */
  assert_int_equal(sl_test_run(&out, ENV1 " LOCAL_WORLD_SIZE=two %s load '%s'", sl_test_bin(), g_single), 1);
  assert_one_error_line(out, g_single);
  assert_non_null(strstr(out, "LOCAL_WORLD_SIZE='two' is not an integer"));
  free(out);
  assert_int_equal(sl_test_run(&out, "LOCAL_WORLD_SIZE=two %s inspect '%s' >/dev/null", sl_test_bin(), g_single), 0);
  free(out);
  free(jp);
}

/* A plan file that names two tensors: the rest are skipped and reported, or, with --strict,
 * the load fails naming the status. */
static void test_load_plan_file(void **state) {
  char *plan = sl_test_path(g_dir, "two.plan.json"), *jp = sl_test_path(g_dir, "skip.json"), cmd[4096];
  const char *text = "{\"tensors\": {\"lm_head.weight\": {}, \"model.norm.weight\": {\"placement\": \"replicate\"}}}";
  assert_int_equal(sl_test_write_bytes(plan, text, strlen(text)), 0);
  snprintf(cmd, sizeof cmd, ENV1 " %s load '%s' --backend sim --plan '%s' --json", sl_test_bin(), g_single, plan);
  assert_int_equal(run_to_file(jp, cmd), 0);
  json_t *j = load_json_file(jp);
  st_file f = {0};
  st_open(g_single, &f);
  size_t n = st_check_valid(&f);
  st_close(&f);
  assert_int_equal(json_array_size(json_object_get(j, "tensors")), 2);
  assert_int_equal(json_array_size(json_object_get(j, "skipped")), n - 2);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "totals"), "skipped")), n - 2);
  json_t *skipped = json_object_get(j, "skipped");
  for (size_t i = 0; i < json_array_size(skipped); i++) {
    const char *name = json_string_value(json_array_get(skipped, i));
    assert_true(strcmp(name, "lm_head.weight") && strcmp(name, "model.norm.weight"));
  }
  json_decref(j);

  char *out = NULL;
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --backend sim --plan '%s' --strict", sl_test_bin(),
                               g_single, plan), 1);
  assert_one_error_line(out, g_single);
  assert_non_null(strstr(out, sl_status_name(SL_ERR_UNEXPECTED)));
  free(out);
  /* a plan file that does not exist: named in the error */
  char *none = sl_test_path(g_dir, "none.plan.json");
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --plan '%s'", sl_test_bin(), g_single, none), 1);
  assert_one_error_line(out, none);
  free(out);
  free(none);
  free(plan);
  free(jp);
}

/* Two ranks, each told its place either through the launcher environment (torchrun variables,
 * a file:// rendezvous) or through explicit flags (--rank/--world-size, a tcp:// rendezvous that
 * rank 0 serves): each rank's dump holds exactly its torch.chunk slice, whatever backend each
 * rank runs. */
static void two_ranks(int explicit_flags) {
  char *rdv = sl_test_dir("cli-rdv"), *dump = sl_test_path(g_dir, "dump2");
  char *j0 = sl_test_path(g_dir, "rank0.json"), *j1 = sl_test_path(g_dir, "rank1.json");
  char *out = NULL;
  char how0[256], how1[256];
  if (explicit_flags) {
    int port = 20000 + (int)(getpid() % 30000);
    snprintf(how1, sizeof how1, "--rank 1 --world-size 2 --rendezvous tcp://127.0.0.1:%d", port);
    snprintf(how0, sizeof how0, "--rank 0 --world-size 2 --rendezvous tcp://127.0.0.1:%d", port);
  } else {
    snprintf(how1, sizeof how1, "%s", "");
    snprintf(how0, sizeof how0, "%s", "");
  }
  /* with flags, the launcher variables left in the environment (RANK below) must not matter */
  char prefix[512];
  if (explicit_flags)
    snprintf(prefix, sizeof prefix, "unset WORLD_SIZE MASTER_ADDR MASTER_PORT SHARDLOAD_RENDEZVOUS;");
  else
    snprintf(prefix, sizeof prefix, "export WORLD_SIZE=2 SHARDLOAD_RENDEZVOUS=file://%s;", rdv);
  /* timeout: a rank whose peer died must not hang the test until the collective timeout */
  int rc = sl_test_run(&out,
                       "(rm -rf '%s'; %s "
                       "RANK=1 LOCAL_RANK=1 timeout 120 %s load '%s' %s --backend sim:strict --cpu-offload off "
                       "--dump '%s' --json > '%s' & "
                       "RANK=0 LOCAL_RANK=0 timeout 120 %s load '%s' %s --backend cpu --cpu-offload off "
                       "--dump '%s' --json > '%s'; "
                       "r0=$?; wait $!; r1=$?; exit $((r0 | r1)))",
                       dump, prefix, sl_test_bin(), g_sharded, how1, dump, j1, sl_test_bin(), g_sharded, how0, dump, j0);
  if (rc != 0 && out && strstr(out, "has no Gloo")) {
    free(out);
    skip(); /* a build without the Gloo collective cannot run two ranks */
  }
  if (rc != 0) fail_msg("two ranks exited %d: %s", rc, out ? out : "");
  assert_string_equal(out, "");
  free(out);
  for (int r = 0; r < 2; r++) {
    json_t *j = load_json_file(r ? j1 : j0);
    assert_int_equal(json_integer_value(json_object_get(j, "rank")), r);
    /* rank 0 runs cpu: host staging (shm: both share this host), whatever rank 1's sim could do */
    json_t *cj = json_object_get(j, "collective");
    assert_string_equal(json_string_value(json_object_get(cj, "name")), "shm");
    assert_string_equal(json_string_value(json_object_get(cj, "reason")),
                        "shm: backend cpu of rank 0 stages through host memory; every rank shares one host");
    assert_int_equal(json_integer_value(json_object_get(j, "world_size")), 2);
    json_t *t0 = json_array_get(json_object_get(j, "tensors"), 0);
    assert_string_equal(json_string_value(json_object_get(t0, "placement")), "device");
    assert_string_equal(json_string_value(json_object_get(j, "backend")), r ? "sim" : "cpu");
    json_decref(j);
    char name[32];
    snprintf(name, sizeof name, "rank-%d.safetensors", r);
    char *p = sl_test_path(dump, name);
    check_dump(p, g_sharded, 0, r, 2, NULL);
    free(p);
  }
  free(rdv);
  free(dump);
  free(j0);
  free(j1);
}

static void test_load_two_ranks(void **state) { two_ranks(0); }
static void test_load_two_ranks_explicit_flags(void **state) { two_ranks(1); }

static void test_errors(void **state) {
  char *out = NULL, *missing = sl_test_path(g_dir, "missing.safetensors");
  assert_int_equal(sl_test_run(&out, "%s inspect '%s'", sl_test_bin(), missing), 1);
  assert_one_error_line(out, missing);
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --backend cpu", sl_test_bin(), missing), 1);
  assert_one_error_line(out, missing);
  free(out);
  assert_int_equal(sl_test_run(&out, "%s plan '%s' --world 2", sl_test_bin(), missing), 1);
  assert_one_error_line(out, missing);
  free(out);

  /* usage: bad flag, bad dtype, bad values */
  assert_int_equal(sl_test_run(&out, "%s inspect --bogus '%s'", sl_test_bin(), g_single), 2);
  assert_one_error_line(out, "--bogus");
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --param-dtype F33", sl_test_bin(), g_single), 2);
  assert_one_error_line(out, "--param-dtype");
  assert_non_null(strstr(out, "F33"));
  free(out);
  assert_int_equal(sl_test_run(&out, "%s plan '%s' --world 2 --param-dtype nope", sl_test_bin(), g_single), 2);
  assert_one_error_line(out, "--param-dtype");
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --cpu-offload maybe", sl_test_bin(), g_single), 2);
  assert_one_error_line(out, "--cpu-offload");
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --staging lots", sl_test_bin(), g_single), 2);
  assert_one_error_line(out, "--staging");
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --dump", sl_test_bin(), g_single), 2);
  assert_one_error_line(out, "--dump");
  free(out);
  static const struct {
    const char *args, *subject;
  } bad_load[] = {
      {"--strategy gather", "--strategy"}, {"--source rank1", "--source"},   {"--timeout 0", "--timeout"},
      {"--timeout -3", "--timeout"},       {"--timeout soon", "--timeout"},  {"--nproc 0", "--nproc"},
      {"--nproc two", "--nproc"},          {"--nproc 1025", "--nproc"},
      {"--readers 2", "--readers"},        {"--source readers --readers 0", "--readers"},
      {"--source readers --readers 3 --nproc 2", "--readers"},
  };
  for (size_t i = 0; i < sizeof bad_load / sizeof bad_load[0]; i++) {
    assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' %s", sl_test_bin(), g_single, bad_load[i].args), 2);
    assert_one_error_line(out, bad_load[i].subject);
    free(out);
  }
  assert_int_equal(sl_test_run(&out, "%s synth '%s/x' --size 12", sl_test_bin(), g_dir), 2);
  assert_one_error_line(out, "--size");
  free(out);
  assert_int_equal(sl_test_run(&out, "%s synth '%s/x' --dtype I32", sl_test_bin(), g_dir), 2);
  assert_one_error_line(out, "--dtype");
  free(out);
  assert_int_equal(sl_test_run(&out, "%s inspect", sl_test_bin()), 2);
  assert_one_error_line(out, "inspect");
  free(out);

  /* corrupt files: exit 1 naming the file */
  char *bad = sl_test_path(g_dir, "corrupt.safetensors");
  assert_int_equal(sl_test_write_raw(bad, "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]", 16), 0);
  assert_int_equal(sl_test_run(&out, "%s inspect '%s'", sl_test_bin(), bad), 1);
  assert_one_error_line(out, bad);
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --backend cpu", sl_test_bin(), bad), 1);
  assert_one_error_line(out, bad);
  free(out);
  /* data shorter than the header promises */
  assert_int_equal(sl_test_write_raw(bad, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8), 0);
  assert_int_equal(sl_test_run(&out, "%s inspect '%s'", sl_test_bin(), bad), 1);
  assert_one_error_line(out, bad);
  free(out);
  free(bad);
  free(missing);
}

/* ---- outputs and errors (docs/DESIGN.md#outputs) ---------------------------------------------- */

/* Entries of DIR besides . and .., so a test can say that a failed dump left nothing behind. */
static int dir_entries(const char *dir, char *names, size_t len) {
  char *out = NULL;
  int rc = sl_test_run(&out, "ls -A '%s'", dir);
  assert_int_equal(rc, 0);
  int n = 0;
  for (const char *c = out; *c; c++) n += *c == '\n';
  if (names) snprintf(names, len, "%s", out);
  free(out);
  return n;
}

/* --dump writes through a temporary file renamed into place: a symlink planted at the
 * destination is replaced, never followed (its target keeps its bytes); a write that fails
 * (a file size limit: EFBIG, as a full disk gives ENOSPC) leaves no file claiming the full
 * size, no temporary, and an earlier complete dump untouched. */
static void test_dump_atomic(void **state) {
  char *dump = sl_test_path(g_dir, "dump-atomic"), *victim = sl_test_path(g_dir, "victim.txt");
  char *rank0 = sl_test_path(dump, "rank-0.safetensors"), *out = NULL, names[4096];
  assert_int_equal(sl_test_run(&out, "rm -rf '%s' && mkdir -p '%s' && printf victim > '%s' && ln -s '%s' '%s'",
                               dump, dump, victim, victim, rank0), 0);
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --backend cpu --dump '%s' --json", sl_test_bin(),
                               g_single, dump), 0);
  free(out);
  char buf[64] = "";
  FILE *f = fopen(victim, "rb");
  assert_non_null(f);
  buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
  fclose(f);
  assert_string_equal(buf, "victim");
  struct stat sb;
  assert_int_equal(lstat(rank0, &sb), 0);
  assert_true(S_ISREG(sb.st_mode));
  mode_t mask = umask(0);
  umask(mask);
  assert_int_equal(sb.st_mode & 0777, 0644 & ~mask);
  check_dump(rank0, g_single, 0, 0, 1, NULL);
  assert_int_equal(dir_entries(dump, names, sizeof names), 1);

  /* the same dump again under a 64 KiB file size limit: it fails with EFBIG (not SIGXFSZ),
   * exit 1 naming the file, and the complete dump from before is still there, alone */
  off_t before = sb.st_size;
  assert_int_equal(sl_test_run(&out, ENV1 " sh -c 'ulimit -f 128; exec %s load \"%s\" --backend cpu --dump \"%s\"'",
                               sl_test_bin(), g_single, dump), 1);
  assert_one_error_line(out, rank0);
  assert_non_null(strstr(out, strerror(EFBIG)));
  free(out);
  if (dir_entries(dump, names, sizeof names) != 1) fail_msg("a failed dump left files behind: %s", names);
  assert_int_equal(lstat(rank0, &sb), 0);
  assert_int_equal(sb.st_size, before);
  check_dump(rank0, g_single, 0, 0, 1, NULL);

  /* and into an empty directory: nothing at all */
  assert_int_equal(sl_test_run(&out, "rm -rf '%s' && mkdir -p '%s'", dump, dump), 0);
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " sh -c 'ulimit -f 128; exec %s load \"%s\" --backend cpu --dump \"%s\"'",
                               sl_test_bin(), g_single, dump), 1);
  free(out);
  if (dir_entries(dump, names, sizeof names) != 0) fail_msg("a failed dump left files behind: %s", names);
  free(rank0);
  free(victim);
  free(dump);
}

/* A newline or an escape sequence in a path or a tensor name never splits the error line or
 * reaches the terminal raw: the subject and the message are escaped. */
static void test_error_line_sanitised(void **state) {
  char *out = NULL, want[4096];
  assert_int_equal(sl_test_run(&out, "%s inspect \"$(printf '%s/no\\nsuch\\033[31m.safetensors')\"", sl_test_bin(),
                               g_dir), 1);
  snprintf(want, sizeof want, "%s/no\\nsuch\\x1b[31m.safetensors", g_dir);
  assert_one_error_line(out, want);
  assert_null(strchr(out, '\033'));
  free(out);
  /* the same through load and plan */
  assert_int_equal(sl_test_run(&out, ENV1 " %s load \"$(printf '%s/a\\rb')\" --backend cpu", sl_test_bin(), g_dir), 1);
  snprintf(want, sizeof want, "%s/a\\rb", g_dir);
  assert_one_error_line(out, want);
  free(out);
  assert_int_equal(sl_test_run(&out, "%s plan \"$(printf '%s/a\\tb\\001')\" --world 2", sl_test_bin(), g_dir), 1);
  snprintf(want, sizeof want, "%s/a\\tb\\x01", g_dir);
  assert_one_error_line(out, want);
  free(out);
}

/* `inspect` prints control characters in tensor names (and metadata) escaped: a name cannot
 * fake table rows or drive the terminal. */
static void test_inspect_escapes_names(void **state) {
  char *p = sl_test_path(g_dir, "ctl-names.safetensors"), *out = NULL;
  const char *hdr = "{\"__metadata__\":{\"note\":\"x\\ny\"},"
                    "\"evil\\nfake row\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                    "\"red\\u001b[31m\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}";
  assert_int_equal(sl_test_write_raw(p, hdr, 4), 0);
  assert_int_equal(sl_test_run(&out, "%s inspect '%s'", sl_test_bin(), p), 0);
  assert_null(strchr(out, '\033'));
  assert_non_null(strstr(out, "evil\\nfake row  "));
  assert_non_null(strstr(out, "red\\x1b[31m  "));
  assert_non_null(strstr(out, "note: x\\ny\n"));
  /* header, "metadata:", one metadata line, column titles, two rows */
  int lines = 0;
  for (const char *c = out; *c; c++) lines += *c == '\n';
  assert_int_equal(lines, 6);
  free(out);
  /* the tables of plan and load too */
  assert_int_equal(sl_test_run(&out, "%s plan '%s' --world 1", sl_test_bin(), p), 0);
  assert_null(strchr(out, '\033'));
  assert_non_null(strstr(out, "evil\\nfake row  "));
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --backend cpu", sl_test_bin(), p), 0);
  assert_null(strchr(out, '\033'));
  assert_non_null(strstr(out, "red\\x1b[31m  "));
  free(out);
  /* --json keeps the exact names (JSON escapes them itself) */
  assert_int_equal(sl_test_run(&out, "%s inspect '%s' --json", sl_test_bin(), p), 0);
  json_error_t err;
  json_t *j = json_loads(out, 0, &err);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "tensors"), 0), "name")),
                      "evil\nfake row");
  json_decref(j);
  free(out);
  free(p);
}

/* --json keeps a path that is not UTF-8: "path" with U+FFFD for the bad byte, and the exact
 * bytes in "path_bytes_hex" (jansson refuses such strings, so it used to be dropped). */
static void test_json_non_utf8_path(void **state) {
  char *out = NULL, cmd_path[4096];
  snprintf(cmd_path, sizeof cmd_path, "\"$(printf '%s/caf\\351.safetensors')\"", g_dir);
  assert_int_equal(sl_test_run(&out, "cp '%s' %s", g_single, cmd_path), 0);
  free(out);
  char want_path[4096], want_hex[8192];
  snprintf(want_path, sizeof want_path, "%s/caf\xef\xbf\xbd.safetensors", g_dir);
  char raw[4096];
  snprintf(raw, sizeof raw, "%s/caf\351.safetensors", g_dir);
  for (size_t i = 0; raw[i]; i++) snprintf(want_hex + 2 * i, 3, "%02x", (unsigned char)raw[i]);
  static const char *cmds[] = {"inspect %s --json", ENV1 " %s load %s --backend cpu --json",
                               "%s plan %s --world 2 --json"};
  for (int i = 0; i < 3; i++) {
    char fmt[256];
    snprintf(fmt, sizeof fmt, "%s", cmds[i]);
    char line[8192];
    if (i == 0) snprintf(line, sizeof line, "%s inspect %s --json", sl_test_bin(), cmd_path);
    else if (i == 1) snprintf(line, sizeof line, ENV1 " %s load %s --backend cpu --json", sl_test_bin(), cmd_path);
    else snprintf(line, sizeof line, "%s plan %s --world 2 --json", sl_test_bin(), cmd_path);
    assert_int_equal(sl_test_run(&out, "%s", line), 0);
    json_error_t err;
    json_t *j = json_loads(out, 0, &err);
    if (!j) fail_msg("%s: not JSON: %s", line, err.text);
    const char *got = json_string_value(json_object_get(j, "path"));
    if (!got) fail_msg("%s: no \"path\"", line);
    assert_string_equal(got, want_path);
    assert_string_equal(json_string_value(json_object_get(j, "path_bytes_hex")), want_hex);
    if (i == 0) {
      /* "files" keeps the file at its index, "files_bytes_hex" its exact bytes there */
      json_t *files = json_object_get(j, "files"), *hex = json_object_get(j, "files_bytes_hex");
      assert_int_equal(json_array_size(files), 1);
      assert_int_equal(json_array_size(hex), 1);
      assert_string_equal(json_string_value(json_array_get(files, 0)), want_path);
      assert_string_equal(json_string_value(json_array_get(hex, 0)), want_hex);
    }
    json_decref(j);
    free(out);
  }
  /* --dump into a directory whose name is not UTF-8: "dump" is kept the same way */
  char dump_cmd[4096], dump_raw[4096], dump_hex[8192], dump_lossy[4096];
  snprintf(dump_cmd, sizeof dump_cmd, "\"$(printf '%s/dump\351')\"", g_dir);
  snprintf(dump_raw, sizeof dump_raw, "%s/dump\351/rank-0.safetensors", g_dir);
  snprintf(dump_lossy, sizeof dump_lossy, "%s/dump\xef\xbf\xbd/rank-0.safetensors", g_dir);
  for (size_t i = 0; dump_raw[i]; i++) snprintf(dump_hex + 2 * i, 3, "%02x", (unsigned char)dump_raw[i]);
  assert_int_equal(sl_test_run(&out, "rm -rf %s && mkdir %s && " ENV1 " %s load '%s' --backend cpu --dump %s --json",
                               dump_cmd, dump_cmd, sl_test_bin(), g_single, dump_cmd), 0);
  json_t *dj = json_loads(out, 0, NULL);
  if (!dj) fail_msg("load --dump --json: not JSON: %s", out);
  if (!json_string_value(json_object_get(dj, "dump"))) fail_msg("no \"dump\" in %s", out);
  assert_string_equal(json_string_value(json_object_get(dj, "dump")), dump_lossy);
  assert_string_equal(json_string_value(json_object_get(dj, "dump_bytes_hex")), dump_hex);
  json_decref(dj);
  free(out);
  /* a UTF-8 path has no _bytes_hex twin */
  assert_int_equal(sl_test_run(&out, "%s inspect '%s' --json", sl_test_bin(), g_single), 0);
  json_t *j = json_loads(out, 0, NULL);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(j, "path")), g_single);
  assert_null(json_object_get(j, "path_bytes_hex"));
  assert_string_equal(json_string_value(json_array_get(json_object_get(j, "files"), 0)), g_single);
  assert_null(json_object_get(j, "files_bytes_hex"));
  json_decref(j);
  free(out);
}

/* The human reports print paths escaped like everything else from outside: a newline in the
 * checkpoint or dump path cannot split "plan for ..." or "dump: ..." into fake lines. */
static void test_report_paths_escaped(void **state) {
  char *out = NULL, cmd_dir[4096], want[4096];
  snprintf(cmd_dir, sizeof cmd_dir, "\"$(printf '%s/esc\nfake\033[31m')\"", g_dir);
  assert_int_equal(sl_test_run(&out, "rm -rf %s && mkdir %s && cp '%s' %s/m.safetensors", cmd_dir, cmd_dir, g_single,
                               cmd_dir), 0);
  free(out);
  assert_int_equal(sl_test_run(&out, "%s plan %s/m.safetensors --world 1", sl_test_bin(), cmd_dir), 0);
  assert_null(strchr(out, '\033'));
  snprintf(want, sizeof want, "plan for %s/esc\\nfake\\x1b[31m/m.safetensors: world 1", g_dir);
  if (!strstr(out, want)) fail_msg("'%s' not in: %s", want, out);
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load %s/m.safetensors --backend cpu --dump %s", sl_test_bin(), cmd_dir,
                               cmd_dir), 0);
  assert_null(strchr(out, '\033'));
  snprintf(want, sizeof want, "\ndump: %s/esc\\nfake\\x1b[31m/rank-0.safetensors\n", g_dir);
  if (!strstr(out, want)) fail_msg("'%s' not in: %s", want, out);
  free(out);
}

/* Tensor names longer than any fixed buffer keep their own dump metadata keys: two names that
 * differ only past 1 KiB do not collide, and one whose 1 KiB mark falls inside a UTF-8
 * sequence does not lose its keys. */
static void test_dump_long_names(void **state) {
  enum { LONG = 1100 };
  char names[3][LONG + 8];
  memset(names[0], 'a', LONG);
  snprintf(names[0] + LONG, 8, "1");
  memset(names[1], 'a', LONG);
  snprintf(names[1] + LONG, 8, "2");
  memset(names[2], 'b', 1022); /* a 1 KiB buffer's last byte cuts the 2-byte sequence */
  snprintf(names[2] + 1022, 8, "\xc3\xa9");
  size_t hlen = 3 * (LONG + 128) + 64;
  char *hdr = malloc(hlen), *p = sl_test_path(g_dir, "long-names.safetensors");
  char *dump = sl_test_path(g_dir, "dump-long"), *rank0 = sl_test_path(dump, "rank-0.safetensors"), *out = NULL;
  assert_non_null(hdr);
  snprintf(hdr, hlen,
           "{\"%s\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
           "\"%s\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[2,5]},"
           "\"%s\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[5,9]}}",
           names[0], names[1], names[2]);
  assert_int_equal(sl_test_write_raw(p, hdr, 9), 0);
  assert_int_equal(sl_test_run(&out, "rm -rf '%s' && mkdir -p '%s' && " ENV1 " %s load '%s' --backend cpu --dump '%s'",
                               dump, dump, sl_test_bin(), p, dump), 0);
  free(out);
  st_file f;
  st_open(rank0, &f);
  static const char *want_shape[] = {"[2]", "[3]", "[4]"};
  for (int i = 0; i < 3; i++) {
    char *key = NULL;
    assert_true(asprintf(&key, "%s.global_shape", names[i]) > 0);
    const char *v = st_meta(&f, key);
    if (!v) fail_msg("the dump lacks the metadata key of tensor %d (%zu bytes)", i, strlen(names[i]));
    assert_string_equal(v, want_shape[i]);
    free(key);
    assert_true(asprintf(&key, "%s.global_offset", names[i]) > 0);
    assert_non_null(st_meta(&f, key));
    assert_string_equal(st_meta(&f, key), "[0]");
    free(key);
  }
  st_close(&f);
  free(rank0);
  free(dump);
  free(p);
  free(hdr);
}

/* `plan` reports what `load` would: a plan naming a tensor the checkpoint lacks fails both,
 * with the same line (one code path in the core), where the dry run used to print "0 tensors". */
static void test_plan_fails_like_load(void **state) {
  char *pf = sl_test_path(g_dir, "lacking.plan.json"), *dry = NULL, *wet = NULL;
  const char *text = "{\"tensors\":{\"model.norm.weight\":{},\"no.such.tensor\":{}}}";
  assert_int_equal(sl_test_write_bytes(pf, text, strlen(text)), 0);
  assert_int_equal(sl_test_run(&dry, "%s plan '%s' --world 1 --plan '%s'", sl_test_bin(), g_single, pf), 1);
  assert_one_error_line(dry, g_single);
  assert_non_null(strstr(dry, sl_status_name(SL_ERR_MISSING)));
  assert_non_null(strstr(dry, "no.such.tensor"));
  assert_int_equal(sl_test_run(&wet, ENV1 " %s load '%s' --backend cpu --plan '%s'", sl_test_bin(), g_single, pf), 1);
  assert_string_equal(dry, wet);
  free(dry);
  free(wet);
  free(pf);
}

/* Usage errors the library finds (an uncastable --param-dtype, a --mesh the world does not
 * fill) exit 2 like any other usage error; shard(99) on a 2-D tensor is out of range, named. */
static void test_usage_found_late(void **state) {
  char *out = NULL;
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --backend cpu --param-dtype I32", sl_test_bin(), g_single), 2);
  assert_one_error_line(out, "--param-dtype");
  free(out);
  assert_int_equal(sl_test_run(&out, "%s plan '%s' --world 2 --param-dtype int8", sl_test_bin(), g_single), 2);
  assert_one_error_line(out, "--param-dtype");
  free(out);
  assert_int_equal(sl_test_run(&out, ENV1 " %s load '%s' --backend cpu --mesh 2", sl_test_bin(), g_single), 2);
  assert_one_error_line(out, "--mesh");
  free(out);
  assert_int_equal(sl_test_run(&out, "%s plan '%s' --world 2 --placement 'shard(99)'", sl_test_bin(), g_single), 1);
  assert_one_error_line(out, g_single);
  assert_non_null(strstr(out, "shard(99)"));
  assert_non_null(strstr(out, "out of range for a 2-d tensor"));
  assert_null(strstr(out, "cannot parse"));
  free(out);
  /* the launcher flags are documented */
  assert_int_equal(sl_test_run(&out, "%s load --help", sl_test_bin()), 0);
  assert_non_null(strstr(out, "--insecure-rendezvous"));
  assert_non_null(strstr(out, "SHARDLOAD_TOKEN"));
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help_and_version),
      cmocka_unit_test(test_synth_single),
      cmocka_unit_test(test_synth_sharded),
      cmocka_unit_test(test_inspect),
      cmocka_unit_test(test_plan_chunk),
      cmocka_unit_test(test_plan_file_names_tensors),
      cmocka_unit_test(test_load_matrix),
      cmocka_unit_test(test_load_cast_and_sharded),
      cmocka_unit_test(test_load_human),
      cmocka_unit_test(test_load_collective_and_device),
      cmocka_unit_test(test_load_plan_file),
      cmocka_unit_test(test_load_two_ranks),
      cmocka_unit_test(test_load_two_ranks_explicit_flags),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_dump_atomic),
      cmocka_unit_test(test_error_line_sanitised),
      cmocka_unit_test(test_inspect_escapes_names),
      cmocka_unit_test(test_json_non_utf8_path),
      cmocka_unit_test(test_report_paths_escaped),
      cmocka_unit_test(test_dump_long_names),
      cmocka_unit_test(test_plan_fails_like_load),
      cmocka_unit_test(test_usage_found_late),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
