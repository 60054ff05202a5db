// tp::nn::Sequential (see sequential.h).
#include "tensorplay/nn/sequential.h"

#include <string>

namespace tp::nn {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(std::move(m));
}

void Sequential::push_back(std::shared_ptr<Module> m) {
  // Child i is named "i", so its parameters list as "i.weight", "i.bias".
  register_module(std::to_string(size()), std::move(m));
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [name, child] : children()) x = (*child)(x);
  return x;
}

}  // namespace tp::nn
