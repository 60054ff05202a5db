// tp::Half and tp::BFloat16 (half.h), and the 16-bit tensors built on them:
// conversions checked exhaustively over the 65536 bit patterns, against
// GCC's own _Float16 where the compiler has it, and against closed forms
// for the ties; then what a 16-bit tensor can do (convert, fill, view,
// scale, read) and what it refuses (compute, CUDA), with the messages.
//
// The collectives on 16-bit tensors are in test_collectives.cc.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../../common/src/half_bulk.h"  // private: which path the bulk conversion takes
#include "tensorplay/half.h"
#include "tensorplay/ops.h"
#include "tensorplay/tensor.h"

using doctest::Contains;
using tp::BFloat16;
using tp::Half;
using tp::Tensor;

namespace {

using Values = std::vector<double>;

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float float_of(uint32_t bits) { return std::bit_cast<float>(bits); }

bool is_half_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool is_bfloat16_nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

// Float inputs that probe every rounding decision of float -> Half: for
// each Half value h below infinity and the next one up, the midpoint
// between them (a tie), the floats on either side of it, and the floats on
// either side of h itself; then every 4099th float bit pattern (a prime
// stride, so every exponent and many mantissa patterns), and the named
// boundaries. Both signs.
std::vector<float> half_probe_floats() {
  std::vector<float> probes;
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const float lo = static_cast<float>(Half::from_bits(static_cast<uint16_t>(h)));
    const float hi = h + 1 == 0x7c00u ? 65536.0f  // where the next value would be
                                      : static_cast<float>(Half::from_bits(static_cast<uint16_t>(h + 1)));
    const float tie = (lo + hi) / 2;  // exact: a float has 13 bits to spare
    for (float f : {tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 1e30f), lo,
                    std::nextafter(lo, 1e30f), std::nextafter(lo, 0.0f)}) {
      probes.push_back(f);
      probes.push_back(-f);
    }
  }
  for (uint64_t x = 0; x <= 0xffffffffu; x += 4099) probes.push_back(float_of(static_cast<uint32_t>(x)));
  for (float f : {65504.0f, 65519.99f, std::nextafter(65520.0f, 0.0f), 65520.0f, 65536.0f,
                  0x1p-24f, 0x1p-25f, std::nextafter(0x1p-25f, 1.0f), 0x1p-14f,
                  0x1p-14f - 0x1p-25f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()}) {
    probes.push_back(f);
    probes.push_back(-f);
  }
  return probes;
}

}  // namespace

// ---- Half <-> float -------------------------------------------------------------

// Compile-time checks: the conversions are constexpr.
static_assert(Half(1.0f).bits == 0x3c00);
static_assert(Half(-2.0f).bits == 0xc000);
static_assert(Half(65504.0f).bits == 0x7bff);
static_assert(static_cast<float>(Half::from_bits(0x0001)) == 0x1p-24f);
static_assert(BFloat16(1.0f).bits == 0x3f80);
static_assert(static_cast<float>(BFloat16::from_bits(0xc040)) == -3.0f);

TEST_CASE("every one of the 65536 float16 bit patterns survives float16 -> float -> float16") {
  int mismatches = 0;
  std::string first;
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f = static_cast<float>(Half::from_bits(bits));
    const uint16_t back = Half(f).bits;
    // A NaN stays a NaN (a quiet one keeps its bits; a signalling one is
    // quieted, as hardware does); everything else comes back bit for bit.
    const bool ok = is_half_nan(bits)
                        ? std::isnan(f) && is_half_nan(back) && (back == (bits | 0x200u))
                        : back == bits;
    if (!ok && mismatches++ == 0) first = std::to_string(h) + " -> " + std::to_string(back);
  }
  CHECK_MESSAGE(mismatches == 0, "first mismatch: ", first);
}

TEST_CASE("float16 -> float agrees with GCC's _Float16 for every bit pattern") {
#ifdef __FLT16_MAX__
  int mismatches = 0;
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float mine = static_cast<float>(Half::from_bits(bits));
    const auto gcc = static_cast<float>(std::bit_cast<_Float16>(bits));
    const bool same = std::isnan(gcc) ? std::isnan(mine) : bits_of(mine) == bits_of(gcc);
    if (!same) ++mismatches;
  }
  CHECK(mismatches == 0);
#else
  MESSAGE("skipped: this compiler has no _Float16 (__FLT16_MAX__ undefined)");
#endif
}

TEST_CASE("float -> float16 rounds as GCC's _Float16 does, over ties, boundaries and a sweep") {
#ifdef __FLT16_MAX__
  const std::vector<float> probes = half_probe_floats();
  REQUIRE(probes.size() > 1000000);
  int mismatches = 0;
  std::string first;
  for (float f : probes) {
    const uint16_t mine = Half(f).bits;
    const auto gcc = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    const bool same = std::isnan(f) ? is_half_nan(mine) : mine == gcc;
    if (!same && mismatches++ == 0) {
      first = "float bits " + std::to_string(bits_of(f)) + ": kit " + std::to_string(mine) +
              ", gcc " + std::to_string(gcc);
    }
  }
  CHECK_MESSAGE(mismatches == 0, "first mismatch: ", first);
#else
  MESSAGE("skipped: this compiler has no _Float16 (__FLT16_MAX__ undefined)");
#endif
}

TEST_CASE("float -> float16 rounds to nearest with ties to even, by closed forms") {
  const auto half_bits = [](float f) { return Half(f).bits; };
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10 (0x3c01): the even one is 1.
  CHECK(half_bits(1.0f + 0x1p-11f) == 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  CHECK(half_bits(1.0f + 3 * 0x1p-11f) == half_bits(1.0f + 0x1p-9f));
  CHECK(half_bits(1.0f + 0x1p-9f) == 0x3c02);
  // Off a tie by one float ulp: the nearer neighbour.
  CHECK(half_bits(std::nextafter(1.0f + 0x1p-11f, 2.0f)) == 0x3c01);
  // The top: 65504 is the largest Half; 65520 is the tie with 65536 and
  // goes to the even one, infinity; just below it stays 65504.
  CHECK(half_bits(65504.0f) == 0x7bff);
  CHECK(half_bits(65519.99f) == 0x7bff);
  CHECK(half_bits(65520.0f) == 0x7c00);
  CHECK(half_bits(-65520.0f) == 0xfc00);
  CHECK(half_bits(1e10f) == 0x7c00);
  // The bottom: 2^-25 is the tie between 0 and 2^-24 and goes to 0; just
  // above it, 2^-24. 1.5 * 2^-24 ties between subnormals 1 and 2: 2.
  CHECK(half_bits(0x1p-25f) == 0x0000);
  CHECK(half_bits(-0x1p-25f) == 0x8000);
  CHECK(half_bits(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
  CHECK(half_bits(1.5f * 0x1p-24f) == 0x0002);
  CHECK(half_bits(2.5f * 0x1p-24f) == 0x0002);
  // The largest subnormal (1023 * 2^-24) and the smallest normal (2^-14)
  // tie at 1023.5 * 2^-24, which goes up to the even 0x0400.
  CHECK(half_bits(1023.5f * 0x1p-24f) == 0x0400);
  CHECK(half_bits(1023.0f * 0x1p-24f) == 0x03ff);
  // NaN stays NaN, even one whose payload lies only in the dropped bits.
  CHECK(is_half_nan(half_bits(std::numeric_limits<float>::quiet_NaN())));
  CHECK(is_half_nan(half_bits(float_of(0x7f800001u))));
  CHECK(half_bits(-0.0f) == 0x8000);
}

TEST_CASE("double -> float16 rounds once, where rounding through float would round twice") {
  // Just above the tie 1 + 2^-11: float rounds it to the tie, which then
  // goes to 1; rounded once it is 1 + 2^-10.
  const double above_tie = 1.0 + 0x1p-11 + 0x1p-40;
  CHECK(Half(static_cast<float>(above_tie)).bits == 0x3c00);  // twice: wrong
  CHECK(Half(above_tie).bits == 0x3c01);                      // once: right
  CHECK(Half(1.0 + 0x1p-11 - 0x1p-40).bits == 0x3c00);
  CHECK(Half(1.0 + 0x1p-11).bits == 0x3c00);  // an exact tie still goes to even
  CHECK(Half(65520.0).bits == 0x7c00);
  CHECK(Half(65520.0 - 0x1p-30).bits == 0x7bff);
  CHECK(Half(1e300).bits == 0x7c00);
  CHECK(Half(0x1p-25 + 0x1p-60).bits == 0x0001);
  CHECK(Half(0x1p-200).bits == 0x0000);
#ifdef __FLT16_MAX__
  // Every tie between neighbouring Halfs, nudged by 2^-40 relative either
  // way (below float's precision), against GCC's double -> _Float16.
  int mismatches = 0;
  for (uint32_t h = 0; h < 0x7bffu; ++h) {
    const auto lo = static_cast<double>(Half::from_bits(static_cast<uint16_t>(h)));
    const auto hi = static_cast<double>(Half::from_bits(static_cast<uint16_t>(h + 1)));
    const double tie = (lo + hi) / 2;
    for (double d : {tie, tie * (1 + 0x1p-40), tie * (1 - 0x1p-40), -tie * (1 + 0x1p-40)}) {
      if (Half(d).bits != std::bit_cast<uint16_t>(static_cast<_Float16>(d))) ++mismatches;
    }
  }
  CHECK(mismatches == 0);
#endif
}

// ---- BFloat16 <-> float -----------------------------------------------------------

TEST_CASE("every one of the 65536 bfloat16 bit patterns survives bfloat16 -> float -> bfloat16") {
  int mismatches = 0;
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float f = static_cast<float>(BFloat16::from_bits(bits));
    // Exact: the float's top half is the bfloat16, its bottom half zero.
    const bool exact = bits_of(f) == (b << 16);
    const uint16_t back = BFloat16(f).bits;
    const bool round_trip = is_bfloat16_nan(bits)
                                ? is_bfloat16_nan(back) && back == (bits | 0x40u)
                                : back == bits;
    if (!exact || !round_trip) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("float -> bfloat16 is the nearer neighbour, ties to even, over ties and a sweep") {
  // The reference measures distances in double (exact for floats) instead
  // of adding and truncating bits as half.h does.
  const auto reference = [](float f) -> uint16_t {
    const uint32_t x = bits_of(f);
    const auto toward_zero = static_cast<uint16_t>(x >> 16);
    const auto away = static_cast<uint16_t>(toward_zero + 1);
    const double lo = std::fabs(static_cast<double>(float_of(static_cast<uint32_t>(toward_zero) << 16)));
    // Past the largest bfloat16 the next step is 2^128, as if the exponent
    // did not end (IEEE 754's overflow rule).
    const double hi = (away & 0x7fffu) == 0x7f80u
                          ? 0x1p128
                          : std::fabs(static_cast<double>(float_of(static_cast<uint32_t>(away) << 16)));
    const double v = std::fabs(static_cast<double>(f));
    if (v - lo < hi - v) return toward_zero;
    if (v - lo > hi - v) return away;
    return (toward_zero & 1u) == 0 ? toward_zero : away;
  };
  std::vector<float> probes;
  for (uint32_t b = 0; b < 0x7f80u; ++b) {
    const uint32_t tie = (b << 16) | 0x8000u;
    for (uint32_t x : {tie, tie - 1, tie + 1, b << 16, (b << 16) | 1u}) {
      probes.push_back(float_of(x));
      probes.push_back(-float_of(x));
    }
  }
  for (uint64_t x = 0; x < 0x7f800000u; x += 4099) probes.push_back(float_of(static_cast<uint32_t>(x)));
  probes.push_back(std::numeric_limits<float>::max());
  int mismatches = 0;
  std::string first;
  for (float f : probes) {
    if (BFloat16(f).bits != reference(f) && mismatches++ == 0) first = std::to_string(bits_of(f));
  }
  CHECK_MESSAGE(mismatches == 0, "first mismatch at float bits ", first);
  // Closed forms: 1 + 2^-8 ties between 1 and 1 + 2^-7 and goes to 1;
  // 1 + 3 * 2^-8 ties between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  CHECK(BFloat16(1.0f + 0x1p-8f).bits == 0x3f80);
  CHECK(BFloat16(1.0f + 3 * 0x1p-8f).bits == BFloat16(1.0f + 0x1p-6f).bits);
  CHECK(BFloat16(std::numeric_limits<float>::max()).bits == 0x7f80);  // above the top tie
  CHECK(BFloat16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
  CHECK(is_bfloat16_nan(BFloat16(float_of(0x7f800001u)).bits));  // a NaN, not infinity
  CHECK(BFloat16(1.0 + 0x1p-8 + 0x1p-40).bits == 0x3f81);  // from double: rounded once
}

// ---- 16-bit tensors ------------------------------------------------------------------

TEST_CASE("float16 and bfloat16 have names, element size 2 and typed data pointers") {
  CHECK(tp::to_string(tp::kFloat16) == "float16");
  CHECK(tp::to_string(tp::kBFloat16) == "bfloat16");
  CHECK(tp::element_size(tp::kFloat16) == 2);
  CHECK(tp::element_size(tp::kBFloat16) == 2);
  Tensor h = tp::tensor({1.5, -2}, {2}, tp::kFloat16);
  CHECK(h.nbytes() == 4);
  CHECK(h.data_ptr<Half>()[0].bits == 0x3e00);
  CHECK(h.data_ptr<Half>()[1].bits == 0xc000);
  Tensor b = tp::tensor({1.5}, {1}, tp::kBFloat16);
  CHECK(b.data_ptr<BFloat16>()[0].bits == 0x3fc0);
  CHECK_THROWS_WITH_AS(h.data_ptr<float>(),
                       Contains("tp::Tensor::data_ptr<float32>: the tensor's dtype is float16; use "
                       "data_ptr<tp::Half>() or convert with .to()"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(b.data_ptr<Half>(), Contains("use data_ptr<tp::BFloat16>()"), tp::Error);
}

TEST_CASE("to() converts between all four dtypes, exactly where the values fit") {
  const Values fit = {0, -1.5, 2.75, 1024, -0.0078125};  // exact in every dtype
  const tp::Dtype dtypes[] = {tp::kFloat32, tp::kFloat64, tp::kFloat16, tp::kBFloat16};
  for (tp::Dtype from : dtypes) {
    for (tp::Dtype to : dtypes) {
      CAPTURE(tp::to_string(from));
      CAPTURE(tp::to_string(to));
      const Tensor converted = tp::tensor(fit, {5}, from).to(to);
      CHECK(converted.dtype() == to);
      CHECK(converted.to_vector() == fit);
    }
  }
  // Rounding: float64 -> float16 once (1 + 2^-11 + 2^-40 -> 1 + 2^-10),
  // float32 past the top -> infinity, float16 -> bfloat16 to bfloat16's 8 bits.
  CHECK(tp::full({1}, 1.0 + 0x1p-11 + 0x1p-40, tp::kFloat64).to(tp::kFloat16).item() ==
        1.0 + 0x1p-10);
  CHECK(std::isinf(tp::full({1}, 70000.0).to(tp::kFloat16).item()));
  CHECK(tp::full({1}, 1.0 + 0x1p-10, tp::kFloat16).to(tp::kBFloat16).item() == 1.0);
  CHECK(tp::full({1}, 1.0 / 3, tp::kFloat64).to(tp::kBFloat16).item() == 0x1.56p-2);
}

TEST_CASE("a dense float -> float16 copy (in bulk) rounds as Half(float) does, bit for bit") {
  // Dense copies convert in bulk, with F16C where the CPU has it (Note
  // [Conversions in bulk], half_bulk.h); strided ones element by element.
  // Both must give Half(f)'s bits for every probe, NaNs' included. (On a
  // CPU without F16C the dense path is element by element too: said.)
  if (!tp::detail::bulk_half_uses_f16c()) MESSAGE("no F16C here: the bulk path is not tested");
  const std::vector<float> probes = half_probe_floats();
  const auto n = static_cast<int64_t>(probes.size() / 2 * 2);
  Tensor floats = tp::empty({n});
  std::copy(probes.begin(), probes.begin() + n, floats.data_ptr<float>());
  const Tensor dense = floats.to(tp::kFloat16);
  Tensor strided = tp::zeros({2, n / 2}, tp::kFloat16);
  strided.t().copy_(floats.view({n / 2, 2}));  // through a transposed view
  const Half* d = dense.data_ptr<Half>();
  const Half* st = strided.data_ptr<Half>();
  int mismatches = 0;
  for (int64_t k = 0; k < n; ++k) {
    const uint16_t want = Half(probes[static_cast<size_t>(k)]).bits;
    const uint16_t strided_k = st[(k % 2) * (n / 2) + k / 2].bits;
    if (d[k].bits != want || strided_k != want) {
      if (mismatches++ == 0) {
        MESSAGE("float bits ", bits_of(probes[static_cast<size_t>(k)]), ": Half(f) ", want,
                ", dense ", d[k].bits, ", strided ", strided_k);
      }
    }
  }
  CHECK(mismatches == 0);
  // The in-place division of a dense float16 tensor (blocks rounded in
  // bulk) and of a strided view of the same values agree.
  Tensor all = tp::empty({65536}, tp::kFloat16);
  for (uint32_t h = 0; h < 65536; ++h) all.data_ptr<Half>()[h] = Half::from_bits(uint16_t(h));
  Tensor by_view = all.clone().view({256, 256});
  Tensor by_block = all.clone();
  by_view.t().div_(3);
  by_block.div_(3);
  const Half* v = by_view.data_ptr<Half>();
  const Half* b = by_block.data_ptr<Half>();
  int differ = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    differ += v[h].bits != b[h].bits && !(is_half_nan(v[h].bits) && is_half_nan(b[h].bits));
  }
  CHECK(differ == 0);
}

TEST_CASE("copy_ converts into a float16 bucket's slots and back into float32 gradients") {
  Tensor bucket = tp::zeros({5}, tp::kFloat16);
  const Tensor grad_a = tp::tensor({0.5, -1.25}, {2});
  const Tensor grad_b = tp::tensor({3, 4, 1.0 / 3}, {3}, tp::kFloat64);
  bucket.narrow(0, 0, 2).copy_(grad_a);
  bucket.narrow(0, 2, 3).copy_(grad_b);
  CHECK(bucket.to_vector() == Values{0.5, -1.25, 3, 4, 0.333251953125});  // 1/3 as a Half
  Tensor back = tp::zeros({2, 2});
  back.t().copy_(bucket.narrow(0, 0, 4).view({2, 2}));  // through strided views
  CHECK(back.to_vector() == Values{0.5, 3, -1.25, 4});
}

TEST_CASE("zero_, fill_, clone, narrow and view work on 16-bit tensors") {
  for (tp::Dtype dtype : {tp::kFloat16, tp::kBFloat16}) {
    CAPTURE(tp::to_string(dtype));
    Tensor t = tp::full({2, 3}, 2.5, dtype);
    CHECK(t.to_vector() == Values(6, 2.5));
    Tensor row = t.view({6}).narrow(0, 3, 3);
    row.fill_(-0.75);
    CHECK(t.to_vector() == Values{2.5, 2.5, 2.5, -0.75, -0.75, -0.75});
    Tensor copy = t.clone();
    CHECK(copy.dtype() == dtype);
    CHECK(!copy.is_alias_of(t));
    t.zero_();
    CHECK(t.to_vector() == Values(6, 0));
    CHECK(copy.to_vector() == Values{2.5, 2.5, 2.5, -0.75, -0.75, -0.75});
    CHECK(tp::full({}, -3, dtype).item() == -3);
    CHECK(tp::tensor({1, 2}, {2}, dtype).to_string() ==
          "tensor([1, 2], dtype=" + tp::to_string(dtype) + ")");
  }
}

TEST_CASE("div_ and mul_ on float16 compute in float and round once: every finite value by 3") {
  // All 63488 finite Halfs in one tensor.
  std::vector<Half> finite;
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    if ((h & 0x7c00u) != 0x7c00u) finite.push_back(Half::from_bits(static_cast<uint16_t>(h)));
  }
  const auto n = static_cast<int64_t>(finite.size());
  Tensor t = tp::empty({n}, tp::kFloat16);
  std::copy(finite.begin(), finite.end(), t.data_ptr<Half>());
  Tensor divided = t.clone().div_(3);
  Tensor multiplied = t.clone().mul_(3);
  int div_mismatches = 0;
  int mul_mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    // The reference rounds the exact double quotient (product) once.
    const auto x = static_cast<double>(finite[static_cast<std::size_t>(i)]);
    if (divided.data_ptr<Half>()[i].bits != Half(x / 3).bits) ++div_mismatches;
    if (multiplied.data_ptr<Half>()[i].bits != Half(x * 3).bits) ++mul_mismatches;
  }
  CHECK(div_mismatches == 0);
  CHECK(mul_mismatches == 0);
  CHECK(tp::full({1}, 1.0, tp::kFloat16).div_(3).item() == 0.333251953125);  // not 1/3
  CHECK(std::isinf(tp::full({1}, 30000.0, tp::kFloat16).mul_(4).item()));
}

TEST_CASE("div_ on bfloat16 rounds once: every finite value by 3 and by 7") {
  std::vector<BFloat16> finite;
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    if ((b & 0x7f80u) != 0x7f80u) finite.push_back(BFloat16::from_bits(static_cast<uint16_t>(b)));
  }
  const auto n = static_cast<int64_t>(finite.size());
  Tensor t = tp::empty({n}, tp::kBFloat16);
  std::copy(finite.begin(), finite.end(), t.data_ptr<BFloat16>());
  for (double divisor : {3.0, 7.0}) {
    CAPTURE(divisor);
    Tensor divided = t.clone().div_(divisor);
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto x = static_cast<double>(finite[static_cast<std::size_t>(i)]);
      if (divided.data_ptr<BFloat16>()[i].bits != BFloat16(x / divisor).bits) ++mismatches;
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("16-bit tensors refuse to compute, naming the op and the dtype") {
  const Tensor h = tp::ones({2, 2}, tp::kFloat16);
  const Tensor b = tp::ones({2, 2}, tp::kBFloat16);
  CHECK_THROWS_WITH_AS(tp::matmul(h, h),
                       Contains("tp::matmul: got a float16 tensor, but 16-bit tensors in this kit are "
                       "for communication (DDP's fp16/bf16 compression hooks): they can be "
                       "converted, filled, scaled with mul_/div_ and sent, not computed with. "
                       "Compute in float32: convert with .to(tp::kFloat32) first"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(h.matmul(h), Contains("tp::matmul: got a float16 tensor"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::add(b, b), Contains("tp::add: got a bfloat16 tensor"), tp::Error);
  CHECK_THROWS_WITH_AS(h.relu(), Contains("tp::relu: got a float16 tensor"), tp::Error);
  CHECK_THROWS_WITH_AS(b.sum(), Contains("tp::sum: got a bfloat16 tensor"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::mse_loss(h, h), Contains("tp::mse_loss: got a float16"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::mul(h, 2.0), Contains("tp::mul: got a float16"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::ones({2, 2}, tp::kFloat16).add_(h),
                       Contains("tp::Tensor::add_: got a float16"), tp::Error);
  CHECK_THROWS_WITH_AS(h.norm(), Contains("tp::Tensor::norm: got a float16"), tp::Error);
  // A float32 tensor and a float16 one: the 16-bit one is named, not the mismatch.
  CHECK_THROWS_WITH_AS(tp::matmul(tp::ones({2, 2}), h), Contains("got a float16 tensor"),
                       tp::Error);
  // Comparisons read values, so they take any dtype.
  CHECK(tp::max_abs_diff(h, tp::ones({2, 2})) == 0);
  CHECK(tp::allclose(b, h));
}

TEST_CASE("a 16-bit tensor cannot live on a CUDA device, in any build") {
  const tp::Device cuda = tp::kCUDA;
  const std::string why =
      "a float16 tensor on cuda:0 was requested, but the kit's CUDA path runs float32 and "
      "float64 only; keep 16-bit tensors on the CPU (.cpu() first), or compute on the GPU in "
      "float32";
  CHECK_THROWS_WITH_AS(tp::empty({2}, tp::kFloat16, cuda),
                       Contains(("tp::empty: " + why).c_str()), tp::Error);
  CHECK_THROWS_WITH_AS(tp::ones({2}, tp::kFloat16).to(cuda),
                       Contains(("tp::Tensor::to: " + why).c_str()), tp::Error);
  CHECK_THROWS_WITH_AS(tp::tensor({1}, {1}, tp::kBFloat16, cuda),
                       Contains("tp::tensor: a bfloat16 tensor on cuda:0"), tp::Error);
}
