// What the checkers' scenarios train: a rank's rows of data, and a model
// whose parameter use the scenario chooses. Included by check_NN.cc and
// no_sync_scenarios.h.
#pragma once

#include <memory>

#include "tensorplay/data.h"
#include "tensorplay/nn/linear.h"
#include "tensorplay/nn/module.h"
#include "tensorplay/ops.h"
#include "tensorplay/train/config.h"

namespace scenario_models {

// This rank's 8 rows of the default plan's data set (16 features, 4
// targets).
inline tp::data::Batch rows_of(int rank) {
  const tp::train::RunConfig plan;
  return tp::data::SyntheticRegression(tp::train::data_options(plan)).rows(rank * 8, 8);
}

// Heads a and b on one input (16 -> 4 each); `mode` picks a (0), b (1) or
// both, summed (2). With `spare`, a third head c that forward never uses.
// Parameters, in order: a.weight, a.bias, b.weight, b.bias (, c.weight,
// c.bias).
class Forked : public tp::nn::Module {
 public:
  explicit Forked(bool spare = false) {
    a = register_module("a", std::make_shared<tp::nn::Linear>(16, 4));
    b = register_module("b", std::make_shared<tp::nn::Linear>(16, 4));
    if (spare) c = register_module("c", std::make_shared<tp::nn::Linear>(16, 4));
  }
  tp::Tensor forward(const tp::Tensor& x) override {
    if (mode == 0) return a->forward(x);
    if (mode == 1) return b->forward(x);
    return tp::add(a->forward(x), b->forward(x));
  }
  int mode = 2;
  std::shared_ptr<tp::nn::Linear> a, b, c;
};

}  // namespace scenario_models
