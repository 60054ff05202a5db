// Copied from solutions/03-overlap/stage.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 03's identity, declared once (tp::train::StageSpec in
// tensorplay/train/stage_spec.h): the title, the options the demo offers
// as flags, and the stage's words in the checker's diagnoses. Its demo
// (lessons/03-overlap/main.cc), its checker and, where they measure the stage,
// the benchmarks read it.
#pragma once

#include "ddp.h"
#include "tensorplay/train/stage_spec.h"

namespace stage03 {

inline tp::train::StageSpec<Options> stage_spec() {
  tp::train::StageSpec<Options> spec;
  spec.number = "03";
  spec.title = "DDP overlapping bucket all-reduces with backward";
  spec.advice.where_sync = "by the gradient hooks, bucket by bucket";
  spec.advice.how_sync_runs =
      "inside loss.backward(), by the hooks and the end-of-backward callback";
  spec.flags =
      tp::train::bucket_cap_flags<Options>({tp::train::gradient_as_bucket_view_flag<Options>()});
  return spec;
}

}  // namespace stage03
