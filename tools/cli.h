/* Declarations shared by the files of the `shardload` command. The command codes only against
 * the public API (shardload.h); `synth` needs no library at all. */
#ifndef SL_CLI_H
#define SL_CLI_H

#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "shardload/shardload.h"

/* Exit statuses of every subcommand. */
enum { CLI_EXIT_OK = 0, CLI_EXIT_ERROR = 1, CLI_EXIT_USAGE = 2 };

/* The one error line: "shardload: SUBJECT: STATUS_NAME: message". Control characters in the
 * subject and the message (a newline in a path or a tensor name) are escaped (\n, \r, \t,
 * \xNN), so an error is always exactly one line. */
void cli_error(const char *subject, sl_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A tag put in front of the message part of every error line of this process, e.g.
 * "rank 2: " in a rank started by `load --nproc` (so the launcher can relay the line as it
 * is). NULL or "": none. The string must outlive every later error. */
void cli_set_error_tag(const char *tag);
/* A library failure on CTX: the context's specific message, or the generic one when empty.
 * Returns CLI_EXIT_ERROR. */
int cli_fail(const char *subject, sl_status s, const sl_context *ctx);
/* sl_context_create frees the context it fails to create, so its message only reaches the
 * log: pass cli_log_capture as the context's log with a cli_captured as its user, and
 * cli_fail_captured prints the captured message (or the generic one). */
typedef struct cli_captured {
  char msg[1024];
} cli_captured;
void cli_log_capture(void *user, sl_log_level level, const char *msg);
int cli_fail_captured(const char *subject, sl_status s, const cli_captured *cap);
/* A usage problem: prints the line with SL_ERR_INVALID and returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *subject, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "64MiB", "1GiB", "512K", "1.5G", "4096": 0 on success, -1 when not a size. */
int cli_parse_size(const char *s, uint64_t *out);
/* A positive int in [lo, hi]: 0 on success. */
int cli_parse_int(const char *s, long lo, long hi, long *out);
/* "2x4" or "8": up to SL_MAX_MESH_DIMS positive dims. Returns ndim, or -1. */
int cli_parse_mesh(const char *s, int *dims);
/* The usage line for a getopt_long result C of '?' or ':' (optstring starting with ':') in
 * subcommand CMD; returns CLI_EXIT_USAGE. */
int cli_bad_option(const char *cmd, int c, char **argv);
/* A dtype name (sl_dtype_from_name); on failure prints the usage line for OPTION and returns
 * SL_DTYPE_INVALID. */
sl_dtype cli_parse_dtype(const char *option, const char *name);

/* Text helpers for tables: "[a,b]" into BUF (also the dump metadata format). */
const char *cli_dims_str(char *buf, size_t len, int ndim, const int64_t *dims);
/* "1.50 GiB" style. */
const char *cli_human_bytes(char *buf, size_t len, uint64_t bytes);
/* S with control characters escaped as in the error line (malloc'd; NULL when out of memory):
 * for names from a checkpoint printed in tables. */
char *cli_escape_dup(const char *s);
/* Appends S escaped to OUT (LEN bytes, USED of them taken), NUL-terminated, cut when full;
 * returns the bytes now used. */
size_t cli_escape_into(char *out, size_t len, size_t used, const char *s);
/* The length of S escaped (its columns in a table). */
size_t cli_escaped_len(const char *s);
/* The JSON builders below return 0, or -1 when out of memory (a value they could not make is
 * never left out silently: the caller reports the document as out of memory). */
/* Sets OBJ[KEY] to PATH. A path that is not valid UTF-8 (JSON strings must be) is kept, not
 * dropped: OBJ[KEY] holds it with each invalid byte as U+FFFD and OBJ[KEY "_bytes_hex"] its
 * exact bytes as lower-case hex. */
int cli_json_set_path(json_t *obj, const char *key, const char *path);
/* PATH as JSON values for an array: *VALUE as in cli_json_set_path (U+FFFD for each invalid
 * byte), *HEX its exact bytes as lower-case hex when it is not valid UTF-8, else NULL. On -1
 * both are NULL. */
int cli_json_path_values(const char *path, json_t **value, json_t **hex);
/* S as a JSON string, each byte that is not valid UTF-8 as U+FFFD (for text a module or the
 * library gives); NULL only when out of memory. */
json_t *cli_json_text(const char *s);
/* A JSON array of dims; NULL when out of memory. */
json_t *cli_json_dims(int ndim, const int64_t *dims);
/* Adds one tensor entry {dtype, shape, data_offsets [off, off+nbytes]} to a safetensors header. */
int cli_st_header_add(json_t *hdr, const char *name, const char *dtype, int ndim, const int64_t *shape,
                      uint64_t off, uint64_t nbytes);
double cli_now(void); /* monotonic seconds */

/* ---- checked output (output.c) ---------------------------------------------------------
 * Every report goes through a cli_out, which checks each write and keeps the errno of the
 * first that failed: a full disk (`> /dev/full`) ends the command with that reason and exit
 * status 1, never 0, and jansson running out of memory while it writes a value (-1 with no
 * failed write) is told apart from a failed write. After a failure every later call fails at
 * once, so a caller may chain them and check once. */
typedef struct cli_out {
  FILE *f;
  const char *name;   /* what the error line calls it: "stdout", a report file's path */
  const char *indent; /* written after every newline of a value cli_out_json writes; "" none */
  int err;            /* errno of the first failed write; 0 while all is well */
  void *digest;       /* XXH3-64 state of what was written since cli_out_digest_begin; or NULL */
  uint64_t written;   /* bytes written since then */
} cli_out;

void cli_out_init(cli_out *o, FILE *f, const char *name);
/* Counts and hashes (XXH3-64) what O writes from now on: 0, or -1 out of memory. */
int cli_out_digest_begin(cli_out *o);
/* The XXH3-64 digest and length of what O wrote since cli_out_digest_begin; ends the count. */
uint64_t cli_out_digest_end(cli_out *o, uint64_t *written);
/* 0, or -1 when this or an earlier write failed. */
int cli_out_write(cli_out *o, const void *buf, size_t len);
int cli_out_puts(cli_out *o, const char *s);
int cli_out_printf(cli_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* S with control characters escaped as in the error line (it comes from a checkpoint, or a
 * module), left-aligned in WIDTH columns. Allocates nothing. */
int cli_out_escaped(cli_out *o, const char *s, int width);
/* V as indented JSON (JSON_INDENT(2) | JSON_PRESERVE_ORDER), streamed: 0, or -1 when a write
 * failed (O->err set) or jansson ran out of memory (O->err still 0). */
int cli_out_json(cli_out *o, const json_t *v);
/* BUF with O->indent after each newline, through a buffer (text copied into an indented
 * document: a whole value that cli_out_json wrote elsewhere). 0, or -1 when a write failed or
 * (O->err ENOMEM) no buffer could be had. */
int cli_out_write_indented(cli_out *o, const void *buf, size_t len);
/* HEAD, an object, as cli_out_json_document would write it with one more member KEY, an
 * array, up to that array's opening bracket ("...,\n  \"KEY\": ["), for the caller to stream
 * its elements (each on a new line indented by four spaces, the last followed by "\n  ]\n}\n",
 * or "]\n}\n" for none). 0, or -1 as cli_out_json. */
int cli_out_json_open_array(cli_out *o, const json_t *head, const char *key);
/* The elements of an array member of an object being streamed (after cli_out_json_open_array
 * or cli_out_json_next_array): ITEM(USER, i) for i < N, each dumped, then decref'd, as
 * cli_out_json_document would write it inside the document (one element at a time, so that a
 * report of tens of thousands of tensors never holds them all as one tree), then the array's
 * closing bracket. An ITEM of NULL is out of memory. 0, or -1 as cli_out_json. */
int cli_out_json_items(cli_out *o, size_t n, json_t *(*item)(void *user, size_t i), void *user);
/* After cli_out_json_items: the next member KEY, an array, up to its opening bracket. */
int cli_out_json_next_array(cli_out *o, const char *key);
/* After cli_out_json_items: TAIL's members (an object, in order) as the document's last ones,
 * the closing brace and a newline, then the flush. 0, or -1 as cli_out_json. */
int cli_out_json_close_document(cli_out *o, const json_t *tail);
/* V as a whole document: cli_out_json, a newline, and the flush. */
int cli_out_json_document(cli_out *o, const json_t *v);
/* Flushes and checks the stream (a failure buffered earlier shows here too). */
int cli_out_flush(cli_out *o);
/* The error line for a failed cli_out: SL_ERR_IO "cannot write WHAT to NAME: <errno text>", or
 * SL_ERR_NOMEM "out of memory writing WHAT" when no write failed (or one failed for want of
 * memory). WHAT is a printf format. Returns CLI_EXIT_ERROR. */
int cli_out_fail(const char *subject, const cli_out *o, const char *what, ...)
    __attribute__((format(printf, 3, 4)));
/* The stream a command's report goes to: the process's standard output as it started.
 * cli_claim_stdout, called first thing in main, keeps a private copy of it for the reports and
 * points descriptor 1 at standard error, so that whatever a vendor library prints to stdout
 * (NCCL's NCCL_DEBUG lines without NCCL_DEBUG_FILE, a runtime's banner) lands beside the
 * command's own messages and never inside a --json report. Without a claim (no stderr, or
 * stdout closed) this is stdout itself. */
void cli_claim_stdout(void);
FILE *cli_report(void);
/* In a forked rank, closes its copy of the report stream (cli_report is then stdout). */
void cli_drop_report(void);
/* A --help text on the report stream, checked; returns the exit status. */
int cli_print_help(const char *text);
/* Closes the report stream as the command ends, so that nothing written to it, checked or not,
 * can be lost while the exit status says 0. Returns RC, or CLI_EXIT_ERROR (with the error
 * line) when RC was CLI_EXIT_OK and the close failed. */
int cli_close_stdout(int rc);
/* A world-size-1 context on the cpu backend that ignores the launcher environment, for the
 * commands that only read metadata. Prints the error line on failure. */
int cli_local_context(sl_context **out);

/* ---- plan options shared by `plan` and `load` (cmd_plan.c) --------------------------- */
#define CLI_MAX_RULES 256

typedef struct cli_plan_args {
  const char *plan_file;                 /* --plan FILE */
  const char *placement;                 /* --placement SPEC: default placement */
  const char *replicate[CLI_MAX_RULES];  /* --replicate PATTERN, in order */
  int replicate_count;
  sl_dtype param_dtype;                  /* --param-dtype; INVALID: the file's */
  int mesh_ndim;                         /* --mesh; 0: default 1-D [world] */
  int mesh[SL_MAX_MESH_DIMS];
  int strict;                            /* --strict */
  int has_policy;                        /* --offload-policy given */
  sl_offload_policy policy;
} cli_plan_args;

/* getopt_long codes of the plan options both commands take. */
enum {
  CLI_OPT_PLAN = 256,
  CLI_OPT_PLACEMENT,
  CLI_OPT_REPLICATE,
  CLI_OPT_PARAM_DTYPE,
  CLI_OPT_MESH,
};
#define CLI_PLAN_LONGOPTS                                              \
  {"plan", required_argument, NULL, CLI_OPT_PLAN},                     \
  {"placement", required_argument, NULL, CLI_OPT_PLACEMENT},           \
  {"replicate", required_argument, NULL, CLI_OPT_REPLICATE},           \
  {"param-dtype", required_argument, NULL, CLI_OPT_PARAM_DTYPE},       \
  {"mesh", required_argument, NULL, CLI_OPT_MESH}

/* Takes getopt_long code C with value ARG when it is a plan option: returns 1 when taken, 0
 * when C is not a plan option, or CLI_EXIT_USAGE (negated: -2) after printing the line. */
int cli_plan_option(cli_plan_args *args, int c, const char *arg);
/* Checks what only the whole set can tell (placement spec against the mesh rank). Returns
 * CLI_EXIT_OK or CLI_EXIT_USAGE after printing the line. */
int cli_plan_args_check(const cli_plan_args *args);

/* Builds a plan from ARGS on CTX. On failure prints the error line (naming the plan file or
 * the option) and returns CLI_EXIT_ERROR; on success CLI_EXIT_OK with *out set. */
int cli_plan_build(sl_context *ctx, const cli_plan_args *args, sl_plan **out);

/* ---- plan --hosts/--readers/--traffic: a scatter load's bytes (plan_traffic.c) ------- */
/* One way of reading: rank 0 alone, or distributed readers. Per-rank arrays have the world's
 * length, per-host ones the hosts'. */
typedef struct cli_traffic_mode {
  int nreaders;
  int *reader_rank;          /* ascending */
  uint64_t *read;            /* per reader: the file bytes of its share */
  uint64_t *sent, *received; /* per rank: every byte it sends / receives (the chain's included) */
  uint64_t *link_sent, *link_received; /* per host: what crosses its link, out / in */
  uint64_t largest_read, max_sent, busiest_link;
  int max_sent_rank, busiest_host, busiest_in; /* busiest_in: the link's busiest way is in */
  uint64_t received_min, received_median, received_max; /* median: the lower middle value */
} cli_traffic_mode;

typedef struct cli_traffic {
  int world, hosts, ranks_per_host, readers_asked; /* readers_asked: --readers, 0 one per host */
  int mesh_ndim, mesh[SL_MAX_MESH_DIMS];
  size_t tensors;      /* those the load takes */
  uint64_t read_bytes; /* their file bytes */
  cli_traffic_mode rank0, readers;
} cli_traffic;

/* The human report lists every rank up to this world (or only rank R when given). */
#define CLI_TRAFFIC_LIST_RANKS 64

/* The traffic of a scatter load of SRC (opened from PATH) under PLAN by WORLD ranks on HOSTS
 * hosts of WORLD/HOSTS consecutive ranks each (HOSTS divides WORLD), READERS distributed readers
 * (0: one per host), as sl_load would move it. Prints the error line on failure (CLI_EXIT_ERROR,
 * *T left empty). */
int cli_traffic_compute(sl_context *ctx, const char *path, sl_plan *plan, const sl_source *src, int world, int hosts,
                        int readers, cli_traffic *t);
void cli_traffic_free(cli_traffic *t);
/* The human section; ONLY_RANK >= 0 lists that rank alone. Writes are checked by O. */
void cli_traffic_table(cli_out *o, const cli_traffic *t, int only_rank);
/* The "traffic" object of `plan --json`; NULL when out of memory. */
json_t *cli_traffic_json(const cli_traffic *t);

/* ---- subcommands: argc/argv start at the subcommand name --------------------------- */
int cli_cmd_inspect(int argc, char **argv);
int cli_cmd_plan(int argc, char **argv);
int cli_cmd_load(int argc, char **argv);
int cli_cmd_synth(int argc, char **argv);
int cli_cmd_backends(int argc, char **argv);

/* The most ranks `load --nproc` starts: processes on one host, each holding a connection to
 * every other one (below SL_MAX_WORLD_SIZE, which bounds a job across hosts). */
#define CLI_MAX_NPROC 1024

/* ---- load: one rank's work (cmd_load.c), so a multi-rank launcher can call it per rank -- */
typedef struct cli_load_args {
  const char *path;
  const char *backend;    /* NULL: auto */
  const char *collective; /* --collective: the data plane; NULL: auto */
  int device;             /* --device N, with device_set */
  int device_set;
  const char *rendezvous; /* NULL: from the environment */
  int rank;               /* -1 with world_size 0: from the environment */
  int world_size;
  int local_rank;         /* -1: from the environment */
  sl_cpu_offload cpu_offload;
  uint64_t staging_bytes; /* 0: the library default */
  const char *dump_dir;   /* NULL: no dump */
  sl_strategy strategy;   /* --strategy */
  sl_read_mode read_mode; /* --source */
  int readers;            /* --readers; 0: one per host */
  int timeout_ms;         /* --timeout; 0: the library default */
  int json;
  int progress;           /* draw a progress line on stderr (a terminal) */
  int nproc;              /* --nproc N (at most CLI_MAX_NPROC): launch N local ranks (launch.c); 0: this process is one */
  int verbose;            /* --verbose: with --nproc, launcher detail and per-tensor tables */
  FILE *table_out;        /* also write the human table here (a rank of --nproc --verbose) */
  const char *table_out_name; /* its path, for an error line */
  int test_hooks;         /* a rank of --nproc: call the test hooks (cli_hook_load) */
  int report_summary;     /* a rank of --nproc: its JSON report holds no entry per tensor (nor
                           * skipped name), only "placements", what the launcher's table prints
                           * (per-tensor cost stays out of the launcher's path) */
  FILE *full_out;         /* a rank of --nproc --json: the whole JSON report too, which the
                           * launcher copies into its merged report as it is */
  const char *full_out_name; /* its path, for an error line */
  cli_plan_args plan;
} cli_load_args;

/* Runs one rank's load and writes its report to OUT (called OUT_NAME in an error line:
 * "stdout", a file's path). Returns an exit status; errors are printed as the one-line format
 * on stderr, a report that could not be written included. */
int cli_load_rank(const cli_load_args *args, FILE *out, const char *out_name);

/* Test hooks, called only in a rank of --nproc: no-ops in the shipped command (tools/hooks.c).
 * The tests link the same objects with tests/cli_hooks.c instead (the shardload-test-hooks
 * command), whose hooks obey SHARDLOAD_TEST_* variables, so that no variable of the shipped
 * command kills, stalls or describes a rank. cli_hook_load runs once the context exists, before
 * sl_load, and may set LO's bind; cli_hook_rank_exit runs after the rank's work, before it
 * exits, with its reports for the launcher complete (REPORT_PATH, the summary; FULL_PATH, the
 * whole --json report, or NULL). */
void cli_hook_load(sl_context *ctx, sl_load_options *lo);
/* Runs in rank RANK of --nproc before anything of the library (its context) starts. */
void cli_hook_rank_start(int rank);
void cli_hook_rank_exit(int rank, const char *report_path, const char *full_path);
/* Peak resident set of this process so far (getrusage ru_maxrss), in bytes. */
uint64_t cli_peak_rss_bytes(void);

/* ---- --dump (dump.c) ------------------------------------------------------------------ */
/* Writes DIR/rank-<RANK>.safetensors (its name into PATH) through a temporary file of DIR
 * renamed into place, never following a symlink at the destination and leaving no file behind
 * on failure. On failure prints the error line and leaves "SUBJECT: message" as CTX's message
 * (for sl_context_agree); returns the status. */
sl_status cli_dump_rank(sl_context *ctx, const sl_state *st, const char *dir, int rank, int world, char *path,
                        size_t path_len);

/* ---- load --nproc: N local ranks (launch.c) ----------------------------------------- */
/* Forks ARGS->nproc ranks that meet through a private file:// rendezvous and Gloo over
 * loopback, each running cli_load_rank; stops them all when one fails; prints the merged
 * report (or the first failed rank's error line). Must run before this process creates any
 * thread or library context. Returns the exit status. */
int cli_launch(const cli_load_args *args);

#endif
