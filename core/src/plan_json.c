/* Reading a JSON plan file (format: README.md, "Plan files").
 *
 * The file is applied to a scratch plan first and merged into the caller's plan only when the
 * whole file is valid, so a bad file leaves the plan as it was. Every error names the file and
 * the JSON path of the offending value; unknown keys are errors, since a misspelt key would
 * otherwise silently load a different sharding. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "internal.h"

typedef struct jctx {
  sl_context *ctx;
  const char *file;
} jctx;

static sl_status jfail(const jctx *j, sl_status s, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static sl_status jfail(const jctx *j, sl_status s, const char *where, const char *fmt, ...) {
  char msg[SL__ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!where) return sl__fail(j->ctx, s, "%s: %s", j->file, msg);
  return sl__fail(j->ctx, s, "%s: %s: %s", j->file, where, msg);
}

/* A plan setter failed and left its message in the context: put the location in front. */
static sl_status jwrap(const jctx *j, sl_status s, const char *where) {
  char msg[SL__ERRMSG_LEN];
  snprintf(msg, sizeof msg, "%s", sl_context_errmsg(j->ctx));
  return sl__fail(j->ctx, s, "%s: %s: %s", j->file, where, msg);
}

static const char *jtype(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a number";
  case JSON_TRUE: return "true";
  case JSON_FALSE: return "false";
  default: return "null";
  }
}

/* Fails on the first key of OBJ not in KNOWN (a NULL-terminated list). */
static sl_status check_keys(const jctx *j, json_t *obj, const char *where, const char *what,
                            const char *const *known) {
  const char *key;
  json_t *v;
  json_object_foreach(obj, key, v) {
    bool ok = false;
    for (const char *const *k = known; *k && !ok; k++) ok = strcmp(*k, key) == 0;
    if (ok) continue;
    char list[256] = "";
    for (const char *const *k = known; *k; k++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k == known ? "" : ", ", *k);
    return jfail(j, SL_ERR_PLAN, where, "unknown key '%s' (%s keys are: %s)", key, what, list);
  }
  return SL_OK;
}

static sl_status get_string(const jctx *j, json_t *v, const char *where, const char *example,
                            const char **out) {
  if (json_is_null(v)) {
    *out = NULL;
    return SL_OK;
  }
  if (!json_is_string(v))
    return jfail(j, SL_ERR_PLAN, where, "expected a string such as %s, got %s", example, jtype(v));
  *out = json_string_value(v);
  return SL_OK;
}

static sl_status get_dtype(const jctx *j, json_t *v, const char *where, sl_dtype *out) {
  const char *s = NULL;
  sl_status st = get_string(j, v, where, "\"BF16\"", &s);
  if (st != SL_OK) return st;
  *out = s ? sl_dtype_from_name(s) : SL_DTYPE_INVALID;
  if (s && *out == SL_DTYPE_INVALID)
    return jfail(j, SL_ERR_DTYPE, where,
                 "'%s' is not a dtype; use F32, BF16, F16, F64 (or a torch name such as bfloat16)", s);
  return SL_OK;
}

static sl_status load_mesh(const jctx *j, sl_plan *plan, json_t *v) {
  size_t n = json_is_array(v) ? json_array_size(v) : 0;
  if (n < 1 || n > SL_MAX_MESH_DIMS) {
    char got[48];
    if (json_is_array(v)) snprintf(got, sizeof got, "an array of %zu", n);
    else snprintf(got, sizeof got, "%s", jtype(v));
    return jfail(j, SL_ERR_PLAN, "mesh", "expected an array of 1 to %d positive integers such as [2, 4], got %s",
                 SL_MAX_MESH_DIMS, got);
  }
  int dims[SL_MAX_MESH_DIMS];
  for (size_t i = 0; i < n; i++) {
    json_t *d = json_array_get(v, i);
    char where[32];
    snprintf(where, sizeof where, "mesh[%zu]", i);
    if (!json_is_integer(d) || json_integer_value(d) < 1 || json_integer_value(d) > INT32_MAX)
      return jfail(j, SL_ERR_PLAN, where, "expected a positive integer (ranks along this mesh dim), got %s",
                   json_is_integer(d) ? "a non-positive integer" : jtype(d));
    dims[i] = (int)json_integer_value(d);
  }
  sl_status st = sl_plan_set_mesh(plan, (int)n, dims);
  return st == SL_OK ? SL_OK : jwrap(j, st, "mesh");
}

static sl_status load_policy(const jctx *j, sl_plan *plan, json_t *v) {
  static const char *const keys[] = {"kind", "pin_memory", NULL};
  static const char hint[] = "use \"none\", \"cpu\", \"cpu-pinned\" or {\"kind\": \"cpu\", \"pin_memory\": true}";
  sl_offload_policy p = {SL_OFFLOAD_NONE, 0};
  const char *kind = NULL;
  if (json_is_string(v)) {
    kind = json_string_value(v);
    if (strcmp(kind, "cpu-pinned") == 0) kind = "cpu", p.pin_memory = 1;
  } else if (json_is_object(v)) {
    sl_status st = check_keys(j, v, "offload_policy", "an offload policy's", keys);
    if (st != SL_OK) return st;
    json_t *k = json_object_get(v, "kind"), *pin = json_object_get(v, "pin_memory");
    if (!json_is_string(k))
      return jfail(j, SL_ERR_PLAN, "offload_policy.kind", "expected \"none\" or \"cpu\", got %s",
                   k ? jtype(k) : "nothing");
    kind = json_string_value(k);
    if (pin && !json_is_boolean(pin))
      return jfail(j, SL_ERR_PLAN, "offload_policy.pin_memory", "expected true or false, got %s", jtype(pin));
    p.pin_memory = pin && json_is_true(pin);
    if (strcmp(kind, "none") != 0 && strcmp(kind, "cpu") != 0)
      return jfail(j, SL_ERR_PLAN, "offload_policy.kind", "'%s' is not an offload policy kind; use \"none\" or \"cpu\"", kind);
  } else {
    return jfail(j, SL_ERR_PLAN, "offload_policy", "expected a string or an object, got %s; %s", jtype(v), hint);
  }
  if (strcmp(kind, "cpu") == 0) p.kind = SL_OFFLOAD_CPU;
  else if (strcmp(kind, "none") != 0)
    return jfail(j, SL_ERR_PLAN, "offload_policy", "'%s' is not an offload policy; %s", kind, hint);
  sl_status st = sl_plan_set_offload_policy(plan, &p);
  return st == SL_OK ? SL_OK : jwrap(j, st, "offload_policy");
}

static sl_status load_rules(const jctx *j, sl_plan *plan, json_t *v) {
  static const char *const keys[] = {"match", "placement", "dtype", NULL};
  if (!json_is_array(v))
    return jfail(j, SL_ERR_PLAN, "rules", "expected an array of {\"match\": GLOB, \"placement\": ..., \"dtype\": ...}, got %s",
                 jtype(v));
  size_t i;
  json_t *r;
  json_array_foreach(v, i, r) {
    char where[64], sub[80];
    snprintf(where, sizeof where, "rules[%zu]", i);
    if (!json_is_object(r))
      return jfail(j, SL_ERR_PLAN, where, "expected an object such as {\"match\": \"*norm*\", \"placement\": \"replicate\"}, got %s",
                   jtype(r));
    sl_status st = check_keys(j, r, where, "a rule's", keys);
    if (st != SL_OK) return st;
    json_t *m = json_object_get(r, "match");
    snprintf(sub, sizeof sub, "%s.match", where);
    if (!json_is_string(m) || !*json_string_value(m))
      return jfail(j, SL_ERR_PLAN, m ? sub : where, "%s; give a glob over the whole tensor name such as \"*.bias\"",
                   m ? "expected a non-empty string" : "a rule needs \"match\"");
    const char *placement = NULL;
    sl_dtype dt = SL_DTYPE_INVALID;
    json_t *p = json_object_get(r, "placement"), *d = json_object_get(r, "dtype");
    snprintf(sub, sizeof sub, "%s.placement", where);
    if (p && (st = get_string(j, p, sub, "\"replicate\"", &placement)) != SL_OK) return st;
    snprintf(sub, sizeof sub, "%s.dtype", where);
    if (d && (st = get_dtype(j, d, sub, &dt)) != SL_OK) return st;
    if ((st = sl_plan_add_rule(plan, json_string_value(m), placement, dt)) != SL_OK) {
      snprintf(sub, sizeof sub, "%s.placement", where);
      return jwrap(j, st, placement ? sub : where);
    }
  }
  return SL_OK;
}

static sl_status load_tensors(const jctx *j, sl_plan *plan, json_t *v) {
  static const char *const keys[] = {"placement", "dtype", NULL};
  if (!json_is_object(v))
    return jfail(j, SL_ERR_PLAN, "tensors", "expected an object mapping tensor names to {\"placement\": ..., \"dtype\": ...}, got %s",
                 jtype(v));
  const char *name;
  json_t *e;
  json_object_foreach(v, name, e) {
    char where[SL__ERRMSG_LEN / 2], sub[SL__ERRMSG_LEN / 2 + 16];
    snprintf(where, sizeof where, "tensors[\"%s\"]", name);
    if (json_is_null(e)) e = NULL;
    else if (!json_is_object(e))
      return jfail(j, SL_ERR_PLAN, where, "expected an object such as {} or {\"placement\": \"shard(1)\"}, got %s",
                   jtype(e));
    sl_status st;
    const char *placement = NULL;
    sl_dtype dt = SL_DTYPE_INVALID;
    if (e) {
      if ((st = check_keys(j, e, where, "a tensor entry's", keys)) != SL_OK) return st;
      json_t *p = json_object_get(e, "placement"), *d = json_object_get(e, "dtype");
      snprintf(sub, sizeof sub, "%s.placement", where);
      if (p && (st = get_string(j, p, sub, "\"shard(0)\"", &placement)) != SL_OK) return st;
      snprintf(sub, sizeof sub, "%s.dtype", where);
      if (d && (st = get_dtype(j, d, sub, &dt)) != SL_OK) return st;
    }
    if ((st = sl_plan_add_entry(plan, name, placement, dt)) != SL_OK) {
      snprintf(sub, sizeof sub, "%s.placement", where);
      return jwrap(j, st, placement ? sub : where);
    }
  }
  return SL_OK;
}

/* Applies ROOT to PLAN in a fixed key order (the mesh first, so placement lists are checked
 * against it whatever order the file lists its keys in). */
static sl_status apply(const jctx *j, sl_plan *plan, json_t *root) {
  static const char *const keys[] = {"mesh", "offload_policy", "param_dtype", "default_placement",
                                     "strict", "rules", "tensors", NULL};
  sl_status st = check_keys(j, root, NULL, "the plan's", keys);
  if (st != SL_OK) return st;
  json_t *v;
  if ((v = json_object_get(root, "mesh")) && (st = load_mesh(j, plan, v)) != SL_OK) return st;
  if ((v = json_object_get(root, "offload_policy")) && (st = load_policy(j, plan, v)) != SL_OK) return st;
  if ((v = json_object_get(root, "param_dtype"))) {
    sl_dtype dt;
    if ((st = get_dtype(j, v, "param_dtype", &dt)) != SL_OK) return st;
    if ((st = sl_plan_set_param_dtype(plan, dt)) != SL_OK) return jwrap(j, st, "param_dtype");
  }
  if ((v = json_object_get(root, "default_placement"))) {
    const char *s = NULL;
    if ((st = get_string(j, v, "default_placement", "\"[replicate, shard(0)]\"", &s)) != SL_OK) return st;
    if ((st = sl_plan_set_default_placement(plan, s)) != SL_OK) return jwrap(j, st, "default_placement");
  }
  if ((v = json_object_get(root, "strict"))) {
    if (!json_is_boolean(v))
      return jfail(j, SL_ERR_PLAN, "strict", "expected true or false, got %s", jtype(v));
    sl_plan_set_strict(plan, json_is_true(v));
  }
  if ((v = json_object_get(root, "rules")) && (st = load_rules(j, plan, v)) != SL_OK) return st;
  if ((v = json_object_get(root, "tensors")) && (st = load_tensors(j, plan, v)) != SL_OK) return st;
  return SL_OK;
}

/* Out of memory parsing the plan file F: said as such with its size (a pipe has none to say). */
static sl_status plan_nomem(sl_context *ctx, const char *path, FILE *f) {
  char msg[SL__ERRMSG_LEN / 2];
  struct stat sb;
  if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode))
    sl__errbuf_nomem(msg, sizeof msg, "parsing", (size_t)sb.st_size, "plan");
  else
    snprintf(msg, sizeof msg, "out of memory parsing it; free memory or raise the process's memory limit");
  return sl__fail(ctx, SL_ERR_NOMEM, "%s: %s", path, msg);
}

/* PATH's JSON tree into *ROOT. The file is opened here rather than by jansson so that a read
 * error is told from the text (jansson's reader ends at a failed read and calls the text cut
 * short), and out of memory from both. */
static sl_status read_plan_file(sl_context *ctx, const char *path, json_t **root) {
  FILE *f = fopen(path, "rbe");
  if (!f) return sl__fail(ctx, SL_ERR_IO, "%s: cannot read the plan file: %s", path, strerror(errno));
  json_error_t je;
  bool nomem;
  *root = sl__json_loadf(f, &je, &nomem);
  int read_errno = errno;
  sl_status st = SL_OK;
  if (*root) goto out_close;
  if (ferror(f))
    st = sl__fail(ctx, SL_ERR_IO, "%s: cannot read the plan file: %s", path, strerror(read_errno));
  else if (nomem)
    st = plan_nomem(ctx, path, f);
  else
    st = sl__fail(ctx, SL_ERR_PLAN, "%s:%d:%d: not valid JSON: %s", path, je.line, je.column, je.text);
out_close:
  fclose(f);
  return st;
}

SL_API sl_status sl_plan_load_json(sl_plan *plan, const char *path) {
  if (!plan || !path) return SL_ERR_INVALID;
  sl_context *ctx = sl__plan_context(plan);
  jctx j = {ctx, path};
  json_t *root;
  sl_status st = read_plan_file(ctx, path, &root);
  if (st != SL_OK) return st;
  sl_plan *scratch = NULL;
  if (!json_is_object(root)) {
    st = sl__fail(ctx, SL_ERR_PLAN, "%s: a plan file holds one JSON object such as {\"mesh\": [8]}, not %s",
                  path, jtype(root));
    goto out_free_json;
  }
  if ((st = sl_plan_create(ctx, &scratch)) != SL_OK) goto out_free_json;
  /* The scratch plan sees the caller's mesh, so lists are checked against the mesh they will
   * meet when the file sets none. */
  int dims[SL_MAX_MESH_DIMS];
  int nd = sl__plan_mesh_explicit(plan, dims);
  if (nd && (st = sl_plan_set_mesh(scratch, nd, dims)) != SL_OK) goto out_destroy_scratch;
  if ((st = apply(&j, scratch, root)) != SL_OK) goto out_destroy_scratch;
  if ((st = sl__plan_merge(plan, scratch)) != SL_OK) st = jwrap(&j, st, "mesh");
out_destroy_scratch:
  sl_plan_destroy(scratch);
out_free_json:
  json_decref(root);
  return st;
}
