// Exercise generated from solutions/09-zero/zero.cc by tools/gen_exercise.py.
// Fill in each EXERCISE, then run ./kit check 09. ./kit reset 09 restores this file.
// Stage 09 — ZeroRedundancyOptimizer. See zero.h for the contract and
// lessons/09-zero/README.md for the why.
#include "zero.h"

#include <algorithm>
#include <numeric>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/error.h"
#include "tensorplay/memory.h"

namespace stage09 {

using tp::Tensor;
using tp::distributed::ReduceOp;
using tp::distributed::Work;

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(
    std::vector<Tensor> params, std::shared_ptr<tp::distributed::ProcessGroup> process_group,
    tp::optim::SGDOptions sgd, ZeroOptions options)
    : params_(std::move(params)),
      process_group_(std::move(process_group)),
      sgd_options_(sgd),
      options_(std::move(options)) {
  TP_CHECK(process_group_ != nullptr, "stage09 ZeroRedundancyOptimizer: no process group");
  TP_CHECK(options_.param_sync == "allgather" || options_.param_sync == "broadcast",
           "stage09 ZeroRedundancyOptimizer: param_sync '", options_.param_sync,
           "' is neither 'allgather' nor 'broadcast'");
  // What SGD refuses (no parameters, one twice, bad lr) is refused for the
  // whole list, on every rank alike, not only for the shard of one.
  tp::optim::SGD check_all(params_, sgd_options_);
  partition_parameters();
  check_partition_agrees();
  // EXERCISE: local_, the SGD that steps this rank's shard and keeps its
  // state (zero.h); null for an empty shard (SGD refuses an empty list).
  // Then the flat buffers the collectives move (zero.h): one for the
  // parameters, and one for the gradients in the reduce-scatter form, each
  // as long as all the shards together, on the parameters' dtype and device
  // (refuse parameters that do not share them: one buffer carries them all),
  // counted as communication memory (tp::memory's kinds).
  throw tp::NotImplemented("stage 09: ZeroRedundancyOptimizer::ZeroRedundancyOptimizer is not implemented yet (exercises/09-zero/zero.cc)");
}

// Note [Partition]
// ~~~~~~~~~~~~~~~~
// Which rank owns which parameter. The rule must give every rank the same
// answer without talking (each computes it from the shapes, which the DDP
// has already checked are the same everywhere), and should give the ranks
// about the same number of elements: a rank's step time and its share of
// the state both grow with its shard.
//
// PyTorch's rule, and the kit's: take the parameters from the largest to the
// smallest (numel; ties in their order), and give each to the rank whose
// shard is smallest so far (ties: the lowest rank). Greedy, not optimal,
// but within one parameter of balanced, and the large ones, placed first,
// cannot end up together. A shard lists its parameters in increasing index
// order; the flat buffers hold rank 0's shard first, then rank 1's, each in
// that order, so that rank r's shard is one contiguous block: what a
// reduce-scatter delivers and an all-gather collects.
void ZeroRedundancyOptimizer::partition_parameters() {
  const size_t world = static_cast<size_t>(process_group_->size());
  partition_.assign(world, {});
  // EXERCISE: fill partition_ by the rule of Note [Partition]: each rank's
  // parameter indices, in increasing order. Then lay the shards out in the
  // flat buffers, rank 0's block first, each in its shard's order: every
  // parameter's offset (offsets_), and every rank's block, where it starts
  // (block_start_) and how long it is (split_sizes_).
  throw tp::NotImplemented("stage 09: ZeroRedundancyOptimizer::partition_parameters is not implemented yet (exercises/09-zero/zero.cc)");
}

// A partition that differs between ranks would pair blocks of different
// sizes in every all-gather: the job would hang in the first step with
// nothing said. One all-gather of each parameter's owner says it here.
void ZeroRedundancyOptimizer::check_partition_agrees() {
  // EXERCISE: make a partition that is not one a clear error, before any
  // step can hang on it: on this rank, every parameter must be in exactly
  // one shard (name the parameter otherwise); across ranks, the owners must
  // agree: gather every rank's list of owners with one all-gather and name
  // the first parameter two ranks give to different owners. A parameter no
  // rank owns, or owners that differ, is tp::DistributedError (zero.h).
  throw tp::NotImplemented("stage 09: ZeroRedundancyOptimizer::check_partition_agrees is not implemented yet (exercises/09-zero/zero.cc)");
}

Tensor ZeroRedundancyOptimizer::flat_slot(const Tensor& flat, int64_t p) const {
  const Tensor& param = params_[static_cast<size_t>(p)];
  return flat.narrow(0, offsets_[static_cast<size_t>(p)], param.numel()).view(param.shape());
}

Tensor ZeroRedundancyOptimizer::block(const Tensor& flat, int r) const {
  return flat.narrow(0, block_start_[static_cast<size_t>(r)], split_sizes_[static_cast<size_t>(r)]);
}

void ZeroRedundancyOptimizer::step() {
  // In a Join, the ranks still training (the DDP counted them: join.h).
  const int active_ranks = notify_join_context(*this);
  if (options_.reduce_scatter) reduce_scatter_gradients(active_ranks);
  // EXERCISE: update this rank's shard, and only it; then every rank must
  // end with every shard (Note [Shards back to every rank]).
  throw tp::NotImplemented("stage 09: ZeroRedundancyOptimizer::step is not implemented yet (exercises/09-zero/zero.cc)");
}

// Note [Shards back to every rank]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// After the step each rank's own shard is new and the rest of its model is
// old. Two ways to fix that, the same bytes on the wire ((W-1)/W of the
// model into each rank):
//   - one all-gather: each rank copies its shard into its block of a flat
//     buffer, the all-gather fills the other blocks, each rank copies them
//     out. One collective, whatever W.
//   - W broadcasts, rank r's block from rank r (PyTorch's way): W
//     collectives, each of one shard; more latency, no gather.
// Either way the copy out must wait for the collective: a parameter read
// before the wait may be half old, half new. The bench measures both.
void ZeroRedundancyOptimizer::sync_params() {
  tp::NoGradGuard no_grad;
  // EXERCISE: every rank ends with every shard as its owner updated it,
  // through flat_params_ (block(), flat_slot()): by one all-gather, or by
  // param_sync "broadcast", one broadcast per non-empty shard from its
  // owner (Note [Shards back to every rank]).
  throw tp::NotImplemented("stage 09: ZeroRedundancyOptimizer::sync_params is not implemented yet (exercises/09-zero/zero.cc)");
}

// Note [The reduce-scatter form]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Composed with the DDP, every rank receives every averaged gradient and
// uses 1/W of them. An all-reduce is a reduce-scatter (each rank ends with
// the sum of one block) followed by an all-gather of the sums; the second
// half delivers exactly the blocks ZeRO throws away. So skip it: the DDP
// sends nothing (noop_hook), and step() reduce-scatters a flat copy of the
// local gradients laid out shard after shard, so that the block each rank
// receives is its own shard's sum. Half the gradient traffic; then the
// all-gather of the parameters, as before.
//
// The DDP still tells who has a gradient: with noop_hook its end of backward
// gives a parameter no rank used no gradient, and one used anywhere a
// gradient on every rank (zeros where this rank did not use it). So a
// parameter of this shard without a gradient is skipped here as SGD would
// skip it after an all-reduce; its zeros in the flat copy change no sum.
void ZeroRedundancyOptimizer::reduce_scatter_gradients(int active_ranks) {
  tp::NoGradGuard no_grad;
  // EXERCISE: give this rank's shard the average of the ranks' gradients
  // with one reduce-scatter (Note [The reduce-scatter form]). Divide as the
  // DDP would: by the world size, or inside a Join with
  // divide_by_initial_world_size false, by the ranks still training.
  throw tp::NotImplemented("stage 09: ZeroRedundancyOptimizer::reduce_scatter_gradients is not implemented yet (exercises/09-zero/zero.cc)");
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  for (Tensor& p : params_) {
    if (set_to_none) {
      p.set_grad(Tensor());
    } else if (p.grad().defined()) {
      p.grad().zero_();
    }
  }
}

std::vector<int64_t> ZeroRedundancyOptimizer::params_with_state() const {
  std::vector<int64_t> out;
  if (!local_) return out;
  const std::vector<Tensor>& shard = local_->params();
  const std::vector<Tensor>& buffers = local_->momentum_buffers();
  for (size_t i = 0; i < shard.size(); ++i) {
    if (!buffers[i].defined()) continue;
    for (size_t p = 0; p < params_.size(); ++p) {
      if (params_[p].impl() == shard[i].impl()) out.push_back(static_cast<int64_t>(p));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Note [A joined rank's shard]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In stage 07 a rank that ran out of inputs stopped stepping: its model
// fell behind, and the last joiner's broadcast repaired it at the end. With
// ZeRO that no longer works: the joined rank owns a shard, and the ranks
// still training only ever get that shard from it. If it stops stepping,
// its shard freezes on every rank, and the model leaves the reference.
//
// So the joined rank keeps stepping its shard, once per iteration of the
// others, in Join's loop: the DDP's main hook (its shadow step, run first)
// leaves it the active ranks' average in its gradients, exactly what the
// training ranks hold, and this hook steps the shard with it and exchanges
// the shards, pairing with the training ranks' step(). PyTorch's hook also
// calls step(), but PyTorch's DDP shadow step discards the averages, so
// the joined rank steps its shard with the gradients of its own last step:
// its replicas stay equal to each other, not to the single-process
// reference. Lesson 09 compares the two.
std::unique_ptr<JoinHook> ZeroRedundancyOptimizer::join_hook(const JoinOptions& options) {
  struct StepHook : JoinHook {
    ZeroRedundancyOptimizer& zero;
    explicit StepHook(ZeroRedundancyOptimizer& z) : zero(z) {}
    void main_hook() override { zero.step(); }
  };
  divide_by_initial_world_size_ = options.divide_by_initial_world_size;
  return std::make_unique<StepHook>(*this);
}

}  // namespace stage09
