// tp::memory: storage bytes counted per kind as tensors are allocated and
// freed, KindScope, and the kinds the library sets (gradients, SGD's
// momentum, buffers). The counters are process-wide, so every test compares
// a reading before with one after, never an absolute value.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>

#include "tensorplay/memory.h"
#include "tensorplay/nn/linear.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/tensor.h"

namespace memory = tp::memory;
using memory::Kind;

namespace {

// Bytes of `kind` live now minus at `before` (negative: freed since).
int64_t live_change(const memory::Stats& before, Kind kind) {
  return static_cast<int64_t>(memory::stats().live_bytes(kind)) -
         static_cast<int64_t>(before.live_bytes(kind));
}

// The bytes of every parameter's storage together.
int64_t parameter_bytes(const tp::nn::Module& model) {
  int64_t total = 0;
  for (const tp::Tensor& p : model.parameters()) total += static_cast<int64_t>(p.nbytes());
  return total;
}

}  // namespace

TEST_CASE("an allocation adds its bytes to the current kind, and freeing it takes them back") {
  const memory::Stats before = memory::stats();
  {
    tp::Tensor t = tp::zeros({10, 3});  // 30 floats
    CHECK(live_change(before, Kind::Other) == 120);
    tp::Tensor d = tp::zeros({5}, tp::kFloat64);
    CHECK(live_change(before, Kind::Other) == 160);
    CHECK(t.storage()->memory_kind() == Kind::Other);
  }
  CHECK(live_change(before, Kind::Other) == 0);
}

TEST_CASE("a view shares its storage and counts nothing") {
  tp::Tensor t = tp::zeros({4, 6});
  const memory::Stats before = memory::stats();
  {
    tp::Tensor v = t.view({6, 4});
    tp::Tensor n = t.narrow(1, 2, 3);
    tp::Tensor f = t.flatten();
    tp::Tensor tt = t.t();
    tp::Tensor d = t.detach();
    CHECK(live_change(before, Kind::Other) == 0);
    tp::Tensor c = n.contiguous();  // not contiguous: a real copy, 4 x 3 floats
    CHECK(live_change(before, Kind::Other) == 48);
  }
  CHECK(live_change(before, Kind::Other) == 0);
}

TEST_CASE("KindScope sets the thread's kind, nests, and restores the one before") {
  CHECK(memory::current_kind() == Kind::Other);
  const memory::Stats before = memory::stats();
  {
    memory::KindScope outer(Kind::Communication);
    tp::Tensor a = tp::zeros({8});
    {
      memory::KindScope inner(Kind::OptimizerState);
      CHECK(memory::current_kind() == Kind::OptimizerState);
      tp::Tensor b = tp::zeros({4});
      CHECK(live_change(before, Kind::OptimizerState) == 16);
      CHECK(b.storage()->memory_kind() == Kind::OptimizerState);
    }
    CHECK(memory::current_kind() == Kind::Communication);
    tp::Tensor c = tp::zeros({2});
    CHECK(live_change(before, Kind::Communication) == 40);
    CHECK(live_change(before, Kind::OptimizerState) == 0);
  }
  CHECK(memory::current_kind() == Kind::Other);
  CHECK(live_change(before, Kind::Communication) == 0);
  CHECK(memory::to_string(Kind::OptimizerState) == "optimizer state");
}

TEST_CASE("a storage moved to another kind takes its bytes along") {
  tp::Tensor t = tp::zeros({16});
  const memory::Stats before = memory::stats();
  t.storage()->set_memory_kind(Kind::Parameter);
  CHECK(live_change(before, Kind::Parameter) == 64);
  CHECK(live_change(before, Kind::Other) == -64);
  t = tp::Tensor();  // freed as what it is now
  CHECK(live_change(before, Kind::Parameter) == 0);
  CHECK(live_change(before, Kind::Other) == -64);
}

TEST_CASE("the gradients of a small Linear count as Gradient, a parameter's bytes each") {
  auto model = std::make_shared<tp::nn::Linear>(5, 3);  // 15 + 3 floats
  const memory::Stats before = memory::stats();
  tp::Tensor loss = (*model)(tp::ones({2, 5})).square().sum();
  loss.backward();
  CHECK(live_change(before, Kind::Gradient) == parameter_bytes(*model));
  CHECK(parameter_bytes(*model) == 72);
  CHECK(model->weight.grad().storage()->memory_kind() == Kind::Gradient);
  // A second backward adds into the same gradients: no new bytes.
  (*model)(tp::ones({2, 5})).square().sum().backward();
  CHECK(live_change(before, Kind::Gradient) == 72);
  model->zero_grad();  // set_to_none frees them
  CHECK(live_change(before, Kind::Gradient) == 0);
}

TEST_CASE("SGD's momentum buffers count as OptimizerState: a parameter's bytes each") {
  auto model = std::make_shared<tp::nn::Linear>(7, 4);
  (*model)(tp::ones({3, 7})).sum().backward();
  SUBCASE("momentum 0.9: one buffer per parameter") {
    const memory::Stats before = memory::stats();
    tp::optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
    sgd.step();
    CHECK(live_change(before, Kind::OptimizerState) == parameter_bytes(*model));
    sgd.step();  // the buffers are reused
    CHECK(live_change(before, Kind::OptimizerState) == parameter_bytes(*model));
    CHECK(live_change(before, Kind::Other) == 0);
  }
  SUBCASE("momentum 0: no state") {
    const memory::Stats before = memory::stats();
    tp::optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.0});
    sgd.step();
    CHECK(live_change(before, Kind::OptimizerState) == 0);
  }
}

TEST_CASE("a model built under KindScope(Parameter) counts its parameters so, not its buffers") {
  const memory::Stats before = memory::stats();
  std::shared_ptr<tp::nn::Module> model;
  {
    memory::KindScope parameters(Kind::Parameter);
    model = std::make_shared<tp::nn::BufferedMLP>();
  }
  CHECK(live_change(before, Kind::Parameter) == parameter_bytes(*model));
  int64_t buffer_bytes = 0;
  for (const tp::Tensor& b : model->buffers()) buffer_bytes += static_cast<int64_t>(b.nbytes());
  CHECK(buffer_bytes > 0);
  CHECK(live_change(before, Kind::Other) == buffer_bytes);
  model.reset();
  CHECK(live_change(before, Kind::Parameter) == 0);
}

TEST_CASE("the model-state peak is the most parameters + gradients + state live at once") {
  memory::reset_peaks();
  const memory::Stats start = memory::stats();
  CHECK(start.model_state_peak == start.model_state_live());
  CHECK(start.peak_bytes(Kind::Gradient) == start.live_bytes(Kind::Gradient));

  std::shared_ptr<tp::nn::Linear> model;
  {
    memory::KindScope parameters(Kind::Parameter);
    model = std::make_shared<tp::nn::Linear>(6, 2);  // 12 + 2 floats: 56 bytes
  }
  const auto bytes = static_cast<uint64_t>(parameter_bytes(*model));
  REQUIRE(bytes == 56);
  (*model)(tp::ones({1, 6})).sum().backward();
  tp::optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.5});
  sgd.step();
  CHECK(memory::stats().model_state_peak == start.model_state_live() + 3 * bytes);
  model->zero_grad();  // freeing lowers the live bytes, never a peak
  const memory::Stats after = memory::stats();
  CHECK(after.model_state_live() == start.model_state_live() + 2 * bytes);
  CHECK(after.model_state_peak == start.model_state_live() + 3 * bytes);
  CHECK(after.peak_bytes(Kind::Gradient) == start.live_bytes(Kind::Gradient) + bytes);
  // Other bytes (the activations) are not model state.
  CHECK(after.peak_bytes(Kind::Other) > start.live_bytes(Kind::Other));
  memory::reset_peaks();
  CHECK(memory::stats().model_state_peak == after.model_state_live());
}

TEST_CASE("Storage::resize_ frees the bytes under every view and allocates them again") {
  tp::Tensor flat = [] {
    memory::KindScope parameters(Kind::Parameter);
    return tp::ones({8});
  }();
  const tp::Tensor view = flat.narrow(0, 2, 4).view({2, 2});
  const memory::Stats before = memory::stats();
  flat.storage()->resize_(0);
  CHECK(flat.storage()->is_freed());
  CHECK(live_change(before, Kind::Parameter) == -32);  // under its own kind
  CHECK_THROWS_WITH_AS(view.to_vector(), doctest::Contains("views a storage whose bytes were freed"),
                       tp::Error);
  CHECK_THROWS_AS(flat.data_ptr<float>(), tp::Error);
  flat.storage()->resize_(0);  // freeing twice frees nothing more
  CHECK(live_change(before, Kind::Parameter) == -32);
  flat.storage()->resize_(32);  // the same Storage: the view sees the new bytes
  CHECK(live_change(before, Kind::Parameter) == 0);
  flat.fill_(3.0);
  CHECK(view.to_vector() == std::vector<double>{3, 3, 3, 3});
  CHECK_THROWS_WITH_AS(flat.storage()->resize_(64), doctest::Contains("free them first"),
                       tp::Error);
  memory::Stats a = memory::stats(), b = a;
  a.peak[0] = 10;
  b.peak[0] = 5;
  b.live[0] = 7;
  CHECK(memory::combine_spans(a, b).peak[0] == 10);
  CHECK(memory::combine_spans(a, b).live[0] == 7);
}
