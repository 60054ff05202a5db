// Stage 10 — auto-wrap policies: which modules become FSDP units
// (PyTorch's torch/distributed/fsdp/wrap.py).
//
// What it is: a unit is a module whose parameters are gathered, used and
// freed together: one flat parameter (flat_param.h), one all-gather before
// its forward and before its backward, one reduce-scatter after. The policy
// is asked about every module below the root, children before their parent
// (a module is asked with the elements its parameters hold that no unit
// below it has taken); what no unit takes belongs to the root unit.
//
// What it is not: PyTorch wraps each unit's module in an FSDP instance of
// its own (nested FSDP); the kit leaves the model as it is and hooks each
// unit's module (Module::register_forward_pre_hook), as PyTorch's FSDP2
// (fully_shard) does.
//
// Contract:
//   - plan_units lists the units in the order of their first parameter in
//     root.named_parameters(), the root unit (named "") included when it
//     has parameters; every parameter is in exactly one unit; a module with
//     no parameters left is never a unit.
//   - A policy that makes no unit below the root throws tp::Error: the whole
//     model would be one unit, gathered whole before every forward, which
//     saves no memory at all.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensorplay/nn/module.h"

namespace stage10 {

// A policy: its name, for messages and the demo ("linear", "size >= 1000"),
// and should_wrap(module, depth, nonwrapped_numel): whether `module`,
// `depth` levels below the root (its children are at depth 1), becomes a
// unit, given the elements of its parameters that no unit below it has
// taken. PyTorch's auto_wrap_policy is the function alone (module,
// recurse, nonwrapped_numel), without recurse: the kit always recurses.
struct AutoWrapPolicy {
  std::string name;
  std::function<bool(const tp::nn::Module& module, int depth, int64_t nonwrapped_numel)>
      should_wrap;
};

// Each Linear is a unit (PyTorch: ModuleWrapPolicy({nn.Linear})): "linear".
AutoWrapPolicy linear_wrap_policy();
// Each child of the root is a unit (each layer of a Sequential): "children".
AutoWrapPolicy children_wrap_policy();
// A module is a unit once it holds at least min_num_params elements not
// already in a unit below it (PyTorch's size_based_auto_wrap_policy):
// "size >= N". REQUIRES: min_num_params >= 1.
AutoWrapPolicy size_based_auto_wrap_policy(int64_t min_num_params);

// One unit: its module (null for the root unit), its path in the model
// ("fc2", "3", "" for the root) and its parameters, named as in the model.
struct UnitPlan {
  std::string name;
  tp::nn::Module* module = nullptr;
  std::vector<tp::nn::NamedTensor> params;
};

// The units `policy` makes of `root` (see the contract).
std::vector<UnitPlan> plan_units(tp::nn::Module& root, const AutoWrapPolicy& policy);

}  // namespace stage10
