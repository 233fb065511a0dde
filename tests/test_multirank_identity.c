/* One job, one set of ranks, over real Gloo on loopback: ranks agree on the checkpoint before
 * any data moves, every-rank reads prove that every rank reads the same bytes, and jobs that
 * share a rendezvous either stay apart (job keys) or refuse each other — no rank ever ends with
 * another job's data. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static char *dir;
static char *ck_a, *ck_a_copy, *ck_b, *ck_c, *ck_data_diff, *ck_head_diff, *ck_late;

#define ROWS 64
#define COLS 32
static float data_a[2][ROWS * COLS], data_b[2][ROWS * COLS];

static int write_ck(const char *path, float d[2][ROWS * COLS], const char *meta) {
  sl_test_tensor ts[] = {
      {"w.0", "F32", 2, {ROWS, COLS}, d[0]},
      {"w.1", "F32", 2, {ROWS, COLS}, d[1]},
  };
  return sl_test_write_st(path, ts, 2, meta);
}

/* Offset in PATH of the byte in the middle of tensor w.1's data. */
static long middle_of_w1(const char *path) {
  int fd = open(path, O_RDONLY);
  uint64_t n = 0;
  unsigned char b[8];
  if (fd < 0 || pread(fd, b, 8, 0) != 8) return -1;
  close(fd);
  for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
  return (long)(8 + n + sizeof data_a[0] + sizeof data_a[1] / 2);
}

static int flip_byte(const char *path, long off) {
  int fd = open(path, O_RDWR);
  unsigned char b;
  if (fd < 0 || pread(fd, &b, 1, off) != 1) return -1;
  b ^= 0x5A;
  int rc = pwrite(fd, &b, 1, off) == 1 ? 0 : -1;
  close(fd);
  return rc;
}

static int setup(void **state) {
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < ROWS * COLS; i++) {
      data_a[t][i] = (float)(t * 10000 + i);
      data_b[t][i] = -(float)(t * 10000 + i) - 0.5f;
    }
  dir = sl_test_dir("identity");
  ck_a = sl_test_path(dir, "a.safetensors");
  ck_a_copy = sl_test_path(dir, "a-copy.safetensors");
  ck_b = sl_test_path(dir, "b.safetensors");
  ck_c = sl_test_path(dir, "c.safetensors");
  ck_data_diff = sl_test_path(dir, "a-data-diff.safetensors");
  ck_head_diff = sl_test_path(dir, "a-head-diff.safetensors");
  ck_late = sl_test_path(dir, "a-late.safetensors");
  if (write_ck(ck_a, data_a, "{\"tag\":\"a\"}") || write_ck(ck_a_copy, data_a, "{\"tag\":\"a\"}") ||
      write_ck(ck_b, data_b, "{\"tag\":\"a\"}") || write_ck(ck_c, data_b, "{\"tag\":\"c\"}") || write_ck(ck_data_diff, data_a, "{\"tag\":\"a\"}") ||
      write_ck(ck_head_diff, data_a, "{\"tag\":\"b\"}") || write_ck(ck_late, data_a, "{\"tag\":\"a\"}"))
    return -1;
  /* same size, same header, one byte of w.1's data changed */
  return flip_byte(ck_data_diff, middle_of_w1(ck_data_diff));
}

static int teardown(void **state) {
  free(ck_a), free(ck_a_copy), free(ck_b), free(ck_c), free(ck_data_diff), free(ck_head_diff), free(ck_late);
  free(dir);
  return 0;
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) return -1;
  close(fd);
  return ntohs(a.sin_port);
}

/* ---- one process of a (possibly mixed) job ------------------------------------------------ */
enum expect { EXPECT_OK, EXPECT_MISMATCH, EXPECT_OK_OR_FAIL };

typedef struct proc {
  int rank;
  const char *path;
  const char *job_key;
  const char *want[3]; /* substrings its message must hold when it fails */
  const char *restart; /* TORCHELASTIC_RESTART_COUNT, or NULL */
  const char *cwd;     /* its working directory (PATH relative to it), or NULL */
  const char *reads;   /* where it opens, a substring its source's first file must hold */
} proc;

typedef struct idjob {
  char *rdzv;
  int world;
  int nproc;
  proc p[4];
  sl_read_mode mode;
  int readers; /* with SL_READ_READERS: sl_load_options.readers */
  enum expect expect;
  int tamper_proc;       /* process that changes its own file after opening it, or -1 */
  long tamper_offset;    /* ... at this byte */
  const float (*truth)[ROWS * COLS]; /* the data every rank must hold when it succeeds; NULL: its own path's */
} idjob;

/* Checks every local shard against the checkpoint DATA (1-D shard(0) of [ROWS, COLS]). */
static int shards_hold(const sl_state *st, const float d[2][ROWS * COLS]) {
  if (sl_state_count(st) != 2) return 0;
  for (int t = 0; t < 2; t++) {
    const sl_tensor *x = sl_state_find(st, t ? "w.1" : "w.0");
    if (!x || x->device != SL_DEVICE_ACCELERATOR) return 0;
    const float *want = d[t] + x->global_offset[0] * COLS;
    if (memcmp(x->data, want, (size_t)x->nbytes) != 0) return 0;
  }
  return 1;
}

static const float (*data_of(const char *path))[ROWS * COLS] {
  return strcmp(path, ck_b) == 0 || strcmp(path, ck_c) == 0 ? (const float(*)[ROWS * COLS])data_b : (const float(*)[ROWS * COLS])data_a;
}

static int proc_main(int i, int nproc, void *arg) {
  idjob *j = arg;
  const proc *p = &j->p[i];
  if (p->restart) {
    setenv("TORCHELASTIC_RUN_ID", "run-1", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", p->restart, 1);
  }
  SL_CHILD_CHECK(!p->cwd || chdir(p->cwd) == 0, "proc %d: chdir %s", i, p->cwd);
  sl_context_options co = {.size = sizeof co, .backend = "cpu", .world_size = j->world, .rank = p->rank,
                           .rendezvous = j->rdzv, .timeout_ms = 6000, .job_key = p->job_key};
  sl_context *ctx = NULL;
  sl_status s = sl_context_create(&co, &ctx);
  if (s != SL_OK) {
    /* a rank that never got in (a duplicate rank 0 of another job cannot serve the store) */
    fprintf(stderr, "proc %d (rank %d, %s): context: %s\n", i, p->rank, p->path, sl_status_name(s));
    SL_CHILD_CHECK(j->expect == EXPECT_OK_OR_FAIL, "proc %d: context %s", i, sl_status_name(s));
    return 0;
  }
  sl_source *src = NULL;
  sl_state *st = NULL;
  s = sl_source_open(ctx, p->path, &src);
  if (s == SL_OK && i == j->tamper_proc) SL_CHILD_CHECK(flip_byte(p->path, j->tamper_offset) == 0, "tamper");
  if (s == SL_OK && p->reads) {
    const char *f0 = sl_source_file_at(src, 0);
    SL_CHILD_CHECK(f0 && strstr(f0, p->reads), "proc %d (rank %d) opened %s, not in %s", i, p->rank, f0 ? f0 : "nothing",
                   p->reads);
  }
  if (s == SL_OK) {
    sl_plan *plan = NULL;
    sl_plan_create(ctx, &plan);
    sl_load_options lo = {.size = sizeof lo, .read_mode = j->mode, .readers = j->readers};
    s = sl_load(ctx, plan, src, &lo, &st);
    sl_plan_destroy(plan);
  }
  const char *msg = sl_context_errmsg(ctx);
  fprintf(stderr, "proc %d (rank %d, %s): %s: %s\n", i, p->rank, p->path, sl_status_name(s), msg);
  if (s == SL_OK) {
    /* whatever the expectation, a rank that succeeds holds its own job's data */
    const float (*truth)[ROWS * COLS] = j->truth ? j->truth : data_of(p->path);
    SL_CHILD_CHECK(shards_hold(st, truth), "proc %d (rank %d) exits OK with data that is not its checkpoint's", i,
                   p->rank);
    SL_CHILD_CHECK(j->expect == EXPECT_OK || j->expect == EXPECT_OK_OR_FAIL, "proc %d (rank %d) succeeded", i, p->rank);
  } else {
    SL_CHILD_CHECK(j->expect != EXPECT_OK, "proc %d (rank %d): %s", i, p->rank, sl_status_name(s));
    SL_CHILD_CHECK(*msg, "proc %d fails without saying why", i);
    if (j->expect == EXPECT_MISMATCH) {
      SL_CHILD_CHECK(s == SL_ERR_MISMATCH, "proc %d: got %s", i, sl_status_name(s));
      for (int k = 0; k < 3 && p->want[k]; k++)
        SL_CHILD_CHECK(strstr(msg, p->want[k]) != NULL, "proc %d: message '%s' lacks '%s'", i, msg, p->want[k]);
    }
  }
  sl_state_destroy(st);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  return 0;
}

static void run(idjob *j) {
  int codes[4];
  int killed = sl_test_spawn(j->nproc, proc_main, j, 40000, codes);
  assert_int_equal(killed, 0); /* nothing hung */
  for (int i = 0; i < j->nproc; i++) assert_int_equal(codes[i], 0);
}

static char *rdzv_url(int tcp, const char *sub) {
  if (!tcp) return sl_test_rendezvous(sub);
  char *url = NULL;
  assert_true(asprintf(&url, "tcp://127.0.0.1:%d", free_port()) > 0);
  return url;
}

/* ---- a stray rank of another job ------------------------------------------------------------ */
/* Rank 1 of job B meets rank 0 of job A on one rendezvous, with the same world size: both fail
 * before any data moves, naming rank 1, both paths and why. B's checkpoint has other headers
 * (c), or the same headers and other data (b: a fine-tune of the same model). */
static void test_stray_rank_other_checkpoint(void **state) {
  for (int k = 0; k < 4; k++) {
    int tcp = k & 1, same_headers = k >> 1;
    const char *other = same_headers ? ck_b : ck_c, *base = same_headers ? "b.safetensors" : "c.safetensors";
    const char *why = same_headers ? "other tensor data" : "other safetensors headers";
    idjob j = {.rdzv = rdzv_url(tcp, "id-stray"), .world = 2, .nproc = 2, .expect = EXPECT_MISMATCH, .tamper_proc = -1};
    j.p[0] = (proc){0, ck_a, NULL, {why, "a.safetensors", base}, NULL, NULL, NULL};
    j.p[1] = (proc){1, other, NULL, {"rank 1", "a.safetensors", base}, NULL, NULL, NULL};
    run(&j);
    free(j.rdzv);
  }
}

/* A rank given another path that it cannot read cannot show it is in the same job. */
static void test_unreadable_other_path_refused(void **state) {
  char *gone = sl_test_path(dir, "elsewhere/missing.safetensors");
  idjob j = {.rdzv = rdzv_url(0, "id-unreadable"), .world = 2, .nproc = 2, .expect = EXPECT_MISMATCH,
             .tamper_proc = -1};
  j.p[0] = (proc){0, ck_a, NULL, {"rank 1", "cannot read it", "missing.safetensors"}, NULL, NULL, NULL};
  j.p[1] = (proc){1, gone, NULL, {"rank 1", "a.safetensors", "missing.safetensors"}, NULL, NULL, NULL};
  run(&j);
  free(j.rdzv);
  free(gone);
}

/* Another path to the same bytes (another mount point) is the same checkpoint: it loads, in
 * every read mode, and rank 1 reads its own copy in every-rank mode and as a reader. */
static void test_same_checkpoint_other_path_loads(void **state) {
  for (int mode = 0; mode < 3; mode++) {
    idjob j = {.rdzv = rdzv_url(0, "id-other-path"), .world = 2, .nproc = 2, .expect = EXPECT_OK,
               .tamper_proc = -1, .mode = (sl_read_mode)mode, .readers = 2};
    j.p[0] = (proc){0, ck_a, NULL, {NULL}, NULL, NULL, NULL};
    j.p[1] = (proc){1, ck_a_copy, NULL, {NULL}, NULL, NULL, NULL};
    run(&j);
    free(j.rdzv);
  }
}

/* One path string, relative to each rank's working directory: rank 1 finds a copy there and
 * opens it itself, rank 2 finds nothing and takes rank 0's table (its manifest, which names
 * rank 0's files). Both read modes load rank 0's bytes on every rank; so do two distributed
 * readers (ranks 0 and 1, each from its own copy; rank 2 reads nothing). A reader that cannot
 * see the checkpoint at all: tests/multihost (a host whose mount namespace hides it). */
static void test_some_ranks_read_their_own_copy(void **state) {
  char *m[3], *f[2];
  const char *sub[3] = {"/m0/", "/m1/", "/m2/"};
  for (int r = 0; r < 3; r++) {
    char name[16];
    snprintf(name, sizeof name, "m%d", r);
    m[r] = sl_test_path(dir, name);
    assert_true(mkdir(m[r], 0700) == 0 || errno == EEXIST);
    if (r < 2) {
      f[r] = sl_test_path(m[r], "ck.safetensors");
      assert_int_equal(write_ck(f[r], data_a, "{\"tag\":\"a\"}"), 0);
    }
  }
  for (int mode = 0; mode < 2; mode++) {
    idjob j = {.rdzv = rdzv_url(mode, "id-own-some"), .world = 3, .nproc = 3, .expect = EXPECT_OK, .tamper_proc = -1,
               .mode = (sl_read_mode)mode, .truth = (const float(*)[ROWS * COLS])data_a};
    for (int r = 0; r < 3; r++) j.p[r] = (proc){r, "ck.safetensors", NULL, {NULL}, NULL, m[r], sub[r < 2 ? r : 0]};
    run(&j);
    free(j.rdzv);
  }
  {
    idjob j = {.rdzv = rdzv_url(0, "id-own-readers"), .world = 3, .nproc = 3, .tamper_proc = -1,
               .mode = SL_READ_READERS, .readers = 2, .truth = (const float(*)[ROWS * COLS])data_a,
               .expect = EXPECT_OK};
    for (int r = 0; r < 3; r++) j.p[r] = (proc){r, "ck.safetensors", NULL, {NULL}, NULL, m[r], sub[r < 2 ? r : 0]};
    run(&j);
    free(j.rdzv);
  }
  for (int r = 0; r < 3; r++) free(m[r]);
  free(f[0]), free(f[1]);
}

/* Two whole jobs of two ranks each on one rendezvous directory, different checkpoints. */
static void two_jobs(const char *key_a, const char *key_b, enum expect expect, const char *sub) {
  idjob j = {.rdzv = rdzv_url(0, sub), .world = 2, .nproc = 4, .expect = expect, .tamper_proc = -1};
  j.p[0] = (proc){0, ck_a, key_a, {NULL}, NULL, NULL, NULL};
  j.p[1] = (proc){1, ck_a, key_a, {NULL}, NULL, NULL, NULL};
  j.p[2] = (proc){0, ck_b, key_b, {NULL}, NULL, NULL, NULL};
  j.p[3] = (proc){1, ck_b, key_b, {NULL}, NULL, NULL, NULL};
  run(&j);
  free(j.rdzv);
}

/* With job keys (what the command passes) the two jobs never see each other's keys: both load
 * their own checkpoint. */
static void test_two_jobs_with_job_keys_stay_apart(void **state) { two_jobs("job-a", "job-b", EXPECT_OK, "id-two-keys"); }

/* Without them they may meet; whoever meets whom, no rank exits 0 with the other's data and a
 * failing rank says why. */
static void test_two_jobs_without_keys_never_mix(void **state) {
  two_jobs(NULL, NULL, EXPECT_OK_OR_FAIL, "id-two-nokeys");
}

/* Under torchrun the agent's store outlives a restart of the workers: the workers of attempt 1
 * must not read what attempt 0 left there, though the run id and the job key are the same.
 * Here both attempts run at once on one rendezvous and each loads its own checkpoint. */
static void test_restarts_stay_apart(void **state) {
  idjob j = {.rdzv = rdzv_url(0, "id-restart"), .world = 2, .nproc = 4, .expect = EXPECT_OK, .tamper_proc = -1};
  j.p[0] = (proc){0, ck_a, "key", {NULL}, "0", NULL, NULL};
  j.p[1] = (proc){1, ck_a, "key", {NULL}, "0", NULL, NULL};
  j.p[2] = (proc){0, ck_b, "key", {NULL}, "1", NULL, NULL};
  j.p[3] = (proc){1, ck_b, "key", {NULL}, "1", NULL, NULL};
  run(&j);
  free(j.rdzv);
}

/* ---- every-rank reads: every rank proves it reads rank 0's bytes ---------------------------- */
/* Rank 1's copy has the same size and header, and one byte of w.1's data changed: refused when
 * the ranks open the checkpoint, in both read modes (it was given another path: its sampled
 * data must match rank 0's), naming rank 1 and both paths. */
static void test_copy_with_other_data_refused(void **state) {
  for (int mode = 0; mode < 3; mode++) {
    idjob j = {.rdzv = rdzv_url(0, "id-data"), .world = 2, .nproc = 2, .expect = EXPECT_MISMATCH, .tamper_proc = -1,
               .mode = (sl_read_mode)mode, .readers = 2};
    j.p[0] = (proc){0, ck_a, NULL, {"rank 1", "other tensor data", "a-data-diff.safetensors"}, NULL, NULL, NULL};
    j.p[1] = (proc){1, ck_data_diff, NULL, {"rank 1", "other tensor data", "a.safetensors"}, NULL, NULL, NULL};
    run(&j);
    free(j.rdzv);
  }
}

/* A header byte differs: refused when the ranks open the checkpoint (the headers' digest). */
static void test_copy_with_other_header_refused_at_open(void **state) {
  for (int mode = 0; mode < 2; mode++) {
    idjob j = {.rdzv = rdzv_url(0, "id-head"), .world = 2, .nproc = 2, .expect = EXPECT_MISMATCH, .tamper_proc = -1,
               .mode = (sl_read_mode)mode};
    j.p[0] = (proc){0, ck_a, NULL, {"rank 1", "other safetensors headers", "a-head-diff.safetensors"}, NULL, NULL, NULL};
    j.p[1] = (proc){1, ck_head_diff, NULL, {"rank 1", "other safetensors headers", "a.safetensors"}, NULL, NULL, NULL};
    run(&j);
    free(j.rdzv);
  }
}

/* Rank 1's copy changes after it was opened (as a copy that rank 1 could not show at open, on a
 * node of its own, would be): a header byte, then a data byte. Every-rank reads refuse both,
 * and so do two distributed readers, before any byte moves. */
static void test_copy_changed_after_open_refused(void **state) {
  for (int k = 0; k < 4; k++) {
    int header = k & 1, readers = k >> 1;
    assert_int_equal(write_ck(ck_late, data_a, "{\"tag\":\"a\"}"), 0);
    idjob j = {.rdzv = rdzv_url(0, "id-late"), .world = 2, .nproc = 2, .expect = EXPECT_MISMATCH, .tamper_proc = 1,
               .mode = readers ? SL_READ_READERS : SL_READ_EVERY_RANK, .readers = 2,
               .truth = (const float(*)[ROWS * COLS])data_a};
    /* offset 12: a byte of the header JSON (the 8-byte length stays valid) */
    j.tamper_offset = header ? 12 : middle_of_w1(ck_late);
    const char *what = header ? "the safetensors headers" : "sampled tensor data";
    j.p[0] = (proc){0, ck_a, NULL, {"rank 1", "a.safetensors", what}, NULL, NULL, NULL};
    j.p[1] = (proc){1, ck_late, NULL, {"rank 1", "a-late.safetensors", what}, NULL, NULL, NULL};
    run(&j);
    free(j.rdzv);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stray_rank_other_checkpoint),
      cmocka_unit_test(test_unreadable_other_path_refused),
      cmocka_unit_test(test_same_checkpoint_other_path_loads),
      cmocka_unit_test(test_some_ranks_read_their_own_copy),
      cmocka_unit_test(test_two_jobs_with_job_keys_stay_apart),
      cmocka_unit_test(test_two_jobs_without_keys_never_mix),
      cmocka_unit_test(test_restarts_stay_apart),
      cmocka_unit_test(test_copy_with_other_data_refused),
      cmocka_unit_test(test_copy_with_other_header_refused_at_open),
      cmocka_unit_test(test_copy_changed_after_open_refused),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
