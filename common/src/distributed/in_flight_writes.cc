// ProcessGroupGloo's checker mode: in-flight writes and claims
// (in_flight_writes.h).
#include "in_flight_writes.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "tensorplay/half.h"

namespace tp::distributed::detail {

using tp::detail::cat;

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
//     on that tensor names the forgotten wait() (InFlightClaims, in the header).
// The flat collectives (reduce_scatter_tensor, allgather_into_tensor) have
// two tensors: the one they write (the output) is handled as above; the one
// they only read (the input) is copied and compared as well, so a write to
// it in flight (gradients zeroed before the reduce-scatter's wait, say) is
// seen the same way; it may not be memory that another collective still
// owns, but it is not claimed: two collectives may read one tensor at once.
// A future (Work::get_future, future.h) hands the result to its callbacks
// before anyone waits, so its completion counts as the first wait: the check
// runs on the communication thread when the collective finishes (or in
// get_future(), if it had already finished), and a callback reads the
// result; a write found there fails the future and every wait(). A write
// after that moment is not seen: the tensor is the program's once the
// future completed.
// The result reaches the tensor at wait(), not before, which the contract
// allows (outputs are read only after wait()); a Work never waited for
// leaves its tensor as it was, which makes a forgotten wait() fail every
// run too. A check, not a checksum: comparing every byte costs no more than
// hashing them, and can say which element changed and how.

Buffer buffer_for_collective(const Tensor& tensor, bool check_in_flight_writes) {
  Buffer buf = buffer_of(tensor);
  if (!check_in_flight_writes || buf.nbytes == 0) return buf;
  auto sent = std::make_shared<std::vector<std::byte>>(buf.nbytes);
  std::memcpy(sent->data(), buf.data, buf.nbytes);
  buf.data = sent->data();
  buf.keep_alive = std::move(sent);
  return buf;
}

namespace {

// "4 (0.25 when issued, 0.125 at wait())": element i of two copies of a
// block of dtype.
std::string changed_element(const void* before, const void* after, std::size_t i, Dtype dtype) {
  auto value = [&](const void* block) {
    switch (dtype) {
      case Dtype::Float32: return static_cast<double>(static_cast<const float*>(block)[i]);
      case Dtype::Float64: return static_cast<const double*>(block)[i];
      case Dtype::Float16: return static_cast<double>(static_cast<const Half*>(block)[i]);
      case Dtype::BFloat16: return static_cast<double>(static_cast<const BFloat16*>(block)[i]);
    }
    return 0.0;  // unreachable for a valid enumerator
  };
  return cat(i, " (", value(before), " when issued, ", value(after), " at wait())");
}

}  // namespace

void InFlightClaims::claim(uint64_t seq, const std::string& name, const std::string& tensor,
                           const std::shared_ptr<Storage>& storage, const void* data,
                           std::size_t nbytes, bool owns) {
  const auto* begin = static_cast<const std::byte*>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  // After a failure every later collective fails at its wait(), naming the
  // first failure; a claim left by a wait() that threw must not hide that.
  if (group_failed_) return;
  std::erase_if(claims_, [](const Claim& c) { return c.storage.expired(); });
  for (const Claim& c : claims_) {
    if (c.seq == seq) continue;  // its own other tensor: an in-place flat collective
    if (begin < c.end && c.begin < begin + nbytes) throw conflict(name, tensor, c);
  }
  if (!owns) return;
  claims_.push_back(Claim{seq, storage, begin, begin + nbytes, name, tensor, false});
}

void InFlightClaims::release(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(claims_, [seq](const Claim& c) { return c.seq == seq || c.storage.expired(); });
  latest_waited_ = std::max(latest_waited_, seq);
}

void InFlightClaims::group_failed() {
  std::lock_guard<std::mutex> lock(mutex_);
  group_failed_ = true;
}

void InFlightClaims::dropped(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Claim& c : claims_) {
    if (c.seq == seq) c.dropped = true;
  }
}

DistributedError InFlightClaims::conflict(const std::string& name, const std::string& tensor,
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

std::shared_ptr<Work> arm_checks(bool check_in_flight_writes,
                                 const std::shared_ptr<InFlightClaims>& claims,
                                 std::shared_ptr<Work> work, std::vector<CheckedTensor> tensors,
                                 int rank) {
  if (!check_in_flight_writes) return work;
  std::erase_if(tensors, [](const CheckedTensor& c) { return c.sent.nbytes == 0; });
  if (tensors.empty()) return work;
  const std::string name = cat(work->collective(), " #", work->seq(), " on rank ", rank);
  const std::string op = work->collective() == "allreduce" ? "all-reduce" : work->collective();
  // What the first wait() needs of each tensor: its memory, the bytes it
  // had at issue, and how to name it.
  struct Watched {
    Buffer target;  // the tensor's own memory
    Buffer sent;
    std::shared_ptr<std::vector<std::byte>> issued;
    std::string what;  // "allreduce #3 on rank 0: its tensor (shape (4), float32)"
    bool written;
  };
  std::vector<Watched> watched;
  for (const CheckedTensor& c : tensors) {
    auto issued = std::make_shared<std::vector<std::byte>>(c.sent.nbytes);
    std::memcpy(issued->data(), c.tensor.data_ptr(), c.sent.nbytes);
    const std::string described =
        cat("shape ", tp::to_string(c.tensor.shape()), ", ", to_string(c.tensor.dtype()));
    claims->claim(work->seq(), name, described, c.tensor.storage(), c.tensor.data_ptr(),
                  c.sent.nbytes, c.written);
    watched.push_back(Watched{buffer_of(c.tensor), c.sent, std::move(issued),
                              cat(name, ": its ", c.role, " (", described, ")"), c.written});
  }
  work->set_on_first_wait([watched = std::move(watched), op, claims, seq = work->seq()] {
    for (const Watched& w : watched) {
      const Buffer& target = w.target;
      if (std::memcmp(target.data, w.issued->data(), target.nbytes) == 0) continue;
      const std::size_t element = element_size(target.dtype);
      std::size_t i = 0;
      while (std::memcmp(static_cast<const std::byte*>(target.data) + i * element,
                         w.issued->data() + i * element, element) == 0) {
        ++i;
      }
      claims->release(seq);  // refused: this wait() ends the claim all the same
      throw DistributedError(cat(
          w.what, " was written while its ", op, " was in flight: wait() before touching it. "
          "Between the call that issued it and wait(), element ",
          changed_element(w.issued->data(), target.data, i, target.dtype),
          " changed; the collective ", w.written ? "reads and writes" : "reads",
          " the tensor until wait() returns, so a write in between (a division before the "
          "wait, say) races with it and gives a different wrong answer from run to run. "
          "[seen in checker mode: GlooOptions::check_in_flight_writes]"));
    }
    for (const Watched& w : watched) {
      if (w.written) std::memcpy(w.target.data, w.sent.data, w.target.nbytes);
    }
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

}  // namespace tp::distributed::detail
