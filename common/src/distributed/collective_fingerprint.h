// Private to libtensorplay: what must agree between the ranks for one
// collective of ProcessGroupGloo (a Call), and the two ways the group checks
// that it does: a hash of it in every Gloo tag, always (Note [Gloo tags]),
// and the whole of it compared across ranks before each collective in debug
// mode, TP_DISTRIBUTED_DEBUG=DETAIL (Note [Collective fingerprints]); both
// Notes are in collective_fingerprint.cc.
//
// Values and pure functions, safe on any thread; compare_calls is a Gloo
// operation, run by the group's communication thread.
#pragma once

#include <gloo/context.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace tp::distributed::detail {

// The 32-bit Gloo tag of operation `seq`: its low 8 bits from `seq`, its
// high 24 a hash of `must_agree` (Note [Gloo tags]). Sequence number 0 is
// no collective's: the constructor's connect barrier uses make_tag(0, {}).
uint32_t make_tag(uint64_t seq, const std::vector<uint64_t>& must_agree);
inline uint32_t make_tag(uint64_t seq, std::initializer_list<uint64_t> must_agree) {
  return make_tag(seq, std::vector<uint64_t>(must_agree));
}

// What must agree between ranks for one collective: hashed into its tag
// (Note [Gloo tags]) and, in debug mode, compared whole.
struct Call {
  // kClose is no collective: the end of a rank's group, checked in debug
  // mode as if it were one (Note [Collective fingerprints]).
  enum Kind : int64_t {
    kAllreduce = 1,
    kBroadcast = 2,
    kAllgather = 3,
    kBarrier = 4,
    kReduceScatterTensor = 5,
    kAllgatherIntoTensor = 6,
    kClose = 7,
  };
  int64_t kind = 0;
  // Elements (allreduce, and the flat tensor of reduce_scatter_tensor and
  // allgather_into_tensor) or bytes (broadcast, allgather).
  int64_t count = 0;
  int64_t dtype = 0;
  int64_t param = 0;  // the ReduceOp (allreduce, reduce-scatter) or the root (broadcast)
  // The block sizes of a flat collective, one per rank; empty for the others.
  std::vector<int64_t> splits = {};

  uint32_t tag(uint64_t seq) const {
    std::vector<uint64_t> must_agree{static_cast<uint64_t>(kind), static_cast<uint64_t>(count),
                                     static_cast<uint64_t>(dtype), static_cast<uint64_t>(param)};
    for (int64_t n : splits) must_agree.push_back(static_cast<uint64_t>(n));
    return make_tag(seq, must_agree);
  }
};

// What `call` carries, for a rank's status (Work::shape): "1733 float32"
// (elements), "64 bytes" (broadcast, allgather), "" (barrier).
std::string shape_text(const Call& call);

// Whether TP_DISTRIBUTED_DEBUG asks for debug mode: true for DETAIL; false
// when unset, empty, OFF or INFO. Throws tp::DistributedError naming `rank`
// and the accepted levels for any other value.
bool debug_from_environment(int rank);

// Debug mode's check, run just before collective `seq` (Note [Collective
// fingerprints]), or as the group closes (a Call of kind kClose, `seq` the
// number the next collective would have had): every rank of `context`
// shares its `call` and `seq`; throws tp::DistributedError listing each
// rank's call when they differ, on every rank at once, and, where some
// ranks closed the group while others are at a collective, which ranks
// skipped one or issued an extra one. A Gloo all-gather: all ranks must
// call it.
void compare_calls(const std::shared_ptr<gloo::Context>& context, const Call& call, uint64_t seq,
                   std::chrono::milliseconds timeout);

}  // namespace tp::distributed::detail
