// Copied from solutions/07-join/stage.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 07's identity, declared once (tp::train::StageSpec in
// tensorplay/train/stage_spec.h): the title, the options the demo offers
// as flags, and the stage's words in the checker's diagnoses. Its demo
// (lessons/07-join/main.cc), its checker and, where they measure the stage,
// the benchmarks read it.
#pragma once

#include "ddp.h"
#include "tensorplay/train/stage_spec.h"

namespace stage07 {

inline tp::train::StageSpec<Options> stage_spec() {
  tp::train::StageSpec<Options> spec;
  spec.number = "07";
  spec.title = "DDP with join() for uneven inputs";
  spec.advice.where_sync = "by the gradient hooks of the micro-batch that syncs, bucket by bucket";
  spec.advice.how_sync_runs =
      "inside the backward of the step's last micro-batch, by the hooks and the "
      "end-of-backward callback";
  spec.flags = tp::train::bucket_cap_flags<Options>(
      {tp::train::gradient_as_bucket_view_flag<Options>(), tp::train::static_graph_flag<Options>(),
       tp::train::find_unused_parameters_flag<Options>()});
  // --divide-by-active-ranks (a flag every demo has) sets the plan's divisor;
  // the DDP must divide the same way.
  spec.adapt = [](const tp::train::RunConfig& config, Options& options) {
    options.divide_by_initial_world_size = config.divisor == tp::train::Divisor::InitialWorldSize;
  };
  return spec;
}

}  // namespace stage07
