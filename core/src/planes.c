/* The control plane and the data plane of a context (planes.h; docs/DESIGN.md#modules).
 *
 * The control plane carries every agreement, manifest and status in host memory and is always
 * the module that works everywhere: Gloo, or local for one rank. The data plane carries tensor
 * bytes and may be a device collective (NCCL, simccl); since a device collective works only
 * when EVERY rank can run it, on a device of its own, the ranks agree on it over the control
 * plane: each contributes fixed-size records (what it was asked for, its backend and device and
 * where that device is, then what the candidate's probe said), and every rank decides from the
 * same tables in the same way, so all choose the same module or all fail with the same
 * message. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include "planes.h"
#include "ranks_agree.h"

/* ---- control-plane collectives ----------------------------------------------------------- */

/* After sl_context_abort every control op fails with one message, whatever the module's own
 * failure said, so callers (and users) see why. */
static sl_status ctl_result(sl_context *ctx, sl_status st, const char *op) {
  if (!__atomic_load_n(&ctx->aborted, __ATOMIC_ACQUIRE)) return st;
  return sl__fail(ctx, SL_ERR_COMM,
                  "rank %d: %s on the control plane aborted: sl_context_abort was called on this context "
                  "(a signal handler or another thread); destroy the context",
                  ctx->rank, op);
}

sl_status sl__ctl_broadcast(sl_context *ctx, void *buf, size_t bytes, int root) {
  sl_status st = ctl_result(ctx, SL_OK, "broadcast");
  if (st == SL_OK) st = ctl_result(ctx, ctx->ctl->broadcast(ctx->ctl_comm, buf, bytes, root, NULL), "broadcast");
  return st;
}

sl_status sl__ctl_allgather(sl_context *ctx, const void *sendbuf, void *recvbuf, size_t bytes) {
  sl_status st = ctl_result(ctx, SL_OK, "allgather");
  if (st == SL_OK) st = ctl_result(ctx, ctx->ctl->allgather(ctx->ctl_comm, sendbuf, recvbuf, bytes, NULL), "allgather");
  return st;
}

sl_status sl__ctl_barrier(sl_context *ctx) {
  sl_status st = ctl_result(ctx, SL_OK, "barrier");
  if (st == SL_OK) st = ctl_result(ctx, ctx->ctl->barrier(ctx->ctl_comm), "barrier");
  return st;
}

/* What data modules bootstrap through (sl_collective_init.control). */
static sl_status control_broadcast(void *c, void *buf, size_t bytes, int root) {
  return sl__ctl_broadcast(c, buf, bytes, root);
}

static sl_status control_allgather(void *c, const void *sendbuf, void *recvbuf, size_t bytes) {
  return sl__ctl_allgather(c, sendbuf, recvbuf, bytes);
}

/* ---- the agreement on the data collective ---------------------------------------------------- */

/* Two exchanges, so that no rank opens a module the choice does not need: first what each rank
 * was asked for and what its backend prefers; then, when that names a candidate (the forced
 * collective, else rank 0's backend's preferred one), every rank's probe of that one candidate.
 * A job whose rank 0 stages through host memory (the cpu backend) probes nothing: its data
 * plane is the control plane's module. */

#define PLANE_KNOWN 8    /* collectives one build lists (this one knows 7) */
#define PLANE_NAME 33    /* a module name is at most 32 characters (registry.c) */
#define PLANE_REASON 400 /* a probe's reason, cut to fit */
#define PLANE_HOST 65    /* a host name (HOST_NAME_MAX is 64) */

typedef struct plane_intent {
  char want[PLANE_NAME]; /* the collective this rank was asked for, "" for auto */
  char backend[PLANE_NAME];
  char preferred[PLANE_NAME]; /* the backend's preferred data collective, "" for host staging */
  char device[160];
  char known[PLANE_KNOWN][PLANE_NAME]; /* what this build lists: rank 0's name an unknown one */
  /* Where the device is: its identity on its machine (sl__plane_device_id, "" when its memory
   * is host memory) and the machine (the host name, and the kernel's boot id when readable). */
  char device_id[SL__PLANE_DEVICE_ID];
  char hostname[PLANE_HOST];
  char boot_id[40];
  /* with the above, what host staging through shared memory needs of every rank: one user,
   * one network namespace (abstract sockets) and one pid namespace (peers' pids) */
  uint64_t netns, pidns;
  uint32_t uid;
  int32_t pid;               /* one process per rank */
  int32_t shm_ok;            /* the shm collective's probe: memfd and abstract sockets work here */
  char host_tag[PLANE_NAME]; /* SHARDLOAD_TEST_SHM_HOST_TAG: ranks with other tags are not on one host */
} plane_intent;

typedef struct plane_verdict {
  int32_t can;   /* the probe's verdict for this rank's backend: 1 yes, 0 no */
  int32_t known; /* the candidate is one this build lists, or a module file it found */
  uint32_t domains; /* the memory domains the candidate's table declares here (0: no table) */
  char reason[PLANE_REASON];
} plane_verdict;

/* Copies S into a fixed field, cut to fit and always terminated. */
static void put(char *dst, size_t len, const char *s) {
  size_t n = 0;
  for (; s && n + 1 < len && s[n]; n++) dst[n] = s[n];
  dst[n] = 0;
}

/* Text that came over the wire, made a string and made safe to print (a peer is not trusted to
 * have done either). */
static void take_text(char *field, size_t len) {
  field[len - 1] = 0;
  sl__module_text(field, len);
}

void sl__plane_device_id(const sl_context *ctx, char *buf, size_t len) {
  if (!len) return;
  buf[0] = 0;
  if (ctx->be->flags & SL_BACKEND_DEVICE_IS_HOST) return; /* each process's own memory */
  if (SL_HAS_OP(ctx->be, device_identity)) {
    ctx->be->device_identity(ctx->be_ctx, buf, len);
    buf[len - 1] = 0;
    sl__module_text(buf, len);
  }
  /* No identity from the backend: assume that its ordinals name the same devices in every
   * process of the machine. That holds unless the ranks see different device lists (per-rank
   * CUDA_VISIBLE_DEVICES), where it may take two devices for one: host staging, never a
   * device collective on a shared device. */
  if (!buf[0]) snprintf(buf, len, "ordinal %d", ctx->device_ordinal);
}

/* The machine this rank runs on: its host name, and the kernel's boot id, which is one per boot
 * of one machine and shared by the containers on it (whose host names may differ), so that a
 * device address compared under it names one physical device; and two machines that carry one
 * host name ("localhost") are told apart. */
static uint64_t ns_inode(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static void machine_identity(plane_intent *r) {
  r->netns = ns_inode("/proc/self/ns/net");
  r->pidns = ns_inode("/proc/self/ns/pid");
  r->uid = (uint32_t)geteuid();
  r->pid = (int32_t)getpid();
  char why[160];
  r->shm_ok = sl__collective_shm()->probe("cpu", why, sizeof why) > 0;
  /* a test hook that can only make ranks look like ranks of other hosts to host_plane (not to
   * the device checks, which it would make less strict): collectives/shm/shm.c reads it too */
  put(r->host_tag, sizeof r->host_tag, getenv("SHARDLOAD_TEST_SHM_HOST_TAG"));
  if (gethostname(r->hostname, sizeof r->hostname - 1) != 0) r->hostname[0] = 0;
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = read(fd, r->boot_id, sizeof r->boot_id - 1);
  close(fd);
  r->boot_id[n > 0 ? n : 0] = 0;
  r->boot_id[strcspn(r->boot_id, "\n")] = 0;
}

static void fill_intent(const sl_context *ctx, const char *want, plane_intent *r) {
  memset(r, 0, sizeof *r);
  put(r->want, sizeof r->want, want);
  put(r->backend, sizeof r->backend, ctx->be->name);
  const char *pref = ctx->be->preferred_collective;
  put(r->preferred, sizeof r->preferred, pref && strcmp(pref, "gloo") != 0 ? pref : "");
  put(r->device, sizeof r->device, ctx->device_desc);
  const char *names[PLANE_KNOWN];
  size_t n = sl__collective_names(names, PLANE_KNOWN);
  for (size_t i = 0; i < n; i++) put(r->known[i], sizeof r->known[i], names[i]);
  sl__plane_device_id(ctx, r->device_id, sizeof r->device_id);
  machine_identity(r);
}

static void take_intent(plane_intent *r) {
  take_text(r->want, sizeof r->want);
  take_text(r->backend, sizeof r->backend);
  take_text(r->preferred, sizeof r->preferred);
  take_text(r->device, sizeof r->device);
  for (int i = 0; i < PLANE_KNOWN; i++) take_text(r->known[i], sizeof r->known[i]);
  take_text(r->device_id, sizeof r->device_id);
  take_text(r->hostname, sizeof r->hostname);
  take_text(r->boot_id, sizeof r->boot_id);
  take_text(r->host_tag, sizeof r->host_tag);
}

/* This rank's probe of the candidate NAME: the only collective module it opens to choose. */
static void fill_verdict(const sl_context *ctx, const char *name, plane_verdict *v) {
  memset(v, 0, sizeof *v);
  const char *names[PLANE_KNOWN];
  size_t n = sl__collective_names(names, PLANE_KNOWN);
  for (size_t i = 0; i < n && !v->known; i++) v->known = strcmp(names[i], name) == 0;
  int score = sl__collective_probe_domains(name, ctx->be, v->reason, sizeof v->reason, &v->domains);
  v->can = score > 0;
  v->known = v->known || score >= 0;
  if (v->can) v->reason[0] = 0;
  else if (!v->reason[0]) put(v->reason, sizeof v->reason, "its probe gave no reason");
}

/* The first rank that cannot run NAME (its reason in WHY), or -1 when every rank can. */
static int first_unable(const sl_context *ctx, const plane_intent *in, const plane_verdict *v, char *why,
                        size_t len) {
  for (int r = 0; r < ctx->world_size; r++) {
    if (v[r].can) continue;
    /* name the rank's backend unless the probe's reason did */
    if (strstr(v[r].reason, in[r].backend)) snprintf(why, len, "%s", v[r].reason);
    else snprintf(why, len, "%s; this rank's backend is %s", v[r].reason, in[r].backend);
    return r;
  }
  return -1;
}

/* One machine: the same kernel boot id where both ranks read one, else the same host name. */
static bool same_machine(const plane_intent *a, const plane_intent *b) {
  if (a->boot_id[0] && b->boot_id[0]) return strcmp(a->boot_id, b->boot_id) == 0;
  return a->hostname[0] && strcmp(a->hostname, b->hostname) == 0;
}

/* Where host staging through shared memory may join two ranks: one machine (the same boot id,
 * which both read, and host name; the same SHARDLOAD_TEST_SHM_HOST_TAG) as one user in one
 * network and pid namespace. */
static bool shm_host(const plane_intent *a, const plane_intent *b) {
  return a->boot_id[0] && strcmp(a->boot_id, b->boot_id) == 0 && strcmp(a->hostname, b->hostname) == 0 &&
         a->uid == b->uid && a->netns == b->netns && a->pidns == b->pidns && a->netns && a->pidns &&
         strcmp(a->host_tag, b->host_tag) == 0;
}

/* What the shm collective checks again at its start, for the ranks that share memory (with
 * another rank of their host, ALL false; every rank, ALL true): one process per rank (*TWIN),
 * and its probe (*BLOCKED); -1 when none. */
static void shm_blockers(const sl_context *ctx, const plane_intent *in, bool all, int *twin, int *blocked) {
  *twin = *blocked = -1;
  for (int r = 0; r < ctx->world_size && *twin < 0; r++)
    for (int q = r + 1; q < ctx->world_size && *twin < 0; q++)
      if (in[q].pid == in[r].pid && (all || shm_host(&in[r], &in[q]))) *twin = q;
  for (int r = 0; r < ctx->world_size && *twin < 0 && *blocked < 0; r++) {
    bool shares = all;
    for (int q = 0; q < ctx->world_size && !shares; q++) shares = q != r && shm_host(&in[r], &in[q]);
    if (shares && !in[r].shm_ok) *blocked = r;
  }
}

/* The hosts as host staging counts them (shm_host), numbered by their first rank: HOST_OF[r]
 * for every rank; returns how many. FIRST: scratch of N ints. */
static int number_hosts(int n, const plane_intent *in, int *host_of, int *first) {
  int hosts = 0;
  for (int r = 0; r < n; r++) {
    int h = 0;
    while (h < hosts && !shm_host(&in[first[h]], &in[r])) h++;
    if (h == hosts) first[hosts++] = r;
    host_of[r] = h;
  }
  return hosts;
}

/* Host staging: local for one rank; shm where every rank is on rank 0's machine (one boot id
 * and host name) as one user in one network and pid namespace; hier where the ranks span hosts
 * and some host has more than one (shm within each host, gloo between the hosts' leaders);
 * else gloo. The shm and hier collectives check the same evidence again at their start and
 * fail rather than trust this choice. NOTE (cut to fit) says why, for the reason text. */
static const char *host_plane(const sl_context *ctx, const plane_intent *in, int *scratch, char *note, size_t len) {
  note[0] = 0;
  if (ctx->world_size == 1) return "local";
  int other = -1;
  for (int r = 1; r < ctx->world_size && other < 0; r++)
    if (!shm_host(&in[0], &in[r])) other = r;
  int twin, blocked;
  shm_blockers(ctx, in, other < 0, &twin, &blocked);
  if (twin >= 0) {
    snprintf(note, len, "; not shm: rank %d shares a pid with another rank", twin);
    return "gloo";
  }
  if (blocked >= 0) {
    snprintf(note, len, "; not shm: rank %d cannot make a memfd or abstract socket", blocked);
    return "gloo";
  }
  if (other < 0) {
    snprintf(note, len, "; every rank shares one host");
    return "shm";
  }
  /* the hosts, numbered by their first rank, and how many ranks each has */
  /* SCRATCH: 2 x world_size ints that agree_on_data allocated with the tables (whose failure
   * every rank learns), so that no rank can choose differently for want of memory here */
  int n = ctx->world_size, hosts = 0, biggest = 0;
  int *size = scratch, *first = scratch + n;
  memset(size, 0, (size_t)n * sizeof *size);
  for (int r = 0; r < n; r++) {
    int h = 0;
    while (h < hosts && !shm_host(&in[first[h]], &in[r])) h++;
    if (h == hosts) first[hosts++] = r;
    if (++size[h] > biggest) biggest = size[h];
  }
  const char *plane = "gloo";
  if (biggest < 2) {
    snprintf(note, len, "; not shm: rank %d is not on rank 0's host (or user, or namespaces), and no host has two ranks",
             other);
  } else {
    plane = "hier";
    int used = snprintf(note, len, "; %d hosts (", hosts);
    for (int h = 0; h < hosts && used > 0 && (size_t)used < len; h++)
      used += snprintf(note + used, len - (size_t)used, "%s%d", h ? "+" : "", size[h]);
    if (used > 0 && (size_t)used < len)
      snprintf(note + used, len - (size_t)used, " ranks): shm within each host, gloo between the hosts' leaders");
  }
  return plane;
}

/* NOTE appended to the reason BUF, cut to fit. */
static void add_note(char *buf, size_t len, const char *note) {
  size_t used = strlen(buf);
  if (used + 1 < len) snprintf(buf + used, len - used, "%s", note);
}

/* The first two ranks (*A < *B) that would run the candidate on one device: the same backend and
 * device identity on one machine. Only a collective that moves device memory cares (some rank's
 * table declares SL_MEM_DEVICE; every rank reads the same tables), and only devices that are not
 * host memory (an empty identity). */
static bool shared_device(const sl_context *ctx, const plane_intent *in, const plane_verdict *v, int *a, int *b) {
  uint32_t domains = 0;
  for (int r = 0; r < ctx->world_size; r++) domains |= v[r].domains;
  if (!(domains & SL_MEM_DEVICE)) return false;
  for (*a = 0; *a < ctx->world_size; (*a)++) {
    if (!in[*a].device_id[0]) continue;
    for (*b = *a + 1; *b < ctx->world_size; (*b)++)
      if (strcmp(in[*a].device_id, in[*b].device_id) == 0 && strcmp(in[*a].backend, in[*b].backend) == 0 &&
          same_machine(&in[*a], &in[*b]))
        return true;
  }
  return false;
}

/* "HOST", or "HOST (also called OTHER: one kernel boot id)" when the ranks' names differ. */
static void machine_name(const plane_intent *a, const plane_intent *b, char *buf, size_t len) {
  const char *ha = a->hostname[0] ? a->hostname : "(no host name)";
  if (strcmp(a->hostname, b->hostname) == 0) snprintf(buf, len, "%s", ha);
  else snprintf(buf, len, "%s (also called %s: one kernel boot id)", ha, b->hostname[0] ? b->hostname : "(none)");
}

/* A forced collective that rank 0's build does not list and that is no module file there: a
 * mistake, not a missing device. The module file is suggested only for a name that could be
 * one. */
static sl_status unknown_collective(sl_context *ctx, const plane_intent *in, const plane_verdict *v,
                                    const char *want) {
  char names[PLANE_KNOWN * (PLANE_NAME + 2)] = "";
  const char *list[PLANE_KNOWN];
  size_t n = 0, used = 0;
  for (; n < PLANE_KNOWN && in[0].known[n][0]; n++) {
    list[n] = in[0].known[n];
    int k = snprintf(names + used, sizeof names - used, "%s%s", n ? ", " : "", list[n]);
    if (k > 0 && (size_t)k < sizeof names - used) used += (size_t)k;
  }
  const char *near = sl__nearest_name(want, list, n);
  char module[96] = " (not a module name: a-z, 0-9, _; at most 32 characters)";
  if (sl__module_name_ok(want))
    snprintf(module, sizeof module, ", or a module libshardload-%s.so on SHARDLOAD_MODULE_PATH", want);
  return sl__fail(ctx, SL_ERR_INVALID,
                  "collective '%s' is unknown%s%s%s: this shardload knows %s%s (rank 0: %.200s); give one of them or "
                  "auto",
                  want, near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "", names, module,
                  v[0].reason);
}

/* Every rank runs this on the same tables and so reaches the same verdict on the candidate
 * CAND (WANT when forced, else rank 0's preferred collective): CHOSEN (a module name) and
 * ctx->data_reason, or the same failure. */
static sl_status choose(sl_context *ctx, const plane_intent *in, const plane_verdict *v, int *scratch,
                        const char *want, const char *cand, char *chosen, size_t len) {
  char why[PLANE_REASON + 160], where[2 * PLANE_HOST + 48], note[160];
  const char *host = host_plane(ctx, in, scratch, note, sizeof note);
  int a, b;
  if (want) {
    if (!v[0].known) return unknown_collective(ctx, in, v, want);
    int bad = first_unable(ctx, in, v, why, sizeof why);
    if (bad >= 0)
      return sl__fail(ctx, SL_ERR_NO_DEVICE,
                      "the collective %s was asked for, but rank %d cannot run it (%s); ask for another one, "
                      "or auto",
                      want, bad, why);
    if (shared_device(ctx, in, v, &a, &b)) {
      machine_name(&in[a], &in[b], where, sizeof where);
      return sl__fail(ctx, SL_ERR_UNSUPPORTED,
                      "the collective %s was asked for, but ranks %d and %d share device %s (%s) on %s, and %s "
                      "needs one device per rank; use --collective gloo (host staging), or give each rank its "
                      "own device (--device or sl_context_options.device per rank; without one, local rank r "
                      "takes device r modulo the device count)",
                      want, a, b, in[a].device_id, in[a].backend, where, want);
    }
    put(chosen, len, want);
    snprintf(ctx->data_reason, sizeof ctx->data_reason, "%s: forced (--collective, sl_context_options.collective)",
             want);
    return SL_OK;
  }
  /* auto: rank 0's backend says which device collective its memory wants; ranks with other
   * backends take part through their probes (a device collective only when all can). */
  int bad = first_unable(ctx, in, v, why, sizeof why);
  if (bad < 0 && shared_device(ctx, in, v, &a, &b)) {
    machine_name(&in[a], &in[b], where, sizeof where);
    put(chosen, len, host);
    snprintf(ctx->data_reason, sizeof ctx->data_reason,
             "%s: ranks %d and %d share device %.48s (%.32s) on %.64s; %.32s needs one device per rank", host, a, b,
             in[a].device_id, in[a].backend, where, cand);
    add_note(ctx->data_reason, sizeof ctx->data_reason, note);
    return SL_OK;
  }
  if (bad < 0) {
    put(chosen, len, cand);
    snprintf(ctx->data_reason, sizeof ctx->data_reason, "%s: preferred by backend %s and every rank runs it", cand,
             in[0].backend);
    return SL_OK;
  }
  put(chosen, len, host);
  snprintf(ctx->data_reason, sizeof ctx->data_reason, "%s: rank %d cannot run %s (%.140s)", host, bad, cand, why);
  add_note(ctx->data_reason, sizeof ctx->data_reason, note);
  return SL_OK;
}

/* The phase of the first agreement of a context: a rank whose backend did not start fails it
 * too (report_backend_failure). */
#define AGREE_START "starting its backend and agreeing on the data collective"

/* Collective over the control plane: every rank's intent, then (when there is a candidate)
 * every rank's verdict on it, then the same verdict everywhere. */
static sl_status agree_on_data(sl_context *ctx, const char *want, char *chosen, size_t len) {
  plane_intent mine;
  plane_verdict vmine;
  fill_intent(ctx, want, &mine);
  plane_intent *in = calloc((size_t)ctx->world_size, sizeof *in);
  plane_verdict *v = calloc((size_t)ctx->world_size, sizeof *v);
  int *scratch = calloc(2 * (size_t)ctx->world_size, sizeof *scratch); /* host_plane's */
  free(ctx->host_of);
  ctx->host_of = calloc((size_t)ctx->world_size, sizeof *ctx->host_of);
  /* without the tables this rank cannot take part: say so in the agreement below, so that the
   * others fail with its message rather than waiting in the allgather */
  sl_status st = in && v && scratch && ctx->host_of ? SL_OK
                         : sl__fail(ctx, SL_ERR_NOMEM, "cannot allocate the table of %d ranks' collectives",
                                    ctx->world_size);
  if ((st = sl__agree(ctx, st, NULL, AGREE_START, NULL)) != SL_OK) goto out_free;
  if ((st = sl__ctl_allgather(ctx, &mine, in, sizeof mine)) != SL_OK) goto out_free;
  for (int r = 0; r < ctx->world_size; r++) {
    take_intent(&in[r]);
    sl__log(ctx, SL_LOG_DEBUG, "rank %d: backend %s (%s), device %s on %s (boot id %s)", r, in[r].backend, in[r].device,
            in[r].device_id[0] ? in[r].device_id : "(host memory)", in[r].hostname,
            in[r].boot_id[0] ? in[r].boot_id : "unknown");
  }
  ctx->nhosts = number_hosts(ctx->world_size, in, ctx->host_of, scratch);
  /* ranks asked for different collectives would each choose their own: refuse it on all */
  for (int r = 1; r < ctx->world_size; r++) {
    if (strcmp(in[r].want, in[0].want) == 0) continue;
    st = sl__fail(ctx, SL_ERR_MISMATCH,
                  "rank %d was asked for the data collective %s, rank 0 for %s; give every rank the same "
                  "--collective (sl_context_options.collective)",
                  r, in[r].want[0] ? in[r].want : "auto", in[0].want[0] ? in[0].want : "auto");
    goto out_free;
  }
  const char *cand = want ? want : in[0].preferred[0] ? in[0].preferred : NULL;
  if (!cand) { /* every rank knows it from the same table: none probes anything */
    char note[160];
    const char *host = host_plane(ctx, in, scratch, note, sizeof note);
    put(chosen, len, host);
    snprintf(ctx->data_reason, sizeof ctx->data_reason, "%s: backend %s of rank 0 stages through host memory", host,
             in[0].backend);
    add_note(ctx->data_reason, sizeof ctx->data_reason, note);
    goto out_free;
  }
  /* One rank moves nothing between ranks: a device collective would only cost its start (a
   * one-rank NCCL communicator takes seconds, through NCCL's bootstrap); host staging serves,
   * and a forced name still gets its collective. No module is probed. */
  if (!want && ctx->world_size == 1) {
    put(chosen, len, "local");
    snprintf(ctx->data_reason, sizeof ctx->data_reason,
             "local: one rank stages through host memory (backend %s's %s only when forced: --collective %s)",
             in[0].backend, cand, cand);
    goto out_free;
  }
  fill_verdict(ctx, cand, &vmine);
  if ((st = sl__ctl_allgather(ctx, &vmine, v, sizeof vmine)) != SL_OK) goto out_free;
  for (int r = 0; r < ctx->world_size; r++) take_text(v[r].reason, sizeof v[r].reason);
  st = choose(ctx, in, v, scratch, want, cand, chosen, len);
out_free:
  free(scratch);
  free(v);
  free(in);
  return st;
}

/* ---- opening and closing ------------------------------------------------------------------- */

/* What both planes' modules are started with: the job, its rendezvous and key spaces. */
static sl_collective_init job_init(const sl_context *ctx, const sl_collective_ops *ops, const char *prefix,
                                   const char *lobby, const char *job_key) {
  sl_collective_init ci = {
      .size = sizeof ci,
      .host = &ctx->host,
      .rank = ctx->rank,
      .world_size = ctx->world_size,
      .rendezvous = ctx->rendezvous,
      .prefix = prefix,
      .timeout_ms = ctx->timeout_ms,
      .lobby = lobby,
      .job_key = job_key ? job_key : "",
      .device = -1,
      .local_rank = ctx->local_rank,
      .local_world_size = ctx->local_world_size,
      .ops = ops,
  };
  return ci;
}

static sl_status open_control(sl_context *ctx, const char *prefix, const char *lobby, const char *job_key) {
  const char *name = ctx->world_size == 1 ? "local" : "gloo";
  sl_status st = sl__collective_select(ctx, name, &ctx->ctl, &ctx->ctl_dl, &ctx->ctl_shim);
  if (st != SL_OK) return st;
  if (ctx->world_size > 1 && !ctx->rendezvous)
    return sl__fail(ctx, SL_ERR_INVALID,
                    "rank %d of %d has no rendezvous: set MASTER_ADDR and MASTER_PORT, SHARDLOAD_RENDEZVOUS, "
                    "or the rendezvous option (file://DIR or tcp://HOST:PORT)",
                    ctx->rank, ctx->world_size);
  sl_collective_init ci = job_init(ctx, ctx->ctl, prefix, lobby, job_key);
  ctx->errmsg[0] = 0; /* to tell whether init said why */
  if ((st = ctx->ctl->init(&ci, &ctx->ctl_comm)) != SL_OK) {
    ctx->ctl_comm = NULL;
    sl__module_init_failed(ctx, st, "collective", name);
  }
  ctx->control = (sl_control_plane){sizeof(sl_control_plane), ctx, control_broadcast, control_allgather};
  return st;
}

/* Starts the chosen data module (a collective init, bootstrapped through the control plane),
 * then agrees on the outcome: a rank whose init failed fails every rank with its message
 * instead of leaving them in the module's bootstrap until the timeout. */
static sl_status open_data(sl_context *ctx, const char *name, const char *prefix, const char *lobby,
                           const char *job_key) {
  if (strcmp(name, ctx->ctl->name) == 0) {
    ctx->data = ctx->ctl;
    ctx->data_comm = ctx->ctl_comm;
    ctx->data_is_ctl = true;
    return SL_OK;
  }
  char data_prefix[320], data_lobby[320];
  snprintf(data_prefix, sizeof data_prefix, "%sdata/", prefix);
  snprintf(data_lobby, sizeof data_lobby, "%sdata/", lobby);
  sl_status st = sl__collective_select(ctx, name, &ctx->data, &ctx->data_dl, &ctx->data_shim);
  if (st == SL_OK) {
    /* a data module also gets the rank's device and the control plane to bootstrap through */
    sl_collective_init ci = job_init(ctx, ctx->data, data_prefix, data_lobby, job_key);
    ci.backend = ctx->be;
    ci.backend_handle = ctx->be_ctx;
    ci.device = ctx->device_ordinal;
    ci.control = &ctx->control;
    ctx->errmsg[0] = 0; /* to tell whether init said why */
    if ((st = ctx->data->init(&ci, &ctx->data_comm)) != SL_OK) {
      ctx->data_comm = NULL;
      sl__module_init_failed(ctx, st, "collective", name);
    }
  }
  char phase[96], mine[SL__ERRMSG_LEN];
  snprintf(phase, sizeof phase, "starting the data collective %s", name);
  if (st == SL_OK) return sl__agree(ctx, st, NULL, phase, NULL);
  /* This rank failed: it reports its own failure whatever the agreement says (a peer still in
   * the module's bootstrap may fail the agreement's transport instead of joining it). */
  memcpy(mine, ctx->errmsg, sizeof mine);
  sl__agree(ctx, st, NULL, phase, NULL);
  return sl__fail(ctx, st, "%s", mine);
}

/* This rank's backend did not start (BACKEND, its message in ctx->errmsg): it still meets the
 * others on the control plane and fails the first agreement of agree_on_data with its own
 * message, so that they fail at once naming it instead of waiting out the timeout at the
 * rendezvous for a rank that is gone. It reports its own failure whatever the control plane
 * did. */
static sl_status report_backend_failure(sl_context *ctx, sl_status backend, const char *prefix, const char *lobby,
                                        const char *job_key) {
  char mine[SL__ERRMSG_LEN];
  memcpy(mine, ctx->errmsg, sizeof mine);
  if (ctx->world_size > 1 && ctx->rendezvous) /* said now: the others may be slow to come */
    sl__log(ctx, SL_LOG_WARN, "rank %d: %s; telling the other ranks (within the timeout, %d ms)", ctx->rank, mine,
            ctx->timeout_ms);
  if (ctx->world_size > 1 && ctx->rendezvous && open_control(ctx, prefix, lobby, job_key) == SL_OK) {
    memcpy(ctx->errmsg, mine, sizeof mine); /* what the agreement carries */
    sl__agree(ctx, backend, NULL, AGREE_START, NULL);
  }
  sl__planes_close(ctx);
  return sl__fail(ctx, backend, "%s", mine);
}

sl_status sl__planes_open(sl_context *ctx, const char *want, const char *prefix, const char *lobby, const char *job_key,
                          sl_status backend) {
  if (backend != SL_OK) return report_backend_failure(ctx, backend, prefix, lobby, job_key);
  if (want && (!*want || strcmp(want, "auto") == 0)) want = NULL;
  char chosen[PLANE_NAME];
  sl_status st = open_control(ctx, prefix, lobby, job_key);
  if (st == SL_OK) st = agree_on_data(ctx, want, chosen, sizeof chosen);
  if (st == SL_OK) st = open_data(ctx, chosen, prefix, lobby, job_key);
  if (st != SL_OK) {
    /* keep the message: closing does not touch it */
    sl__planes_close(ctx);
    return st;
  }
  sl__log(ctx, SL_LOG_INFO, "rank %d/%d: control plane %s, data plane %s (%s)", ctx->rank, ctx->world_size,
          ctx->ctl->name, ctx->data->name, ctx->data_reason);
  return SL_OK;
}

static void close_module(const sl_collective_ops **ops, void **comm, void **dl, void **shim) {
  if (*comm) (*ops)->fini(*comm);
  /* the adapter's table and the module's code stay until after fini */
  free(*shim);
  if (*dl) dlclose(*dl);
  *ops = NULL;
  *comm = *dl = *shim = NULL;
}

void sl__planes_note_lost(sl_context *ctx) {
  if (ctx->data_is_ctl || !ctx->data || !ctx->data_comm || !ctx->ctl || !ctx->ctl_comm) return;
  if (!SL_HAS_OP(ctx->data, lost) || !SL_HAS_OP(ctx->ctl, note_lost)) return;
  int ranks[64];
  int n = ctx->data->lost(ctx->data_comm, ranks, 64);
  if (n > 0) ctx->ctl->note_lost(ctx->ctl_comm, ranks, n < 64 ? n : 64);
}

void sl__planes_close(sl_context *ctx) {
  if (ctx->data_is_ctl) {
    ctx->data = NULL;
    ctx->data_comm = NULL;
    ctx->data_is_ctl = false;
  } else {
    close_module(&ctx->data, &ctx->data_comm, &ctx->data_dl, &ctx->data_shim);
  }
  close_module(&ctx->ctl, &ctx->ctl_comm, &ctx->ctl_dl, &ctx->ctl_shim);
  free(ctx->host_of);
  ctx->host_of = NULL;
  ctx->nhosts = 0;
}

/* ---- public ---------------------------------------------------------------------------------- */

SL_API const char *sl_context_collective_name(const sl_context *ctx) {
  return ctx && ctx->data ? ctx->data->name : NULL;
}

SL_API const char *sl_context_collective_reason(const sl_context *ctx) { return ctx ? ctx->data_reason : NULL; }

/* Async-signal-safe as far as this function goes: an atomic store and the modules' abort,
 * which module.h requires to be callable from any thread; what the transport does inside its
 * abort (a Gloo pair's close, ncclCommAbort) is the module's. */
SL_API void sl_context_abort(sl_context *ctx) {
  if (!ctx) return;
  __atomic_store_n(&ctx->aborted, 1, __ATOMIC_RELEASE);
  if (ctx->data && !ctx->data_is_ctl && ctx->data_comm && SL_HAS_OP(ctx->data, abort)) ctx->data->abort(ctx->data_comm);
  if (ctx->ctl && ctx->ctl_comm && SL_HAS_OP(ctx->ctl, abort)) ctx->ctl->abort(ctx->ctl_comm);
}
