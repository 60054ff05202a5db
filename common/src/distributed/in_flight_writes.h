// Private to libtensorplay: ProcessGroupGloo's checker mode
// (GlooOptions::check_in_flight_writes), which makes a tensor written while
// its all-reduce, broadcast, reduce-scatter or flat all-gather is in flight,
// or taken by a second one before the first is waited for, an error on
// every run instead of a race (Note [In-flight writes] in
// in_flight_writes.cc).
//
// Threads: buffer_for_collective and arm_checks run on the issuing thread;
// the checks they arm run in the first wait(), on the waiting thread; an
// InFlightClaims is shared by all of them and the communication thread
// (thread-safe: one mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gloo_cuda_staging.h"
#include "tensorplay/distributed/work.h"
#include "tensorplay/error.h"
#include "tensorplay/tensor.h"

namespace tp::distributed::detail {

// In checker mode, the buffer a collective works on instead of `tensor`'s
// memory: a copy of it (`sent` in Note [In-flight writes]); otherwise the
// tensor's own memory.
Buffer buffer_for_collective(const Tensor& tensor, bool check_in_flight_writes);

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
  // flight owns any of it. With `owns` false (a tensor the collective only
  // reads), checks the same and records nothing.
  void claim(uint64_t seq, const std::string& name, const std::string& tensor,
             const std::shared_ptr<Storage>& storage, const void* data, std::size_t nbytes,
             bool owns = true);
  // Collective `seq`'s first wait() has delivered its result: its memory is free.
  void release(uint64_t seq);
  // A collective failed: the group runs no more (communication thread).
  void group_failed();
  // The caller dropped collective `seq`'s Work; if it was never waited for,
  // its claim stays, now known to be a forgotten wait().
  void dropped(uint64_t seq);

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
                            const Claim& owner) const;

  std::mutex mutex_;
  std::vector<Claim> claims_;  // guarded by mutex_
  uint64_t latest_waited_ = 0;  // guarded by mutex_: the latest seq released
  bool group_failed_ = false;   // guarded by mutex_
};

// One tensor of a collective in checker mode.
struct CheckedTensor {
  Tensor tensor;
  Buffer sent;       // what the collective runs on in its place (buffer_for_collective)
  const char* role;  // "tensor", "input", "output": how an error names it
  bool written;      // the collective writes it: claimed, and given the result at wait()
};

// In checker mode, claims the memory of each written tensor for `work` and
// arms its first wait() to check that nothing wrote any of the tensors
// since now, then deliver the result from `sent` (the buffer the collective
// ran on) into each written one and release the claim: Note [In-flight
// writes]. A tensor only read (a reduce-scatter's input) must not be owned
// by another collective either, but is not claimed: two collectives may
// read one tensor at once. Returns the
// caller's handle to `work`: the same Work, but whose last copy going away
// tells the claims that the caller dropped it. Otherwise returns `work`
// unchanged. REQUIRES: at most one tensor is written.
std::shared_ptr<Work> arm_checks(bool check_in_flight_writes,
                                 const std::shared_ptr<InFlightClaims>& claims,
                                 std::shared_ptr<Work> work, std::vector<CheckedTensor> tensors,
                                 int rank);
// The all-reduce's and the broadcast's form: one tensor, read and written.
inline std::shared_ptr<Work> arm_checks(bool check_in_flight_writes,
                                        const std::shared_ptr<InFlightClaims>& claims,
                                        std::shared_ptr<Work> work, const Tensor& tensor,
                                        const Buffer& sent, int rank) {
  return arm_checks(check_in_flight_writes, claims, std::move(work),
                    {CheckedTensor{tensor, sent, "tensor", true}}, rank);
}

}  // namespace tp::distributed::detail
