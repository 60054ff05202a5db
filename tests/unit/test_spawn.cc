// tp::multiprocessing::spawn: payloads come back in rank order, and every way
// a rank can fail (exception, abort, exit code, early exit, hang) becomes one
// SpawnError that names the rank and the cause, quickly.
//
// Children cannot use doctest macros (doctest's state lives in the parent and
// is not shared across fork); they report by returning a string or throwing.
#include <doctest/doctest.h>

#include "test_util.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/util/temp_dir.h"

namespace mp = tp::multiprocessing;
using doctest::Contains;
using std::chrono::milliseconds;

namespace {

// Long enough that only spawn can end it: a test that waits this long failed.
void sleep_forever() { std::this_thread::sleep_for(std::chrono::seconds(600)); }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Cross-process signalling through a directory: one rank raises a flag, a
// rank that must act after it waits for the flag. Ordering by events, not by
// sleeps that a loaded machine can stretch.
void raise_flag(const std::string& dir, const std::string& name) {
  std::ofstream(dir + "/" + name).put('x');
}

void wait_for_flag(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  const auto start = std::chrono::steady_clock::now();
  while (::access(path.c_str(), F_OK) != 0) {
    if (seconds_since(start) > 60) throw tp::Error("no flag " + name + " after 60 s");
    std::this_thread::sleep_for(milliseconds(1));
  }
}

using test_util::spawn_error_of;

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
  static_assert(std::is_same_v<decltype(payloads), const std::vector<std::string>>);
  CHECK(payloads == std::vector<std::string>(3));
}

TEST_CASE("spawn returns the doubles the ranks return, bit for bit") {
  // Values whose decimal text would lose bits or signs: 0.1 is not a short
  // binary fraction, -0.0 == 0.0, a NaN has a payload and equals nothing.
  const double quiet_nan_with_payload = std::bit_cast<double>(uint64_t{0x7ff8000000000123});
  const std::vector<double> sent = {0.1,
                                    -0.0,
                                    1.0 / 3.0,
                                    -std::numeric_limits<double>::infinity(),
                                    std::numeric_limits<double>::denorm_min(),
                                    std::numeric_limits<double>::max(),
                                    quiet_nan_with_payload};
  const auto got = mp::spawn([&sent](int rank) { return sent[rank]; },
                             static_cast<int>(sent.size()));
  static_assert(std::is_same_v<decltype(got), const std::vector<double>>);
  REQUIRE(got.size() == sent.size());
  for (std::size_t r = 0; r < sent.size(); ++r) {
    CAPTURE(r);
    CHECK(std::bit_cast<uint64_t>(got[r]) == std::bit_cast<uint64_t>(sent[r]));
  }
}

TEST_CASE("spawn returns integers, floats and bools the ranks return, exactly") {
  const auto big = mp::spawn(
      [](int rank) {
        return rank == 0 ? std::numeric_limits<int64_t>::min()
                         : std::numeric_limits<int64_t>::max();
      },
      2);
  CHECK(big == std::vector<int64_t>{std::numeric_limits<int64_t>::min(),
                                    std::numeric_limits<int64_t>::max()});
  const auto floats = mp::spawn([](int rank) { return rank == 0 ? 0.1f : -0.0f; }, 2);
  static_assert(std::is_same_v<decltype(floats), const std::vector<float>>);
  CHECK(std::bit_cast<uint32_t>(floats[0]) == std::bit_cast<uint32_t>(0.1f));
  CHECK(std::bit_cast<uint32_t>(floats[1]) == std::bit_cast<uint32_t>(-0.0f));
  const auto odd = mp::spawn([](int rank) { return rank % 2 == 1; }, 3);
  CHECK(odd == std::vector<bool>{false, true, false});
  const auto ranks = mp::spawn([](int rank, int offset) { return rank + offset; }, 3, 10);
  CHECK(ranks == std::vector<int>{10, 11, 12});
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
  mp::set_rank_waiting("outside spawn this is a no-op");  // must not crash
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
  const mp::SpawnError e = spawn_error_of(job);
  CHECK(e.rank() == 2);
  CHECK(e.kind() == tp::ErrorKind::Timeout);  // the kind of what rank 2 threw
}

TEST_CASE("SpawnError's kind is the blamed failure's: Stub, Cause, Consequence or Timeout") {
  const auto kind_when_rank_0 = [](auto fail) {
    return spawn_error_of([&] {
             mp::spawn(
                 [&](int rank) {
                   if (rank == 0) fail();
                 },
                 2);
           })
        .kind();
  };
  CHECK(kind_when_rank_0([] { throw tp::NotImplemented("stage 01: f is not implemented yet"); }) ==
        tp::ErrorKind::Stub);
  CHECK(kind_when_rank_0([] { throw tp::Error("boom"); }) == tp::ErrorKind::Cause);
  CHECK(kind_when_rank_0([] { throw std::runtime_error("not a tp::Error"); }) ==
        tp::ErrorKind::Cause);
  CHECK(kind_when_rank_0([] { throw 42; }) == tp::ErrorKind::Cause);
  CHECK(kind_when_rank_0([] { std::abort(); }) == tp::ErrorKind::Cause);
  CHECK(kind_when_rank_0([] { ::_exit(3); }) == tp::ErrorKind::Cause);
  // Blamed only because nobody else failed; its kind still says so.
  CHECK(kind_when_rank_0([] { throw tp::PeerFailedError("allreduce #1 on rank 0 failed"); }) ==
        tp::ErrorKind::Consequence);
}

TEST_CASE("a rank's own failure is blamed before an earlier failure that blames another rank") {
  // Rank 0 reports first, with a PeerFailedError whose text matches nothing
  // spawn could look for; rank 1's plain error comes after it. The kind, not
  // the time or the text, decides.
  tp::TempDir flags("tp-spawn-kind");
  const std::string dir = flags.path();
  const mp::SpawnError e = spawn_error_of([&] {
    mp::spawn(
        [&dir](int rank) {
          if (rank == 0) {
            struct RaiseFlagWhenUnwinding {
              std::string dir;
              ~RaiseFlagWhenUnwinding() { raise_flag(dir, "peer-failed"); }
            } flag{dir};
            throw tp::PeerFailedError("allreduce #1 on rank 0: rank 1 went away");
          }
          wait_for_flag(dir, "peer-failed");
          throw tp::Error("rank 1's own failure");
        },
        2);
  });
  CHECK(e.rank() == 1);
  CHECK(e.kind() == tp::ErrorKind::Cause);
  CHECK(std::string(e.what()).find("rank 1 failed: tp::Error: rank 1's own failure") !=
        std::string::npos);
}

TEST_CASE("the earliest throw is blamed, even if that rank takes longer to unwind") {
  // Rank 0 throws first, then spends 100 ms unwinding; rank 1 throws after
  // rank 0's throw but reports first. Times are taken at the throw, so rank 0
  // is blamed; timed at the catch, rank 1 would be.
  tp::TempDir flags("tp-spawn-time");
  const std::string dir = flags.path();
  CHECK_THROWS_WITH_AS(mp::spawn(
                           [&dir](int rank) {
                             if (rank == 0) {
                               struct SlowToUnwind {
                                 std::string dir;
                                 ~SlowToUnwind() {
                                   raise_flag(dir, "thrown");
                                   std::this_thread::sleep_for(milliseconds(100));
                                 }
                               } slow{dir};
                               throw tp::Error("first");
                             }
                             wait_for_flag(dir, "thrown");
                             throw tp::Error("second");
                           },
                           2),
                       Contains("rank 0 failed: tp::Error: first"), mp::SpawnError);
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
  tp::TempDir flags("tp-spawn-sigterm");
  const std::string dir = flags.path();
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(mp::spawn(
                           options,
                           [&dir](int rank) {
                             if (rank == 0) {
                               // Fail only once rank 1 surely ignores SIGTERM.
                               wait_for_flag(dir, "ignoring-sigterm");
                               throw tp::Error("boom");
                             }
                             ::signal(SIGTERM, SIG_IGN);
                             raise_flag(dir, "ignoring-sigterm");
                             sleep_forever();
                           },
                           2),
                       Contains("rank 0 failed: tp::Error: boom"), mp::SpawnError);
  // Rank 1 outlived SIGTERM, so spawn waited the whole grace period; it
  // ended long before its 600 s sleep, so SIGKILL came after it.
  CHECK(seconds_since(start) >= 0.3);
  CHECK(seconds_since(start) < 20.0);
}

TEST_CASE("spawn turns a hang into a SpawnError naming the ranks still running and their status") {
  mp::SpawnOptions options;
  // Rank 1 must have finished and rank 0 set its status by then: each takes
  // milliseconds, so 3 s is ample even on a loaded machine.
  options.timeout = milliseconds(3000);
  const auto start = std::chrono::steady_clock::now();
  const mp::SpawnError e = spawn_error_of([&] {
    mp::spawn(
        options,
        [](int rank) {
          if (rank == 1) return;  // finishes; ranks 0 and 2 hang
          if (rank == 0) {
            mp::set_rank_waiting("broadcast #1");
            mp::set_rank_waiting("");
            mp::set_rank_waiting("allreduce #3");
          }
          sleep_forever();
        },
        3);
  });
  CHECK(seconds_since(start) < 20.0);
  const std::string what = e.what();
  CHECK(what.find("no rank made progress for 3000 ms") != std::string::npos);
  CHECK(e.rank() == -1);
  CHECK(e.kind() == tp::ErrorKind::Timeout);
  CHECK(what.find("still running: rank 0 (waiting in allreduce #3), "
                  "rank 2 (not in a collective (none finished yet))") != std::string::npos);
  CHECK(what.find("already finished: rank 1") != std::string::npos);
  CHECK(what.find("skipped a collective") != std::string::npos);
}

TEST_CASE("a job that keeps making progress runs past SpawnOptions::timeout") {
  // The demo's 20000 steps take minutes: only a job without progress is a
  // hang. Each rank makes progress every 50 ms for 4 s, well past the 1.5 s
  // limit; the limit leaves room for a rank starved of the CPU for a second
  // on a loaded 2-core machine (500 ms did not: seen failing under load).
  mp::SpawnOptions options;
  options.timeout = milliseconds(1500);
  const auto start = std::chrono::steady_clock::now();
  const auto payloads = mp::spawn(
      options,
      [](int rank) {
        for (int i = 0; i < 40; ++i) {
          mp::set_rank_waiting("allreduce #" + std::to_string(i));
          std::this_thread::sleep_for(milliseconds(50));
          mp::set_rank_waiting("");
          std::this_thread::sleep_for(milliseconds(50));
        }
        return std::to_string(rank);
      },
      2);
  CHECK(payloads == std::vector<std::string>{"0", "1"});
  CHECK(seconds_since(start) >= 4.0);
}

TEST_CASE("a job where no rank is in a collective times out saying every rank was computing") {
  mp::SpawnOptions options;
  options.timeout = milliseconds(500);
  const mp::SpawnError e = spawn_error_of([&] { mp::spawn(options, [](int) { sleep_forever(); }, 2); });
  CHECK(std::string(e.what()).find("No rank was in a collective") != std::string::npos);
}

TEST_CASE("a collective timeout says where the other ranks were: stopped, or returned") {
  mp::SpawnOptions options;
  options.kill_grace = milliseconds(300);
  SUBCASE("a rank stopped by SIGSTOP") {
    const mp::SpawnError e = spawn_error_of([&] {
      mp::spawn(
          options,
          [](int rank) {
            if (rank == 1) {
              mp::set_rank_waiting("allreduce #1");
              mp::set_rank_waiting("");
              ::raise(SIGSTOP);  // as `kill -STOP`, or a debugger's breakpoint
            }
            mp::set_rank_waiting("allreduce #2");
            // Rank 1 stops meanwhile; ample time even for a rank starved of
            // the CPU on a loaded machine.
            std::this_thread::sleep_for(milliseconds(1500));
            throw tp::TimeoutError("allreduce #2 on rank 0 timed out");
          },
          2);
    });
    CHECK(e.rank() == 0);
    CHECK_MESSAGE(std::string(e.what()).find(
                      "meanwhile: rank 1 was stopped (SIGSTOP), not in a collective "
                      "(last: allreduce #1)") != std::string::npos,
                  e.what());
    // The cause first: rank 0 only waited for it.
    CHECK_MESSAGE(std::string(e.what()).rfind(
                      "tp::multiprocessing::spawn: rank 1 is the likely cause: it was stopped "
                      "(SIGSTOP), not in a collective (last: allreduce #1), while rank 0 "
                      "waited for it\n  rank 0 failed: ", 0) == 0,
                  e.what());
  }
  SUBCASE("a rank that returned while the other waited") {
    const mp::SpawnError e = spawn_error_of([&] {
      mp::spawn(
          options,
          [](int rank) {
            mp::set_rank_waiting("allreduce #1");
            mp::set_rank_waiting("");
            if (rank == 1) return;  // skipped allreduce #2
            mp::set_rank_waiting("allreduce #2");
            std::this_thread::sleep_for(milliseconds(1000));  // rank 1 returns meanwhile
            throw tp::TimeoutError("allreduce #2 on rank 0 timed out");
          },
          2);
    });
    const std::string what = e.what();
    CHECK(e.rank() == 0);
    CHECK_MESSAGE(what.find("meanwhile: rank 1 had returned (last: allreduce #1)") !=
                      std::string::npos,
                  what);
    CHECK(what.find("did it skip some") != std::string::npos);
    CHECK_MESSAGE(what.rfind("tp::multiprocessing::spawn: rank 1 is the likely cause: it had "
                             "returned (last: allreduce #1) while rank 0 waited in a "
                             "collective for it", 0) == 0,
                  what);
  }
  // Rank 1 waits in barrier #4 where the others wait in allreduce #4; rank 0
  // times out in it first. Among 3 ranks rank 1 is the odd one; between 2,
  // neither is.
  const auto barrier_against_allreduce = [&options](int world) {
    return spawn_error_of([&] {
      mp::spawn(
          options,
          [](int rank) {
            mp::set_rank_waiting(rank == 1 ? "barrier #4" : "allreduce #4");
            std::this_thread::sleep_for(milliseconds(rank == 0 ? 300 : 30000));
            mp::set_rank_waiting("");  // as a wait that timed out: its collective is the last
            throw tp::TimeoutError("allreduce #4 on rank 0 timed out");
          },
          world);
    });
  };
  SUBCASE("one rank of three issued another collective under the same number") {
    const mp::SpawnError e = barrier_against_allreduce(3);
    const std::string what = e.what();
    CHECK(e.rank() == 0);
    CHECK_MESSAGE(what.rfind("tp::multiprocessing::spawn: rank 1 is the likely cause: it "
                             "issued barrier as #4 where ranks 0 and 2 issued allreduce", 0) == 0,
                  what);
  }
  SUBCASE("two ranks that issued different collectives: neither is singled out") {
    const mp::SpawnError e = barrier_against_allreduce(2);
    CHECK_MESSAGE(std::string(e.what()).find("likely cause") == std::string::npos, e.what());
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
