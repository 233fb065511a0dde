// The rendezvous store's client: TcpStore, the gloo::rendezvous::Store every rank (rank 0
// included) talks to the server through. Protocol and lifetime rules: tcp_store.h.
#include "tcp_store.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/common/error.h>

#include "tcp_socket.h"
#include "tcp_store_wire.h"

namespace shardload {

using namespace tcp_socket;
using namespace tcp_store_wire;
using namespace tcp_store_auth;
using std::chrono::milliseconds;

TcpStore::TcpStore(const std::string &host, int port, int rank, int world, const TcpStoreKey &key,
                   milliseconds timeout, Clock::time_point bound_at)
    : where_(host_port(host, port)),
      timeout_(timeout), limits_(TcpStoreLimits::for_world(world, timeout)) {
  need_sodium();
  bound(bound_at);
  Clock::time_point started = Clock::now(), deadline = until(timeout);
  std::string err = "not tried";
  // From 0.1 ms: a store that starts listening a moment later is met a moment later.
  std::chrono::microseconds backoff(100);
  // Rank 0 may not be listening yet, or may shed connections past its limits while many
  // ranks connect at once: keep trying until the timeout.
  for (;;) {
    fd_ = try_connect(host, port, deadline, &err);
    if (fd_ >= 0) {
      set_nodelay(fd_);
      try {
        handshake(rank, world, key, deadline);
        return;
      } catch (const gloo::IoException &e) { // closed (rank 0 shed it, or exited): try again
        if (silent_ || remaining_ms(deadline) <= 0) throw;
        err = e.what();
      }
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
      silent_ = false;
    }
    int left = remaining_ms(deadline);
    if (left <= 0)
      throw StoreTimeout("timed out after " + std::to_string(ms_since(started)) +
                         " ms connecting to the rendezvous store at " + where_ + " (served by rank 0): " + err);
    std::this_thread::sleep_for(std::min<std::chrono::microseconds>(backoff, milliseconds(left)));
    backoff = std::min<std::chrono::microseconds>(backoff * 2, milliseconds(250));
  }
}

namespace {

// "A, B, C" for the first 8 keys, then "and N more".
std::string first_few(const std::vector<std::string> &items) {
  std::string list;
  for (size_t i = 0; i < items.size() && i < 8; i++) list += (i ? ", " : "") + items[i];
  if (items.size() > 8) list += " and " + std::to_string(items.size() - 8) + " more";
  return list;
}

// Text from a peer that has not proved the job's token, fit for a message: at most 200
// bytes, control characters replaced.
std::string unverified(const std::string &s) {
  const size_t max = 200;
  std::string out = s.substr(0, max);
  for (char &ch : out)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
  if (s.size() > max) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

} // namespace

void TcpStore::handshake(int rank, int world, const TcpStoreKey &key, Clock::time_point deadline) {
  // Both requests share the constructor's deadline: connecting is bounded by one timeout.
  auto left = [&] { return milliseconds(std::max(1, remaining_ms(deadline))); };
  const std::string advice = ": ranks were started with different SHARDLOAD_TOKEN (or SHARDLOAD_TOKEN_FILE) "
                             "values, or another job's store serves this port; give every rank of a job the "
                             "same token";
  auto refused = [&](const std::string &why) {
    ::close(fd_);
    fd_ = -1;
    return TcpStoreRefused(why);
  };
  std::string cn = random_nonce();
  uint8_t status;
  auto f = request(OP_HELLO, {kProtocol, std::to_string(rank), std::to_string(world), cn}, left(), &status);
  if (status == ST_DENIED && f.size() == 1)
    throw refused("the rendezvous store at " + where_ + " refused this rank, saying (unverified: it has not proved " +
                  "the job's token): " + unverified(f[0]));
  if (status != ST_OK || f.size() != 2 || f[0].size() != kNonce) lose("malformed answer to the handshake");
  const std::string &sn = f[0];
  if (!proof_ok(key, f[1], 'S', rank, world, cn, sn)) {
    // Tell rank 0 why this rank goes (an empty proof), then go.
    std::string msg = frame(OP_AUTH, {std::string()});
    ssize_t ignored = ::send(fd_, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)ignored;
    throw refused("the rendezvous store at " + where_ + " did not prove the job's token" + advice);
  }
  f = request(OP_AUTH, {proof(key, 'C', rank, world, cn, sn)}, left(), &status);
  if (status == ST_OK) return;
  if (status == ST_BAD && f.size() == 1)
    throw refused("rank 0 (serving the rendezvous store at " + where_ + ") runs a job of " + f[0] +
                  " ranks, but this rank was started as rank " + std::to_string(rank) + " of " +
                  std::to_string(world) + "; every rank must be started with the same world size");
  if (status == ST_DENIED && f.size() == 1)
    throw refused("the rendezvous store at " + where_ + " refused this rank's proof of the job's token" + advice);
  lose("malformed answer to the handshake");
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpStore::lose(const std::string &why, bool silent) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  silent_ = silent;
  std::string msg = "rendezvous store at " + where_ + " (served by rank 0): " + why;
  if (silent) throw StoreTimeout(msg);
  throw gloo::IoException(msg);
}

std::vector<std::string> TcpStore::request(uint8_t op, const std::vector<std::string> &fields, milliseconds timeout,
                                           uint8_t *status) {
  if (fd_ < 0) throw gloo::IoException("rendezvous store at " + where_ + " (served by rank 0) is unreachable");
  Clock::time_point sent_at = Clock::now(), deadline = until(std::min(timeout, limit_));
  if (too_late(deadline)) // the connection stays usable (rdzv_store.h)
    throw StoreTimeout("rendezvous store at " + where_ + " (served by rank 0): the rendezvous's time ran out");
  int sent = send_all(fd_, frame(op, fields), deadline);
  if (sent < 0) lose("no progress sending a request within " + std::to_string(ms_since(sent_at)) + " ms", true);
  if (sent > 0) lose(std::string("connection lost (rank 0 exited?): ") + strerror(sent));
  std::string in;
  size_t want = 4;
  bool have_len = false;
  while (in.size() < want) {
    pollfd p = {fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc == 0) lose("no answer within " + std::to_string(ms_since(sent_at)) + " ms", true);
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
      if (len > limits_.max_frame) lose("malformed answer");
      want = 4 + size_t(len);
      have_len = true;
    }
  }
  std::vector<std::string> out;
  if (!parse_body(in.data() + 4, in.size() - 4, status, &out)) lose("malformed answer");
  if (*status == ST_CONFLICT && out.size() == 1) {
    ::close(fd_);
    fd_ = -1;
    throw TcpStoreRefused("the rendezvous store at " + where_ + " (served by rank 0) stopped this job: " + out[0]);
  }
  return out;
}

void TcpStore::set(const std::string &key, const std::vector<char> &data) {
  // Past the store's limits (tcp_store.h) the job stores more than a rendezvous needs: a
  // bug, said as such rather than sent for the server to drop the connection.
  if (key.size() > kMaxKey || data.size() > limits_.max_value)
    throw gloo::InvalidOperationException("rendezvous store at " + where_ + ": key '" + key.substr(0, 64) + "' (" +
                                          std::to_string(key.size()) + " bytes) with a value of " +
                                          std::to_string(data.size()) + " bytes is past the store's limits (" +
                                          std::to_string(kMaxKey) + " and " + std::to_string(limits_.max_value) +
                                          " bytes)");
  uint8_t status;
  auto f = request(OP_SET, {key, std::string(data.begin(), data.end())}, timeout_, &status);
  if (status == ST_TOOBIG && f.size() == 1)
    throw gloo::InvalidOperationException("rendezvous store at " + where_ + " refused key '" + key.substr(0, 64) +
                                          "' (" + std::to_string(data.size()) + " bytes): " + f[0]);
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
  // Within limit() (request's bound) too, with a quarter of it left for the answer: the
  // server must time the wait out before this client gives up, or it reads as rank 0 stuck.
  milliseconds t = std::min(timeout.count() > 0 ? timeout : timeout_, limit_ - limit_ / 4);
  // Within the bound too, with the same share left for the answer: a wait the bound cut short
  // is the server's TIMEOUT, not a connection given up on.
  if (bounded() != Clock::time_point::max()) {
    auto left = std::chrono::duration_cast<milliseconds>(bounded() - Clock::now());
    t = std::min(t, left - std::clamp(left / 4, 5 * kShortestRequest, milliseconds(5000)));
  }
  if (t < kShortestRequest)
    throw StoreTimeout("Wait timeout (the rendezvous's time is up) for key(s) " + first_few(keys) +
                       " in the rendezvous store at " + where_);
  std::vector<std::string> fields{std::to_string(t.count())};
  fields.insert(fields.end(), keys.begin(), keys.end());
  uint8_t status;
  // The server answers at its deadline; the slack covers a busy server and the network.
  auto missing = request(OP_WAIT, fields, t + milliseconds(5000), &status);
  if (status == ST_OK) return;
  if (status != ST_TIMEOUT) lose("malformed answer to a WAIT");
  throw StoreTimeout("Wait timeout after " + std::to_string(t.count()) + " ms for key(s) " + first_few(missing) +
                     " in the rendezvous store at " + where_);
}

bool TcpStore::check(const std::vector<std::string> &keys) {
  uint8_t status;
  request(OP_CHECK, keys, timeout_, &status);
  return status == ST_OK;
}

int64_t TcpStore::add(const std::string &key, int64_t delta) {
  uint8_t status;
  auto f = request(OP_ADD, {key, std::to_string(delta)}, timeout_, &status);
  // a refusal (a malformed request, or the store full) is an answer: the connection stays
  if ((status == ST_BAD || status == ST_TOOBIG) && f.size() == 1)
    throw gloo::InvalidOperationException("rendezvous store at " + where_ + " refused to add to key '" +
                                          key.substr(0, 64) + "': " + unverified(f[0]));
  char *end = nullptr;
  errno = 0;
  long long v = f.size() == 1 ? strtoll(f[0].c_str(), &end, 10) : 0;
  if (status != ST_OK || f.size() != 1 || f[0].empty() || *end || errno) lose("malformed answer to an ADD");
  return int64_t(v);
}

} // namespace shardload
