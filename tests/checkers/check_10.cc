// Checker for stage 10 (FSDP). Compiled once and linked with every stage-10
// solution: solutions/10-fsdp (must pass), the generated exercise (must fail
// at once, naming the stub), each planted-bug mutant in tests/mutants/10-fsdp
// (must fail with the diagnosis the mutant names), and your
// exercises/10-fsdp (`./kit check 10`).
// TP_STAGE_HEADER is set only for a planted bug that patches the header: its
// copy of stage.h, which includes the patched ddp.h.
//
// Besides the numbers against the reference, it checks what FSDP is for,
// from facts it computes itself (never from the stage's own account): the
// units the policy makes and their padded sizes (Note [Padding and shards]
// in flat_param.cc), the all-gathers, reduce-scatters and all-reduces of
// every micro-batch and their bytes, and the memory the library counted on
// every rank: the parameters, gradients and optimizer state a rank holds at
// the end (its shards) and at its peak (its shards and the units in use).
#ifdef TP_STAGE_HEADER
#include TP_STAGE_HEADER
#else
#include "stage.h"
#endif

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "state_dict.h"
#include "tensorplay/data.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/error.h"
#include "tensorplay/memory.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/ops.h"
#include "tensorplay/random.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/train/checker.h"
#include "tensorplay/train/config.h"
#include "tensorplay/util/temp_dir.h"

namespace {

namespace train = tp::train;
using FSDP = stage10::FullyShardedDataParallel;
using Options = stage10::Options;
using Case = train::CheckCase<Options>;
using Group = std::shared_ptr<tp::distributed::ProcessGroup>;
using stage10::BackwardPrefetch;
using stage10::ShardingStrategy;
using tp::detail::cat;
using tp::memory::Kind;

Options with(ShardingStrategy strategy, bool forward_prefetch = false,
             BackwardPrefetch backward = BackwardPrefetch::BACKWARD_PRE) {
  Options o;
  o.sharding_strategy = strategy;
  o.forward_prefetch = forward_prefetch;
  o.backward_prefetch = backward;
  return o;
}

// What a rank's own error most often means in FSDP, by its words.
constexpr const char* kFsdpRankThrew =
    "if its message says a storage was freed, a unit's parameters were used while resharded: "
    "gather a unit before its forward and again before its backward, and free it only once "
    "all its gradients are in (Note [One unit's step]); if it says an input was written while "
    "its all-gather was in flight, a gather was issued that nobody waited for, such as a "
    "prefetch of a unit that does not run next (in backward, the next unit is the one before "
    "in forward order); if it says a range is out of bounds, a flat parameter may be shorter "
    "than W shards: pad it to a multiple of W (Note [Padding and shards]); otherwise its "
    "message says why";

// A policy of the stage's (wrap.h), made when a case first uses it, not
// while the cases are listed: a stub then fails its case, named like any
// stub, instead of ending the checker before it starts.
stage10::AutoWrapPolicy policy_when_used(std::string name,
                                         std::function<stage10::AutoWrapPolicy()> make) {
  auto made = std::make_shared<std::optional<stage10::AutoWrapPolicy>>();
  return {std::move(name),
          [made, make](const tp::nn::Module& module, int depth, int64_t numel) {
            if (!made->has_value()) *made = make();
            return (*made)->should_wrap(module, depth, numel);
          }};
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // The standard sweep (W = 2, 1, 3, 4; float32 and float64; ranks seeded
  // apart; momentum) under FULL_SHARD, each Linear a unit.
  for (const train::RunConfig& c : train::standard_configs()) {
    out.push_back({c, with(ShardingStrategy::FULL_SHARD), "FULL_SHARD, a unit per Linear"});
  }
  train::RunConfig small;
  small.world_size = 3;
  small.steps = 4;
  small.momentum = 0.9;
  out.push_back({small, with(ShardingStrategy::SHARD_GRAD_OP), "SHARD_GRAD_OP, momentum"});
  train::RunConfig two = small;
  two.world_size = 2;
  out.push_back({two, with(ShardingStrategy::NO_SHARD), "NO_SHARD (DDP), momentum"});
  // The deep model: seven units, prefetched every way.
  train::RunConfig deep = small;
  deep.world_size = 4;
  deep.model_kind = train::ModelKind::Deep;
  deep.deep_depth = 6;
  out.push_back({deep, with(ShardingStrategy::FULL_SHARD, true, BackwardPrefetch::BACKWARD_PRE),
                 "deep model, forward prefetch, BACKWARD_PRE"});
  out.push_back({deep, with(ShardingStrategy::FULL_SHARD, true, BackwardPrefetch::BACKWARD_POST),
                 "deep model, forward prefetch, BACKWARD_POST"});
  train::RunConfig deep64 = deep;
  deep64.world_size = 3;
  deep64.dtype = tp::kFloat64;
  out.push_back({deep64, with(ShardingStrategy::FULL_SHARD, false, BackwardPrefetch::NONE),
                 "deep model, float64, no prefetch"});
  out.push_back({deep64, with(ShardingStrategy::SHARD_GRAD_OP, true), "deep model, float64, "
                                                                       "SHARD_GRAD_OP, prefetch"});
  // Accumulation: K = 2 micro-batches, the first under no_sync.
  train::RunConfig accumulating = deep;
  accumulating.micro_batches = 2;
  out.push_back({accumulating, with(ShardingStrategy::FULL_SHARD, true), "K = 2 (no_sync), "
                                                                         "FULL_SHARD, prefetch"});
  train::RunConfig in_place = accumulating;
  in_place.world_size = 2;
  in_place.zero_grad_set_to_none = false;
  in_place.dtype = tp::kFloat64;
  out.push_back({in_place, with(ShardingStrategy::SHARD_GRAD_OP), "K = 2 (no_sync), "
                                                                  "SHARD_GRAD_OP, zero_grad in "
                                                                  "place, float64"});
  // Other policies: each child (the ReLUs hold nothing), and by size, which
  // leaves the first and the last layer to the root unit.
  Case children{deep, with(ShardingStrategy::FULL_SHARD, true), "each child a unit"};
  children.options.auto_wrap_policy = policy_when_used("children", stage10::children_wrap_policy);
  out.push_back(children);
  Case by_size{deep, with(ShardingStrategy::FULL_SHARD, true), "units by size, a root unit"};
  by_size.options.auto_wrap_policy =
      policy_when_used("size >= 1000", [] { return stage10::size_based_auto_wrap_policy(1000); });
  out.push_back(by_size);
  // Registration order is not the order of use; two dtypes.
  train::RunConfig reordered = two;
  reordered.model_kind = train::ModelKind::Reordered;
  out.push_back({reordered, with(ShardingStrategy::FULL_SHARD, true), "reordered model, forward "
                                                                      "prefetch"});
  train::RunConfig mixed = two;
  mixed.model_kind = train::ModelKind::Mixed;
  mixed.world_size = 3;
  out.push_back({mixed, with(ShardingStrategy::FULL_SHARD, true), "fc2 in float64"});
  // Ranks seeded apart start from rank 0's values (sync_module_states).
  for (Case& c : out) {
    c.options.sync_module_states = c.config.per_rank_seed;
    c.if_a_rank_throws = kFsdpRankThrew;
  }
  return out;
}

// ---- the units, as the checker computes them ----------------------------

struct Unit {
  std::string name;  // "fc2", "3", "" (the root unit)
  int64_t numel = 0;
  int64_t element_size = 4;
  int64_t padded(int world) const { return (numel + world - 1) / world * world; }
  int64_t padded_bytes(int world) const { return padded(world) * element_size; }
  int64_t shard_bytes(int world) const { return padded(world) / world * element_size; }
};

// The units of the case's policy, from the reference's parameter names and
// sizes: a Linear's weight and bias ("fc2.weight", "fc2.bias") are one
// unit; by size, a layer of fewer than 1000 elements is the root unit's.
std::vector<Unit> units_of(const Case& c, const train::CaseRun& run) {
  const std::string policy = c.options.auto_wrap_policy.name;
  std::vector<Unit> units;
  Unit root;
  std::map<std::string, size_t> index;
  const tp::Dtype other = c.config.dtype == tp::kFloat32 ? tp::kFloat64 : tp::kFloat32;
  for (const train::ParamValues& p : run.reference.initial_params) {
    const std::string layer = p.name.substr(0, p.name.rfind('.'));
    const bool in_other_dtype = c.config.model_kind == train::ModelKind::Mixed && layer == "fc2";
    const int64_t es =
        static_cast<int64_t>(tp::element_size(in_other_dtype ? other : c.config.dtype));
    if (!index.count(layer)) {
      index[layer] = units.size();
      units.push_back(Unit{layer, 0, es});
    }
    units[index[layer]].numel += static_cast<int64_t>(p.values.size());
  }
  if (policy.rfind("size >= ", 0) == 0) {
    const int64_t min = std::stoll(policy.substr(8));
    std::vector<Unit> kept;
    for (const Unit& u : units) {
      if (u.numel >= min) {
        kept.push_back(u);
      } else {
        root.numel += u.numel;
        root.element_size = u.element_size;
      }
    }
    units = kept;
  }
  if (root.numel > 0) units.push_back(root);
  return units;
}

int64_t sum_of(const std::vector<Unit>& units, int world,
               int64_t (Unit::*bytes)(int) const) {
  int64_t total = 0;
  for (const Unit& u : units) total += (u.*bytes)(world);
  return total;
}

std::string names_of(const std::vector<Unit>& units) {
  std::string out;
  for (const Unit& u : units) {
    out += (out.empty() ? "" : ", ") + (u.name.empty() ? std::string("(root)") : "'" + u.name + "'");
  }
  return out;
}

// The units whose full size adds up to `excess` bytes, as a phrase: which
// unit was left gathered (several sizes may fit; one unit is tried, then
// each pair).
std::string which_units(const std::vector<Unit>& units, int world, int64_t excess) {
  std::vector<Unit> one;
  for (const Unit& u : units) {
    if (u.padded_bytes(world) == excess) one.push_back(u);
  }
  if (!one.empty()) {
    return cat(one.size() == 1 ? "unit " : "one of the units ", names_of(one), " (",
               one[0].padded(world), " elements, padded)");
  }
  for (size_t a = 0; a < units.size(); ++a) {
    for (size_t b = a + 1; b < units.size(); ++b) {
      if (units[a].padded_bytes(world) + units[b].padded_bytes(world) == excess) {
        return cat("units ", names_of({units[a], units[b]}), " together");
      }
    }
  }
  return "no single unit: several, or a buffer of another size";
}

// ---- the stage's checks ----------------------------------------------------

std::vector<train::Finding> check_collectives(const Case& c, const train::CaseRun& run,
                                              const std::vector<Unit>& units) {
  const int w = c.config.world_size;
  const int64_t k = c.config.micro_batches;
  const ShardingStrategy s = c.options.sharding_strategy;
  const int64_t n = static_cast<int64_t>(units.size());
  const bool has_root = !units.empty() && units.back().name.empty();
  const int64_t model_bytes = sum_of(units, w, &Unit::padded_bytes);
  const int64_t root_bytes = has_root ? units.back().padded_bytes(w) : 0;
  for (const train::RankResult& r : run.ranks) {
    for (size_t i = 0; i < r.allgathers_per_micro.size(); ++i) {
      const bool last = static_cast<int64_t>(i) % k == k - 1;
      // FULL_SHARD gathers every unit for its forward and, but the root,
      // again for its backward; SHARD_GRAD_OP once; NO_SHARD never.
      const int64_t gathers = s == ShardingStrategy::FULL_SHARD      ? 2 * n - (has_root ? 1 : 0)
                              : s == ShardingStrategy::SHARD_GRAD_OP ? n
                                                                      : 0;
      const int64_t gather_bytes = s == ShardingStrategy::FULL_SHARD
                                       ? 2 * model_bytes - root_bytes
                                       : s == ShardingStrategy::SHARD_GRAD_OP ? model_bytes : 0;
      const int64_t reductions = last ? n : 0;
      const bool sharded = s != ShardingStrategy::NO_SHARD;
      const std::string where = cat("rank ", r.rank, " micro-batch ", i, " (step ",
                                    static_cast<int64_t>(i) / k, (last ? "" : ", under no_sync"),
                                    ")");
      if (static_cast<int64_t>(r.allgathers_per_micro[i]) != gathers ||
          static_cast<int64_t>(r.allgather_bytes_per_micro[i]) != gather_bytes) {
        return {{cat(where, " issued ", r.allgathers_per_micro[i], " all-gathers of ",
                     r.allgather_bytes_per_micro[i], " bytes; ", stage10::to_string(s),
                     " over these ", n, " units (", names_of(units), ") issues ", gathers,
                     " of ", gather_bytes, " bytes"),
                 s == ShardingStrategy::FULL_SHARD
                     ? "FULL_SHARD gathers each unit before its forward, frees it after, and "
                       "gathers it again before its backward (all but the root unit, kept "
                       "from its forward to its backward); a unit gathered twice, or never "
                       "freed, or a prefetch of a unit that is not next, shows here (Note "
                       "[One unit's step])"
                     : s == ShardingStrategy::SHARD_GRAD_OP
                           ? "SHARD_GRAD_OP keeps each unit gathered from its forward to the "
                             "end of its backward: one all-gather per unit per micro-batch"
                           : "NO_SHARD keeps every unit whole on every rank: nothing to gather"}};
      }
      const uint64_t rs = sharded ? r.reduce_scatters_per_micro[i] : r.allreduces_per_micro[i];
      const uint64_t rs_bytes =
          sharded ? r.reduce_scatter_bytes_per_micro[i] : r.allreduce_bytes_per_micro[i];
      const uint64_t other = sharded ? r.allreduces_per_micro[i] : r.reduce_scatters_per_micro[i];
      if (static_cast<int64_t>(rs) != reductions ||
          static_cast<int64_t>(rs_bytes) != (last ? model_bytes : 0) || other != 0) {
        return {{cat(where, " issued ", r.reduce_scatters_per_micro[i], " reduce-scatters (",
                     r.reduce_scatter_bytes_per_micro[i], " bytes) and ",
                     r.allreduces_per_micro[i], " all-reduces (", r.allreduce_bytes_per_micro[i],
                     " bytes); expected ", reductions, " ",
                     sharded ? "reduce-scatters" : "all-reduces", " of ",
                     last ? model_bytes : 0, " bytes, one per unit, and nothing else"),
                 last ? "each unit's gradient is reduced once, when the last of its parameters' "
                        "gradients is final (on_grad_ready), over the whole padded flat gradient"
                      : "under no_sync a unit's gradient is kept whole, unreduced, and the "
                        "next backward accumulates into it (Note [no_sync keeps whole "
                        "gradients])"}};
      }
    }
  }
  return {};
}

std::vector<train::Finding> check_memory(const Case& c, const train::CaseRun& run,
                                         const std::vector<Unit>& units) {
  const int w = c.config.world_size;
  const ShardingStrategy s = c.options.sharding_strategy;
  const bool sharded = s != ShardingStrategy::NO_SHARD;
  const bool has_root = !units.empty() && units.back().name.empty();
  const int64_t shards = sharded ? sum_of(units, w, &Unit::shard_bytes)
                                 : sum_of(units, w, &Unit::padded_bytes);
  const int64_t model = sum_of(units, w, &Unit::padded_bytes);
  int64_t largest = 0;
  for (const Unit& u : units) {
    if (!u.name.empty()) largest = std::max(largest, u.padded_bytes(w));
  }
  const int64_t root = has_root ? units.back().padded_bytes(w) : 0;
  // FULL_SHARD: the unit computing and the one prefetched (or, in backward,
  // the next one's gather under the current one's compute), and the root
  // unit, gathered from its forward to its backward.
  const int64_t param_bound = s == ShardingStrategy::FULL_SHARD      ? shards + root + 2 * largest
                              : s == ShardingStrategy::SHARD_GRAD_OP ? shards + model
                                                                      : model;
  // The unit being computed and the one being reduced (Note [One reduction
  // in flight]), and the root unit's, whose gradient is complete only when
  // the first layer's is (it holds what no unit wrapped); with no_sync, every unit's whole gradient (Note [no_sync
  // keeps whole gradients]). With zero_grad in place the shards' gradients
  // outlive the step, and each reduction's result (a shard) is added into
  // them: two of those, the one in flight and the one being issued.
  int64_t largest_shard = 0;
  for (const Unit& u : units) largest_shard = std::max(largest_shard, u.shard_bytes(w));
  const int64_t results = c.config.zero_grad_set_to_none ? 0 : 2 * largest_shard;
  const int64_t grad_bound = !sharded ? 2 * model
                             : c.config.micro_batches > 1
                                 ? shards + model + results
                                 : shards + root + 2 * largest + results;
  for (const train::RankResult& r : run.ranks) {
    if (!r.memory) continue;
    const auto live = [&](Kind kind) { return static_cast<int64_t>(r.memory->live_bytes(kind)); };
    const auto peak = [&](Kind kind) { return static_cast<int64_t>(r.memory->peak_bytes(kind)); };
    if (live(Kind::Parameter) != shards) {
      const int64_t excess = live(Kind::Parameter) - shards;
      return {{cat("rank ", r.rank, " holds ", live(Kind::Parameter), " bytes of parameters "
                   "after training; its shards are ", shards, " bytes (",
                   sharded ? "1/W of each padded unit" : "NO_SHARD: the whole model", ")",
                   excess > 0 ? cat(", so ", excess, " bytes more: as much as ",
                                    which_units(units, w, excess))
                              : ""),
               excess > 0 ? "a unit's gathered parameters are never freed: after its backward "
                            "(reshard) every unit must give its full buffer's bytes back (Note "
                            "[Freed, not dropped]: free the storage, not the handle)"
                          : "the shards are not what the padding rule makes (Note [Padding and "
                            "shards]): ceil(numel / W) elements per rank"}};
    }
    if (peak(Kind::Parameter) > param_bound) {
      return {{cat("rank ", r.rank, "'s parameters peaked at ", peak(Kind::Parameter),
                   " bytes; ", stage10::to_string(s), " needs at most ", param_bound,
                   " (its shards ", shards, s == ShardingStrategy::FULL_SHARD
                       ? cat(" + the root unit ", root, " + two of the largest unit, ", largest)
                       : cat(" + the model ", model), ")"),
               s == ShardingStrategy::FULL_SHARD
                   ? "a unit is kept gathered after its forward, or more than the next unit is "
                     "prefetched: FULL_SHARD frees each unit as soon as its forward is done "
                     "(post_forward), and prefetches only the unit that runs next "
                     "(next_in_order)"
                   : "more is gathered than the strategy keeps"}};
    }
    if (peak(Kind::Gradient) > grad_bound) {
      return {{cat("rank ", r.rank, "'s gradients peaked at ", peak(Kind::Gradient),
                   " bytes; at most ", grad_bound, " (the shards' gradients ", shards,
                   c.config.micro_batches > 1 ? cat(" + every unit's whole gradient, ", model)
                                              : cat(" + the root unit ", root,
                                                    " + two of the largest unit, ", largest),
                   results > 0 ? cat(" + two reductions' results, ", results) : "", ")"),
               "a unit's full gradient outlives its reduction: once the reduce-scatter has "
               "finished, its bytes go at once (finish_reduction), and at most one reduction "
               "is in flight (Note [One reduction in flight])"}};
    }
    if (sharded && live(Kind::Gradient) != shards) {
      return {{cat("rank ", r.rank, " holds ", live(Kind::Gradient), " bytes of gradients after "
                   "training; its shards' gradients are ", shards),
               "after backward a rank holds only its shard of each unit's gradient "
               "(local_shard().grad); the full gradients go with their reduction, the last "
               "unit's too: backward finishes the last reduction before it returns "
               "(finish_backward)"}};
    }
    const int64_t state = c.config.momentum > 0 ? shards : 0;
    if (live(Kind::OptimizerState) != state) {
      return {{cat("rank ", r.rank, " holds ", live(Kind::OptimizerState), " bytes of optimizer "
                   "state; SGD over its shards keeps ", state),
               "the optimizer must step fsdp.parameters(): the units' shards, 1/W of the model"}};
    }
  }
  return {};
}

std::vector<train::Finding> stage_checks(const Case& c, const train::CaseRun& run) {
  const std::vector<Unit> units = units_of(c, run);
  return train::first_findings({
      [&] { return check_collectives(c, run, units); },
      [&] { return check_memory(c, run, units); },
  });
}

// ---- scenarios --------------------------------------------------------------

// Which units hold their gathered bytes, as a phrase ("fc1, fc3"), "" for none.
std::string gathered_units(const FSDP& fsdp) {
  std::string out;
  for (const auto& unit : fsdp.units()) {
    if (!unit->full().storage()->is_freed()) {
      out += (out.empty() ? "" : ", ") + (unit->unit().empty() ? "(root)" : unit->unit());
    }
  }
  return out;
}

// What is gathered after a forward and after a backward, by strategy.
train::Scenario gathered_when() {
  return {"MiniMLP, W = 2: after a forward FULL_SHARD holds no unit gathered and "
          "SHARD_GRAD_OP every one; after the backward neither holds any",
          2,
          [](int rank, Group group) -> std::string {
            for (ShardingStrategy s : {ShardingStrategy::FULL_SHARD,
                                       ShardingStrategy::SHARD_GRAD_OP}) {
              tp::manual_seed(0);
              auto model = std::make_shared<tp::nn::MiniMLP>();
              FSDP fsdp(model, group, with(s));
              const tp::Tensor loss = tp::mse_loss(fsdp(tp::randn({4, 16})), tp::zeros({4, 4}));
              const std::string after_forward = gathered_units(fsdp);
              const std::string want = s == ShardingStrategy::FULL_SHARD ? "" : "fc1, fc2, fc3";
              if (after_forward != want) {
                return cat("rank ", rank, ", ", stage10::to_string(s), ": after the forward, ",
                           after_forward.empty() ? "no unit is" : "units " + after_forward + " are",
                           " gathered; expected ", want.empty() ? "none" : want);
              }
              loss.backward();
              const std::string after_backward = gathered_units(fsdp);
              if (!after_backward.empty()) {
                return cat("rank ", rank, ", ", stage10::to_string(s), ": after the backward, "
                           "units ", after_backward, " are still gathered; expected none");
              }
            }
            return "";
          },
          "FULL_SHARD frees each unit right after its forward (post_forward) and SHARD_GRAD_OP "
          "keeps it until its backward; both free it once its gradients are complete "
          "(on_grad_ready: reshard)"};
}

// Each rank's shard of each unit, against the checker's own flattening of
// an identical model: the unit's parameters end to end (in the order of its
// slots), padded to a multiple of W, rank r's shard the r-th of W equal
// blocks. Run before the cases, which see shards only through gathers that
// would blame what a wrong shard does to them.
train::Scenario shards_are_slices() {
  train::Scenario scenario{
      "MiniMLP, W = 3: each rank's shard of each unit is its block of the padded flat "
      "parameter",
      3,
      [](int rank, Group group) -> std::string {
        tp::manual_seed(0);
        tp::nn::MiniMLP copy;
        std::map<std::string, tp::Tensor> values;
        for (const auto& [name, p] : copy.named_parameters()) values[name] = p;
        tp::manual_seed(0);
        FSDP fsdp(std::make_shared<tp::nn::MiniMLP>(), group,
                  with(ShardingStrategy::FULL_SHARD));
        for (const auto& unit : fsdp.units()) {
          const std::string name = unit->unit().empty() ? "(root)" : unit->unit();
          std::vector<double> flat;
          for (const stage10::ParamSlot& slot : unit->slots()) {
            const auto it = values.find(slot.name);
            if (it == values.end()) {
              return cat("rank ", rank, ": unit ", name, " has a slot named '", slot.name,
                         "', which is not a parameter of the model");
            }
            for (double v : it->second.to_vector()) flat.push_back(v);
          }
          const int64_t numel = static_cast<int64_t>(flat.size());
          const int64_t block = (numel + 2) / 3;
          const std::vector<double> shard = unit->local_shard().to_vector();
          if (static_cast<int64_t>(shard.size()) != block) {
            return cat("rank ", rank, ": unit ", name, " (", numel, " elements) has a shard of ",
                       shard.size(), " elements; padded to ", 3 * block, ", each of 3 ranks "
                       "holds ", block);
          }
          const auto holds_block = [&](int64_t b) {
            for (int64_t i = 0; i < block && b * block + i < numel; ++i) {
              if (shard[static_cast<size_t>(i)] != flat[static_cast<size_t>(b * block + i)]) {
                return false;
              }
            }
            return true;
          };
          if (!holds_block(rank)) {
            int64_t other = -1;
            for (int64_t b = 0; b < 3 && other < 0; ++b) {
              if (b != rank && holds_block(b)) other = b;
            }
            return cat("rank ", rank, ": its shard of unit ", name, " is not elements [",
                       rank * block, ", ", (rank + 1) * block, ") of the flat parameter",
                       other >= 0 ? cat(": it holds block ", other, " (elements [", other * block,
                                        ", ", (other + 1) * block, "))")
                                  : "");
          }
        }
        return "";
      },
      "a rank keeps its own block of each unit's padded flat parameter: rank r's shard "
      "starts at r * shard_numel (Note [Padding and shards])",
      kFsdpRankThrew};
  scenario.before_cases = true;
  return scenario;
}

// ---- scenarios on the stage's other entry points -----------------------

// The plan of the scenarios below: the deep model, three hidden layers
// (units of 544, 1056, 1056 and 132 elements: none a multiple of 3).
train::RunConfig scenario_plan(int world_size) {
  train::RunConfig config;
  config.world_size = world_size;
  config.model_kind = train::ModelKind::Deep;
  config.deep_depth = 3;
  config.momentum = 0.9;
  return config;
}

// A rank's FSDP over the plan's model (FULL_SHARD, a unit per Linear), and
// its SGD over the shards.
struct Trainee {
  std::shared_ptr<tp::nn::Module> model;
  std::unique_ptr<FSDP> fsdp;
  std::unique_ptr<tp::optim::SGD> sgd;
  Trainee(const train::RunConfig& config, Group group) {
    tp::manual_seed(config.model_seed);
    model = train::make_model(config);
    fsdp = std::make_unique<FSDP>(model, std::move(group), with(ShardingStrategy::FULL_SHARD));
    sgd = std::make_unique<tp::optim::SGD>(fsdp->parameters(),
                                           tp::optim::SGDOptions{config.lr, config.momentum});
  }
  // Steps [from, to) of the plan on this rank's data, one micro-batch each.
  void train(const train::RunConfig& config, int rank, int64_t from, int64_t to) {
    const tp::data::SyntheticRegression dataset(train::data_options(config));
    for (int64_t i = from; i < to; ++i) {
      const tp::data::Batch batch = train::micro_batch(dataset, config, rank, i);
      sgd->zero_grad();
      tp::mse_loss((*fsdp)(batch.x), batch.y).backward();
      sgd->step();
    }
  }
  // The whole model's values, gathered (summon_full_params), by name.
  std::map<std::string, std::vector<double>> values() {
    std::map<std::string, std::vector<double>> out;
    auto full = fsdp->summon_full_params();
    for (const auto& [name, p] : model->named_parameters()) out[name] = p.to_vector();
    return out;
  }
  // A step with every gradient zero: what moves the parameters is the
  // momentum alone (p -= lr * momentum * buf), so the values after it
  // show the buffers the optimizer holds.
  void momentum_only_step() {
    for (const tp::Tensor& shard : fsdp->parameters()) shard.set_grad(tp::zeros_like(shard));
    sgd->step();
  }
};

// The first parameter whose values differ, as a phrase; "" when none does.
std::string first_difference(const std::map<std::string, std::vector<double>>& got,
                             const std::map<std::string, std::vector<double>>& want) {
  for (const auto& [name, values] : want) {
    const auto it = got.find(name);
    if (it == got.end()) return cat(name, " is missing");
    if (it->second.size() != values.size()) {
      return cat(name, " has ", it->second.size(), " elements, not ", values.size());
    }
    for (size_t i = 0; i < values.size(); ++i) {
      if (it->second[i] != values[i]) {
        return cat(name, "[", i, "] is ", it->second[i], ", not ", values[i]);
      }
    }
  }
  return "";
}

// full_state_dict on rank 0: every parameter, by the model's names and in
// its order, equal to an identical model's values; nothing elsewhere.
train::Scenario full_state_dict_is_the_model() {
  return {"deep model, W = 3: full_state_dict gives rank 0 every parameter, named and valued "
          "as the model's, and the other ranks nothing",
          3,
          [](int rank, Group group) -> std::string {
            const train::RunConfig config = scenario_plan(3);
            tp::manual_seed(config.model_seed);
            const std::shared_ptr<tp::nn::Module> copy = train::make_model(config);
            Trainee t(config, group);
            const std::vector<tp::nn::NamedTensor> state = stage10::full_state_dict(*t.fsdp);
            if (rank != 0) {
              return state.empty() ? "" : cat("rank ", rank, " got ", state.size(),
                                              " tensors; only rank 0 gets the state dict");
            }
            const auto want = copy->named_parameters();
            if (state.size() != want.size()) {
              return cat("rank 0 got ", state.size(), " tensors; the model has ", want.size());
            }
            std::map<std::string, std::vector<double>> got, expected;
            for (size_t i = 0; i < want.size(); ++i) {
              if (state[i].first != want[i].first) {
                return cat("tensor ", i, " is named '", state[i].first, "'; the model's is '",
                           want[i].first, "' (the model's names, in its order)");
              }
              got[state[i].first] = state[i].second.to_vector();
              expected[want[i].first] = want[i].second.to_vector();
            }
            const std::string diff = first_difference(got, expected);
            return diff.empty() ? "" : cat("rank 0's full state dict: ", diff);
          },
          "full_state_dict gathers one unit at a time (summon_full_params(u)) and copies each "
          "parameter (clone: the gathered buffer is freed again when the guard goes), without "
          "the padding",
          "if its message says a storage was freed, a tensor full_state_dict returned still "
          "views a unit's gathered buffer, freed when its summon_full_params guard went: copy "
          "each parameter (clone()) while the unit is gathered; otherwise its message says why"};
}

// clip_grad_norm_ over shards against one process clipping the whole
// model's gradient (both ranks' micro-batches, each loss / W).
train::Scenario clipping_is_global() {
  return {"deep model, W = 2: clip_grad_norm_ returns the whole gradient's norm and scales "
          "each shard as clipping the whole would",
          2,
          [](int rank, Group group) -> std::string {
            const train::RunConfig config = scenario_plan(2);
            const tp::data::SyntheticRegression dataset(train::data_options(config));
            tp::manual_seed(config.model_seed);
            const std::shared_ptr<tp::nn::Module> whole = train::make_model(config);
            for (int r = 0; r < 2; ++r) {
              const tp::data::Batch batch = train::micro_batch(dataset, config, r, 0);
              tp::mul(tp::mse_loss((*whole)(batch.x), batch.y), 0.5).backward();
            }
            double sum_sq = 0;
            std::map<std::string, std::vector<double>> grads;
            for (const auto& [name, p] : whole->named_parameters()) {
              grads[name] = p.grad().to_vector();
              for (double g : grads[name]) sum_sq += g * g;
            }
            const double norm = std::sqrt(sum_sq);
            const double max_norm = norm / 4;  // so that it clips
            Trainee t(config, group);
            const tp::data::Batch batch = train::micro_batch(dataset, config, rank, 0);
            tp::mse_loss((*t.fsdp)(batch.x), batch.y).backward();
            const double total = t.fsdp->clip_grad_norm_(max_norm);
            if (std::abs(total - norm) > 1e-5 * norm) {
              return cat("rank ", rank, ": clip_grad_norm_ returned ", total, "; the whole "
                         "gradient's norm is ", norm);
            }
            const double coefficient = max_norm / (norm + 1e-6);
            for (const auto& unit : t.fsdp->units()) {
              std::vector<double> flat;
              for (const stage10::ParamSlot& slot : unit->slots()) {
                for (double g : grads.at(slot.name)) flat.push_back(g * coefficient);
              }
              const size_t block = (flat.size() + 1) / 2;
              const std::vector<double> shard = unit->local_shard().grad().to_vector();
              if (shard.size() != block) {
                return cat("rank ", rank, ": unit ", unit->unit(), "'s gradient shard has ",
                           shard.size(), " elements; the unit's ", flat.size(), " padded to "
                           "a multiple of 2 make shards of ", block);
              }
              for (size_t i = 0; i < block && rank * block + i < flat.size(); ++i) {
                const double want = flat[rank * block + i];
                if (std::abs(shard[i] - want) > 1e-5 * std::max(1.0, std::abs(want))) {
                  return cat("rank ", rank, ": after clipping, unit ", unit->unit(),
                             "'s gradient element ", rank * block + i, " is ", shard[i],
                             "; clipping the whole gradient gives ", want, " (", want / coefficient,
                             " scaled by ", coefficient, ")");
                }
              }
            }
            return "";
          },
          "the total norm is of the whole gradient: each rank sums the squares of its shards' "
          "gradients, one all-reduce adds the ranks' sums, and every shard is scaled by "
          "max_norm / (total + 1e-6) when that is below 1",
          kFsdpRankThrew};
}

// Ranks whose models hold the same values in another order (rank 1's
// fc1.weight reversed: the same sum) are refused, naming the parameter,
// when sync_module_states is off.
train::Scenario different_models_refused() {
  return {"MiniMLP, W = 2: rank 1's fc1.weight reversed (the same values, the same sum) is "
          "refused by name without sync_module_states",
          2,
          [](int rank, Group group) -> std::string {
            tp::manual_seed(0);
            auto model = std::make_shared<tp::nn::MiniMLP>();
            if (rank == 1) {
              tp::NoGradGuard no_grad;
              std::vector<double> values = model->fc1->weight.to_vector();
              std::reverse(values.begin(), values.end());
              model->fc1->weight.copy_(tp::tensor(values, model->fc1->weight.shape()));
            }
            try {
              FSDP fsdp(model, group, with(ShardingStrategy::FULL_SHARD));
            } catch (const tp::NotImplemented&) {
              throw;  // a stub: named as one
            } catch (const tp::Error& e) {  // tp::DistributedError, or any of the kit's
              if (std::string(e.what()).find("fc1.weight") != std::string::npos) return "";
              return cat("rank ", rank, ": refused, but without naming fc1.weight: ", e.what());
            }
            return cat("rank ", rank, ": FSDP was built over models that differ between the "
                       "ranks (fc1.weight reversed on rank 1)");
          },
          "without sync_module_states every rank must start from the same values: compare a "
          "fingerprint of each parameter that order changes (a sum weighted by position, not "
          "the sum alone) across the ranks, and name the first that differs",
          kFsdpRankThrew};
}

// The budget of the group a scenario makes itself (the harness's groups
// have theirs: Note [Collective budget]).
constexpr uint64_t kScenarioBudget = 10000;

// A checkpoint saved by 4 ranks, loaded by 2 of them in a group of their
// own: the same whole model, and the same momentum (a step on zero
// gradients moves both runs' parameters alike only if their buffers are
// the same). The folder is the checker's: made in main, gone after.
train::Scenario checkpoint_reshards(std::string folder) {
  return {"deep model: a sharded checkpoint saved by 4 ranks loads on 2, parameters and "
          "momentum as saved",
          4,
          [folder](int rank, Group group) -> std::string {
            const train::RunConfig four = scenario_plan(4);
            Trainee t(four, group);
            t.train(four, rank, 0, 2);
            stage10::save_sharded_checkpoint(*t.fsdp, *t.sgd, folder + "/checkpoint", 2);
            const auto saved = t.values();
            t.momentum_only_step();
            const auto after_step = t.values();
            // A fresh meeting place for the job of 2 (--repeat runs this
            // again): ranks 0 and 1 use it only after the barrier.
            if (rank == 0) std::filesystem::remove_all(folder + "/rendezvous-2");
            group->barrier()->wait();
            std::string out;
            if (rank < 2) {
              // Ranks 0 and 1 meet again as a job of 2.
              const auto two_ranks = std::make_shared<tp::distributed::ProcessGroupGloo>(
                  folder + "/rendezvous-2", rank, 2,
                  tp::distributed::GlooOptions{group->timeout()});
              // As the scenario's own group: a load that never stops issuing
              // collectives ends here instead of running forever.
              two_ranks->set_collective_budget(kScenarioBudget, "the resumed job's");
              const train::RunConfig two = scenario_plan(2);
              Trainee resumed(two, two_ranks);
              const int64_t step = stage10::load_sharded_checkpoint(
                  *resumed.fsdp, *resumed.sgd, folder + "/checkpoint");
              if (step != 2) out = cat("rank ", rank, " of 2: the load returned step ", step,
                                       "; the checkpoint is of step 2");
              if (out.empty()) {
                const std::string diff = first_difference(resumed.values(), saved);
                if (!diff.empty()) out = cat("rank ", rank, " of 2, after the load: ", diff);
              }
              if (out.empty()) {
                resumed.momentum_only_step();
                const std::string diff = first_difference(resumed.values(), after_step);
                if (!diff.empty()) {
                  out = cat("rank ", rank, " of 2: the parameters load as saved, but a step "
                            "on zero gradients (momentum alone) then gives ", diff,
                            ": the momentum buffers were not resharded as saved");
                }
              }
            }
            group->barrier()->wait();
            return out;
          },
          "each rank of the new job reads, from whichever saved files hold them, the elements "
          "its shard covers at the new world size, for the parameters and for the momentum "
          "(Note [Resharding])",
          "if its message says a file ends too soon or is missing, the load computes where to "
          "read for the world size it runs at, not the one that saved: saved rank q's file "
          "holds elements [q * s, (q + 1) * s) of each unit, s the saved shard's size, then "
          "as many of momentum (Note [Resharding]); otherwise its message says why"};
}

}  // namespace

int main(int argc, char** argv) {
  train::CheckerSpec<Options> spec;
  spec.stage = stage10::stage_spec();
  spec.cases = cases();
  spec.stage_checks = stage_checks;
  spec.scenarios.push_back(shards_are_slices());
  spec.scenarios.push_back(gathered_when());
  spec.scenarios.push_back(different_models_refused());
  spec.scenarios.push_back(full_state_dict_is_the_model());
  spec.scenarios.push_back(clipping_is_global());
  const tp::TempDir checkpoints("tp-check10");
  spec.scenarios.push_back(checkpoint_reshards(checkpoints.path()));
  return train::run_checker<FSDP>(argc, argv, spec);
}
