// Stage 08 — the simple built-in communication hooks. See default_hooks.h
// for the contract and Note [Comm hooks] in ddp.cc for what a hook is.
#include "default_hooks.h"

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/error.h"

namespace stage08 {

using tp::Tensor;
using tp::distributed::ReduceOp;

std::shared_ptr<Future> allreduce_hook(ProcessGroup& process_group, GradBucket& bucket) {
  // EXERCISE: all-reduce the bucket and return a future whose value is the
  // average, reached exactly as the DDP's default reaches it (ddp.h's
  // contract: bit for bit). The division must not wait here.
  // BEGIN SOLUTION
  Tensor buffer = bucket.buffer();
  const double world_size = process_group.size();
  return process_group.allreduce(buffer, ReduceOp::SUM)->get_future()->then(
      [buffer, world_size](Future& summed) mutable -> Future::Value {
        summed.value();  // rethrows the all-reduce's failure
        buffer.div_(world_size);
        return {buffer};
      });
  // END SOLUTION
}

namespace {

// fp16_compress_hook and bf16_compress_hook: the same four steps, with the
// 16-bit type as the only difference.
std::shared_ptr<Future> compress_hook(ProcessGroup& process_group, GradBucket& bucket,
                                      tp::Dtype compressed_dtype) {
  // EXERCISE: send a 16-bit copy of the bucket: compress, divide by the
  // world size before the sum (why before? lesson 08), all-reduce, and
  // decompress into bucket.buffer() once the sum has arrived.
  // BEGIN SOLUTION
  tp::NoGradGuard no_grad;
  Tensor buffer = bucket.buffer();
  Tensor compressed = buffer.to(compressed_dtype);
  compressed.div_(process_group.size());
  return process_group.allreduce(compressed, ReduceOp::SUM)->get_future()->then(
      [buffer](Future& summed) mutable -> Future::Value {
        buffer.copy_(summed.value()[0]);  // back to the bucket's dtype, in place
        return {buffer};
      });
  // END SOLUTION
}

}  // namespace

std::shared_ptr<Future> fp16_compress_hook(ProcessGroup& process_group, GradBucket& bucket) {
  return compress_hook(process_group, bucket, tp::kFloat16);
}

std::shared_ptr<Future> bf16_compress_hook(ProcessGroup& process_group, GradBucket& bucket) {
  return compress_hook(process_group, bucket, tp::kBFloat16);
}

}  // namespace stage08
