// The gradient sync of one training step, three ways: stage 01's one
// all-reduce per parameter, stage 02's one all-reduce per bucket, and a
// single flat all-reduce of the same number of bytes. Lessons 01 and 02
// quote these numbers.
//
// What it measures, for deep_mlp(in=256, width=256, depth=D, out=16) with
// D in {2, 8, 32, 64} (2 * (D + 1) parameter tensors, 0.5 to 16.9 MB of
// float32):
//   BM_Stage01SyncGrads/D   stage01::DistributedDataParallel::sync_grads():
//                           2 * (D + 1) all-reduces, each waited for, then
//                           divided by the world size.
//   BM_Stage02SyncGrads/D   stage02::DistributedDataParallel::sync_grads()
//                           with the default caps (first bucket 1 MiB, the
//                           others 25 MiB): copy every gradient into its
//                           bucket, one all-reduce per bucket, all launched
//                           before the first wait, divide, copy back.
//   BM_OneFlatAllreduce/D   one all-reduce (SUM, wait) of one flat float32
//                           tensor with as many elements as the model has
//                           parameters: the lower bound that bucketing
//                           approaches (no copies, no division).
//   BM_Stage02BucketCap/C   stage 02 at D = 64 with both caps set to C KiB,
//                           C from 10 KiB (about 0.01 MiB: 65 buckets, one
//                           per layer, its 1 KiB bias and then its 256 KiB
//                           weight, which closes the bucket; all launched
//                           before the first wait)
//                           to 100 MiB (one bucket), in steps of about 3x:
//                           the sweep from a bucket per layer to one bucket.
//                           bench/report.py draws it beside the alpha-beta
//                           model's prediction (bench_allreduce.cc) and
//                           marks the best cap.
// Counters: "allreduces" is all-reduces per sync, "MB" the payload per sync
// (10^6 bytes), bytes_per_second the payload rate, p50_ms and p90_ms the
// median and 90th percentile of single syncs. Only the sync is timed: no
// forward or backward runs inside the loop. Besides Google Benchmark's mean,
// median, stddev and cv, repeated runs (--benchmark_repetitions=N) report
// "p90": the 90th percentile of the N repetitions' times.
//
// Why: every all-reduce pays a fixed cost (queue to the communication thread,
// a Gloo ring round over TCP, the wake-up of the waiting thread) on top of the
// bytes it moves. With many small tensors the fixed cost dominates, so the
// per-parameter sync falls further behind the flat one as D grows, while a
// handful of buckets pays it a handful of times.
//
// How it runs: main() spawns the ranks (2, or --world-size=N; real processes,
// Gloo over loopback, rendezvous in a fresh TempDir). Each rank registers the
// same benchmarks with a fixed iteration count, because all ranks must issue
// the same collectives in the same order; an adaptive count (Google
// Benchmark's default) would differ between ranks and hang. A barrier before
// each timed loop lines the ranks up. Rank 0 reports as any benchmark program
// does (and honours --benchmark_out); the other ranks run the same benchmarks
// silently. Times are wall-clock (UseRealTime): the work happens on the
// communication thread and in the other processes, not on the timed thread's
// CPU clock.
//
// Run: ./kit bench, or build/bench/bench_sync [--benchmark_filter=/64/]
// [--benchmark_repetitions=10 --benchmark_report_aggregates_only=true]
// [--world-size=4] [--smoke=1].
// Expect: at D = 64 the bucketed sync is several times faster than the
// per-parameter one and takes about 1.5x the flat all-reduce, the rest being
// its copies in and out and its division (the "CPU" column, the timed
// thread's CPU time, shows them); with the default flags the whole program
// takes well under a minute.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

// The stages' headers have the same names: include them by their folder
// (stage.h is the stage's StageSpec and includes its ddp.h).
#include "01-naive/stage.h"      // stage01::DistributedDataParallel, stage_spec()
#include "02-bucketing/stage.h"  // stage02::...
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/random.h"
#include "tensorplay/tensor.h"
#include "tensorplay/util/temp_dir.h"
#include "ranked_benchmark.h"

namespace {

namespace dist = tp::distributed;
namespace mp = tp::multiprocessing;

// Ranks unless --world-size=N says otherwise.
constexpr int kDefaultWorldSize = 2;

// The model: deep_mlp(kIn, kWidth, depth, kOut).
constexpr int64_t kIn = 256;
constexpr int64_t kWidth = 256;
constexpr int64_t kOut = 16;

// Each depth with its fixed iteration counts (the same on every rank; see
// the top of the file): one for the per-parameter sync, one for the bucketed
// and the flat ones, which are many times faster at depth. Fewer iterations
// for the bigger models keep the whole run short.
struct Case {
  int64_t depth;
  int64_t per_parameter_iterations;
  int64_t flat_iterations;
};
constexpr Case kCases[] = {{2, 200, 200}, {8, 100, 100}, {32, 40, 40}, {64, 5, 40}};

// The bucket-cap sweep (BM_Stage02BucketCap): its model's depth, and each cap
// in KiB (0.01 to 100 MiB) with its iteration count: the smallest caps
// issue as many all-reduces as stage 01 and get fewer iterations.
constexpr int64_t kSweepDepth = 64;
struct CapCase {
  int64_t cap_kib;
  int64_t iterations;
};
constexpr CapCase kCapCases[] = {{10, 5},    {30, 5},     {100, 10},   {300, 10},    {1024, 20},
                                 {3072, 40}, {10240, 40}, {30720, 40}, {102400, 40}};

std::shared_ptr<tp::nn::Module> make_model(int64_t depth) {
  tp::manual_seed(0);
  return tp::nn::deep_mlp(kIn, kWidth, depth, kOut);
}

int64_t count_elements(const std::vector<tp::Tensor>& tensors) {
  int64_t n = 0;
  for (const tp::Tensor& t : tensors) n += t.numel();
  return n;
}

// Per-sync counters, read from the group's collective counters across the
// timed loop: what was actually issued, not what we think was.
void report(benchmark::State& state, const dist::ProcessGroup& group,
            const dist::CollectiveCounters& before) {
  const auto iterations = static_cast<double>(state.iterations());
  const dist::CollectiveCounters& after = group.counters();
  const auto bytes = static_cast<int64_t>(after.allreduce_bytes - before.allreduce_bytes);
  state.counters["allreduces"] =
      static_cast<double>(after.allreduce - before.allreduce) / iterations;
  state.counters["MB"] = static_cast<double>(bytes) / 1e6 / iterations;
  state.SetBytesProcessed(bytes);
}

// Stage 01's sync_grads() on deep_mlp(256, 256, depth, 16).
void bm_stage01_sync_grads(benchmark::State& state,
                           const std::shared_ptr<dist::ProcessGroup>& group) {
  stage01::DistributedDataParallel ddp(make_model(state.range(0)), group);
  // Every gradient is ones on every rank: all-reduce (SUM) makes it 2, the
  // division by 2 makes it 1 again, so the values stay exact and normal
  // (no overflow or denormals slowing the arithmetic) however long it runs.
  for (const tp::Tensor& p : ddp.parameters()) p.set_grad(tp::ones(p.shape(), p.dtype()));

  for (int i = 0; i < tp::bench::warmup_iterations(); ++i) ddp.sync_grads();
  group->barrier()->wait();
  const dist::CollectiveCounters before = group->counters();
  tp::bench::time_each_iteration(state, "ms", [&] { ddp.sync_grads(); });
  report(state, *group, before);
}

// [snippet:stage02-bench]
// Stage 02's sync_grads() on the same model, default caps.
void bm_stage02_sync_grads(benchmark::State& state,
                           const std::shared_ptr<dist::ProcessGroup>& group) {
  stage02::DistributedDataParallel ddp(make_model(state.range(0)), group);
  // Ones, as for stage 01: sum W, divide by W, ones again.
  for (const tp::Tensor& p : ddp.parameters()) p.set_grad(tp::ones(p.shape(), p.dtype()));

  for (int i = 0; i < tp::bench::warmup_iterations(); ++i) ddp.sync_grads();
  group->barrier()->wait();
  const dist::CollectiveCounters before = group->counters();
  tp::bench::time_each_iteration(state, "ms", [&] { ddp.sync_grads(); });
  report(state, *group, before);
}
// [/snippet:stage02-bench]

// Stage 02's sync_grads() on deep_mlp(256, 256, kSweepDepth, 16) with both
// caps set to range(0) KiB: how the time goes from per-parameter to flat as
// buckets grow.
void bm_stage02_bucket_cap(benchmark::State& state,
                           const std::shared_ptr<dist::ProcessGroup>& group) {
  const double cap_mb = static_cast<double>(state.range(0)) / 1024.0;
  stage02::DistributedDataParallel ddp(make_model(kSweepDepth), group,
                                       {.bucket_cap_mb = cap_mb, .first_bucket_cap_mb = cap_mb});
  for (const tp::Tensor& p : ddp.parameters()) p.set_grad(tp::ones(p.shape(), p.dtype()));

  for (int i = 0; i < tp::bench::warmup_iterations(); ++i) ddp.sync_grads();
  group->barrier()->wait();
  const dist::CollectiveCounters before = group->counters();
  tp::bench::time_each_iteration(state, "ms", [&] { ddp.sync_grads(); });
  report(state, *group, before);
}

// One all-reduce of a flat tensor as large as all of the model's parameters.
void bm_one_flat_allreduce(benchmark::State& state,
                           const std::shared_ptr<dist::ProcessGroup>& group) {
  const int64_t numel = count_elements(make_model(state.range(0))->parameters());
  // Zeros stay zeros under SUM: no overflow however long it runs.
  const tp::Tensor flat = tp::zeros({numel}, tp::kFloat32);

  for (int i = 0; i < tp::bench::warmup_iterations(); ++i) {
    group->allreduce(flat, dist::ReduceOp::SUM)->wait();
  }
  group->barrier()->wait();
  const dist::CollectiveCounters before = group->counters();
  tp::bench::time_each_iteration(state, "ms",
                                 [&] { group->allreduce(flat, dist::ReduceOp::SUM)->wait(); });
  report(state, *group, before);
}

using SyncBenchmark = void (*)(benchmark::State&, const std::shared_ptr<dist::ProcessGroup>&);

// Registers `run` under `name`/`arg` (a depth, or a cap for the sweep).
void register_sync(const char* name, SyncBenchmark run, int64_t arg, int64_t iterations,
                   const std::shared_ptr<dist::ProcessGroup>& group) {
  benchmark::RegisterBenchmark(name, [run, group](benchmark::State& state) { run(state, group); })
      ->Arg(arg)->Iterations(tp::bench::iterations(iterations))
      ->ComputeStatistics("p90", tp::bench::p90)
      ->Unit(benchmark::kMicrosecond)->UseRealTime();
}

void register_benchmarks(const tp::bench::RankSetup& setup) {
  tp::bench::describe_stage(stage01::stage_spec());
  tp::bench::describe_stage(stage02::stage_spec());
  const auto& group = setup.group;
  for (const Case& c : kCases) {
    register_sync("BM_Stage01SyncGrads", bm_stage01_sync_grads, c.depth,
                  c.per_parameter_iterations, group);
  }
  for (const Case& c : kCases) {
    register_sync("BM_Stage02SyncGrads", bm_stage02_sync_grads, c.depth, c.flat_iterations, group);
  }
  for (const Case& c : kCases) {
    register_sync("BM_OneFlatAllreduce", bm_one_flat_allreduce, c.depth, c.flat_iterations, group);
  }
  for (const CapCase& c : kCapCases) {
    register_sync("BM_Stage02BucketCap", bm_stage02_bucket_cap, c.cap_kib, c.iterations, group);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return tp::bench::ranked_benchmark_main(argc, argv, "bench_sync", kDefaultWorldSize, {},
                                          register_benchmarks);
}
