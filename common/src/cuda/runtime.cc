// tp::cuda runtime: devices, streams, events and memory (see
// tensorplay/cuda/runtime.h). Compiled only when the kit is built with CUDA;
// no_cuda.cc stands in for it otherwise.
#include "tensorplay/cuda/runtime.h"

#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "check.h"

namespace tp::cuda {

namespace {

// Note [Asking in a child]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The CUDA runtime does not survive fork(): once a process has touched CUDA
// (and cudaGetDeviceCount does: it initialises the driver), a child forked
// from it fails its first CUDA call with "initialization error". The kit's
// ranks are forked children (tp::multiprocessing::spawn), and the demo and
// the checkers ask is_available() before they spawn. So the question is put
// to a short-lived child of our own, which answers through a pipe and exits:
// the asking process stays free of CUDA, and its ranks can use it. (PyTorch
// asks NVML instead, for the same reason.) Asked once per process; the
// answer, with CUDA's reason when there is no device, does not change.
struct Probe {
  int count = 0;
  std::string reason;
};

Probe ask_cuda_in_child() {
  int fds[2];
  if (::pipe(fds) != 0) return {0, std::string("no usable CUDA device: pipe: ") + std::strerror(errno)};
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return {0, std::string("no usable CUDA device: fork: ") + std::strerror(errno)};
  }
  if (pid == 0) {  // the child: one question, then _exit (no destructors, no atexit)
    ::close(fds[0]);
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    std::string answer = std::to_string(status == cudaSuccess ? count : 0) + "\n";
    if (status != cudaSuccess) {
      answer += std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status) + " (" +
                cudaGetErrorName(status) + ")";
    }
    const char* p = answer.data();
    size_t left = answer.size();
    while (left > 0) {
      const ssize_t n = ::write(fds[1], p, left);
      if (n <= 0) break;
      p += n;
      left -= static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string answer;
  char buf[512];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) {
      answer.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fds[0]);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  Probe p;
  const size_t newline = answer.find('\n');
  if (newline == std::string::npos) {
    p.reason = "no usable CUDA device: the process that asked CUDA ended without an answer" +
               std::string(WIFSIGNALED(wstatus) ? " (killed by signal " +
                                                      std::to_string(WTERMSIG(wstatus)) + ")"
                                                : "");
    return p;
  }
  p.count = std::atoi(answer.substr(0, newline).c_str());
  if (p.count <= 0) {
    p.count = 0;
    const std::string cause = answer.substr(newline + 1);
    p.reason = "no usable CUDA device: " +
               (cause.empty() ? std::string("cudaGetDeviceCount found none") : cause);
  }
  return p;
}

const Probe& probe() {
  static const Probe result = ask_cuda_in_child();
  return result;
}

void require_available(const char* fn) {
  if (!is_available()) TP_THROW(Error, "tp::cuda::", fn, ": ", unavailable_reason());
}

// The calling thread's current stream; empty handle: the default stream.
thread_local Stream t_current;

}  // namespace

bool is_built() { return true; }
bool is_available() { return probe().count > 0; }
std::string unavailable_reason() { return probe().reason; }
int device_count() { return probe().count; }

int current_device() {
  require_available("current_device");
  int device = 0;
  TP_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void set_device(int device) {
  require_available("set_device");
  TP_CHECK(device >= 0 && device < device_count(), "tp::cuda::set_device: device ", device,
           " does not exist; this machine has ", device_count(), " CUDA device(s)");
  TP_CUDA_CHECK(cudaSetDevice(device));
}

void synchronize_device() {
  require_available("synchronize_device");
  TP_CUDA_CHECK(cudaDeviceSynchronize());
}

std::string device_name(int device) {
  require_available("device_name");
  cudaDeviceProp prop{};
  TP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const auto gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  return detail::cat(prop.name, " (sm_", prop.major, prop.minor, ", ",
                     static_cast<long>(gib + 0.5), " GiB)");
}

// ---- streams ------------------------------------------------------------------

struct Stream::Owner {
  cudaStream_t stream = nullptr;
  ~Owner() {
    // Failures are cleared, not left as the thread's last error (see deallocate).
    if (stream != nullptr && cudaStreamDestroy(stream) != cudaSuccess) (void)cudaGetLastError();
  }
};

Stream Stream::create(int priority) {
  require_available("Stream::create");
  Stream s;
  s.owner_ = std::make_shared<Owner>();
  // Non-blocking: the legacy default stream would otherwise wait for this
  // stream's work (and it for the default stream's), serialising exactly the
  // overlap a communication stream exists for.
  TP_CUDA_CHECK(cudaStreamCreateWithPriority(&s.owner_->stream, cudaStreamNonBlocking, priority));
  return s;
}

StreamHandle Stream::handle() const { return owner_ ? owner_->stream : nullptr; }

void Stream::wait(const Event& event) const {
  TP_CUDA_CHECK(cudaStreamWaitEvent(handle(), event.handle(), 0));
}

void Stream::synchronize() const { TP_CUDA_CHECK(cudaStreamSynchronize(handle())); }

Stream current_stream() { return t_current; }

StreamGuard::StreamGuard(const Stream& stream) : previous_(t_current) { t_current = stream; }
StreamGuard::~StreamGuard() { t_current = previous_; }

// ---- events -------------------------------------------------------------------

struct Event::Owner {
  cudaEvent_t event = nullptr;
  ~Owner() {
    if (event != nullptr && cudaEventDestroy(event) != cudaSuccess) (void)cudaGetLastError();
  }
};

Event::Event(bool timing) : owner_(std::make_shared<Owner>()) {
  require_available("Event");
  TP_CUDA_CHECK(cudaEventCreateWithFlags(&owner_->event,
                                         timing ? cudaEventDefault : cudaEventDisableTiming));
}

EventHandle Event::handle() const { return owner_->event; }

void Event::record(const Stream& stream) const {
  TP_CUDA_CHECK(cudaEventRecord(owner_->event, stream.handle()));
}

bool Event::query() const {
  const cudaError_t status = cudaEventQuery(owner_->event);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  TP_CUDA_CHECK(status);
  return true;
}

void Event::synchronize() const { TP_CUDA_CHECK(cudaEventSynchronize(owner_->event)); }

float Event::elapsed_ms(const Event& start) const {
  float ms = 0;
  TP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.owner_->event, owner_->event));
  return ms;
}

// ---- memory -------------------------------------------------------------------

Allocation allocate(std::size_t nbytes) {
  require_available("allocate");
  Allocation a;
  a.stream = current_stream();
  TP_CUDA_CHECK(cudaGetDevice(&a.device));
  if (nbytes == 0) return a;  // an empty tensor owns no memory
  // Stream-ordered: cudaFree would wait for the whole device, stalling the
  // host behind every all-reduce in flight each time a temporary dies.
  TP_CUDA_CHECK(cudaMallocAsync(&a.data, nbytes, a.stream.handle()));
  return a;
}

void deallocate(const Allocation& allocation) noexcept {
  if (allocation.data == nullptr) return;
  // On the allocation's device: the legacy default stream (handle 0) is
  // the current device's, and the free must be ordered on the right one.
  int current = allocation.device;
  (void)cudaGetDevice(&current);
  if (current != allocation.device) (void)cudaSetDevice(allocation.device);
  // A destructor cannot throw. A failure here means the context is already
  // broken; clear it, so that the next launch's cudaGetLastError() does not
  // report it as its own (the next synchronising call reports a real fault).
  if (cudaFreeAsync(allocation.data, allocation.stream.handle()) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  if (current != allocation.device) (void)cudaSetDevice(current);
}

std::shared_ptr<void> allocate_pinned(std::size_t nbytes) {
  require_available("allocate_pinned");
  void* data = nullptr;
  TP_CUDA_CHECK(cudaMallocHost(&data, nbytes == 0 ? 1 : nbytes));
  return std::shared_ptr<void>(data, [](void* p) { (void)cudaFreeHost(p); });
}

void copy_async(void* dst, const void* src, std::size_t nbytes, const Stream& stream) {
  if (nbytes == 0) return;
  TP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream.handle()));
}

}  // namespace tp::cuda
