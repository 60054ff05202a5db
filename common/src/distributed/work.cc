// tp::distributed::Work: a done flag and an error, behind a mutex and a
// condition variable. The communication thread calls finish() once; any
// number of threads may wait().
#include "tensorplay/distributed/work.h"

#include <atomic>

#include "tensorplay/trace.h"

namespace tp::distributed {

namespace {

// The process's wait listener; null until someone sets one (spawn, in the
// ranks it forks). Atomic, because any thread may wait while it is set.
std::atomic<WaitListener> g_wait_listener{nullptr};

}  // namespace

void set_wait_listener(WaitListener listener) {
  g_wait_listener.store(listener, std::memory_order_release);
}

void Work::report_waiting(bool waiting) const {
  if (const WaitListener listener = g_wait_listener.load(std::memory_order_acquire)) {
    listener(*this, waiting);
  }
}

void Work::wait() {
  // On the trace, a span "wait" on the waiting thread: checkers see where a
  // stage blocks ("every bucket is launched before the first wait").
  trace::Span span("wait", "comm", {{"seq", static_cast<int64_t>(seq_)}});
  std::function<void()> hook;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    report_waiting(true);
    done_cv_.wait(lock, [this] { return done_; });
    report_waiting(false);
    if (on_first_wait_ && !error_) {
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

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;  // finish() is called once; a second call is ignored
    error_ = std::move(error);
    done_ = true;
  }
  done_cv_.notify_all();
}

}  // namespace tp::distributed
