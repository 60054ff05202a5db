// The reference trainer: what data-parallel training must compute, in one process.
//
// Each step it walks every rank's micro-batch in rank order, scales each
// micro-batch loss by 1/W before backward (so the accumulated gradient is the
// mean over ranks), then takes one SGD step. It never communicates, so it is
// the ground truth a DDP stage is compared with: every rank's loss at every
// step, and the parameters after step 0 and at the end.
#pragma once

#include "tensorplay/train/config.h"
#include "tensorplay/train/results.h"

namespace tp::train {

// REQUIRES: config.world_size >= 1, steps >= 1, batch_size >= 1.
ReferenceResult train_reference(const RunConfig& config);

}  // namespace tp::train
