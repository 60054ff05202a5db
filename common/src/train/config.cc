// The training plan: validation, the schedule, and what each rank builds.
#include "tensorplay/train/config.h"

#include <algorithm>

#include "tensorplay/cuda/runtime.h"
#include "tensorplay/distributed/init.h"
#include "tensorplay/distributed/launcher_env.h"
#include "tensorplay/error.h"

namespace tp::train {

std::string to_string(ModelKind kind) {
  switch (kind) {
    case ModelKind::MiniMLP: return "MiniMLP";
    case ModelKind::Branchy: return "BranchyMLP";
    case ModelKind::Buffered: return "BufferedMLP";
    case ModelKind::Reordered: return "ReorderedMLP";
    case ModelKind::Deep: return "deep MLP";
    case ModelKind::Mixed: return "MixedMLP";
  }
  return "unknown model";
}

std::string to_string(Backend backend) {
  switch (backend) {
    case Backend::Auto: return "auto";
    case Backend::Gloo: return "gloo";
    case Backend::NCCL: return "nccl";
  }
  return "unknown backend";
}

Backend resolved_backend(const RunConfig& config) {
  if (config.backend != Backend::Auto) return config.backend;
  if (config.device.type != DeviceType::CUDA) return Backend::Gloo;
  return distributed::nccl_unavailable_reason().empty() &&
                 config.world_size <= cuda::device_count()
             ? Backend::NCCL
             : Backend::Gloo;
}

Device device_for_rank(const RunConfig& config, int rank) {
  if (config.device.type != DeviceType::CUDA) return config.device;
  // A launched rank counts its GPUs by its local rank, as torchrun's
  // LOCAL_RANK says; a forked rank has none and counts by its rank.
  const int local = distributed::local_rank_from_environment();
  return Device{DeviceType::CUDA, (local >= 0 ? local : rank) % cuda::device_count()};
}

namespace {

// A CUDA plan needs a GPU here, and NCCL needs one GPU per rank.
void validate_device(const RunConfig& config, const char* who) {
  if (config.device.type == DeviceType::CUDA && !cuda::is_available()) {
    TP_THROW(Error, who, ": device cuda: ", cuda::unavailable_reason());
  }
  if (config.backend != Backend::NCCL) return;
  if (config.device.type != DeviceType::CUDA) {
    TP_THROW(Error, who, ": backend nccl moves CUDA tensors only; train on device cuda, or "
             "use backend gloo on the CPU");
  }
  if (const std::string why = distributed::nccl_unavailable_reason(); !why.empty()) {
    TP_THROW(Error, who, ": backend nccl: ", why);
  }
  if (config.world_size > cuda::device_count()) {
    TP_THROW(Error, who, ": backend nccl needs a GPU per rank, and ", config.world_size,
             " ranks share ", cuda::device_count(), " GPU(s) here (NCCL refuses two ranks on "
             "one GPU); use backend gloo, which stages CUDA tensors through host memory");
  }
}

}  // namespace

void validate(const RunConfig& config) {
  constexpr const char* who = "tp::train::RunConfig";
  validate_device(config, who);
  TP_CHECK_GE(config.world_size, 1, who, ": world_size must be at least 1");
  TP_CHECK_GE(config.batch_size, 1, who, ": batch_size must be at least 1");
  TP_CHECK_GE(config.deep_depth, 1, who, ": deep_depth must be at least 1");
  TP_CHECK_GE(config.model.hidden, 1, who, ": model.hidden must be at least 1");
  TP_CHECK_GE(config.micro_batches, 1, who,
              ": micro_batches (K, micro-batches per optimizer step) must be at least 1");
  if (config.batches_per_rank.empty()) {
    TP_CHECK_GE(config.steps, 1, who, ": steps must be at least 1");
    return;
  }
  TP_CHECK_EQ(config.batches_per_rank.size(), static_cast<size_t>(config.world_size), who,
              ": batches_per_rank lists one count per rank; leave it empty for even inputs");
  if (config.buffer_sync == BufferSync::EveryStep && uneven(config)) {
    TP_THROW(Error, who, ": buffer_sync = EveryStep with uneven inputs is not modelled "
             "(which rank's buffers a joined rank would shadow is a Join design choice); use "
             "even inputs or another BufferSync");
  }
  int64_t most = 0;
  for (size_t r = 0; r < config.batches_per_rank.size(); ++r) {
    const int64_t count = config.batches_per_rank[r];
    if (count < 0 || count % config.micro_batches != 0) {
      TP_THROW(Error, who, ": batches_per_rank[", r, "] is ", count, "; each rank needs a "
               "multiple of micro_batches (", config.micro_batches,
               ") micro-batches (0 included), so that it ends on a whole optimizer step");
    }
    most = std::max(most, count);
  }
  TP_CHECK_GE(most, 1, who, ": batches_per_rank gives no rank a micro-batch; at least one "
              "rank must train");
}

int64_t micro_batches_of(const RunConfig& config, int rank) {
  if (config.batches_per_rank.empty()) return config.steps * config.micro_batches;
  return config.batches_per_rank.at(static_cast<size_t>(rank));
}

int64_t steps_of(const RunConfig& config, int rank) {
  return micro_batches_of(config, rank) / config.micro_batches;
}

int64_t total_steps(const RunConfig& config) {
  int64_t most = 0;
  for (int r = 0; r < config.world_size; ++r) most = std::max(most, steps_of(config, r));
  return most;
}

namespace {
uint64_t per_micro_batch(size_t tensors) { return 16 + 4 * static_cast<uint64_t>(tensors); }
}  // namespace

uint64_t collective_budget(const RunConfig& config, size_t tensors) {
  const int64_t micro_batches = total_steps(config) * config.micro_batches;
  return per_micro_batch(tensors) * static_cast<uint64_t>(micro_batches + 2);
}

std::string budget_reason(const RunConfig& config, size_t tensors) {
  return detail::cat(per_micro_batch(tensors), " per micro-batch (16 + 4 x ", tensors,
                     " tensors) for the plan's ", total_steps(config) * config.micro_batches,
                     " micro-batches and 2 more allowances: four times what a correct DDP "
                     "issues");
}

bool uneven(const RunConfig& config) {
  for (int r = 1; r < config.world_size; ++r) {
    if (micro_batches_of(config, r) != micro_batches_of(config, 0)) return true;
  }
  return false;
}

int active_ranks(const RunConfig& config, int64_t step) {
  int count = 0;
  for (int r = 0; r < config.world_size; ++r) count += step < steps_of(config, r) ? 1 : 0;
  return count;
}

int divisor_at(const RunConfig& config, int64_t step) {
  return config.divisor == Divisor::ActiveRanks ? active_ranks(config, step) : config.world_size;
}

uint64_t model_seed_for_rank(const RunConfig& config, int rank) {
  // 7919 (a prime) keeps per-rank seeds far apart and never equal to rank 0's.
  return config.per_rank_seed ? config.model_seed + 7919ull * static_cast<uint64_t>(rank)
                              : config.model_seed;
}

nn::MiniMLPOptions model_options(const RunConfig& config) {
  nn::MiniMLPOptions options = config.model;
  options.dtype = config.dtype;
  return options;
}

std::shared_ptr<nn::Module> make_model(const RunConfig& config) {
  switch (config.model_kind) {
    case ModelKind::MiniMLP: return std::make_shared<nn::MiniMLP>(model_options(config));
    case ModelKind::Branchy: return std::make_shared<nn::BranchyMLP>(model_options(config));
    case ModelKind::Buffered: return std::make_shared<nn::BufferedMLP>(model_options(config));
    case ModelKind::Reordered: return std::make_shared<nn::ReorderedMLP>(model_options(config));
    case ModelKind::Mixed: return std::make_shared<nn::MixedMLP>(model_options(config));
    case ModelKind::Deep: {
      const nn::MiniMLPOptions o = model_options(config);
      return nn::deep_mlp(o.in_features, o.hidden, config.deep_depth, o.out_features, o.dtype);
    }
  }
  TP_THROW(Error, "tp::train::make_model: unknown ModelKind ", static_cast<int>(config.model_kind));
}

data::SyntheticRegressionOptions data_options(const RunConfig& config) {
  data::SyntheticRegressionOptions options = config.data;
  options.dtype = config.dtype;
  options.in_features = config.model.in_features;
  options.out_features = config.model.out_features;
  return options;
}

data::Batch micro_batch(const data::SyntheticRegression& dataset, const RunConfig& config,
                        int rank, int64_t i) {
  data::Batch batch = dataset.shard(i, rank, config.world_size, config.batch_size);
  if (config.device == kCPU) return batch;
  // The data set lives on the CPU (it is the reference's too); each rank
  // copies its rows to its GPU, as a DataLoader's batches are moved.
  const Device device = device_for_rank(config, rank);
  return {batch.x.to(device), batch.y.to(device)};
}

std::string describe(const RunConfig& config) {
  std::string schedule;
  if (config.batches_per_rank.empty()) {
    schedule = detail::cat(" steps=", config.steps);
  } else {
    schedule = " batches=";
    for (size_t r = 0; r < config.batches_per_rank.size(); ++r) {
      schedule += (r ? "/" : "") + std::to_string(config.batches_per_rank[r]);
    }
    if (config.divisor == Divisor::ActiveRanks) schedule += " divide-by-active";
  }
  return detail::cat(
      "W=", config.world_size, schedule, " batch=", config.batch_size,
      config.micro_batches > 1 ? detail::cat(" K=", config.micro_batches) : "",
      " lr=", config.lr, config.momentum > 0 ? detail::cat(" momentum=", config.momentum) : "",
      config.zero_grad_set_to_none ? "" : " zero-grad-in-place",
      " ", to_string(config.dtype),
      config.model_kind != ModelKind::MiniMLP ? " " + to_string(config.model_kind) : "",
      config.model_kind == ModelKind::Buffered
          ? (config.buffer_sync == BufferSync::None ? " buffers-unsynced"
             : config.buffer_sync == BufferSync::EveryStep ? " buffers-every-step"
                                                              : " buffers-at-construction")
          : "",
      config.per_rank_seed ? " per-rank seeds" : " shared seed",
      config.device.type == DeviceType::CUDA
          ? " cuda (" + to_string(resolved_backend(config)) + ")"
          : "");
}

}  // namespace tp::train
