/* bench_pipeline: what the runner (bench_pipeline.c) measures and the report
 * (pipeline_report.c) prints; see bench_pipeline.c for the benchmark itself. */
#ifndef SHARDLOAD_BENCH_PIPELINE_H
#define SHARDLOAD_BENCH_PIPELINE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "shardload/shardload.h"

#define MAX_REPS 50
#define MAX_VARIANTS 8
#define MAX_WORLD 8
#define MAX_CKPTS 2

/* ---- what is measured ------------------------------------------------------------------- */

typedef struct variant {
  const char *label;
  int slots;           /* pipeline_slots; 0: the library's default */
  sl_strategy strategy;
  int ckpt;            /* index into the group's checkpoints */
  int cold;            /* rank 0 evicts the checkpoint from the page cache before each load */
  int budget_div;      /* > 1: the staging budget divided by it (a serial run with the slot size,
                          hence the transfers, of a pipelined one) */
} variant;

/* One set of rank processes: one context (backend, collective, world), several variants. */
typedef struct group {
  int part;
  const char *backend;
  /* Non-NULL: a baseline run by another shardload command (--baseline-bin, the serial loader
   * before the pipeline) through `load --nproc --json`, with these extra arguments; TAG names its rows. */
  const char *const *cli_args; /* NULL-terminated */
  const char *tag;
  const char *collective; /* NULL: auto (the backend's device collective when every rank can) */
  int world;
  int mesh_ndim, mesh[2];
  const char *placement;  /* default placement; NULL: FSDP2's */
  const char *ckpt[MAX_CKPTS];
  int nckpt;
  variant v[MAX_VARIANTS];
  int nv;
} group;

/* Per variant: every measured round (round 0 is the warm-up and is not kept). */
typedef struct measured {
  int n;
  double seconds[MAX_REPS];  /* slowest rank's sl_load seconds */
  double overlap[MAX_REPS];  /* seconds / (rank 0 read + rank 0 busy) */
  sl_load_stats rank0[MAX_REPS];
  uint64_t sent_all[MAX_REPS]; /* bytes sent summed over ranks */
  uint64_t ckpt_bytes, ckpt_tensors, separate_bytes;
  char collective[32];
} measured;

typedef struct options {
  const char *dir, *bin, *checkpoint, *json, *baseline;
  uint64_t size, staging;
  int reps, parts, sim_delay_us, timeout_s, check;
} options;

/* The rows of one part: every group that ran, new loader first, the baseline (--baseline-bin)
 * last; results are kept per group so that a part's comparisons can span groups. */
typedef struct results {
  const group *g;
  size_t n;
  measured (*m)[MAX_VARIANTS];
  const int *ran;
} results;

/* ---- the report (pipeline_report.c) ---- */
double median(const double *v, int n);
const char *name_of(const group *g);
json_t *row_json(const group *g, const variant *v, const measured *m);
void print_part1(const results *R, json_t *ratios);
void print_part2(const results *R, json_t *ratios);
void print_part3(const results *R, json_t *ratios);
/* --check: the invariants that do not depend on timing; returns the number of failures, each
 * printed to stderr. */
int check_results(const results *R);

#endif
