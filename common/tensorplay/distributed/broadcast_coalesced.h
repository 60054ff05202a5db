// tp::distributed::broadcast_coalesced: root's values of many tensors to
// every rank, packed into a few flat chunks, one broadcast per chunk. What a
// DDP constructor does with the model's parameters and buffers (PyTorch's
// dist._broadcast_coalesced, broadcast_bucket_size = 250 MiB), instead of
// one broadcast per tensor, each paying a collective's fixed cost.
//
// Contract:
//   - It is a collective: every rank of `group` calls it at the same point
//     of its collective sequence, with the same chunk_bytes and root, and
//     with tensors of the same shapes, dtypes and devices in the same order
//     (the values may differ: that is the point). Each rank then computes
//     the same chunks and issues the same broadcasts. Ranks whose lists
//     differ issue mismatched broadcasts: run
//     verify_same_tensors_on_all_ranks (model_check.h) first, as DDP does.
//   - Grouping (assign_broadcast_chunks below; Note [Chunk assignment] in
//     broadcast_coalesced.cc sets it beside PyTorch's):
//       * one chunk holds tensors of one dtype on one device only, so a
//         model with float32 and float64 tensors needs at least two chunks;
//       * the tensors are taken in list order; each joins the open chunk of
//         its dtype and device, which is closed first when the tensor would
//         take it past chunk_bytes. A chunk never holds more than
//         chunk_bytes bytes, except:
//       * a tensor of chunk_bytes or more is a chunk of its own;
//       * tensors with no elements are in no chunk (there is nothing to send);
//       * within a chunk the tensors keep list order; the chunks are issued
//         in the order of their first tensor.
//   - Copies: a chunk of one tensor (a big tensor, or one left alone in its
//     dtype) is broadcast in place, with no copy. A chunk of several is a
//     fresh flat tensor on their device: root copies the tensors into it,
//     the others copy the result out of it; nobody else copies.
//   - At most two chunks are in flight: root packs the next while the
//     previous is on the wire, and the packed copies held at once take at
//     most 2 * chunk_bytes.
//   - On return (after every broadcast's wait()) every rank's tensors hold
//     root's values. No autograd history is recorded: the writes run under
//     NoGradGuard, so parameters stay leaves.
//   - Devices: CPU and CUDA tensors, on the devices the group takes (Gloo:
//     both, CUDA ones staged through host memory; NCCL: CUDA only). A chunk
//     of CUDA tensors is packed on their device, on the calling thread's
//     current stream (tensor.h), which must be that device's
//     (tp::cuda::set_device).
//   - Tensors must be defined and contiguous (views of a bucket are; a
//     transposed view is not).
//   - Errors: chunk_bytes <= 0, a root outside [0, size), an undefined or a
//     non-contiguous tensor throw tp::DistributedError naming the function,
//     the rank, the cause and the fix, before any broadcast is issued (so
//     on every rank alike, as the arguments agree). Errors of the
//     broadcasts themselves (tp::TimeoutError, ...) propagate unchanged.
//   - Thread-safety: issues collectives from the calling thread, so no other
//     thread may issue collectives on `group` meanwhile (process_group.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensorplay/distributed/process_group.h"
#include "tensorplay/tensor.h"

namespace tp::distributed {

// PyTorch's broadcast_bucket_size: the chunk size a DDP constructor uses.
inline constexpr int64_t kDefaultBroadcastChunkBytes = 250 * 1024 * 1024;

// The chunks broadcast_coalesced broadcasts, as indices into `tensors`,
// by the grouping rule of the contract. Reads only the tensors' metadata.
// For example, float32 tensors of 4, 4 and 12 bytes and a float64 tensor of
// 8 bytes, [a32, b64, c32, d32], with chunk_bytes = 8: {0, 2}, {1}, {3}
// (a and c fill one chunk; b, 8 bytes, and d, 12, are chunks of their own).
// REQUIRES: chunk_bytes > 0, every tensor defined (tp::DistributedError
// otherwise).
std::vector<std::vector<std::size_t>> assign_broadcast_chunks(const std::vector<Tensor>& tensors,
                                                              int64_t chunk_bytes);

// Every rank's `tensors` take root's values, one broadcast per chunk of
// assign_broadcast_chunks(tensors, chunk_bytes). Returns the number of
// broadcasts issued (group.counters().broadcast grows by as much): 0 for an
// empty list or one whose tensors have no elements.
int64_t broadcast_coalesced(ProcessGroup& group, const std::vector<Tensor>& tensors,
                            int64_t chunk_bytes = kDefaultBroadcastChunkBytes, int root = 0);

}  // namespace tp::distributed
