/* The checkpoint source: single files, sharded indexes, directories, lookups, positional reads
 * and the manifest that carries the tensor table to other ranks. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "internal.h"
#include "source_impl.h"
#include "testutil.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

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

/* Running out of memory at any point of jansson's work on a valid index (its parse; the
 * metadata's integer turned into text) is reported as out of memory with the index's size,
 * never as "not valid JSON" (which, with jansson's empty error, read "not valid JSON:  (line -1,
 * column -1)", or a syntax error where a string's copy could not be allocated), and leaves
 * nothing behind. Every allocation is made to fail in turn, until the parse needs none that
 * fails. */
static void index_parse_out_of_memory_every_allocation(void **state) {
  const char *j = "{\"metadata\":{\"total_size\":136,\"format\":\"a value longer than sixteen bytes\"},"
                  "\"weight_map\":{\"model.layers.0.weight\":\"model-00001-of-00002.safetensors\","
                  "\"model.layers.1.weight\":\"model-00002-of-00002.safetensors\","
                  "\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}}";
  char want[96];
  snprintf(want, sizeof want, "its %zu-byte index; free memory or raise", strlen(j));
  sl__index ix;
  char err[512];
  long budget = 0;
  for (;; budget++) {
    sl_test_json_alloc_budget(budget);
    sl_status s = sl__index_parse(j, strlen(j), &ix, err, sizeof err);
    sl_test_json_alloc_budget(-1);
    if (s == SL_OK) break;
    if (s != SL_ERR_NOMEM || strncmp(err, "out of memory ", 14) != 0 || !strstr(err, want))
      fail_msg("allocation %ld of the index's parse failed: got %s '%s', want SL_ERR_NOMEM 'out of memory ... %s'",
               budget, sl_status_name(s), err, want);
    assert_int_equal(ix.count, 0);
    assert_null(ix.names);
    assert_null(ix.files);
    assert_null(ix.meta_keys);
  }
  assert_true(budget > 10); /* the index's parse took that many allocations, each failed once */
  assert_int_equal(ix.count, 3);
  assert_int_equal(ix.file_count, 2);
  assert_string_equal(ix.meta_values[0], "136");
  sl__index_free(&ix);
}

/* The same through sl_source_open of a real sharded checkpoint, where the shards' headers are
 * parsed too: every failure is SL_ERR_NOMEM naming the file it was parsing (the index with its
 * size, or a shard), and no source is returned. */
static void index_open_out_of_memory_every_allocation(void **state) {
  char *dir = sl_test_dir("source-index-nomem");
  write_sharded(dir, "model.safetensors.index.json", NULL);
  char *ix = sl_test_path(dir, "model.safetensors.index.json");
  struct stat st;
  assert_int_equal(stat(ix, &st), 0);
  /* "parsing" it, or "keeping the metadata of" it (its integer turned into text) */
  char want_ix[PATH_MAX + 16], size_ix[64];
  snprintf(want_ix, sizeof want_ix, "%s: out of memory ", ix);
  snprintf(size_ix, sizeof size_ix, " its %lld-byte index; free memory", (long long)st.st_size);
  int named_index = 0, named_shard = 0;
  sl_source *src = NULL;
  long budget = 0;
  sl__st_scan = false; /* the shards' headers through jansson's tree too */
  for (;; budget++) {
    sl_test_json_alloc_budget(budget);
    sl_status s = sl_source_open(g_ctx, ix, &src);
    sl_test_json_alloc_budget(-1);
    if (s == SL_OK) break;
    assert_null(src);
    const char *m = errmsg();
    if (!strncmp(m, want_ix, strlen(want_ix)) && strstr(m, size_ix)) named_index++;
    else if (!strncmp(m, dir, strlen(dir)) && strstr(m, ".safetensors: out of memory parsing its ")) named_shard++;
    else
      fail_msg("allocation %ld of the open failed: got %s '%s', want SL_ERR_NOMEM '%s...%s' or a shard's", budget,
               sl_status_name(s), m, want_ix, size_ix);
    if (s != SL_ERR_NOMEM) fail_msg("allocation %ld: %s '%s', want SL_ERR_NOMEM", budget, sl_status_name(s), m);
  }
  sl__st_scan = true;
  assert_true(named_index > 10);
  assert_true(named_shard > 0);
  check_sharded(src, dir);
  sl_source_destroy(src);
  free(ix);
  free(dir);
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
  assert_int_equal(sl__source_open_files(copy, false), SL_OK);
  assert_true(sl__source_has_files(copy));
  assert_int_equal(sl__source_open_files(copy, false), SL_OK); /* idempotent */
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
  /* the flags (byte 40: bit 0 alone is known) */
  memcpy(bad, buf, len);
  bad[40] |= 2;
  assert_int_equal(sl__source_deserialize(g_ctx, bad, len, &copy), SL_ERR_FORMAT);
  assert_msg_has("flags");
  /* the first tensor starts at byte 44: u32 name length, name, then the dtype code */
  size_t name_len = strlen(sl_source_tensor_at(src, 0)->name);
  size_t dt_at = 44 + 4 + name_len;
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
  bad[48] = 0;
  assert_int_equal(sl__source_deserialize(g_ctx, bad, len, &copy), SL_ERR_FORMAT);
  free(bad);

  /* a copy of the checkpoint that is shorter than the manifest needs */
  assert_int_equal(sl__source_deserialize(g_ctx, buf, len, &copy), SL_OK);
  assert_int_equal(truncate(sl_source_file_at(src, 1), (off_t)(sl_source_tensor_at(src, 4)->file_offset + 3)), 0);
  assert_int_equal(sl__source_open_files(copy, false), SL_ERR_FORMAT);
  assert_msg_has(sl_source_file_at(src, 1));
  assert_msg_has("lm_head");
  assert_false(sl__source_has_files(copy));
  sl_source_destroy(copy);
  /* and a missing one */
  assert_int_equal(sl__source_deserialize(g_ctx, buf, len, &copy), SL_OK);
  assert_int_equal(unlink(sl_source_file_at(src, 0)), 0);
  assert_int_equal(sl__source_open_files(copy, false), SL_ERR_NOT_FOUND);
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
  assert_int_equal(sl__source_open_files(copy, false), SL_OK);
  sl_source_destroy(copy);
  assert_int_equal(sl__source_deserialize(g_ctx, NULL, 0, &copy), SL_ERR_FORMAT);
  free(buf);
  sl_source_destroy(src);
  free(p);
  free(dir);
}

/* ---- checkpoint identity ---------------------------------------------------------------- */

/* XXH3-64 of a file's 8-byte header length + header, computed here from the bytes. */
static uint64_t header_digest_of(const char *path) {
  uint64_t off = data_offset_of(path);
  unsigned char *b = malloc(off);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  assert_int_equal(fread(b, 1, off, f), off);
  fclose(f);
  uint64_t d = XXH3_64bits(b, off);
  free(b);
  return d;
}

static uint64_t combine_le(const uint64_t *d, size_t n) {
  unsigned char *b = malloc(8 * n);
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < 8; k++) b[8 * i + k] = (unsigned char)(d[i] >> (8 * k));
  uint64_t h = XXH3_64bits(b, 8 * n);
  free(b);
  return h;
}

static void flip_byte(const char *path, uint64_t at) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  unsigned char c;
  assert_int_equal(pread(fd, &c, 1, (off_t)at), 1);
  c ^= 0x5a;
  assert_int_equal(pwrite(fd, &c, 1, (off_t)at), 1);
  close(fd);
}

static void identity_digest_and_names(void **state) {
  char *dir = sl_test_dir("source-identity");
  write_sharded(dir, "model.safetensors.index.json", NULL);
  sl_source *src = NULL, *copy = NULL;
  assert_int_equal(sl_source_open(g_ctx, dir, &src), SL_OK);
  assert_int_equal(sl__source_file_count(src), 2);
  assert_string_equal(sl__source_file_name(src, 0), "model-00001-of-00002.safetensors");
  assert_string_equal(sl__source_file_name(src, 1), "model-00002-of-00002.safetensors");
  assert_null(sl__source_file_name(src, 2));
  assert_int_equal(sl__source_file_count(NULL), 0);
  assert_null(sl__source_file_name(NULL, 0));
  assert_int_equal(sl__source_headers_digest(NULL), 0);
  /* the documented formula: XXH3-64 over the per-file header digests, little-endian, in order */
  uint64_t per[2] = {header_digest_of(sl_source_file_at(src, 0)), header_digest_of(sl_source_file_at(src, 1))};
  uint64_t want = combine_le(per, 2);
  assert_true(want != 0);
  assert_int_equal(sl__source_headers_digest(src), want);
  /* fingerprints: out[0] is the same per-file header digest, and both are deterministic */
  uint64_t fp[2][2], again[2];
  for (size_t f = 0; f < 2; f++) {
    assert_int_equal(sl__source_file_fingerprint(src, f, fp[f]), SL_OK);
    assert_int_equal(fp[f][0], per[f]);
    assert_int_equal(sl__source_file_fingerprint(src, f, again), SL_OK);
    assert_int_equal(again[0], fp[f][0]);
    assert_int_equal(again[1], fp[f][1]);
  }
  assert_int_not_equal(fp[0][1], fp[1][1]);
  assert_int_equal(sl__source_file_fingerprint(src, 2, again), SL_ERR_INVALID);

  /* a manifest-built source carries rank 0's digest and names; it fingerprints once open */
  void *buf = NULL;
  size_t len = 0;
  assert_int_equal(sl__source_serialize(src, &buf, &len), SL_OK);
  assert_int_equal(sl__source_deserialize(g_ctx, buf, len, &copy), SL_OK);
  assert_int_equal(sl__source_headers_digest(copy), want);
  assert_string_equal(sl__source_file_name(copy, 1), "model-00002-of-00002.safetensors");
  assert_int_equal(sl__source_file_fingerprint(copy, 0, again), SL_ERR_INVALID);
  assert_msg_has("not open");
  assert_int_equal(sl__source_open_files(copy, false), SL_OK);
  for (size_t f = 0; f < 2; f++) {
    assert_int_equal(sl__source_file_fingerprint(copy, f, again), SL_OK);
    assert_int_equal(again[0], fp[f][0]);
    assert_int_equal(again[1], fp[f][1]);
  }
  /* the digest field is validated: none for files, or one for none */
  unsigned char *bad = malloc(len);
  memcpy(bad, buf, len);
  memset(bad + 32, 0, 8);
  sl_source *x = NULL;
  assert_int_equal(sl__source_deserialize(g_ctx, bad, len, &x), SL_ERR_FORMAT);
  assert_msg_has("digest");
  free(bad);
  free(buf);
  sl_source_destroy(copy);
  sl_source_destroy(src);

  /* a single file is named by its base name */
  char *p = sl_test_path(dir, "model-00001-of-00002.safetensors");
  assert_int_equal(sl_source_open(g_ctx, p, &src), SL_OK);
  assert_int_equal(sl__source_file_count(src), 1);
  assert_string_equal(sl__source_file_name(src, 0), "model-00001-of-00002.safetensors");
  assert_int_equal(sl__source_headers_digest(src), combine_le(per, 1));
  sl_source_destroy(src);
  free(p);
  free(dir);
}

/* What the data fingerprint samples: the first and last 64 KiB block of the data section and
 * 16 evenly spaced between (offset i * (D - 64 KiB) / 17), plus the file size; a data section
 * of at most 18 blocks is hashed whole. */
static void identity_fingerprint_sampling(void **state) {
  char *dir = sl_test_dir("source-fingerprint");
  char *p = sl_test_path(dir, "big.safetensors");
  enum { D = 4 << 20 };
  const sl_test_tensor big[] = {{"w", "U8", 1, {D}, NULL}};
  assert_int_equal(sl_test_write_st(p, big, 1, NULL), 0);
  uint64_t base = data_offset_of(p);
  sl_source *src = NULL;
  assert_int_equal(sl_source_open(g_ctx, p, &src), SL_OK);
  uint64_t fp0[2], fp[2];
  assert_int_equal(sl__source_file_fingerprint(src, 0, fp0), SL_OK);
  const uint64_t span = D - 65536;
  static const struct {
    uint64_t at;
    bool seen;
  } probes[] = {{0, true}, {65535, true}, {100000, false}, {span / 17, true}, {span / 17 + 70000, false},
                {9 * span / 17 + 1000, true}, {D - 1, true}, {D - 65537, false}};
  for (size_t k = 0; k < sizeof probes / sizeof probes[0]; k++) {
    flip_byte(p, base + probes[k].at);
    assert_int_equal(sl__source_file_fingerprint(src, 0, fp), SL_OK);
    assert_int_equal(fp[0], fp0[0]);
    if (probes[k].seen != (fp[1] != fp0[1])) print_error("data byte %" PRIu64 "\n", probes[k].at);
    assert_true(probes[k].seen == (fp[1] != fp0[1]));
    flip_byte(p, base + probes[k].at); /* back */
  }
  assert_int_equal(sl__source_file_fingerprint(src, 0, fp), SL_OK);
  assert_int_equal(fp[1], fp0[1]);
  /* a header byte changes out[0] */
  flip_byte(p, 9);
  assert_int_equal(sl__source_file_fingerprint(src, 0, fp), SL_OK);
  assert_int_not_equal(fp[0], fp0[0]);
  flip_byte(p, 9);
  sl_source_destroy(src);

  /* a small data section is hashed whole: any byte counts */
  char *q = sl_test_path(dir, "small.safetensors");
  const sl_test_tensor small[] = {{"w", "U8", 1, {18 * 65536}, NULL}};
  assert_int_equal(sl_test_write_st(q, small, 1, NULL), 0);
  assert_int_equal(sl_source_open(g_ctx, q, &src), SL_OK);
  assert_int_equal(sl__source_file_fingerprint(src, 0, fp0), SL_OK);
  flip_byte(q, data_offset_of(q) + 100000);
  assert_int_equal(sl__source_file_fingerprint(src, 0, fp), SL_OK);
  assert_int_not_equal(fp[1], fp0[1]);
  sl_source_destroy(src);
  free(q);
  free(p);
  free(dir);
}

/* ---- confined names, symlinked files ---------------------------------------------------- */

static void index_confinement(void **state) {
  char *root = sl_test_dir("source-confine");
  char *dir = sl_test_path(root, "ck");
  assert_int_equal(mkdir(dir, 0755), 0);
  write_sharded(dir, "model.safetensors.index.json", NULL);
  /* a valid file outside the directory, where every escaping name below leads */
  static const sl_test_tensor outside[] = {{"secret", "U8", 1, {4}, NULL}};
  char *op = sl_test_path(root, "outside.safetensors");
  assert_int_equal(sl_test_write_st(op, outside, 1, NULL), 0);
  char *ix = sl_test_path(dir, "model.safetensors.index.json");
  char *sub = sl_test_path(dir, "sub");
  assert_int_equal(mkdir(sub, 0755), 0);
  static const struct {
    const char *entry, *problem, *shown; /* shown: the entry as the message quotes it */
  } bad[] = {
      {"../outside.safetensors", "'..' component", NULL},
      {"sub/../../outside.safetensors", "'..' component", NULL},
      {"ABS", "absolute path", NULL},
      {"sub//../../outside.safetensors", "empty path component", NULL},
      {"./model-00001-of-00002.safetensors", "'.' component", NULL},
      {"sub/", "empty path component", NULL},
      {"..\\\\outside.safetensors", "backslash", "'..\\outside.safetensors'"},
      {"..", "'..' component", NULL},
  };
  sl_source *src = NULL;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *entry = strcmp(bad[i].entry, "ABS") ? bad[i].entry : op;
    char json[4096];
    snprintf(json, sizeof json,
             "{\"weight_map\":{\"lm_head\":\"model-00002-of-00002.safetensors\",\"step\":\"model-00001-of-00002.safetensors\","
             "\"model.norm\":\"model-00002-of-00002.safetensors\",\"embed\":\"model-00001-of-00002.safetensors\","
             "\"layers.0.w\":\"model-00001-of-00002.safetensors\",\"secret\":\"%s\"}}",
             entry);
    assert_int_equal(sl_test_write_bytes(ix, json, strlen(json)), 0);
    sl_status s = sl_source_open(g_ctx, dir, &src);
    if (s != SL_ERR_FORMAT) print_error("entry '%s' gave %s\n", entry, sl_status_name(s));
    assert_int_equal(s, SL_ERR_FORMAT);
    assert_null(src);
    assert_msg_has(ix);
    assert_msg_has("'secret'");
    assert_msg_has(bad[i].problem);
    assert_msg_has("inside its own directory");
    char shown[4096];
    snprintf(shown, sizeof shown, "'%s'", entry);
    assert_msg_has(bad[i].shown ? bad[i].shown : shown);
  }
  /* a subdirectory is inside: allowed */
  char *inner = sl_test_path(sub, "part.safetensors");
  assert_int_equal(sl_test_write_st(inner, outside, 1, NULL), 0);
  const char *ok = "{\"weight_map\":{\"lm_head\":\"model-00002-of-00002.safetensors\",\"step\":\"model-00001-of-00002.safetensors\","
                   "\"model.norm\":\"model-00002-of-00002.safetensors\",\"embed\":\"model-00001-of-00002.safetensors\","
                   "\"layers.0.w\":\"model-00001-of-00002.safetensors\",\"secret\":\"sub/part.safetensors\"}}";
  assert_int_equal(sl_test_write_bytes(ix, ok, strlen(ok)), 0);
  assert_int_equal(sl_source_open(g_ctx, dir, &src), SL_OK);
  assert_int_equal(sl_source_tensor_count(src), 6);
  assert_string_equal(sl__source_file_name(src, 2), "sub/part.safetensors");
  check_pattern(src);
  sl_source_destroy(src);
  /* the rule itself */
  assert_null(sl__index_entry_problem("a.safetensors", 13));
  assert_null(sl__index_entry_problem("a/b/c", 5));
  assert_null(sl__index_entry_problem("..a", 3));
  assert_null(sl__index_entry_problem("a..", 3));
  assert_non_null(sl__index_entry_problem("a\0b", 3));
  assert_non_null(sl__index_entry_problem("", 0));
  assert_non_null(sl__index_entry_problem("a/.", 3));
  free(inner);
  free(sub);
  free(ix);
  free(op);
  free(dir);
  free(root);
}

static void symlink_at(const char *target, const char *dir, const char *name) {
  char *p = sl_test_path(dir, name);
  assert_int_equal(symlink(target, p), 0);
  free(p);
}

/* The Hugging Face cache: snapshots/<rev>/<file> -> ../../blobs/<sha256>, the index too. The
 * names the index gives are confined; where the directory's own symlinks lead is its owner's
 * choice (the blobs directory is outside snapshots/<rev>). */
static void hf_cache_layout(void **state) {
  char *root = sl_test_dir("source-hf-cache");
  char *repo = sl_test_path(root, "models--org--name");
  char *blobs = sl_test_path(repo, "blobs");
  char *snaps = sl_test_path(repo, "snapshots");
  char *snap = sl_test_path(snaps, "0123456789abcdef0123456789abcdef01234567");
  assert_int_equal(mkdir(repo, 0755), 0);
  assert_int_equal(mkdir(blobs, 0755), 0);
  assert_int_equal(mkdir(snaps, 0755), 0);
  assert_int_equal(mkdir(snap, 0755), 0);
  write_sharded(blobs, "model.safetensors.index.json", NULL);
  static const char *const names[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                      "model.safetensors.index.json"};
  static const char *const shas[] = {"aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11aa11",
                                     "bb22bb22bb22bb22bb22bb22bb22bb22bb22bb22bb22bb22bb22bb22bb22bb22",
                                     "cc33cc33cc33cc33cc33cc33cc33cc33cc33cc33cc33cc33cc33cc33cc33cc33"};
  for (int i = 0; i < 3; i++) {
    char *from = sl_test_path(blobs, names[i]), *to = sl_test_path(blobs, shas[i]);
    assert_int_equal(rename(from, to), 0);
    char target[256];
    snprintf(target, sizeof target, "../../blobs/%s", shas[i]);
    symlink_at(target, snap, names[i]);
    free(from);
    free(to);
  }
  sl_source *src = NULL;
  /* through the snapshot directory and through the (symlinked) index */
  char *ix = sl_test_path(snap, "model.safetensors.index.json");
  const char *paths[] = {snap, ix};
  for (int k = 0; k < 2; k++) {
    assert_int_equal(sl_source_open(g_ctx, paths[k], &src), SL_OK);
    check_sharded(src, snap); /* file paths are the snapshot names, not the blobs */
    check_pattern(src);
    assert_string_equal(sl__source_file_name(src, 0), names[0]);
    uint64_t fp[2];
    assert_int_equal(sl__source_file_fingerprint(src, 1, fp), SL_OK);
    sl_source_destroy(src);
  }
  free(ix);
  free(snap);
  free(snaps);
  free(blobs);
  free(repo);
  free(root);
}

/* ---- non-regular files ------------------------------------------------------------------ */

/* Runs sl_source_open(PATH) in a child that SIGALRM ends after 10 s, so a hang is a failure
 * and not a stuck test. Returns the status, or -1 when the child hung or crashed; the child's
 * message is copied to msg. */
static int open_in_child(const char *path, char *msg, size_t msglen) {
  int pipefd[2];
  assert_int_equal(pipe(pipefd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(pipefd[0]);
    alarm(10);
    sl_source *src = NULL;
    sl_status s = sl_source_open(g_ctx, path, &src);
    const char *m = sl_context_errmsg(g_ctx);
    if (write(pipefd[1], m, strlen(m)) < 0) _exit(99);
    sl_source_destroy(src);
    _exit((int)s);
  }
  close(pipefd[1]);
  ssize_t n = read(pipefd[0], msg, msglen - 1);
  msg[n > 0 ? n : 0] = 0;
  close(pipefd[0]);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (!WIFEXITED(status)) {
    print_error("opening %s did not finish (signal %d): it hung\n", path, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return -1;
  }
  return WEXITSTATUS(status);
}

static void expect_refused(const char *path, const char *named, const char *kind) {
  char msg[SL__ERRMSG_LEN];
  int s = open_in_child(path, msg, sizeof msg);
  if (s != SL_ERR_INVALID) print_error("%s: status %d, message '%s'\n", path, s, msg);
  assert_int_equal(s, SL_ERR_INVALID);
  if (!strstr(msg, named) || !strstr(msg, kind)) print_error("message '%s' lacks '%s' or '%s'\n", msg, named, kind);
  assert_non_null(strstr(msg, named));
  assert_non_null(strstr(msg, kind));
  assert_non_null(strstr(msg, "not a regular file"));
}

static void non_regular_files(void **state) {
  char *dir = sl_test_dir("source-nonregular");
  /* the checkpoint itself a FIFO */
  char *fifo = sl_test_path(dir, "pipe.safetensors");
  assert_int_equal(mkfifo(fifo, 0644), 0);
  expect_refused(fifo, fifo, "FIFO");
  expect_refused("/dev/null", "/dev/null", "character device");
  /* a shard that is a FIFO, a directory or a socket */
  char *ck = sl_test_path(dir, "ck");
  assert_int_equal(mkdir(ck, 0755), 0);
  write_sharded(ck, "model.safetensors.index.json", NULL);
  char *shard = sl_test_path(ck, "model-00002-of-00002.safetensors");
  char *ix = sl_test_path(ck, "model.safetensors.index.json");
  assert_int_equal(unlink(shard), 0);
  assert_int_equal(mkfifo(shard, 0644), 0);
  expect_refused(ck, shard, "FIFO");
  expect_refused(ix, shard, "FIFO");
  assert_int_equal(unlink(shard), 0);
  assert_int_equal(mkdir(shard, 0755), 0);
  expect_refused(ck, shard, "directory");
  assert_int_equal(rmdir(shard), 0);
  int sock = socket(AF_UNIX, SOCK_STREAM, 0);
  assert_true(sock >= 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(shard) < sizeof sa.sun_path) { /* a deep scratch directory may not fit */
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", shard);
    assert_int_equal(bind(sock, (struct sockaddr *)&sa, sizeof sa), 0);
    expect_refused(ck, shard, "socket");
    assert_int_equal(unlink(shard), 0);
  }
  close(sock);
  /* the index a FIFO, found through the directory */
  static const sl_test_tensor s2[] = {{"model.norm", "F32", 1, {4}, NULL}, {"lm_head", "F16", 2, {2, 4}, NULL}};
  assert_int_equal(sl_test_write_st(shard, s2, 2, "{\"format\":\"pt\"}"), 0);
  sl_source *src = NULL;
  assert_int_equal(sl_source_open(g_ctx, ck, &src), SL_OK);
  void *buf = NULL;
  size_t len = 0;
  assert_int_equal(sl__source_serialize(src, &buf, &len), SL_OK);
  sl_source_destroy(src);
  assert_int_equal(unlink(ix), 0);
  assert_int_equal(mkfifo(ix, 0644), 0);
  expect_refused(ck, ix, "FIFO");
  /* every-rank mode: another rank finds a FIFO where rank 0 read a file; in a child too */
  assert_int_equal(unlink(shard), 0);
  assert_int_equal(mkfifo(shard, 0644), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(10);
    sl_source *copy = NULL;
    if (sl__source_deserialize(g_ctx, buf, len, &copy) != SL_OK) _exit(98);
    sl_status s = sl__source_open_files(copy, false);
    bool named = strstr(sl_context_errmsg(g_ctx), shard) && strstr(sl_context_errmsg(g_ctx), "FIFO");
    sl_source_destroy(copy);
    _exit(s == SL_ERR_INVALID && named ? 0 : 1);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  free(buf);
  free(ix);
  free(shard);
  free(ck);
  free(fifo);
  free(dir);
}

/* A special file is refused by name, before it is opened at all: opening one can act on it
 * (a FIFO's waiting writer is released, a tape rewinds, a terminal becomes the controlling
 * one). A writer blocked opening a FIFO shows it: it stays blocked. */
static void special_file_refused_unopened(void **state) {
  char *dir = sl_test_dir("source-unopened"), *fifo = sl_test_path(dir, "pipe.safetensors");
  assert_int_equal(mkfifo(fifo, 0644), 0);
  pid_t writer = fork();
  assert_true(writer >= 0);
  if (writer == 0) {
    alarm(10);
    int fd = open(fifo, O_WRONLY); /* blocks until some reader opens the FIFO */
    _exit(fd >= 0 ? 0 : 1);
  }
  usleep(100 * 1000); /* let the writer reach its open */
  sl_source *src = NULL;
  assert_int_equal(sl_source_open(g_ctx, fifo, &src), SL_ERR_INVALID);
  assert_non_null(strstr(sl_context_errmsg(g_ctx), "FIFO"));
  usleep(200 * 1000);
  int status = 0;
  pid_t done = waitpid(writer, &status, WNOHANG);
  /* release the writer either way */
  int rd = open(fifo, O_RDONLY | O_NONBLOCK);
  if (done == 0) assert_int_equal(waitpid(writer, &status, 0), writer);
  if (rd >= 0) close(rd);
  if (done != 0) fail_msg("opening %s released a writer waiting on it: the FIFO was opened", fifo);
  free(fifo);
  free(dir);
}

/* ---- a bounded number of open files ---------------------------------------------------- */

static int count_open_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory's own descriptor */
}

/* Loading a checkpoint of 1500 shards reads every tensor under RLIMIT_NOFILE 256 (in a child:
 * the limit must not stay on the test process). */
static void many_shards_low_fd_limit(void **state) {
  enum { FILES = 1500 };
  char *dir = sl_test_dir("source-many-shards");
  size_t cap = 64 + (size_t)FILES * 64, len = 0;
  char *json = malloc(cap);
  len += (size_t)snprintf(json + len, cap - len, "{\"weight_map\":{");
  for (int i = 0; i < FILES; i++) {
    char name[64], tname[32];
    snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i + 1, FILES);
    snprintf(tname, sizeof tname, "t%d", i);
    const sl_test_tensor t[] = {{tname, "U8", 1, {(int64_t)(1 + i % 7)}, NULL}};
    char *p = sl_test_path(dir, name);
    assert_int_equal(sl_test_write_st(p, t, 1, NULL), 0);
    free(p);
    len += (size_t)snprintf(json + len, cap - len, "%s\"%s\":\"%s\"", i ? "," : "", tname, name);
  }
  len += (size_t)snprintf(json + len, cap - len, "}}");
  char *ix = sl_test_path(dir, "model.safetensors.index.json");
  assert_int_equal(sl_test_write_bytes(ix, json, len), 0);
  free(json);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(60);
    struct rlimit rl = {256, 256};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(97);
    int base = count_open_fds();
    sl_source *src = NULL;
    if (sl_source_open(g_ctx, dir, &src) != SL_OK) {
      fprintf(stderr, "open: %s\n", sl_context_errmsg(g_ctx));
      _exit(1);
    }
    if (sl_source_tensor_count(src) != FILES) _exit(2);
    /* twice, and backwards: every file is closed and reopened on demand */
    for (int pass = 0; pass < 2; pass++) {
      for (size_t k = 0; k < FILES; k++) {
        size_t i = pass ? FILES - 1 - k : k;
        const sl_source_tensor *t = sl_source_tensor_at(src, i);
        unsigned char b[8];
        if (sl__source_pread(src, i, 0, b, t->nbytes) != SL_OK) {
          fprintf(stderr, "read %s: %s\n", t->name, sl_context_errmsg(g_ctx));
          _exit(3);
        }
        for (uint64_t j = 0; j < t->nbytes; j++)
          if (b[j] != sl_test_pattern_byte(t->name, j)) _exit(4);
        if (count_open_fds() > base + 64) _exit(5);
      }
    }
    uint64_t fp[2];
    for (size_t f = 0; f < FILES; f++)
      if (sl__source_file_fingerprint(src, f, fp) != SL_OK) _exit(6);
    sl_source_destroy(src);
    _exit(count_open_fds() == base ? 0 : 7);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status))
    print_error("child: %s %d\n", WIFEXITED(status) ? "exit" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  free(ix);
  free(dir);
}

/* A file closed to respect the bound is reopened only if it is still the file first opened. */
static void reopen_checks_identity(void **state) {
  char *dir = sl_test_dir("source-reopen");
  write_sharded(dir, "model.safetensors.index.json", NULL);
  sl_source *src = NULL;
  assert_int_equal(sl_source_open(g_ctx, dir, &src), SL_OK);
  sl__source_set_max_open(src, 1);
  check_pattern(src); /* alternates files through one descriptor */
  assert_int_equal(src->open_count, 1);
  char *p1 = sl__strdup(sl_source_file_at(src, 0));
  /* same bytes, but a new file put in its place */
  char *tmp = sl_test_path(dir, "replacement");
  char *cmd = NULL;
  assert_true(asprintf(&cmd, "cp '%s' '%s'", p1, tmp) > 0);
  assert_int_equal(system(cmd), 0);
  free(cmd);
  assert_int_equal(rename(tmp, p1), 0);
  unsigned char b[8];
  assert_int_equal(sl__source_pread(src, 3, 0, b, 8), SL_OK); /* file 1 open: file 0 closed */
  assert_int_equal(sl__source_pread(src, 0, 0, b, 8), SL_ERR_IO);
  assert_msg_has(p1);
  assert_msg_has("changed");
  uint64_t fp[2];
  assert_int_equal(sl__source_file_fingerprint(src, 0, fp), SL_ERR_IO);
  assert_msg_has(p1);
  sl_source_destroy(src);
  /* the same inode grown in place */
  assert_int_equal(sl_source_open(g_ctx, dir, &src), SL_OK);
  sl__source_set_max_open(src, 1);
  assert_int_equal(sl__source_pread(src, 3, 0, b, 8), SL_OK);
  FILE *f = fopen(p1, "ab");
  assert_non_null(f);
  fputc(0, f);
  fclose(f);
  assert_int_equal(sl__source_pread(src, 0, 0, b, 8), SL_ERR_IO);
  assert_msg_has("changed");
  assert_msg_has(p1);
  sl_source_destroy(src);
  free(p1);
  free(tmp);
  free(dir);
}

/* ---- coalesced reads (sl__source_read_add / _flush) ------------------------------------- */

/* Whether BUF holds bytes [OFF, OFF + N) of tensor NAME's pattern. */
static void assert_pattern_at(const unsigned char *buf, const char *name, uint64_t off, size_t n) {
  for (size_t k = 0; k < n; k++)
    if (buf[k] != sl_test_pattern_byte(name, off + k)) fail_msg("%s: byte %" PRIu64 " differs", name, off + k);
}

/* sl__preadv_full: everything or up to the end of the file, the iovecs consumed as it reads. */
static void preadv_full_consumes(void **state) {
  char *dir = sl_test_dir("source-preadv");
  char *p = sl_test_path(dir, "f");
  unsigned char data[100];
  for (int k = 0; k < 100; k++) data[k] = (unsigned char)k;
  assert_int_equal(sl_test_write_bytes(p, data, sizeof data), 0);
  int fd = open(p, O_RDONLY);
  assert_true(fd >= 0);
  unsigned char a[30], b[1], c[50], d[40];
  struct iovec iov[4] = {{a, 30}, {b, 0}, {c, 50}, {d, 40}};
  /* from byte 10: 90 bytes left, so d gets 10 of its 40 */
  assert_int_equal(sl__preadv_full(fd, iov, 4, 10), 90);
  assert_int_equal(iov[0].iov_len + iov[2].iov_len, 0);
  assert_int_equal(iov[3].iov_len, 30);
  assert_ptr_equal(iov[3].iov_base, d + 10);
  assert_int_equal(a[0], 10);
  assert_int_equal(c[0], 40);
  assert_int_equal(d[9], 99);
  struct iovec bad = {a, 30};
  assert_int_equal(sl__preadv_full(-1, &bad, 1, 0), -1);
  assert_int_equal(errno, EBADF);
  close(fd);
  free(p);
  free(dir);
}

/* What joins a batch and what flushes it first: a gap of at most 16 KiB joins (read into the
 * scratch), a wider one, a step back, another file, the iovec bound and the 8 MiB span do not;
 * every byte lands where it was asked, and only tensor bytes are counted. */
static void coalesced_reads_join_and_flush(void **state) {
  char *dir = sl_test_dir("source-batch");
  char *p = sl_test_path(dir, "m.safetensors");
  const sl_test_tensor ts[] = {
      {"t0", "F32", 1, {256}, NULL},    /* 1 KiB */
      {"t1", "F32", 1, {256}, NULL},    /* 1 KiB */
      {"wide", "I8", 1, {20000}, NULL}, /* skipped: a gap wider than 16 KiB */
      {"t3", "F32", 1, {256}, NULL},
      {"big0", "I8", 1, {5 << 20}, NULL}, /* two 5 MiB neighbours: no 8 MiB span holds both */
      {"big1", "I8", 1, {5 << 20}, NULL},
      {"huge", "I8", 1, {9 << 20}, NULL}, /* wider than a span: read at once */
  };
  assert_int_equal(sl_test_write_st(p, ts, sizeof ts / sizeof ts[0], NULL), 0);
  sl_source *src = NULL;
  assert_int_equal(sl_source_open(g_ctx, p, &src), SL_OK);
  sl__read_batch *b = calloc(1, sizeof *b);
  assert_non_null(b);
  unsigned char *t0 = malloc(1024), *t1 = malloc(1024), *t3 = malloc(1024);
  /* t0 whole, then t1's second half: the 512-byte gap joins as one scratch iovec */
  assert_int_equal(sl__source_read_add(src, b, 0, 0, t0, 1024), SL_OK);
  assert_int_equal(sl__source_read_add(src, b, 1, 512, t1 + 512, 512), SL_OK);
  assert_int_equal(b->nreq, 2);
  assert_int_equal(b->niov, 3);
  assert_ptr_equal(b->iov[1].iov_base, b->gap);
  assert_int_equal(b->iov[1].iov_len, 512);
  assert_int_equal(b->done, 0); /* nothing read yet */
  /* t3 is past 20000 skipped bytes: the pending two are read first, t3 starts a batch */
  assert_int_equal(sl__source_read_add(src, b, 3, 0, t3, 1024), SL_OK);
  assert_int_equal(b->nreq, 1);
  assert_int_equal(b->done, 1024 + 512); /* tensor bytes only, not the gap */
  assert_pattern_at(t0, "t0", 0, 1024);
  assert_pattern_at(t1 + 512, "t1", 512, 512);
  /* a step back (t1's first half, before t3) flushes too */
  assert_int_equal(sl__source_read_add(src, b, 1, 0, t1, 512), SL_OK);
  assert_int_equal(b->nreq, 1);
  assert_pattern_at(t3, "t3", 0, 1024);
  assert_int_equal(sl__source_read_flush(src, b), SL_OK);
  assert_int_equal(b->nreq, 0);
  assert_null(b->failed);
  assert_pattern_at(t1, "t1", 0, 512);
  assert_int_equal(b->done, 1024 + 512 + 1024 + 512);
  /* a flush of nothing reads nothing */
  assert_int_equal(sl__source_read_flush(src, b), SL_OK);

  /* the span: big1 does not join big0 */
  unsigned char *big = malloc((size_t)(10 << 20) + (9 << 20));
  assert_int_equal(sl__source_read_add(src, b, 4, 0, big, 5 << 20), SL_OK);
  assert_int_equal(sl__source_read_add(src, b, 5, 0, big + (5 << 20), 5 << 20), SL_OK);
  assert_int_equal(b->nreq, 1);
  assert_int_equal(b->start, sl_source_tensor_at(src, 5)->file_offset);
  /* huge is read at once, after what was pending */
  b->done = 0;
  assert_int_equal(sl__source_read_add(src, b, 6, 0, big + (10 << 20), 9 << 20), SL_OK);
  assert_int_equal(b->nreq, 0);
  assert_int_equal(b->done, (uint64_t)(14 << 20));
  assert_pattern_at(big, "big0", 0, 5 << 20);
  assert_pattern_at(big + (5 << 20), "big1", 0, 5 << 20);
  assert_pattern_at(big + (10 << 20), "huge", 0, 9 << 20);
  free(big);

  /* a request outside its tensor fails as sl__source_pread does, naming it, and leaves the
   * pending batch as it was */
  assert_int_equal(sl__source_read_add(src, b, 0, 0, t0, 8), SL_OK);
  assert_int_equal(sl__source_read_add(src, b, 1, 1000, t1, 100), SL_ERR_INVALID);
  assert_msg_has("source read of tensor 't1': bytes [1000,1100) are outside its 1024 bytes");
  assert_string_equal(b->failed, "t1");
  assert_int_equal(b->nreq, 1);
  sl__source_read_discard(b);
  assert_int_equal(b->nreq, 0);
  assert_int_equal(b->niov, 0);
  sl_source_destroy(src);

  /* another file flushes first */
  char *two = sl_test_dir("source-batch-two");
  write_sharded(two, "model.safetensors.index.json", NULL);
  assert_int_equal(sl_source_open(g_ctx, two, &src), SL_OK);
  size_t i0 = 0, i1 = sl_source_tensor_count(src) - 1;
  assert_int_not_equal(src->file_of[i0], src->file_of[i1]);
  const sl_source_tensor *a = sl_source_tensor_at(src, i0), *z = sl_source_tensor_at(src, i1);
  unsigned char *ba = malloc(a->nbytes + 1), *bz = malloc(z->nbytes + 1);
  assert_int_equal(sl__source_read_add(src, b, i0, 0, ba, a->nbytes), SL_OK);
  assert_int_equal(sl__source_read_add(src, b, i1, 0, bz, z->nbytes), SL_OK);
  assert_int_equal(b->nreq, 1);
  assert_int_equal(b->file, src->file_of[i1]);
  assert_int_equal(sl__source_read_flush(src, b), SL_OK);
  assert_pattern_at(ba, a->name, 0, a->nbytes);
  assert_pattern_at(bz, z->name, 0, z->nbytes);
  free(ba);
  free(bz);
  sl_source_destroy(src);
  free(two);

  /* a memory source has no file to coalesce: read at once */
  static const float vals[4] = {1, 2, 3, 4};
  sl_memory_tensor mt = {.size = sizeof mt, .name = "m", .dtype = SL_DTYPE_F32, .ndim = 1, .shape = {4}, .data = vals};
  assert_int_equal(sl_source_open_memory(g_ctx, "mem", &mt, 1, NULL, NULL, &src), SL_OK);
  float got[4] = {0};
  b->done = 0;
  assert_int_equal(sl__source_read_add(src, b, 0, 4, got, 8), SL_OK);
  assert_int_equal(b->nreq, 0);
  assert_int_equal(b->done, 8);
  assert_true(got[0] == 2 && got[1] == 3);
  sl_source_destroy(src);
  free(t0);
  free(t1);
  free(t3);
  free(b);
  free(p);
  free(dir);
}

/* More requests than one preadv takes (1100 tensors of 4 bytes, every other one read: a
 * request and its gap per tensor): batches stop at SL__READ_IOV iovecs, and every byte lands. */
static void coalesced_reads_iov_bound(void **state) {
  enum { N = 2200 };
  char *dir = sl_test_dir("source-batch-iov");
  char *p = sl_test_path(dir, "m.safetensors");
  sl_test_tensor *ts = calloc(N, sizeof *ts);
  char (*names)[16] = calloc(N, sizeof *names);
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "s.%04d", i);
    ts[i] = (sl_test_tensor){names[i], "I8", 1, {4}, NULL};
  }
  assert_int_equal(sl_test_write_st(p, ts, N, NULL), 0);
  sl_source *src = NULL;
  assert_int_equal(sl_source_open(g_ctx, p, &src), SL_OK);
  sl__read_batch *b = calloc(1, sizeof *b);
  unsigned char *out = calloc(N, 4);
  for (int pass = 0; pass < 2; pass++) {
    /* pass 0: every other tensor (gaps); pass 1: all of them, back to back */
    int step = pass ? 1 : 2, flushes = 0;
    size_t before = 0;
    for (int i = 0; i < N; i += step) {
      assert_int_equal(sl__source_read_add(src, b, (size_t)i, 0, out + 4 * i, 4), SL_OK);
      assert_true(b->niov <= SL__READ_IOV);
      if (b->nreq < before) flushes++;
      before = b->nreq;
    }
    assert_int_equal(sl__source_read_flush(src, b), SL_OK);
    /* 1100 requests with gaps: 512 per batch (1023 iovecs); 2200 back to back: 1024 per batch */
    assert_int_equal(flushes, 2);
    assert_int_equal(b->done, (uint64_t)(N / step) * 4);
    b->done = 0;
    for (int i = 0; i < N; i += step) assert_pattern_at(out + 4 * i, names[i], 0, 4);
  }
  sl_source_destroy(src);
  free(out);
  free(b);
  free(names);
  free(ts);
  free(p);
  free(dir);
}

/* The file cut short under a pending batch: the flush fails naming the file and the tensor at
 * the end (the first request not read whole), counts only the requests read whole, and leaves
 * the batch empty; an end inside a gap names the next tensor and says "before". */
static void coalesced_reads_truncated(void **state) {
  char *dir = sl_test_dir("source-batch-cut");
  char *p = sl_test_path(dir, "m.safetensors");
  const sl_test_tensor ts[] = {
      {"c0", "F32", 1, {256}, NULL}, {"c1", "F32", 1, {256}, NULL}, {"c2", "F32", 1, {256}, NULL},
      {"c3", "F32", 1, {256}, NULL}};
  assert_int_equal(sl_test_write_st(p, ts, 4, NULL), 0);
  sl_source *src = NULL;
  assert_int_equal(sl_source_open(g_ctx, p, &src), SL_OK);
  sl__read_batch *b = calloc(1, sizeof *b);
  unsigned char buf[4][1024];
  const sl_source_tensor *c1 = sl_source_tensor_at(src, 1);
  /* inside c1: c0 is read whole, c1 and c2 are not */
  for (size_t i = 0; i < 3; i++) assert_int_equal(sl__source_read_add(src, b, i, 0, buf[i], 1024), SL_OK);
  assert_int_equal(truncate(p, (off_t)(c1->file_offset + 100)), 0);
  assert_int_equal(sl__source_read_flush(src, b), SL_ERR_IO);
  char want[256];
  snprintf(want, sizeof want, "%s: file ends at byte %" PRIu64 ", inside tensor 'c1' (bytes %" PRIu64 "..%" PRIu64
           "): the file was truncated after it was opened", p, c1->file_offset + 100, c1->file_offset,
           c1->file_offset + 1024);
  assert_string_equal(errmsg(), want);
  assert_string_equal(b->failed, "c1");
  assert_int_equal(b->done, 1024);
  assert_int_equal(b->nreq, 0);
  assert_pattern_at(buf[0], "c0", 0, 1024);
  assert_pattern_at(buf[1], "c1", 0, 100);
  sl_source_destroy(src);
  /* in the gap before c1 (c0's second half is nobody's here): c1 is named, the end is before it */
  assert_int_equal(sl_test_write_st(p, ts, 4, NULL), 0);
  assert_int_equal(sl_source_open(g_ctx, p, &src), SL_OK);
  const sl_source_tensor *c0 = sl_source_tensor_at(src, 0);
  c1 = sl_source_tensor_at(src, 1);
  b->done = 0;
  assert_int_equal(sl__source_read_add(src, b, 0, 0, buf[0], 512), SL_OK);
  assert_int_equal(sl__source_read_add(src, b, 1, 0, buf[1], 1024), SL_OK);
  assert_int_equal(b->niov, 3);
  assert_int_equal(truncate(p, (off_t)(c0->file_offset + 700)), 0);
  assert_int_equal(sl__source_read_flush(src, b), SL_ERR_IO);
  snprintf(want, sizeof want, "%s: file ends at byte %" PRIu64 ", before tensor 'c1' (bytes %" PRIu64 "..%" PRIu64
           "): the file was truncated after it was opened", p, c0->file_offset + 700, c1->file_offset,
           c1->file_offset + 1024);
  assert_string_equal(errmsg(), want);
  assert_string_equal(b->failed, "c1");
  assert_int_equal(b->done, 512);
  assert_int_equal(b->nreq, 0);
  /* and the batch is good for the next reads (here: the bytes still there) */
  assert_int_equal(sl__source_read_add(src, b, 0, 0, buf[2], 600), SL_OK);
  assert_int_equal(sl__source_read_flush(src, b), SL_OK);
  assert_pattern_at(buf[2], "c0", 0, 600);
  sl_source_destroy(src);
  free(b);
  free(p);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(single_file),       cmocka_unit_test(pread_bounds_and_truncation),
      cmocka_unit_test(index_two_files),   cmocka_unit_test(directory_forms),
      cmocka_unit_test(index_errors),      cmocka_unit_test(index_parse_direct),
      cmocka_unit_test(index_parse_out_of_memory_every_allocation),
      cmocka_unit_test(index_open_out_of_memory_every_allocation),
      cmocka_unit_test(find),              cmocka_unit_test(manifest_round_trip),
      cmocka_unit_test(manifest_empty_source),
      cmocka_unit_test(identity_digest_and_names),
      cmocka_unit_test(identity_fingerprint_sampling),
      cmocka_unit_test(index_confinement),
      cmocka_unit_test(hf_cache_layout),
      cmocka_unit_test(non_regular_files),
      cmocka_unit_test(special_file_refused_unopened),
      cmocka_unit_test(many_shards_low_fd_limit),
      cmocka_unit_test(reopen_checks_identity),
      cmocka_unit_test(preadv_full_consumes),
      cmocka_unit_test(coalesced_reads_join_and_flush),
      cmocka_unit_test(coalesced_reads_iov_bound),
      cmocka_unit_test(coalesced_reads_truncated),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
