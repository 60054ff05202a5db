// Stage 09 — Join over several joinables. See join.h for the contract and
// lessons/09-zero/README.md for the why.
#include "join.h"

#include <algorithm>

#include "tensorplay/error.h"
#include "tensorplay/tensor.h"

namespace stage09 {

using tp::Tensor;
using tp::distributed::ReduceOp;

// Note [Join over joinables]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Stage 07's join(body) kept a rank that had run out of inputs issuing what
// a synced step issues, so that the ranks still training never waited for a
// collective nobody would send. That was the DDP's business alone: a step's
// collectives were all the DDP's. With a sharded optimizer they are not: a
// step is [count][the DDP's buckets][the optimizer's gather of the shards],
// and a joined rank must shadow all of it, in that order.
//
// So the loop leaves the DDP. Each iteration of the ranks still training
// begins with the count (the first joinable's notify, an all-reduce of 1 on
// each of them); a joined rank adds 0 to that same all-reduce from this
// loop. A sum of 0: every rank has joined, and the post hooks run (the DDP:
// the last joiner's model to everyone). Otherwise each main hook shadows its
// object's part of the iteration, in list order, which is the order the
// iteration itself runs them: the DDP's shadow step, then the optimizer's.
//
// Only the first joinable counts, because one all-reduce per iteration is
// all it takes, and it must be the first thing the iteration does: the DDP's
// synced forward. Listed first, the optimizer would count at the end of the
// iteration on the ranks still training, while a joined rank counts at the
// start of its loop: the count would pair with a bucket's all-reduce. That
// order is caught before any collective: every joinable's notify must find
// a count taken since its previous one, and the DDP's first forward, with
// the optimizer listed first, finds none.
//
// Why no hook runs after an exception: the body did not finish, so there is
// nothing to shadow; the other ranks find out from their next collective
// (which names this rank), as they would without a Join.
Join::Join(std::vector<Joinable*> joinables, JoinOptions options)
    : joinables_(std::move(joinables)), options_(options) {
  // EXERCISE: refuse, naming the joinable, what a Join cannot count: no
  // joinables, a null one, one listed twice, and joinables of different
  // process groups (a Join counts the ranks of one group). Then remember
  // the group and start with every rank training.
  // BEGIN SOLUTION
  TP_CHECK(!joinables_.empty(), "stage09 Join: no joinables; pass the DDP (and the optimizer)");
  for (size_t i = 0; i < joinables_.size(); ++i) {
    TP_CHECK(joinables_[i] != nullptr, "stage09 Join: joinable ", i, " is null");
    for (size_t j = 0; j < i; ++j) {
      TP_CHECK(joinables_[j] != joinables_[i], "stage09 Join: joinable ", i,
               " is joinable ", j, " again; pass each object once");
    }
  }
  group_ = &joinables_[0]->join_process_group();
  for (size_t i = 1; i < joinables_.size(); ++i) {
    TP_CHECK(&joinables_[i]->join_process_group() == group_, "stage09 Join: joinable ", i,
             " uses another process group than joinable 0; a Join counts the ranks of one group");
  }
  active_ranks_ = group_->size();
  // END SOLUTION
}

void Join::run(const std::function<void()>& body) {
  if (!options_.enable) {
    body();
    return;
  }
  for (Joinable* j : joinables_) {
    TP_CHECK(j->join_ == nullptr, "stage09 Join: a joinable is already in a Join; Joins do "
             "not nest");
  }
  // The joinables see this Join for exactly as long as run() runs.
  struct Enter {
    Join& join;
    explicit Enter(Join& j) : join(j) {
      for (Joinable* x : join.joinables_) {
        x->join_ = &join;
        x->counts_seen_ = join.counts_;
      }
    }
    ~Enter() {
      for (Joinable* x : join.joinables_) x->join_ = nullptr;
    }
  } enter(*this);
  std::vector<std::unique_ptr<JoinHook>> hooks;
  for (Joinable* j : joinables_) hooks.push_back(j->join_hook(options_));
  active_ranks_ = group_->size();
  body();
  // EXERCISE: this rank has run out of inputs. Keep it in the game (Note
  // [Join over joinables]): count the ranks still training with 0 of your
  // own, shadow their iteration through every main hook while any is,
  // then run every post hook, telling each whether this rank joined last.
  // BEGIN SOLUTION
  bool is_last_joiner = true;  // until a count shows others still training
  for (;;) {
    count_active_ranks(0.0f);
    if (active_ranks_ == 0) break;
    is_last_joiner = false;
    for (const std::unique_ptr<JoinHook>& hook : hooks) hook->main_hook();
  }
  for (const std::unique_ptr<JoinHook>& hook : hooks) hook->post_hook(is_last_joiner);
  // END SOLUTION
}

void Join::count_active_ranks(float mine) {
  Tensor count = tp::full({1}, mine, tp::kFloat32);
  // EXERCISE: sum every rank's `mine` (1: still training, 0: joined) into
  // active_ranks_, and count the counts (counts_: how a joinable tells that
  // a count came between two of its notifies). With
  // throw_on_early_termination, once some but not all ranks have joined,
  // throw tp::DistributedError on every rank, naming this one and how many
  // have joined.
  // BEGIN SOLUTION
  group_->allreduce(count, ReduceOp::SUM)->wait();
  active_ranks_ = static_cast<int>(count.item());
  ++counts_;
  if (options_.throw_on_early_termination && active_ranks_ > 0 &&
      active_ranks_ < group_->size()) {
    TP_THROW(tp::DistributedError, "stage09 Join: rank ", group_->rank(), ": a rank ran out of "
             "inputs (", group_->size() - active_ranks_, " of ", group_->size(),
             " have joined) and throw_on_early_termination is set: every rank stops here "
             "instead of shadowing the others (Note [Join over joinables])");
  }
  // END SOLUTION
}

int notify_join_context(Joinable& joinable) {
  Join* join = joinable.join_context();
  if (join == nullptr) return joinable.join_process_group().size();  // not in a Join
  // EXERCISE: only the first joinable communicates: it counts this rank
  // as training. Every joinable gets the count. A joinable that notifies
  // twice with no count of the ranks in between (the optimizer listed
  // before the DDP) is listed in the wrong place: say so, before any
  // collective, on every rank (join.h's contract).
  // BEGIN SOLUTION
  if (&joinable == join->joinables_[0]) join->count_active_ranks(1.0f);
  TP_CHECK(join->counts_ != joinable.counts_seen_, "stage09 Join: a joinable notified twice "
           "with no count of the ranks in between: the first joinable must be the one whose "
           "iteration starts first and counts (the DDP, whose synced forward notifies); list it "
           "first: Join({&ddp, &optimizer})");
  joinable.counts_seen_ = join->counts_;
  return join->active_ranks();
  // END SOLUTION
}

}  // namespace stage09
