// Private to libtensorplay: CUDA tensors in ProcessGroupGloo, staged
// through pinned host memory around the Gloo call, since Gloo reads and
// writes host memory only (Note [Staging CUDA tensors] in
// gloo_cuda_staging.cc); and Buffer, what the communication thread is
// handed of any tensor, CPU or CUDA.
//
// Threads: begin_staging, staged_buffer, arm and buffer_of run on the
// issuing thread; a Staging then belongs to its collective's task and its
// Work (see the fields); a StagingStreams belongs to the communication
// thread alone.
// Inert without CUDA: no CUDA tensor can exist then, so no Staging is made.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "tensorplay/cuda/runtime.h"
#include "tensorplay/tensor.h"

namespace tp::distributed::detail {

// A CUDA tensor's block, staged through a pinned host buffer.
struct StagedBlock {
  void* device_data = nullptr;  // the tensor's memory on its GPU
  std::size_t nbytes = 0;
  bool copy_in = false;   // device -> host before the collective
  bool copy_out = false;  // host -> device after it
  void* host = nullptr;   // the pinned buffer; set on the communication thread
};

// The CUDA side of one collective (Note [Staging CUDA tensors]).
struct Staging {
  explicit Staging(int device) : device(device) {}
  const int device;
  const cuda::Event ready;  // recorded at issue on the caller's current stream
  std::vector<std::shared_ptr<StagedBlock>> blocks;
  std::vector<std::shared_ptr<const void>> keep;  // the tensors' storage
  // Recorded by the communication thread after the copies back, before the
  // work finishes; read by wait() after it has.
  std::optional<cuda::Event> done;
};

// What the communication thread needs of a tensor: its bytes, kept alive by
// the storage handle. Not the Tensor itself: the communication thread never
// touches a TensorImpl or the autograd graph, only memory it was handed.
struct Buffer {
  std::shared_ptr<const void> keep_alive;  // the tensor's Storage, or a checker-mode copy
  void* data = nullptr;
  std::size_t numel = 0;
  std::size_t nbytes = 0;
  Dtype dtype = kFloat32;
  std::shared_ptr<StagedBlock> staged;  // set for a CUDA tensor: Gloo works on its host copy

  // The memory Gloo works on: the tensor's (or a checker-mode copy), or the
  // pinned host buffer of a staged CUDA tensor.
  void* ptr() const { return staged ? staged->host : data; }
};

inline bool is_cuda(const Tensor& t) { return t.device().type == DeviceType::CUDA; }

// A CPU tensor's Buffer: its own memory.
Buffer buffer_of(const Tensor& t);

// The Staging of a collective `fn` whose tensors are on CUDA tensor `t`'s
// device (step 1 once every block is added: see arm()). Throws
// tp::DistributedError naming `fn` and `rank` in checker mode
// (`check_in_flight_writes`), which takes no CUDA tensors, and when `t` is
// not on the thread's current device.
std::shared_ptr<Staging> begin_staging(const char* fn, int rank, const Tensor& t,
                                       bool check_in_flight_writes);

// A staged block for CUDA tensor `t` in `staging`; the Buffer Gloo sees.
// copy_in: Gloo reads its bytes; copy_out: Gloo writes them. Throws
// tp::DistributedError when `t` is on another GPU than the staging.
Buffer staged_buffer(const char* fn, int rank, Staging& staging, const Tensor& t, bool copy_in,
                     bool copy_out);

// Step 1: the blocks are read only after what the caller's stream queued so far.
void arm(Staging& staging);

// The communication thread's side of staging (steps 2 and 4): a stream per
// GPU, the pinned buffers, and the storage of tensors whose copies back may
// still run. All empty until a collective has a CUDA tensor.
class StagingStreams {
 public:
  // Step 2: the blocks' bytes in pinned host buffers, ready for Gloo.
  void stage_in(Staging& staging);
  // Step 4: the results back to the device, and `done` after them.
  void stage_out(Staging& staging);
  // Drops the storage of staged tensors whose copies back have run (all:
  // waits for them first; at the end of the communication thread).
  void retire(bool all);

 private:
  struct Retiring {
    cuda::Event done;                                // the copies back
    std::vector<std::shared_ptr<const void>> keep;  // the storage they write
  };

  // The communication stream of `device`, made at first need.
  const cuda::Stream& comm_stream(int device);

  std::map<int, cuda::Stream> comm_streams_;  // per GPU
  // Pinned buffers by (GPU, size, position in the collective); a buffer is
  // reused in issue order on its GPU's stream, so one per key suffices.
  std::map<std::tuple<int, std::size_t, std::size_t>, std::shared_ptr<void>> pinned_;
  std::deque<Retiring> retiring_;  // in the order of their copies back
};

}  // namespace tp::distributed::detail
