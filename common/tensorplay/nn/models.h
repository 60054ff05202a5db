// The kit's models. Each exists to exercise one thing DDP must handle:
//
//   MiniMLP      every parameter gets a gradient in every step: stages 01-04.
//   BranchyMLP   the route depends on the data, so some parameters get no
//                gradient on some micro-batches and `spare` never gets one:
//                find_unused_parameters (stage 05).
//   BufferedMLP  a buffer (RunningMean's running_mean) that forward updates,
//                like BatchNorm's running statistics: DDP's buffer broadcast.
//   deep_mlp     many layers of one width: benchmarks.
//
// All of them take MiniMLPOptions and create their submodules (and so draw
// their initial values from the global generator, see random.h) in the
// order their parameters are listed, so a seed fixes the model on every
// rank. None is thread-safe (see module.h).
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

// A model whose route depends on the data: the find_unused_parameters case.
//
//   h = relu(fc1(x))              x is (B, in); h is (B, hidden)
//   route(x) == A: h = relu(branch_a(h))    (B, hidden) -> (B, hidden)
//   route(x) == B: h = relu(branch_b(h))    (B, hidden) -> (B, hidden)
//   y = head(h)                   y is (B, out)
//
// Ten parameter tensors, in this order: fc1.weight (hidden, in), fc1.bias
// (hidden), branch_a.weight (hidden, hidden), branch_a.bias (hidden),
// branch_b.weight (hidden, hidden), branch_b.bias (hidden), head.weight
// (out, hidden), head.bias (out), spare.weight (out, hidden), spare.bias (out).
//
// Which parameters a backward through one forward reaches:
//   route A: fc1.*, branch_a.*, head.*   (branch_b.* and spare.* get no gradient)
//   route B: fc1.*, branch_b.*, head.*   (branch_a.* and spare.* get no gradient)
// "No gradient" means grad() stays as it was: undefined after
// zero_grad(set_to_none = true), not a tensor of zeros.
// spare is never used by forward: its parameters get no gradient on any rank
// in any step.
//
// The route is decided once per forward call, i.e. per micro-batch: all rows
// of one forward take the same branch. Two ranks' micro-batches of one step
// may therefore take different branches (branch_a has a gradient on one rank
// and not on the other), and with gradient accumulation one rank's
// micro-batches may take both.
class BranchyMLP : public Module {
 public:
  enum class Route { A, B };

  explicit BranchyMLP(MiniMLPOptions options = {});
  Tensor forward(const Tensor& input) override;

  // A when the sum of column 0 of x over its rows (accumulated in double, in
  // row order) is >= 0, else B. A pure function of x's values; records no
  // autograd history. x is (B, in). REQUIRES: x is 2-D with >= 1 column.
  static Route route(const Tensor& x);

  std::shared_ptr<Linear> fc1, branch_a, branch_b, head, spare;
};

// Running mean of its inputs, updated in forward like BatchNorm's running_mean.
//
//   y = x - running_mean        x is (B, features); running_mean is (features),
//                               subtracted from every row; y is (B, features)
//
// y uses the buffer's value from before this call. Then, in training mode
// only (is_training()), the buffer is updated without autograd history:
//   running_mean = (1 - momentum) * running_mean + momentum * mean_rows(x)
// In eval mode the buffer is used but not updated.
//
// running_mean is a buffer (register_buffer): it does not require grad and
// gets no gradient; the gradient of y w.r.t. x is the identity. No parameters.
class RunningMean : public Module {
 public:
  // REQUIRES: features >= 1; 0 <= momentum <= 1.
  explicit RunningMean(int64_t features, double momentum = 0.1, Dtype dtype = kFloat32);
  Tensor forward(const Tensor& input) override;

  int64_t features() const { return features_; }
  double momentum() const { return momentum_; }
  // (features). Initially 0.1 * randn from the global generator (not zeros as
  // in BatchNorm: ranks seeded differently then start with different buffers,
  // so DDP's broadcast of rank 0's buffers is observable). Updated in place,
  // so this handle always shows the current value.
  Tensor running_mean;

 private:
  int64_t features_;  // constant after construction
  double momentum_;   // constant after construction
};

// fc1 -> RunningMean -> ReLU -> fc2 -> ReLU -> fc3: MiniMLP with a buffer.
//   y = fc3(relu(fc2(relu(norm(fc1(x))))))
// Shapes: x is (B, in); fc1 (hidden, in); norm.running_mean (hidden);
// fc2 (hidden, hidden); fc3 (out, hidden); y is (B, out).
// Parameters, in this order: fc1.weight, fc1.bias, fc2.weight, fc2.bias,
// fc3.weight, fc3.bias. Buffers: norm.running_mean (momentum 0.1).
class BufferedMLP : public Module {
 public:
  explicit BufferedMLP(MiniMLPOptions options = {});
  Tensor forward(const Tensor& input) override;

  std::shared_ptr<Linear> fc1;
  std::shared_ptr<RunningMean> norm;
  std::shared_ptr<Linear> fc2, fc3;
};

// MiniMLP's layers registered out of the order forward uses them: fc2 is
// registered first, then fc1, then fc3; forward is still
// fc3(relu(fc2(relu(fc1(x))))). So the order gradients become ready (fc3,
// fc2, fc1: reverse order of use) differs from reverse registration order
// (fc3, fc1, fc2), the order DDP fills buckets in: the model on which a
// bucket can complete before an earlier one, and on which rebuilding the
// buckets in ready order (stage 06) pays.
// Shapes as MiniMLP. Parameters, in this order: fc2.weight, fc2.bias,
// fc1.weight, fc1.bias, fc3.weight, fc3.bias.
class ReorderedMLP : public Module {
 public:
  explicit ReorderedMLP(MiniMLPOptions options = {});
  Tensor forward(const Tensor& input) override;

  std::shared_ptr<Linear> fc2, fc1, fc3;
};

// MiniMLP with its middle layer in the other dtype: fc1 and fc3 in
// options.dtype, fc2 in float64 when that is float32 (and in float32 when it
// is float64); forward converts to fc2's dtype before it and back after it
// (Tensor::to, differentiable). The model whose gradients come in two dtypes,
// so DDP needs a bucket per dtype (PyTorch's buckets are keyed by dtype and
// device), as mixed precision needs with 16-bit layers. Parameters and shapes
// as MiniMLP: fc1.weight, fc1.bias, fc2.weight, fc2.bias, fc3.weight,
// fc3.bias.
class MixedMLP : public Module {
 public:
  explicit MixedMLP(MiniMLPOptions options = {});
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
