// Copied from solutions/09-zero/stage.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 09's identity, declared once (tp::train::StageSpec in
// tensorplay/train/stage_spec.h): the title, the options a run takes
// (RunOptions: the DDP's, the hook to register, how the optimizer syncs)
// and the flags the demo offers for them, and the stage's words in the
// checker's diagnoses; and the three functions through which the kit's
// trainer registers the built-in hook a run names (comm_hooks), builds the
// optimizer and joins (sharded_optimizer). Its demo (lessons/09-zero/main.cc), its checker and
// the benchmarks read it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ddp.h"
#include "default_hooks.h"
#include "join.h"
#include "powersgd_hook.h"
#include "tensorplay/error.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/train/stage_spec.h"
#include "zero.h"

namespace stage09 {

// The options of a run of stage 09: the DDP's Options, and what only the
// kit's harness reads. As in PyTorch, a hook is not an argument of the
// DDP's constructor, nor how the optimizer syncs its shards:
// register_builtin_hook() below registers the one comm_hook names on the
// constructed DDP, and make_optimizer() passes param_sync to ZeroOptions.
struct RunOptions : Options {
  // "none", "allreduce", "fp16", "bf16" or "powersgd".
  std::string comm_hook = "none";
  // PowerSGD's knobs, PowerSGDOptions' (powersgd_hook.h).
  int64_t powersgd_rank = 1;  // matrix_approximation_rank
  // start_powerSGD_iter. PyTorch's default is 1000, for runs of many
  // thousand steps; the kit's runs are ten steps long, so it starts at the
  // earliest iteration error feedback allows (powersgd_hook.h).
  int64_t powersgd_start_iteration = 2;
  double powersgd_min_compression_rate = 2;
  // The optimizer's ZeroOptions::param_sync, "allgather" or "broadcast".
  std::string param_sync = "allgather";
};


// The trainer's optimizer: the DDP's parameters, sharded (zero.h).
inline std::unique_ptr<ZeroRedundancyOptimizer> make_optimizer(DistributedDataParallel& ddp,
                                                               tp::optim::SGDOptions sgd,
                                                               const RunOptions& options) {
  // An ignored parameter's gradient is this rank's own (Note [Ignored
  // parameters and buffers] in ddp.cc): sharding its step would spread one
  // rank's update to all.
  TP_CHECK(options.params_and_buffers_to_ignore.empty(),
           "stage09: make_optimizer: the DDP ignores ", options.params_and_buffers_to_ignore.size(),
           " tensor(s), whose gradients stay local; ZeRO shards the step of every parameter it "
           "is given, so give it only the DDP's own (this stage does not take ignored tensors)");
  return std::make_unique<ZeroRedundancyOptimizer>(
      ddp.parameters(), ddp.process_group(), sgd,
      ZeroOptions{.reduce_scatter = options.reduce_scatter, .param_sync = options.param_sync});
}

// The trainer's loop on uneven inputs: Join over the DDP, then the
// optimizer (join.h), with the options' divisor and early termination.
inline void join_with_optimizer(DistributedDataParallel& ddp, ZeroRedundancyOptimizer& zero,
                                const Options& options, const std::function<void()>& body) {
  Join join({&ddp, &zero},
            JoinOptions{.enable = true,
                        .throw_on_early_termination = options.throw_on_early_termination,
                        .divide_by_initial_world_size = options.divide_by_initial_world_size});
  join.run(body);
}

// What the kit's trainer calls right after constructing the DDP (the
// capability comm_hooks, found by argument-dependent lookup): registers
// the built-in hook options.comm_hook names ("none" registers nothing), on
// ddp.process_group(); with options.reduce_scatter the DDP has registered
// noop_hook itself, and only "none" is accepted. Throws tp::Error for a
// name it does not know, listing the ones it does, for PowerSGD settings
// PowerSGDState refuses, and for a hook next to reduce_scatter. The
// harness's, not the DDP's: the DDP only offers register_comm_hook, as
// PyTorch's does.
inline void register_builtin_hook(DistributedDataParallel& ddp, const RunOptions& options) {
  const std::string& name = options.comm_hook;
  if (options.reduce_scatter) {
    // The DDP has registered noop_hook (the optimizer reduces, zero.h): a
    // second reduction here would send every gradient twice.
    TP_CHECK(name == "none", "stage09: the reduce-scatter form reduces the gradients in the "
             "optimizer (the DDP registers noop_hook itself); --comm-hook ", name,
             " would reduce them a second time: leave it at none");
    return;
  }
  if (name == "none") return;
  if (name == "allreduce") {
    ddp.register_comm_hook(ddp.process_group(), allreduce_hook);
  } else if (name == "fp16") {
    ddp.register_comm_hook(ddp.process_group(), fp16_compress_hook);
  } else if (name == "bf16") {
    ddp.register_comm_hook(ddp.process_group(), bf16_compress_hook);
  } else if (name == "powersgd") {
    // A rank no weight of the model can use is a mistake, not a request:
    // every matrix would be clamped to its own min(n, m).
    int64_t largest = 0;
    for (const tp::Tensor& p : ddp.parameters()) {
      if (p.dim() >= 2) largest = std::max(largest, std::min(p.size(0), p.numel() / p.size(0)));
    }
    TP_CHECK(largest == 0 || options.powersgd_rank <= largest,
             "stage09: PowerSGD rank ", options.powersgd_rank, " is above every weight's "
             "min(n, m) in this model (the largest is ", largest, "); a rank-", largest,
             " approximation already sends every weight whole");
    PowerSGDOptions powersgd;
    powersgd.matrix_approximation_rank = options.powersgd_rank;
    powersgd.start_powerSGD_iter = options.powersgd_start_iteration;
    powersgd.min_compression_rate = options.powersgd_min_compression_rate;
    ddp.register_comm_hook(std::make_shared<PowerSGDState>(ddp.process_group(), powersgd),
                           powerSGD_hook);
  } else {
    TP_THROW(tp::Error, "stage09: unknown comm hook '", name,
             "'; the built-in ones are none, allreduce, fp16, bf16 and powersgd");
  }
}

inline tp::train::StageSpec<RunOptions> stage_spec() {
  tp::train::StageSpec<RunOptions> spec;
  spec.number = "09";
  spec.title = "DDP with a ZeRO-sharded optimizer";
  spec.advice.where_sync =
      "by the gradient hooks of the micro-batch that syncs, bucket by bucket (or, in the "
      "reduce-scatter form, by the optimizer's reduce-scatter), then each rank steps its shard "
      "and the shards are exchanged";
  spec.advice.how_sync_runs =
      "inside the backward of the step's last micro-batch (the buckets), then in the "
      "optimizer's step(): this rank's shard stepped, every shard gathered";
  spec.advice.after_a_rank_joins =
      "do the ranks that ran out add zeros to every bucket, keep the active ranks' average in "
      "their gradients, and step their own shard with it (Note [A joined rank's shard])";
  spec.flags = tp::train::bucket_cap_flags<RunOptions>(
      {tp::train::gradient_as_bucket_view_flag<RunOptions>(),
       tp::train::static_graph_flag<RunOptions>(),
       tp::train::find_unused_parameters_flag<RunOptions>(),
       tp::train::switch_flag<RunOptions>("--reduce-scatter", &RunOptions::reduce_scatter,
                                          "the reduce-scatter form: the optimizer reduces each "
                                          "rank's shard of the gradients, the DDP sends nothing"),
       tp::train::choice_flag<RunOptions>("--param-sync", &RunOptions::param_sync,
                                          {"allgather", "broadcast"},
                                          "how the updated shards reach every rank")});
  const auto hooks = tp::train::comm_hook_flags<RunOptions>();  // --comm-hook, PowerSGD's knobs
  spec.flags.insert(spec.flags.end(), hooks.begin(), hooks.end());
  // --divide-by-active-ranks (a flag every demo has) sets the plan's divisor;
  // the Join must divide the same way.
  spec.adapt = [](const tp::train::RunConfig& config, RunOptions& options) {
    options.divide_by_initial_world_size = config.divisor == tp::train::Divisor::InitialWorldSize;
  };
  // allreduce_hook promises the reference's numbers; compression does not.
  spec.approximation = [](const RunOptions& options) -> std::string {
    if (options.comm_hook == "fp16") return "fp16_compress_hook rounds each average to float16";
    if (options.comm_hook == "bf16") return "bf16_compress_hook rounds each average to bfloat16";
    if (options.comm_hook == "powersgd") {
      return tp::detail::cat("PowerSGD sends each weight's gradient as an approximation of "
                             "matrix rank ", options.powersgd_rank, " from iteration ",
                             options.powersgd_start_iteration, " on");
    }
    return "";
  };
  // A hook plan no rank could run is refused before the ranks start; so is
  // a hook with the reduce-scatter form (register_comm_hook refuses it too).
  spec.check_plan = [](const tp::train::RunConfig& config, const RunOptions& options) {
    if (options.reduce_scatter && options.comm_hook != "none") {
      TP_THROW(tp::Error, "--reduce-scatter with --comm-hook ", options.comm_hook,
               ": the reduce-scatter form reduces in the optimizer (the DDP registers "
               "noop_hook), so a hook would send every gradient twice; drop one of the two");
    }
    tp::train::check_comm_hook_plan(config, options);
  };
  return spec;
}

}  // namespace stage09

// The trainer, the demo and the checker take RunOptions for this stage
// (tp::train::run_options_t, stage_spec.h).
template <>
struct tp::train::RunOptionsOf<stage09::DistributedDataParallel> {
  using type = stage09::RunOptions;
};
