// Autograd graph nodes: sequence numbers, edges, and AccumulateGrad.

#include "tensorplay/autograd/node.h"

#include <utility>

#include "tensorplay/memory.h"
#include "tensorplay/trace.h"

namespace tp::autograd {
namespace {

// The sequence_nr the next Node created on this thread gets. Counts up from
// 0 for the life of the thread and never resets: only the order matters.
// See Note [Ready order] in engine.cc for what it is used for.
thread_local uint64_t t_next_sequence_nr = 0;

}  // namespace

Node::Node() : sequence_nr_(t_next_sequence_nr++) {}

void Node::add_next(const Tensor& input) { next_functions_.push_back(gradient_edge(input)); }

std::shared_ptr<Node> gradient_edge(const Tensor& input) {
  if (!input.defined() || !input.requires_grad()) return nullptr;
  if (input.grad_fn()) return input.grad_fn();
  return grad_accumulator(input);
}

std::shared_ptr<AccumulateGrad> grad_accumulator(const Tensor& leaf) {
  TP_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad(),
           "tp::autograd::grad_accumulator: only a leaf that requires grad has "
           "an AccumulateGrad node");
  TensorImpl& impl = *leaf.impl();
  // One accumulator per leaf while a graph uses it: every op that consumes
  // the leaf points at the same node, so the engine sums all of the leaf's
  // gradient contributions before accumulating, and its hooks fire once.
  std::shared_ptr<AccumulateGrad> node = impl.grad_accumulator.lock();
  if (!node) {
    node = std::make_shared<AccumulateGrad>(leaf);
    impl.grad_accumulator = node;
  }
  return node;
}

AccumulateGrad::AccumulateGrad(Tensor variable) : variable_(std::move(variable)) {}

// Runs once per backward with the leaf's total gradient for this pass.
std::vector<Tensor> AccumulateGrad::apply(const Tensor& grad_output) {
  TensorImpl& leaf = *variable_.impl();
  TP_CHECK(grad_output.shape() == leaf.shape && grad_output.dtype() == leaf.dtype,
           "tp::autograd::AccumulateGrad: got a gradient of shape ",
           to_string(grad_output.shape()), " and dtype ", to_string(grad_output.dtype()),
           " for a leaf of shape ", to_string(leaf.shape), " and dtype ",
           to_string(leaf.dtype), "; a backward rule returned a wrong shape");
  TP_CHECK(grad_output.device() == leaf.storage->device(),
           "tp::autograd::AccumulateGrad: got a gradient on ", to_string(grad_output.device()),
           " for a leaf on ", to_string(leaf.storage->device()),
           "; a backward rule returned it on the wrong device");
  if (!leaf.grad) {
    // First gradient: the leaf needs a private contiguous tensor. When the
    // engine holds the only handle to grad_output and its storage, nobody
    // else can see it, so the leaf takes it as it is (the usual case: a
    // fresh result of a backward rule). Otherwise grad_output may alias
    // other tensors (the gradient the user passed to backward, or the same
    // tensor another node received) and the leaf gets a copy.
    // Either way the leaf's gradient is a storage of its own, which
    // tp::memory counts as Gradient from here on: the clone is allocated so,
    // and a taken result (allocated by the rule as Other) is moved there.
    const bool unshared = grad_output.impl_ptr().use_count() == 1 &&
                          grad_output.storage().use_count() == 1;
    memory::KindScope gradient(memory::Kind::Gradient);
    leaf.grad = unshared && grad_output.is_contiguous()
                    ? grad_output.impl_ptr()
                    : grad_output.clone().impl_ptr();  // grad mode is off: no history
    leaf.grad->storage->set_memory_kind(memory::Kind::Gradient);
    // A clone's copy made the gradient; it is not a copy into one
    // (Storage::take_bytes_copied_in counts those from here on).
    leaf.grad->storage->take_bytes_copied_in();
  } else {
    // Later gradients add in place, so a grad that is a view into a DDP
    // bucket (set with set_grad) stays that view.
    Tensor(leaf.grad).add_(grad_output);
  }
  // The gradient is final for this pass: run the hooks in registration
  // order. Iterate over a snapshot, so a hook that removes itself (or adds
  // another) changes the list from the next pass on, not this loop. Hooks
  // get variable_ as const Tensor&: they may change the leaf's gradient but
  // never rebind variable_, which every later pass dereferences.
  // With tracing on, mark the moment on the trace first (Note [Phase marks]
  // in engine.cc): a hook's launches then come after its own gradient's mark.
  // Its argument identifies the leaf (its address) for a checker that knows
  // which parameter each address is (tp::train::RankResult::param_ids).
  trace::instant("grad ready", "autograd",
                 {{"tensor", static_cast<int64_t>(reinterpret_cast<intptr_t>(&leaf))}});
  const auto hooks = leaf.post_accumulate_grad_hooks;
  for (const auto& [id, hook] : hooks) hook(variable_);
  return {};
}

}  // namespace tp::autograd
