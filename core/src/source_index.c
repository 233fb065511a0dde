/* model.safetensors.index.json: parsing it into a table of tensor names and file names, and
 * the path rule that confines every file it names to the index's own directory by spelling
 * alone (docs/DESIGN.md#files). Reached from a buffer so the fuzzer can drive it; opening the
 * files it names is source.c's. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "source_impl.h"

/* ---- index.json ----------------------------------------------------------------------- */

void sl__index_free(sl__index *ix) {
  if (!ix) return;
  for (size_t i = 0; i < ix->file_count; i++) free(ix->files[i]);
  free(ix->files);
  for (size_t i = 0; i < ix->count; i++) free(ix->names[i]);
  free(ix->names);
  free(ix->file_of);
  sl__free_pairs(ix->meta_keys, ix->meta_values, ix->meta_count);
  memset(ix, 0, sizeof *ix);
}

int sl__strp_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* "metadata" values become strings: strings as they are, anything else as compact JSON
 * (transformers writes {"total_size": 123}, an integer). */
static sl_status index_metadata(const json_t *meta, sl__index *out, char *err, size_t errlen) {
  size_t n = json_object_size(meta);
  if (!n) return SL_OK;
  if (!sl__alloc_pairs(n, &out->meta_keys, &out->meta_values))
    return sl__errbuf(err, errlen, SL_ERR_NOMEM, "out of memory");
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)meta, key, val) {
    size_t i = out->meta_count++;
    out->meta_keys[i] = strdup(key);
    out->meta_values[i] = json_is_string(val) ? strdup(json_string_value(val))
                                              : json_dumps(val, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!out->meta_keys[i] || !out->meta_values[i]) return sl__errbuf(err, errlen, SL_ERR_NOMEM, "out of memory");
  }
  return SL_OK;
}

/* The path rule (docs/DESIGN.md#files): a weight_map file name is confined to
 * the index's directory lexically, by its spelling alone, before anything is opened. Symlinks
 * in that directory are followed: where they point is the directory owner's choice (the
 * Hugging Face cache links snapshots/<rev>/<file> to ../../blobs/<sha256>). */
const char *sl__index_entry_problem(const char *entry, size_t len) {
  if (!len) return "is empty";
  if (memchr(entry, 0, len)) return "holds a NUL byte";
  if (entry[0] == '/') return "is an absolute path";
  /* a separator on Windows, where "..\\x" escapes; one spelling per file everywhere */
  if (memchr(entry, '\\', len)) return "holds a backslash";
  const char *c = entry, *end = entry + len;
  while (c <= end) {
    const char *slash = memchr(c, '/', (size_t)(end - c));
    size_t n = (size_t)((slash ? slash : end) - c);
    if (n == 0) return "has an empty path component (a doubled or trailing '/')";
    if (n == 2 && c[0] == '.' && c[1] == '.') return "has a '..' component";
    if (n == 1 && c[0] == '.') return "has a '.' component";
    if (!slash) break;
    c = slash + 1;
  }
  return NULL;
}

static sl_status index_weight_map(const json_t *wm, sl__index *out, char *err, size_t errlen) {
  size_t n = json_object_size(wm);
  if (!n) return sl__errbuf(err, errlen, SL_ERR_FORMAT, "weight_map is empty; it must map every tensor to its file");
  out->names = calloc(n, sizeof(char *));
  out->file_of = calloc(n, sizeof(size_t));
  char **all = calloc(n, sizeof(char *)); /* borrowed file names, one per entry */
  if (!out->names || !out->file_of || !all) {
    free(all);
    return sl__errbuf(err, errlen, SL_ERR_NOMEM, "out of memory");
  }
  sl_status s = SL_OK;
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)wm, key, val) {
    if (!json_is_string(val) || !json_string_length(val)) {
      s = sl__errbuf(err, errlen, SL_ERR_FORMAT, "weight_map entry '%s' must be a non-empty file name string", key);
      goto out_all;
    }
    const char *problem = sl__index_entry_problem(json_string_value(val), json_string_length(val));
    if (problem) {
      s = sl__errbuf(err, errlen, SL_ERR_FORMAT,
                     "weight_map puts tensor '%s' in '%s', which %s; the index must name files inside its own "
                     "directory (relative names without '.', '..' or empty components, such as "
                     "model-00001-of-00002.safetensors)",
                     key, json_string_value(val), problem);
      goto out_all;
    }
    if (!(out->names[out->count] = strdup(key))) {
      s = sl__errbuf(err, errlen, SL_ERR_NOMEM, "out of memory");
      goto out_all;
    }
    all[out->count++] = (char *)json_string_value(val);
  }
  /* distinct file names, sorted: they fix the file order */
  char **sorted = malloc(n * sizeof(char *));
  if (!sorted) {
    s = sl__errbuf(err, errlen, SL_ERR_NOMEM, "out of memory");
    goto out_all;
  }
  memcpy(sorted, all, n * sizeof(char *));
  qsort(sorted, n, sizeof(char *), sl__strp_cmp);
  size_t distinct = 0;
  for (size_t i = 0; i < n; i++)
    if (!distinct || strcmp(sorted[distinct - 1], sorted[i])) sorted[distinct++] = sorted[i];
  out->files = calloc(distinct, sizeof(char *));
  if (!out->files) {
    s = sl__errbuf(err, errlen, SL_ERR_NOMEM, "out of memory");
    goto out_sorted;
  }
  for (size_t i = 0; i < distinct; i++) {
    if (!(out->files[i] = strdup(sorted[i]))) {
      s = sl__errbuf(err, errlen, SL_ERR_NOMEM, "out of memory");
      goto out_sorted;
    }
    out->file_count++;
  }
  for (size_t i = 0; i < n; i++) {
    char **hit = bsearch(&all[i], out->files, out->file_count, sizeof(char *), sl__strp_cmp);
    out->file_of[i] = (size_t)(hit - out->files);
  }
out_sorted:
  free(sorted);
out_all:
  free(all);
  return s;
}

sl_status sl__index_parse(const char *buf, size_t len, sl__index *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (err && errlen) err[0] = 0;
  json_error_t jerr;
  bool nomem;
  json_t *root = sl__json_loadb(buf, len, &jerr, &nomem);
  if (nomem) return sl__errbuf_nomem(err, errlen, "parsing", len, "index");
  if (!root)
    return sl__errbuf(err, errlen, SL_ERR_FORMAT, "not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                  jerr.column);
  sl_status s = SL_OK;
  if (!json_is_object(root)) {
    s = sl__errbuf(err, errlen, SL_ERR_FORMAT, "the index must be a JSON object with a weight_map");
    goto out_root;
  }
  const json_t *wm = json_object_get(root, "weight_map");
  if (!json_is_object(wm)) {
    s = sl__errbuf(err, errlen, SL_ERR_FORMAT, "%s", wm ? "weight_map must be an object of tensor name -> file name"
                                                    : "no weight_map (is this a model.safetensors.index.json?)");
    goto out_root;
  }
  const json_t *meta = json_object_get(root, "metadata");
  if (meta && !json_is_null(meta) && !json_is_object(meta)) {
    s = sl__errbuf(err, errlen, SL_ERR_FORMAT, "metadata must be an object");
    goto out_root;
  }
  /* out of memory past the parse is said the same way: with the index's size */
  if ((s = index_weight_map(wm, out, err, errlen)) != SL_OK) {
    if (s == SL_ERR_NOMEM) s = sl__errbuf_nomem(err, errlen, "keeping the weight_map of", len, "index");
    goto out_root;
  }
  if (json_is_object(meta) && (s = index_metadata(meta, out, err, errlen)) == SL_ERR_NOMEM)
    s = sl__errbuf_nomem(err, errlen, "keeping the metadata of", len, "index");
out_root:
  json_decref(root);
  if (s != SL_OK) sl__index_free(out);
  return s;
}
