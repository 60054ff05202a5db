// Lesson 04's demo: DDP with no_sync (gradient accumulation), next to the
// reference trainer.
//   ./kit demo 04 [--micro-batches K] [--bucket-cap-mb X]
//                 [--first-bucket-cap-mb X] [--gradient-as-bucket-view]
//                 [--trace FILE]   (--help lists every flag)
// With --micro-batches K (the lesson uses 4), each optimizer step runs K
// forward/backward passes, the first K - 1 under ddp.no_sync(): the table
// compares the losses, and the line under it shows the all-reduces of each
// micro-batch (none until the last).
// Built twice: demo_04 with solutions/04-no-sync, demo_04_mine with your
// exercises/04-no-sync (`./kit demo 04 --mine`).
#include "ddp.h"

#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  tp::train::DemoSpec<stage04::Options> spec;
  spec.stage = "04";
  spec.title = "DDP with no_sync (gradient accumulation)";
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
       }}};
  return tp::train::demo_main<stage04::DistributedDataParallel>(argc, argv, spec);
}
