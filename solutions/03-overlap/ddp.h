// Stage 03 — DistributedDataParallel that overlaps communication with backward.
//
// What it is: stage 02's buckets, synced from inside backward. At
// construction it checks the model on every rank, broadcasts rank 0's
// parameters and buffers, assigns the parameters to buckets (the same rule
// as stage 02) and registers one post-accumulate-grad hook per parameter.
// During backward, each hook puts its gradient into its bucket slot; the
// moment a bucket is complete its all-reduce is launched, asynchronously and
// strictly in bucket order, while the autograd engine goes on computing the
// earlier layers' gradients (Note [Overlap] in ddp.cc). A callback queued for
// the end of backward waits for every bucket, divides by the world size,
// copies the averages back into the gradients (unless they are views of the
// buckets) and resets the per-iteration state. When loss.backward() returns,
// every .grad holds the average: there is no sync_grads().
//
// The all-reduces run on the process group's communication thread, the CPU
// analogue of a CUDA communication stream: the hooks only launch (queue) and
// the callback only waits on each Work. On a GPU (RunConfig::device, `./kit
// demo 03 --device cuda`) the same file runs unchanged: the buckets live on
// the parameters' device, ProcessGroupNCCL makes its communication stream
// wait on an event recorded on the compute stream when a bucket is launched,
// and each Work's wait() makes the compute stream wait on the communication
// stream, without stopping the host (lesson 03, "On a GPU").
//
// What it deliberately is not: no no_sync (stage 04), no unused parameters
// (stage 05: here a parameter that gets no gradient leaves its bucket
// unfinished, which is an error), no bucket rebuilding (stage 06).
//
// Contract:
//   - Every rank constructs it with the same architecture; a mismatch throws
//     tp::DistributedError on every rank (never a hang).
//   - Every parameter must get a gradient in every backward. A backward in
//     which one did not throws tp::DistributedError at its end, naming the
//     parameters (name and index) and pointing at find_unused_parameters;
//     every later forward refuses to run (the replicas may have diverged).
//   - One backward per forward, on every rank, the same number of times.
//   - Hooks capture `this`: neither copyable nor movable; the hooks are
//     removed when it is destroyed (it owns their handles).
//   - Not thread-safe. Bucket tensors are touched by the communication
//     thread only between an all-reduce's launch and its wait().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/distributed/process_group.h"
#include "tensorplay/nn/module.h"
#include "tensorplay/tensor.h"
#include "tensorplay/train/capabilities.h"

namespace stage03 {

struct Options {
  // Also copy rank 0's buffers (running statistics) at construction.
  bool broadcast_buffers = true;
  // Cap of every bucket but the first, in MiB (PyTorch's default, 25).
  double bucket_cap_mb = 25.0;
  // Cap of the first bucket, the one complete first: small, so that
  // communication starts early (PyTorch uses 1 MiB).
  double first_bucket_cap_mb = 1.0;
  // As in PyTorch: each .grad becomes a view of its bucket slot, so the
  // average lands in it directly and no copy back is needed.
  bool gradient_as_bucket_view = false;
};

class DistributedDataParallel {
 public:
  using Options = stage03::Options;
  // For the kit's trainer: gradients are averaged inside backward, by hooks;
  // bucket_assignment() lists the buckets; runs on CUDA tensors too.
  static constexpr tp::train::Capabilities capabilities{
      .syncs_in_backward = true, .buckets = true, .cuda = true};

  // Verifies that all ranks hold the same parameter shapes, broadcasts rank
  // 0's parameters (and buffers), assigns the buckets and registers the
  // hooks. Throws tp::Error for a cap that is not positive.
  DistributedDataParallel(std::shared_ptr<tp::nn::Module> module,
                          std::shared_ptr<tp::distributed::ProcessGroup> process_group,
                          Options options = {});
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Runs the wrapped module. Throws if the previous backward left a bucket
  // unfinished (see the contract).
  tp::Tensor forward(const tp::Tensor& input);
  tp::Tensor operator()(const tp::Tensor& input) { return forward(input); }

  std::vector<tp::Tensor> parameters() const { return module_->parameters(); }
  std::vector<tp::nn::NamedTensor> named_parameters() const {
    return module_->named_parameters();
  }
  tp::nn::Module& module() { return *module_; }
  // The parameter indices (named_parameters() order) of each bucket, in
  // bucket order; within a bucket, in the order they were added.
  std::vector<std::vector<int64_t>> bucket_assignment() const;

 private:
  // SAME FROM STAGE 03: Slot, Bucket and Location
  // One parameter's place in its bucket (as in stage 02).
  struct Slot {
    int64_t param = 0;   // index into params_
    int64_t offset = 0;  // in elements
    int64_t length = 0;  // the parameter's numel()
    tp::Tensor view;     // flat.narrow(0, offset, length).view(shape)
    bool arrived = false;  // per iteration: its gradient is in (reset by finish_backward)
  };
  // [snippet:bucket-state]
  struct Bucket {
    std::vector<Slot> slots;  // in the order the parameters were added
    tp::Tensor flat;          // 1-D, one dtype; what is all-reduced
    // Per iteration (reset by finish_backward):
    size_t pending = 0;       // slots whose gradient has not arrived yet
    std::shared_ptr<tp::distributed::Work> work;  // set when launched
  };
  // [/snippet:bucket-state]
  // Where a parameter lives: buckets_[bucket].slots[slot].
  struct Location {
    size_t bucket = 0;
    size_t slot = 0;
  };
  // END SAME FROM STAGE 03: Slot, Bucket and Location

  void broadcast_from_rank0();
  // Fills buckets_ and locations_ (Note [Bucket assignment], as in stage 02).
  void assign_buckets();
  // The hook of parameter `index`: its gradient is final for this backward.
  void on_gradient_ready(int64_t index, const tp::Tensor& param);
  // The end-of-backward callback: wait, divide, copy back, reset.
  void finish_backward();
  // Throws naming the parameters whose gradient never arrived; resets.
  [[noreturn]] void throw_unfinished();
  static int64_t cap_bytes(double mb) { return static_cast<int64_t>(mb * 1024.0 * 1024.0); }

  // SAME FROM STAGE 03: state constant after construction
  std::shared_ptr<tp::nn::Module> module_;                        // constant after construction
  std::shared_ptr<tp::distributed::ProcessGroup> process_group_;  // constant after construction
  Options options_;                                               // constant after construction
  std::vector<tp::nn::NamedTensor> params_;  // named_parameters(), cached at construction
  std::vector<Bucket> buckets_;              // the layout is constant after construction
  std::vector<Location> locations_;          // [param index], constant after construction
  // END SAME FROM STAGE 03: state constant after construction

  // [snippet:iteration-state]
  // Per iteration, touched by the hooks and the callback on the thread that
  // runs backward; reset at the end of every backward.
  size_t next_bucket_ = 0;         // the next bucket to launch, in index order
  bool callback_queued_ = false;   // finish_backward queued for this backward
  std::string unfinished_;         // set when a backward ended with a bucket unfinished
  // [/snippet:iteration-state]

  // SAME FROM STAGE 03: the hooks, last
  // Last, so the hooks are removed before anything they touch is destroyed.
  std::vector<tp::RemovableHandle> hooks_;
  // END SAME FROM STAGE 03: the hooks, last
};

}  // namespace stage03
