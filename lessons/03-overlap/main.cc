// Lesson 03's demo: DDP overlapping its bucket all-reduces with backward,
// next to the reference trainer.
//   ./kit demo 03 [--bucket-cap-mb X] [--first-bucket-cap-mb X]
//                 [--gradient-as-bucket-view] [--trace FILE]   (--help lists every flag)
// --trace FILE shows the all-reduces on the communication thread running
// while backward still computes on the main thread.
// Built twice: demo_03 with solutions/03-overlap, demo_03_mine with your
// exercises/03-overlap (`./kit demo 03 --mine`).
#include "ddp.h"

#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  tp::train::DemoSpec<stage03::Options> spec;
  spec.stage = "03";
  spec.title = "DDP overlapping bucket all-reduces with backward";
  spec.advice.where_sync = "by the gradient hooks, bucket by bucket";
  spec.advice.how_sync_runs = "inside loss.backward(), by the hooks and the end-of-backward callback";
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
  return tp::train::demo_main<stage03::DistributedDataParallel>(argc, argv, spec);
}
