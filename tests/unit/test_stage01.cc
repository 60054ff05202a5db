// Stage 01's DDP on bad input: models that differ between ranks, missing
// gradients, null arguments. Each must be a clear error on every rank, never
// a hang. (Correct training is the checker's job: tests/checkers/check_01.cc.)
#include <doctest/doctest.h>

#include <memory>

#include "ddp.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/ops.h"
#include "tensorplay/random.h"
#include "tensorplay/util/temp_dir.h"

namespace {

using tp::multiprocessing::SpawnError;

// Runs body(rank, group) on `world_size` ranks with a short collective
// timeout, so a hang would fail in seconds instead of passing silently.
template <typename Body>
void run_ranks(int world_size, Body body) {
  tp::TempDir rendezvous;
  tp::multiprocessing::SpawnOptions options;
  options.timeout = std::chrono::seconds(60);
  tp::multiprocessing::spawn(options, [&](int rank) {
    auto group = std::make_shared<tp::distributed::ProcessGroupGloo>(
        rendezvous.path(), rank, world_size,
        tp::distributed::GlooOptions{std::chrono::milliseconds(5000)});
    body(rank, group);
  }, world_size);
}

}  // namespace

TEST_CASE("ranks wrapping different layer sizes get an error naming the parameter and the ranks") {
  CHECK_THROWS_WITH_AS(
      run_ranks(3, [](int rank, auto group) {
        tp::nn::MiniMLPOptions options;
        if (rank == 2) options.hidden = 8;  // rank 2 built another model
        stage01::DistributedDataParallel ddp(std::make_shared<tp::nn::MiniMLP>(options), group);
      }),
      doctest::Contains("parameter 0 (fc1.weight here) is (32, 16) float32 on rank 0 but (8, 16) "
                        "float32 on rank 2"),
      SpawnError);
}

TEST_CASE("ranks wrapping the same shapes in different dtypes get an error naming both") {
  CHECK_THROWS_WITH_AS(
      run_ranks(2, [](int rank, auto group) {
        tp::nn::MiniMLPOptions options;
        if (rank == 1) options.dtype = tp::kFloat64;
        stage01::DistributedDataParallel ddp(std::make_shared<tp::nn::MiniMLP>(options), group);
      }),
      doctest::Contains("is (32, 16) float32 on rank 0 but (32, 16) float64 on rank 1"),
      SpawnError);
}

TEST_CASE("ranks wrapping a different number of parameters get an error naming both counts") {
  CHECK_THROWS_WITH_AS(
      run_ranks(2, [](int rank, auto group) {
        auto model = tp::nn::deep_mlp(4, 8, rank == 0 ? 2 : 3, 1);
        stage01::DistributedDataParallel ddp(model, group);
      }),
      doctest::Contains("rank 1 wraps 8 parameters but rank 0 wraps 6"), SpawnError);
}

TEST_CASE("sync_grads before backward names the parameter without a gradient and the fix") {
  CHECK_THROWS_WITH_AS(
      run_ranks(2, [](int, auto group) {
        stage01::DistributedDataParallel ddp(std::make_shared<tp::nn::MiniMLP>(), group);
        ddp.sync_grads();
      }),
      doctest::Contains("no gradient for parameter 0 (fc1.weight) in sync_grads call 1; call "
                        "sync_grads() after loss.backward()"),
      SpawnError);
}

TEST_CASE("a null module or process group is rejected before any collective") {
  CHECK_THROWS_WITH_AS(stage01::DistributedDataParallel(nullptr, nullptr),
                       doctest::Contains("the module is null"), tp::Error);
  CHECK_THROWS_WITH_AS(
      stage01::DistributedDataParallel(std::make_shared<tp::nn::MiniMLP>(), nullptr),
      doctest::Contains("the process group is null; call init_process_group first"), tp::Error);
}

TEST_CASE("after sync_grads every rank holds the mean of the ranks' gradients") {
  // Closed form: rank r sets every gradient to r + 1, so the mean over W ranks
  // is (W + 1) / 2 everywhere.
  run_ranks(4, [](int rank, auto group) {
    auto model = std::make_shared<tp::nn::MiniMLP>();
    stage01::DistributedDataParallel ddp(model, group);
    for (tp::Tensor& p : ddp.parameters()) p.set_grad(tp::full(p.shape(), rank + 1.0));
    ddp.sync_grads();
    for (const tp::Tensor& p : ddp.parameters()) {
      for (double g : p.grad().to_vector()) TP_CHECK_EQ(g, 2.5, "rank ", rank, ": mean gradient");
    }
  });
}
