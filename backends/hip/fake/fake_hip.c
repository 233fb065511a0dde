/* A fake libamdhip64 for test_hip_launch: the compiler's launch ABI and the few runtime calls
 * the kernels' launchers make, recorded, so that a machine without an AMD GPU can run the
 * launch path of libshardload-hip.so's code (hip_launch.c's registrations held since load
 * and handed over when the runtime opens, <<<>>> launches forwarded) with the real code that
 * clang emitted for cuda_kernels.cu. Every other function fails (fake_hip_stubs.c). The test
 * reads what happened through fakehip_*. No HIP header: dim3 is three uint32_t, by value. */
#include <stdint.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef struct fake_dim3 {
  uint32_t x, y, z;
} fake_dim3;

#define MAX 64
static const void *g_wrapper;
static int g_nfuncs;
static struct {
  const void *host;
  const char *name;
} g_funcs[MAX];
static fake_dim3 g_grid, g_block;
static size_t g_shared;
static void *g_stream;
static int g_pushed, g_launches;
static const void *g_launched;
static void **g_args;
static uint64_t g_count; /* the launched kernel's third argument (n) */

API void **__hipRegisterFatBinary(const void *wrapper) {
  g_wrapper = wrapper;
  return (void **)&g_wrapper;
}
API void __hipRegisterFunction(void **handle, const void *host, char *device_fn, const char *name,
                               unsigned int limit, void *tid, void *bid, void *block, void *grid, int *wsize) {
  if (handle == (void **)&g_wrapper && g_nfuncs < MAX) g_funcs[g_nfuncs].host = host, g_funcs[g_nfuncs++].name = name;
}
API void __hipUnregisterFatBinary(void **handle) {}
API int __hipPushCallConfiguration(fake_dim3 grid, fake_dim3 block, size_t shared, void *stream) {
  g_grid = grid, g_block = block, g_shared = shared, g_stream = stream, g_pushed++;
  return 0;
}
API int __hipPopCallConfiguration(fake_dim3 *grid, fake_dim3 *block, size_t *shared, void **stream) {
  *grid = g_grid, *block = g_block, *shared = g_shared, *stream = g_stream;
  return 0;
}
API int hipLaunchKernel(const void *fn, fake_dim3 grid, fake_dim3 block, void **args, size_t shared, void *stream) {
  if (grid.x != g_grid.x || block.x != g_block.x || stream != g_stream) return 1; /* not what was pushed */
  g_launched = fn, g_args = args, g_launches++;
  memcpy(&g_count, args[2], sizeof g_count);
  return 0;
}
API int hipGetLastError(void) { return 0; }
API const char *hipGetErrorName(int e) { return e ? "hipErrorFake" : "hipSuccess"; }
API const char *hipGetErrorString(int e) { return e ? "fake runtime" : "no error"; }

/* ---- the test's handles ---------------------------------------------------------------- */
API int fakehip_registered(void) { return g_nfuncs; }
/* The name the launched kernel was registered under ("" when it was not), and its launch. */
API const char *fakehip_last_launch(uint32_t *grid, uint32_t *block, void **stream, uint64_t *n, int *launches) {
  *grid = g_grid.x, *block = g_block.x, *stream = g_stream, *n = g_count, *launches = g_launches;
  for (int i = 0; i < g_nfuncs; i++)
    if (g_funcs[i].host == g_launched) return g_funcs[i].name;
  return "";
}
