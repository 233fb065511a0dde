/* The backend reference shared by a context and the states it loaded (internal.h). */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdlib.h>

#include "internal.h"

/* Reports run on any thread (a state freed by a garbage collector logs on its thread) while
 * sl_context_destroy may detach the context on another: the lock spans the use of the context,
 * the user's log callback included, so detach waits for a report in flight and none starts
 * after it (shardload.h at sl_context_options.log). */
static void ref_log(void *core, sl_log_level level, const char *fmt, ...) {
  sl__backend_ref *r = core;
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&r->mu);
  if (r->ctx) sl__vlog(r->ctx, level, fmt, ap);
  pthread_mutex_unlock(&r->mu);
  va_end(ap);
}

/* Set around a backend call made for a state on whatever thread holds it (an export's release
 * runs in a garbage collector): the module's message lands here, never in the context's buffer,
 * which belongs to the context's thread (and the context may be gone). */
static __thread char *tls_capture;
static __thread size_t tls_capture_len;

void sl__backend_ref_capture(char *buf, size_t len) {
  if (buf && len) buf[0] = 0;
  tls_capture = buf;
  tls_capture_len = len;
}

static sl_status ref_fail(void *core, sl_status s, const char *fmt, ...) {
  sl__backend_ref *r = core;
  va_list ap;
  va_start(ap, fmt);
  if (tls_capture) {
    vsnprintf(tls_capture, tls_capture_len, fmt, ap);
  } else {
    pthread_mutex_lock(&r->mu);
    if (r->ctx) sl__vfail(r->ctx, s, fmt, ap);
    pthread_mutex_unlock(&r->mu);
  }
  va_end(ap);
  return s;
}

sl__backend_ref *sl__backend_ref_new(const sl_backend_ops *ops, void *handle, void *dl, void *shim, sl_context *ctx) {
  sl__backend_ref *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  *r = (sl__backend_ref){.ops = ops, .handle = handle, .dl = dl, .shim = shim, .refs = 1,
                         .host = {sizeof(sl_module_host), NULL, ref_log, ref_fail}, .ctx = ctx};
  r->host.core = r;
  pthread_mutex_init(&r->mu, NULL);
  return r;
}

/* Waits for a report in flight on another thread (ref_log): once this returns, nothing of the
 * backend's touches the context. */
void sl__backend_ref_detach(sl__backend_ref *r) {
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  r->ctx = NULL;
  pthread_mutex_unlock(&r->mu);
}

void sl__backend_ref_get(sl__backend_ref *r) { __atomic_add_fetch(&r->refs, 1, __ATOMIC_ACQ_REL); }

void sl__backend_ref_put(sl__backend_ref *r) {
  if (!r || __atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  if (r->handle) {
    r->ops->synchronize(r->handle); /* fini's precondition: no pending work */
    r->ops->fini(r->handle);
  }
  free(r->shim);
  if (r->dl) dlclose(r->dl);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

void sl__backend_free(sl__backend_ref *r, sl_device_kind where, int pinned, void *ptr) {
  if (!r || !ptr) return;
  if (where == SL_DEVICE_ACCELERATOR) r->ops->free_device(r->handle, ptr);
  else if (pinned && (r->ops->flags & SL_BACKEND_HAS_PINNED) && SL_HAS_OP(r->ops, free_pinned))
    r->ops->free_pinned(r->handle, ptr);
  else sl__host_free(ptr);
}
