// The rendezvous's report of the ranks that never arrived (rdzv_store.h).
#include "rdzv_store.h"

namespace shardload {

Absent find_absent(int world, const std::function<int64_t()> &arrived, const std::function<bool(int)> &has,
                   RdzvStore::Clock::time_point deadline) {
  Absent a;
  if (arrived) {
    try {
      int64_t n = arrived();
      if (n >= 0 && n <= world) a.count = world - int(n);
    } catch (...) { // the store cannot tell: the probes may still name some
    }
    if (a.count == 0) return a;
  }
  // With a count, a few probes name the lowest absent ranks; without one (a FileStore, whose
  // probes are local file tests) every rank is probed, so that the count is known too.
  int limit = arrived ? std::min(world, kAbsentProbes) : world, seen = 0;
  for (int r = 0; r < limit && RdzvStore::Clock::now() < deadline; r++) {
    if (a.count >= 0 && seen >= a.count) break;
    if (arrived && int(a.first.size()) >= kAbsentShown) break;
    bool here;
    try {
      here = has(r);
    } catch (...) {
      break;
    }
    a.probed = r + 1;
    if (here) continue;
    seen++;
    if (int(a.first.size()) < kAbsentShown) a.first.push_back(r);
  }
  // Probes of every rank are the truth: a rank may have set its key and failed before it
  // counted itself in.
  if (a.probed == world) a.count = seen;
  return a;
}

std::string absent_text(const Absent &a, int world) {
  if (a.count == 0 || (a.count < 0 && a.first.empty())) return "";
  std::string list;
  for (size_t i = 0; i < a.first.size(); i++) list += (i ? ", " : "") + std::to_string(a.first[i]);
  if (a.count > 0 && a.first.size() == size_t(std::min(a.count, kAbsentShown))) {
    // the lowest absent ranks, all of them or the first kAbsentShown
    std::string s = (a.count == 1 ? "rank " : "ranks ") + list;
    if (a.count > kAbsentShown) s += " and " + std::to_string(a.count - kAbsentShown) + " more";
    return s;
  }
  std::string unchecked = a.probed < world ? "ranks from " + std::to_string(a.probed) + " on were not checked" : "";
  if (a.count < 0) // the store did not say how many
    return (a.first.size() == 1 ? "rank " : "ranks ") + list + " (perhaps more" +
           (unchecked.empty() ? "" : ": " + unchecked) + ")";
  return std::to_string(a.count) + " of the " + std::to_string(world) + " ranks (" +
         (list.empty() ? "none below rank " + std::to_string(a.probed) : "among them " + list) +
         (unchecked.empty() ? "" : "; " + unchecked) + ")";
}

} // namespace shardload
