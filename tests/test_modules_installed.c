/* Installed modules (docs/DESIGN.md#modules, Names and What is opened when): backend "auto"
 * considers every libshardload-NAME.so of the search directories, not only a fixed list;
 * it tells a collective module (or a file that is no module, or a FIFO) by the entry symbols
 * the file defines, read without loading it, and never opens one as a backend; it looks at a
 * bounded number of files and says what it left; and the listing (sl_module_list, what
 * `shardload backends` prints) reports every module. Real shared objects built from
 * tests/modules/ into $SHARDLOAD_TEST_MODULES, planted by symbolic links. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#include "internal.h"
#include "module_scan.h"

static const char *moddir;

typedef struct logbuf {
  char text[32768];
} logbuf;

static void capture(void *user, sl_log_level level, const char *msg) {
  logbuf *lb = user;
  size_t used = strlen(lb->text);
  snprintf(lb->text + used, sizeof lb->text - used, "[%d] %s\n", (int)level, msg);
}

static sl_context *bare_ctx(sl_log_fn log, void *user) {
  sl_context *c = calloc(1, sizeof *c);
  assert_non_null(c);
  c->log = log;
  c->log_user = user;
  c->log_level = SL_LOG_INFO;
  c->world_size = 1;
  return c;
}

/* Backend "auto" through the registry, as a context selects it; the chosen module is closed
 * again. Returns the status and the name chosen into NAME. */
static sl_status run_auto(sl_context *c, char *name, size_t len) {
  const sl_backend_ops *ops = NULL;
  void *dl = NULL, *shim = NULL;
  char variant[16];
  name[0] = 0;
  sl_status st = sl__backend_select(c, "auto", &ops, &dl, &shim, variant, sizeof variant);
  if (st == SL_OK) {
    snprintf(name, len, "%s", ops->name);
    free(shim);
    if (dl) dlclose(dl);
  }
  return st;
}

static void plant(const char *dir, const char *as, const char *module) {
  char target[4200], link[4200];
  snprintf(target, sizeof target, "%s/libshardload-%s.so", moddir, module);
  snprintf(link, sizeof link, "%s/libshardload-%s.so", dir, as);
  assert_int_equal(symlink(target, link), 0);
}

static char *module_path(const char *dir, const char *name) {
  char file[64];
  snprintf(file, sizeof file, "libshardload-%s.so", name);
  return sl_test_path(dir, file);
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

/* ---- the entry symbols, read without loading -------------------------------------------------- */

/* What each kind of test module defines, and what is no module; a module read this way is not
 * opened (the trace module's constructor writes nothing). */
static void test_entry_symbols_read_without_loading(void **state) {
  char *dir = sl_test_dir("entries"), *trace = sl_test_path(dir, "trace"), why[256];
  setenv("SL_TEST_TRACE", trace, 1);
  static const struct {
    const char *module;
    unsigned bits;
  } want[] = {
      {"hostmem", SL__ENTRY_BACKEND_V2},
      {"dual", SL__ENTRY_BACKEND_V2 | SL__ENTRY_BACKEND_V1},
      {"v1host", SL__ENTRY_BACKEND_V1},
      {"plant", SL__ENTRY_COLLECTIVE_V2},
      {"tracebe", SL__ENTRY_BACKEND_V2},
      {"v1local", SL__ENTRY_COLLECTIVE_V1},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    char *p = module_path(moddir, want[i].module);
    unsigned got = sl__module_entries(p, why, sizeof why);
    if (got != want[i].bits) fail_msg("%s: entries %#x, expected %#x (%s)", p, got, want[i].bits, why);
    free(p);
  }
  assert_false(exists(trace)); /* plant and tracebe leave a trace when opened: neither was */
  unsetenv("SL_TEST_TRACE");

  char *text = sl_test_path(dir, "libshardload-text.so"), *fifo = sl_test_path(dir, "libshardload-fifo.so");
  char *sub = sl_test_path(dir, "libshardload-sub.so"), *none = sl_test_path(dir, "libshardload-none.so");
  assert_int_equal(sl_test_write_bytes(text, "not a module\n", 13), 0);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(mkdir(sub, 0700), 0);
  assert_int_equal(sl__module_entries(text, why, sizeof why), SL__ENTRY_UNKNOWN);
  assert_string_equal(why, "not an ELF file");
  assert_int_equal(sl__module_entries(fifo, why, sizeof why), SL__ENTRY_NOT_A_FILE); /* and it did not block */
  assert_string_equal(why, "is not a regular file");
  assert_int_equal(sl__module_entries(sub, why, sizeof why), SL__ENTRY_NOT_A_FILE);
  assert_int_equal(sl__module_entries(none, why, sizeof why), SL__ENTRY_NOT_A_FILE);
  assert_non_null(strstr(why, "No such file"));
  /* the library itself is an ELF shared object that defines no entry */
  const char *lib = getenv("SHARDLOAD_TEST_LIBRARY");
  if (lib && *lib) assert_int_equal(sl__module_entries(lib, why, sizeof why), 0);
  free(text);
  free(fifo);
  free(sub);
  free(none);
  free(trace);
  free(dir);
}

/* The reader trusts nothing in a file: a module cut short at every length, and with every byte
 * of its ELF header and of its section header table flipped in turn, reads as what it is or as
 * "cannot tell" (never a bit it does not define), and never reads out of bounds (ASan). */
static void test_entry_reader_survives_damaged_files(void **state) {
  char *src = module_path(moddir, "hostmem"), *dir = sl_test_dir("damaged"), why[256];
  char *dst = sl_test_path(dir, "libshardload-damaged.so");
  FILE *f = fopen(src, "rb");
  assert_non_null(f);
  static unsigned char orig[4 << 20], buf[4 << 20];
  size_t n = fread(orig, 1, sizeof orig, f);
  fclose(f);
  assert_true(n > sizeof(ElfW(Ehdr)) && n < sizeof orig);
  const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)orig;
  size_t shoff = (size_t)eh->e_shoff, shlen = (size_t)eh->e_shnum * sizeof(ElfW(Shdr));
  assert_true(shoff + shlen <= n);
  unsigned tried = 0, read_whole = 0;
  for (size_t len = 0; len < n; len += len < 256 ? 1 : 61) { /* cut short */
    assert_int_equal(sl_test_write_bytes(dst, orig, len), 0);
    unsigned got = sl__module_entries(dst, why, sizeof why);
    assert_true(got == SL__ENTRY_UNKNOWN || got == SL__ENTRY_BACKEND_V2);
    tried++;
  }
  /* every byte of the ELF header and the section headers, flipped */
  size_t spots[2][2] = {{0, sizeof(ElfW(Ehdr))}, {shoff, shoff + shlen}};
  for (int s = 0; s < 2; s++)
    for (size_t at = spots[s][0]; at < spots[s][1]; at++) {
      memcpy(buf, orig, n);
      buf[at] ^= 0xff;
      assert_int_equal(sl_test_write_bytes(dst, buf, n), 0);
      unsigned got = sl__module_entries(dst, why, sizeof why);
      assert_true(got == SL__ENTRY_UNKNOWN || got == SL__ENTRY_BACKEND_V2 || got == 0);
      read_whole += got == SL__ENTRY_BACKEND_V2;
      tried++;
    }
  fprintf(stderr, "%u damaged files read, %u of the flipped ones still as a backend\n", tried, read_whole);
  assert_true(read_whole > 0); /* a flip of a field the reader does not use changes nothing */
  free(dst);
  free(dir);
  free(src);
}

/* ---- backend auto over installed modules ------------------------------------------------------ */

/* Where each verdict line of auto starts in LOG, or NULL. */
static const char *verdict(const char *log, const char *name) {
  char key[96];
  snprintf(key, sizeof key, "backend auto: %s: ", name);
  return strstr(log, key);
}

/* An installed backend that the fixed list does not name is found and chosen when its probe is
 * the best; a collective module beside it is told by its entry symbol and never opened; a
 * backend that says no gives its reason; every candidate's verdict is logged at INFO, in probe
 * order: the fixed list, the installed ones in name order, the built-ins. */
static void test_auto_finds_installed_backends(void **state) {
  char *dir = sl_test_dir("installed"), *tdir = sl_test_dir("installed-trace");
  char *trace = sl_test_path(tdir, "trace");
  plant(dir, "zvendor", "zvendor"); /* probe 5: beats cpu's 1 */
  plant(dir, "plant", "plant");     /* a collective that leaves a trace when opened */
  plant(dir, "probeno", "probeno"); /* says no, and why */
  setenv("SHARDLOAD_MODULE_PATH", dir, 1);
  setenv("SL_TEST_TRACE", trace, 1);
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(capture, &lb);
  char name[64];
  assert_int_equal(run_auto(c, name, sizeof name), SL_OK);
  fprintf(stderr, "%s", lb.text);
  assert_string_equal(name, "zvendor");
  assert_false(exists(trace)); /* the collective was not opened */
  const char *order[] = {"cuda", "hip", "level_zero", "plant", "probeno", "cpu", "sim"};
  const char *prev = lb.text;
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    const char *at = verdict(lb.text, order[i]);
    if (!at || at < prev) fail_msg("no verdict for %s after the one before it:\n%s", order[i], lb.text);
    assert_memory_equal(at - 4, "[2] ", 4); /* INFO */
    prev = at;
  }
  assert_non_null(strstr(lb.text, "backend auto: plant: "));
  assert_non_null(strstr(lb.text, "libshardload-plant.so is a collective module (it exports a collective entry and "
                                  "no backend one): not a backend, not opened"));
  assert_non_null(strstr(lb.text, "backend auto: probeno: no widget on this machine"));
  assert_non_null(strstr(lb.text, "backend auto: cpu: usable (probe 1), zvendor probes 5"));
  assert_non_null(strstr(lb.text, "backend auto: chose zvendor (probe 5)"));
  assert_non_null(strstr(c->backend_reason, "zvendor: auto, cuda: "));
  assert_non_null(strstr(c->backend_reason, "; probeno: no widget"));
  /* a tie keeps the earlier: an installed backend that probes as cpu does is taken over it */
  char *zv = module_path(dir, "zvendor");
  unlink(zv);
  free(zv);
  plant(dir, "tracebe", "tracebe");
  lb.text[0] = 0;
  assert_int_equal(run_auto(c, name, sizeof name), SL_OK);
  assert_string_equal(name, "tracebe");
  assert_non_null(strstr(lb.text, "backend auto: cpu: usable (probe 1), tracebe probes 1"));
  assert_true(exists(trace)); /* the backend was opened, the collective still not */
  char buf[8192] = "";
  FILE *f = fopen(trace, "r");
  assert_non_null(f);
  size_t got = fread(buf, 1, sizeof buf - 1, f);
  buf[got] = 0;
  fclose(f);
  assert_non_null(strstr(buf, "libshardload-tracebe.so"));
  assert_null(strstr(buf, "libshardload-plant.so"));
  unsetenv("SL_TEST_TRACE");
  unsetenv("SHARDLOAD_MODULE_PATH");
  free(c);
  free(trace);
  free(tdir);
  free(dir);
}

/* A file named for a backend the fixed list knows that is a collective module is not opened
 * either, and that is worth a warning; a FIFO or a directory under a module's name is never
 * handed to the loader (a dlopen of a FIFO would wait for a writer for ever). In a child, so
 * that a wait would fail the test instead of hanging it. */
static int fifo_child(int rank, int world, void *arg) {
  logbuf *lb = calloc(1, sizeof *lb);
  sl_context *c = bare_ctx(capture, lb);
  char name[64];
  SL_CHILD_CHECK(run_auto(c, name, sizeof name) == SL_OK, "auto failed: %s", c->errmsg);
  fprintf(stderr, "%s", lb->text);
  SL_CHILD_CHECK(strcmp(name, "cpu") == 0, "auto chose %s", name);
  SL_CHILD_CHECK(strstr(lb->text, "[2] backend auto: afifo: ") != NULL, "no verdict for the FIFO");
  SL_CHILD_CHECK(strstr(lb->text, "libshardload-afifo.so is not a regular file: not a backend, not opened") != NULL,
                 "the FIFO's verdict");
  SL_CHILD_CHECK(strstr(lb->text, "libshardload-adir.so is not a regular file: not a backend, not opened") != NULL,
                 "the directory's verdict");
  SL_CHILD_CHECK(strstr(lb->text, "[1] backend auto: cuda: ") != NULL, "no warning for the collective named cuda");
  SL_CHILD_CHECK(strstr(lb->text, "libshardload-cuda.so is a collective module") != NULL, "cuda's verdict");
  return 0;
}

static void test_auto_opens_no_fifo_and_no_collective(void **state) {
  char *dir = sl_test_dir("fifo"), *tdir = sl_test_dir("fifo-trace"), *trace = sl_test_path(tdir, "trace");
  char *fifo = module_path(dir, "afifo"), *sub = module_path(dir, "adir");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(mkdir(sub, 0700), 0);
  plant(dir, "cuda", "tracenccl");
  setenv("SHARDLOAD_MODULE_PATH", dir, 1);
  setenv("SL_TEST_TRACE", trace, 1);
  int code = -1;
  assert_int_equal(sl_test_spawn(1, fifo_child, NULL, 60000, &code), 0); /* it did not hang */
  assert_int_equal(code, 0);
  assert_false(exists(trace));
  unsetenv("SL_TEST_TRACE");
  unsetenv("SHARDLOAD_MODULE_PATH");
  free(fifo);
  free(sub);
  free(trace);
  free(tdir);
  free(dir);
}

/* Counts auto's verdicts on the planted p* files and keeps the lines about bounds. */
typedef struct counted {
  int p_verdicts;
  char last_p[64];
  char bounds[1024];
  bool chose_cpu;
} counted;

static void count_log(void *user, sl_log_level level, const char *msg) {
  counted *k = user;
  if (!strncmp(msg, "backend auto: p", 15)) {
    k->p_verdicts++;
    snprintf(k->last_p, sizeof k->last_p, "%.*s", (int)strcspn(msg + 14, ":"), msg + 14);
  }
  if (strstr(msg, "not looked at")) snprintf(k->bounds, sizeof k->bounds, "[%d] %s", (int)level, msg);
  if (strstr(msg, "backend auto: chose cpu")) k->chose_cpu = true;
}

/* A directory of ten thousand module files: auto looks at the first 32 in name order (reading
 * their entry symbols), no more, and says how many it left and where it stopped; a backend
 * whose name sorts past them is not considered. It never loads any of the collectives. */
static void test_auto_bounds_installed_files(void **state) {
  char *dir = sl_test_dir("many");
  enum { FILES = 10000, CAP = 32 };
  char as[32];
  for (int i = 0; i < FILES; i++) {
    snprintf(as, sizeof as, "p%05d", i);
    plant(dir, as, "plant");
  }
  plant(dir, "zvendor", "zvendor");
  setenv("SHARDLOAD_MODULE_PATH", dir, 1);
  counted k = {0};
  sl_context *c = bare_ctx(count_log, &k);
  char name[64];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(run_auto(c, name, sizeof name), SL_OK);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  fprintf(stderr, "auto over %d files: %.3f s, %d verdicts on them, last %s\n%s\n", FILES + 1, s, k.p_verdicts,
          k.last_p, k.bounds);
  assert_string_equal(name, "cpu");
  assert_true(k.chose_cpu);
  assert_int_equal(k.p_verdicts, CAP);
  assert_string_equal(k.last_p, "p00031");
  char want[256];
  snprintf(want, sizeof want, "[1] backend auto: %d more installed module files not looked at: auto looks at %d "
           "besides cuda, hip and level_zero, in name order (the last: p00031)", FILES + 1 - CAP, CAP);
  if (!strstr(k.bounds, want)) fail_msg("the bound is not said: '%s'", k.bounds);
  assert_true(s < 60.0); /* a listing and 32 reads: seconds at most even on a loaded machine */
  unsetenv("SHARDLOAD_MODULE_PATH");
  free(c);
  free(dir);
}

/* Explicit backends open nothing that auto would: with modules of every kind installed, a
 * cpu or sim context opens none of them (the trace stays empty); auto opens the backend. */
static int ctx_child(int rank, int world, void *arg) {
  const char *backend = arg;
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = backend, .world_size = 1, .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  sl_status s = sl_context_create(&co, &ctx);
  SL_CHILD_CHECK(s == SL_OK, "%s: %s: %s", backend, sl_status_name(s), err);
  fprintf(stderr, "%s: %s (%s)\n", backend, sl_context_backend_name(ctx), sl_context_backend_reason(ctx));
  sl_context_destroy(ctx);
  return 0;
}

static void test_explicit_backends_open_no_installed_module(void **state) {
  char *dir = sl_test_dir("explicit"), *tdir = sl_test_dir("explicit-trace"), *trace = sl_test_path(tdir, "trace");
  plant(dir, "tracebe", "tracebe");
  plant(dir, "plant", "plant");
  setenv("SHARDLOAD_MODULE_PATH", dir, 1);
  setenv("SL_TEST_TRACE", trace, 1);
  const char *quiet[] = {"cpu", "sim", "sim:strict"};
  int code = -1;
  for (size_t i = 0; i < sizeof quiet / sizeof quiet[0]; i++) {
    assert_int_equal(sl_test_spawn(1, ctx_child, (void *)quiet[i], 60000, &code), 0);
    assert_int_equal(code, 0);
    if (exists(trace)) fail_msg("backend %s opened an installed module", quiet[i]);
  }
  assert_int_equal(sl_test_spawn(1, ctx_child, "auto", 60000, &code), 0);
  assert_int_equal(code, 0);
  assert_true(exists(trace));
  unsetenv("SL_TEST_TRACE");
  unsetenv("SHARDLOAD_MODULE_PATH");
  free(trace);
  free(tdir);
  free(dir);
}

/* ---- where auto looks: the search directories, never the working directory -------------------- */

static void copy_file(const char *from, const char *to) {
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  assert_non_null(in);
  assert_non_null(out);
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
  fclose(in);
  assert_int_equal(fclose(out), 0);
}

typedef struct cwd_job {
  const char *libdir, *cwd;
} cwd_job;

/* The library opened by a relative path from its own directory, then the process moves to CWD
 * and creates an auto context: auto's scan is of the library's directory as it was resolved at
 * load time, not of the directory the process is in. */
static int cwd_child(int rank, int world, void *arg) {
  const cwd_job *j = arg;
  SL_CHILD_CHECK(chdir(j->libdir) == 0, "chdir %s", j->libdir);
  void *lib = dlopen("./libshardload.so", RTLD_NOW | RTLD_LOCAL);
  SL_CHILD_CHECK(lib != NULL, "dlopen ./libshardload.so: %s", dlerror());
  typedef sl_status (*create_fn)(const sl_context_options *, sl_context **);
  typedef const char *(*name_fn)(const sl_context *);
  typedef void (*destroy_fn)(sl_context *);
  create_fn create = (create_fn)dlsym(lib, "sl_context_create");
  name_fn backend = (name_fn)dlsym(lib, "sl_context_backend_name");
  destroy_fn destroy = (destroy_fn)dlsym(lib, "sl_context_destroy");
  SL_CHILD_CHECK(create && backend && destroy, "the library lacks its entry points");
  SL_CHILD_CHECK(chdir(j->cwd) == 0, "chdir %s", j->cwd);
  char err[1024] = "";
  sl_context_options co = {.size = sizeof co, .backend = "auto", .world_size = 1, .errbuf = err,
                           .errbuf_size = sizeof err};
  sl_context *ctx = NULL;
  sl_status s = create(&co, &ctx);
  SL_CHILD_CHECK(s == SL_OK, "%s: %s", sl_status_name(s), err);
  SL_CHILD_CHECK(strcmp(backend(ctx), "tracebe") == 0, "auto chose %s", backend(ctx));
  destroy(ctx);
  return 0;
}

/* An installed backend next to the library is found (modules install beside libshardload.so);
 * backends planted in the working directory, under that name and under a name of their own,
 * are never opened (each copy of the trace module writes its real path into the trace). */
static void test_auto_scans_the_library_dir_not_the_cwd(void **state) {
  const char *lib = getenv("SHARDLOAD_TEST_LIBRARY");
  if (!lib || !*lib) fail_msg("SHARDLOAD_TEST_LIBRARY is not set (CTest sets it)");
  char *libdir = sl_test_dir("cwd-lib"), *cwd = sl_test_dir("cwd-cwd"), *tdir = sl_test_dir("cwd-trace");
  char *trace = sl_test_path(tdir, "trace"), *src = module_path(moddir, "tracebe");
  char *to = sl_test_path(libdir, "libshardload.so"), *in_lib = module_path(libdir, "tracebe");
  char *in_cwd = module_path(cwd, "tracebe"), *own_cwd = module_path(cwd, "cwdonly");
  copy_file(lib, to);
  copy_file(src, in_lib); /* copies, not links: each has a real path of its own */
  copy_file(src, in_cwd);
  copy_file(src, own_cwd);
  char real_lib[PATH_MAX], real_cwd[PATH_MAX], real_own[PATH_MAX];
  assert_non_null(realpath(in_lib, real_lib));
  assert_non_null(realpath(in_cwd, real_cwd));
  assert_non_null(realpath(own_cwd, real_own));
  unsetenv("SHARDLOAD_MODULE_PATH");
  setenv("SL_TEST_TRACE", trace, 1);
  cwd_job j = {libdir, cwd};
  int code = -1;
  assert_int_equal(sl_test_spawn(1, cwd_child, &j, 60000, &code), 0);
  assert_int_equal(code, 0);
  char buf[8192] = "";
  FILE *f = fopen(trace, "r");
  assert_non_null(f);
  size_t got = fread(buf, 1, sizeof buf - 1, f);
  buf[got] = 0;
  fclose(f);
  fprintf(stderr, "opened:\n%s", buf);
  assert_non_null(strstr(buf, real_lib)); /* next to the library */
  assert_null(strstr(buf, real_cwd));     /* never the working directory's */
  assert_null(strstr(buf, real_own));
  unsetenv("SL_TEST_TRACE");
  free(own_cwd);
  free(in_cwd);
  free(in_lib);
  free(to);
  free(src);
  free(trace);
  free(tdir);
  free(cwd);
  free(libdir);
}

/* ---- the listing (sl_module_list) ------------------------------------------------------------ */

static bool find(const sl_module_list *l, sl_module_kind kind, const char *name, sl_module_info *m) {
  for (size_t i = 0; i < sl_module_list_count(l); i++) {
    memset(m, 0, sizeof *m);
    m->size = sizeof *m;
    assert_int_equal(sl_module_list_get(l, i, m), SL_OK);
    if (m->kind == kind && !strcmp(m->name, name)) return true;
  }
  return false;
}

/* Every module with what it is: built in, loaded (path, ABI version, device), cannot run (the
 * probe's reason), refused (the file named), absent (a known name); a collective module and a
 * FIFO among the files, each listed as what it is; what auto would choose. */
static void test_module_list(void **state) {
  char *dir = sl_test_dir("list"), *fifo = module_path(dir, "afifo");
  plant(dir, "zvendor", "zvendor");
  plant(dir, "probeno", "probeno");
  plant(dir, "plant", "plant");
  plant(dir, "badabi", "badabi");
  plant(dir, "v1host", "v1host");
  plant(dir, "manydev", "manydev");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  setenv("SHARDLOAD_MODULE_PATH", dir, 1);
  logbuf lb = {{0}};
  sl_context *c = bare_ctx(capture, &lb);
  sl_module_list *l = NULL;
  assert_int_equal(sl_module_list_create(c, &l), SL_OK);
  assert_non_null(strstr(lb.text, "backend auto: chose zvendor")); /* auto's verdicts reach the logger */
  sl_module_info m;
  assert_true(find(l, SL_MODULE_BACKEND, "cpu", &m));
  assert_true(m.builtin && m.state == SL_MODULE_RUNS && m.abi_version == 2 && !m.path);
  assert_string_equal(m.device, "cpu (host memory)");
  assert_true(m.memory_bytes > 0);
  assert_true(m.device_count == 1 && m.devices_not_listed == 0); /* no count of its own: one device */
  assert_string_equal(m.devices[0], m.device);
  assert_true(find(l, SL_MODULE_BACKEND, "sim", &m));
  assert_true(m.state == SL_MODULE_RUNS && m.probe == 0);
  assert_non_null(strstr(m.reason, "sim: a simulated device for tests"));
  assert_non_null(strstr(m.device, "sim:0"));
  assert_true(m.device_count == 1 && m.devices_not_listed == 0); /* any ordinal it is given: one listed */
  assert_string_equal(m.devices[0], m.device);
  /* a module of 70 devices: the first SL_MODULE_DEVICES_MAX, each started on its ordinal, the one
   * that will not start with why, the rest counted */
  assert_true(find(l, SL_MODULE_BACKEND, "manydev", &m));
  assert_int_equal(m.state, SL_MODULE_RUNS);
  assert_int_equal(m.device_count, SL_MODULE_DEVICES_MAX);
  assert_int_equal(m.devices_not_listed, 70 - SL_MODULE_DEVICES_MAX);
  assert_string_equal(m.device, "manydev:0 (test device)");
  assert_string_equal(m.devices[0], m.device);
  assert_string_equal(m.devices[1], "manydev:1 (test device)");
  assert_non_null(strstr(m.devices[2], "manydev:2: cannot start: "));
  assert_non_null(strstr(m.devices[2], "manydev:2: this device does not start (test module)"));
  assert_string_equal(m.devices[SL_MODULE_DEVICES_MAX - 1], "manydev:63 (test device)");
  assert_true(find(l, SL_MODULE_BACKEND, "hip", &m));
  assert_true(m.state == SL_MODULE_ABSENT && !m.path && m.abi_version == 0);
  assert_non_null(strstr(m.reason, "hip: not available (libshardload-hip.so"));
  assert_true(find(l, SL_MODULE_BACKEND, "zvendor", &m));
  assert_true(!m.builtin && m.state == SL_MODULE_RUNS && m.probe == 5 && m.abi_version == 2);
  assert_non_null(strstr(m.path, "libshardload-zvendor.so"));
  assert_non_null(strstr(m.device, "zvendor"));
  assert_true(find(l, SL_MODULE_BACKEND, "v1host", &m));
  assert_true(m.state == SL_MODULE_RUNS && m.abi_version == 1);
  assert_true(find(l, SL_MODULE_BACKEND, "probeno", &m));
  assert_true(m.state == SL_MODULE_CANNOT_RUN && !m.device[0]);
  assert_true(m.device_count == 0 && !m.devices);
  assert_non_null(strstr(m.reason, "probeno: no widget on this machine"));
  assert_true(find(l, SL_MODULE_BACKEND, "badabi", &m));
  assert_true(m.state == SL_MODULE_BAD_ABI);
  assert_non_null(strstr(m.reason, "libshardload-badabi.so: its table says ABI version 99"));
  assert_non_null(m.path);
  assert_true(find(l, SL_MODULE_BACKEND, "afifo", &m));
  assert_true(m.state == SL_MODULE_UNLOADABLE);
  assert_non_null(strstr(m.reason, "is not a regular file: not opened"));
  assert_false(find(l, SL_MODULE_BACKEND, "plant", &m)); /* a collective, listed as one */
  assert_true(find(l, SL_MODULE_COLLECTIVE, "plant", &m));
  assert_true(m.state == SL_MODULE_RUNS && m.abi_version == 2 && (m.domains & SL_MEM_HOST));
  assert_string_equal(m.probed_with, "zvendor"); /* it moves host memory: probed with auto's backend */
  assert_true(find(l, SL_MODULE_COLLECTIVE, "simccl", &m));
  assert_true(m.builtin && m.state == SL_MODULE_RUNS && m.domains == SL_MEM_DEVICE);
  assert_string_equal(m.probed_with, "sim");
  assert_true(find(l, SL_MODULE_COLLECTIVE, "nccl", &m));
  assert_true(m.state == SL_MODULE_ABSENT);
  /* backends first, then collectives */
  sl_module_info first, last;
  first.size = last.size = sizeof first;
  assert_int_equal(sl_module_list_get(l, 0, &first), SL_OK);
  assert_int_equal(sl_module_list_get(l, sl_module_list_count(l) - 1, &last), SL_OK);
  assert_true(first.kind == SL_MODULE_BACKEND && !strcmp(first.name, "cpu") && last.kind == SL_MODULE_COLLECTIVE);
  sl_module_summary s = {.size = sizeof s};
  assert_int_equal(sl_module_list_summary(l, &s), SL_OK);
  assert_string_equal(s.auto_backend, "zvendor");
  assert_non_null(strstr(s.auto_backend_reason, "zvendor: auto, cuda: "));
  assert_string_equal(s.auto_collective, "shm"); /* zvendor stages through host memory (on one host) */
  assert_string_equal(s.auto_collective_one_rank, "local");
  assert_true(s.dir_count >= 1);
  assert_string_equal(s.dirs[0], dir);
  assert_int_equal(s.not_listed, 0);
  /* a caller's shorter struct is written within its size */
  unsigned char raw[sizeof(sl_module_info)];
  memset(raw, 0xa5, sizeof raw);
  size_t short_size = offsetof(sl_module_info, state) + sizeof(sl_module_state);
  memcpy(raw, &short_size, sizeof short_size);
  assert_int_equal(sl_module_list_get(l, 0, (sl_module_info *)raw), SL_OK);
  for (size_t i = short_size; i < sizeof raw; i++) assert_int_equal(raw[i], 0xa5);
  assert_int_equal(((sl_module_info *)raw)->kind, SL_MODULE_BACKEND);
  /* one compiled before the device list: everything up to it, nothing of it */
  short_size = offsetof(sl_module_info, device_count);
  memset(raw, 0xa5, sizeof raw);
  memcpy(raw, &short_size, sizeof short_size);
  assert_int_equal(sl_module_list_get(l, 0, (sl_module_info *)raw), SL_OK);
  for (size_t i = short_size; i < sizeof raw; i++) assert_int_equal(raw[i], 0xa5);
  assert_string_equal(((sl_module_info *)raw)->device, "cpu (host memory)");
  assert_int_equal(sl_module_list_get(l, sl_module_list_count(l), &m), SL_ERR_INVALID);
  assert_string_equal(sl_module_state_name(SL_MODULE_BAD_ABI), "bad_abi");
  assert_string_equal(sl_module_state_name((sl_module_state)77), "unknown");
  sl_module_list_destroy(l);
  sl_module_list_destroy(NULL);
  /* without a context too */
  assert_int_equal(sl_module_list_create(NULL, &l), SL_OK);
  assert_true(sl_module_list_count(l) > 10);
  sl_module_list_destroy(l);
  unsetenv("SHARDLOAD_MODULE_PATH");
  free(c);
  free(fifo);
  free(dir);
}

/* The Level Zero module over the test driver's three devices (tests/ze_driver): three
 * descriptions, ordinals 0, 1 and 2 with their distinct PCI addresses, DEVICE the first. A
 * process of its own (CTest's test_modules_installed_level_zero sets the driver and
 * SL_TEST_FILTER): the loader reads ZE_ENABLE_ALT_DRIVERS once, at its first zeInit. */
static void test_module_list_level_zero(void **state) {
  const char *mods = getenv("SHARDLOAD_LEVEL_ZERO_MODULES"), *alt = getenv("ZE_ENABLE_ALT_DRIVERS");
  if (!mods || !*mods || !alt || !*alt) skip(); /* no Level Zero module in this build */
  setenv("SHARDLOAD_MODULE_PATH", mods, 1);
  sl_module_list *l = NULL;
  assert_int_equal(sl_module_list_create(NULL, &l), SL_OK);
  sl_module_info m;
  assert_true(find(l, SL_MODULE_BACKEND, "level_zero", &m));
  if (m.state != SL_MODULE_RUNS) fail_msg("level_zero does not run over the test driver: %s", m.reason);
  assert_int_equal(m.device_count, 3);
  assert_int_equal(m.devices_not_listed, 0);
  assert_string_equal(m.devices[0], m.device);
  for (int i = 0; i < 3; i++) {
    char ord[32], pci[32];
    snprintf(ord, sizeof ord, "level_zero:%d ", i);
    snprintf(pci, sizeof pci, "PCI 0000:%02x:00.0;", 0x3a + i); /* the driver's bus 0x3a + index */
    if (strncmp(m.devices[i], ord, strlen(ord)) != 0 || !strstr(m.devices[i], pci))
      fail_msg("device %d: '%s', expected '%s...%s'", i, m.devices[i], ord, pci);
  }
  sl_module_list_destroy(l);
  unsetenv("SHARDLOAD_MODULE_PATH");
}

int main(void) {
  moddir = getenv("SHARDLOAD_TEST_MODULES");
  if (!moddir || !*moddir) {
    fprintf(stderr, "test_modules_installed: set SHARDLOAD_TEST_MODULES to the test modules' directory (CTest does)\n");
    return 2;
  }
  unsetenv("SHARDLOAD_MODULE_PATH");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_entry_symbols_read_without_loading),
      cmocka_unit_test(test_entry_reader_survives_damaged_files),
      cmocka_unit_test(test_auto_finds_installed_backends),
      cmocka_unit_test(test_auto_opens_no_fifo_and_no_collective),
      cmocka_unit_test(test_auto_bounds_installed_files),
      cmocka_unit_test(test_explicit_backends_open_no_installed_module),
      cmocka_unit_test(test_auto_scans_the_library_dir_not_the_cwd),
      cmocka_unit_test(test_module_list),
      cmocka_unit_test(test_module_list_level_zero),
  };
  if (getenv("SL_TEST_FILTER")) cmocka_set_test_filter(getenv("SL_TEST_FILTER"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
