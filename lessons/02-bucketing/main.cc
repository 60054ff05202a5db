// Lesson 02's demo: bucketed DDP next to the reference trainer.
//   ./kit demo 02 [--bucket-cap-mb X] [--first-bucket-cap-mb X] [--model mini|buffered]
//                 (--help lists every flag)
// Prints the bucket assignment (bucket -> parameters, bytes) before the table.
// Built twice: demo_02 with solutions/02-bucketing, demo_02_mine with your
// exercises/02-bucketing (`./kit demo 02 --mine`).
#include "ddp.h"

#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  tp::train::DemoSpec<stage02::Options> spec;
  spec.stage = "02";
  spec.title = "bucketed DDP, one all-reduce per bucket after backward";
  spec.advice.where_sync = "in sync_grads(), bucket by bucket";
  spec.advice.how_sync_runs = "by sync_grads() after loss.backward(), on every rank";
  spec.flags = {
      tp::train::number_flag("--bucket-cap-mb", "X",
                             "cap of every bucket but the first, in MiB (default 25)",
                             spec.options.bucket_cap_mb, 1e-9, 1e6),
      tp::train::number_flag("--first-bucket-cap-mb", "X",
                             "cap of the first bucket, in MiB (default 1)",
                             spec.options.first_bucket_cap_mb, 1e-9, 1e6)};
  return tp::train::demo_main<stage02::DistributedDataParallel>(argc, argv, spec);
}
