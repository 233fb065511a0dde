/* shardload load --nproc N: N ranks on this host, as torchrun --nproc-per-node would start
 * them, with the launcher's embedded defaults: a private rendezvous directory (removed at the
 * end) and Gloo over loopback.
 *
 * The launcher forks before it creates any thread or library context (Gloo's threads and
 * locks do not survive a fork), so each rank starts from a clean single-threaded copy and runs
 * cli_load_rank() with an explicit rank, world and rendezvous. A rank writes its JSON report
 * (and, with --verbose, its per-tensor table) to a file in the private directory and its
 * stderr to another; the launcher reads them only after every rank has ended. The report it
 * parses is a summary (totals, stats and a few placement groups, no entry per tensor): its table
 * needs no more, and tens of thousands of tensors must not cost a JSON document of megabytes
 * written, read and parsed per rank. With --json a rank also writes its whole report, which the
 * launcher copies into the merged one as it is.
 *
 * Failure: the first rank to fail (non-zero exit or a signal) decides the outcome. The others
 * are asked to stop (SIGTERM) and killed after a grace period, so a rank stuck in a
 * collective never outlives the launcher; the failed rank's one error line is printed. Ranks
 * also die with the launcher (PR_SET_PDEATHSIG), and a SIGINT/SIGTERM/SIGHUP to the launcher
 * stops them before it dies of the same signal. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* header-only: the command links only the public library, which does not export xxhash */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cli.h"

#define STOP_GRACE_S 2.0 /* SIGTERM, then SIGKILL after this */
#define POLL_S 0.1       /* longest sleep of the wait loop */
#define BLAME_WAIT_S 1.0 /* how long a rank that blames another waits for that one's own line */
#define LAUNCH_TOKEN_BYTES 32 /* the per-job rendezvous secret */

typedef struct rank_proc {
  pid_t pid;  /* 0: not started, or reaped */
  int status; /* waitpid status once reaped */
  int ended;
  char json_path[PATH_MAX], err_path[PATH_MAX], table_path[PATH_MAX], full_path[PATH_MAX];
} rank_proc;

typedef struct launch {
  const cli_load_args *a;
  int n;
  pid_t self;
  char dir[PATH_MAX - 64]; /* the private directory: room for the names inside */
  char rdv[PATH_MAX + 16]; /* file://DIR/rendezvous */
  rank_proc *ranks;
  char token[2 * LAUNCH_TOKEN_BYTES + 1]; /* the job's secret, hex: SHARDLOAD_TOKEN of every rank */
  sigset_t old_mask;
  int alive;
  int first_failed; /* rank, or -1 */
  int first_blames; /* first_failed's line blames another rank (SL_ERR_PEER) */
  double blame_until; /* till then a rank with its own cause may replace a blaming first_failed */
  int got_signal;   /* a stop signal the launcher received, or 0 */
  double wall;
} launch;

/* ---- the private directory ---------------------------------------------------------------- */

static int make_private_dir(launch *L) {
  const char *base = getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  if ((size_t)snprintf(L->dir, sizeof L->dir, "%s/shardload-XXXXXX", base) >= sizeof L->dir) {
    L->dir[0] = 0;
    cli_error(base, SL_ERR_INVALID, "TMPDIR is too long; set TMPDIR to a shorter path");
    return -1;
  }
  if (!mkdtemp(L->dir)) {
    L->dir[0] = 0;
    cli_error(base, SL_ERR_IO, "cannot create a private directory for the ranks: %s; set TMPDIR to a "
              "writable directory", strerror(errno));
    return -1;
  }
  char rd[PATH_MAX];
  snprintf(rd, sizeof rd, "%s/rendezvous", L->dir);
  if (mkdir(rd, 0700) != 0) {
    cli_error(rd, SL_ERR_IO, "cannot create the rendezvous directory: %s", strerror(errno));
    return -1;
  }
  snprintf(L->rdv, sizeof L->rdv, "file://%s", rd);
  for (int r = 0; r < L->n; r++) {
    rank_proc *p = &L->ranks[r];
    snprintf(p->json_path, sizeof p->json_path, "%s/rank-%d.json", L->dir, r);
    snprintf(p->err_path, sizeof p->err_path, "%s/rank-%d.err", L->dir, r);
    snprintf(p->table_path, sizeof p->table_path, "%s/rank-%d.txt", L->dir, r);
    snprintf(p->full_path, sizeof p->full_path, "%s/rank-%d.full.json", L->dir, r);
  }
  return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  remove(path);
  return 0; /* keep going: remove what can be removed */
}

static void remove_private_dir(launch *L) {
  if (L->dir[0]) nftw(L->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- one rank ------------------------------------------------------------------------------- */

static void run_rank(launch *L, int r) __attribute__((noreturn));
static void run_rank(launch *L, int r) {
  rank_proc *p = &L->ranks[r];
  sigprocmask(SIG_SETMASK, &L->old_mask, NULL);
  /* die with the launcher, even when it is SIGKILLed; it may already be gone */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != L->self) _exit(CLI_EXIT_ERROR);

  int fd = open(p->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) _exit(CLI_EXIT_ERROR);
  /* stdout too: anything a rank prints outside its report ends up with its errors */
  if (dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0) _exit(CLI_EXIT_ERROR);
  close(fd);
  /* nor may a rank keep the launcher's stdout open: a reader of it waits for the launcher's
   * end, not for a straggling rank's */
  cli_drop_report();
  static char tag[32];
  snprintf(tag, sizeof tag, "rank %d: ", r);
  cli_set_error_tag(tag);

  FILE *out = fopen(p->json_path, "w"), *table = NULL, *full = NULL;
  if (!out || (L->a->verbose && !(table = fopen(p->table_path, "w"))) ||
      (L->a->json && !(full = fopen(p->full_path, "w")))) {
    cli_error(L->dir, SL_ERR_IO, "cannot write the rank's report: %s", strerror(errno));
    _exit(CLI_EXIT_ERROR);
  }
  /* the job's secret: the rendezvous store admits only ranks that hold it (collectives/gloo) */
  if (setenv("SHARDLOAD_TOKEN", L->token, 1) != 0) {
    cli_error(L->dir, SL_ERR_NOMEM, "cannot set SHARDLOAD_TOKEN: %s", strerror(errno));
    _exit(CLI_EXIT_ERROR);
  }
  /* the ranks of this node, as torchrun says it (sl_backend_init.local_world_size) */
  char lws[16];
  snprintf(lws, sizeof lws, "%d", L->n);
  if (setenv("LOCAL_WORLD_SIZE", lws, 1) != 0) {
    cli_error(L->dir, SL_ERR_NOMEM, "cannot set LOCAL_WORLD_SIZE: %s", strerror(errno));
    _exit(CLI_EXIT_ERROR);
  }
  /* Gloo over loopback unless the user chose an address or interface */
  if (!getenv("SHARDLOAD_GLOO_IFNAME")) setenv("SHARDLOAD_GLOO_IFACE_ADDR", "127.0.0.1", 0);

  cli_load_args a = *L->a;
  a.rank = r;
  a.world_size = L->n;
  a.local_rank = r;
  a.rendezvous = L->rdv;
  a.json = 1;
  a.report_summary = 1; /* what the launcher reads; the whole report only for --json, to copy */
  a.full_out = full;
  a.full_out_name = p->full_path;
  a.progress = 0;
  a.nproc = 0;
  a.table_out = table;
  a.table_out_name = p->table_path;
  a.test_hooks = 1;
  cli_hook_rank_start(r);
  int rc = cli_load_rank(&a, out, p->json_path);
  if (fclose(out) != 0 && rc == CLI_EXIT_OK) {
    cli_error(p->json_path, SL_ERR_IO, "cannot write the rank's report: %s", strerror(errno));
    rc = CLI_EXIT_ERROR;
  }
  if (full && fclose(full) != 0 && rc == CLI_EXIT_OK) {
    cli_error(p->full_path, SL_ERR_IO, "cannot write the rank's report: %s", strerror(errno));
    rc = CLI_EXIT_ERROR;
  }
  if (table) fclose(table);
  fflush(NULL);
  cli_hook_rank_exit(r, p->json_path, full ? p->full_path : NULL);
  /* _exit: no atexit handlers or static destructors of the launcher's copy */
  _exit(rc);
}

/* ---- waiting, stopping ---------------------------------------------------------------------- */

static void signal_alive(launch *L, int sig) {
  for (int r = 0; r < L->n; r++)
    if (L->ranks[r].pid > 0 && !L->ranks[r].ended) kill(L->ranks[r].pid, sig);
}

static int rank_failed(const rank_proc *p) {
  return p->ended && !(WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0);
}

/* The rank's one-line error ("shardload: ...") from its stderr, or "" when it printed none. */
static void error_line_of(const rank_proc *p, char *buf, size_t len) {
  buf[0] = 0;
  FILE *f = fopen(p->err_path, "r");
  if (!f) return;
  char line[4096];
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "shardload: ", 11)) snprintf(buf, len, "%s", line);
  fclose(f);
}

/* Reaps every rank that has ended. The first failure decides the outcome: a rank that blames
 * another (SL_ERR_PEER) is the consequence, not the cause, so it is chosen only when nothing
 * else failed in the same round or within BLAME_WAIT_S after it (the rank with the cause may
 * simply exit later: both learn of the failure at the same agreement). */
static void reap(launch *L) {
  int pick = -1, pick_is_peer = 1;
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (int r = 0; r < L->n; r++) {
      rank_proc *p = &L->ranks[r];
      if (p->pid != pid || p->ended) continue;
      p->ended = 1;
      p->status = status;
      L->alive--;
      if (L->got_signal || !rank_failed(p)) break;
      if (L->first_failed >= 0 && !(L->first_blames && cli_now() < L->blame_until)) break;
      char line[4096];
      error_line_of(p, line, sizeof line);
      int peer = strstr(line, sl_status_name(SL_ERR_PEER)) != NULL;
      if (L->first_failed >= 0 && peer) break; /* still only a blame */
      if (pick < 0 || (pick_is_peer && !peer)) {
        pick = r;
        pick_is_peer = peer;
      }
      break;
    }
  }
  if (pick < 0) return;
  if (L->first_failed < 0) L->blame_until = cli_now() + BLAME_WAIT_S;
  L->first_failed = pick;
  L->first_blames = pick_is_peer;
}

/* Whether to stop the ranks still alive: after a stop signal, or once the first failure is
 * known to be the cause (or its blame has waited long enough for the cause to show). */
static int should_stop(const launch *L, double now) {
  return L->got_signal || (L->first_failed >= 0 && !(L->first_blames && now < L->blame_until));
}

/* Waits for every rank; from the first failure (or a stop signal to the launcher) on, stops
 * the rest: SIGTERM, then SIGKILL after the grace period. */
static void wait_ranks(launch *L, double t0) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigset_t stop_set = set;
  sigdelset(&stop_set, SIGCHLD);
  double stop_at = -1;
  int killed = 0;
  for (;;) {
    /* a signal to the launcher first: a terminal's ^C also reaches the ranks, and their
     * deaths by it are not failures */
    struct timespec zero = {0, 0};
    int sig = sigtimedwait(&stop_set, NULL, &zero);
    if (sig > 0 && !L->got_signal) L->got_signal = sig;
    reap(L);
    if (L->alive == 0) break;
    double now = cli_now();
    if (stop_at < 0 && should_stop(L, now)) {
      signal_alive(L, SIGTERM);
      stop_at = now;
    }
    if (stop_at >= 0 && !killed && now - stop_at >= STOP_GRACE_S) {
      signal_alive(L, SIGKILL);
      killed = 1;
    }
    double wait_s = POLL_S;
    if (stop_at >= 0 && !killed && STOP_GRACE_S - (now - stop_at) < wait_s)
      wait_s = STOP_GRACE_S - (now - stop_at);
    if (wait_s < 0.001) wait_s = 0.001;
    struct timespec to = {(time_t)wait_s, (long)((wait_s - (double)(time_t)wait_s) * 1e9)};
    sig = sigtimedwait(&set, NULL, &to);
    if ((sig == SIGINT || sig == SIGTERM || sig == SIGHUP) && !L->got_signal) L->got_signal = sig;
  }
  L->wall = cli_now() - t0;
}

/* ---- reports --------------------------------------------------------------------------------- */

/* Relays what ranks printed on stderr besides their report (warnings), each line tagged. */
static void relay_stderr(const launch *L, int skip_rank) {
  for (int r = 0; r < L->n; r++) {
    if (r == skip_rank) continue;
    FILE *f = fopen(L->ranks[r].err_path, "r");
    if (!f) continue;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
      size_t len = strlen(line);
      fprintf(stderr, "rank %d: %s%s", r, line, len && line[len - 1] == '\n' ? "" : "\n");
    }
    fclose(f);
  }
}

/* The line to print for the failure: the first failed rank's, unless that one only blames
 * another rank (SL_ERR_PEER: it ended first but is the consequence) and a rank that failed on
 * its own left a line. Returns the exit status: a usage error stays a usage error (2). */
static int print_failure(const launch *L) {
  int r = L->first_failed;
  char line[4096];
  error_line_of(&L->ranks[r], line, sizeof line);
  if (!line[0] || strstr(line, sl_status_name(SL_ERR_PEER))) {
    char other[4096];
    for (int k = 0; k < L->n; k++) {
      if (k == r || !rank_failed(&L->ranks[k]) || !WIFEXITED(L->ranks[k].status)) continue;
      error_line_of(&L->ranks[k], other, sizeof other);
      if (other[0] && !strstr(other, sl_status_name(SL_ERR_PEER))) {
        r = k;
        memcpy(line, other, sizeof line);
        break;
      }
    }
  }
  const rank_proc *p = &L->ranks[r];
  if (line[0]) {
    size_t len = strlen(line);
    fprintf(stderr, "%s%s", line, len && line[len - 1] == '\n' ? "" : "\n");
  } else if (WIFSIGNALED(p->status)) {
    cli_error(L->a->path, SL_ERR_PEER, "rank %d: killed by signal %d (%s) before it reported an error",
              r, WTERMSIG(p->status), strsignal(WTERMSIG(p->status)));
  } else {
    cli_error(L->a->path, SL_ERR_PEER, "rank %d: exited with status %d without an error message", r,
              WEXITSTATUS(p->status));
  }
  return WIFEXITED(p->status) && WEXITSTATUS(p->status) == CLI_EXIT_USAGE ? CLI_EXIT_USAGE : CLI_EXIT_ERROR;
}

static uint64_t jget_u64(json_t *o, const char *k1, const char *k2) {
  json_t *v = json_object_get(o, k1);
  if (k2) v = json_object_get(v, k2);
  return json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
}

static double jget_real(json_t *o, const char *k1, const char *k2) {
  json_t *v = json_object_get(json_object_get(o, k1), k2);
  return json_is_number(v) ? json_number_value(v) : 0.0;
}

static const char *jget_str(json_t *o, const char *k) {
  const char *s = json_string_value(json_object_get(o, k));
  return s ? s : "?";
}

/* O[K1][K2] as a string ("?" when absent). */
static const char *jget_str2(json_t *o, const char *k1, const char *k2) {
  return jget_str(json_object_get(o, k1), k2);
}

/* '97 x cpu by rule "cpu_offload=on"' for each (placement, rule) the rank's tensors used: its
 * report's "placements" (cmd_load.c), in the order of their first tensor. */
static void placement_summary(json_t *rank, char *buf, size_t len) {
  json_t *groups = json_object_get(rank, "placements");
  size_t n = json_array_size(groups), used = 0;
  buf[0] = 0;
  for (size_t i = 0; i < n && used < len; i++) {
    json_t *g = json_array_get(groups, i);
    uint64_t count = jget_u64(g, "tensors", NULL), pinned = jget_u64(g, "pinned", NULL);
    used += (size_t)snprintf(buf + used, len - used, "%s%llu x %s by rule \"%s\"", used ? ", " : "",
                             (unsigned long long)count, jget_str(g, "placement"), jget_str(g, "rule"));
    if (pinned && used < len) used += (size_t)snprintf(buf + used, len - used, " (%llu pinned)", (unsigned long long)pinned);
  }
  if (!n) snprintf(buf, len, "no tensors");
}

static void print_table_file(cli_out *o, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return;
  char buf[8192];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, f)) > 0 && cli_out_write(o, buf, k) == 0) continue;
  fclose(f);
  cli_out_puts(o, "\n");
}

/* The merged table. Every write goes through O, which keeps the first failure (the caller
 * flushes and reports it). */
static void spread(const launch *L, json_t **reports, int *readers, uint64_t *read_max, uint64_t *sent_max);

static void print_human(cli_out *o, const launch *L, json_t **reports, uint64_t ckpt) {
  char h1[32], h2[32], h3[32], h4[32], h5[32], pls[1024];
  json_t *r0 = reports[0];
  if (L->a->verbose)
    for (int r = 0; r < L->n; r++) print_table_file(o, L->ranks[r].table_path);
  cli_out_puts(o, "load ");
  cli_out_escaped(o, L->a->path, 0); /* the user's path: any bytes */
  cli_out_printf(o, ": %d local ranks, backend %s, collective %s, strategy %s, source %s\n", L->n,
                 jget_str(r0, "backend"), jget_str2(r0, "collective", "name"), jget_str(r0, "strategy"),
                 jget_str(r0, "source"));
  /* every rank agreed on it, so rank 0's reason is the job's */
  cli_out_printf(o, "backend: %s\n", jget_str(r0, "backend_reason"));
  cli_out_printf(o, "collective: %s\n", jget_str2(r0, "collective", "reason"));
  for (int r = 0; r < L->n; r++) {
    json_t *j = reports[r];
    placement_summary(j, pls, sizeof pls);
    cli_out_printf(o, "rank %d: %llu tensors, %s on %s; %s; read %s, sent %s, received %s; %.3f s; peak RSS %s\n", r,
                   (unsigned long long)jget_u64(j, "totals", "tensors"),
                   cli_human_bytes(h1, sizeof h1, jget_u64(j, "totals", "bytes")), jget_str(j, "device"), pls,
                   cli_human_bytes(h2, sizeof h2, jget_u64(j, "stats", "bytes_read")),
                   cli_human_bytes(h3, sizeof h3, jget_u64(j, "stats", "bytes_sent")),
                   cli_human_bytes(h4, sizeof h4, jget_u64(j, "stats", "bytes_received")),
                   jget_real(j, "totals", "seconds"),
                   cli_human_bytes(h5, sizeof h5, jget_u64(j, "stats", "peak_rss_bytes")));
  }
  uint64_t sent0 = jget_u64(r0, "stats", "bytes_sent"), read_max, sent_max;
  int readers;
  spread(L, reports, &readers, &read_max, &sent_max);
  cli_out_printf(o,
                 "total: checkpoint %s on %d ranks in %.3f s wall (%.2f GB/s); rank 0 sent %.3f x the checkpoint "
                 "bytes\n",
                 cli_human_bytes(h1, sizeof h1, ckpt), L->n, L->wall, L->wall > 0 ? (double)ckpt / L->wall / 1e9 : 0.0,
                 ckpt ? (double)sent0 / (double)ckpt : 0.0);
  if (!strcmp(jget_str(r0, "source"), "readers")) {
    /* every rank takes part in every round: rank 0's count is the job's */
    uint64_t rounds = jget_u64(r0, "stats", "rounds");
    cli_out_printf(o, "readers: %d ranks read, the most one read %.3f x the checkpoint bytes and the most one sent %.3f x",
                   readers, ckpt ? (double)read_max / (double)ckpt : 0.0, ckpt ? (double)sent_max / (double)ckpt : 0.0);
    /* none: a collective without scatterv_group, broadcasts, HSDP (docs/DESIGN.md#readers) */
    if (rounds) cli_out_printf(o, "; %llu rounds sent several readers' transfers at once", (unsigned long long)rounds);
    else if (readers > 1) cli_out_puts(o, "; their transfers moved one at a time");
    cli_out_puts(o, "\n");
  }
  if (L->a->dump_dir) {
    cli_out_puts(o, "dump: ");
    cli_out_escaped(o, L->a->dump_dir, 0);
    cli_out_puts(o, "/rank-<r>.safetensors\n");
  }
}

/* Across the ranks' reports: how many read from storage, the most one read and the most one
 * sent (distributed readers spread both; rank-0 reads put both on rank 0). */
static void spread(const launch *L, json_t **reports, int *readers, uint64_t *read_max, uint64_t *sent_max) {
  *readers = 0;
  *read_max = *sent_max = 0;
  for (int r = 0; r < L->n; r++) {
    uint64_t rd = jget_u64(reports[r], "stats", "bytes_read"), sn = jget_u64(reports[r], "stats", "bytes_sent");
    *readers += rd > 0;
    if (rd > *read_max) *read_max = rd;
    if (sn > *sent_max) *sent_max = sn;
  }
}

/* The merged JSON report without its "ranks" (those are copied in by print_json); NULL when out
 * of memory (never a report with parts left out). */
static json_t *merged_head(const launch *L, json_t **reports, uint64_t ckpt) {
  json_t *root = json_object();
  uint64_t sent0 = jget_u64(reports[0], "stats", "bytes_sent");
  int bad = json_object_set_new(root, "world_size", json_integer(L->n));
  bad |= cli_json_set_path(root, "path", L->a->path);
  bad |= json_object_set_new(root, "strategy", json_string(jget_str(reports[0], "strategy")));
  bad |= json_object_set_new(root, "source", json_string(jget_str(reports[0], "source")));
  json_t *coll = json_object_get(reports[0], "collective");
  bad |= json_object_set_new(root, "collective", coll ? json_deep_copy(coll) : json_null());
  bad |= json_object_set_new(root, "wall_seconds", json_real(L->wall));
  bad |= json_object_set_new(root, "checkpoint_bytes", json_integer((json_int_t)ckpt));
  bad |= json_object_set_new(root, "gb_per_s", json_real(L->wall > 0 ? (double)ckpt / L->wall / 1e9 : 0.0));
  bad |= json_object_set_new(root, "rank0_bytes_sent", json_integer((json_int_t)sent0));
  bad |= json_object_set_new(root, "rank0_sent_per_checkpoint_byte",
                             json_real(ckpt ? (double)sent0 / (double)ckpt : 0.0));
  int readers;
  uint64_t read_max, sent_max;
  spread(L, reports, &readers, &read_max, &sent_max);
  bad |= json_object_set_new(root, "ranks_that_read", json_integer(readers));
  bad |= json_object_set_new(root, "max_rank_bytes_read", json_integer((json_int_t)read_max));
  bad |= json_object_set_new(root, "max_rank_bytes_sent", json_integer((json_int_t)sent_max));
  if (!bad) return root;
  json_decref(root);
  return NULL;
}

/* Rank R's whole report (its --json document, rank-R.full.json) into *TEXT (malloc'd), *LEN
 * bytes, checked against the length and XXH3-64 digest that its summary SUMMARY gives: what the
 * rank wrote and nothing else (a file cut short, or replaced, after the rank wrote it is
 * refused, naming the rank and the file). 0, or -1 when it printed why. */
static int read_rank_report(const launch *L, const json_t *summary, int r, char **text, size_t *len) {
  const char *path = L->ranks[r].full_path;
  json_t *jb = json_object_get(summary, "report_bytes");
  const char *hex = json_string_value(json_object_get(summary, "report_xxh3"));
  char *end = NULL;
  unsigned long long want = hex && strlen(hex) == 16 ? strtoull(hex, &end, 16) : 0;
  if (!json_is_integer(jb) || json_integer_value(jb) < 2 || !end || *end) {
    cli_error(L->a->path, SL_ERR_IO,
              "rank %d: its summary gives no length and digest of its report %s; run again with --verbose", r, path);
    return -1;
  }
  uint64_t bytes = (uint64_t)json_integer_value(jb);
  FILE *f = fopen(path, "r");
  struct stat sb;
  if (!f || fstat(fileno(f), &sb) != 0) {
    cli_error(L->a->path, SL_ERR_IO, "rank %d: its report %s is unreadable: %s; run again with --verbose", r, path,
              strerror(errno));
    if (f) fclose(f);
    return -1;
  }
  if ((uint64_t)sb.st_size != bytes) {
    cli_error(L->a->path, SL_ERR_IO,
              "rank %d: its report %s holds %lld bytes, not the %llu it wrote (changed after the rank wrote it); "
              "run again",
              r, path, (long long)sb.st_size, (unsigned long long)bytes);
    fclose(f);
    return -1;
  }
  char *buf = bytes < SIZE_MAX ? malloc((size_t)bytes + 1) : NULL;
  if (!buf) {
    cli_error(L->a->path, SL_ERR_NOMEM, "out of memory reading rank %d's %llu-byte report; free memory and run again",
              r, (unsigned long long)bytes);
    fclose(f);
    return -1;
  }
  /* one byte more than it wrote: a file that grew since the fstat is caught as well */
  size_t got = fread(buf, 1, (size_t)bytes + 1, f);
  int err = ferror(f);
  fclose(f);
  if (err || got != bytes || XXH3_64bits(buf, got) != want || buf[0] != '{' || buf[got - 2] != '}' ||
      buf[got - 1] != '\n') {
    cli_error(L->a->path, SL_ERR_IO, "rank %d: its report %s is not the one it wrote (%s); run again", r, path,
              err            ? "a read failed"
              : got != bytes ? "its length changed"
                             : "its digest differs");
    free(buf);
    return -1;
  }
  *text = buf;
  *len = got;
  return 0;
}

/* The merged --json report: the head from the ranks' summaries, then every rank's whole report
 * TEXTS[r] (checked whole by read_rank_report before anything is printed) as a member of
 * "ranks", copied as it is with each line indented to its depth: the text jansson would write
 * for the parsed report, without parsing megabytes of it again. */
static int print_json(cli_out *o, const launch *L, json_t **reports, char **texts, const size_t *lens, uint64_t ckpt) {
  json_t *head = merged_head(L, reports, ckpt);
  int rc = head ? cli_out_json_open_array(o, head, "ranks") : -1;
  json_decref(head);
  for (int r = 0; r < L->n && rc == 0; r++) {
    if ((rc = cli_out_puts(o, r ? ",\n    " : "\n    ")) != 0) break;
    /* all but the document's final newline (the merged report's own comes later) */
    o->indent = "    ";
    rc = cli_out_write_indented(o, texts[r], lens[r] - 1);
    o->indent = "";
  }
  if (rc == 0) rc = cli_out_puts(o, "\n  ]\n}\n");
  if (rc == 0) rc = cli_out_flush(o);
  if (rc != 0) cli_out_fail(L->a->path, o, "the JSON report");
  return rc;
}

/* Every rank succeeded: read their reports and print the merged one. */
static int report(launch *L) {
  int rc = CLI_EXIT_ERROR;
  char **texts = NULL;
  size_t *lens = NULL;
  json_t **reports = calloc((size_t)L->n, sizeof *reports);
  if (!reports) {
    cli_error(L->a->path, SL_ERR_NOMEM, "out of memory for %d reports", L->n);
    return CLI_EXIT_ERROR;
  }
  for (int r = 0; r < L->n; r++) {
    json_error_t err;
    memset(&err, 0, sizeof err);
    errno = 0;
    reports[r] = json_load_file(L->ranks[r].json_path, 0, &err);
    /* jansson out of memory sets no error text, json_error_out_of_memory, or (a string's copy)
     * a syntax error of valid text after a failed malloc: as core/src/util.c tells them */
    if (!reports[r] && (!err.text[0] || json_error_code(&err) == json_error_out_of_memory || errno == ENOMEM)) {
      cli_error(L->a->path, SL_ERR_NOMEM, "out of memory reading rank %d's report; free memory and run again", r);
      goto out_reports;
    }
    if (!reports[r] || !json_is_object(reports[r])) {
      cli_error(L->a->path, SL_ERR_IO, "rank %d: its report is unreadable: %s; run again with --verbose",
                r, reports[r] ? "not an object" : err.text);
      goto out_reports;
    }
  }
  /* every rank's whole report read and checked before a byte of the merged one is printed */
  if (L->a->json) {
    if (!(texts = calloc((size_t)L->n, sizeof *texts)) || !(lens = calloc((size_t)L->n, sizeof *lens))) {
      cli_error(L->a->path, SL_ERR_NOMEM, "out of memory for %d reports", L->n);
      goto out_reports;
    }
    for (int r = 0; r < L->n; r++)
      if (read_rank_report(L, reports[r], r, &texts[r], &lens[r]) != 0) goto out_reports;
  }
  relay_stderr(L, -1);
  uint64_t ckpt = jget_u64(reports[0], "totals", "checkpoint_bytes");
  cli_out o;
  cli_out_init(&o, cli_report(), "stdout");
  if (L->a->json) {
    if (print_json(&o, L, reports, texts, lens, ckpt) != 0) goto out_reports;
  } else {
    print_human(&o, L, reports, ckpt);
    if (cli_out_flush(&o) != 0) {
      cli_out_fail(L->a->path, &o, "the report");
      goto out_reports;
    }
  }
  rc = CLI_EXIT_OK;
out_reports:
  for (int r = 0; r < L->n; r++) {
    json_decref(reports[r]);
    if (texts) free(texts[r]);
  }
  free(texts);
  free(lens);
  free(reports);
  return rc;
}

/* ---- the launcher ------------------------------------------------------------------------------ */

int cli_launch(const cli_load_args *a) {
  launch L;
  memset(&L, 0, sizeof L);
  L.a = a;
  L.n = a->nproc;
  L.self = getpid();
  L.first_failed = -1;
  L.ranks = calloc((size_t)L.n, sizeof *L.ranks);
  if (!L.ranks) {
    cli_error(a->path, SL_ERR_NOMEM, "out of memory for %d ranks", L.n);
    return CLI_EXIT_ERROR;
  }
  int rc = CLI_EXIT_ERROR;
  /* A fresh secret per job, from the kernel's generator (getrandom blocks only before the
   * pool is first seeded at boot); the ranks inherit it, nothing else sees it. */
  unsigned char secret[LAUNCH_TOKEN_BYTES];
  if (getrandom(secret, sizeof secret, 0) != (ssize_t)sizeof secret) {
    cli_error(a->path, SL_ERR_IO, "cannot draw the job's rendezvous secret: %s", strerror(errno));
    goto out_dir;
  }
  for (size_t i = 0; i < sizeof secret; i++) snprintf(L.token + 2 * i, 3, "%02x", secret[i]);
  explicit_bzero(secret, sizeof secret);
  if (make_private_dir(&L) != 0) goto out_dir;

  /* Block the signals the wait loop takes with sigtimedwait (race-free); ranks unblock them. */
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, SIGCHLD);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGHUP);
  sigprocmask(SIG_BLOCK, &block, &L.old_mask);

  fflush(NULL); /* nothing buffered may be written twice */
  double t0 = cli_now();
  for (int r = 0; r < L.n; r++) {
    pid_t pid = fork();
    if (pid == 0) run_rank(&L, r);
    if (pid < 0) {
      cli_error(a->path, SL_ERR_NOMEM, "cannot start rank %d of %d: %s; try fewer ranks", r, L.n,
                strerror(errno));
      L.got_signal = -1; /* stop the ones started */
      break;
    }
    L.ranks[r].pid = pid;
    L.alive++;
    if (a->verbose) fprintf(stderr, "launch: rank %d pid %ld\n", r, (long)pid);
  }
  if (a->verbose) fprintf(stderr, "launch: rendezvous %s\n", L.rdv);
  wait_ranks(&L, t0);

  if (L.got_signal == -1) {
    rc = CLI_EXIT_ERROR;
  } else if (L.got_signal) {
    rc = 128 + L.got_signal;
  } else if (L.first_failed >= 0) {
    if (a->verbose) relay_stderr(&L, L.first_failed);
    rc = print_failure(&L);
  } else {
    rc = report(&L);
  }
  sigprocmask(SIG_SETMASK, &L.old_mask, NULL);

out_dir:
  remove_private_dir(&L);
  explicit_bzero(L.token, sizeof L.token);
  free(L.ranks);
  /* stopped by a signal: every rank is gone and the directory removed; now die of it */
  if (rc > 128) {
    signal(rc - 128, SIG_DFL);
    raise(rc - 128);
  }
  return rc;
}
