/* The safetensors header: 8-byte little-endian length N, N bytes of UTF-8 JSON, then the data
 * section. Validation is at least as strict as the reference Rust crate (safetensors
 * SafeTensors::read_metadata + Metadata::validate) and stricter where the crate is lax:
 * duplicate keys, unknown keys in a tensor entry and a data section that is not consumed
 * exactly are all rejected, because a loader that guesses moves the wrong bytes. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "internal.h"

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* Returns the offset of the first byte that is not part of a well-formed UTF-8 sequence, or
 * LEN when all is well. jansson checks UTF-8 too, but its message does not say where. */
static size_t utf8_invalid_at(const uint8_t *s, size_t len) {
  size_t i = 0;
  while (i < len) {
    /* headers are ASCII but for the odd name or metadata value: eight bytes at a time while
     * none has its high bit set (a fifth of a 50,000-tensor parse went here byte by byte) */
    while (len - i >= 8) {
      uint64_t w;
      memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= len) break;
    uint8_t c = s[i];
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07;
    } else {
      return i;
    }
    if (len - i <= n) return i;
    for (size_t k = 1; k <= n; k++) {
      if ((s[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    /* overlong forms, surrogates and values past U+10FFFF are not UTF-8 */
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
      return i;
    i += n + 1;
  }
  return len;
}

static const char *json_kind(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "object";
  case JSON_ARRAY: return "array";
  case JSON_STRING: return "string";
  case JSON_INTEGER: return "integer";
  case JSON_REAL: return "number";
  case JSON_TRUE:
  case JSON_FALSE: return "boolean";
  case JSON_NULL: return "null";
  }
  return "value";
}

/* "[2,3]" into buf; truncated with "..." if it does not fit (messages only). */
static const char *fmt_shape(char *buf, size_t len, const int64_t *shape, int ndim) {
  size_t o = 0;
  o += (size_t)snprintf(buf + o, len - o, "[");
  for (int d = 0; d < ndim && o < len; d++)
    o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, d ? "," : "", shape[d]);
  if (o < len) snprintf(buf + o, len - o, "]");
  return buf;
}

/* A JSON value as text for a message: short, never the whole header. */
static const char *fmt_json(char *buf, size_t len, const json_t *v) {
  char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  if (!s) {
    snprintf(buf, len, "(%s)", json_kind(v));
    return buf;
  }
  if (strlen(s) >= len && len > 4)
    snprintf(buf, len, "%.*s...", (int)(len - 4), s);
  else
    snprintf(buf, len, "%s", s);
  free(s);
  return buf;
}

static sl_status parse_metadata(const json_t *meta, sl__st_header *out, char *err, size_t errlen) {
  char vbuf[64];
  if (!json_is_object(meta))
    return sl__errbuf(err, errlen, SL_ERR_FORMAT,
                  "__metadata__ is a JSON %s; it must be an object of string values", json_kind(meta));
  size_t n = json_object_size(meta);
  if (n == 0) return SL_OK;
  if (!sl__alloc_pairs(n, &out->meta_keys, &out->meta_values))
    return sl__errbuf(err, errlen, SL_ERR_NOMEM, "out of memory");
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)meta, key, val) {
    if (!json_is_string(val))
      return sl__errbuf(err, errlen, SL_ERR_FORMAT,
                    "__metadata__ value of '%s' is %s (a JSON %s); metadata values must be strings", key,
                    fmt_json(vbuf, sizeof vbuf, val), json_kind(val));
    size_t i = out->meta_count;
    out->meta_keys[i] = strdup(key);
    out->meta_values[i] = strdup(json_string_value(val));
    out->meta_count++;
    if (!out->meta_keys[i] || !out->meta_values[i]) return sl__errbuf(err, errlen, SL_ERR_NOMEM, "out of memory");
  }
  return SL_OK;
}

/* One non-negative integer of a JSON array (shape entry or data offset). */
static bool get_uint(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
  *out = (uint64_t)json_integer_value(v);
  return true;
}

static sl_status parse_tensor(const char *name, const json_t *obj, sl__st_tensor *t, char *err,
                              size_t errlen) {
  char vbuf[64], sbuf[128];
  if (!json_is_object(obj))
    return sl__errbuf(err, errlen, SL_ERR_FORMAT,
                  "tensor '%s': entry is a JSON %s; it must be an object with dtype, shape and data_offsets",
                  name, json_kind(obj));
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)obj, key, val) {
    if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
      return sl__errbuf(err, errlen, SL_ERR_FORMAT,
                    "tensor '%s': unknown key '%s' (a tensor entry holds exactly dtype, shape and data_offsets)",
                    name, key);
  }
  const json_t *dtype = json_object_get(obj, "dtype");
  const json_t *shape = json_object_get(obj, "shape");
  const json_t *offs = json_object_get(obj, "data_offsets");
  const char *missing = !dtype ? "dtype" : !shape ? "shape" : !offs ? "data_offsets" : NULL;
  if (missing) return sl__errbuf(err, errlen, SL_ERR_FORMAT, "tensor '%s': no '%s'", name, missing);

  if (!json_is_string(dtype))
    return sl__errbuf(err, errlen, SL_ERR_FORMAT, "tensor '%s': dtype is a JSON %s, not a string", name,
                  json_kind(dtype));
  t->dtype = sl__dtype_from_st(json_string_value(dtype));
  if (t->dtype == SL_DTYPE_INVALID)
    return sl__errbuf(err, errlen, SL_ERR_DTYPE,
                  "tensor '%s': dtype '%s' is not supported (supported: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 "
                  "I64 I32 I16 I8 U8 BOOL U16 U32 U64)",
                  name, json_string_value(dtype));

  if (!json_is_array(shape))
    return sl__errbuf(err, errlen, SL_ERR_FORMAT, "tensor '%s': shape is a JSON %s, not an array", name,
                  json_kind(shape));
  size_t nd = json_array_size(shape);
  if (nd > SL_MAX_DIMS)
    return sl__errbuf(err, errlen, SL_ERR_UNSUPPORTED, "tensor '%s': shape has %zu dims; at most %d are supported",
                  name, nd, SL_MAX_DIMS);
  t->ndim = (int)nd;
  /* The reference multiplies left to right with checked_mul, so a product that overflows
   * before a later 0 is still an error; do the same. */
  uint64_t elems = 1;
  bool overflow = false;
  for (size_t d = 0; d < nd; d++) {
    const json_t *e = json_array_get(shape, d);
    uint64_t v;
    if (!get_uint(e, &v))
      return sl__errbuf(err, errlen, SL_ERR_FORMAT, "tensor '%s': shape entry %zu is %s, not a non-negative integer",
                    name, d, fmt_json(vbuf, sizeof vbuf, e));
    t->shape[d] = (int64_t)v;
    if (!overflow && !sl__mul_u64(elems, v, &elems)) overflow = true;
  }
  uint64_t nbytes = 0;
  if (overflow || !sl__mul_u64(elems, sl_dtype_size(t->dtype), &nbytes))
    return sl__errbuf(err, errlen, SL_ERR_FORMAT, "tensor '%s': shape %s x %s overflows 64-bit byte counts", name,
                  fmt_shape(sbuf, sizeof sbuf, t->shape, t->ndim), sl_dtype_name(t->dtype));

  if (!json_is_array(offs) || json_array_size(offs) != 2)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT, "tensor '%s': data_offsets is %s; it must be [begin,end]", name,
                  fmt_json(vbuf, sizeof vbuf, offs));
  if (!get_uint(json_array_get(offs, 0), &t->begin) || !get_uint(json_array_get(offs, 1), &t->end))
    return sl__errbuf(err, errlen, SL_ERR_FORMAT,
                  "tensor '%s': data_offsets %s must be two non-negative integers", name,
                  fmt_json(vbuf, sizeof vbuf, offs));
  if (t->begin > t->end)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT, "tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "] end before they begin",
                  name, t->begin, t->end);
  if (t->end - t->begin != nbytes)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT,
                  "tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "] hold %" PRIu64 " bytes but shape %s x %s needs %" PRIu64,
                  name, t->begin, t->end, t->end - t->begin, fmt_shape(sbuf, sizeof sbuf, t->shape, t->ndim),
                  sl_dtype_name(t->dtype), nbytes);
  return SL_OK;
}

/* File order; zero-length tensors share a begin with their neighbour, so ties go to the
 * shorter range and then to the name, which makes the order independent of the JSON's. */
static int tensor_cmp(const void *a, const void *b) {
  const sl__st_tensor *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Already in tensor_cmp's order: writers lay the header out in file order (the reference
 * writes its entries in the order of their offsets), and a sorted table needs no sort. */
static bool in_file_order(const sl__st_header *h) {
  for (size_t i = 1; i < h->count; i++)
    if (tensor_cmp(&h->tensors[i - 1], &h->tensors[i]) >= 0) return false;
  return true;
}

static sl_status check_layout(const sl__st_header *h, char *err, size_t errlen) {
  uint64_t pos = 0;
  const char *prev = NULL;
  for (size_t i = 0; i < h->count; i++) {
    const sl__st_tensor *t = &h->tensors[i];
    if (t->begin > pos)
      return sl__errbuf(err, errlen, SL_ERR_FORMAT,
                    "data section: hole between byte %" PRIu64 " and %" PRIu64 " (before tensor '%s'); tensors "
                    "must cover the data section contiguously from byte 0",
                    pos, t->begin, t->name);
    if (t->begin < pos)
      return sl__errbuf(err, errlen, SL_ERR_FORMAT,
                    "tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "] overlap tensor '%s', which ends at byte %" PRIu64,
                    t->name, t->begin, t->end, prev, pos);
    pos = t->end;
    prev = t->name;
  }
  if (pos > h->data_size)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT,
                  "tensor '%s' ends at byte %" PRIu64 " of the data section, but the file holds only %" PRIu64
                  " data bytes (truncated file?)",
                  prev, pos, h->data_size);
  if (pos < h->data_size)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT,
                  "data section has %" PRIu64 " trailing bytes after the last tensor (it holds %" PRIu64
                  ", the tensors cover %" PRIu64 ")",
                  h->data_size - pos, h->data_size, pos);
  return SL_OK;
}

/* JSON's grammar allows the integer -0 and jansson reads it as 0, but the reference
 * (serde_json) reads -0 as the float -0.0 and refuses it where a shape entry or an offset is
 * due. Every number of an acceptable header is one of those (a number anywhere else is
 * refused on its own), so an integer -0 anywhere outside a string is refused. Returns its
 * byte offset in TEXT, or LEN. TEXT is known to be valid JSON: after "-0" comes '.', 'e',
 * 'E', a delimiter or whitespace, and a backslash in a string always starts an escape. */
static size_t negative_zero_at(const char *text, size_t len) {
  bool in_string = false;
  for (size_t i = 0; i < len; i++) {
    char c = text[i];
    if (in_string) {
      if (c == '\\')
        i++;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '-' && i + 1 < len && text[i + 1] == '0' &&
               (i + 2 == len || (text[i + 2] != '.' && text[i + 2] != 'e' && text[i + 2] != 'E'))) {
      return i;
    }
  }
  return len;
}

/* Running out of memory on a header: said as such (never as a malformed file), with the
 * header's size, which is what it costs. */
static sl_status header_nomem(char *err, size_t errlen, const char *doing, size_t n) {
  return sl__errbuf_nomem(err, errlen, doing, n, "header");
}

/* ---- the scan: the common header without a JSON tree ---------------------------------------
 * jansson builds a tree of the whole header (an object, its table and pairs, strings, arrays
 * and integers for every tensor: a dozen allocations and some 25,000 instructions a tensor),
 * which a checkpoint of tens of thousands of tensors pays for on every open. The scan reads
 * the headers writers produce straight into the tensor table: a top-level object of tensor
 * entries {dtype, shape, data_offsets} in any key order and an optional __metadata__ object of
 * strings, with JSON's whitespace, plain non-negative integers and strings whose escapes are
 * the short ones or \uXXXX of a code point of the basic plane other than U+0000 and the
 * surrogates. It accepts only a header that parse_json's tree would accept with the same
 * table: anything else it does not take (another JSON value, a sign, a fraction or exponent,
 * an integer past int64, a duplicate key, an unknown key, a dtype, shape or offsets the
 * validation refuses, running out of memory), and the tree then reads the header and words
 * its verdict, so that every message is the tree's. fuzz/fuzz_header.c checks that both agree
 * on every input the scan takes. */

typedef struct scan {
  const char *p, *end;
  char dtype[16]; /* the last tensor's dtype string and what it names: the next one is usually alike */
  sl_dtype dtype_is;
} scan;

static void scan_ws(scan *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static bool scan_char(scan *s, char c) {
  scan_ws(s);
  if (s->p >= s->end || *s->p != c) return false;
  s->p++;
  return true;
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* A string at the cursor: *V, *LEN point into the text when it has no escape, else into *OWNED
 * (malloc'd, NUL-terminated, which the caller frees). The text is valid UTF-8 already. */
static bool scan_string(scan *s, const char **v, size_t *len, char **owned) {
  *owned = NULL;
  if (!scan_char(s, '"')) return false;
  const char *start = s->p;
  while (s->p < s->end && *s->p != '"' && *s->p != '\\' && (unsigned char)*s->p >= 0x20) s->p++;
  if (s->p >= s->end || (unsigned char)*s->p < 0x20) return false;
  if (*s->p == '"') {
    *v = start;
    *len = (size_t)(s->p - start);
    s->p++;
    return true;
  }
  /* escapes: the decoded text is never longer than the escaped one */
  const char *q = start;
  while (q < s->end && *q != '"') q += *q == '\\' && s->end - q >= 2 ? 2 : 1; /* never past the end */
  if (q >= s->end) return false;
  char *o = malloc((size_t)(q - start) + 1);
  if (!o) return false;
  size_t k = (size_t)(s->p - start);
  memcpy(o, start, k);
  while (s->p < s->end && *s->p != '"') {
    unsigned char c = (unsigned char)*s->p;
    if (c < 0x20) goto bad;
    if (c != '\\') {
      o[k++] = (char)c;
      s->p++;
      continue;
    }
    if (s->end - s->p < 2) goto bad;
    char e = s->p[1];
    s->p += 2;
    switch (e) {
    case '"': o[k++] = '"'; break;
    case '\\': o[k++] = '\\'; break;
    case '/': o[k++] = '/'; break;
    case 'b': o[k++] = '\b'; break;
    case 'f': o[k++] = '\f'; break;
    case 'n': o[k++] = '\n'; break;
    case 'r': o[k++] = '\r'; break;
    case 't': o[k++] = '\t'; break;
    case 'u': {
      if (s->end - s->p < 4) goto bad;
      unsigned cp = 0;
      for (int i = 0; i < 4; i++) {
        int h = hex_value(s->p[i]);
        if (h < 0) goto bad;
        cp = cp << 4 | (unsigned)h;
      }
      s->p += 4;
      if (cp == 0 || (cp >= 0xd800 && cp <= 0xdfff)) goto bad; /* the tree's to judge */
      if (cp < 0x80) {
        o[k++] = (char)cp;
      } else if (cp < 0x800) {
        o[k++] = (char)(0xc0 | cp >> 6);
        o[k++] = (char)(0x80 | (cp & 0x3f));
      } else {
        o[k++] = (char)(0xe0 | cp >> 12);
        o[k++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[k++] = (char)(0x80 | (cp & 0x3f));
      }
      break;
    }
    default: goto bad;
    }
  }
  if (s->p >= s->end) goto bad;
  s->p++;
  o[k] = 0;
  *v = o;
  *len = k;
  *owned = o;
  return true;
bad:
  free(o);
  return false;
}

static bool is_key(const char *v, size_t len, const char *key) { return len == strlen(key) && !memcmp(v, key, len); }

static char *dup_view(const char *v, size_t len, char **owned) {
  if (*owned) { /* already a NUL-terminated copy of its own */
    char *o = *owned;
    *owned = NULL;
    return o;
  }
  return strndup(v, len);
}

/* A non-negative integer as JSON writes it (no sign, no leading zero, no fraction or exponent)
 * within int64, as jansson reads one. */
static bool scan_uint(scan *s, uint64_t *out) {
  scan_ws(s);
  const char *d = s->p;
  uint64_t v = 0;
  while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
    unsigned digit = (unsigned)(*s->p - '0');
    if (v > (uint64_t)(INT64_MAX - digit) / 10) return false;
    v = v * 10 + digit;
    s->p++;
  }
  if (s->p == d || (*d == '0' && s->p - d > 1)) return false;
  if (s->p < s->end && (*s->p == '.' || *s->p == 'e' || *s->p == 'E')) return false;
  *out = v;
  return true;
}

/* [u, u, ...] with at most MAX entries. */
static bool scan_uints(scan *s, uint64_t *vals, int max, int *n) {
  *n = 0;
  if (!scan_char(s, '[')) return false;
  if (scan_char(s, ']')) return true;
  do {
    if (*n == max || !scan_uint(s, &vals[*n])) return false;
    (*n)++;
  } while (scan_char(s, ','));
  return scan_char(s, ']');
}

/* One tensor entry, validated as parse_tensor validates it (the tree words any refusal). */
static bool scan_tensor(scan *s, sl__st_tensor *t) {
  if (!scan_char(s, '{')) return false;
  char dtype[16] = "";
  uint64_t shape[SL_MAX_DIMS], offs[2];
  int nd = 0, noffs = 0;
  unsigned seen = 0;
  do {
    const char *k;
    size_t klen;
    char *owned;
    if (!scan_string(s, &k, &klen, &owned)) return false;
    unsigned bit = is_key(k, klen, "dtype") ? 1 : is_key(k, klen, "shape") ? 2 : is_key(k, klen, "data_offsets") ? 4 : 0;
    free(owned);
    if (!bit || (seen & bit) || !scan_char(s, ':')) return false;
    seen |= bit;
    bool ok;
    if (bit == 1) {
      const char *v;
      size_t vlen;
      ok = scan_string(s, &v, &vlen, &owned) && vlen < sizeof dtype;
      if (ok) memcpy(dtype, v, vlen), dtype[vlen] = 0;
      free(owned);
    } else if (bit == 2) {
      ok = scan_uints(s, shape, SL_MAX_DIMS, &nd);
    } else {
      ok = scan_uints(s, offs, 2, &noffs) && noffs == 2;
    }
    if (!ok) return false;
  } while (scan_char(s, ','));
  if (!scan_char(s, '}') || seen != 7) return false;
  if (strcmp(dtype, s->dtype) != 0) {
    memcpy(s->dtype, dtype, sizeof s->dtype);
    s->dtype_is = sl__dtype_from_st(dtype);
  }
  if ((t->dtype = s->dtype_is) == SL_DTYPE_INVALID) return false;
  t->ndim = nd;
  uint64_t nbytes = sl_dtype_size(t->dtype);
  for (int d = 0; d < nd; d++) {
    t->shape[d] = (int64_t)shape[d];
    if (!sl__mul_u64(nbytes, shape[d], &nbytes)) return false; /* the tree tells overflow from order */
  }
  t->begin = offs[0];
  t->end = offs[1];
  return t->begin <= t->end && t->end - t->begin == nbytes;
}

/* The most metadata entries the scan reads itself: writers put a handful there, and its check
 * for a key given twice compares each key with every earlier one, which past a few dozen would
 * be quadratic in a crafted header (jansson's tree hashes its keys, and reads more alone). */
enum { SCAN_META_MAX = 64 };

/* __metadata__: an object of strings, no key twice, at most SCAN_META_MAX of them. */
static bool scan_metadata(scan *s, sl__st_header *out) {
  if (!scan_char(s, '{')) return false;
  if (scan_char(s, '}')) return true;
  size_t cap = 0;
  do {
    const char *k, *v;
    size_t klen, vlen;
    char *ko, *vo;
    if (out->meta_count == SCAN_META_MAX || !scan_string(s, &k, &klen, &ko)) return false;
    bool ok = scan_char(s, ':') && scan_string(s, &v, &vlen, &vo);
    if (!ok) {
      free(ko);
      return false;
    }
    if (out->meta_count == cap) {
      cap = cap ? 2 * cap : 8;
      char **nk = realloc(out->meta_keys, cap * sizeof *nk);
      if (nk) out->meta_keys = nk;
      char **nv = nk ? realloc(out->meta_values, cap * sizeof *nv) : NULL;
      if (nv) out->meta_values = nv;
      if (!nk || !nv) ok = false;
    }
    size_t i = out->meta_count;
    char *key = ok ? dup_view(k, klen, &ko) : NULL, *val = key ? dup_view(v, vlen, &vo) : NULL;
    free(ko);
    free(vo);
    if (!val) {
      free(key);
      return false;
    }
    out->meta_keys[i] = key;
    out->meta_values[i] = val;
    out->meta_count++;
    for (size_t j = 0; j < i; j++)
      if (!strcmp(out->meta_keys[j], key)) return false; /* at most SCAN_META_MAX */
  } while (scan_char(s, ','));
  return scan_char(s, '}');
}

/* No tensor name twice (the tree refuses a duplicate key): a table of name hashes, each slot
 * with its hash, so that only names of one hash are compared. */
static bool names_distinct(const sl__st_header *h) {
  size_t cap = 16;
  while (cap < 2 * h->count) cap <<= 1;
  struct name_slot {
    uint64_t hash;
    size_t index; /* + 1; 0: empty */
  } *slot = calloc(cap, sizeof *slot);
  if (!slot) return false;
  bool ok = true;
  for (size_t i = 0; i < h->count && ok; i++) {
    uint64_t hash = XXH3_64bits(h->tensors[i].name, strlen(h->tensors[i].name));
    size_t k = (size_t)hash & (cap - 1);
    while (slot[k].index && ok) {
      ok = slot[k].hash != hash || strcmp(h->tensors[slot[k].index - 1].name, h->tensors[i].name) != 0;
      k = (k + 1) & (cap - 1);
    }
    slot[k] = (struct name_slot){hash, i + 1};
  }
  free(slot);
  return ok;
}

/* The scan of TEXT into OUT (tensors in the header's order, metadata): true when it takes the
 * header, else false with OUT empty, for the tree to read. */
static bool scan_header(const char *text, size_t n, sl__st_header *out) {
  scan s = {text, text + n, "", SL_DTYPE_INVALID};
  size_t cap = 0;
  bool meta = false, ok = scan_char(&s, '{');
  if (ok && !scan_char(&s, '}')) {
    do {
      const char *k;
      size_t klen;
      char *owned;
      if (!(ok = scan_string(&s, &k, &klen, &owned) && scan_char(&s, ':'))) {
        free(owned);
        break;
      }
      if (is_key(k, klen, "__metadata__")) {
        free(owned);
        ok = !meta && scan_metadata(&s, out);
        meta = true;
        continue;
      }
      if (out->count == cap) {
        cap = cap ? 2 * cap : 64;
        sl__st_tensor *nt = realloc(out->tensors, cap * sizeof *nt);
        if (!nt) {
          free(owned);
          ok = false;
          break;
        }
        out->tensors = nt;
      }
      sl__st_tensor *t = &out->tensors[out->count];
      memset(t, 0, sizeof *t);
      if (!(t->name = dup_view(k, klen, &owned))) {
        free(owned);
        ok = false;
        break;
      }
      out->count++;
      ok = scan_tensor(&s, t);
    } while (ok && scan_char(&s, ','));
    ok = ok && scan_char(&s, '}');
  }
  scan_ws(&s);
  if (ok && s.p == s.end && names_distinct(out)) return true;
  uint64_t off = out->data_offset, size = out->data_size; /* the caller's */
  sl__st_header_free(out);
  out->data_offset = off;
  out->data_size = size;
  return false;
}

static sl_status parse_json(const char *text, size_t n, bool try_scan, sl__st_header *out, char *err,
                            size_t errlen) {
  if (try_scan && scan_header(text, n, out)) {
    if (!in_file_order(out)) qsort(out->tensors, out->count, sizeof *out->tensors, tensor_cmp);
    return check_layout(out, err, errlen);
  }
  json_error_t jerr;
  bool nomem;
  json_t *root = sl__json_loadb(text, n, &jerr, &nomem);
  if (nomem) return header_nomem(err, errlen, "parsing", n);
  if (!root)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT, "header is not valid JSON: %s (line %d, column %d)", jerr.text,
                  jerr.line, jerr.column);
  sl_status s = SL_OK;
  if (!json_is_object(root)) {
    s = sl__errbuf(err, errlen, SL_ERR_FORMAT, "header is a JSON %s; it must be an object", json_kind(root));
    goto out_root;
  }
  size_t negzero = negative_zero_at(text, n);
  if (negzero < n) {
    s = sl__errbuf(err, errlen, SL_ERR_FORMAT,
               "header holds the number -0 (byte %zu of the header); shape entries and data_offsets must be "
               "non-negative integers written without a sign",
               negzero);
    goto out_root;
  }
  const json_t *meta = json_object_get(root, "__metadata__");
  if (meta && (s = parse_metadata(meta, out, err, errlen)) != SL_OK) {
    if (s == SL_ERR_NOMEM) s = header_nomem(err, errlen, "keeping the metadata of", n);
    goto out_root;
  }

  size_t n_tensors = json_object_size(root) - (meta ? 1 : 0);
  if (n_tensors) {
    out->tensors = calloc(n_tensors, sizeof *out->tensors);
    if (!out->tensors) {
      s = header_nomem(err, errlen, "for the tensor table of", n);
      goto out_root;
    }
  }
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (!strcmp(key, "__metadata__")) continue;
    sl__st_tensor *t = &out->tensors[out->count];
    if (!(t->name = strdup(key))) {
      s = header_nomem(err, errlen, "for the tensor names of", n);
      goto out_root;
    }
    out->count++;
    if ((s = parse_tensor(key, val, t, err, errlen)) != SL_OK) goto out_root;
  }
  if (!in_file_order(out)) qsort(out->tensors, out->count, sizeof *out->tensors, tensor_cmp);
  s = check_layout(out, err, errlen);
out_root:
  json_decref(root);
  return s;
}

bool sl__st_scan = true;

static sl_status parse_image(const uint8_t *buf, size_t len, uint64_t file_size, bool try_scan, sl__st_header *out,
                             char *err, size_t errlen);

sl_status sl__st_parse(const uint8_t *buf, size_t len, uint64_t file_size, sl__st_header *out, char *err,
                       size_t errlen) {
  return parse_image(buf, len, file_size, sl__st_scan, out, err, errlen);
}

static sl_status parse_image(const uint8_t *buf, size_t len, uint64_t file_size, bool try_scan, sl__st_header *out,
                             char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (err && errlen) err[0] = 0;
  if (file_size < 8)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT,
                  "file is %" PRIu64 " bytes, shorter than the 8-byte header length that starts a safetensors file",
                  file_size);
  if (len < 8 || len > file_size)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT, "header truncated: %zu bytes given of a %" PRIu64 "-byte file", len,
                  file_size);
  uint64_t n = le64(buf);
  if (n > SL__ST_MAX_HEADER)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT, "header length %" PRIu64 " exceeds the %llu-byte limit (not a safetensors file?)",
                  n, SL__ST_MAX_HEADER);
  if (n > file_size - 8)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT,
                  "header length %" PRIu64 " runs past the end of the %" PRIu64 "-byte file (truncated file?)", n,
                  file_size);
  if (len - 8 < n)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT, "header truncated: %zu of its %" PRIu64 " bytes given", len - 8, n);
  if (n == 0) return sl__errbuf(err, errlen, SL_ERR_FORMAT, "header is empty (length 0); it must be a JSON object");
  size_t bad = utf8_invalid_at(buf + 8, (size_t)n);
  if (bad < n)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT, "header is not valid UTF-8 (byte %zu of the header, 0x%02x)", bad,
                  buf[8 + bad]);

  /* JSON text holds no NUL byte (in a string it would have to be escaped), and jansson's reader
   * skips one that follows a number ("[3\0]" reads as [3]), which the reference refuses. */
  const uint8_t *nul = memchr(buf + 8, 0, (size_t)n);
  if (nul)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT,
                  "header is not valid JSON: NUL byte at byte %zu of the header (corrupt file?)",
                  (size_t)(nul - (buf + 8)));

  out->data_offset = 8 + n;
  out->data_size = file_size - out->data_offset;
  sl_status s = parse_json((const char *)buf + 8, (size_t)n, try_scan, out, err, errlen);
  if (s != SL_OK) {
    sl__st_header_free(out);
    return s;
  }
  out->header_digest = XXH3_64bits(buf, (size_t)(8 + n));
  return SL_OK;
}


/* Reads the 8 + N header bytes of FD into *BUF (malloc'd; *LEN bytes) and its size into *SIZE.
 * A file too short for a length, or whose length is past the limit or the file, is not read
 * further: *BUF then holds only the bytes there are (at most 8) and the caller's sl__st_parse
 * words what is wrong. */
static sl_status read_header_bytes(int fd, uint8_t **buf, size_t *len, uint64_t *size, char *err, size_t errlen) {
  *buf = NULL;
  *len = 0;
  struct stat st;
  if (fstat(fd, &st) != 0) return sl__errbuf(err, errlen, SL_ERR_IO, "cannot stat: %s", strerror(errno));
  *size = (uint64_t)st.st_size;
  uint8_t head[8];
  size_t first = *size < 8 ? (size_t)*size : 8;
  ssize_t r = sl__pread_full(fd, head, first, 0);
  if (r < 0) return sl__errbuf(err, errlen, SL_ERR_IO, "cannot read: %s", strerror(errno));
  if ((size_t)r < first) *size = (uint64_t)r; /* shrank under us */
  /* Check N against the limit and the file before allocating N bytes: a hostile length must
   * not cost memory. sl__st_parse repeats the checks and words the message. */
  uint64_t n = *size < 8 ? 0 : le64(head);
  size_t total = *size < 8 ? (size_t)*size : n > SL__ST_MAX_HEADER || n > *size - 8 ? 8 : (size_t)(8 + n);
  if (!(*buf = malloc(total ? total : 1)))
    return sl__errbuf(err, errlen, SL_ERR_NOMEM, "out of memory for a %zu-byte header", total);
  memcpy(*buf, head, total < 8 ? total : 8);
  *len = total;
  if (total <= 8) return SL_OK;
  r = sl__pread_full(fd, *buf + 8, (size_t)n, 8);
  sl_status s = SL_OK;
  if (r < 0)
    s = sl__errbuf(err, errlen, SL_ERR_IO, "cannot read the header: %s", strerror(errno));
  else if ((size_t)r < n)
    s = sl__errbuf(err, errlen, SL_ERR_FORMAT, "file truncated while reading the header (%zd of %" PRIu64 " bytes)", r, n);
  if (s != SL_OK) {
    free(*buf);
    *buf = NULL;
  }
  return s;
}

sl_status sl__st_read(int fd, sl__st_header *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  uint8_t *buf;
  size_t len;
  uint64_t size = 0;
  sl_status s = read_header_bytes(fd, &buf, &len, &size, err, errlen);
  if (s == SL_OK) s = sl__st_parse(buf, len, size, out, err, errlen);
  free(buf);
  return s;
}

void sl__st_header_free(sl__st_header *h) {
  if (!h) return;
  for (size_t i = 0; i < h->count; i++) free(h->tensors[i].name);
  free(h->tensors);
  /* A failed parse may have filled only part of the arrays; entries past meta_count are NULL
   * or counted (each pair is counted as soon as it is stored). */
  sl__free_pairs(h->meta_keys, h->meta_values, h->meta_count);
  memset(h, 0, sizeof *h);
}
