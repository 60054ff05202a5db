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
//   - Output tensors may be read only after wait() returns; a CUDA tensor
//     by work queued after it on the waiting thread's current stream (the
//     host: after synchronising that stream, as cpu() does).
//   - A process group may attach a check to run at the first wait() (checker
//     mode: Note [In-flight writes] in in_flight_writes.cc); what it throws,
//     that wait() and every later one rethrow. It may also attach a hook run
//     by every wait() that returns normally (set_on_wait): the Gloo group's
//     staged CUDA tensors make the caller's current CUDA stream wait there
//     for the copy back (Note [Staging CUDA tensors]).
//   - get_future() hands out a tp::distributed::Future (future.h) that
//     completes when the collective does, on the communication thread, with
//     its output tensors or its error; callbacks chained with then() run
//     there. Only works whose group gave them their outputs (set_outputs)
//     have one: ProcessGroupGloo's on CPU tensors. Others throw, saying why.
//     Completing the future counts as the first wait(): the first-wait check
//     runs then, on the communication thread, so a callback reads the
//     result (Note [In-flight writes]). Inside a future's callback, wait()
//     for a collective that has not finished throws instead of hanging.
//   - Every wait() tells the process's wait listener (set_wait_listener
//     below) when it starts and stops waiting, and so does a wait for the
//     work's future (Future::wait, wait_for: a comm hook's, say): spawn sets
//     one in each rank it forks, to show which collective a rank waits in
//     when a job hangs and to count each wait as progress. Without a
//     listener this costs nothing.
//   - wait() and is_completed() are virtual, for a group whose collectives
//     complete on a device rather than on a host thread: ProcessGroupNCCL's
//     work (process_group_nccl.h) returns from wait() once the caller's CUDA
//     stream is ordered after the collective, without blocking the host, and
//     rethrows the error only when it is already known. Everything said
//     above holds for the base class, which the Gloo group uses unchanged.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "tensorplay/distributed/future.h"
#include "tensorplay/tensor.h"

namespace tp::distributed {

class Work {
 public:
  Work(std::string collective, uint64_t seq, int rank, std::string shape = "")
      : collective_(std::move(collective)), seq_(seq), rank_(rank), shape_(std::move(shape)) {}
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the collective finished; rethrows its error.
  virtual void wait();
  virtual bool is_completed() const;
  // "allreduce", "broadcast", "allgather", "barrier", "reduce_scatter_tensor"
  // or "allgather_into_tensor".
  const std::string& collective() const { return collective_; }
  // 1-based position of this collective in the group's issue order.
  uint64_t seq() const { return seq_; }
  // The rank, in its group, of the process that issued the collective.
  int rank() const { return rank_; }
  // What it carries, where the group says: "1733 float32" (elements), "64
  // bytes" (broadcast, allgather); "" for a barrier or a group that does
  // not say. Shown where ranks' collectives of one number differ.
  const std::string& shape() const { return shape_; }

  // Called once by the communication thread; completes the future, if one
  // was handed out, and runs its callbacks on this thread.
  void finish(std::exception_ptr error = nullptr);

  // The future of this collective: completed with the tensors given to
  // set_outputs once it finished without error, or failed with its error
  // (the same that wait() throws). The same future on every call.
  // REQUIRES: the group gave this work its outputs (otherwise
  // tp::DistributedError naming the collective and why).
  std::shared_ptr<Future> get_future();
  // The tensors the future's value holds (the collective's outputs, in
  // place). Set by the process group before the Work is handed out, like
  // set_on_first_wait; a group that does not call it has no futures.
  void set_outputs(std::vector<Tensor> outputs);

  // Runs `check` once, in the first wait() that finds the collective finished
  // without error, on the waiting thread, before that wait() returns; other
  // waiters block until it is done. A future handed out runs it instead, as
  // it completes (see the contract). Set by the process group right after it
  // queues the collective, before the Work is handed to the caller.
  void set_on_first_wait(std::function<void()> check);
  // Runs `hook` in every wait() that returns normally, on the waiting
  // thread, after the first-wait check and outside the lock; what it throws,
  // that wait() throws. Set like set_on_first_wait, before the Work is handed
  // out; it is never changed afterwards.
  void set_on_wait(std::function<void()> hook);

 protected:
  // The collective's error if it finished with one; null while it runs and
  // once it succeeded. Never blocks.
  std::exception_ptr error_if_finished() const;
  // Tells the wait listener, if one is set, that a thread starts
  // (`waiting`) or stops waiting for this collective. A subclass whose
  // wait() does not block the host calls it too: each wait is progress.
  void report_waiting(bool waiting) const;

 private:
  const std::string collective_;
  const uint64_t seq_;
  const int rank_;
  const std::string shape_;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;              // guarded by mutex_
  std::exception_ptr error_;       // guarded by mutex_; also what on_first_wait_ threw
  std::function<void()> on_first_wait_;  // guarded by mutex_; cleared by the wait() that runs it
  std::function<void()> on_wait_;        // guarded by mutex_; set once, before hand-out
  bool has_outputs_ = false;             // guarded by mutex_; set once, before hand-out
  std::vector<Tensor> outputs_;          // guarded by mutex_; set once, before hand-out;
                                         // keeps their storage alive as long as the Work
  std::shared_ptr<Future> future_;       // guarded by mutex_; made by the first get_future()

  // Runs on_first_wait_ if it is armed and the work succeeded, recording
  // what it throws in error_. REQUIRES: mutex_ held, done_.
  void run_first_wait_check();
  // Completes `future` with outputs_ or error_ (read under the lock), outside it.
  void complete_future(const std::shared_ptr<Future>& future);
};

// Who wants to know about waits: called by Work::wait() on the waiting
// thread, with `waiting` true when the wait starts (even if the work is done
// already: each wait is progress) and false when it ends, under the Work's
// lock, so it must be quick and must not throw or wait on another Work; and
// by Future::wait/wait_for, outside any lock, except inside a future's
// callback. `what` (its string too) is valid only during the call.
// distributed/ calls out through this pointer instead of calling its
// watcher, so it depends on nothing above it (spawn's status board, say).
// What is waited for: the collective's name ("allreduce"), its sequence
// number, the waiting rank's rank in the collective's group and what it
// carries (Work::shape). A wait for a Future (a comm hook's) reports the
// last collective it follows.
struct WaitedCollective {
  const std::string& collective;
  uint64_t seq;
  int rank;
  const std::string& shape;
};
using WaitListener = void (*)(const WaitedCollective& what, bool waiting);
// Sets the process's wait listener; nullptr (the default) removes it.
// Thread-safe, but meant to be set once, before any collective: spawn sets
// it in each rank it forks, before the rank's function runs.
void set_wait_listener(WaitListener listener);
// Tells the wait listener, if one is set (Work::wait and Future::wait do).
void tell_wait_listener(const WaitedCollective& what, bool waiting);

// Whether this thread is running a future's callbacks (the thread that
// finishes collectives): a wait there is not the rank's (Future::wait).
bool running_future_callback();

}  // namespace tp::distributed
