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
#include <vector>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <sodium.h>

#include "c10d_store.h"
#include "gloo_internal.h"

namespace shardload::gloo_internal {

ProbingPrefixStore::ProbingPrefixStore(const std::string &prefix, gloo::rendezvous::Store &base,
                                       std::function<bool(const std::vector<std::string> &)> has)
    : PrefixStore(prefix, base), has_(std::move(has)) {}

bool ProbingPrefixStore::has(const std::string &key) { return has_({joinKey(key)}); }

namespace {

// How often a rank waiting at the rendezvous reads the lobby (lobby.h), and how long a foreign
// entry must last in a torch store, where an earlier run's entry stays until the rank's next
// run replaces it.
constexpr milliseconds kLobbySlice(500);
constexpr milliseconds kLobbyGrace(5000);

// FileStore with its (protected) non-blocking presence test exposed.
class ProbingFileStore : public gloo::rendezvous::FileStore {
 public:
  explicit ProbingFileStore(const std::string &path) : FileStore(path) {}
  bool has(const std::vector<std::string> &keys) { return check(keys); }
};

// gloo::rendezvous::Context::connectFullMesh (the same keys and address layout), bounded by
// one deadline. Gloo's own gives every store wait the whole timeout and creates its tcp pairs
// with it, and a pair waits 5x its timeout for its first connection (tcp/pair.h, waitUntil):
// a rank whose peer never connected (a duplicate rank that lost the race for its key) failed
// after 5x --timeout. Here the pairs get a fifth of what is left, and each wait what is left.
class MeshContext : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;
  void connect_mesh(gloo::rendezvous::Store &store, std::shared_ptr<gloo::transport::Device> &dev,
                    Clock::time_point deadline) {
    auto left = [deadline] {
      return std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()), milliseconds(1));
    };
    auto tc = dev->createContext(rank, size);
    tc->setTimeout(std::max(left() / 5, milliseconds(1)));
    std::vector<char> all;
    for (int i = 0; i < size; i++) {
      if (i == rank) continue;
      auto bytes = tc->createPair(i)->address().bytes();
      all.insert(all.end(), bytes.begin(), bytes.end());
    }
    store.set(std::to_string(rank), all);
    for (int i = 0; i < size; i++) {
      if (i == rank) continue;
      std::string key = std::to_string(i);
      store.wait({key}, left());
      auto addrs = store.get(key);
      tc->getPair(i)->connect(extractAddress(addrs, i));
    }
    device_ = dev;
    transportContext_ = std::move(tc);
  }
};

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
  } catch (const shardload::TcpStoreRefused &e) { // a rank number started twice
    return init_fail(c, SL_ERR_INVALID, where + ": " + e.what());
  } catch (const std::exception &e) {
    // Gloo's FileStore never overwrites a key: this directory served an earlier job.
    if (!c.tcp && contains(e.what(), "already exists"))
      return init_fail(c, SL_ERR_INVALID,
                       where + ": the directory holds the keys of an earlier job; empty it, or give each job a "
                               "fresh directory");
    throw;
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
      if (Clock::now() >= deadline || (c.tcp && c.tcp->broken()) || Clock::now() - began < slice / 2) {
        std::vector<int> missing;
        for (int r = 0; r < c.world; r++)
          if (!store_has(c, keys[size_t(r)])) missing.push_back(r);
        if (missing.empty()) throw;
        // Rank 0 knows of clients that failed the handshake: most likely the missing ranks.
        std::string refused = c.server ? c.server->refusals() : "";
        return init_fail(c, SL_ERR_TIMEOUT,
                         where + ": timed out after " + std::to_string(c.timeout_ms) + " ms waiting for " +
                             rank_list(missing) +
                             " to join; check that every rank started with the same world size, rendezvous, "
                             "checkpoint path, plan and load options" +
                             (c.lobby ? c.lobby->hint() : "") +
                             (refused.empty() ? "" : " (the store refused: " + refused + ")"));
      }
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
      auto cs = std::make_unique<shardload::C10dStore>(r.host, r.port, c.timeout());
      if (!c.lobby_prefix.empty()) {
        // The lobby keys are outside every run's key space: a connection that never claims.
        auto ls = std::make_unique<shardload::C10dStore>(r.host, r.port, c.timeout());
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
      c.base = std::move(cs);
    } catch (const shardload::C10dRankTaken &e) {
      return init_fail(c, SL_ERR_INVALID, where + ": " + e.what());
    } catch (const shardload::LobbyMismatch &e) {
      return init_fail(c, SL_ERR_MISMATCH, where + ": " + e.what());
    } catch (const std::exception &e) {
      return init_fail(c, classify(e.what()) == SL_ERR_TIMEOUT ? SL_ERR_TIMEOUT : SL_ERR_COMM,
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
      auto ts = std::make_unique<shardload::TcpStore>(r.host, r.port, c.rank, c.world, key, c.timeout());
      c.tcp = ts.get();
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
  c.store = std::make_unique<ProbingPrefixStore>(prefix, *c.base, has);
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
  if (c.host->log)
    c.host->log(c.host->core, SL_LOG_DEBUG, "%s: Gloo device on %s", where.c_str(), why.c_str());
  auto mesh = std::make_shared<MeshContext>(c.rank, c.world);
  c.ctx = mesh;
  c.ctx->setTimeout(c.timeout());
  try {
    mesh->connect_mesh(*c.store, c.dev, deadline);
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
    return init_fail(c, classify(detail) == SL_ERR_TIMEOUT ? SL_ERR_TIMEOUT : SL_ERR_COMM,
                     where + ": connecting to the other ranks from " + why + " failed: " + detail +
                         "; check that they can reach this address (SHARDLOAD_GLOO_IFACE_ADDR)" + hint);
  }
  // Every rank must split transfers the same way; rank 0's setting rules, so one node's
  // environment differing from another's cannot make pieces mismatch.
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

} // namespace shardload::gloo_internal
