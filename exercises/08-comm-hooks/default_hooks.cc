// Exercise generated from solutions/08-comm-hooks/default_hooks.cc by tools/gen_exercise.py.
// Fill in each EXERCISE, then run ./kit check 08. ./kit reset 08 restores this file.
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
  throw tp::NotImplemented("stage 08: allreduce_hook is not implemented yet (exercises/08-comm-hooks/default_hooks.cc)");
}

namespace {

// fp16_compress_hook and bf16_compress_hook: the same four steps, with the
// 16-bit type as the only difference.
std::shared_ptr<Future> compress_hook(ProcessGroup& process_group, GradBucket& bucket,
                                      tp::Dtype compressed_dtype) {
  // EXERCISE: send a 16-bit copy of the bucket: compress, divide by the
  // world size before the sum (why before? lesson 08), all-reduce, and
  // decompress into bucket.buffer() once the sum has arrived.
  throw tp::NotImplemented("stage 08: compress_hook is not implemented yet (exercises/08-comm-hooks/default_hooks.cc)");
}

}  // namespace

std::shared_ptr<Future> fp16_compress_hook(ProcessGroup& process_group, GradBucket& bucket) {
  return compress_hook(process_group, bucket, tp::kFloat16);
}

std::shared_ptr<Future> bf16_compress_hook(ProcessGroup& process_group, GradBucket& bucket) {
  return compress_hook(process_group, bucket, tp::kBFloat16);
}

}  // namespace stage08
