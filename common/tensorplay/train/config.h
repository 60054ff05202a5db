// The training plan: what one run is, walked the same way by the reference
// trainer and by every DDP rank.
//
// Contract:
//   - A RunConfig fixes the model, the data, the optimizer, the world size,
//     the seeds and the schedule. The reference trainer and every DDP stage
//     read the same RunConfig, so a checker can run both and compare them
//     number for number.
//   - The schedule is counted in micro-batches. Rank r runs
//     micro_batches_of(config, r) of them, numbered i = 0, 1, ...; micro-batch
//     i belongs to optimizer step i / K and is micro-step i % K of it, where
//     K = config.micro_batches (gradient accumulation: K backward passes, one
//     optimizer step). Its rows come from the data set's shard i (see
//     data.h), so accumulation and uneven inputs never change which rows a
//     (rank, i) sees.
//   - Uneven inputs (batches_per_rank set): rank r takes part in optimizer
//     steps 0 .. micro_batches_of(r) / K - 1 and is "joined" after that.
//     Every count must be a multiple of K; 0 is allowed (a rank with no
//     batch at all joins at once), as long as some rank trains.
//   - The averaged gradient of step s is the sum over the ranks taking part
//     in it of their accumulated micro-batch gradients, divided by
//     divisor_at(config, s): the initial world size, or the number of ranks
//     still taking part (Divisor).
//   - Each micro-batch's backward runs on loss / K (gradient accumulation
//     averages the K micro-batch losses), so the step's gradient does not
//     grow with K.
//   - validate() throws tp::Error naming the field for a plan that cannot
//     run; everything that takes a RunConfig calls it first.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/data.h"
#include "tensorplay/nn/models.h"

namespace tp::train {

// Which model the plan trains (all from tensorplay/nn/models.h).
enum class ModelKind {
  MiniMLP,   // three Linear layers, six parameters: every parameter gets a gradient
  Branchy,   // BranchyMLP: the route depends on the data, so some parameters get no
             // gradient on some (step, rank), and `spare` gets none ever
  Buffered,  // BufferedMLP: a RunningMean buffer, updated in every training forward
  Reordered, // ReorderedMLP: registration order differs from the order of use, so
             // gradients become ready out of reverse registration order
  Deep,      // deep_mlp(in, hidden, deep_depth, out): many parameter tensors, for
             // buckets holding several tensors and for overlap you can see
  Mixed,     // MixedMLP: MiniMLP with fc2 in the other dtype (float64 in a float32
             // plan), so buckets must be one per dtype
};
std::string to_string(ModelKind kind);

// What the step's summed gradient is divided by.
enum class Divisor {
  InitialWorldSize,  // always W (PyTorch Join's divide_by_initial_world_size = True)
  ActiveRanks,       // the ranks still taking part in this step
};

// The collective backend of every DDP rank's process group.
enum class Backend {
  Auto,  // Gloo on the CPU; on CUDA, NCCL when the kit has it and every rank has
         // a GPU of its own, else Gloo
  Gloo,  // Gloo; CUDA tensors are staged through pinned host memory, so several
         // ranks may share one GPU
  NCCL,  // NCCL: CUDA tensors only, one GPU per rank
};
std::string to_string(Backend backend);  // "auto", "gloo", "nccl"

// When rank 0's buffers are copied to every rank (DDP's broadcast_buffers).
enum class BufferSync {
  None,            // never: each rank's buffers start from its own seed and evolve alone
  AtConstruction,  // once, when DDP is constructed (stage 01)
  // Before the first forward of every optimizer step, as PyTorch DDP does
  // with broadcast_buffers: it syncs buffers before a forward that follows a
  // syncing backward (or is the first), so under no_sync only the first of a
  // step's K micro-batches does.
  EveryStep,
};

struct RunConfig {
  int world_size = 4;
  int64_t steps = 8;       // optimizer steps (of the longest rank, with uneven inputs)
  int64_t batch_size = 8;  // rows per micro-batch
  int64_t micro_batches = 1;  // K: micro-batches (backward passes) per optimizer step
  // Empty: every rank runs steps * K micro-batches. Otherwise one count per
  // rank (uneven inputs; each a multiple of K, 0 allowed), and `steps` is
  // ignored: the plan has max(count) / K steps.
  std::vector<int64_t> batches_per_rank;
  Divisor divisor = Divisor::InitialWorldSize;
  double lr = 0.05;
  double momentum = 0.0;
  // How the DDP ranks' optimizer clears gradients before each step:
  // optimizer.zero_grad(set_to_none). true (the default) drops every .grad,
  // so the first micro-batch's gradient is a fresh tensor; false zeroes them
  // in place, so a .grad that is a view of a DDP bucket stays that view. The
  // numbers are the same either way; the reference does not care.
  bool zero_grad_set_to_none = true;
  Dtype dtype = kFloat32;  // of the model and the data
  // Where every DDP rank trains: the CPU, or CUDA (rank r on GPU r % the
  // number of GPUs). The reference trainer always runs on the CPU, and a
  // rank's results come back as CPU values, so the comparison is the same.
  Device device = kCPU;
  Backend backend = Backend::Auto;
  ModelKind model_kind = ModelKind::MiniMLP;
  BufferSync buffer_sync = BufferSync::AtConstruction;
  // Rank 0 seeds the global generator with model_seed before building the
  // model; the reference trainer does the same, so it starts from rank 0's
  // parameters.
  uint64_t model_seed = 1234;
  // Test the broadcast: rank r seeds with model_seed + r * 7919, so ranks
  // build different models and only DDP's broadcast from rank 0 makes them
  // agree (and agree with the reference).
  bool per_rank_seed = false;
  // Record a tp::trace timeline on every rank (forward, backward, sync,
  // collectives) and return it in RankResult::events.
  bool trace = false;
  // Without `trace`: record step 0 only (the demo lists the all-reduces it
  // launched, in order, from these events), a bounded cost however many
  // steps the plan has.
  bool trace_first_step = false;
  nn::MiniMLPOptions model;  // sizes of every model kind (hidden is the deep model's width)
  int64_t deep_depth = 16;   // hidden layers of ModelKind::Deep: 2 * (depth + 1) tensors
  data::SyntheticRegressionOptions data;
  // Deadline of one collective (a skipped collective becomes an error naming
  // the rank and the collective), and the longest time a job may go without
  // any rank making progress (SpawnOptions::timeout: a long run is fine, a
  // stuck one is not). The kit's collectives move a few kilobytes and take
  // milliseconds even on a loaded 2-core machine, so 10 s only ever expires
  // on a real hang.
  std::chrono::milliseconds collective_timeout{10000};
  std::chrono::milliseconds job_timeout{120000};
  // Checker mode: each rank's process group makes a tensor written while its
  // all-reduce or broadcast is in flight an error at wait(), and a second
  // collective on its memory before that wait() an error at issue, on every
  // run (GlooOptions::check_in_flight_writes). run_checker turns it on; the
  // demo leaves it off.
  bool check_in_flight_writes = false;
};

// Throws tp::Error naming the first field that makes the plan unrunnable.
void validate(const RunConfig& config);

// ---- the schedule -------------------------------------------------------------
// Micro-batches rank `rank` runs.
int64_t micro_batches_of(const RunConfig& config, int rank);
// Optimizer steps of the whole plan (of its longest rank).
int64_t total_steps(const RunConfig& config);
// Optimizer steps rank `rank` takes part in.
int64_t steps_of(const RunConfig& config, int rank);
// The most collectives one rank of this plan may issue in its life
// (ProcessGroup::set_collective_budget), for a model of `tensors` parameter
// and buffer tensors: 16 + 4 x tensors for each micro-batch of the longest
// rank, and as many again twice, for the construction and for what follows
// the last step (join's final rounds, the results' exchange). A correct DDP
// issues at most one collective per tensor in a micro-batch (stage 01's
// per-parameter all-reduce; a bucket holds one or more), plus a handful
// (join's notify, the used-map, a rebuild's broadcast, PowerSGD's three per
// bucket): the budget is four times that, and small enough that a loop
// which never ends reaches it within a second.
uint64_t collective_budget(const RunConfig& config, size_t tensors);
// Where that budget comes from, in words, for the error that reports it.
std::string budget_reason(const RunConfig& config, size_t tensors);
// True when some rank runs fewer micro-batches than another.
bool uneven(const RunConfig& config);
// Ranks taking part in step `step`.
int active_ranks(const RunConfig& config, int64_t step);
// What step `step`'s summed gradient is divided by (see Divisor).
int divisor_at(const RunConfig& config, int64_t step);

// ---- what each rank builds ------------------------------------------------
// The backend the ranks use: `backend` with Auto resolved (see Backend).
Backend resolved_backend(const RunConfig& config);
// The device rank `rank` trains on: config.device, with a CUDA index
// rank % device count, or, in a rank a launcher started, its local rank %
// device count (distributed::local_rank_from_environment).
Device device_for_rank(const RunConfig& config, int rank);
// The seed rank `rank` uses before building its model.
uint64_t model_seed_for_rank(const RunConfig& config, int rank);
// The model of the plan, built from the global generator (seed it first).
std::shared_ptr<nn::Module> make_model(const RunConfig& config);
// model and data options with config.dtype applied.
nn::MiniMLPOptions model_options(const RunConfig& config);
data::SyntheticRegressionOptions data_options(const RunConfig& config);
// Rank `rank`'s micro-batch i (rows of data shard i, see data.h).
data::Batch micro_batch(const data::SyntheticRegression& dataset, const RunConfig& config,
                        int rank, int64_t i);

// "W=4 steps=8 batch=8 lr=0.05 float32 per-rank seeds", for messages; the
// knobs left at their defaults are not named.
std::string describe(const RunConfig& config);

}  // namespace tp::train
