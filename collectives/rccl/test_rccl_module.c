/* libshardload-rccl.so without an AMD GPU. argv[1]: the module; argv[2]: which librccl.so.1
 * the module's dlopen finds (CTest sets LD_LIBRARY_PATH):
 *   none  the machine's (Debian 12 has none): the table, the probe's reasons, init failing on
 *         every rank before RCCL starts, the registry finding the module;
 *   old   a fake RCCL 2.17.3 (fake_rccl.c): older than the module needs, a probe reason;
 *   new   a fake RCCL 2.18.3: accepted, and the HIP runtime's reason (no device) is the probe's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* sl__collective_probe: the registry's way in */
#include "shardload/module.h"
#include "testutil.h"

static const char *g_path, *g_kind;
static void *g_dl;
static const sl_collective_ops *g_ops;

typedef struct rank_host {
  sl_module_host host;
  char msg[1024];
} rank_host;

static sl_status host_fail(void *core, sl_status s, const char *fmt, ...) {
  rank_host *h = core;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->msg, sizeof h->msg, fmt, ap);
  va_end(ap);
  return s;
}
static void host_log(void *core, sl_log_level level, const char *fmt, ...) {}
static void host_init(rank_host *h) {
  memset(h, 0, sizeof *h);
  h->host = (sl_module_host){sizeof(sl_module_host), h, host_log, host_fail};
}

/* The hip backend as the collective sees it before touching a device: its native API, its
 * streams' native handles (SL_EXT_NATIVE_STREAM) and its ordinal. */
static int fake_ordinal(void *be) { return 0; }
static void *fake_native_stream(void *be, void *stream) { return stream; }
static void *fake_get_proc(const char *name) {
  return strcmp(name, SL_EXT_NATIVE_STREAM) == 0 ? (void *)(sl_ext_native_stream_fn)fake_native_stream : NULL;
}
static const sl_backend_ops fake_hip = {.abi_version = SL_BACKEND_ABI_VERSION, .size = sizeof(sl_backend_ops),
                                        .name = "hip", .device_ordinal = fake_ordinal, .get_proc = fake_get_proc,
                                        .native_api = "hip"};
static const sl_backend_ops fake_cuda = {.abi_version = SL_BACKEND_ABI_VERSION, .size = sizeof(sl_backend_ops),
                                         .name = "cuda", .device_ordinal = fake_ordinal, .get_proc = fake_get_proc,
                                         .native_api = "cuda"};
static int g_handle;

static void table_is_valid(void **state) {
  assert_int_equal(g_ops->abi_version, SL_COLLECTIVE_ABI_VERSION);
  assert_int_equal(g_ops->size, sizeof(sl_collective_ops));
  assert_string_equal(g_ops->name, "rccl");
  assert_int_equal(g_ops->flags, 0); /* stream-ordered */
  assert_int_equal(g_ops->domains, SL_MEM_DEVICE);
  assert_string_equal(g_ops->device_backend, "hip");
  assert_true(g_ops->probe && g_ops->init && g_ops->fini && g_ops->abort && g_ops->split);
  assert_true(g_ops->broadcast && g_ops->scatterv && g_ops->allgather && g_ops->barrier);
  assert_true(SL_HAS_OP(g_ops, scatterv_group) && g_ops->scatterv_group); /* the NCCL sources' */
  /* only the entry leaves the module: not the NCCL sources' internals, not the HIP table */
  assert_null(dlsym(g_dl, "sl__nccl_lib"));
  assert_null(dlsym(g_dl, "sl__hip_rt"));
  assert_null(dlsym(g_dl, "hipLaunchKernel"));
}

/* rccl moves HIP device memory only, whatever the machine has: it names the rank's backend. */
static void probe_names_the_backend(void **state) {
  char why[512] = "";
  assert_int_equal(g_ops->probe("cpu", why, sizeof why), 0);
  assert_string_equal(why, "rccl: moves ROCm device memory only; this rank's backend is cpu");
  assert_int_equal(g_ops->probe("cuda", why, sizeof why), 0);
  assert_string_equal(why, "rccl: moves ROCm device memory only; this rank's backend is cuda");
  assert_int_equal(g_ops->probe("hipx", why, sizeof why), 0); /* not a hip variant */
  assert_int_equal(g_ops->probe(NULL, why, sizeof why), 0);
}

/* On hip: the reason the library at hand gives. */
static void probe_says_what_is_missing(void **state) {
  char why[512] = "";
  int score = g_ops->probe("hip:strict", why, sizeof why);
  print_message("probe(hip) with %s librccl.so.1: %d: %s\n", g_kind, score, why);
  assert_int_equal(score, 0);
  if (strcmp(g_kind, "old") == 0) {
    assert_non_null(strstr(why, "rccl: librccl.so.1 is RCCL 2.17.3, older than the RCCL 2.18.3 (ROCm 6.0) this "
                                "module needs (ncclCommSplit, non-blocking init)"));
  } else if (strcmp(g_kind, "new") == 0) {
    /* RCCL accepted; the HIP runtime says no device, or that it is missing itself */
    assert_true(strstr(why, "rccl: no ROCm driver/device (hipErrorNoDevice") ||
                strstr(why, "rccl: no ROCm driver/device (hipErrorInsufficientDriver: libamdhip64.so not found"));
  } else {
    void *real = dlopen("librccl.so.1", RTLD_NOW | RTLD_LOCAL);
    if (real) {
      dlclose(real);
      print_message("this machine has a librccl.so.1: the not-found reason is not checked\n");
      skip();
    }
    assert_non_null(strstr(why, "rccl: librccl.so.1 not found (librccl.so.1: cannot open shared object file"));
    assert_non_null(strstr(why, "or use --collective gloo")); /* what to do */
  }
  char again[512] = "";
  assert_int_equal(g_ops->probe("hip", again, sizeof again), 0); /* the library is opened once */
  assert_string_equal(why, again);
}

static void registry_finds_the_module(void **state) {
  char why[512] = "";
  assert_int_equal(sl__collective_probe("rccl", sl__backend_cpu(), why, sizeof why), 0);
  assert_non_null(strstr(why, "rccl: moves ROCm device memory only; this rank's backend is cpu"));
}

static void init_refuses_other_backends(void **state) {
  rank_host h;
  host_init(&h);
  void *comm = (void *)1;
  sl_collective_init in = {.size = sizeof in, .host = &h.host, .rank = 0, .world_size = 1, .timeout_ms = 5000,
                           .backend = &fake_cuda, .backend_handle = &g_handle, .device = -1};
  assert_int_equal(g_ops->init(&in, &comm), SL_ERR_INVALID);
  assert_null(comm);
  assert_non_null(strstr(h.msg, "rccl init on rank 0: needs this rank's backend, of native API hip"));
  assert_non_null(strstr(h.msg, "it has cuda, native API cuda (use --backend hip, or --collective gloo)"));
}

/* ---- every rank of a job fails at once, before RCCL would start -------------------------------- */
#define W 3
typedef struct plane {
  pthread_barrier_t bar;
  unsigned char slot[W][1024];
} plane;
typedef struct rank_run {
  plane *p;
  int rank;
  sl_control_plane cp;
  rank_host h;
  sl_status st;
  void *comm;
} rank_run;

static sl_status p_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  rank_run *r = ctx;
  if (bytes > sizeof r->p->slot[0]) return SL_ERR_INVALID;
  memcpy(r->p->slot[r->rank], send, bytes);
  pthread_barrier_wait(&r->p->bar);
  for (int i = 0; i < W; i++) memcpy((char *)recv + (size_t)i * bytes, r->p->slot[i], bytes);
  pthread_barrier_wait(&r->p->bar);
  return SL_OK;
}
static sl_status p_broadcast(void *ctx, void *buf, size_t bytes, int root) {
  rank_run *r = ctx;
  if (bytes > sizeof r->p->slot[0]) return SL_ERR_INVALID;
  if (r->rank == root) memcpy(r->p->slot[root], buf, bytes);
  pthread_barrier_wait(&r->p->bar);
  if (r->rank != root) memcpy(buf, r->p->slot[root], bytes);
  pthread_barrier_wait(&r->p->bar);
  return SL_OK;
}
static void *run_rank(void *arg) {
  rank_run *r = arg;
  host_init(&r->h);
  r->comm = (void *)1;
  sl_collective_init in = {.size = sizeof in, .host = &r->h.host, .rank = r->rank, .world_size = W,
                           .timeout_ms = 5000, .backend = &fake_hip, .backend_handle = &g_handle,
                           .device = r->rank, .control = &r->cp};
  r->st = g_ops->init(&in, &r->comm);
  return NULL;
}

static void every_rank_fails_together(void **state) {
  char why[512] = "";
  g_ops->probe("hip", why, sizeof why);
  plane p;
  pthread_barrier_init(&p.bar, NULL, W);
  rank_run run[W];
  pthread_t t[W];
  for (int i = 0; i < W; i++) {
    memset(&run[i], 0, sizeof run[i]);
    run[i].p = &p;
    run[i].rank = i;
    run[i].cp = (sl_control_plane){sizeof(sl_control_plane), &run[i], p_broadcast, p_allgather};
    assert_int_equal(pthread_create(&t[i], NULL, run_rank, &run[i]), 0);
  }
  for (int i = 0; i < W; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&p.bar);
  for (int i = 0; i < W; i++) {
    print_message("rank %d: %s: %s\n", i, sl_status_name(run[i].st), run[i].h.msg);
    assert_null(run[i].comm);
    char want[64];
    snprintf(want, sizeof want, "rccl init on rank %d: rank 0 cannot run RCCL: ", i);
    assert_non_null(strstr(run[i].h.msg, want));
    assert_int_equal(run[i].st, i == 0 ? SL_ERR_NO_DEVICE : SL_ERR_PEER);
    if (strcmp(g_kind, "new") != 0) assert_non_null(strstr(run[i].h.msg, why)); /* the probe's reason */
  }
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s libshardload-rccl.so none|old|new\n", argv[0]);
    return 2;
  }
  g_path = argv[1];
  g_kind = argv[2];
  g_dl = dlopen(g_path, RTLD_NOW | RTLD_LOCAL);
  sl_collective_entry_fn entry = g_dl ? (sl_collective_entry_fn)dlsym(g_dl, SL_COLLECTIVE_ENTRY) : NULL;
  if (!entry || !(g_ops = entry())) {
    fprintf(stderr, "cannot load %s: %s\n", g_path, g_dl ? "no entry symbol" : dlerror());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(table_is_valid),
      cmocka_unit_test(probe_names_the_backend),
      cmocka_unit_test(probe_says_what_is_missing),
      cmocka_unit_test(registry_finds_the_module),
      cmocka_unit_test(init_refuses_other_backends),
      cmocka_unit_test(every_rank_fails_together),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
