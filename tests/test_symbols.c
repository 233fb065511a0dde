/* The shared library exports only the public sl_* API (built with -fvisibility=hidden);
 * internals (sl__*), module tables and vendored C++ stay hidden. argv[1]: libshardload.so. */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

static const char *lib;

static void test_only_public_symbols_exported(void **state) {
  char *out = NULL;
  int rc = sl_test_run(&out, "nm -D --defined-only '%s' | awk '{print $3}'", lib);
  assert_int_equal(rc, 0);
  int n = 0, bad = 0;
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    if (!*line) continue;
    n++;
    if (strncmp(line, "sl_", 3) != 0 || strncmp(line, "sl__", 4) == 0) {
      fprintf(stderr, "unexpected exported symbol: %s\n", line);
      bad++;
    }
  }
  free(out);
  assert_true(n >= 40); /* the public API is there */
  assert_int_equal(bad, 0);
}

static void test_public_entry_points_present(void **state) {
  const char *want[] = {"sl_context_create", "sl_load", "sl_resolve_placement", "sl_source_open",
                        "sl_plan_load_json", "sl_status_name", "sl_version", "sl_convert"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    char *out = NULL;
    int rc = sl_test_run(&out, "nm -D --defined-only '%s' | awk '$3 == \"%s\"' | wc -l", lib, want[i]);
    assert_int_equal(rc, 0);
    assert_int_equal(atoi(out), 1);
    free(out);
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_symbols LIBSHARDLOAD.so\n");
    return 2;
  }
  lib = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_only_public_symbols_exported),
      cmocka_unit_test(test_public_entry_points_present),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
