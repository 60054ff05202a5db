// Lesson 02's demo: bucketed DDP next to the reference trainer.
//   ./kit demo 02 [--bucket-cap-mb X] [--first-bucket-cap-mb X] [--model mini|buffered]
//                 (--help lists every flag)
// Prints the bucket assignment (bucket -> parameters, bytes) before the table.
// Built twice: demo_02 with solutions/02-bucketing, demo_02_mine with your
// exercises/02-bucketing (`./kit demo 02 --mine`).
// The stage's title, words and flags come from its StageSpec (stage.h).
#include "stage.h"
#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  return tp::train::demo_main<stage02::DistributedDataParallel>(argc, argv, stage02::stage_spec());
}
