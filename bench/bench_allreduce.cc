// The cost of one all-reduce against its size: the measurement behind every
// "why" of lessons 01 to 03. Gloo over loopback TCP, 4 B to 64 MiB, through
// the kit's ProcessGroupGloo and through Gloo called directly.
//
// What it measures, for n bytes of float32 (n = 4, 16, 64, ..., 64 MiB,
// powers of 4), each rank all-reducing (SUM) its own buffer in place:
//   BM_Allreduce/n   per iteration, two all-reduces of n bytes, each timed
//                    on its own, in an order swapped every iteration:
//                    - the kit's: ProcessGroupGloo::allreduce(t, SUM)
//                      ->wait(). The call queues the collective on the
//                      group's communication thread, which runs Gloo; the
//                      caller waits for it. What every stage pays.
//                    - raw Gloo's: gloo::allreduce() with gloo::sum<float>
//                      on a Gloo context of its own (same transport, same
//                      algorithm), called on the timed thread: no queue, no
//                      thread hand-off. The floor the kit stands on.
//                    Interleaved, both meet the machine at the same moments:
//                    a loaded moment slows both, and their ratio holds.
//   BM_KitHandoff    ProcessGroupGloo::allreduce() of an empty tensor:
//                    queued, run on the communication thread (which has
//                    nothing to reduce and skips Gloo), waited for: the
//                    hand-off between threads alone.
//   BM_CountCheck    ProcessGroup::check_collective_count(): what the kit's
//                    trainer adds to every step to catch a skipped
//                    collective: a write and a read of a file every rank
//                    maps under spawn, one round trip to the TCP store when
//                    launched with env://. No collective in between, so
//                    the counts always agree.
//
// Counters, from every single all-reduce's wall time (Google Benchmark's own
// time is the mean of the pair's sum, which one stall drags up):
//   kit_p50_us, kit_p90_us, kit_mean_us   the kit's median, 90th percentile
//                    and mean; gloo_p50_us, gloo_p90_us, gloo_mean_us the
//                    same for raw Gloo;
//   kit_over_gloo    the median over the iterations of kit / Gloo, each
//                    iteration's pair measured a moment apart: what the
//                    kit adds per collective. (The ratio of the two medians
//                    flips with the machine's stalls: on a shared machine
//                    each time is either fast or a scheduler tick late.)
//   algbw_GBps       n / kit_p50: algorithm bandwidth, bytes per second as
//                    the caller sees them (10^9 bytes per second);
//   busbw_GBps       algbw * 2(W-1)/W: bus bandwidth, as nccl-tests defines
//                    it: a ring all-reduce sends and receives 2(W-1)/W times
//                    the buffer on every link, so busbw is comparable across
//                    world sizes and with a link's raw speed.
// The alpha-beta model t(n) = alpha + beta * n (alpha: seconds per
// collective, the latency; beta: seconds per byte, the inverse bandwidth) is
// fitted by bench/report.py, which also draws the curves.
//
// Why: alpha is paid per collective and beta per byte. Stage 01 pays alpha
// once per parameter tensor; buckets pay it once per bucket. Where alpha *
// (number of collectives) is large against beta * (total bytes), buckets
// win; the fit says where that is on this machine.
//
// How it runs: as bench_sync.cc (ranked_benchmark.h): W spawned ranks (2, or
// --world-size=N), fixed iteration counts (the same on every rank), warm-up
// iterations and a barrier before each timed loop, rank 0 reports. Loopback
// TCP on a shared machine stalls now and then for milliseconds: read p50 and
// p90, not the mean.
//
// Launched (--init-method=env://, one rank per host of a shaped link:
// bench/link_bench.py --alpha-beta): the kit's all-reduce alone. Raw Gloo's
// context connects through the spawned ranks' rendezvous directory and
// listens on 127.0.0.1, which hosts do not share; its counters are absent
// and the context says so.
//
// Run: ./kit bench, or build/bench/bench_allreduce [--world-size=4]
// [--benchmark_filter=Handoff] [--smoke=1]. About 20 s at 2 ranks on 2
// cores.
#include <benchmark/benchmark.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/distributed/process_group.h"
#include "tensorplay/tensor.h"
#include "ranked_benchmark.h"
#include "tensorplay/error.h"

namespace {

namespace dist = tp::distributed;

constexpr int kDefaultWorldSize = 2;
constexpr int64_t kMinBytes = 4;
constexpr int64_t kMaxBytes = int64_t{64} << 20;  // 64 MiB

// A fixed iteration count per size (the same on every rank) that keeps each
// timed loop near half a second (two all-reduces an iteration): the estimate
// assumes 100 us per collective and 0.5 GB/s, pessimistic for loopback.
int64_t iterations_for(int64_t bytes) {
  const double estimate_s = 100e-6 + static_cast<double>(bytes) / 0.5e9;
  const auto n = static_cast<int64_t>(0.25 / estimate_s);
  return tp::bench::iterations(std::clamp<int64_t>(n, 5, 400));
}

// Gloo on its own: a context connected beside the group's (its keys in the
// rendezvous directory under a prefix of their own), gloo::allreduce called
// on this thread with Gloo's own float sum, as PyTorch's ProcessGroupGloo
// calls it.
class RawGloo {
 public:
  RawGloo(const std::string& rendezvous_dir, int rank, int size) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    device_ = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore files(rendezvous_dir);
    gloo::rendezvous::PrefixStore store("raw-gloo", files);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(std::chrono::seconds(60));
    context->connectFullMesh(store, device_);
    context_ = std::move(context);
  }

  void allreduce(float* data, size_t count) {
    gloo::AllreduceOptions options(context_);
    options.setOutput(data, count);
    options.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    options.setTag(0);
    options.setTimeout(std::chrono::seconds(60));
    gloo::allreduce(options);
  }

 private:
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
};

double seconds_of(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return values.empty() ? 0.0 : sum / static_cast<double>(values.size());
}

// BM_Allreduce/n (see the top of the file). Every rank swaps the order at
// the same iterations: their collectives must match.
// `gloo` is null for launched ranks: the kit's all-reduce alone.
void bm_allreduce(benchmark::State& state, const std::shared_ptr<dist::ProcessGroup>& group,
                  RawGloo* gloo) {
  const int64_t bytes = state.range(0);
  // Zeros stay zeros under SUM, so the values stay exact and normal (no
  // overflow or denormals slowing the additions) however long it runs.
  const tp::Tensor t = tp::zeros({bytes / static_cast<int64_t>(sizeof(float))}, tp::kFloat32);
  std::vector<float> data(static_cast<size_t>(bytes) / sizeof(float), 0.0f);
  const std::function<void()> kit = [&] { group->allreduce(t, dist::ReduceOp::SUM)->wait(); };
  const std::function<void()> raw = [&] {
    if (gloo != nullptr) gloo->allreduce(data.data(), data.size());
  };
  for (int i = 0; i < tp::bench::warmup_iterations(); ++i) {
    kit();
    raw();
  }
  group->barrier()->wait();
  std::vector<double> kit_s;
  std::vector<double> gloo_s;
  bool kit_first = true;
  for (auto _ : state) {
    if (gloo == nullptr) {
      kit_s.push_back(seconds_of(kit));
    } else if (kit_first) {
      kit_s.push_back(seconds_of(kit));
      gloo_s.push_back(seconds_of(raw));
    } else {
      gloo_s.push_back(seconds_of(raw));
      kit_s.push_back(seconds_of(kit));
    }
    kit_first = !kit_first;
  }
  using tp::bench::quantile;
  const double kit_p50 = quantile(kit_s, 0.5);
  const double algbw = static_cast<double>(bytes) / kit_p50 / 1e9;
  const int w = group->size();
  state.counters["kit_p50_us"] = kit_p50 * 1e6;
  state.counters["kit_p90_us"] = quantile(kit_s, 0.9) * 1e6;
  state.counters["kit_mean_us"] = mean(kit_s) * 1e6;
  if (gloo != nullptr) {
    state.counters["gloo_p50_us"] = quantile(gloo_s, 0.5) * 1e6;
    state.counters["gloo_p90_us"] = quantile(gloo_s, 0.9) * 1e6;
    state.counters["gloo_mean_us"] = mean(gloo_s) * 1e6;
    std::vector<double> ratios;
    for (size_t i = 0; i < kit_s.size(); ++i) ratios.push_back(kit_s[i] / gloo_s[i]);
    state.counters["kit_over_gloo"] = quantile(ratios, 0.5);
  }
  state.counters["algbw_GBps"] = algbw;
  state.counters["busbw_GBps"] = algbw * 2.0 * (w - 1) / w;
}

// An empty all-reduce: the queue, the communication thread's wake-up and
// the waiting thread's, with no Gloo in between.
void bm_kit_handoff(benchmark::State& state, const std::shared_ptr<dist::ProcessGroup>& group) {
  const tp::Tensor empty = tp::zeros({0}, tp::kFloat32);
  for (int i = 0; i < tp::bench::warmup_iterations(); ++i) {
    group->allreduce(empty, dist::ReduceOp::SUM)->wait();
  }
  group->barrier()->wait();
  tp::bench::time_each_iteration(state, "us",
                                 [&] { group->allreduce(empty, dist::ReduceOp::SUM)->wait(); });
}

void bm_count_check(benchmark::State& state, const std::shared_ptr<dist::ProcessGroup>& group) {
  group->barrier()->wait();
  tp::bench::time_each_iteration(state, "us",
                                 [&] { group->check_collective_count("a benchmark iteration"); });
}

void register_benchmarks(const tp::bench::RankSetup& setup) {
  const auto& group = setup.group;
  benchmark::RegisterBenchmark("BM_KitHandoff",
                               [group](benchmark::State& state) { bm_kit_handoff(state, group); })
      ->Iterations(tp::bench::iterations(1000))->Unit(benchmark::kMicrosecond)->UseRealTime();
  benchmark::RegisterBenchmark("BM_CountCheck",
                               [group](benchmark::State& state) { bm_count_check(state, group); })
      ->Iterations(tp::bench::iterations(1000))->Unit(benchmark::kMicrosecond)->UseRealTime();
  // Connected once per rank, before any benchmark runs; the registered
  // benchmarks share it. Not for launched ranks (see the top of the file).
  std::shared_ptr<RawGloo> gloo;
  if (setup.rendezvous_dir.empty()) {
    benchmark::AddCustomContext("raw_gloo", "not measured: launched ranks (" +
                                                setup.init_method + ") share no rendezvous "
                                                "directory");
  } else {
    gloo = std::make_shared<RawGloo>(setup.rendezvous_dir, group->rank(), group->size());
  }
  for (int64_t bytes = kMinBytes; bytes <= kMaxBytes; bytes *= 4) {
    benchmark::RegisterBenchmark(
        "BM_Allreduce",
        [group, gloo](benchmark::State& state) { bm_allreduce(state, group, gloo.get()); })
        ->Arg(bytes)->Iterations(iterations_for(bytes))
        ->Unit(benchmark::kMicrosecond)->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  return tp::bench::ranked_benchmark_main(argc, argv, "bench_allreduce", kDefaultWorldSize, {},
                                          register_benchmarks);
}
