// The training harness: result round trips, the reference trainer, the
// diagnosis on hand-made results, and the trace-order check. The checkers
// stand on these, so each verdict is tested on inputs built to trigger it.
#include <doctest/doctest.h>

#include <cmath>

#include "tensorplay/train/checker.h"
#include "tensorplay/train/compare.h"
#include "tensorplay/train/reference.h"
#include "tensorplay/train/results.h"

namespace {

using tp::train::RankResult;
using tp::train::ReferenceResult;
using tp::train::RunConfig;

RunConfig small_config(int world_size) {
  RunConfig c;
  c.world_size = world_size;
  c.steps = 3;
  c.batch_size = 4;
  return c;
}

// What a correct DDP reports: exactly the reference, on every rank.
std::vector<RankResult> perfect_ranks(const RunConfig& c, const ReferenceResult& ref) {
  std::vector<RankResult> ranks;
  for (int r = 0; r < c.world_size; ++r) {
    RankResult rr;
    rr.rank = r;
    for (const auto& step : ref.losses) rr.losses.push_back(step[static_cast<size_t>(r)]);
    rr.initial_params = ref.initial_params;
    rr.after_first_step = ref.after_first_step;
    rr.final_params = ref.final_params;
    ranks.push_back(rr);
  }
  return ranks;
}

std::string joined(const std::vector<tp::train::Finding>& findings) {
  return tp::train::format_findings(findings);
}

tp::trace::Event span(const char* name, uint64_t begin, uint64_t end, int64_t step = -1) {
  tp::trace::Event e;
  e.name = name;
  e.phase = 'X';
  e.begin_order = begin;
  e.end_order = end;
  if (step >= 0) e.args.push_back({"step", step});
  return e;
}

}  // namespace

TEST_CASE("a rank result survives serialize and parse bit for bit, trace events included") {
  RankResult r;
  r.rank = 2;
  r.losses = {0.1, 1.0 / 3.0, -0.0, 1e-300};
  r.final_params = {{"fc1.weight", {2, 1}, {0.25, -1.0 / 7.0}}};
  r.allreduces_per_step = {6, 6, 7};
  r.construction_broadcasts = 6;
  r.events.push_back(span("allreduce queued", 4, 4));
  r.events.back().thread = "main";
  r.events.back().args.push_back({"seq", 9});
  const RankResult back = tp::train::parse_rank_result(tp::train::serialize(r));
  CHECK(back.rank == 2);
  CHECK(back.losses == r.losses);
  CHECK(std::signbit(back.losses[2]));
  REQUIRE(back.final_params.size() == 1);
  CHECK(back.final_params[0].name == "fc1.weight");
  CHECK(back.final_params[0].shape == tp::Shape{2, 1});
  CHECK(back.final_params[0].values == r.final_params[0].values);
  CHECK(back.allreduces_per_step == r.allreduces_per_step);
  CHECK(back.construction_broadcasts == 6);
  REQUIRE(back.events.size() == 1);
  CHECK(back.events[0].name == "allreduce queued");
  CHECK(back.events[0].thread == "main");
  CHECK(back.events[0].args == r.events[0].args);
}

TEST_CASE("a truncated or foreign result is rejected") {
  CHECK_THROWS_WITH_AS(tp::train::parse_rank_result("rank 1\nlosses 1 0x1p-1\n"),
                       doctest::Contains("truncated"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::train::parse_rank_result("bogus 3\nend\n"),
                       doctest::Contains("unknown record 'bogus'"), tp::Error);
}

TEST_CASE("the reference records every rank's loss at every step and is deterministic") {
  const RunConfig c = small_config(3);
  const ReferenceResult a = tp::train::train_reference(c);
  const ReferenceResult b = tp::train::train_reference(c);
  REQUIRE(a.losses.size() == 3);
  for (const auto& step : a.losses) CHECK(step.size() == 3);
  CHECK(a.losses == b.losses);
  CHECK(a.final_params.size() == 6);
  CHECK(tp::train::norm(a.final_params) == tp::train::norm(b.final_params));
  CHECK(tp::train::norm(a.initial_params) != tp::train::norm(a.final_params));
}

TEST_CASE("with W = 1 the reference is plain single-process SGD on rank 0's shard") {
  // W = 1 scales the loss by 1/1: the reference must not change anything.
  const RunConfig c = small_config(1);
  const ReferenceResult ref = tp::train::train_reference(c);
  CHECK(tp::train::diagnose(c, ref, perfect_ranks(c, ref), 1e-12).empty());
}

TEST_CASE("diagnose finds nothing wrong with a run equal to the reference") {
  const RunConfig c = small_config(2);
  const ReferenceResult ref = tp::train::train_reference(c);
  CHECK(tp::train::diagnose(c, ref, perfect_ranks(c, ref), 1e-5).empty());
}

TEST_CASE("diagnose: replicas that start different point at the broadcast") {
  RunConfig c = small_config(2);
  c.per_rank_seed = true;
  const ReferenceResult ref = tp::train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  ranks[1].initial_params[2].values[0] += 0.5;
  const std::string report = joined(tp::train::diagnose(c, ref, ranks, 1e-5));
  CHECK(report.find("rank 1's parameters differ from rank 0's (fc2.weight)") != std::string::npos);
  CHECK(report.find("broadcast every parameter (and buffer) from rank 0") != std::string::npos);
}

TEST_CASE("diagnose: an update W times too large asks whether the sum is divided") {
  const RunConfig c = small_config(4);
  const ReferenceResult ref = tp::train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  for (RankResult& r : ranks) {
    for (size_t p = 0; p < r.after_first_step.size(); ++p) {
      auto& v = r.after_first_step[p].values;
      for (size_t i = 0; i < v.size(); ++i) {
        const double p0 = ref.initial_params[p].values[i];
        v[i] = p0 + 4.0 * (v[i] - p0);  // the step of the summed gradient
      }
    }
  }
  const std::string report = joined(tp::train::diagnose(c, ref, ranks, 1e-5));
  CHECK(report.find("is the sum divided by the world size?") != std::string::npos);
}

TEST_CASE("diagnose: one parameter split between ranks is named") {
  const RunConfig c = small_config(2);
  const ReferenceResult ref = tp::train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  ranks[1].after_first_step[5].values[0] += 1e-3;  // fc3.bias
  const std::string report = joined(tp::train::diagnose(c, ref, ranks, 1e-5));
  CHECK(report.find("only fc3.bias disagrees between ranks") != std::string::npos);
}

TEST_CASE("diagnose: a wrong loss at step 0 with equal parameters points at the forward pass") {
  const RunConfig c = small_config(2);
  const ReferenceResult ref = tp::train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  ranks[1].losses[0] *= 1.01;
  const std::string report = joined(tp::train::diagnose(c, ref, ranks, 1e-5));
  CHECK(report.find("step 0, rank 1: loss") != std::string::npos);
  CHECK(report.find("this rank's own shard") != std::string::npos);
}

TEST_CASE("diagnose: a drift that starts after step 0 names the first bad step") {
  const RunConfig c = small_config(2);
  const ReferenceResult ref = tp::train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  ranks[0].losses[2] += 0.01;
  const std::string report = joined(tp::train::diagnose(c, ref, ranks, 1e-5));
  CHECK(report.find("first differ at step 2") != std::string::npos);
}

TEST_CASE("diagnose: a missing rank or step is reported before any numbers") {
  const RunConfig c = small_config(3);
  const ReferenceResult ref = tp::train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  ranks.pop_back();
  CHECK(joined(tp::train::diagnose(c, ref, ranks, 1e-5)).find("2 ranks reported results; expected 3") !=
        std::string::npos);
  ranks = perfect_ranks(c, ref);
  ranks[1].losses.pop_back();
  CHECK(joined(tp::train::diagnose(c, ref, ranks, 1e-5)).find("rank 1 reported 2 step losses") !=
        std::string::npos);
}

TEST_CASE("the order check accepts all-reduces between backward and the optimizer step") {
  RankResult r;
  r.losses = {0.5};
  r.allreduces_per_step = {2};
  r.events = {span("step", 1, 10, 0), span("backward", 2, 3), span("allreduce", 4, 5),
              span("allreduce", 6, 7), span("optimizer", 8, 9)};
  CHECK(tp::train::check_sync_between_backward_and_step({r}).empty());
}

TEST_CASE("the order check refuses to pass a run without a trace") {
  RankResult r;
  r.losses = {0.5, 0.4};
  CHECK(joined(tp::train::check_sync_between_backward_and_step({r}))
            .find("the trace shows 0 training steps, the run had 2") != std::string::npos);
}

TEST_CASE("the order check flags an all-reduce that was issued but never ran") {
  RankResult r;
  r.losses = {0.5};
  r.allreduces_per_step = {2};
  r.events = {span("step", 1, 10, 0), span("backward", 2, 3), span("allreduce", 4, 5),
              span("optimizer", 8, 9)};
  CHECK(joined(tp::train::check_sync_between_backward_and_step({r}))
            .find("2 all-reduces were issued but 1 ran") != std::string::npos);
}

TEST_CASE("the order check flags an all-reduce that starts before backward ends") {
  RankResult r;
  r.rank = 3;
  r.losses = {0.5};
  r.events = {span("step", 1, 10, 0), span("backward", 2, 5), span("allreduce", 4, 6),
              span("optimizer", 8, 9)};
  CHECK(joined(tp::train::check_sync_between_backward_and_step({r}))
            .find("rank 3, step 0: an all-reduce started before backward finished") != std::string::npos);
}

TEST_CASE("the order check flags an all-reduce still running when the optimizer starts") {
  RankResult r;
  r.losses = {0.5, 0.4};
  r.events = {span("step", 1, 20, 0), span("backward", 2, 3), span("optimizer", 8, 9),
              span("step", 21, 30, 1), span("backward", 22, 23), span("allreduce", 24, 28),
              span("optimizer", 25, 26)};
  CHECK(joined(tp::train::check_sync_between_backward_and_step({r}))
            .find("step 1: an all-reduce was still running when the optimizer step began") !=
        std::string::npos);
}
