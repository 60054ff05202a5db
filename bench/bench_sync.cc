// The gradient sync of one training step on 2 ranks: stage 01's
// one-all-reduce-per-parameter against a single flat all-reduce of the same
// number of bytes. Lesson 01's "why naive is slow" quotes these numbers.
//
// What it measures, for deep_mlp(in=256, width=256, depth=D, out=16) with
// D in {2, 8, 32} (2 * (D + 1) parameter tensors, 0.5 to 8.4 MB of float32):
//   BM_Stage01SyncGrads/D   stage01::DistributedDataParallel::sync_grads():
//                           2 * (D + 1) all-reduces, each waited for, then
//                           divided by the world size.
//   BM_OneFlatAllreduce/D   one all-reduce (SUM, wait) of one flat float32
//                           tensor with as many elements as the model has
//                           parameters: the lower bound that bucketing
//                           (stage 02) approaches.
// Counters: "tensors" is all-reduces per sync, "MB" the payload per sync
// (10^6 bytes), bytes_per_second the payload rate. Only communication is
// timed: no forward or backward runs inside the loop.
//
// Why: every all-reduce pays a fixed cost (queue to the communication thread,
// a Gloo ring round over TCP, the wake-up of the waiting thread) on top of the
// bytes it moves. With many small tensors the fixed cost dominates, so the
// per-parameter sync falls further behind the flat one as D grows.
//
// How it runs: main() spawns 2 ranks (real processes, Gloo over loopback,
// rendezvous in a fresh TempDir). Each rank registers the same benchmarks
// with a fixed iteration count, because both ranks must issue the same
// collectives in the same order; an adaptive count (Google Benchmark's
// default) would differ between ranks and hang. A barrier before each timed
// loop lines the ranks up. Rank 0 reports as any benchmark program does
// (and honours --benchmark_out); rank 1 runs the same benchmarks silently.
// Times are wall-clock (UseRealTime): the work happens on the communication
// thread and in the other process, not on the timed thread's CPU clock.
//
// Run: ./kit bench, or build/bench/bench_sync [--benchmark_filter=Flat].
// Expect: the flat all-reduce is several times faster than the per-parameter
// sync at D = 32, and the gap grows with D; the whole program takes well
// under a minute.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ddp.h"  // stage01::DistributedDataParallel
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/random.h"
#include "tensorplay/tensor.h"
#include "tensorplay/util/temp_dir.h"

namespace {

namespace dist = tp::distributed;
namespace mp = tp::multiprocessing;

constexpr int kWorldSize = 2;

// The model: deep_mlp(kIn, kWidth, depth, kOut).
constexpr int64_t kIn = 256;
constexpr int64_t kWidth = 256;
constexpr int64_t kOut = 16;

// Each depth with its fixed iteration count (the same on every rank; see the
// top of the file). Fewer iterations for the bigger model keep the whole run
// short.
struct Case {
  int64_t depth;
  int64_t iterations;
};
constexpr Case kCases[] = {{2, 200}, {8, 100}, {32, 40}};

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
  const auto bytes = static_cast<int64_t>(
      (after.allreduce_elements - before.allreduce_elements) * sizeof(float));
  state.counters["tensors"] =
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

  group->barrier()->wait();
  const dist::CollectiveCounters before = group->counters();
  for (auto _ : state) ddp.sync_grads();
  report(state, *group, before);
}

// One all-reduce of a flat tensor as large as all of the model's parameters.
void bm_one_flat_allreduce(benchmark::State& state,
                           const std::shared_ptr<dist::ProcessGroup>& group) {
  const int64_t numel = count_elements(make_model(state.range(0))->parameters());
  // Zeros stay zeros under SUM: no overflow however long it runs.
  const tp::Tensor flat = tp::zeros({numel}, tp::kFloat32);

  group->barrier()->wait();
  const dist::CollectiveCounters before = group->counters();
  for (auto _ : state) group->allreduce(flat, dist::ReduceOp::SUM)->wait();
  report(state, *group, before);
}

void register_benchmarks(const std::shared_ptr<dist::ProcessGroup>& group) {
  for (const Case& c : kCases) {
    benchmark::RegisterBenchmark("BM_Stage01SyncGrads",
                                 [group](benchmark::State& state) {
                                   bm_stage01_sync_grads(state, group);
                                 })
        ->Arg(c.depth)->Iterations(c.iterations)
        ->Unit(benchmark::kMicrosecond)->UseRealTime();
  }
  for (const Case& c : kCases) {
    benchmark::RegisterBenchmark("BM_OneFlatAllreduce",
                                 [group](benchmark::State& state) {
                                   bm_one_flat_allreduce(state, group);
                                 })
        ->Arg(c.depth)->Iterations(c.iterations)
        ->Unit(benchmark::kMicrosecond)->UseRealTime();
  }
}

// Rank 1's display reporter: runs everything, prints nothing.
class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  SilentReporter() {
    SetOutputStream(&null_);
    SetErrorStream(&null_);
  }
  bool ReportContext(const Context&) override { return true; }  // false would skip the runs
  void ReportRuns(const std::vector<Run>&) override {}

 private:
  std::ostream null_{nullptr};  // no buffer: every write is dropped
};

// "--benchmark_out=x" -> "benchmark_out"; "" for an argument that is no flag.
std::string_view flag_name(std::string_view arg) {
  if (!arg.starts_with('-')) return {};
  while (arg.starts_with('-')) arg.remove_prefix(1);
  return arg.substr(0, arg.find('='));
}

// Rank 1 keeps every flag (so --benchmark_filter, --benchmark_repetitions and
// the like select the same runs on both ranks) except those that write
// output.
bool writes_output(std::string_view arg) {
  const std::string_view name = flag_name(arg);
  return name == "benchmark_out" || name == "benchmark_out_format" ||
         name == "benchmark_format";
}

// One rank: connect, register, run. Returns "" on success, or a reason.
std::string run_rank(int rank, const std::string& rendezvous,
                     const std::vector<std::string>& args) {
  std::vector<std::string> mine;
  for (const std::string& arg : args) {
    if (rank == 0 || !writes_output(arg)) mine.push_back(arg);
  }
  std::vector<char*> argv;
  for (std::string& arg : mine) argv.push_back(arg.data());
  int argc = static_cast<int>(argv.size());
  argv.push_back(nullptr);
  benchmark::Initialize(&argc, argv.data());
  // Both ranks see the same leftover arguments, so both stop here together.
  if (argc > 1) {
    if (rank == 0) benchmark::ReportUnrecognizedArguments(argc, argv.data());
    return "unrecognized arguments";
  }

  auto group = std::make_shared<dist::ProcessGroupGloo>(
      rendezvous, rank, kWorldSize, dist::GlooOptions{std::chrono::seconds(60)});
  register_benchmarks(group);
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    SilentReporter silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv, argv + argc);
  for (const std::string& arg : args) {
    const std::string_view name = flag_name(arg);
    // --help prints and exits inside Initialize: do it here, before any rank.
    if (name == "help") benchmark::Initialize(&argc, argv);
    if (name == "benchmark_enable_random_interleaving") {
      std::cerr << "bench_sync: --benchmark_enable_random_interleaving would shuffle the runs "
                   "differently on each rank and hang their collectives; run without it\n";
      return 1;
    }
  }

  tp::TempDir rendezvous("tp-bench-sync");
  mp::SpawnOptions options;
  options.timeout = std::chrono::minutes(10);  // generous: a loaded machine is slow, not hung
  const std::vector<std::string> results =
      mp::spawn(options, run_rank, kWorldSize, rendezvous.path(), args);
  for (const std::string& result : results) {
    if (!result.empty()) return 1;
  }
  return 0;
}
