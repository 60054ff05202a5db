// tp::memory: the per-kind byte counters behind tp::Storage (see memory.h).
#include "tensorplay/memory.h"

#include <algorithm>

#include <atomic>

namespace tp::memory {
namespace {

// Process-wide: a storage allocated on the main thread may be freed on DDP's
// communication thread (the last handle to a bucket dies there).
std::atomic<uint64_t> g_live[kKinds];
std::atomic<uint64_t> g_peak[kKinds];
std::atomic<uint64_t> g_model_state_live{0};
std::atomic<uint64_t> g_model_state_peak{0};

// Per thread, like grad mode: what this thread's allocations are for.
thread_local Kind t_current = Kind::Other;

std::size_t index(Kind kind) { return static_cast<std::size_t>(kind); }

// peak := max(peak, value), against other threads doing the same.
void raise_to(std::atomic<uint64_t>& peak, uint64_t value) {
  uint64_t seen = peak.load();
  while (seen < value && !peak.compare_exchange_weak(seen, value)) {
  }
}

// Adds nbytes to kind's live bytes (and to the model state's, when kind is
// part of it), raising the peaks they reach.
void add(Kind kind, uint64_t nbytes, bool to_model_state) {
  raise_to(g_peak[index(kind)], g_live[index(kind)].fetch_add(nbytes) + nbytes);
  if (to_model_state) raise_to(g_model_state_peak, g_model_state_live.fetch_add(nbytes) + nbytes);
}

}  // namespace

std::string to_string(Kind kind) {
  switch (kind) {
    case Kind::Parameter: return "parameter";
    case Kind::Gradient: return "gradient";
    case Kind::OptimizerState: return "optimizer state";
    case Kind::Communication: return "communication";
    case Kind::Other: return "other";
  }
  return "unknown kind";
}

bool is_model_state(Kind kind) {
  return kind == Kind::Parameter || kind == Kind::Gradient || kind == Kind::OptimizerState;
}

Kind current_kind() { return t_current; }

KindScope::KindScope(Kind kind) : previous_(t_current) { t_current = kind; }
KindScope::~KindScope() { t_current = previous_; }

uint64_t Stats::model_state_live() const {
  return live_bytes(Kind::Parameter) + live_bytes(Kind::Gradient) +
         live_bytes(Kind::OptimizerState);
}

Stats stats() {
  Stats out;
  for (std::size_t k = 0; k < kKinds; ++k) {
    out.live[k] = g_live[k].load();
    out.peak[k] = g_peak[k].load();
  }
  out.model_state_peak = g_model_state_peak.load();
  return out;
}

void reset_peaks() {
  for (std::size_t k = 0; k < kKinds; ++k) g_peak[k].store(g_live[k].load());
  g_model_state_peak.store(g_model_state_live.load());
}

Stats combine_spans(const Stats& earlier, const Stats& later) {
  Stats out = later;
  for (std::size_t k = 0; k < kKinds; ++k) out.peak[k] = std::max(earlier.peak[k], later.peak[k]);
  out.model_state_peak = std::max(earlier.model_state_peak, later.model_state_peak);
  return out;
}

namespace detail {

void record_allocation(Kind kind, std::size_t nbytes) { add(kind, nbytes, is_model_state(kind)); }

void record_free(Kind kind, std::size_t nbytes) {
  g_live[index(kind)].fetch_sub(nbytes);
  if (is_model_state(kind)) g_model_state_live.fetch_sub(nbytes);
}

void record_move(Kind from, Kind to, std::size_t nbytes) {
  if (from == to) return;
  // Added to the new kind before leaving the old: no instant shows the bytes
  // in neither. The model state's total changes only when the move crosses
  // its border (Other -> Gradient does; Gradient -> Parameter does not).
  add(to, nbytes, is_model_state(to) && !is_model_state(from));
  g_live[index(from)].fetch_sub(nbytes);
  if (is_model_state(from) && !is_model_state(to)) g_model_state_live.fetch_sub(nbytes);
}

}  // namespace detail
}  // namespace tp::memory
