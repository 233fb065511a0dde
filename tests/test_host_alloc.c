/* The host allocator of the cpu and sim backends (core/src/hostops.c:sl__host_alloc): blocks
 * 64-byte aligned and whole; large ones mapped on their own, populated, 2 MiB aligned, advised
 * for transparent huge pages and holding them where the kernel owes them, with a mapping no larger
 * than the block rounded to pages (the resident set is the block's, not a huge page's
 * multiple). Read back from /proc/self/smaps, the kernel's own account of the mapping. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "internal.h"

#define MIB (1024u * 1024u)
#define HDR 64u /* hostops.c's header before every block */

typedef struct mapping {
  uintptr_t start, end;
  long rss_kb, huge_kb;
  int advised;  /* VmFlags has "hg" (MADV_HUGEPAGE) */
  int eligible; /* THPeligible: 1, the kernel's word that this process may have huge pages here */
} mapping;

/* The mapping of /proc/self/smaps that holds ADDR; 0 when none does. */
static int find_mapping(uintptr_t addr, mapping *m) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return 0;
  char line[512];
  int found = 0, in = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long a, b;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &a, &b, perms) == 3 && strchr(line, '-') < strchr(line, ' ')) {
      if (found) break;
      in = addr >= a && addr < b;
      if (in) *m = (mapping){a, b, 0, 0, 0, 0}, found = 1;
      continue;
    }
    if (!in) continue;
    if (strncmp(line, "Rss:", 4) == 0) m->rss_kb = atol(line + 4);
    if (strncmp(line, "AnonHugePages:", 14) == 0) m->huge_kb = atol(line + 14);
    if (strncmp(line, "THPeligible:", 12) == 0) m->eligible = atol(line + 12) == 1;
    if (strncmp(line, "VmFlags:", 8) == 0) m->advised = strstr(line, " hg") != NULL;
  }
  fclose(f);
  return found;
}

/* The bracketed choice of a /sys/kernel/mm/transparent_hugepage file into BUF; "" without one
 * (a kernel built without THP). */
static const char *thp_mode(const char *file, char *buf, size_t len) {
  char path[256], line[256] = "";
  snprintf(path, sizeof path, "/sys/kernel/mm/transparent_hugepage/%s", file);
  FILE *f = fopen(path, "r");
  buf[0] = 0;
  if (!f) return buf;
  if (!fgets(line, sizeof line, f)) line[0] = 0;
  fclose(f);
  const char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
  if (a && b && (size_t)(b - a) < len) memcpy(buf, a + 1, (size_t)(b - a - 1)), buf[b - a - 1] = 0;
  return buf;
}

/* Whether a populated, advised, aligned block must hold huge pages: the kernel builds THP, gives
 * them on request ("always" or "madvise"), compacts memory for an advised fault rather than
 * falling back at once (defrag "always", "madvise" or "defer+madvise"; "defer" and "never" give
 * small pages whenever no huge page is free), says this mapping is eligible (THPeligible: not
 * under PR_SET_THP_DISABLE, say), and its huge pages are 2 MiB. Anything else gives small pages
 * to the same calls, as hostops.c says, and that is no failure of the allocator. */
static int huge_pages_due(const mapping *m) {
  char en[32], df[32];
  thp_mode("enabled", en, sizeof en);
  thp_mode("defrag", df, sizeof df);
  /* not 32 or 512 MiB, as with 16 or 64 KiB pages */
  long pmd = 0;
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r");
  if (f && fscanf(f, "%ld", &pmd) != 1) pmd = 0;
  if (f) fclose(f);
  return pmd == 2 * MIB && m->eligible && (!strcmp(en, "always") || !strcmp(en, "madvise")) &&
         (!strcmp(df, "always") || !strcmp(df, "madvise") || !strcmp(df, "defer+madvise"));
}

static void test_blocks_are_aligned_whole_and_writable(void **state) {
  const size_t sizes[] = {0, 1, 63, 4096, MIB - HDR - 1, MIB - HDR, MIB, 2 * MIB - HDR - 1, 2 * MIB - HDR,
                          2 * MIB, 2 * MIB + 4095, 5 * MIB + 7, 37 * MIB + 5};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    unsigned char *p = sl__host_alloc(sizes[i]);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    memset(p, 0xA5, sizes[i]);
    for (size_t k = 0; k < sizes[i]; k += 4093) assert_int_equal(p[k], 0xA5);
    if (sizes[i]) assert_int_equal(p[sizes[i] - 1], 0xA5);
    sl__host_free(p);
  }
  sl__host_free(NULL);
}

/* A block of at least one huge page is a mapping of its own: it starts 2 MiB aligned at the
 * header, ends at the block rounded up to a page, is resident when returned (populated, before
 * any write of the caller's), and holds huge pages where the kernel gives them on request. */
static void test_large_blocks_are_populated_huge_mappings(void **state) {
  const size_t sizes[] = {2 * MIB - HDR, 2 * MIB + 4095, 5 * MIB + 7, 37 * MIB + 5};
  long page = sysconf(_SC_PAGESIZE);
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    unsigned char *p = sl__host_alloc(sizes[i]);
    assert_non_null(p);
    mapping m = {0};
    if (!find_mapping((uintptr_t)p, &m)) fail_msg("no mapping in /proc/self/smaps holds the block at %p", (void *)p);
    size_t want = (sizes[i] + HDR + (size_t)page - 1) / (size_t)page * (size_t)page;
    if (m.start != (uintptr_t)p - HDR || m.start % (2 * MIB) != 0 || m.end - m.start < want)
      fail_msg("a %zu-byte block: mapping %#lx-%#lx, want one of its own from %#lx (2 MiB aligned), %zu bytes",
               sizes[i], (unsigned long)m.start, (unsigned long)m.end, (unsigned long)((uintptr_t)p - HDR), want);
    /* a neighbouring mapping may merge with it (same flags); never more than the block in it */
    if (m.end - m.start == want && (size_t)m.rss_kb * 1024 > want)
      fail_msg("a %zu-byte block is %ld KiB resident: more than its %zu-byte mapping", sizes[i], m.rss_kb, want);
    if (m.end - m.start == want && (size_t)m.rss_kb * 1024 < want)
      fail_msg("a %zu-byte block is %ld KiB resident of %zu bytes on return: it was not populated", sizes[i],
               m.rss_kb, want);
    char en[32];
    if (thp_mode("enabled", en, sizeof en)[0] && !m.advised)
      fail_msg("a %zu-byte block is not advised for huge pages (no \"hg\" in its VmFlags)", sizes[i]);
    if (huge_pages_due(&m) && sizes[i] >= 5 * MIB && m.huge_kb < 2048)
      fail_msg("a %zu-byte block holds %ld KiB of huge pages where the kernel gives them on request and compacts "
               "for them: it was not advised, or not aligned",
               sizes[i], m.huge_kb);
    sl__host_free(p);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blocks_are_aligned_whole_and_writable),
      cmocka_unit_test(test_large_blocks_are_populated_huge_mappings),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
