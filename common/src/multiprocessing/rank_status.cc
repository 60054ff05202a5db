// A rank's status (rank_status.h): written by the rank, read by its parent.
#include "rank_status.h"

#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <utility>

namespace tp::multiprocessing::rank_status {

namespace {

std::string_view field_view(const char* field, std::size_t size) {
  return std::string_view(field, ::strnlen(field, size - 1));
}

std::string read_field(const char* field, std::size_t size) {
  return std::string(field_view(field, size));
}

}  // namespace

void set_waiting(RankStatus& status, std::string_view collective) {
  // No allocation: the wait listener calls this on any waiting thread.
  if (collective.empty()) copy_into(status.last, field_view(status.waiting, sizeof status.waiting));
  copy_into(status.waiting, collective);
  status.progress.fetch_add(1, std::memory_order_relaxed);
}

std::string last_collective(const RankStatus& status) {
  return read_field(status.last, sizeof status.last);
}

std::string describe(const RankStatus& status, pid_t pid) {
  const std::string waiting = read_field(status.waiting, sizeof status.waiting);
  const std::string last = last_collective(status);
  std::string text;
  if (!waiting.empty()) {
    text = "waiting in " + waiting;
  } else {
    text = "not in a collective";
    text += last.empty() ? " (none finished yet)" : " (last: " + last + ")";
  }
  if (pid > 0) {
    const char state = process_state(pid);
    if (state == 'T' || state == 't') {
      text = std::string("stopped (") + (state == 'T' ? "SIGSTOP" : "a debugger") + "), " + text;
    }
  }
  return text;
}

std::string different_collectives(const std::vector<std::string>& lasts) {
  // number -> (name, rank) of each rank whose last collective had that number
  std::map<std::string, std::vector<std::pair<std::string, int>>> by_number;
  for (int rank = 0; rank < static_cast<int>(lasts.size()); ++rank) {
    const std::string& last = lasts[rank];
    const std::size_t hash = last.find(" #");
    // A subgroup's collective ("... (group rank 1)") counts in its own group.
    if (hash == std::string::npos || last.find('(') != std::string::npos) continue;
    by_number[last.substr(hash + 1)].emplace_back(last.substr(0, hash), rank);
  }
  for (const auto& [number, calls] : by_number) {
    bool differ = false;
    for (const auto& call : calls) differ = differ || call.first != calls.front().first;
    if (!differ) continue;
    std::string list;
    for (const auto& [name, rank] : calls) {
      list += (list.empty() ? "" : ", ") + name + " on rank " + std::to_string(rank);
    }
    return "\n  the ranks issued different collectives as " + number + ": " + list +
           "; every rank must issue the same collectives in the same order";
  }
  return "";
}

namespace {

bool starts_with(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

// "ranks 0 and 2", "ranks 0, 2 and 3" (two or more).
std::string rank_names(const std::vector<int>& ranks) {
  std::string out = "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  }
  return out;
}

// The one rank whose collective of some number differs from what at least
// two others issued under it, in words, or "".
std::string odd_collective(const std::vector<std::string>& issued) {
  std::map<std::string, std::map<std::string, std::vector<int>>> by_number;  // #N -> name -> ranks
  for (int rank = 0; rank < static_cast<int>(issued.size()); ++rank) {
    const std::string& last = issued[rank];
    const std::size_t hash = last.find(" #");
    if (hash == std::string::npos || last.find('(') != std::string::npos) continue;
    by_number[last.substr(hash + 1)][last.substr(0, hash)].push_back(rank);
  }
  for (const auto& [number, names] : by_number) {
    if (names.size() != 2) continue;
    auto odd = names.begin(), usual = std::next(odd);
    if (odd->second.size() > usual->second.size()) std::swap(odd, usual);
    if (odd->second.size() == 1 && usual->second.size() >= 2) {
      return "rank " + std::to_string(odd->second.front()) + " is the likely cause: it issued " +
             odd->first + " as " + number + " where " + rank_names(usual->second) + " issued " +
             usual->first;
    }
  }
  return "";
}

}  // namespace

std::string likely_cause(const std::vector<std::string>& statuses,
                         const std::vector<std::string>& issued, int blamed) {
  std::vector<int> stopped, outside, waiting;
  for (int rank = 0; rank < static_cast<int>(statuses.size()); ++rank) {
    if (rank == blamed) continue;
    const std::string& s = statuses[rank];
    if (starts_with(s, "stopped")) {
      stopped.push_back(rank);
    } else if (starts_with(s, "not in a collective") || starts_with(s, "had returned")) {
      outside.push_back(rank);
    } else if (starts_with(s, "waiting in") && s.find("(group rank") == std::string::npos) {
      waiting.push_back(rank);  // a subgroup's wait is not a wait for `blamed`
    }
  }
  const std::string waited = " while rank " + std::to_string(blamed) + " waited";
  if (stopped.size() == 1) {
    return "rank " + std::to_string(stopped[0]) + " is the likely cause: it was " +
           statuses[stopped[0]] + "," + waited + " for it";
  }
  if (std::string odd = odd_collective(issued); !odd.empty()) return odd;
  const int others = static_cast<int>(statuses.size()) - 1;
  if (outside.size() == 1 && static_cast<int>(waiting.size()) == others - 1) {
    const std::string& s = statuses[outside[0]];
    return "rank " + std::to_string(outside[0]) + " is the likely cause: it " +
           (starts_with(s, "had returned") ? "" : "was ") + s + waited +
           " in a collective for it";
  }
  return "";
}

std::string cause_named_in(const std::string& message) {
  static const std::regex named(R"(rank \d+ is the likely cause: [^\n]*?(?=\. |\n|$))");
  std::smatch found;
  return std::regex_search(message, found, named) ? found.str() : std::string();
}

char process_state(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return '?';
  char buffer[512];
  const std::size_t n = std::fread(buffer, 1, sizeof buffer - 1, f);
  std::fclose(f);
  buffer[n] = '\0';
  // "pid (comm) S ...": comm may contain spaces and parentheses.
  const char* close = std::strrchr(buffer, ')');
  return (close != nullptr && close[1] == ' ' && close[2] != '\0') ? close[2] : '?';
}

}  // namespace tp::multiprocessing::rank_status
