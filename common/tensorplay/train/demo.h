// The lesson demo: train the reference and a DDP stage side by side and
// print the per-step table.
//
//   ./kit demo NN [flags]      (--help lists every flag with its default:
//                               the list is generated from the flags'
//                               declarations in demo_command_line.cc and the
//                               stage's stage.h, and each default is read from the
//                               value the flag's target holds before parsing)
//
// Columns: step; the reference's loss (mean over the ranks' micro-batches);
// DDP's loss on rank 0 and the reference's for rank 0's micro-batches (the
// mean over the step's K micro-batches); the same for the last rank ("-"
// where a rank had no batch left); and the largest |DDP - reference| over
// all ranks at that step. Before it, the buckets when the stage has them;
// after it, the final parameter norms and the largest differences, and each
// rank's memory in KiB as tp::memory counted it (parameters, gradients and
// optimizer state at the end; the peak of the three together).
// --collective-timeout MS bounds the rendezvous and every collective
// (default 10000). --json FILE writes the same numbers, every rank included
// (schema in demo_json.cc). --trace FILE records every rank's timeline
// (tp::trace), writes it as one Chrome trace (open it in ui.perfetto.dev)
// and prints the last step as an ASCII timeline.
// --worker (a lesson with a rank worker of its own: lesson 01) runs the
// ranks through that worker (worker.h) instead of the kit's trainer: the
// same table and verdict, without collective counts or trace.
//
// A bad flag or value is a usage error (exit 2) naming the flag: an unknown
// flag gets the nearest known one as a suggestion.
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

#include "tensorplay/multiprocessing/launched_rank.h"
#include "tensorplay/train/compare.h"
#include "tensorplay/train/ddp_trainer.h"
#include "tensorplay/train/reference.h"
#include "tensorplay/train/stage_spec.h"
#include "tensorplay/train/worker.h"

namespace tp::train {

struct DemoArgs {
  RunConfig config;
  std::string init_method;  // empty: spawn the ranks here; else one rank of a launched job
  std::string json_path;   // empty: no JSON
  std::string trace_path;  // empty: no trace
  bool worker = false;     // --worker: the ranks ran the lesson's own worker
  bool float64_rerun = true;  // --no-float64-rerun: a float32 run that differs is told as it is
  // Empty: the stage's solution runs. Else the folder of the code that runs
  // instead, named in the header: the demo built against the student's
  // exercise (demo_NN_mine, `./kit demo NN --mine`, built with TP_DEMO_MINE).
  std::string mine;
};

// Parses the shared flags and the stage's own (defaults: 4 ranks, 10
// steps); `offers_worker` adds --worker. Prints the error and exits 2 on a
// bad flag or an unrunnable plan, including one that `fits_stage` (when
// given) throws tp::Error for; prints usage and exits 0 on --help.
DemoArgs parse_demo_args(int argc, char** argv, const std::string& stage,
                         const std::string& title, const std::vector<BoundFlag>& stage_flags,
                         bool offers_worker,
                         const std::function<void(const RunConfig&)>& fits_stage = {});
// Note [Rounding or a bug]: a float32 run that differs from the reference
// may be a correct DDP whose rounding grew. DDP averages W gradients where
// the reference averages the same numbers in another order, so the last
// bits differ from step 0 on; training amplifies such differences, and over
// a long run, or a fast one (a high learning rate with momentum), they can
// pass any fixed tolerance, the losses' too. No tolerance separates that
// from a bug for every plan, so the demo asks the numbers instead: the same
// plan, seeds and data re-run in float64, where rounding is 2^29 times
// smaller. A correct DDP then matches; a wrong one differs in float64 too.
struct Float64Rerun {
  bool ran = false;
  bool skipped = false;         // it was due, and --no-float64-rerun skipped it
  bool matches = false;         // within float64's tolerance
  double max_param_diff = 0.0;  // the float64 run's, against its reference
  double max_loss_diff = 0.0;
};
// Whether a run deserves the float64 re-run: float32, the kit's trainer
// with ranks forked here (not a lesson's worker, not a launched job),
// exact by design (`approximation` empty), a reference that stayed finite,
// and a difference from it.
bool wants_float64_rerun(const DemoArgs& args, const ReferenceResult& reference,
                         const std::vector<RankResult>& ranks, const std::string& approximation);
// The float64 run's verdict, from its reference and ranks.
Float64Rerun judge_float64_rerun(const RunConfig& config, const ReferenceResult& reference,
                                 const std::vector<RankResult>& ranks);

// Prints the table and summary to stdout; writes JSON when asked. With
// args.worker, `ranks` came from a worker (as_rank_result): no collective
// counts are shown, and the verdict is check_workers'. A float64 re-run
// that matches turns a float32 "differs" into a verdict of rounding.
// `approximation` (StageSpec::approximation's answer), when not empty,
// says why the run only approximates the reference: a difference is then
// reported as a distance, not as a wrong DDP.
void report_demo(const std::string& stage, const std::string& title, const DemoArgs& args,
                 const ReferenceResult& reference, const std::vector<RankResult>& ranks,
                 const Advice& advice = {}, const std::string& approximation = "",
                 const Float64Rerun& rerun = {});

// The ranks' results for the demo's plan: from the lesson's own rank
// worker, from ranks it spawns, or, launched, every rank's. Empty on a
// launched rank other than 0, which has said that it trained.
template <DataParallelModel D>
std::vector<RankResult> run_demo_ranks(const std::string& stage, const DemoArgs& args,
                                       const run_options_t<D>& options,
                                       const RankWorker<run_options_t<D>>& worker) {
  if (args.worker) {
    const RunConfig& config = args.config;
    std::vector<WorkerResult> results =
        run_workers(config, [&](int rank, const std::string& init_method) {
          return worker(rank, config, init_method, options);
        });
    std::vector<RankResult> ranks;
    for (size_t r = 0; r < results.size(); ++r) {
      ranks.push_back(as_rank_result(static_cast<int>(r), results[r]));
    }
    return ranks;
  }
  if (args.init_method.empty()) return run_ddp<D>(args.config, options);
  multiprocessing::report_to_launcher();  // where it waits, for tprun
  LaunchedRun run = run_launched_rank<D>(args.config, options, args.init_method);
  if (run.rank != 0) {
    std::printf("demo %s: rank %d of %d trained; rank 0 prints the table\n", stage.c_str(),
                run.rank, args.config.world_size);
    return {};
  }
  return std::move(run.ranks);
}

// Note [Rounding or a bug]: when the float32 run differs from the
// reference, the same plan in float64 (unless --no-float64-rerun).
template <DataParallelModel D>
Float64Rerun float64_rerun_if_differs(const std::string& stage, const DemoArgs& args,
                                      const run_options_t<D>& options,
                                      const ReferenceResult& reference,
                                      const std::vector<RankResult>& ranks,
                                      const std::string& approximation) {
  Float64Rerun rerun;
  if (!wants_float64_rerun(args, reference, ranks, approximation)) return rerun;
  if (!args.float64_rerun) {
    rerun.skipped = true;
    return rerun;
  }
  RunConfig f64 = args.config;
  f64.dtype = kFloat64;
  f64.trace = false;
  std::printf("demo %s: the float32 run differs from the reference; re-running it in "
              "float64 to tell rounding from a bug (Note [Rounding or a bug], demo.h): "
              "as long again as the run (--no-float64-rerun skips it)\n",
              stage.c_str());
  std::fflush(stdout);  // said before the wait, also into a pipe
  return judge_float64_rerun(f64, train_reference(f64), run_ddp<D>(f64, options));
}

// The whole main() of a lesson's demo: the stage's spec says what it is
// and which flags it takes; `worker` is the lesson's own rank worker, if it
// has one. The flags write one options object (run_options_t<D>,
// stage_spec.h) while the command line is parsed; `spec.adapt` then makes it agree with the plan.
template <DataParallelModel D>
int demo_main(int argc, char** argv, const StageSpec<run_options_t<D>>& spec,
              const RankWorker<run_options_t<D>>& worker = {}) {
  run_options_t<D> options{};
  const std::vector<BoundFlag> flags = bind_flags(spec.flags, options);
  // A plan the stage cannot run (a device, uneven inputs, accumulation it
  // lacks the capability for, options its spec's check_plan refuses) is a
  // usage error (exit 2), before any rank.
  DemoArgs args = parse_demo_args(argc, argv, spec.number, spec.title, flags, bool(worker),
                                  [&spec, &options](const RunConfig& config) {
                                    check_plan_fits_stage<D>(config);
                                    if (!spec.check_plan) return;
                                    run_options_t<D> adapted = options;  // as the run will
                                    if (spec.adapt) spec.adapt(config, adapted);
                                    spec.check_plan(config, adapted);
                                  });
#ifdef TP_DEMO_MINE
  args.mine = TP_DEMO_MINE;
#endif
  if (args.worker && args.config.trace) {
    std::fprintf(stderr, "demo %s: --trace needs the kit's trainer; drop --worker\n",
                 spec.number.c_str());
    return 2;
  }
  if (args.worker && !args.init_method.empty()) {
    std::fprintf(stderr, "demo %s: --worker starts its own ranks; drop --init-method\n",
                 spec.number.c_str());
    return 2;
  }
  try {
    if (spec.adapt) spec.adapt(args.config, options);
    const std::vector<RankResult> ranks = run_demo_ranks<D>(spec.number, args, options, worker);
    if (ranks.empty()) return 0;  // a launched rank other than 0
    const ReferenceResult reference = train_reference(args.config);
    const std::string approximation = spec.approximation ? spec.approximation(options) : "";
    const Float64Rerun rerun =
        float64_rerun_if_differs<D>(spec.number, args, options, reference, ranks, approximation);
    report_demo(spec.number, spec.title, args, reference, ranks, spec.advice, approximation,
                rerun);
  } catch (const std::exception& error) {
    multiprocessing::record_error(error);  // for tprun, when it started this rank
    std::fprintf(stderr, "demo %s: %s\n", spec.number.c_str(), error.what());
    return 1;
  }
  return 0;
}

}  // namespace tp::train
