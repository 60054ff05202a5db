// tp::Half and tp::BFloat16: the kit's two 16-bit floating-point element
// types, and their conversions to and from float, written out bit by bit.
//
// Contract:
//   - Each is a struct holding the 16 bits (`bits`) and nothing else:
//     sizeof 2, trivially copyable, so a tensor of dtype float16 (bfloat16)
//     is an array of Half (BFloat16), data_ptr<tp::Half>() a pointer into it.
//     Half is IEEE 754 binary16: 1 sign, 5 exponent (bias 15) and 10
//     mantissa bits; largest finite 65504, smallest normal 2^-14, smallest
//     subnormal 2^-24. BFloat16 is the top half of a float: 1 sign, 8
//     exponent (bias 127) and 7 mantissa bits; float's range, 3 significant
//     digits.
//   - Storage and communication types, no arithmetic: no operator+ and the
//     like. Widen to float, compute, convert back (Note [16-bit arithmetic]
//     in tensor.cc). A default-constructed value is +0.
//   - 16-bit -> float is exact (every Half and every BFloat16 is a float).
//   - float -> 16-bit rounds to nearest, ties to even (Note [Rounding to
//     16 bits]). Half: values at or above 65520 in magnitude become
//     infinity, values below 2^-25 become zero, subnormals are kept. A NaN
//     stays a NaN, quiet (the top payload bits kept where they fit).
//   - double -> 16-bit is rounded once, from the double itself, not twice
//     (double -> float -> 16-bit can land on the wrong side of a tie): the
//     double goes to float by round-to-odd first (Note [Rounding to 16
//     bits]).
//   - Everything here is constexpr and thread-safe (pure functions).
#pragma once

#include <bit>
#include <cstdint>

namespace tp {

// Note [Rounding to 16 bits]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A float has 24 significant bits, a Half 11, a BFloat16 8, so converting
// drops 13 (Half) or 16 (BFloat16) bits and must round. The kit rounds to
// nearest, ties to even (RNE), the IEEE 754 default that CUDA's
// __float2half_rn, x86's vcvtps2ph, Gloo's cpu_float2half_rn and PyTorch
// all use:
//   - the result is the 16-bit value nearest the float, so the error is at
//     most half a unit in the last place (ulp) of the result;
//   - a tie is a float exactly halfway between two neighbouring 16-bit
//     values: the dropped bits are 1000...0 (just the top one set). It goes
//     to the neighbour whose last kept bit is 0, the "even" one. So
//     1 + 2^-11 (halfway between 1 and 1 + 2^-10) rounds down to 1, while
//     1 + 3 * 2^-11 (halfway between 1 + 2^-10 and 1 + 2^-9) rounds up to
//     1 + 2^-9.
// Why RNE and not "round half up": ties are rare in measured data but
// common in data that was itself rounded, and every tie rounded half-up
// errs by half an ulp in the same direction, so a long sum of such values
// drifts. RNE sends about half of the ties down and half up, so their
// errors cancel: a gradient compressed to float16 at every step picks up
// no bias from the ties.
//
// In bits, with the dropped bits d and the last kept bit l, RNE adds
// (half of the dropped range - 1 + l) and truncates: d > half carries into
// the kept bits, d < half never does, and d == half carries exactly when
// l is 1. A carry out of the mantissa bumps the exponent, which is the
// right answer too (1.11..1 rounds up to 2.0; the largest finite values
// round up to infinity).
//
// From double: rounding to float (RNE) and then to 16 bits rounds twice and
// can be wrong: a double just above a Half tie may round to exactly the tie
// as a float, and the tie then goes to even, i.e. down. Rounding the double
// to float by round-to-odd instead (truncate; if anything was dropped, set
// the float's last bit) keeps "exactly a tie", "above" and "below" apart,
// because float keeps at least 2 more bits than either 16-bit type at every
// magnitude they reach (Boldo and Melquiond, "When double rounding is odd",
// 2005); the one RNE step that follows is then the correct rounding.

namespace detail {

// ---- Half <-> float ---------------------------------------------------------
// float: sign 1 | exponent 8 (bias 127) | mantissa 23.
// Half:  sign 1 | exponent 5 (bias 15)  | mantissa 10.

// f rounded to the nearest Half, ties to even (Note [Rounding to 16 bits]).
constexpr uint16_t float_to_half_bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    // NaN: the top 10 payload bits kept, and the quiet bit (0x200) set,
    // which also keeps a NaN whose payload lies only in the 13 dropped bits
    // from turning into infinity (exponent all ones, mantissa 0).
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x477ff000u) {
    // |f| >= 65520: 65504 is the largest Half and 65520 = 65504 + 16 is the
    // tie between it and 65536 (which the exponent cannot hold); the tie goes
    // to even, 0x7c00, infinity. Infinity itself lands here too.
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (magnitude >= 0x38800000u) {
    // |f| >= 2^-14: a normal Half. Rebias the exponent (127 - 15 = 112),
    // then drop 13 mantissa bits with RNE; a carry runs into the exponent.
    const uint32_t rebiased = magnitude - (112u << 23);
    const uint32_t last_kept = (rebiased >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((rebiased + 0x0fffu + last_kept) >> 13));
  }
  if (magnitude <= 0x33000000u) {
    // |f| <= 2^-25, half the smallest subnormal (2^-24): zero (2^-25 itself
    // is a tie, and 0 is the even neighbour). Float subnormals land here.
    return sign;
  }
  // 2^-25 < |f| < 2^-14: a subnormal Half, m * 2^-24 with m in [0, 1024]
  // (1024 is the smallest normal, reached by rounding up: the encoding is
  // the same). f = mantissa * 2^(exponent - 150) with the implicit bit
  // restored, so m = mantissa >> (126 - exponent), shift 14 .. 24, rounded.
  const uint32_t exponent = magnitude >> 23;
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;
  const uint32_t kept = mantissa >> shift;
  const uint32_t dropped = mantissa & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  const bool round_up = dropped > halfway || (dropped == halfway && (kept & 1u) != 0);
  return static_cast<uint16_t>(sign | (kept + (round_up ? 1u : 0u)));
}

// The float equal to the Half with these bits (exact).
constexpr float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) {
    // Infinity (mantissa 0) or NaN (payload moved to the top bits, so the
    // round trip back to Half gives the same bits for a quiet NaN).
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0) {
    return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }
  // Zero or subnormal: mantissa * 2^-24, a normal float (or zero), exact.
  const float value = static_cast<float>(mantissa) * 0x1p-24f;
  return sign != 0 ? -value : value;
}

// ---- BFloat16 <-> float -----------------------------------------------------
// BFloat16 is float's top 16 bits: same sign and exponent, mantissa 7.

// f rounded to the nearest BFloat16, ties to even (Note [Rounding to 16
// bits]): drop the low 16 bits. Overflow, subnormals and infinity need no
// case of their own: the carry does the right thing (FLT_MAX rounds up to
// infinity, as it is above the top tie).
constexpr uint16_t float_to_bfloat16_bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    // NaN: quiet bit (0x40) set, so a payload only in the low 16 bits does
    // not become infinity.
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  const uint32_t last_kept = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7fffu + last_kept) >> 16);
}

// The float equal to the BFloat16 with these bits (exact).
constexpr float bfloat16_bits_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// ---- double -> float, for the 16-bit types -----------------------------------

// d rounded to float by round-to-odd: toward zero, and if that dropped
// anything, the last bit set (Note [Rounding to 16 bits]). Only as a step
// to a 16-bit type: as a float in its own right it is not the nearest.
constexpr float round_to_odd_float(double d) {
  const auto nearest = static_cast<float>(d);  // RNE; exact or NaN: done
  if (static_cast<double>(nearest) == d || d != d) return nearest;
  uint32_t bits = std::bit_cast<uint32_t>(nearest);
  const bool rounded_away_from_zero = d > 0 ? nearest > d : nearest < d;
  if (rounded_away_from_zero) bits -= 1;  // one step toward zero (infinity -> FLT_MAX)
  return std::bit_cast<float>(bits | 1u);
}

}  // namespace detail

// An IEEE 754 binary16 value (PyTorch's torch.float16, c10::Half).
struct Half {
  uint16_t bits = 0;

  Half() = default;
  // Rounded to nearest, ties to even.
  constexpr explicit Half(float value) : bits(detail::float_to_half_bits(value)) {}
  // Rounded once, to nearest, ties to even (through round-to-odd float).
  constexpr explicit Half(double value) : Half(detail::round_to_odd_float(value)) {}

  // Exact.
  constexpr explicit operator float() const { return detail::half_bits_to_float(bits); }
  constexpr explicit operator double() const { return static_cast<float>(*this); }

  static constexpr Half from_bits(uint16_t bits) {
    Half h;
    h.bits = bits;
    return h;
  }
};

// A bfloat16 value, "brain floating point" (torch.bfloat16, c10::BFloat16).
struct BFloat16 {
  uint16_t bits = 0;

  BFloat16() = default;
  // Rounded to nearest, ties to even.
  constexpr explicit BFloat16(float value) : bits(detail::float_to_bfloat16_bits(value)) {}
  // Rounded once, to nearest, ties to even (through round-to-odd float).
  constexpr explicit BFloat16(double value) : BFloat16(detail::round_to_odd_float(value)) {}

  // Exact.
  constexpr explicit operator float() const { return detail::bfloat16_bits_to_float(bits); }
  constexpr explicit operator double() const { return static_cast<float>(*this); }

  static constexpr BFloat16 from_bits(uint16_t bits) {
    BFloat16 b;
    b.bits = bits;
    return b;
  }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

}  // namespace tp
