// The kit's random numbers: xoshiro256** for bits, splitmix64 for seeding,
// and uniform/normal written here so every standard library gives the same
// values (std::normal_distribution does not: libstdc++ and libc++ differ).
//
// Reproducibility note: the bit stream and uniform() are pure integer and
// exact-double arithmetic, identical everywhere. normal() also calls
// std::log, std::sqrt, std::cos and std::sin; sqrt is exact by IEEE 754, and
// the others agree between runs and processes on one machine (which is what
// the checkers compare), though two different libm versions could in
// principle differ in the last bit.
#include "tensorplay/random.h"

#include <cmath>
#include <numbers>

namespace tp {
namespace {

// splitmix64 (Steele, Lea, Flood 2014): turns any 64-bit seed, even 0, into
// well-mixed state words. Advances *x and returns the next output.
uint64_t splitmix64(uint64_t* x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Generator::Generator(uint64_t seed) { this->seed(seed); }

void Generator::seed(uint64_t seed) {
  // The four state words come from consecutive splitmix64 outputs, as the
  // xoshiro authors recommend; they are never all zero.
  uint64_t x = seed;
  for (uint64_t& word : s_) word = splitmix64(&x);
  // A cached normal from the old seed must not leak into the new sequence.
  has_spare_ = false;
  spare_ = 0.0;
}

// xoshiro256** 1.0 (Blackman and Vigna, 2018), transcribed from the
// reference implementation at prng.di.unimi.it.
uint64_t Generator::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Generator::uniform() {
  // The top 53 bits make an integer k in [0, 2^53); k * 2^-53 is exact in a
  // double and lies in [0, 1).
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

double Generator::normal() {
  // Box-Muller: two uniforms give two independent standard normals,
  //   r = sqrt(-2 ln u1), theta = 2 pi u2,  z0 = r cos theta, z1 = r sin theta.
  // We return z0 and keep z1 for the next call.
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // 1 - uniform() lies in (0, 1], so the log is finite.
  const double u1 = 1.0 - uniform();
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * std::numbers::pi * u2;
  spare_ = r * std::sin(theta);
  has_spare_ = true;
  return r * std::cos(theta);
}

Generator& default_generator() {
  // Seed 0 until manual_seed is called, so even an unseeded program is
  // reproducible.
  static Generator generator(0);
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().seed(seed); }

namespace {

// Fills a fresh contiguous tensor in row-major order with sample(gen).
// Values are computed in double and rounded once when stored as float32 (or
// converted to a 16-bit dtype), so such a tensor holds exactly the rounded
// float64 one.
template <typename Sample>
Tensor fill_with(const Shape& shape, Dtype dtype, Generator* gen, Sample sample) {
  if (is_16bit(dtype)) return fill_with(shape, kFloat64, gen, sample).to(dtype);
  Generator& g = gen != nullptr ? *gen : default_generator();
  Tensor out = empty(shape, dtype);
  const int64_t n = out.numel();
  if (dtype == kFloat32) {
    float* p = out.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(sample(g));
  } else {
    double* p = out.data_ptr<double>();
    for (int64_t i = 0; i < n; ++i) p[i] = sample(g);
  }
  return out;
}

}  // namespace

Tensor randn(const Shape& shape, Dtype dtype, Generator* gen) {
  return fill_with(shape, dtype, gen, [](Generator& g) { return g.normal(); });
}

Tensor rand_uniform(const Shape& shape, double low, double high, Dtype dtype,
                    Generator* gen) {
  TP_CHECK(low < high, "tp::rand_uniform: the range [", low, ", ", high,
           ") is empty; pass low < high");
  const double width = high - low;
  return fill_with(shape, dtype, gen,
                   [low, width](Generator& g) { return low + width * g.uniform(); });
}

}  // namespace tp
