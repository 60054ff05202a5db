// Stage 10's FSDP on spawned ranks, beside stage 09: what sharding the
// parameters and the gradients does to a training step's time, to the bytes
// a rank's collectives carry, and to the model state a rank holds. Lesson 10
// quotes these numbers.
//
// What it measures, on the step benchmarks' deep model (tp::bench::deep_model:
// 130 parameter tensors in 65 Linear layers, 4.2 MB of float32 parameters) and
// 64 rows per rank (--batch=N), SGD with momentum 0.9, one step being
// zero_grad, forward, loss, backward and the optimizer's step:
//   BM_StepStage10/setup:S   the step with set-up S, one of
//                            ddp (stage 09's DDP with the kit's plain SGD:
//                            buckets all-reduced, every rank steps and
//                            holds everything),
//                            zero_rs (stage 09's reduce-scatter form:
//                            ZeRO-1, parameters and gradients whole),
//                            no_shard, grad_op, full (stage 10's FSDP with
//                            each Linear a unit, under NO_SHARD,
//                            SHARD_GRAD_OP and FULL_SHARD, backward
//                            prefetch BACKWARD_PRE, the default),
//                            full_no_prefetch (FULL_SHARD, no prefetch:
//                            BackwardPrefetch::NONE) and
//                            full_fwd_prefetch (BACKWARD_PRE and
//                            forward_prefetch), and the same with the
//                            model's layers grouped 16 Linears to a
//                            block, each block a unit (4 units of about
//                            1 MB and the last Linear's, where each
//                            Linear makes 65 of 66 KB): grad_op_blocks,
//                            full_blocks_no_prefetch, full_blocks,
//                            full_blocks_fwd_prefetch.
//   BM_FsdpRound             the eleven steps interleaved, one of each per
//                            iteration, in an order rotated every iteration:
//                            "<S>_ms", each one's median step, and
//                            "<S>_over_ddp", the median over the iterations
//                            of its step over the DDP step of the same
//                            iteration: the ratios to quote, since a change
//                            in the machine's load weighs on all alike.
// Counters of BM_StepStage10, per step and rank, after the warm-up:
// "allreduce_bytes", "reduce_scatter_bytes", "allgather_bytes" (what each
// kind of collective was handed, CollectiveCounters: for an all-gather the
// gathered output, for a reduce-scatter its input, both the whole unit),
// "collectives" (how many, all kinds), "model_bytes" (the model, whole),
// and from tp::memory, counted on the tensor storage from an empty process:
// "param_bytes", "grad_bytes", "state_bytes" (what the rank holds after a
// step) and "peak_param_bytes", "peak_grad_bytes", "peak_model_state_bytes"
// (the most it held during the timed steps); "p50_ms", "p90_ms".
//
// What the numbers depend on: as bench_zero.cc, the ranks share the
// machine's cores with their communication threads, and the wire is
// loopback TCP, CPU work too; every byte costs CPU time here, and a
// prefetched all-gather has no idle core to hide behind.
//
// Run: build/bench/bench_fsdp [--world-size=N] [--batch=N]
// [--benchmark_filter=...]; ./kit bench runs it at 2 and 4 ranks.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "09-zero/stage.h"
#include "10-fsdp/stage.h"
#include "tensorplay/data.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/memory.h"
#include "tensorplay/nn/sequential.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "ranked_benchmark.h"

namespace {

namespace dist = tp::distributed;
namespace memory = tp::memory;

using tp::bench::deep_model;

constexpr double kMomentum = 0.9;

enum class Family { Ddp, ZeroRs, Fsdp };

// One set-up, as its label names it.
struct Setup {
  const char* label;
  Family family;
  stage10::ShardingStrategy sharding = stage10::ShardingStrategy::FULL_SHARD;
  bool blocks = false;  // the model in blocks of kBlock Linears, each block a unit
  stage10::BackwardPrefetch backward_prefetch = stage10::BackwardPrefetch::BACKWARD_PRE;
  bool forward_prefetch = false;
};
using stage10::BackwardPrefetch;
using stage10::ShardingStrategy;
constexpr bool kPerLinear = false;
constexpr bool kPerBlock = true;
constexpr Setup kSetups[] = {
    {"ddp", Family::Ddp},
    {"zero_rs", Family::ZeroRs},
    {"no_shard", Family::Fsdp, ShardingStrategy::NO_SHARD},
    {"grad_op", Family::Fsdp, ShardingStrategy::SHARD_GRAD_OP},
    {"full_no_prefetch", Family::Fsdp, ShardingStrategy::FULL_SHARD, kPerLinear,
     BackwardPrefetch::NONE},
    {"full", Family::Fsdp, ShardingStrategy::FULL_SHARD},
    {"full_fwd_prefetch", Family::Fsdp, ShardingStrategy::FULL_SHARD, kPerLinear,
     BackwardPrefetch::BACKWARD_PRE, true},
    {"grad_op_blocks", Family::Fsdp, ShardingStrategy::SHARD_GRAD_OP, kPerBlock},
    {"full_blocks_no_prefetch", Family::Fsdp, ShardingStrategy::FULL_SHARD, kPerBlock,
     BackwardPrefetch::NONE},
    {"full_blocks", Family::Fsdp, ShardingStrategy::FULL_SHARD, kPerBlock},
    {"full_blocks_fwd_prefetch", Family::Fsdp, ShardingStrategy::FULL_SHARD, kPerBlock,
     BackwardPrefetch::BACKWARD_PRE, true},
};

// The same model (the same values, the same order), its layers grouped into
// Sequentials of kBlock Linears and their ReLUs; the last Linear stays a
// child of its own. Under children_wrap_policy each block is one unit.
constexpr size_t kBlock = 16;
std::shared_ptr<tp::nn::Module> model_in_blocks() {
  const std::shared_ptr<tp::nn::Module> flat = deep_model();
  std::vector<std::shared_ptr<tp::nn::Module>> blocks;
  std::vector<std::shared_ptr<tp::nn::Module>> block;
  for (const auto& [name, layer] : flat->children()) {
    block.push_back(layer);
    if (block.size() == 2 * kBlock) {
      blocks.push_back(std::make_shared<tp::nn::Sequential>(std::move(block)));
      block.clear();
    }
  }
  for (auto& layer : block) blocks.push_back(std::move(layer));
  return std::make_shared<tp::nn::Sequential>(std::move(blocks));
}

using Rank = tp::bench::StepRank;  // its group and --batch

// One step of a set-up: stage 09's DDP (with plain SGD or its
// reduce-scatter ZeRO) or stage 10's FSDP, its optimizer, this rank's batch.
class ShardedStep {
 public:
  ShardedStep(const Setup& setup, const Rank& rank)
      : batch_(tp::data::SyntheticRegression().rows(rank.group->rank() * rank.batch,
                                                    rank.batch)) {
    const tp::optim::SGDOptions sgd{.lr = 1e-3, .momentum = kMomentum};
    // The model's parameters are counted as parameters (a unit's flat
    // parameter and its shard are made inside the FSDP's constructor).
    memory::KindScope parameters(memory::Kind::Parameter);
    if (setup.family == Family::Fsdp) {
      stage10::Options options;
      options.sharding_strategy = setup.sharding;
      options.backward_prefetch = setup.backward_prefetch;
      options.forward_prefetch = setup.forward_prefetch;
      if (setup.blocks) options.auto_wrap_policy = stage10::children_wrap_policy();
      fsdp_ = std::make_unique<stage10::FullyShardedDataParallel>(
          setup.blocks ? model_in_blocks() : deep_model(), rank.group, options);
      sgd_ = std::make_unique<tp::optim::SGD>(fsdp_->parameters(), sgd);
      return;
    }
    stage09::RunOptions options;  // the DDP's and make_optimizer's
    options.reduce_scatter = setup.family == Family::ZeroRs;
    ddp_ = std::make_unique<stage09::DistributedDataParallel>(deep_model(), rank.group, options);
    if (setup.family == Family::ZeroRs) {
      zero_ = stage09::make_optimizer(*ddp_, sgd, options);
    } else {
      sgd_ = std::make_unique<tp::optim::SGD>(ddp_->parameters(), sgd);
    }
  }

  void run() {
    if (zero_) zero_->zero_grad(); else sgd_->zero_grad();
    const tp::Tensor out = fsdp_ ? (*fsdp_)(batch_.x) : (*ddp_)(batch_.x);
    tp::mse_loss(out, batch_.y).backward();
    if (zero_) zero_->step(); else sgd_->step();
  }

  void warm_up() {
    for (int64_t i = 0; i < 1 + tp::bench::warmup_iterations(); ++i) run();
  }

  // The FSDP's units (its flat parameters); 0 for a DDP.
  size_t units() const { return fsdp_ ? fsdp_->units().size() : 0; }

 private:
  std::unique_ptr<stage09::DistributedDataParallel> ddp_;
  std::unique_ptr<stage10::FullyShardedDataParallel> fsdp_;
  std::unique_ptr<stage09::ZeroRedundancyOptimizer> zero_;
  std::unique_ptr<tp::optim::SGD> sgd_;
  tp::data::Batch batch_;
};

void bm_step(benchmark::State& state, const Setup& setup, const Rank& rank) {
  // Counted from an empty process: this set-up's model state only (the
  // previous benchmark's step is gone; what remains is subtracted).
  const memory::Stats empty = memory::stats();
  const auto held = [&empty](memory::Kind kind) {
    return static_cast<double>(memory::stats().live_bytes(kind) - empty.live_bytes(kind));
  };
  auto step = std::make_unique<ShardedStep>(setup, rank);
  step->warm_up();
  dist::ProcessGroup& group = *rank.group;
  group.barrier()->wait();
  memory::reset_peaks();
  const dist::CollectiveCounters before = group.counters();
  tp::bench::time_each_iteration(state, "ms", [&] { step->run(); });
  const dist::CollectiveCounters after = group.counters();
  const memory::Stats peaks = memory::stats();
  tp::bench::set_collective_counters(state, before, after,
                                     static_cast<double>(state.iterations()));
  state.counters["param_bytes"] = held(memory::Kind::Parameter);
  state.counters["grad_bytes"] = held(memory::Kind::Gradient);
  state.counters["state_bytes"] = held(memory::Kind::OptimizerState);
  const auto peak_of = [&peaks, &empty](memory::Kind kind) {
    return static_cast<double>(peaks.peak_bytes(kind) - empty.live_bytes(kind));
  };
  state.counters["peak_param_bytes"] = peak_of(memory::Kind::Parameter);
  state.counters["peak_grad_bytes"] = peak_of(memory::Kind::Gradient);
  state.counters["peak_model_state_bytes"] = static_cast<double>(
      peaks.model_state_peak - empty.live_bytes(memory::Kind::Parameter) -
      empty.live_bytes(memory::Kind::Gradient) - empty.live_bytes(memory::Kind::OptimizerState));
  state.counters["model_bytes"] = static_cast<double>(tp::bench::deep_model_bytes());
  state.counters["units"] = static_cast<double>(step->units());
}

}  // namespace

int main(int argc, char** argv) {
  // kSetups[0], "ddp", is what the round's "<label>_over_ddp" ratios divide by.
  return tp::bench::step_variants_main<ShardedStep, Setup>(
      argc, argv, "bench_fsdp", stage10::stage_spec(),
      {.family = "BM_StepStage10", .key = "setup", .variants = kSetups, .one = bm_step,
       .round_name = "BM_FsdpRound", .context = {{"momentum", std::to_string(kMomentum)}}});
}
