// Checks shared by the stage checkers (see predicates.h).
#include "tensorplay/train/predicates.h"

#include <algorithm>

#include "tensorplay/error.h"

namespace tp::train {

using detail::cat;

namespace {

const char* noun(Collective kind, uint64_t count) {
  if (kind == Collective::AllReduce) return count == 1 ? "all-reduce" : "all-reduces";
  return count == 1 ? "broadcast" : "broadcasts";
}

uint64_t count_of(const RankResult& r, Collective kind, size_t i) {
  const std::vector<uint64_t>& counts =
      kind == Collective::AllReduce ? r.allreduces_per_micro : r.broadcasts_per_micro;
  return i < counts.size() ? counts[i] : 0;
}

// "step 2" or, with accumulation, "step 2 (micro-batch 5)".
std::string where(const RunConfig& config, int rank, int64_t i) {
  const int64_t k = config.micro_batches;
  return k == 1 ? cat("rank ", rank, ", step ", i)
                : cat("rank ", rank, ", step ", i / k, " (micro-batch ", i, ")");
}

std::string list(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

std::string buckets_text(const std::vector<std::vector<int64_t>>& buckets) {
  std::string out;
  for (size_t b = 0; b < buckets.size(); ++b) out += (b ? " " : "") + list(buckets[b]);
  return out.empty() ? "(none)" : out;
}

// The events of one optimizer step on one rank's trace, by role.
struct StepEvents {
  int64_t step = -1;
  const trace::Event* last_backward = nullptr;  // the step's syncing backward
  const trace::Event* optimizer = nullptr;
  std::vector<const trace::Event*> graph_done;       // engine marks, any backward
  std::vector<const trace::Event*> allreduce_queued;  // instants on the issuing thread
  std::vector<const trace::Event*> allreduce_spans;   // spans on the comm thread
};

// Splits a rank's trace into steps, by the "step" spans' order positions.
// Returns an empty list for a trace without steps.
std::vector<StepEvents> steps_of_trace(const RankResult& r) {
  std::vector<StepEvents> steps;
  std::vector<std::pair<uint64_t, uint64_t>> bounds;  // [begin, end] of each step span
  for (const trace::Event& e : r.events) {
    if (e.name != "step" || e.phase != 'X') continue;
    StepEvents s;
    s.step = e.args.empty() ? static_cast<int64_t>(steps.size()) : e.args[0].second;
    steps.push_back(s);
    bounds.emplace_back(e.begin_order, e.end_order == 0 ? UINT64_MAX : e.end_order);
  }
  for (const trace::Event& e : r.events) {
    for (size_t s = 0; s < steps.size(); ++s) {
      if (e.begin_order < bounds[s].first || e.begin_order > bounds[s].second) continue;
      StepEvents& step = steps[s];
      if (e.name == "backward" && e.phase == 'X') {
        step.last_backward = &e;  // events are in begin order: the last one wins
      } else if (e.name == "optimizer" && e.phase == 'X') {
        step.optimizer = &e;
      } else if (e.name == "graph done") {
        step.graph_done.push_back(&e);
      } else if (e.name == "allreduce queued") {
        step.allreduce_queued.push_back(&e);
      } else if (e.name == "allreduce" && e.phase == 'X') {
        step.allreduce_spans.push_back(&e);
      }
      break;
    }
  }
  return steps;
}

// The finding for a trace that cannot support an order check.
std::vector<Finding> missing_trace(const RankResult& r, size_t steps_seen, int64_t steps_run) {
  return {{cat("rank ", r.rank, ": the trace shows ", steps_seen, " training steps, the run had ",
               steps_run),
           "the order checks need RunConfig::trace on every rank"}};
}

}  // namespace

std::vector<Finding> check_construction_counts(const CaseRun& run, uint64_t broadcasts,
                                               uint64_t allreduces,
                                               const std::string& broadcast_cause) {
  for (const RankResult& r : run.ranks) {
    if (r.construction_broadcasts != broadcasts) {
      return {{cat("rank ", r.rank, ": the constructor issued ", r.construction_broadcasts,
                   " broadcasts; expected ", broadcasts, " (", run.num_params(), " parameters",
                   run.num_buffers() > 0 ? cat(", ", run.num_buffers(), " buffers") : "", ")"),
               broadcast_cause}};
    }
    if (r.construction_allreduces != allreduces) {
      return {{cat("rank ", r.rank, ": the constructor issued ", r.construction_allreduces,
                   " all-reduces; expected ", allreduces),
               "construction copies rank 0's model with broadcasts; all-reduce averages"}};
    }
  }
  return {};
}

std::vector<Finding> check_counts_per_micro(
    const CaseRun& run, Collective kind,
    const std::function<uint64_t(int64_t step, int64_t micro)>& expected,
    const std::string& expectation, const std::string& cause) {
  const int64_t k = run.config.micro_batches;
  for (const RankResult& r : run.ranks) {
    for (int64_t i = 0; i < micro_batches_of(run.config, r.rank); ++i) {
      const uint64_t want = expected(i / k, i % k);
      const uint64_t got = count_of(r, kind, static_cast<size_t>(i));
      if (got == want) continue;
      return {{cat(where(run.config, r.rank, i), ": counted ", got, " ", noun(kind, got),
                   "; expected ", want, " (", expectation, ")"),
               cause}};
    }
  }
  return {};
}

std::vector<Finding> check_allreduces_per_step(const CaseRun& run, uint64_t expected,
                                               const std::string& expectation,
                                               const std::string& cause) {
  const int64_t k = run.config.micro_batches;
  for (const RankResult& r : run.ranks) {
    for (int64_t step = 0; step < steps_of(run.config, r.rank); ++step) {
      const uint64_t got = allreduces_in_step(r, k, step);
      if (got == expected) continue;
      return {{cat("rank ", r.rank, ", step ", step, ": counted ", got, " all-reduces; expected ",
                   expected, " (", expectation, ")"),
               cause}};
    }
  }
  return {};
}

std::vector<Finding> check_quiet_until_last_micro_batch(const CaseRun& run,
                                                        const std::string& cause) {
  const int64_t k = run.config.micro_batches;
  if (k == 1) return {};
  for (const RankResult& r : run.ranks) {
    for (int64_t i = 0; i < micro_batches_of(run.config, r.rank); ++i) {
      if (i % k == k - 1) continue;
      const auto at = static_cast<size_t>(i);
      const uint64_t got = count_of(r, Collective::AllReduce, at) +
                           count_of(r, Collective::Broadcast, at);
      if (got == 0) continue;
      return {{cat(where(run.config, r.rank, i), ": counted ", got,
                   " collectives in a micro-batch that only accumulates (", k,
                   " micro-batches per step, only the last one syncs)"),
               cause}};
    }
  }
  return {};
}

std::vector<Finding> check_sync_between_backward_and_step(const CaseRun& run,
                                                          const Advice& advice) {
  const int64_t k = run.config.micro_batches;
  for (const RankResult& r : run.ranks) {
    const std::vector<StepEvents> steps = steps_of_trace(r);
    const int64_t steps_run = steps_of(run.config, r.rank);
    if (static_cast<int64_t>(steps.size()) != steps_run) {
      return missing_trace(r, steps.size(), steps_run);
    }
    for (const StepEvents& s : steps) {
      const std::string at = cat("rank ", r.rank, ", step ", s.step);
      const uint64_t counted = allreduces_in_step(r, k, s.step);
      if (s.allreduce_spans.size() != counted) {
        return {{cat(at, ": ", counted, " all-reduces were issued but ", s.allreduce_spans.size(),
                     " ran before the step ended"),
                 "wait() for every all-reduce " + advice.where_sync + " before returning"}};
      }
      const uint64_t backward_end = s.last_backward ? s.last_backward->end_order : UINT64_MAX;
      const uint64_t optimizer_begin = s.optimizer ? s.optimizer->begin_order : 0;
      for (const trace::Event* a : s.allreduce_spans) {
        if (a->begin_order < backward_end) {
          return {{at + ": an all-reduce started before backward finished",
                   "average the gradients " + advice.how_sync_runs +
                       ": the gradients are not final before"}};
        }
        // end_order 0: the span never ended, the collective was still running.
        if (optimizer_begin == 0 || a->end_order == 0 || a->end_order > optimizer_begin) {
          return {{at + ": an all-reduce was still running when the optimizer step began",
                   "wait() for every all-reduce " + advice.where_sync +
                       ": the optimizer must read averaged gradients"}};
        }
      }
    }
  }
  return {};
}

std::vector<Finding> check_overlap(const CaseRun& run, const std::string& launch_cause,
                                   const std::string& wait_cause) {
  const int64_t k = run.config.micro_batches;
  for (const RankResult& r : run.ranks) {
    const std::vector<StepEvents> steps = steps_of_trace(r);
    const int64_t steps_run = steps_of(run.config, r.rank);
    if (static_cast<int64_t>(steps.size()) != steps_run) {
      return missing_trace(r, steps.size(), steps_run);
    }
    for (const StepEvents& s : steps) {
      const std::string at = cat("rank ", r.rank, ", step ", s.step);
      if (s.last_backward == nullptr) {
        return {{at + ": the trace shows no backward", "the order checks need RunConfig::trace"}};
      }
      // The engine's mark for the syncing backward: the one inside its span.
      const trace::Event* done = nullptr;
      for (const trace::Event* g : s.graph_done) {
        if (g->begin_order > s.last_backward->begin_order &&
            g->begin_order < s.last_backward->end_order) {
          done = g;
        }
      }
      if (done == nullptr) {
        return {{at + ": the trace has no \"graph done\" mark inside the backward span",
                 "the autograd engine marks the end of the graph when tracing is on; is "
                 "backward run through tp::Tensor::backward?"}};
      }
      // All-reduces launched during the syncing backward (a stage may issue
      // others earlier, e.g. in forward; those are not the buckets').
      size_t launched = 0;
      size_t late = 0;
      for (const trace::Event* q : s.allreduce_queued) {
        if (q->begin_order < s.last_backward->begin_order) continue;
        ++launched;
        if (q->begin_order > done->begin_order) ++late;
      }
      if (launched == 0 && allreduces_in_step(r, k, s.step) > 0) {
        return {{at + ": no all-reduce was launched during the step's backward",
                 launch_cause}};
      }
      if (late > 0) {
        return {{cat(at, ": ", late, " of ", launched, " all-reduces were launched after the "
                     "autograd graph had finished (from end-of-backward callbacks), so they "
                     "could not overlap with backward"),
                 launch_cause}};
      }
      const uint64_t optimizer_begin = s.optimizer ? s.optimizer->begin_order : 0;
      for (const trace::Event* a : s.allreduce_spans) {
        if (optimizer_begin == 0 || a->end_order == 0 || a->end_order > optimizer_begin) {
          return {{at + ": an all-reduce was still running when the optimizer step began",
                   wait_cause}};
        }
      }
    }
  }
  return {};
}

std::vector<std::vector<int64_t>> expected_buckets(const Snapshot& params, size_t element_size,
                                                   double bucket_cap_mb,
                                                   double first_bucket_cap_mb) {
  const double mib = 1024.0 * 1024.0;
  std::vector<std::vector<int64_t>> buckets;
  std::vector<int64_t> open;
  double bytes = 0.0;
  for (auto p = static_cast<int64_t>(params.size()) - 1; p >= 0; --p) {
    open.push_back(p);
    bytes += static_cast<double>(params[static_cast<size_t>(p)].values.size() * element_size);
    const double cap = (buckets.empty() ? first_bucket_cap_mb : bucket_cap_mb) * mib;
    if (bytes >= cap) {
      buckets.push_back(std::move(open));
      open.clear();
      bytes = 0.0;
    }
  }
  if (!open.empty()) buckets.push_back(std::move(open));
  return buckets;
}

std::vector<Finding> check_buckets(const CaseRun& run,
                                   const std::vector<std::vector<int64_t>>& expected,
                                   const std::string& cause) {
  for (const RankResult& r : run.ranks) {
    if (r.buckets == expected) continue;
    return {{cat("rank ", r.rank, "'s buckets (parameter indices, in bucket order) are ",
                 buckets_text(r.buckets), "; the rule gives ", buckets_text(expected)),
             cause}};
  }
  return {};
}

}  // namespace tp::train
