// The lesson demo's command line (CLI11): the shared flags, the stage's own,
// the launcher's environment, and the checks of the plan as a whole
// (parse_demo_args, demo.h).
#include <cstdlib>
#include <string>
#include <vector>

#include "command_line.h"
#include "tensorplay/distributed/launcher_env.h"
#include "tensorplay/train/demo.h"
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

}  // namespace tp::train
