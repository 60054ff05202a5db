// Stage 03's DDP on what its checker cannot plan: a parameter that gets no
// gradient (an unfinished bucket must be a clear error on every rank, never a
// hang), bad options, and hooks that must go away with the DDP. (Correct
// training is the checker's job: tests/checkers/check_03.cc.)
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
auto run_ranks(int world_size, Body body) {
  tp::TempDir rendezvous;
  tp::multiprocessing::SpawnOptions options;
  options.timeout = std::chrono::seconds(60);
  return tp::multiprocessing::spawn(options, [&](int rank) {
    auto group = std::make_shared<tp::distributed::ProcessGroupGloo>(
        rendezvous.path(), rank, world_size,
        tp::distributed::GlooOptions{std::chrono::milliseconds(5000)});
    return body(rank, group);
  }, world_size);
}

// One forward and backward of BranchyMLP: `spare` never gets a gradient,
// and it is the last registered, so it sits in bucket 0.
std::string one_branchy_step(stage03::DistributedDataParallel& ddp, int rank) {
  const tp::Tensor x = tp::randn({4, 16});
  try {
    tp::mse_loss(ddp(x), tp::zeros({4, 4})).backward();
  } catch (const tp::DistributedError& e) {
    return e.what();
  }
  return "rank " + std::to_string(rank) + ": backward did not throw";
}

}  // namespace

// [snippet:unused-parameter]
TEST_CASE("a parameter without a gradient is an error on every rank naming it, never a hang") {
  const std::vector<std::string> messages = run_ranks(2, [](int rank, auto group) {
    tp::manual_seed(3);
    stage03::DistributedDataParallel ddp(std::make_shared<tp::nn::BranchyMLP>(), group);
    return one_branchy_step(ddp, rank);
  });
  for (const std::string& message : messages) {
    CAPTURE(message);
    CHECK(message.find("backward ended with no gradient for parameters 9 (spare.bias), "
                       "8 (spare.weight)") != std::string::npos);
    CHECK(message.find("find_unused_parameters") != std::string::npos);
  }
}
// [/snippet:unused-parameter]

TEST_CASE("after an unfinished backward, the next forward refuses to run") {
  const std::vector<std::string> messages = run_ranks(2, [](int rank, auto group) {
    tp::manual_seed(3);
    stage03::DistributedDataParallel ddp(std::make_shared<tp::nn::BranchyMLP>(), group);
    one_branchy_step(ddp, rank);
    try {
      ddp(tp::randn({4, 16}));
    } catch (const tp::DistributedError& e) {
      return std::string(e.what());
    }
    return std::string("the forward ran");
  });
  for (const std::string& message : messages) {
    CAPTURE(message);
    CHECK(message.find("the previous backward did not finish reducing gradients") !=
          std::string::npos);
  }
}

TEST_CASE("a cap that is not positive is refused") {
  CHECK_THROWS_WITH_AS(run_ranks(1, [](int, auto group) {
                         stage03::DistributedDataParallel ddp(
                             std::make_shared<tp::nn::MiniMLP>(), group, {.bucket_cap_mb = 0});
                         return std::string();
                       }),
                       doctest::Contains("bucket_cap_mb and first_bucket_cap_mb must be positive"),
                       SpawnError);
}

TEST_CASE("the hooks go away with the DDP: a later backward launches nothing") {
  const std::vector<std::string> counts = run_ranks(2, [](int, auto group) {
    auto model = std::make_shared<tp::nn::MiniMLP>();
    {
      stage03::DistributedDataParallel ddp(model, group);
    }
    group->reset_counters();
    tp::mse_loss((*model)(tp::randn({4, 16})), tp::zeros({4, 4})).backward();
    return std::to_string(group->counters().allreduce);
  });
  CHECK(counts == std::vector<std::string>{"0", "0"});
}
