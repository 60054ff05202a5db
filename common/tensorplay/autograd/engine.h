// The autograd engine: runs a backward pass over the graph.
//
// Contract:
//   - backward(root, grad) runs on the calling thread. It counts, for every
//     node reachable from root.grad_fn(), how many gradients it waits for;
//     a node runs when all have arrived (dependency order). Among ready nodes
//     the one with the highest sequence_nr runs first. See Note [Ready order]
//     in engine.cc.
//   - Each AccumulateGrad runs exactly once per backward, so each leaf's
//     post-accumulate-grad hooks fire once, the moment its gradient is final.
//   - queue_callback(fn) may be called only while a backward runs (typically
//     from a hook); the callbacks run in queue order on the same thread after
//     the last node, before backward() returns. Calling it outside backward
//     throws tp::Error.
//   - An exception from a node or hook aborts the pass and propagates out of
//     backward(); queued callbacks are dropped.
//   - Trace: when tp::trace is enabled, backward() marks its phases, both
//     with category "autograd": an instant "graph done" right after the last
//     node has run and before any queued callback runs; then, only if at
//     least one callback was queued, a span "callbacks" around running them;
//     and each AccumulateGrad an instant "grad ready" just before its
//     leaf's hooks run. With tracing off nothing is recorded. Checkers use the marks for
//     happens-before: a collective queued before "graph done" overlapped
//     backward. See Note [Phase marks] in engine.cc.
//   - Reentrant backward (backward inside a hook) is not supported.
#pragma once

#include <functional>

#include "tensorplay/tensor.h"

namespace tp::autograd {

// REQUIRES: root requires grad. grad may be omitted only when root has one
// element (it defaults to ones); otherwise it must match root's shape.
void backward(const Tensor& root, const Tensor& grad = Tensor());

// Runs fn once when the current backward pass finishes.
void queue_callback(std::function<void()> fn);

// True while a backward pass runs on this thread.
bool in_backward();

}  // namespace tp::autograd
