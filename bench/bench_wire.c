/* bench_wire: bytes between processes of this host, side by side in one run: a warm memcpy, a
 * plain loopback TCP stream, and the data collectives by name doing the loader's operations.
 *
 *   bench_wire [--nproc 2,4] [--collectives gloo,shm] [--rounds 5] [--bytes 256MiB]
 *              [--sizes loader,32MiB,128MiB] [--ops broadcast,scatterv] [--timeout S] [--check]
 *              [--hosts H]
 *
 * The parent forks the ranks of each world (loopback, a private file:// rendezvous); every rank
 * opens one sl_context per collective (sl_context_options.collective: the registry, the
 * agreement and the module table the loader uses) and runs the same items in the same order,
 * round after round (interleaved: every item once per round), each between two barriers:
 *   memcpy        rank 0 copies BYTES through a warm buffer of the largest size
 *   tcp           a plain loopback TCP stream from rank 0 to rank 1: BYTES in 1 MiB writes,
 *                 blocking sockets, default options; the reference of every ratio
 *   tcp fan-out   (worlds > 2) rank 0 streams BYTES / (N-1) to each other rank at once (poll)
 *   C broadcast S the data collective C broadcasting S bytes from rank 0, repeated to BYTES
 *   C scatterv S  rank 0 scattering S bytes to each rank (its own included), repeated
 * GB/s is the bytes rank 0 moves to the other ranks per second, from the first barrier to the
 * second (every receiver done): S * (N-1) per operation. "loader" stands for the sizes the
 * loader's operations have with the default staging (loader_stage.c: a transfer of plain
 * tensors is a third of a slot; a rank's part of its scatter a world's share of that).
 * Medians over the rounds; a ratio is the median of the rounds' item / tcp ratios; cpu s/GB and
 * csw/MB are every rank's CPU time (all threads) and context switches per byte moved.
 * --check: three operations per item, each one's bytes verified on every rank (the root's own
 * part apart, in place, and over bytes it sends rank 1); exit 1 on a mismatch.
 * --hosts H: the ranks look like ranks of H hosts (SHARDLOAD_TEST_SHM_HOST_TAG, in blocks:
 * ranks 0 and 1 on one, 2 and 3 on the next, for 4 ranks on 2), for the hier collective. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "internal.h" /* sl_context's data plane: the module table and its communicator */
#include "loader.h"   /* the default staging and slots */

#define MAX_ITEMS 64
#define MAX_ROUNDS 100
#define MAX_LIST 8
#define TCP_WRITE (1u << 20)

typedef enum kind { K_MEMCPY, K_TCP, K_FAN, K_BCAST, K_SCATTER } kind;

typedef struct item {
  kind k;
  int coll; /* index into the collectives (K_BCAST, K_SCATTER) */
  size_t size;
  const char *label; /* "loader" or NULL */
  double gbs[MAX_ROUNDS];
  double cpu[MAX_ROUNDS]; /* every rank's CPU seconds (all threads, user + system) per GB */
  double csw[MAX_ROUNDS]; /* every rank's context switches per MB */
} item;

typedef struct opts {
  int worlds[MAX_LIST], nworlds;
  const char *colls[MAX_LIST];
  int ncolls;
  int rounds;
  uint64_t bytes;
  char sizes[256];
  int timeout_s;
  int check;
  int ops; /* bit 0: broadcast, bit 1: scatterv */
  int hosts; /* the ranks' "hosts" (SHARDLOAD_TEST_SHM_HOST_TAG), 1: this one */
} opts;

static const char *human(size_t b, char *buf, size_t len) {
  if (b >= (1u << 20)) snprintf(buf, len, "%.1f MiB", (double)b / (1u << 20));
  else if (b >= 1024) snprintf(buf, len, "%.1f KiB", (double)b / 1024);
  else snprintf(buf, len, "%zu B", b);
  return buf;
}

/* The loader's operation sizes with the default staging (loader_stage.c): slots of
 * staging / slots bytes, less the reserve (256 + 16 a rank); a plain tensor costs its bytes
 * three times there (read, packed, received), so a transfer carries a third of the rest, and
 * a rank's part of its scatter is a world's share of that. */
static size_t loader_transfer(int world) {
  uint64_t per_slot = SL__DEFAULT_STAGING / SL__DEFAULT_SLOTS - 256 - 16 * (uint64_t)world;
  return (size_t)(per_slot / 3) & ~(size_t)63;
}

/* ---- the ranks' data ---------------------------------------------------------------------- */
typedef struct rank_ctx {
  int rank, world;
  sl_context *ctx[MAX_LIST];
  int tcp[MAX_LIST]; /* rank 0: a socket to each rank; others: [0] to rank 0 */
  unsigned char *send, *recv, *copy;
  size_t max_size;
  const opts *o;
} rank_ctx;

static _Noreturn void die(const rank_ctx *r, const char *what, const char *why) {
  fprintf(stderr, "bench_wire: rank %d of %d: %s: %s\n", r->rank, r->world, what, why);
  _exit(1);
}

/* This process's CPU seconds so far, all its threads (Gloo's event loop included), and its
 * context switches (*CSW). */
static double cpu_seconds(double *csw) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  *csw = (double)u.ru_nvcsw + (double)u.ru_nivcsw;
  return (double)u.ru_utime.tv_sec + (double)u.ru_stime.tv_sec +
         1e-6 * (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

static void barrier(rank_ctx *r) {
  if (sl__ctl_barrier(r->ctx[0]) != SL_OK) die(r, "barrier", sl_context_errmsg(r->ctx[0]));
}

static void write_all(rank_ctx *r, int fd, const unsigned char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n < TCP_WRITE ? n : TCP_WRITE);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die(r, "tcp write", strerror(errno));
    p += w;
    n -= (size_t)w;
  }
}

static void read_all(rank_ctx *r, int fd, unsigned char *p, size_t n) {
  while (n) {
    ssize_t g = read(fd, p, n < TCP_WRITE ? n : TCP_WRITE);
    if (g < 0 && errno == EINTR) continue;
    if (g <= 0) die(r, "tcp read", g == 0 ? "closed" : strerror(errno));
    p += g;
    n -= (size_t)g;
  }
}

/* Rank 0 streams TOTAL bytes to rank 1 (or TOTAL / (N-1) to each rank, FAN) out of a buffer of
 * MAX_SIZE bytes; each receiver acknowledges the last byte. Returns seconds on rank 0. */
static double tcp_stream(rank_ctx *r, uint64_t total, bool fan) {
  int peers = fan ? r->world - 1 : 1;
  uint64_t each = total / (uint64_t)peers;
  double t0 = bench_now();
  if (r->rank == 0 && peers == 1) { /* blocking writes: one stream needs no poll */
    for (uint64_t at = 0; at < each;) {
      size_t n1 = (size_t)(each - at < r->max_size ? each - at : r->max_size);
      write_all(r, r->tcp[1], r->send, n1);
      at += n1;
    }
  } else if (r->rank == 0) {
    uint64_t left[MAX_LIST];
    struct pollfd pf[MAX_LIST];
    for (int i = 0; i < peers; i++) left[i] = each;
    for (int live = peers; live > 0;) {
      int n = 0;
      for (int i = 0; i < peers; i++)
        if (left[i]) pf[n++] = (struct pollfd){.fd = r->tcp[i + 1], .events = POLLOUT};
      if (poll(pf, (nfds_t)n, 1000 * r->o->timeout_s) <= 0) die(r, "tcp poll", "timed out");
      for (int i = 0, j = 0; i < peers; i++) {
        if (!left[i]) continue;
        if (pf[j++].revents & (POLLOUT | POLLERR | POLLHUP)) {
          size_t n1 = (size_t)(left[i] < TCP_WRITE ? left[i] : TCP_WRITE);
          ssize_t w = send(r->tcp[i + 1], r->send, n1, MSG_DONTWAIT);
          if (w < 0 && errno != EAGAIN && errno != EINTR) die(r, "tcp send", strerror(errno));
          if (w > 0 && !(left[i] -= (uint64_t)w)) live--;
        }
      }
    }
  }
  if (r->rank == 0) {
    for (int i = 0; i < peers; i++) {
      unsigned char ack;
      read_all(r, r->tcp[i + 1], &ack, 1);
    }
    return bench_now() - t0;
  }
  if (r->rank <= peers) {
    for (uint64_t at = 0; at < each;) {
      size_t n1 = (size_t)(each - at < r->max_size ? each - at : r->max_size);
      read_all(r, r->tcp[0], r->recv, n1);
      at += n1;
    }
    unsigned char ack = 1;
    write_all(r, r->tcp[0], &ack, 1);
  }
  return bench_now() - t0;
}

/* --check: the bytes of operation SEED at global offset I */
static unsigned char pattern(uint64_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xD1B54A32D192ED03ull);
  x ^= x >> 29;
  return (unsigned char)(x * 0xBF58476D1CE4E5B9ull >> 56);
}

static void fill(unsigned char *p, size_t n, uint64_t seed, uint64_t base) {
  for (size_t i = 0; i < n; i++) p[i] = pattern(seed, base + i);
}

static void verify(rank_ctx *r, const unsigned char *p, size_t n, uint64_t seed, uint64_t base, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != pattern(seed, base + i)) {
      char msg[160];
      snprintf(msg, sizeof msg, "byte %zu of %zu differs (0x%02x, expected 0x%02x)", i, n, p[i],
               pattern(seed, base + i));
      die(r, what, msg);
    }
}

/* One item on every rank: seconds on rank 0, and the bytes rank 0 moved (*MOVED). */
static double run_item(rank_ctx *r, item *it, uint64_t *seed, uint64_t *moved) {
  const int N = r->world;
  const uint64_t total = r->o->bytes;
  if (it->k == K_MEMCPY) {
    barrier(r);
    double t0 = bench_now();
    uint64_t at = 0;
    for (; at < total; at += it->size)
      if (r->rank == 0) memcpy(r->copy, r->send, it->size);
    double t = bench_now() - t0;
    *moved = at;
    barrier(r);
    return t;
  }
  if (it->k == K_TCP || it->k == K_FAN) {
    barrier(r);
    double t = tcp_stream(r, total, it->k == K_FAN);
    barrier(r);
    *moved = it->k == K_FAN ? total / (uint64_t)(N - 1) * (uint64_t)(N - 1) : total;
    return t;
  }
  sl_context *ctx = r->ctx[it->coll];
  const size_t S = it->size;
  uint64_t per_op = (uint64_t)S * (uint64_t)(N - 1);
  uint64_t ops = r->o->check ? 3 : (total + per_op - 1) / per_op;
  if (ops < 2) ops = 2;
  size_t counts[MAX_LIST], displs[MAX_LIST];
  for (int i = 0; i < N; i++) counts[i] = S, displs[i] = (size_t)i * S;
  const char *what = it->k == K_BCAST ? "broadcast" : "scatterv";
  barrier(r);
  double t0 = bench_now();
  for (uint64_t k = 0; k < ops; k++) {
    uint64_t sd = ++*seed;
    sl_status st;
    if (r->o->check) {
      if (r->rank == 0) fill(r->send, it->k == K_BCAST ? S : S * (size_t)N, sd, 0);
      else memset(r->recv, 0, S);
    }
    /* the root's own part: into a buffer of its own; --check also in place, and onto the
     * bytes it sends rank 1 (which must leave before they are overwritten) */
    unsigned char *own = r->copy;
    if (r->o->check && sd % 3 == 1) own = r->send + displs[0];
    if (r->o->check && sd % 3 == 2) own = r->send + displs[1];
    if (it->k == K_BCAST) st = ctx->data->broadcast(ctx->data_comm, r->rank == 0 ? r->send : r->recv, S, 0, NULL);
    else st = ctx->data->scatterv(ctx->data_comm, r->send, counts, displs, r->rank == 0 ? own : r->recv, S, 0, NULL);
    if (st != SL_OK) die(r, what, sl_context_errmsg(ctx));
    if (r->o->check) {
      if (r->rank == 0 && it->k == K_SCATTER) verify(r, own, S, sd, 0, what);
      if (r->rank != 0) verify(r, r->recv, S, sd, it->k == K_BCAST ? 0 : displs[r->rank], what);
    }
  }
  barrier(r);
  *moved = ops * per_op;
  return bench_now() - t0;
}

static void print_table(const rank_ctx *r, item *items, int nitems) {
  const opts *o = r->o;
  int tcp = -1, fan = -1;
  for (int i = 0; i < nitems; i++) {
    if (items[i].k == K_TCP) tcp = i;
    if (items[i].k == K_FAN) fan = i;
  }
  char hb[32];
  printf(
      "\nworld %d: %d rounds of %s per item (GB/s: bytes rank 0 moves to the other ranks / s; median "
      "[min-max] of the rounds; x tcp: median of the rounds' ratios; cpu s/GB: every rank's CPU time, all "
      "threads, per GB moved; csw/MB: their context switches per MB)\n",
      r->world, o->rounds, human((size_t)o->bytes, hb, sizeof hb));
  printf("%-26s %10s %7s %15s %8s %9s %7s%s\n", "item", "size", "GB/s", "[min-max]", "x tcp", "cpu s/GB", "csw/MB",
         fan >= 0 ? "  x fan-out" : "");
  for (int i = 0; i < nitems; i++) {
    item *it = &items[i];
    char name[64], lo[16];
    double mn = it->gbs[0], mx = it->gbs[0];
    for (int k = 0; k < o->rounds; k++) {
      if (it->gbs[k] < mn) mn = it->gbs[k];
      if (it->gbs[k] > mx) mx = it->gbs[k];
    }
    switch (it->k) {
    case K_MEMCPY: snprintf(name, sizeof name, "memcpy (rank 0)"); break;
    case K_TCP: snprintf(name, sizeof name, "tcp stream 0->1"); break;
    case K_FAN: snprintf(name, sizeof name, "tcp fan-out 0->%d ranks", r->world - 1); break;
    case K_BCAST:
    case K_SCATTER:
      snprintf(name, sizeof name, "%s %s%s", o->colls[it->coll], it->k == K_BCAST ? "broadcast" : "scatterv",
               it->label ? " (loader)" : "");
      break;
    }
    snprintf(lo, sizeof lo, "[%.2f-%.2f]", mn, mx);
    double rt[MAX_ROUNDS], rf[MAX_ROUNDS];
    for (int k = 0; k < o->rounds; k++) {
      rt[k] = it->gbs[k] / items[tcp].gbs[k];
      if (fan >= 0) rf[k] = it->gbs[k] / items[fan].gbs[k];
    }
    printf("%-26s %10s %7.2f %15s %7.2fx %9.2f %7.2f", name,
           it->k == K_TCP || it->k == K_FAN ? "1 MiB wr" : human(it->size, hb, sizeof hb),
           bench_median(it->gbs, o->rounds), lo, bench_median(rt, o->rounds), bench_median(it->cpu, o->rounds),
           bench_median(it->csw, o->rounds));
    if (fan >= 0) printf("  %9.2fx", bench_median(rf, o->rounds));
    printf("\n");
  }
  fflush(stdout);
}

static int rank_main(int rank, int world, int listener, const char *dir, const opts *o) {
  rank_ctx r = {.rank = rank, .world = world, .o = o};
  /* the items, the same list on every rank */
  item *items = calloc(MAX_ITEMS, sizeof *items);
  int n = 0;
  size_t sizes[MAX_LIST];
  const char *labels[MAX_LIST];
  int nsizes = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", o->sizes);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && nsizes < MAX_LIST; t = strtok_r(NULL, ",", &save)) {
    uint64_t v = 0;
    labels[nsizes] = NULL;
    if (!strcmp(t, "loader")) labels[nsizes] = "loader", v = 0;
    else if (bench_parse_size(t, &v) || v == 0 || v > (1ull << 32)) die(&r, "--sizes", "not a size list");
    sizes[nsizes++] = (size_t)v;
  }
  r.max_size = 1u << 20;
  for (int i = 0; i < nsizes; i++) {
    size_t s = sizes[i] ? sizes[i] : loader_transfer(world);
    if (s > r.max_size) r.max_size = s;
  }
  if (!o->check) {
    items[n++] = (item){.k = K_MEMCPY, .size = r.max_size};
    items[n++] = (item){.k = K_TCP, .size = TCP_WRITE};
    if (world > 2) items[n++] = (item){.k = K_FAN, .size = TCP_WRITE};
  }
  for (int c = 0; c < o->ncolls; c++)
    for (int op = 0; op < 2; op++)
      for (int i = 0; i < nsizes && n < MAX_ITEMS && (o->ops >> op & 1); i++) {
        size_t s = sizes[i];
        /* the loader broadcasts whole transfers and scatters a world's share of one */
        if (!s) s = op == 0 ? loader_transfer(world) : loader_transfer(world) / (size_t)world & ~(size_t)15;
        items[n++] = (item){.k = op == 0 ? K_BCAST : K_SCATTER, .coll = c, .size = s, .label = labels[i]};
      }

  /* one context per collective, each through a rendezvous of its own */
  for (int c = 0; c < o->ncolls; c++) {
    char url[512], err[512] = "";
    snprintf(url, sizeof url, "file://%s/%s", dir, o->colls[c]);
    sl_context_options co = {.size = sizeof co,
                             .backend = "cpu",
                             .collective = o->colls[c],
                             .world_size = world,
                             .rank = rank,
                             .local_rank = rank,
                             .rendezvous = url,
                             .timeout_ms = o->timeout_s * 1000,
                             .errbuf = err,
                             .errbuf_size = sizeof err,
                             .job_key = "bench_wire"};
    if (sl_context_create(&co, &r.ctx[c]) != SL_OK) die(&r, o->colls[c], err);
    if (strcmp(sl_context_collective_name(r.ctx[c]), o->colls[c]))
      die(&r, o->colls[c], sl_context_collective_reason(r.ctx[c]));
  }
  /* the plain TCP connections: every rank to rank 0 through the listener the parent opened */
  if (rank == 0) {
    for (int i = 1; i < world; i++) {
      int fd = accept(listener, NULL, NULL), who = 0;
      if (fd < 0) die(&r, "accept", strerror(errno));
      read_all(&r, fd, (unsigned char *)&who, sizeof who);
      if (who < 1 || who >= world) die(&r, "accept", "a stranger connected");
      r.tcp[who] = fd;
    }
  } else {
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    getsockname(listener, (struct sockaddr *)&a, &al);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, al) != 0) die(&r, "connect", strerror(errno));
    write_all(&r, fd, (const unsigned char *)&rank, sizeof rank);
    r.tcp[0] = fd;
  }
  close(listener);
  /* warm buffers: the first touch of fresh memory is slow on virtual machines */
  size_t send_bytes = rank == 0 ? r.max_size * (size_t)world : 0;
  if (rank == 0 && !(r.send = malloc(send_bytes))) die(&r, "malloc", "out of memory");
  if (!(r.recv = malloc(r.max_size)) || !(r.copy = malloc(r.max_size))) die(&r, "malloc", "out of memory");
  if (rank == 0) memset(r.send, 0x5a, send_bytes);
  memset(r.recv, 0, r.max_size);
  memset(r.copy, 0, r.max_size);

  uint64_t seed = 0;
  /* a warm-up round (connections, buffers, caches), then the measured rounds */
  for (int round = -1; round < o->rounds; round++)
    for (int i = 0; i < n; i++) {
      uint64_t moved = 0;
      double w0, w1, c0 = cpu_seconds(&w0), t = run_item(&r, &items[i], &seed, &moved);
      double use[2] = {cpu_seconds(&w1) - c0, w1 - w0}, all[2 * MAX_LIST];
      if (sl__ctl_allgather(r.ctx[0], use, all, sizeof use) != SL_OK) die(&r, "allgather", sl_context_errmsg(r.ctx[0]));
      if (round < 0) continue;
      items[i].gbs[round] = (double)moved / t / 1e9;
      items[i].cpu[round] = items[i].csw[round] = 0;
      for (int k = 0; k < world; k++) {
        items[i].cpu[round] += all[2 * k] / ((double)moved / 1e9);
        items[i].csw[round] += all[2 * k + 1] / ((double)moved / 1e6);
      }
    }
  if (rank == 0 && !o->check) print_table(&r, items, n);
  if (rank == 0 && o->check) printf("world %d: %" PRIu64 " operations verified on every rank\n", world, seed);
  fflush(stdout); /* the rank leaves through _exit */
  for (int c = o->ncolls - 1; c >= 0; c--) sl_context_destroy(r.ctx[c]);
  free(items);
  free(r.send);
  free(r.recv);
  free(r.copy);
  return 0;
}

/* ---- the parent ------------------------------------------------------------------------- */
static int run_world(int world, const opts *o) {
  char dir[] = "/tmp/bench-wire-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("bench_wire: mkdtemp");
    return 1;
  }
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (listener < 0 || bind(listener, (struct sockaddr *)&a, sizeof a) || listen(listener, MAX_LIST)) {
    perror("bench_wire: listen");
    return 1;
  }
  fflush(stdout);
  pid_t pids[MAX_LIST];
  for (int i = 0; i < world; i++) {
    pids[i] = fork();
    if (pids[i] == 0) {
      if (o->hosts > 1) {
        char tag[32];
        snprintf(tag, sizeof tag, "bench-host-%d", i * o->hosts / world);
        setenv("SHARDLOAD_TEST_SHM_HOST_TAG", tag, 1);
      }
      _exit(rank_main(i, world, listener, dir, o));
    }
  }
  close(listener);
  int bad = 0;
  double deadline = bench_now() + (double)o->timeout_s * (o->rounds + 2) * 4;
  for (int left = world; left > 0;) {
    int status;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      left--;
      if (!WIFEXITED(status) || WEXITSTATUS(status)) bad = 1;
      if (bad)
        for (int i = 0; i < world; i++) kill(pids[i], SIGKILL); /* no rank waits out a timeout */
      continue;
    }
    if (bench_now() > deadline) {
      fprintf(stderr, "bench_wire: world %d still running past %.0f s: killed\n", world, deadline);
      for (int i = 0; i < world; i++) kill(pids[i], SIGKILL);
      bad = 1;
      deadline = 1e300;
    }
    usleep(10000);
  }
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "bench_wire: could not remove %s\n", dir);
  return bad;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_wire [--nproc 2,4] [--collectives gloo,...] [--rounds 5] [--bytes 256MiB]\n"
          "                  [--sizes loader,32MiB,128MiB] [--ops broadcast,scatterv] [--timeout S] [--check]\n"
          "  --nproc LIST        worlds to measure, ranks forked on this host (default 2)\n"
          "  --collectives LIST  data collectives by name, as --collective takes them (default gloo)\n"
          "  --rounds N          measured rounds after a warm-up round (default 5)\n"
          "  --bytes SIZE        bytes rank 0 sends per item and round (default 256MiB)\n"
          "  --sizes LIST        operation sizes; loader: the loader's own (default loader,32MiB,128MiB)\n"
          "  --ops LIST          broadcast, scatterv or both (default)\n"
          "  --timeout S         the collectives' timeout (default 60)\n"
          "  --check             verify every operation's bytes on every rank instead of timing\n"
          "  --hosts H           the ranks look like ranks of H hosts, in blocks (hier; default 1)\n");
}

/* Splits S at commas into OUT (pointers into KEEP, which holds a copy of S). */
static int split_list(const char *s, char *keep, size_t len, const char **out, int max) {
  snprintf(keep, len, "%s", s);
  int n = 0;
  for (char *save = NULL, *t = strtok_r(keep, ",", &save); t && n < max; t = strtok_r(NULL, ",", &save)) out[n++] = t;
  return n;
}

int main(int argc, char **argv) {
  opts o = {.worlds = {2},
            .nworlds = 1,
            .colls = {"gloo"},
            .ncolls = 1,
            .rounds = 5,
            .bytes = 256ull << 20,
            .timeout_s = 60,
            .ops = 3,
            .hosts = 1};
  snprintf(o.sizes, sizeof o.sizes, "loader,32MiB,128MiB");
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--check")) {
      o.check = 1;
    } else if (!v) {
      usage(stderr);
      return 2;
    } else if (!strcmp(a, "--nproc")) {
      const char *w[MAX_LIST];
      char keep[256];
      o.nworlds = split_list(v, keep, sizeof keep, w, MAX_LIST);
      for (int k = 0; k < o.nworlds; k++)
        if ((o.worlds[k] = atoi(w[k])) < 2 || o.worlds[k] > MAX_LIST) {
          fprintf(stderr, "bench_wire: --nproc: worlds of 2 to %d ranks\n", MAX_LIST);
          return 2;
        }
      i++;
    } else if (!strcmp(a, "--collectives")) {
      static char keep[512]; /* o.colls points into it */
      o.ncolls = split_list(v, keep, sizeof keep, o.colls, MAX_LIST);
      i++;
    } else if (!strcmp(a, "--ops")) {
      const char *w[MAX_LIST];
      char keep[256];
      int nw = split_list(v, keep, sizeof keep, w, MAX_LIST);
      o.ops = 0;
      for (int k = 0; k < nw; k++) {
        if (!strcmp(w[k], "broadcast")) o.ops |= 1;
        else if (!strcmp(w[k], "scatterv")) o.ops |= 2;
        else {
          fprintf(stderr, "bench_wire: --ops: broadcast and scatterv, not %s\n", w[k]);
          return 2;
        }
      }
      i++;
    } else if (!strcmp(a, "--rounds")) {
      o.rounds = atoi(v);
      i++;
    } else if (!strcmp(a, "--bytes")) {
      if (bench_parse_size(v, &o.bytes)) {
        fprintf(stderr, "bench_wire: --bytes: not a size: %s\n", v);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--sizes")) {
      snprintf(o.sizes, sizeof o.sizes, "%s", v);
      i++;
    } else if (!strcmp(a, "--timeout")) {
      o.timeout_s = atoi(v);
      i++;
    } else if (!strcmp(a, "--hosts")) {
      o.hosts = atoi(v);
      i++;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (o.rounds < 1 || o.rounds > MAX_ROUNDS || o.timeout_s < 1 || !o.ncolls || o.hosts < 1) {
    usage(stderr);
    return 2;
  }
  if (o.check) o.rounds = 1;
  int bad = 0;
  for (int k = 0; k < o.nworlds && !bad; k++) bad = run_world(o.worlds[k], &o);
  return bad;
}
