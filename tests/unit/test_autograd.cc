// Autograd: every backward rule against float64 central finite differences,
// gradient accumulation, grad mode, and the hooks DDP builds on
// (post-accumulate-grad hooks and queue_callback).

#include <doctest/doctest.h>

#include "test_util.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensorplay/autograd/engine.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/autograd/node.h"
#include "tensorplay/ops.h"
#include "tensorplay/trace.h"

using doctest::Contains;
using tp::Tensor;
using Values = std::vector<double>;

namespace {

// n deterministic values in [-1, 1) from a small LCG, so the tests need
// nothing but the code under test.
Values pseudo_random(std::size_t n, uint32_t seed) {
  Values values(n);
  uint32_t state = seed * 2654435761u + 1;
  for (double& v : values) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<double>(state >> 8) / static_cast<double>(1u << 24) * 2.0 - 1.0;
  }
  return values;
}

// A float64 leaf that requires grad, filled with pseudo-random values.
Tensor leaf(const tp::Shape& shape, uint32_t seed) {
  return tp::tensor(pseudo_random(static_cast<std::size_t>(tp::numel_of(shape)), seed),
                    shape, tp::kFloat64)
      .requires_grad_();
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Checks the gradient of every input that requires grad against central
// finite differences, element by element.
//
// The output of f may have any shape: it is reduced to the scalar
// L = sum(f(inputs) * w) with a fixed pseudo-random w, so a rule that sends
// an output element's gradient to the wrong place changes dL/dx.
//
// Tolerance: with eps = 1e-6 in float64, the central difference has
// truncation error ~eps^2 * |L'''| ~ 1e-12 and rounding error
// ~1e-16 * |L| / eps ~ 1e-10 for the O(1) values here, so agreement to
// 1e-6 (relative, with an absolute floor of 1e-6) leaves a wide margin
// while any wrong rule (off by a factor, a sign or a transpose) is off by O(1).
void gradcheck(const Fn& f, std::vector<Tensor> inputs) {
  constexpr double kEps = 1e-6;
  for (Tensor& x : inputs) x.set_grad(Tensor());

  Tensor out = f(inputs);
  REQUIRE(out.requires_grad());
  const Tensor w = tp::tensor(pseudo_random(static_cast<std::size_t>(out.numel()), 99),
                              out.shape(), tp::kFloat64);
  tp::sum(tp::mul(out, w)).backward();

  auto objective = [&] {
    tp::NoGradGuard no_grad;
    return tp::sum(tp::mul(f(inputs), w)).item();
  };
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Tensor& x = inputs[i];
    if (!x.requires_grad()) continue;
    CAPTURE(i);
    REQUIRE(x.grad().defined());
    REQUIRE(x.grad().shape() == x.shape());
    const Values analytic = x.grad().to_vector();
    double* data = x.data_ptr<double>();  // a contiguous leaf: element j is data[j]
    for (int64_t j = 0; j < x.numel(); ++j) {
      CAPTURE(j);
      const double numeric = test_util::central_difference(data, j, objective, kEps);
      CHECK(analytic[static_cast<std::size_t>(j)] == doctest::Approx(numeric).epsilon(1e-6));
    }
  }
}

}  // namespace

// ---- every backward rule against finite differences ---------------------------------

TEST_CASE("matmul's gradient matches finite differences") {
  gradcheck([](const auto& in) { return tp::matmul(in[0], in[1]); },
            {leaf({3, 4}, 1), leaf({4, 2}, 2)});
}

TEST_CASE("matmul's gradient matches finite differences for transposed inputs") {
  // a.t() is (3, 4) and b.t() is (4, 2): BLAS reads both through flags, and
  // the gradients flow back through TBackward.
  gradcheck([](const auto& in) { return tp::matmul(in[0].t(), in[1].t()); },
            {leaf({4, 3}, 3), leaf({2, 4}, 4)});
}

TEST_CASE("a linear layer's gradients match finite differences") {
  // y = x W^T + b, the nn::Linear formula; x needs no gradient.
  Tensor x = tp::tensor(pseudo_random(12, 5), {4, 3}, tp::kFloat64);
  gradcheck([x](const auto& in) { return tp::add(tp::matmul(x, in[0].t()), in[1]); },
            {leaf({2, 3}, 6), leaf({2}, 7)});
}

TEST_CASE("add's gradient matches finite differences") {
  gradcheck([](const auto& in) { return tp::add(in[0], in[1]); },
            {leaf({2, 3}, 8), leaf({2, 3}, 9)});
}

TEST_CASE("add's gradient matches finite differences with bias broadcast") {
  gradcheck([](const auto& in) { return tp::add(in[0], in[1]); },
            {leaf({4, 3}, 10), leaf({3}, 11)});
}

TEST_CASE("sub's gradient matches finite differences") {
  gradcheck([](const auto& in) { return tp::sub(in[0], in[1]); },
            {leaf({3, 2}, 12), leaf({3, 2}, 13)});
}

TEST_CASE("mul's gradient matches finite differences") {
  gradcheck([](const auto& in) { return tp::mul(in[0], in[1]); },
            {leaf({2, 3}, 14), leaf({2, 3}, 15)});
}

TEST_CASE("mul by a scalar has a gradient matching finite differences") {
  gradcheck([](const auto& in) { return tp::mul(in[0], -2.5); }, {leaf({5}, 16)});
}

TEST_CASE("div by a scalar has a gradient matching finite differences") {
  gradcheck([](const auto& in) { return tp::div(in[0], 4.0); }, {leaf({2, 2}, 17)});
}

TEST_CASE("relu's gradient matches finite differences away from 0") {
  // Values at least 0.1 from the kink, so x +- eps stays on one side.
  Tensor x = tp::tensor({-1.0, 0.5, -0.2, 0.3, 2.0, -0.7}, {2, 3}, tp::kFloat64).requires_grad_();
  gradcheck([](const auto& in) { return tp::relu(in[0]); }, {x});
}

TEST_CASE("square's gradient matches finite differences") {
  gradcheck([](const auto& in) { return tp::square(in[0]); }, {leaf({3, 3}, 18)});
}

TEST_CASE("sum's gradient matches finite differences") {
  gradcheck([](const auto& in) { return tp::sum(in[0]); }, {leaf({3, 4}, 19)});
}

TEST_CASE("sum over a dim has a gradient matching finite differences") {
  gradcheck([](const auto& in) { return tp::sum(in[0], 0); }, {leaf({3, 4}, 20)});
  gradcheck([](const auto& in) { return tp::sum(in[0], 1); }, {leaf({3, 4}, 21)});
}

TEST_CASE("mean's gradient matches finite differences") {
  gradcheck([](const auto& in) { return tp::mean(in[0]); }, {leaf({2, 5}, 22)});
}

TEST_CASE("mse_loss's gradient matches finite differences for pred and target") {
  gradcheck([](const auto& in) { return tp::mse_loss(in[0], in[1]); },
            {leaf({4, 2}, 23), leaf({4, 2}, 24)});
}

TEST_CASE("view's and flatten's gradients match finite differences") {
  Tensor b = tp::tensor(pseudo_random(12, 25), {6, 2}, tp::kFloat64);
  gradcheck([b](const auto& in) { return tp::matmul(in[0].view({2, 6}), b); },
            {leaf({3, 4}, 26)});
  gradcheck([](const auto& in) { return tp::square(in[0].flatten()); }, {leaf({2, 3}, 27)});
}

TEST_CASE("narrow's gradient matches finite differences") {
  gradcheck([](const auto& in) { return in[0].narrow(1, 1, 2); }, {leaf({3, 4}, 28)});
  gradcheck([](const auto& in) { return tp::square(in[0].narrow(0, 2, 1)); },
            {leaf({3, 4}, 29)});
}

TEST_CASE("t's gradient matches finite differences") {
  gradcheck([](const auto& in) { return in[0].t(); }, {leaf({2, 3}, 30)});
}

TEST_CASE("contiguous's and clone's gradients match finite differences") {
  gradcheck([](const auto& in) { return in[0].t().contiguous(); }, {leaf({2, 3}, 31)});
  gradcheck([](const auto& in) { return in[0].clone(); }, {leaf({2, 3}, 32)});
}

TEST_CASE("a two-layer MLP's gradients match finite differences") {
  Tensor x = tp::tensor(pseudo_random(12, 33), {4, 3}, tp::kFloat64);
  Tensor target = tp::tensor(pseudo_random(8, 34), {4, 2}, tp::kFloat64);
  gradcheck(
      [x, target](const auto& in) {
        Tensor h = tp::relu(tp::add(tp::matmul(x, in[0].t()), in[1]));
        return tp::mse_loss(tp::add(tp::matmul(h, in[2].t()), in[3]), target);
      },
      {leaf({5, 3}, 35), leaf({5}, 36), leaf({2, 5}, 37), leaf({2}, 38)});
}

TEST_CASE("a tensor used twice gets the sum of both gradients") {
  gradcheck([](const auto& in) { return tp::mul(in[0], in[0]); }, {leaf({4}, 39)});
  Tensor x = tp::ones({3}, tp::kFloat64).requires_grad_();
  tp::sum(tp::add(x, x)).backward();
  CHECK(x.grad().to_vector() == Values{2, 2, 2});
}

// ---- accumulation and the grad field -------------------------------------------------

TEST_CASE("gradients accumulate across two backward calls") {
  Tensor w = tp::tensor({1, 2, 3}, {3}, tp::kFloat64).requires_grad_();
  tp::sum(tp::mul(w, 2.0)).backward();
  CHECK(w.grad().to_vector() == Values{2, 2, 2});
  Tensor loss = tp::sum(tp::square(w));  // d/dw = 2w
  loss.backward();
  CHECK(w.grad().to_vector() == Values{4, 6, 8});
  loss.backward();  // the graph can be run again
  CHECK(w.grad().to_vector() == Values{6, 10, 14});
}

TEST_CASE("set_grad with an undefined tensor zeroes the grad for the next backward") {
  Tensor w = tp::ones({2}).requires_grad_();
  tp::sum(tp::mul(w, 3.0)).backward();
  w.set_grad(Tensor());  // what zero_grad(set_to_none = true) does
  CHECK_FALSE(w.grad().defined());
  tp::sum(tp::mul(w, 3.0)).backward();
  CHECK(w.grad().to_vector() == Values{3, 3});
}

TEST_CASE("the first gradient is a private contiguous copy") {
  Tensor a = tp::ones({2, 3}).requires_grad_();
  Tensor b = tp::ones({2, 3}).requires_grad_();
  Tensor g = tp::full({2, 3}, 5.0);
  tp::add(a, b).backward(g);  // add's rule hands the same gradient to both
  CHECK_FALSE(a.grad().is_alias_of(g));
  CHECK_FALSE(a.grad().is_alias_of(b.grad()));
  g.fill_(0);
  CHECK(a.grad().to_vector() == Values(6, 5.0));

  Tensor w = tp::ones({2, 3}).requires_grad_();
  tp::sum(tp::mul(w.t(), 2.0)).backward();  // the incoming gradient is a t() view
  CHECK(w.grad().is_contiguous());
  CHECK(w.grad().to_vector() == Values(6, 2.0));
}

TEST_CASE("a gradient set to a view of a bucket accumulates into the bucket in place") {
  // DDP's gradient_as_bucket_view: the grad is a slot of one flat bucket.
  Tensor bucket = tp::zeros({8});
  Tensor w = tp::ones({2, 3}).requires_grad_();
  w.set_grad(bucket.narrow(0, 1, 6).view({2, 3}));
  tp::sum(tp::mul(w, 2.0)).backward();
  CHECK(w.grad().is_alias_of(bucket));
  CHECK(bucket.to_vector() == Values{0, 2, 2, 2, 2, 2, 2, 0});
  tp::sum(w).backward();
  CHECK(bucket.to_vector() == Values{0, 3, 3, 3, 3, 3, 3, 0});
}

TEST_CASE("backward on a leaf writes the given gradient into its grad") {
  Tensor w = tp::ones({2}).requires_grad_();
  w.backward(tp::tensor({1, 2}, {2}));
  CHECK(w.grad().to_vector() == Values{1, 2});
}

TEST_CASE("a backward rule computes no gradient for inputs that do not require grad") {
  Tensor x = tp::ones({2, 3});
  Tensor w = tp::ones({3, 1}).requires_grad_();
  Tensor y = tp::matmul(x, w);
  CHECK(y.grad_fn()->next_functions()[0] == nullptr);
  // Ask the node directly: the gradient for x (input 0) is not computed.
  const std::vector<Tensor> grads = y.grad_fn()->apply(tp::ones({2, 1}));
  CHECK_FALSE(grads[0].defined());
  CHECK(grads[1].to_vector() == Values{2, 2, 2});
  tp::sum(y).backward();
  CHECK(w.grad().to_vector() == Values{2, 2, 2});
}

// ---- graph structure and grad mode --------------------------------------------------

TEST_CASE("grad_fn and next_functions describe the graph") {
  Tensor x = tp::ones({2, 2});
  Tensor w = tp::ones({2, 2}).requires_grad_();
  Tensor loss = tp::mean(tp::mul(x, w));
  REQUIRE(loss.grad_fn());
  CHECK(loss.grad_fn()->name() == "MeanBackward");
  CHECK_FALSE(loss.is_leaf());
  CHECK(loss.requires_grad());
  const auto& mul_node = loss.grad_fn()->next_functions().at(0);
  CHECK(mul_node->name() == "MulBackward");
  REQUIRE(mul_node->next_functions().size() == 2);
  CHECK(mul_node->next_functions()[0] == nullptr);  // x needs no gradient
  const auto accumulator =
      std::dynamic_pointer_cast<tp::autograd::AccumulateGrad>(mul_node->next_functions()[1]);
  REQUIRE(accumulator);
  CHECK(accumulator->variable().impl() == w.impl());
  // Every use of w links to the same accumulator while the graph lives.
  CHECK(tp::autograd::grad_accumulator(w) == accumulator);
  CHECK(tp::autograd::gradient_edge(x) == nullptr);
  CHECK(tp::autograd::gradient_edge(loss) == loss.grad_fn());
}

TEST_CASE("sequence numbers increase with node creation") {
  Tensor w = tp::ones({2}).requires_grad_();
  Tensor a = tp::mul(w, 2.0);
  Tensor b = tp::relu(a);
  CHECK(b.grad_fn()->sequence_nr() > a.grad_fn()->sequence_nr());
}

TEST_CASE("ops on inputs that do not require grad record nothing") {
  Tensor y = tp::relu(tp::matmul(tp::ones({2, 2}), tp::ones({2, 2})));
  CHECK(y.is_leaf());
  CHECK_FALSE(y.requires_grad());
  CHECK(y.grad_fn() == nullptr);
}

TEST_CASE("NoGradGuard stops graph building and guards nest") {
  Tensor w = tp::ones({2}).requires_grad_();
  CHECK(tp::autograd::is_grad_enabled());
  {
    tp::NoGradGuard outer;
    CHECK_FALSE(tp::autograd::is_grad_enabled());
    Tensor y = tp::mul(w, 2.0);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
    {
      tp::NoGradGuard inner;
      CHECK_FALSE(tp::autograd::is_grad_enabled());
    }
    CHECK_FALSE(tp::autograd::is_grad_enabled());  // inner restored "off"
  }
  CHECK(tp::autograd::is_grad_enabled());
  CHECK(tp::mul(w, 2.0).requires_grad());
}

TEST_CASE("grad mode is per thread") {
  tp::NoGradGuard no_grad;
  bool enabled_on_other_thread = false;
  std::thread([&] { enabled_on_other_thread = tp::autograd::is_grad_enabled(); }).join();
  CHECK(enabled_on_other_thread);
  CHECK_FALSE(tp::autograd::is_grad_enabled());
}

// ---- backward errors ---------------------------------------------------------------

TEST_CASE("backward on a non-scalar without a gradient names the shape to pass") {
  Tensor w = tp::ones({3, 4}).requires_grad_();
  Tensor y = tp::mul(w, 2.0);
  CHECK_THROWS_WITH_AS(y.backward(),
                       Contains("tp::Tensor::backward: grad can be implicitly created only "
                                "for one-element tensors; pass a gradient of shape (3, 4)"),
                       tp::Error);
  y.backward(tp::ones({3, 4}));
  CHECK(w.grad().to_vector() == Values(12, 2.0));
}

TEST_CASE("backward on a tensor that does not require grad says why") {
  Tensor loss = tp::sum(tp::ones({2}));
  CHECK_THROWS_WITH_AS(loss.backward(),
                       Contains("tp::Tensor::backward: the tensor of shape () does not "
                                "require grad and has no grad_fn"),
                       tp::Error);
}

TEST_CASE("backward with a gradient of the wrong shape is refused") {
  Tensor y = tp::mul(tp::ones({2, 2}).requires_grad_(), 2.0);
  CHECK_THROWS_WITH_AS(y.backward(tp::ones({4})),
                       Contains("the gradient has shape (4) and dtype float32 but the tensor "
                                "has shape (2, 2)"),
                       tp::Error);
}

// ---- post-accumulate-grad hooks -------------------------------------------------------

namespace {

// A two-layer MLP in float64 with named parameters, for hook-order tests:
// h = relu(x W1^T + b1); y = h W2^T + b2; loss = mse(y, target).
struct TinyMlp {
  Tensor x = tp::tensor(pseudo_random(12, 40), {4, 3}, tp::kFloat64);
  Tensor target = tp::tensor(pseudo_random(8, 41), {4, 2}, tp::kFloat64);
  Tensor w1 = leaf({5, 3}, 42);
  Tensor b1 = leaf({5}, 43);
  Tensor w2 = leaf({2, 5}, 44);
  Tensor b2 = leaf({2}, 45);

  std::vector<std::pair<std::string, Tensor>> named_parameters() const {
    return {{"w1", w1}, {"b1", b1}, {"w2", w2}, {"b2", b2}};
  }
  Tensor loss() const {
    Tensor h = tp::relu(tp::add(tp::matmul(x, w1.t()), b1));
    return tp::mse_loss(tp::add(tp::matmul(h, w2.t()), b2), target);
  }
};

}  // namespace

TEST_CASE("hooks fire once per leaf per backward, later-used parameters first") {
  TinyMlp mlp;
  std::vector<std::string> fired;
  std::vector<tp::RemovableHandle> handles;  // each hook lives as long as its handle
  for (const auto& [name, param] : mlp.named_parameters()) {
    handles.push_back(param.register_post_accumulate_grad_hook(
        [&fired, name = name](const Tensor&) { fired.push_back(name); }));
  }
  mlp.loss().backward();
  // The output layer's parameters were used last, so their gradients are
  // final first (Note [Ready order] in engine.cc).
  CHECK(fired == std::vector<std::string>{"b2", "w2", "b1", "w1"});
  fired.clear();
  mlp.loss().backward();
  CHECK(fired == std::vector<std::string>{"b2", "w2", "b1", "w1"});
}

TEST_CASE("a hook fires as soon as its gradient is final even while an earlier graph is alive") {
  // Keeping the previous loss alive keeps w2's AccumulateGrad from that
  // step, with its old sequence number. Its hook must still fire right after
  // w2's gradient is computed, before backward reaches the first layer's new
  // leaf b (Note [Ready order]).
  Tensor x = tp::tensor(pseudo_random(12, 50), {4, 3}, tp::kFloat64);
  Tensor w1 = leaf({3, 5}, 51);
  Tensor w2 = leaf({5, 2}, 52);
  auto loss_of = [&](const Tensor& b) {
    return tp::sum(tp::matmul(tp::relu(tp::add(tp::matmul(x, w1), b)), w2));
  };
  Tensor previous = loss_of(leaf({5}, 53));
  previous.backward();
  Tensor b = leaf({5}, 54);  // a new leaf, so a new, newer AccumulateGrad
  bool b_had_grad_in_w2_hook = true;
  tp::RemovableHandle handle = w2.register_post_accumulate_grad_hook(
      [&](const Tensor&) { b_had_grad_in_w2_hook = b.grad().defined(); });
  loss_of(b).backward();
  CHECK_FALSE(b_had_grad_in_w2_hook);
  CHECK(previous.grad_fn() != nullptr);  // the earlier graph really was alive
}

TEST_CASE("a hook sees the leaf's final gradient for the pass") {
  TinyMlp mlp;
  std::map<std::string, Values> seen;
  std::vector<tp::RemovableHandle> handles;
  for (const auto& [name, param] : mlp.named_parameters()) {
    handles.push_back(param.register_post_accumulate_grad_hook(
        [&seen, name = name](const Tensor& p) { seen[name] = p.grad().to_vector(); }));
  }
  mlp.loss().backward();
  for (const auto& [name, param] : mlp.named_parameters()) {
    CAPTURE(name);
    CHECK(seen.at(name) == param.grad().to_vector());
  }

  // A leaf used by two ops: the hook fires once, after both contributions.
  Tensor w = tp::ones({2}, tp::kFloat64).requires_grad_();
  int calls = 0;
  Values at_hook;
  tp::RemovableHandle handle = w.register_post_accumulate_grad_hook([&](const Tensor& p) {
    ++calls;
    at_hook = p.grad().to_vector();
  });
  tp::sum(tp::add(tp::mul(w, 3.0), tp::relu(tp::mul(w, 4.0)))).backward();
  CHECK(calls == 1);
  CHECK(at_hook == Values{7, 7});
}

TEST_CASE("hooks on one leaf run in registration order and receive the leaf") {
  Tensor w = tp::ones({2}).requires_grad_();
  std::vector<int> order;
  tp::RemovableHandle first = w.register_post_accumulate_grad_hook([&](const Tensor& p) {
    CHECK(p.impl() == w.impl());
    order.push_back(1);
  });
  tp::RemovableHandle second =
      w.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back(2); });
  tp::sum(w).backward();
  CHECK(order == std::vector<int>{1, 2});
}

TEST_CASE("a removed hook no longer fires; remove is safe twice and after the tensor is gone") {
  Tensor w = tp::ones({2}).requires_grad_();
  int calls = 0;
  tp::RemovableHandle handle =
      w.register_post_accumulate_grad_hook([&](const Tensor&) { ++calls; });
  tp::sum(w).backward();
  CHECK(calls == 1);
  handle.remove();
  tp::sum(w).backward();
  CHECK(calls == 1);
  handle.remove();

  tp::RemovableHandle orphan;
  {
    Tensor gone = tp::ones({1}).requires_grad_();
    orphan = gone.register_post_accumulate_grad_hook([](const Tensor&) {});
  }
  orphan.remove();
  tp::RemovableHandle().remove();  // a default handle too
}

TEST_CASE("a hook that removes itself still runs this pass and not the next") {
  Tensor w = tp::ones({2}).requires_grad_();
  int calls = 0;
  tp::RemovableHandle handle;
  handle = w.register_post_accumulate_grad_hook([&](const Tensor&) {
    ++calls;
    handle.remove();
  });
  tp::sum(w).backward();
  tp::sum(w).backward();
  CHECK(calls == 1);
}

TEST_CASE("a hook stops firing when its handle is destroyed") {
  Tensor w = tp::ones({2}).requires_grad_();
  int calls = 0;
  {
    tp::RemovableHandle handle =
        w.register_post_accumulate_grad_hook([&](const Tensor&) { ++calls; });
    tp::sum(w).backward();
    CHECK(calls == 1);
  }
  tp::sum(w).backward();
  CHECK(calls == 1);
  CHECK(w.impl()->post_accumulate_grad_hooks.empty());
}

TEST_CASE("moving a handle keeps the hook; the moved-from handle owns nothing") {
  Tensor w = tp::ones({2}).requires_grad_();
  int calls = 0;
  std::vector<tp::RemovableHandle> kept;  // as DDP keeps its handles
  {
    tp::RemovableHandle local =
        w.register_post_accumulate_grad_hook([&](const Tensor&) { ++calls; });
    kept.push_back(std::move(local));
    local.remove();  // a moved-from handle: removes nothing, then dies harmlessly
  }
  kept.reserve(16);  // the vector reallocates: its handles move again
  tp::sum(w).backward();
  CHECK(calls == 1);

  tp::RemovableHandle moved_again(std::move(kept.front()));
  kept.clear();
  tp::sum(w).backward();
  CHECK(calls == 2);
  moved_again.remove();
  tp::sum(w).backward();
  CHECK(calls == 2);
}

TEST_CASE("move-assigning over a handle removes the hook it held first") {
  Tensor w = tp::ones({2}).requires_grad_();
  std::vector<std::string> fired;
  tp::RemovableHandle handle =
      w.register_post_accumulate_grad_hook([&](const Tensor&) { fired.push_back("old"); });
  handle = w.register_post_accumulate_grad_hook([&](const Tensor&) { fired.push_back("new"); });
  tp::sum(w).backward();
  CHECK(fired == std::vector<std::string>{"new"});

  tp::RemovableHandle& same = handle;
  handle = std::move(same);  // self-move keeps the hook
  fired.clear();
  tp::sum(w).backward();
  CHECK(fired == std::vector<std::string>{"new"});
}

TEST_CASE("a handle that outlives its tensor is harmless and does not keep it alive") {
  std::weak_ptr<tp::TensorImpl> watch;
  tp::RemovableHandle outliving;
  {
    Tensor gone = tp::ones({1}).requires_grad_();
    watch = gone.impl_ptr();
    outliving = gone.register_post_accumulate_grad_hook([](const Tensor&) {});
  }
  CHECK(watch.expired());  // the handle refers to its tensor weakly
  // outliving's destructor runs at the end of this test: nothing to remove.
}

// A hook gets the leaf as const Tensor&, the handle that AccumulateGrad itself
// holds: it may change the gradient but never rebind the leaf. A hook written
// as [](tp::Tensor& p) { p = tp::Tensor(); } does not compile, because a
// lambda taking Tensor& cannot become a PostAccumulateGradHook and a
// const Tensor& cannot be assigned to. The static_asserts pin both facts.
// (Likewise, a discarded register_post_accumulate_grad_hook result is a
// compiler warning, thanks to [[nodiscard]].)
static_assert(!std::is_constructible_v<tp::PostAccumulateGradHook, void (*)(Tensor&)>);
static_assert(!std::is_assignable_v<const Tensor&, Tensor>);
static_assert(!std::is_copy_constructible_v<tp::RemovableHandle>);
static_assert(!std::is_copy_assignable_v<tp::RemovableHandle>);
static_assert(std::is_nothrow_move_constructible_v<tp::RemovableHandle>);
static_assert(std::is_nothrow_move_assignable_v<tp::RemovableHandle>);

TEST_CASE("a hook changes the gradient through the const leaf: in place or with set_grad") {
  Tensor w = tp::ones({2}, tp::kFloat64).requires_grad_();
  Tensor v = tp::ones({2}, tp::kFloat64).requires_grad_();
  Tensor slot = tp::zeros({2}, tp::kFloat64);  // as a DDP bucket view would be
  tp::RemovableHandle halve =
      w.register_post_accumulate_grad_hook([](const Tensor& p) { p.grad().div_(2.0); });
  tp::RemovableHandle redirect = v.register_post_accumulate_grad_hook([&](const Tensor& p) {
    slot.copy_(p.grad());
    p.set_grad(slot);
  });
  tp::sum(tp::add(tp::mul(w, 3.0), tp::mul(v, 5.0))).backward();
  CHECK(w.grad().to_vector() == Values{1.5, 1.5});
  CHECK(v.grad().to_vector() == Values{5, 5});
  CHECK(v.grad().is_alias_of(slot));
  // The leaves themselves are intact: the next pass finds them as before.
  tp::sum(tp::add(tp::mul(w, 3.0), tp::mul(v, 5.0))).backward();
  CHECK(w.grad().to_vector() == Values{2.25, 2.25});  // (1.5 + 3) / 2
  CHECK(slot.to_vector() == Values{10, 10});          // accumulated into the view
}

TEST_CASE("hooks can be registered only on leaves that require grad") {
  Tensor plain = tp::ones({2});
  CHECK_THROWS_WITH_AS((void)plain.register_post_accumulate_grad_hook([](const Tensor&) {}),
                       Contains("the tensor must be a leaf that requires grad (it does not "
                                "require grad)"),
                       tp::Error);
  Tensor w = tp::ones({2}).requires_grad_();
  Tensor y = tp::mul(w, 2.0);
  CHECK_THROWS_WITH_AS((void)y.register_post_accumulate_grad_hook([](const Tensor&) {}),
                       Contains("(it was produced by MulScalarBackward)"), tp::Error);
}

// ---- queue_callback ---------------------------------------------------------------

TEST_CASE("queued callbacks run after the last node, after every hook, in order") {
  TinyMlp mlp;
  std::vector<std::string> events;
  bool queued = false;
  std::vector<tp::RemovableHandle> handles;
  for (const auto& [name, param] : mlp.named_parameters()) {
    handles.push_back(param.register_post_accumulate_grad_hook([&, name = name](const Tensor&) {
      CHECK(tp::autograd::in_backward());
      events.push_back(name);
      if (queued) return;
      queued = true;
      // Queued by the first hook; runs only once backward is done.
      tp::autograd::queue_callback([&] {
        CHECK(mlp.w1.grad().defined());  // every gradient is final by now
        events.push_back("callback 1");
        tp::autograd::queue_callback([&] { events.push_back("callback 2"); });
      });
    }));
  }
  CHECK_FALSE(tp::autograd::in_backward());
  mlp.loss().backward();
  CHECK_FALSE(tp::autograd::in_backward());
  CHECK(events == std::vector<std::string>{"b2", "w2", "b1", "w1", "callback 1", "callback 2"});

  // Callbacks belong to one pass: the next backward runs none of them.
  events.clear();
  queued = true;
  mlp.loss().backward();
  CHECK(events == std::vector<std::string>{"b2", "w2", "b1", "w1"});
}

TEST_CASE("queue_callback outside a backward pass throws") {
  CHECK_THROWS_WITH_AS(tp::autograd::queue_callback([] {}),
                       Contains("tp::autograd::queue_callback: called outside a backward "
                                "pass; call it from a hook while backward runs"),
                       tp::Error);
}

TEST_CASE("an exception from a hook aborts backward and drops queued callbacks") {
  Tensor w = tp::ones({2}).requires_grad_();
  bool callback_ran = false;
  tp::RemovableHandle handle = w.register_post_accumulate_grad_hook([&](const Tensor&) {
    tp::autograd::queue_callback([&] { callback_ran = true; });
    throw tp::Error("hook failed");
  });
  CHECK_THROWS_WITH_AS(tp::sum(w).backward(), "hook failed", tp::Error);
  CHECK_FALSE(callback_ran);
  CHECK_FALSE(tp::autograd::in_backward());
  handle.remove();
  tp::sum(w).backward();  // the engine is usable again
  CHECK_FALSE(callback_ran);
}

TEST_CASE("backward from inside a hook is refused") {
  Tensor w = tp::ones({2}).requires_grad_();
  Tensor other = tp::ones({2}).requires_grad_();
  tp::RemovableHandle handle =
      w.register_post_accumulate_grad_hook([&](const Tensor&) { tp::sum(other).backward(); });
  CHECK_THROWS_WITH_AS(tp::sum(w).backward(), Contains("reentrant backward is not supported"),
                       tp::Error);
}

// ---- phase marks on the trace ----------------------------------------------------

namespace {

// Tracing on, empty, for one test; off and empty afterwards.
struct TraceOn {
  TraceOn() { tp::trace::enable(0); }
  ~TraceOn() {
    tp::trace::disable();
    tp::trace::clear();
  }
};

std::vector<tp::trace::Event> events_named(const std::string& name) {
  std::vector<tp::trace::Event> found;
  for (const tp::trace::Event& e : tp::trace::events()) {
    if (e.name == name) found.push_back(e);
  }
  return found;
}

}  // namespace

TEST_CASE("with tracing on, hooks come before graph done and callbacks inside the callbacks span") {
  TraceOn trace_on;
  TinyMlp mlp;
  std::vector<tp::RemovableHandle> handles;
  for (const auto& [name, param] : mlp.named_parameters()) {
    handles.push_back(param.register_post_accumulate_grad_hook([](const Tensor&) {
      tp::trace::instant("hook", "hook");
      tp::autograd::queue_callback([] { tp::trace::instant("callback", "test"); });
    }));
  }
  mlp.loss().backward();

  const auto hooks = events_named("hook");
  const auto graph_done = events_named("graph done");
  const auto callbacks = events_named("callbacks");
  const auto callback_marks = events_named("callback");
  REQUIRE(hooks.size() == 4);
  REQUIRE(graph_done.size() == 1);
  REQUIRE(callbacks.size() == 1);
  REQUIRE(callback_marks.size() == 4);
  CHECK(graph_done[0].category == "autograd");
  CHECK(graph_done[0].phase == 'i');
  CHECK(callbacks[0].category == "autograd");
  CHECK(callbacks[0].phase == 'X');
  for (const auto& hook : hooks) CHECK(hook.begin_order < graph_done[0].begin_order);
  CHECK(graph_done[0].end_order < callbacks[0].begin_order);
  for (const auto& mark : callback_marks) {
    CHECK(callbacks[0].begin_order < mark.begin_order);
    CHECK(mark.end_order < callbacks[0].end_order);
  }
}

TEST_CASE("with tracing on, a backward without callbacks marks graph done and no callbacks span") {
  TraceOn trace_on;
  TinyMlp mlp;
  mlp.loss().backward();
  const auto graph_done = events_named("graph done");
  REQUIRE(graph_done.size() == 1);
  CHECK(graph_done[0].category == "autograd");
  CHECK(events_named("callbacks").empty());
}

TEST_CASE("with tracing off, backward records nothing") {
  tp::trace::disable();
  tp::trace::clear();
  TinyMlp mlp;
  tp::RemovableHandle handle = mlp.w1.register_post_accumulate_grad_hook(
      [](const Tensor&) { tp::autograd::queue_callback([] {}); });
  mlp.loss().backward();
  CHECK(tp::trace::events().empty());
}

TEST_CASE("to(dtype) between float32 and float64 is differentiable; to a 16-bit dtype it is not") {
  Tensor x = tp::tensor({1.0, 2.0, 3.0}, {3}, tp::kFloat32).requires_grad_();
  Tensor y = x.to(tp::kFloat64);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->name() == "ToDtypeBackward");
  tp::sum(tp::mul(y, y)).backward();  // d/dx sum(x^2) = 2x, computed in float64
  REQUIRE(x.grad().defined());
  CHECK(x.grad().dtype() == tp::kFloat32);  // back in x's dtype
  CHECK(x.grad().to_vector() == Values{2.0, 4.0, 6.0});
  CHECK(x.to(tp::kFloat16).grad_fn() == nullptr);
}
