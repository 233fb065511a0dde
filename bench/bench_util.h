/* What the benchmark programs share: the clock, the median of a run's samples and byte sizes
 * on the command line ("64MiB"). Header-only: every bench_*.c is a program of its own. */
#ifndef SHARDLOAD_BENCH_UTIL_H
#define SHARDLOAD_BENCH_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define BENCH_MAX_SAMPLES 1000 /* the most samples bench_median takes */

/* Monotonic seconds. */
static inline double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of the first N (1 to BENCH_MAX_SAMPLES) of V. */
static inline double bench_median(const double *v, int n) {
  double s[BENCH_MAX_SAMPLES];
  if (n > BENCH_MAX_SAMPLES) n = BENCH_MAX_SAMPLES;
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, bench_cmp_double);
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* "512", "64KiB", "1.5GiB" (k, m, g and b accepted too) -> bytes; -1 when it is none. */
static inline int bench_parse_size(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || v <= 0) return -1;
  uint64_t mul = 1;
  if (!strcasecmp(end, "") || !strcasecmp(end, "b")) mul = 1;
  else if (!strcasecmp(end, "kib") || !strcasecmp(end, "k")) mul = 1ull << 10;
  else if (!strcasecmp(end, "mib") || !strcasecmp(end, "m")) mul = 1ull << 20;
  else if (!strcasecmp(end, "gib") || !strcasecmp(end, "g")) mul = 1ull << 30;
  else return -1;
  *out = (uint64_t)(v * (double)mul);
  return 0;
}

#endif
