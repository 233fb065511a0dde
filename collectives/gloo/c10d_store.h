// A client of torch's c10d TCPStore, for Gloo's rendezvous under torchrun.
//
// torchrun's agent already serves a c10d TCPStore on MASTER_ADDR:MASTER_PORT and tells its
// workers so (TORCHELASTIC_USE_AGENT_STORE=True): a rank that tried to serve shardload's own
// tcp:// store there would find the port taken. So under torchrun every rank, rank 0 included,
// is a client of the agent's store (rendezvous URL c10d://HOST:PORT) and keeps its keys under a
// prefix of its own.
//
// Wire protocol (torch/csrc/distributed/c10d/TCPStoreBackend.hpp; both of torch's servers, the
// libuv one and the classic one, speak it). Integers are in the sender's byte order, which is
// little-endian on every platform torch ships; strings are u64 length + bytes. A request is a
// u8 query type and its arguments:
//   VALIDATE(0) u32 magic 0x3C85F7CE  -> nothing (a wrong magic closes the connection)
//   SET(1)      key, value            -> nothing
//   GET(3)      key                   -> value (the key must exist: clients WAIT or CHECK first)
//   ADD(4)      key, i64 delta        -> i64 new value (a missing key counts from 0; delta 0 reads)
//   CHECK(5)    u64 n, n keys         -> u8 0 READY (all present) | 1 NOT_READY
//   PING(13)    u32 nonce             -> u32 the same nonce
// Waits are CHECK (or ADD 0) polls, so no request is ever left parked in the server when a rank
// gives up. Every request is held to the rendezvous's deadline (rdzv_store.h).
//
// Runs: the agent's store lives as long as torchrun, across worker restarts and across several
// shardload runs in one worker. The key prefix (core/src/context.c) tells restarts apart
// (TORCHELASTIC_RESTART_COUNT); runs within one worker are told apart here: claiming rank R
// adds 1 to a per-rank counter under the prefix, and the value N is the run number (every rank
// runs shardload the same number of times, so they agree on it). Run N's keys live under
// "<prefix>/run<N>/". A rank claims run N > 1 only once its run N-1 left the store; a claim whose
// previous holder is still connected is a second process started as rank R.
//
// Trust: torch's store has no authentication (torch's own model): anyone who can reach
// MASTER_PORT can read and write every key, ours included. See
// docs/DESIGN.md#threat-model.
#pragma once

#include <chrono>
#include <functional>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "rdzv_store.h"

namespace shardload {

// This rank's number is held by another live process of the same job (or the run was
// aborted because one was). what() is the whole user-facing message.
class C10dRankTaken : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class C10dStore : public RdzvStore {
 public:
  // Connects to HOST:PORT, retrying until TIMEOUT (the agent may still be starting), then
  // validates the connection the way torch's clients do and pings to make sure a c10d store
  // answers. TIMEOUT bounds every later request and wait; BOUND (RdzvStore::bound) holds
  // them, and the connecting, to the rendezvous's deadline. Throws StoreTimeout or
  // gloo::IoException naming HOST:PORT and what to check.
  C10dStore(const std::string &host, int port, std::chrono::milliseconds timeout, Clock::time_point bound);
  ~C10dStore() override;
  C10dStore(const C10dStore &) = delete;
  C10dStore &operator=(const C10dStore &) = delete;

  // Claims RANK of the WORLD ranks of the job whose keys live under PREFIX, enters this run's
  // key space (see the head of the file) and waits, up to the timeout, until every rank has
  // claimed (a counter every rank ADDs to: one request per poll, whatever the world size).
  // Throws C10dRankTaken when another live process holds RANK (it then also aborts the ranks
  // of that run still in their rendezvous) or when this run was aborted so; StoreTimeout
  // naming the missing ranks (find_absent: a bounded report) at the timeout. Call once,
  // first. BETWEEN, when set, runs every half second of the wait and may throw to end it (the
  // lobby, lobby.h).
  void claim(const std::string &prefix, int rank, int world, const std::function<void()> &between = {});

  // From here on keys are in this run's key space once claimed.
  void set(const std::string &key, const std::vector<char> &data) override;
  // Waits (up to the store's timeout) for the key, as Gloo's own stores do.
  std::vector<char> get(const std::string &key) override;
  // Polls until every key is present. Throws StoreTimeout at the timeout (Gloo's convention:
  // zero means the store's own), C10dRankTaken when the run was aborted.
  void wait(const std::vector<std::string> &keys) override;
  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &timeout) override;
  bool check(const std::vector<std::string> &keys) override;
  int64_t add(const std::string &key, int64_t delta) override;

 private:
  int64_t add_raw(const std::string &key, int64_t delta, Clock::time_point deadline);
  std::string scoped(const std::string &key) const { return space_ + key; }
  bool check_raw(const std::vector<std::string> &keys, Clock::time_point deadline);
  std::string get_raw(const std::string &key, uint64_t max, Clock::time_point deadline);
  // Throws C10dRankTaken when this run was aborted (its abort key is set).
  void check_abort(Clock::time_point deadline);
  void send_all(const std::string &msg, Clock::time_point deadline);
  void recv_exact(void *buf, size_t n, Clock::time_point deadline);
  [[noreturn]] void lose(const std::string &why, bool silent = false);

  int fd_ = -1;
  std::string where_; // "HOST:PORT", for messages
  std::chrono::milliseconds timeout_;
  std::string space_;     // "<prefix>/run<N>/" once claimed
  std::string abort_key_; // present once the run was aborted; holds the reason
  std::string left_key_;  // set when this rank leaves the store
  int world_ = 1;         // the job's, once claimed: it sets how often the waits poll
  const char *doing_ = ""; // what failed requests were part of, for messages
  Clock::time_point sent_at_; // when the request being answered was sent, for messages
};

} // namespace shardload
