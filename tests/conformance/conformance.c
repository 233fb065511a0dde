/* The conformance suites' shared half (conformance.h). */
#define _GNU_SOURCE
#include "conformance.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "registry_v1.h"
#include "testutil.h"

/* ---- the host ------------------------------------------------------------------------------ */
static pthread_mutex_t msg_mu = PTHREAD_MUTEX_INITIALIZER;
static char msg[SL__ERRMSG_LEN];
static char msg_copy[SL__ERRMSG_LEN];

static void host_log(void *core, sl_log_level level, const char *fmt, ...) {
  if (level > SL_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "# module %s: ", level == SL_LOG_ERROR ? "error" : "warning");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static __thread bool suite_thread;
static int foreign;
static char foreign_msg[SL__ERRMSG_LEN];

void conf_suite_thread(void) { suite_thread = true; }

int conf_foreign_fails(const char **last) {
  pthread_mutex_lock(&msg_mu);
  int n = foreign;
  pthread_mutex_unlock(&msg_mu);
  if (last) *last = foreign_msg;
  return n;
}

static sl_status host_fail(void *core, sl_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&msg_mu);
  if (suite_thread) {
    vsnprintf(msg, sizeof msg, fmt, ap);
  } else { /* a module's own thread: kept apart, the caller's message is not touched */
    foreign++;
    vsnprintf(foreign_msg, sizeof foreign_msg, fmt, ap);
  }
  pthread_mutex_unlock(&msg_mu);
  va_end(ap);
  return s;
}

const sl_module_host conf_host = {sizeof(sl_module_host), NULL, host_log, host_fail};

const char *conf_msg(void) {
  pthread_mutex_lock(&msg_mu);
  memcpy(msg_copy, msg, sizeof msg_copy);
  pthread_mutex_unlock(&msg_mu);
  return msg_copy;
}

void conf_msg_clear(void) {
  pthread_mutex_lock(&msg_mu);
  msg[0] = 0;
  pthread_mutex_unlock(&msg_mu);
}

/* ---- opening a module ------------------------------------------------------------------------- */

/* A bare context: the registry uses only its message buffer and logger. */
static sl_context *bare_context(void) {
  sl_context *c = calloc(1, sizeof *c);
  if (c) {
    c->log_level = SL_LOG_WARN;
    c->world_size = 1;
  }
  return c;
}

/* DIR/libshardload-NAME.so[:VARIANT]: DIR goes first on SHARDLOAD_MODULE_PATH, M gets NAME and
 * VARIANT. */
static sl_status take_path(const char *spec, conf_module *m, char *why, size_t len) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s", spec);
  char *so = strstr(path, ".so");
  if (!so || (so[3] != 0 && so[3] != ':')) {
    snprintf(why, len, "%s: a module path ends in libshardload-NAME.so (then :VARIANT)", spec);
    return SL_ERR_INVALID;
  }
  if (so[3] == ':') snprintf(m->variant, sizeof m->variant, "%s", so + 4);
  so[3] = 0;
  char *slash = strrchr(path, '/');
  const char *file = slash ? slash + 1 : path;
  size_t n = strlen(file);
  if (strncmp(file, "libshardload-", 13) != 0 || n <= 16 || n - 16 >= sizeof m->name) {
    snprintf(why, len, "%s: not a module file name (libshardload-NAME.so)", spec);
    return SL_ERR_INVALID;
  }
  snprintf(m->name, sizeof m->name, "%.*s", (int)(n - 16), file + 13);
  char dir[PATH_MAX];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  char *real = realpath(dir, NULL);
  if (!real) {
    snprintf(why, len, "%s: no such directory", dir);
    return SL_ERR_INVALID;
  }
  const char *old = getenv("SHARDLOAD_MODULE_PATH");
  char *joined = NULL;
  if (asprintf(&joined, "%s%s%s", real, old && *old ? ":" : "", old ? old : "") < 0) joined = NULL;
  free(real);
  if (!joined) return SL_ERR_NOMEM;
  setenv("SHARDLOAD_MODULE_PATH", joined, 1);
  free(joined);
  return SL_OK;
}

/* The module's v1 entry instead of the v2 one the registry took. */
static sl_status take_v1(conf_module *m, bool collective, char *why, size_t len) {
  if (m->shim) return SL_OK; /* a v1-only module: the registry adapted it already */
  void *e1 = m->dl ? dlsym(m->dl, collective ? SL_COLLECTIVE_ENTRY_V1 : SL_BACKEND_ENTRY_V1) : NULL;
  if (!e1) {
    snprintf(why, len, "%s: exports no ABI v1 entry (%s)", m->name, collective ? SL_COLLECTIVE_ENTRY_V1 : SL_BACKEND_ENTRY_V1);
    return SL_ERR_ABI;
  }
  char problem[256];
  if (collective) {
    const sl_collective_ops_v1 *o1 = ((const sl_collective_ops_v1 *(*)(void))e1)();
    if (!sl__v1_collective_ok(o1, problem, sizeof problem)) goto bad;
    m->shim = sl__v1_collective_adapt(o1);
  } else {
    const sl_backend_ops_v1 *o1 = ((const sl_backend_ops_v1 *(*)(void))e1)();
    if (!sl__v1_backend_ok(o1, problem, sizeof problem)) goto bad;
    m->shim = sl__v1_backend_adapt(o1);
  }
  if (!m->shim) return SL_ERR_NOMEM;
  m->ops = m->shim;
  m->v1 = true;
  return SL_OK;
bad:
  snprintf(why, len, "%s: its v1 table: %s", m->name, problem);
  return SL_ERR_ABI;
}

sl_status conf_module_open(const char *spec, bool collective, bool v1, conf_module *m, char *why, size_t len) {
  memset(m, 0, sizeof *m);
  why[0] = 0;
  sl_status st = SL_OK;
  if (strchr(spec, '/') || strstr(spec, ".so")) {
    if ((st = take_path(spec, m, why, len)) != SL_OK) return st;
  } else {
    const char *colon = strchr(spec, ':');
    size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
    snprintf(m->name, sizeof m->name, "%.*s", (int)n, spec);
    if (colon) snprintf(m->variant, sizeof m->variant, "%s", colon + 1);
  }
  snprintf(m->spec, sizeof m->spec, "%s%s%s", m->name, m->variant[0] ? ":" : "", m->variant);
  sl_context *c = bare_context();
  if (!c) return SL_ERR_NOMEM;
  if (collective) {
    const sl_collective_ops *o = NULL;
    st = sl__collective_select(c, m->name, &o, &m->dl, &m->shim);
    m->ops = o;
  } else {
    const sl_backend_ops *o = NULL;
    char variant[64];
    st = sl__backend_select(c, m->spec, &o, &m->dl, &m->shim, variant, sizeof variant);
    m->ops = o;
  }
  if (st != SL_OK) snprintf(why, len, "%s", c->errmsg);
  free(c);
  if (st == SL_OK && v1) st = take_v1(m, collective, why, len);
  if (st != SL_OK) conf_module_close(m);
  else m->v1 = m->v1 || m->shim != NULL;
  return st;
}

void conf_module_close(conf_module *m) {
  free(m->shim);
  if (m->dl) dlclose(m->dl);
  m->shim = m->dl = NULL;
  m->ops = NULL;
}

sl_status conf_backend_init(const conf_module *m, int local_rank, int local_world, int timeout_ms, void **be) {
  const sl_backend_ops *o = m->ops;
  sl_backend_init in = {.size = sizeof in,
                        .host = &conf_host,
                        .local_rank = local_rank,
                        .local_world_size = local_world,
                        .device = -1,
                        .variant = m->variant[0] ? m->variant : NULL,
                        .ops = o,
                        .timeout_ms = timeout_ms};
  *be = NULL;
  return o->init(&in, be);
}

/* ---- bytes --------------------------------------------------------------------------------- */
static uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint8_t conf_byte(uint64_t seed, size_t i) { return (uint8_t)(mix(seed * 0x100000001ull + i / 8) >> (8 * (i % 8))); }

void conf_fill(void *p, size_t n, uint64_t seed, size_t start) {
  uint8_t *b = p;
  for (size_t i = 0; i < n; i++) b[i] = conf_byte(seed, start + i);
}

long conf_differs(const void *p, size_t n, uint64_t seed, size_t start) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != conf_byte(seed, start + i)) return (long)i;
  return -1;
}

long conf_not_all(const void *p, size_t n, uint8_t v) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != v) return (long)i;
  return -1;
}

/* Blanks every "WORD N" in S (and " of M" after it, for "on rank R of W"; ", N" after it, for a
 * list: "from ranks 0, 3"). */
static void blank_after(char *s, const char *word) {
  size_t wl = strlen(word);
  for (char *p = strstr(s, word); p; p = strstr(p, word)) {
    char *q = p + wl;
    if (*q < '0' || *q > '9') {
      p = q;
      continue;
    }
    while (*q >= '0' && *q <= '9') q++;
    if (strncmp(q, " of ", 4) == 0 && q[4] >= '0' && q[4] <= '9')
      for (q += 4; *q >= '0' && *q <= '9'; q++) {
      }
    while (strncmp(q, ", ", 2) == 0 && q[2] >= '0' && q[2] <= '9')
      for (q += 2; *q >= '0' && *q <= '9'; q++) {
      }
    memset(p, ' ', (size_t)(q - p));
    p = q;
  }
}

bool conf_names_rank(const char *msg, int v) {
  char s[SL__ERRMSG_LEN];
  snprintf(s, sizeof s, "%s", msg);
  blank_after(s, "on rank ");
  blank_after(s, "from rank ");
  blank_after(s, "from ranks ");
  return sl_test_names_rank(s, v);
}

double conf_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* ---- holding a stream ----------------------------------------------------------------------- */
/* The calibration, made once per process: scratch size, copies per block, synchronous. */
static struct {
  bool done;
  size_t bytes;
  unsigned n;
  bool synchronous;
} calib;

static sl_status chain(conf_blocker *k, void *stream, unsigned n) {
  for (unsigned i = 0; i < n; i++) {
    sl_status st = i % 2 ? k->o->copy_async(k->be, k->a, k->b, k->bytes, SL_COPY_D2D, stream)
                         : k->o->copy_async(k->be, k->b, k->a, k->bytes, SL_COPY_D2D, stream);
    if (st != SL_OK) return st;
  }
  return SL_OK;
}

/* Times chains of growing length on a stream of its own: how long one copy keeps the device
 * busy, and whether the enqueue itself did the work (a synchronous backend). */
static sl_status calibrate(conf_blocker *k, char *why, size_t len) {
  void *s = NULL, *ev = NULL;
  sl_status st = k->o->stream_create(k->be, &s);
  if (st == SL_OK) st = k->o->event_create(k->be, &ev);
  if (st != SL_OK) {
    snprintf(why, len, "blocker: stream or event create: %s: %s", sl_status_name(st), conf_msg());
    goto out;
  }
  /* a first chain: pending right after it was queued, or the copies ran while queued */
  if ((st = chain(k, s, 8)) == SL_OK && (st = k->o->event_record(k->be, ev, s)) == SL_OK) {
    int q = k->o->event_query(k->be, ev);
    calib.synchronous = q == 1;
    st = k->o->event_sync(k->be, ev);
  }
  for (unsigned n = 16; st == SL_OK && !calib.synchronous; n *= 2) {
    double t0 = conf_now_ms();
    if ((st = chain(k, s, n)) != SL_OK || (st = k->o->event_record(k->be, ev, s)) != SL_OK) break;
    if ((st = k->o->event_sync(k->be, ev)) != SL_OK) break;
    double ms = conf_now_ms() - t0;
    if (ms >= 40 || n >= 65536) {
      double per = ms / n;
      double want = CONF_HOLD_MS / (per > 1e-6 ? per : 1e-6);
      calib.n = want > 100000 ? 100000 : want < 1 ? 1 : (unsigned)want;
      break;
    }
  }
  if (st != SL_OK) snprintf(why, len, "blocker: calibrating copies: %s: %s", sl_status_name(st), conf_msg());
out:
  if (ev) k->o->event_destroy(k->be, ev);
  if (s) k->o->stream_destroy(k->be, s);
  return st;
}

sl_status conf_blocker_init(conf_blocker *k, const sl_backend_ops *o, void *be, char *why, size_t len) {
  memset(k, 0, sizeof *k);
  k->o = o;
  k->be = be;
  k->bytes = calib.done ? calib.bytes : (size_t)32 << 20;
  sl_status st = o->alloc_device(be, k->bytes, &k->a);
  if (st == SL_OK) st = o->alloc_device(be, k->bytes, &k->b);
  if (st != SL_OK) {
    snprintf(why, len, "blocker: alloc_device of %zu bytes: %s: %s", k->bytes, sl_status_name(st), conf_msg());
    conf_blocker_fini(k);
    return st;
  }
  if (!calib.done) {
    calib.bytes = k->bytes;
    if ((st = calibrate(k, why, len)) != SL_OK) {
      conf_blocker_fini(k);
      return st;
    }
    calib.done = true;
  }
  k->n = calib.n;
  k->synchronous = calib.synchronous;
  return SL_OK;
}

sl_status conf_block(conf_blocker *k, void *stream, void *ev) {
  sl_status st = k->synchronous ? SL_OK : chain(k, stream, k->n);
  return st == SL_OK ? k->o->event_record(k->be, ev, stream) : st;
}

void conf_blocker_fini(conf_blocker *k) {
  if (k->a || k->b) (void)k->o->synchronize(k->be); /* no block may still use the scratch (sim aborts) */
  if (k->a) k->o->free_device(k->be, k->a);
  if (k->b) k->o->free_device(k->be, k->b);
  k->a = k->b = NULL;
}
