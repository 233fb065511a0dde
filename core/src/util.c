#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

sl_status sl__fail(sl_context *ctx, sl_status s, const char *fmt, ...) {
  if (!ctx) return s;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
  va_end(ap);
  if (ctx->log && ctx->log_level >= SL_LOG_DEBUG) {
    char line[SL__ERRMSG_LEN + 64];
    snprintf(line, sizeof line, "%s: %s", sl_status_name(s), ctx->errmsg);
    ctx->log(ctx->log_user, SL_LOG_DEBUG, line);
  }
  return s;
}

void sl__log(sl_context *ctx, sl_log_level level, const char *fmt, ...) {
  if (!ctx || !ctx->log || level > ctx->log_level) return;
  char line[SL__ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
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
