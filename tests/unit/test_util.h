// Helpers shared by the doctest suites in tests/unit/.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensorplay/distributed/init.h"
#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/tensor.h"
#include "tensorplay/util/temp_dir.h"

namespace test_util {

// A loopback TCP port that nobody can listen on while this lives: bound,
// never listening, so a connection to it is refused (Linux answers a SYN to
// a bound socket that does not listen with a reset) and no other program
// can take it. (A port bound and released at once, free_port() in
// test_rendezvous.cc, can be taken by another test's Gloo pair in between:
// the suite runs 4 tests at a time.)
class HeldPort {
 public:
  HeldPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      if (fd_ >= 0) ::close(fd_);
      throw std::runtime_error("HeldPort: cannot bind a loopback port");
    }
    port_ = ntohs(addr.sin_port);
  }
  ~HeldPort() { ::close(fd_); }
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;

  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

// The central difference (f(x + eps) - f(x - eps)) / (2 eps) of objective()
// in element j of a contiguous float64 tensor whose data starts at `data`;
// restores the element afterwards.
template <typename Objective>
double central_difference(double* data, int64_t j, Objective&& objective, double eps = 1e-6) {
  const double saved = data[j];
  data[j] = saved + eps;
  const double plus = objective();
  data[j] = saved - eps;
  const double minus = objective();
  data[j] = saved;
  return (plus - minus) / (2 * eps);
}

// Runs job, which must throw SpawnError, and returns the error.
template <typename Job>
tp::multiprocessing::SpawnError spawn_error_of(Job job) {
  try {
    job();
  } catch (const tp::multiprocessing::SpawnError& e) {
    return e;
  }
  throw std::logic_error("the job did not fail");
}

// Runs body(rank) on `world` spawned ranks; the job ends within 60 s.
template <typename Body>
void spawn_ranks(int world, Body body) {
  tp::multiprocessing::SpawnOptions options;
  options.timeout = std::chrono::milliseconds(60000);
  tp::multiprocessing::spawn(options, body, world);
}

// Collective deadline for the tests that expect success: long enough for a
// loaded 2-core machine, short enough that a bug fails the test, not the CI.
inline constexpr std::chrono::milliseconds kCollectiveTimeout{20000};
// Collective deadline for the tests that expect a collective to time out.
// The same deadline bounds the rendezvous and every collective before the one
// that times out: those take about 0.3 s on a loaded 2-core machine, so 4 s
// leaves a wide margin and still keeps each such test quick.
inline constexpr std::chrono::milliseconds kShortTimeout{4000};

// Runs body(rank, world) on `world` spawned ranks that meet in a fresh
// file:// directory through the default group.
template <typename Body>
void run_world(int world, Body body,
               std::chrono::milliseconds collective_timeout = kCollectiveTimeout,
               std::chrono::milliseconds job_timeout = std::chrono::milliseconds(60000)) {
  tp::TempDir dir("tp-world");
  tp::multiprocessing::SpawnOptions options;
  options.timeout = job_timeout;
  tp::multiprocessing::spawn(
      options,
      [&](int rank) {
        tp::distributed::init_process_group("gloo", rank, world, dir.file_init_method(),
                                            collective_timeout);
        body(rank, world);
        tp::distributed::destroy_process_group();
      },
      world);
}

// On the default group: rank r contributes r + 1, so the all-reduced sum
// over W ranks is W (W + 1) / 2 in every element. Throws naming the rank.
inline void check_sum(int rank, int world) {
  tp::Tensor t = tp::full({3}, rank + 1.0);
  tp::distributed::all_reduce(t);
  const double expected = world * (world + 1) / 2.0;
  for (double v : t.to_vector()) {
    TP_CHECK_EQ(v, expected, "allreduce SUM on rank ", rank, " of ", world);
  }
}

// "[1.000000, 2.000000]": values as a message shows them.
inline std::string join(const std::vector<double>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(values[i]);
  }
  return out + "]";
}

// In a spawned rank: throws "<what> on rank r: expected [..], got [..]"
// unless t holds exactly `expected` (callers choose values that every
// dtype and every partial sum represents exactly).
inline void expect_values(const tp::Tensor& t, const std::vector<double>& expected,
                          const std::string& what) {
  const std::vector<double> got = t.to_vector();
  if (got != expected) {
    throw tp::Error(what + " on rank " + std::to_string(tp::multiprocessing::current_rank()) +
                    ": expected " + join(expected) + ", got " + join(got));
  }
}

}  // namespace test_util
