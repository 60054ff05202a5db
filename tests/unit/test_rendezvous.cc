// Rendezvous beyond file://: the TCPStore, env:// and tcp:// on loopback at
// world sizes 1 to 4, a second group from make_process_group, bad input (missing variables, a port in use, a master
// nobody answers for, world sizes that disagree, a rank claimed twice, a rank
// that never arrives), the widened tag fingerprint and the debug mode that
// compares every collective.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tensorplay/distributed/init.h"
#include "tensorplay/distributed/launcher_env.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/distributed/tcp_store.h"
#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/tensor.h"
#include "tensorplay/util/temp_dir.h"
#include "test_util.h"
// Private to the library; tested here because only the NCCL backend uses
// it (init_process_group("nccl", ..., "file://DIR")), which needs a GPU.
#include "../../common/src/distributed/rendezvous/dir_store.h"

namespace dist = tp::distributed;
namespace mp = tp::multiprocessing;
using std::chrono::milliseconds;

namespace {

// Deadline of rendezvous and collectives in the tests that expect success:
// generous for a loaded 2-core machine.
constexpr milliseconds kTimeout{20000};
// Deadline in the tests that expect a rendezvous or collective to fail by
// timing out: the work before it takes well under a second even when loaded.
constexpr milliseconds kShortTimeout{2000};

// doctest's Contains for a message built at run time.
doctest::Contains contains(const std::string& text) {
  return doctest::Contains(doctest::String(text.c_str()));
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

using test_util::HeldPort;

// A TCP port nobody listens on right now: held, then released. Another
// program can take it in between (the suite runs 4 tests at a time, and
// Gloo listens on such ports): use it only for a server the test starts at
// once; a port that must stay unserved is a HeldPort.
int free_port() { return HeldPort().port(); }

// The environment tprun gives a rank (set inside a spawned child only).
void set_rank_environment(const std::string& addr, int port, int rank, int world) {
  ::setenv("MASTER_ADDR", addr.c_str(), 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
}

using test_util::check_sum;
using test_util::spawn_error_of;
using test_util::spawn_ranks;

}  // namespace

// ---- the store ------------------------------------------------------------------

TEST_CASE("TCPStore sets, gets, adds and checks keys between a server and a client") {
  dist::TCPStore server("127.0.0.1", 0, true, kTimeout);
  dist::TCPStore client("127.0.0.1", server.port(), false, kTimeout);
  client.set("greeting", std::string("hi\0there", 8));  // bytes, not C strings
  CHECK(server.get("greeting", kTimeout) == std::string("hi\0there", 8));
  CHECK(server.check({"greeting"}));
  CHECK_FALSE(server.check({"greeting", "absent"}));
  CHECK(client.add("count", 2) == 2);
  CHECK(server.add("count", 3) == 5);
  CHECK(client.add("count", -5) == 0);
  // Several adds in one message, answered in order (the count check's write
  // and read).
  CHECK(client.add_each({{"count", 4}, {"never set", 0}, {"count", 1}}) ==
        std::vector<int64_t>{4, 0, 5});
  // A get that waits: the key appears 100 ms later, from another thread.
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(100));
    server.set("late", "value");
  });
  CHECK(client.get("late", kTimeout) == "value");
  writer.join();
}

TEST_CASE("TCPStore wait and get time out naming the missing keys and the store") {
  dist::TCPStore server("127.0.0.1", 0, true, kTimeout);
  server.set("here", "1");
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(server.wait({"here", "absent"}, milliseconds(300)),
                       contains("the TCP store at 127.0.0.1:" + std::to_string(server.port()) +
                                " still lacks 'absent' after 300 ms"),
                       tp::TimeoutError);
  CHECK(seconds_since(start) < 5.0);
  CHECK_THROWS_WITH_AS(server.get("absent", milliseconds(100)), contains("still lacks 'absent'"),
                       tp::TimeoutError);
}

TEST_CASE("TCPStore reports a port in use, a server nobody runs, and a server that left") {
  dist::TCPStore server("127.0.0.1", 0, true, kTimeout);
  CHECK_THROWS_WITH_AS(dist::TCPStore("127.0.0.1", server.port(), true, kTimeout),
                       contains("cannot listen on port " + std::to_string(server.port()) +
                                ": port " + std::to_string(server.port()) + " is in use"),
                       tp::DistributedError);

  const HeldPort held;  // refused for the whole check, and no one else's
  const int nobody = held.port();
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(dist::TCPStore("127.0.0.1", nobody, false, milliseconds(500)),
                       contains("could not connect to the TCP store at 127.0.0.1:" +
                                std::to_string(nobody) + " within 500 ms (last attempt: "
                                "Connection refused)"),
                       tp::DistributedError);
  CHECK(seconds_since(start) < 5.0);

  auto gone = std::make_unique<dist::TCPStore>("127.0.0.1", 0, true, kTimeout);
  dist::TCPStore client("127.0.0.1", gone->port(), false, kTimeout);
  client.set("k", "v");
  gone.reset();  // the server's process "exits"
  CHECK_THROWS_WITH_AS(client.check({"k"}), contains("lost the TCP store at 127.0.0.1"),
                       tp::PeerFailedError);
}

TEST_CASE("TCPStore turns a server that accepts but never answers into an error, not a hang") {
  // A listening socket nobody serves: the kernel completes the connection,
  // then the request goes unanswered, as when the store's host lost its link.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(fd, 4) == 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  dist::TCPStore client("127.0.0.1", ntohs(addr.sin_port), false, milliseconds(400));
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(client.add("k", 1), contains("did not answer within 400 ms"),
                       tp::DistributedError);
  CHECK(seconds_since(start) < 5.0);
  ::close(fd);
}

// ---- env:// and tcp:// on loopback -----------------------------------------------

TEST_CASE("env:// meets and all-reduces at world sizes 1 to 4, reading the four variables") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    const int port = free_port();
    spawn_ranks(world, [&](int rank) {
      set_rank_environment("127.0.0.1", port, rank, world);
      dist::init_process_group("gloo", "env://", kTimeout);
      TP_CHECK_EQ(dist::get_rank(), rank, "rank from RANK");
      TP_CHECK_EQ(dist::get_world_size(), world, "world size from WORLD_SIZE");
      check_sum(rank, world);
      dist::destroy_process_group();
    });
  }
}

TEST_CASE("env:// under srun reads SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the first host "
          "of SLURM_JOB_NODELIST and SLURM_JOB_ID") {
  const int port = free_port();
  spawn_ranks(3, [&](int rank) {
    // What srun gives task `rank` of 3 (and no RANK, WORLD_SIZE, MASTER_ADDR).
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "TP_JOB_ID"}) {
      ::unsetenv(name);
    }
    ::setenv("SLURM_PROCID", std::to_string(rank).c_str(), 1);
    ::setenv("SLURM_NTASKS", "3", 1);
    ::setenv("SLURM_LOCALID", std::to_string(2 - rank).c_str(), 1);
    ::setenv("SLURM_JOB_NODELIST", "127.0.0.[1-4],gpu[07-08]", 1);
    ::setenv("SLURM_JOB_ID", "4242", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    dist::init_process_group("gloo", "env://", kTimeout);
    TP_CHECK_EQ(dist::get_rank(), rank, "rank from SLURM_PROCID");
    TP_CHECK_EQ(dist::get_world_size(), 3, "world size from SLURM_NTASKS");
    TP_CHECK_EQ(dist::local_rank_from_environment(), 2 - rank, "local rank from SLURM_LOCALID");
    check_sum(rank, 3);
    dist::destroy_process_group();
  });
}

TEST_CASE("a rank of another Slurm job on the same master port is refused, naming both ids") {
  const int port = free_port();
  const mp::SpawnError e = spawn_error_of([&] {
    spawn_ranks(2, [&](int rank) {
      for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "TP_JOB_ID"}) {
        ::unsetenv(name);
      }
      ::setenv("SLURM_PROCID", std::to_string(rank).c_str(), 1);
      ::setenv("SLURM_NTASKS", "2", 1);
      ::setenv("SLURM_NODELIST", "localhost", 1);
      ::setenv("SLURM_JOB_ID", rank == 0 ? "100" : "200", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      dist::init_process_group("gloo", "env://", kShortTimeout);
    });
  });
  const std::string message = e.what();
  CHECK_MESSAGE(message.find("rank 1 failed") != std::string::npos, message);
  CHECK_MESSAGE(message.find("this rank belongs to another job: the store there is rank 0's of a "
                             "job with TP_JOB_ID 'slurm-100', and this rank was started with "
                             "TP_JOB_ID 'slurm-200'") != std::string::npos,
                message);
}

TEST_CASE("the first host of a Slurm host list") {
  using tp::distributed::first_slurm_host;
  CHECK(first_slurm_host("node[01-04,07],gpu5") == "node01");
  CHECK(first_slurm_host("gpu5,node[01-04]") == "gpu5");
  CHECK(first_slurm_host("rack[1-2]-n[3,5-6]") == "rack1-n3");
  CHECK(first_slurm_host("node[7]") == "node7");
  CHECK(first_slurm_host("localhost") == "localhost");
}

TEST_CASE("under env:// the store carries the collective counts: a rank that skips an all-reduce "
          "of the same shape is named at the step's end") {
  const int port = free_port();
  const std::string message = spawn_error_of([&] {
    spawn_ranks(3, [&](int rank) {
      set_rank_environment("127.0.0.1", port, rank, 3);
      dist::init_process_group("gloo", "env://", kTimeout);
      tp::Tensor t = tp::ones({4});
      for (int step = 0; step < 4; ++step) {
        for (int k = 0; k < (rank == 1 && step == 1 ? 1 : 2); ++k) dist::all_reduce(t);
        dist::default_group()->check_collective_count("the end of step " + std::to_string(step));
      }
      dist::destroy_process_group();
    });
  }).what();
  CHECK_MESSAGE(message.find("rank 1 is the likely cause: by the end of step 1 it had issued 3 "
                             "collectives on this group where ranks 0 and 2 had issued 4") !=
                    std::string::npos,
                message);
}

TEST_CASE("tcp://HOST:PORT is env:// with the address inline, at world sizes 1 to 4") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    const std::string method = "tcp://localhost:" + std::to_string(free_port());
    spawn_ranks(world, [&](int rank) {
      ::unsetenv("MASTER_ADDR");
      ::unsetenv("MASTER_PORT");
      dist::init_process_group("gloo", rank, world, method, kTimeout);
      check_sum(rank, world);
      dist::destroy_process_group();
    });
  }
}

TEST_CASE("make_process_group hands each rank a group of its own beside the default one") {
  const std::string method = "tcp://localhost:" + std::to_string(free_port());
  const tp::TempDir second_dir;
  spawn_ranks(3, [&](int rank) {
    dist::init_process_group("gloo", rank, 3, method, kTimeout);
    const std::shared_ptr<dist::ProcessGroup> second =
        dist::make_process_group("gloo", rank, 3, second_dir.file_init_method(), {kTimeout});
    TP_CHECK_EQ(second->rank(), rank, "the second group's rank");
    // 1 + 2 + 3 on the second group, then the same on the default one.
    tp::Tensor t = tp::full({3}, rank + 1.0);
    second->allreduce(t)->wait();
    const double sum = t.to_vector()[0];
    TP_CHECK_EQ(sum, 6.0, "allreduce SUM on the second group");
    check_sum(rank, 3);
    dist::destroy_process_group();
  });
}

TEST_CASE("make_process_group checks its input as init_process_group does, naming itself") {
  const tp::TempDir dir;
  CHECK_THROWS_WITH_AS(dist::make_process_group("mpi", 0, 1, dir.file_init_method()),
                       "tp::distributed::make_process_group: rank 0: unknown backend 'mpi'; "
                       "supported backends: gloo and nccl (CUDA tensors, one GPU per rank, in "
                       "a build with NCCL)",
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::make_process_group("gloo", 2, 2, dir.file_init_method()),
                       "tp::distributed::make_process_group: rank 2 is out of range for "
                       "world_size 2; pass a rank in 0 .. 1",
                       tp::DistributedError);
  CHECK_FALSE(dist::is_initialized());  // a group made here is never the default
}

TEST_CASE("every collective runs under TP_DISTRIBUTED_DEBUG=DETAIL when the ranks agree") {
  const int port = free_port();
  spawn_ranks(3, [&](int rank) {
    ::setenv("TP_DISTRIBUTED_DEBUG", "DETAIL", 1);
    set_rank_environment("127.0.0.1", port, rank, 3);
    dist::init_process_group("gloo", "env://", kTimeout);
    check_sum(rank, 3);
    tp::Tensor b = tp::full({2}, rank == 2 ? 7.0 : 0.0);
    dist::broadcast(b, 2);
    const double broadcast = b.to_vector()[1];  // TP_CHECK_EQ keeps references
    TP_CHECK_EQ(broadcast, 7.0, "broadcast from rank 2");
    std::vector<tp::Tensor> out{tp::zeros({1}), tp::zeros({1}), tp::zeros({1})};
    dist::all_gather(out, tp::full({1}, rank * 10.0));
    const double gathered = out[2].to_vector()[0];
    TP_CHECK_EQ(gathered, 20.0, "allgather");
    dist::barrier();
    dist::destroy_process_group();
  });
}

// ---- bad input ------------------------------------------------------------------------

TEST_CASE("env:// names each missing or malformed variable before waiting for anyone") {
  ::unsetenv("MASTER_ADDR");
  ::setenv("MASTER_PORT", "29500", 1);
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", 0, 2, "env://"),
                       contains("env:// reads MASTER_ADDR from the environment, but it is not "
                                "set (nor is Slurm's SLURM_JOB_NODELIST, SLURM_NODELIST or "
                                "SLURM_LAUNCH_NODE_IPADDR); set MASTER_ADDR on every rank, or "
                                "start the job with tprun"),
                       tp::DistributedError);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "http", 1);
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", 0, 2, "env://"),
                       contains("MASTER_PORT='http' is not a whole number from 1 to 65535"),
                       tp::DistributedError);
  ::setenv("MASTER_PORT", "29500", 1);
  ::unsetenv("WORLD_SIZE");
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", "env://"),
                       contains("reads WORLD_SIZE from the environment, but it is not set"),
                       tp::DistributedError);
  ::setenv("WORLD_SIZE", "4", 1);
  ::unsetenv("RANK");
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", "env://"),
                       contains("reads RANK from the environment, but it is not set"),
                       tp::DistributedError);
  ::setenv("RANK", "4", 1);
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", "env://"),
                       contains("RANK='4' is not a whole number from 0 to 3"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", 0, 2, "tcp://localhost"),
                       contains("init_method 'tcp://localhost' names no host and port; pass "
                                "tcp://HOST:PORT"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", 0, 2, "env://x"),
                       contains("unknown init_method 'env://x'; supported: file://DIR"),
                       tp::DistributedError);
  CHECK_FALSE(dist::is_initialized());
}

TEST_CASE("a rank whose master port is in use fails at once, naming MASTER_PORT") {
  dist::TCPStore squatter("127.0.0.1", 0, true, kTimeout);
  set_rank_environment("127.0.0.1", squatter.port(), 0, 2);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(
      dist::init_process_group("gloo", "env://", kShortTimeout),
      contains("rank 0 of 2, env:// with MASTER_ADDR=127.0.0.1, MASTER_PORT=" +
               std::to_string(squatter.port()) + ": tp::distributed::TCPStore: cannot listen "
               "on port " + std::to_string(squatter.port()) + ": port " +
               std::to_string(squatter.port()) + " is in use"),
      tp::DistributedError);
  CHECK(seconds_since(start) < 1.0);
}

TEST_CASE("a rank whose master never answers fails within its timeout, naming the master") {
  const HeldPort held;  // refused for the whole check, and no one else's
  const int port = held.port();
  set_rank_environment("127.0.0.1", port, 1, 2);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", "env://", kShortTimeout),
                       contains("could not connect to the TCP store at 127.0.0.1:" +
                                std::to_string(port) + " within 2000 ms (last attempt: "
                                "Connection refused); is rank 0 running, and do MASTER_ADDR "
                                "and MASTER_PORT name its machine and port on every rank?"),
                       tp::DistributedError);
  CHECK(seconds_since(start) < 10.0);
  ::setenv("MASTER_ADDR", "no-such-host.invalid", 1);
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", "env://", kShortTimeout),
                       contains("MASTER_ADDR 'no-such-host.invalid' does not resolve"),
                       tp::DistributedError);
}

TEST_CASE("ranks started with different world sizes fail at rendezvous, naming both sizes") {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  const mp::SpawnError e = spawn_error_of([&] {
    spawn_ranks(2, [&](int rank) {
      set_rank_environment("127.0.0.1", port, rank, rank == 0 ? 2 : 3);
      dist::init_process_group("gloo", "env://", kTimeout);
    });
  });
  CHECK(std::string(e.what()).find("the ranks disagree on the world size: rank ") !=
        std::string::npos);
  CHECK(std::string(e.what()).find("start every rank with the same WORLD_SIZE") !=
        std::string::npos);
  CHECK(seconds_since(start) < 15.0);  // at once, not after the 20 s timeout
}

TEST_CASE("two processes given the same rank fail at once, naming the rank") {
  const int port = free_port();
  const mp::SpawnError e = spawn_error_of([&] {
    spawn_ranks(3, [&](int rank) {
      set_rank_environment("127.0.0.1", port, rank == 2 ? 1 : rank, 3);
      dist::init_process_group("gloo", "env://", kTimeout);
      // Only the loser's error may end the job: the others stay (and rank 0
      // keeps serving the store) until spawn ends them, so a loser that
      // claims late still meets the winner's claim, not a closed store.
      std::this_thread::sleep_for(std::chrono::seconds(30));
    });
  });
  CHECK(std::string(e.what()).find("rank 1 was already claimed in the TCP store at "
                                   "127.0.0.1:" + std::to_string(port)) != std::string::npos);
  // Both processes named, so the stray one can be found: the holder, and the
  // one that was refused (process 1 or 2: whichever claimed second).
  const std::regex both("rank 1 was already claimed in .* by pid ([0-9]+) on host (\\S+) "
                        "\\(this process is pid ([0-9]+) on host (\\S+)\\)");
  std::smatch m;
  const std::string what = e.what();
  REQUIRE_MESSAGE(std::regex_search(what, m, both), what);
  CHECK(m[1] != m[3]);
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  CHECK(m[2] == std::string(host));  // all three processes run here
  CHECK(m[4] == std::string(host));
}

TEST_CASE("a rank that never arrives makes the others fail within the timeout, naming it") {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  const mp::SpawnError e = spawn_error_of([&] {
    spawn_ranks(2, [&](int rank) {  // a world of 3, rank 2 never starts
      set_rank_environment("127.0.0.1", port, rank, 3);
      dist::init_process_group("gloo", "env://", kShortTimeout);
    });
  });
  CHECK(std::string(e.what()).find("waited 2000 ms for the others at rendezvous in the TCP "
                                   "store at 127.0.0.1:" + std::to_string(port) +
                                   "; arrived: ranks 0, 1; missing: rank 2") !=
        std::string::npos);
  CHECK(e.kind() == tp::ErrorKind::Timeout);
  CHECK(seconds_since(start) < 15.0);
}

TEST_CASE("GLOO_SOCKET_IFNAME naming an interface this machine lacks is an error listing them") {
  const int port = free_port();
  set_rank_environment("127.0.0.1", port, 0, 1);
  ::setenv("GLOO_SOCKET_IFNAME", "tp-no-such-if0", 1);
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", "env://", kShortTimeout),
                       contains("GLOO_SOCKET_IFNAME names interface 'tp-no-such-if0', which "
                                "this machine does not have (or which has no address); "
                                "interfaces with an address here: "),
                       tp::DistributedError);
  ::setenv("GLOO_SOCKET_IFNAME", "lo", 1);  // the right one works
  dist::init_process_group("gloo", "env://", kShortTimeout);
  check_sum(0, 1);
  dist::destroy_process_group();
  ::unsetenv("GLOO_SOCKET_IFNAME");
}

TEST_CASE("TP_DISTRIBUTED_DEBUG accepts OFF, INFO and DETAIL, and names itself otherwise") {
  tp::TempDir dir;
  ::setenv("TP_DISTRIBUTED_DEBUG", "verbose", 1);
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", 0, 1, dir.file_init_method()),
                       contains("TP_DISTRIBUTED_DEBUG='verbose' is not a debug level; use OFF, "
                                "INFO or DETAIL"),
                       tp::DistributedError);
  ::unsetenv("TP_DISTRIBUTED_DEBUG");
}

// ---- mismatched collectives (issue: the 16-bit fingerprint collided) --------------

// Note [Gloo tags] in collective_fingerprint.cc: with a 16-bit fingerprint these
// pairs shared their tag, so SUM against MAX of 59069 float32 elements
// "succeeded" with a mix of sums and maxima, and 4 against 86007 elements
// paired up and failed inside Gloo. Now each pair has different tags: the
// mismatched all-reduce times out naming itself.
TEST_CASE("SUM against MAX of 59069 elements is never a silent mix: it times out, named") {
  tp::TempDir dir;
  const mp::SpawnError e = spawn_error_of([&] {
    spawn_ranks(2, [&](int rank) {
      dist::init_process_group("gloo", rank, 2, dir.file_init_method(), kShortTimeout);
      tp::Tensor t = tp::full({59069}, rank + 1.0);
      dist::all_reduce(t, rank == 0 ? dist::ReduceOp::SUM : dist::ReduceOp::MAX);
    });
  });
  CHECK(std::string(e.what()).find("tp::TimeoutError: allreduce #1 on rank") !=
        std::string::npos);
}

TEST_CASE("all-reduces of 4 and of 86007 elements never pair up: the first one times out") {
  tp::TempDir dir;
  const mp::SpawnError e = spawn_error_of([&] {
    spawn_ranks(2, [&](int rank) {
      dist::init_process_group("gloo", rank, 2, dir.file_init_method(), kShortTimeout);
      tp::Tensor t = tp::ones({rank == 0 ? 4 : 86007});
      dist::all_reduce(t);
    });
  });
  CHECK(std::string(e.what()).find("tp::TimeoutError: allreduce #1 on rank") !=
        std::string::npos);
}

TEST_CASE("TP_DISTRIBUTED_DEBUG=DETAIL names both ranks' calls at once when they differ") {
  tp::TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const mp::SpawnError e = spawn_error_of([&] {
    spawn_ranks(2, [&](int rank) {
      ::setenv("TP_DISTRIBUTED_DEBUG", "DETAIL", 1);
      dist::init_process_group("gloo", rank, 2, dir.file_init_method(), kTimeout);
      tp::Tensor t = tp::full({59069}, rank + 1.0);
      dist::all_reduce(t, rank == 0 ? dist::ReduceOp::SUM : dist::ReduceOp::MAX);
    });
  });
  CHECK(std::string(e.what()).find(
            "failed: TP_DISTRIBUTED_DEBUG=DETAIL found the ranks calling "
            "different collectives: rank 0 called allreduce SUM of 59069 float32 elements as "
            "its collective #1; rank 1 called allreduce MAX of 59069 float32 elements as its "
            "collective #1") != std::string::npos);
  CHECK(seconds_since(start) < 15.0);  // at once, not after the 20 s collective timeout
}

// ---- a skipped collective (issue 25, item 2) -----------------------------------

// Rank 1 skips the first of two all-reduces of the same shape. Its one
// all-reduce pairs with rank 0's first: both hold 1 + 20 (rank 0's first
// tensor plus rank 1's second), where a correct run holds 2 + 20 in the
// second. Nothing any rank holds tells the pairing is wrong (Note
// [Collective fingerprints]); what shows is rank 0's second all-reduce,
// which nobody joins.
TEST_CASE("without debug mode, a skipped all-reduce of the same shape pairs with the next one") {
  tp::TempDir dir;
  const mp::SpawnError e = spawn_error_of([&] {
    spawn_ranks(2, [&](int rank) {
      dist::ProcessGroupGloo group(dir.path(), rank, 2, {kShortTimeout});
      tp::Tensor first = tp::full({1733}, 1.0);
      if (rank == 0) group.allreduce(first)->wait();  // rank 1 skips it
      tp::Tensor second = tp::full({1733}, rank == 0 ? 2.0 : 20.0);
      group.allreduce(second)->wait();
      const double sum = second.to_vector()[0];
      TP_CHECK_EQ(sum, 21.0, "rank 1's all-reduce summed with rank 0's first, silently");
    });  // rank 1 returns: its connections close
  });
  const std::string what = e.what();
  CHECK(e.rank() == 0);  // the rank that was left waiting, not the one that skipped
  CHECK(what.find("allreduce #2 on rank 0 failed: the connection to another rank broke") !=
        std::string::npos);
  CHECK(what.find("meanwhile: rank 1 had returned") != std::string::npos);
}

// The same job in debug mode: rank 1 closes its group while rank 0 is at
// its second all-reduce, and the close is checked like a collective.
TEST_CASE("TP_DISTRIBUTED_DEBUG=DETAIL names a rank that skipped an all-reduce of the same shape") {
  tp::TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const mp::SpawnError e = spawn_error_of([&] {
    spawn_ranks(2, [&](int rank) {
      ::setenv("TP_DISTRIBUTED_DEBUG", "DETAIL", 1);
      dist::ProcessGroupGloo group(dir.path(), rank, 2, {kTimeout});
      if (rank == 0) group.allreduce(tp::full({1733}, 1.0))->wait();  // rank 1 skips it
      group.allreduce(tp::full({1733}, rank == 0 ? 2.0 : 20.0))->wait();
    });  // rank 1 closes its group here, and meets rank 0's second all-reduce
  });
  CHECK(e.rank() == 0);
  CHECK(std::string(e.what()).find(
            "allreduce #2 on rank 0 failed: TP_DISTRIBUTED_DEBUG=DETAIL found the ranks "
            "calling different collectives: rank 0 called allreduce SUM of 1733 float32 "
            "elements as its collective #2; rank 1 closed the group after its collective #1. "
            "A rank that closes the group while another still issues collectives is behind: "
            "rank 1 skipped a collective, or rank 0 issued an extra one") != std::string::npos);
  CHECK(seconds_since(start) < 15.0);  // at once, not after the 20 s collective timeout
}

// No false alarm: every kind of collective, waited for through the Work
// and through its future, more than 256 of them (the tag keeps the low 8
// bits of the sequence number: Note [Gloo tags]), then a close that matches.
TEST_CASE("TP_DISTRIBUTED_DEBUG=DETAIL passes 700 matching collectives and a matching close") {
  tp::TempDir dir;
  CHECK_NOTHROW(spawn_ranks(2, [&](int rank) {
    ::setenv("TP_DISTRIBUTED_DEBUG", "DETAIL", 1);
    dist::ProcessGroupGloo group(dir.path(), rank, 2, {kTimeout});
    for (int i = 0; i < 100; ++i) {
      tp::Tensor a = tp::full({5}, rank + 1.0);
      group.allreduce(a)->wait();
      tp::Tensor b = tp::full({5}, rank + 1.0);
      group.allreduce(b, dist::ReduceOp::MAX)->get_future()->wait();
      tp::Tensor c = tp::full({3}, rank == 1 ? 7.0 : 0.0);
      group.broadcast(c, 1)->get_future()->wait();
      std::vector<tp::Tensor> out{tp::zeros({2}), tp::zeros({2})};
      group.allgather(out, tp::full({2}, rank * 10.0))->wait();
      group.barrier()->get_future()->wait();
      auto left = group.allreduce(tp::ones({4}));  // two in flight at once
      auto right = group.allreduce(tp::ones({6}, tp::kFloat64));
      left->wait();
      right->wait();
      const double sum = a.to_vector()[0];  // copies: TP_CHECK_EQ keeps references
      const double max = b.to_vector()[0];
      const double broadcast = c.to_vector()[2];
      const double gathered = out[1].to_vector()[0];
      TP_CHECK_EQ(sum, 3.0, "allreduce SUM of 1 and 2");
      TP_CHECK_EQ(max, 2.0, "allreduce MAX of 1 and 2");
      TP_CHECK_EQ(broadcast, 7.0, "broadcast from rank 1");
      TP_CHECK_EQ(gathered, 10.0, "rank 1's input, gathered");
    }
    TP_CHECK_EQ(group.counters().allreduce, 400u, "four all-reduces per round");
  }));
}

TEST_CASE("the directory store of file:// for NCCL: set, get, check, add across processes, timeout") {
  tp::TempDir dir("tp-dir-store");
  dist::detail::DirStore store(dir.path());
  CHECK_FALSE(store.check({"nccl/unique_id"}));
  store.set("nccl/unique_id", std::string("a\0b/%", 5));
  CHECK(store.check({"nccl/unique_id"}));
  CHECK_EQ(store.get("nccl/unique_id", milliseconds(10)), std::string("a\0b/%", 5));
  CHECK_THROWS_WITH_AS(store.get("nccl/where/3", milliseconds(50)),
                       doctest::Contains("key 'nccl/where/3' did not appear in the directory "
                                         "store in '"),
                       tp::TimeoutError);
  // add() is atomic across processes: 4 ranks add 1 fifty times each.
  CHECK_NOTHROW(mp::spawn(
      [&](int) {
        dist::detail::DirStore mine(dir.path());
        for (int i = 0; i < 50; ++i) mine.add("tp/claim/0", 1);
      },
      4));
  CHECK_EQ(store.add("tp/claim/0", 0), 200);
  CHECK_NOTHROW(store.wait({"nccl/unique_id", "tp/claim/0"}, milliseconds(10)));
}
