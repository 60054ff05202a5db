// Copied from solutions/09-zero/powersgd_hook.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 09 — PowerSGD gradient compression as a communication hook (Vogels,
// Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression
// for Distributed Optimization", NeurIPS 2019; PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook).
//
// Each weight's gradient M (n x m, a Linear layer's (out, in)) is sent as
// two thin matrices: P = M Q (n x r) and Q = M^T P (m x r), r the matrix
// approximation rank, and every rank rebuilds the average as P Q^T / W.
// That is (n + m) r numbers instead of n m. Note [PowerSGD] in
// powersgd_hook.cc walks through one step.
//
// Contract:
//   - Register with ddp.register_comm_hook(state, powerSGD_hook), `state` a
//     std::shared_ptr<PowerSGDState>; one state per DDP, on every rank with
//     the same settings.
//   - For the first start_powerSGD_iter iterations it is allreduce_hook
//     (default_hooks.h): exact averages while the DDP rebuilds its buckets
//     after the first iteration, and while the model moves fast.
//   - Then, per bucket: with use_error_feedback, what compression lost in
//     the previous iteration is added back first. Tensors of one dimension
//     (biases), and matrices whose compression rate n m / ((n + m) r) is not
//     above min_compression_rate, travel uncompressed in one all-reduce;
//     the others as P and Q. r is min(n, m, matrix_approximation_rank) for
//     each matrix, as in PyTorch.
//   - With warm_start, each matrix's Q of the previous iteration starts the
//     next (one power iteration per step, continuing); otherwise, and the
//     first time, Q is drawn from a generator seeded with random_seed and
//     the iteration, the same on every rank.
//   - The result is an approximation; at a rank of min(n, m) for every
//     matrix (and min_compression_rate 0, so that all are compressed) it is
//     the average to float rounding.
//   - Collectives: the hook issues its first two all-reduces (uncompressed
//     tensors, then P) from the backward thread and waits for P there (Note
//     [PowerSGD]: every collective is issued from that thread, in the same
//     order on every rank); the Q all-reduce completes the returned future.
//   - Statistics: numel_before and numel_after count the numbers a rank
//     would all-reduce without and with compression, since the start;
//     compression_rate() is their ratio (1 before compression starts).
//   - Not thread-safe: one DDP, one backward at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "grad_bucket.h"
#include "tensorplay/distributed/future.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/tensor.h"

namespace stage09 {

struct PowerSGDOptions {
  int64_t matrix_approximation_rank = 1;  // r: 1 is usually enough (PyTorch's default)
  int64_t start_powerSGD_iter = 1000;     // PyTorch's default; > 1 with error feedback or warm start
  double min_compression_rate = 2.0;      // compress only where it saves more than this factor
  bool use_error_feedback = true;
  bool warm_start = true;
  uint64_t random_seed = 0;
};

class PowerSGDState {
 public:
  // Throws tp::Error for a rank below 1, a negative min_compression_rate,
  // or start_powerSGD_iter <= 1 with error feedback or warm start (the
  // buckets are rebuilt after the first iteration: state kept per bucket
  // before that would describe other buckets), each naming the setting.
  PowerSGDState(std::shared_ptr<tp::distributed::ProcessGroup> process_group,
                PowerSGDOptions options = {});

  const PowerSGDOptions& options() const { return options_; }
  tp::distributed::ProcessGroup& process_group() const { return *process_group_; }
  // Iterations finished (counted at each backward's last bucket).
  int64_t iteration() const { return iter_; }
  int64_t numel_before() const { return numel_before_; }
  int64_t numel_after() const { return numel_after_; }
  double compression_rate() const;

 private:
  friend std::shared_ptr<tp::distributed::Future> powerSGD_hook(PowerSGDState& state,
                                                                GradBucket& bucket);
  std::shared_ptr<tp::distributed::ProcessGroup> process_group_;  // constant after construction
  PowerSGDOptions options_;                                       // constant after construction
  int64_t iter_ = 0;
  int64_t numel_before_ = 0;
  int64_t numel_after_ = 0;
  // Per bucket index, kept between iterations:
  std::map<size_t, tp::Tensor> error_;     // what compression lost (use_error_feedback)
  std::map<size_t, tp::Tensor> q_memory_;  // every compressed matrix's Q, back to back (warm_start)
};

std::shared_ptr<tp::distributed::Future> powerSGD_hook(PowerSGDState& state, GradBucket& bucket);

}  // namespace stage09
