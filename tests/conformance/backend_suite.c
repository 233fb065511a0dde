/* The backend conformance suite: every op of shardload/module.h's backend table, on one module
 * named by its name or its file (docs/MODULES.md, "Testing a module"), as the contract states
 * it — what is complete on return, what is enqueued and what orders it, what is sticky — and
 * every optional op only where SL_HAS_OP says the module offers it. One executable, run against
 * every backend the build has (tests/conformance/CMakeLists.txt), as ggml's test-backend-ops
 * runs every op on every backend.
 *
 *   conformance_backend [--async] [--v1] MODULE
 *
 * MODULE: NAME[:VARIANT] (built in, or libshardload-NAME.so on SHARDLOAD_MODULE_PATH) or a path
 * DIR/libshardload-NAME.so[:VARIANT]. --v1: use the module's ABI v1 entry (adapted) rather than
 * its v2 one. --async: the module must be asynchronous the way a device is — enqueued work runs
 * later and streams run concurrently — so that the cases that show a missing wait reading stale
 * bytes must see them (sim does; on any other module those cases say what they saw). Exits 77
 * (skipped) when the module cannot run on this machine (its probe, or init, says no device).
 *
 * A case that needs a stream held busy uses the blocker (conformance.h): a calibrated chain of
 * device copies, then an event; while that event is pending nothing queued after it has run. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"
#include "testutil.h"

static conf_module M;
static const sl_backend_ops *O;
static void *BE;
static bool expect_async;
static conf_blocker K;
static bool have_blocker;

#define OK(call)                                                                                   \
  do {                                                                                             \
    sl_status st_ = (call);                                                                        \
    if (st_ != SL_OK) fail_msg("%s: %s: %s", #call, sl_status_name(st_), conf_msg());             \
  } while (0)

/* ---- fixtures ------------------------------------------------------------------------------- */
static int setup(void **state) {
  conf_msg_clear();
  have_blocker = false;
  sl_status st = conf_backend_init(&M, 0, 1, 60000, &BE);
  if (st != SL_OK) fprintf(stderr, "init: %s: %s\n", sl_status_name(st), conf_msg());
  return st == SL_OK ? 0 : -1;
}

static int teardown(void **state) {
  if (have_blocker) conf_blocker_fini(&K);
  (void)O->synchronize(BE); /* as the core does before fini; a sticky error is no matter here */
  O->fini(BE);
  BE = NULL;
  /* module.h, Threads: fail() only on the thread of a call the core made, never from the
   * module's own threads (stream workers): their failures come back through a later call */
  const char *last;
  if (conf_foreign_fails(&last)) fail_msg("the module called fail() from a thread of its own: %s", last);
  return 0;
}

static conf_blocker *blocker(void) {
  char why[512];
  if (!have_blocker && conf_blocker_init(&K, O, BE, why, sizeof why) != SL_OK) fail_msg("%s", why);
  have_blocker = true;
  if (expect_async && K.synchronous)
    fail_msg("%s: enqueued copies completed before the call returned; --async says this module runs them later", M.spec);
  return &K;
}

/* Whether EV (recorded after a block) is still pending. A module that ran the work before the
 * host looked is checked no further by the caller (it prints why), unless --async says it must
 * not have. */
static bool held(void *ev, const char *what) {
  int q = O->event_query(BE, ev);
  if (q < 0) fail_msg("%s: event_query failed: %s", what, conf_msg());
  if (q == 0) return true;
  if (expect_async) fail_msg("%s: the held stream had already run its work: an asynchronous module runs it later", what);
  printf("# %s: the work had already run when the host looked (a synchronous module): not checked\n", what);
  return false;
}

static void *dev(size_t n) {
  void *p = NULL;
  OK(O->alloc_device(BE, n, &p));
  assert_non_null(p);
  return p;
}

static void *stream(void) {
  void *s = NULL;
  OK(O->stream_create(BE, &s));
  assert_non_null(s);
  return s;
}

static void *event(void) {
  void *e = NULL;
  OK(O->event_create(BE, &e));
  assert_non_null(e);
  return e;
}

static bool has_pinned(void) { return SL_HAS_OP(O, alloc_pinned) && SL_HAS_OP(O, free_pinned); }

/* Host memory for copies: pinned where the module has it (PINNED says which), else pageable. */
static void *host(size_t n, bool *pinned) {
  void *p = NULL;
  *pinned = has_pinned();
  if (*pinned) OK(O->alloc_pinned(BE, n, &p));
  else p = malloc(n);
  assert_non_null(p);
  return p;
}

static void host_free(void *p, bool pinned) {
  if (pinned) O->free_pinned(BE, p);
  else free(p);
}

static void up(void *d, const void *h, size_t n, void *s) { OK(O->copy_async(BE, d, h, n, SL_COPY_H2D, s)); }
static void down(void *h, const void *d, size_t n, void *s) { OK(O->copy_async(BE, h, d, n, SL_COPY_D2H, s)); }

/* ---- the table ------------------------------------------------------------------------------ */
static void test_table(void **state) {
  assert_int_equal(O->abi_version, SL_BACKEND_ABI_VERSION);
  assert_true(O->size >= offsetof(sl_backend_ops, copy_async) + sizeof O->copy_async);
  assert_string_equal(O->name, M.name);
  static const char *const names[] = {"alloc_pinned", "cast_async", "copy_2d_async", "register_host", "is_device_ptr",
                                      "get_proc", "device_identity", "event_record_native", "free_device_after"};
  const bool offered[] = {SL_HAS_OP(O, alloc_pinned), SL_HAS_OP(O, cast_async), SL_HAS_OP(O, copy_2d_async),
                          SL_HAS_OP(O, register_host), SL_HAS_OP(O, is_device_ptr), SL_HAS_OP(O, get_proc),
                          SL_HAS_OP(O, device_identity), SL_HAS_OP(O, event_record_native),
                          SL_HAS_OP(O, free_device_after)};
  printf("# %s: table of %u bytes, flags %#x; optional ops:", M.spec, O->size, O->flags);
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) printf(" %s%s", offered[i] ? "" : "!", names[i]);
  printf("\n");
  /* pairs: what is offered must be offered whole */
  assert_int_equal(SL_HAS_OP(O, alloc_pinned), SL_HAS_OP(O, free_pinned));
  assert_int_equal(SL_HAS_OP(O, register_host), SL_HAS_OP(O, unregister_host));
  assert_int_equal(SL_HAS_OP(O, event_record_native), SL_HAS_OP(O, free_device_after)); /* both or neither */
  if (O->flags & SL_BACKEND_HAS_PINNED) assert_true(has_pinned());
  /* probe: a reason that fits the buffer, cut and terminated when it does not */
  char reason[256], tiny[8];
  memset(reason, 'x', sizeof reason);
  memset(tiny, 'x', sizeof tiny);
  int score = O->probe(reason, sizeof reason);
  assert_true(memchr(reason, 0, sizeof reason) != NULL || score > 0);
  int again = O->probe(tiny, sizeof tiny);
  assert_int_equal(again, score);
  if (score <= 0) assert_non_null(memchr(tiny, 0, sizeof tiny));
  /* describe: one terminated line within the buffer, cut when it is short */
  char d[256], small[6];
  memset(d, 'x', sizeof d);
  memset(small, 'x', sizeof small);
  O->describe(BE, d, sizeof d);
  assert_non_null(memchr(d, 0, sizeof d));
  assert_true(strlen(d) > 0);
  assert_null(strchr(d, '\n'));
  O->describe(BE, small, sizeof small);
  assert_non_null(memchr(small, 0, sizeof small));
  printf("# %s\n", d);
  if (SL_HAS_OP(O, device_ordinal)) assert_true(O->device_ordinal(BE) >= 0);
  if (SL_HAS_OP(O, get_proc)) assert_null(O->get_proc("sl_ext_no_such_extension"));
  /* the members a device collective and DLPack read (module.h, Native handles) */
  const char *api = SL_HAS_OP(O, native_api) ? O->native_api : NULL;
  printf("# native API %s, DLPack device type %d, pinned %d, launch_host_fn %s\n", api ? api : "none",
         SL_HAS_OP(O, dlpack_device_type) ? O->dlpack_device_type : 0,
         SL_HAS_OP(O, dlpack_pinned_type) ? O->dlpack_pinned_type : 0, SL_HAS_OP(O, launch_host_fn) ? "yes" : "no");
  if (api) {
    assert_true(SL_HAS_OP(O, get_proc) && O->get_proc(SL_EXT_NATIVE_STREAM)); /* module.h: an API gives its streams */
  }
}

/* ---- copies --------------------------------------------------------------------------------- */
/* Each copy kind at odd sizes and offsets, on the NULL stream and on streams of the module's,
 * completed by each of the three syncs in turn: the bytes arrive and nothing around them moves. */
static void test_copies_round_trip(void **state) {
  static const size_t sizes[] = {1, 7, 4099, (1u << 20) + 5};
  void *s = stream(), *ev = event();
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i], pad = 64, all = n + 2 * pad;
    unsigned char *in = malloc(n), *guard = malloc(all), *out = malloc(all);
    assert_non_null(in);
    assert_non_null(guard);
    assert_non_null(out);
    conf_fill(in, n, 10 + i, 0);
    memset(guard, 0xEE, all);
    unsigned char *a = dev(all), *b = dev(all);
    void *q = i % 2 ? s : NULL; /* the NULL stream is a stream like the others */
    up(a, guard, all, q);
    up(b, guard, all, q);
    up(a + pad + 1, in, n, q);                                    /* odd offsets */
    OK(O->copy_async(BE, b + pad + 3, a + pad + 1, n, SL_COPY_D2D, q));
    down(out, b, all, q);
    if (i % 3 == 0) OK(O->stream_sync(BE, q));
    else if (i % 3 == 1) {
      OK(O->event_record(BE, ev, q));
      OK(O->event_sync(BE, ev));
    } else OK(O->synchronize(BE));
    assert_int_equal(conf_not_all(out, pad + 3, 0xEE), -1);
    long at = conf_differs(out + pad + 3, n, 10 + i, 0);
    if (at >= 0) fail_msg("%zu bytes H2D, D2D, D2H (stream %s): byte %ld differs", n, q ? "created" : "NULL", at);
    assert_int_equal(conf_not_all(out + pad + 3 + n, all - pad - 3 - n, 0xEE), -1);
    O->free_device(BE, a);
    O->free_device(BE, b);
    free(in), free(guard), free(out);
  }
  O->event_destroy(BE, ev);
  O->stream_destroy(BE, s);
}

/* ---- streams and events ------------------------------------------------------------------------ */
/* An event never recorded has completed: query says 1, sync returns, a wait on it waits for
 * nothing. */
static void test_event_never_recorded(void **state) {
  void *ev = event(), *s = stream();
  assert_int_equal(O->event_query(BE, ev), 1);
  OK(O->event_sync(BE, ev));
  OK(O->stream_wait_event(BE, s, ev));
  unsigned char in[256], out[256] = {0};
  conf_fill(in, sizeof in, 3, 0);
  unsigned char *d = dev(sizeof in);
  up(d, in, sizeof in, s);
  down(out, d, sizeof out, s);
  OK(O->stream_sync(BE, s));
  assert_memory_equal(in, out, sizeof in);
  O->free_device(BE, d);
  O->stream_destroy(BE, s);
  O->event_destroy(BE, ev); /* a never-recorded event is destroyed like any */
}

/* event_query never blocks and says 0 while the record's work is pending; event_sync blocks
 * until it ran; a wait on another stream holds that stream too. */
static void test_event_query_and_sync(void **state) {
  conf_blocker *k = blocker();
  void *s1 = stream(), *s2 = stream(), *held_ev = event(), *after = event();
  OK(conf_block(k, s1, held_ev));
  double t0 = conf_now_ms();
  int q = O->event_query(BE, held_ev);
  double took = conf_now_ms() - t0;
  assert_true(q == 0 || q == 1);
  assert_true(took < 100); /* a query never waits for the work */
  if (held(held_ev, "event_query")) {
    /* s2 waits for the held record, then records: that record is held too */
    OK(O->stream_wait_event(BE, s2, held_ev));
    OK(O->event_record(BE, after, s2));
    assert_int_equal(O->event_query(BE, after), 0);
  } else {
    OK(O->stream_wait_event(BE, s2, held_ev));
    OK(O->event_record(BE, after, s2));
  }
  OK(O->event_sync(BE, after));
  assert_int_equal(O->event_query(BE, held_ev), 1); /* what s2 waited for ran first */
  assert_int_equal(O->event_query(BE, after), 1);
  OK(O->event_sync(BE, held_ev));
  O->event_destroy(BE, after);
  O->event_destroy(BE, held_ev);
  O->stream_destroy(BE, s2);
  O->stream_destroy(BE, s1);
}

/* The host reads a D2H destination without waiting for the copy: on an asynchronous module it
 * holds what it held before (a core that forgets a wait reads stale bytes); after event_sync
 * it holds the copy. */
static void test_missing_wait_reads_stale(void **state) {
  conf_blocker *k = blocker();
  enum { N = 1 << 16 };
  unsigned char *src = malloc(N), *out = malloc(N), *d = dev(N);
  assert_non_null(src);
  assert_non_null(out);
  conf_fill(src, N, 77, 0);
  void *s = stream(), *held_ev = event(), *done = event();
  up(d, src, N, s);
  OK(O->stream_sync(BE, s));
  memset(out, 0x11, N);
  OK(conf_block(k, s, held_ev));
  down(out, d, N, s);
  OK(O->event_record(BE, done, s));
  if (held(held_ev, "a D2H read without a wait")) {
    /* queued behind the held work: it cannot have written a byte */
    long at = conf_not_all(out, N, 0x11);
    if (at >= 0) fail_msg("the D2H queued behind held work wrote byte %ld before that work ran", at);
    printf("# read without a wait: stale bytes, as a missing wait would read\n");
  }
  OK(O->event_sync(BE, done));
  assert_int_equal(conf_differs(out, N, 77, 0), -1);
  O->event_destroy(BE, done);
  O->event_destroy(BE, held_ev);
  O->stream_destroy(BE, s);
  O->free_device(BE, d);
  free(src), free(out);
}

/* A producer stream writes SRC behind held work and records EV; a consumer stream copies SRC
 * to DST. With stream_wait_event(consumer, EV) the consumer sees what the producer wrote; on an
 * asynchronous module, without it the consumer ran first and copied the old bytes. Returns the
 * byte DST holds. */
static unsigned char producer_consumer(bool wait, bool *raced) {
  conf_blocker *k = blocker();
  enum { N = 1 << 16 };
  unsigned char *src = dev(N), *dst = dev(N), *zero = calloc(1, N), *fill = malloc(N), *out = malloc(N);
  assert_non_null(zero);
  assert_non_null(fill);
  assert_non_null(out);
  memset(fill, 0x5A, N);
  void *ps = stream(), *cs = stream(), *held_ev = event(), *ev = event();
  up(src, zero, N, ps);
  up(dst, zero, N, ps);
  OK(O->stream_sync(BE, ps));
  OK(conf_block(k, ps, held_ev));
  up(src, fill, N, ps);
  OK(O->event_record(BE, ev, ps));
  if (wait) OK(O->stream_wait_event(BE, cs, ev));
  OK(O->copy_async(BE, dst, src, N, SL_COPY_D2D, cs));
  down(out, dst, N, cs);
  OK(O->stream_sync(BE, cs));
  /* the consumer is done; was the producer still held? (then, without the wait, it raced) */
  *raced = O->event_query(BE, held_ev) == 0;
  OK(O->synchronize(BE));
  unsigned char v = out[0];
  assert_int_equal(conf_not_all(out, N, v), -1); /* whole, not torn */
  O->event_destroy(BE, ev);
  O->event_destroy(BE, held_ev);
  O->stream_destroy(BE, cs);
  O->stream_destroy(BE, ps);
  O->free_device(BE, src);
  O->free_device(BE, dst);
  free(zero), free(fill), free(out);
  return v;
}

static void test_cross_stream_order(void **state) {
  bool raced;
  assert_int_equal(producer_consumer(true, &raced), 0x5A);
  assert_false(raced); /* the consumer waited for the producer, which waited for the held work */
  unsigned char v = producer_consumer(false, &raced);
  printf("# without stream_wait_event the consumer read %s\n", v == 0 ? "the old bytes" : "the new bytes");
  if (raced) assert_int_equal(v, 0x00); /* it finished while the producer was still held */
  if (expect_async && !raced) fail_msg("without a wait the consumer stream waited for the producer's held work");
}

/* stream_sync waits for its stream only; synchronize for every stream. */
static void test_stream_sync_and_synchronize(void **state) {
  conf_blocker *k = blocker();
  enum { N = 4096 };
  unsigned char in[N], out1[N], out2[N], *d1 = dev(N), *d2 = dev(N);
  conf_fill(in, N, 5, 0);
  memset(out1, 0, N);
  memset(out2, 0, N);
  void *s1 = stream(), *s2 = stream(), *held_ev = event();
  OK(conf_block(k, s1, held_ev));
  up(d1, in, N, s1);
  down(out1, d1, N, s1);
  up(d2, in, N, s2);
  down(out2, d2, N, s2);
  OK(O->stream_sync(BE, s2));
  assert_memory_equal(out2, in, N);
  if (expect_async) assert_int_equal(O->event_query(BE, held_ev), 0); /* s2's sync did not wait for s1 */
  OK(O->synchronize(BE));
  assert_int_equal(O->event_query(BE, held_ev), 1);
  assert_memory_equal(out1, in, N);
  O->event_destroy(BE, held_ev);
  O->stream_destroy(BE, s2);
  O->stream_destroy(BE, s1);
  O->free_device(BE, d1);
  O->free_device(BE, d2);
}

/* A stream destroyed with work queued finishes it first. */
static void test_stream_destroy_drains(void **state) {
  conf_blocker *k = blocker();
  enum { N = 4096 };
  unsigned char in[N], out[N], *d = dev(N);
  conf_fill(in, N, 6, 0);
  memset(out, 0, N);
  void *s = stream(), *held_ev = event();
  OK(conf_block(k, s, held_ev));
  for (int i = 0; i < 20; i++) up(d, in, N, s);
  down(out, d, N, s);
  O->stream_destroy(BE, s);
  assert_memory_equal(out, in, N);
  assert_int_equal(O->event_query(BE, held_ev), 1);
  O->event_destroy(BE, held_ev);
  O->free_device(BE, d);
}

/* An event's last record is what query and sync speak of: recorded again behind held work after
 * its first record completed, it is pending again. */
static void test_event_rerecorded(void **state) {
  conf_blocker *k = blocker();
  void *s = stream(), *ev = event(), *held_ev = event();
  OK(O->event_record(BE, ev, s));
  OK(O->event_sync(BE, ev));
  assert_int_equal(O->event_query(BE, ev), 1);
  OK(conf_block(k, s, held_ev));
  OK(O->event_record(BE, ev, s));
  if (held(held_ev, "a re-recorded event")) assert_int_equal(O->event_query(BE, ev), 0);
  OK(O->event_sync(BE, ev));
  assert_int_equal(O->event_query(BE, ev), 1);
  assert_int_equal(O->event_query(BE, held_ev), 1);
  O->event_destroy(BE, held_ev);
  O->event_destroy(BE, ev);
  O->stream_destroy(BE, s);
}

/* A pipeline as the loader runs it: two host slots, chunks copied up on one stream, packed on
 * another after an event, slots and device buffers reused only after the events that free them
 * (re-recorded while the last record may still be pending). With every wait in place the data
 * is exact whatever the module's timing. */
static void test_pipeline_with_events(void **state) {
  enum { CH = 256, CHUNKS = 400, SLOTS = 2 };
  unsigned char *slot[SLOTS], *upb[SLOTS], *dst = dev(CH * CHUNKS), *out = malloc(CH * CHUNKS);
  assert_non_null(out);
  bool pinned[SLOTS];
  void *copy_s = stream(), *pack_s = stream(), *uploaded[SLOTS], *consumed[SLOTS];
  for (int i = 0; i < SLOTS; i++) {
    slot[i] = host(CH, &pinned[i]);
    upb[i] = dev(CH);
    uploaded[i] = event();
    consumed[i] = event();
  }
  for (int c = 0; c < CHUNKS; c++) {
    int i = c % SLOTS;
    OK(O->event_sync(BE, uploaded[i])); /* the host may refill the slot */
    memset(slot[i], (unsigned char)(c * 13 + 5), CH);
    OK(O->stream_wait_event(BE, copy_s, consumed[i])); /* the device buffer is free */
    up(upb[i], slot[i], CH, copy_s);
    OK(O->event_record(BE, uploaded[i], copy_s));
    OK(O->stream_wait_event(BE, pack_s, uploaded[i]));
    OK(O->copy_async(BE, dst + (size_t)c * CH, upb[i], CH, SL_COPY_D2D, pack_s));
    OK(O->event_record(BE, consumed[i], pack_s));
  }
  down(out, dst, CH * CHUNKS, pack_s);
  OK(O->synchronize(BE));
  for (int c = 0; c < CHUNKS; c++)
    if (conf_not_all(out + (size_t)c * CH, CH, (unsigned char)(c * 13 + 5)) >= 0) fail_msg("chunk %d differs", c);
  for (int i = 0; i < SLOTS; i++) {
    O->event_destroy(BE, uploaded[i]);
    O->event_destroy(BE, consumed[i]);
    host_free(slot[i], pinned[i]);
    O->free_device(BE, upb[i]);
  }
  O->stream_destroy(BE, copy_s);
  O->stream_destroy(BE, pack_s);
  O->free_device(BE, dst);
  free(out);
}

/* ---- sticky errors ------------------------------------------------------------------------------ */
/* A failure of enqueued work that the enqueuing call did not report is sticky: event_query says
 * < 0, and stream_sync, synchronize and event_sync return it, every time; another instance of
 * the module is not touched. The failing op is a cast of a dtype nothing casts (I32). */
static void test_sticky_errors(void **state) {
  if (!SL_HAS_OP(O, cast_async)) skip();
  void *b2 = NULL, *a = NULL, *b = NULL, *ev = NULL;
  OK(conf_backend_init(&M, 0, 1, 60000, &b2));
  OK(O->alloc_device(b2, 256, &a));
  OK(O->alloc_device(b2, 256, &b));
  OK(O->event_create(b2, &ev));
  conf_msg_clear();
  sl_status st = O->cast_async(b2, b, SL_DTYPE_F32, a, SL_DTYPE_I32, 64, NULL);
  if (st != SL_OK) {
    /* reported by the enqueuing call: what the contract allows; it says what */
    assert_int_equal(st, SL_ERR_DTYPE);
    assert_true(strlen(conf_msg()) > 0);
    printf("# the enqueue reported it: %s\n", conf_msg());
  } else {
    OK(O->event_record(b2, ev, NULL));
    int q = 0;
    double until = conf_now_ms() + 20000;
    while ((q = O->event_query(b2, ev)) == 0 && conf_now_ms() < until) usleep(1000);
    assert_true(q < 0);
    for (int round = 0; round < 2; round++) {
      conf_msg_clear();
      assert_int_equal(O->stream_sync(b2, NULL), SL_ERR_DTYPE);
      assert_true(strlen(conf_msg()) > 0); /* and says why, on the caller's thread */
      assert_int_equal(O->synchronize(b2), SL_ERR_DTYPE);
      assert_int_equal(O->event_sync(b2, ev), SL_ERR_DTYPE);
    }
    printf("# sticky: %s\n", conf_msg());
  }
  /* the other instance is untouched */
  void *d = dev(64);
  unsigned char x[64], y[64] = {0};
  conf_fill(x, sizeof x, 9, 0);
  up(d, x, sizeof x, NULL);
  down(y, d, sizeof y, NULL);
  OK(O->synchronize(BE));
  assert_memory_equal(x, y, sizeof x);
  O->free_device(BE, d);
  O->event_destroy(b2, ev);
  O->free_device(b2, a);
  O->free_device(b2, b);
  (void)O->synchronize(b2);
  O->fini(b2);
}

/* ---- casts ------------------------------------------------------------------------------------- */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 0x2545F4914F6CDD1Dull;
}

/* Source values of DT: every 16-bit pattern (for 16-bit types) or random bit patterns with
 * NaNs, infinities, subnormals and values near the narrow types' range. */
static void cast_fill(unsigned char *p, sl_dtype dt, size_t n) {
  size_t es = sl_dtype_size(dt);
  for (size_t i = 0; i < n; i++) {
    uint64_t v = rnd();
    if (es == 2) v = i & 0xFFFF;
    else if (es == 4 && (v & 3) == 0) v = (v >> 8 & 0x80000000u) | (uint32_t)(0x33000000u + (v >> 40) % 0x15000000u);
    else if (es == 8 && (v & 3) == 0) v = (v & 0x800FFFFFFFFFFFFFull) | (uint64_t)(1023 - 150 + (v >> 52) % 300) << 52;
    memcpy(p + i * es, &v, es);
  }
}

/* H2D on stream A, the cast on A at the given byte offsets, D2H on stream B after an event: the
 * bytes must be sl_convert's. False when the module does not cast the pair (SL_ERR_DTYPE,
 * reported by the enqueue or by the sync; the instance is then replaced, errors being sticky),
 * or when its device does not (SL_ERR_UNSUPPORTED from the enqueue, not sticky, as the question
 * of 0 elements said before: module.h; the core casts such a pair on the host). */
static bool cast_case(sl_dtype sdt, sl_dtype ddt, size_t n, size_t soff, size_t doff) {
  size_t ss = sl_dtype_size(sdt), ds = sl_dtype_size(ddt);
  unsigned char *src = malloc(n * ss), *want = malloc(n * ds);
  assert_non_null(src);
  assert_non_null(want);
  cast_fill(src, sdt, n);
  OK(sl_convert(want, ddt, src, sdt, n));
  bool pinned;
  unsigned char *got = host(n * ds, &pinned), *dsrc = dev(n * ss + soff), *ddst = dev(n * ds + doff);
  memset(got, 0xA5, n * ds);
  void *a = stream(), *b = stream(), *ev = event(), *done = event();
  up(dsrc + soff, src, n * ss, a);
  sl_status asked = O->cast_async(BE, NULL, ddt, NULL, sdt, 0, NULL);
  sl_status st = O->cast_async(BE, ddst + doff, ddt, dsrc + soff, sdt, n, a);
  if (st == SL_ERR_UNSUPPORTED || asked == SL_ERR_UNSUPPORTED) {
    if (st != asked)
      fail_msg("cast %s -> %s: 0 elements: %s, %zu elements: %s: the question (module.h) and the cast disagree",
               sl_dtype_name(sdt), sl_dtype_name(ddt), sl_status_name(asked), n, sl_status_name(st));
    OK(O->stream_sync(BE, a)); /* not sticky, nothing queued but the upload */
  }
  if (st == SL_OK) {
    OK(O->event_record(BE, ev, a));
    OK(O->stream_wait_event(BE, b, ev));
    down(got, ddst + doff, n * ds, b);
    OK(O->event_record(BE, done, b));
    st = O->event_sync(BE, done);
  }
  bool cast = st == SL_OK, on_host = st == SL_ERR_UNSUPPORTED;
  if (st != SL_OK && st != SL_ERR_DTYPE && !on_host) fail_msg("cast %s -> %s: %s: %s", sl_dtype_name(sdt), sl_dtype_name(ddt), sl_status_name(st), conf_msg());
  if (cast) {
    assert_int_equal(O->event_query(BE, done), 1);
    for (size_t i = 0; i < n; i++)
      if (memcmp(want + i * ds, got + i * ds, ds) != 0) {
        uint64_t in = 0, w = 0, g = 0;
        memcpy(&in, src + i * ss, ss);
        memcpy(&w, want + i * ds, ds);
        memcpy(&g, got + i * ds, ds);
        fail_msg("%s -> %s (offsets %zu/%zu) element %zu: input 0x%llx, sl_convert 0x%llx, module 0x%llx",
                 sl_dtype_name(sdt), sl_dtype_name(ddt), soff, doff, i, (unsigned long long)in, (unsigned long long)w,
                 (unsigned long long)g);
      }
  }
  O->event_destroy(BE, done);
  O->event_destroy(BE, ev);
  O->stream_destroy(BE, b);
  O->stream_destroy(BE, a);
  O->free_device(BE, ddst);
  O->free_device(BE, dsrc);
  host_free(got, pinned);
  free(want);
  free(src);
  if (!cast && !on_host) { /* a new instance: the failure may be sticky */
    teardown(NULL);
    assert_int_equal(setup(NULL), 0);
  }
  return cast;
}

static void test_casts_bit_exact(void **state) {
  if (!SL_HAS_OP(O, cast_async)) skip();
  const sl_dtype dts[] = {SL_DTYPE_F64, SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};
  int pairs = 0;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) {
      bool cast = cast_case(dts[i], dts[j], 1u << 20, 0, 0); /* 16-bit sources: every pattern, 16 times */
      if (cast) assert_true(cast_case(dts[i], dts[j], 131073, 2, 1)); /* misaligned: odd byte offsets */
      printf("# cast %s -> %s: %s\n", sl_dtype_name(dts[i]), sl_dtype_name(dts[j]), cast ? "bit-exact" : "not offered");
      pairs += cast;
    }
  assert_true(pairs > 0); /* a module that offers cast_async casts something */
}

/* ---- 2-D copies ---------------------------------------------------------------------------------- */
/* ROWS rows of W bytes between pitched and packed layouts, each kind: the rows arrive, the bytes
 * between them (pitch - width) are left alone. */
static void check_rows(const unsigned char *got, size_t pitch, size_t w, size_t rows, uint64_t seed, size_t spitch,
                       unsigned char guard, const char *what) {
  for (size_t r = 0; r < rows; r++) {
    long at = conf_differs(got + r * pitch, w, seed, r * spitch);
    if (at >= 0) fail_msg("%s: row %zu differs at byte %ld", what, r, at);
    if (pitch > w && conf_not_all(got + r * pitch + w, pitch - w, guard) >= 0)
      fail_msg("%s: the gap after row %zu was written", what, r);
  }
}

static void test_copy_2d(void **state) {
  if (!SL_HAS_OP(O, copy_2d_async)) skip();
  enum { W = 211, ROWS = 37, SP = 300, DP = 256, HP = 333 };
  bool pinned_src, pinned_out;
  unsigned char *src = host(SP * ROWS, &pinned_src), *out = host(HP * ROWS, &pinned_out);
  unsigned char *pitched = dev(DP * ROWS), *packed = dev(W * ROWS), *guard = malloc(HP * ROWS), *whole = malloc(DP * ROWS);
  assert_non_null(guard);
  assert_non_null(whole);
  conf_fill(src, SP * ROWS, 21, 0);
  memset(guard, 0xEE, HP * ROWS);
  void *s = stream();
  up(pitched, guard, DP * ROWS, s);
  /* H2D: host rows of pitch SP into device rows of pitch DP */
  OK(O->copy_2d_async(BE, pitched, DP, src, SP, W, ROWS, SL_COPY_H2D, s));
  down(whole, pitched, DP * ROWS, s);
  OK(O->stream_sync(BE, s));
  check_rows(whole, DP, W, ROWS, 21, SP, 0xEE, "copy_2d_async H2D");
  /* D2D: pitched to packed (destination pitch == width) */
  OK(O->copy_2d_async(BE, packed, W, pitched, DP, W, ROWS, SL_COPY_D2D, s));
  /* D2H: packed into host rows of pitch HP, with a gap that must stay */
  memcpy(out, guard, HP * ROWS);
  OK(O->copy_2d_async(BE, out, HP, packed, W, W, ROWS, SL_COPY_D2H, s));
  OK(O->stream_sync(BE, s));
  check_rows(out, HP, W, ROWS, 21, SP, 0xEE, "copy_2d_async D2D then D2H");
  /* a column of single bytes, and one row whose pitches equal its width */
  memcpy(out, guard, HP * ROWS);
  OK(O->copy_2d_async(BE, out, 1, pitched + 5, DP, 1, ROWS, SL_COPY_D2H, s));
  OK(O->copy_2d_async(BE, out + 100, W, pitched, W, W, 1, SL_COPY_D2H, s));
  OK(O->stream_sync(BE, s));
  for (size_t r = 0; r < ROWS; r++) assert_int_equal(out[r], conf_byte(21, r * SP + 5));
  assert_int_equal(conf_differs(out + 100, W, 21, 0), -1);
  assert_int_equal(conf_not_all(out + 100 + W, 50, 0xEE), -1);
  O->stream_destroy(BE, s);
  O->free_device(BE, pitched);
  O->free_device(BE, packed);
  host_free(src, pinned_src);
  host_free(out, pinned_out);
  free(guard), free(whole);
}

/* ---- pinned and registered memory ----------------------------------------------------------------- */
static void test_pinned_memory(void **state) {
  if (!has_pinned()) skip();
  size_t n = (1u << 20) + 3;
  void *p = NULL, *q = NULL;
  OK(O->alloc_pinned(BE, n, &p));
  OK(O->alloc_pinned(BE, n, &q));
  conf_fill(p, n, 31, 0); /* host memory: the host writes it directly */
  memset(q, 0, n);
  unsigned char *d = dev(n);
  void *s = stream();
  up(d, p, n, s);
  down(q, d, n, s);
  OK(O->stream_sync(BE, s));
  assert_int_equal(conf_differs(q, n, 31, 0), -1);
  O->stream_destroy(BE, s);
  O->free_device(BE, d);
  O->free_pinned(BE, p);
  O->free_pinned(BE, q);
}

/* A caller's range registered (not page-aligned, as malloc gives it) is copied to and from as
 * any host memory, and is the caller's again once unregistered. */
/* The pinned-ness the core reports for a caller's CPU buffer that a cpu-pinned policy asks to
 * pin (the core registers it through this module): a one-rank load of one tensor on the module,
 * as a user's. */
static sl_status bind_malloc(void *user, const sl_tensor *t, sl_binding *out) {
  out->data = *(void **)user = malloc(t->nbytes);
  out->pinned = 0; /* pageable: the core registers it where the policy pins */
  return out->data ? SL_OK : SL_ERR_NOMEM;
}

static int core_pins_caller_buffer(void) {
  char *dir = sl_test_dir("conformance-register"), *path = sl_test_path(dir, "one.safetensors");
  const sl_test_tensor ts[] = {{"w", "F32", 1, {4096}, NULL}};
  assert_int_equal(sl_test_write_st(path, ts, 1, NULL), 0);
  char err[512] = "";
  sl_context_options co = {.size = sizeof co, .backend = M.spec, .world_size = 1, .errbuf = err, .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  sl_source *src = NULL;
  sl_plan *plan = NULL;
  sl_state *st = NULL;
  if (sl_context_create(&co, &ctx) != SL_OK) fail_msg("%s: context: %s", M.spec, err);
  assert_int_equal(sl_source_open(ctx, path, &src), SL_OK);
  assert_int_equal(sl_plan_create(ctx, &plan), SL_OK);
  const sl_offload_policy pol = {SL_OFFLOAD_CPU, 1};
  sl_plan_set_offload_policy(plan, &pol);
  void *buf = NULL;
  sl_load_options lo = {.size = sizeof lo, .cpu_offload = SL_CPU_OFFLOAD_INFER, .bind_buffer = bind_malloc,
                        .bind_buffer_user = &buf};
  if (sl_load(ctx, plan, src, &lo, &st) != SL_OK) fail_msg("%s: load: %s", M.spec, sl_context_errmsg(ctx));
  const sl_tensor *t = sl_state_tensor(st, 0);
  assert_ptr_equal(t->data, buf);
  assert_int_equal(t->device, SL_DEVICE_CPU);
  int pinned = t->pinned;
  sl_state_destroy(st); /* unregisters before the buffer is freed */
  free(buf);
  sl_plan_destroy(plan);
  sl_source_destroy(src);
  sl_context_destroy(ctx);
  free(path);
  free(dir);
  return pinned;
}

static void test_registered_memory(void **state) {
  if (!SL_HAS_OP(O, register_host)) skip();
  size_t n = (1u << 20) + 5;
  unsigned char *h = malloc(n + 16), *r = h + 3, *d = dev(n);
  assert_non_null(h);
  conf_fill(r, n, 41, 0);
  conf_msg_clear();
  sl_status rs = O->register_host(BE, r, n);
  /* module.h: a runtime that cannot pin a caller's range refuses with SL_ERR_UNSUPPORTED, not
   * sticky, and says why; the range stays pageable, a place to copy to and from as any host
   * memory, and the core reports a buffer it asked to pin as not pinned */
  bool registered = rs != SL_ERR_UNSUPPORTED;
  if (!registered) {
    printf("# register_host refused: %s\n", conf_msg());
    if (!conf_msg()[0]) fail_msg("register_host refused (SL_ERR_UNSUPPORTED) and said nothing");
  } else {
    OK(rs);
  }
  /* where the core asks for pinned memory at all (the backend declares it), through this table */
  if ((O->flags & SL_BACKEND_HAS_PINNED) && !M.v1) assert_int_equal(core_pins_caller_buffer(), registered);
  void *s = stream();
  up(d, r, n, s);
  OK(O->stream_sync(BE, s));
  memset(r, 0, n);
  down(r, d, n, s);
  OK(O->stream_sync(BE, s));
  assert_int_equal(conf_differs(r, n, 41, 0), -1);
  if (SL_HAS_OP(O, copy_2d_async)) { /* 2-D from registered memory too */
    memset(r, 0, n);
    OK(O->copy_2d_async(BE, r, 512, d, 512, 500, 64, SL_COPY_D2H, s));
    OK(O->stream_sync(BE, s));
    for (size_t row = 0; row < 64; row++) assert_int_equal(conf_differs(r + row * 512, 500, 41, row * 512), -1);
  }
  if (registered) O->unregister_host(BE, r);
  memset(r, 0, n);
  down(r, d, n, s); /* pageable again, and still a place to copy to */
  OK(O->stream_sync(BE, s));
  assert_int_equal(conf_differs(r, n, 41, 0), -1);
  O->stream_destroy(BE, s);
  O->free_device(BE, d);
  free(h);
}

static void test_is_device_ptr(void **state) {
  if (!SL_HAS_OP(O, is_device_ptr)) skip();
  enum { N = 4096 };
  unsigned char *d = dev(N), *h = malloc(64), stack[64];
  assert_non_null(h);
  assert_true(O->is_device_ptr(BE, d, N));
  assert_true(O->is_device_ptr(BE, d + 10, N - 10));
  assert_true(O->is_device_ptr(BE, d + N - 1, 1));
  assert_false(O->is_device_ptr(BE, d + 10, N)); /* runs past the buffer */
  assert_false(O->is_device_ptr(BE, h, 64));
  assert_false(O->is_device_ptr(BE, stack, sizeof stack));
  if (has_pinned()) {
    void *p = NULL;
    OK(O->alloc_pinned(BE, 64, &p));
    assert_false(O->is_device_ptr(BE, p, 64)); /* pinned host memory is host memory */
    O->free_pinned(BE, p);
  }
  O->free_device(BE, d);
  free(h);
}

/* ---- extensions -------------------------------------------------------------------------------- */
/* The SGD step (complete on return) against the host step, for every floating dtype; the
 * traffic counters count what crossed each way and nothing else. */
static void test_extensions(void **state) {
  if (!SL_HAS_OP(O, get_proc)) skip();
  assert_null(O->get_proc("sl_ext_no_such_extension"));
  sl_ext_sgd_step_fn sgd = (sl_ext_sgd_step_fn)O->get_proc(SL_EXT_SGD_STEP);
  sl_ext_traffic_fn traffic = (sl_ext_traffic_fn)O->get_proc(SL_EXT_TRAFFIC);
  printf("# extensions: %s%s\n", sgd ? SL_EXT_SGD_STEP " " : "", traffic ? SL_EXT_TRAFFIC : "");
  const sl_dtype dts[] = {SL_DTYPE_F64, SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};
  int stepped = 0;
  for (int k = 0; sgd && k < 4; k++) {
    size_t n = 100003, es = sl_dtype_size(dts[k]);
    float *xf = malloc(n * 4), *gf = malloc(n * 4);
    unsigned char *x = malloc(n * es), *g = malloc(n * es), *got = malloc(n * es), *dx = dev(n * es), *dg = dev(n * es);
    for (size_t i = 0; i < n; i++) {
      xf[i] = (float)((double)(rnd() % 2000001) / 1000.0 - 1000.0);
      gf[i] = (float)((double)(rnd() % 2000001) / 7000.0 - 140.0);
    }
    OK(sl_convert(x, dts[k], xf, SL_DTYPE_F32, n));
    OK(sl_convert(g, dts[k], gf, SL_DTYPE_F32, n));
    up(dx, x, n * es, NULL);
    up(dg, g, n * es, NULL);
    sl_status st = sgd(BE, dx, dg, dts[k], n, 0.01f); /* complete on return: ordered after the copies */
    if (st == SL_OK) {
      down(got, dx, n * es, NULL);
      OK(O->stream_sync(BE, NULL));
      OK(sl__host_sgd_step(x, g, dts[k], n, 0.01f));
      if (memcmp(x, got, n * es) != 0) fail_msg("sgd step on %s differs from the host step", sl_dtype_name(dts[k]));
      stepped++;
    } else if (st != SL_ERR_DTYPE) {
      fail_msg("sgd step on %s: %s: %s", sl_dtype_name(dts[k]), sl_status_name(st), conf_msg());
    }
    printf("# sgd step on %s: %s\n", sl_dtype_name(dts[k]), st == SL_OK ? "as the host step" : "not offered");
    O->free_device(BE, dg);
    O->free_device(BE, dx);
    free(got), free(g), free(x), free(gf), free(xf);
    if (st != SL_OK) { /* a new instance: the failure may be sticky */
      teardown(NULL);
      assert_int_equal(setup(NULL), 0);
      sgd = (sl_ext_sgd_step_fn)O->get_proc(SL_EXT_SGD_STEP);
    }
  }
  if (sgd) assert_true(stepped > 0);
  if (traffic) {
    enum { N = 10000 };
    unsigned char *h = malloc(N), *d = dev(N), *d2 = dev(N);
    memset(h, 1, N);
    uint64_t h2d0, d2h0, h2d1, d2h1;
    traffic(BE, &h2d0, &d2h0);
    up(d, h, N, NULL);
    OK(O->copy_async(BE, d2, d, N, SL_COPY_D2D, NULL)); /* neither way */
    down(h, d2, N / 2, NULL);
    if (SL_HAS_OP(O, copy_2d_async)) OK(O->copy_2d_async(BE, d, 100, h, 50, 10, 7, SL_COPY_H2D, NULL));
    OK(O->synchronize(BE));
    traffic(BE, &h2d1, &d2h1);
    assert_int_equal(h2d1 - h2d0, N + (SL_HAS_OP(O, copy_2d_async) ? 70 : 0));
    assert_int_equal(d2h1 - d2h0, N / 2);
    O->free_device(BE, d);
    O->free_device(BE, d2);
    free(h);
  }
}

/* ---- host functions and native handles ---------------------------------------------------------- */
/* A host function runs once, after the work queued before it on its stream and before the work
 * queued after it: behind a held stream it has not run; once the stream is done it saw the bytes
 * a D2H copy queued before it brought. A failing one is the stream's sticky error, its message
 * reported by the next sync. */
typedef struct host_fn_probe {
  const unsigned char *seen; /* what the function looks at */
  size_t n;
  unsigned char want;
  int runs, saw_right; /* written by the backend's thread; read after a sync */
} host_fn_probe;
static sl_status look(void *arg, char *err, size_t errlen) {
  host_fn_probe *p = arg;
  __atomic_add_fetch(&p->runs, 1, __ATOMIC_ACQ_REL);
  bool right = true;
  for (size_t i = 0; i < p->n; i++) right &= p->seen[i] == p->want;
  __atomic_store_n(&p->saw_right, right, __ATOMIC_RELEASE);
  return SL_OK;
}
static sl_status refuse(void *arg, char *err, size_t errlen) {
  snprintf(err, errlen, "conformance: the host function failed on purpose");
  return SL_ERR_IO;
}

static void test_host_functions(void **state) {
  if (!SL_HAS_OP(O, launch_host_fn)) skip();
  enum { N = 65536 };
  bool pinned;
  unsigned char *in = malloc(N), *out = host(N, &pinned), *d = dev(N);
  memset(in, 0x3C, N);
  memset(out, 0, N);
  void *s = stream();
  conf_blocker *k = blocker();
  void *ev = event();
  OK(conf_block(k, s, ev));
  up(d, in, N, s);
  down(out, d, N, s);
  host_fn_probe p = {out, N, 0x3C, 0, 0};
  sl_status lst = O->launch_host_fn(BE, s, look, &p);
  if (lst == SL_ERR_UNSUPPORTED) { /* the runtime underneath has none (module.h): not sticky */
    printf("# launch_host_fn: %s\n", conf_msg());
    OK(O->stream_sync(BE, s));
    O->event_destroy(BE, ev);
    O->stream_destroy(BE, s);
    O->free_device(BE, d);
    host_free(out, pinned);
    free(in);
    skip();
  }
  OK(lst);
  if (held(ev, "host function behind a held stream"))
    assert_int_equal(__atomic_load_n(&p.runs, __ATOMIC_ACQUIRE), 0); /* not before the work ahead of it */
  OK(O->stream_sync(BE, s));
  assert_int_equal(__atomic_load_n(&p.runs, __ATOMIC_ACQUIRE), 1);
  assert_true(__atomic_load_n(&p.saw_right, __ATOMIC_ACQUIRE)); /* it ran after the D2H copy */
  OK(O->launch_host_fn(BE, s, refuse, NULL));
  sl_status st = O->stream_sync(BE, s);
  assert_int_not_equal(st, SL_OK);
  if (!strstr(conf_msg(), "the host function failed on purpose"))
    fail_msg("a failed host function's message is not what the sync reports: '%s'", conf_msg());
  O->event_destroy(BE, ev);
  O->stream_destroy(BE, s);
  O->free_device(BE, d);
  host_free(out, pinned);
  free(in);
  /* the failure was sticky: a new instance for the cases after this one */
  teardown(NULL);
  assert_int_equal(setup(NULL), 0);
}

/* A backend of a native API (module.h) hands out its streams' native handles: one for the
 * default stream, distinct ones for distinct streams, the same one for the same stream. */
static void test_native_handles(void **state) {
  const char *api = SL_HAS_OP(O, native_api) ? O->native_api : NULL;
  printf("# native API: %s\n", api ? api : "none (host memory; pairs by its name)");
  if (!api) skip();
  assert_true(SL_HAS_OP(O, get_proc));
  sl_ext_native_stream_fn native = (sl_ext_native_stream_fn)O->get_proc(SL_EXT_NATIVE_STREAM);
  if (!native) fail_msg("%s: native API %s but no " SL_EXT_NATIVE_STREAM, M.spec, api);
  void *a = stream(), *b = stream();
  void *na = native(BE, a), *nb = native(BE, b);
  assert_true(na != nb);
  assert_ptr_equal(native(BE, a), na);
  (void)native(BE, NULL); /* the default stream's: any value, the call must not fail */
  O->stream_destroy(BE, a);
  O->stream_destroy(BE, b);
}

/* ---- memory lent to a consumer's stream (DLPack) ------------------------------------------------ */
/* The stream the consumer queues on, as the consumer knows it: the module's native stream
 * behind one of its own (SL_EXT_NATIVE_STREAM where the module offers it; its streams are its
 * native ones otherwise, as for cuda and sim). */
static void *native_of(void *s) {
  if (SL_HAS_OP(O, get_proc)) {
    sl_ext_native_stream_fn native = (sl_ext_native_stream_fn)O->get_proc(SL_EXT_NATIVE_STREAM);
    if (native) return native(BE, s);
  }
  return s;
}

/* The consumer's stream is held, then reads the lent buffer; the buffer is released behind an
 * event recorded natively on that stream, and a new allocation of the same size is written at
 * once. The consumer must read the lent bytes: a free that did not wait would hand the memory
 * to the new allocation (wrong bytes) or unmap it (a crash). Then two buffers behind two
 * consumers' events at once. */
static void test_lent_memory(void **state) {
  if (!SL_HAS_OP(O, free_device_after) || !SL_HAS_OP(O, event_record_native)) skip();
  conf_blocker *k = blocker();
  enum { LENT = 8 << 20 };
  unsigned char *pattern = malloc(LENT), *ones = malloc(LENT), *lent = dev(LENT), *fresh;
  assert_non_null(pattern);
  assert_non_null(ones);
  conf_fill(pattern, LENT, 51, 0);
  memset(ones, 0xFF, LENT);
  bool pinned;
  unsigned char *got = host(LENT, &pinned);
  memset(got, 0, LENT);
  up(lent, pattern, LENT, NULL);
  OK(O->stream_sync(BE, NULL));
  void *consumer = stream(), *held_ev = event(), *done = event(), *ev = event();
  OK(conf_block(k, consumer, held_ev));
  down(got, lent, LENT, consumer);
  OK(O->event_record(BE, done, consumer));
  OK(O->event_record_native(BE, ev, native_of(consumer)));
  OK(O->free_device_after(BE, (void *const *)&lent, 1, (void *const *)&ev, 1)); /* takes ev */
  bool pending = held(held_ev, "the consumer of lent memory");
  fresh = dev(LENT);
  up(fresh, ones, LENT, NULL);
  OK(O->stream_sync(BE, NULL));
  OK(O->event_sync(BE, done));
  if (memcmp(got, pattern, LENT) != 0) fail_msg("the consumer read other bytes than the lent buffer's");
  printf("# lent memory: %s\n", pending ? "freed behind the consumer's pending read" : "the read had run already");
  /* two buffers behind the events of two consumers */
  void *c2 = stream(), *e1 = event(), *e2 = event(), *bufs[2] = {dev(4096), dev(4096)}, *evs[2] = {e1, e2};
  OK(conf_block(k, c2, held_ev));
  OK(O->event_record_native(BE, e1, native_of(consumer)));
  OK(O->event_record_native(BE, e2, native_of(c2)));
  OK(O->free_device_after(BE, bufs, 2, evs, 2));
  OK(O->synchronize(BE));
  O->event_destroy(BE, done);
  O->event_destroy(BE, held_ev);
  O->stream_destroy(BE, c2);
  O->stream_destroy(BE, consumer);
  O->free_device(BE, fresh);
  host_free(got, pinned);
  free(ones);
  free(pattern);
}

/* ---- device identity ----------------------------------------------------------------------------- */
static void test_device_identity(void **state) {
  if (!SL_HAS_OP(O, device_identity) || (O->flags & SL_BACKEND_DEVICE_IS_HOST)) skip();
  char id[64], again[64], other[64], tiny[4];
  memset(id, 'x', sizeof id);
  O->device_identity(BE, id, sizeof id);
  assert_non_null(memchr(id, 0, sizeof id));
  for (const char *c = id; *c; c++) assert_true(*c >= 0x20 && *c < 0x7f);
  printf("# device identity: \"%s\"\n", id);
  O->device_identity(BE, again, sizeof again);
  assert_string_equal(id, again);
  void *b2 = NULL; /* another instance on the same device names it alike */
  OK(conf_backend_init(&M, 0, 1, 60000, &b2));
  O->device_identity(b2, other, sizeof other);
  assert_string_equal(id, other);
  O->fini(b2);
  memset(tiny, 'x', sizeof tiny);
  O->device_identity(BE, tiny, sizeof tiny);
  assert_non_null(memchr(tiny, 0, sizeof tiny));
}

/* A device the environment promises: level_zero where ZE_ENABLE_ALT_DRIVERS names a driver (the
 * CTest runs over the test driver). There a module that finds none fails; it never "skips". */
static bool device_promised(const char *spec) {
  const char *alt = getenv("ZE_ENABLE_ALT_DRIVERS");
  if (!strstr(spec, "level_zero") || !alt || !*alt) return false;
  fprintf(stderr, "ZE_ENABLE_ALT_DRIVERS=%s names a driver: a level_zero that cannot run is a failure, not a skip\n",
          alt);
  return true;
}

int main(int argc, char **argv) {
  const char *spec = NULL;
  bool v1 = false;
  conf_suite_thread();
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--async") == 0) expect_async = true;
    else if (strcmp(argv[i], "--v1") == 0) v1 = true;
    else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc) cmocka_set_test_filter(argv[++i]);
    else if (argv[i][0] != '-' && !spec) spec = argv[i];
    else spec = NULL, i = argc;
  }
  if (!spec) {
    fprintf(stderr, "usage: %s [--async] [--v1] [--filter GLOB] NAME[:VARIANT] | DIR/libshardload-NAME.so[:VARIANT]\n",
            argv[0]);
    return 2;
  }
  char why[1024];
  sl_status st = conf_module_open(spec, false, v1, &M, why, sizeof why);
  if (st == SL_ERR_NO_DEVICE) {
    if (device_promised(spec)) return fprintf(stderr, "%s: %s\n", spec, why), 1;
    printf("SKIPPED: %s cannot run here: %s\n", spec, why);
    return 77;
  }
  if (st != SL_OK) {
    fprintf(stderr, "%s: %s: %s\n", spec, sl_status_name(st), why);
    return 1;
  }
  O = M.ops;
  /* an init that finds no device is a machine without one, not a failure */
  void *probe = NULL;
  st = conf_backend_init(&M, 0, 1, 60000, &probe);
  if (st == SL_ERR_NO_DEVICE) {
    if (device_promised(spec)) return fprintf(stderr, "%s: init: %s\n", spec, conf_msg()), 1;
    printf("SKIPPED: %s: init: %s\n", spec, conf_msg());
    return 77;
  }
  if (st != SL_OK) {
    fprintf(stderr, "%s: init: %s: %s\n", spec, sl_status_name(st), conf_msg());
    return 1;
  }
  O->fini(probe);
  printf("# backend %s%s\n", M.spec, M.v1 ? " (its ABI v1 table, adapted)" : "");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_table, setup, teardown),
      cmocka_unit_test_setup_teardown(test_copies_round_trip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_event_never_recorded, setup, teardown),
      cmocka_unit_test_setup_teardown(test_event_query_and_sync, setup, teardown),
      cmocka_unit_test_setup_teardown(test_missing_wait_reads_stale, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cross_stream_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stream_sync_and_synchronize, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stream_destroy_drains, setup, teardown),
      cmocka_unit_test_setup_teardown(test_event_rerecorded, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pipeline_with_events, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sticky_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_casts_bit_exact, setup, teardown),
      cmocka_unit_test_setup_teardown(test_copy_2d, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pinned_memory, setup, teardown),
      cmocka_unit_test_setup_teardown(test_registered_memory, setup, teardown),
      cmocka_unit_test_setup_teardown(test_is_device_ptr, setup, teardown),
      cmocka_unit_test_setup_teardown(test_extensions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_host_functions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_native_handles, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lent_memory, setup, teardown),
      cmocka_unit_test_setup_teardown(test_device_identity, setup, teardown),
  };
  int rc = cmocka_run_group_tests_name(M.spec, tests, NULL, NULL);
  conf_module_close(&M);
  return rc;
}
