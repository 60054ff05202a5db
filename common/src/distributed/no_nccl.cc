// The NCCL backend in a build without NCCL (Meson found no libnccl or
// nccl.h in the system folders or the CUDA toolkit's, or -Dnccl=disabled):
// make_process_group("nccl", ...) (and so init_process_group) says so, with
// the fix.
#include "nccl_backend.h"

#include "tensorplay/distributed/init.h"
#include "tensorplay/error.h"

namespace tp::distributed {

std::string nccl_unavailable_reason() {
  return "tensorplay was built without NCCL (Meson found no CUDA toolkit, or no libnccl and "
         "nccl.h in the system folders or the toolkit's, or the build was configured with "
         "-Dnccl=disabled); install "
         "NCCL and reconfigure with -Dnccl=enabled, or use backend \"gloo\", which also "
         "takes CUDA tensors by staging them through host memory";
}

std::shared_ptr<ProcessGroup> detail::make_nccl_group(std::shared_ptr<Store>, int rank, int,
                                                      std::chrono::milliseconds, bool) {
  TP_THROW(DistributedError, "tp::distributed::ProcessGroupNCCL: rank ", rank, ": ",
           nccl_unavailable_reason());
}

}  // namespace tp::distributed
