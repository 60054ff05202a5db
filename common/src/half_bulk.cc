// Note [Conversions in bulk] is in half_bulk.h.
#include "half_bulk.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tp::detail {

namespace {

#if defined(__x86_64__)
// Compiled for F16C whatever the build's -march; called only where the CPU
// has it (has_f16c).
__attribute__((target("avx,f16c"))) int64_t floats_to_halves_f16c(const float* in, Half* out,
                                                                   int64_t n) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + k), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), h);
  }
  return k;  // converted so far
}

bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}
#else
int64_t floats_to_halves_f16c(const float*, Half*, int64_t) { return 0; }
bool has_f16c() { return false; }
#endif

}  // namespace

void floats_to_halves(const float* in, Half* out, int64_t n) {
  int64_t k = has_f16c() ? floats_to_halves_f16c(in, out, n) : 0;
  for (; k < n; ++k) out[k] = Half(in[k]);
}

bool bulk_half_uses_f16c() { return has_f16c(); }

}  // namespace tp::detail
