// tp::cuda: the CUDA runtime as the kit uses it — devices, streams, events.
//
// A GPU runs work in *streams*: queues of kernels and copies that run in
// order, one after another, while different streams may run side by side.
// The host only enqueues; it does not wait unless it asks to. An *event* is a
// marker put into a stream (record); another stream can be told to wait for
// it (Stream::wait), which orders the two streams without stopping the host.
// That is all overlap needs: backward runs on the compute stream, each
// bucket's all-reduce on a communication stream that first waits for an
// event recorded when the bucket was filled, and at the end the compute
// stream waits for the communication stream (lesson 03's CUDA section).
//
// Contract:
//   - This header compiles everywhere, with or without the CUDA toolkit: it
//     names CUDA's stream and event types only by forward declaration.
//     is_built() says whether the kit was compiled with CUDA (the Meson
//     feature `cuda`); is_available() whether a device can be used now.
//     Everything else REQUIRES is_available() and otherwise throws tp::Error
//     saying why not (unavailable_reason()).
//   - Each thread has a current stream, initially the device's default
//     stream (CUDA's legacy stream 0). Every kernel and copy the kit launches
//     goes to the calling thread's current stream; StreamGuard changes it for
//     a scope. Streams made by Stream::create() never synchronise implicitly
//     with the default stream (cudaStreamNonBlocking): only events order them.
//   - Errors from the CUDA runtime become tp::Error naming the call and
//     CUDA's own message ("cudaMemcpyAsync: an illegal memory access was
//     encountered"). Kernel launches are checked at launch; faults inside a
//     kernel surface at the next synchronising call, as in every CUDA program.
//   - Stream and Event are cheap handles with shared ownership: copies name
//     the same CUDA object, destroyed with the last copy. Not thread-safe
//     for concurrent mutation of one handle; the CUDA objects themselves may
//     be used from any thread, as CUDA allows.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

struct CUstream_st;  // cudaStream_t is CUstream_st*
struct CUevent_st;   // cudaEvent_t is CUevent_st*

namespace tp::cuda {

using StreamHandle = CUstream_st*;
using EventHandle = CUevent_st*;

// True when the kit was compiled with CUDA.
bool is_built();
// True when is_built() and at least one CUDA device can be used. Asked in a
// forked child, so that the caller stays free to fork ranks that use CUDA
// (CUDA does not survive fork: Note [Asking in a child] in runtime.cc).
bool is_available();
// Why is_available() is false: "tensorplay was built without CUDA (...)" or
// "no usable CUDA device: cudaGetDeviceCount: <CUDA's message>"; empty when
// it is true.
std::string unavailable_reason();
// Number of usable devices; 0 when not available.
int device_count();
// The calling thread's device (cudaSetDevice / cudaGetDevice).
int current_device();
void set_device(int device);
// Blocks the host until every stream of the current device is idle.
void synchronize_device();
// "NVIDIA H200 (sm_90, 139 GiB)" for messages and summaries.
std::string device_name(int device);

class Stream {
 public:
  // The default stream of the current device (CUDA's legacy stream 0).
  Stream() = default;
  // A new stream that does not synchronise with the default stream.
  // Higher priority (a more negative number, as in CUDA) lets its kernels
  // be scheduled ahead of others'; 0 is normal.
  static Stream create(int priority = 0);

  StreamHandle handle() const;
  // Later work on this stream waits until `event` has completed (the event
  // as last recorded). The host does not wait.
  void wait(const class Event& event) const;
  // Blocks the host until all work queued on this stream so far is done.
  void synchronize() const;
  bool operator==(const Stream& other) const { return handle() == other.handle(); }

 private:
  struct Owner;
  std::shared_ptr<Owner> owner_;  // null: the default stream
};

// The calling thread's current stream.
Stream current_stream();

// Makes `stream` the calling thread's current stream for its scope.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

class Event {
 public:
  // Creates the CUDA event. With timing, elapsed_ms() works (trace spans);
  // without, record/wait are a little cheaper.
  explicit Event(bool timing = false);

  EventHandle handle() const;
  // Marks the point in `stream` reached by the work queued so far.
  void record(const Stream& stream = current_stream()) const;
  // True once the recorded work has run (never blocks). True for an event
  // never recorded.
  bool query() const;
  // Blocks the host until the recorded work has run.
  void synchronize() const;
  // Milliseconds from `start` to this event, both recorded with timing and
  // both complete.
  float elapsed_ms(const Event& start) const;

 private:
  struct Owner;
  std::shared_ptr<Owner> owner_;
};

// Device memory, for Storage. allocate() returns memory of the current
// device, ordered on the current stream (cudaMallocAsync): using it on
// another stream needs an event, as always. deallocate() frees it on the
// stream it was allocated on, so it is reused only after the work queued
// there so far; memory read by another stream must be kept alive until
// that stream's work is ordered before (the process groups keep a
// collective's tensor alive in its Work until wait()).
struct Allocation {
  void* data = nullptr;
  Stream stream;  // shared: a stream outlives the memory ordered on it
  int device = 0;
};
Allocation allocate(std::size_t nbytes);
void deallocate(const Allocation& allocation) noexcept;

// Page-locked host memory (cudaMallocHost): copies to and from it can run
// asynchronously on a stream; staging buffers of the Gloo group.
std::shared_ptr<void> allocate_pinned(std::size_t nbytes);

// Asynchronous copy of nbytes on `stream` between any two of host, pinned
// host and device memory (cudaMemcpyDefault: the pointers say which).
void copy_async(void* dst, const void* src, std::size_t nbytes,
                const Stream& stream = current_stream());

}  // namespace tp::cuda
