// Stage 09 — ZeroRedundancyOptimizer: the kit's SGD, sharded across ranks
// (ZeRO stage 1, as PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer).
//
// What it is: every rank of a DDP job holds the same parameters and, after
// the all-reduce, the same averaged gradients, so every rank computes the
// same optimizer step, and keeps the same optimizer state (SGD's momentum
// buffers: one more copy of the model per rank). ZeRO splits the
// parameters into W shards, one per rank (Note [Partition]); a rank keeps
// state for its shard only and steps only its shard, then the shards are
// exchanged (Note [Shards back to every rank] in zero.cc) so that every rank
// holds the whole updated model again. Same math, 1/W of the state.
//
// Two ways to feed it (lesson 09):
//   - composed with the DDP (ZeroOptions::reduce_scatter = false): the DDP
//     all-reduces every gradient as before; step() uses only its shard's.
//   - the reduce-scatter form (reduce_scatter = true): the DDP sends nothing
//     (noop_hook, default_hooks.h); step() reduce-scatters the gradients so
//     that each rank receives only its shard's sum (Note [The reduce-scatter
//     form] in zero.cc), then divides it.
//
// What it is not: ZeRO stages 2 and 3 (sharded gradients and parameters);
// the DDP still keeps whole buckets. PyTorch's overlap_with_ddp and
// parameters_as_bucket_view are not offered.
//
// Contract:
//   - Every rank constructs it with the same parameters (shapes, order), the
//     same SGD options and the same ZeroOptions: the partition is computed
//     from the shapes alone, so it is the same on every rank.
//   - The constructor all-gathers each parameter's owner and throws
//     tp::DistributedError when a rank's partition differs from another's
//     or leaves a parameter to nobody (it would otherwise hang in step()).
//   - partition()[r] lists rank r's parameters (indices into `params`, in
//     increasing order); every parameter is in exactly one shard; a shard
//     may be empty (more ranks than parameters).
//   - step(): updates this rank's shard with SGD (momentum buffers only for
//     its own parameters, created at their first step), then gives every
//     rank every shard: afterwards the parameters are equal on all ranks and
//     equal to what one SGD over all of them would compute. Parameters
//     without a gradient are skipped, as SGD skips them. In the
//     reduce-scatter form, step() first replaces this rank's shard's
//     gradients by their average over the ranks (the world size, or the
//     ranks still training inside a Join with divide_by_initial_world_size
//     false); the others' stay as backward left them. Collectives: one
//     all-gather per step, or W broadcasts (param_sync = "broadcast"); the
//     reduce-scatter form adds one reduce-scatter before.
//   - It is a Joinable (join.h): a rank that has run out of inputs steps its
//     shard in Join's loop, with the gradients the DDP's shadow step left
//     (the active ranks' average), so the ranks still training get its shard
//     and the model stays equal to the reference (Note [A joined rank's
//     shard] in zero.cc). List it after the DDP: Join({&ddp, &zero}).
//   - Throws tp::Error for an unknown param_sync, and what tp::optim::SGD
//     throws for bad SGD options or parameters.
//   - Not thread-safe: one training thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "join.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/tensor.h"

namespace stage09 {

struct ZeroOptions {
  // The reduce-scatter form: step() reduces the gradients itself (the DDP
  // then sends none: Options::reduce_scatter registers noop_hook).
  bool reduce_scatter = false;
  // How the updated shards reach every rank: "allgather" (one all-gather of
  // a flat copy of the parameters) or "broadcast" (each rank broadcasts its
  // shard, flat: W broadcasts, as PyTorch does).
  std::string param_sync = "allgather";
};

class ZeroRedundancyOptimizer : public Joinable {
 public:
  ZeroRedundancyOptimizer(std::vector<tp::Tensor> params,
                          std::shared_ptr<tp::distributed::ProcessGroup> process_group,
                          tp::optim::SGDOptions sgd, ZeroOptions options = {});
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  void step();
  // Every parameter's gradient, not only the shard's: backward fills them all.
  void zero_grad(bool set_to_none = true);

  const std::vector<std::vector<int64_t>>& partition() const { return partition_; }
  // The parameters (indices) this rank holds optimizer state for: read
  // from the local SGD's momentum buffers, not from the partition.
  std::vector<int64_t> params_with_state() const;

  // Joinable (join.h): the main hook is step().
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  tp::distributed::ProcessGroup& join_process_group() override { return *process_group_; }

 private:
  // Note [Partition]: fills partition_, and where each parameter sits in
  // the flat buffers (offsets_, split_sizes_).
  void partition_parameters();
  // Throws tp::DistributedError naming a parameter whose owner differs
  // between ranks, or that no rank owns. One all-gather.
  void check_partition_agrees();
  // Note [The reduce-scatter form]: this rank's shard gets the average.
  void reduce_scatter_gradients(int active_ranks);
  // Note [Shards back to every rank].
  void sync_params();
  // The elements of parameter p in the flat buffers.
  tp::Tensor flat_slot(const tp::Tensor& flat, int64_t p) const;
  // Rank r's block of a flat buffer.
  tp::Tensor block(const tp::Tensor& flat, int r) const;

  std::vector<tp::Tensor> params_;
  std::shared_ptr<tp::distributed::ProcessGroup> process_group_;
  tp::optim::SGDOptions sgd_options_;
  ZeroOptions options_;
  std::vector<std::vector<int64_t>> partition_;  // [rank] -> parameter indices
  std::vector<int64_t> offsets_;      // [param]: its first element in the flat buffers
  std::vector<int64_t> split_sizes_;  // [rank]: elements in its shard
  std::vector<int64_t> block_start_;  // [rank]: its block's first element
  // Every parameter, rank 0's shard first, then rank 1's...: what the
  // all-gather fills (and the broadcasts), and, in the reduce-scatter
  // form, the gradients' flat copy.
  tp::Tensor flat_params_;
  tp::Tensor flat_grads_;
  // SGD over this rank's shard; null when the shard is empty.
  std::unique_ptr<tp::optim::SGD> local_;
  // From the Join's options (join_hook): how step() divides, in the
  // reduce-scatter form.
  bool divide_by_initial_world_size_ = true;
};

}  // namespace stage09
