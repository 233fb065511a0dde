// The lobby: how a rank learns, while it waits at the rendezvous, that a peer it waits for
// was started for another job.
//
// Store keys live under a prefix unique to the job (the launcher's job id, the world size and
// a hash of the caller's job key: docs/DESIGN.md#rendezvous), so ranks of unrelated jobs never
// read each other's keys. The price: ranks of ONE job started with different job keys (another
// checkpoint path, plan or load options on one node) would never meet and would only time out.
// So every rank also leaves its job key under a prefix without the key (sl_collective_init
// .lobby), and a waiting rank reads the entries of the ranks it waits with: an entry holding
// another key means that rank will never arrive under ours, and the wait fails at once with
// the first difference between the two keys instead of after the whole timeout.
//
// An entry can be stale: an earlier run under the same launcher job id may have left it. How
// much an entry proves depends on the store:
//   tcp://   the store is rank 0's and lives for this job only: an entry is never stale.
//   c10d://  torch's store outlives runs within one torchrun job; a rank's next run replaces
//            its entry: a foreign entry must persist for a grace period before it counts.
//   file://  a FileStore never replaces a key: an entry may be any earlier job's. It never
//            fails a wait; it only explains a timeout.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace shardload {

// A rank of this rendezvous runs under another job key; the message names it and the first
// difference.
class LobbyMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Lobby {
 public:
  enum class Trust { kAtOnce, kAfterGrace, kHintOnly };

  // STORE: the store without any job prefix (the lobby keys are absolute); HAS: whether keys
  // are present there, without waiting. PREFIX "" disables the lobby (a caller that passed
  // none). JOB_KEY: this rank's job key ("" for none).
  Lobby(gloo::rendezvous::Store *store, std::function<bool(const std::vector<std::string> &)> has,
        std::string prefix, std::string job_key, int rank, int world, Trust trust,
        std::chrono::milliseconds grace);

  // Leaves this rank's job key. Best effort: a store that refuses (a FileStore holding an
  // earlier job's entry) costs only the diagnosis.
  void enter();
  // Reads the entries of a few ranks this one waits with (rank 0's, on the other ranks; a
  // rotating window of others on rank 0). Throws LobbyMismatch when one has held another job
  // key for long enough (see the head of the file).
  void check();
  // For a timeout message: "" or " (rank R ... under another job key: ...)".
  std::string hint() const;

 private:
  bool read(int r, std::string *value);
  std::string difference(int r, const std::string &theirs) const;

  gloo::rendezvous::Store *store_;
  std::function<bool(const std::vector<std::string> &)> has_;
  std::string prefix_, key_;
  int rank_, world_;
  Trust trust_;
  std::chrono::milliseconds grace_;
  int next_ = 1; // rank 0's rotating window
  std::map<int, std::chrono::steady_clock::time_point> foreign_since_;
  std::string hint_;
};

} // namespace shardload
