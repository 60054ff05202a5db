// torch.distributed-style entry points: process groups built from a backend
// name and an init method, and one default process group per process.
//
// Contract:
//   - make_process_group(backend, rank, world_size, init_method, options)
//     builds a group exactly as init_process_group builds the default one
//     (everything said below of init_process_group holds for it, with
//     GroupOptions::timeout as the timeout), but hands it to the caller,
//     who owns it: dropping the last reference drains and joins it. It is
//     not the default group, and the free functions below never see it.
//     Errors name tp::distributed::make_process_group. Each call is a
//     rendezvous of its own: every rank of the new group calls it, with
//     its own fresh file:// directory, TCPStore port or redis job id.
//   - init_process_group(backend, rank, world_size, init_method) creates the
//     default group. backend: "gloo" (CPU tensors, and CUDA tensors staged
//     through host memory) or "nccl" (CUDA tensors, one GPU per rank:
//     process_group_nccl.h; every init method below). Where NCCL cannot run
//     (a build without it, or no usable CUDA device) "nccl" is a
//     tp::DistributedError saying why, with backend "gloo" as the fix.
//     TP_NCCL_BLOCKING_WAIT=1 (or TORCH_NCCL_BLOCKING_WAIT=1) makes the NCCL
//     group's wait() block the host. init_method, as in torch.distributed:
//       file://DIR          all ranks on one machine, a fresh directory per
//                           job (see TempDir);
//       env://              MASTER_ADDR and MASTER_PORT name rank 0's machine
//                           and a free port there: rank 0 hosts a TCPStore on
//                           it (tcp_store.h) and the others connect to it;
//       tcp://HOST:PORT     env:// with the address inline;
//       redis://HOST:PORT[/JOB]  a running redis-server (redis_store.h); every
//                           key is prefixed by JOB, or by TP_JOB_ID.
//     rank and world_size = kFromEnvironment (-1) read RANK and WORLD_SIZE
//     (all but file://), as torch.distributed does; the two-argument form
//     reads both. Under Slurm, where srun starts one task per rank, Slurm's
//     own variables stand in for those a launcher did not set: SLURM_PROCID
//     for RANK, SLURM_NTASKS for WORLD_SIZE, the first host of
//     SLURM_JOB_NODELIST for MASTER_ADDR, SLURM_LOCALID for LOCAL_RANK and
//     "slurm-" + SLURM_JOB_ID for TP_JOB_ID (the job's identity: Note [One
//     job per store]); MASTER_PORT must be set (launcher_env.h). Across machines, each rank's Gloo pairs listen on the
//     interface named by GLOO_SOCKET_IFNAME, or else on the address that
//     reaches the master (Note [Choosing the interface] in network.h).
//   - Bad input (world_size < 1, rank outside [0, world_size), a second init,
//     an unwritable rendezvous directory, a missing or malformed MASTER_ADDR,
//     MASTER_PORT, RANK or WORLD_SIZE, an unknown interface, a port in use)
//     throws tp::DistributedError naming the cause (the variable) and the
//     fix, before any rank waits on another. A master that cannot be reached,
//     ranks that disagree on the world size and ranks that never arrive are
//     errors within `timeout` (Note [Rendezvous in a store]).
//   - nccl_unavailable_reason() says, without building anything, whether
//     backend "nccl" can run here (torch.distributed.is_nccl_available()).
//   - TP_DISTRIBUTED_DEBUG=DETAIL turns on the group's collective
//     fingerprint check (process_group_gloo.h).
//   - destroy_process_group() drains and joins the default group; calling it
//     when none exists is a no-op.
//   - The free functions mirror torch.distributed: with async_op = true they
//     return the Work at once; with async_op = false they wait (rethrowing the
//     collective's error) and return the completed Work, never nullptr, so
//     dist::all_reduce(t)->wait() is safe and returns at once.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensorplay/distributed/process_group.h"

namespace tp::distributed {

// rank or world_size: read RANK or WORLD_SIZE from the environment.
inline constexpr int kFromEnvironment = -1;

// What a group built by make_process_group may be told beyond its backend,
// ranks and init method.
struct GroupOptions {
  // The deadline of the rendezvous and of every collective.
  std::chrono::milliseconds timeout{30000};
  // Backend "gloo": checker mode (GlooOptions::check_in_flight_writes in
  // process_group_gloo.h). Ignored by "nccl".
  bool check_in_flight_writes = false;
  // Backend "nccl": whether wait() blocks the host (process_group_nccl.h).
  // Unset: as init_process_group does, yes when TP_NCCL_BLOCKING_WAIT=1 or
  // TORCH_NCCL_BLOCKING_WAIT=1, else no. Ignored by "gloo".
  std::optional<bool> blocking_wait = std::nullopt;
};

// A new process group, owned by the caller (see the contract). REQUIRES:
// as init_process_group.
std::shared_ptr<ProcessGroup> make_process_group(const std::string& backend, int rank,
                                                 int world_size, const std::string& init_method,
                                                 const GroupOptions& options = {});

// Empty when make_process_group("nccl", ...) can build a group in this
// process; else why not: "tensorplay was built without NCCL (...)" or "no
// usable CUDA device: ...".
std::string nccl_unavailable_reason();

void init_process_group(const std::string& backend, int rank, int world_size,
                        const std::string& init_method,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));
// init_process_group(backend, kFromEnvironment, kFromEnvironment, init_method,
// timeout): the usual call of a rank started by tprun, with "env://".
void init_process_group(const std::string& backend, const std::string& init_method,
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
// torch.distributed's reduce_scatter_tensor and all_gather_into_tensor, with
// split_sizes for uneven blocks (ProcessGroup::reduce_scatter_tensor and
// allgather_into_tensor, process_group.h); empty: equal blocks.
std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& output, const Tensor& input,
                                            const std::vector<int64_t>& split_sizes = {},
                                            ReduceOp op = ReduceOp::SUM, bool async_op = false);
std::shared_ptr<Work> all_gather_into_tensor(const Tensor& output, const Tensor& input,
                                             const std::vector<int64_t>& split_sizes = {},
                                             bool async_op = false);

}  // namespace tp::distributed
