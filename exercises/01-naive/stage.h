// Copied from solutions/01-naive/stage.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 01's identity, declared once (tp::train::StageSpec in
// tensorplay/train/stage_spec.h): the title, the options the demo offers
// as flags, and the stage's words in the checker's diagnoses. Its demo
// (lessons/01-naive/main.cc), its checker and, where they measure the stage,
// the benchmarks read it.
#pragma once

#include "ddp.h"
#include "tensorplay/train/stage_spec.h"

namespace stage01 {

inline tp::train::StageSpec<Options> stage_spec() {
  tp::train::StageSpec<Options> spec;
  spec.number = "01";
  spec.title = "naive DDP, one all-reduce per parameter after backward";
  spec.advice.where_sync = "in sync_grads()";
  spec.advice.how_sync_runs = "by sync_grads() after loss.backward(), on every rank";
  tp::train::OptionFlag<Options> keep_buffers = tp::train::switch_flag(
      "--no-broadcast-buffers", &Options::broadcast_buffers,
      "keep each rank's own buffers (try it with --model buffered)", /*switch_to=*/false);
  // The reference must keep each rank's buffers too, or it would disagree
  // with a DDP that does what it is told.
  keep_buffers.plan = [](tp::train::RunConfig& config) {
    config.buffer_sync = tp::train::BufferSync::None;
  };
  spec.flags = {keep_buffers};
  return spec;
}

}  // namespace stage01
