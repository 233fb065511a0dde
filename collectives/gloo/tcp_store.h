// A small key-value store over TCP, for Gloo's rendezvous when ranks share no filesystem.
//
// Gloo (this packaged version) has a FileStore and a RedisStore but no TCP store of its own,
// and a multi-node job must not need either a shared filesystem or a Redis server. So rank 0
// serves one (TcpStoreServer, a poll-based thread) and every rank, rank 0 included, talks to
// it through TcpStore, a gloo::rendezvous::Store.
//
// Wire format (all integers big-endian): a frame is u32 body length, then the body: u8 op
// (request) or u8 status (response), u32 field count, and per field u32 length + bytes.
//   HELLO [rank]            -> OK           names the connection's rank
//   SET   [key, value]      -> OK
//   GET   [key]             -> OK [value] | MISSING
//   CHECK [key...]          -> OK | MISSING (all keys present?)
//   WAIT  [ms, key...]      -> OK once all keys are present | TIMEOUT after ms
// A rank is done with the store when its connection closes (its communicator was destroyed,
// or it died). The server outlives rank 0's own use of it until every rank is done, so no
// rank loses the store while still in a rendezvous or still reporting a failure.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
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
  // ranks yet to come could not succeed anyway).
  void shutdown(std::chrono::milliseconds grace, bool only_connected = false);

  struct State; // the serving thread's data (tcp_store.cc)

 private:
  std::unique_ptr<State> state_;
};

class TcpStore : public gloo::rendezvous::Store {
 public:
  // Connects to HOST:PORT, retrying until TIMEOUT because rank 0 may start late, and says
  // HELLO. TIMEOUT also bounds every later request that has no timeout of its own.
  // Throws gloo::IoException naming the store on failure.
  TcpStore(const std::string &host, int port, int rank, std::chrono::milliseconds timeout);
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
  const std::string &where() const { return where_; }

 private:
  std::vector<std::string> request(uint8_t op, const std::vector<std::string> &fields,
                                   std::chrono::milliseconds timeout, uint8_t *status);
  [[noreturn]] void lose(const std::string &why);

  int fd_ = -1;
  std::string where_; // "HOST:PORT", for messages
  std::chrono::milliseconds timeout_;
};

} // namespace shardload
