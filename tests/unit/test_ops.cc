// tp ops: forward values against hand-computed results in float32 and float64,
// strided inputs, and the wording of input errors. Gradients are checked in
// test_autograd.cc.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "tensorplay/ops.h"

using doctest::Contains;
using tp::Tensor;
using Values = std::vector<double>;

namespace {

// Both dtypes, for tests whose hand-computed values are exact in float32.
const tp::Dtype kDtypes[] = {tp::kFloat32, tp::kFloat64};

}  // namespace

// ---- matmul ------------------------------------------------------------------------

TEST_CASE("matmul multiplies a (2, 3) by a (3, 2) matrix") {
  for (tp::Dtype dtype : kDtypes) {
    CAPTURE(tp::to_string(dtype));
    Tensor a = tp::tensor({1, 2, 3, 4, 5, 6}, {2, 3}, dtype);
    Tensor b = tp::tensor({7, 8, 9, 10, 11, 12}, {3, 2}, dtype);
    Tensor c = tp::matmul(a, b);
    // [1 2 3] . [7 9 11] = 58, [1 2 3] . [8 10 12] = 64, ...
    CHECK(c.shape() == tp::Shape{2, 2});
    CHECK(c.dtype() == dtype);
    CHECK(c.to_vector() == Values{58, 64, 139, 154});
    CHECK(a.matmul(b).to_vector() == c.to_vector());
    CHECK(a.to_vector() == Values{1, 2, 3, 4, 5, 6});  // inputs untouched
  }
}

TEST_CASE("matmul with transposed views equals the product of explicit transposes") {
  for (tp::Dtype dtype : kDtypes) {
    CAPTURE(tp::to_string(dtype));
    Tensor p = tp::tensor({1, -2, 3, 0.5, 4, -1}, {3, 2}, dtype);        // (3, 2)
    Tensor q = tp::tensor({2, 1, 0, -3, 1, 5, 2, -1}, {4, 2}, dtype);    // (4, 2)
    Tensor pt = p.t().contiguous();  // explicit (2, 3)
    Tensor qt = q.t().contiguous();  // explicit (2, 4)
    // Transposed views go to BLAS as flags; the explicit copies are the oracle.
    CHECK(tp::matmul(p.t(), p).to_vector() == tp::matmul(pt, p).to_vector());   // (2,3)@(3,2)
    CHECK(tp::matmul(p, q.t()).to_vector() == tp::matmul(p, qt).to_vector());   // (3,2)@(2,4)
    CHECK(tp::matmul(q, p.t()).to_vector() == tp::matmul(q, pt).to_vector());   // (4,2)@(2,3)
    CHECK(tp::matmul(qt.t(), pt).to_vector() == tp::matmul(q, pt).to_vector());
    Tensor q3 = q.narrow(0, 1, 3);  // rows 1..3 of q: a (3, 2) view at offset 2
    CHECK(tp::matmul(p.t(), q3).to_vector() == tp::matmul(pt, q3.contiguous()).to_vector());
  }
}

TEST_CASE("matmul reads narrowed blocks of a larger matrix in place") {
  Tensor big = tp::tensor({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4}, tp::kFloat64);
  Tensor block = big.narrow(1, 1, 2);  // (3, 2) with row stride 4: columns 1 and 2
  Tensor ones = tp::ones({2, 1}, tp::kFloat64);
  // Row sums of columns 1..2: 2+3, 6+7, 10+11.
  CHECK(tp::matmul(block, ones).to_vector() == Values{5, 13, 21});
  // The same block transposed: (2, 3) @ (3, 1) sums each column of the block.
  CHECK(tp::matmul(block.t(), tp::ones({3, 1}, tp::kFloat64)).to_vector() == Values{18, 21});
}

TEST_CASE("matmul copies a layout BLAS cannot read and still gets it right") {
  // A (2, 2) view with strides (2, 4) over 0..7: rows step by 2, columns by 4.
  // Neither row- nor column-major, so matmul must copy it first.
  Tensor base = tp::tensor({0, 1, 2, 3, 4, 5, 6, 7}, {8}, tp::kFloat64);
  auto impl = std::make_shared<tp::TensorImpl>(*base.impl());
  impl->shape = {2, 2};
  impl->strides = {2, 4};
  Tensor odd(impl);
  CHECK(odd.to_vector() == Values{0, 4, 2, 6});
  Tensor id = tp::tensor({1, 0, 0, 1}, {2, 2}, tp::kFloat64);
  CHECK(tp::matmul(odd, id).to_vector() == Values{0, 4, 2, 6});
  CHECK(tp::matmul(id, odd).to_vector() == Values{0, 4, 2, 6});
}

TEST_CASE("matmul with an empty inner dimension gives zeros") {
  Tensor c = tp::matmul(tp::zeros({2, 0}), tp::zeros({0, 3}));
  CHECK(c.shape() == tp::Shape{2, 3});
  CHECK(c.to_vector() == Values(6, 0.0));
}

TEST_CASE("matmul names both shapes when the inner sizes differ") {
  CHECK_THROWS_WITH_AS(tp::matmul(tp::zeros({3, 4}), tp::zeros({5, 2})),
                       Contains("tp::matmul: shapes (3, 4) and (5, 2) cannot be multiplied; "
                                "the inner sizes 4 and 5 must match"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(tp::matmul(tp::zeros({3}), tp::zeros({3, 2})),
                       Contains("tp::matmul: expects two 2-D tensors, got shapes (3) and (3, 2)"),
                       tp::Error);
}

// ---- elementwise ------------------------------------------------------------------

TEST_CASE("add, sub and mul work elementwise on equal shapes") {
  for (tp::Dtype dtype : kDtypes) {
    CAPTURE(tp::to_string(dtype));
    Tensor a = tp::tensor({1, 2, 3, 4}, {2, 2}, dtype);
    Tensor b = tp::tensor({10, 20, 30, 40}, {2, 2}, dtype);
    CHECK(tp::add(a, b).to_vector() == Values{11, 22, 33, 44});
    CHECK(tp::sub(a, b).to_vector() == Values{-9, -18, -27, -36});
    CHECK(tp::mul(a, b).to_vector() == Values{10, 40, 90, 160});
    CHECK((a + b).to_vector() == Values{11, 22, 33, 44});
    CHECK((b - a).to_vector() == Values{9, 18, 27, 36});
    CHECK((a * b).to_vector() == Values{10, 40, 90, 160});
    CHECK(tp::add(a, b).dtype() == dtype);
  }
}

TEST_CASE("add broadcasts a (m) bias over every row of a (n, m) matrix") {
  for (tp::Dtype dtype : kDtypes) {
    CAPTURE(tp::to_string(dtype));
    Tensor x = tp::tensor({1, 2, 3, 4, 5, 6}, {3, 2}, dtype);
    Tensor bias = tp::tensor({100, 200}, {2}, dtype);
    Tensor y = tp::add(x, bias);
    CHECK(y.shape() == tp::Shape{3, 2});
    CHECK(y.to_vector() == Values{101, 202, 103, 204, 105, 206});
  }
}

TEST_CASE("add names both shapes when they do not broadcast") {
  CHECK_THROWS_WITH_AS(tp::add(tp::zeros({3, 4}), tp::zeros({5})),
                       Contains("tp::add: shapes (3, 4) and (5) do not broadcast"), tp::Error);
  // A bias broadcasts only from the right: (m) + (n, m) is refused.
  CHECK_THROWS_WITH_AS(tp::add(tp::zeros({4}), tp::zeros({3, 4})),
                       Contains("do not broadcast"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::sub(tp::zeros({2, 3}), tp::zeros({3, 2})),
                       Contains("tp::sub: shapes (2, 3) and (3, 2) must be equal"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::mul(tp::zeros({2}), tp::zeros({3})),
                       Contains("tp::mul: shapes (2) and (3) must be equal"), tp::Error);
}

TEST_CASE("binary ops refuse mixed dtypes and say how to convert") {
  CHECK_THROWS_WITH_AS(tp::add(tp::zeros({2}), tp::zeros({2}, tp::kFloat64)),
                       Contains("tp::add: dtypes float32 and float64 differ"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::matmul(tp::zeros({2, 2}), tp::zeros({2, 2}, tp::kFloat64)),
                       Contains("convert one with .to()"), tp::Error);
}

TEST_CASE("ops refuse undefined inputs") {
  CHECK_THROWS_WITH_AS(tp::relu(Tensor()), Contains("tp::relu: got an undefined tensor"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(tp::add(tp::zeros({1}), Tensor()),
                       Contains("tp::add: got an undefined tensor"), tp::Error);
}

TEST_CASE("mul and div by a scalar scale every element") {
  for (tp::Dtype dtype : kDtypes) {
    CAPTURE(tp::to_string(dtype));
    Tensor a = tp::tensor({1, -2, 4}, {3}, dtype);
    CHECK(tp::mul(a, 0.5).to_vector() == Values{0.5, -1, 2});
    CHECK((3.0 * a).to_vector() == Values{3, -6, 12});
    CHECK((a * 3.0).to_vector() == Values{3, -6, 12});
    CHECK(tp::div(a, 4.0).to_vector() == Values{0.25, -0.5, 1});
    CHECK((a / 2.0).to_vector() == Values{0.5, -1, 2});
  }
}

TEST_CASE("relu zeroes negatives and square squares") {
  for (tp::Dtype dtype : kDtypes) {
    CAPTURE(tp::to_string(dtype));
    Tensor a = tp::tensor({-1.5, 0, 2, -3, 4, 0.5}, {2, 3}, dtype);
    CHECK(tp::relu(a).to_vector() == Values{0, 0, 2, 0, 4, 0.5});
    CHECK(a.relu().shape() == tp::Shape{2, 3});
    CHECK(tp::square(a).to_vector() == Values{2.25, 0, 4, 9, 16, 0.25});
    CHECK(a.square().to_vector() == tp::square(a).to_vector());
  }
}

TEST_CASE("elementwise ops read strided views in row-major order") {
  Tensor a = tp::tensor({1, 2, 3, 4, 5, 6}, {2, 3}, tp::kFloat64);
  Tensor at = a.t();  // (3, 2): 1 4 / 2 5 / 3 6
  Tensor b = tp::tensor({10, 20, 30, 40, 50, 60}, {3, 2}, tp::kFloat64);
  CHECK(tp::add(at, b).to_vector() == Values{11, 24, 32, 45, 53, 66});
  CHECK(tp::relu(at * -1.0).to_vector() == Values(6, 0.0));
  CHECK(tp::square(a.narrow(1, 1, 2)).to_vector() == Values{4, 9, 25, 36});
  CHECK(tp::add(at, tp::tensor({1, 2}, {2}, tp::kFloat64)).to_vector() ==
        Values{2, 6, 3, 7, 4, 8});
}

TEST_CASE("op outputs are fresh contiguous tensors") {
  Tensor a = tp::ones({2, 3}).t();
  Tensor y = tp::relu(a);
  CHECK(y.is_contiguous());
  CHECK_FALSE(y.is_alias_of(a));
  CHECK(y.shape() == tp::Shape{3, 2});
}

// ---- reductions ------------------------------------------------------------------

TEST_CASE("sum and mean reduce every element to a scalar") {
  for (tp::Dtype dtype : kDtypes) {
    CAPTURE(tp::to_string(dtype));
    Tensor a = tp::tensor({1, 2, 3, 4, 5, 6}, {2, 3}, dtype);
    Tensor s = tp::sum(a);
    CHECK(s.shape() == tp::Shape{});
    CHECK(s.item() == 21);
    CHECK(a.sum().item() == 21);
    CHECK(tp::mean(a).item() == 3.5);
    CHECK(a.mean().item() == 3.5);
    CHECK(tp::sum(a.t()).item() == 21);
  }
}

TEST_CASE("sum over dim 0 adds the rows, over dim 1 the columns") {
  for (tp::Dtype dtype : kDtypes) {
    CAPTURE(tp::to_string(dtype));
    Tensor a = tp::tensor({1, 2, 3, 4, 5, 6}, {2, 3}, dtype);
    CHECK(tp::sum(a, 0).shape() == tp::Shape{3});
    CHECK(tp::sum(a, 0).to_vector() == Values{5, 7, 9});
    CHECK(tp::sum(a, 1).to_vector() == Values{6, 15});
    CHECK(tp::sum(a, -1).to_vector() == Values{6, 15});
    CHECK(tp::sum(a, -2).to_vector() == Values{5, 7, 9});
    CHECK(tp::sum(a.t(), 0).to_vector() == Values{6, 15});
  }
}

TEST_CASE("sum over a dim checks the rank and the dim") {
  CHECK_THROWS_WITH_AS(tp::sum(tp::zeros({2, 3}), 2),
                       Contains("tp::sum: dim 2 is out of range for shape (2, 3)"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::sum(tp::zeros({2, 3, 4}), 0),
                       Contains("expects a 2-D tensor, got shape (2, 3, 4)"), tp::Error);
}

TEST_CASE("mean of an empty tensor is refused") {
  CHECK_THROWS_WITH_AS(tp::mean(tp::zeros({0, 3})), Contains("has no elements"), tp::Error);
}

TEST_CASE("a float32 sum accumulates in double and keeps small addends") {
  // 1e8 + 1 + 1 + ... : each 1 alone is lost against 1e8 in float32, but a
  // double accumulator keeps all 16 of them.
  std::vector<double> values(17, 1.0);
  values[0] = 1e8;
  CHECK(tp::sum(tp::tensor(values, {17})).item() == 1e8 + 16);
}

TEST_CASE("mse_loss is the mean of squared differences") {
  for (tp::Dtype dtype : kDtypes) {
    CAPTURE(tp::to_string(dtype));
    Tensor pred = tp::tensor({1, 2, 3, 4}, {2, 2}, dtype);
    Tensor target = tp::tensor({0, 2, 5, 1}, {2, 2}, dtype);
    // (1 + 0 + 4 + 9) / 4
    CHECK(tp::mse_loss(pred, target).item() == 3.5);
    CHECK(tp::mse_loss(pred, target).shape() == tp::Shape{});
  }
  CHECK_THROWS_WITH_AS(tp::mse_loss(tp::zeros({4, 1}), tp::zeros({4})),
                       Contains("tp::mse_loss: pred has shape (4, 1) but target has shape (4)"),
                       tp::Error);
}

// ---- comparison helpers -----------------------------------------------------------

TEST_CASE("max_abs_diff and allclose compare element by element") {
  Tensor a = tp::tensor({1, 2, 3}, {3}, tp::kFloat64);
  Tensor b = tp::tensor({1, 2.5, 2}, {3}, tp::kFloat64);
  CHECK(tp::max_abs_diff(a, b) == 1.0);
  CHECK(tp::max_abs_diff(a, a) == 0.0);
  CHECK(tp::allclose(a, a));
  CHECK_FALSE(tp::allclose(a, b));
  CHECK(tp::allclose(a, b, 0.0, 1.0));  // |diff| <= atol = 1
  CHECK(tp::allclose(tp::tensor({100}, {1}), tp::tensor({101}, {1}), 0.01));
  // Mixed dtypes compare as doubles.
  CHECK(tp::allclose(tp::ones({2}), tp::ones({2}, tp::kFloat64)));
  CHECK_THROWS_WITH_AS(tp::max_abs_diff(tp::zeros({2}), tp::zeros({3})),
                       Contains("tp::max_abs_diff: shapes (2) and (3) must be equal"),
                       tp::Error);
}

TEST_CASE("a NaN never compares close and shows in max_abs_diff") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor a = tp::tensor({nan, 0}, {2}, tp::kFloat64);
  Tensor b = tp::tensor({0, 0}, {2}, tp::kFloat64);
  CHECK(std::isnan(tp::max_abs_diff(a, b)));
  CHECK(std::isnan(tp::max_abs_diff(b, a)));
  CHECK_FALSE(tp::allclose(a, b));
  CHECK_FALSE(tp::allclose(a, a));
}
