// Stage 09's sharded optimizer on spawned ranks: what ZeRO does to a
// training step's time, to the bytes a rank's collectives carry, and to the
// optimizer state a rank holds. Lesson 09 quotes these numbers.
//
// What it measures, on the step benchmarks' deep model (tp::bench::deep_model:
// 130 parameter tensors, 4.2 MB of float32 parameters) and 64 rows per rank
// (--batch=N), SGD with momentum 0.9, one step being zero_grad, forward,
// loss, backward (the DDP's buckets, bucket by bucket) and the optimizer's
// step:
//   BM_StepStage09/opt:O   the step with optimizer O, one of
//                          sgd (stage 09's DDP with the kit's plain SGD:
//                          every rank steps everything, as stage 08),
//                          zero (ZeroRedundancyOptimizer composed with the
//                          DDP, shards sent by one all-gather),
//                          zero_broadcast (the same, one broadcast per
//                          shard, as PyTorch), and
//                          zero_rs (the reduce-scatter form: the DDP sends
//                          nothing, step() reduce-scatters the gradients).
//   BM_ZeroRound           the four steps interleaved, one of each per
//                          iteration, in an order rotated every iteration:
//                          "<O>_ms", each one's median step, and
//                          "<O>_over_sgd", the median over the iterations of
//                          its step over the plain SGD step of the same
//                          iteration: the ratios to quote, since a change
//                          in the machine's load weighs on all alike.
// Counters of BM_StepStage09, per step and rank, after the warm-up:
// "allreduce_bytes", "reduce_scatter_bytes", "allgather_bytes",
// "broadcast_bytes" (what each kind of collective was handed,
// CollectiveCounters), "collectives" (how many, all kinds), "state_bytes"
// (the optimizer state this rank holds: tp::memory's OptimizerState live
// bytes, counted on the tensor storage), "param_bytes" (the model), and
// "p50_ms", "p90_ms".
//
// What the numbers depend on: as bench_hooks.cc, the ranks share the
// machine's cores with their communication threads, and the wire is
// loopback TCP, CPU work too; every byte costs CPU time here.
//
// Run: build/bench/bench_zero [--world-size=N] [--batch=N]
// [--benchmark_filter=...]; ./kit bench runs it at 2 and 4 ranks.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "09-zero/stage.h"
#include "tensorplay/data.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/memory.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "ranked_benchmark.h"

namespace {

namespace dist = tp::distributed;

constexpr double kMomentum = 0.9;

// One optimizer set-up, as its label names it.
struct Optimizer {
  const char* label;
  bool sharded = false;
  bool reduce_scatter = false;
  const char* param_sync = "allgather";
};
constexpr Optimizer kOptimizers[] = {{"sgd"},
                                     {"zero", true},
                                     {"zero_broadcast", true, false, "broadcast"},
                                     {"zero_rs", true, true}};

using Rank = tp::bench::StepRank;  // its group and --batch

// One DDP of stage 09 and its optimizer, and this rank's batch.
class ZeroStep {
 public:
  ZeroStep(const Optimizer& opt, const Rank& rank)
      : ddp_(tp::bench::deep_model(), rank.group, options_of(opt)),
        batch_(tp::data::SyntheticRegression().rows(rank.group->rank() * rank.batch,
                                                    rank.batch)) {
    const tp::optim::SGDOptions sgd{.lr = 1e-3, .momentum = kMomentum};
    if (opt.sharded) {
      zero_ = stage09::make_optimizer(ddp_, sgd, options_of(opt));
    } else {
      sgd_ = std::make_unique<tp::optim::SGD>(ddp_.parameters(), sgd);
    }
  }

  void run() {
    if (zero_) zero_->zero_grad(); else sgd_->zero_grad();
    tp::mse_loss(ddp_(batch_.x), batch_.y).backward();
    if (zero_) zero_->step(); else sgd_->step();
  }

  void warm_up() {
    for (int64_t i = 0; i < 1 + tp::bench::warmup_iterations(); ++i) run();
  }

 private:
  static stage09::RunOptions options_of(const Optimizer& opt) {
    stage09::RunOptions options;
    options.reduce_scatter = opt.reduce_scatter;
    options.param_sync = opt.param_sync;
    return options;
  }

  stage09::DistributedDataParallel ddp_;
  std::unique_ptr<stage09::ZeroRedundancyOptimizer> zero_;
  std::unique_ptr<tp::optim::SGD> sgd_;
  tp::data::Batch batch_;
};

void bm_step(benchmark::State& state, const Optimizer& opt, const Rank& rank) {
  // Counted from an empty process: this optimizer's state only.
  const uint64_t state_before = tp::memory::stats().live_bytes(tp::memory::Kind::OptimizerState);
  ZeroStep step(opt, rank);
  step.warm_up();
  const uint64_t state_bytes =
      tp::memory::stats().live_bytes(tp::memory::Kind::OptimizerState) - state_before;
  dist::ProcessGroup& group = *rank.group;
  group.barrier()->wait();
  const dist::CollectiveCounters before = group.counters();
  tp::bench::time_each_iteration(state, "ms", [&] { step.run(); });
  const dist::CollectiveCounters after = group.counters();
  tp::bench::set_collective_counters(state, before, after,
                                     static_cast<double>(state.iterations()));
  state.counters["state_bytes"] = static_cast<double>(state_bytes);
  state.counters["param_bytes"] = static_cast<double>(tp::bench::deep_model_bytes());
}

}  // namespace

int main(int argc, char** argv) {
  // kOptimizers[0], "sgd", is what the round's "<label>_over_sgd" ratios divide by.
  return tp::bench::step_variants_main<ZeroStep, Optimizer>(
      argc, argv, "bench_zero", stage09::stage_spec(),
      {.family = "BM_StepStage09", .key = "opt", .variants = kOptimizers, .one = bm_step,
       .round_name = "BM_ZeroRound", .context = {{"momentum", std::to_string(kMomentum)}}});
}
