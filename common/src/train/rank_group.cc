// make_rank_group: the process group of one spawned DDP rank (ddp_trainer.h).
#include <memory>
#include <string>

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
      return distributed::new_nccl_group(rendezvous_dir, rank, config.world_size,
                                         config.collective_timeout);
    case Backend::Gloo:
    case Backend::Auto:
      break;
  }
  return std::make_shared<distributed::ProcessGroupGloo>(
      rendezvous_dir, rank, config.world_size,
      distributed::GlooOptions{config.collective_timeout, config.check_in_flight_writes});
}

}  // namespace tp::train
