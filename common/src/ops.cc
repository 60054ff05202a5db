// Differentiable ops: each forward kernel, then the backward rule that reverses it.
//
// How an op reads:
//   1. validate the inputs (defined, float32 or float64, same dtype, shapes),
//      naming the op; check_input refuses 16-bit tensors here, once for
//      every op (they are for communication: tensor.h);
//   2. run the kernel on contiguous values: outputs are fresh contiguous
//      tensors; inputs that are strided views are copied first, except that
//      matmul hands a transposed view to BLAS as a transpose flag;
//   3. if grad mode is on and an input requires grad, attach a Node whose
//      apply() is the backward rule: gradients of the inputs given the
//      gradient of the output. Rules run with grad mode off and may use ops.
// A rule computes a gradient only where one is wanted (its next function is
// not null): no work for inputs such as the data batch x.
//
// On CUDA: inputs must share a device (an op given two throws, naming both);
// step 2 then calls the op's CUDA kernel (cuda_kernels/kernels.h) instead of the CPU
// loop, and the output, like every gradient a rule makes, lives on the
// inputs' device. The rules themselves are the same code for both.

#include "tensorplay/ops.h"

#include <cblas.h>

#include <climits>
#include <cmath>
#include <initializer_list>
#include <utility>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/autograd/node.h"

#include "cuda_kernels/kernels.h"

namespace tp {
namespace {

using autograd::Node;
namespace cuda_kernels = cuda::kernels;
using cuda_kernels::Binary;
using cuda_kernels::Unary;

// ---- helpers ------------------------------------------------------------------

// Calls f(T{}) with T = float for Float32 and T = double for Float64.
// Inputs of other dtypes never get here: check_input refused them.
template <typename F>
decltype(auto) dispatch(Dtype dtype, F&& f) {
  if (dtype == Dtype::Float32) return f(float{});
  if (dtype == Dtype::Float64) return f(double{});
  TP_THROW(Error, "tp ops: dtype ", to_string(dtype), " has no kernels");
}

void check_defined(const char* op, const Tensor& a) {
  TP_CHECK(a.defined(), op, ": got an undefined tensor (a default-constructed "
           "tp::Tensor); create inputs with a factory such as tp::zeros");
}

// Every op's first check of every input: defined, and of a dtype the ops
// compute in (float32, float64; a 16-bit one is refused, naming the op).
void check_input(const char* op, const Tensor& a) {
  check_defined(op, a);
  check_compute_dtype(op, a.dtype());
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  TP_CHECK(a.dtype() == b.dtype(), op, ": dtypes ", to_string(a.dtype()), " and ",
           to_string(b.dtype()), " differ (shapes ", to_string(a.shape()), " and ",
           to_string(b.shape()), "); convert one with .to(), e.g. .to(tp::kFloat64)");
}

void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  TP_CHECK(a.shape() == b.shape(), op, ": shapes ", to_string(a.shape()), " and ",
           to_string(b.shape()), " must be equal");
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  TP_CHECK(a.device() == b.device(), op, ": tensors on ", to_string(a.device()), " and ",
           to_string(b.device()), "; move one with .to(...)");
}

// check_input + same device + same dtype, for binary ops.
void check_binary(const char* op, const Tensor& a, const Tensor& b) {
  check_input(op, a);
  check_input(op, b);
  check_same_device(op, a, b);
  check_same_dtype(op, a, b);
}

// True when x lives on a CUDA device: its op runs the CUDA kernel.
bool is_cuda(const Tensor& x) { return x.device().type == DeviceType::CUDA; }

// The values of x as a contiguous tensor without autograd history: x itself
// when already contiguous (no copy), else a copy. Kernels read through this,
// so they can index with i instead of strides.
Tensor contiguous_values(const Tensor& x) {
  return x.is_contiguous() ? x : x.detach().contiguous();
}

// True when an op on these inputs should record a backward node.
bool needs_grad(std::initializer_list<Tensor> inputs) {
  if (!autograd::is_grad_enabled()) return false;
  for (const Tensor& input : inputs) {
    if (input.requires_grad()) return true;
  }
  return false;
}

// Makes node the grad_fn of out; its next functions follow inputs' order.
Tensor with_grad_fn(Tensor out, std::shared_ptr<Node> node,
                    std::initializer_list<Tensor> inputs) {
  for (const Tensor& input : inputs) node->add_next(input);
  out.impl()->grad_fn = std::move(node);
  out.impl()->requires_grad = true;
  return out;
}

// out[i] = f(a[i]) for any shape.
template <typename F>
Tensor unary_kernel(const Tensor& a, F f) {
  const Tensor av = contiguous_values(a);
  Tensor out = empty(a.shape(), a.dtype());
  const int64_t n = a.numel();
  dispatch(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = av.data_ptr<T>();
    T* y = out.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
  });
  return out;
}

// out[i] = f(a[i], b[i]); a and b have the same shape and dtype.
template <typename F>
Tensor binary_kernel(const Tensor& a, const Tensor& b, F f) {
  const Tensor av = contiguous_values(a);
  const Tensor bv = contiguous_values(b);
  Tensor out = empty(a.shape(), a.dtype());
  const int64_t n = a.numel();
  dispatch(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = av.data_ptr<T>();
    const T* y = bv.data_ptr<T>();
    T* z = out.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], y[i]);
  });
  return out;
}

// ---- matmul ----------------------------------------------------------------------

// How BLAS should read a 2-D tensor (rows, cols) in row-major order: either
// as stored (NoTrans, rows ld apart) or as the transpose of a stored
// (cols, rows) matrix (Trans). t() of a contiguous matrix has strides
// (1, ld): it is the second case, so no copy is needed.
struct BlasOperand {
  Tensor values;  // keeps the data alive (a copy when neither layout fits)
  CBLAS_TRANSPOSE trans;
  blasint ld;
};

BlasOperand blas_operand(const Tensor& x) {
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const int64_t s0 = x.strides()[0];
  const int64_t s1 = x.strides()[1];
  // The stride of a size-1 dim is never stepped, so it may be anything.
  if ((cols == 1 || s1 == 1) && (rows == 1 || s0 >= cols)) {
    return {x, CblasNoTrans, static_cast<blasint>(rows == 1 ? std::max<int64_t>(cols, 1) : s0)};
  }
  if ((rows == 1 || s0 == 1) && (cols == 1 || s1 >= rows)) {
    return {x, CblasTrans, static_cast<blasint>(cols == 1 ? std::max<int64_t>(rows, 1) : s1)};
  }
  Tensor copy = x.detach().contiguous();  // any other layout: copy once
  return {copy, CblasNoTrans, static_cast<blasint>(std::max<int64_t>(cols, 1))};
}

// a is (n, k); b is (k, m); out is (n, m): out = a @ b through cblas_?gemm.
Tensor matmul_kernel(const Tensor& a, const Tensor& b) {
  const int64_t n = a.size(0);
  const int64_t k = a.size(1);
  const int64_t m = b.size(1);
  Tensor out = empty({n, m}, a.dtype());
  if (n == 0 || m == 0) return out;
  if (k == 0) return out.zero_();  // an empty sum is 0
  const BlasOperand A = blas_operand(a);
  const BlasOperand B = blas_operand(b);
  const auto bn = static_cast<blasint>(n);
  const auto bm = static_cast<blasint>(m);
  const auto bk = static_cast<blasint>(k);
  if (a.dtype() == kFloat32) {
    cblas_sgemm(CblasRowMajor, A.trans, B.trans, bn, bm, bk, 1.0f,
                A.values.data_ptr<float>(), A.ld, B.values.data_ptr<float>(), B.ld,
                0.0f, out.data_ptr<float>(), bm);
  } else {
    cblas_dgemm(CblasRowMajor, A.trans, B.trans, bn, bm, bk, 1.0,
                A.values.data_ptr<double>(), A.ld, B.values.data_ptr<double>(), B.ld,
                0.0, out.data_ptr<double>(), bm);
  }
  return out;
}

// Forward: out = a @ b                  (a is (n, k); b is (k, m); out is (n, m))
// Backward: grad_a = grad_out @ b^T     ((n, m) @ (m, k) -> (n, k))
//           grad_b = a^T @ grad_out     ((k, n) @ (n, m) -> (k, m))
// t() is a view, so BLAS reads the transposes in place.
// When b is itself a transposed view (Linear's x @ W^T), grad_b is computed
// as (grad_out^T @ a)^T: the same values, but laid out so that TBackward's
// transpose hands W's AccumulateGrad a contiguous (out, in) gradient, which
// it can keep without a copy.
class MatmulBackward : public Node {
 public:
  MatmulBackward(Tensor a, Tensor b) : a_(std::move(a)), b_(std::move(b)) {}
  std::string name() const override { return "MatmulBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    Tensor grad_a;
    Tensor grad_b;
    if (next_functions_[0]) grad_a = matmul(grad_out, b_.t());
    if (next_functions_[1]) {
      const bool b_is_transposed = !b_.is_contiguous() && b_.strides()[0] == 1;
      grad_b = b_is_transposed ? matmul(grad_out.t(), a_).t() : matmul(a_.t(), grad_out);
    }
    return {grad_a, grad_b};
  }

 private:
  Tensor a_;  // saved inputs
  Tensor b_;
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_binary("tp::matmul", a, b);
  TP_CHECK(a.dim() == 2 && b.dim() == 2, "tp::matmul: expects two 2-D tensors, got "
           "shapes ", to_string(a.shape()), " and ", to_string(b.shape()),
           "; use view() to make matrices");
  TP_CHECK(a.size(1) == b.size(0), "tp::matmul: shapes ", to_string(a.shape()),
           " and ", to_string(b.shape()), " cannot be multiplied; the inner sizes ",
           a.size(1), " and ", b.size(0), " must match");
  TP_CHECK(a.numel() < INT_MAX && b.numel() < INT_MAX,
           "tp::matmul: shapes ", to_string(a.shape()), " and ", to_string(b.shape()),
           " are too large for 32-bit BLAS indices");
  Tensor out = is_cuda(a) ? cuda_kernels::matmul(a, b) : matmul_kernel(a, b);
  if (!needs_grad({a, b})) return out;
  return with_grad_fn(out, std::make_shared<MatmulBackward>(a, b), {a, b});
}

// ---- add, sub, mul, div ------------------------------------------------------------

namespace {

// a is (n, m); bias is (m); out is (n, m): out[i][j] = a[i][j] + bias[j].
Tensor add_bias_kernel(const Tensor& a, const Tensor& bias) {
  const Tensor av = contiguous_values(a);
  const Tensor bv = contiguous_values(bias);
  const int64_t n = a.size(0);
  const int64_t m = a.size(1);
  Tensor out = empty({n, m}, a.dtype());
  dispatch(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = av.data_ptr<T>();
    const T* b = bv.data_ptr<T>();
    T* y = out.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) y[i * m + j] = x[i * m + j] + b[j];
    }
  });
  return out;
}

// Forward: out = a + b           (same shapes), or
//          out[i][j] = a[i][j] + b[j]   (a is (n, m), b is (m): bias broadcast)
// Backward: grad_a = grad_out
//           grad_b = grad_out, or sum(grad_out, 0) for the bias: b[j] reached
//           every row, so its gradient adds up over the rows.
class AddBackward : public Node {
 public:
  explicit AddBackward(bool bias_broadcast) : bias_broadcast_(bias_broadcast) {}
  std::string name() const override { return "AddBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    Tensor grad_a;
    Tensor grad_b;
    if (next_functions_[0]) grad_a = grad_out;
    if (next_functions_[1]) grad_b = bias_broadcast_ ? sum(grad_out, 0) : grad_out;
    return {grad_a, grad_b};
  }

 private:
  bool bias_broadcast_;
};

// Forward: out = a - b
// Backward: grad_a = grad_out; grad_b = -grad_out
class SubBackward : public Node {
 public:
  std::string name() const override { return "SubBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    Tensor grad_a;
    Tensor grad_b;
    if (next_functions_[0]) grad_a = grad_out;
    if (next_functions_[1]) grad_b = mul(grad_out, -1.0);
    return {grad_a, grad_b};
  }
};

// Forward: out = a * b   (elementwise)
// Backward: grad_a = grad_out * b; grad_b = grad_out * a
class MulBackward : public Node {
 public:
  MulBackward(Tensor a, Tensor b) : a_(std::move(a)), b_(std::move(b)) {}
  std::string name() const override { return "MulBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    Tensor grad_a;
    Tensor grad_b;
    if (next_functions_[0]) grad_a = mul(grad_out, b_);
    if (next_functions_[1]) grad_b = mul(grad_out, a_);
    return {grad_a, grad_b};
  }

 private:
  Tensor a_;  // saved inputs
  Tensor b_;
};

// Forward: out = a * s
// Backward: grad_a = grad_out * s
class MulScalarBackward : public Node {
 public:
  explicit MulScalarBackward(double s) : s_(s) {}
  std::string name() const override { return "MulScalarBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    return {mul(grad_out, s_)};
  }

 private:
  double s_;
};

// Forward: out = a / s
// Backward: grad_a = grad_out / s
class DivScalarBackward : public Node {
 public:
  explicit DivScalarBackward(double s) : s_(s) {}
  std::string name() const override { return "DivScalarBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    return {div(grad_out, s_)};
  }

 private:
  double s_;
};

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  check_binary("tp::add", a, b);
  const bool same_shape = a.shape() == b.shape();
  const bool bias_broadcast = a.dim() == 2 && b.dim() == 1 && a.size(1) == b.size(0);
  TP_CHECK(same_shape || bias_broadcast, "tp::add: shapes ", to_string(a.shape()),
           " and ", to_string(b.shape()), " do not broadcast; add takes equal "
           "shapes, or a (n, m) matrix plus a (m) bias");
  // same shapes: a, b, out are all the same shape
  Tensor out;
  if (is_cuda(a)) {
    out = same_shape ? cuda_kernels::binary(Binary::Add, a, b) : cuda_kernels::add_bias(a, b);
  } else {
    out = same_shape ? binary_kernel(a, b, [](auto x, auto y) { return x + y; })
                     : add_bias_kernel(a, b);
  }
  if (!needs_grad({a, b})) return out;
  return with_grad_fn(out, std::make_shared<AddBackward>(!same_shape), {a, b});
}

Tensor sub(const Tensor& a, const Tensor& b) {
  check_binary("tp::sub", a, b);
  check_same_shape("tp::sub", a, b);
  // a, b, out are the same shape
  Tensor out = is_cuda(a) ? cuda_kernels::binary(Binary::Sub, a, b)
                          : binary_kernel(a, b, [](auto x, auto y) { return x - y; });
  if (!needs_grad({a, b})) return out;
  return with_grad_fn(out, std::make_shared<SubBackward>(), {a, b});
}

Tensor mul(const Tensor& a, const Tensor& b) {
  check_binary("tp::mul", a, b);
  check_same_shape("tp::mul", a, b);
  // a, b, out are the same shape
  Tensor out = is_cuda(a) ? cuda_kernels::binary(Binary::Mul, a, b)
                          : binary_kernel(a, b, [](auto x, auto y) { return x * y; });
  if (!needs_grad({a, b})) return out;
  return with_grad_fn(out, std::make_shared<MulBackward>(a, b), {a, b});
}

Tensor mul(const Tensor& a, double s) {
  check_input("tp::mul", a);
  // a and out are the same shape
  const auto cpu_kernel = [&] {
    return dispatch(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T scale = static_cast<T>(s);
      return unary_kernel(a, [scale](T x) { return x * scale; });
    });
  };
  Tensor out = is_cuda(a) ? cuda_kernels::unary(Unary::MulScalar, a, s) : cpu_kernel();
  if (!needs_grad({a})) return out;
  return with_grad_fn(out, std::make_shared<MulScalarBackward>(s), {a});
}

Tensor div(const Tensor& a, double s) {
  check_input("tp::div", a);
  // a and out are the same shape
  const auto cpu_kernel = [&] {
    return dispatch(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T divisor = static_cast<T>(s);
      return unary_kernel(a, [divisor](T x) { return x / divisor; });
    });
  };
  Tensor out = is_cuda(a) ? cuda_kernels::unary(Unary::DivScalar, a, s) : cpu_kernel();
  if (!needs_grad({a})) return out;
  return with_grad_fn(out, std::make_shared<DivScalarBackward>(s), {a});
}

// ---- relu, square ----------------------------------------------------------------

namespace {

// Forward: out = max(a, 0)
// Backward: grad_a = grad_out where a > 0, else 0
//           (the subgradient at 0 is taken as 0, as PyTorch does)
class ReluBackward : public Node {
 public:
  explicit ReluBackward(Tensor a) : a_(std::move(a)) {}
  std::string name() const override { return "ReluBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    // grad_out, a_ and the result are the same shape
    if (is_cuda(grad_out)) return {cuda_kernels::binary(Binary::ReluGrad, grad_out, a_)};
    return {binary_kernel(grad_out, a_, [](auto g, auto x) {
      return x > 0 ? g : decltype(g){0};
    })};
  }

 private:
  Tensor a_;  // saved input
};

// Forward: out = a * a
// Backward: grad_a = 2 * a * grad_out
class SquareBackward : public Node {
 public:
  explicit SquareBackward(Tensor a) : a_(std::move(a)) {}
  std::string name() const override { return "SquareBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    return {mul(mul(grad_out, a_), 2.0)};
  }

 private:
  Tensor a_;  // saved input
};

}  // namespace

Tensor relu(const Tensor& a) {
  check_input("tp::relu", a);
  // a and out are the same shape
  Tensor out = is_cuda(a) ? cuda_kernels::unary(Unary::Relu, a)
                          : unary_kernel(a, [](auto x) { return x > 0 ? x : decltype(x){0}; });
  if (!needs_grad({a})) return out;
  return with_grad_fn(out, std::make_shared<ReluBackward>(a), {a});
}

Tensor square(const Tensor& a) {
  check_input("tp::square", a);
  // a and out are the same shape
  Tensor out = is_cuda(a) ? cuda_kernels::unary(Unary::Square, a)
                          : unary_kernel(a, [](auto x) { return x * x; });
  if (!needs_grad({a})) return out;
  return with_grad_fn(out, std::make_shared<SquareBackward>(a), {a});
}

// ---- reductions -------------------------------------------------------------------

namespace {

// a is any shape; returns the sum of its elements, accumulated in double for
// both dtypes (so a float32 loss over a large batch loses no digits).
double sum_kernel(const Tensor& a) {
  const Tensor av = contiguous_values(a);
  const int64_t n = a.numel();
  double total = 0.0;
  dispatch(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = av.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) total += x[i];
  });
  return total;
}

// a is (n, m); out is (m) when dim == 0 (sum over rows), (n) when dim == 1.
Tensor sum_dim_kernel(const Tensor& a, int64_t dim) {
  const Tensor av = contiguous_values(a);
  const int64_t n = a.size(0);
  const int64_t m = a.size(1);
  Tensor out = empty({dim == 0 ? m : n}, a.dtype());
  dispatch(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = av.data_ptr<T>();
    T* y = out.data_ptr<T>();
    if (dim == 0) {
      std::vector<double> acc(static_cast<std::size_t>(m), 0.0);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < m; ++j) acc[static_cast<std::size_t>(j)] += x[i * m + j];
      }
      for (int64_t j = 0; j < m; ++j) y[j] = static_cast<T>(acc[static_cast<std::size_t>(j)]);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        double acc = 0.0;
        for (int64_t j = 0; j < m; ++j) acc += x[i * m + j];
        y[i] = static_cast<T>(acc);
      }
    }
  });
  return out;
}

// g is (m) when dim == 0, (n) when dim == 1; out is (n, m) with g repeated
// along dim: out[i][j] = g[j] (dim 0) or g[i] (dim 1).
Tensor expand_kernel(const Tensor& g, int64_t n, int64_t m, int64_t dim) {
  const Tensor gv = contiguous_values(g);
  Tensor out = empty({n, m}, g.dtype());
  dispatch(g.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = gv.data_ptr<T>();
    T* y = out.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) y[i * m + j] = dim == 0 ? x[j] : x[i];
    }
  });
  return out;
}

// Forward: out = sum(a)                 (any shape -> ())
// Backward: grad_a = grad_out everywhere: each element added once.
class SumBackward : public Node {
 public:
  SumBackward(Shape shape, Dtype dtype) : shape_(std::move(shape)), dtype_(dtype) {}
  std::string name() const override { return "SumBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    if (is_cuda(grad_out)) return {cuda_kernels::fill_from_scalar(grad_out, shape_, 1.0)};
    return {full(shape_, grad_out.item(), dtype_)};
  }

 private:
  Shape shape_;  // of the input
  Dtype dtype_;
};

// Forward: out = sum(a, dim)            ((n, m) -> (m) or (n))
// Backward: grad_a[i][j] = grad_out[j] (dim 0) or grad_out[i] (dim 1)
class SumDimBackward : public Node {
 public:
  SumDimBackward(int64_t n, int64_t m, int64_t dim) : n_(n), m_(m), dim_(dim) {}
  std::string name() const override { return "SumDimBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    if (is_cuda(grad_out)) return {cuda_kernels::expand(grad_out, n_, m_, dim_)};
    return {expand_kernel(grad_out, n_, m_, dim_)};
  }

 private:
  int64_t n_;  // input shape (n, m)
  int64_t m_;
  int64_t dim_;
};

// Forward: out = sum(a) / numel         (any shape -> ())
// Backward: grad_a = grad_out / numel everywhere.
class MeanBackward : public Node {
 public:
  MeanBackward(Shape shape, Dtype dtype) : shape_(std::move(shape)), dtype_(dtype) {}
  std::string name() const override { return "MeanBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    const auto n = static_cast<double>(numel_of(shape_));
    // Without item() on CUDA: the host need not wait for the loss.
    if (is_cuda(grad_out)) return {cuda_kernels::fill_from_scalar(grad_out, shape_, n)};
    return {full(shape_, grad_out.item() / n, dtype_)};
  }

 private:
  Shape shape_;  // of the input
  Dtype dtype_;
};

}  // namespace

Tensor sum(const Tensor& a) {
  check_input("tp::sum", a);
  // a is any shape; out is ()
  Tensor out = is_cuda(a) ? cuda_kernels::sum_all(a, 1.0) : full({}, sum_kernel(a), a.dtype());
  if (!needs_grad({a})) return out;
  return with_grad_fn(out, std::make_shared<SumBackward>(a.shape(), a.dtype()), {a});
}

Tensor sum(const Tensor& a, int64_t dim) {
  check_input("tp::sum", a);
  TP_CHECK(a.dim() == 2, "tp::sum: sum over a dim expects a 2-D tensor, got shape ",
           to_string(a.shape()), "; use sum(a) to sum every element");
  TP_CHECK(dim >= -2 && dim <= 1, "tp::sum: dim ", dim, " is out of range for shape ",
           to_string(a.shape()), "; use 0 (over rows) or 1 (over columns)");
  const int64_t d = dim < 0 ? dim + 2 : dim;
  Tensor out = is_cuda(a) ? cuda_kernels::sum_dim(a, d) : sum_dim_kernel(a, d);
  if (!needs_grad({a})) return out;
  return with_grad_fn(out, std::make_shared<SumDimBackward>(a.size(0), a.size(1), d),
                      {a});
}

Tensor mean(const Tensor& a) {
  check_input("tp::mean", a);
  const int64_t n = a.numel();
  TP_CHECK(n > 0, "tp::mean: the tensor of shape ", to_string(a.shape()),
           " has no elements, so its mean is undefined");
  // a is any shape; out is ()
  const auto count = static_cast<double>(n);
  Tensor out = is_cuda(a) ? cuda_kernels::sum_all(a, count)
                          : full({}, sum_kernel(a) / count, a.dtype());
  if (!needs_grad({a})) return out;
  return with_grad_fn(out, std::make_shared<MeanBackward>(a.shape(), a.dtype()), {a});
}

// Not a primitive: composed of sub, square and mean, so its gradient comes
// from their three rules (grad_pred = 2 * (pred - target) / numel).
Tensor mse_loss(const Tensor& pred, const Tensor& target) {
  check_binary("tp::mse_loss", pred, target);
  TP_CHECK(pred.shape() == target.shape(), "tp::mse_loss: pred has shape ",
           to_string(pred.shape()), " but target has shape ", to_string(target.shape()),
           "; they must be equal (did you forget a view()?)");
  return mean(square(sub(pred, target)));
}

// ---- comparison helpers (not differentiable) ------------------------------------

double max_abs_diff(const Tensor& a, const Tensor& b) {
  check_defined("tp::max_abs_diff", a);
  check_defined("tp::max_abs_diff", b);
  check_same_shape("tp::max_abs_diff", a, b);
  const std::vector<double> x = a.to_vector();
  const std::vector<double> y = b.to_vector();
  double largest = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = std::abs(x[i] - y[i]);
    if (d > largest || std::isnan(d)) largest = d;  // a NaN must not hide
  }
  return largest;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  check_defined("tp::allclose", a);
  check_defined("tp::allclose", b);
  check_same_shape("tp::allclose", a, b);
  const std::vector<double> x = a.to_vector();
  const std::vector<double> y = b.to_vector();
  for (std::size_t i = 0; i < x.size(); ++i) {
    // Written so that NaN anywhere fails the comparison.
    if (!(std::abs(x[i] - y[i]) <= atol + rtol * std::abs(y[i]))) return false;
  }
  return true;
}

}  // namespace tp
