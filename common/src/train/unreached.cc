// The graph walk of unreached.h.
#include "tensorplay/train/unreached.h"

#include <set>

#include "tensorplay/autograd/node.h"

namespace tp::train {

std::vector<int64_t> unreached_parameters(const Tensor& output,
                                          const std::vector<NamedTensor>& params) {
  std::set<const TensorImpl*> reached;
  std::set<const autograd::Node*> seen;
  std::vector<const autograd::Node*> stack;
  if (output.grad_fn()) stack.push_back(output.grad_fn().get());
  while (!stack.empty()) {
    const autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (const auto* sink = dynamic_cast<const autograd::AccumulateGrad*>(node)) {
      reached.insert(sink->variable().impl());
    }
    for (const auto& next : node->next_functions()) {
      if (next) stack.push_back(next.get());
    }
  }
  std::vector<int64_t> out;
  for (size_t p = 0; p < params.size(); ++p) {
    if (reached.count(params[p].second.impl()) == 0) out.push_back(static_cast<int64_t>(p));
  }
  return out;
}

}  // namespace tp::train
