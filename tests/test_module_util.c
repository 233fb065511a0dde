/* shardload/module_util.h, the helpers every module uses (docs/MODULES.md): the checks of
 * init structs of another size than the module's, deadlines, and the bounded poll that every
 * wait of the CUDA module goes through (what a machine without a GPU can check of the waits
 * that must end behind a kernel that never ends, driven by a fake query). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <unistd.h>

#include "shardload/module_util.h"
#include "testutil.h"

/* ---- init structs --------------------------------------------------------------------------- */

/* A core built against an older module.h hands in a shorter struct: what lies past its size is
 * not the module's to read, whatever bytes are there. */
static void test_init_has_reads_only_what_both_know(void **state) {
  unsigned char raw[sizeof(sl_backend_init) + 16];
  memset(raw, 0xA5, sizeof raw);
  sl_backend_init *in = (sl_backend_init *)raw;
  in->size = (uint32_t)offsetof(sl_backend_init, ops); /* up to variant: an older core */
  in->variant = "strict";
  assert_true(SL_INIT_HAS(in, variant));
  assert_false(SL_INIT_HAS(in, ops));
  assert_false(SL_INIT_HAS(in, timeout_ms));
  assert_int_equal(SL_INIT_GET(in, timeout_ms, 1234), 1234); /* not the 0xA5 bytes */
  in->size = sizeof(sl_backend_init);
  in->timeout_ms = 77;
  assert_true(SL_INIT_HAS(in, timeout_ms));
  assert_int_equal(SL_INIT_GET(in, timeout_ms, 1234), 77);
  /* a member that ends one byte past the size is not held */
  sl_collective_init ci = {.size = (uint32_t)(offsetof(sl_collective_init, control) + sizeof ci.control - 1)};
  assert_false(SL_INIT_HAS(&ci, control));
  ci.size++;
  assert_true(SL_INIT_HAS(&ci, control));
}

/* ---- time ------------------------------------------------------------------------------------- */

static void test_timeout_default(void **state) {
  assert_int_equal(sl_timeout_ms(2500), 2500);
  assert_int_equal(sl_timeout_ms(0), SL_DEFAULT_TIMEOUT_MS);
  assert_int_equal(sl_timeout_ms(-1), SL_DEFAULT_TIMEOUT_MS);
  assert_int_equal(SL_DEFAULT_TIMEOUT_MS, 300000); /* shardload.h: sl_context_options.timeout_ms */
}

static void test_deadline_counts_down(void **state) {
  sl_deadline d = sl_deadline_in_ms(1500);
  long left = sl_deadline_left_ms(d);
  assert_true(left > 1000 && left <= 1500);
  assert_false(sl_deadline_passed(d));
  struct timespec t0 = sl_monotonic_now();
  sl_deadline soon = sl_deadline_in_ms(120);
  while (!sl_deadline_passed(soon)) usleep(2000);
  double waited = sl_ms_since(&t0);
  assert_true(waited >= 120 && waited < 2000);
  assert_int_equal(sl_deadline_left_ms(soon), 0);
  /* no time at all: due at once; whole seconds carry into tv_sec */
  assert_true(sl_deadline_passed(sl_deadline_in_ms(0)));
  assert_true(sl_deadline_passed(sl_deadline_in_ms(-5)));
  sl_deadline far = sl_deadline_in_ms(3999);
  assert_true(far.at.tv_nsec >= 0 && far.at.tv_nsec < 1000000000L);
  left = sl_deadline_left_ms(far);
  assert_true(left > 3000 && left <= 3999);
}

/* ---- the bounded poll, with a fake query ------------------------------------------------------ */
/* Item i answers "not yet" READY_AFTER[i] times, then "done" (never when < 0); FAIL_AT fails. */
typedef struct fake_query {
  int ready_after[3];
  int fail_at;
  int asked[3];
} fake_query;

static int ask(void *arg, size_t i) {
  fake_query *q = arg;
  q->asked[i]++;
  if ((int)i == q->fail_at) return -1;
  return q->ready_after[i] >= 0 && q->asked[i] > q->ready_after[i];
}

/* Every item completes: DONE, and an item that completed is not asked again. */
static void test_poll_until_every_item_completes(void **state) {
  fake_query q = {{0, 3, 200}, -1, {0}};
  size_t at = 99;
  assert_int_equal(sl_poll(ask, &q, 3, sl_deadline_in_ms(10000), &at), SL_POLL_DONE);
  assert_int_equal(q.asked[0], 1);
  assert_int_equal(q.asked[1], 4);
  assert_int_equal(q.asked[2], 201);
}

/* An item that never completes (a kernel that never ends): TIMEOUT at the deadline, not before
 * and not much after, naming the item. */
static void test_poll_gives_up_at_the_deadline(void **state) {
  fake_query q = {{0, -1, 0}, -1, {0}};
  size_t at = 99;
  double t0 = sl_monotonic_s();
  assert_int_equal(sl_poll(ask, &q, 3, sl_deadline_in_ms(500), &at), SL_POLL_TIMEOUT);
  double dt = sl_monotonic_s() - t0;
  print_message("gave up after %.3f s\n", dt);
  assert_true(dt >= 0.5 && dt < 0.8);
  assert_int_equal(at, 1);
  assert_int_equal(q.asked[2], 0); /* items after the pending one wait their turn */
}

static void test_poll_reports_the_failed_item(void **state) {
  fake_query q = {{0, 0, 0}, 2, {0}};
  size_t at = 99;
  assert_int_equal(sl_poll(ask, &q, 3, sl_deadline_in_ms(10000), &at), SL_POLL_FAILED);
  assert_int_equal(at, 2);
}

/* A deadline already past (the device is known stuck: an earlier wait gave up): one round of
 * queries and no wait, so teardown does not wait out the timeout once per stream and buffer. */
static void test_poll_past_its_deadline_asks_once(void **state) {
  fake_query q = {{0, -1, 0}, -1, {0}};
  size_t at = 99;
  double t0 = sl_monotonic_s();
  assert_int_equal(sl_poll(ask, &q, 3, sl_deadline_in_ms(0), &at), SL_POLL_TIMEOUT);
  assert_true(sl_monotonic_s() - t0 < 0.05);
  assert_int_equal(at, 1);
  assert_int_equal(q.asked[0], 1);
  assert_int_equal(q.asked[1], 1);
  fake_query idle = {{0, 0, 0}, -1, {0}};
  assert_int_equal(sl_poll(ask, &idle, 3, sl_deadline_in_ms(0), NULL), SL_POLL_DONE); /* a quiet device answers */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_init_has_reads_only_what_both_know),
      cmocka_unit_test(test_timeout_default),
      cmocka_unit_test(test_deadline_counts_down),
      cmocka_unit_test(test_poll_until_every_item_completes),
      cmocka_unit_test(test_poll_gives_up_at_the_deadline),
      cmocka_unit_test(test_poll_reports_the_failed_item),
      cmocka_unit_test(test_poll_past_its_deadline_asks_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
