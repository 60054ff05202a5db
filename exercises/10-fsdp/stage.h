// Copied from solutions/10-fsdp/stage.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 10's identity, declared once (tp::train::StageSpec in
// tensorplay/train/stage_spec.h): the title, the options the demo offers
// as flags, and the stage's words in the checker's diagnoses. Its demo
// (lessons/10-fsdp/main.cc), its checker and the benchmarks read it.
#pragma once

#include <string>

#include "ddp.h"
#include "tensorplay/train/stage_spec.h"
#include "wrap.h"

namespace stage10 {

// What --auto-wrap-policy size wraps: a module of at least this many
// parameters (the deep model's width-32 layers hold 1056, its first 544).
inline constexpr int64_t kDemoMinNumParams = 1000;

inline tp::train::StageSpec<Options> stage_spec() {
  tp::train::StageSpec<Options> spec;
  spec.number = "10";
  spec.title = "FSDP: parameters, gradients and optimizer state sharded";
  spec.advice.where_sync =
      "by the reduce-scatter of each unit's gradient once autograd has produced all of it";
  spec.advice.how_sync_runs =
      "inside backward, unit by unit, each unit's full gradient reduce-scattered into the "
      "ranks' shards and divided by the world size";
  spec.advice.where_grads_move =
      "reduce-scattered into the right shard (this rank's elements of the padded flat "
      "gradient) and divided like the others";
  using tp::train::enum_flag;
  tp::train::OptionFlag<Options> wrap;
  wrap.name = "--auto-wrap-policy";
  wrap.help = "which modules become units: each Linear, each child of the model, or each "
              "module of at least 1000 parameters";
  wrap.choices = {"linear", "children", "size"};
  wrap.choose = [](Options& options, const std::string& name) {
    options.auto_wrap_policy = name == "linear"     ? linear_wrap_policy()
                               : name == "children" ? children_wrap_policy()
                                                    : size_based_auto_wrap_policy(kDemoMinNumParams);
  };
  wrap.chosen = [](const Options& options) -> std::string {
    const std::string& name = options.auto_wrap_policy.name;
    return name.empty() ? "linear" : name.rfind("size", 0) == 0 ? "size" : name;
  };
  spec.flags = {
      enum_flag<Options, ShardingStrategy>("--sharding", &Options::sharding_strategy,
                                           {{"full", ShardingStrategy::FULL_SHARD},
                                            {"grad-op", ShardingStrategy::SHARD_GRAD_OP},
                                            {"none", ShardingStrategy::NO_SHARD}},
                                           "FULL_SHARD (ZeRO-3), SHARD_GRAD_OP (ZeRO-2) or "
                                           "NO_SHARD (DDP)"),
      enum_flag<Options, BackwardPrefetch>("--backward-prefetch", &Options::backward_prefetch,
                                           {{"pre", BackwardPrefetch::BACKWARD_PRE},
                                            {"post", BackwardPrefetch::BACKWARD_POST},
                                            {"none", BackwardPrefetch::NONE}},
                                           "when backward issues the next unit's all-gather"),
      tp::train::switch_flag<Options>("--forward-prefetch", &Options::forward_prefetch,
                                       "issue the next unit's all-gather before this one "
                                       "computes"),
      wrap,
  };
  // Ranks seeded apart (--per-rank-seed) start from rank 0's values, as a
  // DDP's broadcast makes them: sync_module_states.
  spec.adapt = [](const tp::train::RunConfig& config, Options& options) {
    options.sync_module_states = config.per_rank_seed;
  };
  return spec;
}

}  // namespace stage10
