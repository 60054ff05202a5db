// Stage 08's identity, declared once (tp::train::StageSpec in
// tensorplay/train/stage_spec.h): the title, the options a run takes
// (RunOptions: the DDP's, and the hook to register) and the flags the demo
// offers for them, and the stage's words in the checker's diagnoses; and
// how the kit's trainer registers the built-in hook a run names. Its demo
// (lessons/08-comm-hooks/main.cc), its checker and, where they measure the
// stage, the benchmarks read it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "ddp.h"
#include "default_hooks.h"
#include "powersgd_hook.h"
#include "tensorplay/error.h"
#include "tensorplay/train/stage_spec.h"

namespace stage08 {

// The options of a run of stage 08: the DDP's Options, and what only the
// kit's harness reads. As in PyTorch, a hook is not an argument of the
// DDP's constructor: the trainer calls register_builtin_hook() below right
// after constructing the DDP, with the hook the demo's --comm-hook names.
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
};


// What the kit's trainer calls right after constructing the DDP (the
// capability comm_hooks, found by argument-dependent lookup): registers
// the built-in hook options.comm_hook names ("none" registers nothing), on
// ddp.process_group(). Throws tp::Error for a name it does not know,
// listing the ones it does, and for PowerSGD settings PowerSGDState
// refuses. The harness's, not the DDP's: the DDP only offers
// register_comm_hook, as PyTorch's does.
inline void register_builtin_hook(DistributedDataParallel& ddp, const RunOptions& options) {
  const std::string& name = options.comm_hook;
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
             "stage08: PowerSGD rank ", options.powersgd_rank, " is above every weight's "
             "min(n, m) in this model (the largest is ", largest, "); a rank-", largest,
             " approximation already sends every weight whole");
    PowerSGDOptions powersgd;
    powersgd.matrix_approximation_rank = options.powersgd_rank;
    powersgd.start_powerSGD_iter = options.powersgd_start_iteration;
    powersgd.min_compression_rate = options.powersgd_min_compression_rate;
    ddp.register_comm_hook(std::make_shared<PowerSGDState>(ddp.process_group(), powersgd),
                           powerSGD_hook);
  } else {
    TP_THROW(tp::Error, "stage08: unknown comm hook '", name,
             "'; the built-in ones are none, allreduce, fp16, bf16 and powersgd");
  }
}

inline tp::train::StageSpec<RunOptions> stage_spec() {
  tp::train::StageSpec<RunOptions> spec;
  spec.number = "08";
  spec.title = "DDP with communication hooks";
  spec.advice.where_sync =
      "by the gradient hooks of the micro-batch that syncs, bucket by bucket, through the comm "
      "hook when one is registered";
  spec.advice.how_sync_runs =
      "inside the backward of the step's last micro-batch: the comm hook (or the default "
      "all-reduce) launched per bucket, its futures waited by the end-of-backward callback";
  spec.flags = tp::train::bucket_cap_flags<RunOptions>(
      {tp::train::gradient_as_bucket_view_flag<RunOptions>(),
       tp::train::static_graph_flag<RunOptions>(),
       tp::train::find_unused_parameters_flag<RunOptions>()});
  const auto hooks = tp::train::comm_hook_flags<RunOptions>();  // --comm-hook, PowerSGD's knobs
  spec.flags.insert(spec.flags.end(), hooks.begin(), hooks.end());
  // --divide-by-active-ranks (a flag every demo has) sets the plan's divisor;
  // the DDP must divide the same way.
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
  // A hook plan no rank could run is refused before the ranks start.
  spec.check_plan = [](const tp::train::RunConfig& config, const RunOptions& options) {
    tp::train::check_comm_hook_plan(config, options);
  };
  return spec;
}

}  // namespace stage08

// The trainer, the demo and the checker take RunOptions for this stage
// (tp::train::run_options_t, stage_spec.h).
template <>
struct tp::train::RunOptionsOf<stage08::DistributedDataParallel> {
  using type = stage08::RunOptions;
};
