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
  // BEGIN SOLUTION
  const std::vector<int64_t>& mine = partition_[static_cast<size_t>(process_group_->rank())];
  if (!mine.empty()) {
    std::vector<Tensor> shard;
    for (int64_t p : mine) shard.push_back(params_[static_cast<size_t>(p)]);
    local_ = std::make_unique<tp::optim::SGD>(std::move(shard), sgd_options_);
  }
  const int64_t total = std::accumulate(split_sizes_.begin(), split_sizes_.end(), int64_t{0});
  const tp::Dtype dtype = params_[0].dtype();
  for (const Tensor& p : params_) {
    TP_CHECK(p.dtype() == dtype && p.device() == params_[0].device(),
             "stage09 ZeroRedundancyOptimizer: the parameters must share one dtype and device "
             "(one flat buffer carries them all)");
  }
  // What the collectives move, not model state (tp::memory's kinds).
  tp::memory::KindScope communication(tp::memory::Kind::Communication);
  flat_params_ = tp::zeros({total}, dtype, params_[0].device());
  if (options_.reduce_scatter) flat_grads_ = tp::zeros({total}, dtype, params_[0].device());
  // END SOLUTION
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
  // BEGIN SOLUTION
  std::vector<int64_t> by_size(params_.size());
  std::iota(by_size.begin(), by_size.end(), 0);
  std::stable_sort(by_size.begin(), by_size.end(), [this](int64_t a, int64_t b) {
    return params_[static_cast<size_t>(a)].numel() > params_[static_cast<size_t>(b)].numel();
  });
  std::vector<int64_t> load(world, 0);
  for (int64_t p : by_size) {
    const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    partition_[r].push_back(p);
    load[r] += params_[static_cast<size_t>(p)].numel();
  }
  for (std::vector<int64_t>& shard : partition_) std::sort(shard.begin(), shard.end());
  offsets_.assign(params_.size(), 0);
  split_sizes_.assign(world, 0);
  block_start_.assign(world, 0);
  int64_t offset = 0;
  for (size_t r = 0; r < world; ++r) {
    block_start_[r] = offset;
    for (int64_t p : partition_[r]) {
      offsets_[static_cast<size_t>(p)] = offset;
      offset += params_[static_cast<size_t>(p)].numel();
    }
    split_sizes_[r] = offset - block_start_[r];
  }
  // END SOLUTION
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
  // BEGIN SOLUTION
  const int world = process_group_->size();
  const int64_t n = static_cast<int64_t>(params_.size());
  Tensor owners = tp::full({n}, -1, tp::kFloat64);
  for (int r = 0; r < world; ++r) {
    for (int64_t p : partition_[static_cast<size_t>(r)]) {
      TP_CHECK(p >= 0 && p < n, "stage09 ZeroRedundancyOptimizer: the partition names "
               "parameter ", p, "; there are ", n);
      const double before = owners.data_ptr<double>()[p];
      TP_CHECK(before < 0, "stage09 ZeroRedundancyOptimizer: parameter ", p, " is in the "
               "shards of rank ", before, " and rank ", r, "; every parameter belongs to exactly "
               "one rank (Note [Partition])");
      owners.data_ptr<double>()[p] = r;
    }
  }
  std::vector<Tensor> all;
  for (int r = 0; r < world; ++r) all.push_back(tp::zeros({n}, tp::kFloat64));
  process_group_->allgather(all, owners)->wait();
  for (int r = 0; r < world; ++r) {
    for (int64_t p = 0; p < n; ++p) {
      const double mine = owners.data_ptr<double>()[p];
      const double theirs = all[static_cast<size_t>(r)].data_ptr<double>()[p];
      if (mine < 0) {
        TP_THROW(tp::DistributedError, "stage09 ZeroRedundancyOptimizer: rank ",
                 process_group_->rank(), ": no shard holds parameter ", p, "; every parameter "
                 "belongs to exactly one rank (Note [Partition])");
      }
      if (mine == theirs) continue;
      TP_THROW(tp::DistributedError, "stage09 ZeroRedundancyOptimizer: rank ",
               process_group_->rank(), " gives parameter ", p, " to rank ", mine,
               " but rank ", r, " gives it to rank ", theirs, " (-1: to nobody); every rank "
               "must compute the same partition, from the shapes alone (Note [Partition])");
    }
  }
  // END SOLUTION
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
  // BEGIN SOLUTION
  if (local_) local_->step();
  sync_params();
  // END SOLUTION
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
  // BEGIN SOLUTION
  const int rank = process_group_->rank();
  const std::vector<int64_t>& mine = partition_[static_cast<size_t>(rank)];
  for (int64_t p : mine) flat_slot(flat_params_, p).copy_(params_[static_cast<size_t>(p)]);
  if (options_.param_sync == "allgather") {
    process_group_->allgather_into_tensor(flat_params_, block(flat_params_, rank), split_sizes_)
        ->wait();
  } else {
    std::vector<std::shared_ptr<Work>> works;
    for (int r = 0; r < process_group_->size(); ++r) {
      if (split_sizes_[static_cast<size_t>(r)] == 0) continue;  // an empty shard: nothing to send
      works.push_back(process_group_->broadcast(block(flat_params_, r), r));
    }
    for (const std::shared_ptr<Work>& work : works) work->wait();
  }
  for (int r = 0; r < process_group_->size(); ++r) {
    if (r == rank) continue;
    for (int64_t p : partition_[static_cast<size_t>(r)]) {
      params_[static_cast<size_t>(p)].copy_(flat_slot(flat_params_, p));
    }
  }
  // END SOLUTION
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
  // BEGIN SOLUTION
  const int rank = process_group_->rank();
  for (size_t p = 0; p < params_.size(); ++p) {
    Tensor slot = flat_slot(flat_grads_, static_cast<int64_t>(p));
    const Tensor grad = params_[p].grad();
    if (grad.defined()) {
      slot.copy_(grad);
    } else {
      slot.zero_();
    }
  }
  Tensor mine = block(flat_grads_, rank);
  process_group_->reduce_scatter_tensor(mine, flat_grads_, split_sizes_, ReduceOp::SUM)->wait();
  mine.div_(divide_by_initial_world_size_ ? process_group_->size() : active_ranks);
  for (int64_t p : partition_[static_cast<size_t>(rank)]) {
    Tensor grad = params_[static_cast<size_t>(p)].grad();
    if (grad.defined()) grad.copy_(flat_slot(flat_grads_, p));
  }
  // END SOLUTION
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
