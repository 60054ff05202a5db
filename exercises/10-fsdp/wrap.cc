// Exercise generated from solutions/10-fsdp/wrap.cc by tools/gen_exercise.py.
// Fill in each EXERCISE, then run ./kit check 10. ./kit reset 10 restores this file.
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
  throw tp::NotImplemented("stage 10: own_parameters is not implemented yet (exercises/10-fsdp/wrap.cc)");
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
  throw tp::NotImplemented("stage 10: visit is not implemented yet (exercises/10-fsdp/wrap.cc)");
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
  throw tp::NotImplemented("stage 10: size_based_auto_wrap_policy is not implemented yet (exercises/10-fsdp/wrap.cc)");
}

std::vector<UnitPlan> plan_units(tp::nn::Module& root, const AutoWrapPolicy& policy) {
  std::vector<UnitPlan> units;
  // EXERCISE: the units the policy makes below the root (visit), refusing
  // a policy that makes none (wrap.h says why, and so must the message);
  // what they leave is the root unit, if anything. List them in the order
  // of their first parameter in root.named_parameters().
  throw tp::NotImplemented("stage 10: plan_units is not implemented yet (exercises/10-fsdp/wrap.cc)");
  return units;
}

}  // namespace stage10
