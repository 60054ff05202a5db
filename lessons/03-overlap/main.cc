// Lesson 03's demo: DDP overlapping its bucket all-reduces with backward,
// next to the reference trainer.
//   ./kit demo 03 [--bucket-cap-mb X] [--first-bucket-cap-mb X]
//                 [--gradient-as-bucket-view] [--trace FILE]   (--help lists every flag)
// --trace FILE shows the all-reduces on the communication thread running
// while backward still computes on the main thread.
// Built twice: demo_03 with solutions/03-overlap, demo_03_mine with your
// exercises/03-overlap (`./kit demo 03 --mine`).
// The stage's title, words and flags come from its StageSpec (stage.h).
#include "stage.h"
#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  return tp::train::demo_main<stage03::DistributedDataParallel>(argc, argv, stage03::stage_spec());
}
