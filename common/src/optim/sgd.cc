// tp::optim::SGD (see sgd.h for the update rule).
#include "tensorplay/optim/sgd.h"

#include <cmath>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/memory.h"

namespace tp::optim {

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : params_(std::move(params)), options_(options) {
  TP_CHECK(std::isfinite(options.lr) && options.lr > 0, "tp::optim::SGD: lr must be > 0, got ",
           options.lr);
  TP_CHECK(std::isfinite(options.momentum) && options.momentum >= 0,
           "tp::optim::SGD: momentum must be >= 0, got ", options.momentum);
  TP_CHECK(!params_.empty(), "tp::optim::SGD: got an empty parameter list; pass "
           "model.parameters()");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    TP_CHECK(p.defined(), "tp::optim::SGD: parameter ", i, " is an undefined tensor");
    TP_CHECK(p.is_leaf() && p.requires_grad(), "tp::optim::SGD: parameter ", i,
             " is not a leaf that requires grad; pass the module's parameters()");
    for (size_t j = 0; j < i; ++j) {
      // The same tensor twice would be stepped twice per step().
      TP_CHECK(params_[j].impl() != p.impl(), "tp::optim::SGD: parameter ", i,
               " is the same tensor as parameter ", j, "; pass each parameter once");
    }
  }
  momentum_buffers_.resize(params_.size());
}

void SGD::load_momentum_buffers(std::vector<Tensor> buffers) {
  TP_CHECK(buffers.size() == params_.size(), "tp::optim::SGD::load_momentum_buffers: got ",
           buffers.size(), " buffers for ", params_.size(), " parameters");
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Tensor& b = buffers[i];
    if (!b.defined()) continue;
    const Tensor& p = params_[i];
    TP_CHECK(b.shape() == p.shape() && b.dtype() == p.dtype() && b.device() == p.device(),
             "tp::optim::SGD::load_momentum_buffers: buffer ", i, " is ", to_string(b.shape()),
             " ", to_string(b.dtype()), " on ", to_string(b.device()), " but its parameter is ",
             to_string(p.shape()), " ", to_string(p.dtype()), " on ", to_string(p.device()));
    b.storage()->set_memory_kind(memory::Kind::OptimizerState);
  }
  momentum_buffers_ = std::move(buffers);
}

void SGD::step() {
  // The update must not become part of any autograd graph.
  NoGradGuard no_grad;
  const double lr = options_.lr;
  const double momentum = options_.momentum;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    const Tensor g = p.grad();
    if (!g.defined()) continue;  // no gradient this step: leave p (and its buffer) alone
    if (momentum > 0) {
      // The buffer's bytes, made here, are the optimizer's state (tp::memory).
      memory::KindScope state(memory::Kind::OptimizerState);
      Tensor& buf = momentum_buffers_[i];
      if (!buf.defined()) {
        buf = g.clone();  // buf = grad on the first step
      } else {
        // Moved with its parameter (Module::to after a step): the buffer follows.
        if (buf.device() != g.device()) buf = buf.to(g.device());
        buf.mul_(momentum).add_(g);  // buf = momentum * buf + grad
      }
      p.add_(buf, -lr);  // p -= lr * buf
    } else {
      p.add_(g, -lr);  // p -= lr * grad
    }
  }
}

void SGD::zero_grad(bool set_to_none) {
  for (Tensor& p : params_) {
    if (set_to_none) {
      p.set_grad(Tensor());
    } else if (p.grad().defined()) {
      p.grad().zero_();
    }
  }
}

}  // namespace tp::optim
