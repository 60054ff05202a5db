// The training harness: the plan and its schedule, result round trips, the
// reference trainer on every knob against a hand-computed run, the diagnosis
// on hand-made results, and the trace predicates (one of them also against
// two small real DDPs: one that overlaps, one that only looks like it does).
// The checkers stand on these, so each verdict is tested on inputs built to
// trigger it.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

#include "tensorplay/autograd/engine.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/train/checker.h"
#include "tensorplay/train/compare.h"
#include "tensorplay/train/predicates.h"
#include "tensorplay/train/reference.h"
#include "tensorplay/train/results.h"
#include "tensorplay/util/temp_dir.h"

namespace {

using doctest::Contains;
using tp::train::RankResult;
using tp::train::ReferenceResult;
using tp::train::RunConfig;
namespace train = tp::train;

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
    rr.losses = ref.losses[static_cast<size_t>(r)];
    rr.initial_params = ref.initial_params;
    rr.after_first_step = ref.after_first_step;
    rr.final_params = ref.final_params;
    rr.allreduces_per_micro.assign(rr.losses.size(), 0);
    rr.broadcasts_per_micro.assign(rr.losses.size(), 0);
    rr.initial_buffers = ref.initial_buffers[static_cast<size_t>(r)];
    rr.final_buffers = ref.final_buffers[static_cast<size_t>(r)];
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


namespace {

// A CaseRun over `ranks`, for the predicates (they read the plan and the
// results, never the reference's numbers).
struct Run {
  RunConfig config;
  ReferenceResult reference;
  std::vector<RankResult> ranks;
  train::CaseRun view() const { return {config, reference, ranks}; }
};

Run order_run(std::vector<RankResult> ranks) {
  Run run;
  run.config.world_size = 0;
  for (const RankResult& r : ranks) run.config.world_size = std::max(run.config.world_size, r.rank + 1);
  run.config.steps = static_cast<int64_t>(ranks.empty() ? 0 : ranks[0].losses.size());
  run.ranks = std::move(ranks);
  return run;
}

tp::trace::Event instant(const char* name, uint64_t at) {
  tp::trace::Event e = span(name, at, at);
  e.phase = 'i';
  return e;
}

// The two events of all-reduce #seq: queued at `queued` on the issuing
// thread, run over [begin, end] on the communication thread.
tp::trace::Event queued(int64_t seq, uint64_t at) {
  tp::trace::Event e = instant("allreduce queued", at);
  e.args.push_back({"seq", seq});
  return e;
}
tp::trace::Event allreduce(int64_t seq, uint64_t begin, uint64_t end) {
  tp::trace::Event e = span("allreduce", begin, end);
  e.args.push_back({"seq", seq});
  return e;
}
// A wait() on all-reduce #seq over [begin, end], on the thread that waits.
tp::trace::Event waited(int64_t seq, uint64_t begin, uint64_t end) {
  tp::trace::Event e = span("wait", begin, end);
  e.args.push_back({"seq", seq});
  return e;
}

// ---- a second, deliberately plain implementation of the plan --------------
// Gradients are collected per micro-batch as vectors, scaled and summed by
// hand, and SGD (no momentum) is applied as p -= lr * g. Nothing is shared
// with train_reference but the model, the data and the schedule functions.
struct HandRun {
  std::vector<std::vector<double>> losses;  // [rank][i]
  train::Snapshot after_first_step;
  train::Snapshot final_params;
  std::vector<std::vector<double>> final_buffers;  // [rank]: the buffer values, flattened
};

HandRun hand_reference(const RunConfig& c) {
  const int w = c.world_size;
  const int64_t k = c.micro_batches;
  std::vector<std::vector<double>> buffers;  // each rank's buffer values, flattened
  for (int r = 0; r < w; ++r) {
    tp::manual_seed(train::model_seed_for_rank(c, r));
    std::vector<double> values;
    for (const tp::Tensor& b : train::make_model(c)->buffers()) {
      for (double v : b.to_vector()) values.push_back(v);
    }
    buffers.push_back(values);
  }
  if (c.buffer_sync != train::BufferSync::None) {
    for (int r = 1; r < w; ++r) buffers[r] = buffers[0];
  }
  tp::manual_seed(train::model_seed_for_rank(c, 0));
  auto model = train::make_model(c);
  tp::data::SyntheticRegression data(train::data_options(c));
  auto load = [&](const std::vector<double>& values) {
    tp::NoGradGuard no_grad;
    size_t at = 0;
    for (tp::Tensor b : model->buffers()) {
      std::vector<double> part(values.begin() + static_cast<long>(at),
                               values.begin() + static_cast<long>(at + static_cast<size_t>(b.numel())));
      b.copy_(tp::tensor(part, b.shape(), b.dtype()));
      at += static_cast<size_t>(b.numel());
    }
  };
  auto save = [&] {
    std::vector<double> values;
    for (const tp::Tensor& b : model->buffers()) {
      for (double v : b.to_vector()) values.push_back(v);
    }
    return values;
  };
  HandRun out;
  out.losses.resize(static_cast<size_t>(w));
  const std::vector<tp::Tensor> params = model->parameters();
  for (int64_t s = 0; s < train::total_steps(c); ++s) {
    int active = 0;
    for (int r = 0; r < w; ++r) active += s * k < train::micro_batches_of(c, r) ? 1 : 0;
    const double divisor = c.divisor == train::Divisor::ActiveRanks ? active : w;
    std::vector<std::vector<double>> total(params.size());
    for (int64_t m = 0; m < k; ++m) {
      if (c.buffer_sync == train::BufferSync::EveryStep && m == 0) {
        for (int r = 1; r < w; ++r) buffers[r] = buffers[0];
      }
      for (int r = 0; r < w; ++r) {
        const int64_t i = s * k + m;
        if (i >= train::micro_batches_of(c, r)) continue;
        tp::data::Batch batch = data.rows((i * w + r) * c.batch_size, c.batch_size);
        load(buffers[r]);
        model->zero_grad();
        tp::Tensor loss = tp::mse_loss((*model)(batch.x), batch.y);
        buffers[r] = save();
        out.losses[r].push_back(loss.item());
        loss.backward();
        for (size_t p = 0; p < params.size(); ++p) {
          if (!params[p].grad().defined()) continue;  // this route did not use it
          const std::vector<double> g = params[p].grad().to_vector();
          total[p].resize(g.size(), 0.0);
          for (size_t e = 0; e < g.size(); ++e) total[p][e] += g[e] / (divisor * k);
        }
      }
    }
    tp::NoGradGuard no_grad;
    for (size_t p = 0; p < params.size(); ++p) {
      if (total[p].empty()) continue;  // no gradient this step: SGD leaves it alone
      tp::Tensor g = tp::tensor(total[p], params[p].shape(), params[p].dtype());
      tp::Tensor(params[p]).add_(g, -c.lr);
    }
    if (s == 0) out.after_first_step = train::snapshot(model->named_parameters());
  }
  out.final_params = train::snapshot(model->named_parameters());
  out.final_buffers = buffers;
  return out;
}

double max_diff(const train::Snapshot& a, const train::Snapshot& b) {
  REQUIRE(a.size() == b.size());
  double d = 0.0;
  for (size_t p = 0; p < a.size(); ++p) {
    REQUIRE(a[p].values.size() == b[p].values.size());
    for (size_t e = 0; e < a[p].values.size(); ++e) {
      d = std::max(d, std::abs(a[p].values[e] - b[p].values[e]));
    }
  }
  return d;
}

// The reference agrees with the hand-computed run to float64 rounding.
void check_reference_matches_hand(const RunConfig& c) {
  const ReferenceResult ref = train::train_reference(c);
  const HandRun hand = hand_reference(c);
  REQUIRE(ref.losses.size() == hand.losses.size());
  for (size_t r = 0; r < hand.losses.size(); ++r) {
    CAPTURE(r);
    REQUIRE(ref.losses[r].size() == hand.losses[r].size());
    for (size_t i = 0; i < hand.losses[r].size(); ++i) {
      CHECK(ref.losses[r][i] == doctest::Approx(hand.losses[r][i]).epsilon(1e-12));
    }
    std::vector<double> flat;
    for (const train::ParamValues& b : ref.final_buffers[r]) {
      flat.insert(flat.end(), b.values.begin(), b.values.end());
    }
    REQUIRE(flat.size() == hand.final_buffers[r].size());
    for (size_t e = 0; e < flat.size(); ++e) CHECK(std::abs(flat[e] - hand.final_buffers[r][e]) < 1e-12);
  }
  // Rounding: the reference sums scaled losses through autograd, the hand
  // run scales each gradient; float64 keeps them within ~1e-16 per step.
  CHECK(max_diff(ref.after_first_step, hand.after_first_step) < 1e-12);
  CHECK(max_diff(ref.final_params, hand.final_params) < 1e-12);
  CHECK(max_diff(ref.initial_params, ref.final_params) > 1e-4);  // it trained
}

RunConfig two_steps(int world_size) {
  RunConfig c;
  c.world_size = world_size;
  c.steps = 2;
  c.batch_size = 3;
  c.dtype = tp::kFloat64;
  c.per_rank_seed = true;
  return c;
}

}  // namespace

// ---- the plan ------------------------------------------------------------------

TEST_CASE("the schedule of an uneven plan: micro-batches, steps and the divisor per step") {
  RunConfig c;
  c.world_size = 3;
  c.micro_batches = 2;
  c.batches_per_rank = {4, 2, 6};
  CHECK(train::micro_batches_of(c, 0) == 4);
  CHECK(train::steps_of(c, 1) == 1);
  CHECK(train::total_steps(c) == 3);
  CHECK(train::uneven(c));
  CHECK(train::active_ranks(c, 0) == 3);
  CHECK(train::active_ranks(c, 1) == 2);
  CHECK(train::active_ranks(c, 2) == 1);
  CHECK(train::divisor_at(c, 2) == 3);  // the initial world size by default
  c.divisor = train::Divisor::ActiveRanks;
  CHECK(train::divisor_at(c, 1) == 2);
  CHECK(train::divisor_at(c, 2) == 1);
  c.batches_per_rank.clear();
  c.steps = 5;
  CHECK(train::micro_batches_of(c, 2) == 10);
  CHECK_FALSE(train::uneven(c));
}

TEST_CASE("a plan that cannot run is refused, naming the field") {
  RunConfig c;
  c.world_size = 2;
  c.micro_batches = 2;
  c.batches_per_rank = {4, 3};
  CHECK_THROWS_WITH_AS(train::validate(c), Contains("batches_per_rank[1] is 3"), tp::Error);
  c.batches_per_rank = {4};
  CHECK_THROWS_WITH_AS(train::validate(c), Contains("one count per rank"), tp::Error);
  c.batches_per_rank = {0, 0};
  CHECK_THROWS_WITH_AS(train::validate(c), Contains("at least one rank must train"), tp::Error);
  c.batches_per_rank = {4, 0};  // a rank with no batch joins at once
  CHECK_NOTHROW(train::validate(c));
  c.batches_per_rank = {4, 2};
  c.buffer_sync = train::BufferSync::EveryStep;
  CHECK_THROWS_WITH_AS(train::validate(c), Contains("EveryStep with uneven inputs"), tp::Error);
  c = RunConfig{};
  c.micro_batches = 0;
  CHECK_THROWS_WITH_AS(train::train_reference(c), Contains("micro_batches"), tp::Error);
}

TEST_CASE("a rank result survives serialize and parse bit for bit, everything included") {
  RankResult r;
  r.rank = 2;
  r.losses = {0.1, 1.0 / 3.0, -0.0, 1e-300, -INFINITY, NAN};
  r.final_params = {{"fc1.weight", {2, 1}, {0.25, -1.0 / 7.0}}};
  r.initial_buffers = {{"norm.running_mean", {2}, {0.5, -0.125}}};
  r.final_buffers = {{"norm.running_mean", {2}, {1.0 / 3.0, 2.0}}};
  r.allreduces_per_micro = {0, 6, 7};
  r.broadcasts_per_micro = {1, 1, 1};
  r.grad_copy_bytes_per_micro = {6928, 0, uint64_t{1} << 40};
  r.buckets = {{5, 4}, {3, 2, 1, 0}};
  r.grad_storage = {1, 1, 2, 0};
  r.construction_broadcasts = 6;
  r.memory = tp::memory::Stats{};
  r.memory->live = {1, 2, 3, 4, 5};
  r.memory->peak = {6, 7, 8, 9, uint64_t{1} << 40};
  r.memory->model_state_peak = 21;
  r.events.push_back(span("allreduce queued", 4, 4));
  r.events.back().thread = "main";
  r.events.back().args.push_back({"seq", 9});
  r.events.back().tts_us = 123456;
  r.events.back().tdur_us = 789;
  const RankResult back = train::parse_rank_result(train::serialize(r));
  CHECK(back.rank == 2);
  REQUIRE(back.losses.size() == 6);
  CHECK(std::equal(back.losses.begin(), back.losses.begin() + 5, r.losses.begin()));
  CHECK(std::signbit(back.losses[2]));
  CHECK(std::isinf(back.losses[4]));  // a diverged run's losses come back as they were
  CHECK(std::isnan(back.losses[5]));
  REQUIRE(back.final_params.size() == 1);
  CHECK(back.final_params[0].name == "fc1.weight");
  CHECK(back.final_params[0].shape == tp::Shape{2, 1});
  CHECK(back.final_params[0].values == r.final_params[0].values);
  REQUIRE(back.final_buffers.size() == 1);
  CHECK(back.final_buffers[0].values == r.final_buffers[0].values);
  CHECK(back.initial_buffers[0].name == "norm.running_mean");
  CHECK(back.allreduces_per_micro == r.allreduces_per_micro);
  CHECK(back.broadcasts_per_micro == r.broadcasts_per_micro);
  CHECK(back.grad_copy_bytes_per_micro == r.grad_copy_bytes_per_micro);
  CHECK(back.buckets == r.buckets);
  CHECK(back.grad_storage == r.grad_storage);
  CHECK(back.construction_broadcasts == 6);
  REQUIRE(back.memory.has_value());
  CHECK(back.memory->live == r.memory->live);
  CHECK(back.memory->peak == r.memory->peak);
  CHECK(back.memory->model_state_peak == 21);
  CHECK_FALSE(train::parse_rank_result(train::serialize(RankResult{})).memory.has_value());
  CHECK(train::allreduces_in_step(back, 3, 0) == 13);
  REQUIRE(back.events.size() == 1);
  CHECK(back.events[0].name == "allreduce queued");
  CHECK(back.events[0].thread == "main");
  CHECK(back.events[0].args == r.events[0].args);
  CHECK(back.events[0].tts_us == 123456);  // the thread's CPU clock rides along
  CHECK(back.events[0].tdur_us == 789);
}

TEST_CASE("a truncated or foreign result is rejected") {
  RankResult r;
  r.losses = {0.5, 0.25};
  const std::string bytes = train::serialize(r);
  CHECK_THROWS_WITH_AS(train::parse_rank_result(bytes.substr(0, bytes.size() - 3)),
                       Contains("truncated or corrupt"), tp::Error);
  CHECK_THROWS_WITH_AS(train::parse_rank_result(bytes + "x"), Contains("truncated or corrupt"),
                       tp::Error);
  const std::vector<std::uint8_t> foreign = nlohmann::json::to_cbor({{"bogus", 3}});
  CHECK_THROWS_WITH_AS(train::parse_rank_result(std::string(foreign.begin(), foreign.end())),
                       Contains("not a rank result"), tp::Error);
}

// ---- the reference ----------------------------------------------------------------

TEST_CASE("the reference records every rank's loss on every micro-batch and is deterministic") {
  const RunConfig c = small_config(3);
  const ReferenceResult a = train::train_reference(c);
  const ReferenceResult b = train::train_reference(c);
  REQUIRE(a.losses.size() == 3);
  for (const auto& rank : a.losses) CHECK(rank.size() == 3);
  CHECK(a.losses == b.losses);
  CHECK(a.final_params.size() == 6);
  CHECK(train::norm(a.final_params) == train::norm(b.final_params));
  CHECK(train::norm(a.initial_params) != train::norm(a.final_params));
}

TEST_CASE("the reference equals a hand-computed two-step run on every knob") {
  SUBCASE("plain: W = 3") { check_reference_matches_hand(two_steps(3)); }
  SUBCASE("gradient accumulation: K = 3 micro-batches per step") {
    RunConfig c = two_steps(2);
    c.micro_batches = 3;
    check_reference_matches_hand(c);
  }
  SUBCASE("uneven inputs divided by the initial world size") {
    RunConfig c = two_steps(3);
    c.batches_per_rank = {2, 1, 2};
    check_reference_matches_hand(c);
  }
  SUBCASE("uneven inputs divided by the ranks still active") {
    RunConfig c = two_steps(3);
    c.micro_batches = 2;
    c.batches_per_rank = {4, 2, 4};
    c.divisor = train::Divisor::ActiveRanks;
    check_reference_matches_hand(c);
  }
  SUBCASE("the branchy model: parameters without a gradient are left alone") {
    RunConfig c = two_steps(4);
    c.model_kind = train::ModelKind::Branchy;
    check_reference_matches_hand(c);
  }
  for (auto sync : {train::BufferSync::None, train::BufferSync::AtConstruction,
                    train::BufferSync::EveryStep}) {
    SUBCASE("the buffered model, each BufferSync") {
      RunConfig c = two_steps(3);
      c.model_kind = train::ModelKind::Buffered;
      c.micro_batches = 2;
      c.buffer_sync = sync;
      check_reference_matches_hand(c);
    }
  }
}

TEST_CASE("the reference's knobs change what they should") {
  RunConfig c = two_steps(2);
  c.model_kind = train::ModelKind::Buffered;
  c.buffer_sync = train::BufferSync::None;
  const ReferenceResult own = train::train_reference(c);
  // Unsynced buffers: each rank starts from what its own seed built.
  CHECK(max_diff(own.initial_buffers[0], own.initial_buffers[1]) > 1e-3);
  c.buffer_sync = train::BufferSync::AtConstruction;
  const ReferenceResult synced = train::train_reference(c);
  CHECK(max_diff(synced.initial_buffers[0], synced.initial_buffers[1]) == 0.0);
  // ... and then diverge, each rank updating them with its own micro-batches.
  CHECK(max_diff(synced.final_buffers[0], synced.final_buffers[1]) > 1e-6);

  RunConfig branchy = two_steps(2);
  branchy.model_kind = train::ModelKind::Branchy;
  const ReferenceResult b = train::train_reference(branchy);
  // spare is never reached; of the two branches, at least the one some
  // rank did not take in step 0.
  REQUIRE(b.unreached_in_step0.size() >= 2);
  CHECK(b.unreached_in_step0[b.unreached_in_step0.size() - 2] == "spare.weight");
  CHECK(b.unreached_in_step0.back() == "spare.bias");
  CHECK(train::train_reference(two_steps(2)).unreached_in_step0.empty());
  for (size_t p = 0; p < b.final_params.size(); ++p) {
    if (b.final_params[p].name.rfind("spare.", 0) != 0) continue;
    CHECK(b.final_params[p].values == b.initial_params[p].values);  // never used, never moved
  }
}

TEST_CASE("with W = 1 the reference is plain single-process SGD on rank 0's shard") {
  // W = 1 scales the loss by 1/1: the reference must not change anything.
  const RunConfig c = small_config(1);
  const ReferenceResult ref = train::train_reference(c);
  CHECK(train::diagnose(c, ref, perfect_ranks(c, ref), 1e-12).empty());
}

// ---- the diagnosis ------------------------------------------------------------------

TEST_CASE("diagnose finds nothing wrong with a run equal to the reference, ragged ones included") {
  const RunConfig c = small_config(2);
  const ReferenceResult ref = train::train_reference(c);
  CHECK(train::diagnose(c, ref, perfect_ranks(c, ref), 1e-5).empty());
  RunConfig uneven = small_config(3);
  uneven.batches_per_rank = {3, 1, 2};
  const ReferenceResult ragged = train::train_reference(uneven);
  CHECK(ragged.losses[1].size() == 1);
  CHECK(train::diagnose(uneven, ragged, perfect_ranks(uneven, ragged), 1e-5).empty());
}

TEST_CASE("diagnose: a tiny float32 difference after a thousand matching steps is called rounding") {
  // `./kit demo 01 --steps 20000` (a correct stage 01, float32) first differs
  // by 1.2e-5 at step 3547: rounding compounding, not a bug.
  RunConfig c = small_config(2);
  c.steps = 1100;
  const ReferenceResult ref = train::train_reference(c);
  REQUIRE(ref.losses[1].size() == 1100);
  auto ranks = perfect_ranks(c, ref);
  ranks[1].losses[1050] += 2e-5;
  CHECK(joined(train::diagnose(c, ref, ranks, 1e-5)).find("float32 rounding") != std::string::npos);
  // Early, or large, it is not.
  ranks = perfect_ranks(c, ref);
  ranks[1].losses[5] += 2e-5;
  CHECK(joined(train::diagnose(c, ref, ranks, 1e-5)).find("float32 rounding") == std::string::npos);
  ranks = perfect_ranks(c, ref);
  ranks[1].losses[1050] += 0.1;
  CHECK(joined(train::diagnose(c, ref, ranks, 1e-5)).find("float32 rounding") == std::string::npos);
}

TEST_CASE("diagnose: a non-finite value is named first, and never matches") {
  const RunConfig c = small_config(2);
  const ReferenceResult ref = train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  ranks[1].losses[2] = std::numeric_limits<double>::infinity();
  std::vector<train::Finding> findings = train::diagnose(c, ref, ranks, 1e-5);
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].what.find("rank 1's loss in step 2 is inf, made with the parameters of "
                              "step 1's update") != std::string::npos);
  // A compare() of inf against a finite reference is an infinite difference,
  // not a match (tolerance * max(1, |inf|) would be infinite).
  CHECK(train::compare(ref, ranks, 1e-5).first_bad_index == 2);
  ranks = perfect_ranks(c, ref);
  ranks[0].final_params[1].values[0] = std::nan("");
  findings = train::diagnose(c, ref, ranks, 1e-5);
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].what.find("rank 0's parameters went non-finite in step ") == 0);
  CHECK(findings[0].what.find("'s update (the last): fc1.bias element 0 is nan") !=
        std::string::npos);
  // With accumulation, the micro-batch too.
  RunConfig k2 = small_config(2);
  k2.micro_batches = 2;
  const ReferenceResult ref2 = train::train_reference(k2);
  ranks = perfect_ranks(k2, ref2);
  ranks[0].losses[3] = std::nan("");
  CHECK(joined(train::diagnose(k2, ref2, ranks, 1e-5))
            .find("rank 0's loss in step 1, micro-batch 3, is nan, made with the parameters of "
                  "step 0's update") != std::string::npos);
}

TEST_CASE("diagnose: the first non-finite value is named by rank, step and parameter") {
  const RunConfig c = small_config(2);
  const ReferenceResult ref = train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  // Rank 0 divided by zero in step 0: its parameters, then every later loss
  // and its final parameters, are not finite; rank 1 stays finite.
  const double inf = std::numeric_limits<double>::infinity();
  ranks[0].after_first_step[2].values[1] = inf;
  for (size_t i = 1; i < ranks[0].losses.size(); ++i) ranks[0].losses[i] = std::nan("");
  ranks[0].final_params[0].values[0] = std::nan("");
  const std::vector<train::Finding> findings = train::diagnose(c, ref, ranks, 1e-5);
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].what.find("rank 0's parameters went non-finite in step 0's update: "
                              "fc2.weight element 1 is inf ([") == 0);
  CHECK(findings[0].what.find(", inf, ") != std::string::npos);  // the first values
  CHECK(findings[0].what.find("; the other ranks stay finite; the reference's are finite") !=
        std::string::npos);
  CHECK(findings[0].likely_cause.find("a division by zero on some ranks only") !=
        std::string::npos);
}

TEST_CASE("compare: an inf matches only the same inf, and a NaN matches nothing") {
  const RunConfig c = small_config(2);
  ReferenceResult ref = train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  const double inf = std::numeric_limits<double>::infinity();
  // The same infinity on both sides is equal ...
  ref.final_params[0].values[0] = inf;
  ranks[0].final_params[0].values[0] = inf;
  ranks[1].final_params[0].values[0] = inf;
  ref.losses[0][1] = -inf;
  ranks[0].losses[1] = -inf;
  train::Comparison same = train::compare(ref, ranks, 1e-5);
  CHECK(same.final_params.max_abs == 0.0);
  CHECK(same.final_between_ranks.max_abs == 0.0);
  CHECK(same.first_bad_index == -1);
  // ... the other infinity is not ...
  ranks[1].final_params[0].values[0] = -inf;
  CHECK(train::compare(ref, ranks, 1e-5).final_params.max_abs == inf);
  // ... and a NaN is not even equal to a NaN.
  ranks[1].final_params[0].values[0] = inf;
  ref.final_params[0].values[1] = std::nan("");
  ranks[0].final_params[0].values[1] = std::nan("");
  CHECK(train::compare(ref, ranks, 1e-5).final_params.max_abs == inf);
  ref.losses[0][1] = std::nan("");
  ranks[0].losses[1] = std::nan("");
  CHECK(train::compare(ref, ranks, 1e-5).first_bad_index == 1);
}

TEST_CASE("diagnose: replicas that start different point at the broadcast") {
  RunConfig c = small_config(2);
  c.per_rank_seed = true;
  const ReferenceResult ref = train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  ranks[1].initial_params[2].values[0] += 0.5;
  const std::string report = joined(train::diagnose(c, ref, ranks, 1e-5));
  CHECK(report.find("rank 1's parameters differ from rank 0's (fc2.weight)") != std::string::npos);
  CHECK(report.find("broadcast every parameter (and buffer) from rank 0") != std::string::npos);
}

TEST_CASE("diagnose: buffers that are not what the plan says point at the buffer broadcast") {
  RunConfig c = small_config(2);
  c.per_rank_seed = true;
  c.model_kind = train::ModelKind::Buffered;
  const ReferenceResult ref = train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  ranks[1].initial_buffers[0].values[3] += 0.25;
  std::string report = joined(train::diagnose(c, ref, ranks, 1e-5));
  CHECK(report.find("rank 1's buffers (norm.running_mean) are not rank 0's") != std::string::npos);
  ranks = perfect_ranks(c, ref);
  ranks[0].final_buffers[0].values[0] += 0.25;
  report = joined(train::diagnose(c, ref, ranks, 1e-5));
  CHECK(report.find("final buffers: rank 0, norm.running_mean") != std::string::npos);
}

TEST_CASE("diagnose: an update W times too large asks whether the sum is divided") {
  const RunConfig c = small_config(4);
  const ReferenceResult ref = train::train_reference(c);
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
  const std::string report = joined(train::diagnose(c, ref, ranks, 1e-5));
  CHECK(report.find("is the sum divided by the world size?") != std::string::npos);
}

TEST_CASE("diagnose: one parameter split between ranks is named, in the stage's words") {
  const RunConfig c = small_config(2);
  const ReferenceResult ref = train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  ranks[1].after_first_step[5].values[0] += 1e-3;  // fc3.bias
  train::Advice advice;
  advice.where_sync = "by the bucket hooks";
  const std::string report = joined(train::diagnose(c, ref, ranks, 1e-5, advice));
  CHECK(report.find("only fc3.bias disagrees between ranks") != std::string::npos);
  CHECK(report.find("all-reduced by the bucket hooks, or skipped?") != std::string::npos);
}

TEST_CASE("diagnose: a wrong loss at step 0 with equal parameters points at the forward pass") {
  const RunConfig c = small_config(2);
  const ReferenceResult ref = train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  ranks[1].losses[0] *= 1.01;
  const std::string report = joined(train::diagnose(c, ref, ranks, 1e-5));
  CHECK(report.find("step 0, rank 1: loss") != std::string::npos);
  CHECK(report.find("this rank's own shard") != std::string::npos);
}

TEST_CASE("diagnose: a drift that starts after step 0 names the first bad step") {
  RunConfig c = small_config(2);
  c.micro_batches = 2;
  const ReferenceResult ref = train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  ranks[0].losses[5] += 0.01;  // step 2, its second micro-batch
  const std::string report = joined(train::diagnose(c, ref, ranks, 1e-5));
  CHECK(report.find("first differ at step 2") != std::string::npos);
  CHECK(report.find("(micro-batch 5)") != std::string::npos);
}

TEST_CASE("diagnose: a missing rank or micro-batch is reported before any numbers") {
  const RunConfig c = small_config(3);
  const ReferenceResult ref = train::train_reference(c);
  auto ranks = perfect_ranks(c, ref);
  ranks.pop_back();
  CHECK(joined(train::diagnose(c, ref, ranks, 1e-5)).find("2 ranks reported results; expected 3") !=
        std::string::npos);
  ranks = perfect_ranks(c, ref);
  ranks[1].losses.pop_back();
  CHECK(joined(train::check_results_complete(c, ref, ranks))
            .find("rank 1 reported 2 micro-batch losses; its plan has 3") != std::string::npos);
  ranks = perfect_ranks(c, ref);
  ranks[2].final_params[0].values.clear();
  CHECK(joined(train::diagnose(c, ref, ranks, 1e-5))
            .find("rank 2 reported 0 values for parameter fc1.weight of shape (32, 16)") !=
        std::string::npos);
  ranks = perfect_ranks(c, ref);
  ranks[0].after_first_step.clear();
  CHECK(joined(train::diagnose(c, ref, ranks, 1e-5)).find("rank 0 lists 0 parameters") !=
        std::string::npos);
  ranks = perfect_ranks(c, ref);
  ranks[1].allreduces_per_micro.pop_back();
  CHECK(joined(train::diagnose(c, ref, ranks, 1e-5))
            .find("rank 1 counted collectives for 2 micro-batches; its plan has 3") !=
        std::string::npos);
}

// ---- counted collectives -------------------------------------------------------------

TEST_CASE("count predicates name the rank, the step and the micro-batch") {
  Run run = order_run({});
  run.config.world_size = 2;
  run.config.steps = 2;
  run.config.micro_batches = 2;
  for (int r = 0; r < 2; ++r) {
    RankResult rr;
    rr.rank = r;
    rr.allreduces_per_micro = {0, 6, 0, 6};
    rr.broadcasts_per_micro = {0, 0, 0, 0};
    run.ranks.push_back(rr);
  }
  CHECK(train::check_allreduces_per_step(run.view(), 6, "one per parameter", "c").empty());
  CHECK(train::check_quiet_until_last_micro_batch(run.view(), "c").empty());
  run.ranks[1].allreduces_per_micro = {6, 6, 0, 6};  // synced inside the accumulation too
  CHECK(joined(train::check_quiet_until_last_micro_batch(run.view(), "no_sync leaked"))
            .find("rank 1, step 0 (micro-batch 0): counted 6 all-reduces and 0 broadcasts in a micro-batch that "
                  "only accumulates") != std::string::npos);
  CHECK(joined(train::check_allreduces_per_step(run.view(), 6, "one per parameter", "c"))
            .find("rank 1, step 0: counted 12 all-reduces; expected 6 (one per parameter)") !=
        std::string::npos);
  CHECK(joined(train::check_counts_per_micro(
                   run.view(), train::Collective::AllReduce,
                   [](int64_t, int64_t micro) { return micro == 1 ? 6u : 0u; }, "rule", "c"))
            .find("rank 1, step 0 (micro-batch 0): counted 6 all-reduces; expected 0 (rule)") !=
        std::string::npos);
}

TEST_CASE("the bucket rule: reverse order, caps in MiB, a bucket overshoots by its last tensor") {
  // Parameters of 4, 2, 3 and 1 float32 elements: 16, 8, 12 and 4 bytes.
  train::Snapshot params = {{"a", {4}, std::vector<double>(4)}, {"b", {2}, std::vector<double>(2)},
                            {"c", {3}, std::vector<double>(3)}, {"d", {1}, std::vector<double>(1)}};
  const double mib = 1.0 / (1024 * 1024);  // one byte, in MiB
  // First bucket capped at 10 bytes: d (4) + c (12) = 16 >= 10 closes it;
  // then b (8) + a (16) = 24 >= 20 closes the second.
  CHECK(train::expected_buckets(params, 20 * mib, 10 * mib) ==
        std::vector<std::vector<int64_t>>{{3, 2}, {1, 0}});
  // One large cap: one bucket, in reverse order.
  CHECK(train::expected_buckets(params, 25, 25) ==
        std::vector<std::vector<int64_t>>{{3, 2, 1, 0}});
  // A tiny cap: one bucket per parameter.
  CHECK(train::expected_buckets(params, mib, mib) ==
        std::vector<std::vector<int64_t>>{{3}, {2}, {1}, {0}});
}

TEST_CASE("the bucket rule with two dtypes: an open bucket and a first cap per dtype") {
  // Registration order e, d, c, b, a: walked a, b, c, d, e. The same tensors
  // given to PyTorch 1.13's dist._compute_bucket_assignment_by_size with caps
  // [100, 1000] bytes and tensor_indices [0..4] (a rebuild: no sorting) give
  // [[1], [0, 2], [3], [4]] in walk positions: b, then a + c, then the two
  // left open, d and e, in an order PyTorch leaves unspecified (it iterates
  // an unordered_map); the kit closes float32's first.
  const double mib = 1.0 / (1024 * 1024);
  train::Snapshot params = {
      {"e", {16}, std::vector<double>(16), tp::kFloat32},   // 64 B
      {"d", {64}, std::vector<double>(64), tp::kFloat64},   // 512 B
      {"c", {32}, std::vector<double>(32), tp::kFloat32},   // 128 B
      {"b", {128}, std::vector<double>(128), tp::kFloat64}, // 1024 B
      {"a", {4}, std::vector<double>(4), tp::kFloat32}};    // 16 B
  // a opens float32's bucket; b closes float64's first (1024 >= 100); c
  // closes float32's first (144 >= 100: its own first cap, not 1000); d and
  // e stay open under 1000 and close at the end, float32's first.
  CHECK(train::expected_buckets(params, 1000 * mib, 100 * mib) ==
        std::vector<std::vector<int64_t>>{{3}, {4, 2}, {0}, {1}});
  CHECK(train::bucket_bytes(params, {{3}, {4, 2}, {0}, {1}}) == std::vector<int64_t>{1024, 144, 64, 512});
}

// ---- order on the trace -------------------------------------------------------------

TEST_CASE("the order check accepts all-reduces between backward and the optimizer step") {
  RankResult r;
  r.losses = {0.5};
  r.allreduces_per_micro = {2};
  r.events = {span("step", 1, 16, 0), span("backward", 2, 3), queued(1, 4), allreduce(1, 5, 6),
              queued(2, 7), allreduce(2, 8, 9), waited(1, 10, 11), waited(2, 12, 13),
              span("optimizer", 14, 15)};
  CHECK(train::check_sync_between_backward_and_step(order_run({r}).view(), {}).empty());
}

TEST_CASE("the order check flags an all-reduce nobody waited for, even one done in time") {
  // Both all-reduces ran before the optimizer step, but only #1 was waited
  // for: #2 being done was luck, so the verdict must not depend on it.
  RankResult r;
  r.losses = {0.5};
  r.allreduces_per_micro = {2};
  r.events = {span("step", 1, 14, 0), span("backward", 2, 3), queued(1, 4), allreduce(1, 5, 6),
              queued(2, 7), allreduce(2, 8, 9), waited(1, 10, 11), span("optimizer", 12, 13)};
  CHECK(joined(train::check_sync_between_backward_and_step(order_run({r}).view(), {}))
            .find("rank 0, step 0: all-reduce #2 happened to be done in time on this run, but as "
                  "far as the program knew it was still running when the optimizer step began: "
                  "nothing waited for it") != std::string::npos);
}

TEST_CASE("the order check refuses to pass a run without a trace") {
  RankResult r;
  r.losses = {0.5, 0.4};
  CHECK(joined(train::check_sync_between_backward_and_step(order_run({r}).view(), {}))
            .find("the trace shows 0 training steps, the run had 2") != std::string::npos);
  r.losses = {0.5};
  r.allreduces_per_micro = {2};
  r.events = {span("step", 1, 10, 0), span("backward", 2, 3), queued(1, 4), allreduce(1, 5, 6),
              span("optimizer", 8, 9)};
  CHECK(joined(train::check_sync_between_backward_and_step(order_run({r}).view(), {}))
            .find("2 all-reduces were counted but the trace shows 1 queued") != std::string::npos);
}

TEST_CASE("the order check flags an all-reduce that was issued but never ran") {
  RankResult r;
  r.losses = {0.5};
  r.allreduces_per_micro = {2};
  r.events = {span("step", 1, 12, 0), span("backward", 2, 3), queued(1, 4), allreduce(1, 5, 6),
              queued(2, 7), waited(1, 8, 9), span("optimizer", 10, 11)};
  CHECK(joined(train::check_sync_between_backward_and_step(order_run({r}).view(), {}))
            .find("all-reduce #2 was still running when the optimizer step began: nothing waited "
                  "for it") != std::string::npos);
}

TEST_CASE("the order check flags an all-reduce issued before backward ends") {
  Run run = order_run({});
  run.config.world_size = 4;
  run.config.steps = 1;
  for (int rank = 0; rank < 4; ++rank) {
    RankResult r;
    r.rank = rank;
    r.losses = {0.5};
    r.allreduces_per_micro = {1};
    const uint64_t issued = rank == 3 ? 3 : 6;  // rank 3 issues inside backward [2, 5]
    r.events = {span("step", 1, 14, 0), span("backward", 2, 5), queued(1, issued),
                allreduce(1, 7, 8), waited(1, 9, 10), span("optimizer", 11, 12)};
    run.ranks.push_back(r);
  }
  CHECK(joined(train::check_sync_between_backward_and_step(run.view(), {}))
            .find("rank 3, step 0: an all-reduce was issued before backward finished") != std::string::npos);
}

TEST_CASE("the order check flags an all-reduce still running when the optimizer starts") {
  RankResult r;
  r.losses = {0.5, 0.4};
  r.allreduces_per_micro = {0, 1};
  r.events = {span("step", 1, 20, 0), span("backward", 2, 3), span("optimizer", 8, 9),
              span("step", 21, 30, 1), span("backward", 22, 23), queued(1, 24),
              allreduce(1, 25, 28), span("optimizer", 26, 27)};
  CHECK(joined(train::check_sync_between_backward_and_step(order_run({r}).view(), {}))
            .find("step 1: all-reduce #1 was still running when the optimizer step began: "
                  "nothing waited for it") != std::string::npos);
}

TEST_CASE("the order checks pair each all-reduce with its step, even when it runs after the step") {
  // Never waited for: all-reduce #1 is queued in step 0 and runs in step 1.
  RankResult r;
  r.losses = {0.5, 0.4};
  r.allreduces_per_micro = {1, 0};
  r.events = {span("step", 1, 10, 0), span("backward", 2, 3), queued(1, 4),
              span("optimizer", 5, 6), span("step", 11, 20, 1), allreduce(1, 12, 13),
              span("backward", 14, 15), span("optimizer", 16, 17)};
  CHECK(joined(train::check_sync_between_backward_and_step(order_run({r}).view(), {}))
            .find("rank 0, step 0: all-reduce #1 was still running when the optimizer step "
                  "began") != std::string::npos);
}

namespace {

// One overlapped step: two gradients ready at 3 and 6, the graph done at 8.
// `first` and `second` are when the two all-reduces are queued.
RankResult overlap_step(uint64_t first, uint64_t second) {
  RankResult r;
  r.losses = {0.5};
  r.allreduces_per_micro = {2};
  r.events = {span("step", 1, 30, 0),  span("backward", 2, 20),  instant("grad ready", 3),
              queued(1, first),        instant("grad ready", 6), queued(2, second),
              instant("graph done", 8), span("callbacks", 9, 12), allreduce(1, 21, 22),
              allreduce(2, 23, 24),    waited(1, 25, 26),        waited(2, 27, 28),
              span("optimizer", 29, 30)};
  std::sort(r.events.begin(), r.events.end(),
            [](const auto& a, const auto& b) { return a.begin_order < b.begin_order; });
  return r;
}

}  // namespace

TEST_CASE("the overlap check accepts all-reduces launched from hooks while backward runs") {
  // #1 from the first gradient's hook (4), #2 from the last one's (7).
  CHECK(train::check_overlap(order_run({overlap_step(4, 7)}).view(), {}, "launch", "wait").empty());
}

TEST_CASE("the overlap check refuses all-reduces launched from the end-of-backward callback") {
  CHECK(joined(train::check_overlap(order_run({overlap_step(10, 11)}).view(), {},
                                    "launch from hooks", "wait"))
            .find("rank 0, step 0: 2 of 2 all-reduces were launched after the autograd graph "
                  "had finished") != std::string::npos);
}

TEST_CASE("the overlap check refuses all-reduces all launched from the last gradient's hook") {
  CHECK(joined(train::check_overlap(order_run({overlap_step(7, 7)}).view(), {}, "launch", "wait"))
            .find("all 2 all-reduces were launched only after the last gradient of the backward "
                  "was ready") != std::string::npos);
}

// ---- the overlap check against two real DDPs ------------------------------------------
namespace {

// Three minimal DDPs that sync inside backward and compute the same numbers.
// EachHook launches each gradient's all-reduce from its own hook, while
// backward still runs; LastHook waits for the last gradient's hook and
// launches them all there; Callback only notes the gradients in the hooks
// and launches every all-reduce from the end-of-backward callback. Only
// EachHook overlaps.
enum class Launch { EachHook, LastHook, Callback };

template <Launch kLaunch>
class HookDDP {
 public:
  struct Options {};
  static constexpr train::Capabilities capabilities{.syncs_in_backward = true};

  HookDDP(std::shared_ptr<tp::nn::Module> module,
          std::shared_ptr<tp::distributed::ProcessGroup> group, Options)
      : module_(std::move(module)), group_(std::move(group)) {
    tp::NoGradGuard no_grad;
    for (const tp::Tensor& p : module_->parameters()) group_->broadcast(p, 0)->wait();
    for (const tp::Tensor& p : module_->parameters()) {
      handles_.push_back(p.register_post_accumulate_grad_hook([this](const tp::Tensor& param) {
        if (!callback_queued_) {
          callback_queued_ = true;
          tp::autograd::queue_callback([this] { finish(); });
        }
        pending_.push_back({param.grad(), nullptr});
        if (kLaunch == Launch::EachHook) pending_.back().second = group_->allreduce(param.grad());
        if (kLaunch == Launch::LastHook && pending_.size() == module_->parameters().size()) {
          for (auto& [grad, work] : pending_) work = group_->allreduce(grad);
        }
      }));
    }
  }
  HookDDP(const HookDDP&) = delete;
  HookDDP& operator=(const HookDDP&) = delete;

  tp::Tensor operator()(const tp::Tensor& x) { return module_->forward(x); }
  std::vector<tp::Tensor> parameters() const { return module_->parameters(); }
  std::vector<tp::nn::NamedTensor> named_parameters() const { return module_->named_parameters(); }

 private:
  void finish() {
    for (auto& [grad, work] : pending_) {
      if (!work) work = group_->allreduce(grad);  // Callback: launched only now
    }
    for (auto& [grad, work] : pending_) {
      work->wait();
      grad.div_(group_->size());
    }
    pending_.clear();
    callback_queued_ = false;
  }

  std::shared_ptr<tp::nn::Module> module_;
  std::shared_ptr<tp::distributed::ProcessGroup> group_;
  std::vector<tp::RemovableHandle> handles_;  // remove the hooks with this DDP
  std::vector<std::pair<tp::Tensor, std::shared_ptr<tp::distributed::Work>>> pending_;
  bool callback_queued_ = false;
};

std::vector<train::Finding> overlap_findings_of_real_run(Run& run) {
  run.config.world_size = 2;
  run.config.steps = 2;
  run.config.trace = true;
  run.reference = train::train_reference(run.config);
  // One "bucket" per parameter, in reverse registration order: MiniMLP's
  // gradients become ready in exactly that order.
  return train::check_overlap(run.view(), {{5}, {4}, {3}, {2}, {1}, {0}}, "launch from hooks",
                              "wait in the callback");
}

}  // namespace

TEST_CASE("the overlap check holds each bucket to its deadline, given the buckets") {
  // Three parameters, one bucket each, ready in bucket order (marks 3, 5, 7
  // carry tensor ids 30, 20, 10 = parameters 2, 1, 0); the graph is done at 9.
  auto ready = [](uint64_t at, int64_t id) {
    tp::trace::Event e = instant("grad ready", at);
    e.args.push_back({"tensor", id});
    return e;
  };
  auto step = [&](uint64_t q1, uint64_t q2, uint64_t q3) {
    RankResult r;
    r.losses = {0.5};
    r.allreduces_per_micro = {3};
    r.param_ids = {10, 20, 30};
    r.events = {span("step", 1, 50, 0), span("backward", 2, 30), ready(3, 30), ready(5, 20),
                ready(7, 10),          instant("graph done", 9), queued(1, q1), queued(2, q2),
                queued(3, q3),         allreduce(1, 31, 32), allreduce(2, 33, 34),
                allreduce(3, 35, 36),  waited(1, 37, 38),    waited(2, 39, 40),
                waited(3, 41, 42),     span("optimizer", 43, 44)};
    std::sort(r.events.begin(), r.events.end(),
              [](const auto& a, const auto& b) { return a.begin_order < b.begin_order; });
    return order_run({r});
  };
  const std::vector<std::vector<int64_t>> buckets = {{2}, {1}, {0}};
  // Each launched right after its gradient: 4, 6, 8.
  CHECK(train::check_overlap(step(4, 6, 8).view(), buckets, "launch", "wait").empty());
  // Bucket 0 early, the others held to the end (after mark 7): bucket 1 missed its deadline.
  CHECK(joined(train::check_overlap(step(4, 8, 8).view(), buckets, "launch", "wait"))
            .find("bucket 1's all-reduce was complete at gradient 2 of 3 but launched only after "
                  "gradient 3 was computed") != std::string::npos);
}

TEST_CASE("the overlap check tells a DDP that overlaps from two that only look like they do") {
  Run eager;
  eager.config.world_size = 2;
  eager.config.steps = 2;
  eager.config.trace = true;
  eager.ranks = train::run_ddp<HookDDP<Launch::EachHook>>(eager.config);
  CHECK(overlap_findings_of_real_run(eager).empty());
  CHECK(train::diagnose(eager.config, eager.reference, eager.ranks, 1e-5).empty());

  // Same numbers: only the trace tells them apart.
  Run callback;
  callback.config = eager.config;
  callback.ranks = train::run_ddp<HookDDP<Launch::Callback>>(callback.config);
  CHECK(train::diagnose(callback.config, train::train_reference(callback.config), callback.ranks,
                        1e-5).empty());
  CHECK(joined(overlap_findings_of_real_run(callback))
            .find("6 of 6 all-reduces were launched after the autograd graph had finished") !=
        std::string::npos);

  Run last_hook;
  last_hook.config = eager.config;
  last_hook.ranks = train::run_ddp<HookDDP<Launch::LastHook>>(last_hook.config);
  CHECK(train::diagnose(last_hook.config, train::train_reference(last_hook.config),
                        last_hook.ranks, 1e-5).empty());
  CHECK(joined(overlap_findings_of_real_run(last_hook))
            .find("bucket 0's all-reduce was complete at gradient 1 of 6 but launched only after "
                  "gradient 2 was computed") != std::string::npos);
}

namespace {

// HookDDP with the cuda capability: the device check lets it through.
struct CudaHookDDP : HookDDP<Launch::EachHook> {
  using HookDDP::HookDDP;
  static constexpr train::Capabilities capabilities{.syncs_in_backward = true, .cuda = true};
};

}  // namespace

TEST_CASE("a stage without the cuda capability refuses device cuda, on any machine, before any rank") {
  RunConfig cuda_plan = small_config(2);
  cuda_plan.device = tp::Device{tp::DeviceType::CUDA, -1};
  const char* cpu_only = "tp::train: this stage runs on the CPU only (it does not declare "
                               "the cuda capability), so it cannot train on device cuda; stage 03 "
                               "is the stage that runs on CUDA";
  // Spawned, and launched: refused before the rendezvous (env:// with no
  // MASTER_ADDR would fail otherwise, with another message).
  CHECK_THROWS_WITH_AS(train::run_ddp<HookDDP<Launch::EachHook>>(cuda_plan), Contains(cpu_only),
                       tp::Error);
  CHECK_THROWS_WITH_AS(train::run_launched_rank<HookDDP<Launch::EachHook>>(cuda_plan, {}, "env://"),
                       Contains(cpu_only), tp::Error);
  CHECK_NOTHROW(train::check_device_fits_stage<HookDDP<Launch::EachHook>>(tp::kCPU));
  // A stage that declares cuda passes this check (whether this machine has
  // a GPU is validate()'s question, asked next).
  CHECK_NOTHROW(train::check_device_fits_stage<CudaHookDDP>(cuda_plan.device));
}

TEST_CASE("launches before the first wait: back to back passes, one at a time is flagged") {
  auto wait = [](int64_t seq, uint64_t begin, uint64_t end) {
    tp::trace::Event e = span("wait", begin, end);
    e.args.push_back({"seq", seq});
    return e;
  };
  RankResult r;
  r.losses = {0.5};
  r.allreduces_per_micro = {2};
  r.events = {span("step", 1, 20, 0), span("backward", 2, 3), queued(1, 4), queued(2, 5),
              wait(1, 6, 9), allreduce(1, 7, 8), wait(2, 10, 13), allreduce(2, 11, 12),
              span("optimizer", 14, 15)};
  CHECK(train::check_launched_before_first_wait(order_run({r}).view(), "c").empty());
  r.events = {span("step", 1, 20, 0), span("backward", 2, 3), queued(1, 4), wait(1, 5, 8),
              allreduce(1, 6, 7), queued(2, 9), wait(2, 10, 13), allreduce(2, 11, 12),
              span("optimizer", 14, 15)};
  CHECK(joined(train::check_launched_before_first_wait(order_run({r}).view(), "launch all first"))
            .find("rank 0, step 0: 1 of 2 all-reduces were launched only after waiting for "
                  "all-reduce #1") != std::string::npos);
}

TEST_CASE("gradient storage: views of one bucket share it, separate gradients do not") {
  const RunConfig c = small_config(1);
  const ReferenceResult ref = train::train_reference(c);
  Run run;
  run.config = c;
  run.reference = ref;
  RankResult r;
  r.grad_storage = {1, 1, 1, 2, 2, 2};  // buckets {5, 4, 3} and {2, 1, 0}, as views
  run.ranks = {r};
  const std::vector<std::vector<int64_t>> buckets = {{5, 4, 3}, {2, 1, 0}};
  CHECK(train::check_grad_storage(run.view(), buckets, true, "c").empty());
  CHECK(joined(train::check_grad_storage(run.view(), buckets, false, "own"))
            .find("share one storage (without gradient_as_bucket_view each gradient is its own)") !=
        std::string::npos);
  run.ranks[0].grad_storage = {1, 2, 3, 4, 5, 6};
  CHECK(train::check_grad_storage(run.view(), buckets, false, "c").empty());
  CHECK(joined(train::check_grad_storage(run.view(), buckets, true, "view"))
            .find("live in different storages although they are in the same bucket") !=
        std::string::npos);
  // The real thing: separate tensors get separate numbers, views of one share.
  const tp::Tensor flat = tp::zeros({4});
  tp::Tensor a = tp::zeros({2}).requires_grad_(), b = tp::zeros({2}).requires_grad_();
  a.set_grad(flat.narrow(0, 0, 2));
  b.set_grad(flat.narrow(0, 2, 2));
  tp::Tensor own = tp::zeros({2}).requires_grad_();
  own.set_grad(tp::ones({2}));
  CHECK(train::grad_storage_groups({a, b, own, tp::zeros({1}).requires_grad_()}) ==
        std::vector<int64_t>{1, 1, 2, 0});
}

// ---- the likely cause of a hang follows from where the ranks were (issue 25, item 9) ----

namespace {

// Runs `job`, which must end in a SpawnError, and returns the checker's finding.
template <typename Job>
train::Finding finding_of(Job job) {
  try {
    job();
  } catch (const tp::multiprocessing::SpawnError& e) {
    return train::finding_from_error("08", e);
  }
  FAIL("the job did not fail");
  return {};
}

[[noreturn]] void spin_forever() {
  volatile uint64_t turns = 0;  // volatile: the loop is not optimised away
  for (;;) turns = turns + 1;
}

}  // namespace

TEST_CASE("a job whose every rank spins outside collectives is not blamed on a collective wait") {
  namespace mp = tp::multiprocessing;
  mp::SpawnOptions options;
  options.timeout = std::chrono::milliseconds(500);  // nothing here makes progress
  options.kill_grace = std::chrono::milliseconds(200);
  const train::Finding f = finding_of([&] { mp::spawn(options, [](int) { spin_forever(); }, 2); });
  CHECK(f.what.find("No rank was in a collective") != std::string::npos);
  CHECK(f.likely_cause.find("collective that another rank never issued") == std::string::npos);
  CHECK(f.likely_cause ==
        "no rank was in a collective, so none was waiting for another: every rank was busy "
        "outside collectives, in a loop that never ends (in a comm hook, or elsewhere in the "
        "step), or waiting on something other than its peers");
}

TEST_CASE("a case's own likely cause is shown for a rank's own error, and only for that") {
  namespace mp = tp::multiprocessing;
  const std::string mine = "this case's graph never changes";
  mp::SpawnOptions options;
  options.kill_grace = std::chrono::milliseconds(200);
  SUBCASE("a rank throws an error of its own: the case's cause") {
    try {
      mp::spawn(options, [](int rank) {
        if (rank == 1) TP_THROW(tp::DistributedError, "stage06 DDP: static_graph: the graph changed");
      }, 2);
      FAIL("the job did not fail");
    } catch (const mp::SpawnError& e) {
      const train::Finding f = train::finding_from_error("06", e, mine);
      CHECK(f.what.find("the graph changed") != std::string::npos);
      CHECK(f.likely_cause == mine);
      // Without one, the general cause.
      CHECK(train::finding_from_error("06", e).likely_cause ==
            "a rank failed: its message above says why and what to change");
    }
  }
  SUBCASE("a stub, a timeout, a crash: their own causes, whatever the case says") {
    const auto cause_of = [&](auto job) {
      try {
        mp::spawn(options, job, 2);
      } catch (const mp::SpawnError& e) {
        return train::finding_from_error("06", e, mine).likely_cause;
      }
      FAIL("the job did not fail");
      return std::string();
    };
    CHECK(cause_of([](int rank) {
            if (rank == 1) TP_THROW(tp::NotImplemented, "stage 06: forward is not implemented yet");
          }).find("exercise stub") != std::string::npos);
    CHECK(cause_of([](int rank) {
            if (rank == 1) std::abort();
          }).find("crashed") != std::string::npos);
    options.timeout = std::chrono::milliseconds(500);
    CHECK(cause_of([](int) { spin_forever(); }).find("no rank was in a collective") !=
          std::string::npos);
  }
}

TEST_CASE("a rank waiting in a collective that another rank never issued is still named so") {
  namespace mp = tp::multiprocessing;
  namespace dist = tp::distributed;
  const std::string waits = "a rank waits in a collective that another rank never issued";
  SUBCASE("the collective times out on the rank that waits") {
    tp::TempDir dir("tp-never-issued");
    mp::SpawnOptions options;
    options.kill_grace = std::chrono::milliseconds(200);
    const train::Finding f = finding_of([&] {
      mp::spawn(
          options,
          [&](int rank) {
            dist::ProcessGroupGloo group(dir.path(), rank, 2,
                                         dist::GlooOptions{std::chrono::milliseconds(1500)});
            if (rank == 1) spin_forever();  // never issues the all-reduce
            group.allreduce(tp::ones({3}))->wait();
          },
          2);
    });
    CHECK(f.what.find("tp::TimeoutError: allreduce #1 on rank 0 timed out") != std::string::npos);
    CHECK(f.likely_cause.find(waits) == 0);
  }
  SUBCASE("the job stops making progress with one rank in a collective") {
    mp::SpawnOptions options;
    options.timeout = std::chrono::milliseconds(500);
    options.kill_grace = std::chrono::milliseconds(200);
    const train::Finding f = finding_of([&] {
      mp::spawn(
          options,
          [](int rank) {
            if (rank == 0) mp::set_rank_waiting("allreduce #1");  // as Work::wait says
            spin_forever();
          },
          2);
    });
    CHECK(f.what.find("rank 0 (waiting in allreduce #1)") != std::string::npos);
    CHECK(f.likely_cause.find(waits) == 0);
  }
}

TEST_CASE("a checker's table of checks returns the first that finds something, and runs no later one") {
  using tp::train::Finding;
  int ran = 0;
  const auto none = [&] { ++ran; return std::vector<Finding>{}; };
  const auto found = [&](const char* what) {
    return [&ran, what] { ++ran; return std::vector<Finding>{{what, "cause"}}; };
  };
  CHECK(tp::train::first_findings({none, none}).empty());
  CHECK(ran == 2);
  ran = 0;
  const std::vector<Finding> out =
      tp::train::first_findings({none, found("second"), found("third")});
  REQUIRE(out.size() == 1);
  CHECK(out[0].what == "second");
  CHECK(ran == 2);  // the third check never ran
}
