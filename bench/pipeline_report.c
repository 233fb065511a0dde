/* bench_pipeline's report: medians, one table per part, the ratios, the JSON rows, and the
 * --check invariants. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_pipeline.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double median(const double *v, int n) {
  double s[MAX_REPS];
  if (n <= 0) return 0.0;
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* ---- report ----------------------------------------------------------------------------- */

typedef struct summary {
  double load, read0, wait0, busy0, phase1, overlap;
  /* Of rank 0's reading, the share its main thread did not wait for: (read + busy - seconds) /
   * read = 1 - wait / read, per run. It needs no other run to compare with, so the VM's drift
   * between runs does not enter it: about 0 serially, 1 when reading is wholly hidden. Waits
   * for events and status count too, so it understates the overlap (the device route waits
   * for its device work there: it goes below 0). */
  double hidden0;
} summary;

static summary summarize(const measured *m) {
  double read[MAX_REPS], wait[MAX_REPS], busy[MAX_REPS], p1[MAX_REPS], hid[MAX_REPS];
  for (int i = 0; i < m->n; i++) {
    const sl_load_stats *r = &m->rank0[i];
    hid[i] = r->seconds_read > 0 ? (r->seconds_read - r->seconds_wait) / r->seconds_read : 0.0;
    read[i] = r->seconds_read;
    wait[i] = r->seconds_wait;
    busy[i] = r->seconds - r->seconds_wait;
    p1[i] = r->seconds_phase1;
  }
  summary s = {median(m->seconds, m->n), median(read, m->n), median(wait, m->n),
               median(busy, m->n),       median(p1, m->n),   median(m->overlap, m->n), median(hid, m->n)};
  return s;
}

/* Which memory the data collective moved: Gloo (and local) host memory, the others device. */
static const char *route_of(const measured *m) {
  return !strcmp(m->collective, "gloo") || !strcmp(m->collective, "local") ? "host" : "device";
}

static json_t *stats_json(const sl_load_stats *s) {
  return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f}", "bytes_read",
                   (json_int_t)s->bytes_read, "bytes_sent", (json_int_t)s->bytes_sent, "bytes_received",
                   (json_int_t)s->bytes_received, "bytes_h2d", (json_int_t)s->bytes_h2d, "bytes_d2h",
                   (json_int_t)s->bytes_d2h, "staging_bytes", (json_int_t)s->staging_bytes, "device_staging_bytes",
                   (json_int_t)s->device_staging_bytes, "transfers", (json_int_t)s->transfers, "seconds", s->seconds,
                   "seconds_read", s->seconds_read, "seconds_wait", s->seconds_wait, "seconds_phase1",
                   s->seconds_phase1);
}

json_t *row_json(const group *g, const variant *v, const measured *m) {
  summary s = summarize(m);
  json_t *runs = json_array();
  for (int i = 0; i < m->n; i++)
    json_array_append_new(
        runs, json_pack("{s:f, s:f, s:I, s:o}", "load_seconds", m->seconds[i], "overlap", m->overlap[i],
                        "bytes_sent_all_ranks", (json_int_t)m->sent_all[i], "rank0", stats_json(&m->rank0[i])));
  json_t *row =
      json_pack("{s:i, s:s, s:s, s:s, s:s, s:i, s:s, s:i, s:b, s:s, s:I, s:I}", "part", g->part, "loader",
                g->cli_args ? "before7 (--baseline-bin)" : "this build", "backend", g->backend, "collective",
                m->collective, "route", route_of(m), "world", g->world, "variant", v->label, "pipeline_slots", v->slots,
                "cold_cache", v->cold, "strategy", v->strategy == SL_STRATEGY_BROADCAST ? "broadcast" : "scatter",
                "checkpoint_bytes", (json_int_t)m->ckpt_bytes, "checkpoint_tensors", (json_int_t)m->ckpt_tensors);
  json_object_set_new(row, "checkpoint", json_string(g->ckpt[v->ckpt]));
  if (g->mesh_ndim) json_object_set_new(row, "mesh", json_pack("[i,i]", g->mesh[0], g->mesh[1]));
  json_object_set_new(row, "median",
                      json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "load_seconds", s.load, "rank0_seconds_read", s.read0,
                                "rank0_seconds_wait", s.wait0, "rank0_busy_seconds", s.busy0, "rank0_seconds_phase1",
                                s.phase1, "load_over_stage_sum", s.overlap));
  json_object_set_new(json_object_get(row, "median"), "rank0_read_hidden", json_real(s.hidden0));
  if (g->part == 3)
    json_object_set_new(row, "separate_target_scatter_bytes", json_integer((json_int_t)m->separate_bytes));
  json_object_set_new(row, "runs", runs);
  return row;
}

const char *name_of(const group *g) { return g->tag ? g->tag : g->backend; }

/* The group of PART on BACKEND that ran, new loader (baseline 0) or the baseline (1); -1: none. */
static int find_group(const results *R, int part, const char *backend, const char *collective, int baseline) {
  for (size_t i = 0; i < R->n; i++) {
    const group *g = &R->g[i];
    if (R->ran[i] && g->part == part && !strcmp(g->backend, backend) && !!g->cli_args == baseline &&
        (baseline || (collective ? g->collective && !strcmp(g->collective, collective) : !g->collective)))
      return (int)i;
  }
  return -1;
}

static int find_variant(const group *g, int slots, int cold, int budget_div) {
  for (int v = 0; v < g->nv; v++)
    if (g->v[v].slots == slots && g->v[v].cold == cold &&
        (g->v[v].budget_div > 1 ? g->v[v].budget_div : 1) == budget_div)
      return v;
  return -1;
}

/* Pipelined variant V against serial variant BASE (slots 1) of the same cache state. The
 * serial run is the sum of its stages: phase 1, reading, and the rest (copies, casts, the
 * collective, placing); a perfect pipeline hides the shorter of reading and the rest. */
static void overlap_line(const group *g, const measured *m, int v, int base, const char *against, json_t *ratios) {
  summary s1 = summarize(&m[base]), s = summarize(&m[v]);
  double serial = s1.load, rest = s1.load - s1.read0 - s1.phase1;
  double hideable = rest < s1.read0 ? rest : s1.read0;
  double hidden = hideable > 0 ? (serial - s.load) / hideable : 0.0;
  printf(
      "  %s/%s %s vs %s: pipelined/serial %.2f (%.2fx as fast); hid %.0f%% of the %.3f s a perfect "
      "pipeline would\n",
      g->backend, m[v].collective, g->v[v].label, against, s.load / serial, serial / s.load, 100 * hidden, hideable);
  json_array_append_new(
      ratios,
      json_pack("{s:i, s:s, s:s, s:s, s:i, s:s, s:f, s:f, s:f, s:f}", "part", 1, "backend", g->backend, "collective",
                m[v].collective, "cache", g->v[v].cold ? "cold" : "warm", "pipeline_slots", g->v[v].slots, "serial",
                g->v[base].label, "pipelined_over_serial", s.load / serial, "pipelined_over_stage_sum", s.overlap,
                "hideable_seconds", hideable, "hidden_fraction", hidden));
}

void print_part1(const results *R, json_t *ratios) {
  printf("%-7s %-8s %-6s %-5s %5s %7s  %7s  %6s  %9s  %7s  %7s  %7s  %16s  %7s\n", "backend", "coll.", "route",
         "cache", "slots", "stg MiB", "load s", "GB/s", "transfers", "read0 s", "wait0 s", "busy0 s", "load/(read+busy)",
         "hidden0");
  for (size_t i = 0; i < R->n; i++) {
    const group *g = &R->g[i];
    const measured *m = R->m[i];
    if (!R->ran[i] || g->part != 1) continue;
    for (int v = 0; v < g->nv; v++) {
      summary s = summarize(&m[v]);
      printf("%-7s %-8s %-6s %-5s %5d %7.1f  %7.3f  %6.2f", name_of(g), m[v].collective, route_of(&m[v]),
             g->v[v].cold ? "cold" : "warm", g->v[v].slots, (double)m[v].rank0[0].staging_bytes / 1048576.0, s.load,
             s.load > 0 ? (double)m[v].ckpt_bytes / s.load / 1e9 : 0.0);
      if (g->cli_args)
        printf("  %9s  %7s  %7s  %7s  %16s  %7s\n", "-", "-", "-", "-", "-", "-");
      else
        printf("  %9llu  %7.3f  %7.3f  %7.3f  %16.2f  %6.0f%%\n", (unsigned long long)m[v].rank0[0].transfers, s.read0,
               s.wait0, s.busy0, s.overlap, 100 * s.hidden0);
    }
  }
  for (size_t i = 0; i < R->n; i++) {
    const group *g = &R->g[i];
    const measured *m = R->m[i];
    if (!R->ran[i] || g->part != 1 || g->cli_args) continue;
    for (int v = 0; v < g->nv; v++) {
      const variant *x = &g->v[v];
      if (x->slots < 2) continue;
      /* the same budget (what a user trades: more slots, smaller transfers) and, where measured,
       * the same slot size (the same transfers: overlap alone) */
      int same_budget = find_variant(g, 1, x->cold, 1), same_slot = find_variant(g, 1, x->cold, x->slots);
      if (same_budget >= 0) overlap_line(g, m, v, same_budget, "slots 1 (same budget)", ratios);
      if (same_slot >= 0) overlap_line(g, m, v, same_slot, "slots 1 (same slot size)", ratios);
    }
  }
  int cn = find_group(R, 1, "cpu", NULL, 0), co = find_group(R, 1, "cpu", NULL, 1);
  for (int cold = 0; cn >= 0 && co >= 0 && cold < 2; cold++) {
    int vn = find_variant(&R->g[cn], 2, cold, 1), vo = find_variant(&R->g[co], 1, cold, 1);
    if (vn < 0 || vo < 0) continue;
    double tn = summarize(&R->m[cn][vn]).load, to = summarize(&R->m[co][vo]).load;
    printf("  cpu %s, the default (slots 2) against the serial loader before the pipeline: %.2f (%.2fx as fast)\n",
           cold ? "cold" : "warm", tn / to, to / tn);
    json_array_append_new(ratios, json_pack("{s:i, s:s, s:s, s:f}", "part", 1, "backend", "cpu", "cache",
                                            cold ? "cold" : "warm", "default_over_before7", tn / to));
  }
}

void print_part2(const results *R, json_t *ratios) {
  printf("%-7s %-8s %-6s %-14s %8s  %7s  %9s  %10s  %11s\n", "backend", "coll.", "route", "checkpoint", "tensors",
         "load s", "transfers", "tensors/op", "sent0 MiB");
  for (size_t i = 0; i < R->n; i++) {
    const group *g = &R->g[i];
    const measured *m = R->m[i];
    if (!R->ran[i] || g->part != 2) continue;
    for (int v = 0; v < g->nv; v++) {
      summary s = summarize(&m[v]);
      uint64_t ops = m[v].rank0[0].transfers;
      printf("%-7s %-8s %-6s %-14s %8llu  %7.3f", name_of(g), m[v].collective, route_of(&m[v]), g->v[v].label,
             (unsigned long long)m[v].ckpt_tensors, s.load);
      if (g->cli_args)
        printf("  %9s  %10s", "-", "-");
      else
        printf("  %9llu  %10.1f", (unsigned long long)ops, ops ? (double)m[v].ckpt_tensors / (double)ops : 0.0);
      printf("  %11.1f\n", (double)m[v].rank0[0].bytes_sent / 1048576.0);
    }
  }
  for (size_t i = 0; i < R->n; i++) {
    const group *g = &R->g[i];
    const measured *m = R->m[i];
    if (!R->ran[i] || g->part != 2) continue;
    summary small = summarize(&m[0]), large = summarize(&m[1]);
    printf("  %s/%s: 10^4 small tensors / the same bytes in 10 tensors, wall %.2f", name_of(g), m[0].collective,
           small.load / large.load);
    if (!g->cli_args)
      printf("; %llu tensors in %llu data collective operations", (unsigned long long)m[0].ckpt_tensors,
             (unsigned long long)m[0].rank0[0].transfers);
    printf("\n");
    json_array_append_new(
        ratios, json_pack("{s:i, s:s, s:s, s:b, s:f, s:I, s:I}", "part", 2, "backend", g->backend, "collective",
                          m[0].collective, "before7", !!g->cli_args, "small_over_large_wall", small.load / large.load,
                          "small_tensors", (json_int_t)m[0].ckpt_tensors, "small_transfers",
                          (json_int_t)m[0].rank0[0].transfers));
  }
  int cn = find_group(R, 2, "cpu", NULL, 0), co = find_group(R, 2, "cpu", NULL, 1);
  if (cn >= 0 && co >= 0) {
    double tn = summarize(&R->m[cn][0]).load, to = summarize(&R->m[co][0]).load;
    printf("  cpu, 10^4 small tensors, against the serial loader before the pipeline: %.2f (%.2fx as fast)\n", tn / to, to / tn);
    json_array_append_new(ratios,
                          json_pack("{s:i, s:s, s:f}", "part", 2, "backend", "cpu", "small_over_before7", tn / to));
  }
}

void print_part3(const results *R, json_t *ratios) {
  printf("%-7s %-8s %-6s %-9s  %7s  %10s  %13s  %9s\n", "backend", "coll.", "route", "strategy", "load s", "sent0/ckpt",
         "sent all/ckpt", "transfers");
  for (size_t i = 0; i < R->n; i++) {
    const group *g = &R->g[i];
    const measured *m = R->m[i];
    if (!R->ran[i] || g->part != 3) continue;
    for (int v = 0; v < g->nv; v++) {
      summary s = summarize(&m[v]);
      double ck = (double)m[v].ckpt_bytes;
      printf("%-7s %-8s %-6s %-9s  %7.3f  %10.3f  %13.3f", name_of(g), m[v].collective, route_of(&m[v]), g->v[v].label,
             s.load, (double)m[v].rank0[0].bytes_sent / ck, (double)m[v].sent_all[0] / ck);
      if (g->cli_args)
        printf("  %9s\n", "-");
      else
        printf("  %9llu\n", (unsigned long long)m[v].rank0[0].transfers);
    }
  }
  for (size_t i = 0; i < R->n; i++) {
    const group *g = &R->g[i];
    const measured *m = R->m[i];
    if (!R->ran[i] || g->part != 3) continue;
    int W = g->world, k = g->mesh[1];
    double ck = (double)m[0].ckpt_bytes, sep = (double)m[0].separate_bytes / ck;
    double sc = (double)m[0].rank0[0].bytes_sent / ck, bc = (double)m[1].rank0[0].bytes_sent / ck;
    if (g->cli_args) {
      printf("  %s (measured): rank 0 sent %.3f of the checkpoint with scatter, %.3f with broadcast\n", name_of(g), sc,
             bc);
    } else {
      printf(
          "  %s/%s: rank 0 sent %.3f of the checkpoint with scatter (expected (k-1)/k + 1/k = 1), %.3f with "
          "broadcast (W-1 = %d);\n    every replica a separate scatter target (before the pipeline) sends %.3f "
          "(this plan's geometry; (W-1)/k = %.2f)\n",
          g->backend, m[0].collective, sc, bc, W - 1, sep, (double)(W - 1) / k);
    }
    json_array_append_new(
        ratios, json_pack("{s:i, s:s, s:s, s:b, s:f, s:f, s:f, s:f, s:f}", "part", 3, "backend", g->backend,
                          "collective", m[0].collective, "before7", !!g->cli_args, "scatter_sent0_over_ckpt", sc,
                          "broadcast_sent0_over_ckpt", bc, "separate_targets_sent0_over_ckpt", sep,
                          "formula_separate_targets", (double)(W - 1) / k, "formula_broadcast", (double)(W - 1)));
  }
}

/* ---- --check ---------------------------------------------------------------------------- */

static int fail(int *n, const group *g, const variant *v, const char *what, double got, double want) {
  fprintf(stderr, "bench_pipeline --check: part %d, %s%s%s, %s: %s: %.4g, expected %.4g\n", g->part, name_of(g),
          g->collective ? " + " : "", g->collective ? g->collective : "", v->label, what, got, want);
  return ++*n;
}

/* What must hold whatever the machine's speed (docs/DESIGN.md#data-flow): rank 0 reads the
 * checkpoint once, the stage times fit in the load, many small tensors share a transfer, and
 * HSDP's rank 0 sends its part once down the replica chain. The baseline's rows are checked
 * too and may fail (that is what the serial loader before the pipeline did): they are reported, not
 * counted. */
int check_results(const results *R) {
  int failures = 0;
  for (size_t i = 0; i < R->n; i++) {
    const group *g = &R->g[i];
    const measured *m = R->m[i];
    int before = failures, *n = &failures;
    if (!R->ran[i]) continue;
    for (int v = 0; v < g->nv; v++) {
      const variant *x = &g->v[v];
      const sl_load_stats *r0 = &m[v].rank0[0];
      double ck = (double)m[v].ckpt_bytes, sent0 = (double)r0->bytes_sent;
      if (g->cli_args) {
        if (g->part == 3 && x->strategy == SL_STRATEGY_SCATTER && sent0 > 1.01 * ck)
          fprintf(stderr,
                  "bench_pipeline --check: %s fails it as expected: HSDP scatter, rank 0 sent %.3f of the "
                  "checkpoint (this build: 1)\n",
                  name_of(g), sent0 / ck);
        continue;
      }
      for (int k = 0; k < m[v].n; k++) {
        const sl_load_stats *s = &m[v].rank0[k];
        if (s->bytes_read != m[v].ckpt_bytes) fail(n, g, x, "rank 0 bytes_read", (double)s->bytes_read, ck);
        if (!(s->seconds_read > 0 && s->seconds_read <= s->seconds))
          fail(n, g, x, "rank 0 seconds_read within (0, seconds]", s->seconds_read, s->seconds);
        if (!(s->seconds_wait >= 0 && s->seconds_wait <= s->seconds))
          fail(n, g, x, "rank 0 seconds_wait within [0, seconds]", s->seconds_wait, s->seconds);
        if (!(s->seconds_phase1 > 0 && s->seconds_phase1 <= s->seconds))
          fail(n, g, x, "rank 0 seconds_phase1 within (0, seconds]", s->seconds_phase1, s->seconds);
        if (s->transfers != r0->transfers)
          fail(n, g, x, "transfers, the same every round", (double)s->transfers, (double)r0->transfers);
      }
      if (g->part == 1 && r0->transfers < 4)
        fail(n, g, x, "transfers (the staging budget cuts the load)", (double)r0->transfers, 4);
      /* the number of collective operations follows the bytes, not the tensors: 10^4 small
       * tensors take no more than twice the transfers of the same bytes in 10 tensors */
      if (g->part == 2 && v > 0 && m[0].rank0[0].transfers > 2 * r0->transfers + 2)
        fail(n, g, &g->v[0], "transfers, at most twice (+2) those of the same bytes in large tensors",
             (double)m[0].rank0[0].transfers, (double)(2 * r0->transfers + 2));
      if (g->part == 2 && m[v].rank0[0].bytes_sent != m[0].rank0[0].bytes_sent)
        fail(n, g, x, "rank 0 bytes sent, the same bytes in any tensor layout", sent0,
             (double)m[0].rank0[0].bytes_sent);
      if (g->part == 3 && x->strategy == SL_STRATEGY_SCATTER) {
        if (sent0 < 0.99 * ck || sent0 > 1.01 * ck)
          fail(n, g, x, "HSDP scatter: rank 0 sent / checkpoint", sent0 / ck, 1);
        if (sent0 >= (double)m[v].separate_bytes)
          fail(n, g, x, "HSDP scatter: rank 0 sent below a scatter to every replica", sent0,
               (double)m[v].separate_bytes);
      }
      if (g->part == 3 && x->strategy == SL_STRATEGY_BROADCAST &&
          (sent0 < 0.99 * (g->world - 1) * ck || sent0 > 1.01 * (g->world - 1) * ck))
        fail(n, g, x, "broadcast: rank 0 sent / checkpoint", sent0 / ck, g->world - 1);
    }
    if (failures == before && !g->cli_args)
      fprintf(stderr, "bench_pipeline --check: part %d, %s%s%s: ok\n", g->part, name_of(g), g->collective ? " + " : "",
              g->collective ? g->collective : "");
  }
  return failures;
}
