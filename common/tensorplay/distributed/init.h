// torch.distributed-style entry points: one default process group per process.
//
// Contract:
//   - init_process_group(backend, rank, world_size, init_method) creates the
//     default group. backend: "gloo" ("nccl" gives "built without NCCL;
//     reconfigure with -Dnccl=enabled"). init_method: "file://DIR" (a fresh
//     directory per job, see TempDir). "env://" and "redis://host:port" are
//     planned and get a clear error today, as does any other scheme.
//   - Bad input (world_size < 1, rank outside [0, world_size), a second init,
//     an unwritable rendezvous directory) throws tp::DistributedError naming
//     the cause and the fix, before any rank waits on another.
//   - destroy_process_group() drains and joins the default group; calling it
//     when none exists is a no-op.
//   - The free functions mirror torch.distributed: with async_op = true they
//     return the Work at once; with async_op = false they wait (rethrowing the
//     collective's error) and return the completed Work, never nullptr, so
//     dist::all_reduce(t)->wait() is safe and returns at once.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/distributed/process_group.h"

namespace tp::distributed {

void init_process_group(const std::string& backend, int rank, int world_size,
                        const std::string& init_method,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));
void destroy_process_group();
bool is_initialized();
// The default group. Throws tp::DistributedError if none was initialized.
std::shared_ptr<ProcessGroup> default_group();
int get_rank();
int get_world_size();

std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::SUM,
                                 bool async_op = false);
std::shared_ptr<Work> broadcast(const Tensor& tensor, int src = 0, bool async_op = false);
std::shared_ptr<Work> all_gather(const std::vector<Tensor>& outputs, const Tensor& input,
                                 bool async_op = false);
std::shared_ptr<Work> barrier(bool async_op = false);

}  // namespace tp::distributed
