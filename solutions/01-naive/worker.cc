// Stage 01's rank worker: one process of a data-parallel job, from joining
// the group to leaving it. See worker.h for the contract and
// lessons/01-naive/README.md ("What to build") for the why.
#include "worker.h"

#include "tensorplay/data.h"
#include "tensorplay/distributed/init.h"
#include "tensorplay/error.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"

namespace stage01 {

namespace dist = tp::distributed;
using tp::Tensor;
using tp::train::RunConfig;
using tp::train::WorkerResult;

// (The parameters are [[maybe_unused]] only for the exercise's stub.)
WorkerResult train_worker([[maybe_unused]] int rank, [[maybe_unused]] const RunConfig& config,
                          [[maybe_unused]] const std::string& init_method,
                          [[maybe_unused]] const Options& options) {
  // EXERCISE: be one rank of the job (worker.h is the contract). Join the
  // process group; seed, then build the plan's model; wrap it in your DDP;
  // train config.steps steps on this rank's own micro-batches, averaging
  // the gradients between backward and the optimizer step; record every
  // step's loss and, at the end, the parameters and buffers; leave the
  // group. Every rank runs this same code: only `rank` tells them apart.
  // The calls you need are declared in the headers included above; the
  // kit's README shows most of them in its API tour (one step, one model).
  // BEGIN SOLUTION
  dist::init_process_group("gloo", rank, config.world_size, init_method,
                           config.collective_timeout);
  // Seed before building: the model's initial values (and its buffers) are
  // drawn from the global generator.
  tp::manual_seed(tp::train::model_seed_for_rank(config, rank));
  std::shared_ptr<tp::nn::Module> model = tp::train::make_model(config);
  DistributedDataParallel ddp(model, dist::default_group(), options);
  tp::optim::SGD optimizer(ddp.parameters(), {config.lr, config.momentum});
  tp::data::SyntheticRegression dataset(tp::train::data_options(config));

  WorkerResult result;
  for (int64_t step = 0; step < config.steps; ++step) {
    optimizer.zero_grad();
    tp::data::Batch batch = tp::train::micro_batch(dataset, config, rank, step);
    Tensor loss = tp::mse_loss(ddp(batch.x), batch.y);
    result.losses.push_back(loss.item());
    loss.backward();
    ddp.sync_grads();  // every rank now holds the mean gradient
    optimizer.step();
  }
  result.parameters = tp::train::snapshot(ddp.named_parameters());
  result.buffers = tp::train::snapshot(model->named_buffers());
  dist::destroy_process_group();
  return result;
  // END SOLUTION
}

}  // namespace stage01
