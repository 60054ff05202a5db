// tp::distributed::Future (future.h) and Work::get_future: first futures set
// by hand and chained, in this process; then a Work finished by a thread of
// the test, as a communication thread would; then real all-reduces over
// Gloo on spawned ranks, where a callback divides by the world size (the
// default DDP communication hook) and runs on the communication thread.
//
// Children cannot use doctest macros (doctest's state lives in the parent);
// they throw tp::Error, and spawn rethrows it in the parent with the rank.
#include <doctest/doctest.h>

#include <chrono>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tensorplay/distributed/future.h"
#include "tensorplay/distributed/init.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/distributed/work.h"
#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/tensor.h"
#include "tensorplay/trace.h"
#include "tensorplay/util/temp_dir.h"
#include "test_util.h"

namespace dist = tp::distributed;
namespace mp = tp::multiprocessing;
using doctest::Contains;
using std::chrono::milliseconds;
using Value = dist::Future::Value;

using test_util::kCollectiveTimeout;
using test_util::kShortTimeout;
using test_util::run_world;

namespace {


// Throws in a child: "<what> on rank r: expected [..], got [..]". Exact:
// every value below is a small integer or a half.
void expect_all(const tp::Tensor& t, double expected, const std::string& what) {
  for (double v : t.to_vector()) {
    if (v != expected) {
      throw tp::Error(what + " on rank " + std::to_string(mp::current_rank()) + ": expected " +
                      std::to_string(expected) + " everywhere, got " + std::to_string(v));
    }
  }
}

// The callbacks below add `x` to a one-element value.
dist::Future::Callback plus(double x) {
  return [x](dist::Future& parent) -> Value {
    return {tp::full({1}, parent.value()[0].to_vector()[0] + x)};
  };
}

double only(const Value& value) { return value.at(0).to_vector().at(0); }

}  // namespace

// ---- futures by hand ---------------------------------------------------------

TEST_CASE("wait_for gives up after its timeout on a future nobody completes, and sees one that completes") {
  dist::Future never;
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(never.wait_for(milliseconds(50)));
  CHECK(std::chrono::steady_clock::now() - start >= milliseconds(50));
  dist::Future later;
  std::thread completer([&] {
    std::this_thread::sleep_for(milliseconds(20));
    later.set_value({tp::full({1}, 7.0)});
  });
  CHECK(later.wait_for(milliseconds(10000)));
  completer.join();
  CHECK(later.wait()[0].item() == 7.0);
}

TEST_CASE("a future set by hand gives its value to wait() and value()") {
  auto future = std::make_shared<dist::Future>();
  CHECK_FALSE(future->is_completed());
  future->set_value({tp::full({2}, 3.0), tp::full({1}, 4.0)});
  CHECK(future->is_completed());
  CHECK_FALSE(future->has_error());
  const Value waited = future->wait();
  REQUIRE(waited.size() == 2);
  CHECK(waited[0].to_vector() == std::vector<double>{3.0, 3.0});
  CHECK(only(future->value()) == 3.0);
}

TEST_CASE("value() before the future completed is an error that says to wait()") {
  dist::Future future;
  CHECK_THROWS_WITH_AS(future.value(),
                       Contains("tp::distributed::Future::value: the future has not completed "
                                "yet; call wait()"),
                       tp::DistributedError);
}

TEST_CASE("wait() blocks until another thread sets the value") {
  auto future = std::make_shared<dist::Future>();
  std::thread setter([future] {
    std::this_thread::sleep_for(milliseconds(50));
    future->set_value({tp::full({1}, 7.0)});
  });
  CHECK(only(future->wait()) == 7.0);
  setter.join();
}

TEST_CASE("a chain of three then() callbacks runs in order on the completing thread") {
  // 1, then +1, *2 (as +2 on 2), +3: 1 + 1 + 2 + 3 = 7 at the end; each link
  // holds the running sum.
  auto root = std::make_shared<dist::Future>();
  std::vector<std::thread::id> ran_on;
  auto record = [&ran_on](dist::Future::Callback step) {
    return [&ran_on, step](dist::Future& parent) {
      ran_on.push_back(std::this_thread::get_id());
      return step(parent);
    };
  };
  auto first = root->then(record(plus(1)));
  auto second = first->then(record(plus(2)));
  auto third = second->then(record(plus(3)));
  CHECK_FALSE(third->is_completed());
  std::thread::id completer;
  std::thread thread([&] {
    completer = std::this_thread::get_id();
    root->set_value({tp::full({1}, 1.0)});
  });
  thread.join();
  CHECK(only(first->wait()) == 2.0);
  CHECK(only(second->wait()) == 4.0);
  CHECK(only(third->wait()) == 7.0);
  REQUIRE(ran_on.size() == 3);
  for (const auto& id : ran_on) CHECK(id == completer);
}

TEST_CASE("callbacks on one future run in the order they were added") {
  dist::Future future;
  std::vector<int> order;
  for (int i = 0; i < 4; ++i) {
    future.then([&order, i](dist::Future&) -> Value {
      order.push_back(i);
      return {};
    });
  }
  future.set_value({});
  CHECK(order == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("an exception in a callback fails the chained future and reaches wait() down the chain") {
  auto root = std::make_shared<dist::Future>();
  auto failing = root->then([](dist::Future&) -> Value {
    throw std::runtime_error("the hook found a NaN");
  });
  auto after = failing->then(plus(1));  // reads parent.value(), which rethrows
  root->set_value({tp::full({1}, 1.0)});
  CHECK(failing->has_error());
  CHECK_THROWS_WITH_AS(failing->wait(), "the hook found a NaN", std::runtime_error);
  CHECK_THROWS_WITH_AS(after->wait(), "the hook found a NaN", std::runtime_error);
  CHECK_THROWS_WITH_AS(after->value(), "the hook found a NaN", std::runtime_error);
  CHECK(only(root->wait()) == 1.0);  // the parent is not affected
}

TEST_CASE("a future set with an error fails every callback that reads its value") {
  auto root = std::make_shared<dist::Future>();
  auto chained = root->then(plus(1));
  root->set_error(std::make_exception_ptr(tp::TimeoutError("allreduce #1 timed out")));
  CHECK_THROWS_WITH_AS(root->wait(), "allreduce #1 timed out", tp::TimeoutError);
  CHECK_THROWS_WITH_AS(chained->wait(), "allreduce #1 timed out", tp::TimeoutError);
}

TEST_CASE("a callback added to a completed future runs at once, on the calling thread") {
  auto future = std::make_shared<dist::Future>();
  future->set_value({tp::full({1}, 5.0)});
  std::thread::id ran_on;
  auto chained = future->then([&ran_on](dist::Future& parent) -> Value {
    ran_on = std::this_thread::get_id();
    return {tp::full({1}, only(parent.value()) * 2)};
  });
  CHECK(chained->is_completed());  // before then() returned
  CHECK(ran_on == std::this_thread::get_id());
  CHECK(only(chained->value()) == 10.0);
}

TEST_CASE("completing a future twice is an error naming how it was completed") {
  dist::Future with_value;
  with_value.set_value({tp::full({1}, 1.0)});
  CHECK_THROWS_WITH_AS(with_value.set_value({}),
                       "tp::distributed::Future::set_value: the future was already completed "
                       "with a value; a future is completed once: make a new one for each "
                       "result, or check is_completed() first",
                       tp::DistributedError);
  CHECK(only(with_value.value()) == 1.0);  // the first value stays

  dist::Future with_error;
  with_error.set_error(std::make_exception_ptr(std::runtime_error("lost")));
  CHECK_THROWS_WITH_AS(with_error.set_value({}),
                       Contains("already completed with an error (lost)"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(with_error.set_error(std::make_exception_ptr(std::runtime_error("x"))),
                       Contains("Future::set_error: the future was already completed with an "
                                "error (lost)"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::Future().set_error(nullptr),
                       Contains("Future::set_error: the error is null"), tp::DistributedError);
}

TEST_CASE("a future destroyed before it completed fails the futures chained to it") {
  auto parent = std::make_shared<dist::Future>();
  auto chained = parent->then(plus(1));
  parent.reset();
  CHECK_THROWS_WITH_AS(chained->wait(),
                       Contains("the future this one was chained to with then() was destroyed "
                                "before it completed"),
                       tp::DistributedError);
}

// ---- Work::get_future, with a thread of the test finishing the work ------------

TEST_CASE("a Work's future completes with its outputs when the work finishes, on that thread") {
  dist::Work work("allreduce", 1, 0);
  tp::Tensor out = tp::full({2}, 6.0);
  work.set_outputs({out});
  auto future = work.get_future();
  CHECK(work.get_future() == future);  // one future per work
  std::thread::id ran_on;
  auto halved = future->then([&ran_on](dist::Future& parent) -> Value {
    ran_on = std::this_thread::get_id();
    tp::Tensor t = parent.value()[0];
    t.div_(2.0);  // in place, as the default hook divides the bucket
    return {t};
  });
  std::thread::id finisher;
  std::thread comm([&] {
    finisher = std::this_thread::get_id();
    work.finish();
  });
  comm.join();
  CHECK(ran_on == finisher);
  CHECK(halved->wait()[0].to_vector() == std::vector<double>{3.0, 3.0});
  CHECK(out.to_vector() == std::vector<double>{3.0, 3.0});  // the output, in place
}

TEST_CASE("a Work's future fails with the error that wait() throws") {
  dist::Work work("allreduce", 4, 1);
  work.set_outputs({tp::ones({1})});
  auto chained = work.get_future()->then(plus(1));
  work.finish(std::make_exception_ptr(tp::TimeoutError("allreduce #4 on rank 1 timed out")));
  CHECK_THROWS_WITH_AS(work.wait(), "allreduce #4 on rank 1 timed out", tp::TimeoutError);
  CHECK_THROWS_WITH_AS(chained->wait(), "allreduce #4 on rank 1 timed out", tp::TimeoutError);
}

TEST_CASE("get_future on a finished work gives a completed future") {
  dist::Work work("broadcast", 2, 0);
  work.set_outputs({tp::full({1}, 9.0)});
  work.finish();
  auto future = work.get_future();
  CHECK(future->is_completed());
  CHECK(only(future->value()) == 9.0);
}

TEST_CASE("get_future on a work without outputs says which collective and why") {
  dist::Work work("allreduce", 3, 1);
  CHECK_THROWS_WITH_AS(work.get_future(),
                       Contains("tp::distributed::Work::get_future: allreduce #3 on rank 1 has "
                                "no future: its process group did not give it its output "
                                "tensors"),
                       tp::DistributedError);
}

TEST_CASE("waiting for an unfinished collective inside a callback is an error, not a hang") {
  dist::Work first("allreduce", 1, 0);
  dist::Work second("allreduce", 2, 0);
  first.set_outputs({});
  auto chained = first.get_future()->then([&second](dist::Future&) -> Value {
    second.wait();  // the communication thread would run #2 only after this returns
    return {};
  });
  std::thread comm([&] { first.finish(); });
  comm.join();
  CHECK_THROWS_WITH_AS(chained->wait(),
                       Contains("tp::distributed::Work::wait: allreduce #2 on rank 0 is waited "
                                "for inside a future's callback"),
                       tp::DistributedError);
  second.finish();
  CHECK_NOTHROW(second.wait());  // outside a callback, wait() is fine
}

// ---- over Gloo, on spawned ranks --------------------------------------------------

TEST_CASE("an all-reduce's future, divided by W in a callback, is the mean (W+1)/2 at W = 1, 2 and 4") {
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    CHECK_NOTHROW(run_world(world, [](int rank, int w) {
      tp::trace::enable(rank);
      // The other ranks join late, so on rank 0 the callback is added
      // before the collective can finish (else it would run on this thread).
      if (rank != 0) std::this_thread::sleep_for(milliseconds(200));
      tp::Tensor t = tp::full({3}, rank + 1.0);
      auto work = dist::all_reduce(t, dist::ReduceOp::SUM, true);
      // The default DDP hook: fut.then(lambda f: f.value()[0].div_(world_size)).
      auto mean = work->get_future()->then([w](dist::Future& f) -> Value {
        tp::trace::instant("hook", "test");
        tp::Tensor reduced = f.value()[0];
        reduced.div_(w);
        return {reduced};
      });
      const Value value = mean->wait();
      expect_all(value.at(0), (w + 1) / 2.0, "the chained value");
      work->wait();
      expect_all(t, (w + 1) / 2.0, "the all-reduced tensor, divided in place");
      tp::trace::disable();
      if (rank != 0 || w == 1) return;  // at W = 1 the collective may finish first
      // Where the callback ran: the thread that ran the collective's span.
      int comm_tid = -1;
      int hook_tid = -2;
      std::string hook_thread;
      for (const auto& ev : tp::trace::events()) {
        if (ev.phase == 'X' && ev.name == "allreduce") comm_tid = ev.tid;
        if (ev.name == "hook") {
          hook_tid = ev.tid;
          hook_thread = ev.thread;
        }
      }
      if (hook_tid != comm_tid || hook_thread != "comm") {
        throw tp::Error("the callback ran on thread " + std::to_string(hook_tid) + " (\"" +
                        hook_thread + "\"), not on the communication thread " +
                        std::to_string(comm_tid));
      }
    }));
  }
}

TEST_CASE("in checker mode, a future's callback reads the result before anyone waited") {
  tp::TempDir dir("tp-future-checker");
  const std::string path = dir.path();
  CHECK_NOTHROW(mp::spawn(
      [&path](int rank) {
        dist::ProcessGroupGloo group(path, rank, 2, dist::GlooOptions{kCollectiveTimeout, true});
        tp::Tensor t = tp::full({4}, rank + 1.0);
        auto work = group.allreduce(t);
        auto seen = work->get_future()->then([](dist::Future& f) -> Value {
          return {f.value()[0].clone()};  // what the tensor holds when the callback runs
        });
        expect_all(seen->wait().at(0), 3.0, "the tensor as the callback saw it (1 + 2)");
        work->wait();  // the check already ran; this wait() changes nothing
        expect_all(t, 3.0, "the tensor after wait()");
        // The claim was released at the future's completion: the tensor is free.
        group.allreduce(t)->wait();
        expect_all(t, 6.0, "a second all-reduce on the same tensor");
      },
      2));
}

TEST_CASE("a rank that leaves fails the future with the error naming the collective, at once") {
  const auto start = std::chrono::steady_clock::now();
  CHECK_NOTHROW(run_world(
      2,
      [](int rank, int) {
        if (rank != 0) return;  // leaves without the all-reduce
        tp::Tensor t = tp::ones({4});
        auto work = dist::all_reduce(t, dist::ReduceOp::SUM, true);
        auto chained = work->get_future()->then(plus(1));
        std::string error;
        try {
          chained->wait();
        } catch (const tp::PeerFailedError& e) {
          error = e.what();
        }
        if (error.find("allreduce #1 on rank 0 failed") == std::string::npos) {
          throw tp::Error("expected the chained future to fail naming allreduce #1 on rank 0, "
                          "got: \"" + error + "\"");
        }
      },
      kShortTimeout));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 15.0);  // noticed, not waited out
}
