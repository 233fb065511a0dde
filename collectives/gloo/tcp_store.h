// A small key-value store over TCP, for Gloo's rendezvous when ranks share no filesystem.
//
// Gloo (this packaged version) has a FileStore and a RedisStore but no TCP store of its own,
// and a multi-node job must not need either a shared filesystem or a Redis server. So rank 0
// serves one (TcpStoreServer, a poll-based thread) and every rank, rank 0 included, talks to
// it through TcpStore, a gloo::rendezvous::Store.
//
// Files: this header (the protocol and the API), tcp_store_server.cc (TcpStoreServer and
// TcpStoreLimits), tcp_store.cc (TcpStore), tcp_store_auth.h/.cc (the job's secret: token,
// key, proofs; tcp_store_key, tcp_store_token and tcp_store_allowed are declared there and
// reach users through this header), tcp_store_wire.h (the frame encoding both sides share)
// and tcp_socket.h/.cc (a bounded connect and other socket helpers).
//
// Wire format (all integers big-endian): a frame is u32 body length, then the body: u8 op
// (request) or u8 status (response), u32 field count, and per field u32 length + bytes.
//
// Handshake (nothing else is served before it completes; docs/DESIGN.md#threat-model).
// K = BLAKE2b-256("shardload rendezvous key v2" || 0x00 || token) (crypto_generichash), with
// the empty token when none is set (loopback), so there is one protocol.
//   HELLO [version, rank, world, cn]  -> OK [sn, server proof] | DENIED [why]   (version "3")
//   AUTH  [client proof]              -> OK | BAD [world] | CONFLICT [why] | DENIED [why]
// cn, sn: 32 random bytes each (the client's and the server's). A proof is
// HMAC-SHA-256(K, "shardload-rdzv/" version || role || u32 rank || u32 world || cn || sn), role 'S'
// for the server's, 'C' for the client's, checked in constant time. The client checks the
// server's proof first (a rogue store must not feed ranks forged Gloo addresses) and sends
// AUTH [""] instead when it fails, so rank 0 learns why that rank never joined. The secret
// never crosses the wire. BAD: the world size differs from rank 0's (which it gives).
// CONFLICT: this rank number already joined (or another one did twice): once a rank number
// has been claimed twice, every request of every rank is answered CONFLICT, so no rank of
// that job loads.
//   SET   [key, value]      -> OK | TOOBIG [why]
//   GET   [key]             -> OK [value] | MISSING
//   CHECK [key...]          -> OK | MISSING (all keys present?)
//   WAIT  [ms, key...]      -> OK once all keys are present | TIMEOUT [missing key...] after ms
//   ADD   [key, delta]      -> OK [sum] (decimal integers; a missing key counts from 0, delta 0
//                              reads it) | BAD [why] (the key holds no integer, or it would overflow)
//
// Bounds (TcpStoreLimits::for_world). Gloo's connectFullMesh stores one value per rank: the
// addresses of its W-1 pairs, each gloo::transport::Address::kMaxByteSize (192) bytes at most
// (tcp: a sockaddr_storage and a sequence number, 136 bytes). Our own keys (join, failure
// reports) are under 1 KiB per rank. So, with headroom for the loader's own agreement keys:
//   largest value         192 x W + 256 KiB       (W = 2: 256.4 KiB; W = 1024: 448 KiB)
//   whole store           192 x W^2 + 4 MiB + 16 KiB x W (W = 2: 4 MiB; W = 1024: 212 MiB)
//   largest frame         largest value + 64 KiB + 64 x W (key, field headers, WAIT key lists)
//   handshake frame       1 KiB (before authentication)
//   reply queue           a connection whose unsent replies pass 256 KiB is not read until
//                         they drain (one reply may overshoot by a frame)
//   connections           W + 8 authenticated, plus min(max(16, W), 256) handshakes in progress; past
//                         that a new connection is closed at once (the client retries)
//   handshake deadline    min(timeout, 3 s): an unauthenticated client is dropped after it
//   accept() out of descriptors (EMFILE/ENFILE): the listener rests 100 ms, no busy loop.
//
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

#include "rdzv_store.h"
#include "tcp_store_auth.h"

namespace shardload {

// What the store accepts for a job of WORLD ranks; see the head of the file.
struct TcpStoreLimits {
  size_t max_value, max_total, max_frame, max_queue;
  size_t max_conns, max_pending;
  std::chrono::milliseconds handshake;
  static TcpStoreLimits for_world(int world, std::chrono::milliseconds timeout);
};

class TcpStoreServer {
 public:
  // Binds PORT on the addresses HOST resolves to, and only those (clients reach the store by
  // that name), and starts the serving thread. TIMEOUT bounds the handshake deadline. Throws
  // std::runtime_error saying why it could not ("cannot listen" when the port is taken).
  TcpStoreServer(const std::string &host, int port, int world_size, const TcpStoreKey &key,
                 std::chrono::milliseconds timeout);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer &) = delete;
  TcpStoreServer &operator=(const TcpStoreServer &) = delete;

  // Returns once every rank has closed its connection, or after GRACE; joins the thread.
  // ONLY_CONNECTED: wait only for the ranks that have connected (a failed rendezvous, where
  // ranks yet to come could not succeed anyway). SKIP: ranks not to wait for (found stuck
  // or dead: a stuck rank would hold its connection, and rank 0, for the whole GRACE).
  void shutdown(std::chrono::milliseconds grace, bool only_connected = false, const std::vector<int> &skip = {});

  // Why clients that claimed a rank failed to authenticate ("" when none did), for rank 0's
  // message when that rank never joins. Any thread.
  std::string refusals() const;

  struct State; // the serving thread's data (tcp_store_server.cc)

 private:
  std::unique_ptr<State> state_;
};

// Rank 0's store refused this rank, or this rank refused the store: different world sizes,
// different tokens, or a rank number started twice. The message says which and what to do.
class TcpStoreRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class TcpStore : public RdzvStore {
 public:
  // Connects to HOST:PORT, retrying until TIMEOUT because rank 0 may start late (or shed
  // the connection while busy), and authenticates with KEY. TIMEOUT also bounds every later
  // request that has no timeout of its own; BOUND (RdzvStore::bound) holds them, and the
  // connecting, to the rendezvous's deadline. Throws TcpStoreRefused when the handshake is
  // refused either way (see the class), StoreTimeout when rank 0 did not answer in time, and
  // gloo::IoException naming the store on any other failure.
  TcpStore(const std::string &host, int port, int rank, int world, const TcpStoreKey &key,
           std::chrono::milliseconds timeout, Clock::time_point bound);
  ~TcpStore() override;

  void set(const std::string &key, const std::vector<char> &data) override;
  // Waits (up to the store's timeout) for the key, as Gloo's own stores do.
  std::vector<char> get(const std::string &key) override;
  void wait(const std::vector<std::string> &keys) override;
  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &timeout) override;
  bool check(const std::vector<std::string> &keys) override;
  int64_t add(const std::string &key, int64_t delta) override;
  // True once the connection failed: the server (rank 0) is gone or unreachable.
  bool broken() const { return fd_ < 0; }
  // True when it failed because a request went unanswered (rank 0 stuck, or its host
  // unreachable) rather than because the connection closed (rank 0 exited).
  bool silent() const { return silent_; }
  // Bounds every later request, WAIT included, to LIMIT whatever its own timeout: after a
  // failure the diagnosis must not spend a second whole timeout on a store that is stuck too.
  void limit(std::chrono::milliseconds limit) { limit_ = limit; }

 private:
  std::vector<std::string> request(uint8_t op, const std::vector<std::string> &fields,
                                   std::chrono::milliseconds timeout, uint8_t *status);
  // One handshake on a fresh connection (tcp_store.h). Throws TcpStoreRefused, or
  // gloo::IoException when the connection closed or went silent first.
  void handshake(int rank, int world, const TcpStoreKey &key, std::chrono::steady_clock::time_point deadline);
  [[noreturn]] void lose(const std::string &why, bool silent = false);

  int fd_ = -1;
  bool silent_ = false;
  std::string where_; // "HOST:PORT", for messages
  std::chrono::milliseconds timeout_;
  TcpStoreLimits limits_;
  std::chrono::milliseconds limit_ = std::chrono::milliseconds::max();
};

} // namespace shardload
