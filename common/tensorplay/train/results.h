// What a training run reports: per-step losses and parameter snapshots.
//
// Contract:
//   - RankResult is what one DDP rank saw; ReferenceResult is what the
//     single-process reference trainer computed for all ranks at once.
//   - Snapshots hold values as double (exact for float32 and float64) with
//     the parameter's name and shape, in named_parameters() order.
//   - serialize()/parse_rank_result() round-trip a RankResult exactly
//     (hexadecimal floats), which is how ranks send results to the parent
//     through spawn().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensorplay/nn/module.h"
#include "tensorplay/tensor.h"
#include "tensorplay/trace.h"

namespace tp::train {

struct ParamValues {
  std::string name;
  Shape shape;
  std::vector<double> values;
};
using Snapshot = std::vector<ParamValues>;

// Copies every named tensor's values.
Snapshot snapshot(const std::vector<nn::NamedTensor>& named);

struct RankResult {
  int rank = 0;
  std::vector<double> losses;          // [step]: this rank's micro-batch loss
  Snapshot initial_params;             // right after DDP construction
  Snapshot after_first_step;           // after step 0's optimizer step
  Snapshot final_params;               // after the last step
  std::vector<uint64_t> allreduces_per_step;  // collectives issued in each step
  std::vector<uint64_t> broadcasts_per_step;
  uint64_t construction_allreduces = 0;       // issued by the DDP constructor
  uint64_t construction_broadcasts = 0;
  uint64_t construction_allgathers = 0;
  std::vector<trace::Event> events;  // when RunConfig::trace is set
};

struct ReferenceResult {
  std::vector<std::vector<double>> losses;  // [step][rank], unscaled micro-batch loss
  Snapshot initial_params;
  Snapshot after_first_step;
  Snapshot final_params;
};

std::string serialize(const RankResult& result);
// REQUIRES: text came from serialize(); throws tp::Error otherwise.
RankResult parse_rank_result(const std::string& text);

// Euclidean norm over all values of all parameters.
double norm(const Snapshot& snapshot);

}  // namespace tp::train
