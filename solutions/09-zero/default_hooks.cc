// Stage 09 — the simple built-in communication hooks. See default_hooks.h
// for the contract and Note [Comm hooks] in ddp.cc for what a hook is.
#include "default_hooks.h"

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/error.h"

namespace stage09 {

using tp::Tensor;
using tp::distributed::ReduceOp;

std::shared_ptr<Future> allreduce_hook(ProcessGroup& process_group, GradBucket& bucket) {
  Tensor buffer = bucket.buffer();
  const double world_size = process_group.size();
  return process_group.allreduce(buffer, ReduceOp::SUM)->get_future()->then(
      [buffer, world_size](Future& summed) mutable -> Future::Value {
        summed.value();  // rethrows the all-reduce's failure
        buffer.div_(world_size);
        return {buffer};
      });
}

namespace {

// fp16_compress_hook and bf16_compress_hook: the same four steps, with the
// 16-bit type as the only difference.
std::shared_ptr<Future> compress_hook(ProcessGroup& process_group, GradBucket& bucket,
                                      tp::Dtype compressed_dtype) {
  tp::NoGradGuard no_grad;
  Tensor buffer = bucket.buffer();
  Tensor compressed = buffer.to(compressed_dtype);
  compressed.div_(process_group.size());
  return process_group.allreduce(compressed, ReduceOp::SUM)->get_future()->then(
      [buffer](Future& summed) mutable -> Future::Value {
        buffer.copy_(summed.value()[0]);  // back to the bucket's dtype, in place
        return {buffer};
      });
}

}  // namespace

std::shared_ptr<Future> fp16_compress_hook(ProcessGroup& process_group, GradBucket& bucket) {
  return compress_hook(process_group, bucket, tp::kFloat16);
}

std::shared_ptr<Future> bf16_compress_hook(ProcessGroup& process_group, GradBucket& bucket) {
  return compress_hook(process_group, bucket, tp::kBFloat16);
}

std::shared_ptr<Future> noop_hook(ProcessGroup& process_group, GradBucket& bucket) {
  (void)process_group;
  auto future = std::make_shared<Future>();
  future->set_value({bucket.buffer()});
  return future;
}

}  // namespace stage09
