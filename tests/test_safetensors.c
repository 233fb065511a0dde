/* The safetensors header reader, case by case from the format's rules: every malformed file is
 * rejected with the right status and a message that says what is wrong. Files are written byte
 * by byte by the test helpers, independently of the reader. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "internal.h"
#include "testutil.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

static char *g_dir;
static char g_err[1024];

static int setup(void **state) {
  g_dir = sl_test_dir("safetensors");
  return g_dir ? 0 : -1;
}

static int teardown(void **state) {
  free(g_dir);
  return 0;
}

static sl_status read_path(const char *path, sl__st_header *h) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  assert_true(fd >= 0);
  g_err[0] = 0;
  sl_status s = sl__st_read(fd, h, g_err, sizeof g_err);
  close(fd);
  return s;
}

/* Writes HEADER followed by DATA_LEN data bytes and reads it back. */
static sl_status read_raw(const char *header, size_t data_len, sl__st_header *h) {
  char *p = sl_test_path(g_dir, "raw.safetensors");
  assert_int_equal(sl_test_write_raw(p, header, data_len), 0);
  sl_status s = read_path(p, h);
  free(p);
  return s;
}

static sl_status read_bytes(const void *b, size_t len, sl__st_header *h) {
  char *p = sl_test_path(g_dir, "bytes.safetensors");
  assert_int_equal(sl_test_write_bytes(p, b, len), 0);
  sl_status s = read_path(p, h);
  free(p);
  return s;
}

/* Expects HEADER + DATA_LEN to fail with STATUS and a message holding NEEDLE. */
static void expect_fail(const char *header, size_t data_len, sl_status status, const char *needle) {
  sl__st_header h;
  sl_status s = read_raw(header, data_len, &h);
  if (s != status || (needle && !strstr(g_err, needle)))
    print_error("header %s\n  got %s: '%s'\n  want %s with '%s'\n", header, sl_status_name(s), g_err,
                sl_status_name(status), needle ? needle : "");
  assert_int_equal(s, status);
  if (needle) assert_non_null(strstr(g_err, needle));
  /* a failed parse leaves nothing behind */
  assert_int_equal(h.count, 0);
  assert_null(h.tensors);
  assert_null(h.meta_keys);
}

#define T_A "\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}"

static void valid_minimal(void **state) {
  sl__st_header h;
  const char *hdr = "{" T_A "}";
  assert_int_equal(read_raw(hdr, 12, &h), SL_OK);
  assert_int_equal(h.count, 1);
  assert_string_equal(h.tensors[0].name, "a");
  assert_int_equal(h.tensors[0].dtype, SL_DTYPE_F32);
  assert_int_equal(h.tensors[0].ndim, 1);
  assert_int_equal(h.tensors[0].shape[0], 3);
  assert_int_equal(h.tensors[0].begin, 0);
  assert_int_equal(h.tensors[0].end, 12);
  assert_int_equal(h.data_offset, 8 + strlen(hdr));
  assert_int_equal(h.data_size, 12);
  assert_int_equal(h.meta_count, 0);
  sl__st_header_free(&h);
  assert_null(h.tensors);
  sl__st_header_free(&h); /* twice is harmless */
}

static void empty_header(void **state) {
  sl__st_header h;
  assert_int_equal(read_raw("{}", 0, &h), SL_OK);
  assert_int_equal(h.count, 0);
  assert_int_equal(h.data_size, 0);
  sl__st_header_free(&h);
  expect_fail("{}", 1, SL_ERR_FORMAT, "data section has 1 trailing bytes");
  expect_fail("", 0, SL_ERR_FORMAT, "empty");
}

static void zero_dim(void **state) {
  sl__st_header h;
  assert_int_equal(read_raw("{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}", 8, &h), SL_OK);
  assert_int_equal(h.count, 1);
  assert_int_equal(h.tensors[0].ndim, 0);
  assert_int_equal(h.tensors[0].dtype, SL_DTYPE_F64);
  assert_int_equal(h.tensors[0].end, 8);
  sl__st_header_free(&h);
  expect_fail("{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, SL_ERR_FORMAT,
              "hold 4 bytes but shape [] x F64 needs 8");
}

static void empty_tensors_and_order(void **state) {
  sl__st_header h;
  /* listed out of order; two zero-length tensors tie at byte 0 and one at the end */
  const char *hdr = "{\"m\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"z\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
                    "\"q\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[4,6]},"
                    "\"y\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[6,6]},"
                    "\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}";
  assert_int_equal(read_raw(hdr, 6, &h), SL_OK);
  assert_int_equal(h.count, 5);
  const char *want[] = {"b", "z", "m", "q", "y"};
  for (size_t i = 0; i < 5; i++) assert_string_equal(h.tensors[i].name, want[i]);
  assert_int_equal(h.tensors[1].ndim, 2);
  assert_int_equal(h.tensors[1].shape[0], 0);
  assert_int_equal(h.tensors[1].shape[1], 4);
  assert_int_equal(h.tensors[4].begin, 6);
  sl__st_header_free(&h);
  /* an empty tensor must still have begin == end */
  expect_fail("{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,4]}}", 4, SL_ERR_FORMAT,
              "hold 4 bytes but shape [0] x F32 needs 0");
}

static void padding(void **state) {
  sl__st_header h;
  assert_int_equal(read_raw("{" T_A "}       ", 12, &h), SL_OK);
  assert_int_equal(h.count, 1);
  sl__st_header_free(&h);
  assert_int_equal(read_raw("  \n{" T_A "}\t ", 12, &h), SL_OK);
  assert_int_equal(h.count, 1);
  sl__st_header_free(&h);
  /* padding is whitespace, not anything else */
  const char *hdr = "{" T_A "}";
  size_t n = strlen(hdr) + 3, len = 8 + n + 12;
  unsigned char *b = calloc(1, len);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)n >> (8 * i));
  memcpy(b + 8, hdr, strlen(hdr)); /* then 3 NUL bytes of "padding" */
  assert_int_equal(read_bytes(b, len, &h), SL_ERR_FORMAT);
  assert_non_null(strstr(g_err, "not valid JSON"));
  free(b);
  expect_fail("{" T_A "}xx", 12, SL_ERR_FORMAT, "not valid JSON");
}

static void header_length_limits(void **state) {
  sl__st_header h;
  unsigned char b[16] = {0};
  uint64_t n = 123456789012ull;
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
  memcpy(b + 8, "{}      ", 8);
  assert_int_equal(read_bytes(b, sizeof b, &h), SL_ERR_FORMAT);
  assert_non_null(strstr(g_err, "header length 123456789012 exceeds the 100000000-byte limit"));

  /* just over the limit is refused even when the file is long enough to hold it (only the
   * length is checked: sparse file) */
  n = SL__ST_MAX_HEADER + 1;
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
  assert_int_equal(sl__st_parse(b, 16, 8 + n, &h, g_err, sizeof g_err), SL_ERR_FORMAT);
  assert_non_null(strstr(g_err, "exceeds the 100000000-byte limit"));

  /* within the limit but past the end of the file */
  n = 100;
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
  assert_int_equal(read_bytes(b, sizeof b, &h), SL_ERR_FORMAT);
  assert_non_null(strstr(g_err, "header length 100 runs past the end of the 16-byte file"));
  n = SL__ST_MAX_HEADER;
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
  assert_int_equal(read_bytes(b, sizeof b, &h), SL_ERR_FORMAT);
  assert_non_null(strstr(g_err, "runs past the end"));

  /* length exactly the rest of the file is fine */
  n = 8;
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
  assert_int_equal(read_bytes(b, sizeof b, &h), SL_OK);
  sl__st_header_free(&h);

  /* the parser is told of a header it was not given in full */
  assert_int_equal(sl__st_parse(b, 12, 16, &h, g_err, sizeof g_err), SL_ERR_FORMAT);
  assert_non_null(strstr(g_err, "truncated"));
}

static void short_file(void **state) {
  sl__st_header h;
  const unsigned char b[5] = {2, 0, 0, 0, 0};
  assert_int_equal(read_bytes(b, sizeof b, &h), SL_ERR_FORMAT);
  assert_non_null(strstr(g_err, "file is 5 bytes, shorter than the 8-byte header length"));
  assert_int_equal(read_bytes(b, 0, &h), SL_ERR_FORMAT);
  assert_non_null(strstr(g_err, "file is 0 bytes"));
  unsigned char z[8] = {0};
  assert_int_equal(read_bytes(z, 8, &h), SL_ERR_FORMAT);
  assert_non_null(strstr(g_err, "empty"));
}

static void not_json(void **state) {
  expect_fail("{not json}", 0, SL_ERR_FORMAT, "header is not valid JSON");
  expect_fail("{\"a\":", 0, SL_ERR_FORMAT, "not valid JSON");
  expect_fail("[]", 0, SL_ERR_FORMAT, "header is a JSON array; it must be an object");
  expect_fail("[" T_A "]", 12, SL_ERR_FORMAT, "not valid JSON");
  expect_fail("\"str\"", 0, SL_ERR_FORMAT, NULL);
  expect_fail("{}{}", 0, SL_ERR_FORMAT, "not valid JSON");
}

static void invalid_utf8(void **state) {
  expect_fail("{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, SL_ERR_FORMAT,
              "not valid UTF-8 (byte 3");
  /* overlong '/' and a UTF-16 surrogate are not UTF-8 either */
  expect_fail("{\"\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, SL_ERR_FORMAT, "UTF-8");
  expect_fail("{\"\xed\xa0\x80\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, SL_ERR_FORMAT,
              "UTF-8");
  expect_fail("{\"\xe2\x82\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, SL_ERR_FORMAT, "UTF-8");
  /* valid multi-byte names pass */
  sl__st_header h;
  assert_int_equal(read_raw("{\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\":{\"dtype\":\"F32\",\"shape\":[0],"
                            "\"data_offsets\":[0,0]}}",
                            0, &h),
                   SL_OK);
  assert_string_equal(h.tensors[0].name, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
  sl__st_header_free(&h);
}

static void duplicates(void **state) {
  expect_fail("{" T_A "," T_A "}", 12, SL_ERR_FORMAT, "duplicate");
  expect_fail("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", 12, SL_ERR_FORMAT,
              "duplicate");
  expect_fail("{\"__metadata__\":{},\"__metadata__\":{}}", 0, SL_ERR_FORMAT, "duplicate");
}

static void metadata(void **state) {
  sl__st_header h;
  assert_int_equal(read_raw("{\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\"}," T_A "}", 12, &h), SL_OK);
  assert_int_equal(h.count, 1);
  assert_int_equal(h.meta_count, 2);
  assert_string_equal(h.meta_keys[0], "format");
  assert_string_equal(h.meta_values[0], "pt");
  assert_string_equal(h.meta_keys[1], "k");
  assert_string_equal(h.meta_values[1], "v");
  sl__st_header_free(&h);
  assert_int_equal(read_raw("{\"__metadata__\":{}}", 0, &h), SL_OK);
  assert_int_equal(h.meta_count, 0);
  assert_int_equal(h.count, 0);
  sl__st_header_free(&h);

  expect_fail("{\"__metadata__\":{\"format\":\"pt\",\"n\":1}}", 0, SL_ERR_FORMAT,
              "__metadata__ value of 'n' is 1");
  expect_fail("{\"__metadata__\":{\"o\":{}}}", 0, SL_ERR_FORMAT, "must be strings");
  expect_fail("{\"__metadata__\":{\"z\":null}}", 0, SL_ERR_FORMAT, "must be strings");
  expect_fail("{\"__metadata__\":[\"x\"]}", 0, SL_ERR_FORMAT, "__metadata__ is a JSON array");
  expect_fail("{\"__metadata__\":\"pt\"}", 0, SL_ERR_FORMAT, "__metadata__ is a JSON string");
}

static void dtypes(void **state) {
  static const struct {
    const char *name;
    sl_dtype dt;
    int size;
  } all[] = {{"F64", SL_DTYPE_F64, 8},     {"F32", SL_DTYPE_F32, 4},         {"F16", SL_DTYPE_F16, 2},
             {"BF16", SL_DTYPE_BF16, 2},   {"F8_E4M3", SL_DTYPE_F8_E4M3, 1}, {"F8_E5M2", SL_DTYPE_F8_E5M2, 1},
             {"I64", SL_DTYPE_I64, 8},     {"I32", SL_DTYPE_I32, 4},         {"I16", SL_DTYPE_I16, 2},
             {"I8", SL_DTYPE_I8, 1},       {"U8", SL_DTYPE_U8, 1},           {"BOOL", SL_DTYPE_BOOL, 1},
             {"U16", SL_DTYPE_U16, 2},     {"U32", SL_DTYPE_U32, 4},         {"U64", SL_DTYPE_U64, 8}};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    char hdr[256];
    snprintf(hdr, sizeof hdr, "{\"t\":{\"dtype\":\"%s\",\"shape\":[2,3],\"data_offsets\":[0,%d]}}", all[i].name,
             6 * all[i].size);
    sl__st_header h;
    assert_int_equal(read_raw(hdr, (size_t)(6 * all[i].size), &h), SL_OK);
    assert_int_equal(h.tensors[0].dtype, all[i].dt);
    sl__st_header_free(&h);
    /* one byte short is a size mismatch for every dtype */
    snprintf(hdr, sizeof hdr, "{\"t\":{\"dtype\":\"%s\",\"shape\":[2,3],\"data_offsets\":[0,%d]}}", all[i].name,
             6 * all[i].size - 1);
    expect_fail(hdr, (size_t)(6 * all[i].size - 1), SL_ERR_FORMAT, "needs");
  }
}

static void unknown_dtype(void **state) {
  expect_fail("{\"x\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1, SL_ERR_DTYPE,
              "tensor 'x': dtype 'F4' is not supported");
  expect_fail("{\"x\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, SL_ERR_DTYPE, "'C64'");
  expect_fail("{\"x\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, SL_ERR_DTYPE, "'f32'");
  expect_fail("{\"x\":{\"dtype\":\"\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, SL_ERR_DTYPE, "not supported");
  expect_fail("{\"x\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, SL_ERR_FORMAT,
              "dtype is a JSON integer");
}

static void bad_shapes(void **state) {
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, SL_ERR_FORMAT,
              "shape entry 0 is -1, not a non-negative integer");
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[1,2.0],\"data_offsets\":[0,8]}}", 8, SL_ERR_FORMAT,
              "shape entry 1 is 2.0");
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, SL_ERR_FORMAT,
              "shape entry 0");
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,12]}}", 12, SL_ERR_FORMAT,
              "shape is a JSON integer");
  expect_fail("{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
              SL_ERR_UNSUPPORTED, "9 dims");
  sl__st_header h;
  assert_int_equal(read_raw("{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, &h),
                   SL_OK);
  assert_int_equal(h.tensors[0].ndim, SL_MAX_DIMS);
  sl__st_header_free(&h);
}

static void bad_offsets(void **state) {
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 4, SL_ERR_FORMAT,
              "data_offsets is [4]; it must be [begin,end]");
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, SL_ERR_FORMAT, "[begin,end]");
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}}}", 4, SL_ERR_FORMAT, "[begin,end]");
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, SL_ERR_FORMAT,
              "data_offsets [4,0] end before they begin");
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, SL_ERR_FORMAT,
              "two non-negative integers");
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", 4, SL_ERR_FORMAT,
              "two non-negative integers");
}

static void size_mismatch(void **state) {
  expect_fail("{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,10]}}", 10, SL_ERR_FORMAT,
              "tensor 'a.weight': data_offsets [0,10] hold 10 bytes but shape [3] x F32 needs 12");
  expect_fail("{\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,14]}}", 14, SL_ERR_FORMAT,
              "shape [2,3] x BF16 needs 12");
}

static void layout(void **state) {
  /* hole */
  expect_fail("{" T_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]}}", 20, SL_ERR_FORMAT,
              "hole between byte 12 and 16");
  /* overlap */
  expect_fail("{" T_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[8,20]}}", 20, SL_ERR_FORMAT,
              "tensor 'b': data_offsets [8,20] overlap tensor 'a'");
  /* same range twice */
  expect_fail("{" T_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", 12, SL_ERR_FORMAT,
              "overlap");
  /* trailing data */
  expect_fail("{" T_A "}", 16, SL_ERR_FORMAT, "data section has 4 trailing bytes");
  /* not starting at 0 */
  expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[4,16]}}", 16, SL_ERR_FORMAT,
              "hole between byte 0 and 4");
  /* data section shorter than the tensors */
  expect_fail("{" T_A "}", 8, SL_ERR_FORMAT, "tensor 'a' ends at byte 12 of the data section, but the file holds only 8");
  /* a zero-length tensor beyond the end is a hole, not a free pass */
  expect_fail("{" T_A ",\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[20,20]}}", 12, SL_ERR_FORMAT,
              "hole between byte 12 and 20");
}

static void overflow(void **state) {
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,0]}}", 0,
              SL_ERR_FORMAT, "tensor 'x': shape [4294967296,4294967296,16] x F32 overflows");
  /* the reference multiplies left to right: overflow before a 0 is still overflow */
  expect_fail("{\"x\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]}}", 0,
              SL_ERR_FORMAT, "overflows");
  /* elements fit but bytes do not */
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
              SL_ERR_FORMAT, "overflows");
  /* an integer JSON cannot hold in 64 signed bits */
  expect_fail("{\"x\":{\"dtype\":\"U8\",\"shape\":[18446744073709551615],\"data_offsets\":[0,0]}}", 0,
              SL_ERR_FORMAT, NULL);
}

/* Found by tests/crosscheck/safetensors_diff.py: jansson reads the integer -0 as 0, the
 * reference reads it as the float -0.0 and refuses it; so must we. */
static void negative_zero(void **state) {
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[-0],\"data_offsets\":[0,0]}}", 0, SL_ERR_FORMAT,
              "header holds the number -0 (byte 29 of the header)");
  expect_fail("{" T_A ",\"z\":{\"dtype\":\"U8\",\"shape\":[3,-0],\"data_offsets\":[12,12]}}", 12, SL_ERR_FORMAT,
              "-0");
  expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[-0,12]}}", 12, SL_ERR_FORMAT, "-0");
  expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0, -0 ]}}", 0, SL_ERR_FORMAT, "-0");
  /* -0 as a float was refused already, as a real */
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[-0.0],\"data_offsets\":[0,0]}}", 0, SL_ERR_FORMAT,
              "shape entry 0 is -0.0");
  expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[-0e0],\"data_offsets\":[0,0]}}", 0, SL_ERR_FORMAT,
              "shape entry 0");
  /* "-0" in names and metadata is text, and an escaped quote does not end a string */
  sl__st_header h;
  assert_int_equal(read_raw("{\"__metadata__\":{\"k-0\":\"-0\"},\"q\\\"-0\\\\\":{\"dtype\":\"F32\","
                            "\"shape\":[0],\"data_offsets\":[0,0]}}",
                            0, &h),
                   SL_OK);
  assert_int_equal(h.count, 1);
  assert_string_equal(h.tensors[0].name, "q\"-0\\");
  assert_string_equal(h.meta_values[0], "-0");
  sl__st_header_free(&h);
}

/* Writes the LEN-byte header HDR (NUL bytes allowed) and DATA_LEN data bytes, reads it back. */
static sl_status read_hdr_bytes(const char *hdr, size_t len, size_t data_len, sl__st_header *h) {
  size_t total = 8 + len + data_len;
  unsigned char *b = calloc(1, total);
  assert_non_null(b);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)len >> (8 * i));
  memcpy(b + 8, hdr, len);
  sl_status s = read_bytes(b, total, h);
  free(b);
  return s;
}

/* Found by tests/crosscheck/safetensors_diff.py: jansson skips a NUL byte that follows a number,
 * so "[3\0]" read as [3]; the reference refuses every NUL byte in the header. */
static void nul_bytes(void **state) {
  sl__st_header h;
  static const char after_shape[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[3\0],\"data_offsets\":[0,12]}}";
  assert_int_equal(read_hdr_bytes(after_shape, sizeof after_shape - 1, 12, &h), SL_ERR_FORMAT);
  assert_non_null(strstr(g_err, "header is not valid JSON: NUL byte at byte 30 of the header"));
  assert_int_equal(h.count, 0);
  static const char after_offset[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[3,1],\"data_offsets\":[0,12\0]}}";
  assert_int_equal(read_hdr_bytes(after_offset, sizeof after_offset - 1, 12, &h), SL_ERR_FORMAT);
  assert_non_null(strstr(g_err, "NUL byte"));
  static const char in_name[] = "{\"a\0\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}";
  assert_int_equal(read_hdr_bytes(in_name, sizeof in_name - 1, 12, &h), SL_ERR_FORMAT);
  assert_non_null(strstr(g_err, "NUL byte at byte 3 "));
  /* the same header without the NUL byte is fine */
  static const char clean[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}";
  assert_int_equal(read_hdr_bytes(clean, sizeof clean - 1, 12, &h), SL_OK);
  assert_int_equal(h.count, 1);
  sl__st_header_free(&h);
}

static void tensor_entry_keys(void **state) {
  expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12],\"extra\":1}}", 12, SL_ERR_FORMAT,
              "tensor 'a': unknown key 'extra'");
  expect_fail("{\"a\":{\"shape\":[3],\"data_offsets\":[0,12]}}", 12, SL_ERR_FORMAT, "tensor 'a': no 'dtype'");
  expect_fail("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,12]}}", 12, SL_ERR_FORMAT, "no 'shape'");
  expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[3]}}", 12, SL_ERR_FORMAT, "no 'data_offsets'");
  expect_fail("{\"a\":[1,2]}", 0, SL_ERR_FORMAT, "tensor 'a': entry is a JSON array");
  expect_fail("{\"a\":null}", 0, SL_ERR_FORMAT, "entry is a JSON null");
  /* a failure after earlier good tensors and metadata frees them (checked under ASan) */
  expect_fail("{\"__metadata__\":{\"k\":\"v\"}," T_A ",\"b\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[12,12]}}",
              12, SL_ERR_DTYPE, "'X'");
}

static void parse_buffer(void **state) {
  /* sl__st_parse on a memory image, as the fuzzer drives it */
  const char *hdr = "{" T_A "}";
  size_t n = strlen(hdr), len = 8 + n + 12;
  unsigned char *b = calloc(1, len);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)n >> (8 * i));
  memcpy(b + 8, hdr, n);
  sl__st_header h;
  assert_int_equal(sl__st_parse(b, len, len, &h, g_err, sizeof g_err), SL_OK);
  assert_int_equal(h.count, 1);
  /* the checkpoint-identity digest covers the length and the header bytes, not the data */
  assert_int_equal(h.header_digest, XXH3_64bits(b, 8 + n));
  sl__st_header_free(&h);
  b[8 + n] ^= 1;
  assert_int_equal(sl__st_parse(b, len, len, &h, g_err, sizeof g_err), SL_OK);
  assert_int_equal(h.header_digest, XXH3_64bits(b, 8 + n));
  sl__st_header_free(&h);
  /* only the header is needed in memory */
  assert_int_equal(sl__st_parse(b, 8 + n, len, &h, g_err, sizeof g_err), SL_OK);
  sl__st_header_free(&h);
  /* the file size decides the data section */
  assert_int_equal(sl__st_parse(b, 8 + n, len + 1, &h, g_err, sizeof g_err), SL_ERR_FORMAT);
  assert_non_null(strstr(g_err, "1 trailing bytes"));
  /* no error buffer is fine */
  assert_int_equal(sl__st_parse(b, 8 + n, len + 1, &h, NULL, 0), SL_ERR_FORMAT);
  free(b);
}

/* A safetensors image of N one-byte tensors (names longer than jansson's first string buffer,
 * so its buffers grow) and a metadata entry; *HDR_LEN: the header's length. */
static unsigned char *image_of(size_t n, size_t *len, size_t *hdr_len) {
  size_t cap = 128 + n * 96;
  char *hdr = malloc(cap);
  assert_non_null(hdr);
  size_t k = (size_t)snprintf(hdr, cap, "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"a value longer than sixteen bytes\"}");
  for (size_t i = 0; i < n; i++)
    k += (size_t)snprintf(hdr + k, cap - k, ",\"model.layers.%zu.weight\":{\"dtype\":\"U8\",\"shape\":[1],"
                          "\"data_offsets\":[%zu,%zu]}", i, i, i + 1);
  k += (size_t)snprintf(hdr + k, cap - k, "}");
  *hdr_len = k;
  *len = 8 + k + n;
  unsigned char *b = calloc(1, *len);
  assert_non_null(b);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)k >> (8 * i));
  memcpy(b + 8, hdr, k);
  free(hdr);
  return b;
}

/* Running out of memory at any point of jansson's parse of a valid header is reported as out of
 * memory, naming the header's size; never as "not valid JSON" (which, with jansson's empty
 * error, read "header is not valid JSON:  (line -1, column -1)", or a syntax error where a
 * string's copy could not be allocated). Every allocation is made to fail in turn, until the
 * parse needs none that fails. */
static void header_out_of_memory_every_allocation(void **state) {
  size_t len, hlen;
  unsigned char *b = image_of(6, &len, &hlen);
  char want[128];
  snprintf(want, sizeof want, "out of memory parsing its %zu-byte header", hlen);
  sl__st_header h;
  long budget = 0;
  sl__st_scan = false; /* the tree's allocations, which the scan would spare */
  for (;; budget++) {
    sl_test_json_alloc_budget(budget);
    sl_status s = sl__st_parse(b, len, len, &h, g_err, sizeof g_err);
    sl_test_json_alloc_budget(-1);
    if (s == SL_OK) break;
    if (s != SL_ERR_NOMEM || !strstr(g_err, want))
      fail_msg("allocation %ld of the parse failed: got %s '%s', want SL_ERR_NOMEM '%s...'", budget, sl_status_name(s),
               g_err, want);
    /* a failed parse leaves nothing behind */
    assert_int_equal(h.count, 0);
    assert_null(h.tensors);
    assert_null(h.meta_keys);
  }
  sl__st_scan = true;
  assert_true(budget > 10); /* the header's parse took that many allocations, each failed once */
  assert_int_equal(h.count, 6);
  sl__st_header_free(&h);
  free(b);
}

/* This process's private data (brk and private mappings: what RLIMIT_DATA counts), in bytes. */
static long vm_data_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmData: %ld kB", &kib) == 1) break;
  if (f) fclose(f);
  return kib < 0 ? -1 : kib * 1024;
}

/* The same under a real memory limit: a child whose data limit holds the header's bytes but not
 * jansson's tree of it (some 20 MiB), nor the scan's table (some 10 MiB: the scan gives up and
 * the tree says what failed). Not under ASan, whose shadow memory counts as data. */
static void header_out_of_memory_under_a_data_limit(void **state) {
#ifdef SL_TEST_ASAN
  skip();
#endif
  size_t len, hlen;
  unsigned char *b = image_of(100000, &len, &hlen);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    long data = vm_data_bytes();
    struct rlimit rl = {(rlim_t)data + (4 << 20), (rlim_t)data + (4 << 20)};
    if (data < 0 || setrlimit(RLIMIT_DATA, &rl) != 0) _exit(3);
    sl__st_header h;
    char err[1024] = "";
    sl_status s = sl__st_parse(b, len, len, &h, err, sizeof err);
    char msg[1100];
    int k = snprintf(msg, sizeof msg, "%s %s", sl_status_name(s), err);
    if (write(fds[1], msg, (size_t)k) != k) _exit(4);
    _exit(0);
  }
  close(fds[1]);
  char got[1100] = "";
  size_t used = 0;
  ssize_t r;
  while (used < sizeof got - 1 && (r = read(fds[0], got + used, sizeof got - 1 - used)) > 0) used += (size_t)r;
  close(fds[0]);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  char want[160];
  snprintf(want, sizeof want, "SL_ERR_NOMEM out of memory parsing its %zu-byte header", hlen);
  if (strncmp(got, want, strlen(want)) != 0)
    fail_msg("a %zu-byte header under a data limit: got '%s', want '%s...'", hlen, got, want);
  free(b);
}

/* ---- the scan and the tree agree ----------------------------------------------------------- */

/* Parses HDR (with DATA_LEN data bytes) with the scan and with jansson's tree alone: the same
 * status, message and table. Returns the status. */
static sl_status parse_both(const char *hdr, size_t data_len) {
  size_t n = strlen(hdr), len = 8 + n + data_len;
  unsigned char *b = calloc(1, len);
  assert_non_null(b);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)n >> (8 * i));
  memcpy(b + 8, hdr, n);
  sl__st_header a, t;
  char ea[1024], et[1024];
  sl_status sa = sl__st_parse(b, len, len, &a, ea, sizeof ea);
  sl__st_scan = false;
  sl_status st = sl__st_parse(b, len, len, &t, et, sizeof et);
  sl__st_scan = true;
  if (sa != st || (sa != SL_OK && strcmp(ea, et)))
    fail_msg("%s: scan %s '%s', tree %s '%s'", hdr, sl_status_name(sa), sa ? ea : "", sl_status_name(st), st ? et : "");
  if (sa == SL_OK) {
    assert_int_equal(a.count, t.count);
    assert_int_equal(a.data_offset, t.data_offset);
    assert_int_equal(a.data_size, t.data_size);
    assert_int_equal(a.header_digest, t.header_digest);
    for (size_t i = 0; i < a.count; i++) {
      assert_string_equal(a.tensors[i].name, t.tensors[i].name);
      assert_int_equal(a.tensors[i].dtype, t.tensors[i].dtype);
      assert_int_equal(a.tensors[i].ndim, t.tensors[i].ndim);
      assert_memory_equal(a.tensors[i].shape, t.tensors[i].shape, sizeof a.tensors[i].shape);
      assert_int_equal(a.tensors[i].begin, t.tensors[i].begin);
      assert_int_equal(a.tensors[i].end, t.tensors[i].end);
    }
    assert_int_equal(a.meta_count, t.meta_count);
    for (size_t i = 0; i < a.meta_count; i++) {
      assert_string_equal(a.meta_keys[i], t.meta_keys[i]);
      assert_string_equal(a.meta_values[i], t.meta_values[i]);
    }
    sl__st_header_free(&a);
    sl__st_header_free(&t);
  }
  free(b);
  return sa;
}

/* A file image of header HDR and DATA_LEN zero bytes of data, *LEN bytes (malloc'd). */
static unsigned char *header_image(const char *hdr, size_t data_len, size_t *len) {
  size_t n = strlen(hdr);
  *len = 8 + n + data_len;
  unsigned char *b = calloc(1, *len);
  assert_non_null(b);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)n >> (8 * i));
  memcpy(b + 8, hdr, n);
  return b;
}

/* The scan takes HDR itself: it parses with every jansson allocation failing. */
static void scan_takes(const char *hdr, size_t data_len) {
  assert_int_equal(parse_both(hdr, data_len), SL_OK);
  size_t len;
  unsigned char *b = header_image(hdr, data_len, &len);
  sl__st_header h;
  sl_test_json_alloc_budget(0);
  sl_status s = sl__st_parse(b, len, len, &h, g_err, sizeof g_err);
  sl_test_json_alloc_budget(-1);
  if (s != SL_OK) fail_msg("the scan did not take %s: %s", hdr, g_err);
  sl__st_header_free(&h);
  free(b);
}

#define E3(name) "\"" name "\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}"

/* The scan (the common header read without a JSON tree) takes what writers write, and gives
 * back to the tree, whose verdict and message stand, everything it does not read itself: each
 * case here is parsed both ways and must come out the same. */
static void scan_agrees_with_tree(void **state) {
  /* taken by the scan */
  scan_takes("{}", 0);
  scan_takes(" { } ", 0);
  scan_takes("{" E3("a") "}", 3);
  scan_takes("{\"__metadata__\":{},\"a\":{\"data_offsets\":[0,12],\"shape\":[3],\"dtype\":\"F32\"}}", 12);
  scan_takes("{\"__metadata__\":{\"format\":\"pt\",\"k\\n\\u00e9\\u4e2d\":\"v\\\"\\\\\\/\\b\\f\\r\\t\"}," E3("a") "}", 3);
  scan_takes("{\t\"x\\u0041\\u00ff\\u0800\" :\r\n{ \"dtype\" : \"BF16\" , \"shape\" : [ 2 , 0 ] , "
             "\"data_offsets\" : [ 0 , 0 ] } , " E3("a") " }   ", 3);
  scan_takes("{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
             "\"e\":{\"dtype\":\"I8\",\"shape\":[0,7],\"data_offsets\":[8,8]}}", 8);
  scan_takes("{\"__metadata__\":{\"a\":\"1\"},\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  scan_takes("{\"\\u005f_metadata__\":{\"a\":\"b\"}}", 0); /* an escaped __metadata__ is the metadata */
  /* the tree's to read (its verdict, accepted or refused, is the one given) */
  static const struct {
    const char *hdr;
    size_t data;
  } cases[] = {
      {"{\"a\\ud83d\\ude00\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3}, /* a pair */
      {"{\"a\\ud83d\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3},          /* a lone one */
      {"{\"a\\u0000\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3},
      {"{\"a\\x\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3},
      {"{\"a\\u00g0\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3},
      {"{\"a\tb\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3}, /* a raw control */
      {"{" E3("a") "," E3("a") "}", 3},
      {"{\"__metadata__\":{},\"__metadata__\":{}}", 0},
      {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0},
      {"{\"__metadata__\":{\"k\":1}}", 0},
      {"{\"__metadata__\":[]}", 0},
      {"{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3],\"x\":1}}", 3},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[3]}}", 3},
      {"{\"a\":{}}", 0},
      {"{\"a\":{\"dtype\":\"U9\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3},
      {"{\"a\":{\"dtype\":\"a very long dtype name\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3},
      {"{\"a\":{\"dtype\":3,\"shape\":[3],\"data_offsets\":[0,3]}}", 3},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[03],\"data_offsets\":[0,3]}}", 3},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[3.0],\"data_offsets\":[0,3]}}", 3},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[3e0],\"data_offsets\":[0,3]}}", 3},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-0,3],\"data_offsets\":[0,0]}}", 0},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-3],\"data_offsets\":[0,3]}}", 3},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[3,],\"data_offsets\":[0,3]}}", 3},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[3 1],\"data_offsets\":[0,3]}}", 3},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807,0],\"data_offsets\":[0,0]}}", 0},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775808,0],\"data_offsets\":[0,0]}}", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,0],\"data_offsets\":[0,0]}}", 0},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,0]}}", 0},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3,3]}}", 3},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[3,0]}}", 3},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,4]}}", 4},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[1,4]}}", 4},   /* a hole: the layout */
      {"{" E3("a") "}", 4},                                                            /* trailing data */
      {"{" E3("a") "} x", 3},
      {"{" E3("a") ",}", 3},
      {"{" E3("a") "", 3},
      {"[]", 0},
      {"{\"a\":null}", 0},
      {"{\"a\" {}}", 0},
      {"{\"a\\", 0},                         /* the header ends in a backslash inside a name */
      {"{\"__metadata__\":{\"k\":\"v\\", 0}, /* or inside a metadata value */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) parse_both(cases[i].hdr, cases[i].data);
  /* every prefix of a header the scan takes is refused alike */
  const char *full = "{\"__metadata__\":{\"k\\u00e9\":\"v\"},\"b\\n\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]},"
                     E3("a") "}";
  scan_takes(full, 5);
  char cut[256];
  for (size_t k = 1; k < strlen(full); k++) {
    snprintf(cut, sizeof cut, "%.*s", (int)k, full);
    assert_int_not_equal(parse_both(cut, 5), SL_OK);
  }
  /* and a large one, as writers lay it out */
  size_t len, hlen;
  unsigned char *b = image_of(2000, &len, &hlen);
  char *hdr = strndup((const char *)b + 8, hlen);
  scan_takes(hdr, len - 8 - hlen);
  free(hdr);
  free(b);
}

/* A header of M metadata entries "0".."M-1" and no tensor (malloc'd, NUL-terminated). */
static char *metadata_header(int m) {
  char *h = malloc((size_t)m * 16 + 64);
  assert_non_null(h);
  size_t o = (size_t)sprintf(h, "{\"__metadata__\":{");
  for (int i = 0; i < m; i++) o += (size_t)sprintf(h + o, "%s\"%d\":\"\"", i ? "," : "", i);
  sprintf(h + o, "}}");
  return h;
}

/* Whether the scan alone reads HDR: with every jansson allocation failing, only the scan can
 * take it. */
static bool scan_reads(const char *hdr) {
  size_t len;
  unsigned char *b = header_image(hdr, 0, &len);
  sl__st_header h;
  sl_test_json_alloc_budget(0);
  sl_status s = sl__st_parse(b, len, len, &h, g_err, sizeof g_err);
  sl_test_json_alloc_budget(-1);
  if (s == SL_OK) sl__st_header_free(&h);
  else assert_int_equal(s, SL_ERR_NOMEM); /* the tree's allocation failed: the scan declined */
  free(b);
  return s == SL_OK;
}

/* Many metadata keys are read in linear time: the scan, whose duplicate check is quadratic,
 * reads at most 64 and hands a header with more to jansson's tree (which hashes its keys). */
static void many_metadata_keys(void **state) {
  (void)state;
  char *h = metadata_header(64);
  assert_true(scan_reads(h));
  assert_int_equal(parse_both(h, 0), SL_OK);
  free(h);
  h = metadata_header(65);
  assert_false(scan_reads(h));
  assert_int_equal(parse_both(h, 0), SL_OK);
  free(h);
  h = metadata_header(100000); /* the scan would compare 5e9 pairs of keys */
  assert_false(scan_reads(h));
  sl__st_header a;
  size_t len;
  unsigned char *b = header_image(h, 0, &len);
  assert_int_equal(sl__st_parse(b, len, len, &a, g_err, sizeof g_err), SL_OK);
  assert_int_equal(a.meta_count, 100000);
  sl__st_header_free(&a);
  free(b);
  free(h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(valid_minimal),   cmocka_unit_test(empty_header),
      cmocka_unit_test(zero_dim),        cmocka_unit_test(empty_tensors_and_order),
      cmocka_unit_test(padding),         cmocka_unit_test(header_length_limits),
      cmocka_unit_test(short_file),      cmocka_unit_test(not_json),
      cmocka_unit_test(invalid_utf8),    cmocka_unit_test(duplicates),
      cmocka_unit_test(metadata),        cmocka_unit_test(dtypes),
      cmocka_unit_test(unknown_dtype),   cmocka_unit_test(bad_shapes),
      cmocka_unit_test(bad_offsets),     cmocka_unit_test(size_mismatch),
      cmocka_unit_test(layout),          cmocka_unit_test(overflow),
      cmocka_unit_test(tensor_entry_keys), cmocka_unit_test(parse_buffer),
      cmocka_unit_test(negative_zero),   cmocka_unit_test(nul_bytes),
      cmocka_unit_test(header_out_of_memory_every_allocation),
      cmocka_unit_test(header_out_of_memory_under_a_data_limit),
      cmocka_unit_test(scan_agrees_with_tree), cmocka_unit_test(many_metadata_keys),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
