// tp::distributed::ProcessGroup: the checks every backend shares.
#include "tensorplay/distributed/process_group.h"

#include <chrono>
#include <cstdio>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "count_board.h"
#include "rank_list.h"
#include "tensorplay/error.h"

namespace tp::distributed {

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
  }
  return "ReduceOp(" + std::to_string(static_cast<int>(op)) + ")";
}

namespace {

// Runs before the members are initialized, so a bad (rank, size) never
// reaches a backend's constructor body.
int checked_size(int rank, int size) {
  if (size < 1) {
    TP_THROW(DistributedError, "tp::distributed::ProcessGroup: world size must be >= 1 (got ",
             size, "); pass the number of ranks in the job");
  }
  if (rank < 0 || rank >= size) {
    TP_THROW(DistributedError, "tp::distributed::ProcessGroup: rank ", rank,
             " is out of range for world size ", size, "; ranks are 0 .. ", size - 1);
  }
  return size;
}

}  // namespace

ProcessGroup::ProcessGroup(int rank, int size)
    : rank_(rank), size_(checked_size(rank, size)) {}

// Note [Collective budget]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A hang detector watches for progress: spawn's counts every wait that
// returns, and a collective that times out fails by itself. A rank that
// loops forever issuing collectives that all complete defeats both: every
// collective is progress, and none waits for anything that will not come.
// A student's join loop that adds 1 instead of 0 ("still training") is
// such a loop on every rank: each round all-reduces, sees a rank still
// training, shadows a step, and goes round again. What bounds it is a
// count: a DDP issues a bounded number of collectives per step (one per
// bucket or parameter, a notify, a used-map), so a plan of S steps has a
// ceiling, and the collective past it is a bug, reported on the rank that
// issued it.
void ProcessGroup::charge_budget(const char* collective) {
  ++issued_;
  if (budget_ == 0 || issued_ - budget_from_ <= budget_) return;
  TP_THROW(DistributedError, "tp::distributed::ProcessGroup: rank ", rank_, " issued collective #",
           issued_, " (", collective, "), past the budget of ", budget_, " collectives",
           budget_from_ > 0 ? tp::detail::cat(" from #", budget_from_ + 1) : std::string(),
           budget_reason_.empty() ? std::string() : " (" + budget_reason_ + ")",
           ": a loop that keeps issuing collectives never ends; is a sync loop or join's "
           "shadowing loop missing its exit? (Note [Collective budget])");
}

// Note [Counting collectives]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Gloo pairs a rank's k-th collective with the others' k-th (Note [Gloo
// tags] in collective_fingerprint.cc). A rank that skips one (a bucket it
// never launched, a hook future it completed by hand) pairs its next
// collective with the others' skipped one: when the two have the same
// shape nothing fails, and every rank's sum is wrong from there on. No
// collective can see the skip, since the k-th of every rank meets the k-th
// of the others whatever each meant by it; only a point the ranks agree
// on can, such as the end of a step, where every rank must have issued as
// many collectives as the others. So check_collective_count writes this
// rank's count at its n-th point where the other ranks can read it, beside
// n (a CountBoard: the group's store, or a file:// job's mapped file), and
// reads the next rank's record of the same point. No rank waits:
//   - the rank that skipped reaches the point first (the others' last
//     collective of the step completes only once it issues its next one,
//     after the point), so the rank before it in the ring, arriving later,
//     finds its record and the smaller count;
//   - a rank that issued an extra collective reaches the point last (its
//     extra one completes only when the others issue their next one, after
//     the point), and finds the record of the rank after it.
// Either way the rank that sees it reads every rank's record (giving the
// ranks still on their way a second to write theirs) and throws, leading
// with the odd one out. Each rank keeps two records, for odd and
// even points, since the next rank is never more than one point away
// while each step has a collective; a record of another point is not
// compared (a rank that joined stops calling, and its old record stays;
// it skips the points it missed once the others are done, or its next
// check would meet theirs one point off, as in a launched checker whose
// cases share a group).
// A record is (point << 32) | count.
// Its cost, per check (bench_allreduce's BM_CountCheck): a memory write and
// read under file://; one round trip to env://'s TCP store, four to redis
// (README, "Mismatched collectives", has the measured cost).
namespace {

using detail::rank_words;

constexpr int kCountBits = 32;
constexpr int64_t kCountMask = (int64_t{1} << kCountBits) - 1;


}  // namespace

void ProcessGroup::check_collective_count(const std::string& where) {
  if (!count_board_ || size_ == 1) return;
  ++count_points_;
  const int slot = static_cast<int>(count_points_ % 2);
  const int64_t mine = (count_points_ << kCountBits) | (static_cast<int64_t>(issued_) & kCountMask);
  std::map<int64_t, std::vector<int>> ranks_by_count;
  std::vector<int> not_there;
  try {
    const int64_t next = count_board_->write_then_read(rank_, slot, mine, (rank_ + 1) % size_);
    if (next >> kCountBits != count_points_ || next == mine) return;
    // Found. The ranks on their way to this point are given a moment to
    // record theirs, so that the message can name the odd one out.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (;;) {
      ranks_by_count.clear();
      not_there.clear();
      for (int r = 0; r < size_; ++r) {
        const int64_t theirs = r == rank_ ? mine : count_board_->read(r, slot);
        if (theirs >> kCountBits == count_points_) {
          ranks_by_count[theirs & kCountMask].push_back(r);
        } else {
          not_there.push_back(r);
        }
      }
      if (not_there.empty() || std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } catch (const PeerFailedError&) {
    // The TCP store left with rank 0's process, which ends its job once its
    // collectives are done, perhaps while this rank checks its last step:
    // nothing is left to count. (Had rank 0 left early, this rank's next
    // collective says so.)
    count_board_.reset();
    return;
  } catch (const DistributedError& e) {
    // The store is needed only to meet: a job goes on without it (a
    // redis-server that stopped after rendezvous, a rank 0 too busy to
    // answer), and so does this rank, unchecked from here on.
    count_board_.reset();
    std::fprintf(stderr, "tp::distributed: rank %d: collective counts are no longer checked: %s\n",
                 rank_, e.what());
    return;
  }
  std::string counts;
  for (const auto& [count, ranks] : ranks_by_count) {
    counts += tp::detail::cat(counts.empty() ? "" : ", ", rank_words(ranks), " ", count);
  }
  std::string lead;
  const auto fewest = ranks_by_count.begin();
  const auto most = std::prev(ranks_by_count.end());
  if (ranks_by_count.size() == 2 && (fewest->second.size() == 1) != (most->second.size() == 1)) {
    // One rank against a majority: the one is the likely cause.
    const bool one_fewer = fewest->second.size() == 1;
    const auto& odd = one_fewer ? *fewest : *most;
    const auto& rest = one_fewer ? *most : *fewest;
    lead = tp::detail::cat(rank_words(odd.second), " is the likely cause: by ", where, " it had issued ",
                       odd.first, " collectives on this group where ", rank_words(rest.second),
                       " had issued ", rest.first, one_fewer
                           ? ": it skipped a collective the others issued"
                           : ": it issued a collective the others did not");
  } else if (ranks_by_count.size() == 2 && fewest->second.size() == 1) {
    lead = tp::detail::cat(rank_words(fewest->second), " issued fewer collectives on this group than ",
                       rank_words(most->second), " by ", where, " (", fewest->first, " against ",
                       most->first, "): it skipped one, or ", rank_words(most->second),
                       " issued an extra one");
  } else {
    lead = tp::detail::cat("the ranks had issued different numbers of collectives on this group by ",
                       where, ": ", counts);
  }
  TP_THROW(DistributedError, lead, not_there.empty() ? std::string()
           : tp::detail::cat(" (", rank_words(not_there), " had not reached it yet)"),
           ". Where a rank skips one, its next collective pairs with the others' skipped one, "
           "and when the two have the same shape every rank's results are wrong from there on. "
           "Every rank must issue the same collectives in the same order "
           "[tp::distributed::ProcessGroup::check_collective_count on rank ", rank_,
           "; Note [Counting collectives]]");
}

void ProcessGroup::skip_count_points(int64_t missed) {
  if (missed < 0) {
    TP_THROW(DistributedError, "tp::distributed::ProcessGroup::skip_count_points: rank ", rank_,
             ": ", missed, " points missed; pass how many check_collective_count calls this rank "
             "left out (0 or more)");
  }
  count_points_ += missed;
}

// A group of the kit's own (a test's recording group, a checker's wrapper)
// need not implement the flat collectives; calling one says so.
std::shared_ptr<Work> ProcessGroup::reduce_scatter_tensor(const Tensor&, const Tensor&,
                                                          const std::vector<int64_t>&,
                                                          ReduceOp) {
  TP_THROW(DistributedError, "tp::distributed::ProcessGroup::reduce_scatter_tensor: rank ",
           rank(), ": the '", backend_name(), "' process group does not implement it; use "
           "backend \"gloo\" or \"nccl\"");
}

std::shared_ptr<Work> ProcessGroup::allgather_into_tensor(const Tensor&, const Tensor&,
                                                          const std::vector<int64_t>&) {
  TP_THROW(DistributedError, "tp::distributed::ProcessGroup::allgather_into_tensor: rank ",
           rank(), ": the '", backend_name(), "' process group does not implement it; use "
           "backend \"gloo\" or \"nccl\"");
}

}  // namespace tp::distributed
