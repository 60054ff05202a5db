// Lesson 01's demo: naive DDP next to the reference trainer.
//   ./kit demo 01 [--world-size 4] [--steps 10] [--batch 8] [--lr 0.05] [--json FILE]
//                 [--worker] (--help lists every flag)
// Built twice: demo_01 with solutions/01-naive, demo_01_mine with your
// exercises/01-naive (`./kit demo 01 --mine`). The ranks run the kit's
// trainer; with --worker they run the lesson's rank worker (worker.cc).
// The stage's title, words and flags come from its StageSpec (stage.h).
#include "stage.h"
#include "tensorplay/train/demo.h"
#include "worker.h"

int main(int argc, char** argv) {
  return tp::train::demo_main<stage01::DistributedDataParallel>(argc, argv, stage01::stage_spec(),
                                                                stage01::train_worker);
}
