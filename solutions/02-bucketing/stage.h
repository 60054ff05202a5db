// Stage 02's identity, declared once (tp::train::StageSpec in
// tensorplay/train/stage_spec.h): the title, the options the demo offers
// as flags, and the stage's words in the checker's diagnoses. Its demo
// (lessons/02-bucketing/main.cc), its checker and, where they measure the stage,
// the benchmarks read it.
#pragma once

#include "ddp.h"
#include "tensorplay/train/stage_spec.h"

namespace stage02 {

inline tp::train::StageSpec<Options> stage_spec() {
  tp::train::StageSpec<Options> spec;
  spec.number = "02";
  spec.title = "bucketed DDP, one all-reduce per bucket after backward";
  spec.advice.where_sync = "in sync_grads(), bucket by bucket";
  spec.advice.how_sync_runs = "by sync_grads() after loss.backward(), on every rank";
  spec.advice.where_grads_move =
      "copied into their own slots and back (a slot starts where the one before it in its "
      "bucket ends, and is as long as its parameter: no two overlap)";
  spec.flags = tp::train::bucket_cap_flags<Options>();
  return spec;
}

}  // namespace stage02
