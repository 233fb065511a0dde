/* The plan: which mesh, how each tensor is placed on it, which dtype it ends up in, and
 * which checkpoint tensors are loaded at all.
 *
 * Resolution for one tensor, in order (later steps override earlier ones field by field):
 *   1. the default placement (FSDP2's unless set: [shard(0)] on a 1-D mesh,
 *      [replicate, ..., shard(0)] on an N-D mesh; 0-d tensors are always replicated by it);
 *   2. every rule whose glob matches the whole name, in the order added;
 *   3. the tensor's exact entry.
 * The param dtype applies to castable floating tensors only, as Accelerate's cast does;
 * float8, integer and bool tensors keep their dtype, and asking for another one explicitly
 * (by rule or entry) is an error. The JSON plan file reader lives in plan_json.c. */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <xxhash.h>

#include "internal.h"

/* A parsed placement spec before it meets a mesh: a single placement (applies to every mesh
 * dim) or a list (one per mesh dim, length checked against the mesh). */
typedef struct spec {
  int n; /* 0: not set */
  bool list;
  sl_mesh_placement pl[SL_MAX_MESH_DIMS];
} spec;

typedef struct rule {
  char *pattern;
  spec placement;
  sl_dtype dtype;
} rule;

typedef struct entry {
  char *name;
  spec placement;
  sl_dtype dtype;
} entry;

struct sl_plan {
  sl_context *ctx;
  int mesh_ndim; /* 0: unset, the default 1-D [world] */
  int mesh[SL_MAX_MESH_DIMS];
  sl_offload_policy policy;
  sl_dtype param_dtype; /* INVALID: the file's */
  spec default_pl;      /* n == 0: FSDP2's default */
  int strict;
  /* which of the scalar settings were set explicitly (what sl__plan_merge moves) */
  bool policy_set, dtype_set, default_set, strict_set;
  rule *rules;
  size_t nrules, cap_rules;
  entry *entries; /* in the order first added */
  size_t nentries, cap_entries;
  size_t *slots; /* open-addressing index over entries by name: index + 1, 0 = empty */
  size_t nslots;
};

/* ---- placement specs ------------------------------------------------------------------- */

static const char *skip_ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  return p;
}

/* One placement at *PP: shard(N) / Shard(N) / Shard(dim=N) / S(N), replicate / Replicate() / R. */
static bool parse_one(const char **pp, sl_mesh_placement *out) {
  const char *p = skip_ws(*pp), *w = p;
  while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')) p++;
  size_t wl = (size_t)(p - w);
  bool shard = (wl == 5 && strncasecmp(w, "shard", 5) == 0) || (wl == 1 && (*w == 'S' || *w == 's'));
  bool repl = (wl == 9 && strncasecmp(w, "replicate", 9) == 0) || (wl == 1 && (*w == 'R' || *w == 'r'));
  if (!shard && !repl) return false;
  p = skip_ws(p);
  if (repl) {
    if (*p == '(') {
      p = skip_ws(p + 1);
      if (*p++ != ')') return false;
    }
    *out = (sl_mesh_placement){SL_REPLICATE, 0};
    *pp = p;
    return true;
  }
  if (*p++ != '(') return false;
  p = skip_ws(p);
  if (strncmp(p, "dim", 3) == 0) { /* torch's repr: Shard(dim=0) */
    p = skip_ws(p + 3);
    if (*p++ != '=') return false;
    p = skip_ws(p);
  }
  int sign = 1;
  if (*p == '-' || *p == '+') sign = *p++ == '-' ? -1 : 1;
  if (*p < '0' || *p > '9') return false;
  int d = 0;
  while (*p >= '0' && *p <= '9') {
    d = d * 10 + (*p++ - '0');
    /* any dim parses: whether it fits is a question for each tensor (sl__plan_resolve says
     * "out of range for a 2-d tensor"); only a number no int holds is not a placement */
    if (d > 100000000) return false;
  }
  p = skip_ws(p);
  if (*p++ != ')') return false;
  *out = (sl_mesh_placement){SL_SHARD, sign * d};
  *pp = p;
  return true;
}

/* Parses TEXT into OUT; on failure writes why into ERR (no location: callers add it). */
static bool parse_spec(const char *text, spec *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  const char *p = skip_ws(text);
  char close = *p == '[' ? ']' : *p == '(' ? ')' : 0;
  if (close) p++, out->list = true;
  if (close && *skip_ws(p) == close) {
    snprintf(err, errlen, "'%s' is an empty list; give one placement per mesh dim", text);
    return false;
  }
  for (;;) {
    if (out->n == SL_MAX_MESH_DIMS) {
      snprintf(err, errlen, "'%s' has more than %d placements; a mesh has at most %d dims", text,
               SL_MAX_MESH_DIMS, SL_MAX_MESH_DIMS);
      out->n = 0;
      return false;
    }
    if (!parse_one(&p, &out->pl[out->n])) goto bad;
    out->n++;
    p = skip_ws(p);
    if (*p != ',') break;
    out->list = true;
    p++;
  }
  if (close) {
    if (*p != close) goto bad;
    p = skip_ws(p + 1);
  }
  if (*p) goto bad;
  return true;
bad:
  snprintf(err, errlen, "'%s' is not a placement; use shard(N) or replicate", text);
  out->n = 0;
  return false;
}

/* The per-mesh-dim placements of SPEC on a MESH_NDIM mesh; false when a list has the wrong
 * length. */
static bool expand_spec(const spec *s, int mesh_ndim, sl_mesh_placement *out) {
  if (s->list && s->n != mesh_ndim) return false;
  for (int m = 0; m < mesh_ndim; m++) out[m] = s->list ? s->pl[m] : s->pl[0];
  return true;
}

static void format_placements(const sl_mesh_placement *pl, int n, bool list, char *buf, size_t len) {
  size_t off = 0;
  if (len == 0) return;
  buf[0] = 0;
  if (list) off += (size_t)snprintf(buf + off, len - off, "[");
  for (int m = 0; m < n && off < len; m++) {
    const char *sep = m ? ", " : "";
    if (pl[m].kind == SL_SHARD)
      off += (size_t)snprintf(buf + off, len - off, "%sshard(%d)", sep, pl[m].dim);
    else
      off += (size_t)snprintf(buf + off, len - off, "%sreplicate", sep);
  }
  if (list && off < len) snprintf(buf + off, len - off, "]");
}

static void format_spec(const spec *s, char *buf, size_t len) {
  format_placements(s->pl, s->n, s->list, buf, len);
}

static void format_mesh(const int *dims, int ndim, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = 0;
  for (int m = 0; m < ndim && off < len; m++)
    off += (size_t)snprintf(buf + off, len - off, m ? "x%d" : "%d", dims[m]);
}

SL_API sl_status sl_placement_parse(const char *text, int mesh_ndim, sl_mesh_placement *out) {
  if (!text || !out || mesh_ndim < 1 || mesh_ndim > SL_MAX_MESH_DIMS)
    return sl__fail(NULL, SL_ERR_INVALID, "sl_placement_parse: bad arguments");
  char err[256];
  spec s;
  if (!parse_spec(text, &s, err, sizeof err)) return SL_ERR_PLAN;
  if (!expand_spec(&s, mesh_ndim, out)) return SL_ERR_PLAN;
  return SL_OK;
}

/* ---- lifecycle and setters ------------------------------------------------------------- */

SL_API sl_status sl_plan_create(sl_context *ctx, sl_plan **out) {
  if (!out) return sl__fail(ctx, SL_ERR_INVALID, "sl_plan_create: out is NULL");
  *out = NULL;
  sl_plan *p = calloc(1, sizeof *p);
  if (!p) return sl__fail(ctx, SL_ERR_NOMEM, "cannot allocate a plan");
  p->ctx = ctx;
  p->policy.kind = SL_OFFLOAD_NONE;
  *out = p;
  return SL_OK;
}

SL_API void sl_plan_destroy(sl_plan *plan) {
  if (!plan) return;
  for (size_t i = 0; i < plan->nrules; i++) free(plan->rules[i].pattern);
  for (size_t i = 0; i < plan->nentries; i++) free(plan->entries[i].name);
  free(plan->rules);
  free(plan->entries);
  free(plan->slots);
  free(plan);
}

sl_context *sl__plan_context(const sl_plan *plan) { return plan ? plan->ctx : NULL; }
const sl_offload_policy *sl__plan_policy(const sl_plan *plan) { return &plan->policy; }

int sl__plan_mesh(const sl_plan *plan, int world_size, int *dims) {
  if (plan->mesh_ndim == 0) {
    dims[0] = world_size;
    return 1;
  }
  memcpy(dims, plan->mesh, sizeof(int) * (size_t)plan->mesh_ndim);
  return plan->mesh_ndim;
}

int sl__plan_mesh_explicit(const sl_plan *plan, int *dims) {
  if (plan->mesh_ndim) memcpy(dims, plan->mesh, sizeof(int) * (size_t)plan->mesh_ndim);
  return plan->mesh_ndim;
}

/* Every list placement stored in PLAN must have MESH_NDIM entries; names the first that
 * does not. */
static sl_status check_specs_fit(const sl_plan *plan, int mesh_ndim, const char *mesh_text) {
  char buf[128];
  if (plan->default_pl.list && plan->default_pl.n != mesh_ndim) {
    format_spec(&plan->default_pl, buf, sizeof buf);
    return sl__fail(plan->ctx, SL_ERR_PLAN,
                    "default placement '%s' has %d placements but mesh %s has %d dims", buf,
                    plan->default_pl.n, mesh_text, mesh_ndim);
  }
  for (size_t i = 0; i < plan->nrules; i++) {
    const spec *s = &plan->rules[i].placement;
    if (!s->list || s->n == mesh_ndim) continue;
    format_spec(s, buf, sizeof buf);
    return sl__fail(plan->ctx, SL_ERR_PLAN,
                    "rule %zu ('%s'): placement '%s' has %d placements but mesh %s has %d dims",
                    i + 1, plan->rules[i].pattern, buf, s->n, mesh_text, mesh_ndim);
  }
  for (size_t i = 0; i < plan->nentries; i++) {
    const spec *s = &plan->entries[i].placement;
    if (!s->list || s->n == mesh_ndim) continue;
    format_spec(s, buf, sizeof buf);
    return sl__fail(plan->ctx, SL_ERR_PLAN,
                    "%s: placement '%s' has %d placements but mesh %s has %d dims",
                    plan->entries[i].name, buf, s->n, mesh_text, mesh_ndim);
  }
  return SL_OK;
}

SL_API sl_status sl_plan_set_mesh(sl_plan *plan, int ndim, const int *dims) {
  if (!plan) return SL_ERR_INVALID;
  if (ndim == 0 && !dims) { /* back to the default 1-D [world] */
    plan->mesh_ndim = 0;
    return SL_OK;
  }
  if (ndim < 1 || ndim > SL_MAX_MESH_DIMS || !dims)
    return sl__fail(plan->ctx, SL_ERR_PLAN, "a mesh has 1 to %d dims, not %d", SL_MAX_MESH_DIMS, ndim);
  char text[64];
  format_mesh(dims, ndim, text, sizeof text);
  int64_t ranks = 1;
  for (int m = 0; m < ndim; m++) {
    if (dims[m] < 1)
      return sl__fail(plan->ctx, SL_ERR_PLAN, "mesh %s: every mesh dim needs at least 1 rank", text);
    ranks *= dims[m];
    if (ranks > INT32_MAX)
      return sl__fail(plan->ctx, SL_ERR_PLAN, "mesh %s has more ranks than a job can", text);
  }
  sl_status s = check_specs_fit(plan, ndim, text);
  if (s != SL_OK) return s;
  plan->mesh_ndim = ndim;
  memcpy(plan->mesh, dims, sizeof(int) * (size_t)ndim);
  return SL_OK;
}

SL_API sl_status sl_plan_set_offload_policy(sl_plan *plan, const sl_offload_policy *policy) {
  if (!plan) return SL_ERR_INVALID;
  sl_offload_policy p = policy ? *policy : (sl_offload_policy){SL_OFFLOAD_NONE, 0};
  if (p.kind != SL_OFFLOAD_NONE && p.kind != SL_OFFLOAD_CPU)
    return sl__fail(plan->ctx, SL_ERR_INVALID, "unknown offload policy kind %d", (int)p.kind);
  /* pin_memory only means something under a CPU policy; normalised so equal plans digest
   * equally. */
  p.pin_memory = p.kind == SL_OFFLOAD_CPU && p.pin_memory;
  plan->policy = p;
  plan->policy_set = true;
  return SL_OK;
}

SL_API sl_status sl_plan_set_param_dtype(sl_plan *plan, sl_dtype dt) {
  if (!plan) return SL_ERR_INVALID;
  if (dt != SL_DTYPE_INVALID && !sl_dtype_is_castable(dt))
    return sl__fail(plan->ctx, SL_ERR_DTYPE,
                    "param dtype %s cannot be cast to; use F64, F32, F16 or BF16 (or none to keep "
                    "the checkpoint's dtypes)",
                    sl_dtype_name(dt));
  plan->param_dtype = dt;
  plan->dtype_set = true;
  return SL_OK;
}

/* Parses TEXT (NULL: unset) into OUT and checks it against the mesh when one is set. */
static sl_status plan_spec(sl_plan *plan, const char *text, spec *out) {
  char err[256];
  memset(out, 0, sizeof *out);
  if (!text) return SL_OK;
  if (!parse_spec(text, out, err, sizeof err)) return sl__fail(plan->ctx, SL_ERR_PLAN, "%s", err);
  if (plan->mesh_ndim && out->list && out->n != plan->mesh_ndim) {
    char mesh[64];
    format_mesh(plan->mesh, plan->mesh_ndim, mesh, sizeof mesh);
    return sl__fail(plan->ctx, SL_ERR_PLAN, "placement '%s' has %d placements but mesh %s has %d dims",
                    text, out->n, mesh, plan->mesh_ndim);
  }
  return SL_OK;
}

static sl_status check_dtype_arg(sl_plan *plan, sl_dtype dt) {
  if (dt < SL_DTYPE_INVALID || dt >= SL_DTYPE_COUNT_)
    return sl__fail(plan->ctx, SL_ERR_INVALID, "unknown dtype value %d", (int)dt);
  return SL_OK;
}

SL_API sl_status sl_plan_set_default_placement(sl_plan *plan, const char *text) {
  if (!plan) return SL_ERR_INVALID;
  spec s;
  sl_status st = plan_spec(plan, text, &s);
  if (st != SL_OK) return st;
  plan->default_pl = s;
  plan->default_set = true;
  return SL_OK;
}

static bool grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t ncap = *cap ? *cap * 2 : 8;
  while (ncap < need) ncap *= 2;
  void *n = realloc(*arr, ncap * elem);
  if (!n) return false;
  *arr = n;
  *cap = ncap;
  return true;
}

SL_API sl_status sl_plan_add_rule(sl_plan *plan, const char *pattern, const char *placement,
                                  sl_dtype dtype) {
  if (!plan) return SL_ERR_INVALID;
  if (!pattern || !*pattern)
    return sl__fail(plan->ctx, SL_ERR_PLAN, "a rule needs a non-empty name pattern such as '*.bias'");
  sl_status st = check_dtype_arg(plan, dtype);
  if (st != SL_OK) return st;
  spec s;
  if ((st = plan_spec(plan, placement, &s)) != SL_OK) return st;
  if (!grow((void **)&plan->rules, &plan->cap_rules, plan->nrules + 1, sizeof(rule)))
    return sl__fail(plan->ctx, SL_ERR_NOMEM, "cannot grow the plan's rules");
  char *pat = sl__strdup(pattern);
  if (!pat) return sl__fail(plan->ctx, SL_ERR_NOMEM, "cannot copy a rule pattern");
  plan->rules[plan->nrules++] = (rule){pat, s, dtype};
  return SL_OK;
}

/* ---- entries: an array in insertion order plus a hash index by name ------------------- */

static size_t name_slot(const sl_plan *plan, const char *name) {
  size_t mask = plan->nslots - 1, i = (size_t)XXH3_64bits(name, strlen(name)) & mask;
  for (;;) {
    size_t e = plan->slots[i];
    if (e == 0 || strcmp(plan->entries[e - 1].name, name) == 0) return i;
    i = (i + 1) & mask;
  }
}

static entry *find_entry(const sl_plan *plan, const char *name) {
  if (plan->nentries == 0) return NULL;
  size_t e = plan->slots[name_slot(plan, name)];
  return e ? &plan->entries[e - 1] : NULL;
}

/* A plan without entries loads every tensor; one with entries loads only those it names. */
static bool takes(const sl_plan *plan, const char *name) {
  return plan->nentries == 0 || find_entry(plan, name) != NULL;
}

/* Keeps the index at most half full. */
static bool reindex(sl_plan *plan, size_t need) {
  if (need * 2 <= plan->nslots) return true;
  size_t n = plan->nslots ? plan->nslots : 16;
  while (need * 2 > n) n *= 2;
  size_t *slots = calloc(n, sizeof *slots);
  if (!slots) return false;
  free(plan->slots);
  plan->slots = slots;
  plan->nslots = n;
  for (size_t i = 0; i < plan->nentries; i++) plan->slots[name_slot(plan, plan->entries[i].name)] = i + 1;
  return true;
}

/* Adds NAME, or merges into its entry field by field (later settings win). */
static sl_status put_entry(sl_plan *plan, const char *name, const spec *s, sl_dtype dtype) {
  entry *e = find_entry(plan, name);
  if (!e) {
    if (!grow((void **)&plan->entries, &plan->cap_entries, plan->nentries + 1, sizeof(entry)) ||
        !reindex(plan, plan->nentries + 1))
      return sl__fail(plan->ctx, SL_ERR_NOMEM, "cannot grow the plan's tensor entries");
    char *copy = sl__strdup(name);
    if (!copy) return sl__fail(plan->ctx, SL_ERR_NOMEM, "cannot copy a tensor name");
    e = &plan->entries[plan->nentries++];
    *e = (entry){copy, {0}, SL_DTYPE_INVALID};
    plan->slots[name_slot(plan, name)] = plan->nentries;
  }
  if (s->n) e->placement = *s;
  if (dtype != SL_DTYPE_INVALID) e->dtype = dtype;
  return SL_OK;
}

SL_API sl_status sl_plan_add_entry(sl_plan *plan, const char *name, const char *placement,
                                   sl_dtype dtype) {
  if (!plan) return SL_ERR_INVALID;
  if (!name || !*name) return sl__fail(plan->ctx, SL_ERR_PLAN, "a plan entry needs a tensor name");
  sl_status st = check_dtype_arg(plan, dtype);
  if (st != SL_OK) return st;
  spec s;
  if ((st = plan_spec(plan, placement, &s)) != SL_OK) return st;
  return put_entry(plan, name, &s, dtype);
}

SL_API sl_status sl_plan_set_strict(sl_plan *plan, int strict) {
  if (!plan) return SL_ERR_INVALID;
  plan->strict = strict != 0;
  plan->strict_set = true;
  return SL_OK;
}

sl_status sl__plan_merge(sl_plan *dst, sl_plan *src) {
  if (src->mesh_ndim) {
    sl_status st = sl_plan_set_mesh(dst, src->mesh_ndim, src->mesh);
    if (st != SL_OK) return st;
  }
  if (!grow((void **)&dst->rules, &dst->cap_rules, dst->nrules + src->nrules, sizeof(rule)) ||
      !grow((void **)&dst->entries, &dst->cap_entries, dst->nentries + src->nentries, sizeof(entry)) ||
      !reindex(dst, dst->nentries + src->nentries))
    return sl__fail(dst->ctx, SL_ERR_NOMEM, "cannot grow the plan");
  if (src->policy_set) dst->policy = src->policy, dst->policy_set = true;
  if (src->dtype_set) dst->param_dtype = src->param_dtype, dst->dtype_set = true;
  if (src->default_set) dst->default_pl = src->default_pl, dst->default_set = true;
  if (src->strict_set) dst->strict = src->strict, dst->strict_set = true;
  if (src->nrules) memcpy(dst->rules + dst->nrules, src->rules, src->nrules * sizeof(rule));
  dst->nrules += src->nrules;
  src->nrules = 0; /* the patterns now belong to dst */
  for (size_t i = 0; i < src->nentries; i++) {
    sl_status st = put_entry(dst, src->entries[i].name, &src->entries[i].placement, src->entries[i].dtype);
    if (st != SL_OK) return st; /* cannot happen: room was reserved above */
  }
  return SL_OK;
}

/* ---- resolution ------------------------------------------------------------------------ */

static void describe_rule(const sl_plan *plan, long r, char *buf, size_t len) {
  if (r == -1) snprintf(buf, len, "the default placement");
  else if (r == -2) snprintf(buf, len, "its plan entry");
  else if (r == -3) snprintf(buf, len, "the plan's param dtype");
  else snprintf(buf, len, "rule %ld ('%s')", r + 1, plan->rules[r].pattern);
}

static void format_shape(const sl_source_tensor *t, char *buf, size_t len) {
  size_t off = (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < t->ndim && off < len; d++)
    off += (size_t)snprintf(buf + off, len - off, d ? ", %lld" : "%lld", (long long)t->shape[d]);
  if (off < len) snprintf(buf + off, len - off, "]");
}

sl_status sl__plan_resolve(sl_plan *plan, const sl_source_tensor *t, sl__resolved *out) {
  if (!plan || !t || !out || !t->name) return SL_ERR_INVALID;
  if (t->ndim < 0 || t->ndim > SL_MAX_DIMS)
    return sl__fail(plan->ctx, SL_ERR_INVALID, "%s: %d dims is outside 0..%d", t->name, t->ndim, SL_MAX_DIMS);
  const int mesh_ndim = plan->mesh_ndim ? plan->mesh_ndim : 1;
  const spec *ps = NULL;
  long pfrom = -1, dfrom = -3; /* rule index, or -1 default, -2 entry, -3 param dtype */
  sl_dtype want = SL_DTYPE_INVALID;
  for (size_t i = 0; i < plan->nrules; i++) {
    const rule *r = &plan->rules[i];
    if (fnmatch(r->pattern, t->name, 0) != 0) continue;
    if (r->placement.n) ps = &r->placement, pfrom = (long)i;
    if (r->dtype != SL_DTYPE_INVALID) want = r->dtype, dfrom = (long)i;
  }
  const entry *e = find_entry(plan, t->name);
  if (e && e->placement.n) ps = &e->placement, pfrom = -2;
  if (e && e->dtype != SL_DTYPE_INVALID) want = e->dtype, dfrom = -2;

  char from[160], text[128], shape[160];
  memset(out, 0, sizeof *out);
  if (!ps && (t->ndim == 0 || !plan->default_pl.n)) {
    /* FSDP2's default; the default (whichever) never shards a scalar. */
    for (int m = 0; m < mesh_ndim; m++) out->placements[m] = (sl_mesh_placement){SL_REPLICATE, 0};
    if (t->ndim > 0) out->placements[mesh_ndim - 1] = (sl_mesh_placement){SL_SHARD, 0};
  } else {
    if (!ps) ps = &plan->default_pl;
    if (!expand_spec(ps, mesh_ndim, out->placements)) {
      describe_rule(plan, pfrom, from, sizeof from);
      format_spec(ps, text, sizeof text);
      return sl__fail(plan->ctx, SL_ERR_PLAN,
                      "%s: placement '%s' from %s has %d placements but the mesh has %d dim%s; give "
                      "one per mesh dim",
                      t->name, text, from, ps->n, mesh_ndim, mesh_ndim == 1 ? "" : "s");
    }
  }
  for (int m = 0; m < mesh_ndim; m++) {
    sl_mesh_placement *p = &out->placements[m];
    if (p->kind != SL_SHARD) continue;
    int d = p->dim < 0 ? p->dim + t->ndim : p->dim;
    if (d >= 0 && d < t->ndim) {
      p->dim = d;
      continue;
    }
    describe_rule(plan, pfrom, from, sizeof from);
    if (t->ndim == 0)
      return sl__fail(plan->ctx, SL_ERR_PLAN,
                      "%s: %s shards a 0-d (scalar) tensor; a scalar can only be replicated", t->name,
                      from);
    format_shape(t, shape, sizeof shape);
    return sl__fail(plan->ctx, SL_ERR_PLAN,
                    "%s: shard(%d) from %s is out of range for a %d-d tensor of shape %s; use a dim "
                    "in %d..%d, or replicate",
                    t->name, p->dim, from, t->ndim, shape, -t->ndim, t->ndim - 1);
  }

  const sl_dtype have = t->dtype;
  if (want != SL_DTYPE_INVALID) {
    if (want != have && !(sl_dtype_is_castable(want) && sl_dtype_is_castable(have))) {
      describe_rule(plan, dfrom, from, sizeof from);
      return sl__fail(plan->ctx, SL_ERR_DTYPE,
                      "%s: %s asks for dtype %s but the checkpoint holds %s; only F64, F32, F16 and "
                      "BF16 convert into each other (float8, integer and bool tensors load as stored): "
                      "drop the dtype or narrow the rule",
                      t->name, from, sl_dtype_name(want), sl_dtype_name(have));
    }
    out->dtype = want;
  } else if (plan->param_dtype != SL_DTYPE_INVALID && sl_dtype_is_castable(have)) {
    out->dtype = plan->param_dtype;
  } else {
    out->dtype = have;
  }
  return SL_OK;
}

/* ---- checks against a source --------------------------------------------------------- */

/* Appends up to 5 names, then ", ..." when there are more. */
static void list_names(char *buf, size_t len, const char *const *names, size_t n, size_t total) {
  size_t off = strlen(buf);
  for (size_t i = 0; i < n && off < len; i++)
    off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "", names[i]);
  if (total > n && off < len) snprintf(buf + off, len - off, ", ...");
}

static int64_t mesh_ranks(const int *dims, int ndim) {
  int64_t r = 1;
  for (int m = 0; m < ndim; m++) r *= dims[m];
  return r;
}

static sl_status check_world(sl_plan *plan, int world_size) {
  if (!plan->mesh_ndim || mesh_ranks(plan->mesh, plan->mesh_ndim) == world_size) return SL_OK;
  char text[64];
  format_mesh(plan->mesh, plan->mesh_ndim, text, sizeof text);
  return sl__fail(plan->ctx, SL_ERR_PLAN,
                  "mesh %s has %lld ranks but the job has %d; use a mesh whose sizes multiply to %d",
                  text, (long long)mesh_ranks(plan->mesh, plan->mesh_ndim), world_size, world_size);
}

sl_status sl__plan_check_names(sl_plan *plan, const sl_source *src, int world_size, unsigned char *take) {
  if (!plan || !src) return SL_ERR_INVALID;
  sl_status st = check_world(plan, world_size);
  if (st != SL_OK) return st;
  const size_t count = sl_source_tensor_count(src);
  const char *first[5];
  size_t nfirst = 0, missing = 0;
  for (size_t i = 0; i < plan->nentries; i++) {
    if (sl_source_find(src, plan->entries[i].name)) continue;
    if (nfirst < 5) first[nfirst++] = plan->entries[i].name;
    missing++;
  }
  if (missing) {
    char msg[SL__ERRMSG_LEN];
    snprintf(msg, sizeof msg,
             "plan names %zu tensor%s the checkpoint lacks (of %zu in the plan; the checkpoint has "
             "%zu): ",
             missing, missing == 1 ? "" : "s", plan->nentries, count);
    list_names(msg, sizeof msg, first, nfirst, missing);
    return sl__fail(plan->ctx, SL_ERR_MISSING, "%s", msg);
  }
  size_t unnamed = 0;
  nfirst = 0;
  for (size_t i = 0; i < count; i++) {
    const sl_source_tensor *t = sl_source_tensor_at(src, i);
    bool named = takes(plan, t->name);
    if (take) take[i] = named;
    if (named) continue;
    if (nfirst < 5) first[nfirst++] = t->name;
    unnamed++;
  }
  if (unnamed && plan->strict) {
    char msg[SL__ERRMSG_LEN];
    snprintf(msg, sizeof msg,
             "checkpoint holds %zu tensor%s the strict plan does not name (the plan names %zu; the "
             "checkpoint has %zu); add them to the plan or make it non-strict: ",
             unnamed, unnamed == 1 ? "" : "s", plan->nentries, count);
    list_names(msg, sizeof msg, first, nfirst, unnamed);
    return sl__fail(plan->ctx, SL_ERR_UNEXPECTED, "%s", msg);
  }
  return SL_OK;
}

sl_status sl__plan_check(sl_plan *plan, const sl_source *src, int world_size, unsigned char *take) {
  sl_status st = sl__plan_check_names(plan, src, world_size, take);
  if (st != SL_OK) return st;
  /* Resolve every taken tensor now, so placement and dtype errors surface in phase 1. */
  const size_t count = sl_source_tensor_count(src);
  for (size_t i = 0; i < count; i++) {
    const sl_source_tensor *t = sl_source_tensor_at(src, i);
    if (plan->nentries && !find_entry(plan, t->name)) continue;
    sl__resolved r;
    if ((st = sl__plan_resolve(plan, t, &r)) != SL_OK) return st;
  }
  return SL_OK;
}

/* The dry run's check: what sl_load's phase 1 checks (loader_plan.c runs sl__plan_check_names,
 * then resolves the same tensors in the same order, each once into its job), so `shardload
 * plan` fails where `load` would, with the same status and message. */
SL_API sl_status sl_plan_check(sl_plan *plan, const sl_source *src, int world_size) {
  if (!plan || !src) return SL_ERR_INVALID;
  if (world_size < 1)
    return sl__fail(plan->ctx, SL_ERR_INVALID, "sl_plan_check: world size %d; give 1 or more", world_size);
  return sl__plan_check(plan, src, world_size, NULL);
}

/* ---- digest and canonical form ------------------------------------------------------- */

static int cmp_entry_ptr(const void *a, const void *b) {
  return strcmp((*(const entry *const *)a)->name, (*(const entry *const *)b)->name);
}

static void put_spec(FILE *f, const spec *s) {
  char buf[128];
  if (!s->n) {
    fputs("-", f);
    return;
  }
  format_spec(s, buf, sizeof buf);
  fputs(buf, f);
}

/* Names are written with their length so that no name can fake a line of its own. Entries
 * are sorted by name: their order does not change what a plan does. */
char *sl__plan_canonical(const sl_plan *plan) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  char text[64];
  fputs("shardload-plan 1\n", f);
  if (plan->mesh_ndim) format_mesh(plan->mesh, plan->mesh_ndim, text, sizeof text);
  fprintf(f, "mesh %s\n", plan->mesh_ndim ? text : "world");
  fprintf(f, "offload %s\n", plan->policy.kind == SL_OFFLOAD_NONE ? "none"
                             : plan->policy.pin_memory            ? "cpu-pinned"
                                                                  : "cpu");
  fprintf(f, "param_dtype %s\n", plan->param_dtype ? sl_dtype_name(plan->param_dtype) : "file");
  fputs("default ", f);
  if (plan->default_pl.n) put_spec(f, &plan->default_pl);
  else fputs("fsdp2", f);
  fprintf(f, "\nstrict %d\n", plan->strict);
  for (size_t i = 0; i < plan->nrules; i++) {
    const rule *r = &plan->rules[i];
    fprintf(f, "rule %zu:%s placement ", strlen(r->pattern), r->pattern);
    put_spec(f, &r->placement);
    fprintf(f, " dtype %s\n", r->dtype ? sl_dtype_name(r->dtype) : "-");
  }
  const entry **sorted = plan->nentries ? malloc(plan->nentries * sizeof *sorted) : NULL;
  if (plan->nentries && !sorted) {
    fclose(f);
    free(buf);
    return NULL;
  }
  for (size_t i = 0; i < plan->nentries; i++) sorted[i] = &plan->entries[i];
  if (plan->nentries) qsort(sorted, plan->nentries, sizeof *sorted, cmp_entry_ptr);
  for (size_t i = 0; i < plan->nentries; i++) {
    const entry *e = sorted[i];
    fprintf(f, "entry %zu:%s placement ", strlen(e->name), e->name);
    put_spec(f, &e->placement);
    fprintf(f, " dtype %s\n", e->dtype ? sl_dtype_name(e->dtype) : "-");
  }
  free(sorted);
  if (fclose(f) != 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

uint64_t sl__plan_digest(const sl_plan *plan) {
  char *text = sl__plan_canonical(plan);
  if (!text) return 0; /* out of memory: 0 never matches a real digest by chance in practice */
  uint64_t h = XXH3_64bits(text, strlen(text));
  free(text);
  return h;
}

/* ---- dry run ------------------------------------------------------------------------- */

/* Computes into a full struct and copies out only out->size bytes: a caller compiled against an
 * older, shorter sl_shard_geometry gets the members it knows (shardload.h). */
static sl_status plan_geometry(sl_plan *plan, const sl_source_tensor *t, int rank, int world,
                               sl_shard_geometry *out);

SL_API sl_status sl_plan_geometry(sl_plan *plan, const sl_source_tensor *t, int rank, int world,
                                  sl_shard_geometry *out) {
  if (!plan || !t || !out) return SL_ERR_INVALID;
  if (out->size < sizeof out->size)
    return sl__fail(plan->ctx, SL_ERR_INVALID,
                    "sl_plan_geometry: set sl_shard_geometry.size to sizeof(sl_shard_geometry) (got %zu)", out->size);
  size_t n = out->size < sizeof *out ? out->size : sizeof *out;
  sl_shard_geometry full;
  sl_status st = plan_geometry(plan, t, rank, world, &full);
  if (st != SL_OK) return st;
  full.size = out->size; /* the caller's own value stays */
  memcpy(out, &full, n);
  return SL_OK;
}

static sl_status plan_geometry(sl_plan *plan, const sl_source_tensor *t, int rank, int world,
                               sl_shard_geometry *out) {
  if (world < 1 || rank < 0 || rank >= world)
    return sl__fail(plan->ctx, SL_ERR_INVALID, "rank %d is not in a job of %d ranks", rank, world);
  sl_status st = check_world(plan, world);
  if (st != SL_OK) return st;
  int mesh[SL_MAX_MESH_DIMS], coord[SL_MAX_MESH_DIMS];
  int mesh_ndim = sl__plan_mesh(plan, world, mesh);
  sl__mesh_coord(rank, mesh_ndim, mesh, coord);
  /* the one computation the loader uses too (sl__shard_of) */
  sl__resolved r;
  sl__region reg;
  uint64_t nbytes;
  if ((st = sl__shard_of(plan, t, mesh_ndim, mesh, coord, &r, &reg, &nbytes)) != SL_OK) return st;
  memset(out, 0, sizeof *out);
  out->ndim = t->ndim;
  out->dtype = r.dtype;
  out->nbytes = nbytes;
  out->replicated = 1;
  for (int m = 0; m < mesh_ndim; m++)
    if (r.placements[m].kind == SL_SHARD) out->replicated = 0;
  for (int d = 0; d < t->ndim; d++) {
    out->local_shape[d] = reg.len[d];
    out->global_offset[d] = reg.off[d];
  }
  /* as sl__plan_check decides: a plan with entries loads only the tensors it names */
  out->skipped = !takes(plan, t->name);
  return SL_OK;
}

SL_API int sl_plan_mesh(const sl_plan *plan, int world, int *dims) {
  if (!plan || !dims) return 0;
  return sl__plan_mesh(plan, world, dims);
}

SL_API sl_status sl_plan_describe(sl_plan *plan, const sl_source_tensor *t, char *buf, size_t len) {
  if (!plan || !t || !buf || len == 0) return SL_ERR_INVALID;
  sl__resolved r;
  sl_status st = sl__plan_resolve(plan, t, &r);
  if (st != SL_OK) return st;
  char text[128];
  format_placements(r.placements, plan->mesh_ndim ? plan->mesh_ndim : 1, true, text, sizeof text);
  if (strlen(text) >= len) {
    memcpy(buf, text, len - 1);
    buf[len - 1] = 0;
    return sl__fail(plan->ctx, SL_ERR_INVALID, "sl_plan_describe: %zu bytes are too few for '%s'", len, text);
  }
  memcpy(buf, text, strlen(text) + 1);
  return SL_OK;
}
