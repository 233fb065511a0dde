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

#include "tcp_socket.h"

namespace shardload {
namespace {

using tcp_socket::Clock;
using tcp_socket::ms_since;
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
// How often the claim's wait runs its BETWEEN (the lobby).
constexpr milliseconds kBetween(500);

using std::chrono::microseconds;

// The waits poll (torch's WAIT cannot also watch the abort key, nor be given up on without
// closing the connection), backing off from kPollFirst, so that a key set a moment later is
// seen a moment later, to a ceiling that grows with the world size: every rank polls the one
// server, torchrun's agent, which sees about 2000 polls a second whatever the world size (W
// ranks, each every W/2 ms), within [2 ms, 50 ms].
constexpr microseconds kPollFirst(100);
microseconds poll_most(int world) {
  return std::clamp(microseconds(500) * std::max(world, 1), microseconds(2000), microseconds(50000));
}

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

C10dStore::C10dStore(const std::string &host, int port, milliseconds timeout, Clock::time_point bound_at)
    : where_(tcp_socket::host_port(host, port)),
      timeout_(timeout) {
  bound(bound_at);
  Clock::time_point started = Clock::now(), deadline = until(timeout);
  std::string err = "not tried";
  // From 0.1 ms: a store that starts listening a moment later is met a moment later.
  std::chrono::microseconds backoff(100);
  for (;;) {
    fd_ = try_connect(host, port, deadline, &err);
    if (fd_ >= 0) break;
    int left = remaining_ms(deadline);
    if (left <= 0)
      throw StoreTimeout("timed out after " + std::to_string(ms_since(started)) +
                         " ms connecting to the torch c10d store at " + where_ + ": " + err +
                         "; check that MASTER_ADDR:MASTER_PORT (or the c10d:// rendezvous) names the torchrun "
                         "agent's store and that torchrun is still running");
    std::this_thread::sleep_for(std::min<std::chrono::microseconds>(backoff, milliseconds(left)));
    backoff = std::min<std::chrono::microseconds>(backoff * 2, milliseconds(250));
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
  Clock::time_point hs = until(std::min(timeout_, milliseconds(10000)));
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
  // so it confirms an abort SET sent before it too). Past the rendezvous's bound on purpose:
  // a run whose rendezvous failed must leave too, or the next run of the rank cannot start.
  if (!left_key_.empty()) {
    try {
      add_raw(left_key_, 1, Clock::now() + std::min(timeout_, kLeaveLimit));
    } catch (...) {
    }
  }
  if (fd_ >= 0) ::close(fd_);
}

void C10dStore::lose(const std::string &why, bool silent) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  std::string msg = "torch c10d store at " + where_ + ": " + why + doing_ +
                    "; check that MASTER_ADDR:MASTER_PORT (or the c10d:// rendezvous) names the torchrun agent's "
                    "store, or use tcp:// for shardload's own store";
  if (silent) throw StoreTimeout(msg);
  throw gloo::IoException(msg);
}

void C10dStore::send_all(const std::string &msg, Clock::time_point deadline) {
  if (fd_ < 0) throw gloo::IoException("torch c10d store at " + where_ + " is unreachable (an earlier request failed)");
  if (too_late(deadline)) // the connection stays usable (rdzv_store.h)
    throw StoreTimeout("torch c10d store at " + where_ + ": the rendezvous's time ran out" + doing_);
  sent_at_ = Clock::now();
  int sent = tcp_socket::send_all(fd_, msg, deadline);
  if (sent < 0) lose("no progress sending a request within " + std::to_string(ms_since(sent_at_)) + " ms", true);
  if (sent > 0) lose(std::string("connection lost (torchrun exited?): ") + strerror(sent));
}

void C10dStore::recv_exact(void *buf, size_t n, Clock::time_point deadline) {
  if (fd_ < 0) throw gloo::IoException("torch c10d store at " + where_ + " is unreachable (an earlier request failed)");
  auto *p = static_cast<char *>(buf);
  for (size_t got = 0; got < n;) {
    pollfd pf = {fd_, POLLIN, 0};
    int rc = ::poll(&pf, 1, remaining_ms(deadline));
    if (rc == 0) lose("no answer within " + std::to_string(ms_since(sent_at_)) + " ms", true);
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

int64_t C10dStore::add(const std::string &key, int64_t delta) { return add_raw(scoped(key), delta, until(timeout_)); }

int64_t C10dStore::add_raw(const std::string &key, int64_t delta, Clock::time_point deadline) {
  std::string msg;
  put<uint8_t>(msg, Q_ADD);
  put_str(msg, key);
  put<int64_t>(msg, delta);
  send_all(msg, deadline);
  int64_t v = 0;
  recv_exact(&v, sizeof v, deadline);
  return v;
}

std::string C10dStore::get_raw(const std::string &key, uint64_t max, Clock::time_point deadline) {
  std::string msg;
  put<uint8_t>(msg, Q_GET);
  put_str(msg, key);
  send_all(msg, deadline);
  uint64_t len = 0;
  recv_exact(&len, sizeof len, deadline);
  if (len > max) lose("it answered a GET with a " + std::to_string(len) + "-byte value");
  std::string v(len, '\0');
  if (len) recv_exact(&v[0], len, deadline);
  return v;
}

void C10dStore::check_abort(Clock::time_point deadline) {
  if (abort_key_.empty() || !check_raw({abort_key_}, deadline)) return;
  throw C10dRankTaken(get_raw(abort_key_, 4096, deadline));
}

void C10dStore::claim(const std::string &prefix, int rank, int world, const std::function<void()> &between) {
  // One deadline for the claim and its wait, within the rendezvous's (the bound).
  Clock::time_point end = until(timeout_);
  std::string r = std::to_string(rank);
  int64_t n = add_raw(prefix + "/sl_claim/" + r, 1, end);
  if (n < 1 || n > 1000000)
    lose("it answered an ADD on key '" + prefix + "/sl_claim/" + r + "' with " + std::to_string(n));
  auto space = [&](int64_t k) { return prefix + "/run" + std::to_string(k) + "/"; };
  space_ = space(n);
  world_ = world;
  abort_key_ = space_ + "sl_abort";
  if (n > 1) {
    // Run N-1 of this rank must have left; if it has not, it is alive in the same job.
    std::string prev = space(n - 1);
    if (!check_raw({prev + "sl_left/" + r}, end)) {
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
        send_all(msg, end);
      } catch (...) {
      }
      left_key_ = space_ + "sl_left/" + r; // this run is over too: a later one may proceed
      throw C10dRankTaken(why);
    }
  }
  left_key_ = space_ + "sl_left/" + r;

  // Every rank of the run claims before any goes on, so a duplicate found during the
  // rendezvous fails them all (through the abort key) instead of only itself. Each rank sets
  // its key (for the report) and then counts itself in: the wait polls the count.
  std::string msg;
  put<uint8_t>(msg, Q_SET);
  put_str(msg, space_ + "sl_claimed/" + r);
  put_str(msg, "1");
  send_all(msg, end);
  const std::string count = space_ + "sl_claimed";
  add_raw(count, 1, end);
  microseconds pause = kPollFirst;
  Clock::time_point next = Clock::now() + kBetween;
  // Polls end while a request still fits before END, so that the connection is whole for
  // the report below (rdzv_store.h: kShortestRequest).
  Clock::time_point last = end - 2 * kShortestRequest;
  while (Clock::now() < last) {
    if (add_raw(count, 0, end) >= world) return;
    check_abort(end);
    if (between && Clock::now() >= next) {
      between();
      next = Clock::now() + kBetween;
    }
    std::this_thread::sleep_for(std::min<microseconds>(
        {pause, milliseconds(remaining_ms(last)), milliseconds(remaining_ms(next))}));
    pause = std::min(pause * 2, poll_most(world));
  }
  Clock::time_point report = Clock::now() + report_grace(timeout_);
  Absent a = find_absent(
      world, [&] { return add_raw(count, 0, report); },
      [&](int k) { return check_raw({space_ + "sl_claimed/" + std::to_string(k)}, report); }, report);
  // the last ranks may have claimed between the final poll and the report: then all are here
  if (a.count == 0) return;
  std::string who = absent_text(a, world);
  throw StoreTimeout("timed out after " + std::to_string(timeout_.count()) + " ms waiting for " +
                     (who.empty() ? "the other ranks" : who) + " to join in the torch c10d store at " + where_ +
                     "; check that every rank started with the same world size and that the launcher started "
                     "them all");
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
  return check_raw(k, until(timeout_));
}

void C10dStore::set(const std::string &key, const std::vector<char> &data) {
  std::string msg;
  put<uint8_t>(msg, Q_SET);
  put_str(msg, scoped(key));
  put_str(msg, std::string(data.begin(), data.end()));
  send_all(msg, until(timeout_));
}

std::vector<char> C10dStore::get(const std::string &key) {
  wait({key}, timeout_);
  std::string v = get_raw(scoped(key), kMaxValue, until(timeout_));
  return std::vector<char>(v.begin(), v.end());
}

void C10dStore::wait(const std::vector<std::string> &keys) { wait(keys, timeout_); }

void C10dStore::wait(const std::vector<std::string> &keys, const milliseconds &timeout) {
  // Gloo's convention: zero means no timeout; ours never blocks past the store's own (nor
  // past the bound).
  Clock::time_point started = Clock::now();
  Clock::time_point deadline = until(timeout.count() > 0 ? std::min(timeout, timeout_) : timeout_);
  std::vector<std::string> k;
  for (const auto &key : keys) k.push_back(scoped(key));
  microseconds pause = kPollFirst;
  for (;;) {
    // Each request may take the rest of the store's timeout (within the bound), not just the
    // rest of this wait: a wait about to expire must still learn the answer of its last poll.
    Clock::time_point req = until(timeout_);
    if (check_raw(k, req)) return;
    check_abort(req);
    int left = remaining_ms(deadline);
    if (left <= 0) break;
    std::this_thread::sleep_for(std::min<microseconds>(pause, milliseconds(left)));
    pause = std::min(pause * 2, poll_most(world_));
  }
  throw StoreTimeout("Wait timeout after " + std::to_string(ms_since(started)) + " ms for key(s) " +
                     first_few(keys) + " in the torch c10d store at " + where_);
}

} // namespace shardload
