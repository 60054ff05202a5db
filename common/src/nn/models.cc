// The kit's models (see models.h).
#include "tensorplay/nn/models.h"

namespace tp::nn {

MiniMLP::MiniMLP(MiniMLPOptions options) {
  // Constructed (and so initialised from the global generator) in this order.
  fc1 = register_module("fc1", std::make_shared<Linear>(options.in_features, options.hidden,
                                                        true, options.dtype));
  fc2 = register_module("fc2", std::make_shared<Linear>(options.hidden, options.hidden,
                                                        true, options.dtype));
  fc3 = register_module("fc3", std::make_shared<Linear>(options.hidden, options.out_features,
                                                        true, options.dtype));
}

// x is (B, in) -> (B, hidden) -> (B, hidden) -> (B, out).
Tensor MiniMLP::forward(const Tensor& input) {
  Tensor h = fc1->forward(input).relu();
  h = fc2->forward(h).relu();
  return fc3->forward(h);
}

std::shared_ptr<Sequential> deep_mlp(int64_t in_features, int64_t width, int64_t depth,
                                     int64_t out_features, Dtype dtype) {
  TP_CHECK(depth >= 1, "tp::nn::deep_mlp: depth must be >= 1, got ", depth);
  auto net = std::make_shared<Sequential>();
  net->push_back(std::make_shared<Linear>(in_features, width, true, dtype));
  net->push_back(std::make_shared<ReLU>());
  for (int64_t i = 1; i < depth; ++i) {
    net->push_back(std::make_shared<Linear>(width, width, true, dtype));
    net->push_back(std::make_shared<ReLU>());
  }
  net->push_back(std::make_shared<Linear>(width, out_features, true, dtype));
  return net;
}

}  // namespace tp::nn
