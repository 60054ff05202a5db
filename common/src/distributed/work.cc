// tp::distributed::Work: a done flag and an error, behind a mutex and a
// condition variable. The communication thread calls finish() once; any
// number of threads may wait().
#include "tensorplay/distributed/work.h"

#include <string>

#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/trace.h"

namespace tp::distributed {

void Work::report_waiting(bool waiting) const {
  if (multiprocessing::current_rank() < 0) return;
  if (!waiting) {
    multiprocessing::set_rank_waiting("");
    return;
  }
  // Shown by spawn when a job hangs or a collective times out: "rank 0
  // (waiting in allreduce #3)" is the first clue to which collective a rank
  // skipped. Set even when the work is done already: each wait is progress
  // to spawn's watch (Note [Progress, not a deadline] in spawn.cc), and the
  // collective becomes the rank's last.
  std::string status = collective_ + " #" + std::to_string(seq_);
  if (rank_ != multiprocessing::current_rank()) {
    status += " (group rank " + std::to_string(rank_) + ")";  // a subgroup
  }
  multiprocessing::set_rank_waiting(status);
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
