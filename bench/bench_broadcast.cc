// Syncing a model's state at DDP construction, two ways: one broadcast per
// parameter tensor (what the stages' broadcast_from_rank0 does) and
// tp::distributed::broadcast_coalesced (PyTorch's _broadcast_coalesced).
//
// What it measures, for deep_mlp(in=256, width=256, depth=D, out=16)
// (2 * (D + 1) float32 parameter tensors: 2.1 MB at D = 8, 8.4 MB at 32,
// 16.9 MB at 64):
//   BM_PerTensorVsCoalesced/depth:D/chunk_kib:C
//       per iteration, both syncs of rank 0's parameters, each timed on its
//       own, in an order swapped every iteration:
//         per tensor   a broadcast of each parameter, each waited for before
//                      the next is issued;
//         coalesced    broadcast_coalesced(group, parameters, C KiB).
//       C = 256000 (250 MiB, the default) at D = 8, 32 and 64: the whole
//       model is one chunk, one broadcast, plus root's copies in and the
//       other ranks' copies out. At D = 64 also C = 256, 1024 and 4096: at
//       256 every 256 KiB weight is a chunk of its own (sent in place, no
//       copy) beside one chunk of the biases and the output layer (65
//       broadcasts); bigger chunks pack several layers each, two in flight.
// Counters, from every single sync's wall time (Google Benchmark's own time
// is the mean of the pair's sum, which one stall drags up):
//   per_tensor_p50_ms, per_tensor_p90_ms, coalesced_p50_ms,
//   coalesced_p90_ms    the median and 90th percentile of each sync;
//   speedup             the median over the iterations of per tensor /
//                       coalesced, each pair measured a moment apart, so a
//                       loaded moment slows both and their ratio holds;
//   per_tensor_broadcasts, coalesced_broadcasts   broadcasts per sync, from
//                       the group's own count: what was issued;
//   MB                  the payload per sync (10^6 bytes).
//
// Why: every broadcast pays a collective's fixed cost (queue to the
// communication thread, a Gloo round over TCP, the wake-up of the waiting
// thread); coalescing pays it once per chunk, but copies every byte twice
// (in on root, out elsewhere) and, with one chunk, sends nothing until all
// of it is packed. Where the fixed cost is small against the bytes (big
// layers, loopback), the two come close; a chunk of a few MiB keeps the
// wire busy while the next is packed.
//
// How it runs: as bench_sync.cc (ranked_benchmark.h): main() spawns the
// ranks (2, or --world-size=N), every rank registers the same benchmarks
// with fixed iteration counts and swaps the order at the same iterations
// (their collectives must match), a barrier lines them up before each timed
// loop, rank 0 reports. Not part of ./kit bench or of its smoke test.
//
// Run: build/bench/bench_broadcast [--world-size=4]
// [--benchmark_filter=depth:64] [--smoke=1].
#include <benchmark/benchmark.h>

#include <chrono>
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

// Each case: depth, chunk size in KiB, fixed iteration count (the same on
// every rank; two syncs an iteration).
struct Case {
  int64_t depth;
  int64_t chunk_kib;
  int64_t iterations;
};
constexpr int64_t kDefaultChunkKiB = dist::kDefaultBroadcastChunkBytes / 1024;
constexpr Case kCases[] = {{8, kDefaultChunkKiB, 40}, {32, kDefaultChunkKiB, 20},
                           {64, kDefaultChunkKiB, 10}, {64, 256, 10},
                           {64, 1024, 10},             {64, 4096, 10}};

std::vector<tp::Tensor> model_parameters(int64_t depth) {
  tp::manual_seed(0);
  return tp::nn::deep_mlp(kIn, kWidth, depth, kOut)->parameters();
}

int64_t count_bytes(const std::vector<tp::Tensor>& tensors) {
  int64_t n = 0;
  for (const tp::Tensor& t : tensors) n += static_cast<int64_t>(t.nbytes());
  return n;
}

// Runs sync(), adding its wall time to `seconds` and its broadcasts to `broadcasts`.
template <typename Sync>
void timed(const dist::ProcessGroup& group, Sync&& sync, std::vector<double>& seconds,
           uint64_t& broadcasts) {
  const uint64_t before = group.counters().broadcast;
  const auto start = std::chrono::steady_clock::now();
  sync();
  seconds.push_back(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  broadcasts += group.counters().broadcast - before;
}

// BM_PerTensorVsCoalesced (see the top of the file).
void bm_per_tensor_vs_coalesced(benchmark::State& state,
                                const std::shared_ptr<dist::ProcessGroup>& group) {
  const std::vector<tp::Tensor> params = model_parameters(state.range(0));
  const int64_t chunk_bytes = state.range(1) * 1024;
  // The stages' broadcast_from_rank0.
  auto per_tensor = [&] {
    for (const tp::Tensor& p : params) group->broadcast(p, /*root=*/0)->wait();
  };
  auto coalesced = [&] { dist::broadcast_coalesced(*group, params, chunk_bytes); };
  for (int i = 0; i < tp::bench::warmup_iterations(); ++i) {
    per_tensor();
    coalesced();
  }
  group->barrier()->wait();
  std::vector<double> per_tensor_s;
  std::vector<double> coalesced_s;
  uint64_t per_tensor_broadcasts = 0;
  uint64_t coalesced_broadcasts = 0;
  bool per_tensor_first = true;
  for (auto _ : state) {
    if (per_tensor_first) {
      timed(*group, per_tensor, per_tensor_s, per_tensor_broadcasts);
      timed(*group, coalesced, coalesced_s, coalesced_broadcasts);
    } else {
      timed(*group, coalesced, coalesced_s, coalesced_broadcasts);
      timed(*group, per_tensor, per_tensor_s, per_tensor_broadcasts);
    }
    per_tensor_first = !per_tensor_first;
  }
  using tp::bench::quantile;
  const auto iterations = static_cast<double>(state.iterations());
  state.counters["per_tensor_p50_ms"] = quantile(per_tensor_s, 0.5) * 1e3;
  state.counters["per_tensor_p90_ms"] = quantile(per_tensor_s, 0.9) * 1e3;
  state.counters["coalesced_p50_ms"] = quantile(coalesced_s, 0.5) * 1e3;
  state.counters["coalesced_p90_ms"] = quantile(coalesced_s, 0.9) * 1e3;
  std::vector<double> ratios;
  for (size_t i = 0; i < per_tensor_s.size(); ++i) {
    ratios.push_back(per_tensor_s[i] / coalesced_s[i]);
  }
  state.counters["speedup"] = quantile(ratios, 0.5);
  state.counters["per_tensor_broadcasts"] = static_cast<double>(per_tensor_broadcasts) / iterations;
  state.counters["coalesced_broadcasts"] = static_cast<double>(coalesced_broadcasts) / iterations;
  state.counters["MB"] = static_cast<double>(count_bytes(params)) / 1e6;
}

void register_benchmarks(const tp::bench::RankSetup& setup) {
  const auto group = setup.group;
  for (const Case& c : kCases) {
    benchmark::RegisterBenchmark("BM_PerTensorVsCoalesced",
                                 [group](benchmark::State& state) {
                                   bm_per_tensor_vs_coalesced(state, group);
                                 })
        ->Args({c.depth, c.chunk_kib})->ArgNames({"depth", "chunk_kib"})
        ->Iterations(tp::bench::iterations(c.iterations))
        ->Unit(benchmark::kMillisecond)->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  return tp::bench::ranked_benchmark_main(argc, argv, "bench_broadcast", kDefaultWorldSize, {},
                                          register_benchmarks);
}
