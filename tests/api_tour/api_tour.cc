// The README's API tour: the classic PyTorch DDP example, in tensorplay.
// Built and run by the test suite; tools/snippets.py copies the marked part
// into README.md, so the README shows exactly this compiled code.
#include <cstdio>
#include <memory>
#include <string>

#include "ddp.h"  // solutions/01-naive: stage01::DistributedDataParallel
#include "tensorplay/distributed/init.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/nn/linear.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"
#include "tensorplay/util/temp_dir.h"

namespace dist = tp::distributed;

// Every value of t as a hexadecimal float: equal strings mean equal bits.
std::string exact_text(const tp::Tensor& t) {
  std::string out;
  char buf[32];
  for (double v : t.to_vector()) {
    std::snprintf(buf, sizeof buf, "%a ", v);
    out += buf;
  }
  return out + "\n";
}

// True when every rank reported the same parameters as rank 0.
bool all_ranks_agree(const std::vector<std::string>& params) {
  for (size_t rank = 1; rank < params.size(); ++rank) {
    if (params[rank] != params[0]) {
      std::printf("FAIL: rank %zu ends with different parameters than rank 0\n", rank);
      return false;
    }
  }
  std::printf("ok: %zu ranks seeded differently and ended with identical parameters\n",
              params.size());
  return true;
}

// [snippet:tour]
std::string example(int rank, int world_size, const std::string& init_method) {
  dist::init_process_group("gloo", rank, world_size, init_method);

  tp::manual_seed(100 + rank);  // every rank builds a different model ...
  auto model = std::make_shared<tp::nn::Linear>(10, 10);
  // ... until DDP broadcasts rank 0's parameters to all of them.
  stage01::DistributedDataParallel ddp_model(model, dist::default_group());
  tp::optim::SGD optimizer(ddp_model.parameters(), {.lr = 0.001});

  tp::Tensor outputs = ddp_model(tp::randn({20, 10}));
  outputs.square().mean().backward();
  ddp_model.sync_grads();  // stage 01 averages gradients after backward
  optimizer.step();

  std::string params;  // sent back to the parent to compare the ranks
  for (const tp::Tensor& p : ddp_model.parameters()) params += exact_text(p);
  dist::destroy_process_group();
  return params;
}

int main() {
  const int world_size = 4;
  tp::TempDir rendezvous;  // a fresh file:// rendezvous directory
  std::vector<std::string> params = tp::multiprocessing::spawn(
      example, world_size, world_size, rendezvous.file_init_method());
  return all_ranks_agree(params) ? 0 : 1;
}
// [/snippet:tour]
