// broadcast_coalesced: assign the tensors to chunks, then pack, broadcast
// and unpack one chunk at a time, two in flight (broadcast_coalesced.h).
#include "tensorplay/distributed/broadcast_coalesced.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/error.h"

namespace tp::distributed {
namespace {

using tp::detail::cat;

constexpr const char* kBroadcastCoalesced = "tp::distributed::broadcast_coalesced";
constexpr const char* kAssign = "tp::distributed::assign_broadcast_chunks";

// Why two: one chunk on the wire while root packs the next hides the
// packing, and a third would only hold more memory (PyTorch keeps two too).
constexpr std::size_t kMaxInFlight = 2;

// "tp::distributed::broadcast_coalesced: rank 1: ", or without the rank.
std::string prefix(const char* fn, int rank) {
  return rank < 0 ? cat(fn, ": ") : cat(fn, ": rank ", rank, ": ");
}

void check_chunk_bytes(const std::string& where, int64_t chunk_bytes) {
  if (chunk_bytes <= 0) {
    TP_THROW(DistributedError, where, "chunk_bytes is ", chunk_bytes,
             "; pass a positive size in bytes (the default, kDefaultBroadcastChunkBytes = 250 MiB, "
             "is PyTorch's broadcast_bucket_size)");
  }
}

void check_defined(const std::string& where, const std::vector<Tensor>& tensors) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) {
      TP_THROW(DistributedError, where, "tensors[", i,
               "] is undefined; pass defined tensors, such as a model's parameters() and "
               "buffers()");
    }
  }
}

// Note [Chunk assignment]
// ~~~~~~~~~~~~~~~~~~~~~~~
// The rule (broadcast_coalesced.h): per (dtype, device), in list order, a
// tensor joins the open chunk of its kind unless it would take it past
// chunk_bytes, which then closes first; a tensor of chunk_bytes or more is
// a chunk of its own; chunks go in the order of their first tensor.
//
// PyTorch (torch/csrc/distributed/c10d/comm.cpp, broadcast_coalesced) takes
// its buckets from compute_bucket_assignment_by_size
// (torch/csrc/distributed/c10d/reducer.cpp) with the one limit
// buffer_size. Alike: one open bucket per (dtype, device) key, list order
// within a bucket, buckets sorted by their smallest index, at most two
// broadcasts in flight. Different: PyTorch adds the tensor first and closes
// the bucket once it holds >= the limit, so a bucket may exceed the limit by
// up to one tensor, and a tensor bigger than the limit is not alone: it
// joins whatever its kind has open and closes it. Here a chunk stays within
// chunk_bytes, so a big tensor is alone and broadcast in place, uncopied.
// (PyTorch broadcasts a lone contiguous tensor in place too: its flatten of
// one tensor is a view.) PyTorch also packs on every rank (at::cat) and
// copies back on every rank, root included; here root only packs and the
// others only unpack. It asserts a non-empty list and sends tensors with no
// elements within their bucket; here an empty list is 0 broadcasts and such
// tensors are left out.
//
// PyTorch's other grouping, take_tensors (torch/csrc/utils/tensor_flatten.cpp,
// behind torch.cuda.comm's broadcast_coalesced between the GPUs of one
// process), groups per dtype with the same add-then-close rule, but emits
// each group when it closes and the open ones at the end by type, not by
// first index.
std::vector<std::vector<std::size_t>> assign(const std::vector<Tensor>& tensors,
                                             int64_t chunk_bytes) {
  struct Open {
    Dtype dtype;
    Device device;
    std::vector<std::size_t> indices;
    int64_t bytes = 0;
  };
  std::vector<Open> open;  // one per (dtype, device) seen: a handful at most
  std::vector<std::vector<std::size_t>> chunks;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto bytes = static_cast<int64_t>(tensors[i].nbytes());
    if (bytes == 0) continue;
    if (bytes >= chunk_bytes) {
      chunks.push_back({i});
      continue;
    }
    const Dtype dtype = tensors[i].dtype();
    const Device device = tensors[i].device();
    auto it = std::find_if(open.begin(), open.end(), [&](const Open& o) {
      return o.dtype == dtype && o.device == device;
    });
    if (it == open.end()) it = open.insert(open.end(), Open{dtype, device, {}, 0});
    if (it->bytes + bytes > chunk_bytes) {
      chunks.push_back(std::move(it->indices));
      it->indices.clear();
      it->bytes = 0;
    }
    it->indices.push_back(i);
    it->bytes += bytes;
  }
  for (Open& o : open) {
    if (!o.indices.empty()) chunks.push_back(std::move(o.indices));
  }
  // Indices ascend within a chunk, so front() is its first tensor.
  std::sort(chunks.begin(), chunks.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return chunks;
}

// One chunk's broadcast, issued and not yet waited for.
struct InFlight {
  const std::vector<std::size_t>* chunk;  // indices into the caller's tensors
  Tensor flat;                            // the packed chunk; undefined when sent in place
  std::shared_ptr<Work> work;
};

// Waits for f's broadcast; off root, copies a packed chunk out to its tensors.
void finish(const InFlight& f, const std::vector<Tensor>& tensors, bool is_root) {
  f.work->wait();
  if (is_root || !f.flat.defined()) return;
  int64_t offset = 0;
  for (std::size_t i : *f.chunk) {
    Tensor t = tensors[i];  // a handle: copy_ writes the caller's tensor
    t.copy_(f.flat.narrow(0, offset, t.numel()).view(t.shape()));
    offset += t.numel();
  }
}

}  // namespace

std::vector<std::vector<std::size_t>> assign_broadcast_chunks(const std::vector<Tensor>& tensors,
                                                              int64_t chunk_bytes) {
  check_chunk_bytes(prefix(kAssign, -1), chunk_bytes);
  check_defined(prefix(kAssign, -1), tensors);
  return assign(tensors, chunk_bytes);
}

int64_t broadcast_coalesced(ProcessGroup& group, const std::vector<Tensor>& tensors,
                            int64_t chunk_bytes, int root) {
  const std::string where = prefix(kBroadcastCoalesced, group.rank());
  check_chunk_bytes(where, chunk_bytes);
  if (root < 0 || root >= group.size()) {
    TP_THROW(DistributedError, where, "root ", root, " is out of range for world size ",
             group.size(), "; pass a rank in 0 .. ", group.size() - 1);
  }
  check_defined(where, tensors);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!t.is_contiguous()) {
      TP_THROW(DistributedError, where, "tensors[", i, "] is not contiguous (shape ",
               tp::to_string(t.shape()), ", strides ", tp::to_string(t.strides()),
               "); a chunk is copied as dense blocks: pass t.contiguous() and copy the result "
               "back afterwards");
    }
  }
  const std::vector<std::vector<std::size_t>> chunks = assign(tensors, chunk_bytes);

  // The broadcasts write into parameters: no autograd history for that.
  NoGradGuard no_grad;
  const bool is_root = group.rank() == root;
  std::deque<InFlight> in_flight;
  for (const std::vector<std::size_t>& chunk : chunks) {
    if (in_flight.size() == kMaxInFlight) {
      finish(in_flight.front(), tensors, is_root);
      in_flight.pop_front();
    }
    if (chunk.size() == 1) {
      in_flight.push_back({&chunk, Tensor(), group.broadcast(tensors[chunk.front()], root)});
      continue;
    }
    // One dtype and device per chunk (Note [Chunk assignment]).
    const Tensor& first = tensors[chunk.front()];
    int64_t numel = 0;
    for (std::size_t i : chunk) numel += tensors[i].numel();
    Tensor flat = empty({numel}, first.dtype(), first.device());
    if (is_root) {
      int64_t offset = 0;
      for (std::size_t i : chunk) {
        const Tensor& t = tensors[i];
        flat.narrow(0, offset, t.numel()).copy_(t.flatten());
        offset += t.numel();
      }
    }
    in_flight.push_back({&chunk, flat, group.broadcast(flat, root)});
  }
  while (!in_flight.empty()) {
    finish(in_flight.front(), tensors, is_root);
    in_flight.pop_front();
  }
  return static_cast<int64_t>(chunks.size());
}

}  // namespace tp::distributed
