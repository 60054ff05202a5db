// tp::distributed::verify_same_tensors_on_all_ranks: do all ranks hold the
// same list of tensors? The check a DDP runs on its parameters (and buffers)
// before its first broadcast, so that a rank that built a different model
// fails at once with a message, instead of all-reducing mismatched gradients.
//
// Contract:
//   - It is a collective: every rank of `group` must call it at the same
//     point of its collective sequence, with the same `who` and `noun`.
//   - It compares, with rank 0's list, every rank's tensor count and then,
//     position by position, each tensor's shape and dtype (never the values:
//     DDP broadcasts those next). Names are not compared; they only make the
//     message readable ("fc2.weight here").
//   - Its small tables live on group.preferred_device() (the GPU for an
//     NCCL group, the CPU for Gloo).
//   - Collectives it issues, each waited for, the same number on every rank:
//     exactly 1 allgather (the counts) when the lists are empty or their
//     counts differ, else 2 (the counts, then one fixed-width row per tensor).
//   - On a mismatch it throws tp::DistributedError on every rank, after the
//     same collectives, so no rank is left waiting in a collective its peers
//     never issue. The messages differ only in the "(rank R)" of the prefix
//     and the local name in "(fc2.weight here)". Errors of the collectives
//     themselves (tp::TimeoutError, ...) propagate unchanged.
//   - Tensors may have up to 4 dimensions; a tensor with more is reported,
//     on every rank, as a DistributedError. An undefined tensor in the list
//     is compared as "undefined" (equal only to another undefined one).
//   - Thread-safety: issues collectives from the calling thread, so no other
//     thread may issue collectives on `group` meanwhile (process_group.h).
//     Reads only the tensors' metadata.
#pragma once

#include <string>
#include <vector>

#include "tensorplay/distributed/process_group.h"
#include "tensorplay/tensor.h"

namespace tp::distributed {

// Throws tp::DistributedError on every rank unless every rank's `tensors`
// has rank 0's count, shapes and dtypes. `who` prefixes every message
// ("stage02 DDP"); `noun` names what the tensors are ("parameter" or
// "buffer"). For example:
//   "stage02 DDP (rank 1): parameter 2 (fc2.weight here) is (32, 16) float32
//    on rank 0 but (16, 32) float32 on rank 1; every rank must build the
//    same model before wrapping it in DDP"
void verify_same_tensors_on_all_ranks(ProcessGroup& group,
                                      const std::vector<NamedTensor>& tensors,
                                      const std::string& who,
                                      const std::string& noun = "parameter");

}  // namespace tp::distributed
