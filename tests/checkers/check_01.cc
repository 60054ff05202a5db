// Checker for stage 01 (naive DDP). Compiled once and linked with every
// ddp.cc and worker.cc: solutions/01-naive (must pass), the generated
// exercise (must fail at once, naming the stub), each planted-bug mutant in
// tests/mutants/01-naive (must fail with the diagnosis the mutant names), and
// your exercises/01-naive (`./kit check 01`).
//
// It checks the lesson's two exercises: the DDP (ddp.cc) trained by the
// kit's trainer on the cases below, then its construction check on models
// that differ between ranks (scenarios), then the rank's worker (worker.cc)
// run as whole jobs.
// TP_STAGE_HEADER is set only for a planted bug that patches the header: its
// copy of stage.h, which includes the patched ddp.h.
#ifdef TP_STAGE_HEADER
#include TP_STAGE_HEADER
#else
#include "stage.h"
#endif

#include <functional>
#include <memory>

#include "tensorplay/error.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/train/checker.h"
#include "worker.h"

namespace {

namespace train = tp::train;
using Case = train::CheckCase<stage01::Options>;

std::vector<Case> cases() {
  std::vector<Case> out = train::cases_of<stage01::Options>(train::standard_configs());
  // A model with a buffer (running statistics updated in every forward):
  // with broadcast_buffers the constructor copies rank 0's buffers; without,
  // each rank keeps its own. Per-rank seeds make the two differ.
  train::RunConfig buffered;
  buffered.world_size = 3;
  buffered.steps = 4;
  buffered.per_rank_seed = true;
  buffered.model_kind = train::ModelKind::Buffered;
  buffered.buffer_sync = train::BufferSync::AtConstruction;
  out.push_back({buffered, {.broadcast_buffers = true}, "broadcast_buffers on"});
  buffered.buffer_sync = train::BufferSync::None;
  out.push_back({buffered, {.broadcast_buffers = false}, "broadcast_buffers off"});
  // Gradient accumulation: sync_grads() after the last of K backward passes
  // averages the accumulated sum, so the earlier ones need no collective.
  train::RunConfig accumulate;
  accumulate.world_size = 2;
  accumulate.steps = 3;
  accumulate.micro_batches = 3;
  accumulate.per_rank_seed = true;
  out.push_back({accumulate, {}, "gradient accumulation, sync_grads() once per step"});
  for (Case& c : out) c.config.trace = true;
  return out;
}

// Stage 01's shape of communication, counted on every rank, and its order on
// the trace.
std::vector<train::Finding> stage_checks(const Case& c, const train::CaseRun& run) {
  const uint64_t params = run.num_params();
  const uint64_t buffers = c.options.broadcast_buffers ? run.num_buffers() : 0;
  return train::first_findings({
      // the model check: parameter count, then every shape
      [&] {
        return train::check_construction_counts(
            run, params + buffers, 0,
            "broadcast each parameter (and, with broadcast_buffers, each buffer) from rank 0 "
            "exactly once",
            /*allgathers=*/2);
      },
      [&] {
        return train::check_allreduces_per_step(
            run, params, "one per parameter",
            "sync_grads must all-reduce each parameter's gradient once per step: no parameter "
            "skipped, none synced twice");
      },
      [&] {
        return train::check_quiet_until_last_micro_batch(
            run, "sync_grads() runs once per optimizer step, after the last backward");
      },
      [&] {
        return train::check_sync_between_backward_and_step(run, stage01::stage_spec().advice);
      },
  });
}

// Ranks that build different models: every rank must refuse to wrap its
// model with a tp::DistributedError that contains each of `must_say` (the
// first differing parameter and the rank, or both counts), never train on,
// never hang. `build(rank)` is the model rank `rank` builds.
train::Scenario mismatch(std::string label, int world_size,
                         std::function<std::shared_ptr<tp::nn::Module>(int rank)> build,
                         std::vector<std::string> must_say) {
  train::Scenario s;
  s.label = std::move(label);
  s.world_size = world_size;
  s.likely_cause =
      "the constructor's check must fail on every rank: all-gather every rank's parameter count, "
      "then every rank's shape rows, compare all of them with rank 0's on every rank, and throw "
      "tp::DistributedError naming the first differing parameter and the ranks (ddp.h)";
  s.run = [build, must_say](int rank, std::shared_ptr<tp::distributed::ProcessGroup> group) {
    const std::string who = "rank " + std::to_string(rank);
    try {
      stage01::DistributedDataParallel ddp(build(rank), group);
    } catch (const tp::NotImplemented&) {
      throw;  // still the stub: reported as such
    } catch (const tp::DistributedError& e) {
      const std::string message = e.what();
      if (e.kind() != tp::ErrorKind::Cause) {  // a timeout, or a peer that left
        return who + " did not report the mismatch itself but failed in a collective: " + message;
      }
      for (const std::string& phrase : must_say) {
        if (message.find(phrase) == std::string::npos) {
          return who + "'s error does not say \"" + phrase + "\": " + message;
        }
      }
      return std::string();
    } catch (const std::exception& e) {
      return who + " failed with another error than tp::DistributedError: " + e.what();
    }
    return who + " wrapped its model without an error, although the ranks' models differ";
  };
  return s;
}

std::vector<train::Scenario> scenarios() {
  std::vector<train::Scenario> out;
  out.push_back(mismatch("rank 2 builds narrower layers", 3, [](int rank) {
    tp::nn::MiniMLPOptions options;
    if (rank == 2) options.hidden = 8;
    return std::make_shared<tp::nn::MiniMLP>(options);
  }, {"fc1.weight", "rank 2"}));
  out.push_back(mismatch("rank 1 builds the same shapes in float64", 2, [](int rank) {
    tp::nn::MiniMLPOptions options;
    if (rank == 1) options.dtype = tp::kFloat64;
    return std::make_shared<tp::nn::MiniMLP>(options);
  }, {"fc1.weight", "float64"}));
  out.push_back(mismatch("rank 1 builds more layers", 2, [](int rank) {
    return tp::nn::deep_mlp(4, 8, rank == 1 ? 5 : 2, 1);  // 12 and 6 parameter tensors
  }, {"12", "6"}));
  return out;
}

// The rank's worker (worker.cc), run as whole jobs. Per-rank seeds: only
// DDP's broadcast makes the ranks agree. Buffers (BufferedMLP) that DDP
// leaves alone: only the plan's seed for each rank reproduces them, shared
// or per rank. And buffers DDP broadcasts from rank 0.
std::vector<Case> worker_cases() {
  std::vector<Case> out;
  train::RunConfig seeds;
  seeds.world_size = 2;
  seeds.steps = 4;
  seeds.per_rank_seed = true;
  out.push_back({seeds, {}, "only the broadcast makes the ranks agree"});
  train::RunConfig buffered;
  buffered.world_size = 3;
  buffered.steps = 4;
  buffered.momentum = 0.9;
  buffered.model_kind = train::ModelKind::Buffered;
  buffered.buffer_sync = train::BufferSync::None;
  out.push_back({buffered, {.broadcast_buffers = false}, "each rank's own buffers, shared seed"});
  buffered.world_size = 2;
  buffered.dtype = tp::kFloat64;
  buffered.per_rank_seed = true;
  out.push_back({buffered, {.broadcast_buffers = false}, "each rank's own buffers, per-rank seeds"});
  buffered.world_size = 3;
  buffered.dtype = tp::kFloat32;
  buffered.buffer_sync = train::BufferSync::AtConstruction;
  out.push_back({buffered, {.broadcast_buffers = true}, "rank 0's buffers everywhere"});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  train::CheckerSpec<stage01::Options> spec;
  spec.stage = stage01::stage_spec();
  spec.cases = cases();
  spec.stage_checks = stage_checks;
  spec.scenarios = scenarios();
  spec.worker = stage01::train_worker;
  spec.worker_cases = worker_cases();
  return train::run_checker<stage01::DistributedDataParallel>(argc, argv, spec);
}
