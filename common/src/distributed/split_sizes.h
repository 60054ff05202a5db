// Private to libtensorplay: how the flat tensor of reduce_scatter_tensor and
// allgather_into_tensor (process_group.h) splits into one block per rank,
// and the argument checks every backend makes of those two collectives
// alike, so that a bad call reads the same on Gloo and on NCCL.
//
// Pure functions of their arguments; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensorplay/tensor.h"

namespace tp::distributed::detail {

// Where each block starts, in elements: offsets[r] = sizes[0] + ... +
// sizes[r - 1]; offsets[0] = 0.
std::vector<int64_t> block_offsets(const std::vector<int64_t>& sizes);

// "(3, 0, 5)": block sizes as the errors and the fingerprints print them.
std::string sizes_text(const std::vector<int64_t>& sizes);

// The block sizes of collective `fn` on `rank` of a group of `size` ranks:
// `split_sizes`, or, when it is empty, an even split of `flat`. `flat` (the
// reduce-scatter's input, the all-gather's output; named `flat_name` in
// errors) holds every rank's block one after another; `shard` (the
// reduce-scatter's output, the all-gather's input; `shard_name`) this
// rank's block. Only element counts matter, not shapes.
// REQUIRES: both tensors defined (the backend checks that first).
// Throws tp::DistributedError naming fn, rank, the cause and the fix when
// the dtypes differ, split_sizes has not `size` entries or a negative one,
// the sizes do not add up to flat's elements (or, split evenly, `size` does
// not divide them), shard's elements are not split_sizes[rank], or the two
// tensors overlap other than with shard being exactly block `rank` of flat
// (the in-place form, which is allowed).
std::vector<int64_t> check_blocks(const char* fn, int rank, int size, const Tensor& flat,
                                  const char* flat_name, const Tensor& shard,
                                  const char* shard_name,
                                  const std::vector<int64_t>& split_sizes);

}  // namespace tp::distributed::detail
