/* shardload synth: a deterministic synthetic checkpoint with a realistic transformer layout,
 * for tests, benchmarks and demos. It needs nothing from the library but dtype names: the
 * safetensors files are written here byte by byte, so they can check the library's reader.
 *
 * Sizes are derived from --size; vocab and intermediate sizes are odd and not divisible by 3,
 * 5 or 7 so that no common world size divides them (uneven and empty torch.chunk shards).
 * Values are pseudo-random finite floats of small magnitude (norm weights near 1), so casts
 * and SGD steps on loaded shards are meaningful; each tensor's values depend only on the seed
 * and its name, so a sharded and a single-file checkpoint hold the same data. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "synth writes native words as safetensors' little-endian data"
#endif

static const char HELP[] =
    "usage: shardload synth OUT [--size 1GiB] [--dtype BF16] [--shards N] [--seed S] [--tensors N]\n"
    "\n"
    "Write a deterministic synthetic checkpoint with a transformer layout (embeddings, per\n"
    "layer attention q/k/v/o with q/k/v biases, MLP gate/up/down, two norms; final norm,\n"
    "lm_head, a 0-d F32 tensor and an I64 position buffer). Dimensions follow --size; vocab\n"
    "and intermediate sizes are chosen so no common world size divides them.\n"
    "\n"
    "With --shards 1, OUT is the .safetensors file (or, when OUT is a directory,\n"
    "OUT/model.safetensors). With --shards N > 1, OUT is a directory that receives\n"
    "model-0000k-of-0000N.safetensors and model.safetensors.index.json.\n"
    "\n"
    "With --tensors N, the layout is flat instead: N 1-D tensors tensor.0000000, ... of\n"
    "equal size that together hold --size bytes (rounded down to whole elements; the\n"
    "first ones take one element more where N does not divide it), for measuring\n"
    "per-tensor costs against one tensor of the same bytes.\n"
    "\n"
    "options:\n"
    "  --size SIZE     total tensor bytes to aim at, e.g. 2MiB, 1GiB (default 1GiB)\n"
    "  --dtype DT      F32, BF16, F16 or F64 (default BF16)\n"
    "  --shards N      number of files (default 1)\n"
    "  --seed S        seed of the values (default 0)\n"
    "  --tensors N     N equal 1-D tensors instead of a transformer (1 to 100000000)\n"
    "  -h, --help      show this help\n";

#define WRITE_BUF (8u << 20)

typedef enum value_kind { V_WEIGHT, V_NORM, V_POSITIONS } value_kind;

typedef struct synth_tensor {
  char name[128];
  const char *dtype; /* safetensors spelling */
  size_t esize;
  int ndim;
  int64_t shape[2];
  uint64_t nbytes;
  value_kind kind;
  int file; /* shard index */
} synth_tensor;

typedef struct synth_layout {
  int64_t hidden, inter, vocab, layers, positions;
  synth_tensor *t;
  size_t count, cap;
  uint64_t total;
} synth_layout;

/* ---- layout -------------------------------------------------------------------------------- */

/* Odd and not divisible by 3, 5 or 7: no world size of 2..10 (nor 12, 14, 16...) divides it. */
static int awkward(int64_t n) { return (n & 1) && n % 3 && n % 5 && n % 7; }
static int64_t awkward_up(int64_t n) {
  while (!awkward(n)) n++;
  return n;
}
static int64_t awkward_down(int64_t n, int64_t floor_) {
  while (n > floor_ && !awkward(n)) n--;
  return awkward(n) ? n : awkward_up(floor_);
}

static int64_t vocab_for(int64_t h) { return h >= 2000 ? 32003 : awkward_up(16 * h + 3); }
static int64_t inter_for(int64_t h) { return awkward_up(h * 43 / 16); } /* 11008/4096 */
static int64_t positions_for(int64_t h) { return h * 4 < 2048 ? h * 4 : 2048; }

static uint64_t fixed_bytes(int64_t h, size_t e) {
  return e * (uint64_t)(2 * vocab_for(h) * h + h) + 4 + 8 * (uint64_t)positions_for(h);
}
static uint64_t layer_bytes(int64_t h, int64_t inter, size_t e) {
  return e * (uint64_t)(4 * h * h + 3 * h * inter + 2 * h + 3 * h);
}

/* Picks hidden and layers for TARGET bytes: the widest model that still has a realistic depth,
 * then grows the intermediate size to absorb what is left. Returns -1 when TARGET is too small. */
static int choose_dims(uint64_t target, size_t e, synth_layout *L) {
  int64_t best_h = 0, best_l = 0;
  for (int64_t h = 16; h <= 16384; h += h < 256 ? 16 : 64) {
    uint64_t fb = fixed_bytes(h, e), lb = layer_bytes(h, inter_for(h), e);
    if (fb >= target) break;
    int64_t layers = (int64_t)((target - fb) / lb);
    int64_t want = h / 128 > 4 ? h / 128 : 4;
    if (layers >= want || (best_h == 0 && layers >= 1)) {
      best_h = h;
      best_l = layers;
    }
  }
  if (!best_h) return -1;
  L->hidden = best_h;
  L->layers = best_l;
  L->vocab = vocab_for(best_h);
  L->positions = positions_for(best_h);
  int64_t base = inter_for(best_h);
  uint64_t used = fixed_bytes(best_h, e) + (uint64_t)best_l * layer_bytes(best_h, base, e);
  uint64_t per_unit = e * 3 * (uint64_t)best_h * (uint64_t)best_l; /* one more intermediate row */
  L->inter = awkward_down(base + (int64_t)((target - used) / per_unit), base);
  return 0;
}

static int add_tensor(synth_layout *L, const char *name, const char *dtype, size_t esize, int ndim,
                      int64_t d0, int64_t d1, value_kind kind) {
  if (L->count == L->cap) {
    size_t cap = L->cap ? 2 * L->cap : 64;
    synth_tensor *t = realloc(L->t, cap * sizeof *t);
    if (!t) return -1;
    L->t = t;
    L->cap = cap;
  }
  synth_tensor *t = &L->t[L->count++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->dtype = dtype;
  t->esize = esize;
  t->ndim = ndim;
  t->shape[0] = d0;
  t->shape[1] = d1;
  uint64_t elems = 1;
  for (int d = 0; d < ndim; d++) elems *= (uint64_t)t->shape[d];
  t->nbytes = elems * esize;
  t->kind = kind;
  L->total += t->nbytes;
  return 0;
}

static int build_layout(synth_layout *L, const char *dt, size_t e) {
  int64_t h = L->hidden, I = L->inter;
  char n[128];
  int rc = add_tensor(L, "model.embed_tokens.weight", dt, e, 2, L->vocab, h, V_WEIGHT);
  for (int64_t l = 0; l < L->layers && rc == 0; l++) {
    static const char *attn[] = {"q", "k", "v"};
#define ADD(suffix, nd, a, b, kind)                                          \
  do {                                                                       \
    snprintf(n, sizeof n, "model.layers.%lld.%s", (long long)l, suffix);    \
    rc |= add_tensor(L, n, dt, e, nd, a, b, kind);                           \
  } while (0)
    ADD("input_layernorm.weight", 1, h, 0, V_NORM);
    for (int k = 0; k < 3; k++) {
      char s[64];
      snprintf(s, sizeof s, "self_attn.%s_proj.weight", attn[k]);
      ADD(s, 2, h, h, V_WEIGHT);
      snprintf(s, sizeof s, "self_attn.%s_proj.bias", attn[k]);
      ADD(s, 1, h, 0, V_WEIGHT);
    }
    ADD("self_attn.o_proj.weight", 2, h, h, V_WEIGHT);
    ADD("post_attention_layernorm.weight", 1, h, 0, V_NORM);
    ADD("mlp.gate_proj.weight", 2, I, h, V_WEIGHT);
    ADD("mlp.up_proj.weight", 2, I, h, V_WEIGHT);
    ADD("mlp.down_proj.weight", 2, h, I, V_WEIGHT);
#undef ADD
  }
  rc |= add_tensor(L, "model.norm.weight", dt, e, 1, h, 0, V_NORM);
  rc |= add_tensor(L, "lm_head.weight", dt, e, 2, L->vocab, h, V_WEIGHT);
  rc |= add_tensor(L, "model.rotary_emb.scale", "F32", 4, 0, 0, 0, V_NORM);
  rc |= add_tensor(L, "model.position_ids", "I64", 8, 1, L->positions, 0, V_POSITIONS);
  return rc;
}

/* --tensors N: N 1-D tensors sharing the elements of SIZE bytes (the first ones one more where N
 * does not divide them). Returns -1 when out of memory. */
static int build_flat(synth_layout *L, uint64_t size, const char *dt, size_t e, size_t n) {
  uint64_t elems = size / e, each = elems / n, extra = elems % n;
  char name[64];
  for (size_t i = 0; i < n; i++) {
    snprintf(name, sizeof name, "tensor.%07zu", i);
    if (add_tensor(L, name, dt, e, 1, (int64_t)(each + (i < extra)), 0, V_WEIGHT) != 0) return -1;
  }
  return 0;
}

/* Spreads tensors over N files by cumulative bytes, keeping file order and every file
 * non-empty (N <= count is checked by the caller). */
static void assign_files(synth_layout *L, int nfiles) {
  uint64_t cum = 0;
  int file = 0;
  size_t in_file = 0;
  for (size_t i = 0; i < L->count; i++) {
    uint64_t boundary = (uint64_t)((unsigned __int128)L->total * (unsigned)(file + 1) / (unsigned)nfiles);
    int must = L->count - i <= (size_t)(nfiles - 1 - file);
    if (file < nfiles - 1 && in_file > 0 && (cum >= boundary || must)) {
      file++;
      in_file = 0;
    }
    L->t[i].file = file;
    in_file++;
    cum += L->t[i].nbytes;
  }
}

/* ---- values -------------------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static uint64_t tensor_seed(uint64_t seed, const char *name) {
  uint64_t h = 1469598103934665603ull;
  for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  uint64_t s = splitmix(seed ^ splitmix(h));
  return s ? s : 1; /* xorshift state must not be zero */
}

static inline uint64_t xorshift(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

/* Exponents (unbiased) of the values: weights in +-[2^-12, 2^-4), norms (positive, like
 * trained norm scales) in [0.5, 2). A value's exponent is BASE + (random bits & MASK); SIGNED
 * says whether the random sign bit is kept. */
static void exp_range(value_kind k, int *base, unsigned *mask, int *is_signed) {
  *base = k == V_NORM ? -1 : -12;
  *mask = k == V_NORM ? 1 : 7;
  *is_signed = k != V_NORM;
}

/* Fills COUNT elements of a float tensor into OUT: each element from its own random bits (a
 * sign, a small exponent, a random mantissa). Written as plain shifts and masks over whole
 * random words so the compiler can keep it fast (well under a second of CPU per GiB at -O2). */
static void fill_floats(const synth_tensor *t, int bf16, uint64_t *state, void *out, size_t count) {
  int base, is_signed;
  unsigned mask;
  exp_range(t->kind, &base, &mask, &is_signed);
  if (t->esize == 2) {
    uint16_t *o = out;
    /* BF16: 1-8-7; F16: 1-5-10. Bits 12..14 of each 16-bit lane pick the exponent. */
    unsigned ebias = (unsigned)(base + (bf16 ? 127 : 15)), eshift = bf16 ? 7 : 10;
    unsigned mmask = bf16 ? 0x7f : 0x3ff, smask = is_signed ? 0x8000 : 0;
    for (size_t i = 0; i < count; i += 4) {
      uint64_t r = xorshift(state);
      size_t lanes = count - i < 4 ? count - i : 4;
      for (size_t j = 0; j < lanes; j++) {
        unsigned v = (unsigned)(r >> (16 * j)) & 0xffff;
        o[i + j] = (uint16_t)((v & smask) | (ebias + ((v >> 12) & mask)) << eshift | (v & mmask));
      }
    }
  } else if (t->esize == 4) {
    uint32_t *o = out;
    for (size_t i = 0; i < count; i++) {
      uint64_t r = xorshift(state);
      uint32_t e = (uint32_t)(base + 127) + (uint32_t)((r >> 40) & mask);
      o[i] = (uint32_t)((r >> 63) & (uint64_t)is_signed) << 31 | e << 23 | (uint32_t)(r & 0x7fffff);
    }
  } else {
    uint64_t *o = out;
    for (size_t i = 0; i < count; i++) {
      uint64_t r = xorshift(state), r2 = xorshift(state);
      uint64_t e = (uint64_t)(base + 1023) + (r2 & mask);
      o[i] = ((r2 >> 63) & (uint64_t)is_signed) << 63 | e << 52 | (r & 0xfffffffffffffull);
    }
  }
}

/* Streams tensor T's data into F through BUF (WRITE_BUF bytes). */
static int write_tensor(FILE *f, const synth_tensor *t, uint64_t seed, unsigned char *buf) {
  uint64_t state = tensor_seed(seed, t->name);
  uint64_t elems = t->nbytes / t->esize, done = 0;
  size_t per = WRITE_BUF / t->esize;
  while (done < elems) {
    size_t n = elems - done < per ? (size_t)(elems - done) : per;
    if (t->kind == V_POSITIONS) {
      int64_t *o = (int64_t *)buf;
      for (size_t i = 0; i < n; i++) o[i] = (int64_t)(done + i);
    } else {
      fill_floats(t, !strcmp(t->dtype, "BF16"), &state, buf, n);
    }
    if (fwrite(buf, t->esize, n, f) != n) return -1;
    done += n;
  }
  return 0;
}

/* ---- files --------------------------------------------------------------------------------- */

/* FILE's header; NULL when out of memory (a header with entries left out would make a file
 * whose tensors do not cover its data). */
static json_t *file_header(const synth_layout *L, int file, const char *dt, uint64_t seed) {
  json_t *hdr = json_object(), *meta = json_object();
  char v[64];
  int bad = json_object_set_new(meta, "format", json_string("pt"));
  bad |= json_object_set_new(meta, "generator", json_string("shardload synth"));
  bad |= json_object_set_new(meta, "dtype", json_string(dt));
#define META_INT(key, val)                                             \
  do {                                                                 \
    snprintf(v, sizeof v, "%llu", (unsigned long long)(val));          \
    bad |= json_object_set_new(meta, key, json_string(v));             \
  } while (0)
  META_INT("seed", seed);
  if (L->hidden) { /* a transformer's; a flat layout (--tensors) has none */
    META_INT("hidden_size", L->hidden);
    META_INT("intermediate_size", L->inter);
    META_INT("num_hidden_layers", L->layers);
    META_INT("vocab_size", L->vocab);
  }
#undef META_INT
  bad |= json_object_set_new(hdr, "__metadata__", meta);
  uint64_t off = 0;
  for (size_t i = 0; i < L->count && !bad; i++) {
    const synth_tensor *t = &L->t[i];
    if (t->file != file) continue;
    bad |= cli_st_header_add(hdr, t->name, t->dtype, t->ndim, t->shape, off, t->nbytes);
    off += t->nbytes;
  }
  if (!bad) return hdr;
  json_decref(hdr);
  return NULL;
}

/* Writes one safetensors file holding the tensors of FILE. Prints the error line itself. */
static int write_file(const char *path, const synth_layout *L, int file, const char *dt, uint64_t seed,
                      unsigned char *buf) {
  json_t *hdr = file_header(L, file, dt, seed);
  char *text = hdr ? json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(hdr);
  if (!text) {
    cli_error(path, SL_ERR_NOMEM, "out of memory building the header");
    return CLI_EXIT_ERROR;
  }
  size_t hlen = strlen(text), padded = (hlen + 7) & ~(size_t)7;
  FILE *f = fopen(path, "wb");
  if (!f) {
    cli_error(path, SL_ERR_IO, "cannot create: %s; give a writable OUT", strerror(errno));
    free(text);
    return CLI_EXIT_ERROR;
  }
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  int ok = fwrite(le, 1, 8, f) == 8 && fwrite(text, 1, hlen, f) == hlen;
  for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
  free(text);
  for (size_t i = 0; ok && i < L->count; i++)
    if (L->t[i].file == file) ok = write_tensor(f, &L->t[i], seed, buf) == 0;
  if (fclose(f) != 0) ok = 0;
  if (!ok) {
    cli_error(path, SL_ERR_IO, "cannot write: %s; check the free space where OUT lives", strerror(errno));
    return CLI_EXIT_ERROR;
  }
  return CLI_EXIT_OK;
}

/* The index; NULL when out of memory (a weight map with entries left out would lose tensors). */
static json_t *index_json(const synth_layout *L, char **names) {
  json_t *root = json_object(), *meta = json_object(), *map = json_object();
  int bad = json_object_set_new(meta, "total_size", json_integer((json_int_t)L->total));
  bad |= json_object_set_new(root, "metadata", meta);
  for (size_t i = 0; i < L->count && !bad; i++)
    bad |= json_object_set_new(map, L->t[i].name, json_string(names[L->t[i].file]));
  bad |= json_object_set_new(root, "weight_map", map);
  if (!bad) return root;
  json_decref(root);
  return NULL;
}

static int write_index(const char *path, const synth_layout *L, char **names) {
  json_t *root = index_json(L, names);
  if (!root) {
    cli_error(path, SL_ERR_NOMEM, "out of memory building the index of %zu tensors", L->count);
    return CLI_EXIT_ERROR;
  }
  FILE *f = fopen(path, "w");
  if (!f) {
    cli_error(path, SL_ERR_IO, "cannot create the index: %s; give a writable OUT directory", strerror(errno));
    json_decref(root);
    return CLI_EXIT_ERROR;
  }
  cli_out o;
  cli_out_init(&o, f, path);
  int rc = cli_out_json_document(&o, root) == 0 ? CLI_EXIT_OK : cli_out_fail(path, &o, "the index");
  json_decref(root);
  if (fclose(f) != 0 && rc == CLI_EXIT_OK) {
    cli_error(path, SL_ERR_IO, "cannot write the index: %s; check the free space where OUT lives", strerror(errno));
    rc = CLI_EXIT_ERROR;
  }
  return rc;
}

static int is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int cli_cmd_synth(int argc, char **argv) {
  static const struct option longopts[] = {
      {"size", required_argument, NULL, 's'},
      {"dtype", required_argument, NULL, 'd'},
      {"shards", required_argument, NULL, 'n'},
      {"seed", required_argument, NULL, 'S'},
      {"tensors", required_argument, NULL, 't'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0},
  };
  uint64_t size = 1ull << 30, seed = 0;
  long shards = 1, flat = 0;
  const char *dt = "BF16";
  size_t esize = 2;
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 's':
      if (cli_parse_size(optarg, &size) || size == 0)
        return cli_usage_error("--size", "'%s' is not a size; give bytes or e.g. 2MiB, 1GiB", optarg);
      break;
    case 'd': {
      sl_dtype d = cli_parse_dtype("--dtype", optarg);
      if (d == SL_DTYPE_INVALID) return CLI_EXIT_USAGE;
      static const struct { sl_dtype dt; const char *name; size_t size; } ok[] = {
          {SL_DTYPE_F64, "F64", 8}, {SL_DTYPE_F32, "F32", 4}, {SL_DTYPE_F16, "F16", 2}, {SL_DTYPE_BF16, "BF16", 2}};
      size_t i = 0;
      while (i < 4 && ok[i].dt != d) i++;
      if (i == 4) return cli_usage_error("--dtype", "synth writes F32, BF16, F16 or F64, not '%s'", optarg);
      dt = ok[i].name;
      esize = ok[i].size;
      break;
    }
    case 'n':
      if (cli_parse_int(optarg, 1, 99999, &shards))
        return cli_usage_error("--shards", "'%s' is not a file count; give 1 to 99999", optarg);
      break;
    case 't':
      if (cli_parse_int(optarg, 1, 100000000, &flat))
        return cli_usage_error("--tensors", "'%s' is not a tensor count; give 1 to 100000000", optarg);
      break;
    case 'S': {
      char *end = NULL;
      errno = 0;
      seed = strtoull(optarg, &end, 0);
      if (errno || !*optarg || *end)
        return cli_usage_error("--seed", "'%s' is not a seed; give a non-negative integer", optarg);
      break;
    }
    case 'h': return cli_print_help(HELP);
    default: return cli_bad_option("synth", c, argv);
    }
  }
  if (argc - optind != 1)
    return cli_usage_error("synth", "%s; run 'shardload synth --help'",
                           argc - optind ? "takes exactly one OUT" : "needs an OUT path");
  const char *out = argv[optind];

  synth_layout L;
  memset(&L, 0, sizeof L);
  if (flat && size / esize < (uint64_t)flat)
    return cli_usage_error("--tensors", "%ld tensors of %s do not fit in %llu bytes; give at most %llu", flat, dt,
                           (unsigned long long)size, (unsigned long long)(size / esize));
  if (!flat && choose_dims(size, esize, &L) != 0)
    return cli_usage_error("--size", "%llu bytes is too small for a model; give at least %llu bytes",
                           (unsigned long long)size,
                           (unsigned long long)(fixed_bytes(16, esize) + layer_bytes(16, inter_for(16), esize)));
  int rc = CLI_EXIT_ERROR;
  unsigned char *buf = NULL;
  char **names = NULL;
  char *path = NULL;
  if ((flat ? build_flat(&L, size, dt, esize, (size_t)flat) : build_layout(&L, dt, esize)) != 0) {
    cli_error(out, SL_ERR_NOMEM, "out of memory for the tensor table");
    goto out_layout;
  }
  if ((size_t)shards > L.count) {
    rc = cli_usage_error("--shards", "%ld files for %zu tensors; give at most %zu", shards, L.count, L.count);
    goto out_layout;
  }
  assign_files(&L, (int)shards);
  buf = malloc(WRITE_BUF);
  names = calloc((size_t)shards, sizeof *names);
  if (!buf || !names) {
    cli_error(out, SL_ERR_NOMEM, "out of memory for the write buffer");
    goto out_names;
  }

  if (shards == 1) {
    if (asprintf(&path, is_dir(out) ? "%s/model.safetensors" : "%s", out) < 0) goto out_names;
    if ((rc = write_file(path, &L, 0, dt, seed, buf)) != CLI_EXIT_OK) goto out_names;
  } else {
    if (!is_dir(out) && mkdir(out, 0777) != 0) {
      cli_error(out, SL_ERR_IO, "cannot create the output directory: %s; give a writable OUT",
                strerror(errno));
      goto out_names;
    }
    for (long k = 0; k < shards; k++) {
      if (asprintf(&names[k], "model-%05ld-of-%05ld.safetensors", k + 1, shards) < 0) goto out_names;
      free(path);
      if (asprintf(&path, "%s/%s", out, names[k]) < 0) {
        path = NULL;
        goto out_names;
      }
      if ((rc = write_file(path, &L, (int)k, dt, seed, buf)) != CLI_EXIT_OK) goto out_names;
    }
    free(path);
    if (asprintf(&path, "%s/model.safetensors.index.json", out) < 0) {
      path = NULL;
      rc = CLI_EXIT_ERROR;
      goto out_names;
    }
    if ((rc = write_index(path, &L, names)) != CLI_EXIT_OK) goto out_names;
  }
  /* the files are complete; a summary that cannot be written still fails the command, which
   * says so (a script reading it must not take a part of it for the whole) */
  char hb[32];
  cli_out o;
  cli_out_init(&o, cli_report(), "stdout");
  cli_out_puts(&o, "synth: wrote ");
  cli_out_escaped(&o, shards == 1 ? path : out, 0);
  cli_out_printf(&o, ": %zu tensors, %llu bytes (%s) in %ld file%s; ", L.count, (unsigned long long)L.total,
                 cli_human_bytes(hb, sizeof hb, L.total), shards, shards == 1 ? "" : "s");
  if (flat)
    cli_out_puts(&o, "flat layout, ");
  else
    cli_out_printf(&o, "hidden %lld, layers %lld, vocab %lld, intermediate %lld, ", (long long)L.hidden,
                   (long long)L.layers, (long long)L.vocab, (long long)L.inter);
  cli_out_printf(&o, "%s, seed %llu\n", dt, (unsigned long long)seed);
  rc = cli_out_flush(&o) == 0 ? CLI_EXIT_OK : cli_out_fail(out, &o, "the summary");

out_names:
  for (long k = 0; names && k < shards; k++) free(names[k]);
  free(names);
  free(path);
  free(buf);
out_layout:
  free(L.t);
  return rc;
}
