// Stage 08's communication hooks on spawned ranks: what each built-in hook
// does to a training step's time and to the bytes a rank all-reduces.
// Lesson 08 quotes these numbers.
//
// What it measures, on the step benchmarks' deep model (tp::bench::deep_model:
// 130 parameter tensors, 4.2 MB of float32 gradients) and 64 rows per rank
// (--batch=N), one step being zero_grad, forward, loss, backward (which
// syncs, bucket by bucket, through the hook) and an SGD step:
//   BM_StepStage08Hook/hook:H   the step with hook H registered, H one of
//                               none (stage 08's default all-reduce),
//                               allreduce (allreduce_hook), fp16
//                               (fp16_compress_hook), powersgd_r1 and
//                               powersgd_r4 (powerSGD_hook at ranks 1
//                               and 4).
//   BM_HookRound                the same five steps interleaved, one of
//                               each per iteration, in an order rotated
//                               every iteration: "<H>_ms", each hook's
//                               median step, and "<H>_over_none", the
//                               median over the iterations of its step over
//                               the no-hook step of the same iteration.
//                               Run a moment apart, so a change in the
//                               machine's load weighs on every hook alike:
//                               the ratios to quote. (Its medians can run
//                               above BM_StepStage08Hook's: five models
//                               take turns in the caches.)
// Counters of BM_StepStage08Hook, per step and rank, after the warm-up:
// "allreduce_bytes" (bytes handed to all-reduces, CollectiveCounters::
// allreduce_bytes), "allreduces", "grad_bytes" (the model's gradients: what
// no hook sends), "compression" (grad_bytes over allreduce_bytes),
// "p50_ms" and "p90_ms" (median and 90th percentile of the single steps),
// "bwd_ms" (backward, with the hook's work and the wait for its futures),
// "cpu_ms" (the process's CPU time, every thread: main, communication,
// Gloo's; what a hook's conversions and matrix products add shows here),
// and "cores" (that CPU time over wall time).
//
// Warm-up: every DDP first runs kPowerSGDStart + warmup_iterations() untimed
// steps (4; 2 under --smoke=1), so PowerSGD, which all-reduces plainly for
// its first kPowerSGDStart iterations, is compressing when the timing and
// the byte count start, and the DDP has rebuilt its buckets (after its
// first iteration, as stage 06 does).
//
// Not measured: bf16_compress_hook. Gloo has no bfloat16 sum, and the hook's
// all-reduce throws tp::DistributedError saying so (default_hooks.h);
// it runs on NCCL only.
//
// What the numbers depend on: the ranks share the machine's cores with
// their communication threads and Gloo's, and the wire is loopback TCP,
// which is CPU work too (kernel copies). Compression saves bytes, and bytes
// are cheap here (about 1 ns each, bench_allreduce); the conversions cost CPU
// time on the same cores. Where bytes cost more, the balance moves towards
// the hooks: bench/link_rounds.py --program hooks runs this round on a
// shaped link, PyTorch's beside it (bench/results/link_hooks.md, lesson 08).
//
// Run: build/bench/bench_hooks [--world-size=N] [--batch=N]
// [--benchmark_filter=...]; ./kit bench runs it at 2 and 4 ranks.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "08-comm-hooks/stage.h"
#include "tensorplay/data.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "ranked_benchmark.h"

namespace {

namespace dist = tp::distributed;
using Clock = std::chrono::steady_clock;
using tp::bench::ms_since;
using tp::bench::process_cpu_seconds;

// Iterations of plain all-reduce before PowerSGD compresses: 2, the least
// PowerSGDState accepts with error feedback and warm start.
constexpr int64_t kPowerSGDStart = 2;

// One built-in hook as RunOptions::comm_hook names it, with PowerSGD's rank.
struct Hook {
  const char* label;  // in benchmark names and counters
  const char* name;   // stage08::RunOptions::comm_hook
  int64_t powersgd_rank = 1;
};
constexpr Hook kHooks[] = {{"none", "none"},
                           {"allreduce", "allreduce"},
                           {"fp16", "fp16"},
                           {"powersgd_r1", "powersgd", 1},
                           {"powersgd_r4", "powersgd", 4}};

// What every benchmark of one rank needs: its process group, and the batch
// size (the same on every rank).
using Rank = tp::bench::StepRank;

// One DDP of stage 08 with `hook` registered as the kit's trainer registers
// it (register_builtin_hook), its optimizer and this rank's batch (a
// different one on every rank, as in training).
class HookedStep {
 public:
  HookedStep(const Hook& hook, const Rank& rank)
      : ddp_(tp::bench::deep_model(), rank.group, options_of(hook)),
        optimizer_(ddp_.parameters(), {.lr = 1e-3}),
        batch_(tp::data::SyntheticRegression().rows(rank.group->rank() * rank.batch,
                                                    rank.batch)) {
    stage08::register_builtin_hook(ddp_, options_of(hook));
  }

  // One training step; adds its backward's wall time to *backward_ms.
  void run(double* backward_ms = nullptr) {
    optimizer_.zero_grad();
    tp::Tensor loss = tp::mse_loss(ddp_(batch_.x), batch_.y);
    const auto start = Clock::now();
    loss.backward();  // syncs: the hook's collectives, then the wait for its futures
    if (backward_ms) *backward_ms += ms_since(start);
    optimizer_.step();
    benchmark::DoNotOptimize(loss.data_ptr());
  }

  // Untimed steps until PowerSGD compresses and the buckets are rebuilt.
  void warm_up() {
    for (int64_t i = 0; i < kPowerSGDStart + tp::bench::warmup_iterations(); ++i) run();
  }

 private:
  static stage08::RunOptions options_of(const Hook& hook) {
    stage08::RunOptions options;
    options.comm_hook = hook.name;
    options.powersgd_rank = hook.powersgd_rank;
    options.powersgd_start_iteration = kPowerSGDStart;
    return options;
  }

  stage08::DistributedDataParallel ddp_;
  tp::optim::SGD optimizer_;
  tp::data::Batch batch_;
};

void bm_step_hook(benchmark::State& state, const Hook& hook, const Rank& rank) {
  HookedStep step(hook, rank);
  step.warm_up();
  dist::ProcessGroup& group = *rank.group;
  group.barrier()->wait();

  const dist::CollectiveCounters before = group.counters();
  double backward_ms = 0;
  const double cpu_before = process_cpu_seconds();
  const auto wall_start = Clock::now();
  tp::bench::time_each_iteration(state, "ms", [&] { step.run(&backward_ms); });
  const double wall_ms = ms_since(wall_start);
  const double cpu_ms = (process_cpu_seconds() - cpu_before) * 1e3;
  const dist::CollectiveCounters after = group.counters();

  using benchmark::Counter;
  const auto steps = static_cast<double>(state.iterations());
  const double bytes = static_cast<double>(after.allreduce_bytes - before.allreduce_bytes) / steps;
  state.counters["allreduce_bytes"] = bytes;
  state.counters["allreduces"] = static_cast<double>(after.allreduce - before.allreduce) / steps;
  // The model's gradients: what one step all-reduces without a hook.
  const auto grad_bytes = static_cast<double>(tp::bench::deep_model_bytes());
  state.counters["grad_bytes"] = grad_bytes;
  state.counters["compression"] = grad_bytes / bytes;
  state.counters["bwd_ms"] = Counter(backward_ms, Counter::kAvgIterations);
  state.counters["cpu_ms"] = cpu_ms / steps;
  state.counters["cores"] = cpu_ms / wall_ms;
}

}  // namespace

int main(int argc, char** argv) {
  // kHooks[0], "none", is what the round's "<label>_over_none" ratios divide by.
  return tp::bench::step_variants_main<HookedStep, Hook>(
      argc, argv, "bench_hooks", stage08::stage_spec(),
      {.family = "BM_StepStage08Hook", .key = "hook", .variants = kHooks, .one = bm_step_hook,
       .round_name = "BM_HookRound",
       .context = {{"powersgd_start_iteration", std::to_string(kPowerSGDStart)}}});
}
