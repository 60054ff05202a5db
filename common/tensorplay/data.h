// The kit's one data set: synthetic regression from a fixed teacher network.
//
// Contract:
//   - Row i of the data set is a pure function of (seed, i): x_i ~ N(0, I)
//     drawn from a generator seeded with (seed, i), y_i = teacher(x_i) +
//     noise * N(0, I). Any process computes any row without talking to the
//     others, so every rank sees the same data set.
//   - The teacher is Linear(in, hidden) -> ReLU -> Linear(hidden, out), with
//     weights drawn from its own generator seeded by `seed` (the global
//     generator is never touched).
//   - Sharding: at step s with world size W and per-rank batch B, rank r
//     takes rows (s*W + r)*B ... (s*W + r)*B + B - 1. The training plan
//     (tensorplay/train/config.h) calls "step" here the micro-batch number,
//     and the reference trainer walks the same shards in rank order.
#pragma once

#include <cstdint>

#include "tensorplay/tensor.h"

namespace tp::data {

struct SyntheticRegressionOptions {
  int64_t in_features = 16;
  int64_t out_features = 4;
  int64_t teacher_hidden = 8;
  double noise = 0.05;
  uint64_t seed = 2024;
  Dtype dtype = kFloat32;
};

struct Batch {
  Tensor x;  // (count, in_features)
  Tensor y;  // (count, out_features)
};

class SyntheticRegression {
 public:
  explicit SyntheticRegression(SyntheticRegressionOptions options = {});
  // Rows first .. first + count - 1. REQUIRES: first >= 0, count >= 1.
  Batch rows(int64_t first, int64_t count) const;
  // Rank `rank`'s micro-batch at `step`. REQUIRES: 0 <= rank < world_size.
  Batch shard(int64_t step, int rank, int world_size, int64_t batch_size) const;
  const SyntheticRegressionOptions& options() const { return options_; }

 private:
  SyntheticRegressionOptions options_;
  Tensor w1_, b1_, w2_, b2_;  // teacher, float64
};

}  // namespace tp::data
