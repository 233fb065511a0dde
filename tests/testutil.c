#define _GNU_SOURCE
#include "testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

static size_t dtype_size(const char *dt) {
  if (!strcmp(dt, "F64") || !strcmp(dt, "I64") || !strcmp(dt, "U64")) return 8;
  if (!strcmp(dt, "F32") || !strcmp(dt, "I32") || !strcmp(dt, "U32")) return 4;
  if (!strcmp(dt, "F16") || !strcmp(dt, "BF16") || !strcmp(dt, "I16") || !strcmp(dt, "U16")) return 2;
  return 1;
}

char *sl_test_dir(const char *sub) {
  const char *base = getenv("SHARDLOAD_TEST_TMP");
  char *dir = NULL;
  if (!base) base = "/tmp/shardload-test";
  if (asprintf(&dir, "%s/%s", base, sub) < 0) return NULL;
  char *cmd = NULL;
  if (asprintf(&cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir) < 0) return NULL;
  int rc = system(cmd);
  free(cmd);
  if (rc != 0) {
    free(dir);
    return NULL;
  }
  return dir;
}

char *sl_test_path(const char *dir, const char *name) {
  char *p = NULL;
  if (asprintf(&p, "%s/%s", dir, name) < 0) return NULL;
  return p;
}

unsigned char sl_test_pattern_byte(const char *name, uint64_t i) {
  uint64_t h = 1469598103934665603ull;
  for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  h ^= i * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return (unsigned char)h;
}

int sl_test_write_bytes(const char *path, const void *bytes, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(bytes, 1, len, f);
  return (fclose(f) == 0 && w == len) ? 0 : -1;
}

int sl_test_write_raw(const char *path, const char *header_json, size_t data_len) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  uint64_t n = strlen(header_json);
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = (unsigned char)(n >> (8 * i));
  fwrite(le, 1, 8, f);
  fwrite(header_json, 1, n, f);
  for (size_t i = 0; i < data_len; i++) fputc((int)(i & 0xff), f);
  return fclose(f) == 0 ? 0 : -1;
}

int sl_test_write_st(const char *path, const sl_test_tensor *ts, size_t n, const char *metadata_json) {
  size_t cap = 4096 + n * 256, len = 0;
  char *hdr = malloc(cap);
  if (!hdr) return -1;
  len += (size_t)snprintf(hdr + len, cap - len, "{");
  if (metadata_json) len += (size_t)snprintf(hdr + len, cap - len, "\"__metadata__\":%s%s", metadata_json, n ? "," : "");
  uint64_t off = 0;
  for (size_t t = 0; t < n; t++) {
    uint64_t elems = 1;
    for (int d = 0; d < ts[t].ndim; d++) elems *= (uint64_t)ts[t].shape[d];
    uint64_t nb = elems * dtype_size(ts[t].dtype);
    len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", t ? "," : "",
                            ts[t].name, ts[t].dtype);
    for (int d = 0; d < ts[t].ndim; d++)
      len += (size_t)snprintf(hdr + len, cap - len, "%s%lld", d ? "," : "", (long long)ts[t].shape[d]);
    len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                            (unsigned long long)(off + nb));
    off += nb;
  }
  len += (size_t)snprintf(hdr + len, cap - len, "}");
  /* pad the header to 8 bytes with spaces, as the reference writer does */
  while (len % 8) hdr[len++] = ' ';
  FILE *f = fopen(path, "wb");
  if (!f) {
    free(hdr);
    return -1;
  }
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = (unsigned char)((uint64_t)len >> (8 * i));
  fwrite(le, 1, 8, f);
  fwrite(hdr, 1, len, f);
  free(hdr);
  for (size_t t = 0; t < n; t++) {
    uint64_t elems = 1;
    for (int d = 0; d < ts[t].ndim; d++) elems *= (uint64_t)ts[t].shape[d];
    uint64_t nb = elems * dtype_size(ts[t].dtype);
    if (ts[t].data) {
      fwrite(ts[t].data, 1, nb, f);
    } else {
      for (uint64_t i = 0; i < nb; i++) fputc(sl_test_pattern_byte(ts[t].name, i), f);
    }
  }
  return fclose(f) == 0 ? 0 : -1;
}

int sl_test_run(char **out, const char *fmt, ...) {
  char *cmd = NULL;
  va_list ap;
  va_start(ap, fmt);
  int rc = vasprintf(&cmd, fmt, ap);
  va_end(ap);
  if (rc < 0) return -1;
  char *full = NULL;
  if (asprintf(&full, "%s 2>&1", cmd) < 0) return -1;
  free(cmd);
  FILE *p = popen(full, "r");
  free(full);
  if (!p) return -1;
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  size_t r;
  while (buf && (r = fread(buf + len, 1, cap - len - 1, p)) > 0) {
    len += r;
    if (cap - len < 1024) {
      cap *= 2;
      buf = realloc(buf, cap);
    }
  }
  if (buf) buf[len] = 0;
  int st = pclose(p);
  if (out) *out = buf; else free(buf);
  if (st == -1 || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

const char *sl_test_bin(void) {
  const char *b = getenv("SHARDLOAD_BIN");
  return b ? b : "shardload";
}

#include <signal.h>
#include <time.h>

int sl_test_spawn(int world, int (*fn)(int rank, int world, void *arg), void *arg, int deadline_ms, int *codes) {
  pid_t pids[256];
  if (world > 256) return -1;
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < world; r++) {
    pid_t p = fork();
    if (p == 0) {
      int rc = fn(r, world, arg);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    pids[r] = p;
    codes[r] = -1;
  }
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int left = world, killed = 0;
  while (left > 0) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < world; r++) {
        if (pids[r] != p) continue;
        codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        pids[r] = 0;
        left--;
      }
      continue;
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    long ms = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
    if (ms > deadline_ms) {
      for (int r = 0; r < world; r++) {
        if (!pids[r]) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], NULL, 0);
        codes[r] = -1;
        pids[r] = 0;
        killed++;
        left--;
      }
      break;
    }
    usleep(2000);
  }
  return killed;
}

char *sl_test_rendezvous(const char *sub) {
  char *d = sl_test_dir(sub), *url = NULL;
  if (!d) return NULL;
  if (asprintf(&url, "file://%s", d) < 0) url = NULL;
  free(d);
  return url;
}

int sl_test_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

int sl_test_all_bytes(const unsigned char *p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v) return 0;
  return 1;
}

static long json_budget;

static void *json_budget_malloc(size_t size) {
  if (json_budget <= 0) {
    errno = ENOMEM;
    return NULL;
  }
  json_budget--;
  return malloc(size);
}

void sl_test_json_alloc_budget(long budget) {
  json_budget = budget;
  if (budget < 0) json_set_alloc_funcs(malloc, free);
  else json_set_alloc_funcs(json_budget_malloc, free);
}

int sl_test_names_rank(const char *msg, int v) {
  const char *p = strstr(msg, ": ");
  if (!p) return 0;
  while ((p = strstr(p, "rank"))) {
    p += 4;
    if (*p == 's') p++;
    if (*p != ' ') continue;
    for (;;) {
      char *end;
      long x = strtol(p, &end, 10);
      if (end == p) break;
      if (x == v) return 1;
      if (strncmp(end, ", ", 2) != 0) break;
      p = end + 2;
    }
  }
  return 0;
}

char *sl_test_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) free(b), b = NULL;
  fclose(f);
  *len = b ? (size_t)n : 0;
  return b;
}

int sl_test_dumps_differ(const char *dir_a, const char *dir_b, int world) {
  for (int r = 0; r < world; r++) {
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/rank-%d.safetensors", dir_a, r);
    snprintf(b, sizeof b, "%s/rank-%d.safetensors", dir_b, r);
    size_t la = 0, lb = 0;
    char *x = sl_test_read_file(a, &la), *y = sl_test_read_file(b, &lb);
    bool same = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    if (!same) return r;
  }
  return -1;
}

void sl_test_write_pid(const char *dir, int rank) {
  char path[4200], tmp[4220];
  snprintf(path, sizeof path, "%s/pid-%d", dir, rank);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  fprintf(f, "%d\n", (int)getpid());
  fclose(f);
  rename(tmp, path);
}

pid_t sl_test_read_pid(const char *dir, int rank) {
  char path[4200];
  snprintf(path, sizeof path, "%s/pid-%d", dir, rank);
  for (int i = 0; i < 2000; i++) {
    FILE *f = fopen(path, "r");
    int pid = 0;
    if (f && fscanf(f, "%d", &pid) == 1 && pid > 0) {
      fclose(f);
      return pid;
    }
    if (f) fclose(f);
    usleep(5000);
  }
  return -1;
}
