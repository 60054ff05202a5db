// What a training run reports: per-micro-batch losses, collective counts and
// parameter snapshots.
//
// Contract:
//   - RankResult is what one DDP rank saw; ReferenceResult is what the
//     single-process reference trainer computed for all ranks at once.
//   - Results are ragged: rank r reports one entry per micro-batch it ran
//     (micro_batches_of(config, r), see config.h), indexed by the micro-batch
//     number i; step i / K, micro-step i % K. An index past the end means the
//     rank did not run that micro-batch (it had joined, or it failed).
//   - Snapshots hold values as double (exact for float32 and float64) with
//     the parameter's name, shape and dtype, in named_parameters() order.
//   - serialize()/parse_rank_result() round-trip a RankResult exactly (a
//     JSON object sent as CBOR bytes, not text), which is how ranks send results to the parent
//     through spawn(), or to each other through all_gather_results() when a
//     launcher started them (one process per rank, tprun).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tensorplay/distributed/process_group.h"
#include "tensorplay/memory.h"
#include "tensorplay/nn/module.h"
#include "tensorplay/tensor.h"
#include "tensorplay/trace.h"

namespace tp::train {

struct ParamValues {
  std::string name;
  Shape shape;
  std::vector<double> values;
  Dtype dtype = kFloat32;  // the tensor's: a model may mix dtypes (ModelKind::Mixed)
};
using Snapshot = std::vector<ParamValues>;

// Copies every named tensor's values.
Snapshot snapshot(const std::vector<nn::NamedTensor>& named);

struct RankResult {
  int rank = 0;
  std::vector<double> losses;          // [i]: this rank's loss on micro-batch i (unscaled)
  Snapshot initial_params;             // right after DDP construction
  Snapshot after_first_step;           // after step 0's optimizer step
  Snapshot final_params;               // after the last step
  Snapshot initial_buffers;            // named_buffers() right after construction
  Snapshot final_buffers;              // ... after the last step
  // [i]: collectives issued from the start of micro-batch i to its end (the
  // optimizer step of a step's last micro-batch included; zero_grad and
  // anything after the last micro-batch are not counted).
  std::vector<uint64_t> allreduces_per_micro;
  std::vector<uint64_t> broadcasts_per_micro;
  // [i]: bytes handed to all-reduces in micro-batch i (what a compressing
  // comm hook shrinks; CollectiveCounters::allreduce_bytes).
  std::vector<uint64_t> allreduce_bytes_per_micro;
  // [i]: the flat collectives of a sharded optimizer (stage 09) in
  // micro-batch i: how many, and the bytes each carried, counted as
  // CollectiveCounters counts them (the whole flat tensor).
  std::vector<uint64_t> allgathers_per_micro;
  std::vector<uint64_t> allgather_bytes_per_micro;
  std::vector<uint64_t> reduce_scatters_per_micro;
  std::vector<uint64_t> reduce_scatter_bytes_per_micro;
  std::vector<uint64_t> broadcast_bytes_per_micro;  // the bytes of broadcasts_per_micro
  // [i]: bytes Tensor::copy_ wrote into the storages the parameters' .grad
  // live in, from the end of micro-batch i - 1 to the end of micro-batch i
  // (its forward, backward, the step's sync_grads() for a stage that syncs
  // after backward, and the optimizer step, which copies nothing into
  // them), read as it ends (Storage::take_bytes_copied_in; the copy that
  // makes a fresh gradient does not count). A DDP copies each gradient byte in at most once per sync: into
  // its slot when .grad is a view of the bucket, back from the bucket when
  // it is not.
  std::vector<uint64_t> grad_copy_bytes_per_micro;
  uint64_t construction_allreduces = 0;  // issued by the DDP constructor
  uint64_t construction_broadcasts = 0;
  uint64_t construction_allgathers = 0;
  // Parameter indices (named_parameters() order) of each bucket, in bucket
  // order, after the last step; empty for stages without buckets.
  std::vector<std::vector<int64_t>> buckets;
  // The same right after construction (a stage may rebuild them later).
  std::vector<std::vector<int64_t>> initial_buckets;
  // [p]: the id the autograd engine's "grad ready" trace marks carry for
  // parameter p (its TensorImpl's address in that rank's process).
  std::vector<int64_t> param_ids;
  // [p]: which storage parameter p's final .grad lives in, numbered by first
  // appearance (1, 2, ...; 0: no gradient). Parameters whose gradients are
  // views of one DDP bucket share a number.
  std::vector<int64_t> grad_storage;
  // [i]: the parameters (indices) micro-batch i's loss did not reach on this
  // rank, i.e. that got no gradient from its backward (tp::train::
  // unreached_parameters).
  std::vector<std::vector<int64_t>> unreached_per_micro;
  // A sharded optimizer's (stage 09; empty otherwise): the parameter indices
  // of each rank's shard, as this rank computed them, and the parameters
  // this rank holds optimizer state for after the last step.
  std::vector<std::vector<int64_t>> shard_partition;
  std::vector<int64_t> params_with_state;
  // This rank's tensor bytes by kind (tp::memory), read after the last step
  // (before the final snapshot); the peaks count from just before the model
  // was built (for a fully sharded stage, from its first snapshot, and
  // without the snapshots' gathers: train_rank). Empty when the lesson's own worker ran the rank (--worker): it
  // measures nothing.
  std::optional<memory::Stats> memory;
  std::vector<trace::Event> events;  // when RunConfig::trace is set
};

struct ReferenceResult {
  std::vector<std::vector<double>> losses;  // [rank][i], unscaled micro-batch loss
  Snapshot initial_params;
  Snapshot after_first_step;
  Snapshot final_params;
  std::vector<Snapshot> initial_buffers;  // [rank]: its buffers after construction
  std::vector<Snapshot> final_buffers;    // [rank]: after its last micro-batch
  // Parameters that some rank's micro-batch of step 0 did not reach (no
  // gradient from it), in named_parameters() order: a diagnosis can tell a
  // parameter that disagrees because of that from any other.
  std::vector<std::string> unreached_in_step0;
};

// Appends one micro-batch's collectives (counted since the group's counters
// were reset at its start) to the *_per_micro vectors of `result`, and the
// bytes copied into the storages of `params`' gradients since the last call
// (take_grad_copy_bytes: since the previous micro-batch ended, when nothing
// copies into a gradient but the DDP).
void record_micro_batch(RankResult& result, const distributed::CollectiveCounters& counters,
                        const std::vector<Tensor>& params);

// RankResult::grad_storage for these parameters.
std::vector<int64_t> grad_storage_groups(const std::vector<Tensor>& params);
// The bytes Tensor::copy_ wrote into the storages these parameters' .grad
// live in (each storage once) since each was last read; reading resets them
// (Storage::take_bytes_copied_in). For RankResult::grad_copy_bytes_per_micro.
uint64_t take_grad_copy_bytes(const std::vector<Tensor>& params);

// Collectives a rank issued in optimizer step `step` (its K micro-batches);
// 0 for a step it did not run. K = micro_batches.
uint64_t allreduces_in_step(const RankResult& rank, int64_t micro_batches, int64_t step);
// The sum of a per-micro-batch count (allreduces_per_micro,
// allreduce_bytes_per_micro, ...) over the micro-batches of `step`; the
// micro-batches the vector does not reach count 0.
uint64_t sum_over_step(const std::vector<uint64_t>& per_micro, int64_t micro_batches,
                       int64_t step);

std::string serialize(const RankResult& result);
// REQUIRES: bytes came from serialize(); throws tp::Error naming what is
// wrong otherwise (truncated or corrupt bytes, or not a rank result).
RankResult parse_rank_result(const std::string& bytes);

// Every rank's result, in rank order, on every rank of `group`: two
// all-gathers (the lengths, then the serialized bytes padded to the longest).
// A collective: every rank of the group must call it.
std::vector<RankResult> all_gather_results(distributed::ProcessGroup& group,
                                           const RankResult& mine);

// Euclidean norm over all values of all parameters.
double norm(const Snapshot& snapshot);

}  // namespace tp::train
