// Stage 10 — auto-wrap policies (see wrap.h).
#include "wrap.h"

#include <algorithm>
#include <map>
#include <utility>

#include "tensorplay/error.h"
#include "tensorplay/nn/linear.h"

namespace stage10 {
namespace {

int64_t numel_of(const std::vector<tp::nn::NamedTensor>& params) {
  int64_t n = 0;
  for (const auto& [name, p] : params) n += p.numel();
  return n;
}

// The module's own parameters (not its children's), named with `prefix`.
std::vector<tp::nn::NamedTensor> own_parameters(const tp::nn::Module& module,
                                                const std::string& prefix) {
  std::vector<tp::nn::NamedTensor> own;
  // EXERCISE: the module's named parameters that are not under one of its
  // children ("fc1.weight" is fc1's), named with prefix.
  // BEGIN SOLUTION
  for (const auto& [name, p] : module.named_parameters()) {
    const bool in_child = std::any_of(
        module.children().begin(), module.children().end(),
        [&](const auto& child) { return name.rfind(child.first + ".", 0) == 0; });
    if (!in_child) own.emplace_back(prefix + name, p);
  }
  // END SOLUTION
  return own;
}

// Children first: returns the parameters of `module` that no unit took,
// after making it a unit if the policy says so (the root never: depth 0).
std::vector<tp::nn::NamedTensor> visit(tp::nn::Module& module, const std::string& prefix,
                                       int depth, const AutoWrapPolicy& policy,
                                       std::vector<UnitPlan>& units) {
  // EXERCISE: the module's own parameters, then what each child (visited
  // first, one level deeper) leaves; if the policy makes this module a unit
  // (never the root, never one with nothing left), it takes them all, named
  // by its path ("fc2" from the prefix "fc2.").
  // BEGIN SOLUTION
  std::vector<tp::nn::NamedTensor> rest = own_parameters(module, prefix);
  for (const auto& [name, child] : module.children()) {
    for (auto& p : visit(*child, prefix + name + ".", depth + 1, policy, units)) {
      rest.push_back(std::move(p));
    }
  }
  if (depth > 0 && !rest.empty() && policy.should_wrap(module, depth, numel_of(rest))) {
    std::string path = prefix.substr(0, prefix.size() - 1);
    units.push_back(UnitPlan{std::move(path), &module, std::move(rest)});
    return {};
  }
  return rest;
  // END SOLUTION
}

}  // namespace

AutoWrapPolicy linear_wrap_policy() {
  return {"linear", [](const tp::nn::Module& module, int, int64_t) {
            return dynamic_cast<const tp::nn::Linear*>(&module) != nullptr;
          }};
}

AutoWrapPolicy children_wrap_policy() {
  return {"children", [](const tp::nn::Module&, int depth, int64_t) { return depth == 1; }};
}

AutoWrapPolicy size_based_auto_wrap_policy(int64_t min_num_params) {
  TP_CHECK(min_num_params >= 1, "stage10 size_based_auto_wrap_policy: min_num_params is ",
           min_num_params, "; give a number of elements >= 1");
  // EXERCISE: the policy (wrap.h).
  // BEGIN SOLUTION
  return {tp::detail::cat("size >= ", min_num_params),
          [min_num_params](const tp::nn::Module&, int, int64_t nonwrapped_numel) {
            return nonwrapped_numel >= min_num_params;
          }};
  // END SOLUTION
}

std::vector<UnitPlan> plan_units(tp::nn::Module& root, const AutoWrapPolicy& policy) {
  std::vector<UnitPlan> units;
  // EXERCISE: the units the policy makes below the root (visit), refusing
  // a policy that makes none (wrap.h says why, and so must the message);
  // what they leave is the root unit, if anything. List them in the order
  // of their first parameter in root.named_parameters().
  // BEGIN SOLUTION
  std::vector<tp::nn::NamedTensor> rest = visit(root, "", 0, policy, units);
  TP_CHECK(!units.empty(), "stage10 FSDP: the auto_wrap_policy '", policy.name, "' made no unit "
           "below the root, so "
           "the whole model (", numel_of(rest), " elements) would be one unit, gathered whole "
           "before every forward: nothing would be saved. Choose a policy that wraps layers "
           "(linear_wrap_policy(), children_wrap_policy(), or size_based_auto_wrap_policy with a "
           "smaller min_num_params)");
  if (!rest.empty()) units.push_back(UnitPlan{"", nullptr, std::move(rest)});
  // In the order of their first parameter in the model.
  std::map<const tp::TensorImpl*, size_t> position;
  for (const auto& [name, p] : root.named_parameters()) position.emplace(p.impl(), position.size());
  std::stable_sort(units.begin(), units.end(), [&](const UnitPlan& a, const UnitPlan& b) {
    return position.at(a.params.front().second.impl()) < position.at(b.params.front().second.impl());
  });
  // END SOLUTION
  return units;
}

}  // namespace stage10
