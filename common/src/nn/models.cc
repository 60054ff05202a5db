// The kit's models (see models.h).
#include "tensorplay/nn/models.h"

#include <utility>
#include <vector>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/ops.h"
#include "tensorplay/random.h"

namespace tp::nn {

// ---- MiniMLP --------------------------------------------------------------------

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
  Tensor h = (*fc1)(input).relu();
  h = (*fc2)(h).relu();
  return (*fc3)(h);
}

// ---- BranchyMLP -----------------------------------------------------------------

BranchyMLP::BranchyMLP(MiniMLPOptions options) {
  const int64_t in = options.in_features, hidden = options.hidden, out = options.out_features;
  // Constructed (and so initialised from the global generator) in this order.
  fc1 = register_module("fc1", std::make_shared<Linear>(in, hidden, true, options.dtype));
  branch_a = register_module("branch_a",
                             std::make_shared<Linear>(hidden, hidden, true, options.dtype));
  branch_b = register_module("branch_b",
                             std::make_shared<Linear>(hidden, hidden, true, options.dtype));
  head = register_module("head", std::make_shared<Linear>(hidden, out, true, options.dtype));
  // Never called by forward: a parameter that no rank ever gives a gradient.
  spare = register_module("spare", std::make_shared<Linear>(hidden, out, true, options.dtype));
}

// x is (B, in); only its values are read, through a detached view, so no
// autograd history is recorded.
BranchyMLP::Route BranchyMLP::route(const Tensor& x) {
  TP_CHECK(x.defined() && x.dim() == 2 && x.size(1) >= 1,
           "tp::nn::BranchyMLP::route: expected a 2-D input (batch, features) with at "
           "least one column, got ",
           x.defined() ? to_string(x.shape()) : std::string("an undefined tensor"));
  double column0 = 0.0;
  for (double v : x.detach().narrow(1, 0, 1).to_vector()) column0 += v;
  return column0 >= 0.0 ? Route::A : Route::B;
}

// x is (B, in) -> h (B, hidden) -> branch_a or branch_b (B, hidden) -> (B, out).
Tensor BranchyMLP::forward(const Tensor& input) {
  Tensor h = (*fc1)(input).relu();
  h = (*(route(input) == Route::A ? branch_a : branch_b))(h).relu();
  return (*head)(h);
}

// ---- RunningMean ----------------------------------------------------------------

RunningMean::RunningMean(int64_t features, double momentum, Dtype dtype)
    : features_(features), momentum_(momentum) {
  TP_CHECK(features >= 1, "tp::nn::RunningMean: features must be >= 1, got ", features);
  TP_CHECK(momentum >= 0.0 && momentum <= 1.0,
           "tp::nn::RunningMean: momentum must be in [0, 1], got ", momentum);
  // 0.1 * randn rather than BatchNorm's zeros: differently seeded ranks start
  // with different buffers, so DDP's buffer broadcast has something to fix.
  running_mean = register_buffer("running_mean", randn({features}, dtype).mul_(0.1));
}

// x is (B, features); running_mean is (features); y is (B, features).
Tensor RunningMean::forward(const Tensor& input) {
  TP_CHECK(input.dim() == 2 && input.size(1) == features_,
           "tp::nn::RunningMean: input has shape ", to_string(input.shape()),
           ", expected (batch, ", features_, ")");
  TP_CHECK(input.dtype() == running_mean.dtype(), "tp::nn::RunningMean: input is ",
           to_string(input.dtype()), " but the buffer is ", to_string(running_mean.dtype()),
           "; convert one of them with .to()");
  // y = x + (-running_mean), the negation broadcast to every row as a bias.
  // The negation is a fresh copy of the buffer's current value and needs no
  // grad, so the update below cannot change y, and dy/dx is the identity.
  const Tensor y = add(input, mul(running_mean.detach(), -1.0));
  if (is_training()) {
    TP_CHECK(input.size(0) >= 1, "tp::nn::RunningMean: the batch is empty in training "
             "mode; a mean over 0 rows is undefined, pass at least one row or call eval()");
    NoGradGuard no_grad;
    // running_mean = (1 - momentum) * running_mean + momentum * mean_rows(x),
    // with mean_rows(x) = sum(x, 0) / B, (B, features) -> (features).
    const Tensor batch_mean = div(sum(input.detach(), 0), static_cast<double>(input.size(0)));
    running_mean.mul_(1.0 - momentum_).add_(batch_mean, momentum_);
  }
  return y;
}

// ---- BufferedMLP ----------------------------------------------------------------

BufferedMLP::BufferedMLP(MiniMLPOptions options) {
  const int64_t in = options.in_features, hidden = options.hidden, out = options.out_features;
  // Constructed (and so initialised from the global generator) in this order:
  // fc1's weight and bias, then norm's running_mean, then fc2's, then fc3's.
  fc1 = register_module("fc1", std::make_shared<Linear>(in, hidden, true, options.dtype));
  norm = register_module("norm", std::make_shared<RunningMean>(hidden, 0.1, options.dtype));
  fc2 = register_module("fc2", std::make_shared<Linear>(hidden, hidden, true, options.dtype));
  fc3 = register_module("fc3", std::make_shared<Linear>(hidden, out, true, options.dtype));
}

// x is (B, in) -> (B, hidden) -> norm (B, hidden) -> (B, hidden) -> (B, out).
Tensor BufferedMLP::forward(const Tensor& input) {
  Tensor h = (*norm)((*fc1)(input)).relu();
  h = (*fc2)(h).relu();
  return (*fc3)(h);
}

// ---- ReorderedMLP ----------------------------------------------------------------

ReorderedMLP::ReorderedMLP(MiniMLPOptions options) {
  const int64_t in = options.in_features, hidden = options.hidden, out = options.out_features;
  // Registered (and initialised) fc2, fc1, fc3: not the order of use.
  fc2 = register_module("fc2", std::make_shared<Linear>(hidden, hidden, true, options.dtype));
  fc1 = register_module("fc1", std::make_shared<Linear>(in, hidden, true, options.dtype));
  fc3 = register_module("fc3", std::make_shared<Linear>(hidden, out, true, options.dtype));
}

// x is (B, in) -> fc1 (B, hidden) -> fc2 (B, hidden) -> fc3 (B, out).
Tensor ReorderedMLP::forward(const Tensor& input) {
  Tensor h = (*fc1)(input).relu();
  h = (*fc2)(h).relu();
  return (*fc3)(h);
}

// ---- MixedMLP -------------------------------------------------------------------

MixedMLP::MixedMLP(MiniMLPOptions options) {
  const int64_t in = options.in_features, hidden = options.hidden, out = options.out_features;
  const Dtype other = options.dtype == kFloat32 ? kFloat64 : kFloat32;
  fc1 = register_module("fc1", std::make_shared<Linear>(in, hidden, true, options.dtype));
  fc2 = register_module("fc2", std::make_shared<Linear>(hidden, hidden, true, other));
  fc3 = register_module("fc3", std::make_shared<Linear>(hidden, out, true, options.dtype));
}

// x is (B, in) -> fc1 (B, hidden) -> [fc2's dtype] fc2 (B, hidden) -> [back] fc3 (B, out).
Tensor MixedMLP::forward(const Tensor& input) {
  Tensor h = (*fc1)(input).relu();
  h = (*fc2)(h.to(fc2->weight.dtype())).relu();
  return (*fc3)(h.to(input.dtype()));
}

// ---- deep_mlp -------------------------------------------------------------------

std::shared_ptr<Sequential> deep_mlp(int64_t in_features, int64_t width, int64_t depth,
                                     int64_t out_features, Dtype dtype) {
  TP_CHECK(depth >= 1, "tp::nn::deep_mlp: depth must be >= 1, got ", depth);
  // Built (and so initialised) first layer first.
  std::vector<std::shared_ptr<Module>> layers;
  layers.push_back(std::make_shared<Linear>(in_features, width, true, dtype));
  layers.push_back(std::make_shared<ReLU>());
  for (int64_t i = 1; i < depth; ++i) {
    layers.push_back(std::make_shared<Linear>(width, width, true, dtype));
    layers.push_back(std::make_shared<ReLU>());
  }
  layers.push_back(std::make_shared<Linear>(width, out_features, true, dtype));
  return std::make_shared<Sequential>(std::move(layers));
}

}  // namespace tp::nn
