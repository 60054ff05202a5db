// The demo's --trace file and the timeline of its last step (report_trace,
// demo_report.h).
#include <algorithm>
#include <cstdio>

#include "demo_report.h"
#include "tensorplay/trace.h"
#include "tensorplay/util/file.h"

namespace tp::train {

// Writes every rank's events as one Chrome trace and prints the last step's
// timeline. Each rank's clock starts at its own trace::enable(), so clocks of
// different ranks are not aligned: the timeline starts every rank's row at
// that rank's own step start. Within a rank the order is exact.
// A rank that had run out of batches (Join, lesson 07) has no step of that
// number: its row is its shadow of it, the k-th "shadow step" span for the
// k-th step after its own last one (the DDP shadows each synced step of the
// others once), drawn as `s`.
void report_trace(const DemoArgs& args, const std::vector<RankResult>& ranks) {
  std::vector<trace::Event> all, last_step;
  const int64_t last = total_steps(args.config) - 1;
  std::string shadowing;  // the ranks drawn from a shadow step
  for (const RankResult& r : ranks) {
    const trace::Event* step = nullptr;
    std::vector<const trace::Event*> shadows;
    for (const trace::Event& e : r.events) {
      all.push_back(e);
      if (e.phase != 'X') continue;
      if (e.name == "step" && !e.args.empty() && e.args[0].second == last) step = &e;
      if (e.name == "shadow step") shadows.push_back(&e);
    }
    int64_t begin = 0;
    const int64_t shadow = last - steps_of(args.config, r.rank);  // which of its shadows
    if (step == nullptr && shadow >= 0 && static_cast<size_t>(shadow) < shadows.size()) {
      step = shadows[static_cast<size_t>(shadow)];
      shadowing += detail::cat(shadowing.empty() ? "" : ", ", r.rank);
      // From the end of what it did before (its last step, or the shadow
      // before), so that the row shows the count of the ranks still
      // training, which join()'s loop all-reduces before each shadow step.
      begin = step->ts_us;
      int64_t before = -1;
      for (const trace::Event& e : r.events) {
        const int64_t end = e.ts_us + e.dur_us;
        if (e.phase == 'X' && (e.name == "step" || e.name == "shadow step") && end <= step->ts_us) {
          before = std::max(before, end);
        }
      }
      if (before >= 0) begin = before;
    } else if (step != nullptr) {
      begin = step->ts_us;
    }
    if (step == nullptr) continue;  // (a rank that failed, or has no trace)
    for (trace::Event e : r.events) {
      if (e.ts_us < begin || e.ts_us > step->ts_us + step->dur_us || e.name == "step") continue;
      e.ts_us -= begin;  // every rank's row starts at its own step start
      last_step.push_back(std::move(e));
    }
  }
  write_file(args.trace_path, trace::to_chrome_json(all), "the --trace file");
  std::printf("\ntimeline of step %lld, each rank from its own step start%s (all steps: open %s "
              "in ui.perfetto.dev):\n%s",
              static_cast<long long>(last),
              shadowing.empty()
                  ? ""
                  : detail::cat("; rank", shadowing.find(',') == std::string::npos ? " " : "s ",
                                shadowing, " had joined: from the end of the step or shadow "
                                "step before, through the shadow step")
                        .c_str(),
              args.trace_path.c_str(), trace::render_ascii(last_step, 100).c_str());
}

}  // namespace tp::train
