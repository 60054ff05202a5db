// The lesson demo: train the reference and a DDP stage side by side and
// print the per-step table.
//
//   ./kit demo NN [--world-size W] [--steps N] [--batch B] [--lr X]
//                 [--momentum M] [--dtype float32|float64] [--per-rank-seed]
//                 [--json FILE] [--trace FILE]
//
// Columns: step; the reference's loss (mean over the ranks' micro-batches);
// DDP's loss on rank 0 and the reference's for rank 0's micro-batch; the same
// for the last rank; and the largest |DDP - reference| over all ranks at that
// step. Then the final parameter norms and the largest parameter differences.
// --json FILE writes the same numbers, every rank included (schema in demo.cc).
// --trace FILE records every rank's timeline (tp::trace), writes it as one
// Chrome trace (open it in ui.perfetto.dev) and prints the last step as an
// ASCII timeline.
#pragma once

#include <cstdio>
#include <string>

#include "tensorplay/train/ddp_trainer.h"
#include "tensorplay/train/reference.h"

namespace tp::train {

struct DemoArgs {
  RunConfig config;
  std::string json_path;   // empty: no JSON
  std::string trace_path;  // empty: no trace
};

// Parses the flags above (defaults: 4 ranks, 10 steps). Prints usage and
// exits 2 on a bad flag; exits 0 on --help.
DemoArgs parse_demo_args(int argc, char** argv, const std::string& stage);
// Prints the table and summary to stdout; writes JSON when asked.
void report_demo(const std::string& stage, const std::string& title, const DemoArgs& args,
                 const ReferenceResult& reference, const std::vector<RankResult>& ranks);

template <DataParallelModel D>
int demo_main(int argc, char** argv, const std::string& stage, const std::string& title,
              const typename D::Options& options = {}) {
  DemoArgs args = parse_demo_args(argc, argv, stage);
  try {
    ReferenceResult reference = train_reference(args.config);
    std::vector<RankResult> ranks = run_ddp<D>(args.config, options);
    report_demo(stage, title, args, reference, ranks);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "demo %s: %s\n", stage.c_str(), error.what());
    return 1;
  }
  return 0;
}

}  // namespace tp::train
