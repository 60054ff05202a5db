// Stage 10 — checkpoints (see state_dict.h).
#include "state_dict.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/error.h"
#include "tensorplay/memory.h"
#include "tensorplay/util/file.h"

namespace stage10 {

using tp::Tensor;
using json = nlohmann::json;

// Note [Resharding]
// A unit of N elements saved by W ranks is in W files: rank q's holds
// elements [q*S, (q+1)*S) of the flat parameter, S = ceil(N / W) (its
// shard; the padding past N is saved too, and is zeros). Loaded by W'
// ranks, rank r needs [r*S', (r+1)*S') with S' = ceil(N / W'): it reads
// the part of that range below N from each file q whose shard overlaps it,
// and leaves its own padding zero. The flat layout (parameters in unit
// order, end to end) does not depend on W, only the cut does, so nothing
// but offsets changes. PyTorch's torch.distributed.checkpoint does the same
// with a plan of which saved chunk feeds which loaded one.

namespace {

constexpr const char* kFormat = "tensorplay fsdp sharded checkpoint 1";

std::string step_folder(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%06lld", static_cast<long long>(step));
  return name;
}

std::string rank_file(int rank) { return "rank-" + std::to_string(rank) + ".bin"; }

void check_optimizer(FullyShardedDataParallel& fsdp, const tp::optim::SGD& optimizer,
                     const char* fn) {
  const std::vector<Tensor> shards = fsdp.parameters();
  const std::vector<Tensor>& params = optimizer.params();
  bool same = params.size() == shards.size();
  for (size_t i = 0; same && i < params.size(); ++i) same = params[i].impl() == shards[i].impl();
  TP_CHECK(same, "stage10 ", fn, ": the optimizer does not step fsdp.parameters() (the units' "
           "shards, in order); build it as SGD(fsdp.parameters(), ...)");
}

// What a checkpoint says of the model it was made for.
json describe_units(const FullyShardedDataParallel& fsdp) {
  json units = json::array();
  for (const auto& unit : fsdp.units()) {
    json params = json::array();
    for (const ParamSlot& slot : unit->slots()) params.push_back({slot.name, slot.shape});
    units.push_back({{"name", unit->unit()},
                     {"dtype", tp::to_string(unit->dtype())},
                     {"numel", unit->numel()},
                     {"shard_numel", unit->shard_numel()},
                     {"params", params}});
  }
  return units;
}

bool all_buffers_defined(const tp::optim::SGD& optimizer) {
  const std::vector<Tensor>& buffers = optimizer.momentum_buffers();
  return std::all_of(buffers.begin(), buffers.end(), [](const Tensor& b) { return b.defined(); });
}

// The bytes of a CPU tensor, appended.
void append_bytes(std::string& out, const Tensor& t) {
  out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
}

// Reads `count` bytes at `offset` of `path` into `into`, or throws.
void read_bytes(const std::string& path, int64_t offset, int64_t count, char* into) {
  std::ifstream in(path, std::ios::binary);
  TP_CHECK(in.good(), "stage10 load_sharded_checkpoint: cannot open '", path,
           "' (the checkpoint is incomplete, or not on a file system every rank sees)");
  in.seekg(offset);
  in.read(into, count);
  TP_CHECK(in.gcount() == count, "stage10 load_sharded_checkpoint: '", path, "' ends before byte ",
           offset + count, " (it holds ", offset + in.gcount(), "); the file is truncated");
}

// The first difference between the model a checkpoint was made for and
// this one, or "".
std::string model_difference(const json& saved, const json& ours) {
  if (saved.size() != ours.size()) {
    return tp::detail::cat("the checkpoint has ", saved.size(), " units, this model ", ours.size());
  }
  for (size_t u = 0; u < ours.size(); ++u) {
    for (const char* key : {"name", "dtype", "numel", "params"}) {
      if (saved[u][key] != ours[u][key]) {
        return tp::detail::cat("unit ", u, "'s ", key, " is ", saved[u][key].dump(),
                               " in the checkpoint but ", ours[u][key].dump(), " here");
      }
    }
  }
  return "";
}

}  // namespace

std::vector<tp::nn::NamedTensor> full_state_dict(FullyShardedDataParallel& fsdp) {
  std::map<std::string, Tensor> copies;
  const bool mine = fsdp.process_group()->rank() == 0;
  // EXERCISE: copy every parameter into copies (by name) on rank 0, with
  // every rank gathering one unit at a time: never the whole model at once.
  // BEGIN SOLUTION
  for (size_t u = 0; u < fsdp.units().size(); ++u) {
    auto full = fsdp.summon_full_params(u);
    if (!mine) continue;
    for (const ParamSlot& slot : fsdp.units()[u]->slots()) {
      copies[slot.name] = slot.param.detach().cpu().clone();
    }
  }
  // END SOLUTION
  std::vector<tp::nn::NamedTensor> out;
  if (!mine) return out;
  for (const auto& [name, p] : fsdp.named_parameters()) out.emplace_back(name, copies.at(name));
  return out;
}

void save_sharded_checkpoint(FullyShardedDataParallel& fsdp, const tp::optim::SGD& optimizer,
                             const std::string& folder, int64_t step) {
  check_optimizer(fsdp, optimizer, "save_sharded_checkpoint");
  TP_CHECK(step >= 0, "stage10 save_sharded_checkpoint: step ", step, " is negative");
  tp::distributed::ProcessGroup& group = *fsdp.process_group();
  const std::filesystem::path here = std::filesystem::path(folder) / step_folder(step);
  std::error_code error;
  std::filesystem::create_directories(here, error);
  TP_CHECK(!error, "stage10 save_sharded_checkpoint: cannot create '", here.string(), "': ",
           error.message());
  const bool momentum = all_buffers_defined(optimizer);
  std::string bytes;
  // EXERCISE: this rank's file, as load_sharded_checkpoint reads it (Note
  // [Resharding]): for each unit in order, its shard, then its momentum
  // buffer when the optimizer keeps them.
  // BEGIN SOLUTION
  for (size_t u = 0; u < fsdp.units().size(); ++u) {
    append_bytes(bytes, fsdp.units()[u]->local_shard());
    if (momentum) append_bytes(bytes, optimizer.momentum_buffers()[u]);
  }
  // END SOLUTION
  // EXERCISE: write the file so that a crash leaves the last checkpoint
  // loadable (state_dict.h): every rank's file complete before rank 0
  // describes the checkpoint in meta.json, and `latest` names it last;
  // nobody goes on before it does.
  // BEGIN SOLUTION
  tp::write_file((here / rank_file(group.rank())).string(), bytes, "the checkpoint shard");
  group.barrier()->wait();
  if (group.rank() == 0) {
    const json meta = {{"format", kFormat},
                       {"step", step},
                       {"world_size", group.size()},
                       {"sharding_strategy", to_string(fsdp.options().sharding_strategy)},
                       {"momentum", momentum},
                       {"units", describe_units(fsdp)}};
    tp::write_file((here / "meta.json").string(), meta.dump(1) + "\n", "the checkpoint's meta.json");
    tp::write_file((std::filesystem::path(folder) / "latest").string(), step_folder(step) + "\n",
                   "the checkpoint's latest");
  }
  group.barrier()->wait();
  // END SOLUTION
}

int64_t load_sharded_checkpoint(FullyShardedDataParallel& fsdp, tp::optim::SGD& optimizer,
                                const std::string& folder) {
  check_optimizer(fsdp, optimizer, "load_sharded_checkpoint");
  const std::filesystem::path root(folder);
  std::ifstream latest_in(root / "latest");
  std::string name;
  TP_CHECK(latest_in >> name, "stage10 load_sharded_checkpoint: '", (root / "latest").string(),
           "' is missing or empty: '", folder, "' holds no complete checkpoint");
  const std::filesystem::path here = root / name;
  json meta;
  {
    std::ifstream in(here / "meta.json");
    TP_CHECK(in.good(), "stage10 load_sharded_checkpoint: '", (here / "meta.json").string(),
             "' is missing");
    meta = json::parse(in, nullptr, /*allow_exceptions=*/false);
    TP_CHECK(!meta.is_discarded() && meta.value("format", "") == kFormat,
             "stage10 load_sharded_checkpoint: '", (here / "meta.json").string(),
             "' is not a ", kFormat);
  }
  const std::string what = tp::detail::cat("stage10 load_sharded_checkpoint: '", here.string(),
                                           "' was made for ");
  const bool momentum = meta["momentum"].get<bool>();
  // EXERCISE: refuse, before changing anything, a checkpoint made for
  // another sharding strategy, for another model (model_difference), or
  // holding momentum this optimizer does not keep, each starting with
  // `what` and naming the difference.
  // BEGIN SOLUTION
  const std::string strategy = to_string(fsdp.options().sharding_strategy);
  TP_CHECK(meta["sharding_strategy"] == strategy, what, "sharding strategy ",
           meta["sharding_strategy"].get<std::string>(), ", and this FSDP is ", strategy,
           "; load it with the strategy it was saved with");
  const std::string difference = model_difference(meta["units"], describe_units(fsdp));
  TP_CHECK(difference.empty(), what, "another model: ", difference);
  TP_CHECK(!momentum || optimizer.options().momentum > 0, what,
           "an optimizer with momentum (it holds momentum buffers), and this SGD has momentum 0");
  // END SOLUTION

  const int saved_world = meta["world_size"].get<int>();
  const int rank = fsdp.process_group()->rank();
  tp::NoGradGuard no_grad;
  std::vector<Tensor> buffers(fsdp.units().size());
  int64_t base = 0;  // where the unit starts in every saved rank's file, in bytes
  for (size_t u = 0; u < fsdp.units().size(); ++u) {
    const FlatParameter& unit = *fsdp.units()[u];
    const int64_t es = static_cast<int64_t>(unit.local_shard().element_size());
    const int64_t saved_shard = meta["units"][u]["shard_numel"].get<int64_t>();
    Tensor values = tp::zeros({unit.shard_numel()}, unit.dtype());
    Tensor momentum_values;
    if (momentum) {
      tp::memory::KindScope state(tp::memory::Kind::OptimizerState);
      momentum_values = tp::zeros({unit.shard_numel()}, unit.dtype());
    }
    // EXERCISE: fill values (and momentum_values) with this rank's
    // elements of the unit at the world size it runs at now, read from the
    // files of the ranks that saved them (Note [Resharding]): each saved
    // rank's file holds, from byte `base`, its shard of saved_shard
    // elements, then (with momentum) its momentum shard. The padding past
    // the unit's numel() stays zero.
    // BEGIN SOLUTION
    const int64_t lo = unit.shard_offset(rank);
    const int64_t hi = std::min(lo + unit.shard_numel(), unit.numel());
    for (int q = 0; q < saved_world && lo < hi; ++q) {
      const int64_t q_lo = std::max(lo, q * saved_shard);
      const int64_t q_hi = std::min(hi, (q + 1) * saved_shard);
      if (q_lo >= q_hi) continue;
      const std::string path = (here / rank_file(q)).string();
      const int64_t at = base + (q_lo - q * saved_shard) * es;
      const int64_t count = (q_hi - q_lo) * es;
      char* into = static_cast<char*>(values.data_ptr()) + (q_lo - lo) * es;
      read_bytes(path, at, count, into);
      if (momentum) {
        char* state = static_cast<char*>(momentum_values.data_ptr()) + (q_lo - lo) * es;
        read_bytes(path, at + saved_shard * es, count, state);
      }
    }
    // END SOLUTION
    unit.local_shard().detach().copy_(values);
    buffers[u] = momentum_values;
    base += saved_shard * es * (momentum ? 2 : 1);
  }
  optimizer.load_momentum_buffers(std::move(buffers));
  return meta["step"].get<int64_t>();
}

}  // namespace stage10
