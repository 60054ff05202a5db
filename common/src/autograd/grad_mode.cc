// Grad mode: one thread_local flag, on by default (see grad_mode.h).

#include "tensorplay/autograd/grad_mode.h"

namespace tp::autograd {
namespace {

// Whether ops on this thread record autograd history. Per thread, so DDP's
// communication thread and the training thread never see each other's
// NoGradGuard. Flipped only by set_grad_enabled (and so by NoGradGuard).
thread_local bool t_grad_enabled = true;

}  // namespace

bool is_grad_enabled() { return t_grad_enabled; }

void set_grad_enabled(bool enabled) { t_grad_enabled = enabled; }

}  // namespace tp::autograd
