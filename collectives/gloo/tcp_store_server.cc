// The rendezvous store's server: rank 0's TcpStoreServer, its poll-based serving thread, and
// the limits it enforces (TcpStoreLimits). Protocol and lifetime rules: tcp_store.h.
#include "tcp_store.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/transport/address.h>

#include "tcp_socket.h"
#include "tcp_store_wire.h"

namespace shardload {

using namespace tcp_socket;
using namespace tcp_store_wire;
using namespace tcp_store_auth;
using std::chrono::milliseconds;

namespace {

// How long the store lingers after a rank number was claimed twice: gloo.cc's grace for a
// failed start (kFailedInitGrace).
constexpr milliseconds kConflictGrace(2000);

// A whole decimal string; false for anything else.
bool parse_long(const std::string &s, long *out) {
  char *end = nullptr;
  errno = 0;
  *out = strtol(s.c_str(), &end, 10);
  return !s.empty() && end && !*end && errno == 0;
}

bool parse_ll(const std::string &s, long long *out) {
  char *end = nullptr;
  errno = 0;
  *out = strtoll(s.c_str(), &end, 10);
  return !s.empty() && end && !*end && errno == 0;
}

// "ADDR:PORT" ("[ADDR]:PORT" for IPv6), for messages.
std::string peer_name(const sockaddr *sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    auto *a = reinterpret_cast<const sockaddr_in *>(sa);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (sa->sa_family == AF_INET6) {
    auto *a = reinterpret_cast<const sockaddr_in6 *>(sa);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

} // namespace

TcpStoreLimits TcpStoreLimits::for_world(int world, milliseconds timeout) {
  size_t w = size_t(std::max(world, 1));
  size_t addr = size_t(gloo::transport::Address::kMaxByteSize);
  TcpStoreLimits l;
  l.max_value = addr * w + (256u << 10);
  l.max_total = addr * w * w + (4u << 20) + (16u << 10) * w;
  l.max_frame = l.max_value + (64u << 10) + 64 * w;
  l.max_queue = 256u << 10;
  l.max_pending = std::min<size_t>(std::max<size_t>(16, w), 256);
  l.max_conns = w + 8 + l.max_pending;
  l.handshake = std::min(timeout, milliseconds(3000));
  return l;
}

struct TcpStoreServer::State {
  struct Conn {
    int fd = -1;
    std::string peer; // "ADDR:PORT", for messages
    Clock::time_point since;
    enum Stage { NEW, CHALLENGED, AUTHED } stage = NEW;
    long claimed_rank = -1, claimed_world = 0; // from HELLO
    std::string cn, sn;                         // the handshake's nonces
    int rank = -1;                              // once authenticated and admitted
    std::string in, out;
    bool waiting = false; // a WAIT is parked until its keys appear or its deadline passes
    std::vector<std::string> wait_keys;
    Clock::time_point wait_deadline;
    bool closing = false; // drop once OUT is sent (a refusal)
    bool eof = false;     // the peer hung up: drop once its last frames are handled
    bool dead = false;
  };

  std::vector<int> listen_fds;
  int wake[2] = {-1, -1}; // shutdown() writes a byte so poll returns at once
  int world = 0;
  TcpStoreKey key{};
  TcpStoreLimits lim{};
  std::thread thread;

  mutable std::mutex m;
  bool stopping = false, only_connected = false;
  Clock::time_point stop_started, stop_deadline;
  std::vector<bool> skip;        // ranks shutdown() does not wait for
  std::vector<std::string> refused; // failed handshakes, for refusals(); under M

  // Only the serving thread touches these.
  std::unordered_map<std::string, std::string> kv;
  size_t stored = 0; // bytes of keys and values in KV
  std::vector<std::unique_ptr<Conn>> conns;
  std::vector<bool> hello, gone; // rank connected / connected and has since closed
  std::vector<std::string> first_from; // peer of each rank's admitted connection
  std::string conflict;                // set once a rank number was claimed twice
  Clock::time_point conflict_at;       // when CONFLICT was set
  Clock::time_point accept_rest;       // no accept() before this (out of descriptors)

  void run();
  void serve();
  // Whether every rank shutdown() waits for has closed its connection; under M. After a
  // rank number was claimed twice, never: the store lingers until the grace ends, so ranks
  // that arrive late are told why the job stopped rather than find no store.
  bool all_gone() const {
    if (!conflict.empty()) return false;
    for (size_t r = 0; r < gone.size(); r++)
      if (!gone[r] && !skip[r] && (hello[r] || !only_connected)) return false;
    return true;
  }
  bool all_present(const std::vector<std::string> &keys) const {
    for (const auto &k : keys)
      if (!kv.count(k)) return false;
    return true;
  }
  void reply(Conn &c, uint8_t status, const std::vector<std::string> &fields = {}) {
    c.out += frame(status, fields);
  }
  // Answers, then closes once the answer is out.
  void refuse(Conn &c, uint8_t status, const std::string &why) {
    reply(c, status, {why});
    c.closing = true;
  }
  void note_refusal(const std::string &why) {
    std::lock_guard<std::mutex> lock(m);
    if (refused.size() < 16) refused.push_back(why);
  }
  void handshake(Conn &c, uint8_t op, std::vector<std::string> &f);
  void handle(Conn &c, uint8_t op, std::vector<std::string> &f);
  // Stores K = V within the limits: ST_OK, or ST_TOOBIG saying why in WHY.
  uint8_t put(std::string &k, std::string &v, std::string *why);
  void set(Conn &c, std::string &k, std::string &v);
  void add(Conn &c, std::string &k, const std::string &delta);
  void drop(Conn &c) {
    if (c.dead) return;
    c.dead = true;
    ::close(c.fd);
    std::string().swap(c.in); // a half-sent frame is not kept until the connection is erased
    std::string().swap(c.out);
    if (c.rank >= 0) gone[size_t(c.rank)] = true;
  }
  size_t pending() const {
    size_t n = 0;
    for (const auto &c : conns) n += !c->dead && c->stage != Conn::AUTHED;
    return n;
  }
  // How much of C's input is buffered at most: one frame (a handshake frame before it is in).
  size_t in_cap(const Conn &c) const { return (c.stage == Conn::AUTHED ? lim.max_frame : kMaxHandshakeFrame) + 4; }
  bool readable(const Conn &c) const {
    return !c.closing && !c.eof && !c.waiting && c.out.size() < lim.max_queue && c.in.size() < in_cap(c);
  }
  void accept_all(int listen_fd, Clock::time_point now);
  void receive(Conn &c);
  void process(Conn &c);
  void flush(Conn &c);
};

// HELLO then AUTH; anything else before authentication drops the connection unanswered.
void TcpStoreServer::State::handshake(Conn &c, uint8_t op, std::vector<std::string> &f) {
  if (c.stage == Conn::NEW) {
    long r, w;
    // The version first: another version's HELLO may carry other fields, and is told why.
    if (op != OP_HELLO || f.empty()) return drop(c);
    if (f[0] != kProtocol)
      return refuse(c, ST_DENIED, std::string("it speaks rendezvous protocol ") + kProtocol + ", this rank " +
                                      f[0].substr(0, 32) + "; run the same shardload version on every rank");
    if (f.size() != 4 || !parse_long(f[1], &r) || !parse_long(f[2], &w) || r < 0 || w < 1 || r > INT32_MAX ||
        w > INT32_MAX || f[3].size() != kNonce)
      return drop(c);
    c.claimed_rank = r;
    c.claimed_world = w;
    c.cn = f[3];
    c.sn = random_nonce();
    c.stage = Conn::CHALLENGED;
    return reply(c, ST_OK, {c.sn, proof(key, 'S', r, w, c.cn, c.sn)});
  }
  if (op != OP_AUTH || f.size() != 1) return drop(c);
  std::string who = "a client at " + c.peer + " claiming rank " + std::to_string(c.claimed_rank);
  if (f[0].empty()) {
    note_refusal(who + " found that this store does not hold its token (ranks started with different "
                       "SHARDLOAD_TOKEN values?)");
    return drop(c);
  }
  if (!proof_ok(key, f[0], 'C', c.claimed_rank, c.claimed_world, c.cn, c.sn)) {
    note_refusal(who + " did not prove the job's token (ranks started with different SHARDLOAD_TOKEN values?)");
    return refuse(c, ST_DENIED, "it did not accept this rank's proof of the job's token");
  }
  c.stage = Conn::AUTHED;
  if (!conflict.empty()) return refuse(c, ST_CONFLICT, conflict);
  // A rank of a job of another size is told so (and does not count as one of ours).
  if (c.claimed_world != world || c.claimed_rank >= world) return reply(c, ST_BAD, {std::to_string(world)});
  size_t r = size_t(c.claimed_rank);
  if (hello[r]) {
    conflict_at = Clock::now();
    conflict = "rank " + std::to_string(r) + " was started twice (first from " + first_from[r] + ", again from " +
               c.peer + "); no rank of this job can load. Start each rank number once (check RANK, SLURM_PROCID or " +
               "--rank, and that no rank of an earlier job on this port is still running)";
    note_refusal(conflict);
    return refuse(c, ST_CONFLICT, conflict);
  }
  c.rank = int(r);
  hello[r] = true;
  first_from[r] = c.peer;
  return reply(c, ST_OK);
}

uint8_t TcpStoreServer::State::put(std::string &k, std::string &v, std::string *why) {
  auto it = kv.find(k);
  size_t old = it == kv.end() ? 0 : it->first.size() + it->second.size();
  if (k.size() > kMaxKey || v.size() > lim.max_value) {
    *why = "a key of " + std::to_string(k.size()) + " bytes with a value of " + std::to_string(v.size()) +
           " bytes is past its limits for a job of " + std::to_string(world) + " ranks (" + std::to_string(kMaxKey) +
           " and " + std::to_string(lim.max_value) + " bytes)";
    return ST_TOOBIG;
  }
  if (stored - old + k.size() + v.size() > lim.max_total) {
    *why = "it holds " + std::to_string(stored) + " bytes, and the limit for a job of " + std::to_string(world) +
           " ranks is " + std::to_string(lim.max_total);
    return ST_TOOBIG;
  }
  stored = stored - old + k.size() + v.size();
  kv[std::move(k)] = std::move(v);
  return ST_OK;
}

void TcpStoreServer::State::set(Conn &c, std::string &k, std::string &v) {
  std::string why;
  uint8_t st = put(k, v, &why);
  if (st == ST_OK) return reply(c, ST_OK);
  reply(c, st, {why});
}

// A counter in decimal, as torch's stores keep theirs.
void TcpStoreServer::State::add(Conn &c, std::string &k, const std::string &delta) {
  long long d, v = 0;
  if (!parse_ll(delta, &d)) return drop(c);
  auto it = kv.find(k);
  if (it != kv.end() && !parse_ll(it->second, &v))
    return reply(c, ST_BAD, {"the key holds a value that is not an integer"});
  if (__builtin_add_overflow(v, d, &v)) return reply(c, ST_BAD, {"the sum would overflow"});
  std::string sum = std::to_string(v), why;
  uint8_t st = put(k, sum, &why);
  if (st == ST_OK) return reply(c, ST_OK, {std::to_string(v)});
  reply(c, st, {why});
}

void TcpStoreServer::State::handle(Conn &c, uint8_t op, std::vector<std::string> &f) {
  if (c.stage != Conn::AUTHED) return handshake(c, op, f);
  if (c.rank < 0) return drop(c); // authenticated but refused (BAD): it should have gone
  if (!conflict.empty()) return refuse(c, ST_CONFLICT, conflict);
  switch (op) {
  case OP_SET:
    if (f.size() != 2) return drop(c);
    return set(c, f[0], f[1]);
  case OP_GET: {
    if (f.size() != 1) return drop(c);
    auto it = kv.find(f[0]);
    if (it == kv.end()) return reply(c, ST_MISSING);
    return reply(c, ST_OK, {it->second});
  }
  case OP_CHECK:
    return reply(c, all_present(f) ? ST_OK : ST_MISSING);
  case OP_ADD:
    if (f.size() != 2) return drop(c);
    return add(c, f[0], f[1]);
  case OP_WAIT: {
    if (f.empty()) return drop(c);
    // Clamped: a day is past any timeout, and a peer's huge number must not overflow the clock.
    long ms = std::clamp(strtol(f[0].c_str(), nullptr, 10), 0L, 86400000L);
    c.wait_keys.assign(f.begin() + 1, f.end());
    c.wait_deadline = Clock::now() + milliseconds(ms);
    c.waiting = true; // answered by the loop, which rechecks after every request
    return;
  }
  default:
    return drop(c);
  }
}

// Handles complete frames buffered on C while its replies stay under the queue bound,
// stopping at a parked WAIT (clients send one request at a time, so nothing should follow it).
void TcpStoreServer::State::process(Conn &c) {
  size_t off = 0;
  std::vector<std::string> fields;
  size_t limit = c.stage == Conn::AUTHED ? lim.max_frame : kMaxHandshakeFrame;
  while (!c.dead && !c.waiting && !c.closing && c.out.size() < lim.max_queue && c.in.size() - off >= 4) {
    uint32_t len = get_u32(c.in.data() + off);
    if (len > limit) return drop(c);
    if (c.in.size() - off - 4 < len) break;
    uint8_t op;
    if (!parse_body(c.in.data() + off + 4, len, &op, &fields)) return drop(c);
    off += 4 + size_t(len);
    handle(c, op, fields);
    limit = c.stage == Conn::AUTHED ? lim.max_frame : kMaxHandshakeFrame;
  }
  if (!c.dead) c.in.erase(0, off);
}

void TcpStoreServer::State::flush(Conn &c) {
  while (!c.dead && !c.out.empty()) {
    ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      c.out.erase(0, size_t(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return drop(c); // the client died; its rank counts as gone
    }
  }
  if (c.closing && c.out.empty()) drop(c);
}

// Reads what C sent, no more than one frame past what is buffered.
void TcpStoreServer::State::receive(Conn &c) {
  char buf[65536];
  while (!c.dead && readable(c)) {
    size_t room = in_cap(c) - c.in.size();
    ssize_t n = ::recv(c.fd, buf, std::min(sizeof buf, room), 0);
    if (n > 0) {
      c.in.append(buf, size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // EOF or error: the rank is done (or dead). Its last frames are still handled before it
    // is dropped (a client that refuses the store's proof says so, then hangs up at once).
    c.eof = true;
    return;
  }
}

// Takes every waiting connection the limits allow; past them a connection is closed at once
// (its client retries). Out of descriptors, the listener rests instead of waking poll again
// at once for a connection it cannot take.
void TcpStoreServer::State::accept_all(int listen_fd, Clock::time_point now) {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr *>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        accept_rest = now + milliseconds(100);
      return; // EAGAIN, or an aborted connection
    }
    if (conns.size() >= lim.max_conns || pending() >= lim.max_pending) {
      ::close(fd);
      continue;
    }
    set_nodelay(fd);
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->peer = peer_name(reinterpret_cast<const sockaddr *>(&ss));
    c->since = now;
    conns.push_back(std::move(c));
  }
}

// The serving thread. Nothing may escape it (that would end rank 0): on any failure (out of
// memory) every connection and listener is closed, and the clients fail as when rank 0 exits.
void TcpStoreServer::State::run() {
  bool failed = true;
  try {
    serve();
    failed = false;
  } catch (const std::exception &e) {
    try {
      note_refusal(std::string("the rendezvous store stopped serving: ") + e.what());
    } catch (...) {
    }
  } catch (...) {
  }
  for (auto &c : conns) drop(*c);
  conns.clear();
  if (failed) { // the destructor closes them otherwise (after joining this thread)
    for (int fd : listen_fds) ::close(fd);
    listen_fds.clear();
  }
}

void TcpStoreServer::State::serve() {
  std::vector<pollfd> pfds;
  for (;;) {
    Clock::time_point now = Clock::now(), next = now + milliseconds(1000);
    {
      std::lock_guard<std::mutex> lock(m);
      // After a conflict no rank can load: the store lingers (all_gone) for the grace of a
      // failed start at most, not for a successful load's whole timeout.
      Clock::time_point until = stop_deadline;
      if (stopping && !conflict.empty())
        until = std::min(until, std::max(stop_started, conflict_at) + kConflictGrace);
      if (stopping && (all_gone() || now >= until)) break;
      if (stopping) next = std::min(next, until);
    }
    for (auto &cp : conns) {
      Conn &c = *cp;
      if (c.dead) continue;
      // Unauthenticated past the handshake deadline: dropped.
      if (c.stage != Conn::AUTHED) {
        if (now >= c.since + lim.handshake) drop(c);
        else next = std::min(next, c.since + lim.handshake);
        continue;
      }
      // Answer parked WAITs whose keys arrived or whose time is up (or whose job is over).
      if (!c.waiting) continue;
      if (!conflict.empty()) {
        c.waiting = false;
        refuse(c, ST_CONFLICT, conflict);
      } else if (all_present(c.wait_keys)) {
        c.waiting = false;
        reply(c, ST_OK);
      } else if (now >= c.wait_deadline) {
        c.waiting = false;
        std::vector<std::string> missing;
        for (const auto &k : c.wait_keys)
          if (!kv.count(k)) missing.push_back(k);
        reply(c, ST_TIMEOUT, missing);
      } else {
        next = std::min(next, c.wait_deadline);
        continue;
      }
      process(c);
      flush(c);
    }
    conns.erase(std::remove_if(conns.begin(), conns.end(), [](const std::unique_ptr<Conn> &c) { return c->dead; }),
                conns.end());

    pfds.clear();
    pfds.push_back({wake[0], POLLIN, 0});
    bool rest = now < accept_rest;
    if (rest) next = std::min(next, accept_rest);
    for (int fd : listen_fds) pfds.push_back({rest ? -1 : fd, POLLIN, 0}); // a negative fd is ignored
    size_t first = pfds.size();
    for (auto &c : conns)
      pfds.push_back({c->fd, short((readable(*c) ? POLLIN : 0) | (c->out.empty() ? 0 : POLLOUT)), 0});
    int rc = ::poll(pfds.data(), pfds.size(), remaining_ms(next));
    if (rc < 0 && errno != EINTR) break; // cannot happen with valid fds; stop rather than spin
    if (rc <= 0) continue;
    now = Clock::now();

    if (pfds[0].revents) {
      char buf[64];
      while (::read(wake[0], buf, sizeof buf) > 0) {
      }
    }
    // pfds[first + i] belongs to conns[i] for the connections that existed before accept.
    size_t known = conns.size();
    for (size_t i = 1; i < first; i++)
      if (pfds[i].revents & POLLIN) accept_all(pfds[i].fd, now);
    for (size_t i = 0; i < known; i++) {
      Conn &c = *conns[i];
      // Each pass answers what is buffered, sends, and reads again while the queue allows.
      short ev = pfds[first + i].revents;
      if (ev & (POLLIN | POLLHUP | POLLERR)) receive(c);
      // Reset or hung up: closed, even with a WAIT parked (poll would report it again at once).
      if (ev & (POLLHUP | POLLERR)) c.eof = true;
      for (int pass = 0; pass < 4 && !c.dead; pass++) {
        size_t before = c.in.size() + c.out.size();
        process(c);
        flush(c);
        if (!c.dead && readable(c) && pfds[first + i].revents & POLLIN) receive(c);
        if (c.dead || c.in.size() + c.out.size() == before) break;
      }
      // Nothing complete may stay buffered once the passes end: poll would not wake for it.
      process(c);
      flush(c);
      if (c.eof) drop(c);
    }
    conns.erase(std::remove_if(conns.begin(), conns.end(), [](const std::unique_ptr<Conn> &c) { return c->dead; }),
                conns.end());
  }
}

namespace {

// Listens on ADDR; -1 with *ERR = errno on failure.
int listen_on(const addrinfo *ai, int *err) {
  int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // An IPv6 address is that address only, not a dual-stack wildcard's IPv4 side too.
  if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    *err = errno;
    ::close(fd);
    return -1;
  }
  return fd;
}

} // namespace

TcpStoreServer::TcpStoreServer(const std::string &host, int port, int world_size, const TcpStoreKey &key,
                               milliseconds timeout)
    : state_(new State) {
  need_sodium();
  State &s = *state_;
  s.world = world_size;
  s.key = key;
  s.lim = TcpStoreLimits::for_world(world_size, timeout);
  s.gone.assign(size_t(world_size), false);
  s.hello.assign(size_t(world_size), false);
  s.skip.assign(size_t(world_size), false);
  s.first_from.assign(size_t(world_size), std::string());

  // Only the addresses HOST names: a store for tcp://127.0.0.1 is not reachable from the
  // network, and one for a host's cluster address is not reachable on its other networks.
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  std::string where = host_port(host, port);
  int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0) throw std::runtime_error("cannot resolve the rendezvous host '" + host + "': " + gai_strerror(gai));
  std::vector<std::string> seen, foreign;
  int err = 0;
  for (addrinfo *ai = res; ai; ai = ai->ai_next) {
    std::string addr = peer_name(ai->ai_addr);
    if (std::find(seen.begin(), seen.end(), addr) != seen.end()) continue; // /etc/hosts may repeat one
    seen.push_back(addr);
    int e = 0, fd = listen_on(ai, &e);
    if (fd >= 0) {
      s.listen_fds.push_back(fd);
    } else if (e == EADDRNOTAVAIL) {
      foreign.push_back(addr.substr(0, addr.rfind(':')));
    } else if (!err) {
      err = e;
    }
  }
  ::freeaddrinfo(res);
  auto close_all = [&s] {
    for (int fd : s.listen_fds) ::close(fd);
    s.listen_fds.clear();
  };
  if (err) { // the port is taken (on one address is enough to refuse: clients may reach that one)
    close_all();
    throw std::runtime_error("cannot listen on " + where + ": " + strerror(err));
  }
  // Any address that is not this machine's is refused, not just left out: clients may dial it.
  if (!foreign.empty()) {
    close_all();
    std::string list;
    for (const auto &a : foreign) list += (list.empty() ? "" : ", ") + a;
    throw std::runtime_error("the rendezvous host " + host + " (MASTER_ADDR) " +
                             (seen.size() > foreign.size() ? "also resolves to " : "is ") + list +
                             ", not an address of this machine; rank 0 serves the store, so the rendezvous "
                             "host must name the machine rank 0 runs on (and only its addresses)");
  }
  if (::pipe2(s.wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    err = errno;
    close_all();
    throw std::runtime_error(std::string("pipe: ") + strerror(err));
  }
  try {
    s.thread = std::thread([&s] { s.run(); });
  } catch (const std::exception &e) { // no destructor runs for a constructor that throws
    close_all();
    ::close(s.wake[0]);
    ::close(s.wake[1]);
    throw std::runtime_error(std::string("cannot start its thread: ") + e.what());
  }
}

std::string TcpStoreServer::refusals() const {
  std::lock_guard<std::mutex> lock(state_->m);
  std::string out;
  for (const auto &r : state_->refused) out += (out.empty() ? "" : "; ") + r;
  return out;
}

void TcpStoreServer::shutdown(milliseconds grace, bool only_connected, const std::vector<int> &skip) {
  State &s = *state_;
  if (!s.thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(s.m);
    s.stopping = true;
    s.only_connected = only_connected;
    for (int r : skip)
      if (r >= 0 && r < s.world) s.skip[size_t(r)] = true;
    s.stop_started = Clock::now();
    s.stop_deadline = s.stop_started + grace;
  }
  char b = 1;
  ssize_t ignored = ::write(s.wake[1], &b, 1);
  (void)ignored;
  s.thread.join();
}

TcpStoreServer::~TcpStoreServer() {
  shutdown(milliseconds(0));
  State &s = *state_;
  for (int fd : s.listen_fds) ::close(fd);
  if (s.wake[0] >= 0) ::close(s.wake[0]);
  if (s.wake[1] >= 0) ::close(s.wake[1]);
}

} // namespace shardload
