// tp::distributed::ProcessGroup: the checks every backend shares.
#include "tensorplay/distributed/process_group.h"

#include <string>

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
           budget_from_ > 0 ? detail::cat(" from #", budget_from_ + 1) : std::string(),
           budget_reason_.empty() ? std::string() : " (" + budget_reason_ + ")",
           ": a loop that keeps issuing collectives never ends; is a sync loop or join's "
           "shadowing loop missing its exit? (Note [Collective budget])");
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
