// Checker for stage 03 (DDP overlapping communication with backward).
// Compiled once and linked with every ddp.cc: solutions/03-overlap (must
// pass), the generated exercise (must fail at once, naming the stub), each
// planted-bug mutant in tests/mutants/03-overlap (must fail with the
// diagnosis the mutant names), and your exercises/03-overlap
// (`./kit check 03`).
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
using Options = stage03::Options;
using Case = train::CheckCase<Options>;

// As in stage 02's checker: MiniMLP float32 in reverse registration order is
// 16, 512 | 128, 4096 | 128, 2048 bytes.
const Options kOneBucket{};
const Options kSeveral{.bucket_cap_mb = 2000.0 / (1 << 20), .first_bucket_cap_mb = 500.0 / (1 << 20)};
const Options kPerParameter{.bucket_cap_mb = 1e-9, .first_bucket_cap_mb = 1e-9};

Options as_view(Options options) {
  options.gradient_as_bucket_view = true;
  return options;
}

std::vector<Case> cases() {
  std::vector<Case> out = train::cases_of(train::standard_configs(), kSeveral, "3 buckets");
  train::RunConfig small;
  small.world_size = 3;
  small.steps = 4;
  small.per_rank_seed = true;
  out.push_back({small, kOneBucket, "one bucket"});
  out.push_back({small, kPerParameter, "one bucket per parameter"});
  out.push_back({small, as_view(kSeveral), "3 buckets, gradient_as_bucket_view"});
  train::RunConfig momentum = small;
  momentum.world_size = 2;
  momentum.momentum = 0.9;
  out.push_back({momentum, as_view(kPerParameter),
                 "one bucket per parameter, gradient_as_bucket_view, momentum"});
  // Many tensors per bucket: 18 parameter tensors of 4 KiB and less, 8 KiB
  // buckets (a 2 KiB first one).
  train::RunConfig deep = small;
  deep.model_kind = train::ModelKind::Deep;
  deep.deep_depth = 8;
  out.push_back({deep, {.bucket_cap_mb = 8.0 / 1024, .first_bucket_cap_mb = 2.0 / 1024},
                 "deep model, several tensors per bucket"});
  train::RunConfig buffered = small;
  buffered.model_kind = train::ModelKind::Buffered;
  out.push_back({buffered, kSeveral, "buffered model, 3 buckets"});
  // Registered fc2, fc1, fc3 but used fc1, fc2, fc3: with a bucket per
  // parameter, fc2's buckets (4, 5) complete before fc1's (2, 3), and must
  // still be launched after them.
  train::RunConfig reordered = small;
  reordered.model_kind = train::ModelKind::Reordered;
  out.push_back({reordered, kPerParameter, "reordered model: buckets complete out of order"});
  // Two dtypes (MixedMLP: fc2 float64), as in stage 02's checker: float32's
  // bucket [5, 4, 1, 0] and float64's [3, 2]; as views, too. (float64's
  // completes first and must still wait for float32's: after the reordered
  // case, which names that bug on a model of one dtype.)
  train::RunConfig mixed = small;
  mixed.model_kind = train::ModelKind::Mixed;
  out.push_back({mixed, kOneBucket, "mixed dtypes (fc2 float64): one bucket per dtype"});
  out.push_back({mixed, as_view(kOneBucket), "mixed dtypes, gradient_as_bucket_view"});
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
            "once it holds at least its cap (Note [Bucket assignment])");
      },
      [&] {
        return train::check_allreduces_per_step(
            run, buckets.size(), "one per bucket",
            "launch each bucket's all-reduce exactly once per backward, when its last gradient "
            "arrives");
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
            "order their gradients complete in, so every rank issues the same all-reduces in the "
            "same order (Note [Overlap])");
      },
      [&] {
        return train::check_overlap(
            run, buckets,
            "launch a bucket's all-reduce from the hook that completes it, while backward is still "
            "running; the end-of-backward callback only waits (Note [Overlap])",
            "wait for every bucket in the end-of-backward callback before backward returns");
      },
      [&] {
        return train::check_launched_before_first_wait(
            run,
            "never wait inside a hook: launch, return, and wait only in the end-of-backward "
            "callback; waiting in the hook makes backward stop for every bucket");
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
                  "gradient arrives (param.set_grad(slot)); the average then lands in .grad with "
                  "no "
                  "copy back"
                : "without gradient_as_bucket_view, .grad stays the parameter's own tensor: copy "
                  "the "
                  "average back into it, do not point it at the bucket");
      },
      [&] {
        return train::check_grad_copies(
            run, c.options.gradient_as_bucket_view
                     ? "with gradient_as_bucket_view the average lands in .grad itself: skip the "
                       "copy back (copying a slot into the .grad that is that slot copies it onto "
                       "itself)"
                     : "copy each gradient into its slot once in the hook and back into .grad once "
                       "after the wait");
      },
  });
}

}  // namespace

int main(int argc, char** argv) {
  train::CheckerSpec<Options> spec;
  spec.stage = stage03::stage_spec();
  spec.cases = cases();
  spec.stage_checks = stage_checks;
  return train::run_checker<stage03::DistributedDataParallel>(argc, argv, spec);
}
