// Checks shared by the stage checkers (see predicates.h).
#include "tensorplay/train/predicates.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>

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

int64_t seq_of(const trace::Event& e) { return arg_of(e, "seq"); }

// A count rule broken at W = 1 by a DDP that skips its collectives there
// ("nothing to average") deserves its reason, since the numbers all match.
std::string at_one_rank(const RunConfig& config, uint64_t got, uint64_t expected) {
  if (config.world_size != 1 || got >= expected) return "";
  return ". The rule holds at W = 1 too: the checker counts calls, the same at every world "
         "size, so that one protocol is checked at every W (a collective over one rank "
         "returns its input, and PyTorch's DDP communicates at W = 1 as well); do not skip "
         "collectives when the world size is 1";
}

// One all-reduce as the trace shows it: queued on the issuing thread, run on
// the communication thread, waited for on a thread of the program; paired
// by their sequence number, so an all-reduce that runs after its step ended
// still belongs to its step.
struct AllReduce {
  const trace::Event* queued = nullptr;
  const trace::Event* span = nullptr;  // null: it never ran before the trace ended
  const trace::Event* wait = nullptr;  // the first wait() on it to return; null: none did
};

// The events of one optimizer step on one rank's trace, by role.
struct StepEvents {
  int64_t step = -1;
  const trace::Event* last_backward = nullptr;  // the step's syncing backward
  const trace::Event* optimizer = nullptr;
  std::vector<const trace::Event*> graph_done;  // engine marks, any backward of the step
  std::vector<const trace::Event*> grad_ready;  // AccumulateGrad marks, likewise
  std::vector<AllReduce> allreduces;            // queued during the step, in queue order
  std::vector<const trace::Event*> waits;       // Work::wait spans on the main thread
};

// Splits a rank's trace into steps, by the "step" spans' order positions.
// Returns an empty list for a trace without steps.
std::vector<StepEvents> steps_of_trace(const RankResult& r) {
  std::vector<StepEvents> steps;
  std::vector<std::pair<uint64_t, uint64_t>> bounds;  // [begin, end] of each step span
  std::map<int64_t, const trace::Event*> spans_by_seq;
  std::map<int64_t, const trace::Event*> waits_by_seq;  // the first to return
  for (const trace::Event& e : r.events) {
    if (e.name == "allreduce" && e.phase == 'X') spans_by_seq[seq_of(e)] = &e;
    if (e.name == "wait" && e.phase == 'X' && e.end_order != 0) {
      const trace::Event*& first = waits_by_seq[seq_of(e)];
      if (first == nullptr || e.end_order < first->end_order) first = &e;
    }
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
      } else if (e.name == "grad ready") {
        step.grad_ready.push_back(&e);
      } else if (e.name == "wait" && e.phase == 'X') {
        step.waits.push_back(&e);
      } else if (e.name == "allreduce queued") {
        const auto span = spans_by_seq.find(seq_of(e));
        const auto wait = waits_by_seq.find(seq_of(e));
        step.allreduces.push_back({&e, span == spans_by_seq.end() ? nullptr : span->second,
                                   wait == waits_by_seq.end() ? nullptr : wait->second});
      }
      break;
    }
  }
  return steps;
}

// Note [Finished means waited for]
// An all-reduce is finished, for the program, when a wait() on it has
// returned: only then may its tensor be read (work.h). Whether the
// communication thread happened to be done already is a race the program
// does not control, so an order check on the collective's own span would
// pass or fail by luck; a check on the wait() is the same on every run.
// (wait() returns after the span ends, so it implies that order too.)

// True when `a` was waited for (a wait() on it returned) before `order`.
bool waited_before(const AllReduce& a, uint64_t order) {
  return a.wait != nullptr && order != 0 && a.wait->end_order < order;
}

// The first all-reduce of `step` not waited for before the step's
// optimizer began (Note [Finished means waited for]); null when all were.
const AllReduce* unfinished_before_optimizer(const StepEvents& step) {
  const uint64_t optimizer_begin = step.optimizer ? step.optimizer->begin_order : 0;
  for (const AllReduce& a : step.allreduces) {
    if (!waited_before(a, optimizer_begin)) return &a;
  }
  return nullptr;
}

// "an all-reduce was still running when the optimizer step began", said of
// `a` (of step `s`) as the trace shows it.
std::string still_running_at_optimizer(const std::string& at, const StepEvents& s,
                                       const AllReduce& a) {
  const uint64_t optimizer_begin = s.optimizer ? s.optimizer->begin_order : 0;
  const bool done_in_time = a.span != nullptr && a.span->end_order != 0 &&
                            a.span->end_order < optimizer_begin;
  return cat(at, ": all-reduce #", seq_of(*a.queued),
             done_in_time ? " happened to be done in time on this run, but as far as the "
                            "program knew it"
                          : "",
             " was still running when the optimizer step began: ",
             a.wait == nullptr ? "nothing waited for it" : "it was waited for only after that");
}
// Splits rank r's trace into `steps`; returns a finding instead when the
// trace does not show every step the rank ran (no trace, or a truncated
// one), since an empty trace would pass every order check.
std::vector<Finding> traced_steps(const CaseRun& run, const RankResult& r,
                                  std::vector<StepEvents>& steps) {
  steps = steps_of_trace(r);
  const int64_t steps_run = steps_of(run.config, r.rank);
  if (static_cast<int64_t>(steps.size()) == steps_run) return {};
  return {{cat("rank ", r.rank, ": the trace shows ", steps.size(), " training steps, the run had ",
               steps_run),
           "the order checks need RunConfig::trace on every rank"}};
}

}  // namespace

int64_t arg_of(const trace::Event& e, const char* name) {
  for (const auto& [key, value] : e.args) {
    if (key == name) return value;
  }
  return -1;
}

const trace::Event* span_around(const std::vector<trace::Event>& events, const trace::Event& e) {
  const trace::Event* in = nullptr;
  for (const trace::Event& span : events) {
    if (span.phase != 'X' || span.tid != e.tid || span.name == "step" ||
        span.begin_order >= e.begin_order || span.end_order <= e.begin_order) {
      continue;
    }
    if (in == nullptr || span.begin_order > in->begin_order) in = &span;
  }
  return in;
}

std::vector<Finding> check_construction_counts(const CaseRun& run, uint64_t broadcasts,
                                               uint64_t allreduces,
                                               const std::string& broadcast_cause,
                                               std::optional<uint64_t> allgathers) {
  for (const RankResult& r : run.ranks) {
    if (allgathers && r.construction_allgathers != *allgathers) {
      return {{cat("rank ", r.rank, ": the constructor issued ", r.construction_allgathers,
                   " all-gathers; expected ", *allgathers),
               "check that every rank wraps the same model once: the parameter count, then "
               "every parameter's shape, each in one all-gather"}};
    }
    if (r.construction_broadcasts != broadcasts) {
      return {{cat("rank ", r.rank, ": the constructor issued ", r.construction_broadcasts,
                   " broadcasts; expected ", broadcasts, " (", run.num_params(), " parameters",
                   run.num_buffers() > 0 ? cat(", ", run.num_buffers(), " buffers") : "", ")"),
               broadcast_cause + at_one_rank(run.config, r.construction_broadcasts, broadcasts)}};
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
               cause + at_one_rank(run.config, got, want)}};
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
               cause + at_one_rank(run.config, got, expected)}};
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
      // Buffers synced every step are broadcast in the first micro-batch's
      // forward (BufferSync::EveryStep); nothing else may communicate.
      const bool buffers_due = run.config.buffer_sync == BufferSync::EveryStep && i % k == 0;
      const uint64_t allreduces = count_of(r, Collective::AllReduce, at);
      const uint64_t broadcasts = buffers_due ? 0 : count_of(r, Collective::Broadcast, at);
      if (allreduces + broadcasts == 0) continue;
      return {{cat(where(run.config, r.rank, i), ": counted ", allreduces, " ",
                   noun(Collective::AllReduce, allreduces), " and ", broadcasts, " ",
                   noun(Collective::Broadcast, broadcasts),
                   " in a micro-batch that only accumulates (", k,
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
    std::vector<StepEvents> steps;
    if (std::vector<Finding> missing = traced_steps(run, r, steps); !missing.empty()) return missing;
    for (const StepEvents& s : steps) {
      const std::string at = cat("rank ", r.rank, ", step ", s.step);
      const uint64_t counted = allreduces_in_step(r, k, s.step);
      if (s.allreduces.size() != counted) {
        return {{cat(at, ": ", counted, " all-reduces were counted but the trace shows ",
                     s.allreduces.size(), " queued in the step"),
                 "the order checks need RunConfig::trace on every rank"}};
      }
      if (s.last_backward == nullptr) {
        return {{at + ": the trace shows no backward", "the order checks need RunConfig::trace"}};
      }
      const uint64_t backward_end = s.last_backward->end_order;
      for (const AllReduce& a : s.allreduces) {
        if (a.queued->begin_order < backward_end) {
          return {{at + ": an all-reduce was issued before backward finished",
                   "average the gradients " + advice.how_sync_runs +
                       ": the gradients are not final before"}};
        }
      }
      if (const AllReduce* a = unfinished_before_optimizer(s)) {
        return {{still_running_at_optimizer(at, s, *a),
                 "wait() for every all-reduce " + advice.where_sync +
                     ": the optimizer must read averaged gradients"}};
      }
    }
  }
  return {};
}

namespace {

// What check_overlap holds every step to.
struct OverlapRule {
  const std::vector<std::vector<int64_t>>& buckets;  // may be empty: order unknown
  size_t trailing;  // all-reduces launched after the buckets (stage 05's used-map)
  const std::string& launch_cause;
  const std::string& wait_cause;
};

// The engine's marks of a step's syncing backward, and what it launched.
struct BackwardMarks {
  const trace::Event* done = nullptr;      // the "graph done" mark inside the backward
  std::vector<const trace::Event*> ready;  // its "grad ready" marks, in order
  // All-reduces queued during the backward (a stage may issue others
  // earlier, e.g. in forward; those are not the buckets').
  std::vector<const AllReduce*> launched;
};

// REQUIRES: s.last_backward != nullptr.
BackwardMarks marks_of_backward(const StepEvents& s) {
  const uint64_t backward_begin = s.last_backward->begin_order;
  const uint64_t backward_end = s.last_backward->end_order;
  auto inside_backward = [&](const trace::Event* e) {
    return e->begin_order > backward_begin && e->begin_order < backward_end;
  };
  BackwardMarks m;
  for (const trace::Event* g : s.graph_done) {
    if (inside_backward(g)) m.done = g;
  }
  for (const trace::Event* g : s.grad_ready) {
    if (inside_backward(g)) m.ready.push_back(g);
  }
  for (const AllReduce& a : s.allreduces) {
    if (a.queued->begin_order > backward_begin) m.launched.push_back(&a);
  }
  return m;
}

// All-reduces launched after the autograd graph had finished (from an
// end-of-backward callback), so they could not overlap with backward. The
// ones after the buckets (a used-map) are named apart: a late used-map is a
// different mistake from a late bucket.
// REQUIRES: m.done != nullptr.
std::vector<Finding> launched_after_graph_done(const std::string& at, const BackwardMarks& m,
                                               const OverlapRule& rule) {
  size_t late = 0;
  for (const AllReduce* a : m.launched) late += a->queued->begin_order > m.done->begin_order;
  size_t late_trailing = 0;
  for (size_t i = rule.buckets.size(); i < m.launched.size() && rule.trailing > 0; ++i) {
    late_trailing += m.launched[i]->queued->begin_order > m.done->begin_order;
  }
  if (late > 0 && late == late_trailing) {
    return {{cat(at, ": the ", late, " all-reduce", late == 1 ? "" : "s",
                 " after the buckets (the used-map) ", late == 1 ? "was" : "were",
                 " launched after the autograd graph had finished (from an end-of-backward "
                 "callback), while the buckets left from the hooks"),
             rule.launch_cause}};
  }
  if (late > 0) {
    return {{cat(at, ": ", late, " of ", m.launched.size(), " all-reduces were launched after "
                 "the autograd graph had finished (from end-of-backward callbacks), so they "
                 "could not overlap with backward"),
             rule.launch_cause}};
  }
  return {};
}

// Note [Launch deadlines]
// Launched in bucket order, bucket b can leave as soon as every parameter
// of buckets 0..b has its gradient; it must leave before the engine
// produces the next gradient after that (or, for the last one, before the
// graph is done). A DDP that holds a complete bucket back (launching
// everything from the last hook, say) misses its deadline. A parameter the
// syncing micro-batch did not reach gets no "grad ready" mark; a DDP that
// finds unused parameters can mark it ready as early as the first
// gradient, so that is its deadline's start.

// parameter -> position of its gradient in m.ready (Note [Launch deadlines]).
std::map<int64_t, size_t> ready_positions(const RankResult& r, const StepEvents& s, int64_t k,
                                          const BackwardMarks& m,
                                          const std::map<int64_t, int64_t>& param_of_id) {
  std::map<int64_t, size_t> ready_at;
  for (size_t i = 0; i < m.ready.size(); ++i) {
    const auto p = param_of_id.find(arg_of(*m.ready[i], "tensor"));
    if (p != param_of_id.end()) ready_at[p->second] = i;
  }
  const auto last_micro = static_cast<size_t>((s.step + 1) * k - 1);
  if (last_micro < r.unreached_per_micro.size()) {
    for (int64_t p : r.unreached_per_micro[last_micro]) ready_at.emplace(p, 0);
  }
  return ready_at;
}

// For each bucket b in order, the position in m.ready of the last gradient
// buckets 0..b need; stops before the first bucket with a parameter
// without a mark (no deadline to hold it to), or at once when the launches
// do not pair with the buckets.
std::vector<size_t> bucket_completions(const BackwardMarks& m,
                                       const std::map<int64_t, size_t>& ready_at,
                                       const OverlapRule& rule) {
  std::vector<size_t> completions;
  if (m.launched.size() != rule.buckets.size() + rule.trailing) return completions;
  size_t complete = 0;
  for (const std::vector<int64_t>& bucket : rule.buckets) {
    for (int64_t p : bucket) {
      const auto found = ready_at.find(p);
      if (found == ready_at.end()) return completions;
      complete = std::max(complete, found->second);
    }
    completions.push_back(complete);
  }
  return completions;
}

// A bucket launched after its deadline (Note [Launch deadlines]): it
// waited instead of overlapping.
std::vector<Finding> bucket_held_back(const std::string& at, const BackwardMarks& m,
                                      const std::vector<size_t>& completions,
                                      const OverlapRule& rule) {
  const size_t gradients = m.ready.size();
  for (size_t b = 0; b < completions.size(); ++b) {
    const size_t complete = completions[b];
    const uint64_t deadline = complete + 1 < gradients ? m.ready[complete + 1]->begin_order
                                                       : m.done->begin_order;
    if (m.launched[b]->queued->begin_order <= deadline) continue;
    return {{cat(at, ": bucket ", b, "'s all-reduce was complete at gradient ", complete + 1,
                 " of ", gradients, " but launched only after gradient ",
                 complete + 2 > gradients ? "the last" : std::to_string(complete + 2),
                 " was computed, so it waited instead of overlapping"),
             rule.launch_cause}};
  }
  return {};
}

// Without the buckets' deadlines, what holds for any order: the first
// all-reduce leaves before the last gradient is ready.
std::vector<Finding> launched_after_last_gradient(const std::string& at, const BackwardMarks& m,
                                                  const OverlapRule& rule) {
  if (m.launched.size() < 2 ||
      m.launched.front()->queued->begin_order <= m.ready.back()->begin_order) {
    return {};
  }
  return {{cat(at, ": all ", m.launched.size(), " all-reduces were launched only after the "
               "last gradient of the backward was ready, so none overlapped with computing "
               "the others"),
           rule.launch_cause}};
}

// check_overlap on one step of rank r: the first rule it breaks, in the
// order the step runs (launch, then wait).
std::vector<Finding> overlap_in_step(const CaseRun& run, const RankResult& r,
                                     const StepEvents& s,
                                     const std::map<int64_t, int64_t>& param_of_id,
                                     const OverlapRule& rule) {
  const int64_t k = run.config.micro_batches;
  const std::string at = cat("rank ", r.rank, ", step ", s.step);
  if (s.last_backward == nullptr) {
    return {{at + ": the trace shows no backward", "the order checks need RunConfig::trace"}};
  }
  const BackwardMarks m = marks_of_backward(s);
  if (m.done == nullptr || m.ready.empty()) {
    return {{at + ": the trace has no \"grad ready\" and \"graph done\" marks inside the "
                  "backward span",
             "the autograd engine marks them when tracing is on; is backward run through "
             "tp::Tensor::backward?"}};
  }
  if (m.launched.empty() && allreduces_in_step(r, k, s.step) > 0) {
    return {{at + ": no all-reduce was launched during the step's backward", rule.launch_cause}};
  }
  if (std::vector<Finding> f = launched_after_graph_done(at, m, rule); !f.empty()) return f;
  const std::vector<size_t> completions =
      bucket_completions(m, ready_positions(r, s, k, m, param_of_id), rule);
  if (std::vector<Finding> f = bucket_held_back(at, m, completions, rule); !f.empty()) return f;
  const bool deadlines_known = !rule.buckets.empty() && completions.size() == rule.buckets.size();
  if (!deadlines_known) {
    if (std::vector<Finding> f = launched_after_last_gradient(at, m, rule); !f.empty()) return f;
  }
  if (const AllReduce* a = unfinished_before_optimizer(s)) {
    return {{still_running_at_optimizer(at, s, *a), rule.wait_cause}};
  }
  return {};
}

}  // namespace

std::vector<Finding> check_overlap(const CaseRun& run,
                                   const std::vector<std::vector<int64_t>>& buckets,
                                   const std::string& launch_cause,
                                   const std::string& wait_cause, size_t trailing) {
  const OverlapRule rule{buckets, trailing, launch_cause, wait_cause};
  for (const RankResult& r : run.ranks) {
    std::vector<StepEvents> steps;
    if (std::vector<Finding> missing = traced_steps(run, r, steps); !missing.empty()) return missing;
    std::map<int64_t, int64_t> param_of_id;  // "grad ready" tensor id -> parameter index
    for (size_t p = 0; p < r.param_ids.size(); ++p) {
      param_of_id[r.param_ids[p]] = static_cast<int64_t>(p);
    }
    for (const StepEvents& s : steps) {
      if (std::vector<Finding> f = overlap_in_step(run, r, s, param_of_id, rule); !f.empty()) {
        return f;
      }
    }
  }
  return {};
}

std::vector<Finding> check_synced_when_backward_returns(const CaseRun& run,
                                                        const std::string& cause) {
  for (const RankResult& r : run.ranks) {
    std::vector<StepEvents> steps;
    if (std::vector<Finding> missing = traced_steps(run, r, steps); !missing.empty()) return missing;
    for (const StepEvents& s : steps) {
      if (s.last_backward == nullptr) continue;  // check_overlap says so
      for (const AllReduce& a : s.allreduces) {
        if (a.queued->begin_order < s.last_backward->begin_order) continue;
        if (waited_before(a, s.last_backward->end_order)) continue;
        return {{cat("rank ", r.rank, ", step ", s.step, ": all-reduce #", seq_of(*a.queued),
                     " was still running when backward() returned (nothing had waited for it), "
                     "so .grad was not final"),
                 cause}};
      }
    }
  }
  return {};
}

std::vector<Finding> check_launch_order(const CaseRun& run,
                                        const std::vector<std::vector<int64_t>>& buckets,
                                        const std::string& cause,
                                        const std::vector<int64_t>& trailing_bytes) {
  std::vector<int64_t> bytes = bucket_bytes(run.reference.final_params, buckets);
  bytes.insert(bytes.end(), trailing_bytes.begin(), trailing_bytes.end());
  for (const RankResult& r : run.ranks) {
    std::vector<StepEvents> steps;
    if (std::vector<Finding> missing = traced_steps(run, r, steps); !missing.empty()) return missing;
    for (const StepEvents& s : steps) {
      std::vector<int64_t> launched;
      for (const AllReduce& a : s.allreduces) launched.push_back(arg_of(*a.queued, "bytes"));
      if (launched == bytes) continue;
      return {{cat("rank ", r.rank, ", step ", s.step, ": the all-reduces carried ",
                   list(launched), " bytes, in that order; the buckets, in order, hold ",
                   list(bytes), trailing_bytes.empty() ? "" : " (the last: after the buckets)"),
               cause}};
    }
  }
  return {};
}

std::vector<Finding> check_grad_storage(const CaseRun& run,
                                        const std::vector<std::vector<int64_t>>& buckets,
                                        bool as_view, const std::string& cause) {
  for (const RankResult& r : run.ranks) {
    if (r.grad_storage.size() != run.num_params()) {
      return {{cat("rank ", r.rank, " reported the gradient storage of ", r.grad_storage.size(),
                   " parameters; the model has ", run.num_params()),
               "every rank must run to the end and report"}};
    }
    auto storage = [&](int64_t p) { return r.grad_storage[static_cast<size_t>(p)]; };
    for (size_t b = 0; b < buckets.size(); ++b) {
      for (int64_t p : buckets[b]) {
        for (size_t c = 0; c < buckets.size(); ++c) {
          for (int64_t q : buckets[c]) {
            if (q <= p) continue;
            // A parameter without a gradient (unused on every rank) has no
            // storage to compare.
            if (storage(p) == 0 || storage(q) == 0) continue;
            const bool shared = storage(p) == storage(q);
            const bool want = as_view && b == c;
            if (shared == want) continue;
            const std::string& name_p = run.reference.final_params[static_cast<size_t>(p)].name;
            const std::string& name_q = run.reference.final_params[static_cast<size_t>(q)].name;
            return {{cat("rank ", r.rank, ": the .grad of ", name_p, " and of ", name_q,
                         shared ? " share one storage" : " live in different storages",
                         as_view ? cat(" although they are ", b == c ? "in" : "not in",
                                       " the same bucket (gradient_as_bucket_view)")
                                 : " (without gradient_as_bucket_view each gradient is its own)"),
                     cause}};
          }
        }
      }
    }
  }
  return {};
}

std::vector<Finding> check_grad_copies(const CaseRun& run, const std::string& cause) {
  uint64_t gradient_bytes = 0;
  for (const ParamValues& p : run.reference.final_params) {
    gradient_bytes += bytes_of(p);  // each in its own dtype (MixedMLP has two)
  }
  const int64_t k = run.config.micro_batches;
  for (const RankResult& r : run.ranks) {
    const auto steps = static_cast<int64_t>(r.grad_copy_bytes_per_micro.size()) / k;
    for (int64_t step = 0; step < steps; ++step) {
      const uint64_t copied = sum_over_step(r.grad_copy_bytes_per_micro, k, step);
      if (copied <= gradient_bytes) continue;
      return {{cat("rank ", r.rank, ", step ", step, ": Tensor::copy_ wrote ", copied,
                   " bytes into the storages the gradients live in, more than the ",
                   gradient_bytes, " bytes of all the gradients: some gradient was copied "
                   "into twice (with gradient_as_bucket_view .grad is the slot, so copying "
                   "the slot back into .grad copies it onto itself)"),
               cause}};
    }
  }
  return {};
}

std::vector<Finding> check_launched_before_first_wait(const CaseRun& run,
                                                      const std::string& cause) {
  for (const RankResult& r : run.ranks) {
    std::vector<StepEvents> steps;
    if (std::vector<Finding> missing = traced_steps(run, r, steps); !missing.empty()) return missing;
    for (const StepEvents& s : steps) {
      if (s.allreduces.size() < 2) continue;
      std::set<int64_t> ours;
      for (const AllReduce& a : s.allreduces) ours.insert(seq_of(*a.queued));
      const trace::Event* first_wait = nullptr;
      for (const trace::Event* w : s.waits) {
        if (ours.count(seq_of(*w)) != 0) {
          first_wait = w;
          break;  // in begin order
        }
      }
      if (first_wait == nullptr) continue;  // check_overlap / the order check say more
      size_t after = 0;
      for (const AllReduce& a : s.allreduces) after += a.queued->begin_order > first_wait->begin_order;
      if (after == 0) continue;
      return {{cat("rank ", r.rank, ", step ", s.step, ": ", after, " of ", s.allreduces.size(),
                   " all-reduces were launched only after waiting for all-reduce #",
                   seq_of(*first_wait), ", so they ran one at a time instead of back to back"),
               cause}};
    }
  }
  return {};
}

uint64_t bytes_of(const ParamValues& param) {
  return param.values.size() * element_size(param.dtype);
}

std::vector<int64_t> bucket_bytes(const Snapshot& params,
                                  const std::vector<std::vector<int64_t>>& buckets) {
  std::vector<int64_t> out;
  for (const std::vector<int64_t>& bucket : buckets) {
    int64_t bytes = 0;
    for (int64_t p : bucket) {
      // An index out of range (a stage's bucket list gone wrong) is
      // check_buckets' to report; it holds no bytes here.
      if (p >= 0 && static_cast<size_t>(p) < params.size()) {
        bytes += static_cast<int64_t>(bytes_of(params[static_cast<size_t>(p)]));
      }
    }
    out.push_back(bytes);
  }
  return out;
}

std::vector<std::vector<int64_t>> expected_buckets(const Snapshot& params, double bucket_cap_mb,
                                                   double first_bucket_cap_mb,
                                                   const std::vector<int64_t>& order) {
  // Caps in whole bytes, as PyTorch computes them: int(cap_mb * 1024 * 1024).
  auto cap_bytes = [](double mb) { return static_cast<uint64_t>(mb * 1024.0 * 1024.0); };
  std::vector<int64_t> in_order = order;
  if (in_order.empty()) {  // reverse registration order
    for (auto p = static_cast<int64_t>(params.size()) - 1; p >= 0; --p) in_order.push_back(p);
  }
  // Per dtype, as PyTorch's compute_bucket_assignment_by_size keys them: the
  // bucket being filled, and whether one of that dtype has closed already
  // (its first bucket gets first_bucket_cap_mb).
  struct Open {
    std::vector<int64_t> params;
    uint64_t bytes = 0;
    bool closed_one = false;
  };
  std::map<Dtype, Open> open;
  std::vector<std::vector<int64_t>> buckets;
  for (int64_t p : in_order) {
    const ParamValues& param = params[static_cast<size_t>(p)];
    Open& bucket = open[param.dtype];
    bucket.params.push_back(p);
    bucket.bytes += bytes_of(param);
    if (bucket.bytes >= cap_bytes(bucket.closed_one ? bucket_cap_mb : first_bucket_cap_mb)) {
      buckets.push_back(std::move(bucket.params));
      bucket.params.clear();
      bucket.bytes = 0;
      bucket.closed_one = true;
    }
  }
  // The buckets still open, by dtype (float32 before float64).
  for (auto& [dtype, bucket] : open) {
    if (!bucket.params.empty()) buckets.push_back(std::move(bucket.params));
  }
  return buckets;
}

std::vector<std::vector<int64_t>> expected_buckets(const CaseRun& run, double bucket_cap_mb,
                                                   double first_bucket_cap_mb,
                                                   const std::vector<int64_t>& order) {
  return expected_buckets(run.reference.final_params, bucket_cap_mb, first_bucket_cap_mb, order);
}

std::vector<Finding> check_allreduce_sizes(
    const CaseRun& run, const std::function<std::vector<int64_t>(int64_t step)>& expected,
    const std::string& what, const std::string& cause) {
  for (const RankResult& r : run.ranks) {
    std::vector<StepEvents> steps;
    if (std::vector<Finding> missing = traced_steps(run, r, steps); !missing.empty()) return missing;
    for (const StepEvents& s : steps) {
      std::vector<int64_t> want = expected(s.step);
      std::multiset<int64_t> left(want.begin(), want.end());
      std::vector<int64_t> carried;  // in queue order
      const AllReduce* stray = nullptr;  // the first that matches nothing left
      for (const AllReduce& a : s.allreduces) {
        const int64_t bytes = arg_of(*a.queued, "bytes");
        carried.push_back(bytes);
        if (const auto found = left.find(bytes); found != left.end()) {
          left.erase(found);
        } else if (stray == nullptr) {
          stray = &a;
        }
      }
      if (stray == nullptr && left.empty()) continue;
      std::sort(want.begin(), want.end());
      std::string fact = cat("rank ", r.rank, ", step ", s.step, ": the all-reduces carried ",
                             list(carried), " bytes, in the order launched; ", what, " hold ",
                             list(want), " (in any order)");
      if (stray == nullptr) return {{fact, cause}};
      const int64_t got = arg_of(*stray->queued, "bytes");
      // Queued in forward, so no bucket's: the one all-reduce a stage issues
      // there is join's count of the ranks still training.
      const trace::Event* in = span_around(r.events, *stray->queued);
      if (in != nullptr && in->name == "forward") {
        return {{cat(fact, ". All-reduce #", seq_of(*stray->queued), " carried ", got,
                     " bytes and was queued in forward: it is no bucket's"),
                 "what a stage all-reduces in forward is join's count of the ranks still training, "
                 "one float32 element (4 bytes; ddp.h's contract, PyTorch's torch.ones(1)): is "
                 "the count's tensor of another dtype or size?"}};
      }
      // A flat tensor with an element per byte of its parameters: right
      // numbers, element_size times the data on the wire.
      for (const int64_t bucket : want) {
        for (const int64_t factor : {4, 8, 2}) {
          if (bucket * factor != got) continue;
          return {{cat(fact, ". All-reduce #", seq_of(*stray->queued), " carried ", got,
                       " bytes, ", factor, " times the ", bucket, " bytes its tensors hold"),
                   cat("is a bucket's flat tensor sized in bytes instead of elements? Give it "
                       "the sum of its parameters' numel(), not of their nbytes(): the averages "
                       "come out right either way, but every all-reduce then moves ", factor,
                       "x the data it needs")}};
        }
      }
      return {{cat(fact, ". All-reduce #", seq_of(*stray->queued), " carried ", got,
                   " bytes, which nothing there holds"),
               cause}};
    }
  }
  return {};
}

std::vector<Finding> check_buckets(const CaseRun& run,
                                   const std::vector<std::vector<int64_t>>& expected,
                                   const std::string& cause) {
  const Snapshot& params = run.reference.final_params;
  for (const RankResult& r : run.ranks) {
    if (r.buckets == expected) continue;
    // One bucket, one flat tensor, one dtype: a bucket that mixes them says
    // why before the rule's lists do.
    for (size_t b = 0; b < r.buckets.size(); ++b) {
      std::map<Dtype, std::string> names;  // a parameter of each dtype in the bucket
      for (int64_t p : r.buckets[b]) {
        if (p < 0 || static_cast<size_t>(p) >= params.size()) continue;
        names.emplace(params[static_cast<size_t>(p)].dtype, params[static_cast<size_t>(p)].name);
      }
      if (names.size() < 2) continue;
      const auto& [dtype_a, name_a] = *names.begin();
      const auto& [dtype_b, name_b] = *std::next(names.begin());
      return {{cat("rank ", r.rank, "'s bucket ", b, " holds parameters of different dtypes: ",
                   name_a, " (", to_string(dtype_a), ") and ", name_b, " (", to_string(dtype_b),
                   "); its buckets are ", buckets_text(r.buckets), ", the rule gives ",
                   buckets_text(expected)),
               "a bucket is all-reduced as one flat tensor of one dtype: keep one open bucket "
               "per dtype, each with its own caps (the first bucket of each dtype gets "
               "first_bucket_cap_mb), as PyTorch does (Note [Bucket assignment])"}};
    }
    return {{cat("rank ", r.rank, "'s buckets (parameter indices, in bucket order) are ",
                 buckets_text(r.buckets), "; the rule gives ", buckets_text(expected)),
             cause}};
  }
  return {};
}

std::vector<Finding> first_findings(std::initializer_list<CaseCheck> checks) {
  for (const CaseCheck& check : checks) {
    std::vector<Finding> found = check();
    if (!found.empty()) return found;
  }
  return {};
}

}  // namespace tp::train
