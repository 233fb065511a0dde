/* `shardload load --nproc N`: the command's own launcher of local ranks, end to end.
 *
 * World 2 and 4 over strategy scatter/broadcast x source rank0/every-rank, on a synthetic
 * checkpoint and on a hand-made one with uneven rows (10 over 4: 3,3,3,1; an empty shard) and
 * norms replicated by --replicate '*norm*': every rank's --dump is compared byte for byte with
 * the slice computed here from the source (cli_testlib.h reads safetensors on its own), and
 * the merged JSON report's transfer statistics with what each strategy must move.
 *
 * Failures: a missing file, a rank that dies or hangs in the middle of the load (the
 * SHARDLOAD_TEST_FAIL_RANK hook of the tests' build of the command, tests/cli_hooks.c), a rank whose dump cannot be written, and a
 * SIGTERM to the launcher itself: the launcher must stop the other ranks, exit quickly with
 * the failed rank's one error line, and leave no process behind. The test process makes
 * itself a child subreaper, so any rank the launcher did not wait for becomes the test's
 * child and is caught. */
#define _GNU_SOURCE
#include "cli_testlib.h"

#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char *g_dir;
static char *g_synth;  /* synth --size 1MiB --shards 2 */
static char *g_uneven; /* hand-made */

#define UNEVEN_REPLICATE "*norm*"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The command with its test hooks (tests/cli_hooks.c; CTest names it): the shipped one has none. */
static const char *hooks_bin(void) {
  const char *b = getenv("SHARDLOAD_TEST_HOOKS_BIN");
  if (!b || !*b) fail_msg("SHARDLOAD_TEST_HOOKS_BIN is not set (CTest sets it to shardload-test-hooks)");
  return b;
}

/* No process is left over from a launcher: every rank it forked was reaped by it (one it did
 * not reap would have been re-parented to this subreaper). */
static void assert_no_children(void) {
  int st;
  pid_t p = waitpid(-1, &st, WNOHANG);
  if (p != -1 || errno != ECHILD) fail_msg("a process outlived the launcher (waitpid: %ld)", (long)p);
}

/* The pids a --verbose launcher printed ("launch: rank R pid P"); returns how many. */
static int launched_pids(const char *out, pid_t *pids, int max) {
  int n = 0;
  for (const char *p = out; (p = strstr(p, "launch: rank ")) != NULL && n < max; p++) {
    int r;
    long pid;
    if (sscanf(p, "launch: rank %d pid %ld", &r, &pid) == 2) pids[n++] = (pid_t)pid;
  }
  return n;
}

static void assert_gone(const pid_t *pids, int n) {
  for (int i = 0; i < n; i++)
    if (kill(pids[i], 0) == 0 || errno != ESRCH) fail_msg("rank pid %ld still exists", (long)pids[i]);
}

/* The only "shardload: " line of OUT (other lines are --verbose launcher lines). */
static const char *the_error_line(const char *out, char *buf, size_t len) {
  const char *found = NULL;
  for (const char *p = out; p && *p;) {
    if (!strncmp(p, "shardload: ", 11)) {
      if (found) fail_msg("more than one error line: %s", out);
      found = p;
    }
    p = strchr(p, '\n');
    if (p) p++;
  }
  if (!found) fail_msg("no error line: %s", out);
  const char *nl = strchr(found, '\n');
  assert_non_null(nl);
  snprintf(buf, len, "%.*s\n", (int)(nl - found), found);
  return buf;
}

/* ---- fixtures ---------------------------------------------------------------------------------- */

static int setup(void **state) {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return -1;
  g_dir = sl_test_dir("cli-multirank");
  if (!g_dir) return -1;
  g_synth = sl_test_path(g_dir, "synth");
  g_uneven = sl_test_path(g_dir, "uneven.safetensors");
  char *out = NULL;
  int rc = sl_test_run(&out, "%s synth '%s' --size 1MiB --seed 11 --shards 2", sl_test_bin(), g_synth);
  if (rc != 0) fprintf(stderr, "synth failed (%d): %s\n", rc, out ? out : "");
  free(out);
  if (rc != 0) return -1;
  sl_test_tensor ts[] = {
      {"rows10", "F32", 2, {10, 3}, NULL},                /* 3,3,3,1 over 4 */
      {"layers.0.input_layernorm.weight", "F32", 1, {6}, NULL}, /* replicated by the rule */
      {"rows9", "BF16", 2, {9, 2}, NULL},                 /* 3,3,3,0: an empty shard */
      {"rows3", "F32", 2, {3, 2}, NULL},                  /* 1,1,1,0 */
      {"final_norm.weight", "BF16", 1, {5}, NULL},        /* replicated by the rule */
      {"scalar", "F32", 0, {0}, NULL},                    /* 0-d: replicated */
      {"ids", "I64", 1, {4}, NULL},
  };
  return sl_test_write_st(g_uneven, ts, sizeof ts / sizeof ts[0], "{\"format\":\"pt\"}");
}

static int teardown(void **state) {
  free(g_synth);
  free(g_uneven);
  free(g_dir);
  return 0;
}

/* ---- loads that succeed ----------------------------------------------------------------------- */

typedef struct load_case {
  const char *path;
  int world;
  const char *strategy, *source, *backend, *cpu_offload;
  const char *replicate; /* glob, or NULL */
  int cast_f32;
  const char *staging; /* --staging, NULL: 64K */
} load_case;

static uint64_t jint(json_t *o, const char *a, const char *b) {
  json_t *v = json_object_get(o, a);
  if (b) v = json_object_get(v, b);
  if (!json_is_integer(v)) fail_msg("%s.%s is not an integer", a, b ? b : "");
  return (uint64_t)json_integer_value(v);
}

static uint64_t checkpoint_bytes(const char *path) {
  char *jp = sl_test_path(g_dir, "inspect.json"), cmd[4096];
  snprintf(cmd, sizeof cmd, "%s inspect --json '%s'", sl_test_bin(), path);
  assert_int_equal(run_to_file(jp, cmd), 0);
  json_t *j = load_json_file(jp);
  uint64_t n = jint(j, "total_bytes", NULL);
  json_decref(j);
  free(jp);
  return n;
}

static void run_case(const load_case *c) {
  char *jp = sl_test_path(g_dir, "merged.json"), *dump = sl_test_path(g_dir, "dump"), cmd[4096];
  char *out = NULL;
  assert_int_equal(sl_test_run(&out, "rm -rf '%s'", dump), 0);
  free(out);
  snprintf(cmd, sizeof cmd,
           "%s load '%s' --nproc %d --strategy %s --source %s --backend %s --cpu-offload %s --staging %s "
           "--timeout 60 --dump '%s' --json %s%s%s %s",
           sl_test_bin(), c->path, c->world, c->strategy, c->source, c->backend, c->cpu_offload,
           c->staging ? c->staging : "64K", dump,
           c->replicate ? "--replicate '" : "", c->replicate ? c->replicate : "", c->replicate ? "'" : "",
           c->cast_f32 ? "--param-dtype F32" : "");
  double t0 = now_s();
  int rc = run_to_file(jp, cmd);
  if (rc != 0) {
    sl_test_run(&out, "%s", cmd);
    fail_msg("%s exited %d: %s", cmd, rc, out ? out : "");
  }
  double wall = now_s() - t0;
  assert_no_children();

  json_t *j = load_json_file(jp);
  uint64_t ckpt = checkpoint_bytes(c->path);
  assert_int_equal(jint(j, "world_size", NULL), c->world);
  assert_int_equal(jint(j, "checkpoint_bytes", NULL), ckpt);
  double ws = json_number_value(json_object_get(j, "wall_seconds"));
  assert_true(ws > 0 && ws <= wall + 0.5);
  assert_string_equal(json_string_value(json_object_get(j, "strategy")), c->strategy);
  assert_string_equal(json_string_value(json_object_get(j, "source")), c->source);
  json_t *ranks = json_object_get(j, "ranks");
  assert_int_equal(json_array_size(ranks), c->world);
  /* the data collective the ranks agreed on: sim's device collective when every rank runs sim,
   * else host staging (shm: every rank shares this host); the launcher's report carries rank
   * 0's, the same on every rank */
  const char *coll = !strncmp(c->backend, "sim", 3) ? "simccl" : c->world > 1 ? "shm" : "local";
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "collective"), "name")), coll);

  uint64_t others = 0; /* bytes held by ranks 1.. */
  for (int r = 0; r < c->world; r++) {
    json_t *rj = json_array_get(ranks, (size_t)r);
    assert_int_equal(jint(rj, "rank", NULL), r);
    assert_int_equal(jint(rj, "world_size", NULL), c->world);
    json_t *cj = json_object_get(rj, "collective");
    assert_string_equal(json_string_value(json_object_get(cj, "name")), coll);
    const char *why = json_string_value(json_object_get(cj, "reason"));
    assert_non_null(why);
    assert_true(!strncmp(why, coll, strlen(coll)) && why[strlen(coll)] == ':'); /* "gloo: why" */
    assert_true(json_is_integer(json_object_get(json_object_get(rj, "stats"), "transfers")));
    uint64_t held = jint(rj, "totals", "bytes");
    if (r) others += held;
    assert_true(jint(rj, "stats", "peak_rss_bytes") > 0);
    /* every-rank reads into host shards without a cast land in place: no staging at all;
     * anything else stages */
    int in_place = !strcmp(c->source, "every-rank") && !c->cast_f32 &&
                    (!strcmp(c->backend, "cpu") || !strcmp(c->cpu_offload, "on"));
    if (in_place) assert_int_equal(jint(rj, "stats", "staging_bytes"), 0);
    else assert_true(jint(rj, "stats", "staging_bytes") > 0);
    /* what each way of loading moves (no cast: wire bytes are file bytes) */
    uint64_t read = jint(rj, "stats", "bytes_read"), sent = jint(rj, "stats", "bytes_sent"),
             recv = jint(rj, "stats", "bytes_received");
    if (!strcmp(c->source, "every-rank")) {
      if (!c->cast_f32) assert_int_equal(read, held); /* only its own bytes, nothing on the wire */
      assert_int_equal(sent, 0);
      assert_int_equal(recv, 0);
    } else if (r > 0) {
      assert_int_equal(read, 0);
      assert_int_equal(sent, 0);
      if (!strcmp(c->strategy, "broadcast")) assert_int_equal(recv, ckpt);
      else if (!c->cast_f32) assert_int_equal(recv, held);
    } else {
      assert_int_equal(read, ckpt);
      assert_int_equal(recv, 0);
    }
    char name[32];
    snprintf(name, sizeof name, "rank-%d.safetensors", r);
    char *dp = sl_test_path(dump, name);
    assert_string_equal(json_string_value(json_object_get(rj, "dump")), dp);
    size_t n = check_dump(dp, c->path, c->cast_f32, r, c->world, c->replicate);
    assert_int_equal(n, json_array_size(json_object_get(rj, "tensors")));
    free(dp);
  }
  json_t *r0 = json_array_get(ranks, 0);
  uint64_t sent0 = jint(r0, "stats", "bytes_sent");
  assert_int_equal(jint(j, "rank0_bytes_sent", NULL), sent0);
  if (!strcmp(c->source, "rank0") && !strcmp(c->strategy, "broadcast"))
    assert_int_equal(sent0, (uint64_t)(c->world - 1) * ckpt); /* Accelerate: everything to everyone */
  else if (!strcmp(c->source, "rank0") && !c->cast_f32)
    assert_int_equal(sent0, others); /* scatter: each rank exactly its shards */
  json_decref(j);
  free(jp);
  free(dump);
}

static void test_matrix(void **state) {
  static const int worlds[] = {2, 4};
  static const char *strategies[] = {"scatter", "broadcast"};
  static const char *sources[] = {"rank0", "every-rank"};
  for (int w = 0; w < 2; w++)
    for (int s = 0; s < 2; s++)
      for (int o = 0; o < 2; o++) {
        /* the strict simulated accelerator proves device memory is touched only through the
         * backend; the cpu backend places in host memory */
        load_case a = {g_synth, worlds[w], strategies[s], sources[o], s ? "sim:strict" : "cpu",
                       s ? "off" : "on", NULL, 0, NULL};
        run_case(&a);
        load_case b = {g_uneven, worlds[w], strategies[s], sources[o], o ? "sim:strict" : "cpu",
                       o ? "infer" : "on", UNEVEN_REPLICATE, 0, NULL};
        run_case(&b);
      }
}

static void test_cast_and_one_rank(void **state) {
  load_case a = {g_synth, 2, "scatter", "rank0", "sim:strict", "off", NULL, 1, NULL};
  run_case(&a);
  load_case b = {g_synth, 4, "broadcast", "every-rank", "cpu", "on", "*norm*", 1, NULL};
  run_case(&b);
  load_case c = {g_uneven, 1, "scatter", "rank0", "cpu", "on", NULL, 0, NULL}; /* --nproc 1 */
  run_case(&c);
}

/* Many small tensors read every-rank (1500 of 2 KiB in one transfer under a 32 MiB budget): more
 * runs than one preadv takes (source_files.c coalesces at most 1024 iovecs a call), with the
 * other ranks' rows as the gaps between them. Every rank's dump holds the same bytes as a
 * rank-0 load's, and it counts as read only its own bytes, not the gaps. (check_dump would
 * reparse the source for each of the 1500 tensors: the rank-0 load is the reference here.) */
static void test_many_small_tensors_every_rank(void **state) {
  char *many = sl_test_path(g_dir, "many.safetensors"), *jp = sl_test_path(g_dir, "many.json"), *out = NULL;
  int rc = sl_test_run(&out, "%s synth '%s' --size 3MiB --tensors 1500 --seed 5", sl_test_bin(), many);
  if (rc != 0) fail_msg("synth exited %d: %s", rc, out ? out : "");
  free(out);
  static const int worlds[] = {2, 4};
  static const char *sources[] = {"every-rank", "rank0"};
  for (int w = 0; w < 2; w++) {
    char *dumps[2];
    for (int m = 0; m < 2; m++) {
      char sub[32], cmd[4096];
      snprintf(sub, sizeof sub, "many-dump-%s", sources[m]);
      dumps[m] = sl_test_path(g_dir, sub);
      assert_int_equal(sl_test_run(&out, "rm -rf '%s'", dumps[m]), 0);
      free(out);
      snprintf(cmd, sizeof cmd,
               "%s load '%s' --nproc %d --source %s --backend cpu --cpu-offload on --staging 32MiB --timeout 60 "
               "--dump '%s' --json",
               sl_test_bin(), many, worlds[w], sources[m], dumps[m]);
      if ((rc = run_to_file(jp, cmd)) != 0) {
        sl_test_run(&out, "%s", cmd);
        fail_msg("%s exited %d: %s", cmd, rc, out ? out : "");
      }
      assert_no_children();
      json_t *j = load_json_file(jp);
      json_t *ranks = json_object_get(j, "ranks");
      assert_int_equal(json_array_size(ranks), worlds[w]);
      for (int r = 0; r < worlds[w] && m == 0; r++) {
        json_t *rj = json_array_get(ranks, (size_t)r);
        assert_int_equal(json_array_size(json_object_get(rj, "tensors")), 1500);
        assert_int_equal(jint(rj, "stats", "bytes_read"), jint(rj, "totals", "bytes"));
        /* the batch times its own reads: they are counted, and within the load */
        double read = json_number_value(json_object_get(json_object_get(rj, "stats"), "seconds_read"));
        assert_true(read > 0 && read <= json_number_value(json_object_get(json_object_get(rj, "stats"), "seconds")));
      }
      json_decref(j);
    }
    assert_int_equal(sl_test_dumps_differ(dumps[0], dumps[1], worlds[w]), -1);
    free(dumps[0]);
    free(dumps[1]);
  }
  free(jp);
  free(many);
}

static void test_human_output(void **state) {
  char *out = NULL;
  assert_int_equal(sl_test_run(&out, "%s load '%s' --nproc 2 --backend cpu", sl_test_bin(), g_synth), 0);
  assert_no_children();
  assert_non_null(strstr(out, "load "));
  assert_non_null(strstr(out, "2 local ranks"));
  assert_non_null(strstr(out, "rank 0: "));
  assert_non_null(strstr(out, "rank 1: "));
  assert_null(strstr(out, "rank 2: "));
  assert_non_null(strstr(out, "peak RSS"));
  assert_non_null(strstr(out, "total: "));
  assert_non_null(strstr(out, "GB/s"));
  assert_non_null(strstr(out, "inferred: no offload policy"));
  assert_non_null(strstr(out, "collective shm"));
  assert_non_null(
      strstr(out, "\ncollective: shm: backend cpu of rank 0 stages through host memory; every rank shares one host\n"));
  assert_null(strstr(out, "model.embed_tokens.weight")); /* short: no per-tensor lines */
  assert_null(strstr(out, "launch: "));
  free(out);

  /* --verbose: every rank's table, and the pids, all gone afterwards */
  assert_int_equal(sl_test_run(&out, "%s load '%s' --nproc 3 --backend sim --verbose", sl_test_bin(), g_synth), 0);
  assert_no_children();
  for (int r = 0; r < 3; r++) {
    char want[64];
    snprintf(want, sizeof want, "rank %d of 3: backend sim", r);
    assert_non_null(strstr(out, want));
  }
  assert_non_null(strstr(out, "model.embed_tokens.weight"));
  pid_t pids[8];
  assert_int_equal(launched_pids(out, pids, 8), 3);
  assert_gone(pids, 3);
  free(out);
}

/* The whole text of PATH (malloc'd). */
static char *read_text(const char *path) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  rewind(f);
  char *text = malloc((size_t)size + 1);
  assert_non_null(text);
  text[fread(text, 1, (size_t)size, f)] = 0;
  fclose(f);
  return text;
}

/* What each rank hands the launcher (kept by the test hook): a summary of a size that does not
 * grow with the tensor count (no entry per tensor, nor per skipped name: a checkpoint of tens of
 * thousands of tensors must not cost a report of megabytes written, read and parsed per rank),
 * whose placement groups the launcher's table prints; with --json also the whole report, which
 * the merged report holds as it is, byte for byte what jansson writes for it. */
static void test_rank_reports_scale_with_json_only(void **state) {
  enum { N = 3000 };
  char *ck = sl_test_path(g_dir, "many.safetensors"), *keep = sl_test_path(g_dir, "reports");
  char *merged = sl_test_path(g_dir, "many.out"), *out = NULL;
  assert_int_equal(sl_test_run(&out, "%s synth '%s' --size 64KiB --tensors %d", sl_test_bin(), ck, N), 0);
  free(out);
  static const char *const modes[] = {"", "--verbose", "--json"};
  for (size_t m = 0; m < 3; m++) {
    int json = !strcmp(modes[m], "--json");
    assert_int_equal(sl_test_run(&out, "rm -rf '%s' && mkdir '%s'", keep, keep), 0);
    free(out);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "SHARDLOAD_TEST_KEEP_REPORTS='%s' %s load '%s' --nproc 2 --backend cpu %s", keep,
             hooks_bin(), ck, modes[m]);
    assert_int_equal(run_to_file(merged, cmd), 0);
    assert_no_children();
    char *text = read_text(merged);
    json_t *all = json ? load_json_file(merged) : NULL;
    for (int r = 0; r < 2; r++) {
      char name[32];
      snprintf(name, sizeof name, "rank-%d.json", r);
      char *rp = sl_test_path(keep, name);
      struct stat st;
      assert_int_equal(stat(rp, &st), 0);
      json_t *j = load_json_file(rp);
      assert_int_equal(jint(j, "totals", "tensors"), N); /* every tensor has a shard on every rank */
      if (json_object_get(j, "tensors") || json_object_get(j, "skipped"))
        fail_msg("%s %s: rank %d's report lists tensors", ck, modes[m], r);
      if (st.st_size > 4096) fail_msg("%s %s: rank %d's report is %lld bytes", ck, modes[m], r, (long long)st.st_size);
      json_t *groups = json_object_get(j, "placements");
      assert_int_equal(json_array_size(groups), 1);
      json_t *g = json_array_get(groups, 0);
      assert_int_equal(jint(g, "tensors", NULL), N);
      assert_int_equal(jint(g, "pinned", NULL), 0);
      assert_string_equal(json_string_value(json_object_get(g, "placement")), "device");
      snprintf(name, sizeof name, "rank-%d.full.json", r);
      char *fp = sl_test_path(keep, name);
      if (json) {
        json_t *full = load_json_file(fp), *mine = json_array_get(json_object_get(all, "ranks"), (size_t)r);
        assert_int_equal(json_array_size(json_object_get(full, "tensors")), N);
        assert_true(json_is_array(json_object_get(full, "skipped")));
        assert_true(json_equal(full, mine));
        json_decref(full);
      } else {
        assert_int_not_equal(access(fp, F_OK), 0); /* no whole report where nothing prints it */
      }
      free(fp);
      json_decref(j);
      free(rp);
    }
    if (json) {
      /* as the launcher wrote it when it parsed the ranks' reports and dumped them again */
      char *again = json_dumps(all, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
      assert_non_null(again);
      size_t n = strlen(again);
      if (strncmp(text, again, n) || strcmp(text + n, "\n")) fail_msg("the merged --json report is not jansson's text");
      free(again);
    } else {
      assert_non_null(strstr(text, "rank 0: 3000 tensors"));
      assert_non_null(strstr(text, "3000 x device by rule \"inferred: no offload policy\""));
    }
    free(text);
    json_decref(all);
  }
  free(merged);
  free(keep);
  free(ck);
}

/* Rank 1's whole report is changed by TAMPER (a shell command on the file "$f") while rank 1
 * sleeps in its exit hook, after it wrote the report and the summary that gives the report's
 * length and digest: the launcher checks every rank's report before it prints a byte of the
 * merged one, so it exits 1 with one error line naming rank 1 and its file, and stdout is
 * empty (no half-printed JSON, no member spliced in). */
static void run_tampered_report(const char *tamper) {
  char *tmp = sl_test_path(g_dir, "tamper-tmp"), *so = sl_test_path(g_dir, "tamper.out"),
       *se = sl_test_path(g_dir, "tamper.err"), *mark = sl_test_path(g_dir, "tamper.done"), *out = NULL;
  assert_int_equal(sl_test_run(&out, "rm -rf '%s' '%s' && mkdir '%s'", tmp, mark, tmp), 0);
  free(out);
  int rc = sl_test_run(&out,
                       "TMPDIR='%s' SHARDLOAD_TEST_SLOW_EXIT_RANK=1 %s load '%s' --nproc 2 --backend cpu --json "
                       ">'%s' 2>'%s' & pid=$!; "
                       "for i in $(seq 1 1000); do s=$(ls '%s'/shardload-*/rank-1.json 2>/dev/null | head -1); "
                       "if [ -n \"$s\" ] && tail -c 2 \"$s\" | grep -q '}'; then f=\"${s%%.json}.full.json\"; "
                       "%s; touch '%s'; break; fi; sleep 0.005; done; wait $pid",
                       tmp, hooks_bin(), g_uneven, so, se, tmp, tamper, mark);
  free(out);
  if (access(mark, F_OK) != 0) fail_msg("%s: the report was not found to change", tamper);
  assert_int_equal(rc, 1);
  assert_no_children();
  char *o = read_text(so), *e = read_text(se), line[4096];
  if (*o) fail_msg("%s: stdout holds %zu bytes:\n%.400s", tamper, strlen(o), o);
  the_error_line(e, line, sizeof line);
  if (!strstr(line, "rank 1: its report ") || !strstr(line, "/rank-1.full.json"))
    fail_msg("%s: the error line names neither rank 1 nor its file:\n%s", tamper, e);
  free(o);
  free(e);
  free(mark);
  free(se);
  free(so);
  free(tmp);
}

static void test_tampered_rank_report(void **state) {
  /* cut short: nothing of the merged report is printed */
  run_tampered_report("printf '{\"rank\": 1, \"tens' > \"$f\"");
  /* replaced with one that passes a look at its first and last bytes, and would splice in a key */
  run_tampered_report("printf '{\"rank\": 1}\\n], \"injected\": true, \"world_size\": 99, \"x\": [{}\\n' > \"$f\"");
  /* the same length, one byte changed */
  run_tampered_report("sed -i 's/\"rank\": 1/\"rank\": 7/' \"$f\"");
}

/* The merged report prints the user's checkpoint path and dump directory escaped: a newline in
 * either cannot forge a line of the report (here a "shardload: " error line). */
static void test_report_escapes_paths(void **state) {
  char *link = sl_test_path(g_dir, "ck\nshardload: forged"), *dump = sl_test_path(g_dir, "dump\nshardload: forged2");
  unlink(link);
  assert_int_equal(symlink(g_uneven, link), 0);
  char *out = NULL;
  assert_int_equal(sl_test_run(&out, "%s load '%s' --nproc 2 --backend cpu --dump '%s'", sl_test_bin(), link, dump), 0);
  assert_no_children();
  if (strstr(out, "\nshardload: forged")) fail_msg("a path forged a line of the report:\n%s", out);
  assert_non_null(strstr(out, "ck\\nshardload: forged: 2 local ranks"));
  assert_non_null(strstr(out, "dump: "));
  assert_non_null(strstr(out, "dump\\nshardload: forged2/rank-<r>.safetensors\n"));
  free(out);
  free(link);
  free(dump);
}

/* ---- failures --------------------------------------------------------------------------------- */

static void test_missing_file(void **state) {
  char *missing = sl_test_path(g_dir, "missing.safetensors"), *out = NULL, line[4096];
  double t0 = now_s();
  assert_int_equal(sl_test_run(&out, "%s load '%s' --nproc 3 --backend cpu", sl_test_bin(), missing), 1);
  assert_true(now_s() - t0 < 10.0);
  assert_no_children();
  assert_one_error_line(out, missing);
  assert_non_null(strstr(out, ": rank "));
  free(out);

  /* --verbose: launcher lines besides, still one error line, and every rank gone */
  assert_int_equal(sl_test_run(&out, "%s load '%s' --nproc 3 --backend cpu -v", sl_test_bin(), missing), 1);
  assert_no_children();
  the_error_line(out, line, sizeof line);
  assert_one_error_line(line, missing);
  pid_t pids[8];
  assert_int_equal(launched_pids(out, pids, 8), 3);
  assert_gone(pids, 3);
  free(out);
  free(missing);
}

/* Rank 1 dies (exit 9, or SIGKILL) or hangs once the data phase begins, while the others
 * wait in a collective: the launcher must stop them and exit 1 quickly naming rank 1 (for a
 * death) or a rank that timed out waiting (for a hang). */
static void run_dying_rank(const char *mode, const char *extra, double max_s, const char *want_in_line) {
  char *out = NULL, line[4096];
  double t0 = now_s();
  int rc = sl_test_run(&out, "SHARDLOAD_TEST_FAIL_RANK=1%s %s load '%s' --nproc 3 --backend cpu %s -v",
                       mode, hooks_bin(), g_synth, extra);
  double took = now_s() - t0;
  if (rc != 1) fail_msg("mode '%s': exit %d, want 1: %s", mode, rc, out ? out : "");
  if (took > max_s) fail_msg("mode '%s': took %.1f s, want < %.1f s", mode, took, max_s);
  assert_no_children();
  the_error_line(out, line, sizeof line);
  assert_one_error_line(line, g_synth);
  if (!strstr(line, want_in_line)) fail_msg("mode '%s': '%s' not in: %s", mode, want_in_line, line);
  pid_t pids[8];
  assert_int_equal(launched_pids(out, pids, 8), 3);
  assert_gone(pids, 3);
  free(out);
}

static void test_rank_dies(void **state) {
  run_dying_rank("", "", 10.0, ": rank 1: exited with status 9");
  run_dying_rank(":exit", "", 10.0, ": rank 1: exited with status 9");
  run_dying_rank(":signal", "", 10.0, ": rank 1: killed by signal 9");
  /* a hung rank: the others time out (--timeout 2), then the launcher stops the hung one */
  run_dying_rank(":hang", "--timeout 2", 15.0, sl_status_name(SL_ERR_TIMEOUT));
}

/* Rank 1 alone cannot write its dump (its file name is taken by a directory): the load
 * succeeded everywhere, the launcher still exits 1 with rank 1's line naming the file, even
 * when rank 0 (whose line only blames rank 1) ends first. */
static void test_dump_fails_on_one_rank(void **state) {
  char *dump = sl_test_path(g_dir, "dump-blocked"), *blocked = sl_test_path(dump, "rank-1.safetensors");
  char *out = NULL, line[4096];
  assert_int_equal(sl_test_run(&out, "rm -rf '%s' && mkdir -p '%s'", dump, blocked), 0);
  free(out);
  /* rank 1 ends last: rank 0's line only blames it, the launcher still prints rank 1's own */
  assert_int_equal(sl_test_run(&out, "SHARDLOAD_TEST_SLOW_EXIT_RANK=1 %s load '%s' --nproc 2 --backend cpu --dump '%s'",
                               hooks_bin(), g_uneven, dump), 1);
  assert_no_children();
  assert_one_error_line(the_error_line(out, line, sizeof line), blocked);
  assert_non_null(strstr(line, ": rank 1: "));
  free(out);
  free(blocked);
  free(dump);
}

/* Two ranks started on their own (--rank/--world-size, a file:// rendezvous), rank 1's dump
 * blocked: the ranks agree on the dump's outcome, so rank 0 does not exit 0 while rank 1's
 * dump failed; its line names rank 1 and what happened there. */
static void test_dump_agreed_across_ranks(void **state) {
  char *dump = sl_test_path(g_dir, "dump-agreed"), *blocked = sl_test_path(dump, "rank-1.safetensors");
  char *rdv = sl_test_rendezvous("cli-mr-dump-rdv"), *e0 = sl_test_path(g_dir, "agreed0.err");
  char *e1 = sl_test_path(g_dir, "agreed1.err"), *out = NULL;
  assert_non_null(rdv);
  assert_int_equal(sl_test_run(&out, "rm -rf '%s' && mkdir -p '%s'", dump, blocked), 0);
  free(out);
  int rc = sl_test_run(&out,
                       "unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT SHARDLOAD_RENDEZVOUS; "
                       "timeout 60 %s load '%s' --backend cpu --rank 1 --world-size 2 --rendezvous '%s' "
                       "--timeout 30 --dump '%s' > /dev/null 2> '%s' & "
                       "timeout 60 %s load '%s' --backend cpu --rank 0 --world-size 2 --rendezvous '%s' "
                       "--timeout 30 --dump '%s' > /dev/null 2> '%s'; r0=$?; wait $!; r1=$?; echo \"r0=$r0 r1=$r1\"",
                       sl_test_bin(), g_uneven, rdv, dump, e1, sl_test_bin(), g_uneven, rdv, dump, e0);
  assert_int_equal(rc, 0);
  if (strstr(out, "has no Gloo")) skip();
  int r0 = -1, r1 = -1;
  assert_int_equal(sscanf(out, "r0=%d r1=%d", &r0, &r1), 2);
  free(out);
  char *err0 = NULL, *err1 = NULL;
  assert_int_equal(sl_test_run(&err0, "cat '%s'", e0), 0);
  assert_int_equal(sl_test_run(&err1, "cat '%s'", e1), 0);
  if (r1 != 1) fail_msg("rank 1 exited %d: %s", r1, err1);
  if (r0 != 1) fail_msg("rank 0 exited %d while rank 1's dump failed: %s", r0, err0);
  assert_one_error_line(err1, blocked);
  assert_one_error_line(err0, dump);
  assert_non_null(strstr(err0, sl_status_name(SL_ERR_PEER)));
  assert_non_null(strstr(err0, "rank 1: "));
  assert_non_null(strstr(err0, "rank-1.safetensors"));
  free(err0);
  free(err1);
  free(e0);
  free(e1);
  free(rdv);
  free(blocked);
  free(dump);
}

/* Two unrelated jobs (same checkpoint, rendezvous and world size, different load options)
 * each start one rank: the command's job key puts them in different key namespaces, so they
 * never run a step together; the lobby (collectives/gloo/lobby.h) names the field in which the
 * job keys differ — at once on a tcp:// store, in the timeout message on a file:// one. */
static void test_unrelated_jobs_do_not_meet(void **state) {
  (void)state;
  for (int tcp = 0; tcp <= 1; tcp++) {
    char *rdv = NULL, *out = NULL;
    if (tcp) assert_true(asprintf(&rdv, "tcp://127.0.0.1:%d", sl_test_free_port()) > 0);
    else rdv = sl_test_rendezvous("cli-mr-jobkey-rdv");
    assert_non_null(rdv);
    double t0 = now_s();
    int rc = sl_test_run(&out,
                         "unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT SHARDLOAD_RENDEZVOUS SHARDLOAD_JOB_ID; "
                         "timeout 60 %s load '%s' --backend cpu --rank 1 --world-size 2 --rendezvous '%s' "
                         "--timeout %d --strategy broadcast > /dev/null 2>&1 & "
                         "timeout 60 %s load '%s' --backend cpu --rank 0 --world-size 2 --rendezvous '%s' "
                         "--timeout %d --strategy scatter 2>&1 > /dev/null; r0=$?; wait $!; r1=$?; echo \"r0=$r0 r1=$r1\"",
                         sl_test_bin(), g_uneven, rdv, tcp ? 20 : 2, sl_test_bin(), g_uneven, rdv, tcp ? 20 : 2);
    double took = now_s() - t0;
    assert_int_equal(rc, 0);
    if (strstr(out, "has no Gloo")) skip();
    if (!strstr(out, "r0=1 r1=1")) fail_msg("want both ranks to fail: %s", out);
    /* the ranks never shared keys: no plan agreement ran ("load plan differs") */
    if (strstr(out, "load plan differs")) fail_msg("the jobs met: %s", out);
    /* the lobby names the first difference of the job keys */
    if (!strstr(out, "strategy broadcast") || !strstr(out, "strategy scatter"))
      fail_msg("want the differing field named: %s", out);
    if (tcp) {
      /* rank 0's store serves this job alone: a peer under another key fails the wait at once */
      if (!strstr(out, sl_status_name(SL_ERR_MISMATCH))) fail_msg("want a mismatch: %s", out);
      if (took > 10.0) fail_msg("took %.1f s of a 20 s timeout: %s", took, out);
    } else {
      /* a file:// directory may hold an earlier job's entries: only the timeout says it */
      if (!strstr(out, sl_status_name(SL_ERR_TIMEOUT))) fail_msg("want a timeout: %s", out);
      assert_true(took < 30.0);
    }
    free(out);
    free(rdv);
  }
}

/* A plan that fails on one rank only (here: a relative --plan file that exists in rank 0's
 * working directory and not in rank 1's, so both have the same job key and meet) fails every
 * rank at once with that rank's reason, instead of leaving rank 0 in sl_load's first agreement
 * until it notices the lost peer or times out. */
static void test_plan_fails_on_one_rank(void **state) {
  (void)state;
  char *d0 = sl_test_dir("cli-mr-plan-r0"), *d1 = sl_test_dir("cli-mr-plan-r1"), *out = NULL;
  assert_non_null(d0);
  assert_non_null(d1);
  char *plan = sl_test_path(d0, "plan.json");
  FILE *f = fopen(plan, "w");
  assert_non_null(f);
  fputs("{}\n", f);
  fclose(f);
  int port = sl_test_free_port();
  double t0 = now_s();
  int rc = sl_test_run(&out,
                       "unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT SHARDLOAD_RENDEZVOUS SHARDLOAD_JOB_ID; "
                       "(cd '%s' && timeout 60 %s load '%s' --backend cpu --rank 1 --world-size 2 "
                       "--rendezvous tcp://127.0.0.1:%d --timeout 40 --plan plan.json > /dev/null 2>&1) & "
                       "(cd '%s' && timeout 60 %s load '%s' --backend cpu --rank 0 --world-size 2 "
                       "--rendezvous tcp://127.0.0.1:%d --timeout 40 --plan plan.json 2>&1 > /dev/null); r0=$?; "
                       "wait $!; r1=$?; echo \"r0=$r0 r1=$r1\"",
                       d1, sl_test_bin(), g_synth, port, d0, sl_test_bin(), g_synth, port);
  double took = now_s() - t0;
  assert_int_equal(rc, 0);
  if (strstr(out, "has no Gloo")) skip();
  if (!strstr(out, "r0=1 r1=1")) fail_msg("want both ranks to fail: %s", out);
  if (!strstr(out, "rank 1: its plan could not be built")) fail_msg("want rank 1's reason on rank 0: %s", out);
  if (took > 20.0) fail_msg("took %.1f s of a 40 s timeout: %s", took, out);
  free(out);
  free(plan);
  free(d0);
  free(d1);
}

/* Usage errors found after the ranks start (an uncastable --param-dtype, a mesh the world
 * does not fill) exit 2 through the launcher too, with the rank's one line. */
static void test_usage_through_launcher(void **state) {
  static const struct {
    const char *args, *subject;
  } cases[] = {{"--param-dtype I32", "--param-dtype"}, {"--mesh 3", "--mesh"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out = NULL, line[4096];
    int rc = sl_test_run(&out, "%s load '%s' --nproc 2 --backend cpu %s", sl_test_bin(), g_synth, cases[i].args);
    if (rc != 2) fail_msg("%s: exit %d, want 2: %s", cases[i].args, rc, out ? out : "");
    assert_no_children();
    assert_one_error_line(the_error_line(out, line, sizeof line), cases[i].subject);
    assert_non_null(strstr(line, ": rank "));
    free(out);
  }
}

/* --collective reaches every rank of --nproc: forced onto cpu ranks, which cannot run sim's
 * device collective, every rank fails at context creation naming rank 0 and why (without
 * the option the ranks would choose gloo and succeed). */
static void test_collective_through_launcher(void **state) {
  char *out = NULL, line[4096];
  double t0 = now_s();
  int rc = sl_test_run(&out, "%s load '%s' --nproc 2 --backend cpu --collective simccl --timeout 60", sl_test_bin(),
                       g_synth);
  if (rc != 1) fail_msg("exit %d, want 1: %s", rc, out ? out : "");
  assert_true(now_s() - t0 < 20); /* agreed, not timed out */
  assert_no_children();
  assert_one_error_line(the_error_line(out, line, sizeof line), g_synth);
  assert_non_null(strstr(line, "SL_ERR_NO_DEVICE"));
  assert_non_null(strstr(line, "rank 0 cannot run it"));
  assert_non_null(strstr(line, "backend is cpu"));
  free(out);
  /* and forcing what every rank can run works, said so in the report */
  char *jp = sl_test_path(g_dir, "forced.json"), cmd[4096];
  snprintf(cmd, sizeof cmd, "%s load '%s' --nproc 2 --backend sim --collective gloo --timeout 60 --json", sl_test_bin(),
           g_synth);
  rc = run_to_file(jp, cmd);
  if (rc != 0) {
    sl_test_run(&out, "%s", cmd);
    fail_msg("%s exited %d: %s", cmd, rc, out ? out : "");
  }
  json_t *j = load_json_file(jp);
  for (int r = 0; r < 2; r++) {
    json_t *cj = json_object_get(json_array_get(json_object_get(j, "ranks"), (size_t)r), "collective");
    assert_string_equal(json_string_value(json_object_get(cj, "name")), "gloo");
    assert_non_null(strstr(json_string_value(json_object_get(cj, "reason")), "gloo: forced"));
  }
  json_decref(j);
  free(jp);
}

/* What `load --nproc` hands its ranks: a fresh 32-byte secret per job in SHARDLOAD_TOKEN (64
 * hex digits, the same on every rank, another for the next job), and with
 * --insecure-rendezvous, SHARDLOAD_INSECURE_RENDEZVOUS=1; LOCAL_WORLD_SIZE=N (as torchrun
 * does, for the backend's device choice). The ranks report a digest of the token through a
 * test hook, never the token. */
static int env_reports(const char *out, unsigned long long *digest, char insecure[][16]) {
  int n = 0;
  for (const char *p = out; (p = strstr(p, "test-hook: rank ")) != NULL; p++) {
    int r;
    size_t len;
    char kind[16];
    unsigned long long d;
    char ins[16];
    int lws = 0;
    if (sscanf(p, "test-hook: rank %d: SHARDLOAD_TOKEN %zu %15s digits, digest %llx; LOCAL_WORLD_SIZE=%d; "
                  "SHARDLOAD_INSECURE_RENDEZVOUS=%15s", &r, &len, kind, &d, &lws, ins) != 6)
      fail_msg("unreadable hook line in: %s", out);
    assert_int_equal(lws, 2);
    assert_true(r >= 0 && r < 2);
    assert_int_equal(len, 64);
    assert_string_equal(kind, "hex");
    digest[r] = d;
    snprintf(insecure[r], 16, "%s", ins);
    n++;
  }
  return n;
}

static void test_launcher_secret_and_insecure_flag(void **state) {
  unsigned long long d1[2] = {0, 0}, d2[2] = {0, 0};
  char ins1[2][16], ins2[2][16];
  char *out = NULL;
  assert_int_equal(sl_test_run(&out, "env -u SHARDLOAD_INSECURE_RENDEZVOUS SHARDLOAD_TOKEN=preset "
                               "SHARDLOAD_TEST_REPORT_ENV=1 %s load '%s' --nproc 2 --backend cpu",
                               hooks_bin(), g_synth), 0);
  assert_int_equal(env_reports(out, d1, ins1), 2);
  free(out);
  assert_true(d1[0] == d1[1]);
  assert_string_equal(ins1[0], "(unset)");
  assert_int_equal(sl_test_run(&out, "env -u SHARDLOAD_INSECURE_RENDEZVOUS SHARDLOAD_TEST_REPORT_ENV=1 "
                               "%s load '%s' --nproc 2 --backend cpu --insecure-rendezvous",
                               hooks_bin(), g_synth), 0);
  assert_int_equal(env_reports(out, d2, ins2), 2);
  free(out);
  assert_true(d2[0] == d2[1]);
  assert_true(d2[0] != d1[0]); /* a new job, a new secret */
  assert_string_equal(ins2[0], "1");
  assert_string_equal(ins2[1], "1");
  assert_no_children();
}

/* SIGTERM to the launcher while its ranks hang: it stops them, removes its private directory
 * and dies of the same signal. */
static void test_launcher_terminated(void **state) {
  char *errp = sl_test_path(g_dir, "term.err");
  const char *bin = hooks_bin(); /* before the fork: a failure here is the test's */
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    FILE *e = freopen(errp, "w", stderr);
    if (!e || !freopen("/dev/null", "w", stdout)) _exit(100);
    setenv("SHARDLOAD_TEST_FAIL_RANK", "2:hang", 1);
    execl(bin, "shardload", "load", g_synth, "--nproc", "3", "--backend", "cpu", "--timeout", "60",
          "-v", (char *)NULL);
    _exit(101);
  }
  /* wait for the pids, then for the data phase to start (rank 2 hangs there) */
  pid_t pids[8];
  int n = 0;
  char rdv[4096] = "";
  for (double t0 = now_s(); now_s() - t0 < 10.0 && (n < 3 || !rdv[0]);) {
    usleep(20 * 1000);
    char text[8192] = "";
    FILE *f = fopen(errp, "r");
    if (f) {
      text[fread(text, 1, sizeof text - 1, f)] = 0;
      fclose(f);
    }
    n = launched_pids(text, pids, 8);
    const char *r = strstr(text, "launch: rendezvous file://");
    if (r) sscanf(r, "launch: rendezvous file://%4095s", rdv);
  }
  assert_int_equal(n, 3);
  assert_true(rdv[0] != 0);
  usleep(500 * 1000);
  double t0 = now_s();
  assert_int_equal(kill(pid, SIGTERM), 0);
  int st = 0;
  pid_t w;
  while ((w = waitpid(pid, &st, WNOHANG)) == 0 && now_s() - t0 < 10.0) usleep(10 * 1000);
  if (w != pid) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    fail_msg("the launcher did not end within 10 s of SIGTERM");
  }
  assert_true(WIFSIGNALED(st));
  assert_int_equal(WTERMSIG(st), SIGTERM);
  assert_no_children();
  assert_gone(pids, 3);
  /* the private directory (holding the rendezvous) is gone */
  char *parent = strdup(rdv);
  *strrchr(parent, '/') = 0;
  struct stat sb;
  assert_int_not_equal(stat(parent, &sb), 0);
  free(parent);
  free(errp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matrix),
      cmocka_unit_test(test_cast_and_one_rank),
      cmocka_unit_test(test_many_small_tensors_every_rank),
      cmocka_unit_test(test_human_output),
      cmocka_unit_test(test_rank_reports_scale_with_json_only),
      cmocka_unit_test(test_report_escapes_paths),
      cmocka_unit_test(test_missing_file),
      cmocka_unit_test(test_rank_dies),
      cmocka_unit_test(test_dump_fails_on_one_rank),
      cmocka_unit_test(test_launcher_terminated),
      cmocka_unit_test(test_dump_agreed_across_ranks),
      cmocka_unit_test(test_unrelated_jobs_do_not_meet),
      cmocka_unit_test(test_plan_fails_on_one_rank),
      cmocka_unit_test(test_tampered_rank_report),
      cmocka_unit_test(test_usage_through_launcher),
      cmocka_unit_test(test_collective_through_launcher),
      cmocka_unit_test(test_launcher_secret_and_insecure_flag),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
