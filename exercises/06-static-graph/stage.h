// Copied from solutions/06-static-graph/stage.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 06's identity, declared once (tp::train::StageSpec in
// tensorplay/train/stage_spec.h): the title, the options the demo offers
// as flags, and the stage's words in the checker's diagnoses. Its demo
// (lessons/06-static-graph/main.cc), its checker and, where they measure the stage,
// the benchmarks read it.
#pragma once

#include "ddp.h"
#include "tensorplay/train/stage_spec.h"

namespace stage06 {

inline tp::train::StageSpec<Options> stage_spec() {
  tp::train::StageSpec<Options> spec;
  spec.number = "06";
  spec.title = "DDP with rebuilt buckets and static_graph";
  spec.advice.where_sync = "by the gradient hooks of the micro-batch that syncs, bucket by bucket";
  spec.advice.how_sync_runs =
      "inside the backward of the step's last micro-batch (the one whose forward ran outside "
      "no_sync), by the hooks and the end-of-backward callback";
  spec.flags = tp::train::bucket_cap_flags<Options>(
      {tp::train::gradient_as_bucket_view_flag<Options>(), tp::train::static_graph_flag<Options>(),
       tp::train::find_unused_parameters_flag<Options>()});
  return spec;
}

}  // namespace stage06
