/* bench_shm: the shm data collective's throughput between ranks of one host, beside Gloo's and
 * a warm memcpy, measured side by side in one run (rounds interleaved: shm, gloo, memcpy).
 *
 *   bench_shm [--world N] [--bytes SIZE_MIB] [--reps K] [--rounds R]
 *
 * Forks N ranks (default 2), each with two contexts over private file:// rendezvous: one whose
 * data plane is shm, one whose data plane is gloo. Each round times, per collective, K
 * broadcasts of SIZE MiB from rank 0 and K scatterv of SIZE MiB (each other rank receives
 * SIZE/N), between barriers, on rank 0; and K memcpy of SIZE MiB between warm buffers. GB/s:
 * the bytes each receiving rank got, per second (memcpy: bytes copied per second). Prints each
 * round and the medians with the ratios. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "internal.h"

#define MAX_ROUNDS 64

typedef struct cfg {
  int world, reps, rounds;
  size_t bytes;
  char dir[256];
} cfg;

static sl_context *open_ctx(const cfg *c, int rank, const char *coll) {
  char url[400], err[1024] = "";
  snprintf(url, sizeof url, "file://%s/%s", c->dir, coll);
  sl_context_options co = {.size = sizeof co,
                           .backend = "cpu",
                           .collective = coll,
                           .world_size = c->world,
                           .rank = rank,
                           .local_rank = rank,
                           .rendezvous = url,
                           .timeout_ms = 120000,
                           .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  if (sl_context_create(&co, &ctx) != SL_OK) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, coll, err);
    exit(1);
  }
  return ctx;
}

static void must(sl_status st, sl_context *ctx, const char *what) {
  if (st == SL_OK) return;
  fprintf(stderr, "%s: %s: %s\n", what, sl_status_name(st), sl_context_errmsg(ctx));
  exit(1);
}

/* Seconds for K ops of one kind on CTX's data plane, between two barriers. */
static double timed(const cfg *c, sl_context *ctx, int rank, int scatter, unsigned char *buf, unsigned char *recv) {
  const sl_collective_ops *o = ctx->data;
  size_t counts[64], displs[64], part = c->bytes / (size_t)c->world;
  for (int r = 0; r < c->world; r++) counts[r] = part, displs[r] = (size_t)r * part;
  must(sl__ctl_barrier(ctx), ctx, "barrier");
  double t0 = now();
  for (int k = 0; k < c->reps; k++) {
    if (scatter) must(o->scatterv(ctx->data_comm, buf, counts, displs, recv, part, 0, NULL), ctx, "scatterv");
    else must(o->broadcast(ctx->data_comm, buf, c->bytes, 0, NULL), ctx, "broadcast");
  }
  must(sl__ctl_barrier(ctx), ctx, "barrier");
  return now() - t0;
}

static int rank_main(const cfg *c, int rank) {
  sl_context *shm = open_ctx(c, rank, "shm"), *gloo = open_ctx(c, rank, "gloo");
  unsigned char *buf = malloc(c->bytes), *recv = malloc(c->bytes), *dst = malloc(c->bytes);
  memset(buf, rank + 1, c->bytes);
  memset(recv, 0, c->bytes);
  memset(dst, 0, c->bytes);
  double gb = (double)c->bytes * c->reps / 1e9, gbp = gb / c->world;
  double r_shm_b[MAX_ROUNDS], r_gloo_b[MAX_ROUNDS], r_shm_s[MAX_ROUNDS], r_gloo_s[MAX_ROUNDS], r_mem[MAX_ROUNDS];
  /* a warm-up round of each, not counted */
  timed(c, shm, rank, 0, buf, recv), timed(c, gloo, rank, 0, buf, recv);
  for (int i = 0; i < c->rounds; i++) {
    r_shm_b[i] = gb / timed(c, shm, rank, 0, buf, recv);
    r_gloo_b[i] = gb / timed(c, gloo, rank, 0, buf, recv);
    r_shm_s[i] = gbp / timed(c, shm, rank, 1, buf, recv);
    r_gloo_s[i] = gbp / timed(c, gloo, rank, 1, buf, recv);
    double t0 = now();
    for (int k = 0; k < c->reps; k++) memcpy(dst, buf, c->bytes), buf[k % c->bytes] ^= dst[(k * 7) % c->bytes];
    r_mem[i] = gb / (now() - t0);
    if (rank == 0)
      printf("round %d: broadcast shm %.2f gloo %.2f GB/s; scatterv shm %.2f gloo %.2f GB/s; memcpy %.2f GB/s\n", i,
             r_shm_b[i], r_gloo_b[i], r_shm_s[i], r_gloo_s[i], r_mem[i]);
  }
  if (rank == 0) {
    double sb = median(r_shm_b, c->rounds), gbm = median(r_gloo_b, c->rounds), ss = median(r_shm_s, c->rounds),
           gs = median(r_gloo_s, c->rounds), m = median(r_mem, c->rounds);
    printf("medians over %d rounds (world %d, %zu MiB x %d per op kind):\n", c->rounds, c->world, c->bytes >> 20,
           c->reps);
    printf("  broadcast: shm %.2f GB/s, gloo %.2f GB/s: shm/gloo %.2fx, shm/memcpy %.2f\n", sb, gbm, sb / gbm, sb / m);
    printf("  scatterv:  shm %.2f GB/s, gloo %.2f GB/s: shm/gloo %.2fx, shm/memcpy %.2f\n", ss, gs, ss / gs, ss / m);
    printf("  memcpy:    %.2f GB/s\n", m);
  }
  free(buf), free(recv), free(dst);
  sl_context_destroy(gloo);
  sl_context_destroy(shm);
  return 0;
}

int main(int argc, char **argv) {
  cfg c = {.world = 2, .reps = 4, .rounds = 5, .bytes = 256u << 20};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--world")) c.world = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--bytes")) c.bytes = (size_t)atoi(argv[i + 1]) << 20;
    else if (!strcmp(argv[i], "--reps")) c.reps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--rounds")) c.rounds = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "usage: bench_shm [--world N] [--bytes MIB] [--reps K] [--rounds R]\n");
      return 2;
    }
  }
  if (c.world < 2 || c.world > 64 || c.rounds < 1 || c.rounds > MAX_ROUNDS || c.reps < 1 || !c.bytes) return 2;
  snprintf(c.dir, sizeof c.dir, "/tmp/bench_shm.XXXXXX");
  if (!mkdtemp(c.dir)) return 1;
  fflush(stdout);
  pid_t pids[64];
  for (int r = 0; r < c.world; r++)
    if ((pids[r] = fork()) == 0) {
      int rc = rank_main(&c, r);
      fflush(stdout);
      _exit(rc);
    }
  int bad = 0;
  for (int r = 0; r < c.world; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    bad |= !WIFEXITED(status) || WEXITSTATUS(status);
  }
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", c.dir);
  if (system(cmd) != 0) bad = 1;
  return bad;
}
