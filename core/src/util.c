#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <jansson.h>

#include "internal.h"

sl_status sl__fail(sl_context *ctx, sl_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sl__vfail(ctx, s, fmt, ap);
  va_end(ap);
  return s;
}

/* Set by a helper thread of the core (the loader's reader) so that its failures land in its
 * own buffer: the context's message buffer belongs to the caller's thread. */
static __thread char *tls_errbuf;
static __thread size_t tls_errlen;

void sl__thread_errbuf(char *buf, size_t len) {
  tls_errbuf = buf;
  tls_errlen = len;
}

sl_status sl__vfail(sl_context *ctx, sl_status s, const char *fmt, va_list ap) {
  if (!ctx) return s;
  /* through a scratch buffer: callers may pass the previous message as an argument */
  char msg[SL__ERRMSG_LEN];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (tls_errbuf) {
    snprintf(tls_errbuf, tls_errlen, "%s", msg);
    return s; /* no logging from helper threads either: the caller's log callback is not told to expect them */
  }
  memcpy(ctx->errmsg, msg, sizeof msg);
  if (ctx->log && ctx->log_level >= SL_LOG_DEBUG) {
    char line[SL__ERRMSG_LEN + 64];
    snprintf(line, sizeof line, "%s: %s", sl_status_name(s), ctx->errmsg);
    ctx->log(ctx->log_user, SL_LOG_DEBUG, line);
  }
  return s;
}

void sl__log(sl_context *ctx, sl_log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sl__vlog(ctx, level, fmt, ap);
  va_end(ap);
}

void sl__vlog(sl_context *ctx, sl_log_level level, const char *fmt, va_list ap) {
  if (!ctx || !ctx->log || level > ctx->log_level) return;
  char line[SL__ERRMSG_LEN];
  vsnprintf(line, sizeof line, fmt, ap);
  ctx->log(ctx->log_user, level, line);
}

void sl__copy_sized(void *dst, size_t dst_size, const void *src, size_t src_size) {
  memset(dst, 0, dst_size);
  if (!src) return;
  /* A caller built against an older, shorter struct passes its own size; fields it does not
   * know stay zero, which every options struct defines as the backwards-compatible default. */
  memcpy(dst, src, src_size < dst_size ? src_size : dst_size);
  *(size_t *)dst = dst_size;
}

char *sl__strdup(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

ssize_t sl__pread_full(int fd, void *buf, size_t len, uint64_t off) {
  size_t got = 0;
  while (got < len) {
    ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

ssize_t sl__preadv_full(int fd, struct iovec *iov, int iovcnt, uint64_t off) {
  size_t got = 0;
  while (iovcnt > 0) {
    if (!iov->iov_len) {
      iov++;
      iovcnt--;
      continue;
    }
    ssize_t r = preadv(fd, iov, iovcnt, (off_t)(off + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    got += (size_t)r;
    /* consume what was read in place, so that the caller can tell after a failure how far it got */
    for (size_t n = (size_t)r; n;) {
      size_t take = n < iov->iov_len ? n : iov->iov_len;
      iov->iov_base = (char *)iov->iov_base + take;
      iov->iov_len -= take;
      n -= take;
      if (!iov->iov_len) {
        iov++;
        iovcnt--;
      }
    }
  }
  return (ssize_t)got;
}

sl_status sl__errbuf(char *err, size_t errlen, sl_status s, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return s;
}

bool sl__alloc_pairs(size_t n, char ***keys, char ***values) {
  *keys = calloc(n, sizeof(char *));
  *values = calloc(n, sizeof(char *));
  return *keys && *values;
}

void sl__free_pairs(char **keys, char **values, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (keys) free(keys[i]);
    if (values) free(values[i]);
  }
  free(keys);
  free(values);
}

/* Whether jansson's failure to read JSON was an allocation that failed, not the text: it then
 * sets no error at all (an empty text: the tree or the lexer's buffer could not be allocated)
 * or, in a later version, json_error_out_of_memory; but where a string's copy cannot be
 * allocated it reports a syntax error of valid text ("string or '}' expected"), so a failed
 * malloc (errno ENOMEM, cleared before the parse) counts too. */
static bool json_out_of_memory(const json_error_t *jerr, int saved_errno) {
  return !jerr->text[0] || json_error_code(jerr) == json_error_out_of_memory || saved_errno == ENOMEM;
}

json_t *sl__json_loadb(const char *text, size_t len, json_error_t *jerr, bool *nomem) {
  memset(jerr, 0, sizeof *jerr); /* jansson leaves the code byte unset when it sets no error */
  errno = 0;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, jerr);
  *nomem = !root && json_out_of_memory(jerr, errno);
  return root;
}

json_t *sl__json_loadf(FILE *f, json_error_t *jerr, bool *nomem) {
  memset(jerr, 0, sizeof *jerr);
  errno = 0;
  json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, jerr);
  /* a read error ends jansson's input early: a syntax error of the text read so far */
  *nomem = !root && !ferror(f) && json_out_of_memory(jerr, errno);
  return root;
}

sl_status sl__errbuf_nomem(char *err, size_t errlen, const char *doing, size_t n, const char *what) {
  return sl__errbuf(err, errlen, SL_ERR_NOMEM,
                    "out of memory %s its %zu-byte %s; free memory or raise the process's memory limit", doing, n, what);
}
