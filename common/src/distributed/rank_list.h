// "rank 2", "ranks 0, 1, 3" or "none": how rendezvous errors list ranks
// (who arrived, who is missing), the same in the file:// and the store
// rendezvous. Internal to the distributed sources.
#pragma once

#include <string>
#include <vector>

namespace tp::distributed::detail {

inline std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    out += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return out;
}

// "rank 1", "ranks 0 and 2", "ranks 0, 2 and 3": how a message names the
// ranks on one side of a disagreement (debug mode's fingerprints, the
// collective count check).
inline std::string rank_words(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  }
  return out;
}

}  // namespace tp::distributed::detail
