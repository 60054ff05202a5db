// tp::distributed::Future: a value that arrives later, and what to do with
// it then: the kit's torch.futures.Future, as DDP communication hooks use it
// (hook(state, bucket) -> Future; fut.then(divide by the world size)).
//
// Contract:
//   - The value is a std::vector<Tensor>, as in PyTorch's futures of a
//     collective (fut.value()[0] is the all-reduced tensor): one type fits
//     every collective (an all-gather has one output per rank, a barrier
//     none) and every hook's chained result, so then() needs no template.
//     Tensors are handles: the value shares their storage, and an in-place
//     op on value()[0] writes the collective's output.
//   - A future completes once: with a value (set_value) or with an error
//     (set_error). Completing it again throws tp::DistributedError naming
//     how it was completed; PyTorch refuses the same ("a Future can only be
//     marked completed once").
//   - wait() blocks until the future completed, then returns the value or
//     rethrows the error. value() does not wait: REQUIRES is_completed()
//     (otherwise tp::DistributedError), as PyTorch's value(), which is meant
//     for after wait() and inside a then() callback; it rethrows the error too.
//   - then(callback) returns a new future, completed with what the callback
//     returns, or failed with what it throws; the callback receives this
//     future, so `parent.value()` rethrows a failure of the parent and the
//     failure reaches the end of a chain. Callbacks added before this
//     future completed run on the thread that completes it, in the order
//     added, after wait() has been released; for a collective's future
//     (Work::get_future) that is the process group's communication thread.
//     A callback added to a completed future runs at once, on the calling
//     thread, before then() returns.
//   - A callback runs on a thread that completes other work (the Gloo
//     group's communication thread runs every later collective), so it
//     should be short, and must not wait for a collective: Work::wait()
//     refuses that with an error, since the collective would never run.
//     Chain with then() instead.
//   - The trace: a collective's future (Work::get_future) knows its
//     collective's sequence number, and a future chained with then() those
//     of its parent. wait() records a span "wait" (category "comm", arg
//     seq) for each, as Work::wait does, so a checker sees that the
//     collectives behind a future were waited for (a DDP that waits for a
//     comm hook's future waits for the hook's all-reduce).
//   - Thread safety: every method may be called from any thread; one mutex
//     guards the state, and no callback runs under it.
//   - Lifetime: used through std::shared_ptr (then() returns one). A future
//     keeps its pending callbacks, and so the futures then() made, alive
//     until it completes; a chained future does not keep its parent alive
//     (a Work keeps its own future). A future destroyed before it completed
//     fails the futures chained to it, with a tp::DistributedError saying
//     so, rather than leaving their wait() to hang. The value lives as long
//     as the future.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorplay/tensor.h"

namespace tp::distributed {

class Future {
 public:
  using Value = std::vector<Tensor>;
  // Receives the completed parent future; returns the chained one's value.
  using Callback = std::function<Value(Future& parent)>;

  Future() = default;
  // Fails the futures chained to this one if it never completed.
  ~Future();
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;

  // Completes the future with `value` and runs its callbacks on this thread.
  // REQUIRES: not completed yet (otherwise tp::DistributedError).
  void set_value(Value value);
  // Completes the future with `error`, which wait() and value() rethrow,
  // and runs its callbacks on this thread. REQUIRES: not completed yet,
  // error not null (otherwise tp::DistributedError).
  void set_error(std::exception_ptr error);

  // Never blocks.
  bool is_completed() const;
  // True once completed with an error. Never blocks.
  bool has_error() const;

  // Blocks until completed; returns the value or rethrows the error.
  // Records the trace's "wait" spans (see the contract).
  Value wait() const;
  // Blocks until completed or `timeout` has passed; true if completed. A
  // waiter that must not hang forever (a DDP waiting for a comm hook's
  // future, which nothing may ever complete) asks this first, then wait().
  bool wait_for(std::chrono::milliseconds timeout) const;
  // The value, without waiting; rethrows the error.
  // REQUIRES: is_completed() (otherwise tp::DistributedError).
  Value value() const;

  // A future completed with callback(*this) once this one completed (with a
  // value or an error), or failed with what the callback throws. See the
  // contract for the thread it runs on.
  std::shared_ptr<Future> then(Callback callback);

  // A collective whose completion this future follows (see the contract):
  // its sequence number, name, the rank's rank in its group and what it
  // carries (Work::shape); set by Work::get_future, inherited by then(). A
  // wait reports the last one to the wait listener (work.h), as Work::wait
  // reports its own.
  void add_collective(uint64_t seq, const std::string& collective, int rank,
                      const std::string& shape = "");

 private:
  // Completes with a value or an error; false, doing nothing, if already
  // completed. Runs the callbacks after releasing the lock.
  bool complete(Value value, std::exception_ptr error);

  mutable std::mutex mutex_;
  mutable std::condition_variable done_cv_;
  bool completed_ = false;                           // guarded by mutex_
  Value value_;                                      // guarded by mutex_; constant once completed
  std::exception_ptr error_;                         // guarded by mutex_; constant once completed
  struct Pending {
    std::function<void()> run;      // calls the callback, completes `chained`
    std::shared_ptr<Future> chained;  // what then() returned
  };
  std::vector<Pending> callbacks_;  // guarded by mutex_; emptied at completion
  struct Followed {
    uint64_t seq;
    std::string collective;
    int rank;
    std::string shape;
  };
  std::vector<Followed> collectives_;  // guarded by mutex_; see add_collective
  // Tells the wait listener (work.h) a wait for `followed` begins or ends.
  static void report(const Followed& followed, bool waiting);
};

}  // namespace tp::distributed
