// Tests of tp::nn (Module, Linear, ReLU, Sequential, MiniMLP, BranchyMLP,
// RunningMean, BufferedMLP, deep_mlp) and tp::optim::SGD: parameter and
// buffer names and order as torch lists them, forwards against hand
// computation, gradients against float64 finite differences, zero_grad, and
// SGD updates against their closed forms.
#include <doctest/doctest.h>

#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/error.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"

namespace nn = tp::nn;
using doctest::Approx;
using doctest::Contains;

namespace {

std::vector<std::string> names_of(const std::vector<nn::NamedTensor>& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

// Overwrites a parameter's values without recording autograd history.
void set_values(const tp::Tensor& p, const std::vector<double>& values) {
  tp::NoGradGuard no_grad;
  tp::Tensor(p).copy_(tp::tensor(values, p.shape(), p.dtype()));
}

// A leaf parameter for optimizer tests: float64 so closed forms compare exactly-ish.
tp::Tensor param(const std::vector<double>& values) {
  tp::Tensor p = tp::tensor(values, {static_cast<int64_t>(values.size())}, tp::kFloat64);
  p.requires_grad_(true);
  return p;
}

// Names of the parameters whose grad() is defined, in listing order.
std::vector<std::string> names_with_grad(const nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& [name, p] : model.named_parameters()) {
    if (p.grad().defined()) out.push_back(name);
  }
  return out;
}

// Checks dL/d(leaf) for L = sum(f() * w), with a fixed w, against float64
// central finite differences, element by element, for every leaf. A leaf that
// backward left without a gradient must be one L does not depend on at all:
// both perturbed values of L are then bit-identical, so its numeric
// derivative is exactly 0.
//
// f must be a pure function of the leaves' values (a model in eval mode, or
// one without buffers). Tolerance: with eps = 1e-6 in float64 the central
// difference is off by ~eps^2 |L^(3)| + 1e-16 |L| / eps, about 1e-10 for the
// O(1) values here, so 1e-6 relative (floor 1e-6) leaves a wide margin while a
// wrong gradient (a missing path, a sign, a transpose) is off by O(1). The
// inputs keep every ReLU input away from 0 by far more than eps can move it.
void check_grads_by_finite_differences(const std::function<tp::Tensor()>& f,
                                       const std::vector<tp::Tensor>& leaves) {
  constexpr double kEps = 1e-6;
  for (const tp::Tensor& x : leaves) x.set_grad(tp::Tensor());
  const tp::Tensor out = f();
  std::vector<double> wv(static_cast<std::size_t>(out.numel()));
  for (std::size_t i = 0; i < wv.size(); ++i) wv[i] = 0.5 + 0.25 * static_cast<double>(i % 5);
  const tp::Tensor w = tp::tensor(wv, out.shape(), tp::kFloat64);
  tp::sum(tp::mul(out, w)).backward();

  auto objective = [&] {
    tp::NoGradGuard no_grad;
    return tp::sum(tp::mul(f(), w)).item();
  };
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const tp::Tensor& x = leaves[i];
    CAPTURE(i);
    REQUIRE(x.is_contiguous());
    const bool has_grad = x.grad().defined();
    const std::vector<double> analytic = has_grad ? x.grad().to_vector() : std::vector<double>{};
    double* data = x.data_ptr<double>();  // contiguous: element j is data[j]
    for (int64_t j = 0; j < x.numel(); ++j) {
      CAPTURE(j);
      const double numeric = test_util::central_difference(data, j, objective, kEps);
      if (has_grad) {
        CHECK(analytic[static_cast<std::size_t>(j)] == Approx(numeric).epsilon(1e-6));
      } else {
        CHECK(numeric == 0.0);
      }
    }
  }
}

nn::MiniMLPOptions float64_options(int64_t in, int64_t hidden, int64_t out) {
  return {.in_features = in, .hidden = hidden, .out_features = out, .dtype = tp::kFloat64};
}

// A module with a running-statistics buffer and a child, like BatchNorm's
// running_mean: for the buffer listings.
class WithBuffers : public nn::Module {
 public:
  WithBuffers() {
    scale = register_parameter("scale", tp::ones({3}, tp::kFloat64));
    running_mean = register_buffer("running_mean", tp::zeros({3}, tp::kFloat64));
    head = register_module("head", std::make_shared<nn::Linear>(3, 2, true, tp::kFloat64));
  }
  tp::Tensor forward(const tp::Tensor& x) override { return head->forward(x); }

  // Exposes the protected registration calls to the error tests.
  using nn::Module::register_buffer;
  using nn::Module::register_parameter;
  template <typename M>
  void add(const std::string& name, std::shared_ptr<M> m) {
    register_module(name, std::move(m));
  }

  tp::Tensor scale, running_mean;
  std::shared_ptr<nn::Linear> head;
};

}  // namespace

// ---- Linear -------------------------------------------------------------------

TEST_CASE("Linear has a (out, in) weight and an (out) bias that require grad") {
  nn::Linear layer(5, 3);
  CHECK(layer.in_features() == 5);
  CHECK(layer.out_features() == 3);
  CHECK(layer.weight.shape() == tp::Shape{3, 5});
  CHECK(layer.bias.shape() == tp::Shape{3});
  CHECK(layer.weight.dtype() == tp::kFloat32);
  CHECK(layer.weight.requires_grad());
  CHECK(layer.weight.is_leaf());
  CHECK(layer.bias.requires_grad());
  CHECK(names_of(layer.named_parameters()) == std::vector<std::string>{"weight", "bias"});
  // The listed tensor is the member itself (a handle), not a copy.
  CHECK(layer.parameters()[0].impl() == layer.weight.impl());

  nn::Linear no_bias(5, 3, /*bias=*/false, tp::kFloat64);
  CHECK_FALSE(no_bias.bias.defined());
  CHECK(no_bias.parameters().size() == 1);
  CHECK(no_bias.weight.dtype() == tp::kFloat64);
}

TEST_CASE("Linear init draws weight then bias from U(-1/sqrt(in), 1/sqrt(in))") {
  const int64_t in = 16, out = 8;
  const double bound = 1.0 / std::sqrt(16.0);  // 0.25
  tp::manual_seed(77);
  nn::Linear layer(in, out, true, tp::kFloat64);

  // The same draws from a private generator with the same seed, same order.
  tp::Generator g(77);
  const tp::Tensor w = tp::rand_uniform({out, in}, -bound, bound, tp::kFloat64, &g);
  const tp::Tensor b = tp::rand_uniform({out}, -bound, bound, tp::kFloat64, &g);
  CHECK(layer.weight.to_vector() == w.to_vector());
  CHECK(layer.bias.to_vector() == b.to_vector());

  for (const auto& p : layer.parameters()) {
    for (double v : p.to_vector()) {
      CHECK(v >= -bound);
      CHECK(v < bound);
    }
  }
  // Not all in one corner: 136 values from U(-0.25, 0.25) spread out.
  const auto wv = layer.weight.to_vector();
  CHECK(*std::min_element(wv.begin(), wv.end()) < -0.2);
  CHECK(*std::max_element(wv.begin(), wv.end()) > 0.2);
}

TEST_CASE("Linear forward computes x W^T + b") {
  nn::Linear layer(2, 3, true, tp::kFloat64);
  set_values(layer.weight, {1, 2,   //
                            3, 4,   //
                            5, 6});  // (3, 2)
  set_values(layer.bias, {0.5, -1, 2});
  const tp::Tensor x = tp::tensor({1, -1,   //
                                   2, 0.5},  //
                                  {2, 2}, tp::kFloat64);
  const tp::Tensor y = layer(x);
  CHECK(y.shape() == tp::Shape{2, 3});
  // Row 0: [1-2+0.5, 3-4-1, 5-6+2]; row 1: [2+1+0.5, 6+2-1, 10+3+2].
  CHECK(y.to_vector() == std::vector<double>{-0.5, -2, 1, 3.5, 7, 15});
}

TEST_CASE("Linear gradients are x summed over the batch and the batch size") {
  // loss = sum(x W^T + b): d loss / d W[o][i] = sum_b x[b][i]; d loss / d b[o] = B.
  nn::Linear layer(2, 3, true, tp::kFloat64);
  const tp::Tensor x = tp::tensor({1, -1, 2, 0.5, 4, 3}, {3, 2}, tp::kFloat64);
  layer(x).sum().backward();
  const std::vector<double> per_row = {1 + 2 + 4, -1 + 0.5 + 3};
  CHECK(layer.weight.grad().to_vector() ==
        std::vector<double>{per_row[0], per_row[1], per_row[0], per_row[1], per_row[0],
                            per_row[1]});
  CHECK(layer.bias.grad().to_vector() == std::vector<double>{3, 3, 3});
}

TEST_CASE("Linear rejects input of the wrong width, rank or dtype") {
  nn::Linear layer(16, 4);
  CHECK_THROWS_WITH_AS(layer(tp::zeros({2, 5})),
                       Contains("tp::nn::Linear: input has 5 features, expected 16"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(layer(tp::zeros({16})), Contains("expected 2-D (batch, 16)"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(layer(tp::zeros({2, 16}, tp::kFloat64)),
                       Contains("input is float64 but the layer is float32"), tp::Error);
  CHECK_THROWS_WITH_AS(nn::Linear(0, 4), Contains("must both be >= 1"), tp::Error);
}

TEST_CASE("ReLU zeroes negatives and keeps the shape") {
  nn::ReLU relu;
  const tp::Tensor y = relu(tp::tensor({-1, 0, 2, -3, 4, 0.5}, {2, 3}, tp::kFloat64));
  CHECK(y.shape() == tp::Shape{2, 3});
  CHECK(y.to_vector() == std::vector<double>{0, 0, 2, 0, 4, 0.5});
  CHECK(relu.parameters().empty());
}

// ---- models and parameter order -----------------------------------------------

TEST_CASE("MiniMLP lists six parameters as torch names them, in registration order") {
  nn::MiniMLP model;  // in 16, hidden 32, out 4
  const auto named = model.named_parameters();
  CHECK(names_of(named) == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight",
                                                    "fc2.bias", "fc3.weight", "fc3.bias"});
  CHECK(named[0].second.shape() == tp::Shape{32, 16});
  CHECK(named[1].second.shape() == tp::Shape{32});
  CHECK(named[2].second.shape() == tp::Shape{32, 32});
  CHECK(named[3].second.shape() == tp::Shape{32});
  CHECK(named[4].second.shape() == tp::Shape{4, 32});
  CHECK(named[5].second.shape() == tp::Shape{4});
  CHECK(named[0].second.impl() == model.fc1->weight.impl());
  CHECK(model.parameters().size() == 6);
  CHECK(model.children().size() == 3);
  CHECK(model.buffers().empty());
}

TEST_CASE("MiniMLP forward is fc3(relu(fc2(relu(fc1(x)))))") {
  nn::MiniMLPOptions o;
  o.dtype = tp::kFloat64;
  nn::MiniMLP model(o);
  tp::Generator g(3);
  const tp::Tensor x = tp::randn({5, 16}, tp::kFloat64, &g);
  const tp::Tensor y = model(x);
  CHECK(y.shape() == tp::Shape{5, 4});
  const tp::Tensor expected = (*model.fc3)((*model.fc2)((*model.fc1)(x).relu()).relu());
  CHECK(tp::max_abs_diff(y, expected) == 0.0);  // same ops in the same order
}

TEST_CASE("the same seed builds the same MiniMLP and another seed a different one") {
  tp::manual_seed(5);
  nn::MiniMLP a;
  tp::manual_seed(5);
  nn::MiniMLP b;
  tp::manual_seed(6);
  nn::MiniMLP c;
  const auto pa = a.parameters(), pb = b.parameters(), pc = c.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CHECK(pa[i].to_vector() == pb[i].to_vector());
    CHECK(pa[i].to_vector() != pc[i].to_vector());
  }
}

TEST_CASE("deep_mlp has depth+1 Linears named by their Sequential index") {
  auto net = nn::deep_mlp(8, 16, 3, 2);
  // Linear, ReLU, Linear, ReLU, Linear, ReLU, Linear: 2*depth + 1 children.
  CHECK(net->size() == 7);
  CHECK(names_of(net->named_parameters()) ==
        std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight",
                                 "4.bias", "6.weight", "6.bias"});
  const auto params = net->parameters();
  CHECK(params.size() == 2 * (3 + 1));
  CHECK(params[0].shape() == tp::Shape{16, 8});
  CHECK(params[2].shape() == tp::Shape{16, 16});
  CHECK(params[6].shape() == tp::Shape{2, 16});
  CHECK((*net)(tp::zeros({3, 8})).shape() == tp::Shape{3, 2});

  auto shallow = nn::deep_mlp(8, 16, 1, 2);
  CHECK(names_of(shallow->named_parameters()) ==
        std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  CHECK_THROWS_WITH_AS(nn::deep_mlp(8, 16, 0, 2), Contains("depth must be >= 1, got 0"),
                       tp::Error);
}

TEST_CASE("nested Sequentials list parameters depth first with dotted prefixes") {
  auto inner = std::make_shared<nn::Sequential>();
  inner->push_back(std::make_shared<nn::ReLU>());
  inner->push_back(std::make_shared<nn::Linear>(4, 4));
  nn::Sequential outer;
  outer.push_back(std::make_shared<nn::Linear>(3, 4));
  outer.push_back(inner);
  outer.push_back(std::make_shared<nn::Linear>(4, 1));
  CHECK(names_of(outer.named_parameters()) ==
        std::vector<std::string>{"0.weight", "0.bias", "1.1.weight", "1.1.bias", "2.weight",
                                 "2.bias"});
  CHECK(outer(tp::zeros({2, 3})).shape() == tp::Shape{2, 1});
}

TEST_CASE("Sequential built from a list names its children 0, 1, 2 and runs them in order") {
  auto first = std::make_shared<nn::Linear>(2, 3, true, tp::kFloat64);
  auto relu = std::make_shared<nn::ReLU>();
  auto last = std::make_shared<nn::Linear>(3, 1, true, tp::kFloat64);
  set_values(first->weight, {1, 0,     //
                             0, 1,     //
                             -1, -1});  // (3, 2)
  set_values(first->bias, {0, 0, 0});
  set_values(last->weight, {1, 10, 100});
  set_values(last->bias, {0.5});
  auto net = std::make_shared<nn::Sequential>(
      std::vector<std::shared_ptr<nn::Module>>{first, relu, last});

  CHECK(net->size() == 3);
  REQUIRE(net->children().size() == 3);
  CHECK(net->children()[0].first == "0");
  CHECK(net->children()[0].second == first);
  CHECK(net->children()[1].first == "1");
  CHECK(net->children()[1].second == relu);
  CHECK(net->children()[2].first == "2");
  CHECK(net->children()[2].second == last);
  CHECK(names_of(net->named_parameters()) ==
        std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});

  // x = (2, -3): first gives (2, -3, 1), relu (2, 0, 1), last 2 + 0 + 100 + 0.5.
  // Any other order fails on shapes or gives another number.
  const tp::Tensor y = (*net)(tp::tensor({2, -3}, {1, 2}, tp::kFloat64));
  CHECK(y.to_vector() == std::vector<double>{102.5});

  // The list constructor and push_back build the same thing.
  nn::Sequential pushed;
  pushed.push_back(first);
  pushed.push_back(relu);
  pushed.push_back(last);
  CHECK(names_of(pushed.named_parameters()) == names_of(net->named_parameters()));

  CHECK(nn::Sequential(std::vector<std::shared_ptr<nn::Module>>{}).size() == 0);
  CHECK_THROWS_WITH_AS(nn::Sequential({first, nullptr}), Contains("submodule '1' is null"),
                       tp::Error);
}

// ---- BranchyMLP: a data-dependent route ---------------------------------------------

TEST_CASE("BranchyMLP lists ten parameters as torch names them, in registration order") {
  nn::BranchyMLP model({.in_features = 3, .hidden = 5, .out_features = 2});
  const auto named = model.named_parameters();
  CHECK(names_of(named) ==
        std::vector<std::string>{"fc1.weight", "fc1.bias", "branch_a.weight", "branch_a.bias",
                                 "branch_b.weight", "branch_b.bias", "head.weight",
                                 "head.bias", "spare.weight", "spare.bias"});
  const std::vector<tp::Shape> shapes = {{5, 3}, {5}, {5, 5}, {5}, {5, 5},
                                         {5},    {2, 5}, {2}, {2, 5}, {2}};
  REQUIRE(named.size() == shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) CHECK(named[i].second.shape() == shapes[i]);
  CHECK(named[4].second.impl() == model.branch_b->weight.impl());
  CHECK(named[8].second.impl() == model.spare->weight.impl());
  CHECK(model.buffers().empty());
}

TEST_CASE("BranchyMLP is initialised in registration order from the global generator") {
  tp::manual_seed(21);
  nn::BranchyMLP model({.in_features = 3, .hidden = 4, .out_features = 2});
  // Linear draws weight then bias; the modules draw in the order they are listed.
  tp::Generator g(21);
  for (const auto& [name, p] : model.named_parameters()) {
    CAPTURE(name);
    const double bound = 1.0 / std::sqrt(name.starts_with("fc1.") ? 3.0 : 4.0);
    CHECK(p.to_vector() ==
          tp::rand_uniform(p.shape(), -bound, bound, tp::kFloat32, &g).to_vector());
  }
}

TEST_CASE("BranchyMLP::route is A when column 0 sums to >= 0 over the rows, else B") {
  using Route = nn::BranchyMLP::Route;
  // Column 0 sums to 1 - 0.5 = 0.5; the other column is large and negative.
  CHECK(nn::BranchyMLP::route(tp::tensor({1, -50, -0.5, -50}, {2, 2})) == Route::A);
  // Column 0 sums to -1 + 0.5 = -0.5; the other column is large and positive.
  CHECK(nn::BranchyMLP::route(tp::tensor({-1, 50, 0.5, 50}, {2, 2})) == Route::B);
  // Exactly 0 counts as A.
  CHECK(nn::BranchyMLP::route(tp::tensor({1, -3, -1, -3}, {2, 2}, tp::kFloat64)) ==
        Route::A);
  // One row, one column, barely negative.
  CHECK(nn::BranchyMLP::route(tp::tensor({-1e-300}, {1, 1}, tp::kFloat64)) == Route::B);
  // It reads values, not storage: column 0 of the transposed view is (-2, -3),
  // while the storage's first column is (-2, 4).
  const tp::Tensor stored = tp::tensor({-2, -3,  //
                                        4, 5},   //
                                       {2, 2});
  CHECK(nn::BranchyMLP::route(stored) == Route::A);
  CHECK(nn::BranchyMLP::route(stored.t()) == Route::B);

  // It records no autograd history and leaves x alone.
  tp::Tensor x = tp::tensor({-1, 2}, {1, 2}, tp::kFloat64).requires_grad_();
  CHECK(nn::BranchyMLP::route(x) == Route::B);
  CHECK_FALSE(x.grad().defined());
  CHECK(x.to_vector() == std::vector<double>{-1, 2});

  CHECK_THROWS_WITH_AS(nn::BranchyMLP::route(tp::zeros({4})),
                       Contains("tp::nn::BranchyMLP::route: expected a 2-D input"), tp::Error);
}

TEST_CASE("BranchyMLP forward is head(relu(branch(relu(fc1(x))))) with the routed branch") {
  nn::BranchyMLP model(float64_options(3, 4, 2));
  const tp::Tensor xa = tp::tensor({0.5, -1, 2,        //
                                    1.0, 0.3, -0.7},   //
                                   {2, 3}, tp::kFloat64);  // column 0 sums to 1.5
  const tp::Tensor xb = tp::tensor({-0.5, -1, 2,       //
                                    -1.0, 0.3, -0.7},  //
                                   {2, 3}, tp::kFloat64);  // column 0 sums to -1.5
  REQUIRE(nn::BranchyMLP::route(xa) == nn::BranchyMLP::Route::A);
  REQUIRE(nn::BranchyMLP::route(xb) == nn::BranchyMLP::Route::B);

  const tp::Tensor ya = model(xa);
  CHECK(ya.shape() == tp::Shape{2, 2});
  const tp::Tensor expected_a =
      (*model.head)((*model.branch_a)((*model.fc1)(xa).relu()).relu());
  CHECK(tp::max_abs_diff(ya, expected_a) == 0.0);  // same ops in the same order

  const tp::Tensor yb = model(xb);
  const tp::Tensor expected_b =
      (*model.head)((*model.branch_b)((*model.fc1)(xb).relu()).relu());
  CHECK(tp::max_abs_diff(yb, expected_b) == 0.0);
  // And the route matters: xb sent through branch_a gives something else.
  const tp::Tensor xb_through_a =
      (*model.head)((*model.branch_a)((*model.fc1)(xb).relu()).relu());
  CHECK(tp::max_abs_diff(yb, xb_through_a) > 0.0);
}

TEST_CASE("BranchyMLP gives gradients to fc1, head and the taken branch only") {
  nn::BranchyMLP model(float64_options(3, 4, 2));
  const tp::Tensor xa = tp::tensor({2, 1, -1, 1, 0.5, 0.25}, {2, 3}, tp::kFloat64);
  const tp::Tensor xb = tp::tensor({-2, 1, -1, 1, 0.5, 0.25}, {2, 3}, tp::kFloat64);

  model(xa).sum().backward();
  CHECK(names_with_grad(model) == std::vector<std::string>{"fc1.weight", "fc1.bias",
                                                           "branch_a.weight", "branch_a.bias",
                                                           "head.weight", "head.bias"});
  model.zero_grad();
  model(xb).sum().backward();
  CHECK(names_with_grad(model) == std::vector<std::string>{"fc1.weight", "fc1.bias",
                                                           "branch_b.weight", "branch_b.bias",
                                                           "head.weight", "head.bias"});
  // Two micro-batches accumulated without zero_grad (what no_sync does): the
  // union of both routes, and still nothing for spare.
  model(xa).sum().backward();
  CHECK(names_with_grad(model) ==
        std::vector<std::string>{"fc1.weight", "fc1.bias", "branch_a.weight", "branch_a.bias",
                                 "branch_b.weight", "branch_b.bias", "head.weight",
                                 "head.bias"});
  CHECK_FALSE(model.spare->weight.grad().defined());
  CHECK_FALSE(model.spare->bias.grad().defined());
}

TEST_CASE("BranchyMLP gradients match finite differences on both routes") {
  // The route depends on x only, so perturbing a parameter cannot switch it:
  // L is smooth in every parameter away from the ReLU kinks.
  tp::manual_seed(4);
  nn::BranchyMLP model(float64_options(3, 4, 2));
  const tp::Tensor xa = tp::tensor({0.9, -0.4, 0.3,   //
                                    -0.2, 0.8, -0.6,  //
                                    0.5, 0.1, 0.7},   //
                                   {3, 3}, tp::kFloat64);  // column 0 sums to 1.2
  const tp::Tensor xb = tp::tensor({-0.9, -0.4, 0.3,  //
                                    0.2, 0.8, -0.6,   //
                                    -0.5, 0.1, 0.7},  //
                                   {3, 3}, tp::kFloat64);  // column 0 sums to -1.2
  SUBCASE("route A") {
    REQUIRE(nn::BranchyMLP::route(xa) == nn::BranchyMLP::Route::A);
    check_grads_by_finite_differences([&] { return model(xa); }, model.parameters());
    CHECK(model.branch_a->weight.grad().defined());
    CHECK_FALSE(model.branch_b->weight.grad().defined());
  }
  SUBCASE("route B") {
    REQUIRE(nn::BranchyMLP::route(xb) == nn::BranchyMLP::Route::B);
    check_grads_by_finite_differences([&] { return model(xb); }, model.parameters());
    CHECK(model.branch_b->weight.grad().defined());
    CHECK_FALSE(model.branch_a->weight.grad().defined());
  }
  CHECK_FALSE(model.spare->weight.grad().defined());
}

// ---- RunningMean: a buffer updated in forward -----------------------------------------

TEST_CASE("RunningMean subtracts the old running mean, then updates it as an EMA") {
  // momentum 0.25 keeps every value below exact in binary, so the checks are ==.
  nn::RunningMean norm(2, /*momentum=*/0.25, tp::kFloat64);
  CHECK(norm.features() == 2);
  CHECK(norm.momentum() == 0.25);
  set_values(norm.running_mean, {1, -2});

  // Step 1: x = [[3, 0], [5, 4]]; y = x - (1, -2) = [[2, 2], [4, 6]].
  // Row mean (4, 2); running_mean = 0.75 (1, -2) + 0.25 (4, 2) = (1.75, -1).
  const tp::Tensor y1 = norm(tp::tensor({3, 0, 5, 4}, {2, 2}, tp::kFloat64));
  CHECK(y1.shape() == tp::Shape{2, 2});
  CHECK(y1.to_vector() == std::vector<double>{2, 2, 4, 6});
  CHECK(norm.running_mean.to_vector() == std::vector<double>{1.75, -1});

  // Step 2: x = [[0, 0], [2, -2]]; y = x - (1.75, -1) = [[-1.75, 1], [0.25, -1]].
  // Row mean (1, -1); running_mean = 0.75 (1.75, -1) + 0.25 (1, -1) = (1.5625, -1).
  const tp::Tensor y2 = norm(tp::tensor({0, 0, 2, -2}, {2, 2}, tp::kFloat64));
  CHECK(y2.to_vector() == std::vector<double>{-1.75, 1, 0.25, -1});
  CHECK(norm.running_mean.to_vector() == std::vector<double>{1.5625, -1});
  // The first output kept its values: it does not alias the buffer.
  CHECK(y1.to_vector() == std::vector<double>{2, 2, 4, 6});

  // The listed buffer is the member itself, updated in place.
  REQUIRE(norm.buffers().size() == 1);
  CHECK(norm.buffers()[0].impl() == norm.running_mean.impl());
  CHECK(names_of(norm.named_buffers()) == std::vector<std::string>{"running_mean"});
  CHECK(norm.parameters().empty());
  CHECK(nn::RunningMean(3).momentum() == 0.1);  // the default, as in BatchNorm
}

TEST_CASE("RunningMean in eval mode uses the buffer but does not update it") {
  nn::RunningMean norm(2, 0.25, tp::kFloat64);
  set_values(norm.running_mean, {1, -2});
  norm.eval();
  const tp::Tensor y = norm(tp::tensor({3, 0, 5, 4}, {2, 2}, tp::kFloat64));
  CHECK(y.to_vector() == std::vector<double>{2, 2, 4, 6});
  CHECK(norm.running_mean.to_vector() == std::vector<double>{1, -2});

  norm.train();  // and back in training mode it updates again
  norm(tp::tensor({3, 0, 5, 4}, {2, 2}, tp::kFloat64));
  CHECK(norm.running_mean.to_vector() == std::vector<double>{1.75, -1});
}

TEST_CASE("RunningMean's gradient w.r.t. the input is the identity; the buffer gets none") {
  nn::RunningMean norm(3, 0.1, tp::kFloat64);
  tp::Tensor x = tp::tensor({0.5, -1, 2, 3, 0.25, -4}, {2, 3}, tp::kFloat64).requires_grad_();
  const tp::Tensor w = tp::tensor({1, 2, 3, 4, 5, 6}, {2, 3}, tp::kFloat64);
  // L = sum(y * w) with y = x - running_mean: dL/dx = w, in training mode too
  // (the update records no history).
  tp::sum(tp::mul(norm(x), w)).backward();
  CHECK(x.grad().to_vector() == w.to_vector());
  CHECK_FALSE(norm.running_mean.requires_grad());
  CHECK(norm.running_mean.is_leaf());
  CHECK_FALSE(norm.running_mean.grad().defined());

  // The same by finite differences, in eval mode so that f is pure.
  norm.eval();
  check_grads_by_finite_differences([&] { return norm(x); }, {x});
}

TEST_CASE("RunningMean's initial buffer is 0.1 * randn from the global generator") {
  tp::manual_seed(11);
  nn::RunningMean a(4, 0.1, tp::kFloat64);
  tp::manual_seed(12);
  nn::RunningMean b(4, 0.1, tp::kFloat64);
  tp::manual_seed(11);
  nn::RunningMean c(4, 0.1, tp::kFloat64);
  // Different seeds (as on DDP's ranks) give different buffers; the same seed
  // gives the same one.
  CHECK(a.running_mean.to_vector() != b.running_mean.to_vector());
  CHECK(a.running_mean.to_vector() == c.running_mean.to_vector());

  tp::Generator g(11);
  CHECK(a.running_mean.to_vector() == tp::randn({4}, tp::kFloat64, &g).mul_(0.1).to_vector());
  CHECK(a.running_mean.shape() == tp::Shape{4});
  CHECK(a.running_mean.dtype() == tp::kFloat64);
}

TEST_CASE("RunningMean rejects bad sizes, momenta and inputs") {
  CHECK_THROWS_WITH_AS(nn::RunningMean(0), Contains("features must be >= 1, got 0"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(nn::RunningMean(2, 1.5),
                       Contains("momentum must be in [0, 1], got 1.5"), tp::Error);
  nn::RunningMean norm(3);
  CHECK_THROWS_WITH_AS(norm(tp::zeros({2, 4})),
                       Contains("input has shape (2, 4), expected (batch, 3)"), tp::Error);
  CHECK_THROWS_WITH_AS(norm(tp::zeros({2, 3}, tp::kFloat64)),
                       Contains("input is float64 but the buffer is float32"), tp::Error);
  const std::vector<double> before = norm.running_mean.to_vector();
  CHECK_THROWS_WITH_AS(norm(tp::zeros({0, 3})), Contains("the batch is empty"), tp::Error);
  CHECK(norm.running_mean.to_vector() == before);
}

// ---- BufferedMLP ----------------------------------------------------------------------

TEST_CASE("BufferedMLP lists six parameters and one buffer, norm.running_mean") {
  nn::BufferedMLP model({.in_features = 3, .hidden = 5, .out_features = 2});
  const auto named = model.named_parameters();
  CHECK(names_of(named) == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight",
                                                    "fc2.bias", "fc3.weight", "fc3.bias"});
  const std::vector<tp::Shape> shapes = {{5, 3}, {5}, {5, 5}, {5}, {2, 5}, {2}};
  REQUIRE(named.size() == shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) CHECK(named[i].second.shape() == shapes[i]);

  const auto buffers = model.named_buffers();
  CHECK(names_of(buffers) == std::vector<std::string>{"norm.running_mean"});
  REQUIRE(buffers.size() == 1);
  CHECK(buffers[0].second.shape() == tp::Shape{5});
  CHECK(buffers[0].second.impl() == model.norm->running_mean.impl());
  CHECK_FALSE(buffers[0].second.requires_grad());
  CHECK(model.norm->momentum() == 0.1);
  REQUIRE(model.children().size() == 4);
  CHECK(model.children()[1].first == "norm");
}

TEST_CASE("BufferedMLP draws fc1, then norm's buffer, then fc2 and fc3") {
  tp::manual_seed(8);
  nn::BufferedMLP model(float64_options(3, 4, 2));
  tp::Generator g(8);
  const double b3 = 1.0 / std::sqrt(3.0), b4 = 1.0 / std::sqrt(4.0);
  CHECK(model.fc1->weight.to_vector() ==
        tp::rand_uniform({4, 3}, -b3, b3, tp::kFloat64, &g).to_vector());
  CHECK(model.fc1->bias.to_vector() ==
        tp::rand_uniform({4}, -b3, b3, tp::kFloat64, &g).to_vector());
  CHECK(model.norm->running_mean.to_vector() ==
        tp::randn({4}, tp::kFloat64, &g).mul_(0.1).to_vector());
  CHECK(model.fc2->weight.to_vector() ==
        tp::rand_uniform({4, 4}, -b4, b4, tp::kFloat64, &g).to_vector());
}

TEST_CASE("BufferedMLP forward is fc3(relu(fc2(relu(norm(fc1(x)))))) and updates the buffer") {
  nn::BufferedMLP model(float64_options(3, 4, 2));
  const tp::Tensor x =
      tp::tensor({0.5, -1, 2, 1.0, 0.3, -0.7, -0.2, 0.4, 0.9}, {3, 3}, tp::kFloat64);
  const std::vector<double> before = model.norm->running_mean.to_vector();

  const tp::Tensor y = model(x);  // training mode: the buffer moves
  CHECK(y.shape() == tp::Shape{3, 2});

  // The buffer: 0.9 * before + 0.1 * (row mean of fc1(x)).
  const std::vector<double> h = (*model.fc1)(x).to_vector();  // (3, 4)
  const std::vector<double> after = model.norm->running_mean.to_vector();
  for (std::size_t j = 0; j < 4; ++j) {
    CAPTURE(j);
    const double row_mean = (h[j] + h[4 + j] + h[8 + j]) / 3.0;
    CHECK(after[j] == Approx(0.9 * before[j] + 0.1 * row_mean).epsilon(1e-15));
    CHECK(after[j] != before[j]);
  }

  // The output: the hand composition with the buffer as it was before, in
  // eval mode so that it is not updated once more.
  set_values(model.norm->running_mean, before);
  model.eval();
  const tp::Tensor expected =
      (*model.fc3)((*model.fc2)((*model.norm)((*model.fc1)(x)).relu()).relu());
  CHECK(tp::max_abs_diff(y, expected) == 0.0);  // same ops in the same order
  CHECK(model.norm->running_mean.to_vector() == before);
}

TEST_CASE("BufferedMLP gradients match finite differences in eval mode") {
  tp::manual_seed(6);
  nn::BufferedMLP model(float64_options(3, 4, 2));
  model.eval();  // a pure function of the parameters for the differences
  const tp::Tensor x = tp::tensor({0.9, -0.4, 0.3, -0.2, 0.8, -0.6}, {2, 3}, tp::kFloat64);
  check_grads_by_finite_differences([&] { return model(x); }, model.parameters());
  for (const auto& p : model.parameters()) CHECK(p.grad().defined());
  CHECK_FALSE(model.norm->running_mean.grad().defined());
}

TEST_CASE("buffers are listed apart from parameters, with dotted names") {
  auto outer = std::make_shared<WithBuffers>();
  outer->add("inner", std::make_shared<WithBuffers>());
  CHECK(names_of(outer->named_buffers()) ==
        std::vector<std::string>{"running_mean", "inner.running_mean"});
  CHECK(names_of(outer->named_parameters()) ==
        std::vector<std::string>{"scale", "head.weight", "head.bias", "inner.scale",
                                 "inner.head.weight", "inner.head.bias"});
  CHECK(outer->buffers().size() == 2);
  CHECK(outer->buffers()[0].impl() == outer->running_mean.impl());
  CHECK_FALSE(outer->running_mean.requires_grad());
}

TEST_CASE("registering a duplicate, dotted, undefined or non-leaf name is an error") {
  WithBuffers m;
  CHECK_THROWS_WITH_AS(m.register_parameter("scale", tp::ones({1})),
                       Contains("already has a parameter or buffer named 'scale'"), tp::Error);
  CHECK_THROWS_WITH_AS(m.register_buffer("scale", tp::ones({1})),
                       Contains("already has a parameter or buffer named 'scale'"), tp::Error);
  CHECK_THROWS_WITH_AS(m.register_parameter("running_mean", tp::ones({1})),
                       Contains("named 'running_mean'"), tp::Error);
  CHECK_THROWS_WITH_AS(m.add("head", std::make_shared<nn::ReLU>()),
                       Contains("already has a submodule named 'head'"), tp::Error);
  CHECK_THROWS_WITH_AS(m.register_parameter("a.b", tp::ones({1})), Contains("contains '.'"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(m.register_parameter("none", tp::Tensor()),
                       Contains("undefined tensor"), tp::Error);
  tp::Tensor leaf = param({1.0});
  CHECK_THROWS_WITH_AS(m.register_parameter("computed", leaf * 2.0),
                       Contains("has a grad_fn"), tp::Error);
  CHECK(m.parameters().size() == 3);  // nothing was added by the failed calls
}

TEST_CASE("train and eval reach every submodule") {
  nn::MiniMLP model;
  CHECK(model.is_training());
  model.eval();
  CHECK_FALSE(model.is_training());
  CHECK_FALSE(model.fc2->is_training());
  model.train();
  CHECK(model.fc3->is_training());
}

TEST_CASE("zero_grad clears grads by default and zeroes them in place on request") {
  nn::MiniMLP model;
  const tp::Tensor x = tp::ones({2, 16});
  model(x).sum().backward();
  for (const auto& p : model.parameters()) CHECK(p.grad().defined());

  model.zero_grad();  // set_to_none = true, PyTorch's default
  for (const auto& p : model.parameters()) CHECK_FALSE(p.grad().defined());

  model(x).sum().backward();
  const tp::Tensor g = model.fc3->bias.grad();  // a handle to the gradient
  CHECK(g.to_vector() == std::vector<double>{2, 2, 2, 2});  // d sum / d bias = batch size
  model.zero_grad(/*set_to_none=*/false);
  CHECK(model.fc3->bias.grad().defined());
  CHECK(model.fc3->bias.grad().impl() == g.impl());  // same tensor, zeroed in place
  CHECK(g.to_vector() == std::vector<double>{0, 0, 0, 0});
}

// ---- SGD ------------------------------------------------------------------------

TEST_CASE("SGD without momentum follows p_k = (1 - 2 lr)^k p_0 on sum(p^2)") {
  // loss = sum(p^2) has grad 2p, so p <- p - lr * 2p = (1 - 2 lr) p each step.
  tp::Tensor p = param({1.0, -2.0});
  tp::optim::SGD opt({p}, {.lr = 0.1});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    p.square().sum().backward();
    opt.step();
  }
  const double f = std::pow(0.8, 3);  // 0.512
  const auto v = p.to_vector();
  CHECK(v[0] == Approx(f * 1.0).epsilon(1e-14));
  CHECK(v[1] == Approx(f * -2.0).epsilon(1e-14));
  // The step left p a leaf: it recorded no autograd history.
  CHECK(p.is_leaf());
  CHECK(p.requires_grad());
}

TEST_CASE("SGD with momentum accumulates buf = m buf + g on a constant gradient") {
  // loss = sum(c * p) has the constant grad c. With buf_0 = c and
  // buf_k = m buf_{k-1} + c, buf_k = c (1 + m + ... + m^k), so after 3 steps
  //   p_3 = p_0 - lr c [1 + (1 + m) + (1 + m + m^2)].
  const double lr = 0.05, m = 0.9;
  const tp::Tensor c = tp::tensor({3.0, -1.0}, {2}, tp::kFloat64);
  tp::Tensor p = param({0.5, 0.25});
  tp::optim::SGD opt({p}, {.lr = lr, .momentum = m});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    (p * c).sum().backward();
    opt.step();
  }
  const double factor = 1 + (1 + m) + (1 + m + m * m);  // 5.71
  const auto v = p.to_vector();
  CHECK(v[0] == Approx(0.5 - lr * 3.0 * factor).epsilon(1e-14));
  CHECK(v[1] == Approx(0.25 - lr * -1.0 * factor).epsilon(1e-14));
}

TEST_CASE("SGD with momentum matches the update rule on sum(p^2) step by step") {
  // Here the gradient changes with p, so compare with the rule of sgd.h
  // evaluated on plain doubles.
  const double lr = 0.1, m = 0.5;
  tp::Tensor p = param({1.0});
  tp::optim::SGD opt({p}, {.lr = lr, .momentum = m});
  double x = 1.0, buf = 0.0;
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    p.square().sum().backward();
    opt.step();
    const double g = 2 * x;
    buf = step == 0 ? g : m * buf + g;
    x -= lr * buf;
    CHECK(p.item() == Approx(x).epsilon(1e-14));
  }
  CHECK(x < 0.5);  // and it really moved toward the minimum at 0
}

TEST_CASE("SGD skips parameters without a gradient and starts their momentum late") {
  tp::Tensor used = param({1.0});
  tp::Tensor unused = param({5.0});
  tp::optim::SGD opt({used, unused}, {.lr = 0.1, .momentum = 0.9});
  used.square().sum().backward();  // unused gets no gradient
  opt.step();
  CHECK_FALSE(unused.grad().defined());
  CHECK(unused.item() == 5.0);
  CHECK(used.item() == Approx(1.0 - 0.1 * 2.0));

  // Its first gradient starts its momentum buffer as buf = grad (no stale state).
  opt.zero_grad();
  unused.square().sum().backward();  // grad 10
  opt.step();
  CHECK(unused.item() == Approx(5.0 - 0.1 * 10.0));
  CHECK(used.item() == Approx(0.8));  // no grad this time: untouched
}

TEST_CASE("SGD zero_grad clears or zeroes its parameters' grads") {
  tp::Tensor p = param({1.0, 2.0});
  tp::optim::SGD opt({p}, {.lr = 0.1});
  p.square().sum().backward();
  opt.zero_grad(/*set_to_none=*/false);
  CHECK(p.grad().to_vector() == std::vector<double>{0, 0});
  opt.zero_grad();
  CHECK_FALSE(p.grad().defined());
}

TEST_CASE("SGD rejects bad options and parameters") {
  tp::Tensor p = param({1.0});
  CHECK_THROWS_WITH_AS(tp::optim::SGD({p}, {.lr = 0.0}), Contains("lr must be > 0, got 0"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(tp::optim::SGD({p}, {.lr = -1.0}), Contains("lr must be > 0, got -1"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(tp::optim::SGD({p}, {.lr = 0.1, .momentum = -0.5}),
                       Contains("momentum must be >= 0, got -0.5"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::optim::SGD({}, {.lr = 0.1}), Contains("empty parameter list"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(tp::optim::SGD({p * 2.0}, {.lr = 0.1}),
                       Contains("parameter 0 is not a leaf that requires grad"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::optim::SGD({p, tp::ones({1})}, {.lr = 0.1}),
                       Contains("parameter 1 is not a leaf that requires grad"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::optim::SGD({tp::Tensor()}, {.lr = 0.1}),
                       Contains("parameter 0 is an undefined tensor"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::optim::SGD({p, param({2.0}), p}, {.lr = 0.1}),
                       Contains("parameter 2 is the same tensor as parameter 0; pass each "
                                "parameter once"),
                       tp::Error);
}

TEST_CASE("ReorderedMLP registers fc2, fc1, fc3 but computes fc3(relu(fc2(relu(fc1(x)))))") {
  tp::manual_seed(5);
  nn::ReorderedMLP model(float64_options(3, 4, 2));
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"fc2.weight", "fc2.bias", "fc1.weight", "fc1.bias",
                                          "fc3.weight", "fc3.bias"});
  CHECK(model.fc1->weight.shape() == tp::Shape{4, 3});
  CHECK(model.fc2->weight.shape() == tp::Shape{4, 4});
  const tp::Tensor x = tp::randn({5, 3}, tp::kFloat64);
  const tp::Tensor expected =
      (*model.fc3)(tp::relu((*model.fc2)(tp::relu((*model.fc1)(x)))));
  CHECK(tp::max_abs_diff(model(x), expected) == 0.0);
  // Gradients become ready in the order of use reversed: fc3, fc2, fc1.
  std::vector<std::string> ready;
  std::vector<tp::RemovableHandle> handles;
  for (const auto& [name, p] : model.named_parameters()) {
    handles.push_back(p.register_post_accumulate_grad_hook(
        [&ready, name = name](const tp::Tensor&) { ready.push_back(name); }));
  }
  tp::sum(model(x)).backward();
  CHECK(ready == std::vector<std::string>{"fc3.bias", "fc3.weight", "fc2.bias", "fc2.weight",
                                          "fc1.bias", "fc1.weight"});
}

TEST_CASE("forward hooks run around a submodule's forward, may replace its output, and go with their handle") {
  tp::manual_seed(0);
  tp::nn::MiniMLP model;
  std::vector<std::string> calls;
  tp::nn::ModuleHookHandle pre = model.fc2->register_forward_pre_hook(
      [&](tp::nn::Module&, const tp::Tensor& x) { calls.push_back("pre " + std::to_string(x.size(1))); });
  tp::nn::ModuleHookHandle post = model.fc2->register_forward_hook(
      [&](tp::nn::Module&, const tp::Tensor&, const tp::Tensor& y) {
        calls.push_back("post");
        return tp::mul(y, 0.0);  // replaces fc2's output
      });
  const tp::Tensor x = tp::randn({2, 16});
  const tp::Tensor hooked = model(x);
  CHECK(calls == std::vector<std::string>{"pre 32", "post"});
  // fc2's output zeroed: the model's output is fc3's bias on every row.
  const std::vector<double> bias = model.fc3->bias.to_vector();
  const std::vector<double> out = hooked.to_vector();
  for (size_t i = 0; i < out.size(); ++i) CHECK(out[i] == doctest::Approx(bias[i % bias.size()]));
  pre.remove();
  post = tp::nn::ModuleHookHandle();  // move-assigning removes the hook it held
  calls.clear();
  const tp::Tensor plain = model(x);
  CHECK(calls.empty());
  CHECK(plain.to_vector() != out);
}
