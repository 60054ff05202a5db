// tp::distributed::from_launcher: what a launcher told this rank, where
// env:// (init.h) and the demos find it. torchrun's names first (tools/tprun
// sets them), then Slurm's, so that a job started by srun, one task per
// rank, needs only MASTER_PORT:
//
//   what          torchrun, tprun   Slurm (srun)
//   rank          RANK              SLURM_PROCID
//   world size    WORLD_SIZE        SLURM_NTASKS
//   local rank    LOCAL_RANK        SLURM_LOCALID
//   master host   MASTER_ADDR       the first host of SLURM_JOB_NODELIST (or
//                                   SLURM_NODELIST), else SLURM_LAUNCH_NODE_IPADDR
//   job identity  TP_JOB_ID         "slurm-" + SLURM_JOB_ID
//
// MASTER_PORT has no Slurm counterpart: every rank must be given the same
// free port, as torch.distributed asks too.
//
// Contract: pure reads of the environment; empty counts as unset; nothing
// throws but local_rank_from_environment, on a value that is not a number.
#pragma once

#include <optional>
#include <string>

namespace tp::distributed {

struct LauncherValue {
  std::string value;
  std::string variable;  // where it came from, for messages: "SLURM_PROCID"
};

// The value a launcher gave `name` (one of RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, TP_JOB_ID; any other name is read as it is), or nullopt when
// neither it nor its Slurm counterpart is set (empty counts as unset).
std::optional<LauncherValue> from_launcher(const std::string& name);

// The Slurm variables that stand for `name`, for messages ("SLURM_PROCID"),
// "" for none.
std::string slurm_counterparts(const std::string& name);

// The first host of a Slurm host list: "node[01-04,07],gpu5" -> "node01",
// "rack[1-2]-n[3-4]" -> "rack1-n3", "gpu5,node1" -> "gpu5".
std::string first_slurm_host(const std::string& nodelist);

// This process's rank on its machine: LOCAL_RANK (torchrun, tprun), else
// SLURM_LOCALID (srun); -1 when neither is set. A launched rank with a GPU
// uses the one of this number. Throws tp::DistributedError on a value that
// is not a whole number.
int local_rank_from_environment();

}  // namespace tp::distributed
