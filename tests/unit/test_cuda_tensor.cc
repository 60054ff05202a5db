// CUDA tensors: every op and in-place method on a GPU gives the CPU's
// result (float64 to 1e-12, float32 to float rounding), views with any
// strides, copies across devices, mixed-device errors, Module::to with SGD,
// and bit-identical repeat runs.
//
// Needs a CUDA device: without one, main() prints why and exits 77, which
// Meson reports as SKIP. (test_tensor.cc checks, everywhere, that asking for
// a CUDA tensor without CUDA throws with the reason.)

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/cuda/runtime.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"
#include "tensorplay/tensor.h"

using doctest::Contains;
using tp::Tensor;

namespace {

using Values = std::vector<double>;
const tp::Device kGpu = tp::kCUDA;

// 0, 1, 2, ... in row-major order: every value names its position.
Tensor iota(const tp::Shape& shape, tp::Dtype dtype = tp::kFloat32,
            tp::Device device = tp::kCPU) {
  Values values(static_cast<std::size_t>(tp::numel_of(shape)));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i);
  return tp::tensor(values, shape, dtype, device);
}

// Tolerances of a CUDA result against the CPU's: float64 agrees to ~1e-15
// (only the order of additions in a full sum or a GEMM differs); float32 to
// a few float ulps, relative.
void check_close(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  CAPTURE(what);
  REQUIRE(gpu.defined());
  REQUIRE(cpu.defined());
  CHECK(gpu.device() == kGpu);
  CHECK(cpu.device() == tp::kCPU);
  REQUIRE(gpu.shape() == cpu.shape());
  CHECK(gpu.dtype() == cpu.dtype());
  if (cpu.dtype() == tp::kFloat64) {
    CHECK(tp::allclose(gpu, cpu, /*rtol=*/1e-12, /*atol=*/1e-12));
  } else {
    // cuBLAS and OpenBLAS add a dot product's terms in different orders:
    // a few ulps of the partial sums (|x| <~ 4 here, ulp 4.8e-7) apart.
    CHECK(tp::allclose(gpu, cpu, /*rtol=*/4e-6, /*atol=*/4e-6));
  }
}

// One op under test: inputs made from `shapes`, the op applied to them.
struct OpCase {
  std::string name;
  std::vector<tp::Shape> shapes;
  std::function<Tensor(const std::vector<Tensor>&)> op;
};

// Runs op forward and backward on the CPU and on the GPU from the same
// random inputs, and compares the outputs and every input's gradient.
void check_op_on_both(const OpCase& c, tp::Dtype dtype) {
  CAPTURE(c.name);
  CAPTURE(tp::to_string(dtype));
  tp::manual_seed(1234);
  std::vector<Tensor> cpu_in;
  std::vector<Tensor> gpu_in;
  for (const tp::Shape& shape : c.shapes) {
    Tensor x = tp::randn(shape, dtype);
    cpu_in.push_back(x.clone().requires_grad_());
    gpu_in.push_back(x.to(kGpu).requires_grad_());
  }
  const Tensor cpu_out = c.op(cpu_in);
  const Tensor gpu_out = c.op(gpu_in);
  check_close(gpu_out, cpu_out, c.name + " forward");
  // A gradient of the output's shape with distinct values, so a rule that
  // mixes elements up shows.
  const Tensor g = tp::randn(cpu_out.shape(), dtype);
  cpu_out.backward(g);
  gpu_out.backward(g.to(kGpu));
  for (std::size_t i = 0; i < cpu_in.size(); ++i) {
    check_close(gpu_in[i].grad(), cpu_in[i].grad(), c.name + " grad of input " +
                                                        std::to_string(i));
  }
}

std::vector<OpCase> op_cases() {
  using V = const std::vector<Tensor>&;
  return {
      {"matmul", {{5, 7}, {7, 3}}, [](V x) { return tp::matmul(x[0], x[1]); }},
      {"matmul a^T @ b", {{7, 5}, {7, 3}}, [](V x) { return tp::matmul(x[0].t(), x[1]); }},
      {"matmul a @ b^T", {{5, 7}, {3, 7}}, [](V x) { return tp::matmul(x[0], x[1].t()); }},
      {"matmul a^T @ b^T", {{7, 5}, {3, 7}},
       [](V x) { return tp::matmul(x[0].t(), x[1].t()); }},
      {"matmul of narrowed blocks", {{6, 9}, {9, 8}},
       [](V x) { return tp::matmul(x[0].narrow(1, 2, 5), x[1].narrow(0, 1, 5).narrow(1, 3, 4)); }},
      {"matmul (1, k) @ (k, 1)", {{1, 6}, {6, 1}}, [](V x) { return tp::matmul(x[0], x[1]); }},
      {"add", {{4, 6}, {4, 6}}, [](V x) { return tp::add(x[0], x[1]); }},
      {"add bias", {{4, 6}, {6}}, [](V x) { return tp::add(x[0], x[1]); }},
      {"add of transposed views", {{6, 4}, {4, 6}}, [](V x) { return tp::add(x[0].t(), x[1]); }},
      {"sub", {{3, 5}, {3, 5}}, [](V x) { return tp::sub(x[0], x[1]); }},
      {"mul", {{3, 5}, {3, 5}}, [](V x) { return tp::mul(x[0], x[1]); }},
      {"mul scalar", {{3, 5}}, [](V x) { return tp::mul(x[0], 0.3); }},
      {"div scalar", {{3, 5}}, [](V x) { return tp::div(x[0], 3.0); }},
      {"relu", {{4, 5}}, [](V x) { return tp::relu(x[0]); }},
      {"square", {{4, 5}}, [](V x) { return tp::square(x[0]); }},
      {"sum", {{37, 29}}, [](V x) { return tp::sum(x[0]); }},
      {"sum of a view", {{8, 6}}, [](V x) { return tp::sum(x[0].t().narrow(0, 1, 3)); }},
      {"sum dim 0", {{9, 4}}, [](V x) { return tp::sum(x[0], 0); }},
      {"sum dim 1", {{9, 4}}, [](V x) { return tp::sum(x[0], 1); }},
      {"mean", {{100, 7}}, [](V x) { return tp::mean(x[0]); }},
      {"mse_loss", {{8, 3}, {8, 3}}, [](V x) { return tp::mse_loss(x[0], x[1]); }},
      {"linear layer", {{8, 5}, {4, 5}, {4}},
       [](V x) { return tp::relu(tp::add(tp::matmul(x[0], x[1].t()), x[2])); }},
      {"view and flatten", {{4, 6}},
       [](V x) { return tp::square(x[0].view({3, 8})).flatten(); }},
      // Many blocks of the full sum. A mean, not a sum: a sum of 300000
      // float64 values added in two different orders differs by ~1e-11.
      {"large mean (many blocks)", {{1000, 300}}, [](V x) { return tp::mean(x[0]); }},
  };
}

// Builds a MiniMLP from a fixed seed, moves it to device and trains it a few
// SGD steps with momentum; returns the final parameters on the CPU.
std::vector<Tensor> train_mini_mlp(tp::Device device, tp::Dtype dtype, int steps) {
  tp::manual_seed(7);
  tp::nn::MiniMLPOptions options;
  options.dtype = dtype;
  tp::nn::MiniMLP model(options);
  model.to(device);
  tp::optim::SGD sgd(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  tp::manual_seed(99);
  const Tensor x = tp::randn({16, options.in_features}, dtype).to(device);
  const Tensor y = tp::randn({16, options.out_features}, dtype).to(device);
  for (int step = 0; step < steps; ++step) {
    sgd.zero_grad();
    tp::mse_loss(model(x), y).backward();
    sgd.step();
  }
  std::vector<Tensor> out;
  for (const Tensor& p : model.parameters()) out.push_back(p.detach().cpu());
  return out;
}

}  // namespace

// ---- factories and moving data ------------------------------------------------------

TEST_CASE("factories make tensors on the GPU with the values asked for") {
  for (tp::Dtype dtype : {tp::kFloat32, tp::kFloat64}) {
    CAPTURE(tp::to_string(dtype));
    Tensor z = tp::zeros({2, 3}, dtype, kGpu);
    CHECK(z.device() == kGpu);
    CHECK(z.dtype() == dtype);
    CHECK(z.is_contiguous());
    CHECK(z.to_vector() == Values(6, 0.0));
    CHECK(tp::ones({4}, dtype, kGpu).to_vector() == Values(4, 1.0));
    CHECK(tp::full({2, 2}, 2.5, dtype, kGpu).to_vector() == Values(4, 2.5));
    CHECK(tp::tensor({1, 2, 3}, {3}, dtype, kGpu).to_vector() == Values{1, 2, 3});
    CHECK(tp::empty({0}, dtype, kGpu).numel() == 0);
    CHECK(tp::zeros_like(z).device() == kGpu);
    CHECK(tp::full({}, 4.5, dtype, kGpu).item() == 4.5);
  }
  // Index -1 is the current device, made concrete.
  CHECK(tp::zeros({1}, tp::kFloat32, tp::Device{tp::DeviceType::CUDA, -1}).device() ==
        tp::Device{tp::DeviceType::CUDA, tp::cuda::current_device()});
}

TEST_CASE("a CUDA tensor prints its values and its device") {
  CHECK(tp::tensor({1, 2, 3, 4}, {2, 2}, tp::kFloat32, kGpu).t().to_string() ==
        "tensor([[1, 3], [2, 4]], device='cuda:0', dtype=float32)");
}

TEST_CASE("to(), cpu() and cuda() round-trip values; the same device returns the tensor") {
  for (tp::Dtype dtype : {tp::kFloat32, tp::kFloat64}) {
    Tensor a = iota({3, 4}, dtype);
    Tensor g = a.to(kGpu);
    CHECK(g.device() == kGpu);
    CHECK(g.dtype() == dtype);
    CHECK_FALSE(g.is_alias_of(a));
    CHECK(g.to(kGpu).impl() == g.impl());
    CHECK(g.cuda().impl() == g.impl());
    CHECK(g.cpu().to_vector() == a.to_vector());
    CHECK(a.cuda().device() == kGpu);
    // A strided view moves as a contiguous copy, in row-major order.
    Tensor v = g.t().narrow(0, 1, 2);
    Tensor back = v.cpu();
    CHECK(back.is_contiguous());
    CHECK(back.to_vector() == a.t().narrow(0, 1, 2).to_vector());
    // dtype conversion on the GPU.
    CHECK(g.to(tp::kFloat64).device() == kGpu);
    CHECK(g.to(tp::kFloat32).to_vector() == a.to_vector());
  }
}

TEST_CASE("to(device) is differentiable: the gradient comes back to the CPU") {
  Tensor a = iota({2, 3}, tp::kFloat64).requires_grad_();
  Tensor loss = tp::sum(tp::square(a.to(kGpu)));
  CHECK(loss.device() == kGpu);
  loss.backward();
  REQUIRE(a.grad().defined());
  CHECK(a.grad().device() == tp::kCPU);
  CHECK(a.grad().to_vector() == Values{0, 2, 4, 6, 8, 10});
}

TEST_CASE("copy_ across devices, into and out of strided views, converting dtypes") {
  // CPU -> GPU into a transposed view.
  Tensor g = tp::zeros({3, 2}, tp::kFloat64, kGpu);
  g.t().copy_(iota({2, 3}, tp::kFloat32));
  CHECK(g.to_vector() == iota({2, 3}).t().to_vector());
  // GPU -> CPU into a narrowed view, float64 -> float32.
  Tensor c = tp::full({4, 3}, -1.0);
  c.narrow(0, 1, 2).copy_(iota({2, 3}, tp::kFloat64, kGpu));
  CHECK(c.to_vector() == Values{-1, -1, -1, 0, 1, 2, 3, 4, 5, -1, -1, -1});
  // GPU strided source -> CPU contiguous destination.
  Tensor d = tp::zeros({3, 2});
  d.copy_(iota({2, 3}, tp::kFloat32, kGpu).t());
  CHECK(d.to_vector() == Values{0, 3, 1, 4, 2, 5});
  // Shapes still must match.
  CHECK_THROWS_WITH_AS(d.copy_(tp::zeros({2, 3}, tp::kFloat32, kGpu)), Contains("shapes"),
                       tp::Error);
}

TEST_CASE("a 16-bit CPU tensor copies to and from a float32 GPU tensor, converting on the CPU") {
  // A GPU gradient compressed into a float16 CPU bucket slot: the bytes
  // cross as float32 and are rounded on the CPU (no CUDA tensor is 16-bit).
  Tensor bucket = tp::zeros({4}, tp::kFloat16);
  bucket.narrow(0, 1, 2).copy_(tp::tensor({0.5, 1.0 / 3}, {2}, tp::kFloat32, kGpu));
  CHECK(bucket.to_vector() == Values{0, 0.5, 0.333251953125, 0});  // 1/3 as a float16
  // And back: a bfloat16 CPU tensor into a float32 GPU view.
  Tensor g = tp::zeros({2, 2}, tp::kFloat32, kGpu);
  g.t().copy_(tp::tensor({1, 2, 3, 4}, {2, 2}, tp::kBFloat16));
  CHECK(g.to_vector() == Values{1, 3, 2, 4});
  CHECK_THROWS_WITH_AS(g.to(tp::kFloat16),
                       Contains("tp::Tensor::to: a float16 tensor on cuda:0 was requested, but "
                                "the kit's CUDA path runs float32 and float64 only"),
                       tp::Error);
}

// ---- in-place ops on views ------------------------------------------------------------

TEST_CASE("in-place ops through views with any strides equal the CPU's, bit for bit") {
  for (tp::Dtype dtype : {tp::kFloat32, tp::kFloat64}) {
    CAPTURE(tp::to_string(dtype));
    // The same sequence on both devices; elementwise ops round the same way.
    auto run = [&](tp::Device device) {
      Tensor bucket = tp::zeros({40}, dtype, device);  // a DDP bucket...
      Tensor slot_a = bucket.narrow(0, 4, 12).view({3, 4});  // ...and two slots
      Tensor slot_b = bucket.narrow(0, 20, 6).view({2, 3});
      slot_a.copy_(iota({3, 4}, dtype, device));
      slot_b.fill_(0.7);
      slot_a.t().narrow(0, 1, 2).mul_(1.3);       // strided, in place
      slot_a.narrow(1, 0, 3).add_(slot_a.narrow(1, 1, 3), -0.25);  // overlapping source
      slot_b.add_(slot_a.narrow(0, 0, 2).narrow(1, 1, 3), 0.1);
      slot_b.div_(3.0);
      bucket.narrow(0, 30, 10).copy_(bucket.narrow(0, 4, 10));
      Tensor m = iota({4, 4}, dtype, device);
      m.copy_(m.t());  // overlaps itself: read as before the call
      return std::make_pair(bucket.to_vector(), m.to_vector());
    };
    const auto cpu = run(tp::kCPU);
    const auto gpu = run(kGpu);
    CHECK(gpu.first == cpu.first);
    CHECK(gpu.second == cpu.second);
  }
}

TEST_CASE("zero_, fill_ and copy_ on a GPU view leave the rest of the storage alone") {
  Tensor g = iota({4, 5}, tp::kFloat32, kGpu);
  g.narrow(1, 1, 2).zero_();
  CHECK(g.to_vector() == Values{0, 0, 0, 3, 4, 5, 0, 0, 8, 9, 10, 0, 0, 13, 14,
                                15, 0, 0, 18, 19});
  g.t().narrow(0, 4, 1).fill_(-2);
  CHECK(g.narrow(1, 4, 1).to_vector() == Values(4, -2.0));
  CHECK(g.narrow(1, 3, 1).to_vector() == Values{3, 8, 13, 18});
}

// ---- ops, forward and backward ---------------------------------------------------------

TEST_CASE("every op, forward and backward, on the GPU equals the CPU") {
  for (const OpCase& c : op_cases()) {
    for (tp::Dtype dtype : {tp::kFloat64, tp::kFloat32}) check_op_on_both(c, dtype);
  }
}

TEST_CASE("sum(dim) adds in the CPU's order, so it matches bit for bit") {
  tp::manual_seed(5);
  Tensor x = tp::randn({50, 30}, tp::kFloat32);
  for (int64_t dim : {0, 1}) {
    CHECK(tp::sum(x.to(kGpu), dim).to_vector() == tp::sum(x, dim).to_vector());
  }
}

TEST_CASE("a matmul with an empty inner dimension gives zeros on the GPU") {
  Tensor out = tp::matmul(tp::zeros({2, 0}, tp::kFloat32, kGpu),
                          tp::zeros({0, 3}, tp::kFloat32, kGpu));
  CHECK(out.device() == kGpu);
  CHECK(out.to_vector() == Values(6, 0.0));
}

TEST_CASE("backward from a GPU loss puts the implicit gradient on the GPU") {
  Tensor w = tp::ones({3}, tp::kFloat64, kGpu).requires_grad_();
  Tensor loss = tp::mean(tp::square(w));
  loss.backward();  // no gradient given: ones on the loss's device
  CHECK(w.grad().device() == kGpu);
  CHECK(tp::max_abs_diff(w.grad(), tp::full({3}, 2.0 / 3.0, tp::kFloat64)) <= 1e-15);
  CHECK(std::abs(loss.item() - 1.0) <= 1e-15);
  CHECK(std::abs(w.norm() - std::sqrt(3.0)) <= 1e-15);
}

TEST_CASE("an op given tensors on two devices names the op and both devices") {
  Tensor c = tp::ones({2, 2});
  Tensor g = tp::ones({2, 2}, tp::kFloat32, kGpu);
  CHECK_THROWS_WITH_AS(tp::add(c, g),
                       Contains("tp::add: tensors on cpu and cuda:0; move one with .to(...)"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(tp::matmul(g, c), Contains("tp::matmul: tensors on cuda:0 and cpu"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(tp::sub(c, g), Contains("tp::sub"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::mul(c, g), Contains("tp::mul"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::mse_loss(g, c), Contains("tp::mse_loss"), tp::Error);
  CHECK_THROWS_WITH_AS(g.add_(c), Contains("tp::Tensor::add_: tensors on cuda:0 and cpu"),
                       tp::Error);
  // Comparisons copy to the CPU, so they take any two devices.
  CHECK(tp::max_abs_diff(g, c) == 0.0);
  CHECK(tp::allclose(c, g));
}

// ---- modules and training ----------------------------------------------------------------

TEST_CASE("Module::to moves parameters in place: the same handles, now on the GPU") {
  tp::manual_seed(3);
  tp::nn::MiniMLP model;
  std::vector<Tensor> before = model.parameters();
  std::vector<Values> values;
  for (const Tensor& p : before) values.push_back(p.to_vector());
  // A gradient moves with its parameter.
  tp::mse_loss(model(tp::randn({2, 16})), tp::zeros({2, 4})).backward();
  const Values grad0 = before[0].grad().to_vector();
  int hook_calls = 0;
  auto handle = before[0].register_post_accumulate_grad_hook(
      [&](const Tensor&) { ++hook_calls; });

  model.to(kGpu);
  std::vector<Tensor> after = model.parameters();
  REQUIRE(after.size() == before.size());
  for (std::size_t i = 0; i < after.size(); ++i) {
    CHECK(after[i].impl() == before[i].impl());
    CHECK(before[i].device() == kGpu);
    CHECK(before[i].is_leaf());
    CHECK(before[i].requires_grad());
    CHECK(before[i].to_vector() == values[i]);
  }
  CHECK(before[0].grad().device() == kGpu);
  CHECK(before[0].grad().to_vector() == grad0);
  // Hooks registered before the move still fire.
  model.zero_grad();
  tp::mse_loss(model(tp::randn({2, 16}).to(kGpu)), tp::zeros({2, 4}, tp::kFloat32, kGpu))
      .backward();
  CHECK(hook_calls == 1);
  CHECK(before[0].grad().device() == kGpu);
  // And back.
  model.to(tp::kCPU);
  CHECK(before[0].device() == tp::kCPU);
  CHECK(before[0].impl() == after[0].impl());
}

TEST_CASE("SGD with momentum trains a MiniMLP on the GPU as on the CPU") {
  const auto cpu = train_mini_mlp(tp::kCPU, tp::kFloat64, 5);
  const auto gpu = train_mini_mlp(kGpu, tp::kFloat64, 5);
  REQUIRE(cpu.size() == gpu.size());
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    CAPTURE(i);
    CHECK(tp::max_abs_diff(gpu[i], cpu[i]) <= 1e-12);
  }
  const auto cpu32 = train_mini_mlp(tp::kCPU, tp::kFloat32, 5);
  const auto gpu32 = train_mini_mlp(kGpu, tp::kFloat32, 5);
  for (std::size_t i = 0; i < cpu32.size(); ++i) {
    CAPTURE(i);
    CHECK(tp::allclose(gpu32[i], cpu32[i], 1e-4, 1e-5));
  }
}

TEST_CASE("two runs on the GPU are bit-identical") {
  for (tp::Dtype dtype : {tp::kFloat32, tp::kFloat64}) {
    CAPTURE(tp::to_string(dtype));
    const auto first = train_mini_mlp(kGpu, dtype, 4);
    const auto second = train_mini_mlp(kGpu, dtype, 4);
    for (std::size_t i = 0; i < first.size(); ++i) {
      CHECK(first[i].to_vector() == second[i].to_vector());
    }
    tp::manual_seed(11);
    Tensor x = tp::randn({513, 257}, dtype).to(kGpu);
    CHECK(tp::sum(x).item() == tp::sum(x).item());
    CHECK(tp::mean(x).item() == tp::mean(x).item());
  }
}

TEST_CASE("work on a side stream is ordered by the copy back to the CPU") {
  tp::cuda::Stream side = tp::cuda::Stream::create();
  Tensor out;
  {
    tp::cuda::StreamGuard guard(side);
    // Small integers: every product and sum is exact in float32.
    Tensor a = iota({16, 16}, tp::kFloat32, kGpu);
    out = tp::matmul(a, a.t());
  }
  // The copy to the CPU runs on the default stream, which does not wait for
  // a non-blocking stream by itself.
  side.synchronize();
  Tensor a = iota({16, 16});
  CHECK(out.to_vector() == tp::matmul(a, a.t()).to_vector());
}

int main(int argc, char** argv) {
  if (!tp::cuda::is_available()) {
    std::printf("SKIP: test_cuda_tensor: no GPU here: %s\n", tp::cuda::unavailable_reason().c_str());
    return 77;  // Meson's "skipped"
  }
  doctest::Context context(argc, argv);
  return context.run();
}
