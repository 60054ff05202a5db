// make_rank_group: the process group of one spawned DDP rank (ddp_trainer.h).
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

}  // namespace tp::train
