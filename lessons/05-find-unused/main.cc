// Lesson 05's demo: DDP with find_unused_parameters, next to the reference
// trainer, on a model whose route depends on the data.
//   ./kit demo 05 [--model branchy] [--find-unused-parameters]
//                 [--micro-batches K] [--bucket-cap-mb X] [--trace FILE]
//                 (--help lists every flag)
// With --model branchy (the lesson's) each micro-batch takes branch_a or
// branch_b, and spare is never used: the line under the table lists, per
// rank and step, the parameters that got no gradient there. Without
// --find-unused-parameters the DDP stops at the end of the first backward
// with the error the lesson explains.
// Built twice: demo_05 with solutions/05-find-unused, demo_05_mine with your
// exercises/05-find-unused (`./kit demo 05 --mine`).
#include "ddp.h"

#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  tp::train::DemoSpec<stage05::Options> spec;
  spec.stage = "05";
  spec.title = "DDP with find_unused_parameters";
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
      {"--find-unused-parameters", "",
       "walk each forward's graph; let unused parameters complete their buckets",
       [&spec](const std::string&, tp::train::RunConfig&) {
         spec.options.find_unused_parameters = true;
         return std::string();
       }}};
  return tp::train::demo_main<stage05::DistributedDataParallel>(argc, argv, spec);
}
