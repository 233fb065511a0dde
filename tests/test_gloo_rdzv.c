/* The rendezvous against slow, silent and crowded stores: one deadline for the whole
 * rendezvous whatever the number of requests, a store that never answers reported as a
 * timeout, and the report of the ranks that never arrived bounded in requests whatever the
 * world size.
 *
 * The stores are real sockets: a torch c10d TCPStore played by hand (c10d_store.h has the
 * protocol), which can answer every request late or never, and, for tcp://, a relay between
 * a rank and rank 0's real store that counts the rank's requests and can hold back every
 * answer. Ranks are forked children running the Gloo module's init; the parent reaps every
 * child with a deadline and kills stragglers. Counters live in shared memory. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

#include "gloo_testlib.h"

/* ---- ranks: children running init ---------------------------------------------------------- */

typedef struct rank_spec {
  int rank, world, timeout_ms;
  const char *url;
  sl_status expect;
  const char *want[3]; /* substrings the message must hold */
  double max_ms;       /* init must return within this */
} rank_spec;

static int rank_main(const rank_spec *s) {
  g_rank = s->rank;
  unsetenv("SHARDLOAD_TOKEN");
  unsetenv("SHARDLOAD_TOKEN_FILE");
  sl_collective_init in = {.size = sizeof in, .host = &g_host, .rank = s->rank, .world_size = s->world,
                           .rendezvous = s->url, .prefix = "test/", .timeout_ms = s->timeout_ms};
  void *comm = NULL;
  double t0 = now_ms();
  sl_status st = gloo_ops()->init(&in, &comm);
  double took = now_ms() - t0;
  fprintf(stderr, "rank %d of %d: init %s after %.0f ms (timeout %d ms): %s\n", s->rank, s->world,
          sl_status_name(st), took, s->timeout_ms, st ? g_msg : "");
  CHECK(st == s->expect, "init: %s, expected %s", sl_status_name(st), sl_status_name(s->expect));
  for (int i = 0; i < 3 && s->want[i]; i++) CHECK(strstr(g_msg, s->want[i]), "message lacks '%s'", s->want[i]);
  CHECK(took < s->max_ms, "init took %.0f ms, more than %.0f", took, s->max_ms);
  if (st == SL_OK) gloo_ops()->fini(comm);
  return 0;
}

static pid_t spawn_rank(const rank_spec *s) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(120); /* never outlive the test long */
    _exit(rank_main(s));
  }
  return pid;
}

/* ---- socket helpers ------------------------------------------------------------------------------ */

static int listen_on(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
  assert_true(fd >= 0);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(fd, 16), 0);
  return fd;
}

static int dial(int port, int timeout_ms) {
  double end = now_ms() + timeout_ms;
  while (now_ms() < end) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    close(fd);
    usleep(20000);
  }
  return -1;
}

/* Blocking: 0 once N bytes are read, -1 when the peer closed first. */
static int read_full(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static void *shared(size_t n) {
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(p != MAP_FAILED);
  memset(p, 0, n);
  return p;
}

/* ---- a torch c10d TCPStore, by hand --------------------------------------------------------------- */

enum { Q_VALIDATE = 0, Q_SET = 1, Q_GET = 3, Q_ADD = 4, Q_CHECK = 5, Q_PING = 13 };

typedef struct c10d_counts {
  long requests[16]; /* by query type */
  long keys_checked; /* keys named by all CHECKs */
} c10d_counts;

typedef struct kv {
  char key[256];
  char val[64];
} kv;

enum { KV_MAX = 256 };

static kv *kv_find(kv *t, int *n, const char *key, int create) {
  for (int i = 0; i < *n; i++)
    if (!strcmp(t[i].key, key)) return &t[i];
  if (!create || *n == KV_MAX) return NULL;
  snprintf(t[*n].key, sizeof t[*n].key, "%s", key);
  t[*n].val[0] = 0;
  return &t[(*n)++];
}

/* A string of the protocol (u64 length, bytes) into BUF (cut to fit). */
static int read_str(int fd, char *buf, size_t size) {
  uint64_t len;
  if (read_full(fd, &len, sizeof len)) return -1;
  if (len > (1u << 20)) return -1;
  char *tmp = malloc(len + 1);
  if (!tmp || read_full(fd, tmp, len)) {
    free(tmp);
    return -1;
  }
  tmp[len] = 0;
  snprintf(buf, size, "%s", tmp);
  free(tmp);
  return 0;
}

/* Answers after DELAY_MS (or never, DELAY_MS < 0: the answer is dropped). */
static int answer(int fd, const void *buf, size_t n, int delay_ms) {
  if (delay_ms < 0) return 0;
  if (delay_ms) usleep((useconds_t)delay_ms * 1000);
  return write_full(fd, buf, n);
}

/* The store: one connection at a time (each test has one client), every answer DELAY_MS late.
 * Keys and values are kept; CHECK says READY (0) only when every key is present; ADD keeps a
 * decimal counter, as torch's servers do. */
static void c10d_serve(int lfd, int delay_ms, c10d_counts *counts) {
  kv *table = calloc(KV_MAX, sizeof *table);
  int n = 0;
  for (;;) {
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) continue;
    for (;;) {
      uint8_t q;
      if (read_full(fd, &q, 1)) break;
      counts->requests[q & 15]++;
      char key[256];
      if (q == Q_VALIDATE) {
        uint32_t magic;
        if (read_full(fd, &magic, sizeof magic)) break;
      } else if (q == Q_PING) {
        uint32_t nonce;
        if (read_full(fd, &nonce, sizeof nonce) || answer(fd, &nonce, sizeof nonce, delay_ms)) break;
      } else if (q == Q_SET) {
        char val[64];
        if (read_str(fd, key, sizeof key) || read_str(fd, val, sizeof val)) break;
        kv *e = kv_find(table, &n, key, 1);
        if (e) snprintf(e->val, sizeof e->val, "%s", val);
      } else if (q == Q_GET) {
        if (read_str(fd, key, sizeof key)) break;
        kv *e = kv_find(table, &n, key, 0);
        char out[8 + 64];
        uint64_t len = e ? strlen(e->val) : 0;
        memcpy(out, &len, 8);
        if (len) memcpy(out + 8, e->val, len);
        if (answer(fd, out, 8 + len, delay_ms)) break;
      } else if (q == Q_ADD) {
        int64_t delta;
        if (read_str(fd, key, sizeof key) || read_full(fd, &delta, sizeof delta)) break;
        kv *e = kv_find(table, &n, key, 1);
        int64_t v = (e ? atoll(e->val) : 0) + delta;
        if (e) snprintf(e->val, sizeof e->val, "%lld", (long long)v);
        if (answer(fd, &v, sizeof v, delay_ms)) break;
      } else if (q == Q_CHECK) {
        uint64_t k;
        if (read_full(fd, &k, sizeof k)) break;
        uint8_t ready = 0;
        int bad = 0;
        for (uint64_t i = 0; i < k && !bad; i++) {
          bad = read_str(fd, key, sizeof key);
          if (!bad && !kv_find(table, &n, key, 0)) ready = 1;
        }
        counts->keys_checked += (long)k;
        if (bad || answer(fd, &ready, 1, delay_ms)) break;
      } else {
        break;
      }
    }
    close(fd);
  }
}

/* The fake store in a child on PORT; its counters in COUNTS (shared memory). */
static pid_t c10d_start(int port, int delay_ms, c10d_counts *counts) {
  int lfd = listen_on(port);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(120);
    c10d_serve(lfd, delay_ms, counts);
    _exit(0);
  }
  close(lfd);
  return pid;
}

/* A c10d store that answers every request just under the timeout: each request alone would
 * pass, and the rendezvous of a rank of 6 sends dozens. The whole rendezvous is held to one
 * deadline: init fails as a timeout within about one timeout, not 7x. */
static void test_c10d_slow_store_one_deadline(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port(), timeout = 2000;
  c10d_counts *counts = shared(sizeof *counts);
  pid_t store = c10d_start(port, timeout * 85 / 100, counts);
  char url[64];
  snprintf(url, sizeof url, "c10d://127.0.0.1:%d", port);
  rank_spec s = {.rank = 0, .world = 6, .timeout_ms = timeout, .url = url, .expect = SL_ERR_TIMEOUT,
                 .want = {"torch c10d store at 127.0.0.1:"}, .max_ms = 1.6 * timeout};
  int rc = reap(spawn_rank(&s), 60000);
  stop(store);
  munmap(counts, sizeof *counts);
  assert_int_equal(rc, 0);
}

/* A c10d store that accepts and reads but never answers: the rank fails within its timeout,
 * and says so as a timeout (SL_ERR_TIMEOUT), not as a communication error. */
static void test_c10d_silent_store_is_timeout(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port(), timeout = 1500;
  c10d_counts *counts = shared(sizeof *counts);
  pid_t store = c10d_start(port, -1, counts);
  char url[64];
  snprintf(url, sizeof url, "c10d://127.0.0.1:%d", port);
  rank_spec s = {.rank = 1, .world = 4, .timeout_ms = timeout, .url = url, .expect = SL_ERR_TIMEOUT,
                 .want = {"no answer within", "torch c10d store at 127.0.0.1:"}, .max_ms = 1.6 * timeout};
  int rc = reap(spawn_rank(&s), 30000);
  stop(store);
  munmap(counts, sizeof *counts);
  assert_int_equal(rc, 0);
}

/* Rank 0 of the largest world alone in a prompt c10d store: its timeout names the missing
 * ranks from a count (one request) and a few probes, not from one CHECK per rank, and its
 * waits poll the count rather than CHECK every rank's key. */
static void test_c10d_missing_report_bounded(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port(), timeout = 2000;
  c10d_counts *counts = shared(sizeof *counts);
  pid_t store = c10d_start(port, 0, counts);
  char url[64];
  snprintf(url, sizeof url, "c10d://127.0.0.1:%d", port);
  rank_spec s = {.rank = 0, .world = SL_MAX_WORLD_SIZE, .timeout_ms = timeout, .url = url,
                 .expect = SL_ERR_TIMEOUT, .want = {"waiting for ranks 1, 2, 3, 4, 5, 6, 7, 8 and 4087 more to join"},
                 .max_ms = 1.6 * timeout};
  int rc = reap(spawn_rank(&s), 60000);
  stop(store);
  long checks = counts->requests[Q_CHECK], keys = counts->keys_checked;
  print_message("the store saw %ld CHECKs naming %ld keys, %ld ADDs\n", checks, keys, counts->requests[Q_ADD]);
  munmap(counts, sizeof *counts);
  assert_int_equal(rc, 0);
  /* polls of the abort key (one per poll, at most every 50 ms) and at most 64 probes */
  assert_true(checks < 200);
  assert_true(keys < 200);
}

/* ---- tcp://: a relay between a rank and rank 0's real store ------------------------------------ */

typedef struct relay_counts {
  long frames[16]; /* the client's request frames by op (tcp_store_wire.h) */
} relay_counts;

enum { OP_SET = 2, OP_GET = 3, OP_CHECK = 4, OP_WAIT = 5, OP_ADD = 7 };

/* Relays connections on LISTEN_PORT to TO_PORT, one at a time, counting the client's frames
 * and holding back each of the server's answers by DELAY_MS (clients send one request at a
 * time, so each frame the server sends is one answer). */
static void relay_serve(int lfd, int to_port, int delay_ms, relay_counts *counts) {
  for (;;) {
    int c = accept(lfd, NULL, NULL), one = 1;
    if (c < 0) continue;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int s = dial(to_port, 10000);
    if (s < 0) {
      close(c);
      continue;
    }
    for (;;) {
      uint8_t hdr[4];
      struct pollfd p[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
      if (poll(p, 2, -1) < 0) continue;
      int from = p[0].revents ? c : s, to = from == c ? s : c;
      if (read_full(from, hdr, 4)) break;
      uint32_t len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
      char *msg = malloc(4 + (size_t)len);
      if (!msg || read_full(from, msg + 4, len)) {
        free(msg);
        break;
      }
      memcpy(msg, hdr, 4);
      if (from == c && len) counts->frames[(uint8_t)msg[4] & 15]++;
      if (from == s && delay_ms) usleep((useconds_t)delay_ms * 1000);
      int bad = write_full(to, msg, 4 + (size_t)len); /* one write: no Nagle wait between header and body */
      free(msg);
      if (bad) break;
    }
    close(c);
    close(s);
  }
}

static pid_t relay_start(int port, int to_port, int delay_ms, relay_counts *counts) {
  int lfd = listen_on(port);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(120);
    relay_serve(lfd, to_port, delay_ms, counts);
    _exit(0);
  }
  close(lfd);
  return pid;
}

/* Rank 0 serves a world of SL_MAX_WORLD_SIZE; rank 1 joins through the relay; nobody else
 * comes. Rank 1's report of the missing ranks takes a count (one ADD) and a few probes, not
 * one CHECK per rank. */
static void test_tcp_missing_report_bounded(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port(), relay = sl_test_free_port(), timeout = 2500;
  relay_counts *counts = shared(sizeof *counts);
  char url0[64], url1[64];
  snprintf(url0, sizeof url0, "tcp://127.0.0.1:%d", port);
  snprintf(url1, sizeof url1, "tcp://127.0.0.1:%d", relay);
  const char *who = "waiting for ranks 2, 3, 4, 5, 6, 7, 8, 9 and 4086 more to join";
  rank_spec r0 = {.rank = 0, .world = SL_MAX_WORLD_SIZE, .timeout_ms = timeout, .url = url0,
                  .expect = SL_ERR_TIMEOUT, .want = {who}, .max_ms = 1.6 * timeout};
  rank_spec r1 = {.rank = 1, .world = SL_MAX_WORLD_SIZE, .timeout_ms = timeout, .url = url1,
                  .expect = SL_ERR_TIMEOUT, .want = {who}, .max_ms = 1.6 * timeout};
  pid_t p0 = spawn_rank(&r0);
  pid_t rl = relay_start(relay, port, 0, counts);
  pid_t p1 = spawn_rank(&r1);
  int rc1 = reap(p1, 60000), rc0 = reap(p0, 60000);
  stop(rl);
  long checks = counts->frames[OP_CHECK], adds = counts->frames[OP_ADD];
  print_message("rank 1 sent %ld CHECKs, %ld ADDs, %ld WAITs\n", checks, adds, counts->frames[OP_WAIT]);
  munmap(counts, sizeof *counts);
  assert_int_equal(rc0, 0);
  assert_int_equal(rc1, 0);
  assert_true(checks <= 64);
  assert_true(adds >= 2 && adds < 8); /* joining, and the count */
}

/* Rank 0's store answers rank 1 (through the relay) just under half the timeout each time: the
 * handshake passes, and every later request would too. Rank 1's rendezvous is held to one
 * deadline: it fails as a timeout within about one timeout. */
static void test_tcp_slow_store_one_deadline(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port(), relay = sl_test_free_port(), timeout = 3000;
  relay_counts *counts = shared(sizeof *counts);
  char url0[64], url1[64];
  snprintf(url0, sizeof url0, "tcp://127.0.0.1:%d", port);
  snprintf(url1, sizeof url1, "tcp://127.0.0.1:%d", relay);
  rank_spec r0 = {.rank = 0, .world = 6, .timeout_ms = timeout, .url = url0, .expect = SL_ERR_TIMEOUT,
                  .max_ms = 1.6 * timeout};
  rank_spec r1 = {.rank = 1, .world = 6, .timeout_ms = timeout, .url = url1, .expect = SL_ERR_TIMEOUT,
                  .want = {"rendezvous store at 127.0.0.1:"}, .max_ms = 1.6 * timeout};
  pid_t p0 = spawn_rank(&r0);
  pid_t rl = relay_start(relay, port, timeout * 45 / 100, counts);
  pid_t p1 = spawn_rank(&r1);
  int rc1 = reap(p1, 60000), rc0 = reap(p0, 60000);
  stop(rl);
  munmap(counts, sizeof *counts);
  assert_int_equal(rc0, 0);
  assert_int_equal(rc1, 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  if (getenv("SL_TEST_FILTER")) cmocka_set_test_filter(getenv("SL_TEST_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_c10d_slow_store_one_deadline),
      cmocka_unit_test(test_c10d_silent_store_is_timeout),
      cmocka_unit_test(test_c10d_missing_report_bounded),
      cmocka_unit_test(test_tcp_missing_report_bounded),
      cmocka_unit_test(test_tcp_slow_store_one_deadline),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
