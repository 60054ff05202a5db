// Lesson 01's demo: naive DDP next to the reference trainer.
//   ./kit demo 01 [--world-size 4] [--steps 10] [--batch 8] [--lr 0.05] [--json FILE]
//                 [--worker] (--help lists every flag)
// Built twice: demo_01 with solutions/01-naive, demo_01_mine with your
// exercises/01-naive (`./kit demo 01 --mine`). The ranks run the kit's
// trainer; with --worker they run the lesson's rank worker (worker.cc).
#include "ddp.h"
#include "worker.h"

#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  tp::train::DemoSpec<stage01::Options> spec;
  spec.stage = "01";
  spec.title = "naive DDP, one all-reduce per parameter after backward";
  spec.advice.where_sync = "in sync_grads()";
  spec.advice.how_sync_runs = "by sync_grads() after loss.backward(), on every rank";
  spec.flags.push_back({"--no-broadcast-buffers", "",
                        "keep each rank's own buffers (try it with --model buffered)",
                        [&spec](const std::string&, tp::train::RunConfig& config) {
                          spec.options.broadcast_buffers = false;
                          config.buffer_sync = tp::train::BufferSync::None;
                          return std::string();
                        }});
  spec.worker = stage01::train_worker;
  return tp::train::demo_main<stage01::DistributedDataParallel>(argc, argv, spec);
}
