// The demo's table and summary on stdout (print_report, demo_report.h):
// the header, the buckets and their launches, the per-step table, uneven
// and unreached steps, the summary, memory and the verdict.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include "demo_report.h"
#include "tensorplay/trace.h"

namespace tp::train {
namespace {

// A loss as the table shows it: six decimals, or, for a run that blows up,
// an exponent (a 34-digit number would break the columns); "-" for none.
std::string cell(std::optional<double> v) {
  if (!v) return "-";
  char buf[40];
  std::snprintf(buf, sizeof buf, std::fabs(*v) < 1e6 || !std::isfinite(*v) ? "%.6f" : "%.4e", *v);
  return buf;
}

// "branch_b, spare" for {branch_b.weight, branch_b.bias, spare.weight,
// spare.bias}: a module whose parameters are all listed shows as its name.
std::string compact_names(const std::vector<int64_t>& params, const Snapshot& all) {
  std::map<std::string, std::pair<size_t, size_t>> modules;  // prefix -> (listed, total)
  std::vector<std::string> order;
  auto prefix = [](const std::string& name) { return name.substr(0, name.rfind('.')); };
  for (const ParamValues& p : all) {
    if (modules.count(prefix(p.name)) == 0) order.push_back(prefix(p.name));
    ++modules[prefix(p.name)].second;
  }
  for (int64_t p : params) ++modules[prefix(all[static_cast<size_t>(p)].name)].first;
  std::string out;
  for (const std::string& m : order) {
    const auto [listed, total] = modules[m];
    if (listed == 0) continue;
    if (listed == total) {
      out += (out.empty() ? "" : ", ") + m;
      continue;
    }
    for (int64_t p : params) {
      if (prefix(all[static_cast<size_t>(p)].name) == m) {
        out += (out.empty() ? "" : ", ") + all[static_cast<size_t>(p)].name;
      }
    }
  }
  return out.empty() ? "-" : out;
}

// For a model whose forward leaves parameters unused (lesson 05): which got
// no gradient on each rank, per step (per micro-batch with accumulation).
void print_unreached(const RunConfig& config, const std::vector<RankResult>& ranks) {
  bool any = false;
  for (const RankResult& r : ranks) {
    for (const auto& micro : r.unreached_per_micro) any |= !micro.empty();
  }
  if (!any) return;
  const int64_t k = config.micro_batches;
  std::printf("\nparameters that got no gradient (the forward did not reach them), per rank:\n");
  const int64_t steps = std::min<int64_t>(total_steps(config), 10);
  for (int64_t step = 0; step < steps; ++step) {
    std::string line;
    for (const RankResult& r : ranks) {
      std::string cell;
      for (int64_t i = step * k; i < (step + 1) * k; ++i) {
        if (static_cast<size_t>(i) >= r.unreached_per_micro.size()) break;
        const std::string names =
            compact_names(r.unreached_per_micro[static_cast<size_t>(i)], r.final_params);
        cell += k == 1 ? names : detail::cat(i > step * k ? "; " : "", "m", i - step * k, " ", names);
      }
      line += detail::cat(line.empty() ? "" : " | ", "rank ", r.rank, ": ", cell.empty() ? "-" : cell);
    }
    std::printf("  step %lld: %s\n", static_cast<long long>(step), line.c_str());
  }
  if (total_steps(config) > steps) std::printf("  ...\n");
}

// "bucket 0: fc3.bias, fc3.weight (528 B)" for each bucket.
void print_bucket_list(const RunConfig& config, const RankResult& rank0,
                       const std::vector<std::vector<int64_t>>& buckets) {
  const size_t element = element_size(config.dtype);
  for (size_t b = 0; b < buckets.size(); ++b) {
    std::string names;
    size_t bytes = 0;
    for (int64_t p : buckets[b]) {
      if (p < 0 || static_cast<size_t>(p) >= rank0.final_params.size()) continue;
      const ParamValues& param = rank0.final_params[static_cast<size_t>(p)];
      names += (names.empty() ? "" : ", ") + param.name;
      bytes += param.values.size() * element;
    }
    std::printf("  bucket %zu: %s (%zu B)\n", b, names.c_str(), bytes);
  }
}

// The buckets, when the stage has them: what the DDP built, in index order
// (the order it must launch them in), each listing its parameters in the
// order they were assigned.
void print_buckets(const RunConfig& config, const RankResult& rank0) {
  if (rank0.buckets.empty()) return;
  if (!rank0.initial_buckets.empty() && rank0.initial_buckets != rank0.buckets) {
    std::printf("buckets on rank 0 at construction (index order):\n");
    print_bucket_list(config, rank0, rank0.initial_buckets);
    std::printf("rebuilt after the first step (index order):\n");
  } else {
    std::printf("buckets on rank 0 (index order):\n");
  }
  print_bucket_list(config, rank0, rank0.buckets);
}

int64_t event_arg(const trace::Event& e, const std::string& key) {
  for (const auto& [k, v] : e.args) {
    if (k == key) return v;
  }
  return -1;
}

// What happened, beside what should have: every all-reduce rank 0's main
// thread queued in step 0, in the order it queued them, read from its trace
// of step 0 (RunConfig::trace_first_step): its bytes, the bucket of that size
// (step 0's buckets, in index order, each taken once; sizes are all a trace
// tells apart), and the span it was queued in ("the hook of fc1.weight",
// "sync_grads", "callbacks" for an end-of-backward callback, "forward").
void print_launches(const RunConfig& config, const RankResult& rank0) {
  const trace::Event* step0 = nullptr;
  for (const trace::Event& e : rank0.events) {
    if (e.phase == 'X' && e.name == "step" && event_arg(e, "step") == 0) step0 = &e;
  }
  if (rank0.buckets.empty()) return;  // one all-reduce per parameter: nothing to pair
  if (step0 == nullptr) return;  // no trace: --worker, or rank 0 had no step
  const auto& buckets = rank0.initial_buckets.empty() ? rank0.buckets : rank0.initial_buckets;
  std::vector<int64_t> bucket_bytes;
  for (const std::vector<int64_t>& bucket : buckets) {
    int64_t bytes = 0;
    for (int64_t p : bucket) {
      if (p < 0 || static_cast<size_t>(p) >= rank0.final_params.size()) continue;
      bytes += static_cast<int64_t>(rank0.final_params[static_cast<size_t>(p)].values.size() *
                                    element_size(config.dtype));
    }
    bucket_bytes.push_back(bytes);
  }
  std::vector<bool> taken(bucket_bytes.size(), false);
  std::vector<std::string> lines;
  for (const trace::Event& e : rank0.events) {
    if (e.phase != 'i' || e.name != "allreduce queued" || e.tid != step0->tid ||
        e.begin_order < step0->begin_order || e.begin_order > step0->end_order) {
      continue;
    }
    const int64_t bytes = event_arg(e, "bytes");
    std::string what = detail::cat(bytes, " B");
    for (size_t b = 0; b < bucket_bytes.size(); ++b) {
      if (taken[b] || bucket_bytes[b] != bytes) continue;
      taken[b] = true;
      what += detail::cat(", bucket ", b);
      for (size_t c = b + 1; c < bucket_bytes.size(); ++c) {
        if (!taken[c] && bucket_bytes[c] == bytes) {
          what += detail::cat(" (or ", c, ": the same size)");
          break;
        }
      }
      break;
    }
    const trace::Event* in = span_around(rank0.events, e);
    std::string where = in == nullptr ? "the step itself" : in->name;
    if (in != nullptr && in->name == "hook") {
      const int64_t p = event_arg(*in, "param");
      where = p >= 0 && static_cast<size_t>(p) < rank0.final_params.size()
                  ? "the hook of " + rank0.final_params[static_cast<size_t>(p)].name
                  : "a hook";
    }
    lines.push_back(detail::cat(what, ", queued in ", where));
  }
  const bool rebuilt = !rank0.initial_buckets.empty() && rank0.initial_buckets != rank0.buckets;
  std::printf("all-reduces rank 0 launched in step 0%s, in launch order:\n",
              rebuilt ? " (its buckets: those at construction)" : "");
  if (lines.empty()) std::printf("  none\n");
  for (size_t i = 0; i < lines.size(); ++i) std::printf("  %zu. %s\n", i + 1, lines[i].c_str());
}

// The first line: the stage, then the plan, naming the knobs lesson 01
// leaves at their defaults only when they are set.
void print_header(const DemoReport& report) {
  const RunConfig& config = report.args->config;
  const int64_t k = config.micro_batches;
  std::string extra;
  if (k > 1) extra += detail::cat(", ", k, " micro-batches per step");
  if (uneven(config)) {
    extra += ", batches per rank";
    for (int r = 0; r < config.world_size; ++r) {
      extra += detail::cat(r ? "/" : " ", micro_batches_of(config, r));
    }
  }
  if (config.model_kind != ModelKind::MiniMLP) extra += ", " + to_string(config.model_kind);
  // The seed mode (--per-rank-seed) changes no number in the table when the
  // broadcast works, so the header is where it shows.
  extra += config.per_rank_seed ? ", per-rank seeds" : ", shared seed";
  if (report.args->worker) extra += ", the lesson's worker";
  std::printf("stage %s: %s. %d rank%s, %lld steps, batch %lld per rank, lr %g%s, %s%s\n",
              report.stage.c_str(), report.title.c_str(), config.world_size,
              config.world_size == 1 ? "" : "s", static_cast<long long>(total_steps(config)),
              static_cast<long long>(config.batch_size), config.lr,
              config.momentum > 0 ? detail::cat(", momentum ", config.momentum).c_str() : "",
              tp::to_string(config.dtype).c_str(), extra.c_str());
  // Whose code ran: the solution's demo says nothing more.
  if (!report.args->mine.empty()) {
    std::printf("your code ran: %s (./kit demo %s --mine), not the stage's solution\n",
                report.args->mine.c_str(), report.stage.c_str());
  }
  std::printf("\n");
}

void print_step_table(const DemoReport& report) {
  const RunConfig& config = report.args->config;
  const int last = config.world_size - 1;
  const auto l = static_cast<size_t>(last);
  if (config.micro_batches > 1) {
    std::printf("(each loss is the mean over the step's %lld micro-batches)\n",
                static_cast<long long>(config.micro_batches));
  }
  std::printf("%4s  %10s  %11s %11s  %11s %11s  %15s\n", "step", "reference", "rank 0 DDP",
              "rank 0 ref", detail::cat("rank ", last, " DDP").c_str(),
              detail::cat("rank ", last, " ref").c_str(), "max |DDP - ref|");
  for (size_t s = 0; s < report.rows.size(); ++s) {
    const StepRow& row = report.rows[s];
    std::printf("%4zu  %10s  %11s %11s  %11s %11s  %15.2e\n", s, cell(row.reference_loss).c_str(),
                cell(row.ddp[0]).c_str(), cell(row.reference[0]).c_str(), cell(row.ddp[l]).c_str(),
                cell(row.reference[l]).c_str(), row.drift);
  }
}

// Which ranks train and which, having run out, shadow the others.
void print_uneven_steps(const RunConfig& config) {
  std::printf("(- : the rank had no batch left at that step)\n");
  std::printf("\nranks per step (uneven inputs):\n");
  for (int64_t step = 0; step < total_steps(config); ++step) {
    std::string training, shadowing;
    for (int r = 0; r < config.world_size; ++r) {
      std::string& list = step < steps_of(config, r) ? training : shadowing;
      list += (list.empty() ? "" : ",") + std::to_string(r);
    }
    std::printf("  step %lld: training %s; shadowing %s; divided by %d\n",
                static_cast<long long>(step), training.c_str(),
                shadowing.empty() ? "-" : shadowing.c_str(), divisor_at(config, step));
  }
}

// A sharded optimizer's partition (stage 09), and what its step moved:
// each rank's parameters with their elements, then rank 0's bytes per
// collective in its last step.
void print_shards(const RunConfig& config, const RankResult& rank0) {
  std::printf("\nshards (each rank steps and keeps optimizer state for its own):\n");
  for (size_t r = 0; r < rank0.shard_partition.size(); ++r) {
    std::string names;
    size_t elements = 0;
    for (int64_t p : rank0.shard_partition[r]) {
      const ParamValues& param = rank0.final_params.at(static_cast<size_t>(p));
      names += (names.empty() ? "" : ", ") + param.name;
      elements += param.values.size();
    }
    std::printf("  rank %zu: %zu elements: %s\n", r, elements, names.empty() ? "(none)" : names.c_str());
  }
  const int64_t steps = steps_of(config, rank0.rank);
  if (steps == 0) return;
  const int64_t k = config.micro_batches;
  const auto last = [&](const std::vector<uint64_t>& per_micro) {
    return static_cast<unsigned long long>(sum_over_step(per_micro, k, steps - 1));
  };
  std::printf("bytes in rank %d's last step: all-reduced %llu, reduce-scattered %llu, "
              "all-gathered %llu, broadcast %llu\n",
              rank0.rank, last(rank0.allreduce_bytes_per_micro),
              last(rank0.reduce_scatter_bytes_per_micro), last(rank0.allgather_bytes_per_micro),
              last(rank0.broadcast_bytes_per_micro));
}

void print_summary(const DemoReport& report) {
  const RunConfig& config = report.args->config;
  const RankResult& rank0 = report.ranks->front();
  const Comparison& c = report.comparison;
  const int64_t k = config.micro_batches;
  std::printf("\nfinal parameter norm: reference %.9f, rank 0 %.9f\n", c.reference_norm,
              c.rank0_norm);
  std::printf("largest parameter difference vs the reference: %.2e (%s on rank %d)\n",
              c.final_params.max_abs, c.final_params.name.c_str(), c.final_params.rank);
  std::printf("largest parameter difference between ranks:    %.2e\n",
              c.final_between_ranks.max_abs);
  if (!c.final_buffers.name.empty()) {
    std::printf("largest buffer difference vs the reference:    %.2e (%s on rank %d)\n",
                c.final_buffers.max_abs, c.final_buffers.name.c_str(), c.final_buffers.rank);
  }
  std::printf("largest loss difference vs the reference:      %.2e (step %lld, rank %d)\n",
              c.max_loss_diff, static_cast<long long>(c.loss_index < 0 ? -1 : c.loss_index / k),
              c.loss_rank);
  if (!report.args->worker) {  // a worker counts no collectives
    std::printf("all-reduces in step 0 on rank 0: %llu for %zu parameter tensors\n",
                static_cast<unsigned long long>(report.allreduces_in_step0.front()),
                rank0.final_params.size());
    std::printf("bytes all-reduced by rank 0: %llu in the first step, %llu in the last\n",
                static_cast<unsigned long long>(report.bytes_in_first_step),
                static_cast<unsigned long long>(report.bytes_in_last_step));
    // A sharded stage's flat collectives (ZeRO's reduce-scatter form, FSDP),
    // counted as the all-reduces are: a line only where a step has some.
    const auto in_step0 = [&](const std::vector<uint64_t>& per_micro) {
      return static_cast<unsigned long long>(sum_over_step(per_micro, k, 0));
    };
    if (in_step0(rank0.allgathers_per_micro) + in_step0(rank0.reduce_scatters_per_micro) > 0) {
      std::printf("all-gathers and reduce-scatters in step 0 on rank 0: %llu of %llu bytes "
                  "and %llu of %llu bytes\n",
                  in_step0(rank0.allgathers_per_micro), in_step0(rank0.allgather_bytes_per_micro),
                  in_step0(rank0.reduce_scatters_per_micro),
                  in_step0(rank0.reduce_scatter_bytes_per_micro));
    }
  }
  if (!rank0.shard_partition.empty()) print_shards(config, rank0);
  if (k > 1) {
    // Where in the step they happen: with no_sync, all in the last one.
    std::string per_micro;
    for (int64_t m = 0; m < k && m < static_cast<int64_t>(rank0.allreduces_per_micro.size()); ++m) {
      per_micro += (m ? ", " : "") + std::to_string(rank0.allreduces_per_micro[m]);
    }
    std::printf("all-reduces in each of step 0's %lld micro-batches on rank 0: %s\n",
                static_cast<long long>(k), per_micro.c_str());
  }
}

// Each rank's model state, as tp::memory counted it (RankResult::memory):
// what ZeRO divides among the ranks. Not for a lesson's worker (--worker),
// which measures nothing.
void print_memory(const std::vector<RankResult>& ranks) {
  if (std::none_of(ranks.begin(), ranks.end(),
                   [](const RankResult& r) { return r.memory.has_value(); })) {
    return;
  }
  std::printf("\nmemory per rank, KiB (tensor bytes at the end; peak since the model was built):\n");
  std::printf("%6s  %10s  %10s  %15s  %24s\n", "rank", "parameters", "gradients",
              "optimizer state", "peak params+grads+state");
  for (const RankResult& r : ranks) {
    if (!r.memory) continue;
    const memory::Stats& m = *r.memory;
    auto kib = [](uint64_t bytes) { return static_cast<double>(bytes) / 1024.0; };
    std::printf("%6d  %10.1f  %10.1f  %15.1f  %24.1f\n", r.rank,
                kib(m.live_bytes(memory::Kind::Parameter)), kib(m.live_bytes(memory::Kind::Gradient)),
                kib(m.live_bytes(memory::Kind::OptimizerState)), kib(m.model_state_peak));
  }
}

void print_verdict(const DemoReport& report) {
  switch (report.verdict) {
    case Verdict::Matches:
      std::printf("verdict: matches the reference within %.0e x max(1, |value|)\n",
                  report.tolerance);
      break;
    case Verdict::ReferenceDiverged:
      std::printf("verdict: no verdict on DDP: the reference itself diverged\n%s",
                  format_findings(report.findings).c_str());
      break;
    case Verdict::Differs:
      std::printf("verdict: DIFFERS from the reference\n%s",
                  format_findings(report.findings).c_str());
      if (report.rerun.ran) {
        std::printf("  re-run in float64, the same plan differs too (parameters %.2e, losses "
                    "%.2e from its reference): not float32 rounding\n",
                    report.rerun.max_param_diff, report.rerun.max_loss_diff);
      } else if (report.rerun.skipped) {
        std::printf("  not re-run in float64 (--no-float64-rerun): float32 rounding grown over "
                    "the run is not ruled out; drop the flag to tell (Note [Rounding or a bug])\n");
      }
      break;
    case Verdict::Float32Rounding:
      std::printf("verdict: matches the reference in float64; in float32 it drifts by rounding\n"
                  "  the float32 run ends %.2e from the reference (largest parameter difference,\n"
                  "  above), beyond %.0e; the same plan re-run in float64 ends %.2e from its\n"
                  "  reference (losses %.2e), within %.0e. A wrong DDP differs in float64 too.\n"
                  "  DDP sums the ranks' gradients in another order than the reference, so their\n"
                  "  last bits differ from the first step on, and training amplifies that over\n"
                  "  the steps (Note [Rounding or a bug] in tensorplay/train/demo.h). A race can\n"
                  "  also come and go between runs: ./kit check runs every case in checker mode.\n",
                  report.comparison.final_params.max_abs, report.tolerance,
                  report.rerun.max_param_diff, report.rerun.max_loss_diff,
                  default_tolerance(kFloat64));
      break;
    case Verdict::Approximate:
      std::printf("verdict: approximate by design (%s): no verdict against the exact reference; "
                  "the distances above are what it costs\n",
                  report.approximation.c_str());
      break;
  }
}

}  // namespace

void print_report(const DemoReport& report) {
  const RunConfig& config = report.args->config;
  print_header(report);
  print_buckets(config, report.ranks->front());
  print_launches(config, report.ranks->front());
  if (!report.ranks->front().buckets.empty()) std::printf("\n");
  print_step_table(report);
  if (uneven(config)) print_uneven_steps(config);
  print_unreached(config, *report.ranks);
  print_summary(report);
  print_memory(*report.ranks);
  print_verdict(report);
}

}  // namespace tp::train
