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

static int teardown(void **state) {
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
  static const char *modes[] = {"--json", ""};
  for (int i = 0; i < 2; i++) {
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_json_is_one_document),
      cmocka_unit_test(test_plan_json_memory_does_not_grow_with_world),
      cmocka_unit_test(test_plan_write_error_is_reported),
      cmocka_unit_test(test_plan_json_out_of_memory_is_reported),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
