// Device spans: see tensorplay/cuda/device_trace.h. Uses only tp::cuda's
// runtime API, so it compiles with and without CUDA (without, no CUDA
// stream exists and no DeviceSpan ever records).
#include "tensorplay/cuda/device_trace.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

namespace tp::trace {

namespace {

struct Pending {
  uint64_t id = 0;  // the DeviceSpan's, so a span closes its own entry
  std::string name;
  std::string row;
  std::vector<std::pair<std::string, int64_t>> args;
  cuda::Event begin{true};
  std::optional<cuda::Event> end;  // set when the span closes
};

struct DeviceRecorder {
  std::mutex mu;
  // Everything below is guarded by mu.
  std::vector<Pending> spans;
  int64_t base_us = -1;               // host time of `base`; -1: not tied yet
  std::optional<cuda::Event> base;    // completed at base_us
  uint64_t generation = 0;            // trace::enable() generation of base
  uint64_t next_id = 1;               // of the next span
  std::map<std::string, int> rows;    // row label -> tid
};

// Leaked on purpose, as trace.cc's recorder: spans may close during exit.
DeviceRecorder& recorder() {
  static DeviceRecorder* r = new DeviceRecorder();
  return *r;
}

// Ties the device clock to the host's. REQUIRES: r.mu held.
void tie_clock_locked(DeviceRecorder& r) {
  if (r.base_us >= 0 && r.generation == detail::generation()) return;
  // An idle stream of its own, so that the base event completes at once,
  // not after whatever the compute stream has queued.
  const cuda::Stream idle = cuda::Stream::create();
  r.base.emplace(true);
  r.base->record(idle);
  r.base->synchronize();
  r.base_us = now_us();
  r.generation = detail::generation();
  r.spans.clear();  // spans of an earlier recording
}

// Device rows take tids above every host thread's.
constexpr int kFirstDeviceTid = 1000;

}  // namespace

DeviceSpan::DeviceSpan(const char* name, const cuda::Stream& stream, const char* row,
                       std::initializer_list<Arg> args, bool when) {
  if (!when || !enabled() || !cuda::is_available()) return;
  DeviceRecorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  tie_clock_locked(r);
  Pending p;
  p.name = name;
  p.row = row;
  for (const Arg& a : args) p.args.emplace_back(a.key, a.value);
  p.begin.record(stream);
  p.id = r.next_id++;
  index_ = static_cast<int64_t>(p.id);
  r.spans.push_back(std::move(p));
  stream_ = stream;
}

DeviceSpan::~DeviceSpan() {
  if (index_ < 0) return;
  DeviceRecorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  // Found by id: device_events() or a new recording may have dropped it.
  const auto it = std::find_if(r.spans.rbegin(), r.spans.rend(), [&](const Pending& p) {
    return p.id == static_cast<uint64_t>(index_);
  });
  if (it == r.spans.rend()) return;
  try {
    cuda::Event end(true);
    end.record(stream_);
    it->end = std::move(end);
  } catch (...) {
    // A destructor must not throw; the span stays open and is dropped.
  }
}

std::vector<Event> device_events() {
  DeviceRecorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<Event> out;
  if (!r.base) return out;
  for (Pending& p : r.spans) {
    if (!p.end) continue;  // still open: not a span yet
    p.end->synchronize();
    Event e;
    e.name = p.name;
    e.category = "cuda";
    e.phase = 'X';
    e.pid = detail::current_pid();
    const auto row = r.rows.try_emplace(p.row, kFirstDeviceTid + static_cast<int>(r.rows.size()));
    e.tid = row.first->second;
    // One word: a rank's result carries thread labels as single words.
    e.thread = "gpu-" + p.row;
    std::replace(e.thread.begin(), e.thread.end(), ' ', '-');
    const double begin_ms = p.begin.elapsed_ms(*r.base);
    const double end_ms = p.end->elapsed_ms(*r.base);
    e.ts_us = r.base_us + static_cast<int64_t>(begin_ms * 1000.0);
    e.dur_us = static_cast<int64_t>((end_ms - begin_ms) * 1000.0);
    e.args = std::move(p.args);
    out.push_back(std::move(e));
  }
  r.spans.clear();
  return out;
}

}  // namespace tp::trace
