// A client of torch's c10d TCPStore. Protocol, runs and trust: c10d_store.h.
#include "c10d_store.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/common/error.h>

#include "tcp_socket.h"

namespace shardload {
namespace {

using tcp_socket::Clock;
using tcp_socket::remaining_ms;
using tcp_socket::try_connect;
using std::chrono::milliseconds;

enum Query : uint8_t { Q_VALIDATE = 0, Q_SET = 1, Q_GET = 3, Q_ADD = 4, Q_CHECK = 5, Q_PING = 13 };
enum CheckReply : uint8_t { READY = 0, NOT_READY = 1 };
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
// Gloo's rendezvous values are a few hundred bytes per rank; a length past this is not a value
// of ours, and must not make us allocate it.
constexpr uint64_t kMaxValue = 64u << 20;
// How long leaving the store may take: the job is over, a stuck store must not hold it.
constexpr milliseconds kLeaveLimit(2000);

// Values go in host byte order, as torch's clients send them (little-endian in practice).
template <typename T>
void put(std::string &s, T v) {
  s.append(reinterpret_cast<const char *>(&v), sizeof v);
}
void put_str(std::string &s, const std::string &v) {
  put<uint64_t>(s, v.size());
  s += v;
}

// "A, B, C" for the first 8 items, then "and N more".
std::string first_few(const std::vector<std::string> &items) {
  std::string list;
  for (size_t i = 0; i < items.size() && i < 8; i++) list += (i ? ", " : "") + items[i];
  if (items.size() > 8) list += " and " + std::to_string(items.size() - 8) + " more";
  return list;
}

} // namespace

C10dStore::C10dStore(const std::string &host, int port, milliseconds timeout)
    : where_(tcp_socket::host_port(host, port)),
      timeout_(timeout) {
  Clock::time_point deadline = Clock::now() + timeout;
  std::string err = "not tried";
  milliseconds backoff(10);
  for (;;) {
    fd_ = try_connect(host, port, deadline, &err);
    if (fd_ >= 0) break;
    int left = remaining_ms(deadline);
    if (left <= 0)
      throw gloo::IoException("timed out after " + std::to_string(timeout.count()) +
                              " ms connecting to the torch c10d store at " + where_ + ": " + err +
                              "; check that MASTER_ADDR:MASTER_PORT (or the c10d:// rendezvous) names the torchrun "
                              "agent's store and that torchrun is still running");
    std::this_thread::sleep_for(std::min(backoff, milliseconds(left)));
    backoff = std::min(backoff * 2, milliseconds(250));
  }
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

  // torch's servers expect VALIDATE first and close a connection whose magic is wrong; it has
  // no answer, so a PING follows: only a c10d store echoes the nonce.
  std::string msg;
  put<uint8_t>(msg, Q_VALIDATE);
  put<uint32_t>(msg, kValidationMagic);
  uint32_t nonce = uint32_t(::getpid()) ^ 0x5348u, echo = 0;
  put<uint8_t>(msg, Q_PING);
  put<uint32_t>(msg, nonce);
  Clock::time_point hs = Clock::now() + std::min(timeout_, milliseconds(10000));
  doing_ = " during the c10d handshake (is it a torch c10d TCPStore?)";
  send_all(msg, hs);
  recv_exact(&echo, sizeof echo, hs);
  if (echo != nonce) {
    doing_ = "";
    lose("it answered the c10d handshake with something else: it is not a torch c10d TCPStore");
  }
  doing_ = "";
}

C10dStore::~C10dStore() {
  if (fd_ < 0) return;
  // Tells a later run of this rank that this one is over (see the head of c10d_store.h). An
  // ADD, not a SET: its answer confirms the key is stored before the connection closes, so the
  // next run's CHECK cannot overtake it (the server handles a connection's requests in order,
  // so it confirms an abort SET sent before it too).
  if (!left_key_.empty()) {
    try {
      add(left_key_, 1, Clock::now() + std::min(timeout_, kLeaveLimit));
    } catch (...) {
    }
  }
  if (fd_ >= 0) ::close(fd_);
}

void C10dStore::lose(const std::string &why) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  throw gloo::IoException("torch c10d store at " + where_ + ": " + why + doing_ +
                          "; check that MASTER_ADDR:MASTER_PORT (or the c10d:// rendezvous) names the torchrun agent's "
                          "store, or use tcp:// for shardload's own store");
}

void C10dStore::send_all(const std::string &msg, Clock::time_point deadline) {
  if (fd_ < 0) throw gloo::IoException("torch c10d store at " + where_ + " is unreachable (an earlier request failed)");
  int sent = tcp_socket::send_all(fd_, msg, deadline);
  if (sent < 0) lose("no progress sending a request within " + std::to_string(timeout_.count()) + " ms");
  if (sent > 0) lose(std::string("connection lost (torchrun exited?): ") + strerror(sent));
}

void C10dStore::recv_exact(void *buf, size_t n, Clock::time_point deadline) {
  if (fd_ < 0) throw gloo::IoException("torch c10d store at " + where_ + " is unreachable (an earlier request failed)");
  auto *p = static_cast<char *>(buf);
  for (size_t got = 0; got < n;) {
    pollfd pf = {fd_, POLLIN, 0};
    int rc = ::poll(&pf, 1, remaining_ms(deadline));
    if (rc == 0) lose("no answer within " + std::to_string(timeout_.count()) + " ms");
    if (rc < 0) {
      if (errno == EINTR) continue;
      lose(std::string("poll: ") + strerror(errno));
    }
    ssize_t r = ::recv(fd_, p + got, n - got, 0);
    if (r == 0) lose("connection closed (torchrun exited, or the server refused this client)");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      lose(std::string("connection lost (torchrun exited?): ") + strerror(errno));
    }
    got += size_t(r);
  }
}

int64_t C10dStore::add(const std::string &key, int64_t delta) { return add(key, delta, Clock::now() + timeout_); }

int64_t C10dStore::add(const std::string &key, int64_t delta, Clock::time_point deadline) {
  std::string msg;
  put<uint8_t>(msg, Q_ADD);
  put_str(msg, key);
  put<int64_t>(msg, delta);
  send_all(msg, deadline);
  int64_t v = 0;
  recv_exact(&v, sizeof v, deadline);
  return v;
}

void C10dStore::claim(const std::string &prefix, int rank, int world, const std::function<void()> &between) {
  std::string r = std::to_string(rank);
  int64_t n = add(prefix + "/sl_claim/" + r, 1);
  if (n < 1 || n > 1000000)
    lose("it answered an ADD on key '" + prefix + "/sl_claim/" + r + "' with " + std::to_string(n));
  auto space = [&](int64_t k) { return prefix + "/run" + std::to_string(k) + "/"; };
  space_ = space(n);
  abort_key_ = space_ + "sl_abort";
  if (n > 1) {
    // Run N-1 of this rank must have left; if it has not, it is alive in the same job.
    std::string prev = space(n - 1);
    Clock::time_point deadline = Clock::now() + timeout_;
    if (!check_raw({prev + "sl_left/" + r}, deadline)) {
      std::string why = "rank " + r + " was started twice: another process of this job holds rank " + r +
                        " in the torch c10d store at " + where_ + " (key prefix '" + prefix +
                        "'); give every process its own RANK (or, if an earlier shardload run of this rank was "
                        "killed, restart torchrun)";
      // The ranks of that run still waiting in the store fail with the same message.
      std::string msg;
      put<uint8_t>(msg, Q_SET);
      put_str(msg, prev + "sl_abort");
      put_str(msg, why);
      try {
        send_all(msg, deadline);
      } catch (...) {
      }
      left_key_ = space_ + "sl_left/" + r; // this run is over too: a later one may proceed
      throw C10dRankTaken(why);
    }
  }
  left_key_ = space_ + "sl_left/" + r;

  // Every rank of the run claims before any goes on, so a duplicate found during the
  // rendezvous fails them all (through the abort key) instead of only itself.
  std::vector<std::string> claimed;
  for (int k = 0; k < world; k++) claimed.push_back("sl_claimed/" + std::to_string(k));
  set(claimed[size_t(rank)], std::vector<char>{'1'});
  Clock::time_point end = Clock::now() + timeout_;
  try {
    for (;;) {
      milliseconds left = std::max(std::chrono::duration_cast<milliseconds>(end - Clock::now()), milliseconds(1));
      milliseconds slice = between ? std::min(left, milliseconds(500)) : left;
      try {
        wait(claimed, slice);
        break;
      } catch (const gloo::IoException &) {
        if (fd_ < 0 || Clock::now() >= end) throw;
      }
      if (between) between();
    }
  } catch (const C10dRankTaken &) {
    throw;
  } catch (const gloo::IoException &) {
    if (fd_ < 0) throw;
    std::vector<std::string> missing;
    for (int k = 0; k < world; k++)
      if (!check({claimed[size_t(k)]})) missing.push_back(std::to_string(k));
    if (missing.empty()) throw;
    throw gloo::IoException("timed out after " + std::to_string(timeout_.count()) + " ms waiting for " +
                            (missing.size() == 1 ? "rank " : "ranks ") + first_few(missing) +
                            " to join in the torch c10d store at " + where_ +
                            "; check that every rank started with the same world size and that the launcher "
                            "started them all");
  }
}

bool C10dStore::check_raw(const std::vector<std::string> &keys, Clock::time_point deadline) {
  std::string msg;
  put<uint8_t>(msg, Q_CHECK);
  put<uint64_t>(msg, keys.size());
  for (const auto &k : keys) put_str(msg, k);
  send_all(msg, deadline);
  uint8_t reply = 0xff;
  recv_exact(&reply, 1, deadline);
  if (reply != READY && reply != NOT_READY) lose("it answered a CHECK with " + std::to_string(reply));
  return reply == READY;
}

bool C10dStore::check(const std::vector<std::string> &keys) {
  std::vector<std::string> k;
  for (const auto &key : keys) k.push_back(scoped(key));
  return check_raw(k, Clock::now() + timeout_);
}

void C10dStore::set(const std::string &key, const std::vector<char> &data) {
  std::string msg;
  put<uint8_t>(msg, Q_SET);
  put_str(msg, scoped(key));
  put_str(msg, std::string(data.begin(), data.end()));
  send_all(msg, Clock::now() + timeout_);
}

std::vector<char> C10dStore::get(const std::string &key) {
  wait({key}, timeout_);
  Clock::time_point deadline = Clock::now() + timeout_;
  std::string msg;
  put<uint8_t>(msg, Q_GET);
  put_str(msg, scoped(key));
  send_all(msg, deadline);
  uint64_t len = 0;
  recv_exact(&len, sizeof len, deadline);
  if (len > kMaxValue) lose("it answered a GET with a " + std::to_string(len) + "-byte value");
  std::vector<char> v(len);
  if (len) recv_exact(v.data(), len, deadline);
  return v;
}

void C10dStore::wait(const std::vector<std::string> &keys) { wait(keys, timeout_); }

void C10dStore::wait(const std::vector<std::string> &keys, const milliseconds &timeout) {
  // Gloo's convention: zero means no timeout; ours never blocks past the store's own.
  milliseconds t = timeout.count() > 0 ? std::min(timeout, timeout_) : timeout_;
  Clock::time_point deadline = Clock::now() + t;
  std::vector<std::string> k;
  for (const auto &key : keys) k.push_back(scoped(key));
  milliseconds pause(1);
  for (;;) {
    // Each request may take the rest of the store's timeout, not just the rest of this wait:
    // a wait about to expire must still learn the answer of its last poll.
    Clock::time_point req = Clock::now() + timeout_;
    if (check_raw(k, req)) return;
    if (!abort_key_.empty() && check_raw({abort_key_}, req)) {
      std::string msg;
      put<uint8_t>(msg, Q_GET);
      put_str(msg, abort_key_);
      send_all(msg, req);
      uint64_t len = 0;
      recv_exact(&len, sizeof len, req);
      if (len > 4096) lose("it answered a GET with a " + std::to_string(len) + "-byte value");
      std::string why(len, '\0');
      if (len) recv_exact(&why[0], len, req);
      throw C10dRankTaken(why);
    }
    int left = remaining_ms(deadline);
    if (left <= 0) break;
    std::this_thread::sleep_for(std::min(pause, milliseconds(left)));
    pause = std::min(pause * 2, milliseconds(50));
  }
  throw gloo::IoException("Wait timeout after " + std::to_string(t.count()) + " ms for key(s) " + first_few(keys) +
                          " in the torch c10d store at " + where_);
}

} // namespace shardload
