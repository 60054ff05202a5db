// Copied from solutions/09-zero/default_hooks.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 09 — the simple built-in communication hooks (PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.default_hooks). The kit's
// trainer registers the one a run names through register_builtin_hook
// (stage.h).
//
// Each is hook(state, bucket): register it with
//   ddp.register_comm_hook(process_group, allreduce_hook);
// where process_group is a std::shared_ptr<tp::distributed::ProcessGroup>
// (the same group the DDP uses). Each launches its collective and returns
// a future at once; the future's value()[0] is bucket.buffer(), averaged.
//
// Contract:
//   - allreduce_hook: all-reduce SUM, then divide by the world size: the
//     DDP's default, bit for bit (PyTorch's divides first; lesson 08 says
//     why the kit does not).
//   - fp16_compress_hook: a float16 copy of the bucket, divided by the world
//     size first (so that the sum cannot overflow where the average would
//     not), all-reduced, then copied back into the bucket in its own dtype.
//     Half the bytes of a float32 bucket; the average's error is bounded in
//     lesson 08.
//   - bf16_compress_hook: the same with bfloat16 (float32's range, 8 bits of
//     precision). The Gloo backend has no bfloat16 reduction: on it the
//     DDP's register_comm_hook refuses the hook (tp::Error naming the
//     backend), before any collective.
//   - noop_hook sends nothing: the DDP itself registers it for the
//     reduce-scatter form of ZeRO, where the optimizer reduces.
//   - The hooks hold no state but the process group: they are safe to use
//     from several DDPs, one thread each.
#pragma once

#include <memory>

#include "grad_bucket.h"
#include "tensorplay/distributed/future.h"
#include "tensorplay/distributed/process_group.h"

namespace stage09 {

using tp::distributed::Future;
using tp::distributed::ProcessGroup;

std::shared_ptr<Future> allreduce_hook(ProcessGroup& process_group, GradBucket& bucket);
std::shared_ptr<Future> fp16_compress_hook(ProcessGroup& process_group, GradBucket& bucket);
std::shared_ptr<Future> bf16_compress_hook(ProcessGroup& process_group, GradBucket& bucket);

// The hook that sends nothing (PyTorch's debugging_hooks.noop_hook): its
// future is already complete, and its value is the bucket as this rank
// filled it. The DDP registers it for the reduce-scatter form of ZeRO
// (Options::reduce_scatter), where the optimizer reduces the gradients.
// (`process_group` is unused: the built-in hooks' form.) PyTorch keeps it
// in ddp_comm_hooks.debugging_hooks; it is here with the other built-in
// hooks.
std::shared_ptr<Future> noop_hook(ProcessGroup& process_group, GradBucket& bucket);

}  // namespace stage09
