/* The loaded state: a rank's local shards and how they were placed. It holds a reference of
 * its own on the backend (shardload.h at sl_tensor: tensors may outlive the context), so
 * freeing works after sl_context_destroy; and exports lend its tensors to consumers, each
 * holding a reference on the state, the free of lent device memory ordered after what the
 * consumers queued (shardload.h at sl_state_export). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "loader.h"

/* Mutation checks of the ordering (tests/mutants.cmake): SL__MUTANT_EXPORT=1 frees lent device
 * memory at once, as before exports ordered it; =2 drops only the fallback's wait. The
 * scenarios of tests/test_export.c must then fail. */
#ifndef SL__MUTANT_EXPORT
#define SL__MUTANT_EXPORT 0
#endif

struct sl_export {
  sl_state *st;
  size_t index;
  void *stream;
  /* Recorded on the consumer's stream at export (which proves the stream usable) and again at
   * release; NULL when nothing orders the free (host memory, a caller buffer, or a backend
   * without the ops). */
  void *event;
  int unordered; /* device memory the backend cannot order on the device */
  struct sl_export *next; /* in st->fences once released */
};

/* Device memory the state owns and a consumer's stream may still use. Host memory (the cpu
 * backend's "device" memory included) is freed by the host, after the consumer's release. */
static int owned_device_memory(const sl_state *st, const sl_tensor *t) {
  return t->data && !t->caller_buffer && t->device == SL_DEVICE_ACCELERATOR && st->be &&
         !(st->be->ops->flags & SL_BACKEND_DEVICE_IS_HOST);
}

static int can_order(const sl_state *st) {
  return st->be && SL_HAS_OP(st->be->ops, event_record_native) && SL_HAS_OP(st->be->ops, free_device_after);
}

/* The ordered free: every device buffer behind every fence, enqueued by the backend, which
 * takes the events. False when it could not (the caller then waits on this thread). MSG: where
 * the backend's failures land meanwhile (state_free). */
static int free_device_after_fences(sl_state *st, sl_export *fences, const char *msg) {
  size_t nptrs = 0, nev = 0;
  for (size_t i = 0; i < st->count; i++) nptrs += owned_device_memory(st, &st->tensors[i]);
  for (sl_export *f = fences; f; f = f->next) nev++;
  void **ptrs = malloc((nptrs ? nptrs : 1) * sizeof *ptrs), **events = malloc(nev * sizeof *events);
  int ok = ptrs && events;
  if (ok) {
    size_t k = 0;
    for (size_t i = 0; i < st->count; i++)
      if (owned_device_memory(st, &st->tensors[i])) ptrs[k++] = st->tensors[i].data;
    k = 0;
    for (sl_export *f = fences; f; f = f->next) events[k++] = f->event;
    ok = st->be->ops->free_device_after(st->be->handle, (void *const *)ptrs, nptrs, (void *const *)events, nev) ==
         SL_OK;
    if (!ok)
      st->be->host.log(st->be->host.core, SL_LOG_WARN,
                       "freeing %zu lent device buffer(s) after their consumers' work: %s; waiting for it instead",
                       nptrs, msg);
  }
  if (ok) {
    for (size_t i = 0; i < st->count; i++)
      if (owned_device_memory(st, &st->tensors[i])) st->tensors[i].data = NULL;
    for (sl_export *f = fences; f; f = f->next) f->event = NULL; /* the backend's now */
  }
  free(ptrs);
  free(events);
  return ok;
}

/* The fallback: the consumers' recorded work and the backend's own streams, waited for here
 * (each wait bounded by the backend's timeout). */
static void wait_before_free(sl_state *st, sl_export *fences) {
  const sl_backend_ops *o = st->be->ops;
  for (sl_export *f = fences; f; f = f->next) {
    if (!f->event) continue;
    /* an event whose wait failed may still have a record queued: destroying it would be a bug */
    if (o->event_sync(st->be->handle, f->event) == SL_OK) o->event_destroy(st->be->handle, f->event);
    f->event = NULL;
  }
  o->synchronize(st->be->handle);
}

static void free_tensors(sl_state *st, const char *msg) {
  sl_export *fences = __atomic_exchange_n(&st->fences, NULL, __ATOMIC_ACQUIRE);
  int wait = __atomic_load_n(&st->wait_free, __ATOMIC_ACQUIRE);
  if (SL__MUTANT_EXPORT == 1) {
    /* mutant: nothing orders the free */
  } else if (fences && !wait && can_order(st) && free_device_after_fences(st, fences, msg)) {
    /* queued behind the consumers' work */
  } else if ((fences || wait) && SL__MUTANT_EXPORT != 2) {
    wait_before_free(st, fences);
  }
  while (fences) {
    sl_export *f = fences;
    fences = f->next;
    free(f);
  }
  for (size_t i = 0; i < st->count; i++) {
    sl_tensor *t = &st->tensors[i];
    if (t->data && !t->caller_buffer && !(st->in_arena && st->in_arena[i]))
      sl__backend_free(st->be, t->device, t->pinned, t->data);
    t->data = NULL;
  }
  for (size_t i = 0; i < st->narenas; i++) {
    sl__host_poison(st->arenas[i].base, st->arenas[i].bytes, 0); /* its guards */
    sl__host_free(st->arenas[i].base);
  }
  st->narenas = 0;
}

/* On whichever thread drops the last reference (a garbage collector's, after the context is
 * gone): the backend's failures meanwhile are logged, never written into the context's message
 * buffer, which belongs to the context's thread (and still holds a failed load's message). */
static void state_free(sl_state *st) {
  char msg[SL__ERRMSG_LEN];
  sl__backend_ref_capture(msg, sizeof msg);
  free_tensors(st, msg);
  /* caller buffers the load page-locked for itself: the caller keeps the memory, not the pin */
  if (st->be && SL_HAS_OP(st->be->ops, unregister_host))
    for (size_t i = 0; i < st->nregistered; i++) st->be->ops->unregister_host(st->be->handle, st->registered[i]);
  sl__backend_ref_capture(NULL, 0);
  if (msg[0] && st->be) st->be->host.log(st->be->host.core, SL_LOG_WARN, "freeing a state: %s", msg);
  free(st->registered);
  sl__backend_ref_put(st->be); /* the last reference (the context may be gone) finalises the backend */
  free(st->names);
  for (size_t i = 0; i < st->nskipped; i++) free(st->skipped[i]);
  free(st->tensors);
  free(st->arenas);
  free(st->in_arena);
  free(st->skipped);
  free(st->by_name);
  free(st);
}

/* The owner's reference is refs == 0; each export adds one; the last put frees. */
static void state_put(sl_state *st) {
  if (__atomic_sub_fetch(&st->refs, 1, __ATOMIC_ACQ_REL) == -1) state_free(st);
}

SL_API void sl_state_destroy(sl_state *st) {
  if (st) state_put(st);
}

/* ---- exports ------------------------------------------------------------------------------- */
/* Records the consumer's queued work on EX's event; the message of a failure goes to MSG. */
static sl_status record_consumer(sl_export *ex, char *msg, size_t len) {
  sl__backend_ref *be = ex->st->be;
  sl__backend_ref_capture(msg, len);
  sl_status s = be->ops->event_record_native(be->handle, ex->event, ex->stream);
  sl__backend_ref_capture(NULL, 0);
  return s;
}

SL_API sl_status sl_state_export(sl_state *st, size_t index, const sl_export_options *opts, sl_export **out) {
  sl_export_options o;
  sl__copy_sized(&o, sizeof o, opts, opts ? opts->size : 0);
  if (out) *out = NULL;
  if (!st || !out || index >= st->count)
    return sl__errbuf(o.errbuf, o.errbuf_size, SL_ERR_INVALID, "sl_state_export: %s",
                      !st ? "no state" : !out ? "no place for the export (out is NULL)" : "tensor index out of range");
  const sl_tensor *t = &st->tensors[index];
  int device = owned_device_memory(st, t);
  int host = t->device == SL_DEVICE_CPU || (st->be && (st->be->ops->flags & SL_BACKEND_DEVICE_IS_HOST));
  if (host && o.stream)
    return sl__errbuf(o.errbuf, o.errbuf_size, SL_ERR_INVALID,
                      "tensor '%s': lives in host memory (%s), which no stream orders: export it with no stream "
                      "(NULL; DLPack: stream=None)", t->name,
                      t->device == SL_DEVICE_CPU ? "a CPU placement" : "the backend's device memory is host memory");
  sl_export *ex = calloc(1, sizeof *ex);
  if (!ex) return sl__errbuf(o.errbuf, o.errbuf_size, SL_ERR_NOMEM, "tensor '%s': out of memory exporting it", t->name);
  *ex = (sl_export){.st = st, .index = index, .stream = o.stream, .unordered = device && !can_order(st)};
  if (device && can_order(st)) {
    char msg[SL__ERRMSG_LEN];
    sl__backend_ref_capture(msg, sizeof msg);
    sl_status s = st->be->ops->event_create(st->be->handle, &ex->event);
    sl__backend_ref_capture(NULL, 0);
    if (s == SL_OK && (s = record_consumer(ex, msg, sizeof msg)) != SL_OK) {
      /* a failed record queued nothing on the event */
      st->be->ops->event_destroy(st->be->handle, ex->event);
    }
    if (s != SL_OK) {
      free(ex);
      return sl__errbuf(o.errbuf, o.errbuf_size, s,
                        "tensor '%s': cannot order its release after the consumer's stream %p: %s; pass a live stream "
                        "of the tensor's device (DLPack device %d:%d)",
                        t->name, o.stream, msg[0] ? msg : sl_status_name(s), t->device_type, t->device_id);
    }
  }
  __atomic_add_fetch(&st->refs, 1, __ATOMIC_ACQ_REL);
  *out = ex;
  return SL_OK;
}

size_t sl__state_fence_count(sl_state *st) {
  size_t n = 0;
  for (sl_export *f = __atomic_load_n(&st->fences, __ATOMIC_ACQUIRE); f; f = f->next) n++;
  return n;
}

SL_API const sl_tensor *sl_export_tensor(const sl_export *ex) { return ex ? &ex->st->tensors[ex->index] : NULL; }

/* The fences whose recorded work has completed order nothing any more: their events go, so that
 * a state lent once per training step keeps only the fences of work still pending, not one per
 * export ever released. Releases run on any thread and push without a lock: the list is taken
 * whole (another release meanwhile sees the rest, or none), pruned, and the survivors pushed
 * back; the free (free_tensors) cannot run meanwhile, since this release still holds its
 * reference. */
static sl_export *prune_fences(sl_state *st) {
  sl_export *keep = NULL, *f = __atomic_exchange_n(&st->fences, NULL, __ATOMIC_ACQUIRE);
  char msg[SL__ERRMSG_LEN];
  sl__backend_ref_capture(msg, sizeof msg); /* a failed query is the free's to handle, not the context's */
  while (f) {
    sl_export *next = f->next;
    if (f->event && st->be->ops->event_query(st->be->handle, f->event) == 1) {
      st->be->ops->event_destroy(st->be->handle, f->event);
      free(f);
    } else {
      f->next = keep;
      keep = f;
    }
    f = next;
  }
  sl__backend_ref_capture(NULL, 0);
  return keep;
}

/* Pushes the chain HEAD..TAIL onto the fence list without a lock. */
static void push_fences(sl_state *st, sl_export *head, sl_export *tail) {
  tail->next = __atomic_load_n(&st->fences, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(&st->fences, &tail->next, head, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
  }
}

SL_API void sl_export_release(sl_export *ex) {
  if (!ex) return;
  sl_state *st = ex->st;
  if (ex->event) {
    char msg[SL__ERRMSG_LEN];
    if (record_consumer(ex, msg, sizeof msg) != SL_OK) {
      /* the event still holds the export's record; the free waits for it and for the backend */
      __atomic_store_n(&st->wait_free, 1, __ATOMIC_RELEASE);
      st->be->host.log(st->be->host.core, SL_LOG_WARN,
                       "tensor '%s': cannot order its free after the consumer's stream %p (%s): the free will wait "
                       "for the device on its thread instead", st->tensors[ex->index].name, ex->stream, msg);
    }
    /* the export itself is the fence, behind the earlier ones still pending */
    ex->next = prune_fences(st);
    sl_export *tail = ex;
    while (tail->next) tail = tail->next;
    push_fences(st, ex, tail);
  } else {
    if (ex->unordered) __atomic_store_n(&st->wait_free, 1, __ATOMIC_RELEASE);
    free(ex);
  }
  state_put(st);
}

SL_API size_t sl_state_count(const sl_state *st) { return st ? st->count : 0; }

SL_API const sl_tensor *sl_state_tensor(const sl_state *st, size_t i) {
  return st && i < st->count ? &st->tensors[i] : NULL;
}

static size_t name_slot(const char *name, size_t mask) { return (size_t)XXH3_64bits(name, strlen(name)) & mask; }

SL_API const sl_tensor *sl_state_find(const sl_state *st, const char *name) {
  if (!st || !name || !st->by_name) return NULL;
  for (size_t k = name_slot(name, st->name_mask); st->by_name[k]; k = (k + 1) & st->name_mask)
    if (!strcmp(st->tensors[st->by_name[k] - 1].name, name)) return &st->tensors[st->by_name[k] - 1];
  return NULL;
}

/* Built once the load has placed every tensor: O(count), where a sorted table cost a sort of
 * the names. Names are distinct (the source refuses a name seen twice); were one not, the
 * first in file order would be found. */
sl_status sl__state_index(sl_state *st) {
  size_t cap = 16;
  while (cap < 2 * st->count) cap <<= 1;
  if (!(st->by_name = calloc(cap, sizeof *st->by_name))) return SL_ERR_NOMEM;
  st->name_mask = cap - 1;
  for (size_t i = 0; i < st->count; i++) {
    size_t k = name_slot(st->tensors[i].name, st->name_mask);
    while (st->by_name[k]) k = (k + 1) & st->name_mask;
    st->by_name[k] = i + 1;
  }
  return SL_OK;
}

SL_API size_t sl_state_skipped_count(const sl_state *st) { return st ? st->nskipped : 0; }
SL_API const char *sl_state_skipped_at(const sl_state *st, size_t i) {
  return st && i < st->nskipped ? st->skipped[i] : NULL;
}

/* A caller compiled against an older, shorter sl_load_stats gets the members it knows: the
 * library writes only within out->size (shardload.h). */
SL_API sl_status sl_state_stats(const sl_state *st, sl_load_stats *out) {
  if (!st || !out || out->size < sizeof out->size) return SL_ERR_INVALID;
  size_t n = out->size < sizeof *out ? out->size : sizeof *out;
  sl_load_stats full = st->stats;
  full.size = out->size; /* the caller's own value stays */
  memcpy(out, &full, n);
  return SL_OK;
}
