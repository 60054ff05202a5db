// tp::Tensor: an n-dimensional array with shared storage and autograd.
//
// Contract:
//   - A Tensor is a handle. Copying a Tensor copies the handle: both name the
//     same TensorImpl (same data, same grad, same autograd history), exactly
//     as a Python variable does in PyTorch. An undefined Tensor (default
//     constructed) has no impl; defined() tells.
//   - Data lives in a Storage shared by every view of it. A view has its own
//     shape, strides and storage offset (in elements) but aliases the bytes:
//     narrow(), view(), flatten() and t() never copy. A DDP bucket is one flat
//     tensor and each parameter's gradient slot is a view of it.
//   - dtype is float32 or float64, the dtypes the kit computes in, or one of
//     the 16-bit float16 and bfloat16 (tp::Half, tp::BFloat16 in half.h),
//     which exist for communication (DDP's fp16/bf16 compression hooks) and
//     live on the CPU only: a 16-bit tensor can be made, viewed, converted
//     (to, copy_, clone), filled (zero_, fill_), scaled in place (mul_,
//     div_), read (item, to_vector, to_string) and sent, and every other op
//     throws tp::Error naming the op and the dtype (check_compute_dtype).
//     device is the CPU (kCPU) or a CUDA device
//     (kCUDA is cuda:0; Device{DeviceType::CUDA, -1} is the current one).
//     Factories take a device; to(device), cpu() and cuda() move data. Every
//     op of ops.h and every in-place method runs on the device of its
//     inputs, and an op given tensors on two devices throws tp::Error naming
//     both. Work on a CUDA tensor is queued on the calling thread's current
//     stream (tp::cuda::current_stream()) and does not wait; item(),
//     to_vector(), to_string(), norm() and a copy to the CPU wait for it.
//     A CUDA tensor must live on the thread's current device
//     (tp::cuda::set_device) when an op touches it.
//   - Asking for a CUDA tensor where CUDA cannot be used (a build without
//     it, a machine without a device) throws tp::Error naming the factory or
//     op and tp::cuda::unavailable_reason().
//   - In-place methods (zero_, fill_, copy_, add_, mul_, div_) write through
//     views and never record autograd history; use them on gradients and
//     under NoGradGuard.
//   - Autograd: a tensor with requires_grad and no grad_fn is a leaf; its
//     gradient accumulates in grad() across backward calls until zeroed.
//   - Not thread-safe: one thread mutates a tensor at a time. (DDP's
//     communication thread touches only buffers it was handed, never the graph.)
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensorplay/cuda/runtime.h"
#include "tensorplay/error.h"
#include "tensorplay/half.h"
#include "tensorplay/memory.h"

namespace tp {

// Element types: float, double, tp::Half, tp::BFloat16. (New dtypes go at
// the end: collective fingerprints carry the enumerator's value.)
enum class Dtype { Float32, Float64, Float16, BFloat16 };
inline constexpr Dtype kFloat32 = Dtype::Float32;
inline constexpr Dtype kFloat64 = Dtype::Float64;
inline constexpr Dtype kFloat16 = Dtype::Float16;
inline constexpr Dtype kBFloat16 = Dtype::BFloat16;

// "float32", "float64", "float16" or "bfloat16", as PyTorch names them.
std::string to_string(Dtype dtype);
// 4, 8, 2 or 2.
std::size_t element_size(Dtype dtype);
// True for float16 and bfloat16.
bool is_16bit(Dtype dtype);
// Throws tp::Error unless op can compute in dtype, i.e. unless it is float32
// or float64: a 16-bit tensor is for communication, not computation (see the
// contract of Tensor). Every op of ops.h and Tensor's math methods call it
// first, so the refusal names the op: "tp::matmul: got a float16 tensor;
// ...".
void check_compute_dtype(const char* op, Dtype dtype);

enum class DeviceType { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = -1;  // -1: the current device of that type.
  bool operator==(const Device&) const = default;
};
inline constexpr Device kCPU{DeviceType::CPU, -1};
// The first CUDA device. (Device{DeviceType::CUDA, -1}: the current one.)
inline constexpr Device kCUDA{DeviceType::CUDA, 0};

// "cpu", "cuda:0", or "cuda" for the current CUDA device (index -1).
std::string to_string(Device device);
// The inverse of to_string: "cpu", "cuda" (index -1) or "cuda:N"; throws
// tp::Error for anything else.
Device parse_device(const std::string& text);

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

// "(3, 4)"; "()" for a scalar.
std::string to_string(const Shape& shape);
// Product of the sizes; 1 for a scalar.
int64_t numel_of(const Shape& shape);
// Row-major strides for a contiguous tensor of this shape.
Strides contiguous_strides(const Shape& shape);

// A block of bytes owned jointly by every tensor that views it.
// Invariant: data is 64-byte aligned; nbytes changes only through resize_,
// which frees the bytes or allocates them again (FSDP's free and re-gather).
// On a CUDA device the bytes are device memory (tp::cuda::allocate: ordered
// on the current stream, freed on it with tp::cuda::deallocate); device()
// then names the device concretely (cuda:0, never index -1). A CUDA device
// other than the current one is refused: set_device first.
// Its bytes are counted by tp::memory (memory.h), on either device, under the
// allocating thread's current kind, from construction to destruction.
class Storage {
 public:
  // Throws tp::Error with tp::cuda::unavailable_reason() when a CUDA device
  // is asked for and CUDA cannot be used.
  Storage(std::size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }

  // Frees the bytes (resize_(0)) or allocates `nbytes` of them anew,
  // uninitialized, on the same device and counted under the same memory
  // kind, keeping this Storage object: every tensor that views it stays a
  // view of it. FSDP frees a unit's gathered parameters this way after use
  // and allocates them again before the next gather (PyTorch's
  // storage().resize_(0) and resize_(n)), so the views the autograd graph
  // saved in forward see the bytes gathered for backward. While freed,
  // reading or writing any non-empty view throws tp::Error (tensor.cc).
  // REQUIRES: nbytes == 0 or is_freed(): growing live bytes in place would
  // move them under the views (throws tp::Error).
  void resize_(std::size_t nbytes);
  // True after resize_(0), until the next resize_(n).
  bool is_freed() const { return freed_; }
  Device device() const { return device_; }
  // What tp::memory counts these bytes as.
  memory::Kind memory_kind() const { return memory_kind_; }
  // Counts them as `kind` from now on (AccumulateGrad: a backward result
  // that becomes a leaf's .grad becomes Gradient).
  void set_memory_kind(memory::Kind kind);
  // The bytes Tensor::copy_ has written into this storage since the last
  // call (then zero again): a copy into a view counts the view's bytes, a
  // copy of a tensor onto itself counts too. Any thread may copy; the
  // counter is atomic. The DDP trainer reads it for the storages the
  // gradients live in, to count the copies a DDP makes into them
  // (RankResult::grad_copy_bytes_per_micro).
  uint64_t take_bytes_copied_in() { return bytes_copied_in_.exchange(0, std::memory_order_relaxed); }
  void count_bytes_copied_in(std::size_t nbytes) {
    bytes_copied_in_.fetch_add(nbytes, std::memory_order_relaxed);
  }

 private:
  void* data_;
  std::size_t nbytes_;
  Device device_;
  memory::Kind memory_kind_;
  std::atomic<uint64_t> bytes_copied_in_{0};
  bool freed_ = false;  // resize_(0) was called and no resize_(n) since
  // CUDA only: the stream data_ was allocated on (and is freed on), kept
  // alive as long as this storage.
  cuda::Stream cuda_stream_;

  void allocate(std::size_t nbytes);  // data_, nbytes_, counted
  void release();                     // uncounted, data_ null, freed_
};

namespace autograd {
class Node;
class AccumulateGrad;
}  // namespace autograd

class Tensor;

// Called by the autograd engine the moment a leaf's gradient is final for the
// current backward pass. The argument is the leaf itself, the very handle that
// its AccumulateGrad node holds, so it is const: the hook may read
// param.grad(), change the gradient in place (param.grad().div_(w)) or replace
// it (param.set_grad(bucket_view)), all const methods, but it cannot rebind the
// handle. (`param = Tensor()` does not compile; through a mutable reference it
// would empty the node's leaf and crash the next backward.)
using PostAccumulateGradHook = std::function<void(const Tensor& param)>;

struct TensorImpl;

// The registration of one post-accumulate-grad hook, returned by
// Tensor::register_post_accumulate_grad_hook.
//
// Ownership: the hook lives as long as its handle. Keep the handle, e.g. in a
// member vector, as DDP does; destroying it removes the hook, so a DDP object
// that owns its handles removes its hooks when it is destroyed (and a handle
// dropped on the floor removes its hook at once: hence [[nodiscard]]).
// Move-only, like std::unique_ptr: one hook, one owner. Moving transfers the
// hook; move-assigning over a handle first removes the hook that handle held.
// The handle refers to the tensor weakly: it does not keep the tensor alive,
// and outliving the tensor is harmless. Not thread-safe (like Tensor).
class RemovableHandle {
 public:
  RemovableHandle() = default;  // holds no hook
  RemovableHandle(std::weak_ptr<TensorImpl> owner, uint64_t id)
      : owner_(std::move(owner)), id_(id) {}
  ~RemovableHandle() { remove(); }
  RemovableHandle(const RemovableHandle&) = delete;
  RemovableHandle& operator=(const RemovableHandle&) = delete;
  RemovableHandle(RemovableHandle&& other) noexcept;
  RemovableHandle& operator=(RemovableHandle&& other) noexcept;

  // Unregisters the hook now; afterwards the handle holds none. Safe to call
  // twice, on a default or moved-from handle, and after the tensor is gone.
  // From inside the hook itself, the hook still finishes this pass (the
  // engine runs a snapshot of the list) and does not fire in the next.
  void remove() noexcept;

 private:
  std::weak_ptr<TensorImpl> owner_;  // empty once removed or moved from
  uint64_t id_ = 0;                  // the hook's id in owner's list
};

class Tensor {
 public:
  Tensor() = default;  // undefined
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }

  // ---- metadata --------------------------------------------------------
  const Shape& shape() const;
  const Strides& strides() const;
  int64_t dim() const;
  // Size of dimension d; negative d counts from the end.
  int64_t size(int64_t d) const;
  int64_t numel() const;
  Dtype dtype() const;
  Device device() const;
  int64_t storage_offset() const;  // in elements
  std::size_t element_size() const;
  std::size_t nbytes() const;  // numel() * element_size()
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const;
  // True when both tensors view the same Storage.
  bool is_alias_of(const Tensor& other) const;

  // ---- data access -----------------------------------------------------
  // Pointer to element 0 of this view. REQUIRES: defined(). For a CUDA
  // tensor it is a device pointer: pass it to kernels, cuBLAS or NCCL, never
  // dereference it on the host (copy to the CPU with cpu() first).
  void* data_ptr() const;
  // Typed pointer. REQUIRES: T matches dtype() (float for Float32, double for
  // Float64, tp::Half for Float16, tp::BFloat16 for BFloat16); throws
  // tp::Error otherwise.
  template <typename T>
  T* data_ptr() const;
  // The single value of a one-element tensor, as double. A CUDA tensor is
  // copied to the CPU first (the host waits for the current stream).
  double item() const;
  // All values in row-major order, as double (for tests and printing); a
  // CUDA tensor's are copied to the CPU first, as for item().
  std::vector<double> to_vector() const;

  // ---- views (alias storage, differentiable) ---------------------------
  // Same data, new shape; one size may be -1. REQUIRES: is_contiguous().
  Tensor view(Shape shape) const;
  // view({numel()}).
  Tensor flatten() const;
  // Elements [start, start+length) along dim.
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // Transpose of a 2-D tensor (swaps sizes and strides; no copy).
  Tensor t() const;

  // ---- copies ------------------------------------------------------------
  // This tensor if contiguous, else a contiguous copy (differentiable).
  Tensor contiguous() const;
  // A contiguous copy with fresh storage (differentiable).
  Tensor clone() const;
  // Same storage, no autograd history, requires_grad false.
  Tensor detach() const;
  // A contiguous copy converted to dtype, on the same device. Between any
  // two dtypes; to a 16-bit one each value is rounded once, to nearest, ties
  // to even (half.h), and a CUDA tensor cannot become 16-bit (the kit's CUDA
  // path runs float32 and float64). Differentiable between float32 and
  // float64 (the gradient comes back converted to this tensor's dtype, as in
  // PyTorch: how a model mixes the two, nn::MixedMLP); a 16-bit result
  // records no history, since no op computes in 16 bits.
  Tensor to(Dtype dtype) const;
  // A contiguous copy on `device` (same dtype); *this itself when it already
  // lives there, as in PyTorch. Differentiable: the gradient goes back to
  // this tensor's device. Device{CUDA, -1} means the current CUDA device.
  Tensor to(Device device) const;
  // to(kCPU).
  Tensor cpu() const;
  // to the current CUDA device.
  Tensor cuda() const;

  // ---- in-place (no autograd history; return *this) --------------------
  Tensor& zero_();
  Tensor& fill_(double value);
  // Copies src's values into this view. REQUIRES: same shape; dtypes may
  // differ (converted as to(dtype) does).
  // A src that overlaps this view (a.copy_(a.t())) is read as it was before
  // the call; so is add_'s other. src may be on another device than this
  // tensor: the copy goes through tp::cuda::copy_async on the current stream,
  // and the host waits for that stream before copy_ returns (so a CPU
  // destination can be read, and a CPU source changed, right away).
  // add_'s other must be on this tensor's device.
  Tensor& copy_(const Tensor& src);
  // this += alpha * other. REQUIRES: same shape and dtype, float32 or float64.
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  // this *= value, this /= value. A 16-bit element is computed in float and
  // rounded once back to its type (Note [16-bit arithmetic] in tensor.cc).
  Tensor& mul_(double value);
  Tensor& div_(double value);

  // ---- math (see ops.h for shapes) ---------------------------------------
  // float32 and float64 only: a 16-bit tensor is refused (check_compute_dtype).
  Tensor matmul(const Tensor& other) const;
  Tensor relu() const;
  Tensor square() const;
  Tensor sum() const;
  Tensor mean() const;
  // Euclidean norm of all elements, as double (not differentiable).
  double norm() const;

  // ---- autograd ----------------------------------------------------------
  bool requires_grad() const;
  // Marks a leaf as requiring grad. REQUIRES: is_leaf().
  Tensor& requires_grad_(bool requires_grad = true);
  // A tensor is a leaf when it has no grad_fn.
  bool is_leaf() const;
  // The node that produced this tensor, or nullptr for a leaf.
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  // The accumulated gradient (undefined until the first backward).
  // Returned as a handle: grad().add_(x) changes the gradient in place.
  Tensor grad() const;
  // Replaces the gradient (DDP points it at a bucket view). An undefined
  // tensor clears it. REQUIRES: same shape and dtype as this tensor.
  void set_grad(const Tensor& grad) const;
  // Runs backward from this tensor. gradient may be omitted only for a
  // one-element tensor (it defaults to 1).
  void backward(const Tensor& gradient = Tensor()) const;
  // Registers fn to run right after AccumulateGrad writes this leaf's
  // gradient, once per backward pass. The hook stays registered as long as
  // the returned handle lives (see RemovableHandle); keep it.
  // REQUIRES: is_leaf() && requires_grad().
  [[nodiscard]] RemovableHandle register_post_accumulate_grad_hook(
      PostAccumulateGradHook fn) const;

  // "tensor([[1, 2], [3, 4]], dtype=float32)"; long tensors are elided.
  std::string to_string() const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// The state behind a Tensor handle. Library code (ops, autograd) uses the
// fields directly; user code goes through Tensor.
struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements, into storage
  Shape shape;
  Strides strides;
  Dtype dtype = kFloat32;

  // Autograd fields.
  bool requires_grad = false;
  std::shared_ptr<autograd::Node> grad_fn;  // null for leaves
  std::shared_ptr<TensorImpl> grad;         // null until the first backward
  // Leaves only: created on first use by the graph; weak so that the graph,
  // not the leaf, keeps it alive (no cycle).
  std::weak_ptr<autograd::AccumulateGrad> grad_accumulator;
  // (id, hook) in registration order; an entry is erased by its handle.
  std::vector<std::pair<uint64_t, PostAccumulateGradHook>> post_accumulate_grad_hooks;
  uint64_t next_hook_id = 1;  // ids are never reused, so a stale handle erases nothing
};

// ---- factories -----------------------------------------------------------
// Each makes a contiguous tensor on `device` (CPU by default); a CUDA device
// where CUDA cannot be used, or a 16-bit dtype on a CUDA device, throws
// tp::Error naming the factory and why.
// Uninitialized contiguous tensor (NaN in every element while
// fill_uninitialized_memory() is on).
Tensor empty(const Shape& shape, Dtype dtype = kFloat32, Device device = kCPU);
// While on, empty() fills what it returns with NaN, so a buffer read before
// it is written shows as NaN in the numbers instead of as whatever the
// allocator left there (often a freed twin's values, close to right; with
// MALLOC_PERTURB_ a pattern near zero). PyTorch's
// torch.utils.deterministic.fill_uninitialized_memory does the same. Off by
// default (a pass over the bytes); the checkers turn it on. Process-wide.
void set_fill_uninitialized_memory(bool on);
bool fill_uninitialized_memory();
Tensor zeros(const Shape& shape, Dtype dtype = kFloat32, Device device = kCPU);
Tensor ones(const Shape& shape, Dtype dtype = kFloat32, Device device = kCPU);
Tensor full(const Shape& shape, double value, Dtype dtype = kFloat32,
            Device device = kCPU);
// A tensor holding values (row-major). REQUIRES: values.size() == numel(shape).
Tensor tensor(const std::vector<double>& values, const Shape& shape,
              Dtype dtype = kFloat32, Device device = kCPU);
// A tensor of the same shape, dtype and device, filled with zeros.
Tensor zeros_like(const Tensor& t);

// A tensor with its name ("fc1.weight"), as nn::Module's named_parameters()
// and named_buffers() list them; the distributed checks and the harness
// pass them around without a module.
using NamedTensor = std::pair<std::string, Tensor>;

}  // namespace tp
