// The lesson demo's command line (CLI11), its report, and the report's two
// renderings: the table on stdout and the --json file (nlohmann/json). See
// demo.h.
#include "tensorplay/train/demo.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "command_line.h"
#include "tensorplay/distributed/launcher_env.h"
#include "tensorplay/trace.h"
#include "tensorplay/train/compare.h"
#include "tensorplay/train/predicates.h"
#include "tensorplay/util/file.h"

namespace tp::train {

using cli::add_choice;
using cli::add_number;
using cli::number_in;
using cli::split_commas;
using cli::whole_number;
using cli::whole_numbers;

namespace {

// ---- the command line ---------------------------------------------------------

// A usage error: what is wrong, then where to look; exit 2.
[[noreturn]] void usage_error(const std::string& stage, const std::string& problem) {
  cli::usage_error("demo " + stage, problem);
}

// One process per rank (demo.h): the world size comes from the launcher.
void apply_launcher_environment(const std::string& stage, DemoArgs& args, bool world_size_given) {
  if (const std::string mistake = launch_mistake("demo " + stage, args.init_method);
      !mistake.empty()) {
    usage_error(stage, mistake);
  }
  if (args.init_method.empty()) return;
  // WORLD_SIZE, or under srun SLURM_NTASKS (launcher_env.h).
  const auto world = distributed::from_launcher("WORLD_SIZE");
  if (!world) {
    usage_error(stage, "--init-method " + args.init_method + " runs one rank of a launched job "
                       "and reads WORLD_SIZE and RANK (under srun, SLURM_NTASKS and "
                       "SLURM_PROCID), which are not set; start it with tprun");
  }
  std::string text = world->value;  // made plain by the check
  if (const std::string problem = whole_number(1, 64)(text); !problem.empty()) {
    usage_error(stage, world->variable + " " + problem);
  }
  const int w = std::stoi(text);
  if (world_size_given && w != args.config.world_size) {
    usage_error(stage, detail::cat("--world-size ", args.config.world_size, " disagrees with ",
                                   world->variable, "=", w, " from the launcher"));
  }
  args.config.world_size = w;
}

// The plan as a whole, once every flag is read: what no single flag can
// say. Also the output paths, before the run: a run of minutes must not end
// in "cannot write" (a full disk can still show only when the file is
// written). Launched, only rank 0 writes them (another host may not have
// the path).
void check_plan(const std::string& stage, const DemoArgs& args,
                const std::function<void(const RunConfig&)>& fits_stage) {
  const RunConfig& config = args.config;
  if (!config.batches_per_rank.empty() &&
      config.batches_per_rank.size() != static_cast<size_t>(config.world_size)) {
    usage_error(stage, detail::cat("--batches lists ", config.batches_per_rank.size(),
                                   " counts; give one per rank (--world-size ", config.world_size,
                                   ")"));
  }
  try {
    if (fits_stage) fits_stage(config);  // first: a stage's limit holds on every machine
    validate(config);
    const auto launched_rank = distributed::from_launcher("RANK");
    const bool writes = args.init_method.empty() || !launched_rank ||
                        launched_rank->value == "0";
    if (writes && !args.json_path.empty()) check_writable(args.json_path, "the --json file");
    if (writes && !args.trace_path.empty()) check_writable(args.trace_path, "the --trace file");
  } catch (const Error& e) {
    usage_error(stage, e.what());
  }
}

// The shared flags, every demo's, one function per --help group. Each
// default shown is the value the flag's target holds now.

void add_run_flags(CLI::App& app, DemoArgs& args, bool offers_worker) {
  RunConfig& config = args.config;
  app.option_defaults()->group("The run");
  add_number(app, "--world-size", config.world_size, "W", "ranks", whole_number(1, 64));
  add_number(app, "--steps", config.steps, "N", "optimizer steps", whole_number(1, 100000));
  add_number(app, "--batch", config.batch_size, "B", "rows per micro-batch and rank",
             whole_number(1, 1 << 20));
  add_number(app, "--lr", config.lr, "X", "SGD learning rate",
             number_in(0, INFINITY, /*low_open=*/true));
  add_number(app, "--momentum", config.momentum, "M", "SGD momentum", number_in(0, INFINITY));
  add_choice<Dtype>(app, "--dtype", "of the model and the data",
                    {{"float32", kFloat32}, {"float64", kFloat64}}, config.dtype);
  app.add_flag("--per-rank-seed", config.per_rank_seed,
               "seed each rank's model differently (DDP's broadcast must undo it)");
  app.add_flag_callback(
      "--no-float64-rerun", [&args] { args.float64_rerun = false; },
      "tell a float32 run that differs as it is: no float64 re-run to tell rounding from a bug");
  add_choice<ModelKind>(app, "--model", "the model",
                        {{"mini", ModelKind::MiniMLP},
                         {"branchy", ModelKind::Branchy},
                         {"buffered", ModelKind::Buffered},
                         {"reordered", ModelKind::Reordered},
                         {"deep", ModelKind::Deep}},
                        config.model_kind);
  add_number(app, "--hidden", config.model.hidden, "N", "hidden width",
             whole_number(1, 4096));
  add_number(app, "--depth", config.deep_depth, "N", "hidden layers of --model deep",
             whole_number(1, 1024));
  add_number(app, "--micro-batches", config.micro_batches, "K",
             "micro-batches (backward passes) per optimizer step", whole_number(1, 1024));
  app.add_option_function<std::string>(
         "--batches",
         [&config](const std::string& list) {  // plain counts: whole_numbers made them so
           config.batches_per_rank.clear();
           for (const std::string& count : split_commas(list)) {
             config.batches_per_rank.push_back(std::stoll(count));
           }
         },
         "micro-batches of each rank, one count per rank: uneven inputs (a 0: a rank that "
         "joins at once)")
      ->type_name("N0,N1,...")
      ->transform(whole_numbers(0, 100000));
  app.add_flag_callback(
      "--divide-by-active-ranks", [&config] { config.divisor = Divisor::ActiveRanks; },
      "with uneven inputs, divide by the ranks still training, not by W");
  if (offers_worker) {
    app.add_flag("--worker", args.worker,
                 "run the lesson's own rank worker instead of the kit's trainer");
  }
}

// `timeout_ms`: --collective-timeout, turned into the plan's duration after
// parsing (CLI11 reads numbers, not std::chrono durations).
void add_process_flags(CLI::App& app, DemoArgs& args, int64_t& timeout_ms) {
  RunConfig& config = args.config;
  app.option_defaults()->group("Devices and processes");
  add_choice<Device>(app, "--device", "where the ranks train (the reference stays on the CPU)",
                     {{"cpu", kCPU}, {"cuda", Device{DeviceType::CUDA, -1}}}, config.device);
  add_choice<Backend>(app, "--backend", "the process group's backend",
                      {{"auto", Backend::Auto}, {"gloo", Backend::Gloo}, {"nccl", Backend::NCCL}},
                      config.backend);
  add_number(app, "--collective-timeout", timeout_ms, "MS",
             "bound on the rendezvous and every collective, in ms", whole_number(100, 3600000));
  app.add_option("--init-method", args.init_method,
                 "one rank of a job a launcher started (env://, tcp://, redis://)")
      ->type_name("URL");
}

void add_output_flags(CLI::App& app, DemoArgs& args) {
  app.option_defaults()->group("Output");
  app.add_option("--json", args.json_path, "write the numbers, every rank included")
      ->type_name("FILE")
      ->check(cli::file_name());
  app.add_option("--trace", args.trace_path,
                 "write every rank's timeline as a Chrome trace; print the last step's")
      ->type_name("FILE")
      ->check(cli::file_name());
}

// The stage's own flags (its stage.h); a number's default is the value its
// Options member holds before parsing.
void add_stage_flags(CLI::App& app, const std::string& stage,
                     const std::vector<BoundFlag>& stage_flags, RunConfig& config) {
  app.option_defaults()->group("Stage " + stage + "'s options");
  for (const BoundFlag& f : stage_flags) {
    if (!f.choices.empty()) {
      std::vector<std::pair<std::string, std::string>> named;
      for (const std::string& c : f.choices) named.emplace_back(c, c);
      cli::add_choice<std::string>(app, f.name, f.help, std::move(named), f.initial_choice,
                                   [&f, &config](std::string name) { f.choose(name, config); });
    } else if (f.takes_number) {
      app.add_option_function<double>(
             f.name, [&f, &config](double value) { f.set(value, config); },
             f.help + " " + cli::default_text(f.initial))
          ->type_name(f.whole ? "N" : "X")
          ->transform(f.whole ? whole_number(static_cast<int64_t>(f.low),
                                             static_cast<int64_t>(f.high))
                              : number_in(f.low, f.high));
    } else {
      app.add_flag_callback(f.name, [&f, &config] { f.set(1.0, config); }, f.help);
    }
  }
}

}  // namespace

DemoArgs parse_demo_args(int argc, char** argv, const std::string& stage,
                         const std::string& title, const std::vector<BoundFlag>& stage_flags,
                         bool offers_worker,
                         const std::function<void(const RunConfig&)>& fits_stage) {
  DemoArgs args;
  RunConfig& config = args.config;
  config.steps = 10;
  CLI::App app(
      "Lesson " + stage + "'s demo: " + title + ", next to the single-process reference trainer.",
      "./kit demo " + stage);
  cli::use_kit_defaults(app);

  add_run_flags(app, args, offers_worker);
  int64_t timeout_ms = config.collective_timeout.count();
  add_process_flags(app, args, timeout_ms);
  add_output_flags(app, args);
  add_stage_flags(app, stage, stage_flags, config);
  cli::parse_or_exit(app, argc, argv, "demo " + stage);
  config.collective_timeout = std::chrono::milliseconds(timeout_ms);
  config.trace = !args.trace_path.empty();
  config.trace_first_step = true;  // the list of step 0's all-reduces (print_launches)
  apply_launcher_environment(stage, args, app.count("--world-size") > 0);
  check_plan(stage, args, fits_stage);
  return args;
}

namespace {

// ---- the report: built once, then printed and written -------------------------

// A rank's loss at step s: the mean of its K micro-batch losses; absent
// (nullopt) when the rank did not take part in step s.
std::optional<double> step_loss(const std::vector<double>& losses, int64_t k, int64_t step) {
  if (static_cast<size_t>((step + 1) * k) > losses.size()) return std::nullopt;
  double sum = 0.0;
  for (int64_t m = 0; m < k; ++m) sum += losses[static_cast<size_t>(step * k + m)];
  return sum / static_cast<double>(k);
}

// What one table row shows, also written to the JSON.
struct StepRow {
  double reference_loss = 0.0;                   // mean over the ranks taking part
  std::vector<std::optional<double>> reference;  // [rank]
  std::vector<std::optional<double>> ddp;        // [rank]
  double drift = 0.0;                            // max |ddp - reference| over ranks
};

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

// ---- the table ----------------------------------------------------------------

// A loss as the table shows it: six decimals, or, for a run that blows up,
// an exponent (a 34-digit number would break the columns); "-" for none.
std::string cell(std::optional<double> v) {
  if (!v) return "-";
  char buf[40];
  std::snprintf(buf, sizeof buf, std::fabs(*v) < 1e6 || !std::isfinite(*v) ? "%.6f" : "%.4e", *v);
  return buf;
}

// "branch_b, spare" for {branch_b.weight, branch_b.bias, spare.weight,
// spare.bias}: a module whose parameters are all listed shows as its name.
std::string compact_names(const std::vector<int64_t>& params, const Snapshot& all) {
  std::map<std::string, std::pair<size_t, size_t>> modules;  // prefix -> (listed, total)
  std::vector<std::string> order;
  auto prefix = [](const std::string& name) { return name.substr(0, name.rfind('.')); };
  for (const ParamValues& p : all) {
    if (modules.count(prefix(p.name)) == 0) order.push_back(prefix(p.name));
    ++modules[prefix(p.name)].second;
  }
  for (int64_t p : params) ++modules[prefix(all[static_cast<size_t>(p)].name)].first;
  std::string out;
  for (const std::string& m : order) {
    const auto [listed, total] = modules[m];
    if (listed == 0) continue;
    if (listed == total) {
      out += (out.empty() ? "" : ", ") + m;
      continue;
    }
    for (int64_t p : params) {
      if (prefix(all[static_cast<size_t>(p)].name) == m) {
        out += (out.empty() ? "" : ", ") + all[static_cast<size_t>(p)].name;
      }
    }
  }
  return out.empty() ? "-" : out;
}

// For a model whose forward leaves parameters unused (lesson 05): which got
// no gradient on each rank, per step (per micro-batch with accumulation).
void print_unreached(const RunConfig& config, const std::vector<RankResult>& ranks) {
  bool any = false;
  for (const RankResult& r : ranks) {
    for (const auto& micro : r.unreached_per_micro) any |= !micro.empty();
  }
  if (!any) return;
  const int64_t k = config.micro_batches;
  std::printf("\nparameters that got no gradient (the forward did not reach them), per rank:\n");
  const int64_t steps = std::min<int64_t>(total_steps(config), 10);
  for (int64_t step = 0; step < steps; ++step) {
    std::string line;
    for (const RankResult& r : ranks) {
      std::string cell;
      for (int64_t i = step * k; i < (step + 1) * k; ++i) {
        if (static_cast<size_t>(i) >= r.unreached_per_micro.size()) break;
        const std::string names =
            compact_names(r.unreached_per_micro[static_cast<size_t>(i)], r.final_params);
        cell += k == 1 ? names : detail::cat(i > step * k ? "; " : "", "m", i - step * k, " ", names);
      }
      line += detail::cat(line.empty() ? "" : " | ", "rank ", r.rank, ": ", cell.empty() ? "-" : cell);
    }
    std::printf("  step %lld: %s\n", static_cast<long long>(step), line.c_str());
  }
  if (total_steps(config) > steps) std::printf("  ...\n");
}

// "bucket 0: fc3.bias, fc3.weight (528 B)" for each bucket.
void print_bucket_list(const RunConfig& config, const RankResult& rank0,
                       const std::vector<std::vector<int64_t>>& buckets) {
  const size_t element = element_size(config.dtype);
  for (size_t b = 0; b < buckets.size(); ++b) {
    std::string names;
    size_t bytes = 0;
    for (int64_t p : buckets[b]) {
      if (p < 0 || static_cast<size_t>(p) >= rank0.final_params.size()) continue;
      const ParamValues& param = rank0.final_params[static_cast<size_t>(p)];
      names += (names.empty() ? "" : ", ") + param.name;
      bytes += param.values.size() * element;
    }
    std::printf("  bucket %zu: %s (%zu B)\n", b, names.c_str(), bytes);
  }
}

// The buckets, when the stage has them: what the DDP built, in index order
// (the order it must launch them in), each listing its parameters in the
// order they were assigned.
void print_buckets(const RunConfig& config, const RankResult& rank0) {
  if (rank0.buckets.empty()) return;
  if (!rank0.initial_buckets.empty() && rank0.initial_buckets != rank0.buckets) {
    std::printf("buckets on rank 0 at construction (index order):\n");
    print_bucket_list(config, rank0, rank0.initial_buckets);
    std::printf("rebuilt after the first step (index order):\n");
  } else {
    std::printf("buckets on rank 0 (index order):\n");
  }
  print_bucket_list(config, rank0, rank0.buckets);
}

int64_t event_arg(const trace::Event& e, const std::string& key) {
  for (const auto& [k, v] : e.args) {
    if (k == key) return v;
  }
  return -1;
}

// What happened, beside what should have: every all-reduce rank 0's main
// thread queued in step 0, in the order it queued them, read from its trace
// of step 0 (RunConfig::trace_first_step): its bytes, the bucket of that size
// (step 0's buckets, in index order, each taken once; sizes are all a trace
// tells apart), and the span it was queued in ("the hook of fc1.weight",
// "sync_grads", "callbacks" for an end-of-backward callback, "forward").
void print_launches(const RunConfig& config, const RankResult& rank0) {
  const trace::Event* step0 = nullptr;
  for (const trace::Event& e : rank0.events) {
    if (e.phase == 'X' && e.name == "step" && event_arg(e, "step") == 0) step0 = &e;
  }
  if (rank0.buckets.empty()) return;  // one all-reduce per parameter: nothing to pair
  if (step0 == nullptr) return;  // no trace: --worker, or rank 0 had no step
  const auto& buckets = rank0.initial_buckets.empty() ? rank0.buckets : rank0.initial_buckets;
  std::vector<int64_t> bucket_bytes;
  for (const std::vector<int64_t>& bucket : buckets) {
    int64_t bytes = 0;
    for (int64_t p : bucket) {
      if (p < 0 || static_cast<size_t>(p) >= rank0.final_params.size()) continue;
      bytes += static_cast<int64_t>(rank0.final_params[static_cast<size_t>(p)].values.size() *
                                    element_size(config.dtype));
    }
    bucket_bytes.push_back(bytes);
  }
  std::vector<bool> taken(bucket_bytes.size(), false);
  std::vector<std::string> lines;
  for (const trace::Event& e : rank0.events) {
    if (e.phase != 'i' || e.name != "allreduce queued" || e.tid != step0->tid ||
        e.begin_order < step0->begin_order || e.begin_order > step0->end_order) {
      continue;
    }
    const int64_t bytes = event_arg(e, "bytes");
    std::string what = detail::cat(bytes, " B");
    for (size_t b = 0; b < bucket_bytes.size(); ++b) {
      if (taken[b] || bucket_bytes[b] != bytes) continue;
      taken[b] = true;
      what += detail::cat(", bucket ", b);
      for (size_t c = b + 1; c < bucket_bytes.size(); ++c) {
        if (!taken[c] && bucket_bytes[c] == bytes) {
          what += detail::cat(" (or ", c, ": the same size)");
          break;
        }
      }
      break;
    }
    const trace::Event* in = span_around(rank0.events, e);
    std::string where = in == nullptr ? "the step itself" : in->name;
    if (in != nullptr && in->name == "hook") {
      const int64_t p = event_arg(*in, "param");
      where = p >= 0 && static_cast<size_t>(p) < rank0.final_params.size()
                  ? "the hook of " + rank0.final_params[static_cast<size_t>(p)].name
                  : "a hook";
    }
    lines.push_back(detail::cat(what, ", queued in ", where));
  }
  const bool rebuilt = !rank0.initial_buckets.empty() && rank0.initial_buckets != rank0.buckets;
  std::printf("all-reduces rank 0 launched in step 0%s, in launch order:\n",
              rebuilt ? " (its buckets: those at construction)" : "");
  if (lines.empty()) std::printf("  none\n");
  for (size_t i = 0; i < lines.size(); ++i) std::printf("  %zu. %s\n", i + 1, lines[i].c_str());
}

// The first line: the stage, then the plan, naming the knobs lesson 01
// leaves at their defaults only when they are set.
void print_header(const DemoReport& report) {
  const RunConfig& config = report.args->config;
  const int64_t k = config.micro_batches;
  std::string extra;
  if (k > 1) extra += detail::cat(", ", k, " micro-batches per step");
  if (uneven(config)) {
    extra += ", batches per rank";
    for (int r = 0; r < config.world_size; ++r) {
      extra += detail::cat(r ? "/" : " ", micro_batches_of(config, r));
    }
  }
  if (config.model_kind != ModelKind::MiniMLP) extra += ", " + to_string(config.model_kind);
  // The seed mode (--per-rank-seed) changes no number in the table when the
  // broadcast works, so the header is where it shows.
  extra += config.per_rank_seed ? ", per-rank seeds" : ", shared seed";
  if (report.args->worker) extra += ", the lesson's worker";
  std::printf("stage %s: %s. %d rank%s, %lld steps, batch %lld per rank, lr %g%s, %s%s\n",
              report.stage.c_str(), report.title.c_str(), config.world_size,
              config.world_size == 1 ? "" : "s", static_cast<long long>(total_steps(config)),
              static_cast<long long>(config.batch_size), config.lr,
              config.momentum > 0 ? detail::cat(", momentum ", config.momentum).c_str() : "",
              tp::to_string(config.dtype).c_str(), extra.c_str());
  // Whose code ran: the solution's demo says nothing more.
  if (!report.args->mine.empty()) {
    std::printf("your code ran: %s (./kit demo %s --mine), not the stage's solution\n",
                report.args->mine.c_str(), report.stage.c_str());
  }
  std::printf("\n");
}

void print_step_table(const DemoReport& report) {
  const RunConfig& config = report.args->config;
  const int last = config.world_size - 1;
  const auto l = static_cast<size_t>(last);
  if (config.micro_batches > 1) {
    std::printf("(each loss is the mean over the step's %lld micro-batches)\n",
                static_cast<long long>(config.micro_batches));
  }
  std::printf("%4s  %10s  %11s %11s  %11s %11s  %15s\n", "step", "reference", "rank 0 DDP",
              "rank 0 ref", detail::cat("rank ", last, " DDP").c_str(),
              detail::cat("rank ", last, " ref").c_str(), "max |DDP - ref|");
  for (size_t s = 0; s < report.rows.size(); ++s) {
    const StepRow& row = report.rows[s];
    std::printf("%4zu  %10s  %11s %11s  %11s %11s  %15.2e\n", s, cell(row.reference_loss).c_str(),
                cell(row.ddp[0]).c_str(), cell(row.reference[0]).c_str(), cell(row.ddp[l]).c_str(),
                cell(row.reference[l]).c_str(), row.drift);
  }
}

// Which ranks train and which, having run out, shadow the others.
void print_uneven_steps(const RunConfig& config) {
  std::printf("(- : the rank had no batch left at that step)\n");
  std::printf("\nranks per step (uneven inputs):\n");
  for (int64_t step = 0; step < total_steps(config); ++step) {
    std::string training, shadowing;
    for (int r = 0; r < config.world_size; ++r) {
      std::string& list = step < steps_of(config, r) ? training : shadowing;
      list += (list.empty() ? "" : ",") + std::to_string(r);
    }
    std::printf("  step %lld: training %s; shadowing %s; divided by %d\n",
                static_cast<long long>(step), training.c_str(),
                shadowing.empty() ? "-" : shadowing.c_str(), divisor_at(config, step));
  }
}

// A sharded optimizer's partition (stage 09), and what its step moved:
// each rank's parameters with their elements, then rank 0's bytes per
// collective in its last step.
void print_shards(const RunConfig& config, const RankResult& rank0) {
  std::printf("\nshards (each rank steps and keeps optimizer state for its own):\n");
  for (size_t r = 0; r < rank0.shard_partition.size(); ++r) {
    std::string names;
    size_t elements = 0;
    for (int64_t p : rank0.shard_partition[r]) {
      const ParamValues& param = rank0.final_params.at(static_cast<size_t>(p));
      names += (names.empty() ? "" : ", ") + param.name;
      elements += param.values.size();
    }
    std::printf("  rank %zu: %zu elements: %s\n", r, elements, names.empty() ? "(none)" : names.c_str());
  }
  const int64_t steps = steps_of(config, rank0.rank);
  if (steps == 0) return;
  const int64_t k = config.micro_batches;
  const auto last = [&](const std::vector<uint64_t>& per_micro) {
    return static_cast<unsigned long long>(sum_over_step(per_micro, k, steps - 1));
  };
  std::printf("bytes in rank %d's last step: all-reduced %llu, reduce-scattered %llu, "
              "all-gathered %llu, broadcast %llu\n",
              rank0.rank, last(rank0.allreduce_bytes_per_micro),
              last(rank0.reduce_scatter_bytes_per_micro), last(rank0.allgather_bytes_per_micro),
              last(rank0.broadcast_bytes_per_micro));
}

void print_summary(const DemoReport& report) {
  const RunConfig& config = report.args->config;
  const RankResult& rank0 = report.ranks->front();
  const Comparison& c = report.comparison;
  const int64_t k = config.micro_batches;
  std::printf("\nfinal parameter norm: reference %.9f, rank 0 %.9f\n", c.reference_norm,
              c.rank0_norm);
  std::printf("largest parameter difference vs the reference: %.2e (%s on rank %d)\n",
              c.final_params.max_abs, c.final_params.name.c_str(), c.final_params.rank);
  std::printf("largest parameter difference between ranks:    %.2e\n",
              c.final_between_ranks.max_abs);
  if (!c.final_buffers.name.empty()) {
    std::printf("largest buffer difference vs the reference:    %.2e (%s on rank %d)\n",
                c.final_buffers.max_abs, c.final_buffers.name.c_str(), c.final_buffers.rank);
  }
  std::printf("largest loss difference vs the reference:      %.2e (step %lld, rank %d)\n",
              c.max_loss_diff, static_cast<long long>(c.loss_index < 0 ? -1 : c.loss_index / k),
              c.loss_rank);
  if (!report.args->worker) {  // a worker counts no collectives
    std::printf("all-reduces in step 0 on rank 0: %llu for %zu parameter tensors\n",
                static_cast<unsigned long long>(report.allreduces_in_step0.front()),
                rank0.final_params.size());
    std::printf("bytes all-reduced by rank 0: %llu in the first step, %llu in the last\n",
                static_cast<unsigned long long>(report.bytes_in_first_step),
                static_cast<unsigned long long>(report.bytes_in_last_step));
    // A sharded stage's flat collectives (ZeRO's reduce-scatter form, FSDP),
    // counted as the all-reduces are: a line only where a step has some.
    const auto in_step0 = [&](const std::vector<uint64_t>& per_micro) {
      return static_cast<unsigned long long>(sum_over_step(per_micro, k, 0));
    };
    if (in_step0(rank0.allgathers_per_micro) + in_step0(rank0.reduce_scatters_per_micro) > 0) {
      std::printf("all-gathers and reduce-scatters in step 0 on rank 0: %llu of %llu bytes "
                  "and %llu of %llu bytes\n",
                  in_step0(rank0.allgathers_per_micro), in_step0(rank0.allgather_bytes_per_micro),
                  in_step0(rank0.reduce_scatters_per_micro),
                  in_step0(rank0.reduce_scatter_bytes_per_micro));
    }
  }
  if (!rank0.shard_partition.empty()) print_shards(config, rank0);
  if (k > 1) {
    // Where in the step they happen: with no_sync, all in the last one.
    std::string per_micro;
    for (int64_t m = 0; m < k && m < static_cast<int64_t>(rank0.allreduces_per_micro.size()); ++m) {
      per_micro += (m ? ", " : "") + std::to_string(rank0.allreduces_per_micro[m]);
    }
    std::printf("all-reduces in each of step 0's %lld micro-batches on rank 0: %s\n",
                static_cast<long long>(k), per_micro.c_str());
  }
}

// Each rank's model state, as tp::memory counted it (RankResult::memory):
// what ZeRO divides among the ranks. Not for a lesson's worker (--worker),
// which measures nothing.
void print_memory(const std::vector<RankResult>& ranks) {
  if (std::none_of(ranks.begin(), ranks.end(),
                   [](const RankResult& r) { return r.memory.has_value(); })) {
    return;
  }
  std::printf("\nmemory per rank, KiB (tensor bytes at the end; peak since the model was built):\n");
  std::printf("%6s  %10s  %10s  %15s  %24s\n", "rank", "parameters", "gradients",
              "optimizer state", "peak params+grads+state");
  for (const RankResult& r : ranks) {
    if (!r.memory) continue;
    const memory::Stats& m = *r.memory;
    auto kib = [](uint64_t bytes) { return static_cast<double>(bytes) / 1024.0; };
    std::printf("%6d  %10.1f  %10.1f  %15.1f  %24.1f\n", r.rank,
                kib(m.live_bytes(memory::Kind::Parameter)), kib(m.live_bytes(memory::Kind::Gradient)),
                kib(m.live_bytes(memory::Kind::OptimizerState)), kib(m.model_state_peak));
  }
}

void print_verdict(const DemoReport& report) {
  switch (report.verdict) {
    case Verdict::Matches:
      std::printf("verdict: matches the reference within %.0e x max(1, |value|)\n",
                  report.tolerance);
      break;
    case Verdict::ReferenceDiverged:
      std::printf("verdict: no verdict on DDP: the reference itself diverged\n%s",
                  format_findings(report.findings).c_str());
      break;
    case Verdict::Differs:
      std::printf("verdict: DIFFERS from the reference\n%s",
                  format_findings(report.findings).c_str());
      if (report.rerun.ran) {
        std::printf("  re-run in float64, the same plan differs too (parameters %.2e, losses "
                    "%.2e from its reference): not float32 rounding\n",
                    report.rerun.max_param_diff, report.rerun.max_loss_diff);
      } else if (report.rerun.skipped) {
        std::printf("  not re-run in float64 (--no-float64-rerun): float32 rounding grown over "
                    "the run is not ruled out; drop the flag to tell (Note [Rounding or a bug])\n");
      }
      break;
    case Verdict::Float32Rounding:
      std::printf("verdict: matches the reference in float64; in float32 it drifts by rounding\n"
                  "  the float32 run ends %.2e from the reference (largest parameter difference,\n"
                  "  above), beyond %.0e; the same plan re-run in float64 ends %.2e from its\n"
                  "  reference (losses %.2e), within %.0e. A wrong DDP differs in float64 too.\n"
                  "  DDP sums the ranks' gradients in another order than the reference, so their\n"
                  "  last bits differ from the first step on, and training amplifies that over\n"
                  "  the steps (Note [Rounding or a bug] in tensorplay/train/demo.h). A race can\n"
                  "  also come and go between runs: ./kit check runs every case in checker mode.\n",
                  report.comparison.final_params.max_abs, report.tolerance,
                  report.rerun.max_param_diff, report.rerun.max_loss_diff,
                  default_tolerance(kFloat64));
      break;
    case Verdict::Approximate:
      std::printf("verdict: approximate by design (%s): no verdict against the exact reference; "
                  "the distances above are what it costs\n",
                  report.approximation.c_str());
      break;
  }
}

void print_report(const DemoReport& report) {
  const RunConfig& config = report.args->config;
  print_header(report);
  print_buckets(config, report.ranks->front());
  print_launches(config, report.ranks->front());
  if (!report.ranks->front().buckets.empty()) std::printf("\n");
  print_step_table(report);
  if (uneven(config)) print_uneven_steps(config);
  print_unreached(config, *report.ranks);
  print_summary(report);
  print_memory(*report.ranks);
  print_verdict(report);
}

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

// ---- the JSON -----------------------------------------------------------------

using Json = nlohmann::ordered_json;  // keys in the order written: the schema's

// A number, or null where there is none (a rank without a batch at that
// step) or it is not finite (JSON has no inf or NaN).
Json number_or_null(std::optional<double> v) {
  return v && std::isfinite(*v) ? Json(*v) : Json(nullptr);
}

Json numbers(const std::vector<double>& values) {
  Json out = Json::array();
  for (double v : values) out.push_back(number_or_null(v));
  return out;
}

Json numbers(const std::vector<std::optional<double>>& values) {
  Json out = Json::array();
  for (const std::optional<double>& v : values) out.push_back(number_or_null(v));
  return out;
}

// Schema: {stage, title, config{...}, steps[{step, reference_loss,
// reference_rank_losses[W], ddp_rank_losses[W], max_abs_diff}],
// ranks[{rank, micro_batch_losses[], allreduces_per_micro[],
// allreduce_bytes_per_micro[], reduce_scatters_per_micro[],
// reduce_scatter_bytes_per_micro[], allgathers_per_micro[],
// allgather_bytes_per_micro[], broadcast_bytes_per_micro[],
// shard_partition[W][] and params_with_state[] (a sharded optimizer's; else
// empty), memory{parameter_bytes, gradient_bytes, optimizer_state_bytes
// (live at the end), peak_parameter_bytes, peak_gradient_bytes,
// peak_model_state_bytes (the most since the model was built)}}],
// final{...}}.
// A rank that did not take part in a step has null there; memory is null for
// a lesson's worker (--worker), which measures nothing.
Json report_json(const DemoReport& report) {
  const RunConfig& config = report.args->config;
  const std::vector<RankResult>& ranks = *report.ranks;
  const Comparison& c = report.comparison;
  Json j;
  j["stage"] = report.stage;
  j["title"] = report.title;
  j["config"] = {{"world_size", config.world_size},
                 {"steps", report.rows.size()},
                 {"micro_batches", config.micro_batches},
                 {"batch_size", config.batch_size},
                 {"model", to_string(config.model_kind)},
                 {"lr", number_or_null(config.lr)},
                 {"momentum", number_or_null(config.momentum)},
                 {"dtype", to_string(config.dtype)},
                 {"per_rank_seed", config.per_rank_seed},
                 {"device", config.device.type == DeviceType::CUDA ? "cuda" : "cpu"},
                 {"backend", to_string(resolved_backend(config))},
                 {"tolerance", number_or_null(report.tolerance)}};
  j["steps"] = Json::array();
  for (size_t s = 0; s < report.rows.size(); ++s) {
    const StepRow& row = report.rows[s];
    j["steps"].push_back({{"step", s},
                          {"reference_loss", number_or_null(row.reference_loss)},
                          {"reference_rank_losses", numbers(row.reference)},
                          {"ddp_rank_losses", numbers(row.ddp)},
                          {"max_abs_diff", number_or_null(row.drift)}});
  }
  j["ranks"] = Json::array();
  for (const RankResult& r : ranks) {
    Json mem = nullptr;
    if (r.memory) {
      mem = {{"parameter_bytes", r.memory->live_bytes(memory::Kind::Parameter)},
             {"gradient_bytes", r.memory->live_bytes(memory::Kind::Gradient)},
             {"optimizer_state_bytes", r.memory->live_bytes(memory::Kind::OptimizerState)},
             {"peak_parameter_bytes", r.memory->peak_bytes(memory::Kind::Parameter)},
             {"peak_gradient_bytes", r.memory->peak_bytes(memory::Kind::Gradient)},
             {"peak_model_state_bytes", r.memory->model_state_peak}};
    }
    j["ranks"].push_back({{"rank", r.rank},
                          {"micro_batch_losses", numbers(r.losses)},
                          {"allreduces_per_micro", r.allreduces_per_micro},
                          {"allreduce_bytes_per_micro", r.allreduce_bytes_per_micro},
                          {"reduce_scatters_per_micro", r.reduce_scatters_per_micro},
                          {"reduce_scatter_bytes_per_micro", r.reduce_scatter_bytes_per_micro},
                          {"allgathers_per_micro", r.allgathers_per_micro},
                          {"allgather_bytes_per_micro", r.allgather_bytes_per_micro},
                          {"broadcast_bytes_per_micro", r.broadcast_bytes_per_micro},
                          {"shard_partition", r.shard_partition},
                          {"params_with_state", r.params_with_state},
                          {"memory", std::move(mem)}});
  }
  j["final"] = {{"reference_param_norm", number_or_null(c.reference_norm)},
                {"rank_param_norms", numbers(report.rank_norms)},
                {"max_param_diff_vs_reference", number_or_null(c.final_params.max_abs)},
                {"max_param_diff_param", c.final_params.name},
                {"max_param_diff_rank", c.final_params.rank},
                {"max_param_diff_between_ranks", number_or_null(c.final_between_ranks.max_abs)},
                {"max_loss_diff", number_or_null(c.max_loss_diff)},
                {"num_parameters", ranks.front().final_params.size()},
                {"allreduces_per_step", report.allreduces_in_step0},
                {"matches_reference", report.findings.empty()},
                {"float64_rerun", report.rerun.ran ? Json{{"matches", report.rerun.matches},
                                                         {"max_param_diff", report.rerun.max_param_diff},
                                                         {"max_loss_diff", report.rerun.max_loss_diff}}
                                                   : Json(nullptr)},
                {"float64_rerun_skipped", report.rerun.skipped},
                {"float32_rounding", report.verdict == Verdict::Float32Rounding},
                {"approximation", report.approximation},
                {"allreduce_bytes_first_step", report.bytes_in_first_step},
                {"allreduce_bytes_last_step", report.bytes_in_last_step}};
  return j;
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
  if (!args.json_path.empty()) {
    write_file(args.json_path,
               report_json(report).dump(2, ' ', false, Json::error_handler_t::replace) + "\n",
               "the --json file");
  }
}

}  // namespace tp::train
