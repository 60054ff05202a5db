// tp::nn::ReLU (see activation.h).
#include "tensorplay/nn/activation.h"

namespace tp::nn {

// Any shape: y = max(x, 0).
Tensor ReLU::forward(const Tensor& input) { return input.relu(); }

}  // namespace tp::nn
