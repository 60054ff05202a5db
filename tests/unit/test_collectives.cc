// tp::distributed over Gloo: every collective at world sizes 1 to 4, each
// world a set of real processes (spawn) meeting in a fresh file:// directory;
// then the failures a student will meet (a skipped collective, a rank that
// leaves early, bad input), each with the message that says what to fix.
//
// Children cannot use doctest macros (doctest's state lives in the parent);
// they check with expect_values(), which throws, and spawn rethrows in the
// parent with the rank and the message.
#include <doctest/doctest.h>

#include "test_util.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tensorplay/cuda/runtime.h"
#include "tensorplay/distributed/future.h"
#include "tensorplay/distributed/init.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/error.h"
#include "tensorplay/memory.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/tensor.h"
#include "tensorplay/trace.h"
#include "tensorplay/util/temp_dir.h"

namespace dist = tp::distributed;
namespace mp = tp::multiprocessing;
using doctest::Contains;
using std::chrono::milliseconds;

namespace {

// Exact comparison: every expected value below is a small integer or a
// half, exactly representable in float32, and sums of such values are exact.
using test_util::expect_values;

const tp::Dtype kDtypes[] = {tp::kFloat32, tp::kFloat64};
// Broadcast and allgather move bytes, so they take the 16-bit dtypes too
// (the values below are exact in bfloat16's 8 significant bits).
const tp::Dtype kAllDtypes[] = {tp::kFloat32, tp::kFloat64, tp::kFloat16, tp::kBFloat16};

// Rank r's contribution to the reductions: element i is (r + 1) * (i + 1).
tp::Tensor contribution(int rank, tp::Dtype dtype) {
  std::vector<double> v;
  for (int i = 0; i < 5; ++i) v.push_back((rank + 1) * (i + 1));
  return tp::tensor(v, {5}, dtype);
}

std::vector<double> times_1_to_5(double x) {
  std::vector<double> v;
  for (int i = 0; i < 5; ++i) v.push_back(x * (i + 1));
  return v;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

using test_util::kCollectiveTimeout;
using test_util::kShortTimeout;
using test_util::run_world;
using test_util::spawn_error_of;

}  // namespace

// ---- each collective, at world sizes 1, 2, 3 and 4 ----------------------------

TEST_CASE("allreduce SUM of r+1 over W ranks gives W(W+1)/2 at world sizes 1 to 4") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    CHECK_NOTHROW(run_world(world, [](int rank, int w) {
      for (tp::Dtype dtype : kDtypes) {
        tp::Tensor t = contribution(rank, dtype);
        dist::all_reduce(t, dist::ReduceOp::SUM);
        expect_values(t, times_1_to_5(w * (w + 1) / 2.0), "SUM " + tp::to_string(dtype));
      }
    }));
  }
}

TEST_CASE("allreduce AVG, MIN and MAX of r+1 give (W+1)/2, 1 and W at world sizes 1 to 4") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    CHECK_NOTHROW(run_world(world, [](int rank, int w) {
      for (tp::Dtype dtype : kDtypes) {
        const std::string name = tp::to_string(dtype);
        tp::Tensor avg = contribution(rank, dtype);
        dist::all_reduce(avg, dist::ReduceOp::AVG);
        expect_values(avg, times_1_to_5((w + 1) / 2.0), "AVG " + name);
        tp::Tensor lo = contribution(rank, dtype);
        dist::all_reduce(lo, dist::ReduceOp::MIN);
        expect_values(lo, times_1_to_5(1), "MIN " + name);
        tp::Tensor hi = contribution(rank, dtype);
        dist::all_reduce(hi, dist::ReduceOp::MAX);
        expect_values(hi, times_1_to_5(w), "MAX " + name);
      }
    }));
  }
}

TEST_CASE("allreduce sums a 2 MiB tensor that Gloo splits into many segments") {
  // Gloo's ring cuts messages into segments of at most 1 MiB; 512 Ki floats
  // per rank exercise several segments per rank.
  for (int world : {3, 4}) {
    CAPTURE(world);
    CHECK_NOTHROW(run_world(world, [](int rank, int w) {
      tp::Tensor t = tp::full({1 << 19}, rank + 1);
      dist::all_reduce(t);
      const std::vector<double> got = t.to_vector();
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (got[i] != w * (w + 1) / 2.0) {
          throw tp::Error("element " + std::to_string(i) + " is " + std::to_string(got[i]));
        }
      }
    }));
  }
}

TEST_CASE("broadcast from the last rank copies its tensor to every rank at world sizes 1 to 4, "
          "in every dtype") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    CHECK_NOTHROW(run_world(world, [](int rank, int w) {
      const int root = w - 1;  // a non-zero root whenever w > 1
      for (tp::Dtype dtype : kAllDtypes) {
        tp::Tensor t = rank == root ? tp::tensor({42, 43, 44, 45, 46, 47}, {2, 3}, dtype)
                                    : tp::full({2, 3}, -1, dtype);
        dist::broadcast(t, root);
        expect_values(t, {42, 43, 44, 45, 46, 47}, "broadcast " + tp::to_string(dtype));
      }
    }));
  }
}

TEST_CASE("allgather gives every rank each rank's tensor in rank order at world sizes 1 to 4, "
          "in every dtype") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    CHECK_NOTHROW(run_world(world, [](int rank, int w) {
      for (tp::Dtype dtype : kAllDtypes) {
        const tp::Tensor input = tp::tensor({1.0 * rank, rank + 0.5, 10.0 * rank}, {3}, dtype);
        std::vector<tp::Tensor> outputs;
        for (int r = 0; r < w; ++r) outputs.push_back(tp::zeros({3}, dtype));
        dist::all_gather(outputs, input);
        for (int r = 0; r < w; ++r) {
          expect_values(outputs[r], {1.0 * r, r + 0.5, 10.0 * r},
                        "allgather outputs[" + std::to_string(r) + "]");
        }
        expect_values(input, {1.0 * rank, rank + 0.5, 10.0 * rank}, "allgather input");
      }
    }));
  }
}

TEST_CASE("barrier returns on a rank only after every rank has entered it, at world sizes 1 to 4") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    tp::TempDir flags("tp-barrier");
    const std::string dir = flags.path();
    CHECK_NOTHROW(run_world(world, [&dir](int rank, int w) {
      // The last rank arrives late, so a barrier that returned early would
      // find its flag missing.
      if (rank == w - 1) std::this_thread::sleep_for(milliseconds(200));
      std::ofstream(dir + "/entered-" + std::to_string(rank)).put('x');
      dist::barrier();
      for (int r = 0; r < w; ++r) {
        if (::access((dir + "/entered-" + std::to_string(r)).c_str(), F_OK) != 0) {
          throw tp::Error("barrier returned before rank " + std::to_string(r) + " entered it");
        }
      }
    }));
  }
}

// ---- asynchronous use ------------------------------------------------------------

TEST_CASE("fifty async allreduces complete in issue order with correct sums") {
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    CHECK_NOTHROW(run_world(world, [](int rank, int w) {
      constexpr int kCount = 50;
      std::vector<tp::Tensor> tensors;
      std::vector<std::shared_ptr<dist::Work>> works;
      for (int k = 0; k < kCount; ++k) {
        tensors.push_back(tp::full({4}, (rank + 1) * (k + 1)));
        works.push_back(dist::all_reduce(tensors.back(), dist::ReduceOp::SUM, true));
        if (works.back()->seq() != static_cast<uint64_t>(k + 1)) {
          throw tp::Error("work " + std::to_string(k) + " has seq " +
                          std::to_string(works.back()->seq()));
        }
      }
      // The completed works must always form a prefix of the issue order.
      // Read from the last to the first: once a later work is seen complete,
      // every earlier one must already be.
      while (!works.back()->is_completed()) {
        bool later_done = false;
        for (int k = kCount - 1; k >= 0; --k) {
          const bool done = works[k]->is_completed();
          if (later_done && !done) {
            throw tp::Error("allreduce #" + std::to_string(k + 1) +
                            " is still running after a later one completed");
          }
          later_done = later_done || done;
        }
        std::this_thread::yield();  // leave the cores to the comm threads
      }
      for (int k = 0; k < kCount; ++k) {
        works[k]->wait();
        expect_values(tensors[k], std::vector<double>(4, (k + 1) * w * (w + 1) / 2.0),
                      "async allreduce #" + std::to_string(k + 1));
      }
    }));
  }
}

TEST_CASE("the synchronous free functions return their completed Work, so ->wait() is safe") {
  CHECK_NOTHROW(run_world(2, [](int rank, int w) {
    // What dist::f(...) returns without async_op: a Work that is already
    // complete, with the collective's name and sequence number.
    const auto expect_done = [](const std::shared_ptr<dist::Work>& work, const char* collective,
                                uint64_t seq) {
      if (work == nullptr) throw tp::Error(std::string(collective) + " returned nullptr");
      if (!work->is_completed() || work->collective() != collective || work->seq() != seq) {
        throw tp::Error(std::string(collective) + " returned an unfinished or wrong Work");
      }
      work->wait();  // returns at once
    };
    tp::Tensor t = tp::ones({3});
    expect_done(dist::all_reduce(t), "allreduce", 1);
    dist::all_reduce(t)->wait();  // the natural spelling: allreduce #2
    expect_values(t, {4, 4, 4}, "two allreduces of ones");
    expect_done(dist::broadcast(t, 1), "broadcast", 3);
    const std::vector<tp::Tensor> outputs{tp::zeros({3}), tp::zeros({3})};
    expect_done(dist::all_gather(outputs, tp::full({3}, rank)), "allgather", 4);
    expect_values(outputs[w - 1], {1, 1, 1}, "allgather from the last rank");
    expect_done(dist::barrier(), "barrier", 5);
  }));
}

TEST_CASE("synchronize() returns once every collective has run and dropped its tensors, one "
          "nobody waited for included") {
  CHECK_NOTHROW(run_world(2, [](int, int) {
    const uint64_t before = tp::memory::stats().live_bytes(tp::memory::Kind::Other);
    {
      // Issued and let go at once: only the communication thread still
      // holds the 4 MB tensor (and the work, whose outputs name it).
      tp::Tensor t = tp::ones({1 << 20});
      dist::all_reduce(t, dist::ReduceOp::SUM, /*async_op=*/true);
    }
    dist::default_group()->synchronize();
    const uint64_t after = tp::memory::stats().live_bytes(tp::memory::Kind::Other);
    if (after != before) {
      throw tp::Error("after synchronize(), " + std::to_string(after - before) +
                      " bytes of the collective's tensor are still held");
    }
  }));
}

TEST_CASE("trace records a queued instant on the caller and a comm span per collective") {
  CHECK_NOTHROW(run_world(2, [](int rank, int) {
    tp::trace::enable(rank);
    tp::Tensor t = tp::ones({3});
    auto first = dist::all_reduce(t, dist::ReduceOp::SUM, true);
    auto second = dist::broadcast(t, 1, true);
    first->wait();
    second->wait();
    dist::barrier();
    tp::trace::disable();
    const std::vector<tp::trace::Event> events = tp::trace::events();
    struct Expected {
      const char* op;
      int64_t seq;
    };
    for (const Expected& e : {Expected{"allreduce", 1}, Expected{"broadcast", 2},
                              Expected{"barrier", 3}}) {
      const tp::trace::Event* queued = nullptr;
      const tp::trace::Event* span = nullptr;
      for (const auto& ev : events) {
        const bool seq_matches =
            !ev.args.empty() && ev.args[0].first == "seq" && ev.args[0].second == e.seq;
        if (!seq_matches) continue;
        if (ev.phase == 'i' && ev.name == std::string(e.op) + " queued") queued = &ev;
        if (ev.phase == 'X' && ev.name == e.op && ev.category == "comm") span = &ev;
      }
      if (queued == nullptr || span == nullptr) {
        throw tp::Error(std::string("missing trace events for ") + e.op);
      }
      if (!(queued->begin_order < span->begin_order) || queued->tid == span->tid) {
        throw tp::Error(std::string(e.op) +
                        ": the queued instant must come first, on another thread");
      }
    }
  }));
}

TEST_CASE("a collective budget lets its collectives through and refuses the next, naming the "
          "rank, the collective and the budget") {
  tp::TempDir dir("tp-budget");
  const std::string path = dir.path();
  CHECK_NOTHROW(mp::spawn(
      [&path](int rank) {
        dist::ProcessGroupGloo group(path, rank, 2, dist::GlooOptions{kCollectiveTimeout});
        tp::Tensor t = tp::ones({5});
        group.allreduce(t)->wait();  // before the budget is set: not counted
        group.set_collective_budget(3, "a test's three");
        group.reset_counters();      // counters are not the budget's count
        group.broadcast(t, 0)->wait();
        group.barrier()->wait();
        group.allreduce(t)->wait();
        try {
          group.allreduce(t);
        } catch (const tp::DistributedError& e) {
          const std::string what = e.what();
          for (const std::string& needle :
               {std::string("rank ") + std::to_string(rank), std::string("collective #5 (allreduce)"),
                std::string("past the budget of 3 collectives from #2 (a test's three)")}) {
            if (what.find(needle) == std::string::npos) {
              throw tp::Error("the budget's error lacks '" + needle + "': " + what);
            }
          }
          return;
        }
        throw tp::Error("the fourth collective since the budget was issued past a budget of 3");
      },
      2));
}

TEST_CASE("counters count each collective and the all-reduced elements") {
  tp::TempDir dir("tp-counters");
  const std::string path = dir.path();
  CHECK_NOTHROW(mp::spawn(
      [&path](int rank) {
        dist::ProcessGroupGloo group(path, rank, 2, dist::GlooOptions{kCollectiveTimeout});
        TP_CHECK_EQ(group.backend_name(), std::string("gloo"), "backend name");
        TP_CHECK_EQ(group.rank(), rank, "rank");
        TP_CHECK_EQ(group.size(), 2, "size");
        tp::Tensor t = tp::ones({5});
        for (int i = 0; i < 3; ++i) group.allreduce(t)->wait();
        group.broadcast(t, 0)->wait();
        group.allgather({tp::zeros({5}), tp::zeros({5})}, t)->wait();
        group.barrier()->wait();
        group.barrier()->wait();
        const dist::CollectiveCounters& c = group.counters();
        TP_CHECK_EQ(c.allreduce, 3u, "allreduce count");
        TP_CHECK_EQ(c.allreduce_elements, 15u, "3 allreduces of 5 elements");
        TP_CHECK_EQ(c.broadcast, 1u, "broadcast count");
        TP_CHECK_EQ(c.allgather, 1u, "allgather count");
        TP_CHECK_EQ(c.barrier, 2u, "barrier count");
        group.reset_counters();
        TP_CHECK_EQ(group.counters().allreduce, 0u, "after reset");
        TP_CHECK_EQ(group.counters().allreduce_elements, 0u, "after reset");
      },
      2));
}

// ---- 16-bit tensors: the compression hooks' wire types ------------------------

TEST_CASE("allreduce of float16 gives closed forms at world sizes 1, 2 and 4, and overflows "
          "past 65504") {
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    CHECK_NOTHROW(run_world(world, [](int rank, int w) {
      // (r + 1) * (i + 1): every partial sum is a small integer, exact in
      // float16 whatever order Gloo's ring adds in.
      tp::Tensor sum = contribution(rank, tp::kFloat16);
      dist::all_reduce(sum, dist::ReduceOp::SUM);
      expect_values(sum, times_1_to_5(w * (w + 1) / 2.0), "SUM float16");
      tp::Tensor avg = contribution(rank, tp::kFloat16);
      dist::all_reduce(avg, dist::ReduceOp::AVG);
      expect_values(avg, times_1_to_5((w + 1) / 2.0), "AVG float16");
      tp::Tensor lo = contribution(rank, tp::kFloat16);
      dist::all_reduce(lo, dist::ReduceOp::MIN);
      expect_values(lo, times_1_to_5(1), "MIN float16");
      tp::Tensor hi = contribution(rank, tp::kFloat16);
      dist::all_reduce(hi, dist::ReduceOp::MAX);
      expect_values(hi, times_1_to_5(w), "MAX float16");
      // 2^-(r+1): the sum 1 - 2^-W, a float16 as is every partial sum.
      tp::Tensor halves = tp::full({3}, std::ldexp(1.0, -(rank + 1)), tp::kFloat16);
      dist::all_reduce(halves);
      expect_values(halves, std::vector<double>(3, 1 - std::ldexp(1.0, -w)), "SUM of 2^-(r+1)");
      // 30000 per rank: 60000 is a float16, 90000 is past 65504 and rounds
      // to infinity, which stays infinity.
      tp::Tensor big = tp::full({2}, 30000, tp::kFloat16);
      dist::all_reduce(big);
      const double inf = std::numeric_limits<double>::infinity();
      expect_values(big, std::vector<double>(2, w == 1 ? 30000.0 : w == 2 ? 60000.0 : inf),
                    "SUM of 30000");
    }));
  }
}

TEST_CASE("allreduce of bfloat16 on gloo is refused, naming NCCL as the backend that reduces it") {
  CHECK_THROWS_WITH_AS(run_world(1, [](int, int) {
                                   dist::all_reduce(tp::ones({4}, tp::kBFloat16));
                                 }),
                       Contains("tp::distributed::ProcessGroupGloo::allreduce: rank 0: the "
                                "tensor has dtype bfloat16, and Gloo has no bfloat16 reduction"),
                       mp::SpawnError);
  CHECK_THROWS_WITH_AS(run_world(1, [](int, int) {
                                   dist::all_reduce(tp::ones({4}, tp::kBFloat16));
                                 }),
                       Contains("bf16_compress_hook needs a backend that reduces bfloat16, NCCL "
                                "on a GPU"),
                       mp::SpawnError);
}

TEST_CASE("allreduce_bytes counts what the all-reduces carried: 2 bytes per float16 element") {
  CHECK_NOTHROW(run_world(1, [](int, int) {
    dist::ProcessGroup& group = *dist::default_group();
    group.reset_counters();
    dist::all_reduce(tp::ones({5}));                 // 20 bytes
    dist::all_reduce(tp::ones({5}, tp::kFloat16));   // 10 bytes
    dist::all_reduce(tp::ones({5}, tp::kFloat64));   // 40 bytes
    dist::broadcast(tp::ones({5}, tp::kBFloat16));   // not an all-reduce
    TP_CHECK_EQ(group.counters().allreduce_elements, 15u, "15 elements");
    TP_CHECK_EQ(group.counters().allreduce_bytes, 70u, "20 + 10 + 40 bytes");
    group.reset_counters();
    TP_CHECK_EQ(group.counters().allreduce_bytes, 0u, "after reset");
  }));
}

TEST_CASE("with check_collectives, a float16 all-reduce against a float32 one names both dtypes") {
  tp::TempDir dir("tp-fp16-fingerprint");
  const std::string path = dir.path();
  const mp::SpawnError e = spawn_error_of([&path] {
    mp::spawn(
        [&path](int rank) {
          dist::GlooOptions options{kCollectiveTimeout};
          options.check_collectives = true;
          dist::ProcessGroupGloo group(path, rank, 2, options);
          group.allreduce(tp::ones({5}, rank == 0 ? tp::kFloat16 : tp::kFloat32))->wait();
        },
        2);
  });
  CHECK(std::string(e.what()).find("rank 0 called allreduce SUM of 5 float16 elements as its "
                                   "collective #1; rank 1 called allreduce SUM of 5 float32 "
                                   "elements") != std::string::npos);
}

// ---- when ranks disagree -------------------------------------------------------

// Checker mode (GlooOptions::check_in_flight_writes): ten rounds on each of
// two ranks, so a detection that depended on timing would miss some round.
TEST_CASE("in checker mode, a tensor written before its wait() is an error there, every time") {
  tp::TempDir dir("tp-in-flight");
  const std::string path = dir.path();
  CHECK_NOTHROW(mp::spawn(
      [&path](int rank) {
        dist::ProcessGroupGloo group(path, rank, 2,
                                     dist::GlooOptions{kCollectiveTimeout, true});
        for (int round = 0; round < 10; ++round) {
          // Divide, then wait: the bug the check exists for.
          tp::Tensor t = tp::full({3, 2}, rank + 1.0);
          auto work = group.allreduce(t);
          t.div_(2.0);
          std::string error;
          try {
            work->wait();
          } catch (const tp::DistributedError& e) {
            error = e.what();
          }
          for (const char* phrase :
               {"allreduce #", "its tensor (shape (3, 2), float32) was written while its "
                "all-reduce was in flight: wait() before touching it", "element 0 ("}) {
            if (error.find(phrase) == std::string::npos) {
              throw tp::Error("round " + std::to_string(round) + ": expected \"" + phrase +
                              "\" in the wait() error, got: \"" + error + "\"");
            }
          }
          // A later wait() on the same work says the same.
          bool again = false;
          try {
            work->wait();
          } catch (const tp::DistributedError&) {
            again = true;
          }
          if (!again) throw tp::Error("a second wait() must rethrow the in-flight error");
        }
        // A broadcast's tensor, written on the root before the wait.
        tp::Tensor b = tp::full({4}, rank == 0 ? 7.0 : 0.0);
        auto work = group.broadcast(b, 0);
        if (rank == 0) b.fill_(8.0);
        bool seen = false;
        try {
          work->wait();
        } catch (const tp::DistributedError& e) {
          seen = std::string(e.what()).find("written while its broadcast was in flight") !=
                 std::string::npos;
        }
        if (rank == 0 && !seen) throw tp::Error("rank 0 wrote its broadcast tensor in flight");
      },
      2));
}

TEST_CASE("in checker mode, a 16-bit tensor written in flight is reported with its values") {
  tp::TempDir dir("tp-in-flight-16");
  const std::string path = dir.path();
  const mp::SpawnError e = spawn_error_of([&path] {
    mp::spawn(
        [&path](int rank) {
          dist::ProcessGroupGloo group(path, rank, 1, dist::GlooOptions{kCollectiveTimeout, true});
          tp::Tensor h = tp::full({2}, 0.25, tp::kFloat16);
          auto reduce = group.allreduce(h);
          h.div_(2.0);
          std::string error;
          try {
            reduce->wait();
          } catch (const tp::DistributedError& caught) {
            error = caught.what();
          }
          if (error.find("element 0 (0.25 when issued, 0.125 at wait())") == std::string::npos) {
            throw tp::Error("float16: " + error);
          }
          tp::Tensor b = tp::full({2}, 0.5, tp::kBFloat16);
          auto broadcast = group.broadcast(b, 0);
          b.fill_(0.75);
          broadcast->wait();
        },
        1);
  });
  CHECK_MESSAGE(std::string(e.what()).find("element 0 (0.5 when issued, 0.75 at wait())") !=
                    std::string::npos,
                e.what());
}

TEST_CASE("in checker mode, a tensor left alone gets the collective's result at wait()") {
  tp::TempDir dir("tp-in-flight-ok");
  const std::string path = dir.path();
  CHECK_NOTHROW(mp::spawn(
      [&path](int rank) {
        dist::ProcessGroupGloo group(path, rank, 2,
                                     dist::GlooOptions{kCollectiveTimeout, true});
        tp::Tensor t = tp::full({5}, rank + 1.0, tp::kFloat64);
        auto work = group.allreduce(t);
        work->wait();
        expect_values(t, std::vector<double>(5, 3.0), "1 + 2 after wait()");
        work->wait();  // a second wait() changes nothing
        expect_values(t, std::vector<double>(5, 3.0), "after a second wait()");
        tp::Tensor b = tp::full({2}, rank == 1 ? 4.0 : 0.0);
        group.broadcast(b, 1)->wait();
        expect_values(b, {4.0, 4.0}, "broadcast from rank 1");
      },
      2));
}

// Checker mode: a collective owns its tensor until its wait() returns, so a
// second one on the same memory before that is refused when it is issued
// (each would deliver its result at its own wait(), and the later delivery
// would look like a write in flight).
TEST_CASE("in checker mode, a second collective on a tensor still in flight is refused, naming both") {
  tp::TempDir dir("tp-in-flight-twice");
  const std::string path = dir.path();
  CHECK_NOTHROW(mp::spawn(
      [&path](int rank) {
        dist::ProcessGroupGloo group(path, rank, 2,
                                     dist::GlooOptions{kCollectiveTimeout, true});
        const std::string r = std::to_string(rank);
        const auto expect_refused = [&](const std::function<void()>& issue,
                                        const std::string& phrase, const char* what) {
          std::string error;
          try {
            issue();
          } catch (const tp::DistributedError& e) {
            error = e.what();
          }
          if (error.find(phrase) == std::string::npos ||
              error.find("A tensor belongs to its collective until wait() returns") ==
                  std::string::npos) {
            throw tp::Error(std::string(what) + ": expected \"" + phrase +
                            "\" in the error, got: \"" + error + "\"");
          }
        };
        tp::Tensor t = tp::full({4}, rank + 1.0);
        auto first = group.allreduce(t);
        expect_refused([&] { group.allreduce(t); },
                       "allreduce #2 on rank " + r + " was issued on a tensor (shape (4), "
                       "float32) whose memory allreduce #1 on rank " + r + " (shape (4), "
                       "float32) still owns: that collective was issued and has not been "
                       "waited for yet. Was a wait() missed, or one collective issued twice?",
                       "the same tensor twice");
        first->wait();
        expect_values(t, std::vector<double>(4, 3.0), "the first all-reduce's result");
        // Waited for: the tensor is free again.
        group.allreduce(t)->wait();
        expect_values(t, std::vector<double>(4, 6.0), "the next all-reduce, after the wait");
        // A Work dropped without wait(): its tensor is still its own.
        { auto forgotten = group.allreduce(t); }
        expect_refused([&] { group.broadcast(t, 0); },
                       "broadcast #5 on rank " + r + " was issued on a tensor (shape (4), "
                       "float32) whose memory allreduce #4 on rank " + r + " (shape (4), "
                       "float32) still owns, because that collective was never waited for: "
                       "its Work was dropped without a wait()",
                       "after a forgotten wait()");
        // Views of one storage: overlapping is refused, disjoint is not.
        tp::Tensor flat = tp::zeros({6});
        auto low = group.allreduce(flat.narrow(0, 0, 4));
        expect_refused([&] { group.allreduce(flat.narrow(0, 2, 4)); },
                       "allreduce #7 on rank " + r + " was issued on a tensor (shape (4), "
                       "float32) whose memory allreduce #6 on rank " + r,
                       "overlapping views");
        auto high = group.allreduce(flat.narrow(0, 4, 2));
        low->wait();
        high->wait();
        // Waited for out of order: a later collective's wait() returned, this
        // one's never came (collectives finish in issue order, but each
        // delivers its result only at its own wait()).
        tp::Tensor x = tp::ones({3});
        tp::Tensor y = tp::ones({3});
        auto skipped = group.allreduce(x);
        group.allreduce(y)->wait();
        expect_refused([&] { group.allreduce(x); },
                       "allreduce #11 on rank " + r + " was issued on a tensor (shape (3), "
                       "float32) whose memory allreduce #9 on rank " + r + " (shape (3), "
                       "float32) still owns: that collective has not been waited for, "
                       "although collective #10, issued after it, has been.",
                       "a skipped wait()");
        skipped->wait();
        // A freed tensor's claim ends with it, even if never waited for: a new
        // tensor on the same memory is not the old one. (The allocator
        // decides where the new tensor lands; the loop keeps allocating until
        // one lands on the freed memory, which glibc does at once.)
        constexpr int64_t kElements = int64_t{9} << 20;  // 36 MiB: mmap-ed, and reused
        const std::byte* freed = nullptr;
        {
          tp::Tensor temp = tp::ones({kElements});
          freed = static_cast<const std::byte*>(temp.data_ptr());
          auto forgotten = group.allreduce(temp);
          // Collectives run in issue order: once this wait() returns, the
          // communication thread has let go of `forgotten`, so the tensor's
          // memory is freed at the end of this block.
          tp::Tensor other = tp::ones({3});
          group.allreduce(other)->wait();
        }
        std::vector<tp::Tensor> kept;  // tensors that landed elsewhere, until one does not
        tp::Tensor fresh = tp::ones({kElements});
        const auto on_freed_memory = [&](const tp::Tensor& t) {
          const auto* data = static_cast<const std::byte*>(t.data_ptr());
          return data < freed + 4 * kElements && freed < data + 4 * kElements;
        };
        while (!on_freed_memory(fresh) && kept.size() < 4) {
          kept.push_back(fresh);
          fresh = tp::ones({kElements});
        }
        if (rank == 0 && !on_freed_memory(fresh)) {
          std::printf("note: the allocator never reused the freed memory; the reuse case "
                      "checked nothing\n");
        }
        group.allreduce(fresh)->wait();
        expect_values(fresh, std::vector<double>(kElements, 2.0), "a fresh tensor");
      },
      2));
}

// A wait() that threw leaves its claim (its result never arrived), but the
// group has stopped: the next collective must say so, not blame a missing
// wait(). Rank 1 skips the collective and stays alive past rank 0's timeout.
TEST_CASE("in checker mode, after a collective failed, the next one names the failure, not a claim") {
  tp::TempDir dir("tp-in-flight-failed");
  const std::string path = dir.path();
  CHECK_NOTHROW(mp::spawn(
      [&path](int rank) {
        dist::ProcessGroupGloo group(path, rank, 2, dist::GlooOptions{kShortTimeout, true});
        if (rank == 1) {
          std::this_thread::sleep_for(kShortTimeout + std::chrono::seconds(2));
          return;
        }
        tp::Tensor t = tp::ones({4});
        auto first = group.allreduce(t);
        try {
          first->wait();
        } catch (const tp::DistributedError&) {  // timed out, or rank 1 left first
        }
        std::string error;
        try {
          group.allreduce(t)->wait();
        } catch (const tp::DistributedError& e) {
          error = e.what();
        }
        if (error.find("allreduce #2 on rank 0 was not run: this process group stopped after "
                       "allreduce #1") == std::string::npos) {
          throw tp::Error("expected the group-stopped error, got: \"" + error + "\"");
        }
      },
      2));
}

TEST_CASE("a rank that skips a collective makes the waiting rank time out naming it") {
  auto job = [] {
    run_world(
        2,
        [](int rank, int) {
          tp::Tensor t = tp::ones({4});
          dist::all_reduce(t);  // allreduce #1: both ranks
          if (rank == 1) {      // rank 1 skips allreduce #2 and stays alive
            std::this_thread::sleep_for(std::chrono::seconds(60));
            return;
          }
          dist::all_reduce(t);
        },
        kShortTimeout);
  };
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(job(),
                       Contains("rank 0 failed: tp::TimeoutError: allreduce #2 on rank 0 timed "
                                "out after 4000 ms: another rank did not join this collective "
                                "(did every rank issue the same collectives in the same order?)"),
                       mp::SpawnError);
  // Ended once rank 0 timed out: long before rank 1's 60 s sleep would end.
  CHECK(seconds_since(start) < 30.0);
}

// Each rank all-reduces ones three times per step and checks its count at
// each step's end, as the kit's trainer does; rank 1 may leave one out of
// step 2 or add one to it. Every all-reduce has the same shape, so Gloo pairs
// rank 1's next one with the others' skipped one and nothing times out:
// without the count, every rank's sum is silently wrong from step 2 on.
void three_per_step(int rank, int skip_or_extra) {
  tp::Tensor t = tp::ones({4});
  for (int step = 0; step < 5; ++step) {
    int issue = 3;
    if (rank == 1 && step == 2) issue += skip_or_extra;
    for (int k = 0; k < issue; ++k) dist::all_reduce(t);
    dist::default_group()->check_collective_count("the end of step " + std::to_string(step));
  }
}

TEST_CASE("a rank that skips an all-reduce of the same shape is named at the step's end, with "
          "every rank's count") {
  const std::string three =
      spawn_error_of([] { run_world(3, [](int rank, int) { three_per_step(rank, -1); }); })
          .what();
  // spawn leads with the rank found, not with the rank that found it.
  CHECK_MESSAGE(three.rfind("tp::multiprocessing::spawn: rank 1 is the likely cause: by the end of "
                            "step 2 it had issued 8 collectives on this group where ranks 0 and 2 "
                            "had issued 9: it skipped a collective the others issued (rank 0 "
                            "found it)\n  rank 0 failed: ", 0) == 0,
                three);
  CHECK_MESSAGE(three.find("rank 1 is the likely cause: by the end of step 2 it had issued 8 "
                           "collectives on this group where ranks 0 and 2 had issued 9: it "
                           "skipped a collective the others issued. Where a rank skips one") !=
                    std::string::npos,
                three);
  // Two ranks cannot outvote each other: both readings are given.
  const std::string two =
      spawn_error_of([] { run_world(2, [](int rank, int) { three_per_step(rank, -1); }); })
          .what();
  CHECK_MESSAGE(two.find("rank 1 issued fewer collectives on this group than rank 0 by the end "
                         "of step 2 (8 against 9): it skipped one, or rank 0 issued an extra "
                         "one") != std::string::npos,
                two);
}

TEST_CASE("a rank that issues an extra all-reduce of the same shape names itself at the step's "
          "end") {
  const std::string message =
      spawn_error_of([] { run_world(4, [](int rank, int) { three_per_step(rank, +1); }); })
          .what();
  CHECK_MESSAGE(message.find("rank 1 is the likely cause: by the end of step 2 it had issued 10 "
                             "collectives on this group where ranks 0, 2 and 3 had issued 9: it "
                             "issued a collective the others did not") != std::string::npos,
                message);
  CHECK_MESSAGE(message.find("rank 1 failed: tp::DistributedError: rank 1 is the likely cause")
                    != std::string::npos, message);
}

TEST_CASE("collective counts that agree pass, and a rank that stops checking (it joined) is not "
          "compared") {
  for (int world : {1, 2, 4}) {
    CHECK_NOTHROW(run_world(world, [](int rank, int) {
      tp::Tensor t = tp::ones({4});
      for (int step = 0; step < 6; ++step) {
        dist::all_reduce(t);
        dist::all_reduce(t);
        // Rank 0 has no inputs after step 2: it keeps shadowing the others'
        // collectives, as a joined rank does, but checks no more ends.
        if (rank != 0 || step < 2) {
          dist::default_group()->check_collective_count("the end of step " + std::to_string(step));
        }
      }
      expect_values(t, std::vector<double>(4, std::pow(static_cast<double>(dist::get_world_size()), 12)),
                    "after twelve all-reduces of ones");
    }));
  }
}

TEST_CASE("a rank that joined skips the points it missed, so the next run on the group checks "
          "the same points") {
  // Two runs on one group (a launched checker's cases): in the first, rank 0
  // checks 5 of the 6 step ends. Without skip_count_points its numbering
  // runs one behind, and its next check meets rank 1's record of the last
  // step of the first run: a false alarm.
  for (const bool skip : {true, false}) {
    CAPTURE(skip);
    auto job = [&] {
      run_world(2, [&](int rank, int) {
        tp::Tensor t = tp::ones({4});
        for (int run = 0; run < 2; ++run) {
          const int steps = (run == 0 && rank == 0) ? 5 : 6;
          for (int step = 0; step < 6; ++step) {
            dist::all_reduce(t);
            if (step < steps) {
              dist::default_group()->check_collective_count("the end of step " +
                                                            std::to_string(step));
            }
          }
          dist::barrier();  // the run ends together
          if (skip) dist::default_group()->skip_count_points(6 - steps);
        }
      });
    };
    if (skip) {
      CHECK_NOTHROW(job());
    } else {
      CHECK_THROWS_AS(job(), mp::SpawnError);
    }
  }
  CHECK_THROWS_WITH_AS(run_world(1, [](int, int) { dist::default_group()->skip_count_points(-1); }),
                       Contains("pass how many check_collective_count calls this rank left out"),
                       mp::SpawnError);
}

TEST_CASE("a barrier against an allreduce names both sides, whichever rank times out first") {
  // Both ranks time out, each in its own collective #2; the report must show
  // both calls, not only the blamed rank's.
  for (int barrier_rank : {0, 1}) {
    const std::string message = test_util::spawn_error_of([&] {
      run_world(
          2,
          [&](int rank, int) {
            tp::Tensor t = tp::ones({4});
            dist::all_reduce(t);  // #1 on both
            if (rank == barrier_rank) {
              dist::barrier();
            } else {
              dist::all_reduce(t);
            }
          },
          kShortTimeout);
    }).what();
    const std::string both =
        barrier_rank == 0 ? "the ranks issued different collectives as #2: barrier on rank 0, "
                            "allreduce on rank 1"
                          : "the ranks issued different collectives as #2: allreduce on rank 0, "
                            "barrier on rank 1";
    CHECK_MESSAGE(message.find(both) != std::string::npos, message);
    CHECK_MESSAGE(message.find("failed too (last collective: ") != std::string::npos, message);
  }
}

TEST_CASE("an allreduce of another size on one of three ranks is the likely cause, by its size") {
  // The same name and number on every rank: only the sizes tell them apart
  // (a hook that skipped a bucket launches the next bucket's all-reduce
  // where the others launch the skipped one's).
  const std::string message = spawn_error_of([] {
    run_world(
        3,
        [](int rank, int) {
          dist::all_reduce(tp::ones({4}));  // #1 on every rank
          dist::all_reduce(tp::ones({rank == 1 ? 4 : 3}));
        },
        kShortTimeout);
  }).what();
  CHECK_MESSAGE(message.rfind("tp::multiprocessing::spawn: rank 1 is the likely cause: it issued "
                              "allreduce of 4 float32 as #2 where ranks 0 and 2 issued allreduce "
                              "of 3 float32", 0) == 0,
                message);
}

TEST_CASE("allreduce of different sizes on two ranks fails in that allreduce, not later") {
  // Without the size in Gloo's tag, one rank would return a wrong sum here.
  CHECK_THROWS_WITH_AS(run_world(
                           2,
                           [](int rank, int) {
                             tp::Tensor t = tp::ones({rank == 0 ? 3 : 4});
                             dist::all_reduce(t);
                           },
                           kShortTimeout),
                       Contains("tp::TimeoutError: allreduce #1 on rank"), mp::SpawnError);
}

TEST_CASE("a rank that exits early makes its peer fail at once, naming the collective") {
  // The other ranks leave right after init_process_group. Every time, rank 0
  // must fail in allreduce #1, never inside the rendezvous: the group's
  // constructor returns only once every rank has connected. Several worlds
  // and attempts, because the rendezvous race this guards against is rare.
  for (int world : {2, 3, 4}) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      CAPTURE(world);
      CAPTURE(attempt);
      const auto start = std::chrono::steady_clock::now();
      const mp::SpawnError e = spawn_error_of([&] {
        run_world(world, [](int rank, int) {
          if (rank != 0) return;  // leaves without the allreduce
          tp::Tensor t = tp::ones({4});
          dist::all_reduce(t);
        });
      });
      const std::string message = e.what();
      CAPTURE(message);
      CHECK(message.find("rank 0 failed: tp::PeerFailedError: allreduce #1 on rank 0 failed: "
                         "the connection to another rank broke") != std::string::npos);
      CHECK(e.kind() == tp::ErrorKind::Consequence);
      // A closed connection is noticed, not waited out: the error is not a
      // TimeoutError, and it comes well within the 20 s collective timeout.
      CHECK(seconds_since(start) < 15.0);
    }
  }
}

TEST_CASE("a rank that exits or crashes while its peer waits in an allreduce is blamed") {
  // Rank 1 leaves the group, so rank 0 fails at once in allreduce #1 with a
  // broken connection and usually reports first; rank 1 ends 50 ms later,
  // inside spawn's settle window, by exit(3) or abort(). Rank 1's ending is
  // the cause: it must be weighed although it carries no exception.
  struct Ending {
    const char* how;
    void (*end)();
    const char* message;
  };
  // Ten times each, with and without leaving the group first: the race
  // (whose report spawn reads first) goes either way from run to run.
  for (const Ending& ending : {Ending{"exit", [] { std::exit(3); }, "exited with code 3"},
                               Ending{"abort", [] { std::abort(); },
                                      "killed by signal 6 (Aborted)"}}) {
    for (int attempt = 0; attempt < 10; ++attempt) {
      const bool leave_first = attempt % 2 == 0;
      CAPTURE(ending.how);
      CAPTURE(attempt);
      const mp::SpawnError e = spawn_error_of([&] {
        run_world(2, [&](int rank, int) {
          tp::Tensor t = tp::ones({4});
          if (rank == 1) {
            if (leave_first) dist::destroy_process_group();
            std::this_thread::sleep_for(milliseconds(50));
            ending.end();
          }
          dist::all_reduce(t);
        });
      });
      CHECK(e.rank() == 1);
      CHECK(e.kind() == tp::ErrorKind::Cause);
      CHECK(std::string(e.what()).find(std::string("rank 1 failed: ") + ending.message) !=
            std::string::npos);
    }
  }
}

TEST_CASE("a collective that times out because a rank is stopped (SIGSTOP) names that rank") {
  const mp::SpawnError e = spawn_error_of([&] {
    run_world(
        2,
        [](int rank, int) {
          tp::Tensor t = tp::ones({4});
          dist::all_reduce(t);  // allreduce #1: both ranks
          if (rank == 1) ::raise(SIGSTOP);  // as `kill -STOP`, or a debugger
          dist::all_reduce(t);
        },
        kShortTimeout);
  });
  const std::string what = e.what();
  CAPTURE(what);
  CHECK(e.rank() == 0);
  CHECK(what.find("tp::TimeoutError: allreduce #2 on rank 0 timed out") != std::string::npos);
  CHECK(what.find("meanwhile: rank 1 was stopped (SIGSTOP), not in a collective (last: "
                  "allreduce #1)") != std::string::npos);
}

TEST_CASE("a rank waiting for a collective's future shows it: stopped there, it is named") {
  // Rank 1 waits for allreduce #2 through its future (as a DDP waits for a
  // comm hook's), with wait() or wait_for(), and is stopped there; rank 0
  // never issues #2 and gives up. The status board shows where rank 1
  // waits, a future's wait as a Work's.
  for (const bool plain_wait : {true, false}) {
    CAPTURE(plain_wait);
    const mp::SpawnError e = spawn_error_of([&] {
      run_world(
          2,
          [plain_wait](int rank, int) {
            tp::Tensor t = tp::ones({4});
            dist::all_reduce(t);  // allreduce #1: both ranks
            if (rank == 1) {
              std::shared_ptr<dist::Future> future =
                  dist::default_group()->allreduce(t)->get_future();
              std::thread([] {
                std::this_thread::sleep_for(std::chrono::milliseconds(300));
                ::raise(SIGSTOP);  // the whole process, waiting in the future
              }).detach();
              if (plain_wait) {
                future->wait();
              } else {
                future->wait_for(std::chrono::seconds(60));
              }
            } else {
              std::this_thread::sleep_for(std::chrono::milliseconds(2000));
              throw tp::TimeoutError("rank 0 gave up waiting for rank 1");
            }
          },
          kShortTimeout * 4);
    });
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(e.rank() == 0);
    CHECK(what.find("meanwhile: rank 1 was stopped (SIGSTOP), waiting in allreduce #2") !=
          std::string::npos);
    CHECK(what.find("rank 1 is the likely cause: it was stopped (SIGSTOP), waiting in "
                    "allreduce #2") != std::string::npos);
  }
}

TEST_CASE("the rank that threw is blamed, not the peer whose connection it broke") {
  // Rank 1 throws while rank 0 waits in an allreduce. Unwinding destroys rank
  // 1's group, closing its sockets, so rank 0 fails with a broken connection
  // (a tp::PeerFailedError); then both ranks unwind slowly, so either report
  // may reach spawn first. spawn must name rank 1 and its message: its error
  // is a Cause, rank 0's a Consequence (Note [Which rank failed first] in
  // spawn.cc).
  struct SlowToUnwind {
    ~SlowToUnwind() { std::this_thread::sleep_for(milliseconds(300)); }
  };
  for (int attempt = 0; attempt < 3; ++attempt) {
    tp::TempDir rendezvous("tp-blame");
    CHECK_THROWS_WITH_AS(
        mp::spawn(
            [&](int rank) {
              SlowToUnwind slow;
              dist::ProcessGroupGloo group(rendezvous.path(), rank, 2,
                                           dist::GlooOptions{kCollectiveTimeout});
              if (rank == 1) TP_THROW(tp::Error, "boom from rank 1");
              group.allreduce(tp::ones({4}))->wait();
            },
            2),
        Contains("rank 1 failed: tp::Error: boom from rank 1"), mp::SpawnError);
  }
}

TEST_CASE("a job that hangs in a collective times out naming the rank and the collective") {
  mp::SpawnOptions options;
  // Long enough for rank 0 to reach the allreduce on a loaded machine (about
  // 0.3 s on a loaded 2-core one): the verdict needs it waiting there.
  options.timeout = milliseconds(8000);
  tp::TempDir dir("tp-hang");
  CHECK_THROWS_WITH_AS(
      mp::spawn(
          options,
          [&dir](int rank) {
            dist::init_process_group("gloo", rank, 2, dir.file_init_method(),
                                     milliseconds(60000));
            if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
            tp::Tensor t = tp::ones({4});
            dist::all_reduce(t);
          },
          2),
      Contains("still running: rank 0 (waiting in allreduce #1), rank 1"), mp::SpawnError);
}

// ---- bad input: a clear error, before any rank waits on another -------------------

TEST_CASE("init_process_group rejects a world size below 1") {
  tp::TempDir dir;
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", 0, 0, dir.file_init_method()),
                       Contains("world_size must be >= 1 (got 0)"), tp::DistributedError);
  CHECK_FALSE(dist::is_initialized());
}

TEST_CASE("init_process_group rejects a rank outside [0, world_size)") {
  tp::TempDir dir;
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", -1, 4, dir.file_init_method()),
                       Contains("rank -1 is out of range for world_size 4; pass a rank in 0 .. 3"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", 4, 4, dir.file_init_method()),
                       Contains("rank 4 is out of range for world_size 4"),
                       tp::DistributedError);
}

TEST_CASE("ProcessGroup rejects a size below 1 and a rank out of range") {
  CHECK_THROWS_WITH_AS(dist::ProcessGroupGloo("/nonexistent", 0, 0),
                       Contains("world size must be >= 1 (got 0)"), tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::ProcessGroupGloo("/nonexistent", 2, 2),
                       Contains("rank 2 is out of range for world size 2"),
                       tp::DistributedError);
}

TEST_CASE("init_process_group names the init methods it knows") {
  // env://, tcp:// and redis:// work: tests/unit/test_rendezvous.cc, test_redis.cc.
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", 0, 2, "mpi://127.0.0.1:29500"),
                       Contains("unknown init_method 'mpi://127.0.0.1:29500'; supported: "
                                "file://DIR (one machine), env:// (MASTER_ADDR, MASTER_PORT, "
                                "RANK, WORLD_SIZE), tcp://HOST:PORT and redis://HOST:PORT[/JOB]"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", 0, 2, "file://"),
                       Contains("names no directory"), tp::DistributedError);
}

TEST_CASE("init_process_group rejects an unknown backend") {
  tp::TempDir dir;
  CHECK_THROWS_WITH_AS(dist::init_process_group("mpi", 0, 1, dir.file_init_method()),
                       Contains("unknown backend 'mpi'; supported backends: gloo and nccl"),
                       tp::DistributedError);
}

TEST_CASE("init_process_group(\"nccl\") says why NCCL cannot run here, or runs") {
  // Runs everywhere, in a spawned rank: CUDA must not be initialised in the
  // test process, whose later cases fork (Note [No CUDA in the parent] in
  // cuda_test_util.h).
  tp::TempDir dir;
  const std::string outcome = mp::spawn(
      [&](int rank) -> std::string {
        try {
          dist::init_process_group("nccl", rank, 1, dir.file_init_method());
        } catch (const tp::DistributedError& e) {
          return e.what();
        }
        const std::string backend = dist::default_group()->backend_name();
        dist::destroy_process_group();
        return "initialized " + backend;
      },
      1)[0];
  if (!tp::cuda::is_built()) {
    // Without CUDA there is no NCCL.
    CHECK_MESSAGE(outcome.find("backend 'nccl' is not available: tensorplay was built without "
                               "NCCL (") != std::string::npos, outcome);
    CHECK_MESSAGE(outcome.find("use backend \"gloo\"") != std::string::npos, outcome);
  } else if (outcome.rfind("initialized", 0) == 0) {
    CHECK_EQ(outcome, "initialized nccl");  // NCCL and a GPU
  } else if (outcome.find("built without NCCL") != std::string::npos) {
    CHECK_MESSAGE(outcome.find("use backend \"gloo\"") != std::string::npos, outcome);
  } else {
    // NCCL, but no usable GPU (this machine's CI).
    CHECK_MESSAGE(outcome.find("backend 'nccl' is not available: no usable CUDA device: ") !=
                      std::string::npos, outcome);
    CHECK_MESSAGE(outcome.find("use backend \"gloo\"") != std::string::npos, outcome);
  }
}

TEST_CASE("init_process_group rejects a rendezvous directory it cannot write") {
  // The tests may run as root, who may write almost anywhere, but not in /proc.
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", 0, 1, "file:///proc/forbidden"),
                       Contains("rendezvous directory '/proc/forbidden' is not writable"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", 0, 1, "file:///proc"),
                       Contains("pass file://DIR with a directory every rank can write"),
                       tp::DistributedError);
  CHECK_FALSE(dist::is_initialized());
}

TEST_CASE("init_process_group refuses a rendezvous directory left over from an earlier job") {
  tp::TempDir dir;
  std::ofstream(dir.path() + "/tp-rank-0.arrived").put('x');
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", 0, 1, dir.file_init_method()),
                       Contains("use a fresh directory for every job"), tp::DistributedError);
}

TEST_CASE("a rank whose peers never arrive fails at rendezvous saying who is missing") {
  tp::TempDir dir;
  CHECK_THROWS_WITH_AS(
      dist::init_process_group("gloo", 0, 3, dir.file_init_method(), milliseconds(500)),
      Contains("rank 0 of 3 waited 500 ms for the others at rendezvous"), tp::DistributedError);
  tp::TempDir dir2;
  CHECK_THROWS_WITH_AS(
      dist::init_process_group("gloo", 0, 3, dir2.file_init_method(), milliseconds(200)),
      Contains("arrived: rank 0; missing: ranks 1, 2"), tp::DistributedError);
}

TEST_CASE("ranks started with different world sizes are told so at rendezvous, with both sizes") {
  // Without the world size in the markers, Gloo fails inside its own
  // rendezvous with "136 vs 68" under a hint about ranks that exited.
  tp::TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const mp::SpawnError e = spawn_error_of([&] {
    mp::spawn(
        [&](int rank) {
          const int world = rank == 0 ? 2 : 3;  // rank 1 was given another size
          dist::init_process_group("gloo", rank, world, dir.file_init_method(), kShortTimeout);
        },
        2);
  });
  const std::string what = e.what();
  CAPTURE(what);
  const bool names_sizes = what.find("with world size 2 but rank") != std::string::npos ||
                           what.find("with world size 3 but rank") != std::string::npos;
  CHECK(names_sizes);
  CHECK(what.find("every rank of a job must be given the same world size") != std::string::npos);
  CHECK(what.find("did a rank exit") == std::string::npos);
  CHECK(seconds_since(start) < 3.0);  // told at once, not after the 4 s rendezvous timeout
}

TEST_CASE("the free functions need an initialized default group") {
  CHECK_FALSE(dist::is_initialized());
  CHECK_THROWS_WITH_AS(dist::default_group(), Contains("no default process group"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::barrier(), Contains("call tp::distributed::init_process_group"),
                       tp::DistributedError);
  dist::destroy_process_group();  // a no-op without a group
}

TEST_CASE("init_process_group refuses a second init in the same process") {
  CHECK_THROWS_WITH_AS(run_world(1,
                                 [](int, int) {
                                   tp::TempDir other;
                                   dist::init_process_group("gloo", 0, 1,
                                                            other.file_init_method());
                                 }),
                       Contains("already initialized (rank 0 of 1, backend gloo); call "
                                "destroy_process_group() first"),
                       mp::SpawnError);
}

TEST_CASE("collectives reject bad tensors on the calling thread with the rank and the fix") {
  CHECK_THROWS_WITH_AS(run_world(1, [](int, int) {
                                   tp::Tensor t = tp::zeros({3, 4}).t();
                                   dist::all_reduce(t);
                                 }),
                       Contains("allreduce: rank 0: the tensor is not contiguous (shape (4, 3), "
                                "strides (1, 4)); a collective sends one dense block of memory: "
                                "pass t.contiguous()"),
                       mp::SpawnError);
  CHECK_THROWS_WITH_AS(run_world(1, [](int, int) { dist::all_reduce(tp::Tensor()); }),
                       Contains("allreduce: rank 0: the tensor is undefined"), mp::SpawnError);
  CHECK_THROWS_WITH_AS(run_world(1, [](int, int) {
                                   dist::broadcast(tp::zeros({2}), 1);
                                 }),
                       Contains("broadcast: rank 0: root 1 is out of range for world size 1"),
                       mp::SpawnError);
  CHECK_THROWS_WITH_AS(run_world(1, [](int, int) {
                                   dist::all_gather({tp::zeros({2}), tp::zeros({2})},
                                                    tp::zeros({2}));
                                 }),
                       Contains("allgather: rank 0: got 2 output tensors for world size 1"),
                       mp::SpawnError);
  CHECK_THROWS_WITH_AS(run_world(1, [](int, int) {
                                   dist::all_gather({tp::zeros({3}, tp::kFloat64)},
                                                    tp::zeros({2}));
                                 }),
                       Contains("outputs[0] has shape (3) and dtype float64 but the input has "
                                "shape (2) and dtype float32"),
                       mp::SpawnError);
}
