// Exercise generated from solutions/02-bucketing/ddp.cc by tools/gen_exercise.py.
// Fill in each EXERCISE, then run ./kit check 02. ./kit reset 02 restores this file.
// Stage 02 — bucketed DDP: one all-reduce per bucket, after backward.
// No overlap: stage 03 adds that. See ddp.h for the contract and
// lessons/02-bucketing/README.md for the why.
#include "ddp.h"

#include <map>
#include <string>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/distributed/model_check.h"
#include "tensorplay/error.h"

namespace stage02 {

using tp::Tensor;
using tp::distributed::ReduceOp;

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<tp::nn::Module> module,
    std::shared_ptr<tp::distributed::ProcessGroup> process_group, Options options)
    : module_(std::move(module)),
      process_group_(std::move(process_group)),
      options_(options) {
  // SAME FROM STAGE 02: check the arguments and the model
  TP_CHECK(module_ != nullptr, "stage02 DDP: the module is null; pass the model to wrap");
  TP_CHECK(process_group_ != nullptr,
           "stage02 DDP: the process group is null; call init_process_group first");
  TP_CHECK(options_.bucket_cap_mb > 0 && options_.first_bucket_cap_mb > 0,
           "stage02 DDP: bucket_cap_mb and first_bucket_cap_mb must be positive (got ",
           options_.bucket_cap_mb, " and ", options_.first_bucket_cap_mb,
           "); a tiny cap such as 1e-6 gives one bucket per parameter");
  params_ = module_->named_parameters();
  tp::distributed::verify_same_tensors_on_all_ranks(*process_group_, params_, "stage02 DDP");
  // END SAME FROM STAGE 02: check the arguments and the model
  broadcast_from_rank0();
  assign_buckets();
}

// SAME FROM STAGE 01: broadcast rank 0's model
void DistributedDataParallel::broadcast_from_rank0() {
  // The broadcast writes into the parameters: no autograd history for that.
  tp::NoGradGuard no_grad;
  for (auto& [name, param] : params_) {
    process_group_->broadcast(param, /*root=*/0)->wait();
  }
  if (options_.broadcast_buffers) {
    for (const Tensor& buffer : module_->buffers()) {
      process_group_->broadcast(buffer, /*root=*/0)->wait();
    }
  }
}
// END SAME FROM STAGE 01: broadcast rank 0's model

// Note [Bucket assignment]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Gradients become ready roughly in reverse order of use, which for a
// feed-forward model is reverse registration order (the last layer's first;
// Note [Ready order] in common/src/autograd/engine.cc). So buckets are filled
// walking the parameters from the last to the first: the first bucket holds
// the last layer's, ready earliest. A bucket closes as soon as it holds at
// least its cap of bytes, so it may overshoot the cap by its last tensor
// (never split a tensor); the first bucket's cap is first_bucket_cap_mb, the
// others' bucket_cap_mb, in MiB truncated to whole bytes (as PyTorch does).
// A bucket holds one dtype, since it is all-reduced as one flat tensor: each
// dtype has its own open bucket and its own caps (its first bucket gets
// first_bucket_cap_mb), as PyTorch keys them by dtype and device. Buckets
// are numbered in the order they close; whatever is left open at the end
// becomes the last buckets, by dtype (float32 first; PyTorch leaves that
// order unspecified). All ranks run this on the same shapes, so they agree
// on the buckets without talking.
void DistributedDataParallel::assign_buckets() {
  // EXERCISE: fill buckets_ following Note [Bucket assignment]. Give each
  // bucket one flat 1-D tensor of its dtype, exactly as long as its
  // parameters' elements, and each parameter a Slot: its offset and length
  // in the flat tensor and a view of those elements with the parameter's
  // shape.
  throw tp::NotImplemented("stage 02: DistributedDataParallel::assign_buckets is not implemented yet (exercises/02-bucketing/ddp.cc)");
}

// SAME FROM STAGE 02: bucket_assignment()
std::vector<std::vector<int64_t>> DistributedDataParallel::bucket_assignment() const {
  std::vector<std::vector<int64_t>> out;
  for (const Bucket& bucket : buckets_) {
    out.emplace_back();
    for (const Slot& slot : bucket.slots) out.back().push_back(slot.param);
  }
  return out;
}
// END SAME FROM STAGE 02: bucket_assignment()

Tensor DistributedDataParallel::forward(const Tensor& input) {
  return module_->forward(input);
}

void DistributedDataParallel::sync_grads() {
  // The copies below are bookkeeping, not part of any graph.
  tp::NoGradGuard no_grad;
  // EXERCISE: average every gradient over all ranks with one all-reduce
  // (SUM) per bucket. Launch every bucket's all-reduce before waiting for
  // any, so they queue back to back on the communication thread. A
  // parameter without a gradient contributes zeros, never what its slot
  // held last step; after the sync every parameter's gradient holds the
  // average (set one where there was none).
  throw tp::NotImplemented("stage 02: DistributedDataParallel::sync_grads is not implemented yet (exercises/02-bucketing/ddp.cc)");
}

}  // namespace stage02
