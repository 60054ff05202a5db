// Exercise generated from solutions/10-fsdp/ddp.cc by tools/gen_exercise.py.
// Fill in each EXERCISE, then run ./kit check 10. ./kit reset 10 restores this file.
// Stage 10 — FullyShardedDataParallel (see ddp.h).
#include "ddp.h"

#include <cmath>
#include <utility>

#include "tensorplay/autograd/engine.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/autograd/node.h"
#include "tensorplay/distributed/model_check.h"
#include "tensorplay/error.h"
#include "tensorplay/memory.h"
#include "tensorplay/trace.h"

namespace stage10 {

using tp::Tensor;

// Note [One unit's step]
// Take unit u of a FULL_SHARD model on W ranks, in one training step:
//   forward   pre-hook: all-gather u's shards into full() (allocated now);
//             u's parameters view it. u computes. Hook: free full()'s
//             bytes; hook u's output so that u's backward starts with us.
//   backward  u's output hook: all-gather again (full() was freed); make a
//             zeroed full gradient and point u's parameters' .grad at it,
//             so autograd accumulates there. u's backward runs. When the
//             last of u's parameters has its gradient (post-accumulate
//             hooks, as stage 03's buckets): reduce-scatter the full
//             gradient, so this rank receives the sum of its shard over
//             the ranks; free full() again.
//   end of backward (a queued callback): wait for the last reduce-scatter;
//             every shard's sum, divided by W, is in local_shard().grad.
//   step      the optimizer updates local_shard(): 1/W of the parameters,
//             with 1/W of the gradients and of the momentum.
// SHARD_GRAD_OP skips the free after forward and so the second all-gather;
// NO_SHARD never frees and all-reduces instead of reduce-scattering. At any
// moment a rank holds its shards plus the units being computed (and, with
// prefetch, the next): that is FSDP's memory saving.
//
// Note [Pre-backward hook]
// A unit's backward has no event of its own in autograd: it starts when
// the gradient of the unit's output arrives. So the forward hook replaces
// the output by an alias whose grad_fn is a node that runs the hook and
// passes the gradient through: autograd reaches it before any node inside
// the unit (they all depend on it), and never reaches it twice. PyTorch
// registers a tensor hook on the outputs for the same effect.
//
// Note [One reduction in flight]
// Each unit's reduction is issued as soon as its gradient is complete and
// runs on the communication thread while autograd computes the next unit:
// that is the overlap of stage 03. Before issuing the next one we wait for
// it and let its full gradient go, so at most two units' full gradients
// are alive at once (the one being reduced, the one being computed)
// instead of every unit's by the end of backward. PyTorch leaves them all
// in flight on its stream and relies on the caching allocator's
// record_stream to reuse the memory; the kit's CPU tensors have no such
// allocator, so the bound is kept by waiting.
//
// Note [no_sync keeps whole gradients]
// Under no_sync a unit's gradient is not reduced: the full gradient stays,
// its parameters' .grad keep viewing it, and the next backward accumulates
// into it. So no_sync costs a whole unsharded model of gradients per rank
// (as in PyTorch's FSDP, whose no_sync docs warn of it): the price of
// accumulating without communicating. The parameters are still freed
// after use.

namespace {

// The node of Note [Pre-backward hook]: identity, running `hook` first.
class PreBackwardHook : public tp::autograd::Node {
 public:
  explicit PreBackwardHook(std::function<void()> hook) : hook_(std::move(hook)) {}
  std::string name() const override { return "FSDPPreBackwardHook"; }
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    hook_();
    return {grad_output};
  }

 private:
  std::function<void()> hook_;
};

// An alias of `output` whose backward runs `hook` before output's own.
Tensor with_pre_backward_hook(const Tensor& output, std::function<void()> hook) {
  // EXERCISE: a PreBackwardHook node whose one input is `output`, and a new
  // tensor that aliases output's data (same storage, offset, shape,
  // strides, dtype) and has that node as its grad_fn: autograd then passes
  // through the node before anything that produced output.
  throw tp::NotImplemented("stage 10: with_pre_backward_hook is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

bool is_sharded(ShardingStrategy strategy) { return strategy != ShardingStrategy::NO_SHARD; }

}  // namespace

std::string to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::FULL_SHARD: return "full_shard";
    case ShardingStrategy::SHARD_GRAD_OP: return "shard_grad_op";
    case ShardingStrategy::NO_SHARD: return "no_shard";
  }
  return "?";
}

std::string to_string(BackwardPrefetch prefetch) {
  switch (prefetch) {
    case BackwardPrefetch::NONE: return "none";
    case BackwardPrefetch::BACKWARD_PRE: return "backward_pre";
    case BackwardPrefetch::BACKWARD_POST: return "backward_post";
  }
  return "?";
}

NoSyncGuard::NoSyncGuard(FullyShardedDataParallel& fsdp)
    : fsdp_(&fsdp), previous_(fsdp.require_backward_grad_sync_) {
  fsdp.require_backward_grad_sync_ = false;
}

NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : fsdp_(other.fsdp_), previous_(other.previous_) {
  other.fsdp_ = nullptr;
}

NoSyncGuard::~NoSyncGuard() {
  if (fsdp_ != nullptr) fsdp_->require_backward_grad_sync_ = previous_;
}

FullyShardedDataParallel::FullyShardedDataParallel(
    std::shared_ptr<tp::nn::Module> module,
    std::shared_ptr<tp::distributed::ProcessGroup> process_group, Options options)
    : module_(std::move(module)),
      process_group_(std::move(process_group)),
      options_(std::move(options)) {
  TP_CHECK(module_ != nullptr, "stage10 FSDP: module is null");
  TP_CHECK(process_group_ != nullptr, "stage10 FSDP: process_group is null");
  if (!options_.auto_wrap_policy.should_wrap) {
    TP_CHECK(options_.auto_wrap_policy.name.empty(), "stage10 FSDP: auto_wrap_policy '",
             options_.auto_wrap_policy.name, "' has no should_wrap; pass one (wrap.h)");
    options_.auto_wrap_policy = linear_wrap_policy();
  }
  tp::distributed::verify_same_tensors_on_all_ranks(*process_group_, module_->named_parameters(),
                                                    "stage10 FSDP");
  if (options_.sync_module_states) {
    tp::NoGradGuard no_grad;
    for (const Tensor& p : module_->parameters()) process_group_->broadcast(p, 0)->wait();
    for (const Tensor& b : module_->buffers()) process_group_->broadcast(b, 0)->wait();
  } else {
    check_same_values();
  }
  // EXERCISE: cut the model into units by the policy (wrap.h), one flat
  // parameter each (sharded but under NO_SHARD), with its state; note the
  // root unit's index. Then the hooks.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::FullyShardedDataParallel is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

FullyShardedDataParallel::~FullyShardedDataParallel() = default;

// Sums of every parameter's values (plain, and weighted by position) from
// every rank: equal values give bit-equal sums, so a rank whose model
// differs is found without sending the model.
void FullyShardedDataParallel::check_same_values() {
  const std::vector<tp::nn::NamedTensor> params = module_->named_parameters();
  const int64_t n = static_cast<int64_t>(params.size());
  const int world = process_group_->size();
  // EXERCISE: two sums per parameter (its values, and its values weighted
  // by position, in double), all-gathered with one collective; name the
  // first parameter whose sums on some rank differ from rank 0's, on every
  // rank (tp::DistributedError, saying how to fix it).
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::check_same_values is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

void FullyShardedDataParallel::register_hooks() {
  // EXERCISE: for each unit, a forward pre-hook and a forward hook on its
  // module (the root unit has none: forward() calls its two itself) that
  // call pre_forward and post_forward, and on each of its parameters a
  // post-accumulate-grad hook that calls on_grad_ready with the
  // parameter's slot. Keep every handle in the unit's state.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::register_hooks is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

Tensor FullyShardedDataParallel::forward(const Tensor& input) {
  TP_CHECK(!in_summon_, "stage10 FSDP: forward inside summon_full_params(); let the guard go "
           "first");
  if (backward_pending_) {
    TP_THROW(tp::DistributedError, "stage10 FSDP (rank ", process_group_->rank(),
             "): the previous backward did not finish (an exception left units gathered or "
             "gradients unreduced); this FSDP cannot train on");
  }
  // EXERCISE: run the model between the root unit's hooks (its module is
  // the model itself, which has no hooks of ours; the other units' hooks
  // run inside). The first forward records the units' order as pre_forward
  // meets them (recording_ into forward_order_, and each unit's position_),
  // which prefetching follows from then on. Hook the output so that the
  // backward's first node marks a backward as pending and queues
  // finish_backward() for its end.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::forward is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

std::vector<Tensor> FullyShardedDataParallel::parameters() const {
  std::vector<Tensor> shards;
  // EXERCISE: what the optimizer steps.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::parameters is not implemented yet (exercises/10-fsdp/ddp.cc)");
  return shards;
}

void FullyShardedDataParallel::join(const std::function<void()>&) {
  TP_THROW(tp::Error, "stage10 FSDP: join() is not offered: PyTorch's FullyShardedDataParallel "
           "has no Join either (a rank that runs out of inputs would have to shadow every "
           "unit's all-gathers and reduce-scatters); give every rank the same number of "
           "batches (stage 07 and 09 shadow a DDP's collectives)");
}

void FullyShardedDataParallel::pre_forward(size_t u) {
  if (forward_order_.empty()) recording_.push_back(u);
  tp::trace::Span span("fsdp pre-forward", "fsdp", {{"unit", static_cast<int64_t>(u)}});
  // EXERCISE: unit u is about to compute: its parameters must hold the
  // whole unit. With forward_prefetch, also start gathering the unit that
  // runs next (next_in_order), so that its all-gather overlaps u's compute.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::pre_forward is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

Tensor FullyShardedDataParallel::post_forward(size_t u, const Tensor& output) {
  // EXERCISE: unit u has computed. Free what the strategy frees after
  // forward (frees_after_forward), and return the output hooked (Note
  // [Pre-backward hook]) so that u's backward begins with pre_backward(u);
  // an output that needs no gradient has no backward to hook.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::post_forward is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

void FullyShardedDataParallel::pre_backward(size_t u) {
  UnitState& s = state_[u];
  if (s.backward_begun) return;
  s.backward_begun = true;
  tp::trace::Span span("fsdp pre-backward", "fsdp", {{"unit", static_cast<int64_t>(u)}});
  // EXERCISE: unit u's backward is about to run: it needs the whole unit
  // again, and a full gradient for autograd to accumulate into (unless
  // no_sync left one: Note [no_sync keeps whole gradients]). With
  // BACKWARD_PRE, start gathering the unit whose backward comes next.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::pre_backward is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

void FullyShardedDataParallel::on_grad_ready(size_t u, size_t slot) {
  UnitState& s = state_[u];
  FlatParameter& unit = *units_[u];
  // EXERCISE: count the unit's parameters whose gradient is final (each
  // once: ready); go on only when the last of them has arrived.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::on_grad_ready is not implemented yet (exercises/10-fsdp/ddp.cc)");
  // Every gradient of the unit is in its full gradient.
  const std::string outside = s.full_grad.defined() ? unit.grad_outside(s.full_grad)
                                                    : unit.slots()[slot].name;
  if (!outside.empty()) {
    TP_THROW(tp::DistributedError, "stage10 FSDP (rank ", process_group_->rank(), "): ",
             outside, " got its gradient outside unit '", unit_name(u), "''s backward (used "
             "outside the unit's forward?); FSDP needs each unit's parameters used only by its "
             "own module's forward");
  }
  // EXERCISE: the unit's gradient is complete. Reduce it (unless under
  // no_sync), free the gathered parameters (its backward is over), and with
  // BACKWARD_POST start gathering the unit whose backward comes next.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::on_grad_ready is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

void FullyShardedDataParallel::reduce_gradient(size_t u) {
  // Note [One reduction in flight]
  for (PendingReduction& pending : pending_) finish_reduction(pending);
  pending_.clear();
  UnitState& s = state_[u];
  FlatParameter& unit = *units_[u];
  // EXERCISE: issue the reduction of the unit's full gradient, without
  // waiting for it: sharded, a reduce-scatter into a new gradient shard
  // (gradient memory) so that this rank receives the sum of its shard;
  // NO_SHARD, an all-reduce in place. The unit gives up its full gradient
  // to the reduction (and its parameters' .grad, which view it); record it
  // in pending_ for finish_reduction.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::reduce_gradient is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

void FullyShardedDataParallel::finish_reduction(PendingReduction& pending) {
  tp::NoGradGuard no_grad;
  // EXERCISE: once the reduction has finished, the sum becomes the average
  // (divided as DDP divides) and is added to the unit's shard's .grad (or
  // becomes it), as autograd would accumulate. Then the full gradient's
  // bytes go at once, not when its last handle does: the communication
  // thread may hold one a moment after wait() returns (memory.h), and the
  // peak would depend on that moment.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::finish_reduction is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

void FullyShardedDataParallel::finish_backward() {
  // EXERCISE: the last reduction must have landed before backward returns.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::finish_backward is not implemented yet (exercises/10-fsdp/ddp.cc)");
  // EXERCISE: every parameter of every unit must have had its gradient in
  // this backward (name those that did not, with their unit: there is no
  // find_unused_parameters here); then clear what each unit counted, for
  // the next backward.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::finish_backward is not implemented yet (exercises/10-fsdp/ddp.cc)");
  backward_pending_ = false;
}

void FullyShardedDataParallel::unshard(size_t u) {
  UnitState& s = state_[u];
  // EXERCISE: on return unit u is gathered: wait for its all-gather if one
  // is in flight (a prefetch), else gather it now unless it already is.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::unshard is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

void FullyShardedDataParallel::prefetch(size_t u) {
  UnitState& s = state_[u];
  FlatParameter& unit = *units_[u];
  // EXERCISE: unless unit u is gathered or being gathered, give full() its
  // bytes again and issue the all-gather of every rank's shard into it;
  // keep its Work in the unit's state, and do not wait.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::prefetch is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

void FullyShardedDataParallel::reshard(size_t u) {
  UnitState& s = state_[u];
  // EXERCISE: free unit u's gathered parameters; an all-gather still in
  // flight writes into those bytes, so it must land first.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::reshard is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

int64_t FullyShardedDataParallel::next_in_order(size_t u, int step) const {
  // EXERCISE: the unit `step` places after u in the recorded forward
  // order, or -1 (nothing recorded yet, or past either end).
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::next_in_order is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

bool FullyShardedDataParallel::frees_after_forward(size_t u) const {
  // EXERCISE: which strategy frees a unit as soon as its forward is done;
  // PyTorch keeps the root gathered from its forward to its backward: its
  // backward comes first, at once.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::frees_after_forward is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

std::string FullyShardedDataParallel::unit_name(size_t u) const {
  const std::string& name = units_[u]->unit();
  return name.empty() ? "(root)" : name;
}

FullParamsGuard FullyShardedDataParallel::summon_full_params() {
  std::vector<size_t> all(units_.size());
  for (size_t u = 0; u < all.size(); ++u) all[u] = u;
  return FullParamsGuard(*this, std::move(all));
}

FullParamsGuard FullyShardedDataParallel::summon_full_params(size_t unit) {
  TP_CHECK(unit < units_.size(), "stage10 FSDP: summon_full_params(", unit, "): there are ",
           units_.size(), " units");
  return FullParamsGuard(*this, {unit});
}

double FullyShardedDataParallel::clip_grad_norm_(double max_norm) {
  TP_CHECK(max_norm > 0, "stage10 FSDP: clip_grad_norm_: max_norm is ", max_norm,
           "; give a norm > 0");
  tp::NoGradGuard no_grad;
  // EXERCISE: the 2-norm of the whole model's gradient, from shards: each
  // element lives in one rank's shard (the padding is zero), so the
  // squares of the shards add up across ranks (NO_SHARD: every rank holds
  // them all already). Then scale every shard's gradient by
  // torch.nn.utils.clip_grad_norm_'s coefficient, max_norm / (norm + 1e-6),
  // when it is below 1, and return the norm.
  throw tp::NotImplemented("stage 10: FullyShardedDataParallel::clip_grad_norm_ is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

FullParamsGuard::FullParamsGuard(FullyShardedDataParallel& fsdp, std::vector<size_t> units)
    : fsdp_(&fsdp), units_(std::move(units)) {
  TP_CHECK(!tp::autograd::in_backward() && !fsdp.backward_pending_,
           "stage10 FSDP: summon_full_params() during backward");
  TP_CHECK(!fsdp.in_summon_, "stage10 FSDP: summon_full_params() inside summon_full_params()");
  fsdp.in_summon_ = true;
  // EXERCISE: gather each of units_, remembering (was_freed_) which were
  // not gathered before, so that the guard's end frees those again.
  throw tp::NotImplemented("stage 10: FullParamsGuard::FullParamsGuard is not implemented yet (exercises/10-fsdp/ddp.cc)");
}

FullParamsGuard::FullParamsGuard(FullParamsGuard&& other) noexcept
    : fsdp_(other.fsdp_), units_(std::move(other.units_)), was_freed_(std::move(other.was_freed_)) {
  other.fsdp_ = nullptr;
}

FullParamsGuard::~FullParamsGuard() {
  if (fsdp_ == nullptr) return;
  tp::NoGradGuard no_grad;
  for (size_t i = 0; i < units_.size(); ++i) {
    FlatParameter& unit = *fsdp_->units_[units_[i]];
    // Writeback (PyTorch's default): this rank's part of any change.
    if (unit.sharded()) unit.local_shard().detach().copy_(unit.full_shard_slice());
    if (was_freed_[i]) fsdp_->reshard(units_[i]);
  }
  fsdp_->in_summon_ = false;
}

}  // namespace stage10
