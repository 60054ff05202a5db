// Lesson 01's demo: naive DDP next to the reference trainer.
//   ./kit demo 01 [--world-size 4] [--steps 10] [--batch 8] [--lr 0.05] [--json FILE]
// Built twice: demo_01 with solutions/01-naive, demo_01_mine with your
// exercises/01-naive (`./kit demo 01 --mine`).
#include "ddp.h"

#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  return tp::train::demo_main<stage01::DistributedDataParallel>(
      argc, argv, "01", "naive DDP, one all-reduce per parameter after backward");
}
