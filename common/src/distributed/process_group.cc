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

}  // namespace tp::distributed
