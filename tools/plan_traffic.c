/* shardload plan --hosts/--readers/--traffic: the bytes a scatter load would move, before it
 * runs, for rank 0 reading alone and for distributed readers (core/src/loader_readers.c).
 *
 * What the loader does (core/src/loader_send.c), counted here: the reader of a tensor sends
 * every other rank exactly that rank's part of it, in the wire dtype (the smaller of the file's
 * and the parameter's); under HSDP (a replicate mesh dim 0 over a 2-D+ mesh) it scatters within
 * its own replica q only, and each rank passes its part on to the rank at its position in the
 * neighbouring replica away from q, one hop per replica, both ways. A byte crosses a host's
 * link when it goes between ranks of different hosts.
 *
 * Cost: ranks whose coordinates agree on every mesh dim that shards a tensor hold the same
 * part (the loader's own grouping), so the library's geometry is asked once per distinct
 * part, and tensors of the same shape and placement (every layer of a model) share the answer:
 * a 405B-shaped checkpoint at world 512 asks a few thousand times, not 582,000. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ---- the parts: elements of each distinct part of a tensor ------------------------------- */

/* Tensors of one shape and placement have the same parts: a small table of them, by hash. */
typedef struct part_kind {
  int ndim;
  int64_t shape[SL_MAX_DIMS];
  sl_mesh_placement pl[SL_MAX_MESH_DIMS];
  uint64_t *elems; /* per key (coordinate over the sharded mesh dims) */
  struct part_kind *next;
} part_kind;

enum { KIND_BUCKETS = 1024 };
/* the table stops growing past this many cached elements (32 MiB): beyond, each tensor's
 * parts are asked anew, which is only slower */
#define KIND_CACHE_LIMIT ((size_t)4 << 20)

typedef struct traffic_calc {
  sl_context *ctx;
  sl_plan *plan;
  int world, mesh_ndim, mesh[SL_MAX_MESH_DIMS];
  int *coord; /* world x mesh_ndim: each rank's mesh coordinate */
  int *keyof; /* per rank: its key under the sharded mask KEY_MASK */
  unsigned key_mask;
  int nkeys;
  uint64_t *scratch; /* nkeys elements when the tensor's kind is not cached */
  part_kind *bucket[KIND_BUCKETS];
  size_t cached;
} traffic_calc;

static unsigned shard_mask(const traffic_calc *c, const sl_mesh_placement *pl) {
  unsigned m = 0;
  for (int d = 0; d < c->mesh_ndim; d++)
    if (pl[d].kind == SL_SHARD) m |= 1u << d;
  return m;
}

/* Each rank's key: its coordinate over the mesh dims in MASK, row-major (the loader's
 * compute_groups key). */
static void set_keys(traffic_calc *c, unsigned mask) {
  if (mask == c->key_mask && c->nkeys) return;
  c->key_mask = mask;
  c->nkeys = 1;
  for (int d = 0; d < c->mesh_ndim; d++)
    if (mask & (1u << d)) c->nkeys *= c->mesh[d];
  for (int r = 0; r < c->world; r++) {
    int key = 0;
    for (int d = 0; d < c->mesh_ndim; d++)
      if (mask & (1u << d)) key = key * c->mesh[d] + c->coord[r * c->mesh_ndim + d];
    c->keyof[r] = key;
  }
}

static size_t kind_hash(const sl_source_tensor *t, const sl_mesh_placement *pl, int mesh_ndim) {
  uint64_t h = 1469598103934665603ull ^ (uint64_t)t->ndim;
  for (int d = 0; d < t->ndim; d++) h = (h ^ (uint64_t)t->shape[d]) * 1099511628211ull;
  for (int m = 0; m < mesh_ndim; m++) h = (h ^ (uint64_t)(pl[m].kind * 64 + pl[m].dim + 32)) * 1099511628211ull;
  return (size_t)(h % KIND_BUCKETS);
}

static int kind_is(const part_kind *k, const sl_source_tensor *t, const sl_mesh_placement *pl, int mesh_ndim) {
  if (k->ndim != t->ndim || memcmp(k->shape, t->shape, (size_t)t->ndim * sizeof *t->shape) != 0) return 0;
  for (int m = 0; m < mesh_ndim; m++)
    if (k->pl[m].kind != pl[m].kind || k->pl[m].dim != pl[m].dim) return 0;
  return 1;
}

/* The elements of every distinct part of T (placements PL), by key (set_keys already made
 * for PL's mask): from the kind table, or asked of the library once per key (the first rank
 * holding it). FIRST: rank 0's geometry, already asked. NULL after printing the error line. */
static const uint64_t *parts_of(traffic_calc *c, const sl_source_tensor *t, const sl_mesh_placement *pl,
                                const sl_shard_geometry *first) {
  size_t h = kind_hash(t, pl, c->mesh_ndim);
  for (part_kind *k = c->bucket[h]; k; k = k->next)
    if (kind_is(k, t, pl, c->mesh_ndim)) return k->elems;
  uint64_t *elems = c->scratch;
  part_kind *k = NULL;
  if (c->cached + (size_t)c->nkeys <= KIND_CACHE_LIMIT && (k = calloc(1, sizeof *k)) != NULL &&
      (k->elems = malloc((size_t)c->nkeys * sizeof *k->elems)) != NULL) {
    elems = k->elems;
  } else if (k) {
    free(k);
    k = NULL;
  }
  for (int i = 0; i < c->nkeys; i++) elems[i] = UINT64_MAX;
  for (int r = 0; r < c->world; r++) {
    uint64_t *e = &elems[c->keyof[r]];
    if (*e != UINT64_MAX) continue;
    sl_shard_geometry g = *first;
    g.size = sizeof g;
    sl_status s = r == 0 ? SL_OK : sl_plan_geometry(c->plan, t, r, c->world, &g);
    if (s != SL_OK) {
      cli_fail(t->name, s, c->ctx);
      if (k) free(k->elems), free(k);
      return NULL;
    }
    uint64_t n = 1;
    for (int d = 0; d < g.ndim; d++) n *= (uint64_t)g.local_shape[d];
    *e = n;
  }
  if (k) {
    k->ndim = t->ndim;
    memcpy(k->shape, t->shape, sizeof k->shape);
    memcpy(k->pl, pl, (size_t)c->mesh_ndim * sizeof *pl);
    k->next = c->bucket[h];
    c->bucket[h] = k;
    c->cached += (size_t)c->nkeys;
  }
  return elems;
}

static void calc_free(traffic_calc *c) {
  for (int b = 0; b < KIND_BUCKETS; b++)
    for (part_kind *k = c->bucket[b], *next; k; k = next) {
      next = k->next;
      free(k->elems);
      free(k);
    }
  free(c->coord);
  free(c->keyof);
  free(c->scratch);
}

/* ---- the sums ------------------------------------------------------------------------------- */

static int host_of(const cli_traffic *t, int rank) { return rank / t->ranks_per_host; }

/* B bytes from rank FROM to rank TO. */
static void move(const cli_traffic *t, cli_traffic_mode *m, int from, int to, uint64_t b) {
  m->sent[from] += b;
  m->received[to] += b;
  int hf = host_of(t, from), ht = host_of(t, to);
  if (hf != ht) {
    m->link_sent[hf] += b;
    m->link_received[ht] += b;
  }
}

/* One tensor read by ROOT: PART(r) bytes reach each rank r. */
static void tensor_moves(const cli_traffic *t, cli_traffic_mode *m, int root, int hsdp, int replicas,
                         const traffic_calc *c, const uint64_t *elems, uint64_t esize) {
  const int world = t->world;
#define PART(r) (elems[c->keyof[r]] * esize)
  if (!hsdp) {
    for (int r = 0; r < world; r++)
      if (r != root) move(t, m, root, r, PART(r));
    return;
  }
  /* the scatter within the root's replica q, then the chain away from q both ways */
  int SR = world / replicas, q = root / SR;
  for (int r = q * SR; r < q * SR + SR; r++)
    if (r != root) move(t, m, root, r, PART(r));
  for (int rep = 0; rep < replicas; rep++) {
    if (rep == q) continue;
    int from = rep > q ? rep - 1 : rep + 1;
    for (int sh = 0; sh < SR; sh++) move(t, m, from * SR + sh, rep * SR + sh, PART(rep * SR + sh));
  }
#undef PART
}

static int mode_alloc(cli_traffic_mode *m, int world, int hosts, int nreaders) {
  m->nreaders = nreaders;
  m->reader_rank = calloc((size_t)world, sizeof *m->reader_rank);
  m->read = calloc((size_t)world, sizeof *m->read);
  m->sent = calloc((size_t)world, sizeof *m->sent);
  m->received = calloc((size_t)world, sizeof *m->received);
  m->link_sent = calloc((size_t)hosts, sizeof *m->link_sent);
  m->link_received = calloc((size_t)hosts, sizeof *m->link_received);
  return m->reader_rank && m->read && m->sent && m->received && m->link_sent && m->link_received ? 0 : -1;
}

static void mode_free(cli_traffic_mode *m) {
  free(m->reader_rank);
  free(m->read);
  free(m->sent);
  free(m->received);
  free(m->link_sent);
  free(m->link_received);
}

void cli_traffic_free(cli_traffic *t) {
  mode_free(&t->rank0);
  mode_free(&t->readers);
  memset(t, 0, sizeof *t);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The figures every report shows of a mode: largest share read, most sent by one rank, the
 * busiest link, received min/median/max. SORTED: room for the world. */
static void mode_summary(const cli_traffic *t, cli_traffic_mode *m, uint64_t *sorted) {
  for (int i = 0; i < m->nreaders; i++)
    if (m->read[i] > m->largest_read) m->largest_read = m->read[i];
  for (int r = 0; r < t->world; r++)
    if (m->sent[r] > m->max_sent) m->max_sent = m->sent[r], m->max_sent_rank = r;
  for (int h = 0; h < t->hosts; h++) {
    if (m->link_sent[h] > m->busiest_link) m->busiest_link = m->link_sent[h], m->busiest_host = h, m->busiest_in = 0;
    if (m->link_received[h] > m->busiest_link)
      m->busiest_link = m->link_received[h], m->busiest_host = h, m->busiest_in = 1;
  }
  memcpy(sorted, m->received, (size_t)t->world * sizeof *sorted);
  qsort(sorted, (size_t)t->world, sizeof *sorted, cmp_u64);
  m->received_min = sorted[0];
  m->received_median = sorted[(t->world - 1) / 2];
  m->received_max = sorted[t->world - 1];
}

/* The tensors the load takes (rank 0's geometry says skipped for the others), with rank 0's
 * geometry and each one's placements. */
typedef struct taken_tensor {
  const sl_source_tensor *t;
  sl_shard_geometry g;
  sl_mesh_placement pl[SL_MAX_MESH_DIMS];
} taken_tensor;

static int take_tensors(traffic_calc *c, const sl_source *src, taken_tensor *out, size_t *kept) {
  size_t n = sl_source_tensor_count(src), k = 0;
  for (size_t i = 0; i < n; i++) {
    taken_tensor *w = &out[k];
    char desc[160];
    w->t = sl_source_tensor_at(src, i);
    w->g.size = sizeof w->g;
    sl_status s = sl_plan_geometry(c->plan, w->t, 0, c->world, &w->g);
    if (s == SL_OK && w->g.skipped) continue;
    if (s == SL_OK) s = sl_plan_describe(c->plan, w->t, desc, sizeof desc);
    if (s == SL_OK) s = sl_placement_parse(desc, c->mesh_ndim, w->pl);
    if (s != SL_OK) return cli_fail(w->t->name, s, c->ctx);
    k++;
  }
  *kept = k;
  return CLI_EXIT_OK;
}

int cli_traffic_compute(sl_context *ctx, const char *path, sl_plan *plan, const sl_source *src, int world, int hosts,
                        int readers, cli_traffic *t) {
  memset(t, 0, sizeof *t);
  traffic_calc c = {.ctx = ctx, .plan = plan, .world = world};
  c.mesh_ndim = sl_plan_mesh(plan, world, c.mesh);
  t->world = world;
  t->hosts = hosts;
  t->ranks_per_host = world / hosts;
  t->readers_asked = readers;
  for (int d = 0; d < c.mesh_ndim; d++) t->mesh[d] = c.mesh[d];
  t->mesh_ndim = c.mesh_ndim;
  const char *subject = path;
  size_t n = sl_source_tensor_count(src);
  taken_tensor *tk = calloc(n ? n : 1, sizeof *tk);
  const sl_source_tensor **list = calloc(n ? n : 1, sizeof *list);
  int *share = calloc(n ? n : 1, sizeof *share), *hostv = calloc((size_t)world, sizeof *hostv);
  uint64_t *sorted = calloc((size_t)world, sizeof *sorted);
  c.coord = calloc((size_t)world * (size_t)c.mesh_ndim, sizeof *c.coord);
  c.keyof = calloc((size_t)world, sizeof *c.keyof);
  c.scratch = calloc((size_t)world, sizeof *c.scratch);
  int rc = CLI_EXIT_ERROR;
  if (!tk || !list || !share || !hostv || !sorted || !c.coord || !c.keyof || !c.scratch ||
      mode_alloc(&t->rank0, world, hosts, 1) != 0 || mode_alloc(&t->readers, world, hosts, 0) != 0) {
    cli_error(subject, SL_ERR_NOMEM, "out of memory for the traffic of %d ranks and %zu tensors", world, n);
    goto out;
  }
  for (int r = 0; r < world; r++) {
    hostv[r] = host_of(t, r);
    for (int d = c.mesh_ndim - 1, x = r; d >= 0; d--) {
      c.coord[r * c.mesh_ndim + d] = x % c.mesh[d];
      x /= c.mesh[d];
    }
  }
  size_t kept = 0;
  if ((rc = take_tensors(&c, src, tk, &kept)) != CLI_EXIT_OK) goto out;
  rc = CLI_EXIT_ERROR;
  t->tensors = kept;

  /* who reads what: rank 0 everything; the readers as sl_load chooses and shares */
  t->rank0.reader_rank[0] = 0;
  int R = sl_readers_choose(world, hostv, readers, t->readers.reader_rank);
  if (R < 1) {
    cli_error(subject, SL_ERR_NOMEM, "out of memory choosing %d readers among %d ranks", readers, world);
    goto out;
  }
  t->readers.nreaders = R;
  for (size_t i = 0; i < kept; i++) list[i] = tk[i].t;
  if (kept) sl_readers_share(kept, list, R, share);

  const int hsdp_mesh = c.mesh_ndim >= 2 && c.mesh[0] > 1;
  for (size_t i = 0; i < kept; i++) {
    const taken_tensor *w = &tk[i];
    size_t fs = sl_dtype_size(w->t->dtype), ps = sl_dtype_size(w->g.dtype);
    uint64_t esize = fs < ps ? fs : ps;
    int hsdp = hsdp_mesh && w->pl[0].kind == SL_REPLICATE;
    set_keys(&c, shard_mask(&c, w->pl));
    const uint64_t *elems = parts_of(&c, w->t, w->pl, &w->g);
    if (!elems) goto out;
    t->read_bytes += w->t->nbytes;
    t->rank0.read[0] += w->t->nbytes;
    t->readers.read[share[i]] += w->t->nbytes;
    tensor_moves(t, &t->rank0, 0, hsdp, c.mesh[0], &c, elems, esize);
    tensor_moves(t, &t->readers, t->readers.reader_rank[share[i]], hsdp, c.mesh[0], &c, elems, esize);
  }
  mode_summary(t, &t->rank0, sorted);
  mode_summary(t, &t->readers, sorted);
  rc = CLI_EXIT_OK;
out:
  if (rc != CLI_EXIT_OK) cli_traffic_free(t);
  calc_free(&c);
  free(tk);
  free(list);
  free(share);
  free(hostv);
  free(sorted);
  return rc;
}

/* ---- the report ----------------------------------------------------------------------------- */

static const char *link_str(char *buf, size_t len, const cli_traffic_mode *m) {
  char hb[32];
  if (!m->busiest_link) snprintf(buf, len, "none (0 B)");
  else
    snprintf(buf, len, "host %d %s %s", m->busiest_host, m->busiest_in ? "in" : "out",
             cli_human_bytes(hb, sizeof hb, m->busiest_link));
  return buf;
}

static void headline_row(cli_out *o, const char *what, uint64_t a, uint64_t b) {
  char x[32], y[32];
  cli_out_printf(o, "  %-22s  %-26s  %s\n", what, cli_human_bytes(x, sizeof x, a), cli_human_bytes(y, sizeof y, b));
}

void cli_traffic_table(cli_out *o, const cli_traffic *t, int only_rank) {
  const cli_traffic_mode *a = &t->rank0, *b = &t->readers;
  char x[64], y[64], hb[32];
  cli_out_printf(o, "traffic of a scatter load: %d host%s of %d rank%s; %zu tensors, %llu bytes read (%s)\n", t->hosts,
                 t->hosts == 1 ? "" : "s", t->ranks_per_host, t->ranks_per_host == 1 ? "" : "s", t->tensors,
                 (unsigned long long)t->read_bytes, cli_human_bytes(hb, sizeof hb, t->read_bytes));
  snprintf(x, sizeof x, "%d reader%s", b->nreaders, b->nreaders == 1 ? "" : "s");
  cli_out_printf(o, "  %-22s  %-26s  %s\n", "", "rank 0 reads", x);
  headline_row(o, "largest share read", a->largest_read, b->largest_read);
  headline_row(o, "rank 0 sends", a->sent[0], b->sent[0]);
  headline_row(o, "most one rank sends", a->max_sent, b->max_sent);
  cli_out_printf(o, "  %-22s  %-26s  %s\n", "busiest link", link_str(x, sizeof x, a), link_str(y, sizeof y, b));
  headline_row(o, "received: min", a->received_min, b->received_min);
  headline_row(o, "received: median", a->received_median, b->received_median);
  headline_row(o, "received: max", a->received_max, b->received_max);

  cli_out_printf(o, "readers (distributed), bytes:\n  %6s  %7s  %5s  %16s  %16s\n", "READER", "RANK", "HOST", "READ",
                 "SENT");
  for (int i = 0; i < b->nreaders && !o->err; i++) {
    int r = b->reader_rank[i];
    cli_out_printf(o, "  %6d  %7d  %5d  %16llu  %16llu\n", i, r, host_of(t, r), (unsigned long long)b->read[i],
                   (unsigned long long)b->sent[r]);
  }
  cli_out_printf(o,
                 "hosts, bytes over each host's link (rank 0 reads | readers):\n  %5s  %15s  %16s  %16s  %16s  %16s\n",
                 "HOST", "RANKS", "OUT", "IN", "OUT", "IN");
  for (int h = 0; h < t->hosts && !o->err; h++) {
    snprintf(x, sizeof x, "%d-%d", h * t->ranks_per_host, h * t->ranks_per_host + t->ranks_per_host - 1);
    cli_out_printf(o, "  %5d  %15s  %16llu  %16llu  %16llu  %16llu\n", h, x, (unsigned long long)a->link_sent[h],
                   (unsigned long long)a->link_received[h], (unsigned long long)b->link_sent[h],
                   (unsigned long long)b->link_received[h]);
  }
  if (t->world > CLI_TRAFFIC_LIST_RANKS && only_rank < 0) {
    cli_out_printf(o, "ranks: %d (listed up to %d; give --rank R for one)\n", t->world, CLI_TRAFFIC_LIST_RANKS);
    return;
  }
  cli_out_printf(o, "ranks, bytes (rank 0 reads | readers):\n  %7s  %5s  %16s  %16s  %16s  %16s\n", "RANK", "HOST",
                 "RECEIVED", "SENT", "RECEIVED", "SENT");
  for (int r = 0; r < t->world && !o->err; r++) {
    if (only_rank >= 0 && r != only_rank) continue;
    cli_out_printf(o, "  %7d  %5d  %16llu  %16llu  %16llu  %16llu\n", r, host_of(t, r),
                   (unsigned long long)a->received[r], (unsigned long long)a->sent[r],
                   (unsigned long long)b->received[r], (unsigned long long)b->sent[r]);
  }
}

static json_t *u64_array(const uint64_t *v, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n && a; i++)
    if (json_array_append_new(a, json_integer((json_int_t)v[i])) != 0) {
      json_decref(a);
      return NULL;
    }
  return a;
}

static json_t *mode_json(const cli_traffic *t, const cli_traffic_mode *m) {
  json_t *o = json_object(), *rd = json_array(), *hs = json_array(), *link = json_object(), *rec = json_object();
  int bad = !o || !rd || !hs || !link || !rec;
  for (int i = 0; i < m->nreaders && !bad; i++) {
    json_t *e = json_object();
    int r = m->reader_rank[i];
    bad |= json_object_set_new(e, "rank", json_integer(r));
    bad |= json_object_set_new(e, "host", json_integer(host_of(t, r)));
    bad |= json_object_set_new(e, "read_bytes", json_integer((json_int_t)m->read[i]));
    bad |= json_object_set_new(e, "sent_bytes", json_integer((json_int_t)m->sent[r]));
    bad |= json_array_append_new(rd, e);
  }
  for (int h = 0; h < t->hosts && !bad; h++) {
    json_t *e = json_object();
    bad |= json_object_set_new(e, "host", json_integer(h));
    bad |= json_object_set_new(e, "first_rank", json_integer(h * t->ranks_per_host));
    bad |= json_object_set_new(e, "link_sent_bytes", json_integer((json_int_t)m->link_sent[h]));
    bad |= json_object_set_new(e, "link_received_bytes", json_integer((json_int_t)m->link_received[h]));
    bad |= json_array_append_new(hs, e);
  }
  bad |= json_object_set_new(link, "host", m->busiest_link ? json_integer(m->busiest_host) : json_null());
  bad |= json_object_set_new(link, "direction",
                             m->busiest_link ? json_string(m->busiest_in ? "in" : "out") : json_null());
  bad |= json_object_set_new(link, "bytes", json_integer((json_int_t)m->busiest_link));
  bad |= json_object_set_new(rec, "min", json_integer((json_int_t)m->received_min));
  bad |= json_object_set_new(rec, "median", json_integer((json_int_t)m->received_median));
  bad |= json_object_set_new(rec, "max", json_integer((json_int_t)m->received_max));
  bad |= json_object_set_new(o, "reader_count", json_integer(m->nreaders));
  bad |= json_object_set_new(o, "largest_read_bytes", json_integer((json_int_t)m->largest_read));
  bad |= json_object_set_new(o, "rank0_sent_bytes", json_integer((json_int_t)m->sent[0]));
  bad |= json_object_set_new(o, "max_sent_bytes", json_integer((json_int_t)m->max_sent));
  bad |= json_object_set_new(o, "busiest_link", link);
  bad |= json_object_set_new(o, "received_bytes", rec);
  bad |= json_object_set_new(o, "readers", rd);
  bad |= json_object_set_new(o, "hosts", hs);
  bad |= json_object_set_new(o, "rank_received_bytes", u64_array(m->received, t->world));
  bad |= json_object_set_new(o, "rank_sent_bytes", u64_array(m->sent, t->world));
  if (!bad) return o;
  json_decref(o);
  return NULL;
}

json_t *cli_traffic_json(const cli_traffic *t) {
  json_t *o = json_object();
  int bad = !o;
  bad |= json_object_set_new(o, "strategy", json_string("scatter"));
  bad |= json_object_set_new(o, "hosts", json_integer(t->hosts));
  bad |= json_object_set_new(o, "ranks_per_host", json_integer(t->ranks_per_host));
  bad |= json_object_set_new(o, "tensors", json_integer((json_int_t)t->tensors));
  bad |= json_object_set_new(o, "read_bytes", json_integer((json_int_t)t->read_bytes));
  bad |= json_object_set_new(o, "rank0", mode_json(t, &t->rank0));
  bad |= json_object_set_new(o, "readers", mode_json(t, &t->readers));
  if (!bad) return o;
  json_decref(o);
  return NULL;
}
