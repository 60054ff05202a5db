// Stage 09 — stage 08's DDP as a Joinable, for ZeRO. See ddp.h for the
// contract and lessons/09-zero/README.md for the why.
#include "ddp.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "default_hooks.h"
#include "tensorplay/autograd/engine.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/autograd/node.h"
#include "tensorplay/distributed/broadcast_coalesced.h"
#include "tensorplay/distributed/model_check.h"
#include "tensorplay/error.h"
#include "tensorplay/trace.h"

namespace stage09 {

using tp::Tensor;
using tp::distributed::ReduceOp;

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<tp::nn::Module> module,
    std::shared_ptr<tp::distributed::ProcessGroup> process_group, Options options)
    : module_(std::move(module)),
      process_group_(std::move(process_group)),
      options_(options) {
  // SAME FROM STAGE 02: check the arguments and the model
  TP_CHECK(module_ != nullptr, "stage09 DDP: the module is null; pass the model to wrap");
  TP_CHECK(process_group_ != nullptr,
           "stage09 DDP: the process group is null; call init_process_group first");
  TP_CHECK(options_.bucket_cap_mb > 0 && options_.first_bucket_cap_mb > 0,
           "stage09 DDP: bucket_cap_mb and first_bucket_cap_mb must be positive (got ",
           options_.bucket_cap_mb, " and ", options_.first_bucket_cap_mb,
           "); a tiny cap such as 1e-6 gives one bucket per parameter");
  params_ = module_->named_parameters();
  tp::distributed::verify_same_tensors_on_all_ranks(*process_group_, params_, "stage09 DDP");
  // END SAME FROM STAGE 02: check the arguments and the model
  used_map_ = tp::zeros({static_cast<int64_t>(params_.size())}, tp::kFloat32);
  mark_ignored();
  broadcast_from_rank0();
  std::vector<int64_t> reverse_registration;
  for (auto p = static_cast<int64_t>(params_.size()) - 1; p >= 0; --p) {
    if (!ignored_[static_cast<size_t>(p)]) reverse_registration.push_back(p);
  }
  assign_buckets(reverse_registration);
  // One hook per parameter the DDP reduces. It captures `this`, which is
  // why this class can be neither copied nor moved, and why hooks_ is its
  // last member. An ignored parameter gets none: its gradient stays local.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ignored_[i]) continue;
    hooks_.push_back(params_[i].second.register_post_accumulate_grad_hook(
        [this, i](const Tensor& param) { on_gradient_ready(static_cast<int64_t>(i), param); }));
  }
  // The reduce-scatter form: the optimizer reduces, so the buckets go
  // through noop_hook untouched (Note [The reduce-scatter form] in zero.cc).
  if (options_.reduce_scatter) {
    comm_hook_ = [group = process_group_](GradBucket& bucket) { return noop_hook(*group, bucket); };
  }
}

// Note [Ignored parameters and buffers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// params_and_buffers_to_ignore names tensors the DDP leaves alone: an
// ignored parameter is not broadcast at construction, has no bucket slot
// and no gradient hook, so its gradient stays this rank's own; an ignored
// buffer is not broadcast. PyTorch uses it for parameters another wrapper
// synchronises (a model-parallel shard, an embedding table sharded by
// hand). The indices of bucket_assignment() still count every parameter,
// ignored ones included, so that they name the same parameters as
// named_parameters().
void DistributedDataParallel::mark_ignored() {
  ignored_.assign(params_.size(), 0);
  const std::vector<tp::nn::NamedTensor> buffers = module_->named_buffers();
  for (const std::string& name : options_.params_and_buffers_to_ignore) {
    bool found = false;
    for (size_t p = 0; p < params_.size(); ++p) {
      if (params_[p].first == name) ignored_[p] = found = true;
    }
    for (const auto& [buffer_name, buffer] : buffers) {
      if (buffer_name == name) found = true;
    }
    if (!found) {
      std::string known;
      for (const auto& [n, t] : params_) known += (known.empty() ? "" : ", ") + n;
      for (const auto& [n, t] : buffers) known += ", " + n;
      TP_THROW(tp::Error, "stage09 DDP: params_and_buffers_to_ignore names '", name,
               "', which is neither a parameter nor a buffer of the module (it has ", known, ")");
    }
  }
}

// Note [Coalesced broadcast]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Stages 01-07 broadcast rank 0's model one tensor at a time: a collective,
// with its fixed cost, per parameter and per buffer. Here they go as
// PyTorch's DDP sends them: packed into flat chunks of at most 250 MiB (one
// dtype each), one broadcast per chunk (tp::distributed::broadcast_coalesced).
// A model of a few MiB is one broadcast.
void DistributedDataParallel::broadcast_from_rank0() {
  std::vector<Tensor> states;
  for (size_t p = 0; p < params_.size(); ++p) {
    if (!ignored_[p]) states.push_back(params_[p].second);
  }
  if (options_.broadcast_buffers) {
    for (const auto& [name, buffer] : module_->named_buffers()) {
      const auto& skip = options_.params_and_buffers_to_ignore;
      if (std::find(skip.begin(), skip.end(), name) == skip.end()) states.push_back(buffer);
    }
  }
  tp::distributed::broadcast_coalesced(*process_group_, states);
}

// SAME FROM STAGE 06: bucket assignment in a given order
// Note [Bucket assignment] is stage 02's (solutions/02-bucketing/ddp.cc): a
// bucket closes once it holds at least its cap (first_bucket_cap_mb for the
// first of each dtype), one dtype per bucket. Here the parameters come in `order`: reverse
// registration order at construction, the order their gradients became ready
// after the first iteration (Note [Rebuilding the buckets]).
void DistributedDataParallel::assign_buckets(const std::vector<int64_t>& order) {
  struct Open {
    std::vector<int64_t> params;
    int64_t bytes = 0;
    bool closed_one = false;  // this dtype has closed a bucket: the next gets bucket_cap_mb
  };
  std::map<tp::Dtype, Open> open;  // the bucket being filled, per dtype
  locations_.resize(params_.size());
  auto close = [&](std::vector<int64_t> members) {
    const Tensor& first = params_[static_cast<size_t>(members.front())].second;
    int64_t numel = 0;
    for (int64_t p : members) numel += params_[static_cast<size_t>(p)].second.numel();
    Bucket bucket;
    // On the parameters' device: on a GPU the bucket is filled by the
    // compute stream and all-reduced by the communication stream.
    bucket.flat = tp::zeros({numel}, first.dtype(), first.device());
    int64_t offset = 0;
    for (int64_t p : members) {
      const Tensor& param = params_[static_cast<size_t>(p)].second;
      locations_[static_cast<size_t>(p)] = {buckets_.size(), bucket.slots.size()};
      bucket.slots.push_back(
          {p, offset, param.numel(), bucket.flat.narrow(0, offset, param.numel()).view(param.shape())});
      offset += param.numel();
    }
    bucket.pending = bucket.slots.size();
    buckets_.push_back(std::move(bucket));
  };
  buckets_.clear();
  for (int64_t p : order) {
    const Tensor& param = params_[static_cast<size_t>(p)].second;
    Open& bucket = open[param.dtype()];
    bucket.params.push_back(p);
    bucket.bytes += static_cast<int64_t>(param.nbytes());
    const double cap = bucket.closed_one ? options_.bucket_cap_mb : options_.first_bucket_cap_mb;
    if (bucket.bytes >= cap_bytes(cap)) {
      close(std::move(bucket.params));
      bucket.params.clear();  // a moved-from vector is valid but unspecified
      bucket.bytes = 0;
      bucket.closed_one = true;
    }
  }
  for (auto& [dtype, bucket] : open) {
    if (!bucket.params.empty()) close(std::move(bucket.params));
  }
}
// END SAME FROM STAGE 06: bucket assignment in a given order

// SAME FROM STAGE 02: bucket_assignment()
std::vector<std::vector<int64_t>> DistributedDataParallel::bucket_assignment() const {
  std::vector<std::vector<int64_t>> out;
  for (const Bucket& bucket : buckets_) {
    out.emplace_back();
    for (const Slot& slot : bucket.slots) out.back().push_back(slot.param);
  }
  return out;
}
// END SAME FROM STAGE 02: bucket_assignment()

// SAME FROM STAGE 04: Note [Decided at forward]
// Note [Decided at forward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Whether a backward syncs is decided when its forward runs, and recorded
// there; the hooks read the record, never the guard. Three reasons:
//   - The idiom `{ auto g = ddp.no_sync(); loss = loss_fn(ddp(x), y); }
//     loss.backward();` ends the guard before backward. The forward is what
//     the user put under no_sync; its backward must not sync.
//   - The hooks need the answer at the first gradient, and every rank must
//     give the same one: the forward is where each rank's program says which
//     micro-batch it is on. Deciding at forward also gives later stages the
//     place to prepare a synced backward (stage 05 walks the forward's graph
//     there; PyTorch's reducer does both in prepare_for_backward).
//   - A decision read inside backward changes halfway if another thread
//     takes or drops a guard while backward runs; a record cannot.
// A backward that does not sync leaves .grad to the autograd engine, which
// adds each micro-batch's gradient into it in place (with
// gradient_as_bucket_view that is the bucket slot itself). The next synced
// backward then moves the sum into the buckets as stage 03 moves a single
// gradient: one all-reduce per bucket for all K micro-batches.
// END SAME FROM STAGE 04: Note [Decided at forward]
// SAME FROM STAGE 05: NoSyncGuard's constructor
NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp) : ddp_(&ddp) {
  // Until this guard is destroyed, forwards record "do not sync" (stage 04).
  previous_ = ddp.require_backward_grad_sync_;
  ddp.require_backward_grad_sync_ = false;
}
// END SAME FROM STAGE 05: NoSyncGuard's constructor

// SAME FROM STAGE 04: NoSyncGuard's move and destructor
NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : ddp_(std::exchange(other.ddp_, nullptr)), previous_(other.previous_) {}

NoSyncGuard::~NoSyncGuard() {
  // What the constructor found, not `true`: leaving an inner guard must not
  // end an outer one. A moved-from guard (ddp_ null) does nothing.
  if (ddp_ != nullptr) ddp_->require_backward_grad_sync_ = previous_;
}
// END SAME FROM STAGE 04: NoSyncGuard's move and destructor

Tensor DistributedDataParallel::forward([[maybe_unused]] const Tensor& input) {
  if (!unfinished_.empty()) {
    TP_THROW(tp::DistributedError, "stage09 DDP: rank ", process_group_->rank(),
             ": the previous backward did not finish reducing gradients (", unfinished_,
             "); every parameter must get a gradient in every backward, or construct the DDP "
             "with find_unused_parameters = true");
  }
  sync_this_backward_ = require_backward_grad_sync_;
  // Inside join(), a forward whose backward syncs first tells the ranks that
  // this one is still training (Note [Join]).
  if (sync_this_backward_ && join_context() != nullptr) active_ranks_ = notify_join_context(*this);
  Tensor output = module_->forward(input);
  // The unused parameters, as stage 06 (with static_graph, once).
  if (sync_this_backward_) {
    if (options_.static_graph && synced_iterations_ > 0) {
      unused_ = static_unused_;
    } else if (options_.static_graph || options_.find_unused_parameters) {
      unused_ = unreached_parameters(output);
      // An ignored parameter has no slot to file (Note [Ignored parameters
      // and buffers]).
      std::erase_if(unused_, [this](int64_t p) { return ignored_[static_cast<size_t>(p)] != 0; });
    }
  }
  return output;
}

// SAME FROM STAGE 06: Note [Static graph] and the counted walk
// Note [Static graph]
// ~~~~~~~~~~~~~~~~~~~
// find_unused_parameters pays twice in every step: a walk of the graph after
// the forward, and an all-reduce of the used-map after the buckets. Both
// answer questions whose answers, for most models, never change: which
// parameters this rank's forward leaves unused, and which no rank uses.
// static_graph = true promises they do not change, and the DDP asks them
// once: in the first synced iteration it walks the graph and all-reduces the
// used-map as stage 05 does, and keeps both answers (static_unused_,
// static_used_). Every later synced iteration files the same unused
// parameters at its first hook, leaves the same parameters without a
// gradient, and communicates nothing but its buckets.
//
// A promise can be broken. A parameter recorded as unused whose gradient
// arrives anyway, or a parameter recorded as used whose gradient does not,
// means the graph changed: the buckets and the used-map of the first
// iteration no longer describe this one. Both are detected on the rank that
// sees them (in the hook; at the end of backward) and thrown as clear errors;
// never averaged silently with a stale map.
std::vector<int64_t> DistributedDataParallel::unreached_parameters(const Tensor& output) {
  // Counted on the trace: with static_graph, only the first synced forward
  // walks.
  tp::trace::Span span("graph walk", "ddp");
  return walk_graph(output);
}
// END SAME FROM STAGE 06: Note [Static graph] and the counted walk

// SAME FROM STAGE 05: Note [Finding unused parameters]
// Note [Finding unused parameters]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A parameter's hook runs when backward accumulates its gradient. One the
// output does not depend on gets no gradient, its hook never runs, and its
// bucket never completes: every rank would wait for it. The forward knows
// which parameters those are, because it built the graph backward will
// run: starting from the output's grad_fn and following next_functions, the
// walk reaches the AccumulateGrad node of every parameter the output
// depends on (each records its parameter: variable()). Whatever it does not
// reach gets no gradient in this backward. Starting anywhere else is wrong:
// from the parameters, every one of them "reaches" its own accumulator.
//
// Those parameters are filed into their buckets at the first hook of the
// backward, not in forward: filed in forward, a bucket made only of unused
// parameters would be launched before backward has even begun, ahead of
// buckets the hooks fill later, and a forward run to evaluate, never
// followed by a backward, would leave all-reduces in flight. Filed at the
// first hook, they are in their slots before the hooks that complete their
// buckets run. A filed parameter brings what its .grad holds: zeros when it
// has none, or what it accumulated under no_sync in earlier micro-batches
// of the step (its hooks ran then, and the used-map remembers it).
//
// Zeros are right for the average but not for a parameter no rank used:
// PyTorch leaves such a parameter without a gradient, so that the optimizer
// skips it (no momentum, no weight decay) instead of stepping it with a
// zero gradient. Telling the two apart takes one more all-reduce: the
// used-map, 1 where a parameter got a gradient on this rank since the last
// sync, summed over the ranks. It is launched right after the last bucket
// (every rank then issues the same all-reduces in the same order), and read
// at the end of backward: a parameter with a count of 0 keeps no gradient.
// END SAME FROM STAGE 05: Note [Finding unused parameters]
// SAME FROM STAGE 06: the graph walk
std::vector<int64_t> DistributedDataParallel::walk_graph(const Tensor& output) const {
  // As stage 05: from the output's grad_fn to the accumulators.
  std::set<const tp::TensorImpl*> reached;
  std::set<const tp::autograd::Node*> seen;
  std::vector<const tp::autograd::Node*> stack;
  if (output.grad_fn()) stack.push_back(output.grad_fn().get());
  while (!stack.empty()) {
    const tp::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;  // shared subgraphs: visit once
    if (const auto* sink = dynamic_cast<const tp::autograd::AccumulateGrad*>(node)) {
      reached.insert(sink->variable().impl());
    }
    for (const auto& next : node->next_functions()) {
      if (next) stack.push_back(next.get());
    }
  }
  std::vector<int64_t> unreached;
  for (size_t p = 0; p < params_.size(); ++p) {
    if (reached.count(params_[p].second.impl()) == 0) unreached.push_back(static_cast<int64_t>(p));
  }
  return unreached;
}
// END SAME FROM STAGE 06: the graph walk

// SAME FROM STAGE 03: Note [Overlap]
// Note [Overlap]
// ~~~~~~~~~~~~~~
// The autograd engine runs a parameter's post-accumulate-grad hook the moment
// its gradient is final, and it finishes the last layer's parameters first
// (Note [Ready order] in common/src/autograd/engine.cc). Buckets are filled in
// that same order, so bucket 0 is usually complete after a few hooks, and its
// all-reduce can travel while the engine computes every earlier layer. The
// hook launches (queues) it and returns at once; only the end-of-backward
// callback waits. Two rules keep the ranks in step:
//   - Launch strictly in bucket order: bucket b's all-reduce leaves only
//     after buckets 0..b-1 have, even if b happened to complete first. Every
//     rank then issues the same all-reduces in the same order, whatever order
//     its hooks ran in; launching "whatever is complete" could pair rank 0's
//     bucket 1 with rank 1's bucket 2 (or hang).
//   - Never wait in a hook: a wait there blocks the engine until the bucket
//     has crossed the network, which is exactly the serialisation overlap
//     removes.
// With gradient_as_bucket_view, the first time a gradient arrives in a step
// it is copied into its slot and the parameter's .grad is pointed at the
// slot; the average then lands in .grad without a copy back.
// END SAME FROM STAGE 03: Note [Overlap]
void DistributedDataParallel::on_gradient_ready(int64_t index, const Tensor& param) {
  tp::trace::Span span("hook", "ddp", {{"param", index}});
  backward_seen_ = true;  // too late for register_comm_hook from now on
  used_map_.data_ptr<float>()[index] = 1.0f;  // used since the last sync, no_sync or not
  if (!sync_this_backward_) return;  // accumulate locally (Note [Decided at forward])
  if (options_.static_graph && synced_iterations_ > 0 && static_unused_here_[index]) {
    TP_THROW(tp::DistributedError, "stage09 DDP: rank ", process_group_->rank(),
             ": static_graph: parameter ", index, " (", params_[static_cast<size_t>(index)].first,
             ") got a gradient, but the first iteration found it unused on this rank: the "
             "graph changed, or the record of the first iteration (static_unused_here_) is "
             "not what it found (Note [Static graph]); with parameters that are used in some "
             "iterations and not in others, pass find_unused_parameters = true instead");
  }
  if (!callback_queued_) {
    callback_queued_ = true;
    tp::autograd::queue_callback([this] { finish_backward(); });
    // The first hook of a synced backward files the unused parameters
    // (stage 05, Note [Finding unused parameters]).
    for (int64_t unused : unused_) {
      file_gradient(unused, params_[static_cast<size_t>(unused)].second.grad());
    }
    if (synced_iterations_ == 0) first_unused_ = unused_;  // static_graph keeps it
    unused_.clear();
  }
  file_gradient(index, param.grad());
}

void DistributedDataParallel::file_gradient(int64_t index, const Tensor& grad) {
  const Location at = locations_[static_cast<size_t>(index)];
  Bucket& bucket = buckets_[at.bucket];
  Slot& slot = bucket.slots[at.slot];
  TP_CHECK(!slot.arrived, "stage09 DDP: parameter ", index, " (",
           params_[static_cast<size_t>(index)].first,
           ") reached its bucket twice before the bucket was reduced: its hook ran although "
           "the forward found it unused, or it ran twice in one backward");
  slot.arrived = true;
  if (!rebuilt_) ready_order_.push_back(index);  // Note [Rebuilding the buckets]
  if (!grad.defined()) {
    slot.view.zero_();  // unused here: this rank adds nothing
  } else if (!grad.is_alias_of(bucket.flat)) {
    slot.view.copy_(grad);
    if (options_.gradient_as_bucket_view) params_[static_cast<size_t>(index)].second.set_grad(slot.view);
  }
  --bucket.pending;
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    launch_bucket(next_bucket_++);
  }
  // After the last bucket, on every rank in the same place: the used-map
  // (with static_graph, in the first synced iteration only).
  const bool wants_used_map = options_.static_graph ? synced_iterations_ == 0
                                                    : options_.find_unused_parameters;
  if (next_bucket_ == buckets_.size() && wants_used_map && !used_map_work_) {
    used_map_work_ = process_group_->allreduce(used_map_, ReduceOp::SUM);
  }
}

// Note [Comm hooks]
// ~~~~~~~~~~~~~~~~~
// Stages 03-07 decide how a bucket is reduced: all-reduce SUM, then divide
// by the world size. Everything around that (which gradients go in which
// bucket, when a bucket is launched, waiting at the end of backward,
// copying back) is bookkeeping that does not care how the numbers travel.
// A comm hook takes over exactly the reduction: when a bucket is complete,
// the DDP hands it to the hook as a GradBucket and keeps the future the
// hook returns; at the end of backward it waits for each future in bucket
// order and takes value()[0] as the bucket's gradients, divided already.
// What travels is the hook's business: the bucket as it is (allreduce_hook),
// a float16 copy (fp16_compress_hook: half the bytes), or two thin matrices
// per weight (powerSGD_hook).
//
// The rules that keep this correct are the DDP's, not the hook's:
//   - A hook is called where stage 03 launched the all-reduce: strictly in
//     bucket order, from the backward thread, never waiting. Whatever
//     collectives the hook issues are then issued in the same order on
//     every rank, because every rank calls the same hook on the same
//     bucket in the same order.
//   - The DDP reads the result only after its future completed: a hook's
//     then() callback runs on the communication thread, so the bucket is
//     being written until then.
//   - The divisor is the hook's (the built-in ones divide by the world
//     size). The DDP divides nothing a hook returns.
//   - A future that never completes (a hook that forgot to launch
//     anything, or a future made by hand and never set) would leave backward
//     waiting forever; the DDP waits at most the process group's timeout
//     and then names the bucket.
//   - A hook may only be registered before the first backward: the buckets
//     of a backward already under way were launched by the previous rule,
//     and the hook's state (PowerSGD counts iterations from the first) would
//     start in the middle.
// A joined rank (Note [Join]) runs the hook on zero-filled buckets, so that
// the hook's collectives, however many a hook issues, pair with the active
// ranks'. This is what PyTorch's join hook does.
void DistributedDataParallel::register_comm_hook(CommHook hook) {
  TP_CHECK(hook != nullptr, "stage09 DDP: register_comm_hook: the hook is empty; pass a "
           "callable that takes a GradBucket& and returns a future");
  TP_CHECK(!options_.reduce_scatter, "stage09 DDP: register_comm_hook: the reduce-scatter form "
           "(Options::reduce_scatter) reduces in the optimizer and has registered noop_hook; a "
           "second reduction would send every gradient twice");
  TP_CHECK(!comm_hook_, "stage09 DDP: register_comm_hook: a comm hook is already registered; "
           "a DDP takes one hook, registered once (as PyTorch's register_comm_hook)");
  TP_CHECK(!backward_seen_, "stage09 DDP: register_comm_hook: a backward has already run; "
           "register the hook before the first backward, right after constructing the DDP "
           "(Note [Comm hooks])");
  comm_hook_ = std::move(hook);
}

void DistributedDataParallel::check_builtin_hook(const tp::distributed::ProcessGroup& group,
                                                 BuiltinHook hook) {
  TP_CHECK(hook != &bf16_compress_hook || group.can_reduce(tp::kBFloat16),
           "stage09 DDP: register_comm_hook: bf16_compress_hook all-reduces bfloat16, and the '",
           group.backend_name(), "' backend has no bfloat16 reduction; use fp16_compress_hook "
           "(the same bytes) on it, or a backend that reduces bfloat16 (nccl, on GPUs)");
}

GradBucket DistributedDataParallel::grad_bucket(size_t b) const {
  const Bucket& bucket = buckets_[b];
  std::vector<Tensor> gradients;
  std::vector<Tensor> parameters;
  for (const Slot& slot : bucket.slots) {
    gradients.push_back(slot.view);
    parameters.push_back(params_[static_cast<size_t>(slot.param)].second);
  }
  return GradBucket(b, b + 1 == buckets_.size(), bucket.flat, std::move(gradients),
                    std::move(parameters));
}

void DistributedDataParallel::launch_bucket(size_t b) {
  Bucket& bucket = buckets_[b];
  if (!comm_hook_) {
    bucket.work = process_group_->allreduce(bucket.flat, ReduceOp::SUM);
    return;
  }
  GradBucket view = grad_bucket(b);
  tp::trace::Span span("comm hook", "ddp", {{"bucket", static_cast<int64_t>(b)}});
  bucket.future = comm_hook_(view);
  if (!bucket.future) {
    TP_THROW(tp::DistributedError, "stage09 DDP: rank ", process_group_->rank(),
             ": the comm hook returned no future for bucket ", b,
             "; a hook launches the bucket's reduction and returns its future (Note [Comm hooks])");
  }
}

void DistributedDataParallel::take_hook_result(size_t b) {
  Bucket& bucket = buckets_[b];
  std::shared_ptr<tp::distributed::Future> future = std::move(bucket.future);
  const auto timeout = process_group_->timeout();
  if (!future->wait_for(timeout)) {
    TP_THROW(tp::TimeoutError, "stage09 DDP: rank ", process_group_->rank(),
             ": the comm hook's future for bucket ", b, " did not complete within ",
             timeout.count(), " ms; does the hook return the future of a collective it "
             "launched (a future made by hand must be set_value'd)?");
  }
  const tp::distributed::Future::Value value = future->wait();  // rethrows a failure
  const Tensor result = value.empty() ? Tensor() : value[0];
  if (!result.defined() || result.shape() != bucket.flat.shape() ||
      result.dtype() != bucket.flat.dtype()) {
    TP_THROW(tp::DistributedError, "stage09 DDP: rank ", process_group_->rank(),
             ": the comm hook's future for bucket ", b, " delivered ",
             result.defined() ? tp::detail::cat("a ", tp::to_string(result.dtype()), " tensor of shape ",
                                                tp::to_string(result.shape()))
                              : std::string("no tensor"),
             "; value()[0] must be the bucket's gradients, a ", tp::to_string(bucket.flat.dtype()),
             " tensor of shape ", tp::to_string(bucket.flat.shape()), " (a compressing hook "
             "decompresses into bucket.buffer() before its future completes)");
  }
  // The built-in hooks return the bucket itself: nothing to copy.
  if (result.data_ptr() != bucket.flat.data_ptr()) bucket.flat.copy_(result);
}

void DistributedDataParallel::drain_launched() {
  for (Bucket& bucket : buckets_) {
    if (bucket.work) bucket.work->wait();
    if (bucket.future && bucket.future->wait_for(process_group_->timeout())) bucket.future->wait();
    bucket.work.reset();
    bucket.future.reset();
  }
}

void DistributedDataParallel::finish_backward() {
  if (!sync_this_backward_) {
    TP_THROW(tp::DistributedError, "stage09 DDP: rank ", process_group_->rank(),
             ": the end-of-backward callback ran in a backward whose forward ran under "
             "no_sync; the hooks of such a backward must return before queueing or filing "
             "anything (do they read what forward() recorded, not whether a guard is alive "
             "now?)");
  }
  // The hooks launch in bucket order, so every bucket has been launched
  // exactly when next_bucket_ has passed them all.
  if (next_bucket_ < buckets_.size()) throw_unfinished();
  const float* used = nullptr;  // [p]: ranks that used p; null without the option
  if (used_map_work_) {
    used_map_work_->wait();
    used_map_work_.reset();
    used = used_map_.data_ptr<float>();
  } else if (options_.static_graph) {
    used = static_used_.data();  // what the first iteration found (Note [Static graph])
  }
  // Wait, divide, give each parameter its average; none where no rank used
  // it (stage 05). With a comm hook, its future's value is the average.
  // Bucket by bucket, so each bucket's copies run while later buckets are
  // still in flight.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (bucket.future) {
      take_hook_result(b);
    } else {
      bucket.work->wait();
      bucket.work.reset();
      bucket.flat.div_(divisor());
    }
    take_averages(bucket, used, /*shadow=*/false);
  }
  for (Bucket& bucket : buckets_) {
    for (Slot& slot : bucket.slots) slot.arrived = false;
    bucket.pending = bucket.slots.size();
  }
  if (options_.find_unused_parameters && !options_.static_graph && used != nullptr &&
      !warned_all_used_) {
    warned_all_used_ = true;
    warn_if_nothing_unused(used);
  }
  if (synced_iterations_ == 0) {
    if (options_.static_graph) {
      static_used_.assign(used, used + params_.size());
      static_unused_here_.assign(params_.size(), 0);
      for (int64_t p : first_unused_) static_unused_here_[static_cast<size_t>(p)] = 1;
      static_unused_ = first_unused_;
    }
    if (options_.static_graph || !options_.find_unused_parameters) rebuild_buckets();
  }
  ready_order_.clear();
  ++synced_iterations_;
  used_map_.zero_();
  next_bucket_ = 0;
  callback_queued_ = false;
}

// SAME FROM STAGE 06: Note [Rebuilding the buckets]
// Note [Rebuilding the buckets]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The constructor fills the buckets in reverse registration order, a guess
// at the order backward produces gradients. The guess is wrong whenever a
// module registers its layers in another order than forward uses them (a
// decoder built before the encoder, a shared head registered first): then a
// bucket waits for a gradient that comes late, and everything after it
// waits too, though their gradients are long ready. The first synced
// iteration shows the real order: the order in which gradients were filed
// (the unused parameters first, at the first hook, then hook after hook).
// After it, the buckets are rebuilt in that order with the same caps, as
// PyTorch's reducer does after its first iteration unless it is finding
// unused parameters every step (then the order may change from step to
// step, and it keeps the buckets it has).
//
// Each rank records its own order, and they may differ (a rank whose
// forward left other parameters unused files them first). Buckets that
// differ between ranks would pair different all-reduces, so rank 0's order
// is broadcast and every rank rebuilds from it. With gradient_as_bucket_view
// the .grad of each parameter is a view of the old bucket: its value is
// copied into the new slot and .grad pointed there.
// END SAME FROM STAGE 06: Note [Rebuilding the buckets]
void DistributedDataParallel::rebuild_buckets() {
  // The parameters in buckets: all but the ignored ones.
  const size_t managed = params_.size() - ignored_count();
  Tensor order = tp::zeros({static_cast<int64_t>(managed)}, tp::kFloat64);
  std::vector<int64_t> mine = ready_order_;
  if (mine.size() != managed) {
    // A rank that joined before its first synced step filed nothing: it
    // offers the order it has (only rank 0's counts).
    mine.clear();
    for (const auto& bucket : bucket_assignment()) mine.insert(mine.end(), bucket.begin(), bucket.end());
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    order.data_ptr<double>()[i] = static_cast<double>(mine[i]);
  }
  process_group_->broadcast(order, /*root=*/0)->wait();
  std::vector<int64_t> rank0_order;
  for (size_t i = 0; i < managed; ++i) {
    rank0_order.push_back(static_cast<int64_t>(order.data_ptr<double>()[i]));
  }
  std::vector<Tensor> grads;  // the averages, before the old buckets go
  for (const auto& [name, param] : params_) grads.push_back(param.grad());
  assign_buckets(rank0_order);
  if (options_.gradient_as_bucket_view) {
    for (size_t p = 0; p < params_.size(); ++p) {
      if (ignored_[p]) continue;  // not in a bucket: its gradient is its own
      if (!grads[p].defined()) continue;  // no rank used it: it keeps no gradient
      const Location at = locations_[p];
      Slot& slot = buckets_[at.bucket].slots[at.slot];
      slot.view.copy_(grads[p]);
      params_[p].second.set_grad(slot.view);
    }
  }
  rebuilt_ = true;
}

// Note [Join]
// ~~~~~~~~~~~
// With uneven inputs, one rank runs out of batches while the others still
// train. Stage 07's join(body) kept it issuing what a synced step issues;
// here that loop is Join's (Note [Join over joinables] in join.cc), and the
// DDP says, through its join hook, what its part of a shadowed iteration is.
//
// Every synced forward inside a Join first notifies it (the DDP is the
// first joinable, so its notify is the all-reduce of a 1 that counts the
// ranks still training). A joined rank's main hook then issues exactly what
// a synced step issues after that all-reduce, in the same order, with
// nothing to contribute: every bucket's reduction filled with zeros (through
// the comm hook, if there is one), the used-map (zeros) where the step
// all-reduces one, and the broadcast of the bucket rebuild where the step
// rebuilds. Miss one and the ranks' collectives stop pairing up.
//
// The average: the active ranks sum their gradients and the joined ranks'
// zeros, and divide by the initial world size (PyTorch's default,
// divide_by_initial_world_size = true: a step with fewer ranks moves the
// model less, as if the missing ranks' gradients were zeros), or by the
// ranks still training, which the notify all-reduce has just counted.
//
// Note [A joined rank's gradients]
// In stage 07 the joined rank threw the result away: it no longer stepped,
// and the last joiner's broadcast repaired its model at the end (the post
// hook still does, below). Next to a sharded optimizer it must step, its
// shard of the model being nobody else's (Note [A joined rank's shard] in
// zero.cc), so its shadow step ends as a synced backward ends: each
// parameter gets the active ranks' average, divided as they divide it, and
// a parameter no active rank used gets none.
double DistributedDataParallel::divisor() const {
  // Outside a Join every rank trains: the two rules agree.
  if (join_context() == nullptr || divide_by_initial_world_size_) return process_group_->size();
  return active_ranks_;
}

void DistributedDataParallel::join(const std::function<void()>& body) {
  Join join({this}, JoinOptions{.enable = true,
                                .throw_on_early_termination = options_.throw_on_early_termination,
                                .divide_by_initial_world_size =
                                    options_.divide_by_initial_world_size});
  join.run(body);
}

std::unique_ptr<JoinHook> DistributedDataParallel::join_hook(const JoinOptions& options) {
  // noop_hook divides nothing: the reduce-scatter form's optimizer does.
  TP_CHECK(!comm_hook_ || options_.reduce_scatter || options.divide_by_initial_world_size,
           "stage09 DDP: a Join with a comm hook and divide_by_initial_world_size = false: the "
           "hook decides what to divide by (the built-in hooks divide by the world size), so "
           "the option would be silently ignored; keep the default, true, or divide inside "
           "your hook");
  // EXERCISE: the DDP's part of a Join (Note [Join over joinables]): a hook
  // whose main hook shadows one synced step and whose post hook makes every
  // replica the last joiner's. Keep how the Join divides, and start with
  // every rank training.
  // BEGIN SOLUTION
  struct DDPJoinHook : JoinHook {
    DistributedDataParallel& ddp;
    explicit DDPJoinHook(DistributedDataParallel& d) : ddp(d) {}
    void main_hook() override { ddp.shadow_synced_step(); }
    void post_hook(bool is_last_joiner) override { ddp.sync_final_model(is_last_joiner); }
  };
  divide_by_initial_world_size_ = options.divide_by_initial_world_size;
  active_ranks_ = process_group_->size();
  return std::make_unique<DDPJoinHook>(*this);
  // END SOLUTION
}

void DistributedDataParallel::shadow_synced_step() {
  // SAME FROM STAGE 07: the shadow step's span
  // One span per synced step of the others that this joined rank shadows:
  // the `s` of the demo's --trace timeline, "shadow step" in Perfetto.
  tp::trace::Span span("shadow step", "ddp", {{"iteration", synced_iterations_}});
  // END SAME FROM STAGE 07: the shadow step's span
  tp::NoGradGuard no_grad;
  // The Join's count of this iteration, taken by its loop on this rank.
  active_ranks_ = join_context()->active_ranks();
  // Nothing to add: the active ranks' sum is theirs. Each bucket is
  // launched as a synced step launches it, through the comm hook if there
  // is one, so that every collective the hook issues pairs up (Note [Comm
  // hooks]).
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].flat.zero_();
    launch_bucket(b);
  }
  std::shared_ptr<tp::distributed::Work> used_map_work;
  const bool wants_used_map = options_.static_graph ? synced_iterations_ == 0
                                                    : options_.find_unused_parameters;
  if (wants_used_map) {
    used_map_.zero_();
    used_map_work = process_group_->allreduce(used_map_, ReduceOp::SUM);
  }
  // EXERCISE: the shadow step ends as a synced backward ends (Note [A
  // joined rank's gradients]): wait for every bucket, and give each
  // parameter what the active ranks give theirs.
  // BEGIN SOLUTION
  const float* used = nullptr;  // [p]: active ranks that used p; null: all did
  if (used_map_work) {
    used_map_work->wait();
    used = used_map_.data_ptr<float>();
  } else if (options_.static_graph) {
    used = static_used_.data();
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].future) {
      take_hook_result(b);
    } else {
      buckets_[b].work->wait();
      buckets_[b].work.reset();
      buckets_[b].flat.div_(divisor());
    }
    take_averages(buckets_[b], used, /*shadow=*/true);
  }
  // END SOLUTION
  if (synced_iterations_ == 0) {
    if (options_.static_graph) {
      // What the active ranks used: a later Join in which this rank trains
      // again reuses it (Note [Static graph]).
      static_used_.assign(used_map_.data_ptr<float>(),
                          used_map_.data_ptr<float>() + params_.size());
      static_unused_here_.assign(params_.size(), 0);
    }
    if (options_.static_graph || !options_.find_unused_parameters) rebuild_buckets();
  }
  used_map_.zero_();
  ++synced_iterations_;
}

void DistributedDataParallel::take_averages(Bucket& bucket, const float* used, bool shadow) {
  for (Slot& slot : bucket.slots) {
    const Tensor& param = params_[static_cast<size_t>(slot.param)].second;
    if (used != nullptr && used[slot.param] == 0.0f) {
      // No rank used it. A synced step leaves such a gradient as
      // zero_grad() did; a joined rank's is still its last step's: drop it.
      if (shadow) param.set_grad(Tensor());
      continue;
    }
    if (options_.gradient_as_bucket_view) {
      if (!param.grad().is_alias_of(bucket.flat)) param.set_grad(slot.view);
    } else if (param.grad().defined()) {
      param.grad().copy_(slot.view);
    } else {
      param.set_grad(slot.view.clone());
    }
  }
}

void DistributedDataParallel::sync_final_model(bool last_to_join) {
  tp::NoGradGuard no_grad;
  Tensor claim = tp::full({1}, last_to_join ? process_group_->rank() : -1, tp::kFloat32);
  process_group_->allreduce(claim, ReduceOp::MAX)->wait();
  const int root = static_cast<int>(claim.item());
  for (auto& [name, param] : params_) process_group_->broadcast(param, root)->wait();
}

// SAME FROM STAGE 05: the note when nothing is unused
void DistributedDataParallel::warn_if_nothing_unused(const float* used) const {
  const int world_size = process_group_->size();
  for (size_t p = 0; p < params_.size(); ++p) {
    if (used[p] != static_cast<float>(world_size)) return;  // someone left it unused
  }
  if (process_group_->rank() != 0) return;
  std::fprintf(stderr,
               "stage09 DDP: find_unused_parameters = true, but every parameter got a gradient "
               "on every rank in the first synced backward. The option walks the autograd "
               "graph after every forward; if no parameter ever goes unused, pass "
               "find_unused_parameters = false.\n");
}
// END SAME FROM STAGE 05: the note when nothing is unused

void DistributedDataParallel::throw_unfinished() {
  // The parameters whose hook did not run: their buckets never completed.
  std::string missing;
  size_t count = 0;
  size_t first_unlaunched = buckets_.size();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!launched(buckets_[b])) first_unlaunched = std::min(first_unlaunched, b);
    for (const Slot& slot : buckets_[b].slots) {
      if (slot.arrived) continue;  // its hook ran this backward
      missing += (count++ ? ", " : "") + std::to_string(slot.param) + " (" +
                 params_[static_cast<size_t>(slot.param)].first + ")";
    }
  }
  if (count == 0) {
    // Every gradient arrived, yet a bucket was never launched: the
    // bookkeeping, not the model, is wrong. Not an unused parameter.
    drain_launched();
    TP_THROW(tp::DistributedError, "stage09 DDP: rank ", process_group_->rank(),
             ": every gradient arrived in this backward, but bucket ", first_unlaunched,
             "'s all-reduce was never launched; is the per-iteration state (each bucket's "
             "pending count, the next bucket to launch) reset at the end of every backward?");
  }
  unfinished_ = "no gradient for parameter" + std::string(count > 1 ? "s " : " ") + missing;
  // Leave no all-reduce in flight: the launched buckets are the same on
  // every rank that skipped the same parameters.
  drain_launched();
  for (Bucket& bucket : buckets_) {
    for (Slot& slot : bucket.slots) slot.arrived = false;
    bucket.pending = bucket.slots.size();
  }
  used_map_.zero_();
  unused_.clear();
  next_bucket_ = 0;
  callback_queued_ = false;
  if (options_.static_graph && synced_iterations_ > 0) {
    TP_THROW(tp::DistributedError, "stage09 DDP: rank ", process_group_->rank(),
             ": static_graph: backward ended with ", unfinished_,
             ", although the first iteration found every such parameter used on this rank: "
             "the graph changed, or the record of the first iteration (static_unused_) is not "
             "what it found (Note [Static graph]); with parameters that are used in some "
             "iterations and not in others, pass find_unused_parameters = true instead");
  }
  if (options_.find_unused_parameters || options_.static_graph) {
    TP_THROW(tp::DistributedError, "stage09 DDP: rank ", process_group_->rank(),
             ": backward ended with ", unfinished_,
             " although the graph is walked (find_unused_parameters or static_graph): the "
             "forward's walk did not list "
             "them as unused (does it start from the output's grad_fn?), or the first hook "
             "did not file them (Note [Finding unused parameters])");
  }
  TP_THROW(tp::DistributedError, "stage09 DDP: rank ", process_group_->rank(),
           ": backward ended with ", unfinished_,
           ", so its bucket's all-reduce was never launched; every parameter must get a "
           "gradient in every backward, or construct the DDP with find_unused_parameters = "
           "true");
}

}  // namespace stage09
