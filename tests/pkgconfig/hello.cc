// A program of your own against the kit, built outside Meson with
//   g++ -std=c++20 hello.cc $(pkg-config --cflags --libs tensorplay)
// (see README.md, "Building your own program against the kit"). The test
// suite builds and runs it through build_and_run.py.
//
// Two ranks each train a copy of a small model on their own data and average
// the gradients by hand with all_reduce: data parallelism in twenty lines.
// Each rank returns its final loss as a number; spawn carries it back.
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "tensorplay/distributed/init.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/nn/activation.h"
#include "tensorplay/nn/linear.h"
#include "tensorplay/nn/sequential.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"
#include "tensorplay/util/temp_dir.h"

namespace dist = tp::distributed;
using tp::nn::Module;

double train(int rank, int world_size, const std::string& init_method) {
  dist::init_process_group("gloo", rank, world_size, init_method);
  tp::manual_seed(7);  // the same model on every rank
  auto model = std::make_shared<tp::nn::Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<tp::nn::Linear>(4, 8), std::make_shared<tp::nn::ReLU>(),
      std::make_shared<tp::nn::Linear>(8, 1)});
  tp::optim::SGD optimizer(model->parameters(), {.lr = 0.1});
  tp::manual_seed(100 + rank);  // ... but each rank its own data
  const tp::Tensor x = tp::randn({16, 4});
  const tp::Tensor y = tp::randn({16, 1});
  double loss_value = 0.0;
  for (int step = 0; step < 5; ++step) {
    optimizer.zero_grad();
    tp::Tensor loss = tp::mse_loss((*model)(x), y);
    loss.backward();
    for (const tp::Tensor& p : model->parameters()) {
      dist::all_reduce(p.grad())->wait();  // synchronous: the Work is already complete
      p.grad().div_(world_size);
    }
    optimizer.step();
    loss_value = loss.item();
  }
  dist::destroy_process_group();
  return loss_value;
}

int main() {
  const int world_size = 2;
  tp::TempDir rendezvous;
  std::vector<double> losses =
      tp::multiprocessing::spawn(train, world_size, world_size, rendezvous.file_init_method());
  for (size_t r = 0; r < losses.size(); ++r) std::printf("rank %zu: final loss %.6f\n", r, losses[r]);
  return losses.size() == 2 && std::isfinite(losses[0]) && std::isfinite(losses[1]) ? 0 : 1;
}
