// Stage 03's training step on the GPU against the same step on the CPU: what
// the CUDA path buys (./kit gpu-check runs it).
//
// What it measures: one rank (W = 1) training deep_mlp(256, 1024, 8, 16)
// (18 parameter tensors, 7.6 M float32 values, 29 MiB of gradients in stage
// 03's default buckets) on a batch of 512 rows with stage 03's DDP: zero_grad, forward,
// mse loss, backward (the hooks launch each bucket's all-reduce, the end of
// backward waits for them), SGD step, and loss.item(), which a training loop
// prints and which waits for the GPU, so each timed step is a whole step.
//   BM_Stage03Step/device:0   on the CPU: OpenBLAS on one thread, the Gloo group
//   BM_Stage03Step/device:1   on CUDA: cuBLAS, the kit's kernels, the NCCL group
//                             (Gloo staging through host memory when the kit
//                             was built without NCCL)
// At W = 1 the all-reduce moves nothing between ranks; what is measured is
// the compute and the launch path, which is what the GPU changes. Lesson 03
// ("On a GPU") explains what W > 1 adds.
//
// Run: ./kit gpu-check, or build/bench/bench_gpu_step [--benchmark_format=json].
// Without a usable GPU the CUDA benchmark reports the reason as its error.
#include <benchmark/benchmark.h>

#include <memory>

#include "03-overlap/ddp.h"
#include "tensorplay/cuda/runtime.h"
#include "tensorplay/data.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"
#include "tensorplay/train/ddp_trainer.h"
#include "tensorplay/util/temp_dir.h"

namespace {

constexpr int64_t kIn = 256, kWidth = 1024, kDepth = 8, kOut = 16, kBatch = 512;

void bm_stage03_step(benchmark::State& state) {
  const bool on_gpu = state.range(0) == 1;
  if (on_gpu && !tp::cuda::is_available()) {
    state.SkipWithError(tp::cuda::unavailable_reason().c_str());
    return;
  }
  tp::train::RunConfig config;
  config.world_size = 1;
  if (on_gpu) config.device = tp::Device{tp::DeviceType::CUDA, 0};
  const tp::Device device = tp::train::device_for_rank(config, 0);
  if (on_gpu) tp::cuda::set_device(device.index);

  tp::TempDir rendezvous("tensorplay-bench-gpu");
  auto group = tp::train::make_rank_group(config, rendezvous.path(), 0);
  tp::manual_seed(7);
  std::shared_ptr<tp::nn::Module> model = tp::nn::deep_mlp(kIn, kWidth, kDepth, kOut);
  model->to(device);
  stage03::DistributedDataParallel ddp(model, group);
  tp::optim::SGD optimizer(ddp.parameters(), {.lr = 1e-4});
  const tp::Tensor x = tp::randn({kBatch, kIn}).to(device);
  const tp::Tensor y = tp::randn({kBatch, kOut}).to(device);
  auto one_step = [&] {
    optimizer.zero_grad();
    tp::Tensor loss = tp::mse_loss(ddp(x), y);
    loss.backward();
    optimizer.step();
    benchmark::DoNotOptimize(loss.item());  // waits for the GPU: a whole step
  };
  for (int i = 0; i < 3; ++i) one_step();  // warm-up: the first launches load the kernels
  for (auto _ : state) one_step();
  state.counters["rows_per_s"] =
      benchmark::Counter(static_cast<double>(kBatch), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(bm_stage03_step)->Name("BM_Stage03Step")->ArgName("device")->Arg(0)->Arg(1)
    ->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
