// Checker for stage 01 (naive DDP). Built three ways from this one source:
// against solutions/01-naive (must pass), against the generated exercise
// (must fail at once, naming the stub) and against each planted-bug mutant in
// tests/mutants/01-naive (must fail with the diagnosis the mutant names).
// `./kit check 01` builds it against your exercises/01-naive.
#include "ddp.h"

#include "tensorplay/train/checker.h"

namespace {

using tp::train::Finding;
using tp::train::RankResult;
using tp::train::RunConfig;

// Stage 01's shape of communication, counted on every rank:
//   construction: one broadcast per parameter (MiniMLP has no buffers) and no
//                 all-reduce;
//   every step:   exactly one all-reduce per parameter.
std::vector<Finding> count_collectives(const RunConfig&, const std::vector<RankResult>& ranks,
                                       size_t num_params) {
  std::vector<Finding> out;
  for (const RankResult& r : ranks) {
    if (r.construction_broadcasts != num_params) {
      out.push_back({tp::detail::cat("rank ", r.rank, ": the constructor issued ",
                                     r.construction_broadcasts, " broadcasts for ", num_params,
                                     " parameters"),
                     "broadcast each parameter (and buffer) from rank 0 exactly once"});
      break;
    }
    if (r.construction_allreduces != 0) {
      out.push_back({tp::detail::cat("rank ", r.rank, ": the constructor issued ",
                                     r.construction_allreduces, " all-reduces"),
                     "construction copies rank 0's model with broadcasts; all-reduce averages"});
      break;
    }
    for (size_t step = 0; step < r.allreduces_per_step.size(); ++step) {
      if (r.allreduces_per_step[step] != num_params) {
        out.push_back({tp::detail::cat("rank ", r.rank, ", step ", step, ": counted ",
                                       r.allreduces_per_step[step], " all-reduces; stage 01 issues "
                                       "exactly one per parameter (", num_params, ")"),
                       "sync_grads must all-reduce each parameter's gradient once per step: no "
                       "parameter skipped, none synced twice"});
        return out;
      }
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  tp::train::CheckerSpec spec;
  spec.stage = "01";
  spec.title = "naive DDP, one all-reduce per parameter";
  spec.configs = tp::train::standard_configs();
  for (RunConfig& config : spec.configs) config.trace = true;
  spec.stage_checks = [](const RunConfig& config, const std::vector<RankResult>& ranks,
                         size_t num_params) {
    std::vector<Finding> out = count_collectives(config, ranks, num_params);
    for (Finding& f : tp::train::check_sync_between_backward_and_step(ranks)) {
      out.push_back(std::move(f));
    }
    return out;
  };
  return tp::train::run_checker<stage01::DistributedDataParallel>(argc, argv, spec);
}
