// tp::distributed::ProcessGroupNCCL: collectives over NCCL on a
// communication stream, completed and timed by a watchdog thread.
//
// The life of a collective:
//   1. The issuing thread checks the tensors, counts the collective, gives it
//      the next sequence number and registers its NcclWork as in flight.
//   2. It records an event on its current stream and makes the group's
//      communication stream wait for it (the collective reads what the
//      caller's kernels wrote), calls NCCL on the communication stream and
//      records the work's end event there. The host never waits.
//   3. The watchdog thread polls the works in flight every 2 ms: an end
//      event that has completed completes its work (finish(), and the
//      tensors are released); a work older than the timeout, or an
//      asynchronous NCCL error, fails the group: Note [Failing the group].
//   4. wait() makes the waiting thread's current stream wait for the end
//      event (and, with blocking_wait, blocks until the watchdog finished the
//      work).
#include "tensorplay/distributed/process_group_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#if __has_include(<cuda_bf16.h>)
// Defines __CUDA_BF16_TYPES_EXIST__, which says ncclBfloat16 exists (older
// nccl.h declare it only then; nccl_dtype tests it).
#include <cuda_bf16.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../cuda/check.h"
#include "nccl_backend.h"
#include "rendezvous/network.h"
#include "split_sizes.h"
#include "count_board.h"
#include "rendezvous/dir_store.h"
#include "rendezvous/store_rendezvous.h"
#include "tensorplay/cuda/runtime.h"
#include "tensorplay/distributed/init.h"
#include "tensorplay/error.h"
#include "tensorplay/cuda/device_trace.h"
#include "tensorplay/trace.h"

namespace tp::distributed {

using std::chrono::milliseconds;
using tp::detail::cat;

namespace {

constexpr const char* kWho = "tp::distributed::ProcessGroupNCCL";
constexpr milliseconds kPollInterval{2};

// "unhandled cuda error (run with NCCL_DEBUG=INFO for details); NCCL's last
// error: ...". ncclGetLastError ignores its argument (NCCL 2.13+), so it is
// safe with a null or aborted communicator.
std::string nccl_message(ncclResult_t result) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += cat("; NCCL's last error: ", last);
  return text;
}

void check_nccl(ncclResult_t result, const char* call, const std::string& context) {
  if (result == ncclSuccess) return;
  TP_THROW(DistributedError, context, ": ", call, " failed: ", nccl_message(result));
}

ncclDataType_t nccl_dtype(Dtype dtype) {
  switch (dtype) {
    case Dtype::Float32: return ncclFloat32;
    case Dtype::Float64: return ncclFloat64;
    case Dtype::Float16: return ncclFloat16;
    case Dtype::BFloat16:
#if defined(__CUDA_BF16_TYPES_EXIST__)
      return ncclBfloat16;
#else
      TP_THROW(DistributedError, kWho, ": a bfloat16 collective needs ncclBfloat16, which "
               "this build's nccl.h does not declare (no cuda_bf16.h: CUDA before 11); "
               "rebuild the kit against CUDA 11 or newer");
#endif
  }
  TP_THROW(Error, kWho, ": unknown dtype ", static_cast<int>(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return ncclSum;
    case ReduceOp::AVG: return ncclAvg;  // NCCL divides by the world size itself
    case ReduceOp::MIN: return ncclMin;
    case ReduceOp::MAX: return ncclMax;
  }
  TP_THROW(Error, kWho, ": unknown ReduceOp ", static_cast<int>(op));
}

// The error that `failure` is, with `prefix` in front: same type, so a
// timeout stays a timeout and a consequence a consequence.
[[noreturn]] void rethrow_with_prefix(const std::exception_ptr& failure,
                                      const std::string& prefix) {
  try {
    std::rethrow_exception(failure);
  } catch (const TimeoutError& e) {
    throw TimeoutError(prefix + e.what());
  } catch (const PeerFailedError& e) {
    throw PeerFailedError(prefix + e.what());
  } catch (const std::exception& e) {
    throw DistributedError(prefix + e.what());
  }
}

void check_tensor(const char* fn, int rank, int device, const Tensor& t, const std::string& what) {
  if (!t.defined()) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": ", what,
             " is undefined; pass a CUDA tensor (tp::zeros(shape, dtype, device) or t.to(...))");
  }
  if (t.device().type != DeviceType::CUDA) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": ", what, " is on ",
             to_string(t.device()), " but the nccl backend works on CUDA tensors; move it "
             "with .to(tp::Device{tp::DeviceType::CUDA, ", device,
             "}), or use the gloo backend for CPU tensors");
  }
  const int index = t.device().index < 0 ? cuda::current_device() : t.device().index;
  if (index != device) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": ", what, " is on cuda:", index,
             " but this rank's process group runs on cuda:", device,
             "; NCCL works on one GPU per rank: move the tensor to cuda:", device);
  }
  if (!t.is_contiguous()) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": ", what, " is not contiguous (shape ",
             tp::to_string(t.shape()), ", strides ", tp::to_string(t.strides()),
             "); a collective sends one dense block of memory: pass t.contiguous() and copy "
             "the result back after wait()");
  }
}

// Device memory that is given back, stream-ordered, when the scope ends.
struct ScopedAllocation {
  cuda::Allocation allocation;
  ~ScopedAllocation() { cuda::deallocate(allocation); }
};

}  // namespace

// ---- the work -------------------------------------------------------------------

namespace {

class NcclWork : public Work {
 public:
  NcclWork(const char* op, uint64_t seq, int rank, bool host_wait)
      : Work(op, seq, rank), host_wait_(host_wait) {}

  // Non-blocking unless host_wait_: the waiting thread's current stream is
  // ordered after the collective; the error is rethrown when already known.
  void wait() override {
    if (host_wait_) {
      Work::wait();  // blocks until the watchdog finished the work; rethrows
    } else {
      trace::Span span("wait", "comm", {{"seq", static_cast<int64_t>(seq())}});
      report_waiting(true);  // progress to the wait listener; nothing to wait for on the host
      report_waiting(false);
      if (std::exception_ptr error = error_if_finished()) std::rethrow_exception(error);
    }
    cuda::current_stream().wait(end);
  }

  void keep(std::shared_ptr<const void> storage) {
    std::lock_guard<std::mutex> lock(keep_mutex_);
    kept_.push_back(std::move(storage));
  }
  // Drops the tensors' storage: called once the collective completed (or
  // the communicator was aborted), so memory freed then is no longer read.
  void release() {
    std::vector<std::shared_ptr<const void>> dropped;
    {
      std::lock_guard<std::mutex> lock(keep_mutex_);
      dropped.swap(kept_);
    }
  }

  std::string name(int rank) const { return cat(collective(), " #", seq(), " on rank ", rank); }

  const cuda::Event end;  // recorded on the communication stream after the collective
  std::chrono::steady_clock::time_point start;  // set before it is registered
  std::atomic<bool> launched{false};            // end has been recorded

 private:
  const bool host_wait_;
  std::mutex keep_mutex_;
  std::vector<std::shared_ptr<const void>> kept_;  // guarded by keep_mutex_
};

}  // namespace

// ---- Impl -----------------------------------------------------------------------

// Note [Failing the group]
// A failed NCCL collective leaves the communicator unusable (peers may be
// stuck in the kernel forever), so the first failure, found by the watchdog
// (timeout, asynchronous error, a faulting event) or at issue (an NCCL call
// that returned an error), does the same every time:
//   - it becomes the group's failure; the work it belongs to fails with it;
//   - the communicator is aborted (ncclCommAbort), which makes the kernels
//     in flight return, so the streams that wait for them do not hang;
//   - every other work in flight fails with tp::PeerFailedError naming the
//     first failure (or completes, when its end event already has);
//   - every later collective, and synchronize(), throws the failure's type
//     with its message.
// ncclCommAbort frees the communicator, so nothing may call NCCL with it
// afterwards: the issuing thread checks the failure under `mutex` and counts
// itself in `issuing` before it calls NCCL; the abort waits (a bounded
// while) for such a call to return: a call that does not is one that only
// the abort can end. The watchdog's ncclCommGetAsyncError and the abort hold
// `comm_mutex`, so they never overlap.
struct ProcessGroupNCCL::Impl {
  Impl(int rank, int size, milliseconds timeout, bool blocking_wait)
      : rank(rank), size(size), timeout(timeout), blocking_wait(blocking_wait) {}

  ~Impl() {
    try {
      {
        std::lock_guard<std::mutex> lock(mutex);
        stopping = true;
      }
      cv.notify_all();
      // The watchdog returns once nothing is in flight: every work completes
      // or fails within the timeout.
      if (watchdog.joinable()) watchdog.join();
      cuda::set_device(device);
      cuda::deallocate(barrier_buffer);  // on the communication stream, after the last barrier
      std::lock_guard<std::mutex> lock(comm_mutex);
      if (comm_alive) {
        (void)ncclCommDestroy(comm);
        comm_alive = false;
      }
    } catch (...) {
      // A destructor runs during unwinding too; the CUDA context is broken
      // if set_device fails here, and the process is ending anyway.
    }
  }

  // The group's failure, rethrown as "<op> #<seq> on rank r was not run: ...".
  void throw_if_failed(const char* op, uint64_t seq) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failure) return;
    rethrow_with_prefix(failure, cat(op, " #", seq, " on rank ", rank,
                                     " was not run: this process group stopped after ",
                                     failed, " failed: "));
  }

  // Steps 1 and 2 of the life of a collective. `launch` calls NCCL on
  // `stream`; `storages` stay alive until the collective completed.
  template <typename Launch>
  std::shared_ptr<Work> issue(const char* op, const char* queued_event, uint64_t nbytes,
                              std::vector<std::shared_ptr<const void>> storages, bool host_wait,
                              Launch launch) {
    const uint64_t seq = next_seq++;
    throw_if_failed(op, seq);
    cuda::set_device(device);
    auto work = std::make_shared<NcclWork>(op, seq, rank, host_wait || blocking_wait);
    for (auto& storage : storages) work->keep(std::move(storage));
    trace::instant(queued_event, "comm",
                   {{"seq", static_cast<int64_t>(seq)}, {"bytes", static_cast<int64_t>(nbytes)}});
    // The collective reads what the caller's stream wrote so far: the
    // communication stream waits for it, the host does not.
    const cuda::Event ready;
    ready.record(cuda::current_stream());
    stream.wait(ready);
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (failure) {
        // The watchdog failed the group since throw_if_failed.
        rethrow_with_prefix(failure, cat(work->name(rank), " was not run: this process "
                                         "group stopped after ", failed, " failed: "));
      }
      work->start = std::chrono::steady_clock::now();
      in_flight.push_back(work);
      ++issuing;
    }
    try {
      // The collective as the GPU runs it, on the trace's communication row
      // (tensorplay/cuda/device_trace.h); nothing when tracing is off.
      trace::DeviceSpan gpu((std::string("gpu ") + op).c_str(), stream, "communication stream",
                            {{"seq", static_cast<int64_t>(seq)}});
      launch();
      work->end.record(stream);
    } catch (...) {
      const std::exception_ptr error = std::current_exception();
      std::exception_ptr earlier;
      {
        std::lock_guard<std::mutex> lock(mutex);
        --issuing;
        earlier = failure;
      }
      cv.notify_all();
      if (earlier) {
        rethrow_with_prefix(earlier, cat(work->name(rank), " failed while the group was "
                                         "stopping after ", failed_name(), " failed: "));
      }
      fail(work, error);
      throw;
    }
    work->launched.store(true, std::memory_order_release);
    {
      std::lock_guard<std::mutex> lock(mutex);
      --issuing;
    }
    cv.notify_all();
    return work;
  }

  std::string failed_name() {
    std::lock_guard<std::mutex> lock(mutex);
    return failed;
  }

  // Note [Failing the group].
  void fail(const std::shared_ptr<NcclWork>& culprit, std::exception_ptr error) {
    std::vector<std::shared_ptr<NcclWork>> others;
    std::vector<bool> done_before_abort;  // per entry of others
    std::string first;
    {
      std::unique_lock<std::mutex> lock(mutex);
      if (!failure) {
        failure = error;
        failed = cat(culprit->collective(), " #", culprit->seq());
      }
      first = failed;
      for (const auto& w : in_flight) {
        if (w != culprit) others.push_back(w);
      }
      in_flight.clear();
      // Which of the others had completed before the abort: the abort makes
      // the kernels in flight return, and their end events then complete
      // too, which must not read as success.
      for (const auto& w : others) {
        bool done = false;
        try {
          done = w->launched.load(std::memory_order_acquire) && w->end.query();
        } catch (...) {
        }
        done_before_abort.push_back(done);
      }
      if (!aborting) {
        aborting = true;
        // A collective being issued is inside NCCL: let it return first,
        // unless it is stuck there (then only the abort ends it).
        cv.wait_for(lock, milliseconds(200), [this] { return issuing == 0; });
        lock.unlock();
        std::lock_guard<std::mutex> comm_lock(comm_mutex);
        if (comm_alive) {
          (void)ncclCommAbort(comm);
          comm_alive = false;
        }
      }
    }
    // The aborted kernels may still be leaving the GPU: their tensors'
    // memory (freed on its allocation stream, not after this one) is given
    // back only once the communication stream has drained; if it cannot be
    // drained, it is leaked rather than reused under a running kernel.
    bool drained = false;
    try {
      stream.synchronize();
      drained = true;
    } catch (...) {
    }
    culprit->finish(error);
    if (drained) culprit->release();
    for (size_t i = 0; i < others.size(); ++i) {
      const auto& w = others[i];
      if (done_before_abort[i]) {
        w->finish();
      } else {
        w->finish(std::make_exception_ptr(PeerFailedError(cat(
            w->name(rank), " did not complete: ", first, " failed first on this rank and the "
            "NCCL communicator was aborted; see that collective's error"))));
      }
      if (drained) w->release();
    }
  }

  // The watchdog thread: step 3 of the life of a collective.
  void watch() {
    trace::set_thread_name("nccl watchdog");
    try {
      cuda::set_device(device);
    } catch (...) {
    }
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      if (stopping && in_flight.empty()) return;
      cv.wait_for(lock, kPollInterval);
      if (in_flight.empty()) continue;
      const std::vector<std::shared_ptr<NcclWork>> works(in_flight.begin(), in_flight.end());
      lock.unlock();
      poll(works);
      lock.lock();
    }
  }

  void poll(const std::vector<std::shared_ptr<NcclWork>>& works) {
    const auto now = std::chrono::steady_clock::now();
    for (const auto& w : works) {
      if (w->launched.load(std::memory_order_acquire)) {
        bool done = false;
        try {
          done = w->end.query();
        } catch (const std::exception& e) {
          fail(w, std::make_exception_ptr(DistributedError(cat(
              w->name(rank), " failed on the GPU (NCCL): ", e.what()))));
          return;
        }
        if (done) {
          complete(w);
          continue;
        }
      }
      if (now - w->start > timeout) {
        fail(w, std::make_exception_ptr(TimeoutError(cat(
            w->name(rank), " timed out after ", timeout.count(),
            " ms (NCCL; another rank did not join this collective: did every rank issue the "
            "same collectives in the same order? Tensors of different sizes or dtypes, or a "
            "different reduce op, root or block sizes, count as different collectives. The "
            "NCCL communicator was aborted; this group cannot run further collectives)"))));
        return;
      }
    }
    ncclResult_t async = ncclSuccess;
    {
      std::lock_guard<std::mutex> comm_lock(comm_mutex);
      if (!comm_alive) return;
      const ncclResult_t asked = ncclCommGetAsyncError(comm, &async);
      if (asked != ncclSuccess) async = asked;
    }
    if (async == ncclSuccess || async == ncclInProgress) return;
    std::shared_ptr<NcclWork> oldest;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (in_flight.empty()) return;
      oldest = in_flight.front();
    }
    const std::string what =
        cat(oldest->name(rank), " failed: NCCL reported an asynchronous error: ",
            nccl_message(async));
    if (async == ncclRemoteError) {
      fail(oldest, std::make_exception_ptr(PeerFailedError(cat(
          what, " (another rank failed or left; see its error)"))));
    } else {
      fail(oldest, std::make_exception_ptr(DistributedError(
          cat(what, " (run with NCCL_DEBUG=INFO for NCCL's own account)"))));
    }
  }

  void complete(const std::shared_ptr<NcclWork>& w) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      const auto it = std::find(in_flight.begin(), in_flight.end(), w);
      if (it == in_flight.end()) return;  // the group failed meanwhile
      in_flight.erase(it);
    }
    w->finish();
    w->release();
  }

  const int rank;
  const int size;
  const milliseconds timeout;
  const bool blocking_wait;
  int device = 0;                      // constant after construction
  std::shared_ptr<Store> store;        // kept as long as the group (env://: rank 0 hosts it)
  cuda::Stream stream;                 // the communication stream
  cuda::Allocation barrier_buffer;     // one float, all-reduced by barrier()
  uint64_t next_seq = 1;               // issuing thread only

  std::mutex comm_mutex;               // Note [Failing the group]
  ncclComm_t comm = nullptr;           // guarded by comm_mutex once the watchdog runs
  bool comm_alive = false;             // guarded by comm_mutex

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::shared_ptr<NcclWork>> in_flight;  // guarded by mutex; in issue order
  std::exception_ptr failure;          // guarded by mutex: the group's first failure
  std::string failed;                  // guarded by mutex: "allreduce #7" once one failed
  bool aborting = false;               // guarded by mutex
  int issuing = 0;                     // guarded by mutex: threads inside NCCL calls
  bool stopping = false;               // guarded by mutex; set by the destructor

  std::thread watchdog;                // started last
};

// ---- construction -----------------------------------------------------------------

namespace {

// Note [One GPU per rank]
// NCCL cannot run two ranks of one communicator on one GPU: it fails inside
// ncclCommInitRank with "Duplicate GPU detected" (or hangs, in some
// versions). So before NCCL is called, every rank publishes its host, its
// device index and the device's PCI bus id (two processes see the same GPU
// under different indices when CUDA_VISIBLE_DEVICES differ), reads every
// other rank's, and fails, on every rank alike, with the fix.
void check_one_gpu_per_rank(Store& store, int rank, int size, int device, milliseconds timeout) {
  char bus_id[64] = {};
  TP_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id - 1, device));
  const std::string host = detail::host_name();
  store.set(cat("nccl/where/", rank), cat(host, "\n", bus_id, "\n", device));
  struct Where {
    std::string host, bus_id, device;
  };
  std::vector<Where> all;
  for (int r = 0; r < size; ++r) {
    const std::string text = store.get(cat("nccl/where/", r), timeout);
    Where w;
    const std::size_t a = text.find('\n');
    const std::size_t b = a == std::string::npos ? a : text.find('\n', a + 1);
    if (a == std::string::npos || b == std::string::npos) {
      TP_THROW(DistributedError, kWho, ": rank ", rank, ": rank ", r, " published '", text,
               "' under nccl/where/", r, " in ", store.describe(),
               ", not a host and a GPU; does another program use the same store?");
    }
    w.host = text.substr(0, a);
    w.bus_id = text.substr(a + 1, b - a - 1);
    w.device = text.substr(b + 1);
    for (int q = 0; q < r; ++q) {
      if (all[q].host == w.host && all[q].bus_id == w.bus_id) {
        TP_THROW(DistributedError, kWho, ": rank ", rank, ": NCCL cannot put two ranks on "
                 "one GPU (ranks ", q, " and ", r, " are both on cuda:", all[q].device,
                 all[q].device == w.device ? std::string() : cat(" (cuda:", w.device, " to rank ", r, ")"),
                 " of host ", w.host, "); give each rank its own GPU, or use the gloo backend, "
                 "which stages CUDA tensors through host memory [both ranks see the GPU with "
                 "PCI bus id ", w.bus_id, "]");
      }
    }
    all.push_back(std::move(w));
  }
}

ncclUniqueId exchange_unique_id(Store& store, int rank, milliseconds timeout) {
  constexpr const char* kKey = "nccl/unique_id";
  ncclUniqueId id{};
  if (rank == 0) {
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", cat(kWho, ": rank 0"));
    store.set(kKey, std::string(reinterpret_cast<const char*>(&id), sizeof id));
    return id;
  }
  std::string bytes;
  try {
    bytes = store.get(kKey, timeout);
  } catch (const TimeoutError& e) {
    TP_THROW(TimeoutError, kWho, ": rank ", rank, ": waited ", timeout.count(),
             " ms for rank 0's ncclUniqueId under key '", kKey, "' in ", store.describe(),
             "; did rank 0 fail or exit before publishing it? (", e.what(), ")");
  }
  if (bytes.size() != sizeof id) {
    TP_THROW(DistributedError, kWho, ": rank ", rank, ": the value under '", kKey, "' in ",
             store.describe(), " has ", bytes.size(), " bytes, not an ncclUniqueId (",
             sizeof id, " bytes); do all ranks run the same NCCL version?");
  }
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(&id));
  return id;
}

}  // namespace

ProcessGroupNCCL::ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size,
                                   NcclOptions options)
    : ProcessGroup(rank, size),  // checks 1 <= size and 0 <= rank < size first
      options_(options),
      impl_(std::make_unique<Impl>(rank, size, options.timeout, options.blocking_wait)) {
  if (options_.timeout.count() <= 0) {
    TP_THROW(DistributedError, kWho, ": rank ", rank, ": NcclOptions::timeout must be "
             "positive (got ", options_.timeout.count(), " ms)");
  }
  if (!store) TP_THROW(DistributedError, kWho, ": rank ", rank, ": the store is null");
  if (!cuda::is_available()) {
    TP_THROW(DistributedError, kWho, ": rank ", rank, ": ", cuda::unavailable_reason(),
             "; use backend \"gloo\"");
  }
  const int count = cuda::device_count();
  const int device = options_.device >= 0 ? options_.device : rank % count;
  if (device >= count) {
    TP_THROW(DistributedError, kWho, ": rank ", rank, ": NcclOptions::device is ", device,
             " but this machine has ", count, " CUDA device(s); pass -1 for rank % ", count);
  }
  impl_->device = device;
  impl_->store = std::move(store);
  Store& s = *impl_->store;
  // Rank 0's ncclUniqueId first: a missing rank 0 is a timeout naming its
  // key. Then the claims and world sizes (Note [Rendezvous in a store]),
  // then Note [One GPU per rank], all before NCCL sees the id.
  const ncclUniqueId id = exchange_unique_id(s, rank, options_.timeout);
  detail::meet_in_store(s, rank, size, options_.timeout, kWho);
  // After the ranks agreed on the world size, which sizes the board.
  // A file:// job's directory store: its ranks share a machine, and a
  // mapped file is faster than the store's files (count_board.h).
  if (const auto* dir = dynamic_cast<const detail::DirStore*>(impl_->store.get())) {
    set_count_board(std::make_shared<detail::FileCountBoard>(dir->dir(), size));
  } else {
    set_count_board(std::make_shared<detail::StoreCountBoard>(impl_->store));
  }
  check_one_gpu_per_rank(s, rank, size, device, options_.timeout);

  cuda::set_device(device);
  const std::string context = cat(kWho, ": rank ", rank, " of ", size, " on cuda:", device);
  check_nccl(ncclCommInitRank(&impl_->comm, size, id, rank), "ncclCommInitRank", context);
  impl_->comm_alive = true;
  // Highest priority, as PyTorch's NCCL streams: a collective's kernels are
  // scheduled ahead of the backward pass it overlaps with.
  int least = 0;
  int greatest = 0;
  TP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  impl_->stream = cuda::Stream::create(greatest);
  {
    const cuda::StreamGuard on_comm(impl_->stream);
    impl_->barrier_buffer = cuda::allocate(sizeof(float));
  }
  impl_->watchdog = std::thread([impl = impl_.get()] { impl->watch(); });
}

ProcessGroupNCCL::~ProcessGroupNCCL() = default;  // Impl drains, joins the watchdog, destroys

int ProcessGroupNCCL::device() const { return impl_->device; }

void ProcessGroupNCCL::synchronize() {
  std::vector<std::shared_ptr<NcclWork>> works;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    works.assign(impl_->in_flight.begin(), impl_->in_flight.end());
  }
  for (const auto& w : works) w->Work::wait();  // the host waits; rethrows a failure
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->failure) {
    rethrow_with_prefix(impl_->failure, cat(kWho, "::synchronize: rank ", rank(),
                                            ": this process group stopped after ",
                                            impl_->failed, " failed: "));
  }
}

bool ProcessGroupNCCL::can_reduce(Dtype dtype) const {
#if defined(__CUDA_BF16_TYPES_EXIST__)
  (void)dtype;
  return true;
#else
  return dtype != kBFloat16;  // nccl_dtype refuses it: no ncclBfloat16 in this build
#endif
}

// ---- the collectives --------------------------------------------------------------

std::shared_ptr<Work> ProcessGroupNCCL::allreduce(const Tensor& tensor, ReduceOp op) {
  constexpr const char* fn = "tp::distributed::ProcessGroupNCCL::allreduce";
  check_tensor(fn, rank(), impl_->device, tensor, "the tensor");
  const ncclRedOp_t nccl_reduce = nccl_op(op);
  charge_budget("allreduce");
  ++counters_.allreduce;
  counters_.allreduce_elements += static_cast<uint64_t>(tensor.numel());
  counters_.allreduce_bytes += static_cast<uint64_t>(tensor.nbytes());
  void* data = tensor.data_ptr();
  const auto count = static_cast<std::size_t>(tensor.numel());
  const ncclDataType_t dtype = nccl_dtype(tensor.dtype());
  Impl* impl = impl_.get();
  return impl->issue("allreduce", "allreduce queued", tensor.nbytes(), {tensor.storage()}, false,
                     [=] {
    if (count == 0) return;
    check_nccl(ncclAllReduce(data, data, count, dtype, nccl_reduce, impl->comm,
                             impl->stream.handle()),
               "ncclAllReduce", cat(fn, ": rank ", impl->rank));
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::broadcast(const Tensor& tensor, int root) {
  constexpr const char* fn = "tp::distributed::ProcessGroupNCCL::broadcast";
  check_tensor(fn, rank(), impl_->device, tensor, "the tensor");
  if (root < 0 || root >= size()) {
    TP_THROW(DistributedError, fn, ": rank ", rank(), ": root ", root,
             " is out of range for world size ", size(), "; pass a rank in 0 .. ",
             size() - 1);
  }
  charge_budget("broadcast");
  ++counters_.broadcast;
  counters_.broadcast_bytes += static_cast<uint64_t>(tensor.nbytes());
  void* data = tensor.data_ptr();
  const auto count = static_cast<std::size_t>(tensor.numel());
  const ncclDataType_t dtype = nccl_dtype(tensor.dtype());
  Impl* impl = impl_.get();
  return impl->issue("broadcast", "broadcast queued", tensor.nbytes(), {tensor.storage()}, false,
                     [=] {
    if (count == 0) return;
    check_nccl(ncclBroadcast(data, data, count, dtype, root, impl->comm, impl->stream.handle()),
               "ncclBroadcast", cat(fn, ": rank ", impl->rank));
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::allgather(const std::vector<Tensor>& outputs,
                                                  const Tensor& input) {
  constexpr const char* fn = "tp::distributed::ProcessGroupNCCL::allgather";
  check_tensor(fn, rank(), impl_->device, input, "the input");
  if (static_cast<int>(outputs.size()) != size()) {
    TP_THROW(DistributedError, fn, ": rank ", rank(), ": got ", outputs.size(),
             " output tensors for world size ", size(), "; pass one output per rank");
  }
  std::vector<std::shared_ptr<const void>> storages{input.storage()};
  std::vector<void*> outs;
  for (std::size_t r = 0; r < outputs.size(); ++r) {
    const std::string what = cat("outputs[", r, "]");
    check_tensor(fn, rank(), impl_->device, outputs[r], what);
    if (outputs[r].shape() != input.shape() || outputs[r].dtype() != input.dtype()) {
      TP_THROW(DistributedError, fn, ": rank ", rank(), ": ", what, " has shape ",
               tp::to_string(outputs[r].shape()), " and dtype ", to_string(outputs[r].dtype()),
               " but the input has shape ", tp::to_string(input.shape()), " and dtype ",
               to_string(input.dtype()), "; every output must match the input");
    }
    storages.push_back(outputs[r].storage());
    outs.push_back(outputs[r].data_ptr());
  }
  charge_budget("allgather");
  ++counters_.allgather;
  counters_.allgather_bytes += static_cast<uint64_t>(input.nbytes()) * outputs.size();
  const void* in = input.data_ptr();
  const std::size_t nbytes = input.nbytes();
  const auto count = static_cast<std::size_t>(input.numel());
  const ncclDataType_t dtype = nccl_dtype(input.dtype());
  Impl* impl = impl_.get();
  return impl->issue("allgather", "allgather queued", nbytes, std::move(storages), false,
                     [=] {
    if (count == 0) return;
    // NCCL gathers into one buffer holding every rank's block in rank order;
    // the outputs are separate tensors, so gather into a flat buffer on the
    // communication stream and copy each block out there. The buffer is
    // given back on that stream, after the copies.
    ScopedAllocation flat;
    {
      const cuda::StreamGuard on_comm(impl->stream);
      flat.allocation = cuda::allocate(nbytes * outs.size());
    }
    check_nccl(ncclAllGather(in, flat.allocation.data, count, dtype, impl->comm,
                             impl->stream.handle()),
               "ncclAllGather", cat(fn, ": rank ", impl->rank));
    for (std::size_t r = 0; r < outs.size(); ++r) {
      cuda::copy_async(outs[r], static_cast<const std::byte*>(flat.allocation.data) + r * nbytes,
                       nbytes, impl->stream);
    }
  });
}

// Note [Uneven blocks on NCCL]
// ncclReduceScatter and ncclAllGather take one count for every rank, so
// they run the flat collectives only when the blocks are equal. Uneven
// blocks are done as PyTorch's NCCL backend does its lists of tensors of
// different sizes: one rooted collective per rank, all in one NCCL group,
// which NCCL launches together. For a reduce-scatter, ncclReduce of block r
// to root r (its recvbuff is read on the root only); for an all-gather,
// ncclBroadcast of block r from root r (its sendbuff is read on the root
// only). Each rank still receives only what it needs, in W smaller
// collectives instead of one. Empty blocks are skipped, on every rank alike:
// the block sizes are the same everywhere (process_group.h). The buffer a
// rank other than the root does not use is given as the block itself, as
// PyTorch gives it, so no NCCL version's pointer check sees a null.

namespace {

// Runs `calls` (NCCL calls, each returning an ncclResult_t) inside
// ncclGroupStart / ncclGroupEnd, ending the group even when one fails.
template <typename Calls>
void nccl_group(const std::string& context, Calls calls) {
  check_nccl(ncclGroupStart(), "ncclGroupStart", context);
  std::string failed_call;
  ncclResult_t result = ncclSuccess;
  try {
    calls(result, failed_call);
  } catch (...) {
    (void)ncclGroupEnd();
    throw;
  }
  const ncclResult_t ended = ncclGroupEnd();
  check_nccl(result, failed_call.c_str(), context);
  check_nccl(ended, "ncclGroupEnd", context);
}

}  // namespace

std::shared_ptr<Work> ProcessGroupNCCL::reduce_scatter_tensor(
    const Tensor& output, const Tensor& input, const std::vector<int64_t>& split_sizes,
    ReduceOp op) {
  constexpr const char* fn = "tp::distributed::ProcessGroupNCCL::reduce_scatter_tensor";
  check_tensor(fn, rank(), impl_->device, output, "the output");
  check_tensor(fn, rank(), impl_->device, input, "the input");
  const std::vector<int64_t> sizes =
      detail::check_blocks(fn, rank(), size(), input, "input", output, "output", split_sizes);
  const ncclRedOp_t nccl_reduce = nccl_op(op);
  const ncclDataType_t dtype = nccl_dtype(input.dtype());
  charge_budget("reduce_scatter_tensor");
  ++counters_.reduce_scatter;
  counters_.reduce_scatter_bytes += static_cast<uint64_t>(input.nbytes());
  const std::vector<int64_t> offsets = detail::block_offsets(sizes);
  const bool even = std::all_of(sizes.begin(), sizes.end(),
                                [&](int64_t n) { return n == sizes.front(); });
  const auto* in = static_cast<const std::byte*>(input.data_ptr());
  void* out = output.data_ptr();
  const std::size_t element = input.element_size();
  const int64_t total = input.numel();
  Impl* impl = impl_.get();
  return impl->issue("reduce_scatter_tensor", "reduce_scatter_tensor queued", input.nbytes(),
                     {input.storage(), output.storage()}, false, [=] {
    if (total == 0) return;
    const std::string context = cat(fn, ": rank ", impl->rank);
    if (even) {
      check_nccl(ncclReduceScatter(in, out, static_cast<std::size_t>(sizes.front()), dtype,
                                   nccl_reduce, impl->comm, impl->stream.handle()),
                 "ncclReduceScatter", context);
      return;
    }
    // Note [Uneven blocks on NCCL]
    nccl_group(context, [&](ncclResult_t& result, std::string& failed_call) {
      for (int r = 0; r < impl->size && result == ncclSuccess; ++r) {
        if (sizes[r] == 0) continue;
        const std::byte* block = in + offsets[r] * static_cast<int64_t>(element);
        // Off the root, recvbuff is not written; the block itself, as PyTorch passes.
        result = ncclReduce(block, r == impl->rank ? out : const_cast<std::byte*>(block),
                            static_cast<std::size_t>(sizes[r]), dtype, nccl_reduce, r,
                            impl->comm, impl->stream.handle());
        if (result != ncclSuccess) failed_call = cat("ncclReduce (block ", r, ")");
      }
    });
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::allgather_into_tensor(
    const Tensor& output, const Tensor& input, const std::vector<int64_t>& split_sizes) {
  constexpr const char* fn = "tp::distributed::ProcessGroupNCCL::allgather_into_tensor";
  check_tensor(fn, rank(), impl_->device, output, "the output");
  check_tensor(fn, rank(), impl_->device, input, "the input");
  const std::vector<int64_t> sizes =
      detail::check_blocks(fn, rank(), size(), output, "output", input, "input", split_sizes);
  const ncclDataType_t dtype = nccl_dtype(input.dtype());
  charge_budget("allgather_into_tensor");
  ++counters_.allgather;
  counters_.allgather_bytes += static_cast<uint64_t>(output.nbytes());
  const std::vector<int64_t> offsets = detail::block_offsets(sizes);
  const bool even = std::all_of(sizes.begin(), sizes.end(),
                                [&](int64_t n) { return n == sizes.front(); });
  const void* in = input.data_ptr();
  auto* out = static_cast<std::byte*>(output.data_ptr());
  const std::size_t element = output.element_size();
  const int64_t total = output.numel();
  Impl* impl = impl_.get();
  return impl->issue("allgather_into_tensor", "allgather_into_tensor queued", output.nbytes(),
                     {input.storage(), output.storage()}, false, [=] {
    if (total == 0) return;
    const std::string context = cat(fn, ": rank ", impl->rank);
    if (even) {
      check_nccl(ncclAllGather(in, out, static_cast<std::size_t>(sizes.front()), dtype,
                               impl->comm, impl->stream.handle()),
                 "ncclAllGather", context);
      return;
    }
    // Note [Uneven blocks on NCCL]
    nccl_group(context, [&](ncclResult_t& result, std::string& failed_call) {
      for (int r = 0; r < impl->size && result == ncclSuccess; ++r) {
        if (sizes[r] == 0) continue;
        std::byte* block = out + offsets[r] * static_cast<int64_t>(element);
        // Off the root, sendbuff is not read; the block itself, as PyTorch passes.
        result = ncclBroadcast(r == impl->rank ? in : block, block,
                               static_cast<std::size_t>(sizes[r]), dtype, r, impl->comm,
                               impl->stream.handle());
        if (result != ncclSuccess) failed_call = cat("ncclBroadcast (block ", r, ")");
      }
    });
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::barrier() {
  charge_budget("barrier");
  ++counters_.barrier;
  Impl* impl = impl_.get();
  // A one-element all-reduce; its wait() blocks the host (host_wait), which
  // is what a barrier is for.
  return impl->issue("barrier", "barrier queued", 0, {}, true, [impl] {
    check_nccl(ncclAllReduce(impl->barrier_buffer.data, impl->barrier_buffer.data, 1,
                             ncclFloat32, ncclSum, impl->comm, impl->stream.handle()),
               "ncclAllReduce (barrier)", cat("tp::distributed::ProcessGroupNCCL::barrier: rank ",
                                              impl->rank));
  });
}

// ---- make_process_group's view --------------------------------------------------

std::string nccl_unavailable_reason() {
  return cuda::is_available() ? std::string() : cuda::unavailable_reason();
}

std::shared_ptr<ProcessGroup> detail::make_nccl_group(std::shared_ptr<Store> store, int rank,
                                                      int size, milliseconds timeout,
                                                      bool blocking_wait) {
  NcclOptions options;
  options.timeout = timeout;
  options.blocking_wait = blocking_wait;
  return std::make_shared<ProcessGroupNCCL>(std::move(store), rank, size, options);
}

}  // namespace tp::distributed
