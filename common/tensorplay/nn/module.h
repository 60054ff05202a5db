// tp::nn::Module: a tree of named parameters, buffers and submodules.
//
// Contract:
//   - Parameters and buffers are listed in registration order, depth first
//     through submodules, with dotted names ("fc1.weight", "0.bias") exactly as
//     torch.nn.Module.named_parameters() lists them. DDP relies on this order
//     being the same on every rank.
//   - Returned tensors are handles: changing their data changes the module.
//   - forward() takes one tensor and returns one tensor (all kit models are
//     feed-forward). operator() calls it between the module's forward hooks,
//     as PyTorch's __call__ does: the pre-hooks, in registration order, then
//     forward, then the forward hooks, each of which may replace the output.
//     The kit's models call their submodules through operator(), so a hook
//     on any submodule runs; forward() called directly runs none. (FSDP
//     gathers a unit's parameters in a pre-hook and frees them in a hook.)
//     A hook lives as long as its ModuleHookHandle; removing it from inside
//     a hook takes effect at the next call.
//   - to(device) moves every parameter and buffer in place: each keeps its
//     Tensor handle (the same TensorImpl), whose storage is replaced by a
//     contiguous copy on the device, so hooks, optimizers and DDP holding the
//     handles keep working. A parameter's .grad, if any, moves the same way.
//     Nothing moves when a tensor is already there. Autograd history is not
//     recorded (parameters stay leaves); optimizer state (SGD's momentum
//     buffers) is not moved: build the optimizer after to(), as in PyTorch.
//   - Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensorplay/tensor.h"

namespace tp::nn {

using NamedTensor = tp::NamedTensor;  // (tensor.h)

class Module;

// Runs before forward with the module and its input.
using ForwardPreHook = std::function<void(Module& module, const Tensor& input)>;
// Runs after forward with the module, its input and its output; returns the
// output the caller gets (the same tensor, or one that replaces it).
using ForwardHook =
    std::function<Tensor(Module& module, const Tensor& input, const Tensor& output)>;

// The hooks of one module, shared with their handles (weakly).
struct ModuleHooks {
  std::vector<std::pair<uint64_t, ForwardPreHook>> pre;
  std::vector<std::pair<uint64_t, ForwardHook>> post;
  uint64_t next_id = 1;  // never reused, so a stale handle removes nothing
};

// The registration of one forward (pre-)hook: the hook lives as long as the
// handle, like Tensor's RemovableHandle (tensor.h). Move-only; outliving
// the module is harmless.
class ModuleHookHandle {
 public:
  ModuleHookHandle() = default;
  ModuleHookHandle(std::weak_ptr<ModuleHooks> hooks, uint64_t id)
      : hooks_(std::move(hooks)), id_(id) {}
  ~ModuleHookHandle() { remove(); }
  ModuleHookHandle(const ModuleHookHandle&) = delete;
  ModuleHookHandle& operator=(const ModuleHookHandle&) = delete;
  ModuleHookHandle(ModuleHookHandle&& other) noexcept;
  ModuleHookHandle& operator=(ModuleHookHandle&& other) noexcept;
  // Unregisters the hook now; safe to call twice.
  void remove() noexcept;

 private:
  std::weak_ptr<ModuleHooks> hooks_;  // empty once removed or moved from
  uint64_t id_ = 0;
};

class Module {
 public:
  virtual ~Module() = default;

  virtual Tensor forward(const Tensor& input) = 0;
  // forward() between the hooks (see the contract).
  Tensor operator()(const Tensor& input);

  [[nodiscard]] ModuleHookHandle register_forward_pre_hook(ForwardPreHook hook);
  [[nodiscard]] ModuleHookHandle register_forward_hook(ForwardHook hook);

  // All parameters, registration order, recursive.
  std::vector<Tensor> parameters() const;
  std::vector<NamedTensor> named_parameters() const;
  // All buffers (state that is not trained, such as running statistics).
  std::vector<Tensor> buffers() const;
  std::vector<NamedTensor> named_buffers() const;
  // Direct children, registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }

  // Clears (set_to_none, the PyTorch default) or zeroes every parameter's grad.
  void zero_grad(bool set_to_none = true);

  // Moves all parameters and buffers (and parameters' grads) to device, in
  // place; see the contract above. Returns *this.
  Module& to(Device device);

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

 protected:
  // Registers t as a parameter (sets requires_grad) and returns the handle.
  // REQUIRES: name is unique among this module's parameters and buffers.
  Tensor register_parameter(const std::string& name, Tensor t);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void collect(const std::string& prefix, bool params, std::vector<NamedTensor>& out) const;

  std::vector<NamedTensor> params_;
  std::vector<NamedTensor> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  std::shared_ptr<ModuleHooks> hooks_ = std::make_shared<ModuleHooks>();
};

}  // namespace tp::nn
