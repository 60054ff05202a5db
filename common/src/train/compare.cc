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

namespace {

// Where a value first stops being finite, and on which ranks. A rank's
// numbers in the order they were made: its parameters after construction,
// step 0's losses, its parameters after step 0's update, the losses of step
// 1, 2, ... (each made with the parameters of the update before), and its
// final parameters; the earliest non-finite one over all ranks is named,
// alone, since it poisons every difference after it (Note [Non-finite
// values]).
std::vector<Finding> check_finite(const RunConfig& config, const ReferenceResult& reference,
                                  const std::vector<RankResult>& ranks) {
  const int64_t k = config.micro_batches;
  for (size_t r = 0; r < reference.losses.size(); ++r) {
    for (size_t i = 0; i < reference.losses[r].size(); ++i) {
      if (std::isfinite(reference.losses[r][i])) continue;
      return {{detail::cat("the reference itself diverged: rank ", r, "'s loss on micro-batch ",
                           i, " (step ", static_cast<int64_t>(i) / k, ") is ",
                           num(reference.losses[r][i])),
               "the learning rate is too large for this model: lower lr (--lr)"}};
    }
  }
  // "fc1.weight element 3 is inf": the first non-finite value of a snapshot.
  auto first_non_finite = [](const Snapshot& snap) -> std::string {
    for (const ParamValues& p : snap) {
      for (size_t i = 0; i < p.values.size(); ++i) {
        if (!std::isfinite(p.values[i])) {
          return detail::cat(p.name, " element ", i, " is ", num(p.values[i]), " (",
                             first_values(&p), ")");
        }
      }
    }
    return "";
  };
  // The first non-finite loss of a rank in step `s`: "is nan", or with
  // accumulation ", micro-batch 5, is nan".
  auto loss_in_step = [&](const RankResult& r, int64_t s) -> std::string {
    for (int64_t i = s * k; i < (s + 1) * k && i < static_cast<int64_t>(r.losses.size()); ++i) {
      const double loss = r.losses[static_cast<size_t>(i)];
      if (!std::isfinite(loss)) {
        return detail::cat(k > 1 ? detail::cat(", micro-batch ", i, ",") : "", " is ", num(loss));
      }
    }
    return "";
  };
  // What rank r made at point t: 0 its initial parameters, 2s + 1 the
  // losses of step s, 2 its parameters after step 0, 2 * steps its final
  // parameters (after the last step's update); "" while finite.
  auto non_finite_at = [&](const RankResult& r, int64_t t) -> std::string {
    const int64_t steps = steps_of(config, r.rank);
    if (t == 0) return first_non_finite(r.initial_params);
    if (t % 2 == 1) return (t - 1) / 2 < steps ? loss_in_step(r, (t - 1) / 2) : "";
    if (t == 2) return first_non_finite(r.after_first_step);
    return t == 2 * steps ? first_non_finite(r.final_params) : "";
  };
  const auto longest = static_cast<int64_t>(total_steps(config));
  const std::string growth =
      "a gradient that grew without bound (summed over ranks but never divided, or "
      "accumulated across steps without being zeroed)";
  for (int64_t t = 0; t <= 2 * longest; ++t) {
    std::vector<int> bad;  // ranks non-finite at t
    std::string first;
    for (const RankResult& r : ranks) {
      const std::string what = non_finite_at(r, t);
      if (what.empty()) continue;
      if (bad.empty()) first = what;
      bad.push_back(r.rank);
    }
    if (bad.empty()) continue;
    const int rank = bad.front();
    std::string others;  // "; also on ranks 1, 2" / "; the other ranks stay finite"
    if (bad.size() > 1) {
      std::vector<std::string> rest;
      for (size_t b = 1; b < bad.size(); ++b) rest.push_back(std::to_string(bad[b]));
      others = "; also on rank" + std::string(rest.size() > 1 ? "s " : " ") + join(rest);
    } else if (ranks.size() > 1) {
      others = "; the other ranks stay finite";
    }
    const bool some_ranks = bad.size() < ranks.size();
    const std::string division = detail::cat(
        "a division by zero", some_ranks ? " on some ranks only (by a number that is 0 there: "
                                           "the rank itself, say)" : " (by W - 1 or another count "
                                           "that can be 0?)",
        ", or ", growth);
    if (t == 0) {
      return {{detail::cat("rank ", rank, "'s parameters are non-finite right after DDP "
                           "construction: ", first, others),
               "the constructor must only copy rank 0's finite parameters (broadcast): is a "
               "parameter divided, or broadcast from memory that was never written?"}};
    }
    if (t % 2 == 1) {
      const int64_t s = (t - 1) / 2;
      return {{detail::cat("rank ", rank, "'s loss in step ", s, first,
                           s == 0 ? " although its parameters are finite"
                                  : detail::cat(", made with the parameters of step ", s - 1,
                                                "'s update: that update made them non-finite"),
                           others, "; the reference's is finite"),
               s == 0 ? "the forward pass must call the wrapped module on this rank's own "
                        "shard; DDP must not change the forward result"
                      : detail::cat("step ", s - 1, "'s averaged gradient was not finite: ",
                                    division)}};
    }
    const int64_t step = t / 2 - 1;  // the update that made them
    return {{detail::cat("rank ", rank, "'s parameters went non-finite in step ", step,
                         "'s update", t == 2 ? "" : " (the last)", ": ", first, others,
                         "; the reference's are finite"),
             detail::cat("step ", step, "'s averaged gradient was not finite: ", division)}};
  }
  return {};
}

}  // namespace

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

std::vector<Finding> diagnose(const RunConfig& config, const ReferenceResult& reference,
                              const std::vector<RankResult>& ranks, double tolerance,
                              const Advice& advice) {
  std::vector<Finding> out = check_results_complete(config, reference, ranks);
  if (!out.empty()) return out;
  out = check_finite(config, reference, ranks);
  if (!out.empty()) return out;
  // Step 0 is judged on the ranks that took it: with uneven inputs a rank
  // may have no batch at all. rank0 is the first of them.
  std::vector<RankResult> stepped;
  for (const RankResult& r : ranks) {
    if (!r.after_first_step.empty()) stepped.push_back(r);
  }
  if (stepped.empty()) stepped.push_back(ranks[0]);
  const RankResult& rank0 = stepped.front();
  const int64_t k_micro = config.micro_batches;

  // 1. Do the replicas start equal? (the constructor's broadcast)
  for (const RankResult& r : ranks) {
    std::vector<std::string> bad = params_differing(r.initial_params, rank0.initial_params, tolerance);
    if (bad.empty()) continue;
    ParamDiff d = diff_snapshots(r.initial_params, rank0.initial_params, r.rank);
    out.push_back({detail::cat("right after DDP construction, rank ", r.rank,
                               "'s parameters differ from rank 0's (", join(bad), "); ",
                               d.name, ": max |diff| ", sci(d.max_abs), ", rank 0 ",
                               first_values(find(rank0.initial_params, d.name)), ", rank ",
                               r.rank, " ", first_values(find(r.initial_params, d.name))),
                   config.per_rank_seed
                       ? "each rank seeded differently, so only a broadcast makes the replicas "
                         "equal: does the constructor broadcast every parameter (and buffer) "
                         "from rank 0?"
                       : "the replicas must be equal after construction: does the constructor "
                         "broadcast every parameter from rank 0?"});
    return out;  // everything after this is a consequence
  }
  // 2. Equal, but are they rank 0's (the reference's)?
  ParamDiff init = diff_snapshots(rank0.initial_params, reference.initial_params, 0);
  if (differs(init.max_abs, 0.0, tolerance)) {
    out.push_back({detail::cat("all ranks start from the same parameters, but not from rank 0's "
                               "model, which the reference uses: ", init.name, " max |diff| ",
                               sci(init.max_abs), ", DDP ",
                               first_values(find(rank0.initial_params, init.name)),
                               ", reference ", first_values(find(reference.initial_params, init.name))),
                   "broadcast with src = 0: DDP makes every replica a copy of rank 0's model"});
    return out;
  }
  // 2b. Buffers after construction: each rank's must be what the plan says
  // (rank 0's when buffers are broadcast, the rank's own otherwise).
  for (const RankResult& r : ranks) {
    const Snapshot& expected = reference.initial_buffers[static_cast<size_t>(r.rank)];
    std::vector<std::string> bad = params_differing(r.initial_buffers, expected, tolerance);
    if (bad.empty()) continue;
    ParamDiff d = diff_snapshots(r.initial_buffers, expected, r.rank);
    const bool synced = config.buffer_sync != BufferSync::None;
    out.push_back({detail::cat("right after DDP construction, rank ", r.rank, "'s buffers (",
                               join(bad), ") are not ", synced ? "rank 0's" : "its own", "; ",
                               d.name, ": max |diff| ", sci(d.max_abs), ", rank ", r.rank, " ",
                               first_values(find(r.initial_buffers, d.name)), ", expected ",
                               first_values(find(expected, d.name))),
                   synced ? "with broadcast_buffers on, the constructor must broadcast every "
                            "buffer (named_buffers()) from rank 0, like the parameters"
                          : "with broadcast_buffers off, every rank keeps the buffers it built: "
                            "is a buffer broadcast anyway?"});
    return out;
  }
  // 3. Step 0's forwards: same parameters, so the losses must match exactly.
  for (const RankResult& r : ranks) {
    const std::vector<double>& ref_losses = reference.losses[static_cast<size_t>(r.rank)];
    for (size_t i = 0; i < static_cast<size_t>(k_micro) && i < r.losses.size(); ++i) {
      const double ref = ref_losses[i];
      if (!differs(r.losses[i], ref, tolerance)) continue;
      out.push_back({detail::cat("step 0, rank ", r.rank, k_micro > 1 ? detail::cat(", micro-batch ", i) : "",
                                 ": loss ", num(r.losses[i]), ", reference ", num(ref), " (|diff| ",
                                 sci(std::abs(r.losses[i] - ref)), ") although the parameters match"),
                     "the forward pass must call the wrapped module on this rank's own shard "
                     "(micro-batch i takes rows (i*W + rank)*B ...); DDP must not change the "
                     "forward result"});
      return out;
    }
  }
  // 4. Step 0's update: the averaged gradient.
  bool ranks_agree_after_step0 = true;
  std::set<std::string> split_params;
  for (const RankResult& r : stepped) {
    for (const std::string& name : params_differing(r.after_first_step, rank0.after_first_step, tolerance)) {
      ranks_agree_after_step0 = false;
      split_params.insert(name);
    }
  }
  ParamDiff step0 = diff_snapshots(rank0.after_first_step, reference.after_first_step, rank0.rank);
  for (const RankResult& r : stepped) {
    ParamDiff d = diff_snapshots(r.after_first_step, reference.after_first_step, r.rank);
    if (d.max_abs > step0.max_abs) step0 = d;
  }
  const double ref_update = update_norm(reference.initial_params, reference.after_first_step);
  const double w = divisor_at(config, 0);
  // This rank's first update as a multiple of the reference's.
  auto update_ratio = [&](const RankResult& r) {
    double ddp_update = update_norm(r.initial_params, r.after_first_step);
    return ref_update > 0 ? ddp_update / ref_update : INFINITY;
  };
  auto near = [](double ratio, double target) { return std::abs(ratio - target) < 0.05 * target; };
  if (!ranks_agree_after_step0) {
    std::vector<std::string> names(split_params.begin(), split_params.end());
    const size_t total = rank0.after_first_step.size();
    // Ranks that stepped with W times the mean: the division ran on some ranks only.
    std::vector<std::string> times_w;
    bool others_right = true;
    for (const RankResult& r : stepped) {
      const double ratio = update_ratio(r);
      if (near(ratio, w)) {
        times_w.push_back(std::to_string(r.rank));
      } else if (!near(ratio, 1.0)) {
        others_right = false;
      }
    }
    std::string cause =
        names.size() == total && others_right && !times_w.empty() && w > 1
            ? detail::cat("the first update of rank", times_w.size() == 1 ? " " : "s ",
                          join(times_w), " is ", w, "x the reference's while "
                          "the other ranks match it: is the summed gradient divided by the "
                          "world size on every rank?")
        : std::all_of(names.begin(), names.end(), [&](const std::string& n) {
            const auto& unreached = reference.unreached_in_step0;
            return std::find(unreached.begin(), unreached.end(), n) != unreached.end();
          })
            ? detail::cat("only ", join(names), " disagree", names.size() == 1 ? "s" : "",
                          " between ranks, parameters that some rank's step-0 micro-batch did not "
                          "reach (no gradient there): such a parameter still takes part in the sync "
                          "and must end with the average on every rank; is its gradient set "
                          "where the rank had none?")
        : names.size() < total
            ? detail::cat("only ", join(names), " disagree", names.size() == 1 ? "s" : "",
                          " between ranks while the other parameters agree: is ",
                          names.size() == 1 ? "that parameter" : "each of them",
                          " all-reduced ", advice.where_sync, ", or skipped?")
            : "every parameter disagrees between ranks: each rank stepped with its own "
              "gradient, so gradients were not all-reduced, or were read before their "
              "all-reduce finished (are gradients averaged " +
                  advice.how_sync_runs + ", is every gradient all-reduced " + advice.where_sync +
                  ", and is every all-reduce waited for before the optimizer step?)";
    const RankResult& worst = ranks[static_cast<size_t>(std::max(step0.rank, 0))];  // by rank number
    out.push_back({detail::cat("after step 0's update, ranks hold different parameters (",
                               join(names), "); worst vs the reference: rank ", step0.rank, ", ",
                               step0.name, " max |diff| ", sci(step0.max_abs), ", DDP ",
                               first_values(find(worst.after_first_step, step0.name)),
                               ", reference ",
                               first_values(find(reference.after_first_step, step0.name))),
                   cause});
    return out;
  }
  if (differs(step0.max_abs, 0.0, tolerance)) {
    const double ratio = update_ratio(rank0);
    std::string cause;
    if (near(ratio, w)) {
      cause = detail::cat("step 0's losses match, but the first update is ",
                          num(ratio), "x the reference's (W = ", w,
                          "): is the sum divided by the world size? And divided in place "
                          "(grad.div_(W))? Dividing a copy (grad = grad / W makes a new "
                          "tensor and rebinds the handle) leaves the parameter's .grad "
                          "holding the sum");
    } else if (ratio < 1e-6) {
      cause = "the first update is zero: every gradient was zero after the sync, so no "
              "averaged gradient reached the optimizer. Was it scaled by an integer 1 / W "
              "(0 for W > 1: divide by W, or multiply by 1.0 / W), or zeroed (zero_()) after "
              "the sync? Or was the average written where .grad does not point (with "
              "gradient_as_bucket_view: a bucket slot that .grad is not yet a view of, after "
              "the engine made a fresh .grad), or was .grad replaced after the sync?";
    } else if (k_micro > 1 && near(ratio, 1.0 / static_cast<double>(k_micro))) {
      // With W == K both readings fit the numbers: name both.
      const bool both = near(static_cast<double>(k_micro), w);
      cause = detail::cat(
          "the first update is 1/", k_micro, " of the reference's", both ? " (1/K = 1/W here)" : "",
          ": is the accumulated gradient divided by the number of micro-batches K = ", k_micro,
          "? Each micro-batch's loss is already scaled by 1/K, so the sum of the K gradients "
          "already is their mean", both ? "; or is it divided by the world size twice?" : "");
    } else if (near(ratio, 1.0 / w)) {
      cause = detail::cat("the first update is 1/", w,
                          " of the reference's: is the gradient divided by the world size twice?");
    } else if (implied_gradient_is_the_parameter(reference.initial_params,
                                                 rank0.after_first_step, config.lr)) {
      cause = "the first update is lr times the parameters themselves: the parameters "
              "themselves were averaged instead of their gradients (all-reduce param.grad(), "
              "not param)";
    } else if (const std::vector<std::string> wrong =
                   params_differing(rank0.after_first_step, reference.after_first_step, tolerance);
               wrong.size() < rank0.after_first_step.size()) {
      const auto& unreached = reference.unreached_in_step0;
      const bool all_unreached = std::all_of(wrong.begin(), wrong.end(), [&](const std::string& n) {
        return std::find(unreached.begin(), unreached.end(), n) != unreached.end();
      });
      cause = all_unreached
                  ? detail::cat(
                        "only ", join(wrong), wrong.size() == 1 ? " was" : " were",
                        " updated wrongly, parameters that some micro-batch of step 0 did not "
                        "reach (no gradient there), while the other parameters match the "
                        "reference: does such a parameter bring to the sync what its .grad "
                        "holds (what it accumulated under no_sync, zeros where it has "
                        "nothing), and end with the average, or with no gradient where no "
                        "rank used it?")
                  : unmoved(reference.initial_params, rank0.after_first_step, wrong)
                  ? detail::cat("only ", join(wrong), wrong.size() == 1 ? " was" : " were",
                                " updated wrongly, and did not move at all: ",
                                wrong.size() == 1 ? "its gradient was" : "their gradients were",
                                " zero after the sync while the other parameters match the "
                                "reference. Scaled by an integer 1 / W (0 for W > 1), or "
                                "zeroed (zero_()) after the sync? Are they ",
                                advice.where_grads_move, "?")
                  : detail::cat("only ", join(wrong), wrong.size() == 1 ? " was" : " were",
                                " updated wrongly while the other parameters match the "
                                "reference: are their gradients ",
                                advice.where_grads_move, "?");
    } else {
      cause = detail::cat("all ranks agree with each other but not with the reference; the first "
                          "update is ", num(ratio), "x the reference's: the gradients are "
                          "combined wrongly (all-reduce SUM, then divide by the world size)");
    }
    out.push_back({detail::cat("after step 0's update, every rank holds the same parameters but not "
                               "the reference's: ", step0.name, " max |diff| ", sci(step0.max_abs),
                               ", DDP ", first_values(find(rank0.after_first_step, step0.name)),
                               ", reference ",
                               first_values(find(reference.after_first_step, step0.name))),
                   cause});
    return out;
  }
  // 5. Later steps. When every parameter that ends wrong is one some
  // micro-batch left without a gradient (a branch not taken), the handling
  // of such parameters is the first suspect.
  Comparison c = compare(reference, ranks, tolerance);
  std::set<std::string> ungraded;  // parameters some rank's micro-batch did not reach
  for (const RankResult& r : ranks) {
    for (const std::vector<int64_t>& micro : r.unreached_per_micro) {
      for (int64_t p : micro) {
        if (static_cast<size_t>(p) < rank0.final_params.size()) {
          ungraded.insert(rank0.final_params[static_cast<size_t>(p)].name);
        }
      }
    }
  }
  std::set<std::string> wrong;  // parameters that end wrong on some rank
  bool ranks_disagree = false;
  for (const RankResult& r : ranks) {
    for (const std::string& n : params_differing(r.final_params, reference.final_params, tolerance)) {
      wrong.insert(n);
    }
    ranks_disagree |= !params_differing(r.final_params, rank0.final_params, tolerance).empty();
  }
  std::string later_cause =
      "step 0 is right, so the error is in what carries over between steps: gradients not "
      "zeroed, state kept from an earlier step, or a sync that runs only on some steps";
  if (!wrong.empty() && wrong.size() < rank0.final_params.size() &&
      std::all_of(wrong.begin(), wrong.end(),
                  [&](const std::string& n) { return ungraded.count(n) != 0; })) {
    later_cause = detail::cat(
        "only ", join(std::vector<std::string>(wrong.begin(), wrong.end())), " end wrong",
        ranks_disagree ? ", and the ranks no longer agree on them" : "",
        ": parameters that some micro-batch left without a gradient. Is such a parameter "
        "handled right when it syncs: zeros in its slot where this rank did not use it, the "
        "average where another rank did, no gradient at all where no rank did, and what it "
        "accumulated under no_sync kept?");
  } else if (c.first_bad_index < 0 && !wrong.empty()) {
    // Every loss right: every step's model was right where it was used.
    later_cause = uneven(config)
        ? "every micro-batch's loss matches the reference, so every step trained the right "
          "model; only the final parameters differ, so they changed after the last step that "
          "used them. A rank that ran out of inputs stops stepping: is the final model "
          "broadcast to every rank from the last rank to join (the one that trained longest)?"
        : "every micro-batch's loss matches the reference, so every step trained the right "
          "model; only the final parameters differ: what changes them after the last step?";
  } else if (c.first_bad_index >= 0 && uneven(config) &&
             active_ranks(config, c.first_bad_index / k_micro - 1) < config.world_size &&
             active_ranks(config, std::max<int64_t>(c.first_bad_index / k_micro - 2, 0)) ==
                 config.world_size) {
    const int64_t s = c.first_bad_index / k_micro - 1;
    later_cause = detail::cat(
        "the first wrong update is step ", s, "'s, the first step with fewer ranks training (",
        active_ranks(config, s), " of ", config.world_size, "): is the summed gradient divided "
        "by what the plan asks (", config.divisor == Divisor::ActiveRanks
                                       ? "the ranks still training"
                                       : "the initial world size",
        "), and do the ranks that ran out add zeros to every bucket?");
  } else if (ranks_disagree) {
    std::set<std::string> apart;  // parameters some rank ends without rank 0's values
    for (const RankResult& r : ranks) {
      for (const std::string& n : params_differing(r.final_params, rank0.final_params, tolerance)) {
        apart.insert(n);
      }
    }
    later_cause = detail::cat(
        "step 0 is right, but the ranks end with different values of ",
        join(std::vector<std::string>(apart.begin(), apart.end())),
        ": in some later step the ranks did not all get the same averaged gradient for them",
        ungraded.empty()
            ? " (is every gradient synced in every step?)"
            : detail::cat(". Some micro-batches left ",
                          join(std::vector<std::string>(ungraded.begin(), ungraded.end())),
                          " without a gradient: does every rank end such a step with the same "
                          "gradient for them (the average where any rank used them, none where "
                          "no rank did)?"));
  } else if (!ungraded.empty() && !wrong.empty()) {
    // A wrong update spreads to every parameter by the end; which ones it
    // hit first is not known. The parameters without a gradient are still
    // the likeliest place in a model that has them.
    later_cause += detail::cat(
        ". Some micro-batches left ", join(std::vector<std::string>(ungraded.begin(),
                                                                    ungraded.end())),
        " without a gradient: is such a parameter handled right when it syncs (zeros in its "
        "slot where this rank did not use it, the average where another rank did, no gradient "
        "where no rank did, what it accumulated under no_sync kept)?");
  }
  // Note [Tolerance] bounds the rounding of the kit's runs of tens of steps.
  // Over thousands, a unit in the last place per step can compound past the
  // tolerance with nothing wrong (measured: `./kit demo 01 --steps 20000`, a
  // correct stage 01, first differs by 1.2e-5 at step 3547). A float32 run
  // whose first wrong step comes that late, with a difference that small,
  // says so; float64 tells rounding from a bug.
  constexpr int64_t kLongRunSteps = 1000;
  if (c.first_bad_index >= 0 && config.dtype == kFloat32 &&
      c.first_bad_index / k_micro >= kLongRunSteps && c.max_loss_diff < 1e-3) {
    later_cause = detail::cat(
        "after ", c.first_bad_index / k_micro, " matching steps, a difference this small is "
        "most likely float32 rounding compounding over a long run (DDP and the reference sum "
        "in different orders, a unit in the last place per step), not a bug: if the same run "
        "in float64 (--dtype float64) matches, it is rounding. Otherwise: ", later_cause);
  }
  if (c.first_bad_index >= 0) {
    const RankResult& r = ranks[static_cast<size_t>(c.loss_rank)];
    const auto at = static_cast<size_t>(c.loss_index);
    const double ref = reference.losses[static_cast<size_t>(c.loss_rank)][at];
    const int64_t first_bad_step = c.first_bad_index / k_micro;
    out.push_back({detail::cat("losses match through step ", first_bad_step - 1,
                               " and first differ at step ", first_bad_step,
                               ", so the update at the end of step ", first_bad_step - 1,
                               " is the first wrong one; the largest difference is at step ",
                               c.loss_index / k_micro,
                               k_micro > 1 ? detail::cat(" (micro-batch ", c.loss_index, ")") : "",
                               ", rank ", c.loss_rank, ": ", num(r.losses[at]), " vs reference ",
                               num(ref), " (|diff| ", sci(c.max_loss_diff), ")"),
                   later_cause});
  }
  if (differs(c.final_params.max_abs, 0.0, tolerance)) {
    const RankResult& r = ranks[static_cast<size_t>(c.final_params.rank)];
    out.push_back({detail::cat("final parameters: rank ", c.final_params.rank, ", ",
                               c.final_params.name, " max |diff| ", sci(c.final_params.max_abs),
                               " at element ", c.final_params.element, ", DDP ",
                               first_values(find(r.final_params, c.final_params.name)),
                               ", reference ",
                               first_values(find(reference.final_params, c.final_params.name))),
                   out.empty() ? later_cause : "see above"});
  }
  if (differs(c.final_buffers.max_abs, 0.0, tolerance)) {
    const auto rank = static_cast<size_t>(c.final_buffers.rank);
    out.push_back({detail::cat("final buffers: rank ", rank, ", ", c.final_buffers.name,
                               " max |diff| ", sci(c.final_buffers.max_abs), ", DDP ",
                               first_values(find(ranks[rank].final_buffers, c.final_buffers.name)),
                               ", reference ",
                               first_values(find(reference.final_buffers[rank], c.final_buffers.name))),
                   config.buffer_sync == BufferSync::EveryStep
                       ? "buffers must be broadcast from rank 0 before the first forward of "
                         "every step"
                       : "each rank's buffers evolve with its own forwards after construction: "
                         "are they broadcast or changed later?"});
  }
  return out;
}

std::string format_findings(const std::vector<Finding>& findings) {
  std::string out;
  for (const Finding& f : findings) {
    out += "  - " + f.what + "\n    likely cause: " + f.likely_cause + "\n";
  }
  return out;
}

}  // namespace tp::train
