/* libshardload-nccl.so without a GPU: it loads (no driver, NCCL opened at run time), its table
 * is a valid ABI v2 stream-ordered device collective, probe says why it cannot run, and init
 * fails cleanly on every rank (no hang: the ranks agree over the control plane before NCCL
 * starts). argv[1]: the module file. The registry finds it through SHARDLOAD_MODULE_PATH.
 * On a machine where the probe says yes, the no-device cases skip (the gpu test covers it). */
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "internal.h"
#include "shardload/module.h"

static const char *g_path;
static const sl_collective_ops *g_ops;

/* ---- a host per rank: the context's message buffer ---------------------------------------- */
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

static void host_init(rank_host *h) {
  memset(h, 0, sizeof *h);
  h->host = (sl_module_host){sizeof(sl_module_host), h, NULL, host_fail};
}

/* ---- an in-process control plane for N threads (real data exchange, pthread barriers) ------ */
#define MAX_RANKS 4
typedef struct mini_plane {
  pthread_barrier_t bar;
  int world;
  unsigned char slot[MAX_RANKS][1024];
} mini_plane;

typedef struct mini_rank {
  mini_plane *p;
  int rank;
  sl_control_plane cp;
} mini_rank;

static sl_status mini_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  mini_rank *r = ctx;
  if (bytes > sizeof r->p->slot[0]) return SL_ERR_INVALID;
  memcpy(r->p->slot[r->rank], send, bytes);
  pthread_barrier_wait(&r->p->bar);
  for (int i = 0; i < r->p->world; i++) memcpy((char *)recv + (size_t)i * bytes, r->p->slot[i], bytes);
  pthread_barrier_wait(&r->p->bar);
  return SL_OK;
}

static sl_status mini_broadcast(void *ctx, void *buf, size_t bytes, int root) {
  mini_rank *r = ctx;
  if (bytes > sizeof r->p->slot[0]) return SL_ERR_INVALID;
  if (r->rank == root) memcpy(r->p->slot[root], buf, bytes);
  pthread_barrier_wait(&r->p->bar);
  if (r->rank != root) memcpy(buf, r->p->slot[root], bytes);
  pthread_barrier_wait(&r->p->bar);
  return SL_OK;
}

/* The cuda backend as the collective sees it before it touches a device: its name and ordinal.
 * (The real module cannot init without a driver, so its handle cannot be had here.) */
static int fake_ordinal(void *be) { return 0; }
static const sl_backend_ops fake_cuda = {
    .abi_version = SL_BACKEND_ABI_VERSION, .size = sizeof(sl_backend_ops), .name = "cuda",
    .device_ordinal = fake_ordinal};
static const sl_backend_ops fake_cpu = {
    .abi_version = SL_BACKEND_ABI_VERSION, .size = sizeof(sl_backend_ops), .name = "cpu"};
static int g_dummy_handle;

static bool has_gpu(void) {
  char why[512];
  return g_ops->probe("cuda", why, sizeof why) > 0;
}

/* ---- tests ------------------------------------------------------------------------------ */

static void table_is_valid(void **state) {
  assert_int_equal(g_ops->abi_version, SL_COLLECTIVE_ABI_VERSION);
  assert_int_equal(g_ops->size, sizeof(sl_collective_ops));
  assert_string_equal(g_ops->name, "nccl");
  assert_int_equal(g_ops->flags, 0); /* stream-ordered, not SL_COLL_SYNC */
  assert_int_equal(g_ops->domains, SL_MEM_DEVICE);
  assert_string_equal(g_ops->device_backend, "cuda");
  assert_non_null(g_ops->probe);
  assert_non_null(g_ops->init);
  assert_non_null(g_ops->fini);
  assert_non_null(g_ops->abort);
  assert_non_null(g_ops->split);
  assert_non_null(g_ops->broadcast);
  assert_non_null(g_ops->scatterv);
  assert_non_null(g_ops->allgather);
  assert_non_null(g_ops->barrier);
}

/* Only the entry symbol is exported: internal names and the static CUDA runtime are not. */
static void exports_entry_only(void **state) {
  void *h = dlopen(g_path, RTLD_NOW | RTLD_LOCAL);
  assert_non_null(h);
  assert_non_null(dlsym(h, "sl_collective_module_v2"));
  assert_null(dlsym(h, "sl__nccl_lib"));
  assert_null(dlsym(h, "sl__nccl_init"));
  assert_null(dlsym(h, "cudaGetDeviceCount"));
  dlclose(h);
}

static void probe_names_the_backend(void **state) {
  char why[512] = "";
  assert_int_equal(g_ops->probe("cpu", why, sizeof why), 0);
  assert_string_equal(why, "nccl: moves CUDA device memory only; this rank's backend is cpu");
  assert_int_equal(g_ops->probe("sim:strict", why, sizeof why), 0);
  assert_string_equal(why, "nccl: moves CUDA device memory only; this rank's backend is sim:strict");
  assert_int_equal(g_ops->probe("cudax", why, sizeof why), 0); /* not a cuda variant */
  assert_int_equal(g_ops->probe(NULL, why, sizeof why), 0);
}

/* On cuda: the reason this machine has. Which one is expected depends on what is installed. */
static void probe_says_what_is_missing(void **state) {
  char why[512] = "";
  int score = g_ops->probe("cuda", why, sizeof why);
  void *nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (score > 0) {
    print_message("probe(cuda) = %d here (a GPU and NCCL): the no-device checks skip\n", score);
    if (nccl) dlclose(nccl);
    skip();
  }
  print_message("probe(cuda): %s\n", why);
  if (!nccl) {
    assert_non_null(strstr(why, "nccl: libnccl.so.2 not found ("));
  } else {
    dlclose(nccl);
    assert_non_null(strstr(why, "nccl: no CUDA driver/device ("));
  }
  /* a second probe says the same (the library is opened once) */
  char again[512] = "";
  assert_int_equal(g_ops->probe("cuda", again, sizeof again), 0);
  assert_string_equal(why, again);
}

/* The core's way in: the registry opens libshardload-nccl.so from SHARDLOAD_MODULE_PATH. */
static void registry_finds_the_module(void **state) {
  char why[512] = "";
  assert_int_equal(sl__collective_probe("nccl", "cpu", why, sizeof why), 0);
  print_message("registry probe(nccl, cpu): %s\n", why);
  assert_non_null(strstr(why, "moves CUDA device memory only; this rank's backend is cpu"));
}

static void init_refuses_other_backends(void **state) {
  rank_host h;
  host_init(&h);
  void *comm = (void *)1;
  sl_collective_init in = {.size = sizeof in, .host = &h.host, .rank = 0, .world_size = 1, .timeout_ms = 5000,
                           .backend = &fake_cpu, .backend_handle = &g_dummy_handle, .device = -1};
  assert_int_equal(g_ops->init(&in, &comm), SL_ERR_INVALID);
  assert_null(comm);
  assert_non_null(strstr(h.msg, "nccl init on rank 0: needs this rank's cuda backend"));
  assert_non_null(strstr(h.msg, "it has cpu"));
  /* an init struct from an ABI v1 core (no backend, no control plane) */
  in.size = offsetof(sl_collective_init, backend);
  assert_int_equal(g_ops->init(&in, &comm), SL_ERR_ABI);
  assert_non_null(strstr(h.msg, "module ABI 2"));
  /* two ranks need a control plane to bootstrap through */
  in.size = sizeof in;
  in.backend = &fake_cuda;
  in.world_size = 2;
  assert_int_equal(g_ops->init(&in, &comm), SL_ERR_INVALID);
  assert_non_null(strstr(h.msg, "no control plane"));
}

static void init_without_device_fails_cleanly(void **state) {
  if (has_gpu()) skip();
  rank_host h;
  host_init(&h);
  void *comm = (void *)1;
  sl_collective_init in = {.size = sizeof in, .host = &h.host, .rank = 0, .world_size = 1, .timeout_ms = 5000,
                           .backend = &fake_cuda, .backend_handle = &g_dummy_handle, .device = -1};
  sl_status st = g_ops->init(&in, &comm);
  print_message("init: %s: %s\n", sl_status_name(st), h.msg);
  assert_int_equal(st, SL_ERR_NO_DEVICE);
  assert_null(comm);
  assert_non_null(strstr(h.msg, "nccl init on rank 0: "));
  assert_true(strstr(h.msg, "cannot use cuda:0") || strstr(h.msg, "libnccl.so.2 not found"));
  g_ops->fini(NULL); /* fini of NULL is a no-op */
}

typedef struct rank_run {
  mini_rank mr;
  rank_host h;
  sl_status st;
  void *comm;
} rank_run;

static void *run_rank(void *arg) {
  rank_run *r = arg;
  host_init(&r->h);
  r->comm = (void *)1;
  sl_collective_init in = {.size = sizeof in, .host = &r->h.host, .rank = r->mr.rank, .world_size = r->mr.p->world,
                           .timeout_ms = 5000, .backend = &fake_cuda, .backend_handle = &g_dummy_handle,
                           .device = r->mr.rank, .control = &r->mr.cp};
  r->st = g_ops->init(&in, &r->comm);
  return NULL;
}

/* Every rank of a job without a device fails at once, and each names a rank that cannot run
 * NCCL (its own, or rank 0 for the others), instead of waiting in ncclCommInitRank. */
static void every_rank_fails_together(void **state) {
  if (has_gpu()) skip();
  enum { W = 3 };
  mini_plane p = {.world = W};
  pthread_barrier_init(&p.bar, NULL, W);
  rank_run run[W];
  pthread_t t[W];
  for (int i = 0; i < W; i++) {
    memset(&run[i], 0, sizeof run[i]);
    run[i].mr = (mini_rank){&p, i, {sizeof(sl_control_plane), &run[i].mr, mini_broadcast, mini_allgather}};
    assert_int_equal(pthread_create(&t[i], NULL, run_rank, &run[i]), 0);
  }
  for (int i = 0; i < W; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&p.bar);
  for (int i = 0; i < W; i++) {
    print_message("rank %d: %s: %s\n", i, sl_status_name(run[i].st), run[i].h.msg);
    assert_null(run[i].comm);
    char want[64];
    snprintf(want, sizeof want, "nccl init on rank %d: rank 0 cannot run NCCL: ", i);
    assert_non_null(strstr(run[i].h.msg, want));
    assert_int_equal(run[i].st, i == 0 ? SL_ERR_NO_DEVICE : SL_ERR_PEER);
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s libshardload-nccl.so\n", argv[0]);
    return 2;
  }
  g_path = argv[1];
  void *h = dlopen(g_path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "cannot load %s: %s\n", g_path, dlerror());
    return 1;
  }
  sl_collective_entry_fn entry = (sl_collective_entry_fn)dlsym(h, SL_COLLECTIVE_ENTRY);
  if (!entry || !(g_ops = entry())) {
    fprintf(stderr, "%s has no %s\n", g_path, SL_COLLECTIVE_ENTRY);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(table_is_valid),
      cmocka_unit_test(exports_entry_only),
      cmocka_unit_test(probe_names_the_backend),
      cmocka_unit_test(probe_says_what_is_missing),
      cmocka_unit_test(registry_finds_the_module),
      cmocka_unit_test(init_refuses_other_backends),
      cmocka_unit_test(init_without_device_fails_cleanly),
      cmocka_unit_test(every_rank_fails_together),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  dlclose(h);
  return failed;
}
