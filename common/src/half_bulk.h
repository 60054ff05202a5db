// Many float -> Half conversions at once, for the dense copies and the
// in-place scaling of tensor.cc (private to the library).
//
// Contract:
//   - floats_to_halves(in, out, n) sets out[k] = Half(in[k]) for k < n: bit
//     for bit what half.h's one-element conversion gives (round to nearest,
//     ties to even; NaN quiet with its top payload bits; subnormals kept),
//     only faster.
//   - Where the CPU has F16C (x86-64 since about 2012, checked once at run
//     time), 8 elements go per instruction (vcvtps2ph); elsewhere, and for
//     the last few, half.h's conversion does it element by element.
//   - in and out must not overlap. Thread-safe (pure functions).
//
// Note [Conversions in bulk]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// half.h converts one element with integer operations, bit by bit: the
// readable reference, and about 6 ns an element on the kit's machine, too
// slow for a 4 MB bucket (fp16_compress_hook converts every gradient three
// times a step: to float16, its division, and back). x86's F16C does the
// same rounding in hardware: vcvtps2ph with imm 0 rounds to nearest, ties
// to even, regardless of MXCSR; it keeps subnormals, turns overflow into
// infinity and a NaN into a quiet NaN with the top payload bits kept, as
// half.h does. The two agree bit for bit on all 2^32 floats (checked once,
// by a program that compared them pattern by pattern; test_half checks a
// million probes of every rounding decision through Tensor::to). The other
// way, Half -> float, stays element by element: it is a shift, already
// fast, and vcvtph2ps would quiet a signalling NaN that half.h keeps as it
// is. BFloat16 has no instruction in F16C and keeps its element-by-element
// conversion.
#pragma once

#include <cstdint>

#include "tensorplay/half.h"

namespace tp::detail {

void floats_to_halves(const float* in, Half* out, int64_t n);

// Whether the bulk conversion uses F16C on this machine (test_half says
// so where it does not: then its dense path is element by element too).
bool bulk_half_uses_f16c();

}  // namespace tp::detail
