/* What the C benchmarks share: a monotonic clock and the median of a run of figures. */
#ifndef SHARDLOAD_BENCH_UTIL_H
#define SHARDLOAD_BENCH_UTIL_H

#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of the N figures at V (N >= 1; V is left as it was). */
static inline double median(const double *v, int n) {
  double *s = malloc((size_t)n * sizeof *s);
  if (!s) return v[0];
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  free(s);
  return m;
}

#endif
