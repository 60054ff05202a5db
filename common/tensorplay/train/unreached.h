// Which parameters a backward from `output` would not reach: the kit's own
// graph walk, used by the reference trainer and the DDP trainer to record
// which parameters each micro-batch leaves without a gradient (the demo
// shows it; the checkers' overlap check needs it). A stage's DDP walks the
// graph itself (lesson 05); it does not call this.
//
// Contract:
//   - Walks from output.grad_fn() through next_functions() to the
//     AccumulateGrad nodes, the graph backward would run; a parameter whose
//     accumulator is not on it gets no gradient from this output.
//   - Returns indices into `params`, ascending; all of them when `output`
//     has no grad_fn (it does not depend on any parameter).
#pragma once

#include <cstdint>
#include <vector>

#include "tensorplay/tensor.h"

namespace tp::train {

std::vector<int64_t> unreached_parameters(const Tensor& output,
                                          const std::vector<NamedTensor>& params);

}  // namespace tp::train
