// Checker for stage 07 (DDP with join() for uneven inputs). Compiled once
// and linked with every ddp.cc: solutions/07-join (must pass), the generated
// exercise (must fail at once, naming the stub), each planted-bug mutant in
// tests/mutants/07-join (must fail with the diagnosis the mutant names), and
// your exercises/07-join (`./kit check 07`).
// TP_STAGE_HEADER is set only for a planted bug that patches the header: its
// copy of stage.h, which includes the patched ddp.h.
#ifdef TP_STAGE_HEADER
#include TP_STAGE_HEADER
#else
#include "stage.h"
#endif

#include <cmath>
#include <memory>
#include <string>

#include "join_scenarios.h"
#include "no_sync_scenarios.h"
#include "scenario_models.h"
#include "static_graph_cause.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/data.h"
#include "tensorplay/error.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"
#include "tensorplay/train/checker.h"

namespace {

namespace train = tp::train;
using DDP = stage07::DistributedDataParallel;
using Options = stage07::Options;
using Case = train::CheckCase<Options>;
using Group = std::shared_ptr<tp::distributed::ProcessGroup>;
using tp::detail::cat;

// MiniMLP float32, reverse registration order: 16, 512 | 128, 4096 | 128,
// 2048 bytes.
const Options kSeveral{.bucket_cap_mb = 2000.0 / (1 << 20), .first_bucket_cap_mb = 500.0 / (1 << 20)};
const Options kPerParameter{.bucket_cap_mb = 1e-9, .first_bucket_cap_mb = 1e-9};

// The plan's divisor and the DDP's option must agree.
Case uneven_case(train::RunConfig config, std::vector<int64_t> counts, Options options,
                 bool divide_by_active, const std::string& label) {
  config.world_size = static_cast<int>(counts.size());
  config.batches_per_rank = std::move(counts);
  config.divisor = divide_by_active ? train::Divisor::ActiveRanks : train::Divisor::InitialWorldSize;
  options.divide_by_initial_world_size = !divide_by_active;
  return {config, options, label};
}

std::vector<Case> cases() {
  train::RunConfig base;
  base.per_rank_seed = true;
  std::vector<Case> out;
  out.push_back(uneven_case(base, {6, 2}, kSeveral, false, "rank 1 joins after 2 steps"));
  out.push_back(uneven_case(base, {6, 2}, kSeveral, true,
                            "rank 1 joins after 2 steps, divide by the active ranks"));
  out.push_back(uneven_case(base, {2, 6, 4}, kSeveral, false, "three counts, rank 0 first"));
  out.push_back(uneven_case(base, {2, 6, 4}, kSeveral, true,
                            "three counts, divide by the active ranks"));
  out.push_back(uneven_case(base, {4, 0, 6, 2}, kSeveral, false,
                            "four ranks, rank 1 with no batch at all"));
  out.push_back(uneven_case(base, {0, 4, 2}, kPerParameter, true,
                            "rank 0 with no batch, a bucket per parameter, divide by active"));
  train::RunConfig f64 = base;
  f64.dtype = tp::kFloat64;
  f64.momentum = 0.9;
  out.push_back(uneven_case(f64, {3, 5, 5}, kSeveral, false,
                            "float64, momentum, the last two join together"));
  out.push_back(uneven_case(base, {4, 4}, kSeveral, false, "even inputs inside join()"));
  train::RunConfig accumulate = base;
  accumulate.micro_batches = 2;
  Options view = kSeveral;
  view.gradient_as_bucket_view = true;
  out.push_back(uneven_case(accumulate, {4, 8, 2}, view, true,
                            "K = 2, gradient_as_bucket_view, divide by the active ranks"));
  train::RunConfig reordered = base;
  reordered.model_kind = train::ModelKind::Reordered;
  Options fixed = kPerParameter;
  fixed.static_graph = true;
  out.push_back(uneven_case(reordered, {2, 5, 3}, fixed, false,
                            "reordered model, static_graph: buckets rebuilt while a rank shadows"));
  train::RunConfig branchy = base;
  branchy.model_kind = train::ModelKind::Branchy;
  Options unused = kSeveral;
  unused.find_unused_parameters = true;
  out.push_back(uneven_case(branchy, {5, 2, 4}, unused, false,
                            "branchy, find_unused_parameters: joined ranks shadow the used-map"));
  train::RunConfig buffered = base;
  buffered.model_kind = train::ModelKind::Buffered;
  out.push_back(uneven_case(buffered, {4, 2, 3}, kSeveral, false,
                            "buffered model: each rank keeps its own buffers to the end"));
  for (Case& c : out) c.config.trace = true;
  return out;
}

// Every rank ends with rank 0's buckets, a rank that joined included.
std::vector<train::Finding> check_buckets_agree(const train::CaseRun& run) {
  for (const train::RankResult& r : run.ranks) {
    if (r.buckets == run.ranks[0].buckets) continue;
    return {{cat("rank ", r.rank, "'s buckets differ from rank 0's after training"),
             "every rank rebuilds from rank 0's order, a rank that has joined too (it takes part "
             "in the broadcast while it shadows the first synced step)"}};
  }
  return {};
}

std::vector<train::Finding> stage_checks(const Case& c, const train::CaseRun& run) {
  const Options& o = c.options;
  const auto initial = train::expected_buckets(run, o.bucket_cap_mb, o.first_bucket_cap_mb);
  const int64_t k = c.config.micro_batches;
  const uint64_t buffers = o.broadcast_buffers ? run.num_buffers() : 0;
  const bool rebuilds = o.static_graph || !o.find_unused_parameters;
  // Per step of an active rank: one notify all-reduce, the buckets (the
  // construction's in step 0, the rebuilt ones' count after), the used-map
  // where the step has one.
  const size_t final_count = run.ranks[0].buckets.size();
  return train::first_findings({
      [&] {
        return train::check_construction_counts(
            run, run.num_params() + buffers, 0,
            "broadcast each parameter (and, with broadcast_buffers, each buffer) from rank 0 "
            "exactly once",
            /*allgathers=*/2);
      },
      [&] {
        return train::check_counts_per_micro(
            run, train::Collective::AllReduce,
            [&](int64_t step, int64_t micro) -> uint64_t {
              if (micro + 1 != k) return 0;
              const size_t buckets = step == 0 ? initial.size() : final_count;
              const bool used_map = o.static_graph ? step == 0 : o.find_unused_parameters;
              return 1 + buckets + (used_map ? 1 : 0);
            },
            "one to say the rank still trains, then one per bucket (and the used-map), in each "
            "synced step",
            "inside join(), every synced forward all-reduces one number first (the ranks still "
            "training), and the step's buckets follow (Note [Join])");
      },
      [&] {
        return train::check_counts_per_micro(
            run, train::Collective::Broadcast,
            [&](int64_t step, int64_t micro) {
              return rebuilds && step == 0 && micro + 1 == k ? 1 : 0;
            },
            rebuilds ? "one (rank 0's ready order) at the end of the first synced step, none after"
                     : "none after construction",
            "nothing is broadcast during training but the bucket rebuild's order (stage 06); the "
            "final model is broadcast after every rank has joined");
      },
      [&] { return check_buckets_agree(run); },
      [&] {
        return train::check_allreduce_sizes(
            run,
            [&](int64_t step) {
              std::vector<int64_t> bytes = train::bucket_bytes(
                  run.reference.final_params, step == 0 ? initial : run.ranks[0].buckets);
              bytes.push_back(4);  // the notify: one float32
              const bool used_map = o.static_graph ? step == 0 : o.find_unused_parameters;
              if (used_map) bytes.push_back(static_cast<int64_t>(run.num_params() * sizeof(float)));
              return bytes;
            },
            "the notify (4 bytes), the step's buckets' parameters and the used-map where the step "
            "has one",
            "all-reduce each bucket's flat tensor, which holds exactly its parameters' elements, "
            "besides the notify's one float and the used-map's one float per parameter");
      },
      [&] {
        return train::check_synced_when_backward_returns(
            run, "wait for every bucket in the end-of-backward callback");
      },
  });
}

// ---- scenarios --------------------------------------------------------------

train::Scenario early_termination() {
  return {"throw_on_early_termination, ranks with 3, 1 and 2 steps: every rank throws", 3,
          [](int rank, Group group) -> std::string {
            tp::manual_seed(0);
            Options options = kSeveral;
            options.throw_on_early_termination = true;
            DDP ddp(train::make_model({}), group, options);
            tp::optim::SGD sgd(ddp.parameters(), {.lr = 0.05});
            const tp::data::Batch batch = scenario_models::rows_of(rank);
            const int steps = rank == 0 ? 3 : rank == 1 ? 1 : 2;
            try {
              ddp.join([&] {
                for (int s = 0; s < steps; ++s) {
                  sgd.zero_grad();
                  tp::mse_loss(ddp(batch.x), batch.y).backward();
                  sgd.step();
                }
              });
            } catch (const tp::DistributedError& e) {
              const std::string what = e.what();
              if (what.find("throw_on_early_termination") == std::string::npos) {
                return cat("rank ", rank, ": the error does not name throw_on_early_termination: ",
                           what);
              }
              return "";
            }
            return cat("rank ", rank, ": join() returned although rank 1 ran out after one "
                                      "step and throw_on_early_termination is set");
          },
          "with throw_on_early_termination, the first synced step that counts fewer ranks than "
          "the world size throws on every rank: the active ranks in their notify, the joined "
          "one in join()'s loop (Note [Join])"};
}

// One training step of `ddp` on this rank's rows.
void train_step(DDP& ddp, tp::optim::SGD& sgd, int rank) {
  const tp::data::Batch batch = scenario_models::rows_of(rank);
  sgd.zero_grad();
  tp::mse_loss(ddp(batch.x), batch.y).backward();
  sgd.step();
}

train::Scenario even_inputs_do_not_throw() {
  return {"throw_on_early_termination with even inputs: nobody runs out early, nobody throws", 2,
          [](int rank, Group group) -> std::string {
            tp::manual_seed(0);
            Options options = kSeveral;
            options.throw_on_early_termination = true;
            DDP ddp(train::make_model({}), group, options);
            tp::optim::SGD sgd(ddp.parameters(), {.lr = 0.05});
            try {
              ddp.join([&] {
                for (int s = 0; s < 2; ++s) train_step(ddp, sgd, rank);
              });
            } catch (const tp::DistributedError& e) {
              return cat("rank ", rank, ": join() threw although every rank trained 2 steps: ",
                         e.what());
            }
            return "";
          },
          "every rank runs out at the same step: the round that counts 0 ranks training ends "
          "join() before throw_on_early_termination is considered (Note [Join])"};
}

train::Scenario join_twice_then_train() {
  return {"two join() epochs with uneven inputs, then training outside join(): it all pairs", 2,
          [](int rank, Group group) -> std::string {
            tp::manual_seed(0);
            Options options = kSeveral;
            options.divide_by_initial_world_size = false;
            DDP ddp(train::make_model({}), group, options);
            tp::optim::SGD sgd(ddp.parameters(), {.lr = 0.05});
            for (int epoch = 0; epoch < 2; ++epoch) {
              ddp.join([&] {
                for (int s = 0; s < (rank == 0 ? 3 : 1); ++s) train_step(ddp, sgd, rank);
              });
            }
            const uint64_t before = group->counters().allreduce;
            train_step(ddp, sgd, rank);  // outside join(): no notify, the buckets only
            const uint64_t n = group->counters().allreduce - before;
            if (n != ddp.bucket_assignment().size()) {
              return cat("rank ", rank, ": ", n, " all-reduces in a step outside join(); "
                         "expected ", ddp.bucket_assignment().size(), " (the buckets only)");
            }
            for (const tp::Tensor& p : ddp.parameters()) {
              if (!std::isfinite(p.sum().item())) {
                return cat("rank ", rank, ": a parameter is not finite after a step outside "
                                          "join() with divide_by_initial_world_size = false");
              }
            }
            return "";
          },
          "join() leaves the DDP as it found it (not joining: no notify in forward) on every "
          "path out; outside join() every rank trains, so both divisors are the world size"};
}

train::Scenario divisor_outside_join() {
  return {"outside join(), divide_by_initial_world_size = false averages over the world size",
          2,
          [](int rank, Group group) -> std::string {
            std::vector<tp::Tensor> grads[2];
            for (int option = 0; option < 2; ++option) {
              tp::manual_seed(0);
              Options options = kSeveral;
              options.divide_by_initial_world_size = option == 0;
              DDP ddp(train::make_model({}), group, options);
              const tp::data::Batch batch = scenario_models::rows_of(rank);
              tp::mse_loss(ddp(batch.x), batch.y).backward();
              for (const tp::Tensor& p : ddp.parameters()) grads[option].push_back(p.grad().clone());
            }
            for (size_t p = 0; p < grads[0].size(); ++p) {
              const double d = tp::max_abs_diff(grads[0][p], grads[1][p]);
              if (!(d <= 1e-6)) {
                return cat("rank ", rank, ": outside join(), the gradient of parameter ", p,
                           " differs by ", d, " between the two divide_by_initial_world_size "
                           "settings");
              }
            }
            return "";
          },
          "outside join() every rank trains, so the divisor is the world size whichever the "
          "option: divisor() may use the count of the last notify only inside join()"};
}

}  // namespace

int main(int argc, char** argv) {
  train::CheckerSpec<Options> spec;
  spec.stage = stage07::stage_spec();
  spec.cases = cases();
  static_graph_cause::blame_the_record(spec.cases);
  spec.stage_checks = stage_checks;
  spec.scenarios = no_sync_scenarios::all<DDP>(/*first_sync_extra=*/1);  // the rebuild's broadcast
  for (train::Scenario scenario : {early_termination(), even_inputs_do_not_throw(),
                                   divisor_outside_join(), join_twice_then_train(),
                                   join_scenarios::static_graph_after_joining_first<DDP>(kSeveral)}) {
    spec.scenarios.push_back(std::move(scenario));
  }
  return train::run_checker<DDP>(argc, argv, spec);
}
