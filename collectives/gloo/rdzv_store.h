// What the rendezvous asks of a network store client beyond Gloo's Store interface: one
// deadline that every request keeps to, an atomic counter, a presence test that does not wait,
// and a timeout that says it is one. TcpStore (tcp_store.h) and C10dStore (c10d_store.h) are
// RdzvStores; Gloo's FileStore is not (gloo_connect.cc works around what it lacks).
//
// The deadline: Gloo's Store calls (set, get, wait) carry no deadline, and a store that gives
// each request a timeout of its own lets a slow server (or a hostile one on MASTER_PORT) hold
// the rendezvous for the timeout times the number of requests, which grows with the world
// size. So the rendezvous fixes one deadline at its start and bound()s its stores to it: from
// then on no request, wait or connection retry ends later; each gets what is left.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/rendezvous/store.h>

namespace shardload {

// The store did not answer in time, or a wait on it ran out: the rendezvous reports
// SL_ERR_TIMEOUT for it, whatever else its message says.
class StoreTimeout : public gloo::IoException {
 public:
  explicit StoreTimeout(const std::string &msg) : gloo::IoException(msg) {}
};

// A request is not started with less than this left before its deadline: it would most
// likely be cut off half answered, and a connection whose answer was cut off must be closed,
// which would leave the report of a timed-out rendezvous (who never arrived) no store to ask.
constexpr std::chrono::milliseconds kShortestRequest(20);

class RdzvStore : public gloo::rendezvous::Store {
 public:
  using Clock = std::chrono::steady_clock;

  // Holds every later request, wait and retry to DEADLINE (Clock::time_point::max(): no
  // bound but each request's own timeout). Not thread-safe: call between requests.
  void bound(Clock::time_point deadline) { bound_ = deadline; }
  Clock::time_point bounded() const { return bound_; }

  // Whether every key is present now (one request).
  virtual bool check(const std::vector<std::string> &keys) = 0;
  // Adds DELTA to the integer at KEY (0 when absent) and returns the sum (one request; DELTA
  // 0 reads it). KEY is scoped like every other key (C10dStore: inside its run's key space,
  // so a restarted run counts afresh).
  virtual int64_t add(const std::string &key, int64_t delta) = 0;

 protected:
  // When a request given TIMEOUT of its own must end: the earlier of that and the bound.
  Clock::time_point until(std::chrono::milliseconds timeout) const {
    Clock::time_point now = Clock::now();
    timeout = std::min(timeout, std::chrono::milliseconds(86400000)); // no overflow below
    return bound_ - now < timeout ? bound_ : now + timeout;
  }
  // Whether a request due by DEADLINE should not be started (kShortestRequest).
  static bool too_late(Clock::time_point deadline) { return deadline - Clock::now() < kShortestRequest; }

 private:
  Clock::time_point bound_ = Clock::time_point::max();
};

// How long the report of a timed-out rendezvous (who never arrived) may take past the
// rendezvous's deadline: a little, never a second timeout, even on a stuck store.
inline std::chrono::milliseconds report_grace(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 4, std::chrono::milliseconds(50), std::chrono::milliseconds(2000));
}

// ---- who never arrived ----------------------------------------------------------------------
// A wait for WORLD ranks timed out. The report costs a bounded number of requests whatever
// the world size: one for the count (a counter every rank ADDs to when it arrives), then
// presence probes of single ranks, lowest first, until the lowest kAbsentShown absent ones
// are named or kAbsentProbes were asked.
constexpr int kAbsentShown = 8;
constexpr int kAbsentProbes = 64;

struct Absent {
  int count = -1;         // how many never arrived; -1: unknown
  std::vector<int> first; // the lowest of them, in order (at most kAbsentShown)
  int probed = 0;         // ranks 0 .. probed-1 were probed
};

// ARRIVED: how many ranks arrived (one request; null: the store keeps no counter, and then
// every rank is probed, for the count). HAS(r): whether rank r arrived; it may throw (the
// store cannot tell), which ends the probes. Nothing is asked after DEADLINE.
Absent find_absent(int world, const std::function<int64_t()> &arrived, const std::function<bool(int)> &has,
                   RdzvStore::Clock::time_point deadline);
// "rank 3", "ranks 1, 2, 4 and 5 more", "12 of the 4096 ranks (among them 3, 7; ranks from 64
// on were not checked)"; "" when nobody is known to be absent.
std::string absent_text(const Absent &a, int world);

} // namespace shardload
