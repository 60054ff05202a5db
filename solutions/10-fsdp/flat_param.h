// Stage 10 — FlatParameter: one FSDP unit's parameters as one flat tensor,
// padded and sharded (PyTorch's FlatParameter and FlatParamHandle,
// torch/distributed/fsdp/flat_param.py).
//
// What it is: the unit's parameters laid end to end in one flat tensor of
// `numel()` elements, padded with zeros to `padded_numel()`, a multiple of
// the world size W, and cut into W equal shards (Note [Padding and shards]
// in flat_param.cc). Between uses a rank keeps only its own shard,
// local_shard(): the tensor the optimizer steps, whose .grad is this rank's
// shard of the averaged gradient. To compute, the shards are all-gathered
// into full(), and the unit's parameters (the model's own tensors, whose
// handles the modules hold) view slices of it; after use full()'s bytes are
// freed and the parameters view nothing (Note [Freed, not dropped]).
//
// What it is not: it issues no collective and decides nothing about when to
// gather or free (ddp.cc does); it holds no
// gradient but the one handed to it.
//
// Contract:
//   - The parameters must share one dtype and one device; the flat tensor
//     has that dtype (a unit mixing float32 and float64 throws tp::Error
//     naming both parameters).
//   - After construction the parameters view full(), which is freed: using
//     them before alloc_full() and a gather throws tp::Error (tensor.cc
//     refuses a view of freed bytes). The values they held are in
//     local_shard() (this rank's slice) and in nothing else.
//   - sharded = false (NO_SHARD) keeps the whole flat tensor on every rank:
//     local_shard() is full(), never freed, and the parameters view it.
//   - Not thread-safe. full()'s bytes may be written by the process group's
//     communication thread between issuing an all-gather into them and its
//     wait(); nothing here touches them meanwhile.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensorplay/nn/module.h"
#include "tensorplay/tensor.h"

namespace stage10 {

// Where one of the unit's parameters lies in the flat tensor.
struct ParamSlot {
  std::string name;  // its name in the wrapped model: "fc2.weight"
  tp::Tensor param;  // the model's own handle; its TensorImpl views full()
  int64_t offset;    // its first element in the flat tensor
  tp::Shape shape;
  int64_t numel() const { return tp::numel_of(shape); }
};

class FlatParameter {
 public:
  // Flattens `params` (in the order given), copies this rank's shard of
  // their values into local_shard(), and points each at its slot of the
  // (freed) full buffer. `unit` names the unit in messages ("fc2", "" for
  // the root). REQUIRES: params is not empty; 0 <= rank < world_size.
  FlatParameter(std::string unit, const std::vector<tp::nn::NamedTensor>& params, int rank,
                int world_size, bool sharded);
  FlatParameter(const FlatParameter&) = delete;
  FlatParameter& operator=(const FlatParameter&) = delete;

  const std::string& unit() const { return unit_; }
  const std::vector<ParamSlot>& slots() const { return slots_; }
  tp::Dtype dtype() const { return local_shard_.dtype(); }

  // Elements of the parameters; of the padded flat tensor (a multiple of
  // W); of one shard (padded_numel() / W); the padding.
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }
  int64_t shard_numel() const { return shard_numel_; }
  int64_t padding() const { return padded_numel_ - numel_; }
  // The first element of `rank`'s shard in the flat tensor (0 unsharded:
  // every rank holds it all).
  int64_t shard_offset(int rank) const {
    return sharded_ ? static_cast<int64_t>(rank) * shard_numel_ : 0;
  }
  bool sharded() const { return sharded_; }

  // (shard_numel()): this rank's elements [shard_offset(rank), + shard_numel())
  // of the flat tensor, a leaf requiring grad. The optimizer's parameter.
  const tp::Tensor& local_shard() const { return local_shard_; }
  // (padded_numel()): the gathered flat tensor, which the parameters view.
  // Its bytes exist only between alloc_full() and free_full().
  const tp::Tensor& full() const { return full_; }
  // This rank's slice of full(): where its own shard lands in an all-gather.
  tp::Tensor full_shard_slice() const;

  // Whether full()'s bytes exist (always, unsharded).
  bool has_full() const { return !full_.storage()->is_freed(); }
  // Allocates full()'s bytes (uninitialized; the all-gather fills them),
  // counted as parameter memory. Nothing when they exist.
  void alloc_full();
  // Frees them: the parameters keep viewing full(), which holds nothing.
  // Nothing when already freed, or unsharded.
  void free_full();

  // A fresh (padded_numel()) tensor of zeros, counted as gradient memory,
  // and each parameter's .grad made a view of its slot, so that autograd
  // accumulates into it in place. Returns it.
  tp::Tensor alloc_full_grad();
  // Whether each parameter's .grad still views `full_grad` (a parameter
  // used outside its unit's forward may have got a gradient of its own);
  // the name of the first that does not, or "".
  std::string grad_outside(const tp::Tensor& full_grad) const;
  // Clears every parameter's .grad (they view the full gradient, which the
  // caller lets go of once it is reduced).
  void clear_param_grads();

 private:
  std::string unit_;
  std::vector<ParamSlot> slots_;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  int64_t shard_numel_ = 0;
  int rank_ = 0;
  bool sharded_ = true;
  tp::Tensor local_shard_;  // the leaf the optimizer steps
  tp::Tensor full_;         // over a storage freed between uses (sharded)
};

}  // namespace stage10
