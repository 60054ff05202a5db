// Stage 10 — FlatParameter (see flat_param.h).
#include "flat_param.h"

#include <utility>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/error.h"
#include "tensorplay/memory.h"

namespace stage10 {

using tp::Tensor;

// Note [Padding and shards]
// A unit of numel elements on W ranks is padded with zeros to the next
// multiple of W, padded_numel = ceil(numel / W) * W, and rank r keeps
// elements [r * S, (r + 1) * S) of it, S = padded_numel / W: every shard
// has the same size, which is what all-gather and reduce-scatter of equal
// blocks need, and the padding (at most W - 1 elements) sits at the end of
// the last shards. PyTorch computes the same thing as flat.chunk(W), then
// pads each chunk to the first's size (FlatParamHandle._get_shard). The
// padding never matters to the model: no parameter views it, its gradient
// is zero on every rank, so SGD (momentum included) leaves it zero. When W
// exceeds numel, most of each shard is padding; allowed, but the memory
// saved shrinks to nothing (the demo says so).
//
// Note [Freed, not dropped]
// full() is freed with Storage::resize_(0), not by letting go of the
// tensor: the parameters' TensorImpls, and every view the autograd graph
// saved in forward (Linear saves weight.t() for its backward), hold the
// same Storage object. Dropping our handle would free nothing while they
// live; resizing it frees the bytes under all of them at once, and
// allocating them again (resize_(n)) before the backward's all-gather
// gives the saved views the gathered values. A parameter read while its
// unit is freed throws tp::Error instead of reading stale memory.
// PyTorch frees the same way (_free_storage: storage().resize_(0)).

FlatParameter::FlatParameter(std::string unit, const std::vector<tp::nn::NamedTensor>& params,
                             int rank, int world_size, bool sharded)
    : unit_(std::move(unit)), rank_(rank), sharded_(sharded) {
  TP_CHECK(!params.empty(), "stage10 FlatParameter: unit '", unit_, "' has no parameters");
  TP_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "stage10 FlatParameter: rank ",
           rank, " of world size ", world_size);
  const Tensor& first = params.front().second;
  // EXERCISE: lay the parameters end to end: a slot for each, at the
  // elements counted so far (numel_), refusing any that cannot share one
  // flat tensor with the first (another dtype or device: name both and say
  // how to wrap them apart) or is not contiguous.
  // BEGIN SOLUTION
  for (const auto& [name, p] : params) {
    TP_CHECK(p.dtype() == first.dtype() && p.device() == first.device(),
             "stage10 FSDP: unit '", unit_, "' holds ", params.front().first, " (",
             tp::to_string(first.dtype()), " on ", tp::to_string(first.device()), ") and ", name,
             " (", tp::to_string(p.dtype()), " on ", tp::to_string(p.device()),
             "), but one flat parameter has one dtype and one device; wrap them in different "
             "units (an auto_wrap_policy that puts each Linear in its own)");
    TP_CHECK(p.is_contiguous(), "stage10 FSDP: parameter ", name, " is not contiguous");
    slots_.push_back(ParamSlot{name, p, numel_, p.shape()});
    numel_ += p.numel();
  }
  // END SOLUTION
  // EXERCISE: size the flat tensor and this rank's shard (Note [Padding and
  // shards]): padded_numel_ a multiple of the world size when sharded (the
  // whole flat tensor on every rank when not), shard_numel_ the size of
  // each rank's equal part of it.
  // BEGIN SOLUTION
  padded_numel_ = sharded ? (numel_ + world_size - 1) / world_size * world_size : numel_;
  shard_numel_ = sharded ? padded_numel_ / world_size : numel_;
  // END SOLUTION

  tp::NoGradGuard no_grad;
  tp::memory::KindScope parameters(tp::memory::Kind::Parameter);
  // EXERCISE: build full_, the flat tensor: the parameters' values end to
  // end at their slots' offsets, the padding zero. Keep this rank's part of
  // it as local_shard_, a leaf of its own that requires grad (unsharded:
  // full_ itself). Then make each parameter a view of its slot of full_
  // without changing its handle (the modules hold it): point its TensorImpl
  // at full_'s storage, at its offset (Note [Freed, not dropped]). Last,
  // free full_'s bytes: from now on only the shard holds the values.
  // BEGIN SOLUTION
  full_ = tp::zeros({padded_numel_}, first.dtype(), first.device());
  for (const ParamSlot& slot : slots_) {
    full_.narrow(0, slot.offset, slot.numel()).copy_(slot.param.flatten());
  }
  local_shard_ = sharded ? full_shard_slice().clone() : full_;
  local_shard_.requires_grad_(true);
  // Each parameter becomes a view of its slot: same handle, so the module
  // (and anything else holding it) sees it; its old bytes go when nothing
  // else holds them.
  for (const ParamSlot& slot : slots_) {
    tp::TensorImpl& impl = *slot.param.impl();
    impl.storage = full_.storage();
    impl.offset = slot.offset;
    impl.strides = tp::contiguous_strides(slot.shape);
  }
  free_full();
  // END SOLUTION
}

Tensor FlatParameter::full_shard_slice() const {
  // EXERCISE: this rank's elements of full() (a view).
  // BEGIN SOLUTION
  return full_.narrow(0, shard_offset(rank_), shard_numel_);
  // END SOLUTION
}

void FlatParameter::alloc_full() {
  // EXERCISE: give full() its bytes back, unless it has them (Note [Freed,
  // not dropped]).
  // BEGIN SOLUTION
  if (has_full()) return;
  full_.storage()->resize_(static_cast<std::size_t>(padded_numel_) * full_.element_size());
  // END SOLUTION
}

void FlatParameter::free_full() {
  // EXERCISE: free full()'s bytes under every view of them (Note [Freed,
  // not dropped]); unsharded, full() is the shard and is never freed.
  // BEGIN SOLUTION
  if (!sharded_) return;
  full_.storage()->resize_(0);
  // END SOLUTION
}

Tensor FlatParameter::alloc_full_grad() {
  // EXERCISE: a zeroed flat gradient as long as full(), counted as
  // gradient memory, with each parameter's .grad a view of its slot in it,
  // so that autograd accumulates into it in place (as stage 03's buckets
  // with gradient_as_bucket_view).
  // BEGIN SOLUTION
  Tensor grad = [&] {
    tp::memory::KindScope gradients(tp::memory::Kind::Gradient);
    return tp::zeros({padded_numel_}, dtype(), local_shard_.device());
  }();
  for (const ParamSlot& slot : slots_) {
    slot.param.set_grad(grad.narrow(0, slot.offset, slot.numel()).view(slot.shape));
  }
  return grad;
  // END SOLUTION
}

std::string FlatParameter::grad_outside(const Tensor& full_grad) const {
  // EXERCISE: the first parameter whose .grad is not a view of full_grad
  // (or is none), or "".
  // BEGIN SOLUTION
  for (const ParamSlot& slot : slots_) {
    const Tensor g = slot.param.grad();
    if (!g.defined() || !g.is_alias_of(full_grad)) return slot.name;
  }
  return "";
  // END SOLUTION
}

void FlatParameter::clear_param_grads() {
  // EXERCISE: no parameter keeps a .grad.
  // BEGIN SOLUTION
  for (const ParamSlot& slot : slots_) slot.param.set_grad(Tensor());
  // END SOLUTION
}

}  // namespace stage10
