// Host memory for tensor storage: Note [Keeping freed pages] (host_memory.h).
#include "host_memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <new>

namespace tp::detail {

namespace {

// 64 bytes: one cache line, and the widest SIMD load (AVX-512) BLAS may use.
constexpr std::align_val_t kAlignment{64};

// Sets malloc's two thresholds (Note [Keeping freed pages]). mallopt
// returns 0 for a value it refuses; the trim threshold is set only once the
// mmap threshold is, since setting either stops glibc's own adjustment.
bool keep_freed_pages() {
#if defined(__GLIBC__)
  // 32 MiB: glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2).
  if (mallopt(M_MMAP_THRESHOLD, 32 << 20) == 0) return false;
  return mallopt(M_TRIM_THRESHOLD, 1 << 30) != 0;
#else
  return false;
#endif
}

// Run while the library loads, on the loading thread: mallopt is not
// thread-safe, and no thread of the program's allocates a tensor before.
[[maybe_unused]] const bool kept_freed_pages = keep_freed_pages();

}  // namespace

void* host_allocate(std::size_t nbytes) { return ::operator new(nbytes, kAlignment); }

void host_free(void* data) { ::operator delete(data, kAlignment); }

}  // namespace tp::detail
