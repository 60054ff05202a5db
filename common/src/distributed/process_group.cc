// tp::distributed::ProcessGroup: the checks every backend shares.
#include "tensorplay/distributed/process_group.h"

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
