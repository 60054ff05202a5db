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
// The stage's title, words and flags come from its StageSpec (stage.h).
#include "stage.h"
#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  return tp::train::demo_main<stage05::DistributedDataParallel>(argc, argv, stage05::stage_spec());
}
