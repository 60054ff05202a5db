// Stage 02 — bucketed DistributedDataParallel: one all-reduce per bucket.
//
// What it is: stage 01 with the gradients packed into a few large flat
// tensors ("buckets") before they are all-reduced. At construction it checks
// that every rank wraps the same model, broadcasts rank 0's parameters and
// buffers, and assigns the parameters to buckets (Note [Bucket assignment] in
// ddp.cc): reverse registration order, a bucket closes once it holds at least
// its cap of bytes. After each backward, sync_grads() copies every gradient
// into its slot of its bucket, launches one asynchronous all-reduce per
// bucket without waiting in between, then waits for all of them, divides by
// the world size and copies the averages back into the gradients.
//
// Why: every collective pays a fixed cost (latency, a trip through the
// communication thread) whatever its size, so six, or a hundred, small
// all-reduces cost far more than one large one of the same bytes. Buckets
// keep the message count small and the messages large, and a cap keeps any
// one of them from waiting for the whole model.
//
// What it deliberately is not: no overlap with backward (stage 03 launches
// each bucket from autograd hooks the moment its gradients are final), no
// no_sync, no gradient_as_bucket_view (the gradients are copied in and out).
//
// Contract:
//   - Every rank constructs it with the same architecture; a mismatch throws
//     tp::DistributedError on every rank (never a hang).
//   - REQUIRES for sync_grads(): called after loss.backward(), on every rank,
//     the same number of times. A parameter without a gradient contributes
//     zeros to its bucket (never an earlier step's values) and receives the
//     average of the others', so the replicas stay equal; note that a
//     parameter no rank used then holds a zero gradient where PyTorch leaves
//     it None (stage 05 handles unused parameters properly).
//   - Bucket tensors are owned by this object; the process group's
//     communication thread touches a bucket only between its all-reduce's
//     launch and wait().
//   - Not thread-safe; neither copyable nor movable.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tensorplay/distributed/process_group.h"
#include "tensorplay/nn/module.h"
#include "tensorplay/tensor.h"
#include "tensorplay/train/capabilities.h"

namespace stage02 {

// [snippet:options]
struct Options {
  // Also copy rank 0's buffers (running statistics) at construction.
  bool broadcast_buffers = true;
  // Cap of every bucket but the first, in MiB (PyTorch's default, 25).
  double bucket_cap_mb = 25.0;
  // Cap of the first bucket, the one filled first: small, so that in stage
  // 03 communication can start early (PyTorch uses 1 MiB).
  double first_bucket_cap_mb = 1.0;
};
// [/snippet:options]

class DistributedDataParallel {
 public:
  using Options = stage02::Options;
  // For the kit's trainer: gradients are averaged by sync_grads(), called
  // after backward; bucket_assignment() lists the buckets; a parameter may
  // lack a gradient (it contributes zeros).
  static constexpr tp::train::Capabilities capabilities{
      .syncs_after_backward = true, .unused_parameters = true, .buckets = true};

  // Verifies that all ranks hold the same parameter shapes, broadcasts rank
  // 0's parameters (and buffers), then assigns the parameters to buckets.
  // Throws tp::Error for a cap that is not positive.
  DistributedDataParallel(std::shared_ptr<tp::nn::Module> module,
                          std::shared_ptr<tp::distributed::ProcessGroup> process_group,
                          Options options = {});
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Runs the wrapped module; DDP adds nothing to the forward pass here.
  tp::Tensor forward(const tp::Tensor& input);
  tp::Tensor operator()(const tp::Tensor& input) { return forward(input); }

  // Averages every parameter's gradient over all ranks, one all-reduce (SUM)
  // per bucket, all launched before the first wait.
  void sync_grads();

  std::vector<tp::Tensor> parameters() const { return module_->parameters(); }
  std::vector<tp::nn::NamedTensor> named_parameters() const {
    return module_->named_parameters();
  }
  tp::nn::Module& module() { return *module_; }
  // The parameter indices (named_parameters() order) of each bucket, in
  // bucket order; within a bucket, in the order they were added.
  std::vector<std::vector<int64_t>> bucket_assignment() const;

 private:
  // [snippet:slots]
  // One parameter's place in its bucket: elements [offset, offset + length)
  // of the bucket's flat tensor, viewed with the parameter's shape.
  struct Slot {
    int64_t param = 0;   // index into params_
    int64_t offset = 0;  // in elements
    int64_t length = 0;  // the parameter's numel()
    tp::Tensor view;     // flat.narrow(0, offset, length).view(shape)
  };
  struct Bucket {
    std::vector<Slot> slots;  // in the order the parameters were added
    tp::Tensor flat;          // 1-D, one dtype; what is all-reduced
  };
  // [/snippet:slots]

  // Copies rank 0's parameters and buffers to every rank.
  void broadcast_from_rank0();
  // Fills buckets_ by Note [Bucket assignment].
  void assign_buckets();
  // A cap in MiB as whole bytes, truncated as PyTorch does.
  static int64_t cap_bytes(double mb) { return static_cast<int64_t>(mb * 1024.0 * 1024.0); }

  std::shared_ptr<tp::nn::Module> module_;                        // constant after construction
  std::shared_ptr<tp::distributed::ProcessGroup> process_group_;  // constant after construction
  Options options_;                                               // constant after construction
  std::vector<tp::nn::NamedTensor> params_;  // named_parameters(), cached at construction
  std::vector<Bucket> buckets_;              // constant after construction (their data changes)
};

}  // namespace stage02
