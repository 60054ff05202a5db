// Lesson 08's demo: DDP with communication hooks, next to the reference
// trainer.
//   ./kit demo 08 [--comm-hook none|allreduce|fp16|bf16|powersgd]
//                 [--powersgd-rank R] [--powersgd-start-iteration N]
//                 [--world-size W] [--steps S] [--json FILE]
//                 (--help lists every flag)
// allreduce_hook matches the reference to float rounding; fp16 and PowerSGD
// send fewer bytes and match it only approximately: the table shows how
// far, and the bytes each step all-reduced.
// Built twice: demo_08 with solutions/08-comm-hooks, demo_08_mine with your
// exercises/08-comm-hooks (`./kit demo 08 --mine`).
// The stage's title, words and flags come from its StageSpec (stage.h).
#include "stage.h"
#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  return tp::train::demo_main<stage08::DistributedDataParallel>(argc, argv, stage08::stage_spec());
}
