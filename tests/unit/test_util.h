// Helpers shared by the doctest suites in tests/unit/.
#pragma once

#include <cstdint>
#include <stdexcept>

#include "tensorplay/multiprocessing/spawn.h"

namespace test_util {

// The central difference (f(x + eps) - f(x - eps)) / (2 eps) of objective()
// in element j of a contiguous float64 tensor whose data starts at `data`;
// restores the element afterwards.
template <typename Objective>
double central_difference(double* data, int64_t j, Objective&& objective, double eps = 1e-6) {
  const double saved = data[j];
  data[j] = saved + eps;
  const double plus = objective();
  data[j] = saved - eps;
  const double minus = objective();
  data[j] = saved;
  return (plus - minus) / (2 * eps);
}

// Runs job, which must throw SpawnError, and returns the error.
template <typename Job>
tp::multiprocessing::SpawnError spawn_error_of(Job job) {
  try {
    job();
  } catch (const tp::multiprocessing::SpawnError& e) {
    return e;
  }
  throw std::logic_error("the job did not fail");
}

}  // namespace test_util
