// Google Benchmark on W ranks, spawned here or started by a launcher: the
// shared main() of the multi-rank benchmarks (bench_sync.cc, bench_step.cc,
// ...).
//
// Contract:
//   - ranked_benchmark_main() takes the program's own flags out of the
//     command line (--world-size=N, always, and the `flags` given, each
//     "--name=N" with a whole number in [low, high]), refuses flags that
//     would make ranks disagree, spawns the ranks (a fresh file://
//     rendezvous, a 10-minute job deadline), and on each rank initialises
//     Google Benchmark with the remaining flags, connects a
//     ProcessGroupGloo, calls register_all(RankSetup{group, rendezvous dir})
//     and runs the benchmarks.
//   - Launched mode: with --init-method=env:// (or tcp://HOST:PORT,
//     redis://HOST:PORT/JOB) the process is one rank of a job that a
//     launcher started, one process per rank (tools/tprun, torchrun, srun):
//     it spawns nothing, joins the job through that init method (RANK,
//     WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher; a
//     --world-size that disagrees with WORLD_SIZE is an error), shows its
//     waits and its error to the launcher (launched_rank.h) and runs as a
//     spawned rank would. That is how the benchmarks run on hosts joined by
//     a real or a shaped link (bench/shaped_link.py). --init-method=file://
//     is refused: it is what the program does when it spawns its ranks.
//   - --smoke=1 (every program has it) makes iterations(n) return 1 and
//     warmup_iterations() 0: the tests run every benchmark once that way, so
//     none rots, in seconds.
//   - The report's context says how many ranks ran and how many cores they
//     shared (ranks on one machine compete for its cores: a figure measured
//     with more ranks than cores includes waiting for a core).
//   - Every rank must register the same benchmarks with fixed iteration
//     counts: an adaptive count would differ between ranks, and so would
//     their collectives, which would hang. Rank 0 reports (and honours
//     --benchmark_out); the others run silently.
//   - Returns the process exit code: 0 when every rank succeeded (launched:
//     when this rank did).
//   - The step benchmarks share more: the model, deep_model(), and the
//     defaults kStepWorldSize and kStepBatch; a StepRank (the group and
//     --batch=N, batch_flag) in all of them (bench_step, bench_hooks,
//     bench_zero, bench_fsdp); register_step_variants(), each variant of a
//     step (a hook, an optimizer, a sharding set-up) and a round that
//     interleaves them all; and step_variants_main(), the whole main() of
//     the programs made of such variants (all but bench_step).
#pragma once

#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <string_view>
#include <utility>
#include <vector>

#include "tensorplay/distributed/init.h"
#include "tensorplay/error.h"
#include "tensorplay/distributed/launcher_env.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/multiprocessing/launched_rank.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/random.h"
#include "tensorplay/train/ddp_trainer.h"
#include "tensorplay/train/stage_spec.h"
#include "tensorplay/util/temp_dir.h"

namespace tp::bench {

// One of a program's own flags: "--name=N", N a whole number in [low, high].
struct OwnFlag {
  std::string name;  // without the dashes: "batch"
  long low = 1;
  long high = 1;
  std::string help;  // "gives each rank N rows per step"
  long* value;       // written when the flag is given; its default otherwise
};

// What register_all() gets on each rank.
struct RankSetup {
  std::shared_ptr<distributed::ProcessGroup> group;  // connected, shared by the benchmarks
  // Spawned ranks: the group's rendezvous directory, where a program may
  // connect more (under a prefix of its own). Launched ranks (--init-method)
  // share no directory: it is empty, and a program that needs one refuses
  // launched mode, saying so (bench_allreduce's raw Gloo context).
  std::string rendezvous_dir;
  // The launch's init method ("env://"), or "" for spawned ranks.
  std::string init_method;
};
using RegisterAll = std::function<void(const RankSetup&)>;

namespace detail {
inline bool smoke = false;  // set by --smoke=1 before the ranks are spawned (they inherit it)
}  // namespace detail

// Names a stage in the results' context ("stage 03": its title, from its
// StageSpec), so that a results file says what BM_StepStage03 measured.
// Call it from the registration function (every rank).
template <typename Options>
void describe_stage(const train::StageSpec<Options>& spec) {
  benchmark::AddCustomContext("stage " + spec.number, spec.title);
}

// A benchmark's fixed iteration count: n, or 1 under --smoke=1.
inline int64_t iterations(int64_t n) { return detail::smoke ? 1 : n; }

// Untimed iterations before a timed loop (the first ones allocate buffers,
// fault in memory and fill caches): 2, or 0 under --smoke=1.
inline int warmup_iterations() { return detail::smoke ? 0 : 2; }

// The q-quantile (0 < q <= 1) of `times`, nearest rank: quantile(t, 0.5)
// is the median, quantile(t, 0.9) the 90th percentile.
inline double quantile(std::vector<double> times, double q) {
  if (times.empty()) return 0.0;
  std::sort(times.begin(), times.end());
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(times.size())));
  return times[std::clamp<size_t>(rank, 1, times.size()) - 1];
}

// The 90th percentile of the repetitions' times, reported beside Google
// Benchmark's mean and median when --benchmark_repetitions > 1:
// ->ComputeStatistics("p90", tp::bench::p90).
inline double p90(const std::vector<double>& times) { return quantile(times, 0.9); }

// CPU time of this process so far, every thread, user and system, in s.
inline double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Wall-clock milliseconds since `start`, on the steady clock.
inline double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Runs the benchmark's timed loop, `one()` per iteration, and sets the
// counters p50_<unit> and p90_<unit>: the median and 90th percentile of the
// single iterations' wall times (unit "us" or "ms"). Google Benchmark's own
// time is the mean over the loop, which one stall of loopback TCP drags up.
template <typename One>
void time_each_iteration(benchmark::State& state, const std::string& unit, One&& one) {
  std::vector<double> seconds;
  seconds.reserve(static_cast<size_t>(state.max_iterations));
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    one();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double scale = unit == "us" ? 1e6 : 1e3;
  state.counters["p50_" + unit] = quantile(seconds, 0.5) * scale;
  state.counters["p90_" + unit] = quantile(seconds, 0.9) * scale;
}

// Several set-ups of one step compared a moment apart: each iteration runs
// every one of `steps` once, in an order rotated by one every iteration (so
// each is first, second, ... equally often), and sets "<label>_ms", each
// one's median step, and "<label>_over_<labels[0]>", the median over the
// iterations of its step over steps[0]'s in the same iteration. A change in
// the machine's load weighs on all alike: the ratios are the numbers to
// quote. REQUIRES: labels.size() == steps.size() >= 1.
inline void interleaved_round(benchmark::State& state, const std::vector<std::string>& labels,
                              const std::vector<std::function<void()>>& steps) {
  const size_t n = steps.size();
  std::vector<std::vector<double>> ms(n), over_first(n);
  size_t first = 0;
  for (auto _ : state) {
    std::vector<double> now(n);
    for (size_t k = 0; k < n; ++k) {
      const size_t s = (first + k) % n;
      const auto start = std::chrono::steady_clock::now();
      steps[s]();
      now[s] = ms_since(start);
    }
    first = (first + 1) % n;
    for (size_t s = 0; s < n; ++s) {
      ms[s].push_back(now[s]);
      over_first[s].push_back(now[s] / now[0]);
    }
  }
  for (size_t s = 0; s < n; ++s) {
    state.counters[labels[s] + "_ms"] = quantile(ms[s], 0.5);
    if (s > 0) state.counters[labels[s] + "_over_" + labels[0]] = quantile(over_first[s], 0.5);
  }
}

// Sets what the group's collectives carried per step between `before` and
// `after` (`steps` timed steps): "collectives", and the bytes handed to each
// kind, "allreduce_bytes", "reduce_scatter_bytes", "allgather_bytes",
// "broadcast_bytes" (process_group.h says what each counts).
inline void set_collective_counters(benchmark::State& state,
                                    const distributed::CollectiveCounters& before,
                                    const distributed::CollectiveCounters& after, double steps) {
  const auto per_step = [steps](uint64_t a, uint64_t b) { return static_cast<double>(a - b) / steps; };
  state.counters["collectives"] = per_step(after.collectives(), before.collectives());
  state.counters["allreduce_bytes"] = per_step(after.allreduce_bytes, before.allreduce_bytes);
  state.counters["reduce_scatter_bytes"] =
      per_step(after.reduce_scatter_bytes, before.reduce_scatter_bytes);
  state.counters["allgather_bytes"] = per_step(after.allgather_bytes, before.allgather_bytes);
  state.counters["broadcast_bytes"] = per_step(after.broadcast_bytes, before.broadcast_bytes);
}

// The fixed iteration count of a step benchmark at W ranks (the same on
// every rank): 80 / W, at least 10 (20 at 4 ranks, where, sharing 2 cores,
// a step is 3 to 5 times slower: the run stays short); 1 under --smoke=1.
inline int64_t step_iterations(int world_size) {
  return iterations(std::max<int64_t>(10, 80 / world_size));
}

// The step benchmarks' model: deep_mlp(16, kDeepWidth, kDeepDepth, 4) on
// SyntheticRegression's 16 features and 4 targets, 2 * (kDeepDepth + 1) =
// 130 parameter tensors, almost all of them (kDeepWidth, kDeepWidth) weights
// of 64 KiB: 4.2 MB of float32. The width and the default batch make a step
// about 8 ms of compute on one core, comparable to the sync of its 4.2 MB
// over loopback, so neither hides the other by sheer size.
inline constexpr int64_t kDeepWidth = 128;
inline constexpr int64_t kDeepDepth = 64;
// The step benchmarks' defaults: ranks unless --world-size=N says
// otherwise, rows per rank and step unless --batch=N does.
inline constexpr int kStepWorldSize = 2;
inline constexpr long kStepBatch = 64;

// A fresh deep model, the same values on every rank and at every call
// (seeded here).
inline std::shared_ptr<nn::Module> deep_model() {
  manual_seed(0);
  return nn::deep_mlp(16, kDeepWidth, kDeepDepth, 4);
}

// Bytes of the deep model's parameters: the model whole, and the gradients
// one step all-reduces without compression.
inline uint64_t deep_model_bytes() {
  uint64_t bytes = 0;
  for (const Tensor& p : deep_model()->parameters()) bytes += p.nbytes();
  return bytes;
}

// A step benchmark's rank: its group, and the rows it trains on per step
// (--batch=N, batch_flag).
struct StepRank {
  std::shared_ptr<distributed::ProcessGroup> group;
  int64_t batch = 0;  // --batch=N: each program sets its own default
};

// --batch=N, the step benchmarks' own flag: N rows per rank per step.
inline OwnFlag batch_flag(long* batch) {
  return {"batch", 1, 4096, "gives each rank N rows per step", batch};
}

// Registers the variants of one training step (the hooks of bench_hooks,
// the optimizers of bench_zero, the sharding set-ups of bench_fsdp): each
// as a benchmark of its own, "<family>/<key>:<label>", timed by
// `one(state, variant, rank)` with a p90 over repetitions; then all of them
// in one more, `round_name`, one of each per iteration (interleaved_round),
// whose "<label>_over_<first label>" counters are the numbers to quote.
// `Step(variant, rank)` builds a variant's step, which has warm_up() and
// run(). Every benchmark runs step_iterations(W) iterations, in ms of wall
// time; the results' context gets "batch" and "variants" (the labels, in
// order, comma-separated). Each Variant has a `label`;
// `variants` outlive the benchmarks (a static array).
template <typename Step, typename Variant>
void register_step_variants(
    const std::string& family, const std::string& key, std::span<const Variant> variants,
    const StepRank& rank,
    const std::function<void(benchmark::State&, const Variant&, const StepRank&)>& one,
    const std::string& round_name) {
  benchmark::AddCustomContext("batch", std::to_string(rank.batch));
  std::string order;  // the variants' labels, in the round's order, for readers of the JSON
  for (const Variant& variant : variants) {
    order += (order.empty() ? "" : ",") + std::string(variant.label);
  }
  benchmark::AddCustomContext("variants", order);
  const int64_t iterations = step_iterations(rank.group->size());
  for (const Variant& variant : variants) {
    const std::string name = family + "/" + key + ":" + variant.label;
    benchmark::RegisterBenchmark(
        name.c_str(),  // copied: this Google Benchmark takes only a C string
        [&variant, rank, one](benchmark::State& state) { one(state, variant, rank); })
        ->Iterations(iterations)
        ->ComputeStatistics("p90", p90)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::RegisterBenchmark(round_name.c_str(), [variants, rank](benchmark::State& state) {
    std::vector<std::unique_ptr<Step>> steps;
    std::vector<std::string> labels;
    std::vector<std::function<void()>> runs;
    for (const Variant& variant : variants) {
      steps.push_back(std::make_unique<Step>(variant, rank));
      labels.push_back(variant.label);
      runs.push_back([step = steps.back().get()] { step->run(); });
    }
    for (auto& step : steps) step->warm_up();
    rank.group->barrier()->wait();  // every rank's steps built before the first is timed
    interleaved_round(state, labels, runs);
  })
      ->Iterations(iterations)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

namespace detail {

// The other ranks' display reporter: runs everything, prints nothing.
class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  SilentReporter() {
    SetOutputStream(&null_);
    SetErrorStream(&null_);
  }
  bool ReportContext(const Context&) override { return true; }  // false would skip the runs
  void ReportRuns(const std::vector<Run>&) override {}

 private:
  std::ostream null_{nullptr};  // no buffer: every write is dropped
};

// "--benchmark_out=x" -> "benchmark_out"; "" for an argument that is no flag.
inline std::string_view flag_name(std::string_view arg) {
  if (!arg.starts_with('-')) return {};
  while (arg.starts_with('-')) arg.remove_prefix(1);
  return arg.substr(0, arg.find('='));
}

// The value of "--name=N" if it is a whole number in [low, high].
inline std::optional<long> count_flag(std::string_view arg, long low, long high) {
  const size_t eq = arg.find('=');
  const std::string value(eq == std::string_view::npos ? "" : arg.substr(eq + 1));
  char* end = nullptr;
  const long n = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || n < low || n > high) return std::nullopt;
  return n;
}

// Ranks other than 0 keep every flag (so --benchmark_filter,
// --benchmark_repetitions and the like select the same runs on every rank)
// except those that write output.
inline bool writes_output(std::string_view arg) {
  const std::string_view name = flag_name(arg);
  return name == "benchmark_out" || name == "benchmark_out_format" ||
         name == "benchmark_format";
}

// One rank, connected: initialise, register, run. "" on success, or a reason.
inline std::string run_connected_rank(const RankSetup& setup, const std::vector<std::string>& args,
                                      const RegisterAll& register_all) {
  const int rank = setup.group->rank();
  const int world_size = setup.group->size();
  std::vector<std::string> mine;
  for (const std::string& arg : args) {
    if (rank == 0 || !writes_output(arg)) mine.push_back(arg);
  }
  std::vector<char*> argv;
  for (std::string& arg : mine) argv.push_back(arg.data());
  int argc = static_cast<int>(argv.size());
  argv.push_back(nullptr);
  benchmark::Initialize(&argc, argv.data());
  // Every rank sees the same leftover arguments, so all stop here together.
  if (argc > 1) {
    if (rank == 0) benchmark::ReportUnrecognizedArguments(argc, argv.data());
    return "unrecognized arguments";
  }
  benchmark::AddCustomContext("world_size", std::to_string(world_size));
  benchmark::AddCustomContext("cores", std::to_string(std::thread::hardware_concurrency()));
  benchmark::AddCustomContext("smoke", detail::smoke ? "1" : "0");
  benchmark::AddCustomContext("init_method",
                              setup.init_method.empty() ? "spawned" : setup.init_method);
  register_all(setup);
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    SilentReporter silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  return "";
}

// A spawned rank: connects through the job's rendezvous directory.
inline std::string run_rank(int rank, int world_size, const std::string& rendezvous,
                            const std::vector<std::string>& args, const RegisterAll& register_all) {
  auto group = std::make_shared<distributed::ProcessGroupGloo>(
      rendezvous, rank, world_size, distributed::GlooOptions{std::chrono::seconds(60)});
  return run_connected_rank({group, rendezvous, ""}, args, register_all);
}

// A launched rank (launched mode in the contract): the process is the
// rank. Returns the exit code.
inline int run_launched_rank(const std::string& program, const std::string& init_method,
                             std::optional<long> world_size_given,
                             const std::vector<std::string>& args,
                             const RegisterAll& register_all) {
  multiprocessing::report_to_launcher();
  const auto rank = distributed::from_launcher("RANK");
  try {
    distributed::GroupOptions options;
    options.timeout = std::chrono::seconds(60);
    auto group = distributed::make_process_group("gloo", distributed::kFromEnvironment,
                                                 distributed::kFromEnvironment, init_method,
                                                 options);
    if (world_size_given && *world_size_given != group->size()) {
      const auto world = distributed::from_launcher("WORLD_SIZE");
      TP_THROW(Error, program, ": --world-size=", *world_size_given, " disagrees with ",
               world ? world->variable : std::string("WORLD_SIZE"), "=", group->size(),
               " from the launcher; leave --world-size out when the ranks are launched");
    }
    if (group->rank() == 0) {
      std::cerr << program << ": rank 0 of " << group->size() << ", launched (" << init_method
                << "), on a machine of " << std::thread::hardware_concurrency() << " core(s)"
                << (smoke ? "; smoke run: one iteration each, the times mean nothing" : "")
                << std::endl;
    }
    const std::string failed = run_connected_rank({group, "", init_method}, args, register_all);
    if (!failed.empty()) {
      TP_THROW(Error, program, ": rank ", group->rank(), ": ", failed);
    }
    return 0;
  } catch (const std::exception& e) {
    multiprocessing::record_error(e);
    std::cerr << program << (rank ? ": rank " + rank->value : std::string()) << ": " << e.what()
              << std::endl;
    return 1;
  }
}

}  // namespace detail

inline int ranked_benchmark_main(int argc, char** argv, const std::string& program,
                                 long default_world_size, std::vector<OwnFlag> flags,
                                 const RegisterAll& register_all) {
  long world_size = default_world_size;
  long smoke = 0;
  flags.insert(flags.begin(), OwnFlag{"world-size", 1, 16, "runs N ranks", &world_size});
  flags.push_back(OwnFlag{"smoke", 0, 1, "1: one iteration of each benchmark, no warm-up (tests)",
                          &smoke});
  std::vector<std::string> args;
  std::string init_method;  // --init-method=...: launched mode; "" spawns the ranks
  bool world_size_given = false;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i > 0 && detail::flag_name(arg) == "init-method") {
      // --init-method=URL, or --init-method URL as the demos take it.
      const size_t eq = arg.find('=');
      if (eq == std::string_view::npos && i + 1 < argc) {
        init_method = argv[++i];
      } else if (eq != std::string_view::npos) {
        init_method = std::string(arg.substr(eq + 1));
      }
      if (init_method.empty()) {
        std::cerr << program << ": --init-method expects a value, as in --init-method=env://\n";
        return 1;
      }
      continue;
    }
    if (i > 0 && detail::flag_name(arg) == "world-size") world_size_given = true;
    const auto own = std::find_if(flags.begin(), flags.end(), [&](const OwnFlag& f) {
      return i > 0 && detail::flag_name(arg) == f.name;
    });
    if (own == flags.end()) {
      args.emplace_back(arg);
      continue;
    }
    const std::optional<long> n = detail::count_flag(arg, own->low, own->high);
    if (!n) {
      std::cerr << program << ": --" << own->name << " expects a whole number from " << own->low
                << " to " << own->high << ", as in --" << own->name << "=" << own->high
                << "; got '" << arg << "'\n";
      return 1;
    }
    *own->value = *n;
  }
  for (const std::string& arg : args) {
    const std::string_view name = detail::flag_name(arg);
    // --help prints and exits inside Initialize: do it here, before any rank.
    if (name == "help") {
      std::cout << program << "'s own flags:\n";
      for (const OwnFlag& f : flags) {
        std::cout << "  --" << f.name << "=N  " << f.help << " (default " << *f.value << ")\n";
      }
      std::cout << "  --init-method=URL  run as one rank of a job a launcher started (tprun, "
                   "torchrun, srun), joining it through URL: env://, tcp://HOST:PORT or "
                   "redis://HOST:PORT/JOB (default: spawn the ranks here)\n";
      std::cout << "the other flags are Google Benchmark's:\n";
      benchmark::Initialize(&argc, argv);
    }
    if (name == "benchmark_enable_random_interleaving") {
      std::cerr << program << ": --benchmark_enable_random_interleaving would shuffle the runs "
                              "differently on each rank and hang their collectives; run without "
                              "it\n";
      return 1;
    }
  }
  detail::smoke = smoke != 0;
  // RANK without --init-method, or --init-method=file://: a mistake to name
  // before anything starts (the demos' rule, ddp_trainer.h).
  if (const std::string mistake = train::launch_mistake(program, init_method);
      !mistake.empty()) {
    std::cerr << program << ": " << mistake << "\n";
    return 1;
  }
  if (!init_method.empty()) {
    return detail::run_launched_rank(program, init_method,
                                     world_size_given ? std::optional<long>(world_size)
                                                      : std::nullopt,
                                     args, register_all);
  }
  const unsigned cores = std::thread::hardware_concurrency();
  // On stderr: stdout may be Google Benchmark's JSON (--benchmark_format=json).
  std::cerr << program << ": " << world_size << " rank(s) on " << cores << " core(s)"
            << (static_cast<unsigned>(world_size) > cores
                    ? ": more ranks than cores, so the times include waiting for a core"
                    : "")
            << (smoke != 0 ? "; smoke run: one iteration each, the times mean nothing" : "")
            << std::endl;
  TempDir rendezvous("tp-" + program);
  multiprocessing::SpawnOptions options;
  options.timeout = std::chrono::minutes(10);  // generous: a loaded machine is slow, not hung
  const std::vector<std::string> results =
      multiprocessing::spawn(options, detail::run_rank, static_cast<int>(world_size),
                             static_cast<int>(world_size), rendezvous.path(), args, register_all);
  for (const std::string& result : results) {
    if (!result.empty()) return 1;
  }
  return 0;
}

// What a program made of a step's variants (bench_hooks, bench_zero,
// bench_fsdp) registers beyond its stage: register_step_variants()'s
// arguments, and the constants its results' context names.
template <typename Variant>
struct StepVariants {
  std::string family;                 // "BM_StepStage08Hook": "<family>/<key>:<label>" each
  std::string key;                    // "hook"
  // A static array; the first is what the round's "<label>_over_<first>" ratios divide by.
  std::span<const Variant> variants;
  std::function<void(benchmark::State&, const Variant&, const StepRank&)> one;  // times one variant
  std::string round_name;             // "BM_HookRound": all of them interleaved
  std::vector<std::pair<std::string, std::string>> context;  // {"momentum", "0.9"}, ...
};

// The whole main() of such a program: its own flag is --batch=N (default
// kStepBatch), its ranks kStepWorldSize unless --world-size=N; on each rank
// the results' context names the stage (describe_stage) and `variants`'
// constants, then register_step_variants() registers the benchmarks.
template <typename Step, typename Variant, typename Options>
int step_variants_main(int argc, char** argv, const std::string& program,
                       const train::StageSpec<Options>& stage,
                       const StepVariants<Variant>& variants) {
  long batch = kStepBatch;
  return ranked_benchmark_main(
      argc, argv, program, kStepWorldSize, {batch_flag(&batch)},
      [&](const RankSetup& setup) {
        describe_stage(stage);
        for (const auto& [name, value] : variants.context) {
          benchmark::AddCustomContext(name, value);
        }
        register_step_variants<Step, Variant>(variants.family, variants.key, variants.variants,
                                              StepRank{setup.group, batch}, variants.one,
                                              variants.round_name);
      });
}

}  // namespace tp::bench
