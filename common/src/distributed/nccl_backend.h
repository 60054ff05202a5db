// Private to libtensorplay: what make_process_group needs of the NCCL
// backend, beside the public nccl_unavailable_reason (init.h). Both are
// defined by process_group_nccl.cc in a build with NCCL and by no_nccl.cc
// otherwise, so init.cc compiles the same way in both.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "tensorplay/distributed/process_group.h"
#include "tensorplay/distributed/store.h"

namespace tp::distributed::detail {

// A ProcessGroupNCCL over `store`. REQUIRES: nccl_unavailable_reason()
// (init.h, defined beside this) is empty (otherwise throws
// tp::DistributedError with it).
std::shared_ptr<ProcessGroup> make_nccl_group(std::shared_ptr<Store> store, int rank, int size,
                                              std::chrono::milliseconds timeout,
                                              bool blocking_wait);

}  // namespace tp::distributed::detail
