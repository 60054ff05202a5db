// tp::distributed::Future: a completed flag, a value or an error, and the
// callbacks waiting for them, behind one mutex. Callbacks are moved out
// under the lock and run outside it, so a callback may call anything on
// this future (value(), then()) without deadlocking.
#include "tensorplay/distributed/future.h"

#include <memory>
#include <optional>
#include <utility>

#include "tensorplay/distributed/work.h"
#include "tensorplay/error.h"
#include "tensorplay/trace.h"

namespace tp::distributed {

namespace {

// "with a value" or "with an error (<what>)", for the completing-twice error.
std::string how_completed(const std::exception_ptr& error) {
  if (!error) return "with a value";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return tp::detail::cat("with an error (", e.what(), ")");
  } catch (...) {
    return "with an error";
  }
}

}  // namespace

Future::~Future() {
  // No other thread can hold this future now; no lock needed.
  if (completed_) return;
  for (const Pending& pending : callbacks_) {
    pending.chained->complete(
        {}, std::make_exception_ptr(DistributedError(
                "tp::distributed::Future: the future this one was chained to with then() was "
                "destroyed before it completed, so the callback never ran; keep the parent "
                "future (or its Work) alive until it completes")));
  }
}

bool Future::complete(Value value, std::exception_ptr error) {
  std::vector<Pending> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return false;
    value_ = std::move(value);
    error_ = std::move(error);
    completed_ = true;
    callbacks.swap(callbacks_);
  }
  // Waiters first, then the callbacks, as PyTorch's markCompleted: wait()
  // may return before the chained futures are done.
  done_cv_.notify_all();
  for (const Pending& pending : callbacks) pending.run();  // each catches its own errors
  return true;
}

void Future::set_value(Value value) {
  if (!complete(std::move(value), nullptr)) {
    std::lock_guard<std::mutex> lock(mutex_);
    TP_THROW(DistributedError, "tp::distributed::Future::set_value: the future was already "
             "completed ", how_completed(error_), "; a future is completed once: make a new "
             "one for each result, or check is_completed() first");
  }
}

void Future::set_error(std::exception_ptr error) {
  if (!error) {
    TP_THROW(DistributedError, "tp::distributed::Future::set_error: the error is null; pass "
             "std::current_exception() in a catch block, or std::make_exception_ptr(e)");
  }
  if (!complete({}, std::move(error))) {
    std::lock_guard<std::mutex> lock(mutex_);
    TP_THROW(DistributedError, "tp::distributed::Future::set_error: the future was already "
             "completed ", how_completed(error_), "; a future is completed once: make a new "
             "one for each result, or check is_completed() first");
  }
}

bool Future::is_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool Future::has_error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && error_ != nullptr;
}

void Future::report(const Followed& followed, bool waiting) {
  tell_wait_listener(
      WaitedCollective{followed.collective, followed.seq, followed.rank, followed.shape}, waiting);
}

Future::Value Future::wait() const {
  std::vector<Followed> collectives;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    collectives = collectives_;
  }
  // The span of the last collective covers the blocking (it completes
  // last); the others', already over when it is, are marked as waited too.
  for (size_t i = 0; i + 1 < collectives.size(); ++i) {
    trace::Span span("wait", "comm", {{"seq", static_cast<int64_t>(collectives[i].seq)}});
  }
  std::unique_ptr<trace::Span> span;
  if (!collectives.empty()) {
    const auto seq = static_cast<int64_t>(collectives.back().seq);
    span = std::make_unique<trace::Span>("wait", "comm", std::initializer_list<trace::Arg>{{"seq", seq}});
  }
  // The rank's status shows the wait (a comm hook's future is waited for,
  // not its Work), as Work::wait shows its own; not from inside a future's
  // callback (the thread that finishes collectives), whose wait for a
  // completed parent is no wait of the rank's and would wipe its status.
  const bool reported = !collectives.empty() && !running_future_callback();
  if (reported) report(collectives.back(), true);
  Value value;
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return completed_; });
    value = value_;
    error = error_;
  }
  if (reported) report(collectives.back(), false);  // outside the lock: the contract's rule
  if (error) std::rethrow_exception(error);
  return value;
}

void Future::add_collective(uint64_t seq, const std::string& collective, int rank,
                            const std::string& shape) {
  std::lock_guard<std::mutex> lock(mutex_);
  collectives_.push_back(Followed{seq, collective, rank, shape});
}

bool Future::wait_for(std::chrono::milliseconds timeout) const {
  std::optional<Followed> last;  // what the rank's status shows it waits for (as in wait())
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!collectives_.empty() && !running_future_callback()) last = collectives_.back();
  }
  if (last) report(*last, true);
  bool completed = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    completed = done_cv_.wait_for(lock, timeout, [this] { return completed_; });
  }
  if (last) report(*last, false);
  return completed;
}

Future::Value Future::value() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!completed_) {
    TP_THROW(DistributedError, "tp::distributed::Future::value: the future has not completed "
             "yet; call wait(), which blocks until it has, or read value() inside a then() "
             "callback, which runs once it has");
  }
  if (error_) std::rethrow_exception(error_);
  return value_;
}

std::shared_ptr<Future> Future::then(Callback callback) {
  auto child = std::make_shared<Future>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    child->collectives_ = collectives_;  // not yet shared: no lock of the child's needed
  }
  // Holds the child, not this future: the parent is the one running it.
  auto run = [this, child, callback = std::move(callback)] {
    Value value;
    try {
      value = callback(*this);
    } catch (...) {
      child->complete({}, std::current_exception());
      return;
    }
    child->complete(std::move(value), nullptr);
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!completed_) {
      callbacks_.push_back(Pending{std::move(run), child});
      return child;
    }
  }
  run();  // already completed: on the calling thread, now
  return child;
}

}  // namespace tp::distributed
