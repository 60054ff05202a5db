// Store::wait: polling, shared by every store (see store.h).
#include "tensorplay/distributed/store.h"

#include <thread>

#include "tensorplay/error.h"

namespace tp::distributed {

std::vector<int64_t> Store::add_each(const std::vector<std::pair<std::string, int64_t>>& adds) {
  std::vector<int64_t> values;
  for (const auto& [key, delta] : adds) values.push_back(add(key, delta));
  return values;
}

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  while (!check(keys)) {
    if (std::chrono::steady_clock::now() - start >= timeout) {
      std::vector<std::string> missing;
      for (const std::string& key : keys) {
        if (!check({key})) missing.push_back(key);
      }
      std::string list;
      for (const std::string& key : missing) list += (list.empty() ? "'" : ", '") + key + "'";
      TP_THROW(TimeoutError, "tp::distributed::Store::wait: ", describe(), " still lacks ",
               list, " after ", timeout.count(), " ms");
    }
    // A rendezvous waits for a handful of keys once per job; 10 ms of
    // polling costs nothing next to connecting the ranks.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace tp::distributed
