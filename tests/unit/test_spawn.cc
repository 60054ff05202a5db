// tp::multiprocessing::spawn: payloads come back in rank order, and every way
// a rank can fail (exception, abort, exit code, early exit, hang) becomes one
// SpawnError that names the rank and the cause, quickly.
//
// Children cannot use doctest macros (doctest's state lives in the parent and
// is not shared across fork); they report by returning a string or throwing.
#include <doctest/doctest.h>

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/spawn.h"

namespace mp = tp::multiprocessing;
using doctest::Contains;
using std::chrono::milliseconds;

namespace {

// Long enough that only spawn can end it: a test that waits this long failed.
void sleep_forever() { std::this_thread::sleep_for(std::chrono::seconds(600)); }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("spawn returns each rank's payload in rank order") {
  const auto payloads = mp::spawn(
      [](int rank, const std::string& greeting) {
        return greeting + " from rank " + std::to_string(rank);
      },
      4, std::string("hello"));
  REQUIRE(payloads.size() == 4);
  for (int r = 0; r < 4; ++r) {
    CHECK(payloads[r] == "hello from rank " + std::to_string(r));
  }
}

TEST_CASE("spawn returns empty payloads for a function that returns void") {
  const auto payloads = mp::spawn([](int) {}, 3);
  CHECK(payloads == std::vector<std::string>(3));
}

TEST_CASE("spawn carries payloads larger than a pipe buffer without blocking a rank") {
  // 1 MiB per rank: far more than the 64 KiB a pipe holds, so a parent that
  // only read after waitpid() would deadlock here.
  const std::size_t bytes = 1 << 20;
  const auto payloads = mp::spawn(
      [bytes](int rank) { return std::string(bytes, static_cast<char>('a' + rank)); }, 4);
  for (int r = 0; r < 4; ++r) {
    CHECK(payloads[r] == std::string(bytes, static_cast<char>('a' + r)));
  }
}

TEST_CASE("current_rank is the rank inside spawn and -1 outside") {
  CHECK(mp::current_rank() == -1);
  const auto payloads = mp::spawn([](int) { return std::to_string(mp::current_rank()); }, 3);
  CHECK(payloads == std::vector<std::string>{"0", "1", "2"});
  mp::set_rank_status("outside spawn this is a no-op");  // must not crash
}

TEST_CASE("spawn rethrows an exception from rank 2 of 4 with the rank, the type and the message") {
  auto job = [] {
    mp::spawn(
        [](int rank) {
          if (rank == 2) throw tp::TimeoutError("allreduce #3 on rank 2 timed out");
        },
        4);
  };
  CHECK_THROWS_WITH_AS(
      job(),
      Contains("rank 2 failed: tp::TimeoutError: allreduce #3 on rank 2 timed out"),
      mp::SpawnError);
  try {
    job();
  } catch (const mp::SpawnError& e) {
    CHECK(e.rank() == 2);
  }
}

TEST_CASE("spawn names the signal of a rank that aborts") {
  CHECK_THROWS_WITH_AS(mp::spawn(
                           [](int rank) {
                             if (rank == 1) std::abort();
                           },
                           2),
                       Contains("rank 1 failed: killed by signal 6 (Aborted)"),
                       mp::SpawnError);
}

TEST_CASE("spawn reports the exit code of a rank that exits non-zero") {
  CHECK_THROWS_WITH_AS(mp::spawn(
                           [](int rank) {
                             if (rank == 0) ::_exit(3);
                           },
                           2),
                       Contains("rank 0 failed: exited with code 3"), mp::SpawnError);
}

TEST_CASE("spawn treats a rank that calls exit(0) before returning as failed") {
  CHECK_THROWS_WITH_AS(mp::spawn(
                           [](int rank) {
                             if (rank == 1) std::exit(0);
                           },
                           2),
                       Contains("rank 1 failed: exited without reporting a result"),
                       mp::SpawnError);
}

TEST_CASE("spawn ends surviving ranks within seconds when one rank fails") {
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(mp::spawn(
                           [](int rank) {
                             if (rank == 2) throw tp::Error("boom");
                             sleep_forever();
                           },
                           4),
                       Contains("rank 2 failed: tp::Error: boom"), mp::SpawnError);
  // The survivors die on SIGTERM at once; 20 s leaves room for a loaded CI
  // machine and still fails long before the 600 s sleep would end.
  CHECK(seconds_since(start) < 20.0);
}

TEST_CASE("spawn kills a rank that ignores SIGTERM after the grace period") {
  mp::SpawnOptions options;
  options.kill_grace = milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(mp::spawn(
                           options,
                           [](int rank) {
                             if (rank == 0) {
                               std::this_thread::sleep_for(milliseconds(100));
                               throw tp::Error("boom");
                             }
                             ::signal(SIGTERM, SIG_IGN);
                             sleep_forever();
                           },
                           2),
                       Contains("rank 0 failed: tp::Error: boom"), mp::SpawnError);
  CHECK(seconds_since(start) < 20.0);
}

TEST_CASE("spawn turns a hang into a SpawnError naming the ranks still running and their status") {
  mp::SpawnOptions options;
  options.timeout = milliseconds(1500);
  auto job = [&] {
    mp::spawn(
        options,
        [](int rank) {
          if (rank == 1) return;  // finishes; ranks 0 and 2 hang
          if (rank == 0) mp::set_rank_status("waiting in allreduce #3");
          sleep_forever();
        },
        3);
  };
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(job(), Contains("timed out after 1500 ms"), mp::SpawnError);
  CHECK(seconds_since(start) < 20.0);
  try {
    job();
  } catch (const mp::SpawnError& e) {
    const std::string what = e.what();
    CHECK(e.rank() == -1);
    CHECK(what.find("still running: rank 0 (waiting in allreduce #3), "
                    "rank 2 (no collective in progress)") != std::string::npos);
    CHECK(what.find("already finished: rank 1") != std::string::npos);
    CHECK(what.find("skipped a collective") != std::string::npos);
  }
}

TEST_CASE("spawn rejects nprocs below 1 before forking") {
  CHECK_THROWS_WITH_AS(mp::spawn([](int) {}, 0), Contains("nprocs must be >= 1 (got 0)"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(mp::spawn([](int) {}, -2), Contains("nprocs must be >= 1 (got -2)"),
                       tp::Error);
}

TEST_CASE("spawn inside a spawned rank is refused") {
  CHECK_THROWS_WITH_AS(mp::spawn(
                           [](int) {
                             mp::spawn([](int) {}, 1);
                           },
                           1),
                       Contains("spawn is not reentrant"), mp::SpawnError);
}

TEST_CASE("a rank starts with default signal handlers, not the parent's") {
  // doctest installs crash handlers in the parent; a child that inherited
  // them would print a second, confusing report. Here the parent's handler
  // would swallow SIGUSR1; in the child the default action ends the rank.
  struct sigaction previous {};
  struct sigaction swallow {};
  swallow.sa_handler = [](int) {};
  ::sigaction(SIGUSR1, &swallow, &previous);
  CHECK_THROWS_WITH_AS(mp::spawn([](int) { ::raise(SIGUSR1); }, 1),
                       Contains("rank 0 failed: killed by signal 10"), mp::SpawnError);
  ::sigaction(SIGUSR1, &previous, nullptr);
}

TEST_CASE("a rank writing to a closed pipe or socket gets an error, not SIGPIPE") {
  // Gloo writes with writev(); when a peer rank is gone, the healthy rank
  // must see EPIPE (and Gloo an error naming the collective), not die.
  const auto payloads = mp::spawn(
      [](int) {
        int fds[2];
        if (::pipe(fds) != 0) throw tp::Error("pipe failed");
        ::close(fds[0]);
        const ssize_t n = ::write(fds[1], "x", 1);
        const int err = errno;
        ::close(fds[1]);
        return std::string(n < 0 && err == EPIPE ? "EPIPE" : "no error");
      },
      1);
  CHECK(payloads[0] == "EPIPE");
}
