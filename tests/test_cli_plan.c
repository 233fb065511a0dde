/* `shardload plan --json` as a stream: the document is the one jansson writes for the whole
 * report (byte for byte), its memory does not grow with the world (a world of 16384 held
 * 1.7 GB as one document), a failed write says why and exits 1 (a full disk: /dev/full), and
 * running out of memory says so (it used to drop the "tensors" key and exit 0, or be
 * reported as "cannot write"). Real processes, the built command. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_testlib.h"

static char *g_dir, *g_small, *g_synth;

static int setup(void **state) {
  g_dir = sl_test_dir("cli_plan");
  if (!g_dir) return -1;
  /* five tensors, uneven over most worlds, a 0-d one and a non-float one */
  g_small = sl_test_path(g_dir, "small.safetensors");
  sl_test_tensor ts[] = {
      {"rows10", "F32", 2, {10, 3}, NULL}, {"rows9", "BF16", 1, {9}, NULL}, {"rows3", "F32", 2, {3, 2}, NULL},
      {"scalar", "F32", 0, {0}, NULL},     {"ids", "I64", 1, {4}, NULL},
  };
  if (sl_test_write_st(g_small, ts, 5, "{\"format\":\"pt\"}") != 0) return -1;
  g_synth = sl_test_path(g_dir, "synth");
  char *out = NULL;
  int rc = sl_test_run(&out, "%s synth '%s' --size 1MiB --shards 2", sl_test_bin(), g_synth);
  if (rc != 0) fprintf(stderr, "synth failed (%d): %s\n", rc, out ? out : "");
  free(out);
  return rc == 0 ? 0 : -1;
}

static char *g_traffic;

static int teardown(void **state) {
  free(g_traffic);
  free(g_small);
  free(g_synth);
  free(g_dir);
  return 0;
}

/* Runs the command ARGV (argv[0]: the binary) with stdout to OUT_PATH, stderr to ERR_PATH;
 * returns its exit status (-1 when it did not exit) and its peak resident set in KiB (an upper
 * bound: the peak a forked child reports includes the test process's, which exec keeps). */
static int run_measured(char *const argv[], const char *out_path, const char *err_path, long *maxrss_kib) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644), err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(126);
#ifdef SL_TEST_ASAN
    /* ASan holds freed memory back (256 MiB of quarantine): the figure would be its, not ours */
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[1024];
    snprintf(opts, sizeof opts, "%s%squarantine_size_mb=0", asan ? asan : "", asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
#endif
    execv(argv[0], argv);
    _exit(127);
  }
  int status = 0;
  struct rusage ru;
  memset(&ru, 0, sizeof ru);
  assert_int_equal(wait4(pid, &status, 0, &ru), pid);
  *maxrss_kib = ru.ru_maxrss;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static char *read_text(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = 0;
  fclose(f);
  *len = (size_t)n;
  return buf;
}

/* `plan ARGS --json`: parsed, checked to be exactly what jansson writes for the whole document
 * (JSON_INDENT(2) | JSON_PRESERVE_ORDER, then a newline: the report as it was before it was
 * streamed), and every rank object whole. WANT_RANKS: how many rank objects. */
static void check_plan_document(const char *path, const char *args, int world, int want_ranks) {
  char *jp = sl_test_path(g_dir, "plan.json"), cmd[4096];
  snprintf(cmd, sizeof cmd, "%s plan '%s' --json %s", sl_test_bin(), path, args);
  assert_int_equal(run_to_file(jp, cmd), 0);
  size_t len = 0;
  char *text = read_text(jp, &len);
  json_error_t err;
  json_t *j = json_loadb(text, len, 0, &err);
  if (!j) fail_msg("%s: not JSON: %s (line %d)", cmd, err.text, err.line);
  char *whole = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  assert_non_null(whole);
  size_t wl = strlen(whole);
  if (len != wl + 1 || memcmp(text, whole, wl) != 0 || text[wl] != '\n')
    fail_msg("%s: the streamed report differs from jansson's dump of the same document", cmd);
  free(whole);

  assert_string_equal(json_string_value(json_object_get(j, "path")), path);
  assert_int_equal(json_integer_value(json_object_get(j, "world_size")), world);
  json_t *ranks = json_object_get(j, "ranks");
  assert_int_equal(json_array_size(ranks), want_ranks);
  for (size_t i = 0; i < json_array_size(ranks); i++) {
    json_t *r = json_array_get(ranks, i), *ts = json_object_get(r, "tensors");
    assert_true(json_is_integer(json_object_get(r, "rank")));
    if (want_ranks == world) assert_int_equal(json_integer_value(json_object_get(r, "rank")), (json_int_t)i);
    assert_int_equal(json_object_size(r), 4);
    assert_true(json_array_size(ts) > 0);
    assert_int_equal(json_integer_value(json_object_get(r, "tensor_count")), json_array_size(ts));
    json_int_t total = 0;
    for (size_t k = 0; k < json_array_size(ts); k++) {
      json_t *t = json_array_get(ts, k);
      assert_int_equal(json_object_size(t), 9);
      total += json_integer_value(json_object_get(t, "bytes"));
    }
    assert_int_equal(json_integer_value(json_object_get(r, "total_bytes")), total);
  }
  json_decref(j);
  free(text);
  free(jp);
}

static void test_plan_json_is_one_document(void **state) {
  check_plan_document(g_small, "--world 1", 1, 1);
  check_plan_document(g_small, "--world 7", 7, 7);
  check_plan_document(g_synth, "--world 5", 5, 5);
  check_plan_document(g_synth, "--world 4 --rank 3", 4, 1);
  check_plan_document(g_synth, "--mesh 2x3 --replicate '*norm*' --param-dtype F32", 6, 6);
  check_plan_document(g_small, "--world 1000", 1000, 1000);
}

/* The whole report of a world of 16384 was one document in memory (1.7 GB on a 53-tensor
 * checkpoint, ~100 MB on this 5-tensor one); streamed, the command stays at its baseline. */
static void test_plan_json_memory_does_not_grow_with_world(void **state) {
  char *errp = sl_test_path(g_dir, "big.err");
  char *argv[] = {(char *)sl_test_bin(), "plan", g_small, "--world", "16384", "--json", NULL};
  long small_kib = 0, big_kib = 0;
  char *argv1[] = {(char *)sl_test_bin(), "plan", g_small, "--world", "1", "--json", NULL};
  assert_int_equal(run_measured(argv1, "/dev/null", errp, &small_kib), 0);
  int rc = run_measured(argv, "/dev/null", errp, &big_kib);
  fprintf(stderr, "plan --json peak RSS: world 1 %ld KiB, world 16384 %ld KiB\n", small_kib, big_kib);
  assert_int_equal(rc, 0);
  /* generous for a loaded machine and sanitizer builds; the whole document is far above */
  free(errp);
  if (big_kib > small_kib + 32 * 1024)
    fail_msg("plan --world 16384 --json peaked at %ld KiB (world 1: %ld KiB): memory grows with the world", big_kib,
             small_kib);
}

/* A full disk: the exact reason, exit status 1, one error line; for the tables too. */
static void test_plan_write_error_is_reported(void **state) {
  if (access("/dev/full", W_OK) != 0) skip();
  static const char *modes[] = {"--json", "", "--hosts 4 --traffic --json", "--hosts 4 --traffic", "--hosts 4"};
  for (int i = 0; i < 5; i++) {
    char *out = NULL;
    int rc = sl_test_run(&out, "(%s plan '%s' --world 64 %s >/dev/full)", sl_test_bin(), g_synth, modes[i]);
    if (rc != 1) fail_msg("plan %s > /dev/full: exit %d (%s)", modes[i], rc, out);
    assert_one_error_line(out, g_synth);
    assert_non_null(strstr(out, "SL_ERR_IO"));
    assert_non_null(strstr(out, "cannot write"));
    assert_non_null(strstr(out, "No space left on device"));
    free(out);
  }
}

/* Out of memory while the report is written is reported as out of memory, never as a write
 * error, and never as a report with parts silently left out (exit 0, no "tensors": what the
 * whole-document report did when an allocation failed). A checkpoint of 50000 tensors and a
 * data limit (RLIMIT_DATA) that the tables fit in but rank 0's JSON object does not. Not under
 * ASan, whose shadow memory is private data too. */
static void test_plan_json_out_of_memory_is_reported(void **state) {
#ifdef SL_TEST_ASAN
  skip();
#endif
  enum { N = 50000 };
  sl_test_tensor *ts = calloc(N, sizeof *ts);
  char (*names)[16] = calloc(N, sizeof *names);
  assert_non_null(ts);
  assert_non_null(names);
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "t%d", i);
    ts[i] = (sl_test_tensor){names[i], "U8", 2, {2, 1}, NULL};
  }
  char *p = sl_test_path(g_dir, "many.safetensors");
  assert_int_equal(sl_test_write_st(p, ts, N, NULL), 0);
  free(ts);
  free(names);

  /* the smallest limit under which the command runs at all (the tables) */
  static const int limits_mib[] = {48, 64, 96, 128, 192};
  int limit = 0;
  char *out = NULL;
  for (size_t i = 0; i < sizeof limits_mib / sizeof *limits_mib && !limit; i++) {
    int rc = sl_test_run(&out, "(ulimit -d %d && %s plan '%s' --world 2 --rank 0 >/dev/null)", limits_mib[i] * 1024,
                         sl_test_bin(), p);
    if (rc == 0) limit = limits_mib[i];
    free(out);
  }
  if (!limit) fail_msg("plan (tables) of %d tensors does not run under a data limit of %d MiB", N, limits_mib[4]);

  int rc = sl_test_run(&out, "(ulimit -d %d && %s plan '%s' --world 2 --rank 0 --json >/dev/null)", limit * 1024,
                       sl_test_bin(), p);
  fprintf(stderr, "data limit %d MiB: plan --json exit %d: %s", limit, rc, out);
  if (rc == 0)
    fail_msg("plan --json of %d tensors succeeded under a data limit of %d MiB, which the tables need: either its "
             "report lost parts silently, or the limit no longer separates the two (make the checkpoint larger)",
             N, limit);
  assert_int_equal(rc, 1);
  assert_one_error_line(out, p);
  assert_non_null(strstr(out, "SL_ERR_NOMEM"));
  assert_non_null(strstr(out, "out of memory"));
  assert_null(strstr(out, "cannot write"));
  free(out);
  free(p);
}

/* ---- the traffic section (--hosts, --readers, --traffic) ----------------------------------
 * The expected figures are computed here from the rules (core/src/loader_send.c), not by the
 * command's code: a tensor's part for each rank is torch.chunk of its dim 0 over the mesh dim
 * that shards it (cli_testlib's chunk), in the wire dtype; the reader sends every other rank
 * its part (HSDP: within its replica, then one hop per replica away from it); the readers'
 * shares follow the byte midpoints of the tensors in file order. */

enum { TW_MAX = 8 }; /* the worlds of these tests: 4 or 8 ranks on 2 hosts */

typedef struct tr_tensor {
  const char *name, *dtype;
  int ndim;
  int64_t shape[2];
} tr_tensor;

/* file order (sl_test_write_st writes them one after another) */
static const tr_tensor TR[] = {
    {"a", "F32", 2, {8, 3}},  {"b", "BF16", 1, {10, 0}}, {"c", "F32", 2, {3, 2}},
    {"s", "F32", 0, {0, 0}},  {"ids", "I64", 1, {4, 0}}, {"d", "F16", 2, {6, 5}},
};
enum { TRN = sizeof TR / sizeof *TR };

typedef struct tr_expect {
  int world, per_host; /* 2 hosts of world/2 ranks */
  uint64_t sent[TW_MAX], recv[TW_MAX], link_out[2], link_in[2], read[TW_MAX];
  int reader_rank[TW_MAX], nreaders;
} tr_expect;

static uint64_t tr_file_bytes(const tr_tensor *t) {
  uint64_t n = dt_size(t->dtype);
  for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
  return n;
}

/* Rank R's part of T in wire bytes: dim 0 chunked over SHARDS ranks by index IDX (SHARDS 1:
 * whole; 0-d tensors are whole); WIRE_BF16: floating tensors travel as 2-byte values. */
static uint64_t tr_part(const tr_tensor *t, int shards, int idx, int wire_bf16) {
  uint64_t esize = dt_size(t->dtype);
  if (wire_bf16 && t->dtype[0] == 'F' && esize > 2) esize = 2;
  uint64_t n = esize;
  for (int d = 0; d < t->ndim; d++) {
    int64_t off = 0, len = t->shape[d];
    if (d == 0) chunk(t->shape[0], shards, idx, &off, &len);
    n *= (uint64_t)len;
  }
  return n;
}

static void tr_move(tr_expect *e, int from, int to, uint64_t b) {
  e->sent[from] += b;
  e->recv[to] += b;
  int hf = from / e->per_host, ht = to / e->per_host;
  if (hf != ht) {
    e->link_out[hf] += b;
    e->link_in[ht] += b;
  }
}

/* WORLD ranks on 2 hosts; READERS ranks (ascending), each tensor's reader by the midpoint of
 * its bytes. REPLICAS > 0: HSDP, mesh REPLICASx(WORLD/REPLICAS) [replicate, shard(0)]; 0: 1-D
 * [WORLD] shard(0). */
static void tr_expected(int world, const int *readers, int nreaders, int replicas, int wire_bf16, tr_expect *e) {
  memset(e, 0, sizeof *e);
  e->world = world;
  e->per_host = world / 2;
  e->nreaders = nreaders;
  uint64_t total = 0, cum = 0;
  for (int i = 0; i < TRN; i++) total += tr_file_bytes(&TR[i]);
  for (int i = 0; i < nreaders; i++) e->reader_rank[i] = readers[i];
  for (int i = 0; i < TRN; i++) {
    const tr_tensor *t = &TR[i];
    uint64_t b = tr_file_bytes(t);
    int who = (int)((cum + b / 2) * (uint64_t)nreaders / total);
    if (who >= nreaders) who = nreaders - 1;
    cum += b;
    e->read[who] += b;
    int root = readers[who];
    int scalar = t->ndim == 0;
    if (!replicas) {
      for (int r = 0; r < world; r++)
        if (r != root) tr_move(e, root, r, tr_part(t, scalar ? 1 : world, r, wire_bf16));
      continue;
    }
    /* replica q gets it from the root; replica p != q from its neighbour towards q */
    int SR = world / replicas, q = root / SR;
    for (int r = q * SR; r < q * SR + SR; r++)
      if (r != root) tr_move(e, root, r, tr_part(t, scalar ? 1 : SR, r % SR, wire_bf16));
    for (int p = q + 1; p < replicas; p++)
      for (int sh = 0; sh < SR; sh++)
        tr_move(e, (p - 1) * SR + sh, p * SR + sh, tr_part(t, scalar ? 1 : SR, sh, wire_bf16));
    for (int p = q - 1; p >= 0; p--)
      for (int sh = 0; sh < SR; sh++)
        tr_move(e, (p + 1) * SR + sh, p * SR + sh, tr_part(t, scalar ? 1 : SR, sh, wire_bf16));
  }
}

/* g_traffic: the checkpoint of TR, written by the first test that needs it */

static void tr_write(void) {
  if (g_traffic) return;
  sl_test_tensor ts[TRN];
  for (int i = 0; i < TRN; i++)
    ts[i] = (sl_test_tensor){TR[i].name, TR[i].dtype, TR[i].ndim, {TR[i].shape[0], TR[i].shape[1]}, NULL};
  g_traffic = sl_test_path(g_dir, "traffic.safetensors");
  assert_int_equal(sl_test_write_st(g_traffic, ts, TRN, NULL), 0);
}

/* `plan ARGS --json` for the traffic checkpoint: the whole document as jansson dumps it, parsed. */
static json_t *tr_json(const char *args) {
  char *jp = sl_test_path(g_dir, "traffic.json"), cmd[4096];
  snprintf(cmd, sizeof cmd, "%s plan '%s' --json %s", sl_test_bin(), g_traffic, args);
  assert_int_equal(run_to_file(jp, cmd), 0);
  size_t len = 0;
  char *text = read_text(jp, &len);
  json_error_t err;
  json_t *j = json_loadb(text, len, 0, &err);
  if (!j) fail_msg("%s: not JSON: %s (line %d)", cmd, err.text, err.line);
  char *whole = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  assert_non_null(whole);
  if (len != strlen(whole) + 1 || memcmp(text, whole, strlen(whole)) != 0)
    fail_msg("%s: the report differs from jansson's dump of the same document", cmd);
  free(whole);
  free(text);
  free(jp);
  return j;
}

static uint64_t jint(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v)) fail_msg("\"%s\" is not an integer", key);
  return (uint64_t)json_integer_value(v);
}

static void tr_check_mode(const json_t *m, const tr_expect *e, const char *what) {
  const int W = e->world;
  assert_int_equal(jint(m, "reader_count"), e->nreaders);
  json_t *rd = json_object_get(m, "readers"), *hs = json_object_get(m, "hosts");
  json_t *rr = json_object_get(m, "rank_received_bytes"), *rs = json_object_get(m, "rank_sent_bytes");
  assert_int_equal(json_array_size(rd), e->nreaders);
  assert_int_equal(json_array_size(hs), 2);
  assert_int_equal(json_array_size(rr), W);
  assert_int_equal(json_array_size(rs), W);
  uint64_t read_sum = 0, largest = 0, max_sent = 0, busiest = 0, total = 0;
  for (int i = 0; i < TRN; i++) total += tr_file_bytes(&TR[i]);
  for (int i = 0; i < e->nreaders; i++) {
    json_t *r = json_array_get(rd, (size_t)i);
    int rank = e->reader_rank[i];
    assert_int_equal(jint(r, "rank"), rank);
    assert_int_equal(jint(r, "host"), rank / e->per_host);
    if (jint(r, "read_bytes") != e->read[i])
      fail_msg("%s: reader %d reads %llu bytes, want %llu", what, i, (unsigned long long)jint(r, "read_bytes"),
               (unsigned long long)e->read[i]);
    assert_int_equal(jint(r, "sent_bytes"), e->sent[rank]);
    read_sum += e->read[i];
    if (e->read[i] > largest) largest = e->read[i];
  }
  assert_int_equal(read_sum, total); /* the shares cover the checkpoint once */
  for (int r = 0; r < W; r++) {
    uint64_t got_r = (uint64_t)json_integer_value(json_array_get(rr, (size_t)r));
    uint64_t got_s = (uint64_t)json_integer_value(json_array_get(rs, (size_t)r));
    if (got_r != e->recv[r] || got_s != e->sent[r])
      fail_msg("%s: rank %d received %llu sent %llu, want %llu and %llu", what, r, (unsigned long long)got_r,
               (unsigned long long)got_s, (unsigned long long)e->recv[r], (unsigned long long)e->sent[r]);
    if (e->sent[r] > max_sent) max_sent = e->sent[r];
  }
  for (int h = 0; h < 2; h++) {
    json_t *o = json_array_get(hs, (size_t)h);
    assert_int_equal(jint(o, "host"), h);
    assert_int_equal(jint(o, "first_rank"), e->per_host * h);
    if (jint(o, "link_sent_bytes") != e->link_out[h] || jint(o, "link_received_bytes") != e->link_in[h])
      fail_msg("%s: host %d link out %llu in %llu, want %llu and %llu", what, h,
               (unsigned long long)jint(o, "link_sent_bytes"), (unsigned long long)jint(o, "link_received_bytes"),
               (unsigned long long)e->link_out[h], (unsigned long long)e->link_in[h]);
    if (e->link_out[h] > busiest) busiest = e->link_out[h];
    if (e->link_in[h] > busiest) busiest = e->link_in[h];
  }
  assert_int_equal(jint(m, "largest_read_bytes"), largest);
  assert_int_equal(jint(m, "rank0_sent_bytes"), e->sent[0]);
  assert_int_equal(jint(m, "max_sent_bytes"), max_sent);
  assert_int_equal(jint(json_object_get(m, "busiest_link"), "bytes"), busiest);
  uint64_t sorted[TW_MAX];
  memcpy(sorted, e->recv, sizeof sorted);
  for (int i = 0; i < W; i++)
    for (int k = i + 1; k < W; k++)
      if (sorted[k] < sorted[i]) {
        uint64_t x = sorted[i];
        sorted[i] = sorted[k];
        sorted[k] = x;
      }
  json_t *rec = json_object_get(m, "received_bytes");
  assert_int_equal(jint(rec, "min"), sorted[0]);
  assert_int_equal(jint(rec, "median"), sorted[(W - 1) / 2]); /* the lower middle */
  assert_int_equal(jint(rec, "max"), sorted[W - 1]);
}

static void tr_check(const char *args, int world, const int *readers, int nreaders, int replicas, int wire_bf16,
                     int traffic_only) {
  json_t *j = tr_json(args), *t = json_object_get(j, "traffic");
  if (!json_is_object(t)) fail_msg("plan %s --json: no \"traffic\" object", args);
  assert_int_equal(json_object_size(j), traffic_only ? 4 : 5); /* path, world_size, mesh, traffic[, ranks] */
  assert_int_equal(json_array_size(json_object_get(j, "ranks")), traffic_only ? 0 : (size_t)world);
  assert_null(traffic_only ? json_object_get(j, "ranks") : NULL);
  assert_string_equal(json_string_value(json_object_get(t, "strategy")), "scatter");
  assert_int_equal(jint(t, "hosts"), 2);
  assert_int_equal(jint(t, "ranks_per_host"), world / 2);
  assert_int_equal(jint(t, "tensors"), TRN);
  tr_expect e;
  static const int rank0[] = {0};
  uint64_t total = 0;
  for (int i = 0; i < TRN; i++) total += tr_file_bytes(&TR[i]);
  assert_int_equal(jint(t, "read_bytes"), total);
  tr_expected(world, rank0, 1, replicas, wire_bf16, &e);
  tr_check_mode(json_object_get(t, "rank0"), &e, "rank 0 reads");
  tr_expected(world, readers, nreaders, replicas, wire_bf16, &e);
  tr_check_mode(json_object_get(t, "readers"), &e, "readers");
  json_decref(j);
}

/* Rank 0 alone sends every other rank its part; the readers (one per host: ranks 0 and 2, or
 * --readers) share the checkpoint; the links carry what crosses hosts. */
static void test_plan_traffic_scatter(void **state) {
  tr_write();
  static const int per_host[] = {0, 2}, three[] = {0, 1, 2}, four[] = {0, 1, 2, 3};
  tr_check("--world 4 --hosts 2 --traffic", 4, per_host, 2, 0, 0, 1);
  tr_check("--world 4 --hosts 2", 4, per_host, 2, 0, 0, 0);
  tr_check("--world 4 --hosts 2 --readers 3 --traffic", 4, three, 3, 0, 0, 1);
  tr_check("--world 4 --hosts 2 --readers 4 --traffic", 4, four, 4, 0, 0, 1);
  tr_check("--world 4 --hosts 2 --traffic --param-dtype BF16", 4, per_host, 2, 0, 1, 1);

  /* the figures by hand for the first case, as a check of the checker: rank 0 sends ranks
   * 1..3 their parts of every tensor */
  uint64_t want = 0;
  for (int i = 0; i < TRN; i++)
    for (int r = 1; r < 4; r++) want += tr_part(&TR[i], TR[i].ndim ? 4 : 1, r, 0);
  /* a: 3 x 24; b: 6+6+2; c: 8+8+0; s: 3 x 4; ids: 3 x 8; d: 2x5 F16 rows: 20+20+0 */
  assert_int_equal(want, 72 + 14 + 16 + 12 + 24 + 40);
  json_t *j = tr_json("--world 4 --hosts 2 --traffic");
  assert_int_equal(jint(json_object_get(json_object_get(j, "traffic"), "rank0"), "rank0_sent_bytes"), want);
  json_decref(j);
}

/* HSDP: the reader scatters within its replica and the chain carries each part on, replica by
 * replica, both ways: with 4 replicas of 2 ranks on 2 hosts, the reader of host 1 (replica 2)
 * sends replica 1 its parts through host 1's link, and replica 1 passes them to replica 0. */
static void test_plan_traffic_hsdp(void **state) {
  tr_write();
  static const int two[] = {0, 2}, three[] = {0, 1, 2}, per_host8[] = {0, 4}, five[] = {0, 1, 2, 4, 5};
  const char *hsdp2 = "--mesh 2x2 --placement '[replicate, shard(0)]' --replicate s --hosts 2";
  const char *hsdp4 = "--mesh 4x2 --placement '[replicate, shard(0)]' --replicate s --hosts 2";
  char args[512];
  snprintf(args, sizeof args, "%s --traffic", hsdp2);
  tr_check(args, 4, two, 2, 2, 0, 1);
  snprintf(args, sizeof args, "%s --readers 3", hsdp2);
  tr_check(args, 4, three, 3, 2, 0, 0);
  snprintf(args, sizeof args, "%s --traffic", hsdp4);
  tr_check(args, 8, per_host8, 2, 4, 0, 1);
  /* the lowest rank of each host, then the next lowest of each: 0, 4, 1, 5, then 2 (ascending) */
  snprintf(args, sizeof args, "%s --readers 5 --traffic --param-dtype BF16", hsdp4);
  tr_check(args, 8, five, 5, 4, 1, 1);
}

/* The human section: both modes, every rank of a small world, no tensor tables with
 * --traffic; --rank R lists that rank alone. */
static void test_plan_traffic_text(void **state) {
  tr_write();
  char *out = NULL;
  int rc = sl_test_run(&out, "%s plan '%s' --world 4 --hosts 2 --traffic", sl_test_bin(), g_traffic);
  if (rc != 0) fail_msg("exit %d: %s", rc, out);
  assert_non_null(strstr(out, "traffic of a scatter load: 2 hosts of 2 ranks; 6 tensors"));
  assert_non_null(strstr(out, "rank 0 reads"));
  assert_non_null(strstr(out, "2 readers"));
  assert_non_null(strstr(out, "busiest link"));
  assert_non_null(strstr(out, "RECEIVED"));
  assert_null(strstr(out, "rank 0 of 4:")); /* no tensor tables */
  free(out);
  rc = sl_test_run(&out, "%s plan '%s' --world 4 --hosts 2", sl_test_bin(), g_traffic);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "traffic of a scatter load"));
  assert_non_null(strstr(out, "rank 3 of 4:"));
  free(out);
  /* a world past the listing limit: summarised, no rank lines */
  rc = sl_test_run(&out, "%s plan '%s' --world 128 --hosts 16 --traffic", sl_test_bin(), g_traffic);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "ranks: 128 (listed up to 64"));
  free(out);
  rc = sl_test_run(&out, "%s plan '%s' --world 128 --hosts 16 --traffic --rank 77", sl_test_bin(), g_traffic);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "\n       77      9  "));
  assert_null(strstr(out, "\n       76      9  "));
  free(out);
  /* --readers alone: one host, nothing crosses a link */
  json_t *j = tr_json("--world 4 --readers 2 --traffic"), *t = json_object_get(j, "traffic");
  assert_int_equal(jint(t, "hosts"), 1);
  json_t *rd = json_object_get(json_object_get(t, "readers"), "readers");
  assert_int_equal(json_array_size(rd), 2);
  assert_int_equal(jint(json_array_get(rd, 1), "rank"), 1);
  assert_int_equal(jint(json_object_get(json_object_get(t, "readers"), "busiest_link"), "bytes"), 0);
  assert_true(json_is_null(json_object_get(json_object_get(json_object_get(t, "readers"), "busiest_link"), "host")));
  json_decref(j);
}

/* Bad --hosts and --readers: exit 2, one line naming the option and what to give. */
static void test_plan_traffic_usage_errors(void **state) {
  tr_write();
  static const struct {
    const char *args, *subject, *says;
  } cases[] = {
      {"--world 4 --hosts 3", "--hosts", "give a divisor of 4"},
      {"--world 4 --hosts 8", "--hosts", "give a divisor of 4"},
      {"--world 4 --hosts 0", "--hosts", "is not a number of hosts"},
      {"--world 4 --readers 5", "--readers", "5 readers in a world of 4 ranks; give 1..4"},
      {"--world 4 --readers 0", "--readers", "is not a number of readers"},
      {"--world 4 --hosts 2 --readers x", "--readers", "is not a number of readers"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *out = NULL;
    int rc = sl_test_run(&out, "%s plan '%s' %s", sl_test_bin(), g_traffic, cases[i].args);
    if (rc != 2) fail_msg("plan %s: exit %d, want 2 (%s)", cases[i].args, rc, out);
    assert_one_error_line(out, cases[i].subject);
    if (!strstr(out, cases[i].says)) fail_msg("plan %s: '%s' does not say '%s'", cases[i].args, out, cases[i].says);
    free(out);
  }
}

/* bench/make_shaped_checkpoint.py: a Llama-shaped checkpoint of headers only that `inspect`
 * and `plan --traffic` take, its bytes those of the layout. */
static void test_plan_traffic_shaped_checkpoint(void **state) {
  const char *py = getenv("SHARDLOAD_TEST_PYTHON"), *script = getenv("SHARDLOAD_TEST_SHAPED");
  if (!py || !*py || !script || !*script) skip();
  char *dir = sl_test_path(g_dir, "shaped"), *out = NULL;
  int rc = sl_test_run(&out,
                       "'%s' '%s' '%s' --layers 3 --hidden 64 --intermediate 160 --heads 4 --kv-heads 2 "
                       "--head-dim 16 --vocab 1000 --files 5",
                       py, script, dir);
  if (rc != 0) fail_msg("make_shaped_checkpoint: exit %d: %s", rc, out);
  free(out);
  /* the layout's bytes: embed and lm_head, per layer q, k, v, o, gate, up, down and two norms, the norm */
  uint64_t per_layer = 64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 160 * 64 + 2 * 64;
  uint64_t want = 2 * (2 * 1000 * 64 + 3 * per_layer + 64);
  rc = sl_test_run(&out, "%s inspect '%s'", sl_test_bin(), dir);
  if (rc != 0) fail_msg("inspect: exit %d: %s", rc, out);
  char head[256];
  snprintf(head, sizeof head, ": 30 tensors, %llu bytes", (unsigned long long)want); /* 3 x 9 + 3 */
  if (!strstr(out, head)) fail_msg("inspect says '%.200s', want '%s'", out, head);
  assert_non_null(strstr(out, "model-00005-of-00005.safetensors"));
  assert_non_null(strstr(out, "model.layers.2.mlp.down_proj.weight"));
  free(out);

  char *jp = sl_test_path(g_dir, "shaped.json"), cmd[4096];
  snprintf(cmd, sizeof cmd, "%s plan '%s' --world 8 --hosts 2 --traffic --json", sl_test_bin(), dir);
  assert_int_equal(run_to_file(jp, cmd), 0);
  json_t *j = load_json_file(jp), *t = json_object_get(j, "traffic");
  assert_int_equal(jint(t, "read_bytes"), want);
  assert_int_equal(jint(t, "tensors"), 30);
  /* 5 files for 2 readers: shares are whole files, and cover the checkpoint */
  json_t *rd = json_object_get(json_object_get(t, "readers"), "readers");
  assert_int_equal(json_array_size(rd), 2);
  assert_int_equal(jint(json_array_get(rd, 0), "rank"), 0);
  assert_int_equal(jint(json_array_get(rd, 1), "rank"), 4);
  assert_int_equal(jint(json_array_get(rd, 0), "read_bytes") + jint(json_array_get(rd, 1), "read_bytes"), want);
  json_decref(j);
  free(jp);
  free(dir);
}

/* The plan's figures are the load's: `load --nproc` (all ranks on this host, so the readers
 * are ranks 0..R-1, as `plan --readers R` without --hosts has them) counts every byte each rank
 * sends and receives and each reader reads (its report's stats); the plan must say the same,
 * rank by rank, for rank 0 reading alone, for readers, and under HSDP. */
static void test_plan_traffic_matches_load(void **state) {
  tr_write();
  static const struct {
    char *const *path;
    int world;
    const char *source, *opts;
  } cases[] = {
      {&g_traffic, 4, "rank0", ""},
      {&g_traffic, 4, "readers", "--readers 3"},
      {&g_synth, 4, "readers", "--readers 2 --param-dtype F32"},
      {&g_synth, 6, "readers", "--readers 3 --mesh 3x2 --placement '[replicate, shard(0)]'"},
      {&g_synth, 6, "rank0", "--mesh 3x2 --placement '[replicate, shard(0)]'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *path = *cases[i].path;
    char *lp = sl_test_path(g_dir, "load.json"), *pp = sl_test_path(g_dir, "plan-traffic.json"), cmd[4096], *out = NULL;
    int rc = sl_test_run(&out, "%s load '%s' --nproc %d --backend cpu --source %s %s --timeout 60 --json > '%s'",
                         sl_test_bin(), path, cases[i].world, cases[i].source, cases[i].opts, lp);
    if (out && strstr(out, "has no Gloo")) {
      free(out);
      skip();
    }
    if (rc != 0) fail_msg("load %s %s: exit %d: %s", cases[i].source, cases[i].opts, rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s plan '%s' --world %d %s %s --traffic --json", sl_test_bin(), path, cases[i].world,
             cases[i].opts, strcmp(cases[i].source, "rank0") ? "" : "--readers 1");
    assert_int_equal(run_to_file(pp, cmd), 0);
    json_t *load = load_json_file(lp), *plan = load_json_file(pp);
    const char *which = strcmp(cases[i].source, "rank0") ? "readers" : "rank0";
    json_t *mode = json_object_get(json_object_get(plan, "traffic"), which);
    json_t *ranks = json_object_get(load, "ranks"), *rr = json_object_get(mode, "rank_received_bytes"),
           *rs = json_object_get(mode, "rank_sent_bytes"), *rd = json_object_get(mode, "readers");
    assert_int_equal(json_array_size(ranks), cases[i].world);
    size_t reader = 0;
    for (size_t r = 0; r < json_array_size(ranks); r++) {
      json_t *st = json_object_get(json_array_get(ranks, r), "stats");
      uint64_t sent = jint(st, "bytes_sent"), recv = jint(st, "bytes_received"), read = jint(st, "bytes_read");
      uint64_t psent = (uint64_t)json_integer_value(json_array_get(rs, r)),
               precv = (uint64_t)json_integer_value(json_array_get(rr, r));
      if (sent != psent || recv != precv)
        fail_msg("%s --source %s %s: rank %zu sent %llu received %llu in the load, the plan says %llu and %llu", path,
                 cases[i].source, cases[i].opts, r, (unsigned long long)sent, (unsigned long long)recv,
                 (unsigned long long)psent, (unsigned long long)precv);
      /* the readers, ascending: each one's read is the plan's share */
      if (reader < json_array_size(rd) && jint(json_array_get(rd, reader), "rank") == r) {
        assert_int_equal(jint(json_array_get(rd, reader), "read_bytes"), read);
        reader++;
      } else {
        assert_int_equal(read, 0);
      }
    }
    assert_int_equal(reader, json_array_size(rd));
    json_decref(load);
    json_decref(plan);
    free(lp);
    free(pp);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_json_is_one_document),
      cmocka_unit_test(test_plan_json_memory_does_not_grow_with_world),
      cmocka_unit_test(test_plan_write_error_is_reported),
      cmocka_unit_test(test_plan_json_out_of_memory_is_reported),
      cmocka_unit_test(test_plan_traffic_scatter),
      cmocka_unit_test(test_plan_traffic_hsdp),
      cmocka_unit_test(test_plan_traffic_text),
      cmocka_unit_test(test_plan_traffic_usage_errors),
      cmocka_unit_test(test_plan_traffic_shaped_checkpoint),
      cmocka_unit_test(test_plan_traffic_matches_load),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
