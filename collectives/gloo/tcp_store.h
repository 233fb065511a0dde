// A small key-value store over TCP, for Gloo's rendezvous when ranks share no filesystem.
//
// Gloo (this packaged version) has a FileStore and a RedisStore but no TCP store of its own,
// and a multi-node job must not need either a shared filesystem or a Redis server. So rank 0
// serves one (TcpStoreServer, a poll-based thread) and every rank, rank 0 included, talks to
// it through TcpStore, a gloo::rendezvous::Store.
//
// Wire format (all integers big-endian): a frame is u32 body length, then the body: u8 op
// (request) or u8 status (response), u32 field count, and per field u32 length + bytes.
//   HELLO [rank, world]     -> OK | BAD [world]   names the connection's rank; BAD when the
//                                          world size differs from rank 0's (which it gives)
//   SET   [key, value]      -> OK
//   GET   [key]             -> OK [value] | MISSING
//   CHECK [key...]          -> OK | MISSING (all keys present?)
//   WAIT  [ms, key...]      -> OK once all keys are present | TIMEOUT after ms
// A rank is done with the store when its connection closes (its communicator was destroyed,
// or it died). The server outlives rank 0's own use of it until every rank is done, so no
// rank loses the store while still in a rendezvous or still reporting a failure; only ranks
// rank 0 itself found stuck or dead are not waited for.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace shardload {

class TcpStoreServer {
 public:
  // Binds PORT on every local address (clients reach it by the rendezvous host) and starts
  // the serving thread. Throws std::runtime_error saying why it could not.
  TcpStoreServer(int port, int world_size);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer &) = delete;
  TcpStoreServer &operator=(const TcpStoreServer &) = delete;

  // Returns once every rank has closed its connection, or after GRACE; joins the thread.
  // ONLY_CONNECTED: wait only for the ranks that have connected (a failed rendezvous, where
  // ranks yet to come could not succeed anyway). SKIP: ranks not to wait for (found stuck
  // or dead: a stuck rank would hold its connection, and rank 0, for the whole GRACE).
  void shutdown(std::chrono::milliseconds grace, bool only_connected = false, const std::vector<int> &skip = {});

  struct State; // the serving thread's data (tcp_store.cc)

 private:
  std::unique_ptr<State> state_;
};

// Rank 0's store refused this rank: the ranks were started with different world sizes.
class TcpStoreRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class TcpStore : public gloo::rendezvous::Store {
 public:
  // Connects to HOST:PORT, retrying until TIMEOUT because rank 0 may start late, and says
  // HELLO. TIMEOUT also bounds every later request that has no timeout of its own.
  // Throws TcpStoreRefused when rank 0 runs a job of another size than WORLD, and
  // gloo::IoException naming the store on any other failure.
  TcpStore(const std::string &host, int port, int rank, int world, std::chrono::milliseconds timeout);
  ~TcpStore() override;

  void set(const std::string &key, const std::vector<char> &data) override;
  // Waits (up to the store's timeout) for the key, as Gloo's own stores do.
  std::vector<char> get(const std::string &key) override;
  void wait(const std::vector<std::string> &keys) override;
  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &timeout) override;
  // Whether every key is present now.
  bool check(const std::vector<std::string> &keys);
  // True once the connection failed: the server (rank 0) is gone or unreachable.
  bool broken() const { return fd_ < 0; }
  // True when it failed because a request went unanswered (rank 0 stuck, or its host
  // unreachable) rather than because the connection closed (rank 0 exited).
  bool silent() const { return silent_; }
  // Bounds every later request, WAIT included, to LIMIT whatever its own timeout: after a
  // failure the diagnosis must not spend a second whole timeout on a store that is stuck too.
  void limit(std::chrono::milliseconds limit) { limit_ = limit; }
  const std::string &where() const { return where_; }

 private:
  std::vector<std::string> request(uint8_t op, const std::vector<std::string> &fields,
                                   std::chrono::milliseconds timeout, uint8_t *status);
  [[noreturn]] void lose(const std::string &why, bool silent = false);

  int fd_ = -1;
  bool silent_ = false;
  std::string where_; // "HOST:PORT", for messages
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds limit_ = std::chrono::milliseconds::max();
};

} // namespace shardload
