/* The shm data collective (docs/DESIGN.md#shm) between real processes of one host,
 * bootstrapped over real Gloo on loopback: its ops and sub-communicators beyond one ring of
 * slots; loads bit-exact with Gloo's through the command (worlds 2, 3 and 4, casts, an HSDP
 * mesh, the broadcast strategy); a rank killed mid-load or stopped ends every rank within the
 * timeout naming it, an abort ends a pending op, a rank away in a step outside the segment (a
 * hier leader between the hosts) is given a timeout more and its verdict named, and nothing is
 * left in /dev/shm nor as an abstract socket; strangers (a process of no rank, a rank's thread
 * with a wrong token, another user) are refused and the job goes on; ranks of "other hosts"
 * (SHARDLOAD_TEST_SHM_HOST_TAG) make a forced shm fail everywhere naming them, and make auto
 * choose hier (shm within each host, Gloo between them: tests/test_multirank_hier.c). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <linux/filter.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../collectives/shm/shm.h"
#include "internal.h"
#include "testutil.h"

#define MAX_WORLD 4

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

typedef struct job {
  char *rdzv;
  char *dir; /* scratch shared by the ranks */
  const char *collective;
  int timeout_ms;
  const char *tag[MAX_WORLD]; /* SHARDLOAD_TEST_SHM_HOST_TAG per rank */
  int victim;                 /* the rank a test kills, stops or aborts */
  const char *path;           /* a checkpoint */
} job;

static sl_status open_ctx(const job *j, int rank, int world, sl_context **ctx, char *err, size_t errlen) {
  if (j->tag[rank]) setenv("SHARDLOAD_TEST_SHM_HOST_TAG", j->tag[rank], 1);
  sl_context_options co = {.size = sizeof co,
                           .backend = "cpu",
                           .collective = j->collective,
                           .world_size = world,
                           .rank = rank,
                           .local_rank = rank,
                           .rendezvous = j->rdzv,
                           .timeout_ms = j->timeout_ms ? j->timeout_ms : 20000,
                           .errbuf = err,
                           .errbuf_size = errlen};
  return sl_context_create(&co, ctx);
}

/* Abstract sockets of the shm collective now open on this host (the test's own jobs: the
 * others are not ours to count, so each test compares before and after). */
static int shm_sockets(void) {
  FILE *f = fopen("/proc/net/unix", "r");
  if (!f) return -1;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "@shardload-shm-")) n++;
  fclose(f);
  return n;
}

/* Entries of /dev/shm (a POSIX segment would be one). */
static int dev_shm_entries(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static unsigned char pat(int op, int root, size_t i) {
  return (unsigned char)(i * 131u + (size_t)op * 17u + (size_t)root * 7u + 1u);
}

/* ---- the ops, bigger than one ring, and sub-communicators ------------------------------------ */

static int check_bcast(const sl_collective_ops *o, void *comm, int rank, int n, size_t bytes, int op) {
  unsigned char *b = malloc(bytes + 1);
  SL_CHILD_CHECK(b, "malloc");
  for (int root = 0; root < n; root++) {
    for (size_t i = 0; i < bytes; i++) b[i] = rank == root ? pat(op, root, i) : 0xee;
    sl_status st = o->broadcast(comm, b, bytes, root, NULL);
    SL_CHILD_CHECK(st == SL_OK, "rank %d: broadcast of %zu from %d: %s", rank, bytes, root, sl_status_name(st));
    for (size_t i = 0; i < bytes; i++)
      SL_CHILD_CHECK(b[i] == pat(op, root, i), "rank %d: broadcast of %zu from %d: byte %zu", rank, bytes, root, i);
  }
  free(b);
  return 0;
}

static int ops_rank(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context *ctx = NULL;
  sl_status s = open_ctx(j, rank, world, &ctx, err, sizeof err);
  SL_CHILD_CHECK(s == SL_OK, "rank %d: %s", rank, err);
  SL_CHILD_CHECK(strcmp(sl_context_collective_name(ctx), "shm") == 0, "rank %d: %s", rank,
                 sl_context_collective_name(ctx));
  const sl_collective_ops *o = ctx->data;
  void *comm = ctx->data_comm;
  size_t sizes[] = {0, 1, (1u << 20) + 3, (9u << 20) + 5}; /* the last wraps the ring of 8 slots */
  for (int k = 0; k < 4; k++)
    if (check_bcast(o, comm, rank, world, sizes[k], k)) return 1;
  /* scatterv from each root: uneven parts, one empty, the largest past the ring */
  for (int root = 0; root < world; root++) {
    size_t counts[MAX_WORLD], displs[MAX_WORLD], total = 0;
    for (int r = 0; r < world; r++) {
      counts[r] = r == 1 ? 0 : (size_t)(r + 1) * (3u << 20) + (size_t)r;
      displs[r] = total;
      total += counts[r];
    }
    unsigned char *send = rank == root ? malloc(total) : NULL, *recv = malloc(counts[rank] + 1);
    for (size_t i = 0; send && i < total; i++) send[i] = pat(9, root, i);
    memset(recv, 0xee, counts[rank] + 1);
    sl_status st = o->scatterv(comm, send, counts, displs, recv, counts[rank], root, NULL);
    SL_CHILD_CHECK(st == SL_OK, "rank %d: scatterv from %d: %s", rank, root, sl_status_name(st));
    for (size_t i = 0; i < counts[rank]; i++)
      SL_CHILD_CHECK(recv[i] == pat(9, root, displs[rank] + i), "rank %d: scatterv from %d: byte %zu", rank, root, i);
    SL_CHILD_CHECK(recv[counts[rank]] == 0xee, "rank %d: scatterv wrote past its part", rank);
    free(send);
    free(recv);
  }
  int32_t mine = 1000 + rank, all[MAX_WORLD] = {0};
  SL_CHILD_CHECK(o->allgather(comm, &mine, all, sizeof mine, NULL) == SL_OK, "rank %d: allgather", rank);
  for (int r = 0; r < world; r++) SL_CHILD_CHECK(all[r] == 1000 + r, "rank %d: allgather[%d] = %d", rank, r, all[r]);
  SL_CHILD_CHECK(o->barrier(comm) == SL_OK, "rank %d: barrier", rank);
  /* sub-communicators: even and odd ranks, keys reversed; twice (a channel freed is reused) */
  for (int round = 0; round < 3; round++) {
    void *sub = NULL, *none = NULL;
    int color = rank % 2, key = world - rank;
    SL_CHILD_CHECK(o->split(comm, color, key, &sub) == SL_OK && sub, "rank %d: split", rank);
    SL_CHILD_CHECK(o->split(comm, rank == 0 ? 0 : -1, 0, &none) == SL_OK, "rank %d: split alone", rank);
    SL_CHILD_CHECK((rank == 0) == (none != NULL), "rank %d: split with color -1 gave a communicator", rank);
    int size = (world - color + 1) / 2, pos = size - 1 - rank / 2;
    int32_t v = rank, got[MAX_WORLD] = {0};
    SL_CHILD_CHECK(o->allgather(sub, &v, got, sizeof v, NULL) == SL_OK, "rank %d: sub allgather", rank);
    for (int p = 0; p < size; p++)
      SL_CHILD_CHECK(got[p] == color + 2 * (size - 1 - p), "rank %d: sub rank %d is job rank %d", rank, p, got[p]);
    if (check_bcast(o, sub, pos, size, (9u << 20) + 1, 20 + round)) return 1;
    void *subsub = NULL; /* a split of a split: the whole group again, on a channel of its own */
    SL_CHILD_CHECK(o->split(sub, 0, -pos, &subsub) == SL_OK && subsub, "rank %d: a sub split", rank);
    if (check_bcast(o, subsub, size - 1 - pos, size, 4096, 40 + round)) return 1;
    o->fini(subsub);
    /* the parent still works while its sub-communicators live */
    if (check_bcast(o, comm, rank, world, 4096, 30 + round)) return 1;
    o->fini(none);
    o->fini(sub);
  }
  SL_CHILD_CHECK(sl_context_agree(ctx, SL_OK) == SL_OK, "rank %d: agree", rank);
  sl_context_destroy(ctx);
  return 0;
}

static void spawn(job *j, int world, int (*fn)(int, int, void *), const char *sub, int deadline_ms, int *codes) {
  j->rdzv = sl_test_rendezvous(sub);
  int killed = sl_test_spawn(world, fn, j, deadline_ms, codes);
  assert_int_equal(killed, 0); /* nothing hung */
  free(j->rdzv);
}

static void test_ops_and_split(void **state) {
  for (int world = 2; world <= 4; world += 2) {
    int before = shm_sockets(), codes[MAX_WORLD];
    job j = {.collective = "shm"};
    spawn(&j, world, ops_rank, world == 2 ? "ops2" : "ops4", 120000, codes);
    for (int r = 0; r < world; r++) assert_int_equal(codes[r], 0);
    assert_true(shm_sockets() <= before);
  }
}

/* Splits that are never finished use up the segment's channels (4 x world + 4, the job's
 * among them): the split that finds none fails on every rank alike, gives back what it
 * claimed (one group of all fits in it then), and once the sub-communicators are finished
 * their channels serve again. World 3:
 * each split makes two groups (ranks 0, 2 and rank 1). */
static int channels_rank(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  const sl_collective_ops *o = ctx->data;
  void *subs[16] = {0};
  int made = 0;
  sl_status st = SL_OK;
  while (made < 16 && (st = o->split(ctx->data_comm, rank % 2, rank, &subs[made])) == SL_OK) made++;
  /* 16 channels: the job's, then two per split: seven splits, and the eighth finds one free */
  SL_CHILD_CHECK(made == 7 && st == SL_ERR_UNSUPPORTED, "rank %d: %d splits, then %s", rank, made, sl_status_name(st));
  SL_CHILD_CHECK(strstr(sl_context_errmsg(ctx), "channels is in use"), "rank %d: '%s'", rank, sl_context_errmsg(ctx));
  SL_CHILD_CHECK(o->barrier(ctx->data_comm) == SL_OK, "rank %d: the job's communicator after a failed split", rank);
  /* the channel the failed split claimed for one group came back: one group of all fits */
  void *one = NULL;
  SL_CHILD_CHECK(o->split(ctx->data_comm, 0, rank, &one) == SL_OK && one, "rank %d: the last channel: %s", rank,
                 sl_context_errmsg(ctx));
  if (check_bcast(o, one, rank, world, 4096, 51)) return 1;
  o->fini(one);
  for (int k = 0; k < made; k++) o->fini(subs[k]);
  SL_CHILD_CHECK(o->barrier(ctx->data_comm) == SL_OK, "rank %d: barrier", rank); /* every rank has finished them */
  for (made = 0; made < 3; made++)
    SL_CHILD_CHECK(o->split(ctx->data_comm, rank % 2, rank, &subs[made]) == SL_OK, "rank %d: split %d again", rank,
                   made);
  if (check_bcast(o, subs[2], rank / 2, (world - rank % 2 + 1) / 2, 4096, 50)) return 1;
  for (int k = 0; k < made; k++) o->fini(subs[k]);
  sl_context_destroy(ctx);
  return 0;
}

static void test_channels_run_out(void **state) {
  job j = {.collective = "shm"};
  int codes[3];
  spawn(&j, 3, channels_rank, "channels", 60000, codes);
  for (int r = 0; r < 3; r++) assert_int_equal(codes[r], 0);
}

/* ---- loads bit-exact with Gloo's, through the command ---------------------------------------- */

static void load_both(const char *ckpt, const char *dir, int world, const char *opts, const char *label) {
  char *out = NULL, dump[2][600];
  const char *coll[2] = {"gloo", "shm"};
  for (int k = 0; k < 2; k++) {
    snprintf(dump[k], sizeof dump[k], "%s/%s-%s", dir, label, coll[k]);
    int rc = sl_test_run(&out, "mkdir -p '%s' && '%s' load '%s' --nproc %d --collective %s --timeout 30 --dump '%s' %s",
                         dump[k], sl_test_bin(), ckpt, world, coll[k], dump[k], opts);
    if (rc != 0) fprintf(stderr, "%s (%s): %s\n", label, coll[k], out);
    assert_int_equal(rc, 0);
    char want[64];
    snprintf(want, sizeof want, "collective %s", coll[k]);
    assert_non_null(strstr(out, want));
    free(out);
  }
  int bad = sl_test_dumps_differ(dump[0], dump[1], world);
  if (bad >= 0) fail_msg("%s: rank %d's shards differ between gloo and shm", label, bad);
}

static void test_loads_match_gloo(void **state) {
  char *dir = sl_test_dir("loads"), ckpt[600], *out = NULL;
  snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
  assert_int_equal(sl_test_run(&out, "'%s' synth '%s' --size 24MiB --seed 3", sl_test_bin(), ckpt), 0);
  free(out);
  load_both(ckpt, dir, 2, "", "w2");
  load_both(ckpt, dir, 4, "", "w4");
  load_both(ckpt, dir, 3, "--backend sim --staging 3MiB", "w3-sim");
  load_both(ckpt, dir, 2, "--param-dtype F16", "w2-f16");
  load_both(ckpt, dir, 4, "--param-dtype F32 --strategy broadcast", "w4-f32-bcast");
  load_both(ckpt, dir, 4, "--mesh 2x2 --placement '[replicate, shard(0)]' --staging 2MiB", "hsdp");
  /* auto chooses shm for host staging on one host, and says so */
  assert_int_equal(sl_test_run(&out, "'%s' load '%s' --nproc 2 --timeout 30", sl_test_bin(), ckpt), 0);
  assert_non_null(strstr(out,
                         "collective: shm: backend cpu of rank 0 stages through host memory; every rank shares "
                         "one host"));
  free(out);
  free(dir);
}

/* ---- a rank killed mid-load --------------------------------------------------------------------- */

typedef struct kill_ctx {
  pid_t victim;
  int tensors;
} kill_ctx;

static void kill_on_third(void *user, uint64_t done, uint64_t total) {
  kill_ctx *k = user;
  if (++k->tensors == 3) kill(k->victim, SIGKILL);
}

static int killed_rank(int rank, int world, void *arg) {
  const job *j = arg;
  sl_test_write_pid(j->dir, rank);
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  SL_CHILD_CHECK(strcmp(sl_context_collective_name(ctx), "shm") == 0, "rank %d: not shm", rank);
  sl_source *src = NULL;
  SL_CHILD_CHECK(sl_source_open(ctx, j->path, &src) == SL_OK, "rank %d: open: %s", rank, sl_context_errmsg(ctx));
  kill_ctx k = {.victim = rank == 0 ? sl_test_read_pid(j->dir, j->victim) : 0};
  sl_load_options lo = {.size = sizeof lo, .staging_bytes = 1u << 20};
  if (rank == 0) lo.progress = kill_on_third, lo.progress_user = &k;
  sl_state *st = NULL;
  sl_plan *plan = NULL;
  SL_CHILD_CHECK(sl_plan_create(ctx, &plan) == SL_OK, "rank %d: plan", rank);
  double t0 = now_s();
  sl_status s = sl_load(ctx, plan, src, &lo, &st);
  double took = now_s() - t0;
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "rank %d: %s after %.2f s: %s\n", rank, sl_status_name(s), took, msg);
  SL_CHILD_CHECK(s == SL_ERR_PEER || s == SL_ERR_TIMEOUT || s == SL_ERR_COMM, "rank %d: %s", rank, sl_status_name(s));
  SL_CHILD_CHECK(sl_test_names_rank(msg, j->victim), "rank %d: '%s' does not name rank %d", rank, msg, j->victim);
  /* found by its pidfd, well before the timeout */
  SL_CHILD_CHECK(took < j->timeout_ms / 1000.0 / 2, "rank %d took %.1f s (timeout %d ms)", rank, took, j->timeout_ms);
  sl_state_destroy(st);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_rank_killed_mid_load(void **state) {
  char *dir = sl_test_dir("killed"), ckpt[600], *out = NULL;
  snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
  assert_int_equal(sl_test_run(&out, "'%s' synth '%s' --size 48MiB", sl_test_bin(), ckpt), 0);
  free(out);
  int shm_before = dev_shm_entries(), sock_before = shm_sockets();
  job j = {.collective = "shm", .timeout_ms = 20000, .victim = 2, .dir = dir, .path = ckpt};
  int codes[MAX_WORLD];
  spawn(&j, 4, killed_rank, "killed-rdzv", 60000, codes);
  for (int r = 0; r < 4; r++)
    if (r != 2) assert_int_equal(codes[r], 0);
  assert_int_equal(codes[2], 128 + SIGKILL);
  assert_int_equal(dev_shm_entries(), shm_before); /* a memfd has no name to leave behind */
  assert_true(shm_sockets() <= sock_before);
  free(dir);
}

/* A rank killed between rank 0's offer and its fetch of the segment (it comes late,
 * SHARDLOAD_TEST_SHM_ATTACH_DELAY_MS, and dies meanwhile): rank 0 sees its pidfd and fails the
 * start naming it, and the rank that has its segment fails with it, both well within the
 * timeout (rank 0 had waited the whole timeout for it, and rank 1 behind rank 0). */
static void *die_soon(void *arg) {
  usleep(400000);
  raise(SIGKILL);
  return NULL;
}

static int killed_at_attach_rank(int rank, int world, void *arg) {
  const job *j = arg;
  pthread_t t;
  if (rank == j->victim) {
    setenv("SHARDLOAD_TEST_SHM_ATTACH_DELAY_MS", "5000", 1);
    pthread_create(&t, NULL, die_soon, NULL);
  }
  char err[1024] = "";
  sl_context *ctx = NULL;
  double t0 = now_s();
  sl_status s = open_ctx(j, rank, world, &ctx, err, sizeof err);
  double took = now_s() - t0;
  fprintf(stderr, "rank %d: %s after %.2f s: %s\n", rank, sl_status_name(s), took, err);
  SL_CHILD_CHECK(rank != j->victim, "rank %d outlived its SIGKILL", rank);
  SL_CHILD_CHECK(s == SL_ERR_PEER || s == SL_ERR_COMM, "rank %d: %s (%s)", rank, sl_status_name(s), err);
  SL_CHILD_CHECK(sl_test_names_rank(err, j->victim), "rank %d: '%s' does not name rank %d", rank, err, j->victim);
  SL_CHILD_CHECK(took < j->timeout_ms / 1000.0 / 2, "rank %d took %.1f s (timeout %d ms)", rank, took, j->timeout_ms);
  return 0;
}

static void test_rank_killed_at_attach(void **state) {
  int sock_before = shm_sockets(), codes[MAX_WORLD];
  job j = {.collective = "shm", .timeout_ms = 20000, .victim = 2};
  spawn(&j, 3, killed_at_attach_rank, "killed-attach", 60000, codes);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  assert_int_equal(codes[2], 128 + SIGKILL);
  assert_true(shm_sockets() <= sock_before);
}

/* Rank 2 is killed; rank 0 learns of it elsewhere (here: it waits, as if on the control plane)
 * and finishes its communicator without a word of failure on the data plane, while rank 1
 * waits for rank 0's broadcast. Rank 1 names rank 2, the rank the job lost, not rank 0 that
 * left (as the torchrun c10d-kill scenario saw: "rank 0 finished this communicator"). */
static int left_after_kill_rank(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  SL_CHILD_CHECK(strcmp(sl_context_collective_name(ctx), "shm") == 0, "rank %d: not shm", rank);
  const sl_collective_ops *o = ctx->data;
  void *sub = NULL; /* a communicator of its own, finished while the context lives */
  SL_CHILD_CHECK(o->split(ctx->data_comm, 0, rank, &sub) == SL_OK, "rank %d: split: %s", rank, sl_context_errmsg(ctx));
  if (rank == 2) raise(SIGKILL);
  if (rank == 0) {
    usleep(600000); /* rank 2 has died, and rank 1 waits */
    o->fini(sub);
    return 0; /* no destroy: the control plane would miss rank 2 */
  }
  unsigned char b[4096];
  sl_status st = o->broadcast(sub, b, sizeof b, 0, NULL);
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "rank 1: %s: %s\n", sl_status_name(st), msg);
  SL_CHILD_CHECK(st == SL_ERR_PEER && sl_test_names_rank(msg, 2) && strstr(msg, "lost rank 2"), "rank 1: %s: '%s'",
                 sl_status_name(st), msg);
  o->fini(sub);
  return 0;
}

static void test_left_after_a_peer_was_killed(void **state) {
  job j = {.collective = "shm", .timeout_ms = 10000};
  int codes[3];
  spawn(&j, 3, left_after_kill_rank, "left-after-kill", 60000, codes);
  assert_int_equal(codes[0], 0);
  assert_int_equal(codes[1], 0);
  assert_int_equal(codes[2], 128 + SIGKILL);
}

/* ---- a rank stopped, a rank aborted -------------------------------------------------------------- */

static int stopped_rank(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  const sl_collective_ops *o = ctx->data;
  size_t bytes = 24u << 20;
  unsigned char *b = calloc(1, bytes);
  SL_CHILD_CHECK(o->broadcast(ctx->data_comm, b, bytes, 0, NULL) == SL_OK, "rank %d: first broadcast", rank);
  if (rank == j->victim) {
    if (fork() == 0) { /* wakes it once the others have given up */
      usleep((useconds_t)j->timeout_ms * 2000u);
      kill(getppid(), SIGCONT);
      _exit(0);
    }
    raise(SIGSTOP);
  }
  double t0 = now_s();
  sl_status s = o->broadcast(ctx->data_comm, b, bytes, 0, NULL);
  double took = now_s() - t0;
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "rank %d: %s after %.2f s: %s\n", rank, sl_status_name(s), took, msg);
  SL_CHILD_CHECK(s != SL_OK, "rank %d: the broadcast went through", rank);
  if (rank != j->victim) {
    SL_CHILD_CHECK(s == SL_ERR_TIMEOUT || s == SL_ERR_PEER, "rank %d: %s", rank, sl_status_name(s));
    SL_CHILD_CHECK(sl_test_names_rank(msg, j->victim), "rank %d: '%s' does not name rank %d", rank, msg, j->victim);
    SL_CHILD_CHECK(took < j->timeout_ms / 1000.0 + 2, "rank %d took %.1f s", rank, took);
  } else { /* woken, it learns that rank 0 failed, never that it lost itself */
    char self[64];
    snprintf(self, sizeof self, "lost rank %d", rank);
    SL_CHILD_CHECK(!strstr(msg, self), "rank %d names itself as lost: '%s'", rank, msg);
  }
  free(b);
  sl_context_destroy(ctx);
  return 0;
}

static void test_rank_stopped(void **state) {
  job j = {.collective = "shm", .timeout_ms = 2000, .victim = 1};
  int codes[3];
  spawn(&j, 3, stopped_rank, "stopped", 60000, codes);
  for (int r = 0; r < 3; r++) assert_int_equal(codes[r], 0);
}

static void *abort_later(void *arg) {
  usleep(300000);
  sl_context_abort(arg);
  return NULL;
}

/* Rank 1 waits for a broadcast rank 0 sends only after 3 s; a thread aborts rank 1 at 0.3 s:
 * its op fails at once, and rank 0's, when it comes, fails naming rank 1. */
static int aborted_rank(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  const sl_collective_ops *o = ctx->data;
  size_t bytes = 16u << 20;
  unsigned char *b = calloc(1, bytes);
  pthread_t t;
  if (rank == 1) pthread_create(&t, NULL, abort_later, ctx);
  if (rank == 0) usleep(3000000);
  double t0 = now_s();
  sl_status s = o->broadcast(ctx->data_comm, b, bytes, 0, NULL);
  double took = now_s() - t0;
  fprintf(stderr, "rank %d: %s after %.2f s: %s\n", rank, sl_status_name(s), took, sl_context_errmsg(ctx));
  if (rank == 1) {
    pthread_join(t, NULL);
    SL_CHILD_CHECK(s == SL_ERR_COMM && took < 1.5, "rank 1: %s after %.2f s", sl_status_name(s), took);
  } else {
    SL_CHILD_CHECK(s == SL_ERR_PEER && sl_test_names_rank(sl_context_errmsg(ctx), 1) && took < 1.0,
                   "rank 0: %s after %.2f s", sl_status_name(s), took);
  }
  free(b);
  sl_context_destroy(ctx);
  return 0;
}

static void test_abort(void **state) {
  job j = {.collective = "shm", .timeout_ms = 20000};
  int codes[2];
  spawn(&j, 2, aborted_rank, "aborted", 60000, codes);
  for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
}

/* ---- ranks that call different ops ----------------------------------------------------------------- */

/* Each rank its own root (victim 0), or rank 1 a scatterv against rank 0's broadcast (victim 1):
 * a receiver, or the root that lost the claim, fails at once with a mismatch; a root whose
 * chunks all fit the ring may have returned before anyone looked. No later op passes on either. */
static int disagree_rank(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  const sl_collective_ops *o = ctx->data;
  size_t bytes = 3u << 20, counts[2] = {bytes / 2, bytes / 2}, displs[2] = {0, bytes / 2};
  unsigned char *b = calloc(1, bytes);
  double t0 = now_s();
  sl_status s;
  if (j->victim == 0) s = o->broadcast(ctx->data_comm, b, bytes, rank, NULL);
  else if (rank == 0) s = o->broadcast(ctx->data_comm, b, bytes, 0, NULL);
  else s = o->scatterv(ctx->data_comm, NULL, counts, displs, b, bytes / 2, 0, NULL);
  double took = now_s() - t0;
  fprintf(stderr, "rank %d: %s after %.2f s: %s\n", rank, sl_status_name(s), took, sl_context_errmsg(ctx));
  bool receiver = j->victim == 1 && rank == 1;
  SL_CHILD_CHECK(s == SL_ERR_MISMATCH || (!receiver && (s == SL_OK || s == SL_ERR_PEER)), "rank %d: %s", rank,
                 sl_status_name(s));
  SL_CHILD_CHECK(took < 2.0, "rank %d took %.1f s", rank, took);
  SL_CHILD_CHECK(o->barrier(ctx->data_comm) != SL_OK, "rank %d: a later barrier passed", rank);
  SL_CHILD_CHECK(o->broadcast(ctx->data_comm, b, bytes, 0, NULL) != SL_OK, "rank %d: a later broadcast passed", rank);
  free(b);
  sl_context_destroy(ctx);
  return 0;
}

static void test_ranks_disagree(void **state) {
  for (int v = 0; v < 2; v++) {
    job j = {.collective = "shm", .victim = v};
    int codes[2];
    spawn(&j, 2, disagree_rank, v ? "disagree-kind" : "disagree-root", 60000, codes);
    for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
  }
}

/* ---- strangers ----------------------------------------------------------------------------------- */

/* The name of the abstract socket of the shm collective that process PID holds ("" when none
 * yet): its socket inodes matched against /proc/net/unix. Where its fd table is closed to this
 * process (PID is not dumpable while it holds the segment, and this test does not run as
 * root), any such socket: another job's refuses a stranger as well. */
static int socket_of(pid_t pid, char *name, size_t len) {
  char dirp[64];
  snprintf(dirp, sizeof dirp, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(dirp);
  bool any = !d && errno == EACCES;
  if (!d && !any) return 0;
  unsigned long inodes[256];
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)) && n < 256) {
    char p[320], link[64];
    snprintf(p, sizeof p, "%s/%s", dirp, e->d_name);
    ssize_t k = readlink(p, link, sizeof link - 1);
    if (k <= 0) continue;
    link[k] = 0;
    if (sscanf(link, "socket:[%lu]", &inodes[n]) == 1) n++;
  }
  if (d) closedir(d);
  FILE *f = fopen("/proc/net/unix", "r");
  char line[512];
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) {
    char *at = strstr(line, "@shardload-shm-");
    unsigned long ino = 0;
    char a[32], b[32], c[32], dd[32], ee[32], ff[32];
    if (!at || sscanf(line, "%31s %31s %31s %31s %31s %31s %lu", a, b, c, dd, ee, ff, &ino) != 7) continue;
    found = any;
    for (int i = 0; i < n && !found; i++) found = inodes[i] == ino;
    if (found) snprintf(name, len, "%s", at + 1), name[strcspn(name, "\n ")] = 0;
  }
  if (f) fclose(f);
  return found;
}

/* Connects to the socket of the shm collective held by PID, as rank RANK with a token of zeros
 * (as user nobody with OTHER_USER, once it found the socket). 0: refused (the connection
 * ended, no descriptor came); 1: a descriptor came; 2: no socket was found within 5 s; 3: it
 * could not become nobody. */
static int stranger(pid_t pid, int rank, bool other_user) {
  char name[64] = "";
  for (int i = 0; i < 1000 && !socket_of(pid, name, sizeof name); i++) usleep(5000);
  if (!name[0]) return 2;
  if (other_user && (setgid(65534) != 0 || setuid(65534) != 0)) return 3;
  int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path + 1, name, strlen(name));
  struct timeval tv = {5, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(s, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name))) != 0)
    return 0; /* closed before it could connect: refused as well */
  struct {
    int32_t rank;
    unsigned char token[32];
  } h = {rank, {0}};
  send(s, &h, sizeof h, MSG_NOSIGNAL);
  char byte;
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  struct iovec iov = {&byte, 1};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  ssize_t k = recvmsg(s, &m, 0);
  close(s);
  return k > 0 && m.msg_controllen > 0 ? 1 : 0;
}

static int stranger_result = -1;
static pid_t stranger_pid;

static void *stranger_thread(void *arg) {
  stranger_result = stranger(stranger_pid, 1, false);
  return NULL;
}

/* Rank 1 comes late for its segment (SHARDLOAD_TEST_SHM_ATTACH_DELAY_MS), so that meanwhile a
 * process of no rank (rank 0's child), another user's (when the test runs as root) and rank 1's
 * own thread with a wrong token knock at rank 0's socket: each refused, then the job moves data. */
static int stranger_rank(int rank, int world, void *arg) {
  const job *j = arg;
  sl_test_write_pid(j->dir, rank);
  pid_t kids[2] = {-1, -1};
  pthread_t t;
  if (rank == 0) {
    pid_t me = getpid();
    for (int k = 0; k < 2; k++) {
      if ((kids[k] = fork()) == 0) {
        if (k == 1 && geteuid() != 0) _exit(3); /* not root: no other user to be */
        _exit(stranger(me, 1, k == 1));
      }
    }
  }
  if (rank == 1) {
    setenv("SHARDLOAD_TEST_SHM_ATTACH_DELAY_MS", "1500", 1);
    stranger_pid = sl_test_read_pid(j->dir, 0);
    pthread_create(&t, NULL, stranger_thread, NULL);
  }
  char err[1024] = "";
  sl_context *ctx = NULL;
  sl_status s = open_ctx(j, rank, world, &ctx, err, sizeof err);
  SL_CHILD_CHECK(s == SL_OK, "rank %d: %s", rank, err);
  if (rank == 1) {
    pthread_join(t, NULL);
    SL_CHILD_CHECK(stranger_result == 0, "rank 1's thread with a wrong token: %d (0: refused)", stranger_result);
  }
  for (int k = 0; rank == 0 && k < 2; k++) {
    int status = 0;
    waitpid(kids[k], &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 100;
    SL_CHILD_CHECK(code == 0 || (k == 1 && code == 3), "stranger %d: %d (0: refused)", k, code);
  }
  if (check_bcast(ctx->data, ctx->data_comm, rank, world, 3u << 20, 1)) return 1;
  sl_context_destroy(ctx);
  return 0;
}

static void test_strangers_refused(void **state) {
  job j = {.collective = "shm", .dir = sl_test_dir("strangers")};
  int codes[2];
  spawn(&j, 2, stranger_rank, "strangers-rdzv", 60000, codes);
  for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
  free(j.dir);
}

/* ---- ranks of other hosts -------------------------------------------------------------------------- */

static int hosts_rank(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context *ctx = NULL;
  double t0 = now_s();
  sl_status s = open_ctx(j, rank, world, &ctx, err, sizeof err);
  double took = now_s() - t0;
  if (j->collective) {
    fprintf(stderr, "rank %d: %s in %.2f s: %s\n", rank, sl_status_name(s), took, err);
    SL_CHILD_CHECK(s == SL_ERR_UNSUPPORTED, "rank %d: %s (%s)", rank, sl_status_name(s), err);
    SL_CHILD_CHECK(strstr(err, "ranks 2, 3 run on another host than rank 0"), "rank %d: '%s'", rank, err);
    SL_CHILD_CHECK(strstr(err, "--collective gloo"), "rank %d: '%s' says nothing to do", rank, err);
    SL_CHILD_CHECK(took < 10, "rank %d took %.1f s", rank, took);
    return 0;
  }
  SL_CHILD_CHECK(s == SL_OK, "rank %d: %s", rank, err);
  const char *why = sl_context_collective_reason(ctx);
  SL_CHILD_CHECK(strcmp(sl_context_collective_name(ctx), "hier") == 0 && strstr(why, "2 hosts (2+2 ranks)"),
                 "rank %d: %s (%s)", rank, sl_context_collective_name(ctx), why);
  sl_context_destroy(ctx);
  return 0;
}

static void test_other_hosts(void **state) {
  job j = {.collective = "shm", .tag = {NULL, NULL, "b", "b"}};
  int codes[MAX_WORLD];
  spawn(&j, 4, hosts_rank, "hosts-forced", 60000, codes);
  for (int r = 0; r < 4; r++) assert_int_equal(codes[r], 0);
  job k = {.collective = NULL, .tag = {NULL, NULL, "b", "b"}};
  spawn(&k, 4, hosts_rank, "hosts-auto", 60000, codes);
  for (int r = 0; r < 4; r++) assert_int_equal(codes[r], 0);
}

/* ---- the segment's descriptor out of reach, a bad descriptor, ranks that leave, slow ops ---- */

/* This process without CAP_SYS_PTRACE: in a test run as root, ranks and stranger alike, so that
 * they are to each other what two processes of one ordinary user are (/proc/PID/fd readable
 * while PID is dumpable, not otherwise). */
static void drop_ptrace_cap(void) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  if (syscall(SYS_capget, &h, d) != 0) return;
  d[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
  d[CAP_SYS_PTRACE / 32].permitted &= ~(1u << (CAP_SYS_PTRACE % 32));
  syscall(SYS_capset, &h, d);
}

/* Opens every descriptor of PID that links to the shm collective's memfd: 1 when one opened,
 * 0 when none did. *SAW: whether the fd table could be read at all. */
static int open_segment_of(pid_t pid, bool *saw) {
  char dirp[64];
  snprintf(dirp, sizeof dirp, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(dirp);
  if (!d) return 0;
  int got = 0;
  struct dirent *e;
  while ((e = readdir(d)) && !got) {
    char p[320], link[256];
    snprintf(p, sizeof p, "%s/%s", dirp, e->d_name);
    ssize_t k = readlink(p, link, sizeof link - 1);
    if (k <= 0) continue;
    *saw = true;
    link[k] = 0;
    if (!strstr(link, "shardload-shm")) continue;
    int fd = open(p, O_RDWR | O_CLOEXEC);
    if (fd >= 0) got = 1, close(fd);
  }
  closedir(d);
  return got;
}

/* A process of the ranks' user that is no rank tries /proc/PID/fd of both ranks while rank 1
 * comes late for its segment: the memfd is in rank 0's table all that time, and neither rank is
 * dumpable while it holds it, so no open may succeed. 0: none did (after it read both tables
 * before the start: the check can fail); 1: it opened the segment; 4: it never read a table. */
static int fd_stranger(pid_t r0, pid_t r1, double seconds) {
  drop_ptrace_cap();
  bool saw0 = false, saw1 = false;
  open_segment_of(r0, &saw0), open_segment_of(r1, &saw1); /* both dumpable: readable */
  if (!saw0 || !saw1) return 4;
  double until = now_s() + seconds;
  while (now_s() < until) {
    bool saw = false;
    if (open_segment_of(r0, &saw) || open_segment_of(r1, &saw)) return 1;
    usleep(2000);
  }
  return 0;
}

static int fd_rank(int rank, int world, void *arg) {
  const job *j = arg;
  drop_ptrace_cap(); /* as strong as the stranger (a process's caps must cover its target's) */
  sl_test_write_pid(j->dir, rank);
  pid_t kid = -1;
  if (rank == 0) {
    pid_t me = getpid(), other = sl_test_read_pid(j->dir, 1);
    if ((kid = fork()) == 0) _exit(fd_stranger(me, other, 3.0));
    usleep(200000); /* it read both tables before the start */
  }
  if (rank == 1) setenv("SHARDLOAD_TEST_SHM_ATTACH_DELAY_MS", "1500", 1);
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  SL_CHILD_CHECK(strcmp(sl_context_collective_name(ctx), "shm") == 0, "rank %d: not shm", rank);
  SL_CHILD_CHECK(prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1, "rank %d: not dumpable again after the start", rank);
  if (rank == 0) {
    int status = 0;
    waitpid(kid, &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 100;
    SL_CHILD_CHECK(code == 0, "the stranger: %d (1: it opened the segment through /proc/PID/fd)", code);
  }
  if (check_bcast(ctx->data, ctx->data_comm, rank, world, 4096, 2)) return 1;
  sl_context_destroy(ctx);
  return 0;
}

static void test_segment_fd_out_of_reach(void **state) {
  job j = {.collective = "shm", .dir = sl_test_dir("fdreach")};
  int codes[2];
  spawn(&j, 2, fd_rank, "fdreach-rdzv", 60000, codes);
  for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
  free(j.dir);
}

/* A buggy root writes a descriptor no root would (case 0: a total past the bound, whose chunk
 * count truncates to 0 and whose part lies at 2^53, into the job's communicator; case 1: a part
 * longer than the total, into a split's): the receiver fails naming the mismatch, without
 * reading or writing out of bounds; after case 1 the job's communicator still works (a failure
 * breaks its own communicator only). */
static int bad_desc_rank(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  SL_CHILD_CHECK(strcmp(sl_context_collective_name(ctx), "shm") == 0, "rank %d: not shm", rank);
  shm_comm *c = ctx->data_comm;
  void *sub = NULL;
  if (j->victim == 1) {
    SL_CHILD_CHECK(ctx->data->split(ctx->data_comm, 0, rank, &sub) == SL_OK, "rank %d: split", rank);
    c = sub;
  }
  if (rank == 0) {
    chan_hdr *h = c->hdr;
    uint64_t total = j->victim == 0 ? 1ull << 53 : 4096;
    h->kind = 2, h->root = 0, h->total = total, h->chunk0 = 0;
    h->nchunks = (uint32_t)((total + (1u << 20) - 1) >> 20);
    c->parts[1] = j->victim == 0 ? (chan_part){total - 4096, 4096} : (chan_part){0, 8192};
    __atomic_store_n(&h->claim, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&h->gen, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, &h->gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    if (j->victim == 0) {
      usleep(1500000); /* rank 1 has judged it */
      return 0;        /* no destroy: rank 1 does not wait for this root */
    }
  }
  if (rank == 1) {
    unsigned char buf[8192];
    sl_status st = ctx->data->scatterv(c, NULL, NULL, NULL, buf, j->victim == 0 ? 4096 : 8192, 0, NULL);
    SL_CHILD_CHECK(st == SL_ERR_MISMATCH, "rank 1: case %d: %s", j->victim, sl_status_name(st));
    SL_CHILD_CHECK(strstr(sl_context_errmsg(ctx), "disagree on op 1"), "rank 1: '%s'", sl_context_errmsg(ctx));
  }
  if (j->victim == 0) return 0;
  SL_CHILD_CHECK(ctx->data->barrier(ctx->data_comm) == SL_OK,
                 "rank %d: the job's communicator after a split's failure: %s", rank, sl_context_errmsg(ctx));
  if (check_bcast(ctx->data, ctx->data_comm, rank, world, (1u << 20) + 3, 6)) return 1;
  ctx->data->fini(sub);
  sl_context_destroy(ctx);
  return 0;
}

static void test_bad_descriptor(void **state) {
  for (int k = 0; k < 2; k++) {
    job j = {.collective = "shm", .victim = k};
    int codes[2];
    spawn(&j, 2, bad_desc_rank, k ? "baddesc1" : "baddesc0", 60000, codes);
    for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
  }
}

/* Scatterv from rank 0: rank 1's part first and small, rank 2's past the ring and late (rank 2
 * sleeps first); rank 1 leaves (its process ends) once it has its part, which module.h allows:
 * the root and rank 2 need nothing more of it and finish. Then the root's own part when its
 * receive buffer overlaps rank 2's part of the send buffer: rank 2 gets its part as it was. */
static int leaves_rank(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  const sl_collective_ops *o = ctx->data;
  void *c = ctx->data_comm;
  size_t small = 4096, big = (24u << 20) + 7;
  size_t counts[3] = {small, small, big}, displs[3] = {small + big + small, 0, small};
  size_t total = 3 * small + big;
  unsigned char *send = rank == 0 ? malloc(total) : NULL, *recv = malloc(big);
  for (size_t i = 0; send && i < total; i++) send[i] = pat(3, 0, i);
  /* 1: overlapping: the root's part in front of rank 2's, its receive buffer on rank 2's */
  size_t sh = small + 1; /* not a multiple of pat's period */
  size_t ov[3] = {big, small, big}, od[3] = {0, 0, sh};
  unsigned char *osend = rank == 0 ? malloc(sh + big) : NULL;
  for (size_t i = 0; osend && i < sh + big; i++) osend[i] = pat(4, 0, i);
  sl_status st = o->scatterv(c, osend, ov, od, rank == 0 ? osend + sh : recv, ov[rank], 0, NULL);
  SL_CHILD_CHECK(st == SL_OK, "rank %d: overlapping scatterv: %s", rank, sl_status_name(st));
  for (size_t i = 0; rank && i < ov[rank]; i++)
    SL_CHILD_CHECK(recv[i] == pat(4, 0, od[rank] + i), "rank %d: overlapping scatterv: byte %zu", rank, i);
  for (size_t i = 0; !rank && i < big; i++)
    SL_CHILD_CHECK(osend[sh + i] == pat(4, 0, i), "rank 0: its own part: byte %zu", i);
  if (rank == 2) usleep(500000);
  st = o->scatterv(c, send, counts, displs, recv, counts[rank], 0, NULL);
  SL_CHILD_CHECK(st == SL_OK, "rank %d: scatterv: %s (%s)", rank, sl_status_name(st), sl_context_errmsg(ctx));
  for (size_t i = 0; i < counts[rank]; i++)
    SL_CHILD_CHECK(recv[i] == pat(3, 0, displs[rank] + i), "rank %d: scatterv: byte %zu", rank, i);
  free(send), free(osend), free(recv);
  if (rank == 1) _exit(0); /* it has what it came for */
  usleep(300000);          /* rank 1 has gone */
  return 0;                /* no destroy: the control plane would miss rank 1 */
}

static void test_rank_leaves_after_its_part(void **state) {
  job j = {.collective = "shm", .timeout_ms = 10000};
  int codes[3];
  spawn(&j, 3, leaves_rank, "leaves", 60000, codes);
  for (int r = 0; r < 3; r++) assert_int_equal(codes[r], 0);
}

/* A broadcast that takes longer than the timeout while its data flows (rank 1 runs 10 ms in
 * each 100: rank 0's child stops and continues it) succeeds: the timeout is one without
 * progress. A second shm instance over the context's control plane gets the short timeout.
 * 1 GiB at a tenth of a core's copy rate outlasts the 500 ms timeout (about 1 s here), while
 * each stop (90 ms) stays far inside it: a busy machine has to starve rank 1 through five
 * windows in a row to make a stop look like a lost peer (at 5 ms in 100 and a 400 ms timeout
 * it once did). */
static int slow_rank(int rank, int world, void *arg) {
  const job *j = arg;
  sl_test_write_pid(j->dir, rank);
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  /* First touch of 1 GiB takes seconds under a sanitizer: done before the short-timeout
   * instance exists, and the ranks meet on the context's own plane (its job timeout) first,
   * so that the 500 ms only ever measures the broadcast. */
  size_t bytes = (size_t)1 << 30;
  unsigned char *b = malloc(bytes);
  SL_CHILD_CHECK(b, "malloc");
  for (size_t i = 0; i < bytes; i += 4096) b[i] = rank == 0 ? pat(5, 0, i) : 0;
  SL_CHILD_CHECK(ctx->data->barrier(ctx->data_comm) == SL_OK, "rank %d: barrier (job timeout)", rank);
  const sl_collective_ops *o = sl__collective_shm();
  sl_collective_init ci = {.size = sizeof ci,
                           .host = &ctx->host,
                           .rank = rank,
                           .world_size = world,
                           .timeout_ms = 500,
                           .control = &ctx->control,
                           .ops = o};
  void *c = NULL;
  SL_CHILD_CHECK(o->init(&ci, &c) == SL_OK, "rank %d: shm init: %s", rank, sl_context_errmsg(ctx));
  SL_CHILD_CHECK(ctx->data->barrier(ctx->data_comm) == SL_OK, "rank %d: barrier (job timeout)", rank);
  SL_CHILD_CHECK(o->barrier(c) == SL_OK, "rank %d: barrier", rank);
  pid_t kid = -1;
  if (rank == 0 && (kid = fork()) == 0) {
    pid_t victim = sl_test_read_pid(j->dir, 1);
    for (;;) kill(victim, SIGSTOP), usleep(90000), kill(victim, SIGCONT), usleep(10000);
  }
  double t0 = now_s();
  sl_status st = o->broadcast(c, b, bytes, 0, NULL);
  double took = now_s() - t0;
  if (rank == 0) {
    kill(kid, SIGKILL), waitpid(kid, NULL, 0);
    kill(sl_test_read_pid(j->dir, 1), SIGCONT);
  }
  fprintf(stderr, "rank %d: %s in %.2f s (timeout 500 ms)\n", rank, sl_status_name(st), took);
  SL_CHILD_CHECK(st == SL_OK, "rank %d: %s", rank, sl_context_errmsg(ctx));
  SL_CHILD_CHECK(rank == 1 || took > 0.5, "rank 0: the broadcast took %.2f s: not past the timeout", took);
  for (size_t i = 0; i < bytes; i += 4096) SL_CHILD_CHECK(b[i] == pat(5, 0, i), "rank %d: byte %zu", rank, i);
  SL_CHILD_CHECK(ctx->data->barrier(ctx->data_comm) == SL_OK, "rank %d: barrier (job timeout)", rank);
  SL_CHILD_CHECK(o->barrier(c) == SL_OK, "rank %d: barrier", rank);
  o->fini(c);
  free(b);
  sl_context_destroy(ctx);
  return 0;
}

static void test_slow_op_within_timeout(void **state) {
  job j = {.collective = "shm", .dir = sl_test_dir("slow")};
  int codes[2];
  spawn(&j, 2, slow_rank, "slow-rdzv", 60000, codes);
  for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
  free(j.dir);
}

/* What a rank does alone tells the peers at once, never after the timeout: rank 1 finishes a
 * split's communicator while rank 0 waits there for its broadcast; then rank 1 calls a
 * broadcast with a root out of range while rank 0 waits for rank 1's. */
static int alone_rank(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  const sl_collective_ops *o = ctx->data;
  void *sub = NULL;
  SL_CHILD_CHECK(o->split(ctx->data_comm, 0, rank, &sub) == SL_OK, "rank %d: split", rank);
  unsigned char b[64] = {0};
  for (int k = 0; k < 2; k++) {
    void *c = k == 0 ? sub : ctx->data_comm;
    if (rank == 1) {
      if (k == 0) o->fini(sub);
      else SL_CHILD_CHECK(o->broadcast(c, b, sizeof b, 7, NULL) == SL_ERR_INVALID, "rank 1: a root out of range");
    } else {
      double t0 = now_s();
      sl_status st = o->broadcast(c, b, sizeof b, 1, NULL);
      double took = now_s() - t0;
      const char *msg = sl_context_errmsg(ctx);
      fprintf(stderr, "rank 0: case %d: %s after %.2f s: %s\n", k, sl_status_name(st), took, msg);
      SL_CHILD_CHECK(st == SL_ERR_PEER && sl_test_names_rank(msg, 1), "rank 0: case %d: %s: '%s'", k,
                     sl_status_name(st), msg);
      SL_CHILD_CHECK(took < 5, "rank 0: case %d: waited %.1f s (timeout %d ms)", k, took, j->timeout_ms);
      if (k == 0) o->fini(sub);
    }
    if (k == 0) SL_CHILD_CHECK(o->barrier(ctx->data_comm) == SL_OK, "rank %d: the job's communicator", rank);
  }
  sl_context_destroy(ctx);
  return 0;
}

static void test_alone_tells_peers(void **state) {
  job j = {.collective = "shm", .timeout_ms = 30000};
  int codes[2];
  spawn(&j, 2, alone_rank, "alone", 90000, codes);
  for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
}

/* A rank away in a step outside the segment (sl__shm_away: a hier leader between the hosts)
 * is given one timeout more by a peer whose wait on it runs out: rank 0 stays away one and a
 * half timeouts, then roots a broadcast, which rank 1 gets; then, on a split, it stays away as
 * long and breaks the communicator saying whom it lost, which rank 1's failure names. */
static int away_rank(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  const sl_collective_ops *o = ctx->data;
  void *sub = NULL;
  SL_CHILD_CHECK(o->split(ctx->data_comm, 0, rank, &sub) == SL_OK, "rank %d: split", rank);
  unsigned char b[4096];
  for (size_t i = 0; i < sizeof b; i++) b[i] = rank == 0 ? pat(9, 0, i) : 0;
  useconds_t away_us = (useconds_t)j->timeout_ms * 1500u;
  if (rank == 0) {
    sl__shm_away(ctx->data_comm, true);
    usleep(away_us);
    sl__shm_away(ctx->data_comm, false);
  }
  sl_status st = o->broadcast(ctx->data_comm, b, sizeof b, 0, NULL);
  SL_CHILD_CHECK(st == SL_OK, "rank %d: the broadcast from a root back from away: %s", rank, sl_context_errmsg(ctx));
  for (size_t i = 0; i < sizeof b; i++) SL_CHILD_CHECK(b[i] == pat(9, 0, i), "rank %d: byte %zu", rank, i);
  if (rank == 0) {
    sl__shm_away(sub, true);
    usleep(away_us);
    sl__shm_break(sub, SL_ERR_TIMEOUT, 7, "a step outside the segment failed");
  } else {
    st = o->broadcast(sub, b, sizeof b, 0, NULL);
    const char *msg = sl_context_errmsg(ctx);
    fprintf(stderr, "rank 1: %s: %s\n", sl_status_name(st), msg);
    SL_CHILD_CHECK(st == SL_ERR_PEER && strstr(msg, "rank 0 lost rank 7"), "rank 1: %s: '%s'", sl_status_name(st), msg);
  }
  o->fini(sub);
  sl_context_destroy(ctx);
  return 0;
}

static void test_away_rank_given_a_timeout(void **state) {
  job j = {.collective = "shm", .timeout_ms = 2000};
  int codes[2];
  spawn(&j, 2, away_rank, "away", 60000, codes);
  for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
}

/* Where a sandbox refuses memfd_create (here a seccomp filter on rank 1), auto keeps host
 * staging on Gloo naming the rank, rather than choose shm and fail at its start. */
static int sandboxed_rank(int rank, int world, void *arg) {
  const job *j = arg;
  if (rank == 1) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_memfd_create, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
    SL_CHILD_CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
                       prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0,
                   "rank 1: seccomp: %s", strerror(errno));
    SL_CHILD_CHECK(syscall(SYS_memfd_create, "x", 0) < 0 && errno == EPERM, "rank 1: the filter lets memfd_create by");
  }
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  const char *why = sl_context_collective_reason(ctx);
  SL_CHILD_CHECK(strcmp(sl_context_collective_name(ctx), "gloo") == 0 &&
                     strstr(why, "not shm: rank 1 cannot make a memfd"),
                 "rank %d: %s (%s)", rank, sl_context_collective_name(ctx), why);
  if (check_bcast(ctx->data, ctx->data_comm, rank, world, 4096, 7)) return 1;
  sl_context_destroy(ctx);
  return 0;
}

static void test_auto_sandboxed(void **state) {
  job j = {.collective = NULL};
  int codes[2];
  spawn(&j, 2, sandboxed_rank, "sandboxed", 60000, codes);
  for (int r = 0; r < 2; r++) assert_int_equal(codes[r], 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ops_and_split),
      cmocka_unit_test(test_channels_run_out),
      cmocka_unit_test(test_loads_match_gloo),
      cmocka_unit_test(test_rank_killed_mid_load),
      cmocka_unit_test(test_rank_killed_at_attach),
      cmocka_unit_test(test_left_after_a_peer_was_killed),
      cmocka_unit_test(test_rank_stopped),
      cmocka_unit_test(test_abort),
      cmocka_unit_test(test_ranks_disagree),
      cmocka_unit_test(test_strangers_refused),
      cmocka_unit_test(test_other_hosts),
      cmocka_unit_test(test_segment_fd_out_of_reach),
      cmocka_unit_test(test_bad_descriptor),
      cmocka_unit_test(test_rank_leaves_after_its_part),
      cmocka_unit_test(test_slow_op_within_timeout),
      cmocka_unit_test(test_away_rank_given_a_timeout),
      cmocka_unit_test(test_alone_tells_peers),
      cmocka_unit_test(test_auto_sandboxed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
