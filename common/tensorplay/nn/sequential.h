// tp::nn::Sequential: runs its children in order; child i is named "i".
//
// Contract: children are registered in the order given (by the list
// constructor or by push_back), so child i's parameters list as "i.weight",
// "i.bias", exactly as torch.nn.Sequential names them. forward(x) feeds x to
// child 0, its output to child 1, and so on; an empty Sequential returns x.
#pragma once

#include <memory>
#include <vector>

#include "tensorplay/nn/module.h"

namespace tp::nn {

class Sequential : public Module {
 public:
  Sequential() = default;
  // Registers modules[i] as child "i", in order:
  //   std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{a, b, c})
  // REQUIRES: no element is null.
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  // Appends m as child number size(). REQUIRES: m is not null.
  void push_back(std::shared_ptr<Module> m);
  std::size_t size() const { return children().size(); }
  Tensor forward(const Tensor& input) override;
};

}  // namespace tp::nn
