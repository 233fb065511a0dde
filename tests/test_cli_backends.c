/* `shardload backends [--json]`: every backend and collective module, built in or loaded from
 * where, its ABI version, whether it runs here and why not, a backend's device, and what auto
 * would choose; exit status 0 whatever is missing; every text a module gives escaped; a report
 * that cannot be written is exit status 1. The built command, real modules planted on
 * SHARDLOAD_MODULE_PATH (tests/modules/, $SHARDLOAD_TEST_MODULES). */
#define _GNU_SOURCE
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_testlib.h"

static const char *moddir;

static void plant(const char *dir, const char *as, const char *module) {
  char target[4200], link[4200];
  snprintf(target, sizeof target, "%s/libshardload-%s.so", moddir, module);
  snprintf(link, sizeof link, "%s/libshardload-%s.so", dir, as);
  assert_int_equal(symlink(target, link), 0);
}

/* The command's output with SHARDLOAD_MODULE_PATH set to PATH (NULL: unset). */
static int run_backends(char **out, const char *path, const char *args) {
  if (!path) return sl_test_run(out, "env -u SHARDLOAD_MODULE_PATH '%s' backends %s", sl_test_bin(), args);
  return sl_test_run(out, "env SHARDLOAD_MODULE_PATH='%s' '%s' backends %s", path, sl_test_bin(), args);
}

static json_t *parse(const char *out) {
  json_error_t err;
  json_t *root = json_loads(out, 0, &err);
  if (!root) fail_msg("not one JSON document (%s):\n%s", err.text, out);
  return root;
}

/* The entry NAME of the array KEY ("backends", "collectives"), or NULL. */
static json_t *entry(json_t *root, const char *key, const char *name) {
  size_t i;
  json_t *m;
  json_array_foreach(json_object_get(root, key), i, m) {
    if (!strcmp(json_string_value(json_object_get(m, "name")), name)) return m;
  }
  return NULL;
}

static const char *str(json_t *o, const char *key) { return json_string_value(json_object_get(o, key)); }

/* The table row of OUT that starts with NAME and a space, columns collapsed to one space each
 * (the FROM column is as wide as the longest path of the build), or fails. */
static char *row(const char *out, const char *name) {
  size_t n = strlen(name);
  for (const char *at = out; at; at = strchr(at, '\n') ? strchr(at, '\n') + 1 : NULL) {
    if (strncmp(at, name, n) != 0 || at[n] != ' ') continue;
    size_t len = strcspn(at, "\n"), k = 0;
    char *r = malloc(len + 1);
    assert_non_null(r);
    for (size_t i = 0; i < len; i++)
      if (at[i] != ' ' || (k && r[k - 1] != ' ')) r[k++] = at[i];
    r[k] = 0;
    return r;
  }
  fail_msg("no row for %s in:\n%s", name, out);
  return NULL;
}

static void assert_row(const char *out, const char *name, const char *want) {
  char *r = row(out, name);
  if (strncmp(r, want, strlen(want)) != 0) fail_msg("row '%s', expected it to start '%s'", r, want);
  free(r);
}

/* Every entry says what it is: a module that runs has its ABI version (and a backend its
 * device); one that does not has a reason. */
static void check_entries(json_t *root, const char *key) {
  size_t i;
  json_t *m;
  assert_true(json_array_size(json_object_get(root, key)) > 0);
  json_array_foreach(json_object_get(root, key), i, m) {
    const char *state = str(m, "state");
    assert_non_null(state);
    bool runs = json_is_true(json_object_get(m, "runs"));
    assert_int_equal(runs, !strcmp(state, "runs"));
    if (runs) {
      assert_true(json_integer_value(json_object_get(m, "abi_version")) >= 1);
      if (!strcmp(key, "backends")) assert_non_null(str(m, "device"));
    } else {
      assert_non_null(str(m, "reason"));
    }
    bool builtin = json_is_true(json_object_get(m, "builtin"));
    assert_true(builtin ? json_is_null(json_object_get(m, "path")) : true);
  }
}

/* Where only the built-ins and the modules of this build exist (CI: no GPU): a table of both
 * kinds, cpu running with its device, the known vendor modules with their reasons, and auto's
 * choice; the same in JSON. */
static void test_backends_here(void **state) {
  char *out = NULL;
  assert_int_equal(run_backends(&out, NULL, ""), 0);
  fprintf(stderr, "%s", out);
  assert_true(!strncmp(out, "backends:\nNAME ", 15));
  assert_row(out, "cpu", "cpu yes 2 built in cpu (host memory), ");
  char *hip = row(out, "hip"); /* installed or not, with its reason or its device */
  assert_true(strstr(hip, "hip not installed - - hip: not available (libshardload-hip.so") || strstr(hip, "hip: ") ||
              strstr(hip, "hip yes "));
  free(hip);
  assert_non_null(strstr(out, "\ncollectives:\nNAME "));
  assert_row(out, "simccl", "simccl yes 2 built in sim device");
  assert_non_null(strstr(out, "\nauto here:\n  backend                     "));
  assert_non_null(strstr(out, "\n  collective, one rank        local (local: "));
  assert_non_null(strstr(out, "\nmodule files are looked for in: "));
  assert_null(strstr(out, " \n")); /* no line ends in padding */
  free(out);
  assert_int_equal(run_backends(&out, NULL, "--json"), 0);
  json_t *root = parse(out);
  check_entries(root, "backends");
  check_entries(root, "collectives");
  json_t *cpu = json_array_get(json_object_get(root, "backends"), 0);
  assert_string_equal(str(cpu, "name"), "cpu");
  assert_string_equal(str(cpu, "device"), "cpu (host memory)");
  assert_true(json_integer_value(json_object_get(cpu, "memory_bytes")) > 0);
  const char *known[] = {"cuda", "hip", "level_zero"};
  for (size_t i = 0; i < 3; i++) assert_non_null(entry(root, "backends", known[i]));
  assert_non_null(entry(root, "collectives", "nccl"));
  assert_non_null(entry(root, "collectives", "rccl"));
  json_t *simccl = entry(root, "collectives", "simccl");
  assert_string_equal(str(simccl, "probed_with"), "sim");
  assert_string_equal(json_string_value(json_array_get(json_object_get(simccl, "domains"), 0)), "device");
  json_t *au = json_object_get(root, "auto");
  const char *chosen = str(json_object_get(au, "backend"), "name");
  assert_non_null(chosen);
  json_t *be = entry(root, "backends", chosen); /* auto takes one that runs */
  assert_non_null(be);
  assert_true(json_is_true(json_object_get(be, "runs")));
  assert_string_equal(str(json_object_get(au, "collective_one_rank"), "name"), "local");
  assert_non_null(str(json_object_get(au, "collective"), "name"));
  assert_true(json_array_size(json_object_get(root, "search_path")) >= 1);
  assert_int_equal(json_integer_value(json_object_get(root, "not_listed")), 0);
  json_decref(root);
  free(out);
}

/* The line of OUT after the one that starts with NAME and a space (NULL when none), as it is,
 * up to its newline. */
static char *line_after(const char *out, const char *name, int skip_lines) {
  size_t n = strlen(name);
  for (const char *at = out; at; at = strchr(at, '\n') ? strchr(at, '\n') + 1 : NULL) {
    if (strncmp(at, name, n) != 0 || at[n] != ' ') continue;
    for (int k = 0; k <= skip_lines && at; k++) at = strchr(at, '\n') ? strchr(at, '\n') + 1 : NULL;
    if (!at) return NULL;
    char *l = strndup(at, strcspn(at, "\n"));
    assert_non_null(l);
    return l;
  }
  return NULL;
}

/* A backend of several devices: its row holds device 0, and a row of its own under it each of
 * the others, indented to the device column; in JSON, DEVICES lists them all and DEVICE is still
 * device 0's. CPU and sim keep one device each. The Level Zero module over the test driver with
 * three devices (tests/ze_driver), where this build has both (CTest says where:
 * SHARDLOAD_TEST_ZE_DRIVER, SHARDLOAD_LEVEL_ZERO_MODULES). */
static void test_backends_level_zero_devices(void **state) {
  const char *drv = getenv("SHARDLOAD_TEST_ZE_DRIVER"), *mods = getenv("SHARDLOAD_LEVEL_ZERO_MODULES");
  if (!drv || !*drv || !mods || !*mods) skip(); /* no Level Zero module in this build */
  char *out = NULL;
  assert_int_equal(sl_test_run(&out, "env ZE_ENABLE_ALT_DRIVERS='%s' ZEDRV_DEVICES=3 ZEDRV_MISUSE=abort "
                               "SHARDLOAD_MODULE_PATH='%s' '%s' backends", drv, mods, sl_test_bin()), 0);
  fprintf(stderr, "%s", out);
  char *r = row(out, "level_zero");
  if (strncmp(r, "level_zero yes 2 ", 17) != 0 || !strstr(r, " level_zero:0 ") || !strstr(r, "PCI 0000:3a:00.0;"))
    fail_msg("row '%s': expected level_zero running on device 0 (PCI 0000:3a:00.0)", r);
  free(r);
  const char *first = strstr(out, "\nlevel_zero ") + 1;
  size_t column = (size_t)(strstr(first, "level_zero:0 ") - first); /* the device column */
  for (int i = 1; i < 3; i++) {
    char *l = line_after(out, "level_zero", i - 1), ord[32], pci[32];
    assert_non_null(l);
    snprintf(ord, sizeof ord, "level_zero:%d ", i);
    snprintf(pci, sizeof pci, "PCI 0000:%02x:00.0;", 0x3a + i);
    if (strspn(l, " ") != column || strncmp(l + column, ord, strlen(ord)) != 0 || !strstr(l, pci))
      fail_msg("row %d under level_zero: '%s', expected '%s...%s' at column %zu", i, l, ord, pci, column);
    free(l);
  }
  char *after = line_after(out, "level_zero", 2); /* the table goes on with the next module */
  assert_true(after && after[0] != ' ');
  free(after);
  assert_null(strstr(out, " \n"));
  char *cpu = line_after(out, "cpu", 0); /* one device: the next row is the next module's */
  assert_true(!strncmp(cpu, "sim ", 4));
  free(cpu);
  free(out);
  assert_int_equal(sl_test_run(&out, "env ZE_ENABLE_ALT_DRIVERS='%s' ZEDRV_DEVICES=3 ZEDRV_MISUSE=abort "
                               "SHARDLOAD_MODULE_PATH='%s' '%s' backends --json", drv, mods, sl_test_bin()), 0);
  json_t *root = parse(out);
  check_entries(root, "backends");
  json_t *ze = entry(root, "backends", "level_zero"), *devs = json_object_get(ze, "devices");
  assert_string_equal(str(ze, "state"), "runs");
  assert_int_equal(json_array_size(devs), 3);
  assert_int_equal(json_integer_value(json_object_get(ze, "devices_not_listed")), 0);
  assert_string_equal(str(ze, "device"), json_string_value(json_array_get(devs, 0)));
  for (int i = 0; i < 3; i++) {
    const char *d = json_string_value(json_array_get(devs, i));
    char ord[32], pci[32];
    snprintf(ord, sizeof ord, "level_zero:%d ", i);
    snprintf(pci, sizeof pci, "PCI 0000:%02x:00.0;", 0x3a + i);
    if (!d || strncmp(d, ord, strlen(ord)) != 0 || !strstr(d, pci))
      fail_msg("devices[%d]: '%s', expected '%s...%s'", i, d ? d : "(not a string)", ord, pci);
  }
  const char *one[] = {"cpu", "sim"};
  for (int i = 0; i < 2; i++) {
    json_t *b = entry(root, "backends", one[i]);
    assert_int_equal(json_array_size(json_object_get(b, "devices")), 1);
    assert_string_equal(json_string_value(json_array_get(json_object_get(b, "devices"), 0)), str(b, "device"));
  }
  assert_int_equal(json_array_size(json_object_get(entry(root, "backends", "cuda"), "devices")), 0);
  json_decref(root);
  free(out);
}

/* More devices than the listing describes: the first SL_MODULE_DEVICES_MAX, a row each, the one
 * that will not start with why, then how many were left out; the same in JSON. */
static void test_backends_many_devices(void **state) {
  char *dir = sl_test_dir("many"), *out = NULL;
  plant(dir, "manydev", "manydev");
  assert_int_equal(run_backends(&out, dir, ""), 0);
  assert_row(out, "manydev", "manydev yes 2 ");
  char *l = line_after(out, "manydev", 0);
  assert_non_null(strstr(l, "  manydev:1 (test device)"));
  free(l);
  l = line_after(out, "manydev", 1);
  assert_non_null(strstr(l, "  manydev:2: cannot start: manydev:2: this device does not start (test module)"));
  free(l);
  l = line_after(out, "manydev", SL_MODULE_DEVICES_MAX - 2);
  assert_non_null(strstr(l, "  manydev:63 (test device)"));
  free(l);
  l = line_after(out, "manydev", SL_MODULE_DEVICES_MAX - 1);
  assert_non_null(strstr(l, "  (6 more devices not listed: at most 64 are)"));
  free(l);
  free(out);
  assert_int_equal(run_backends(&out, dir, "--json"), 0);
  json_t *root = parse(out);
  json_t *m = entry(root, "backends", "manydev");
  assert_int_equal(json_array_size(json_object_get(m, "devices")), SL_MODULE_DEVICES_MAX);
  assert_int_equal(json_integer_value(json_object_get(m, "devices_not_listed")), 70 - SL_MODULE_DEVICES_MAX);
  assert_string_equal(str(m, "device"), "manydev:0 (test device)");
  assert_non_null(strstr(json_string_value(json_array_get(json_object_get(m, "devices"), 2)), "cannot start"));
  json_decref(root);
  free(out);
  free(dir);
}

/* Broken and foreign files on the path, a directory that does not exist, a FIFO: all listed
 * with what is wrong, the exit status still 0; an installed backend is found and auto takes
 * it when it probes best. */
static void test_backends_exit_0_whatever_is_missing(void **state) {
  char *dir = sl_test_dir("missing"), *fifo = sl_test_path(dir, "libshardload-afifo.so");
  char *junk = sl_test_path(dir, "libshardload-junk.so"), path[8300];
  plant(dir, "badabi", "badabi");
  plant(dir, "probeno", "probeno");
  plant(dir, "zvendor", "zvendor");
  plant(dir, "plant", "plant");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(sl_test_write_bytes(junk, "junk", 4), 0);
  snprintf(path, sizeof path, "%s/nosuchdir:%s", dir, dir);
  char *out = NULL;
  assert_int_equal(run_backends(&out, path, ""), 0);
  fprintf(stderr, "%s", out);
  assert_non_null(strstr(out, "\nbadabi      refused"));
  assert_non_null(strstr(out, "\nprobeno     no "));
  assert_non_null(strstr(out, "probeno: no widget on this machine"));
  assert_non_null(strstr(out, "\nafifo       cannot load"));
  assert_non_null(strstr(out, "is not a regular file: not opened"));
  assert_non_null(strstr(out, "\njunk        "));
  assert_non_null(strstr(out, "\n  backend                     zvendor (zvendor: auto"));
  free(out);
  assert_int_equal(run_backends(&out, path, "--json"), 0);
  json_t *root = parse(out);
  check_entries(root, "backends");
  check_entries(root, "collectives");
  assert_string_equal(str(entry(root, "backends", "badabi"), "state"), "bad_abi");
  assert_string_equal(str(entry(root, "backends", "afifo"), "state"), "unloadable");
  assert_string_equal(str(entry(root, "backends", "zvendor"), "state"), "runs");
  assert_int_equal(json_integer_value(json_object_get(entry(root, "backends", "zvendor"), "probe")), 5);
  assert_null(entry(root, "backends", "plant")); /* a collective module, listed as one */
  assert_string_equal(str(entry(root, "collectives", "plant"), "state"), "runs");
  assert_string_equal(str(json_object_get(json_object_get(root, "auto"), "backend"), "name"), "zvendor");
  json_decref(root);
  free(out);
  free(junk);
  free(fifo);
  free(dir);
}

/* What a module writes (its table's name, its probe's reason, describe()) is printed escaped: no
 * line of the table or of the JSON is one the module forged, and the JSON stays valid. A path
 * that is not UTF-8 is kept in JSON (U+FFFD and the exact bytes in hex). */
static void test_backends_escape_module_text(void **state) {
  char *base = sl_test_dir("forged"), dir[4200];
  snprintf(dir, sizeof dir, "%s/not-utf8-\xff", base);
  assert_int_equal(mkdir(dir, 0700), 0);
  plant(dir, "forgedtext", "forgedtext");
  plant(dir, "forgedname", "forgedname");
  plant(dir, "cuda", "fakecuda"); /* says no, with a forged line in its reason */
  char *out = NULL;
  assert_int_equal(run_backends(&out, dir, ""), 0);
  fprintf(stderr, "%s", out);
  assert_null(strstr(out, "\nshardload: forged line"));
  assert_null(strstr(out, "\x1b"));
  assert_non_null(strstr(out, "forgedtext (out-of-tree host-memory backend, ABI v2 entry)\\nshardload: forged line"
                              "\\x1b[2J\\xff"));
  /* a path is printed as the command prints paths (control characters escaped), the module's
   * message about it as module text (every byte past ASCII escaped too) */
  assert_non_null(strstr(out, "not-utf8-\xff/libshardload-forgedtext.so  forgedtext"));
  assert_non_null(
      strstr(out, "not-utf8-\\xff/libshardload-forgedname.so: its table calls itself 'forgedname\\nshardload"));
  free(out);
  assert_int_equal(run_backends(&out, dir, "--json"), 0);
  json_t *root = parse(out);
  json_t *ft = entry(root, "backends", "forgedtext");
  assert_non_null(ft);
  assert_null(strchr(str(ft, "device"), '\n'));
  assert_non_null(strstr(str(ft, "device"), "\\nshardload: forged line"));
  assert_non_null(strstr(str(ft, "path"), "not-utf8-\xef\xbf\xbd/"));
  assert_non_null(str(ft, "path_bytes_hex"));
  json_t *fc = entry(root, "backends", "cuda");
  assert_string_equal(str(fc, "state"), "cannot_run");
  assert_null(strchr(str(fc, "reason"), '\n'));
  json_decref(root);
  free(out);
  free(base);
}

/* A report that cannot be written ends the command with exit status 1 and says why; a usage
 * mistake is exit status 2. */
static void test_backends_output_and_usage(void **state) {
  char *out = NULL;
  const char *modes[] = {"", "--json"};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(sl_test_run(&out, "('%s' backends %s >/dev/full)", sl_test_bin(), modes[i]), 1);
    assert_non_null(strstr(out, "shardload: backends: SL_ERR_IO: cannot write the"));
    assert_non_null(strstr(out, "to stdout: No space left on device"));
    free(out);
  }
  assert_int_equal(sl_test_run(&out, "'%s' backends extra", sl_test_bin()), 2);
  assert_non_null(strstr(out, "shardload: extra: SL_ERR_INVALID: takes no argument"));
  free(out);
  assert_int_equal(sl_test_run(&out, "'%s' backends --nosuch", sl_test_bin()), 2);
  assert_non_null(strstr(out, "unknown option for 'backends'"));
  free(out);
  assert_int_equal(sl_test_run(&out, "'%s' backends --help", sl_test_bin()), 0);
  assert_true(!strncmp(out, "usage: shardload backends [--json]\n", 35));
  free(out);
  assert_int_equal(sl_test_run(&out, "'%s' --help", sl_test_bin()), 0);
  assert_non_null(strstr(out, "\n  backends           "));
  free(out);
}

int main(void) {
  moddir = getenv("SHARDLOAD_TEST_MODULES");
  if (!moddir || !*moddir) {
    fprintf(stderr, "test_cli_backends: set SHARDLOAD_TEST_MODULES to the test modules' directory (CTest does)\n");
    return 2;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backends_here),
      cmocka_unit_test(test_backends_level_zero_devices),
      cmocka_unit_test(test_backends_many_devices),
      cmocka_unit_test(test_backends_exit_0_whatever_is_missing),
      cmocka_unit_test(test_backends_escape_module_text),
      cmocka_unit_test(test_backends_output_and_usage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
