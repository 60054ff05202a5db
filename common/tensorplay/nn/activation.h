// tp::nn::ReLU: y = max(x, 0), any shape; no parameters.
#pragma once

#include "tensorplay/nn/module.h"

namespace tp::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
};

}  // namespace tp::nn
