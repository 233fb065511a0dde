/* Launcher environment: which rank this process is, of how many, and where the ranks meet.
 *
 * Launchers announce ranks through environment variables. torchrun (and anything imitating it:
 * Accelerate, DeepSpeed, Lightning) sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT;
 * srun sets SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; mpirun (Open MPI) sets
 * OMPI_COMM_WORLD_*. A torchrun job started under Slurm has both sets, and torchrun's are the
 * truth there (one srun task may host several torchrun ranks), hence torchrun, then Slurm,
 * then Open MPI. Every value is validated, because a wrong rank makes the job hang at
 * rendezvous instead of failing: the message names the variable so the user knows whom to
 * blame.
 *
 * torchrun's agent serves a torch c10d TCPStore on MASTER_ADDR:MASTER_PORT itself and says so to
 * its workers with TORCHELASTIC_USE_AGENT_STORE=True (torch's default for torchrun). Rank 0
 * cannot serve shardload's own store on that port then, so the ranks become clients of the
 * agent's store instead: c10d://MASTER_ADDR:MASTER_PORT. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

/* Slurm has no MASTER_PORT of its own; torch's conventional default. */
#define SLURM_DEFAULT_PORT 29500

/* Why a world is at most SL_MAX_WORLD_SIZE ranks, for messages. */
#define WORLD_BOUND_WHY                                                                          \
  "the most ranks shardload's rendezvous serves: each rank connects to every other one, and rank 0's " \
  "store holds each rank's addresses for all the others; see docs/DESIGN.md#rendezvous"

/* Reads integer variable NAME in [MIN, MAX] (MAX <= INT_MAX); WHY (or NULL) says why the range
 * is what it is. Absent: *present = false, OK, *OUT untouched. */
static sl_status env_int_why(sl_context *ctx, const char *name, long min, long max, const char *why,
                             bool *present, int *out) {
  const char *v = getenv(name);
  *present = v != NULL;
  if (!v) return SL_OK;
  char *end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  const char *sep = why ? ": " : "", *because = why ? why : "";
  /* strtol accepts leading blanks and "+"; a launcher never writes those, a typo might */
  if (!*v || end == v || *end || v[0] == ' ' || v[0] == '\t' || v[0] == '+')
    return sl__fail(ctx, SL_ERR_INVALID, "%s='%s' is not an integer; fix or unset it", name, v);
  if (errno == ERANGE)
    return sl__fail(ctx, SL_ERR_INVALID, "%s='%s' is out of range (%ld..%ld%s%s); fix or unset it", name, v, min,
                    max, sep, because);
  if (x < min || x > max)
    return sl__fail(ctx, SL_ERR_INVALID, "%s=%ld is out of range (%ld..%ld%s%s); fix or unset it", name, x, min,
                    max, sep, because);
  *out = (int)x;
  return SL_OK;
}

static sl_status env_int(sl_context *ctx, const char *name, long min, long max, bool *present, int *out) {
  return env_int_why(ctx, name, min, max, NULL, present, out);
}

sl_status sl__world_size_check(sl_context *ctx, const char *from, long world) {
  if (world <= SL_MAX_WORLD_SIZE) return SL_OK;
  return sl__fail(ctx, SL_ERR_INVALID, "%s=%ld is out of range (1..%d: " WORLD_BOUND_WHY "); give fewer ranks",
                  from, world, SL_MAX_WORLD_SIZE);
}

/* This node's task count in the Slurm step: SLURM_STEP_TASKS_PER_NODE lists the step's nodes in
 * SLURM_NODEID order, compressed ("2(x3),1": two tasks on each of nodes 0-2, one on node 3).
 * Unlike SLURM_NTASKS_PER_NODE (the --ntasks-per-node asked for, inherited from sbatch even by
 * an srun of another layout) it is what the step runs. 0 when either variable is absent or
 * malformed. */
static int slurm_step_tasks_here(void) {
  const char *list = getenv("SLURM_STEP_TASKS_PER_NODE"), *id = getenv("SLURM_NODEID");
  if (!list || !id || !*id || strspn(id, "0123456789") != strlen(id) || strlen(id) > 9) return 0;
  long node = strtol(id, NULL, 10);
  const char *p = list;
  while (*p) {
    char *end;
    errno = 0;
    long tasks = strtol(p, &end, 10), times = 1;
    if (end == p || errno || tasks < 1 || tasks > INT_MAX) return 0;
    p = end;
    if (*p == '(') {
      if (p[1] != 'x') return 0;
      times = strtol(p + 2, &end, 10);
      if (end == p + 2 || errno || times < 1 || *end != ')') return 0;
      p = end + 1;
    }
    if (node < times) return (int)tasks;
    node -= times;
    if (*p == ',') p++;
    else if (*p) return 0;
  }
  return 0;
}

/* A launcher's local rank must be below its own count of the node's ranks: past it, the rank
 * would pick a device that belongs to no rank of the node, or another rank's. Only the pair
 * one launcher sets together is compared (torchrun under Slurm: LOCAL_RANK counts torchrun's
 * ranks on the node, SLURM_NTASKS_PER_NODE srun's tasks); Slurm's count only when it is a
 * plain integer ("2(x3)" names no single size). */
static sl_status local_rank_check(sl_context *ctx, const char *local_var, const char *count_var, int local_rank) {
  int step = strcmp(count_var, "SLURM_NTASKS_PER_NODE") == 0 ? slurm_step_tasks_here() : 0;
  if (step > 0) {
    if (local_rank < step) return SL_OK;
    return sl__fail(ctx, SL_ERR_INVALID,
                    "%s=%d is not less than this node's %d tasks in the Slurm step (SLURM_STEP_TASKS_PER_NODE=%s at "
                    "SLURM_NODEID=%s); local ranks count from 0 on each node: check the launcher's variables",
                    local_var, local_rank, step, getenv("SLURM_STEP_TASKS_PER_NODE"), getenv("SLURM_NODEID"));
  }
  const char *v = getenv(count_var);
  if (!v || (!strcmp(count_var, "SLURM_NTASKS_PER_NODE") && (!*v || strspn(v, "0123456789") != strlen(v))))
    return SL_OK;
  bool present;
  int count = 0;
  sl_status st = env_int(ctx, count_var, 1, INT_MAX, &present, &count);
  if (st != SL_OK) return st;
  if (local_rank >= count)
    return sl__fail(ctx, SL_ERR_INVALID,
                    "%s=%d is not less than %s=%d; local ranks count from 0 on each node: check the launcher's "
                    "variables", local_var, local_rank, count_var, count);
  return SL_OK;
}

/* Reads a rank/size/local-rank triple; SIZE_VAR is required once RANK_VAR is set, and the
 * local rank is checked against COUNT_VAR, the launcher's count of the node's ranks. */
static sl_status env_triple(sl_context *ctx, const char *rank_var, const char *size_var,
                            const char *local_var, const char *count_var, sl__launch_info *out) {
  bool has_rank, has_size, has_local;
  sl_status st;
  if ((st = env_int(ctx, rank_var, 0, INT_MAX - 1, &has_rank, &out->rank)) != SL_OK) return st;
  if ((st = env_int_why(ctx, size_var, 1, SL_MAX_WORLD_SIZE, WORLD_BOUND_WHY, &has_size, &out->world_size)) != SL_OK)
    return st;
  if ((st = env_int(ctx, local_var, 0, INT_MAX - 1, &has_local, &out->local_rank)) != SL_OK) return st;
  if (!has_rank || !has_size)
    return sl__fail(ctx, SL_ERR_INVALID, "%s is set but %s is not (%s launchers set both); set it or unset %s",
                    has_rank ? rank_var : size_var, has_rank ? size_var : rank_var, out->source,
                    has_rank ? rank_var : size_var);
  /* Without a local rank, ranks on one node spread over its devices (local_rank % devices). */
  if (!has_local) out->local_rank = out->rank;
  if (out->rank >= out->world_size)
    return sl__fail(ctx, SL_ERR_INVALID, "%s=%d is not less than %s=%d; ranks count from 0", rank_var,
                    out->rank, size_var, out->world_size);
  if (has_local && out->local_rank >= out->world_size)
    return sl__fail(ctx, SL_ERR_INVALID, "%s=%d is not less than %s=%d", local_var, out->local_rank, size_var,
                    out->world_size);
  if (has_local) return local_rank_check(ctx, local_var, count_var, out->local_rank);
  return SL_OK;
}

/* SCHEME://HOST:PORT, with IPv6 literals bracketed. */
static sl_status make_url(sl_context *ctx, const char *scheme, const char *host, int port, char **url) {
  const char *fmt = strchr(host, ':') && host[0] != '[' ? "%s://[%s]:%d" : "%s://%s:%d";
  if (asprintf(url, fmt, scheme, host, port) < 0) {
    *url = NULL;
    return sl__fail(ctx, SL_ERR_NOMEM, "out of memory building the rendezvous address");
  }
  return SL_OK;
}

/* Whether torchrun's agent serves the store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE, which
 * torch writes as Python's str(bool)). */
static sl_status agent_store(sl_context *ctx, bool *out) {
  const char *v = getenv("TORCHELASTIC_USE_AGENT_STORE");
  *out = false;
  if (!v) return SL_OK;
  if (!strcasecmp(v, "true") || !strcmp(v, "1")) *out = true;
  else if (strcasecmp(v, "false") && strcmp(v, "0"))
    return sl__fail(ctx, SL_ERR_INVALID,
                    "TORCHELASTIC_USE_AGENT_STORE='%s' is neither True nor False (torchrun sets it); fix or unset it",
                    v);
  return SL_OK;
}

/* The rendezvous from MASTER_ADDR/MASTER_PORT; under Slurm the launch node and port 29500
 * stand in for whichever is missing. NULL when there is no address at all. c10d:// when
 * torchrun's agent serves its store there, tcp:// otherwise. */
static sl_status master_rendezvous(sl_context *ctx, bool slurm, char **url) {
  *url = NULL;
  bool agent = false;
  const char *addr = getenv("MASTER_ADDR");
  bool has_port;
  int port = 0;
  sl_status st = env_int(ctx, "MASTER_PORT", 1, 65535, &has_port, &port);
  if (st != SL_OK) return st;
  if (addr && !*addr)
    return sl__fail(ctx, SL_ERR_INVALID, "MASTER_ADDR is set but empty; give rank 0's host name or address");
  if (slurm) {
    /* srun's launch node is the batch host, where task 0 runs under the default block
     * distribution; an srun from a login node needs MASTER_ADDR. */
    const char *launch = getenv("SLURM_LAUNCH_NODE_IPADDR");
    if (!addr && launch && *launch) addr = launch;
    if (!addr) return SL_OK; /* the caller says what to set */
    if (!has_port) port = SLURM_DEFAULT_PORT;
    has_port = true;
  }
  if (!addr && !has_port) return SL_OK;
  if (!addr)
    return sl__fail(ctx, SL_ERR_INVALID, "MASTER_PORT is set but MASTER_ADDR is not; set both (or SHARDLOAD_RENDEZVOUS)");
  if (!has_port)
    return sl__fail(ctx, SL_ERR_INVALID, "MASTER_ADDR is set but MASTER_PORT is not; set both (or SHARDLOAD_RENDEZVOUS)");
  if (!slurm && (st = agent_store(ctx, &agent)) != SL_OK) return st;
  return make_url(ctx, agent ? "c10d" : "tcp", addr, port, url);
}

sl_status sl__launch_rendezvous(sl_context *ctx, bool slurm, char **url) {
  *url = NULL;
  sl_status st;
  const char *override = getenv("SHARDLOAD_RENDEZVOUS");
  const char *from = "SHARDLOAD_RENDEZVOUS";
  if (override) {
    if (!*override)
      return sl__fail(ctx, SL_ERR_INVALID,
                      "SHARDLOAD_RENDEZVOUS is set but empty; give file://DIR, tcp://HOST:PORT or c10d://HOST:PORT, "
                      "or unset it");
    if (!(*url = sl__strdup(override)))
      return sl__fail(ctx, SL_ERR_NOMEM, "out of memory copying SHARDLOAD_RENDEZVOUS");
  } else {
    from = slurm ? "MASTER_ADDR/MASTER_PORT (or SLURM_LAUNCH_NODE_IPADDR)" : "MASTER_ADDR/MASTER_PORT";
    if ((st = master_rendezvous(ctx, slurm, url)) != SL_OK) return st;
  }
  if (*url) {
    sl__rendezvous r;
    char err[512];
    if ((st = sl__rendezvous_parse(*url, &r, err, sizeof err)) != SL_OK) {
      st = sl__fail(ctx, st, "%s gives rendezvous '%s': %s", from, *url, err);
      free(*url);
      *url = NULL;
      return st;
    }
  }
  return SL_OK;
}

sl_status sl__launch_env(sl_context *ctx, sl__launch_info *out) {
  memset(out, 0, sizeof *out);
  out->world_size = 1;
  out->source = "default";
  sl_status st;
  bool slurm = false;

  if (getenv("RANK") || getenv("WORLD_SIZE")) {
    out->source = "torchrun";
    st = env_triple(ctx, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", out);
  } else if (getenv("SLURM_PROCID")) {
    out->source = "slurm";
    slurm = true;
    st = env_triple(ctx, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", out);
  } else if (getenv("OMPI_COMM_WORLD_RANK") || getenv("OMPI_COMM_WORLD_SIZE")) {
    out->source = "openmpi";
    st = env_triple(ctx, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE", out);
  } else {
    st = SL_OK;
  }
  if (st != SL_OK) goto out_fail;
  if ((st = sl__launch_rendezvous(ctx, slurm, &out->rendezvous)) != SL_OK) goto out_fail;
  if (!out->rendezvous && out->world_size > 1) {
    st = sl__fail(ctx, SL_ERR_INVALID,
                  "%s says rank %d of %d but gives no rendezvous: set MASTER_ADDR and MASTER_PORT (rank 0's "
                  "host and a free port), or SHARDLOAD_RENDEZVOUS=tcp://HOST:PORT, c10d://HOST:PORT or file://DIR",
                  out->source, out->rank, out->world_size);
    goto out_fail;
  }
  return SL_OK;

out_fail:
  free(out->rendezvous);
  out->rendezvous = NULL;
  return st;
}

/* The ranks of this job on this node, for backends that split a node's devices (and data
 * collectives that group a node's ranks). torchrun says LOCAL_WORLD_SIZE; Slurm says this
 * node's count in SLURM_STEP_TASKS_PER_NODE (slurm_step_tasks_here), else
 * SLURM_NTASKS_PER_NODE only with --ntasks-per-node, which it writes as "2(x3)" or "4,2" for
 * uneven nodes, naming no single size: such a value is skipped rather than refused;
 * Open MPI says OMPI_COMM_WORLD_LOCAL_SIZE; in the precedence of sl__launch_env. The context
 * reads it for explicit multi-rank jobs too (`load --nproc` sets LOCAL_WORLD_SIZE). */
sl_status sl__launch_local_world_size(sl_context *ctx, int *out) {
  *out = 1;
  bool present;
  sl_status st = env_int(ctx, "LOCAL_WORLD_SIZE", 1, INT_MAX, &present, out);
  if (st != SL_OK || present) return st;
  if (getenv("SLURM_PROCID") && (*out = slurm_step_tasks_here()) > 0) return SL_OK;
  *out = 1;
  const char *slurm = getenv("SLURM_NTASKS_PER_NODE");
  if (slurm && *slurm && strspn(slurm, "0123456789") == strlen(slurm)) {
    if ((st = env_int(ctx, "SLURM_NTASKS_PER_NODE", 1, INT_MAX, &present, out)) != SL_OK || present) return st;
  }
  return env_int(ctx, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, INT_MAX, &present, out);
}

/* Fails with a message in ERR; always SL_ERR_INVALID. */
static sl_status bad_url(char *err, size_t errlen, const char *url, const char *why) {
  /* echo at most 160 characters of the URL, so the reason always fits in 512 */
  snprintf(err, errlen, "rendezvous '%.160s%s': %s; expected file://DIR (a directory every rank shares), "
           "tcp://HOST:PORT (rank 0's host and a free port) or c10d://HOST:PORT (a torch c10d store, as "
           "torchrun's)", url, strlen(url) > 160 ? "..." : "", why);
  return SL_ERR_INVALID;
}

sl_status sl__rendezvous_parse(const char *url, sl__rendezvous *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (!url || !*url) return bad_url(err, errlen, url ? url : "", "empty");
  if (strncmp(url, "file://", 7) == 0) {
    const char *dir = url + 7;
    if (!*dir) return bad_url(err, errlen, url, "no directory after file://");
    if (strlen(dir) >= sizeof out->path) return bad_url(err, errlen, url, "directory path too long");
    out->kind = SL__RDZV_FILE;
    strcpy(out->path, dir);
    return SL_OK;
  }
  sl__rdzv_kind kind;
  const char *h;
  if (strncmp(url, "tcp://", 6) == 0) {
    kind = SL__RDZV_TCP;
    h = url + 6;
  } else if (strncmp(url, "c10d://", 7) == 0) {
    kind = SL__RDZV_C10D;
    h = url + 7;
  } else {
    return bad_url(err, errlen, url, "unknown scheme");
  }

  const char *hend, *colon;
  if (*h == '[') { /* [v6]:port */
    h++;
    hend = strchr(h, ']');
    if (!hend) return bad_url(err, errlen, url, "'[' without ']'");
    colon = hend + 1;
    if (*colon != ':') return bad_url(err, errlen, url, "no ':PORT' after ']'");
  } else {
    colon = strrchr(h, ':');
    if (!colon) return bad_url(err, errlen, url, "no ':PORT'");
    hend = colon;
    if (memchr(h, ':', (size_t)(hend - h)))
      return bad_url(err, errlen, url, "an IPv6 address needs brackets, as in tcp://[::1]:29500");
  }
  size_t hlen = (size_t)(hend - h);
  if (hlen == 0) return bad_url(err, errlen, url, "no host");
  if (hlen >= sizeof out->host) return bad_url(err, errlen, url, "host name too long");
  if (memchr(h, '/', hlen)) return bad_url(err, errlen, url, "'/' in the host");

  const char *p = colon + 1;
  long port = 0;
  if (!*p) return bad_url(err, errlen, url, "no port after ':'");
  for (const char *c = p; *c; c++) {
    if (*c < '0' || *c > '9') return bad_url(err, errlen, url, "the port is not a number");
    port = port * 10 + (*c - '0');
    if (port > 65535) break;
  }
  if (port < 1 || port > 65535) return bad_url(err, errlen, url, "the port is not in 1..65535");

  out->kind = kind;
  memcpy(out->host, h, hlen);
  out->host[hlen] = 0;
  out->port = (int)port;
  return SL_OK;
}
