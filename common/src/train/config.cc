// RunConfig helpers.
#include "tensorplay/train/config.h"

#include "tensorplay/error.h"

namespace tp::train {

uint64_t model_seed_for_rank(const RunConfig& config, int rank) {
  // 7919 (a prime) keeps per-rank seeds far apart and never equal to rank 0's.
  return config.per_rank_seed ? config.model_seed + 7919ull * static_cast<uint64_t>(rank)
                              : config.model_seed;
}

nn::MiniMLPOptions model_options(const RunConfig& config) {
  nn::MiniMLPOptions options = config.model;
  options.dtype = config.dtype;
  return options;
}

data::SyntheticRegressionOptions data_options(const RunConfig& config) {
  data::SyntheticRegressionOptions options = config.data;
  options.dtype = config.dtype;
  options.in_features = config.model.in_features;
  options.out_features = config.model.out_features;
  return options;
}

std::string describe(const RunConfig& config) {
  return detail::cat("W=", config.world_size, " steps=", config.steps,
                     " batch=", config.batch_size, " lr=", config.lr,
                     config.momentum > 0 ? detail::cat(" momentum=", config.momentum) : "",
                     " ", to_string(config.dtype),
                     config.per_rank_seed ? " per-rank seeds" : " shared seed");
}

}  // namespace tp::train
