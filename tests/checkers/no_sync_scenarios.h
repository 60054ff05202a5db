// The no_sync scenarios of checkers 04 and 05: what the training loop
// cannot express about a no_sync() guard. Each drives the stage's DDP on
// MiniMLP itself and counts the collectives of each backward (every kind:
// all-reduces, broadcasts, all-gathers, barriers).
//
//   - a guard around the forward only, backward after it: no sync;
//   - a guard taken after the forward, around backward only: it syncs;
//   - one guard over two micro-batches: neither syncs;
//   - nested guards: quiet inside both, and after the inner one ends;
//   - a guard moved into another object (std::optional): the temporary it
//     came from ends nothing; destroying the moved-to one ends no_sync;
//   - two DDPs in one process: a guard on one leaves the other syncing.
//
// Included by check_NN.cc after the stage's ddp.h; DDP is the stage's class.
// Every synced backward in these scenarios is its DDP's first:
// `first_sync_extra` is what a stage issues there besides its buckets (stage
// 06 broadcasts rank 0's ready order to rebuild them).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensorplay/data.h"
#include "tensorplay/error.h"
#include "tensorplay/ops.h"
#include "tensorplay/random.h"
#include "scenario_models.h"
#include "tensorplay/train/checker.h"

namespace no_sync_scenarios {

using Group = std::shared_ptr<tp::distributed::ProcessGroup>;
using tp::detail::cat;

// One micro-batch's loss on this rank's rows of the default plan's data.
template <typename DDP>
tp::Tensor loss_of(DDP& ddp, int rank) {
  const tp::data::Batch batch = scenario_models::rows_of(rank);
  return tp::mse_loss(ddp(batch.x), batch.y);
}

// MiniMLP in 3 buckets (16, 512 | 128, 4096 | 128, 2048 bytes).
template <typename DDP>
std::unique_ptr<DDP> make_ddp(const Group& group) {
  tp::manual_seed(0);
  typename DDP::Options options;
  options.bucket_cap_mb = 2000.0 / (1 << 20);
  options.first_bucket_cap_mb = 500.0 / (1 << 20);
  return std::make_unique<DDP>(tp::train::make_model(tp::train::RunConfig{}), group, options);
}

// Every collective the group issued while `run` ran.
template <typename Fn>
uint64_t collectives_during(const Group& group, Fn&& run) {
  const uint64_t before = group->counters().collectives();
  run();
  return group->counters().collectives() - before;
}

// "" when the count is as expected, else the fact.
inline std::string expect(int rank, const std::string& what, uint64_t got, uint64_t expected) {
  if (got == expected) return "";
  return cat("rank ", rank, ": ", got, " collectives ", what, "; expected ", expected);
}

// Runs the checks in order and returns the first fact that failed.
inline std::string first_of(const std::vector<std::string>& facts) {
  for (const std::string& f : facts) {
    if (!f.empty()) return f;
  }
  return "";
}

inline const char* kDecidedAtForward =
    "record in forward() whether its backward syncs, from the no_sync guards alive at that "
    "moment, and let the hooks read that record, not whether a guard is alive during backward "
    "(Note [Decided at forward])";

template <typename DDP>
std::vector<tp::train::Scenario> all(uint64_t first_sync_extra = 0) {
  std::vector<tp::train::Scenario> out;
  out.push_back(
      {"a micro-batch under a guard issues no collective of any kind, forward included", 2,
       [](int rank, Group group) {
         auto ddp = make_ddp<DDP>(group);
         auto guard = ddp->no_sync();
         const uint64_t n = collectives_during(group, [&] { loss_of(*ddp, rank).backward(); });
         return expect(rank, "in a forward and backward run under no_sync", n, 0);
       },
       "a micro-batch under no_sync must not communicate at all, its forward included: no "
       "agreement check, no buffer broadcast, no all-reduce"});
  out.push_back(
      {"forward under no_sync, backward after the guard is gone: no sync", 2,
       [first_sync_extra](int rank, Group group) {
         auto ddp = make_ddp<DDP>(group);
         const uint64_t buckets = ddp->bucket_assignment().size() + first_sync_extra;
         tp::Tensor loss;
         {
           auto guard = ddp->no_sync();
           loss = loss_of(*ddp, rank);
         }
         const uint64_t quiet = collectives_during(group, [&] { loss.backward(); });
         const uint64_t synced =
             collectives_during(group, [&] { loss_of(*ddp, rank).backward(); });
         return first_of(
             {expect(rank, "in a backward whose forward ran under no_sync", quiet, 0),
              expect(rank, "in the next backward, whose forward ran outside no_sync", synced,
                     buckets)});
       },
       kDecidedAtForward});
  out.push_back(
      {"forward outside no_sync, backward under a guard taken afterwards: it syncs", 2,
       [first_sync_extra](int rank, Group group) {
         auto ddp = make_ddp<DDP>(group);
         const uint64_t buckets = ddp->bucket_assignment().size() + first_sync_extra;
         tp::Tensor loss = loss_of(*ddp, rank);
         auto guard = ddp->no_sync();
         const uint64_t n = collectives_during(group, [&] { loss.backward(); });
         return expect(rank, "in a backward whose forward ran outside no_sync (the guard was "
                             "taken after the forward)",
                       n, buckets);
       },
       kDecidedAtForward});
  out.push_back(
      {"one guard over two micro-batches: neither syncs", 2,
       [](int rank, Group group) {
         auto ddp = make_ddp<DDP>(group);
         auto guard = ddp->no_sync();
         const uint64_t first = collectives_during(group, [&] { loss_of(*ddp, rank).backward(); });
         const uint64_t second = collectives_during(group, [&] { loss_of(*ddp, rank).backward(); });
         return first_of(
             {expect(rank, "in the first micro-batch under a guard", first, 0),
              expect(rank, "in the second micro-batch under the same guard", second, 0)});
       },
       "a guard lasts until it is destroyed, not for one forward: forward() reads the flag, it "
       "does not reset it"});
  out.push_back(
      {"nested guards: quiet inside both, and after the inner one ends", 2,
       [](int rank, Group group) {
         auto ddp = make_ddp<DDP>(group);
         auto outer = ddp->no_sync();
         uint64_t inside = 0;
         {
           auto inner = ddp->no_sync();
           inside = collectives_during(group, [&] { loss_of(*ddp, rank).backward(); });
         }
         const uint64_t after = collectives_during(group, [&] { loss_of(*ddp, rank).backward(); });
         return first_of(
             {expect(rank, "in a micro-batch run inside two nested guards", inside, 0),
              expect(rank, "in a micro-batch run under an outer guard after an inner one ended",
                     after, 0)});
       },
       "a guard turns sync off whatever it finds (not flips it), and restores, when destroyed, "
       "the state it found when it was made (not `true`): guards nest"});
  out.push_back(
      {"a guard moved into a std::optional: the moved-from temporary ends nothing", 2,
       [first_sync_extra](int rank, Group group) {
         auto ddp = make_ddp<DDP>(group);
         const uint64_t buckets = ddp->bucket_assignment().size() + first_sync_extra;
         std::string fact;
         {
           std::optional<decltype(ddp->no_sync())> moved;
           moved.emplace(ddp->no_sync());  // the temporary is destroyed here
           const uint64_t held = collectives_during(group, [&] { loss_of(*ddp, rank).backward(); });
           moved.reset();
           fact = expect(rank, "under a guard moved into a std::optional, no other guard alive "
                               "(its moved-from temporary already destroyed)",
                         held, 0);
         }
         if (!fact.empty()) return fact;
         {
           auto outer = ddp->no_sync();
           std::optional<decltype(ddp->no_sync())> moved;
           moved.emplace(ddp->no_sync());  // the temporary is destroyed here
           const uint64_t held = collectives_during(group, [&] { loss_of(*ddp, rank).backward(); });
           moved.reset();  // ends the inner guard: the outer one still holds
           const uint64_t outer_only =
               collectives_during(group, [&] { loss_of(*ddp, rank).backward(); });
           fact = first_of(
               {expect(rank, "under a guard moved into a std::optional (its moved-from "
                             "temporary already destroyed)",
                       held, 0),
                expect(rank, "under an outer guard after a moved inner guard ended", outer_only,
                       0)});
         }
         const uint64_t synced = collectives_during(group, [&] { loss_of(*ddp, rank).backward(); });
         return first_of({fact, expect(rank, "after every guard ended", synced, buckets)});
       },
       "moving a guard hands over its duty: the moved-from guard must do nothing when destroyed "
       "(its DDP pointer null), and the moved-to guard must restore what the original found"});
  out.push_back(
      {"two DDPs in one process: a guard on one leaves the other syncing", 2,
       [first_sync_extra](int rank, Group group) {
         auto a = make_ddp<DDP>(group);
         auto b = make_ddp<DDP>(group);
         auto guard = a->no_sync();
         const uint64_t n = collectives_during(group, [&] { loss_of(*b, rank).backward(); });
         return expect(rank, "in a backward of DDP B while a guard on DDP A was alive", n,
                       b->bucket_assignment().size() + first_sync_extra);
       },
       "the no_sync flag belongs to one DDP object (a member, not a static or a global): a "
       "guard on one model must not silence another"});
  return out;
}

}  // namespace no_sync_scenarios
