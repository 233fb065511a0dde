/* The placement contract (docs/DESIGN.md#placement), one test per row, plus the option-struct compatibility
 * rules (NULL and older, smaller structs mean INFER). */
#include "testutil.h"

#include "internal.h"

static const sl_offload_policy none = {SL_OFFLOAD_NONE, 0};
static const sl_offload_policy cpu = {SL_OFFLOAD_CPU, 0};
static const sl_offload_policy cpu_pinned = {SL_OFFLOAD_CPU, 1};

static void check(sl_cpu_offload o, const sl_offload_policy *p, sl_device_kind dev, sl_placement_rule rule, int pin) {
  sl_placement_decision d;
  assert_int_equal(sl_resolve_placement(o, p, &d), SL_OK);
  assert_int_equal(d.device, dev);
  assert_int_equal(d.rule, rule);
  assert_int_equal(d.pin_memory, pin);
}

static void test_on_any_policy_is_cpu(void **state) {
  check(SL_CPU_OFFLOAD_ON, &none, SL_DEVICE_CPU, SL_RULE_EXPLICIT_ON, 0);
  check(SL_CPU_OFFLOAD_ON, NULL, SL_DEVICE_CPU, SL_RULE_EXPLICIT_ON, 0);
  check(SL_CPU_OFFLOAD_ON, &cpu, SL_DEVICE_CPU, SL_RULE_EXPLICIT_ON, 0);
  check(SL_CPU_OFFLOAD_ON, &cpu_pinned, SL_DEVICE_CPU, SL_RULE_EXPLICIT_ON, 1);
}

static void test_off_any_policy_is_accelerator(void **state) {
  check(SL_CPU_OFFLOAD_OFF, &none, SL_DEVICE_ACCELERATOR, SL_RULE_EXPLICIT_OFF, 0);
  check(SL_CPU_OFFLOAD_OFF, NULL, SL_DEVICE_ACCELERATOR, SL_RULE_EXPLICIT_OFF, 0);
  /* the Accelerate 1.14 bug: an explicit false under an active CPUOffloadPolicy */
  check(SL_CPU_OFFLOAD_OFF, &cpu, SL_DEVICE_ACCELERATOR, SL_RULE_EXPLICIT_OFF, 0);
  check(SL_CPU_OFFLOAD_OFF, &cpu_pinned, SL_DEVICE_ACCELERATOR, SL_RULE_EXPLICIT_OFF, 0);
}

static void test_infer_with_cpu_policy_is_cpu(void **state) {
  check(SL_CPU_OFFLOAD_INFER, &cpu, SL_DEVICE_CPU, SL_RULE_INFER_POLICY_CPU, 0);
  check(SL_CPU_OFFLOAD_INFER, &cpu_pinned, SL_DEVICE_CPU, SL_RULE_INFER_POLICY_CPU, 1);
}

static void test_infer_without_policy_is_accelerator(void **state) {
  check(SL_CPU_OFFLOAD_INFER, &none, SL_DEVICE_ACCELERATOR, SL_RULE_INFER_NO_POLICY, 0);
  check(SL_CPU_OFFLOAD_INFER, NULL, SL_DEVICE_ACCELERATOR, SL_RULE_INFER_NO_POLICY, 0);
}

static void test_zero_value_is_infer(void **state) {
  sl_load_options o = {0};
  assert_int_equal(o.cpu_offload, SL_CPU_OFFLOAD_INFER);
  assert_int_equal(SL_CPU_OFFLOAD_INFER, 0);
}

static void test_bad_values_rejected(void **state) {
  sl_placement_decision d;
  assert_int_equal(sl_resolve_placement((sl_cpu_offload)7, NULL, &d), SL_ERR_INVALID);
  sl_offload_policy bad = {(sl_offload_kind)9, 0};
  assert_int_equal(sl_resolve_placement(SL_CPU_OFFLOAD_INFER, &bad, &d), SL_ERR_INVALID);
  assert_int_equal(sl_resolve_placement(SL_CPU_OFFLOAD_ON, NULL, NULL), SL_ERR_INVALID);
}

static void test_sized_copy_of_older_struct(void **state) {
  /* A caller compiled when sl_load_options ended after cpu_offload: the rest must read as zero
   * even when the memory past its struct holds garbage. */
  struct {
    size_t size;
    sl_cpu_offload cpu_offload;
    char garbage[sizeof(sl_load_options)];
  } old;
  memset(&old, 0xAB, sizeof old);
  old.size = offsetof(sl_load_options, cpu_offload) + sizeof(sl_cpu_offload);
  old.cpu_offload = SL_CPU_OFFLOAD_ON;
  sl_load_options o;
  sl__copy_sized(&o, sizeof o, &old, old.size);
  assert_int_equal(o.size, sizeof o);
  assert_int_equal(o.cpu_offload, SL_CPU_OFFLOAD_ON);
  assert_int_equal(o.strategy, 0);
  assert_int_equal(o.staging_bytes, 0);
  assert_null(o.bind);
  /* older still: only the size field, so cpu_offload is INFER */
  old.size = sizeof(size_t);
  sl__copy_sized(&o, sizeof o, &old, old.size);
  assert_int_equal(o.cpu_offload, SL_CPU_OFFLOAD_INFER);
  sl__copy_sized(&o, sizeof o, NULL, 0);
  assert_int_equal(o.cpu_offload, SL_CPU_OFFLOAD_INFER);
}

static void test_names(void **state) {
  assert_string_equal(sl_device_kind_name(SL_DEVICE_CPU), "cpu");
  assert_string_equal(sl_device_kind_name(SL_DEVICE_ACCELERATOR), "device");
  assert_string_equal(sl_placement_rule_describe(SL_RULE_EXPLICIT_ON), "cpu_offload=on");
  assert_string_equal(sl_placement_rule_describe(SL_RULE_INFER_NO_POLICY), "inferred: no offload policy");
  assert_string_equal(sl_status_name(SL_ERR_FORMAT), "SL_ERR_FORMAT");
  assert_string_equal(sl_status_name((sl_status)999), "SL_ERR_UNKNOWN");
  assert_string_equal(sl_strerror(SL_OK), "success");
  assert_int_equal(sl_version(), SL_VERSION);
  assert_string_equal(sl_version_string(), SL_VERSION_STRING);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_on_any_policy_is_cpu),
      cmocka_unit_test(test_off_any_policy_is_accelerator),
      cmocka_unit_test(test_infer_with_cpu_policy_is_cpu),
      cmocka_unit_test(test_infer_without_policy_is_accelerator),
      cmocka_unit_test(test_zero_value_is_infer),
      cmocka_unit_test(test_bad_values_rejected),
      cmocka_unit_test(test_sized_copy_of_older_struct),
      cmocka_unit_test(test_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
