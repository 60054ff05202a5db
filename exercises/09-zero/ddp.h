// Copied from solutions/09-zero/ddp.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 09 — DistributedDataParallel as a Joinable, for ZeRO.
//
// What it is: stage 08 (buckets all-reduced from hooks while backward runs,
// rebuilt after the first iteration; no_sync; find_unused_parameters;
// static_graph; comm hooks; join), with join taken apart so that it can
// train next to a sharded optimizer (zero.h): the DDP is a Joinable
// (join.h), whose join hook shadows a synced step and, at the end, sends the
// last joiner's model to every rank; Join runs the loop. join(body) stays,
// as Join over the DDP alone. A joined rank's shadow step now keeps the
// active ranks' average in its gradients, for the optimizer's join hook
// to step its shard with (Note [A joined rank's gradients]).
//
// What it is not: the kit's buckets stay float32 or float64 (what the model
// is); a hook compresses a copy. No hook runs on CUDA (stage 03 is the
// stage that does), and sparse gradients do not exist in the kit. The
// built-in hooks are stage 08's, carried over: default_hooks.h and
// powersgd_hook.h.
//
// Contract:
//   - Every rank constructs it with the same architecture and options; a
//     mismatch of the model throws tp::DistributedError on every rank.
//   - register_comm_hook: at most once, and before the first backward;
//     either mistake throws tp::Error naming the rule. Every rank registers
//     the same hook (or none): their collectives must pair up.
//   - With a hook, the DDP neither all-reduces nor divides a bucket: the
//     hook's future delivers the bucket's final gradients (an average, for
//     the built-in hooks). Its value()[0] must be a tensor of the bucket's
//     shape and dtype: anything else throws tp::DistributedError naming the
//     bucket, and a future that does not complete within the process
//     group's timeout tp::TimeoutError naming the bucket. A future that
//     failed rethrows its own error (a collective's TimeoutError or
//     PeerFailedError, which name the collective and rank).
//   - Without a hook: stage 07 exactly (all-reduce SUM, divide).
//   - Inside a Join (join.h; join() is Join over the DDP alone): every
//     synced forward notifies the Join first (the DDP must be the first
//     joinable). A joined rank's main hook shadows one synced step: every
//     bucket launched zero-filled (through the hook, if one is registered,
//     so its collectives pair up), the used-map where the step sends one,
//     the rebuild where the step rebuilds; then it gives each parameter the
//     active ranks' result, divided as they divide it, and no gradient to a
//     parameter no active rank used (as zero_grad() with set_to_none, the
//     default, leaves it). A hook decides its own divisor:
//     divide_by_initial_world_size = false with a hook is refused at
//     join_hook(), but for the reduce-scatter form's noop_hook (its
//     optimizer divides). The post hook broadcasts the last joiner's
//     parameters.
//   - Otherwise as stage 06: options and behaviour of no_sync, unused
//     parameters, static_graph, rebuilt buckets.
//   - Hooks capture `this`: neither copyable nor movable; the hooks are
//     removed when it is destroyed (it owns their handles).
//   - Not thread-safe. Bucket tensors are touched by the communication
//     thread (and a comm hook's then() callbacks) only between a bucket's
//     launch and the end of that backward.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "grad_bucket.h"
#include "join.h"
#include "tensorplay/distributed/future.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/nn/module.h"
#include "tensorplay/tensor.h"
#include "tensorplay/train/capabilities.h"

namespace stage09 {

// The bfloat16 compression hook (default_hooks.h; defined in
// default_hooks.cc), named here so that register_comm_hook can refuse it
// where the group cannot reduce bfloat16 (Gloo), before any rank issues a
// collective. (PyTorch's register_comm_hook also names it, but asks of the
// build, CUDA 11 and NCCL 2.10, not of the group: lesson 08.)
std::shared_ptr<tp::distributed::Future> bf16_compress_hook(
    tp::distributed::ProcessGroup& process_group, GradBucket& bucket);

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
  // The forward uses the same parameters in every iteration: find them once,
  // in the first synced iteration, and reuse what was found (Note [Static
  // graph]). Implies the walk of find_unused_parameters in that iteration.
  bool static_graph = false;
  // Not read by the DDP's own code but by join(), and by the kit's trainer,
  // which pass them to Join (join.h's JoinOptions): divide the summed
  // gradients by the world size (true, as PyTorch) or by the ranks still
  // training in that step (false); when a rank runs out of inputs, every
  // rank throws at the next synced step instead of shadowing.
  bool divide_by_initial_world_size = true;
  bool throw_on_early_termination = false;
  // Names (as named_parameters() and named_buffers() spell them) of
  // tensors the DDP neither broadcasts nor reduces (Note [Ignored
  // parameters and buffers]). A name the module does not have is an error.
  std::vector<std::string> params_and_buffers_to_ignore;

  // The reduce-scatter form of ZeRO (zero.h): the optimizer reduces the
  // gradients, so the DDP registers noop_hook (default_hooks.h) at
  // construction and accepts no other hook; its buckets only tell who has
  // a gradient. The kit's trainer also builds its ZeroRedundancyOptimizer
  // with it (make_optimizer in stage.h).
  bool reduce_scatter = false;
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

class DistributedDataParallel : public Joinable {
 public:
  using Options = stage09::Options;
  // For the kit's trainer: gradients are averaged inside backward, by hooks;
  // no_sync() accumulates; parameters may go unused (with an option);
  // bucket_assignment() lists the buckets (rebuilt after the first step);
  // register_builtin_hook (stage.h) registers the hook a run names
  // (RunOptions::comm_hook, stage.h);
  // the optimizer is the stage's, sharded (make_optimizer, stage.h), and
  // trains under Join with the DDP (join_with_optimizer, stage.h).
  static constexpr tp::train::Capabilities capabilities{.syncs_in_backward = true,
                                                        .no_sync = true,
                                                        .join = true,
                                                        .unused_parameters = true,
                                                        .buckets = true,
                                                        .comm_hooks = true,
                                                        .sharded_optimizer = true};

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
  // The group the DDP reduces over: what the built-in hooks take as state.
  const std::shared_ptr<tp::distributed::ProcessGroup>& process_group() const {
    return process_group_;
  }
  // The parameter indices (named_parameters() order) of each bucket, in
  // bucket order; within a bucket, in the order they were added.
  std::vector<std::vector<int64_t>> bucket_assignment() const;

  // Forwards run while the returned guard lives do not sync their
  // backward: gradients accumulate in .grad on this rank only.
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // Stage 07's join(body), now Join over the DDP alone with the options'
  // divisor and throw_on_early_termination: runs body (this rank's training
  // loop), then shadows the synced steps of the ranks still training until
  // every rank has joined, then copies the last joiner's parameters to
  // every rank. Throws what body throws; with throw_on_early_termination,
  // tp::DistributedError as soon as any rank has run out.
  void join(const std::function<void()>& body);

  // Joinable (join.h): the main hook shadows a synced step, the post hook
  // broadcasts the last joiner's parameters.
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  tp::distributed::ProcessGroup& join_process_group() override { return *process_group_; }

  // From now on, every bucket is reduced by `hook` instead of the default
  // all-reduce (Note [Comm hooks]). REQUIRES: no hook registered yet and no
  // backward run yet (otherwise tp::Error naming the rule).
  void register_comm_hook(CommHook hook);
  // PyTorch's form, register_comm_hook(state, hook): hook(*state, bucket)
  // is called for each bucket; the DDP keeps `state` alive. State is what
  // the hook remembers between calls (a process group, PowerSGD's
  // matrices). bf16_compress_hook on a group that cannot reduce bfloat16
  // throws tp::Error naming the backend.
  template <typename State, typename Hook>
  void register_comm_hook(std::shared_ptr<State> state, Hook hook) {
    if constexpr (std::is_convertible_v<Hook, BuiltinHook> &&
                  std::is_base_of_v<tp::distributed::ProcessGroup, State>) {
      check_builtin_hook(*state, hook);
    }
    register_comm_hook(CommHook([state = std::move(state), hook](GradBucket& bucket) {
      return hook(*state, bucket);
    }));
  }

 private:
  // A hook of the built-in hooks' form, hook(process_group, bucket).
  using BuiltinHook = std::shared_ptr<tp::distributed::Future> (*)(
      tp::distributed::ProcessGroup& process_group, GradBucket& bucket);
  // Registration's rule for the built-in hooks: bf16_compress_hook where
  // `group` cannot reduce bfloat16 throws tp::Error now, naming the
  // backend, rather than at the first backward on every rank.
  static void check_builtin_hook(const tp::distributed::ProcessGroup& group, BuiltinHook hook);

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
    // Set when launched, one of the two: the default all-reduce's work,
    // or what the comm hook returned.
    std::shared_ptr<tp::distributed::Work> work;
    std::shared_ptr<tp::distributed::Future> future;
  };
  // [/snippet:bucket-state]
  // Where a parameter lives: buckets_[bucket].slots[slot].
  struct Location {
    size_t bucket = 0;
    size_t slot = 0;
  };

  // Fills ignored_ from params_and_buffers_to_ignore; throws for a name
  // the module does not have.
  void mark_ignored();
  size_t ignored_count() const {
    return static_cast<size_t>(std::count(ignored_.begin(), ignored_.end(), 1));
  }
  // Rank 0's parameters and buffers, but the ignored ones, to every rank,
  // coalesced (Note [Coalesced broadcast]).
  void broadcast_from_rank0();
  // Fills buckets_ and locations_ with the parameters in `order` (Note
  // [Bucket assignment], as in stage 02).
  void assign_buckets(const std::vector<int64_t>& order);
  // After the first synced iteration: rank 0's ready order, broadcast, and
  // the buckets reassigned in it (Note [Rebuilding the buckets]).
  void rebuild_buckets();
  // The hook of parameter `index`: its gradient is final for this backward.
  void on_gradient_ready(int64_t index, const tp::Tensor& param);
  // The parameters (indices) that `output` does not depend on: walk_graph,
  // marked on the trace ("graph walk": the checker counts them).
  std::vector<int64_t> unreached_parameters(const tp::Tensor& output);
  // The walk of stage 05 (Note [Finding unused parameters]).
  std::vector<int64_t> walk_graph(const tp::Tensor& output) const;
  // Files parameter `index`'s gradient (`grad`; undefined: zeros) into its
  // bucket slot, counts it, and launches every bucket now complete, in
  // order; after the last bucket, the used-map.
  void file_gradient(int64_t index, const tp::Tensor& grad);
  // Launches bucket b's reduction: the comm hook, or the default all-reduce.
  void launch_bucket(size_t b);
  // Bucket b as a comm hook sees it (grad_bucket.h).
  GradBucket grad_bucket(size_t b) const;
  // Waits for bucket b's hook future (at most the group's timeout) and
  // puts its value in the bucket; throws naming the bucket when the
  // future fails, never completes, or delivers the wrong tensor.
  void take_hook_result(size_t b);
  // Waits for every launched bucket (errors ignored: a backward is being
  // abandoned) and forgets them.
  void drain_launched();
  // True once the bucket has been launched this backward.
  static bool launched(const Bucket& bucket) { return bucket.work || bucket.future; }
  // The end-of-backward callback: wait, divide, copy back, reset.
  void finish_backward();
  // Note [Join]: what to divide by; one shadowed synced step; the final
  // broadcast.
  double divisor() const;
  void shadow_synced_step();
  void sync_final_model(bool last_to_join);
  // Gives each parameter of `bucket` its slot's value (the average), except
  // where `used` (ranks that used it; null: all did) says no rank used it:
  // there a synced step keeps what zero_grad() left, a shadowed one
  // (`shadow`) drops the joined rank's stale gradient.
  void take_averages(Bucket& bucket, const float* used, bool shadow);
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
  std::vector<char> ignored_;  // [param index]: 1 if ignored; constant after construction

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

  // [snippet:first-iteration-state]
  // What the first synced iteration records (Notes [Rebuilding the buckets],
  // [Static graph]).
  int64_t synced_iterations_ = 0;    // synced backward passes finished
  std::vector<int64_t> ready_order_;  // parameters in the order they were filed
  bool rebuilt_ = false;              // the buckets follow rank 0's ready order
  std::vector<int64_t> first_unused_;  // unused in the first synced forward
  // With static_graph, what later iterations reuse instead of asking again:
  std::vector<int64_t> static_unused_;    // unused on this rank
  std::vector<char> static_unused_here_;  // [p]: 1 if p is in static_unused_
  std::vector<float> static_used_;        // [p]: ranks that used p (the used-map)
  // [/snippet:first-iteration-state]

  // [snippet:hook-state]
  CommHook comm_hook_;           // empty: the default all-reduce
  bool backward_seen_ = false;   // a hook has run: too late to register a comm hook
  // [/snippet:hook-state]

  // [snippet:join-state]
  int active_ranks_ = 1;  // ranks still training, as the last notify counted
  // From the Join's options (join_hook): what divisor() divides by.
  bool divide_by_initial_world_size_ = true;
  // [/snippet:join-state]

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

}  // namespace stage09
