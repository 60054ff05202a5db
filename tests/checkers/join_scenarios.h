// A Join scenario of checkers 07, 08 and 09, which carry stage 07's join():
// a rank whose first synced iteration it shadowed keeps, under static_graph,
// the used-map counts that iteration's all-reduce returned (the active
// ranks' sum: its own contribution is zeros, the result is not); trained
// again later, it reuses them. Counts of zero would leave its gradients
// un-averaged and its replica apart.
//
// Included by check_NN.cc after the stage's ddp.h; DDP is the stage's class,
// `options` the checker's usual ones (static_graph is turned on here).
#pragma once

#include <memory>
#include <string>

#include "scenario_models.h"
#include "static_graph_cause.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/data.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"
#include "tensorplay/train/checker.h"

namespace join_scenarios {

template <typename DDP>
tp::train::Scenario static_graph_after_joining_first(typename DDP::Options options) {
  options.static_graph = true;
  return {"static_graph: rank 1 joins before its first synced step, then every rank trains "
          "again: the replicas stay equal",
          2,
          [options](int rank, std::shared_ptr<tp::distributed::ProcessGroup> group)
              -> std::string {
            tp::manual_seed(0);
            DDP ddp(tp::train::make_model({}), group, options);
            tp::optim::SGD sgd(ddp.parameters(), {.lr = 0.05});
            const tp::data::Batch batch = scenario_models::rows_of(rank);
            const auto step = [&] {
              sgd.zero_grad();
              tp::mse_loss(ddp(batch.x), batch.y).backward();
              sgd.step();
            };
            ddp.join([&] {  // rank 1 has no batch: it shadows rank 0's first two steps
              for (int s = 0; s < (rank == 0 ? 2 : 0); ++s) step();
            });
            // Compared inside the second join(): its end would make every
            // replica the last joiner's and hide a difference.
            std::string apart;
            ddp.join([&] {
              for (int s = 0; s < 2; ++s) {  // both ranks: the broadcasts pair
                step();
                tp::NoGradGuard no_grad;
                for (const tp::Tensor& p : ddp.parameters()) {
                  tp::Tensor rank0 = p.clone();
                  group->broadcast(rank0, /*root=*/0)->wait();
                  const double d = tp::max_abs_diff(rank0, p);
                  if (d != 0.0 && apart.empty()) {
                    apart = tp::detail::cat("rank ", rank, ": in a second join() epoch in which "
                                            "every rank trains, after its step ", s,
                                            " its parameters differ from rank 0's by ", d);
                  }
                }
              }
            });
            return apart;
          },
          "a rank whose first synced iteration it shadowed keeps, under static_graph, the "
          "used-map counts that iteration's all-reduce returned (the active ranks' sum: its "
          "own contribution is zeros, the result is not), and reuses them when it trains "
          "again (Note [Static graph], Note [Join])",
          // Each rank's model takes one route throughout.
          static_graph_cause::kShadowedRecordNotGraph};
}

}  // namespace join_scenarios
