// The blocks of a flat tensor and the checks of reduce_scatter_tensor and
// allgather_into_tensor that every backend shares (split_sizes.h).
#include "split_sizes.h"

#include <cstddef>

#include "tensorplay/error.h"

namespace tp::distributed::detail {

using tp::detail::cat;

std::vector<int64_t> block_offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets;
  int64_t at = 0;
  for (int64_t n : sizes) {
    offsets.push_back(at);
    at += n;
  }
  return offsets;
}

std::string sizes_text(const std::vector<int64_t>& sizes) {
  return tp::to_string(Shape(sizes.begin(), sizes.end()));
}

std::vector<int64_t> check_blocks(const char* fn, int rank, int size, const Tensor& flat,
                                  const char* flat_name, const Tensor& shard,
                                  const char* shard_name,
                                  const std::vector<int64_t>& split_sizes) {
  if (flat.dtype() != shard.dtype()) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": the ", flat_name, " has dtype ",
             to_string(flat.dtype()), " but the ", shard_name, " has dtype ",
             to_string(shard.dtype()), "; the blocks are moved as they are, so pass tensors of "
             "one dtype");
  }
  std::vector<int64_t> sizes = split_sizes;
  if (sizes.empty()) {
    if (flat.numel() % size != 0) {
      TP_THROW(DistributedError, fn, ": rank ", rank, ": the ", flat_name, " has ",
               flat.numel(), " elements, which world size ", size, " does not divide into "
               "equal blocks; pass split_sizes, one block size per rank, for an uneven split");
    }
    sizes.assign(static_cast<std::size_t>(size), flat.numel() / size);
  } else {
    if (static_cast<int>(sizes.size()) != size) {
      TP_THROW(DistributedError, fn, ": rank ", rank, ": split_sizes ", sizes_text(sizes),
               " has ", sizes.size(), " entries for world size ", size, "; pass one block "
               "size per rank (or none, for an even split)");
    }
    int64_t total = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      if (sizes[r] < 0) {
        TP_THROW(DistributedError, fn, ": rank ", rank, ": split_sizes[", r, "] is ", sizes[r],
                 "; a block size is a number of elements, 0 or more");
      }
      total += sizes[r];
    }
    if (total != flat.numel()) {
      TP_THROW(DistributedError, fn, ": rank ", rank, ": split_sizes ", sizes_text(sizes),
               " add up to ", total, " elements but the ", flat_name, " has ", flat.numel(),
               "; the ", flat_name, " holds every rank's block, one after another");
    }
  }
  const int64_t mine = sizes[static_cast<std::size_t>(rank)];
  if (shard.numel() != mine) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": the ", shard_name, " has ",
             shard.numel(), " elements but this rank's block has ", mine, " (split sizes ",
             sizes_text(sizes), "); rank ", rank, "'s ", shard_name, " is block ", rank,
             " of the ", flat_name);
  }
  // The in-place form (shard is block `rank` of flat, as with NCCL) is fine;
  // any other overlap would have the collective read what it is writing.
  if (flat.storage() == shard.storage() && shard.nbytes() > 0 && flat.nbytes() > 0) {
    const auto* f = static_cast<const std::byte*>(flat.data_ptr());
    const auto* s = static_cast<const std::byte*>(shard.data_ptr());
    const auto* block = f + block_offsets(sizes)[static_cast<std::size_t>(rank)] *
                                static_cast<int64_t>(flat.element_size());
    const bool overlaps = s < f + flat.nbytes() && f < s + shard.nbytes();
    if (overlaps && s != block) {
      TP_THROW(DistributedError, fn, ": rank ", rank, ": the ", shard_name, " overlaps the ",
               flat_name, " but is not block ", rank, " of it; pass separate tensors, or "
               "block ", rank, " of the ", flat_name, " itself (in place)");
    }
  }
  return sizes;
}

}  // namespace tp::distributed::detail
