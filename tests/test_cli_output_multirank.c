/* `shardload load --nproc N` with stdout a full disk: the launcher's merged report (the table,
 * the per-rank tables of --verbose, and --json) is checked as it is written, so the launcher
 * exits 1 with one error line that names stdout and the reason, not 0 (the table) or "cannot
 * write" with no reason (--json). The ranks are real processes over real Gloo on loopback; the
 * single-process cases are in test_cli_output.c. */
#define _GNU_SOURCE
#include <unistd.h>

#include "cli_testlib.h"

static char *g_dir, *g_ck;

static int setup(void **state) {
  g_dir = sl_test_dir("cli_output_multirank");
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
  free(g_dir);
  return 0;
}

static void test_nproc_full_stdout_fails_with_the_reason(void **state) {
  if (access("/dev/full", W_OK) != 0) skip();
  static const struct {
    const char *args, *what;
  } cases[] = {
      {"", "the report"},
      {"--verbose", "the report"},
      {"--json", "the JSON report"},
  };
  char *errp = sl_test_path(g_dir, "stderr.txt");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out = NULL;
    int rc = sl_test_run(&out, "(%s load '%s' --nproc 2 --backend cpu %s >/dev/full 2>'%s')", sl_test_bin(), g_ck,
                         cases[i].args, errp);
    free(out);
    /* its stderr without --verbose's "launch: rank R pid P" lines */
    FILE *f = fopen(errp, "r");
    assert_non_null(f);
    char line[4096], err[8192] = "";
    while (fgets(line, sizeof line, f))
      if (strncmp(line, "launch: ", 8) != 0) strncat(err, line, sizeof err - strlen(err) - 1);
    fclose(f);
    if (rc != 1) fail_msg("load --nproc 2 %s > /dev/full: exit %d, want 1 (%s)", cases[i].args, rc, err);
    assert_one_error_line(err, g_ck);
    char want[256];
    snprintf(want, sizeof want, "SL_ERR_IO: cannot write %s to stdout: No space left on device\n", cases[i].what);
    if (!strstr(err, want)) fail_msg("load --nproc 2 %s > /dev/full: want '%s', got '%s'", cases[i].args, want, err);
  }
  free(errp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nproc_full_stdout_fails_with_the_reason),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
