// Lesson 07's demo: DDP with join() for uneven inputs, next to the
// reference trainer.
//   ./kit demo 07 [--batches N0,N1,...] [--divide-by-active-ranks]
//                 [--micro-batches K] [--static-graph] [--trace FILE]
//                 (--help lists every flag)
// --batches gives each rank its own number of micro-batches (the lesson's
// 6,4,2 at 3 ranks): the table shows "-" where a rank had run out and was
// shadowing the others; --divide-by-active-ranks sets
// divide_by_initial_world_size = false (and the reference's rule with it).
// Built twice: demo_07 with solutions/07-join, demo_07_mine with your
// exercises/07-join (`./kit demo 07 --mine`).
#include "ddp.h"

#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  tp::train::DemoSpec<stage07::Options> spec;
  spec.stage = "07";
  spec.title = "DDP with join() for uneven inputs";
  spec.advice.where_sync = "by the gradient hooks of the micro-batch that syncs, bucket by bucket";
  spec.advice.how_sync_runs =
      "inside the backward of the step's last micro-batch (the one whose forward ran outside "
      "no_sync), by the hooks and the end-of-backward callback";
  spec.flags = {
      tp::train::number_flag("--bucket-cap-mb", "X",
                             "cap of every bucket but the first, in MiB (default 25)",
                             spec.options.bucket_cap_mb, 1e-9, 1e6),
      tp::train::number_flag("--first-bucket-cap-mb", "X",
                             "cap of the first bucket, in MiB (default 1)",
                             spec.options.first_bucket_cap_mb, 1e-9, 1e6),
      {"--gradient-as-bucket-view", "", "make each .grad a view of its bucket slot (no copy back)",
       [&spec](const std::string&, tp::train::RunConfig&) {
         spec.options.gradient_as_bucket_view = true;
         return std::string();
       }},
      {"--static-graph", "", "find the unused parameters once, in the first iteration",
       [&spec](const std::string&, tp::train::RunConfig&) {
         spec.options.static_graph = true;
         return std::string();
       }},
      {"--find-unused-parameters", "",
       "walk each forward's graph; let unused parameters complete their buckets",
       [&spec](const std::string&, tp::train::RunConfig&) {
         spec.options.find_unused_parameters = true;
         return std::string();
       }}};
  spec.adapt = [](const tp::train::RunConfig& config, stage07::Options& options) {
    options.divide_by_initial_world_size =
        config.divisor == tp::train::Divisor::InitialWorldSize;
  };
  return tp::train::demo_main<stage07::DistributedDataParallel>(argc, argv, spec);
}
