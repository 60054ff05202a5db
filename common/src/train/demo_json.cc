// The demo's --json file (report_json_text, demo_report.h), written with
// nlohmann/json: the same numbers the table shows.
#include <nlohmann/json.hpp>
#include <optional>

#include "demo_report.h"

namespace tp::train {
namespace {

using Json = nlohmann::ordered_json;  // keys in the order written: the schema's

// A number, or null where there is none (a rank without a batch at that
// step) or it is not finite (JSON has no inf or NaN).
Json number_or_null(std::optional<double> v) {
  return v && std::isfinite(*v) ? Json(*v) : Json(nullptr);
}

Json numbers(const std::vector<double>& values) {
  Json out = Json::array();
  for (double v : values) out.push_back(number_or_null(v));
  return out;
}

Json numbers(const std::vector<std::optional<double>>& values) {
  Json out = Json::array();
  for (const std::optional<double>& v : values) out.push_back(number_or_null(v));
  return out;
}

// Schema: {stage, title, config{...}, steps[{step, reference_loss,
// reference_rank_losses[W], ddp_rank_losses[W], max_abs_diff}],
// ranks[{rank, micro_batch_losses[], allreduces_per_micro[],
// allreduce_bytes_per_micro[], reduce_scatters_per_micro[],
// reduce_scatter_bytes_per_micro[], allgathers_per_micro[],
// allgather_bytes_per_micro[], broadcast_bytes_per_micro[],
// shard_partition[W][] and params_with_state[] (a sharded optimizer's; else
// empty), memory{parameter_bytes, gradient_bytes, optimizer_state_bytes
// (live at the end), peak_parameter_bytes, peak_gradient_bytes,
// peak_model_state_bytes (the most since the model was built)}}],
// final{...}}.
// A rank that did not take part in a step has null there; memory is null for
// a lesson's worker (--worker), which measures nothing.
Json report_json(const DemoReport& report) {
  const RunConfig& config = report.args->config;
  const std::vector<RankResult>& ranks = *report.ranks;
  const Comparison& c = report.comparison;
  Json j;
  j["stage"] = report.stage;
  j["title"] = report.title;
  j["config"] = {{"world_size", config.world_size},
                 {"steps", report.rows.size()},
                 {"micro_batches", config.micro_batches},
                 {"batch_size", config.batch_size},
                 {"model", to_string(config.model_kind)},
                 {"lr", number_or_null(config.lr)},
                 {"momentum", number_or_null(config.momentum)},
                 {"dtype", to_string(config.dtype)},
                 {"per_rank_seed", config.per_rank_seed},
                 {"device", config.device.type == DeviceType::CUDA ? "cuda" : "cpu"},
                 {"backend", to_string(resolved_backend(config))},
                 {"tolerance", number_or_null(report.tolerance)}};
  j["steps"] = Json::array();
  for (size_t s = 0; s < report.rows.size(); ++s) {
    const StepRow& row = report.rows[s];
    j["steps"].push_back({{"step", s},
                          {"reference_loss", number_or_null(row.reference_loss)},
                          {"reference_rank_losses", numbers(row.reference)},
                          {"ddp_rank_losses", numbers(row.ddp)},
                          {"max_abs_diff", number_or_null(row.drift)}});
  }
  j["ranks"] = Json::array();
  for (const RankResult& r : ranks) {
    Json mem = nullptr;
    if (r.memory) {
      mem = {{"parameter_bytes", r.memory->live_bytes(memory::Kind::Parameter)},
             {"gradient_bytes", r.memory->live_bytes(memory::Kind::Gradient)},
             {"optimizer_state_bytes", r.memory->live_bytes(memory::Kind::OptimizerState)},
             {"peak_parameter_bytes", r.memory->peak_bytes(memory::Kind::Parameter)},
             {"peak_gradient_bytes", r.memory->peak_bytes(memory::Kind::Gradient)},
             {"peak_model_state_bytes", r.memory->model_state_peak}};
    }
    j["ranks"].push_back({{"rank", r.rank},
                          {"micro_batch_losses", numbers(r.losses)},
                          {"allreduces_per_micro", r.allreduces_per_micro},
                          {"allreduce_bytes_per_micro", r.allreduce_bytes_per_micro},
                          {"reduce_scatters_per_micro", r.reduce_scatters_per_micro},
                          {"reduce_scatter_bytes_per_micro", r.reduce_scatter_bytes_per_micro},
                          {"allgathers_per_micro", r.allgathers_per_micro},
                          {"allgather_bytes_per_micro", r.allgather_bytes_per_micro},
                          {"broadcast_bytes_per_micro", r.broadcast_bytes_per_micro},
                          {"shard_partition", r.shard_partition},
                          {"params_with_state", r.params_with_state},
                          {"memory", std::move(mem)}});
  }
  j["final"] = {{"reference_param_norm", number_or_null(c.reference_norm)},
                {"rank_param_norms", numbers(report.rank_norms)},
                {"max_param_diff_vs_reference", number_or_null(c.final_params.max_abs)},
                {"max_param_diff_param", c.final_params.name},
                {"max_param_diff_rank", c.final_params.rank},
                {"max_param_diff_between_ranks", number_or_null(c.final_between_ranks.max_abs)},
                {"max_loss_diff", number_or_null(c.max_loss_diff)},
                {"num_parameters", ranks.front().final_params.size()},
                {"allreduces_per_step", report.allreduces_in_step0},
                {"matches_reference", report.findings.empty()},
                {"float64_rerun", report.rerun.ran ? Json{{"matches", report.rerun.matches},
                                                         {"max_param_diff", report.rerun.max_param_diff},
                                                         {"max_loss_diff", report.rerun.max_loss_diff}}
                                                   : Json(nullptr)},
                {"float64_rerun_skipped", report.rerun.skipped},
                {"float32_rounding", report.verdict == Verdict::Float32Rounding},
                {"approximation", report.approximation},
                {"allreduce_bytes_first_step", report.bytes_in_first_step},
                {"allreduce_bytes_last_step", report.bytes_in_last_step}};
  return j;
}

}  // namespace

std::string report_json_text(const DemoReport& report) {
  return report_json(report).dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace tp::train
