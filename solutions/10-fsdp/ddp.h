// Stage 10 — FullyShardedDataParallel: parameters, gradients and optimizer
// state all sharded, each unit gathered only while it computes (PyTorch's
// torch.distributed.fsdp.FullyShardedDataParallel; ZeRO stage 3, and with
// SHARD_GRAD_OP stage 2). In ddp.h and ddp.cc, where every stage keeps its
// wrapper, so that the kit's demo, checker and tools find it; PyTorch's file
// is torch/distributed/fsdp/fully_sharded_data_parallel.py.
//
// What it is: stage 09 sharded the optimizer state but left every rank a
// whole copy of the parameters and gradients. Here a wrap policy cuts the
// model into units (wrap.h); each unit's parameters become one flat
// parameter, padded and sharded, of which a rank keeps 1/W
// (flat_param.h). Before a unit's forward its shards are all-gathered and
// its parameters view the result; after it, the gathered bytes are freed
// (FULL_SHARD) or kept for backward (SHARD_GRAD_OP). Before the unit's
// backward they are gathered again if freed; once autograd has produced
// all its gradients (hooks, as stage 03), the unit's flat gradient is
// reduce-scattered, so each rank receives its shard of the sum, divided by
// W as DDP divides; then the unit is freed again. The optimizer (the kit's
// SGD) steps parameters() -- this rank's shards -- so its state is 1/W too.
// Note [One unit's step] in ddp.cc walks a step.
//
// What it is not: it does not carry stage 09's DDP (FSDP is a sibling of
// DDP in PyTorch, not a layer over it); NO_SHARD stands in for DDP, one
// all-reduce per unit. No Join (PyTorch's FSDP has none: join() is refused
// by name), no unused parameters, no buffer broadcast after construction,
// no mixed precision, no CPU offload, no hybrid sharding (HSDP).
//
// Contract:
//   - Every rank constructs it with the same model (shapes and dtypes are
//     verified: a mismatch throws tp::DistributedError on every rank) and
//     the same Options. The values must agree too: with sync_module_states
//     rank 0's parameters and buffers are broadcast first; without it a
//     rank whose values differ from rank 0's throws tp::DistributedError on
//     every rank, naming the first parameter that differs.
//   - The model's modules call their submodules through operator() (the
//     kit's models do), so the units' forward hooks run.
//   - parameters() are the flat shards, one per unit, in unit order: give
//     them to the optimizer. named_parameters() are the model's own
//     parameters with the model's names; their values exist only while
//     their unit is gathered (inside summon_full_params(), or during the
//     unit's forward and backward); reading them otherwise throws tp::Error.
//   - After each backward (not under no_sync), local_shard().grad of every
//     unit holds this rank's shard of the gradient averaged over the ranks
//     (added to what it held, as autograd accumulates), and no unit holds a
//     gathered gradient. Every parameter must get a gradient in every
//     backward; one that gets none throws tp::DistributedError at the end
//     of backward naming it (no find_unused_parameters).
//   - Collectives, in the same order on every rank (forward order is
//     recorded in the first forward and drives prefetching after it): per
//     forward, one all-gather per unit not already gathered; per backward,
//     one all-gather per unit freed since its forward and one
//     reduce-scatter per unit (NO_SHARD: one all-reduce per unit, no
//     all-gather). Construction: 2 all-gathers (verify_same_tensors_on_all_ranks),
//     then one broadcast per parameter and buffer (sync_module_states) or
//     one all-gather (the values' fingerprints).
//   - summon_full_params() gathers every unit and returns a guard; while
//     it lives the parameters hold the whole model; when it goes, each
//     rank's part of any change is written back to its shard, and the units
//     freed before are freed again. summon_full_params(u) does the same for
//     unit u alone (a full state dict gathers one unit at a time). Not
//     during forward or backward.
//   - clip_grad_norm_(max_norm) is a collective (one all-reduce of one
//     number, none under NO_SHARD): called after backward on every rank, it
//     scales every shard's gradient as torch.nn.utils.clip_grad_norm_ would
//     scale the whole model's.
//   - Not thread-safe: one training thread; the process group's
//     communication thread writes only gathered buffers and reduced
//     gradients it was handed, between the call that issues and its wait().
//   - Neither copyable nor movable: hooks point back at it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flat_param.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/distributed/work.h"
#include "tensorplay/nn/module.h"
#include "tensorplay/tensor.h"
#include "tensorplay/train/capabilities.h"
#include "wrap.h"

namespace stage10 {

// PyTorch's names (torch.distributed.fsdp.ShardingStrategy).
enum class ShardingStrategy {
  FULL_SHARD,     // ZeRO-3: free each unit after its forward and after its backward
  SHARD_GRAD_OP,  // ZeRO-2: keep it gathered from its forward until its backward ends
  NO_SHARD,       // DDP: every rank keeps everything; one all-reduce per unit
};
// "full_shard", "shard_grad_op", "no_shard".
std::string to_string(ShardingStrategy strategy);

// Which all-gather is issued early in backward (torch's BackwardPrefetch;
// PyTorch 2.x's default is BACKWARD_PRE, 1.13's none).
enum class BackwardPrefetch {
  NONE,           // gather each unit when its backward begins
  BACKWARD_PRE,   // when a unit's backward begins, issue the next unit's all-gather
  BACKWARD_POST,  // when a unit's gradients are ready, issue the next unit's
};
std::string to_string(BackwardPrefetch prefetch);  // "none", "backward_pre", "backward_post"

struct Options {
  ShardingStrategy sharding_strategy = ShardingStrategy::FULL_SHARD;
  // Which modules become units (wrap.h). None given (no should_wrap): each
  // Linear, linear_wrap_policy(), chosen by the constructor.
  AutoWrapPolicy auto_wrap_policy;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::BACKWARD_PRE;
  // Issue the next unit's all-gather before the current unit's forward
  // computes (from the second forward on: the order is recorded in the first).
  bool forward_prefetch = false;
  // Broadcast rank 0's parameters and buffers before sharding, so ranks
  // that built different values start equal (PyTorch's sync_module_states).
  bool sync_module_states = false;
};

class FullyShardedDataParallel;

// What no_sync() returns: while it lives, backward accumulates each unit's
// gradient unsharded, with no collective (gathered gradients stay, one
// whole model's worth: Note [no_sync keeps whole gradients]).
class [[nodiscard]] NoSyncGuard {
 public:
  explicit NoSyncGuard(FullyShardedDataParallel& fsdp);
  NoSyncGuard(NoSyncGuard&& other) noexcept;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  ~NoSyncGuard();

 private:
  FullyShardedDataParallel* fsdp_;  // null once moved from
  bool previous_ = true;
};

// What summon_full_params() returns (see the contract).
class [[nodiscard]] FullParamsGuard {
 public:
  // Gathers `units` (indices into fsdp.units()).
  FullParamsGuard(FullyShardedDataParallel& fsdp, std::vector<size_t> units);
  FullParamsGuard(FullParamsGuard&& other) noexcept;
  FullParamsGuard& operator=(FullParamsGuard&&) = delete;
  FullParamsGuard(const FullParamsGuard&) = delete;
  FullParamsGuard& operator=(const FullParamsGuard&) = delete;
  ~FullParamsGuard();

 private:
  FullyShardedDataParallel* fsdp_;  // null once moved from
  std::vector<size_t> units_;       // the units gathered
  std::vector<bool> was_freed_;     // per entry of units_: free it again at the end
};

class FullyShardedDataParallel {
 public:
  using Options = stage10::Options;
  // For the kit's trainer: sync inside backward (hooks), no_sync(), the
  // parameters themselves sharded (summon_full_params() to read them).
  static constexpr tp::train::Capabilities capabilities{
      .syncs_in_backward = true, .no_sync = true, .fully_sharded = true};

  FullyShardedDataParallel(std::shared_ptr<tp::nn::Module> module,
                           std::shared_ptr<tp::distributed::ProcessGroup> process_group,
                           Options options = {});
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;
  ~FullyShardedDataParallel();

  // Gathers the root unit, runs the model (the units' hooks gather and free
  // theirs), and hooks the output so that the backward gathers again and
  // reduce-scatters. Throws tp::DistributedError if the previous backward
  // did not finish.
  tp::Tensor forward(const tp::Tensor& input);
  tp::Tensor operator()(const tp::Tensor& input) { return forward(input); }

  // This rank's shard of every unit: what the optimizer steps.
  std::vector<tp::Tensor> parameters() const;
  // The model's parameters (see the contract: gathered only at times).
  std::vector<tp::nn::NamedTensor> named_parameters() const { return module_->named_parameters(); }

  NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  FullParamsGuard summon_full_params();
  FullParamsGuard summon_full_params(size_t unit);
  // Scales the shards' gradients so that the whole gradient's 2-norm is at
  // most max_norm (PyTorch's FSDP.clip_grad_norm_); returns the norm before
  // clipping. REQUIRES: max_norm > 0; called after backward on every rank.
  double clip_grad_norm_(double max_norm);
  // PyTorch's FSDP has no Join: throws tp::Error saying so.
  void join(const std::function<void()>& body);

  // The units, in order (the root unit, if it holds parameters, is named "").
  const std::vector<std::unique_ptr<FlatParameter>>& units() const { return units_; }
  const Options& options() const { return options_; }
  const std::shared_ptr<tp::distributed::ProcessGroup>& process_group() const {
    return process_group_;
  }
  const std::shared_ptr<tp::nn::Module>& module() const { return module_; }

 private:
  friend class NoSyncGuard;
  friend class FullParamsGuard;

  // One unit's state besides its flat parameter. Touched by the training
  // thread only; gather and reduce hold the in-flight collectives' Work.
  struct UnitState {
    tp::nn::Module* module = nullptr;  // null for the root unit
    std::shared_ptr<tp::distributed::Work> gather;  // all-gather in flight, if any
    tp::Tensor full_grad;     // the gathered gradient, from its backward to its reduction
    std::vector<bool> ready;  // per parameter: its gradient is final in this backward
    int64_t grads_ready = 0;  // how many are
    bool backward_begun = false;  // its pre-backward hook ran in this backward
    bool reduced = false;         // its reduction was issued in this backward
    std::vector<tp::nn::ModuleHookHandle> forward_hooks;
    std::vector<tp::RemovableHandle> grad_hooks;
  };
  // A reduction in flight: the unit, its Work, and what it reduces into.
  struct PendingReduction {
    size_t unit = 0;
    std::shared_ptr<tp::distributed::Work> work;
    tp::Tensor input;   // the full gradient (kept alive until the Work ends)
    tp::Tensor output;  // this rank's shard of the sum (sharded), else input
  };

  void check_same_values();
  void register_hooks();
  void pre_forward(size_t u);
  tp::Tensor post_forward(size_t u, const tp::Tensor& output);
  void pre_backward(size_t u);
  void on_grad_ready(size_t u, size_t slot);
  void finish_backward();

  void unshard(size_t u);    // gathered on return (waits for a prefetch)
  void prefetch(size_t u);   // issues the all-gather, returns at once
  void reshard(size_t u);    // frees the gathered parameters (sharded only)
  void reduce_gradient(size_t u);
  void finish_reduction(PendingReduction& pending);
  // The unit next to the one at position `u` of the recorded forward order
  // (+1 forward, -1 backward), or -1.
  int64_t next_in_order(size_t u, int step) const;
  bool frees_after_forward(size_t u) const;
  std::string unit_name(size_t u) const;

  std::shared_ptr<tp::nn::Module> module_;
  std::shared_ptr<tp::distributed::ProcessGroup> process_group_;
  Options options_;  // constant after construction
  std::vector<std::unique_ptr<FlatParameter>> units_;  // constant after construction
  std::vector<UnitState> state_;                        // per unit, as units_
  int64_t root_unit_ = -1;  // index of the root unit in units_, -1 when it has no parameters
  // Forward order of the units, recorded in the first forward
  // (PyTorch's _exec_order_data); empty until that forward ends.
  std::vector<size_t> forward_order_;
  std::vector<size_t> recording_;  // the order being recorded
  std::vector<int64_t> position_;  // unit -> index in forward_order_
  std::vector<PendingReduction> pending_;  // at most one (Note [One reduction in flight])
  bool require_backward_grad_sync_ = true;  // false under no_sync()
  bool backward_pending_ = false;  // a forward with grad ran and its backward has not finished
  bool in_summon_ = false;
};

}  // namespace stage10
