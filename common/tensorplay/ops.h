// Differentiable tensor operations: the primitives MLP training and DDP need.
//
// Contract:
//   - Every op checks its inputs and throws tp::Error naming the op and the
//     offending shapes/dtypes ("tp::add: shapes (3, 4) and (5) do not
//     broadcast; ...").
//   - Inputs must share a dtype, float32 or float64; outputs are new
//     contiguous tensors of it. A float16 or bfloat16 input is refused:
//     "tp::matmul: got a float16 tensor, but 16-bit tensors in this kit are
//     for communication ..." (tp::check_compute_dtype, tensor.h).
//   - When grad mode is on (see autograd/grad_mode.h) and an input requires
//     grad, the output gets a grad_fn whose backward rule is in ops.cc next
//     to the forward kernel it reverses.
//   - Inputs must share a device; an op given two throws ("tp::add: tensors
//     on cpu and cuda:0; move one with .to(...)"). Outputs, and the
//     gradients the backward rules make, live on the inputs' device. On CUDA
//     the op is queued on the current stream; results equal the CPU's to
//     rounding (float64 ~1e-15, float32 ~1e-7 relative), and repeat runs are
//     bit-identical (reductions add in a fixed order, without atomics).
//   - matmul runs through cblas (OpenBLAS), or cuBLAS on CUDA (plain FP32 for
//     float32, no TF32): transposed views (t()) are passed to BLAS as
//     transpose flags, never copied.
//   - max_abs_diff and allclose compare tensors on any devices (CUDA values
//     are copied to the CPU first) and of any dtypes, 16-bit ones included.
#pragma once

#include "tensorplay/tensor.h"

namespace tp {

// a is (n, k); b is (k, m); result is (n, m). GEMM through cblas_{s,d}gemm.
Tensor matmul(const Tensor& a, const Tensor& b);

// Same shapes: elementwise a + b. Bias broadcast: a is (n, m), b is (m);
// result is (n, m) with b added to every row.
Tensor add(const Tensor& a, const Tensor& b);
// Same shapes: elementwise a - b.
Tensor sub(const Tensor& a, const Tensor& b);
// Same shapes: elementwise a * b.
Tensor mul(const Tensor& a, const Tensor& b);
// Any shape: a * s.
Tensor mul(const Tensor& a, double s);
// Any shape: a / s.
Tensor div(const Tensor& a, double s);
// Any shape: max(a, 0).
Tensor relu(const Tensor& a);
// Any shape: a * a.
Tensor square(const Tensor& a);
// Any shape -> () : sum of all elements.
Tensor sum(const Tensor& a);
// (n, m) -> (m) when dim == 0; (n, m) -> (n) when dim == 1.
Tensor sum(const Tensor& a, int64_t dim);
// Any shape -> () : mean of all elements.
Tensor mean(const Tensor& a);
// pred and target are the same shape -> () : mean((pred - target)^2).
// Composed of sub, square and mean; target needs no grad.
Tensor mse_loss(const Tensor& pred, const Tensor& target);

// Not differentiable helpers for tests and checkers.
// Largest |a_i - b_i| over all elements. REQUIRES: same shape.
double max_abs_diff(const Tensor& a, const Tensor& b);
// |a_i - b_i| <= atol + rtol * |b_i| for every element.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5,
              double atol = 1e-8);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return div(a, s); }

}  // namespace tp
