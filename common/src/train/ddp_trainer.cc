// What the trainer (ddp_trainer.h) does that is not a template: the pieces
// of train_rank that do not depend on the stage; make_rank_group, the
// process group of one spawned DDP rank; launch_mistake, how a launched
// rank was started wrong.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensorplay/cuda/runtime.h"
#include "tensorplay/distributed/init.h"
#include "tensorplay/error.h"
#include "tensorplay/train/ddp_trainer.h"

namespace tp::train {

std::shared_ptr<nn::Module> start_rank(int rank, const RunConfig& config) {
  if (config.trace || config.trace_first_step) {
    trace::enable(rank);
    trace::set_thread_name("main");
  }
  if (config.device.type == DeviceType::CUDA) {
    cuda::set_device(device_for_rank(config, rank).index);
  }
  manual_seed(model_seed_for_rank(config, rank));
  memory::reset_peaks();
  std::shared_ptr<nn::Module> model = [&] {
    memory::KindScope parameters(memory::Kind::Parameter);  // (to() keeps the kind)
    return make_model(config);
  }();
  if (config.device != kCPU) model->to(device_for_rank(config, rank));
  return model;
}

void set_rank_collective_budget(distributed::ProcessGroup& group, const RunConfig& config,
                                const nn::Module& model) {
  const size_t tensors = model.named_parameters().size() + model.named_buffers().size();
  group.set_collective_budget(collective_budget(config, tensors), budget_reason(config, tensors));
}

void record_construction(RankResult& result, const distributed::CollectiveCounters& counters) {
  result.construction_allreduces = counters.allreduce;
  result.construction_broadcasts = counters.broadcast;
  result.construction_allgathers = counters.allgather;
}

void record_identities(RankResult& result, const std::vector<nn::NamedTensor>& parameters,
                       const nn::Module& model) {
  for (const nn::NamedTensor& p : parameters) {
    result.param_ids.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(p.second.impl())));
  }
  result.initial_buffers = snapshot(model.named_buffers());
}

void skip_missed_count_points(distributed::ProcessGroup& group, const RunConfig& config,
                              int rank) {
  int64_t most_steps = 0;
  for (int r = 0; r < group.size(); ++r) most_steps = std::max(most_steps, steps_of(config, r));
  group.skip_count_points(most_steps - steps_of(config, rank));
}

void collect_trace(const RunConfig& config, RankResult& result) {
  if (!config.trace && !config.trace_first_step) return;
  trace::disable();
  result.events = trace::events();
  for (trace::Event& e : trace::device_events()) result.events.push_back(std::move(e));
}

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
