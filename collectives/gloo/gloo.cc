// The Gloo collective module: its ops table, init and fini, the collectives, and the diagnosis
// of their failures. Host-memory collectives between ranks over TCP, for any mix of nodes
// and vendors (CPU ranks, or GPU ranks staging through host memory). A C ABI (module.h) over
// the C++ library; no exception may cross into C, so every entry point catches everything.
// Meeting the other ranks and connecting the communicator is gloo_connect.cc's; what the two
// files share is in gloo_internal.h.
//
// Failure contract: every call is bounded by the init timeout; a lost or stuck peer makes the
// call fail with SL_ERR_PEER / SL_ERR_TIMEOUT and a message naming the rank, and the
// communicator is then poisoned (Gloo closes its connections on a timeout), so later calls
// fail at once with the same error.
//
// Environment:
//   SHARDLOAD_GLOO_IFACE_ADDR   address (or host name) this rank's Gloo device listens on.
//                               Default: 127.0.0.1 when the tcp:// rendezvous host is loopback;
//                               otherwise the local address the kernel routes toward the
//                               rendezvous host (so it is reachable from rank 0's network);
//                               for file:// this host's name if it resolves, else 127.0.0.1.
//   SHARDLOAD_GLOO_IFNAME       network interface to use instead (Gloo picks its address).
//   SHARDLOAD_GLOO_CHUNK_BYTES  largest single Gloo transfer (default 256 MiB); bigger calls
//                               are split, so each piece has the whole timeout to progress.
//   SHARDLOAD_TOKEN             the job's secret (16+ characters, the same on every rank): the
//                               tcp:// store admits only clients that prove it (tcp_store.h).
//   SHARDLOAD_TOKEN_FILE        or a file holding it (mode 600; trailing newlines dropped).
//                               Required when the tcp:// host is not loopback, unless
//   SHARDLOAD_INSECURE_RENDEZVOUS=1 (every rank) opts out of authentication.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <csignal>
#include <cstring>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <pthread.h>

#include <gloo/allgather.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "gloo_internal.h"
#include "shardload/module_util.h" /* sl_scatter_items_read */

// ---- shared with gloo_connect.cc (gloo_internal.h) ------------------------------------------

namespace shardload::gloo_internal {

bool contains(const std::string &s, const char *what) { return s.find(what) != std::string::npos; }

// Gloo prefixes messages with "[file:line] "; users need the rest.
std::string gloo_text(const char *what) {
  std::string m = what ? what : "unknown error";
  while (m.size() > 1 && m[0] == '[') {
    size_t end = m.find("] ");
    if (end == std::string::npos) break;
    m.erase(0, end + 2);
  }
  return m;
}

sl_status classify(const std::string &m) {
  if (contains(m, "Timed out") || contains(m, "timed out") || contains(m, "imeout")) return SL_ERR_TIMEOUT;
  if (contains(m, "closed") || contains(m, "reset") || contains(m, "Read error") || contains(m, "Write error") ||
      contains(m, "Broken pipe") || contains(m, "refused") || contains(m, "unreachable"))
    return SL_ERR_PEER;
  return SL_ERR_COMM;
}

std::string rank_list(const std::vector<int> &ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < 8; i++) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += " and " + std::to_string(ranks.size() - 8) + " more";
  return s;
}

bool store_has(Comm &c, const std::string &key) {
  if (!c.store) return false;
  try {
    std::unique_lock<std::mutex> lock;
    if (c.store_mu) lock = std::unique_lock<std::mutex>(*c.store_mu);
    return c.store->has(key);
  } catch (...) {
    return false;
  }
}

std::vector<int> job_ranks(const Comm &c, const std::vector<int> &ranks) {
  std::vector<int> out;
  for (int r : ranks) out.push_back(c.job_rank(r));
  return out;
}

// A sub names its rank in the job first: that is the one its user knows.
std::string describe(const Comm &c, const char *op) {
  if (c.root)
    return std::string("gloo ") + op + " on rank " + std::to_string(c.job_rank(c.rank)) + " of " +
           std::to_string(c.job_world) + " (member " + std::to_string(c.rank) + " of " + std::to_string(c.world) +
           " in split group " + std::to_string(c.color) + ")";
  return std::string("gloo ") + op + " on rank " + std::to_string(c.rank) + " of " + std::to_string(c.world);
}

sl_status init_fail(Comm &c, sl_status s, const std::string &msg) {
  return c.host->fail(c.host->core, s, "%s", msg.c_str());
}

} // namespace shardload::gloo_internal

namespace {

using namespace shardload::gloo_internal;

// After a failed init rank 0 serves the store only until the ranks already connected let go
// of it, and at most this long: none of them can succeed any more.
constexpr std::chrono::milliseconds kFailedInitGrace(2000);
// Slot prefixes of our own point-to-point traffic, apart from Gloo's (0x01..0x0d).
constexpr uint8_t kScattervSlotPrefix = 0x53;
constexpr uint8_t kProbeSlotPrefix = 0x54;
constexpr uint8_t kExchangeSlotPrefix = 0x55;

// Writes to a socket whose peer died raise SIGPIPE, which kills a process that keeps the
// default disposition, and Gloo writes with writev. Block it on the calling thread for the
// duration of a call and swallow any SIGPIPE the call raised (the error itself arrives as
// EPIPE); Gloo's event-loop thread inherits the blocked mask from device creation.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  }
  ~SigpipeBlock() {
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      struct timespec zero = {0, 0};
      sigtimedwait(&pipe, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock &) = delete;
  SigpipeBlock &operator=(const SigpipeBlock &) = delete;

 private:
  sigset_t old_;
  bool was_pending_ = false;
};

sl_status report(Comm &c, sl_status s, const std::string &msg) {
  c.failed = s;
  c.failmsg = msg;
  return c.host->fail(c.host->core, s, "%s", msg.c_str());
}

std::string report_key(int rank) { return "sl_fail/" + std::to_string(rank); }

// Peers whose connection failed under us (closed, reset), as opposed to connections our own
// timeout closed. A zero-byte send throws the pair's recorded error if it has one; on a
// healthy pair it only queues a notice nobody matches, harmless on a poisoned communicator.
bool pair_broken(Comm &c, int r) {
  char dummy = 0;
  try {
    auto buf = c.ctx->createUnboundBuffer(&dummy, 0);
    buf->send(r, gloo::Slot::build(kProbeSlotPrefix, 0), 0, 0);
  } catch (const std::exception &e) {
    return !contains(e.what(), "Application timeout");
  } catch (...) {
    return true;
  }
  return false;
}

std::vector<int> broken_pairs(Comm &c) {
  std::vector<int> out;
  if (!c.ctx) return out;
  for (int r = 0; r < c.world; r++)
    if (r != c.rank && pair_broken(c, r)) out.push_back(r);
  return out;
}

// Gloo does not wake a send that waits on a peer whose connection goes away under it (a rank
// killed while the root's bytes are in flight to it): the wait would last the whole timeout
// while the other ranks, done with this call, wait for the next. So while the root waits on a
// send for more than kWatchAfter, a watchdog probes that peer's connection every kWatchEvery
// and aborts the wait once it is broken; the caller then fails naming the peer, at once.
constexpr milliseconds kWatchAfter(500), kWatchEvery(250);
// A watchdog with nothing to watch for this long sleeps until the next wait (no wake-ups while
// the communicator is idle); while calls follow each other it stays on its beat.
constexpr milliseconds kWatchIdle(1000);

} // namespace

namespace shardload::gloo_internal {

// One per communicator, started by its first wait and kept until destroy: a thread started and
// joined per call cost a clone, a join and two context switches per operation.
class SendWatch {
 public:
  explicit SendWatch(Comm &c) : c_(c), thread_([this] { run(); }) {}
  ~SendWatch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Waits on BUF's next send to PEER like waitSend; false when the watchdog found PEER gone.
  bool wait(gloo::transport::UnboundBuffer *buf, int peer) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      buf_ = buf;
      peer_ = peer;
      since_ = last_ = Clock::now();
      if (idle_) cv_.notify_all();
    }
    // The watchdog never touches BUF once this returns or throws: a broken pair's waitSend
    // throws, and the caller's BUF is freed as the exception unwinds while the watchdog may
    // still be on its beat (the caller diagnoses the loss for a while before it returns).
    Forget forget{*this};
    return buf->waitSend(c_.timeout());
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (!buf_ && Clock::now() - last_ >= kWatchIdle) {
        idle_ = true;
        cv_.wait(lock, [this] { return stop_ || buf_; });
        idle_ = false;
        continue;
      }
      cv_.wait_for(lock, kWatchEvery);
      if (stop_ || !buf_ || Clock::now() - since_ < kWatchAfter) continue;
      if (pair_broken(c_, peer_)) {
        buf_->abortWaitSend();
        buf_ = nullptr;
      }
    }
  }
  struct Forget {
    SendWatch &w;
    ~Forget() {
      std::lock_guard<std::mutex> lock(w.mu_);
      w.buf_ = nullptr;
    }
  };
  Comm &c_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, idle_ = false;
  gloo::transport::UnboundBuffer *buf_ = nullptr;
  int peer_ = -1;
  Clock::time_point since_, last_;
  std::thread thread_;
};

} // namespace shardload::gloo_internal

namespace {

struct Lost {
  std::vector<int> ranks;
  bool closed = false; // their connections failed (the process is gone), not just silence
};

// Polls the store until each of RANKS has filed a failure report or DEADLINE passes;
// returns those that did not.
std::vector<int> unreported(Comm &c, const std::vector<int> &ranks, std::set<int> *reported,
                            Clock::time_point deadline) {
  for (;;) {
    size_t waiting = 0;
    for (int r : ranks)
      if (!reported->count(r)) {
        if (store_has(c, report_key(r))) reported->insert(r);
        else waiting++;
      }
    if (!waiting || Clock::now() >= deadline || (c.tcp && c.tcp->broken())) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  std::vector<int> out;
  for (int r : ranks)
    if (!reported->count(r)) out.push_back(r);
  return out;
}

// The ranks named in the reports of REPORTERS, other than the reporters and this rank. Some
// of them may be about to report: a rank that timed out closes its connections a moment
// before it files its report, so the caller waits for theirs as for its own broken peers'.
std::vector<int> named_by(Comm &c, const std::set<int> &reporters) {
  std::set<int> theirs;
  for (int r : reporters) {
    try {
      std::lock_guard<std::mutex> lock(*c.store_mu);
      auto v = c.store->get(report_key(r));
      std::string s(v.begin(), v.end());
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        int x = atoi(s.substr(p, q - p).c_str());
        if (x >= 0 && x < c.world && x != c.rank && !reporters.count(x)) theirs.insert(x);
        p = q + 1;
      }
    } catch (...) {
    }
  }
  return std::vector<int>(theirs.begin(), theirs.end());
}

// Which ranks this failure is about. Connection failures alone can mislead: a rank that
// failed a moment before us, because of the real culprit, closes its connections too. So
// every failing rank files a report (the peers whose connections broke under it) in the
// store, and a peer that filed one is alive. The lost are, in order of evidence:
//   1. peers whose connection broke and that never report (dead);
//   2. the dead named in the reports of the failing peers we lost contact with;
//   3. with no broken connection left to blame (a timeout, or a cascade of timeouts), the
//      ranks that never report at all: stuck, not dead.
Lost find_lost(Comm &c, sl_status kind) {
  Lost lost;
  if (!c.store) { // bootstrapped over a control plane: no reports, only the connections tell
    lost.ranks = broken_pairs(c);
    lost.closed = !lost.ranks.empty();
    // A point-to-point wait that ran out (a scatterv's) was on a peer silent all along: a
    // connection broken under it ends the wait at once. Connections that broke meanwhile are
    // the peers that gave up, most likely on this rank, stuck on that one (hier's leaders: a
    // root stuck sending to a host behind a dead link, the other leaders waiting on the root).
    if (kind == SL_ERR_TIMEOUT && c.waiting_for >= 0 &&
        std::count(lost.ranks.begin(), lost.ranks.end(), c.waiting_for) == 0) {
      lost.ranks = {c.waiting_for};
      lost.closed = false;
    }
    // with one peer (an HSDP chain link), a timeout can only have waited for that one
    if (lost.ranks.empty() && kind == SL_ERR_TIMEOUT && c.world == 2) lost.ranks = {1 - c.rank};
    return lost;
  }
  // How long to wait for reports: a rank that failed a moment before us reports in moments.
  Clock::time_point deadline = Clock::now() + milliseconds(std::clamp(c.timeout_ms / 4, 50, 500));
  // A store that does not answer within this is stuck along with rank 0, its host.
  if (c.tcp) c.tcp->limit(milliseconds(std::clamp(c.timeout_ms / 2, 200, 5000)));
  std::vector<int> pairs = broken_pairs(c);
  std::string mine;
  for (int r : pairs) mine += (mine.empty() ? "" : ",") + std::to_string(r);
  try {
    std::lock_guard<std::mutex> lock(*c.store_mu);
    c.store->set(report_key(c.rank), std::vector<char>(mine.begin(), mine.end()));
  } catch (...) {
  }
  // A tcp:// store lives in rank 0's process: a store that closed and a broken connection
  // to rank 0 mean rank 0 is gone; a store that went silent means rank 0 is stuck.
  auto store_gone = [&] { return c.tcp && c.tcp->broken(); };
  std::set<int> reported;
  if (!store_gone()) {
    lost.ranks = unreported(c, pairs, &reported, deadline);
    if (lost.ranks.empty() && !pairs.empty()) lost.ranks = unreported(c, named_by(c, reported), &reported, deadline);
    lost.closed = !lost.ranks.empty();
  }
  if (store_gone() && c.tcp->silent()) {
    lost.ranks = {0};
    lost.closed = false;
    return lost;
  }
  if (store_gone()) {
    bool zero = pairs.empty() || std::count(pairs.begin(), pairs.end(), 0);
    lost.ranks = zero ? std::vector<int>{0} : pairs;
    lost.closed = true;
    return lost;
  }
  if (lost.ranks.empty() && (kind == SL_ERR_TIMEOUT || !pairs.empty())) {
    std::vector<int> others;
    for (int r = 0; r < c.world; r++)
      if (r != c.rank) others.push_back(r);
    lost.ranks = unreported(c, others, &reported, deadline);
    lost.closed = false;
  }
  return lost;
}

// Turns a Gloo exception into a status and a message naming the rank, and poisons C.
sl_status diagnose(Comm &c, const std::string &what, const char *exc) {
  std::string detail = gloo_text(exc);
  sl_status kind = classify(detail);
  Lost lost = find_lost(c, kind);
  c.lost.insert(c.lost.end(), lost.ranks.begin(), lost.ranks.end()); // with any noted (gloo_note_lost)
  std::vector<int> named = job_ranks(c, lost.ranks); // a sub's members by their job ranks
  std::string msg = what + ": ";
  std::string t = std::to_string(c.timeout_ms) + " ms";
  const char *advice = " (stuck, or slower than the timeout: check it, or raise timeout_ms)";
  sl_status s = kind;
  if (!lost.ranks.empty() && lost.closed) {
    s = SL_ERR_PEER;
    msg += "lost " + rank_list(named) + ": connection closed (the process exited or was killed; see its log)";
  } else if (!lost.ranks.empty()) {
    s = SL_ERR_TIMEOUT;
    if (kind == SL_ERR_TIMEOUT) msg += "timed out after " + t + " waiting for " + rank_list(named) + advice;
    else msg += rank_list(named) + " stopped responding and the others gave up after " + t + advice;
  } else if (kind == SL_ERR_TIMEOUT && c.waiting_for >= 0) {
    msg += "timed out after " + t + " waiting for " + rank_list({c.job_rank(c.waiting_for)}) + advice;
  } else if (kind == SL_ERR_TIMEOUT) {
    msg += "timed out after " + t + " (" + detail + ")";
  } else {
    msg += detail;
  }
  return report(c, s, msg);
}

// What every call on an aborted communicator says (module.h: abort).
constexpr const char *kAborted = "aborted (sl_context_abort)";

bool unusable(const Comm &c) { return c.failed != SL_OK || c.is_aborted(); }

// Allocates nothing, for when nothing can be allocated.
sl_status out_of_memory(const sl_module_host *h) { return h->fail(h->core, SL_ERR_NOMEM, "gloo: out of memory"); }

// Runs BODY with the communicator's failure handling: fail fast once poisoned, never let an
// exception out, name the lost rank on failure.
template <typename F>
sl_status guarded(Comm &c, const std::string &what, F &&body) {
  if (c.is_aborted()) return report(c, SL_ERR_COMM, what + ": " + kAborted);
  if (c.failed != SL_OK)
    return c.host->fail(c.host->core, c.failed, "%s: the communicator failed earlier and cannot be used: %s",
                        what.c_str(), c.failmsg.c_str());
  SigpipeBlock block;
  c.waiting_for = -1;
  try {
    body();
    return SL_OK;
  } catch (const std::bad_alloc &) {
    c.failed = SL_ERR_NOMEM; // poisoned (Gloo may be half way through) even if no message fits
    return report(c, SL_ERR_NOMEM, what + ": out of memory");
  } catch (const std::exception &e) {
    // An abort closed the connections under the call: that is the whole story.
    if (c.is_aborted()) return report(c, SL_ERR_COMM, what + ": " + kAborted);
    try {
      return diagnose(c, what, e.what());
    } catch (...) {
      return report(c, SL_ERR_COMM, what + ": " + gloo_text(e.what()));
    }
  } catch (...) {
    return report(c, SL_ERR_COMM, what + ": unknown error");
  }
}

// ---- init and fini ---------------------------------------------------------------------------

sl_status parse_chunk(Comm &c) {
  const char *v = getenv("SHARDLOAD_GLOO_CHUNK_BYTES");
  if (!v) return SL_OK;
  char *end = nullptr;
  unsigned long long x = strtoull(v, &end, 10);
  if (!*v || *end || x == 0 || v[0] == '-')
    return init_fail(c, SL_ERR_INVALID,
                     std::string("SHARDLOAD_GLOO_CHUNK_BYTES='") + v + "' is not a positive byte count; fix or unset it");
  c.chunk = size_t(x);
  return SL_OK;
}

// Tears down in dependency order: connections, then the device (joins its event loop; a sub
// only drops its share of its root's), then this rank's store client, and last the server,
// which waits up to GRACE for the other ranks to finish with it (all but those a failure was
// blamed on: a stuck one never lets go). The loop is hurried meanwhile: each pair closed and
// the device's end wait for its tick, up to 10 ms each (loop_hurry.h); none waits for a peer,
// so the pulses' bound is only a backstop.
void destroy(Comm *c, milliseconds grace, bool failed_init = false) {
  try {
    SigpipeBlock block;
    {
      LoopHurry::Hold hurry(c->hurry, milliseconds(10000));
      c->watch.reset(); // it probes C's pairs
      c->ctx.reset();
      drop_endpoints(*c); // its pairs are closed: their ports may be reused
      c->dev.reset();
    }
    c->hurry.reset(); // after the device (its loop calls it)
    c->store.reset();
    c->lobby.reset();
    c->lobby_conn.reset();
    c->tcp = nullptr;
    c->base.reset();
    if (c->server) c->server->shutdown(grace, failed_init, c->lost);
    c->server.reset();
  } catch (...) {
  }
  delete c;
}

// ---- the ops table ---------------------------------------------------------------------------

// Gloo moves host memory with any backend (a device backend stages through host memory).
int gloo_probe(const char *backend, char *reason, size_t len) { return 1; }

sl_status init_impl(const sl_collective_init *inp, void **out) {
  if (!inp || !out) return SL_ERR_INVALID;
  *out = nullptr;
  // A caller built against another shardload may pass a shorter or longer struct: read what
  // both know; what it lacks is zero (module.h: every struct carries its size).
  sl_collective_init copy;
  sl__copy_sized(&copy, sizeof copy, inp, inp->size);
  const sl_collective_init *in = &copy;
  if (!in->host) return SL_ERR_INVALID;
  const sl_module_host *h = in->host;
  if (inp->size < offsetof(sl_collective_init, backend))
    return h->fail(h->core, SL_ERR_ABI,
                   "gloo: sl_collective_init of %u bytes is older than module ABI 2 (%zu bytes); rebuild the "
                   "caller against this shardload's shardload/module.h",
                   inp->size, sizeof(sl_collective_init));
  if (in->world_size < 1 || in->rank < 0 || in->rank >= in->world_size)
    return h->fail(h->core, SL_ERR_INVALID, "gloo: rank %d is not in a job of %d ranks", in->rank, in->world_size);
  Comm *c = nullptr;
  try {
    c = new Comm;
    c->host = h;
    c->rank = in->rank;
    c->world = in->world_size;
    c->timeout_ms = in->timeout_ms > 0 ? in->timeout_ms : kDefaultTimeoutMs;
    c->lobby_prefix = in->lobby ? in->lobby : "";
    c->job_key = in->job_key ? in->job_key : "";
    c->store_mu = std::make_shared<std::mutex>();
    sl_status st = parse_chunk(*c);
    if (st == SL_OK && c->world > 1 && in->control) {
      // A data collective's communicator: the control plane carries the addresses (simccl).
      sl__rendezvous r;
      char err[512];
      bool have = in->rendezvous && sl__rendezvous_parse(in->rendezvous, &r, err, sizeof err) == SL_OK;
      if (in->rendezvous) c->url = in->rendezvous;
      SigpipeBlock block; // the device's event-loop thread inherits the blocked SIGPIPE
      st = open_comm_over(*c, *in->control, have ? &r : nullptr);
    } else if (st == SL_OK && c->world > 1) {
      if (!in->rendezvous) {
        st = init_fail(*c, SL_ERR_INVALID,
                       describe(*c, "init") +
                           ": no rendezvous; set MASTER_ADDR and MASTER_PORT, or SHARDLOAD_RENDEZVOUS "
                           "(tcp://HOST:PORT or file://DIR)");
      } else {
        c->url = in->rendezvous;
        sl__rendezvous r;
        char err[512];
        if ((st = sl__rendezvous_parse(in->rendezvous, &r, err, sizeof err)) != SL_OK) {
          st = init_fail(*c, st, describe(*c, "init") + ": " + err);
        } else {
          SigpipeBlock block; // the device's event-loop thread inherits the blocked SIGPIPE
          st = open_comm(*c, r, in->prefix ? in->prefix : "shardload");
        }
      }
    }
    if (st != SL_OK) {
      destroy(c, kFailedInitGrace, true);
      return st;
    }
    *out = c;
    return SL_OK;
  } catch (const std::bad_alloc &) {
    if (c) destroy(c, kFailedInitGrace, true);
    return out_of_memory(h);
  } catch (const std::exception &e) {
    if (c) destroy(c, kFailedInitGrace, true); // first: the message may fail to allocate
    return h->fail(h->core, SL_ERR_COMM, "gloo init on rank %d of %d: %s", in->rank, in->world_size,
                   gloo_text(e.what()).c_str());
  } catch (...) {
    if (c) destroy(c, kFailedInitGrace, true);
    return h->fail(h->core, SL_ERR_COMM, "gloo init on rank %d of %d failed", in->rank, in->world_size);
  }
}

void gloo_fini(void *comm) {
  if (comm) destroy(static_cast<Comm *>(comm), static_cast<Comm *>(comm)->timeout());
}

// Async-signal-safe (an atomic store and raw socket calls). A root's pending calls, and its
// subs', end at once; a sub aborted alone shares its sockets with its family, so its pending
// call ends at the timeout and every later call fails at once.
void gloo_abort(void *comm) noexcept {
  if (!comm) return;
  Comm *c = static_cast<Comm *>(comm);
  c->aborted.store(true);
  if (!c->root && c->endpoints.load()) shutdown_sockets(*c);
}

int gloo_lost(void *comm, int *ranks, int cap) noexcept {
  if (!comm || !ranks || cap <= 0) return 0;
  try {
    const Comm &c = *static_cast<Comm *>(comm);
    std::vector<int> named = job_ranks(c, c.lost);
    int n = 0;
    for (int r : named)
      if (n < cap) ranks[n++] = r;
    return n;
  } catch (...) {
    return 0;
  }
}

// RANKS are the job's: the family's root (whose ranks are the job's) holds them, for its
// store's grace at destroy.
void gloo_note_lost(void *comm, const int *ranks, int n) noexcept {
  if (!comm || !ranks || n <= 0) return;
  try {
    Comm *c = static_cast<Comm *>(comm);
    Comm *root = c->root ? c->root : c;
    for (int i = 0; i < n; i++)
      if (ranks[i] >= 0 && ranks[i] < root->world) root->lost.push_back(ranks[i]);
  } catch (...) {
  }
}

sl_status bad_root(Comm &c, const char *op, int root) {
  return c.host->fail(c.host->core, SL_ERR_INVALID, "%s: root %d is not a rank of %d", describe(c, op).c_str(), root,
                      c.world);
}

sl_status broadcast_impl(void *comm, void *buf, size_t bytes, int root) {
  Comm &c = *static_cast<Comm *>(comm);
  if (root < 0 || root >= c.world) return bad_root(c, "broadcast", root);
  if (c.world == 1 || bytes == 0) return unusable(c) ? guarded(c, describe(c, "broadcast"), [] {}) : SL_OK;
  std::string what = describe(c, "broadcast") + " (" + std::to_string(bytes) + " bytes from rank " +
                     std::to_string(c.job_rank(root)) + ")";
  return guarded(c, what, [&] {
    auto *p = static_cast<uint8_t *>(buf);
    for (size_t off = 0; off < bytes; off += c.chunk) {
      size_t n = std::min(c.chunk, bytes - off);
      gloo::BroadcastOptions o(c.ctx);
      o.setOutput<uint8_t>(p + off, n);
      o.setRoot(root);
      o.setTag(c.tag++);
      o.setTimeout(c.timeout());
      gloo::broadcast(o);
    }
  });
}

// Gloo's scatter sends one size to every rank; shards differ (and may be empty), so the root
// sends each rank its own bytes point to point, in chunks on one slot (ordered per peer).
sl_status scatterv_impl(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs, void *recvbuf,
                        size_t recvbytes, int root) {
  Comm &c = *static_cast<Comm *>(comm);
  if (root < 0 || root >= c.world) return bad_root(c, "scatterv", root);
  if (c.rank == root && counts[root] != recvbytes)
    return c.host->fail(c.host->core, SL_ERR_INVALID, "%s: root sends itself %zu bytes but receives %zu",
                        describe(c, "scatterv").c_str(), counts[root], recvbytes);
  std::string what = describe(c, "scatterv");
  if (c.rank == root) {
    size_t sent = 0;
    for (int r = 0; r < c.world; r++) sent += r == root ? 0 : counts[r];
    what += " (root, sending " + std::to_string(sent) + " bytes to the other ranks)";
  } else {
    what += " (" + std::to_string(recvbytes) + " bytes from rank " + std::to_string(c.job_rank(root)) + ")";
  }
  if (unusable(c)) return guarded(c, what, [] {});
  const char *own = c.rank == root ? static_cast<const char *>(sendbuf) + displs[root] : nullptr;
  if (c.world == 1) {
    if (recvbytes && own != recvbuf) memmove(recvbuf, own, recvbytes);
    return SL_OK;
  }
  uint64_t slot = gloo::Slot::build(kScattervSlotPrefix, c.tag++);
  return guarded(c, what, [&] {
    if (c.rank == root) {
      std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs(size_t(c.world));
      auto *base = const_cast<char *>(static_cast<const char *>(sendbuf));
      // The root's own part is copied while Gloo's event loop writes the others' (the sends
      // go out as the peers' receives arrive), unless it lands on bytes still to be sent.
      bool copy_early = recvbytes && own != recvbuf;
      const uintptr_t d = reinterpret_cast<uintptr_t>(recvbuf);
      for (int r = 0; r < c.world; r++) {
        if (r == root || counts[r] == 0) continue;
        const uintptr_t b = reinterpret_cast<uintptr_t>(base + displs[r]);
        if (d < b + counts[r] && b < d + recvbytes) copy_early = false;
        bufs[size_t(r)] = c.ctx->createUnboundBuffer(base + displs[r], counts[r]);
        for (size_t off = 0; off < counts[r]; off += c.chunk)
          bufs[size_t(r)]->send(r, slot, off, std::min(c.chunk, counts[r] - off));
      }
      if (copy_early) memmove(recvbuf, own, recvbytes);
      if (!c.watch) c.watch = std::make_shared<SendWatch>(c); // inherits the blocked SIGPIPE
      for (int r = 0; r < c.world; r++) {
        if (!bufs[size_t(r)]) continue;
        c.waiting_for = r;
        for (size_t off = 0; off < counts[r]; off += c.chunk)
          if (!c.watch->wait(bufs[size_t(r)].get(), r))
            throw std::runtime_error("Connection closed by peer " + std::to_string(c.job_rank(r)) +
                                     " while sending to it");
      }
      if (recvbytes && own != recvbuf && !copy_early) memmove(recvbuf, own, recvbytes);
    } else if (recvbytes > 0) {
      auto buf = c.ctx->createUnboundBuffer(recvbuf, recvbytes);
      for (size_t off = 0; off < recvbytes; off += c.chunk)
        buf->recv(root, slot, off, std::min(c.chunk, recvbytes - off));
      c.waiting_for = root;
      for (size_t off = 0; off < recvbytes; off += c.chunk) buf->waitRecv(c.timeout());
    }
    c.waiting_for = -1;
  });
}

// Several scatterv's from distinct roots as one op (module.h): every item's sends and
// receives are posted before any is waited on, each item on its own slot, so a rank receives
// from every root at once and each root's link carries its own sends beside the others'.
sl_status scatterv_group_impl(void *comm, const sl_scatter_item *given, int n) {
  Comm &c = *static_cast<Comm *>(comm);
  if (n < 1 || n > SL_SCATTER_GROUP_MAX || !given)
    return c.host->fail(c.host->core, SL_ERR_INVALID, "%s: %d items; give 1 to %d",
                        describe(c, "scatterv group").c_str(), n, SL_SCATTER_GROUP_MAX);
  sl_scatter_item items[SL_SCATTER_GROUP_MAX];
  if (!sl_scatter_items_read(given, n, items))
    return c.host->fail(c.host->core, SL_ERR_ABI, "%s: items of %zu bytes are older than this module knows; rebuild "
                        "the caller against this shardload's shardload/module.h",
                        describe(c, "scatterv group").c_str(), given[0].size);
  int mine = -1; // the item this rank roots
  for (int i = 0; i < n; i++) {
    int root = items[i].root;
    if (root < 0 || root >= c.world) return bad_root(c, "scatterv group", root);
    for (int k = 0; k < i; k++)
      if (items[k].root == root)
        return c.host->fail(c.host->core, SL_ERR_INVALID, "%s: items %d and %d have the same root %d",
                            describe(c, "scatterv group").c_str(), k, i, root);
    if (root == c.rank) mine = i;
  }
  if (mine >= 0 && items[mine].counts[c.rank] != items[mine].recvbytes)
    return c.host->fail(c.host->core, SL_ERR_INVALID, "%s: root sends itself %zu bytes but receives %zu",
                        describe(c, "scatterv group").c_str(), items[mine].counts[c.rank], items[mine].recvbytes);
  std::string what = describe(c, "scatterv group") + " (" + std::to_string(n) + " scatters from ranks";
  for (int i = 0; i < n; i++) what += (i ? ", " : " ") + std::to_string(c.job_rank(items[i].root));
  what += ")";
  if (unusable(c)) return guarded(c, what, [] {});
  const char *own = mine >= 0 ? static_cast<const char *>(items[mine].sendbuf) + items[mine].displs[c.rank] : nullptr;
  void *own_to = mine >= 0 ? items[mine].recvbuf : nullptr;
  size_t own_bytes = mine >= 0 ? items[mine].recvbytes : 0;
  if (c.world == 1) {
    if (own_bytes && own != own_to) memmove(own_to, own, own_bytes);
    return SL_OK;
  }
  const uint64_t tag0 = c.tag;
  c.tag += uint64_t(n);
  return guarded(c, what, [&] {
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends(size_t(c.world));
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recvs(static_cast<size_t>(n));
    if (mine >= 0) {
      const sl_scatter_item &it = items[mine];
      uint64_t slot = gloo::Slot::build(kScattervSlotPrefix, tag0 + uint64_t(mine));
      auto *base = const_cast<char *>(static_cast<const char *>(it.sendbuf));
      for (int r = 0; r < c.world; r++) {
        if (r == c.rank || it.counts[r] == 0) continue;
        sends[size_t(r)] = c.ctx->createUnboundBuffer(base + it.displs[r], it.counts[r]);
        for (size_t off = 0; off < it.counts[r]; off += c.chunk)
          sends[size_t(r)]->send(r, slot, off, std::min(c.chunk, it.counts[r] - off));
      }
    }
    for (int i = 0; i < n; i++) {
      if (i == mine || items[i].recvbytes == 0) continue;
      uint64_t slot = gloo::Slot::build(kScattervSlotPrefix, tag0 + uint64_t(i));
      recvs[size_t(i)] = c.ctx->createUnboundBuffer(items[i].recvbuf, items[i].recvbytes);
      for (size_t off = 0; off < items[i].recvbytes; off += c.chunk)
        recvs[size_t(i)]->recv(items[i].root, slot, off, std::min(c.chunk, items[i].recvbytes - off));
    }
    // the root's own part: every buffer it sends from is read meanwhile, so it moves only after
    // the sends where it lands on one of them
    bool copy_early = own_bytes && own != own_to;
    for (int r = 0; copy_early && r < c.world; r++) {
      if (!sends[size_t(r)]) continue;
      const uintptr_t b = reinterpret_cast<uintptr_t>(items[mine].sendbuf) + items[mine].displs[r];
      const uintptr_t d = reinterpret_cast<uintptr_t>(own_to);
      if (d < b + items[mine].counts[r] && b < d + own_bytes) copy_early = false;
    }
    if (copy_early) memmove(own_to, own, own_bytes);
    if (mine >= 0) {
      if (!c.watch) c.watch = std::make_shared<SendWatch>(c); // inherits the blocked SIGPIPE
      for (int r = 0; r < c.world; r++) {
        if (!sends[size_t(r)]) continue;
        c.waiting_for = r;
        for (size_t off = 0; off < items[mine].counts[r]; off += c.chunk)
          if (!c.watch->wait(sends[size_t(r)].get(), r))
            throw std::runtime_error("Connection closed by peer " + std::to_string(c.job_rank(r)) +
                                     " while sending to it");
      }
    }
    for (int i = 0; i < n; i++) {
      if (!recvs[size_t(i)]) continue;
      c.waiting_for = items[i].root;
      for (size_t off = 0; off < items[i].recvbytes; off += c.chunk) recvs[size_t(i)]->waitRecv(c.timeout());
    }
    if (own_bytes && own != own_to && !copy_early) memmove(own_to, own, own_bytes);
    c.waiting_for = -1;
  });
}

sl_status allgather_impl(void *comm, const void *sendbuf, void *recvbuf, size_t bytes) {
  Comm &c = *static_cast<Comm *>(comm);
  std::string what = describe(c, "allgather") + " (" + std::to_string(bytes) + " bytes per rank)";
  if (unusable(c)) return guarded(c, what, [] {});
  uint64_t total;
  if (!sl__mul_u64(bytes, uint64_t(c.world), &total) || total > SIZE_MAX)
    return c.host->fail(c.host->core, SL_ERR_INVALID, "%s: %zu bytes x %d ranks overflows", what.c_str(), bytes,
                        c.world);
  auto *out = static_cast<uint8_t *>(recvbuf);
  const auto *in = static_cast<const uint8_t *>(sendbuf);
  if (bytes == 0) return SL_OK;
  if (c.world == 1) {
    if (in != out) memmove(out, in, bytes);
    return SL_OK;
  }
  return guarded(c, what, [&] {
    // Gloo gathers into one contiguous buffer per call; past the chunk size, gather pieces
    // into a bounce buffer and spread them to their places.
    size_t piece = std::max<size_t>(c.chunk / size_t(c.world), 1);
    if (bytes <= piece) {
      gloo::AllgatherOptions o(c.ctx);
      if (in != out + size_t(c.rank) * bytes) o.setInput<uint8_t>(const_cast<uint8_t *>(in), bytes);
      o.setOutput<uint8_t>(out, bytes * size_t(c.world));
      o.setTag(c.tag++);
      o.setTimeout(c.timeout());
      gloo::allgather(o);
      return;
    }
    std::vector<uint8_t> bounce(piece * size_t(c.world));
    for (size_t off = 0; off < bytes; off += piece) {
      size_t n = std::min(piece, bytes - off);
      gloo::AllgatherOptions o(c.ctx);
      o.setInput<uint8_t>(const_cast<uint8_t *>(in + off), n);
      o.setOutput<uint8_t>(bounce.data(), n * size_t(c.world));
      o.setTag(c.tag++);
      o.setTimeout(c.timeout());
      gloo::allgather(o);
      for (int r = 0; r < c.world; r++) memcpy(out + size_t(r) * bytes + off, bounce.data() + size_t(r) * n, n);
    }
  });
}

sl_status barrier_impl(void *comm) {
  Comm &c = *static_cast<Comm *>(comm);
  std::string what = describe(c, "barrier");
  if (c.world == 1) return unusable(c) ? guarded(c, what, [] {}) : SL_OK;
  return guarded(c, what, [&] {
    gloo::BarrierOptions o(c.ctx);
    o.setTag(c.tag++);
    o.setTimeout(c.timeout());
    gloo::barrier(o);
  });
}

// Collective over COMM: every rank's (color, key) goes round; the ranks of one color form a
// group ordered by (key, parent rank) and connect point to point over the parent, through the
// root's device (no new listener, no store keys). Bounded by the timeout like every call.
sl_status split_impl(void *comm, int color, int key, void **sub) {
  Comm &p = *static_cast<Comm *>(comm);
  if (!sub)
    return p.host->fail(p.host->core, SL_ERR_INVALID, "%s: no place for the result", describe(p, "split").c_str());
  *sub = nullptr;
  std::string what = describe(p, "split") + " (color " + std::to_string(color) + ", key " + std::to_string(key) + ")";
  if (unusable(p)) return guarded(p, what, [] {});
  int32_t mine[2] = {color < 0 ? -1 : int32_t(color), int32_t(key)};
  std::vector<int32_t> all(size_t(p.world) * 2);
  sl_status st = allgather_impl(comm, mine, all.data(), sizeof mine);
  if (st != SL_OK) return st;
  p.splits++;
  uint32_t tag = p.tag++; // the address exchange's, taken on every rank, members or not
  if (color < 0) return SL_OK;
  std::vector<int> members;
  for (int r = 0; r < p.world; r++)
    if (all[size_t(r) * 2] == mine[0]) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[size_t(a) * 2 + 1] < all[size_t(b) * 2 + 1]; });
  Comm *s = new Comm;
  s->host = p.host;
  s->world = int(members.size());
  s->rank = int(std::find(members.begin(), members.end(), p.rank) - members.begin());
  s->timeout_ms = p.timeout_ms;
  s->chunk = p.chunk;
  s->url = p.url;
  s->root = p.root ? p.root : &p;
  s->job_world = p.root ? p.job_world : p.world;
  s->color = color;
  for (int m : members) s->job_ranks.push_back(p.job_rank(m));
  s->tcp = p.tcp;
  s->store_mu = p.store_mu;
  if (p.store) {
    ProbingPrefixStore *ps = p.store.get();
    s->store = std::make_unique<ProbingPrefixStore>(
        "split" + std::to_string(p.splits) + "/" + std::to_string(color), *ps,
        [ps](const std::vector<std::string> &k) { return ps->has(k.at(0)); });
  }
  if (s->world > 1) {
    SigpipeBlock block;
    st = guarded(p, what, [&] { connect_split(p, *s, members, tag); });
    if (st != SL_OK) {
      destroy(s, milliseconds(0));
      return st;
    }
  }
  *sub = s;
  return SL_OK;
}

// The C entry points. No exception may cross into C: everything that talks to Gloo or the
// store runs under guarded() or init's own handlers, so what is left to catch here is an
// allocation failure while building a message, answered by out_of_memory(). Every call is
// complete on return (SL_COLL_SYNC): the stream arguments are ignored.

sl_status gloo_init(const sl_collective_init *in, void **out) noexcept {
  try {
    return init_impl(in, out);
  } catch (...) {
    return in && in->host ? out_of_memory(in->host) : SL_ERR_NOMEM;
  }
}

sl_status gloo_split(void *comm, int color, int key, void **sub) noexcept {
  try {
    return split_impl(comm, color, key, sub);
  } catch (...) {
    return out_of_memory(static_cast<Comm *>(comm)->host);
  }
}

sl_status gloo_broadcast(void *comm, void *buf, size_t bytes, int root, void *stream) noexcept {
  try {
    return broadcast_impl(comm, buf, bytes, root);
  } catch (...) {
    return out_of_memory(static_cast<Comm *>(comm)->host);
  }
}

sl_status gloo_scatterv(void *comm, const void *sendbuf, const size_t *counts, const size_t *displs, void *recvbuf,
                        size_t recvbytes, int root, void *stream) noexcept {
  try {
    return scatterv_impl(comm, sendbuf, counts, displs, recvbuf, recvbytes, root);
  } catch (...) {
    return out_of_memory(static_cast<Comm *>(comm)->host);
  }
}

sl_status gloo_scatterv_group(void *comm, const sl_scatter_item *items, int n, void *stream) noexcept {
  try {
    return scatterv_group_impl(comm, items, n);
  } catch (...) {
    return out_of_memory(static_cast<Comm *>(comm)->host);
  }
}

sl_status gloo_allgather(void *comm, const void *sendbuf, void *recvbuf, size_t bytes, void *stream) noexcept {
  try {
    return allgather_impl(comm, sendbuf, recvbuf, bytes);
  } catch (...) {
    return out_of_memory(static_cast<Comm *>(comm)->host);
  }
}

sl_status gloo_barrier(void *comm) noexcept {
  try {
    return barrier_impl(comm);
  } catch (...) {
    return out_of_memory(static_cast<Comm *>(comm)->host);
  }
}

const sl_collective_ops kGlooOps = {
    SL_COLLECTIVE_ABI_VERSION,
    sizeof(sl_collective_ops),
    "gloo",
    SL_COLL_SYNC,
    SL_MEM_HOST | SL_MEM_PINNED,
    nullptr, // device_backend: host memory only
    gloo_probe,
    gloo_init,
    gloo_fini,
    gloo_abort,
    gloo_split,
    gloo_broadcast,
    gloo_scatterv,
    gloo_allgather,
    gloo_barrier,
    gloo_lost,
    gloo_note_lost,
    gloo_scatterv_group,
};

} // namespace

extern "C" const sl_collective_ops *sl__collective_gloo(void) { return &kGlooOps; }

extern "C" void sl__gloo_set_timeout(void *comm, int timeout_ms) {
  if (comm && timeout_ms > 0) static_cast<shardload::gloo_internal::Comm *>(comm)->timeout_ms = timeout_ms;
}

// Closes COMM's connections (its own pairs, not its family's), so that a peer waiting on this
// rank in COMM fails at once ("connection closed") rather than when this process exits; COMM
// is unusable afterwards. For a failed rank that has more to do before it exits (hier's
// verdicts, which the peers waiting on it must take part in).
extern "C" void sl__gloo_hang_up(void *comm) {
  using namespace shardload::gloo_internal;
  if (!comm) return;
  Comm &c = *static_cast<Comm *>(comm);
  try {
    SigpipeBlock block;
    if (c.ctx) c.ctx->closeConnections();
  } catch (...) {
  }
  if (c.failed == SL_OK) {
    c.failed = SL_ERR_COMM;
    c.failmsg = "its connections were closed after a failure";
  }
}

// Every member sends BYTES of MINE to every other and keeps what each sent it (ALL: world x
// BYTES), within the communicator's timeout: each peer on its own, so a silent or dead peer
// costs only its own slot where a collective would fail at the first. GOT[r]: 1 rank r's bytes
// arrived (this rank's own included), 2 its connection refused or closed (it has exited), 0
// silent until the timeout. Never
// throws, never poisons; used once, on a communicator that is not used again (hier's verdicts
// after a failed group: docs/DESIGN.md#hier). Returns how many peers' bytes arrived.
extern "C" int sl__gloo_exchange(void *comm, const void *mine, size_t bytes, void *all, unsigned char *got) {
  using namespace shardload::gloo_internal;
  if (!comm || !mine || !all || !got || bytes == 0) return 0;
  Comm &c = *static_cast<Comm *>(comm);
  auto *out = static_cast<unsigned char *>(all);
  memset(got, 0, size_t(c.world));
  memcpy(out + size_t(c.rank) * bytes, mine, bytes);
  got[c.rank] = 1;
  if (c.world == 1 || c.is_aborted() || c.failed != SL_OK) return 0;
  int arrived = 0;
  try {
    SigpipeBlock block;
    const uint64_t slot = gloo::Slot::build(kExchangeSlotPrefix, c.tag++);
    std::vector<unsigned char> copy(static_cast<const unsigned char *>(mine),
                                    static_cast<const unsigned char *>(mine) + bytes);
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends(size_t(c.world)), recvs(size_t(c.world));
    for (int r = 0; r < c.world; r++) {
      if (r == c.rank) continue;
      try { // a peer whose connection broke refuses the send at once: no receive waits on it
        sends[size_t(r)] = c.ctx->createUnboundBuffer(copy.data(), bytes);
        sends[size_t(r)]->send(r, slot, 0, bytes);
        recvs[size_t(r)] = c.ctx->createUnboundBuffer(out + size_t(r) * bytes, bytes);
        recvs[size_t(r)]->recv(r, slot, 0, bytes);
      } catch (const std::exception &) {
        sends[size_t(r)].reset();
        recvs[size_t(r)].reset();
        got[r] = 2;
      }
    }
    const Clock::time_point deadline = Clock::now() + c.timeout();
    auto left = [&] {
      auto d = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      return d > milliseconds(1) ? d : milliseconds(1);
    };
    // Gloo does not wake a receive whose peer's connection goes away under it (a rank that
    // died a moment ago): a watcher probes the peer waited on and aborts the wait once its
    // connection is broken, as SendWatch does for the scatterv root's sends.
    std::mutex mu;
    std::condition_variable cv;
    int waiting = -1;
    bool finished = false;
    std::thread watcher([&] {
      std::unique_lock<std::mutex> lock(mu);
      while (!finished) {
        cv.wait_for(lock, milliseconds(20));
        if (!finished && waiting >= 0 && pair_broken(c, waiting)) {
          recvs[size_t(waiting)]->abortWaitRecv();
          waiting = -1;
        }
      }
    });
    for (int r = 0; r < c.world; r++) {
      if (!recvs[size_t(r)]) continue;
      {
        std::lock_guard<std::mutex> lock(mu);
        waiting = r;
      }
      bool ok = false, closed = false;
      try {
        ok = recvs[size_t(r)]->waitRecv(left());
        closed = !ok; // aborted by the watcher: its connection broke
      } catch (const std::exception &) {
        closed = Clock::now() + milliseconds(5) < deadline; // closed under the wait, not silent
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        waiting = -1;
      }
      if (ok) got[r] = 1, arrived++;
      else if (closed) got[r] = 2;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      finished = true;
    }
    cv.notify_all();
    watcher.join();
    for (int r = 0; r < c.world; r++) { // small: in the socket's buffer by now, or never
      if (!sends[size_t(r)]) continue;
      try {
        sends[size_t(r)]->waitSend(milliseconds(Clock::now() < deadline ? left() : milliseconds(1)));
      } catch (const std::exception &) {
      }
    }
  } catch (...) {
  }
  c.failed = SL_ERR_COMM; // what is left pending belongs to no later op
  c.failmsg = "used for an exchange of verdicts after a failure";
  return arrived;
}
