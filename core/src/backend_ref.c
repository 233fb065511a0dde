/* The backend reference shared by a context and the states it loaded (internal.h). */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdlib.h>

#include "internal.h"

static void ref_log(void *core, sl_log_level level, const char *fmt, ...) {
  sl__backend_ref *r = core;
  if (!r->ctx) return;
  va_list ap;
  va_start(ap, fmt);
  sl__vlog(r->ctx, level, fmt, ap);
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
  if (tls_capture) vsnprintf(tls_capture, tls_capture_len, fmt, ap);
  else if (r->ctx) sl__vfail(r->ctx, s, fmt, ap);
  va_end(ap);
  return s;
}

sl__backend_ref *sl__backend_ref_new(const sl_backend_ops *ops, void *handle, void *dl, void *shim, sl_context *ctx) {
  sl__backend_ref *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  *r = (sl__backend_ref){ops, handle, dl, shim, 1, {sizeof(sl_module_host), NULL, ref_log, ref_fail}, ctx};
  r->host.core = r;
  return r;
}

void sl__backend_ref_detach(sl__backend_ref *r) {
  if (r) r->ctx = NULL;
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
  free(r);
}

void sl__backend_free(sl__backend_ref *r, sl_device_kind where, int pinned, void *ptr) {
  if (!r || !ptr) return;
  if (where == SL_DEVICE_ACCELERATOR) r->ops->free_device(r->handle, ptr);
  else if (pinned && (r->ops->flags & SL_BACKEND_HAS_PINNED) && SL_HAS_OP(r->ops, free_pinned))
    r->ops->free_pinned(r->handle, ptr);
  else sl__host_free(ptr);
}
