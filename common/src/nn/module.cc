// tp::nn::Module: registration and the recursive, ordered listings that DDP
// relies on (see module.h).
#include "tensorplay/nn/module.h"

#include "tensorplay/error.h"
#include "tensorplay/memory.h"

namespace tp::nn {
namespace {

bool has_name(const std::vector<NamedTensor>& list, const std::string& name) {
  for (const auto& [n, t] : list) {
    if (n == name) return true;
  }
  return false;
}

// Names must be usable as one component of a dotted path ("fc1.weight").
void check_name(const char* what, const std::string& name) {
  TP_CHECK(!name.empty(), "tp::nn::Module::", what, ": the name is empty; give it a name");
  TP_CHECK(name.find('.') == std::string::npos, "tp::nn::Module::", what, ": name '", name,
           "' contains '.', which separates submodule names; pick a name without dots");
}

// Points t's TensorImpl at a contiguous copy of its values on device: the
// same handle (every holder of it sees the move), a new storage. A view (a
// DDP bucket slot) stops aliasing its base, as a moved tensor must.
void move_in_place(const Tensor& t, Device device) {
  // The copy is what the original was (a parameter, a gradient) for tp::memory.
  memory::KindScope same_kind(t.storage()->memory_kind());
  const Tensor moved = t.detach().to(device);  // detach: no history, stays a leaf
  TensorImpl& impl = *t.impl();
  if (moved.storage() == impl.storage) return;  // already there
  impl.storage = moved.storage();
  impl.offset = 0;
  impl.strides = moved.strides();
}

}  // namespace

ModuleHookHandle::ModuleHookHandle(ModuleHookHandle&& other) noexcept
    : hooks_(std::move(other.hooks_)), id_(other.id_) {
  other.hooks_.reset();
}

ModuleHookHandle& ModuleHookHandle::operator=(ModuleHookHandle&& other) noexcept {
  if (this != &other) {
    remove();
    hooks_ = std::move(other.hooks_);
    id_ = other.id_;
    other.hooks_.reset();
  }
  return *this;
}

void ModuleHookHandle::remove() noexcept {
  if (std::shared_ptr<ModuleHooks> hooks = hooks_.lock()) {
    std::erase_if(hooks->pre, [&](const auto& entry) { return entry.first == id_; });
    std::erase_if(hooks->post, [&](const auto& entry) { return entry.first == id_; });
  }
  hooks_.reset();
}

ModuleHookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  const uint64_t id = hooks_->next_id++;
  hooks_->pre.emplace_back(id, std::move(hook));
  return ModuleHookHandle(hooks_, id);
}

ModuleHookHandle Module::register_forward_hook(ForwardHook hook) {
  const uint64_t id = hooks_->next_id++;
  hooks_->post.emplace_back(id, std::move(hook));
  return ModuleHookHandle(hooks_, id);
}

// The hooks run from copies of the lists, so a hook that removes itself (or
// another) changes the next call, not this one.
Tensor Module::operator()(const Tensor& input) {
  if (hooks_->pre.empty() && hooks_->post.empty()) return forward(input);
  const auto pre = hooks_->pre;
  for (const auto& [id, hook] : pre) hook(*this, input);
  Tensor output = forward(input);
  const auto post = hooks_->post;
  for (const auto& [id, hook] : post) output = hook(*this, input, output);
  return output;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<NamedTensor> Module::named_parameters() const {
  std::vector<NamedTensor> out;
  collect("", /*params=*/true, out);
  return out;
}

std::vector<Tensor> Module::buffers() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers()) out.push_back(t);
  return out;
}

std::vector<NamedTensor> Module::named_buffers() const {
  std::vector<NamedTensor> out;
  collect("", /*params=*/false, out);
  return out;
}

// Own tensors first, in registration order, then each child's, depth first,
// prefixed with "childname." -- the order of torch.nn.Module.named_parameters().
void Module::collect(const std::string& prefix, bool params,
                     std::vector<NamedTensor>& out) const {
  for (const auto& [name, t] : params ? params_ : buffers_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", params, out);
}

void Module::zero_grad(bool set_to_none) {
  for (Tensor& p : parameters()) {
    if (set_to_none) {
      p.set_grad(Tensor());
    } else if (p.grad().defined()) {
      p.grad().zero_();
    }
  }
}

Module& Module::to(Device device) {
  for (const auto& [name, t] : named_parameters()) {
    move_in_place(t, device);
    if (t.impl()->grad) move_in_place(Tensor(t.impl()->grad), device);
  }
  for (const auto& [name, t] : named_buffers()) move_in_place(t, device);
  return *this;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_name("register_parameter", name);
  TP_CHECK(t.defined(), "tp::nn::Module::register_parameter: parameter '", name,
           "' is an undefined tensor; create it first");
  TP_CHECK(!has_name(params_, name) && !has_name(buffers_, name),
           "tp::nn::Module::register_parameter: this module already has a parameter or "
           "buffer named '", name, "'; names must be unique");
  TP_CHECK(t.is_leaf(), "tp::nn::Module::register_parameter: parameter '", name,
           "' has a grad_fn (it was computed from other tensors); register a leaf, "
           "for example t.detach()");
  t.requires_grad_(true);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_name("register_buffer", name);
  TP_CHECK(t.defined(), "tp::nn::Module::register_buffer: buffer '", name,
           "' is an undefined tensor; create it first");
  TP_CHECK(!has_name(params_, name) && !has_name(buffers_, name),
           "tp::nn::Module::register_buffer: this module already has a parameter or "
           "buffer named '", name, "'; names must be unique");
  // A buffer made while a model's parameters are (under KindScope(Parameter),
  // as tp::train::train_rank builds its model) is not one: tp::memory counts
  // it as Other, so parameter, gradient and optimizer-state bytes agree.
  if (t.storage()->memory_kind() == memory::Kind::Parameter) {
    t.storage()->set_memory_kind(memory::Kind::Other);
  }
  buffers_.emplace_back(name, t);
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_name("register_module", name);
  TP_CHECK(m != nullptr, "tp::nn::Module::register_module: submodule '", name,
           "' is null; pass a constructed module");
  for (const auto& [n, child] : children_) {
    TP_CHECK(n != name, "tp::nn::Module::register_module: this module already has a "
             "submodule named '", name, "'; names must be unique");
  }
  children_.emplace_back(name, std::move(m));
}

}  // namespace tp::nn
