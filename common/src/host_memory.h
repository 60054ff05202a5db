// Host (CPU) memory for tensor storage (private to the library): what
// Storage allocates and frees for a CPU tensor.
//
// Contract:
//   - host_allocate(nbytes) returns nbytes, 64-byte aligned (one cache line,
//     and the widest SIMD load, AVX-512, that BLAS may use), from the C++
//     heap; throws std::bad_alloc as operator new does. host_free(p) gives
//     them back. Thread-safe, as operator new and delete are.
//   - When the library loads (before any thread of the program's can
//     allocate a tensor: mallopt is not thread-safe), it asks glibc's malloc
//     to keep what is freed for the next allocations (Note [Keeping freed
//     pages]). Elsewhere (another C library), or where glibc refuses the
//     mmap threshold, it changes nothing.
//
// Note [Keeping freed pages]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A training step allocates the same tensors every time (activations,
// gradients, the optimizer's temporaries: 128 KiB each for a 256 x 128
// float32 activation) and frees them all by its end. glibc's malloc serves
// a block above its mmap threshold (128 KiB to start with) with a fresh
// mmap and unmaps it when it is freed, and it hands the top of its heap
// back to the kernel once more than its trim threshold is free there. Both
// make the next step's allocations fresh pages, and the first write to each
// page is a page fault: tens of thousands a second in a 2-rank benchmark,
// a large share of its backward. (glibc raises the mmap threshold on its
// own after freeing a mapped block, but keeps trimming at twice it.)
//
// So the kit sets both thresholds once, to values above any tensor of the
// kit's models (M_MMAP_THRESHOLD 32 MiB, glibc's largest; M_TRIM_THRESHOLD
// 1 GiB), and a step's tensors reuse the pages the last step freed. Both,
// because setting either one turns glibc's own adjustment off (mallopt(3)):
// the trim threshold alone would leave the mmap threshold at 128 KiB, and
// every larger tensor mapped afresh. For the same reason, where glibc
// refuses the first (a huge-page malloc, GLIBC_TUNABLES=glibc.malloc.hugetlb,
// lowers its largest), the second is not set either. A threshold set
// through MALLOC_MMAP_THRESHOLD_ or GLIBC_TUNABLES is replaced. What it
// costs: a process keeps its peak heap until it exits, as PyTorch's caching
// allocator keeps GPU memory. Measured with
//   OPENBLAS_NUM_THREADS=1 perf stat -e page-faults build/bench/bench_overlap \
//       --benchmark_filter=BM_StepOverlap/setup:no_ddp --batch=256
// (the step without DDP, 2 spawned ranks, 40 steps each, two runs): before,
// 35.8 and 38.5 ms a step (p90 64 and 72 ms) with 61,000 and 71,000 page
// faults; with the thresholds set here, 20.5 and 21.1 ms (p90 21 and
// 22 ms) with 16,400 and 16,500. Two ranks launched by tools/tprun: 31.8
// ms before, 20.4 ms after. tp::memory counts live tensor bytes, which
// this does not change.
#pragma once

#include <cstddef>

namespace tp::detail {

void* host_allocate(std::size_t nbytes);
void host_free(void* data);

}  // namespace tp::detail
