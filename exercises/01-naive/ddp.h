// Copied from solutions/01-naive/ddp.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 01 — naive DistributedDataParallel: one all-reduce per parameter.
//
// What it is: a wrapper that makes W replicas of a module train as one. At
// construction it checks that every rank wraps the same architecture and
// copies rank 0's parameters and buffers to every rank (broadcast). After each
// backward, sync_grads() all-reduces every parameter's gradient, one
// collective per parameter, and divides by the world size, so every rank
// steps with the mean gradient and the replicas stay identical.
//
// What it deliberately is not: no buckets (stage 02 packs gradients into a
// few large all-reduces), no overlap with backward (stage 03 launches them
// from autograd hooks while backward still runs), no no_sync, no unused
// parameters. It is the smallest correct DDP, and the slow baseline the
// later stages are measured against.
//
// Contract:
//   - Every rank constructs it with the same architecture; a mismatch throws
//     tp::DistributedError on every rank, naming the first differing
//     parameter and the ranks (never a hang).
//   - REQUIRES for sync_grads(): called after loss.backward(), on every rank,
//     the same number of times; every parameter has a gradient.
//   - Collectives, which the checker counts: construction issues exactly two
//     all-gathers (every rank's parameter count, then every rank's shape
//     rows) and one broadcast per parameter, plus one per buffer with
//     broadcast_buffers; sync_grads() one all-reduce per parameter.
//   - Not thread-safe; the process group's communication thread only touches
//     the gradient it is all-reducing.
//   - Neither copyable nor movable: it stands for one replica in one process
//     group (later stages register hooks that point back at it).
#pragma once

#include <memory>
#include <vector>

#include "tensorplay/distributed/process_group.h"
#include "tensorplay/nn/module.h"
#include "tensorplay/tensor.h"
#include "tensorplay/train/capabilities.h"

namespace stage01 {

struct Options {
  // Also copy rank 0's buffers (running statistics) at construction.
  bool broadcast_buffers = true;
};

class DistributedDataParallel {
 public:
  using Options = stage01::Options;
  // For the kit's trainer: gradients are averaged by sync_grads(), called
  // after backward.
  static constexpr tp::train::Capabilities capabilities{.syncs_after_backward = true};

  // Verifies that all ranks hold the same parameter shapes, then broadcasts
  // rank 0's parameters (and buffers) to every rank.
  DistributedDataParallel(std::shared_ptr<tp::nn::Module> module,
                          std::shared_ptr<tp::distributed::ProcessGroup> process_group,
                          Options options = {});
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Runs the wrapped module; DDP adds nothing to the forward pass here.
  tp::Tensor forward(const tp::Tensor& input);
  tp::Tensor operator()(const tp::Tensor& input) { return forward(input); }

  // Averages every parameter's gradient over all ranks: one all-reduce (SUM)
  // per parameter, then division by the world size.
  void sync_grads();

  std::vector<tp::Tensor> parameters() const { return module_->parameters(); }
  std::vector<tp::nn::NamedTensor> named_parameters() const {
    return module_->named_parameters();
  }
  tp::nn::Module& module() { return *module_; }

 private:
  // Throws on every rank if any two ranks wrap different parameter shapes.
  void verify_same_model_on_all_ranks();
  // Copies rank 0's parameters and buffers to every rank.
  void broadcast_from_rank0();
  // Parameter `index`'s gradient; throws naming the parameter if it has none.
  tp::Tensor grad_for_sync(size_t index) const;

  std::shared_ptr<tp::nn::Module> module_;                     // constant after construction
  std::shared_ptr<tp::distributed::ProcessGroup> process_group_;  // constant after construction
  Options options_;                                            // constant after construction
  std::vector<tp::nn::NamedTensor> params_;  // named_parameters(), cached at construction
  int64_t sync_count_ = 0;                   // sync_grads() calls so far, for messages
};

}  // namespace stage01
