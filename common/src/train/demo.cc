// A lesson demo's report (demo.h): built once from the run, the reference
// and the diagnoses, then rendered as the table, the --json file and the
// --trace file (demo_report.h); and the float64 re-run that tells float32
// rounding from a bug (Note [Rounding or a bug], demo.h). The command line
// is demo_command_line.cc's.
#include <algorithm>
#include <cmath>
#include <optional>

#include "demo_report.h"
#include "tensorplay/util/file.h"

namespace tp::train {
namespace {

// A rank's loss at step s: the mean of its K micro-batch losses; absent
// (nullopt) when the rank did not take part in step s.
std::optional<double> step_loss(const std::vector<double>& losses, int64_t k, int64_t step) {
  if (static_cast<size_t>((step + 1) * k) > losses.size()) return std::nullopt;
  double sum = 0.0;
  for (int64_t m = 0; m < k; ++m) sum += losses[static_cast<size_t>(step * k + m)];
  return sum / static_cast<double>(k);
}

std::vector<StepRow> step_rows(const RunConfig& config, const ReferenceResult& reference,
                               const std::vector<RankResult>& ranks) {
  std::vector<StepRow> rows;
  const int64_t k = config.micro_batches;
  for (int64_t s = 0; s < total_steps(config); ++s) {
    StepRow row;
    int present = 0;
    for (int r = 0; r < config.world_size; ++r) {
      const auto rank = static_cast<size_t>(r);
      row.reference.push_back(step_loss(reference.losses[rank], k, s));
      row.ddp.push_back(step_loss(ranks[rank].losses, k, s));
      if (row.reference.back()) {
        row.reference_loss += *row.reference.back();
        ++present;
      }
      if (row.reference.back() && row.ddp.back()) {
        row.drift = std::max(row.drift, std::abs(*row.ddp.back() - *row.reference.back()));
      }
    }
    row.reference_loss /= std::max(present, 1);
    rows.push_back(std::move(row));
  }
  return rows;
}

bool reference_diverged(const ReferenceResult& reference) {
  return std::any_of(
      reference.losses.begin(), reference.losses.end(), [](const std::vector<double>& losses) {
        return std::any_of(losses.begin(), losses.end(), [](double v) { return !std::isfinite(v); });
      });
}

DemoReport build_report(const std::string& stage, const std::string& title,
                        const DemoArgs& args, const ReferenceResult& reference,
                        const std::vector<RankResult>& ranks, const Advice& advice,
                        const std::string& approximation, const Float64Rerun& rerun) {
  const RunConfig& config = args.config;
  DemoReport report;
  report.stage = stage;
  report.title = title;
  report.args = &args;
  report.ranks = &ranks;
  report.tolerance = default_tolerance(config.dtype);
  report.comparison = compare(reference, ranks, report.tolerance);
  report.rows = step_rows(config, reference, ranks);
  for (const RankResult& r : ranks) {
    report.rank_norms.push_back(norm(r.final_params));
    report.allreduces_in_step0.push_back(allreduces_in_step(r, config.micro_batches, 0));
  }
  report.approximation = approximation;
  const RankResult& rank0 = ranks.front();
  report.bytes_in_first_step = sum_over_step(rank0.allreduce_bytes_per_micro, config.micro_batches, 0);
  const int64_t rank0_steps = steps_of(config, 0);
  if (rank0_steps > 0) {
    report.bytes_in_last_step =
        sum_over_step(rank0.allreduce_bytes_per_micro, config.micro_batches, rank0_steps - 1);
  }
  if (args.worker) {
    std::vector<WorkerResult> workers;
    for (const RankResult& r : ranks) workers.push_back({r.losses, r.final_params, r.final_buffers});
    report.findings = check_workers(config, reference, workers, report.tolerance);
  } else {
    report.findings = check_results_complete(config, reference, ranks);
    if (report.findings.empty()) {
      report.findings = diagnose(config, reference, ranks, report.tolerance, advice);
    }
  }
  // Nothing to compare DDP with when the single-process run itself overflowed.
  // An approximate run gets no verdict either way: within the tolerance
  // or not, it was not trying to match. A float32 difference that float64
  // does not repeat is rounding (Note [Rounding or a bug] in demo.h).
  const bool differs = !report.findings.empty();
  report.rerun = rerun;
  report.verdict = differs && reference_diverged(reference) ? Verdict::ReferenceDiverged
                   : !approximation.empty()                 ? Verdict::Approximate
                   : differs && rerun.ran && rerun.matches  ? Verdict::Float32Rounding
                   : differs                                ? Verdict::Differs
                                                            : Verdict::Matches;
  return report;
}
}  // namespace

bool wants_float64_rerun(const DemoArgs& args, const ReferenceResult& reference,
                         const std::vector<RankResult>& ranks, const std::string& approximation) {
  const RunConfig& config = args.config;
  if (config.dtype != kFloat32 || args.worker || !args.init_method.empty() ||
      !approximation.empty() || reference_diverged(reference)) {
    return false;
  }
  if (!check_results_complete(config, reference, ranks).empty()) return false;
  return !diagnose(config, reference, ranks, default_tolerance(config.dtype)).empty();
}

Float64Rerun judge_float64_rerun(const RunConfig& config, const ReferenceResult& reference,
                                 const std::vector<RankResult>& ranks) {
  Float64Rerun rerun;
  rerun.ran = true;
  const double tolerance = default_tolerance(config.dtype);
  rerun.matches = check_results_complete(config, reference, ranks).empty() &&
                  diagnose(config, reference, ranks, tolerance).empty();
  const Comparison c = compare(reference, ranks, tolerance);
  rerun.max_param_diff = c.final_params.max_abs;
  rerun.max_loss_diff = c.max_loss_diff;
  return rerun;
}

void report_demo(const std::string& stage, const std::string& title, const DemoArgs& args,
                 const ReferenceResult& reference, const std::vector<RankResult>& ranks,
                 const Advice& advice, const std::string& approximation,
                 const Float64Rerun& rerun) {
  const DemoReport report =
      build_report(stage, title, args, reference, ranks, advice, approximation, rerun);
  print_report(report);
  if (!args.trace_path.empty()) report_trace(args, ranks);
  if (!args.json_path.empty()) write_file(args.json_path, report_json_text(report), "the --json file");
}

}  // namespace tp::train
