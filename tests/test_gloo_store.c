/* The tcp:// rendezvous store as an adversary meets it: rank 0 (a forked child that runs the
 * Gloo module's init, so its store thread serves) and clients on real sockets over loopback,
 * some of them speaking the store's protocol by hand (tcp_store.h), with libsodium for the
 * handshake. The store must serve nothing before authentication, refuse wrong tokens both
 * ways, listen only on the address it names, refuse a rank started twice on every rank,
 * bound its memory, connections and values, not spin when out of descriptors, and bound
 * Gloo's connect phase by the timeout.
 *
 * Children check with CHECK (print, _exit(1)); the parent reaps every child with a deadline
 * and kills stragglers, so no process outlives a test. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "internal.h"
#include "testutil.h"

#include "gloo_testlib.h"


static const char kTokenA[] = "correct-horse-battery-staple-1";
static const char kTokenB[] = "another-job-entirely-its-token";

/* ---- ranks: children running init ---------------------------------------------------------- */

typedef struct rank_spec {
  int rank, world, timeout_ms, delay_ms;
  int linger_ms; /* after the barrier, before fini */
  const char *host; /* the rendezvous host (default 127.0.0.1) */
  int port;
  const char *token;    /* SHARDLOAD_TOKEN, or NULL for unset */
  const char *insecure; /* SHARDLOAD_INSECURE_RENDEZVOUS, or NULL */
  sl_status expect;
  const char *want[4]; /* substrings the message must hold (on failure) */
  double max_ms;       /* init must return within this (0: no bound) */
} rank_spec;

static int rank_main(const rank_spec *s) {
  g_rank = s->rank;
  const sl_collective_ops *ops = gloo_ops();
  if (s->delay_ms) usleep((useconds_t)s->delay_ms * 1000);
  unsetenv("SHARDLOAD_TOKEN_FILE");
  if (s->token) setenv("SHARDLOAD_TOKEN", s->token, 1);
  else unsetenv("SHARDLOAD_TOKEN");
  if (s->insecure) setenv("SHARDLOAD_INSECURE_RENDEZVOUS", s->insecure, 1);
  else unsetenv("SHARDLOAD_INSECURE_RENDEZVOUS");
  char url[128];
  snprintf(url, sizeof url, "tcp://%s:%d", s->host ? s->host : "127.0.0.1", s->port);
  sl_collective_init in = {.size = sizeof in, .host = &g_host, .rank = s->rank, .world_size = s->world,
                           .rendezvous = url, .prefix = "test/", .timeout_ms = s->timeout_ms};
  void *comm = NULL;
  double t0 = now_ms();
  sl_status st = ops->init(&in, &comm);
  double took = now_ms() - t0;
  fprintf(stderr, "rank %d of %d: init %s after %.0f ms: %s\n", s->rank, s->world, sl_status_name(st), took,
          st ? g_msg : "");
  CHECK(st == s->expect, "init: %s, expected %s", sl_status_name(st), sl_status_name(s->expect));
  for (int i = 0; i < 4 && s->want[i]; i++) CHECK(strstr(g_msg, s->want[i]), "message lacks '%s'", s->want[i]);
  CHECK(!s->max_ms || took < s->max_ms, "init took %.0f ms", took);
  if (st == SL_OK) {
    CHECK(ops->barrier(comm) == SL_OK, "barrier");
    if (s->linger_ms) usleep((useconds_t)s->linger_ms * 1000);
    ops->fini(comm);
  }
  return 0;
}

static pid_t spawn_rank(const rank_spec *s) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(60); /* never outlive the test long */
    _exit(rank_main(s));
  }
  return pid;
}

static void run_ranks(const rank_spec *specs, int n, double deadline_ms) {
  NEED_GLOO();
  pid_t pids[16];
  for (int i = 0; i < n; i++) pids[i] = spawn_rank(&specs[i]);
  int bad = 0;
  for (int i = 0; i < n; i++) bad += reap(pids[i], deadline_ms) != 0;
  assert_int_equal(bad, 0);
}

/* Rank 0 of a world of WORLD that waits (in vain, unless a test plays the other ranks) for
 * the others; the test talks to its store meanwhile. */
static pid_t serve(int port, int world, int timeout_ms) {
  rank_spec s = {.rank = 0, .world = world, .timeout_ms = timeout_ms, .port = port, .expect = SL_ERR_TIMEOUT};
  return spawn_rank(&s);
}

/* ---- a client speaking the store's protocol by hand ------------------------------------------ */

static const char kProto[] = "3"; /* tcp_store_wire.h: kProtocol */
enum { OP_HELLO = 1, OP_SET = 2, OP_GET = 3, OP_CHECK = 4, OP_WAIT = 5, OP_AUTH = 6, OP_ADD = 7 };
enum { ST_OK = 0, ST_MISSING = 1, ST_TIMEOUT = 2, ST_BAD = 3, ST_DENIED = 4, ST_CONFLICT = 5, ST_TOOBIG = 6 };

typedef struct field {
  const void *p;
  size_t n;
} field;

typedef struct reply {
  int status; /* -1: the connection closed (or failed) first, -2: no answer in time */
  int n;
  unsigned char *f[4];
  size_t len[4];
} reply;

static void put32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}
static uint32_t get32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* One frame: malloc'd, its size in *LEN. */
static unsigned char *frame(int op, const field *f, int nf, size_t *len) {
  size_t body = 5;
  for (int i = 0; i < nf; i++) body += 4 + f[i].n;
  unsigned char *b = malloc(4 + body), *p = b;
  assert_non_null(b);
  put32(p, (uint32_t)body);
  p[4] = (unsigned char)op;
  put32(p + 5, (uint32_t)nf);
  p += 9;
  for (int i = 0; i < nf; i++) {
    put32(p, (uint32_t)f[i].n);
    if (f[i].n) memcpy(p + 4, f[i].p, f[i].n);
    p += 4 + f[i].n;
  }
  *len = 4 + body;
  return b;
}

static int send_all(int fd, const void *buf, size_t n) {
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

static int send_frame(int fd, int op, const field *f, int nf) {
  size_t len;
  unsigned char *b = frame(op, f, nf, &len);
  int rc = send_all(fd, b, len);
  free(b);
  return rc;
}

/* Reads exactly N bytes within DEADLINE; 0, -1 (closed or failed) or -2 (time). */
static int recv_all(int fd, void *buf, size_t n, double deadline) {
  char *p = buf;
  while (n) {
    struct pollfd pfd = {fd, POLLIN, 0};
    int left = (int)(deadline - now_ms());
    if (left <= 0) return -2;
    if (poll(&pfd, 1, left) <= 0) continue;
    ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static void reply_free(reply *r) {
  for (int i = 0; i < r->n; i++) free(r->f[i]);
  r->n = 0;
}

static reply recv_reply(int fd, int timeout_ms) {
  reply r = {0};
  double end = now_ms() + timeout_ms;
  unsigned char hdr[9];
  int rc = recv_all(fd, hdr, 9, end);
  if (rc) {
    r.status = rc;
    return r;
  }
  uint32_t body = get32(hdr), count = get32(hdr + 5);
  assert_true(body >= 5 && count <= 4);
  r.status = hdr[4];
  for (uint32_t i = 0; i < count; i++) {
    unsigned char l[4];
    assert_int_equal(recv_all(fd, l, 4, end), 0);
    r.len[i] = get32(l);
    r.f[i] = malloc(r.len[i] + 1);
    assert_non_null(r.f[i]);
    assert_int_equal(recv_all(fd, r.f[i], r.len[i], end), 0);
    r.f[i][r.len[i]] = 0;
    r.n++;
  }
  return r;
}

/* A TCP connection to HOST:PORT, retrying until rank 0 listens; -1 after TIMEOUT_MS. */
static int dial(const char *host, int port, int timeout_ms) {
  double end = now_ms() + timeout_ms;
  while (now_ms() < end) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &a.sin_addr);
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

static void derive_key(const char *token, unsigned char key[32]) {
  static const char label[] = "shardload rendezvous key v2"; /* and its NUL */
  size_t n = token ? strlen(token) : 0;
  unsigned char *in = malloc(sizeof label + n + 1);
  memcpy(in, label, sizeof label);
  if (n) memcpy(in + sizeof label, token, n);
  crypto_generichash(key, 32, in, sizeof label + n, NULL, 0);
  free(in);
}

static void mac(const unsigned char key[32], char role, int rank, int world, const unsigned char *cn,
                const unsigned char *sn, unsigned char out[32]) {
  unsigned char t[16 + 1 + 8 + 64];
  memcpy(t, "shardload-rdzv/", 15);
  t[15] = (unsigned char)kProto[0];
  t[16] = (unsigned char)role;
  put32(t + 17, (uint32_t)rank);
  put32(t + 21, (uint32_t)world);
  memcpy(t + 25, cn, 32);
  memcpy(t + 57, sn, 32);
  crypto_auth_hmacsha256(out, t, sizeof t, key);
}

/* The handshake as rank RANK of WORLD with TOKEN (NULL: none): the status of the answer to
 * AUTH, or -3 when the server's proof is wrong. MSG receives the answer's text, if any. */
static int handshake(int fd, const char *token, int rank, int world, char *msg, size_t msgsize) {
  unsigned char key[32], cn[32], p[32];
  derive_key(token, key);
  randombytes_buf(cn, sizeof cn);
  char r[16], w[16];
  snprintf(r, sizeof r, "%d", rank);
  snprintf(w, sizeof w, "%d", world);
  field hello[4] = {{kProto, 1}, {r, strlen(r)}, {w, strlen(w)}, {cn, 32}};
  if (send_frame(fd, OP_HELLO, hello, 4)) return -1;
  reply a = recv_reply(fd, 5000);
  if (a.status != ST_OK) {
    reply_free(&a);
    return a.status;
  }
  assert_int_equal(a.n, 2);
  assert_int_equal(a.len[0], 32);
  unsigned char sp[32];
  mac(key, 'S', rank, world, cn, a.f[0], sp);
  if (a.len[1] != 32 || sodium_memcmp(sp, a.f[1], 32) != 0) {
    reply_free(&a);
    return -3;
  }
  mac(key, 'C', rank, world, cn, a.f[0], p);
  reply_free(&a);
  field auth[1] = {{p, 32}};
  if (send_frame(fd, OP_AUTH, auth, 1)) return -1;
  reply b = recv_reply(fd, 5000);
  if (msg && msgsize) snprintf(msg, msgsize, "%s", b.n ? (char *)b.f[0] : "");
  reply_free(&b);
  return b.status;
}

/* A client authenticated as RANK of WORLD with TOKEN, retrying while rank 0 starts. */
static int join_as(int port, const char *token, int rank, int world) {
  double end = now_ms() + 10000;
  while (now_ms() < end) {
    int fd = dial("127.0.0.1", port, 10000);
    assert_true(fd >= 0);
    int st = handshake(fd, token, rank, world, NULL, 0);
    if (st == ST_OK) return fd;
    close(fd);
    usleep(50000);
  }
  fail_msg("could not join as rank %d", rank);
  return -1;
}

static int set_key(int fd, const char *key, const void *value, size_t n) {
  field f[2] = {{key, strlen(key)}, {value, n}};
  if (send_frame(fd, OP_SET, f, 2)) return -1;
  reply r = recv_reply(fd, 5000);
  reply_free(&r);
  return r.status;
}

static int get_key(int fd, const char *key) {
  field f[1] = {{key, strlen(key)}};
  if (send_frame(fd, OP_GET, f, 1)) return -1;
  reply r = recv_reply(fd, 5000);
  reply_free(&r);
  return r.status;
}

/* ADD [KEY, DELTA]: the status, and the sum (an OK's field) or the reason into OUT. */
static int add_key(int fd, const char *key, const char *delta, char *out, size_t size) {
  field f[2] = {{key, strlen(key)}, {delta, strlen(delta)}};
  if (send_frame(fd, OP_ADD, f, 2)) return -1;
  reply r = recv_reply(fd, 5000);
  snprintf(out, size, "%s", r.n ? (char *)r.f[0] : "");
  reply_free(&r);
  return r.status;
}

/* Whether the server closed FD within TIMEOUT_MS without sending a byte. */
static bool closed_unanswered(int fd, int timeout_ms) {
  char c;
  int rc = recv_all(fd, &c, 1, now_ms() + timeout_ms);
  return rc == -1;
}

/* ---- authentication --------------------------------------------------------------------------- */

/* Before its handshake a client gets nothing: a GET or SET is answered by a hang-up, and an
 * idle one is dropped after the handshake deadline. */
static void test_unauthenticated_served_nothing(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port();
  pid_t r0 = serve(port, 2, 8000);

  int fd = dial("127.0.0.1", port, 10000);
  assert_true(fd >= 0);
  field get[1] = {{"test//sl_join/0", 15}};
  assert_int_equal(send_frame(fd, OP_GET, get, 1), 0);
  assert_true(closed_unanswered(fd, 2000));
  close(fd);

  fd = dial("127.0.0.1", port, 10000);
  field set[2] = {{"planted", 7}, {"x", 1}};
  assert_int_equal(send_frame(fd, OP_SET, set, 2), 0);
  assert_true(closed_unanswered(fd, 2000));
  close(fd);

  int idle = dial("127.0.0.1", port, 10000);
  double t0 = now_ms();
  assert_true(closed_unanswered(idle, 6000));
  double took = now_ms() - t0;
  close(idle);
  print_message("idle unauthenticated client dropped after %.0f ms\n", took);
  assert_true(took > 2500 && took < 4500); /* min(timeout, 3 s) */

  int ok = join_as(port, NULL, 1, 2);
  assert_int_equal(get_key(ok, "planted"), ST_MISSING);
  close(ok);
  stop(r0);
}

/* Different tokens: the rank that meets a store without its token says so at once; rank 0
 * times out naming that rank and why. A rank without a token meets a store with one alike. */
static void test_wrong_token(void **state) {
  int port = sl_test_free_port();
  rank_spec s[2] = {
      {.rank = 0, .world = 2, .timeout_ms = 2500, .port = port, .token = kTokenA, .expect = SL_ERR_TIMEOUT,
       .want = {"waiting for rank 1", "claiming rank 1", "SHARDLOAD_TOKEN"}, .max_ms = 4500},
      {.rank = 1, .world = 2, .timeout_ms = 2500, .port = port, .token = kTokenB, .delay_ms = 200,
       .expect = SL_ERR_INVALID, .want = {"did not prove the job's token", "SHARDLOAD_TOKEN"}, .max_ms = 1500},
  };
  run_ranks(s, 2, 20000);
  s[0].port = s[1].port = sl_test_free_port();
  s[1].token = NULL;
  run_ranks(s, 2, 20000);
  /* the same token on both: a job */
  s[0].port = s[1].port = sl_test_free_port();
  s[0].token = s[1].token = kTokenA;
  s[0].expect = s[1].expect = SL_OK;
  memset(s[0].want, 0, sizeof s[0].want);
  memset(s[1].want, 0, sizeof s[1].want);
  run_ranks(s, 2, 20000);
}

/* A client with the wrong key is refused by the server too (its proof fails), and learns
 * nothing it could replay: the server's proof is bound to the client's nonce. */
static void test_wrong_client_proof_refused(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port();
  pid_t r0 = spawn_rank(&(rank_spec){.rank = 0, .world = 2, .timeout_ms = 6000, .port = port, .token = kTokenA,
                                     .expect = SL_ERR_TIMEOUT});
  int fd = dial("127.0.0.1", port, 10000);
  assert_true(fd >= 0);
  /* the server's proof fails under our key (-3): answer anyway with our own proof */
  unsigned char key[32], cn[32];
  derive_key(kTokenB, key);
  randombytes_buf(cn, sizeof cn);
  field hello[4] = {{kProto, 1}, {"1", 1}, {"2", 1}, {cn, 32}};
  assert_int_equal(send_frame(fd, OP_HELLO, hello, 4), 0);
  reply a = recv_reply(fd, 5000);
  assert_int_equal(a.status, ST_OK);
  unsigned char p[32];
  mac(key, 'C', 1, 2, cn, a.f[0], p);
  reply_free(&a);
  field auth[1] = {{p, 32}};
  assert_int_equal(send_frame(fd, OP_AUTH, auth, 1), 0);
  reply b = recv_reply(fd, 5000);
  assert_int_equal(b.status, ST_DENIED);
  reply_free(&b);
  assert_true(closed_unanswered(fd, 2000));
  close(fd);
  /* with the right token it joins */
  fd = join_as(port, kTokenA, 1, 2);
  close(fd);
  stop(r0);
}

/* Token sources: the file must be private, both variables at once is an error, a short
 * secret is refused. Checked before anything touches the network. */
static void test_token_sources(void **state) {
  NEED_GLOO();
  const sl_collective_ops *ops = gloo_ops();
  char *dir = sl_test_dir("token");
  char *path = sl_test_path(dir, "token");
  assert_int_equal(sl_test_write_bytes(path, "0123456789abcdef-long-enough\n", 29), 0);
  assert_int_equal(chmod(path, 0644), 0);
  sl_collective_init in = {.size = sizeof in, .host = &g_host, .rank = 1, .world_size = 2,
                           .rendezvous = "tcp://127.0.0.1:1", .prefix = "t/", .timeout_ms = 300};
  void *comm = NULL;

  setenv("SHARDLOAD_TOKEN_FILE", path, 1);
  assert_int_equal(ops->init(&in, &comm), SL_ERR_INVALID);
  assert_non_null(strstr(g_msg, "chmod 600"));
  assert_non_null(strstr(g_msg, path));

  setenv("SHARDLOAD_TOKEN", kTokenA, 1);
  assert_int_equal(ops->init(&in, &comm), SL_ERR_INVALID);
  assert_non_null(strstr(g_msg, "SHARDLOAD_TOKEN and SHARDLOAD_TOKEN_FILE"));
  unsetenv("SHARDLOAD_TOKEN_FILE");

  setenv("SHARDLOAD_TOKEN", "short", 1);
  assert_int_equal(ops->init(&in, &comm), SL_ERR_INVALID);
  assert_non_null(strstr(g_msg, "at least 16"));
  unsetenv("SHARDLOAD_TOKEN");

  /* a private file passes (and the rank goes on to look for rank 0, which is not there) */
  assert_int_equal(chmod(path, 0600), 0);
  setenv("SHARDLOAD_TOKEN_FILE", path, 1);
  assert_int_equal(ops->init(&in, &comm), SL_ERR_TIMEOUT);
  unsetenv("SHARDLOAD_TOKEN_FILE");
  assert_null(comm);
  free(path);
  free(dir);
}

/* A file token and an env token holding the same secret make one job. */
static void test_token_file_job(void **state) {
  NEED_GLOO();
  char *dir = sl_test_dir("tokenjob");
  char *path = sl_test_path(dir, "token");
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "%s\n", kTokenA);
  fclose(f);
  assert_int_equal(chmod(path, 0600), 0);
  int port = sl_test_free_port();
  rank_spec s[2] = {{.rank = 0, .world = 2, .timeout_ms = 5000, .port = port, .token = kTokenA},
                    {.rank = 1, .world = 2, .timeout_ms = 5000, .port = port}};
  setenv("SHARDLOAD_TOKEN_FILE", path, 1); /* rank 1 inherits it; rank_main unsets it for rank 0 */
  pid_t p0 = spawn_rank(&s[0]);
  fflush(NULL);
  pid_t p1 = fork();
  if (p1 == 0) {
    alarm(60);
    g_rank = 1;
    const sl_collective_ops *ops = gloo_ops();
    unsetenv("SHARDLOAD_TOKEN");
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    sl_collective_init in = {.size = sizeof in, .host = &g_host, .rank = 1, .world_size = 2,
                             .rendezvous = url, .prefix = "test/", .timeout_ms = 5000};
    void *comm = NULL;
    CHECK(ops->init(&in, &comm) == SL_OK, "init");
    CHECK(ops->barrier(comm) == SL_OK, "barrier");
    ops->fini(comm);
    _exit(0);
  }
  unsetenv("SHARDLOAD_TOKEN_FILE");
  assert_int_equal(reap(p0, 20000), 0);
  assert_int_equal(reap(p1, 20000), 0);
  free(path);
  free(dir);
}

/* ---- binding and the loopback rule ------------------------------------------------------------ */

/* tcp://127.0.0.1:PORT is reachable on 127.0.0.1 only: not on 127.0.0.2 (also this machine). */
static void test_binds_named_address_only(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port();
  pid_t r0 = serve(port, 2, 6000);
  int fd = dial("127.0.0.1", port, 10000);
  assert_true(fd >= 0);
  close(fd);
  int other = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.2", &a.sin_addr);
  int rc = connect(other, (struct sockaddr *)&a, sizeof a);
  int err = errno;
  close(other);
  stop(r0);
  assert_int_equal(rc, -1);
  assert_int_equal(err, ECONNREFUSED);
}

/* A non-loopback address of this machine (IPv4), or NULL. */
static const char *local_address(void) {
  static char buf[INET_ADDRSTRLEN];
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) return NULL;
  const char *out = NULL;
  for (struct ifaddrs *i = ifs; i && !out; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    struct sockaddr_in *a = (struct sockaddr_in *)i->ifa_addr;
    if ((ntohl(a->sin_addr.s_addr) >> 24) == 127) continue;
    out = inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
  }
  freeifaddrs(ifs);
  return out;
}

/* Without a token a non-loopback rendezvous is refused on every rank, saying how to set one
 * and how to opt out; with the opt-out (or a token) it goes ahead. 198.51.100.1 (TEST-NET-2)
 * is nobody's: going ahead there, rank 0 finds it is not an address of this machine. */
static void test_non_loopback_needs_token(void **state) {
  int port = sl_test_free_port();
  rank_spec s[2] = {
      {.rank = 0, .world = 2, .timeout_ms = 800, .host = "198.51.100.1", .port = port, .expect = SL_ERR_INVALID,
       .want = {"SHARDLOAD_TOKEN", "SHARDLOAD_INSECURE_RENDEZVOUS=1", "torchrun", "srun"}, .max_ms = 500},
      {.rank = 1, .world = 2, .timeout_ms = 800, .host = "198.51.100.1", .port = port, .expect = SL_ERR_INVALID,
       .want = {"SHARDLOAD_TOKEN_FILE", "SHARDLOAD_INSECURE_RENDEZVOUS=1", "198.51.100.1"}, .max_ms = 500},
  };
  run_ranks(s, 2, 20000);
  /* opted out, or with a token: rank 0 gets as far as binding, and names the host */
  rank_spec t = {.rank = 0, .world = 2, .timeout_ms = 800, .host = "198.51.100.1", .port = port,
                 .insecure = "1", .expect = SL_ERR_COMM,
                 .want = {"198.51.100.1", "not an address of this machine", "MASTER_ADDR"}, .max_ms = 500};
  run_ranks(&t, 1, 20000);
  t.insecure = NULL;
  t.token = kTokenA;
  run_ranks(&t, 1, 20000);

  /* a real job on this machine's own non-loopback address, where it has one */
  const char *addr = local_address();
  if (!addr) return;
  print_message("non-loopback job on %s\n", addr);
  rank_spec u[2] = {{.rank = 0, .world = 2, .timeout_ms = 5000, .host = addr, .port = sl_test_free_port(), .insecure = "1"},
                    {.rank = 1, .world = 2, .timeout_ms = 5000, .host = addr, .insecure = "1"}};
  u[1].port = u[0].port;
  run_ranks(u, 2, 20000);
  u[0].port = u[1].port = sl_test_free_port();
  u[0].insecure = u[1].insecure = NULL;
  u[0].token = u[1].token = kTokenB;
  run_ranks(u, 2, 20000);
}

/* ---- one rank number, one process -------------------------------------------------------------- */

/* Rank 1 started twice: the second is refused naming where the first came from, and every
 * rank of the job fails with that message, in moments rather than at the timeout: those
 * waiting to join, and rank 2, which arrives after the conflict (rank 0's store lingers for
 * its failed-init grace, 2 s, to tell it; a rank later than that finds no store and times
 * out). Rank 0's init returns after that grace. */
static void test_duplicate_rank(void **state) {
  int port = sl_test_free_port();
  rank_spec s[4] = {
      {.rank = 0, .world = 3, .timeout_ms = 6000, .port = port},
      {.rank = 1, .world = 3, .timeout_ms = 6000, .port = port, .delay_ms = 100},
      {.rank = 1, .world = 3, .timeout_ms = 6000, .port = port, .delay_ms = 300},
      {.rank = 2, .world = 3, .timeout_ms = 6000, .port = port, .delay_ms = 800},
  };
  for (int i = 0; i < 4; i++) {
    s[i].expect = SL_ERR_INVALID;
    s[i].want[0] = "rank 1 was started twice";
    s[i].want[1] = "first from 127.0.0.1:";
    s[i].max_ms = i == 0 ? 3500 : 2000;
  }
  run_ranks(s, 4, 30000);
}

/* A duplicate rank that arrives after every rank joined (the job loads) makes rank 0's
 * store linger for the failed-start grace (2 s), not for the whole timeout at fini. */
static void test_late_duplicate_does_not_hold_rank0(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port();
  rank_spec s[2] = {
      {.rank = 0, .world = 2, .timeout_ms = 20000, .port = port, .linger_ms = 2500, .expect = SL_OK},
      {.rank = 1, .world = 2, .timeout_ms = 20000, .port = port, .linger_ms = 2500, .expect = SL_OK},
  };
  pid_t pids[2] = {spawn_rank(&s[0]), spawn_rank(&s[1])};
  usleep(1500 * 1000); /* both have joined and passed their barrier by now */
  int fd = dial("127.0.0.1", port, 5000);
  assert_true(fd >= 0);
  char msg[512] = "";
  int st = handshake(fd, NULL, 1, 2, msg, sizeof msg);
  close(fd);
  assert_int_equal(st, ST_CONFLICT);
  /* Rank 0 finishes at about 2.5 s plus the 2 s grace; the timeout would keep it 20 s more. */
  assert_int_equal(reap(pids[1], 10000), 0);
  assert_int_equal(reap(pids[0], 8000), 0);
}

/* A client of another protocol version (version 1 sent two fields) is told to run the same
 * version rather than dropped unanswered. */
static void test_other_version_refused(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port();
  pid_t r0 = serve(port, 2, 5000);
  int fd = dial("127.0.0.1", port, 10000);
  assert_true(fd >= 0);
  field hello[2] = {{"1", 1}, {"0", 1}};
  assert_int_equal(send_frame(fd, OP_HELLO, hello, 2), 0);
  reply r = recv_reply(fd, 5000);
  close(fd);
  stop(r0);
  assert_int_equal(r.status, ST_DENIED);
  assert_int_equal(r.n, 1);
  assert_non_null(strstr((char *)r.f[0], "run the same shardload version"));
  reply_free(&r);
}

/* ---- the counter the rendezvous counts its ranks with ------------------------------------------ */

/* ADD keeps a decimal counter: a missing key counts from 0, a delta of 0 reads it. A key that
 * holds no integer, or a sum that would overflow, is refused (the connection stays usable); a
 * delta that is no integer is a hang-up. */
static void test_add_counter(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port();
  pid_t r0 = serve(port, 2, 10000);
  int fd = join_as(port, NULL, 1, 2);
  char v[256];
  assert_int_equal(add_key(fd, "n", "1", v, sizeof v), ST_OK);
  assert_string_equal(v, "1");
  assert_int_equal(add_key(fd, "n", "41", v, sizeof v), ST_OK);
  assert_string_equal(v, "42");
  assert_int_equal(add_key(fd, "n", "0", v, sizeof v), ST_OK);
  assert_string_equal(v, "42");
  assert_int_equal(add_key(fd, "n", "-50", v, sizeof v), ST_OK);
  assert_string_equal(v, "-8");
  assert_int_equal(add_key(fd, "fresh", "0", v, sizeof v), ST_OK);
  assert_string_equal(v, "0");
  assert_int_equal(set_key(fd, "text", "abc", 3), ST_OK);
  assert_int_equal(add_key(fd, "text", "1", v, sizeof v), ST_BAD);
  assert_non_null(strstr(v, "not an integer"));
  assert_int_equal(add_key(fd, "big", "9223372036854775807", v, sizeof v), ST_OK);
  assert_int_equal(add_key(fd, "big", "1", v, sizeof v), ST_BAD);
  assert_non_null(strstr(v, "overflow"));
  assert_int_equal(add_key(fd, "big", "0", v, sizeof v), ST_OK); /* unchanged, and still served */
  assert_string_equal(v, "9223372036854775807");
  assert_int_equal(add_key(fd, "n", "0", v, sizeof v), ST_OK);
  assert_string_equal(v, "-8");
  field f[2] = {{"n", 1}, {"one", 3}};
  assert_int_equal(send_frame(fd, OP_ADD, f, 2), 0);
  assert_true(closed_unanswered(fd, 3000));
  close(fd);
  stop(r0);
}

/* ---- bounds ------------------------------------------------------------------------------------- */

static long rss_kib(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld", &kib) == 1) break;
  if (f) fclose(f);
  return kib;
}

/* CPU time (user + system) of PID in milliseconds. */
static double cpu_ms(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* fields after the command name */
  assert_non_null(p);
  unsigned long ut = 0, st = 0;
  /* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
  assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st), 2);
  return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

/* Pipelined GETs of a large value from a client that never reads its answers must not grow
 * rank 0: its unsent replies are capped, and it stops reading that client. */
static void test_pipelined_gets_bounded(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port();
  pid_t r0 = serve(port, 2, 10000);
  int fd = join_as(port, NULL, 1, 2);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  size_t big = 200u << 10;
  char *value = malloc(big);
  memset(value, 'v', big);
  assert_int_equal(set_key(fd, "big", value, big), ST_OK);
  free(value);
  usleep(200000);
  long before = rss_kib(r0);
  size_t len;
  field f[1] = {{"big", 3}};
  unsigned char *one = frame(OP_GET, f, 1, &len);
  int n = 2000;
  unsigned char *all = malloc(len * (size_t)n);
  for (int i = 0; i < n; i++) memcpy(all + (size_t)i * len, one, len);
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  size_t off = 0;
  double end = now_ms() + 2000;
  while (off < len * (size_t)n && now_ms() < end) {
    ssize_t w = send(fd, all + off, len * (size_t)n - off, MSG_NOSIGNAL);
    if (w > 0) off += (size_t)w;
    else usleep(10000);
  }
  usleep(1000000);
  long after = rss_kib(r0);
  print_message("rank 0 RSS %ld KiB before %d pipelined GETs of %zu KiB, %ld KiB after (%zu bytes of them sent)\n",
                before, n, big >> 10, after, off);
  free(one);
  free(all);
  close(fd);
  stop(r0);
  assert_true(before > 0 && after > 0);
  assert_true(after - before < 16 * 1024);
}

/* A value past the limit for the job's size is refused (and the connection stays usable); a
 * frame past the largest one is a hang-up. */
static void test_oversized_value_refused(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port();
  pid_t r0 = serve(port, 2, 10000);
  int fd = join_as(port, NULL, 1, 2);
  size_t limit = 192 * 2 + (256u << 10); /* tcp_store.h: 192 x W + 256 KiB */
  char *value = calloc(1, limit + (128u << 10));
  assert_int_equal(set_key(fd, "fits", value, limit), ST_OK);
  assert_int_equal(set_key(fd, "too-big", value, limit + 1), ST_TOOBIG);
  assert_int_equal(get_key(fd, "too-big"), ST_MISSING);
  assert_int_equal(get_key(fd, "fits"), ST_OK);
  /* past the largest frame: the server hangs up */
  field f[2] = {{"huge", 4}, {value, limit + (128u << 10)}};
  assert_int_equal(send_frame(fd, OP_SET, f, 2), 0);
  assert_true(closed_unanswered(fd, 3000));
  close(fd);
  free(value);
  stop(r0);
}

/* The store fills up: SETs past its total are refused. */
static void test_store_total_bounded(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port();
  pid_t r0 = serve(port, 2, 10000);
  int fd = join_as(port, NULL, 1, 2);
  size_t chunk = 200u << 10;
  char *value = calloc(1, chunk);
  int refused = -1;
  for (int i = 0; i < 64 && refused < 0; i++) { /* 12.5 MiB would pass the 4 MiB of W = 2 */
    char key[32];
    snprintf(key, sizeof key, "k%d", i);
    int st = set_key(fd, key, value, chunk);
    if (st == ST_TOOBIG) refused = i;
    else if (st != ST_OK) fail_msg("SET %d: %d", i, st);
  }
  print_message("SET refused after %d values of %zu KiB\n", refused, chunk >> 10);
  assert_true(refused >= 15 && refused <= 22); /* 4 MiB + 32 KiB + 768 bytes */
  free(value);
  close(fd);
  stop(r0);
}

/* A flood of connections: past the pending-handshake cap they are closed at once, and those
 * kept are dropped at the handshake deadline. A real rank still joins afterwards. */
static void test_connection_flood(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port();
  pid_t r0 = serve(port, 2, 10000);
  int probe = dial("127.0.0.1", port, 10000);
  assert_true(probe >= 0);
  close(probe);
  enum { N = 100 };
  int fds[N];
  for (int i = 0; i < N; i++) fds[i] = dial("127.0.0.1", port, 2000);
  /* well before the handshake deadline (3 s) */
  int closed = 0;
  for (double end = now_ms() + 2000; closed < N - 16 && now_ms() < end; usleep(50000)) {
    closed = 0;
    for (int i = 0; i < N; i++) {
      struct pollfd p = {fds[i], POLLIN, 0};
      char c;
      if (fds[i] >= 0 && poll(&p, 1, 0) == 1 && recv(fds[i], &c, 1, MSG_DONTWAIT | MSG_PEEK) <= 0) closed++;
    }
  }
  print_message("%d of %d unauthenticated connections closed at once\n", closed, N);
  assert_true(closed >= N - 16);
  /* those kept are dropped by the handshake deadline (3 s) */
  double end = now_ms() + 5000;
  int open_left = N;
  while (now_ms() < end && open_left) {
    open_left = 0;
    for (int i = 0; i < N; i++) {
      if (fds[i] < 0) continue;
      char c;
      ssize_t r = recv(fds[i], &c, 1, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        close(fds[i]);
        fds[i] = -1;
      } else {
        open_left++;
      }
    }
    usleep(50000);
  }
  for (int i = 0; i < N; i++)
    if (fds[i] >= 0) close(fds[i]);
  assert_int_equal(open_left, 0);
  int fd = join_as(port, NULL, 1, 2);
  close(fd);
  stop(r0);
}

/* Out of descriptors, accept() fails with EMFILE while connections wait: rank 0 must not spin
 * on a listener it cannot empty. Its CPU time over a second must stay small. */
static void test_accept_emfile_no_spin(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port();
  fflush(NULL);
  pid_t r0 = fork();
  assert_true(r0 >= 0);
  if (r0 == 0) {
    alarm(60);
    /* descriptors 0-2, and room for init's own (listener, wake-up pipe, its client and the
     * server's end of it, maybe /dev/urandom) and a few more; whatever the test process
     * inherited above 2 is closed, so the limit counts from there */
    for (int fd = 3; fd < 1024; fd++) close(fd);
    struct rlimit lim = {12, 12};
    CHECK(setrlimit(RLIMIT_NOFILE, &lim) == 0, "setrlimit");
    rank_spec s = {.rank = 0, .world = 2, .timeout_ms = 8000, .port = port, .expect = SL_ERR_TIMEOUT};
    _exit(rank_main(&s));
  }
  int probe = dial("127.0.0.1", port, 10000);
  assert_true(probe >= 0);
  close(probe);
  enum { N = 24 };
  int fds[N];
  for (int i = 0; i < N; i++) fds[i] = dial("127.0.0.1", port, 1000);
  usleep(200000);
  double c0 = cpu_ms(r0), t0 = now_ms();
  usleep(1000000);
  double used = cpu_ms(r0) - c0, wall = now_ms() - t0;
  print_message("rank 0 used %.0f ms of CPU in %.0f ms with connections it cannot accept\n", used, wall);
  for (int i = 0; i < N; i++)
    if (fds[i] >= 0) close(fds[i]);
  stop(r0);
  assert_true(used < 200);
}

/* A client reset while its WAIT is parked is a closed connection: rank 0 does not spin on the
 * hang-up poll keeps reporting. */
static void test_reset_waiter_no_spin(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port();
  pid_t r0 = serve(port, 2, 8000);
  int fd = join_as(port, NULL, 1, 2);
  field wait[2] = {{"60000", 5}, {"never", 5}};
  assert_int_equal(send_frame(fd, OP_WAIT, wait, 2), 0);
  usleep(200000);
  struct linger hard = {1, 0}; /* close with a reset */
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
  close(fd);
  usleep(200000);
  double c0 = cpu_ms(r0), t0 = now_ms();
  usleep(1000000);
  double used = cpu_ms(r0) - c0, wall = now_ms() - t0;
  print_message("rank 0 used %.0f ms of CPU in %.0f ms after a waiting client reset\n", used, wall);
  stop(r0);
  assert_true(used < 200);
}

/* ---- Gloo's connect phase honours the timeout -------------------------------------------------- */

/* A fake rank 1 joins and publishes a Gloo address nobody will ever connect from (on
 * 127.0.0.2, so rank 0 is the pair's listening side and waits for it): rank 0's init must
 * fail within its timeout, not Gloo's 5x. */
static void test_connect_phase_timeout(void **state) {
  NEED_GLOO();
  int port = sl_test_free_port();
  int timeout = 1500;
  rank_spec s = {.rank = 0, .world = 2, .timeout_ms = timeout, .port = port, .expect = SL_ERR_TIMEOUT,
                 .want = {"connecting to the other ranks"}, .max_ms = timeout + 700};
  pid_t r0 = spawn_rank(&s);
  int fd = join_as(port, NULL, 1, 2);
  /* what Gloo's tcp transport publishes per pair: a sockaddr_storage and a sequence number */
  unsigned char addr[sizeof(struct sockaddr_storage) + sizeof(ssize_t)];
  memset(addr, 0, sizeof addr);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9)};
  inet_pton(AF_INET, "127.0.0.2", &a.sin_addr);
  memcpy(addr, &a, sizeof a);
  ssize_t seq = 1;
  memcpy(addr + sizeof(struct sockaddr_storage), &seq, sizeof seq);
  assert_int_equal(set_key(fd, "test//sl_join/1", "fake", 4), ST_OK);
  assert_int_equal(set_key(fd, "test//1", addr, sizeof addr), ST_OK);
  close(fd); /* so rank 0's failed init need not wait for this client to let go of the store */
  int rc = reap(r0, 5.0 * timeout + 10000);
  assert_int_equal(rc, 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  if (sodium_init() < 0) return 1;
  if (getenv("SL_TEST_FILTER")) cmocka_set_test_filter(getenv("SL_TEST_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unauthenticated_served_nothing),
      cmocka_unit_test(test_wrong_token),
      cmocka_unit_test(test_wrong_client_proof_refused),
      cmocka_unit_test(test_token_sources),
      cmocka_unit_test(test_token_file_job),
      cmocka_unit_test(test_binds_named_address_only),
      cmocka_unit_test(test_non_loopback_needs_token),
      cmocka_unit_test(test_duplicate_rank),
      cmocka_unit_test(test_late_duplicate_does_not_hold_rank0),
      cmocka_unit_test(test_other_version_refused),
      cmocka_unit_test(test_add_counter),
      cmocka_unit_test(test_pipelined_gets_bounded),
      cmocka_unit_test(test_oversized_value_refused),
      cmocka_unit_test(test_store_total_bounded),
      cmocka_unit_test(test_connection_flood),
      cmocka_unit_test(test_accept_emfile_no_spin),
      cmocka_unit_test(test_reset_waiter_no_spin),
      cmocka_unit_test(test_connect_phase_timeout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
