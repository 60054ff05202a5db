// The synthetic regression data set (see data.h).
//
// Everything here is computed in float64 with plain loops and converted to
// options.dtype once at the end, so a row's values do not depend on which
// batch it was fetched in, on BLAS, or on the tensor ops: rows(5, 1) and the
// sixth row of rows(0, 10) are bit-identical.
#include "tensorplay/data.h"

#include <cmath>
#include <limits>
#include <vector>

#include "tensorplay/random.h"

namespace tp::data {
namespace {

// The seed of row i's own generator: one splitmix64 round over seed ^ (i * phi),
// phi being the 64-bit golden-ratio constant. Multiplying by an odd constant is
// a bijection, so distinct rows get distinct seeds for a given data-set seed;
// the splitmix round spreads neighbouring rows far apart.
uint64_t row_seed(uint64_t seed, int64_t row) {
  uint64_t z = seed ^ (static_cast<uint64_t>(row) * 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

SyntheticRegression::SyntheticRegression(SyntheticRegressionOptions options)
    : options_(options) {
  const auto& o = options_;
  TP_CHECK(o.in_features >= 1 && o.out_features >= 1 && o.teacher_hidden >= 1,
           "tp::data::SyntheticRegression: in_features (", o.in_features,
           "), out_features (", o.out_features, ") and teacher_hidden (", o.teacher_hidden,
           ") must all be >= 1");
  TP_CHECK(std::isfinite(o.noise) && o.noise >= 0,
           "tp::data::SyntheticRegression: noise must be >= 0, got ", o.noise);
  // The teacher: Linear(in, hidden) -> ReLU -> Linear(hidden, out), initialised
  // like tp::nn::Linear (U(-1/sqrt(fan_in), 1/sqrt(fan_in)), weight then bias)
  // but from its own generator, so building a data set never moves the global one.
  Generator g(o.seed);
  const double b1 = 1.0 / std::sqrt(static_cast<double>(o.in_features));
  const double b2 = 1.0 / std::sqrt(static_cast<double>(o.teacher_hidden));
  w1_ = rand_uniform({o.teacher_hidden, o.in_features}, -b1, b1, kFloat64, &g);
  b1_ = rand_uniform({o.teacher_hidden}, -b1, b1, kFloat64, &g);
  w2_ = rand_uniform({o.out_features, o.teacher_hidden}, -b2, b2, kFloat64, &g);
  b2_ = rand_uniform({o.out_features}, -b2, b2, kFloat64, &g);
}

Batch SyntheticRegression::rows(int64_t first, int64_t count) const {
  TP_CHECK(first >= 0, "tp::data::SyntheticRegression::rows: first row ", first,
           " is negative; rows are numbered from 0");
  TP_CHECK(count >= 1, "tp::data::SyntheticRegression::rows: count must be >= 1, got ",
           count);
  TP_CHECK(first <= std::numeric_limits<int64_t>::max() - count,
           "tp::data::SyntheticRegression::rows: rows ", first, " + ", count,
           " overflow int64");
  const int64_t in = options_.in_features;
  const int64_t hid = options_.teacher_hidden;
  const int64_t out = options_.out_features;
  // Teacher weights: contiguous float64, row-major.
  const double* w1 = w1_.data_ptr<double>();  // (hid, in)
  const double* b1 = b1_.data_ptr<double>();  // (hid)
  const double* w2 = w2_.data_ptr<double>();  // (out, hid)
  const double* b2 = b2_.data_ptr<double>();  // (out)

  std::vector<double> xs(static_cast<size_t>(count * in));   // (count, in)
  std::vector<double> ys(static_cast<size_t>(count * out));  // (count, out)
  std::vector<double> h(static_cast<size_t>(hid));
  for (int64_t r = 0; r < count; ++r) {
    // Row i draws, in this order: in_features normals for x, then
    // out_features normals for the noise.
    Generator g(row_seed(options_.seed, first + r));
    double* x = &xs[static_cast<size_t>(r * in)];
    double* y = &ys[static_cast<size_t>(r * out)];
    for (int64_t k = 0; k < in; ++k) x[k] = g.normal();
    // h = relu(w1 x + b1)
    for (int64_t j = 0; j < hid; ++j) {
      double acc = b1[j];
      for (int64_t k = 0; k < in; ++k) acc += w1[j * in + k] * x[k];
      h[static_cast<size_t>(j)] = acc > 0 ? acc : 0.0;
    }
    // y = w2 h + b2 + noise * n
    for (int64_t o = 0; o < out; ++o) {
      double acc = b2[o];
      for (int64_t j = 0; j < hid; ++j) acc += w2[o * hid + j] * h[static_cast<size_t>(j)];
      y[o] = acc;
    }
    for (int64_t o = 0; o < out; ++o) y[o] += options_.noise * g.normal();
  }
  return Batch{tensor(xs, {count, in}, options_.dtype),
               tensor(ys, {count, out}, options_.dtype)};
}

Batch SyntheticRegression::shard(int64_t step, int rank, int world_size,
                                 int64_t batch_size) const {
  constexpr const char* fn = "tp::data::SyntheticRegression::shard: ";
  TP_CHECK(world_size >= 1, fn, "world size must be >= 1, got ", world_size);
  TP_CHECK(rank >= 0 && rank < world_size, fn, "rank ", rank,
           " is out of range for world size ", world_size, "; ranks run from 0 to ",
           world_size - 1);
  TP_CHECK(step >= 0, fn, "step must be >= 0, got ", step);
  TP_CHECK(batch_size >= 1, fn, "batch size must be >= 1, got ", batch_size);
  // At step s, rank r takes rows (s*W + r)*B ... +B-1, so the W
  // micro-batches of one step are consecutive and steps never overlap.
  const int64_t first = (step * world_size + rank) * batch_size;
  return rows(first, batch_size);
}

}  // namespace tp::data
