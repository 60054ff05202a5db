// The single-process reference trainer (see reference.h).
#include "tensorplay/train/reference.h"

#include "tensorplay/data.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"

namespace tp::train {

ReferenceResult train_reference(const RunConfig& config) {
  TP_CHECK_GE(config.world_size, 1, "tp::train::train_reference: world_size must be at least 1");
  TP_CHECK_GE(config.steps, 1, "tp::train::train_reference: steps must be at least 1");
  TP_CHECK_GE(config.batch_size, 1, "tp::train::train_reference: batch_size must be at least 1");

  // Rank 0's model: DDP broadcasts rank 0's parameters at construction.
  manual_seed(model_seed_for_rank(config, 0));
  nn::MiniMLP model(model_options(config));
  data::SyntheticRegression dataset(data_options(config));
  optim::SGD optimizer(model.parameters(), {config.lr, config.momentum});

  ReferenceResult result;
  result.initial_params = snapshot(model.named_parameters());
  const double scale = 1.0 / config.world_size;
  // [snippet:reference-step]
  for (int64_t step = 0; step < config.steps; ++step) {
    optimizer.zero_grad();
    std::vector<double> step_losses;
    for (int rank = 0; rank < config.world_size; ++rank) {
      data::Batch batch = dataset.shard(step, rank, config.world_size, config.batch_size);
      Tensor loss = mse_loss(model(batch.x), batch.y);
      step_losses.push_back(loss.item());
      // Gradients accumulate across the W backward calls; scaling each loss by
      // 1/W makes the sum the mean over ranks, which is what DDP's averaged
      // all-reduce must produce.
      mul(loss, scale).backward();
    }
    optimizer.step();
    result.losses.push_back(std::move(step_losses));
    if (step == 0) result.after_first_step = snapshot(model.named_parameters());
  }
  // [/snippet:reference-step]
  result.final_params = snapshot(model.named_parameters());
  return result;
}

}  // namespace tp::train
