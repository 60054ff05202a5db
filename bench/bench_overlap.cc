// Stage 03's overlap beside what it overlaps, interleaved: the round that
// bench/link_rounds.py --program overlap runs on a shaped link, with
// PyTorch's DistributedDataParallel beside it (torch_rounds.py --round
// overlap), three runs per link, so that "stage 03 against PyTorch's DDP"
// is a median with a spread rather than one run of each.
//
// What it measures, on the step benchmarks' deep model (tp::bench::deep_model:
// 130 parameter tensors, 4.2 MB of float32 gradients) and 64 rows per rank
// (--batch=N; link_rounds.py --program overlap --batch 256 is link.md's
// setting), one step being zero_grad, forward, loss, backward and an SGD
// step:
//   BM_StepOverlap/setup:S   the step with set-up S, one of
//                            overlap (stage 03 at PyTorch's default caps:
//                            a first bucket of 1 MiB, then 25 MiB: two
//                            buckets for this model),
//                            after_backward (stage 02 at the same caps: the same
//                            buckets all-reduced after backward, nothing
//                            overlapped),
//                            overlap_512k (stage 03 with both caps 512 KiB:
//                            8 buckets, the cap bench_step's --cap-sweep
//                            found best at 1 Gbit/s), and
//                            no_ddp (the model alone: the step's compute).
//   BM_OverlapRound          the four steps interleaved, one of each per
//                            iteration, in an order rotated every
//                            iteration: "<S>_ms", each one's median step,
//                            and "<S>_over_overlap", the median over the
//                            iterations of its step over stage 03's at the
//                            default caps in the same iteration.
// Counters of BM_StepOverlap: "p50_ms", "p90_ms", and "bwd_ms" (backward,
// which in stage 03 includes the wait for the last buckets; stage 02's
// all-reduces come after it).
//
// What it is for: stage 03 hides the all-reduces of the buckets that
// complete during backward. At the default caps this model's second bucket
// (3.11 MB) completes only when backward does, so at most the first bucket
// (1 MiB) runs under backward, whatever the link; smaller caps let more run
// under it, at a cost per bucket. PyTorch's DDP has the same default caps,
// so at the defaults the two can differ only in how fast each all-reduce
// and each backward runs.
//
// Run: build/bench/bench_overlap [--world-size=N] [--batch=N]
// [--benchmark_filter=...]. Not in ./kit bench's loopback set: on loopback
// bench_step's BM_OverlapPair says the same; the link is where it matters.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "02-bucketing/stage.h"
#include "03-overlap/stage.h"
#include "tensorplay/data.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/nn/module.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "ranked_benchmark.h"

namespace {

namespace dist = tp::distributed;
using Clock = std::chrono::steady_clock;
using tp::bench::ms_since;

// One set-up, as its label names it.
struct Setup {
  enum class Kind { Stage03, Stage02, NoDdp };
  const char* label;
  Kind kind;
  int64_t cap_kib = 0;  // both caps, KiB; 0: PyTorch's defaults (1 MiB, then 25 MiB)
};
constexpr Setup kSetups[] = {{"overlap", Setup::Kind::Stage03},
                             {"after_backward", Setup::Kind::Stage02},
                             {"overlap_512k", Setup::Kind::Stage03, 512},
                             {"no_ddp", Setup::Kind::NoDdp}};

using Rank = tp::bench::StepRank;  // its group and --batch

// The caps of a set-up, as the stages' Options take them.
template <typename Options>
Options options_of(const Setup& setup) {
  Options options;
  if (setup.cap_kib > 0) {
    options.bucket_cap_mb = static_cast<double>(setup.cap_kib) / 1024.0;
    options.first_bucket_cap_mb = options.bucket_cap_mb;
  }
  return options;
}

// One set-up's model (wrapped in its stage's DDP, or not), its SGD and this
// rank's batch. Only one of the three model holders is set.
class OverlapStep {
 public:
  OverlapStep(const Setup& setup, const Rank& rank)
      : batch_(tp::data::SyntheticRegression().rows(rank.group->rank() * rank.batch,
                                                    rank.batch)) {
    switch (setup.kind) {
      case Setup::Kind::Stage03:
        ddp03_ = std::make_unique<stage03::DistributedDataParallel>(
            tp::bench::deep_model(), rank.group, options_of<stage03::Options>(setup));
        break;
      case Setup::Kind::Stage02:
        ddp02_ = std::make_unique<stage02::DistributedDataParallel>(
            tp::bench::deep_model(), rank.group, options_of<stage02::Options>(setup));
        break;
      case Setup::Kind::NoDdp:
        model_ = tp::bench::deep_model();
        break;
    }
    sgd_ = std::make_unique<tp::optim::SGD>(parameters(), tp::optim::SGDOptions{.lr = 1e-3});
  }

  // One training step; adds its backward's wall time to *backward_ms.
  void run(double* backward_ms = nullptr) {
    sgd_->zero_grad();
    tp::Tensor loss = tp::mse_loss(forward(batch_.x), batch_.y);
    const auto start = Clock::now();
    loss.backward();  // stage 03: the buckets' all-reduces, and the wait for the last
    if (backward_ms) *backward_ms += ms_since(start);
    if (ddp02_) ddp02_->sync_grads();  // stage 02: all of them, after backward
    sgd_->step();
    benchmark::DoNotOptimize(loss.data_ptr());
  }

  // Untimed steps: the DDPs rebuild their buckets after the first.
  void warm_up() {
    for (int64_t i = 0; i < 1 + tp::bench::warmup_iterations(); ++i) run();
  }

 private:
  std::vector<tp::Tensor> parameters() const {
    if (ddp03_) return ddp03_->parameters();
    if (ddp02_) return ddp02_->parameters();
    return model_->parameters();
  }

  tp::Tensor forward(const tp::Tensor& x) {
    if (ddp03_) return (*ddp03_)(x);
    if (ddp02_) return (*ddp02_)(x);
    return (*model_)(x);
  }

  std::unique_ptr<stage03::DistributedDataParallel> ddp03_;
  std::unique_ptr<stage02::DistributedDataParallel> ddp02_;
  std::shared_ptr<tp::nn::Module> model_;
  std::unique_ptr<tp::optim::SGD> sgd_;
  tp::data::Batch batch_;
};

void bm_step(benchmark::State& state, const Setup& setup, const Rank& rank) {
  OverlapStep step(setup, rank);
  step.warm_up();
  rank.group->barrier()->wait();
  double backward_ms = 0;
  tp::bench::time_each_iteration(state, "ms", [&] { step.run(&backward_ms); });
  state.counters["bwd_ms"] = benchmark::Counter(backward_ms, benchmark::Counter::kAvgIterations);
}

}  // namespace

int main(int argc, char** argv) {
  // kSetups[0], stage 03 at the default caps, is what the round's
  // "<label>_over_overlap" ratios divide by.
  return tp::bench::step_variants_main<OverlapStep, Setup>(
      argc, argv, "bench_overlap", stage03::stage_spec(),
      {.family = "BM_StepOverlap", .key = "setup", .variants = kSetups, .one = bm_step,
       .round_name = "BM_OverlapRound", .context = {}});
}
