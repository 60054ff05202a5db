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

void set_waiting(RankStatus& status, std::string_view collective, std::string_view shape) {
  // No allocation: the wait listener calls this on any waiting thread.
  if (collective.empty()) {
    copy_into(status.last, field_view(status.waiting, sizeof status.waiting));
    copy_into(status.last_shape, field_view(status.waiting_shape, sizeof status.waiting_shape));
  }
  copy_into(status.waiting_shape, shape);
  copy_into(status.waiting, collective);
  status.progress.fetch_add(1, std::memory_order_relaxed);
}

std::string last_collective(const RankStatus& status) {
  return read_field(status.last, sizeof status.last);
}

std::string last_shape(const RankStatus& status) {
  return read_field(status.last_shape, sizeof status.last_shape);
}

std::string waiting_shape(const RankStatus& status) {
  return read_field(status.waiting_shape, sizeof status.waiting_shape);
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

namespace {

// The ranks' collectives under each number ("#2"): what each rank issued
// there, with its rank. What is the name ("allreduce"), or, where every
// rank under that number issued the same name but not the same size, the
// name and the size ("allreduce of 4 float32"). A subgroup's collective
// ("... (group rank 1)") counts in its own group: left out.
std::map<std::string, std::vector<std::pair<std::string, int>>> calls_by_number(
    const std::vector<std::string>& issued, const std::vector<std::string>& shapes) {
  struct Call {
    std::string name, shape;
    int rank;
  };
  std::map<std::string, std::vector<Call>> by_number;
  for (int rank = 0; rank < static_cast<int>(issued.size()); ++rank) {
    const std::string& text = issued[rank];
    const std::size_t hash = text.find(" #");
    if (hash == std::string::npos || text.find('(') != std::string::npos) continue;
    const std::string shape = rank < static_cast<int>(shapes.size()) ? shapes[rank] : "";
    by_number[text.substr(hash + 1)].push_back({text.substr(0, hash), shape, rank});
  }
  std::map<std::string, std::vector<std::pair<std::string, int>>> out;
  for (const auto& [number, calls] : by_number) {
    bool same_name = true, same_shape = true, shapes_known = true;
    for (const Call& c : calls) {
      same_name = same_name && c.name == calls.front().name;
      same_shape = same_shape && c.shape == calls.front().shape;
      shapes_known = shapes_known && !c.shape.empty();
    }
    const bool by_size = same_name && !same_shape && shapes_known;
    for (const Call& c : calls) {
      out[number].emplace_back(by_size ? c.name + " of " + c.shape : c.name, c.rank);
    }
  }
  return out;
}

}  // namespace

std::string different_collectives(const std::vector<std::string>& lasts,
                                  const std::vector<std::string>& shapes) {
  for (const auto& [number, calls] : calls_by_number(lasts, shapes)) {
    bool differ = false;
    for (const auto& call : calls) differ = differ || call.first != calls.front().first;
    if (!differ) continue;
    std::string list;
    for (const auto& [what, rank] : calls) {
      list += (list.empty() ? "" : ", ") + what + " on rank " + std::to_string(rank);
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
// two others issued under it (in name, or only in size), in words, or "".
std::string odd_collective(const std::vector<std::string>& issued,
                           const std::vector<std::string>& shapes) {
  for (const auto& [number, calls] : calls_by_number(issued, shapes)) {
    std::map<std::string, std::vector<int>> ranks_by_what;
    for (const auto& [what, rank] : calls) ranks_by_what[what].push_back(rank);
    if (ranks_by_what.size() != 2) continue;
    auto odd = ranks_by_what.begin(), usual = std::next(odd);
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
                         const std::vector<std::string>& issued,
                         const std::vector<std::string>& shapes, int blamed) {
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
  if (std::string odd = odd_collective(issued, shapes); !odd.empty()) return odd;
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
