// Stage 07 — stage 06's DDP, plus join() for uneven inputs. See ddp.h for
// the contract and lessons/07-join/README.md for the why.
#include "ddp.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "tensorplay/autograd/engine.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/autograd/node.h"
#include "tensorplay/distributed/model_check.h"
#include "tensorplay/error.h"
#include "tensorplay/trace.h"

namespace stage07 {

using tp::Tensor;
using tp::distributed::ReduceOp;

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<tp::nn::Module> module,
    std::shared_ptr<tp::distributed::ProcessGroup> process_group, Options options)
    : module_(std::move(module)),
      process_group_(std::move(process_group)),
      options_(options) {
  // SAME FROM STAGE 02: check the arguments and the model
  TP_CHECK(module_ != nullptr, "stage07 DDP: the module is null; pass the model to wrap");
  TP_CHECK(process_group_ != nullptr,
           "stage07 DDP: the process group is null; call init_process_group first");
  TP_CHECK(options_.bucket_cap_mb > 0 && options_.first_bucket_cap_mb > 0,
           "stage07 DDP: bucket_cap_mb and first_bucket_cap_mb must be positive (got ",
           options_.bucket_cap_mb, " and ", options_.first_bucket_cap_mb,
           "); a tiny cap such as 1e-6 gives one bucket per parameter");
  params_ = module_->named_parameters();
  tp::distributed::verify_same_tensors_on_all_ranks(*process_group_, params_, "stage07 DDP");
  // END SAME FROM STAGE 02: check the arguments and the model
  used_map_ = tp::zeros({static_cast<int64_t>(params_.size())}, tp::kFloat32);
  broadcast_from_rank0();
  std::vector<int64_t> reverse_registration;
  for (auto p = static_cast<int64_t>(params_.size()) - 1; p >= 0; --p) {
    reverse_registration.push_back(p);
  }
  assign_buckets(reverse_registration);
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

// SAME FROM STAGE 06: bucket assignment in a given order
// Note [Bucket assignment] is stage 02's (solutions/02-bucketing/ddp.cc): a
// bucket closes once it holds at least its cap (first_bucket_cap_mb for the
// first of each dtype), one dtype per bucket. Here the parameters come in `order`: reverse
// registration order at construction, the order their gradients became ready
// after the first iteration (Note [Rebuilding the buckets]).
void DistributedDataParallel::assign_buckets(const std::vector<int64_t>& order) {
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
  buckets_.clear();
  for (int64_t p : order) {
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
// END SAME FROM STAGE 06: bucket assignment in a given order

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
    TP_THROW(tp::DistributedError, "stage07 DDP: rank ", process_group_->rank(),
             ": the previous backward did not finish reducing gradients (", unfinished_,
             "); every parameter must get a gradient in every backward, or construct the DDP "
             "with find_unused_parameters = true");
  }
  sync_this_backward_ = require_backward_grad_sync_;
  // Inside join(), a forward whose backward syncs first tells the ranks that
  // this one is still training (Note [Join]).
  if (sync_this_backward_ && joining_) notify_join();
  Tensor output = module_->forward(input);
  // The unused parameters, as stage 06 (with static_graph, once).
  if (sync_this_backward_) {
    if (options_.static_graph && synced_iterations_ > 0) {
      unused_ = static_unused_;
    } else if (options_.static_graph || options_.find_unused_parameters) {
      unused_ = unreached_parameters(output);
    }
  }
  return output;
}

// SAME FROM STAGE 06: Note [Static graph] and the counted walk
// Note [Static graph]
// ~~~~~~~~~~~~~~~~~~~
// find_unused_parameters pays twice in every step: a walk of the graph after
// the forward, and an all-reduce of the used-map after the buckets. Both
// answer questions whose answers, for most models, never change: which
// parameters this rank's forward leaves unused, and which no rank uses.
// static_graph = true promises they do not change, and the DDP asks them
// once: in the first synced iteration it walks the graph and all-reduces the
// used-map as stage 05 does, and keeps both answers (static_unused_,
// static_used_). Every later synced iteration files the same unused
// parameters at its first hook, leaves the same parameters without a
// gradient, and communicates nothing but its buckets.
//
// A promise can be broken. A parameter recorded as unused whose gradient
// arrives anyway, or a parameter recorded as used whose gradient does not,
// means the graph changed: the buckets and the used-map of the first
// iteration no longer describe this one. Both are detected on the rank that
// sees them (in the hook; at the end of backward) and thrown as clear errors;
// never averaged silently with a stale map.
std::vector<int64_t> DistributedDataParallel::unreached_parameters(const Tensor& output) {
  // Counted on the trace: with static_graph, only the first synced forward
  // walks.
  tp::trace::Span span("graph walk", "ddp");
  return walk_graph(output);
}
// END SAME FROM STAGE 06: Note [Static graph] and the counted walk

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
// SAME FROM STAGE 06: the graph walk
std::vector<int64_t> DistributedDataParallel::walk_graph(const Tensor& output) const {
  // As stage 05: from the output's grad_fn to the accumulators.
  std::set<const tp::TensorImpl*> reached;
  std::set<const tp::autograd::Node*> seen;
  std::vector<const tp::autograd::Node*> stack;
  if (output.grad_fn()) stack.push_back(output.grad_fn().get());
  while (!stack.empty()) {
    const tp::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;  // shared subgraphs: visit once
    if (const auto* sink = dynamic_cast<const tp::autograd::AccumulateGrad*>(node)) {
      reached.insert(sink->variable().impl());
    }
    for (const auto& next : node->next_functions()) {
      if (next) stack.push_back(next.get());
    }
  }
  std::vector<int64_t> unreached;
  for (size_t p = 0; p < params_.size(); ++p) {
    if (reached.count(params_[p].second.impl()) == 0) unreached.push_back(static_cast<int64_t>(p));
  }
  return unreached;
}
// END SAME FROM STAGE 06: the graph walk

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
// SAME FROM STAGE 06: the hook
void DistributedDataParallel::on_gradient_ready(int64_t index, const Tensor& param) {
  tp::trace::Span span("hook", "ddp", {{"param", index}});
  used_map_.data_ptr<float>()[index] = 1.0f;  // used since the last sync, no_sync or not
  if (!sync_this_backward_) return;  // accumulate locally (Note [Decided at forward])
  if (options_.static_graph && synced_iterations_ > 0 && static_unused_here_[index]) {
    TP_THROW(tp::DistributedError, "stage07 DDP: rank ", process_group_->rank(),
             ": static_graph: parameter ", index, " (", params_[static_cast<size_t>(index)].first,
             ") got a gradient, but the first iteration found it unused on this rank: the "
             "graph changed, or the record of the first iteration (static_unused_here_) is "
             "not what it found (Note [Static graph]); with parameters that are used in some "
             "iterations and not in others, pass find_unused_parameters = true instead");
  }
  if (!callback_queued_) {
    callback_queued_ = true;
    tp::autograd::queue_callback([this] { finish_backward(); });
    // The first hook of a synced backward files the unused parameters
    // (stage 05, Note [Finding unused parameters]).
    for (int64_t unused : unused_) {
      file_gradient(unused, params_[static_cast<size_t>(unused)].second.grad());
    }
    if (synced_iterations_ == 0) first_unused_ = unused_;  // static_graph keeps it
    unused_.clear();
  }
  file_gradient(index, param.grad());
}
// END SAME FROM STAGE 06: the hook

// SAME FROM STAGE 06: file a gradient
void DistributedDataParallel::file_gradient(int64_t index, const Tensor& grad) {
  const Location at = locations_[static_cast<size_t>(index)];
  Bucket& bucket = buckets_[at.bucket];
  Slot& slot = bucket.slots[at.slot];
  TP_CHECK(!slot.arrived, "stage07 DDP: parameter ", index, " (",
           params_[static_cast<size_t>(index)].first,
           ") reached its bucket twice before the bucket was reduced: its hook ran although "
           "the forward found it unused, or it ran twice in one backward");
  slot.arrived = true;
  if (!rebuilt_) ready_order_.push_back(index);  // Note [Rebuilding the buckets]
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
  // After the last bucket, on every rank in the same place: the used-map
  // (with static_graph, in the first synced iteration only).
  const bool wants_used_map = options_.static_graph ? synced_iterations_ == 0
                                                    : options_.find_unused_parameters;
  if (next_bucket_ == buckets_.size() && wants_used_map && !used_map_work_) {
    used_map_work_ = process_group_->allreduce(used_map_, ReduceOp::SUM);
  }
}
// END SAME FROM STAGE 06: file a gradient

void DistributedDataParallel::finish_backward() {
  if (!sync_this_backward_) {
    TP_THROW(tp::DistributedError, "stage07 DDP: rank ", process_group_->rank(),
             ": the end-of-backward callback ran in a backward whose forward ran under "
             "no_sync; the hooks of such a backward must return before queueing or filing "
             "anything (do they read what forward() recorded, not whether a guard is alive "
             "now?)");
  }
  // The hooks launch in bucket order, so every bucket has been launched
  // exactly when next_bucket_ has passed them all.
  if (next_bucket_ < buckets_.size()) throw_unfinished();
  const float* used = nullptr;  // [p]: ranks that used p; null without the option
  if (used_map_work_) {
    used_map_work_->wait();
    used_map_work_.reset();
    used = used_map_.data_ptr<float>();
  } else if (options_.static_graph) {
    used = static_used_.data();  // what the first iteration found (Note [Static graph])
  }
  // Wait, divide, give each parameter its average; none where no rank used
  // it (stage 05).
  for (Bucket& bucket : buckets_) {
    bucket.work->wait();
    bucket.work.reset();
    bucket.flat.div_(divisor());
    for (Slot& slot : bucket.slots) {
      const Tensor& param = params_[static_cast<size_t>(slot.param)].second;
      if (used != nullptr && used[slot.param] == 0.0f) continue;  // no rank used it
      if (options_.gradient_as_bucket_view) {
        if (!param.grad().is_alias_of(bucket.flat)) param.set_grad(slot.view);
      } else if (param.grad().defined()) {
        param.grad().copy_(slot.view);
      } else {
        param.set_grad(slot.view.clone());
      }
    }
  }
  for (Bucket& bucket : buckets_) {
    for (Slot& slot : bucket.slots) slot.arrived = false;
    bucket.pending = bucket.slots.size();
  }
  if (options_.find_unused_parameters && !options_.static_graph && used != nullptr &&
      !warned_all_used_) {
    warned_all_used_ = true;
    warn_if_nothing_unused(used);
  }
  if (synced_iterations_ == 0) {
    if (options_.static_graph) {
      static_used_.assign(used, used + params_.size());
      static_unused_here_.assign(params_.size(), 0);
      for (int64_t p : first_unused_) static_unused_here_[static_cast<size_t>(p)] = 1;
      static_unused_ = first_unused_;
    }
    if (options_.static_graph || !options_.find_unused_parameters) rebuild_buckets();
  }
  ready_order_.clear();
  ++synced_iterations_;
  used_map_.zero_();
  next_bucket_ = 0;
  callback_queued_ = false;
}

// SAME FROM STAGE 06: Note [Rebuilding the buckets]
// Note [Rebuilding the buckets]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The constructor fills the buckets in reverse registration order, a guess
// at the order backward produces gradients. The guess is wrong whenever a
// module registers its layers in another order than forward uses them (a
// decoder built before the encoder, a shared head registered first): then a
// bucket waits for a gradient that comes late, and everything after it
// waits too, though their gradients are long ready. The first synced
// iteration shows the real order: the order in which gradients were filed
// (the unused parameters first, at the first hook, then hook after hook).
// After it, the buckets are rebuilt in that order with the same caps, as
// PyTorch's reducer does after its first iteration unless it is finding
// unused parameters every step (then the order may change from step to
// step, and it keeps the buckets it has).
//
// Each rank records its own order, and they may differ (a rank whose
// forward left other parameters unused files them first). Buckets that
// differ between ranks would pair different all-reduces, so rank 0's order
// is broadcast and every rank rebuilds from it. With gradient_as_bucket_view
// the .grad of each parameter is a view of the old bucket: its value is
// copied into the new slot and .grad pointed there.
// END SAME FROM STAGE 06: Note [Rebuilding the buckets]
void DistributedDataParallel::rebuild_buckets() {
  Tensor order = tp::zeros({static_cast<int64_t>(params_.size())}, tp::kFloat64);
  std::vector<int64_t> mine = ready_order_;
  if (mine.size() != params_.size()) {
    // A rank that joined before its first synced step filed nothing: it
    // offers the order it has (only rank 0's counts).
    mine.clear();
    for (const auto& bucket : bucket_assignment()) mine.insert(mine.end(), bucket.begin(), bucket.end());
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    order.data_ptr<double>()[i] = static_cast<double>(mine[i]);
  }
  process_group_->broadcast(order, /*root=*/0)->wait();
  std::vector<int64_t> rank0_order;
  for (size_t i = 0; i < params_.size(); ++i) {
    rank0_order.push_back(static_cast<int64_t>(order.data_ptr<double>()[i]));
  }
  std::vector<Tensor> grads;  // the averages, before the old buckets go
  for (const auto& [name, param] : params_) grads.push_back(param.grad());
  assign_buckets(rank0_order);
  if (options_.gradient_as_bucket_view) {
    for (size_t p = 0; p < params_.size(); ++p) {
      if (!grads[p].defined()) continue;  // no rank used it: it keeps no gradient
      const Location at = locations_[p];
      Slot& slot = buckets_[at.bucket].slots[at.slot];
      slot.view.copy_(grads[p]);
      params_[p].second.set_grad(slot.view);
    }
  }
  rebuilt_ = true;
}

// SAME FROM STAGE 07: Note [Join], the notify and the divisor
// Note [Join]
// ~~~~~~~~~~~
// With uneven inputs, one rank runs out of batches while the others still
// train. Its next forward never comes, so it issues none of the collectives
// the others' next synced step waits for: they hang. join(body) runs this
// rank's training loop, then keeps the rank in the game until every rank has
// finished: it shadows each synced step of the ranks still training.
//
// Every synced forward inside join() first all-reduces a 1 (notify_join):
// the sum is the number of ranks still training, and a rank that has run
// out (in join's loop) adds 0 to the same all-reduce. A sum of 0 means every
// rank has run out: the loop ends. Otherwise the joined rank issues exactly
// what a synced step issues after that all-reduce, in the same order, with
// nothing to contribute: every bucket's all-reduce filled with zeros, the
// used-map (zeros) where the step all-reduces one, and the broadcast of the
// bucket rebuild where the step rebuilds. Miss one and the ranks' collectives
// stop pairing up.
//
// The average: the active ranks sum their gradients and the joined ranks'
// zeros, and divide by the initial world size (PyTorch's default,
// divide_by_initial_world_size = true: a step with fewer ranks moves the
// model less, as if the missing ranks' gradients were zeros), or by the
// ranks still training, which the notify all-reduce has just counted.
//
// A joined rank stops stepping its optimizer, so its parameters fall behind.
// When every rank has joined, the last rank to join (the one that trained
// longest; among several, the highest) broadcasts its parameters to all: an
// all-reduce (MAX) of each rank's claim finds it. (PyTorch broadcasts the
// buffers too; the kit's reference keeps each rank's own buffers, and so
// does this stage.) With throw_on_early_termination, the first synced step
// that counts fewer ranks than the world size throws on every rank instead.
void DistributedDataParallel::notify_join() {
  // EXERCISE: all-reduce this rank's "still training" (1, a float32 tensor
  // of one element: ddp.h's contract) with the joined ranks' 0s, keep the
  // count for divisor(), and honour throw_on_early_termination.
  // BEGIN SOLUTION
  Tensor active = tp::ones({1}, tp::kFloat32);
  process_group_->allreduce(active, ReduceOp::SUM)->wait();
  active_ranks_ = static_cast<int>(active.item());
  if (options_.throw_on_early_termination && active_ranks_ < process_group_->size()) {
    throw_early_termination();
  }
  // END SOLUTION
}

double DistributedDataParallel::divisor() const {
  // EXERCISE: what to divide the summed gradients by (Note [Join]).
  // BEGIN SOLUTION
  // Outside join() every rank trains: the two options agree.
  if (!joining_ || options_.divide_by_initial_world_size) return process_group_->size();
  return active_ranks_;
  // END SOLUTION
}
// END SAME FROM STAGE 07: Note [Join], the notify and the divisor

void DistributedDataParallel::join(const std::function<void()>& body) {
  TP_CHECK(!joining_, "stage07 DDP: join() inside join()");
  joining_ = true;
  active_ranks_ = process_group_->size();
  try {
    body();
  } catch (...) {
    joining_ = false;
    throw;
  }
  // EXERCISE: this rank has run out of inputs. Shadow the synced steps of
  // the ranks still training until every rank has joined, then make every
  // replica the last joiner's (Note [Join]).
  // BEGIN SOLUTION
  bool last_to_join = true;  // until a round shows other ranks still training
  for (;;) {
    Tensor active = tp::zeros({1}, tp::kFloat32);
    process_group_->allreduce(active, ReduceOp::SUM)->wait();
    active_ranks_ = static_cast<int>(active.item());
    if (active_ranks_ == 0) break;  // every rank has joined
    last_to_join = false;
    if (options_.throw_on_early_termination) throw_early_termination();
    shadow_synced_step();
  }
  sync_final_model(last_to_join);
  // END SOLUTION
  joining_ = false;
}

void DistributedDataParallel::shadow_synced_step() {
  // SAME FROM STAGE 07: the shadow step's span
  // One span per synced step of the others that this joined rank shadows:
  // the `s` of the demo's --trace timeline, "shadow step" in Perfetto.
  tp::trace::Span span("shadow step", "ddp", {{"iteration", synced_iterations_}});
  // END SAME FROM STAGE 07: the shadow step's span
  // EXERCISE: this rank has joined; the others are running a synced step
  // and have just counted themselves (notify_join). Issue exactly the
  // collectives that step issues after its notify, in the same order,
  // contributing nothing (Note [Join]): every bucket's all-reduce, filled
  // with zeros; the used-map's all-reduce (zeros) wherever the step
  // all-reduces one (find_unused_parameters, or static_graph's first synced
  // step); and, where the step is the first synced one, what its end of
  // backward does after that: with static_graph keep what the active ranks
  // used, and rebuild the buckets wherever the step rebuilds (the rebuild
  // broadcasts rank 0's order). Then count the step as a synced iteration.
  // BEGIN SOLUTION
  tp::NoGradGuard no_grad;
  std::vector<std::shared_ptr<tp::distributed::Work>> works;
  for (Bucket& bucket : buckets_) {
    bucket.flat.zero_();  // nothing to add: the active ranks' sum is theirs
    works.push_back(process_group_->allreduce(bucket.flat, ReduceOp::SUM));
  }
  const bool wants_used_map = options_.static_graph ? synced_iterations_ == 0
                                                    : options_.find_unused_parameters;
  if (wants_used_map) {
    used_map_.zero_();
    works.push_back(process_group_->allreduce(used_map_, ReduceOp::SUM));
  }
  for (auto& work : works) work->wait();
  if (synced_iterations_ == 0) {
    if (options_.static_graph) {
      // What the active ranks used: a later join() epoch in which this rank
      // trains again reuses it (Note [Static graph]).
      static_used_.assign(used_map_.data_ptr<float>(),
                          used_map_.data_ptr<float>() + params_.size());
      static_unused_here_.assign(params_.size(), 0);
    }
    if (options_.static_graph || !options_.find_unused_parameters) rebuild_buckets();
  }
  used_map_.zero_();
  ++synced_iterations_;
  // END SOLUTION
}

// SAME FROM STAGE 07: the final model and the early-termination error
void DistributedDataParallel::sync_final_model(bool last_to_join) {
  // EXERCISE: every rank has joined. Agree, with one collective, on which
  // rank joined last (if several, the highest; last_to_join says whether
  // this rank is one of them), then broadcast its parameters to every rank
  // (Note [Join]; buffers stay each rank's own).
  // BEGIN SOLUTION
  tp::NoGradGuard no_grad;
  Tensor claim = tp::full({1}, last_to_join ? process_group_->rank() : -1, tp::kFloat32);
  process_group_->allreduce(claim, ReduceOp::MAX)->wait();
  const int root = static_cast<int>(claim.item());
  for (auto& [name, param] : params_) process_group_->broadcast(param, root)->wait();
  // END SOLUTION
}

void DistributedDataParallel::throw_early_termination() {
  joining_ = false;
  TP_THROW(tp::DistributedError, "stage07 DDP: rank ", process_group_->rank(),
           ": a rank ran out of inputs (", process_group_->size() - active_ranks_,
           " of ", process_group_->size(), " have joined) and throw_on_early_termination is "
           "set: every rank stops here instead of shadowing the others (Note [Join])");
}
// END SAME FROM STAGE 07: the final model and the early-termination error

// SAME FROM STAGE 05: the note when nothing is unused
void DistributedDataParallel::warn_if_nothing_unused(const float* used) const {
  const int world_size = process_group_->size();
  for (size_t p = 0; p < params_.size(); ++p) {
    if (used[p] != static_cast<float>(world_size)) return;  // someone left it unused
  }
  if (process_group_->rank() != 0) return;
  std::fprintf(stderr,
               "stage07 DDP: find_unused_parameters = true, but every parameter got a gradient "
               "on every rank in the first synced backward. The option walks the autograd "
               "graph after every forward; if no parameter ever goes unused, pass "
               "find_unused_parameters = false.\n");
}
// END SAME FROM STAGE 05: the note when nothing is unused

// SAME FROM STAGE 06: the error for an unfinished backward, static_graph included
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
    TP_THROW(tp::DistributedError, "stage07 DDP: rank ", process_group_->rank(),
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
  if (options_.static_graph && synced_iterations_ > 0) {
    TP_THROW(tp::DistributedError, "stage07 DDP: rank ", process_group_->rank(),
             ": static_graph: backward ended with ", unfinished_,
             ", although the first iteration found every such parameter used on this rank: "
             "the graph changed, or the record of the first iteration (static_unused_) is not "
             "what it found (Note [Static graph]); with parameters that are used in some "
             "iterations and not in others, pass find_unused_parameters = true instead");
  }
  if (options_.find_unused_parameters || options_.static_graph) {
    TP_THROW(tp::DistributedError, "stage07 DDP: rank ", process_group_->rank(),
             ": backward ended with ", unfinished_,
             " although the graph is walked (find_unused_parameters or static_graph): the "
             "forward's walk did not list "
             "them as unused (does it start from the output's grad_fn?), or the first hook "
             "did not file them (Note [Finding unused parameters])");
  }
  TP_THROW(tp::DistributedError, "stage07 DDP: rank ", process_group_->rank(),
           ": backward ended with ", unfinished_,
           ", so its bucket's all-reduce was never launched; every parameter must get a "
           "gradient in every backward, or construct the DDP with find_unused_parameters = "
           "true");
}
// END SAME FROM STAGE 06: the error for an unfinished backward, static_graph included

}  // namespace stage07
