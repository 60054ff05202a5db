// The gloo backend with CUDA tensors, staged through host memory (Note
// [Staging CUDA tensors] in gloo_cuda_staging.cc): several ranks on one
// GPU, which NCCL cannot do. Needs a CUDA device (skips with exit code 77
// otherwise). Every case runs in spawned ranks: Note [No CUDA in the
// parent] in cuda_test_util.h.
#include "cuda_test_util.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/cuda/runtime.h"
#include "tensorplay/distributed/init.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/tensor.h"
#include "tensorplay/util/temp_dir.h"

namespace dist = tp::distributed;
namespace mp = tp::multiprocessing;
using std::chrono::milliseconds;

int main(int argc, char** argv) { return cuda_test::main("test_gloo_cuda", argc, argv); }

namespace {

using cuda_test::expect_values;

constexpr milliseconds kTimeout{20000};
constexpr tp::Device kCuda0{tp::DeviceType::CUDA, 0};


// Rank r's contribution: element i is (r + 1) * (i + 1), exact in float32.
std::vector<double> contribution(int rank, int n = 5) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back((rank + 1) * (i + 1));
  return v;
}

// The CPU answer of an all-reduce of every rank's contribution.
std::vector<double> reduced(int world, dist::ReduceOp op, int n = 5) {
  std::vector<double> out(n, 0);
  for (int i = 0; i < n; ++i) {
    double sum = 0;
    double max = 0;
    for (int r = 0; r < world; ++r) {
      const double v = (r + 1) * (i + 1);
      sum += v;
      max = std::max(max, v);
    }
    out[i] = op == dist::ReduceOp::SUM ? sum : op == dist::ReduceOp::AVG ? sum / world : max;
  }
  return out;
}

void run_collectives(int rank, int world) {
  // The caller's current stream is a side stream of its own: the staging
  // must read after it and wait() must order it after the copy back.
  const tp::cuda::Stream side = tp::cuda::Stream::create();
  const tp::cuda::StreamGuard guard(side);
  for (tp::Dtype dtype : {tp::kFloat32, tp::kFloat64}) {
    for (dist::ReduceOp op : {dist::ReduceOp::SUM, dist::ReduceOp::AVG, dist::ReduceOp::MAX}) {
      tp::Tensor x = tp::tensor(contribution(rank), {5}, dtype).to(kCuda0);
      // Also the CPU tensor, for the CPU answer through the same group.
      tp::Tensor c = tp::tensor(contribution(rank), {5}, dtype);
      auto work = dist::all_reduce(x, op, /*async_op=*/true);
      dist::all_reduce(c, op);
      work->wait();
      expect_values(x, c.to_vector(), "all_reduce " + dist::to_string(op) + " (the CPU answer)");
      if (op != dist::ReduceOp::AVG) {
        expect_values(x, reduced(world, op), "all_reduce " + dist::to_string(op));
      }
    }
    for (int root = 0; root < world; ++root) {
      tp::Tensor b = tp::tensor(contribution(rank, 3), {3}, dtype).to(kCuda0);
      dist::broadcast(b, root);
      expect_values(b, contribution(root, 3), "broadcast from " + std::to_string(root));
    }
    std::vector<tp::Tensor> outs;
    for (int r = 0; r < world; ++r) outs.push_back(tp::zeros({4}, dtype).to(kCuda0));
    dist::all_gather(outs, tp::tensor(contribution(rank, 4), {4}, dtype).to(kCuda0));
    for (int r = 0; r < world; ++r) {
      expect_values(outs[r], contribution(r, 4), "all_gather block " + std::to_string(r));
    }
    // The flat collectives, in uneven blocks with an empty one (block 1),
    // against the CPU answers through the same group.
    std::vector<int64_t> sizes;
    for (int r = 0; r < world; ++r) sizes.push_back(r == 1 ? 0 : r + 2);
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    const int n = static_cast<int>(sizes[rank]);
    const tp::Tensor flat = tp::tensor(contribution(rank, total), {total}, dtype);
    tp::Tensor shard = tp::zeros({n}, dtype).to(kCuda0);
    tp::Tensor cpu_shard = tp::zeros({n}, dtype);
    dist::reduce_scatter_tensor(shard, flat.to(kCuda0), sizes);
    dist::reduce_scatter_tensor(cpu_shard, flat, sizes);
    expect_values(shard, cpu_shard.to_vector(), "reduce_scatter_tensor (the CPU answer)");
    tp::Tensor gathered = tp::zeros({total}, dtype).to(kCuda0);
    tp::Tensor cpu_gathered = tp::zeros({total}, dtype);
    dist::all_gather_into_tensor(gathered, tp::tensor(contribution(rank, n), {n}, dtype).to(kCuda0),
                                 sizes);
    dist::all_gather_into_tensor(cpu_gathered, tp::tensor(contribution(rank, n), {n}, dtype),
                                 sizes);
    expect_values(gathered, cpu_gathered.to_vector(), "all_gather_into_tensor (the CPU answer)");
  }
  // Many in flight at once, waited for in order.
  std::vector<tp::Tensor> xs;
  std::vector<std::shared_ptr<dist::Work>> works;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(tp::full({1000}, rank + i, tp::kFloat32).to(kCuda0));
    works.push_back(dist::all_reduce(xs.back(), dist::ReduceOp::MAX, /*async_op=*/true));
  }
  for (int i = 0; i < 8; ++i) {
    works[i]->wait();
    expect_values(xs[i], std::vector<double>(1000, world - 1 + i), "in-flight all_reduce");
  }
}

void run_world(int world, const char* dir_name) {
  tp::TempDir dir(dir_name);
  mp::spawn(
      [&](int rank) {
        dist::init_process_group("gloo", rank, world, dir.file_init_method(), kTimeout);
        run_collectives(rank, world);
        dist::destroy_process_group();
      },
      world);
}

}  // namespace

TEST_CASE("gloo stages CUDA tensors: 2 ranks on one GPU get the CPU answers") {
  CHECK_NOTHROW(run_world(2, "tp-gloo-cuda-2"));
}

TEST_CASE("gloo stages CUDA tensors: 4 ranks on one GPU get the CPU answers") {
  CHECK_NOTHROW(run_world(4, "tp-gloo-cuda-4"));
}

TEST_CASE("gloo in checker mode refuses a CUDA tensor, saying why") {
  tp::TempDir dir("tp-gloo-cuda-checker");
  const std::vector<std::string> results = mp::spawn(
      [&](int rank) -> std::string {
        dist::GlooOptions options;
        options.check_in_flight_writes = true;
        dist::ProcessGroupGloo group(dir.path(), rank, 1, options);
        tp::Tensor x = tp::ones({3}).to(kCuda0);
        try {
          group.allreduce(x)->wait();
        } catch (const tp::DistributedError& e) {
          return e.what();
        }
        return "no error";
      },
      1);
  CHECK_MESSAGE(results[0].find("checker mode (GlooOptions::check_in_flight_writes) does not "
                                "take CUDA tensors") != std::string::npos, results[0]);
}
