/* Event pools and signal-once events: an event is signalled by one command (or the host), stays
 * signalled until the host resets it, and a second signal before that reset is misuse. */
#define _GNU_SOURCE
#include "zedrv.h"

#include <stdlib.h>

static bool live(const void *obj) {
  return obj && *(const int *)obj == ZEDRV_MAGIC_LIVE;
}

static ze_result_t ZE_APICALL pool_create(ze_context_handle_t ctx, const ze_event_pool_desc_t *desc, uint32_t ndev,
                                          ze_device_handle_t *devs, ze_event_pool_handle_t *out) {
  if (!live(ctx)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc->count == 0) return ZE_RESULT_ERROR_INVALID_SIZE;
  for (uint32_t i = 0; i < ndev; i++)
    if (!zedrv_is_device(devs[i])) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  ze_event_pool_handle_t p = calloc(1, sizeof *p);
  if (!p) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  p->slots = calloc(desc->count, sizeof *p->slots);
  if (!p->slots) {
    free(p);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  p->magic = ZEDRV_MAGIC_LIVE;
  p->ctx = ctx;
  p->flags = desc->flags;
  p->count = desc->count;
  pthread_mutex_lock(&zd.lock);
  ctx->live_objects++;
  pthread_mutex_unlock(&zd.lock);
  *out = p;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL pool_destroy(ze_event_pool_handle_t p) {
  if (!live(p)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&zd.lock);
  for (uint32_t i = 0; i < p->count; i++)
    if (p->slots[i]) {
      zedrv_misuse("zeEventPoolDestroy: event %u of the pool is still alive", i);
      pthread_mutex_unlock(&zd.lock);
      return ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
    }
  p->ctx->live_objects--;
  pthread_mutex_unlock(&zd.lock);
  p->magic = ZEDRV_MAGIC_DEAD;
  free(p->slots);
  free(p);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL event_create(ze_event_pool_handle_t p, const ze_event_desc_t *desc,
                                           ze_event_handle_t *out) {
  if (!live(p)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc->index >= p->count) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  ze_result_t r = ZE_RESULT_SUCCESS;
  pthread_mutex_lock(&zd.lock);
  if (p->slots[desc->index]) {
    zedrv_misuse("zeEventCreate: index %u of the pool already holds an event", desc->index);
    r = ZE_RESULT_ERROR_INVALID_ARGUMENT;
    goto out_unlock;
  }
  ze_event_handle_t e = calloc(1, sizeof *e);
  if (!e) {
    r = ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    goto out_unlock;
  }
  e->magic = ZEDRV_MAGIC_LIVE;
  e->pool = p;
  e->index = desc->index;
  p->slots[desc->index] = e;
  *out = e;
out_unlock:
  pthread_mutex_unlock(&zd.lock);
  return r;
}

static ze_result_t ZE_APICALL event_destroy(ze_event_handle_t e) {
  if (!live(e)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&zd.lock);
  if (e->pending_signals > 0 || e->pending_waits > 0) {
    zedrv_misuse("zeEventDestroy: a queued command still %s the event (pool index %u): \"the application must "
                 "ensure the device is not currently referencing the event before it is deleted\"",
                 e->pending_signals > 0 ? "signals" : "waits for", e->index);
    pthread_mutex_unlock(&zd.lock);
    return ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
  }
  e->pool->slots[e->index] = NULL;
  e->magic = ZEDRV_MAGIC_DEAD;
  pthread_mutex_unlock(&zd.lock);
  free(e);
  return ZE_RESULT_SUCCESS;
}

void zedrv_event_add_pending(ze_event_handle_t e) {
  if (e->signalled || e->pending_signals > 0)
    zedrv_misuse("event (pool index %u) signalled again before a host reset: events are signal-once", e->index);
  e->pending_signals++;
}

void zedrv_event_fire(ze_event_handle_t e) {
  e->pending_signals--;
  e->signalled = true;
  pthread_cond_broadcast(&zd.cond);
}

bool zedrv_event_is_signalled(ze_event_handle_t e) {
  return e->signalled;
}

static ze_result_t ZE_APICALL event_host_signal(ze_event_handle_t e) {
  if (!live(e)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&zd.lock);
  zedrv_event_add_pending(e);
  zedrv_event_fire(e);
  pthread_mutex_unlock(&zd.lock);
  return ZE_RESULT_SUCCESS;
}

static bool event_done(const void *e) {
  return ((const struct _ze_event_handle_t *)e)->signalled;
}

static ze_result_t ZE_APICALL event_host_synchronize(ze_event_handle_t e, uint64_t timeout_ns) {
  if (!live(e)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&zd.lock);
  if (!(e->pool->flags & ZE_EVENT_POOL_FLAG_HOST_VISIBLE))
    zedrv_misuse("zeEventHostSynchronize: the event's pool is not host-visible");
  ze_result_t r = zedrv_wait(event_done, e, timeout_ns);
  pthread_mutex_unlock(&zd.lock);
  return r;
}

static ze_result_t ZE_APICALL event_query_status(ze_event_handle_t e) {
  return event_host_synchronize(e, 0);
}

static ze_result_t ZE_APICALL event_host_reset(ze_event_handle_t e) {
  if (!live(e)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&zd.lock);
  if (e->pending_signals > 0)
    zedrv_misuse("zeEventHostReset: a queued command still signals the event (pool index %u)", e->index);
  /* a queued wait that has not started yet would see the reset, or the signal, depending on
   * when the device gets to it: the reset races with the wait */
  if (e->pending_waits > 0)
    zedrv_misuse("zeEventHostReset: %d queued command%s not yet started still wait%s for the event (pool index %u)",
                 e->pending_waits, e->pending_waits == 1 ? "" : "s", e->pending_waits == 1 ? "s" : "", e->index);
  e->signalled = false;
  pthread_mutex_unlock(&zd.lock);
  return ZE_RESULT_SUCCESS;
}

ze_result_t zedrv_fill_event(ze_event_dditable_t *t) {
  t->pfnCreate = event_create;
  t->pfnDestroy = event_destroy;
  t->pfnHostSignal = event_host_signal;
  t->pfnHostSynchronize = event_host_synchronize;
  t->pfnQueryStatus = event_query_status;
  t->pfnHostReset = event_host_reset;
  return ZE_RESULT_SUCCESS;
}

ze_result_t zedrv_fill_event_pool(ze_event_pool_dditable_t *t) {
  t->pfnCreate = pool_create;
  t->pfnDestroy = pool_destroy;
  return ZE_RESULT_SUCCESS;
}
