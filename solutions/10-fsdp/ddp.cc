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
  // BEGIN SOLUTION
  auto node = std::make_shared<PreBackwardHook>(std::move(hook));
  node->add_next(output);
  const tp::TensorImpl& from = *output.impl();
  auto impl = std::make_shared<tp::TensorImpl>();
  impl->storage = from.storage;
  impl->offset = from.offset;
  impl->shape = from.shape;
  impl->strides = from.strides;
  impl->dtype = from.dtype;
  impl->requires_grad = true;
  impl->grad_fn = std::move(node);
  return Tensor(std::move(impl));
  // END SOLUTION
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
  // BEGIN SOLUTION
  const std::vector<UnitPlan> plans = plan_units(*module_, options_.auto_wrap_policy);
  for (const UnitPlan& plan : plans) {
    if (plan.module == nullptr) root_unit_ = static_cast<int64_t>(units_.size());
    units_.push_back(std::make_unique<FlatParameter>(
        plan.name, plan.params, process_group_->rank(), process_group_->size(),
        is_sharded(options_.sharding_strategy)));
    state_.emplace_back();
    state_.back().module = plan.module;
    state_.back().ready.assign(plan.params.size(), false);
  }
  position_.assign(units_.size(), -1);
  register_hooks();
  // END SOLUTION
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
  // BEGIN SOLUTION
  Tensor mine = tp::zeros({2 * n}, tp::kFloat64);
  double* row = mine.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<double> values = params[static_cast<size_t>(i)].second.to_vector();
    for (size_t k = 0; k < values.size(); ++k) {
      row[2 * i] += values[k];
      row[2 * i + 1] += values[k] * static_cast<double>(k + 1);
    }
  }
  Tensor all = tp::zeros({2 * n * world}, tp::kFloat64);
  process_group_->allgather_into_tensor(all, mine)->wait();
  const double* rows = all.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) {
    for (int r = 1; r < world; ++r) {
      const double* theirs = rows + 2 * n * r + 2 * i;
      if (theirs[0] != rows[2 * i] || theirs[1] != rows[2 * i + 1]) {
        TP_THROW(tp::DistributedError, "stage10 FSDP (rank ", process_group_->rank(),
                 "): parameter ", i, " (", params[static_cast<size_t>(i)].first,
                 ") holds different values on rank ", r, " than on rank 0; FSDP shards the "
                 "model as it finds it, so every rank must build the same values (the same "
                 "seed), or pass sync_module_states = true to broadcast rank 0's first");
      }
    }
  }
  // END SOLUTION
}

void FullyShardedDataParallel::register_hooks() {
  // EXERCISE: for each unit, a forward pre-hook and a forward hook on its
  // module (the root unit has none: forward() calls its two itself) that
  // call pre_forward and post_forward, and on each of its parameters a
  // post-accumulate-grad hook that calls on_grad_ready with the
  // parameter's slot. Keep every handle in the unit's state.
  // BEGIN SOLUTION
  for (size_t u = 0; u < units_.size(); ++u) {
    UnitState& s = state_[u];
    if (s.module != nullptr) {
      s.forward_hooks.push_back(s.module->register_forward_pre_hook(
          [this, u](tp::nn::Module&, const Tensor&) { pre_forward(u); }));
      s.forward_hooks.push_back(s.module->register_forward_hook(
          [this, u](tp::nn::Module&, const Tensor&, const Tensor& output) {
            return post_forward(u, output);
          }));
    }
    const std::vector<ParamSlot>& slots = units_[u]->slots();
    for (size_t i = 0; i < slots.size(); ++i) {
      s.grad_hooks.push_back(slots[i].param.register_post_accumulate_grad_hook(
          [this, u, i](const Tensor&) { on_grad_ready(u, i); }));
    }
  }
  // END SOLUTION
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
  // BEGIN SOLUTION
  const bool recording = forward_order_.empty();
  if (recording) recording_.clear();
  if (root_unit_ >= 0) pre_forward(static_cast<size_t>(root_unit_));
  Tensor output = (*module_)(input);
  if (root_unit_ >= 0) output = post_forward(static_cast<size_t>(root_unit_), output);
  if (recording) {
    forward_order_ = recording_;
    for (size_t p = 0; p < forward_order_.size(); ++p) {
      position_[forward_order_[p]] = static_cast<int64_t>(p);
    }
  }
  if (!output.requires_grad()) return output;  // no backward will follow
  return with_pre_backward_hook(output, [this] {
    backward_pending_ = true;
    tp::autograd::queue_callback([this] { finish_backward(); });
  });
  // END SOLUTION
}

std::vector<Tensor> FullyShardedDataParallel::parameters() const {
  std::vector<Tensor> shards;
  // EXERCISE: what the optimizer steps.
  // BEGIN SOLUTION
  for (const auto& unit : units_) shards.push_back(unit->local_shard());
  // END SOLUTION
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
  // BEGIN SOLUTION
  unshard(u);
  if (options_.forward_prefetch) {
    const int64_t next = next_in_order(u, +1);
    if (next >= 0) prefetch(static_cast<size_t>(next));
  }
  // END SOLUTION
}

Tensor FullyShardedDataParallel::post_forward(size_t u, const Tensor& output) {
  // EXERCISE: unit u has computed. Free what the strategy frees after
  // forward (frees_after_forward), and return the output hooked (Note
  // [Pre-backward hook]) so that u's backward begins with pre_backward(u);
  // an output that needs no gradient has no backward to hook.
  // BEGIN SOLUTION
  if (frees_after_forward(u)) reshard(u);
  if (!output.requires_grad()) return output;
  return with_pre_backward_hook(output, [this, u] { pre_backward(u); });
  // END SOLUTION
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
  // BEGIN SOLUTION
  unshard(u);
  if (!s.full_grad.defined()) s.full_grad = units_[u]->alloc_full_grad();
  if (options_.backward_prefetch == BackwardPrefetch::BACKWARD_PRE) {
    const int64_t next = next_in_order(u, -1);
    if (next >= 0) prefetch(static_cast<size_t>(next));
  }
  // END SOLUTION
}

void FullyShardedDataParallel::on_grad_ready(size_t u, size_t slot) {
  UnitState& s = state_[u];
  FlatParameter& unit = *units_[u];
  // EXERCISE: count the unit's parameters whose gradient is final (each
  // once: ready); go on only when the last of them has arrived.
  // BEGIN SOLUTION
  if (s.ready[slot]) return;
  s.ready[slot] = true;
  if (++s.grads_ready < static_cast<int64_t>(unit.slots().size())) return;
  // END SOLUTION
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
  // BEGIN SOLUTION
  if (require_backward_grad_sync_) reduce_gradient(u);
  reshard(u);
  if (options_.backward_prefetch == BackwardPrefetch::BACKWARD_POST) {
    const int64_t next = next_in_order(u, -1);
    if (next >= 0) prefetch(static_cast<size_t>(next));
  }
  // END SOLUTION
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
  // BEGIN SOLUTION
  PendingReduction pending;
  pending.unit = u;
  pending.input = std::move(s.full_grad);
  s.full_grad = Tensor();
  unit.clear_param_grads();  // they view the full gradient, which goes after the reduction
  if (unit.sharded()) {
    tp::memory::KindScope gradients(tp::memory::Kind::Gradient);
    pending.output = tp::empty({unit.shard_numel()}, unit.dtype(), unit.local_shard().device());
    pending.work = process_group_->reduce_scatter_tensor(pending.output, pending.input);
  } else {
    pending.output = pending.input;
    pending.work = process_group_->allreduce(pending.input);
  }
  s.reduced = true;
  pending_.push_back(std::move(pending));
  // END SOLUTION
}

void FullyShardedDataParallel::finish_reduction(PendingReduction& pending) {
  tp::NoGradGuard no_grad;
  // EXERCISE: once the reduction has finished, the sum becomes the average
  // (divided as DDP divides) and is added to the unit's shard's .grad (or
  // becomes it), as autograd would accumulate. Then the full gradient's
  // bytes go at once, not when its last handle does: the communication
  // thread may hold one a moment after wait() returns (memory.h), and the
  // peak would depend on that moment.
  // BEGIN SOLUTION
  pending.work->wait();
  pending.output.div_(static_cast<double>(process_group_->size()));
  const Tensor& shard = units_[pending.unit]->local_shard();
  Tensor grad = shard.grad();
  if (grad.defined()) {
    grad.add_(pending.output);
  } else {
    shard.set_grad(pending.output);
  }
  if (units_[pending.unit]->sharded()) pending.input.storage()->resize_(0);
  pending.input = Tensor();
  // END SOLUTION
}

void FullyShardedDataParallel::finish_backward() {
  // EXERCISE: the last reduction must have landed before backward returns.
  // BEGIN SOLUTION
  for (PendingReduction& pending : pending_) finish_reduction(pending);
  pending_.clear();
  // END SOLUTION
  // EXERCISE: every parameter of every unit must have had its gradient in
  // this backward (name those that did not, with their unit: there is no
  // find_unused_parameters here); then clear what each unit counted, for
  // the next backward.
  // BEGIN SOLUTION
  for (size_t u = 0; u < units_.size(); ++u) {
    UnitState& s = state_[u];
    const std::vector<ParamSlot>& slots = units_[u]->slots();
    std::string missing;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (!s.ready[i]) missing += (missing.empty() ? "" : ", ") + slots[i].name;
    }
    if (!missing.empty()) {
      TP_THROW(tp::DistributedError, "stage10 FSDP (rank ", process_group_->rank(),
               "): backward ended with no gradient for ", missing, " (unit '", unit_name(u),
               "'); every parameter must reach the loss in every backward (this stage has no "
               "find_unused_parameters)");
    }
    s.ready.assign(slots.size(), false);
    s.grads_ready = 0;
    s.backward_begun = false;
    s.reduced = false;
  }
  // END SOLUTION
  backward_pending_ = false;
}

void FullyShardedDataParallel::unshard(size_t u) {
  UnitState& s = state_[u];
  // EXERCISE: on return unit u is gathered: wait for its all-gather if one
  // is in flight (a prefetch), else gather it now unless it already is.
  // BEGIN SOLUTION
  if (!s.gather) {
    if (units_[u]->has_full()) return;
    prefetch(u);
  }
  s.gather->wait();
  s.gather.reset();
  // END SOLUTION
}

void FullyShardedDataParallel::prefetch(size_t u) {
  UnitState& s = state_[u];
  FlatParameter& unit = *units_[u];
  // EXERCISE: unless unit u is gathered or being gathered, give full() its
  // bytes again and issue the all-gather of every rank's shard into it;
  // keep its Work in the unit's state, and do not wait.
  // BEGIN SOLUTION
  if (s.gather || unit.has_full()) return;
  unit.alloc_full();
  s.gather = process_group_->allgather_into_tensor(unit.full(), unit.local_shard());
  // END SOLUTION
}

void FullyShardedDataParallel::reshard(size_t u) {
  UnitState& s = state_[u];
  // EXERCISE: free unit u's gathered parameters; an all-gather still in
  // flight writes into those bytes, so it must land first.
  // BEGIN SOLUTION
  if (s.gather) {
    s.gather->wait();
    s.gather.reset();
  }
  units_[u]->free_full();
  // END SOLUTION
}

int64_t FullyShardedDataParallel::next_in_order(size_t u, int step) const {
  // EXERCISE: the unit `step` places after u in the recorded forward
  // order, or -1 (nothing recorded yet, or past either end).
  // BEGIN SOLUTION
  if (forward_order_.empty() || position_[u] < 0) return -1;
  const int64_t q = position_[u] + step;
  if (q < 0 || q >= static_cast<int64_t>(forward_order_.size())) return -1;
  return static_cast<int64_t>(forward_order_[static_cast<size_t>(q)]);
  // END SOLUTION
}

bool FullyShardedDataParallel::frees_after_forward(size_t u) const {
  // EXERCISE: which strategy frees a unit as soon as its forward is done;
  // PyTorch keeps the root gathered from its forward to its backward: its
  // backward comes first, at once.
  // BEGIN SOLUTION
  return options_.sharding_strategy == ShardingStrategy::FULL_SHARD &&
         static_cast<int64_t>(u) != root_unit_;
  // END SOLUTION
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
  // BEGIN SOLUTION
  double sum_sq = 0.0;
  for (const auto& unit : units_) {
    const Tensor grad = unit->local_shard().grad();
    if (!grad.defined()) continue;
    const double norm = grad.norm();
    sum_sq += norm * norm;
  }
  if (is_sharded(options_.sharding_strategy)) {
    Tensor total = tp::tensor({sum_sq}, {1}, tp::kFloat64);
    process_group_->allreduce(total)->wait();
    sum_sq = total.item();
  }
  const double total_norm = std::sqrt(sum_sq);
  const double coefficient = max_norm / (total_norm + 1e-6);
  if (coefficient < 1.0) {
    for (const auto& unit : units_) {
      Tensor grad = unit->local_shard().grad();
      if (grad.defined()) grad.mul_(coefficient);
    }
  }
  return total_norm;
  // END SOLUTION
}

FullParamsGuard::FullParamsGuard(FullyShardedDataParallel& fsdp, std::vector<size_t> units)
    : fsdp_(&fsdp), units_(std::move(units)) {
  TP_CHECK(!tp::autograd::in_backward() && !fsdp.backward_pending_,
           "stage10 FSDP: summon_full_params() during backward");
  TP_CHECK(!fsdp.in_summon_, "stage10 FSDP: summon_full_params() inside summon_full_params()");
  fsdp.in_summon_ = true;
  // EXERCISE: gather each of units_, remembering (was_freed_) which were
  // not gathered before, so that the guard's end frees those again.
  // BEGIN SOLUTION
  for (size_t u : units_) {
    was_freed_.push_back(!fsdp.units_[u]->has_full() || fsdp.state_[u].gather != nullptr);
    fsdp.unshard(u);
  }
  // END SOLUTION
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
