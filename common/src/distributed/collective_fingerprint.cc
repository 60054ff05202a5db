// What must agree between ranks for one collective of ProcessGroupGloo, in
// its Gloo tag (make_tag) and, in debug mode, compared whole (compare_calls):
// collective_fingerprint.h.
#include "collective_fingerprint.h"

#include <gloo/allgather.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "rank_list.h"
#include "split_sizes.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/error.h"
#include "tensorplay/tensor.h"

namespace tp::distributed::detail {

using std::chrono::milliseconds;
using tp::detail::cat;

constexpr const char* kWho = "tp::distributed::ProcessGroupGloo";

// Note [Gloo tags]
// Every Gloo operation carries a 32-bit tag; messages only meet messages
// with the same tag (and the same kind of operation). The low 8 bits are the
// sequence number, so consecutive collectives never mix: collectives run one
// at a time in issue order, and none completes on a rank before every peer
// has posted its part (Gloo's TCP transport sends only into a receive the
// peer has posted, even for a broadcast's root), so two ranks are never more
// than one collective apart, and 8 bits leave a margin of 254.
// The high 24 bits are a fingerprint of what must agree between ranks
// (element count, dtype, reduce op, root, a flat collective's block sizes). Without it, a rank that
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

uint32_t make_tag(uint64_t seq, const std::vector<uint64_t>& must_agree) {
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

namespace {

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
    case Call::kReduceScatterTensor:
      return cat("reduce_scatter_tensor ", to_string(static_cast<ReduceOp>(c.param)), " of ",
                 c.count, " ", dtype, " elements in blocks ", sizes_text(c.splits));
    case Call::kAllgatherIntoTensor:
      return cat("allgather_into_tensor of ", c.count, " ", dtype, " elements in blocks ",
                 sizes_text(c.splits));
  }
  return cat("an unknown collective (kind ", c.kind, ")");
}


}  // namespace

// Note [Collective fingerprints]
// In debug mode (TP_DISTRIBUTED_DEBUG=DETAIL) each collective starts with an
// all-gather of its Call and sequence number from every rank, 5 integers
// each, then the flat collectives' block sizes, one per rank (zeros for the
// other collectives): W + 5 integers in all. The all-gathers pair up
// whatever the ranks call next (every rank runs one before each of its
// collectives), so a mismatch is seen by every rank, at once, with both
// sides' calls in the message: no timeout, and no silent wrong result when
// two different calls share a tag (Note [Gloo tags]).
// The tag of this all-gather hashes a constant no Call produces, plus the
// collective's sequence number.
//
// A skipped collective. The k-th check of every rank pairs with the k-th of
// the others, so the sequence numbers always agree where the checks meet:
// a rank that skips a collective is not seen where it skips. Its next
// collective pairs with the others' skipped one, and when the two have the
// same shape the sum is silently wrong (nothing any rank holds tells them
// apart). From then on the rank is one collective behind, and that shows at
// the first check where the two streams differ: a different call, or the
// end, where the rank that skipped one runs out of collectives first. So
// the end is checked too: a group that is destroyed, not during unwinding,
// runs one last check, a Call of kind kClose with the sequence number its
// next collective would have had, and a rank still at a collective meets
// it: "rank 0 called allreduce ... as its collective #2; rank 1 closed the
// group after its collective #1", with which ranks skipped a collective or
// issued an extra one. Destroying a group is then a meeting point in debug
// mode: it waits (up to the timeout) for every rank to close it or issue
// its next collective. A group that failed, or is destroyed while an
// exception unwinds, leaves without the check: its peers learn of it from
// the broken connection, as without debug mode.
constexpr uint64_t kFingerprintCheck = 0x7470666370ull;  // "tpfcp"

std::string shape_text(const Call& c) {
  switch (c.kind) {
    case Call::kAllreduce:
    case Call::kReduceScatterTensor:
    case Call::kAllgatherIntoTensor:
      return cat(c.count, " ", to_string(static_cast<Dtype>(c.dtype)));
    case Call::kBroadcast:
    case Call::kAllgather:
      return cat(c.count, " bytes");
  }
  return "";
}

bool debug_from_environment(int rank) {
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
  const auto size = static_cast<std::size_t>(context->size);
  std::vector<int64_t> mine{call.kind, call.count, call.dtype, call.param,
                            static_cast<int64_t>(seq)};
  // Every rank's splits have `size` entries (checked at the call), so every
  // rank sends W + 5 integers.
  for (std::size_t r = 0; r < size; ++r) {
    mine.push_back(r < call.splits.size() ? call.splits[r] : 0);
  }
  std::vector<int64_t> all(mine.size() * size);
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
  std::vector<int> closed;  // ranks that closed the group
  std::vector<int> issuing;  // ranks at a collective
  for (int r = 0; r < context->size; ++r) {
    const int64_t* f = all.data() + r * mine.size();
    calls += cat(r == 0 ? "" : "; ", "rank ", r);
    if (f[0] == Call::kClose) {
      closed.push_back(r);
      calls += f[4] > 1 ? cat(" closed the group after its collective #", f[4] - 1)
                        : std::string(" closed the group before any collective");
    } else {
      issuing.push_back(r);
      calls += cat(" called ",
                   describe(Call{f[0], f[1], f[2], f[3], std::vector<int64_t>(f + 5, f + 5 + size)}),
                   " as its collective #", f[4]);
    }
  }
  std::string skipped;
  if (!closed.empty() && !issuing.empty()) {
    skipped = cat(". A rank that closes the group while another still issues collectives is "
                  "behind: ", rank_words(closed), " skipped a collective, or ", rank_words(issuing),
                  " issued an extra one");
  }
  TP_THROW(DistributedError, "TP_DISTRIBUTED_DEBUG=DETAIL found the ranks calling different "
           "collectives: ", calls, skipped, ". Every rank must issue the same collectives, "
           "with the same sizes, dtypes, reduce ops, roots and block sizes, in the same order");
}

}  // namespace tp::distributed::detail
