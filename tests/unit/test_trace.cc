// Tests of tp::trace: recording spans and instants, their total order across
// threads, and the two renderings (Chrome JSON and the ASCII timeline).
//
// Checkers rely on begin_order/end_order for happens-before, never on
// wall-clock durations, so these tests do the same: no assertion here depends
// on how long anything took. The one test of the CPU clock spins until the
// clock itself says 20 ms have run and sleeps 30 ms, so its bounds hold on a
// machine however loaded.
#include <doctest/doctest.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tensorplay/cuda/device_trace.h"
#include "tensorplay/cuda/runtime.h"
#include "tensorplay/error.h"
#include "tensorplay/trace.h"
#include "tensorplay/util/temp_dir.h"

namespace trace = tp::trace;

namespace {

// Every test starts and ends with tracing off, empty, and no thread names
// (set_thread_name("") forgets this thread's label; enable() forgets others').
struct TraceOff {
  TraceOff() {
    trace::disable();
    trace::set_thread_name("");
    trace::enable(0);
    trace::disable();
    trace::clear();
  }
  ~TraceOff() {
    trace::disable();
    trace::clear();
  }
};

const trace::Event* find(const std::vector<trace::Event>& events, const std::string& name) {
  for (const auto& e : events) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

using Json = nlohmann::json;

// The events of a Chrome trace, parsed by a real JSON parser (which throws
// on anything that is not JSON).
Json parse_events(const std::string& text) {
  const Json doc = Json::parse(text);
  CHECK(doc["displayTimeUnit"] == "ms");
  return doc["traceEvents"];
}

}  // namespace

TEST_CASE("tracing is off by default and records nothing while off") {
  TraceOff guard;
  CHECK_FALSE(trace::enabled());
  {
    trace::Span s("forward", "compute", {{"step", 1}});
    trace::instant("marker", "ddp");
  }
  CHECK(trace::events().empty());
}

TEST_CASE("a span records name, category, args and a begin before its end") {
  TraceOff guard;
  trace::enable(3);
  { trace::Span s("backward", "compute", {{"step", 7}, {"bucket", 2}}); }
  trace::disable();

  const auto events = trace::events();
  REQUIRE(events.size() == 1);
  const auto& e = events[0];
  CHECK(e.name == "backward");
  CHECK(e.category == "compute");
  CHECK(e.phase == 'X');
  CHECK(e.pid == 3);  // the rank passed to enable()
  CHECK(e.tid == 0);  // the enabling thread
  CHECK(e.begin_order < e.end_order);
  CHECK(e.dur_us >= 0);
  REQUIRE(e.args.size() == 2);
  CHECK(e.args[0] == std::make_pair(std::string("step"), int64_t{7}));
  CHECK(e.args[1] == std::make_pair(std::string("bucket"), int64_t{2}));
}

TEST_CASE("nested spans are ordered parent begin, child begin, child end, parent end") {
  TraceOff guard;
  trace::enable(0);
  {
    trace::Span outer("step", "compute");
    {
      trace::Span inner("forward", "compute");
      trace::instant("loss", "compute");
    }
    trace::Span second(std::string("hook fc1.weight"), "hook");
  }
  trace::disable();

  const auto events = trace::events();
  REQUIRE(events.size() == 4);
  // events() is sorted by begin_order.
  CHECK(events[0].name == "step");
  CHECK(events[1].name == "forward");
  CHECK(events[2].name == "loss");
  CHECK(events[3].name == "hook fc1.weight");

  const auto& step = events[0];
  const auto& fwd = events[1];
  const auto& loss = events[2];
  const auto& hook = events[3];
  CHECK(step.begin_order < fwd.begin_order);
  CHECK(fwd.begin_order < loss.begin_order);
  CHECK(loss.phase == 'i');
  CHECK(loss.end_order == loss.begin_order);  // an instant ends where it begins
  CHECK(loss.end_order < fwd.end_order);
  CHECK(fwd.end_order < hook.begin_order);
  CHECK(hook.end_order < step.end_order);  // the parent closes last
  // Wall-clock containment holds too (microsecond clock, so <=, never <).
  CHECK(step.ts_us <= fwd.ts_us);
  CHECK(fwd.ts_us + fwd.dur_us <= step.ts_us + step.dur_us);
}

TEST_CASE("orders are unique positions in one total order") {
  TraceOff guard;
  trace::enable(0);
  for (int i = 0; i < 5; ++i) {
    trace::Span a("a", "c", {{"i", i}});
    trace::instant("b", "c");
  }
  trace::disable();
  std::vector<uint64_t> seen;
  for (const auto& e : trace::events()) {
    seen.push_back(e.begin_order);
    if (e.phase == 'X') seen.push_back(e.end_order);
  }
  std::sort(seen.begin(), seen.end());
  REQUIRE(seen.size() == 15);  // 5 spans x 2 + 5 instants
  for (size_t i = 0; i < seen.size(); ++i) CHECK(seen[i] == i + 1);
}

TEST_CASE("enable clears the earlier recording and disable keeps it") {
  TraceOff guard;
  trace::enable(0);
  trace::instant("old", "c");
  trace::disable();
  CHECK(trace::events().size() == 1);  // kept after disable
  trace::instant("ignored", "c");       // off: not recorded
  CHECK(trace::events().size() == 1);

  trace::enable(1);
  trace::instant("new", "c");
  const auto events = trace::events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].name == "new");
  CHECK(events[0].pid == 1);
  CHECK(events[0].begin_order == 1);
}

TEST_CASE("a span still open across clear does not corrupt later events") {
  TraceOff guard;
  trace::enable(0);
  {
    trace::Span stale("stale", "c");
    trace::clear();
    trace::instant("after", "c");
  }  // stale's end must not land on "after"
  const auto events = trace::events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].name == "after");
  CHECK(events[0].phase == 'i');
  CHECK(events[0].end_order == events[0].begin_order);
}

TEST_CASE("a span begun while on is closed even if tracing is turned off inside it") {
  TraceOff guard;
  trace::enable(0);
  {
    trace::Span s("long", "c");
    trace::disable();
  }
  const auto events = trace::events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].end_order > events[0].begin_order);
}

TEST_CASE("threads get small tids in order of first use, with their names") {
  TraceOff guard;
  trace::enable(0);
  trace::set_thread_name("main");
  { trace::Span s("forward", "compute"); }

  // Run the worker threads one after the other so the order of first use is
  // known: worker A records first and must get tid 1, worker B tid 2.
  std::thread a([] {
    trace::set_thread_name("comm");
    trace::Span s("allreduce", "comm");
  });
  a.join();
  std::thread b([] { trace::instant("wait", "ddp"); });
  b.join();
  trace::disable();

  const auto events = trace::events();
  REQUIRE(events.size() == 3);
  CHECK(find(events, "forward")->tid == 0);
  CHECK(find(events, "allreduce")->tid == 1);
  CHECK(find(events, "wait")->tid == 2);

  std::set<std::string> thread_names;
  for (const Json& e : parse_events(trace::to_chrome_json(events))) {
    if (e["ph"] == "M") thread_names.insert(e["args"]["name"].get<std::string>());
  }
  CHECK(thread_names == std::set<std::string>{"main", "comm", "thread 2"});
}

TEST_CASE("begin and end orders give happens-before between threads") {
  TraceOff guard;
  trace::enable(0);
  // The main thread's span ends, then (joined, so strictly later) the worker
  // starts its own: the orders must say so, whatever the clocks say.
  { trace::Span s("backward", "compute"); }
  std::thread worker([] { trace::Span s("allreduce", "comm"); });
  worker.join();
  { trace::Span s("optimizer", "compute"); }
  trace::disable();

  const auto events = trace::events();
  const auto* bwd = find(events, "backward");
  const auto* ar = find(events, "allreduce");
  const auto* opt = find(events, "optimizer");
  REQUIRE(bwd != nullptr);
  REQUIRE(ar != nullptr);
  REQUIRE(opt != nullptr);
  CHECK(bwd->end_order < ar->begin_order);
  CHECK(ar->end_order < opt->begin_order);
  CHECK(ar->tid != bwd->tid);
}

TEST_CASE("many threads recording at once lose no events") {
  TraceOff guard;
  trace::enable(0);
  constexpr int kThreads = 4;
  constexpr int kSpansEach = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < kSpansEach; ++i) {
        trace::Span s("work", "c", {{"i", i}});
      }
    });
  }
  for (auto& t : threads) t.join();
  trace::disable();

  const auto events = trace::events();
  CHECK(events.size() == static_cast<size_t>(kThreads * kSpansEach));
  std::set<int> tids;
  for (size_t i = 0; i < events.size(); ++i) {
    tids.insert(events[i].tid);
    CHECK(events[i].end_order > events[i].begin_order);
    if (i > 0) CHECK(events[i - 1].begin_order < events[i].begin_order);
  }
  CHECK(tids.size() == static_cast<size_t>(kThreads));
  CHECK(tids.count(0) == 0);  // tid 0 is the enabling thread, which recorded nothing
}

TEST_CASE("chrome JSON has metadata, complete and instant events with escaped strings") {
  TraceOff guard;
  std::vector<trace::Event> events(2);
  events[0].name = "bucket \"0\"\\copy\n";
  events[0].category = "ddp";
  events[0].phase = 'X';
  events[0].pid = 2;
  events[0].tid = 0;
  events[0].ts_us = 10;
  events[0].dur_us = 25;
  events[0].begin_order = 1;
  events[0].end_order = 3;
  events[0].args = {{"bucket", 0}, {"bytes", 4096}};
  events[0].tts_us = 7;
  events[0].tdur_us = 20;
  events[1].name = "queued";
  events[1].category = "comm";
  events[1].phase = 'i';
  events[1].pid = 2;
  events[1].tid = 1;
  events[1].ts_us = 12;
  events[1].begin_order = 2;
  events[1].end_order = 2;

  const Json written = parse_events(trace::to_chrome_json(events));
  std::map<std::string, int> phases;
  for (const Json& e : written) ++phases[e["ph"].get<std::string>()];
  CHECK(phases == std::map<std::string, int>{{"M", 2}, {"X", 1}, {"i", 1}});  // M: per (pid, tid)
  const Json& span = written[2];  // after the two thread names
  CHECK(span["name"] == "bucket \"0\"\\copy\n");  // quotes, backslash, newline survive
  CHECK(span["ts"] == 10);
  CHECK(span["dur"] == 25);
  CHECK(span["tts"] == 7);  // the thread's CPU clock, as Chrome's format names it
  CHECK(span["tdur"] == 20);
  CHECK(span["args"] == Json{{"begin_order", 1}, {"end_order", 3}, {"bucket", 0}, {"bytes", 4096}});
  const Json& queued = written[3];
  CHECK(queued["s"] == "t");
  CHECK(queued["pid"] == 2);
  CHECK(!queued.contains("dur"));
  CHECK(!queued.contains("tts"));  // -1: not recorded, so not written
}

TEST_CASE("a span's CPU time counts the thread's work and not its waiting") {
  TraceOff guard;
  trace::enable(0);
  {
    trace::Span s("work", "compute");
    // Spin until this thread has used 20 ms of CPU, however long the
    // machine makes that take.
    timespec start{}, now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    volatile uint64_t sink = 0;
    do {
      for (int i = 0; i < 10000; ++i) sink = sink + static_cast<uint64_t>(i);
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    } while ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) <
             20000000L);
  }
  {
    trace::Span s("sleep", "comm");
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  trace::instant("done", "ddp");
  trace::disable();
  const auto events = trace::events();
  const trace::Event* work = find(events, "work");
  const trace::Event* sleep = find(events, "sleep");
  const trace::Event* done = find(events, "done");
  REQUIRE(work != nullptr);
  REQUIRE(sleep != nullptr);
  REQUIRE(done != nullptr);
  CHECK(work->tdur_us >= 20000);
  CHECK(work->dur_us >= work->tdur_us - 1000);  // wall >= CPU (clocks read apart)
  CHECK(sleep->dur_us >= 30000);
  CHECK(sleep->tdur_us >= 0);
  CHECK(sleep->tdur_us < 10000);  // asleep: the wall clock ran, the CPU clock hardly
  // The clock is per thread and runs forward: the instant after both spans
  // reads at least their CPU time past the first span's start.
  CHECK(done->tts_us >= work->tts_us + work->tdur_us + sleep->tdur_us);
  CHECK(done->tdur_us == -1);  // instants have no duration
}

TEST_CASE("write_chrome_json writes a file that a JSON parser accepts") {
  TraceOff guard;
  tp::TempDir dir("tp-trace-test");
  trace::enable(0);
  trace::set_thread_name("main \"thread\"");
  {
    trace::Span s("forward", "compute", {{"step", 0}});
    trace::instant("tab\there", "ddp");
  }
  trace::disable();
  const std::string path = dir.path() + "/trace.json";
  trace::write_chrome_json(path);

  std::ifstream in(path);
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  CHECK(text == trace::to_chrome_json(trace::events()));
  const Json written = parse_events(text);
  REQUIRE(written.size() == 3);  // the thread's name, the span, the instant
  CHECK(written[0]["args"]["name"] == "main \"thread\"");
  CHECK(written[1]["name"] == "forward");
  CHECK(written[2]["name"] == "tab\there");
}

TEST_CASE("write_chrome_json names the path it cannot write") {
  TraceOff guard;
  CHECK_THROWS_WITH_AS(trace::write_chrome_json("/nonexistent-dir/x/trace.json"),
                       doctest::Contains("/nonexistent-dir/x/trace.json"), tp::Error);
}

TEST_CASE("ASCII timeline has one labelled row per thread and a legend") {
  TraceOff guard;
  std::vector<trace::Event> events;
  auto span = [&](const char* name, int tid, int64_t ts, int64_t dur, uint64_t order) {
    trace::Event e;
    e.name = name;
    e.category = "c";
    e.phase = 'X';
    e.pid = 7;  // not this process's pid, so rows are labelled "thread N"
    e.tid = tid;
    e.ts_us = ts;
    e.dur_us = dur;
    e.begin_order = order;
    e.end_order = order + 100;
    events.push_back(e);
  };
  span("backward", 0, 0, 100, 1);   // whole row 0
  span("hook", 0, 50, 10, 2);       // nested, drawn over it
  span("allreduce", 1, 60, 40, 3);  // row 1, second half
  trace::Event i;
  i.name = "queued";
  i.phase = 'i';
  i.pid = 7;
  i.tid = 1;
  i.ts_us = 55;
  i.begin_order = i.end_order = 4;
  events.push_back(i);
  trace::Event done = i;  // an autograd engine mark gets its own glyph
  done.name = "graph done";
  done.category = "autograd";
  done.tid = 0;
  done.ts_us = 90;
  done.begin_order = done.end_order = 5;
  events.push_back(done);

  const std::string text = trace::render_ascii(events, 20);
  std::istringstream lines(text);
  std::string header, row0, row1, legend;
  std::getline(lines, header);
  std::getline(lines, row0);
  std::getline(lines, row1);
  std::getline(lines, legend);
  CHECK(header == "timeline: 100 us in 20 columns");
  // Both labels are padded to the same width.
  CHECK(row0 == "rank 7 thread 0 |bbbbbbbbbbhhbbbbbb^b|");
  CHECK(row1 == "rank 7 thread 1 |...........|aaaaaaaa|");
  CHECK(legend ==
        "legend: . = idle; ^ = graph done; a = allreduce; b = backward; h = hook; | = queued;");
  // Deterministic: the same events draw the same picture.
  CHECK(trace::render_ascii(events, 20) == text);
}

TEST_CASE("ASCII timeline of no events says so, and a bad width is rejected") {
  CHECK(trace::render_ascii({}, 10) == "(no trace events)\n");
  trace::Event e;
  e.name = "x";
  CHECK_THROWS_WITH_AS(trace::render_ascii({e}, 0), doctest::Contains("width must be at least 1"),
                       tp::Error);
}

TEST_CASE("events from another rank keep their thread names in the JSON and the timeline") {
  tp::trace::Event main_span;
  main_span.name = "backward";
  main_span.category = "compute";
  main_span.pid = 3;
  main_span.tid = 0;
  main_span.thread = "main";
  main_span.dur_us = 10;
  tp::trace::Event comm_span = main_span;
  comm_span.name = "allreduce";
  comm_span.category = "comm";
  comm_span.tid = 1;
  comm_span.thread = "comm";
  comm_span.ts_us = 5;
  const std::vector<tp::trace::Event> events{main_span, comm_span};
  const Json written = parse_events(tp::trace::to_chrome_json(events));
  CHECK(std::any_of(written.begin(), written.end(), [](const Json& e) {
    return e["ph"] == "M" && e["pid"] == 3 && e["tid"] == 1 && e["args"]["name"] == "comm";
  }));
  const std::string timeline = tp::trace::render_ascii(events, 20);
  CHECK(timeline.find("rank 3 comm") != std::string::npos);
  CHECK(timeline.find("rank 3 main") != std::string::npos);
}

TEST_CASE("GPU spans record nothing, and touch no CUDA, where no GPU is usable or when off") {
  // The trainer opens them on every rank with `when` = "this rank trains on
  // CUDA"; a CPU run, and any run on a machine without a GPU, must pass
  // through them untouched (a CUDA call there would throw).
  tp::trace::enable(0);
  {
    tp::trace::DeviceSpan off("gpu backward", tp::cuda::current_stream(), "compute stream", {},
                              /*when=*/false);
  }
  if (!tp::cuda::is_available()) {
    tp::trace::DeviceSpan on("gpu backward", tp::cuda::current_stream(), "compute stream");
  }
  tp::trace::disable();
  CHECK(tp::trace::device_events().empty());
  for (const tp::trace::Event& e : tp::trace::events()) CHECK(e.category != "cuda");
}

TEST_CASE("a GPU span is drawn with the letter of what it times") {
  tp::trace::Event host;
  host.name = "backward";
  host.category = "compute";
  host.dur_us = 10;
  host.thread = "main";
  tp::trace::Event gpu = host;
  gpu.name = "gpu backward";
  gpu.category = "cuda";
  gpu.tid = 1000;
  gpu.thread = "gpu-compute-stream";
  const std::string timeline = tp::trace::render_ascii({host, gpu}, 10);
  CHECK(timeline.find("rank 0 gpu-compute-stream |bbbbbbbbbb|") != std::string::npos);
  CHECK(timeline.find("b = backward, gpu backward") != std::string::npos);
}
