// Syncing a model's state at DDP construction, two ways: one broadcast per
// parameter tensor (what the stages' broadcast_from_rank0 does) and
// tp::distributed::broadcast_coalesced (PyTorch's _broadcast_coalesced).
//
// What it measures, for deep_mlp(in=256, width=256, depth=D, out=16) with
// D in {8, 32, 64} (2 * (D + 1) float32 parameter tensors, 2.1 to 16.9 MB):
//   BM_BroadcastPerTensor/D    a broadcast from rank 0 of each parameter, each
//                              waited for before the next is issued.
//   BM_BroadcastCoalesced/D    broadcast_coalesced(group, parameters) with the
//                              default 250 MiB chunks: one chunk, so one
//                              broadcast, plus root's copies in and the other
//                              ranks' copies out.
//   BM_BroadcastChunks/C       broadcast_coalesced at D = 64 with C KiB chunks,
//                              C in {256, 1024, 4096}: at 256 every 256 KiB
//                              weight is a chunk of its own (broadcast in place,
//                              no copy), beside one chunk of the biases and the
//                              output layer (65 broadcasts); bigger chunks pack
//                              several layers each, two chunks in flight.
// Counters: "broadcasts" per sync, "MB" the payload per sync (10^6 bytes),
// bytes_per_second the payload rate, p50_ms and p90_ms the median and 90th
// percentile of single syncs.
//
// Why: every broadcast pays a collective's fixed cost (queue to the
// communication thread, a Gloo round over TCP, the wake-up of the waiting
// thread), about half a millisecond here (bench_allreduce.cc measures the
// same for an all-reduce); 130 of them cost more than one broadcast of all
// the bytes and two copies.
//
// How it runs: as bench_sync.cc (ranked_benchmark.h): main() spawns the
// ranks (2, or --world-size=N), every rank registers the same benchmarks
// with fixed iteration counts, a barrier lines them up before each timed
// loop, rank 0 reports. Times are wall-clock (UseRealTime). Not part of
// ./kit bench or of its smoke test.
//
// Run: build/bench/bench_broadcast [--world-size=4] [--benchmark_filter=/64]
// [--benchmark_repetitions=3 --benchmark_report_aggregates_only=true] [--smoke=1].
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "tensorplay/distributed/broadcast_coalesced.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/random.h"
#include "tensorplay/tensor.h"
#include "ranked_benchmark.h"

namespace {

namespace dist = tp::distributed;

// Ranks unless --world-size=N says otherwise.
constexpr int kDefaultWorldSize = 2;

// The model: deep_mlp(kIn, kWidth, depth, kOut), as in bench_sync.cc.
constexpr int64_t kIn = 256;
constexpr int64_t kWidth = 256;
constexpr int64_t kOut = 16;

// Each depth with its fixed iteration counts (the same on every rank):
// fewer for the per-tensor sync, which is many times slower at depth.
struct Case {
  int64_t depth;
  int64_t per_tensor_iterations;
  int64_t coalesced_iterations;
};
constexpr Case kCases[] = {{8, 40, 40}, {32, 20, 40}, {64, 10, 40}};

// The chunk sweep (BM_BroadcastChunks): its depth and chunk sizes in KiB.
constexpr int64_t kSweepDepth = 64;
constexpr int64_t kSweepIterations = 40;
constexpr int64_t kChunkKiB[] = {256, 1024, 4096};

std::vector<tp::Tensor> model_parameters(int64_t depth) {
  tp::manual_seed(0);
  return tp::nn::deep_mlp(kIn, kWidth, depth, kOut)->parameters();
}

int64_t count_bytes(const std::vector<tp::Tensor>& tensors) {
  int64_t n = 0;
  for (const tp::Tensor& t : tensors) n += static_cast<int64_t>(t.nbytes());
  return n;
}

// Times sync() over the timed loop after warm-up and a barrier; the counters
// come from the group's own count of broadcasts: what was issued.
template <typename Sync>
void time_sync(benchmark::State& state, dist::ProcessGroup& group,
               const std::vector<tp::Tensor>& params, Sync&& sync) {
  for (int i = 0; i < tp::bench::warmup_iterations(); ++i) sync();
  group.barrier()->wait();
  const uint64_t before = group.counters().broadcast;
  tp::bench::time_each_iteration(state, "ms", sync);
  const auto iterations = static_cast<double>(state.iterations());
  const int64_t bytes = count_bytes(params) * state.iterations();
  state.counters["broadcasts"] =
      static_cast<double>(group.counters().broadcast - before) / iterations;
  state.counters["MB"] = static_cast<double>(bytes) / 1e6 / iterations;
  state.SetBytesProcessed(bytes);
}

// One broadcast per parameter, each waited for: the stages' broadcast_from_rank0.
void bm_per_tensor(benchmark::State& state, const std::shared_ptr<dist::ProcessGroup>& group) {
  const std::vector<tp::Tensor> params = model_parameters(state.range(0));
  time_sync(state, *group, params, [&] {
    for (const tp::Tensor& p : params) group->broadcast(p, /*root=*/0)->wait();
  });
}

// broadcast_coalesced with the default chunks.
void bm_coalesced(benchmark::State& state, const std::shared_ptr<dist::ProcessGroup>& group) {
  const std::vector<tp::Tensor> params = model_parameters(state.range(0));
  time_sync(state, *group, params, [&] { dist::broadcast_coalesced(*group, params); });
}

// broadcast_coalesced at kSweepDepth with range(0) KiB chunks.
void bm_chunks(benchmark::State& state, const std::shared_ptr<dist::ProcessGroup>& group) {
  const std::vector<tp::Tensor> params = model_parameters(kSweepDepth);
  const int64_t chunk_bytes = state.range(0) * 1024;
  time_sync(state, *group, params,
            [&] { dist::broadcast_coalesced(*group, params, chunk_bytes); });
}

using Benchmark = void (*)(benchmark::State&, const std::shared_ptr<dist::ProcessGroup>&);

void register_one(const char* name, Benchmark run, int64_t arg, int64_t iterations,
                  const std::shared_ptr<dist::ProcessGroup>& group) {
  benchmark::RegisterBenchmark(name, [run, group](benchmark::State& state) { run(state, group); })
      ->Arg(arg)->Iterations(tp::bench::iterations(iterations))
      ->ComputeStatistics("p90", tp::bench::p90)
      ->Unit(benchmark::kMicrosecond)->UseRealTime();
}

void register_benchmarks(const tp::bench::RankSetup& setup) {
  const auto& group = setup.group;
  for (const Case& c : kCases) {
    register_one("BM_BroadcastPerTensor", bm_per_tensor, c.depth, c.per_tensor_iterations, group);
  }
  for (const Case& c : kCases) {
    register_one("BM_BroadcastCoalesced", bm_coalesced, c.depth, c.coalesced_iterations, group);
  }
  for (int64_t kib : kChunkKiB) {
    register_one("BM_BroadcastChunks", bm_chunks, kib, kSweepIterations, group);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return tp::bench::ranked_benchmark_main(argc, argv, "bench_broadcast", kDefaultWorldSize, {},
                                          register_benchmarks);
}
