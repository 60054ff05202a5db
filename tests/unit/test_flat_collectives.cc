// The flat collectives ZeRO shards with, reduce_scatter_tensor and
// allgather_into_tensor, over Gloo: closed-form values at world sizes 1 to
// 4 with equal and uneven blocks (an empty one among them), in place, with
// futures; then what every collective owes its caller: counters, trace
// spans, a bad call refused at the call, ranks that disagree on the blocks
// named (debug mode) or timed out in that very collective (the tag), a
// skipped call timed out naming the collective and the rank, and checker
// mode's writes in flight.
//
// Children check with expect_values(), which throws; spawn rethrows in the
// parent with the rank and the message.
#include <doctest/doctest.h>

#include "test_util.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tensorplay/distributed/init.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/tensor.h"
#include "tensorplay/trace.h"
#include "tensorplay/util/temp_dir.h"

namespace dist = tp::distributed;
namespace mp = tp::multiprocessing;
using std::chrono::milliseconds;
using test_util::kCollectiveTimeout;
using test_util::kShortTimeout;
using test_util::run_world;
using test_util::spawn_error_of;

namespace {

// doctest's Contains takes a C string; the messages below are built.
doctest::Contains Contains(const std::string& text) { return doctest::Contains(text.c_str()); }

// Exact comparison: every expected value below is an integer below 2048
// (exact in float16) or, for the all-gathers, below 256 (exact in bfloat16),
// and so is every partial sum.
using test_util::expect_values;

// Uneven blocks with an empty one: block r has 2r + 3 elements, but block 1
// has none: (3) at W = 1, (3, 0) at W = 2, (3, 0, 7) at 3, (3, 0, 7, 9) at 4.
std::vector<int64_t> uneven(int world) {
  std::vector<int64_t> sizes;
  for (int r = 0; r < world; ++r) sizes.push_back(r == 1 ? 0 : 2 * r + 3);
  return sizes;
}

// The block sizes a call resolves `split_sizes` to: 4 per rank when empty.
std::vector<int64_t> resolved(const std::vector<int64_t>& split_sizes, int world) {
  return split_sizes.empty() ? std::vector<int64_t>(world, 4) : split_sizes;
}

int64_t offset_of(const std::vector<int64_t>& sizes, int rank) {
  int64_t at = 0;
  for (int r = 0; r < rank; ++r) at += sizes[r];
  return at;
}

int64_t total_of(const std::vector<int64_t>& sizes) { return offset_of(sizes, sizes.size()); }

// Rank q's reduce-scatter input: element e is q * 100 + e.
tp::Tensor rs_input(int rank, int64_t n, tp::Dtype dtype) {
  std::vector<double> v;
  for (int64_t e = 0; e < n; ++e) v.push_back(rank * 100.0 + e);
  return tp::tensor(v, {n}, dtype);
}

// Element i of rank r's block reduced over W ranks (e = offset_r + i):
// SUM 100 W (W - 1) / 2 + W e, AVG that over W, MIN e (rank 0's), MAX
// 100 (W - 1) + e (the last rank's).
std::vector<double> rs_expected(dist::ReduceOp op, int world, int64_t offset, int64_t n) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(offset + i);
    const double sum = 100.0 * world * (world - 1) / 2 + world * e;
    switch (op) {
      case dist::ReduceOp::SUM: v.push_back(sum); break;
      case dist::ReduceOp::AVG: v.push_back(sum / world); break;
      case dist::ReduceOp::MIN: v.push_back(e); break;
      case dist::ReduceOp::MAX: v.push_back(100.0 * (world - 1) + e); break;
    }
  }
  return v;
}

// Rank r's all-gather input: element i is r * 10 + i (below 256: every
// dtype holds it exactly, bfloat16 included).
std::vector<double> ag_block(int rank, int64_t n) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(rank * 10.0 + i);
  return v;
}

std::vector<double> ag_expected(const std::vector<int64_t>& sizes) {
  std::vector<double> v;
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    for (double x : ag_block(static_cast<int>(r), sizes[r])) v.push_back(x);
  }
  return v;
}

std::string sizes_name(const std::vector<int64_t>& split_sizes) {
  if (split_sizes.empty()) return "equal blocks";
  std::string out = "blocks (";
  for (std::size_t r = 0; r < split_sizes.size(); ++r) {
    out += (r ? ", " : "") + std::to_string(split_sizes[r]);
  }
  return out + ")";
}

// One reduce-scatter on the default group, checked against rs_expected.
void check_reduce_scatter(int rank, int world, const std::vector<int64_t>& split_sizes,
                          dist::ReduceOp op, tp::Dtype dtype) {
  const std::vector<int64_t> sizes = resolved(split_sizes, world);
  const tp::Tensor input = rs_input(rank, total_of(sizes), dtype);
  tp::Tensor output = tp::full({sizes[rank]}, -1, dtype);
  dist::reduce_scatter_tensor(output, input, split_sizes, op);
  const std::string what = "reduce_scatter_tensor " + dist::to_string(op) + " " +
                           tp::to_string(dtype) + " in " + sizes_name(split_sizes);
  expect_values(output, rs_expected(op, world, offset_of(sizes, rank), sizes[rank]), what);
  expect_values(input, rs_input(rank, total_of(sizes), tp::kFloat64).to_vector(),
                what + ": the input, only read");
}

const tp::Dtype kAllDtypes[] = {tp::kFloat32, tp::kFloat64, tp::kFloat16, tp::kBFloat16};

}  // namespace

// ---- values, at world sizes 1 to 4 ---------------------------------------------

TEST_CASE("reduce_scatter_tensor SUM gives rank r block r summed over the ranks, at world "
          "sizes 1 to 4, with equal and uneven blocks") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    CHECK_NOTHROW(run_world(world, [](int rank, int w) {
      for (tp::Dtype dtype : {tp::kFloat32, tp::kFloat64, tp::kFloat16}) {
        check_reduce_scatter(rank, w, {}, dist::ReduceOp::SUM, dtype);
        check_reduce_scatter(rank, w, uneven(w), dist::ReduceOp::SUM, dtype);
      }
    }));
  }
}

TEST_CASE("reduce_scatter_tensor AVG, MIN and MAX give their closed forms at world sizes 1 to 4") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    CHECK_NOTHROW(run_world(world, [](int rank, int w) {
      for (dist::ReduceOp op : {dist::ReduceOp::AVG, dist::ReduceOp::MIN, dist::ReduceOp::MAX}) {
        check_reduce_scatter(rank, w, uneven(w), op, tp::kFloat64);
        check_reduce_scatter(rank, w, {}, op, tp::kFloat32);
      }
    }));
  }
}

TEST_CASE("allgather_into_tensor puts rank r's input at block r of every rank's output, at "
          "world sizes 1 to 4, in every dtype, with equal and uneven blocks") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    CHECK_NOTHROW(run_world(world, [](int rank, int w) {
      for (tp::Dtype dtype : kAllDtypes) {
        for (const std::vector<int64_t>& split_sizes : {std::vector<int64_t>{}, uneven(w)}) {
          const std::vector<int64_t> sizes = resolved(split_sizes, w);
          const tp::Tensor input = tp::tensor(ag_block(rank, sizes[rank]), {sizes[rank]}, dtype);
          tp::Tensor output = tp::full({total_of(sizes)}, -1, dtype);
          dist::all_gather_into_tensor(output, input, split_sizes);
          expect_values(output, ag_expected(sizes),
                        "allgather_into_tensor " + tp::to_string(dtype) + " in " +
                            sizes_name(split_sizes));
        }
      }
    }));
  }
}

TEST_CASE("a 2 MiB reduce-scatter and all-gather in uneven blocks at world size 3") {
  // Blocks of 2^18 - 1, 0 and 2^18 + 1 float32 elements: megabyte messages
  // that Gloo's TCP transport sends in many reads and writes.
  CHECK_NOTHROW(run_world(3, [](int rank, int w) {
    const std::vector<int64_t> sizes{(1 << 18) - 1, 0, (1 << 18) + 1};
    const int64_t total = total_of(sizes);
    tp::Tensor output = tp::zeros({sizes[rank]});
    dist::reduce_scatter_tensor(output, tp::full({total}, rank + 1.0), sizes);
    for (double v : output.to_vector()) {
      if (v != w * (w + 1) / 2.0) throw tp::Error("reduce-scatter: " + std::to_string(v));
    }
    tp::Tensor gathered = tp::zeros({total});
    dist::all_gather_into_tensor(gathered, tp::full({sizes[rank]}, rank + 1.0), sizes);
    const std::vector<double> got = gathered.to_vector();
    for (int r = 0; r < w; ++r) {
      for (int64_t i = offset_of(sizes, r); i < offset_of(sizes, r + 1); ++i) {
        if (got[i] != r + 1.0) throw tp::Error("all-gather element " + std::to_string(i));
      }
    }
  }));
}

TEST_CASE("in place, the block being a view of the flat tensor, both collectives give the same "
          "values") {
  // ZeRO keeps one flat buffer and hands each rank a view of its shard.
  CHECK_NOTHROW(run_world(3, [](int rank, int w) {
    const std::vector<int64_t> sizes = uneven(w);
    const int64_t offset = offset_of(sizes, rank);
    tp::Tensor flat = rs_input(rank, total_of(sizes), tp::kFloat32);
    dist::reduce_scatter_tensor(flat.narrow(0, offset, sizes[rank]), flat, sizes);
    expect_values(flat.narrow(0, offset, sizes[rank]),
                  rs_expected(dist::ReduceOp::SUM, w, offset, sizes[rank]),
                  "in-place reduce_scatter_tensor");
    tp::Tensor gathered = tp::full({total_of(sizes)}, -1);
    gathered.narrow(0, offset, sizes[rank]).copy_(tp::tensor(ag_block(rank, sizes[rank]),
                                                             {sizes[rank]}));
    dist::all_gather_into_tensor(gathered, gathered.narrow(0, offset, sizes[rank]), sizes);
    expect_values(gathered, ag_expected(sizes), "in-place allgather_into_tensor");
  }));
}

TEST_CASE("the flat collectives are asynchronous, and their futures hold their output") {
  CHECK_NOTHROW(run_world(2, [](int rank, int w) {
    const std::vector<int64_t> sizes = uneven(w);  // (3, 0)
    const tp::Tensor input = rs_input(rank, 3, tp::kFloat64);
    tp::Tensor shard = tp::zeros({sizes[rank]}, tp::kFloat64);
    tp::Tensor gathered = tp::zeros({3}, tp::kFloat64);
    auto rs = dist::reduce_scatter_tensor(shard, input, sizes, dist::ReduceOp::SUM, true);
    auto ag = dist::all_gather_into_tensor(gathered, tp::tensor(ag_block(rank, sizes[rank]),
                                                                {sizes[rank]}, tp::kFloat64),
                                           sizes, true);
    if (rs->collective() != "reduce_scatter_tensor" || rs->seq() != 1 ||
        ag->collective() != "allgather_into_tensor" || ag->seq() != 2) {
      throw tp::Error("the works are not reduce_scatter_tensor #1 and allgather_into_tensor #2");
    }
    // The chained future doubles the output, on the communication thread.
    auto doubled = rs->get_future()->then([](dist::Future& parent) {
      tp::Tensor out = parent.value()[0];
      out.mul_(2.0);
      return dist::Future::Value{out};
    });
    const dist::Future::Value value = doubled->wait();
    std::vector<double> twice = rs_expected(dist::ReduceOp::SUM, w, 0, sizes[rank]);
    for (double& x : twice) x *= 2;
    expect_values(value.at(0), twice, "the reduce-scatter's future, doubled");
    const dist::Future::Value gathered_value = ag->get_future()->wait();
    if (!gathered_value.at(0).is_alias_of(gathered)) {
      throw tp::Error("the all-gather's future must hold its output tensor");
    }
    expect_values(gathered, ag_expected(sizes), "the all-gather, through its future");
  }));
}

// ---- counters and trace ----------------------------------------------------------

TEST_CASE("counters count the flat collectives and the bytes of their flat tensors") {
  CHECK_NOTHROW(run_world(1, [](int, int) {
    dist::ProcessGroup& group = *dist::default_group();
    group.reset_counters();
    dist::reduce_scatter_tensor(tp::zeros({6}), tp::ones({6}));                         // 24 B
    dist::reduce_scatter_tensor(tp::zeros({5}, tp::kFloat16), tp::ones({5}, tp::kFloat16));  // 10
    dist::all_gather_into_tensor(tp::zeros({4}, tp::kFloat64), tp::ones({4}, tp::kFloat64));  // 32
    dist::all_gather({tp::zeros({3})}, tp::ones({3}));  // the list all-gather: 12 bytes
    const dist::CollectiveCounters& c = group.counters();
    TP_CHECK_EQ(c.reduce_scatter, 2u, "reduce_scatter count");
    TP_CHECK_EQ(c.reduce_scatter_bytes, 34u, "24 + 10 bytes reduce-scattered");
    TP_CHECK_EQ(c.allgather, 2u, "allgather count: both forms");
    TP_CHECK_EQ(c.allgather_bytes, 44u, "32 + 12 bytes gathered");
    TP_CHECK_EQ(c.allreduce, 0u, "no all-reduce");
    group.reset_counters();
    TP_CHECK_EQ(group.counters().reduce_scatter_bytes, 0u, "after reset");
  }));
}

TEST_CASE("trace records a queued instant and a comm span for each flat collective") {
  CHECK_NOTHROW(run_world(2, [](int rank, int) {
    tp::trace::enable(rank);
    dist::reduce_scatter_tensor(tp::zeros({2}), tp::ones({4}));
    dist::all_gather_into_tensor(tp::zeros({4}), tp::ones({2}));
    tp::trace::disable();
    for (const auto& [op, seq] : {std::pair<std::string, int64_t>{"reduce_scatter_tensor", 1},
                                  std::pair<std::string, int64_t>{"allgather_into_tensor", 2}}) {
      bool queued = false;
      bool span = false;
      for (const tp::trace::Event& ev : tp::trace::events()) {
        if (ev.args.empty() || ev.args[0].first != "seq" || ev.args[0].second != seq) continue;
        queued = queued || (ev.phase == 'i' && ev.name == op + " queued");
        span = span || (ev.phase == 'X' && ev.name == op && ev.category == "comm");
      }
      if (!queued || !span) throw tp::Error("missing trace events for " + op);
    }
  }));
}

// ---- a bad call is refused at the call ---------------------------------------

// One rank is enough to see every message: the checks run on the calling
// thread before anything is queued. The group lives in this process only for
// the test case (it is destroyed before any later case forks).
TEST_CASE("the flat collectives refuse bad arguments at the call, naming the collective, the "
          "rank and the fix") {
  tp::TempDir dir("tp-flat-bad");
  dist::ProcessGroupGloo group(dir.path(), 0, 1, dist::GlooOptions{kCollectiveTimeout});
  const std::string rs = "tp::distributed::ProcessGroupGloo::reduce_scatter_tensor: rank 0: ";
  const std::string ag = "tp::distributed::ProcessGroupGloo::allgather_into_tensor: rank 0: ";
  CHECK_THROWS_WITH_AS(group.reduce_scatter_tensor(tp::zeros({4}, tp::kFloat64), tp::zeros({4})),
                       Contains(rs + "the input has dtype float32 but the output has dtype "
                                "float64; the blocks are moved as they are, so pass tensors of "
                                "one dtype"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(group.reduce_scatter_tensor(tp::zeros({4}), tp::zeros({4}), {2, 2}),
                       Contains(rs + "split_sizes (2, 2) has 2 entries for world size 1; pass "
                                "one block size per rank (or none, for an even split)"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(group.allgather_into_tensor(tp::zeros({0}), tp::zeros({0}), {-1}),
                       Contains(ag + "split_sizes[0] is -1; a block size is a number of "
                                "elements, 0 or more"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(group.reduce_scatter_tensor(tp::zeros({3}), tp::zeros({4}), {3}),
                       Contains(rs + "split_sizes (3) add up to 3 elements but the input has 4; "
                                "the input holds every rank's block, one after another"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(group.allgather_into_tensor(tp::zeros({4}), tp::zeros({3})),
                       Contains(ag + "the input has 3 elements but this rank's block has 4 "
                                "(split sizes (4)); rank 0's input is block 0 of the output"),
                       tp::DistributedError);
  tp::Tensor flat = tp::zeros({6});
  CHECK_THROWS_WITH_AS(group.allgather_into_tensor(flat.narrow(0, 0, 5), flat.narrow(0, 1, 5)),
                       Contains(ag + "the input overlaps the output but is not block 0 of it"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(group.reduce_scatter_tensor(flat.narrow(0, 1, 5), flat.narrow(0, 0, 5)),
                       Contains(rs + "the output overlaps the input but is not block 0 of it; "
                                "pass separate tensors, or block 0 of the input itself (in "
                                "place)"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(group.reduce_scatter_tensor(tp::zeros({2}, tp::kBFloat16),
                                                   tp::zeros({2}, tp::kBFloat16)),
                       Contains(rs + "the input has dtype bfloat16, and Gloo has no bfloat16 "
                                "reduction"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(group.reduce_scatter_tensor(tp::Tensor(), tp::zeros({2})),
                       Contains(rs + "the output is undefined"), tp::DistributedError);
  CHECK_THROWS_WITH_AS(group.allgather_into_tensor(tp::zeros({2, 3}).t(), tp::zeros({6})),
                       Contains(ag + "the output is not contiguous"), tp::DistributedError);
  // None of them was queued: the counters saw nothing.
  CHECK(group.counters().reduce_scatter == 0);
  CHECK(group.counters().allgather == 0);
}

TEST_CASE("an even split needs a flat tensor that the world size divides") {
  CHECK_THROWS_WITH_AS(run_world(2, [](int rank, int) {
                         if (rank == 0) dist::reduce_scatter_tensor(tp::zeros({2}), tp::zeros({5}));
                       }),
                       Contains("reduce_scatter_tensor: rank 0: the input has 5 elements, which "
                                "world size 2 does not divide into equal blocks; pass "
                                "split_sizes, one block size per rank, for an uneven split"),
                       mp::SpawnError);
}

TEST_CASE("a process group without the flat collectives says so when one is called") {
  struct Bare : dist::ProcessGroup {
    Bare() : ProcessGroup(1, 2) {}
    std::string backend_name() const override { return "bare"; }
    milliseconds timeout() const override { return milliseconds(1000); }
    std::shared_ptr<dist::Work> allreduce(const tp::Tensor&, dist::ReduceOp) override {
      return nullptr;
    }
    std::shared_ptr<dist::Work> broadcast(const tp::Tensor&, int) override { return nullptr; }
    std::shared_ptr<dist::Work> allgather(const std::vector<tp::Tensor>&,
                                          const tp::Tensor&) override {
      return nullptr;
    }
    std::shared_ptr<dist::Work> barrier() override { return nullptr; }
  } bare;
  CHECK_THROWS_WITH_AS(bare.reduce_scatter_tensor(tp::zeros({1}), tp::zeros({2})),
                       "tp::distributed::ProcessGroup::reduce_scatter_tensor: rank 1: the 'bare' "
                       "process group does not implement it; use backend \"gloo\" or \"nccl\"",
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(bare.allgather_into_tensor(tp::zeros({2}), tp::zeros({1})),
                       Contains("ProcessGroup::allgather_into_tensor: rank 1: the 'bare' process "
                                "group does not implement it"),
                       tp::DistributedError);
}

// ---- when ranks disagree or one is missing ---------------------------------------

// Rank 0 splits 8 elements (3, 5), rank 1 (4, 4): each call is right for its
// own rank, and together they are wrong.
void disagree_on_blocks(dist::ProcessGroup& group, int rank, bool reduce) {
  const std::vector<int64_t> sizes = rank == 0 ? std::vector<int64_t>{3, 5}
                                               : std::vector<int64_t>{4, 4};
  if (reduce) {
    group.reduce_scatter_tensor(tp::zeros({sizes[rank]}), tp::ones({8}), sizes)->wait();
  } else {
    group.allgather_into_tensor(tp::zeros({8}), tp::ones({sizes[rank]}), sizes)->wait();
  }
}

TEST_CASE("with check_collectives, ranks that split differently are told both splits") {
  for (bool reduce : {true, false}) {
    CAPTURE(reduce);
    tp::TempDir dir("tp-flat-fingerprint");
    const std::string path = dir.path();
    const mp::SpawnError e = spawn_error_of([&] {
      mp::spawn(
          [&](int rank) {
            dist::GlooOptions options{kCollectiveTimeout};
            options.check_collectives = true;
            dist::ProcessGroupGloo group(path, rank, 2, options);
            disagree_on_blocks(group, rank, reduce);
          },
          2);
    });
    const std::string expected =
        reduce ? "rank 0 called reduce_scatter_tensor SUM of 8 float32 elements in blocks (3, 5) "
                 "as its collective #1; rank 1 called reduce_scatter_tensor SUM of 8 float32 "
                 "elements in blocks (4, 4) as its collective #1"
               : "rank 0 called allgather_into_tensor of 8 float32 elements in blocks (3, 5) as "
                 "its collective #1; rank 1 called allgather_into_tensor of 8 float32 elements "
                 "in blocks (4, 4) as its collective #1";
    CHECK_MESSAGE(std::string(e.what()).find(expected) != std::string::npos, e.what());
  }
}

TEST_CASE("without debug mode, ranks that split differently fail in that collective, not later") {
  // The block sizes are in Gloo's tag (Note [Gloo tags]): the two calls never
  // pair up, so neither rank returns a wrong block.
  for (bool reduce : {true, false}) {
    CAPTURE(reduce);
    const std::string name = reduce ? "reduce_scatter_tensor" : "allgather_into_tensor";
    CHECK_THROWS_WITH_AS(run_world(
                             2,
                             [reduce](int rank, int) {
                               disagree_on_blocks(*dist::default_group(), rank, reduce);
                             },
                             kShortTimeout),
                         Contains("tp::TimeoutError: " + name + " #1 on rank"), mp::SpawnError);
  }
}

TEST_CASE("a rank that skips a flat collective makes the other time out naming it and the rank") {
  for (bool reduce : {true, false}) {
    CAPTURE(reduce);
    const std::string name = reduce ? "reduce_scatter_tensor" : "allgather_into_tensor";
    auto job = [reduce] {
      run_world(
          2,
          [reduce](int rank, int) {
            if (rank == 1) {  // skips the collective and stays alive
              std::this_thread::sleep_for(std::chrono::seconds(60));
              return;
            }
            if (reduce) {
              dist::reduce_scatter_tensor(tp::zeros({2}), tp::ones({4}));
            } else {
              dist::all_gather_into_tensor(tp::zeros({4}), tp::ones({2}));
            }
          },
          kShortTimeout);
    };
    CHECK_THROWS_WITH_AS(job(),
                         Contains("rank 0 failed: tp::TimeoutError: " + name + " #1 on rank 0 "
                                  "timed out after 4000 ms: another rank did not join this "
                                  "collective"),
                         mp::SpawnError);
  }
}

// ---- checker mode: the tensors belong to the collective until wait() ---------------

TEST_CASE("in checker mode, a flat collective's input or output written before wait() is an "
          "error there, and a tensor left alone gets the result") {
  tp::TempDir dir("tp-flat-in-flight");
  const std::string path = dir.path();
  CHECK_NOTHROW(mp::spawn(
      [&path](int rank) {
        dist::ProcessGroupGloo group(path, rank, 2, dist::GlooOptions{kCollectiveTimeout, true});
        const std::string r = std::to_string(rank);
        const auto wait_error = [](const std::shared_ptr<dist::Work>& work) {
          try {
            work->wait();
          } catch (const tp::DistributedError& e) {
            return std::string(e.what());
          }
          return std::string();
        };
        const auto expect_in = [](const std::string& error, const std::string& phrase) {
          if (error.find(phrase) == std::string::npos) {
            throw tp::Error("expected \"" + phrase + "\" in the error, got: \"" + error + "\"");
          }
        };
        // Gradients zeroed before the reduce-scatter's wait: the bug of ZeRO's.
        tp::Tensor grads = tp::full({4}, rank + 1.0);
        tp::Tensor shard = tp::zeros({2});
        auto rs = group.reduce_scatter_tensor(shard, grads);
        grads.zero_();
        expect_in(wait_error(rs), "reduce_scatter_tensor #1 on rank " + r + ": its input "
                  "(shape (4), float32) was written while its reduce_scatter_tensor was in "
                  "flight: wait() before touching it. Between the call that issued it and "
                  "wait(), element 0 (" + std::to_string(rank + 1) + " when issued, 0 at "
                  "wait()) changed; the collective reads the tensor until wait() returns");
        // The gathered parameters written before the all-gather's wait.
        tp::Tensor params = tp::zeros({4});
        auto ag = group.allgather_into_tensor(params, tp::full({2}, rank + 1.0));
        params.fill_(5.0);
        expect_in(wait_error(ag), "allgather_into_tensor #2 on rank " + r + ": its output "
                  "(shape (4), float32) was written while its allgather_into_tensor was in "
                  "flight");
        // Left alone: the result lands at wait(), in place too.
        tp::Tensor flat = tp::full({4}, rank + 1.0);
        group.reduce_scatter_tensor(flat.narrow(0, 2 * rank, 2), flat)->wait();
        expect_values(flat.narrow(0, 2 * rank, 2), {3.0, 3.0}, "in-place reduce-scatter");
        // A tensor another collective still owns is refused at the call.
        tp::Tensor out = tp::zeros({4});
        auto first = group.allgather_into_tensor(out, tp::full({2}, rank + 1.0));
        std::string refused;
        try {
          group.allreduce(out);
        } catch (const tp::DistributedError& e) {
          refused = e.what();
        }
        expect_in(refused, "allreduce #5 on rank " + r + " was issued on a tensor (shape (4), "
                  "float32) whose memory allgather_into_tensor #4 on rank " + r + " (shape (4), "
                  "float32) still owns");
        first->wait();
        expect_values(out, {1.0, 1.0, 2.0, 2.0}, "the all-gather's result, at its wait()");
      },
      2));
}
