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
  // BEGIN SOLUTION
  struct Open {
    std::vector<int64_t> params;
    int64_t bytes = 0;
    bool closed_one = false;  // this dtype has closed a bucket: the next gets bucket_cap_mb
  };
  std::map<tp::Dtype, Open> open;  // the bucket being filled, per dtype
  auto close = [&](std::vector<int64_t> members) {
    const Tensor& first = params_[static_cast<size_t>(members.front())].second;
    int64_t numel = 0;
    for (int64_t p : members) numel += params_[static_cast<size_t>(p)].second.numel();
    Bucket bucket;
    // On the parameters' device: on a GPU the bucket is filled by the
    // compute stream and all-reduced by the communication stream.
    bucket.flat = tp::zeros({numel}, first.dtype(), first.device());
    int64_t offset = 0;
    for (int64_t p : members) {
      const Tensor& param = params_[static_cast<size_t>(p)].second;
      bucket.slots.push_back(
          {p, offset, param.numel(), bucket.flat.narrow(0, offset, param.numel()).view(param.shape())});
      offset += param.numel();
    }
    buckets_.push_back(std::move(bucket));
  };
  for (auto p = static_cast<int64_t>(params_.size()) - 1; p >= 0; --p) {
    const Tensor& param = params_[static_cast<size_t>(p)].second;
    Open& bucket = open[param.dtype()];
    bucket.params.push_back(p);
    bucket.bytes += static_cast<int64_t>(param.nbytes());
    const double cap = bucket.closed_one ? options_.bucket_cap_mb : options_.first_bucket_cap_mb;
    if (bucket.bytes >= cap_bytes(cap)) {
      close(std::move(bucket.params));
      bucket.params.clear();  // a moved-from vector is valid but unspecified
      bucket.bytes = 0;
      bucket.closed_one = true;
    }
  }
  for (auto& [dtype, bucket] : open) {
    if (!bucket.params.empty()) close(std::move(bucket.params));
  }
  // END SOLUTION
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
  // BEGIN SOLUTION
  const int world_size = process_group_->size();
  std::vector<std::shared_ptr<tp::distributed::Work>> works;
  for (Bucket& bucket : buckets_) {
    for (Slot& slot : bucket.slots) {
      const Tensor grad = params_[static_cast<size_t>(slot.param)].second.grad();
      if (grad.defined()) {
        slot.view.copy_(grad);
      } else {
        slot.view.zero_();
      }
    }
    works.push_back(process_group_->allreduce(bucket.flat, ReduceOp::SUM));
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    works[b]->wait();
    Bucket& bucket = buckets_[b];
    bucket.flat.div_(world_size);
    for (Slot& slot : bucket.slots) {
      const Tensor& param = params_[static_cast<size_t>(slot.param)].second;
      if (param.grad().defined()) {
        param.grad().copy_(slot.view);
      } else {
        param.set_grad(slot.view.clone());
      }
    }
  }
  // END SOLUTION
}

}  // namespace stage02
