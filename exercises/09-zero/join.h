// Copied from solutions/09-zero/join.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 09 — Join over several joinables: PyTorch's
// torch.distributed.algorithms.Join, for a DDP and a ZeroRedundancyOptimizer
// trained together on uneven inputs.
//
// What it is: stage 07's join(body) taken apart. There, the DDP alone knew
// what a rank that has run out of inputs must keep doing (shadow each synced
// step) and what to do once every rank has (broadcast the last joiner's
// model). With a sharded optimizer there is a second object whose
// collectives the other ranks wait for: every step ends with the
// optimizer's all-gather of the updated shards. So the loop that keeps a
// joined rank in the game moves out of the DDP into Join, and each object
// that issues collectives per iteration says what its shadow is: a
// Joinable hands Join a JoinHook, whose main_hook() shadows one iteration
// and whose post_hook() runs once every rank has joined (Note [Join over
// joinables] in join.cc).
//
// Contract:
//   - Join(joinables, options) wraps this rank's training loop:
//     join.run(body). The list is not empty, holds no object twice, and
//     every joinable uses the same process group; otherwise tp::Error.
//     Every rank passes the same kinds of joinables in the same order.
//   - The first joinable counts the ranks still training: at the start of
//     each of its iterations (a DDP: each synced forward) it calls
//     notify_join_context(*this), which all-reduces a 1; a joined rank adds
//     0 to the same all-reduce from Join's loop. The others' notify
//     communicates nothing and returns the count the first one took. So the
//     first joinable must be the one whose iteration starts first: the DDP,
//     before the optimizer (PyTorch's rule too). A joinable that notifies
//     twice with no count in between (listed before the DDP, the optimizer
//     would count at the end of each iteration, and the DDP's forward would
//     notify before any count) throws tp::Error on every rank, before any
//     collective, saying to list the DDP first.
//   - main hooks run in list order, once per iteration of the ranks still
//     training; post hooks in list order, once, with is_last_joiner true on
//     the ranks that ran out last.
//   - options.enable = false: run(body) is body() and notify does nothing
//     (for code that sometimes has even inputs). throw_on_early_termination:
//     the first iteration that counts fewer ranks than the world size throws
//     tp::DistributedError on every rank, naming how many have joined.
//     divide_by_initial_world_size is handed to each joinable's join_hook:
//     divide the summed gradients by the world size (true, PyTorch's
//     default) or by the ranks still training.
//   - An exception from body leaves at once (the other ranks then fail in
//     their next collective, naming this rank); no hook runs.
//   - Not thread-safe; a Join and its joinables belong to the thread that
//     trains. Joins do not nest (tp::Error).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "tensorplay/distributed/process_group.h"

namespace stage09 {

struct JoinOptions {
  bool enable = true;
  bool throw_on_early_termination = false;
  bool divide_by_initial_world_size = true;
};

// What a joined rank runs in place of one iteration (main_hook), and once
// every rank has joined (post_hook). Both default to nothing.
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  virtual void main_hook() {}
  virtual void post_hook(bool is_last_joiner) { (void)is_last_joiner; }
};

class Join;

class Joinable {
 public:
  virtual ~Joinable() = default;
  // The hook Join runs for this object; `options` says how to divide.
  virtual std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) = 0;
  // The group this object's collectives go through.
  virtual tp::distributed::ProcessGroup& join_process_group() = 0;

  // The Join this object is in, or null: set by Join for the length of
  // run(), read by notify_join_context().
  Join* join_context() const { return join_; }

 private:
  friend class Join;
  friend int notify_join_context(Joinable& joinable);
  Join* join_ = nullptr;
  uint64_t counts_seen_ = 0;  // Join::counts_ at this object's last notify
};

class Join {
 public:
  Join(std::vector<Joinable*> joinables, JoinOptions options = {});
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // Runs body (this rank's training loop), then shadows the others'
  // iterations through the main hooks until every rank has joined, then
  // runs the post hooks (Note [Join over joinables]).
  void run(const std::function<void()>& body);

  const JoinOptions& options() const { return options_; }
  // Ranks still training, as the last count found (the world size before
  // the first).
  int active_ranks() const { return active_ranks_; }

 private:
  friend int notify_join_context(Joinable& joinable);
  // The count: this rank adds `mine` (1 training, 0 joined); sets
  // active_ranks_; throws for throw_on_early_termination.
  void count_active_ranks(float mine);

  std::vector<Joinable*> joinables_;
  JoinOptions options_;
  tp::distributed::ProcessGroup* group_ = nullptr;
  int active_ranks_ = 0;
  // Counts taken so far (the first joinable's notifies and the loop's
  // rounds): a joinable's notify must find a new one each time.
  uint64_t counts_ = 0;
};

// Called by a joinable at the start of each of its iterations. Outside a
// Join (or with enable = false) it does nothing and returns the world size.
// In one, the first joinable all-reduces this rank's 1 and every joinable
// gets the number of ranks still training (see the contract).
int notify_join_context(Joinable& joinable);

}  // namespace stage09
