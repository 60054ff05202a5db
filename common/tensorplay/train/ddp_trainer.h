// One trainer for every DDP stage: the concept they satisfy, one rank's
// training loop, and a whole job of W spawned ranks.
//
// Contract:
//   - A stage's DistributedDataParallel satisfies DataParallelModel: it is
//     constructed from (module, process group, Options), called like the
//     module, lists parameters() / named_parameters(), and declares its
//     Capabilities (capabilities.h). The trainer does what the capabilities
//     say: sync_grads() after the step's last backward for syncs_after_backward,
//     nothing for syncs_in_backward, no_sync() around every micro-batch but
//     the last when the stage has it, join() around the loop (a Join over
//     the DDP and its optimizer, for a stage with a sharded optimizer).
//     The optimizer is tp::optim::SGD, or the stage's own (sharded_optimizer:
//     make_optimizer).
//   - Every function here takes the options of a run, run_options_t<D>
//     (stage_spec.h): the DDP's Options, or the stage's RunOptions built on
//     them. The DDP gets the Options part; the stage's functions in
//     stage.h (register_builtin_hook, make_optimizer, join_with_optimizer)
//     get the whole.
//   - train_rank() is the training loop of one rank, walking the plan of
//     config.h; run_ddp() spawns config.world_size ranks, each with a
//     process group on a fresh file:// rendezvous (make_rank_group), and
//     returns every rank's RankResult in rank order.
//   - On a CUDA plan (RunConfig::device) each rank selects its GPU, builds
//     its model on the CPU from the seed and moves it there, and copies its
//     batches there; the group is NCCL or Gloo staging CUDA tensors
//     (resolved_backend). Results are CPU values, as on the CPU.
//   - A plan the stage cannot run (device cuda without cuda, accumulation
//     without no_sync for a stage that syncs inside backward, uneven inputs
//     without join, parameters without gradients without unused_parameters)
//     throws tp::Error saying which capability is missing, before any rank
//     starts.
//   - A rank's exception or hang comes back as tp::multiprocessing::SpawnError
//     naming the rank (and, for a hang, the collective it waits in).
//   - run_launched_rank() is the other way to run a job: a launcher (tprun)
//     started one process per rank, each calls it with an init method such
//     as "env://", and each gets every rank's RankResult back, the same
//     numbers run_ddp() returns for the same plan. A failing rank throws in
//     its own process; the launcher reports it.
#pragma once

#include <algorithm>
#include <concepts>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/cuda/device_trace.h"
#include "tensorplay/cuda/runtime.h"
#include "tensorplay/data.h"
#include "tensorplay/distributed/init.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"
#include "tensorplay/trace.h"
#include "tensorplay/train/capabilities.h"
#include "tensorplay/train/config.h"
#include "tensorplay/train/results.h"
#include "tensorplay/train/stage_spec.h"
#include "tensorplay/train/unreached.h"
#include "tensorplay/util/temp_dir.h"

namespace tp::train {

template <typename D>
concept DataParallelModel =
    std::constructible_from<D, std::shared_ptr<nn::Module>,
                            std::shared_ptr<distributed::ProcessGroup>,
                            typename D::Options> &&
    // The options of a run: the DDP's own, or the stage's RunOptions built
    // on them (stage_spec.h).
    std::derived_from<run_options_t<D>, typename D::Options> &&
    requires(D ddp, const Tensor& x) {
      { D::capabilities } -> std::convertible_to<Capabilities>;
      { ddp(x) } -> std::same_as<Tensor>;
      { ddp.parameters() } -> std::same_as<std::vector<Tensor>>;
      { ddp.named_parameters() } -> std::same_as<std::vector<nn::NamedTensor>>;
    } &&
    // Exactly one way of syncing.
    (D::capabilities.syncs_after_backward != D::capabilities.syncs_in_backward) &&
    // Each capability's member (capabilities.h).
    (!D::capabilities.syncs_after_backward || requires(D ddp) { ddp.sync_grads(); }) &&
    (!D::capabilities.no_sync || requires(D ddp) { ddp.no_sync(); }) &&
    (!D::capabilities.join || requires(D ddp, std::function<void()> body) { ddp.join(body); }) &&
    (!D::capabilities.comm_hooks || requires(D ddp, const run_options_t<D>& options) {
      register_builtin_hook(ddp, options);
    }) &&
    (!D::capabilities.sharded_optimizer ||
     requires(D ddp, const run_options_t<D>& options, std::function<void()> body) {
       make_optimizer(ddp, optim::SGDOptions{}, options)->step();
       make_optimizer(ddp, optim::SGDOptions{}, options)->zero_grad(true);
       {
         make_optimizer(ddp, optim::SGDOptions{}, options)->partition()
       } -> std::convertible_to<std::vector<std::vector<int64_t>>>;
       {
         make_optimizer(ddp, optim::SGDOptions{}, options)->params_with_state()
       } -> std::convertible_to<std::vector<int64_t>>;
       join_with_optimizer(ddp, *make_optimizer(ddp, optim::SGDOptions{}, options), options,
                           body);
     }) &&
    (!D::capabilities.fully_sharded || requires(D ddp) { ddp.summon_full_params(); }) &&
    (!D::capabilities.buckets || requires(D ddp) {
      { ddp.bucket_assignment() } -> std::convertible_to<std::vector<std::vector<int64_t>>>;
    });

// Rank `rank`'s process group for a job of `config` meeting in the fresh
// directory `rendezvous_dir`: Gloo (with the plan's timeout and checker
// mode) or NCCL, as resolved_backend(config) says, built by
// distributed::make_process_group on file://rendezvous_dir. A CUDA rank
// selects its GPU (device_for_rank) first.
std::shared_ptr<distributed::ProcessGroup> make_rank_group(const RunConfig& config,
                                                           const std::string& rendezvous_dir,
                                                           int rank);

// Throws tp::Error when stage D cannot train on `device`: CUDA without the
// cuda capability. Needs no GPU, so a CPU-only stage is refused the same way
// on every machine, before the question of whether this one has a GPU.
template <DataParallelModel D>
void check_device_fits_stage(const Device& device) {
  if (device.type == DeviceType::CUDA && !D::capabilities.cuda) {
    TP_THROW(Error, "tp::train: this stage runs on the CPU only (it does not declare the cuda "
             "capability), so it cannot train on device cuda; stage 03 is the stage that runs "
             "on CUDA (./kit demo 03 --device cuda, ./kit gpu-check)");
  }
}

// Throws tp::Error when stage D cannot run this plan (see the contract).
template <DataParallelModel D>
void check_plan_fits_stage(const RunConfig& config) {
  check_device_fits_stage<D>(config.device);
  validate(config);
  constexpr Capabilities caps = D::capabilities;
  if (config.micro_batches > 1 && caps.syncs_in_backward && !caps.no_sync) {
    TP_THROW(Error, "tp::train: this stage syncs inside backward and has no no_sync(), so "
             "every micro-batch's backward would all-reduce; gradient accumulation "
             "(micro_batches = ", config.micro_batches, ") needs no_sync (stage 04 on)");
  }
  if (config.model_kind == ModelKind::Branchy && !caps.unused_parameters) {
    TP_THROW(Error, "tp::train: the BranchyMLP model leaves some parameters without a gradient "
             "in some steps, and this stage has no support for unused parameters "
             "(find_unused_parameters, stage 05); use another model");
  }
  if (uneven(config) && !caps.join) {
    TP_THROW(Error, "tp::train: the ranks have different numbers of batches, and this stage "
             "has no join(): the ranks that finish first would leave the others waiting in "
             "a collective; uneven inputs need Join (stage 07)");
  }
}

// The values of ddp's named parameters. A fully sharded stage's are
// gathered first (a collective: every rank calls it at the same point), all
// at once, which its training never does: so the memory peaks so far are
// folded into `peaks` and the counters' peaks reset after, leaving the
// gather out of RankResult::memory.
template <DataParallelModel D>
Snapshot snapshot_parameters(D& ddp, memory::Stats& peaks) {
  if constexpr (D::capabilities.fully_sharded) {
    peaks = memory::combine_spans(peaks, memory::stats());
    Snapshot values;
    {
      auto full = ddp.summon_full_params();
      values = snapshot(ddp.named_parameters());
    }
    memory::reset_peaks();
    return values;
  } else {
    return snapshot(ddp.named_parameters());
  }
}

// The pieces of train_rank that are not templates (ddp_trainer.cc).
// Starts rank `rank` of `config`: turns its trace on when the plan traces,
// makes its GPU current (kernels run on the thread's current GPU), seeds,
// resets the memory peaks (RankResult::memory: the whole run counts), then
// builds the plan's model on the CPU, exactly as the reference builds it,
// and moves it to the rank's device: the same numbers start on every
// device.
std::shared_ptr<nn::Module> start_rank(int rank, const RunConfig& config);
// Gives the group its collective budget for this plan and model: a loop
// that never stops issuing collectives ends there (Note [Collective
// budget] in process_group.cc).
void set_rank_collective_budget(distributed::ProcessGroup& group, const RunConfig& config,
                                const nn::Module& model);
// RankResult's construction counts: what the DDP's constructor issued.
void record_construction(RankResult& result, const distributed::CollectiveCounters& counters);
// RankResult's parameter identities (their TensorImpl addresses) and
// initial buffers.
void record_identities(RankResult& result, const std::vector<nn::NamedTensor>& parameters,
                       const nn::Module& model);
// After the loop: a rank with fewer steps (it joined) checked fewer step
// ends; it skips the rest, so that the next run on this group (a launched
// checker's next case) checks the same points on every rank.
void skip_missed_count_points(distributed::ProcessGroup& group, const RunConfig& config,
                              int rank);
// When the plan traced: turns the trace off and keeps its events, the
// GPU's own spans (device_trace.h) included, once its work has finished.
void collect_trace(const RunConfig& config, RankResult& result);

// The kit's SGD, or the stage's own (sharded) optimizer: make_optimizer,
// found by argument-dependent lookup.
template <DataParallelModel D>
auto make_rank_optimizer(D& ddp, const RunConfig& config, const run_options_t<D>& options) {
  const optim::SGDOptions sgd{config.lr, config.momentum};
  if constexpr (D::capabilities.sharded_optimizer) {
    return make_optimizer(ddp, sgd, options);
  } else {
    return std::make_unique<optim::SGD>(ddp.parameters(), sgd);
  }
}

// [snippet:rank-step]
// Micro-batch i of this rank: forward on its shard, mse loss, backward of
// loss / K. Records the loss and the parameters it leaves without a
// gradient.
template <DataParallelModel D>
void train_micro_batch(D& ddp, const data::SyntheticRegression& dataset, const RunConfig& config,
                       int rank, int64_t i, RankResult& result) {
  const bool on_gpu = config.device.type == DeviceType::CUDA;  // GPU spans in the trace
  data::Batch batch = micro_batch(dataset, config, rank, i);
  Tensor loss;
  {
    trace::Span span("forward", "compute", {{"micro", i}});
    trace::DeviceSpan gpu("gpu forward", cuda::current_stream(), "compute stream",
                          {{"micro", i}}, on_gpu);
    loss = mse_loss(ddp(batch.x), batch.y);
  }
  result.losses.push_back(loss.item());
  // The parameters this micro-batch leaves without a gradient (lesson 05).
  result.unreached_per_micro.push_back(unreached_parameters(loss, ddp.named_parameters()));
  trace::Span span("backward", "compute", {{"micro", i}});
  trace::DeviceSpan gpu("gpu backward", cuda::current_stream(), "compute stream",
                        {{"micro", i}}, on_gpu);
  // Accumulating K micro-batches averages their losses.
  const int64_t k_micro = config.micro_batches;
  (k_micro == 1 ? loss : mul(loss, 1.0 / static_cast<double>(k_micro))).backward();
}

// This rank's optimizer steps. Per step: zero_grad; its K micro-batches,
// all but the last under no_sync when the stage has it; sync_grads() when
// the stage syncs after backward; the optimizer's step; then the count
// check. Records what each micro-batch did, and the parameters after the
// first step.
template <DataParallelModel D, typename Optimizer>
void train_steps(D& ddp, Optimizer& optimizer, distributed::ProcessGroup& group,
                 const data::SyntheticRegression& dataset, const RunConfig& config, int rank,
                 RankResult& result, memory::Stats& peaks) {
  constexpr Capabilities caps = D::capabilities;
  const int64_t k_micro = config.micro_batches;
  for (int64_t step = 0; step < steps_of(config, rank); ++step) {
    trace::Span step_span("step", "train", {{"step", step}});
    optimizer.zero_grad(config.zero_grad_set_to_none);
    for (int64_t micro = 0; micro < k_micro; ++micro) {
      const int64_t i = step * k_micro + micro;
      group.reset_counters();
      if constexpr (caps.no_sync) {
        if (micro + 1 < k_micro) {
          auto no_sync = ddp.no_sync();  // this micro-batch only accumulates
          train_micro_batch(ddp, dataset, config, rank, i, result);
        } else {
          train_micro_batch(ddp, dataset, config, rank, i, result);
        }
      } else {
        train_micro_batch(ddp, dataset, config, rank, i, result);
      }
      if (micro + 1 == k_micro) {
        if constexpr (caps.syncs_after_backward) {
          trace::Span span("sync_grads", "ddp");
          ddp.sync_grads();
        }
        trace::Span span("optimizer", "compute");
        optimizer.step();
      }
      record_micro_batch(result, group.counters(), ddp.parameters());  // what it did
    }
    // Every rank has issued as many collectives as the others by now; one
    // that skipped a collective is named here, before its wrong sums go on.
    group.check_collective_count(detail::cat("the end of step ", step));
    if (step == 0) {
      result.after_first_step = snapshot_parameters(ddp, peaks);
      if (config.trace_first_step && !config.trace) trace::disable();  // (demo_command_line.cc)
    }
  }
}
// [/snippet:rank-step]

// One rank's training loop. Starts the rank (seed, model, device), wraps
// the model, registers the options' comm hook (comm_hooks), then runs the
// optimizer steps of train_steps, inside join() when the stage has it.
// Records losses, snapshots and collective counts.
template <DataParallelModel D>
RankResult train_rank(int rank, const RunConfig& config,
                      const std::shared_ptr<distributed::ProcessGroup>& group,
                      const run_options_t<D>& options) {
  check_plan_fits_stage<D>(config);
  constexpr Capabilities caps = D::capabilities;
  std::shared_ptr<nn::Module> model = start_rank(rank, config);
  set_rank_collective_budget(*group, config, *model);
  RankResult result;
  result.rank = rank;
  group->reset_counters();
  D ddp(model, group, static_cast<const typename D::Options&>(options));  // the DDP's part
  if constexpr (caps.comm_hooks) register_builtin_hook(ddp, options);
  record_construction(result, group->counters());
  // Every rank builds the whole model before a fully sharded stage shards
  // it (the kit has no meta-device construction), so for such a stage
  // RankResult::memory counts from after this snapshot: `construction`
  // takes the peaks before it, and is dropped.
  memory::Stats construction;
  result.initial_params = snapshot_parameters(ddp, construction);
  if constexpr (caps.buckets) result.initial_buckets = ddp.bucket_assignment();
  record_identities(result, ddp.named_parameters(), *model);

  const data::SyntheticRegression dataset(data_options(config));
  auto optimizer = make_rank_optimizer(ddp, config, options);
  memory::Stats peaks;  // fully sharded: the peaks before the last snapshot
  auto train_loop = [&] {
    train_steps(ddp, *optimizer, *group, dataset, config, rank, result, peaks);
  };
  if constexpr (caps.join && caps.sharded_optimizer) {
    join_with_optimizer(ddp, *optimizer, options, std::function<void()>(train_loop));
  } else if constexpr (caps.join) {
    ddp.join(std::function<void()>(train_loop));
  } else {
    train_loop();
  }
  skip_missed_count_points(*group, config, rank);
  // On a GPU the last step's collectives may still be finishing (an NCCL
  // wait() only orders streams): a failure among them is thrown here.
  group->synchronize();
  result.memory = memory::combine_spans(peaks, memory::stats());
  result.final_params = snapshot_parameters(ddp, peaks);
  result.final_buffers = snapshot(model->named_buffers());
  result.grad_storage = grad_storage_groups(ddp.parameters());
  if constexpr (caps.buckets) result.buckets = ddp.bucket_assignment();
  if constexpr (caps.sharded_optimizer) {
    result.shard_partition = optimizer->partition();
    result.params_with_state = optimizer->params_with_state();
  }
  collect_trace(config, result);
  return result;
}

// Runs config.world_size ranks of stage D and returns their results in rank
// order. Throws tp::multiprocessing::SpawnError if a rank fails or hangs, and
// tp::Error (before spawning) for a plan the stage cannot run.
template <DataParallelModel D>
std::vector<RankResult> run_ddp(const RunConfig& config,
                                const run_options_t<D>& options = {}) {
  check_plan_fits_stage<D>(config);
  TempDir rendezvous("tensorplay-rdzv");
  multiprocessing::SpawnOptions spawn_options;
  spawn_options.timeout = config.job_timeout;
  auto body = [&](int rank) -> std::string {
    std::shared_ptr<distributed::ProcessGroup> group =
        make_rank_group(config, rendezvous.path(), rank);
    return serialize(train_rank<D>(rank, config, group, options));
  };
  std::vector<std::string> payloads =
      multiprocessing::spawn(spawn_options, body, config.world_size);
  std::vector<RankResult> results;
  for (const std::string& payload : payloads) results.push_back(parse_rank_result(payload));
  return results;
}

// What one launched rank gets back: its rank, and every rank's result.
struct LaunchedRun {
  int rank = 0;
  std::vector<RankResult> ranks;
};

// What is wrong with asking `program` ("demo 03", "the checker") to run as one
// rank of a launched job with `init_method` (empty: not given), or "" when
// nothing is: RANK set without --init-method (every process would run a
// whole job of its own), or --init-method file:// (what the program does by
// itself when it forks its ranks). Reads RANK from the environment.
std::string launch_mistake(const std::string& program, const std::string& init_method);

// One rank of a job started by a launcher, one process per rank: joins the
// default group through `init_method` (env://, tcp://, redis://; RANK and
// WORLD_SIZE from the environment), trains this rank's part of the plan and
// gathers every rank's result. REQUIRES: config.world_size is the job's
// world size (throws tp::Error naming both when WORLD_SIZE differs).
template <DataParallelModel D>
LaunchedRun run_launched_rank(const RunConfig& config, const run_options_t<D>& options,
                              const std::string& init_method) {
  check_plan_fits_stage<D>(config);
  distributed::init_process_group(to_string(resolved_backend(config)), init_method,
                                  config.collective_timeout);
  struct Leave {  // the group goes, whatever happens
    ~Leave() { distributed::destroy_process_group(); }
  } leave;
  std::shared_ptr<distributed::ProcessGroup> group = distributed::default_group();
  if (group->size() != config.world_size) {
    TP_THROW(Error, "tp::train: the plan is for ", config.world_size, " ranks but the job "
             "launched ", group->size(), " (WORLD_SIZE); pass the same world size to both");
  }
  LaunchedRun run;
  run.rank = group->rank();
  const RankResult mine = train_rank<D>(run.rank, config, group, options);
  run.ranks = all_gather_results(*group, mine);
  return run;
}

}  // namespace tp::train
