// Lesson 09's demo: DDP with a ZeRO-sharded optimizer, next to the
// reference trainer.
//   ./kit demo 09 [--reduce-scatter] [--param-sync allgather|broadcast]
//                 [--batches 6,0,4,...] [--world-size W] [--steps S] [--json FILE]
//                 (--help lists every flag)
// Every rank keeps momentum for its own shard only, yet the numbers are the
// reference's: the table shows them, then each rank's shard and memory.
// Built twice: demo_09 with solutions/09-zero, demo_09_mine with your
// exercises/09-zero (`./kit demo 09 --mine`).
// The stage's title, words and flags come from its StageSpec (stage.h).
#include "stage.h"
#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  return tp::train::demo_main<stage09::DistributedDataParallel>(argc, argv, stage09::stage_spec());
}
