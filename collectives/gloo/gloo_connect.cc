// Meeting the other ranks and connecting the Gloo communicator (open_comm): the rendezvous
// store (file://, tcp:// served by rank 0, or torchrun's c10d://), the lobby, the join that
// names a missing rank, where this rank's device listens, and the full mesh, all bounded by
// the init timeout. The module and its collectives are gloo.cc's (environment: its head).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/types.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <sodium.h>

#include "c10d_store.h"
#include "gloo_internal.h"

namespace shardload::gloo_internal {

ProbingPrefixStore::ProbingPrefixStore(const std::string &prefix, gloo::rendezvous::Store &base,
                                       std::function<bool(const std::vector<std::string> &)> has,
                                       shardload::RdzvStore *counters)
    : PrefixStore(prefix, base), has_(std::move(has)), counters_(counters) {}

bool ProbingPrefixStore::has(const std::string &key) { return has_({joinKey(key)}); }

int64_t ProbingPrefixStore::add(const std::string &key, int64_t delta) { return counters_->add(joinKey(key), delta); }

namespace {

// How often a rank waiting at the rendezvous reads the lobby (lobby.h), and how long a foreign
// entry must last in a torch store, where an earlier run's entry stays until the rank's next
// run replaces it.
constexpr milliseconds kLobbySlice(500);
constexpr milliseconds kLobbyGrace(5000);
// The counter every rank adds 1 to once its join key is set (a store that keeps counters):
// a timed-out join learns how many ranks joined from one request, whatever the world size.
const char kJoined[] = "sl_joined";

// The status of a failed store request: a timeout when the store said it is one
// (StoreTimeout), whatever its words; else what the words say (classify).
sl_status store_status(const std::exception &e) {
  if (dynamic_cast<const shardload::StoreTimeout *>(&e)) return SL_ERR_TIMEOUT;
  return classify(gloo_text(e.what()));
}

// A file:// wait's pauses between looks: from 0.1 ms, doubling up to Gloo's own 10 ms, so that
// a long wait asks a shared filesystem no more often than Gloo's FileStore does.
constexpr std::chrono::microseconds kFilePollFirst(100), kFilePollMost(10000);

// FileStore with its (protected) non-blocking presence test exposed, and a wait that looks
// again sooner. Gloo's (file_store.cc, FileStore::wait) sleeps 10 ms between looks, which every
// rank paid about once per wait of the rendezvous (the join, then each peer's address), and
// counts its timeout in whole seconds (a 500 ms wait lasted 1 s). This one backs off from
// 0.1 ms to Gloo's 10 ms, and times out after TIMEOUT, with Gloo's words.
class ProbingFileStore : public gloo::rendezvous::FileStore {
 public:
  explicit ProbingFileStore(const std::string &path) : FileStore(path) {}
  bool has(const std::vector<std::string> &keys) { return check(keys); }
  void wait(const std::vector<std::string> &keys) override { wait(keys, kDefaultTimeout); }
  void wait(const std::vector<std::string> &keys, const milliseconds &timeout) override {
    Clock::time_point start = Clock::now();
    std::chrono::microseconds pause = kFilePollFirst;
    while (!check(keys)) {
      auto elapsed = Clock::now() - start;
      if (timeout != gloo::kNoTimeout && elapsed > timeout)
        GLOO_THROW_IO_EXCEPTION(GLOO_ERROR_MSG("Wait timeout for key(s): ", ::gloo::MakeString(keys)));
      auto next = pause;
      if (timeout != gloo::kNoTimeout)
        next = std::min(next, std::chrono::duration_cast<std::chrono::microseconds>(timeout - elapsed) +
                                  std::chrono::microseconds(1)); // past it, for the last look
      std::this_thread::sleep_for(next);
      pause = std::min(pause * 2, kFilePollMost);
    }
  }
};

// Whether this side of a pair connects out to its peer (rather than waiting for the peer's
// connection), as Gloo's Pair::connect (tcp/pair.cc) decides it: the side whose listening
// address is the greater, address then port. Only that side waits for a loop tick (it closes
// its listener: loop_hurry.h); the other waits for its peer, and is not hurried.
bool connects_out(const std::vector<char> &self, const std::vector<char> &peer) {
  if (self.empty() || peer.empty()) return false;
  sockaddr_storage a = gloo::transport::tcp::Address(self).getSockaddr();
  sockaddr_storage b = gloo::transport::tcp::Address(peer).getSockaddr();
  if (a.ss_family != b.ss_family) return false; // Gloo refuses the pair
  int rv = 0;
  if (a.ss_family == AF_INET) {
    auto &x = reinterpret_cast<const sockaddr_in &>(a), &y = reinterpret_cast<const sockaddr_in &>(b);
    rv = memcmp(&x.sin_addr, &y.sin_addr, sizeof x.sin_addr);
    if (rv == 0) rv = x.sin_port - y.sin_port;
  } else if (a.ss_family == AF_INET6) {
    auto &x = reinterpret_cast<const sockaddr_in6 &>(a), &y = reinterpret_cast<const sockaddr_in6 &>(b);
    rv = memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr);
    if (rv == 0) rv = x.sin6_port - y.sin6_port;
  }
  return rv > 0;
}

// Connects PAIR to PEER, hurrying OWNER's loop when this side connects out (connects_out),
// for as long as a connection takes to a peer that answers at all.
void connect_pair(Comm &owner, gloo::transport::Pair &pair, const std::vector<char> &peer) {
  LoopHurry::Hold hold(connects_out(pair.address().bytes(), peer) ? owner.hurry : nullptr, milliseconds(100));
  pair.connect(peer);
}

// Notes, for abort, an endpoint of a pair of OWNER (see Endpoint) in its root's list: before
// the socket it finds can exist, so that an abort that misses the note finds the flag set
// instead (both sequentially consistent; the caller checks abandon_if_aborted after).
void note_endpoint(Comm &owner, const std::vector<char> &bytes, bool local) {
  if (bytes.empty()) return;
  Comm &root = owner.root ? *owner.root : owner;
  sockaddr_storage ss = gloo::transport::tcp::Address(bytes).getSockaddr();
  for (Endpoint *e = root.endpoints.load(); e; e = e->next)
    if (e->owner == &owner && e->local == local && e->live.load() && memcmp(&e->addr, &ss, sizeof ss) == 0)
      return; // one device listener for every pair (newer Gloo): once is enough
  auto *e = new Endpoint;
  e->addr = ss;
  e->local = local;
  e->owner = &owner;
  e->next = root.endpoints.load();
  while (!root.endpoints.compare_exchange_weak(e->next, e)) {
  }
}

// A split whose pairs are being made when its family is aborted: an abort that ran before a
// socket existed could not shut it down, so the split ends here instead of connecting.
void abandon_if_aborted(const Comm &owner) {
  if (owner.is_aborted()) throw std::runtime_error("aborted while connecting");
}

// gloo::rendezvous::Context::connectFullMesh (the same keys and address layout), bounded by
// one deadline. Gloo's own gives every store wait the whole timeout and creates its tcp pairs
// with it, and a pair waits 5x its timeout for its first connection (tcp/pair.h, waitUntil):
// a rank whose peer never connected (a duplicate rank that lost the race for its key) failed
// after 5x --timeout. Here the pairs get a fifth of what is left, and each wait what is left.
// Every pair's endpoints are noted for OWNER's abort (note_endpoint) before it connects.
class MeshContext : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;
  void connect_mesh(gloo::rendezvous::Store &store, std::shared_ptr<gloo::transport::Device> &dev,
                    Clock::time_point deadline, Comm &owner) {
    auto left = [deadline] {
      return std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()), milliseconds(1));
    };
    auto tc = dev->createContext(rank, size);
    tc->setTimeout(std::max(left() / 5, milliseconds(1)));
    std::vector<char> all;
    for (int i = 0; i < size; i++) {
      if (i == rank) continue;
      auto bytes = tc->createPair(i)->address().bytes();
      note_endpoint(owner, bytes, true);
      all.insert(all.end(), bytes.begin(), bytes.end());
    }
    store.set(std::to_string(rank), all);
    for (int i = 0; i < size; i++) {
      if (i == rank) continue;
      std::string key = std::to_string(i);
      store.wait({key}, left());
      auto got = store.get(key);
      auto peer = extractAddress(got, i);
      note_endpoint(owner, peer, false);
      connect_pair(owner, *tc->getPair(i), peer);
    }
    device_ = dev;
    transportContext_ = std::move(tc);
  }

  // The same with the addresses handed over by EXCHANGE instead of a store: it gets this
  // rank's address for each peer (empty for itself) and returns each peer's address for this
  // rank. Bounded by DEADLINE like connect_mesh.
  using Exchange = std::function<std::vector<std::vector<char>>(const std::vector<std::vector<char>> &)>;
  void connect_with(std::shared_ptr<gloo::transport::Device> &dev, const Exchange &exchange,
                    Clock::time_point deadline, Comm &owner) {
    auto tc = dev->createContext(rank, size);
    tc->setTimeout(std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()) / 5, milliseconds(1)));
    std::vector<std::vector<char>> mine(static_cast<size_t>(size));
    for (int i = 0; i < size; i++)
      if (i != rank) note_endpoint(owner, mine[size_t(i)] = tc->createPair(i)->address().bytes(), true);
    abandon_if_aborted(owner);
    std::vector<std::vector<char>> theirs = exchange(mine);
    for (int i = 0; i < size; i++)
      if (i != rank) note_endpoint(owner, theirs[size_t(i)], false);
    abandon_if_aborted(owner);
    for (int i = 0; i < size; i++)
      if (i != rank) connect_pair(owner, *tc->getPair(i), theirs[size_t(i)]);
    abandon_if_aborted(owner); // a socket made after an abort's look: never used
    device_ = dev;
    transportContext_ = std::move(tc);
  }

};

// Every rank must split transfers the same way; rank 0's setting rules, so one node's
// environment differing from another's cannot make pieces mismatch.
sl_status agree_chunk(Comm &c, const std::string &where, Clock::time_point deadline) {
  uint64_t chunk = c.chunk;
  try {
    gloo::BroadcastOptions o(c.ctx);
    o.setOutput<uint64_t>(&chunk, 1);
    o.setRoot(0);
    o.setTag(c.tag++);
    o.setTimeout(std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()), milliseconds(1)));
    gloo::broadcast(o);
  } catch (const std::exception &e) {
    std::string detail = gloo_text(e.what());
    return init_fail(c, classify(detail), where + ": first exchange with the other ranks failed: " + detail);
  }
  c.chunk = size_t(chunk);
  return SL_OK;
}

bool resolves(const std::string &host, int family, std::string *addr, bool *loopback) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  *loopback = true;
  for (addrinfo *ai = res; ai; ai = ai->ai_next) {
    char buf[INET6_ADDRSTRLEN] = "";
    if (ai->ai_family == AF_INET) {
      auto *a = reinterpret_cast<sockaddr_in *>(ai->ai_addr);
      if ((ntohl(a->sin_addr.s_addr) >> 24) != 127) *loopback = false;
      inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    } else if (ai->ai_family == AF_INET6) {
      auto *a = reinterpret_cast<sockaddr_in6 *>(ai->ai_addr);
      if (!IN6_IS_ADDR_LOOPBACK(&a->sin6_addr)) *loopback = false;
      inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    }
    if (ai == res && addr) *addr = buf;
  }
  freeaddrinfo(res);
  return true;
}

// The local address the kernel would use to reach HOST:PORT (no packet is sent).
bool route_to(const std::string &host, int port, std::string *addr) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return false;
  bool ok = false;
  for (addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr *>(&local), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = "";
      const void *src = local.ss_family == AF_INET
                            ? static_cast<const void *>(&reinterpret_cast<sockaddr_in *>(&local)->sin_addr)
                            : static_cast<const void *>(&reinterpret_cast<sockaddr_in6 *>(&local)->sin6_addr);
      ok = inet_ntop(local.ss_family, src, buf, sizeof buf) != nullptr;
      if (ok) *addr = buf;
    }
    close(fd);
  }
  freeaddrinfo(res);
  return ok;
}

// Slot prefix of the split's address exchange, apart from Gloo's (0x01..0x0d) and gloo.cc's.
constexpr uint8_t kSplitSlotPrefix = 0x55;

// Where this rank's Gloo device listens, and why (for messages). See the head of gloo.cc.
gloo::transport::tcp::attr device_attr(const sl__rendezvous &r, std::string *why) {
  gloo::transport::tcp::attr a;
  const char *env = getenv("SHARDLOAD_GLOO_IFACE_ADDR");
  const char *ifname = getenv("SHARDLOAD_GLOO_IFNAME");
  if (ifname && *ifname) {
    a.iface = ifname;
    *why = std::string("interface ") + ifname + " (SHARDLOAD_GLOO_IFNAME)";
    return a;
  }
  if (env && *env) {
    a.hostname = env;
    *why = std::string(env) + " (SHARDLOAD_GLOO_IFACE_ADDR)";
    return a;
  }
  std::string addr;
  bool loop = false;
  if (r.kind == SL__RDZV_TCP || r.kind == SL__RDZV_C10D) {
    if (resolves(r.host, AF_UNSPEC, &addr, &loop) && loop) {
      a.hostname = addr.find(':') != std::string::npos ? "::1" : "127.0.0.1";
      *why = a.hostname + " (the rendezvous host is loopback)";
      return a;
    }
    if (route_to(r.host, r.port, &addr)) {
      a.hostname = addr;
      *why = addr + " (this host's address toward the rendezvous host " + r.host + ")";
      return a;
    }
  }
  char name[256] = "";
  if (gethostname(name, sizeof name - 1) == 0 && name[0] && resolves(name, AF_UNSPEC, &addr, &loop)) {
    a.hostname = name;
    *why = std::string(name) + " (this host's name)";
    return a;
  }
  a.hostname = "127.0.0.1";
  *why = "127.0.0.1 (this host's name does not resolve; set SHARDLOAD_GLOO_IFACE_ADDR for a multi-node job)";
  return a;
}

// mkdir -p, so a launcher may name a directory it has not created.
bool make_dirs(const std::string &path, int *err) {
  std::string p;
  for (size_t i = 0; i <= path.size(); i++) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      p = path.substr(0, i);
      if (mkdir(p.c_str(), 0777) != 0 && errno != EEXIST) {
        *err = errno;
        return false;
      }
    }
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *err = ENOTDIR;
    return false;
  }
  return true;
}

// The join's wait failed (E): names the ranks that never joined, in a report of a bounded
// number of requests (find_absent) given a short grace past the rendezvous's deadline, or
// the store's own failure when it cannot tell or nobody is missing.
sl_status join_failed(Comm &c, const std::string &where, const std::vector<std::string> &keys,
                      const std::exception &e) {
  Clock::time_point report = Clock::now() + shardload::report_grace(c.timeout());
  if (c.net) c.net->bound(report);
  std::function<int64_t()> arrived;
  if (c.store->counts()) arrived = [&c] { return c.store->add(kJoined, 0); };
  shardload::Absent a = shardload::find_absent(
      c.world, arrived, [&](int r) { return c.store->has(keys[size_t(r)]); }, report);
  std::string who = shardload::absent_text(a, c.world);
  if (who.empty()) return init_fail(c, store_status(e), where + ": " + gloo_text(e.what()));
  // Rank 0 knows of clients that failed the handshake: most likely the missing ranks.
  std::string refused = c.server ? c.server->refusals() : "";
  return init_fail(c, SL_ERR_TIMEOUT,
                   where + ": timed out after " + std::to_string(c.timeout_ms) + " ms waiting for " + who +
                       " to join; check that every rank started with the same world size, rendezvous, "
                       "checkpoint path, plan and load options" +
                       (c.lobby ? c.lobby->hint() : "") + (refused.empty() ? "" : " (the store refused: " + refused + ")"));
}

// Every rank announces itself and waits for all others, so a missing rank is named instead
// of surfacing as an anonymous timeout inside Gloo's own rendezvous.
sl_status join(Comm &c, const std::string &where, Clock::time_point deadline) {
  std::vector<std::string> keys;
  for (int r = 0; r < c.world; r++) keys.push_back("sl_join/" + std::to_string(r));
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  std::string me = std::string(host) + " pid " + std::to_string(getpid());
  try {
    c.store->set(keys[size_t(c.rank)], std::vector<char>(me.begin(), me.end()));
    if (c.store->counts()) c.store->add(kJoined, 1); // after the key: a count of N means N keys
  } catch (const shardload::TcpStoreRefused &e) { // a rank number started twice
    return init_fail(c, SL_ERR_INVALID, where + ": " + e.what());
  } catch (const std::exception &e) {
    // Gloo's FileStore never overwrites a key: this directory served an earlier job.
    if (!c.tcp && contains(e.what(), "already exists"))
      return init_fail(c, SL_ERR_INVALID,
                       where + ": the directory holds the keys of an earlier job; empty it, or give each job a "
                               "fresh directory");
    return init_fail(c, store_status(e), where + ": joining the rendezvous failed: " + gloo_text(e.what()));
  }
  // Waits in slices when there is a lobby: between them it tells of a peer that joined under
  // another job key, which would never arrive under ours (lobby.h).
  for (;;) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    milliseconds slice = c.lobby ? std::min(left, kLobbySlice) : left;
    Clock::time_point began = Clock::now();
    try {
      c.store->wait(keys, std::max(slice, milliseconds(1)));
      return SL_OK;
    } catch (const shardload::TcpStoreRefused &e) {
      return init_fail(c, SL_ERR_INVALID, where + ": " + e.what());
    } catch (const shardload::C10dRankTaken &e) { // the c10d store's run was aborted
      return init_fail(c, SL_ERR_INVALID, where + ": " + e.what());
    } catch (const std::exception &e) {
      // Past the deadline, or the store failed rather than the slice expiring.
      if (Clock::now() >= deadline || (c.tcp && c.tcp->broken()) || Clock::now() - began < slice / 2)
        return join_failed(c, where, keys, e);
    }
    try {
      if (c.lobby) c.lobby->check();
    } catch (const shardload::LobbyMismatch &e) {
      return init_fail(c, SL_ERR_MISMATCH, where + ": " + e.what());
    }
  }
}

} // namespace

sl_status open_comm(Comm &c, const sl__rendezvous &r, const char *prefix) {
  Clock::time_point deadline = Clock::now() + c.timeout();
  std::string where = describe(c, "rendezvous") + " at " + c.url;
  std::function<bool(const std::vector<std::string> &)> has;
  if (r.kind == SL__RDZV_FILE) {
    int err = 0;
    if (!make_dirs(r.path, &err))
      return init_fail(c, SL_ERR_IO,
                       where + ": cannot create the rendezvous directory: " + strerror(err) +
                           "; give a directory every rank can write (on a filesystem they share)");
    auto fs = std::make_unique<ProbingFileStore>(r.path);
    ProbingFileStore *raw = fs.get();
    has = [raw](const std::vector<std::string> &k) { return raw->has(k); };
    c.base = std::move(fs);
  } else if (r.kind == SL__RDZV_C10D) {
    // torchrun's agent serves the store (c10d_store.h): every rank is a client, none serves.
    try {
      auto cs = std::make_unique<shardload::C10dStore>(r.host, r.port, c.timeout(), deadline);
      if (!c.lobby_prefix.empty()) {
        // The lobby keys are outside every run's key space: a connection that never claims.
        auto ls = std::make_unique<shardload::C10dStore>(r.host, r.port, c.timeout(), deadline);
        shardload::C10dStore *lraw = ls.get();
        c.lobby = std::make_unique<shardload::Lobby>(
            lraw, [lraw](const std::vector<std::string> &k) { return lraw->check(k); }, c.lobby_prefix, c.job_key,
            c.rank, c.world, shardload::Lobby::Trust::kAfterGrace, std::min(kLobbyGrace, c.timeout() / 4));
        c.lobby_conn = std::move(ls);
        c.lobby->enter();
      }
      shardload::Lobby *lobby = c.lobby.get();
      cs->claim(prefix, c.rank, c.world, [lobby] {
        if (lobby) lobby->check();
      });
      shardload::C10dStore *raw = cs.get();
      has = [raw](const std::vector<std::string> &k) { return raw->check(k); };
      c.net = raw;
      c.base = std::move(cs);
    } catch (const shardload::C10dRankTaken &e) {
      return init_fail(c, SL_ERR_INVALID, where + ": " + e.what());
    } catch (const shardload::LobbyMismatch &e) {
      return init_fail(c, SL_ERR_MISMATCH, where + ": " + e.what());
    } catch (const std::exception &e) {
      return init_fail(c, store_status(e) == SL_ERR_TIMEOUT ? SL_ERR_TIMEOUT : SL_ERR_COMM,
                       where + ": " + gloo_text(e.what()));
    }
  } else {
    // The job's secret, and whether this rendezvous may run without one (tcp_store.h).
    std::string token, err, addr;
    bool loopback = false;
    if (!shardload::tcp_store_token(&token, &err)) return init_fail(c, SL_ERR_INVALID, where + ": " + err);
    // A host that does not resolve fails below, saying so, before anything listens.
    if (resolves(r.host, AF_UNSPEC, &addr, &loopback) &&
        !shardload::tcp_store_allowed(c.url, loopback, !token.empty(), &err))
      return init_fail(c, SL_ERR_INVALID, where + ": " + err);
    shardload::TcpStoreKey key = shardload::tcp_store_key(token);
    sodium_memzero(&token[0], token.size());
    if (c.rank == 0) {
      try {
        c.server = std::make_unique<shardload::TcpStoreServer>(r.host, r.port, c.world, key, c.timeout());
      } catch (const std::exception &e) {
        bool port = contains(e.what(), "cannot listen");
        return init_fail(c, SL_ERR_COMM,
                         where + ": rank 0 cannot serve the rendezvous store: " + e.what() +
                             (port ? "; choose another port (MASTER_PORT) or stop whatever holds it" : ""));
      }
    }
    try {
      auto ts = std::make_unique<shardload::TcpStore>(r.host, r.port, c.rank, c.world, key, c.timeout(), deadline);
      c.tcp = ts.get();
      c.net = c.tcp;
      c.base = std::move(ts);
    } catch (const shardload::TcpStoreRefused &e) {
      return init_fail(c, SL_ERR_INVALID, where + ": " + e.what());
    } catch (const std::exception &e) {
      if (c.rank == 0)
        return init_fail(c, SL_ERR_COMM,
                         where + ": rank 0 serves the store on port " + std::to_string(r.port) +
                             " but cannot reach it as " + r.host + ": " + gloo_text(e.what()) +
                             "; the rendezvous host (MASTER_ADDR) must name the host rank 0 runs on");
      return init_fail(c, SL_ERR_TIMEOUT, where + ": waiting for rank 0 to serve the store: " + gloo_text(e.what()));
    }
    shardload::TcpStore *raw = c.tcp;
    has = [raw](const std::vector<std::string> &k) { return raw->check(k); };
  }
  c.store = std::make_unique<ProbingPrefixStore>(prefix, *c.base, has, c.net);
  if (!c.lobby && !c.lobby_prefix.empty()) {
    // file:// keeps every earlier job's entries (a FileStore never replaces a key): there the
    // lobby only explains a timeout. A tcp:// store serves this job alone: an entry is proof.
    auto trust = r.kind == SL__RDZV_FILE ? shardload::Lobby::Trust::kHintOnly : shardload::Lobby::Trust::kAtOnce;
    c.lobby = std::make_unique<shardload::Lobby>(c.base.get(), has, c.lobby_prefix, c.job_key, c.rank, c.world,
                                                 trust, milliseconds(0));
    c.lobby->enter();
  }

  sl_status st = join(c, where, deadline);
  if (st != SL_OK) return st;

  std::string why;
  auto attr = device_attr(r, &why);
  try {
    c.dev = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception &e) {
    return init_fail(c, SL_ERR_COMM,
                     where + ": cannot open a Gloo device on " + why + ": " + gloo_text(e.what()) +
                         "; set SHARDLOAD_GLOO_IFACE_ADDR to this host's address on the network the ranks share");
  }
  c.hurry = LoopHurry::attach(*c.dev);
  if (c.host->log)
    c.host->log(c.host->core, SL_LOG_DEBUG, "%s: Gloo device on %s", where.c_str(), why.c_str());
  auto mesh = std::make_shared<MeshContext>(c.rank, c.world);
  c.ctx = mesh;
  c.ctx->setTimeout(c.timeout());
  try {
    mesh->connect_mesh(*c.store, c.dev, deadline, c);
  } catch (const shardload::TcpStoreRefused &e) { // a rank number started twice
    c.ctx.reset();
    return init_fail(c, SL_ERR_INVALID, where + ": " + e.what());
  } catch (const shardload::C10dRankTaken &e) { // the same, found by the c10d store
    c.ctx.reset();
    return init_fail(c, SL_ERR_INVALID, where + ": " + e.what());
  } catch (const std::exception &e) {
    std::string detail = gloo_text(e.what());
    c.ctx.reset();
    std::string hint = r.kind == SL__RDZV_FILE ? "; if the directory was used by an earlier job, empty it" : "";
    return init_fail(c, store_status(e) == SL_ERR_TIMEOUT ? SL_ERR_TIMEOUT : SL_ERR_COMM,
                     where + ": connecting to the other ranks from " + why + " failed: " + detail +
                         "; check that they can reach this address (SHARDLOAD_GLOO_IFACE_ADDR)" + hint);
  }
  st = agree_chunk(c, where, deadline);
  // Met: later requests (failure reports) keep to their own bounds, not the rendezvous's.
  if (st == SL_OK && c.net) c.net->bound(Clock::time_point::max());
  return st;
}

sl_status open_comm_over(Comm &c, const sl_control_plane &ctl, const sl__rendezvous *r) {
  Clock::time_point deadline = Clock::now() + c.timeout();
  std::string where = describe(c, "bootstrap") + " over the control plane";
  sl__rendezvous none{};
  none.kind = SL__RDZV_FILE; // no rendezvous host to route toward: this host's name
  std::string why;
  auto attr = device_attr(r ? *r : none, &why);
  try {
    c.dev = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception &e) {
    return init_fail(c, SL_ERR_COMM,
                     where + ": cannot open a Gloo device on " + why + ": " + gloo_text(e.what()) +
                         "; set SHARDLOAD_GLOO_IFACE_ADDR to this host's address on the network the ranks share");
  }
  c.hurry = LoopHurry::attach(*c.dev);
  auto mesh = std::make_shared<MeshContext>(c.rank, c.world);
  c.ctx = mesh;
  c.ctx->setTimeout(c.timeout());
  // Every rank sends the address of its pair toward each rank; the control plane's failures
  // carry their own message (naming the rank it lost), which this keeps.
  sl_status st = SL_OK;
  auto exchange = [&](const std::vector<std::vector<char>> &mine) {
    size_t a = mine[size_t(c.rank == 0 ? 1 : 0)].size();
    std::vector<uint64_t> sizes(size_t(c.world));
    uint64_t a64 = a;
    if ((st = ctl.allgather(ctl.ctx, &a64, sizes.data(), sizeof a64)) != SL_OK) throw std::runtime_error("control");
    for (int i = 0; i < c.world; i++)
      if (sizes[size_t(i)] != a64) {
        st = init_fail(c, SL_ERR_MISMATCH,
                       where + ": rank " + std::to_string(i) + " sends Gloo addresses of " +
                           std::to_string(sizes[size_t(i)]) + " bytes, this rank " + std::to_string(a) +
                           "; run the same shardload build on every rank");
        throw std::runtime_error("sizes");
      }
    std::vector<char> out(size_t(c.world) * a), all(size_t(c.world) * size_t(c.world) * a);
    for (int i = 0; i < c.world; i++)
      if (i != c.rank) memcpy(out.data() + size_t(i) * a, mine[size_t(i)].data(), a);
    if ((st = ctl.allgather(ctl.ctx, out.data(), all.data(), out.size())) != SL_OK) throw std::runtime_error("control");
    std::vector<std::vector<char>> theirs(size_t(c.world));
    for (int i = 0; i < c.world; i++) {
      if (i == c.rank) continue;
      const char *p = all.data() + (size_t(i) * size_t(c.world) + size_t(c.rank)) * a;
      theirs[size_t(i)].assign(p, p + a);
    }
    return theirs;
  };
  try {
    mesh->connect_with(c.dev, exchange, deadline, c);
  } catch (const std::exception &e) {
    c.ctx.reset();
    if (st != SL_OK) return st;
    std::string detail = gloo_text(e.what());
    return init_fail(c, classify(detail) == SL_ERR_TIMEOUT ? SL_ERR_TIMEOUT : SL_ERR_COMM,
                     where + ": connecting to the other ranks from " + why + " failed: " + detail +
                         "; check that they can reach this address (SHARDLOAD_GLOO_IFACE_ADDR)");
  }
  return agree_chunk(c, where, deadline);
}

void connect_split(Comm &parent, Comm &sub, const std::vector<int> &members, uint32_t tag) {
  Clock::time_point deadline = Clock::now() + parent.timeout();
  auto mesh = std::make_shared<MeshContext>(sub.rank, sub.world);
  sub.ctx = mesh;
  sub.ctx->setTimeout(sub.timeout());
  sub.hurry = parent.hurry;
  sub.dev = parent.dev;
  // Each member sends every other member the address of its pair toward it, point to point
  // over the parent (a slot of the parent's tag sequence, the same on every rank).
  uint64_t slot = gloo::Slot::build(kSplitSlotPrefix, tag);
  auto exchange = [&](const std::vector<std::vector<char>> &mine) {
    size_t a = mine[size_t(sub.rank == 0 ? 1 : 0)].size();
    std::vector<std::vector<char>> theirs(size_t(sub.world));
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends, recvs;
    std::vector<std::vector<char>> out = mine;
    for (int i = 0; i < sub.world; i++) {
      if (i == sub.rank) continue;
      theirs[size_t(i)].resize(a);
      auto in = parent.ctx->createUnboundBuffer(theirs[size_t(i)].data(), a);
      in->recv(members[size_t(i)], slot, 0, a);
      recvs.push_back(std::move(in));
      auto o = parent.ctx->createUnboundBuffer(out[size_t(i)].data(), a);
      o->send(members[size_t(i)], slot, 0, a);
      sends.push_back(std::move(o));
    }
    auto left = [deadline] {
      return std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()), milliseconds(1));
    };
    size_t k = 0;
    for (int i = 0; i < sub.world; i++) {
      if (i == sub.rank) continue;
      parent.waiting_for = members[size_t(i)];
      sends[k]->waitSend(left());
      recvs[k]->waitRecv(left());
      k++;
    }
    parent.waiting_for = -1;
    return theirs;
  };
  mesh->connect_with(sub.dev, exchange, deadline, sub); // its endpoints go to its root's list
}

namespace {

bool same_endpoint(const sockaddr_storage &a, const sockaddr_storage &b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    auto &x = reinterpret_cast<const sockaddr_in &>(a), &y = reinterpret_cast<const sockaddr_in &>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    auto &x = reinterpret_cast<const sockaddr_in6 &>(a), &y = reinterpret_cast<const sockaddr_in6 &>(b);
    return x.sin6_port == y.sin6_port && memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  return false;
}

// The layout getdents64(2) fills (glibc declares no wrapper for it before 2.30).
struct Dirent64 {
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];
};

// Whether SS is one of C's family's live endpoints of that side (LOCAL: a listener of this
// rank's; else a peer's). Atomic loads only: async-signal-safe.
bool noted(const Comm &c, const sockaddr_storage &ss, bool local) {
  for (const Endpoint *e = c.endpoints.load(); e; e = e->next)
    if (e->local == local && e->live.load() && same_endpoint(ss, e->addr)) return true;
  return false;
}

} // namespace

void drop_endpoints(Comm &c) {
  if (c.root) {
    for (Endpoint *e = c.root->endpoints.load(); e; e = e->next)
      if (e->owner == &c) e->live.store(false);
    return;
  }
  Endpoint *e = c.endpoints.exchange(nullptr);
  while (e) {
    Endpoint *next = e->next;
    delete e;
    e = next;
  }
}

// Gloo keeps its sockets to itself and closes a context's pairs without waking the calls
// waiting on them; a socket shut down under it, though, reads as end of file on its event
// loop, which fails the pair and every call pending on it ("Connection closed by peer"), as
// a dead peer would. The sockets are found by address, live (an endpoint its pair noted as
// its own, or its peer's: note_endpoint), so a descriptor number that Gloo closed and the
// process reused is never touched.
void shutdown_sockets(const Comm &c) {
  int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return;
  alignas(8) char buf[4096];
  for (;;) {
    long n = syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      const auto *d = reinterpret_cast<const Dirent64 *>(buf + off);
      off += d->d_reclen;
      int fd = 0;
      const char *p = d->d_name;
      if (*p < '0' || *p > '9') continue;
      for (; *p >= '0' && *p <= '9'; p++) fd = fd * 10 + (*p - '0');
      if (fd == dir) continue;
      sockaddr_storage ss;
      socklen_t len = sizeof ss;
      if (getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0) continue; // not a socket
      int listening = 0;
      socklen_t ll = sizeof listening;
      if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ll) == 0 && listening) continue;
      bool ours = noted(c, ss, true);
      len = sizeof ss;
      if (!ours && getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len) == 0) ours = noted(c, ss, false);
      if (ours) shutdown(fd, SHUT_RDWR);
    }
  }
  close(dir);
}

} // namespace shardload::gloo_internal
