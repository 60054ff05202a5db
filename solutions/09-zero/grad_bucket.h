// Stage 09 — what a communication hook receives and returns: one bucket of
// gradients, ready to be reduced (PyTorch's torch.distributed.GradBucket),
// and the hook's type.
//
// Contract:
//   - The DDP makes a GradBucket for each bucket whose gradients are all in,
//     calls the registered hook with it on the thread that runs backward,
//     and keeps the returned future; at the end of backward it waits for
//     every future and takes value()[0] as the bucket's reduced gradients
//     (Note [Comm hooks] in ddp.cc).
//   - buffer() is the bucket itself: a 1-D tensor holding the gradients of
//     parameters() back to back. gradients()[i] is a view of it with the
//     shape of parameters()[i], so a write to either shows in both. A hook
//     may reduce buffer() in place and return it (the built-in hooks do), or
//     return another 1-D tensor of buffer()'s size and dtype, which the DDP
//     then copies into the bucket.
//   - The tensors are handles: a hook may keep them (in a then() callback,
//     say) until its future completes; after that the DDP owns them again,
//     and the next backward overwrites them.
//   - index() is the bucket's position in launch order (0 is launched
//     first); is_last() is true for the last bucket of the backward, the
//     place where a hook that counts iterations counts one (PowerSGD).
//   - A plain value, cheap to copy; not thread-safe (the tensors are shared).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "tensorplay/distributed/future.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/tensor.h"

namespace stage09 {

class GradBucket {
 public:
  GradBucket(size_t index, bool is_last, tp::Tensor buffer, std::vector<tp::Tensor> gradients,
             std::vector<tp::Tensor> parameters)
      : index_(index),
        is_last_(is_last),
        buffer_(std::move(buffer)),
        gradients_(std::move(gradients)),
        parameters_(std::move(parameters)) {}

  size_t index() const { return index_; }
  bool is_last() const { return is_last_; }
  const tp::Tensor& buffer() const { return buffer_; }
  // Views of buffer(), one per parameter, in bucket order.
  const std::vector<tp::Tensor>& gradients() const { return gradients_; }
  // The parameters whose gradients these are, in the same order.
  const std::vector<tp::Tensor>& parameters() const { return parameters_; }

 private:
  size_t index_;
  bool is_last_;
  tp::Tensor buffer_;
  std::vector<tp::Tensor> gradients_;
  std::vector<tp::Tensor> parameters_;
};

// A communication hook with its state already bound (see
// DistributedDataParallel::register_comm_hook): launches the reduction of
// one bucket and returns, without waiting for it, a future whose value()[0]
// will be the bucket's reduced gradients.
// [snippet:comm-hook]
using CommHook = std::function<std::shared_ptr<tp::distributed::Future>(GradBucket& bucket)>;
// [/snippet:comm-hook]

}  // namespace stage09
