// The error hierarchy and the CHECK macros: what a student sees when
// something is wrong must name the cause, the values and the line.
#include <doctest/doctest.h>

#include <string>

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
  CHECK_THROWS_AS(throw tp::Error("x"), std::runtime_error);
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
