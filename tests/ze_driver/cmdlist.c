/* Command lists (immediate and regular), their appends, command queues and fences. An append
 * validates and records; nothing runs until an engine (engine.c) takes the command. */
#define _GNU_SOURCE
#include "zedrv.h"

#include <stdlib.h>
#include <string.h>

static bool live(const void *obj) {
  return obj && *(const int *)obj == ZEDRV_MAGIC_LIVE;
}

static void ctx_count(ze_context_handle_t ctx, int delta) {
  pthread_mutex_lock(&zd.lock);
  ctx->live_objects += delta;
  pthread_mutex_unlock(&zd.lock);
}

/* ---- creation ---------------------------------------------------------------------------- */

static ze_result_t check_group(ze_context_handle_t ctx, ze_device_handle_t dev, uint32_t ordinal, uint32_t index) {
  if (!live(ctx) || !zedrv_is_device(dev)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ordinal >= ZEDRV_NUM_GROUPS) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (index >= (zedrv_group_is_copy_only(ordinal) ? 2u : 1u)) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL list_create_immediate(ze_context_handle_t ctx, ze_device_handle_t dev,
                                                    const ze_command_queue_desc_t *desc,
                                                    ze_command_list_handle_t *out) {
  ze_result_t r = check_group(ctx, dev, desc->ordinal, desc->index);
  if (r != ZE_RESULT_SUCCESS) return r;
  ze_command_list_handle_t l = calloc(1, sizeof *l);
  if (!l) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  l->ctx = ctx;
  l->immediate = true;
  l->copy_only = zedrv_group_is_copy_only(desc->ordinal);
  l->mode = desc->mode;
  r = zedrv_engine_start(&l->engine, l->copy_only, (desc->flags & ZE_COMMAND_QUEUE_FLAG_IN_ORDER) != 0);
  if (r != ZE_RESULT_SUCCESS) {
    free(l);
    return r;
  }
  l->magic = ZEDRV_MAGIC_LIVE;
  ctx_count(ctx, 1);
  *out = l;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL list_create(ze_context_handle_t ctx, ze_device_handle_t dev,
                                          const ze_command_list_desc_t *desc, ze_command_list_handle_t *out) {
  ze_result_t r = check_group(ctx, dev, desc->commandQueueGroupOrdinal, 0);
  if (r != ZE_RESULT_SUCCESS) return r;
  ze_command_list_handle_t l = calloc(1, sizeof *l);
  if (!l) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  l->ctx = ctx;
  l->copy_only = zedrv_group_is_copy_only(desc->commandQueueGroupOrdinal);
  l->in_order = (desc->flags & ZE_COMMAND_LIST_FLAG_IN_ORDER) != 0;
  l->magic = ZEDRV_MAGIC_LIVE;
  ctx_count(ctx, 1);
  *out = l;
  return ZE_RESULT_SUCCESS;
}

static void free_recorded(ze_command_list_handle_t l) {
  while (l->head) {
    zedrv_cmd *c = l->head;
    l->head = c->next;
    zedrv_cmd_free(c);
  }
  l->tail = NULL;
}

static ze_result_t ZE_APICALL list_destroy(ze_command_list_handle_t l) {
  if (!live(l)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (l->immediate) {
    pthread_mutex_lock(&zd.lock);
    if (l->engine.in_flight > 0)
      zedrv_misuse("zeCommandListDestroy: %d commands of the immediate list have not completed; "
                   "synchronize on their events first",
                   l->engine.in_flight);
    pthread_mutex_unlock(&zd.lock);
    /* the worker finishes what can run, then drops the rest */
    zedrv_engine_stop(&l->engine);
  }
  free_recorded(l);
  ctx_count(l->ctx, -1);
  l->magic = ZEDRV_MAGIC_DEAD;
  free(l);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL list_close(ze_command_list_handle_t l) {
  if (!live(l)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!l->immediate) l->closed = true;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL list_reset(ze_command_list_handle_t l) {
  if (!live(l)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (l->immediate) {
    pthread_mutex_lock(&zd.lock);
    ze_result_t r = zedrv_engine_sync(&l->engine, UINT64_MAX);
    pthread_mutex_unlock(&zd.lock);
    return r;
  }
  free_recorded(l);
  l->closed = false;
  return ZE_RESULT_SUCCESS;
}

/* ---- appends ----------------------------------------------------------------------------- */

/* A range inside a USM allocation must end inside it (a device would fault); zd.lock held. */
static bool range_ok(const char *what, const void *p, size_t size) {
  const zedrv_alloc *a = zedrv_alloc_find(p);
  if (!a || size == 0) return true;
  if ((const char *)p + size > a->base + a->size) {
    zedrv_misuse("%s: %zu bytes at offset %zu run past the end of a %zu-byte allocation", what, size,
                 (size_t)((const char *)p - a->base), a->size);
    return false;
  }
  return true;
}

static ze_result_t new_cmd(ze_command_list_handle_t l, zedrv_cmd_kind kind, ze_event_handle_t signal, uint32_t nwait,
                           ze_event_handle_t *waits, zedrv_cmd **out) {
  if (!live(l)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (l->closed) return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* appending to a closed list */
  if (signal && !live(signal)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (nwait && !waits) return ZE_RESULT_ERROR_INVALID_SIZE;
  for (uint32_t i = 0; i < nwait; i++)
    if (!live(waits[i])) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  zedrv_cmd *c = calloc(1, sizeof *c);
  if (!c) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  if (nwait) {
    c->wait = malloc(nwait * sizeof *c->wait);
    if (!c->wait) {
      free(c);
      return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    }
    memcpy(c->wait, waits, nwait * sizeof *c->wait);
  }
  c->kind = kind;
  c->nwait = nwait;
  c->signal = signal;
  *out = c;
  return ZE_RESULT_SUCCESS;
}

/* Queues an immediate list's command (a synchronous list returns when it has run) or records a
 * regular list's; zd.lock held. */
static ze_result_t submit(ze_command_list_handle_t l, zedrv_cmd *c) {
  if (!l->immediate) {
    c->next = NULL;
    if (l->tail)
      l->tail->next = c;
    else
      l->head = c;
    l->tail = c;
    return ZE_RESULT_SUCCESS;
  }
  if (zd.device_lost) {
    zedrv_cmd_free(c);
    return ZE_RESULT_ERROR_DEVICE_LOST;
  }
  zedrv_engine_push(&l->engine, c);
  if (l->mode == ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS) return zedrv_engine_sync(&l->engine, UINT64_MAX);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL append_barrier(ze_command_list_handle_t l, ze_event_handle_t signal, uint32_t nwait,
                                             ze_event_handle_t *waits) {
  zedrv_cmd *c;
  ze_result_t r = new_cmd(l, ZEDRV_CMD_BARRIER, signal, nwait, waits, &c);
  if (r != ZE_RESULT_SUCCESS) return r;
  pthread_mutex_lock(&zd.lock);
  r = submit(l, c);
  pthread_mutex_unlock(&zd.lock);
  return r;
}

/* The spec gives a signal command no ordering of its own (unlike a barrier's "all previous
 * commands ... must complete"): it may fire before the commands appended earlier completed. */
static ze_result_t ZE_APICALL append_signal_event(ze_command_list_handle_t l, ze_event_handle_t ev) {
  if (!ev) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  zedrv_cmd *c;
  ze_result_t r = new_cmd(l, ZEDRV_CMD_SIGNAL, ev, 0, NULL, &c);
  if (r != ZE_RESULT_SUCCESS) return r;
  pthread_mutex_lock(&zd.lock);
  r = submit(l, c);
  pthread_mutex_unlock(&zd.lock);
  return r;
}

/* A device-side wait blocks the commands after it until the events are signalled, as a barrier
 * with those events (and, like it, waits for nothing else). */
static ze_result_t ZE_APICALL append_wait_on_events(ze_command_list_handle_t l, uint32_t n, ze_event_handle_t *evs) {
  if (n == 0) return live(l) ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE; /* waits for nothing */
  return append_barrier(l, NULL, n, evs);
}

static ze_result_t ZE_APICALL append_ranges_barrier(ze_command_list_handle_t l, uint32_t nranges, const size_t *sizes,
                                                    const void **ranges, ze_event_handle_t signal, uint32_t nwait,
                                                    ze_event_handle_t *waits) {
  return append_barrier(l, signal, nwait, waits);
}

static ze_result_t ZE_APICALL append_copy(ze_command_list_handle_t l, void *dst, const void *src, size_t size,
                                          ze_event_handle_t signal, uint32_t nwait, ze_event_handle_t *waits) {
  if (!dst || !src) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  zedrv_cmd *c;
  ze_result_t r = new_cmd(l, ZEDRV_CMD_COPY, signal, nwait, waits, &c);
  if (r != ZE_RESULT_SUCCESS) return r;
  c->u.copy.dst = dst;
  c->u.copy.src = src;
  c->u.copy.size = size;
  pthread_mutex_lock(&zd.lock);
  if (!range_ok("zeCommandListAppendMemoryCopy destination", dst, size) ||
      !range_ok("zeCommandListAppendMemoryCopy source", src, size)) {
    zedrv_cmd_free(c);
    r = ZE_RESULT_ERROR_INVALID_SIZE;
  } else {
    r = submit(l, c);
  }
  pthread_mutex_unlock(&zd.lock);
  return r;
}

/* The bytes a region spans from its pointer: the last row's end. */
static size_t region_extent(const ze_copy_region_t *g, uint32_t pitch, uint32_t slice) {
  uint32_t depth = g->depth ? g->depth : 1;
  if (!g->height || !g->width) return 0;
  return (size_t)(g->originZ + depth - 1) * slice + (size_t)(g->originY + g->height - 1) * pitch + g->originX +
         g->width;
}

static ze_result_t ZE_APICALL append_copy_region(ze_command_list_handle_t l, void *dst, const ze_copy_region_t *dr,
                                                 uint32_t dpitch, uint32_t dslice, const void *src,
                                                 const ze_copy_region_t *sr, uint32_t spitch, uint32_t sslice,
                                                 ze_event_handle_t signal, uint32_t nwait, ze_event_handle_t *waits) {
  if (!dst || !src || !dr || !sr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  /* both regions describe the same box; a row must fit in its pitch */
  if (dr->width != sr->width || dr->height != sr->height || dr->depth != sr->depth)
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (dr->originX + dr->width > dpitch || sr->originX + sr->width > spitch) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (dr->depth && ((uint64_t)dpitch * (dr->originY + dr->height) > dslice ||
                    (uint64_t)spitch * (sr->originY + sr->height) > sslice))
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  zedrv_cmd *c;
  ze_result_t r = new_cmd(l, ZEDRV_CMD_COPY_REGION, signal, nwait, waits, &c);
  if (r != ZE_RESULT_SUCCESS) return r;
  c->u.region.dst = dst;
  c->u.region.src = src;
  c->u.region.dr = *dr;
  c->u.region.sr = *sr;
  c->u.region.dpitch = dpitch;
  c->u.region.dslice = dslice;
  c->u.region.spitch = spitch;
  c->u.region.sslice = sslice;
  pthread_mutex_lock(&zd.lock);
  if (!range_ok("zeCommandListAppendMemoryCopyRegion destination", dst, region_extent(dr, dpitch, dslice)) ||
      !range_ok("zeCommandListAppendMemoryCopyRegion source", src, region_extent(sr, spitch, sslice))) {
    zedrv_cmd_free(c);
    r = ZE_RESULT_ERROR_INVALID_SIZE;
  } else {
    r = submit(l, c);
  }
  pthread_mutex_unlock(&zd.lock);
  return r;
}

static ze_result_t ZE_APICALL append_fill(ze_command_list_handle_t l, void *dst, const void *pattern,
                                          size_t pattern_size, size_t size, ze_event_handle_t signal, uint32_t nwait,
                                          ze_event_handle_t *waits) {
  if (!dst || !pattern) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (pattern_size == 0 || pattern_size > 128 || (pattern_size & (pattern_size - 1)))
    return ZE_RESULT_ERROR_INVALID_SIZE;
  zedrv_cmd *c;
  ze_result_t r = new_cmd(l, ZEDRV_CMD_FILL, signal, nwait, waits, &c);
  if (r != ZE_RESULT_SUCCESS) return r;
  c->u.fill.dst = dst;
  memcpy(c->u.fill.pattern, pattern, pattern_size);
  c->u.fill.pattern_size = pattern_size;
  c->u.fill.size = size;
  pthread_mutex_lock(&zd.lock);
  if (!range_ok("zeCommandListAppendMemoryFill", dst, size)) {
    zedrv_cmd_free(c);
    r = ZE_RESULT_ERROR_INVALID_SIZE;
  } else {
    r = submit(l, c);
  }
  pthread_mutex_unlock(&zd.lock);
  return r;
}

static ze_result_t ZE_APICALL append_prefetch(ze_command_list_handle_t l, const void *p, size_t size) {
  return live(l) ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

static ze_result_t ZE_APICALL append_launch(ze_command_list_handle_t l, ze_kernel_handle_t k,
                                            const ze_group_count_t *groups, ze_event_handle_t signal, uint32_t nwait,
                                            ze_event_handle_t *waits) {
  if (!live(k)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!groups) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (live(l) && l->copy_only) return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* a copy engine runs no kernels */
  uint32_t need = k->fn->nargs ? (uint32_t)((1ull << k->fn->nargs) - 1) : 0;
  if ((k->args.set_mask & need) != need)
    return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* the Intel runtime refuses a launch with an unset argument */
  zedrv_cmd *c;
  ze_result_t r = new_cmd(l, ZEDRV_CMD_KERNEL, signal, nwait, waits, &c);
  if (r != ZE_RESULT_SUCCESS) return r;
  /* a launch takes the arguments as they are now: a later zeKernelSetArgumentValue does not
     * change a queued launch */
  c->u.kernel.fn = k->fn;
  c->u.kernel.args = k->args;
  memcpy(c->u.kernel.group_size, k->group_size, sizeof c->u.kernel.group_size);
  c->u.kernel.groups = *groups;
  pthread_mutex_lock(&zd.lock);
  r = submit(l, c);
  pthread_mutex_unlock(&zd.lock);
  return r;
}

ze_result_t zedrv_fill_command_list(ze_command_list_dditable_t *t) {
  t->pfnCreate = list_create;
  t->pfnCreateImmediate = list_create_immediate;
  t->pfnDestroy = list_destroy;
  t->pfnClose = list_close;
  t->pfnReset = list_reset;
  t->pfnAppendBarrier = append_barrier;
  t->pfnAppendMemoryRangesBarrier = append_ranges_barrier;
  t->pfnAppendMemoryCopy = append_copy;
  t->pfnAppendMemoryFill = append_fill;
  t->pfnAppendMemoryCopyRegion = append_copy_region;
  t->pfnAppendMemoryPrefetch = append_prefetch;
  t->pfnAppendSignalEvent = append_signal_event;
  t->pfnAppendWaitOnEvents = append_wait_on_events;
  t->pfnAppendLaunchKernel = append_launch;
  return ZE_RESULT_SUCCESS;
}

/* ---- command queues ---------------------------------------------------------------------- */

static ze_result_t ZE_APICALL queue_create(ze_context_handle_t ctx, ze_device_handle_t dev,
                                           const ze_command_queue_desc_t *desc, ze_command_queue_handle_t *out) {
  ze_result_t r = check_group(ctx, dev, desc->ordinal, desc->index);
  if (r != ZE_RESULT_SUCCESS) return r;
  ze_command_queue_handle_t q = calloc(1, sizeof *q);
  if (!q) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  q->ctx = ctx;
  q->mode = desc->mode;
  r = zedrv_engine_start(&q->engine, zedrv_group_is_copy_only(desc->ordinal),
                         (desc->flags & ZE_COMMAND_QUEUE_FLAG_IN_ORDER) != 0);
  if (r != ZE_RESULT_SUCCESS) {
    free(q);
    return r;
  }
  q->magic = ZEDRV_MAGIC_LIVE;
  ctx_count(ctx, 1);
  *out = q;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL queue_destroy(ze_command_queue_handle_t q) {
  if (!live(q)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&zd.lock);
  if (q->engine.in_flight > 0)
    zedrv_misuse("zeCommandQueueDestroy: %d commands have not completed", q->engine.in_flight);
  pthread_mutex_unlock(&zd.lock);
  zedrv_engine_stop(&q->engine);
  ctx_count(q->ctx, -1);
  q->magic = ZEDRV_MAGIC_DEAD;
  free(q);
  return ZE_RESULT_SUCCESS;
}

static zedrv_cmd *clone_cmd(const zedrv_cmd *c) {
  zedrv_cmd *n = malloc(sizeof *n);
  if (!n) return NULL;
  *n = *c;
  n->next = NULL;
  n->wait = NULL;
  if (c->nwait) {
    n->wait = malloc(c->nwait * sizeof *n->wait);
    if (!n->wait) {
      free(n);
      return NULL;
    }
    memcpy(n->wait, c->wait, c->nwait * sizeof *n->wait);
  }
  return n;
}

static ze_result_t ZE_APICALL queue_execute(ze_command_queue_handle_t q, uint32_t n, ze_command_list_handle_t *lists,
                                            ze_fence_handle_t fence) {
  if (!live(q)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  for (uint32_t i = 0; i < n; i++) {
    if (!live(lists[i]) || lists[i]->immediate) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!lists[i]->closed) return ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE;
    if (lists[i]->copy_only != q->engine.copy_only)
      return ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE; /* made for another queue group */
  }
  if (fence && (!live(fence) || fence->queue != q)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  ze_result_t r = ZE_RESULT_SUCCESS;
  pthread_mutex_lock(&zd.lock);
  if (zd.device_lost) {
    r = ZE_RESULT_ERROR_DEVICE_LOST;
    goto out_unlock;
  }
  if (fence && (fence->signalled || fence->pending))
    zedrv_misuse("zeCommandQueueExecuteCommandLists: the fence was not reset since its last use");
  for (uint32_t i = 0; i < n; i++)
    for (const zedrv_cmd *c = lists[i]->head; c; c = c->next) {
      zedrv_cmd *copy = clone_cmd(c);
      if (!copy) {
        r = ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
        goto out_unlock;
      }
      copy->ordered = lists[i]->in_order;
      zedrv_engine_push(&q->engine, copy);
    }
  if (fence) {
    zedrv_cmd *f = calloc(1, sizeof *f);
    if (!f) {
      r = ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
      goto out_unlock;
    }
    f->kind = ZEDRV_CMD_FENCE;
    f->fence = fence;
    fence->signalled = false;
    zedrv_engine_push(&q->engine, f);
  }
  if (q->mode == ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS) r = zedrv_engine_sync(&q->engine, UINT64_MAX);
out_unlock:
  pthread_mutex_unlock(&zd.lock);
  return r;
}

static ze_result_t ZE_APICALL queue_synchronize(ze_command_queue_handle_t q, uint64_t timeout_ns) {
  if (!live(q)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&zd.lock);
  ze_result_t r = zedrv_engine_sync(&q->engine, timeout_ns);
  pthread_mutex_unlock(&zd.lock);
  return r;
}

ze_result_t zedrv_fill_command_queue(ze_command_queue_dditable_t *t) {
  t->pfnCreate = queue_create;
  t->pfnDestroy = queue_destroy;
  t->pfnExecuteCommandLists = queue_execute;
  t->pfnSynchronize = queue_synchronize;
  return ZE_RESULT_SUCCESS;
}

/* ---- fences ------------------------------------------------------------------------------ */

static ze_result_t ZE_APICALL fence_create(ze_command_queue_handle_t q, const ze_fence_desc_t *desc,
                                           ze_fence_handle_t *out) {
  if (!live(q)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  ze_fence_handle_t f = calloc(1, sizeof *f);
  if (!f) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  f->magic = ZEDRV_MAGIC_LIVE;
  f->queue = q;
  f->signalled = desc && (desc->flags & ZE_FENCE_FLAG_SIGNALED);
  *out = f;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL fence_destroy(ze_fence_handle_t f) {
  if (!live(f)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&zd.lock);
  bool pending = f->pending;
  if (pending) zedrv_misuse("zeFenceDestroy: the fence's submission has not completed");
  pthread_mutex_unlock(&zd.lock);
  if (pending) return ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
  f->magic = ZEDRV_MAGIC_DEAD;
  free(f);
  return ZE_RESULT_SUCCESS;
}

static bool fence_done(const void *arg) {
  return ((const struct _ze_fence_handle_t *)arg)->signalled;
}

static ze_result_t ZE_APICALL fence_host_synchronize(ze_fence_handle_t f, uint64_t timeout_ns) {
  if (!live(f)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&zd.lock);
  ze_result_t r = zedrv_wait(fence_done, f, timeout_ns);
  pthread_mutex_unlock(&zd.lock);
  return r;
}

static ze_result_t ZE_APICALL fence_query_status(ze_fence_handle_t f) {
  return fence_host_synchronize(f, 0);
}

static ze_result_t ZE_APICALL fence_reset(ze_fence_handle_t f) {
  if (!live(f)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&zd.lock);
  if (f->pending) zedrv_misuse("zeFenceReset: the fence's submission has not completed");
  f->signalled = false;
  pthread_mutex_unlock(&zd.lock);
  return ZE_RESULT_SUCCESS;
}

ze_result_t zedrv_fill_fence(ze_fence_dditable_t *t) {
  t->pfnCreate = fence_create;
  t->pfnDestroy = fence_destroy;
  t->pfnHostSynchronize = fence_host_synchronize;
  t->pfnQueryStatus = fence_query_status;
  t->pfnReset = fence_reset;
  return ZE_RESULT_SUCCESS;
}
