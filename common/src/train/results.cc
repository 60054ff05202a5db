// Snapshots, and the form in which ranks send their results back through
// spawn() or to each other (all_gather_results).
#include "tensorplay/train/results.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tensorplay/error.h"

namespace tp::train {

Snapshot snapshot(const std::vector<nn::NamedTensor>& named) {
  Snapshot out;
  out.reserve(named.size());
  for (const auto& [name, tensor] : named) {
    out.push_back({name, tensor.shape(), tensor.to_vector(), tensor.dtype()});
  }
  return out;
}

std::vector<int64_t> grad_storage_groups(const std::vector<Tensor>& params) {
  std::vector<const Storage*> seen;
  std::vector<int64_t> out;
  for (const Tensor& p : params) {
    const Tensor grad = p.grad();
    if (!grad.defined()) {
      out.push_back(0);
      continue;
    }
    const Storage* storage = grad.storage().get();
    const auto at = std::find(seen.begin(), seen.end(), storage);
    if (at == seen.end()) seen.push_back(storage);
    out.push_back(static_cast<int64_t>(std::find(seen.begin(), seen.end(), storage) - seen.begin()) + 1);
  }
  return out;
}

uint64_t take_grad_copy_bytes(const std::vector<Tensor>& params) {
  std::vector<Storage*> seen;  // each storage once: a bucket holds many .grad
  uint64_t bytes = 0;
  for (const Tensor& p : params) {
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    Storage* storage = grad.storage().get();
    if (std::find(seen.begin(), seen.end(), storage) != seen.end()) continue;
    seen.push_back(storage);
    bytes += storage->take_bytes_copied_in();
  }
  return bytes;
}

uint64_t sum_over_step(const std::vector<uint64_t>& per_micro, int64_t micro_batches,
                       int64_t step) {
  uint64_t total = 0;
  for (int64_t k = 0; k < micro_batches; ++k) {
    const auto i = static_cast<size_t>(step * micro_batches + k);
    if (i < per_micro.size()) total += per_micro[i];
  }
  return total;
}

uint64_t allreduces_in_step(const RankResult& rank, int64_t micro_batches, int64_t step) {
  return sum_over_step(rank.allreduces_per_micro, micro_batches, step);
}

double norm(const Snapshot& snapshot) {
  double sum = 0.0;
  for (const ParamValues& p : snapshot) {
    for (double v : p.values) sum += v * v;
  }
  return std::sqrt(sum);
}

// ---- the exchange form ----------------------------------------------------------
// A RankResult as a JSON object (nlohmann/json), sent as CBOR, JSON's binary
// twin (RFC 8949): CBOR stores a double in binary (in 4 bytes when a float
// holds it exactly, else in 8), so every finite value, -0.0 and the
// infinities come back exactly, and a NaN as a NaN; JSON text cannot carry
// the non-finite ones (nlohmann writes them as null).
namespace {

using Json = nlohmann::json;

Json snapshot_json(const Snapshot& snap) {
  Json out = Json::array();
  for (const ParamValues& p : snap) {
    out.push_back({{"name", p.name},
                   {"shape", p.shape},
                   {"values", p.values},
                   {"dtype", static_cast<int>(p.dtype)}});
  }
  return out;
}

Snapshot snapshot_from(const Json& j) {
  Snapshot out;
  for (const Json& p : j) {
    out.push_back({p.at("name").get<std::string>(), p.at("shape").get<Shape>(),
                   p.at("values").get<std::vector<double>>(),
                   static_cast<Dtype>(p.at("dtype").get<int>())});
  }
  return out;
}

Json event_json(const trace::Event& e) {
  Json args = Json::array();
  for (const auto& [key, value] : e.args) args.push_back({key, value});
  return {{"name", e.name},       {"category", e.category},   {"phase", std::string(1, e.phase)},
          {"pid", e.pid},         {"tid", e.tid},             {"thread", e.thread},
          {"ts_us", e.ts_us},     {"dur_us", e.dur_us},       {"tts_us", e.tts_us},
          {"tdur_us", e.tdur_us}, {"begin_order", e.begin_order},
          {"end_order", e.end_order}, {"args", std::move(args)}};
}

trace::Event event_from(const Json& j) {
  trace::Event e;
  e.name = j.at("name").get<std::string>();
  e.category = j.at("category").get<std::string>();
  e.phase = j.at("phase").get<std::string>().at(0);
  e.pid = j.at("pid").get<int>();
  e.tid = j.at("tid").get<int>();
  e.thread = j.at("thread").get<std::string>();
  e.ts_us = j.at("ts_us").get<int64_t>();
  e.dur_us = j.at("dur_us").get<int64_t>();
  e.tts_us = j.at("tts_us").get<int64_t>();
  e.tdur_us = j.at("tdur_us").get<int64_t>();
  e.begin_order = j.at("begin_order").get<uint64_t>();
  e.end_order = j.at("end_order").get<uint64_t>();
  for (const Json& arg : j.at("args")) {
    e.args.emplace_back(arg.at(0).get<std::string>(), arg.at(1).get<int64_t>());
  }
  return e;
}

// null for a rank that measured nothing.
Json memory_json(const std::optional<memory::Stats>& stats) {
  if (!stats) return nullptr;
  return {{"live", stats->live}, {"peak", stats->peak},
          {"model_state_peak", stats->model_state_peak}};
}

std::optional<memory::Stats> memory_from(const Json& j) {
  if (j.is_null()) return std::nullopt;
  memory::Stats stats;
  stats.live = j.at("live").get<decltype(stats.live)>();
  stats.peak = j.at("peak").get<decltype(stats.peak)>();
  stats.model_state_peak = j.at("model_state_peak").get<uint64_t>();
  return stats;
}

}  // namespace

void record_micro_batch(RankResult& result, const distributed::CollectiveCounters& counters,
                        const std::vector<Tensor>& params) {
  result.grad_copy_bytes_per_micro.push_back(take_grad_copy_bytes(params));
  result.allreduces_per_micro.push_back(counters.allreduce);
  result.broadcasts_per_micro.push_back(counters.broadcast);
  result.allreduce_bytes_per_micro.push_back(counters.allreduce_bytes);
  result.broadcast_bytes_per_micro.push_back(counters.broadcast_bytes);
  result.allgathers_per_micro.push_back(counters.allgather);
  result.allgather_bytes_per_micro.push_back(counters.allgather_bytes);
  result.reduce_scatters_per_micro.push_back(counters.reduce_scatter);
  result.reduce_scatter_bytes_per_micro.push_back(counters.reduce_scatter_bytes);
}

std::string serialize(const RankResult& r) {
  Json events = Json::array();
  for (const trace::Event& e : r.events) events.push_back(event_json(e));
  const Json j = {{"rank", r.rank},
                  {"construction_allreduces", r.construction_allreduces},
                  {"construction_broadcasts", r.construction_broadcasts},
                  {"construction_allgathers", r.construction_allgathers},
                  {"losses", r.losses},
                  {"allreduces_per_micro", r.allreduces_per_micro},
                  {"broadcasts_per_micro", r.broadcasts_per_micro},
                  {"allreduce_bytes_per_micro", r.allreduce_bytes_per_micro},
                  {"grad_copy_bytes_per_micro", r.grad_copy_bytes_per_micro},
                  {"allgathers_per_micro", r.allgathers_per_micro},
                  {"allgather_bytes_per_micro", r.allgather_bytes_per_micro},
                  {"reduce_scatters_per_micro", r.reduce_scatters_per_micro},
                  {"reduce_scatter_bytes_per_micro", r.reduce_scatter_bytes_per_micro},
                  {"broadcast_bytes_per_micro", r.broadcast_bytes_per_micro},
                  {"shard_partition", r.shard_partition},
                  {"params_with_state", r.params_with_state},
                  {"buckets", r.buckets},
                  {"initial_buckets", r.initial_buckets},
                  {"param_ids", r.param_ids},
                  {"grad_storage", r.grad_storage},
                  {"unreached_per_micro", r.unreached_per_micro},
                  {"initial_params", snapshot_json(r.initial_params)},
                  {"after_first_step", snapshot_json(r.after_first_step)},
                  {"final_params", snapshot_json(r.final_params)},
                  {"initial_buffers", snapshot_json(r.initial_buffers)},
                  {"final_buffers", snapshot_json(r.final_buffers)},
                  {"memory", memory_json(r.memory)},
                  {"events", std::move(events)}};
  const std::vector<std::uint8_t> bytes = Json::to_cbor(j);
  return std::string(bytes.begin(), bytes.end());
}

RankResult parse_rank_result(const std::string& bytes) {
  Json j;
  try {
    j = Json::from_cbor(bytes);  // strict: nothing may follow the object
  } catch (const Json::parse_error& e) {
    TP_THROW(Error, "tp::train::parse_rank_result: the result is truncated or corrupt (",
             e.what(), ")");
  }
  try {
    RankResult r;
    r.rank = j.at("rank").get<int>();
    r.construction_allreduces = j.at("construction_allreduces").get<uint64_t>();
    r.construction_broadcasts = j.at("construction_broadcasts").get<uint64_t>();
    r.construction_allgathers = j.at("construction_allgathers").get<uint64_t>();
    r.losses = j.at("losses").get<std::vector<double>>();
    r.allreduces_per_micro = j.at("allreduces_per_micro").get<std::vector<uint64_t>>();
    r.broadcasts_per_micro = j.at("broadcasts_per_micro").get<std::vector<uint64_t>>();
    r.allreduce_bytes_per_micro = j.at("allreduce_bytes_per_micro").get<std::vector<uint64_t>>();
    r.grad_copy_bytes_per_micro = j.at("grad_copy_bytes_per_micro").get<std::vector<uint64_t>>();
    r.allgathers_per_micro = j.at("allgathers_per_micro").get<std::vector<uint64_t>>();
    r.allgather_bytes_per_micro = j.at("allgather_bytes_per_micro").get<std::vector<uint64_t>>();
    r.reduce_scatters_per_micro = j.at("reduce_scatters_per_micro").get<std::vector<uint64_t>>();
    r.reduce_scatter_bytes_per_micro =
        j.at("reduce_scatter_bytes_per_micro").get<std::vector<uint64_t>>();
    r.broadcast_bytes_per_micro = j.at("broadcast_bytes_per_micro").get<std::vector<uint64_t>>();
    r.shard_partition = j.at("shard_partition").get<std::vector<std::vector<int64_t>>>();
    r.params_with_state = j.at("params_with_state").get<std::vector<int64_t>>();
    r.buckets = j.at("buckets").get<std::vector<std::vector<int64_t>>>();
    r.initial_buckets = j.at("initial_buckets").get<std::vector<std::vector<int64_t>>>();
    r.param_ids = j.at("param_ids").get<std::vector<int64_t>>();
    r.grad_storage = j.at("grad_storage").get<std::vector<int64_t>>();
    r.unreached_per_micro = j.at("unreached_per_micro").get<std::vector<std::vector<int64_t>>>();
    r.initial_params = snapshot_from(j.at("initial_params"));
    r.after_first_step = snapshot_from(j.at("after_first_step"));
    r.final_params = snapshot_from(j.at("final_params"));
    r.initial_buffers = snapshot_from(j.at("initial_buffers"));
    r.final_buffers = snapshot_from(j.at("final_buffers"));
    r.memory = memory_from(j.at("memory"));
    for (const Json& e : j.at("events")) r.events.push_back(event_from(e));
    return r;
  } catch (const Json::exception& e) {
    TP_THROW(Error, "tp::train::parse_rank_result: not a rank result (", e.what(), ")");
  }
}

std::vector<RankResult> all_gather_results(distributed::ProcessGroup& group,
                                           const RankResult& mine) {
  const std::string text = serialize(mine);
  const auto world = static_cast<std::size_t>(group.size());
  // Where the group wants them (an NCCL group: this rank's GPU);
  // item() and cpu() bring them back.
  const Device device = group.preferred_device();
  // The lengths first (a double holds any length exactly up to 2^53) ...
  std::vector<Tensor> lengths;
  for (std::size_t r = 0; r < world; ++r) lengths.push_back(zeros({1}, kFloat64, device));
  group.allgather(lengths, full({1}, static_cast<double>(text.size()), kFloat64, device))->wait();
  std::size_t longest = 0;
  for (const Tensor& l : lengths) longest = std::max(longest, static_cast<std::size_t>(l.item()));
  // ... then the bytes, carried in float64 tensors: an all-gather copies
  // bytes and never computes with them, so any bit pattern arrives intact.
  const int64_t words = static_cast<int64_t>((longest + 7) / 8) + 1;
  Tensor packed = zeros({words}, kFloat64);
  std::memcpy(packed.data_ptr(), text.data(), text.size());
  std::vector<Tensor> gathered;
  for (std::size_t r = 0; r < world; ++r) gathered.push_back(zeros({words}, kFloat64, device));
  group.allgather(gathered, packed.to(device))->wait();
  std::vector<RankResult> results;
  for (std::size_t r = 0; r < world; ++r) {
    const auto n = static_cast<std::size_t>(lengths[r].item());
    const Tensor bytes = gathered[r].cpu();  // waits for the gather on a GPU
    results.push_back(
        parse_rank_result(std::string(static_cast<const char*>(bytes.data_ptr()), n)));
  }
  return results;
}

}  // namespace tp::train
