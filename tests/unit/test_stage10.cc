// Stage 10's FSDP end to end, through the kit's trainer: every sharding
// strategy and prefetch trains the models it can hold as the reference
// does, on 1 to 4 ranks; memory stays within the bounds sharding promises;
// bad input gets clear errors; checkpoints reshard and resume exactly;
// clipping over shards equals clipping the whole. (Its checker, with
// planted bugs, comes with the stage's exercise.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "ddp.h"
#include "state_dict.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/data.h"
#include "tensorplay/ops.h"
#include "tensorplay/optim/sgd.h"
#include "tensorplay/random.h"
#include "tensorplay/train/compare.h"
#include "tensorplay/train/ddp_trainer.h"
#include "tensorplay/train/reference.h"
#include "tensorplay/util/temp_dir.h"

namespace {

using stage10::BackwardPrefetch;
using stage10::FullyShardedDataParallel;
using stage10::ShardingStrategy;
using tp::train::ModelKind;
using tp::train::RunConfig;

constexpr ShardingStrategy kStrategies[] = {ShardingStrategy::FULL_SHARD,
                                            ShardingStrategy::SHARD_GRAD_OP,
                                            ShardingStrategy::NO_SHARD};

RunConfig plan(int world_size, ModelKind model = ModelKind::MiniMLP) {
  RunConfig config;
  config.world_size = world_size;
  config.model_kind = model;
  config.steps = 4;
  config.momentum = 0.9;
  config.deep_depth = 6;
  return config;
}

// The diagnosis of a run against the reference: "" when it matches to the
// dtype's default tolerance (compare.cc, Note [Tolerance]).
std::string mismatch(const RunConfig& config, const stage10::Options& options) {
  const std::vector<tp::train::RankResult> ranks =
      tp::train::run_ddp<FullyShardedDataParallel>(config, options);
  const tp::train::ReferenceResult reference = tp::train::train_reference(config);
  return tp::train::format_findings(tp::train::diagnose(
      config, reference, ranks, tp::train::default_tolerance(config.dtype)));
}

std::string describe(const RunConfig& config, const stage10::Options& options) {
  return tp::train::describe(config) + ", " + stage10::to_string(options.sharding_strategy) +
         ", backward prefetch " + stage10::to_string(options.backward_prefetch) +
         (options.forward_prefetch ? ", forward prefetch" : "") + ", units " +
         (options.auto_wrap_policy.name.empty() ? "linear" : options.auto_wrap_policy.name);
}

// Runs body(rank, group) on `world_size` ranks with a short collective
// timeout, so a hang fails in seconds.
template <typename Body>
auto run_ranks(int world_size, Body body) {
  tp::TempDir rendezvous;
  tp::multiprocessing::SpawnOptions options;
  options.timeout = std::chrono::seconds(60);
  return tp::multiprocessing::spawn(options, [&](int rank) {
    auto group = std::make_shared<tp::distributed::ProcessGroupGloo>(
        rendezvous.path(), rank, world_size,
        tp::distributed::GlooOptions{std::chrono::milliseconds(5000)});
    return body(rank, group);
  }, world_size);
}

}  // namespace

TEST_CASE("every sharding strategy trains MiniMLP as the reference on 1 to 4 ranks") {
  for (int w = 1; w <= 4; ++w) {
    for (ShardingStrategy strategy : kStrategies) {
      const RunConfig config = plan(w);
      const stage10::Options options{.sharding_strategy = strategy};
      CAPTURE(describe(config, options));
      CHECK(mismatch(config, options) == "");
    }
  }
}

TEST_CASE("prefetching, forward and backward, changes no number on the deep model") {
  for (BackwardPrefetch prefetch : {BackwardPrefetch::NONE, BackwardPrefetch::BACKWARD_PRE,
                                    BackwardPrefetch::BACKWARD_POST}) {
    for (bool forward_prefetch : {false, true}) {
      const RunConfig config = plan(3, ModelKind::Deep);
      const stage10::Options options{.backward_prefetch = prefetch,
                                     .forward_prefetch = forward_prefetch};
      CAPTURE(describe(config, options));
      CHECK(mismatch(config, options) == "");
    }
  }
}

TEST_CASE("float64, two micro-batches under no_sync, gradients zeroed in place") {
  for (ShardingStrategy strategy : kStrategies) {
    RunConfig config = plan(4, ModelKind::Deep);
    config.dtype = tp::kFloat64;
    config.micro_batches = 2;
    config.zero_grad_set_to_none = false;
    const stage10::Options options{.sharding_strategy = strategy, .forward_prefetch = true};
    CAPTURE(describe(config, options));
    CHECK(mismatch(config, options) == "");
  }
}

TEST_CASE("models used out of registration order, and in two dtypes, one unit per Linear") {
  for (ModelKind model : {ModelKind::Reordered, ModelKind::Mixed}) {
    const RunConfig config = plan(2, model);
    const stage10::Options options{.forward_prefetch = true};
    CAPTURE(describe(config, options));
    CHECK(mismatch(config, options) == "");
  }
}

TEST_CASE("each child a unit, or units by size with the rest in the root unit") {
  // deep_mlp(16, 32, 6, 4): Linear(16, 32) has 544 elements, the middle
  // ones 1056, the last 132: with min_num_params 1000 the middle five are
  // units and the first and last share the root unit.
  for (const stage10::AutoWrapPolicy& policy :
       {stage10::children_wrap_policy(), stage10::size_based_auto_wrap_policy(1000)}) {
    const RunConfig config = plan(4, ModelKind::Deep);
    const stage10::Options options{.auto_wrap_policy = policy, .forward_prefetch = true};
    CAPTURE(describe(config, options));
    CHECK(mismatch(config, options) == "");
  }
}

TEST_CASE("ranks that build different models start from rank 0's with sync_module_states") {
  RunConfig config = plan(3);
  config.per_rank_seed = true;
  CHECK(mismatch(config, stage10::Options{.sync_module_states = true}) == "");
  try {
    tp::train::run_ddp<FullyShardedDataParallel>(config, stage10::Options{});
    FAIL("ranks with different values trained");
  } catch (const tp::multiprocessing::SpawnError& e) {
    CHECK(std::string(e.what()).find("parameter 0 (fc1.weight) holds different values on "
                                     "rank 1 than on rank 0") != std::string::npos);
    CHECK(std::string(e.what()).find("sync_module_states = true") != std::string::npos);
  }
}

// Bytes of the deep model's parameters, by unit, at world size w: each
// unit padded to a multiple of w.
struct DeepSizes {
  int64_t shards = 0;   // elements of every unit's shard together: the sharded model
  int64_t largest = 0;  // the largest unit's padded elements
};
DeepSizes deep_sizes(const RunConfig& config) {
  DeepSizes sizes;
  const std::shared_ptr<tp::nn::Module> model = tp::train::make_model(config);
  for (const auto& [name, child] : model->children()) {
    int64_t n = 0;
    for (const tp::Tensor& p : child->parameters()) n += p.numel();
    if (n == 0) continue;
    const int64_t padded = (n + config.world_size - 1) / config.world_size * config.world_size;
    sizes.shards += padded / config.world_size;
    sizes.largest = std::max(sizes.largest, padded);
  }
  return sizes;
}

TEST_CASE("FULL_SHARD on 4 ranks holds 1/W of the model plus the units in use") {
  RunConfig config = plan(4, ModelKind::Deep);
  config.deep_depth = 8;
  const DeepSizes sizes = deep_sizes(config);
  const uint64_t f32 = 4;
  const uint64_t shards = static_cast<uint64_t>(sizes.shards) * f32;
  const uint64_t two_units = 2 * static_cast<uint64_t>(sizes.largest) * f32;
  using tp::memory::Kind;
  for (bool forward_prefetch : {false, true}) {
    const stage10::Options options{.forward_prefetch = forward_prefetch};
    CAPTURE(describe(config, options));
    for (const tp::train::RankResult& r :
         tp::train::run_ddp<FullyShardedDataParallel>(config, options)) {
      REQUIRE(r.memory.has_value());
      CAPTURE(r.rank);
      // Gathered: the unit computing and the one prefetched (or, in
      // backward, the one whose reduction is in flight): Note [One unit's
      // step] and Note [One reduction in flight].
      CHECK(r.memory->peak_bytes(Kind::Parameter) <= shards + two_units);
      CHECK(r.memory->peak_bytes(Kind::Gradient) <= shards + two_units);
      CHECK(r.memory->live_bytes(Kind::Parameter) == shards);  // nothing left gathered
      CHECK(r.memory->live_bytes(Kind::OptimizerState) == shards);  // momentum: 1/W
    }
  }
  // SHARD_GRAD_OP keeps every unit from its forward to its backward: at the
  // end of forward the whole model is gathered.
  const stage10::Options grad_op{.sharding_strategy = ShardingStrategy::SHARD_GRAD_OP};
  for (const tp::train::RankResult& r :
       tp::train::run_ddp<FullyShardedDataParallel>(config, grad_op)) {
    CHECK(r.memory->peak_bytes(Kind::Parameter) >= 5 * shards);  // shards + the whole model
  }
}

TEST_CASE("a policy that wraps nothing, a unit of two dtypes, and join() are refused by name") {
  const std::vector<std::string> messages = run_ranks(1, [](int, auto group) {
    std::string out;
    try {
      tp::manual_seed(1);
      FullyShardedDataParallel fsdp(
          std::make_shared<tp::nn::MiniMLP>(), group,
          stage10::Options{.auto_wrap_policy = stage10::size_based_auto_wrap_policy(100000)});
    } catch (const tp::Error& e) {
      out += std::string(e.what()) + "\n";
    }
    try {
      auto mixed = std::make_shared<tp::nn::MixedMLP>();
      const tp::nn::Module* fc1 = mixed->fc1.get();
      FullyShardedDataParallel fsdp(
          mixed, group,
          stage10::Options{.auto_wrap_policy = {"fc1 only", [fc1](const tp::nn::Module& m, int,
                                                                    int64_t) { return &m == fc1; }}});
    } catch (const tp::Error& e) {
      out += std::string(e.what()) + "\n";
    }
    FullyShardedDataParallel fsdp(std::make_shared<tp::nn::MiniMLP>(), group);
    try {
      fsdp.join([] {});
    } catch (const tp::Error& e) {
      out += std::string(e.what()) + "\n";
    }
    return out;
  });
  const std::string& out = messages[0];
  CAPTURE(out);
  CHECK(out.find("the auto_wrap_policy 'size >= 100000' made no unit below the root") !=
        std::string::npos);
  CHECK(out.find("unit '' holds fc2.weight (float64 on cpu) and fc3.weight (float32 on cpu)") !=
        std::string::npos);
  CHECK(out.find("PyTorch's FullyShardedDataParallel has no Join") != std::string::npos);
}

TEST_CASE("parameters are readable only while gathered, and summon_full_params writes back") {
  const std::vector<std::string> results = run_ranks(2, [](int rank, auto group) {
    tp::manual_seed(5);
    auto model = std::make_shared<tp::nn::MiniMLP>();
    FullyShardedDataParallel fsdp(model, group);
    std::string out;
    try {
      model->fc2->weight.to_vector();
      out += "read a freed parameter;";
    } catch (const tp::Error& e) {
      if (std::string(e.what()).find("freed") != std::string::npos) out += "refused;";
    }
    {
      auto full = fsdp.summon_full_params();
      tp::NoGradGuard no_grad;
      model->fc2->weight.fill_(0.5);  // every rank, every element
    }
    auto full = fsdp.summon_full_params();
    const std::vector<double> w = model->fc2->weight.to_vector();
    const bool all_half = std::all_of(w.begin(), w.end(), [](double v) { return v == 0.5; });
    out += all_half ? "written back;" : "lost;";
    (void)rank;
    return out;
  });
  for (const std::string& r : results) CHECK(r == "refused;written back;");
}

namespace {

// Trains micro-batches [from, to) of `config`'s plan on this rank: one
// micro-batch per step (K = 1), as the kit's trainer does.
void train_steps(FullyShardedDataParallel& fsdp, tp::optim::SGD& optimizer,
                 const RunConfig& config, int rank, int64_t from, int64_t to) {
  const tp::data::SyntheticRegression dataset(tp::train::data_options(config));
  for (int64_t i = from; i < to; ++i) {
    const tp::data::Batch batch = tp::train::micro_batch(dataset, config, rank, i);
    optimizer.zero_grad();
    tp::mse_loss(fsdp(batch.x), batch.y).backward();
    optimizer.step();
  }
}

// Rank 0's full state dict, every value in hexadecimal (exact), "" elsewhere.
std::string full_values(FullyShardedDataParallel& fsdp) {
  std::ostringstream out;
  out << std::hexfloat;
  for (const auto& [name, t] : stage10::full_state_dict(fsdp)) {
    out << name << ":";
    for (double v : t.to_vector()) out << " " << v;
    out << "\n";
  }
  return out.str();
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A rank's FSDP over the plan's model, and its SGD.
struct Trainee {
  std::shared_ptr<tp::nn::Module> model;
  std::unique_ptr<FullyShardedDataParallel> fsdp;
  std::unique_ptr<tp::optim::SGD> optimizer;
  Trainee(const RunConfig& config, std::shared_ptr<tp::distributed::ProcessGroup> group,
          stage10::Options options = {}) {
    tp::manual_seed(config.model_seed);
    model = tp::train::make_model(config);
    fsdp = std::make_unique<FullyShardedDataParallel>(model, group, options);
    optimizer = std::make_unique<tp::optim::SGD>(
        fsdp->parameters(), tp::optim::SGDOptions{config.lr, config.momentum});
  }
};

}  // namespace

TEST_CASE("a sharded checkpoint of 4 ranks loads on 2 and back on 4, byte for byte") {
  RunConfig config = plan(4, ModelKind::Deep);
  config.deep_depth = 3;  // units of 544, 1056, 1056 and 132 elements: not multiples of 3
  tp::TempDir dir;
  const std::string first = dir.path() + "/w4", second = dir.path() + "/w2",
                    third = dir.path() + "/w4-again";
  const std::string saved = run_ranks(4, [&](int rank, auto group) {
    Trainee t(config, group);
    train_steps(*t.fsdp, *t.optimizer, config, rank, 0, 2);
    stage10::save_sharded_checkpoint(*t.fsdp, *t.optimizer, first, 2);
    return full_values(*t.fsdp);
  })[0];
  RunConfig two = config;
  two.world_size = 2;
  const std::vector<std::string> loaded = run_ranks(2, [&](int, auto group) {
    Trainee t(two, group);
    const int64_t step = stage10::load_sharded_checkpoint(*t.fsdp, *t.optimizer, first);
    stage10::save_sharded_checkpoint(*t.fsdp, *t.optimizer, second, step);
    return std::to_string(step) + "\n" + full_values(*t.fsdp);
  });
  CHECK(loaded[0] == "2\n" + saved);  // the whole model, resharded
  run_ranks(4, [&](int, auto group) {
    Trainee t(config, group);
    stage10::load_sharded_checkpoint(*t.fsdp, *t.optimizer, second);
    stage10::save_sharded_checkpoint(*t.fsdp, *t.optimizer, third, 2);
    return std::string();
  });
  for (int q = 0; q < 4; ++q) {  // shards and momentum, back as they were
    const std::string name = "/step-000002/rank-" + std::to_string(q) + ".bin";
    CAPTURE(name);
    CHECK(file_bytes(first + name).size() > 0);
    CHECK(file_bytes(first + name) == file_bytes(third + name));
  }
}

TEST_CASE("resumed from its checkpoint at the same world size, training goes on bit for bit") {
  RunConfig config = plan(2, ModelKind::Deep);
  config.deep_depth = 3;
  tp::TempDir dir;
  const std::string uninterrupted = run_ranks(2, [&](int rank, auto group) {
    Trainee t(config, group);
    train_steps(*t.fsdp, *t.optimizer, config, rank, 0, 4);
    return full_values(*t.fsdp);
  })[0];
  run_ranks(2, [&](int rank, auto group) {
    Trainee t(config, group);
    train_steps(*t.fsdp, *t.optimizer, config, rank, 0, 2);
    stage10::save_sharded_checkpoint(*t.fsdp, *t.optimizer, dir.path(), 2);
    return std::string();
  });
  const std::string resumed = run_ranks(2, [&](int rank, auto group) {
    Trainee t(config, group);
    const int64_t step = stage10::load_sharded_checkpoint(*t.fsdp, *t.optimizer, dir.path());
    train_steps(*t.fsdp, *t.optimizer, config, rank, step, 4);
    return full_values(*t.fsdp);
  })[0];
  CHECK(uninterrupted.size() > 100);
  CHECK(resumed == uninterrupted);
}

TEST_CASE("a checkpoint for another model or strategy, or an unfinished one, is refused by name") {
  tp::TempDir dir;
  const RunConfig config = plan(2);
  const std::vector<std::string> messages = run_ranks(2, [&](int rank, auto group) {
    std::string out;
    auto refusal = [&](auto&& load) {
      try {
        load();
        out += "loaded;";
      } catch (const tp::Error& e) {
        out += std::string(e.what()) + ";";
      }
    };
    refusal([&] {  // nothing saved yet
      Trainee t(config, group);
      stage10::load_sharded_checkpoint(*t.fsdp, *t.optimizer, dir.path());
    });
    Trainee t(config, group);
    train_steps(*t.fsdp, *t.optimizer, config, rank, 0, 1);
    stage10::save_sharded_checkpoint(*t.fsdp, *t.optimizer, dir.path(), 1);
    refusal([&] {
      RunConfig deep = config;
      deep.model_kind = ModelKind::Deep;
      Trainee other(deep, group);
      stage10::load_sharded_checkpoint(*other.fsdp, *other.optimizer, dir.path());
    });
    refusal([&] {
      Trainee other(config, group, {.sharding_strategy = ShardingStrategy::SHARD_GRAD_OP});
      stage10::load_sharded_checkpoint(*other.fsdp, *other.optimizer, dir.path());
    });
    refusal([&] {
      RunConfig plain = config;
      plain.momentum = 0;
      Trainee other(plain, group);
      stage10::load_sharded_checkpoint(*other.fsdp, *other.optimizer, dir.path());
    });
    // A save that died half way: a later step's folder with one rank's file
    // and no meta.json; `latest` still names step 1.
    if (rank == 0) {
      std::filesystem::create_directories(dir.path() + "/step-000002");
      std::ofstream(dir.path() + "/step-000002/rank-0.bin") << "half";
    }
    group->barrier()->wait();
    refusal([&] {
      Trainee other(config, group);
      const int64_t step = stage10::load_sharded_checkpoint(*other.fsdp, *other.optimizer,
                                                            dir.path());
      out += "step " + std::to_string(step) + ";";
    });
    return out;
  });
  for (const std::string& out : messages) {
    CAPTURE(out);
    CHECK(out.find("holds no complete checkpoint") != std::string::npos);
    CHECK(out.find("was made for another model: the checkpoint has 3 units, this model 7") !=
          std::string::npos);
    CHECK(out.find("was made for sharding strategy full_shard, and this FSDP is shard_grad_op") !=
          std::string::npos);
    CHECK(out.find("this SGD has momentum 0") != std::string::npos);
    CHECK(out.find("step 1;loaded;") != std::string::npos);
  }
}

TEST_CASE("clip_grad_norm_ over shards clips as one process clipping the whole gradient") {
  const RunConfig config = plan(2, ModelKind::Deep);
  const std::vector<std::string> results = run_ranks(2, [&](int rank, auto group) {
    const tp::data::SyntheticRegression dataset(tp::train::data_options(config));
    // The whole model on one process: both ranks' micro-batches, each loss / W.
    tp::manual_seed(config.model_seed);
    std::shared_ptr<tp::nn::Module> whole = tp::train::make_model(config);
    for (int r = 0; r < 2; ++r) {
      const tp::data::Batch batch = tp::train::micro_batch(dataset, config, r, 0);
      tp::mul(tp::mse_loss((*whole)(batch.x), batch.y), 0.5).backward();
    }
    double sum_sq = 0;
    for (const tp::Tensor& p : whole->parameters()) sum_sq += p.grad().norm() * p.grad().norm();
    const double norm = std::sqrt(sum_sq);
    const double max_norm = norm / 4;  // so it clips
    Trainee t(config, group);
    const tp::data::Batch batch = tp::train::micro_batch(dataset, config, rank, 0);
    tp::mse_loss((*t.fsdp)(batch.x), batch.y).backward();
    const double total = t.fsdp->clip_grad_norm_(max_norm);
    std::string out;
    if (std::abs(total - norm) > 1e-6 * norm) out += "norm " + std::to_string(total) + ";";
    // Each shard's gradient against the clipped whole gradient's slice.
    std::map<std::string, tp::Tensor> grads;
    for (const auto& [name, p] : whole->named_parameters()) grads[name] = p.grad();
    const double coefficient = max_norm / (norm + 1e-6);
    for (const auto& unit : t.fsdp->units()) {
      std::vector<double> flat;
      for (const stage10::ParamSlot& slot : unit->slots()) {
        for (double v : grads.at(slot.name).to_vector()) flat.push_back(v * coefficient);
      }
      flat.resize(static_cast<size_t>(unit->padded_numel()), 0.0);
      const std::vector<double> shard = unit->local_shard().grad().to_vector();
      for (int64_t i = 0; i < unit->shard_numel(); ++i) {
        const double want = flat[static_cast<size_t>(unit->shard_offset(rank) + i)];
        if (std::abs(shard[static_cast<size_t>(i)] - want) > 1e-6) {
          out += unit->unit() + " element " + std::to_string(i) + ";";
          break;
        }
      }
    }
    return out;
  });
  for (const std::string& r : results) CHECK(r == "");
}
