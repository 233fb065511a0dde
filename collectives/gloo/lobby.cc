// The lobby: a waiting rank learns that a peer joined under another job key (lobby.h).
#include "lobby.h"

#include <algorithm>

namespace shardload {
namespace {

using Clock = std::chrono::steady_clock;

// A job key is only ever shown and compared: a few KiB say everything a person reads.
constexpr size_t kMaxKey = 4096;
// Entries rank 0 reads per check (the other ranks read rank 0's alone).
constexpr int kWindow = 8;

// The ';'-separated fields of a job key ("world 2; path '/ckpt'; ..."), as the command
// writes it; a key without ';' is one field.
std::vector<std::string> fields(const std::string &key) {
  std::vector<std::string> out;
  size_t a = 0;
  for (;;) {
    size_t b = key.find(';', a);
    std::string f = key.substr(a, b == std::string::npos ? std::string::npos : b - a);
    f.erase(0, f.find_first_not_of(' '));
    out.push_back(f);
    if (b == std::string::npos) return out;
    a = b + 1;
  }
}

std::string shown(const std::string &f) {
  if (f.empty()) return "(nothing)";
  return f.size() > 200 ? f.substr(0, 200) + "..." : f;
}

} // namespace

Lobby::Lobby(gloo::rendezvous::Store *store, std::function<bool(const std::vector<std::string> &)> has,
             std::string prefix, std::string job_key, int rank, int world, Trust trust,
             std::chrono::milliseconds grace)
    : store_(store), has_(std::move(has)), prefix_(std::move(prefix)), key_(std::move(job_key)), rank_(rank),
      world_(world), trust_(trust), grace_(grace) {
  if (key_.size() > kMaxKey) key_.resize(kMaxKey);
}

void Lobby::enter() {
  if (prefix_.empty()) return;
  try {
    store_->set(prefix_ + "sl_lobby/" + std::to_string(rank_), std::vector<char>(key_.begin(), key_.end()));
  } catch (...) {
  }
}

bool Lobby::read(int r, std::string *value) {
  std::string k = prefix_ + "sl_lobby/" + std::to_string(r);
  try {
    if (!has_({k})) return false;
    auto v = store_->get(k);
    value->assign(v.begin(), v.begin() + long(std::min(v.size(), kMaxKey)));
    return true;
  } catch (...) {
    return false; // the lobby is a diagnosis: a store that fails here fails the wait itself
  }
}

std::string Lobby::difference(int r, const std::string &theirs) const {
  std::vector<std::string> a = fields(key_), b = fields(theirs);
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) i++;
  std::string mine = i < a.size() ? a[i] : "", other = i < b.size() ? b[i] : "";
  return "rank " + std::to_string(r) + " joined this rendezvous under another job key: it has " + shown(other) +
         " where rank " + std::to_string(rank_) + " has " + shown(mine);
}

void Lobby::check() {
  if (prefix_.empty() || world_ < 2) return;
  std::vector<int> ranks;
  if (rank_ != 0) {
    ranks.push_back(0);
  } else {
    for (int i = 0; i < kWindow && i < world_ - 1; i++) {
      ranks.push_back(next_);
      next_ = next_ + 1 < world_ ? next_ + 1 : 1;
    }
  }
  Clock::time_point now = Clock::now();
  for (int r : ranks) {
    std::string theirs;
    if (!read(r, &theirs) || theirs == key_) {
      foreign_since_.erase(r);
      continue;
    }
    std::string why = difference(r, theirs);
    hint_ = why;
    auto seen = foreign_since_.emplace(r, now).first->second;
    if (trust_ == Trust::kAtOnce || (trust_ == Trust::kAfterGrace && now - seen >= grace_))
      throw LobbyMismatch(why + "; every rank of one job must be started with the same checkpoint path, plan and "
                                "load options, and unrelated jobs need their own rendezvous (MASTER_PORT, "
                                "file:// directory) or job id (SHARDLOAD_JOB_ID)");
  }
}

std::string Lobby::hint() const {
  if (hint_.empty()) return "";
  return " (" + hint_ + (trust_ == Trust::kHintOnly ? ", or an earlier job left that entry" : "") + ")";
}

} // namespace shardload
