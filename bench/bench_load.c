/* bench_load: world-size-1 load throughput against a plain pread baseline.
 *
 *   bench_load PATH [--reps N] [--backend NAME]
 *
 * PATH: a checkpoint, e.g. one made by `shardload synth /tmp/bench-1g.safetensors --size 1GiB`.
 * Each repetition measures, in the same process and page-cache state:
 *   baseline  every tensor's bytes pread into one freshly allocated buffer
 *   load      sl_load to CPU placement (cpu_offload on), no cast
 *   cast      sl_load with param dtype F32 (BF16 -> F32 for a BF16 checkpoint)
 * GB/s is checkpoint bytes / seconds for all three, so the ratios compare like with like.
 * A warm-up pass of each runs first: the first touch of fresh memory is slow on VMs, and the
 * first read of the files fills the page cache. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "shardload/shardload.h"

#define MAX_REPS 1000

typedef struct bench {
  sl_context *ctx;
  sl_source *src;
  uint64_t total;
  int *fds; /* per source file */
} bench;

/* The file index of tensor T (the source lists files and tensors separately). */
static int file_index(const bench *b, const sl_source_tensor *t) {
  for (size_t i = 0; i < sl_source_file_count(b->src); i++)
    if (!strcmp(sl_source_file_at(b->src, i), t->file)) return (int)i;
  return -1;
}

/* Baseline: the bytes any loader must move from the files, with nothing else done. Returns
 * seconds, or a negative value on failure. */
static double run_baseline(const bench *b) {
  double t0 = now();
  unsigned char *buf = malloc(b->total ? b->total : 1);
  if (!buf) return -1;
  uint64_t pos = 0;
  for (size_t i = 0; i < sl_source_tensor_count(b->src); i++) {
    const sl_source_tensor *t = sl_source_tensor_at(b->src, i);
    int fd = b->fds[file_index(b, t)];
    for (uint64_t done = 0; done < t->nbytes;) {
      ssize_t r = pread(fd, buf + pos + done, t->nbytes - done, (off_t)(t->file_offset + done));
      if (r <= 0) {
        free(buf);
        return -1;
      }
      done += (uint64_t)r;
    }
    pos += t->nbytes;
  }
  double secs = now() - t0;
  /* Keep the reads from being optimised away and touch the result like a consumer would. */
  volatile unsigned char sink = buf[b->total ? b->total - 1 : 0];
  (void)sink;
  free(buf);
  return secs;
}

/* One world-size-1 load to CPU placement; DT: the parameter dtype or INVALID for none. */
static double run_load(const bench *b, sl_dtype dt) {
  sl_plan *plan = NULL;
  sl_state *st = NULL;
  sl_status s = sl_plan_create(b->ctx, &plan);
  if (s == SL_OK && dt != SL_DTYPE_INVALID) s = sl_plan_set_param_dtype(plan, dt);
  if (s != SL_OK) goto out_fail;
  sl_load_options o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.cpu_offload = SL_CPU_OFFLOAD_ON;
  double t0 = now();
  s = sl_load(b->ctx, plan, b->src, &o, &st);
  double secs = now() - t0;
  if (s != SL_OK) goto out_fail;
  sl_state_destroy(st);
  sl_plan_destroy(plan);
  return secs;
out_fail:
  fprintf(stderr, "bench_load: load failed: %s: %s\n", sl_status_name(s), sl_context_errmsg(b->ctx));
  sl_plan_destroy(plan);
  return -1;
}

static void usage(void) {
  fprintf(stderr, "usage: bench_load PATH [--reps N] [--backend NAME]\n"
                  "  PATH: a checkpoint, e.g. from `shardload synth /tmp/bench-1g.safetensors --size 1GiB`\n");
}

int main(int argc, char **argv) {
  const char *path = NULL, *backend = "cpu";
  int reps = 5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
      backend = argv[++i];
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage();
      return 0;
    } else if (argv[i][0] != '-' && !path) {
      path = argv[i];
    } else {
      usage();
      return 2;
    }
  }
  if (!path || reps < 1 || reps > MAX_REPS) {
    usage();
    return 2;
  }

  bench b;
  memset(&b, 0, sizeof b);
  sl_context_options co;
  memset(&co, 0, sizeof co);
  co.size = sizeof co;
  co.backend = backend;
  co.rank = 0;
  co.world_size = 1;
  co.local_rank = 0;
  sl_status s = sl_context_create(&co, &b.ctx);
  if (s != SL_OK) {
    fprintf(stderr, "bench_load: %s: %s: %s\n", backend, sl_status_name(s), b.ctx ? sl_context_errmsg(b.ctx) : sl_strerror(s));
    return 1;
  }
  if ((s = sl_source_open(b.ctx, path, &b.src)) != SL_OK) {
    fprintf(stderr, "bench_load: %s: %s: %s\n", path, sl_status_name(s), sl_context_errmsg(b.ctx));
    sl_context_destroy(b.ctx);
    return 1;
  }
  b.total = sl_source_total_bytes(b.src);
  size_t nfiles = sl_source_file_count(b.src);
  b.fds = calloc(nfiles, sizeof *b.fds);
  for (size_t i = 0; i < nfiles; i++) {
    b.fds[i] = open(sl_source_file_at(b.src, i), O_RDONLY | O_CLOEXEC);
    if (b.fds[i] < 0) {
      perror(sl_source_file_at(b.src, i));
      return 1;
    }
  }
  size_t bf16 = 0;
  for (size_t i = 0; i < sl_source_tensor_count(b.src); i++)
    bf16 += sl_source_tensor_at(b.src, i)->dtype == SL_DTYPE_BF16;

  printf("checkpoint: %s, %zu tensors (%zu BF16), %.3f GB in %zu file%s; backend %s; %d reps\n", path,
         sl_source_tensor_count(b.src), bf16, (double)b.total / 1e9, nfiles, nfiles == 1 ? "" : "s",
         sl_context_backend_name(b.ctx), reps);
  if (!bf16) printf("note: no BF16 tensors, so the cast run casts whatever floating dtype the file holds\n");

  /* warm-up: page cache, allocator and first-touch costs out of the measured runs */
  if (run_baseline(&b) < 0 || run_load(&b, SL_DTYPE_INVALID) < 0 || run_load(&b, SL_DTYPE_F32) < 0) {
    fprintf(stderr, "bench_load: warm-up failed\n");
    return 1;
  }

  double base[MAX_REPS], load[MAX_REPS], cast[MAX_REPS];
  double gb = (double)b.total / 1e9;
  printf("%-5s  %14s  %14s  %14s\n", "run", "baseline GB/s", "load GB/s", "cast GB/s");
  for (int r = 0; r < reps; r++) {
    base[r] = run_baseline(&b);
    load[r] = run_load(&b, SL_DTYPE_INVALID);
    cast[r] = run_load(&b, SL_DTYPE_F32);
    if (base[r] <= 0 || load[r] <= 0 || cast[r] <= 0) {
      fprintf(stderr, "bench_load: run %d failed\n", r + 1);
      return 1;
    }
    printf("%-5d  %14.2f  %14.2f  %14.2f\n", r + 1, gb / base[r], gb / load[r], gb / cast[r]);
  }
  double mb = median(base, reps), ml = median(load, reps), mc = median(cast, reps);
  printf("median %13.2f  %14.2f  %14.2f\n", gb / mb, gb / ml, gb / mc);
  printf("vs baseline median: load %.2fx, cast %.2fx (1.00x = as fast as pread into one buffer)\n", mb / ml,
         mb / mc);

  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) == 0)
    printf("peak RSS: %.1f MiB (whole process: the cast run's F32 state is 2x a BF16 checkpoint; "
           "the baseline buffer is 1x; the page cache is not counted)\n",
           (double)ru.ru_maxrss / 1024.0);

  for (size_t i = 0; i < nfiles; i++) close(b.fds[i]);
  free(b.fds);
  sl_source_destroy(b.src);
  sl_context_destroy(b.ctx);
  return 0;
}
