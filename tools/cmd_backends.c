/* shardload backends: every backend and collective module this machine offers, from the
 * library's listing (sl_module_list): built in or the file it came from, its ABI version,
 * whether it runs here and why not, a backend's devices, and what "auto" would choose. What is
 * missing is part of the report, never a failure: the exit status is 0 unless the report
 * cannot be written (or memory runs out). */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <shardload/module.h> /* the memory domain bits a collective declares */

#include "cli.h"

static const char HELP[] =
    "usage: shardload backends [--json]\n"
    "\n"
    "List every backend and collective module this machine offers: the built-in ones, the\n"
    "loadable ones shardload knows by name (cuda, hip, level_zero, nccl, rccl), installed or\n"
    "not, and every other libshardload-NAME.so in the search directories (SHARDLOAD_MODULE_PATH's\n"
    "entries, then the library's own directory). For each: built in or the file it was loaded\n"
    "from, its ABI version, whether it can run here and the probe's reason when not, and for a\n"
    "backend that runs, each of its devices (started on each in turn and stopped again; the\n"
    "first is the one local rank 0 would use, the others on rows of their own below it).\n"
    "Then what --backend auto and --collective auto would choose here. Exit status 0 whatever\n"
    "is missing. Text a module gives is printed escaped (\\n, \\xNN).\n"
    "\n"
    "options:\n"
    "  --json       one JSON object on stdout instead of the tables\n"
    "  -h, --help   show this help\n";

typedef struct listing {
  const sl_module_list *list;
  sl_module_summary sum;
  size_t count;
} listing;

static int get(const listing *ls, size_t i, sl_module_info *m) {
  memset(m, 0, sizeof *m);
  m->size = sizeof *m;
  return sl_module_list_get(ls->list, i, m) == SL_OK ? 0 : -1;
}

/* What the RUNS HERE column says for a state. */
static const char *state_text(sl_module_state s) {
  switch (s) {
  case SL_MODULE_RUNS: return "yes";
  case SL_MODULE_CANNOT_RUN: return "no";
  case SL_MODULE_ABSENT: return "not installed";
  case SL_MODULE_UNLOADABLE: return "cannot load";
  case SL_MODULE_BAD_ABI: return "refused";
  }
  return "unknown";
}

static const char *domains_text(char *buf, size_t len, uint32_t d) {
  snprintf(buf, len, "%s%s%s%s", d & SL_MEM_HOST ? "host," : "", d & SL_MEM_PINNED ? "pinned," : "",
           d & SL_MEM_DEVICE ? "device," : "", d ? "" : "none");
  size_t n = strlen(buf);
  if (n && buf[n - 1] == ',') buf[n - 1] = 0;
  return buf;
}

/* ---- JSON -------------------------------------------------------------------------------- */

static json_t *text_or_null(const char *s) { return s && *s ? cli_json_text(s) : json_null(); }

static int set_path(json_t *o, const char *path) {
  return path ? cli_json_set_path(o, "path", path) : json_object_set_new(o, "path", json_null());
}

static json_t *module_json(const sl_module_info *m) {
  json_t *o = json_object();
  char dom[32];
  int bad = !o;
  bad |= json_object_set_new(o, "name", cli_json_text(m->name));
  bad |= json_object_set_new(o, "builtin", json_boolean(m->builtin));
  bad |= set_path(o, m->path);
  bad |= json_object_set_new(o, "abi_version", m->abi_version ? json_integer(m->abi_version) : json_null());
  bad |= json_object_set_new(o, "state", json_string(sl_module_state_name(m->state)));
  bad |= json_object_set_new(o, "runs", json_boolean(m->state == SL_MODULE_RUNS));
  bad |= json_object_set_new(o, "probe", json_integer(m->probe));
  bad |= json_object_set_new(o, "reason", text_or_null(m->reason));
  if (m->kind == SL_MODULE_BACKEND) {
    bad |= json_object_set_new(o, "device", text_or_null(m->device)); /* device 0's, as before the list */
    json_t *devs = json_array();
    bad |= !devs;
    for (size_t i = 0; devs && i < m->device_count; i++) bad |= json_array_append_new(devs, cli_json_text(m->devices[i]));
    bad |= json_object_set_new(o, "devices", devs);
    bad |= json_object_set_new(o, "devices_not_listed", json_integer((json_int_t)m->devices_not_listed));
    bad |= json_object_set_new(o, "memory_bytes", m->memory_bytes ? json_integer((json_int_t)m->memory_bytes)
                                                                  : json_null());
    bad |= json_object_set_new(o, "preferred_collective", text_or_null(m->pairs_with));
  } else {
    bad |= json_object_set_new(o, "probed_with", text_or_null(m->probed_with));
    bad |= json_object_set_new(o, "device_backend", text_or_null(m->pairs_with));
    json_t *d = json_array();
    domains_text(dom, sizeof dom, m->domains);
    for (char *save = NULL, *t = strtok_r(dom, ",", &save); d && t && m->domains; t = strtok_r(NULL, ",", &save))
      bad |= json_array_append_new(d, json_string(t));
    bad |= json_object_set_new(o, "domains", d);
  }
  if (!bad) return o;
  json_decref(o);
  return NULL;
}

static json_t *choice_json(const char *name, const char *reason) {
  json_t *o = json_object();
  int bad = !o;
  bad |= json_object_set_new(o, "name", text_or_null(name));
  bad |= json_object_set_new(o, "reason", text_or_null(reason));
  if (!bad) return o;
  json_decref(o);
  return NULL;
}

/* The report; NULL when out of memory (a document with modules left out would read as a
 * machine without them). */
static json_t *report_json(const listing *ls) {
  json_t *root = json_object(), *be = json_array(), *co = json_array(), *au = json_object(), *dirs = json_array();
  int bad = !root || !be || !co || !au || !dirs;
  for (size_t i = 0; i < ls->count && !bad; i++) {
    sl_module_info m;
    bad |= get(ls, i, &m);
    if (!bad) bad |= json_array_append_new(m.kind == SL_MODULE_BACKEND ? be : co, module_json(&m));
  }
  const sl_module_summary *s = &ls->sum;
  bad |= json_object_set_new(au, "backend", choice_json(s->auto_backend, s->auto_backend_reason));
  bad |= json_object_set_new(au, "collective", choice_json(s->auto_collective, s->auto_collective_reason));
  bad |= json_object_set_new(au, "collective_one_rank",
                             choice_json(s->auto_collective_one_rank, s->auto_collective_one_rank_reason));
  for (size_t i = 0; i < s->dir_count && !bad; i++) {
    json_t *value, *hex;
    bad |= cli_json_path_values(s->dirs[i], &value, &hex);
    json_decref(hex); /* a directory that is not UTF-8 reads with U+FFFD: it is for people */
    if (!bad) bad |= json_array_append_new(dirs, value);
  }
  bad |= json_object_set_new(root, "backends", be);
  bad |= json_object_set_new(root, "collectives", co);
  bad |= json_object_set_new(root, "auto", au);
  bad |= json_object_set_new(root, "search_path", dirs);
  bad |= json_object_set_new(root, "not_listed", json_integer((json_int_t)s->not_listed));
  if (!bad) return root;
  json_decref(root);
  return NULL;
}

/* ---- tables ------------------------------------------------------------------------------ */

static const char *from_text(const sl_module_info *m) { return m->builtin ? "built in" : m->path ? m->path : "-"; }

/* A backend's devices past the first, one a row under the first's, indented to its column
 * (the first is on the module's own row); then how many the listing left out. */
static void print_more_devices(cli_out *o, const sl_module_info *m, int indent) {
  for (size_t i = 1; i < m->device_count && !o->err; i++) {
    cli_out_printf(o, "%*s", indent, "");
    cli_out_escaped(o, m->devices[i], 0);
    cli_out_puts(o, "\n");
  }
  if (m->devices_not_listed)
    cli_out_printf(o, "%*s(%zu more device%s not listed: at most %d are)\n", indent, "", m->devices_not_listed,
                   m->devices_not_listed == 1 ? "" : "s", SL_MODULE_DEVICES_MAX);
}

/* One table of KIND: NAME, RUNS HERE, ABI, FROM (column widths from the content), then the
 * devices of a backend that runs (the first on its row, the others below it) or the reason of
 * one that does not (a collective's with the backend it was probed with). Every text from a
 * module or a path is written escaped. */
static void print_kind(cli_out *o, const listing *ls, sl_module_kind kind) {
  int wname = 4, wfrom = 4, wwith = 11;
  sl_module_info m;
  for (size_t i = 0; i < ls->count; i++) {
    if (get(ls, i, &m) != 0 || m.kind != kind) continue;
    if ((int)cli_escaped_len(m.name) > wname) wname = (int)cli_escaped_len(m.name);
    if ((int)cli_escaped_len(from_text(&m)) > wfrom) wfrom = (int)cli_escaped_len(from_text(&m));
    if (m.probed_with && (int)cli_escaped_len(m.probed_with) > wwith) wwith = (int)cli_escaped_len(m.probed_with);
  }
  bool coll = kind == SL_MODULE_COLLECTIVE;
  cli_out_printf(o, "%s\n%-*s  %-13s  %-3s  %-*s  ", coll ? "collectives:" : "backends:", wname, "NAME", "RUNS HERE",
                 "ABI", wfrom, "FROM");
  if (coll) cli_out_printf(o, "%-*s  %-18s  ", wwith, "PROBED WITH", "DOMAINS");
  cli_out_printf(o, "%s\n", coll ? "REASON" : "DEVICE OR REASON");
  for (size_t i = 0; i < ls->count && !o->err; i++) {
    if (get(ls, i, &m) != 0 || m.kind != kind) continue;
    char abi[16] = "-", dom[32], mem[32];
    if (m.abi_version) snprintf(abi, sizeof abi, "%u", m.abi_version);
    cli_out_escaped(o, m.name, wname);
    cli_out_printf(o, "  %-13s  %-3s  ", state_text(m.state), abi);
    cli_out_escaped(o, from_text(&m), wfrom);
    cli_out_puts(o, "  ");
    if (coll) {
      cli_out_escaped(o, m.probed_with ? m.probed_with : "-", wwith);
      const char *d = m.abi_version ? domains_text(dom, sizeof dom, m.domains) : "-";
      if (*m.reason) cli_out_printf(o, "  %-18s  ", d);
      else cli_out_printf(o, "  %s", d); /* no padding at the end of a line */
      cli_out_escaped(o, m.reason, 0);
    } else if (m.state == SL_MODULE_RUNS) {
      cli_out_escaped(o, m.device, 0);
      if (m.memory_bytes) cli_out_printf(o, ", %s", cli_human_bytes(mem, sizeof mem, m.memory_bytes));
      if (*m.reason) cli_out_puts(o, "; auto passes it over: "); /* it runs, and its probe said 0 */
      cli_out_escaped(o, m.reason, 0);
    } else {
      cli_out_escaped(o, m.reason, 0);
    }
    cli_out_puts(o, "\n");
    /* under the DEVICE column: NAME, RUNS HERE (13), ABI (3) and FROM, two spaces after each */
    if (!coll && m.state == SL_MODULE_RUNS) print_more_devices(o, &m, wname + 2 + 13 + 2 + 3 + 2 + wfrom + 2);
  }
}

static void print_choice(cli_out *o, const char *what, const char *name, const char *reason) {
  cli_out_printf(o, "  %-28s", what);
  cli_out_escaped(o, name ? name : "(none)", 0);
  cli_out_puts(o, " (");
  cli_out_escaped(o, reason ? reason : "", 0);
  cli_out_puts(o, ")\n");
}

static int print_table(cli_out *o, const listing *ls) {
  const sl_module_summary *s = &ls->sum;
  print_kind(o, ls, SL_MODULE_BACKEND);
  cli_out_puts(o, "\n");
  print_kind(o, ls, SL_MODULE_COLLECTIVE);
  cli_out_puts(o, "\nauto here:\n");
  print_choice(o, "backend", s->auto_backend, s->auto_backend_reason);
  print_choice(o, "collective, several ranks", s->auto_collective, s->auto_collective_reason);
  print_choice(o, "collective, one rank", s->auto_collective_one_rank, s->auto_collective_one_rank_reason);
  cli_out_puts(o, "\nmodule files are looked for in: ");
  for (size_t i = 0; i < s->dir_count; i++) {
    cli_out_escaped(o, s->dirs[i], 0);
    cli_out_puts(o, ", ");
  }
  cli_out_puts(o, "then the dynamic loader's path (for the names above)\n");
  if (s->not_listed)
    cli_out_printf(o, "%zu more installed module file%s not listed (at most %d are, in name order)\n", s->not_listed,
                   s->not_listed == 1 ? "" : "s", SL_MODULE_LIST_MAX);
  return cli_out_flush(o) == 0 ? CLI_EXIT_OK : cli_out_fail("backends", o, "the table");
}

int cli_cmd_backends(int argc, char **argv) {
  static const struct option longopts[] = {
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {0, 0, 0, 0},
  };
  int json = 0, c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 'j': json = 1; break;
    case 'h': return cli_print_help(HELP);
    default: return cli_bad_option("backends", c, argv);
    }
  }
  if (optind != argc) return cli_usage_error(argv[optind], "takes no argument; run 'shardload backends --help'");
  sl_module_list *list = NULL;
  sl_status st = sl_module_list_create(NULL, &list);
  if (st != SL_OK) {
    cli_error("backends", st, "%s", st == SL_ERR_NOMEM ? "out of memory listing the modules" : sl_strerror(st));
    return CLI_EXIT_ERROR;
  }
  listing ls = {.list = list, .count = sl_module_list_count(list)};
  ls.sum.size = sizeof ls.sum;
  int rc = CLI_EXIT_OK;
  if (sl_module_list_summary(list, &ls.sum) != SL_OK) {
    cli_error("backends", SL_ERR_INVALID, "the library gave no module summary");
    rc = CLI_EXIT_ERROR;
    goto out_list;
  }
  cli_out o;
  cli_out_init(&o, cli_report(), "stdout");
  if (json) {
    json_t *root = report_json(&ls);
    if (!root) {
      cli_error("backends", SL_ERR_NOMEM, "out of memory writing the JSON report of %zu modules", ls.count);
      rc = CLI_EXIT_ERROR;
      goto out_list;
    }
    rc = cli_out_json_document(&o, root) == 0 ? CLI_EXIT_OK : cli_out_fail("backends", &o, "the JSON report");
    json_decref(root);
  } else {
    rc = print_table(&o, &ls);
  }
out_list:
  sl_module_list_destroy(list);
  return rc;
}
