// tp::Tensor: storage, views, in-place ops, factories and printing.
//
// The pieces, in file order:
//   1. dtype/device/shape helpers and Storage (64-byte aligned bytes);
//   2. two tools every method below uses: dispatch() picks the C++ element
//      type for a Dtype (dispatch_compute() only float and double, refusing
//      the 16-bit types), and for_each_index() walks the elements of a
//      strided view in row-major order;
//   3. the backward rules of the differentiable views (ViewBackward,
//      NarrowBackward, TBackward) and of clone();
//   4. Tensor's methods and the factories.
// The math ops (matmul, add, ...) live in ops.cc; Tensor::matmul & co. forward
// there. The autograd engine lives in autograd/engine.cc.
//
// CUDA tensors: each method that touches values checks where the tensor
// lives and, on a CUDA device, calls its counterpart in cuda_kernels/kernels.h (one
// strided kernel family, compiled by nvcc) instead of the CPU loop. Reading
// values on the host (item, to_vector, to_string, norm) copies to the CPU
// first.

#include "tensorplay/tensor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <new>
#include <sstream>
#include <type_traits>
#include <utility>

#include "tensorplay/autograd/engine.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/autograd/node.h"
#include "tensorplay/cuda/runtime.h"
#include "tensorplay/ops.h"

#include "cuda_kernels/kernels.h"
#include "half_bulk.h"
#include "host_memory.h"

namespace tp {

// ---- dtype, device, shape ---------------------------------------------------

std::string to_string(Dtype dtype) {
  switch (dtype) {
    case Dtype::Float32: return "float32";
    case Dtype::Float64: return "float64";
    case Dtype::Float16: return "float16";
    case Dtype::BFloat16: return "bfloat16";
  }
  return "unknown dtype";
}

std::size_t element_size(Dtype dtype) {
  switch (dtype) {
    case Dtype::Float32: return sizeof(float);
    case Dtype::Float64: return sizeof(double);
    case Dtype::Float16: return sizeof(Half);
    case Dtype::BFloat16: return sizeof(BFloat16);
  }
  TP_THROW(Error, "tp::element_size: unknown dtype ", static_cast<int>(dtype));
}

bool is_16bit(Dtype dtype) { return dtype == Dtype::Float16 || dtype == Dtype::BFloat16; }

void check_compute_dtype(const char* op, Dtype dtype) {
  TP_CHECK(!is_16bit(dtype), op, ": got a ", to_string(dtype), " tensor, but 16-bit tensors "
           "in this kit are for communication (DDP's fp16/bf16 compression hooks): they can "
           "be converted, filled, scaled with mul_/div_ and sent, not computed with. Compute "
           "in float32: convert with .to(tp::kFloat32) first");
}

std::string to_string(Device device) {
  if (device.type == DeviceType::CPU) return "cpu";
  if (device.index < 0) return "cuda";
  return detail::cat("cuda:", device.index);
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return kCPU;
  if (text == "cuda") return Device{DeviceType::CUDA, -1};
  const std::string prefix = "cuda:";
  if (text.size() > prefix.size() && text.compare(0, prefix.size(), prefix) == 0) {
    const std::string digits = text.substr(prefix.size());
    bool all_digits = digits.size() <= 4;
    for (char c : digits) all_digits = all_digits && c >= '0' && c <= '9';
    if (all_digits) return Device{DeviceType::CUDA, std::stoi(digits)};
  }
  TP_THROW(Error, "tp::parse_device: '", text, "' is not a device; write cpu, cuda or cuda:N");
}

std::string to_string(const Shape& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + ")";
}

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t size : shape) n *= size;
  return n;
}

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t stride = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

// ---- Storage ----------------------------------------------------------------

Storage::Storage(std::size_t nbytes, Device device)
    : data_(nullptr), nbytes_(0), device_(device), memory_kind_(memory::current_kind()) {
  if (device.type == DeviceType::CPU) {
    device_ = kCPU;  // one spelling of the CPU, so == compares devices
  } else {
    TP_CHECK(cuda::is_available(), "tp::Storage: ", tp::to_string(device),
             " requested, but ", cuda::unavailable_reason());
    const int current = cuda::current_device();
    device_ = Device{DeviceType::CUDA, device.index < 0 ? current : device.index};
  }
  allocate(nbytes);
}

Storage::~Storage() { release(); }

void Storage::allocate(std::size_t nbytes) {
  if (device_.type == DeviceType::CPU) {
    data_ = detail::host_allocate(nbytes);  // Note [Keeping freed pages]
  } else {
    // Memory is ordered on the current stream, which belongs to the current
    // device: allocating for another device would need a stream of that one.
    const int current = cuda::current_device();
    TP_CHECK(device_.index == current, "tp::Storage: cuda:", device_.index,
             " requested while this thread's current device is cuda:", current,
             "; call tp::cuda::set_device(", device_.index, ") first");
    const cuda::Allocation allocation = cuda::allocate(nbytes);  // 256-byte aligned
    data_ = allocation.data;
    cuda_stream_ = allocation.stream;
  }
  nbytes_ = nbytes;
  // Counted once the bytes exist: a failed allocation counts nothing.
  memory::detail::record_allocation(memory_kind_, nbytes_);
}

void Storage::release() {
  if (freed_) return;  // resize_(0) already did
  memory::detail::record_free(memory_kind_, nbytes_);
  if (device_.type == DeviceType::CPU) {
    detail::host_free(data_);
  } else {
    cuda::deallocate({data_, cuda_stream_, device_.index});
  }
  data_ = nullptr;
  nbytes_ = 0;
  freed_ = true;
}

void Storage::resize_(std::size_t nbytes) {
  if (nbytes == 0) {
    release();
    return;
  }
  TP_CHECK(freed_, "tp::Storage::resize_: asked for ", nbytes, " bytes while ", nbytes_,
           " are live; free them first (resize_(0)): growing live bytes in place would move "
           "them under every view");
  allocate(nbytes);
  freed_ = false;
}

void Storage::set_memory_kind(memory::Kind kind) {
  memory::detail::record_move(memory_kind_, kind, nbytes_);
  memory_kind_ = kind;
}

// ---- the two tools: dtype dispatch and strided iteration -----------------------

namespace {

// Calls f(T{}) with T the element type of dtype (float, double, Half or
// BFloat16), so one generic lambda serves every dtype:
//   dispatch(dtype, [&](auto tag) { using T = decltype(tag); ... });
// For the methods that only move, convert or scale values. The lambda
// converts with convert<D>() and computes in OpMath<T>, since Half and
// BFloat16 have no arithmetic.
template <typename F>
decltype(auto) dispatch(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::Float32: return f(float{});
    case Dtype::Float64: return f(double{});
    case Dtype::Float16: return f(Half{});
    case Dtype::BFloat16: return f(BFloat16{});
  }
  TP_THROW(Error, "tp::Tensor: unknown dtype ", static_cast<int>(dtype));
}

// dispatch() for the methods that compute (add_, norm): float and double
// only; a 16-bit dtype is refused by check_compute_dtype, naming op.
template <typename F>
decltype(auto) dispatch_compute(Dtype dtype, const char* op, F&& f) {
  check_compute_dtype(op, dtype);
  if (dtype == Dtype::Float32) return f(float{});
  return f(double{});
}

template <typename T>
constexpr bool is_16bit_type = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// The type T's values are computed in: float for the 16-bit types (as
// PyTorch's at::opmath_type), T itself otherwise.
template <typename T>
using OpMath = std::conditional_t<is_16bit_type<T>, float, T>;

// x converted to D, rounded once where D is narrower: a 16-bit x widens to
// float first, which is exact (half.h), and the same type is copied as is.
template <typename D, typename S>
D convert(S x) {
  if constexpr (std::is_same_v<D, S>) {
    return x;
  } else if constexpr (is_16bit_type<S>) {
    return D(static_cast<float>(x));
  } else {
    return static_cast<D>(x);
  }
}

// True when strides lay shape out densely in row-major order (dimensions of
// size 1 may have any stride), as Tensor::is_contiguous() says.
bool row_major(const Shape& shape, const Strides& strides) {
  int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

// Calls f(ia, ib) for every element of two views of the same shape, in
// row-major order; ia and ib are the elements' indices into their storages
// (storage offset plus sum of index * stride). Works for any strides, which
// is what lets in-place ops write through narrow() and t() views.
//
// Two dense row-major views (the usual case: gradients, DDP buckets and
// their slots) take one flat loop with unit strides, which the compiler
// vectorises; copying a bucket's slots runs at memcpy speed. Otherwise, an
// odometer over the outer dimensions, with a tight loop over the last.
template <typename F>
void for_each_index_pair(const Shape& shape, const Strides& sa, int64_t oa,
                         const Strides& sb, int64_t ob, F&& f) {
  const int64_t n = numel_of(shape);
  if (n == 0) return;
  if (shape.empty()) {  // a scalar: one element
    f(oa, ob);
    return;
  }
  if (row_major(shape, sa) && row_major(shape, sb)) {
    for (int64_t k = 0; k < n; ++k) f(oa + k, ob + k);
    return;
  }
  const std::size_t d = shape.size();
  const int64_t inner = shape[d - 1];
  const int64_t inner_a = sa[d - 1];
  const int64_t inner_b = sb[d - 1];
  std::vector<int64_t> index(d, 0);  // position in the outer dims (d-1 unused)
  int64_t ia = oa;
  int64_t ib = ob;
  for (int64_t done = 0; done < n; done += inner) {
    for (int64_t j = 0; j < inner; ++j) f(ia + j * inner_a, ib + j * inner_b);
    // Advance the odometer: bump the last outer dim, carrying leftwards.
    for (std::size_t k = d - 1; k-- > 0;) {
      ia += sa[k];
      ib += sb[k];
      if (++index[k] < shape[k]) break;
      ia -= sa[k] * shape[k];
      ib -= sb[k] * shape[k];
      index[k] = 0;
    }
  }
}

// One view: f(i) for every element's storage index, in row-major order.
template <typename F>
void for_each_index(const TensorImpl& t, F&& f) {
  for_each_index_pair(t.shape, t.strides, t.offset, t.strides, t.offset,
                      [&](int64_t i, int64_t) { f(i); });
}

// A view of a freed storage (Storage::resize_(0)) has nothing to read or
// write: what it names, and the usual reason.
[[noreturn]] void throw_freed_storage(const TensorImpl& t, const char* fn) {
  TP_THROW(Error, fn, ": a ", tp::to_string(t.shape), " ", tp::to_string(t.dtype),
           " tensor views a storage whose bytes were freed (Storage::resize_(0)), so there "
           "is nothing to read or write; allocate them again first (FSDP frees a unit's "
           "gathered parameters after use and gathers them again before the next: use "
           "summon_full_params() to read them in between)");
}

bool views_freed_storage(const TensorImpl& t) {
  return t.storage->is_freed() && numel_of(t.shape) > 0;
}

// Typed pointer to element 0 of the storage (not of the view: add offset).
// Throws for a view of a freed storage.
template <typename T>
T* storage_base(const TensorImpl& t) {
  if (views_freed_storage(t)) throw_freed_storage(t, "tp::Tensor");
  return static_cast<T*>(t.storage->data());
}

bool on_cuda(const TensorImpl& t) { return t.storage->device().type == DeviceType::CUDA; }

// Throws unless a tensor on `device` can be made here: names fn (the factory
// or op that asked) and, for CUDA, why CUDA cannot be used.
void check_device_usable(Device device, const char* fn) {
  if (device.type == DeviceType::CPU) return;
  TP_CHECK(cuda::is_available(), fn, ": a tensor on ", tp::to_string(device),
           " was requested, but ", cuda::unavailable_reason());
}

// device with index -1 made concrete (the current CUDA device).
Device resolve(Device device, const char* fn) {
  if (device.type == DeviceType::CPU) return kCPU;
  check_device_usable(device, fn);
  if (device.index < 0) device.index = cuda::current_device();
  return device;
}

// Throws unless a tensor of dtype may live on device: the kit's CUDA path
// (cuda_kernels/kernels.h, cuBLAS, the Gloo staging) runs float32 and float64 only,
// so 16-bit tensors stay on the CPU. Checked before check_device_usable, so
// the message is the same in a build without CUDA.
void check_dtype_on_device(Dtype dtype, Device device, const char* fn) {
  TP_CHECK(device.type == DeviceType::CPU || !is_16bit(dtype), fn, ": a ", to_string(dtype),
           " tensor on ", tp::to_string(device), " was requested, but the kit's CUDA path "
           "runs float32 and float64 only; keep 16-bit tensors on the CPU (.cpu() first), "
           "or compute on the GPU in float32");
}

// Uninitialized contiguous tensor; fn names the factory for messages.
Tensor make_empty(const Shape& shape, Dtype dtype, Device device, const char* fn) {
  for (int64_t size : shape) {
    TP_CHECK(size >= 0, fn, ": negative size ", size, " in shape ", tp::to_string(shape));
  }
  check_dtype_on_device(dtype, device, fn);
  check_device_usable(device, fn);
  const int64_t n = numel_of(shape);
  auto impl = std::make_shared<TensorImpl>();
  const std::size_t nbytes = static_cast<std::size_t>(n) * element_size(dtype);
  try {
    impl->storage = std::make_shared<Storage>(nbytes, device);
  } catch (const std::bad_alloc&) {
    // std::bad_alloc says nothing of what was asked for; this does.
    char gib[32];
    std::snprintf(gib, sizeof gib, "%.1f GiB", static_cast<double>(nbytes) / (1 << 30));
    TP_THROW(Error, fn, ": out of memory: could not allocate ", nbytes, " bytes (", gib,
             ") for a ", to_string(dtype),
             " tensor of shape ", tp::to_string(shape), " on ", tp::to_string(device),
             "; lower what makes it large (the batch size, the model's width or depth) or the "
             "number of ranks sharing this machine's memory");
  }
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

const TensorImpl& checked(const Tensor& t, const char* fn) {
  TP_CHECK(t.defined(), fn,
           ": called on an undefined tensor (a default-constructed tp::Tensor); "
           "create it with a factory such as tp::zeros first");
  return *t.impl();
}

// checked() for the in-place ops. Writing into a leaf that requires grad while
// grad mode is on would change a parameter behind autograd's back (a graph
// built from it would differentiate the old values), so it is refused, as
// PyTorch refuses it; optimizers and DDP's broadcast write under NoGradGuard.
const TensorImpl& checked_for_write(const Tensor& t, const char* fn) {
  const TensorImpl& impl = checked(t, fn);
  TP_CHECK(!(impl.requires_grad && !impl.grad_fn && autograd::is_grad_enabled()), fn,
           ": writes into a leaf that requires grad while grad mode is on; wrap the "
           "update in tp::NoGradGuard (as optimizers do) or write into detach()");
  return impl;
}

// Resolves a possibly negative dim against ndim, or throws naming fn.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* fn, const Shape& shape) {
  const int64_t wrapped = dim < 0 ? dim + ndim : dim;
  TP_CHECK(wrapped >= 0 && wrapped < ndim, fn, ": dimension ", dim,
           " is out of range for a tensor of shape ", tp::to_string(shape), " (",
           ndim, " dims); use 0..", ndim - 1, " or -", ndim, "..-1");
  return wrapped;
}

// A new handle on the same storage with the given geometry and no history.
Tensor make_view(const TensorImpl& base, Shape shape, Strides strides,
                 int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage;
  impl->offset = offset;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = base.dtype;
  return Tensor(std::move(impl));
}

// True when an op on `input` should record a backward node.
bool should_record(const Tensor& input) {
  return autograd::is_grad_enabled() && input.requires_grad();
}

// Makes node the grad_fn of out, with input as its one next function.
void record(const Tensor& out, std::shared_ptr<autograd::Node> node,
            const Tensor& input) {
  node->add_next(input);
  out.impl()->grad_fn = std::move(node);
  out.impl()->requires_grad = true;
}

// ---- backward rules of views and copies -----------------------------------------
// Each runs with grad mode off (the engine turns it off).

// Forward: out = input.view(shape)   (same elements, new shape)
// Backward: grad_input = grad_out reshaped back to input's shape. grad_out
// may be a non-contiguous view itself (from TBackward), hence contiguous().
class ViewBackward : public autograd::Node {
 public:
  explicit ViewBackward(Shape input_shape) : input_shape_(std::move(input_shape)) {}
  std::string name() const override { return "ViewBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    return {grad_out.contiguous().view(input_shape_)};
  }

 private:
  Shape input_shape_;
};

// Forward: out = input.narrow(dim, start, length)
// Backward: grad_input is zero everywhere except the narrowed slice, which
// gets grad_out: the elements outside the slice did not reach the output.
class NarrowBackward : public autograd::Node {
 public:
  NarrowBackward(Shape input_shape, Dtype dtype, int64_t dim, int64_t start)
      : input_shape_(std::move(input_shape)), dtype_(dtype), dim_(dim), start_(start) {}
  std::string name() const override { return "NarrowBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    Tensor grad_input = zeros(input_shape_, dtype_, grad_out.device());
    grad_input.narrow(dim_, start_, grad_out.size(dim_)).copy_(grad_out);
    return {grad_input};
  }

 private:
  Shape input_shape_;
  Dtype dtype_;
  int64_t dim_;
  int64_t start_;
};

// Forward: out = input.t()
// Backward: grad_input = grad_out.t()   (a view again; no copy)
class TBackward : public autograd::Node {
 public:
  std::string name() const override { return "TBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    return {grad_out.t()};
  }
};

// Forward: out = input.to(device)   (the same values on another device)
// Backward: grad_input = grad_out.to(input's device)
class ToDeviceBackward : public autograd::Node {
 public:
  explicit ToDeviceBackward(Device input_device) : input_device_(input_device) {}
  std::string name() const override { return "ToDeviceBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    return {grad_out.to(input_device_)};
  }

 private:
  Device input_device_;
};

// Forward: out = input.to(dtype)   (the values converted, float32 <-> float64)
// Backward: grad_input = grad_out.to(input's dtype)
class ToDtypeBackward : public autograd::Node {
 public:
  explicit ToDtypeBackward(Dtype input_dtype) : input_dtype_(input_dtype) {}
  std::string name() const override { return "ToDtypeBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override {
    return {grad_out.to(input_dtype_)};
  }

 private:
  Dtype input_dtype_;
};

// Forward: out = input.clone()   (also contiguous() when it copies)
// Backward: grad_input = grad_out   (a copy does not change values)
class CloneBackward : public autograd::Node {
 public:
  std::string name() const override { return "CloneBackward"; }
  std::vector<Tensor> apply(const Tensor& grad_out) override { return {grad_out}; }
};

}  // namespace

// ---- RemovableHandle ------------------------------------------------------------

RemovableHandle::RemovableHandle(RemovableHandle&& other) noexcept
    : owner_(std::move(other.owner_)), id_(std::exchange(other.id_, 0)) {}

RemovableHandle& RemovableHandle::operator=(RemovableHandle&& other) noexcept {
  if (this != &other) {
    remove();  // this handle's own hook goes first, as unique_ptr frees its object
    owner_ = std::move(other.owner_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

void RemovableHandle::remove() noexcept {
  std::shared_ptr<TensorImpl> owner = owner_.lock();
  owner_.reset();
  if (!owner) return;  // already removed, moved from, or the tensor is gone
  auto& hooks = owner->post_accumulate_grad_hooks;
  std::erase_if(hooks, [&](const auto& entry) { return entry.first == id_; });
}

// ---- metadata ---------------------------------------------------------------------

const Shape& Tensor::shape() const { return checked(*this, "tp::Tensor::shape").shape; }
const Strides& Tensor::strides() const {
  return checked(*this, "tp::Tensor::strides").strides;
}
int64_t Tensor::dim() const {
  return static_cast<int64_t>(checked(*this, "tp::Tensor::dim").shape.size());
}
int64_t Tensor::size(int64_t d) const {
  const TensorImpl& t = checked(*this, "tp::Tensor::size");
  const int64_t ndim = static_cast<int64_t>(t.shape.size());
  return t.shape[wrap_dim(d, ndim, "tp::Tensor::size", t.shape)];
}
int64_t Tensor::numel() const { return numel_of(checked(*this, "tp::Tensor::numel").shape); }
Dtype Tensor::dtype() const { return checked(*this, "tp::Tensor::dtype").dtype; }
Device Tensor::device() const {
  return checked(*this, "tp::Tensor::device").storage->device();
}
int64_t Tensor::storage_offset() const {
  return checked(*this, "tp::Tensor::storage_offset").offset;
}
std::size_t Tensor::element_size() const {
  return tp::element_size(checked(*this, "tp::Tensor::element_size").dtype);
}
std::size_t Tensor::nbytes() const {
  return static_cast<std::size_t>(numel()) * element_size();
}

// Contiguous means: the elements fill [offset, offset + numel) in row-major
// order. Like PyTorch, the stride of a size-1 dim does not matter (it is
// never stepped), and an empty tensor is contiguous.
bool Tensor::is_contiguous() const {
  const TensorImpl& t = checked(*this, "tp::Tensor::is_contiguous");
  return numel_of(t.shape) == 0 || row_major(t.shape, t.strides);
}

const std::shared_ptr<Storage>& Tensor::storage() const {
  return checked(*this, "tp::Tensor::storage").storage;
}

bool Tensor::is_alias_of(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}

// ---- data access ------------------------------------------------------------------

void* Tensor::data_ptr() const {
  const TensorImpl& t = checked(*this, "tp::Tensor::data_ptr");
  if (views_freed_storage(t)) throw_freed_storage(t, "tp::Tensor::data_ptr");
  return static_cast<char*>(t.storage->data()) +
         t.offset * static_cast<int64_t>(tp::element_size(t.dtype));
}

namespace {
template <typename T> constexpr Dtype dtype_of();
template <> constexpr Dtype dtype_of<float>() { return kFloat32; }
template <> constexpr Dtype dtype_of<double>() { return kFloat64; }
template <> constexpr Dtype dtype_of<Half>() { return kFloat16; }
template <> constexpr Dtype dtype_of<BFloat16>() { return kBFloat16; }

// The element type's name in C++, for data_ptr's message.
const char* cpp_type_of(Dtype dtype) {
  switch (dtype) {
    case Dtype::Float32: return "float";
    case Dtype::Float64: return "double";
    case Dtype::Float16: return "tp::Half";
    case Dtype::BFloat16: return "tp::BFloat16";
  }
  return "?";
}
}  // namespace

template <typename T>
T* Tensor::data_ptr() const {
  const TensorImpl& t = checked(*this, "tp::Tensor::data_ptr");
  TP_CHECK(t.dtype == dtype_of<T>(), "tp::Tensor::data_ptr<",
           tp::to_string(dtype_of<T>()), ">: the tensor's dtype is ",
           tp::to_string(t.dtype), "; use data_ptr<", cpp_type_of(t.dtype),
           ">() or convert with .to()");
  return storage_base<T>(t) + t.offset;
}

template float* Tensor::data_ptr<float>() const;
template double* Tensor::data_ptr<double>() const;
template Half* Tensor::data_ptr<Half>() const;
template BFloat16* Tensor::data_ptr<BFloat16>() const;

double Tensor::item() const {
  const TensorImpl& t = checked(*this, "tp::Tensor::item");
  const int64_t n = numel_of(t.shape);
  TP_CHECK(n == 1, "tp::Tensor::item: the tensor has ", n, " elements (shape ",
           tp::to_string(t.shape), "); item() needs exactly one. Reduce it first, "
           "e.g. with sum() or mean()");
  if (on_cuda(t)) return detach().cpu().item();
  return dispatch(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    return static_cast<double>(storage_base<T>(t)[t.offset]);
  });
}

std::vector<double> Tensor::to_vector() const {
  const TensorImpl& t = checked(*this, "tp::Tensor::to_vector");
  if (on_cuda(t)) return detach().cpu().to_vector();
  std::vector<double> values;
  values.reserve(static_cast<std::size_t>(numel_of(t.shape)));
  dispatch(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* base = storage_base<T>(t);
    for_each_index(t, [&](int64_t i) { values.push_back(static_cast<double>(base[i])); });
  });
  return values;
}

// ---- views --------------------------------------------------------------------------

Tensor Tensor::view(Shape shape) const {
  const TensorImpl& t = checked(*this, "tp::Tensor::view");
  TP_CHECK(is_contiguous(), "tp::Tensor::view: the tensor of shape ",
           tp::to_string(t.shape), " and strides ", tp::to_string(t.strides),
           " is not contiguous, so no view of shape ", tp::to_string(shape),
           " can alias it; call contiguous() first (which copies)");
  // Resolve one -1 from the remaining sizes.
  const int64_t n = numel_of(t.shape);
  int64_t known = 1;
  int64_t infer_at = -1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TP_CHECK(infer_at < 0, "tp::Tensor::view: shape ", tp::to_string(shape),
               " has more than one -1; only one size can be inferred");
      infer_at = static_cast<int64_t>(i);
    } else {
      TP_CHECK(shape[i] >= 0, "tp::Tensor::view: invalid size ", shape[i],
               " in shape ", tp::to_string(shape));
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    TP_CHECK(known != 0 && n % known == 0, "tp::Tensor::view: shape ",
             tp::to_string(shape), " is invalid for a tensor of ", n,
             " elements (shape ", tp::to_string(t.shape), ")");
    shape[static_cast<std::size_t>(infer_at)] = n / known;
  }
  TP_CHECK(numel_of(shape) == n, "tp::Tensor::view: shape ", tp::to_string(shape),
           " has ", numel_of(shape), " elements but the tensor of shape ",
           tp::to_string(t.shape), " has ", n, "; a view keeps the element count");

  Strides strides = contiguous_strides(shape);
  Tensor out = make_view(t, std::move(shape), std::move(strides), t.offset);
  if (should_record(*this)) record(out, std::make_shared<ViewBackward>(t.shape), *this);
  return out;
}

Tensor Tensor::flatten() const { return view({numel()}); }

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  const TensorImpl& t = checked(*this, "tp::Tensor::narrow");
  const int64_t ndim = static_cast<int64_t>(t.shape.size());
  const int64_t d = wrap_dim(dim, ndim, "tp::Tensor::narrow", t.shape);
  const int64_t size = t.shape[static_cast<std::size_t>(d)];
  TP_CHECK(start >= 0 && length >= 0 && start + length <= size,
           "tp::Tensor::narrow: range [", start, ", ", start + length,
           ") is out of bounds for dimension ", d, " of size ", size,
           " (shape ", tp::to_string(t.shape), "); need 0 <= start and start + "
           "length <= ", size);

  Shape shape = t.shape;
  shape[static_cast<std::size_t>(d)] = length;
  const int64_t offset = t.offset + start * t.strides[static_cast<std::size_t>(d)];
  Tensor out = make_view(t, std::move(shape), t.strides, offset);
  if (should_record(*this)) {
    record(out, std::make_shared<NarrowBackward>(t.shape, t.dtype, d, start), *this);
  }
  return out;
}

Tensor Tensor::t() const {
  const TensorImpl& self = checked(*this, "tp::Tensor::t");
  TP_CHECK(self.shape.size() == 2, "tp::Tensor::t: expects a 2-D tensor, got shape ",
           tp::to_string(self.shape), "; use view() to make a matrix first");
  Tensor out = make_view(self, {self.shape[1], self.shape[0]},
                         {self.strides[1], self.strides[0]}, self.offset);
  if (should_record(*this)) record(out, std::make_shared<TBackward>(), *this);
  return out;
}

// ---- copies ---------------------------------------------------------------------------

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  const TensorImpl& t = checked(*this, "tp::Tensor::clone");
  Tensor out = make_empty(t.shape, t.dtype, t.storage->device(), "tp::Tensor::clone");
  out.copy_(*this);  // copy_ records nothing
  if (should_record(*this)) record(out, std::make_shared<CloneBackward>(), *this);
  return out;
}

Tensor Tensor::detach() const {
  const TensorImpl& t = checked(*this, "tp::Tensor::detach");
  return make_view(t, t.shape, t.strides, t.offset);
}

Tensor Tensor::to(Dtype dtype) const {
  const TensorImpl& t = checked(*this, "tp::Tensor::to");
  Tensor out = make_empty(t.shape, dtype, t.storage->device(), "tp::Tensor::to");
  out.copy_(*this);  // copy_ records nothing
  // Only between the dtypes ops compute in: nothing computes on a 16-bit
  // result, so it needs no way back.
  if (!is_16bit(t.dtype) && !is_16bit(dtype) && should_record(*this)) {
    record(out, std::make_shared<ToDtypeBackward>(t.dtype), *this);
  }
  return out;
}

Tensor Tensor::to(Device device) const {
  const TensorImpl& t = checked(*this, "tp::Tensor::to");
  check_dtype_on_device(t.dtype, device, "tp::Tensor::to");
  const Device target = resolve(device, "tp::Tensor::to");
  if (target == t.storage->device()) return *this;
  Tensor out = make_empty(t.shape, t.dtype, target, "tp::Tensor::to");
  out.copy_(*this);  // copy_ records nothing
  if (should_record(*this)) {
    record(out, std::make_shared<ToDeviceBackward>(t.storage->device()), *this);
  }
  return out;
}

Tensor Tensor::cpu() const { return to(kCPU); }
Tensor Tensor::cuda() const { return to(Device{DeviceType::CUDA, -1}); }

// ---- in-place -------------------------------------------------------------------------

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::fill_(double value) {
  const TensorImpl& t = checked_for_write(*this, "tp::Tensor::fill_");
  if (on_cuda(t)) {
    cuda::kernels::fill(*this, value);
    return *this;
  }
  dispatch(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* base = storage_base<T>(t);
    const T v = static_cast<T>(value);
    for_each_index(t, [&](int64_t i) { base[i] = v; });
  });
  return *this;
}

// The tensor to read from when writing into dst: src itself, or a private
// copy of it when src is another view of dst's storage (a.add_(a.t())).
// Elements are read and written in one pass, so a source that overlaps the
// destination would otherwise be read after it was overwritten.
static Tensor unaliased_source(const TensorImpl& dst, const Tensor& src) {
  const TensorImpl& s = *src.impl();
  const bool same_view = s.offset == dst.offset && s.strides == dst.strides;
  return s.storage == dst.storage && !same_view ? src.detach().clone() : src;
}

// copy_ between two devices (at least one a CUDA device). The bytes cross
// in one tp::cuda::copy_async between two contiguous tensors of one dtype,
// the wire dtype: dst's, except that a 16-bit dst (on the CPU: no CUDA
// tensor is 16-bit) takes src's dtype across and converts on the CPU. src
// is converted (and made contiguous) on its own device first; the bytes
// land in dst itself when it is contiguous and of the wire dtype, else in a
// staging tensor on dst's device that is then copied into the view. The
// host waits for the stream, as PyTorch's blocking copy does: a CPU
// destination is then readable, and a CPU source (which cudaMemcpyAsync may
// still read) free to change or die.
static void copy_across_devices(Tensor& dst, const Tensor& src) {
  // The copy is ordered on the current device's stream: the CUDA side must
  // be on that device, as for every kernel.
  if (dst.device().type == DeviceType::CUDA) cuda::kernels::check_current_device("tp::Tensor::copy_", dst);
  if (src.device().type == DeviceType::CUDA) cuda::kernels::check_current_device("tp::Tensor::copy_", src);
  const Dtype wire = is_16bit(dst.dtype()) ? src.dtype() : dst.dtype();
  const Tensor packed = src.dtype() == wire && src.is_contiguous()
                            ? src.detach()
                            : src.detach().to(wire);
  const Tensor landing = dst.is_contiguous() && dst.dtype() == wire
                             ? dst.detach()
                             : make_empty(dst.shape(), wire, dst.device(),
                                          "tp::Tensor::copy_");
  cuda::copy_async(landing.data_ptr(), packed.data_ptr(), landing.nbytes());
  cuda::current_stream().synchronize();
  if (landing.is_alias_of(dst)) {
    dst.storage()->count_bytes_copied_in(dst.nbytes());
  } else {
    dst.copy_(landing);  // same device now; counts the bytes
  }
}

Tensor& Tensor::copy_(const Tensor& source) {
  const TensorImpl& dst = checked_for_write(*this, "tp::Tensor::copy_");
  TP_CHECK(source.defined(), "tp::Tensor::copy_: the source is an undefined tensor");
  TP_CHECK(dst.shape == source.shape(), "tp::Tensor::copy_: shapes ",
           tp::to_string(dst.shape), " (destination) and ", tp::to_string(source.shape()),
           " (source) differ; copy_ needs equal shapes");
  if (!(source.device() == dst.storage->device())) {
    copy_across_devices(*this, source);
    return *this;
  }
  dst.storage->count_bytes_copied_in(nbytes());
  const Tensor src = unaliased_source(dst, source);
  const TensorImpl& s = *src.impl();
  if (on_cuda(dst)) {
    cuda::kernels::copy(*this, src);
    return *this;
  }
  dispatch(dst.dtype, [&](auto dst_tag) {
    using D = decltype(dst_tag);
    dispatch(s.dtype, [&](auto src_tag) {
      using S = decltype(src_tag);
      D* out = storage_base<D>(dst);
      const S* in = storage_base<S>(s);
      if constexpr (std::is_same_v<D, Half> && std::is_same_v<S, float>) {
        if (row_major(dst.shape, dst.strides) && row_major(dst.shape, s.strides)) {
          // A dense float -> float16 copy (fp16_compress_hook's): in bulk,
          // with the same rounding (Note [Conversions in bulk], half_bulk.h).
          detail::floats_to_halves(in + s.offset, out + dst.offset, numel_of(dst.shape));
          return;
        }
      }
      for_each_index_pair(dst.shape, dst.strides, dst.offset, s.strides, s.offset,
                          [&](int64_t i, int64_t j) { out[i] = convert<D>(in[j]); });
    });
  });
  return *this;
}

Tensor& Tensor::add_(const Tensor& other_view, double alpha) {
  const TensorImpl& dst = checked_for_write(*this, "tp::Tensor::add_");
  TP_CHECK(other_view.defined(), "tp::Tensor::add_: the other tensor is undefined");
  TP_CHECK(other_view.device() == dst.storage->device(), "tp::Tensor::add_: tensors on ",
           tp::to_string(dst.storage->device()), " and ", tp::to_string(other_view.device()),
           "; move one with .to(...)");
  const Tensor other = unaliased_source(dst, other_view);
  const TensorImpl& o = *other.impl();
  TP_CHECK(dst.shape == o.shape, "tp::Tensor::add_: shapes ", tp::to_string(dst.shape),
           " and ", tp::to_string(o.shape), " differ; add_ needs equal shapes");
  TP_CHECK(dst.dtype == o.dtype, "tp::Tensor::add_: dtypes ", tp::to_string(dst.dtype),
           " and ", tp::to_string(o.dtype), " differ; convert one with .to()");
  if (on_cuda(dst)) {
    cuda::kernels::add_scaled(*this, other, alpha);
    return *this;
  }
  dispatch_compute(dst.dtype, "tp::Tensor::add_", [&](auto tag) {
    using T = decltype(tag);
    T* out = storage_base<T>(dst);
    const T* in = storage_base<T>(o);
    const T a = static_cast<T>(alpha);  // a * x == x exactly when alpha is 1
    for_each_index_pair(dst.shape, dst.strides, dst.offset, o.strides, o.offset,
                        [&](int64_t i, int64_t j) { out[i] += a * in[j]; });
  });
  return *this;
}

// Note [16-bit arithmetic]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Half and BFloat16 have no arithmetic of their own. mul_ and div_ on a
// 16-bit tensor widen each element to float (exact), compute in float with
// the scalar rounded to float, and round the float result once back to the
// 16-bit type (to nearest, ties to even: half.h), as PyTorch's CPU kernels
// do with their "opmath" type. That is two roundings, float's and then the
// 16-bit one, yet the result is the correctly rounded product or quotient
// whenever the scalar is itself exact in the 16-bit type (a world size: up
// to 2048 for float16, 256 for bfloat16): float's 24 significant bits are
// at least 2p + 2 for p = 11 (Half) and 8 (BFloat16), and with that much
// room the first rounding never changes the second (Figueroa, "When is
// double rounding innocuous?", 1995). fp16_compress_hook's
// compressed.div_(world_size) therefore rounds exactly once, like a float16
// division in hardware. float32 and float64 compute in their own type, as
// before.

// Every element x of t's view becomes T(op(x, value)), computed in
// OpMath<T> (Note [16-bit arithmetic]).
template <typename Op>
static void scale_in_place(const TensorImpl& t, double value, Op op) {
  dispatch(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    using Math = OpMath<T>;
    T* base = storage_base<T>(t);
    const auto v = static_cast<Math>(value);
    if constexpr (std::is_same_v<T, Half>) {
      if (row_major(t.shape, t.strides)) {
        // Dense float16 (fp16_compress_hook's division): a block at a time,
        // widened, computed, and rounded back in bulk (half_bulk.h), the
        // same numbers as the loop below.
        constexpr int64_t kBlock = 1024;
        float wide[kBlock];
        const int64_t n = numel_of(t.shape);
        for (int64_t start = 0; start < n; start += kBlock) {
          const int64_t m = std::min(kBlock, n - start);
          Half* block = base + t.offset + start;
          for (int64_t k = 0; k < m; ++k) wide[k] = op(static_cast<float>(block[k]), v);
          detail::floats_to_halves(wide, block, m);
        }
        return;
      }
    }
    for_each_index(t, [&](int64_t i) { base[i] = T(op(static_cast<Math>(base[i]), v)); });
  });
}

Tensor& Tensor::mul_(double value) {
  const TensorImpl& t = checked_for_write(*this, "tp::Tensor::mul_");
  if (on_cuda(t)) {
    cuda::kernels::scale(*this, value, /*divide=*/false);
    return *this;
  }
  scale_in_place(t, value, [](auto x, auto v) { return x * v; });
  return *this;
}

// Divides rather than multiplying by 1/value: 1/3 is not exact, so
// x * (1/3) can differ from x / 3 in the last bit.
Tensor& Tensor::div_(double value) {
  const TensorImpl& t = checked_for_write(*this, "tp::Tensor::div_");
  if (on_cuda(t)) {
    cuda::kernels::scale(*this, value, /*divide=*/true);
    return *this;
  }
  scale_in_place(t, value, [](auto x, auto v) { return x / v; });
  return *this;
}

// ---- math -----------------------------------------------------------------------------

Tensor Tensor::matmul(const Tensor& other) const { return tp::matmul(*this, other); }
Tensor Tensor::relu() const { return tp::relu(*this); }
Tensor Tensor::square() const { return tp::square(*this); }
Tensor Tensor::sum() const { return tp::sum(*this); }
Tensor Tensor::mean() const { return tp::mean(*this); }

double Tensor::norm() const {
  const TensorImpl& t = checked(*this, "tp::Tensor::norm");
  if (on_cuda(t)) return detach().cpu().norm();
  double sum_sq = 0.0;  // accumulate in double for both dtypes
  dispatch_compute(t.dtype, "tp::Tensor::norm", [&](auto tag) {
    using T = decltype(tag);
    const T* base = storage_base<T>(t);
    for_each_index(t, [&](int64_t i) {
      const double v = base[i];
      sum_sq += v * v;
    });
  });
  return std::sqrt(sum_sq);
}

// ---- autograd -------------------------------------------------------------------------

bool Tensor::requires_grad() const {
  return checked(*this, "tp::Tensor::requires_grad").requires_grad;
}

Tensor& Tensor::requires_grad_(bool requires_grad) {
  const TensorImpl& t = checked(*this, "tp::Tensor::requires_grad_");
  TP_CHECK(t.grad_fn == nullptr,
           "tp::Tensor::requires_grad_: this tensor is not a leaf (it was "
           "produced by ", t.grad_fn->name(), "), so whether it requires grad "
           "follows from its inputs; call detach() to get a leaf first");
  impl_->requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const {
  return checked(*this, "tp::Tensor::is_leaf").grad_fn == nullptr;
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  return checked(*this, "tp::Tensor::grad_fn").grad_fn;
}

Tensor Tensor::grad() const { return Tensor(checked(*this, "tp::Tensor::grad").grad); }

void Tensor::set_grad(const Tensor& grad) const {
  const TensorImpl& t = checked(*this, "tp::Tensor::set_grad");
  if (grad.defined()) {
    TP_CHECK(grad.shape() == t.shape, "tp::Tensor::set_grad: the gradient has shape ",
             tp::to_string(grad.shape()), " but the tensor has shape ", tp::to_string(t.shape),
             "; a gradient must match its tensor's shape");
    TP_CHECK(grad.dtype() == t.dtype, "tp::Tensor::set_grad: the gradient has dtype ",
             tp::to_string(grad.dtype()), " but the tensor has dtype ",
             tp::to_string(t.dtype), "; convert it with .to()");
    TP_CHECK(grad.device() == t.storage->device(), "tp::Tensor::set_grad: the gradient is on ",
             tp::to_string(grad.device()), " but the tensor is on ",
             tp::to_string(t.storage->device()), "; move it with .to()");
  }
  impl_->grad = grad.impl_ptr();
}

void Tensor::backward(const Tensor& gradient) const { autograd::backward(*this, gradient); }

RemovableHandle Tensor::register_post_accumulate_grad_hook(
    PostAccumulateGradHook fn) const {
  const TensorImpl& t = checked(*this, "tp::Tensor::register_post_accumulate_grad_hook");
  TP_CHECK(t.grad_fn == nullptr && t.requires_grad,
           "tp::Tensor::register_post_accumulate_grad_hook: the tensor must be a "
           "leaf that requires grad (", t.grad_fn ? "it was produced by " +
           t.grad_fn->name() : std::string("it does not require grad"),
           "); register hooks on parameters, after requires_grad_()");
  TP_CHECK(fn != nullptr,
           "tp::Tensor::register_post_accumulate_grad_hook: the hook is empty");
  const uint64_t id = impl_->next_hook_id++;
  impl_->post_accumulate_grad_hooks.emplace_back(id, std::move(fn));
  return RemovableHandle(impl_, id);
}

// ---- printing -----------------------------------------------------------------------

namespace {

// Tensors with more elements than this print only the first and last
// kEdgeItems of each long dimension, like PyTorch.
constexpr int64_t kPrintThreshold = 1000;
constexpr int64_t kEdgeItems = 3;

void print_values(std::ostringstream& out, const TensorImpl& t, std::size_t dim,
                  int64_t index, bool elide) {
  if (dim == t.shape.size()) {
    dispatch(t.dtype, [&](auto tag) {
      using T = decltype(tag);
      out << static_cast<double>(storage_base<T>(t)[index]);
    });
    return;
  }
  const int64_t size = t.shape[dim];
  const int64_t stride = t.strides[dim];
  out << '[';
  for (int64_t i = 0; i < size; ++i) {
    if (i > 0) out << ", ";
    if (elide && size > 2 * kEdgeItems && i == kEdgeItems) {
      out << "...";
      i = size - kEdgeItems - 1;  // the loop's ++i lands on the last items
      continue;
    }
    print_values(out, t, dim + 1, index + i * stride, elide);
  }
  out << ']';
}

}  // namespace

std::string Tensor::to_string() const {
  if (!defined()) return "tensor(undefined)";
  const TensorImpl& t = *impl_;
  std::ostringstream out;
  out << "tensor(";
  if (on_cuda(t)) {
    const Tensor host = detach().cpu();
    print_values(out, *host.impl(), 0, 0, numel_of(t.shape) > kPrintThreshold);
    out << ", device='" << tp::to_string(t.storage->device()) << '\'';
  } else {
    print_values(out, t, 0, t.offset, numel_of(t.shape) > kPrintThreshold);
  }
  out << ", dtype=" << tp::to_string(t.dtype);
  if (t.grad_fn) {
    out << ", grad_fn=<" << t.grad_fn->name() << '>';
  } else if (t.requires_grad) {
    out << ", requires_grad=true";
  }
  out << ')';
  return out.str();
}

// ---- factories -------------------------------------------------------------------------

namespace {
std::atomic<bool> fill_uninitialized{false};  // set_fill_uninitialized_memory
}  // namespace

void set_fill_uninitialized_memory(bool on) { fill_uninitialized.store(on); }
bool fill_uninitialized_memory() { return fill_uninitialized.load(); }

Tensor empty(const Shape& shape, Dtype dtype, Device device) {
  Tensor out = make_empty(shape, dtype, device, "tp::empty");
  if (fill_uninitialized.load(std::memory_order_relaxed)) {
    out.fill_(std::numeric_limits<double>::quiet_NaN());
  }
  return out;
}

Tensor zeros(const Shape& shape, Dtype dtype, Device device) {
  Tensor out = make_empty(shape, dtype, device, "tp::zeros");
  return out.fill_(0.0);
}

Tensor ones(const Shape& shape, Dtype dtype, Device device) {
  Tensor out = make_empty(shape, dtype, device, "tp::ones");
  return out.fill_(1.0);
}

Tensor full(const Shape& shape, double value, Dtype dtype, Device device) {
  Tensor out = make_empty(shape, dtype, device, "tp::full");
  return out.fill_(value);
}

Tensor tensor(const std::vector<double>& values, const Shape& shape, Dtype dtype,
              Device device) {
  if (device.type != DeviceType::CPU) {
    check_dtype_on_device(dtype, device, "tp::tensor");
    check_device_usable(device, "tp::tensor");
    return tensor(values, shape, dtype, kCPU).to(device);  // built on the host, then copied
  }
  Tensor out = make_empty(shape, dtype, kCPU, "tp::tensor");
  const int64_t n = numel_of(shape);
  TP_CHECK(static_cast<int64_t>(values.size()) == n, "tp::tensor: got ",
           values.size(), " values for shape ", tp::to_string(shape), ", which holds ",
           n, "; pass exactly one value per element (row-major)");
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* out_data = out.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      out_data[i] = static_cast<T>(values[static_cast<std::size_t>(i)]);
    }
  });
  return out;
}

Tensor zeros_like(const Tensor& t) {
  TP_CHECK(t.defined(), "tp::zeros_like: got an undefined tensor");
  return zeros(t.shape(), t.dtype(), t.device());
}

}  // namespace tp
