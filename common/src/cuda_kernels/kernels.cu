// CUDA kernels of tensor.cc and ops.cc (see kernels.h for the contract).
//
// How a kernel here reads:
//   - One thread per element, in a grid-stride loop: thread t handles
//     elements t, t + G, t + 2G, ... where G is the number of threads in the
//     grid, so any n is covered by a grid of at most kMaxBlocks blocks.
//     Indices are int64_t throughout (a tensor may exceed 2^31 elements).
//   - A view of any strides is described by a StridedView passed by value
//     (offset and up to kMaxDims strides) and the shape they share
//     (Extent). Element k in row-major order is found by peeling k's digits
//     off from the last dimension, like an odometer read backwards.
//   - Every launch goes to tp::cuda::current_stream() and is checked with
//     cudaGetLastError() right after (a bad configuration fails there; a
//     fault inside the kernel surfaces at the next synchronising call).
//   - Formulas are the CPU kernels' own, compiled with --fmad=false (see
//     common/meson.build) so that a * x + y rounds twice, as on the CPU.

#include "kernels.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "../cuda/check.h"
#include "tensorplay/cuda/runtime.h"

namespace tp::cuda::kernels {
namespace {

constexpr int kMaxDims = 8;
constexpr int kThreads = 256;           // threads per block, every kernel here
constexpr int64_t kMaxBlocks = 4096;    // grid-stride loops cover larger n
// The full sum always uses this many blocks, whatever n: the order in which
// partial sums meet depends only on n, so two runs add in the same order.
constexpr int kSumBlocks = 256;

// The geometry shared by the views of one launch: sizes of up to kMaxDims dims.
struct Extent {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
};

// Where a view's elements are: storage offset and strides, in elements.
struct StridedView {
  int64_t offset = 0;
  int64_t strides[kMaxDims] = {};
};

// ---- host helpers ----------------------------------------------------------------

cudaStream_t stream() { return current_stream().handle(); }

// Blocks for n elements: one element per thread, capped (grid-stride loop).
unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

void check_launch() { TP_CUDA_CHECK(cudaGetLastError()); }

Extent extent_of(const Tensor& t, const char* op) {
  const Shape& shape = t.shape();
  TP_CHECK(shape.size() <= static_cast<std::size_t>(kMaxDims), op, ": the tensor of shape ",
           to_string(shape), " has ", shape.size(), " dims; CUDA kernels take at most ",
           kMaxDims, " (view() it into fewer)");
  Extent e;
  e.ndim = static_cast<int>(shape.size());
  for (int d = 0; d < e.ndim; ++d) e.sizes[d] = shape[static_cast<std::size_t>(d)];
  return e;
}

StridedView view_of(const Tensor& t) {
  StridedView v;
  v.offset = t.storage_offset();
  const Strides& strides = t.strides();
  for (std::size_t d = 0; d < strides.size() && d < static_cast<std::size_t>(kMaxDims); ++d) {
    v.strides[d] = strides[d];
  }
  return v;
}

// Typed pointer to element 0 of the storage (not of the view: add offset).
// Refuses a view of a freed storage (Storage::resize_(0)), as tensor.cc does.
template <typename T>
T* storage_base(const Tensor& t) {
  TP_CHECK(!(t.storage()->is_freed() && t.numel() > 0), "tp::cuda: a ", to_string(t.shape()),
           " tensor views a storage whose bytes were freed (Storage::resize_(0)); allocate "
           "them again first");
  return static_cast<T*>(t.storage()->data());
}

// Calls f(T{}) with T = float for Float32 and T = double for Float64.
// No 16-bit case: a float16 or bfloat16 tensor cannot be made on a CUDA
// device (tensor.cc refuses it by name), so none reaches a kernel.
template <typename F>
decltype(auto) dispatch(Dtype dtype, F&& f) {
  if (dtype == Dtype::Float32) return f(float{});
  if (dtype == Dtype::Float64) return f(double{});
  TP_THROW(Error, "tp::cuda: dtype ", to_string(dtype), " has no CUDA kernels");
}

// The values of x as a contiguous tensor on its device, without history.
Tensor contiguous_values(const Tensor& x) {
  return x.is_contiguous() ? x : x.detach().contiguous();
}

// ---- device helpers ----------------------------------------------------------------

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t grid_step() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// Storage index of element k (row-major position) of a view of extent e.
__device__ __forceinline__ int64_t storage_index(const Extent& e, const StridedView& v,
                                                 int64_t k) {
  int64_t index = v.offset;
  for (int d = e.ndim - 1; d >= 0; --d) {
    const int64_t size = e.sizes[d];  // never 0: a launch needs n > 0
    index += (k % size) * v.strides[d];
    k /= size;
  }
  return index;
}

// ---- in-place kernels (any strides) ----------------------------------------------

// dst is a view of extent e (n elements): dst[k] = value.
template <typename T>
__global__ void __launch_bounds__(kThreads)
fill_kernel(T* dst, StridedView dv, Extent e, int64_t n, T value) {
  for (int64_t k = first_index(); k < n; k += grid_step()) dst[storage_index(e, dv, k)] = value;
}

// dst and src are views of extent e (n elements): dst[k] = D(src[k]).
template <typename D, typename S>
__global__ void __launch_bounds__(kThreads)
copy_kernel(D* dst, StridedView dv, const S* src, StridedView sv, Extent e, int64_t n) {
  for (int64_t k = first_index(); k < n; k += grid_step()) {
    dst[storage_index(e, dv, k)] = static_cast<D>(src[storage_index(e, sv, k)]);
  }
}

// dst and src are views of extent e (n elements): dst[k] += alpha * src[k].
template <typename T>
__global__ void __launch_bounds__(kThreads)
add_scaled_kernel(T* dst, StridedView dv, const T* src, StridedView sv, Extent e, int64_t n,
                  T alpha) {
  for (int64_t k = first_index(); k < n; k += grid_step()) {
    dst[storage_index(e, dv, k)] += alpha * src[storage_index(e, sv, k)];
  }
}

// dst is a view of extent e (n elements): dst[k] *= value, or /= when divide.
template <typename T>
__global__ void __launch_bounds__(kThreads)
scale_kernel(T* dst, StridedView dv, Extent e, int64_t n, T value, bool divide) {
  for (int64_t k = first_index(); k < n; k += grid_step()) {
    T& x = dst[storage_index(e, dv, k)];
    x = divide ? x / value : x * value;
  }
}

// ---- elementwise kernels (strided inputs, contiguous output) --------------------------

// a is a view of extent e (n elements); out is contiguous (n): out[k] = f(a[k]).
template <typename T>
__global__ void __launch_bounds__(kThreads)
unary_kernel(T* out, const T* a, StridedView av, Extent e, int64_t n, Unary op, T s) {
  for (int64_t k = first_index(); k < n; k += grid_step()) {
    const T x = a[storage_index(e, av, k)];
    T y;
    switch (op) {
      case Unary::MulScalar: y = x * s; break;
      case Unary::DivScalar: y = x / s; break;
      case Unary::Relu: y = x > 0 ? x : T(0); break;
      default: y = x * x; break;  // Unary::Square
    }
    out[k] = y;
  }
}

// a and b are views of extent e (n elements); out is contiguous (n):
// out[k] = f(a[k], b[k]).
template <typename T>
__global__ void __launch_bounds__(kThreads)
binary_kernel(T* out, const T* a, StridedView av, const T* b, StridedView bv, Extent e,
              int64_t n, Binary op) {
  for (int64_t k = first_index(); k < n; k += grid_step()) {
    const T x = a[storage_index(e, av, k)];
    const T y = b[storage_index(e, bv, k)];
    T z;
    switch (op) {
      case Binary::Add: z = x + y; break;
      case Binary::Sub: z = x - y; break;
      case Binary::Mul: z = x * y; break;
      default: z = y > 0 ? x : T(0); break;  // Binary::ReluGrad: x is the gradient
    }
    out[k] = z;
  }
}

// a is contiguous (n, m); bias is contiguous (m); out is contiguous (n, m):
// out[i][j] = a[i][j] + bias[j].
template <typename T>
__global__ void __launch_bounds__(kThreads)
add_bias_kernel(T* out, const T* a, const T* bias, int64_t n, int64_t m) {
  const int64_t total = n * m;
  for (int64_t k = first_index(); k < total; k += grid_step()) out[k] = a[k] + bias[k % m];
}

// ---- reductions ---------------------------------------------------------------------

// Adds the kThreads values of `shared` into shared[0] in a fixed tree order.
// Every thread of the block must call it.
__device__ __forceinline__ void block_sum(double* shared) {
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
}

// x is contiguous (n); partials is (gridDim.x): partials[b] = the sum, in
// double, of the elements block b's threads visit (fixed order: each thread
// left to right over its grid-stride elements, then a tree over threads).
// Launched with kSumBlocks blocks of kThreads threads.
template <typename T>
__global__ void __launch_bounds__(kThreads)
sum_partials_kernel(const T* x, int64_t n, double* partials) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  for (int64_t k = first_index(); k < n; k += grid_step()) acc += static_cast<double>(x[k]);
  shared[threadIdx.x] = acc;
  block_sum(shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// partials is (count); out is (): out = T(sum(partials) / divisor).
// Launched with one block of kThreads threads.
template <typename T>
__global__ void __launch_bounds__(kThreads)
sum_finish_kernel(const double* partials, int count, double divisor, T* out) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  for (int k = threadIdx.x; k < count; k += kThreads) acc += partials[k];
  shared[threadIdx.x] = acc;
  block_sum(shared);
  if (threadIdx.x == 0) out[0] = static_cast<T>(shared[0] / divisor);
}

// x is contiguous (n, m); y is (m) when dim == 0, (n) when dim == 1. One
// thread per output element adds its column (or row) left to right in
// double, the CPU kernel's order exactly: no atomics, bit-identical.
template <typename T>
__global__ void __launch_bounds__(kThreads)
sum_dim_kernel(const T* x, int64_t n, int64_t m, int64_t dim, T* y) {
  const int64_t count = dim == 0 ? m : n;
  for (int64_t k = first_index(); k < count; k += grid_step()) {
    double acc = 0.0;
    if (dim == 0) {
      for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(x[i * m + k]);
    } else {
      for (int64_t j = 0; j < m; ++j) acc += static_cast<double>(x[k * m + j]);
    }
    y[k] = static_cast<T>(acc);
  }
}

// g is contiguous (m) when dim == 0, (n) when dim == 1; out is contiguous
// (n, m): out[i][j] = g[j] (dim 0) or g[i] (dim 1).
template <typename T>
__global__ void __launch_bounds__(kThreads)
expand_kernel(const T* g, int64_t n, int64_t m, int64_t dim, T* out) {
  const int64_t total = n * m;
  for (int64_t k = first_index(); k < total; k += grid_step()) {
    out[k] = dim == 0 ? g[k % m] : g[k / m];
  }
}

// g is one element; out is contiguous (n): out[k] = T(double(g) / divisor).
template <typename T>
__global__ void __launch_bounds__(kThreads)
fill_from_scalar_kernel(const T* g, double divisor, int64_t n, T* out) {
  for (int64_t k = first_index(); k < n; k += grid_step()) {
    out[k] = static_cast<T>(static_cast<double>(g[0]) / divisor);
  }
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void check_current_device(const char* op, const Tensor& t) {
  const Device d = t.device();
  TP_CHECK(d.type == DeviceType::CUDA, op, ": expected a CUDA tensor, got one on ",
           to_string(d));
  const int current = current_device();
  TP_CHECK(d.index == current, op, ": the tensor is on ", to_string(d),
           " but this thread's current device is cuda:", current,
           "; call tp::cuda::set_device(", d.index,
           ") first (CUDA work runs on the current device)");
}

void fill(const Tensor& dst, double value) {
  check_current_device("tp::Tensor::fill_", dst);
  const int64_t n = dst.numel();
  if (n == 0) return;
  const Extent e = extent_of(dst, "tp::Tensor::fill_");
  dispatch(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    fill_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        storage_base<T>(dst), view_of(dst), e, n, static_cast<T>(value));
    check_launch();
  });
}

void copy(const Tensor& dst, const Tensor& src) {
  check_current_device("tp::Tensor::copy_", dst);
  check_current_device("tp::Tensor::copy_", src);
  const int64_t n = dst.numel();
  if (n == 0) return;
  const Extent e = extent_of(dst, "tp::Tensor::copy_");
  dispatch(dst.dtype(), [&](auto dst_tag) {
    using D = decltype(dst_tag);
    dispatch(src.dtype(), [&](auto src_tag) {
      using S = decltype(src_tag);
      copy_kernel<D, S><<<blocks_for(n), kThreads, 0, stream()>>>(
          storage_base<D>(dst), view_of(dst), storage_base<S>(src), view_of(src), e, n);
      check_launch();
    });
  });
}

void add_scaled(const Tensor& dst, const Tensor& other, double alpha) {
  check_current_device("tp::Tensor::add_", dst);
  check_current_device("tp::Tensor::add_", other);
  const int64_t n = dst.numel();
  if (n == 0) return;
  const Extent e = extent_of(dst, "tp::Tensor::add_");
  dispatch(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    add_scaled_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        storage_base<T>(dst), view_of(dst), storage_base<T>(other), view_of(other), e, n,
        static_cast<T>(alpha));
    check_launch();
  });
}

void scale(const Tensor& dst, double value, bool divide) {
  const char* op = divide ? "tp::Tensor::div_" : "tp::Tensor::mul_";
  check_current_device(op, dst);
  const int64_t n = dst.numel();
  if (n == 0) return;
  const Extent e = extent_of(dst, op);
  dispatch(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        storage_base<T>(dst), view_of(dst), e, n, static_cast<T>(value), divide);
    check_launch();
  });
}

namespace {

// The op's public name, for messages ("tp::relu: ...").
const char* name_of(Unary op) {
  switch (op) {
    case Unary::MulScalar: return "tp::mul";
    case Unary::DivScalar: return "tp::div";
    case Unary::Relu: return "tp::relu";
    case Unary::Square: return "tp::square";
  }
  return "tp ops";
}
const char* name_of(Binary op) {
  switch (op) {
    case Binary::Add: return "tp::add";
    case Binary::Sub: return "tp::sub";
    case Binary::Mul: return "tp::mul";
    case Binary::ReluGrad: return "tp::relu (backward)";
  }
  return "tp ops";
}

}  // namespace

Tensor unary(Unary op, const Tensor& a, double scalar) {
  const char* name = name_of(op);
  check_current_device(name, a);
  Tensor out = empty(a.shape(), a.dtype(), a.device());
  const int64_t n = a.numel();
  if (n == 0) return out;
  const Extent e = extent_of(a, name);
  dispatch(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    unary_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        out.data_ptr<T>(), storage_base<T>(a), view_of(a), e, n, op, static_cast<T>(scalar));
    check_launch();
  });
  return out;
}

Tensor binary(Binary op, const Tensor& a, const Tensor& b) {
  const char* name = name_of(op);
  check_current_device(name, a);
  check_current_device(name, b);
  Tensor out = empty(a.shape(), a.dtype(), a.device());
  const int64_t n = a.numel();
  if (n == 0) return out;
  const Extent e = extent_of(a, name);
  dispatch(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    binary_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        out.data_ptr<T>(), storage_base<T>(a), view_of(a), storage_base<T>(b), view_of(b), e,
        n, op);
    check_launch();
  });
  return out;
}

Tensor add_bias(const Tensor& a, const Tensor& bias) {
  check_current_device("tp::add", a);
  check_current_device("tp::add", bias);
  const Tensor av = contiguous_values(a);
  const Tensor bv = contiguous_values(bias);
  const int64_t n = a.size(0);
  const int64_t m = a.size(1);
  Tensor out = empty({n, m}, a.dtype(), a.device());
  if (n * m == 0) return out;
  dispatch(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    add_bias_kernel<T><<<blocks_for(n * m), kThreads, 0, stream()>>>(
        out.data_ptr<T>(), av.data_ptr<T>(), bv.data_ptr<T>(), n, m);
    check_launch();
  });
  return out;
}

Tensor sum_all(const Tensor& a, double divisor) {
  check_current_device("tp::sum", a);
  const Tensor av = contiguous_values(a);
  const int64_t n = a.numel();
  Tensor out = empty({}, a.dtype(), a.device());
  // Freed (stream-ordered) when it goes out of scope, after both kernels.
  Tensor partials = empty({kSumBlocks}, kFloat64, a.device());
  dispatch(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    sum_partials_kernel<T><<<kSumBlocks, kThreads, 0, stream()>>>(
        av.data_ptr<T>(), n, partials.data_ptr<double>());
    check_launch();
    sum_finish_kernel<T><<<1, kThreads, 0, stream()>>>(partials.data_ptr<double>(), kSumBlocks,
                                                       divisor, out.data_ptr<T>());
    check_launch();
  });
  return out;
}

Tensor sum_dim(const Tensor& a, int64_t dim) {
  check_current_device("tp::sum", a);
  const Tensor av = contiguous_values(a);
  const int64_t n = a.size(0);
  const int64_t m = a.size(1);
  const int64_t count = dim == 0 ? m : n;
  Tensor out = empty({count}, a.dtype(), a.device());
  if (count == 0) return out;
  dispatch(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    sum_dim_kernel<T><<<blocks_for(count), kThreads, 0, stream()>>>(av.data_ptr<T>(), n, m, dim,
                                                                    out.data_ptr<T>());
    check_launch();
  });
  return out;
}

Tensor expand(const Tensor& g, int64_t n, int64_t m, int64_t dim) {
  check_current_device("tp::sum (backward)", g);
  const Tensor gv = contiguous_values(g);
  Tensor out = empty({n, m}, g.dtype(), g.device());
  if (n * m == 0) return out;
  dispatch(g.dtype(), [&](auto tag) {
    using T = decltype(tag);
    expand_kernel<T><<<blocks_for(n * m), kThreads, 0, stream()>>>(gv.data_ptr<T>(), n, m, dim,
                                                                  out.data_ptr<T>());
    check_launch();
  });
  return out;
}

Tensor fill_from_scalar(const Tensor& g, const Shape& shape, double divisor) {
  check_current_device("tp::sum/mean (backward)", g);
  TP_CHECK(g.numel() == 1, "tp::sum/mean (backward): the gradient of a scalar has ", g.numel(),
           " elements (shape ", to_string(g.shape()), "); expected one");
  Tensor out = empty(shape, g.dtype(), g.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  dispatch(g.dtype(), [&](auto tag) {
    using T = decltype(tag);
    fill_from_scalar_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(
        g.data_ptr<T>(), divisor, n, out.data_ptr<T>());
    check_launch();
  });
  return out;
}

}  // namespace tp::cuda::kernels
