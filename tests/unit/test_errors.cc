// The error hierarchy and the CHECK macros: what a student sees when
// something is wrong must name the cause, the values and the line.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>

#include "tensorplay/error.h"

namespace {

int checked_divide(int a, int b) {
  TP_CHECK_NE(b, 0, "checked_divide: b must not be zero");
  return a / b;
}

}  // namespace

TEST_CASE("every kit error is a tp::Error and a std::runtime_error") {
  CHECK_THROWS_AS(throw tp::NotImplemented("x"), tp::Error);
  CHECK_THROWS_AS(throw tp::DistributedError("x"), tp::Error);
  CHECK_THROWS_AS(throw tp::TimeoutError("x"), tp::DistributedError);
  CHECK_THROWS_AS(throw tp::PeerFailedError("x"), tp::DistributedError);
  CHECK_THROWS_AS(throw tp::Error("x"), std::runtime_error);
}

TEST_CASE("an error's kind is Cause unless its class means a stub, a timeout or a peer's failure") {
  CHECK(tp::Error("x").kind() == tp::ErrorKind::Cause);
  CHECK(tp::DistributedError("x").kind() == tp::ErrorKind::Cause);
  CHECK(tp::NotImplemented("x").kind() == tp::ErrorKind::Stub);
  CHECK(tp::TimeoutError("x").kind() == tp::ErrorKind::Timeout);
  CHECK(tp::PeerFailedError("x").kind() == tp::ErrorKind::Consequence);
  CHECK(std::string(tp::to_string(tp::ErrorKind::Consequence)) == "Consequence");
}

TEST_CASE("an error's time is the steady clock when it was thrown, not when it was caught") {
  // An object whose destructor is slow stands for a long unwinding (a
  // process group draining its queue): the catch runs 50 ms after the throw.
  struct SlowToUnwind {
    ~SlowToUnwind() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }
  };
  const auto steady_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  const int64_t before = steady_ns();
  try {
    SlowToUnwind slow;
    TP_THROW(tp::TimeoutError, "allreduce #1 on rank 0 timed out");
  } catch (const tp::Error& e) {
    const int64_t caught = steady_ns();
    CHECK(before <= e.time_ns());
    CHECK(e.time_ns() + 50'000'000 <= caught);  // sleep_for sleeps at least 50 ms
  }
}

TEST_CASE("kind and time survive a copy, slicing to tp::Error and an exception_ptr") {
  const tp::PeerFailedError original("allreduce #2 on rank 1 failed");
  const tp::Error sliced = original;
  CHECK(sliced.kind() == tp::ErrorKind::Consequence);
  CHECK(sliced.time_ns() == original.time_ns());
  try {
    std::rethrow_exception(std::make_exception_ptr(original));
  } catch (const tp::Error& e) {
    CHECK(e.kind() == tp::ErrorKind::Consequence);
    CHECK(e.time_ns() == original.time_ns());
  }
}

TEST_CASE("TP_CHECK puts the caller's message first and records the expression and line") {
  try {
    TP_CHECK(1 + 1 == 3, "arithmetic is broken: ", 42);
    FAIL("TP_CHECK did not throw");
  } catch (const tp::Error& e) {
    const std::string what = e.what();
    CHECK(what.rfind("arithmetic is broken: 42", 0) == 0);
    CHECK(what.find("CHECK failed: 1 + 1 == 3") != std::string::npos);
    CHECK(what.find("test_errors.cc:") != std::string::npos);
  }
}

TEST_CASE("TP_CHECK_EQ and friends record both values") {
  CHECK_THROWS_WITH_AS(TP_CHECK_EQ(3, 4, "sizes differ"),
                       doctest::Contains("sizes differ [CHECK failed: 3 == 4 (3 vs 4)"), tp::Error);
  CHECK_THROWS_WITH_AS(TP_CHECK_LT(5, 2, "x"), doctest::Contains("(5 vs 2)"), tp::Error);
  CHECK_THROWS_WITH_AS(TP_CHECK_GE(1, 2, "x"), doctest::Contains("1 >= 2"), tp::Error);
  CHECK_THROWS_WITH_AS(checked_divide(1, 0), doctest::Contains("b must not be zero"), tp::Error);
}

TEST_CASE("a passing check evaluates its operands once and does not throw") {
  int calls = 0;
  auto next = [&] { return ++calls; };
  CHECK_NOTHROW(TP_CHECK_EQ(next(), 1, "first call returns 1"));
  CHECK(calls == 1);
  CHECK(checked_divide(6, 3) == 2);
}

TEST_CASE("TP_THROW builds the message from its parts and throws the named type") {
  CHECK_THROWS_WITH_AS(TP_THROW(tp::DistributedError, "rank ", 3, " of ", 4, " failed"),
                       "rank 3 of 4 failed", tp::DistributedError);
}
