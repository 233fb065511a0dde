/* Helpers shared by the tests: scratch directories, writing safetensors files byte by byte
 * (independently of the library's reader), and running the command. */
#ifndef SL_TESTUTIL_H
#define SL_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/types.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "shardload/shardload.h"

/* SL_TEST_ASAN: built under AddressSanitizer (whose allocator dies where malloc would return
 * NULL, and which reserves address space: memory-limit tests skip under it). */
#if defined(__SANITIZE_ADDRESS__)
#define SL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SL_TEST_ASAN 1
#endif
#endif

typedef struct sl_test_tensor {
  const char *name;
  const char *dtype; /* safetensors spelling */
  int ndim;
  int64_t shape[8];
  const void *data; /* nbytes = prod(shape) * size(dtype); NULL: deterministic pattern */
} sl_test_tensor;

/* A fresh empty directory under $SHARDLOAD_TEST_TMP (or /tmp) named after SUB; returns a
 * static-lifetime malloc'd path. */
char *sl_test_dir(const char *sub);
/* path joined: malloc'd */
char *sl_test_path(const char *dir, const char *name);
/* Writes a valid safetensors file; data of tensors with data == NULL is
 * sl_test_pattern_byte(name, i). METADATA_JSON: NULL or an object literal. Returns 0 on success. */
int sl_test_write_st(const char *path, const sl_test_tensor *ts, size_t n, const char *metadata_json);
/* Writes an arbitrary file: header JSON text as given, then DATA_LEN bytes of data. */
int sl_test_write_raw(const char *path, const char *header_json, size_t data_len);
/* Writes BYTES verbatim. */
int sl_test_write_bytes(const char *path, const void *bytes, size_t len);
unsigned char sl_test_pattern_byte(const char *name, uint64_t i);
/* Runs the command line (through /bin/sh), captures stdout+stderr into *out (malloc'd) and
 * returns the exit status (or -1). */
int sl_test_run(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Path of the shardload command ($SHARDLOAD_BIN). */
const char *sl_test_bin(void);

/* ---- multi-rank ---------------------------------------------------------------------------- */
/* Forks WORLD processes; child r runs FN(r, WORLD, ARG) and exits with its return value.
 * The parent waits up to DEADLINE_MS for all of them, SIGKILLs any still running (a hang),
 * and fills codes[r] with the exit code (or 128 + signal; -1 for a child it had to kill).
 * Returns the number of children it had to kill (0 when none hung). */
int sl_test_spawn(int world, int (*fn)(int rank, int world, void *arg), void *arg, int deadline_ms, int *codes);
/* A fresh file:// rendezvous URL in a new directory under the test's scratch directory. */
char *sl_test_rendezvous(const char *sub);
/* A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick). */
int sl_test_free_port(void);
/* jansson's allocator for the next calls: every allocation fails (NULL, errno ENOMEM, as malloc
 * fails) once BUDGET of them succeeded; BUDGET < 0 restores malloc/free. */
void sl_test_json_alloc_budget(long budget);
/* Whether MSG names rank V ("rank V", or V in a list "ranks A, B, V") after its first ": "
 * (what the failing op says about itself comes before). */
int sl_test_names_rank(const char *msg, int v);
/* Whether all N bytes at P equal V. */
int sl_test_all_bytes(const unsigned char *p, size_t n, unsigned char v);
/* The whole file PATH, malloc'd, its length in *LEN; NULL when it cannot be read. */
char *sl_test_read_file(const char *path, size_t *len);
/* The first rank of WORLD whose DIR_A/rank-R.safetensors differs from DIR_B's (--dump), or -1
 * when all are equal; a file that cannot be read differs. */
int sl_test_dumps_differ(const char *dir_a, const char *dir_b, int world);
/* DIR/pid-RANK: this process's pid, written whole (through a rename) for another to read. */
void sl_test_write_pid(const char *dir, int rank);
/* The pid in DIR/pid-RANK, waiting up to 10 s for it to be written; -1 when it was not. */
pid_t sl_test_read_pid(const char *dir, int rank);
/* Child-side check that records the first failure in a buffer and makes the child fail;
 * cmocka's asserts do not work across fork. */
#define SL_CHILD_CHECK(cond, ...)                                                        \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "rank check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond);   \
      fprintf(stderr, __VA_ARGS__);                                                      \
      fputc('\n', stderr);                                                               \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

#endif
