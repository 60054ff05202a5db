// The lesson demo: train the reference and a DDP stage side by side and
// print the per-step table.
//
//   ./kit demo NN [--world-size W] [--steps N] [--batch B] [--lr X]
//                 [--momentum M] [--dtype float32|float64] [--per-rank-seed]
//                 [--model mini|branchy|buffered|reordered|deep] [--hidden N]
//                 [--depth N (deep)] [--micro-batches K]
//                 [--batches N0,N1,...] [--divide-by-active-ranks]
//                 [--json FILE] [--trace FILE] [--init-method URL]
//                 [--collective-timeout MS] [--worker (lesson 01)]
//                 [the stage's own flags]
//
// Columns: step; the reference's loss (mean over the ranks' micro-batches);
// DDP's loss on rank 0 and the reference's for rank 0's micro-batches (the
// mean over the step's K micro-batches); the same for the last rank ("-"
// where a rank had no batch left); and the largest |DDP - reference| over
// all ranks at that step. Before it, the buckets when the stage has them;
// after it, the final parameter norms and the largest differences.
// --collective-timeout MS bounds the rendezvous and every collective
// (default 10000). --json FILE writes the same numbers, every rank included (schema in demo.cc).
// --trace FILE records every rank's timeline (tp::trace), writes it as one
// Chrome trace (open it in ui.perfetto.dev) and prints the last step as an
// ASCII timeline.
// --worker (a lesson whose DemoSpec has a worker: lesson 01) runs the ranks
// through the lesson's own rank worker (worker.h) instead of the kit's
// trainer: the same table and verdict, without collective counts or trace.
//
// One process or one per rank: by default the demo forks its own W ranks
// (file:// rendezvous, one machine). Started by a launcher, one process per
// rank (tprun --nproc-per-node 2 ... -- demo_07 --init-method env://), each
// process is one rank: WORLD_SIZE is the world size, every rank trains its
// part, all results are gathered, and rank 0 prints the table (and writes
// --json and --trace); the others print one line. RANK set in the
// environment without --init-method is an error: each launched process
// would otherwise start a whole job of its own.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "tensorplay/multiprocessing/error_file.h"
#include "tensorplay/train/compare.h"
#include "tensorplay/train/ddp_trainer.h"
#include "tensorplay/train/reference.h"
#include "tensorplay/train/worker.h"

namespace tp::train {

struct DemoArgs {
  RunConfig config;
  std::string init_method;  // empty: spawn the ranks here; else one rank of a launched job
  std::string json_path;   // empty: no JSON
  std::string trace_path;  // empty: no trace
  bool worker = false;     // --worker: the ranks ran the lesson's own worker
};

// A flag of the stage's own ("--bucket-cap-mb X"), usually changing its
// Options, and the plan when the two must agree (buffer sync). apply() gets
// the value (empty for a flag without one) and the plan being parsed, and
// returns "" or what is wrong with the value.
struct DemoFlag {
  std::string name;        // "--bucket-cap-mb"
  std::string value_name;  // "X"; empty for a flag without a value
  std::string help;        // one line for --help
  std::function<std::string(const std::string& value, RunConfig& config)> apply;
};

// A flag that sets a number in [low, high]: number_flag("--bucket-cap-mb",
// "X", "bucket size cap in MiB", spec.options.bucket_cap_mb, 0, 1e6).
// `target` is written while the flags are parsed, so it must outlive them.
DemoFlag number_flag(std::string name, std::string value_name, std::string help,
                     double& target, double low, double high);

// What a lesson's demo is: its stage, title, the stage's options and own
// flags, and its words for the verdict (the checker's Advice).
template <typename Options>
struct DemoSpec {
  std::string stage;  // "01"
  std::string title;  // "naive DDP, one all-reduce per parameter after backward"
  Options options{};
  std::vector<DemoFlag> flags;  // may write `options` (of this very spec) by reference
  Advice advice;
  // Makes the options agree with the plan the flags produced (stage 07:
  // --divide-by-active-ranks sets the plan's divisor and the DDP's option).
  std::function<void(const RunConfig&, Options&)> adapt;
  // The lesson's own rank worker (lesson 01's train_worker), which --worker
  // runs instead of the kit's trainer; empty: no --worker flag.
  std::function<WorkerResult(int rank, const RunConfig& config, const std::string& init_method,
                             const Options& options)>
      worker;
};

// Parses the flags above (defaults: 4 ranks, 10 steps) and the stage's own.
// Prints usage and exits 2 on a bad flag or an unrunnable plan, including
// one that `fits_stage` (when given) throws tp::Error for; exits 0 on --help.
DemoArgs parse_demo_args(int argc, char** argv, const std::string& stage,
                         const std::vector<DemoFlag>& stage_flags = {},
                         const std::function<void(const RunConfig&)>& fits_stage = {});
// Prints the table and summary to stdout; writes JSON when asked. With
// args.worker, `ranks` came from a worker (as_rank_result): no collective
// counts are shown, and the verdict is check_workers'.
void report_demo(const std::string& stage, const std::string& title, const DemoArgs& args,
                 const ReferenceResult& reference, const std::vector<RankResult>& ranks,
                 const Advice& advice = {});

// The whole main() of a lesson's demo. The spec's flags write spec.options
// while the command line is parsed; the DDP is built from it afterwards.
template <DataParallelModel D>
int demo_main(int argc, char** argv, const DemoSpec<typename D::Options>& spec) {
  std::vector<DemoFlag> flags = spec.flags;
  bool use_worker = false;
  if (spec.worker) {
    flags.push_back({"--worker", "", "run the lesson's own rank worker instead of the kit's trainer",
                     [&use_worker](const std::string&, RunConfig&) {
                       use_worker = true;
                       return std::string();
                     }});
  }
  // A device the stage cannot train on is a usage error (exit 2).
  DemoArgs args = parse_demo_args(argc, argv, spec.stage, flags, [](const RunConfig& config) {
    check_device_fits_stage<D>(config.device);
  });
  args.worker = use_worker;
  if (args.worker && args.config.trace) {
    std::fprintf(stderr, "demo %s: --trace needs the kit's trainer; drop --worker\n",
                 spec.stage.c_str());
    return 2;
  }
  if (args.worker && !args.init_method.empty()) {
    std::fprintf(stderr, "demo %s: --worker starts its own ranks; drop --init-method\n",
                 spec.stage.c_str());
    return 2;
  }
  try {
    typename D::Options options = spec.options;
    if (spec.adapt) spec.adapt(args.config, options);
    std::vector<RankResult> ranks;
    if (args.worker) {
      const RunConfig& config = args.config;
      std::vector<WorkerResult> results =
          run_workers(config, [&](int rank, const std::string& init_method) {
            return spec.worker(rank, config, init_method, options);
          });
      for (size_t r = 0; r < results.size(); ++r) {
        ranks.push_back(as_rank_result(static_cast<int>(r), results[r]));
      }
    } else if (args.init_method.empty()) {
      ranks = run_ddp<D>(args.config, options);
    } else {
      LaunchedRun run = run_launched_rank<D>(args.config, options, args.init_method);
      if (run.rank != 0) {
        std::printf("demo %s: rank %d of %d trained; rank 0 prints the table\n",
                    spec.stage.c_str(), run.rank, args.config.world_size);
        return 0;
      }
      ranks = std::move(run.ranks);
    }
    ReferenceResult reference = train_reference(args.config);
    report_demo(spec.stage, spec.title, args, reference, ranks, spec.advice);
  } catch (const std::exception& error) {
    multiprocessing::record_error(error);  // for tprun, when it started this rank
    std::fprintf(stderr, "demo %s: %s\n", spec.stage.c_str(), error.what());
    return 1;
  }
  return 0;
}

}  // namespace tp::train
