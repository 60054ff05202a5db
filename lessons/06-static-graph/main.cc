// Lesson 06's demo: DDP that rebuilds its buckets after the first
// iteration, with static_graph, next to the reference trainer.
//   ./kit demo 06 [--model reordered] [--static-graph]
//                 [--find-unused-parameters] [--bucket-cap-mb X] [--trace FILE]
//                 (--help lists every flag)
// With --model reordered (the lesson's) the layers are registered in another
// order than forward uses them: the bucket table at the top is the rebuilt
// one, in the order the gradients became ready.
// Built twice: demo_06 with solutions/06-static-graph, demo_06_mine with your
// exercises/06-static-graph (`./kit demo 06 --mine`).
// The stage's title, words and flags come from its StageSpec (stage.h).
#include "stage.h"
#include "tensorplay/train/demo.h"

int main(int argc, char** argv) {
  return tp::train::demo_main<stage06::DistributedDataParallel>(argc, argv, stage06::stage_spec());
}
