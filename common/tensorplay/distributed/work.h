// tp::distributed::Work: the handle of one queued collective.
//
// Contract:
//   - A ProcessGroup returns a Work for every collective it queues. The work
//     completes on the group's communication thread; wait() blocks the caller
//     until it has, then rethrows the collective's error if it failed (a
//     tp::TimeoutError or tp::PeerFailedError names the collective, its
//     sequence number and the rank). The error is made on the communication
//     thread when the collective fails, so its time_ns() is that moment, not
//     the later wait().
//   - wait() may be called many times and from any thread; is_completed()
//     never blocks. With tp::trace enabled, each wait() records a span
//     "wait" (category "comm", arg seq) on the calling thread.
//   - Output tensors may be read only after wait() returns.
//   - A process group may attach a check to run at the first wait() (checker
//     mode: Note [In-flight writes] in process_group_gloo.cc); what it throws,
//     that wait() and every later one rethrow.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

namespace tp::distributed {

class Work {
 public:
  Work(std::string collective, uint64_t seq, int rank)
      : collective_(std::move(collective)), seq_(seq), rank_(rank) {}

  // Blocks until the collective finished; rethrows its error.
  void wait();
  bool is_completed() const;
  // "allreduce", "broadcast", "allgather" or "barrier".
  const std::string& collective() const { return collective_; }
  // 1-based position of this collective in the group's issue order.
  uint64_t seq() const { return seq_; }

  // Called once by the communication thread.
  void finish(std::exception_ptr error = nullptr);

  // Runs `check` once, in the first wait() that finds the collective finished
  // without error, on the waiting thread, before that wait() returns; other
  // waiters block until it is done. Set by the process group right after it
  // queues the collective, before the Work is handed to the caller.
  void set_on_first_wait(std::function<void()> check);

 private:
  const std::string collective_;
  const uint64_t seq_;
  const int rank_;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;              // guarded by mutex_
  std::exception_ptr error_;       // guarded by mutex_; also what on_first_wait_ threw
  std::function<void()> on_first_wait_;  // guarded by mutex_; cleared by the wait() that runs it
};

}  // namespace tp::distributed
