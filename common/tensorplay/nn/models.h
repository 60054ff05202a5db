// The kit's models: MiniMLP for every stage, deep_mlp for benchmarks.
#pragma once

#include <memory>

#include "tensorplay/nn/activation.h"
#include "tensorplay/nn/linear.h"
#include "tensorplay/nn/sequential.h"

namespace tp::nn {

struct MiniMLPOptions {
  int64_t in_features = 16;
  int64_t hidden = 32;
  int64_t out_features = 4;
  Dtype dtype = kFloat32;
};

// fc1 -> ReLU -> fc2 -> ReLU -> fc3. Six parameter tensors, in this order:
// fc1.weight, fc1.bias, fc2.weight, fc2.bias, fc3.weight, fc3.bias.
// Shapes: x is (B, in); fc1 (hidden, in); fc2 (hidden, hidden); fc3 (out, hidden).
class MiniMLP : public Module {
 public:
  explicit MiniMLP(MiniMLPOptions options = {});
  Tensor forward(const Tensor& input) override;

  std::shared_ptr<Linear> fc1, fc2, fc3;
};

// depth Linear layers of width `width` with ReLU between them, then a Linear
// to out_features: Linear(in, width), ReLU, [Linear(width, width), ReLU] x
// (depth - 1), Linear(width, out). 2 * (depth + 1) parameter tensors.
// REQUIRES: depth >= 1.
std::shared_ptr<Sequential> deep_mlp(int64_t in_features, int64_t width,
                                     int64_t depth, int64_t out_features,
                                     Dtype dtype = kFloat32);

}  // namespace tp::nn
