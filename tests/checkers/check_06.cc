// Checker for stage 06 (DDP that rebuilds its buckets after the first
// iteration, and static_graph). Compiled once and linked with every ddp.cc:
// solutions/06-static-graph (must pass), the generated exercise (must fail
// at once, naming the stub), each planted-bug mutant in
// tests/mutants/06-static-graph (must fail with the diagnosis the mutant
// names), and your exercises/06-static-graph (`./kit check 06`).
// TP_STAGE_HEADER is set only for a planted bug that patches the header: its
// copy of stage.h, which includes the patched ddp.h.
#ifdef TP_STAGE_HEADER
#include TP_STAGE_HEADER
#else
#include "stage.h"
#endif

#include <algorithm>
#include <map>
#include <memory>
#include <string>

#include "no_sync_scenarios.h"
#include "scenario_models.h"
#include "static_graph_cause.h"
#include "tensorplay/data.h"
#include "tensorplay/error.h"
#include "tensorplay/nn/linear.h"
#include "tensorplay/nn/module.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"
#include "tensorplay/train/checker.h"

namespace {

namespace train = tp::train;
using DDP = stage06::DistributedDataParallel;
using Options = stage06::Options;
using Case = train::CheckCase<Options>;
using Group = std::shared_ptr<tp::distributed::ProcessGroup>;
using tp::detail::cat;

// MiniMLP float32, reverse registration order: 16, 512 | 128, 4096 | 128,
// 2048 bytes. ReorderedMLP registers fc2, fc1, fc3 but uses fc1, fc2, fc3, so
// its gradients become ready in another order than reverse registration.
const Options kSeveral{.bucket_cap_mb = 2000.0 / (1 << 20), .first_bucket_cap_mb = 500.0 / (1 << 20)};
const Options kPerParameter{.bucket_cap_mb = 1e-9, .first_bucket_cap_mb = 1e-9};

Options with(Options o, bool static_graph, bool find_unused = false, bool view = false) {
  o.static_graph = static_graph;
  o.find_unused_parameters = find_unused;
  o.gradient_as_bucket_view = view;
  return o;
}

std::vector<Case> cases() {
  std::vector<Case> out = train::cases_of(train::standard_configs(), kSeveral,
                                          "3 buckets, rebuilt after step 0");
  train::RunConfig small;
  small.world_size = 3;
  small.steps = 4;
  small.per_rank_seed = true;
  train::RunConfig reordered = small;
  reordered.model_kind = train::ModelKind::Reordered;
  out.push_back({reordered, kPerParameter,
                 "reordered model, a bucket per parameter: rebuilt in the ready order"});
  out.push_back({reordered, kSeveral, "reordered model, 3 buckets: rebuilt in the ready order"});
  out.push_back({reordered, with(kSeveral, true), "reordered model, static_graph"});
  train::RunConfig momentum = small;
  momentum.world_size = 2;
  momentum.momentum = 0.9;
  out.push_back({momentum, with(kPerParameter, true, false, true),
                 "static_graph, gradient_as_bucket_view, momentum"});
  train::RunConfig accumulate = small;
  accumulate.micro_batches = 2;
  accumulate.model_kind = train::ModelKind::Reordered;
  out.push_back({accumulate, with(kSeveral, true), "reordered model, static_graph, K = 2"});
  train::RunConfig deep = small;
  deep.model_kind = train::ModelKind::Deep;
  deep.deep_depth = 8;
  out.push_back({deep, with({.bucket_cap_mb = 8.0 / 1024, .first_bucket_cap_mb = 2.0 / 1024}, true),
                 "deep model, static_graph"});
  out.push_back({reordered, with(kSeveral, true, true),
                 "reordered model, static_graph and find_unused_parameters: rebuilt too"});
  train::RunConfig branchy = small;
  branchy.model_kind = train::ModelKind::Branchy;
  out.push_back({branchy, with(kSeveral, false, true),
                 "branchy, find_unused_parameters: no rebuild (the order may change)"});
  for (Case& c : out) c.config.trace = true;
  static_graph_cause::blame_the_record(out);
  return out;
}

bool rebuilds(const Options& o) { return o.static_graph || !o.find_unused_parameters; }

// Rank `r`'s filing order in its first synced backward, read from the trace:
// the parameters its forward did not reach first (filed at the first hook,
// ascending), then the engine's "grad ready" marks in order.
std::vector<int64_t> first_ready_order(const train::CaseRun& run, const train::RankResult& r) {
  const int64_t k = run.config.micro_batches;
  // The backward span of micro-batch k - 1 (step 0's last).
  const tp::trace::Event* backward = nullptr;
  for (const tp::trace::Event& e : r.events) {
    if (e.name != "backward" || e.phase != 'X') continue;
    if (train::arg_of(e, "micro") == k - 1) backward = &e;
  }
  std::vector<int64_t> order = r.unreached_per_micro.at(static_cast<size_t>(k - 1));
  if (backward == nullptr) return order;
  std::map<int64_t, int64_t> param_of_id;
  for (size_t p = 0; p < r.param_ids.size(); ++p) param_of_id[r.param_ids[p]] = static_cast<int64_t>(p);
  for (const tp::trace::Event& e : r.events) {
    if (e.name != "grad ready" || e.begin_order <= backward->begin_order ||
        e.begin_order >= backward->end_order) {
      continue;
    }
    const auto p = param_of_id.find(train::arg_of(e, "tensor"));
    if (p != param_of_id.end() &&
        std::find(order.begin(), order.end(), p->second) == order.end()) {
      order.push_back(p->second);
    }
  }
  return order;
}

// "graph walk" spans per step on rank `r`.
std::vector<int64_t> walks_per_step(const train::RankResult& r, int64_t steps) {
  std::vector<std::pair<uint64_t, uint64_t>> step_spans;  // begin, end order
  for (const tp::trace::Event& e : r.events) {
    if (e.name == "step" && e.phase == 'X') step_spans.push_back({e.begin_order, e.end_order});
  }
  std::sort(step_spans.begin(), step_spans.end());
  std::vector<int64_t> walks(static_cast<size_t>(steps), 0);
  for (const tp::trace::Event& e : r.events) {
    if (e.name != "graph walk") continue;
    for (size_t s = 0; s < step_spans.size() && s < walks.size(); ++s) {
      if (e.begin_order > step_spans[s].first && e.begin_order < step_spans[s].second) ++walks[s];
    }
  }
  return walks;
}

// With find_unused_parameters, one graph walk per synced forward; with
// static_graph, one in the first synced forward only. The first rank and
// step that walked otherwise.
std::vector<train::Finding> check_walks(const train::CaseRun& run, const Options& o) {
  for (const train::RankResult& r : run.ranks) {
    const std::vector<int64_t> per_step = walks_per_step(r, train::steps_of(run.config, r.rank));
    for (size_t s = 0; s < per_step.size(); ++s) {
      const int64_t want = o.static_graph ? (s == 0 ? 1 : 0) : 1;
      if (per_step[s] == want) continue;
      return {{cat("rank ", r.rank, ", step ", s, ": the graph was walked ", per_step[s],
                   " times; expected ", want),
               o.static_graph ? "with static_graph, walk the graph in the first synced forward "
                                "only and reuse what it found (Note [Static graph])"
                              : "with find_unused_parameters, walk the graph once per synced "
                                "forward"}};
    }
  }
  return {};
}

std::vector<train::Finding> stage_checks(const Case& c, const train::CaseRun& run) {
  const Options& o = c.options;
  const auto initial = train::expected_buckets(run, o.bucket_cap_mb, o.first_bucket_cap_mb);
  const int64_t k = c.config.micro_batches;
  const uint64_t buffers = o.broadcast_buffers ? run.num_buffers() : 0;
  // The buckets after the last step: rebuilt from rank 0's first ready order.
  const auto final_buckets =
      rebuilds(o) ? train::expected_buckets(run, o.bucket_cap_mb, o.first_bucket_cap_mb,
                                            first_ready_order(run, run.ranks[0]))
                  : initial;
  const bool walks = o.static_graph || o.find_unused_parameters;
  return train::first_findings({
      [&] {
        return train::check_construction_counts(
            run, run.num_params() + buffers, 0,
            "broadcast each parameter (and, with broadcast_buffers, each buffer) from rank 0 "
            "exactly once",
            /*allgathers=*/2);
      },
      [&] {
        return train::check_buckets(
            run, final_buckets,
            rebuilds(o)
                ? "after the first synced backward, rebuild the buckets in the order the "
                  "gradients were filed there (the unused parameters first), rank 0's order "
                  "on every rank, with the same caps (Note [Rebuilding the buckets])"
                : "with find_unused_parameters and no static_graph, keep the buckets of the "
                  "constructor: the order may change from step to step");
      },
      [&] {
        return train::check_counts_per_micro(
            run, train::Collective::Broadcast,
            [&](int64_t step, int64_t micro) {
              return rebuilds(o) && step == 0 && micro + 1 == k ? 1 : 0;
            },
            rebuilds(o)
                ? "one (rank 0's ready order) at the end of the first synced backward, none "
                  "after"
                : "none after construction",
            "broadcast rank 0's ready order once, when the buckets are rebuilt, so that every rank "
            "rebuilds the same buckets; nothing else is broadcast after construction");
      },
      [&] {
        return train::check_counts_per_micro(
            run, train::Collective::AllReduce,
            [&](int64_t step, int64_t micro) -> uint64_t {
              if (micro + 1 != k) return 0;
              const size_t buckets = step == 0 ? initial.size() : final_buckets.size();
              const bool used_map = o.static_graph ? step == 0 : o.find_unused_parameters;
              return buckets + (used_map ? 1 : 0);
            },
            o.static_graph
                ? "one per bucket in each synced backward, and the used-map in the first "
                  "one only"
                : "one per bucket in each synced backward (and the used-map with "
                  "find_unused_parameters)",
            o.static_graph ? "with static_graph, all-reduce the used-map in the first synced "
                             "iteration and reuse its counts after (Note [Static graph])"
                           : "launch each bucket once per synced backward");
      },
      [&]() -> std::vector<train::Finding> {
        if (!walks) return {};
        return check_walks(run, o);
      },
      [&] {
        return train::check_allreduce_sizes(
            run,
            [&](int64_t step) {
              std::vector<int64_t> bytes = train::bucket_bytes(run.reference.final_params,
                                                               step == 0 ? initial : final_buckets);
              const bool used_map = o.static_graph ? step == 0 : o.find_unused_parameters;
              if (used_map) bytes.push_back(static_cast<int64_t>(run.num_params() * sizeof(float)));
              return bytes;
            },
            "the step's buckets' parameters (and the used-map, where the step has one)",
            "all-reduce each bucket's flat tensor, which holds exactly its parameters' elements, "
            "and the used-map (one float per parameter) where the step needs one");
      },
      // The launch order, where one bucket list and one trailing used-map hold
      // for every step (not with static_graph, whose first step alone carries a
      // used-map, nor where the rebuild changed the buckets).
      [&]() -> std::vector<train::Finding> {
        if (initial != final_buckets || o.static_graph) return {};
        return train::check_launch_order(
            run, final_buckets, "launch the buckets strictly in index order (Note [Overlap])",
            o.find_unused_parameters && !o.static_graph
                ? std::vector<int64_t>{static_cast<int64_t>(run.num_params() * sizeof(float))}
                : std::vector<int64_t>{});
      },
      [&] {
        return train::check_synced_when_backward_returns(
            run, "wait for every bucket in the end-of-backward callback");
      },
      [&] {
        return train::check_grad_storage(
            run, final_buckets, o.gradient_as_bucket_view,
            o.gradient_as_bucket_view
                ? "with gradient_as_bucket_view, each .grad is a view of its slot in the rebuilt "
                  "buckets: when rebuilding, copy each .grad into its new slot and point it there"
                : "without gradient_as_bucket_view, .grad stays the parameter's own tensor");
      },
  });
}

// ---- scenarios --------------------------------------------------------------

using scenario_models::Forked;
using scenario_models::rows_of;

// Steps `model` in mode `first` once, then in mode `then`, with static_graph;
// the second step must fail on this rank with an error naming the option.
std::string changed_graph(int rank, const Group& group, int first, int then) {
  tp::manual_seed(0);
  auto model = std::make_shared<Forked>(/*spare=*/true);
  DDP ddp(model, group, with(kPerParameter, true));
  const tp::data::Batch batch = rows_of(rank);
  model->mode = first;
  tp::mse_loss(ddp(batch.x), batch.y).backward();
  model->mode = then;
  try {
    tp::mse_loss(ddp(batch.x), batch.y).backward();
  } catch (const tp::DistributedError& e) {
    const std::string what = e.what();
    for (const char* needed : {"static_graph", "(b."}) {
      if (what.find(needed) == std::string::npos) {
        return cat("rank ", rank, ": the error does not mention '", needed, "': ", what);
      }
    }
    return "";
  }
  return cat("rank ", rank, ": a step in which b ", first == 0 ? "got a gradient" : "got none",
             " after a first iteration in which it ", first == 0 ? "got none" : "got one",
             " ran without an error under static_graph");
}

train::Scenario used_then_unused() {
  return {"static_graph, b used in the first iteration and unused in the second: an error", 2,
          [](int rank, Group group) { return changed_graph(rank, group, 2, 0); },
          "with static_graph, a parameter the first iteration found used that gets no gradient "
          "means the graph changed: throw naming it and static_graph at the end of backward"};
}

train::Scenario unused_then_used() {
  return {"static_graph, b unused in the first iteration and used in the second: an error", 2,
          [](int rank, Group group) { return changed_graph(rank, group, 0, 2); },
          "with static_graph, a parameter the first iteration found unused that gets a gradient "
          "means the graph changed: throw naming it and static_graph in its hook"};
}

// Rank 0 uses a, rank 1 uses b, every step, with static_graph: the ranks'
// ready orders differ (each files its unused head first). Runs 3 steps and
// returns `check(ddp, model)`'s verdict.
template <typename Check>
std::string different_routes(int rank, const Group& group, Check&& check, bool view = false,
                             bool evaluate_first = false, int steps = 3) {
  tp::manual_seed(0);
  auto model = std::make_shared<Forked>(/*spare=*/true);
  model->mode = rank == 0 ? 0 : 1;
  DDP ddp(model, group, with(kPerParameter, true, false, view));
  tp::optim::SGD sgd(ddp.parameters(), {.lr = 0.05, .momentum = 0.9});
  const tp::data::Batch batch = rows_of(rank);
  if (evaluate_first) (void)ddp(batch.x);  // a forward never followed by a backward
  for (int step = 0; step < steps; ++step) {
    sgd.zero_grad();
    tp::mse_loss(ddp(batch.x), batch.y).backward();
    sgd.step();
  }
  return check(ddp, *model);
}

// "" when every parameter equals rank 0's (compared through broadcasts,
// all issued before any comparison, so that every rank issues the same).
std::string same_as_rank0(int rank, const Group& group, DDP& ddp) {
  std::vector<tp::Tensor> rank0;
  for (const auto& [name, param] : ddp.named_parameters()) {
    rank0.push_back(param.clone());
    group->broadcast(rank0.back(), 0)->wait();
  }
  const auto named = ddp.named_parameters();
  for (size_t p = 0; p < named.size(); ++p) {
    const float* mine = named[p].second.template data_ptr<float>();
    const float* theirs = rank0[p].template data_ptr<float>();
    for (int64_t i = 0; i < named[p].second.numel(); ++i) {
      if (mine[i] != theirs[i]) {
        return cat("rank ", rank, ": ", named[p].first, " differs from rank 0's after 3 steps "
                   "(element ", i, ": ", mine[i], " against ", theirs[i], ")");
      }
    }
  }
  return "";
}

train::Scenario same_buckets_on_every_rank() {
  return {"static_graph, rank 0 uses a and rank 1 uses b every step: every rank rebuilds rank "
          "0's buckets",
          2,
          [](int rank, Group group) {
            return different_routes(rank, group, [&](DDP& ddp, Forked&) -> std::string {
              // Compare with rank 0's assignment through a broadcast.
              std::vector<double> mine;
              for (const auto& bucket : ddp.bucket_assignment()) {
                for (int64_t p : bucket) mine.push_back(static_cast<double>(p));
                mine.push_back(-1.0);  // end of a bucket
              }
              tp::Tensor rank0 = tp::zeros({static_cast<int64_t>(mine.size())}, tp::kFloat64);
              for (size_t i = 0; i < mine.size(); ++i) rank0.data_ptr<double>()[i] = mine[i];
              group->broadcast(rank0, 0)->wait();
              for (size_t i = 0; i < mine.size(); ++i) {
                if (rank0.data_ptr<double>()[i] != mine[i]) {
                  return cat("rank ", rank, "'s rebuilt buckets differ from rank 0's");
                }
              }
              // Rank 0 left b and c (parameters 2 to 5) unused: filed first, in order.
              const auto buckets = ddp.bucket_assignment();
              if (rank == 0) {
                for (int64_t i = 0; i < 4; ++i) {
                  if (buckets.size() < 4 || buckets[static_cast<size_t>(i)] !=
                                                std::vector<int64_t>{i + 2}) {
                    return cat("rank 0's rebuilt buckets do not begin with the parameters its "
                               "forward left unused (2, 3, 4, 5: b and c)");
                  }
                }
              }
              return "";
            });
          },
          "rebuild from rank 0's ready order, broadcast, not from each rank's own: a rank whose "
          "forward leaves other parameters unused files them in another order, the unused ones "
          "first (Note [Rebuilding the buckets])"};
}

train::Scenario unused_everywhere_keeps_no_gradient() {
  return {"static_graph, c never used: it keeps no gradient after the first iteration too", 2,
          [](int rank, Group group) {
            return different_routes(rank, group, [&](DDP&, Forked& model) -> std::string {
              if (!model.c->weight.grad().defined()) return "";
              return cat("rank ", rank, ": c.weight, which no rank ever used, has a gradient "
                                        "after 3 steps");
            });
          },
          "keep the first iteration's used-map (static_used_) and leave .grad alone where its "
          "count is 0 in every later iteration too (Note [Static graph])"};
}

train::Scenario replicas_stay_identical() {
  return {"static_graph, rank 0 uses a and rank 1 uses b, momentum: the replicas stay "
          "identical",
          2,
          [](int rank, Group group) {
            return different_routes(rank, group, [&](DDP& ddp, Forked&) {
              return same_as_rank0(rank, group, ddp);
            });
          },
          "with static_graph, a parameter used on some ranks only still gets the average on "
          "every rank in every iteration: keep the first iteration's all-reduced used-map "
          "(static_used_), not this rank's own view of it (Note [Static graph])"};
}

train::Scenario no_gradient_with_views() {
  return {"static_graph, gradient_as_bucket_view, c never used: no gradient after the rebuild",
          2,
          [](int rank, Group group) {
            return different_routes(
                rank, group,
                [&](DDP&, Forked& model) -> std::string {
                  if (!model.c->weight.grad().defined()) return "";
                  return cat("rank ", rank, ": c.weight, which no rank used, has a gradient "
                                            "after the first step (the one that rebuilds the "
                                            "buckets) with gradient_as_bucket_view");
                },
                /*view=*/true, /*evaluate_first=*/false, /*steps=*/1);
          },
          "with gradient_as_bucket_view too, a parameter no rank used keeps no gradient: do not "
          "point its .grad at a slot when rebuilding the buckets"};
}

train::Scenario evaluation_before_training() {
  return {"static_graph, a forward without backward before the first step: nothing changes", 2,
          [](int rank, Group group) {
            return different_routes(
                rank, group, [&](DDP& ddp, Forked&) { return same_as_rank0(rank, group, ddp); },
                /*view=*/false, /*evaluate_first=*/true);
          },
          "the first synced iteration is the first forward whose backward ran: count synced "
          "backward passes (synced_iterations_), not forwards or walks, to know when the "
          "record is complete"};
}

}  // namespace

int main(int argc, char** argv) {
  train::CheckerSpec<Options> spec;
  spec.stage = stage06::stage_spec();
  spec.cases = cases();
  spec.stage_checks = stage_checks;
  spec.scenarios = no_sync_scenarios::all<DDP>(/*first_sync_extra=*/1);  // the rebuild's broadcast
  spec.scenarios.push_back(used_then_unused());  // the graph changes: an error is right
  spec.scenarios.push_back(unused_then_used());
  // One route per rank in every step: an error saying the graph changed
  // blames the record.
  for (train::Scenario s : {same_buckets_on_every_rank(), unused_everywhere_keeps_no_gradient(),
                            replicas_stay_identical(), no_gradient_with_views()}) {
    s.if_a_rank_throws = static_graph_cause::kRecordNotGraph;
    spec.scenarios.push_back(std::move(s));
  }
  // Here an error of the first synced step itself names what decides that
  // it is the first (nothing is recorded yet).
  train::Scenario evaluation = evaluation_before_training();
  evaluation.if_a_rank_throws = "a rank failed: its message above says why. A forward without "
                                "a backward came first here: " + evaluation.likely_cause;
  spec.scenarios.push_back(std::move(evaluation));
  return train::run_checker<DDP>(argc, argv, spec);
}
