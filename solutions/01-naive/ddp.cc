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
  // BEGIN SOLUTION
  const int world_size = process_group_->size();
  const int rank = process_group_->rank();
  auto gather = [&](const Tensor& mine) {
    std::vector<Tensor> all;
    for (int r = 0; r < world_size; ++r) all.push_back(tp::zeros_like(mine));
    process_group_->allgather(all, mine)->wait();
    return all;
  };

  // First the parameter count, so that the shape rows below have one length
  // on every rank (an all-gather of unequal sizes would fail or hang).
  const auto count = static_cast<int64_t>(params_.size());
  std::vector<Tensor> counts = gather(tp::full({1}, static_cast<double>(count), tp::kFloat64));
  for (int r = 1; r < world_size; ++r) {
    const auto theirs = static_cast<int64_t>(counts[static_cast<size_t>(r)].item());
    const auto rank0s = static_cast<int64_t>(counts[0].item());
    if (theirs != rank0s) {
      TP_THROW(tp::DistributedError, "stage01 DDP (rank ", rank, "): rank ", r, " wraps ", theirs,
               " parameters but rank 0 wraps ", rank0s,
               "; every rank must build the same model before wrapping it in DDP");
    }
  }

  // Then every parameter's shape and dtype.
  if (count == 0) return;
  std::vector<double> mine(static_cast<size_t>(count * kRowWidth), 0.0);
  for (int64_t i = 0; i < count; ++i) {
    const Tensor& param = params_[static_cast<size_t>(i)].second;
    double* row = mine.data() + i * kRowWidth;
    row[0] = static_cast<double>(param.dim());
    for (int64_t d = 0; d < std::min(param.dim(), kMaxDims); ++d) {
      row[1 + d] = static_cast<double>(param.size(d));
    }
    row[kRowWidth - 1] = static_cast<double>(param.element_size());
  }
  std::vector<Tensor> rows = gather(tp::tensor(mine, {count, kRowWidth}, tp::kFloat64));
  const std::vector<double> rank0_rows = rows[0].to_vector();
  for (int r = 0; r < world_size; ++r) {
    const std::vector<double> their_rows = rows[static_cast<size_t>(r)].to_vector();
    for (int64_t i = 0; i < count; ++i) {
      const double* theirs = row_of(their_rows, i);
      const double* rank0s = row_of(rank0_rows, i);
      const std::string name = params_[static_cast<size_t>(i)].first;
      if (theirs[0] > static_cast<double>(kMaxDims)) {
        TP_THROW(tp::DistributedError, "stage01 DDP (rank ", rank, "): parameter ", i, " (",
                 name, " here) has ", theirs[0], " dimensions on rank ", r, "; this DDP "
                 "compares models of up to ", kMaxDims, " dimensions per parameter");
      }
      if (!std::equal(theirs, theirs + kRowWidth, rank0s)) {
        TP_THROW(tp::DistributedError, "stage01 DDP (rank ", rank, "): parameter ", i, " (",
                 name, " here) is ", describe_row(rank0s), " on rank 0 but ",
                 describe_row(theirs), " on rank ", r,
                 "; every rank must build the same model before wrapping it in DDP");
      }
    }
  }
  // END SOLUTION
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
  // BEGIN SOLUTION
  for (auto& [name, param] : params_) {
    process_group_->broadcast(param, /*root=*/0)->wait();
  }
  if (options_.broadcast_buffers) {
    for (const Tensor& buffer : module_->buffers()) {
      process_group_->broadcast(buffer, /*root=*/0)->wait();
    }
  }
  // END SOLUTION
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
  // BEGIN SOLUTION
  const int world_size = process_group_->size();
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor grad = grad_for_sync(i);
    process_group_->allreduce(grad, ReduceOp::SUM)->wait();
    grad.div_(world_size);
  }
  // END SOLUTION
  ++sync_count_;
}

}  // namespace stage01
