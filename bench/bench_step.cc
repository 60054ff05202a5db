// One whole training step of one rank (zero_grad, forward, loss, backward,
// gradient sync, SGD step) on a deep MLP, without DDP and with stages 01, 02
// and 03. Lesson 03 quotes these numbers: they show how much of stage 02's
// sync stage 03 hides behind backward, and on which machine it can.
//
// What it measures, for the step benchmarks' deep model (tp::bench::
// deep_model: deep_mlp(16, 128, 64, 4), 130 parameter tensors, 4.2 MB of
// float32 gradients) and a batch of 64 rows per rank (--batch=N):
//   BM_StepNoDDP             the step with no communication at all: what a
//                            rank computes. Every rank runs it at the same
//                            time, so it competes for the cores as the
//                            others do.
//   BM_StepStage01           stage 01: backward, then sync_grads() (130
//                            all-reduces, each waited for).
//   BM_StepStage02/cap_kib   stage 02: backward, then sync_grads() (one
//                            all-reduce per bucket, all launched before the
//                            first wait).
//   BM_StepStage03/cap_kib   stage 03: the hooks launch each bucket's
//                            all-reduce during backward; backward returns
//                            with every gradient averaged.
//   BM_SyncShareStage01/batch:B, BM_SyncShareStage02/cap_kib:0/batch:B
//                            stages 01 and 02 at B = 1, 16, 64 and 256 rows per
//                            rank: the share of the step the sync takes
//                            ("sync_share"), which falls as the batch (the
//                            compute) grows and the sync stays the same.
//   BM_AccumulateNoDDP/micro:K, BM_AccumulateNoSync/micro:K,
//   BM_AccumulateSyncEvery/micro:K
//                            gradient accumulation (lesson 04): a step of K
//                            = 1, 2, 4, 8 micro-batches of 16 rows, without
//                            DDP, with stage 04 syncing once per step (the
//                            first K - 1 under no_sync), and with stage 04
//                            syncing every micro-batch; "us_per_sample" is
//                            the step's median over its K * 16 rows.
//   BM_OverlapPair/cap_kib:0/batch:B
//                            at the same batches, stage 02 and stage 03
//                            interleaved (one step of each per iteration):
//                            how much of stage 02's sync stage 03 hides
//                            ("hidden"), measured a moment apart.
//   BM_CapSweep/batch:B      only with --cap-sweep=1 (bench/link_bench.py
//                            --cap-sweep): BM_OverlapPair at --batch with
//                            both caps C = 64 KiB (64 buckets for 65 layers)
//                            to 4096 KiB (one bucket), in factors of 2, all
//                            interleaved, 20 steps of each stage at each
//                            cap: which cap gives stage 03 its shortest
//                            step on a link, beside what the alpha-beta fit
//                            predicts.
// cap_kib 0 stands for the default caps (first bucket 1 MiB, the others 25
// MiB: two buckets here, the second three times the first); any other value
// sets both caps to that many KiB (512: 8 buckets, 1024: 4, 2048: 2 equal).
// Counters, per step: "fwd_ms", "bwd_ms" (loss.backward(), which in stage 03
// includes the hooks and the end-of-backward wait), "sync_ms"
// (sync_grads(), stages 01 and 02), "sync_share" (sync_ms over the step's
// wall time; stages 01 and 02), "p50_ms" and "p90_ms" (median and 90th
// percentile of the single steps' wall times), "bwd_cpu_ms" and "sync_cpu_ms" (the
// process's CPU time during those phases, every thread: main, communication,
// Gloo's), "allreduces", "buckets", and "cores": the process's CPU time over
// wall time for the whole loop, i.e. how many cores this rank kept busy (at
// most 1 each for 2 ranks on 2 cores). Repeated runs
// (--benchmark_repetitions=N) add "p90", the 90th percentile of the N
// repetitions, beside the mean, median, stddev and cv.
//
// Why: stage 02 pays its whole sync after backward. Stage 03 launches bucket
// b while backward still computes the earlier layers, so the all-reduces
// overlap with compute and the step shrinks by up to the sync time, minus
// what cannot overlap: the last bucket, which completes with the last
// gradient, and whatever backward is too short to cover. Over loopback the
// sync is CPU work too, so overlap hides only the time a rank waits: where
// every core is already busy with backward (2 ranks on 2 cores), the
// communication thread takes its CPU time from backward. "bwd_cpu_ms" and
// "sync_cpu_ms" against "bwd_ms" and "sync_ms" show how much waiting there
// was to hide.
//
// How it runs: as bench_sync.cc: main() spawns the ranks (2, or
// --world-size=N; Gloo over loopback, OpenBLAS on one thread per rank), or,
// with --init-method=env://, is one rank of a job tools/tprun started
// (ranked_benchmark.h; bench/shaped_link.py runs it so across a shaped link), each
// registers the same benchmarks with fixed iteration counts (the ranks must
// issue the same collectives in the same order; an adaptive count would
// differ between ranks and hang), runs tp::bench::warmup_iterations() untimed steps and a
// barrier before each timed loop, and rank 0 reports. Times are wall-clock.
//
// Run: ./kit bench, or build/bench/bench_step [--benchmark_filter=Stage0[23]]
// [--benchmark_repetitions=10 --benchmark_report_aggregates_only=true]
// [--world-size=N] [--batch=N] [--smoke=1]. A larger batch lengthens forward and
// backward but not the sync: more compute for the sync to hide behind.
// Expect: stage 01 some 25 times slower than no DDP; stage 02 slower than
// no DDP by its sync; stage 03 shorter than stage 02 by the part of the sync
// that found compute to hide behind. On the kit's 2-core machine that is
// within the noise at the default batch and a third or more of the sync
// with --batch=256: lesson 03 ("What overlap buys") has the numbers and
// the reasons. About 15 s with the default flags, about a minute with 5
// repetitions, on 2 cores.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

// The stages' headers have the same names: include them by their folder.
// stage.h is the stage's StageSpec and includes its ddp.h.
#include "01-naive/stage.h"      // stage01::DistributedDataParallel, stage_spec()
#include "02-bucketing/stage.h"  // stage02::...
#include "03-overlap/stage.h"    // stage03::...
#include "04-no-sync/stage.h"    // stage04::...
#include "tensorplay/data.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"
#include "tensorplay/util/temp_dir.h"
#include "ranked_benchmark.h"

namespace {

namespace dist = tp::distributed;
namespace mp = tp::multiprocessing;
using Clock = std::chrono::steady_clock;
using tp::bench::ms_since;
using tp::bench::process_cpu_seconds;

// The model, the step benchmarks' (ranked_benchmark.h says why its size):
// deep_mlp(16, 128, 64, 4), 130 parameter tensors, 4.2 MB.
using tp::bench::deep_model;

// Fixed iteration counts (the same on every rank). Stage 01 is some 20 times
// slower than the others: fewer steps keep the run short.
constexpr int64_t kIterations = 40;
constexpr int64_t kStage01Iterations = 5;

// Micro-batches per step of the BM_Accumulate runs.
constexpr int64_t kAccumulateMicroBatches[] = {1, 2, 4, 8};

// Rows per rank of the BM_SyncShare runs.
constexpr int64_t kShareBatches[] = {1, 16, 64, 256};

// Bucket caps of the stage 02 and 03 runs, in KiB; 0 is the default caps.
constexpr int64_t kCapsKib[] = {0, 512, 1024, 2048};

// The grid of BM_CapSweep (--cap-sweep=1), in KiB, and its steps per cap.
// 64 KiB makes 64 buckets for the 65 layers (a 64 KiB weight closes each;
// the last two layers share one), 4096 KiB one bucket for all 4.2 MB.
constexpr int64_t kSweepCapsKib[] = {64, 128, 256, 512, 1024, 2048, 4096};
constexpr int64_t kSweepIterations = 20;

struct Caps {
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
};
Caps caps_of(int64_t cap_kib) {
  if (cap_kib == 0) return {};
  const double mb = static_cast<double>(cap_kib) / 1024.0;
  return {mb, mb};
}

// What every benchmark of one rank needs: its process group, and the batch
// size (the same on every rank).
using Rank = tp::bench::StepRank;

// This rank's own rows: a different batch on every rank, as in training.
tp::data::Batch batch_of(const Rank& rank) {
  return tp::data::SyntheticRegression().rows(rank.group->rank() * rank.batch, rank.batch);
}

// Per-step phase times, summed over the timed loop: wall-clock, and the
// process's CPU time (all threads) during backward and during the sync.
struct Phases {
  double forward_ms = 0;
  double backward_ms = 0;
  double sync_ms = 0;
  double backward_cpu_ms = 0;
  double sync_cpu_ms = 0;
};

// One training step. `sync` runs between backward and the optimizer step
// (a stage's sync_grads(); nothing for no DDP and stage 03).
template <typename Forward, typename Sync>
void step(Forward&& forward, Sync&& sync, tp::optim::SGD& optimizer,
          const tp::data::Batch& batch, Phases& phases) {
  optimizer.zero_grad();
  auto t = Clock::now();
  tp::Tensor loss = tp::mse_loss(forward(batch.x), batch.y);
  phases.forward_ms += ms_since(t);
  t = Clock::now();
  double cpu = process_cpu_seconds();
  loss.backward();
  phases.backward_ms += ms_since(t);
  phases.backward_cpu_ms += (process_cpu_seconds() - cpu) * 1e3;
  t = Clock::now();
  cpu = process_cpu_seconds();
  sync();
  phases.sync_ms += ms_since(t);
  phases.sync_cpu_ms += (process_cpu_seconds() - cpu) * 1e3;
  optimizer.step();
  benchmark::DoNotOptimize(loss.data_ptr());
}

// Warms up, lines the ranks up, runs the timed loop and reports the
// counters. `one_step(phases)` is one training step; `has_sync_grads`: the
// step calls a stage's sync_grads() (stages 01 and 02), whose share of the
// step is then reported.
template <typename OneStep>
void run_steps(benchmark::State& state, dist::ProcessGroup& group, OneStep&& one_step,
               bool has_sync_grads = false) {
  Phases warmup;
  for (int i = 0; i < tp::bench::warmup_iterations(); ++i) one_step(warmup);
  group.barrier()->wait();

  Phases phases;
  const uint64_t allreduces_before = group.counters().allreduce;
  const double cpu_before = process_cpu_seconds();
  const auto wall_start = Clock::now();
  tp::bench::time_each_iteration(state, "ms", [&] { one_step(phases); });
  const double wall_ms = ms_since(wall_start);
  const double cpu_ms = (process_cpu_seconds() - cpu_before) * 1e3;

  using benchmark::Counter;
  state.counters["fwd_ms"] = Counter(phases.forward_ms, Counter::kAvgIterations);
  state.counters["bwd_ms"] = Counter(phases.backward_ms, Counter::kAvgIterations);
  state.counters["sync_ms"] = Counter(phases.sync_ms, Counter::kAvgIterations);
  state.counters["bwd_cpu_ms"] = Counter(phases.backward_cpu_ms, Counter::kAvgIterations);
  state.counters["sync_cpu_ms"] = Counter(phases.sync_cpu_ms, Counter::kAvgIterations);
  state.counters["allreduces"] =
      Counter(static_cast<double>(group.counters().allreduce - allreduces_before),
              Counter::kAvgIterations);
  state.counters["cores"] = cpu_ms / wall_ms;
  // Stage 03 has no sync of its own to time: it runs inside backward.
  if (has_sync_grads) state.counters["sync_share"] = phases.sync_ms / wall_ms;
}

void bm_no_ddp(benchmark::State& state, const Rank& rank) {
  auto model = deep_model();
  tp::optim::SGD optimizer(model->parameters(), {.lr = 1e-3});
  const tp::data::Batch batch = batch_of(rank);
  run_steps(state, *rank.group, [&](Phases& phases) {
    step([&](const tp::Tensor& x) { return model->forward(x); }, [] {}, optimizer, batch, phases);
  });
}

void bm_stage01(benchmark::State& state, const Rank& rank) {
  stage01::DistributedDataParallel ddp(deep_model(), rank.group);
  tp::optim::SGD optimizer(ddp.parameters(), {.lr = 1e-3});
  const tp::data::Batch batch = batch_of(rank);
  run_steps(state, *rank.group, [&](Phases& phases) {
    step([&](const tp::Tensor& x) { return ddp(x); }, [&] { ddp.sync_grads(); }, optimizer,
         batch, phases);
  }, /*has_sync_grads=*/true);
}

void bm_stage02(benchmark::State& state, const Rank& rank) {
  const Caps caps = caps_of(state.range(0));
  stage02::DistributedDataParallel ddp(
      deep_model(), rank.group,
      {.bucket_cap_mb = caps.bucket_cap_mb, .first_bucket_cap_mb = caps.first_bucket_cap_mb});
  tp::optim::SGD optimizer(ddp.parameters(), {.lr = 1e-3});
  const tp::data::Batch batch = batch_of(rank);
  run_steps(state, *rank.group, [&](Phases& phases) {
    step([&](const tp::Tensor& x) { return ddp(x); }, [&] { ddp.sync_grads(); }, optimizer,
         batch, phases);
  }, /*has_sync_grads=*/true);
  state.counters["buckets"] = static_cast<double>(ddp.bucket_assignment().size());
}

void bm_stage03(benchmark::State& state, const Rank& rank) {
  const Caps caps = caps_of(state.range(0));
  stage03::DistributedDataParallel ddp(
      deep_model(), rank.group,
      {.bucket_cap_mb = caps.bucket_cap_mb, .first_bucket_cap_mb = caps.first_bucket_cap_mb});
  tp::optim::SGD optimizer(ddp.parameters(), {.lr = 1e-3});
  const tp::data::Batch batch = batch_of(rank);
  run_steps(state, *rank.group, [&](Phases& phases) {
    // No sync call: backward returns with the gradients averaged.
    step([&](const tp::Tensor& x) { return ddp(x); }, [] {}, optimizer, batch, phases);
  });
  state.counters["buckets"] = static_cast<double>(ddp.bucket_assignment().size());
}

// Stage 02 and stage 03 at the same caps, on the same batch, each with its
// own copy of the model and its own SGD, keeping the medians of their steps
// and phases: a pair that BM_OverlapPair and BM_CapSweep step a moment
// apart, so that both stages meet the machine at the same moments.
class StagePair {
 public:
  StagePair(const Rank& rank, int64_t cap_kib)
      : ddp02_(deep_model(), rank.group, options_of<stage02::Options>(cap_kib)),
        ddp03_(deep_model(), rank.group, options_of<stage03::Options>(cap_kib)),
        sgd02_(ddp02_.parameters(), {.lr = 1e-3}),
        sgd03_(ddp03_.parameters(), {.lr = 1e-3}),
        batch_(batch_of(rank)) {}

  // One step of each, stage 02's first when `first02`.
  void step_both(bool first02) {
    if (first02) {
      step02();
      step03();
    } else {
      step03();
      step02();
    }
    saved_.push_back(s02_.back() - s03_.back());
  }

  // Forgets the steps so far (the warm-up's).
  void clear() {
    for (auto* times : {&s02_, &s03_, &sync02_, &saved_, &fwd02_, &bwd02_, &fwd03_, &bwd03_}) {
      times->clear();
    }
  }

  // The medians, as counters named NAME + suffix (see BM_OverlapPair).
  void report(benchmark::State& state, const std::string& suffix) const {
    using tp::bench::quantile;
    state.counters["s02_ms" + suffix] = quantile(s02_, 0.5);
    state.counters["s03_ms" + suffix] = quantile(s03_, 0.5);
    state.counters["sync02_ms" + suffix] = quantile(sync02_, 0.5);
    state.counters["fwd02_ms" + suffix] = quantile(fwd02_, 0.5);
    state.counters["bwd02_ms" + suffix] = quantile(bwd02_, 0.5);
    state.counters["fwd03_ms" + suffix] = quantile(fwd03_, 0.5);
    state.counters["bwd03_ms" + suffix] = quantile(bwd03_, 0.5);
    state.counters["hidden" + suffix] = quantile(saved_, 0.5) / quantile(sync02_, 0.5);
    // The same caps give both stages the same buckets.
    state.counters["buckets" + suffix] = static_cast<double>(ddp03_.bucket_assignment().size());
  }

 private:
  template <typename Options>
  static Options options_of(int64_t cap_kib) {
    const Caps caps = caps_of(cap_kib);
    return {.bucket_cap_mb = caps.bucket_cap_mb, .first_bucket_cap_mb = caps.first_bucket_cap_mb};
  }

  void step02() {
    Phases phases;
    const auto start = Clock::now();
    step([&](const tp::Tensor& x) { return ddp02_(x); }, [&] { ddp02_.sync_grads(); }, sgd02_,
         batch_, phases);
    s02_.push_back(ms_since(start));
    sync02_.push_back(phases.sync_ms);
    fwd02_.push_back(phases.forward_ms);
    bwd02_.push_back(phases.backward_ms);
  }

  void step03() {
    Phases phases;
    const auto start = Clock::now();
    step([&](const tp::Tensor& x) { return ddp03_(x); }, [] {}, sgd03_, batch_, phases);
    s03_.push_back(ms_since(start));
    fwd03_.push_back(phases.forward_ms);
    bwd03_.push_back(phases.backward_ms);
  }

  stage02::DistributedDataParallel ddp02_;
  stage03::DistributedDataParallel ddp03_;
  tp::optim::SGD sgd02_;
  tp::optim::SGD sgd03_;
  tp::data::Batch batch_;
  std::vector<double> s02_, s03_, sync02_, saved_, fwd02_, bwd02_, fwd03_, bwd03_;
};

// Stage 02 and stage 03 side by side, one step of each per iteration, in an
// order swapped every iteration, on the same batch and caps: what stage 03
// hides is measured against a stage 02 step taken a moment apart, not
// minutes apart. Counters: "s02_ms", "s03_ms" (step medians), "sync02_ms"
// (the median of stage 02's sync_grads()), "fwd02_ms", "bwd02_ms",
// "fwd03_ms", "bwd03_ms" (the medians of each stage's forward and backward;
// stage 03's backward includes its hooks and its end-of-backward wait, so
// bwd03_ms - bwd02_ms is the part of the sync it did not hide), "hidden":
// the median over the iterations of (stage 02's step - stage 03's step),
// over sync02_ms, and "buckets".
void bm_overlap_pair(benchmark::State& state, const Rank& rank) {
  StagePair pair(rank, state.range(0));
  for (int i = 0; i < tp::bench::warmup_iterations(); ++i) pair.step_both(true);
  pair.clear();
  rank.group->barrier()->wait();
  bool first02 = true;
  for (auto _ : state) {
    pair.step_both(first02);
    first02 = !first02;
  }
  pair.report(state, "");
}

// Every cap of kSweepCapsKib at once: a StagePair per cap, and per
// iteration one pair of steps at each cap, the caps in a shuffled order
// (a new one each iteration, so that no cap always follows the same
// neighbour) and each cap's pair led by stage 02 and stage 03 in turn: the
// caps, too, meet the machine at the same moments. Every rank draws the same
// orders (the same generator, seeded with the iteration): their collectives
// must pair up. Counters as BM_OverlapPair's, per cap, suffixed "_cap" + KiB
// ("s03_ms_cap512").
void bm_cap_sweep(benchmark::State& state, const Rank& rank) {
  std::vector<std::unique_ptr<StagePair>> pairs;
  for (int64_t cap : kSweepCapsKib) pairs.push_back(std::make_unique<StagePair>(rank, cap));
  const size_t n = pairs.size();
  for (int i = 0; i < tp::bench::warmup_iterations(); ++i) {
    for (auto& pair : pairs) pair->step_both(true);
  }
  for (auto& pair : pairs) pair->clear();
  rank.group->barrier()->wait();
  std::vector<size_t> order(n);
  for (size_t j = 0; j < n; ++j) order[j] = j;
  uint32_t iteration = 0;
  for (auto _ : state) {
    // Fisher-Yates with the generator's own output (std::shuffle's use of
    // it is the library's choice; this one is the same on every rank).
    std::mt19937 draw(iteration);
    for (size_t j = n - 1; j > 0; --j) std::swap(order[j], order[draw() % (j + 1)]);
    for (size_t j : order) pairs[j]->step_both((iteration + j) % 2 == 0);
    ++iteration;
  }
  for (size_t k = 0; k < n; ++k) {
    pairs[k]->report(state, "_cap" + std::to_string(kSweepCapsKib[k]));
  }
}

// Gradient accumulation (lesson 04): one optimizer step made of K
// micro-batches of kAccumulateRows rows each, every micro-batch's loss
// scaled by 1/K. NoSync runs the first K - 1 under stage 04's no_sync(), so
// the step syncs once; SyncEvery runs them all outside it, so every
// micro-batch syncs (what accumulating without no_sync costs); NoDDP does
// not communicate at all.
constexpr int64_t kAccumulateRows = 16;
enum class Accumulate { NoDDP, NoSync, SyncEvery };

template <Accumulate mode>
void bm_accumulate(benchmark::State& state, const Rank& rank) {
  const int64_t k = state.range(0);
  std::shared_ptr<tp::nn::Module> model = deep_model();
  std::unique_ptr<stage04::DistributedDataParallel> ddp;
  if (mode != Accumulate::NoDDP) {
    ddp = std::make_unique<stage04::DistributedDataParallel>(model, rank.group);
  }
  tp::optim::SGD optimizer(model->parameters(), {.lr = 1e-3});
  std::vector<tp::data::Batch> micro;  // this rank's K micro-batches
  for (int64_t i = 0; i < k; ++i) {
    micro.push_back(tp::data::SyntheticRegression().rows(
        (rank.group->rank() * k + i) * kAccumulateRows, kAccumulateRows));
  }
  run_steps(state, *rank.group, [&](Phases& phases) {
    optimizer.zero_grad();
    for (int64_t i = 0; i < k; ++i) {
      auto forward_backward = [&] {
        auto t = Clock::now();
        const tp::Tensor out = ddp ? (*ddp)(micro[i].x) : model->forward(micro[i].x);
        tp::Tensor loss = tp::mul(tp::mse_loss(out, micro[i].y), 1.0 / static_cast<double>(k));
        phases.forward_ms += ms_since(t);
        t = Clock::now();
        loss.backward();
        phases.backward_ms += ms_since(t);
      };
      if (mode == Accumulate::NoSync && i + 1 < k) {
        auto no_sync = ddp->no_sync();
        forward_backward();
      } else {
        forward_backward();
      }
    }
    optimizer.step();
  });
  state.counters["us_per_sample"] = state.counters["p50_ms"] * 1e3 / static_cast<double>(k * kAccumulateRows);
}

using StepBenchmark = void (*)(benchmark::State&, const Rank&);

benchmark::internal::Benchmark* register_step(const char* name, StepBenchmark run,
                                              int64_t iterations, const Rank& rank) {
  return benchmark::RegisterBenchmark(name,
                                      [run, rank](benchmark::State& state) { run(state, rank); })
      ->Iterations(tp::bench::iterations(iterations))
      ->ComputeStatistics("p90", tp::bench::p90)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

void register_benchmarks(const Rank& rank, bool cap_sweep) {
  tp::bench::describe_stage(stage01::stage_spec());
  tp::bench::describe_stage(stage02::stage_spec());
  tp::bench::describe_stage(stage03::stage_spec());
  tp::bench::describe_stage(stage04::stage_spec());
  register_step("BM_StepNoDDP", bm_no_ddp, kIterations, rank);
  register_step("BM_StepStage01", bm_stage01, kStage01Iterations, rank);
  // Stage 02 and 03 side by side for each cap, so that a change in the
  // machine's load during the run weighs on both alike.
  for (int64_t cap : kCapsKib) {
    register_step("BM_StepStage02", bm_stage02, kIterations, rank)->ArgName("cap_kib")->Arg(cap);
    register_step("BM_StepStage03", bm_stage03, kIterations, rank)->ArgName("cap_kib")->Arg(cap);
  }
  // Gradient accumulation: K micro-batches per step, three ways.
  for (int64_t k : kAccumulateMicroBatches) {
    register_step("BM_AccumulateNoDDP", bm_accumulate<Accumulate::NoDDP>, kIterations / 2, rank)
        ->ArgName("micro")->Arg(k);
    register_step("BM_AccumulateNoSync", bm_accumulate<Accumulate::NoSync>, kIterations / 2, rank)
        ->ArgName("micro")->Arg(k);
    register_step("BM_AccumulateSyncEvery", bm_accumulate<Accumulate::SyncEvery>,
                  kIterations / 2, rank)
        ->ArgName("micro")->Arg(k);
  }
  // How much of a step the sync takes as the batch grows (lesson 01's
  // measurement exercise): the compute grows with the batch, the sync not.
  for (int64_t batch : kShareBatches) {
    const Rank sized{rank.group, batch};
    register_step("BM_SyncShareStage01", bm_stage01, kStage01Iterations, sized)
        ->ArgName("batch")->Arg(batch);
    register_step("BM_SyncShareStage02", bm_stage02, kIterations, sized)
        ->ArgNames({"cap_kib", "batch"})->Args({0, batch});
    // Stage 02 and 03 interleaved: how much of that sync overlap hides.
    register_step("BM_OverlapPair", bm_overlap_pair, kIterations, sized)
        ->ArgNames({"cap_kib", "batch"})->Args({0, batch});
  }
  if (cap_sweep) {
    register_step("BM_CapSweep", bm_cap_sweep, kSweepIterations, rank)
        ->ArgName("batch")->Arg(rank.batch);
  }
}

}  // namespace

int main(int argc, char** argv) {
  long batch = tp::bench::kStepBatch;
  long cap_sweep = 0;
  return tp::bench::ranked_benchmark_main(
      argc, argv, "bench_step", tp::bench::kStepWorldSize,
      {tp::bench::batch_flag(&batch),
       {"cap-sweep", 0, 1, "1 adds BM_CapSweep, stages 02 and 03 at caps of 64 KiB to "
                           "4 MiB", &cap_sweep}},
      [&batch, &cap_sweep](const tp::bench::RankSetup& setup) {
        register_benchmarks({setup.group, batch}, cap_sweep == 1);
      });
}
