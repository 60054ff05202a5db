// Helpers shared by the doctest suites in tests/unit/.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>

#include "tensorplay/distributed/init.h"
#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/tensor.h"

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

// Runs body(rank) on `world` spawned ranks; the job ends within 60 s.
template <typename Body>
void spawn_ranks(int world, Body body) {
  tp::multiprocessing::SpawnOptions options;
  options.timeout = std::chrono::milliseconds(60000);
  tp::multiprocessing::spawn(options, body, world);
}

// On the default group: rank r contributes r + 1, so the all-reduced sum
// over W ranks is W (W + 1) / 2 in every element. Throws naming the rank.
inline void check_sum(int rank, int world) {
  tp::Tensor t = tp::full({3}, rank + 1.0);
  tp::distributed::all_reduce(t);
  const double expected = world * (world + 1) / 2.0;
  for (double v : t.to_vector()) {
    TP_CHECK_EQ(v, expected, "allreduce SUM on rank ", rank, " of ", world);
  }
}

}  // namespace test_util
