/* The checkpoint source: single files, sharded indexes, directories, lookups, positional reads
 * and the manifest that carries the tensor table to other ranks. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

static sl_context *g_ctx;

static int setup(void **state) {
  sl_context_options o = {.size = sizeof o, .backend = "cpu", .collective = "local", .rank = 0,
                          .world_size = 1, .local_rank = 0};
  return sl_context_create(&o, &g_ctx) == SL_OK ? 0 : -1;
}

static int teardown(void **state) {
  sl_context_destroy(g_ctx);
  return 0;
}

static const char *errmsg(void) { return sl_context_errmsg(g_ctx); }

static void assert_msg_has(const char *needle) {
  if (!strstr(errmsg(), needle)) print_error("message '%s' lacks '%s'\n", errmsg(), needle);
  assert_non_null(strstr(errmsg(), needle));
}

/* Data offset (8 + N) of a safetensors file, read directly. */
static uint64_t data_offset_of(const char *path) {
  unsigned char b[8];
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  assert_int_equal(fread(b, 1, 8, f), 8);
  fclose(f);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
  return 8 + n;
}

/* Reads every byte of every tensor (in odd-sized pieces) and compares with the pattern. */
static void check_pattern(sl_source *src) {
  for (size_t i = 0; i < sl_source_tensor_count(src); i++) {
    const sl_source_tensor *t = sl_source_tensor_at(src, i);
    unsigned char *buf = malloc(t->nbytes + 1);
    uint64_t off = 0;
    while (off < t->nbytes) {
      size_t piece = (size_t)(t->nbytes - off < 7 ? t->nbytes - off : 7);
      assert_int_equal(sl__source_pread(src, i, off, buf + off, piece), SL_OK);
      off += piece;
    }
    for (uint64_t k = 0; k < t->nbytes; k++) assert_int_equal(buf[k], sl_test_pattern_byte(t->name, k));
    free(buf);
  }
}

static const sl_test_tensor k_single[] = {
    {"embed.weight", "BF16", 2, {4, 3}, NULL},
    {"layer.0.bias", "F32", 1, {5}, NULL},
    {"scale", "F64", 0, {0}, NULL},
    {"empty", "I8", 2, {0, 7}, NULL},
    {"mask", "BOOL", 1, {3}, NULL},
};

static void single_file(void **state) {
  char *dir = sl_test_dir("source-single");
  char *p = sl_test_path(dir, "model.safetensors");
  assert_int_equal(sl_test_write_st(p, k_single, 5, "{\"format\":\"pt\",\"who\":\"test\"}"), 0);
  sl_source *src = NULL;
  assert_int_equal(sl_source_open(g_ctx, p, &src), SL_OK);
  assert_true(sl__source_has_files(src));
  assert_int_equal(sl_source_tensor_count(src), 5);
  assert_int_equal(sl_source_file_count(src), 1);
  assert_string_equal(sl_source_file_at(src, 0), p);
  assert_null(sl_source_file_at(src, 1));
  assert_null(sl_source_tensor_at(src, 5));
  uint64_t base = data_offset_of(p), pos = 0, total = 0;
  static const uint64_t nbytes[] = {24, 20, 8, 0, 3};
  for (size_t i = 0; i < 5; i++) {
    const sl_source_tensor *t = sl_source_tensor_at(src, i);
    assert_string_equal(t->name, k_single[i].name);
    assert_int_equal(t->dtype, sl_dtype_from_name(k_single[i].dtype));
    assert_int_equal(t->ndim, k_single[i].ndim);
    for (int d = 0; d < t->ndim; d++) assert_int_equal(t->shape[d], k_single[i].shape[d]);
    assert_int_equal(t->nbytes, nbytes[i]);
    assert_string_equal(t->file, p);
    assert_int_equal(t->file_offset, base + pos);
    pos += nbytes[i];
    total += nbytes[i];
  }
  assert_int_equal(sl_source_total_bytes(src), total);
  assert_int_equal(sl_source_metadata_count(src), 2);
  const char *k, *v;
  assert_int_equal(sl_source_metadata_at(src, 0, &k, &v), SL_OK);
  assert_string_equal(k, "format");
  assert_string_equal(v, "pt");
  assert_int_equal(sl_source_metadata_at(src, 1, &k, &v), SL_OK);
  assert_string_equal(k, "who");
  assert_string_equal(v, "test");
  assert_int_not_equal(sl_source_metadata_at(src, 2, &k, &v), SL_OK);
  assert_null(k);
  assert_null(v);
  check_pattern(src);
  sl_source_destroy(src);
  free(p);
  free(dir);
}

static void pread_bounds_and_truncation(void **state) {
  char *dir = sl_test_dir("source-pread");
  char *p = sl_test_path(dir, "m.safetensors");
  assert_int_equal(sl_test_write_st(p, k_single, 5, NULL), 0);
  sl_source *src = NULL;
  assert_int_equal(sl_source_open(g_ctx, p, &src), SL_OK);
  unsigned char buf[32];
  /* a read past the end of the tensor is the caller's bug */
  assert_int_equal(sl__source_pread(src, 1, 16, buf, 5), SL_ERR_INVALID);
  assert_msg_has("layer.0.bias");
  assert_int_equal(sl__source_pread(src, 1, UINT64_MAX, buf, 2), SL_ERR_INVALID);
  assert_int_equal(sl__source_pread(src, 9, 0, buf, 1), SL_ERR_INVALID);
  /* the last bytes of a tensor */
  assert_int_equal(sl__source_pread(src, 1, 15, buf, 5), SL_OK);
  for (int k = 0; k < 5; k++) assert_int_equal(buf[k], sl_test_pattern_byte("layer.0.bias", 15 + (uint64_t)k));
  /* the file shrinks under an open source: a short read names the file */
  const sl_source_tensor *t = sl_source_tensor_at(src, 1);
  assert_int_equal(truncate(p, (off_t)(t->file_offset + 10)), 0);
  assert_int_equal(sl__source_pread(src, 1, 0, buf, 20), SL_ERR_IO);
  assert_msg_has(p);
  assert_msg_has("truncated");
  sl_source_destroy(src);
  /* and reopening it is a format error naming the file */
  assert_int_equal(sl_source_open(g_ctx, p, &src), SL_ERR_FORMAT);
  assert_null(src);
  assert_msg_has(p);
  free(p);
  free(dir);
}

/* Two shards, written so that neither JSON order nor file creation order is the file order. */
static void write_sharded(const char *dir, const char *index_name, const char *extra_map) {
  static const sl_test_tensor s2[] = {{"model.norm", "F32", 1, {4}, NULL}, {"lm_head", "F16", 2, {2, 4}, NULL}};
  static const sl_test_tensor s1[] = {{"embed", "BF16", 2, {3, 4}, NULL}, {"layers.0.w", "F32", 2, {2, 2}, NULL},
                                      {"step", "I64", 0, {0}, NULL}};
  char *p2 = sl_test_path(dir, "model-00002-of-00002.safetensors");
  char *p1 = sl_test_path(dir, "model-00001-of-00002.safetensors");
  assert_int_equal(sl_test_write_st(p2, s2, 2, "{\"format\":\"pt\"}"), 0);
  assert_int_equal(sl_test_write_st(p1, s1, 3, "{\"format\":\"pt\"}"), 0);
  char *ix = sl_test_path(dir, index_name);
  char json[2048];
  snprintf(json, sizeof json,
           "{\"metadata\":{\"total_size\":136,\"format\":\"pt\"},\"weight_map\":{"
           "\"lm_head\":\"model-00002-of-00002.safetensors\",\"step\":\"model-00001-of-00002.safetensors\","
           "\"model.norm\":\"model-00002-of-00002.safetensors\",\"embed\":\"model-00001-of-00002.safetensors\","
           "\"layers.0.w\":\"model-00001-of-00002.safetensors\"%s}}",
           extra_map ? extra_map : "");
  assert_int_equal(sl_test_write_bytes(ix, json, strlen(json)), 0);
  free(p1);
  free(p2);
  free(ix);
}

static void check_sharded(sl_source *src, const char *dir) {
  char *p1 = sl_test_path(dir, "model-00001-of-00002.safetensors");
  char *p2 = sl_test_path(dir, "model-00002-of-00002.safetensors");
  static const char *order[] = {"embed", "layers.0.w", "step", "model.norm", "lm_head"};
  static const uint64_t nbytes[] = {24, 16, 8, 16, 16};
  assert_int_equal(sl_source_tensor_count(src), 5);
  assert_int_equal(sl_source_file_count(src), 2);
  assert_string_equal(sl_source_file_at(src, 0), p1);
  assert_string_equal(sl_source_file_at(src, 1), p2);
  uint64_t pos = data_offset_of(p1);
  for (size_t i = 0; i < 5; i++) {
    const sl_source_tensor *t = sl_source_tensor_at(src, i);
    if (i == 3) pos = data_offset_of(p2);
    assert_string_equal(t->name, order[i]);
    assert_string_equal(t->file, i < 3 ? p1 : p2);
    assert_int_equal(t->nbytes, nbytes[i]);
    assert_int_equal(t->file_offset, pos);
    pos += nbytes[i];
  }
  assert_int_equal(sl_source_tensor_at(src, 2)->ndim, 0);
  assert_int_equal(sl_source_tensor_at(src, 4)->dtype, SL_DTYPE_F16);
  assert_int_equal(sl_source_total_bytes(src), 80);
  /* the index's metadata, not the shards' */
  assert_int_equal(sl_source_metadata_count(src), 2);
  const char *k, *v;
  assert_int_equal(sl_source_metadata_at(src, 0, &k, &v), SL_OK);
  assert_string_equal(k, "total_size");
  assert_string_equal(v, "136");
  assert_int_equal(sl_source_metadata_at(src, 1, &k, &v), SL_OK);
  assert_string_equal(k, "format");
  assert_string_equal(v, "pt");
  free(p1);
  free(p2);
}

static void index_two_files(void **state) {
  char *dir = sl_test_dir("source-index");
  write_sharded(dir, "model.safetensors.index.json", NULL);
  char *ix = sl_test_path(dir, "model.safetensors.index.json");
  sl_source *src = NULL;
  assert_int_equal(sl_source_open(g_ctx, ix, &src), SL_OK);
  check_sharded(src, dir);
  check_pattern(src);
  sl_source_destroy(src);
  /* the directory finds the index */
  assert_int_equal(sl_source_open(g_ctx, dir, &src), SL_OK);
  check_sharded(src, dir);
  sl_source_destroy(src);
  free(ix);
  free(dir);
}

static void directory_forms(void **state) {
  sl_source *src = NULL;
  /* one .safetensors */
  char *dir = sl_test_dir("source-dir-one");
  char *p = sl_test_path(dir, "weights.safetensors");
  assert_int_equal(sl_test_write_st(p, k_single, 2, NULL), 0);
  assert_int_equal(sl_source_open(g_ctx, dir, &src), SL_OK);
  assert_int_equal(sl_source_tensor_count(src), 2);
  assert_string_equal(sl_source_file_at(src, 0), p);
  sl_source_destroy(src);
  free(p);
  /* a second one without an index is ambiguous */
  p = sl_test_path(dir, "other.safetensors");
  assert_int_equal(sl_test_write_st(p, k_single + 2, 1, NULL), 0);
  assert_int_equal(sl_source_open(g_ctx, dir, &src), SL_ERR_INVALID);
  assert_null(src);
  assert_msg_has("2 .safetensors files");
  assert_msg_has("other.safetensors");
  assert_msg_has("model.safetensors.index.json");
  free(p);
  free(dir);
  /* nothing at all */
  dir = sl_test_dir("source-dir-none");
  assert_int_equal(sl_source_open(g_ctx, dir, &src), SL_ERR_NOT_FOUND);
  assert_msg_has("no .safetensors");
  free(dir);
  /* a differently named index, alone, is used */
  dir = sl_test_dir("source-dir-other-index");
  write_sharded(dir, "diffusion_pytorch_model.safetensors.index.json", NULL);
  assert_int_equal(sl_source_open(g_ctx, dir, &src), SL_OK);
  check_sharded(src, dir);
  sl_source_destroy(src);
  free(dir);
  /* relative paths become absolute (the manifest carries them to other ranks); a trailing
   * slash does not double */
  dir = sl_test_dir("source-dir-relative");
  p = sl_test_path(dir, "weights.safetensors");
  assert_int_equal(sl_test_write_st(p, k_single, 2, NULL), 0);
  char *cwd = getcwd(NULL, 0);
  assert_int_equal(chdir(dir), 0);
  assert_int_equal(sl_source_open(g_ctx, "weights.safetensors", &src), SL_OK);
  assert_int_equal(chdir(cwd), 0);
  assert_true(sl_source_file_at(src, 0)[0] == '/');
  assert_non_null(strstr(sl_source_file_at(src, 0), "/source-dir-relative/weights.safetensors"));
  sl_source_destroy(src);
  char *slash = sl_test_path(dir, "");
  assert_int_equal(sl_source_open(g_ctx, slash, &src), SL_OK);
  assert_string_equal(sl_source_file_at(src, 0), p);
  sl_source_destroy(src);
  free(slash);
  free(cwd);
  free(p);
  free(dir);
  /* missing path */
  assert_int_equal(sl_source_open(g_ctx, "/nonexistent/shardload/x.safetensors", &src), SL_ERR_NOT_FOUND);
  assert_msg_has("/nonexistent/shardload/x.safetensors");
  assert_int_equal(sl_source_open(g_ctx, NULL, &src), SL_ERR_INVALID);
  sl_source_destroy(NULL);
}

static void index_errors(void **state) {
  sl_source *src = NULL;
  char *dir = sl_test_dir("source-index-missing-file");
  write_sharded(dir, "model.safetensors.index.json", ",\"extra.w\":\"model-00003-of-00003.safetensors\"");
  assert_int_equal(sl_source_open(g_ctx, dir, &src), SL_ERR_NOT_FOUND);
  assert_null(src);
  assert_msg_has("extra.w");
  assert_msg_has("model-00003-of-00003.safetensors");
  free(dir);

  dir = sl_test_dir("source-index-missing-tensor");
  write_sharded(dir, "model.safetensors.index.json", ",\"ghost\":\"model-00001-of-00002.safetensors\"");
  assert_int_equal(sl_source_open(g_ctx, dir, &src), SL_ERR_FORMAT);
  assert_msg_has("'ghost'");
  assert_msg_has("model-00001-of-00002.safetensors");
  free(dir);

  /* the index says a tensor is in the other file */
  dir = sl_test_dir("source-index-wrong-file");
  write_sharded(dir, "model.safetensors.index.json", NULL);
  char *ix = sl_test_path(dir, "model.safetensors.index.json");
  const char *wrong = "{\"weight_map\":{\"lm_head\":\"model-00001-of-00002.safetensors\","
                      "\"step\":\"model-00001-of-00002.safetensors\",\"model.norm\":\"model-00002-of-00002.safetensors\","
                      "\"embed\":\"model-00001-of-00002.safetensors\",\"layers.0.w\":\"model-00001-of-00002.safetensors\"}}";
  assert_int_equal(sl_test_write_bytes(ix, wrong, strlen(wrong)), 0);
  assert_int_equal(sl_source_open(g_ctx, ix, &src), SL_ERR_FORMAT);
  assert_msg_has("'lm_head'");
  assert_msg_has("model-00002-of-00002.safetensors");

  /* a tensor in a file that the weight_map does not list */
  const char *unlisted = "{\"weight_map\":{\"lm_head\":\"model-00002-of-00002.safetensors\","
                         "\"model.norm\":\"model-00002-of-00002.safetensors\","
                         "\"embed\":\"model-00001-of-00002.safetensors\",\"step\":\"model-00001-of-00002.safetensors\"}}";
  assert_int_equal(sl_test_write_bytes(ix, unlisted, strlen(unlisted)), 0);
  assert_int_equal(sl_source_open(g_ctx, ix, &src), SL_ERR_FORMAT);
  assert_msg_has("'layers.0.w'");
  assert_msg_has("does not list");

  /* malformed indexes */
  static const struct {
    const char *json, *needle;
  } bad[] = {
      {"[1]", "JSON object"},
      {"{\"metadata\":{}}", "no weight_map"},
      {"{\"weight_map\":[]}", "weight_map must be an object"},
      {"{\"weight_map\":{}}", "weight_map is empty"},
      {"{\"weight_map\":{\"a\":1}}", "weight_map entry 'a'"},
      {"{\"weight_map\":{\"a\":\"\"}}", "weight_map entry 'a'"},
      {"{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}", "duplicate"},
      {"{\"metadata\":3,\"weight_map\":{\"a\":\"x\"}}", "metadata must be an object"},
      {"{\"weight_map\":", "not valid JSON"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(sl_test_write_bytes(ix, bad[i].json, strlen(bad[i].json)), 0);
    assert_int_equal(sl_source_open(g_ctx, ix, &src), SL_ERR_FORMAT);
    assert_null(src);
    assert_msg_has(bad[i].needle);
    assert_msg_has(ix);
  }
  free(ix);
  free(dir);
}

static void index_parse_direct(void **state) {
  const char *j = "{\"metadata\":{\"n\":1.5,\"b\":true,\"o\":{\"x\":[1]}},"
                  "\"weight_map\":{\"z\":\"b.st\",\"y\":\"a.st\",\"x\":\"b.st\"}}";
  sl__index ix;
  char err[256];
  assert_int_equal(sl__index_parse(j, strlen(j), &ix, err, sizeof err), SL_OK);
  assert_int_equal(ix.file_count, 2);
  assert_string_equal(ix.files[0], "a.st");
  assert_string_equal(ix.files[1], "b.st");
  assert_int_equal(ix.count, 3);
  assert_string_equal(ix.names[0], "z");
  assert_int_equal(ix.file_of[0], 1);
  assert_string_equal(ix.names[1], "y");
  assert_int_equal(ix.file_of[1], 0);
  assert_int_equal(ix.file_of[2], 1);
  assert_int_equal(ix.meta_count, 3);
  assert_string_equal(ix.meta_values[0], "1.5");
  assert_string_equal(ix.meta_values[1], "true");
  assert_string_equal(ix.meta_values[2], "{\"x\":[1]}");
  sl__index_free(&ix);
  assert_int_equal(ix.count, 0);
}

static void find(void **state) {
  char *dir = sl_test_dir("source-find");
  char *p = sl_test_path(dir, "many.safetensors");
  enum { N = 300 };
  sl_test_tensor ts[N];
  char names[N][32];
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "model.layers.%d.weight", i);
    ts[i] = (sl_test_tensor){names[i], "U8", 1, {(int64_t)(i % 5)}, NULL};
  }
  assert_int_equal(sl_test_write_st(p, ts, N, NULL), 0);
  sl_source *src = NULL;
  assert_int_equal(sl_source_open(g_ctx, p, &src), SL_OK);
  assert_int_equal(sl_source_tensor_count(src), N);
  for (int i = 0; i < N; i++) {
    const sl_source_tensor *t = sl_source_find(src, names[i]);
    assert_non_null(t);
    assert_string_equal(t->name, names[i]);
    assert_int_equal(t->nbytes, (uint64_t)(i % 5));
  }
  assert_null(sl_source_find(src, "model.layers.300.weight"));
  assert_null(sl_source_find(src, ""));
  assert_null(sl_source_find(src, NULL));
  assert_null(sl_source_find(NULL, "x"));
  check_pattern(src);
  sl_source_destroy(src);
  free(p);
  free(dir);
}

static void assert_same_table(const sl_source *a, const sl_source *b) {
  assert_int_equal(sl_source_tensor_count(a), sl_source_tensor_count(b));
  assert_int_equal(sl_source_file_count(a), sl_source_file_count(b));
  assert_int_equal(sl_source_total_bytes(a), sl_source_total_bytes(b));
  for (size_t i = 0; i < sl_source_file_count(a); i++)
    assert_string_equal(sl_source_file_at(a, i), sl_source_file_at(b, i));
  for (size_t i = 0; i < sl_source_tensor_count(a); i++) {
    const sl_source_tensor *x = sl_source_tensor_at(a, i), *y = sl_source_tensor_at(b, i);
    assert_string_equal(x->name, y->name);
    assert_int_equal(x->dtype, y->dtype);
    assert_int_equal(x->ndim, y->ndim);
    for (int d = 0; d < x->ndim; d++) assert_int_equal(x->shape[d], y->shape[d]);
    assert_int_equal(x->nbytes, y->nbytes);
    assert_string_equal(x->file, y->file);
    assert_int_equal(x->file_offset, y->file_offset);
    assert_ptr_equal(sl_source_find(b, x->name), y);
  }
  assert_int_equal(sl_source_metadata_count(a), sl_source_metadata_count(b));
  for (size_t i = 0; i < sl_source_metadata_count(a); i++) {
    const char *k1, *v1, *k2, *v2;
    assert_int_equal(sl_source_metadata_at(a, i, &k1, &v1), SL_OK);
    assert_int_equal(sl_source_metadata_at(b, i, &k2, &v2), SL_OK);
    assert_string_equal(k1, k2);
    assert_string_equal(v1, v2);
  }
}

static void manifest_round_trip(void **state) {
  char *dir = sl_test_dir("source-manifest");
  write_sharded(dir, "model.safetensors.index.json", NULL);
  sl_source *src = NULL, *copy = NULL;
  assert_int_equal(sl_source_open(g_ctx, dir, &src), SL_OK);
  void *buf = NULL;
  size_t len = 0;
  assert_int_equal(sl__source_serialize(src, &buf, &len), SL_OK);
  assert_true(len > 0);
  assert_int_equal(sl__source_deserialize(g_ctx, buf, len, &copy), SL_OK);
  assert_false(sl__source_has_files(copy));
  assert_same_table(src, copy);
  /* no files yet: reading is refused */
  unsigned char b[4];
  assert_int_equal(sl__source_pread(copy, 0, 0, b, 4), SL_ERR_INVALID);
  assert_msg_has("not open");
  /* every-rank mode opens them */
  assert_int_equal(sl__source_open_files(copy), SL_OK);
  assert_true(sl__source_has_files(copy));
  assert_int_equal(sl__source_open_files(copy), SL_OK); /* idempotent */
  check_pattern(copy);
  /* the copy serializes to the same bytes */
  void *buf2 = NULL;
  size_t len2 = 0;
  assert_int_equal(sl__source_serialize(copy, &buf2, &len2), SL_OK);
  assert_int_equal(len2, len);
  assert_memory_equal(buf, buf2, len);
  free(buf2);
  sl_source_destroy(copy);

  /* every truncation is rejected as malformed, and leaks nothing */
  for (size_t cut = 0; cut < len; cut++) {
    copy = (sl_source *)1;
    sl_status s = sl__source_deserialize(g_ctx, buf, cut, &copy);
    if (s != SL_ERR_FORMAT) print_error("truncation at %zu of %zu: %s\n", cut, len, sl_status_name(s));
    assert_int_equal(s, SL_ERR_FORMAT);
    assert_null(copy);
  }
  /* trailing garbage too */
  unsigned char *longer = malloc(len + 1);
  memcpy(longer, buf, len);
  longer[len] = 0;
  assert_int_equal(sl__source_deserialize(g_ctx, longer, len + 1, &copy), SL_ERR_FORMAT);
  assert_msg_has("trailing");
  free(longer);

  /* corruption: magic, version, huge counts, dtype code, file index */
  unsigned char *bad = malloc(len);
  memcpy(bad, buf, len);
  bad[0] ^= 1;
  assert_int_equal(sl__source_deserialize(g_ctx, bad, len, &copy), SL_ERR_FORMAT);
  assert_msg_has("magic");
  memcpy(bad, buf, len);
  bad[4] = 9;
  assert_int_equal(sl__source_deserialize(g_ctx, bad, len, &copy), SL_ERR_FORMAT);
  assert_msg_has("version");
  memcpy(bad, buf, len);
  bad[8 + 7] = 0x7f; /* tensor count ~ 2^62 */
  assert_int_equal(sl__source_deserialize(g_ctx, bad, len, &copy), SL_ERR_FORMAT);
  assert_msg_has("exceed");
  /* the first tensor starts at byte 32: u32 name length, name, then the dtype code */
  size_t name_len = strlen(sl_source_tensor_at(src, 0)->name);
  size_t dt_at = 32 + 4 + name_len;
  memcpy(bad, buf, len);
  bad[dt_at] = 99;
  assert_int_equal(sl__source_deserialize(g_ctx, bad, len, &copy), SL_ERR_FORMAT);
  assert_msg_has("dtype");
  /* nbytes that does not match the shape (embed is BF16 [3,4]: 24 bytes) */
  size_t nbytes_at = dt_at + 4 + 4 + 2 * 8;
  memcpy(bad, buf, len);
  assert_int_equal(bad[nbytes_at], 24);
  bad[nbytes_at] = 25;
  assert_int_equal(sl__source_deserialize(g_ctx, bad, len, &copy), SL_ERR_FORMAT);
  assert_msg_has("does not match");
  memcpy(bad, buf, len);
  bad[nbytes_at + 8] = 7; /* file index */
  assert_int_equal(sl__source_deserialize(g_ctx, bad, len, &copy), SL_ERR_FORMAT);
  assert_msg_has("file index");
  /* a NUL inside the name */
  memcpy(bad, buf, len);
  bad[36] = 0;
  assert_int_equal(sl__source_deserialize(g_ctx, bad, len, &copy), SL_ERR_FORMAT);
  free(bad);

  /* a copy of the checkpoint that is shorter than the manifest needs */
  assert_int_equal(sl__source_deserialize(g_ctx, buf, len, &copy), SL_OK);
  assert_int_equal(truncate(sl_source_file_at(src, 1), (off_t)(sl_source_tensor_at(src, 4)->file_offset + 3)), 0);
  assert_int_equal(sl__source_open_files(copy), SL_ERR_FORMAT);
  assert_msg_has(sl_source_file_at(src, 1));
  assert_msg_has("lm_head");
  assert_false(sl__source_has_files(copy));
  sl_source_destroy(copy);
  /* and a missing one */
  assert_int_equal(sl__source_deserialize(g_ctx, buf, len, &copy), SL_OK);
  assert_int_equal(unlink(sl_source_file_at(src, 0)), 0);
  assert_int_equal(sl__source_open_files(copy), SL_ERR_NOT_FOUND);
  assert_msg_has(sl_source_file_at(src, 0));
  sl_source_destroy(copy);

  free(buf);
  sl_source_destroy(src);
  free(dir);
}

static void manifest_empty_source(void **state) {
  char *dir = sl_test_dir("source-manifest-empty");
  char *p = sl_test_path(dir, "e.safetensors");
  assert_int_equal(sl_test_write_raw(p, "{}", 0), 0);
  sl_source *src = NULL, *copy = NULL;
  assert_int_equal(sl_source_open(g_ctx, p, &src), SL_OK);
  assert_int_equal(sl_source_tensor_count(src), 0);
  assert_null(sl_source_find(src, "x"));
  void *buf;
  size_t len;
  assert_int_equal(sl__source_serialize(src, &buf, &len), SL_OK);
  assert_int_equal(sl__source_deserialize(g_ctx, buf, len, &copy), SL_OK);
  assert_same_table(src, copy);
  assert_int_equal(sl__source_open_files(copy), SL_OK);
  sl_source_destroy(copy);
  assert_int_equal(sl__source_deserialize(g_ctx, NULL, 0, &copy), SL_ERR_FORMAT);
  free(buf);
  sl_source_destroy(src);
  free(p);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(single_file),       cmocka_unit_test(pread_bounds_and_truncation),
      cmocka_unit_test(index_two_files),   cmocka_unit_test(directory_forms),
      cmocka_unit_test(index_errors),      cmocka_unit_test(index_parse_direct),
      cmocka_unit_test(find),              cmocka_unit_test(manifest_round_trip),
      cmocka_unit_test(manifest_empty_source),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
