/* The placement contract (docs/DESIGN.md#placement): resolved once per load, identically on every rank, and
 * applied to every tensor on every path. Kept a pure function so it can be tested row by row
 * and so no path (main/non-main rank, sharded/replicated) can drift from it. */
#include "internal.h"

SL_API sl_status sl_resolve_placement(sl_cpu_offload cpu_offload, const sl_offload_policy *policy,
                                      sl_placement_decision *out) {
  if (!out) return SL_ERR_INVALID;
  int policy_cpu = policy && policy->kind == SL_OFFLOAD_CPU;
  if (policy && policy->kind != SL_OFFLOAD_NONE && policy->kind != SL_OFFLOAD_CPU) return SL_ERR_INVALID;
  switch (cpu_offload) {
    case SL_CPU_OFFLOAD_ON:
      out->device = SL_DEVICE_CPU;
      out->rule = SL_RULE_EXPLICIT_ON;
      break;
    case SL_CPU_OFFLOAD_OFF:
      out->device = SL_DEVICE_ACCELERATOR;
      out->rule = SL_RULE_EXPLICIT_OFF;
      break;
    case SL_CPU_OFFLOAD_INFER:
      out->device = policy_cpu ? SL_DEVICE_CPU : SL_DEVICE_ACCELERATOR;
      out->rule = policy_cpu ? SL_RULE_INFER_POLICY_CPU : SL_RULE_INFER_NO_POLICY;
      break;
    default:
      return SL_ERR_INVALID;
  }
  /* Pinned host memory is what FSDP2's CPUOffloadPolicy(pin_memory=True) keeps its parameters
   * in; an explicit ON without such a policy has no reason to pin. */
  out->pin_memory = out->device == SL_DEVICE_CPU && policy_cpu && policy->pin_memory;
  return SL_OK;
}

SL_API const char *sl_placement_rule_describe(sl_placement_rule rule) {
  switch (rule) {
    case SL_RULE_EXPLICIT_ON:
      return "cpu_offload=on";
    case SL_RULE_EXPLICIT_OFF:
      return "cpu_offload=off";
    case SL_RULE_INFER_POLICY_CPU:
      return "inferred: CPU offload policy";
    case SL_RULE_INFER_NO_POLICY:
      return "inferred: no offload policy";
  }
  return "unknown";
}

SL_API const char *sl_device_kind_name(sl_device_kind kind) {
  switch (kind) {
    case SL_DEVICE_CPU:
      return "cpu";
    case SL_DEVICE_ACCELERATOR:
      return "device";
  }
  return "unknown";
}
