// tp::memory: the bytes the library's tensors hold, counted as they are
// allocated and freed, per kind (parameters, gradients, optimizer state, ...).
//
// Contract:
//   - Every tp::Storage (tensor.h) counts its bytes when it is allocated and
//     uncounts them when it is freed, on the CPU and on a CUDA device alike
//     (one total per kind, whatever the device). A view shares its storage
//     and counts nothing; only a real allocation does.
//   - A storage's Kind is the allocating thread's current kind: Other unless
//     a KindScope says otherwise. KindScopes nest; each restores the kind
//     that was current before it. The kind is per thread, so a scope on the
//     main thread says nothing of what DDP's communication thread allocates.
//   - Storage::set_memory_kind moves a storage's bytes to another kind: the
//     autograd engine does so when a backward result becomes a leaf's .grad.
//   - Where the kit sets the kinds: parameters are built under
//     KindScope(Parameter) by tp::train::train_rank; a leaf's .grad is
//     counted as Gradient by AccumulateGrad; tp::optim::SGD's momentum
//     buffers as OptimizerState. Module::to's copies keep their kind, and a
//     buffer registered while parameters are being made counts as Other (it
//     is not a parameter). A DDP with gradient_as_bucket_view makes
//     .grad a view of its bucket: those bytes are the bucket's, counted as
//     whatever kind the bucket was allocated under (Other unless the DDP
//     says Communication), not as Gradient.
//   - The counters are process-wide atomics, since a tensor may be freed on
//     another thread than the one that allocated it. stats() reads each
//     counter atomically but not all of them at one instant.
//   - Peaks: for each kind, the most live bytes since reset_peaks(); and the
//     model-state peak, the most Parameter + Gradient + OptimizerState bytes
//     live at once (what ZeRO shards), updated at every allocation.
//     reset_peaks() sets every peak to the current live bytes. A peak is
//     as exact as the moments of the frees it depends on: the communication
//     thread lets go of a collective's tensors just after waking the rank
//     that waits for it, so a tensor freed there (stage 01 all-reduces each
//     .grad itself) may still count when the next one is allocated, or not.
//     The bytes live at any quiet moment do not vary so.
//   - Counters only ever describe this process: compare differences (before
//     and after), unless the process does nothing but what you measure (a
//     DDP rank does: each rank is a process of its own).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tp::memory {

// What a storage's bytes are for. (New kinds go before Other, and kKinds
// grows with them.)
enum class Kind { Parameter, Gradient, OptimizerState, Communication, Other };
inline constexpr std::size_t kKinds = 5;

// "parameter", "gradient", "optimizer state", "communication", "other".
std::string to_string(Kind kind);
// True for Parameter, Gradient and OptimizerState: the model state.
bool is_model_state(Kind kind);

// The calling thread's current kind (Other by default).
Kind current_kind();

// Makes `kind` the thread's current kind for the scope, then restores the
// previous one:
//   { memory::KindScope state(memory::Kind::OptimizerState); buf = g.clone(); }
class KindScope {
 public:
  explicit KindScope(Kind kind);
  ~KindScope();
  KindScope(const KindScope&) = delete;
  KindScope& operator=(const KindScope&) = delete;

 private:
  Kind previous_;
};

// A reading of the counters, in bytes; arrays are indexed by Kind.
struct Stats {
  std::array<uint64_t, kKinds> live{};  // allocated and not yet freed
  std::array<uint64_t, kKinds> peak{};  // the most live since reset_peaks()
  uint64_t model_state_peak = 0;        // the most Parameter+Gradient+OptimizerState live at once

  uint64_t live_bytes(Kind kind) const { return live[static_cast<std::size_t>(kind)]; }
  uint64_t peak_bytes(Kind kind) const { return peak[static_cast<std::size_t>(kind)]; }
  // Parameter + Gradient + OptimizerState live now.
  uint64_t model_state_live() const;
};

Stats stats();
// Every peak := the bytes live now (the model-state peak too).
void reset_peaks();
// Two readings of spans of time one after the other (reset_peaks() in
// between) as one: each peak the larger of the two, live bytes the later's.
// How a caller leaves a span out of the peaks (read, do it, reset, go on).
Stats combine_spans(const Stats& earlier, const Stats& later);

namespace detail {
// For tp::Storage only: count nbytes allocated as, freed from, or moved
// between kinds.
void record_allocation(Kind kind, std::size_t nbytes);
void record_free(Kind kind, std::size_t nbytes);
void record_move(Kind from, Kind to, std::size_t nbytes);
}  // namespace detail

}  // namespace tp::memory
