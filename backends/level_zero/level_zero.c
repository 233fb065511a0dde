/* libshardload-level_zero.so: the Level Zero backend (Intel GPUs), through the loader opened at
 * run time (ze_rt.h).
 *
 * Streams are immediate command lists: copies on the device's copy-only queue group (found by
 * its flags; the compute group where there is none), kernels on a compute group (below). A stream is in order (module.h), a Level Zero list is not: "Commands executed on a
 * command list are only guaranteed to start in the same order in which they are submitted;
 * i.e. there is no implicit definition of the order of completion" (spec, Execution Barriers).
 * Two ways to order them: the in-order flag (ZE_COMMAND_QUEUE_FLAG_IN_ORDER) or events and
 * barriers. The flag came with spec 1.7: the 1.8.12 loader's headers (API 1.4) lack it, its
 * validation layer refuses it (ZE_RESULT_ERROR_INVALID_ENUMERATION), and a driver older than 1.7
 * may ignore the bit and run the list unordered. Events and barriers are core since 1.0 and
 * every driver honours them, so every command a stream appends signals a Level Zero event of its
 * own and waits for the event of the command before it ("Events provide explicit, fine-grain
 * control over execution dependencies between commands"): a stream's TAIL (its last command's
 * event) completes once everything queued on it has, and the commands run in the order they
 * were queued. A stream's wait is one barrier that waits for the tail and the awaited record
 * ("only all phWaitEvents must be signaled prior to the execution of the barrier"; "This command
 * blocks all following commands from beginning until the execution of the barrier completes").
 *
 * Events (module.h: an event stands for its last record). Level Zero events signal once and
 * are reset only by the host, so the module's events are not Level Zero events: a RECORD (one
 * Level Zero event from a host-visible pool, sl_ze_rec) is the stream's tail at event_record,
 * the sl event holds its last record, and a queued wait holds the record it saw. A record is
 * counted (refs: the stream whose tail it is, the sl events whose last record it is, the
 * commands that wait for it until they are known done) and reset for reuse only once nothing
 * names it and it has signalled; a command is known done when its own record has signalled,
 * which releases the records it waited for. Pools are recycled, never freed before fini.
 *
 * Sticky errors: a failed append or a failed event (device lost) is kept (status and message)
 * and returned by every later sync. Syncs poll zeEventHostSynchronize in short slices up to the
 * job's timeout, so that none outlasts the data collective's watchdog.
 *
 * 2-D copies are region copies (zeCommandListAppendMemoryCopyRegion), whose 32-bit pitches
 * make larger strides one copy per row.
 *
 * Memory lent to other streams (DLPack): event_record_native appends a barrier that signals a
 * record on the consumer's command list; free_device_after keeps the buffers with those records
 * and frees them at a later call once all have signalled (fini waits for them, bounded).
 *
 * fini waits, bounded by the job's timeout, for every stream's tail and every record whose
 * signal may be pending (a consumer's, whose sl event is gone already) before it destroys the
 * event pools; where that work outlasts the timeout, or a stream given up (SL_EXT_STREAM_ABANDON)
 * is still busy, it leaves pools and context behind, with a warning, rather than destroy them
 * under the device.
 *
 * Host functions (Level Zero has none): a thread of the module's waits for the stream's tail,
 * runs the function and signals, from the host, the record that becomes the stream's tail.
 *
 * Casts and the SGD step are SPIR-V kernels (ze_cast.h: modules built at init, kernels by name)
 * on a second immediate list per stream, on a compute group, made at the stream's first kernel;
 * it joins the stream's one chain of events, so copies and kernels of a stream run in the order
 * they were queued whichever list holds them. Pairs the device cannot give bit-exact are refused
 * (SL_ERR_UNSUPPORTED, module.h) and the core casts them on the host. */
#define _GNU_SOURCE
#include <dlfcn.h> /* dladdr, and RTLD_NODELETE for an instance left behind */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardload/module.h"
#include "shardload/module_util.h"
#include "cuda_convert.h" /* the SGD step's element math, for its host fallback */
#include "ze_cast.h"
#include "ze_rt.h"

/* Mutation hooks (tests/mutants.cmake builds the module with SL_ZE_MUTANT=n): SL_ZE_KEEP(n) is 0
 * in mutant n, which drops that one wait or record; the matrix over the test driver must fail. */
#ifndef SL_ZE_MUTANT
#define SL_ZE_MUTANT 0
#endif
#define SL_ZE_KEEP(n) (SL_ZE_MUTANT != (n))

#define SL_ZE_POOL_EVENTS 64u
#define SL_ZE_SLICE_NS 20000000ull /* 20 ms: one zeEventHostSynchronize slice of a bounded sync */

typedef struct sl_ze_rec {
  ze_event_handle_t ev;
  int refs;
  int done;                 /* observed signalled since its last reset */
  int out;                  /* handed out (off the free list): a signal may be pending */
  struct sl_ze_rec *deps[2]; /* what the command signalling it waited for: released once it is done */
  struct sl_ze_rec *next;    /* on the free or the retired list */
} sl_ze_rec;

typedef struct sl_ze_pool {
  ze_event_pool_handle_t pool;
  sl_ze_rec recs[SL_ZE_POOL_EVENTS];
  struct sl_ze_pool *next;
} sl_ze_pool;

typedef struct sl_ze_stream {
  ze_command_list_handle_t list;
  /* its kernels' list, on a compute group: made at the first kernel (stream_kernel_list); the
   * copy list itself where copies go to a compute group; NULL before */
  ze_command_list_handle_t klist;
  sl_ze_rec *tail; /* the last command's record (one ref), NULL before the first */
  struct sl_ze_stream *next;
} sl_ze_stream;

/* Device buffers lent to other streams, freed once the records they wait for have signalled. */
typedef struct sl_ze_deferred {
  void **ptrs;
  size_t n;
  sl_ze_rec **recs; /* one ref each */
  size_t nrecs;
  struct sl_ze_deferred *next;
} sl_ze_deferred;

/* A host function in stream order: FN runs on the module's host thread once AFTER signalled, and
 * the host signals DONE (the stream's tail from then on) when it returned. */
typedef struct sl_ze_hostfn {
  sl_status (*fn)(void *arg, char *err, size_t errlen);
  void *arg;
  struct sl_ze_rec *after, *done; /* one ref each; AFTER NULL: nothing queued before */
  struct sl_ze_hostfn *next;
} sl_ze_hostfn;

typedef struct sl_ze_event {
  sl_ze_rec *last; /* the last record (one ref), NULL: never recorded (complete) */
} sl_ze_event;

typedef struct sl_ze_be {
  const sl_module_host *host;
  int ordinal, timeout_ms;
  ze_driver_handle_t drv;
  ze_device_handle_t dev;
  ze_context_handle_t ctx;
  ze_device_properties_t props;
  uint64_t mem_total;
  char pci[32]; /* "0000:3a:00.0", "" when the driver cannot tell */
  uint32_t copy_ordinal, copy_queues, compute_ordinal;
  int copy_only; /* copies go to a copy-only group */
  /* the driver lists ZE_experimental_relaxed_allocation_limits: allocations past maxMemAllocSize
   * chain its descriptor; without it maxMemAllocSize is a hard limit (SL_EXT_MAX_ALLOC) */
  int relaxed;
  uint32_t next_queue;
  /* the driver's host-pointer import (zexDriverImportExternalPointer), NULL where not offered */
  ze_result_t (*import_ptr)(ze_driver_handle_t, void *, size_t);
  ze_result_t (*release_ptr)(ze_driver_handle_t, void *);
  pthread_mutex_t mu; /* records, pools, streams' tails and list, the sticky error */
  /* held across a whole append (stream_append): from reading a stream's tail to setting the
   * new one, so that two threads (event_record_native is callable from any, module.h Threads)
   * never chain on one tail nor append to one list at once; taken before mu, never inside it */
  pthread_mutex_t append_mu;
  sl_ze_pool *pools;
  sl_ze_rec *free, *retired;
  sl_ze_stream dflt, *streams;
  /* streams given up with their work (SL_EXT_STREAM_ABANDON, or a stream_destroy whose work
   * outlasted the timeout): no sync waits for them; fini destroys them only once idle */
  sl_ze_stream *abandoned;
  sl_ze_deferred *deferred; /* free_device_after's, oldest last */
  /* host functions: one thread for the instance, started by the first, FIFO (under mu) */
  pthread_cond_t hf_cond;
  pthread_t hf_thread;
  int hf_started, hf_stop;
  sl_ze_hostfn *hf_head, *hf_last;
  sl_ze_kernels kern; /* the cast and SGD kernels (ze_cast.h) */
  sl_status sticky;
  char sticky_msg[640];
  uint64_t h2d, d2h; /* atomic */
  struct sl_ze_be *behind_next; /* in g_behind, once fini left it behind */
} sl_ze_be;

static const char *rname(ze_result_t r) {
  static __thread char buf[32];
  return sl__ze_result_name(r, buf, sizeof buf);
}

static sl_status status_of(ze_result_t r) {
  if (r == ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY || r == ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY) return SL_ERR_NOMEM;
  return SL_ERR_BACKEND;
}

/* ---- sticky errors ------------------------------------------------------------------------- */

/* Keeps the first failure of enqueued work (under mu). */
static void set_sticky_locked(sl_ze_be *be, sl_status s, const char *msg) {
  if (be->sticky != SL_OK) return;
  be->sticky = s;
  snprintf(be->sticky_msg, sizeof be->sticky_msg, "%s", msg);
}

static sl_status sticky_fail(sl_ze_be *be, sl_status s, const char *msg) {
  pthread_mutex_lock(&be->mu);
  set_sticky_locked(be, s, msg);
  pthread_mutex_unlock(&be->mu);
  return be->host->fail(be->host->core, s, "%s", msg);
}

/* The sticky error, reported on the caller's thread, or SL_OK. */
static sl_status check_sticky(sl_ze_be *be) {
  pthread_mutex_lock(&be->mu);
  sl_status s = be->sticky;
  char msg[sizeof be->sticky_msg];
  memcpy(msg, be->sticky_msg, sizeof msg);
  pthread_mutex_unlock(&be->mu);
  return s == SL_OK ? SL_OK : be->host->fail(be->host->core, s, "%s", msg);
}

/* An enqueuing call the driver refused: sticky (what was queued after it may depend on it). */
static sl_status append_failed(sl_ze_be *be, const char *what, ze_result_t r) {
  char msg[512];
  snprintf(msg, sizeof msg, "level_zero:%d: %s failed: %s%s", be->ordinal, what, rname(r),
           r == ZE_RESULT_ERROR_DEVICE_LOST ? " (the device was lost: reset it or check the kernel log)" : "");
  return sticky_fail(be, status_of(r), msg);
}

/* ---- records ---------------------------------------------------------------------------------- */

static void rec_put_locked(sl_ze_be *be, sl_ze_rec *r);
static void settle_deferred_locked(sl_ze_be *be);

/* 1 once R has signalled (releasing what its command waited for), 0 while pending, -1 when the
 * driver says the event failed (sticky). Under mu; never blocks. */
static int rec_poll_locked(sl_ze_be *be, sl_ze_rec *r) {
  if (r->done) return 1;
  ze_result_t q = sl__ze.EventQueryStatus(r->ev);
  if (q == ZE_RESULT_NOT_READY) return 0;
  if (q != ZE_RESULT_SUCCESS) {
    char msg[256];
    snprintf(msg, sizeof msg, "level_zero:%d: zeEventQueryStatus failed: %s (the work before it failed%s)",
             be->ordinal, rname(q), q == ZE_RESULT_ERROR_DEVICE_LOST ? ": the device was lost" : "");
    set_sticky_locked(be, status_of(q), msg);
    return -1;
  }
  r->done = 1;
  for (int i = 0; i < 2; i++)
    if (r->deps[i]) {
      sl_ze_rec *d = r->deps[i];
      r->deps[i] = NULL;
      rec_put_locked(be, d);
    }
  return 1;
}

static void rec_put_locked(sl_ze_be *be, sl_ze_rec *r) {
  if (--r->refs > 0) return;
  r->next = be->retired;
  be->retired = r;
}

/* Moves retired records that have signalled to the free list, host-resetting them (the one
 * reset Level Zero allows); repeats while releasing one retires more. */
static void reap_locked(sl_ze_be *be) {
  int progress = 1;
  while (progress) {
    progress = 0;
    sl_ze_rec *list = be->retired;
    be->retired = NULL;
    while (list) {
      sl_ze_rec *r = list;
      list = r->next;
      if (r->refs == 0 && rec_poll_locked(be, r) == 1 && sl__ze.EventHostReset(r->ev) == ZE_RESULT_SUCCESS) {
        r->done = 0;
        r->out = 0;
        r->next = be->free;
        be->free = r;
        progress = 1;
      } else if (r->refs == 0) {
        r->next = be->retired;
        be->retired = r;
      }
    }
  }
}

static sl_status add_pool_locked(sl_ze_be *be, char *why, size_t len) {
  sl_ze_pool *p = calloc(1, sizeof *p);
  if (!p) return snprintf(why, len, "out of memory"), SL_ERR_NOMEM;
  ze_event_pool_desc_t pd = {.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, .flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE,
                             .count = SL_ZE_POOL_EVENTS};
  ze_result_t r = sl__ze.EventPoolCreate(be->ctx, &pd, 1, &be->dev, &p->pool);
  if (r != ZE_RESULT_SUCCESS) {
    free(p);
    snprintf(why, len, "zeEventPoolCreate failed: %s", rname(r));
    return status_of(r);
  }
  uint32_t made = 0;
  for (; made < SL_ZE_POOL_EVENTS; made++) {
    ze_event_desc_t ed = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC, .index = made, .signal = ZE_EVENT_SCOPE_FLAG_HOST,
                          .wait = ZE_EVENT_SCOPE_FLAG_HOST};
    if ((r = sl__ze.EventCreate(p->pool, &ed, &p->recs[made].ev)) != ZE_RESULT_SUCCESS) break;
  }
  if (made < SL_ZE_POOL_EVENTS) {
    while (made--) sl__ze.EventDestroy(p->recs[made].ev);
    sl__ze.EventPoolDestroy(p->pool);
    free(p);
    snprintf(why, len, "zeEventCreate failed: %s", rname(r));
    return status_of(r);
  }
  for (uint32_t i = 0; i < SL_ZE_POOL_EVENTS; i++) {
    p->recs[i].next = be->free;
    be->free = &p->recs[i];
  }
  p->next = be->pools;
  be->pools = p;
  return SL_OK;
}

/* A fresh record (refs 1, unsignalled), recycling signalled ones before growing the pools. */
static sl_status rec_get_locked(sl_ze_be *be, sl_ze_rec **out, char *why, size_t len) {
  if (be->deferred) settle_deferred_locked(be);
  if (!be->free) reap_locked(be);
  if (!be->free) {
    sl_status s = add_pool_locked(be, why, len);
    if (s != SL_OK) return s;
  }
  sl_ze_rec *r = be->free;
  be->free = r->next;
  r->next = NULL;
  r->refs = 1;
  r->done = 0;
  r->out = 1;
  *out = r;
  return SL_OK;
}

/* Frees the deferred buffers whose records have all signalled (under mu; never blocks). */
static void settle_deferred_locked(sl_ze_be *be) {
  for (sl_ze_deferred **p = &be->deferred; *p;) {
    sl_ze_deferred *d = *p;
    size_t done = 0;
    for (size_t i = 0; i < d->nrecs; i++) done += rec_poll_locked(be, d->recs[i]) == 1;
    if (done < d->nrecs) {
      p = &d->next;
      continue;
    }
    for (size_t i = 0; i < d->n; i++) sl__ze.MemFree(be->ctx, d->ptrs[i]);
    for (size_t i = 0; i < d->nrecs; i++) rec_put_locked(be, d->recs[i]);
    *p = d->next;
    free(d->ptrs);
    free(d->recs);
    free(d);
  }
}

/* Blocks until R signalled, polling in slices up to the job's timeout. The caller holds a ref. */
static sl_status rec_wait(sl_ze_be *be, sl_ze_rec *r, const char *what) {
  sl_deadline dl = sl_deadline_in_ms(sl_timeout_ms(be->timeout_ms));
  for (;;) {
    ze_result_t q = sl__ze.EventHostSynchronize(r->ev, SL_ZE_SLICE_NS);
    if (q == ZE_RESULT_SUCCESS) {
      pthread_mutex_lock(&be->mu);
      int p = rec_poll_locked(be, r);
      pthread_mutex_unlock(&be->mu);
      return p < 0 ? check_sticky(be) : SL_OK;
    }
    if (q != ZE_RESULT_NOT_READY) {
      char msg[256];
      snprintf(msg, sizeof msg, "level_zero:%d: %s: zeEventHostSynchronize failed: %s%s", be->ordinal, what,
               rname(q), q == ZE_RESULT_ERROR_DEVICE_LOST ? " (the device was lost)" : "");
      return sticky_fail(be, status_of(q), msg);
    }
    if (sl_deadline_passed(dl))
      return be->host->fail(be->host->core, SL_ERR_TIMEOUT,
                            "level_zero:%d: %s: the device's work did not complete within the job's timeout (%d ms); "
                            "the device may be hung (check the kernel log) or the timeout too short",
                            be->ordinal, what, sl_timeout_ms(be->timeout_ms));
  }
}

/* ---- discovery and init ------------------------------------------------------------------- */

typedef struct {
  ze_driver_handle_t drv;
  ze_device_handle_t dev;
} sl_ze_gpu;

/* Every GPU device of every driver, in the loader's order: the ordinals shardload uses. */
static sl_status list_gpus(sl_ze_gpu *out, uint32_t cap, uint32_t *n, char *why, size_t len) {
  uint32_t ndrv = 0;
  ze_result_t r = sl__ze.DriverGet(&ndrv, NULL);
  ze_driver_handle_t drv[16];
  *n = 0;
  if (r == ZE_RESULT_SUCCESS && ndrv) {
    if (ndrv > 16) ndrv = 16;
    r = sl__ze.DriverGet(&ndrv, drv);
  }
  if (r != ZE_RESULT_SUCCESS || ndrv == 0) {
    snprintf(why, len, "no driver (%s from zeDriverGet)", r == ZE_RESULT_SUCCESS ? "none" : rname(r));
    return SL_ERR_NO_DEVICE;
  }
  for (uint32_t d = 0; d < ndrv; d++) {
    uint32_t k = 0;
    ze_device_handle_t dev[64];
    if (sl__ze.DeviceGet(drv[d], &k, NULL) != ZE_RESULT_SUCCESS || k == 0) continue;
    if (k > 64) k = 64;
    if (sl__ze.DeviceGet(drv[d], &k, dev) != ZE_RESULT_SUCCESS) continue;
    for (uint32_t i = 0; i < k && *n < cap; i++) {
      ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
      if (sl__ze.DeviceGetProperties(dev[i], &p) == ZE_RESULT_SUCCESS && p.type == ZE_DEVICE_TYPE_GPU)
        out[(*n)++] = (sl_ze_gpu){drv[d], dev[i]};
    }
  }
  if (*n == 0) {
    snprintf(why, len, "no GPU device (%u driver%s, none with a GPU)", ndrv, ndrv == 1 ? "" : "s");
    return SL_ERR_NO_DEVICE;
  }
  return SL_OK;
}

/* The copy-only group (flags COPY without COMPUTE) for copies, a compute group for kernels. */
static sl_status find_queue_groups(sl_ze_be *be, char *why, size_t len) {
  uint32_t n = 0;
  ze_result_t r = sl__ze.DeviceGetCommandQueueGroupProperties(be->dev, &n, NULL);
  if (r != ZE_RESULT_SUCCESS || n == 0) {
    snprintf(why, len, "zeDeviceGetCommandQueueGroupProperties: %s", r == ZE_RESULT_SUCCESS ? "no group" : rname(r));
    return SL_ERR_BACKEND;
  }
  ze_command_queue_group_properties_t *g = calloc(n, sizeof *g);
  if (!g) return snprintf(why, len, "out of memory"), SL_ERR_NOMEM;
  for (uint32_t i = 0; i < n; i++) g[i].stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES;
  sl_status s = SL_OK;
  if ((r = sl__ze.DeviceGetCommandQueueGroupProperties(be->dev, &n, g)) != ZE_RESULT_SUCCESS) {
    snprintf(why, len, "zeDeviceGetCommandQueueGroupProperties: %s", rname(r));
    s = SL_ERR_BACKEND;
    goto out;
  }
  int compute = -1, copy = -1;
  for (uint32_t i = 0; i < n; i++) {
    int has_compute = (g[i].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE) != 0;
    int has_copy = (g[i].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY) != 0;
    if (has_compute && compute < 0 && g[i].numQueues) compute = (int)i;
    if (has_copy && !has_compute && copy < 0 && g[i].numQueues) copy = (int)i;
  }
  if (compute < 0) {
    snprintf(why, len, "the device has no compute queue group");
    s = SL_ERR_NO_DEVICE;
    goto out;
  }
  be->compute_ordinal = (uint32_t)compute;
  be->copy_only = copy >= 0;
  be->copy_ordinal = (uint32_t)(copy >= 0 ? copy : compute);
  be->copy_queues = g[be->copy_ordinal].numQueues;
out:
  free(g);
  return s;
}

/* Whether the driver lists the relaxed-allocation-limits extension: its descriptor means
 * nothing to a driver that does not (an unknown pNext structure is ignored, or refused). */
static int has_relaxed_limits(ze_driver_handle_t drv) {
  uint32_t n = 0;
  if (sl__ze.DriverGetExtensionProperties(drv, &n, NULL) != ZE_RESULT_SUCCESS || n == 0) return 0;
  ze_driver_extension_properties_t *p = calloc(n, sizeof *p);
  int found = 0;
  if (p && sl__ze.DriverGetExtensionProperties(drv, &n, p) == ZE_RESULT_SUCCESS)
    for (uint32_t i = 0; i < n && !found; i++)
      found = strncmp(p[i].name, ZE_RELAXED_ALLOCATION_LIMITS_EXP_NAME, sizeof p[i].name) == 0;
  free(p);
  return found;
}

static sl_status list_create(sl_ze_be *be, ze_command_list_handle_t *list, char *why, size_t len) {
  ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, .ordinal = be->copy_ordinal,
                                .index = be->next_queue++ % (be->copy_queues ? be->copy_queues : 1),
                                .mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS};
  ze_result_t r = sl__ze.CommandListCreateImmediate(be->ctx, be->dev, &qd, list);
  if (r != ZE_RESULT_SUCCESS) {
    snprintf(why, len, "zeCommandListCreateImmediate (queue group %u) failed: %s", be->copy_ordinal, rname(r));
    return status_of(r);
  }
  return SL_OK;
}

static void describe_device(sl_ze_be *be) {
  ze_device_memory_properties_t mp[8];
  uint32_t nm = 8;
  for (uint32_t i = 0; i < nm; i++) mp[i] = (ze_device_memory_properties_t){.stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES};
  if (sl__ze.DeviceGetMemoryProperties(be->dev, &nm, mp) == ZE_RESULT_SUCCESS)
    for (uint32_t i = 0; i < nm && i < 8; i++) be->mem_total += mp[i].totalSize;
  ze_pci_ext_properties_t pci = {.stype = ZE_STRUCTURE_TYPE_PCI_EXT_PROPERTIES};
  if (sl__ze.DevicePciGetPropertiesExt(be->dev, &pci) == ZE_RESULT_SUCCESS)
    snprintf(be->pci, sizeof be->pci, "%04x:%02x:%02x.%x", pci.address.domain & 0xffffu, pci.address.bus & 0xffu,
             pci.address.device & 0x1fu, pci.address.function & 0x7u);
}

static void ze_fini(void *h);
static void stream_kernel_list_destroy(sl_ze_stream *s);

static sl_status ze_init(const sl_backend_init *in, void **out) {
  const sl_module_host *host = in->host;
  char why[512] = "";
  *out = NULL;
  if (!sl__ze_ready()) return host->fail(host->core, SL_ERR_NO_DEVICE, "level_zero: %s", sl__ze_why());
  sl_ze_gpu gpus[64];
  uint32_t n = 0;
  sl_status s = list_gpus(gpus, 64, &n, why, sizeof why);
  if (s != SL_OK) {
    char reason[640];
    sl__ze_probe(reason, sizeof reason); /* the same words as the probe's, on every rank */
    return host->fail(host->core, s, "%s", reason);
  }
  int dev = SL_INIT_GET(in, device, -1);
  int local_rank = SL_INIT_GET(in, local_rank, 0);
  if (dev >= (int)n)
    return host->fail(host->core, SL_ERR_NO_DEVICE,
                      "level_zero: device %d does not exist: this machine has %u Level Zero GPU device%s (0..%u); "
                      "choose one of them", dev, n, n == 1 ? "" : "s", n - 1);
  if (dev < 0) dev = (local_rank < 0 ? 0 : local_rank) % (int)n;

  sl_ze_be *be = calloc(1, sizeof *be);
  if (!be) return host->fail(host->core, SL_ERR_NOMEM, "level_zero: out of memory");
  be->host = host;
  be->ordinal = dev;
  be->timeout_ms = SL_INIT_GET(in, timeout_ms, 0);
  be->drv = gpus[dev].drv;
  be->dev = gpus[dev].dev;
  pthread_mutex_init(&be->mu, NULL);
  pthread_mutex_init(&be->append_mu, NULL);
  pthread_cond_init(&be->hf_cond, NULL);
  be->props.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
  ze_result_t r = sl__ze.DeviceGetProperties(be->dev, &be->props);
  if (r != ZE_RESULT_SUCCESS) {
    snprintf(why, sizeof why, "zeDeviceGetProperties failed: %s", rname(r));
    s = SL_ERR_BACKEND;
    goto fail;
  }
  describe_device(be);
  be->relaxed = has_relaxed_limits(be->drv);
  if ((s = find_queue_groups(be, why, sizeof why)) != SL_OK) goto fail;
  ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
  if ((r = sl__ze.ContextCreate(be->drv, &cd, &be->ctx)) != ZE_RESULT_SUCCESS) {
    snprintf(why, sizeof why, "zeContextCreate failed: %s", rname(r));
    s = status_of(r);
    goto fail;
  }
  if ((s = list_create(be, &be->dflt.list, why, sizeof why)) != SL_OK) goto fail;
  if ((s = sl__ze_kernels_init(&be->kern, be->ctx, be->dev, why, sizeof why)) != SL_OK) goto fail;
  /* the host-pointer import is an extension of Intel's driver: used where the driver offers it */
  void *imp = NULL, *rel = NULL;
  if (sl__ze.DriverGetExtensionFunctionAddress(be->drv, "zexDriverImportExternalPointer", &imp) == ZE_RESULT_SUCCESS &&
      sl__ze.DriverGetExtensionFunctionAddress(be->drv, "zexDriverReleaseImportedPointer", &rel) == ZE_RESULT_SUCCESS &&
      imp && rel) {
    be->import_ptr = (ze_result_t(*)(ze_driver_handle_t, void *, size_t))imp;
    be->release_ptr = (ze_result_t(*)(ze_driver_handle_t, void *))rel;
  }
  *out = be;
  return SL_OK;
fail:
  ze_fini(be);
  return host->fail(host->core, s, "level_zero:%d: %s", dev, why);
}

/* Waits (bounded) for every stream's tail; 0 when one did not complete in time. */
static int settle_all(sl_ze_be *be);

/* 1 when every abandoned stream's work has completed (or failed): one look, no wait. */
static int abandoned_idle(sl_ze_be *be) {
  int idle = 1;
  pthread_mutex_lock(&be->mu);
  for (sl_ze_stream *s = be->abandoned; s && idle; s = s->next)
    if (s->tail && rec_poll_locked(be, s->tail) == 0) idle = 0;
  pthread_mutex_unlock(&be->mu);
  return idle;
}

/* Waits, within one job's timeout for them all, for every record handed out whose signal may
 * still be pending: the streams' are done by now (their tails were), so these are the records
 * event_record_native put on consumers' command lists, whose events the core may have
 * destroyed already. 0 when one did not signal in time (destroying its pool under it is what
 * the spec forbids: "The application must ensure the device is not currently referencing the
 * any event within the pool before it is deleted"). */
static int settle_outstanding(sl_ze_be *be) {
  sl_deadline dl = sl_deadline_in_ms(sl_timeout_ms(be->timeout_ms));
  for (sl_ze_pool *p = be->pools; p; p = p->next)
    for (uint32_t i = 0; i < SL_ZE_POOL_EVENTS; i++) {
      sl_ze_rec *r = &p->recs[i];
      for (;;) {
        pthread_mutex_lock(&be->mu);
        int pending = r->out && rec_poll_locked(be, r) == 0;
        pthread_mutex_unlock(&be->mu);
        if (!pending) break;
        ze_result_t q = sl__ze.EventHostSynchronize(r->ev, SL_ZE_SLICE_NS);
        if (q != ZE_RESULT_SUCCESS && q != ZE_RESULT_NOT_READY) break; /* failed (device lost): nothing runs */
        if (q == ZE_RESULT_NOT_READY && sl_deadline_passed(dl)) return 0;
      }
    }
  return 1;
}

/* ---- instances left behind ------------------------------------------------------------------
 * An instance whose device work outlived the job's timeout cannot be ended: destroying its
 * context, event pools and command lists under running work is undefined (the spec: "the
 * application must ensure the device is not currently referencing" them). fini leaves it to the
 * process's exit, with a warning. It is kept here, reachable, rather than dropped: LeakSanitizer
 * reports only what nothing points to, so what is left on purpose is not taken for a leak (and
 * a real leak beside it still is), and a debugger finds it. The first one pins the module
 * (RTLD_NODELETE), so that neither this list nor the code a host-function thread left running
 * may still execute goes away with the core's dlclose. */
static pthread_mutex_t g_behind_mu = PTHREAD_MUTEX_INITIALIZER;
static sl_ze_be *g_behind;

static void leave_behind(sl_ze_be *be) {
  pthread_mutex_lock(&g_behind_mu);
  if (!g_behind) {
    Dl_info info;
    /* a reference of its own that is never dropped: the module stays mapped until exit */
    if (dladdr((void *)leave_behind, &info) && info.dli_fname)
      (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  }
  be->behind_next = g_behind;
  g_behind = be;
  pthread_mutex_unlock(&g_behind_mu);
}

static void ze_fini(void *h) {
  sl_ze_be *be = h;
  if (!be) return;
  if (be->ctx && !settle_all(be)) {
    /* behind work that never ends: what it signals and reads is left to the process's exit */
    be->host->log(be->host->core, SL_LOG_WARN,
                  "level_zero:%d: work still pending on the device after the job's timeout; its command lists, "
                  "events and context are left behind", be->ordinal);
    leave_behind(be);
    return;
  }
  /* lent buffers: their consumers' records, each waited for (bounded), then the frees */
  while (be->deferred) {
    sl_ze_deferred *d = be->deferred;
    for (size_t i = 0; i < d->nrecs; i++)
      if (rec_wait(be, d->recs[i], "fini (memory lent to another stream)") == SL_ERR_TIMEOUT) {
        be->host->log(be->host->core, SL_LOG_WARN,
                      "level_zero:%d: memory lent to another stream is still in use after the job's timeout; it, "
                      "the module's events and its context are left behind", be->ordinal);
        leave_behind(be);
        return;
      }
    pthread_mutex_lock(&be->mu);
    settle_deferred_locked(be);
    int stuck = be->deferred == d; /* a record failed (device lost): its buffers go with the context */
    if (stuck) {
      be->deferred = d->next;
      free(d->ptrs);
      free(d->recs);
      free(d);
    }
    pthread_mutex_unlock(&be->mu);
  }
  if (be->hf_started) { /* every host function has run (they were the tails settle_all waited for) */
    pthread_mutex_lock(&be->mu);
    be->hf_stop = 1;
    pthread_cond_broadcast(&be->hf_cond);
    pthread_mutex_unlock(&be->mu);
    pthread_join(be->hf_thread, NULL);
  }
  if (!abandoned_idle(be)) {
    be->host->log(be->host->core, SL_LOG_WARN,
                  "level_zero:%d: a stream given up with its work (abandoned, or destroyed past the job's timeout) "
                  "still has work on the device; it, the module's events and its context are left behind",
                  be->ordinal);
    leave_behind(be);
    return;
  }
  if (!settle_outstanding(be)) {
    be->host->log(be->host->core, SL_LOG_WARN,
                  "level_zero:%d: events the module recorded on another's command list (event_record_native) have "
                  "not signalled within the job's timeout (%d ms): the module's event pools and context are left "
                  "behind rather than destroyed under that work", be->ordinal, sl_timeout_ms(be->timeout_ms));
    leave_behind(be);
    return;
  }
  for (sl_ze_stream *s = be->abandoned, *nx; s; s = nx) {
    nx = s->next;
    stream_kernel_list_destroy(s);
    sl__ze.CommandListDestroy(s->list);
    free(s);
  }
  for (sl_ze_stream *s = be->streams, *nx; s; s = nx) {
    nx = s->next;
    stream_kernel_list_destroy(s);
    sl__ze.CommandListDestroy(s->list);
    free(s);
  }
  stream_kernel_list_destroy(&be->dflt);
  if (be->dflt.list) sl__ze.CommandListDestroy(be->dflt.list);
  sl__ze_kernels_fini(&be->kern);
  for (sl_ze_pool *p = be->pools, *nx; p; p = nx) {
    nx = p->next;
    for (uint32_t i = 0; i < SL_ZE_POOL_EVENTS; i++) sl__ze.EventDestroy(p->recs[i].ev);
    sl__ze.EventPoolDestroy(p->pool);
    free(p);
  }
  if (be->ctx) sl__ze.ContextDestroy(be->ctx);
  pthread_cond_destroy(&be->hf_cond);
  pthread_mutex_destroy(&be->mu);
  pthread_mutex_destroy(&be->append_mu);
  free(be);
}

static void ze_describe(void *h, char *buf, size_t len) {
  sl_ze_be *be = h;
  const ze_device_properties_t *p = &be->props;
  unsigned eus = p->numEUsPerSubslice * p->numSubslicesPerSlice * p->numSlices;
  char casts[128];
  sl__ze_kernels_describe(&be->kern, casts, sizeof casts);
  snprintf(buf, len, "level_zero:%d %s, %.0f GiB, %u EUs, PCI %s; copies on %s queue group %u; %s",
           be->ordinal, p->name, (double)be->mem_total / (1024.0 * 1024.0 * 1024.0), eus, be->pci[0] ? be->pci : "unknown",
           be->copy_only ? "the copy-only" : "the compute", be->copy_ordinal, casts);
}

static int ze_device_ordinal(void *h) { return ((sl_ze_be *)h)->ordinal; }

static void ze_device_identity(void *h, char *buf, size_t len) {
  sl_ze_be *be = h;
  if (be->pci[0]) {
    snprintf(buf, len, "%s", be->pci);
    return;
  }
  /* the device's UUID names it as well, in every process */
  char u[2 * ZE_MAX_DEVICE_UUID_SIZE + 1];
  for (int i = 0; i < ZE_MAX_DEVICE_UUID_SIZE; i++) snprintf(u + 2 * i, 3, "%02x", be->props.uuid.id[i]);
  snprintf(buf, len, "uuid-%s", u);
}

/* ---- memory ---------------------------------------------------------------------------------- */

/* Past the device's maximum allocation (4 GiB on many): the relaxed-limit descriptor where the
 * driver offers it, else a refusal that names the limit (the core keeps its staging under it,
 * SL_EXT_MAX_ALLOC; what is left is a single buffer too large for this device). */
static sl_status past_the_limit(sl_ze_be *be, const char *what, size_t bytes, const char *hint) {
  return be->host->fail(be->host->core, SL_ERR_NOMEM,
                        "level_zero:%d: %s of %zu bytes exceeds the device's maximum allocation of %llu bytes "
                        "(maxMemAllocSize), and the driver does not offer %s to relax it: %s", be->ordinal, what,
                        bytes, (unsigned long long)be->props.maxMemAllocSize, ZE_RELAXED_ALLOCATION_LIMITS_EXP_NAME,
                        hint);
}

static sl_status ze_alloc_device(void *h, size_t bytes, void **ptr) {
  sl_ze_be *be = h;
  ze_relaxed_allocation_limits_exp_desc_t relax = {.stype = ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC,
                                                   .flags = ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE};
  int past = bytes > be->props.maxMemAllocSize;
  *ptr = NULL;
  if (past && !be->relaxed) return past_the_limit(be, "a device allocation", bytes,
                                                  "shard the tensor over more ranks, or place it on the CPU");
  ze_device_mem_alloc_desc_t d = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, .pNext = past ? &relax : NULL};
  ze_result_t r = sl__ze.MemAllocDevice(be->ctx, &d, bytes ? bytes : 1, 64, be->dev, ptr);
  if (r != ZE_RESULT_SUCCESS) {
    *ptr = NULL;
    return be->host->fail(be->host->core, status_of(r), "level_zero:%d: zeMemAllocDevice of %zu bytes failed: %s%s",
                          be->ordinal, bytes, rname(r),
                          r == ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY ? " (free device memory, or shard over more ranks)" : "");
  }
  return SL_OK;
}

static void ze_free_device(void *h, void *ptr) {
  sl_ze_be *be = h;
  if (ptr) sl__ze.MemFree(be->ctx, ptr);
}

static sl_status ze_alloc_pinned(void *h, size_t bytes, void **ptr) {
  sl_ze_be *be = h;
  ze_relaxed_allocation_limits_exp_desc_t relax = {.stype = ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC,
                                                   .flags = ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE};
  int past = bytes > be->props.maxMemAllocSize;
  *ptr = NULL;
  if (past && !be->relaxed) return past_the_limit(be, "a pinned host allocation", bytes,
                                                  "shard the tensor over more ranks, or keep it in pageable memory");
  ze_host_mem_alloc_desc_t d = {.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, .pNext = past ? &relax : NULL};
  ze_result_t r = sl__ze.MemAllocHost(be->ctx, &d, bytes ? bytes : 1, 64, ptr);
  if (r != ZE_RESULT_SUCCESS) {
    *ptr = NULL;
    return be->host->fail(be->host->core, status_of(r), "level_zero:%d: zeMemAllocHost of %zu bytes failed: %s",
                          be->ordinal, bytes, rname(r));
  }
  return SL_OK;
}

static void ze_free_pinned(void *h, void *ptr) { ze_free_device(h, ptr); }

/* Caller host memory imported as pinned where the driver offers the import; else refused with
 * SL_ERR_UNSUPPORTED (not sticky): the core then keeps the range as pageable, and says so. */
static sl_status ze_register_host(void *h, void *ptr, size_t bytes) {
  sl_ze_be *be = h;
  if (!ptr || !bytes)
    return be->host->fail(be->host->core, SL_ERR_INVALID, "level_zero:%d: register_host of an empty range",
                          be->ordinal);
  if (!be->import_ptr)
    return be->host->fail(be->host->core, SL_ERR_UNSUPPORTED,
                          "level_zero:%d: the driver offers no host-pointer import (zexDriverImportExternalPointer): "
                          "the caller's buffer stays pageable", be->ordinal);
  ze_result_t r = be->import_ptr(be->drv, ptr, bytes);
  if (r != ZE_RESULT_SUCCESS)
    return be->host->fail(be->host->core, SL_ERR_UNSUPPORTED,
                          "level_zero:%d: zexDriverImportExternalPointer of %zu bytes at %p failed: %s; the caller's "
                          "buffer stays pageable", be->ordinal, bytes, ptr, rname(r));
  return SL_OK;
}

static void ze_unregister_host(void *h, void *ptr) {
  sl_ze_be *be = h;
  if (be->release_ptr && ptr) be->release_ptr(be->drv, ptr);
}

static int ze_is_device_ptr(void *h, const void *ptr, size_t bytes) {
  sl_ze_be *be = h;
  if (!ptr) return 0;
  ze_memory_allocation_properties_t p = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
  ze_device_handle_t dev = NULL;
  if (sl__ze.MemGetAllocProperties(be->ctx, ptr, &p, &dev) != ZE_RESULT_SUCCESS || p.type != ZE_MEMORY_TYPE_DEVICE ||
      dev != be->dev)
    return 0;
  void *base = NULL;
  size_t size = 0;
  if (sl__ze.MemGetAddressRange(be->ctx, ptr, &base, &size) != ZE_RESULT_SUCCESS) return 0;
  return (const char *)ptr >= (const char *)base && (size_t)((const char *)ptr - (const char *)base) <= size &&
         bytes <= size - (size_t)((const char *)ptr - (const char *)base);
}

/* ---- streams and events ---------------------------------------------------------------------- */

static sl_ze_stream *stream_of(sl_ze_be *be, void *stream) { return stream ? stream : &be->dflt; }

static sl_status ze_stream_create(void *h, void **out) {
  sl_ze_be *be = h;
  char why[256];
  sl_ze_stream *s = calloc(1, sizeof *s);
  if (!s) return be->host->fail(be->host->core, SL_ERR_NOMEM, "level_zero: out of memory");
  pthread_mutex_lock(&be->mu);
  sl_status st = list_create(be, &s->list, why, sizeof why);
  if (st == SL_OK) {
    s->next = be->streams;
    be->streams = s;
  }
  pthread_mutex_unlock(&be->mu);
  if (st != SL_OK) {
    free(s);
    return be->host->fail(be->host->core, st, "level_zero:%d: %s", be->ordinal, why);
  }
  *out = s;
  return SL_OK;
}

/* A ref to S's tail (NULL: nothing queued yet). */
static sl_ze_rec *tail_ref(sl_ze_be *be, sl_ze_stream *s) {
  pthread_mutex_lock(&be->mu);
  sl_ze_rec *r = s->tail;
  if (r) r->refs++;
  pthread_mutex_unlock(&be->mu);
  return r;
}

static sl_status wait_and_put(sl_ze_be *be, sl_ze_rec *r, const char *what) {
  if (!r) return SL_OK;
  sl_status s = rec_wait(be, r, what);
  pthread_mutex_lock(&be->mu);
  rec_put_locked(be, r);
  pthread_mutex_unlock(&be->mu);
  return s;
}

static void ze_stream_destroy(void *h, void *stream) {
  sl_ze_be *be = h;
  sl_ze_stream *s = stream;
  if (!s) return;
  /* first finishes its queued work (bounded): a list destroyed with work pending is undefined */
  int settled = wait_and_put(be, tail_ref(be, s), "stream_destroy") == SL_OK;
  pthread_mutex_lock(&be->mu);
  for (sl_ze_stream **p = &be->streams; *p; p = &(*p)->next)
    if (*p == s) {
      *p = s->next;
      break;
    }
  if (!settled) { /* its work goes on: kept (list and tail) for fini, which never destroys it busy */
    s->next = be->abandoned;
    be->abandoned = s;
    pthread_mutex_unlock(&be->mu);
    return;
  }
  if (s->tail) rec_put_locked(be, s->tail);
  pthread_mutex_unlock(&be->mu);
  stream_kernel_list_destroy(s);
  sl__ze.CommandListDestroy(s->list);
  free(s);
}

/* SL_EXT_STREAM_ABANDON: the stream leaves the list that synchronize and fini wait for, keeping
 * its command list and its tail (so that no record its work signals or waits for is reset under
 * it); fini destroys it if it has gone idle by then, and otherwise leaves the module's events and
 * context behind with it. Never waits. */
static void ze_stream_abandon(void *h, void *stream) {
  sl_ze_be *be = h;
  sl_ze_stream *s = stream;
  if (!s) return;
  pthread_mutex_lock(&be->mu);
  for (sl_ze_stream **p = &be->streams; *p; p = &(*p)->next)
    if (*p == s) {
      *p = s->next;
      s->next = be->abandoned;
      be->abandoned = s;
      break;
    }
  pthread_mutex_unlock(&be->mu);
}

static sl_status ze_event_create(void *h, void **out) {
  sl_ze_be *be = h;
  sl_ze_event *e = calloc(1, sizeof *e);
  if (!e) return be->host->fail(be->host->core, SL_ERR_NOMEM, "level_zero: out of memory");
  *out = e;
  return SL_OK;
}

static void ze_event_destroy(void *h, void *event) {
  sl_ze_be *be = h;
  sl_ze_event *e = event;
  if (!e) return;
  pthread_mutex_lock(&be->mu);
  if (e->last) rec_put_locked(be, e->last);
  pthread_mutex_unlock(&be->mu);
  free(e);
}

/* The kinds of command a stream appends; each signals its own record and waits for the tail. */
typedef enum { CMD_COPY, CMD_REGION, CMD_WAIT, CMD_BARRIER, CMD_KERNEL } sl_ze_cmd_kind;
typedef struct {
  sl_ze_cmd_kind kind;
  const sl_ze_kernel *kernel; /* CMD_KERNEL: its arguments are dst, src, count (and lr for SGD) */
  ze_group_count_t groups;
  uint64_t count;
  float lr;
  void *dst;
  const void *src;
  size_t bytes;
  uint32_t width, height, dpitch, spitch; /* CMD_REGION */
  sl_ze_rec *waited; /* CMD_WAIT: the record waited for (one ref, handed to the command) */
} sl_ze_cmd;

static sl_status stream_kernel_list(sl_ze_be *be, sl_ze_stream *s, char *why, size_t len);
static ze_result_t append_kernel(sl_ze_be *be, sl_ze_stream *s, const sl_ze_cmd *c, ze_event_handle_t signal,
                                 ze_event_handle_t *prev);

static sl_status stream_append_locked(sl_ze_be *be, sl_ze_stream *s, const sl_ze_cmd *c) {
  char why[256];
  sl_ze_rec *out = NULL;
  sl_status st = c->kind == CMD_KERNEL ? stream_kernel_list(be, s, why, sizeof why) : SL_OK;
  pthread_mutex_lock(&be->mu);
  if (st == SL_OK) st = be->sticky != SL_OK ? be->sticky : rec_get_locked(be, &out, why, sizeof why);
  sl_ze_rec *prev = s->tail;
  pthread_mutex_unlock(&be->mu);
  if (st != SL_OK) {
    if (c->waited) {
      pthread_mutex_lock(&be->mu);
      rec_put_locked(be, c->waited);
      pthread_mutex_unlock(&be->mu);
    }
    pthread_mutex_lock(&be->mu);
    int sticky = be->sticky != SL_OK;
    pthread_mutex_unlock(&be->mu);
    return sticky ? check_sticky(be) : be->host->fail(be->host->core, st, "level_zero:%d: %s", be->ordinal, why);
  }
  ze_event_handle_t pw = prev ? prev->ev : NULL;
  ze_result_t r;
  const char *what;
  if (c->kind == CMD_COPY) {
    what = "zeCommandListAppendMemoryCopy";
    r = sl__ze.CommandListAppendMemoryCopy(s->list, c->dst, c->src, c->bytes, out->ev, prev ? 1 : 0, prev ? &pw : NULL);
  } else if (c->kind == CMD_KERNEL) {
    what = "zeCommandListAppendLaunchKernel";
    r = append_kernel(be, s, c, out->ev, prev ? &pw : NULL);
  } else if (c->kind == CMD_BARRIER) {
    what = "zeCommandListAppendBarrier";
    r = sl__ze.CommandListAppendBarrier(s->list, out->ev, prev ? 1 : 0, prev ? &pw : NULL);
  } else if (c->kind == CMD_REGION) {
    what = "zeCommandListAppendMemoryCopyRegion";
    ze_copy_region_t reg = {.width = c->width, .height = c->height}; /* depth 0: a 2-D copy */
    r = sl__ze.CommandListAppendMemoryCopyRegion(s->list, c->dst, &reg, c->dpitch, 0, c->src, &reg, c->spitch, 0,
                                                 out->ev, prev ? 1 : 0, prev ? &pw : NULL);
  } else {
    /* one barrier waits for the tail and the awaited record, and signals: no separate
     * zeCommandListAppendWaitOnEvents, whose ordering of later commands the spec does not state */
    what = "zeCommandListAppendBarrier";
    ze_event_handle_t we[2];
    uint32_t nw = 0;
    if (prev) we[nw++] = pw;
    if (SL_ZE_KEEP(1)) we[nw++] = c->waited->ev;
    r = sl__ze.CommandListAppendBarrier(s->list, out->ev, nw, nw ? we : NULL);
  }
  pthread_mutex_lock(&be->mu);
  if (r == ZE_RESULT_SUCCESS) {
    out->deps[0] = prev; /* the tail's ref moves to the command that waits for it */
    out->deps[1] = c->waited;
    s->tail = out;
  } else {
    /* nothing signals OUT: back to the free list at once */
    out->refs = 0;
    out->out = 0;
    out->next = be->free;
    be->free = out;
    if (c->waited) rec_put_locked(be, c->waited);
  }
  pthread_mutex_unlock(&be->mu);
  return r == ZE_RESULT_SUCCESS ? SL_OK : append_failed(be, what, r);
}

/* One append at a time on the backend (append_mu): see sl_ze_be. */
static sl_status stream_append(sl_ze_be *be, sl_ze_stream *s, const sl_ze_cmd *c) {
  pthread_mutex_lock(&be->append_mu);
  sl_status st = stream_append_locked(be, s, c);
  pthread_mutex_unlock(&be->append_mu);
  return st;
}

static sl_status ze_event_record(void *h, void *event, void *stream) {
  sl_ze_be *be = h;
  sl_ze_event *e = event;
  sl_ze_stream *s = stream_of(be, stream);
  /* the record is the stream's tail: it signals once everything queued before it completed */
  pthread_mutex_lock(&be->mu);
  sl_ze_rec *old = e->last;
  e->last = SL_ZE_KEEP(2) ? s->tail : NULL;
  if (!SL_ZE_KEEP(3) && s->tail && s->tail->deps[0]) e->last = s->tail->deps[0];
  if (e->last) e->last->refs++;
  if (old) rec_put_locked(be, old);
  pthread_mutex_unlock(&be->mu);
  return SL_OK;
}

static sl_status ze_stream_wait_event(void *h, void *stream, void *event) {
  sl_ze_be *be = h;
  sl_ze_event *e = event;
  pthread_mutex_lock(&be->mu);
  sl_ze_rec *r = e->last; /* the record this wait sees, whatever is recorded later */
  if (r) r->refs++;
  pthread_mutex_unlock(&be->mu);
  if (!r) return SL_OK; /* never recorded: complete */
  sl_ze_cmd c = {.kind = CMD_WAIT, .waited = r};
  return stream_append(be, stream_of(be, stream), &c);
}

static int ze_event_query(void *h, void *event) {
  sl_ze_be *be = h;
  sl_ze_event *e = event;
  pthread_mutex_lock(&be->mu);
  int p = e->last ? rec_poll_locked(be, e->last) : 1;
  if (be->sticky != SL_OK) p = -1;
  pthread_mutex_unlock(&be->mu);
  return p;
}

static sl_status ze_event_sync(void *h, void *event) {
  sl_ze_be *be = h;
  sl_ze_event *e = event;
  pthread_mutex_lock(&be->mu);
  sl_ze_rec *r = SL_ZE_KEEP(4) ? e->last : NULL;
  if (r) r->refs++;
  pthread_mutex_unlock(&be->mu);
  sl_status s = wait_and_put(be, r, "event_sync");
  return s != SL_OK ? s : check_sticky(be);
}

static sl_status ze_stream_sync(void *h, void *stream) {
  sl_ze_be *be = h;
  sl_status s = SL_ZE_KEEP(5) ? wait_and_put(be, tail_ref(be, stream_of(be, stream)), "stream_sync") : SL_OK;
  return s != SL_OK ? s : check_sticky(be);
}

/* Refs to every stream's tail, taken at once; waits for each (bounded). 1 when all completed. */
static sl_status sync_all(sl_ze_be *be) {
  pthread_mutex_lock(&be->mu);
  size_t n = 1;
  for (sl_ze_stream *s = be->streams; s; s = s->next) n++;
  sl_ze_rec **t = calloc(n, sizeof *t);
  if (!t) {
    pthread_mutex_unlock(&be->mu);
    return be->host->fail(be->host->core, SL_ERR_NOMEM, "level_zero: out of memory");
  }
  size_t k = 0;
  if (be->dflt.tail) t[k++] = be->dflt.tail;
  for (sl_ze_stream *s = be->streams; s; s = s->next)
    if (s->tail) t[k++] = s->tail;
  for (size_t i = 0; i < k; i++) t[i]->refs++;
  pthread_mutex_unlock(&be->mu);
  sl_status st = SL_OK;
  for (size_t i = 0; i < k; i++) {
    sl_status s = st == SL_OK ? rec_wait(be, t[i], "synchronize") : SL_OK;
    if (st == SL_OK) st = s;
    pthread_mutex_lock(&be->mu);
    rec_put_locked(be, t[i]);
    pthread_mutex_unlock(&be->mu);
  }
  free(t);
  return st;
}

static sl_status ze_synchronize(void *h) {
  sl_ze_be *be = h;
  sl_status s = sync_all(be);
  pthread_mutex_lock(&be->mu);
  if (be->deferred) settle_deferred_locked(be); /* not waited for: they wait for others' work */
  pthread_mutex_unlock(&be->mu);
  return s != SL_OK ? s : check_sticky(be);
}

static int settle_all(sl_ze_be *be) { return sync_all(be) != SL_ERR_TIMEOUT; }

static sl_status ze_copy_async(void *h, void *dst, const void *src, size_t bytes, sl_copy_kind kind, void *stream) {
  sl_ze_be *be = h;
  if (!bytes) return SL_OK;
  sl_ze_cmd c = {.kind = CMD_COPY, .dst = dst, .src = src, .bytes = bytes};
  sl_status s = stream_append(be, stream_of(be, stream), &c);
  if (s == SL_OK && kind == SL_COPY_H2D) __atomic_add_fetch(&be->h2d, bytes, __ATOMIC_RELAXED);
  if (s == SL_OK && kind == SL_COPY_D2H) __atomic_add_fetch(&be->d2h, bytes, __ATOMIC_RELAXED);
  return s;
}

/* The host thread: runs each host function once the work queued before it completed (not at all
 * after a failure of that work, or when fini gave up on it), then signals its record. */
static void *hostfn_worker(void *p) {
  sl_ze_be *be = p;
  pthread_mutex_lock(&be->mu);
  for (;;) {
    while (!be->hf_head && !be->hf_stop) pthread_cond_wait(&be->hf_cond, &be->mu);
    sl_ze_hostfn *j = be->hf_head;
    if (!j) break; /* stopped, nothing left */
    be->hf_head = j->next;
    if (!be->hf_head) be->hf_last = NULL;
    pthread_mutex_unlock(&be->mu);
    int run = 1;
    while (j->after && run) {
      ze_result_t q = sl__ze.EventHostSynchronize(j->after->ev, SL_ZE_SLICE_NS);
      if (q == ZE_RESULT_SUCCESS) break;
      if (q != ZE_RESULT_NOT_READY || __atomic_load_n(&be->hf_stop, __ATOMIC_ACQUIRE)) run = 0;
    }
    pthread_mutex_lock(&be->mu);
    run = run && be->sticky == SL_OK;
    pthread_mutex_unlock(&be->mu);
    if (run) {
      char err[480] = "";
      sl_status st = j->fn(j->arg, err, sizeof err);
      if (st != SL_OK) {
        char msg[600];
        if (err[0])
          snprintf(msg, sizeof msg, "level_zero:%d: a host function failed: %s", be->ordinal, err);
        else
          snprintf(msg, sizeof msg, "level_zero:%d: a host function failed (status %d) and said nothing more",
                   be->ordinal, (int)st);
        pthread_mutex_lock(&be->mu);
        set_sticky_locked(be, st, msg);
        pthread_mutex_unlock(&be->mu);
      }
    }
    /* signalled even when FN did not run, so that no wait hangs: the sticky error says why */
    sl__ze.EventHostSignal(j->done->ev);
    pthread_mutex_lock(&be->mu);
    if (j->after) rec_put_locked(be, j->after);
    rec_put_locked(be, j->done);
    free(j);
  }
  pthread_mutex_unlock(&be->mu);
  return NULL;
}

static sl_status ze_launch_host_fn(void *h, void *stream, sl_status (*fn)(void *arg, char *err, size_t errlen),
                                   void *arg) {
  sl_ze_be *be = h;
  sl_ze_stream *s = stream_of(be, stream);
  char why[256] = "";
  sl_ze_hostfn *j = calloc(1, sizeof *j);
  if (!j) return be->host->fail(be->host->core, SL_ERR_NOMEM, "level_zero: out of memory");
  sl_ze_rec *out = NULL;
  pthread_mutex_lock(&be->mu);
  int sticky = be->sticky != SL_OK;
  sl_status st = sticky ? be->sticky : SL_OK;
  if (st == SL_OK && !be->hf_started) {
    if (pthread_create(&be->hf_thread, NULL, hostfn_worker, be) != 0) {
      snprintf(why, sizeof why, "cannot start the host-function thread");
      st = SL_ERR_BACKEND;
    } else {
      be->hf_started = 1;
    }
  }
  if (st == SL_OK) st = rec_get_locked(be, &out, why, sizeof why);
  if (st == SL_OK) {
    j->fn = fn;
    j->arg = arg;
    j->after = SL_ZE_KEEP(6) ? s->tail : NULL;
    if (j->after) j->after->refs++;
    out->refs++; /* the job's; the first is the stream's, as its tail */
    j->done = out;
    out->deps[0] = s->tail; /* the tail's ref moves to what follows it, as for a command */
    s->tail = out;
    if (be->hf_last)
      be->hf_last->next = j;
    else
      be->hf_head = j;
    be->hf_last = j;
    pthread_cond_signal(&be->hf_cond);
  }
  pthread_mutex_unlock(&be->mu);
  if (st == SL_OK) return SL_OK;
  free(j);
  return sticky ? check_sticky(be) : be->host->fail(be->host->core, st, "level_zero:%d: launch_host_fn: %s", be->ordinal, why);
}

/* A record on a command list of the consumer's: a barrier signals it once everything appended
 * to that list before has completed. Level Zero signals an event only on a list of the event's
 * context, so NATIVE must belong to this module's context: one of its own streams'
 * (SL_EXT_NATIVE_STREAM), which the barrier joins as a command of that stream's chain, or a list
 * the consumer made in it. (A consumer with a context of its own, SYCL's, needs the module to
 * share that context: not yet.) */
static sl_status ze_event_record_native(void *h, void *event, void *native) {
  sl_ze_be *be = h;
  sl_ze_event *e = event;
  char why[256];
  sl_ze_rec *out = NULL;
  if (!native)
    return be->host->fail(be->host->core, SL_ERR_INVALID,
                          "level_zero:%d: event_record_native: no command list (NULL); pass the consumer's "
                          "ze_command_list_handle_t", be->ordinal);
  pthread_mutex_lock(&be->mu);
  sl_ze_stream *own = be->dflt.list == native ? &be->dflt : NULL;
  for (sl_ze_stream *t = be->streams; t && !own; t = t->next)
    if (t->list == native) own = t;
  pthread_mutex_unlock(&be->mu);
  if (own) {
    /* one of the module's own (SL_EXT_NATIVE_STREAM): a command of its chain, so that its syncs
     * and its destruction wait for the record too */
    sl_ze_cmd c = {.kind = CMD_BARRIER};
    sl_status st = stream_append(be, own, &c);
    if (st == SL_OK) st = ze_event_record(h, event, own);
    return st;
  }
  pthread_mutex_lock(&be->mu);
  sl_status st = rec_get_locked(be, &out, why, sizeof why);
  pthread_mutex_unlock(&be->mu);
  if (st != SL_OK) return be->host->fail(be->host->core, st, "level_zero:%d: %s", be->ordinal, why);
  ze_result_t r = sl__ze.CommandListAppendBarrier((ze_command_list_handle_t)native, out->ev, 0, NULL);
  pthread_mutex_lock(&be->mu);
  if (r != ZE_RESULT_SUCCESS) {
    out->refs = 0; /* nothing signals it */
    out->out = 0;
    out->next = be->free;
    be->free = out;
  } else {
    sl_ze_rec *old = e->last;
    e->last = out;
    if (old) rec_put_locked(be, old);
  }
  pthread_mutex_unlock(&be->mu);
  if (r != ZE_RESULT_SUCCESS) /* the caller's list, not this module's work: not sticky */
    return be->host->fail(be->host->core, status_of(r),
                          "level_zero:%d: event_record_native: zeCommandListAppendBarrier on command list %p failed: %s "
                          "(a command list of another context or device?)", be->ordinal, native, rname(r));
  return SL_OK;
}

/* Takes the events' last records (and the events); frees the buffers once all have signalled,
 * at a later call of the module's (any record taken, synchronize, fini), never waiting here. */
static sl_status ze_free_device_after(void *h, void *const *ptrs, size_t n, void *const *events, size_t nevents) {
  sl_ze_be *be = h;
  sl_ze_deferred *d = calloc(1, sizeof *d);
  void **p = calloc(n ? n : 1, sizeof *p);
  sl_ze_rec **r = calloc(nevents ? nevents : 1, sizeof *r);
  if (!d || !p || !r) {
    free(d);
    free(p);
    free(r);
    return be->host->fail(be->host->core, SL_ERR_NOMEM, "level_zero: out of memory");
  }
  memcpy(p, ptrs, n * sizeof *p);
  pthread_mutex_lock(&be->mu);
  for (size_t i = 0; i < nevents; i++) {
    sl_ze_event *e = events[i];
    if (e->last) r[d->nrecs++] = e->last; /* the event's ref moves here */
    free(e); /* queued waits hold records of their own */
  }
  d->ptrs = p;
  d->n = n;
  d->recs = r;
  d->next = be->deferred;
  be->deferred = d;
  settle_deferred_locked(be);
  pthread_mutex_unlock(&be->mu);
  return SL_OK;
}

/* Region copies take 32-bit widths, heights and pitches: larger ones are one copy per row. */
static sl_status ze_copy_2d_async(void *h, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                  size_t height, sl_copy_kind kind, void *stream) {
  sl_ze_be *be = h;
  if (!width || !height) return SL_OK;
  if (width > dpitch || width > spitch)
    return be->host->fail(be->host->core, SL_ERR_INVALID,
                          "level_zero:%d: copy_2d_async: rows of %zu bytes do not fit pitches %zu (destination) and %zu "
                          "(source)", be->ordinal, width, dpitch, spitch);
  if (height > SIZE_MAX / dpitch || height > SIZE_MAX / spitch)
    return be->host->fail(be->host->core, SL_ERR_INVALID, "level_zero:%d: copy_2d_async: %zu rows overflow the address "
                          "space", be->ordinal, height);
  sl_ze_stream *s = stream_of(be, stream);
  sl_status st = SL_OK;
  if (width == dpitch && width == spitch) { /* contiguous: one copy */
    sl_ze_cmd c = {.kind = CMD_COPY, .dst = dst, .src = src, .bytes = width * height};
    st = stream_append(be, s, &c);
  } else if (width <= UINT32_MAX && height <= UINT32_MAX && dpitch <= UINT32_MAX && spitch <= UINT32_MAX) {
    sl_ze_cmd c = {.kind = CMD_REGION, .dst = dst, .src = src, .width = (uint32_t)width, .height = (uint32_t)height,
                   .dpitch = (uint32_t)dpitch, .spitch = (uint32_t)spitch};
    st = stream_append(be, s, &c);
  } else {
    for (size_t row = 0; row < height && st == SL_OK; row++) {
      sl_ze_cmd c = {.kind = CMD_COPY, .dst = (char *)dst + row * dpitch, .src = (const char *)src + row * spitch,
                     .bytes = width};
      st = stream_append(be, s, &c);
    }
  }
  if (st == SL_OK && kind == SL_COPY_H2D) __atomic_add_fetch(&be->h2d, width * height, __ATOMIC_RELAXED);
  if (st == SL_OK && kind == SL_COPY_D2H) __atomic_add_fetch(&be->d2h, width * height, __ATOMIC_RELAXED);
  return st;
}

/* ---- kernels: casts and the SGD step (ze_cast.h) ------------------------------------------------
 * A kernel runs on a compute group: a stream whose copies go to the copy-only group gets a
 * second immediate list for its kernels, on the compute group, at its first kernel. The two
 * lists are ordered as every command of a stream is: the kernel waits for the stream's tail
 * (whichever list signalled it) and signals the record that becomes the tail, so a copy after
 * it, on the copy list, waits for it in turn. Pairs the device cannot run (ze_cast.h) are
 * refused with SL_ERR_UNSUPPORTED before anything is queued (module.h: the core casts them on
 * the host). */

/* S's kernel list, made on first use; under append_mu. */
static sl_status stream_kernel_list(sl_ze_be *be, sl_ze_stream *s, char *why, size_t len) {
  if (s->klist) return SL_OK;
  if (!be->copy_only) { /* copies already go to a compute group: one list does both */
    s->klist = s->list;
    return SL_OK;
  }
  ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, .ordinal = be->compute_ordinal,
                                .mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS};
  ze_result_t r = sl__ze.CommandListCreateImmediate(be->ctx, be->dev, &qd, &s->klist);
  if (r != ZE_RESULT_SUCCESS) {
    s->klist = NULL;
    snprintf(why, len, "zeCommandListCreateImmediate (compute queue group %u, for kernels) failed: %s",
             be->compute_ordinal, rname(r));
    return status_of(r);
  }
  return SL_OK;
}

/* Once the stream's work has settled (its destroyer waited for it). */
static void stream_kernel_list_destroy(sl_ze_stream *s) {
  if (s->klist && s->klist != s->list) sl__ze.CommandListDestroy(s->klist);
  s->klist = NULL;
}

/* The launch of C on S's kernel list: its arguments then the launch, under append_mu (a
 * kernel's arguments are its state until the append copies them). */
static ze_result_t append_kernel(sl_ze_be *be, sl_ze_stream *s, const sl_ze_cmd *c, ze_event_handle_t signal,
                                 ze_event_handle_t *prev) {
  (void)be;
  ze_kernel_handle_t k = c->kernel->k;
  ze_result_t r = sl__ze.KernelSetArgumentValue(k, 0, sizeof c->dst, &c->dst);
  if (r == ZE_RESULT_SUCCESS) r = sl__ze.KernelSetArgumentValue(k, 1, sizeof c->src, &c->src);
  if (r == ZE_RESULT_SUCCESS) r = sl__ze.KernelSetArgumentValue(k, 2, sizeof c->count, &c->count);
  if (r == ZE_RESULT_SUCCESS && c->kernel->sgd) r = sl__ze.KernelSetArgumentValue(k, 3, sizeof c->lr, &c->lr);
  if (r == ZE_RESULT_SUCCESS)
    r = sl__ze.CommandListAppendLaunchKernel(s->klist, k, &c->groups, signal, prev && SL_ZE_KEEP(7) ? 1 : 0,
                                             SL_ZE_KEEP(7) ? prev : NULL); /* after the stream's tail (a copy's, often) */
  return r;
}

/* Enough groups for COUNT elements at most one each, capped (the kernels stride). */
static ze_group_count_t groups_for(const sl_ze_be *be, const sl_ze_kernel *k, uint64_t count) {
  uint64_t g = (count + k->group_size - 1) / k->group_size;
  return (ze_group_count_t){(uint32_t)(g < be->kern.max_groups ? g : be->kern.max_groups), 1, 1};
}

static size_t castable_size(sl_dtype dt) {
  switch (dt) {
    case SL_DTYPE_F64: return 8;
    case SL_DTYPE_F32: return 4;
    case SL_DTYPE_F16:
    case SL_DTYPE_BF16: return 2;
    default: return 0;
  }
}

static const char *dt_name(sl_dtype dt) {
  switch (dt) {
    case SL_DTYPE_F64: return "F64";
    case SL_DTYPE_F32: return "F32";
    case SL_DTYPE_F16: return "F16";
    case SL_DTYPE_BF16: return "BF16";
    default: return "a dtype that is not castable";
  }
}

/* Aligned kernels where both pointers are element-aligned, else the byte kernels (a misaligned
 * wide access faults on a GPU). COUNT 0 asks whether the pair runs here (module.h). */
static sl_status ze_cast_async(void *h, void *dst, sl_dtype dst_dt, const void *src, sl_dtype src_dt, size_t count,
                               void *stream) {
  sl_ze_be *be = h;
  size_t ds = castable_size(dst_dt), ss = castable_size(src_dt), dbytes, sbytes;
  if (!ds || !ss)
    return be->host->fail(be->host->core, SL_ERR_DTYPE, "level_zero:%d: cast_async: cannot cast %s (%d) to %s (%d): only "
                          "F64, F32, F16 and BF16 are castable", be->ordinal, dt_name(src_dt), (int)src_dt,
                          dt_name(dst_dt), (int)dst_dt);
  if (__builtin_mul_overflow(count, ds, &dbytes) || __builtin_mul_overflow(count, ss, &sbytes))
    return be->host->fail(be->host->core, SL_ERR_INVALID, "level_zero:%d: cast_async: %zu elements overflow",
                          be->ordinal, count);
  if (dst_dt == src_dt) return count ? ze_copy_async(h, dst, src, dbytes, SL_COPY_D2D, stream) : SL_OK;
  int aligned = (uintptr_t)dst % ds == 0 && (uintptr_t)src % ss == 0, module = 0;
  const char *name = sl__ze_cast_kernel(src_dt, dst_dt, aligned, &module);
  const sl_ze_kernel *k = name && sl__ze_kernels_run(&be->kern, module, 0) ? sl__ze_kernel_get(&be->kern, name) : NULL;
  if (!k && !count) return SL_ERR_UNSUPPORTED; /* the core's question (module.h): no message */
  if (!k)
    return be->host->fail(be->host->core, SL_ERR_UNSUPPORTED,
                          "level_zero:%d: cast_async: %s to %s does not run on this device (%s): cast it on the host",
                          be->ordinal, dt_name(src_dt), dt_name(dst_dt),
                          sl__ze_kernels_why_not(&be->kern, module, 0));
  if (!count) return SL_OK;
  const unsigned char *d = dst, *c = src;
  if (!dst || !src)
    return be->host->fail(be->host->core, SL_ERR_INVALID, "level_zero:%d: cast_async: a NULL %s of %zu elements",
                          be->ordinal, dst ? "source" : "destination", count);
  if (d < c + sbytes && c < d + dbytes)
    return be->host->fail(be->host->core, SL_ERR_INVALID, "level_zero:%d: cast_async: source %p and destination %p "
                          "overlap", be->ordinal, src, dst);
  sl_ze_cmd cmd = {.kind = CMD_KERNEL, .kernel = k, .dst = dst, .src = src, .count = count,
                   .groups = groups_for(be, k, count)};
  return stream_append(be, stream_of(be, stream), &cmd);
}

/* The SGD step as core/src/hostops.c computes it (F16/BF16 in F32), on the host, for a device
 * whose kernels cannot give the host's bits (ze_cast.h); X and G in pinned host memory. */
static void host_sgd(void *x, const void *g, sl_dtype dt, size_t count, float lr) {
  for (size_t i = 0; i < count; i++) {
    if (dt == SL_DTYPE_F64) {
      double xv, gv;
      memcpy(&xv, (char *)x + 8 * i, 8);
      memcpy(&gv, (const char *)g + 8 * i, 8);
      xv -= (double)lr * gv;
      memcpy((char *)x + 8 * i, &xv, 8);
    } else if (dt == SL_DTYPE_F32) {
      float xv, gv;
      memcpy(&xv, (char *)x + 4 * i, 4);
      memcpy(&gv, (const char *)g + 4 * i, 4);
      xv -= lr * gv;
      memcpy((char *)x + 4 * i, &xv, 4);
    } else {
      uint16_t xb, gb;
      memcpy(&xb, (char *)x + 2 * i, 2);
      memcpy(&gb, (const char *)g + 2 * i, 2);
      int bf = dt == SL_DTYPE_BF16;
      float xv = slc_f32_from(bf ? slc_bf16_to_f32(xb) : slc_f16_to_f32(xb));
      float gv = slc_f32_from(bf ? slc_bf16_to_f32(gb) : slc_f16_to_f32(gb));
      uint32_t r = slc_f32_bits(xv - lr * gv);
      xb = bf ? slc_f32_to_bf16(r) : slc_f32_to_f16(r);
      memcpy((char *)x + 2 * i, &xb, 2);
    }
  }
}

/* Down, the step on the host, and up again, on the default stream; complete on return. */
static sl_status sgd_on_host(sl_ze_be *be, void *x, const void *g, sl_dtype dt, size_t bytes, size_t count,
                             float lr) {
  void *hx = NULL, *hg = NULL;
  sl_status st = ze_alloc_pinned(be, bytes, &hx);
  if (st == SL_OK) st = ze_alloc_pinned(be, bytes, &hg);
  if (st == SL_OK) st = ze_copy_async(be, hx, x, bytes, SL_COPY_D2H, NULL);
  if (st == SL_OK) st = ze_copy_async(be, hg, g, bytes, SL_COPY_D2H, NULL);
  if (st == SL_OK) st = ze_stream_sync(be, NULL);
  if (st == SL_OK) {
    host_sgd(hx, hg, dt, count, lr);
    st = ze_copy_async(be, x, hx, bytes, SL_COPY_H2D, NULL);
  }
  if (st == SL_OK) st = ze_stream_sync(be, NULL);
  else ze_synchronize(be); /* nothing may still read HX or HG when they are freed */
  ze_free_pinned(be, hx);
  ze_free_pinned(be, hg);
  return st;
}

/* SL_EXT_SGD_STEP: complete on return; after everything queued on every stream, then waited for. */
static sl_status ze_sgd_step(void *h, void *x, const void *g, sl_dtype dt, size_t count, float lr) {
  sl_ze_be *be = h;
  size_t es = castable_size(dt), bytes;
  if (!es)
    return be->host->fail(be->host->core, SL_ERR_DTYPE, "level_zero:%d: sgd step: dtype %d is not a floating type "
                          "(F64, F32, F16, BF16)", be->ordinal, (int)dt);
  if (__builtin_mul_overflow(count, es, &bytes))
    return be->host->fail(be->host->core, SL_ERR_INVALID, "level_zero:%d: sgd step: %zu elements overflow", be->ordinal,
                          count);
  sl_status st = ze_synchronize(be);
  if (st != SL_OK || !count) return st;
  if (!ze_is_device_ptr(be, x, bytes) || !ze_is_device_ptr(be, g, bytes))
    return be->host->fail(be->host->core, SL_ERR_INVALID, "level_zero:%d: sgd step: %p / %p (+%zu bytes) are not device "
                          "buffers of this backend", be->ordinal, x, g, bytes);
  int module = 0;
  const char *name = sl__ze_sgd_kernel(dt, &module);
  const sl_ze_kernel *k = name && sl__ze_kernels_run(&be->kern, module, 1) ? sl__ze_kernel_get(&be->kern, name) : NULL;
  if (!k) return sgd_on_host(be, x, g, dt, bytes, count, lr);
  sl_ze_cmd cmd = {.kind = CMD_KERNEL, .kernel = k, .dst = x, .src = g, .count = count, .lr = lr,
                   .groups = groups_for(be, k, count)};
  if ((st = stream_append(be, &be->dflt, &cmd)) != SL_OK) return st;
  return ze_stream_sync(be, NULL);
}

/* ---- extensions and the table --------------------------------------------------------------- */

static void *ze_native_stream(void *h, void *stream) { return stream_of(h, stream)->list; }

static void ze_traffic(void *h, uint64_t *h2d, uint64_t *d2h) {
  sl_ze_be *be = h;
  if (h2d) *h2d = __atomic_load_n(&be->h2d, __ATOMIC_RELAXED);
  if (d2h) *d2h = __atomic_load_n(&be->d2h, __ATOMIC_RELAXED);
}

/* SL_EXT_MAX_ALLOC: maxMemAllocSize where the driver cannot relax it, else no limit. */
static uint64_t ze_max_alloc(void *h) {
  sl_ze_be *be = h;
  return be->relaxed ? 0 : be->props.maxMemAllocSize;
}

/* SL_EXT_DEVICE_COUNT: the GPU devices init's DEVICE names (list_gpus's, in its order); 0 where
 * the loader or a driver is missing (the probe says why). */
static int ze_device_count(void) {
  sl_ze_gpu gpus[64];
  uint32_t n = 0;
  char why[256];
  if (!sl__ze_ready() || list_gpus(gpus, 64, &n, why, sizeof why) != SL_OK) return 0;
  return (int)n;
}

static void *ze_get_proc(const char *name) {
  if (!name) return NULL;
  if (strcmp(name, SL_EXT_NATIVE_STREAM) == 0) return (void *)(sl_ext_native_stream_fn)ze_native_stream;
  if (strcmp(name, SL_EXT_TRAFFIC) == 0) return (void *)(sl_ext_traffic_fn)ze_traffic;
  if (strcmp(name, SL_EXT_SGD_STEP) == 0) return (void *)(sl_ext_sgd_step_fn)ze_sgd_step;
  if (strcmp(name, SL_EXT_STREAM_ABANDON) == 0) return (void *)(sl_ext_stream_abandon_fn)ze_stream_abandon;
  if (strcmp(name, SL_EXT_MAX_ALLOC) == 0) return (void *)(sl_ext_max_alloc_fn)ze_max_alloc;
  if (strcmp(name, SL_EXT_DEVICE_COUNT) == 0) return (void *)(sl_ext_device_count_fn)ze_device_count;
  return NULL;
}

static const sl_backend_ops ze_ops = {
    .abi_version = SL_BACKEND_ABI_VERSION,
    .size = sizeof(sl_backend_ops),
    .name = "level_zero",
    .flags = SL_BACKEND_HAS_PINNED,
    /* host staging over Gloo: oneCCL, Level Zero's device collective, is not packaged */
    .preferred_collective = "gloo",
    .probe = sl__ze_probe,
    .init = ze_init,
    .fini = ze_fini,
    .describe = ze_describe,
    .device_ordinal = ze_device_ordinal,
    .alloc_device = ze_alloc_device,
    .free_device = ze_free_device,
    .alloc_pinned = ze_alloc_pinned,
    .free_pinned = ze_free_pinned,
    .stream_create = ze_stream_create,
    .stream_destroy = ze_stream_destroy,
    .event_create = ze_event_create,
    .event_destroy = ze_event_destroy,
    .event_record = ze_event_record,
    .stream_wait_event = ze_stream_wait_event,
    .event_query = ze_event_query,
    .event_sync = ze_event_sync,
    .stream_sync = ze_stream_sync,
    .synchronize = ze_synchronize,
    .copy_async = ze_copy_async,
    .cast_async = ze_cast_async,
    .copy_2d_async = ze_copy_2d_async,
    .register_host = ze_register_host,
    .unregister_host = ze_unregister_host,
    .is_device_ptr = ze_is_device_ptr,
    .get_proc = ze_get_proc,
    .device_identity = ze_device_identity,
    .event_record_native = ze_event_record_native,
    .free_device_after = ze_free_device_after,
    .native_api = "level_zero",
    .dlpack_device_type = 14, /* kDLOneAPI */
    .launch_host_fn = ze_launch_host_fn,
};

__attribute__((visibility("default"))) const sl_backend_ops *sl_backend_module_v2(void) { return &ze_ops; }
