/* Engines: the worker threads that run commands LATER. Each engine takes its commands in order
 * (a command list without ZE_COMMAND_LIST_FLAG_RELAXED_ORDERING is in order), waits for each
 * command's wait events, sleeps a random delay, and runs it outside the driver's lock; only
 * events order two engines. Copies run in two halves with a pause between, so a reader that
 * skipped a wait can see torn data as well as stale data. */
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

/* Retires the head command: its signal event and fence fire; zd.lock held. */
static void retire(zedrv_engine *e, zedrv_cmd *c, bool ran) {
  e->head = c->next;
  if (!e->head) e->tail = NULL;
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

static bool engine_woken(const zedrv_engine *e) {
  return e->stop || (e->head && (zd.device_lost || waits_done(e->head)));
}

static void *engine_main(void *arg) {
  zedrv_engine *e = arg;
  unsigned seed = (unsigned)(uintptr_t)e ^ (unsigned)time(NULL);
  pthread_mutex_lock(&zd.lock);
  for (;;) {
    while (!engine_woken(e)) pthread_cond_wait(&zd.cond, &zd.lock);
    zedrv_cmd *c = e->head;
    if (!c && e->stop) break;
    if (zd.device_lost || (e->stop && !waits_done(c))) {
      /* a lost device runs nothing more; a destroyed list drops what can never start */
      while (e->head) retire(e, e->head, false);
      if (e->stop) break;
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
    retire(e, c, r == ZE_RESULT_SUCCESS);
  }
  pthread_mutex_unlock(&zd.lock);
  return NULL;
}

ze_result_t zedrv_engine_start(zedrv_engine *e, bool copy_only) {
  memset(e, 0, sizeof *e);
  e->copy_only = copy_only;
  if (pthread_create(&e->thread, NULL, engine_main, e) != 0) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  return ZE_RESULT_SUCCESS;
}

void zedrv_engine_stop(zedrv_engine *e) {
  pthread_mutex_lock(&zd.lock);
  e->stop = true;
  pthread_cond_broadcast(&zd.cond);
  pthread_mutex_unlock(&zd.lock);
  pthread_join(e->thread, NULL);
}

void zedrv_engine_push(zedrv_engine *e, zedrv_cmd *c) {
  c->next = NULL;
  if (e->tail)
    e->tail->next = c;
  else
    e->head = c;
  e->tail = c;
  e->in_flight++;
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
