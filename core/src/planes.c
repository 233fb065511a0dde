/* The control plane and the data plane of a context (planes.h; docs/DESIGN.md#modules).
 *
 * The control plane carries every agreement, manifest and status in host memory and is always
 * the module that works everywhere: Gloo, or local for one rank. The data plane carries tensor
 * bytes and may be a device collective (NCCL, simccl); since a device collective works only
 * when EVERY rank can run it, the ranks agree on it over the control plane: each contributes a
 * fixed-size record (its backend, device and what each collective's probe said), and every
 * rank decides from the same table in the same way, so all choose the same module or all fail
 * with the same message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>

#include "planes.h"
#include "ranks_agree.h"

/* ---- control-plane collectives ----------------------------------------------------------- */

/* After sl_context_abort every control op fails with one message, whatever the module's own
 * failure said, so callers (and users) see why. */
static sl_status ctl_result(sl_context *ctx, sl_status st, const char *op) {
  if (!__atomic_load_n(&ctx->aborted, __ATOMIC_ACQUIRE)) return st;
  return sl__fail(ctx, SL_ERR_COMM,
                  "rank %d: %s on the control plane aborted: sl_context_abort was called on this context "
                  "(a signal handler or another thread); destroy the context",
                  ctx->rank, op);
}

sl_status sl__ctl_broadcast(sl_context *ctx, void *buf, size_t bytes, int root) {
  sl_status st = ctl_result(ctx, SL_OK, "broadcast");
  if (st == SL_OK) st = ctl_result(ctx, ctx->ctl->broadcast(ctx->ctl_comm, buf, bytes, root, NULL), "broadcast");
  return st;
}

sl_status sl__ctl_allgather(sl_context *ctx, const void *sendbuf, void *recvbuf, size_t bytes) {
  sl_status st = ctl_result(ctx, SL_OK, "allgather");
  if (st == SL_OK) st = ctl_result(ctx, ctx->ctl->allgather(ctx->ctl_comm, sendbuf, recvbuf, bytes, NULL), "allgather");
  return st;
}

sl_status sl__ctl_barrier(sl_context *ctx) {
  sl_status st = ctl_result(ctx, SL_OK, "barrier");
  if (st == SL_OK) st = ctl_result(ctx, ctx->ctl->barrier(ctx->ctl_comm), "barrier");
  return st;
}

/* What data modules bootstrap through (sl_collective_init.control). */
static sl_status control_broadcast(void *c, void *buf, size_t bytes, int root) {
  return sl__ctl_broadcast(c, buf, bytes, root);
}

static sl_status control_allgather(void *c, const void *sendbuf, void *recvbuf, size_t bytes) {
  return sl__ctl_allgather(c, sendbuf, recvbuf, bytes);
}

/* ---- the agreement on the data collective ---------------------------------------------------- */

#define PLANE_COLLS 8      /* collectives one record describes (this build knows 5) */
#define PLANE_NAME 33 /* a module name is at most 32 characters (registry.c) */
#define PLANE_REASON 400   /* a probe's reason, cut to fit: the record stays under 4 KiB */

typedef struct plane_entry {
  char name[PLANE_NAME];
  int32_t can;    /* the probe's verdict for this rank's backend: 1 yes, 0 no */
  int32_t listed; /* one of the collectives this build knows (else a module asked for by name) */
  char reason[PLANE_REASON];
} plane_entry;

typedef struct plane_rec {
  char want[PLANE_NAME]; /* the collective this rank was asked for, "" for auto */
  char backend[32];
  char preferred[PLANE_NAME]; /* the backend's preferred data collective, "" for host staging */
  char device[160];
  int32_t count;
  plane_entry e[PLANE_COLLS];
} plane_rec;

/* Copies S into a fixed field, cut to fit and always terminated. */
static void put(char *dst, size_t len, const char *s) {
  size_t n = 0;
  for (; s && n + 1 < len && s[n]; n++) dst[n] = s[n];
  dst[n] = 0;
}

static void fill_record(const sl_context *ctx, const char *want, plane_rec *r) {
  memset(r, 0, sizeof *r);
  put(r->want, sizeof r->want, want);
  put(r->backend, sizeof r->backend, ctx->be->name);
  const char *pref = ctx->be->preferred_collective;
  put(r->preferred, sizeof r->preferred, pref && strcmp(pref, "gloo") != 0 ? pref : "");
  put(r->device, sizeof r->device, ctx->device_desc);
  const char *names[PLANE_COLLS];
  size_t n = sl__collective_names(names, PLANE_COLLS - 1), listed = n;
  /* a module asked for by name that this build does not list (libshardload-NAME.so) */
  bool extra = want && *want;
  for (size_t i = 0; i < n && extra; i++) extra = strcmp(names[i], want) != 0;
  if (extra) names[n++] = want;
  for (size_t i = 0; i < n; i++) {
    plane_entry *e = &r->e[i];
    put(e->name, sizeof e->name, names[i]);
    e->listed = i < listed;
    e->can = sl__collective_probe(names[i], ctx->be->name, e->reason, sizeof e->reason) > 0;
    if (e->can) e->reason[0] = 0;
    else if (!e->reason[0]) put(e->reason, sizeof e->reason, "its probe gave no reason");
    e->reason[PLANE_REASON - 1] = 0;
    r->count++;
  }
}

/* Rank R's entry for NAME, or NULL when its build does not know NAME. */
static const plane_entry *entry_of(const plane_rec *r, const char *name) {
  for (int32_t i = 0; i < r->count && i < PLANE_COLLS; i++)
    if (strcmp(r->e[i].name, name) == 0) return &r->e[i];
  return NULL;
}

/* The first rank that cannot run NAME (its reason in WHY), or -1 when every rank can. */
static int first_unable(const sl_context *ctx, const plane_rec *all, const char *name, char *why, size_t len) {
  for (int r = 0; r < ctx->world_size; r++) {
    const plane_entry *e = entry_of(&all[r], name);
    if (e && e->can) continue;
    /* name the rank's backend unless the probe's reason did */
    if (e && strstr(e->reason, all[r].backend)) snprintf(why, len, "%s", e->reason);
    else if (e) snprintf(why, len, "%s; this rank's backend is %s", e->reason, all[r].backend);
    else
      snprintf(why, len, "its shardload does not know the collective %s; run the same shardload on every rank", name);
    return r;
  }
  return -1;
}

/* The collective names rank 0's build lists, for the message on an unknown name. */
static void known_names(const plane_rec *all, char *out, size_t len) {
  size_t used = 0;
  out[0] = 0;
  for (int32_t i = 0; i < all[0].count && i < PLANE_COLLS && used < len && all[0].e[i].listed; i++) {
    int n = snprintf(out + used, len - used, "%s%s", i ? ", " : "", all[0].e[i].name);
    if (n > 0) used += (size_t)n;
  }
}

/* Every rank runs this on the same table and so reaches the same verdict: CHOSEN (a module
 * name) and ctx->data_reason, or the same failure. */
static sl_status choose(sl_context *ctx, const plane_rec *all, const char *want, char *chosen, size_t len) {
  char why[PLANE_REASON + 160];
  const char *host = ctx->world_size == 1 ? "local" : "gloo";
  if (want) {
    /* a name rank 0's build does not list and cannot load is a mistake, not a missing device */
    const plane_entry *e0 = entry_of(&all[0], want);
    if (!e0 || (!e0->listed && !e0->can)) {
      char names[256];
      known_names(all, names, sizeof names);
      return sl__fail(ctx, SL_ERR_INVALID,
                      "collective '%s' is unknown: this shardload knows %s, or a module libshardload-%s.so on "
                      "SHARDLOAD_MODULE_PATH (rank 0: %.200s); give one of them or auto",
                      want, names, want, e0 ? e0->reason : "not listed");
    }
    int bad = first_unable(ctx, all, want, why, sizeof why);
    if (bad >= 0)
      return sl__fail(ctx, SL_ERR_NO_DEVICE,
                      "the collective %s was asked for, but rank %d cannot run it (%s); ask for another one, "
                      "or auto",
                      want, bad, why);
    put(chosen, len, want);
    snprintf(ctx->data_reason, sizeof ctx->data_reason, "%s: forced (--collective, sl_context_options.collective)",
             want);
    return SL_OK;
  }
  /* auto: rank 0's backend says which device collective its memory wants; ranks with other
   * backends take part through their probes (a device collective only when all can). */
  const char *pref = all[0].preferred;
  if (!pref[0]) {
    put(chosen, len, host);
    snprintf(ctx->data_reason, sizeof ctx->data_reason, "%s: backend %s of rank 0 stages through host memory", host,
             all[0].backend);
    return SL_OK;
  }
  int bad = first_unable(ctx, all, pref, why, sizeof why);
  if (bad < 0) {
    put(chosen, len, pref);
    snprintf(ctx->data_reason, sizeof ctx->data_reason, "%s: preferred by backend %s and every rank runs it", pref,
             all[0].backend);
    return SL_OK;
  }
  put(chosen, len, host);
  snprintf(ctx->data_reason, sizeof ctx->data_reason, "%s: rank %d cannot run %s (%.180s)", host, bad, pref, why);
  return SL_OK;
}

/* Collective over the control plane: every rank's record, then the same verdict everywhere. */
static sl_status agree_on_data(sl_context *ctx, const char *want, char *chosen, size_t len) {
  plane_rec mine;
  fill_record(ctx, want, &mine);
  plane_rec *all = calloc((size_t)ctx->world_size, sizeof *all);
  /* without the table this rank cannot take part: say so in the agreement below, so that the
   * others fail with its message rather than waiting in the allgather */
  sl_status st = all ? SL_OK : sl__fail(ctx, SL_ERR_NOMEM, "cannot allocate the table of %d ranks' collectives",
                                        ctx->world_size);
  if ((st = sl__agree(ctx, st, NULL, "agreeing on the data collective", NULL)) != SL_OK) goto out_free;
  if ((st = sl__ctl_allgather(ctx, &mine, all, sizeof mine)) != SL_OK) goto out_free;
  for (int r = 0; r < ctx->world_size; r++) {
    /* terminate what came over the wire before reading it as text */
    plane_rec *p = &all[r];
    p->want[sizeof p->want - 1] = p->backend[sizeof p->backend - 1] = 0;
    p->preferred[sizeof p->preferred - 1] = p->device[sizeof p->device - 1] = 0;
    for (int i = 0; i < PLANE_COLLS; i++) {
      p->e[i].name[PLANE_NAME - 1] = 0;
      p->e[i].reason[PLANE_REASON - 1] = 0;
      sl__module_text(p->e[i].reason, PLANE_REASON); /* a peer is not trusted to have escaped it */
    }
    sl__module_text(p->backend, sizeof p->backend);
    sl__module_text(p->device, sizeof p->device);
    sl__log(ctx, SL_LOG_DEBUG, "rank %d: backend %s (%s)", r, p->backend, p->device);
  }
  /* ranks asked for different collectives would each choose their own: refuse it on all */
  for (int r = 1; r < ctx->world_size; r++) {
    if (strcmp(all[r].want, all[0].want) == 0) continue;
    st = sl__fail(ctx, SL_ERR_MISMATCH,
                  "rank %d was asked for the data collective %s, rank 0 for %s; give every rank the same "
                  "--collective (sl_context_options.collective)",
                  r, all[r].want[0] ? all[r].want : "auto", all[0].want[0] ? all[0].want : "auto");
    goto out_free;
  }
  st = choose(ctx, all, all[0].want[0] ? all[0].want : NULL, chosen, len);
out_free:
  free(all);
  return st;
}

/* ---- opening and closing ------------------------------------------------------------------- */

/* What both planes' modules are started with: the job, its rendezvous and key spaces. */
static sl_collective_init job_init(const sl_context *ctx, const sl_collective_ops *ops, const char *prefix,
                                   const char *lobby, const char *job_key) {
  sl_collective_init ci = {
      .size = sizeof ci,
      .host = &ctx->host,
      .rank = ctx->rank,
      .world_size = ctx->world_size,
      .rendezvous = ctx->rendezvous,
      .prefix = prefix,
      .timeout_ms = ctx->timeout_ms,
      .lobby = lobby,
      .job_key = job_key ? job_key : "",
      .device = -1,
      .local_rank = ctx->local_rank,
      .local_world_size = ctx->local_world_size,
      .ops = ops,
  };
  return ci;
}

static sl_status open_control(sl_context *ctx, const char *prefix, const char *lobby, const char *job_key) {
  const char *name = ctx->world_size == 1 ? "local" : "gloo";
  sl_status st = sl__collective_select(ctx, name, &ctx->ctl, &ctx->ctl_dl, &ctx->ctl_shim);
  if (st != SL_OK) return st;
  if (ctx->world_size > 1 && !ctx->rendezvous)
    return sl__fail(ctx, SL_ERR_INVALID,
                    "rank %d of %d has no rendezvous: set MASTER_ADDR and MASTER_PORT, SHARDLOAD_RENDEZVOUS, "
                    "or the rendezvous option (file://DIR or tcp://HOST:PORT)",
                    ctx->rank, ctx->world_size);
  sl_collective_init ci = job_init(ctx, ctx->ctl, prefix, lobby, job_key);
  ctx->errmsg[0] = 0; /* to tell whether init said why */
  if ((st = ctx->ctl->init(&ci, &ctx->ctl_comm)) != SL_OK) {
    ctx->ctl_comm = NULL;
    sl__module_init_failed(ctx, st, "collective", name);
  }
  ctx->control = (sl_control_plane){sizeof(sl_control_plane), ctx, control_broadcast, control_allgather};
  return st;
}

/* Starts the chosen data module (a collective init, bootstrapped through the control plane),
 * then agrees on the outcome: a rank whose init failed fails every rank with its message
 * instead of leaving them in the module's bootstrap until the timeout. */
static sl_status open_data(sl_context *ctx, const char *name, const char *prefix, const char *lobby,
                           const char *job_key) {
  if (strcmp(name, ctx->ctl->name) == 0) {
    ctx->data = ctx->ctl;
    ctx->data_comm = ctx->ctl_comm;
    ctx->data_is_ctl = true;
    return SL_OK;
  }
  char data_prefix[320], data_lobby[320];
  snprintf(data_prefix, sizeof data_prefix, "%sdata/", prefix);
  snprintf(data_lobby, sizeof data_lobby, "%sdata/", lobby);
  sl_status st = sl__collective_select(ctx, name, &ctx->data, &ctx->data_dl, &ctx->data_shim);
  if (st == SL_OK) {
    /* a data module also gets the rank's device and the control plane to bootstrap through */
    sl_collective_init ci = job_init(ctx, ctx->data, data_prefix, data_lobby, job_key);
    ci.backend = ctx->be;
    ci.backend_handle = ctx->be_ctx;
    ci.device = ctx->device_ordinal;
    ci.control = &ctx->control;
    ctx->errmsg[0] = 0; /* to tell whether init said why */
    if ((st = ctx->data->init(&ci, &ctx->data_comm)) != SL_OK) {
      ctx->data_comm = NULL;
      sl__module_init_failed(ctx, st, "collective", name);
    }
  }
  char phase[96], mine[SL__ERRMSG_LEN];
  snprintf(phase, sizeof phase, "starting the data collective %s", name);
  if (st == SL_OK) return sl__agree(ctx, st, NULL, phase, NULL);
  /* This rank failed: it reports its own failure whatever the agreement says (a peer still in
   * the module's bootstrap may fail the agreement's transport instead of joining it). */
  memcpy(mine, ctx->errmsg, sizeof mine);
  sl__agree(ctx, st, NULL, phase, NULL);
  return sl__fail(ctx, st, "%s", mine);
}

sl_status sl__planes_open(sl_context *ctx, const char *want, const char *prefix, const char *lobby,
                          const char *job_key) {
  if (want && (!*want || strcmp(want, "auto") == 0)) want = NULL;
  char chosen[PLANE_NAME];
  sl_status st = open_control(ctx, prefix, lobby, job_key);
  if (st == SL_OK) st = agree_on_data(ctx, want, chosen, sizeof chosen);
  if (st == SL_OK) st = open_data(ctx, chosen, prefix, lobby, job_key);
  if (st != SL_OK) {
    /* keep the message: closing does not touch it */
    sl__planes_close(ctx);
    return st;
  }
  sl__log(ctx, SL_LOG_INFO, "rank %d/%d: control plane %s, data plane %s (%s)", ctx->rank, ctx->world_size,
          ctx->ctl->name, ctx->data->name, ctx->data_reason);
  return SL_OK;
}

static void close_module(const sl_collective_ops **ops, void **comm, void **dl, void **shim) {
  if (*comm) (*ops)->fini(*comm);
  /* the adapter's table and the module's code stay until after fini */
  free(*shim);
  if (*dl) dlclose(*dl);
  *ops = NULL;
  *comm = *dl = *shim = NULL;
}

void sl__planes_close(sl_context *ctx) {
  if (ctx->data_is_ctl) {
    ctx->data = NULL;
    ctx->data_comm = NULL;
    ctx->data_is_ctl = false;
  } else {
    close_module(&ctx->data, &ctx->data_comm, &ctx->data_dl, &ctx->data_shim);
  }
  close_module(&ctx->ctl, &ctx->ctl_comm, &ctx->ctl_dl, &ctx->ctl_shim);
}

/* ---- public ---------------------------------------------------------------------------------- */

SL_API const char *sl_context_collective_name(const sl_context *ctx) {
  return ctx && ctx->data ? ctx->data->name : NULL;
}

SL_API const char *sl_context_collective_reason(const sl_context *ctx) { return ctx ? ctx->data_reason : NULL; }

/* Async-signal-safe as far as this function goes: an atomic store and the modules' abort,
 * which module.h requires to be callable from any thread; what the transport does inside its
 * abort (a Gloo pair's close, ncclCommAbort) is the module's. */
SL_API void sl_context_abort(sl_context *ctx) {
  if (!ctx) return;
  __atomic_store_n(&ctx->aborted, 1, __ATOMIC_RELEASE);
  if (ctx->data && !ctx->data_is_ctl && ctx->data_comm && SL_HAS_OP(ctx->data, abort))
    ctx->data->abort(ctx->data_comm);
  if (ctx->ctl && ctx->ctl_comm && SL_HAS_OP(ctx->ctl, abort)) ctx->ctl->abort(ctx->ctl_comm);
}
