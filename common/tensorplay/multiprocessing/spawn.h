// tp::multiprocessing::spawn: run fn(rank, args...) in nprocs forked processes.
//
// Contract:
//   - The parent forks nprocs children before any of them starts a thread;
//     each child limits OpenBLAS to SpawnOptions::blas_threads (ranks share
//     the cores), runs fn(rank, args...) and exits. The parent joins them all.
//   - What fn returns comes back to the parent through a pipe, one value per
//     rank in rank order; this is how ranks report losses and parameters to a
//     checker:
//       void or std::string (or anything a std::string can be made from):
//         spawn returns std::vector<std::string> (empty strings for void);
//       an arithmetic type T (double, float, int64_t, bool, ...): spawn returns
//         std::vector<T>, bit for bit what each rank returned (-0.0,
//         infinities, subnormals and NaNs included). Not long double.
//   - If any rank throws, is killed by a signal or exits non-zero, the parent
//     gives the others a short window to fail on their own, ends those still
//     running (SIGTERM, then SIGKILL after a grace period) and throws
//     SpawnError naming the rank to blame and its failure, e.g.
//     "tp::multiprocessing::spawn: rank 2 failed: tp::TimeoutError: allreduce
//     #3 on rank 2 timed out ...". The rank to blame is chosen by the failure's
//     tp::ErrorKind, then by its time, never by message text: see Note [Which
//     rank failed first] in spawn.cc.
//     When the blamed failure is a timeout (a collective that timed out), the
//     message also says where every other rank was: waiting in which
//     collective, outside any (and its last), stopped (SIGSTOP), or returned.
//   - If no rank makes progress for SpawnOptions::timeout (a rank starting or
//     finishing a wait in a collective, or ending), every rank is killed and
//     SpawnError (rank -1, kind Timeout, hang() saying whether any rank was
//     in a collective) says which ranks were still running
//     and what each was doing (set_rank_waiting, which each rank calls around
//     every collective wait through the wait listener spawn sets in it:
//     set_wait_listener in distributed/work.h). A job that keeps making
//     progress runs as long as it needs.
//   - SIGINT, SIGTERM or SIGHUP to the parent while spawn runs (Ctrl-C, kill):
//     the ranks are killed, the process's TempDirs removed, and the signal
//     re-raised, so the process ends by it (see Note [Interrupted jobs]).
//   - Must be called from a process with no other threads running that fork
//     could break (the test binaries and harnesses only start threads inside
//     the children). Not reentrant from inside a child.
#pragma once

#include <bit>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensorplay/error.h"

namespace tp::multiprocessing {

struct SpawnOptions {
  // Longest time without progress (see the contract above): a job where no
  // rank makes progress for this long is a hang, and becomes a SpawnError.
  std::chrono::milliseconds timeout{120000};
  // OpenBLAS threads per rank.
  int blas_threads = 1;
  // How long a rank gets between SIGTERM and SIGKILL when the job is ended.
  // After the first failure the other ranks also get min(kill_grace, 500 ms)
  // to fail on their own and report, before any is signalled.
  std::chrono::milliseconds kill_grace{2000};
};

// Where the ranks were when a job made no progress, read from the status
// board; a report's likely cause must follow from it (a job where no rank
// was in a collective is not one where a rank waits for another).
enum class Hang {
  kNone,                // not a job without progress: a rank failed
  kRankStopped,         // a rank was stopped (SIGSTOP)
  kNoneInCollective,    // every running rank was outside collectives
  kSomeInCollective,    // some ranks waited in a collective, the others were
                        // outside any or had finished
  kAllInCollective,     // every rank was running and waited in a collective
};

class SpawnError : public DistributedError {
 public:
  // rank: the rank blamed for the failure, or -1 for a job without progress.
  // kind: the blamed failure's kind: the kind of the tp::Error that rank threw
  // (Cause for any other exception), Cause for a rank killed by a signal or
  // exiting on its own, Timeout for a job without progress.
  // hang: for a job without progress, where its ranks were; else kNone.
  SpawnError(int rank, const std::string& message, ErrorKind kind = ErrorKind::Cause,
             Hang hang = Hang::kNone)
      : DistributedError(message, kind), rank_(rank), hang_(hang) {}
  int rank() const { return rank_; }
  Hang hang() const { return hang_; }

 private:
  int rank_;
  Hang hang_;
};

// One child's body: returns its result string or throws.
using RankFn = std::function<std::string(int rank)>;

// The non-template core of spawn().
std::vector<std::string> spawn_processes(const RankFn& fn, int nprocs,
                                         const SpawnOptions& options);

// Inside a spawned rank: this rank now waits in `collective` (for example
// "allreduce #7"), which carries `shape` ("1733 float32", or ""); an empty
// string: it no longer waits (the collective becomes its last). Shown when a
// job hangs or a collective times out, and counted as progress. A no-op
// outside a spawned rank.
void set_rank_waiting(std::string_view collective, std::string_view shape = "");
// Inside a spawned rank: its rank; -1 outside spawn.
int current_rank();

// How an arithmetic result travels through the pipe: as text that names the
// value exactly.
namespace result_text {

// The unsigned integer as wide as the floating-point type T: a float or a
// double travels as its bit pattern, so every value, NaN payloads included,
// comes back bit for bit.
template <typename T>
using BitsOf = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;

// The text of an arithmetic value: an integer in decimal, bool as 0 or 1, a
// float or a double as its bits in hex (0.1 is "3fb999999999999a").
template <typename T>
std::string encode(T value) {
  static_assert(!std::is_floating_point_v<T> || std::is_same_v<T, float> ||
                    std::is_same_v<T, double>,
                "tp::multiprocessing::spawn: fn may return float or double, not long "
                "double; return a double");
  char buffer[32];  // 20 digits and a sign at most
  std::to_chars_result r;
  if constexpr (std::is_same_v<T, bool>) {
    r = std::to_chars(buffer, buffer + sizeof buffer, value ? 1 : 0);
  } else if constexpr (std::is_floating_point_v<T>) {
    r = std::to_chars(buffer, buffer + sizeof buffer, std::bit_cast<BitsOf<T>>(value), 16);
  } else {
    r = std::to_chars(buffer, buffer + sizeof buffer, value);
  }
  return std::string(buffer, r.ptr);
}

// The inverse of encode(); rank says whose payload it was, for the error.
template <typename T>
T decode(const std::string& text, int rank) {
  const char* first = text.data();
  const char* last = text.data() + text.size();
  const auto parsed = [&](std::from_chars_result r) {
    return r.ec == std::errc() && r.ptr == last && !text.empty();
  };
  if constexpr (std::is_same_v<T, bool>) {
    int bit = 0;
    if (parsed(std::from_chars(first, last, bit)) && (bit == 0 || bit == 1)) return bit == 1;
  } else if constexpr (std::is_floating_point_v<T>) {
    BitsOf<T> bits = 0;
    if (parsed(std::from_chars(first, last, bits, 16))) return std::bit_cast<T>(bits);
  } else {
    T value = 0;
    if (parsed(std::from_chars(first, last, value))) return value;
  }
  throw SpawnError(rank, "tp::multiprocessing::spawn: rank " + std::to_string(rank) +
                             " returned '" + text + "', which is not the text of a number; "
                             "this is a bug in spawn");
}

}  // namespace result_text

// Runs fn(rank, args...) on ranks 0 .. nprocs-1 and returns what each returned:
// std::vector<T> for an arithmetic T, else std::vector<std::string>.
template <typename Fn, typename... Args>
auto spawn(const SpawnOptions& options, Fn&& fn, int nprocs, Args&&... args) {
  using Result = std::remove_cvref_t<std::invoke_result_t<Fn&, int, Args&...>>;
  if constexpr (std::is_arithmetic_v<Result>) {
    RankFn body = [&](int rank) -> std::string {
      return result_text::encode<Result>(fn(rank, args...));
    };
    const std::vector<std::string> texts = spawn_processes(body, nprocs, options);
    std::vector<Result> values;
    values.reserve(texts.size());
    for (std::size_t rank = 0; rank < texts.size(); ++rank) {
      values.push_back(result_text::decode<Result>(texts[rank], static_cast<int>(rank)));
    }
    return values;
  } else {
    RankFn body = [&](int rank) -> std::string {
      if constexpr (std::is_void_v<Result>) {
        fn(rank, args...);
        return std::string();
      } else {
        return std::string(fn(rank, args...));
      }
    };
    return spawn_processes(body, nprocs, options);
  }
}

template <typename Fn, typename... Args>
auto spawn(Fn&& fn, int nprocs, Args&&... args) {
  return spawn(SpawnOptions{}, std::forward<Fn>(fn), nprocs, std::forward<Args>(args)...);
}

}  // namespace tp::multiprocessing
