/* The context: one rank's view of the job — its backend (memory), its control and data planes
 * (planes.c), its message buffer and logger. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <pthread.h>

#include <xxhash.h>

#include "internal.h"
#include "planes.h"

/* The module host: modules report through the context's logger and message buffer. */
static void host_log(void *core, sl_log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sl__vlog(core, level, fmt, ap);
  va_end(ap);
}

static sl_status host_fail(void *core, sl_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sl__vfail(core, s, fmt, ap);
  va_end(ap);
  return s;
}

sl_module_host sl__module_host_of(sl_context *ctx) {
  return (sl_module_host){sizeof(sl_module_host), ctx, host_log, host_fail};
}

/* The launcher's job identity, so that jobs sharing a rendezvous store (a file:// directory
 * on a shared filesystem, a long-lived store) never read each other's keys. Under torchrun the
 * agent's store outlives a restart of the workers, so the restart count is part of it: the
 * workers of attempt 2 must not read the keys attempt 1 left behind. */
static const char *job_id(char *buf, size_t len) {
  const char *vars[] = {"SHARDLOAD_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid"};
  const char *id = "job";
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v && strlen(v) < 128 && !strchr(v, '/')) {
      id = v;
      break;
    }
  }
  const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
  if (restart && *restart && strlen(restart) < 12 && strspn(restart, "0123456789") == strlen(restart))
    snprintf(buf, len, "%s.r%s", id, restart);
  else
    snprintf(buf, len, "%s", id);
  return buf;
}

/* The number of this context among the process's contexts of the same world size, from 0 in
 * creation order: every rank of a job must agree on it. Counted per world size, and not at all
 * for world 1 (which meets no one), so that a context one rank makes on the side (world 1, or
 * a job of another size) does not shift the numbers of the job's own contexts. Not per job key:
 * the lobby (collectives/gloo/lobby.h) is where ranks started with different job keys find
 * each other, so it must be numbered alike for them. */
static unsigned next_generation(int world_size) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static struct {
    int world;
    unsigned next;
  } seen[64];
  static unsigned nseen, oldest;
  if (world_size <= 1) return 0;
  pthread_mutex_lock(&mu);
  unsigned i = 0;
  while (i < nseen && seen[i].world != world_size) i++;
  if (i == nseen) { /* a process that met more sizes than this holds forgets the oldest */
    if (nseen < sizeof seen / sizeof seen[0]) nseen++;
    else i = oldest++ % nseen;
    seen[i].world = world_size;
    seen[i].next = 0;
  }
  unsigned gen = seen[i].next++;
  pthread_mutex_unlock(&mu);
  return gen;
}

/* The rendezvous key prefix: unique per job even without a launcher's job id (see job_key in
 * shardload.h). Contexts of one world size created in the same order on every rank get the
 * same prefix, so one rendezvous serves several contexts of a process (as torch numbers its
 * process groups). */
static void store_prefix(const char *job_key, int world_size, char *out, size_t len, char *lobby,
                         size_t lobby_len) {
  char id[160];
  char key[24] = "-";
  unsigned gen = next_generation(world_size);
  if (job_key && *job_key) snprintf(key, sizeof key, "%016llx", (unsigned long long)XXH3_64bits(job_key, strlen(job_key)));
  job_id(id, sizeof id);
  snprintf(out, len, "shardload/%s/w%d/%s/%u/", id, world_size, key, gen);
  snprintf(lobby, lobby_len, "shardload/%s/w%d/lobby/%u/", id, world_size, gen);
}

/* The rank's backend: selected, started on its device and held by a reference that the
 * states it loads share (they may outlive the context; backend_ref.c). */
static sl_status open_backend(sl_context *ctx, const sl_context_options *o) {
  if (o->device_set && o->device < 0)
    return sl__fail(ctx, SL_ERR_INVALID, "device %d is not a device ordinal; give 0 or more", o->device);
  const sl_backend_ops *ops = NULL;
  void *dl = NULL, *shim = NULL, *handle = NULL;
  char variant[64] = "";
  sl_status st = sl__backend_select(ctx, o->backend, &ops, &dl, &shim, variant, sizeof variant);
  if (st != SL_OK) return st;
  if (!ctx->backend_reason[0]) snprintf(ctx->backend_reason, sizeof ctx->backend_reason, "%s: asked for", ops->name);
  /* the reference first: the backend reports through the reference's host, which outlives the
   * context as the backend may (states free through it after sl_context_destroy) */
  if (!(ctx->beref = sl__backend_ref_new(ops, NULL, dl, shim, ctx))) {
    st = sl__fail(ctx, SL_ERR_NOMEM, "out of memory starting backend %s", ops->name);
    goto out_close;
  }
  sl_backend_init bi = {
      .size = sizeof bi,
      .host = &ctx->beref->host,
      .local_rank = ctx->local_rank,
      .local_world_size = ctx->local_world_size,
      .device = o->device_set ? o->device : -1,
      .variant = variant[0] ? variant : NULL,
      .ops = ops,
      .timeout_ms = ctx->timeout_ms,
  };
  ctx->errmsg[0] = 0; /* to tell whether init said why */
  if ((st = ops->init(&bi, &handle)) != SL_OK) {
    sl__module_init_failed(ctx, st, "backend", ops->name);
    sl__backend_ref_put(ctx->beref); /* closes the module: no handle, no fini */
    ctx->beref = NULL;
    return st;
  }
  ctx->beref->handle = handle;
  ctx->be = ops;
  ctx->be_ctx = handle;
  ctx->device_ordinal = SL_HAS_OP(ops, device_ordinal) ? ops->device_ordinal(handle)
                        : o->device_set                 ? o->device
                                                        : ctx->local_rank;
  if (SL_HAS_OP(ops, describe)) {
    ctx->device_desc[0] = 0;
    ops->describe(handle, ctx->device_desc, sizeof ctx->device_desc);
    ctx->device_desc[sizeof ctx->device_desc - 1] = 0;
    sl__module_text(ctx->device_desc, sizeof ctx->device_desc); /* printed in the report's header */
  } else {
    snprintf(ctx->device_desc, sizeof ctx->device_desc, "%s:%d", ops->name, ctx->device_ordinal);
  }
  return SL_OK;

out_close:
  free(shim);
  if (dl) dlclose(dl);
  return st;
}

SL_API sl_status sl_context_create(const sl_context_options *opts, sl_context **out) {
  if (!out) return SL_ERR_INVALID;
  *out = NULL;
  if (opts && opts->size < sizeof(size_t)) return SL_ERR_INVALID;
  sl_context_options o;
  sl__copy_sized(&o, sizeof o, opts, opts ? opts->size : 0);

  sl_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return SL_ERR_NOMEM;
  ctx->log = o.log;
  ctx->log_user = o.log_user;
  ctx->log_level = o.log_level;
  ctx->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : 300000;
  ctx->host = sl__module_host_of(ctx);
  sl_status st;

  if (o.world_size == 0) {
    sl__launch_info li;
    if ((st = sl__launch_env(ctx, &li)) != SL_OK) goto out_free;
    ctx->rank = li.rank;
    ctx->world_size = li.world_size;
    ctx->local_rank = li.local_rank;
    ctx->rendezvous = o.rendezvous ? sl__strdup(o.rendezvous) : li.rendezvous;
    if (o.rendezvous) free(li.rendezvous);
  } else {
    if (o.world_size < 0 || o.rank < 0 || o.rank >= o.world_size) {
      st = sl__fail(ctx, SL_ERR_INVALID, "rank %d is not in a job of %d ranks", o.rank, o.world_size);
      goto out_free;
    }
    if ((st = sl__world_size_check(ctx, "sl_context_options.world_size", o.world_size)) != SL_OK) goto out_free;
    ctx->rank = o.rank;
    ctx->world_size = o.world_size;
    ctx->local_rank = o.local_rank >= 0 ? o.local_rank : 0;
    /* explicit ranks with no rendezvous: the environment's, as the options promise */
    if (o.rendezvous) ctx->rendezvous = sl__strdup(o.rendezvous);
    else if (o.world_size > 1 && (st = sl__launch_rendezvous(ctx, false, &ctx->rendezvous)) != SL_OK)
      goto out_free;
  }
  /* The node's rank count, from the launcher; a one-rank context given explicitly (the
   * command's inspect and plan) reads no launcher variable at all. */
  ctx->local_world_size = 1;
  if ((o.world_size == 0 || o.world_size > 1) &&
      (st = sl__launch_local_world_size(ctx, &ctx->local_world_size)) != SL_OK)
    goto out_free;
  /* A backend that does not start still lets the planes tell the other ranks why: in a job
   * whose ranks run different backends, one rank's missing GPU must not leave the others
   * waiting at the rendezvous. */
  sl_status be_st = open_backend(ctx, &o);

  char prefix[256], lobby[256];
  store_prefix(o.job_key, ctx->world_size, prefix, sizeof prefix, lobby, sizeof lobby);
  if ((st = sl__planes_open(ctx, o.collective, prefix, lobby, o.job_key, be_st)) != SL_OK) {
    if (be_st != SL_OK) goto out_free; /* no backend to put */
    goto out_put_backend;
  }
  sl__log(ctx, SL_LOG_INFO, "rank %d/%d: backend %s (%s)", ctx->rank, ctx->world_size, ctx->be->name,
          ctx->device_desc);
  *out = ctx;
  return SL_OK;

out_put_backend:
  sl__backend_ref_put(ctx->beref);
out_free:
  /* the caller has no context to read the message from: log it before it goes */
  sl__log(ctx, SL_LOG_ERROR, "%s: %s", sl_status_name(st), ctx->errmsg);
  if (o.errbuf && o.errbuf_size) snprintf(o.errbuf, o.errbuf_size, "%s", ctx->errmsg);
  free(ctx->rendezvous);
  free(ctx);
  return st;
}

/* The data plane first (it may sit on the control plane's bootstrap), then the control plane,
 * then the context's hold on the backend: states that still hold tensors keep it alive. */
SL_API void sl_context_destroy(sl_context *ctx) {
  if (!ctx) return;
  sl__planes_close(ctx);
  sl__backend_ref_detach(ctx->beref);
  sl__backend_ref_put(ctx->beref);
  free(ctx->rendezvous);
  free(ctx);
}

SL_API const char *sl_context_errmsg(const sl_context *ctx) { return ctx ? ctx->errmsg : ""; }
SL_API int sl_context_rank(const sl_context *ctx) { return ctx ? ctx->rank : -1; }
SL_API int sl_context_world_size(const sl_context *ctx) { return ctx ? ctx->world_size : 0; }
SL_API const char *sl_context_backend_name(const sl_context *ctx) { return ctx ? ctx->be->name : NULL; }
SL_API const char *sl_context_backend_reason(const sl_context *ctx) { return ctx ? ctx->backend_reason : ""; }
SL_API const char *sl_context_device_description(const sl_context *ctx) { return ctx ? ctx->device_desc : NULL; }

bool sl__device_is_host(const sl_context *ctx) { return (ctx->be->flags & SL_BACKEND_DEVICE_IS_HOST) != 0; }
bool sl__has_pinned(const sl_context *ctx) {
  return (ctx->be->flags & SL_BACKEND_HAS_PINNED) && SL_HAS_OP(ctx->be, alloc_pinned) &&
         SL_HAS_OP(ctx->be, free_pinned);
}

uint64_t sl__backend_max_alloc(const sl_context *ctx) {
  if (!SL_HAS_OP(ctx->be, get_proc)) return 0;
  sl_ext_max_alloc_fn f = (sl_ext_max_alloc_fn)ctx->be->get_proc(SL_EXT_MAX_ALLOC);
  return f ? f(ctx->be_ctx) : 0;
}

SL_API sl_status sl_alloc(sl_context *ctx, sl_device_kind where, int pinned, size_t bytes, void **out) {
  if (!ctx || !out) return SL_ERR_INVALID;
  *out = NULL;
  if (where == SL_DEVICE_ACCELERATOR) return ctx->be->alloc_device(ctx->be_ctx, bytes, out);
  if (where != SL_DEVICE_CPU) return sl__fail(ctx, SL_ERR_INVALID, "sl_alloc: unknown device kind %d", (int)where);
  if (pinned) {
    if (!sl__has_pinned(ctx))
      return sl__fail(ctx, SL_ERR_UNSUPPORTED, "backend %s has no pinned host memory", ctx->be->name);
    return ctx->be->alloc_pinned(ctx->be_ctx, bytes, out);
  }
  if (!(*out = sl__host_alloc(bytes)))
    return sl__fail(ctx, SL_ERR_NOMEM, "cannot allocate %zu bytes of host memory", bytes);
  return SL_OK;
}

SL_API void sl_free(sl_context *ctx, sl_device_kind where, int pinned, void *ptr) {
  if (ctx) sl__backend_free(ctx->beref, where, pinned, ptr);
}

/* The public copies are complete on return: enqueued on the default stream, then waited for
 * (module.h's asynchronous contract). */
static sl_status copy_sync(sl_context *ctx, void *dst, const void *src, size_t bytes, sl_copy_kind kind) {
  sl_status st = ctx->be->copy_async(ctx->be_ctx, dst, src, bytes, kind, NULL);
  sl_status ss = ctx->be->stream_sync(ctx->be_ctx, NULL); /* also after a failed enqueue: errors are sticky */
  return st != SL_OK ? st : ss;
}

SL_API sl_status sl_copy_to_host(sl_context *ctx, void *dst, const void *src, sl_device_kind src_where,
                                 size_t bytes) {
  if (!ctx || (bytes && (!dst || !src))) return SL_ERR_INVALID;
  if (src_where == SL_DEVICE_ACCELERATOR) return copy_sync(ctx, dst, src, bytes, SL_COPY_D2H);
  if (bytes) memmove(dst, src, bytes);
  return SL_OK;
}

SL_API sl_status sl_copy_from_host(sl_context *ctx, void *dst, sl_device_kind dst_where, const void *src,
                                   size_t bytes) {
  if (!ctx || (bytes && (!dst || !src))) return SL_ERR_INVALID;
  if (dst_where == SL_DEVICE_ACCELERATOR) return copy_sync(ctx, dst, src, bytes, SL_COPY_H2D);
  if (bytes) memmove(dst, src, bytes);
  return SL_OK;
}
