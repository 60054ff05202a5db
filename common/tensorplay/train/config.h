// What one training run is: model, data, optimizer, world size, seeds.
//
// The reference trainer and every DDP stage read the same RunConfig, so a
// checker can run both and compare them number for number.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "tensorplay/data.h"
#include "tensorplay/nn/models.h"

namespace tp::train {

struct RunConfig {
  int world_size = 4;
  int64_t steps = 8;
  int64_t batch_size = 8;  // rows per rank per step (the micro-batch)
  double lr = 0.05;
  double momentum = 0.0;
  Dtype dtype = kFloat32;  // of the model and the data
  // Rank 0 seeds the global generator with model_seed before building the
  // model; the reference trainer does the same, so it starts from rank 0's
  // parameters.
  uint64_t model_seed = 1234;
  // Test the broadcast: rank r seeds with model_seed + r * 7919, so ranks
  // build different models and only DDP's broadcast from rank 0 makes them
  // agree (and agree with the reference).
  bool per_rank_seed = false;
  // Record a tp::trace timeline on every rank (forward, backward, sync,
  // collectives) and return it in RankResult::events.
  bool trace = false;
  nn::MiniMLPOptions model;
  data::SyntheticRegressionOptions data;
  // Deadline of one collective (a skipped collective becomes an error naming
  // the rank and the collective) and of the whole job. The kit's collectives
  // move a few kilobytes and take milliseconds even on a loaded 2-core
  // machine, so 10 s only ever expires on a real hang.
  std::chrono::milliseconds collective_timeout{10000};
  std::chrono::milliseconds job_timeout{120000};
};

// The seed rank `rank` uses before building its model.
uint64_t model_seed_for_rank(const RunConfig& config, int rank);

// model and data options with config.dtype applied.
nn::MiniMLPOptions model_options(const RunConfig& config);
data::SyntheticRegressionOptions data_options(const RunConfig& config);

// "W=4 steps=8 batch=8 lr=0.05 float32 per-rank seeds", for messages.
std::string describe(const RunConfig& config);

}  // namespace tp::train
