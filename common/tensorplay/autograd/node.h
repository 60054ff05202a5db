// Autograd graph nodes: what a grad_fn is.
//
// Contract:
//   - Every differentiable op that saw an input requiring grad creates one Node
//     and stores it as its output's grad_fn. A node has exactly one output (all
//     kit ops produce one tensor) and one entry in next_functions() per input:
//     the grad_fn of that input, its AccumulateGrad if the input is a leaf
//     requiring grad, or nullptr if no gradient flows there.
//   - apply(grad_output) returns one gradient per input, aligned with
//     next_functions(); an entry may be undefined where next_functions() has
//     nullptr. Backward rules run with grad mode off.
//   - sequence_nr() increases with creation on each thread; among nodes that are
//     ready at once, the engine runs the most recently created first, like
//     PyTorch, so gradients become ready roughly in reverse order of use.
//   - Nodes hold what the backward needs (saved tensors) and keep the graph
//     alive; the graph is freed when the output tensors go away.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/tensor.h"

namespace tp::autograd {

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // "MatmulBackward", "AccumulateGrad", ...
  virtual std::string name() const = 0;
  // Gradients of the inputs given the gradient of the output.
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;

  const std::vector<std::shared_ptr<Node>>& next_functions() const {
    return next_functions_;
  }
  uint64_t sequence_nr() const { return sequence_nr_; }
  // True only for AccumulateGrad, which the engine runs before any other
  // ready node (Note [Ready order] in engine.cc).
  virtual bool is_accumulate_grad() const { return false; }

  // Used by ops when building the graph: one call per input, in order.
  void add_next(const Tensor& input);

 protected:
  std::vector<std::shared_ptr<Node>> next_functions_;

 private:
  uint64_t sequence_nr_;
};

// The sink node of a leaf that requires grad: adds the incoming gradient into
// leaf.grad() (in place once it exists, so a grad that is a view into a DDP
// bucket stays a view), then runs the leaf's post-accumulate-grad hooks,
// handing each the leaf as a const Tensor& (a hook cannot rebind variable()).
// With tracing on it records an instant "grad ready" before the hooks.
// Holds the leaf strongly; the leaf holds this node weakly.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(Tensor variable);
  std::string name() const override { return "AccumulateGrad"; }
  bool is_accumulate_grad() const override { return true; }
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  const Tensor& variable() const { return variable_; }

 private:
  Tensor variable_;
};

// The AccumulateGrad of a leaf requiring grad, created on first use.
std::shared_ptr<AccumulateGrad> grad_accumulator(const Tensor& leaf);

// The node that gradients for `input` should flow to: its grad_fn, its
// AccumulateGrad, or nullptr if it does not require grad.
std::shared_ptr<Node> gradient_edge(const Tensor& input);

}  // namespace tp::autograd
