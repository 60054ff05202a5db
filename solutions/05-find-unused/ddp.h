// Stage 05 — DistributedDataParallel with find_unused_parameters.
//
// What it is: stage 04 (buckets all-reduced from autograd hooks while
// backward runs; no_sync for gradient accumulation), for models whose
// forward does not use every parameter every time: a branch taken or not
// depending on the data, a head used only for some inputs. Such a parameter
// gets no gradient, so its hook never runs and its bucket never completes:
// stage 04 stops with an error. With find_unused_parameters = true, forward()
// walks the graph it just built, from the output back to the parameters'
// gradient accumulators (Note [Finding unused parameters] in ddp.cc); the
// parameters it does not reach are filed into their buckets at the first
// hook of backward, with the gradient they hold (accumulated under no_sync)
// or zeros, so every bucket completes. A used-map, one entry per parameter,
// all-reduced after the buckets, tells a parameter unused here but used on
// another rank (it gets the average, as any other) from one unused on every
// rank (it keeps no gradient at all, as in PyTorch, so the optimizer leaves
// it alone).
//
// What it deliberately is not: no static_graph or bucket rebuilding (stage
// 06), no uneven inputs (stage 07).
//
// Contract:
//   - Every rank constructs it with the same architecture and options; a
//     mismatch of the model throws tp::DistributedError on every rank.
//   - find_unused_parameters = false: a synced backward in which a
//     parameter got no gradient throws tp::DistributedError at its end,
//     naming the parameters and the option; every later forward refuses to
//     run. find_unused_parameters = true: any subset of parameters may go
//     without a gradient, on any rank, in any micro-batch. When no
//     parameter went unused on any rank in the first synced backward, rank
//     0 says once, on stderr, that the option costs a graph walk per
//     forward for nothing.
//   - Every rank runs the same sequence of forwards under and outside
//     no_sync (stage 04); guards nest; one backward per forward.
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

namespace stage05 {

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
  // Walk the graph after every synced forward and let the parameters it
  // does not reach complete their buckets (and an all-reduced used-map
  // decide who keeps a gradient). Off by default, as in PyTorch: the walk
  // costs time every step.
  bool find_unused_parameters = false;
};

class DistributedDataParallel;

// SAME FROM STAGE 04: NoSyncGuard
// What no_sync() returns: while it lives, forward() records "do not sync".
// Move-only; destroying it (or the object it was moved into) restores what
// no_sync() found, so guards nest.
class [[nodiscard]] NoSyncGuard {
 public:
  explicit NoSyncGuard(DistributedDataParallel& ddp);
  NoSyncGuard(NoSyncGuard&& other) noexcept;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  ~NoSyncGuard();

 private:
  DistributedDataParallel* ddp_;  // null once moved from
  bool previous_ = true;          // require_backward_grad_sync_ as found
};
// END SAME FROM STAGE 04: NoSyncGuard

class DistributedDataParallel {
 public:
  using Options = stage05::Options;
  // For the kit's trainer: gradients are averaged inside backward, by hooks;
  // no_sync() accumulates; parameters may go unused (with the option);
  // bucket_assignment() lists the buckets.
  static constexpr tp::train::Capabilities capabilities{.syncs_in_backward = true,
                                                        .no_sync = true,
                                                        .unused_parameters = true,
                                                        .buckets = true};

  // Verifies that all ranks hold the same parameter shapes, broadcasts rank
  // 0's parameters (and buffers), assigns the buckets and registers the
  // hooks. Throws tp::Error for a cap that is not positive.
  DistributedDataParallel(std::shared_ptr<tp::nn::Module> module,
                          std::shared_ptr<tp::distributed::ProcessGroup> process_group,
                          Options options = {});
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Runs the wrapped module, and records whether the backward of this
  // forward syncs: yes unless a no_sync() guard is alive. When it syncs and
  // find_unused_parameters is set, also finds the parameters the output does
  // not depend on. Throws if the previous synced backward left a bucket
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

  // Forwards run while the returned guard lives do not sync their
  // backward: gradients accumulate in .grad on this rank only.
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

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
  // The parameters (indices) that `output` does not depend on: a walk of
  // its graph (Note [Finding unused parameters]).
  std::vector<int64_t> unreached_parameters(const tp::Tensor& output) const;
  // Files parameter `index`'s gradient (`grad`; undefined: zeros) into its
  // bucket slot, counts it, and launches every bucket now complete, in
  // order; after the last bucket, the used-map.
  void file_gradient(int64_t index, const tp::Tensor& grad);
  // The end-of-backward callback: wait, divide, copy back, reset.
  void finish_backward();
  // Rank 0's once-only note when no rank left any parameter unused.
  void warn_if_nothing_unused(const float* used) const;
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

  // [snippet:no-sync-state]
  // Set by NoSyncGuard: false while a guard lives.
  bool require_backward_grad_sync_ = true;
  // Recorded by forward() from require_backward_grad_sync_; read by the
  // hooks of that forward's backward (Note [Decided at forward]).
  bool sync_this_backward_ = true;
  // [/snippet:no-sync-state]

  // [snippet:unused-state]
  // With find_unused_parameters (Note [Finding unused parameters]):
  // Set by forward() for a synced backward: the parameters its output does
  // not reach, filed at the first hook.
  std::vector<int64_t> unused_;
  // [p] = 1 once parameter p got a gradient in any backward since the last
  // sync (no_sync ones too); all-reduced (SUM) after the buckets, so that
  // after the sync [p] counts the ranks that used it. float32: what the
  // process group reduces.
  tp::Tensor used_map_;
  std::shared_ptr<tp::distributed::Work> used_map_work_;
  bool warned_all_used_ = false;  // the once-only note about the option's cost
  // [/snippet:unused-state]

  // Per iteration, touched by the hooks and the callback on the thread that
  // runs backward; reset at the end of every synced backward.
  size_t next_bucket_ = 0;         // the next bucket to launch, in index order
  bool callback_queued_ = false;   // finish_backward queued for this backward
  std::string unfinished_;         // set when a backward ended with a bucket unfinished

  friend class NoSyncGuard;

  // SAME FROM STAGE 03: the hooks, last
  // Last, so the hooks are removed before anything they touch is destroyed.
  std::vector<tp::RemovableHandle> hooks_;
  // END SAME FROM STAGE 03: the hooks, last
};

}  // namespace stage05
