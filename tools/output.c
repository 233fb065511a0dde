/* Checked output: every report the command writes (tables, JSON, the help) goes through a
 * cli_out, so that a write that fails (a full disk, a closed pipe, a file size limit) ends the
 * command with its reason and exit status 1 instead of a silent 0, and so that jansson running
 * out of memory while it writes is reported as out of memory, not as a failed write. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* header-only: the command links only the public library, which does not export xxhash */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cli.h"

void cli_out_init(cli_out *o, FILE *f, const char *name) {
  o->f = f;
  o->name = name;
  o->indent = "";
  o->err = 0;
  o->digest = NULL;
  o->written = 0;
}

int cli_out_digest_begin(cli_out *o) {
  XXH3_state_t *d = XXH3_createState();
  if (!d) return -1;
  XXH3_64bits_reset(d);
  o->digest = d;
  o->written = 0;
  return 0;
}

uint64_t cli_out_digest_end(cli_out *o, uint64_t *written) {
  uint64_t h = o->digest ? XXH3_64bits_digest(o->digest) : 0;
  XXH3_freeState(o->digest);
  o->digest = NULL;
  *written = o->written;
  return h;
}

/* Keeps the first failure's errno (stdio sets it from the failed write(2)). */
static int out_failed(cli_out *o) {
  if (!o->err) o->err = errno ? errno : EIO;
  return -1;
}

int cli_out_write(cli_out *o, const void *buf, size_t len) {
  if (o->err) return -1;
  errno = 0;
  if (len && fwrite(buf, 1, len, o->f) != len) return out_failed(o);
  if (o->digest) {
    XXH3_64bits_update(o->digest, buf, len);
    o->written += len;
  }
  return 0;
}

int cli_out_puts(cli_out *o, const char *s) { return cli_out_write(o, s, strlen(s)); }

int cli_out_printf(cli_out *o, const char *fmt, ...) {
  if (o->err) return -1;
  va_list ap;
  va_start(ap, fmt);
  errno = 0;
  int n;
  if (o->digest) { /* what is counted goes through cli_out_write */
    char *text = NULL;
    n = vasprintf(&text, fmt, ap);
    va_end(ap);
    if (n < 0) {
      o->err = ENOMEM;
      return -1;
    }
    int r = cli_out_write(o, text, (size_t)n);
    free(text);
    return r;
  }
  n = vfprintf(o->f, fmt, ap);
  va_end(ap);
  return n < 0 ? out_failed(o) : 0;
}

int cli_out_escaped(cli_out *o, const char *s, int width) {
  char buf[512];
  size_t cols = 0;
  /* a chunk at a time: at most 4 bytes of escape for each byte in */
  while (*s) {
    size_t take = strnlen(s, (sizeof buf - 8) / 4);
    char piece[(sizeof buf - 8) / 4 + 1];
    memcpy(piece, s, take);
    piece[take] = 0;
    size_t used = cli_escape_into(buf, sizeof buf, 0, piece);
    if (cli_out_write(o, buf, used) != 0) return -1;
    cols += used;
    s += take;
  }
  for (; width > 0 && cols < (size_t)width; cols++)
    if (cli_out_write(o, " ", 1) != 0) return -1;
  return 0;
}

/* Text on its way to O with O->indent after each newline (a value dumped on its own, indented
 * to its depth in a document being streamed), gathered in a buffer: jansson hands its dump
 * over a token at a time, and a write per token cost more than the dump of a report of tens of
 * thousands of tensors. */
typedef struct sink {
  cli_out *o;
  const char *indent; /* o->indent as the value began, and its length */
  size_t ilen;
  size_t used;
  char buf[1 << 16];
} sink;

static int sink_flush(sink *s) {
  int r = cli_out_write(s->o, s->buf, s->used);
  s->used = 0;
  return r;
}

static int sink_put(sink *s, const char *p, size_t n) {
  while (n) {
    if (s->used == sizeof s->buf && sink_flush(s) != 0) return -1;
    size_t k = n < sizeof s->buf - s->used ? n : sizeof s->buf - s->used;
    memcpy(s->buf + s->used, p, k);
    s->used += k;
    p += k;
    n -= k;
  }
  return 0;
}

static void sink_indent(sink *s, const char *indent) {
  s->indent = indent;
  s->ilen = strlen(indent);
}

static int sink_put_indented(sink *s, const char *buf, size_t size) {
  size_t ilen = s->ilen;
  for (size_t i = 0; i < size;) {
    const char *nl = ilen ? memchr(buf + i, '\n', size - i) : NULL;
    size_t end = nl ? (size_t)(nl - buf) + 1 : size;
    if (sink_put(s, buf + i, end - i) != 0) return -1;
    if (nl && sink_put(s, s->indent, ilen) != 0) return -1;
    i = end;
  }
  return 0;
}

/* json_dump_callback's sink. */
static int json_sink(const char *buf, size_t size, void *data) { return sink_put_indented(data, buf, size); }

int cli_out_json(cli_out *o, const json_t *v) {
  if (o->err) return -1;
  if (!v) return -1; /* a value that could not be made: out of memory */
  sink *s = malloc(sizeof *s);
  if (!s) return -1; /* out of memory, no write failed */
  s->o = o;
  s->used = 0;
  sink_indent(s, o->indent);
  int r = json_dump_callback(v, json_sink, s, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  /* what the dump handed over goes out even when it failed: a write error is the one to tell */
  if (sink_flush(s) != 0) r = -1;
  free(s);
  return r == 0 ? 0 : -1;
}

int cli_out_write_indented(cli_out *o, const void *buf, size_t len) {
  if (o->err) return -1;
  sink *s = malloc(sizeof *s);
  if (!s) {
    o->err = ENOMEM; /* cli_out_fail words it as out of memory */
    return -1;
  }
  s->o = o;
  s->used = 0;
  sink_indent(s, o->indent);
  int r = sink_put_indented(s, buf, len);
  if (sink_flush(s) != 0) r = -1;
  free(s);
  return r;
}

int cli_out_json_open_array(cli_out *o, const json_t *head, const char *key) {
  if (o->err) return -1;
  char *text = head ? json_dumps(head, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
  if (!text) return -1; /* out of memory, no write failed */
  size_t len = strlen(text);
  /* an indented object ends "\n}": the last member goes before that brace */
  int rc = len >= 2 && text[len - 1] == '}' && text[len - 2] == '\n' ? 0 : -1;
  if (rc == 0) rc = cli_out_write(o, text, len - 2);
  if (rc == 0) rc = cli_out_printf(o, ",\n  \"%s\": [", key);
  free(text);
  return rc;
}

int cli_out_json_items(cli_out *o, size_t n, json_t *(*item)(void *user, size_t i), void *user) {
  if (o->err) return -1;
  sink *s = malloc(sizeof *s);
  if (!s) return -1; /* out of memory, no write failed */
  s->o = o;
  s->used = 0;
  /* one sink for every element, each line of which is indented to the element's depth */
  sink_indent(s, "    ");
  char first[2048], *elem = first;
  size_t elem_size = sizeof first;
  int r = 0;
  for (size_t i = 0; i < n && r == 0; i++) {
    json_t *v = item(user, i);
    if (!v) {
      r = -1;
      break;
    }
    r = sink_put(s, i ? ",\n    " : "\n    ", 6 - (i == 0));
    /* dumped whole into a buffer, then indented in one pass: jansson hands a callback its
     * dump a token at a time, and a call per token cost more than the dump */
    const size_t flags = JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY;
    size_t k = r == 0 ? json_dumpb(v, elem, elem_size, flags) : 0;
    if (k > elem_size) {
      char *bigger = realloc(elem == first ? NULL : elem, k);
      if (bigger) {
        elem = bigger;
        elem_size = k;
        k = json_dumpb(v, elem, elem_size, flags);
      } else {
        k = 0; /* out of memory */
      }
    }
    if (k == 0 || k > elem_size) r = -1;
    if (r == 0) r = sink_put_indented(s, elem, k);
    json_decref(v);
  }
  if (r == 0) r = sink_put(s, n ? "\n  ]" : "]", n ? 4 : 1);
  if (sink_flush(s) != 0) r = -1;
  if (elem != first) free(elem);
  free(s);
  return r == 0 ? 0 : -1;
}

int cli_out_json_next_array(cli_out *o, const char *key) { return cli_out_printf(o, ",\n  \"%s\": [", key); }

int cli_out_json_close_document(cli_out *o, const json_t *tail) {
  if (o->err) return -1;
  char *text = tail ? json_dumps(tail, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
  if (!text) return -1; /* out of memory, no write failed */
  /* an indented object reads "{\n  ...\n}", an empty one "{}": its members follow a comma */
  int rc = strncmp(text, "{\n", 2) == 0 ? cli_out_puts(o, ",") : strcmp(text, "{}") == 0 ? cli_out_puts(o, "\n}") : -1;
  if (rc == 0 && text[1] == '\n') rc = cli_out_puts(o, text + 1);
  free(text);
  if (rc == 0) rc = cli_out_puts(o, "\n");
  return rc == 0 ? cli_out_flush(o) : -1;
}

int cli_out_json_document(cli_out *o, const json_t *v) {
  if (cli_out_json(o, v) != 0 || cli_out_puts(o, "\n") != 0) return -1;
  return cli_out_flush(o);
}

int cli_out_flush(cli_out *o) {
  if (o->err) return -1;
  errno = 0;
  if (fflush(o->f) != 0 || ferror(o->f)) return out_failed(o);
  return 0;
}

int cli_out_fail(const char *subject, const cli_out *o, const char *what, ...) {
  char text[512];
  va_list ap;
  va_start(ap, what);
  vsnprintf(text, sizeof text, what, ap);
  va_end(ap);
  if (o->err && o->err != ENOMEM)
    cli_error(subject, SL_ERR_IO, "cannot write %s to %s: %s", text, o->name, strerror(o->err));
  else
    cli_error(subject, SL_ERR_NOMEM, "out of memory writing %s", text);
  return CLI_EXIT_ERROR;
}

static FILE *g_report; /* the claimed standard output; NULL: stdout itself */

void cli_claim_stdout(void) {
  /* only when both are open: a stdout closed by the caller stays closed (and its writes fail
   * as they should), and with no stderr there is nowhere better for foreign output */
  if (fcntl(STDERR_FILENO, F_GETFD) < 0) return;
  int fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (fd < 0) return;
  FILE *f = fdopen(fd, "w");
  if (!f) {
    close(fd);
    return;
  }
  /* as stdio buffers stdout: by line on a terminal, else in blocks */
  if (isatty(fd)) setvbuf(f, NULL, _IOLBF, 0);
  if (dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    fclose(f);
    return;
  }
  g_report = f;
}

FILE *cli_report(void) { return g_report ? g_report : stdout; }

void cli_drop_report(void) {
  if (!g_report) return;
  fclose(g_report); /* empty: the launcher flushes everything before it forks */
  g_report = NULL;
}

int cli_print_help(const char *text) {
  cli_out o;
  cli_out_init(&o, cli_report(), "stdout");
  if (cli_out_puts(&o, text) != 0 || cli_out_flush(&o) != 0) return cli_out_fail("--help", &o, "the help");
  return CLI_EXIT_OK;
}

int cli_close_stdout(int rc) {
  /* what a command flushed and checked is gone already; this catches anything else, and a
   * failure that stdio kept to itself. A stdout closed by the caller (>&-) with nothing left
   * to write is no failure (as coreutils' close_stdout has it). */
  FILE *report = cli_report();
  /* foreign output that went to stdout (now stderr) is not the command's to check */
  if (report != stdout) fflush(stdout);
  int pending = __fpending(report) != 0, failed = ferror(report) != 0;
  errno = 0;
  if (fclose(report) != 0 && (pending || errno != EBADF)) failed = 1;
  g_report = NULL;
  if (failed && rc == CLI_EXIT_OK) {
    cli_error("stdout", SL_ERR_IO, "cannot write to stdout: %s", errno ? strerror(errno) : "a write failed");
    rc = CLI_EXIT_ERROR;
  }
  return rc;
}
