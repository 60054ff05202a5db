// Stage 05's identity, declared once (tp::train::StageSpec in
// tensorplay/train/stage_spec.h): the title, the options the demo offers
// as flags, and the stage's words in the checker's diagnoses. Its demo
// (lessons/05-find-unused/main.cc), its checker and, where they measure the stage,
// the benchmarks read it.
#pragma once

#include "ddp.h"
#include "tensorplay/train/stage_spec.h"

namespace stage05 {

inline tp::train::StageSpec<Options> stage_spec() {
  tp::train::StageSpec<Options> spec;
  spec.number = "05";
  spec.title = "DDP with find_unused_parameters";
  spec.advice.where_sync =
      "by the gradient hooks of the micro-batch that syncs, bucket by bucket, and given back to "
      ".grad at the end of backward wherever the used-map's count is not 0";
  spec.advice.how_sync_runs =
      "inside the backward of the step's last micro-batch (the one whose forward ran outside "
      "no_sync), by the hooks and the end-of-backward callback";
  spec.flags =
      tp::train::bucket_cap_flags<Options>({tp::train::gradient_as_bucket_view_flag<Options>(),
                                            tp::train::find_unused_parameters_flag<Options>()});
  return spec;
}

}  // namespace stage05
