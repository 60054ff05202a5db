// Copied from solutions/08-comm-hooks/stage.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 08's identity, declared once (tp::train::StageSpec in
// tensorplay/train/stage_spec.h): the title, the options the demo offers
// as flags, and the stage's words in the checker's diagnoses. Its demo
// (lessons/08-comm-hooks/main.cc), its checker and, where they measure the
// stage, the benchmarks read it.
#pragma once

#include "ddp.h"
#include "default_hooks.h"
#include "powersgd_hook.h"
#include "tensorplay/train/stage_spec.h"

namespace stage08 {

inline tp::train::StageSpec<Options> stage_spec() {
  tp::train::StageSpec<Options> spec;
  spec.number = "08";
  spec.title = "DDP with communication hooks";
  spec.advice.where_sync =
      "by the gradient hooks of the micro-batch that syncs, bucket by bucket, through the comm "
      "hook when one is registered";
  spec.advice.how_sync_runs =
      "inside the backward of the step's last micro-batch: the comm hook (or the default "
      "all-reduce) launched per bucket, its futures waited by the end-of-backward callback";
  spec.flags = tp::train::bucket_cap_flags<Options>(
      {tp::train::gradient_as_bucket_view_flag<Options>(), tp::train::static_graph_flag<Options>(),
       tp::train::find_unused_parameters_flag<Options>()});
  const auto hooks = tp::train::comm_hook_flags<Options>();  // --comm-hook, PowerSGD's knobs
  spec.flags.insert(spec.flags.end(), hooks.begin(), hooks.end());
  // --divide-by-active-ranks (a flag every demo has) sets the plan's divisor;
  // the DDP must divide the same way.
  spec.adapt = [](const tp::train::RunConfig& config, Options& options) {
    options.divide_by_initial_world_size = config.divisor == tp::train::Divisor::InitialWorldSize;
  };
  // allreduce_hook promises the reference's numbers; compression does not.
  spec.approximation = [](const Options& options) -> std::string {
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
  spec.check_plan = [](const tp::train::RunConfig& config, const Options& options) {
    tp::train::check_comm_hook_plan(config, options);
  };
  return spec;
}

}  // namespace stage08
