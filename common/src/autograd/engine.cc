// The autograd engine: dependency counting, then a ready queue.
//
// backward(root) in three steps:
//   1. walk the graph from root's node and count, for every node, how many
//      edges point at it (how many gradients it will receive);
//   2. run nodes from a ready queue: a node is ready once every gradient for
//      it has arrived (its count dropped to 0); gradients that arrive for the
//      same node from several consumers are summed in its input buffer first;
//   3. run the callbacks queued during the pass.
// Between steps 2 and 3 it marks the trace (Note [Phase marks]).
// That is all; everything else (what a gradient is, how a leaf accumulates it)
// lives in the nodes.

#include "tensorplay/autograd/engine.h"

#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/autograd/node.h"
#include "tensorplay/cuda/device_trace.h"
#include "tensorplay/ops.h"
#include "tensorplay/trace.h"

namespace tp::autograd {
namespace {

// The state of the backward pass running on this thread, if any. Touched only
// by the thread that runs backward() (hooks and callbacks run on it too).
struct EngineState {
  bool running = false;  // true from the start of backward() to its return
  // queue_callback()'s functions, in queue order; cleared at the end of each
  // pass (also when it throws).
  std::vector<std::function<void()>> callbacks;
};
thread_local EngineState t_state;

// Marks a pass as running and clears the state on every exit path.
class RunningPass {
 public:
  RunningPass() { t_state.running = true; }
  ~RunningPass() {
    t_state.running = false;
    t_state.callbacks.clear();
  }
  RunningPass(const RunningPass&) = delete;
  RunningPass& operator=(const RunningPass&) = delete;
};

// Note [Ready order]
// ~~~~~~~~~~~~~~~~~~
// Several nodes can be ready at once (after MatmulBackward of x @ W runs, both
// W's AccumulateGrad and the node that produced x are ready). We run the one
// with the highest sequence_nr, i.e. the most recently created, first -- as
// PyTorch's engine does. Nodes are created in forward order, so this walks the
// graph roughly in reverse order of use: the last layer's parameters get
// their final gradients (and fire their post-accumulate-grad hooks) first, the
// first layer's last. An AccumulateGrad outranks every other ready node, so
// it runs as soon as it is ready -- as in PyTorch, which gives AccumulateGrad
// the largest sequence_nr outright. Its own sequence_nr would not do: a leaf
// keeps its AccumulateGrad while any graph that uses it is alive, so if the
// previous step's loss is still held, the accumulator carries that step's
// low number and its hooks would fire only at the very end of backward.
// Among several ready AccumulateGrads, the newer runs first.
//
// DDP depends on this order: it puts parameters into buckets in reverse
// registration order, expecting that order of gradient readiness, and starts
// a bucket's all-reduce the moment its last gradient is ready -- while
// backward is still computing the earlier layers.
struct LaterCreatedFirst {
  bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
    // Max-heap on (is AccumulateGrad, sequence_nr).
    if (a->is_accumulate_grad() != b->is_accumulate_grad()) return b->is_accumulate_grad();
    return a->sequence_nr() < b->sequence_nr();
  }
};

// Note [Phase marks]
// ~~~~~~~~~~~~~~~~~~
// With tracing on, backward() records an instant "graph done" (category
// "autograd") once the last node has run, before any queued callback, and a
// span "callbacks" around the callbacks when any were queued; every
// AccumulateGrad records an instant "grad ready" (same category) when its
// leaf's gradient is final, just before that leaf's hooks run. All go on the
// trace's one total order, so a checker can state overlap as a happens-before
// fact instead of timing it: "bucket 0's allreduce was queued before the
// last grad ready" holds only for a DDP that launches communication from
// hooks while backward still computes earlier layers. A DDP that launches
// everything from a queued end-of-backward callback queues its all-reduces
// after "graph done", inside "callbacks"; one that waits for the last
// gradient's hook queues them after the last "grad ready". With tracing off, trace::instant and
// trace::Span cost one atomic load each and record nothing.

// Step 1: for every node reachable from root, the number of edges into it.
std::unordered_map<Node*, int> count_dependencies(const std::shared_ptr<Node>& root) {
  std::unordered_map<Node*, int> dependencies;
  std::unordered_set<Node*> seen{root.get()};
  std::vector<Node*> stack{root.get()};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const std::shared_ptr<Node>& next : node->next_functions()) {
      if (!next) continue;
      ++dependencies[next.get()];
      if (seen.insert(next.get()).second) stack.push_back(next.get());
    }
  }
  return dependencies;
}

}  // namespace

namespace {

// backward()'s preconditions, worded for Tensor::backward, the usual way in.
void check_backward_arguments(const Tensor& root, const Tensor& grad) {
  TP_CHECK(root.defined(), "tp::Tensor::backward: called on an undefined tensor");
  TP_CHECK(!t_state.running,
           "tp::Tensor::backward: called while another backward pass runs on this "
           "thread (from a hook or callback); reentrant backward is not supported");
  TP_CHECK(root.requires_grad(),
           "tp::Tensor::backward: the tensor of shape ", to_string(root.shape()),
           " does not require grad and has no grad_fn, so there is nothing to "
           "differentiate; call requires_grad_() on the parameters before the "
           "forward pass, and do not run the forward under tp::NoGradGuard");
  if (grad.defined()) {
    TP_CHECK(grad.shape() == root.shape() && grad.dtype() == root.dtype(),
             "tp::Tensor::backward: the gradient has shape ", to_string(grad.shape()),
             " and dtype ", to_string(grad.dtype()), " but the tensor has shape ",
             to_string(root.shape()), " and dtype ", to_string(root.dtype()),
             "; pass a gradient of the tensor's shape and dtype");
    TP_CHECK(grad.device() == root.device(), "tp::Tensor::backward: the gradient is on ",
             to_string(grad.device()), " but the tensor is on ", to_string(root.device()),
             "; move the gradient with .to(", to_string(root.device()), ")");
  } else {
    TP_CHECK(root.numel() == 1,
             "tp::Tensor::backward: grad can be implicitly created only for "
             "one-element tensors; pass a gradient of shape ", to_string(root.shape()));
  }
}

// Step 2: runs every node reachable from root_node once, when all its
// gradients are in; root_node's gradient is root_grad.
void run_nodes(const std::shared_ptr<Node>& root_node, Tensor root_grad) {
  std::unordered_map<Node*, int> dependencies = count_dependencies(root_node);
  // A node's input buffer: the sum of the gradients that arrived so far.
  std::unordered_map<Node*, Tensor> buffers;
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>,
                      LaterCreatedFirst>
      ready;  // see Note [Ready order]
  buffers[root_node.get()] = std::move(root_grad);
  ready.push(root_node);
  while (!ready.empty()) {
    const std::shared_ptr<Node> node = ready.top();
    ready.pop();
    const auto buffer = buffers.find(node.get());
    Tensor grad_out = std::move(buffer->second);
    buffers.erase(buffer);  // free each gradient as soon as it is used

    const std::vector<Tensor> grad_inputs = node->apply(grad_out);
    const auto& nexts = node->next_functions();
    TP_CHECK(grad_inputs.size() == nexts.size(), "tp::autograd::backward: ",
             node->name(), " returned ", grad_inputs.size(), " gradients for ",
             nexts.size(), " inputs");
    for (std::size_t i = 0; i < nexts.size(); ++i) {
      const std::shared_ptr<Node>& next = nexts[i];
      if (!next) continue;
      Tensor& sum = buffers[next.get()];
      if (grad_inputs[i].defined()) {
        // Out of place: grad_inputs[i] may be shared with other nodes (add's
        // rule hands the same tensor to both inputs), so never write into it.
        sum = sum.defined() ? add(sum, grad_inputs[i]) : grad_inputs[i];
      }
      if (--dependencies[next.get()] > 0) continue;
      // Every gradient for next is in. Kit rules always return the gradients
      // that are wanted, so an empty buffer here means a rule is broken:
      // better an error than a parameter that silently gets no gradient.
      TP_CHECK(sum.defined(), "tp::autograd::backward: no gradient reached ",
               next->name(), " (", node->name(), " returned none); a backward rule "
               "must return a gradient for every input that requires grad");
      ready.push(next);
    }
  }
}

}  // namespace

void backward(const Tensor& root, const Tensor& grad) {
  check_backward_arguments(root, grad);
  NoGradGuard no_grad;  // backward rules must not build graphs
  RunningPass running;

  // The root's node lives until backward() returns, as its graph does.
  const std::shared_ptr<Node> root_node = gradient_edge(root);
  // The implicit gradient 1 lives where the root does (a CUDA loss: on its GPU).
  run_nodes(root_node, grad.defined() ? grad : ones(root.shape(), root.dtype(), root.device()));

  // On a GPU the host only queued the kernels: the same mark as a zero-length
  // span on the compute stream says when the GPU finished them (the trace's
  // GPU rows, tensorplay/cuda/device_trace.h).
  {
    trace::DeviceSpan gpu("gpu graph done", cuda::current_stream(), "compute stream", {},
                          root.device().type == DeviceType::CUDA);
  }
  // [snippet:engine-callbacks]
  trace::instant("graph done", "autograd");  // Note [Phase marks]
  if (t_state.callbacks.empty()) return;

  // Step 3: callbacks, in queue order. Index-based because a callback may
  // queue more callbacks (they run too, in this same loop).
  trace::Span span("callbacks", "autograd");  // Note [Phase marks]
  for (std::size_t i = 0; i < t_state.callbacks.size(); ++i) {
    std::function<void()> callback = std::move(t_state.callbacks[i]);
    callback();
  }
  // [/snippet:engine-callbacks]
}

void queue_callback(std::function<void()> fn) {
  TP_CHECK(t_state.running,
           "tp::autograd::queue_callback: called outside a backward pass; call it "
           "from a hook while backward runs");
  t_state.callbacks.push_back(std::move(fn));
}

bool in_backward() { return t_state.running; }

}  // namespace tp::autograd
