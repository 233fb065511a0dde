/* Launcher environment (torchrun, Slurm, Open MPI) and rendezvous URL parsing: precedence,
 * derived rendezvous addresses, and every validation error naming its variable. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "internal.h"
#include "testutil.h"

static const char *const all_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
    "SLURM_LOCALID", "SLURM_LAUNCH_NODE_IPADDR", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "SHARDLOAD_RENDEZVOUS", "TORCHELASTIC_USE_AGENT_STORE",
    "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SHARDLOAD_TOKEN",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID",
};


static sl_context ctx;

static int clear_env(void **state) {
  for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++) unsetenv(all_vars[i]);
  memset(&ctx, 0, sizeof ctx);
  return 0;
}

static void set(const char *name, const char *value) { assert_int_equal(setenv(name, value, 1), 0); }

/* Runs sl__launch_env expecting success. */
static sl__launch_info ok(void) {
  sl__launch_info li;
  sl_status st = sl__launch_env(&ctx, &li);
  if (st != SL_OK) fail_msg("unexpected %s: %s", sl_status_name(st), ctx.errmsg);
  return li;
}

/* Runs sl__launch_env expecting SL_ERR_INVALID with NEEDLE in the message. */
static void bad(const char *needle) {
  sl__launch_info li;
  ctx.errmsg[0] = 0;
  sl_status st = sl__launch_env(&ctx, &li);
  if (st != SL_ERR_INVALID) fail_msg("expected SL_ERR_INVALID for '%s', got %s", needle, sl_status_name(st));
  assert_null(li.rendezvous);
  if (!strstr(ctx.errmsg, needle)) fail_msg("message '%s' lacks '%s'", ctx.errmsg, needle);
}

static void test_default_single_rank(void **state) {
  sl__launch_info li = ok();
  assert_int_equal(li.rank, 0);
  assert_int_equal(li.world_size, 1);
  assert_int_equal(li.local_rank, 0);
  assert_null(li.rendezvous);
  assert_string_equal(li.source, "default");
}

static void test_torchrun(void **state) {
  set("RANK", "2");
  set("WORLD_SIZE", "4");
  set("LOCAL_RANK", "1");
  set("MASTER_ADDR", "10.0.0.1");
  set("MASTER_PORT", "29501");
  sl__launch_info li = ok();
  assert_string_equal(li.source, "torchrun");
  assert_int_equal(li.rank, 2);
  assert_int_equal(li.world_size, 4);
  assert_int_equal(li.local_rank, 1);
  assert_string_equal(li.rendezvous, "tcp://10.0.0.1:29501");
  free(li.rendezvous);
}

static void test_torchrun_defaults_and_ipv6(void **state) {
  set("RANK", "3");
  set("WORLD_SIZE", "8");
  set("MASTER_ADDR", "fe80::1");
  set("MASTER_PORT", "29500");
  sl__launch_info li = ok();
  assert_int_equal(li.local_rank, 3); /* no LOCAL_RANK: spread over the node's devices */
  assert_string_equal(li.rendezvous, "tcp://[fe80::1]:29500");
  free(li.rendezvous);
}

/* torchrun's agent serves its c10d store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True):
 * the ranks are its clients (c10d://), never a second server on the same port. */
static void test_torchrun_agent_store(void **state) {
  set("RANK", "1");
  set("WORLD_SIZE", "2");
  set("LOCAL_RANK", "1");
  set("MASTER_ADDR", "127.0.0.1");
  set("MASTER_PORT", "29400");
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  sl__launch_info li = ok();
  assert_string_equal(li.source, "torchrun");
  assert_string_equal(li.rendezvous, "c10d://127.0.0.1:29400");
  free(li.rendezvous);

  set("MASTER_ADDR", "::1");
  li = ok();
  assert_string_equal(li.rendezvous, "c10d://[::1]:29400");
  free(li.rendezvous);

  /* the agent store switched off (torch's elastic API with use_agent_store=False): rank 0 serves */
  set("TORCHELASTIC_USE_AGENT_STORE", "False");
  li = ok();
  assert_string_equal(li.rendezvous, "tcp://[::1]:29400");
  free(li.rendezvous);

  /* an explicit rendezvous still wins */
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  set("SHARDLOAD_RENDEZVOUS", "tcp://127.0.0.1:29600");
  li = ok();
  assert_string_equal(li.rendezvous, "tcp://127.0.0.1:29600");
  free(li.rendezvous);
  unsetenv("SHARDLOAD_RENDEZVOUS");

  set("TORCHELASTIC_USE_AGENT_STORE", "maybe");
  bad("TORCHELASTIC_USE_AGENT_STORE='maybe'");

  /* Slurm has no agent store: the variable is not torchrun's there */
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("LOCAL_RANK");
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "2");
  set("MASTER_ADDR", "head");
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  li = ok();
  assert_string_equal(li.rendezvous, "tcp://head:29400");
  free(li.rendezvous);
}

static void test_precedence(void **state) {
  set("RANK", "1");
  set("WORLD_SIZE", "2");
  set("SLURM_PROCID", "5");
  set("SLURM_NTASKS", "6");
  set("SLURM_LOCALID", "1");
  set("OMPI_COMM_WORLD_RANK", "7");
  set("OMPI_COMM_WORLD_SIZE", "9");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "2");
  set("MASTER_ADDR", "node0");
  set("MASTER_PORT", "1234");
  sl__launch_info li = ok();
  assert_string_equal(li.source, "torchrun");
  assert_int_equal(li.rank, 1);
  assert_int_equal(li.world_size, 2);
  free(li.rendezvous);

  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  li = ok();
  assert_string_equal(li.source, "slurm");
  assert_int_equal(li.rank, 5);
  assert_int_equal(li.world_size, 6);
  assert_int_equal(li.local_rank, 1);
  assert_string_equal(li.rendezvous, "tcp://node0:1234");
  free(li.rendezvous);

  unsetenv("SLURM_PROCID");
  li = ok();
  assert_string_equal(li.source, "openmpi");
  assert_int_equal(li.rank, 7);
  assert_int_equal(li.world_size, 9);
  assert_int_equal(li.local_rank, 2);
  assert_string_equal(li.rendezvous, "tcp://node0:1234");
  free(li.rendezvous);
}

static void test_slurm_rendezvous(void **state) {
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "2");
  set("SLURM_LOCALID", "0");
  set("SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3");
  sl__launch_info li = ok();
  assert_string_equal(li.rendezvous, "tcp://10.1.2.3:29500");
  free(li.rendezvous);

  set("MASTER_PORT", "4242");
  li = ok();
  assert_string_equal(li.rendezvous, "tcp://10.1.2.3:4242");
  free(li.rendezvous);

  set("MASTER_ADDR", "head");
  li = ok();
  assert_string_equal(li.rendezvous, "tcp://head:4242");
  free(li.rendezvous);

  unsetenv("MASTER_PORT");
  li = ok();
  assert_string_equal(li.rendezvous, "tcp://head:29500");
  free(li.rendezvous);

  unsetenv("MASTER_ADDR");
  unsetenv("SLURM_LAUNCH_NODE_IPADDR");
  bad("set MASTER_ADDR and MASTER_PORT");
}

static void test_rendezvous_override(void **state) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("MASTER_ADDR", "node0");
  set("MASTER_PORT", "1234");
  set("SHARDLOAD_RENDEZVOUS", "file:///shared/rdzv");
  sl__launch_info li = ok();
  assert_string_equal(li.rendezvous, "file:///shared/rdzv");
  free(li.rendezvous);

  /* the override makes a half-set MASTER_* pair irrelevant */
  unsetenv("MASTER_PORT");
  li = ok();
  assert_string_equal(li.rendezvous, "file:///shared/rdzv");
  free(li.rendezvous);

  set("SHARDLOAD_RENDEZVOUS", "nfs://x");
  bad("SHARDLOAD_RENDEZVOUS gives rendezvous 'nfs://x'");
  set("SHARDLOAD_RENDEZVOUS", "");
  bad("SHARDLOAD_RENDEZVOUS is set but empty");
}

static void test_single_rank_needs_no_rendezvous(void **state) {
  set("RANK", "0");
  set("WORLD_SIZE", "1");
  sl__launch_info li = ok();
  assert_int_equal(li.world_size, 1);
  assert_null(li.rendezvous);
}

static void test_integer_errors(void **state) {
  static const struct {
    const char *name, *value, *needle;
  } cases[] = {
      {"RANK", "x", "RANK='x' is not an integer"},
      {"RANK", "", "RANK='' is not an integer"},
      {"RANK", "1x", "RANK='1x' is not an integer"},
      {"RANK", " 1", "RANK=' 1' is not an integer"},
      {"RANK", "+1", "RANK='+1' is not an integer"},
      {"RANK", "99999999999999999999", "RANK='99999999999999999999' is out of range"},
      {"RANK", "-1", "RANK=-1 is out of range"},
      {"RANK", "3000000000", "RANK=3000000000 is out of range"},
      {"WORLD_SIZE", "0", "WORLD_SIZE=0 is out of range"},
      {"WORLD_SIZE", "four", "WORLD_SIZE='four' is not an integer"},
      {"LOCAL_RANK", "x", "LOCAL_RANK='x' is not an integer"},
      {"LOCAL_RANK", "-2", "LOCAL_RANK=-2 is out of range"},
      {"MASTER_PORT", "abc", "MASTER_PORT='abc' is not an integer"},
      {"MASTER_PORT", "0", "MASTER_PORT=0 is out of range (1..65535)"},
      {"MASTER_PORT", "70000", "MASTER_PORT=70000 is out of range"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    clear_env(NULL);
    set("RANK", "1");
    set("WORLD_SIZE", "2");
    set("LOCAL_RANK", "0");
    set("MASTER_ADDR", "h");
    set("MASTER_PORT", "1");
    set(cases[i].name, cases[i].value);
    bad(cases[i].needle);
  }
}

static void test_relation_errors(void **state) {
  set("RANK", "4");
  set("WORLD_SIZE", "4");
  bad("RANK=4 is not less than WORLD_SIZE=4");

  clear_env(NULL);
  set("RANK", "1");
  bad("RANK is set but WORLD_SIZE is not");

  clear_env(NULL);
  set("WORLD_SIZE", "2");
  bad("WORLD_SIZE is set but RANK is not");

  clear_env(NULL);
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("LOCAL_RANK", "2");
  bad("LOCAL_RANK=2 is not less than WORLD_SIZE=2");

  clear_env(NULL);
  set("SLURM_PROCID", "2");
  set("SLURM_NTASKS", "2");
  bad("SLURM_PROCID=2 is not less than SLURM_NTASKS=2");

  clear_env(NULL);
  set("SLURM_PROCID", "x");
  bad("SLURM_PROCID='x' is not an integer");

  clear_env(NULL);
  set("SLURM_PROCID", "0");
  bad("SLURM_PROCID is set but SLURM_NTASKS is not");

  clear_env(NULL);
  set("OMPI_COMM_WORLD_RANK", "0");
  set("OMPI_COMM_WORLD_SIZE", "abc");
  bad("OMPI_COMM_WORLD_SIZE='abc' is not an integer");

  clear_env(NULL);
  set("OMPI_COMM_WORLD_RANK", "0");
  set("OMPI_COMM_WORLD_SIZE", "2");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "q");
  bad("OMPI_COMM_WORLD_LOCAL_RANK='q' is not an integer");
}

static void test_rendezvous_errors(void **state) {
  set("OMPI_COMM_WORLD_RANK", "0");
  set("OMPI_COMM_WORLD_SIZE", "2");
  bad("set MASTER_ADDR and MASTER_PORT");
  bad("SHARDLOAD_RENDEZVOUS");

  set("MASTER_ADDR", "node0");
  bad("MASTER_ADDR is set but MASTER_PORT is not");
  unsetenv("MASTER_ADDR");
  set("MASTER_PORT", "29500");
  bad("MASTER_PORT is set but MASTER_ADDR is not");
  set("MASTER_ADDR", "");
  bad("MASTER_ADDR is set but empty");
  set("MASTER_ADDR", "a/b");
  bad("MASTER_ADDR/MASTER_PORT gives rendezvous 'tcp://a/b:29500'");
}

/* ---- sl__rendezvous_parse ---------------------------------------------------------------- */

static void parse_ok(const char *url, sl__rdzv_kind kind, const char *where, int port) {
  sl__rendezvous r;
  char err[512] = "";
  sl_status st = sl__rendezvous_parse(url, &r, err, sizeof err);
  if (st != SL_OK) fail_msg("'%s' rejected: %s", url, err);
  assert_int_equal(r.kind, kind);
  if (kind == SL__RDZV_FILE) {
    assert_string_equal(r.path, where);
  } else {
    assert_string_equal(r.host, where);
    assert_int_equal(r.port, port);
  }
}

static void parse_bad(const char *url, const char *needle) {
  sl__rendezvous r;
  char err[512] = "";
  sl_status st = sl__rendezvous_parse(url, &r, err, sizeof err);
  if (st != SL_ERR_INVALID) fail_msg("'%s' accepted", url ? url : "(null)");
  if (!strstr(err, needle)) fail_msg("message '%s' lacks '%s'", err, needle);
  assert_non_null(strstr(err, "file://DIR")); /* says what is accepted */
}

/* The ranks on this node (sl_backend_init.local_world_size): torchrun, then Slurm (only a plain
 * count: "2(x3)" names no single size), then Open MPI, else 1; a malformed value is refused by
 * name. */
static int local_world(void) {
  int n = -7;
  sl_status st = sl__launch_local_world_size(&ctx, &n);
  if (st != SL_OK) fail_msg("unexpected %s: %s", sl_status_name(st), ctx.errmsg);
  return n;
}

static void bad_local_world(const char *needle) {
  int n = 0;
  ctx.errmsg[0] = 0;
  sl_status st = sl__launch_local_world_size(&ctx, &n);
  if (st != SL_ERR_INVALID) fail_msg("expected SL_ERR_INVALID for '%s', got %s", needle, sl_status_name(st));
  if (!strstr(ctx.errmsg, needle)) fail_msg("message '%s' lacks '%s'", ctx.errmsg, needle);
}

static void test_local_world_size(void **state) {
  assert_int_equal(local_world(), 1);
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "3");
  assert_int_equal(local_world(), 3);
  set("SLURM_NTASKS_PER_NODE", "2(x3)"); /* uneven nodes: skipped */
  assert_int_equal(local_world(), 3);
  set("SLURM_NTASKS_PER_NODE", "6");
  assert_int_equal(local_world(), 6);
  set("LOCAL_WORLD_SIZE", "8"); /* torchrun under Slurm: torchrun's is the truth */
  assert_int_equal(local_world(), 8);
  set("LOCAL_WORLD_SIZE", "eight");
  bad_local_world("LOCAL_WORLD_SIZE='eight' is not an integer");
  set("LOCAL_WORLD_SIZE", "0");
  bad_local_world("LOCAL_WORLD_SIZE=0 is out of range");
  unsetenv("LOCAL_WORLD_SIZE");
  unsetenv("SLURM_NTASKS_PER_NODE");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "-2");
  bad_local_world("OMPI_COMM_WORLD_LOCAL_SIZE=-2 is out of range");
}

static void test_rendezvous_parse(void **state) {
  parse_ok("file:///shared/rdzv", SL__RDZV_FILE, "/shared/rdzv", 0);
  parse_ok("file://relative/dir", SL__RDZV_FILE, "relative/dir", 0);
  parse_ok("tcp://node0:29500", SL__RDZV_TCP, "node0", 29500);
  parse_ok("tcp://10.0.0.1:1", SL__RDZV_TCP, "10.0.0.1", 1);
  parse_ok("tcp://[::1]:65535", SL__RDZV_TCP, "::1", 65535);
  parse_ok("c10d://127.0.0.1:29400", SL__RDZV_C10D, "127.0.0.1", 29400);
  parse_ok("c10d://[::1]:29400", SL__RDZV_C10D, "::1", 29400);

  parse_bad(NULL, "empty");
  parse_bad("", "empty");
  parse_bad("file://", "no directory");
  parse_bad("http://x:1", "unknown scheme");
  parse_bad("node0:29500", "unknown scheme");
  parse_bad("tcp://node0", "no ':PORT'");
  parse_bad("tcp://node0:", "no port");
  parse_bad("tcp://:29500", "no host");
  parse_bad("tcp://node0:0", "not in 1..65535");
  parse_bad("tcp://node0:65536", "not in 1..65535");
  parse_bad("tcp://node0:99999999999999999999", "not in 1..65535");
  parse_bad("tcp://node0:29x", "not a number");
  parse_bad("tcp://node0:-1", "not a number");
  parse_bad("tcp://::1:29500", "needs brackets");
  parse_bad("tcp://[::1:29500", "without ']'");
  parse_bad("tcp://[::1]29500", "no ':PORT' after ']'");
  parse_bad("tcp://[]:29500", "no host");
  parse_bad("tcp://node0/x:29500", "'/' in the host");
  parse_bad("c10d://node0", "no ':PORT'");
  parse_bad("c10d://:29400", "no host");
  parse_bad("c10d://node0:0", "not in 1..65535");
  parse_bad("c10d:/node0:1", "unknown scheme");
  parse_bad("http://x:1", "c10d://HOST:PORT"); /* the accepted forms name the new scheme */

  char longurl[5000];
  memset(longurl, 'a', sizeof longurl);
  memcpy(longurl, "file://", 7);
  longurl[sizeof longurl - 1] = 0;
  parse_bad(longurl, "too long");
}

/* ---- world sizes past what the rendezvous serves ----------------------------------------- */

/* Every launcher's world-size variable is refused past SL_MAX_WORLD_SIZE, naming itself and the
 * bound; the bound itself is accepted. */
static void test_world_size_bound(void **state) {
  static const struct {
    const char *rank_var, *size_var;
  } launchers[] = {
      {"RANK", "WORLD_SIZE"},
      {"SLURM_PROCID", "SLURM_NTASKS"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
  };
  static const char *const sizes[] = {"4097", "1000000", "16777216", "2147483647", "99999999999999999999"};
  char needle[256];
  for (size_t l = 0; l < sizeof launchers / sizeof launchers[0]; l++) {
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      clear_env(NULL);
      set(launchers[l].rank_var, "0");
      set(launchers[l].size_var, sizes[i]);
      set("MASTER_ADDR", "127.0.0.1");
      set("MASTER_PORT", "29500");
      /* the number as given, unless strtol could not hold it */
      if (strlen(sizes[i]) > 18) snprintf(needle, sizeof needle, "%s='%s' is out of range (1..4096: the most ranks "
                                          "shardload's rendezvous serves", launchers[l].size_var, sizes[i]);
      else snprintf(needle, sizeof needle, "%s=%s is out of range (1..4096: the most ranks shardload's rendezvous "
                    "serves", launchers[l].size_var, sizes[i]);
      bad(needle);
      assert_non_null(strstr(ctx.errmsg, "docs/DESIGN.md#rendezvous"));
    }
    clear_env(NULL);
    set(launchers[l].rank_var, "4095");
    set(launchers[l].size_var, "4096");
    set("MASTER_ADDR", "127.0.0.1");
    set("MASTER_PORT", "29500");
    sl__launch_info li = ok();
    assert_int_equal(li.world_size, SL_MAX_WORLD_SIZE);
    free(li.rendezvous);
  }
}

/* The explicit options pass the same bound: sl_context_create refuses at once, naming the
 * field, before any module or rendezvous is touched. */
static void test_world_size_bound_options(void **state) {
  static const int sizes[] = {4097, 1000000, 1 << 24, INT_MAX};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    char err[1024] = "";
    sl_context_options o = {.size = sizeof o, .backend = "cpu", .world_size = sizes[i], .rank = 0,
                            .rendezvous = "tcp://127.0.0.1:1", .timeout_ms = 60000, .errbuf = err,
                            .errbuf_size = sizeof err};
    sl_context *c = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sl_status st = sl_context_create(&o, &c);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    assert_int_equal(st, SL_ERR_INVALID);
    assert_null(c);
    char needle[128];
    snprintf(needle, sizeof needle, "sl_context_options.world_size=%d is out of range (1..4096", sizes[i]);
    if (!strstr(err, needle)) fail_msg("message '%s' lacks '%s'", err, needle);
    assert_true(ms < 1000);
  }
}

/* The command as a launcher starts it with an absurd world: it fails at once, naming the
 * variable and the bound, without growing (before the bound: a minute and a gigabyte for
 * WORLD_SIZE=1000000, std::bad_alloc for INT_MAX). `timeout` keeps a regression from hanging
 * the test. --world-size says the same bound. */
static void test_world_size_bound_command(void **state) {
  char *dir = sl_test_dir("world_bound");
  char *ckpt = sl_test_path(dir, "m.safetensors");
  sl_test_tensor t = {"w", "F32", 1, {4}, NULL};
  assert_int_equal(sl_test_write_st(ckpt, &t, 1, NULL), 0);
  static const char *const envs[] = {
      "RANK=0 WORLD_SIZE=1000000", "RANK=0 WORLD_SIZE=2147483647", "SLURM_PROCID=0 SLURM_NTASKS=16777216",
      "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1000000"};
  for (size_t i = 0; i < sizeof envs / sizeof envs[0]; i++) {
    char *out = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = sl_test_run(&out, "env %s MASTER_ADDR=127.0.0.1 MASTER_PORT=%d timeout -s KILL 60 %s load '%s'",
                         envs[i], sl_test_free_port(), sl_test_bin(), ckpt);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    print_message("%s: exit %d after %.2f s, largest child %ld MiB: %s", envs[i], rc, s, ru.ru_maxrss / 1024,
                  out ? out : "");
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "is out of range (1..4096: the most ranks shardload's rendezvous serves"));
    const char *var = strchr(envs[i], ' ') + 1;
    char name[64];
    snprintf(name, sizeof name, "%.*s=", (int)(strchr(var, '=') - var), var);
    assert_non_null(strstr(out, name));
    assert_true(s < 5.0);
    assert_true(ru.ru_maxrss < 200 * 1024); /* KiB: the largest child so far, this one included */
    free(out);
  }
  char *out = NULL;
  int rc = sl_test_run(&out, "%s load '%s' --rank 0 --world-size 1000000", sl_test_bin(), ckpt);
  assert_int_equal(rc, 2);
  assert_non_null(strstr(out, "--world-size"));
  assert_non_null(strstr(out, "from 1 to 4096"));
  free(out);
  rc = sl_test_run(&out, "%s load '%s' --nproc 1025", sl_test_bin(), ckpt);
  assert_int_equal(rc, 2);
  assert_non_null(strstr(out, "from 1 to 1024"));
  free(out);
  free(ckpt);
  free(dir);
}

/* ---- local ranks -------------------------------------------------------------------------- */

/* A launcher's local rank at or past its own count of the node's ranks is refused, naming
 * both variables and values; each launcher's pair is compared with itself only. */
static void test_local_rank_bound(void **state) {
  set("RANK", "3");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "3");
  set("LOCAL_WORLD_SIZE", "2");
  set("MASTER_ADDR", "h");
  set("MASTER_PORT", "1");
  bad("LOCAL_RANK=3 is not less than LOCAL_WORLD_SIZE=2");
  set("LOCAL_RANK", "2");
  bad("LOCAL_RANK=2 is not less than LOCAL_WORLD_SIZE=2");
  set("LOCAL_WORLD_SIZE", "x");
  bad("LOCAL_WORLD_SIZE='x' is not an integer");
  set("LOCAL_RANK", "1");
  set("LOCAL_WORLD_SIZE", "2");
  sl__launch_info li = ok();
  assert_int_equal(li.local_rank, 1);
  free(li.rendezvous);
  /* torchrun under Slurm, one task per node hosting torchrun's ranks: Slurm's count is not
   * torchrun's, and is not compared */
  set("LOCAL_RANK", "3");
  set("LOCAL_WORLD_SIZE", "4");
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "2");
  set("SLURM_LOCALID", "0");
  set("SLURM_NTASKS_PER_NODE", "1");
  li = ok();
  assert_int_equal(li.local_rank, 3);
  free(li.rendezvous);
  /* no count: nothing to compare */
  unsetenv("LOCAL_WORLD_SIZE");
  li = ok();
  free(li.rendezvous);

  clear_env(NULL);
  set("SLURM_PROCID", "5");
  set("SLURM_NTASKS", "8");
  set("SLURM_LOCALID", "4");
  set("SLURM_NTASKS_PER_NODE", "4");
  set("MASTER_ADDR", "h");
  bad("SLURM_LOCALID=4 is not less than SLURM_NTASKS_PER_NODE=4");
  set("SLURM_NTASKS_PER_NODE", "4(x2)"); /* uneven nodes name no single count */
  li = ok();
  free(li.rendezvous);
  /* the step's own layout wins over the --ntasks-per-node inherited from sbatch: an srun of 8
   * tasks per node under an allocation asked with 4 */
  set("SLURM_NTASKS_PER_NODE", "4");
  set("SLURM_STEP_TASKS_PER_NODE", "8(x2)");
  set("SLURM_NODEID", "1");
  set("SLURM_PROCID", "14");
  set("SLURM_NTASKS", "16");
  set("SLURM_LOCALID", "6");
  li = ok();
  assert_int_equal(li.local_rank, 6);
  free(li.rendezvous);
  int lws = 0;
  assert_int_equal(sl__launch_local_world_size(&ctx, &lws), SL_OK);
  assert_int_equal(lws, 8);
  /* uneven nodes: node 3 of "2(x3),1" runs one task */
  set("SLURM_STEP_TASKS_PER_NODE", "2(x3),1");
  set("SLURM_NODEID", "3");
  set("SLURM_PROCID", "6");
  set("SLURM_NTASKS", "7");
  set("SLURM_LOCALID", "1");
  bad("SLURM_LOCALID=1 is not less than this node's 1 tasks in the Slurm step (SLURM_STEP_TASKS_PER_NODE=2(x3),1 "
      "at SLURM_NODEID=3)");
  set("SLURM_NODEID", "2");
  li = ok();
  free(li.rendezvous);
  assert_int_equal(sl__launch_local_world_size(&ctx, &lws), SL_OK);
  assert_int_equal(lws, 2);
  /* a step list that does not parse names no count: SLURM_NTASKS_PER_NODE is compared again */
  set("SLURM_STEP_TASKS_PER_NODE", "2(y3)");
  set("SLURM_NTASKS_PER_NODE", "1");
  bad("SLURM_LOCALID=1 is not less than SLURM_NTASKS_PER_NODE=1");

  clear_env(NULL);
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "4");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "2");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  set("MASTER_ADDR", "h");
  set("MASTER_PORT", "1");
  bad("OMPI_COMM_WORLD_LOCAL_RANK=2 is not less than OMPI_COMM_WORLD_LOCAL_SIZE=2");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "3");
  li = ok();
  assert_int_equal(li.local_rank, 2);
  free(li.rendezvous);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_default_single_rank, clear_env),
      cmocka_unit_test_setup(test_torchrun, clear_env),
      cmocka_unit_test_setup(test_torchrun_defaults_and_ipv6, clear_env),
      cmocka_unit_test_setup(test_torchrun_agent_store, clear_env),
      cmocka_unit_test_setup(test_precedence, clear_env),
      cmocka_unit_test_setup(test_slurm_rendezvous, clear_env),
      cmocka_unit_test_setup(test_rendezvous_override, clear_env),
      cmocka_unit_test_setup(test_single_rank_needs_no_rendezvous, clear_env),
      cmocka_unit_test_setup(test_integer_errors, clear_env),
      cmocka_unit_test_setup(test_relation_errors, clear_env),
      cmocka_unit_test_setup(test_rendezvous_errors, clear_env),
      cmocka_unit_test_setup(test_rendezvous_parse, clear_env),
      cmocka_unit_test_setup(test_local_world_size, clear_env),
      cmocka_unit_test_setup(test_world_size_bound, clear_env),
      cmocka_unit_test_setup(test_world_size_bound_options, clear_env),
      cmocka_unit_test_setup(test_world_size_bound_command, clear_env),
      cmocka_unit_test_setup(test_local_rank_bound, clear_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
