// The rendezvous key-value store over TCP: rank 0's server thread and every rank's client.
// Protocol and lifetime rules: tcp_store.h.
#include "tcp_store.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/common/error.h>

namespace shardload {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum Op : uint8_t { OP_HELLO = 1, OP_SET = 2, OP_GET = 3, OP_CHECK = 4, OP_WAIT = 5 };
enum Status : uint8_t { ST_OK = 0, ST_MISSING = 1, ST_TIMEOUT = 2, ST_BAD = 3 };

// Bounds what a peer can make us buffer; Gloo's rendezvous values are a few hundred bytes.
constexpr uint32_t kMaxFrame = 64u << 20;
constexpr uint32_t kMaxFields = 1u << 20;

void put_u32(std::string &s, uint32_t v) {
  char b[4] = {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  s.append(b, 4);
}

uint32_t get_u32(const char *p) {
  const unsigned char *u = reinterpret_cast<const unsigned char *>(p);
  return uint32_t(u[0]) << 24 | uint32_t(u[1]) << 16 | uint32_t(u[2]) << 8 | u[3];
}

std::string frame(uint8_t code, const std::vector<std::string> &fields) {
  std::string body(1, char(code));
  put_u32(body, uint32_t(fields.size()));
  for (const auto &f : fields) {
    put_u32(body, uint32_t(f.size()));
    body += f;
  }
  std::string out;
  put_u32(out, uint32_t(body.size()));
  return out + body;
}

// Parses one frame body; false when malformed.
bool parse_body(const char *p, size_t n, uint8_t *code, std::vector<std::string> *fields) {
  if (n < 5) return false;
  *code = uint8_t(p[0]);
  uint32_t count = get_u32(p + 1);
  if (count > kMaxFields) return false;
  size_t off = 5;
  fields->clear();
  for (uint32_t i = 0; i < count; i++) {
    if (n - off < 4) return false;
    uint32_t len = get_u32(p + off);
    off += 4;
    if (n - off < len) return false;
    fields->emplace_back(p + off, len);
    off += len;
  }
  return off == n;
}

// A whole decimal string; false for anything else.
bool parse_long(const std::string &s, long *out) {
  char *end = nullptr;
  errno = 0;
  *out = strtol(s.c_str(), &end, 10);
  return !s.empty() && end && !*end && errno == 0;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : left > 1000000 ? 1000000 : int(left);
}

} // namespace

// ---- server ------------------------------------------------------------------------------

struct TcpStoreServer::State {
  struct Conn {
    int fd = -1;
    int rank = -1;
    std::string in, out;
    bool waiting = false; // a WAIT is parked until its keys appear or its deadline passes
    std::vector<std::string> wait_keys;
    Clock::time_point wait_deadline;
    bool dead = false;
  };

  int listen_fd = -1;
  int wake[2] = {-1, -1}; // shutdown() writes a byte so poll returns at once
  int world = 0;
  std::thread thread;

  std::mutex m;
  bool stopping = false, only_connected = false;
  Clock::time_point stop_deadline;
  std::vector<bool> skip; // ranks shutdown() does not wait for

  // Only the serving thread touches these.
  std::unordered_map<std::string, std::string> kv;
  std::vector<std::unique_ptr<Conn>> conns;
  std::vector<bool> hello, gone; // rank connected / connected and has since closed

  void run();
  // Whether every rank shutdown() waits for has closed its connection; under M.
  bool all_gone() const {
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
  void handle(Conn &c, uint8_t op, std::vector<std::string> &f);
  void drop(Conn &c) {
    if (c.dead) return;
    c.dead = true;
    ::close(c.fd);
    if (c.rank >= 0) gone[size_t(c.rank)] = true;
  }
  void process(Conn &c);
  void flush(Conn &c);
};

void TcpStoreServer::State::handle(Conn &c, uint8_t op, std::vector<std::string> &f) {
  switch (op) {
  case OP_HELLO: {
    long r, w;
    if (f.size() != 2 || !parse_long(f[0], &r) || !parse_long(f[1], &w)) return drop(c);
    // A rank of a job of another size is told so (and does not count as one of ours).
    if (w != world || r < 0 || r >= world) return reply(c, ST_BAD, {std::to_string(world)});
    c.rank = int(r);
    hello[size_t(r)] = true;
    return reply(c, ST_OK);
  }
  case OP_SET:
    if (f.size() != 2) return drop(c);
    kv[f[0]] = std::move(f[1]);
    return reply(c, ST_OK);
  case OP_GET: {
    if (f.size() != 1) return drop(c);
    auto it = kv.find(f[0]);
    if (it == kv.end()) return reply(c, ST_MISSING);
    return reply(c, ST_OK, {it->second});
  }
  case OP_CHECK:
    return reply(c, all_present(f) ? ST_OK : ST_MISSING);
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

// Handles every complete frame buffered on C, stopping at a parked WAIT (clients send one
// request at a time, so nothing should follow it anyway).
void TcpStoreServer::State::process(Conn &c) {
  size_t off = 0;
  std::vector<std::string> fields;
  while (!c.dead && !c.waiting && c.in.size() - off >= 4) {
    uint32_t len = get_u32(c.in.data() + off);
    if (len > kMaxFrame) return drop(c);
    if (c.in.size() - off - 4 < len) break;
    uint8_t op;
    if (!parse_body(c.in.data() + off + 4, len, &op, &fields)) return drop(c);
    off += 4 + size_t(len);
    handle(c, op, fields);
  }
  c.in.erase(0, off);
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
}

void TcpStoreServer::State::run() {
  std::vector<pollfd> pfds;
  for (;;) {
    Clock::time_point now = Clock::now(), next = now + milliseconds(1000);
    {
      std::lock_guard<std::mutex> lock(m);
      if (stopping && (all_gone() || now >= stop_deadline)) break;
      if (stopping) next = std::min(next, stop_deadline);
    }
    // Answer parked WAITs whose keys arrived or whose time is up.
    for (auto &cp : conns) {
      Conn &c = *cp;
      if (c.dead || !c.waiting) continue;
      if (all_present(c.wait_keys)) {
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
    pfds.push_back({listen_fd, POLLIN, 0});
    for (auto &c : conns) pfds.push_back({c->fd, short(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
    int rc = ::poll(pfds.data(), pfds.size(), remaining_ms(next));
    if (rc < 0 && errno != EINTR) break; // cannot happen with valid fds; stop rather than spin
    if (rc <= 0) continue;

    if (pfds[0].revents) {
      char buf[64];
      while (::read(wake[0], buf, sizeof buf) > 0) {
      }
    }
    if (pfds[1].revents & POLLIN) {
      for (;;) {
        int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break; // EAGAIN, or a transient error (EMFILE): try again next round
        set_nodelay(fd);
        auto c = std::make_unique<Conn>();
        c->fd = fd;
        conns.push_back(std::move(c));
      }
    }
    // pfds[2 + i] belongs to conns[i] for the connections that existed before accept.
    for (size_t i = 2; i < pfds.size(); i++) {
      Conn &c = *conns[i - 2];
      if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[65536];
        for (;;) {
          ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
          if (n > 0) {
            c.in.append(buf, size_t(n));
            if (c.in.size() > size_t(kMaxFrame) + 4 + 65536) {
              drop(c);
              break;
            }
            continue;
          }
          if (n < 0 && errno == EINTR) continue;
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          drop(c); // EOF or error: the rank is done (or dead)
          break;
        }
        process(c);
      }
      flush(c);
    }
    conns.erase(std::remove_if(conns.begin(), conns.end(), [](const std::unique_ptr<Conn> &c) { return c->dead; }),
                conns.end());
  }
  for (auto &c : conns) drop(*c);
  conns.clear();
}

TcpStoreServer::TcpStoreServer(int port, int world_size) : state_(new State) {
  State &s = *state_;
  s.world = world_size;
  s.gone.assign(size_t(world_size), false);
  s.hello.assign(size_t(world_size), false);
  s.skip.assign(size_t(world_size), false);

  // Dual-stack wildcard when the host has IPv6, plain IPv4 otherwise.
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int one = 1, zero = 0, err = 0;
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 a6{};
    a6.sin6_family = AF_INET6;
    a6.sin6_addr = in6addr_any;
    a6.sin6_port = htons(uint16_t(port));
    if (::bind(fd, reinterpret_cast<sockaddr *>(&a6), sizeof a6) != 0) {
      err = errno;
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0 && err != EADDRINUSE) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) throw std::runtime_error(std::string("socket: ") + strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a4{};
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    a4.sin_port = htons(uint16_t(port));
    if (::bind(fd, reinterpret_cast<sockaddr *>(&a4), sizeof a4) != 0) {
      err = errno;
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) throw std::runtime_error("cannot listen on port " + std::to_string(port) + ": " + strerror(err));
  if (::listen(fd, SOMAXCONN) != 0) {
    err = errno;
    ::close(fd);
    throw std::runtime_error("cannot listen on port " + std::to_string(port) + ": " + strerror(err));
  }
  s.listen_fd = fd;
  if (::pipe2(s.wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    err = errno;
    ::close(fd);
    throw std::runtime_error(std::string("pipe: ") + strerror(err));
  }
  try {
    s.thread = std::thread([&s] { s.run(); });
  } catch (const std::exception &e) { // no destructor runs for a constructor that throws
    ::close(s.listen_fd);
    ::close(s.wake[0]);
    ::close(s.wake[1]);
    throw std::runtime_error(std::string("cannot start its thread: ") + e.what());
  }
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
    s.stop_deadline = Clock::now() + grace;
  }
  char b = 1;
  ssize_t ignored = ::write(s.wake[1], &b, 1);
  (void)ignored;
  s.thread.join();
}

TcpStoreServer::~TcpStoreServer() {
  shutdown(milliseconds(0));
  State &s = *state_;
  if (s.listen_fd >= 0) ::close(s.listen_fd);
  if (s.wake[0] >= 0) ::close(s.wake[0]);
  if (s.wake[1] >= 0) ::close(s.wake[1]);
}

// ---- client ------------------------------------------------------------------------------

namespace {

// One non-blocking connect attempt to any address of HOST:PORT, bounded by DEADLINE.
int try_connect(const std::string &host, const std::string &port, Clock::time_point deadline, std::string *err) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int gai = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) {
    *err = std::string("cannot resolve '") + host + "': " + gai_strerror(gai);
    return -1;
  }
  int fd = -1;
  for (addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p = {fd, POLLOUT, 0};
      rc = ::poll(&p, 1, std::min(remaining_ms(deadline), 2000));
      int soerr = 0;
      socklen_t len = sizeof soerr;
      if (rc == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0) {
        rc = 0;
      } else {
        errno = rc == 0 ? ETIMEDOUT : soerr ? soerr : errno;
        rc = -1;
      }
    }
    if (rc != 0) {
      *err = strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  return fd;
}

} // namespace

TcpStore::TcpStore(const std::string &host, int port, int rank, int world, milliseconds timeout)
    : where_((host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port)),
      timeout_(timeout) {
  Clock::time_point deadline = Clock::now() + timeout;
  std::string err = "not tried";
  milliseconds backoff(10);
  // Rank 0 may not be listening yet: keep trying until the timeout.
  for (;;) {
    fd_ = try_connect(host, std::to_string(port), deadline, &err);
    if (fd_ >= 0) break;
    int left = remaining_ms(deadline);
    if (left <= 0)
      throw gloo::IoException("timed out after " + std::to_string(timeout.count()) +
                              " ms connecting to the rendezvous store at " + where_ +
                              " (served by rank 0): " + err);
    std::this_thread::sleep_for(std::min(backoff, milliseconds(left)));
    backoff = std::min(backoff * 2, milliseconds(250));
  }
  set_nodelay(fd_);
  uint8_t status;
  auto f = request(OP_HELLO, {std::to_string(rank), std::to_string(world)}, timeout_, &status);
  if (status == ST_BAD && f.size() == 1) {
    ::close(fd_);
    fd_ = -1;
    throw TcpStoreRefused("rank 0 (serving the rendezvous store at " + where_ + ") runs a job of " + f[0] +
                          " ranks, but this rank was started as rank " + std::to_string(rank) + " of " +
                          std::to_string(world) + "; every rank must be started with the same world size");
  }
  if (status != ST_OK) lose("it refused rank " + std::to_string(rank) + " (is WORLD_SIZE the same on every rank?)");
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpStore::lose(const std::string &why, bool silent) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  silent_ = silent;
  throw gloo::IoException("rendezvous store at " + where_ + " (served by rank 0): " + why);
}

std::vector<std::string> TcpStore::request(uint8_t op, const std::vector<std::string> &fields, milliseconds timeout,
                                           uint8_t *status) {
  if (fd_ < 0) throw gloo::IoException("rendezvous store at " + where_ + " (served by rank 0) is unreachable");
  timeout = std::min(timeout, limit_);
  Clock::time_point deadline = Clock::now() + timeout;
  std::string msg = frame(op, fields);
  for (size_t off = 0; off < msg.size();) {
    ssize_t n = ::send(fd_, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p = {fd_, POLLOUT, 0};
      if (::poll(&p, 1, remaining_ms(deadline)) == 0)
        lose("no progress sending a request within " + std::to_string(timeout.count()) + " ms", true);
      continue;
    }
    lose(std::string("connection lost (rank 0 exited?): ") + strerror(errno));
  }
  std::string in;
  size_t want = 4;
  bool have_len = false;
  while (in.size() < want) {
    pollfd p = {fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc == 0) lose("no answer within " + std::to_string(timeout.count()) + " ms", true);
    if (rc < 0) {
      if (errno == EINTR) continue;
      lose(std::string("poll: ") + strerror(errno));
    }
    char buf[65536];
    ssize_t n = ::recv(fd_, buf, std::min(sizeof buf, want - in.size()), 0);
    if (n == 0) lose("connection closed (rank 0 exited?)");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      lose(std::string("connection lost (rank 0 exited?): ") + strerror(errno));
    }
    in.append(buf, size_t(n));
    if (!have_len && in.size() == 4) {
      uint32_t len = get_u32(in.data());
      if (len > kMaxFrame) lose("malformed answer");
      want = 4 + size_t(len);
      have_len = true;
    }
  }
  std::vector<std::string> out;
  if (!parse_body(in.data() + 4, in.size() - 4, status, &out)) lose("malformed answer");
  return out;
}

void TcpStore::set(const std::string &key, const std::vector<char> &data) {
  uint8_t status;
  request(OP_SET, {key, std::string(data.begin(), data.end())}, timeout_, &status);
  if (status != ST_OK) lose("it refused to store key '" + key + "'");
}

std::vector<char> TcpStore::get(const std::string &key) {
  wait({key}, timeout_);
  uint8_t status;
  auto f = request(OP_GET, {key}, timeout_, &status);
  if (status != ST_OK || f.size() != 1) lose("key '" + key + "' vanished");
  return std::vector<char>(f[0].begin(), f[0].end());
}

void TcpStore::wait(const std::vector<std::string> &keys) { wait(keys, timeout_); }

void TcpStore::wait(const std::vector<std::string> &keys, const milliseconds &timeout) {
  // Gloo's convention: zero means no timeout; ours never blocks past the store's own.
  milliseconds t = timeout.count() > 0 ? timeout : timeout_;
  std::vector<std::string> fields{std::to_string(t.count())};
  fields.insert(fields.end(), keys.begin(), keys.end());
  uint8_t status;
  // The server answers at its deadline; the slack covers a busy server and the network.
  auto missing = request(OP_WAIT, fields, t + milliseconds(5000), &status);
  if (status == ST_OK) return;
  std::string list;
  for (const auto &k : missing) list += (list.empty() ? "" : ", ") + k;
  throw gloo::IoException("Wait timeout after " + std::to_string(t.count()) + " ms for key(s) " + list +
                          " in the rendezvous store at " + where_);
}

bool TcpStore::check(const std::vector<std::string> &keys) {
  uint8_t status;
  request(OP_CHECK, keys, timeout_, &status);
  return status == ST_OK;
}

} // namespace shardload
