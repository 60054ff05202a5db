// Comparing a DDP run with the reference, and saying what went wrong.
//
// Contract:
//   - compare() measures, over every rank: the largest |loss difference| at
//     any (step, rank), the largest |parameter difference| against the
//     reference (initial, after step 0, final), and the largest difference
//     between any two ranks' final parameters.
//   - diagnose() returns an empty list when the run matches within
//     `tolerance`, else the findings of the earliest symptom in the run's
//     order ("ranks start from different parameters" before a wrong update,
//     a wrong step 0 before later steps), since what follows it is a
//     consequence; only a wrong later step reports up to three findings
//     (losses, final parameters, final buffers). See Note [Diagnosis order]
//     in compare.cc. A Finding names the step, rank, parameter, the max
//     difference, the first values, and the likely cause in lesson terms.
#pragma once

#include <string>
#include <vector>

#include "tensorplay/train/config.h"
#include "tensorplay/train/results.h"

namespace tp::train {

// Where two snapshots differ most.
struct ParamDiff {
  double max_abs = 0.0;
  std::string name;     // parameter with the largest difference
  int64_t element = 0;  // its flat index
  int rank = -1;        // the DDP rank the snapshot came from
};

struct Comparison {
  double max_loss_diff = 0.0;  // over every (micro-batch, rank)
  int64_t loss_index = -1;     // where it occurred: the micro-batch number ...
  int loss_rank = -1;          // ... on this rank
  int64_t first_bad_index = -1;  // first micro-batch whose loss differs beyond tolerance
  ParamDiff initial;            // initial params vs the reference's
  ParamDiff after_first_step;   // after step 0's update vs the reference's
  ParamDiff final_params;       // final params vs the reference's
  ParamDiff initial_between_ranks;  // largest rank-vs-rank-0 difference at start
  ParamDiff final_between_ranks;    // ... at the end
  ParamDiff final_buffers;          // each rank's final buffers vs the reference's for it
  double reference_norm = 0.0;  // of the reference's final parameters
  double rank0_norm = 0.0;      // of rank 0's final parameters
};

// A tolerance for each dtype; see Note [Tolerance] in compare.cc.
double default_tolerance(Dtype dtype);

// Compares whatever each rank reported (ragged results included); run
// check_results_complete() first to know the numbers mean something.
Comparison compare(const ReferenceResult& reference,
                   const std::vector<RankResult>& ranks, double tolerance);

struct Finding {
  std::string what;          // the measured fact, with numbers
  std::string likely_cause;  // in lesson terms
};

// A stage's words for its own parts, so that the diagnosis in common/ speaks
// the stage's lesson. Each completes a sentence given beside it.
struct Advice {
  // "is every gradient all-reduced ___?": where the stage averages gradients.
  std::string where_sync = "after backward";
  // "are gradients averaged ___?", asked when every rank kept its own
  // gradient: how the stage is meant to be triggered.
  std::string how_sync_runs = "after loss.backward(), on every rank";
  // "only fc3.bias, fc1.bias were updated wrongly while the other parameters
  // match the reference: are their gradients ___?", asked when the ranks
  // agree: where the stage moves a gradient, so that it can land wrong.
  std::string where_grads_move = "all-reduced and divided like the others";
  // "the first wrong update is step 2's, the first step with fewer ranks
  // training: is the summed gradient divided by what the plan asks, and
  // ___?": what a rank that ran out must keep doing.
  std::string after_a_rank_joins = "do the ranks that ran out add zeros to every bucket";
};

// Findings when the results are not what the plan says: a rank missing, a
// micro-batch count, a parameter or buffer list that differs from the
// model's. Numbers of such results mean nothing; diagnose() starts here too.
std::vector<Finding> check_results_complete(const RunConfig& config,
                                            const ReferenceResult& reference,
                                            const std::vector<RankResult>& ranks);

// Empty when everything matches within tolerance.
std::vector<Finding> diagnose(const RunConfig& config, const ReferenceResult& reference,
                              const std::vector<RankResult>& ranks, double tolerance,
                              const Advice& advice = {});

// Findings as an indented, readable block.
std::string format_findings(const std::vector<Finding>& findings);

}  // namespace tp::train
