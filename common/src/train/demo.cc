// The lesson demo's argument parsing, table and JSON (see demo.h).
#include "tensorplay/train/demo.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>

#include "tensorplay/trace.h"
#include "tensorplay/util/file.h"
#include "tensorplay/train/compare.h"

namespace tp::train {

namespace {

// The stage's own flags, for usage(); set by parse_demo_args.
const std::vector<DemoFlag>* g_stage_flags = nullptr;

[[noreturn]] void usage(const std::string& stage, int code, const std::string& problem = "") {
  std::FILE* out = code == 0 ? stdout : stderr;
  if (!problem.empty()) std::fprintf(out, "demo %s: %s\n", stage.c_str(), problem.c_str());
  std::fprintf(out,
               "usage: ./kit demo %s [--world-size W] [--steps N] [--batch B] [--lr X]\n"
               "                  [--momentum M] [--dtype float32|float64] [--per-rank-seed]\n"
               "                  [--model mini|branchy|buffered|reordered|deep] [--hidden N]\n"
               "                  [--depth N (deep)] [--micro-batches K]\n"
               "                  [--batches N0,N1,...] [--divide-by-active-ranks]\n"
               "                  [--json FILE] [--trace FILE] [--init-method URL]\n"
               "                  [--collective-timeout MS] [--device cpu|cuda]\n"
               "                  [--backend auto|gloo|nccl]",
               stage.c_str());
  if (g_stage_flags != nullptr) {
    for (const DemoFlag& f : *g_stage_flags) {
      std::fprintf(out, " [%s%s%s]", f.name.c_str(), f.value_name.empty() ? "" : " ",
                   f.value_name.c_str());
    }
  }
  std::fprintf(out, "\n");
  if (g_stage_flags != nullptr) {
    for (const DemoFlag& f : *g_stage_flags) {
      std::fprintf(out, "  %-24s %s\n", f.name.c_str(), f.help.c_str());
    }
  }
  std::exit(code);
}

double parse_number(const std::string& stage, const std::string& flag, const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v)) {
    usage(stage, 2, flag + " expects a number, got '" + text + "'");
  }
  return v;
}

int64_t parse_count(const std::string& stage, const std::string& flag, const std::string& text,
                    int64_t low, int64_t high) {
  double v = parse_number(stage, flag, text);
  if (v != std::floor(v) || v < static_cast<double>(low) || v > static_cast<double>(high)) {
    usage(stage, 2, detail::cat(flag, " expects a whole number from ", low, " to ", high,
                                ", got '", text, "'"));
  }
  return static_cast<int64_t>(v);
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

template <typename T, typename F>
std::string json_list(const std::vector<T>& items, F&& render) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + render(items[i]);
  return out + "]";
}

// Writes every rank's events as one Chrome trace and prints the last step's
// timeline. Each rank's clock starts at its own trace::enable(), so clocks of
// different ranks are not aligned: the timeline starts every rank's row at
// that rank's own step start. Within a rank the order is exact.
void report_trace(const DemoArgs& args, const std::vector<RankResult>& ranks) {
  std::vector<trace::Event> all, last_step;
  const int64_t last = total_steps(args.config) - 1;
  for (const RankResult& r : ranks) {
    int64_t begin = -1, end = -1;
    for (const trace::Event& e : r.events) {
      all.push_back(e);
      if (e.name == "step" && !e.args.empty() && e.args[0].second == last) {
        begin = e.ts_us;
        end = e.ts_us + e.dur_us;
      }
    }
    for (trace::Event e : r.events) {
      if (e.ts_us < begin || e.ts_us > end || e.name == "step") continue;
      e.ts_us -= begin;  // every rank's row starts at its own step start
      last_step.push_back(std::move(e));
    }
  }
  write_file(args.trace_path, trace::to_chrome_json(all), "the --trace file");
  std::printf("\ntimeline of step %lld, each rank from its own step start (all steps: open %s in "
              "ui.perfetto.dev):\n%s",
              static_cast<long long>(last), args.trace_path.c_str(),
              trace::render_ascii(last_step, 100).c_str());
}

// One process per rank (demo.h): the world size comes from the launcher.
void apply_launcher_environment(const std::string& stage, DemoArgs& args, bool world_size_given) {
  if (const std::string mistake = launch_mistake("demo " + stage, args.init_method);
      !mistake.empty()) {
    usage(stage, 2, mistake);
  }
  if (args.init_method.empty()) return;
  const char* world = std::getenv("WORLD_SIZE");
  if (world == nullptr) {
    usage(stage, 2, "--init-method " + args.init_method + " runs one rank of a launched job "
                    "and reads WORLD_SIZE and RANK, which are not set; start it with tprun");
  }
  const int64_t w = parse_count(stage, "WORLD_SIZE", world, 1, 64);
  if (world_size_given && w != args.config.world_size) {
    usage(stage, 2, detail::cat("--world-size ", args.config.world_size,
                                " disagrees with WORLD_SIZE=", w, " from the launcher"));
  }
  args.config.world_size = static_cast<int>(w);
}

}  // namespace

DemoArgs parse_demo_args(int argc, char** argv, const std::string& stage,
                         const std::vector<DemoFlag>& stage_flags,
                         const std::function<void(const RunConfig&)>& fits_stage) {
  g_stage_flags = &stage_flags;
  DemoArgs args;
  args.config.steps = 10;
  bool world_size_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(stage, 2, flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      usage(stage, 0);
    } else if (flag == "--world-size") {
      args.config.world_size = static_cast<int>(parse_count(stage, flag, value(), 1, 64));
      world_size_given = true;
    } else if (flag == "--steps") {
      args.config.steps = parse_count(stage, flag, value(), 1, 100000);
    } else if (flag == "--batch") {
      args.config.batch_size = parse_count(stage, flag, value(), 1, 1 << 20);
    } else if (flag == "--lr") {
      args.config.lr = parse_number(stage, flag, value());
      if (args.config.lr <= 0) usage(stage, 2, "--lr must be positive");
    } else if (flag == "--momentum") {
      args.config.momentum = parse_number(stage, flag, value());
      if (args.config.momentum < 0) usage(stage, 2, "--momentum must be >= 0");
    } else if (flag == "--dtype") {
      std::string d = value();
      if (d == "float32") {
        args.config.dtype = kFloat32;
      } else if (d == "float64") {
        args.config.dtype = kFloat64;
      } else {
        usage(stage, 2, "--dtype expects float32 or float64, got '" + d + "'");
      }
    } else if (flag == "--per-rank-seed") {
      args.config.per_rank_seed = true;
    } else if (flag == "--model") {
      const std::string m = value();
      if (m == "mini") {
        args.config.model_kind = ModelKind::MiniMLP;
      } else if (m == "branchy") {
        args.config.model_kind = ModelKind::Branchy;
      } else if (m == "buffered") {
        args.config.model_kind = ModelKind::Buffered;
      } else if (m == "reordered") {
        args.config.model_kind = ModelKind::Reordered;
      } else if (m == "deep") {
        args.config.model_kind = ModelKind::Deep;
      } else {
        usage(stage, 2, "--model expects mini, branchy, buffered, reordered or deep, got '" + m + "'");
      }
    } else if (flag == "--hidden") {
      args.config.model.hidden = parse_count(stage, flag, value(), 1, 4096);
    } else if (flag == "--depth") {
      args.config.deep_depth = parse_count(stage, flag, value(), 1, 1024);
    } else if (flag == "--micro-batches") {
      args.config.micro_batches = parse_count(stage, flag, value(), 1, 1024);
    } else if (flag == "--batches") {
      // One count per rank, comma-separated: uneven inputs.
      const std::string list = value();
      args.config.batches_per_rank.clear();
      size_t start = 0;
      while (start <= list.size()) {
        const size_t comma = std::min(list.find(',', start), list.size());
        args.config.batches_per_rank.push_back(
            parse_count(stage, flag, list.substr(start, comma - start), 1, 100000));
        start = comma + 1;
      }
    } else if (flag == "--divide-by-active-ranks") {
      args.config.divisor = Divisor::ActiveRanks;
    } else if (flag == "--json") {
      args.json_path = value();
    } else if (flag == "--init-method") {
      args.init_method = value();
    } else if (flag == "--collective-timeout") {
      args.config.collective_timeout =
          std::chrono::milliseconds(parse_count(stage, flag, value(), 100, 3600000));
    } else if (flag == "--device") {
      const std::string d = value();
      if (d == "cuda") {
        args.config.device = Device{DeviceType::CUDA, -1};
      } else if (d != "cpu") {
        usage(stage, 2, "--device expects cpu or cuda, got '" + d + "'");
      }
    } else if (flag == "--backend") {
      const std::string b = value();
      if (b == "auto") {
        args.config.backend = Backend::Auto;
      } else if (b == "gloo") {
        args.config.backend = Backend::Gloo;
      } else if (b == "nccl") {
        args.config.backend = Backend::NCCL;
      } else {
        usage(stage, 2, "--backend expects auto, gloo or nccl, got '" + b + "'");
      }
    } else if (flag == "--trace") {
      args.trace_path = value();
      args.config.trace = true;
    } else {
      const auto extra = std::find_if(stage_flags.begin(), stage_flags.end(),
                                      [&](const DemoFlag& f) { return f.name == flag; });
      if (extra == stage_flags.end()) usage(stage, 2, "unknown flag '" + flag + "'");
      const std::string text = extra->value_name.empty() ? "" : value();
      const std::string problem = extra->apply(text, args.config);
      if (!problem.empty()) usage(stage, 2, flag + ": " + problem);
    }
  }
  apply_launcher_environment(stage, args, world_size_given);
  if (!args.config.batches_per_rank.empty() &&
      args.config.batches_per_rank.size() != static_cast<size_t>(args.config.world_size)) {
    usage(stage, 2, detail::cat("--batches lists ", args.config.batches_per_rank.size(),
                                " counts; give one per rank (--world-size ",
                                args.config.world_size, ")"));
  }
  try {
    if (fits_stage) fits_stage(args.config);  // first: a stage's limit holds on every machine
    validate(args.config);
    // Before the run, not after it: a run of minutes must not end in "cannot
    // write". A full disk can still show only when the file is written.
    // Launched, only rank 0 writes them (another host may not have the path).
    const char* launched_rank = std::getenv("RANK");
    const bool writes = args.init_method.empty() || launched_rank == nullptr ||
                        std::string(launched_rank) == "0";
    if (writes && !args.json_path.empty()) check_writable(args.json_path, "the --json file");
    if (writes && !args.trace_path.empty()) check_writable(args.trace_path, "the --trace file");
  } catch (const Error& e) {
    usage(stage, 2, e.what());
  }
  return args;
}

namespace {

// A rank's loss at step s: the mean of its K micro-batch losses; absent
// (nullopt) when the rank did not take part in step s.
std::optional<double> step_loss(const std::vector<double>& losses, int64_t k, int64_t step) {
  if (static_cast<size_t>((step + 1) * k) > losses.size()) return std::nullopt;
  double sum = 0.0;
  for (int64_t m = 0; m < k; ++m) sum += losses[static_cast<size_t>(step * k + m)];
  return sum / static_cast<double>(k);
}

// A loss as the table shows it: six decimals, or, for a run that blows up,
// an exponent (a 34-digit number would break the columns); "-" for none.
std::string cell(std::optional<double> v) {
  if (!v) return "-";
  char buf[40];
  std::snprintf(buf, sizeof buf, std::fabs(*v) < 1e6 || !std::isfinite(*v) ? "%.6f" : "%.4e", *v);
  return buf;
}

// What one table row shows, also written to the JSON.
struct StepRow {
  double reference_loss = 0.0;                    // mean over the ranks taking part
  std::vector<std::optional<double>> reference;   // [rank]
  std::vector<std::optional<double>> ddp;         // [rank]
  double drift = 0.0;                             // max |ddp - reference| over ranks
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

// "bucket 0: fc3.bias, fc3.weight (528 B)" for each bucket, when the stage has them.
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

void print_buckets(const RunConfig& config, const RankResult& rank0) {
  if (rank0.buckets.empty()) return;
  if (!rank0.initial_buckets.empty() && rank0.initial_buckets != rank0.buckets) {
    std::printf("buckets on rank 0 at construction (launch order):\n");
    print_bucket_list(config, rank0, rank0.initial_buckets);
    std::printf("rebuilt after the first step (launch order):\n");
  } else {
    std::printf("buckets on rank 0 (launch order):\n");
  }
  print_bucket_list(config, rank0, rank0.buckets);
  std::printf("\n");
}

std::string json_optional(std::optional<double> v) { return v ? json_number(*v) : "null"; }

}  // namespace

DemoFlag number_flag(std::string name, std::string value_name, std::string help,
                     double& target, double low, double high) {
  return DemoFlag{std::move(name), std::move(value_name), std::move(help),
                  [&target, low, high](const std::string& text, RunConfig&) -> std::string {
                    char* end = nullptr;
                    const double v = std::strtod(text.c_str(), &end);
                    if (text.empty() || *end != '\0' || !std::isfinite(v) || v < low || v > high) {
                      return detail::cat("expects a number from ", low, " to ", high, ", got '",
                                         text, "'");
                    }
                    target = v;
                    return "";
                  }};
}

void report_demo(const std::string& stage, const std::string& title, const DemoArgs& args,
                 const ReferenceResult& reference, const std::vector<RankResult>& ranks,
                 const Advice& advice) {
  const RunConfig& config = args.config;
  const int last = config.world_size - 1;
  const double tolerance = default_tolerance(config.dtype);
  const Comparison c = compare(reference, ranks, tolerance);
  const int64_t k = config.micro_batches;

  std::string extra;  // the knobs lesson 01 leaves at their defaults, when set
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
  if (args.worker) extra += ", the lesson's worker";
  std::printf("stage %s: %s. %d rank%s, %lld steps, batch %lld per rank, lr %g%s, %s%s\n\n",
              stage.c_str(), title.c_str(), config.world_size, config.world_size == 1 ? "" : "s",
              static_cast<long long>(total_steps(config)), static_cast<long long>(config.batch_size),
              config.lr,
              config.momentum > 0 ? detail::cat(", momentum ", config.momentum).c_str() : "",
              tp::to_string(config.dtype).c_str(), extra.c_str());
  print_buckets(config, ranks[0]);
  if (k > 1) std::printf("(each loss is the mean over the step's %lld micro-batches)\n", static_cast<long long>(k));
  std::printf("%4s  %10s  %11s %11s  %11s %11s  %15s\n", "step", "reference",
              "rank 0 DDP", "rank 0 ref", detail::cat("rank ", last, " DDP").c_str(),
              detail::cat("rank ", last, " ref").c_str(), "max |DDP - ref|");
  const std::vector<StepRow> rows = step_rows(config, reference, ranks);
  for (size_t s = 0; s < rows.size(); ++s) {
    const StepRow& row = rows[s];
    const auto l = static_cast<size_t>(last);
    std::printf("%4zu  %10s  %11s %11s  %11s %11s  %15.2e\n", s, cell(row.reference_loss).c_str(),
                cell(row.ddp[0]).c_str(), cell(row.reference[0]).c_str(), cell(row.ddp[l]).c_str(),
                cell(row.reference[l]).c_str(), row.drift);
  }
  if (uneven(config)) {
    std::printf("(- : the rank had no batch left at that step)\n");
    // Which ranks train and which, having run out, shadow the others.
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
  print_unreached(config, ranks);
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
  const uint64_t step0_allreduces = allreduces_in_step(ranks[0], k, 0);
  if (!args.worker) {  // a worker counts no collectives
    std::printf("all-reduces per step on rank 0: %llu for %zu parameter tensors\n",
                static_cast<unsigned long long>(step0_allreduces), ranks[0].final_params.size());
  }
  if (k > 1) {
    // Where in the step they happen: with no_sync, all in the last one.
    std::string per_micro;
    for (int64_t m = 0; m < k && m < static_cast<int64_t>(ranks[0].allreduces_per_micro.size());
         ++m) {
      per_micro += (m ? ", " : "") + std::to_string(ranks[0].allreduces_per_micro[m]);
    }
    std::printf("all-reduces in each of step 0's %lld micro-batches on rank 0: %s\n",
                static_cast<long long>(k), per_micro.c_str());
  }
  std::vector<Finding> findings;
  if (args.worker) {
    std::vector<WorkerResult> workers;
    for (const RankResult& r : ranks) workers.push_back({r.losses, r.final_params, r.final_buffers});
    findings = check_workers(config, reference, workers, tolerance);
  } else {
    findings = check_results_complete(config, reference, ranks);
    if (findings.empty()) findings = diagnose(config, reference, ranks, tolerance, advice);
  }
  const bool reference_diverged = std::any_of(
      reference.losses.begin(), reference.losses.end(), [](const std::vector<double>& losses) {
        return std::any_of(losses.begin(), losses.end(), [](double v) { return !std::isfinite(v); });
      });
  if (findings.empty()) {
    std::printf("verdict: matches the reference within %.0e x max(1, |value|)\n", tolerance);
  } else if (reference_diverged) {
    // Nothing to compare DDP with: the single-process run itself overflowed.
    std::printf("verdict: no verdict on DDP: the reference itself diverged\n%s",
                format_findings(findings).c_str());
  } else {
    std::printf("verdict: DIFFERS from the reference\n%s", format_findings(findings).c_str());
  }

  if (!args.trace_path.empty()) report_trace(args, ranks);
  if (args.json_path.empty()) return;
  // JSON schema: {stage, title, config{...}, steps[{step, reference_loss,
  // reference_rank_losses[W], ddp_rank_losses[W], max_abs_diff}], ranks[{rank,
  // micro_batch_losses[], allreduces_per_micro[]}], final{...}}. A rank that
  // did not take part in a step has null there.
  std::ostringstream j;
  j << "{\n  \"stage\": \"" << stage << "\",\n  \"title\": \"" << title << "\",\n";
  j << "  \"config\": {\"world_size\": " << config.world_size << ", \"steps\": " << rows.size()
    << ", \"micro_batches\": " << k << ", \"batch_size\": " << config.batch_size
    << ", \"model\": \"" << to_string(config.model_kind) << "\""
    << ", \"lr\": " << json_number(config.lr)
    << ", \"momentum\": " << json_number(config.momentum) << ", \"dtype\": \""
    << to_string(config.dtype) << "\", \"per_rank_seed\": "
    << (config.per_rank_seed ? "true" : "false") << ", \"device\": \""
    << (config.device.type == DeviceType::CUDA ? "cuda" : "cpu") << "\", \"backend\": \""
    << to_string(resolved_backend(config)) << "\""
    << ", \"tolerance\": " << json_number(tolerance)
    << "},\n  \"steps\": [\n";
  for (size_t s = 0; s < rows.size(); ++s) {
    const StepRow& row = rows[s];
    j << "    {\"step\": " << s << ", \"reference_loss\": " << json_number(row.reference_loss)
      << ", \"reference_rank_losses\": " << json_list(row.reference, json_optional)
      << ", \"ddp_rank_losses\": " << json_list(row.ddp, json_optional)
      << ", \"max_abs_diff\": " << json_number(row.drift) << "}"
      << (s + 1 < rows.size() ? "," : "") << "\n";
  }
  j << "  ],\n  \"ranks\": [\n";
  for (size_t r = 0; r < ranks.size(); ++r) {
    j << "    {\"rank\": " << ranks[r].rank
      << ", \"micro_batch_losses\": " << json_list(ranks[r].losses, json_number)
      << ", \"allreduces_per_micro\": "
      << json_list(ranks[r].allreduces_per_micro, [](uint64_t v) { return std::to_string(v); })
      << "}" << (r + 1 < ranks.size() ? "," : "") << "\n";
  }
  std::vector<double> norms;
  for (const RankResult& r : ranks) norms.push_back(norm(r.final_params));
  std::vector<uint64_t> allreduces;
  for (const RankResult& r : ranks) allreduces.push_back(allreduces_in_step(r, k, 0));
  j << "  ],\n  \"final\": {\"reference_param_norm\": " << json_number(c.reference_norm)
    << ", \"rank_param_norms\": " << json_list(norms, json_number)
    << ", \"max_param_diff_vs_reference\": " << json_number(c.final_params.max_abs)
    << ", \"max_param_diff_param\": \"" << c.final_params.name << "\""
    << ", \"max_param_diff_rank\": " << c.final_params.rank
    << ", \"max_param_diff_between_ranks\": " << json_number(c.final_between_ranks.max_abs)
    << ", \"max_loss_diff\": " << json_number(c.max_loss_diff)
    << ", \"num_parameters\": " << ranks[0].final_params.size()
    << ", \"allreduces_per_step\": "
    << json_list(allreduces, [](uint64_t v) { return std::to_string(v); })
    << ", \"matches_reference\": " << (findings.empty() ? "true" : "false") << "}\n}\n";
  write_file(args.json_path, j.str(), "the --json file");
}

}  // namespace tp::train
