// Running a lesson's own rank worker and judging it (see worker.h).
#include "tensorplay/train/worker.h"

#include <cstdio>

#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/util/temp_dir.h"

namespace tp::train {

RankResult as_rank_result(int rank, const WorkerResult& w) {
  RankResult r;
  r.rank = rank;
  r.losses = w.losses;
  r.final_params = w.parameters;
  r.final_buffers = w.buffers;
  return r;
}

namespace {

std::string value(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string names_of(const Snapshot& snap) {
  std::string out;
  for (const ParamValues& p : snap) out += (out.empty() ? "" : ", ") + p.name;
  return out;
}

// A list that is not the model's (count or names) makes every number after
// it meaningless, so it is reported alone.
std::string list_mismatch(const Snapshot& mine, const Snapshot& model) {
  bool same = mine.size() == model.size();
  for (size_t p = 0; same && p < mine.size(); ++p) same = mine[p].name == model[p].name;
  if (same) return "";
  return detail::cat(mine.size(), " (", names_of(mine), "); the model has ", model.size(), " (",
                     names_of(model), ")");
}

}  // namespace

std::vector<WorkerResult> run_workers(const RunConfig& config, const Worker& worker) {
  validate(config);
  if (config.micro_batches != 1 || uneven(config)) {
    TP_THROW(Error, "tp::train::run_workers: a rank worker runs one micro-batch per step on "
             "every rank; this plan has ", config.micro_batches, " micro-batches per step",
             uneven(config) ? " and uneven inputs" : "", " (lessons 04 and 07 drive those with "
             "the kit's trainer, ddp_trainer.h)");
  }
  TempDir rendezvous("tensorplay-rdzv");
  multiprocessing::SpawnOptions options;
  options.timeout = config.job_timeout;
  const std::string init_method = rendezvous.file_init_method();
  // Results travel to the parent as serialized RankResults (results.h).
  std::vector<std::string> payloads = multiprocessing::spawn(
      options,
      [&](int rank) { return serialize(as_rank_result(rank, worker(rank, init_method))); },
      config.world_size);
  std::vector<WorkerResult> out;
  for (const std::string& payload : payloads) {
    RankResult r = parse_rank_result(payload);
    out.push_back({std::move(r.losses), std::move(r.final_params), std::move(r.final_buffers)});
  }
  return out;
}

namespace {

// Findings when a worker's results are not what the plan says: a loss per
// step, the model's parameters and buffers. Numbers of such results mean
// nothing, so this comes first.
std::vector<Finding> worker_results_incomplete(const RunConfig& config,
                                               const ReferenceResult& reference,
                                               const std::vector<WorkerResult>& ranks) {
  const int64_t steps = config.steps;
  if (ranks.size() != static_cast<size_t>(config.world_size) ||
      reference.final_buffers.size() != ranks.size()) {
    return {{detail::cat(ranks.size(), " workers reported results; the plan has ",
                         config.world_size, " ranks"),
             "every rank must run its worker to the end and return its result"}};
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    const WorkerResult& w = ranks[r];
    if (static_cast<int64_t>(w.losses.size()) != steps) {
      return {{detail::cat("rank ", r, "'s worker reported ", w.losses.size(),
                           " losses; the plan has ", steps, " steps"),
               "the worker must train config.steps steps and record loss.item() once per step, "
               "in step order"}};
    }
    if (std::string m = list_mismatch(w.parameters, reference.final_params); !m.empty()) {
      return {{detail::cat("rank ", r, "'s worker returned ", m, " parameters"),
               "return snapshot(ddp.named_parameters()) after the last step"}};
    }
    if (std::string m = list_mismatch(w.buffers, reference.final_buffers[r]); !m.empty()) {
      return {{detail::cat("rank ", r, "'s worker returned ", m, " buffers"),
               "return snapshot(model->named_buffers()) after the last step"}};
    }
  }
  return {};
}

// The first step whose loss differs on any rank, each rank compared alone
// so that its own first bad step is known; -1 when every loss matches.
int64_t first_wrong_step(const std::vector<Comparison>& alone) {
  int64_t first_step = -1;
  for (const Comparison& c : alone) {
    const int64_t bad = c.first_bad_index;
    if (bad >= 0 && (first_step < 0 || bad < first_step)) first_step = bad;
  }
  return first_step;
}

// The first wrong loss, at `first_step`, and why: a wrong start (step 0)
// or a wrong update, told apart by whether the ranks still agree.
std::vector<Finding> first_wrong_loss(const ReferenceResult& reference,
                                      const std::vector<WorkerResult>& ranks,
                                      const std::vector<Comparison>& alone,
                                      const Comparison& together, int64_t first_step,
                                      double tolerance) {
  std::string which;
  size_t first_rank = ranks.size();
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (alone[r].first_bad_index != first_step) continue;
    which += (which.empty() ? "" : ", ") + std::to_string(r);
    if (first_rank == ranks.size()) first_rank = r;
  }
  const auto s = static_cast<size_t>(first_step);
  const std::string fact = detail::cat(
      "the first loss that differs from the reference is at step ", first_step, " (rank",
      which.find(',') == std::string::npos ? " " : "s ", which, "): rank ", first_rank, " ",
      value(ranks[first_rank].losses[s]), ", reference ",
      value(reference.losses[first_rank][s]));
  if (first_step == 0 && alone[0].first_bad_index == 0) {
    return {{fact, "rank 0 does not start from the plan's model or does not train on its own "
                   "rows: seed with tp::manual_seed(model_seed_for_rank(config, rank)) before "
                   "make_model(config) builds the model, and take micro_batch(dataset, config, "
                   "rank, step) from a data set built with data_options(config)"}};
  }
  if (first_step == 0) {
    return {{fact + "; rank 0's matches",
             "this rank starts from another model than rank 0, or trains on other rows: is "
             "the model wrapped in DDP before training (its constructor broadcasts rank 0's "
             "parameters, and its buffers when broadcast_buffers is on)? Is DDP built with "
             "the options you were given? Does every rank take its own micro_batch(dataset, "
             "config, rank, step)? With broadcast_buffers off, each rank's buffers are the "
             "ones its own seed built: seed with model_seed_for_rank(config, rank), not a "
             "seed of your own"}};
  }
  if (together.final_between_ranks.max_abs > tolerance) {
    return {{detail::cat(fact, "; every loss before it matches, and the ranks end with "
                               "different parameters (",
                         together.final_between_ranks.name, " on rank ",
                         together.final_between_ranks.rank, " differs from rank 0's by ",
                         value(together.final_between_ranks.max_abs), ")"),
             "the ranks stepped with their own gradients, not the mean: wrap the model in "
             "DDP and call sync_grads() after loss.backward() and before optimizer.step(), "
             "every step, on every rank"}};
  }
  return {{fact + "; every loss before it matches, and the ranks agree with each other",
           "every rank made the same wrong update: clear the gradients at the start of every "
           "step (optimizer.zero_grad()), build SGD with the plan's lr and momentum over "
           "ddp.parameters(), and step once per step, after sync_grads()"}};
}

// With every loss right: the final update and the returned snapshots.
std::vector<Finding> final_state_differs(const Comparison& together, double tolerance) {
  if (together.final_params.max_abs > tolerance) {
    return {{detail::cat("every loss matches, but rank ", together.final_params.rank,
                         "'s final parameters differ from the reference's (",
                         together.final_params.name, " by ",
                         value(together.final_params.max_abs), ")"),
             "the last step's update is wrong or missing: snapshot the parameters after the "
             "last optimizer.step()"}};
  }
  if (together.final_buffers.max_abs > tolerance) {
    return {{detail::cat("every loss and parameter matches, but rank ",
                         together.final_buffers.rank, "'s final buffers differ from the "
                         "reference's (", together.final_buffers.name, " by ",
                         value(together.final_buffers.max_abs), ")"),
             "pass the DDP the options you were given (broadcast_buffers), and snapshot the "
             "buffers after the last step"}};
  }
  return {};
}

}  // namespace

// In order: complete results, then the first wrong loss (everything after
// it is a consequence), then the final parameters and buffers.
std::vector<Finding> check_workers(const RunConfig& config, const ReferenceResult& reference,
                                   const std::vector<WorkerResult>& ranks, double tolerance) {
  if (std::vector<Finding> f = worker_results_incomplete(config, reference, ranks); !f.empty()) {
    return f;
  }
  std::vector<Comparison> alone;  // each rank against the reference by itself
  std::vector<RankResult> all;
  for (size_t r = 0; r < ranks.size(); ++r) {
    all.push_back(as_rank_result(static_cast<int>(r), ranks[r]));
    alone.push_back(compare(reference, {all.back()}, tolerance));
  }
  const Comparison together = compare(reference, all, tolerance);
  if (const int64_t first_step = first_wrong_step(alone); first_step >= 0) {
    return first_wrong_loss(reference, ranks, alone, together, first_step, tolerance);
  }
  return final_state_differs(together, tolerance);
}

}  // namespace tp::train
