// Lesson 10's demo: FSDP, next to the reference trainer.
//   ./kit demo 10 [--sharding full|grad-op|none] [--forward-prefetch]
//                 [--backward-prefetch pre|post|none]
//                 [--auto-wrap-policy linear|children|size]
//                 [--world-size W] [--steps S] [--model deep] [--json FILE]
//                 (--help lists every flag)
// Each rank keeps 1/W of the parameters, gradients and momentum, and
// gathers a unit only while it computes, yet the numbers are the
// reference's: the table shows them, then each rank's memory.
// Built twice: demo_10 with solutions/10-fsdp, demo_10_mine with your
// exercises/10-fsdp (`./kit demo 10 --mine`).
// The stage's title, words and flags come from its StageSpec (stage.h).
#include "stage.h"
#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  return tp::train::demo_main<stage10::FullyShardedDataParallel>(argc, argv,
                                                                 stage10::stage_spec());
}
