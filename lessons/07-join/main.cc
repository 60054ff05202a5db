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
// The stage's title, words and flags come from its StageSpec (stage.h).
#include "stage.h"
#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  return tp::train::demo_main<stage07::DistributedDataParallel>(argc, argv, stage07::stage_spec());
}
