// tp::distributed::ProcessGroupNCCL: ProcessGroup over NVIDIA's NCCL, for
// CUDA tensors, one GPU per rank. Built only when the kit is configured with
// the Meson feature `nccl` (init_process_group("nccl", ...) says why not
// otherwise).
//
// Contract:
//   - Rendezvous through a tp::distributed::Store that every rank reaches
//     (env://'s TCPStore, redis://'s RedisStore, or file://'s directory
//     store): rank 0 makes the ncclUniqueId and publishes it, the others
//     read it (a missing rank 0: tp::TimeoutError naming the key and the
//     timeout); the ranks claim their ranks and agree on the world size
//     (Note [Rendezvous in a store]: tp::TimeoutError listing the missing
//     ranks), publish (host, GPU) and check that no two share a GPU; each
//     step within options.timeout. Two ranks on one GPU
//     is a tp::DistributedError on every rank, before NCCL is called: NCCL
//     cannot run them; the gloo backend can (it stages CUDA tensors through
//     host memory).
//     Not bounded: ncclCommInitRank itself (blocking mode), which a rank
//     that dies between the rendezvous and it leaves its peers waiting in
//     (spawn's watch, or tprun, ends such a job).
//   - Rank r uses GPU options.device, or (r % device_count()) when that is
//     -1; the constructor makes it the calling thread's current device, and
//     every collective sets it again on the issuing thread.
//   - Tensors: CUDA, contiguous, on this group's GPU, one dtype per
//     collective; otherwise tp::DistributedError naming the collective, at
//     the call. Every dtype maps to NCCL's (float16 to ncclFloat16, bfloat16
//     to ncclBfloat16), though the kit's CUDA tensors are float32 or float64
//     today (tensor.h).
//   - Streams: each collective runs on the group's own communication stream,
//     which first waits (an event, not the host) for the work queued so far
//     on the issuing thread's current stream. Work::wait() makes the
//     waiting thread's current stream wait for the collective and returns
//     at once: the host does not wait. Reading the result on that stream is
//     correct; reading it from the host needs a synchronisation, as always
//     in CUDA. With NcclOptions::blocking_wait (TORCH_NCCL_BLOCKING_WAIT's
//     role; also TP_NCCL_BLOCKING_WAIT=1 through init_process_group) wait()
//     also blocks the host until the collective finished. A barrier's
//     wait() always blocks the host: that is what a barrier is for.
//   - The group keeps the tensors' storage alive until the collective has
//     completed on the GPU (or failed), so a tensor dropped before wait() is
//     not freed under NCCL; tensors must not be written until wait() (the
//     contract of process_group.h). is_completed() turns true when the
//     watchdog sees the collective done on the GPU (within a few ms).
//   - Errors: a watchdog thread polls the collectives in flight every 2 ms.
//     One that runs longer than options.timeout fails with tp::TimeoutError
//     ("allreduce #7 on rank 1 timed out after 2000 ms (NCCL; ...)"); an
//     asynchronous NCCL error fails the oldest one in flight with a
//     tp::DistributedError (tp::PeerFailedError for NCCL's "remote error")
//     naming ncclGetErrorString and ncclGetLastError. Then the communicator
//     is aborted (ncclCommAbort), every other collective in flight fails with
//     tp::PeerFailedError, and the group is unusable: every later
//     collective, wait() of a failed work and synchronize() throws an error
//     of the failure's type naming it. A non-blocking wait() throws only
//     when the failure is already known; the next wait, synchronize() or
//     collective after the watchdog saw it throws.
//   - An NCCL call that fails at issue throws a tp::DistributedError naming
//     the call, ncclGetErrorString and ncclGetLastError, and stops the group
//     as above.
//   - No futures: Work::get_future() throws tp::DistributedError naming the
//     collective (the group gives its works no outputs). A future completes
//     on the host, and a callback's kernels would run on another thread's
//     stream that nothing orders the waiter after; PyTorch's CUDA-aware
//     futures record events for that, which tp::distributed::Future does
//     not. wait() for the work instead.
//   - The flat collectives (process_group.h): ncclReduceScatter and
//     ncclAllGather when every block has the same size; otherwise, as
//     PyTorch's NCCL backend does lists of tensors of different sizes, one
//     ncclReduce (ncclBroadcast) per non-empty block, rooted at its rank,
//     in one NCCL group (Note [Uneven blocks on NCCL] in
//     process_group_nccl.cc).
//   - counters(): as for every group (process_group.h).
//   - Threads: issuing methods and synchronize() from one thread at a time
//     (process_group.h); Work::wait() from any thread. The watchdog thread
//     only polls events and NCCL's error state, completes works and, on a
//     failure, aborts the communicator; a collective being issued while it
//     aborts may itself fail with the failure's error.
//   - The destructor waits for the collectives in flight (each bounded by
//     the timeout), then destroys the communicator (or not, when aborted).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/distributed/process_group.h"
#include "tensorplay/distributed/store.h"

namespace tp::distributed {

struct NcclOptions {
  // Per-collective deadline (the watchdog's), and the rendezvous deadline.
  std::chrono::milliseconds timeout{30000};
  // The GPU of this rank; -1: rank % tp::cuda::device_count().
  int device = -1;
  // wait() also blocks the host until the collective finished (and rethrows
  // its error then), like PyTorch's TORCH_NCCL_BLOCKING_WAIT=1.
  bool blocking_wait = false;
};

class ProcessGroupNCCL : public ProcessGroup {
 public:
  // REQUIRES: 1 <= size, 0 <= rank < size, store not null.
  // Throws tp::DistributedError when no CUDA device is usable, when the
  // device does not exist, when two ranks share a GPU, or when NCCL fails to
  // make the communicator; tp::TimeoutError when a rank or rank 0's
  // ncclUniqueId does not arrive within options.timeout.
  ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size, NcclOptions options = {});
  ~ProcessGroupNCCL() override;

  std::string backend_name() const override { return "nccl"; }
  // Every dtype, bfloat16 where this build's nccl.h declares ncclBfloat16
  // (CUDA 11 and later).
  bool can_reduce(Dtype dtype) const override;
  std::chrono::milliseconds timeout() const override { return options_.timeout; }
  std::shared_ptr<Work> allreduce(const Tensor& tensor,
                                  ReduceOp op = ReduceOp::SUM) override;
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root = 0) override;
  std::shared_ptr<Work> allgather(const std::vector<Tensor>& outputs,
                                  const Tensor& input) override;
  std::shared_ptr<Work> barrier() override;
  // ncclReduceScatter and ncclAllGather for equal blocks; uneven ones by one
  // rooted collective per rank in an NCCL group (see the contract).
  std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& output, const Tensor& input,
                                              const std::vector<int64_t>& split_sizes = {},
                                              ReduceOp op = ReduceOp::SUM) override;
  std::shared_ptr<Work> allgather_into_tensor(
      const Tensor& output, const Tensor& input,
      const std::vector<int64_t>& split_sizes = {}) override;

  // Blocks the host until every collective issued so far has finished;
  // throws the group's failure if there was one.
  void synchronize() override;

  // This rank's GPU.
  int device() const;
  Device preferred_device() const override { return Device{DeviceType::CUDA, device()}; }
  const NcclOptions& options() const { return options_; }

 private:
  struct Impl;
  NcclOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tp::distributed
