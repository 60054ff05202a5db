// Exercise generated from solutions/01-naive/ddp.cc by tools/gen_exercise.py.
// Fill in each EXERCISE, then run ./kit check 01. ./kit reset 01 restores this file.
// Stage 01 — naive DDP: one all-reduce per parameter after backward.
// No buckets, no overlap: stage 02 and 03 add those. See ddp.h for the contract
// and lessons/01-naive/README.md for the why.
#include "ddp.h"

#include <algorithm>
#include <string>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/error.h"

namespace stage01 {

using tp::Tensor;
using tp::distributed::ReduceOp;

namespace {

// Given, for the construction check below.
//
// A parameter's shape and dtype travel as a fixed-width row of numbers so
// that all ranks can compare their models with one all-gather:
// [ndim, size_0 .. size_3 (zero-padded), element size in bytes]. Four
// dimensions cover every kit model; a parameter with more is reported by
// every rank after the gather (a check before it would stop only that rank
// and leave the others waiting in the all-gather).
constexpr int64_t kMaxDims = 4;
constexpr int64_t kRowWidth = 1 + kMaxDims + 1;

// Parameter `param`'s row in a table of rows laid end to end.
[[maybe_unused]] const double* row_of(const std::vector<double>& rows, int64_t param) {
  return rows.data() + param * kRowWidth;
}

// "(32, 16) float32", from a row of the gathered table.
[[maybe_unused]] std::string describe_row(const double* row) {
  const auto ndim = static_cast<int64_t>(row[0]);
  tp::Shape shape;
  for (int64_t d = 0; d < std::min(ndim, kMaxDims); ++d) {
    shape.push_back(static_cast<int64_t>(row[1 + d]));
  }
  return tp::to_string(shape) + (row[kRowWidth - 1] == 8 ? " float64" : " float32");
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<tp::nn::Module> module,
    std::shared_ptr<tp::distributed::ProcessGroup> process_group, Options options)
    : module_(std::move(module)),
      process_group_(std::move(process_group)),
      options_(options) {
  TP_CHECK(module_ != nullptr, "stage01 DDP: the module is null; pass the model to wrap");
  TP_CHECK(process_group_ != nullptr,
           "stage01 DDP: the process group is null; call init_process_group first");
  params_ = module_->named_parameters();
  verify_same_model_on_all_ranks();
  broadcast_from_rank0();
}

void DistributedDataParallel::verify_same_model_on_all_ranks() {
  // EXERCISE: refuse, on every rank, to wrap models that differ between
  // ranks (ddp.h's contract: same number of parameters, same shapes, same
  // dtypes). Two all-gathers through process_group_, each waited for: first
  // every rank's parameter count, then every rank's table of rows (one row
  // of kRowWidth numbers per parameter, laid out as described above). An
  // all-gather needs the same size on every rank, hence the count first.
  // Then every rank holds the same gathered data, so every rank can compare
  // every rank's rows with rank 0's and throw the same tp::DistributedError,
  // naming the first differing parameter (index and name), what it is on
  // rank 0 and on the other rank (describe_row), and the fix. A check that
  // only one rank can fail leaves the others waiting in the broadcast.
  throw tp::NotImplemented("stage 01: DistributedDataParallel::verify_same_model_on_all_ranks is not implemented yet (exercises/01-naive/ddp.cc)");
}

// SAME FROM STAGE 01: broadcast rank 0's model
void DistributedDataParallel::broadcast_from_rank0() {
  // The broadcast writes into the parameters: no autograd history for that.
  tp::NoGradGuard no_grad;
  // EXERCISE: make every replica a copy of rank 0's model: when this
  // returns, every rank holds rank 0's values of every parameter, and of
  // every buffer of module_ when options_.broadcast_buffers is set (when it
  // is not, each rank keeps its own buffers). One collective per tensor,
  // finished before this returns.
  throw tp::NotImplemented("stage 01: DistributedDataParallel::broadcast_from_rank0 is not implemented yet (exercises/01-naive/ddp.cc)");
}
// END SAME FROM STAGE 01: broadcast rank 0's model

Tensor DistributedDataParallel::forward(const Tensor& input) {
  return module_->forward(input);
}

Tensor DistributedDataParallel::grad_for_sync(size_t index) const {
  const auto& [name, param] = params_[index];
  Tensor grad = param.grad();
  if (!grad.defined()) {
    TP_THROW(tp::DistributedError, "stage01 DDP: rank ", process_group_->rank(),
             " found no gradient for parameter ", index, " (", name, ") in sync_grads call ",
             sync_count_ + 1, "; call sync_grads() after loss.backward(): before backward there is"
             " nothing to average (and every parameter must reach the loss)");
  }
  return grad;
}

void DistributedDataParallel::sync_grads() {
  // EXERCISE: when this returns, every parameter's .grad holds, on every
  // rank, the mean over the ranks of that parameter's gradient: the tensor
  // the optimizer will read, not a copy of it. One collective per
  // parameter, each finished before this returns, issued in the same order
  // on every rank. grad_for_sync(i) is parameter i's gradient (or a clear
  // error when backward has not produced one).
  throw tp::NotImplemented("stage 01: DistributedDataParallel::sync_grads is not implemented yet (exercises/01-naive/ddp.cc)");
  ++sync_count_;
}

}  // namespace stage01
