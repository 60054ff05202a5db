// Copied from solutions/01-naive/worker.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 01's rank worker: the program one process of a data-parallel job
// runs, written the way a PyTorch user writes it with torch.distributed.
//
// What it is: the second exercise of lesson 01. ddp.h is the wrapper; this
// is its user: join the process group, seed, build the model, wrap it,
// train, leave. The kit's own trainer (tp::train::train_rank in
// common/tensorplay/train/ddp_trainer.h) does the same with instruments
// attached (counted collectives, traces) and drives every stage; this one
// records only what a plain program has.
//
// Contract of train_worker(rank, config, init_method, options):
//   - It is one rank of a job of config.world_size processes that all call
//     it with the same config, init_method and options.
//   - It joins the default process group ("gloo", rank, config.world_size,
//     init_method; collective timeout config.collective_timeout) and leaves
//     it (destroy_process_group) before returning.
//   - The model is the plan's: make_model(config), built right after seeding
//     the global generator with model_seed_for_rank(config, rank), so that
//     rank 0 builds the reference's model and every rank its own buffers.
//   - It trains config.steps optimizer steps of stage 01's DDP (wrapping the
//     model, with `options`) with SGD at config.lr and config.momentum over
//     the DDP's parameters. Step s: clear the gradients, run this rank's
//     micro-batch micro_batch(dataset, config, rank, s) (dataset built with
//     data_options(config)) through the DDP, mse_loss against its targets,
//     backward, sync_grads(), optimizer step.
//   - It returns this rank's loss at every step (loss.item(), in step order)
//     and, after the last step, snapshot() of the DDP's named parameters
//     and of the model's named buffers.
//   - REQUIRES: config.micro_batches == 1 and even inputs (run_workers in
//     common/tensorplay/train/worker.h refuses other plans).
//   - `./kit check 01` runs it on several ranks and compares every rank's
//     losses, parameters and buffers with the reference trainer;
//     `./kit demo 01 --worker` prints the demo's table for it.
#pragma once

#include <string>

#include "ddp.h"
#include "tensorplay/train/config.h"
#include "tensorplay/train/worker.h"

namespace stage01 {

tp::train::WorkerResult train_worker(int rank, const tp::train::RunConfig& config,
                                     const std::string& init_method, const Options& options);

}  // namespace stage01
