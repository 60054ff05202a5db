// verify_same_tensors_on_all_ranks with real processes: identical lists pass
// at world sizes 1 to 3 with a fixed number of all-gathers; a shape, dtype or
// count mismatch on one rank throws on every rank, with one wording that
// names both ranks and both shapes.
//
// Children cannot use doctest macros (doctest's state lives in the parent).
// Each rank catches the DistributedError itself and returns its message and
// its all-gather count, so the parent can check every rank, not only the
// first failure that spawn would report.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "tensorplay/distributed/model_check.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/tensor.h"
#include "tensorplay/util/temp_dir.h"

namespace dist = tp::distributed;
namespace mp = tp::multiprocessing;
using doctest::Contains;
using tp::NamedTensor;

namespace {

// Collective deadline: long enough for a loaded 2-core machine, short enough
// that a rank left waiting fails the test instead of hanging it.
constexpr std::chrono::milliseconds kCollectiveTimeout{20000};

const std::string kFix = "; every rank must build the same model before wrapping it in DDP";

// A two-layer MLP's parameters as a DDP would list them; every value is
// `value`, so ranks can differ in values while agreeing in shapes.
std::vector<NamedTensor> mlp_parameters(double value) {
  return {{"fc1.weight", tp::full({16, 8}, value)},
          {"fc1.bias", tp::full({16}, value)},
          {"fc2.weight", tp::full({32, 16}, value)},
          {"fc2.bias", tp::full({32}, value)}};
}

// Runs on `world` spawned ranks, each with its own ProcessGroupGloo: rank r
// checks tensors_of(r). Returns, per rank, "ok" or the DistributedError's
// message, then " | allgathers: N".
template <typename TensorsOf>
std::vector<std::string> check_on_ranks(int world, TensorsOf tensors_of,
                                        const std::string& noun = "parameter") {
  tp::TempDir dir("tp-model-check");
  const std::string path = dir.path();
  mp::SpawnOptions options;
  options.timeout = std::chrono::milliseconds(60000);
  return mp::spawn(
      options,
      [&](int rank) {
        dist::ProcessGroupGloo group(path, rank, world, dist::GlooOptions{kCollectiveTimeout});
        std::string outcome = "ok";
        try {
          dist::verify_same_tensors_on_all_ranks(group, tensors_of(rank), "stage02 DDP", noun);
        } catch (const tp::DistributedError& e) {
          outcome = e.what();
        }
        return outcome + " | allgathers: " + std::to_string(group.counters().allgather);
      },
      world);
}

}  // namespace

TEST_CASE("identical parameter lists pass at world sizes 1 to 3 with 2 all-gathers") {
  for (int world = 1; world <= 3; ++world) {
    CAPTURE(world);
    // Values differ by rank: only shapes and dtypes are compared.
    const auto outcomes = check_on_ranks(world, [](int rank) { return mlp_parameters(rank); });
    REQUIRE(outcomes.size() == static_cast<std::size_t>(world));
    for (const std::string& outcome : outcomes) CHECK(outcome == "ok | allgathers: 2");
  }
}

TEST_CASE("empty lists pass with exactly 1 all-gather") {
  const auto outcomes = check_on_ranks(2, [](int) { return std::vector<NamedTensor>{}; });
  for (const std::string& outcome : outcomes) CHECK(outcome == "ok | allgathers: 1");
}

TEST_CASE("a shape mismatch on rank 1 of 3 throws on every rank, naming both shapes and ranks") {
  const auto outcomes = check_on_ranks(3, [](int rank) {
    std::vector<NamedTensor> params = mlp_parameters(1.0);
    if (rank == 1) params[2].second = tp::zeros({16, 32});  // fc2.weight transposed
    return params;
  });
  REQUIRE(outcomes.size() == 3);
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(outcomes[static_cast<std::size_t>(r)] ==
          "stage02 DDP (rank " + std::to_string(r) +
              "): parameter 2 (fc2.weight here) is (32, 16) float32 on rank 0 but (16, 32) "
              "float32 on rank 1" + kFix + " | allgathers: 2");
  }
}

TEST_CASE("a mismatch left uncaught reaches the parent through spawn with its wording") {
  tp::TempDir dir("tp-model-check");
  const std::string path = dir.path();
  // spawn reports the first rank that failed; every rank throws, so any rank
  // may be first, and the message names rank 0's and rank 2's shapes either way.
  const std::string expected =
      "parameter 0 (fc1.weight here) is (16, 8) float32 on rank 0 but (16, 8) float64 on "
      "rank 2" + kFix;
  CHECK_THROWS_WITH_AS(
      mp::spawn(
          [&path](int rank) {
            dist::ProcessGroupGloo group(path, rank, 3, dist::GlooOptions{kCollectiveTimeout});
            std::vector<NamedTensor> params = mlp_parameters(1.0);
            if (rank == 2) params[0].second = tp::zeros({16, 8}, tp::kFloat64);
            dist::verify_same_tensors_on_all_ranks(group, params, "stage02 DDP");
          },
          3),
      Contains(expected.c_str()),
      mp::SpawnError);
}

TEST_CASE("different parameter counts throw on every rank after 1 all-gather") {
  const auto outcomes = check_on_ranks(3, [](int rank) {
    std::vector<NamedTensor> params = mlp_parameters(1.0);
    if (rank == 1) params.pop_back();
    return params;
  });
  REQUIRE(outcomes.size() == 3);
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(outcomes[static_cast<std::size_t>(r)] ==
          "stage02 DDP (rank " + std::to_string(r) + "): rank 1 wraps 3 parameters but rank 0 "
              "wraps 4" + kFix + " | allgathers: 1");
  }
}

TEST_CASE("the noun names what is compared: buffers") {
  const auto dtype_mismatch = check_on_ranks(
      2,
      [](int rank) {
        return std::vector<NamedTensor>{
            {"bn.running_mean", tp::zeros({8}, rank == 0 ? tp::kFloat32 : tp::kFloat64)}};
      },
      "buffer");
  CHECK(dtype_mismatch[1] == "stage02 DDP (rank 1): buffer 0 (bn.running_mean here) is (8) "
                             "float32 on rank 0 but (8) float64 on rank 1" + kFix +
                                 " | allgathers: 2");

  const auto count_mismatch = check_on_ranks(
      2,
      [](int rank) {
        std::vector<NamedTensor> buffers{{"bn.running_mean", tp::zeros({8})}};
        if (rank == 1) buffers.push_back({"bn.running_var", tp::ones({8})});
        return buffers;
      },
      "buffer");
  CHECK(count_mismatch[0] == "stage02 DDP (rank 0): rank 1 wraps 2 buffers but rank 0 wraps 1" +
                                 kFix + " | allgathers: 1");
}

TEST_CASE("an undefined tensor on one rank and a 5-D tensor are reported on every rank") {
  const auto undefined = check_on_ranks(2, [](int rank) {
    std::vector<NamedTensor> params = mlp_parameters(1.0);
    if (rank == 1) params[3].second = tp::Tensor();
    return params;
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(undefined[static_cast<std::size_t>(r)] ==
          "stage02 DDP (rank " + std::to_string(r) +
              "): parameter 3 (fc2.bias here) is (32) float32 on rank 0 but undefined on "
              "rank 1" + kFix + " | allgathers: 2");
  }

  // Identical on both ranks, yet too deep for the fixed-width rows.
  const auto deep = check_on_ranks(
      2, [](int) { return std::vector<NamedTensor>{{"w", tp::zeros({1, 2, 1, 2, 1})}}; });
  for (const std::string& outcome : deep) {
    CHECK(outcome.find("parameter 0 (w here) has 5 dimensions on rank 0; "
                       "tp::distributed::verify_same_tensors_on_all_ranks compares "
                       "parameters of up to 4 dimensions") != std::string::npos);
    CHECK(outcome.find(" | allgathers: 2") != std::string::npos);
  }
}
