// The single-process reference trainer (see reference.h).
#include "tensorplay/train/reference.h"

#include <set>
#include <string>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/data.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"
#include "tensorplay/train/unreached.h"

namespace tp::train {

namespace {

// Copies of a module's buffers: one rank's running statistics.
std::vector<Tensor> clone_buffers(const nn::Module& model) {
  std::vector<Tensor> out;
  for (const Tensor& b : model.buffers()) out.push_back(b.clone());
  return out;
}

// Tensors are handles: copy_ writes into the buffers `to` refers to.
void copy_into(std::vector<Tensor> to, const std::vector<Tensor>& from) {
  NoGradGuard no_grad;
  for (size_t j = 0; j < to.size(); ++j) to[j].copy_(from[j]);
}

Snapshot snapshot_buffers(const nn::Module& model, const std::vector<Tensor>& values) {
  std::vector<nn::NamedTensor> named = model.named_buffers();
  for (size_t j = 0; j < named.size(); ++j) named[j].second = values[j];
  return snapshot(named);
}

// Adds to `unreached` the names of the model's parameters `loss` does not
// reach (ReferenceResult::unreached_in_step0).
void note_unreached(const Tensor& loss, const nn::Module& model, std::set<std::string>& unreached) {
  const std::vector<nn::NamedTensor> params = model.named_parameters();
  for (int64_t p : unreached_parameters(loss, params)) {
    unreached.insert(params[static_cast<size_t>(p)].first);
  }
}

}  // namespace

ReferenceResult train_reference(const RunConfig& config) {
  validate(config);
  const int world_size = config.world_size;
  const int64_t k_micro = config.micro_batches;

  // Note [Buffers in the reference]
  // Parameters are one set (DDP keeps them equal on every rank), but buffers
  // are per rank: each rank's forward updates its own running statistics
  // from its own micro-batches. So the reference keeps W sets of buffers,
  // each starting from what that rank's own seed built, and swaps rank r's
  // set into the model around rank r's forward. BufferSync says when rank
  // 0's set is copied to the others, as DDP's broadcast_buffers would.
  std::vector<std::vector<Tensor>> rank_buffers;
  for (int rank = 0; rank < world_size; ++rank) {
    manual_seed(model_seed_for_rank(config, rank));
    rank_buffers.push_back(clone_buffers(*make_model(config)));
  }
  // Rank 0's model: DDP broadcasts rank 0's parameters at construction.
  manual_seed(model_seed_for_rank(config, 0));
  std::shared_ptr<nn::Module> model = make_model(config);
  const std::vector<Tensor> model_buffers = model->buffers();
  if (config.buffer_sync != BufferSync::None) {
    for (int rank = 1; rank < world_size; ++rank) copy_into(rank_buffers[rank], rank_buffers[0]);
  }
  data::SyntheticRegression dataset(data_options(config));
  optim::SGD optimizer(model->parameters(), {config.lr, config.momentum});

  ReferenceResult result;
  result.initial_params = snapshot(model->named_parameters());
  for (int rank = 0; rank < world_size; ++rank) {
    result.initial_buffers.push_back(snapshot_buffers(*model, rank_buffers[rank]));
  }
  result.losses.resize(static_cast<size_t>(world_size));
  std::set<std::string> unreached;  // see ReferenceResult::unreached_in_step0
  // [snippet:reference-step]
  for (int64_t step = 0; step < total_steps(config); ++step) {
    optimizer.zero_grad();
    // Gradients accumulate over every backward of the step. Scaling each
    // micro-batch loss by 1 / (divisor * K) makes their sum the mean over
    // the K micro-batches, summed over the ranks and divided by the plan's
    // divisor (the world size, unless uneven inputs say otherwise): what
    // DDP's averaged all-reduce must produce.
    const double scale = 1.0 / (static_cast<double>(divisor_at(config, step)) *
                                static_cast<double>(k_micro));
    for (int64_t micro = 0; micro < k_micro; ++micro) {
      const int64_t i = step * k_micro + micro;  // the micro-batch number
      if (config.buffer_sync == BufferSync::EveryStep && micro == 0) {
        for (int rank = 1; rank < world_size; ++rank) {
          copy_into(rank_buffers[rank], rank_buffers[0]);
        }
      }
      for (int rank = 0; rank < world_size; ++rank) {
        if (step >= steps_of(config, rank)) continue;  // this rank has joined
        data::Batch batch = micro_batch(dataset, config, rank, i);
        copy_into(model_buffers, rank_buffers[rank]);
        Tensor loss = mse_loss((*model)(batch.x), batch.y);
        copy_into(rank_buffers[rank], model_buffers);
        if (step == 0) note_unreached(loss, *model, unreached);  // for diagnoses only
        result.losses[rank].push_back(loss.item());
        mul(loss, scale).backward();
      }
    }
    optimizer.step();
    if (step == 0) result.after_first_step = snapshot(model->named_parameters());
  }
  // [/snippet:reference-step]
  for (const auto& [name, param] : model->named_parameters()) {
    if (unreached.count(name) != 0) result.unreached_in_step0.push_back(name);
  }
  result.final_params = snapshot(model->named_parameters());
  for (int rank = 0; rank < world_size; ++rank) {
    result.final_buffers.push_back(snapshot_buffers(*model, rank_buffers[rank]));
  }
  return result;
}

}  // namespace tp::train
