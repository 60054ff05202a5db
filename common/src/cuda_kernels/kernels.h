// The CUDA side of tensor.cc and ops.cc: one call per op, on CUDA tensors.
//
// Internal (not installed with the public headers). tensor.cc and ops.cc
// check their inputs as for the CPU, then, when the tensor lives on a CUDA
// device, call the function here instead of their CPU loop; no #ifdef in
// either file.
//
// Contract:
//   - Every tensor passed here lives on the calling thread's current CUDA
//     device (check_current_device() says so, naming the op, otherwise);
//     callers have already checked shapes and dtypes.
//   - Every kernel and copy is queued on tp::cuda::current_stream() and the
//     host does not wait: results are ready in stream order. Outputs are new
//     contiguous tensors on the inputs' device, allocated on that stream.
//   - Results equal the CPU kernels' (the same formula, the same rounding:
//     the kernels are compiled with --fmad=false so a * x + y is not fused),
//     except the full sum, which adds in double in a fixed tree order rather
//     than left to right: deterministic (bit-identical from run to run, on any
//     GPU: the launch configuration is a constant), but not bit-identical to
//     the CPU.
//   - Built without CUDA, kernels_unavailable.cc defines these functions to
//     throw; they are unreachable there, since no CUDA tensor can exist.
#pragma once

#include <cstdint>

#include "tensorplay/tensor.h"

namespace tp::cuda::kernels {

// Throws tp::Error naming op unless t is on the current CUDA device.
void check_current_device(const char* op, const Tensor& t);

// ---- in-place, on views with any strides (tensor.cc) ----------------------------
// dst is any shape and strides: every element = value.
void fill(const Tensor& dst, double value);
// dst and src have the same shape, any strides, any dtypes; same device.
// src must not overlap dst other than exactly (tensor.cc copies it first).
void copy(const Tensor& dst, const Tensor& src);
// dst += alpha * other; same shape and dtype, any strides.
void add_scaled(const Tensor& dst, const Tensor& other, double alpha);
// dst *= value, or dst /= value when divide (x / 3 is not x * (1/3)).
void scale(const Tensor& dst, double value, bool divide);

// ---- elementwise (ops.cc): inputs any strides, outputs contiguous --------------
enum class Unary { MulScalar, DivScalar, Relu, Square };
enum class Binary { Add, Sub, Mul, ReluGrad };  // ReluGrad(g, x) = x > 0 ? g : 0

// out[i] = f(a[i]) (scalar is s for MulScalar/DivScalar); out has a's shape.
Tensor unary(Unary op, const Tensor& a, double scalar = 0.0);
// out[i] = f(a[i], b[i]); a and b have the same shape and dtype.
Tensor binary(Binary op, const Tensor& a, const Tensor& b);
// a is (n, m); bias is (m); out is (n, m): out[i][j] = a[i][j] + bias[j].
Tensor add_bias(const Tensor& a, const Tensor& bias);

// ---- reductions and their backward (ops.cc) --------------------------------------
// a is any shape; out is (): T(sum(a) / divisor), the sum accumulated in double.
Tensor sum_all(const Tensor& a, double divisor);
// a is (n, m); out is (m) when dim == 0, (n) when dim == 1; accumulated in
// double, left to right, exactly as the CPU kernel.
Tensor sum_dim(const Tensor& a, int64_t dim);
// g is (m) when dim == 0, (n) when dim == 1; out is (n, m) with g repeated.
Tensor expand(const Tensor& g, int64_t n, int64_t m, int64_t dim);
// g is one element; out has shape, every element T(double(g) / divisor).
Tensor fill_from_scalar(const Tensor& g, const Shape& shape, double divisor);

// ---- cuBLAS (blas.cc) ----------------------------------------------------------------
// a is (n, k); b is (k, m); out is (n, m) = a @ b, through cublas{S,D}gemm.
// Transposed views go to cuBLAS as transpose flags. float32 uses plain FP32
// math (no TF32), so results match the CPU to float rounding.
Tensor matmul(const Tensor& a, const Tensor& b);

}  // namespace tp::cuda::kernels
