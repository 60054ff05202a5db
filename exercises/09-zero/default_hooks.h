// Copied from solutions/09-zero/default_hooks.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 09 — the simple built-in communication hooks (PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.default_hooks), and how the
// kit's trainer registers one.
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
//   - noop_hook, the hook that sends nothing, is grad_bucket.h's: the DDP
//     itself registers it for the reduce-scatter form of ZeRO.
//   - The hooks hold no state but the process group: they are safe to use
//     from several DDPs, one thread each.
#pragma once

#include <memory>

#include "ddp.h"
#include "grad_bucket.h"
#include "tensorplay/distributed/future.h"
#include "tensorplay/distributed/process_group.h"

namespace stage09 {

using tp::distributed::Future;
using tp::distributed::ProcessGroup;

std::shared_ptr<Future> allreduce_hook(ProcessGroup& process_group, GradBucket& bucket);
std::shared_ptr<Future> fp16_compress_hook(ProcessGroup& process_group, GradBucket& bucket);
std::shared_ptr<Future> bf16_compress_hook(ProcessGroup& process_group, GradBucket& bucket);

// What the kit's trainer calls right after constructing the DDP (the
// capability comm_hooks): registers the built-in hook options.comm_hook
// names ("none" registers nothing), on ddp.process_group(), or noop_hook
// when options.reduce_scatter is set. Throws tp::Error for a name it does
// not know, listing the ones it does, for PowerSGD settings PowerSGDState
// refuses, and for a hook next to reduce_scatter.
void register_builtin_hook(DistributedDataParallel& ddp, const Options& options);

}  // namespace stage09
