// The stage checker: runs a DDP stage against the reference in many
// configurations and explains the first failure in lesson terms.
//
// Contract:
//   - run_checker<D>(argc, argv, spec) is the whole main() of a stage's
//     checker (tests/checkers/check_NN.cc). It runs spec.configs in order;
//     each config trains the reference and W spawned DDP ranks, then compares
//     every rank's per-step losses and parameters (compare.h) and runs the
//     stage's own checks on counted collectives (spec.stage_checks).
//   - It stops at the first failing config (an exercise stub fails at once),
//     prints the findings, and returns 1; it returns 0 when all pass.
//   - A rank that throws or hangs becomes a finding naming the rank and its
//     message (a hang names the collective it waits in).
//   - `--expect-fail FILE` turns it into a planted-bug test: FILE (a mutant,
//     see tools/mutate.py) has `expect:` lines; the checker must FAIL and its
//     report must contain every expected phrase, else it returns 1.
//   - `--list` prints the configs; `--only N` runs config N alone.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/train/compare.h"
#include "tensorplay/train/ddp_trainer.h"
#include "tensorplay/train/reference.h"

namespace tp::train {

// Stage-specific checks on one run (counted collectives, trace order...).
using StageChecks = std::function<std::vector<Finding>(
    const RunConfig& config, const std::vector<RankResult>& ranks, size_t num_params)>;

struct CheckerSpec {
  std::string stage;  // "01"
  std::string title;  // "naive DDP"
  std::vector<RunConfig> configs;
  StageChecks stage_checks;
};

// The default sweep: world sizes 1, 2, 3 and 4, float32 and float64, shared
// and per-rank seeds.
std::vector<RunConfig> standard_configs();

// Stages that sync after backward (01, 02), checked on each rank's trace
// (RunConfig::trace) with happens-before on the trace's total order, never
// wall-clock time: every all-reduce of step s starts after step s's backward
// has finished, and finishes before step s's optimizer step starts.
std::vector<Finding> check_sync_between_backward_and_step(const std::vector<RankResult>& ranks);

// Command-line handling, reporting and --expect-fail logic (checker.cc).
struct CheckerRun {
  std::string expect_file;  // --expect-fail FILE
  int only = -1;            // --only N
  bool list = false;        // --list
  std::string report;       // everything printed so far
  void print(const std::string& text);
};
CheckerRun parse_checker_args(int argc, char** argv);
// Describes a rank failure (exception or hang) as a finding.
Finding finding_from_spawn_error(const std::string& stage, const std::exception& error);
// Applies --expect-fail and prints the verdict; returns the exit code.
int finish_checker(CheckerRun& run, const CheckerSpec& spec, bool passed);

template <DataParallelModel D>
int run_checker(int argc, char** argv, const CheckerSpec& spec,
                const typename D::Options& options = {}) {
  CheckerRun run = parse_checker_args(argc, argv);
  if (run.list) {
    for (size_t i = 0; i < spec.configs.size(); ++i) {
      std::printf("%zu: %s\n", i, describe(spec.configs[i]).c_str());
    }
    return 0;
  }
  if (run.only >= static_cast<int>(spec.configs.size())) {
    std::fprintf(stderr, "checker: --only %d: there are %zu configurations (see --list)\n",
                 run.only, spec.configs.size());
    return 2;
  }
  run.print("stage " + spec.stage + " checker (" + spec.title + ")\n");
  bool passed = true;
  for (size_t i = 0; i < spec.configs.size() && passed; ++i) {
    if (run.only >= 0 && static_cast<size_t>(run.only) != i) continue;
    const RunConfig& config = spec.configs[i];
    const double tolerance = default_tolerance(config.dtype);
    std::vector<Finding> findings;
    Comparison comparison;
    try {
      ReferenceResult reference = train_reference(config);
      std::vector<RankResult> ranks = run_ddp<D>(config, options);
      findings = diagnose(config, reference, ranks, tolerance);
      if (spec.stage_checks) {
        for (Finding& f : spec.stage_checks(config, ranks, reference.final_params.size())) {
          findings.push_back(std::move(f));
        }
      }
      comparison = compare(reference, ranks, tolerance);
    } catch (const std::exception& error) {
      findings.push_back(finding_from_spawn_error(spec.stage, error));
    }
    char line[256];
    if (findings.empty()) {
      std::snprintf(line, sizeof line,
                    "PASS  %-48s max |loss diff| %.1e  max |param diff| %.1e\n",
                    describe(config).c_str(), comparison.max_loss_diff,
                    comparison.final_params.max_abs);
      run.print(line);
    } else {
      passed = false;
      run.print("FAIL  " + describe(config) + "\n" + format_findings(findings));
    }
  }
  return finish_checker(run, spec, passed);
}

}  // namespace tp::train
