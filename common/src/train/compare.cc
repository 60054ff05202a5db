// Comparing a DDP run with the reference, and diagnosing the difference.
#include "tensorplay/train/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "tensorplay/error.h"

namespace tp::train {

// Note [Tolerance]
// A correct DDP and the reference compute the same sums in a different order:
// the reference accumulates g_0/W + g_1/W + ... in rank order, while DDP sums
// g_0 + ... + g_{W-1} in the all-reduce's order and divides once. Each step
// therefore differs by a few units in the last place (float32: 2^-24 ~ 6e-8
// relative; float64: 2^-53 ~ 1e-16), and training carries that forward with
// little growth over the kit's short runs. Measured on the solution:
// `build/tests/check_01_solution` prints max |param diff| 7.5e-9 (float32,
// W = 4) and 2.8e-17 (float64), losses within 1.4e-17; `./kit demo 01`
// (float32, 10 steps) 1.5e-8. We compare
//   |ddp - ref| <= tolerance * max(1, |ref|)
// (for the kit's losses and parameters, mostly below 1, that is an absolute
// bound; whole snapshots are compared by their largest absolute difference
// against the tolerance itself, which is stricter for the few values above
// 1) with tolerance 1e-5 (float32) and 1e-10 (float64): about 100x above the
// rounding noise, and far below the smallest effect of a real bug (a
// gradient left unaveraged moves a parameter by ~lr * |g| ~ 1e-3 in one step).
double default_tolerance(Dtype dtype) {
  return dtype == kFloat64 ? 1e-10 : 1e-5;
}

namespace {

// Note [Non-finite values]
// An infinity matches only the same infinity, and a NaN matches nothing,
// not even a NaN (as in IEEE comparison): tolerance * max(1, |inf|) is
// infinite and would let an inf "match" anything, and inf - inf is NaN, so
// neither the tolerance test nor |a - b| can be used as they stand.

// |a - b|, with Note [Non-finite values]: 0 for the same infinity, infinite
// when either is NaN or only one is infinite.
double distance(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return INFINITY;
  if (a == b) return 0.0;  // also +inf == +inf
  return std::abs(a - b);  // infinite when one side is
}

bool differs(double a, double b, double tolerance) {
  if (!std::isfinite(a) || !std::isfinite(b)) return distance(a, b) != 0.0;
  return std::abs(a - b) > tolerance * std::max(1.0, std::abs(b));
}

// Largest |a - b| over all parameters (a and b list the same parameters).
ParamDiff diff_snapshots(const Snapshot& a, const Snapshot& b, int rank) {
  ParamDiff out;
  out.rank = rank;
  for (size_t p = 0; p < a.size() && p < b.size(); ++p) {
    const auto& va = a[p].values;
    const auto& vb = b[p].values;
    for (size_t i = 0; i < va.size() && i < vb.size(); ++i) {
      const double d = distance(va[i], vb[i]);
      if (d > out.max_abs || out.name.empty()) {
        out.max_abs = d;
        out.name = a[p].name;
        out.element = static_cast<int64_t>(i);
      }
    }
  }
  return out;
}

const ParamValues* find(const Snapshot& snap, const std::string& name) {
  for (const ParamValues& p : snap) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

// "[0.1, -0.2, 0.3, 0.04]": the first few values of a parameter.
std::string first_values(const ParamValues* p, size_t count = 4) {
  if (p == nullptr) return "[missing]";
  std::string out = "[";
  for (size_t i = 0; i < p->values.size() && i < count; ++i) {
    if (i) out += ", ";
    out += num(p->values[i]);
  }
  if (p->values.size() > count) out += ", ...";
  return out + "]";
}

// Names of the tensors that differ between two snapshots of the same list.
std::vector<std::string> params_differing(const Snapshot& a, const Snapshot& b,
                                          double tolerance) {
  std::vector<std::string> names;
  for (size_t p = 0; p < a.size() && p < b.size(); ++p) {
    for (size_t i = 0; i < a[p].values.size() && i < b[p].values.size(); ++i) {
      if (differs(a[p].values[i], b[p].values[i], tolerance)) {
        names.push_back(a[p].name);
        break;
      }
    }
  }
  return names;
}

// ||after - before|| over all parameters: the size of one optimizer update.
double update_norm(const Snapshot& before, const Snapshot& after) {
  double sum = 0.0;
  for (size_t p = 0; p < before.size() && p < after.size(); ++p) {
    for (size_t i = 0; i < before[p].values.size() && i < after[p].values.size(); ++i) {
      double d = after[p].values[i] - before[p].values[i];
      sum += d * d;
    }
  }
  return std::sqrt(sum);
}

// True when every parameter named in `names` holds exactly its initial
// values after the first step: a zero gradient (SGD moves a parameter by
// lr * g in its first step, momentum or not).
bool unmoved(const Snapshot& initial, const Snapshot& after,
             const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    const ParamValues* a = find(initial, name);
    const ParamValues* b = find(after, name);
    if (a == nullptr || b == nullptr || a->values != b->values) return false;
  }
  return !names.empty();
}

// True when a first SGD step p1 = p0 - lr * g used g = p0, i.e. the
// implied gradient (p0 - p1) / lr equals the parameters (to float32
// rounding, amplified by 1/lr): what averaging equal parameters gives.
bool implied_gradient_is_the_parameter(const Snapshot& initial, const Snapshot& after,
                                       double lr) {
  if (lr <= 0 || initial.size() != after.size()) return false;
  for (size_t p = 0; p < initial.size(); ++p) {
    for (size_t i = 0; i < initial[p].values.size() && i < after[p].values.size(); ++i) {
      const double p0 = initial[p].values[i];
      const double g = (p0 - after[p].values[i]) / lr;
      if (std::abs(g - p0) > 1e-4 * std::max(1.0, std::abs(p0))) return false;
    }
  }
  return true;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

// Structural problems (wrong number of ranks, micro-batches, parameters or
// buffers) make every numeric comparison meaningless, so they are reported
// alone.
std::vector<Finding> check_list(const RankResult& r, const char* noun, const Snapshot& mine,
                                const Snapshot& model, const std::string& listing) {
  std::vector<Finding> out;
  if (mine.size() != model.size()) {
    out.push_back({detail::cat("rank ", r.rank, " lists ", mine.size(), " ", noun,
                               "s; the model has ", model.size()),
                   listing + " must list every " + noun + " of the wrapped module, in order"});
    return out;
  }
  for (size_t p = 0; p < mine.size(); ++p) {
    if (mine[p].name != model[p].name || mine[p].shape != model[p].shape) {
      out.push_back({detail::cat("rank ", r.rank, " lists ", noun, " ", p, " as ", mine[p].name,
                                 " ", tp::to_string(mine[p].shape), "; the model's is ",
                                 model[p].name, " ", tp::to_string(model[p].shape)),
                     listing + " must list the wrapped module's " + noun + "s in order"});
      break;
    }
    int64_t elements = 1;
    for (int64_t d : mine[p].shape) elements *= d;
    if (static_cast<int64_t>(mine[p].values.size()) != elements) {
      out.push_back({detail::cat("rank ", r.rank, " reported ", mine[p].values.size(),
                                 " values for ", noun, " ", mine[p].name, " of shape ",
                                 tp::to_string(mine[p].shape)),
                     "the rank's results are incomplete: did it finish its run?"});
      break;
    }
  }
  return out;
}

}  // namespace

std::vector<Finding> check_results_complete(const RunConfig& config,
                                            const ReferenceResult& reference,
                                            const std::vector<RankResult>& ranks) {
  std::vector<Finding> out;
  if (ranks.size() != static_cast<size_t>(config.world_size)) {
    out.push_back({detail::cat(ranks.size(), " ranks reported results; expected ", config.world_size),
                   "every rank must run to the end and report"});
    return out;
  }
  for (size_t index = 0; index < ranks.size(); ++index) {
    const RankResult& r = ranks[index];
    if (r.rank != static_cast<int>(index)) {
      out.push_back({detail::cat("result ", index, " says it is rank ", r.rank),
                     "each rank must report its own rank"});
      return out;
    }
    const int64_t expected = micro_batches_of(config, r.rank);
    if (static_cast<int64_t>(r.losses.size()) != expected) {
      out.push_back({detail::cat("rank ", r.rank, " reported ", r.losses.size(),
                                 " micro-batch losses; its plan has ", expected),
                     "every rank must run each of its micro-batches once"});
    }
    for (const Snapshot* snap : {&r.initial_params, &r.after_first_step, &r.final_params}) {
      // A rank with no batch at all (uneven inputs) takes no step 0.
      if (snap == &r.after_first_step && steps_of(config, r.rank) == 0) continue;
      for (Finding& f : check_list(r, "parameter", *snap, reference.final_params,
                                   "parameters()")) {
        out.push_back(std::move(f));
      }
    }
    for (const auto* counts : {&r.allreduces_per_micro, &r.broadcasts_per_micro}) {
      if (static_cast<int64_t>(counts->size()) != expected) {
        out.push_back({detail::cat("rank ", r.rank, " counted collectives for ", counts->size(),
                                   " micro-batches; its plan has ", expected),
                       "every rank must run each of its micro-batches once"});
        break;
      }
    }
    for (const Snapshot* snap : {&r.initial_buffers, &r.final_buffers}) {
      for (Finding& f : check_list(r, "buffer", *snap,
                                   reference.final_buffers[static_cast<size_t>(r.rank)],
                                   "the module's named_buffers()")) {
        out.push_back(std::move(f));
      }
    }
  }
  return out;
}

Comparison compare(const ReferenceResult& reference, const std::vector<RankResult>& ranks,
                   double tolerance) {
  Comparison c;
  auto worse = [](ParamDiff& acc, const ParamDiff& d) {
    if (d.max_abs > acc.max_abs || acc.name.empty()) acc = d;
  };
  for (const RankResult& r : ranks) {
    const auto rank = static_cast<size_t>(r.rank);
    if (rank >= reference.losses.size()) continue;
    const std::vector<double>& ref_losses = reference.losses[rank];
    for (size_t i = 0; i < r.losses.size() && i < ref_losses.size(); ++i) {
      const double d = distance(r.losses[i], ref_losses[i]);
      if (d > c.max_loss_diff || c.loss_index < 0) {
        c.max_loss_diff = d;
        c.loss_index = static_cast<int64_t>(i);
        c.loss_rank = r.rank;
      }
      if (differs(r.losses[i], ref_losses[i], tolerance) &&
          (c.first_bad_index < 0 || static_cast<int64_t>(i) < c.first_bad_index)) {
        c.first_bad_index = static_cast<int64_t>(i);
      }
    }
    worse(c.initial, diff_snapshots(r.initial_params, reference.initial_params, r.rank));
    if (!r.after_first_step.empty()) {  // empty: a rank with no batch took no step 0
      worse(c.after_first_step, diff_snapshots(r.after_first_step, reference.after_first_step, r.rank));
    }
    worse(c.final_params, diff_snapshots(r.final_params, reference.final_params, r.rank));
    worse(c.initial_between_ranks, diff_snapshots(r.initial_params, ranks[0].initial_params, r.rank));
    worse(c.final_between_ranks, diff_snapshots(r.final_params, ranks[0].final_params, r.rank));
    if (rank < reference.final_buffers.size()) {
      worse(c.final_buffers, diff_snapshots(r.final_buffers, reference.final_buffers[rank], r.rank));
    }
  }
  c.reference_norm = norm(reference.final_params);
  if (!ranks.empty()) c.rank0_norm = norm(ranks[0].final_params);
  return c;
}

namespace {

// Note [Diagnosis order]
// diagnose() runs a list of diagnoses (kDiagnoses, below), each looking for
// one symptom, and reports the first that finds one. A wrong DDP goes wrong
// at one point and everything after it is a consequence, so the earliest
// symptom is the one that names the bug; the list therefore follows the
// run's own order: construction (replicas, then buffers), step 0's
// forwards, step 0's update, the later steps. Two exceptions come first:
// a non-finite value poisons every difference after it (Note [Non-finite
// values]), and a diverged reference leaves nothing to compare with. Only
// the last diagnosis, the later steps, may report several findings (the
// losses, the final parameters, the final buffers).

// What every diagnosis looks at: the run, and the ranks that took step 0.
struct Evidence {
  const RunConfig& config;
  const ReferenceResult& reference;
  const std::vector<RankResult>& ranks;
  double tolerance;
  const Advice& advice;
  // Step 0 is judged on the ranks that took it: with uneven inputs a rank
  // may have no batch at all. Never empty: ranks[0] stands in when none did.
  std::vector<const RankResult*> stepped;

  // The first rank that took step 0: the replica the others are held to.
  const RankResult& rank0() const { return *stepped.front(); }
};

// REQUIRES: ranks is not empty (check_results_complete() passed).
Evidence gather_evidence(const RunConfig& config, const ReferenceResult& reference,
                         const std::vector<RankResult>& ranks, double tolerance,
                         const Advice& advice) {
  Evidence e{config, reference, ranks, tolerance, advice, {}};
  for (const RankResult& r : ranks) {
    if (!r.after_first_step.empty()) e.stepped.push_back(&r);
  }
  if (e.stepped.empty()) e.stepped.push_back(&ranks[0]);
  return e;
}

// ---- Non-finite values -------------------------------------------------------

// A non-finite loss in the reference: it diverged itself, so no DDP can
// match it and the learning rate is to blame.
std::vector<Finding> reference_diverged(const Evidence& e) {
  const int64_t k = e.config.micro_batches;
  const std::vector<std::vector<double>>& losses = e.reference.losses;
  for (size_t r = 0; r < losses.size(); ++r) {
    for (size_t i = 0; i < losses[r].size(); ++i) {
      if (std::isfinite(losses[r][i])) continue;
      return {{detail::cat("the reference itself diverged: rank ", r, "'s loss on micro-batch ",
                           i, " (step ", static_cast<int64_t>(i) / k, ") is ",
                           num(losses[r][i])),
               "the learning rate is too large for this model: lower lr (--lr)"}};
    }
  }
  return {};
}

// "fc1.weight element 3 is inf (...)": the first non-finite value of a
// snapshot; "" when every value is finite.
std::string first_non_finite(const Snapshot& snap) {
  for (const ParamValues& p : snap) {
    for (size_t i = 0; i < p.values.size(); ++i) {
      if (!std::isfinite(p.values[i])) {
        return detail::cat(p.name, " element ", i, " is ", num(p.values[i]), " (",
                           first_values(&p), ")");
      }
    }
  }
  return "";
}

// The first non-finite loss of rank r in step s: " is nan", or with
// accumulation ", micro-batch 5, is nan"; "" while finite.
std::string non_finite_loss(const RunConfig& config, const RankResult& r, int64_t s) {
  const int64_t k = config.micro_batches;
  for (int64_t i = s * k; i < (s + 1) * k && i < static_cast<int64_t>(r.losses.size()); ++i) {
    const double loss = r.losses[static_cast<size_t>(i)];
    if (!std::isfinite(loss)) {
      return detail::cat(k > 1 ? detail::cat(", micro-batch ", i, ",") : "", " is ", num(loss));
    }
  }
  return "";
}

// Note [Points of a run]
// A rank's numbers in the order they were made, numbered by point t: its
// parameters after construction (t = 0), the losses of step s (t = 2s + 1,
// made with the parameters of the update before), its parameters after
// step 0's update (t = 2) and its final parameters, after the last step's
// update (t = 2 * steps). The points in between have no snapshot.

// What rank r made at point t (Note [Points of a run]) that is not finite;
// "" while finite.
std::string non_finite_at(const RunConfig& config, const RankResult& r, int64_t t) {
  const int64_t steps = steps_of(config, r.rank);
  if (t == 0) return first_non_finite(r.initial_params);
  if (t % 2 == 1) return (t - 1) / 2 < steps ? non_finite_loss(config, r, (t - 1) / 2) : "";
  if (t == 2) return first_non_finite(r.after_first_step);
  return t == 2 * steps ? first_non_finite(r.final_params) : "";
}

// "; also on ranks 1, 2" or "; the other ranks stay finite": the ranks
// besides the first of `bad` (the ranks non-finite at one point).
std::string also_non_finite_on(const std::vector<int>& bad, size_t world) {
  if (bad.size() > 1) {
    std::vector<std::string> rest;
    for (size_t b = 1; b < bad.size(); ++b) rest.push_back(std::to_string(bad[b]));
    return "; also on rank" + std::string(rest.size() > 1 ? "s " : " ") + join(rest);
  }
  return world > 1 ? "; the other ranks stay finite" : "";
}

// Why an averaged gradient was not finite, on some ranks or on all.
std::string non_finite_gradient_cause(bool some_ranks) {
  return detail::cat(
      "a division by zero",
      some_ranks ? " on some ranks only (by a number that is 0 there: the rank itself, say)"
                 : " (by W - 1 or another count that can be 0?)",
      ", or a gradient that grew without bound (summed over ranks but never divided, or "
      "accumulated across steps without being zeroed), or one that started from garbage (a "
      "buffer made with empty() and never zeroed, which autograd then adds into)");
}

// The finding for point t (Note [Points of a run]), where the ranks `bad`
// are non-finite, the first of them with `first`.
Finding non_finite_finding(const Evidence& e, int64_t t, const std::vector<int>& bad,
                           const std::string& first) {
  const int rank = bad.front();
  const std::string others = also_non_finite_on(bad, e.ranks.size());
  const std::string division = non_finite_gradient_cause(bad.size() < e.ranks.size());
  if (t == 0) {
    return {detail::cat("rank ", rank, "'s parameters are non-finite right after DDP "
                        "construction: ", first, others),
            "the constructor must only copy rank 0's finite parameters (broadcast): is a "
            "parameter divided, or broadcast from memory that was never written?"};
  }
  if (t % 2 == 1) {
    const int64_t s = (t - 1) / 2;
    return {detail::cat("rank ", rank, "'s loss in step ", s, first,
                        s == 0 ? " although its parameters are finite"
                               : detail::cat(", made with the parameters of step ", s - 1,
                                             "'s update: that update made them non-finite"),
                        others, "; the reference's is finite"),
            s == 0 ? "the forward pass must call the wrapped module on this rank's own "
                     "shard; DDP must not change the forward result"
                   : detail::cat("step ", s - 1, "'s averaged gradient was not finite: ",
                                 division)};
  }
  const int64_t step = t / 2 - 1;  // the update that made them
  return {detail::cat("rank ", rank, "'s parameters went non-finite in step ", step,
                      "'s update", t == 2 ? "" : " (the last)", ": ", first, others,
                      "; the reference's are finite"),
          detail::cat("step ", step, "'s averaged gradient was not finite: ", division)};
}

// The earliest point (Note [Points of a run]) where a value on some rank is
// not finite, over all ranks; named alone, since it poisons every
// difference after it (Note [Non-finite values]).
std::vector<Finding> first_non_finite_value(const Evidence& e) {
  const int64_t longest = total_steps(e.config);
  for (int64_t t = 0; t <= 2 * longest; ++t) {
    std::vector<int> bad;  // ranks non-finite at t
    std::string first;     // what the first of them made
    for (const RankResult& r : e.ranks) {
      const std::string what = non_finite_at(e.config, r, t);
      if (what.empty()) continue;
      if (bad.empty()) first = what;
      bad.push_back(r.rank);
    }
    if (!bad.empty()) return {non_finite_finding(e, t, bad, first)};
  }
  return {};
}

// ---- Construction ------------------------------------------------------------

// Some rank's parameters differ from rank 0's right after construction: the
// constructor's broadcast, the first thing DDP does.
std::vector<Finding> replicas_start_apart(const Evidence& e) {
  const RankResult& rank0 = e.rank0();
  for (const RankResult& r : e.ranks) {
    std::vector<std::string> bad =
        params_differing(r.initial_params, rank0.initial_params, e.tolerance);
    if (bad.empty()) continue;
    ParamDiff d = diff_snapshots(r.initial_params, rank0.initial_params, r.rank);
    // Every broadcast issued, and still apart: they were not finished when
    // the constructor returned (or they moved copies).
    const bool all_issued = r.construction_broadcasts >= r.initial_params.size() &&
                            rank0.construction_broadcasts >= rank0.initial_params.size();
    std::string hint =
        e.config.per_rank_seed
            ? "each rank seeded differently, so only a broadcast makes the replicas equal: "
              "does the constructor broadcast every parameter (and buffer) from rank 0?"
            : "the replicas must be equal after construction: does the constructor broadcast "
              "every parameter from rank 0?";
    if (all_issued) {
      hint = detail::cat(
          "the constructor issued ", r.construction_broadcasts, " broadcasts on rank ", r.rank,
          ", one per tensor, yet the replicas differ when it returns: does it wait() for each "
          "broadcast before returning? A broadcast nothing waited for lands whenever the "
          "communication thread gets to it, perhaps after the first forward. (Or does it "
          "broadcast copies, not the parameters themselves?)");
    }
    return {{detail::cat("right after DDP construction, rank ", r.rank,
                         "'s parameters differ from rank 0's (", join(bad), "); ", d.name,
                         ": max |diff| ", sci(d.max_abs), ", rank 0 ",
                         first_values(find(rank0.initial_params, d.name)), ", rank ", r.rank,
                         " ", first_values(find(r.initial_params, d.name))),
             hint}};
  }
  return {};
}

// The replicas start equal, but not as rank 0's model (the reference's):
// the broadcast came from another rank.
std::vector<Finding> replicas_not_rank0s(const Evidence& e) {
  const RankResult& rank0 = e.rank0();
  ParamDiff init = diff_snapshots(rank0.initial_params, e.reference.initial_params, 0);
  if (!differs(init.max_abs, 0.0, e.tolerance)) return {};
  return {{detail::cat("all ranks start from the same parameters, but not from rank 0's "
                       "model, which the reference uses: ", init.name, " max |diff| ",
                       sci(init.max_abs), ", DDP ",
                       first_values(find(rank0.initial_params, init.name)), ", reference ",
                       first_values(find(e.reference.initial_params, init.name))),
           "broadcast with src = 0: DDP makes every replica a copy of rank 0's model"}};
}

// A rank's buffers after construction are not what the plan says (rank 0's
// when buffers are broadcast, the rank's own otherwise).
std::vector<Finding> initial_buffers_wrong(const Evidence& e) {
  for (const RankResult& r : e.ranks) {
    const Snapshot& expected = e.reference.initial_buffers[static_cast<size_t>(r.rank)];
    std::vector<std::string> bad = params_differing(r.initial_buffers, expected, e.tolerance);
    if (bad.empty()) continue;
    ParamDiff d = diff_snapshots(r.initial_buffers, expected, r.rank);
    const bool synced = e.config.buffer_sync != BufferSync::None;
    return {{detail::cat("right after DDP construction, rank ", r.rank, "'s buffers (",
                         join(bad), ") are not ", synced ? "rank 0's" : "its own", "; ",
                         d.name, ": max |diff| ", sci(d.max_abs), ", rank ", r.rank, " ",
                         first_values(find(r.initial_buffers, d.name)), ", expected ",
                         first_values(find(expected, d.name))),
             synced ? "with broadcast_buffers on, the constructor must broadcast every "
                      "buffer (named_buffers()) from rank 0, like the parameters"
                    : "with broadcast_buffers off, every rank keeps the buffers it built: "
                      "is a buffer broadcast anyway?"}};
  }
  return {};
}

// ---- Step 0 ------------------------------------------------------------------

// A loss of step 0 differs although the parameters match: the forward pass
// (with equal parameters the losses must match exactly).
std::vector<Finding> step0_loss_differs(const Evidence& e) {
  const int64_t k = e.config.micro_batches;
  for (const RankResult& r : e.ranks) {
    const std::vector<double>& ref_losses = e.reference.losses[static_cast<size_t>(r.rank)];
    for (size_t i = 0; i < static_cast<size_t>(k) && i < r.losses.size(); ++i) {
      const double ref = ref_losses[i];
      if (!differs(r.losses[i], ref, e.tolerance)) continue;
      return {{detail::cat("step 0, rank ", r.rank,
                           k > 1 ? detail::cat(", micro-batch ", i) : "", ": loss ",
                           num(r.losses[i]), ", reference ", num(ref), " (|diff| ",
                           sci(std::abs(r.losses[i] - ref)), ") although the parameters match"),
               "the forward pass must call the wrapped module on this rank's own shard "
               "(micro-batch i takes rows (i*W + rank)*B ...); DDP must not change the "
               "forward result"}};
    }
  }
  return {};
}

// Where any rank that took step 0 differs most from the reference after it.
ParamDiff worst_after_step0(const Evidence& e) {
  const RankResult& rank0 = e.rank0();
  ParamDiff worst =
      diff_snapshots(rank0.after_first_step, e.reference.after_first_step, rank0.rank);
  for (const RankResult* r : e.stepped) {
    ParamDiff d = diff_snapshots(r->after_first_step, e.reference.after_first_step, r->rank);
    if (d.max_abs > worst.max_abs) worst = d;
  }
  return worst;
}

// Rank r's first update as a multiple of the reference's.
double update_ratio(const Evidence& e, const RankResult& r) {
  const double ref_update = update_norm(e.reference.initial_params, e.reference.after_first_step);
  const double ddp_update = update_norm(r.initial_params, r.after_first_step);
  return ref_update > 0 ? ddp_update / ref_update : INFINITY;
}

// A ratio within 5% of `target`: far above rounding, far below any other
// ratio the diagnoses tell apart.
bool near(double ratio, double target) { return std::abs(ratio - target) < 0.05 * target; }

// True when every name is a parameter that some micro-batch of step 0 did
// not reach (in the reference's run).
bool all_unreached_in_step0(const Evidence& e, const std::vector<std::string>& names) {
  const std::vector<std::string>& unreached = e.reference.unreached_in_step0;
  return std::all_of(names.begin(), names.end(), [&](const std::string& n) {
    return std::find(unreached.begin(), unreached.end(), n) != unreached.end();
  });
}

// Why the ranks hold different values of `names` after step 0; the first
// explanation that fits the numbers wins.
std::string why_ranks_split(const Evidence& e, const std::vector<std::string>& names) {
  const double w = divisor_at(e.config, 0);
  const size_t total = e.rank0().after_first_step.size();
  // Some ranks stepped with W times the mean, the others with the mean:
  // the division ran on some ranks only.
  std::vector<std::string> times_w;
  bool others_right = true;
  for (const RankResult* r : e.stepped) {
    const double ratio = update_ratio(e, *r);
    if (near(ratio, w)) {
      times_w.push_back(std::to_string(r->rank));
    } else if (!near(ratio, 1.0)) {
      others_right = false;
    }
  }
  if (names.size() == total && others_right && !times_w.empty() && w > 1) {
    return detail::cat("the first update of rank", times_w.size() == 1 ? " " : "s ",
                       join(times_w), " is ", w, "x the reference's while the other ranks "
                       "match it: is the summed gradient divided by the world size on every "
                       "rank?");
  }
  if (all_unreached_in_step0(e, names)) {
    return detail::cat("only ", join(names), " disagree", names.size() == 1 ? "s" : "",
                       " between ranks, parameters that some rank's step-0 micro-batch did not "
                       "reach (no gradient there): such a parameter still takes part in the "
                       "sync and must end with the average on every rank; is its gradient set "
                       "where the rank had none?");
  }
  if (names.size() < total) {
    return detail::cat("only ", join(names), " disagree", names.size() == 1 ? "s" : "",
                       " between ranks while the other parameters agree: is ",
                       names.size() == 1 ? "that parameter" : "each of them", " all-reduced ",
                       e.advice.where_sync, ", or skipped?");
  }
  return "every parameter disagrees between ranks: each rank stepped with its own gradient, so "
         "gradients were not all-reduced, or were read before their all-reduce finished (are "
         "gradients averaged " + e.advice.how_sync_runs + ", is every gradient all-reduced " +
         e.advice.where_sync + ", and is every all-reduce waited for before the optimizer step?)";
}

// The ranks hold different parameters after step 0's update: they stepped
// with different gradients. Before a wrong update they agree on, since a
// gradient not synced alike is the more basic mistake.
std::vector<Finding> ranks_split_after_step0(const Evidence& e) {
  std::set<std::string> split;  // parameters some rank holds apart from rank0
  for (const RankResult* r : e.stepped) {
    for (const std::string& name :
         params_differing(r->after_first_step, e.rank0().after_first_step, e.tolerance)) {
      split.insert(name);
    }
  }
  if (split.empty()) return {};
  const std::vector<std::string> names(split.begin(), split.end());
  const ParamDiff step0 = worst_after_step0(e);
  const RankResult& worst = e.ranks[static_cast<size_t>(std::max(step0.rank, 0))];  // by rank number
  return {{detail::cat("after step 0's update, ranks hold different parameters (", join(names),
                       "); worst vs the reference: rank ", step0.rank, ", ", step0.name,
                       " max |diff| ", sci(step0.max_abs), ", DDP ",
                       first_values(find(worst.after_first_step, step0.name)), ", reference ",
                       first_values(find(e.reference.after_first_step, step0.name))),
           why_ranks_split(e, names)}};
}

// Why only the parameters `wrong` (not all) were updated wrongly, with
// every rank agreeing.
std::string why_only_some_updated_wrongly(const Evidence& e, const std::vector<std::string>& wrong) {
  const std::string only = detail::cat("only ", join(wrong), wrong.size() == 1 ? " was" : " were");
  if (all_unreached_in_step0(e, wrong)) {
    return only + " updated wrongly, parameters that some micro-batch of step 0 did not reach "
                  "(no gradient there), while the other parameters match the reference: does "
                  "such a parameter bring to the sync what its .grad holds (what it accumulated "
                  "under no_sync, zeros where it has nothing), and end with the average, or "
                  "with no gradient where no rank used it?";
  }
  if (unmoved(e.reference.initial_params, e.rank0().after_first_step, wrong)) {
    return detail::cat(only, " updated wrongly, and did not move at all: ",
                       wrong.size() == 1 ? "its gradient was" : "their gradients were",
                       " zero after the sync while the other parameters match the reference. "
                       "Scaled by an integer 1 / W (0 for W > 1), or zeroed (zero_()) after the "
                       "sync? Did they reach the tensor that is all-reduced (with buckets: "
                       "copied into their slots, not left as the slots were made, zeros)? Are "
                       "they ", e.advice.where_grads_move, "?");
  }
  return detail::cat(only, " updated wrongly while the other parameters match the reference: "
                     "are their gradients ", e.advice.where_grads_move, "?");
}

// Why the first update, the same on every rank, is not the reference's;
// told by its size against the reference's, the first fit winning.
std::string why_first_update_wrong(const Evidence& e) {
  const RankResult& rank0 = e.rank0();
  const double ratio = update_ratio(e, rank0);
  const double w = divisor_at(e.config, 0);
  const int64_t k = e.config.micro_batches;
  if (ratio > 1000.0 * std::max(w, static_cast<double>(k))) {  // no count explains it
    return detail::cat("the first update is ", num(ratio), "x the reference's, far beyond any "
                       "count of ranks or micro-batches: the gradient started from garbage (a "
                       "buffer made with empty() and never zeroed, which autograd then adds "
                       "into), or grew without bound");
  }
  if (near(ratio, w)) {  // the sum, never divided
    return detail::cat("step 0's losses match, but the first update is ", num(ratio),
                       "x the reference's (W = ", w, "): is the sum divided by the world size? "
                       "And divided in place (grad.div_(W))? Dividing a copy (grad = grad / W "
                       "makes a new tensor and rebinds the handle) leaves the parameter's .grad "
                       "holding the sum");
  }
  if (ratio < 1e-6) {  // no update at all
    // An integer 1 / W is 1 at W = 1: there it cannot be the cause.
    return detail::cat(
        "the first update is zero: every gradient was zero after the sync, so no averaged "
        "gradient reached the optimizer. ",
        w > 1 ? "Was it scaled by an integer 1 / W (0 for W > 1: divide by W, or multiply by "
                "1.0 / W), or zeroed (zero_()) after the sync? "
              : "(W = 1, where an integer 1 / W would be 1: not that.) Was it zeroed (zero_()) "
                "after the sync? ",
        "Did each gradient reach the tensor that is all-reduced (with buckets: was it copied "
        "into its slot, or did the slot go out as it was made, all zeros)? Or was the average "
        "written where .grad does not point (with gradient_as_bucket_view: a bucket slot that "
        ".grad is not yet a view of, after the engine made a fresh .grad), or was .grad "
        "replaced after the sync?");
  }
  if (k > 1 && near(ratio, 1.0 / static_cast<double>(k))) {  // the mean divided by K again
    const bool both = near(static_cast<double>(k), w);  // W == K: both readings fit, name both
    return detail::cat(
        "the first update is 1/", k, " of the reference's", both ? " (1/K = 1/W here)" : "",
        ": is the accumulated gradient divided by the number of micro-batches K = ", k,
        "? Each micro-batch's loss is already scaled by 1/K, so the sum of the K gradients "
        "already is their mean", both ? "; or is it divided by the world size twice?" : "",
        ". Or were the gradients of the micro-batches under no_sync dropped, leaving the last "
        "one's alone? They must be kept for the last micro-batch's to add to");
  }
  if (near(ratio, 1.0 / w)) {  // the mean divided by W again
    return detail::cat("the first update is 1/", w,
                       " of the reference's: is the gradient divided by the world size twice?");
  }
  if (implied_gradient_is_the_parameter(e.reference.initial_params, rank0.after_first_step,
                                        e.config.lr)) {
    return "the first update is lr times the parameters themselves: the parameters themselves "
           "were averaged instead of their gradients (all-reduce param.grad(), not param)";
  }
  if (const std::vector<std::string> wrong = params_differing(
          rank0.after_first_step, e.reference.after_first_step, e.tolerance);
      wrong.size() < rank0.after_first_step.size()) {
    return why_only_some_updated_wrongly(e, wrong);
  }
  return detail::cat("all ranks agree with each other but not with the reference; the first "
                     "update is ", num(ratio), "x the reference's: the gradients are combined "
                     "wrongly (all-reduce SUM, then divide by the world size)");
}

// Every rank holds the same parameters after step 0's update, but not the
// reference's: the gradients were combined wrongly.
std::vector<Finding> step0_update_wrong(const Evidence& e) {
  const ParamDiff step0 = worst_after_step0(e);
  if (!differs(step0.max_abs, 0.0, e.tolerance)) return {};
  const RankResult& rank0 = e.rank0();
  return {{detail::cat("after step 0's update, every rank holds the same parameters but not the "
                       "reference's: ", step0.name, " max |diff| ", sci(step0.max_abs), ", DDP ",
                       first_values(find(rank0.after_first_step, step0.name)), ", reference ",
                       first_values(find(e.reference.after_first_step, step0.name))),
           why_first_update_wrong(e)}};
}

// ---- Later steps -------------------------------------------------------------

// How a run whose step 0 was right ended.
struct Ending {
  Comparison c;                    // the whole run against the reference
  std::set<std::string> ungraded;  // parameters some rank's micro-batch did not reach
  std::set<std::string> wrong;     // parameters that end wrong on some rank
  std::set<std::string> apart;     // parameters some rank ends without rank0's values
};

Ending how_the_run_ended(const Evidence& e) {
  const Snapshot& params = e.rank0().final_params;
  Ending end;
  end.c = compare(e.reference, e.ranks, e.tolerance);
  for (const RankResult& r : e.ranks) {
    for (const std::vector<int64_t>& micro : r.unreached_per_micro) {
      for (int64_t p : micro) {
        if (static_cast<size_t>(p) < params.size()) {
          end.ungraded.insert(params[static_cast<size_t>(p)].name);
        }
      }
    }
    for (const std::string& n :
         params_differing(r.final_params, e.reference.final_params, e.tolerance)) {
      end.wrong.insert(n);
    }
    for (const std::string& n : params_differing(r.final_params, params, e.tolerance)) {
      end.apart.insert(n);
    }
  }
  return end;
}

std::string join(const std::set<std::string>& items) {
  return join(std::vector<std::string>(items.begin(), items.end()));
}

// True when the first wrong update is the first step with fewer ranks
// training than the one before it (uneven inputs: a rank ran out).
bool first_wrong_update_lost_a_rank(const RunConfig& config, const Comparison& c) {
  const int64_t s = c.first_bad_index / config.micro_batches - 1;  // the first wrong update
  return c.first_bad_index >= 0 && uneven(config) && active_ranks(config, s) < config.world_size &&
         active_ranks(config, std::max<int64_t>(s - 1, 0)) == config.world_size;
}

// Why a later step went wrong, step 0 being right; the first explanation
// that fits wins, the most specific first.
std::string why_later_step_wrong(const Evidence& e, const Ending& end) {
  const std::string carried =
      "step 0 is right, so the error is in what carries over between steps: gradients not "
      "zeroed, state kept from an earlier step, or a sync that runs only on some steps";
  const bool only_ungraded_wrong =
      !end.wrong.empty() && end.wrong.size() < e.rank0().final_params.size() &&
      std::all_of(end.wrong.begin(), end.wrong.end(),
                  [&](const std::string& n) { return end.ungraded.count(n) != 0; });
  if (only_ungraded_wrong) {  // the parameters a branch not taken left without a gradient
    return detail::cat(
        "only ", join(end.wrong), " end wrong",
        end.apart.empty() ? "" : ", and the ranks no longer agree on them",
        ": parameters that some micro-batch left without a gradient. Is such a parameter "
        "handled right when it syncs: zeros in its slot where this rank did not use it, the "
        "average where another rank did, no gradient at all where no rank did, and what it "
        "accumulated under no_sync kept?");
  }
  if (end.c.first_bad_index < 0 && !end.wrong.empty()) {  // every loss right, the end wrong
    return uneven(e.config)
        ? "every micro-batch's loss matches the reference, so every step trained the right "
          "model; only the final parameters differ, so they changed after the last step that "
          "used them. A rank that ran out of inputs stops stepping: is the final model "
          "broadcast to every rank from the last rank to join (the one that trained longest)?"
        : "every micro-batch's loss matches the reference, so every step trained the right "
          "model; only the final parameters differ: what changes them after the last step?";
  }
  if (first_wrong_update_lost_a_rank(e.config, end.c)) {  // the divisor once a rank ran out
    const int64_t s = end.c.first_bad_index / e.config.micro_batches - 1;
    return detail::cat(
        "the first wrong update is step ", s, "'s, the first step with fewer ranks training (",
        active_ranks(e.config, s), " of ", e.config.world_size, "): is the summed gradient "
        "divided by what the plan asks (", e.config.divisor == Divisor::ActiveRanks
                                               ? "the ranks still training"
                                               : "the initial world size",
        "), and ", e.advice.after_a_rank_joins, "?");
  }
  if (!end.apart.empty()) {  // the ranks drifted apart in some later step
    return detail::cat(
        "step 0 is right, but the ranks end with different values of ", join(end.apart),
        ": in some later step the ranks did not all get the same averaged gradient for them",
        end.ungraded.empty()
            ? " (is every gradient synced in every step?)"
            : detail::cat(". Some micro-batches left ", join(end.ungraded),
                          " without a gradient: does every rank end such a step with the same "
                          "gradient for them (the average where any rank used them, none where "
                          "no rank did)?"));
  }
  if (!end.ungraded.empty() && !end.wrong.empty()) {
    // A wrong update spreads to every parameter by the end; which ones it
    // hit first is not known. The parameters without a gradient are still
    // the likeliest place in a model that has them.
    return carried + detail::cat(
        ". Some micro-batches left ", join(end.ungraded),
        " without a gradient: is such a parameter handled right when it syncs (zeros in its "
        "slot where this rank did not use it, the average where another rank did, no gradient "
        "where no rank did, what it accumulated under no_sync kept)?");
  }
  return carried;
}

// Note [Tolerance] bounds the rounding of the kit's runs of tens of steps.
// Over thousands, a unit in the last place per step can compound past the
// tolerance with nothing wrong (measured: `./kit demo 01 --steps 20000`, a
// correct stage 01, first differs by 1.2e-5 at step 3547). A float32 run
// whose first wrong step comes that late, with a difference that small,
// says so before `cause`; float64 tells rounding from a bug.
std::string unless_rounding(const RunConfig& config, const Comparison& c,
                            const std::string& cause) {
  constexpr int64_t kLongRunSteps = 1000;
  const int64_t first_bad_step = c.first_bad_index / config.micro_batches;
  const bool late_and_small = c.first_bad_index >= 0 && config.dtype == kFloat32 &&
                              first_bad_step >= kLongRunSteps && c.max_loss_diff < 1e-3;
  if (!late_and_small) return cause;
  return detail::cat(
      "after ", first_bad_step, " matching steps, a difference this small is most likely "
      "float32 rounding compounding over a long run (DDP and the reference sum in different "
      "orders, a unit in the last place per step), not a bug: if the same run in float64 "
      "(--dtype float64) matches, it is rounding. Otherwise: ", cause);
}

// The first step whose losses differ, and the largest loss difference.
// REQUIRES: c.first_bad_index >= 0.
Finding losses_differ(const Evidence& e, const Comparison& c, const std::string& cause) {
  const int64_t k = e.config.micro_batches;
  const RankResult& r = e.ranks[static_cast<size_t>(c.loss_rank)];
  const auto at = static_cast<size_t>(c.loss_index);
  const double ref = e.reference.losses[static_cast<size_t>(c.loss_rank)][at];
  const int64_t first_bad_step = c.first_bad_index / k;
  return {detail::cat("losses match through step ", first_bad_step - 1,
                      " and first differ at step ", first_bad_step,
                      ", so the update at the end of step ", first_bad_step - 1,
                      " is the first wrong one; the largest difference is at step ",
                      c.loss_index / k,
                      k > 1 ? detail::cat(" (micro-batch ", c.loss_index, ")") : "", ", rank ",
                      c.loss_rank, ": ", num(r.losses[at]), " vs reference ", num(ref),
                      " (|diff| ", sci(c.max_loss_diff), ")"),
          cause};
}

// Where the final parameters differ most from the reference's.
Finding final_params_differ(const Evidence& e, const Comparison& c, const std::string& cause) {
  const ParamDiff& d = c.final_params;
  const RankResult& r = e.ranks[static_cast<size_t>(d.rank)];
  return {detail::cat("final parameters: rank ", d.rank, ", ", d.name, " max |diff| ",
                      sci(d.max_abs), " at element ", d.element, ", DDP ",
                      first_values(find(r.final_params, d.name)), ", reference ",
                      first_values(find(e.reference.final_params, d.name))),
          cause};
}

// Where the final buffers differ most from the reference's for that rank.
Finding final_buffers_differ(const Evidence& e, const Comparison& c) {
  const ParamDiff& d = c.final_buffers;
  const auto rank = static_cast<size_t>(d.rank);
  return {detail::cat("final buffers: rank ", rank, ", ", d.name, " max |diff| ",
                      sci(d.max_abs), ", DDP ",
                      first_values(find(e.ranks[rank].final_buffers, d.name)), ", reference ",
                      first_values(find(e.reference.final_buffers[rank], d.name))),
          e.config.buffer_sync == BufferSync::EveryStep
              ? "buffers must be broadcast from rank 0 before the first forward of every step"
              : "each rank's buffers evolve with its own forwards after construction: are "
                "they broadcast or changed later?"};
}

// Step 0 was right, and something after it is not: the first wrong loss,
// the final parameters and the final buffers, each found where it differs.
std::vector<Finding> later_steps(const Evidence& e) {
  const Ending end = how_the_run_ended(e);
  const std::string cause = unless_rounding(e.config, end.c, why_later_step_wrong(e, end));
  std::vector<Finding> out;
  if (end.c.first_bad_index >= 0) out.push_back(losses_differ(e, end.c, cause));
  if (differs(end.c.final_params.max_abs, 0.0, e.tolerance)) {
    out.push_back(final_params_differ(e, end.c, out.empty() ? cause : "see above"));
  }
  if (differs(end.c.final_buffers.max_abs, 0.0, e.tolerance)) {
    out.push_back(final_buffers_differ(e, end.c));
  }
  return out;
}

// The diagnoses, in the order diagnose() runs them: the first to find
// something is reported (Note [Diagnosis order]).
using Diagnosis = std::vector<Finding> (*)(const Evidence&);
constexpr Diagnosis kDiagnoses[] = {
    // The reference is not finite: nothing to compare with.
    reference_diverged,
    // A NaN or inf on some rank: it poisons every later difference.
    first_non_finite_value,
    // Ranks differ after construction: the broadcast, DDP's first act.
    replicas_start_apart,
    // Equal replicas, but not rank 0's model: broadcast from the wrong rank.
    replicas_not_rank0s,
    // Buffers not as the plan says after construction: with the parameters right.
    initial_buffers_wrong,
    // Step 0's loss wrong with the parameters right: the forward pass.
    step0_loss_differs,
    // Ranks disagree after step 0's update: gradients not synced alike.
    ranks_split_after_step0,
    // Ranks agree after step 0, but not with the reference: the averaging.
    step0_update_wrong,
    // Step 0 right, something later wrong: what carries over between steps.
    later_steps,
};

}  // namespace

std::vector<Finding> diagnose(const RunConfig& config, const ReferenceResult& reference,
                              const std::vector<RankResult>& ranks, double tolerance,
                              const Advice& advice) {
  // Results that are not what the plan says make every number meaningless,
  // and the evidence needs a rank: this comes before the list.
  std::vector<Finding> out = check_results_complete(config, reference, ranks);
  if (!out.empty()) return out;
  const Evidence e = gather_evidence(config, reference, ranks, tolerance, advice);
  for (Diagnosis diagnosis : kDiagnoses) {
    out = diagnosis(e);
    if (!out.empty()) return out;
  }
  return {};
}

std::string format_findings(const std::vector<Finding>& findings) {
  std::string out;
  for (const Finding& f : findings) {
    out += "  - " + f.what + "\n    likely cause: " + f.likely_cause + "\n";
  }
  return out;
}

}  // namespace tp::train
