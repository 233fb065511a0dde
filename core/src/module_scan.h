/* Finding installed module files without loading them (module_scan.c): the directories the
 * registry searches, the libshardload-NAME.so files in them, and which entry symbols a file
 * defines, read from its dynamic symbol table (docs/DESIGN.md#modules, Names and What is opened
 * when). Backend "auto" and the module listing (module_list.c) build on it; the registry opens
 * what they choose. */
#ifndef SHARDLOAD_MODULE_SCAN_H
#define SHARDLOAD_MODULE_SCAN_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#include "internal.h"

#define SL__MODULE_NAME_MAX 32 /* [a-z0-9_]{1,32}: registry.c's rule */
/* Entries read from one directory at most: a directory of a million files costs a bounded
 * listing, and what was not read is said (sl__module_files.cut_dirs). */
#define SL__SCAN_MAX_ENTRIES 100000u

/* The directories searched, in order: each non-empty $SHARDLOAD_MODULE_PATH entry as given,
 * then the library's own directory (registry.c; absent when it could not be resolved). The
 * dynamic loader's own search comes after them for a module asked for by name, but cannot be
 * listed. */
typedef struct sl__module_dirs {
  char **dir;
  size_t count;
} sl__module_dirs;
sl_status sl__module_dirs_get(sl__module_dirs *d); /* SL_ERR_NOMEM, or SL_OK */
void sl__module_dirs_free(sl__module_dirs *d);     /* a zeroed or freed one too */

/* One installed module file: the first DIR/libshardload-NAME.so of its NAME in search order,
 * the one asking for NAME would open. */
typedef struct sl__module_file {
  char name[SL__MODULE_NAME_MAX + 1];
  char *path;
} sl__module_file;

typedef struct sl__module_files {
  sl__module_file *files; /* at most the cap asked for: the first names in name order */
  size_t count;
  size_t more;      /* further matching files, past the cap: not returned */
  size_t cut_dirs;  /* directories whose listing stopped at SL__SCAN_MAX_ENTRIES entries */
  char *first_cut;  /* the first of them, or NULL */
} sl__module_files;

/* Lists the module files in the search directories (sl__module_dirs_get), names SKIP[0..NSKIP)
 * left out, keeping the first CAP distinct names in name order whatever order the directories
 * list them in. A directory that cannot be read is skipped (as opening by name skips it).
 * Opens no file. SL_ERR_NOMEM, or SL_OK; free with sl__module_scan_free. */
sl_status sl__module_scan(const char *const *skip, size_t nskip, size_t cap, sl__module_files *out);
void sl__module_scan_free(sl__module_files *s);

/* The file asking for NAME would open from the search directories (the first that exists), as
 * a malloc'd path; NULL when none holds one (the dynamic loader's search may still find it) or
 * when out of memory. */
char *sl__module_locate(const char *name);

/* What a module file is, from its dynamic symbol table, without loading it (no constructor of
 * it runs, and a file that is not a regular file is never opened for reading more than its
 * type). Bits of the entry symbols it defines: */
enum {
  SL__ENTRY_BACKEND_V2 = 1u << 0,
  SL__ENTRY_BACKEND_V1 = 1u << 1,
  SL__ENTRY_COLLECTIVE_V2 = 1u << 2,
  SL__ENTRY_COLLECTIVE_V1 = 1u << 3,
  /* the table could not be read (not an ELF shared object of this machine's class, no section
   * headers, sizes past the reader's bounds): only loading it can tell; WHY says why */
  SL__ENTRY_UNKNOWN = 1u << 4,
  /* not a regular file (a FIFO, a device, a directory) or not readable: never to be loaded
   * (dlopen of a FIFO would wait for a writer); WHY says why */
  SL__ENTRY_NOT_A_FILE = 1u << 5
};
#define SL__ENTRY_BACKEND (SL__ENTRY_BACKEND_V2 | SL__ENTRY_BACKEND_V1)
#define SL__ENTRY_COLLECTIVE (SL__ENTRY_COLLECTIVE_V2 | SL__ENTRY_COLLECTIVE_V1)
unsigned sl__module_entries(const char *path, char *why, size_t len);

/* ---- the registry's side (registry.c), for the listing ------------------------------------ */
/* The directory of this library as an absolute real path, "" when unknown. */
const char *sl__module_library_dir(void);
/* The built-in modules and the loadable names the core knows, by index (NULL past the end). */
const char *sl__builtin_backend_name(size_t i);
const sl_backend_ops *sl__builtin_backend_ops(size_t i);
const char *sl__builtin_collective_name(size_t i);
const sl_collective_ops *sl__builtin_collective_ops(size_t i);
const char *sl__known_backend(size_t i);    /* cuda, hip, level_zero */
const char *sl__known_collective(size_t i); /* nccl, rccl */

/* A module opened by name and its table checked (and adapted when it is v1), as a context
 * opens one. */
typedef struct sl__module {
  void *dl;
  void *shim; /* the v1 adapter's allocation, or NULL (v2) */
  const void *ops;
  char path[PATH_MAX];
} sl__module;
/* 0, or why not: 1 no file anywhere (WHY: the loader's message), 2 a file that does not load
 * (WHY: the loader's message), 3 a table the core refuses (WHY names the file and what is
 * wrong). Nothing is left open on failure. WHY is escaped module text. */
enum { SL__MODULE_ABSENT = 1, SL__MODULE_UNLOADABLE = 2, SL__MODULE_BAD_ABI = 3 };
int sl__module_open(const char *name, bool collective, sl__module *m, char *why, size_t whylen);
void sl__module_close(sl__module *m);
/* The probes as the registry runs them: the score (0 when not usable) and a reason that names
 * the module whatever it wrote, escaped. A collective's includes the route check for BACKEND. */
int sl__module_probe_backend(const sl_backend_ops *o, const void *shim, char *reason, size_t len);
int sl__module_probe_collective(const sl_collective_ops *o, const void *shim, const sl_backend_ops *backend,
                                char *reason, size_t len);

#endif
