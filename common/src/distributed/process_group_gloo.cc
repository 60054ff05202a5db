// tp::distributed::ProcessGroupGloo: collectives over Gloo's TCP transport,
// run in issue order on one communication thread.
//
// The life of a collective:
//   1. The calling thread checks the tensors (so a bad input fails at once,
//      on the line that passed it), counts it, gives it the next sequence
//      number, records "<op> queued" and puts a Task on the queue.
//   2. The communication thread pops tasks one by one and runs each inside
//      a trace span "<op>"; Gloo blocks it until every rank has joined.
//   3. It calls work->finish(), with the error if Gloo threw; wait() on the
//      calling thread returns or rethrows.
// In checker mode (GlooOptions::check_in_flight_writes) an all-reduce or a
// broadcast runs on a copy of its tensor, and wait() checks that nothing
// wrote the tensor meanwhile before it copies the result in; a second one on
// a tensor whose first is not yet waited for is refused: Note [In-flight
// writes].
// One thread, one queue: collectives run one at a time in issue order, the
// CPU analogue of a CUDA communication stream.
// CUDA tensors are staged through pinned host memory around the Gloo call:
// Note [Staging CUDA tensors].
#include "tensorplay/distributed/process_group_gloo.h"

#include <fcntl.h>
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <array>
#include <cstdlib>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <vector>

#include "network.h"
#include "rank_list.h"
#include "rendezvous_dir.h"
#include "store_rendezvous.h"
#include "tensorplay/cuda/runtime.h"
#include "tensorplay/error.h"
#include "tensorplay/cuda/device_trace.h"
#include "tensorplay/trace.h"

namespace tp::distributed {

using std::chrono::milliseconds;
using tp::detail::cat;

namespace {

constexpr const char* kWho = "tp::distributed::ProcessGroupGloo";

// Note [Rendezvous in two steps]
// Gloo's FileStore rendezvous reports a missing rank as "Wait timeout for
// key(s): [2]" (and measures its timeout in whole seconds). So before Gloo
// sees the directory, every rank drops a marker file and waits until all
// markers are there: a missing rank becomes an error that lists who arrived
// and who did not, and the Gloo step only connects processes known to be
// alive. A marker that already exists means the directory is being reused;
// Gloo would then read an earlier job's addresses, so that is an error too.
// Each marker holds its rank's world size (written to a temporary name, then
// renamed, so a marker is never seen half-written): ranks that disagree on it
// learn so at once, with both sizes, instead of Gloo's "136 vs 68".
// connectFullMesh can return on one rank while another is still connecting
// (its last pair's handshake in flight), and a rank that left at that moment
// would fail its peer inside the rendezvous. So the constructor ends with one
// Gloo barrier, not counted in counters() and without a user-visible sequence
// number: when it returns, every rank has connected.
std::string marker_path(const std::string& dir, int rank) {
  return dir + "/tp-rank-" + std::to_string(rank) + ".arrived";
}

[[noreturn]] void marker_write_failed(const std::string& path, int rank, int err) {
  TP_THROW(DistributedError, kWho, ": rank ", rank, ": cannot write '", path, "' (",
           std::strerror(err), ")",
           err == ENOSPC ? ": the disk holding the rendezvous directory is full; free space "
                           "or set TMPDIR to another disk"
                         : "; pass file://DIR with a directory every rank can write");
}

// Drops this rank's marker, holding its world size.
void write_marker(const std::string& dir, int rank, int size) {
  const std::string mine = marker_path(dir, rank);
  if (::access(mine.c_str(), F_OK) == 0) {
    TP_THROW(DistributedError, kWho, ": rank ", rank, " of ", size,
             ": the rendezvous directory '", dir, "' already holds a marker for rank ",
             rank, ", left by an earlier job or by another process given the same rank; "
             "use a fresh directory for every job (tp::TempDir) and a distinct rank "
             "per process");
  }
  const std::string temporary = mine + ".writing-" + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) marker_write_failed(temporary, rank, errno);
  // A few bytes into a fresh file: one write() writes them all or fails (a
  // short count here can only mean the disk filled up).
  const std::string text = std::to_string(size) + "\n";
  const ssize_t n = ::write(fd, text.data(), text.size());
  int err = n < 0 ? errno : (n != static_cast<ssize_t>(text.size()) ? ENOSPC : 0);
  if (::close(fd) != 0 && err == 0) err = errno;  // some filesystems report ENOSPC here
  if (err != 0) {
    ::unlink(temporary.c_str());
    marker_write_failed(temporary, rank, err);
  }
  // link(), not rename(): it fails if the marker exists, so two processes
  // given the same rank cannot both get through.
  const int linked = ::link(temporary.c_str(), mine.c_str());
  const int link_err = errno;
  ::unlink(temporary.c_str());
  if (linked != 0 && link_err == EEXIST) {
    TP_THROW(DistributedError, kWho, ": rank ", rank, " of ", size, ": another process given "
             "rank ", rank, " arrived at the same moment in '", dir, "'; give every process "
             "a distinct rank");
  }
  if (linked != 0) marker_write_failed(mine, rank, link_err);
}

// The world size in rank r's marker; 0 if the marker is not there (yet).
int marker_world_size(const std::string& dir, int r) {
  const int fd = ::open(marker_path(dir, r).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[32] = {};
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  return n > 0 ? std::atoi(text) : 0;
}

void wait_for_all_ranks(const std::string& dir, int rank, int size, milliseconds timeout) {
  write_marker(dir, rank, size);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    std::vector<int> arrived;
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      const int theirs = marker_world_size(dir, r);
      (theirs > 0 ? arrived : missing).push_back(r);
      if (theirs > 0 && theirs != size) {
        TP_THROW(DistributedError, kWho, ": rank ", rank, " was started with world size ",
                 size, " but rank ", r, " with world size ", theirs,
                 "; every rank of a job must be given the same world size");
      }
    }
    // A rank beyond this rank's world size that arrived says the same.
    if (const int theirs = marker_world_size(dir, size); theirs > 0) {
      TP_THROW(DistributedError, kWho, ": rank ", rank, " was started with world size ",
               size, " but rank ", size, " (outside it) arrived with world size ", theirs,
               "; every rank of a job must be given the same world size");
    }
    if (missing.empty()) return;
    if (std::chrono::steady_clock::now() - start >= timeout) {
      TP_THROW(DistributedError, kWho, ": rank ", rank, " of ", size, " waited ",
               timeout.count(), " ms for the others at rendezvous in '", dir,
               "'; arrived: ", detail::rank_list(arrived),
               "; missing: ", detail::rank_list(missing),
               ". Did every rank start and call init_process_group with the same "
               "file:// directory and world size?");
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
}

// ---- checks on the calling thread --------------------------------------------

void check_tensor(const char* fn, int rank, const Tensor& t, const std::string& what) {
  if (!t.defined()) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": ", what,
             " is undefined; pass a tensor made by tp::zeros, tp::tensor or a model");
  }
  // CPU tensors, and CUDA tensors staged through host memory (Note [Staging
  // CUDA tensors]); a CUDA tensor exists only in a build with CUDA.
  if (t.dtype() != kFloat32 && t.dtype() != kFloat64) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": ", what, " has dtype ",
             to_string(t.dtype()), "; the gloo backend supports float32 and float64");
  }
  if (!t.is_contiguous()) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": ", what,
             " is not contiguous (shape ", tp::to_string(t.shape()), ", strides ",
             tp::to_string(t.strides()), "); a collective sends one dense block of memory: "
             "pass t.contiguous() and copy the result back after wait()");
  }
}

// Note [Staging CUDA tensors]
// Gloo reads and writes host memory only, and NCCL cannot put two ranks on
// one GPU (ProcessGroupNCCL refuses it), so a job whose ranks share a GPU
// (a laptop, a lesson on one card) runs its CUDA tensors' collectives on
// the gloo backend, through pinned host buffers:
//   1. At issue, on the calling thread: an event `ready` is recorded on the
//      caller's current stream, after the kernels that wrote the tensor.
//      The host does not wait.
//   2. On the communication thread: the group's own communication stream
//      for that GPU (non-blocking, made at first need) waits for `ready`,
//      copies device -> pinned host buffer (cached per GPU, size and
//      position in the collective), and the thread synchronises that stream
//      (Gloo is about to read the host buffer);
//   3. Gloo runs the collective on the host buffers, as for a CPU tensor;
//   4. the stream copies host -> device and records an event `done`; the
//      thread does not wait for it, and finishes the work.
//   5. wait() returns once Gloo finished (as for a CPU tensor) and makes the
//      caller's current stream wait for `done`: kernels queued after wait()
//      see the result, with no device synchronisation.
// The tensors' storage stays alive until `done` has completed (the
// communication thread holds it in `retiring`), so memory freed by the
// caller meanwhile is not reused under the copy back. A pinned buffer is
// reused by the next collective of its size only after the copy back from
// it: both run on the one communication stream of that GPU.
// Checker mode (GlooOptions::check_in_flight_writes) does not take CUDA
// tensors: its comparison at wait() would need a device synchronisation in
// wait(), the very thing staging avoids; it refuses them at issue.
// All of this is inert without CUDA: no CUDA tensor can exist then
// (tp::cuda::is_built() is false), so no Staging is ever made.

// A CUDA tensor's block, staged through a pinned host buffer.
struct StagedBlock {
  void* device_data = nullptr;  // the tensor's memory on its GPU
  std::size_t nbytes = 0;
  bool copy_in = false;   // device -> host before the collective
  bool copy_out = false;  // host -> device after it
  void* host = nullptr;   // the pinned buffer; set on the communication thread
};

// The CUDA side of one collective (Note [Staging CUDA tensors]).
struct Staging {
  explicit Staging(int device) : device(device) {}
  const int device;
  const cuda::Event ready;  // recorded at issue on the caller's current stream
  std::vector<std::shared_ptr<StagedBlock>> blocks;
  std::vector<std::shared_ptr<const void>> keep;  // the tensors' storage
  // Recorded by the communication thread after the copies back, before the
  // work finishes; read by wait() after it has.
  std::optional<cuda::Event> done;
};

// What the communication thread needs of a tensor: its bytes, kept alive by
// the storage handle. Not the Tensor itself: the communication thread never
// touches a TensorImpl or the autograd graph, only memory it was handed.
struct Buffer {
  std::shared_ptr<const void> keep_alive;  // the tensor's Storage, or a checker-mode copy
  void* data = nullptr;
  std::size_t numel = 0;
  std::size_t nbytes = 0;
  Dtype dtype = kFloat32;
  std::shared_ptr<StagedBlock> staged;  // set for a CUDA tensor: Gloo works on its host copy

  // The memory Gloo works on: the tensor's (or a checker-mode copy), or the
  // pinned host buffer of a staged CUDA tensor.
  void* ptr() const { return staged ? staged->host : data; }
};

bool is_cuda(const Tensor& t) { return t.device().type == DeviceType::CUDA; }

// The Staging of a collective whose tensors are on CUDA `device` (Note
// [Staging CUDA tensors], step 1 once every block is added: see arm()).
std::shared_ptr<Staging> begin_staging(const char* fn, int rank, const Tensor& t,
                                       bool check_in_flight_writes) {
  if (check_in_flight_writes) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": checker mode "
             "(GlooOptions::check_in_flight_writes) does not take CUDA tensors (this one is on ",
             to_string(t.device()), "): checking for writes at wait() would synchronise the "
             "device; run the checker on CPU tensors, or turn checker mode off");
  }
  const int device = t.device().index < 0 ? cuda::current_device() : t.device().index;
  // The `ready` event is recorded on the caller's current stream, which
  // belongs to the current device: it orders the copy after the kernels that
  // wrote the tensor only when that is the tensor's device.
  if (device != cuda::current_device()) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": the tensor is on cuda:", device,
             " but this thread's current device is cuda:", cuda::current_device(),
             "; call tp::cuda::set_device(", device, ") first");
  }
  return std::make_shared<Staging>(device);
}

// A staged block for CUDA tensor `t` in `staging`; the Buffer Gloo sees.
Buffer staged_buffer(const char* fn, int rank, Staging& staging, const Tensor& t,
                     bool copy_in, bool copy_out) {
  const int device = t.device().index < 0 ? cuda::current_device() : t.device().index;
  if (device != staging.device) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": the tensors of one collective are on "
             "cuda:", staging.device, " and cuda:", device, "; put them on one GPU");
  }
  auto block = std::make_shared<StagedBlock>();
  block->device_data = t.data_ptr();
  block->nbytes = t.nbytes();
  block->copy_in = copy_in;
  block->copy_out = copy_out;
  staging.blocks.push_back(block);
  staging.keep.push_back(t.storage());
  return Buffer{t.storage(), nullptr, static_cast<std::size_t>(t.numel()), t.nbytes(),
                t.dtype(), std::move(block)};
}

// Step 1: the blocks are read only after what the caller's stream queued so far.
void arm(Staging& staging) { staging.ready.record(cuda::current_stream()); }

Buffer buffer_of(const Tensor& t) {
  return Buffer{t.storage(), t.data_ptr(), static_cast<std::size_t>(t.numel()), t.nbytes(),
                t.dtype(), nullptr};
}

// Note [In-flight writes]
// A collective's tensor belongs to the collective from the call that issues
// it until wait() returns (process_group.h). A program that writes it in
// between (divides a gradient, then waits for its all-reduce) races with the
// communication thread: written before the collective reads it, the result
// is right; written while Gloo sums, it is wrong in a different way on every
// run; written after, right again; before on one rank and after on another,
// the ranks disagree. So such a bug passes some runs and fails others, each
// time with another diagnosis. With
// GlooOptions::check_in_flight_writes (checker mode) the race is taken out
// and the write is seen on every run:
//   - at issue, the tensor's bytes are copied twice: `sent`, which the
//     communication thread reduces (or broadcasts into) in its place, and
//     `issued`, kept to compare;
//   - so the communication thread never touches the tensor's memory, and
//     between issue and wait() only the program can change it;
//   - the first wait() compares the tensor with `issued`: a difference is a
//     write while the collective was in flight, an error naming the
//     collective, the tensor's shape and the first element that changed;
//     otherwise it copies the result from `sent` into the tensor;
//   - a second collective issued on memory that one still in flight owns
//     (issued and not yet waited for) is an error at once, naming both:
//     each would deliver its result at its own wait(), and the later one
//     would look like a write in flight. A Work dropped without a wait()
//     keeps its tensor (its result never arrives), so the next collective
//     on that tensor names the forgotten wait() (InFlightClaims below).
// The result reaches the tensor at wait(), not before, which the contract
// allows (outputs are read only after wait()); a Work never waited for
// leaves its tensor as it was, which makes a forgotten wait() fail every
// run too. A check, not a checksum: comparing every byte costs no more than
// hashing them, and can say which element changed and how.

// In checker mode, the buffer a collective works on instead of `tensor`'s
// memory: a copy of it (`sent` above); otherwise the tensor's own memory.
Buffer buffer_for_collective(const Tensor& tensor, bool check_in_flight_writes) {
  Buffer buf = buffer_of(tensor);
  if (!check_in_flight_writes || buf.nbytes == 0) return buf;
  auto sent = std::make_shared<std::vector<std::byte>>(buf.nbytes);
  std::memcpy(sent->data(), buf.data, buf.nbytes);
  buf.data = sent->data();
  buf.keep_alive = std::move(sent);
  return buf;
}

// "4 (0.25 when issued, 0.125 at wait())": element i of two copies of a
// float32 or float64 block.
std::string changed_element(const void* before, const void* after, std::size_t i, Dtype dtype) {
  auto value = [&](const void* block) {
    return dtype == kFloat64 ? static_cast<const double*>(block)[i]
                             : static_cast<double>(static_cast<const float*>(block)[i]);
  };
  return cat(i, " (", value(before), " when issued, ", value(after), " at wait())");
}

// Checker mode's record of which memory each collective in flight owns: from
// its issue until its first wait() delivers the result. A Work dropped
// without a wait() never delivers, so by the contract its tensor stays its
// own: a later collective on it is refused too, and the error says that
// wait() was forgotten (the caller's handle tells the claims when it is
// dropped: arm_checks below). A claim also ends when its tensor's storage is
// freed, so memory reused by a new tensor is not mistaken for the old one;
// an unwaited Work itself keeps that storage alive (its first-wait check
// holds it), so this happens only once the tensor and the Work are both
// gone. The check runs just after the collective was queued: a refused
// collective still runs, paired with its peers' (which issued it too), and
// the error comes on the line that issued it. Shared by the group and the
// Works' first-wait checks, which may outlive it; any thread may issue and
// wait.
class InFlightClaims {
 public:
  // Records that collective `seq` (`name`: "allreduce #3 on rank 0") owns
  // [data, data + nbytes) of `storage`, a tensor described by `tensor`
  // ("shape (4), float32"); throws naming both collectives if one still in
  // flight owns any of it.
  void claim(uint64_t seq, const std::string& name, const std::string& tensor,
             const std::shared_ptr<Storage>& storage, const void* data, std::size_t nbytes) {
    const auto* begin = static_cast<const std::byte*>(data);
    std::lock_guard<std::mutex> lock(mutex_);
    // After a failure every later collective fails at its wait(), naming the
    // first failure; a claim left by a wait() that threw must not hide that.
    if (group_failed_) return;
    std::erase_if(claims_, [](const Claim& c) { return c.storage.expired(); });
    for (const Claim& c : claims_) {
      if (begin < c.end && c.begin < begin + nbytes) throw conflict(name, tensor, c);
    }
    claims_.push_back(Claim{seq, storage, begin, begin + nbytes, name, tensor, false});
  }
  // Collective `seq`'s first wait() has delivered its result: its memory is free.
  void release(uint64_t seq) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(claims_, [seq](const Claim& c) { return c.seq == seq || c.storage.expired(); });
    latest_waited_ = std::max(latest_waited_, seq);
  }
  // A collective failed: the group runs no more (communication thread).
  void group_failed() {
    std::lock_guard<std::mutex> lock(mutex_);
    group_failed_ = true;
  }
  // The caller dropped collective `seq`'s Work; if it was never waited for,
  // its claim stays, now known to be a forgotten wait().
  void dropped(uint64_t seq) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Claim& c : claims_) {
      if (c.seq == seq) c.dropped = true;
    }
  }

 private:
  struct Claim {
    uint64_t seq;
    std::weak_ptr<Storage> storage;
    const std::byte* begin;
    const std::byte* end;
    std::string name;    // "allreduce #3 on rank 0"
    std::string tensor;  // "shape (4), float32"
    bool dropped;        // its Work was dropped without a wait()
  };

  // Says which of three facts holds: the owner's Work was dropped unwaited;
  // a collective issued after the owner has been waited for (so the owner's
  // wait() was skipped, not merely still to come); or neither, where a wait()
  // still to come and a collective issued twice look alike.
  DistributedError conflict(const std::string& name, const std::string& tensor,
                            const Claim& owner) const {
    const std::string clash = cat(name, " was issued on a tensor (", tensor, ") whose memory ",
                                  owner.name, " (", owner.tensor, ") still owns");
    const std::string rule =
        " A tensor belongs to its collective until wait() returns: the result reaches it "
        "at that wait(), and only then may another collective take it. [seen in checker "
        "mode: GlooOptions::check_in_flight_writes]";
    if (owner.dropped) {
      return DistributedError(cat(
          clash, ", because that collective was never waited for: its Work was dropped "
          "without a wait(), so its result never reached the tensor. wait() for every "
          "collective before its tensor is read or used again.", rule));
    }
    if (latest_waited_ > owner.seq) {
      return DistributedError(cat(
          clash, ": that collective has not been waited for, although collective #",
          latest_waited_, ", issued after it, has been. wait() for every collective "
          "(finishing in issue order does not deliver the others' results) before its "
          "tensor is read or used again.", rule));
    }
    return DistributedError(cat(
        clash, ": that collective was issued and has not been waited for yet. Was a wait() "
        "missed, or one collective issued twice?", rule));
  }

  std::mutex mutex_;
  std::vector<Claim> claims_;  // guarded by mutex_
  uint64_t latest_waited_ = 0;  // guarded by mutex_: the latest seq released
  bool group_failed_ = false;   // guarded by mutex_
};

// In checker mode, claims `tensor`'s memory for `work` and arms its first
// wait() to check that nothing wrote `tensor` since now, then deliver the
// result from `sent` (the buffer the collective ran on) into it and release
// the claim: Note [In-flight writes]. Returns the caller's handle to `work`:
// the same Work, but whose last copy going away tells the claims that the
// caller dropped it. Otherwise returns `work` unchanged.
std::shared_ptr<Work> arm_checks(bool check_in_flight_writes,
                                 const std::shared_ptr<InFlightClaims>& claims,
                                 std::shared_ptr<Work> work, const Tensor& tensor,
                                 const Buffer& sent, int rank) {
  if (!check_in_flight_writes || sent.nbytes == 0) return work;
  auto issued = std::make_shared<std::vector<std::byte>>(sent.nbytes);
  std::memcpy(issued->data(), tensor.data_ptr(), sent.nbytes);
  const std::string name = cat(work->collective(), " #", work->seq(), " on rank ", rank);
  const std::string described =
      cat("shape ", tp::to_string(tensor.shape()), ", ", to_string(tensor.dtype()));
  claims->claim(work->seq(), name, described, tensor.storage(), tensor.data_ptr(), sent.nbytes);
  const std::string what = cat(name, ": its tensor (", described, ")");
  const std::string op = work->collective() == "allreduce" ? "all-reduce" : work->collective();
  work->set_on_first_wait([target = buffer_of(tensor), sent, issued, what, op, claims,
                           seq = work->seq()] {
    if (std::memcmp(target.data, issued->data(), target.nbytes) != 0) {
      const std::size_t element = element_size(target.dtype);
      std::size_t i = 0;
      while (std::memcmp(static_cast<const std::byte*>(target.data) + i * element,
                         issued->data() + i * element, element) == 0) {
        ++i;
      }
      claims->release(seq);  // refused: this wait() ends the claim all the same
      throw DistributedError(cat(
          what, " was written while its ", op, " was in flight: wait() before touching it. "
          "Between the call that issued it and wait(), element ",
          changed_element(issued->data(), target.data, i, target.dtype),
          " changed; the collective reads and writes the tensor until wait() returns, so a "
          "write in between (a division before the wait, say) races with it and gives a "
          "different wrong answer from run to run. [seen in checker mode: "
          "GlooOptions::check_in_flight_writes]"));
    }
    std::memcpy(target.data, sent.data, target.nbytes);
    claims->release(seq);  // delivered: the memory is free for the next collective
  });
  Work* const raw = work.get();
  return std::shared_ptr<Work>(raw, [owner = std::move(work), claims](Work* w) mutable noexcept {
    try {
      claims->dropped(w->seq());
    } catch (...) {  // a deleter must not throw; the claim then just stays unlabelled
    }
    owner.reset();
  });
}

// Note [Gloo tags]
// Every Gloo operation carries a 32-bit tag; messages only meet messages
// with the same tag (and the same kind of operation). The low 8 bits are the
// sequence number, so consecutive collectives never mix: collectives run one
// at a time in issue order, and none completes on a rank before every peer
// has posted its part (Gloo's TCP transport sends only into a receive the
// peer has posted, even for a broadcast's root), so two ranks are never more
// than one collective apart, and 8 bits leave a margin of 254.
// The high 24 bits are a fingerprint of what must agree between ranks
// (element count, dtype, reduce op, root). Without it, a rank that
// all-reduces 3 elements while another all-reduces 4 can "succeed" with a
// wrong result and fail only in a later collective; with it, the two never
// pair up and the mismatched collective itself times out with a message
// naming it. A fingerprint is a hash, so two different collectives at the
// same position share it with probability 2^-24 (about 6e-8, one in 16.8
// million, for a well-mixed hash); then the mismatch goes unnoticed by the
// tag, as SUM against MAX of 59069 float32 elements did with the 16-bit
// fingerprint this replaced. TP_DISTRIBUTED_DEBUG=DETAIL closes that gap:
// every rank's fingerprint is compared in full before each collective
// (Note [Collective fingerprints]).
// Sequence number 0 is no collective's: the constructor's connect barrier
// (Note [Rendezvous in two steps]) uses tag make_tag(0, {}).
constexpr int kSeqBits = 8;

uint32_t make_tag(uint64_t seq, std::initializer_list<uint64_t> must_agree) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (uint64_t v : must_agree) {
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (v >> (8 * byte)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  // Fold all 64 bits into the 24 the tag has room for.
  constexpr uint64_t kFingerprintMask = (uint64_t{1} << (32 - kSeqBits)) - 1;
  const uint64_t fingerprint = (h ^ (h >> 24) ^ (h >> 48)) & kFingerprintMask;
  const uint64_t seq_bits = seq & ((uint64_t{1} << kSeqBits) - 1);
  return static_cast<uint32_t>((fingerprint << kSeqBits) | seq_bits);
}

// What must agree between ranks for one collective: hashed into its tag
// (Note [Gloo tags]) and, in debug mode, compared whole.
struct Call {
  enum Kind : int64_t { kAllreduce = 1, kBroadcast = 2, kAllgather = 3, kBarrier = 4 };
  int64_t kind = 0;
  int64_t count = 0;  // elements (allreduce) or bytes (broadcast, allgather)
  int64_t dtype = 0;
  int64_t param = 0;  // the ReduceOp (allreduce) or the root (broadcast)

  uint32_t tag(uint64_t seq) const {
    return make_tag(seq, {static_cast<uint64_t>(kind), static_cast<uint64_t>(count),
                          static_cast<uint64_t>(dtype), static_cast<uint64_t>(param)});
  }
};

// "allreduce MAX of 59069 float32 elements", for the debug mode's message.
std::string describe(const Call& c) {
  const std::string dtype = to_string(static_cast<Dtype>(c.dtype));
  switch (c.kind) {
    case Call::kAllreduce:
      return cat("allreduce ", to_string(static_cast<ReduceOp>(c.param)), " of ", c.count, " ",
                 dtype, " elements");
    case Call::kBroadcast:
      return cat("broadcast of ", c.count, " bytes (", dtype, ") from root ", c.param);
    case Call::kAllgather:
      return cat("allgather of ", c.count, " bytes (", dtype, ") per rank");
    case Call::kBarrier:
      return "barrier";
  }
  return cat("an unknown collective (kind ", c.kind, ")");
}

// Note [Collective fingerprints]
// In debug mode (TP_DISTRIBUTED_DEBUG=DETAIL) each collective starts with an
// all-gather of its Call and sequence number from every rank, 5 integers
// each. The all-gathers pair up whatever the ranks call next (every rank runs
// one before each of its collectives), so a mismatch is seen by every rank,
// at once, with both sides' calls in the message: no timeout, and no silent
// wrong result when two different calls share a tag (Note [Gloo tags]).
// The tag of this all-gather hashes a constant no Call produces, plus the
// collective's sequence number.
constexpr uint64_t kFingerprintCheck = 0x7470666370ull;  // "tpfcp"

bool detail_debug_from_environment(int rank) {
  const char* value = std::getenv("TP_DISTRIBUTED_DEBUG");
  if (value == nullptr) return false;
  const std::string v = value;
  if (v == "DETAIL") return true;
  if (v.empty() || v == "OFF" || v == "INFO") return false;  // INFO: nothing more to say yet
  TP_THROW(DistributedError, kWho, ": rank ", rank, ": TP_DISTRIBUTED_DEBUG='", v,
           "' is not a debug level; use OFF, INFO or DETAIL (DETAIL compares every "
           "collective across ranks before running it)");
}

void compare_calls(const std::shared_ptr<gloo::Context>& context, const Call& call, uint64_t seq,
                   milliseconds timeout) {
  std::array<int64_t, 5> mine{call.kind, call.count, call.dtype, call.param,
                              static_cast<int64_t>(seq)};
  std::vector<int64_t> all(mine.size() * static_cast<std::size_t>(context->size));
  gloo::AllgatherOptions opts(context);
  opts.setInput(mine.data(), mine.size());
  opts.setOutput(all.data(), all.size());
  opts.setTag(make_tag(seq, {kFingerprintCheck}));
  opts.setTimeout(timeout);
  gloo::allgather(opts);
  bool same = true;
  for (std::size_t i = 0; i < all.size(); ++i) same = same && all[i] == mine[i % mine.size()];
  if (same) return;
  std::string calls;
  for (int r = 0; r < context->size; ++r) {
    const int64_t* f = all.data() + r * mine.size();
    calls += cat(r == 0 ? "" : "; ", "rank ", r, " called ",
                 describe(Call{f[0], f[1], f[2], f[3]}), " as its collective #", f[4]);
  }
  TP_THROW(DistributedError, "TP_DISTRIBUTED_DEBUG=DETAIL found the ranks calling different "
           "collectives: ", calls, ". Every rank must issue the same collectives, with the "
           "same sizes, dtypes, reduce ops and roots, in the same order");
}

// ---- the collectives, as run on the communication thread ---------------------

// c = combine(a, b) elementwise; Gloo calls it on chunks of the buffer.
template <typename T, typename Combine>
gloo::AllreduceOptions::Func elementwise(Combine combine) {
  return [combine](void* c, const void* a, const void* b, std::size_t n) {
    T* out = static_cast<T*>(c);
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    for (std::size_t i = 0; i < n; ++i) out[i] = combine(x[i], y[i]);
  };
}

template <typename T>
gloo::AllreduceOptions::Func reduce_function(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:  // AVG is SUM, then a division on every rank
      return elementwise<T>([](T a, T b) { return a + b; });
    case ReduceOp::MIN:
      return elementwise<T>([](T a, T b) { return std::min(a, b); });
    case ReduceOp::MAX:
      return elementwise<T>([](T a, T b) { return std::max(a, b); });
  }
  TP_THROW(Error, "tp::distributed: unknown ReduceOp ", static_cast<int>(op));
}

template <typename T>
void run_allreduce(const std::shared_ptr<gloo::Context>& context, const Buffer& buf,
                   ReduceOp op, uint32_t tag, milliseconds timeout) {
  T* data = static_cast<T*>(buf.ptr());
  gloo::AllreduceOptions opts(context);
  opts.setOutput(data, buf.numel);  // no separate input: reduce in place
  opts.setReduceFunction(reduce_function<T>(op));
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
  if (op == ReduceOp::AVG) {
    const T size = static_cast<T>(context->size);
    for (std::size_t i = 0; i < buf.numel; ++i) data[i] /= size;
  }
}

bool mentions_timeout(const std::string& message) {
  std::string lower = message;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find("timed out") != std::string::npos ||
         lower.find("timeout") != std::string::npos;
}

}  // namespace

// ---- Impl: the Gloo context and the communication thread ---------------------

struct ProcessGroupGloo::Impl {
  struct Task {
    const char* op = nullptr;  // "allreduce", ...: a literal, named in trace and errors
    uint64_t seq = 0;
    std::shared_ptr<Work> work;
    std::function<void(uint32_t tag)> body;  // the Gloo call; tag per Note [Gloo tags]
    uint32_t tag = 0;
    std::shared_ptr<Staging> staging;  // CUDA tensors only: Note [Staging CUDA tensors]
  };

  Impl(int rank, int size, milliseconds timeout, bool check_collectives)
      : rank(rank), size(size), timeout(timeout), check_collectives(check_collectives) {}

  ~Impl() {
    // Never throws: a destructor runs during unwinding too.
    try {
      {
        std::lock_guard<std::mutex> lock(mutex);
        stopping = true;
      }
      cv.notify_all();
      if (comm_thread.joinable()) comm_thread.join();  // after draining the queue
    } catch (...) {
    }
  }

  // nbytes: the payload, recorded on the trace so a checker can tell which
  // bucket a collective carried.
  // staging: for CUDA tensors (Note [Staging CUDA tensors]), else null.
  std::shared_ptr<Work> enqueue(const char* op, const char* queued_event, uint64_t nbytes,
                                const Call& call, std::function<void(uint32_t)> body,
                                std::shared_ptr<Staging> staging = nullptr) {
    const uint64_t seq = next_seq++;
    if (check_collectives) {
      body = [context = this->context, call, seq, timeout = this->timeout,
              run = std::move(body)](uint32_t tag) {
        compare_calls(context, call, seq, timeout);
        run(tag);
      };
    }
    auto work = std::make_shared<Work>(op, seq, rank);
    if (staging) {
      // Step 1, then step 5 at every wait(): the caller's stream (whichever
      // thread waits) is ordered after the copy back.
      arm(*staging);
      work->set_on_wait([staging] {
        if (staging->done) cuda::current_stream().wait(*staging->done);
      });
    }
    trace::instant(queued_event, "comm",
                   {{"seq", static_cast<int64_t>(seq)}, {"bytes", static_cast<int64_t>(nbytes)}});
    {
      std::lock_guard<std::mutex> lock(mutex);
      queue.push_back(Task{op, seq, work, std::move(body), call.tag(seq), std::move(staging)});
    }
    cv.notify_one();
    return work;
  }

  void loop() {
    trace::set_thread_name("comm");
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [this] { return stopping || !queue.empty(); });
        if (queue.empty()) break;  // stopping, and every task has run
        task = std::move(queue.front());
        queue.pop_front();
      }
      run(task);
    }
    retire(true);
  }

  // ---- staging CUDA tensors (Note [Staging CUDA tensors]); communication thread only

  // The communication stream of `device`, made at first need.
  const cuda::Stream& comm_stream(int device) {
    auto it = comm_streams.find(device);
    if (it == comm_streams.end()) it = comm_streams.emplace(device, cuda::Stream::create()).first;
    return it->second;
  }

  // Steps 2: the blocks' bytes in pinned host buffers, ready for Gloo.
  void stage_in(Staging& staging) {
    cuda::set_device(staging.device);
    const cuda::Stream& stream = comm_stream(staging.device);
    stream.wait(staging.ready);
    trace::DeviceSpan gpu("gpu copy to host", stream, "communication stream");
    for (std::size_t i = 0; i < staging.blocks.size(); ++i) {
      StagedBlock& block = *staging.blocks[i];
      std::shared_ptr<void>& host = pinned[{staging.device, block.nbytes, i}];
      if (!host) host = cuda::allocate_pinned(block.nbytes);
      block.host = host.get();
      if (block.copy_in) cuda::copy_async(block.host, block.device_data, block.nbytes, stream);
    }
    stream.synchronize();  // Gloo reads the host buffers next
  }

  // Step 4: the results back to the device, and `done` after them.
  void stage_out(Staging& staging) {
    const cuda::Stream& stream = comm_stream(staging.device);
    trace::DeviceSpan gpu("gpu copy to device", stream, "communication stream");
    for (const auto& block : staging.blocks) {
      if (block->copy_out) cuda::copy_async(block->device_data, block->host, block->nbytes, stream);
    }
    staging.done.emplace();
    staging.done->record(stream);
    retiring.push_back(Retiring{*staging.done, staging.keep});
  }

  // Drops the storage of staged tensors whose copies back have run (all:
  // waits for them first; at the end of the communication thread).
  void retire(bool all) {
    while (!retiring.empty()) {
      try {
        if (all) {
          retiring.front().done.synchronize();
        } else if (!retiring.front().done.query()) {
          return;  // copies back complete in order: the rest are later
        }
      } catch (...) {
        // A broken CUDA context: the copies will never run; let go.
      }
      retiring.pop_front();
    }
  }

  void run(Task& task) {
    std::exception_ptr error;
    {
      // The span ends before finish() wakes the waiter, so in the trace's
      // order the collective is over before anything the waiter does next
      // (checkers assert "all-reduces end before the optimizer step").
      trace::Span span(task.op, "comm", {{"seq", static_cast<int64_t>(task.seq)}});
      error = execute(task);
    }
    task.work->finish(error);
  }

  // Runs one collective; returns its error, if any.
  std::exception_ptr execute(Task& task) {
    // Formatted only on the error paths: every collective passes here.
    auto name = [&] { return cat(task.op, " #", task.seq, " on rank ", rank); };
    if (!failed.empty()) {
      // A Gloo context is not usable after a failed operation (messages of
      // the failed collective may still arrive), so later collectives fail
      // at once instead of each waiting out its own timeout.
      return std::make_exception_ptr(PeerFailedError(cat(
          name(), " was not run: this process group stopped after ", failed,
          " failed; end the job (or build a new group with a fresh rendezvous directory)")));
    }
    std::exception_ptr error;
    try {
      if (task.staging) {
        retire(false);
        stage_in(*task.staging);
      }
      task.body(task.tag);
      if (task.staging) stage_out(*task.staging);
    } catch (const gloo::IoException& e) {
      // The transport failed: a deadline passed or a connection broke.
      if (mentions_timeout(e.what())) {
        error = std::make_exception_ptr(TimeoutError(cat(
            name(), " timed out after ", timeout.count(),
            " ms: another rank did not join this collective (did every rank issue the "
            "same collectives in the same order?). Tensors of different sizes or dtypes, "
            "or a different reduce op or root, count as different collectives. [gloo: ",
            e.what(), "]",
            // Across machines a lost link looks the same to Gloo: nothing arrives.
            store ? " Or a rank's machine became unreachable (its network link is down)."
                  : "")));
      } else {
        error = std::make_exception_ptr(PeerFailedError(cat(
            name(), " failed: the connection to another rank broke (gloo: ", e.what(),
            "); did another rank exit or crash before joining this collective?")));
      }
    } catch (const gloo::EnforceNotMet& e) {
      error = std::make_exception_ptr(DistributedError(cat(
          name(), " failed inside Gloo: ", e.what(),
          "; do all ranks pass tensors of the same size and dtype?")));
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(DistributedError(cat(name(), " failed: ", e.what())));
    }
    if (error) {
      failed = cat(task.op, " #", task.seq);
      in_flight->group_failed();
    }
    return error;
  }

  const int rank;
  const int size;
  const milliseconds timeout;
  const bool check_collectives;  // Note [Collective fingerprints]
  // A store rendezvous's store, kept as long as the group: under env://
  // rank 0's holds the server. Null for file://.
  std::shared_ptr<Store> store;
  // Constant after construction. Declared before context so the context
  // (whose pairs point at the device) is destroyed first.
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::Context> context;  // used by the communication thread only

  uint64_t next_seq = 1;  // issuing thread only; 1-based
  // Checker mode: which memory each collective in flight owns (Note
  // [In-flight writes]); shared with the Works' first-wait checks.
  const std::shared_ptr<InFlightClaims> in_flight = std::make_shared<InFlightClaims>();

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<Task> queue;  // guarded by mutex
  bool stopping = false;   // guarded by mutex; set by the destructor

  std::string failed;  // communication thread only: "allreduce #3" once one failed

  // Note [Staging CUDA tensors]; communication thread only, all empty
  // until a collective has a CUDA tensor.
  struct Retiring {
    cuda::Event done;                                // the copies back
    std::vector<std::shared_ptr<const void>> keep;  // the storage they write
  };
  std::map<int, cuda::Stream> comm_streams;  // per GPU
  // Pinned buffers by (GPU, size, position in the collective); a buffer is
  // reused in issue order on its GPU's stream, so one per key suffices.
  std::map<std::tuple<int, std::size_t, std::size_t>, std::shared_ptr<void>> pinned;
  std::deque<Retiring> retiring;  // in the order of their copies back

  std::thread comm_thread;  // started last, once everything above exists
};

// ---- construction --------------------------------------------------------------

namespace {

// Connects a full mesh of Gloo pairs on `device` through `store` and waits
// until every rank has (Note [Rendezvous in two steps]). `explain` turns a
// failure into the message; the type says whom to blame (a broken
// connection means another rank left first).
template <typename Explain>
std::shared_ptr<gloo::Context> connect_mesh(gloo::rendezvous::Store& store,
                                            std::shared_ptr<gloo::transport::Device>& device,
                                            int rank, int size, milliseconds timeout,
                                            Explain explain) {
  try {
    auto connecting = std::make_shared<gloo::rendezvous::Context>(rank, size);
    connecting->setTimeout(timeout);
    connecting->connectFullMesh(store, device);
    // Return only once every rank has connected; run here, before the
    // communication thread exists, it is not a collective of the group: no
    // counter, no sequence number.
    gloo::BarrierOptions connected(connecting);
    connected.setTag(make_tag(0, {}));
    connected.setTimeout(timeout);
    gloo::barrier(connected);
    return connecting;
  } catch (const gloo::IoException& e) {
    if (mentions_timeout(e.what())) throw TimeoutError(explain(e));
    throw PeerFailedError(explain(e));
  } catch (const DistributedError&) {
    throw;  // the store's own error already says what happened
  } catch (const std::exception& e) {
    throw DistributedError(explain(e));
  }
}

GlooOptions with_environment(GlooOptions options, int rank) {
  options.check_collectives = options.check_collectives || detail_debug_from_environment(rank);
  return options;
}

}  // namespace

ProcessGroupGloo::ProcessGroupGloo(const std::string& rendezvous_dir, int rank, int size,
                                   GlooOptions options)
    : ProcessGroup(rank, size),  // checks 1 <= size and 0 <= rank < size first
      options_(with_environment(options, rank)),
      impl_(std::make_unique<Impl>(rank, size, options.timeout, options_.check_collectives)) {
  if (options_.timeout.count() <= 0) {
    TP_THROW(DistributedError, kWho, ": rank ", rank, ": GlooOptions::timeout must be "
             "positive (got ", options_.timeout.count(), " ms)");
  }
  detail::prepare_rendezvous_dir(rendezvous_dir, rank, kWho);
  wait_for_all_ranks(rendezvous_dir, rank, size, options_.timeout);

  // Loopback only: every rank of a file:// job runs on this machine (spawn
  // forks them); ranks on several machines meet in a Store instead.
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    impl_->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    TP_THROW(DistributedError, kWho, ": rank ", rank, ": cannot open a TCP endpoint on the "
             "loopback address 127.0.0.1 (", e.what(), "); is the loopback interface up "
             "(ip link set lo up)? Every rank of a file:// job talks over it");
  }
  // Why a rank cannot join the group; the type says whom to blame (a broken
  // connection means another rank left first). Gloo's own words come first;
  // a guess is added only where it is the likely story.
  const auto connect_failed = [&](const std::exception& e) {
    const std::string gloo = e.what();
    std::string hint;
    if (gloo.find("No space left") != std::string::npos) {
      hint = "; the disk holding the rendezvous directory is full: free space or set TMPDIR "
             "to another disk";
    } else if (dynamic_cast<const gloo::IoException*>(&e) != nullptr) {
      hint = cat("; did a rank exit during rendezvous, or is the directory '", rendezvous_dir,
                 "' shared with another job?");
    }
    return cat(kWho, ": rank ", rank, " of ", size,
               ": connecting to the other ranks through Gloo failed (", gloo, ")", hint);
  };
  gloo::rendezvous::FileStore store(rendezvous_dir);
  impl_->context =
      connect_mesh(store, impl_->device, rank, size, options_.timeout, connect_failed);
  impl_->comm_thread = std::thread([impl = impl_.get()] { impl->loop(); });
}

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size,
                                   GlooOptions options)
    : ProcessGroup(rank, size),
      options_(with_environment(options, rank)),
      impl_(std::make_unique<Impl>(rank, size, options.timeout, options_.check_collectives)) {
  if (options_.timeout.count() <= 0) {
    TP_THROW(DistributedError, kWho, ": rank ", rank, ": GlooOptions::timeout must be "
             "positive (got ", options_.timeout.count(), " ms)");
  }
  if (!store) TP_THROW(DistributedError, kWho, ": rank ", rank, ": the store is null");
  impl_->store = std::move(store);
  detail::meet_in_store(*impl_->store, rank, size, options_.timeout, kWho);

  gloo::transport::tcp::attr attr;
  if (!options_.socket_ifname.empty()) {
    detail::check_interface(options_.socket_ifname, "GLOO_SOCKET_IFNAME");
    attr.iface = options_.socket_ifname;
  } else {
    attr.hostname = options_.hostname;
  }
  const std::string listening =
      attr.iface.empty() ? cat("address ", attr.hostname) : cat("interface ", attr.iface);
  try {
    impl_->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    TP_THROW(DistributedError, kWho, ": rank ", rank, ": cannot open a TCP endpoint on ",
             listening, " (", e.what(), "); set GLOO_SOCKET_IFNAME to an interface of this "
             "machine that the other machines reach");
  }
  const auto connect_failed = [&](const std::exception& e) {
    return cat(kWho, ": rank ", rank, " of ", size,
               ": connecting to the other ranks through Gloo failed (", e.what(),
               "); this rank listens on ", listening, " (from ", impl_->store->describe(),
               "); can every rank reach every other there? Set GLOO_SOCKET_IFNAME to the "
               "interface that can, or did a rank exit during rendezvous?");
  };
  detail::GlooStoreAdapter gloo_store(*impl_->store, options_.timeout);
  impl_->context =
      connect_mesh(gloo_store, impl_->device, rank, size, options_.timeout, connect_failed);
  impl_->comm_thread = std::thread([impl = impl_.get()] { impl->loop(); });
}

ProcessGroupGloo::~ProcessGroupGloo() = default;  // Impl drains and joins

// ---- the collectives, as issued --------------------------------------------------

std::shared_ptr<Work> ProcessGroupGloo::allreduce(const Tensor& tensor, ReduceOp op) {
  constexpr const char* fn = "tp::distributed::ProcessGroupGloo::allreduce";
  check_tensor(fn, rank(), tensor, "the tensor");
  std::shared_ptr<Staging> staging;
  if (is_cuda(tensor)) staging = begin_staging(fn, rank(), tensor, options_.check_in_flight_writes);
  ++counters_.allreduce;
  counters_.allreduce_elements += static_cast<uint64_t>(tensor.numel());
  const Buffer buf = staging ? staged_buffer(fn, rank(), *staging, tensor, true, true)
                             : buffer_for_collective(tensor, options_.check_in_flight_writes);
  auto context = impl_->context;
  const milliseconds timeout = options_.timeout;
  std::shared_ptr<Work> work = impl_->enqueue(
      "allreduce", "allreduce queued", buf.nbytes,
      Call{Call::kAllreduce, static_cast<int64_t>(buf.numel), static_cast<int64_t>(buf.dtype),
           static_cast<int64_t>(op)},
      [context, buf, op, timeout](uint32_t tag) {
        if (buf.numel == 0) return;  // Gloo rejects empty buffers; nothing to reduce
        if (buf.dtype == kFloat64) {
          run_allreduce<double>(context, buf, op, tag, timeout);
        } else {
          run_allreduce<float>(context, buf, op, tag, timeout);
        }
      },
      staging);
  if (staging) return work;
  return arm_checks(options_.check_in_flight_writes, impl_->in_flight, std::move(work), tensor,
                    buf, rank());
}

std::shared_ptr<Work> ProcessGroupGloo::broadcast(const Tensor& tensor, int root) {
  constexpr const char* fn = "tp::distributed::ProcessGroupGloo::broadcast";
  check_tensor(fn, rank(), tensor, "the tensor");
  if (root < 0 || root >= size()) {
    TP_THROW(DistributedError, fn, ": rank ", rank(), ": root ", root,
             " is out of range for world size ", size(), "; pass a rank in 0 .. ",
             size() - 1);
  }
  std::shared_ptr<Staging> staging;
  if (is_cuda(tensor)) staging = begin_staging(fn, rank(), tensor, options_.check_in_flight_writes);
  ++counters_.broadcast;
  // Only the root's bytes are read; every rank's are written.
  const Buffer buf = staging ? staged_buffer(fn, rank(), *staging, tensor, rank() == root, true)
                             : buffer_for_collective(tensor, options_.check_in_flight_writes);
  auto context = impl_->context;
  const milliseconds timeout = options_.timeout;
  std::shared_ptr<Work> work = impl_->enqueue(
      "broadcast", "broadcast queued", buf.nbytes,
      Call{Call::kBroadcast, static_cast<int64_t>(buf.nbytes), static_cast<int64_t>(buf.dtype),
           root},
      [context, buf, root, timeout](uint32_t tag) {
        if (buf.nbytes == 0) return;
        // Bytes, not elements: broadcast copies and never computes.
        gloo::BroadcastOptions opts(context);
        opts.setRoot(root);
        opts.setOutput(static_cast<uint8_t*>(buf.ptr()), buf.nbytes);  // in place
        opts.setTag(tag);
        opts.setTimeout(timeout);
        gloo::broadcast(opts);
      },
      staging);
  if (staging) return work;
  return arm_checks(options_.check_in_flight_writes, impl_->in_flight, std::move(work), tensor,
                    buf, rank());
}

std::shared_ptr<Work> ProcessGroupGloo::allgather(const std::vector<Tensor>& outputs,
                                                  const Tensor& input) {
  constexpr const char* fn = "tp::distributed::ProcessGroupGloo::allgather";
  check_tensor(fn, rank(), input, "the input");
  if (static_cast<int>(outputs.size()) != size()) {
    TP_THROW(DistributedError, fn, ": rank ", rank(), ": got ", outputs.size(),
             " output tensors for world size ", size(), "; pass one output per rank");
  }
  for (std::size_t r = 0; r < outputs.size(); ++r) {
    const std::string what = cat("outputs[", r, "]");
    check_tensor(fn, rank(), outputs[r], what);
    if (outputs[r].shape() != input.shape() || outputs[r].dtype() != input.dtype()) {
      TP_THROW(DistributedError, fn, ": rank ", rank(), ": ", what, " has shape ",
               tp::to_string(outputs[r].shape()), " and dtype ", to_string(outputs[r].dtype()),
               " but the input has shape ", tp::to_string(input.shape()), " and dtype ",
               to_string(input.dtype()), "; every output must match the input");
    }
  }
  std::shared_ptr<Staging> staging;
  if (is_cuda(input)) staging = begin_staging(fn, rank(), input, false);
  for (const Tensor& t : outputs) {
    if (!staging && is_cuda(t)) staging = begin_staging(fn, rank(), t, false);
  }
  ++counters_.allgather;
  // Each CUDA tensor staged on its own; CPU ones (if mixed) used directly.
  const auto buffer = [&](const Tensor& t, bool copy_in, bool copy_out) {
    return is_cuda(t) ? staged_buffer(fn, rank(), *staging, t, copy_in, copy_out) : buffer_of(t);
  };
  const Buffer in = buffer(input, true, false);
  std::vector<Buffer> outs;
  for (const Tensor& t : outputs) outs.push_back(buffer(t, false, true));
  auto context = impl_->context;
  const milliseconds timeout = options_.timeout;
  return impl_->enqueue(
      "allgather", "allgather queued", in.nbytes,
      Call{Call::kAllgather, static_cast<int64_t>(in.nbytes), static_cast<int64_t>(in.dtype), 0},
      [context, in, outs, timeout](uint32_t tag) {
        if (in.nbytes == 0) return;
        // Gloo gathers into one buffer holding every rank's block in rank
        // order; the outputs are separate tensors, so gather into a staging
        // buffer and copy each block out.
        std::vector<uint8_t> staging(in.nbytes * outs.size());
        gloo::AllgatherOptions opts(context);
        opts.setInput(static_cast<uint8_t*>(in.ptr()), in.nbytes);
        opts.setOutput(staging.data(), staging.size());
        opts.setTag(tag);
        opts.setTimeout(timeout);
        gloo::allgather(opts);
        for (std::size_t r = 0; r < outs.size(); ++r) {
          std::memcpy(outs[r].ptr(), staging.data() + r * in.nbytes, in.nbytes);
        }
      },
      staging);
}

std::shared_ptr<Work> ProcessGroupGloo::barrier() {
  ++counters_.barrier;
  auto context = impl_->context;
  const milliseconds timeout = options_.timeout;
  return impl_->enqueue("barrier", "barrier queued", 0, Call{Call::kBarrier, 0, 0, 0},
                        [context, timeout](uint32_t tag) {
    gloo::BarrierOptions opts(context);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::barrier(opts);
  });
}

}  // namespace tp::distributed
