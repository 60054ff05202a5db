// Checker for stage 05 (DDP with find_unused_parameters).
// Compiled once and linked with every ddp.cc: solutions/05-find-unused (must
// pass), the generated exercise (must fail at once, naming the stub), each
// planted-bug mutant in tests/mutants/05-find-unused (must fail with the
// diagnosis the mutant names), and your exercises/05-find-unused
// (`./kit check 05`).
// TP_STAGE_HEADER is set only for a planted bug that patches the header: its
// copy of stage.h, which includes the patched ddp.h.
#ifdef TP_STAGE_HEADER
#include TP_STAGE_HEADER
#else
#include "stage.h"
#endif

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "no_sync_scenarios.h"
#include "scenario_models.h"
#include "tensorplay/data.h"
#include "tensorplay/error.h"
#include "tensorplay/nn/linear.h"
#include "tensorplay/nn/module.h"
#include "tensorplay/ops.h"
#include "tensorplay/random.h"
#include "tensorplay/train/checker.h"
#include "tensorplay/util/temp_dir.h"

namespace {

namespace train = tp::train;
using DDP = stage05::DistributedDataParallel;
using Options = stage05::Options;
using Case = train::CheckCase<Options>;
using Group = std::shared_ptr<tp::distributed::ProcessGroup>;
using tp::detail::cat;

// BranchyMLP float32 in reverse registration order: spare.bias 16, spare.weight
// 512 | head.bias 16, head.weight 512, branch_b.bias 128, branch_b.weight 4096 |
// branch_a.* 4224 | fc1.* 2176 bytes. With these caps bucket 0 holds spare
// alone (never used), and every branch shares a bucket with something else.
Options unused(Options options) {
  options.find_unused_parameters = true;
  return options;
}
const Options kSeveral = unused(
    {.bucket_cap_mb = 2000.0 / (1 << 20), .first_bucket_cap_mb = 500.0 / (1 << 20)});
const Options kPerParameter = unused({.bucket_cap_mb = 1e-9, .first_bucket_cap_mb = 1e-9});
const Options kOneBucket = unused({});

Options as_view(Options options) {
  options.gradient_as_bucket_view = true;
  return options;
}

train::RunConfig branchy(train::RunConfig config) {
  config.model_kind = train::ModelKind::Branchy;
  return config;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const train::RunConfig& c : train::standard_configs()) {
    out.push_back({branchy(c), kSeveral, "branchy, 4 buckets (spare alone in bucket 0)"});
  }
  train::RunConfig small = branchy({});
  small.world_size = 3;
  small.steps = 4;
  small.per_rank_seed = true;
  out.push_back({small, kPerParameter, "branchy, one bucket per parameter"});
  out.push_back({small, kOneBucket, "branchy, one bucket"});
  train::RunConfig momentum = small;
  momentum.world_size = 2;
  momentum.steps = 8;
  momentum.momentum = 0.9;
  out.push_back({momentum, as_view(kSeveral),
                 "branchy, gradient_as_bucket_view, momentum (a branch no rank took keeps no "
                 "gradient, so momentum does not move it)"});
  train::RunConfig accumulate = small;
  accumulate.micro_batches = 2;
  accumulate.steps = 3;
  out.push_back({accumulate, kSeveral,
                 "branchy, K = 2: a branch used under no_sync but not in the synced micro-batch "
                 "keeps what it accumulated"});
  train::RunConfig in_place = accumulate;
  in_place.zero_grad_set_to_none = false;
  out.push_back({in_place, as_view(kSeveral),
                 "branchy, K = 2, gradient_as_bucket_view, zero_grad in place (unused "
                 "parameters accumulate in their slots)"});
  train::RunConfig plain = small;
  plain.model_kind = train::ModelKind::MiniMLP;
  out.push_back({plain, kSeveral, "MiniMLP with the option on: nothing unused"});
  out.push_back({plain, Options{.bucket_cap_mb = 2000.0 / (1 << 20),
                                .first_bucket_cap_mb = 500.0 / (1 << 20)},
                 "MiniMLP with the option off: stage 04's behaviour"});
  for (Case& c : out) c.config.trace = true;
  return out;
}

// Parameters no rank's micro-batches reached in step `step`.
std::vector<int64_t> unused_everywhere(const train::CaseRun& run, int64_t step) {
  const int64_t k = run.config.micro_batches;
  std::vector<int64_t> out;
  for (size_t p = 0; p < run.num_params(); ++p) {
    bool used = false;
    for (const train::RankResult& r : run.ranks) {
      for (int64_t i = step * k; i < (step + 1) * k; ++i) {
        const auto& unreached = r.unreached_per_micro[static_cast<size_t>(i)];
        if (std::find(unreached.begin(), unreached.end(), static_cast<int64_t>(p)) ==
            unreached.end()) {
          used = true;
        }
      }
    }
    if (!used) out.push_back(static_cast<int64_t>(p));
  }
  return out;
}

// A parameter no rank used in the last step keeps no gradient at all (the
// trainer's zero_grad sets them to none): it is not stepped.
std::vector<train::Finding> check_no_gradient_where_unused(const train::CaseRun& run) {
  const int64_t last = static_cast<int64_t>(run.ranks[0].unreached_per_micro.size()) /
                           run.config.micro_batches - 1;
  for (int64_t p : unused_everywhere(run, last)) {
    for (const train::RankResult& r : run.ranks) {
      if (r.grad_storage[static_cast<size_t>(p)] == 0) continue;
      return {{cat("rank ", r.rank, ": ", run.reference.final_params[static_cast<size_t>(p)].name,
                   " has a gradient after the last step, although no rank used it in that "
                   "step"),
               "a parameter unused on every rank keeps no gradient (so the optimizer skips "
               "it, as in PyTorch): all-reduce the used-map, leave .grad alone where its count "
               "is 0, and reset the map after every sync so that it counts only the "
               "micro-batches since then (Note [Finding unused parameters])"}};
    }
  }
  return {};
}

std::vector<train::Finding> stage_checks(const Case& c, const train::CaseRun& run) {
  const auto buckets =
      train::expected_buckets(run, c.options.bucket_cap_mb, c.options.first_bucket_cap_mb);
  const bool find_unused = c.options.find_unused_parameters;
  const uint64_t per_sync = buckets.size() + (find_unused ? 1 : 0);  // + the used-map
  const std::vector<int64_t> used_map_bytes =
      find_unused ? std::vector<int64_t>{static_cast<int64_t>(run.num_params() * sizeof(float))}
                  : std::vector<int64_t>{};
  const int64_t k = c.config.micro_batches;
  const uint64_t buffers = c.options.broadcast_buffers ? run.num_buffers() : 0;
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
            run, buckets,
            "walk the parameters from the last to the first and close a bucket "
            "once it holds at least its cap (Note [Bucket assignment])");
      },
      [&] {
        return train::check_quiet_until_last_micro_batch(
            run,
            "a micro-batch whose forward ran under no_sync must not communicate, not even the "
            "used-map: it is all-reduced once, after the buckets of the synced backward");
      },
      [&] {
        return train::check_counts_per_micro(
            run, train::Collective::AllReduce,
            [&](int64_t, int64_t micro) { return micro + 1 == k ? per_sync : 0; },
            find_unused
                ? "one per bucket, then one for the used-map, in the step's last micro-batch"
                : "one per bucket in the step's last micro-batch",
            find_unused ? "launch each bucket once per synced backward, unused parameters included "
                          "(filed at the first hook), and the used-map once after the last bucket"
                        : "launch each bucket's all-reduce exactly once per synced backward");
      },
      [&] {
        return train::check_allreduce_sizes(
            run,
            [&](int64_t) {
              std::vector<int64_t> bytes = train::bucket_bytes(run.reference.final_params, buckets);
              bytes.insert(bytes.end(), used_map_bytes.begin(), used_map_bytes.end());
              return bytes;
            },
            cat("the ", buckets.size(), " buckets' parameters",
                find_unused ? " and the used-map" : ""),
            "all-reduce each bucket's flat tensor, which holds exactly its parameters' elements, "
            "and, with find_unused_parameters, the used-map (one float per parameter)");
      },
      [&] {
        return train::check_launch_order(
            run, buckets,
            "launch the buckets strictly in index order, then the used-map (Note [Overlap], Note "
            "[Finding unused parameters])",
            used_map_bytes);
      },
      [&] {
        return train::check_overlap(
            run, buckets,
            "file the unused parameters at the first hook of the synced backward, launch each "
            "bucket from the hook that completes it, and the used-map from the hook that launches "
            "the last bucket (Note [Finding unused parameters])",
            "wait for every bucket and the used-map in the end-of-backward callback",
            used_map_bytes.size());
      },
      [&] {
        return train::check_launched_before_first_wait(
            run,
            "never wait inside a hook: launch, return, and wait only in the end-of-backward "
            "callback");
      },
      [&] {
        return train::check_synced_when_backward_returns(
            run, "wait for every bucket and the used-map in the end-of-backward callback");
      },
      [&]() -> std::vector<train::Finding> {
        if (!find_unused) return {};
        return check_no_gradient_where_unused(run);
      },
      [&] {
        return train::check_grad_storage(
            run, buckets, c.options.gradient_as_bucket_view,
            c.options.gradient_as_bucket_view
                ? "with gradient_as_bucket_view, point each .grad at its bucket slot in the synced "
                  "backward, a parameter unused on this rank too"
                : "without gradient_as_bucket_view, .grad stays the parameter's own tensor: copy "
                  "the "
                  "average back into it (or a copy of the slot where it had none)");
      },
  });
}

// ---- scenarios --------------------------------------------------------------

// One micro-batch's loss on BranchyMLP, on this rank's rows: rank 0 takes
// one branch and rank 1 may take the other.
tp::Tensor branchy_loss(DDP& ddp, int rank) {
  const tp::data::Batch batch = scenario_models::rows_of(rank);
  return tp::mse_loss(ddp(batch.x), batch.y);
}

train::Scenario without_the_option() {
  return {"BranchyMLP without find_unused_parameters: a clear error on every rank, no hang", 2,
          [](int rank, Group group) -> std::string {
            tp::manual_seed(0);
            DDP ddp(train::make_model(branchy({})), group, Options{});
            try {
              branchy_loss(ddp, rank).backward();
            } catch (const tp::DistributedError& e) {
              const std::string what = e.what();
              for (const char* needed : {"spare.weight", "find_unused_parameters"}) {
                if (what.find(needed) == std::string::npos) {
                  return cat("rank ", rank, ": the error does not mention '", needed, "': ",
                             what);
                }
              }
              try {
                (void)ddp(tp::zeros({1, 16}));
              } catch (const tp::DistributedError&) {
                return "";  // and the next forward refuses to run
              }
              return cat("rank ", rank, ": the forward after the failed backward ran");
            }
            return cat("rank ", rank, ": backward returned although spare.weight got no "
                                      "gradient and find_unused_parameters is off");
          },
          "without find_unused_parameters, a backward in which a parameter got no gradient "
          "throws tp::DistributedError at its end, naming the parameters and the option, and "
          "the next forward refuses to run"};
}

// What rank `rank` writes to stderr while `run` runs.
template <typename Fn>
std::string stderr_of(Fn&& run) {
  tp::TempDir dir("tp-check05-stderr");
  const std::string path = dir.path() + "/stderr";
  std::fflush(stderr);
  const int saved = dup(2);
  std::FILE* file = std::fopen(path.c_str(), "w");
  dup2(fileno(file), 2);
  run();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::fclose(file);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

train::Scenario note_when_nothing_unused() {
  return {"option on, nothing ever unused: rank 0 says so once, the others say nothing", 2,
          [](int rank, Group group) -> std::string {
            tp::manual_seed(0);
            DDP ddp(train::make_model({}), group, unused({}));
            const tp::data::Batch batch = scenario_models::rows_of(rank);
            const std::string said = stderr_of([&] {
              for (int step = 0; step < 3; ++step) tp::mse_loss(ddp(batch.x), batch.y).backward();
            });
            size_t notes = 0;  // lines that mention the option
            std::istringstream lines(said);
            for (std::string line; std::getline(lines, line);) {
              notes += line.find("find_unused_parameters") != std::string::npos;
            }
            if (rank == 0 && notes != 1) {
              return cat("rank 0 wrote ", notes, " lines about find_unused_parameters on "
                         "stderr in 3 steps where no parameter went unused; expected one: '",
                         said, "'");
            }
            if (rank != 0 && notes != 0) {
              return cat("rank ", rank, " wrote about find_unused_parameters: '", said, "'");
            }
            return "";
          },
          "when no parameter went unused on any rank in the first synced backward (every "
          "count of the used-map equals the world size), rank 0 writes one note to stderr "
          "that the option costs a graph walk per forward"};
}

using scenario_models::Forked;
using scenario_models::rows_of;

// h = (h + h) * 0.5, `depth` times: every node reached along two paths, so
// a walk without a visited set takes 2^depth steps.
class Diamonds : public tp::nn::Module {
 public:
  explicit Diamonds(int depth) : depth_(depth) {
    fc = register_module("fc", std::make_shared<tp::nn::Linear>(16, 4));
  }
  tp::Tensor forward(const tp::Tensor& x) override {
    tp::Tensor h = fc->forward(x);
    for (int i = 0; i < depth_; ++i) h = tp::mul(tp::add(h, h), 0.5);
    return h;
  }

 private:
  int depth_;
  std::shared_ptr<tp::nn::Linear> fc;
};

size_t notes_in(const std::string& said) {  // lines about the option
  size_t notes = 0;
  std::istringstream lines(said);
  for (std::string line; std::getline(lines, line);) {
    notes += line.find("find_unused_parameters") != std::string::npos;
  }
  return notes;
}

train::Scenario evaluation_forward() {
  return {"a forward never followed by a backward (evaluation), then a training step", 2,
          [](int rank, Group group) -> std::string {
            tp::manual_seed(0);
            DDP ddp(train::make_model(branchy({})), group, kSeveral);
            const tp::data::Batch batch = rows_of(rank);
            const uint64_t in_eval =
                no_sync_scenarios::collectives_during(group, [&] { (void)ddp(batch.x); });
            if (in_eval != 0) {
              return cat("rank ", rank, ": ", in_eval, " collectives in a forward never "
                         "followed by a backward; expected 0");
            }
            const uint64_t trained = no_sync_scenarios::collectives_during(
                group, [&] { tp::mse_loss(ddp(batch.x), batch.y).backward(); });
            const uint64_t want = ddp.bucket_assignment().size() + 1;  // + the used-map
            if (trained != want) {
              return cat("rank ", rank, ": ", trained, " collectives in the training step "
                         "after an evaluation forward; expected ", want);
            }
            return "";
          },
          "file the unused parameters at the first hook of backward, not in forward: a "
          "forward never followed by a backward must leave nothing launched or filed (Note "
          "[Finding unused parameters])"};
}

train::Scenario note_with_accumulation() {
  return {"option on, K = 2, nothing ever unused: rank 0 says so once", 2,
          [](int rank, Group group) -> std::string {
            tp::manual_seed(0);
            DDP ddp(train::make_model({}), group, kSeveral);
            const tp::data::Batch batch = rows_of(rank);
            const std::string said = stderr_of([&] {
              for (int step = 0; step < 3; ++step) {
                {
                  auto guard = ddp.no_sync();
                  tp::mse_loss(ddp(batch.x), batch.y).backward();
                }
                tp::mse_loss(ddp(batch.x), batch.y).backward();
              }
            });
            const size_t notes = notes_in(said);
            if (rank == 0 && notes != 1) {
              return cat("rank 0 wrote ", notes, " lines about find_unused_parameters with 2 "
                         "micro-batches per step and nothing unused; expected one");
            }
            return "";
          },
          "the used-map holds 1 (not a count of micro-batches) where a rank used a parameter "
          "since the last sync, so that after the all-reduce every entry is at most the world "
          "size, and equal to it where every rank used it, with accumulation too"};
}

train::Scenario no_note_when_used_somewhere() {
  return {"every parameter used on some rank, none on every rank: no note", 2,
          [](int rank, Group group) -> std::string {
            tp::manual_seed(0);
            auto model = std::make_shared<Forked>();
            model->mode = rank == 0 ? 0 : 1;  // rank 0 uses a only, rank 1 b only
            DDP ddp(model, group, kSeveral);
            const tp::data::Batch batch = rows_of(rank);
            const std::string said = stderr_of([&] {
              for (int step = 0; step < 2; ++step) tp::mse_loss(ddp(batch.x), batch.y).backward();
            });
            if (notes_in(said) != 0) {
              return cat("rank ", rank, " wrote that the option is not needed, although each "
                         "rank left a parameter unused: '", said, "'");
            }
            return "";
          },
          "the note is for a run where every parameter got a gradient on every rank: every "
          "count of the used-map equals the world size, not merely above 0"};
}

train::Scenario no_late_note() {
  return {"something unused in the first synced backward, nothing later: no note", 2,
          [](int rank, Group group) -> std::string {
            tp::manual_seed(0);
            auto model = std::make_shared<Forked>();
            DDP ddp(model, group, kSeveral);
            const tp::data::Batch batch = rows_of(rank);
            const std::string said = stderr_of([&] {
              model->mode = 0;  // b unused everywhere
              tp::mse_loss(ddp(batch.x), batch.y).backward();
              model->mode = 2;  // everything used from now on
              for (int step = 0; step < 2; ++step) tp::mse_loss(ddp(batch.x), batch.y).backward();
            });
            if (notes_in(said) != 0) {
              return cat("rank ", rank, " wrote a note in a later step although the first "
                         "synced backward left a parameter unused: '", said, "'");
            }
            return "";
          },
          "the note is decided once, by the first synced backward, whether it is printed or "
          "not"};
}

train::Scenario shared_subgraphs() {
  return {"26 diamonds (h = (h + h) * 0.5): the walk visits each node once", 2,
          [](int rank, Group group) -> std::string {
            tp::manual_seed(0);
            DDP ddp(std::make_shared<Diamonds>(26), group, kSeveral);
            const tp::data::Batch batch = rows_of(rank);
            const auto start = std::chrono::steady_clock::now();
            tp::Tensor y = ddp(batch.x);
            const double seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            tp::mse_loss(y, batch.y).backward();
            // A walk that visits each of the ~80 nodes once takes microseconds,
            // even on a loaded machine; one that follows every path takes 2^26
            // steps, seconds.
            if (seconds > 0.5) {
              return cat("rank ", rank, ": the forward of a 26-diamond graph took ", seconds,
                         " s");
            }
            return "";
          },
          "a node reached along several paths (a residual connection, a tensor used twice) "
          "is walked once: keep a set of the nodes already visited"};
}

}  // namespace

int main(int argc, char** argv) {
  train::CheckerSpec<Options> spec;
  spec.stage = stage05::stage_spec();
  spec.cases = cases();
  spec.stage_checks = stage_checks;
  spec.scenarios = no_sync_scenarios::all<DDP>();
  for (train::Scenario scenario :
       {without_the_option(), evaluation_forward(), note_when_nothing_unused(),
        note_with_accumulation(), no_note_when_used_somewhere(), no_late_note(),
        shared_subgraphs()}) {
    spec.scenarios.push_back(std::move(scenario));
  }
  return train::run_checker<DDP>(argc, argv, spec);
}
