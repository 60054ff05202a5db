// Grad mode: whether ops record autograd history on this thread.
//
// Contract: the flag is thread_local and on by default. NoGradGuard turns it
// off for its scope and restores the previous value (guards nest). Optimizer
// steps, DDP's parameter broadcast and the backward rules themselves run with
// it off, so they never build graphs.
#pragma once

namespace tp {
namespace autograd {

bool is_grad_enabled();
void set_grad_enabled(bool enabled);

}  // namespace autograd

class NoGradGuard {
 public:
  NoGradGuard() : previous_(autograd::is_grad_enabled()) {
    autograd::set_grad_enabled(false);
  }
  ~NoGradGuard() { autograd::set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace tp
