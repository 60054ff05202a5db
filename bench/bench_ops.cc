// Micro-benchmarks of the kit's compute: GEMM at a few sizes, one training
// step (forward, loss, backward, SGD) of MiniMLP and of deep_mlp, and the
// graph walk find_unused_parameters adds after every forward (lesson 05).
//
// These set the scale for the DDP benchmarks: a step's compute time is what
// bucketing and overlap try to hide communication behind. Each benchmark is
// small so `./kit bench` stays quick; Google Benchmark picks the iteration
// count. Times are wall-clock (UseRealTime): OpenBLAS may run a GEMM on
// several threads, and the main thread's CPU time would hide that work.
// Run: build/bench/bench_ops --benchmark_filter=GEMM
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "tensorplay/data.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"
#include "tensorplay/train/unreached.h"

namespace {

// C = A B with A (n, n) and B (n, n), float32, through cblas_sgemm.
void BM_GEMM(benchmark::State& state) {
  const int64_t n = state.range(0);
  tp::Generator g(0);
  const tp::Tensor a = tp::randn({n, n}, tp::kFloat32, &g);
  const tp::Tensor b = tp::randn({n, n}, tp::kFloat32, &g);
  for (auto _ : state) {
    tp::Tensor c = tp::matmul(a, b);
    benchmark::DoNotOptimize(c.data_ptr());
  }
  // 2 n^3 floating-point operations per product.
  state.counters["FLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(n * n * n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_GEMM)->Arg(64)->Arg(256)->Arg(512)->Unit(benchmark::kMicrosecond)->UseRealTime();

// y = x W^T with x (B, in) and W (out, in): the Linear layer's GEMM, with W
// passed transposed (no copy).
void BM_GEMM_transposed(benchmark::State& state) {
  const int64_t n = state.range(0);
  tp::Generator g(0);
  const tp::Tensor x = tp::randn({n, n}, tp::kFloat32, &g);
  const tp::Tensor w = tp::randn({n, n}, tp::kFloat32, &g);
  for (auto _ : state) {
    tp::Tensor y = x.matmul(w.t());
    benchmark::DoNotOptimize(y.data_ptr());
  }
}
BENCHMARK(BM_GEMM_transposed)->Arg(256)->Unit(benchmark::kMicrosecond)->UseRealTime();

// One full training step: zero_grad, forward, mse loss, backward, SGD step.
void train_step(tp::nn::Module& model, tp::optim::SGD& opt, const tp::data::Batch& batch) {
  opt.zero_grad();
  tp::Tensor loss = tp::mse_loss(model(batch.x), batch.y);
  loss.backward();
  opt.step();
  benchmark::DoNotOptimize(loss.data_ptr());
}

// MiniMLP (16 -> 32 -> 32 -> 4), batch size from the argument: the model
// every lesson trains.
void BM_MiniMLP_step(benchmark::State& state) {
  tp::manual_seed(0);
  tp::nn::MiniMLP model;
  tp::optim::SGD opt(model.parameters(), {.lr = 0.01});
  const auto batch = tp::data::SyntheticRegression().rows(0, state.range(0));
  for (auto _ : state) train_step(model, opt, batch);
}
BENCHMARK(BM_MiniMLP_step)->Arg(32)->Arg(256)->Unit(benchmark::kMicrosecond)->UseRealTime();

// deep_mlp(16, width, depth, 4), batch 64: many parameter tensors, the shape
// where bucketing pays off. Args: {width, depth}.
void BM_deep_mlp_step(benchmark::State& state) {
  const int64_t width = state.range(0);
  const int64_t depth = state.range(1);
  tp::manual_seed(0);
  auto model = tp::nn::deep_mlp(16, width, depth, 4);
  tp::optim::SGD opt(model->parameters(), {.lr = 0.001});
  const auto batch = tp::data::SyntheticRegression().rows(0, 64);
  for (auto _ : state) train_step(*model, opt, batch);
  state.counters["params"] = static_cast<double>(model->parameters().size());
}
BENCHMARK(BM_deep_mlp_step)
    ->Args({128, 8})
    ->Args({512, 4})
    ->Unit(benchmark::kMicrosecond)->UseRealTime();

// What find_unused_parameters costs per step (lesson 05): the walk from a
// loss through the autograd graph to the parameters' accumulators, on
// deep_mlp(16, 128, depth, 4) after one forward of 64 rows, beside that
// model's whole step. The walk is tp::train::unreached_parameters, the same
// algorithm as stage 05's. Arg: depth (2 * (depth + 1) parameter tensors).
void BM_graph_walk(benchmark::State& state) {
  tp::manual_seed(0);
  auto model = tp::nn::deep_mlp(16, 128, state.range(0), 4);
  const auto batch = tp::data::SyntheticRegression().rows(0, 64);
  const tp::Tensor loss = tp::mse_loss((*model)(batch.x), batch.y);
  const std::vector<tp::nn::NamedTensor> params = model->named_parameters();
  for (auto _ : state) {
    std::vector<int64_t> unreached = tp::train::unreached_parameters(loss, params);
    benchmark::DoNotOptimize(unreached.data());
  }
  state.counters["params"] = static_cast<double>(params.size());
}
BENCHMARK(BM_graph_walk)->Arg(8)->Arg(64)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_deep_mlp_step_128(benchmark::State& state) {
  tp::manual_seed(0);
  auto model = tp::nn::deep_mlp(16, 128, state.range(0), 4);
  tp::optim::SGD opt(model->parameters(), {.lr = 0.001});
  const auto batch = tp::data::SyntheticRegression().rows(0, 64);
  for (auto _ : state) train_step(*model, opt, batch);
}
BENCHMARK(BM_deep_mlp_step_128)->Arg(64)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
