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
// The stage's title, words and flags come from its StageSpec (stage.h).
#include "stage.h"
#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  return tp::train::demo_main<stage04::DistributedDataParallel>(argc, argv, stage04::stage_spec());
}
