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
//      calling thread returns or rethrows, and the work's future, if one
//      was asked for, completes there, running its callbacks (future.h).
// One thread, one queue: collectives run one at a time in issue order, the
// CPU analogue of a CUDA communication stream.
//
// This file holds the queue, the thread and the collectives; the group's
// other concerns have a file each, with their Notes:
//   gloo_rendezvous.cc        how the ranks meet and connect
//                             (Note [Rendezvous in two steps]);
//   collective_fingerprint.cc what must agree between ranks, in every tag
//                             and in debug mode (Note [Gloo tags],
//                             Note [Collective fingerprints]);
//   gloo_cuda_staging.cc      CUDA tensors through pinned host memory
//                             (Note [Staging CUDA tensors]);
//   in_flight_writes.cc       checker mode (GlooOptions::
//                             check_in_flight_writes): an all-reduce or a
//                             broadcast runs on a copy of its tensor, and
//                             wait() checks that nothing wrote the tensor
//                             meanwhile before it copies the result in
//                             (Note [In-flight writes]).
#include "tensorplay/distributed/process_group_gloo.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collective_fingerprint.h"
#include "count_board.h"
#include "gloo_cuda_staging.h"
#include "rendezvous/gloo_rendezvous.h"
#include "in_flight_writes.h"
#include "rendezvous/network.h"
#include "rendezvous/rendezvous_dir.h"
#include "split_sizes.h"
#include "rendezvous/store_rendezvous.h"
#include "tensorplay/cuda/runtime.h"
#include "tensorplay/error.h"
#include "tensorplay/trace.h"

namespace tp::distributed {

using std::chrono::milliseconds;
using tp::detail::cat;
// The group's parts in their own files (see above).
using detail::arm;
using detail::arm_checks;
using detail::begin_staging;
using detail::block_offsets;
using detail::Buffer;
using detail::buffer_for_collective;
using detail::buffer_of;
using detail::Call;
using detail::shape_text;
using detail::check_blocks;
using detail::CheckedTensor;
using detail::compare_calls;
using detail::connect_mesh;
using detail::debug_from_environment;
using detail::InFlightClaims;
using detail::is_cuda;
using detail::mentions_timeout;
using detail::staged_buffer;
using detail::Staging;
using detail::StagingStreams;
using detail::wait_for_all_ranks;

namespace {

constexpr const char* kWho = "tp::distributed::ProcessGroupGloo";

// ---- checks on the calling thread --------------------------------------------

void check_tensor(const char* fn, int rank, const Tensor& t, const std::string& what) {
  if (!t.defined()) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": ", what,
             " is undefined; pass a tensor made by tp::zeros, tp::tensor or a model");
  }
  // CPU tensors, and CUDA tensors staged through host memory (Note [Staging
  // CUDA tensors]); a CUDA tensor exists only in a build with CUDA. Every
  // dtype of the kit is accepted here; all-reduce refuses bfloat16 itself.
  if (!t.is_contiguous()) {
    TP_THROW(DistributedError, fn, ": rank ", rank, ": ", what,
             " is not contiguous (shape ", tp::to_string(t.shape()), ", strides ",
             tp::to_string(t.strides()), "); a collective sends one dense block of memory: "
             "pass t.contiguous() and copy the result back after wait()");
  }
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

// float16: Gloo's own reductions of its own gloo::float16 (gloo/math.h).
// Each pair of elements is added (or compared) in float, and a sum rounded
// to float16 at once (to nearest, ties to even), so a sum over W ranks
// rounds W - 1 times, in an order that depends on Gloo's ring: exact only
// while every partial sum is a float16, as in the tests.
template <>
gloo::AllreduceOptions::Func reduce_function<gloo::float16>(ReduceOp op) {
  using Kernel = void (*)(void*, const void*, const void*, std::size_t);
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:
      return static_cast<Kernel>(&gloo::sum<gloo::float16>);
    case ReduceOp::MIN:
      return static_cast<Kernel>(&gloo::min<gloo::float16>);
    case ReduceOp::MAX:
      return static_cast<Kernel>(&gloo::max<gloo::float16>);
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
    // float16: gloo::float16's /= divides in float and rounds once, which is
    // the correctly rounded quotient (the size, up to 2048, is exact).
    const T size = static_cast<T>(context->size);
    for (std::size_t i = 0; i < buf.numel; ++i) data[i] /= size;
  }
}

// Note [Ring reduce-scatter]
// Debian 12's Gloo (0.0~git20220518) has no reduce-scatter in its current
// style (gloo/allreduce.h's: options, a tag, a timeout per call). Its one
// reduce-scatter, ReduceScatterHalvingDoubling (gloo/reduce_scatter.h), is
// of the older Algorithm style: it takes its message slots from the
// context, not from a tag, so Note [Gloo tags]'s fingerprint cannot keep
// mismatched calls apart, its deadline is the context's, and its counts are
// `int`. An all-reduce followed by keeping one block would be correct, but
// would move twice the bytes, and moving half of what an all-reduce moves is
// the reason ZeRO reduce-scatters. So the group runs the textbook ring, on
// the primitives gloo::allgatherv uses (an unbound buffer, a slot built from
// the tag, a deadline), with allgatherv's ring run backwards plus a sum:
//   W - 1 steps. At step s, rank r sends its partial result of block
//   (r - s - 1) mod W to rank r + 1 and receives rank r - 1's partial
//   result of block (r - s - 2) mod W, to which it adds block
//   (r - s - 2) mod W of its own input. At step 0 the block sent is its
//   input's own; the block received at the last step, s = W - 2, is block r,
//   which is then reduced over every rank: rank r's output.
// Each rank sends and receives W - 1 blocks ((W - 1) / W of the input when
// the blocks are equal), as an all-gather does: half of what a ring
// all-reduce moves. Each block is reduced on one
// rank, in ring order starting from the rank after its owner, so float
// results are exact only where every partial result is (as in the tests).
// Blocks may have any size, 0 included: an empty block is neither sent nor
// received, on both sides alike, since the block sizes agree across ranks
// (they are in the tag). Received blocks land in a scratch buffer of the
// input's size, each at its own offset, so no memory is written while a send
// from it may still be in flight.
// A slot prefix Gloo's own collectives do not use (theirs are 0x01 to 0x08,
// gloo/types.h), so a ring message never meets another collective's.
constexpr uint8_t kReduceScatterSlotPrefix = 0x70;

template <typename T>
void run_reduce_scatter(const std::shared_ptr<gloo::Context>& context, const Buffer& in,
                        const Buffer& out, const std::vector<int64_t>& sizes, ReduceOp op,
                        uint32_t tag, milliseconds timeout) {
  const int world = context->size;
  const int rank = context->rank;
  const std::vector<int64_t> offsets = block_offsets(sizes);
  const auto block_bytes = [&](int b) { return static_cast<std::size_t>(sizes[b]) * sizeof(T); };
  const auto block_at = [&](int b) { return static_cast<std::size_t>(offsets[b]) * sizeof(T); };
  const T* input = static_cast<const T*>(in.ptr());
  T* output = static_cast<T*>(out.ptr());
  const std::size_t mine = static_cast<std::size_t>(sizes[rank]);
  if (world == 1) {
    if (output != input) std::copy_n(input, mine, output);
    return;  // AVG over one rank: the input itself
  }
  const std::size_t total = static_cast<std::size_t>(offsets.back() + sizes.back());
  std::vector<T> ring(total);
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer =
      context->createUnboundBuffer(ring.data(), total * sizeof(T));
  const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
  const gloo::AllreduceOptions::Func reduce = reduce_function<T>(op);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto left = [&] {
    return std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(
                                         deadline - std::chrono::steady_clock::now()));
  };
  const int next = (rank + 1) % world;
  const int previous = (rank + world - 1) % world;
  const auto block = [&](int k) { return ((rank - k) % world + world) % world; };  // (r - k) mod W
  std::copy_n(input + offsets[block(1)], sizes[block(1)], ring.data() + offsets[block(1)]);
  for (int s = 0; s < world - 1; ++s) {
    const int send = block(s + 1);
    const int recv = block(s + 2);
    if (sizes[send] > 0) buffer->send(next, slot, block_at(send), block_bytes(send));
    if (sizes[recv] > 0) buffer->recv(previous, slot, block_at(recv), block_bytes(recv));
    if (sizes[send] > 0) buffer->waitSend(left());
    if (sizes[recv] > 0) {
      buffer->waitRecv(left());
      T* partial = ring.data() + offsets[recv];
      reduce(partial, partial, input + offsets[recv], static_cast<std::size_t>(sizes[recv]));
    }
  }
  std::copy_n(ring.data() + offsets[rank], mine, output);
  if (op == ReduceOp::AVG) {
    const T size = static_cast<T>(world);  // as in run_allreduce
    for (std::size_t i = 0; i < mine; ++i) output[i] /= size;
  }
}

// What reduce_scatter_tensor and allgather_into_tensor, whose input and
// output are each one flat tensor, share around their own collective.
// begin_flat_staging stages a CUDA input or output through host memory
// (Note [Staging CUDA tensors]), before the budget is charged;
// flat_buffers then gives the buffers the collective
// runs on: a staged copy for a CUDA tensor (a CPU one may be mixed in, as
// in an all-gather), in checker mode a copy of a CPU one (Note [In-flight
// writes]); finish_flat hands the caller its Work, the output claimed in
// checker mode.
std::shared_ptr<Staging> begin_flat_staging(const char* fn, int rank, const Tensor& input,
                                            const Tensor& output, bool checked) {
  if (is_cuda(input)) return begin_staging(fn, rank, input, checked);
  if (is_cuda(output)) return begin_staging(fn, rank, output, checked);
  return nullptr;
}

std::pair<Buffer, Buffer> flat_buffers(const char* fn, int rank, Staging* staging,
                                       const Tensor& input, const Tensor& output, bool checked) {
  const auto buffer = [&](const Tensor& t, bool copy_in, bool copy_out) {
    return is_cuda(t) ? staged_buffer(fn, rank, *staging, t, copy_in, copy_out)
                      : buffer_for_collective(t, checked);
  };
  Buffer in = buffer(input, true, false);
  Buffer out = buffer(output, false, true);
  return {std::move(in), std::move(out)};
}

std::shared_ptr<Work> finish_flat(std::shared_ptr<Work> work, bool staged, bool checked,
                                  const std::shared_ptr<InFlightClaims>& claims,
                                  const Tensor& input, const Buffer& in, const Tensor& output,
                                  const Buffer& out, int rank) {
  if (staged) return work;  // no future: Work::get_future says why
  work->set_outputs({output});
  return arm_checks(checked, claims, std::move(work),
                    {CheckedTensor{input, in, "input", false},
                     CheckedTensor{output, out, "output", true}},
                    rank);
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
    auto work = std::make_shared<Work>(op, seq, rank, shape_text(call));
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
      {
        Task task;
        {
          std::unique_lock<std::mutex> lock(mutex);
          cv.wait(lock, [this] { return stopping || !queue.empty(); });
          if (queue.empty()) break;  // stopping, and every task has run
          task = std::move(queue.front());
          queue.pop_front();
          running = true;
        }
        run(task);
      }  // the task, and every tensor it held, goes before the group is idle
      {
        std::lock_guard<std::mutex> lock(mutex);
        running = false;
      }
      idle.notify_all();
    }
    staging_streams.retire(true);
  }

  // Until every task issued so far has run and been dropped.
  void wait_until_idle() {
    std::unique_lock<std::mutex> lock(mutex);
    idle.wait(lock, [this] { return queue.empty() && !running; });
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
    // What the task holds (the tensors its body captured, the staging) goes
    // before finish() wakes the waiter: a caller that drops a buffer after
    // wait() (FSDP's full gradient) then finds its bytes gone at once, not
    // still held here until this thread's next task, so tp::memory's counts
    // do not depend on which thread runs first.
    task.body = nullptr;
    task.staging.reset();
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
        staging_streams.retire(false);
        staging_streams.stage_in(*task.staging);
      }
      task.body(task.tag);
      if (task.staging) staging_streams.stage_out(*task.staging);
    } catch (const gloo::IoException& e) {
      // The transport failed: a deadline passed or a connection broke.
      if (mentions_timeout(e.what())) {
        error = std::make_exception_ptr(TimeoutError(cat(
            name(), " timed out after ", timeout.count(),
            " ms: another rank did not join this collective (did every rank issue the "
            "same collectives in the same order?). Tensors of different sizes or dtypes, "
            "or a different reduce op, root or block sizes, count as different "
            "collectives. [gloo: ", e.what(), "]",
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
  bool running = false;    // guarded by mutex: a task popped and not yet dropped
  std::condition_variable idle;  // notified when running turns false

  std::string failed;  // communication thread only: "allreduce #3" once one failed

  // Note [Staging CUDA tensors] (gloo_cuda_staging.cc); communication thread
  // only, all empty until a collective has a CUDA tensor.
  StagingStreams staging_streams;

  std::thread comm_thread;  // started last, once everything above exists
};

// ---- construction --------------------------------------------------------------

namespace {

GlooOptions with_environment(GlooOptions options, int rank) {
  options.check_collectives = options.check_collectives || debug_from_environment(rank);
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
  // Before connecting: a rank that cannot make it (a full disk) fails
  // before the others count on it.
  set_count_board(std::make_shared<detail::FileCountBoard>(rendezvous_dir, size));
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
  set_count_board(std::make_shared<detail::StoreCountBoard>(impl_->store));
  impl_->comm_thread = std::thread([impl = impl_.get()] { impl->loop(); });
}

// Then ~Impl drains the queue and joins the communication thread.
ProcessGroupGloo::~ProcessGroupGloo() {
  // Debug mode checks the end too (Note [Collective fingerprints]): a rank
  // still issuing collectives meets this one's close and names it. Not
  // during unwinding: the peers learn of a failure from the broken
  // connection, at once, instead of meeting a close the failure caused.
  if (!options_.check_collectives || std::uncaught_exceptions() > 0) return;
  try {
    impl_->enqueue("close", "close queued", 0, Call{Call::kClose, 0, 0, 0}, [](uint32_t) {})
        ->wait();
  } catch (const PeerFailedError&) {
    // The group had failed already, and said so where it failed.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: closing the group: %s\n", kWho, rank(), e.what());
  } catch (...) {
  }
}

// ---- the collectives, as issued --------------------------------------------------

std::shared_ptr<Work> ProcessGroupGloo::allreduce(const Tensor& tensor, ReduceOp op) {
  constexpr const char* fn = "tp::distributed::ProcessGroupGloo::allreduce";
  check_tensor(fn, rank(), tensor, "the tensor");
  if (tensor.dtype() == kBFloat16) {
    TP_THROW(DistributedError, fn, ": rank ", rank(), ": the tensor has dtype bfloat16, and "
             "Gloo has no bfloat16 reduction (PyTorch's gloo backend has long refused it "
             "too, as an \"Invalid scalar type\"); bf16_compress_hook needs a backend that "
             "reduces bfloat16, NCCL on a GPU. On gloo, compress to float16 "
             "(fp16_compress_hook) instead; broadcast and allgather do carry bfloat16");
  }
  std::shared_ptr<Staging> staging;
  if (is_cuda(tensor)) staging = begin_staging(fn, rank(), tensor, options_.check_in_flight_writes);
  charge_budget("allreduce");
  ++counters_.allreduce;
  counters_.allreduce_elements += static_cast<uint64_t>(tensor.numel());
  counters_.allreduce_bytes += static_cast<uint64_t>(tensor.nbytes());
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
        switch (buf.dtype) {
          case Dtype::Float32: run_allreduce<float>(context, buf, op, tag, timeout); return;
          case Dtype::Float64: run_allreduce<double>(context, buf, op, tag, timeout); return;
          case Dtype::Float16:  // tp::Half and gloo::float16: the same 16 bits
            run_allreduce<gloo::float16>(context, buf, op, tag, timeout);
            return;
          case Dtype::BFloat16: break;  // refused above, on the calling thread
        }
        TP_THROW(DistributedError, "allreduce: no Gloo reduction for dtype ",
                 to_string(buf.dtype));
      },
      staging);
  if (staging) return work;  // no future: Work::get_future says why
  work->set_outputs({tensor});
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
  charge_budget("broadcast");
  ++counters_.broadcast;
  counters_.broadcast_bytes += static_cast<uint64_t>(tensor.nbytes());
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
  if (staging) return work;  // no future: Work::get_future says why
  work->set_outputs({tensor});
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
  charge_budget("allgather");
  ++counters_.allgather;
  counters_.allgather_bytes += static_cast<uint64_t>(input.nbytes()) * outputs.size();
  // Each CUDA tensor staged on its own; CPU ones (if mixed) used directly.
  const auto buffer = [&](const Tensor& t, bool copy_in, bool copy_out) {
    return is_cuda(t) ? staged_buffer(fn, rank(), *staging, t, copy_in, copy_out) : buffer_of(t);
  };
  const Buffer in = buffer(input, true, false);
  std::vector<Buffer> outs;
  for (const Tensor& t : outputs) outs.push_back(buffer(t, false, true));
  auto context = impl_->context;
  const milliseconds timeout = options_.timeout;
  std::shared_ptr<Work> work = impl_->enqueue(
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
  if (!staging) work->set_outputs(outputs);  // a staged work has no future
  return work;
}

std::shared_ptr<Work> ProcessGroupGloo::reduce_scatter_tensor(
    const Tensor& output, const Tensor& input, const std::vector<int64_t>& split_sizes,
    ReduceOp op) {
  constexpr const char* fn = "tp::distributed::ProcessGroupGloo::reduce_scatter_tensor";
  check_tensor(fn, rank(), output, "the output");
  check_tensor(fn, rank(), input, "the input");
  const std::vector<int64_t> sizes =
      check_blocks(fn, rank(), size(), input, "input", output, "output", split_sizes);
  if (input.dtype() == kBFloat16) {
    TP_THROW(DistributedError, fn, ": rank ", rank(), ": the input has dtype bfloat16, and "
             "Gloo has no bfloat16 reduction; reduce-scatter float16, float32 or float64 on "
             "gloo, or bfloat16 on NCCL");
  }
  const bool checked = options_.check_in_flight_writes;
  const std::shared_ptr<Staging> staging = begin_flat_staging(fn, rank(), input, output, checked);
  charge_budget("reduce_scatter_tensor");
  ++counters_.reduce_scatter;
  counters_.reduce_scatter_bytes += static_cast<uint64_t>(input.nbytes());
  const std::pair<Buffer, Buffer> buffers =
      flat_buffers(fn, rank(), staging.get(), input, output, checked);
  const Buffer& in = buffers.first;
  const Buffer& out = buffers.second;
  auto context = impl_->context;
  const milliseconds timeout = options_.timeout;
  std::shared_ptr<Work> work = impl_->enqueue(
      "reduce_scatter_tensor", "reduce_scatter_tensor queued", in.nbytes,
      Call{Call::kReduceScatterTensor, input.numel(), static_cast<int64_t>(input.dtype()),
           static_cast<int64_t>(op), sizes},
      [context, in, out, sizes, op, timeout](uint32_t tag) {
        if (in.nbytes == 0) return;  // every block empty, on every rank
        switch (in.dtype) {  // Note [Ring reduce-scatter]
          case Dtype::Float32:
            run_reduce_scatter<float>(context, in, out, sizes, op, tag, timeout);
            return;
          case Dtype::Float64:
            run_reduce_scatter<double>(context, in, out, sizes, op, tag, timeout);
            return;
          case Dtype::Float16:
            run_reduce_scatter<gloo::float16>(context, in, out, sizes, op, tag, timeout);
            return;
          case Dtype::BFloat16: break;  // refused above, on the calling thread
        }
        TP_THROW(DistributedError, "reduce_scatter_tensor: no Gloo reduction for dtype ",
                 to_string(in.dtype));
      },
      staging);
  return finish_flat(std::move(work), staging != nullptr, checked, impl_->in_flight, input, in,
                     output, out, rank());
}

std::shared_ptr<Work> ProcessGroupGloo::allgather_into_tensor(
    const Tensor& output, const Tensor& input, const std::vector<int64_t>& split_sizes) {
  constexpr const char* fn = "tp::distributed::ProcessGroupGloo::allgather_into_tensor";
  check_tensor(fn, rank(), output, "the output");
  check_tensor(fn, rank(), input, "the input");
  const std::vector<int64_t> sizes =
      check_blocks(fn, rank(), size(), output, "output", input, "input", split_sizes);
  const bool checked = options_.check_in_flight_writes;
  const std::shared_ptr<Staging> staging = begin_flat_staging(fn, rank(), input, output, checked);
  charge_budget("allgather_into_tensor");
  ++counters_.allgather;
  counters_.allgather_bytes += static_cast<uint64_t>(output.nbytes());
  const std::pair<Buffer, Buffer> buffers =
      flat_buffers(fn, rank(), staging.get(), input, output, checked);
  const Buffer& in = buffers.first;
  const Buffer& out = buffers.second;
  auto context = impl_->context;
  const milliseconds timeout = options_.timeout;
  const int me = rank();
  std::shared_ptr<Work> work = impl_->enqueue(
      "allgather_into_tensor", "allgather_into_tensor queued", out.nbytes,
      Call{Call::kAllgatherIntoTensor, output.numel(), static_cast<int64_t>(output.dtype()), 0,
           sizes},
      [context, in, out, sizes, me, timeout](uint32_t tag) {
        if (out.nbytes == 0) return;  // every block empty, on every rank
        // gloo::allgatherv: Gloo's ring all-gather with a block size per rank.
        // Bytes, not elements: it copies and never computes.
        const std::size_t element = element_size(out.dtype);
        std::vector<std::size_t> block_bytes;
        for (int64_t n : sizes) block_bytes.push_back(static_cast<std::size_t>(n) * element);
        gloo::AllgathervOptions opts(context);
        auto* block = static_cast<uint8_t*>(out.ptr()) +
                      static_cast<std::size_t>(block_offsets(sizes)[me]) * element;
        // In place (the input is this rank's block of the output), or an
        // empty block: nothing to copy in first, so no input is given.
        if (block_bytes[me] > 0 && in.ptr() != block) {
          opts.setInput(static_cast<uint8_t*>(in.ptr()), block_bytes[me]);
        }
        opts.setOutput(static_cast<uint8_t*>(out.ptr()), block_bytes);
        opts.setTag(tag);
        opts.setTimeout(timeout);
        gloo::allgatherv(opts);
      },
      staging);
  return finish_flat(std::move(work), staging != nullptr, checked, impl_->in_flight, input, in,
                     output, out, rank());
}

void ProcessGroupGloo::synchronize() { impl_->wait_until_idle(); }

std::shared_ptr<Work> ProcessGroupGloo::barrier() {
  charge_budget("barrier");
  ++counters_.barrier;
  auto context = impl_->context;
  const milliseconds timeout = options_.timeout;
  std::shared_ptr<Work> work =
      impl_->enqueue("barrier", "barrier queued", 0, Call{Call::kBarrier, 0, 0, 0},
                     [context, timeout](uint32_t tag) {
    gloo::BarrierOptions opts(context);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::barrier(opts);
  });
  work->set_outputs({});  // its future's value is empty: a barrier has no output
  return work;
}

}  // namespace tp::distributed