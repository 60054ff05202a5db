// The lesson demo's argument parsing, table and JSON (see demo.h).
#include "tensorplay/train/demo.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tensorplay/trace.h"
#include "tensorplay/train/compare.h"

namespace tp::train {

namespace {

[[noreturn]] void usage(const std::string& stage, int code, const std::string& problem = "") {
  std::FILE* out = code == 0 ? stdout : stderr;
  if (!problem.empty()) std::fprintf(out, "demo %s: %s\n", stage.c_str(), problem.c_str());
  std::fprintf(out,
               "usage: ./kit demo %s [--world-size W] [--steps N] [--batch B] [--lr X]\n"
               "                  [--momentum M] [--dtype float32|float64] [--per-rank-seed]\n"
               "                  [--json FILE] [--trace FILE]\n",
               stage.c_str());
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
  const int64_t last = args.config.steps - 1;
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
  std::ofstream out(args.trace_path);
  if (!out) TP_THROW(Error, "demo: cannot write --trace file '", args.trace_path, "'");
  out << trace::to_chrome_json(all);
  std::printf("\ntimeline of step %lld, each rank from its own step start (all steps: open %s in "
              "ui.perfetto.dev):\n%s",
              static_cast<long long>(last), args.trace_path.c_str(),
              trace::render_ascii(last_step, 100).c_str());
}

}  // namespace

DemoArgs parse_demo_args(int argc, char** argv, const std::string& stage) {
  DemoArgs args;
  args.config.steps = 10;
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
    } else if (flag == "--json") {
      args.json_path = value();
    } else if (flag == "--trace") {
      args.trace_path = value();
      args.config.trace = true;
    } else {
      usage(stage, 2, "unknown flag '" + flag + "'");
    }
  }
  return args;
}

void report_demo(const std::string& stage, const std::string& title, const DemoArgs& args,
                 const ReferenceResult& reference, const std::vector<RankResult>& ranks) {
  const RunConfig& config = args.config;
  const int last = config.world_size - 1;
  const double tolerance = default_tolerance(config.dtype);
  const Comparison c = compare(reference, ranks, tolerance);

  std::printf("stage %s: %s. %d rank%s, %lld steps, batch %lld per rank, lr %g%s, %s\n\n",
              stage.c_str(), title.c_str(), config.world_size, config.world_size == 1 ? "" : "s",
              static_cast<long long>(config.steps), static_cast<long long>(config.batch_size),
              config.lr,
              config.momentum > 0 ? detail::cat(", momentum ", config.momentum).c_str() : "",
              to_string(config.dtype).c_str());
  std::printf("%4s  %10s  %11s %11s  %11s %11s  %15s\n", "step", "reference",
              "rank 0 DDP", "rank 0 ref", detail::cat("rank ", last, " DDP").c_str(),
              detail::cat("rank ", last, " ref").c_str(), "max |DDP - ref|");
  std::vector<double> step_drift;
  for (int64_t s = 0; s < config.steps; ++s) {
    const auto& ref = reference.losses[static_cast<size_t>(s)];
    double mean = 0.0, drift = 0.0;
    for (int r = 0; r < config.world_size; ++r) {
      mean += ref[static_cast<size_t>(r)] / config.world_size;
      drift = std::max(drift, std::abs(ranks[static_cast<size_t>(r)].losses[static_cast<size_t>(s)] -
                                       ref[static_cast<size_t>(r)]));
    }
    step_drift.push_back(drift);
    std::printf("%4lld  %10.6f  %11.6f %11.6f  %11.6f %11.6f  %15.2e\n", static_cast<long long>(s),
                mean, ranks[0].losses[static_cast<size_t>(s)], ref[0],
                ranks[static_cast<size_t>(last)].losses[static_cast<size_t>(s)],
                ref[static_cast<size_t>(last)], drift);
  }
  std::printf("\nfinal parameter norm: reference %.9f, rank 0 %.9f\n", c.reference_norm,
              c.rank0_norm);
  std::printf("largest parameter difference vs the reference: %.2e (%s on rank %d)\n",
              c.final_params.max_abs, c.final_params.name.c_str(), c.final_params.rank);
  std::printf("largest parameter difference between ranks:    %.2e\n",
              c.final_between_ranks.max_abs);
  std::printf("largest loss difference vs the reference:      %.2e (step %lld, rank %d)\n",
              c.max_loss_diff, static_cast<long long>(c.loss_step), c.loss_rank);
  if (!ranks[0].allreduces_per_step.empty()) {
    std::printf("all-reduces per step on rank 0: %llu for %zu parameter tensors\n",
                static_cast<unsigned long long>(ranks[0].allreduces_per_step[0]),
                ranks[0].final_params.size());
  }
  std::vector<Finding> findings = diagnose(config, reference, ranks, tolerance);
  if (findings.empty()) {
    std::printf("verdict: matches the reference within %.0e x max(1, |value|)\n", tolerance);
  } else {
    std::printf("verdict: DIFFERS from the reference\n%s", format_findings(findings).c_str());
  }

  if (!args.trace_path.empty()) report_trace(args, ranks);
  if (args.json_path.empty()) return;
  // JSON schema: {stage, title, config{...}, steps[{step, reference_loss,
  // reference_rank_losses[W], ddp_rank_losses[W], max_abs_diff}], final{...}}.
  std::ostringstream j;
  j << "{\n  \"stage\": \"" << stage << "\",\n  \"title\": \"" << title << "\",\n";
  j << "  \"config\": {\"world_size\": " << config.world_size << ", \"steps\": " << config.steps
    << ", \"batch_size\": " << config.batch_size << ", \"lr\": " << json_number(config.lr)
    << ", \"momentum\": " << json_number(config.momentum) << ", \"dtype\": \""
    << to_string(config.dtype) << "\", \"per_rank_seed\": "
    << (config.per_rank_seed ? "true" : "false") << ", \"tolerance\": " << json_number(tolerance)
    << "},\n  \"steps\": [\n";
  for (int64_t s = 0; s < config.steps; ++s) {
    const auto& ref = reference.losses[static_cast<size_t>(s)];
    double mean = 0.0;
    std::vector<double> ddp;
    for (int r = 0; r < config.world_size; ++r) {
      mean += ref[static_cast<size_t>(r)] / config.world_size;
      ddp.push_back(ranks[static_cast<size_t>(r)].losses[static_cast<size_t>(s)]);
    }
    j << "    {\"step\": " << s << ", \"reference_loss\": " << json_number(mean)
      << ", \"reference_rank_losses\": " << json_list(ref, json_number)
      << ", \"ddp_rank_losses\": " << json_list(ddp, json_number)
      << ", \"max_abs_diff\": " << json_number(step_drift[static_cast<size_t>(s)]) << "}"
      << (s + 1 < config.steps ? "," : "") << "\n";
  }
  std::vector<double> norms;
  for (const RankResult& r : ranks) norms.push_back(norm(r.final_params));
  std::vector<uint64_t> allreduces;
  for (const RankResult& r : ranks) {
    allreduces.push_back(r.allreduces_per_step.empty() ? 0 : r.allreduces_per_step[0]);
  }
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
  std::ofstream out(args.json_path);
  if (!out) TP_THROW(Error, "demo ", stage, ": cannot write --json file '", args.json_path, "'");
  out << j.str();
}

}  // namespace tp::train
