// ProcessGroupNCCL: values, stream order, timeouts and the one-GPU-per-rank
// check. Needs a CUDA device (skips with exit code 77 otherwise); the
// timeout case needs two. Every case runs in spawned ranks: Note [No CUDA
// in the parent] in cuda_test_util.h.
#include "cuda_test_util.h"

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tensorplay/cuda/runtime.h"
#include "tensorplay/distributed/init.h"
#include "tensorplay/distributed/process_group_nccl.h"
#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/tensor.h"
#include "tensorplay/util/temp_dir.h"

namespace dist = tp::distributed;
namespace mp = tp::multiprocessing;
using doctest::Contains;
using std::chrono::milliseconds;

int main(int argc, char** argv) { return cuda_test::main("test_nccl", argc, argv); }

namespace {

using cuda_test::expect_values;

constexpr milliseconds kTimeout{20000};

tp::Device cuda(int index) { return tp::Device{tp::DeviceType::CUDA, index}; }

dist::ProcessGroupNCCL& nccl_group() {
  auto* group = dynamic_cast<dist::ProcessGroupNCCL*>(dist::default_group().get());
  if (group == nullptr) throw tp::Error("the default group is not a ProcessGroupNCCL");
  return *group;
}

}  // namespace

TEST_CASE("NCCL with one rank: all-reduce, broadcast, all-gather and barrier give the values") {
  tp::TempDir dir("tp-nccl-w1");
  CHECK_NOTHROW(mp::spawn(
      [&](int rank) {
        dist::init_process_group("nccl", rank, 1, dir.file_init_method(), kTimeout);
        if (dist::default_group()->backend_name() != "nccl") throw tp::Error("not nccl");
        for (tp::Dtype dtype : {tp::kFloat32, tp::kFloat64}) {
          for (dist::ReduceOp op : {dist::ReduceOp::SUM, dist::ReduceOp::AVG,
                                    dist::ReduceOp::MIN, dist::ReduceOp::MAX}) {
            tp::Tensor x = tp::tensor({1, 2, 3, 4}, {4}, dtype).to(cuda(0));
            dist::all_reduce(x, op);
            expect_values(x, {1, 2, 3, 4}, "all_reduce " + dist::to_string(op));
          }
          tp::Tensor b = tp::tensor({5, 6}, {2}, dtype).to(cuda(0));
          dist::broadcast(b, 0);
          expect_values(b, {5, 6}, "broadcast");
          std::vector<tp::Tensor> outs{tp::zeros({3}, dtype).to(cuda(0))};
          dist::all_gather(outs, tp::tensor({7, 8, 9}, {3}, dtype).to(cuda(0)));
          expect_values(outs[0], {7, 8, 9}, "all_gather");
        }
        dist::barrier();
        const dist::CollectiveCounters& c = dist::default_group()->counters();
        if (c.allreduce != 8 || c.broadcast != 2 || c.allgather != 2 || c.barrier != 1) {
          throw tp::Error("counters are wrong");
        }
        nccl_group().synchronize();
        dist::destroy_process_group();
      },
      1));
}

TEST_CASE("NCCL with one rank: reduce_scatter_tensor and allgather_into_tensor give the values") {
  tp::TempDir dir("tp-nccl-flat-w1");
  CHECK_NOTHROW(mp::spawn(
      [&](int rank) {
        dist::init_process_group("nccl", rank, 1, dir.file_init_method(), kTimeout);
        for (tp::Dtype dtype : {tp::kFloat32, tp::kFloat64}) {
          tp::Tensor shard = tp::zeros({3}, dtype).to(cuda(0));
          dist::reduce_scatter_tensor(shard, tp::tensor({1, 2, 3}, {3}, dtype).to(cuda(0)), {3},
                                      dist::ReduceOp::AVG);
          expect_values(shard, {1, 2, 3}, "reduce_scatter_tensor AVG");
          tp::Tensor flat = tp::zeros({2}, dtype).to(cuda(0));
          dist::all_gather_into_tensor(flat, tp::tensor({4, 5}, {2}, dtype).to(cuda(0)));
          expect_values(flat, {4, 5}, "all_gather_into_tensor");
        }
        const dist::CollectiveCounters& c = dist::default_group()->counters();
        if (c.reduce_scatter != 2 || c.allgather != 2 || c.reduce_scatter_bytes != 36 ||
            c.allgather_bytes != 24) {
          throw tp::Error("counters are wrong");
        }
        nccl_group().synchronize();
        dist::destroy_process_group();
      },
      1));
}

TEST_CASE("NCCL: wait() orders the caller's stream after the collective, on a stream of its own") {
  // A side stream as the caller's current stream. With one rank an
  // all-reduce leaves values as they are, so an all-gather into zeros
  // shows the order: the collective must read what the side stream queued
  // (the copy to the GPU), and wait() must order the side stream after the
  // copies into the outputs, or cpu() (which waits for the side stream
  // only, never the device) would read zeros.
  tp::TempDir dir("tp-nccl-stream");
  CHECK_NOTHROW(mp::spawn(
      [&](int rank) {
        dist::init_process_group("nccl", rank, 1, dir.file_init_method(), kTimeout);
        const tp::cuda::Stream side = tp::cuda::Stream::create();
        const tp::cuda::StreamGuard guard(side);
        constexpr int kCount = 20;
        std::vector<std::shared_ptr<dist::Work>> works;
        std::vector<tp::Tensor> outs;
        for (int i = 0; i < kCount; ++i) {
          outs.push_back(tp::zeros({1 << 20}, tp::kFloat32, cuda(0)));
          std::vector<tp::Tensor> out{outs.back()};
          works.push_back(dist::all_gather(out, tp::full({1 << 20}, i + 1, tp::kFloat32, cuda(0)),
                                           /*async_op=*/true));
        }
        for (auto& w : works) w->wait();
        for (int i = 0; i < kCount; ++i) {
          const std::vector<double> got = outs[i].cpu().to_vector();
          for (double v : got) {
            if (v != i + 1) {
              throw tp::Error("output " + std::to_string(i) + " holds " + std::to_string(v) +
                              " after wait(), not " + std::to_string(i + 1));
            }
          }
        }
        nccl_group().synchronize();
        for (auto& w : works) {
          if (!w->is_completed()) throw tp::Error("a work is not completed after synchronize()");
        }
        dist::destroy_process_group();
      },
      1));
}

TEST_CASE("NCCL: a rank that skips an all-reduce makes the other's time out, naming it") {
  if (cuda_test::devices() < 2) {
    MESSAGE("skipped: the timeout case needs 2 CUDA devices (NCCL runs one rank per GPU); "
            "this machine has ", cuda_test::devices());
    return;
  }
  constexpr milliseconds kShort{1500};
  tp::TempDir dir("tp-nccl-timeout");
  const std::vector<std::string> results = mp::spawn(
      [&](int rank) -> std::string {
        dist::init_process_group("nccl", rank, 2, dir.file_init_method(), kShort);
        tp::Tensor x = tp::ones({8}, tp::kFloat32).to(tp::Device{tp::DeviceType::CUDA, rank});
        dist::all_reduce(x);  // #1: both ranks; connects them
        nccl_group().synchronize();
        if (rank == 1) {
          // Skips #2 and stays alive meanwhile; leaves without destroying
          // the group (its peer's communicator is aborted).
          std::this_thread::sleep_for(milliseconds(5000));
          return "skipped";
        }
        const auto start = std::chrono::steady_clock::now();
        auto work = dist::all_reduce(x, dist::ReduceOp::SUM, /*async_op=*/true);  // #2
        try {
          nccl_group().synchronize();
        } catch (const tp::TimeoutError& e) {
          const auto ms = std::chrono::duration_cast<milliseconds>(
                              std::chrono::steady_clock::now() - start).count();
          std::string message = e.what();
          // Every later use of the group throws the same kind of error.
          try {
            work->wait();
            message += " | wait() did not throw";
          } catch (const tp::TimeoutError&) {
          }
          try {
            dist::all_reduce(x);
            message += " | the next collective did not throw";
          } catch (const tp::TimeoutError&) {
          }
          dist::destroy_process_group();
          return message + " | elapsed " + std::to_string(ms);
        }
        return "no timeout";
      },
      2);
  const std::string& r0 = results[0];
  CHECK_MESSAGE(r0.find("allreduce #2 on rank 0 timed out after 1500 ms (NCCL") !=
                    std::string::npos, r0);
  CHECK_MESSAGE(r0.find("did not throw") == std::string::npos, r0);
  const long elapsed = std::stol(r0.substr(r0.rfind(' ') + 1));
  CHECK_MESSAGE(elapsed < 1500 + 3000, r0);
  CHECK_EQ(results[1], "skipped");
}

TEST_CASE("NCCL refuses two ranks on one GPU, on every rank, with the fix") {
  tp::TempDir dir("tp-nccl-one-gpu");
  const std::vector<std::string> results = mp::spawn(
      [&](int rank) -> std::string {
        // Both ranks see only the first GPU (set before this process uses
        // CUDA), so both are on cuda:0.
        ::setenv("CUDA_VISIBLE_DEVICES", "0", 1);
        try {
          dist::init_process_group("nccl", rank, 2, dir.file_init_method(), kTimeout);
        } catch (const tp::DistributedError& e) {
          return e.what();
        }
        return "no error";
      },
      2);
  for (const std::string& message : results) {
    CHECK_MESSAGE(message.find("NCCL cannot put two ranks on one GPU (ranks 0 and 1 are both "
                               "on cuda:0 of host ") != std::string::npos, message);
    CHECK_MESSAGE(message.find("give each rank its own GPU, or use the gloo backend, which "
                               "stages CUDA tensors through host memory") != std::string::npos,
                  message);
  }
}

TEST_CASE("NCCL rejects CPU tensors and tensors on another GPU, naming the collective") {
  tp::TempDir dir("tp-nccl-bad");
  CHECK_NOTHROW(mp::spawn(
      [&](int rank) {
        dist::init_process_group("nccl", rank, 1, dir.file_init_method(), kTimeout);
        tp::Tensor cpu = tp::ones({2});
        try {
          dist::all_reduce(cpu);
          throw tp::Error("a CPU tensor was accepted");
        } catch (const tp::DistributedError& e) {
          const std::string m = e.what();
          if (m.find("ProcessGroupNCCL::allreduce") == std::string::npos ||
              m.find("the nccl backend works on CUDA tensors") == std::string::npos) {
            throw tp::Error("unexpected message: " + m);
          }
        }
        dist::destroy_process_group();
      },
      1));
}

TEST_CASE("NCCL: a missing rank 0 is a timeout naming the key of its ncclUniqueId") {
  tp::TempDir dir("tp-nccl-no-rank0");
  const std::vector<std::string> results = mp::spawn(
      [&](int rank) -> std::string {
        if (rank == 0) return "absent";  // never joins
        try {
          dist::init_process_group("nccl", rank, 2, dir.file_init_method(), milliseconds(1000));
        } catch (const tp::TimeoutError& e) {
          return e.what();
        }
        return "no timeout";
      },
      2);
  CHECK_MESSAGE(results[1].find("waited 1000 ms for rank 0's ncclUniqueId under key "
                                "'nccl/unique_id'") != std::string::npos, results[1]);
}
