// make_rank_group: the process group of one spawned DDP rank; launch_mistake:
// how a launched rank was started wrong (ddp_trainer.h).
#include <cstdlib>
#include <memory>
#include <string>

#include "../distributed/dir_store.h"
#include "../distributed/nccl_backend.h"
#include "tensorplay/cuda/runtime.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/error.h"
#include "tensorplay/train/ddp_trainer.h"

namespace tp::train {

std::shared_ptr<distributed::ProcessGroup> make_rank_group(const RunConfig& config,
                                                           const std::string& rendezvous_dir,
                                                           int rank) {
  if (config.device.type == DeviceType::CUDA) {
    cuda::set_device(device_for_rank(config, rank).index);
  }
  switch (resolved_backend(config)) {
    case Backend::NCCL:
      // NCCL's rendezvous needs only a key-value store: the job's fresh
      // directory serves as one. wait() does not block the host (PyTorch's
      // default): a collective that never completes is failed by the group's
      // watchdog after the timeout, and the next wait or collective throws.
      return distributed::detail::make_nccl_group(
          std::make_shared<distributed::detail::DirStore>(rendezvous_dir), rank,
          config.world_size, config.collective_timeout, /*blocking_wait=*/false);
    case Backend::Gloo:
    case Backend::Auto:
      break;
  }
  return std::make_shared<distributed::ProcessGroupGloo>(
      rendezvous_dir, rank, config.world_size,
      distributed::GlooOptions{config.collective_timeout, config.check_in_flight_writes});
}

std::string launch_mistake(const std::string& program, const std::string& init_method) {
  if (init_method.empty()) {
    const char* rank = std::getenv("RANK");
    if (rank == nullptr) return "";
    return detail::cat("RANK=", rank, " is set (started by tprun or torchrun?) but "
                       "--init-method is not given, so every process would run a whole job of "
                       "its own; pass --init-method env:// to run as one rank of the launched "
                       "job");
  }
  if (init_method.rfind("file://", 0) == 0) {
    return detail::cat("--init-method file:// is what ", program, " does by itself, "
                       "forking its ranks on this machine (leave --init-method out); one "
                       "process per rank takes env://, tcp://HOST:PORT or redis://HOST:PORT/JOB");
  }
  return "";
}

}  // namespace tp::train
