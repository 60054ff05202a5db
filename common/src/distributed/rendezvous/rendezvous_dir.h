// Private to libtensorplay: the checks on a file:// rendezvous directory,
// shared by init_process_group (which checks before building a group) and
// ProcessGroupGloo (which checks when built directly).
#pragma once

#include <string>

namespace tp::distributed::detail {

// Creates `dir` (and its parents) if missing and proves that this process
// can create files in it. Throws tp::DistributedError naming `caller`, the
// rank, the cause and the fix. Touches nothing but the directory, so it is
// safe to call before any rank waits on another.
void prepare_rendezvous_dir(const std::string& dir, int rank, const char* caller);

}  // namespace tp::distributed::detail
