// Copied from solutions/10-fsdp/state_dict.h by tools/gen_exercise.py (nothing to fill in here).
// Stage 10 — checkpoints of a fully sharded model: the whole model on one
// rank, or every rank's shards, loadable by a job of another world size
// (PyTorch: FSDP's FULL_STATE_DICT and SHARDED_STATE_DICT, and
// torch.distributed.checkpoint's save and load).
//
// What it is: a sharded checkpoint is a folder. Each save writes a
// subfolder step-NNNNNN/ holding one file per rank (rank-R.bin: for each
// unit, the rank's shard of the flat parameter, then its shard of SGD's
// momentum) and, once every rank's file is complete, rank 0's meta.json
// (the format, the step, the world size, the strategy, and each unit's
// name, dtype, elements and parameters), and then the file `latest`, which
// names the subfolder. A load reads `latest`, checks meta.json against the
// model it loads into, and has each rank read, from whichever files hold
// them, the elements of each unit that its shard covers at the new world
// size (Note [Resharding] in state_dict.cc): 4 ranks may save and 2 load.
//
// What it is not: no tensors but parameters and momentum (no buffers, no
// learning-rate schedule); every rank must see the folder (one machine, or
// a shared file system); no asynchronous save.
//
// Contract:
//   - All three functions are collectives: every rank calls them at the
//     same point, with the same arguments but its own optimizer.
//   - `optimizer` steps fsdp.parameters(), in that order (throws tp::Error
//     otherwise).
//   - Every file is replaced whole or not at all (tp::write_file), and
//     `latest` is written last: a job killed during a save leaves `latest`
//     naming the previous complete checkpoint, which loads as before.
//   - load_sharded_checkpoint throws tp::Error, on every rank and before
//     changing anything, for a folder with no complete checkpoint, and for
//     one made for another model (units, parameter names, shapes, dtypes),
//     another sharding strategy, or with momentum buffers this optimizer
//     does not keep (momentum 0), naming the first difference. A file that
//     is missing or short throws naming it.
//   - Resumed at the same world size, training continues bit for bit as if
//     it had not stopped: the shards and buffers are read back as written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddp.h"
#include "tensorplay/nn/module.h"
#include "tensorplay/optim/sgd.h"

namespace stage10 {

// Every parameter of the model, gathered one unit at a time, as CPU copies
// named as in the model and in its order: on rank 0 (PyTorch's
// FULL_STATE_DICT with rank0_only); the other ranks get an empty list.
std::vector<tp::nn::NamedTensor> full_state_dict(FullyShardedDataParallel& fsdp);

// Writes this rank's shards (and momentum) of `step` under `folder`
// (created if missing) and, once all ranks have, names it in `latest`.
void save_sharded_checkpoint(FullyShardedDataParallel& fsdp, const tp::optim::SGD& optimizer,
                             const std::string& folder, int64_t step);

// Loads the checkpoint `latest` names into the shards and the optimizer's
// momentum, resharding it when it was saved by another world size.
// Returns its step.
int64_t load_sharded_checkpoint(FullyShardedDataParallel& fsdp, tp::optim::SGD& optimizer,
                                const std::string& folder);

}  // namespace stage10
