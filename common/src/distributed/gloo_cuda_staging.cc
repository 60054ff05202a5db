// CUDA tensors in ProcessGroupGloo, staged through pinned host memory
// (gloo_cuda_staging.h).
#include "gloo_cuda_staging.h"

#include <string>
#include <utility>

#include "tensorplay/cuda/device_trace.h"
#include "tensorplay/error.h"

namespace tp::distributed::detail {

// Note [Staging CUDA tensors]
// Gloo reads and writes host memory only, and NCCL cannot put two ranks on
// one GPU (ProcessGroupNCCL refuses it), so a job whose ranks share a GPU
// (a laptop, a lesson on one card) runs its CUDA tensors' collectives on
// the gloo backend, through pinned host buffers:
//   1. At issue, on the calling thread: an event `ready` is recorded on the
//      caller's current stream, after the kernels that wrote the tensor.
//      The host does not wait.
//   2. On the communication thread: the group's own communication stream
//      for that GPU (non-blocking, made at first need) waits for `ready`,
//      copies device -> pinned host buffer (cached per GPU, size and
//      position in the collective), and the thread synchronises that stream
//      (Gloo is about to read the host buffer);
//   3. Gloo runs the collective on the host buffers, as for a CPU tensor;
//   4. the stream copies host -> device and records an event `done`; the
//      thread does not wait for it, and finishes the work.
//   5. wait() returns once Gloo finished (as for a CPU tensor) and makes the
//      caller's current stream wait for `done`: kernels queued after wait()
//      see the result, with no device synchronisation.
// The tensors' storage stays alive until `done` has completed (the
// communication thread holds it in StagingStreams::retiring_), so memory
// freed by the caller meanwhile is not reused under the copy back. A pinned buffer is
// reused by the next collective of its size only after the copy back from
// it: both run on the one communication stream of that GPU.
// Checker mode (GlooOptions::check_in_flight_writes) does not take CUDA
// tensors: its comparison at wait() would need a device synchronisation in
// wait(), the very thing staging avoids; it refuses them at issue.
// All of this is inert without CUDA: no CUDA tensor can exist then
// (tp::cuda::is_built() is false), so no Staging is ever made.

std::shared_ptr<Staging> begin_staging(const char* fn, int rank, const Tensor& t,
                                       bool check_in_flight_writes) {
  if (check_in_flight_writes) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": checker mode "
             "(GlooOptions::check_in_flight_writes) does not take CUDA tensors (this one is on ",
             to_string(t.device()), "): checking for writes at wait() would synchronise the "
             "device; run the checker on CPU tensors, or turn checker mode off");
  }
  const int device = t.device().index < 0 ? cuda::current_device() : t.device().index;
  // The `ready` event is recorded on the caller's current stream, which
  // belongs to the current device: it orders the copy after the kernels that
  // wrote the tensor only when that is the tensor's device.
  if (device != cuda::current_device()) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": the tensor is on cuda:", device,
             " but this thread's current device is cuda:", cuda::current_device(),
             "; call tp::cuda::set_device(", device, ") first");
  }
  return std::make_shared<Staging>(device);
}

Buffer staged_buffer(const char* fn, int rank, Staging& staging, const Tensor& t,
                     bool copy_in, bool copy_out) {
  const int device = t.device().index < 0 ? cuda::current_device() : t.device().index;
  if (device != staging.device) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": the tensors of one collective are on "
             "cuda:", staging.device, " and cuda:", device, "; put them on one GPU");
  }
  auto block = std::make_shared<StagedBlock>();
  block->device_data = t.data_ptr();
  block->nbytes = t.nbytes();
  block->copy_in = copy_in;
  block->copy_out = copy_out;
  staging.blocks.push_back(block);
  staging.keep.push_back(t.storage());
  return Buffer{t.storage(), nullptr, static_cast<std::size_t>(t.numel()), t.nbytes(),
                t.dtype(), std::move(block)};
}

void arm(Staging& staging) { staging.ready.record(cuda::current_stream()); }

Buffer buffer_of(const Tensor& t) {
  return Buffer{t.storage(), t.data_ptr(), static_cast<std::size_t>(t.numel()), t.nbytes(),
                t.dtype(), nullptr};
}

// ---- on the communication thread ----------------------------------------------

const cuda::Stream& StagingStreams::comm_stream(int device) {
  auto it = comm_streams_.find(device);
  if (it == comm_streams_.end()) it = comm_streams_.emplace(device, cuda::Stream::create()).first;
  return it->second;
}

void StagingStreams::stage_in(Staging& staging) {
  cuda::set_device(staging.device);
  const cuda::Stream& stream = comm_stream(staging.device);
  stream.wait(staging.ready);
  trace::DeviceSpan gpu("gpu copy to host", stream, "communication stream");
  for (std::size_t i = 0; i < staging.blocks.size(); ++i) {
    StagedBlock& block = *staging.blocks[i];
    std::shared_ptr<void>& host = pinned_[{staging.device, block.nbytes, i}];
    if (!host) host = cuda::allocate_pinned(block.nbytes);
    block.host = host.get();
    if (block.copy_in) cuda::copy_async(block.host, block.device_data, block.nbytes, stream);
  }
  stream.synchronize();  // Gloo reads the host buffers next
}

void StagingStreams::stage_out(Staging& staging) {
  const cuda::Stream& stream = comm_stream(staging.device);
  trace::DeviceSpan gpu("gpu copy to device", stream, "communication stream");
  for (const auto& block : staging.blocks) {
    if (block->copy_out) cuda::copy_async(block->device_data, block->host, block->nbytes, stream);
  }
  staging.done.emplace();
  staging.done->record(stream);
  retiring_.push_back(Retiring{*staging.done, staging.keep});
}

void StagingStreams::retire(bool all) {
  while (!retiring_.empty()) {
    try {
      if (all) {
        retiring_.front().done.synchronize();
      } else if (!retiring_.front().done.query()) {
        return;  // copies back complete in order: the rest are later
      }
    } catch (...) {
      // A broken CUDA context: the copies will never run; let go.
    }
    retiring_.pop_front();
  }
}

}  // namespace tp::distributed::detail
