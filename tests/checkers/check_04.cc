// Checker for stage 04 (overlapping DDP with no_sync: gradient accumulation).
// Compiled once and linked with every ddp.cc: solutions/04-no-sync (must
// pass), the generated exercise (must fail at once, naming the stub), each
// planted-bug mutant in tests/mutants/04-no-sync (must fail with the
// diagnosis the mutant names), and your exercises/04-no-sync
// (`./kit check 04`).
// TP_STAGE_HEADER is set only for a planted bug that patches the header: its
// copy of stage.h, which includes the patched ddp.h.
#ifdef TP_STAGE_HEADER
#include TP_STAGE_HEADER
#else
#include "stage.h"
#endif

#include "no_sync_scenarios.h"
#include "tensorplay/train/checker.h"

namespace {

namespace train = tp::train;
using DDP = stage04::DistributedDataParallel;
using Options = stage04::Options;
using Case = train::CheckCase<Options>;

// As in stage 03's checker: MiniMLP float32 in reverse registration order is
// 16, 512 | 128, 4096 | 128, 2048 bytes.
const Options kOneBucket{};
const Options kSeveral{.bucket_cap_mb = 2000.0 / (1 << 20), .first_bucket_cap_mb = 500.0 / (1 << 20)};
const Options kPerParameter{.bucket_cap_mb = 1e-9, .first_bucket_cap_mb = 1e-9};

Options as_view(Options options) {
  options.gradient_as_bucket_view = true;
  return options;
}

train::RunConfig accumulating(train::RunConfig config, int64_t k) {
  config.micro_batches = k;
  return config;
}

std::vector<Case> cases() {
  // The standard sweep, each step made of 2 micro-batches (the first under
  // no_sync), then K = 1 (no_sync never used: stage 03's behaviour) and 4.
  std::vector<Case> out;
  for (const train::RunConfig& c : train::standard_configs()) {
    out.push_back({accumulating(c, 2), kSeveral, "3 buckets, K = 2 micro-batches"});
  }
  train::RunConfig small;
  small.world_size = 3;
  small.steps = 3;
  small.per_rank_seed = true;
  out.push_back({accumulating(small, 1), kSeveral, "3 buckets, K = 1 (no accumulation)"});
  out.push_back({accumulating(small, 4), kOneBucket, "one bucket, K = 4"});
  out.push_back({accumulating(small, 4), kPerParameter, "one bucket per parameter, K = 4"});
  train::RunConfig momentum = accumulating(small, 3);
  momentum.world_size = 2;
  momentum.momentum = 0.9;
  out.push_back({momentum, as_view(kSeveral), "3 buckets, gradient_as_bucket_view, K = 3, "
                                              "momentum"});
  // zero_grad() in place keeps each .grad a view of its bucket slot, so the
  // micro-batches under no_sync accumulate into the bucket itself.
  train::RunConfig in_place = accumulating(small, 2);
  in_place.zero_grad_set_to_none = false;
  out.push_back({in_place, as_view(kPerParameter),
                 "one bucket per parameter, gradient_as_bucket_view, K = 2, zero_grad in place"});
  train::RunConfig deep = accumulating(small, 2);
  deep.model_kind = train::ModelKind::Deep;
  deep.deep_depth = 8;
  out.push_back({deep, {.bucket_cap_mb = 8.0 / 1024, .first_bucket_cap_mb = 2.0 / 1024},
                 "deep model, several tensors per bucket, K = 2"});
  train::RunConfig buffered = accumulating(small, 2);
  buffered.model_kind = train::ModelKind::Buffered;
  out.push_back({buffered, kSeveral, "buffered model, 3 buckets, K = 2"});
  for (Case& c : out) c.config.trace = true;
  return out;
}

// A synced micro-batch that all-reduced nothing at all: the hooks never
// launched, which is what they must do when the forward recorded "do not
// sync". With accumulation a guard was alive just before, so the finding
// names the recorded flag and the guard first, then the hooks.
std::vector<train::Finding> check_synced_step_communicated(const train::CaseRun& run,
                                                           size_t buckets) {
  const int64_t k = run.config.micro_batches;
  if (k == 1) return {};
  for (const train::RankResult& r : run.ranks) {
    for (int64_t i = k - 1; i < train::micro_batches_of(run.config, r.rank); i += k) {
      const auto at = static_cast<size_t>(i);
      if (at >= r.allreduces_per_micro.size() || r.allreduces_per_micro[at] != 0) continue;
      return {{tp::detail::cat("rank ", r.rank, ", step ", i / k, " (micro-batch ", i,
                               "): counted 0 all-reduces in the step's last micro-batch, run "
                               "after the no_sync guard of the ones before it was destroyed; "
                               "expected ", buckets, " (one per bucket)"),
               "the whole backward stayed quiet, as a backward whose forward recorded \"do not "
               "sync\" must: does the no_sync guard restore, when destroyed, "
               "require_backward_grad_sync_ as it found it (read before the guard changes it), "
               "and does forward() record the flag as it is now (Note [Decided at forward])? If "
               "the flag was right, the hooks of a synced backward launched nothing"}};
    }
  }
  return {};
}

std::vector<train::Finding> stage_checks(const Case& c, const train::CaseRun& run) {
  const auto buckets =
      train::expected_buckets(run, c.options.bucket_cap_mb, c.options.first_bucket_cap_mb);
  const uint64_t buffers = c.options.broadcast_buffers ? run.num_buffers() : 0;
  const int64_t k = c.config.micro_batches;
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
            "once it holds at least its cap (Note [Bucket assignment])");
      },
      [&] {
        return train::check_quiet_until_last_micro_batch(
            run,
            "a micro-batch whose forward ran under no_sync must not communicate, neither in "
            "its forward nor in its hooks, which leave the gradient in .grad and return (Note "
            "[Decided at forward])");
      },
      [&] { return check_synced_step_communicated(run, buckets.size()); },
      [&] {
        return train::check_counts_per_micro(
            run, train::Collective::AllReduce,
            [&](int64_t, int64_t micro) { return micro + 1 == k ? buckets.size() : 0; },
            "one per bucket in the step's last micro-batch, none in the others",
            "launch each bucket's all-reduce exactly once per synced backward, when its last "
            "gradient arrives, and none in a backward whose forward ran under no_sync");
      },
      [&] {
        return train::check_allreduce_sizes(
            run, [&](int64_t) { return train::bucket_bytes(run.reference.final_params, buckets); },
            tp::detail::cat("the ", buckets.size(), " buckets' parameters"),
            "all-reduce each bucket's flat tensor, which holds exactly its parameters' elements, "
            "and nothing else");
      },
      [&] {
        return train::check_launch_order(
            run, buckets,
            "launch the buckets strictly in index order (bucket b only after 0 .. b-1), whatever "
            "order their gradients complete in (Note [Overlap])");
      },
      [&] {
        return train::check_overlap(
            run, buckets,
            "launch a bucket's all-reduce from the hook that completes it, while the synced "
            "backward is still running; the end-of-backward callback only waits (Note [Overlap])",
            "wait for every bucket in the end-of-backward callback before backward returns");
      },
      [&] {
        return train::check_launched_before_first_wait(
            run,
            "never wait inside a hook: launch, return, and wait only in the end-of-backward "
            "callback");
      },
      [&] {
        return train::check_synced_when_backward_returns(
            run,
            "wait for every bucket in the end-of-backward callback, so that .grad is final "
            "when loss.backward() returns");
      },
      [&] {
        return train::check_grad_storage(
            run, buckets, c.options.gradient_as_bucket_view,
            c.options.gradient_as_bucket_view
                ? "with gradient_as_bucket_view, point each .grad at its bucket slot when its "
                  "gradient arrives in a synced backward (param.set_grad(slot))"
                : "without gradient_as_bucket_view, .grad stays the parameter's own tensor: copy "
                  "the "
                  "average back into it, do not point it at the bucket");
      },
  });
}

}  // namespace

int main(int argc, char** argv) {
  train::CheckerSpec<Options> spec;
  spec.stage = stage04::stage_spec();
  spec.cases = cases();
  spec.stage_checks = stage_checks;
  spec.scenarios = no_sync_scenarios::all<DDP>();
  return train::run_checker<DDP>(argc, argv, spec);
}
