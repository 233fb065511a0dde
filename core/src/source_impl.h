/* The source's private layout, shared by source.c (the handle, built from headers),
 * source_files.c (opening and reading files, a bounded set open at once; fingerprints),
 * source_index.c (parsing index.json), source_manifest.c (the byte image rank 0
 * broadcasts) and source_memory.c (a source whose tensors are in rank 0's memory). */
#ifndef SHARDLOAD_SOURCE_IMPL_H
#define SHARDLOAD_SOURCE_IMPL_H

#include <sys/stat.h>

#include "internal.h"

/* At most this many checkpoint files are open at once (fewer under a low RLIMIT_NOFILE): a
 * checkpoint of thousands of shards must load under the usual 1024-descriptor limit. */
#define SL__SOURCE_MAX_OPEN 64

typedef struct src_file {
  char *path; /* absolute, as opened (symlinks not resolved) */
  char *name; /* as the index names it, or the single file's base name */
  int fd;     /* -1 when not open (never opened, evicted, or a manifest-built source) */
  uint64_t last_use; /* LRU clock of the last read through fd */
  /* What the file was when this rank first opened it; a reopen must find the same file. */
  dev_t dev;
  ino_t ino;
  uint64_t size;
  /* Modification and change times: a file unlinked and rewritten at the same size may get the
   * freed inode number back (ext4, tmpfs); its times still differ. */
  struct timespec mtime, ctime;
  uint64_t header_digest; /* XXH3-64 of 8 + N header bytes as first read; 0 if not read here */
  uint64_t data_offset;   /* 8 + N as first read; 0 if not read here */
} src_file;

struct sl_source {
  sl_context *ctx;
  sl_source_tensor *tensors; /* file order; names owned */
  size_t *file_of;           /* tensors[i] lives in files[file_of[i]] */
  size_t count;
  src_file *files;
  size_t file_count;
  char **meta_keys, **meta_values;
  size_t meta_count;
  bool meta_from_index; /* the metadata are an index's ("metadata"), not a header's (__metadata__) */
  size_t *slots; /* name hash: tensor index + 1, 0 = empty; slot_mask + 1 slots */
  size_t slot_mask;
  uint64_t total_bytes;
  uint64_t headers_digest; /* see sl__source_headers_digest; rank 0's in a manifest-built one */
  bool has_files;
  size_t open_count, max_open; /* files with fd >= 0, and the bound on them */
  uint64_t use_clock;
  /* A memory source (sl_source_open_memory): one pseudo file named by the label, no
   * descriptors. On rank 0 (has_files) each tensor's bytes are at mem_data[i], or come from
   * mem_read when that is NULL; on other ranks only the table exists. */
  bool memory;
  const void **mem_data;
  sl_source_read_fn mem_read;
  void *mem_user;
};

sl_source *sl__source_new(sl_context *ctx);
/* The default bound on open files: a quarter of RLIMIT_NOFILE, at most SL__SOURCE_MAX_OPEN. */
size_t sl__source_open_bound(void);
/* Builds the name hash; on a duplicate name sets *dup to its index and fails. */
sl_status sl__source_build_index(sl_source *src, size_t *dup);

/* Opens PATH for reading without blocking (a FIFO must not hang us), refuses anything but a
 * regular file with a message naming PATH and what it is, then makes the descriptor blocking
 * again. WHY is appended to the "cannot open" message (may be ""). Fills *st. */
sl_status sl__source_open_regular(sl_context *ctx, const char *path, const char *why, int *fd,
                                  struct stat *st);
/* Records that file F is open as FD (its identity from ST on first sight), first closing the
 * least recently used files so that no more than max_open stay open. */
void sl__source_adopt_fd(sl_source *src, size_t f, int fd, const struct stat *st);
/* Sets the bound on open files (at least 1) and closes the least recently used beyond it. */
void sl__source_set_max_open(sl_source *src, size_t n);
/* The open descriptor of file F, reopening it (and checking it is still the same file) when
 * it was closed to respect the bound. */
sl_status sl__source_fd(sl_source *src, size_t f, int *fd);
/* Combines per-file header digests in file order (the headers digest). */
uint64_t sl__source_combine_digests(const uint64_t *digests, size_t n);
/* qsort/bsearch comparison of two char * by strcmp (file names sort the file order). */
int sl__strp_cmp(const void *a, const void *b);

/* ---- memory sources (source_memory.c) ------------------------------------------------ */
/* Builds rank 0's memory source from the caller's table, validated like a safetensors header. */
sl_status sl__source_open_memory_local(sl_context *ctx, const char *label, const sl_memory_tensor *tensors,
                                       size_t count, sl_source_read_fn read, void *read_user, sl_source **out);
/* Reads tensor I's bytes of a memory source on rank 0 (bounds already checked). */
sl_status sl__source_memory_pread(sl_source *src, size_t i, uint64_t offset_in_tensor, void *dst, size_t bytes);
/* The refusal of every-rank access (open files, fingerprints) to a memory source. */
sl_status sl__source_memory_refuse(sl_source *src, const char *what);
/* sl__source_deserialize for the ranks of a memory source (source_manifest.c): its one file is
 * named by a label, not an absolute path, and the result is marked as a memory source. */
sl_status sl__source_deserialize_ex(sl_context *ctx, const void *buf, size_t len, bool memory, sl_source **out);

#endif
