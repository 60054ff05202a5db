// tp::distributed::ProcessGroupGloo: ProcessGroup over the Gloo library.
//
// Contract:
//   - Connects a full mesh of TCP pairs (Gloo's tcp transport) through a
//     rendezvous store: Gloo's FileStore in a directory that every rank can
//     reach (all ranks on loopback; the directory must be fresh for each
//     job, since stale keys would point ranks at dead addresses), or a
//     tp::distributed::Store (store.h: env://'s TCPStore, redis://'s
//     RedisStore) with the pairs listening on GlooOptions::hostname or
//     socket_ifname, for ranks on several machines.
//   - The constructor returns only once every rank has connected: it ends
//     with one Gloo barrier, which is not a collective of the group (not in
//     counters(), no sequence number; the first collective is still #1). So a
//     rank that leaves right after construction makes its peers fail in their
//     next collective, never inside the rendezvous.
//   - A collective that cannot finish fails with tp::TimeoutError (a rank did
//     not join it in time), tp::PeerFailedError (the connection to another
//     rank broke, or an earlier collective of this group already failed: a
//     Gloo context is unusable after a failure, so every later collective
//     fails at once) or tp::DistributedError (anything else Gloo reports).
//   - Owns one communication thread that runs queued collectives in issue
//     order (see process_group.h). The destructor drains the queue and joins
//     the thread (in debug mode it first checks the end: below).
//   - Debug mode (GlooOptions::check_collectives, or TP_DISTRIBUTED_DEBUG=
//     DETAIL in the environment): before each collective the ranks all-gather
//     its fingerprint (op, reduce op or root, dtype, size, block sizes,
//     sequence number);
//     when they differ, every rank fails in that collective with a
//     tp::DistributedError listing each rank's call. It costs one small
//     all-gather per collective, and catches what the tag cannot
//     (Note [Gloo tags] in collective_fingerprint.cc). The destructor
//     checks the end the same way (unless the group failed or an exception
//     is unwinding): it waits, up to the timeout, for every rank to close
//     the group or issue its next collective, so a rank that skipped a
//     collective is named where it runs out of them first ("rank 1 closed
//     the group after its collective #1"), on the ranks still at a
//     collective; the destructor itself never throws, and prints the
//     mismatch to stderr (Note [Collective fingerprints]).
//   - ReduceOp::AVG is SUM followed by division by size() on this rank.
//   - The flat collectives: allgather_into_tensor is Gloo's allgatherv (a
//     ring, a block size per rank); reduce_scatter_tensor is a ring of the
//     group's own on Gloo's point-to-point primitives, since this Gloo has
//     no reduce-scatter that takes a tag and a deadline; it moves (W - 1) / W
//     of the input per rank, half of what an all-reduce moves (Note [Ring
//     reduce-scatter] in process_group_gloo.cc). Both take the same tags,
//     deadlines, debug mode and checker mode as the others.
//   - dtypes: all-reduce and reduce-scatter take float32, float64 and
//     float16 (Gloo's gloo::float16 sum, min and max: each pairwise result
//     rounded to float16); bfloat16 is refused with tp::DistributedError,
//     since Gloo has no bfloat16 reduction. Broadcast and the all-gathers
//     move bytes, any dtype.
//   - CUDA tensors (a build with CUDA) are staged through pinned host memory
//     on a communication stream of the group's own: the collective reads the
//     tensor after the work queued so far on the issuing thread's current
//     stream (an event; the host does not wait), and wait() returns once
//     Gloo finished and makes the waiting thread's current stream wait for
//     the copy back, so kernels queued after wait() see the result without a
//     device synchronisation; the host reads it after a synchronisation, as
//     always in CUDA. The tensors of one collective are on one GPU (CPU
//     tensors may be mixed in an all-gather). Several ranks may share one
//     GPU, which NCCL cannot do (Note [Staging CUDA tensors] in
//     gloo_cuda_staging.cc).
//   - Checker mode (GlooOptions::check_in_flight_writes): a tensor written
//     while its all-reduce, broadcast or flat collective (its input or its
//     output) is in flight is an error at wait(), every time, and a
//     collective issued on memory (a tensor, or a view overlapping it) that
//     such a collective writes and has not been waited for (still in
//     flight, or its Work dropped unwaited) is an error at once, naming
//     both; the result lands in the tensor at wait(). Two collectives may
//     read one tensor at once. The list allgather is not checked. CPU
//     tensors only: a CUDA tensor in checker mode is a tp::DistributedError
//     at issue.
//   - Trace: when tp::trace is enabled, each collective records an instant
//     "<op> queued" on the issuing thread and a span "<op>" on the
//     communication thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/distributed/process_group.h"
#include "tensorplay/distributed/store.h"

namespace tp::distributed {

struct GlooOptions {
  // Per-collective deadline, and the deadline for the rendezvous itself.
  std::chrono::milliseconds timeout{30000};
  // Checker mode: an all-reduced or broadcast tensor written between the
  // call that issues the collective and its wait() (dividing a gradient
  // before waiting for its all-reduce, say) is an error at that wait(), on
  // every run, naming the collective and the element that changed; another
  // all-reduce or broadcast on its memory before that wait() (a bucket
  // launched twice, a wait() forgotten) is an error where it is issued. The
  // price: two copies of each such tensor, and the result lands in the
  // tensor only at wait() (Note [In-flight writes] in
  // in_flight_writes.cc). The stage checkers turn it on.
  bool check_in_flight_writes = false;
  // The address this rank's Gloo pairs listen on and tell their peers
  // (store rendezvous only; file:// always uses 127.0.0.1).
  // init_process_group sets it to the address that reaches the master.
  std::string hostname = "127.0.0.1";
  // Non-empty: listen on this network interface instead of `hostname`
  // (GLOO_SOCKET_IFNAME, which init_process_group reads). Store rendezvous only.
  std::string socket_ifname = {};
  // Compare every collective's fingerprint across ranks first (see the
  // contract). Also on when TP_DISTRIBUTED_DEBUG=DETAIL.
  bool check_collectives = false;
};

class ProcessGroupGloo : public ProcessGroup {
 public:
  // Rendezvous through files in rendezvous_dir (created if missing); returns
  // when all size ranks have connected. REQUIRES: 1 <= size, 0 <= rank < size.
  // Throws tp::DistributedError with a fix when the directory cannot be
  // created or written (a full disk named as such), when no TCP endpoint can
  // be opened on 127.0.0.1 (no loopback interface), when ranks were given
  // different world sizes or two processes the same rank, or when a rank
  // does not arrive within options.timeout;
  // tp::PeerFailedError when a connection broke while connecting (another
  // rank left), tp::TimeoutError when Gloo's own rendezvous timed out.
  ProcessGroupGloo(const std::string& rendezvous_dir, int rank, int size,
                   GlooOptions options = {});
  // Rendezvous through `store`, which every rank reaches (Note [Rendezvous in
  // a store]); the group keeps it alive. REQUIRES: as above, store not null.
  // Throws tp::DistributedError naming the rank that was claimed twice or
  // that disagrees on the world size; tp::TimeoutError listing the ranks
  // that did not arrive within options.timeout.
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, GlooOptions options = {});
  ~ProcessGroupGloo() override;

  std::string backend_name() const override { return "gloo"; }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }
  std::shared_ptr<Work> allreduce(const Tensor& tensor,
                                  ReduceOp op = ReduceOp::SUM) override;
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root = 0) override;
  std::shared_ptr<Work> allgather(const std::vector<Tensor>& outputs,
                                  const Tensor& input) override;
  std::shared_ptr<Work> barrier() override;
  // Until the communication thread has run every collective issued so far
  // and dropped the tensors each held (a collective nobody waited for
  // included); a failure among them surfaces at its own wait().
  void synchronize() override;
  // Gloo has no reduce-scatter of its current kind: a ring of the group's
  // own (see the contract).
  std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& output, const Tensor& input,
                                              const std::vector<int64_t>& split_sizes = {},
                                              ReduceOp op = ReduceOp::SUM) override;
  // gloo::allgatherv.
  std::shared_ptr<Work> allgather_into_tensor(
      const Tensor& output, const Tensor& input,
      const std::vector<int64_t>& split_sizes = {}) override;

  const GlooOptions& options() const { return options_; }

 private:
  struct Impl;
  GlooOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tp::distributed
