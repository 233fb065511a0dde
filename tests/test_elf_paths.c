/* No binary the project builds searches the working directory (or any relative directory)
 * for its libraries. argv[1]: the build tree; argv[2]: the planted stand-in for
 * libjansson.so.4 (tests/plant/). Every ELF executable and shared object under the build tree
 * (the command, the library, the loadable modules, test modules, tests, benchmarks, examples,
 * and in the cuda preset the CUDA and NCCL modules) has only absolute or $ORIGIN-relative
 * DT_RUNPATH/DT_RPATH entries: an empty entry (a leading, trailing or doubled ':') is the
 * current directory to the dynamic loader, and "." or "lib" resolve against it. The ELF
 * headers are read here rather than through readelf, so the check depends on no tool's output
 * format. Then the behaviour itself: the build-tree `shardload --help`, run from a directory
 * that holds a planted libjansson.so.4, does not load it. */
#define _GNU_SOURCE /* nftw's FTW_ACTIONRETVAL */
#include <elf.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static const char *build_dir, *plant_lib;

/* Why ENTRY (one ':'-separated element of a run path) could name a directory that depends on
 * the working directory; NULL when it cannot. */
static const char *sl__relative_entry(const char *entry, size_t len) {
  if (len == 0) return "an empty entry is the current directory";
  if (entry[0] == '/') return NULL;
  static const char *const origin[] = {"$ORIGIN", "${ORIGIN}"};
  for (size_t i = 0; i < 2; i++) {
    size_t n = strlen(origin[i]);
    if (len >= n && memcmp(entry, origin[i], n) == 0 && (len == n || entry[n] == '/')) return NULL;
  }
  return "a relative entry resolves against the current directory";
}

/* Counts the bad entries of run path PATH (the DT_ tag's name in WHAT) of FILE, printing each. */
static int sl__check_run_path(const char *file, const char *what, const char *path) {
  int bad = 0;
  for (const char *p = path;;) {
    const char *end = strchr(p, ':');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *why = sl__relative_entry(p, len);
    if (why) {
      fprintf(stderr, "%s: %s \"%s\": entry \"%.*s\": %s\n", file, what, path, (int)len, p, why);
      bad++;
    }
    if (!end) break;
    p = end + 1;
  }
  return bad;
}

static int elf_files, bad_entries, saw_cli, saw_lib;

/* The run paths of the ELF image MAP (SIZE bytes) named FILE; skips what is not an
 * executable or a shared object (object files, archives, scripts). */
static void sl__check_elf(const char *file, const unsigned char *map, size_t size) {
  if (size < sizeof(Elf64_Ehdr) || memcmp(map, ELFMAG, SELFMAG) != 0) return;
  const Elf64_Ehdr *eh = (const Elf64_Ehdr *)map;
  if (eh->e_type != ET_EXEC && eh->e_type != ET_DYN) return;
  if (map[EI_CLASS] != ELFCLASS64 || eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shoff > size ||
      (size - eh->e_shoff) / sizeof(Elf64_Shdr) < eh->e_shnum) {
    fprintf(stderr, "%s: not a well-formed 64-bit ELF file; its run path cannot be checked\n", file);
    bad_entries++;
    return;
  }
  elf_files++;
  const Elf64_Shdr *sh = (const Elf64_Shdr *)(map + eh->e_shoff);
  for (unsigned i = 0; i < eh->e_shnum; i++) {
    if (sh[i].sh_type != SHT_DYNAMIC) continue;
    const Elf64_Shdr *str = sh[i].sh_link < eh->e_shnum ? &sh[sh[i].sh_link] : NULL;
    if (!str || sh[i].sh_offset > size || sh[i].sh_size > size - sh[i].sh_offset || str->sh_offset > size ||
        str->sh_size > size - str->sh_offset) {
      fprintf(stderr, "%s: the dynamic section or its string table lies outside the file\n", file);
      bad_entries++;
      return;
    }
    const Elf64_Dyn *dyn = (const Elf64_Dyn *)(map + sh[i].sh_offset);
    size_t n = sh[i].sh_size / sizeof *dyn;
    for (size_t d = 0; d < n && dyn[d].d_tag != DT_NULL; d++) {
      if (dyn[d].d_tag != DT_RUNPATH && dyn[d].d_tag != DT_RPATH) continue;
      const char *strtab = (const char *)(map + str->sh_offset);
      if (dyn[d].d_un.d_val >= str->sh_size || !memchr(strtab + dyn[d].d_un.d_val, '\0', str->sh_size - dyn[d].d_un.d_val)) {
        fprintf(stderr, "%s: run path string outside the string table\n", file);
        bad_entries++;
        continue;
      }
      bad_entries += sl__check_run_path(file, dyn[d].d_tag == DT_RUNPATH ? "RUNPATH" : "RPATH", strtab + dyn[d].d_un.d_val);
    }
  }
}

static int sl__visit(const char *file, const struct stat *st, int type, struct FTW *ftw) {
  if (type == FTW_D) {
    /* CMake's compiler probes and the tests' scratch files are not what the project builds */
    const char *base = file + ftw->base;
    return strcmp(base, "CMakeFiles") == 0 || strcmp(base, "test-tmp") == 0 ? FTW_SKIP_SUBTREE : FTW_CONTINUE;
  }
  if (type != FTW_F || !S_ISREG(st->st_mode) || st->st_size < (off_t)sizeof(Elf64_Ehdr)) return FTW_CONTINUE;
  int fd = open(file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FTW_CONTINUE;
  void *map = mmap(NULL, (size_t)st->st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return FTW_CONTINUE;
  int before = elf_files;
  sl__check_elf(file, map, (size_t)st->st_size);
  munmap(map, (size_t)st->st_size);
  if (elf_files > before) {
    const char *base = file + ftw->base;
    char real[PATH_MAX], cli[PATH_MAX];
    if (realpath(file, real) && realpath(sl_test_bin(), cli) && strcmp(real, cli) == 0) saw_cli = 1;
    if (strncmp(base, "libshardload.so", 15) == 0) saw_lib = 1;
  }
  return FTW_CONTINUE;
}

static void test_entry_classifier(void **state) {
  static const char *const bad[] = {"", ".", "./lib", "lib", "..", "$ORIGINAL", "$LIB", "${ORIGIN"};
  static const char *const good[] = {"/usr/lib", "/", "$ORIGIN", "$ORIGIN/../lib", "${ORIGIN}", "${ORIGIN}/lib"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) assert_non_null(sl__relative_entry(bad[i], strlen(bad[i])));
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) assert_null(sl__relative_entry(good[i], strlen(good[i])));
  /* the empty entries a ':' makes, wherever it stands */
  assert_int_equal(sl__check_run_path("t", "RUNPATH", "/a:"), 1);
  assert_int_equal(sl__check_run_path("t", "RUNPATH", ":/a"), 1);
  assert_int_equal(sl__check_run_path("t", "RUNPATH", "/a::/b"), 1);
  assert_int_equal(sl__check_run_path("t", "RUNPATH", "/a:$ORIGIN/../lib"), 0);
}

static void test_no_built_elf_searches_the_working_directory(void **state) {
  elf_files = bad_entries = saw_cli = saw_lib = 0;
  assert_int_equal(nftw(build_dir, sl__visit, 32, FTW_PHYS | FTW_ACTIONRETVAL), 0);
  fprintf(stderr, "%d ELF executables and shared objects checked under %s\n", elf_files, build_dir);
  /* the walk reached what matters: not a check of an empty directory */
  assert_true(saw_cli);
  assert_true(saw_lib);
  assert_true(elf_files >= 10);
  assert_int_equal(bad_entries, 0);
}

/* The planted libjansson.so.4 in the directory `shardload --help` runs from is not loaded.
 * A control run puts that directory on LD_LIBRARY_PATH first, so the test knows the plant
 * would be noticed if the loader ever picked it. */
static void test_planted_library_in_working_directory_is_not_loaded(void **state) {
  char *dir = sl_test_dir("plant");
  char *out = NULL;
  int rc = sl_test_run(&out, "cp '%s' '%s/libjansson.so.4'", plant_lib, dir);
  assert_int_equal(rc, 0);
  free(out);
  char *marker = sl_test_path(dir, "planted-ran");

  rc = sl_test_run(&out, "cd '%s' && LD_LIBRARY_PATH=. '%s' --help", dir, sl_test_bin());
  free(out);
  if (access(marker, F_OK) != 0) fail_msg("control: the planted library did not run even from LD_LIBRARY_PATH (rc %d)", rc);
  assert_int_equal(unlink(marker), 0);

  rc = sl_test_run(&out, "cd '%s' && env -u LD_LIBRARY_PATH '%s' --help", dir, sl_test_bin());
  if (rc != 0) fprintf(stderr, "%s\n", out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "shardload"));
  free(out);
  if (access(marker, F_OK) == 0) fail_msg("%s --help, run from %s, loaded the libjansson.so.4 planted there", sl_test_bin(), dir);
  free(marker);
  free(dir);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: test_elf_paths BUILD_DIR PLANTED_LIBJANSSON\n");
    return 2;
  }
  build_dir = argv[1];
  plant_lib = argv[2];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_entry_classifier),
      cmocka_unit_test(test_no_built_elf_searches_the_working_directory),
      cmocka_unit_test(test_planted_library_in_working_directory_is_not_loaded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
