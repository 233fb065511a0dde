/* The shared library exports only the public sl_* API (built with -fvisibility=hidden);
 * internals (sl__*), module tables and vendored C++ stay hidden. argv[1]: libshardload.so.
 * Loadable modules export only their entry symbols (docs/DESIGN.md#modules): the test modules
 * in $SHARDLOAD_TEST_MODULES, built as out-of-tree modules are, are checked too, and so are the
 * CUDA and NCCL modules in $SHARDLOAD_CUDA_MODULES (set where -DSHARDLOAD_WITH_CUDA=ON built
 * them): they link the CUDA runtime statically, whose symbols must stay inside; and the HIP and
 * RCCL modules in $SHARDLOAD_HIP_MODULES (-DSHARDLOAD_WITH_HIP=ON), which define the compiler's
 * launch ABI (hipLaunchKernel, __hipRegisterFatBinary...) and their runtime table inside; and
 * the Level Zero backend in $SHARDLOAD_LEVEL_ZERO_MODULES (-DSHARDLOAD_WITH_LEVEL_ZERO=ON),
 * which keeps its loader table (sl__ze) inside. */
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

/* The entry symbols module NAME exports, space-separated and sorted. */
static char *module_exports(const char *dir, const char *name) {
  char *out = NULL;
  int rc = sl_test_run(&out, "nm -D --defined-only '%s/libshardload-%s.so' | awk '{print $3}' | sort | tr '\\n' ' '", dir,
                       name);
  assert_int_equal(rc, 0);
  return out;
}

static void test_modules_export_only_entry_symbols(void **state) {
  const char *dir = getenv("SHARDLOAD_TEST_MODULES");
  if (!dir || !*dir) fail_msg("SHARDLOAD_TEST_MODULES is not set (CTest sets it)");
  static const struct {
    const char *name, *exports;
  } want[] = {
      {"v1host", "sl_backend_module "},
      {"v1other", "sl_backend_module "},
      {"v1local", "sl_collective_module "},
      {"hostmem", "sl_backend_module_v2 "},
      {"probeno", "sl_backend_module_v2 "},
      {"badabi", "sl_backend_module_v2 "},
      {"dual", "sl_backend_module sl_backend_module_v2 "}, /* one binary, two core versions */
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    char *got = module_exports(dir, want[i].name);
    if (strcmp(got, want[i].exports) != 0) fprintf(stderr, "libshardload-%s.so exports: %s\n", want[i].name, got);
    assert_string_equal(got, want[i].exports);
    free(got);
  }
  /* and no module in the directory exports anything else */
  char *out = NULL;
  int rc = sl_test_run(&out,
                       "for f in '%s'/libshardload-*.so; do nm -D --defined-only \"$f\" | awk '{print $3}'; done | "
                       "grep -Ev '^sl_(backend|collective)_module(_v2)?$' | wc -l",
                       dir);
  assert_int_equal(rc, 0);
  assert_int_equal(atoi(out), 0);
  free(out);
}

/* Each CUDA module exports its v2 entry and nothing else: no cudart, no kernel stubs, no
 * helper. Skipped (not passed) in builds without them. */
static void test_cuda_modules_export_only_entry_symbols(void **state) {
  const char *dir = getenv("SHARDLOAD_CUDA_MODULES");
  if (!dir || !*dir) skip();
  char *got = module_exports(dir, "cuda");
  fprintf(stderr, "libshardload-cuda.so exports: %s\n", got);
  assert_string_equal(got, "sl_backend_module_v2 ");
  free(got);
  got = module_exports(dir, "nccl");
  fprintf(stderr, "libshardload-nccl.so exports: %s\n", got);
  assert_string_equal(got, "sl_collective_module_v2 ");
  free(got);
}

/* The same for the HIP twins: no hip* launch ABI, no runtime table, no helper leaves them. */
static void test_hip_modules_export_only_entry_symbols(void **state) {
  const char *dir = getenv("SHARDLOAD_HIP_MODULES");
  if (!dir || !*dir) skip();
  char *got = module_exports(dir, "hip");
  fprintf(stderr, "libshardload-hip.so exports: %s\n", got);
  assert_string_equal(got, "sl_backend_module_v2 ");
  free(got);
  got = module_exports(dir, "rccl");
  fprintf(stderr, "libshardload-rccl.so exports: %s\n", got);
  assert_string_equal(got, "sl_collective_module_v2 ");
  free(got);
}

/* The Level Zero backend: its entry and nothing else (no loader table, no ze* name). */
static void test_level_zero_module_exports_only_its_entry(void **state) {
  const char *dir = getenv("SHARDLOAD_LEVEL_ZERO_MODULES");
  if (!dir || !*dir) skip();
  char *got = module_exports(dir, "level_zero");
  fprintf(stderr, "libshardload-level_zero.so exports: %s\n", got);
  assert_string_equal(got, "sl_backend_module_v2 ");
  free(got);
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
      cmocka_unit_test(test_modules_export_only_entry_symbols),
      cmocka_unit_test(test_cuda_modules_export_only_entry_symbols),
      cmocka_unit_test(test_hip_modules_export_only_entry_symbols),
      cmocka_unit_test(test_level_zero_module_exports_only_its_entry),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
