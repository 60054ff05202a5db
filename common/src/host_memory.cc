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

// Sets malloc's two thresholds once per process (a function-local static:
// thread-safe, and before the first tensor's bytes are allocated).
void keep_freed_pages() {
#if defined(__GLIBC__)
  static const bool done = [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest (HEAP_MAX / 2 on 64-bit)
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    return true;
  }();
  (void)done;
#endif
}

}  // namespace

void* host_allocate(std::size_t nbytes) {
  keep_freed_pages();
  return ::operator new(nbytes, kAlignment);
}

void host_free(void* data) { ::operator delete(data, kAlignment); }

}  // namespace tp::detail
