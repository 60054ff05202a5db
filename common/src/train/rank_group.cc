// make_rank_group: the process group of one spawned DDP rank; launch_mistake:
// how a launched rank was started wrong (ddp_trainer.h).
#include <cstdlib>
#include <memory>
#include <string>

#include "tensorplay/cuda/runtime.h"
#include "tensorplay/distributed/init.h"
#include "tensorplay/error.h"
#include "tensorplay/train/ddp_trainer.h"

namespace tp::train {

std::shared_ptr<distributed::ProcessGroup> make_rank_group(const RunConfig& config,
                                                           const std::string& rendezvous_dir,
                                                           int rank) {
  if (config.device.type == DeviceType::CUDA) {
    cuda::set_device(device_for_rank(config, rank).index);
  }
  distributed::GroupOptions options;
  options.timeout = config.collective_timeout;
  options.check_in_flight_writes = config.check_in_flight_writes;  // gloo only
  // NCCL: wait() does not block the host (PyTorch's default), whatever the
  // environment says: a collective that never completes is failed by the
  // group's watchdog after the timeout, and the next wait or collective
  // throws. (Its rendezvous needs only a key-value store: the job's fresh
  // directory serves as one.)
  options.blocking_wait = false;
  // resolved_backend is never Auto: "gloo" or "nccl".
  return distributed::make_process_group(to_string(resolved_backend(config)), rank,
                                         config.world_size, "file://" + rendezvous_dir, options);
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
