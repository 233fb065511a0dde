/* The adapter of ABI v1 modules (docs/DESIGN.md#modules): a module built against the first,
 * synchronous ABI (shardload/module_v1.h keeps its tables frozen) keeps loading, and the rest of
 * the core only ever sees v2 tables, as NCCL's plugin loader adapts older net tables.
 *
 * The adapted table is one malloc'd shim per loaded module (the v2 table, then the v1 table it
 * serves); each instance the adapter creates wraps the v1 handle with the v1 table and the v1
 * host it lent the module. Nothing global changes, so two contexts may load two v1 modules.
 *
 * v1 has no streams: every adapted op completes on return (the v1 copy, then the v1
 * synchronize), which meets the v2 contract for enqueued ops; streams and events are tokens,
 * record and wait do nothing and an event is always complete. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry_v1.h"

/* ---- backends ------------------------------------------------------------------------------ */
typedef struct v1_backend_shim {
  sl_backend_ops ops; /* first: the pointer to it is the allocation */
  const sl_backend_ops_v1 *v1;
} v1_backend_shim;

typedef struct v1_backend {
  const sl_backend_ops_v1 *v1;
  void *be;                /* the v1 module's handle */
  sl_module_host_v1 host;  /* the v1 module keeps a pointer to it until fini */
  char token;              /* &token is every stream and event: nothing is ever pending */
} v1_backend;

bool sl__v1_backend_ok(const sl_backend_ops_v1 *o, char *problem, size_t len) {
  const char *missing = NULL;
  if (!o) missing = "the table (the entry returned NULL)";
  else if (o->abi_version != 1) {
    snprintf(problem, len, "its table says ABI version %u under the v1 entry symbol (this shardload loads 1 and %u)",
             o->abi_version, SL_BACKEND_ABI_VERSION);
    return false;
  } else if (o->size < offsetof(sl_backend_ops_v1, synchronize) + sizeof o->synchronize) {
    snprintf(problem, len, "its v1 table is %u bytes, too short to hold the required members", o->size);
    return false;
  } else if (!o->name) missing = "name";
  else if (!o->score) missing = "score";
  else if (!o->init) missing = "init";
  else if (!o->fini) missing = "fini";
  else if (!o->alloc_device) missing = "alloc_device";
  else if (!o->free_device) missing = "free_device";
  else if (!o->copy_h2d) missing = "copy_h2d";
  else if (!o->copy_d2h) missing = "copy_d2h";
  else if (!o->copy_d2d) missing = "copy_d2d";
  else if (!o->synchronize) missing = "synchronize";
  if (missing) snprintf(problem, len, "its v1 table lacks %s", missing);
  return missing == NULL;
}

static const v1_backend_shim *backend_shim(const sl_backend_ops *ops) { return (const v1_backend_shim *)ops; }

static sl_status v1b_init(const sl_backend_init *init, void **be);

/* The shim behind an init call: the core passes the table it calls init through. */
static const v1_backend_shim *backend_shim_of_init(const sl_backend_init *init) {
  if (init->size < offsetof(sl_backend_init, ops) + sizeof init->ops || !init->ops || init->ops->init != v1b_init)
    return NULL;
  return backend_shim(init->ops);
}

static sl_status v1b_init(const sl_backend_init *init, void **be) {
  const v1_backend_shim *sh = backend_shim_of_init(init);
  const sl_module_host *h = init->host;
  if (!sh)
    return h->fail(h->core, SL_ERR_ABI, "ABI v1 backend adapter: the core did not pass the adapted table to init");
  v1_backend *b = calloc(1, sizeof *b);
  if (!b) return h->fail(h->core, SL_ERR_NOMEM, "%s: out of memory adapting an ABI v1 backend", sh->v1->name);
  b->v1 = sh->v1;
  /* the v1 host is the v2 one without its size; log and fail have the same signature */
  b->host = (sl_module_host_v1){h->core, h->log, h->fail};
  /* v1 picks local_rank % device count: an explicit ordinal is passed in its place */
  sl_backend_init_v1 i1 = {&b->host, init->device >= 0 ? init->device : init->local_rank, init->variant};
  sl_status st = b->v1->init(&i1, &b->be);
  if (st != SL_OK) {
    free(b);
    return st;
  }
  *be = b;
  return SL_OK;
}

static void v1b_fini(void *be) {
  v1_backend *b = be;
  b->v1->fini(b->be);
  free(b);
}

static void v1b_describe(void *be, char *buf, size_t len) {
  v1_backend *b = be;
  if (SL_HAS_OP(b->v1, describe)) b->v1->describe(b->be, buf, len);
  else snprintf(buf, len, "%s (ABI v1 module)", b->v1->name);
}

static sl_status v1b_alloc_device(void *be, size_t bytes, void **ptr) {
  v1_backend *b = be;
  return b->v1->alloc_device(b->be, bytes, ptr);
}
static void v1b_free_device(void *be, void *ptr) {
  v1_backend *b = be;
  b->v1->free_device(b->be, ptr);
}
static sl_status v1b_alloc_pinned(void *be, size_t bytes, void **ptr) {
  v1_backend *b = be;
  return b->v1->alloc_pinned(b->be, bytes, ptr);
}
static void v1b_free_pinned(void *be, void *ptr) {
  v1_backend *b = be;
  b->v1->free_pinned(b->be, ptr);
}

static sl_status v1b_token_create(void *be, void **token) {
  *token = &((v1_backend *)be)->token;
  return SL_OK;
}
static void v1b_token_destroy(void *be, void *token) {}
static sl_status v1b_event_record(void *be, void *event, void *stream) { return SL_OK; }
static sl_status v1b_stream_wait_event(void *be, void *stream, void *event) { return SL_OK; }
static int v1b_event_query(void *be, void *event) { return 1; }

static sl_status v1b_synchronize(void *be) {
  v1_backend *b = be;
  return b->v1->synchronize(b->be);
}
static sl_status v1b_event_sync(void *be, void *event) { return v1b_synchronize(be); }
static sl_status v1b_stream_sync(void *be, void *stream) { return v1b_synchronize(be); }

/* One v1 copy by kind, not yet synchronised. */
static sl_status v1_copy(v1_backend *b, void *dst, const void *src, size_t bytes, sl_copy_kind kind) {
  switch (kind) {
  case SL_COPY_H2D: return b->v1->copy_h2d(b->be, dst, src, bytes);
  case SL_COPY_D2H: return b->v1->copy_d2h(b->be, dst, src, bytes);
  case SL_COPY_D2D: return b->v1->copy_d2d(b->be, dst, src, bytes);
  }
  return SL_ERR_INVALID;
}

/* v1 copies may still run when they return (the v1 core synchronised after each): the
 * adapter synchronises, so the op is complete on return. */
static sl_status v1b_copy_async(void *be, void *dst, const void *src, size_t bytes, sl_copy_kind kind,
                                void *stream) {
  v1_backend *b = be;
  sl_status st = v1_copy(b, dst, src, bytes, kind);
  return st != SL_OK ? st : b->v1->synchronize(b->be);
}

static sl_status v1b_copy_2d_async(void *be, void *dst, size_t dpitch, const void *src, size_t spitch,
                                   size_t width, size_t height, sl_copy_kind kind, void *stream) {
  v1_backend *b = be;
  for (size_t r = 0; r < height; r++) {
    sl_status st = v1_copy(b, (char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind);
    if (st != SL_OK) return st;
  }
  return b->v1->synchronize(b->be);
}

static sl_status v1b_cast_async(void *be, void *dst, sl_dtype dst_dt, const void *src, sl_dtype src_dt,
                                size_t count, void *stream) {
  v1_backend *b = be;
  if (!count) return SL_OK; /* the ABI's question (module.h): a v1 module casts every pair or fails */
  sl_status st = b->v1->cast_device(b->be, dst, dst_dt, src, src_dt, count);
  return st != SL_OK ? st : b->v1->synchronize(b->be);
}

static int v1b_is_device_ptr(void *be, const void *ptr, size_t bytes) {
  v1_backend *b = be;
  return b->v1->is_device_ptr(b->be, ptr, bytes);
}

/* v1's test instruments, now extensions (SL_EXT_SGD_STEP, SL_EXT_TRAFFIC). */
static sl_status v1b_ext_sgd_step(void *be, void *x, const void *g, sl_dtype dt, size_t count, float lr) {
  v1_backend *b = be;
  sl_status st = b->v1->sgd_step(b->be, x, g, dt, count, lr);
  return st != SL_OK ? st : b->v1->synchronize(b->be);
}
static void v1b_ext_traffic(void *be, uint64_t *h2d, uint64_t *d2h) {
  v1_backend *b = be;
  b->v1->traffic(b->be, h2d, d2h);
}

/* get_proc has no instance argument: the shim picks, per module, the lookup that offers
 * exactly the extensions its v1 table has. */
static void *v1b_get_proc_sgd(const char *name) {
  return strcmp(name, SL_EXT_SGD_STEP) == 0 ? (void *)v1b_ext_sgd_step : NULL;
}
static void *v1b_get_proc_traffic(const char *name) {
  return strcmp(name, SL_EXT_TRAFFIC) == 0 ? (void *)v1b_ext_traffic : NULL;
}
static void *v1b_get_proc_both(const char *name) {
  void *f = v1b_get_proc_sgd(name);
  return f ? f : v1b_get_proc_traffic(name);
}

/* The registry probes the v1 table itself (sl__v1_backend_probe) before it hands this table
 * out; a caller probing the adapted table again learns that it was usable. */
static int v1b_probe(char *reason, size_t len) {
  if (len) reason[0] = 0;
  return 1;
}

sl_backend_ops *sl__v1_backend_adapt(const sl_backend_ops_v1 *o) {
  v1_backend_shim *sh = calloc(1, sizeof *sh);
  if (!sh) return NULL;
  sh->v1 = o;
  sl_backend_ops *a = &sh->ops;
  *a = (sl_backend_ops){
      .abi_version = SL_BACKEND_ABI_VERSION,
      .size = sizeof(sl_backend_ops),
      .name = o->name,
      .flags = o->flags,
      .preferred_collective = o->preferred_collective,
      .probe = v1b_probe,
      .init = v1b_init,
      .fini = v1b_fini,
      .describe = v1b_describe,
      .alloc_device = v1b_alloc_device,
      .free_device = v1b_free_device,
      .stream_create = v1b_token_create,
      .stream_destroy = v1b_token_destroy,
      .event_create = v1b_token_create,
      .event_destroy = v1b_token_destroy,
      .event_record = v1b_event_record,
      .stream_wait_event = v1b_stream_wait_event,
      .event_query = v1b_event_query,
      .event_sync = v1b_event_sync,
      .stream_sync = v1b_stream_sync,
      .synchronize = v1b_synchronize,
      .copy_async = v1b_copy_async,
      .copy_2d_async = v1b_copy_2d_async,
  };
  if (SL_HAS_OP(o, alloc_pinned) && SL_HAS_OP(o, free_pinned)) {
    a->alloc_pinned = v1b_alloc_pinned;
    a->free_pinned = v1b_free_pinned;
  } else {
    a->flags &= ~(uint32_t)SL_BACKEND_HAS_PINNED; /* nothing to give it with */
  }
  if (SL_HAS_OP(o, cast_device)) a->cast_async = v1b_cast_async;
  if (SL_HAS_OP(o, is_device_ptr)) a->is_device_ptr = v1b_is_device_ptr;
  bool sgd = SL_HAS_OP(o, sgd_step), traffic = SL_HAS_OP(o, traffic);
  a->get_proc = sgd && traffic ? v1b_get_proc_both : sgd ? v1b_get_proc_sgd : traffic ? v1b_get_proc_traffic : NULL;
  return a;
}

int sl__v1_backend_probe(const sl_backend_ops *adapted, char *reason, size_t len) {
  const sl_backend_ops_v1 *o = backend_shim(adapted)->v1;
  int score = o->score();
  if (score <= 0) snprintf(reason, len, "%s: score() returned 0 (ABI v1 module gives no reason)", o->name);
  return score > 0 ? score : 0;
}

/* ---- collectives --------------------------------------------------------------------------- */
typedef struct v1_collective_shim {
  sl_collective_ops ops; /* first: the pointer to it is the allocation */
  const sl_collective_ops_v1 *v1;
} v1_collective_shim;

typedef struct v1_comm {
  const sl_collective_ops_v1 *v1;
  void *comm;
  sl_module_host_v1 host;
} v1_comm;

bool sl__v1_collective_ok(const sl_collective_ops_v1 *o, char *problem, size_t len) {
  const char *missing = NULL;
  if (!o) missing = "the table (the entry returned NULL)";
  else if (o->abi_version != 1) {
    snprintf(problem, len, "its table says ABI version %u under the v1 entry symbol (this shardload loads 1 and %u)",
             o->abi_version, SL_COLLECTIVE_ABI_VERSION);
    return false;
  } else if (o->size < offsetof(sl_collective_ops_v1, barrier) + sizeof o->barrier) {
    snprintf(problem, len, "its v1 table is %u bytes, too short to hold the required members", o->size);
    return false;
  } else if (!o->name) missing = "name";
  else if (!o->score) missing = "score";
  else if (!o->init) missing = "init";
  else if (!o->fini) missing = "fini";
  else if (!o->broadcast) missing = "broadcast";
  else if (!o->scatterv) missing = "scatterv";
  else if (!o->allgather) missing = "allgather";
  else if (!o->barrier) missing = "barrier";
  if (missing) snprintf(problem, len, "its v1 table lacks %s", missing);
  return missing == NULL;
}

static const v1_collective_shim *collective_shim(const sl_collective_ops *ops) {
  return (const v1_collective_shim *)ops;
}

static sl_status v1c_init(const sl_collective_init *init, void **comm);

static const v1_collective_shim *collective_shim_of_init(const sl_collective_init *init) {
  if (init->size < offsetof(sl_collective_init, ops) + sizeof init->ops || !init->ops || init->ops->init != v1c_init)
    return NULL;
  return collective_shim(init->ops);
}

static sl_status v1c_init(const sl_collective_init *init, void **comm) {
  const v1_collective_shim *sh = collective_shim_of_init(init);
  const sl_module_host *h = init->host;
  if (!sh)
    return h->fail(h->core, SL_ERR_ABI, "ABI v1 collective adapter: the core did not pass the adapted table to init");
  v1_comm *c = calloc(1, sizeof *c);
  if (!c) return h->fail(h->core, SL_ERR_NOMEM, "%s: out of memory adapting an ABI v1 collective", sh->v1->name);
  c->v1 = sh->v1;
  c->host = (sl_module_host_v1){h->core, h->log, h->fail};
  sl_collective_init_v1 i1 = {&c->host,      init->rank,  init->world_size, init->rendezvous,
                              init->prefix,  init->timeout_ms, init->lobby, init->job_key};
  sl_status st = c->v1->init(&i1, &c->comm);
  if (st != SL_OK) {
    free(c);
    return st;
  }
  *comm = c;
  return SL_OK;
}

static void v1c_fini(void *comm) {
  v1_comm *c = comm;
  c->v1->fini(c->comm);
  free(c);
}

/* v1 collectives block until done: the stream argument is dropped (SL_COLL_SYNC). */
static sl_status v1c_broadcast(void *comm, void *buf, size_t bytes, int root, void *stream) {
  v1_comm *c = comm;
  return c->v1->broadcast(c->comm, buf, bytes, root);
}
static sl_status v1c_scatterv(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs,
                              void *recvbuf, size_t recvbytes, int root, void *stream) {
  v1_comm *c = comm;
  return c->v1->scatterv(c->comm, sendbuf, counts, displs, recvbuf, recvbytes, root);
}
static sl_status v1c_allgather(void *comm, const void *sendbuf, void *recvbuf, size_t bytes, void *stream) {
  v1_comm *c = comm;
  return c->v1->allgather(c->comm, sendbuf, recvbuf, bytes);
}
static sl_status v1c_barrier(void *comm) {
  v1_comm *c = comm;
  return c->v1->barrier(c->comm);
}

/* As for backends: the registry probes the v1 table (sl__v1_collective_probe). */
static int v1c_probe(const char *backend, char *reason, size_t len) {
  if (len) reason[0] = 0;
  return 1;
}

sl_collective_ops *sl__v1_collective_adapt(const sl_collective_ops_v1 *o) {
  v1_collective_shim *sh = calloc(1, sizeof *sh);
  if (!sh) return NULL;
  sh->v1 = o;
  sh->ops = (sl_collective_ops){
      .abi_version = SL_COLLECTIVE_ABI_VERSION,
      .size = sizeof(sl_collective_ops),
      .name = o->name,
      .flags = SL_COLL_SYNC,
      /* a v1 collective naming a backend moved that backend's device memory only */
      .domains = o->device_backend ? SL_MEM_DEVICE : SL_MEM_HOST | SL_MEM_PINNED,
      .device_backend = o->device_backend,
      .probe = v1c_probe,
      .init = v1c_init,
      .fini = v1c_fini,
      .broadcast = v1c_broadcast,
      .scatterv = v1c_scatterv,
      .allgather = v1c_allgather,
      .barrier = v1c_barrier,
  };
  return &sh->ops;
}

int sl__v1_collective_probe(const sl_collective_ops *adapted, const char *backend, char *reason, size_t len) {
  const sl_collective_ops_v1 *o = collective_shim(adapted)->v1;
  int score = o->score();
  if (score <= 0) {
    snprintf(reason, len, "%s: score() returned 0 (ABI v1 module gives no reason)", o->name);
    return 0;
  }
  /* v1 had no probe(backend): its device_backend says which backend's memory it needs, read as
   * what BACKEND is, the native API the rank's backend pairs by (its name where it has none,
   * as every backend of the v1 days) */
  if (o->device_backend && (!backend || strncmp(backend, o->device_backend, strlen(o->device_backend)) != 0 ||
                            (backend[strlen(o->device_backend)] != 0 && backend[strlen(o->device_backend)] != ':'))) {
    snprintf(reason, len, "%s: moves %s device memory only (ABI v1 module); this rank's backend is %s", o->name,
             o->device_backend, backend ? backend : "unknown");
    return 0;
  }
  return score;
}
