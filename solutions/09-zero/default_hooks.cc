// Stage 09 — the simple built-in communication hooks. See default_hooks.h
// for the contract and Note [Comm hooks] in ddp.cc for what a hook is.
#include "default_hooks.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "powersgd_hook.h"
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

void register_builtin_hook(DistributedDataParallel& ddp, const Options& options) {
  const std::string& name = options.comm_hook;
  if (options.reduce_scatter) {
    // The DDP has registered noop_hook (the optimizer reduces, zero.h): a
    // second reduction here would send every gradient twice.
    TP_CHECK(name == "none", "stage09: the reduce-scatter form reduces the gradients in the "
             "optimizer (the DDP registers noop_hook itself); --comm-hook ", name,
             " would reduce them a second time: leave it at none");
    return;
  }
  if (name == "none") return;
  if (name == "allreduce") {
    ddp.register_comm_hook(ddp.process_group(), allreduce_hook);
  } else if (name == "fp16") {
    ddp.register_comm_hook(ddp.process_group(), fp16_compress_hook);
  } else if (name == "bf16") {
    ddp.register_comm_hook(ddp.process_group(), bf16_compress_hook);
  } else if (name == "powersgd") {
    TP_CHECK(options.powersgd_rank == std::floor(options.powersgd_rank) &&
                 options.powersgd_start_iteration == std::floor(options.powersgd_start_iteration),
             "stage09: PowerSGD's rank and start iteration are whole numbers (got ",
             options.powersgd_rank, " and ", options.powersgd_start_iteration, ")");
    // A rank no weight of the model can use is a mistake, not a request:
    // every matrix would be clamped to its own min(n, m).
    int64_t largest = 0;
    for (const Tensor& p : ddp.parameters()) {
      if (p.dim() >= 2) largest = std::max(largest, std::min(p.size(0), p.numel() / p.size(0)));
    }
    TP_CHECK(largest == 0 || options.powersgd_rank <= static_cast<double>(largest),
             "stage09: PowerSGD rank ", options.powersgd_rank, " is above every weight's "
             "min(n, m) in this model (the largest is ", largest, "); a rank-", largest,
             " approximation already sends every weight whole");
    PowerSGDOptions powersgd;
    powersgd.matrix_approximation_rank = static_cast<int64_t>(options.powersgd_rank);
    powersgd.start_powerSGD_iter = static_cast<int64_t>(options.powersgd_start_iteration);
    powersgd.min_compression_rate = options.powersgd_min_compression_rate;
    ddp.register_comm_hook(std::make_shared<PowerSGDState>(ddp.process_group(), powersgd),
                           powerSGD_hook);
  } else {
    TP_THROW(tp::Error, "stage09: unknown comm hook '", name,
             "'; the built-in ones are none, allreduce, fp16, bf16 and powersgd");
  }
}

}  // namespace stage09
