// Stage 04 — stage 03's overlapping DDP, plus no_sync for gradient
// accumulation. See ddp.h for the contract and lessons/04-no-sync/README.md
// for the why.
#include "ddp.h"

#include <algorithm>
#include <map>
#include <utility>

#include "tensorplay/autograd/engine.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/distributed/model_check.h"
#include "tensorplay/error.h"
#include "tensorplay/trace.h"

namespace stage04 {

using tp::Tensor;
using tp::distributed::ReduceOp;

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<tp::nn::Module> module,
    std::shared_ptr<tp::distributed::ProcessGroup> process_group, Options options)
    : module_(std::move(module)),
      process_group_(std::move(process_group)),
      options_(options) {
  // SAME FROM STAGE 02: check the arguments and the model
  TP_CHECK(module_ != nullptr, "stage04 DDP: the module is null; pass the model to wrap");
  TP_CHECK(process_group_ != nullptr,
           "stage04 DDP: the process group is null; call init_process_group first");
  TP_CHECK(options_.bucket_cap_mb > 0 && options_.first_bucket_cap_mb > 0,
           "stage04 DDP: bucket_cap_mb and first_bucket_cap_mb must be positive (got ",
           options_.bucket_cap_mb, " and ", options_.first_bucket_cap_mb,
           "); a tiny cap such as 1e-6 gives one bucket per parameter");
  params_ = module_->named_parameters();
  tp::distributed::verify_same_tensors_on_all_ranks(*process_group_, params_, "stage04 DDP");
  // END SAME FROM STAGE 02: check the arguments and the model
  broadcast_from_rank0();
  assign_buckets();
  // SAME FROM STAGE 03: register the hooks
  // [snippet:register-hooks]
  // One hook per parameter. It captures `this`, which is why this class can
  // be neither copied nor moved, and why hooks_ is its last member.
  for (size_t i = 0; i < params_.size(); ++i) {
    hooks_.push_back(params_[i].second.register_post_accumulate_grad_hook(
        [this, i](const Tensor& param) { on_gradient_ready(static_cast<int64_t>(i), param); }));
  }
  // [/snippet:register-hooks]
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

// SAME FROM STAGE 04: Note [Decided at forward]
// Note [Decided at forward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Whether a backward syncs is decided when its forward runs, and recorded
// there; the hooks read the record, never the guard. Three reasons:
//   - The idiom `{ auto g = ddp.no_sync(); loss = loss_fn(ddp(x), y); }
//     loss.backward();` ends the guard before backward. The forward is what
//     the user put under no_sync; its backward must not sync.
//   - The hooks need the answer at the first gradient, and every rank must
//     give the same one: the forward is where each rank's program says which
//     micro-batch it is on. Deciding at forward also gives later stages the
//     place to prepare a synced backward (stage 05 walks the forward's graph
//     there; PyTorch's reducer does both in prepare_for_backward).
//   - A decision read inside backward changes halfway if another thread
//     takes or drops a guard while backward runs; a record cannot.
// A backward that does not sync leaves .grad to the autograd engine, which
// adds each micro-batch's gradient into it in place (with
// gradient_as_bucket_view that is the bucket slot itself). The next synced
// backward then moves the sum into the buckets as stage 03 moves a single
// gradient: one all-reduce per bucket for all K micro-batches.
// END SAME FROM STAGE 04: Note [Decided at forward]
NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp) : ddp_(&ddp) {
  // EXERCISE: until this guard is destroyed, a forward must record "do not
  // sync" (the destructor below undoes what you do here; guards nest).
  // BEGIN SOLUTION
  previous_ = ddp.require_backward_grad_sync_;
  ddp.require_backward_grad_sync_ = false;
  // END SOLUTION
}

// SAME FROM STAGE 04: NoSyncGuard's move and destructor
NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : ddp_(std::exchange(other.ddp_, nullptr)), previous_(other.previous_) {}

NoSyncGuard::~NoSyncGuard() {
  // What the constructor found, not `true`: leaving an inner guard must not
  // end an outer one. A moved-from guard (ddp_ null) does nothing.
  if (ddp_ != nullptr) ddp_->require_backward_grad_sync_ = previous_;
}
// END SAME FROM STAGE 04: NoSyncGuard's move and destructor

Tensor DistributedDataParallel::forward([[maybe_unused]] const Tensor& input) {
  if (!unfinished_.empty()) {
    TP_THROW(tp::DistributedError, "stage04 DDP: rank ", process_group_->rank(),
             ": the previous backward did not finish reducing gradients (", unfinished_,
             "); every parameter must get a gradient in every backward, or pass "
             "find_unused_parameters = true (stage 05)");
  }
  // EXERCISE: record whether this forward's backward syncs (Note [Decided
  // at forward]), then run the module.
  // BEGIN SOLUTION
  sync_this_backward_ = require_backward_grad_sync_;
  return module_->forward(input);
  // END SOLUTION
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
  // EXERCISE: this parameter's gradient is final. In a backward that does
  // not sync, leave it where the engine put it (Note [Decided at forward]).
  // Otherwise do as stage 03's hook: queue finish_backward() for the end of
  // this backward (once per backward), put the gradient into its slot (with
  // gradient_as_bucket_view, make .grad a view of the slot), count it, and
  // launch the all-reduce (SUM, without waiting) of every bucket that is now
  // complete, strictly in bucket order (Note [Overlap]).
  // BEGIN SOLUTION
  if (!sync_this_backward_) return;  // accumulate locally: no slot, no count, no launch
  if (!callback_queued_) {
    callback_queued_ = true;
    tp::autograd::queue_callback([this] { finish_backward(); });
  }
  const Location at = locations_[static_cast<size_t>(index)];
  Bucket& bucket = buckets_[at.bucket];
  Slot& slot = bucket.slots[at.slot];
  TP_CHECK(!slot.arrived, "stage04 DDP: parameter ", index, " (",
           params_[static_cast<size_t>(index)].first,
           ") reached its bucket twice before the bucket was reduced: twice in one backward, "
           "or once from a backward under no_sync (whose hooks must not file gradients), or "
           "the last synced backward's end-of-backward callback never ran to reset the "
           "buckets (is it queued in every synced backward?)");
  slot.arrived = true;
  const Tensor grad = param.grad();
  if (!grad.is_alias_of(bucket.flat)) {
    slot.view.copy_(grad);
    if (options_.gradient_as_bucket_view) param.set_grad(slot.view);
  }
  --bucket.pending;
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& ready = buckets_[next_bucket_++];
    ready.work = process_group_->allreduce(ready.flat, ReduceOp::SUM);
  }
  // END SOLUTION
}

void DistributedDataParallel::finish_backward() {
  // EXERCISE: this callback belongs to synced backwards only. If it runs in
  // a backward whose forward ran under no_sync, the hooks filed what they
  // should have left alone: throw tp::DistributedError naming this rank and
  // saying so (which record the hooks must read), instead of reducing.
  // BEGIN SOLUTION
  if (!sync_this_backward_) {
    TP_THROW(tp::DistributedError, "stage04 DDP: rank ", process_group_->rank(),
             ": the end-of-backward callback ran in a backward whose forward ran under "
             "no_sync; the hooks of such a backward must return before queueing or filing "
             "anything (do they read what forward() recorded, not whether a guard is alive "
             "now?)");
  }
  // END SOLUTION
  // The hooks launch in bucket order, so every bucket has been launched
  // exactly when next_bucket_ has passed them all.
  if (next_bucket_ < buckets_.size()) throw_unfinished();
  // Wait, divide, copy back (unless .grad is the slot), reset: as stage 03.
  const int world_size = process_group_->size();
  for (Bucket& bucket : buckets_) {
    bucket.work->wait();
    bucket.work.reset();
    bucket.flat.div_(world_size);
    if (!options_.gradient_as_bucket_view) {
      tp::trace::Span span("copy back", "ddp");
      for (Slot& slot : bucket.slots) {
        params_[static_cast<size_t>(slot.param)].second.grad().copy_(slot.view);
      }
    }
    for (Slot& slot : bucket.slots) slot.arrived = false;
    bucket.pending = bucket.slots.size();
  }
  next_bucket_ = 0;
  callback_queued_ = false;
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
    TP_THROW(tp::DistributedError, "stage04 DDP: rank ", process_group_->rank(),
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
  TP_THROW(tp::DistributedError, "stage04 DDP: rank ", process_group_->rank(),
           ": backward ended with ", unfinished_,
           ", so its bucket's all-reduce was never launched; every parameter must get a "
           "gradient in every backward, or pass find_unused_parameters = true (stage 05)");
}
// END SAME FROM STAGE 03: the error for an unfinished backward

}  // namespace stage04
