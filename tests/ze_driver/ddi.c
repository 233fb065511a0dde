/* The DDI table getters the Level Zero loader calls (ze_loader.cpp, ze_ldrddi.cpp of loader
 * 1.8.12): it dlopens each library named in ZE_ENABLE_ALT_DRIVERS, calls zeGetGlobalProcAddrTable
 * and the table's pfnInit, and at zeInit asks for EVERY table of ze_ddi.h, zet_ddi.h and zes_ddi.h
 * -- one getter missing or failing makes zeInit fail with ZE_RESULT_ERROR_UNINITIALIZED. So every
 * getter is exported; a table this driver does not implement is left as the loader zeroed it, and
 * the loader (or the validation layer) answers ZE_RESULT_ERROR_UNSUPPORTED_FEATURE for its
 * functions. These getters are the library's only exported symbols. */
#include "zedrv.h"

#include <level_zero/zes_ddi.h>
#include <level_zero/zet_ddi.h>

static ze_result_t zedrv_fill_global(ze_global_dditable_t *t) {
  t->pfnInit = zedrv_init;
  return ZE_RESULT_SUCCESS;
}

/* The driver implements API 1.4 (the loader's ZE_API_VERSION_CURRENT); any 1.x request gets the
 * tables, whose 1.0 members come first in every struct. */
static ze_result_t check(ze_api_version_t version, const void *table) {
  if (!table) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (ZE_MAJOR_VERSION(version) != 1) return ZE_RESULT_ERROR_UNSUPPORTED_VERSION;
  return ZE_RESULT_SUCCESS;
}

/* ---- ze ---- */

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetGlobalProcAddrTable(ze_api_version_t version,
                                                             ze_global_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r != ZE_RESULT_SUCCESS ? r : zedrv_fill_global(pDdiTable);
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetDriverProcAddrTable(ze_api_version_t version,
                                                             ze_driver_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r != ZE_RESULT_SUCCESS ? r : zedrv_fill_driver(pDdiTable);
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetDeviceProcAddrTable(ze_api_version_t version,
                                                             ze_device_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r != ZE_RESULT_SUCCESS ? r : zedrv_fill_device(pDdiTable);
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetDeviceExpProcAddrTable(ze_api_version_t version,
                                                                ze_device_exp_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetContextProcAddrTable(ze_api_version_t version,
                                                              ze_context_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r != ZE_RESULT_SUCCESS ? r : zedrv_fill_context(pDdiTable);
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetCommandQueueProcAddrTable(ze_api_version_t version,
                                                                   ze_command_queue_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r != ZE_RESULT_SUCCESS ? r : zedrv_fill_command_queue(pDdiTable);
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetCommandListProcAddrTable(ze_api_version_t version,
                                                                  ze_command_list_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r != ZE_RESULT_SUCCESS ? r : zedrv_fill_command_list(pDdiTable);
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetImageProcAddrTable(ze_api_version_t version, ze_image_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetImageExpProcAddrTable(ze_api_version_t version,
                                                               ze_image_exp_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetFenceProcAddrTable(ze_api_version_t version, ze_fence_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r != ZE_RESULT_SUCCESS ? r : zedrv_fill_fence(pDdiTable);
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetEventPoolProcAddrTable(ze_api_version_t version,
                                                                ze_event_pool_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r != ZE_RESULT_SUCCESS ? r : zedrv_fill_event_pool(pDdiTable);
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetEventProcAddrTable(ze_api_version_t version, ze_event_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r != ZE_RESULT_SUCCESS ? r : zedrv_fill_event(pDdiTable);
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetEventExpProcAddrTable(ze_api_version_t version,
                                                               ze_event_exp_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetModuleProcAddrTable(ze_api_version_t version,
                                                             ze_module_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r != ZE_RESULT_SUCCESS ? r : zedrv_fill_module(pDdiTable);
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetModuleBuildLogProcAddrTable(ze_api_version_t version,
                                                                     ze_module_build_log_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r != ZE_RESULT_SUCCESS ? r : zedrv_fill_module_build_log(pDdiTable);
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetKernelProcAddrTable(ze_api_version_t version,
                                                             ze_kernel_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r != ZE_RESULT_SUCCESS ? r : zedrv_fill_kernel(pDdiTable);
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetKernelExpProcAddrTable(ze_api_version_t version,
                                                                ze_kernel_exp_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetSamplerProcAddrTable(ze_api_version_t version,
                                                              ze_sampler_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetPhysicalMemProcAddrTable(ze_api_version_t version,
                                                                  ze_physical_mem_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetMemProcAddrTable(ze_api_version_t version, ze_mem_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r != ZE_RESULT_SUCCESS ? r : zedrv_fill_mem(pDdiTable);
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetVirtualMemProcAddrTable(ze_api_version_t version,
                                                                 ze_virtual_mem_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetFabricVertexExpProcAddrTable(ze_api_version_t version,
                                                                      ze_fabric_vertex_exp_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetFabricEdgeExpProcAddrTable(ze_api_version_t version,
                                                                    ze_fabric_edge_exp_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

/* ---- zet ---- */

ZE_DLLEXPORT ze_result_t ZE_APICALL zetGetDeviceProcAddrTable(ze_api_version_t version,
                                                              zet_device_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zetGetContextProcAddrTable(ze_api_version_t version,
                                                               zet_context_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zetGetCommandListProcAddrTable(ze_api_version_t version,
                                                                   zet_command_list_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zetGetModuleProcAddrTable(ze_api_version_t version,
                                                              zet_module_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zetGetKernelProcAddrTable(ze_api_version_t version,
                                                              zet_kernel_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zetGetMetricGroupProcAddrTable(ze_api_version_t version,
                                                                   zet_metric_group_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zetGetMetricGroupExpProcAddrTable(ze_api_version_t version,
                                                                      zet_metric_group_exp_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zetGetMetricProcAddrTable(ze_api_version_t version,
                                                              zet_metric_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zetGetMetricStreamerProcAddrTable(ze_api_version_t version,
                                                                      zet_metric_streamer_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zetGetMetricQueryPoolProcAddrTable(ze_api_version_t version,
                                                                       zet_metric_query_pool_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zetGetMetricQueryProcAddrTable(ze_api_version_t version,
                                                                   zet_metric_query_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zetGetTracerExpProcAddrTable(ze_api_version_t version,
                                                                 zet_tracer_exp_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zetGetDebugProcAddrTable(ze_api_version_t version,
                                                             zet_debug_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

/* ---- zes ---- */

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetDriverProcAddrTable(ze_api_version_t version,
                                                              zes_driver_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetDeviceProcAddrTable(ze_api_version_t version,
                                                              zes_device_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetSchedulerProcAddrTable(ze_api_version_t version,
                                                                 zes_scheduler_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetPerformanceFactorProcAddrTable(ze_api_version_t version,
                                                                         zes_performance_factor_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetPowerProcAddrTable(ze_api_version_t version,
                                                             zes_power_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetFrequencyProcAddrTable(ze_api_version_t version,
                                                                 zes_frequency_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetEngineProcAddrTable(ze_api_version_t version,
                                                              zes_engine_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetStandbyProcAddrTable(ze_api_version_t version,
                                                               zes_standby_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetFirmwareProcAddrTable(ze_api_version_t version,
                                                                zes_firmware_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetMemoryProcAddrTable(ze_api_version_t version,
                                                              zes_memory_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetFabricPortProcAddrTable(ze_api_version_t version,
                                                                  zes_fabric_port_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetTemperatureProcAddrTable(ze_api_version_t version,
                                                                   zes_temperature_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetPsuProcAddrTable(ze_api_version_t version, zes_psu_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetFanProcAddrTable(ze_api_version_t version, zes_fan_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetLedProcAddrTable(ze_api_version_t version, zes_led_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetRasProcAddrTable(ze_api_version_t version, zes_ras_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetDiagnosticsProcAddrTable(ze_api_version_t version,
                                                                   zes_diagnostics_dditable_t *pDdiTable) {
  ze_result_t r = check(version, pDdiTable);
  return r;
}
