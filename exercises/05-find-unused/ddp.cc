// Exercise generated from solutions/05-find-unused/ddp.cc by tools/gen_exercise.py.
// Fill in each EXERCISE, then run ./kit check 05. ./kit reset 05 restores this file.
// Stage 05 — stage 04's DDP (overlap, no_sync) for models whose forward
// leaves some parameters unused: find_unused_parameters. See ddp.h for the
// contract and lessons/05-find-unused/README.md for the why.
#include "ddp.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include "tensorplay/autograd/engine.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/autograd/node.h"
#include "tensorplay/distributed/model_check.h"
#include "tensorplay/error.h"
#include "tensorplay/trace.h"

namespace stage05 {

using tp::Tensor;
using tp::distributed::ReduceOp;

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<tp::nn::Module> module,
    std::shared_ptr<tp::distributed::ProcessGroup> process_group, Options options)
    : module_(std::move(module)),
      process_group_(std::move(process_group)),
      options_(options) {
  // SAME FROM STAGE 02: check the arguments and the model
  TP_CHECK(module_ != nullptr, "stage05 DDP: the module is null; pass the model to wrap");
  TP_CHECK(process_group_ != nullptr,
           "stage05 DDP: the process group is null; call init_process_group first");
  TP_CHECK(options_.bucket_cap_mb > 0 && options_.first_bucket_cap_mb > 0,
           "stage05 DDP: bucket_cap_mb and first_bucket_cap_mb must be positive (got ",
           options_.bucket_cap_mb, " and ", options_.first_bucket_cap_mb,
           "); a tiny cap such as 1e-6 gives one bucket per parameter");
  params_ = module_->named_parameters();
  tp::distributed::verify_same_tensors_on_all_ranks(*process_group_, params_, "stage05 DDP");
  // END SAME FROM STAGE 02: check the arguments and the model
  used_map_ = tp::zeros({static_cast<int64_t>(params_.size())}, tp::kFloat32);
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
// SAME FROM STAGE 05: NoSyncGuard's constructor
NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp) : ddp_(&ddp) {
  // Until this guard is destroyed, forwards record "do not sync" (stage 04).
  previous_ = ddp.require_backward_grad_sync_;
  ddp.require_backward_grad_sync_ = false;
}
// END SAME FROM STAGE 05: NoSyncGuard's constructor

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
    TP_THROW(tp::DistributedError, "stage05 DDP: rank ", process_group_->rank(),
             ": the previous backward did not finish reducing gradients (", unfinished_,
             "); every parameter must get a gradient in every backward, or construct the DDP "
             "with find_unused_parameters = true");
  }
  sync_this_backward_ = require_backward_grad_sync_;
  Tensor output = module_->forward(input);
  // EXERCISE: with find_unused_parameters, a forward whose backward syncs
  // must leave behind which parameters its output does not reach, for the
  // first hook to file (Note [Finding unused parameters]).
  throw tp::NotImplemented("stage 05: DistributedDataParallel::forward is not implemented yet (exercises/05-find-unused/ddp.cc)");
  return output;
}

// SAME FROM STAGE 05: Note [Finding unused parameters]
// Note [Finding unused parameters]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A parameter's hook runs when backward accumulates its gradient. One the
// output does not depend on gets no gradient, its hook never runs, and its
// bucket never completes: every rank would wait for it. The forward knows
// which parameters those are, because it built the graph backward will
// run: starting from the output's grad_fn and following next_functions, the
// walk reaches the AccumulateGrad node of every parameter the output
// depends on (each records its parameter: variable()). Whatever it does not
// reach gets no gradient in this backward. Starting anywhere else is wrong:
// from the parameters, every one of them "reaches" its own accumulator.
//
// Those parameters are filed into their buckets at the first hook of the
// backward, not in forward: filed in forward, a bucket made only of unused
// parameters would be launched before backward has even begun, ahead of
// buckets the hooks fill later, and a forward run to evaluate, never
// followed by a backward, would leave all-reduces in flight. Filed at the
// first hook, they are in their slots before the hooks that complete their
// buckets run. A filed parameter brings what its .grad holds: zeros when it
// has none, or what it accumulated under no_sync in earlier micro-batches
// of the step (its hooks ran then, and the used-map remembers it).
//
// Zeros are right for the average but not for a parameter no rank used:
// PyTorch leaves such a parameter without a gradient, so that the optimizer
// skips it (no momentum, no weight decay) instead of stepping it with a
// zero gradient. Telling the two apart takes one more all-reduce: the
// used-map, 1 where a parameter got a gradient on this rank since the last
// sync, summed over the ranks. It is launched right after the last bucket
// (every rank then issues the same all-reduces in the same order), and read
// at the end of backward: a parameter with a count of 0 keeps no gradient.
// END SAME FROM STAGE 05: Note [Finding unused parameters]
std::vector<int64_t> DistributedDataParallel::unreached_parameters(const Tensor& output) const {
  // EXERCISE: walk the graph from `output` to the gradient accumulators
  // (tensorplay/autograd/node.h) and return the indices into params_ of
  // the parameters the walk does not reach.
  throw tp::NotImplemented("stage 05: DistributedDataParallel::unreached_parameters is not implemented yet (exercises/05-find-unused/ddp.cc)");
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
void DistributedDataParallel::on_gradient_ready(int64_t index, const Tensor& param) {
  tp::trace::Span span("hook", "ddp", {{"param", index}});
  used_map_.data_ptr<float>()[index] = 1.0f;  // used since the last sync, no_sync or not
  if (!sync_this_backward_) return;  // accumulate locally (Note [Decided at forward])
  if (!callback_queued_) {
    callback_queued_ = true;
    tp::autograd::queue_callback([this] { finish_backward(); });
    // EXERCISE: this is the first hook of a synced backward. File the
    // parameters the forward found unused, so that their buckets can
    // complete (Note [Finding unused parameters]).
    throw tp::NotImplemented("stage 05: DistributedDataParallel::on_gradient_ready is not implemented yet (exercises/05-find-unused/ddp.cc)");
  }
  file_gradient(index, param.grad());
}

void DistributedDataParallel::file_gradient(int64_t index, const Tensor& grad) {
  const Location at = locations_[static_cast<size_t>(index)];
  Bucket& bucket = buckets_[at.bucket];
  Slot& slot = bucket.slots[at.slot];
  TP_CHECK(!slot.arrived, "stage05 DDP: parameter ", index, " (",
           params_[static_cast<size_t>(index)].first,
           ") reached its bucket twice before the bucket was reduced: its hook ran although "
           "the forward found it unused, or it ran twice in one backward");
  slot.arrived = true;
  if (!grad.defined()) {
    slot.view.zero_();  // unused here: this rank adds nothing
  } else if (!grad.is_alias_of(bucket.flat)) {
    slot.view.copy_(grad);
    if (options_.gradient_as_bucket_view) params_[static_cast<size_t>(index)].second.set_grad(slot.view);
  }
  --bucket.pending;
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& ready = buckets_[next_bucket_++];
    ready.work = process_group_->allreduce(ready.flat, ReduceOp::SUM);
  }
  // After the last bucket, on every rank in the same place: the used-map.
  if (next_bucket_ == buckets_.size() && options_.find_unused_parameters && !used_map_work_) {
    used_map_work_ = process_group_->allreduce(used_map_, ReduceOp::SUM);
  }
}

void DistributedDataParallel::finish_backward() {
  if (!sync_this_backward_) {
    TP_THROW(tp::DistributedError, "stage05 DDP: rank ", process_group_->rank(),
             ": the end-of-backward callback ran in a backward whose forward ran under "
             "no_sync; the hooks of such a backward must return before queueing or filing "
             "anything (do they read what forward() recorded, not whether a guard is alive "
             "now?)");
  }
  // The hooks launch in bucket order, so every bucket has been launched
  // exactly when next_bucket_ has passed them all.
  if (next_bucket_ < buckets_.size()) throw_unfinished();
  const int world_size = process_group_->size();
  const float* used = nullptr;  // [p]: ranks that used p; null without the option
  if (used_map_work_) {
    used_map_work_->wait();
    used_map_work_.reset();
    used = used_map_.data_ptr<float>();
  }
  // EXERCISE: wait for every bucket and divide it by the world size. Then
  // give each parameter its average: copied back, or .grad pointed at its
  // slot with gradient_as_bucket_view (a parameter unused here may have no
  // .grad yet). A parameter no rank used keeps no gradient at all.
  throw tp::NotImplemented("stage 05: DistributedDataParallel::finish_backward is not implemented yet (exercises/05-find-unused/ddp.cc)");
  for (Bucket& bucket : buckets_) {
    for (Slot& slot : bucket.slots) slot.arrived = false;
    bucket.pending = bucket.slots.size();
  }
  if (used != nullptr && !warned_all_used_) {
    warned_all_used_ = true;
    warn_if_nothing_unused(used);
  }
  used_map_.zero_();
  next_bucket_ = 0;
  callback_queued_ = false;
}

// SAME FROM STAGE 05: the note when nothing is unused
void DistributedDataParallel::warn_if_nothing_unused(const float* used) const {
  const int world_size = process_group_->size();
  for (size_t p = 0; p < params_.size(); ++p) {
    if (used[p] != static_cast<float>(world_size)) return;  // someone left it unused
  }
  if (process_group_->rank() != 0) return;
  std::fprintf(stderr,
               "stage05 DDP: find_unused_parameters = true, but every parameter got a gradient "
               "on every rank in the first synced backward. The option walks the autograd "
               "graph after every forward; if no parameter ever goes unused, pass "
               "find_unused_parameters = false.\n");
}
// END SAME FROM STAGE 05: the note when nothing is unused

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
    TP_THROW(tp::DistributedError, "stage05 DDP: rank ", process_group_->rank(),
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
  used_map_.zero_();
  unused_.clear();
  next_bucket_ = 0;
  callback_queued_ = false;
  if (options_.find_unused_parameters) {
    TP_THROW(tp::DistributedError, "stage05 DDP: rank ", process_group_->rank(),
             ": backward ended with ", unfinished_,
             " although find_unused_parameters is on: the forward's graph walk did not list "
             "them as unused (does it start from the output's grad_fn?), or the first hook "
             "did not file them (Note [Finding unused parameters])");
  }
  TP_THROW(tp::DistributedError, "stage05 DDP: rank ", process_group_->rank(),
           ": backward ended with ", unfinished_,
           ", so its bucket's all-reduce was never launched; every parameter must get a "
           "gradient in every backward, or construct the DDP with find_unused_parameters = "
           "true");
}

}  // namespace stage05
