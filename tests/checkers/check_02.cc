// Checker for stage 02 (bucketed DDP). Compiled once and linked with every
// ddp.cc: solutions/02-bucketing (must pass), the generated exercise (must
// fail at once, naming the stub), each planted-bug mutant in
// tests/mutants/02-bucketing (must fail with the diagnosis the mutant names),
// and your exercises/02-bucketing (`./kit check 02`).
// TP_STAGE_HEADER is set only for a planted bug that patches the header: its
// copy of stage.h, which includes the patched ddp.h.
#ifdef TP_STAGE_HEADER
#include TP_STAGE_HEADER
#else
#include "stage.h"
#endif

#include "tensorplay/train/checker.h"

namespace {

namespace train = tp::train;
using Options = stage02::Options;
using Case = train::CheckCase<Options>;

// MiniMLP's parameters in reverse registration order, float32 (float64:
// twice): fc3.bias 16 B, fc3.weight 512 B, fc2.bias 128 B, fc2.weight
// 4096 B, fc1.bias 128 B, fc1.weight 2048 B.
const Options kOneBucket{};  // the defaults, 1 and 25 MiB: everything in one
// First cap 500 B: {fc3.bias, fc3.weight}; then 2000 B: {fc2.bias,
// fc2.weight} (overshoots by fc2.weight) and {fc1.bias, fc1.weight}.
const Options kSeveral{.bucket_cap_mb = 2000.0 / (1 << 20), .first_bucket_cap_mb = 500.0 / (1 << 20)};
const Options kPerParameter{.bucket_cap_mb = 1e-9, .first_bucket_cap_mb = 1e-9};
// Caps on the rule's edges (float32). The first, 528 B, is exactly what
// {fc3.bias, fc3.weight} hold, so "at least the cap" closes it there and
// "more than the cap" takes fc2.bias too. The other, 4300 B, is passed by
// {fc2.bias, fc2.weight, fc1.bias} (4352 B) but not by the first two (4224
// B); read as MB instead of MiB it is 4100 B, which closes a parameter early.
const Options kOnTheEdge{.bucket_cap_mb = 4300.0 / (1 << 20), .first_bucket_cap_mb = 528.0 / (1 << 20)};

std::vector<Case> cases() {
  std::vector<Case> out = train::cases_of(train::standard_configs(), kSeveral, "3 buckets");
  train::RunConfig small;
  small.world_size = 3;
  small.steps = 4;
  small.per_rank_seed = true;
  out.push_back({small, kOneBucket, "one bucket"});
  out.push_back({small, kPerParameter, "one bucket per parameter"});
  out.push_back({small, kOnTheEdge, "caps on the rule's edges (528 B, 4300 B)"});
  // Many tensors per bucket: 18 parameter tensors of 4 KiB and less, 8 KiB
  // buckets (a 2 KiB first one).
  train::RunConfig deep = small;
  deep.model_kind = train::ModelKind::Deep;
  deep.deep_depth = 8;
  out.push_back({deep, {.bucket_cap_mb = 8.0 / 1024, .first_bucket_cap_mb = 2.0 / 1024},
                 "deep model, several tensors per bucket"});
  // Two dtypes (MixedMLP: fc2 in float64), in reverse registration order
  // fc3.bias 16 B, fc3.weight 512 B (float32) | fc2.bias 256 B, fc2.weight
  // 8192 B (float64) | fc1.bias 128 B, fc1.weight 2048 B (float32). One
  // bucket per dtype, never one for both: with the default caps, float32's
  // [5, 4, 1, 0] and float64's [3, 2]. Each dtype's first bucket gets the
  // first cap: with 200 B and then 10000 B, float32 closes [5, 4] at 528 B
  // and float64 [3] at 256 B; [1, 0] and [2] stay open to the end.
  train::RunConfig mixed = small;
  mixed.model_kind = train::ModelKind::Mixed;
  out.push_back({mixed, kOneBucket, "mixed dtypes (fc2 float64): one bucket per dtype"});
  out.push_back({mixed, {.bucket_cap_mb = 10000.0 / (1 << 20), .first_bucket_cap_mb = 200.0 / (1 << 20)},
                 "mixed dtypes: each dtype's first bucket gets the first cap (200 B, 10000 B)"});
  train::RunConfig buffered = small;
  buffered.model_kind = train::ModelKind::Buffered;
  out.push_back({buffered, kSeveral, "buffered model, 3 buckets"});
  buffered.buffer_sync = train::BufferSync::None;
  out.push_back({buffered, {.broadcast_buffers = false, .bucket_cap_mb = kSeveral.bucket_cap_mb,
                            .first_bucket_cap_mb = kSeveral.first_bucket_cap_mb},
                 "buffered model, broadcast_buffers off"});
  // Parameters without a gradient on some ranks and steps (the branch not
  // taken) and on all (spare): they must contribute zeros, never what their
  // slot held last step. Momentum 0: stage 02 leaves a zero gradient where
  // the reference has none, which SGD only ignores without momentum.
  train::RunConfig branchy = small;
  branchy.world_size = 4;
  branchy.steps = 6;
  branchy.model_kind = train::ModelKind::Branchy;
  out.push_back({branchy, kSeveral, "branchy model: parameters without a gradient"});
  train::RunConfig accumulate = small;
  accumulate.world_size = 2;
  accumulate.micro_batches = 3;
  out.push_back({accumulate, kSeveral, "gradient accumulation, sync_grads() once per step"});
  for (Case& c : out) c.config.trace = true;
  return out;
}

std::vector<train::Finding> stage_checks(const Case& c, const train::CaseRun& run) {
  const auto buckets =
      train::expected_buckets(run, c.options.bucket_cap_mb, c.options.first_bucket_cap_mb);
  const uint64_t buffers = c.options.broadcast_buffers ? run.num_buffers() : 0;
  return train::first_findings({
      // the model check: parameter count, then every shape
      [&] {
        return train::check_construction_counts(
            run, run.num_params() + buffers, 0,
            "broadcast each parameter (and, with broadcast_buffers, each buffer) from rank 0 "
            "exactly once",
            /*allgathers=*/2);
      },
      [&] {
        return train::check_buckets(
            run, buckets,
            "walk the parameters from the last to the first and close a bucket "
            "once it holds at least its cap (first_bucket_cap_mb for the "
            "first bucket of each dtype, bucket_cap_mb after), Note [Bucket "
            "assignment]");
      },
      [&] {
        return train::check_allreduces_per_step(run, buckets.size(), "one per bucket",
                                                "sync_grads must all-reduce each bucket's flat "
                                                "tensor once per step: no bucket skipped, "
                                                "none twice, no per-parameter all-reduce");
      },
      [&] {
        return train::check_allreduce_sizes(
            run, [&](int64_t) { return train::bucket_bytes(run.reference.final_params, buckets); },
            tp::detail::cat("the ", buckets.size(), " buckets' parameters"),
            "all-reduce each bucket's flat tensor, which holds exactly its parameters' elements, "
            "and nothing else");
      },
      [&] {
        return train::check_quiet_until_last_micro_batch(
            run, "sync_grads() runs once per optimizer step, after the last backward");
      },
      [&] {
        return train::check_sync_between_backward_and_step(run, stage02::stage_spec().advice);
      },
      [&] {
        return train::check_launched_before_first_wait(
            run,
            "launch every bucket's all-reduce first, then wait for them: waiting after each "
            "launch makes the buckets run one at a time");
      },
  });
}

}  // namespace

int main(int argc, char** argv) {
  train::CheckerSpec<Options> spec;
  spec.stage = stage02::stage_spec();
  spec.cases = cases();
  spec.stage_checks = stage_checks;
  return train::run_checker<stage02::DistributedDataParallel>(argc, argv, spec);
}
