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

static sl_status ref_fail(void *core, sl_status s, const char *fmt, ...) {
  sl__backend_ref *r = core;
  if (!r->ctx) return s;
  va_list ap;
  va_start(ap, fmt);
  sl__vfail(r->ctx, s, fmt, ap);
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
