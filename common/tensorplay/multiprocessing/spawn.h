// tp::multiprocessing::spawn: run fn(rank, args...) in nprocs forked processes.
//
// Contract:
//   - The parent forks nprocs children before any of them starts a thread;
//     each child limits OpenBLAS to SpawnOptions::blas_threads (ranks share
//     the cores), runs fn(rank, args...) and exits. The parent joins them all.
//   - fn may return void or std::string; spawn returns one string per rank
//     (empty for void), carried back through a pipe: this is how ranks report
//     losses and parameters to a checker.
//   - If any rank throws, is killed by a signal or exits non-zero, the parent
//     ends the other ranks (SIGTERM, then SIGKILL after a grace period) and
//     throws SpawnError naming the first failed rank and its message, e.g.
//     "rank 2 failed: tp::TimeoutError: allreduce #3 on rank 2 timed out ...".
//   - If the whole job runs past SpawnOptions::timeout, every rank is killed
//     and SpawnError says which ranks were still running and what each was
//     doing (set_rank_status, which the process group calls around every
//     collective wait).
//   - Must be called from a process with no other threads running that fork
//     could break (the test binaries and harnesses only start threads inside
//     the children). Not reentrant from inside a child.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensorplay/error.h"

namespace tp::multiprocessing {

struct SpawnOptions {
  // Whole-job deadline: a hang anywhere becomes a SpawnError after this long.
  std::chrono::milliseconds timeout{120000};
  // OpenBLAS threads per rank.
  int blas_threads = 1;
  // How long a rank gets between SIGTERM and SIGKILL when the job is ended.
  std::chrono::milliseconds kill_grace{2000};
};

class SpawnError : public DistributedError {
 public:
  // rank is the first rank that failed, or -1 for a whole-job timeout.
  SpawnError(int rank, const std::string& message)
      : DistributedError(message), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

// One child's body: returns its result string or throws.
using RankFn = std::function<std::string(int rank)>;

// The non-template core of spawn().
std::vector<std::string> spawn_processes(const RankFn& fn, int nprocs,
                                         const SpawnOptions& options);

// Inside a spawned rank: records what this rank is doing now (for example
// "waiting in allreduce #7"), shown if the job times out. A no-op outside.
void set_rank_status(std::string_view status);
// Inside a spawned rank: its rank; -1 outside spawn.
int current_rank();

template <typename Fn, typename... Args>
std::vector<std::string> spawn(const SpawnOptions& options, Fn&& fn, int nprocs,
                               Args&&... args) {
  RankFn body = [&](int rank) -> std::string {
    if constexpr (std::is_void_v<std::invoke_result_t<Fn&, int, Args&...>>) {
      fn(rank, args...);
      return std::string();
    } else {
      return std::string(fn(rank, args...));
    }
  };
  return spawn_processes(body, nprocs, options);
}

template <typename Fn, typename... Args>
std::vector<std::string> spawn(Fn&& fn, int nprocs, Args&&... args) {
  return spawn(SpawnOptions{}, std::forward<Fn>(fn), nprocs,
               std::forward<Args>(args)...);
}

}  // namespace tp::multiprocessing
