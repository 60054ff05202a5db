// Lesson 06's demo: DDP that rebuilds its buckets after the first
// iteration, with static_graph, next to the reference trainer.
//   ./kit demo 06 [--model reordered] [--static-graph]
//                 [--find-unused-parameters] [--bucket-cap-mb X] [--trace FILE]
//                 (--help lists every flag)
// With --model reordered (the lesson's) the layers are registered in another
// order than forward uses them: the bucket table at the top is the rebuilt
// one, in the order the gradients became ready.
// Built twice: demo_06 with solutions/06-static-graph, demo_06_mine with your
// exercises/06-static-graph (`./kit demo 06 --mine`).
#include "ddp.h"

#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  tp::train::DemoSpec<stage06::Options> spec;
  spec.stage = "06";
  spec.title = "DDP with rebuilt buckets and static_graph";
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
  return tp::train::demo_main<stage06::DistributedDataParallel>(argc, argv, spec);
}
