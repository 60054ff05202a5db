// What a launcher told a rank, torchrun's way or Slurm's (launcher_env.h).
#include "tensorplay/distributed/launcher_env.h"

#include <cerrno>
#include <cstdlib>

#include "tensorplay/error.h"

namespace tp::distributed {

namespace {

std::optional<std::string> variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry: up to the first comma outside brackets.
  std::string entry;
  int depth = 0;
  for (char c : nodelist) {
    if (c == ',' && depth == 0) break;
    if (c == '[') ++depth;
    if (c == ']') --depth;
    entry += c;
  }
  // Each [a-b,c] becomes its first number, "a", zero padding kept.
  std::string host;
  for (std::size_t i = 0; i < entry.size(); ++i) {
    if (entry[i] != '[') {
      host += entry[i];
      continue;
    }
    const std::size_t close = entry.find(']', i);
    const std::string inside = entry.substr(i + 1, close == std::string::npos ? std::string::npos
                                                                               : close - i - 1);
    host += inside.substr(0, inside.find_first_of(",-"));
    if (close == std::string::npos) break;
    i = close;
  }
  return host;
}

std::string slurm_counterparts(const std::string& name) {
  if (name == "RANK") return "SLURM_PROCID";
  if (name == "WORLD_SIZE") return "SLURM_NTASKS";
  if (name == "LOCAL_RANK") return "SLURM_LOCALID";
  if (name == "MASTER_ADDR") {
    return "SLURM_JOB_NODELIST, SLURM_NODELIST or SLURM_LAUNCH_NODE_IPADDR";
  }
  if (name == "TP_JOB_ID") return "SLURM_JOB_ID";
  return "";
}

std::optional<LauncherValue> from_launcher(const std::string& name) {
  if (auto value = variable(name.c_str())) return LauncherValue{*value, name};
  const auto slurm = [](const char* slurm_name) -> std::optional<LauncherValue> {
    if (auto value = variable(slurm_name)) return LauncherValue{*value, slurm_name};
    return std::nullopt;
  };
  if (name == "RANK") return slurm("SLURM_PROCID");
  if (name == "WORLD_SIZE") return slurm("SLURM_NTASKS");
  if (name == "LOCAL_RANK") return slurm("SLURM_LOCALID");
  if (name == "MASTER_ADDR") {
    for (const char* list : {"SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (auto value = variable(list)) return LauncherValue{first_slurm_host(*value), list};
    }
    return slurm("SLURM_LAUNCH_NODE_IPADDR");
  }
  if (name == "TP_JOB_ID") {
    if (auto value = variable("SLURM_JOB_ID")) {
      return LauncherValue{"slurm-" + *value, "SLURM_JOB_ID"};
    }
  }
  return std::nullopt;
}

int local_rank_from_environment() {
  const auto local = from_launcher("LOCAL_RANK");
  if (!local) return -1;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(local->value.c_str(), &end, 10);
  if (*end != '\0' || errno != 0 || v < 0 || v > (1 << 20)) {
    TP_THROW(DistributedError, "tp::distributed::local_rank_from_environment: ", local->variable,
             "='", local->value, "' is not a whole number from 0 to ", 1 << 20);
  }
  return static_cast<int>(v);
}

}  // namespace tp::distributed
