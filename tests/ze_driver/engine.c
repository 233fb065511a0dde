/* Engines: the worker threads that run commands LATER. Each engine (an immediate list or a
 * queue) has ZEDRV_WORKERS workers; each starts any queued command nothing orders after another
 * (startable(): its wait events, the barriers before it, the in-order flag), picked at random,
 * sleeps a random delay and runs it outside the driver's lock, so that unordered commands of
 * one list overlap and complete in any order, as the spec allows ("Commands executed on a
 * command list are only guaranteed to start in the same order in which they are submitted;
 * i.e. there is no implicit definition of the order of completion"; this driver does not keep
 * even the start order). Only events order two engines. Copies run in two halves with a pause
 * between, so a reader that skipped a wait can see torn data as well as stale data. */
#define _GNU_SOURCE
#include "zedrv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

ze_result_t zedrv_wait(bool (*done)(const void *), const void *arg, uint64_t timeout_ns) {
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  if (timeout_ns != UINT64_MAX) {
    uint64_t ns = (uint64_t)dl.tv_nsec + timeout_ns % 1000000000ull;
    dl.tv_sec += (time_t)(timeout_ns / 1000000000ull + ns / 1000000000ull);
    dl.tv_nsec = (long)(ns % 1000000000ull);
  }
  while (!done(arg)) {
    if (zd.device_lost) return ZE_RESULT_ERROR_DEVICE_LOST;
    if (timeout_ns == 0) return ZE_RESULT_NOT_READY;
    if (timeout_ns == UINT64_MAX)
      pthread_cond_wait(&zd.cond, &zd.lock);
    else if (pthread_cond_timedwait(&zd.cond, &zd.lock, &dl) == ETIMEDOUT && !done(arg))
      return zd.device_lost ? ZE_RESULT_ERROR_DEVICE_LOST : ZE_RESULT_NOT_READY;
  }
  return ZE_RESULT_SUCCESS;
}

void zedrv_cmd_free(zedrv_cmd *cmd) {
  if (!cmd) return;
  free(cmd->wait);
  free(cmd);
}

static void pause_us(unsigned us) {
  if (us) usleep(us);
}

static unsigned random_delay(unsigned *seed) {
  unsigned span = zd.delay_max_us - zd.delay_min_us;
  return zd.delay_min_us + (span ? (unsigned)rand_r(seed) % (span + 1) : 0);
}

static void run_copy(const zedrv_cmd *c, unsigned delay_us) {
  size_t half = c->u.copy.size / 2;
  memmove(c->u.copy.dst, c->u.copy.src, half);
  pause_us(delay_us / 4);
  memmove((char *)c->u.copy.dst + half, (const char *)c->u.copy.src + half, c->u.copy.size - half);
}

static void run_region(const zedrv_cmd *c) {
  const ze_copy_region_t *d = &c->u.region.dr, *s = &c->u.region.sr;
  uint32_t depth = d->depth ? d->depth : 1;
  for (uint32_t z = 0; z < depth; z++)
    for (uint32_t y = 0; y < d->height; y++) {
      size_t doff =
          (size_t)(d->originZ + z) * c->u.region.dslice + (size_t)(d->originY + y) * c->u.region.dpitch + d->originX;
      size_t soff =
          (size_t)(s->originZ + z) * c->u.region.sslice + (size_t)(s->originY + y) * c->u.region.spitch + s->originX;
      memmove(c->u.region.dst + doff, c->u.region.src + soff, d->width);
    }
}

static void run_fill(const zedrv_cmd *c) {
  for (size_t i = 0; i < c->u.fill.size; i++) c->u.fill.dst[i] = c->u.fill.pattern[i % c->u.fill.pattern_size];
}

/* Runs one command's work (no lock held); an error is a device fault. */
static ze_result_t run_cmd(const zedrv_cmd *c, unsigned delay_us) {
  switch (c->kind) {
  case ZEDRV_CMD_COPY:
    run_copy(c, delay_us);
    break;
  case ZEDRV_CMD_COPY_REGION:
    run_region(c);
    break;
  case ZEDRV_CMD_FILL:
    run_fill(c);
    break;
  case ZEDRV_CMD_KERNEL: {
    zedrv_launch l = {.args = &c->u.kernel.args, .groups = c->u.kernel.groups};
    memcpy(l.group_size, c->u.kernel.group_size, sizeof l.group_size);
    return c->u.kernel.fn->run(&l);
  }
  case ZEDRV_CMD_BARRIER:
  case ZEDRV_CMD_SIGNAL:
  case ZEDRV_CMD_FENCE:
    break;
  }
  return ZE_RESULT_SUCCESS;
}

/* Strict mode: opens the device memory a command names (a kernel: every pointer argument) for
 * the time it runs; zd.lock held. */
static void open_one(zedrv_cmd *c, const void *p) {
  void *base = zedrv_alloc_open(p);
  if (base) c->opened[c->nopened++] = base;
}

static void open_memory(zedrv_cmd *c) {
  c->nopened = 0;
  if (!zd.strict) return;
  switch (c->kind) {
  case ZEDRV_CMD_COPY:
    open_one(c, c->u.copy.dst);
    open_one(c, c->u.copy.src);
    break;
  case ZEDRV_CMD_COPY_REGION:
    open_one(c, c->u.region.dst);
    open_one(c, c->u.region.src);
    break;
  case ZEDRV_CMD_FILL:
    open_one(c, c->u.fill.dst);
    break;
  case ZEDRV_CMD_KERNEL:
    for (uint32_t i = 0; i < c->u.kernel.fn->nargs; i++)
      if (c->u.kernel.args.size[i] == sizeof(void *)) {
        void *p;
        memcpy(&p, c->u.kernel.args.value[i], sizeof p);
        open_one(c, p);
      }
    break;
  case ZEDRV_CMD_BARRIER:
  case ZEDRV_CMD_SIGNAL:
  case ZEDRV_CMD_FENCE:
    break;
  }
}

static void close_memory(zedrv_cmd *c) {
  for (uint32_t i = 0; i < c->nopened; i++) zedrv_alloc_close(c->opened[i]);
  c->nopened = 0;
}

static bool waits_done(const void *arg) {
  const zedrv_cmd *c = arg;
  for (uint32_t i = 0; i < c->nwait; i++)
    if (!zedrv_event_is_signalled(c->wait[i])) return false;
  return true;
}

/* A barrier (execution barrier, WaitOnEvents) or a fence: blocks every later command from
 * starting until it completed. A barrier without waits and a fence also wait for every earlier
 * command to complete ("If numWaitEvents is zero, then all previous commands ... must complete
 * prior to the execution of the barrier. This is not the case when numWaitEvents is non-zero"). */
static bool is_barrier(const zedrv_cmd *c) {
  return c->kind == ZEDRV_CMD_BARRIER || c->kind == ZEDRV_CMD_FENCE;
}

static bool waits_for_all_before(const zedrv_cmd *c) {
  return c->ordered || c->kind == ZEDRV_CMD_FENCE || (c->kind == ZEDRV_CMD_BARRIER && c->nwait == 0);
}

/* Whether C (queued) may start now: its waits are signalled, no barrier before it (queued or
 * running) is still pending, and, where it waits for everything before it, nothing before it is
 * left. Nothing else orders it: the spec guarantees only that commands START in append order,
 * and this driver does not even keep that, so that a client relying on anything but barriers,
 * events and the in-order flag is caught. zd.lock held. */
static bool startable(const zedrv_engine *e, const zedrv_cmd *c) {
  if (!waits_done(c)) return false;
  bool all = waits_for_all_before(c);
  for (const zedrv_cmd *o = e->running; o; o = o->next)
    if (o->seq < c->seq && (all || is_barrier(o))) return false;
  for (const zedrv_cmd *o = e->head; o != c; o = o->next)
    if (all || is_barrier(o)) return false;
  return true;
}

/* Takes a startable command at random off the queue (NULL: none); zd.lock held. */
static zedrv_cmd *take(zedrv_engine *e) {
  if (zd.device_lost) return NULL;
  unsigned n = 0;
  for (const zedrv_cmd *c = e->head; c; c = c->next) n += startable(e, c);
  if (!n) return NULL;
  unsigned pick = (unsigned)rand_r(&e->seed) % n;
  zedrv_cmd *prev = NULL;
  for (zedrv_cmd *c = e->head; c; prev = c, c = c->next)
    if (startable(e, c) && pick-- == 0) {
      if (prev)
        prev->next = c->next;
      else
        e->head = c->next;
      if (e->tail == c) e->tail = prev;
      for (uint32_t i = 0; i < c->nwait; i++) c->wait[i]->pending_waits--;
      c->next = e->running;
      e->running = c;
      return c;
    }
  return NULL;
}

/* Retires a command: its signal event and fence fire (or, when it never ran, are released);
 * zd.lock held. */
static void retire(zedrv_engine *e, zedrv_cmd *c, bool ran) {
  if (c->signal) {
    if (ran)
      zedrv_event_fire(c->signal);
    else
      c->signal->pending_signals--;
  }
  if (c->fence) {
    c->fence->pending = false;
    c->fence->signalled = ran;
  }
  e->in_flight--;
  pthread_cond_broadcast(&zd.cond);
  zedrv_cmd_free(c);
}

static void unlink_running(zedrv_engine *e, zedrv_cmd *c) {
  for (zedrv_cmd **p = &e->running; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      return;
    }
}

/* Drops every queued command unrun (a lost device, a destroyed list); zd.lock held. */
static void drop_queued(zedrv_engine *e) {
  while (e->head) {
    zedrv_cmd *c = e->head;
    e->head = c->next;
    for (uint32_t i = 0; i < c->nwait; i++) c->wait[i]->pending_waits--;
    retire(e, c, false);
  }
  e->tail = NULL;
}

static void *engine_main(void *arg) {
  zedrv_engine *e = arg;
  unsigned seed = (unsigned)(uintptr_t)&seed ^ (unsigned)time(NULL);
  pthread_mutex_lock(&zd.lock);
  for (;;) {
    zedrv_cmd *c = take(e);
    if (!c) {
      if (zd.device_lost) drop_queued(e); /* a lost device runs nothing more */
      /* a destroyed list drops what can never start, once nothing running can unblock it */
      if (e->stop && !e->running) drop_queued(e);
      if (e->stop && !e->head) break;
      pthread_cond_wait(&zd.cond, &zd.lock);
      continue;
    }
    unsigned delay = random_delay(&seed);
    open_memory(c);
    pthread_mutex_unlock(&zd.lock);
    pause_us(delay);
    ze_result_t r = run_cmd(c, delay);
    pthread_mutex_lock(&zd.lock);
    close_memory(c);
    if (r != ZE_RESULT_SUCCESS || (zd.lose_after && ++zd.commands_run >= zd.lose_after)) zd.device_lost = true;
    unlink_running(e, c);
    retire(e, c, r == ZE_RESULT_SUCCESS);
  }
  pthread_mutex_unlock(&zd.lock);
  return NULL;
}

ze_result_t zedrv_engine_start(zedrv_engine *e, bool copy_only, bool in_order) {
  memset(e, 0, sizeof *e);
  e->copy_only = copy_only;
  e->in_order = in_order;
  e->seed = (unsigned)(uintptr_t)e ^ (unsigned)time(NULL);
  for (; e->nthreads < ZEDRV_WORKERS; e->nthreads++)
    if (pthread_create(&e->threads[e->nthreads], NULL, engine_main, e) != 0) {
      zedrv_engine_stop(e);
      return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    }
  return ZE_RESULT_SUCCESS;
}

void zedrv_engine_stop(zedrv_engine *e) {
  pthread_mutex_lock(&zd.lock);
  e->stop = true;
  pthread_cond_broadcast(&zd.cond);
  pthread_mutex_unlock(&zd.lock);
  for (int i = 0; i < e->nthreads; i++) pthread_join(e->threads[i], NULL);
  e->nthreads = 0;
}

/* A command of an in-order engine is ordered after everything before it; a queued command's
 * waits are counted on its events (a host reset of one of them is misuse until it starts). */
void zedrv_engine_push(zedrv_engine *e, zedrv_cmd *c) {
  c->next = NULL;
  c->seq = e->next_seq++;
  if (e->in_order) c->ordered = true;
  if (e->tail)
    e->tail->next = c;
  else
    e->head = c;
  e->tail = c;
  e->in_flight++;
  for (uint32_t i = 0; i < c->nwait; i++) c->wait[i]->pending_waits++;
  if (c->signal) zedrv_event_add_pending(c->signal);
  if (c->fence) c->fence->pending = true;
  pthread_cond_broadcast(&zd.cond);
}

static bool engine_idle(const void *arg) {
  return ((const zedrv_engine *)arg)->in_flight == 0;
}

ze_result_t zedrv_engine_sync(zedrv_engine *e, uint64_t timeout_ns) {
  return zedrv_wait(engine_idle, e, timeout_ns);
}
