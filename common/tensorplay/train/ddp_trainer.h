// One trainer for every DDP stage: the concept they satisfy, one rank's
// training loop, and a whole job of W spawned ranks.
//
// Contract:
//   - A stage's DistributedDataParallel satisfies DataParallelModel: it is
//     constructed from (module, process group, Options), called like the
//     module, and lists parameters() / named_parameters(). Stages 01 and 02
//     also have sync_grads(), which the trainer calls right after backward;
//     from stage 03 on, gradients are synced inside backward by hooks, and the
//     trainer calls nothing extra.
//   - train_rank() is the training loop of one rank; run_ddp() spawns
//     config.world_size ranks, each with a Gloo process group on a fresh
//     file:// rendezvous, and returns every rank's RankResult in rank order.
//   - A rank's exception or hang comes back as tp::multiprocessing::SpawnError
//     naming the rank (and, for a hang, the collective it waits in).
#pragma once

#include <concepts>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/data.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"
#include "tensorplay/trace.h"
#include "tensorplay/train/config.h"
#include "tensorplay/train/results.h"
#include "tensorplay/util/temp_dir.h"

namespace tp::train {

template <typename D>
concept DataParallelModel =
    std::constructible_from<D, std::shared_ptr<nn::Module>,
                            std::shared_ptr<distributed::ProcessGroup>,
                            typename D::Options> &&
    requires(D ddp, const Tensor& x) {
      { ddp(x) } -> std::same_as<Tensor>;
      { ddp.parameters() } -> std::same_as<std::vector<Tensor>>;
      { ddp.named_parameters() } -> std::same_as<std::vector<nn::NamedTensor>>;
    };

// Stages 01-02: gradients are averaged by an explicit call after backward.
template <typename D>
concept SyncsAfterBackward = DataParallelModel<D> && requires(D ddp) { ddp.sync_grads(); };

// One rank's training loop. Seeds and builds MiniMLP, wraps it, then per step:
// zero_grad, forward on this rank's shard, mse loss, backward, (sync_grads),
// SGD step; recording losses, snapshots and collective counts.
template <DataParallelModel D>
RankResult train_rank(int rank, const RunConfig& config,
                      const std::shared_ptr<distributed::ProcessGroup>& group,
                      const typename D::Options& options) {
  if (config.trace) {
    trace::enable(rank);
    trace::set_thread_name("main");
  }
  manual_seed(model_seed_for_rank(config, rank));
  auto model = std::make_shared<nn::MiniMLP>(model_options(config));

  RankResult result;
  result.rank = rank;
  group->reset_counters();
  D ddp(model, group, options);
  result.construction_allreduces = group->counters().allreduce;
  result.construction_broadcasts = group->counters().broadcast;
  result.construction_allgathers = group->counters().allgather;
  result.initial_params = snapshot(ddp.named_parameters());

  data::SyntheticRegression dataset(data_options(config));
  optim::SGD optimizer(ddp.parameters(), {config.lr, config.momentum});
  // [snippet:rank-step]
  for (int64_t step = 0; step < config.steps; ++step) {
    group->reset_counters();
    trace::Span step_span("step", "train", {{"step", step}});
    optimizer.zero_grad();
    data::Batch batch = dataset.shard(step, rank, config.world_size, config.batch_size);
    Tensor loss;
    {
      trace::Span span("forward", "compute");
      loss = mse_loss(ddp(batch.x), batch.y);
    }
    result.losses.push_back(loss.item());
    {
      trace::Span span("backward", "compute");
      loss.backward();
    }
    if constexpr (SyncsAfterBackward<D>) {
      trace::Span span("sync_grads", "ddp");
      ddp.sync_grads();
    }
    {
      trace::Span span("optimizer", "compute");
      optimizer.step();
    }
    result.allreduces_per_step.push_back(group->counters().allreduce);
    result.broadcasts_per_step.push_back(group->counters().broadcast);
    if (step == 0) result.after_first_step = snapshot(ddp.named_parameters());
  }
  // [/snippet:rank-step]
  result.final_params = snapshot(ddp.named_parameters());
  if (config.trace) {
    trace::disable();
    result.events = trace::events();
  }
  return result;
}

// Runs config.world_size ranks of stage D and returns their results in rank
// order. Throws tp::multiprocessing::SpawnError if a rank fails or hangs.
template <DataParallelModel D>
std::vector<RankResult> run_ddp(const RunConfig& config,
                                const typename D::Options& options = {}) {
  TempDir rendezvous("tensorplay-rdzv");
  multiprocessing::SpawnOptions spawn_options;
  spawn_options.timeout = config.job_timeout;
  auto body = [&](int rank) -> std::string {
    auto group = std::make_shared<distributed::ProcessGroupGloo>(
        rendezvous.path(), rank, config.world_size,
        distributed::GlooOptions{config.collective_timeout});
    return serialize(train_rank<D>(rank, config, group, options));
  };
  std::vector<std::string> payloads =
      multiprocessing::spawn(spawn_options, body, config.world_size);
  std::vector<RankResult> results;
  for (const std::string& payload : payloads) results.push_back(parse_rank_result(payload));
  return results;
}

}  // namespace tp::train
