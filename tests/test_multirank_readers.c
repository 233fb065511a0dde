/* Distributed readers (--source readers, docs/DESIGN.md#readers) through the command's own
 * launcher of local ranks: every case's --dump is byte for byte the same as the rank-0 load of
 * the same case (scatter and broadcast, HSDP with readers in both replicas, casts, CPU and
 * strict simulated-device placement, the device route over simccl, many small tensors in many
 * transfers), and the ranks' statistics show who read what: every checkpoint byte read once in
 * the job, by the readers only, in shares no larger than a fair share plus the largest tensor.
 * Ranks that look like ranks of two hosts (SHARDLOAD_TEST_HOST_TAGS, the tests' build of the
 * command) get one reader per host by default, each host's lowest rank. The tests over real
 * network namespaces, where a host that is no reader cannot see the checkpoint at all, are in
 * tests/multihost. */
#define _GNU_SOURCE
#include "cli_testlib.h"

#include <dirent.h>
#include <stdbool.h>
#include <sys/stat.h>

static char *g_dir;
static char *g_synth; /* 4 MiB in 2 shard files */
static char *g_many;  /* 1500 small tensors */
static char *g_files; /* 2 MiB in 8 shard files */

static const char *hooks_bin(void) {
  const char *b = getenv("SHARDLOAD_TEST_HOOKS_BIN");
  if (!b || !*b) fail_msg("SHARDLOAD_TEST_HOOKS_BIN is not set (CTest sets it to shardload-test-hooks)");
  return b;
}

static uint64_t jint(json_t *o, const char *a, const char *b) {
  json_t *v = json_object_get(o, a);
  if (b) v = json_object_get(v, b);
  if (!json_is_integer(v)) fail_msg("%s.%s is not an integer", a, b ? b : "");
  return (uint64_t)json_integer_value(v);
}

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return b;
}

/* The largest unit a share is made of (docs/DESIGN.md#readers): with at least 2R files, a whole
 * file's tensor bytes, else the largest tensor's; a share is within one unit of B/R. */
static uint64_t largest_unit(const char *path, int readers) {
  char *files[64];
  int n = 0;
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  if (S_ISDIR(sb.st_mode)) {
    DIR *d = opendir(path);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL && n < 64;)
      if (strstr(e->d_name, ".safetensors") && !strstr(e->d_name, ".json")) files[n++] = sl_test_path(path, e->d_name);
    closedir(d);
  } else {
    files[n++] = strdup(path);
  }
  uint64_t most = 0;
  for (int i = 0; i < n; i++) {
    st_file f;
    st_open(files[i], &f);
    if (n >= 2 * readers) {
      if (f.file_size - f.data_off > most) most = f.file_size - f.data_off;
    } else {
      size_t count;
      const char **names = st_names(&f, &count);
      for (size_t k = 0; k < count; k++) {
        st_tensor t;
        assert_int_equal(st_find(&f, names[k], &t), 0);
        if (t.end - t.begin > most) most = t.end - t.begin;
      }
      free(names);
    }
    st_close(&f);
    free(files[i]);
  }
  return most;
}

typedef struct rcase {
  const char *path;
  int world;
  const char *extra;     /* more options, the same for the reference and the readers load */
  int readers;           /* 0: one per host */
  const char *host_tags; /* SHARDLOAD_TEST_HOST_TAGS, or NULL: one host */
  const int *want_readers; /* the ranks that must read (-1 ends), or NULL: ranks 0..readers-1 */
} rcase;

/* Runs one load; returns its merged JSON report. */
static json_t *load(const rcase *c, const char *source, const char *dump) {
  char *jp = sl_test_path(g_dir, "report.json"), *out = NULL, cmd[4096];
  assert_int_equal(sl_test_run(&out, "rm -rf '%s'", dump), 0);
  free(out);
  char readers[32] = "";
  if (!strcmp(source, "readers") && c->readers) snprintf(readers, sizeof readers, "--readers %d", c->readers);
  snprintf(cmd, sizeof cmd, "%s%s%s %s load '%s' --nproc %d --source %s %s --timeout 60 --dump '%s' --json %s",
           c->host_tags ? "SHARDLOAD_TEST_HOST_TAGS=" : "", c->host_tags ? c->host_tags : "", c->host_tags ? "" : "",
           hooks_bin(), c->path, c->world, source, readers, dump, c->extra);
  int rc = run_to_file(jp, cmd);
  if (rc != 0) {
    sl_test_run(&out, "%s", cmd);
    fail_msg("%s exited %d: %s", cmd, rc, out ? out : "");
  }
  json_t *j = load_json_file(jp);
  free(jp);
  return j;
}

static void run_case(const rcase *c) {
  char *ref = sl_test_path(g_dir, "dump-rank0"), *dist = sl_test_path(g_dir, "dump-readers");
  json_t *jr = load(c, "rank0", ref), *jd = load(c, "readers", dist);
  assert_string_equal(json_string_value(json_object_get(jd, "source")), "readers");
  uint64_t ckpt = jint(jd, "checkpoint_bytes", NULL);
  json_t *rr = json_object_get(jr, "ranks"), *rd = json_object_get(jd, "ranks");
  assert_int_equal(json_array_size(rd), c->world);
  int is_reader[64] = {0}, nreaders = 0;
  if (c->want_readers)
    for (int i = 0; c->want_readers[i] >= 0; i++) is_reader[c->want_readers[i]] = 1, nreaders++;
  else
    for (int i = 0; i < c->readers; i++) is_reader[i] = 1, nreaders++;
  /* a share is balanced by bytes to within one tensor (or one file) */
  const uint64_t unit = largest_unit(c->path, nreaders);
  st_file f;
  uint64_t read_sum = 0;
  for (int r = 0; r < c->world; r++) {
    json_t *a = json_array_get(rr, (size_t)r), *b = json_array_get(rd, (size_t)r);
    uint64_t read = jint(b, "stats", "bytes_read");
    read_sum += read;
    if (!is_reader[r]) {
      assert_int_equal(read, 0);
      /* only a reader sends, but for the HSDP chain, where each replica passes its parts on */
      if (!strstr(c->extra, "--mesh")) assert_int_equal(jint(b, "stats", "bytes_sent"), 0);
    } else {
      assert_true(read > 0);
      if (read > ckpt / (uint64_t)nreaders + unit)
        fail_msg("rank %d read %llu bytes: more than a share of %llu plus a unit of %llu (%s)", r,
                 (unsigned long long)read, (unsigned long long)(ckpt / (uint64_t)nreaders), (unsigned long long)unit,
                 c->extra);
    }
    /* each rank ends with the same shards: the same bytes held */
    assert_int_equal(jint(a, "totals", "bytes"), jint(b, "totals", "bytes"));
    char name[32];
    snprintf(name, sizeof name, "rank-%d.safetensors", r);
    char *pa = sl_test_path(ref, name), *pb = sl_test_path(dist, name);
    size_t na, nb;
    unsigned char *ba = slurp(pa, &na), *bb = slurp(pb, &nb);
    if (na != nb || memcmp(ba, bb, na) != 0)
      fail_msg("rank %d: the readers' dump %s differs from the rank-0 load's %s (%s)", r, pb, pa, c->extra);
    /* and is a valid checkpoint of its own */
    st_open(pb, &f);
    st_check_valid(&f);
    st_close(&f);
    free(ba), free(bb), free(pa), free(pb);
  }
  assert_int_equal(read_sum, ckpt); /* every byte read once in the job */
  /* over a collective with scatterv_group (gloo, hier) the readers' transfers move in rounds,
   * every rank taking part in each; never in rank-0 mode, nor for broadcasts or the HSDP chain */
  const char *coll = json_string_value(json_object_get(json_object_get(jd, "collective"), "name"));
  assert_non_null(coll);
  bool grouped = (!strcmp(coll, "gloo") || !strcmp(coll, "hier")) && !strstr(c->extra, "--strategy broadcast") &&
                 !strstr(c->extra, "--mesh") && nreaders > 1;
  for (int r = 0; r < c->world; r++) {
    uint64_t rounds = jint(json_array_get(rd, (size_t)r), "stats", "rounds");
    assert_int_equal(jint(json_array_get(rr, (size_t)r), "stats", "rounds"), 0);
    if ((rounds > 0) != grouped)
      fail_msg("rank %d ran %llu rounds of the readers' transfers (%s)", r, (unsigned long long)rounds, c->extra);
  }
  /* the launcher's merged report says so too */
  assert_int_equal(jint(jd, "ranks_that_read", NULL), nreaders);
  assert_int_equal(jint(jr, "ranks_that_read", NULL), 1);
  assert_int_equal(jint(jr, "max_rank_bytes_read", NULL), ckpt);
  assert_true(jint(jd, "max_rank_bytes_read", NULL) <= ckpt / (uint64_t)nreaders + unit);
  json_decref(jr);
  json_decref(jd);
  free(ref);
  free(dist);
}

static int setup(void **state) {
  g_dir = sl_test_dir("readers");
  g_synth = sl_test_path(g_dir, "synth");
  g_many = sl_test_path(g_dir, "many.safetensors");
  g_files = sl_test_path(g_dir, "files");
  char *out = NULL;
  int rc = sl_test_run(&out, "rm -rf '%s' '%s' && %s synth '%s' --size 4MiB --shards 2 && %s synth '%s' --size 3MiB "
                       "--tensors 1500 --seed 7 && %s synth '%s' --size 2MiB --shards 8 --seed 3",
                       g_synth, g_files, sl_test_bin(), g_synth, sl_test_bin(), g_many, sl_test_bin(), g_files);
  if (rc != 0) fprintf(stderr, "%s\n", out ? out : "");
  free(out);
  return rc;
}

static int teardown(void **state) {
  free(g_synth);
  free(g_many);
  free(g_files);
  free(g_dir);
  return 0;
}

/* Worlds 2 to 4, two to four readers, both strategies, a cast, CPU placement. */
static void test_matrix(void **state) {
  static const rcase cases[] = {
      {NULL, 2, "--backend cpu --staging 256K", 2, NULL, NULL},
      {NULL, 4, "--backend cpu --staging 256K", 2, NULL, NULL},
      {NULL, 4, "--backend cpu --staging 256K", 3, NULL, NULL},
      {NULL, 4, "--backend cpu --staging 256K --strategy broadcast", 4, NULL, NULL},
      {NULL, 3, "--backend cpu --staging 256K --param-dtype F64", 3, NULL, NULL},
      {NULL, 4, "--backend cpu --staging 256K --replicate '*norm*' --param-dtype F16", 4, NULL, NULL},
      /* Gloo: in rounds, one group op for the transfers of every reader in turn */
      {NULL, 2, "--backend cpu --staging 256K --collective gloo", 2, NULL, NULL},
      {NULL, 4, "--backend cpu --staging 256K --collective gloo", 4, NULL, NULL},
      {NULL, 4, "--backend cpu --staging 256K --collective gloo", 3, NULL, NULL},
      {NULL, 3, "--backend cpu --staging 256K --collective gloo --param-dtype F64", 3, NULL, NULL},
      {NULL, 4, "--backend cpu --staging 256K --collective gloo --strategy broadcast", 2, NULL, NULL},
      {NULL, 4, "--backend cpu --staging 256K --collective gloo --replicate '*norm*' --param-dtype BF16", 4, NULL, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    rcase c = cases[i];
    c.path = g_synth;
    run_case(&c);
  }
}

/* HSDP 2x2: readers in both replicas, so a root scatters within its own replica and the chain
 * carries its parts up as well as down; 3x2 on three hosts: the middle replica's reader sends
 * both ways at once. */
static void test_hsdp(void **state) {
  static const int all[] = {0, 1, 2, 3, -1}, upper[] = {0, 2, -1}, three[] = {0, 2, 4, -1};
  rcase a = {g_synth, 4, "--backend cpu --staging 256K --mesh 2x2 --placement '[replicate, shard(0)]'", 4, NULL, all};
  run_case(&a);
  /* two hosts of two ranks (replica 0 on host a, replica 1 on host b): one reader each */
  rcase b = {g_synth, 4, "--backend cpu --staging 256K --mesh 2x2 --placement '[replicate, shard(0)]'", 0, "a,a,b,b",
             upper};
  run_case(&b);
  rcase c = {g_synth, 6, "--backend cpu --staging 256K --mesh 3x2 --placement '[replicate, shard(0)]'", 0,
             "a,a,b,b,c,c", three};
  run_case(&c);
}

/* Eight files: shares by whole files (at least 2R files), for two and four readers. */
static void test_shares_by_file(void **state) {
  rcase a = {g_files, 4, "--backend cpu --staging 256K", 2, NULL, NULL};
  run_case(&a);
  rcase b = {g_files, 4, "--backend cpu --staging 256K", 4, NULL, NULL};
  run_case(&b);
}

/* Placement on a simulated device: host staging to device shards, and the device route
 * (every rank on sim: the simccl collective moves device memory, each root copies its share
 * up and scatters it from there). */
static void test_device(void **state) {
  rcase a = {g_synth, 4, "--backend sim:strict --cpu-offload off --staging 256K", 3, NULL, NULL};
  run_case(&a);
  rcase b = {g_synth, 2, "--backend sim:strict --cpu-offload on --staging 256K --param-dtype F32", 2, NULL, NULL};
  run_case(&b);
  /* host staging over Gloo in rounds to device shards, with a cast on the way */
  rcase g = {g_synth, 4, "--backend sim:strict --cpu-offload off --staging 256K --collective gloo --param-dtype F16", 4,
             NULL, NULL};
  run_case(&g);
}

/* One reader per host by default, the lowest rank of each (hosts a: 0, 2; b: 1, 3), under
 * the hier collective; and --readers 3 then takes host a's next rank. */
static void test_one_reader_per_host(void **state) {
  static const int per_host[] = {0, 1, -1}, three[] = {0, 1, 2, -1};
  rcase a = {g_synth, 4, "--backend cpu --staging 256K", 0, "a,b,a,b", per_host};
  run_case(&a);
  rcase b = {g_synth, 4, "--backend cpu --staging 256K", 3, "a,b,a,b", three};
  run_case(&b);
}

/* 1500 tensors of 2 KiB in many transfers (64 KiB of staging): the readers' transfers taken in
 * turn, each reader's share read front to back. */
static void test_many_small_tensors(void **state) {
  rcase a = {g_many, 3, "--backend cpu --staging 64K", 3, NULL, NULL};
  run_case(&a);
  rcase b = {g_many, 4, "--backend cpu --staging 64K --strategy broadcast", 2, NULL, NULL};
  run_case(&b);
  rcase g = {g_many, 4, "--backend cpu --staging 64K --collective gloo", 4, NULL, NULL};
  run_case(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matrix),
      cmocka_unit_test(test_hsdp),
      cmocka_unit_test(test_shares_by_file),
      cmocka_unit_test(test_device),
      cmocka_unit_test(test_one_reader_per_host),
      cmocka_unit_test(test_many_small_tensors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
