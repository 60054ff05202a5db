// tp::nn::Linear: y = x W^T + b (see linear.h).
#include "tensorplay/nn/linear.h"

#include <cmath>

#include "tensorplay/ops.h"
#include "tensorplay/random.h"

namespace tp::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Dtype dtype)
    : in_features_(in_features), out_features_(out_features) {
  TP_CHECK(in_features >= 1 && out_features >= 1, "tp::nn::Linear: in_features (",
           in_features, ") and out_features (", out_features, ") must both be >= 1");
  // torch.nn.Linear's default init: kaiming_uniform_(a=sqrt(5)) on the weight
  // works out to U(-1/sqrt(in), 1/sqrt(in)), and the bias uses the same bound.
  // Weight first, then bias, both from the global generator: a seed fixes the
  // model on every rank.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight = register_parameter(
      "weight", rand_uniform({out_features, in_features}, -bound, bound, dtype));
  if (bias) {
    this->bias = register_parameter("bias", rand_uniform({out_features}, -bound, bound, dtype));
  }
}

Tensor Linear::forward(const Tensor& input) {
  TP_CHECK(input.dim() == 2, "tp::nn::Linear: input has shape ", to_string(input.shape()),
           ", expected 2-D (batch, ", in_features_, ")");
  TP_CHECK(input.size(1) == in_features_, "tp::nn::Linear: input has ", input.size(1),
           " features, expected ", in_features_);
  TP_CHECK(input.dtype() == weight.dtype(), "tp::nn::Linear: input is ",
           to_string(input.dtype()), " but the layer is ", to_string(weight.dtype()),
           "; convert one of them with .to()");
  // x is (B, in); weight.t() is a (in, out) view, passed to BLAS as a
  // transpose flag; y is (B, out). The bias (out) is added to every row.
  Tensor y = input.matmul(weight.t());
  if (bias.defined()) y = y + bias;
  return y;
}

}  // namespace tp::nn
