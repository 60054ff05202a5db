// A lesson's own rank worker (tensorplay/train/worker.h): check_workers on
// hand-made results, one per verdict, and run_workers on a tiny worker that
// needs no DDP. The diagnoses for real planted bugs in lesson 01's worker
// are the stage 01 checker's tests (tests/mutants/01-naive/worker_*.mutant).
#include <doctest/doctest.h>

#include "tensorplay/distributed/init.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/train/reference.h"
#include "tensorplay/train/worker.h"

namespace {

using doctest::Contains;
namespace train = tp::train;

train::RunConfig buffered_config() {
  train::RunConfig c;
  c.world_size = 2;
  c.steps = 3;
  c.batch_size = 4;
  c.model_kind = train::ModelKind::Buffered;
  c.buffer_sync = train::BufferSync::None;
  return c;
}

// What a correct worker reports: exactly the reference, on every rank.
std::vector<train::WorkerResult> perfect(const train::RunConfig& c,
                                         const train::ReferenceResult& ref) {
  std::vector<train::WorkerResult> out;
  for (int r = 0; r < c.world_size; ++r) {
    out.push_back({ref.losses[static_cast<size_t>(r)], ref.final_params,
                   ref.final_buffers[static_cast<size_t>(r)]});
  }
  return out;
}

// check_workers' one finding on these results, as "what | likely cause".
std::string verdict(const train::RunConfig& c, const train::ReferenceResult& ref,
                    const std::vector<train::WorkerResult>& ranks) {
  const std::vector<train::Finding> findings = train::check_workers(c, ref, ranks, 1e-5);
  REQUIRE(findings.size() == 1);
  return findings[0].what + " | " + findings[0].likely_cause;
}

bool says(const std::string& text, const std::string& phrase) {
  if (text.find(phrase) != std::string::npos) return true;
  MESSAGE("expected \"" << phrase << "\" in: " << text);
  return false;
}

}  // namespace

TEST_CASE("check_workers passes results equal to the reference") {
  const train::RunConfig c = buffered_config();
  const train::ReferenceResult ref = train::train_reference(c);
  CHECK(train::check_workers(c, ref, perfect(c, ref), 1e-5).empty());
}

TEST_CASE("check_workers names a rank that reported too few losses") {
  const train::RunConfig c = buffered_config();
  const train::ReferenceResult ref = train::train_reference(c);
  auto ranks = perfect(c, ref);
  ranks[1].losses.pop_back();
  CHECK(says(verdict(c, ref, ranks),
             "rank 1's worker reported 2 losses; the plan has 3 steps"));
}

TEST_CASE("check_workers names the first (step, rank) whose loss differs, with a cause per case") {
  const train::RunConfig c = buffered_config();
  const train::ReferenceResult ref = train::train_reference(c);
  SUBCASE("rank 0 at step 0: the model or the rows of rank 0") {
    auto ranks = perfect(c, ref);
    ranks[0].losses[0] += 1e-3;
    CHECK(says(verdict(c, ref, ranks),
               "at step 0 (rank 0): rank 0"));
    CHECK(says(verdict(c, ref, ranks),
               "rank 0 does not start from the plan's model"));
  }
  SUBCASE("rank 1 at step 0 while rank 0 matches: wrapping, rows or seeds of that rank") {
    auto ranks = perfect(c, ref);
    ranks[1].losses[0] += 1e-3;
    CHECK(says(verdict(c, ref, ranks),
               "at step 0 (rank 1): rank 1"));
    CHECK(says(verdict(c, ref, ranks), "rank 0's matches"));
  }
  SUBCASE("a later step, ranks that end apart: no averaged gradient") {
    auto ranks = perfect(c, ref);
    ranks[0].losses[2] += 1e-3;
    ranks[1].losses[2] += 1e-3;
    ranks[1].parameters[0].values[0] += 1e-2;
    CHECK(says(verdict(c, ref, ranks),
               "at step 2 (ranks 0, 1)"));
    CHECK(says(verdict(c, ref, ranks),
               "the ranks stepped with their own gradients"));
  }
  SUBCASE("a later step, ranks that agree: the same wrong update everywhere") {
    auto ranks = perfect(c, ref);
    ranks[1].losses[1] += 1e-3;
    CHECK(says(verdict(c, ref, ranks),
               "every rank made the same wrong update"));
  }
}

TEST_CASE("check_workers names final parameters, then final buffers, when every loss matches") {
  const train::RunConfig c = buffered_config();
  const train::ReferenceResult ref = train::train_reference(c);
  auto ranks = perfect(c, ref);
  ranks[1].buffers[0].values[0] += 1e-3;
  CHECK(says(verdict(c, ref, ranks),
             "rank 1's final buffers differ from the reference's (norm.running_mean by 0.001"));
  ranks[0].parameters[1].values[0] -= 1e-3;
  CHECK(says(verdict(c, ref, ranks),
             "rank 0's final parameters differ from the reference's (fc1.bias by 0.001"));
}

TEST_CASE("run_workers returns every rank's result in rank order, and refuses accumulation") {
  train::RunConfig c = buffered_config();
  c.world_size = 3;
  // A worker that joins and leaves the group and reports its rank as a loss.
  auto worker = [&c](int rank, const std::string& init_method) {
    tp::distributed::init_process_group("gloo", rank, c.world_size, init_method);
    tp::distributed::destroy_process_group();
    return train::WorkerResult{{static_cast<double>(rank)}, {}, {}};
  };
  const std::vector<train::WorkerResult> results = train::run_workers(c, worker);
  REQUIRE(results.size() == 3);
  for (size_t r = 0; r < results.size(); ++r) {
    CHECK(results[r].losses == std::vector<double>{static_cast<double>(r)});
  }
  c.micro_batches = 2;
  CHECK_THROWS_WITH_AS(train::run_workers(c, worker),
                       Contains("a rank worker runs one micro-batch per step"), tp::Error);
}
