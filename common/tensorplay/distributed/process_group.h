// tp::distributed::ProcessGroup: the collectives DDP needs, behind one interface.
//
// Contract:
//   - A group has a fixed rank in [0, size) and size >= 1, constant after
//     construction.
//   - Every collective is asynchronous: it is queued and returns a Work at
//     once; work->wait() makes it synchronous. Collectives run in issue order,
//     one at a time, on the group's communication thread (the CPU analogue of
//     a CUDA communication stream), so every rank must issue the same
//     collectives in the same order, exactly as with torch.distributed.
//   - Tensors must be contiguous and defined, and stay alive and untouched
//     until wait() returns. The data is updated in place.
//   - dtypes: float32 and float64 everywhere. float16 and bfloat16 (the
//     compression hooks' wire types) are moved by broadcast and the
//     all-gathers; all-reduce and reduce-scatter take float16 on both
//     backends and bfloat16 only where the backend can reduce it (NCCL;
//     Gloo refuses it, saying so).
//   - CUDA tensors: the collective reads them after the work queued so far
//     on the issuing thread's current CUDA stream, and wait() orders the
//     waiting thread's current stream after the result (gloo stages them
//     through host memory; nccl runs on a communication stream and its
//     wait() does not block the host: process_group_nccl.h).
//   - Every collective has a timeout; when it expires, wait() throws
//     tp::TimeoutError: "allreduce #7 on rank 1 timed out after 2000 ms ...".
//     A collective that failed because another rank failed first (it left,
//     crashed, or this group already stopped after an earlier failure)
//     throws tp::PeerFailedError, whose kind() is ErrorKind::Consequence, so
//     spawn blames the rank that failed first.
//   - Flat collectives, for sharded training (ZeRO): reduce_scatter_tensor
//     and allgather_into_tensor move blocks of one flat tensor, block r
//     being rank r's; the blocks may differ in size (split_sizes, every
//     rank passing the same: on Gloo, ranks that differ time out in that
//     collective, or in debug mode fail naming each rank's blocks; NCCL does
//     not check) and be empty. A bad call (dtypes, sizes, split_sizes) is a
//     tp::DistributedError at the call, naming the collective, the rank and
//     the fix, the same on every backend.
//   - counters() counts the collectives issued since construction or
//     reset_counters(); checkers use them ("one all-reduce per parameter").
//     Issuing methods may be called from one thread at a time.
//   - A rank that skips a collective pairs its next one with the others'
//     skipped one; no collective can tell. check_collective_count, called
//     at a point every rank passes with the same collectives issued (the
//     kit's trainer: each step's end), compares the ranks' counts through
//     the group's store or directory and names the rank that skipped one or issued an
//     extra one, without a collective and without waiting.
//   - A collective budget (set_collective_budget; none by default) bounds
//     how many collectives the group issues from the call on: the one past it
//     throws tp::DistributedError at the call that issues it, naming the
//     rank, the collective and the budget. Collectives that keep completing
//     are progress to every hang detector, so a loop that never stops
//     issuing them (a sync loop without its exit, join's loop never seeing
//     every rank done) would run forever; the kit's trainer gives every
//     rank a budget derived from its plan, far above what a correct DDP
//     issues (Note [Collective budget] in process_group.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/distributed/work.h"
#include "tensorplay/tensor.h"

namespace tp::distributed {

class CountBoard;  // where ranks leave their collective counts (check_collective_count)

enum class ReduceOp { SUM, AVG, MIN, MAX };
std::string to_string(ReduceOp op);

struct CollectiveCounters {
  uint64_t allreduce = 0;
  uint64_t broadcast = 0;
  uint64_t allgather = 0;  // allgather and allgather_into_tensor
  uint64_t reduce_scatter = 0;  // reduce_scatter_tensor
  uint64_t barrier = 0;
  uint64_t allreduce_elements = 0;  // sum of numel over all-reduced tensors
  // Sum of nbytes over all-reduced tensors: what the all-reduces carried, so
  // a float16 bucket counts half the bytes of a float32 one.
  uint64_t allreduce_bytes = 0;
  // Sum of nbytes over broadcast tensors (what the root sends each rank).
  uint64_t broadcast_bytes = 0;
  // Sum of nbytes over the reduce-scatters' inputs: the whole flat tensor
  // reduced, every rank's block, so that sharded gradients count as many
  // bytes here as the same gradients all-reduced count in allreduce_bytes.
  uint64_t reduce_scatter_bytes = 0;
  // Sum of nbytes over what the all-gathers delivered: every output, every
  // rank's block (an allgather_into_tensor's output; an allgather's W outputs).
  uint64_t allgather_bytes = 0;

  // Every collective of every kind: what a "no collective here" check and a
  // "collectives per step" figure count.
  uint64_t collectives() const {
    return allreduce + broadcast + allgather + reduce_scatter + barrier;
  }
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size);
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;
  // Whether all-reduce and reduce-scatter take tensors of `dtype` on this
  // backend (the dtypes bullet of the contract), so that a caller can
  // refuse a plan before any rank issues a collective (stage 08's
  // register_comm_hook refuses bf16_compress_hook so). The default, every
  // dtype but bfloat16, is Gloo's answer; NCCL's is every dtype. A wrapper
  // group answers for the group it wraps.
  virtual bool can_reduce(Dtype dtype) const { return dtype != kBFloat16; }
  // Where the small tensors the kit moves for its own bookkeeping belong
  // (the model check's tables, a launched job's gathered results): the CPU
  // for Gloo, which also takes CUDA tensors; this rank's GPU for NCCL, which
  // takes CUDA tensors only.
  virtual Device preferred_device() const { return kCPU; }
  // How long a collective may take before it fails (the group's options);
  // also what a caller waiting on something the group does not own (a comm
  // hook's future) may take as its limit.
  virtual std::chrono::milliseconds timeout() const = 0;

  // Every rank's tensor becomes op(tensor_0, ..., tensor_{size-1}).
  virtual std::shared_ptr<Work> allreduce(const Tensor& tensor,
                                          ReduceOp op = ReduceOp::SUM) = 0;
  // Every rank's tensor becomes root's tensor. REQUIRES: 0 <= root < size.
  virtual std::shared_ptr<Work> broadcast(const Tensor& tensor, int root = 0) = 0;
  // outputs[r] becomes rank r's input. REQUIRES: outputs.size() == size(),
  // each output has input's shape and dtype.
  virtual std::shared_ptr<Work> allgather(const std::vector<Tensor>& outputs,
                                          const Tensor& input) = 0;
  // Completes once every rank has entered it.
  virtual std::shared_ptr<Work> barrier() = 0;

  // The flat collectives (see the contract). `input` (reduce-scatter) and
  // `output` (all-gather) hold every rank's block one after another, block r
  // having split_sizes[r] elements; empty split_sizes: size() equal blocks.
  // Only element counts matter, not shapes. The other tensor is this rank's
  // block; it may be that very block of the flat tensor (in place).
  // REQUIRES: one dtype; split_sizes empty (numel divisible by size()) or of
  // size() entries >= 0 adding up to the flat tensor's numel, the same on
  // every rank; the block tensor has split_sizes[rank()] elements.
  // The base class throws tp::DistributedError saying the backend lacks it.
  //
  // output (split_sizes[rank()] elements) becomes op over the ranks of
  // block rank() of their inputs; the input is only read. torch's
  // reduce_scatter_tensor, with uneven blocks allowed.
  virtual std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& output, const Tensor& input,
                                                      const std::vector<int64_t>& split_sizes = {},
                                                      ReduceOp op = ReduceOp::SUM);
  // Block r of output becomes rank r's input (split_sizes[r] elements).
  // torch's all_gather_into_tensor, with uneven blocks allowed.
  virtual std::shared_ptr<Work> allgather_into_tensor(
      const Tensor& output, const Tensor& input, const std::vector<int64_t>& split_sizes = {});

  // Blocks the host until every collective issued so far has finished, and
  // throws the group's failure if there was one. ProcessGroupGloo waits for
  // its communication thread to run every collective (one nobody waited for
  // included) and drop the tensors each held, so memory counts read after
  // it do not depend on that thread's timing; ProcessGroupNCCL, whose wait()
  // only orders streams, waits for the GPU. The trainer calls it before it
  // reads a rank's final results, so a collective that failed after its
  // wait() returned is not missed.
  virtual void synchronize() {}

  // A point every rank passes having issued the same collectives on this
  // group, such as the end of a training step (the kit's trainer calls it
  // there): `where` names it for the message, "the end of step 4". Records
  // how many collectives this rank has issued where the other ranks read
  // it (the group's store, or a file:// job's directory), and
  // compares with the next rank's record of the same point if that rank has
  // passed it already; throws tp::DistributedError naming each rank's count
  // and the likely cause when they differ (Note [Counting collectives] in
  // process_group.cc: a rank that skips a collective otherwise pairs its next
  // one with the others' skipped one, and when the two have the same shape
  // every rank's sum is silently wrong). Never waits for another rank and
  // issues no collective. Every rank must call it at the same points, the
  // same number of times, except that a rank may stop calling it (a rank
  // that ran out of inputs and joined) and then skip the points it missed
  // (skip_count_points). A group without a board (a test's
  // recording group) checks nothing; a wrapper group forwards the call.
  // The ranks the message names are this group's. A store that stops
  // answering ends the checks on this rank (saying so on stderr), not the
  // job.
  // Issuing thread only.
  virtual void check_collective_count(const std::string& where);
  // For a rank that stopped calling check_collective_count before the
  // others (it joined): the number of points it missed, so that its next
  // check and the others' meet at the same point. Points are numbered by
  // the calls, and a rank whose numbering ran one behind would compare its
  // count with another point's. Issuing thread only.
  virtual void skip_count_points(int64_t missed);

  const CollectiveCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }

  // At most `budget` more collectives (0: no limit); see the contract.
  // Those issued before the call do not count: a launched checker's cases
  // share one group, each with its own plan's budget.
  void set_collective_budget(uint64_t budget, std::string why = "") {
    budget_ = budget;
    budget_reason_ = std::move(why);
    budget_from_ = issued_;
  }

 protected:
  // Every issuing method calls this first, with its collective's name:
  // counts the collective against the budget; throws past it.
  void charge_budget(const char* collective);

  // Where check_collective_count writes and reads the ranks' counts, a
  // place every rank of this group reaches without a collective (the
  // rendezvous store; a file:// job's directory). Backends set it at
  // construction.
  void set_count_board(std::shared_ptr<CountBoard> board) { count_board_ = std::move(board); }

  CollectiveCounters counters_;  // issuing thread only

 private:
  const int rank_;
  const int size_;
  uint64_t budget_ = 0;        // issuing thread only; 0: no limit
  std::string budget_reason_;  // where the budget comes from, for the error
  uint64_t issued_ = 0;        // issuing thread only; never reset
  uint64_t budget_from_ = 0;   // issued_ when the budget was set
  // check_collective_count's state, issuing thread only: the board (null:
  // no check) and the calls so far.
  std::shared_ptr<CountBoard> count_board_;
  int64_t count_points_ = 0;
};

}  // namespace tp::distributed
