// What a lesson's demo says about one run (report_demo, demo.h): the
// report, built once by build_report (demo.cc), then rendered by three
// files that compute nothing of their own: the table on stdout
// (demo_table.cc), the --json file (demo_json.cc) and the --trace file
// with its timeline (demo_trace.cc). Private to libtensorplay_train.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tensorplay/train/compare.h"
#include "tensorplay/train/demo.h"
#include "tensorplay/train/predicates.h"

namespace tp::train {

// What one table row shows, also written to the JSON.
struct StepRow {
  double reference_loss = 0.0;                   // mean over the ranks taking part
  std::vector<std::optional<double>> reference;  // [rank]
  std::vector<std::optional<double>> ddp;        // [rank]
  double drift = 0.0;                            // max |ddp - reference| over ranks
};

enum class Verdict { Matches, Differs, ReferenceDiverged, Approximate, Float32Rounding };

// Everything the demo says about one run; print_report() and report_json()
// render it, and compute nothing of their own.
struct DemoReport {
  std::string stage;
  std::string title;
  const DemoArgs* args = nullptr;
  const std::vector<RankResult>* ranks = nullptr;
  double tolerance = 0.0;
  Comparison comparison;
  std::vector<StepRow> rows;
  std::vector<double> rank_norms;            // each rank's final parameter norm
  std::vector<uint64_t> allreduces_in_step0; // each rank's all-reduces in step 0
  uint64_t bytes_in_first_step = 0;          // rank 0's all-reduced bytes in step 0
  uint64_t bytes_in_last_step = 0;           // ... in its last step
  std::string approximation;                 // why the run is approximate; "" if exact
  std::vector<Finding> findings;
  Verdict verdict = Verdict::Matches;
  Float64Rerun rerun;  // Note [Rounding or a bug] (demo.h)
};

// Prints the demo's table and summary to stdout (demo_table.cc).
void print_report(const DemoReport& report);
// The --json file's text (demo_json.cc).
std::string report_json_text(const DemoReport& report);
// Writes every rank's events to args.trace_path as one Chrome trace and
// prints the last step's timeline (demo_trace.cc).
void report_trace(const DemoArgs& args, const std::vector<RankResult>& ranks);

}  // namespace tp::train
