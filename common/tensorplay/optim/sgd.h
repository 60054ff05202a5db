// tp::optim::SGD: stochastic gradient descent, optionally with momentum.
//
// Update (as torch.optim.SGD, dampening 0, no Nesterov, no weight decay):
//   buf = momentum * buf + grad        (buf = grad on the first step)
//   p  -= lr * (momentum > 0 ? buf : grad)
// Parameters without a gradient are skipped. step() runs under NoGradGuard.
#pragma once

#include <vector>

#include "tensorplay/tensor.h"

namespace tp::optim {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
};

class SGD {
 public:
  // REQUIRES: lr > 0, momentum >= 0, every param a leaf requiring grad.
  SGD(std::vector<Tensor> params, SGDOptions options);
  void step();
  void zero_grad(bool set_to_none = true);
  const SGDOptions& options() const { return options_; }
  // The parameters as given, and each one's momentum buffer: undefined
  // until its first step with momentum > 0 (what a sharded optimizer's
  // checker reads to see which state a rank really holds).
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<Tensor>& momentum_buffers() const { return momentum_buffers_; }
  // Replaces the momentum buffers (a checkpoint's, PyTorch's
  // load_state_dict): one per parameter, each undefined or of its
  // parameter's shape, dtype and device; they are counted as optimizer
  // state from then on. Throws tp::Error naming the first that is not.
  void load_momentum_buffers(std::vector<Tensor> buffers);

 private:
  std::vector<Tensor> params_;
  std::vector<Tensor> momentum_buffers_;  // undefined until first used
  SGDOptions options_;
};

}  // namespace tp::optim
