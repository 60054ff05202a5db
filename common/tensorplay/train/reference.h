// The reference trainer: what data-parallel training must compute, in one process.
//
// It walks the plan of config.h: each optimizer step, for each of its K
// micro-steps, every rank still taking part runs its micro-batch in rank
// order; each micro-batch loss is scaled by 1 / (divisor * K) before
// backward, so the accumulated gradient is the mean over the K micro-batches,
// summed over ranks and divided as the plan says; then one SGD step.
// Parameters are one set; buffers are one set per rank (Note [Buffers in the
// reference] in reference.cc). It never communicates, so it is the ground
// truth a DDP stage is compared with: every rank's loss on every micro-batch,
// the parameters after step 0 and at the end, and every rank's buffers.
#pragma once

#include "tensorplay/train/config.h"
#include "tensorplay/train/results.h"

namespace tp::train {

// Throws tp::Error for a plan validate() refuses.
ReferenceResult train_reference(const RunConfig& config);

}  // namespace tp::train
