// tp::trace: an opt-in recorder of spans and instants, per process (= per rank).
//
// Contract:
//   - Off by default. When off, Span and instant() cost one relaxed atomic load
//     and record nothing; argument values are plain integers, so nothing is
//     formatted unless tracing is on.
//   - enable(rank) starts recording; rank becomes the trace's pid, so the
//     per-rank files of one job merge into one timeline.
//   - Thread-safe: any thread may record (DDP's communication thread does).
//     Each thread gets a small tid in order of first use (the thread that calls
//     enable() is 0); set_thread_name() labels it in the timeline.
//   - Every recorded point gets a position in one per-process total order
//     (`begin_order` / `end_order`), taken under the recorder's lock. Checkers
//     assert happens-before on these positions ("bucket 0's allreduce started
//     before backward ended"), never on wall-clock durations.
//   - Every span and instant recorded on the CPU also carries the recording
//     thread's CPU time (CLOCK_THREAD_CPUTIME_ID): where a span's wall time
//     (dur_us) is well above its CPU time (tdur_us), the thread waited there:
//     for a lock, a peer, the wire, or a core another thread held.
//   - write_chrome_json() writes Chrome trace-event JSON that opens in Perfetto
//     (ui.perfetto.dev) or chrome://tracing; render_ascii() draws the same
//     events as a terminal timeline.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace tp::trace {

struct Arg {
  const char* key;
  int64_t value;
};

struct Event {
  std::string name;       // "backward", "allreduce", "hook fc1.weight"...
  std::string category;   // "compute", "comm", "hook", "ddp"
  char phase = 'X';       // 'X' span, 'i' instant
  int pid = 0;            // rank
  int tid = 0;            // small per-process thread number
  std::string thread;     // the thread's set_thread_name() label, "" if none
  int64_t ts_us = 0;      // start, microseconds since enable()
  int64_t dur_us = 0;     // spans only
  // The thread's CPU clock at the start, and the CPU time the thread spent
  // from start to end (spans only), microseconds; -1 where not recorded (the
  // GPU's spans). Chrome's "tts" and "tdur".
  int64_t tts_us = -1;
  int64_t tdur_us = -1;
  uint64_t begin_order = 0;  // position of the start in the total order
  uint64_t end_order = 0;    // position of the end (== begin_order for instants)
  std::vector<std::pair<std::string, int64_t>> args;
};

namespace detail {
extern std::atomic<bool> g_enabled;
// For device_trace.cc: the number of enable() calls so far, and the pid
// (rank) passed to the last.
uint64_t generation();
int current_pid();
}

inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

// Clears earlier events and starts recording as pid `rank`.
void enable(int rank);
// Stops recording; recorded events stay until enable() or clear().
void disable();
void clear();
// Snapshot of the events recorded so far, ordered by begin_order.
std::vector<Event> events();

void set_thread_name(const std::string& name);

// Microseconds since enable(), on the clock of every event's ts_us.
int64_t now_us();

// A zero-length event.
void instant(const char* name, const char* category,
             std::initializer_list<Arg> args = {});

// RAII span: records [construction, destruction) on the current thread,
// which must be the thread that destroys it (its CPU time is that thread's
// clock at the end minus at the start).
class Span {
 public:
  Span(const char* name, const char* category, std::initializer_list<Arg> args = {});
  // For names built at run time (only called when tracing is on, by callers
  // that check enabled() first).
  Span(std::string name, const char* category, std::initializer_list<Arg> args = {});
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  int64_t index_ = -1;  // slot in the recorder, -1 when tracing was off
};

// Chrome trace-event JSON ({"traceEvents": [...]}) for these events,
// including thread-name metadata.
std::string to_chrome_json(const std::vector<Event>& events);
// Writes to_chrome_json(events()) to path; throws tp::Error if it cannot.
void write_chrome_json(const std::string& path);

// A terminal timeline: one row per (pid, tid), `width` columns spanning the
// whole recording, each span drawn with the first letter of its name (of
// what follows "gpu " for a GPU span, category "cuda"), plus a legend. Deterministic for a given event list.
std::string render_ascii(const std::vector<Event>& events, int width = 100);

}  // namespace tp::trace
