// matmul on CUDA through cuBLAS (see kernels.h).
//
// cuBLAS is column-major; tensors are row-major. A row-major (r, c) matrix
// with leading dimension ld is, read column-major, its transpose (c, r) with
// the same ld. So row-major C = A @ B is column-major C^T = B^T @ A^T: call
// gemm with the operands swapped (B first), m and n swapped, and each
// operand's transpose flag exactly as the CPU path gives it to cblas with
// CblasRowMajor. A transposed view (t()) is passed as a flag, never copied.
// cuBLAS is opened on first use, not linked (cublas_library.h says why).
#include <algorithm>
#include <climits>
#include <vector>

#include "../cuda/check.h"
#include "../cuda/cublas_library.h"
#include "kernels.h"
#include "tensorplay/cuda/runtime.h"

namespace tp::cuda::kernels {
namespace {

#define TP_CUBLAS_CHECK(call)                                                         \
  do {                                                                                \
    const cublasStatus_t tp_cublas_status_ = (call);                                  \
    if (tp_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                 \
      TP_THROW(::tp::Error, "tp::cuda: ", #call, " failed: ",                         \
               cublas().status_string(tp_cublas_status_), " (",                       \
               cublas().status_name(tp_cublas_status_), ")");                         \
    }                                                                                 \
  } while (0)

// The calling thread's cuBLAS handle for `device`, created on first use.
// One per thread: a handle holds a stream and a workspace, and two threads
// setting streams on one handle would race. Handles are never destroyed:
// a thread_local destructor may run after the CUDA runtime has been torn
// down at process exit, and cublasDestroy would then fault; a handle is a
// few hundred bytes plus its workspace, once per thread that multiplies.
cublasHandle_t thread_handle(int device) {
  thread_local std::vector<cublasHandle_t> handles;
  const auto index = static_cast<std::size_t>(device);
  if (handles.size() <= index) handles.resize(index + 1, nullptr);
  if (handles[index] == nullptr) {
    cublasHandle_t handle = nullptr;
    TP_CUBLAS_CHECK(cublas().create(&handle));
    // Plain FP32 for float32: results are compared with the CPU's to float
    // rounding, and TF32 (10-bit mantissa) would be off by ~1e-3.
    TP_CUBLAS_CHECK(cublas().set_math_mode(handle, CUBLAS_DEFAULT_MATH));
    handles[index] = handle;
  }
  return handles[index];
}

// How cuBLAS should read a 2-D tensor (rows, cols): see blas_operand in
// ops.cc, whose cases this mirrors. trans false: stored row-major with rows
// ld apart; trans true: the transpose of a stored (cols, rows) matrix.
struct Operand {
  Tensor values;  // keeps the data alive (a copy when neither layout fits)
  cublasOperation_t op;
  int ld;
};

Operand operand(const Tensor& x) {
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  const int64_t s0 = x.strides()[0];
  const int64_t s1 = x.strides()[1];
  // The stride of a size-1 dim is never stepped, so it may be anything.
  if ((cols == 1 || s1 == 1) && (rows == 1 || s0 >= cols) && s0 < INT_MAX) {
    return {x, CUBLAS_OP_N, static_cast<int>(rows == 1 ? std::max<int64_t>(cols, 1) : s0)};
  }
  if ((rows == 1 || s0 == 1) && (cols == 1 || s1 >= rows) && s1 < INT_MAX) {
    return {x, CUBLAS_OP_T, static_cast<int>(cols == 1 ? std::max<int64_t>(rows, 1) : s1)};
  }
  Tensor copy = x.detach().contiguous();  // any other layout: copy once
  return {copy, CUBLAS_OP_N, static_cast<int>(std::max<int64_t>(cols, 1))};
}

}  // namespace

// a is (n, k); b is (k, m); out is (n, m) = a @ b.
Tensor matmul(const Tensor& a, const Tensor& b) {
  check_current_device("tp::matmul", a);
  check_current_device("tp::matmul", b);
  const int64_t n = a.size(0);
  const int64_t k = a.size(1);
  const int64_t m = b.size(1);
  Tensor out = empty({n, m}, a.dtype(), a.device());
  if (n == 0 || m == 0) return out;
  if (k == 0) return out.zero_();  // an empty sum is 0
  const Operand A = operand(a);
  const Operand B = operand(b);
  cublasHandle_t handle = thread_handle(a.device().index);
  // The handle may have been used on another stream since; this call's work
  // must be ordered with the rest of this thread's work.
  TP_CUBLAS_CHECK(cublas().set_stream(handle, current_stream().handle()));
  const int in = static_cast<int>(n);
  const int im = static_cast<int>(m);
  const int ik = static_cast<int>(k);
  // Column-major: out^T (m, n) = B^T (m, k) @ A^T (k, n); ldc = m.
  if (a.dtype() == kFloat32) {
    const float alpha = 1.0f;
    const float beta = 0.0f;
    TP_CUBLAS_CHECK(cublas().sgemm(handle, B.op, A.op, im, in, ik, &alpha,
                                   B.values.data_ptr<float>(), B.ld, A.values.data_ptr<float>(),
                                   A.ld, &beta, out.data_ptr<float>(), im));
  } else {
    const double alpha = 1.0;
    const double beta = 0.0;
    TP_CUBLAS_CHECK(cublas().dgemm(handle, B.op, A.op, im, in, ik, &alpha,
                                   B.values.data_ptr<double>(), B.ld, A.values.data_ptr<double>(),
                                   A.ld, &beta, out.data_ptr<double>(), im));
  }
  return out;
}

}  // namespace tp::cuda::kernels
