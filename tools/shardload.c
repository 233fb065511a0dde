/* shardload: the command. main(), subcommand dispatch, and the helpers every subcommand
 * shares (the one-line error format, size/mesh/dtype parsing, JSON and table text). */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static const char MAIN_HELP[] =
    "usage: shardload COMMAND [ARGS...]\n"
    "\n"
    "Load a full safetensors checkpoint into sharded, placed per-rank tensors.\n"
    "\n"
    "commands:\n"
    "  inspect PATH       list tensors, dtypes, shapes, bytes, files and metadata\n"
    "  plan PATH --world N\n"
    "                     dry run: every rank's local shape and global offset\n"
    "  load PATH          load this rank's shards (world from the launcher environment),\n"
    "                     or, with --nproc N, start N local ranks and load on all of them\n"
    "  synth OUT          write a deterministic synthetic transformer checkpoint\n"
    "  backends           the backend and collective modules this machine offers, whether\n"
    "                     each can run here and why not, and what auto would choose\n"
    "\n"
    "PATH is a .safetensors file, a model.safetensors.index.json, or a directory holding one.\n"
    "Run 'shardload COMMAND --help' for a command's options.\n"
    "\n"
    "options:\n"
    "  -h, --help         show this help\n"
    "  -V, --version      show the version of the command and of the library\n"
    "\n"
    "exit status: 0 success, 1 load or input error, 2 usage error\n";

/* ---- the one error line ------------------------------------------------------------------ */

static const char *g_error_tag = "";

void cli_set_error_tag(const char *tag) { g_error_tag = tag ? tag : ""; }

/* Appends S to OUT (LEN bytes, NUL-terminated, cut when full) with every control character
 * escaped (\n, \r, \t, else \xNN) so that whatever a path or tensor name holds, an error
 * stays one line and cannot write to the terminal. */
size_t cli_escape_into(char *out, size_t len, size_t used, const char *s) {
  for (const unsigned char *c = (const unsigned char *)s; *c && used + 5 < len; c++) {
    if (*c >= 0x20 && *c != 0x7f) {
      out[used++] = (char)*c;
    } else if (*c == '\n' || *c == '\r' || *c == '\t') {
      out[used++] = '\\';
      out[used++] = *c == '\n' ? 'n' : *c == '\r' ? 'r' : 't';
    } else {
      used += (size_t)snprintf(out + used, len - used, "\\x%02x", *c);
    }
  }
  if (used < len) out[used] = 0;
  return used;
}

char *cli_escape_dup(const char *s) {
  size_t n = strlen(s), len = 4 * n + 6; /* the worst case: every byte as \xNN */
  char *out = malloc(len);
  if (out) cli_escape_into(out, len, 0, s);
  return out;
}

size_t cli_escaped_len(const char *s) {
  size_t n = 0;
  for (const unsigned char *c = (const unsigned char *)s; *c; c++)
    n += *c >= 0x20 && *c != 0x7f ? 1 : (*c == '\n' || *c == '\r' || *c == '\t') ? 2 : 4;
  return n;
}

static void vprint_error(const char *subject, sl_status s, const char *fmt, va_list ap) {
  char msg[2048], esc_subject[1024], esc_msg[4096];
  vsnprintf(msg, sizeof msg, fmt, ap);
  cli_escape_into(esc_subject, sizeof esc_subject, 0, subject && *subject ? subject : "shardload");
  cli_escape_into(esc_msg, sizeof esc_msg, 0, msg);
  fprintf(stderr, "shardload: %s: %s: %s%s\n", esc_subject, sl_status_name(s), g_error_tag, esc_msg);
}

void cli_error(const char *subject, sl_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprint_error(subject, s, fmt, ap);
  va_end(ap);
}

int cli_fail(const char *subject, sl_status s, const sl_context *ctx) {
  const char *msg = ctx ? sl_context_errmsg(ctx) : NULL;
  if (!msg || !*msg) msg = sl_strerror(s);
  cli_error(subject, s, "%s", msg);
  return CLI_EXIT_ERROR;
}

void cli_log_capture(void *user, sl_log_level level, const char *msg) {
  cli_captured *cap = user;
  if (level == SL_LOG_ERROR && msg) snprintf(cap->msg, sizeof cap->msg, "%s", msg);
}

int cli_fail_captured(const char *subject, sl_status s, const cli_captured *cap) {
  const char *msg = cap ? cap->msg : "";
  /* the log line is "SL_NAME: message"; the error line carries the name already */
  size_t nl = strlen(sl_status_name(s));
  if (!strncmp(msg, sl_status_name(s), nl) && !strncmp(msg + nl, ": ", 2)) msg += nl + 2;
  if (!*msg) msg = sl_strerror(s);
  cli_error(subject, s, "%s", msg);
  return CLI_EXIT_ERROR;
}

int cli_usage_error(const char *subject, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprint_error(subject, SL_ERR_INVALID, fmt, ap);
  va_end(ap);
  return CLI_EXIT_USAGE;
}

/* ---- argument parsing -------------------------------------------------------------------- */

int cli_parse_size(const char *s, uint64_t *out) {
  if (!s || !isdigit((unsigned char)*s)) return -1;
  errno = 0;
  char *end = NULL;
  unsigned long long whole = strtoull(s, &end, 10);
  if (errno) return -1;
  /* A fraction ("1.5GiB") is kept as a decimal so the multiply stays exact for whole values. */
  double frac = 0.0;
  if (*end == '.') {
    double scale = 0.1;
    end++;
    if (!isdigit((unsigned char)*end)) return -1;
    for (; isdigit((unsigned char)*end); end++, scale /= 10) frac += (*end - '0') * scale;
  }
  static const struct {
    const char *suffix;
    uint64_t mult;
  } units[] = {
      {"", 1},
      {"b", 1},
      {"k", 1ull << 10},   {"kib", 1ull << 10}, {"kb", 1000ull},
      {"m", 1ull << 20},   {"mib", 1ull << 20}, {"mb", 1000000ull},
      {"g", 1ull << 30},   {"gib", 1ull << 30}, {"gb", 1000000000ull},
      {"t", 1ull << 40},   {"tib", 1ull << 40}, {"tb", 1000000000000ull},
  };
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcasecmp(end, units[i].suffix) != 0) continue;
    uint64_t v;
    if (__builtin_mul_overflow((uint64_t)whole, units[i].mult, &v)) return -1;
    uint64_t f = (uint64_t)(frac * (double)units[i].mult);
    if (__builtin_add_overflow(v, f, &v)) return -1;
    *out = v;
    return 0;
  }
  return -1;
}

int cli_parse_int(const char *s, long lo, long hi, long *out) {
  if (!s || !*s) return -1;
  errno = 0;
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int cli_parse_mesh(const char *s, int *dims) {
  int n = 0;
  const char *p = s;
  while (*p) {
    if (n == SL_MAX_MESH_DIMS || !isdigit((unsigned char)*p)) return -1;
    errno = 0;
    char *end = NULL;
    long v = strtol(p, &end, 10);
    if (errno || v < 1 || v > INT_MAX) return -1;
    dims[n++] = (int)v;
    p = end;
    if (*p == 'x' || *p == 'X' || *p == ',') {
      p++;
      if (!*p) return -1;
    } else if (*p) {
      return -1;
    }
  }
  return n ? n : -1;
}

int cli_bad_option(const char *cmd, int c, char **argv) {
  const char *arg = optind > 0 ? argv[optind - 1] : cmd;
  if (c == ':')
    return cli_usage_error(arg, "option needs a value; run 'shardload %s --help'", cmd);
  if (strncmp(arg, "--", 2) != 0 && optopt > ' ' && optopt < 127) {
    char opt[3] = {'-', (char)optopt, 0};
    return cli_usage_error(opt, "unknown option for '%s'; run 'shardload %s --help'", cmd, cmd);
  }
  return cli_usage_error(arg, "unknown option for '%s'; run 'shardload %s --help'", cmd, cmd);
}

sl_dtype cli_parse_dtype(const char *option, const char *name) {
  sl_dtype dt = sl_dtype_from_name(name);
  if (dt == SL_DTYPE_INVALID)
    cli_usage_error(option, "unknown dtype '%s'; use a safetensors or torch name such as F32, BF16, "
                    "F16, F64, bfloat16 or torch.float32", name);
  return dt;
}

/* ---- text and JSON helpers --------------------------------------------------------------- */

const char *cli_dims_str(char *buf, size_t len, int ndim, const int64_t *dims) {
  size_t n = 0;
  if (len == 0) return buf;
  n += (size_t)snprintf(buf + n, len - n, "[");
  for (int d = 0; d < ndim && n < len; d++)
    n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? "," : "", (long long)dims[d]);
  if (n < len) snprintf(buf + n, len - n, "]");
  return buf;
}

const char *cli_human_bytes(char *buf, size_t len, uint64_t bytes) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  if (u == 0)
    snprintf(buf, len, "%llu B", (unsigned long long)bytes);
  else
    snprintf(buf, len, "%.2f %s", v, units[u]);
  return buf;
}

int cli_st_header_add(json_t *hdr, const char *name, const char *dtype, int ndim, const int64_t *shape,
                      uint64_t off, uint64_t nbytes) {
  json_t *o = json_object(), *offs = json_array();
  int bad = json_array_append_new(offs, json_integer((json_int_t)off));
  bad |= json_array_append_new(offs, json_integer((json_int_t)(off + nbytes)));
  bad |= json_object_set_new(o, "dtype", json_string(dtype));
  bad |= json_object_set_new(o, "shape", cli_json_dims(ndim, shape));
  bad |= json_object_set_new(o, "data_offsets", offs); /* takes offs, NULL included */
  if (bad) {
    json_decref(o);
    return -1;
  }
  return json_object_set_new(hdr, name, o);
}

/* Length of the valid UTF-8 sequence at P (1 to 4), or 0 when the byte there starts none:
 * RFC 3629, no overlongs, no surrogates, nothing past U+10FFFF. */
static size_t utf8_seq(const unsigned char *p) {
  unsigned c = p[0];
  if (c < 0x80) return 1;
  size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  for (size_t i = 1; i < n; i++)
    if ((p[i] & 0xc0) != 0x80) return 0;
  if (n == 3 && ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] > 0x9f))) return 0;
  if (n == 4 && ((c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] > 0x8f))) return 0;
  return n;
}

static int utf8_valid(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    size_t k = utf8_seq(p);
    if (!k) return 0;
    p += k;
  }
  return 1;
}

/* S with each byte that starts no valid UTF-8 sequence as U+FFFD, as a JSON string. */
static json_t *json_lossy(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s), o = 0;
  char *lossy = malloc(3 * n + 1);
  if (!lossy) return NULL;
  for (size_t i = 0, k; i < n; i += k) {
    if ((k = utf8_seq(p + i)) != 0) {
      memcpy(lossy + o, p + i, k);
      o += k;
    } else {
      memcpy(lossy + o, "\xef\xbf\xbd", 3);
      o += 3;
      k = 1;
    }
  }
  lossy[o] = 0;
  json_t *v = json_string(lossy);
  free(lossy);
  return v;
}

json_t *cli_json_text(const char *s) {
  if (!s) return json_null();
  return utf8_valid(s) ? json_string(s) : json_lossy(s);
}

int cli_json_path_values(const char *path, json_t **value, json_t **hex_out) {
  *hex_out = NULL;
  if (utf8_valid(path)) {
    *value = json_string(path);
    return *value ? 0 : -1;
  }
  /* readable, each invalid byte as U+FFFD; and exact, as hex */
  size_t n = strlen(path);
  char *hex = malloc(2 * n + 1);
  *value = json_lossy(path);
  if (hex) {
    for (size_t i = 0; i < n; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)path[i]);
    hex[2 * n] = 0;
    *hex_out = json_string(hex);
    free(hex);
  }
  if (*value && *hex_out) return 0;
  json_decref(*value);
  json_decref(*hex_out);
  *value = *hex_out = NULL;
  return -1;
}

int cli_json_set_path(json_t *obj, const char *key, const char *path) {
  json_t *value, *hex;
  if (cli_json_path_values(path, &value, &hex) != 0) return -1;
  int bad = json_object_set_new(obj, key, value);
  if (hex) {
    char hkey[128];
    snprintf(hkey, sizeof hkey, "%s_bytes_hex", key);
    bad |= json_object_set_new(obj, hkey, hex);
  }
  return bad ? -1 : 0;
}

json_t *cli_json_dims(int ndim, const int64_t *dims) {
  json_t *a = json_array();
  for (int d = 0; a && d < ndim; d++)
    if (json_array_append_new(a, json_integer((json_int_t)dims[d])) != 0) {
      json_decref(a);
      return NULL;
    }
  return a;
}

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cli_local_context(sl_context **out) {
  sl_context_options o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.backend = "cpu";
  o.rank = 0;
  o.world_size = 1;
  o.local_rank = 0;
  cli_captured cap = {""};
  o.log = cli_log_capture;
  o.log_user = &cap;
  o.log_level = SL_LOG_ERROR;
  sl_context *ctx = NULL;
  sl_status s = sl_context_create(&o, &ctx);
  if (s != SL_OK) return cli_fail_captured("cpu backend", s, &cap);
  *out = ctx;
  return CLI_EXIT_OK;
}

/* ---- dispatch ---------------------------------------------------------------------------- */

static const struct {
  const char *name;
  int (*fn)(int argc, char **argv);
} COMMANDS[] = {
    {"inspect", cli_cmd_inspect},
    {"plan", cli_cmd_plan},
    {"load", cli_cmd_load},
    {"synth", cli_cmd_synth},
    {"backends", cli_cmd_backends},
};

int main(int argc, char **argv) {
  /* A file size limit (ulimit -f) must fail a write with EFBIG, reported and cleaned up like a
   * full disk, not kill the process halfway through a file. */
  signal(SIGXFSZ, SIG_IGN);
  /* before anything can print: the reports keep stdout, foreign output goes to stderr */
  cli_claim_stdout();
  if (argc < 2) {
    fputs(MAIN_HELP, stderr);
    return CLI_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help"))
    return cli_close_stdout(cli_print_help(MAIN_HELP));
  if (!strcmp(cmd, "-V") || !strcmp(cmd, "--version")) {
    /* The header the command was built with and the library it runs with can differ. */
    cli_out o;
    cli_out_init(&o, cli_report(), "stdout");
    if (cli_out_printf(&o, "shardload %s (library %s)\n", SL_VERSION_STRING, sl_version_string()) != 0 ||
        cli_out_flush(&o) != 0)
      return cli_close_stdout(cli_out_fail("--version", &o, "the version"));
    return cli_close_stdout(CLI_EXIT_OK);
  }
  for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
    if (!strcmp(cmd, COMMANDS[i].name)) return cli_close_stdout(COMMANDS[i].fn(argc - 1, argv + 1));
  if (cmd[0] == '-')
    return cli_usage_error(cmd, "unknown option; run 'shardload --help'");
  return cli_usage_error(cmd, "unknown command; use inspect, plan, load, synth or backends "
                         "(run 'shardload --help')");
}
