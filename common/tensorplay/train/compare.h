// Comparing a DDP run with the reference, and saying what went wrong.
//
// Contract:
//   - compare() measures, over every rank: the largest |loss difference| at
//     any (step, rank), the largest |parameter difference| against the
//     reference (initial, after step 0, final), and the largest difference
//     between any two ranks' final parameters.
//   - diagnose() returns an empty list when the run matches within
//     `tolerance`, else one Finding per failed check, first the most basic
//     ("ranks start from different parameters") and last the downstream
//     symptoms. A Finding names the step, rank, parameter, the max difference,
//     the first values, and the likely cause in lesson terms.
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
  int rank = -1;        // the DDP rank (-1 when comparing ranks among themselves)
};

struct Comparison {
  double max_loss_diff = 0.0;  // over every (step, rank)
  int64_t loss_step = -1;      // where it occurred
  int loss_rank = -1;
  int64_t first_bad_step = -1;  // first step whose loss differs beyond tolerance
  ParamDiff initial;            // initial params vs the reference's
  ParamDiff after_first_step;   // after step 0's update vs the reference's
  ParamDiff final_params;       // final params vs the reference's
  ParamDiff initial_between_ranks;  // largest rank-vs-rank-0 difference at start
  ParamDiff final_between_ranks;    // ... at the end
  double reference_norm = 0.0;  // of the reference's final parameters
  double rank0_norm = 0.0;      // of rank 0's final parameters
};

// A tolerance for each dtype; see Note [Tolerance] in compare.cc.
double default_tolerance(Dtype dtype);

// REQUIRES: ranks has config.world_size entries with matching step counts.
Comparison compare(const ReferenceResult& reference,
                   const std::vector<RankResult>& ranks, double tolerance);

struct Finding {
  std::string what;          // the measured fact, with numbers
  std::string likely_cause;  // in lesson terms
};

// Empty when everything matches within tolerance.
std::vector<Finding> diagnose(const RunConfig& config, const ReferenceResult& reference,
                              const std::vector<RankResult>& ranks, double tolerance);

// Findings as an indented, readable block.
std::string format_findings(const std::vector<Finding>& findings);

}  // namespace tp::train
