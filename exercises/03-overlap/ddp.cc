// Exercise generated from solutions/03-overlap/ddp.cc by tools/gen_exercise.py.
// Fill in each EXERCISE, then run ./kit check 03. ./kit reset 03 restores this file.
// Stage 03 — DDP that overlaps each bucket's all-reduce with the rest of
// backward. See ddp.h for the contract and lessons/03-overlap/README.md for
// the why.
#include "ddp.h"

#include <algorithm>
#include <map>

#include "tensorplay/autograd/engine.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/distributed/model_check.h"
#include "tensorplay/error.h"
#include "tensorplay/trace.h"

namespace stage03 {

using tp::Tensor;
using tp::distributed::ReduceOp;

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<tp::nn::Module> module,
    std::shared_ptr<tp::distributed::ProcessGroup> process_group, Options options)
    : module_(std::move(module)),
      process_group_(std::move(process_group)),
      options_(options) {
  // SAME FROM STAGE 02: check the arguments and the model
  TP_CHECK(module_ != nullptr, "stage03 DDP: the module is null; pass the model to wrap");
  TP_CHECK(process_group_ != nullptr,
           "stage03 DDP: the process group is null; call init_process_group first");
  TP_CHECK(options_.bucket_cap_mb > 0 && options_.first_bucket_cap_mb > 0,
           "stage03 DDP: bucket_cap_mb and first_bucket_cap_mb must be positive (got ",
           options_.bucket_cap_mb, " and ", options_.first_bucket_cap_mb,
           "); a tiny cap such as 1e-6 gives one bucket per parameter");
  params_ = module_->named_parameters();
  tp::distributed::verify_same_tensors_on_all_ranks(*process_group_, params_, "stage03 DDP");
  // END SAME FROM STAGE 02: check the arguments and the model
  broadcast_from_rank0();
  assign_buckets();
  // SAME FROM STAGE 03: register the hooks
  // EXERCISE: the hooks are what makes this stage overlap. Register one
  // post-accumulate-grad hook per parameter that calls on_gradient_ready()
  // with the parameter's index, and keep each handle in hooks_ (removing the
  // handles removes the hooks when the DDP goes). A hook runs long after
  // this constructor: think about what it may capture.
  throw tp::NotImplemented("stage 03: DistributedDataParallel::DistributedDataParallel is not implemented yet (exercises/03-overlap/ddp.cc)");
  // END SAME FROM STAGE 03: register the hooks
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

// SAME FROM STAGE 03: bucket assignment
// Note [Bucket assignment] is stage 02's (solutions/02-bucketing/ddp.cc):
// reverse registration order, a bucket closes once it holds at least its cap
// (first_bucket_cap_mb for the first), one dtype per bucket.
void DistributedDataParallel::assign_buckets() {
  struct Open {
    std::vector<int64_t> params;
    int64_t bytes = 0;
    bool closed_one = false;  // this dtype has closed a bucket: the next gets bucket_cap_mb
  };
  std::map<tp::Dtype, Open> open;  // the bucket being filled, per dtype
  locations_.resize(params_.size());
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
      locations_[static_cast<size_t>(p)] = {buckets_.size(), bucket.slots.size()};
      bucket.slots.push_back(
          {p, offset, param.numel(), bucket.flat.narrow(0, offset, param.numel()).view(param.shape())});
      offset += param.numel();
    }
    bucket.pending = bucket.slots.size();
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
}
// END SAME FROM STAGE 03: bucket assignment

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
  if (!unfinished_.empty()) {
    TP_THROW(tp::DistributedError, "stage03 DDP: rank ", process_group_->rank(),
             ": the previous backward did not finish reducing gradients (", unfinished_,
             "); every parameter must get a gradient in every backward, or pass "
             "find_unused_parameters = true (stage 05)");
  }
  return module_->forward(input);
}

// SAME FROM STAGE 03: Note [Overlap]
// Note [Overlap]
// ~~~~~~~~~~~~~~
// The autograd engine runs a parameter's post-accumulate-grad hook the moment
// its gradient is final, and it finishes the last layer's parameters first
// (Note [Ready order] in common/src/autograd/engine.cc). Buckets are filled in
// that same order, so bucket 0 is usually complete after a few hooks, and its
// all-reduce can travel while the engine computes every earlier layer. The
// hook launches (queues) it and returns at once; only the end-of-backward
// callback waits. Two rules keep the ranks in step:
//   - Launch strictly in bucket order: bucket b's all-reduce leaves only
//     after buckets 0..b-1 have, even if b happened to complete first. Every
//     rank then issues the same all-reduces in the same order, whatever order
//     its hooks ran in; launching "whatever is complete" could pair rank 0's
//     bucket 1 with rank 1's bucket 2 (or hang).
//   - Never wait in a hook: a wait there blocks the engine until the bucket
//     has crossed the network, which is exactly the serialisation overlap
//     removes.
// With gradient_as_bucket_view, the first time a gradient arrives in a step
// it is copied into its slot and the parameter's .grad is pointed at the
// slot; the average then lands in .grad without a copy back.
// END SAME FROM STAGE 03: Note [Overlap]
void DistributedDataParallel::on_gradient_ready(int64_t index, [[maybe_unused]] const Tensor& param) {
  tp::trace::Span span("hook", "ddp", {{"param", index}});
  // EXERCISE: this parameter's gradient is final. Queue finish_backward()
  // for the end of this backward (once per backward), put the gradient into
  // its slot (with gradient_as_bucket_view, make .grad a view of the slot),
  // count it, and launch the all-reduce (SUM, without waiting) of every
  // bucket that is now complete, strictly in bucket order (Note [Overlap]).
  throw tp::NotImplemented("stage 03: DistributedDataParallel::on_gradient_ready is not implemented yet (exercises/03-overlap/ddp.cc)");
}

void DistributedDataParallel::finish_backward() {
  // EXERCISE: backward is over. If a bucket is still waiting for a
  // gradient (a parameter got none), hand over to throw_unfinished(), which
  // says so on every rank. Otherwise wait for each bucket, divide it by the
  // world size, copy each slot back into its parameter's gradient (unless
  // .grad already is that slot), and reset the per-iteration state for the
  // next backward.
  throw tp::NotImplemented("stage 03: DistributedDataParallel::finish_backward is not implemented yet (exercises/03-overlap/ddp.cc)");
}

// SAME FROM STAGE 03: the error for an unfinished backward
void DistributedDataParallel::throw_unfinished() {
  // The parameters whose hook did not run: their buckets never completed.
  std::string missing;
  size_t count = 0;
  size_t first_unlaunched = buckets_.size();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!buckets_[b].work) first_unlaunched = std::min(first_unlaunched, b);
    for (const Slot& slot : buckets_[b].slots) {
      if (slot.arrived) continue;  // its hook ran this backward
      missing += (count++ ? ", " : "") + std::to_string(slot.param) + " (" +
                 params_[static_cast<size_t>(slot.param)].first + ")";
    }
  }
  if (count == 0) {
    // Every gradient arrived, yet a bucket was never launched: the
    // bookkeeping, not the model, is wrong. Not an unused parameter.
    for (Bucket& bucket : buckets_) {
      if (bucket.work) bucket.work->wait();
    }
    TP_THROW(tp::DistributedError, "stage03 DDP: rank ", process_group_->rank(),
             ": every gradient arrived in this backward, but bucket ", first_unlaunched,
             "'s all-reduce was never launched; is the per-iteration state (each bucket's "
             "pending count, the next bucket to launch) reset at the end of every backward?");
  }
  unfinished_ = "no gradient for parameter" + std::string(count > 1 ? "s " : " ") + missing;
  // Leave no all-reduce in flight: the launched buckets are the same on
  // every rank that skipped the same parameters.
  for (Bucket& bucket : buckets_) {
    if (bucket.work) bucket.work->wait();
    bucket.work.reset();
    for (Slot& slot : bucket.slots) slot.arrived = false;
    bucket.pending = bucket.slots.size();
  }
  next_bucket_ = 0;
  callback_queued_ = false;
  TP_THROW(tp::DistributedError, "stage03 DDP: rank ", process_group_->rank(),
           ": backward ended with ", unfinished_,
           ", so its bucket's all-reduce was never launched; every parameter must get a "
           "gradient in every backward, or pass find_unused_parameters = true (stage 05)");
}
// END SAME FROM STAGE 03: the error for an unfinished backward

}  // namespace stage03
