// verify_same_tensors_on_all_ranks: two all-gathers, then every rank compares
// the same gathered table with rank 0's rows (see model_check.h).
#include "tensorplay/distributed/model_check.h"

#include <algorithm>
#include <cstdint>

#include "tensorplay/error.h"
#include "tensorplay/tensor.h"

namespace tp::distributed {
namespace {

// Note [Shape rows]
// ~~~~~~~~~~~~~~~~~
// A tensor's shape and dtype travel as a fixed-width row of numbers, so that
// all ranks compare their lists with one all-gather of one shape:
// [ndim, size_0 .. size_3 (zero-padded), element size in bytes]; an
// undefined tensor is [-1, 0, 0, 0, 0, 0]. Four dimensions cover every kit
// model. A tensor with more is reported by every rank after the gather: a
// check before it would stop only that rank and leave the others waiting in
// the all-gather. For the same reason every decision below is taken on the
// gathered table, which is identical on every rank.
constexpr int64_t kMaxDims = 4;
constexpr int64_t kRowWidth = 1 + kMaxDims + 1;
constexpr double kUndefinedDims = -1;

// Every rank's copy of mine, in rank order. REQUIRES: mine has the same shape
// and dtype on every rank.
std::vector<Tensor> allgather(ProcessGroup& group, const Tensor& mine) {
  std::vector<Tensor> all;
  for (int r = 0; r < group.size(); ++r) all.push_back(zeros_like(mine));
  group.allgather(all, mine)->wait();
  return all;
}

// This rank's rows, one per tensor (Note [Shape rows]).
std::vector<double> rows_of(const std::vector<NamedTensor>& tensors) {
  std::vector<double> rows(tensors.size() * kRowWidth, 0.0);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i].second;
    double* row = rows.data() + i * kRowWidth;
    if (!t.defined()) {
      row[0] = kUndefinedDims;
      continue;
    }
    row[0] = static_cast<double>(t.dim());
    for (int64_t d = 0; d < std::min(t.dim(), kMaxDims); ++d) {
      row[1 + d] = static_cast<double>(t.size(d));
    }
    row[kRowWidth - 1] = static_cast<double>(t.element_size());
  }
  return rows;
}

// "(32, 16) float32", or "undefined", from a row of the gathered table.
std::string describe_row(const double* row) {
  const auto ndim = static_cast<int64_t>(row[0]);
  if (ndim < 0) return "undefined";
  Shape shape;
  for (int64_t d = 0; d < std::min(ndim, kMaxDims); ++d) {
    shape.push_back(static_cast<int64_t>(row[1 + d]));
  }
  return tp::to_string(shape) + (row[kRowWidth - 1] == 8 ? " float64" : " float32");
}

// "1 parameter", "6 parameters".
std::string count_of(int64_t n, const std::string& noun) {
  return tp::detail::cat(n, " ", noun, n == 1 ? "" : "s");
}

}  // namespace

void verify_same_tensors_on_all_ranks(ProcessGroup& group,
                                      const std::vector<NamedTensor>& tensors,
                                      const std::string& who, const std::string& noun) {
  const int world_size = group.size();
  const std::string prefix = tp::detail::cat(who, " (rank ", group.rank(), "): ");
  const std::string fix = "; every rank must build the same model before wrapping it in DDP";

  // The tables travel where the group wants them (an NCCL group moves CUDA
  // tensors only).
  const Device device = group.preferred_device();

  // First the counts, so that the rows below have one shape on every rank
  // (an all-gather of unequal sizes would fail or hang).
  const auto count = static_cast<int64_t>(tensors.size());
  const std::vector<Tensor> counts =
      allgather(group, full({1}, static_cast<double>(count), kFloat64, device));
  const auto rank0s = static_cast<int64_t>(counts[0].item());
  for (int r = 1; r < world_size; ++r) {
    const auto theirs = static_cast<int64_t>(counts[static_cast<std::size_t>(r)].item());
    if (theirs != rank0s) {
      TP_THROW(DistributedError, prefix, "rank ", r, " wraps ", count_of(theirs, noun),
               " but rank 0 wraps ", rank0s, fix);
    }
  }
  if (count == 0) return;  // every rank has none: nothing more to compare

  // Then every tensor's shape and dtype, compared with rank 0's.
  const std::vector<Tensor> rows =
      allgather(group, tensor(rows_of(tensors), {count, kRowWidth}, kFloat64, device));
  const std::vector<double> rank0_rows = rows[0].to_vector();
  for (int r = 0; r < world_size; ++r) {
    const std::vector<double> their_rows = rows[static_cast<std::size_t>(r)].to_vector();
    for (int64_t i = 0; i < count; ++i) {
      const double* theirs = their_rows.data() + i * kRowWidth;
      const double* rank0s_row = rank0_rows.data() + i * kRowWidth;
      const std::string& name = tensors[static_cast<std::size_t>(i)].first;
      if (theirs[0] > static_cast<double>(kMaxDims)) {
        TP_THROW(DistributedError, prefix, noun, " ", i, " (", name, " here) has ",
                 static_cast<int64_t>(theirs[0]), " dimensions on rank ", r,
                 "; tp::distributed::verify_same_tensors_on_all_ranks compares ", noun,
                 "s of up to ", kMaxDims, " dimensions; raise kMaxDims in "
                 "common/src/distributed/model_check.cc");
      }
      if (!std::equal(theirs, theirs + kRowWidth, rank0s_row)) {
        TP_THROW(DistributedError, prefix, noun, " ", i, " (", name, " here) is ",
                 describe_row(rank0s_row), " on rank 0 but ", describe_row(theirs),
                 " on rank ", r, fix);
      }
    }
  }
}

}  // namespace tp::distributed
