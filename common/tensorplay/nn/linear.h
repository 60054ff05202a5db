// tp::nn::Linear: y = x W^T + b, initialised like torch.nn.Linear.
//
// Shapes: x is (B, in); weight is (out, in); bias is (out); y is (B, out).
// Init: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)) from the global
// generator, weight first, so a seed fixes the model on every rank.
#pragma once

#include "tensorplay/nn/module.h"

namespace tp::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         Dtype dtype = kFloat32);
  Tensor forward(const Tensor& input) override;

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  Tensor weight;
  Tensor bias;  // undefined when constructed with bias = false

 private:
  int64_t in_features_;
  int64_t out_features_;
};

}  // namespace tp::nn
