// Random numbers that are bit-identical on every machine and standard library.
//
// Contract:
//   - Generator is xoshiro256** seeded through splitmix64; uniform() and
//     normal() are written here (normal is Box-Muller on the kit's own
//     uniforms) because std:: distributions differ between standard
//     libraries. Same seed -> same sequence, in every process.
//   - One global generator, set by tp::manual_seed, feeds parameter init and
//     randn/rand when no generator is passed. It is not thread-safe: use it
//     from one thread (the rank's main thread).
#pragma once

#include <cstdint>

#include "tensorplay/tensor.h"

namespace tp {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0);
  void seed(uint64_t seed);
  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  // Standard normal (mean 0, variance 1).
  double normal();

 private:
  uint64_t s_[4];
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// The process-wide generator.
Generator& default_generator();
// Reseeds the process-wide generator, like torch.manual_seed.
void manual_seed(uint64_t seed);

// Standard normal samples, row-major fill order.
Tensor randn(const Shape& shape, Dtype dtype = kFloat32, Generator* gen = nullptr);
// Uniform samples in [low, high), row-major fill order.
Tensor rand_uniform(const Shape& shape, double low, double high,
                    Dtype dtype = kFloat32, Generator* gen = nullptr);

}  // namespace tp
