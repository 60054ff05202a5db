// The stage checker: runs a DDP stage against the reference in many
// configurations and explains the first failure in lesson terms.
//
// Contract:
//   - A checker is data: a CheckerSpec holds the stage's StageSpec (its
//     number, title and Advice: its words for its own parts, from its
//     stage.h) and lists cases, each a (RunConfig, options) pair with a
//     label (the options of a run, run_options_t<D>: stage_spec.h), and
//     the stage's stage_checks. run_checker<D>(argc, argv, spec) is the
//     whole main() of a stage's checker (tests/checkers/check_NN.cc).
//   - Each case trains the reference and W spawned DDP ranks, checks that
//     every rank reported what its plan says, runs stage_checks on counted
//     collectives and the trace (usually built from the shared predicates of
//     predicates.h), then compares every rank's per-micro-batch losses,
//     parameters and buffers (compare.h). Findings are reported in that
//     order: a structural fact names the cause before the numbers it moves,
//     and a numeric guess after one says it may only follow from it.
//   - Then its scenarios, if any: properties the training plan cannot
//     express (a no_sync guard that covers only the forward, say), each run
//     once on its own spawned ranks with a connected group. A scenario
//     marked before_cases runs before the cases instead.
//   - Then, for a lesson that has the student write the rank's worker too
//     (stage 01), that worker on each of worker_cases: run as a whole job
//     and compared with the reference (worker.h).
//   - It stops at the first failing case (an exercise stub fails at once),
//     prints the findings, and returns 1; it returns 0 when all pass.
//   - A rank that throws or hangs becomes a finding naming the rank and its
//     message; the likely cause follows the failure's ErrorKind (a stub, a
//     timeout, a rank's own error), never its wording. For a rank's own
//     error, a case or scenario may say more (if_a_rank_throws): what the
//     checker knows and the rank did not, e.g. that the case's graph never
//     changes, so a stage's "the graph changed" blames its own record. (In
//     launched mode the launcher reports a rank's error, not the checker.)
//   - `--expect-fail FILE` turns it into a planted-bug test: FILE (a mutant,
//     see tools/mutate.py) has `expect:` lines, each a phrase the report must
//     contain, and `expect-first:` lines, each a phrase the first finding of
//     the failing case (its fact or its likely cause: the cause named first)
//     must contain; the checker must FAIL with all of them, else it returns 1.
//   - `--list` prints the cases, then the scenarios and the worker cases
//     (numbered on from the cases); `--only N` runs that one alone;
//     `--repeat N` runs the whole check N times, each judged as above, and
//     stops at the first run that is not (for a bug that must be caught on
//     every run, not most).
//   - `--collective-timeout MS` (default RunConfig's 10000): how long a rank
//     waits in one collective, and at rendezvous, before its hang becomes a
//     finding naming it; in every case, scenario and worker case, and in a
//     launched job's group. The test suite shortens it for the planted bugs
//     that end by a hang.
//   - Checker mode: every case runs with RunConfig::check_in_flight_writes,
//     every scenario's group with GlooOptions::check_in_flight_writes, so a
//     tensor written while its collective is in flight, or taken by another
//     collective before its wait() returned, fails every run.
//   - `--device cuda`: every case's ranks train on CUDA tensors (the
//     reference stays on the CPU): NCCL where each rank has a GPU of its own,
//     else Gloo staging through host memory, so W = 2 and 4 share one GPU.
//     Scenarios and worker cases (CPU groups of their own) are skipped, and
//     the report says so; so is checker mode (a race on a CUDA tensor is
//     not caught on every run). Without a usable GPU it prints why and returns 77,
//     the exit code test harnesses count as "skipped": nothing was judged.
//     A stage without the cuda capability (capabilities.h) is refused first,
//     on every machine, as a usage error: exit 2.
//   - `--init-method URL` (env://, tcp://, redis://): one process per rank,
//     started by a launcher (tprun). The processes form one group (RANK and
//     WORLD_SIZE from the environment) and run the cases whose world size is
//     WORLD_SIZE on it, one after the other, each rank training its part;
//     every rank gathers all results and judges them alike (so all stop at
//     the same case), and rank 0 prints the report. Cases of other world
//     sizes, the scenarios and the worker cases (each wants ranks and a group
//     of its own) are skipped, and the report says so; so is checker mode
//     (the launcher's group is an ordinary one). A rank that throws ends the
//     job: the launcher names it.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tensorplay/cuda/runtime.h"
#include "tensorplay/distributed/init.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/multiprocessing/launched_rank.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/train/compare.h"
#include "tensorplay/train/ddp_trainer.h"
#include "tensorplay/train/predicates.h"
#include "tensorplay/train/reference.h"
#include "tensorplay/train/stage_spec.h"
#include "tensorplay/train/worker.h"

namespace tp::train {

// One configuration to check: the plan, the stage's options, and what the
// case is for ("one bucket per parameter").
template <typename Options>
struct CheckCase {
  CheckCase() = default;
  // {config, options, label}, as the checkers write a case.
  CheckCase(RunConfig config_, Options options_ = {}, std::string label_ = "")
      : config(std::move(config_)), options(std::move(options_)), label(std::move(label_)) {}

  RunConfig config;
  Options options{};
  std::string label;  // may be empty
  // The likely cause when a rank of this case throws an error of its own
  // (not a stub, a timeout or a crash); "" for the general one.
  std::string if_a_rank_throws;
  // The bound on |ddp - ref| (Note [Tolerance] in compare.cc); 0: the
  // dtype's default_tolerance. A case sets a tighter one where a bug's
  // whole effect is smaller than the default allows, with the rounding it
  // measured written beside it.
  double tolerance = 0;
};

// The bound a case's numbers are held to: its own, or its dtype's default.
template <typename Options>
double tolerance_of(const CheckCase<Options>& c) {
  return c.tolerance > 0 ? c.tolerance : default_tolerance(c.config.dtype);
}

// A property the training plan cannot express, checked on `world_size`
// spawned ranks. `run` is one rank's part: it gets the rank and a connected
// process group, drives the stage itself, and returns "" when the property
// held on this rank, or the fact that broke it, with numbers ("rank 1: 2
// all-reduces in a backward whose forward ran under no_sync; expected 0").
// A rank's exception or hang becomes a finding as in a case.
struct Scenario {
  using Run =
      std::function<std::string(int rank, std::shared_ptr<distributed::ProcessGroup> group)>;
  Scenario() = default;
  // {label, world_size, run, likely_cause[, if_a_rank_throws]}, as the
  // checkers write a scenario.
  Scenario(std::string label_, int world_size_, Run run_, std::string likely_cause_,
           std::string if_a_rank_throws_ = "")
      : label(std::move(label_)), world_size(world_size_), run(std::move(run_)),
        likely_cause(std::move(likely_cause_)), if_a_rank_throws(std::move(if_a_rank_throws_)) {}

  std::string label;
  int world_size = 2;
  Run run;
  std::string likely_cause;  // in lesson terms, shown when `run` reports a fact
  std::string if_a_rank_throws;  // as CheckCase's
  // Run before the cases (still numbered after them): a property of a
  // piece later cases rely on without showing it (what a comm hook is
  // handed, say), so that a broken piece is named as itself and not blamed
  // on the first case whose numbers it moves.
  bool before_cases = false;
};

// Runs one scenario; its findings (none when it held on every rank).
std::vector<Finding> run_scenario(const std::string& stage, const Scenario& scenario,
                                  std::chrono::milliseconds collective_timeout);

template <typename Options>
struct CheckerSpec {
  StageSpec<Options> stage;  // the stage's stage_spec() (its number, title, Advice)
  std::vector<CheckCase<Options>> cases;
  // Stage-specific checks on one run (counted collectives, trace order...).
  std::function<std::vector<Finding>(const CheckCase<Options>& c, const CaseRun& run)>
      stage_checks;
  // Run after the cases, in order.
  std::vector<Scenario> scenarios;
  // The lesson's rank worker (stage 01's train_worker), run after the
  // scenarios on each of worker_cases; empty when the lesson has none.
  RankWorker<Options> worker;
  std::vector<CheckCase<Options>> worker_cases;
};

// The default sweep of plans: world sizes 2, 1, 3 and 4 (the smallest real
// group first), float32 and float64, shared and per-rank seeds, momentum.
std::vector<RunConfig> standard_configs();
// Each of `configs` with `options`, as cases.
template <typename Options>
std::vector<CheckCase<Options>> cases_of(const std::vector<RunConfig>& configs,
                                         const Options& options = {}, const std::string& label = "") {
  std::vector<CheckCase<Options>> out;
  for (const RunConfig& config : configs) out.push_back({config, options, label});
  return out;
}

// "W=4 steps=6 ... | one bucket per parameter".
template <typename Options>
std::string describe(const CheckCase<Options>& c) {
  return c.label.empty() ? describe(c.config) : describe(c.config) + " | " + c.label;
}

// Command-line handling, reporting and --expect-fail logic (checker.cc).
struct CheckerRun {
  std::string expect_file;  // --expect-fail FILE
  int only = -1;            // --only N
  int repeat = 1;           // --repeat N
  bool list = false;        // --list
  std::string init_method;  // --init-method URL: one rank of a launched job
  Device device = kCPU;     // --device cuda: every case's ranks train on the GPU
  // --collective-timeout MS: how long a rank of any case or scenario waits
  // in one collective before it is a hang (the test suite shortens it for
  // the planted bugs that hang; a case's own collectives take milliseconds).
  std::chrono::milliseconds collective_timeout = RunConfig{}.collective_timeout;
  bool quiet = false;       // a launched job's ranks but 0 print nothing
  std::string report;       // everything printed so far in this repetition
  std::string first_cause;  // the failing case's first finding: fact, then likely cause
  void print(const std::string& text);
};
CheckerRun parse_checker_args(int argc, char** argv);
// Describes an error from a run (a rank's exception or hang, or a plan the
// stage refused) as a finding, by its kind; for a job without progress, by
// where its ranks were too (SpawnError::hang), so the likely cause never
// says a rank waits in a collective when none was in one. A rank's own
// error gets `if_a_rank_throws` as its likely cause, where not "".
Finding finding_from_error(const std::string& stage, const std::exception& error,
                           const std::string& if_a_rank_throws = "");
// Prints PASS or FAIL for one case or scenario; a passing case also shows
// its largest differences from the reference (`comparison`; null for a
// scenario, which has no reference).
void report_case(CheckerRun& run, const std::string& description,
                 const std::vector<Finding>& findings, const Comparison* comparison);
// Applies --expect-fail and prints the verdict; returns the exit code.
int finish_checker(CheckerRun& run, const std::string& stage, bool passed);

// What one pass over the cases, scenarios and worker cases judged.
struct PassTally {
  bool passed = true;  // false from the first failure on (which ends the pass)
  size_t ran = 0;      // cases, scenarios and worker cases judged
  size_t skipped = 0;  // those this job cannot run (another world size, CPU only)
  void judged(bool pass) {
    passed = pass;
    ++ran;
  }
};
// The end of a pass: what was skipped and why, then finish_checker; an exit
// code of 2 for a pass that judged nothing (which must not read as PASS).
// `launched`: this job's group, or null.
int finish_pass(CheckerRun& run, const std::string& stage,
                const distributed::ProcessGroup* launched, const PassTally& tally);
// A launched rank whose case threw: records the error for tprun, says which
// case on stderr, leaves the group; returns the rank's exit code.
int end_launched_rank(distributed::ProcessGroup& launched, const std::string& description,
                      const std::exception& error);

// A case's DDP ranks: spawned here (in checker mode), or, in a launched job
// (`launched` not null), this process's rank of them, with every rank's
// result gathered.
template <DataParallelModel D>
std::vector<RankResult> run_case_ranks(const CheckCase<run_options_t<D>>& c,
                                       const std::shared_ptr<distributed::ProcessGroup>& launched) {
  if (!launched) {
    RunConfig checked = c.config;
    // A write before wait() fails every run. Not on CUDA tensors: the check
    // compares at wait(), which on a GPU would need the host to wait for the
    // device, the very thing streams avoid (Note [Staging CUDA tensors]).
    checked.check_in_flight_writes = c.config.device == kCPU;
    return run_ddp<D>(checked, c.options);
  }
  return all_gather_results(*launched,
                            train_rank<D>(launched->rank(), c.config, launched, c.options));
}

// One case: the reference and the DDP ranks, then the findings in the
// contract's order: missing results; the stage's structural facts (counted
// collectives, order on the trace), which name a cause more directly than
// the numbers they disturb; then the numbers. `comparison` gets the largest
// differences, for a passing case's line.
template <DataParallelModel D>
std::vector<Finding> judge_case(const CheckCase<run_options_t<D>>& c,
                                const CheckerSpec<run_options_t<D>>& spec,
                                const std::shared_ptr<distributed::ProcessGroup>& launched,
                                Comparison& comparison) {
  const double tolerance = tolerance_of(c);
  const ReferenceResult reference = train_reference(c.config);
  const std::vector<RankResult> ranks = run_case_ranks<D>(c, launched);
  std::vector<Finding> findings = check_results_complete(c.config, reference, ranks);
  if (!findings.empty()) return findings;
  if (spec.stage_checks) findings = spec.stage_checks(c, CaseRun{c.config, reference, ranks});
  const bool structural = !findings.empty();
  for (Finding& f : diagnose(c.config, reference, ranks, tolerance, spec.stage.advice)) {
    // A numeric guess after a structural fact is read as what it is.
    if (structural) f.likely_cause = "unless it follows from the first finding: " + f.likely_cause;
    findings.push_back(std::move(f));
  }
  comparison = compare(reference, ranks, tolerance);
  return findings;
}

// The cases (or --only's), on this job's group when launched; stops at the
// first that fails. Returns 0, or the exit code of a launched rank whose
// case threw (its group is unusable then: the rank ends, tprun names it).
template <DataParallelModel D>
int check_cases(CheckerRun& run, const CheckerSpec<run_options_t<D>>& spec,
                const std::shared_ptr<distributed::ProcessGroup>& launched, PassTally& tally) {
  for (size_t i = 0; i < spec.cases.size() && tally.passed; ++i) {
    if (run.only >= 0 && static_cast<size_t>(run.only) != i) continue;
    if (launched && spec.cases[i].config.world_size != launched->size()) {
      ++tally.skipped;
      continue;
    }
    CheckCase<run_options_t<D>> c = spec.cases[i];
    c.config.device = run.device;
    c.config.collective_timeout = run.collective_timeout;
    std::vector<Finding> findings;
    Comparison comparison;
    try {
      findings = judge_case<D>(c, spec, launched, comparison);
    } catch (const std::exception& error) {
      if (launched) return end_launched_rank(*launched, describe(c), error);
      findings.push_back(finding_from_error(spec.stage.number, error, c.if_a_rank_throws));
    }
    tally.judged(findings.empty());
    report_case(run, describe(c), findings, &comparison);
  }
  return 0;
}

// The scenarios, each on ranks and a group of its own: skipped in a
// launched job and on CUDA (they run on the CPU).
// `before_cases`: those that run before the cases, or the others.
template <typename Options>
void check_scenarios(CheckerRun& run, const CheckerSpec<Options>& spec, bool launched,
                     PassTally& tally, bool before_cases) {
  const size_t first = spec.cases.size();  // --list numbers them after the cases
  for (size_t i = 0; i < spec.scenarios.size() && tally.passed; ++i) {
    if (spec.scenarios[i].before_cases != before_cases) continue;
    if (run.only >= 0 && static_cast<size_t>(run.only) != first + i) continue;
    if (launched || run.device != kCPU) {
      ++tally.skipped;
      continue;
    }
    const std::vector<Finding> findings =
        run_scenario(spec.stage.number, spec.scenarios[i], run.collective_timeout);
    tally.judged(findings.empty());
    report_case(run, "scenario: " + spec.scenarios[i].label, findings, nullptr);
  }
}

// The lesson's own rank worker on each worker case, as a whole job (stage
// 01); skipped where the scenarios are.
template <typename Options>
void check_worker_cases(CheckerRun& run, const CheckerSpec<Options>& spec, bool launched,
                        PassTally& tally) {
  if (!spec.worker) return;
  const size_t first = spec.cases.size() + spec.scenarios.size();
  for (size_t i = 0; i < spec.worker_cases.size() && tally.passed; ++i) {
    if (run.only >= 0 && static_cast<size_t>(run.only) != first + i) continue;
    if (launched || run.device != kCPU) {
      ++tally.skipped;
      continue;
    }
    CheckCase<Options> c = spec.worker_cases[i];
    c.config.collective_timeout = run.collective_timeout;
    std::vector<Finding> findings;
    try {
      const ReferenceResult reference = train_reference(c.config);
      const std::vector<WorkerResult> ranks =
          run_workers(c.config, [&](int rank, const std::string& init_method) {
            return spec.worker(rank, c.config, init_method, c.options);
          });
      findings = check_workers(c.config, reference, ranks, tolerance_of(c));
    } catch (const std::exception& error) {
      findings.push_back(finding_from_error(spec.stage.number, error, c.if_a_rank_throws));
    }
    tally.judged(findings.empty());
    report_case(run, "worker: " + describe(c), findings, nullptr);
  }
}

// One run of every case, scenario and worker case (or of --only's), on this
// job's group when launched; the exit code.
template <DataParallelModel D>
int check_once(CheckerRun& run, const CheckerSpec<run_options_t<D>>& spec,
               const std::shared_ptr<distributed::ProcessGroup>& launched) {
  run.print("stage " + spec.stage.number + " checker (" + spec.stage.title + ")\n");
  PassTally tally;
  check_scenarios(run, spec, launched != nullptr, tally, /*before_cases=*/true);
  if (const int code = check_cases<D>(run, spec, launched, tally); code != 0) return code;
  check_scenarios(run, spec, launched != nullptr, tally, /*before_cases=*/false);
  check_worker_cases(run, spec, launched != nullptr, tally);
  return finish_pass(run, spec.stage.number, launched.get(), tally);
}

template <DataParallelModel D>
int run_checker(int argc, char** argv, const CheckerSpec<run_options_t<D>>& spec) {
  CheckerRun run = parse_checker_args(argc, argv);
  const size_t n_cases = spec.cases.size();
  const size_t n_scenarios = spec.scenarios.size();
  const size_t n_workers = spec.worker ? spec.worker_cases.size() : 0;
  if (run.list) {
    for (size_t i = 0; i < n_cases; ++i) {
      std::printf("%zu: %s\n", i, describe(spec.cases[i]).c_str());
    }
    for (size_t i = 0; i < n_scenarios; ++i) {
      std::printf("%zu: scenario: %s\n", n_cases + i, spec.scenarios[i].label.c_str());
    }
    for (size_t i = 0; i < n_workers; ++i) {
      std::printf("%zu: worker: %s\n", n_cases + n_scenarios + i,
                  describe(spec.worker_cases[i]).c_str());
    }
    return 0;
  }
  if (run.only >= static_cast<int>(n_cases + n_scenarios + n_workers)) {
    std::fprintf(stderr, "checker: --only %d: there are %zu cases, scenarios and worker cases "
                 "(see --list)\n", run.only, n_cases + n_scenarios + n_workers);
    return 2;
  }
  // Before asking for a GPU: a CPU-only stage is a usage error everywhere.
  try {
    check_device_fits_stage<D>(run.device);
  } catch (const Error& error) {
    std::fprintf(stderr, "checker: stage %s: --device cuda: %s\n", spec.stage.number.c_str(),
                 error.what());
    return 2;
  }
  if (run.device != kCPU && !cuda::is_available()) {
    // Exit code 77: "skipped" to Meson and to ./kit gpu-check. Nothing was
    // judged, so it must not read as a pass.
    std::printf("SKIP: stage %s checker: --device cuda: skipped, nothing was checked: %s\n",
                spec.stage.number.c_str(), cuda::unavailable_reason().c_str());
    return 77;
  }
  std::shared_ptr<distributed::ProcessGroup> launched;  // --init-method: this job's group
  if (!run.init_method.empty()) {
    multiprocessing::report_to_launcher();  // where it waits, for tprun
    try {
      distributed::init_process_group("gloo", run.init_method, run.collective_timeout);
    } catch (const std::exception& error) {
      multiprocessing::record_error(error);
      std::fprintf(stderr, "checker: %s\n", error.what());
      return 1;
    }
    launched = distributed::default_group();
    run.quiet = launched->rank() != 0;
  }
  int code = 0;
  for (int r = 1; r <= run.repeat && code == 0; ++r) {
    if (run.repeat > 1) run.print(detail::cat("run ", r, " of ", run.repeat, ": "));
    run.report.clear();
    run.first_cause.clear();
    code = check_once<D>(run, spec, launched);
  }
  if (launched && distributed::is_initialized()) distributed::destroy_process_group();
  return code;
}

}  // namespace tp::train
