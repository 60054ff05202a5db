// tp::distributed::Work: a done flag and an error, behind a mutex and a
// condition variable. The communication thread calls finish() once; any
// number of threads may wait().
#include "tensorplay/distributed/work.h"

#include <atomic>

#include "tensorplay/error.h"
#include "tensorplay/trace.h"

namespace tp::distributed {

namespace {

// The process's wait listener; null until someone sets one (spawn, in the
// ranks it forks). Atomic, because any thread may wait while it is set.
std::atomic<WaitListener> g_wait_listener{nullptr};

// How many futures' callbacks finish() is running on this thread (nested:
// a callback may finish nothing, but count rather than assume). A wait()
// there for an unfinished collective would block the thread that finishes
// collectives: Gloo's communication thread, NCCL's watchdog.
thread_local int t_running_future_callbacks = 0;

}  // namespace

bool running_future_callback() { return t_running_future_callbacks > 0; }

void set_wait_listener(WaitListener listener) {
  g_wait_listener.store(listener, std::memory_order_release);
}

void tell_wait_listener(const WaitedCollective& what, bool waiting) {
  if (const WaitListener listener = g_wait_listener.load(std::memory_order_acquire)) {
    listener(what, waiting);
  }
}

void Work::report_waiting(bool waiting) const {
  tell_wait_listener(WaitedCollective{collective_, seq_, rank_, shape_}, waiting);
}

void Work::wait() {
  // On the trace, a span "wait" on the waiting thread: checkers see where a
  // stage blocks ("every bucket is launched before the first wait").
  trace::Span span("wait", "comm", {{"seq", static_cast<int64_t>(seq_)}});
  std::function<void()> hook;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!done_ && t_running_future_callbacks > 0) {
      TP_THROW(DistributedError, "tp::distributed::Work::wait: ", collective_, " #", seq_,
               " on rank ", rank_, " is waited for inside a future's callback, which runs on "
               "the thread that finishes collectives: the collective would never finish. "
               "Chain the work that needs it with get_future()->then(...) instead of waiting");
    }
    report_waiting(true);
    done_cv_.wait(lock, [this] { return done_; });
    report_waiting(false);
    run_first_wait_check();
    if (error_) std::rethrow_exception(error_);
    hook = on_wait_;
  }
  if (hook) hook();
}

void Work::set_on_wait(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_wait_ = std::move(hook);
}

std::exception_ptr Work::error_if_finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ ? error_ : nullptr;
}

void Work::set_on_first_wait(std::function<void()> check) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_first_wait_ = std::move(check);
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void Work::run_first_wait_check() {
  if (!on_first_wait_ || error_) return;
  // Under the lock, so that no other waiter returns before the check has
  // run (in checker mode it also delivers the result into the tensor).
  const std::function<void()> check = std::move(on_first_wait_);
  on_first_wait_ = nullptr;
  try {
    check();
  } catch (...) {
    error_ = std::current_exception();
  }
}

void Work::complete_future(const std::shared_ptr<Future>& future) {
  std::vector<Tensor> outputs;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    outputs = outputs_;
    error = error_;
  }
  ++t_running_future_callbacks;
  try {
    if (error) {
      future->set_error(error);
    } else {
      future->set_value(std::move(outputs));
    }
  } catch (...) {
    // The callbacks catch their own errors, and this future is completed
    // only here, once; nothing should reach this.
  }
  --t_running_future_callbacks;
}

std::shared_ptr<Future> Work::get_future() {
  std::shared_ptr<Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!has_outputs_) {
      TP_THROW(DistributedError, "tp::distributed::Work::get_future: ", collective_, " #", seq_,
               " on rank ", rank_, " has no future: its process group did not give it its "
               "output tensors. Futures complete on the host with CPU tensors, which "
               "ProcessGroupGloo's collectives on CPU tensors provide; a CUDA tensor's result "
               "is ordered by CUDA streams, which tp::distributed::Future does not track "
               "(ProcessGroupNCCL, or Gloo's staged CUDA tensors). wait() for the work instead");
    }
    if (future_) return future_;
    future_ = std::make_shared<Future>();
    future_->add_collective(seq_, collective_, rank_, shape_);
    if (!done_) return future_;  // finish() completes it
    // Finished before anyone asked: the future's completion is the first
    // wait (Note [In-flight writes]), here on the calling thread.
    run_first_wait_check();
    future = future_;
  }
  complete_future(future);  // no callbacks yet: nothing runs
  return future;
}

void Work::set_outputs(std::vector<Tensor> outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  outputs_ = std::move(outputs);
  has_outputs_ = true;
}

void Work::finish(std::exception_ptr error) {
  std::shared_ptr<Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;  // finish() is called once; a second call is ignored
    error_ = std::move(error);
    done_ = true;
    if (future_) {
      // A future's callbacks read the result now, before anyone waited, so
      // its completion is the first wait (Note [In-flight writes]).
      run_first_wait_check();
      future = future_;
    }
  }
  done_cv_.notify_all();
  if (future) complete_future(future);  // runs the callbacks, on this thread
}

}  // namespace tp::distributed
