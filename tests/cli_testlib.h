/* Test-side helpers of the `shardload` command tests (test_cli.c, test_cli_multirank.c): an
 * independent safetensors reader (jansson + fread), torch.chunk geometry and slices computed
 * here, and checks of a rank's --dump file against the source. Nothing here uses the
 * library's reader. Static inline: each test includes what it uses. */
#ifndef SL_CLI_TESTLIB_H
#define SL_CLI_TESTLIB_H

#include "testutil.h"

#include <fnmatch.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- an independent safetensors reader ---------------------------------------------------- */

typedef struct st_file {
  char *path;
  json_t *hdr;
  uint64_t data_off, file_size;
} st_file;

static inline size_t dt_size(const char *dt) {
  if (!strcmp(dt, "F64") || !strcmp(dt, "I64") || !strcmp(dt, "U64")) return 8;
  if (!strcmp(dt, "F32") || !strcmp(dt, "I32") || !strcmp(dt, "U32")) return 4;
  if (!strcmp(dt, "F16") || !strcmp(dt, "BF16") || !strcmp(dt, "I16") || !strcmp(dt, "U16")) return 2;
  return 1;
}

static inline void st_open(const char *path, st_file *f) {
  memset(f, 0, sizeof *f);
  f->path = strdup(path);
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  unsigned char le[8];
  assert_int_equal(fread(le, 1, 8, fp), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++) n |= (uint64_t)le[i] << (8 * i);
  assert_true(n > 0 && n < (1u << 26));
  assert_int_equal(n % 8, 0); /* both writers pad the header to 8 bytes */
  char *text = malloc(n);
  assert_non_null(text);
  assert_int_equal(fread(text, 1, n, fp), n);
  json_error_t err;
  f->hdr = json_loadb(text, n, 0, &err);
  if (!f->hdr) fail_msg("%s: header is not JSON: %s", path, err.text);
  free(text);
  fseek(fp, 0, SEEK_END);
  f->file_size = (uint64_t)ftell(fp);
  fclose(fp);
  f->data_off = 8 + n;
}

static inline void st_close(st_file *f) {
  json_decref(f->hdr);
  free(f->path);
}

/* The safetensors rules: every entry well formed, nbytes = prod(shape) * dtype size, offsets
 * contiguous from 0 and covering the whole data section. Returns the tensor count. */
typedef struct range {
  uint64_t b, e;
} range;

static inline int range_cmp(const void *a, const void *b) {
  const range *x = a, *y = b;
  if (x->b != y->b) return x->b < y->b ? -1 : 1;
  return x->e < y->e ? -1 : x->e > y->e;
}

static inline size_t st_check_valid(const st_file *f) {
  const char *key;
  json_t *v;
  size_t n = 0;
  range *r = calloc(json_object_size(f->hdr) + 1, sizeof *r);
  assert_non_null(r);
  json_object_foreach(f->hdr, key, v) {
    if (!strcmp(key, "__metadata__")) {
      const char *k2;
      json_t *v2;
      json_object_foreach(v, k2, v2) assert_true(json_is_string(v2));
      continue;
    }
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    assert_true(json_is_string(dt) && json_is_array(sh) && json_is_array(off));
    assert_int_equal(json_array_size(off), 2);
    uint64_t elems = 1;
    for (size_t d = 0; d < json_array_size(sh); d++) elems *= (uint64_t)json_integer_value(json_array_get(sh, d));
    r[n].b = (uint64_t)json_integer_value(json_array_get(off, 0));
    r[n].e = (uint64_t)json_integer_value(json_array_get(off, 1));
    assert_true(r[n].e >= r[n].b);
    assert_int_equal(r[n].e - r[n].b, elems * dt_size(json_string_value(dt)));
    n++;
  }
  /* contiguity: the sorted [begin, end) ranges tile the data section */
  qsort(r, n, sizeof *r, range_cmp);
  uint64_t pos = 0;
  for (size_t i = 0; i < n; i++) {
    if (r[i].b != pos) fail_msg("%s: data_offsets not contiguous at %llu", f->path, (unsigned long long)pos);
    pos = r[i].e;
  }
  free(r);
  assert_int_equal(f->file_size - f->data_off, pos);
  return n;
}

typedef struct st_tensor {
  const char *dtype;
  int ndim;
  int64_t shape[8];
  uint64_t begin, end;
} st_tensor;

static inline int st_find(const st_file *f, const char *name, st_tensor *t) {
  memset(t, 0, sizeof *t);
  json_t *v = json_object_get(f->hdr, name);
  if (!v || !strcmp(name, "__metadata__")) return -1;
  t->dtype = json_string_value(json_object_get(v, "dtype"));
  json_t *sh = json_object_get(v, "shape");
  t->ndim = (int)json_array_size(sh);
  for (int d = 0; d < t->ndim; d++) t->shape[d] = json_integer_value(json_array_get(sh, (size_t)d));
  json_t *off = json_object_get(v, "data_offsets");
  t->begin = (uint64_t)json_integer_value(json_array_get(off, 0));
  t->end = (uint64_t)json_integer_value(json_array_get(off, 1));
  return 0;
}

static inline unsigned char *st_bytes(const st_file *f, const st_tensor *t) {
  size_t n = (size_t)(t->end - t->begin);
  unsigned char *buf = malloc(n ? n : 1);
  assert_non_null(buf);
  FILE *fp = fopen(f->path, "rb");
  assert_non_null(fp);
  assert_int_equal(fseek(fp, (long)(f->data_off + t->begin), SEEK_SET), 0);
  assert_int_equal(fread(buf, 1, n, fp), n);
  fclose(fp);
  return buf;
}

static inline const char *st_meta(const st_file *f, const char *key) {
  return json_string_value(json_object_get(json_object_get(f->hdr, "__metadata__"), key));
}

/* Tensor names of a header, in no particular order; NULL-terminated, free the array only. */
static inline const char **st_names(const st_file *f, size_t *count) {
  size_t n = json_object_size(f->hdr), k = 0;
  const char **names = calloc(n + 1, sizeof *names);
  const char *key;
  json_t *v;
  json_object_foreach(f->hdr, key, v) if (strcmp(key, "__metadata__")) names[k++] = key;
  *count = k;
  return names;
}

/* ---- helpers -------------------------------------------------------------------------------- */

static inline json_t *load_json_file(const char *path) {
  json_error_t err;
  json_t *j = json_load_file(path, 0, &err);
  if (!j) fail_msg("%s: not JSON: %s (line %d)", path, err.text, err.line);
  return j;
}

/* Runs a command whose stdout goes to OUT_PATH; returns the exit status and asserts that
 * nothing was printed on stderr when it succeeded. */
static inline int run_to_file(const char *out_path, const char *cmdline) {
  char *err = NULL;
  int rc = sl_test_run(&err, "%s > '%s'", cmdline, out_path);
  if (rc == 0 && err && *err) fail_msg("stderr not empty: %s", err);
  free(err);
  return rc;
}

/* The one-line error format: "shardload: SUBJECT: SL_ERR_...: message\n". */
static inline void assert_one_error_line(const char *out, const char *subject) {
  assert_non_null(out);
  size_t len = strlen(out);
  assert_true(len > 0 && out[len - 1] == '\n');
  assert_ptr_equal(strchr(out, '\n'), out + len - 1);
  char prefix[1024];
  snprintf(prefix, sizeof prefix, "shardload: %s: SL_", subject);
  if (strncmp(out, prefix, strlen(prefix)) != 0) fail_msg("expected '%s...', got '%s'", prefix, out);
  /* "SL_NAME: message" with a non-empty message */
  const char *colon = strstr(out + strlen(prefix), ": ");
  assert_non_null(colon);
  assert_true(colon[2] != '\n');
}

/* torch.chunk of length N over K for index R: [off, off+len). */
static inline void chunk(int64_t n, int64_t k, int64_t r, int64_t *off, int64_t *len) {
  int64_t c = (n + k - 1) / k, s = r * c;
  if (s > n) s = n;
  int64_t e = s + c < n ? s + c : n;
  *off = s;
  *len = e - s;
}

/* The local slice [OFF, OFF+LSHAPE) of a row-major tensor of GSHAPE, gathered here. */
static inline unsigned char *slice_of(const unsigned char *src, size_t esize, int ndim, const int64_t *gshape,
                               const int64_t *lshape, const int64_t *off, size_t *out_len) {
  uint64_t elems = 1;
  for (int d = 0; d < ndim; d++) elems *= (uint64_t)lshape[d];
  unsigned char *dst = malloc(elems * esize + 1);
  assert_non_null(dst);
  *out_len = (size_t)(elems * esize);
  if (elems == 0) return dst;
  int64_t idx[8] = {0};
  for (uint64_t i = 0; i < elems; i++) {
    uint64_t g = 0;
    for (int d = 0; d < ndim; d++) g = g * (uint64_t)gshape[d] + (uint64_t)(off[d] + idx[d]);
    memcpy(dst + i * esize, src + g * esize, esize);
    for (int d = ndim - 1; d >= 0; d--) {
      if (++idx[d] < lshape[d]) break;
      idx[d] = 0;
    }
  }
  return dst;
}

static inline void parse_dims_text(const char *s, int64_t *dims, int *ndim) {
  assert_non_null(s);
  assert_int_equal(s[0], '[');
  *ndim = 0;
  const char *p = s + 1;
  while (*p && *p != ']') {
    char *end;
    dims[(*ndim)++] = strtoll(p, &end, 10);
    assert_true(end != p);
    p = *end == ',' ? end + 1 : end;
  }
  assert_int_equal(*p, ']');
}

/* A source tensor by name across one file or the files of an index directory. */
static inline int source_find(const char *path, const char *name, st_file *f, st_tensor *t) {
  char *idx = sl_test_path(path, "model.safetensors.index.json");
  FILE *probe = fopen(idx, "rb");
  if (probe) {
    fclose(probe);
    json_t *j = load_json_file(idx);
    const char *file = json_string_value(json_object_get(json_object_get(j, "weight_map"), name));
    int rc = -1;
    if (file) {
      char *p = sl_test_path(path, file);
      st_open(p, f);
      free(p);
      rc = st_find(f, name, t);
    }
    json_decref(j);
    free(idx);
    return rc;
  }
  free(idx);
  st_open(path, f);
  return st_find(f, name, t);
}

/* Checks every tensor of a rank's dump against the slice of the source that its recorded
 * geometry names, and that geometry against torch.chunk of dim 0 (the default FSDP2 plan;
 * 0-d tensors, and tensors whose name matches the glob REPLICATE when not NULL, whole) for
 * RANK of WORLD. CAST_F32: the load cast floating BF16 tensors to F32. Returns the tensor
 * count. */
static inline size_t check_dump(const char *dump, const char *source, int cast_f32, int rank, int world,
                                const char *replicate) {
  st_file d = {0};
  st_open(dump, &d);
  size_t n = st_check_valid(&d);
  char num[32];
  snprintf(num, sizeof num, "%d", rank);
  assert_string_equal(st_meta(&d, "rank"), num);
  snprintf(num, sizeof num, "%d", world);
  assert_string_equal(st_meta(&d, "world_size"), num);
  size_t count;
  const char **names = st_names(&d, &count);
  assert_int_equal(count, n);
  for (size_t i = 0; i < count; i++) {
    const char *name = names[i];
    st_tensor lt = {0}, gt = {0};
    st_file s = {0};
    assert_int_equal(st_find(&d, name, &lt), 0);
    if (source_find(source, name, &s, &gt) != 0) fail_msg("%s: not in the source", name);

    char key[512];
    int64_t gshape[8], goff[8];
    int gnd, ond;
    snprintf(key, sizeof key, "%s.global_shape", name);
    parse_dims_text(st_meta(&d, key), gshape, &gnd);
    snprintf(key, sizeof key, "%s.global_offset", name);
    parse_dims_text(st_meta(&d, key), goff, &ond);
    assert_int_equal(gnd, gt.ndim);
    assert_int_equal(ond, gt.ndim);
    assert_int_equal(lt.ndim, gt.ndim);
    for (int k = 0; k < gt.ndim; k++) {
      int64_t off = 0, len = gt.shape[k];
      if (k == 0 && !(replicate && fnmatch(replicate, name, 0) == 0)) chunk(gt.shape[0], world, rank, &off, &len);
      assert_int_equal(gshape[k], gt.shape[k]);
      if (goff[k] != off || lt.shape[k] != len)
        fail_msg("%s dim %d on rank %d of %d: [%lld, +%lld), want [%lld, +%lld)", name, k, rank, world,
                 (long long)goff[k], (long long)lt.shape[k], (long long)off, (long long)len);
    }

    unsigned char *src = st_bytes(&s, &gt), *got = st_bytes(&d, &lt);
    size_t esize = dt_size(gt.dtype), elen;
    unsigned char *want = slice_of(src, esize, gt.ndim, gt.shape, lt.shape, goff, &elen);
    if (cast_f32 && !strcmp(gt.dtype, "BF16")) {
      assert_string_equal(lt.dtype, "F32");
      assert_int_equal(lt.end - lt.begin, elen * 2);
      for (size_t e = 0; e < elen / 2; e++) {
        uint16_t b;
        uint32_t f32;
        memcpy(&b, want + 2 * e, 2);
        memcpy(&f32, got + 4 * e, 4);
        if (f32 != (uint32_t)b << 16) fail_msg("%s[%zu]: F32 bits %08x, want %04x<<16", name, e, f32, b);
      }
    } else {
      assert_string_equal(lt.dtype, gt.dtype);
      assert_int_equal(lt.end - lt.begin, elen);
      if (memcmp(want, got, elen) != 0) fail_msg("%s: dumped shard differs from the source slice", name);
    }
    free(src);
    free(got);
    free(want);
    st_close(&s);
  }
  free(names);
  st_close(&d);
  return n;
}

#endif
