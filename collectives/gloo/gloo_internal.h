// What gloo.cc (the module: ops table, collectives, failure diagnosis) and gloo_connect.cc
// (the rendezvous and communicator set-up) share: the communicator itself and the helpers
// both use. Internal to the Gloo module; nothing here is exported (-fvisibility=hidden).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <sys/socket.h>

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

extern "C" {
#include "internal.h"
}
#include "lobby.h"
#include "loop_hurry.h"
#include "rdzv_store.h"
#include "tcp_store.h"

namespace shardload::gloo_internal {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kDefaultChunk = size_t(256) << 20;
constexpr int kDefaultTimeoutMs = 300000;

// PrefixStore that can also ask, without waiting, whether a key is present, and add to a
// counter when the base store keeps counters (gloo_connect.cc).
class ProbingPrefixStore : public gloo::rendezvous::PrefixStore {
 public:
  ProbingPrefixStore(const std::string &prefix, gloo::rendezvous::Store &base,
                     std::function<bool(const std::vector<std::string> &)> has,
                     shardload::RdzvStore *counters = nullptr);
  bool has(const std::string &key);
  bool counts() const { return counters_ != nullptr; }
  // RdzvStore::add under the prefix; only when counts().
  int64_t add(const std::string &key, int64_t delta);

 private:
  std::function<bool(const std::vector<std::string> &)> has_;
  shardload::RdzvStore *counters_;
};

struct Comm;
// The root's watch over its scatterv's sends (gloo.cc).
class SendWatch;

// Where a socket of a communicator's pairs may be found: an address one of this rank's pairs
// listened on (LOCAL: a socket accepted there has it as its own address) or one a peer's pair
// listened on for this rank (a socket connected there has it as its peer's). Gloo up to 2023
// gives every pair a listener of its own (its own port), later ones one listener per device,
// told apart by a sequence number the socket address does not carry; either way each pair's
// socket has one of its pair's endpoints. A root keeps its family's in a list that pairs
// being made append to (lock-free) and abort reads from any thread or a signal handler; a
// sub's are retired (LIVE false) when it is destroyed, since its ports may then be reused,
// and all are freed with the root.
struct Endpoint {
  struct sockaddr_storage addr;
  bool local;
  const Comm *owner;
  std::atomic<bool> live{true};
  Endpoint *next = nullptr;
};

// Retires C's endpoints (a sub), or frees its family's (a root); at destroy, once C's pairs
// are closed (gloo_connect.cc).
void drop_endpoints(Comm &c);

// One rank's communicator: what open_comm connected, and the state of the calls made on it
// (the tag sequence, and the failure that poisoned it). A communicator made by split (a "sub")
// shares its root's device and store connection; its ranks are indices into
// its group, and JOB_RANKS turns them back into the ranks of the job for every message.
struct Comm {
  const sl_module_host *host = nullptr;
  int rank = 0, world = 1, timeout_ms = kDefaultTimeoutMs;
  size_t chunk = kDefaultChunk;
  std::string url;
  std::unique_ptr<shardload::TcpStoreServer> server; // rank 0 of a tcp:// rendezvous
  std::unique_ptr<gloo::rendezvous::Store> base;     // FileStore or TcpStore
  shardload::TcpStore *tcp = nullptr;                 // BASE when it is a TcpStore (a sub: its root's)
  shardload::RdzvStore *net = nullptr;                // BASE when it is a network store (tcp://, c10d://)
  std::unique_ptr<ProbingPrefixStore> store;         // null: bootstrapped over a control plane
  std::string lobby_prefix, job_key;           // sl_collective_init's lobby and job_key
  std::unique_ptr<gloo::rendezvous::Store> lobby_conn; // c10d: an unclaimed connection for the lobby
  std::unique_ptr<shardload::Lobby> lobby;     // on BASE (or LOBBY_CONN); null: no lobby
  // Keeps DEV's event loop ticking while a call waits for its tick (loop_hurry.h); shared with
  // the subs, like DEV, and declared before it: it must outlive the device.
  std::shared_ptr<LoopHurry> hurry;
  std::shared_ptr<gloo::transport::Device> dev;
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  uint32_t tag = 0;     // the same sequence on every rank: one per Gloo call
  int waiting_for = -1; // the peer a point-to-point wait is on, for timeout messages
  sl_status failed = SL_OK;
  std::string failmsg;
  std::vector<int> lost; // the ranks failures were blamed on, or noted (gloo_note_lost): fini does not wait for them
  std::shared_ptr<SendWatch> watch; // from the first scatterv this rank roots; gone first at destroy

  // ---- split (docs/DESIGN.md#modules; HSDP replica and shard groups) ----
  Comm *root = nullptr;          // the communicator this one was split from, transitively; null: a root
  std::vector<int> job_ranks;    // a sub: the job rank of each member; empty: ranks are job ranks
  int job_world = 0;             // a sub: the job's world size
  int color = -1;                // a sub: its split color
  uint32_t splits = 0;           // splits made from this communicator (the same count on every rank)
  std::shared_ptr<std::mutex> store_mu; // the store connection is shared by a root and its subs

  // ---- abort (module.h): a flag any thread or a signal handler may set; a root also shuts
  // down its family's sockets, found by the endpoints noted as its pairs and its subs' were
  // made (note_endpoint), so that the pending calls of the whole family end at once ----
  std::atomic<bool> aborted{false};
  std::atomic<Endpoint *> endpoints{nullptr}; // a root: its family's, newest first

  Comm() = default;
  Comm(const Comm &) = delete;
  Comm &operator=(const Comm &) = delete;
  ~Comm() {
    if (!root) drop_endpoints(*this); // destroy freed them already, unless it threw first
  }

  milliseconds timeout() const { return milliseconds(timeout_ms); }
  // The job rank of member R (a sub's index, or R itself).
  int job_rank(int r) const { return job_ranks.empty() || r < 0 ? r : job_ranks[size_t(r)]; }
  bool is_aborted() const { return aborted.load() || (root && root->aborted.load()); }
};

// ---- helpers both files use (gloo.cc) --------------------------------------------------------

bool contains(const std::string &s, const char *what);
// Gloo prefixes messages with "[file:line] "; users need the rest.
std::string gloo_text(const char *what);
// SL_ERR_TIMEOUT, SL_ERR_PEER or SL_ERR_COMM, from the words of a Gloo or store message.
sl_status classify(const std::string &m);
// "rank 3" or "ranks 1, 2" (the first eight, then how many more).
std::string rank_list(const std::vector<int> &ranks);
// Whether KEY is in the store now; false when the store cannot tell.
bool store_has(Comm &c, const std::string &key);
// Job ranks of members RANKS (see Comm::job_rank).
std::vector<int> job_ranks(const Comm &c, const std::vector<int> &ranks);
// "gloo OP on rank R of W", the head of every message.
std::string describe(const Comm &c, const char *op);
// Reports a failed init (the communicator is destroyed after, so nothing is poisoned).
sl_status init_fail(Comm &c, sl_status s, const std::string &msg);

// ---- set-up (gloo_connect.cc) ----------------------------------------------------------------

// Meets the other ranks at R under PREFIX and connects the Gloo mesh, all within C's timeout:
// the store (served by rank 0 for tcp://), the lobby, the join, the device and the pairs, then
// rank 0's chunk size. On failure C holds what was opened, for the caller to destroy.
sl_status open_comm(Comm &c, const sl__rendezvous &r, const char *prefix);
// The same without a store: the pair addresses go through the control plane CTL (an allgather),
// as a data collective bootstraps (simccl's inner communicator). R (may be null) only says
// where this rank's device listens.
sl_status open_comm_over(Comm &c, const sl_control_plane &ctl, const sl__rendezvous *r);
// Connects SUB, the group of PARENT's ranks MEMBERS (parent ranks, in group order; SUB's rank
// and world set), sharing PARENT's device: addresses go point to point over PARENT, on the slot
// of TAG (one of PARENT's tag sequence). Runs under the caller's guarded(PARENT): throws on
// failure.
void connect_split(Comm &parent, Comm &sub, const std::vector<int> &members, uint32_t tag);
// Shuts down the sockets of C's family (C a root: its own and its subs' connections, which share
// its device), so that every pending call throws at once. Async-signal-safe: raw system calls,
// no allocation, no lock.
void shutdown_sockets(const Comm &c);

} // namespace shardload::gloo_internal
