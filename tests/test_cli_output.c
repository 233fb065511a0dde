/* What the `shardload` command writes is checked as it is written: a report that cannot be
 * written (a full disk: /dev/full; a file size limit) ends the command with exit status 1 and
 * one error line naming the output and the reason, never exit status 0 (what inspect, load's
 * table, synth and --help did); and running out of memory is said as such (SL_ERR_NOMEM),
 * never as a write error (what inspect --json and load --json said), nor as an invalid header
 * (what the header parse said), nor as a report with parts left out. Real processes, the built
 * command. (`load --nproc`: test_cli_output_multirank.c.) */
#define _GNU_SOURCE
#include <sys/stat.h>
#include <unistd.h>

#include "cli_testlib.h"

/* World size 1 whatever launcher environment the test runs under. */
#define ENV1 "env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0"

static char *g_dir, *g_ck, *g_many;

static int setup(void **state) {
  g_dir = sl_test_dir("cli_output");
  if (!g_dir) return -1;
  g_ck = sl_test_path(g_dir, "ck.safetensors");
  char *out = NULL;
  int rc = sl_test_run(&out, "%s synth '%s' --size 1MiB", sl_test_bin(), g_ck);
  if (rc != 0) fprintf(stderr, "synth failed (%d): %s\n", rc, out ? out : "");
  free(out);
  return rc == 0 ? 0 : -1;
}

static int teardown(void **state) {
  free(g_ck);
  free(g_many);
  free(g_dir);
  return 0;
}

/* OUT (stderr of a command whose stdout failed) is one error line about SUBJECT saying that
 * WHAT could not be written to stdout, and why (REASON). */
static void assert_write_error(const char *out, const char *subject, const char *what, const char *to,
                               const char *reason) {
  assert_one_error_line(out, subject);
  char want[512];
  snprintf(want, sizeof want, "SL_ERR_IO: cannot write %s to %s: %s\n", what, to, reason);
  if (!strstr(out, want)) fail_msg("want '%s', got '%s'", want, out);
}

/* Every command that writes to stdout, with stdout a full disk. */
static void test_full_stdout_fails_with_the_reason(void **state) {
  if (access("/dev/full", W_OK) != 0) skip();
  char *synth_out = sl_test_path(g_dir, "synth.safetensors");
  const struct {
    const char *args; /* after the binary; %s: A, then B */
    const char *a, *b, *subject, *what;
  } cases[] = {
      {"inspect '%s'", g_ck, "", g_ck, "the table"},
      {"inspect '%s' --json", g_ck, "", g_ck, "the JSON report"},
      {"load '%s'", g_ck, "", g_ck, "the report"},
      {"load '%s' --dump '%s'", g_ck, g_dir, g_ck, "the report"}, /* its "dump:" line too */
      {"load '%s' --json", g_ck, "", g_ck, "the JSON report"},
      {"synth '%s' --size 64KiB", synth_out, "", synth_out, "the summary"},
      {"--help", "", "", "--help", "the help"},
      {"--version", "", "", "--version", "the version"},
      {"inspect --help", "", "", "--help", "the help"},
      {"load --help", "", "", "--help", "the help"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, cases[i].args, cases[i].a, cases[i].b);
    int rc = sl_test_run(&out, "(" ENV1 " %s %s >/dev/full)", sl_test_bin(), args);
    if (rc != 1) fail_msg("%s > /dev/full: exit %d, want 1 (%s)", args, rc, out);
    assert_write_error(out, cases[i].subject, cases[i].what, "stdout", "No space left on device");
    free(out);
  }
  /* synth's files are whole: only its summary was lost */
  char *out = NULL;
  assert_int_equal(sl_test_run(&out, "%s inspect '%s' >/dev/null", sl_test_bin(), synth_out), 0);
  free(out);
  free(synth_out);
}

/* Another reason, another destination: a file size limit (EFBIG; the command ignores SIGXFSZ)
 * on a regular file, for the JSON report and the table. */
static void test_file_size_limit_fails_with_the_reason(void **state) {
  char *dest = sl_test_path(g_dir, "report.out");
  static const char *modes[] = {"--json", ""};
  for (int i = 0; i < 2; i++) {
    char *out = NULL;
    int rc = sl_test_run(&out, "(ulimit -f 1 && %s inspect '%s' %s > '%s')", sl_test_bin(), g_ck, modes[i], dest);
    if (rc != 1) fail_msg("inspect %s under a 1 KiB file size limit: exit %d (%s)", modes[i], rc, out);
    assert_write_error(out, g_ck, *modes[i] ? "the JSON report" : "the table", "stdout", "File too large");
    free(out);
  }
  free(dest);
}

/* The outputs are unchanged by the checking: the JSON report is one document as jansson writes
 * it, and the table is whole (a row per tensor, a trailing newline). */
static void test_reports_are_whole(void **state) {
  char *dest = sl_test_path(g_dir, "inspect.json");
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s inspect '%s' --json", sl_test_bin(), g_ck);
  assert_int_equal(run_to_file(dest, cmd), 0);
  json_t *j = load_json_file(dest);
  assert_int_equal(json_integer_value(json_object_get(j, "tensor_count")), 53);
  assert_int_equal(json_array_size(json_object_get(j, "tensors")), 53);
  json_decref(j);
  snprintf(cmd, sizeof cmd, ENV1 " %s load '%s' --json", sl_test_bin(), g_ck);
  assert_int_equal(run_to_file(dest, cmd), 0);
  j = load_json_file(dest);
  assert_int_equal(json_array_size(json_object_get(j, "tensors")), 53);
  assert_true(json_is_object(json_object_get(j, "stats")));
  json_decref(j);
  char *out = NULL;
  assert_int_equal(sl_test_run(&out, "%s inspect '%s'", sl_test_bin(), g_ck), 0);
  size_t rows = 0;
  for (const char *p = out; (p = strstr(p, "model.layers.")) != NULL; p++) rows++;
  assert_true(rows >= 45); /* every layer tensor's row, its name once */
  assert_true(out[strlen(out) - 1] == '\n');
  free(out);
  free(dest);
}

/* ---- out of memory ------------------------------------------------------------------------ */

/* A checkpoint of 50000 one-row tensors: a 3 MB header, whose reports need tens of MB. */
static const char *many_tensors(void) {
  if (g_many) return g_many;
  enum { N = 50000 };
  sl_test_tensor *ts = calloc(N, sizeof *ts);
  char (*names)[16] = calloc(N, sizeof *names);
  assert_non_null(ts);
  assert_non_null(names);
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "t%d", i);
    ts[i] = (sl_test_tensor){names[i], "U8", 2, {2, 1}, NULL};
  }
  g_many = sl_test_path(g_dir, "many.safetensors");
  assert_int_equal(sl_test_write_st(g_many, ts, N, NULL), 0);
  free(ts);
  free(names);
  return g_many;
}

/* Runs ARGS (after the binary) on the many-tensor checkpoint under a data limit of MIB MiB
 * (RLIMIT_DATA, set in the shell that execs the command). Returns the exit status; a failure
 * must be exactly one SL_ERR_NOMEM line: never a write error, never an invalid header. *OUT:
 * its stderr. */
static int run_limited(const char *args, int mib, char **out) {
  const char *p = many_tensors();
  /* one malloc arena: where threads' arenas land (64 MiB reservations each) is otherwise up to
   * the scheduler, and the limit a command needs with it */
  int rc = sl_test_run(out, "(ulimit -d %d && " ENV1 " MALLOC_ARENA_MAX=1 %s %s '%s' >/dev/null)", mib * 1024,
                       sl_test_bin(), args, p);
  if (rc == 0) return 0;
  if (rc != 1) fail_msg("%s under a data limit of %d MiB: exit %d (%s)", args, mib, rc, *out);
  assert_one_error_line(*out, p);
  if (!strstr(*out, "SL_ERR_NOMEM") || strstr(*out, "cannot write") || strstr(*out, "not valid JSON"))
    fail_msg("%s under a data limit of %d MiB: '%s', want an out-of-memory error", args, mib, *out);
  return rc;
}

/* The length of the header of the safetensors file PATH. */
static unsigned long long header_length(const char *path) {
  FILE *f = fopen(path, "rb");
  unsigned char le[8];
  assert_non_null(f);
  assert_int_equal(fread(le, 1, 8, f), 8);
  fclose(f);
  unsigned long long n = 0;
  for (int i = 0; i < 8; i++) n |= (unsigned long long)le[i] << (8 * i);
  return n;
}

/* The smallest limit of the ladder (from FROM MiB, by STEP) under which ARGS runs; on the way,
 * every failure is the out-of-memory line. *SAW_HEADER: one said that the header could not be
 * parsed, naming the file and the header's size. */
static int smallest_limit(const char *args, int from, int step, int *saw_header) {
  char want[1024];
  snprintf(want, sizeof want, "SL_ERR_NOMEM: %s: out of memory parsing its %llu-byte header", many_tensors(),
           header_length(many_tensors()));
  for (int mib = from; mib <= 512; mib += step) {
    char *out = NULL;
    int rc = run_limited(args, mib, &out);
    if (rc != 0 && strstr(out, want)) *saw_header = 1;
    free(out);
    if (rc == 0) return mib;
  }
  fail_msg("%s does not run under a data limit of 512 MiB", args);
  return 0;
}

/* Under a data limit too small for it, parsing a 3 MB header fails as out of memory, naming the
 * file and the header's size ("header is not valid JSON:  (line -1, column -1)" before); the
 * JSON report of inspect, and of load, fails as out of memory under the limit their tables run
 * in (inspect said "cannot write the JSON report", and the reports dropped what they could not
 * allocate); load's streams its tensors, and runs in about the table's limit. Not under ASan,
 * whose shadow memory is private data too. */
/* A library in the process that prints to stdout while a load runs (NCCL with NCCL_DEBUG set
 * and no NCCL_DEBUG_FILE, which GPU images often set) must not land inside the report: stdout
 * is the report's, whatever else the process prints goes to stderr (cli_claim_stdout), one rank
 * or --nproc ranks. The preloaded library wraps sl_load with a line on stdout. */
static void test_foreign_stdout_stays_out_of_the_report(void **state) {
  const char *noise = getenv("SHARDLOAD_TEST_STDOUT_NOISE");
  if (!noise || !*noise) skip(); /* a sanitizer build: nothing may be preloaded before its runtime */
  char *json = sl_test_path(g_dir, "noise.json");
  const char *modes[] = {"", " --nproc 2"};
  for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
    char *err = NULL; /* the command's stderr: its stdout goes to JSON */
    int rc = sl_test_run(&err, "{ " ENV1 " LD_PRELOAD='%s' %s load '%s' --json%s >'%s'; }", noise, sl_test_bin(), g_ck,
                         modes[i], json);
    if (rc != 0) fail_msg("load --json%s with a library printing to stdout: exit %d: %s", modes[i], rc, err);
    json_error_t je;
    json_t *doc = json_load_file(json, 0, &je);
    if (!doc)
      fail_msg("load --json%s with a library printing to stdout: the report is not one JSON document (%s, "
               "line %d)", modes[i], je.text, je.line);
    json_decref(doc);
    if (!strstr(err, "NCCL INFO a vendor library's line"))
      fail_msg("load --json%s: the library's line is neither in the report nor on stderr: '%s'", modes[i], err);
    free(err);
  }
  free(json);
}

static void test_out_of_memory_is_reported_as_such(void **state) {
#ifdef SL_TEST_ASAN
  skip();
#endif
  int saw_header = 0;
  int limit = smallest_limit("inspect", 4, 4, &saw_header);
  if (!saw_header) fail_msg("no data limit below %d MiB failed the header's parse", limit);
  char *out = NULL;
  int rc = run_limited("inspect --json", limit, &out);
  fprintf(stderr, "data limit %d MiB: inspect --json exit %d: %s", limit, rc, out);
  if (rc == 0)
    fail_msg("inspect --json of 50000 tensors ran under the data limit of its table (%d MiB): either its report "
             "lost parts silently, or the limit no longer separates the two (make the checkpoint larger)", limit);
  assert_non_null(strstr(out, "out of memory writing the JSON report"));
  free(out);

  /* load --json streams its tensors one at a time (a tree of 50,000 of them needed some 70 MiB
   * more than the table): from the least limit its table ran in, every rung that fails says
   * out of memory (the load's threads and staging make the exact need vary), and it runs
   * within 16 MiB of the table's limit */
  limit = smallest_limit("load", limit, 4, &saw_header);
  int ran = 0, mib = limit;
  for (; mib <= limit + 16 && !ran; mib += 4) {
    rc = run_limited("load --json", mib, &out);
    fprintf(stderr, "data limit %d MiB: load --json exit %d: %s", mib, rc, rc ? out : "\n");
    ran = rc == 0;
    free(out);
  }
  if (!ran)
    fail_msg("load --json of 50000 tensors does not run within 16 MiB of the data limit its table runs in (%d MiB): "
             "is its report built whole again?", limit);
}

/* jansson out of memory in the middle of load's streamed --json report (a tensor's element, after
 * the ones before it were written; tests/preload/json_oom.c): exit status 1 and the
 * out-of-memory line, never 0 with a report that lacks tensors, at world 1 and in a rank of
 * --nproc 2 (whose whole report the launcher never prints then). */
static void test_out_of_memory_mid_report(void **state) {
  const char *oom = getenv("SHARDLOAD_TEST_JSON_OOM");
  if (!oom || !*oom) skip(); /* a sanitizer build: nothing may be preloaded before its runtime */
  char *json = sl_test_path(g_dir, "whole.json"), cmd[4096];
  snprintf(cmd, sizeof cmd, ENV1 " %s load '%s' --json", sl_test_bin(), g_ck);
  assert_int_equal(run_to_file(json, cmd), 0);
  json_t *doc = load_json_file(json);
  json_t *ts = json_object_get(doc, "tensors");
  assert_true(json_array_size(ts) >= 3);
  /* armed by the second tensor's name: the third element fails, two were written */
  const char *name = json_string_value(json_object_get(json_array_get(ts, 1), "name"));
  assert_non_null(name);
  const char *modes[] = {"", " --nproc 2"};
  for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
    char *err = NULL; /* the command's stderr: its stdout goes to JSON */
    int rc = sl_test_run(&err,
                         "{ " ENV1 " LD_PRELOAD='%s' SHARDLOAD_TEST_JSON_OOM_AFTER='%s' %s load '%s' --json%s >'%s'; }",
                         oom, name, sl_test_bin(), g_ck, modes[i], json);
    if (rc != 1 || !strstr(err, "SL_ERR_NOMEM") || !strstr(err, "out of memory writing the JSON report"))
      fail_msg(
          "load --json%s, jansson out of memory after tensor '%s': exit %d, '%s'; want exit 1 and the "
          "out-of-memory line",
          modes[i], name, rc, err);
    assert_one_error_line(err, g_ck);
    free(err);
  }
  json_decref(doc);
  free(json);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_full_stdout_fails_with_the_reason),
      cmocka_unit_test(test_file_size_limit_fails_with_the_reason),
      cmocka_unit_test(test_reports_are_whole),
      cmocka_unit_test(test_out_of_memory_is_reported_as_such),
      cmocka_unit_test(test_foreign_stdout_stays_out_of_the_report),
      cmocka_unit_test(test_out_of_memory_mid_report),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
