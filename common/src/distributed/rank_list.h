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

}  // namespace tp::distributed::detail
