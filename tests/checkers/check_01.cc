// Checker for stage 01 (naive DDP). Compiled once and linked with every
// ddp.cc: solutions/01-naive (must pass), the generated exercise (must fail
// at once, naming the stub), each planted-bug mutant in tests/mutants/01-naive
// (must fail with the diagnosis the mutant names), and your exercises/01-naive
// (`./kit check 01`).
// TP_STAGE_HEADER is set only for a planted bug that patches the header.
#ifdef TP_STAGE_HEADER
#include TP_STAGE_HEADER
#else
#include "ddp.h"
#endif

#include "tensorplay/train/checker.h"

namespace {

namespace train = tp::train;
using Case = train::CheckCase<stage01::Options>;

// Stage 01's words for its own parts (see tp::train::Advice).
train::Advice advice() {
  train::Advice a;
  a.where_sync = "in sync_grads()";
  a.how_sync_runs = "by sync_grads() after loss.backward(), on every rank";
  return a;
}

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
  std::vector<train::Finding> out = train::check_construction_counts(
      run, params + buffers, 0,
      "broadcast each parameter (and, with broadcast_buffers, each buffer) from rank 0 exactly "
      "once",
      /*allgathers=*/2);  // the model check: parameter count, then every shape
  if (out.empty()) {
    out = train::check_allreduces_per_step(
        run, params, "one per parameter",
        "sync_grads must all-reduce each parameter's gradient once per step: no parameter "
        "skipped, none synced twice");
  }
  if (out.empty()) {
    out = train::check_quiet_until_last_micro_batch(
        run, "sync_grads() runs once per optimizer step, after the last backward");
  }
  if (out.empty()) out = train::check_sync_between_backward_and_step(run, advice());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  train::CheckerSpec<stage01::Options> spec;
  spec.stage = "01";
  spec.title = "naive DDP, one all-reduce per parameter";
  spec.cases = cases();
  spec.advice = advice();
  spec.stage_checks = stage_checks;
  return train::run_checker<stage01::DistributedDataParallel>(argc, argv, spec);
}
