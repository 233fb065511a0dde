/* Installed module files, found without loading them (module_scan.h; docs/DESIGN.md#modules):
 * the search directories, the libshardload-NAME.so files in them, and the entry symbols a file
 * defines, read from its ELF dynamic symbol table. Backend "auto" uses this to consider every
 * installed backend while never opening a collective module (its constructors, the vendor
 * libraries it links) as a candidate backend, and never handing dlopen a FIFO that would block
 * it. The reader trusts nothing in the file: every offset and size is checked against the file
 * and against bounds of its own before it is used. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "module_scan.h"

/* ---- the search directories --------------------------------------------------------------- */

static sl_status dirs_add(sl__module_dirs *d, const char *dir) {
  char **grown = realloc(d->dir, (d->count + 1) * sizeof *grown);
  if (!grown) return SL_ERR_NOMEM;
  d->dir = grown;
  if (!(d->dir[d->count] = sl__strdup(dir))) return SL_ERR_NOMEM;
  d->count++;
  return SL_OK;
}

sl_status sl__module_dirs_get(sl__module_dirs *d) {
  *d = (sl__module_dirs){0};
  const char *env = getenv("SHARDLOAD_MODULE_PATH");
  char *dirs = sl__strdup(env ? env : "");
  if (!dirs) return SL_ERR_NOMEM;
  sl_status st = SL_OK;
  char *save = NULL;
  /* as registry.c's open_module splits it: empty entries skipped, the others used as given */
  for (char *dir = strtok_r(dirs, ":", &save); dir && st == SL_OK; dir = strtok_r(NULL, ":", &save))
    st = dirs_add(d, dir);
  free(dirs);
  const char *lib = sl__module_library_dir();
  if (st == SL_OK && lib[0]) st = dirs_add(d, lib);
  if (st != SL_OK) sl__module_dirs_free(d);
  return st;
}

void sl__module_dirs_free(sl__module_dirs *d) {
  for (size_t i = 0; i < d->count; i++) free(d->dir[i]);
  free(d->dir);
  *d = (sl__module_dirs){0};
}

/* ---- the files in them -------------------------------------------------------------------- */

#define PREFIX "libshardload-"
#define SUFFIX ".so"

/* NAME of libshardload-NAME.so into OUT when FILE is one with a module name, else false. */
static bool module_file_name(const char *file, char *out) {
  size_t n = strlen(file), p = sizeof PREFIX - 1, s = sizeof SUFFIX - 1;
  if (n <= p + s || strncmp(file, PREFIX, p) != 0 || strcmp(file + n - s, SUFFIX) != 0) return false;
  size_t k = n - p - s;
  if (k > SL__MODULE_NAME_MAX) return false;
  memcpy(out, file + p, k);
  out[k] = 0;
  return sl__module_name_ok(out);
}

static bool skipped(const char *name, const char *const *skip, size_t nskip) {
  for (size_t i = 0; i < nskip; i++)
    if (strcmp(name, skip[i]) == 0) return true;
  return false;
}

/* Keeps the CAP smallest names in S->files, sorted; a name already kept came from an earlier
 * directory (or was listed twice) and wins. Counts what falls past the cap in S->more. */
static sl_status keep(sl__module_files *s, size_t cap, const char *name, const char *dir) {
  size_t lo = 0, hi = s->count;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(s->files[mid].name, name);
    if (c == 0) return SL_OK;
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  if (lo >= cap) { /* past every kept name, and the list is full */
    s->more++;
    return SL_OK;
  }
  size_t plen = strlen(dir) + sizeof PREFIX + SL__MODULE_NAME_MAX + sizeof SUFFIX + 1;
  char *path = malloc(plen);
  if (!path) return SL_ERR_NOMEM;
  snprintf(path, plen, "%s/" PREFIX "%s" SUFFIX, dir, name);
  if (s->count == cap) { /* the largest kept name drops out */
    free(s->files[cap - 1].path);
    s->count--;
    s->more++;
  }
  memmove(&s->files[lo + 1], &s->files[lo], (s->count - lo) * sizeof *s->files);
  snprintf(s->files[lo].name, sizeof s->files[lo].name, "%s", name);
  s->files[lo].path = path;
  s->count++;
  return SL_OK;
}

static sl_status scan_dir(sl__module_files *s, size_t cap, const char *dir, const char *const *skip, size_t nskip) {
  DIR *d = opendir(dir);
  if (!d) return SL_OK; /* as opening by name: a directory that cannot be read holds nothing */
  sl_status st = SL_OK;
  unsigned seen = 0;
  struct dirent *e;
  char name[SL__MODULE_NAME_MAX + 1];
  while (st == SL_OK && (e = readdir(d)) != NULL) {
    if (++seen > SL__SCAN_MAX_ENTRIES) {
      if (!s->cut_dirs++ && !(s->first_cut = sl__strdup(dir))) st = SL_ERR_NOMEM;
      break;
    }
    if (module_file_name(e->d_name, name) && !skipped(name, skip, nskip)) st = keep(s, cap, name, dir);
  }
  closedir(d);
  return st;
}

sl_status sl__module_scan(const char *const *skip, size_t nskip, size_t cap, sl__module_files *out) {
  *out = (sl__module_files){0};
  sl__module_dirs dirs;
  if (sl__module_dirs_get(&dirs) != SL_OK) return SL_ERR_NOMEM;
  sl_status st = SL_OK;
  if (cap && !(out->files = calloc(cap, sizeof *out->files))) st = SL_ERR_NOMEM;
  for (size_t i = 0; i < dirs.count && st == SL_OK && cap; i++) st = scan_dir(out, cap, dirs.dir[i], skip, nskip);
  sl__module_dirs_free(&dirs);
  if (st != SL_OK) sl__module_scan_free(out);
  return st;
}

void sl__module_scan_free(sl__module_files *s) {
  for (size_t i = 0; i < s->count; i++) free(s->files[i].path);
  free(s->files);
  free(s->first_cut);
  *s = (sl__module_files){0};
}

char *sl__module_locate(const char *name) {
  sl__module_dirs dirs;
  if (!sl__module_name_ok(name) || sl__module_dirs_get(&dirs) != SL_OK) return NULL;
  char *found = NULL;
  for (size_t i = 0; i < dirs.count && !found; i++) {
    size_t plen = strlen(dirs.dir[i]) + sizeof PREFIX + strlen(name) + sizeof SUFFIX + 1;
    char *path = malloc(plen);
    if (!path) break;
    snprintf(path, plen, "%s/" PREFIX "%s" SUFFIX, dirs.dir[i], name);
    if (access(path, F_OK) == 0) found = path; /* the first that exists, as open_module takes it */
    else free(path);
  }
  sl__module_dirs_free(&dirs);
  return found;
}

/* ---- the entry symbols a file defines ----------------------------------------------------- */

/* Bounds of the reader: a module's tables are kilobytes; a file past these is not read (only
 * loading it could tell what it is). */
#define ELF_MAX_SECTIONS 4096u
#define ELF_MAX_TABLE (16u << 20)

#if __SIZEOF_POINTER__ == 8
#define ELF_CLASS_HERE ELFCLASS64
#else
#define ELF_CLASS_HERE ELFCLASS32
#endif
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ELF_DATA_HERE ELFDATA2LSB
#else
#define ELF_DATA_HERE ELFDATA2MSB
#endif

/* LEN bytes at OFF of a file of SIZE bytes, malloc'd; NULL when they are not all in the file,
 * past the bounds, or cannot be read (WHY says which). */
static void *read_span(int fd, uint64_t size, uint64_t off, uint64_t len, const char *what, char *why, size_t wlen) {
  if (len == 0 || len > ELF_MAX_TABLE || off > size || len > size - off) {
    snprintf(why, wlen, "its %s (%llu bytes at %llu) is not within the file's %llu bytes or past %u MiB", what,
             (unsigned long long)len, (unsigned long long)off, (unsigned long long)size, ELF_MAX_TABLE >> 20);
    return NULL;
  }
  void *buf = malloc((size_t)len);
  if (!buf) {
    snprintf(why, wlen, "out of memory reading its %s", what);
    return NULL;
  }
  ssize_t got = sl__pread_full(fd, buf, (size_t)len, off);
  if (got != (ssize_t)len) {
    snprintf(why, wlen, "cannot read its %s: %s", what, got < 0 ? strerror(errno) : "the file is shorter");
    free(buf);
    return NULL;
  }
  return buf;
}

/* The entry bits of the symbols SYMS (N of them) define, names in STR (STRSZ bytes). */
static unsigned entry_bits(const ElfW(Sym) *syms, size_t n, const char *str, size_t strsz) {
  static const struct {
    const char *name;
    unsigned bit;
  } entries[] = {
      {SL_BACKEND_ENTRY, SL__ENTRY_BACKEND_V2},
      {SL_BACKEND_ENTRY_V1, SL__ENTRY_BACKEND_V1},
      {SL_COLLECTIVE_ENTRY, SL__ENTRY_COLLECTIVE_V2},
      {SL_COLLECTIVE_ENTRY_V1, SL__ENTRY_COLLECTIVE_V1},
  };
  unsigned bits = 0;
  for (size_t i = 0; i < n; i++) {
    const ElfW(Sym) *s = &syms[i];
    unsigned bind = ELF64_ST_BIND(s->st_info); /* ELF32_ST_BIND is the same shift */
    if (s->st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK) || s->st_name >= strsz) continue;
    const char *name = str + s->st_name;
    size_t room = strsz - s->st_name; /* the name must end inside the table */
    for (size_t k = 0; k < sizeof entries / sizeof entries[0]; k++) {
      size_t elen = strlen(entries[k].name);
      if (room > elen && memcmp(name, entries[k].name, elen + 1) == 0) bits |= entries[k].bit;
    }
  }
  return bits;
}

/* The dynamic symbol table through the section headers: SHT_DYNSYM and the string table it
 * links. Returns the entry bits, or SL__ENTRY_UNKNOWN with WHY. */
static unsigned elf_entries(int fd, uint64_t size, char *why, size_t wlen) {
  ElfW(Ehdr) eh;
  if (sl__pread_full(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
    snprintf(why, wlen, "not an ELF file");
    return SL__ENTRY_UNKNOWN;
  }
  if (eh.e_ident[EI_CLASS] != ELF_CLASS_HERE || eh.e_ident[EI_DATA] != ELF_DATA_HERE || eh.e_type != ET_DYN) {
    snprintf(why, wlen, "not a shared object of this machine's ELF class and byte order");
    return SL__ENTRY_UNKNOWN;
  }
  if (eh.e_shnum == 0 || eh.e_shnum > ELF_MAX_SECTIONS || eh.e_shentsize != sizeof(ElfW(Shdr))) {
    snprintf(why, wlen, "its section headers cannot be read (%u of %u bytes)", (unsigned)eh.e_shnum,
             (unsigned)eh.e_shentsize);
    return SL__ENTRY_UNKNOWN;
  }
  unsigned bits = SL__ENTRY_UNKNOWN;
  ElfW(Shdr) *sh = read_span(fd, size, eh.e_shoff, (uint64_t)eh.e_shnum * sizeof *sh, "section headers", why, wlen);
  if (!sh) return bits;
  size_t i = 0;
  while (i < eh.e_shnum && sh[i].sh_type != SHT_DYNSYM) i++;
  if (i == eh.e_shnum) {
    snprintf(why, wlen, "it has no dynamic symbol table");
    goto out_sections;
  }
  const ElfW(Shdr) *sym = &sh[i];
  if (sym->sh_entsize != sizeof(ElfW(Sym)) || sym->sh_size % sizeof(ElfW(Sym)) != 0 || sym->sh_link >= eh.e_shnum ||
      sh[sym->sh_link].sh_type != SHT_STRTAB) {
    snprintf(why, wlen, "its dynamic symbol table is malformed");
    goto out_sections;
  }
  const ElfW(Shdr) *str = &sh[sym->sh_link];
  ElfW(Sym) *syms = read_span(fd, size, sym->sh_offset, sym->sh_size, "dynamic symbol table", why, wlen);
  char *strs = syms ? read_span(fd, size, str->sh_offset, str->sh_size, "dynamic string table", why, wlen) : NULL;
  if (strs) bits = entry_bits(syms, (size_t)(sym->sh_size / sizeof *syms), strs, (size_t)str->sh_size);
  free(strs);
  free(syms);
out_sections:
  free(sh);
  return bits;
}

unsigned sl__module_entries(const char *path, char *why, size_t len) {
  why[0] = 0;
  /* O_NONBLOCK: opening a FIFO for reading must not wait for a writer */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    snprintf(why, len, "cannot be read (%s)", strerror(errno));
    return SL__ENTRY_NOT_A_FILE;
  }
  struct stat st;
  unsigned bits;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(why, len, "is not a regular file");
    bits = SL__ENTRY_NOT_A_FILE;
  } else {
    bits = elf_entries(fd, (uint64_t)st.st_size, why, len);
  }
  close(fd);
  return bits;
}
