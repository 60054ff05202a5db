// tp::trace: the recorder behind Span and instant(), and the two renderings
// of what it recorded (Chrome trace-event JSON and an ASCII timeline).
//
// Note [Recorder layout]
//   One process-wide Recorder holds every event in a vector, guarded by one
//   mutex. A Span appends its event at construction (begin) and fills in the
//   end at destruction; it remembers which event is its own by a *global event
//   number* (Span::index_): the event's slot plus `discarded`, the number of
//   events ever thrown away by clear()/enable(). A Span that outlives a clear()
//   therefore finds its number below `discarded` and records nothing, instead
//   of writing into some other event's slot.
//
//   Every begin, end and instant takes the next value of one counter, under
//   the same lock that appends the event, so the orders form one total order
//   consistent with what each thread did: if thread A's span ends before
//   thread B's span begins (in real time), end_order < begin_order. Orders
//   start at 1; an end_order of 0 marks a span that has not ended yet.
//
//   Thread CPU time is read on the thread that records, before taking the
//   lock: the CPU clock costs a system call (the vDSO serves only the wall
//   clocks), which stays out of the locked section; it is paid only while
//   tracing is on. A span's tdur is its end's reading minus its start's, so
//   a Span ends on the thread that began it (a RAII object on the stack).
//
//   Thread ids: each thread caches its tid in a thread_local together with
//   the recorder's `generation`. enable() bumps the generation, so every
//   thread takes a fresh tid (in order of first use, the enabling thread
//   first) in the new recording.
#include "tensorplay/trace.h"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tensorplay/error.h"
#include "tensorplay/util/file.h"

namespace tp::trace {

namespace detail {
std::atomic<bool> g_enabled{false};
}  // namespace detail

namespace {

using Clock = std::chrono::steady_clock;

struct Recorder {
  std::mutex mu;
  // Everything below is guarded by mu.
  std::vector<Event> events;     // the current recording, in begin order
  uint64_t discarded = 0;        // events dropped by clear()/enable() so far
  uint64_t next_order = 1;       // next position in the total order
  uint64_t generation = 1;       // bumped by enable(); see thread ids above
  int next_tid = 0;              // next tid to hand out in this generation
  int pid = 0;                   // the rank passed to enable()
  Clock::time_point start = Clock::now();  // time zero of ts_us
  std::map<int, std::string> thread_names;  // tid -> name, this generation
};

// Leaked on purpose: threads may still record while static destructors run
// at exit, and a destroyed mutex would crash them.
Recorder& recorder() {
  static Recorder* r = new Recorder();
  return *r;
}

// Per-thread cache of this thread's tid and name.
struct ThreadState {
  uint64_t generation = 0;  // recorder generation the tid belongs to (0: none)
  int tid = -1;
  std::string name;  // set by set_thread_name; survives enable()
};
thread_local ThreadState t_thread;

// The calling thread's tid in the current generation. REQUIRES: r.mu held.
int tid_locked(Recorder& r) {
  if (t_thread.generation != r.generation) {
    t_thread.generation = r.generation;
    t_thread.tid = r.next_tid++;
    if (!t_thread.name.empty()) r.thread_names[t_thread.tid] = t_thread.name;
  }
  return t_thread.tid;
}

int64_t now_us_locked(const Recorder& r) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - r.start)
      .count();
}

// The calling thread's CPU time, microseconds since the thread started.
int64_t thread_cpu_us() {
  timespec t{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return -1;  // (not on Linux)
  return static_cast<int64_t>(t.tv_sec) * 1000000 + t.tv_nsec / 1000;
}

// Appends a begun event and returns its global event number.
int64_t record_begin(std::string name, const char* category, char phase,
                     std::initializer_list<Arg> args) {
  Recorder& r = recorder();
  Event e;
  e.name = std::move(name);
  e.category = category != nullptr ? category : "";
  e.phase = phase;
  e.args.reserve(args.size());
  for (const Arg& a : args) e.args.emplace_back(a.key, a.value);
  e.tts_us = thread_cpu_us();

  std::lock_guard<std::mutex> lock(r.mu);
  e.pid = r.pid;
  e.tid = tid_locked(r);
  e.ts_us = now_us_locked(r);
  e.begin_order = r.next_order++;
  if (phase == 'i') e.end_order = e.begin_order;  // instants end where they begin
  r.events.push_back(std::move(e));
  return static_cast<int64_t>(r.discarded + r.events.size() - 1);
}

// Label of a timeline row: the name its events carry (events() stamps each
// with its thread's set_thread_name() label, so rows of other ranks keep
// their names), else "thread N".
std::string thread_label(const std::vector<Event>& events, int pid, int tid) {
  for (const Event& e : events) {
    if (e.pid == pid && e.tid == tid && !e.thread.empty()) return e.thread;
  }
  return "thread " + std::to_string(tid);
}

}  // namespace

void enable(int rank) {
  Recorder& r = recorder();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.discarded += r.events.size();
    r.events.clear();
    r.next_order = 1;
    r.generation++;
    r.next_tid = 0;
    r.thread_names.clear();
    r.pid = rank;
    r.start = Clock::now();
    tid_locked(r);  // the enabling thread is tid 0
  }
  detail::g_enabled.store(true, std::memory_order_relaxed);
}

void disable() { detail::g_enabled.store(false, std::memory_order_relaxed); }

void clear() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.discarded += r.events.size();
  r.events.clear();
}

std::vector<Event> events() {
  Recorder& r = recorder();
  std::vector<Event> copy;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    copy = r.events;
    for (Event& e : copy) {
      auto it = r.thread_names.find(e.tid);
      if (it != r.thread_names.end()) e.thread = it->second;
    }
  }
  // Appended under the lock that hands out begin_order, so already sorted;
  // the sort states the contract rather than relying on it.
  std::stable_sort(copy.begin(), copy.end(), [](const Event& a, const Event& b) {
    return a.begin_order < b.begin_order;
  });
  return copy;
}

int64_t now_us() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  return now_us_locked(r);
}

uint64_t detail::generation() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.generation;
}

int detail::current_pid() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.pid;
}

void set_thread_name(const std::string& name) {
  t_thread.name = name;
  // Tracing off: remember the name; it is registered with this thread's tid
  // when the thread first records. An empty name removes the label.
  if (!enabled()) return;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  const int tid = tid_locked(r);
  if (name.empty()) {
    r.thread_names.erase(tid);
  } else {
    r.thread_names[tid] = name;
  }
}

void instant(const char* name, const char* category, std::initializer_list<Arg> args) {
  if (!enabled()) return;
  record_begin(name, category, 'i', args);
}

Span::Span(const char* name, const char* category, std::initializer_list<Arg> args) {
  if (!enabled()) return;  // the whole cost when tracing is off
  index_ = record_begin(name, category, 'X', args);
}

Span::Span(std::string name, const char* category, std::initializer_list<Arg> args) {
  if (!enabled()) return;
  index_ = record_begin(std::move(name), category, 'X', args);
}

Span::~Span() {
  if (index_ < 0) return;
  // A span that began while tracing was on always ends, even if tracing was
  // turned off in between, so no recorded span is left open.
  const int64_t cpu_end = thread_cpu_us();
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto number = static_cast<uint64_t>(index_);
  if (number < r.discarded) return;  // cleared while open; see Note above
  const uint64_t slot = number - r.discarded;
  if (slot >= r.events.size()) return;
  Event& e = r.events[slot];
  e.end_order = r.next_order++;
  e.dur_us = now_us_locked(r) - e.ts_us;
  if (e.tts_us >= 0 && cpu_end >= 0) e.tdur_us = cpu_end - e.tts_us;
}

std::string to_chrome_json(const std::vector<Event>& events) {
  // Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
  // 'X' complete events carry ts and dur (and the thread's CPU clock as tts
  // and tdur, where recorded); 'i' instants carry "s":"t"
  // (thread scope); 'M' metadata events name the threads. Times are in
  // microseconds, the format's unit. Each event is one JSON object written
  // by nlohmann/json (which escapes names; a byte that is not UTF-8 becomes
  // U+FFFD), one per line, so that two traces diff and grep line by line.
  using Json = nlohmann::ordered_json;
  std::vector<Json> objects;

  // Thread names first, one per (pid, tid), sorted so output is deterministic.
  std::set<std::pair<int, int>> threads;
  for (const Event& e : events) threads.insert({e.pid, e.tid});
  for (const auto& [pid, tid] : threads) {
    objects.push_back({{"name", "thread_name"},
                       {"ph", "M"},
                       {"pid", pid},
                       {"tid", tid},
                       {"args", {{"name", thread_label(events, pid, tid)}}}});
  }

  for (const Event& e : events) {
    Json object = {{"name", e.name},
                   {"cat", e.category},
                   {"ph", std::string(1, e.phase)},
                   {"pid", e.pid},
                   {"tid", e.tid},
                   {"ts", e.ts_us}};
    if (e.phase == 'X') object["dur"] = e.dur_us;
    if (e.tts_us >= 0) object["tts"] = e.tts_us;
    if (e.phase == 'X' && e.tdur_us >= 0) object["tdur"] = e.tdur_us;
    if (e.phase == 'i') object["s"] = "t";
    // The orders ride along as args so a timeline viewer shows them too.
    Json args = {{"begin_order", e.begin_order}, {"end_order", e.end_order}};
    for (const auto& [key, value] : e.args) args[key] = value;
    object["args"] = std::move(args);
    objects.push_back(std::move(object));
  }

  std::string out = "{\"traceEvents\": [\n";
  for (size_t i = 0; i < objects.size(); ++i) {
    out += (i == 0 ? "  " : ",\n  ") + objects[i].dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  out += "\n], \"displayTimeUnit\": \"ms\"}\n";
  return out;
}

void write_chrome_json(const std::string& path) {
  try {
    write_file(path, to_chrome_json(events()), "the trace file");
  } catch (const Error& e) {
    TP_THROW(Error, "tp::trace::write_chrome_json: ", e.what());
  }
}

namespace {

// The ASCII timeline's time axis: column c covers the times
// [t0 + c*range/width, t0 + (c+1)*range/width). A point falls in column
// floor((t - t0) * width / range); a span fills every column it overlaps,
// and at least the one it starts in.
struct Columns {
  int64_t t0 = 0, t1 = 0, range = 1;
  int width = 1;

  Columns(const std::vector<Event>& events, int width_) : width(width_) {
    t0 = t1 = events.front().ts_us;  // the time covered by the whole recording
    for (const Event& e : events) {
      t0 = std::min(t0, e.ts_us);
      t1 = std::max(t1, e.ts_us + (e.phase == 'X' ? std::max<int64_t>(e.dur_us, 0) : 0));
    }
    range = std::max<int64_t>(t1 - t0, 1);
  }
  int clamp(int64_t c) const { return static_cast<int>(std::clamp<int64_t>(c, 0, width - 1)); }
  int of(int64_t t) const { return clamp((t - t0) * width / range); }
  int last_of(int64_t t_end) const {  // ceil((t_end - t0) * width / range) - 1
    return clamp(((t_end - t0) * width + range - 1) / range - 1);
  }
};

using Rows = std::map<std::pair<int, int>, std::string>;  // (pid, tid) -> its row
using Legend = std::map<char, std::set<std::string>>;     // glyph -> the names it stands for

// Paints each span with its name's first letter, in begin order so that a
// nested (later-starting) span paints over its parent; then the instants on
// top, so a span never hides them: '^' for the autograd engine's marks (a
// gradient ready, the graph done), '|' for the rest (a collective queued),
// so the two things overlap is about differ.
void paint(const std::vector<Event>& events, const Columns& cols, Rows& rows, Legend& legend) {
  std::vector<const Event*> order;
  for (const Event& e : events) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const Event* a, const Event* b) {
    return a->begin_order < b->begin_order;
  });
  for (const Event* e : order) {
    if (e->phase != 'X') continue;
    // A GPU span ("gpu backward", device_trace.h) takes the letter of what
    // it times, as its host counterpart does: b for backward on either row.
    const bool gpu = e->category == "cuda" && e->name.rfind("gpu ", 0) == 0;
    const std::string& name = e->name;
    const char letter = name.size() <= (gpu ? 4u : 0u) ? '?' : name[gpu ? 4 : 0];
    legend[letter].insert(e->name);
    const int c0 = cols.of(e->ts_us);
    const int c1 = std::max(c0, cols.last_of(e->ts_us + std::max<int64_t>(e->dur_us, 0)));
    std::string& row = rows[{e->pid, e->tid}];
    for (int c = c0; c <= c1; ++c) row[static_cast<size_t>(c)] = letter;
  }
  for (const Event* e : order) {
    if (e->phase != 'i') continue;
    const char glyph = e->category == "autograd" ? '^' : '|';
    rows[{e->pid, e->tid}][static_cast<size_t>(cols.of(e->ts_us))] = glyph;
    legend[glyph].insert(e->name);
  }
}

// The rows under labels ("rank 0 main", padded to one width), then the legend.
std::string format_timeline(const std::vector<Event>& events, const Columns& cols,
                            const Rows& rows, const Legend& legend) {
  std::vector<std::pair<std::string, const std::string*>> lines;
  size_t label_width = 0;
  for (const auto& [key, row] : rows) {
    std::string label = "rank " + std::to_string(key.first) + " " +
                        thread_label(events, key.first, key.second);
    label_width = std::max(label_width, label.size());
    lines.emplace_back(std::move(label), &row);
  }
  std::ostringstream out;
  out << "timeline: " << (cols.t1 - cols.t0) << " us in " << cols.width << " columns\n";
  for (const auto& [label, row] : lines) {
    out << label << std::string(label_width - label.size(), ' ') << " |" << *row << "|\n";
  }
  out << "legend:";
  out << " . = idle;";
  for (const auto& [letter, names] : legend) {
    out << ' ' << letter << " =";
    bool first = true;
    for (const std::string& n : names) {
      out << (first ? " " : ", ") << n;
      first = false;
    }
    out << ';';
  }
  out << '\n';
  return out.str();
}

}  // namespace

std::string render_ascii(const std::vector<Event>& events, int width) {
  TP_CHECK(width >= 1, "tp::trace::render_ascii: width must be at least 1, got ", width);
  if (events.empty()) return "(no trace events)\n";
  const Columns cols(events, width);
  // One row per (pid, tid), in sorted order; each row starts blank.
  Rows rows;
  for (const Event& e : events) rows.try_emplace({e.pid, e.tid}, std::string(width, '.'));
  Legend legend;
  paint(events, cols, rows, legend);
  return format_timeline(events, cols, rows, legend);
}

}  // namespace tp::trace
