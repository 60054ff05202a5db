// Exercise generated from solutions/01-naive/worker.cc by tools/gen_exercise.py.
// Fill in each EXERCISE, then run ./kit check 01. ./kit reset 01 restores this file.
// Stage 01's rank worker: one process of a data-parallel job, from joining
// the group to leaving it. See worker.h for the contract and
// lessons/01-naive/README.md ("What to build") for the why.
#include "worker.h"

#include "tensorplay/data.h"
#include "tensorplay/distributed/init.h"
#include "tensorplay/error.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"

namespace stage01 {

namespace dist = tp::distributed;
using tp::Tensor;
using tp::train::RunConfig;
using tp::train::WorkerResult;

// (The parameters are [[maybe_unused]] only for the exercise's stub.)
WorkerResult train_worker([[maybe_unused]] int rank, [[maybe_unused]] const RunConfig& config,
                          [[maybe_unused]] const std::string& init_method,
                          [[maybe_unused]] const Options& options) {
  // EXERCISE: be one rank of the job (worker.h is the contract). Join the
  // process group; seed, then build the plan's model; wrap it in your DDP;
  // train config.steps steps on this rank's own micro-batches, averaging
  // the gradients between backward and the optimizer step; record every
  // step's loss and, at the end, the parameters and buffers; leave the
  // group. Every rank runs this same code: only `rank` tells them apart.
  // The calls you need are declared in the headers included above; the
  // kit's README shows most of them in its API tour (one step, one model).
  throw tp::NotImplemented("stage 01: train_worker is not implemented yet (exercises/01-naive/worker.cc)");
}

}  // namespace stage01
