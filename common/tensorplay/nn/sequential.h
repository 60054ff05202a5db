// tp::nn::Sequential: runs its children in order; child i is named "i".
#pragma once

#include <memory>

#include "tensorplay/nn/module.h"

namespace tp::nn {

class Sequential : public Module {
 public:
  Sequential() = default;
  // Appends m as child number size().
  void push_back(std::shared_ptr<Module> m);
  std::size_t size() const { return children().size(); }
  Tensor forward(const Tensor& input) override;
};

}  // namespace tp::nn
