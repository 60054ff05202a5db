// A lesson's own rank worker, run as a whole job and judged by its results.
//
// The kit's trainer (ddp_trainer.h) drives every stage and records what the
// checker needs: counted collectives, snapshots, traces. A student's worker
// is the plain program one process of a data-parallel job runs (join the
// group, seed, build, wrap, train, leave), written the way a PyTorch user
// writes it. It records only what such a program naturally has: its loss at
// every step and its final parameters and buffers. Lesson 01 has the student
// write one (solutions/01-naive/worker.h states its contract).
//
// Contract:
//   - A Worker is one rank's whole job: worker(rank, init_method) must join
//     the process group of config.world_size ranks at `init_method` (a
//     file:// rendezvous), train, leave the group, and return its
//     WorkerResult. Every rank calls it with the same init_method.
//   - run_workers() spawns config.world_size processes, each running the
//     worker on a fresh rendezvous, and returns their results in rank order.
//     A rank's exception, crash or hang comes back as
//     tp::multiprocessing::SpawnError naming the rank (a job in which no rank
//     makes progress for config.job_timeout is a hang).
//   - check_workers() compares them with the reference trainer for the same
//     plan: every rank's loss at every step, its final parameters and its
//     final buffers. It returns no finding when all match within
//     `tolerance`, else one finding: the first thing that differs (a
//     missing loss, then the first (step, rank) whose loss differs, then the
//     parameters, then the buffers), with the likely cause in terms of the
//     worker's parts.
//   - Plans with gradient accumulation or uneven inputs are beyond a plain
//     worker: run_workers() throws tp::Error for them before spawning.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tensorplay/train/compare.h"
#include "tensorplay/train/config.h"
#include "tensorplay/train/results.h"

namespace tp::train {

// What one rank's worker reports.
struct WorkerResult {
  std::vector<double> losses;  // [step]: this rank's loss at that step (loss.item())
  Snapshot parameters;         // snapshot(named_parameters()) after the last step
  Snapshot buffers;            // snapshot(the module's named_buffers()) after the last step
};

// One rank's whole job (see the contract).
using Worker = std::function<WorkerResult(int rank, const std::string& init_method)>;

// A lesson's rank worker with its stage's options (lesson 01's
// train_worker): what the demo's --worker and the checker's worker cases run.
template <typename Options>
using RankWorker = std::function<WorkerResult(int rank, const RunConfig& config,
                                              const std::string& init_method,
                                              const Options& options)>;

// Runs config.world_size ranks of `worker`; results in rank order.
std::vector<WorkerResult> run_workers(const RunConfig& config, const Worker& worker);

// A worker's result as the RankResult that compare() and the demo's table
// read: rank, losses, final parameters and buffers; everything a worker does
// not record (snapshots before the end, collective counts) stays empty.
RankResult as_rank_result(int rank, const WorkerResult& result);

// No finding when every rank matches `reference`; else the first difference.
std::vector<Finding> check_workers(const RunConfig& config, const ReferenceResult& reference,
                                   const std::vector<WorkerResult>& ranks, double tolerance);

}  // namespace tp::train
