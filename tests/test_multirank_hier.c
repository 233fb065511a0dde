/* The hier data collective (docs/DESIGN.md#hier) between real processes over real Gloo and
 * real shm, its "hosts" made by SHARDLOAD_TEST_SHM_HOST_TAG: 2 hosts of 2 ranks, and 3 hosts of
 * 2+1+2 whose ranks interleave (a host's ranks are not contiguous). auto chooses hier and says
 * so; every op gives exact bytes (odd sizes, empty parts, every root, leaders' or not, parts out
 * of rank order), sub-communicators too (even/odd, pairs across and within hosts, a split of a
 * split), forced on one host and on hosts of one rank each as well; loads through the command
 * (scatter, broadcast, an HSDP mesh, 5 ranks on 3 hosts, and one host of 4 forced to hier) are
 * bit-identical to Gloo's; a rank killed mid-load, a leader or not, ends every rank within the
 * timeout naming it (or, on another host, its leader); a leader's host hears what failed it (its
 * own check of the count table, or the leaders' last step of a broadcast) as that; ranks that
 * cannot read the boot id are hosts of their own for hier as for auto. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

#define MAX_WORLD 5

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

typedef struct job {
  char *rdzv;
  char *dir;
  const char *collective;
  int timeout_ms;
  const char *tag[MAX_WORLD]; /* SHARDLOAD_TEST_SHM_HOST_TAG per rank */
  const char *reason;         /* what auto's reason must hold */
  int victim;
  const char *path;
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

static unsigned char pat(int op, int root, size_t i) {
  return (unsigned char)(i * 131u + (size_t)op * 17u + (size_t)root * 7u + 1u);
}

/* ---- the ops ------------------------------------------------------------------------------- */

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

/* From every root: rank r's part (r + 1) * BIG + r bytes, rank 1's empty; with REVERSED the
 * parts lie in the send buffer in reverse rank order (no host's parts in order: packed). */
static int check_scatter(const sl_collective_ops *o, void *comm, int rank, int n, size_t big, bool reversed, int op) {
  for (int root = 0; root < n; root++) {
    size_t counts[MAX_WORLD], displs[MAX_WORLD], total = 0;
    for (int q = 0; q < n; q++) {
      int r = reversed ? n - 1 - q : q;
      counts[r] = r == 1 ? 0 : (size_t)(r + 1) * big + (size_t)r;
      displs[r] = total;
      total += counts[r];
    }
    unsigned char *send = rank == root ? malloc(total + 1) : NULL, *recv = malloc(counts[rank] + 1);
    SL_CHILD_CHECK(recv && (rank != root || send), "malloc");
    for (size_t i = 0; send && i < total; i++) send[i] = pat(op, root, i);
    memset(recv, 0xee, counts[rank] + 1);
    sl_status st = o->scatterv(comm, send, counts, displs, recv, counts[rank], root, NULL);
    SL_CHILD_CHECK(st == SL_OK, "rank %d: scatterv from %d: %s", rank, root, sl_status_name(st));
    for (size_t i = 0; i < counts[rank]; i++)
      SL_CHILD_CHECK(recv[i] == pat(op, root, displs[rank] + i), "rank %d: scatterv from %d: byte %zu", rank, root, i);
    SL_CHILD_CHECK(recv[counts[rank]] == 0xee, "rank %d: scatterv wrote past its part", rank);
    free(send);
    free(recv);
  }
  return 0;
}

/* A split by COLOR and KEY (by rank): this rank's sub holds the ranks of its color ordered by
 * (key, rank), and its ops give exact bytes. */
static int check_split(const sl_collective_ops *o, void *comm, int rank, int world, const int *color, const int *key,
                       int op) {
  void *sub = NULL;
  SL_CHILD_CHECK(o->split(comm, color[rank], key[rank], &sub) == SL_OK, "rank %d: split %d", rank, op);
  SL_CHILD_CHECK((color[rank] >= 0) == (sub != NULL), "rank %d: split %d: a communicator for color %d", rank, op,
                 color[rank]);
  if (!sub) return 0;
  int order[MAX_WORLD], size = 0, pos = -1;
  for (int r = 0; r < world; r++) {
    if (color[r] != color[rank]) continue;
    int at = size++;
    while (at > 0 && key[order[at - 1]] > key[r]) order[at] = order[at - 1], at--;
    order[at] = r;
  }
  for (int p = 0; p < size; p++)
    if (order[p] == rank) pos = p;
  int32_t v = rank, got[MAX_WORLD] = {0};
  SL_CHILD_CHECK(o->allgather(sub, &v, got, sizeof v, NULL) == SL_OK, "rank %d: sub allgather", rank);
  for (int p = 0; p < size; p++)
    SL_CHILD_CHECK(got[p] == order[p], "rank %d: split %d: sub rank %d is rank %d, not %d", rank, op, p, got[p],
                   order[p]);
  if (check_bcast(o, sub, pos, size, (1u << 20) + 7, op)) return 1;
  if (check_scatter(o, sub, pos, size, 100003, false, op + 1)) return 1;
  SL_CHILD_CHECK(o->barrier(sub) == SL_OK, "rank %d: sub barrier", rank);
  void *subsub = NULL; /* a split of a split: the group again, keys reversed */
  SL_CHILD_CHECK(o->split(sub, 0, -pos, &subsub) == SL_OK && subsub, "rank %d: a sub split", rank);
  if (check_bcast(o, subsub, size - 1 - pos, size, 4099, op + 2)) return 1;
  o->fini(subsub);
  o->fini(sub);
  return 0;
}

static int ops_rank(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context *ctx = NULL;
  sl_status s = open_ctx(j, rank, world, &ctx, err, sizeof err);
  SL_CHILD_CHECK(s == SL_OK, "rank %d: %s", rank, err);
  const char *why = sl_context_collective_reason(ctx);
  SL_CHILD_CHECK(strcmp(sl_context_collective_name(ctx), "hier") == 0 && (!j->reason || strstr(why, j->reason)),
                 "rank %d: %s (%s)", rank, sl_context_collective_name(ctx), why);
  const sl_collective_ops *o = ctx->data;
  void *comm = ctx->data_comm;
  size_t sizes[] = {0, 1, (1u << 20) + 3, (9u << 20) + 5}; /* the last wraps shm's ring of 8 slots */
  for (int k = 0; k < 4; k++)
    if (check_bcast(o, comm, rank, world, sizes[k], k)) return 1;
  if (check_scatter(o, comm, rank, world, (1u << 20) + 1, false, 9)) return 1;
  if (check_scatter(o, comm, rank, world, 65537, true, 10)) return 1;
  int32_t mine = 1000 + rank, all[MAX_WORLD] = {0};
  SL_CHILD_CHECK(o->allgather(comm, &mine, all, sizeof mine, NULL) == SL_OK, "rank %d: allgather", rank);
  for (int r = 0; r < world; r++) SL_CHILD_CHECK(all[r] == 1000 + r, "rank %d: allgather[%d] = %d", rank, r, all[r]);
  SL_CHILD_CHECK(o->barrier(comm) == SL_OK, "rank %d: barrier", rank);
  int color[MAX_WORLD] = {0}, key[MAX_WORLD] = {0};
  /* even and odd ranks, keys reversed (the sub's root 0 is its highest rank) */
  for (int r = 0; r < world; r++) color[r] = r % 2, key[r] = world - r;
  if (check_split(o, comm, rank, world, color, key, 20)) return 1;
  /* pairs (0, 1), (2, 3), 4 alone, the higher rank first: the HSDP chain's shape */
  for (int r = 0; r < world; r++) color[r] = r / 2, key[r] = 1 - r % 2;
  if (check_split(o, comm, rank, world, color, key, 30)) return 1;
  /* ranks 0 and the last, the others out */
  for (int r = 0; r < world; r++) color[r] = r == 0 || r == world - 1 ? 0 : -1, key[r] = r;
  if (check_split(o, comm, rank, world, color, key, 40)) return 1;
  /* the parent still works after its sub-communicators */
  if (check_bcast(o, comm, rank, world, 4096, 50)) return 1;
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

static void test_ops_two_hosts(void **state) {
  int codes[MAX_WORLD];
  job j = {.tag = {"a", "a", "b", "b"},
           .reason =
               "hier: backend cpu of rank 0 stages through host memory; 2 hosts (2+2 ranks): shm within each "
               "host, gloo between the hosts' leaders"};
  spawn(&j, 4, ops_rank, "ops-2x2", 180000, codes);
  for (int r = 0; r < 4; r++) assert_int_equal(codes[r], 0);
}

static void test_ops_three_hosts(void **state) {
  int codes[MAX_WORLD];
  /* hosts {0, 3}, {1}, {2, 4} */
  job j = {.tag = {"a", "b", "c", "a", "c"}, .reason = "3 hosts (2+1+2 ranks)"};
  spawn(&j, 5, ops_rank, "ops-3", 240000, codes);
  for (int r = 0; r < 5; r++) assert_int_equal(codes[r], 0);
  /* forced on one host: its shm alone */
  job k = {.collective = "hier"};
  spawn(&k, 3, ops_rank, "ops-1host", 180000, codes);
  for (int r = 0; r < 3; r++) assert_int_equal(codes[r], 0);
  /* forced on hosts of one rank each: the leaders' Gloo alone, no shm */
  job m = {.collective = "hier", .tag = {"a", "b", "c"}};
  spawn(&m, 3, ops_rank, "ops-3x1", 180000, codes);
  for (int r = 0; r < 3; r++) assert_int_equal(codes[r], 0);
}

/* ---- loads through the command, against Gloo's ----------------------------------------------- */

static const char *hooks_bin(void) {
  const char *b = getenv("SHARDLOAD_TEST_HOOKS_BIN");
  if (!b || !*b) fail_msg("SHARDLOAD_TEST_HOOKS_BIN is not set (CTest sets it to shardload-test-hooks)");
  return b;
}

/* The same load with --collective gloo and with COLL (NULL: auto), ranks tagged by TAGS; the
 * second must say WANT and dump the same bytes on every rank. */
static void load_both(const char *ckpt, const char *dir, int world, const char *tags, const char *coll,
                      const char *opts, const char *label, const char *want) {
  char *out = NULL, dump[2][600];
  const char *how[2] = {"--collective gloo", coll ? coll : ""};
  for (int k = 0; k < 2; k++) {
    snprintf(dump[k], sizeof dump[k], "%s/%s-%d", dir, label, k);
    int rc = sl_test_run(&out,
                         "mkdir -p '%s' && SHARDLOAD_TEST_HOST_TAGS='%s' '%s' load '%s' --nproc %d %s --timeout 30 "
                         "--dump '%s' %s",
                         dump[k], tags, hooks_bin(), ckpt, world, how[k], dump[k], opts);
    if (rc != 0) fprintf(stderr, "%s (%s): %s\n", label, how[k], out);
    assert_int_equal(rc, 0);
    if (k == 1 && !strstr(out, want)) fail_msg("%s: '%s' is not in: %s", label, want, out);
    free(out);
  }
  int bad = sl_test_dumps_differ(dump[0], dump[1], world);
  if (bad >= 0) fail_msg("%s: rank %d's shards differ between gloo and hier", label, bad);
}

static void test_loads_match_gloo(void **state) {
  char *dir = sl_test_dir("hier-loads"), ckpt[600], *out = NULL;
  snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
  assert_int_equal(sl_test_run(&out, "'%s' synth '%s' --size 24MiB --seed 5", sl_test_bin(), ckpt), 0);
  free(out);
  const char *two =
      "collective: hier: backend cpu of rank 0 stages through host memory; 2 hosts (2+2 ranks): shm "
      "within each host, gloo between the hosts' leaders";
  load_both(ckpt, dir, 4, "a,a,b,b", NULL, "", "w4", two);
  load_both(ckpt, dir, 4, "a,b,a,b", NULL, "--param-dtype F32 --strategy broadcast", "w4-bcast", "2 hosts (2+2 ranks)");
  load_both(ckpt, dir, 4, "a,a,b,b", NULL, "--mesh 2x2 --placement '[replicate, shard(0)]' --staging 2MiB", "hsdp",
            two);
  load_both(ckpt, dir, 4, "a,b,a,b", NULL, "--mesh 2x2 --placement '[replicate, shard(0)]' --staging 2MiB",
            "hsdp-across", "2 hosts (2+2 ranks)");
  load_both(ckpt, dir, 5, "a,b,c,a,c", NULL, "--staging 3MiB", "w5", "3 hosts (2+1+2 ranks)");
  load_both(ckpt, dir, 4, "", "--collective hier", "", "one-host", "collective: hier: forced");
  /* every host of one rank: Gloo */
  assert_int_equal(sl_test_run(&out, "SHARDLOAD_TEST_HOST_TAGS=a,b '%s' load '%s' --nproc 2 --timeout 30", hooks_bin(),
                               ckpt),
                   0);
  if (!strstr(out, "collective: gloo") || !strstr(out, "no host has two ranks")) fail_msg("two hosts of one: %s", out);
  free(out);
  free(dir);
}

/* ---- a rank killed mid-load ---------------------------------------------------------------------- */

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
  SL_CHILD_CHECK(strcmp(sl_context_collective_name(ctx), "hier") == 0, "rank %d: not hier", rank);
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
  /* its host's ranks name it; another host's may name its host's leader instead, which failed
   * (saying it lost the victim) and left: a leader's shm failure has no way to the other hosts
   * but its Gloo connections closing (docs/DESIGN.md#hier) */
  bool same_host = strcmp(j->tag[rank], j->tag[j->victim]) == 0;
  int leader = j->victim;
  for (int r = world - 1; r >= 0; r--)
    if (strcmp(j->tag[r], j->tag[j->victim]) == 0) leader = r;
  SL_CHILD_CHECK(sl_test_names_rank(msg, j->victim) || (!same_host && sl_test_names_rank(msg, leader)),
                 "rank %d: '%s' names neither rank %d nor its leader %d", rank, msg, j->victim, leader);
  SL_CHILD_CHECK(took < j->timeout_ms / 1000.0 * 1.5, "rank %d took %.1f s (timeout %d ms)", rank, took, j->timeout_ms);
  sl_state_destroy(st);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void test_rank_killed_mid_load(void **state) {
  char *dir = sl_test_dir("hier-killed"), ckpt[600], *out = NULL;
  snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
  assert_int_equal(sl_test_run(&out, "'%s' synth '%s' --size 48MiB", sl_test_bin(), ckpt), 0);
  free(out);
  /* host b's leader (rank 2), then a rank that leads nothing (rank 3) */
  for (int victim = 2; victim <= 3; victim++) {
    job j = {.tag = {"a", "a", "b", "b"}, .timeout_ms = 10000, .victim = victim, .dir = dir, .path = ckpt};
    char sub[32];
    snprintf(sub, sizeof sub, "killed-%d", victim);
    int codes[MAX_WORLD];
    spawn(&j, 4, killed_rank, sub, 90000, codes);
    for (int r = 0; r < 4; r++)
      if (r != victim) assert_int_equal(codes[r], 0);
    assert_int_equal(codes[victim], 128 + SIGKILL);
    for (int r = 0; r < 4; r++) {
      char path[700];
      snprintf(path, sizeof path, "%s/pid-%d", dir, r);
      unlink(path);
    }
  }
  /* three hosts, where the leaders tell each other their verdicts (collectives/hier/hier.c:
   * step_failed): host b's leader (rank 2), then host c's only rank (rank 4); the dead one's
   * connections refuse at once, so nobody waits for its verdict nor calls its host cut off */
  for (int victim = 2; victim <= 4; victim += 2) {
    job j = {.tag = {"a", "a", "b", "b", "c"}, .timeout_ms = 10000, .victim = victim, .dir = dir, .path = ckpt};
    char sub[32];
    snprintf(sub, sizeof sub, "killed3-%d", victim);
    int codes[MAX_WORLD];
    spawn(&j, 5, killed_rank, sub, 90000, codes);
    for (int r = 0; r < 5; r++)
      if (r != victim) assert_int_equal(codes[r], 0);
    assert_int_equal(codes[victim], 128 + SIGKILL);
    for (int r = 0; r < 5; r++) {
      char path[700];
      snprintf(path, sizeof path, "%s/pid-%d", dir, r);
      unlink(path);
    }
  }
  free(dir);
}

/* ---- what a leader's host hears when the leader failed ------------------------------------ */

/* 2 hosts {0, 2}, {1, 3}. MODE 0: host b's leader (rank 1) is called for one byte more than
 * root 0 sends it: it fails on its own finding, which its host hears as that (not as a rank
 * lost). MODE 1: rank 3 dies before the second broadcast from rank 0, which fails rank 1 in
 * its host's step; in the next, from rank 2 (not a leader), rank 0 fails in its last step
 * (sending to rank 1), and rank 2, needing rank 0 in the op after, must hear that rank 0
 * failed and whom it lost, not that rank 0 left the communicator while still needed. */
static int leader_rank(int rank, int world, void *arg) {
  const job *j = arg;
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  const sl_collective_ops *o = ctx->data;
  void *comm = ctx->data_comm;
  sl_status s = SL_OK;
  double t0 = now_s();
  if (j->victim == 0) {
    size_t counts[4], displs[4], total = 0;
    for (int r = 0; r < world; r++) counts[r] = 1000 + (size_t)r, displs[r] = total, total += counts[r];
    unsigned char *send = calloc(total, 1), recv[1100];
    SL_CHILD_CHECK(send, "malloc");
    s = o->scatterv(comm, send, counts, displs, recv, counts[rank] + (rank == 1), 0, NULL);
    free(send);
  } else {
    unsigned char *b = calloc(1u << 20, 1);
    SL_CHILD_CHECK(b, "malloc");
    for (int i = 0; i < 8 && s == SL_OK; i++) {
      if (rank == 3 && i == 1) kill(getpid(), SIGKILL);
      s = o->broadcast(comm, b, 1u << 20, i < 2 ? 0 : 2, NULL);
    }
    free(b);
  }
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "rank %d: %s after %.2f s: %s\n", rank, sl_status_name(s), now_s() - t0, msg);
  SL_CHILD_CHECK(now_s() - t0 < j->timeout_ms / 1000.0 * 1.5, "rank %d: too slow", rank);
  if (j->victim == 0 && rank == 1)
    SL_CHILD_CHECK(s == SL_ERR_MISMATCH && !strstr(msg, "leads the ranks"), "rank 1: %s", msg);
  if (j->victim == 0 && rank == 3)
    SL_CHILD_CHECK(s == SL_ERR_PEER && strstr(msg, "rank 1 failed") && !strstr(msg, "lost rank 0"), "rank 3: %s", msg);
  if (j->victim == 1 && rank == 2)
    SL_CHILD_CHECK(s != SL_OK && strstr(msg, "rank 0 lost rank 1") && !strstr(msg, "finished this communicator"),
                   "rank 2: %s", msg);
  if (j->victim == 1) SL_CHILD_CHECK(s != SL_OK, "rank %d: no failure", rank);
  sl_context_destroy(ctx);
  return 0;
}

static void test_leader_failures_named(void **state) {
  for (int mode = 0; mode < 2; mode++) {
    job j = {.collective = "hier", .tag = {"a", "b", "a", "b"}, .timeout_ms = 5000, .victim = mode};
    int codes[MAX_WORLD];
    spawn(&j, 4, leader_rank, mode ? "leader-lost" : "leader-mismatch", 60000, codes);
    for (int r = 0; r < 4; r++)
      if (mode == 0 || r != 3) assert_int_equal(codes[r], 0);
  }
}

/* ---- a rank that cannot read the boot id ------------------------------------------------------ */

/* Ranks 2 and 3 read an empty boot id (/dev/null bound over it in a mount namespace of their
 * own; 77 where this user may not): shm joins them to no one, so auto's hosts are {0, 1}, {2},
 * {3}, and hier must start on the same hosts and work, not put 2 and 3 in one shm that refuses
 * them. */
static int unreadable_rank(int rank, int world, void *arg) {
  const job *j = arg;
  if (rank >= 2 && (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
                    mount("/dev/null", "/proc/sys/kernel/random/boot_id", NULL, MS_BIND, NULL) != 0))
    return 77;
  char err[1024] = "";
  sl_context *ctx = NULL;
  SL_CHILD_CHECK(open_ctx(j, rank, world, &ctx, err, sizeof err) == SL_OK, "rank %d: %s", rank, err);
  const char *why = sl_context_collective_reason(ctx);
  SL_CHILD_CHECK(strcmp(sl_context_collective_name(ctx), "hier") == 0 && strstr(why, "3 hosts (2+1+1 ranks)"),
                 "rank %d: %s (%s)", rank, sl_context_collective_name(ctx), why);
  if (check_bcast(ctx->data, ctx->data_comm, rank, world, 70001, 60)) return 1;
  sl_context_destroy(ctx);
  return 0;
}

static void test_unreadable_boot_id(void **state) {
  if (geteuid() != 0) skip(); /* a mount namespace and a bind mount need root */
  job j = {.tag = {"a", "a", NULL, NULL}, .timeout_ms = 10000};
  int codes[MAX_WORLD];
  spawn(&j, 4, unreadable_rank, "unreadable-boot-id", 60000, codes);
  if (codes[2] == 77 || codes[3] == 77) skip();
  for (int r = 0; r < 4; r++) assert_int_equal(codes[r], 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ops_two_hosts),
      cmocka_unit_test(test_ops_three_hosts),
      cmocka_unit_test(test_loads_match_gloo),
      cmocka_unit_test(test_rank_killed_mid_load),
      cmocka_unit_test(test_leader_failures_named),
      cmocka_unit_test(test_unreadable_boot_id),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
