// redis:// rendezvous against a real redis-server, which
// tests/multinode/with_redis.py starts and names in TP_TEST_REDIS
// ("127.0.0.1:PORT"): world sizes 1 to 4, jobs side by side on one server,
// job ids reused, keys cleaned up (at the end, by a signal, by the lease),
// and a server that is not there.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

#include "tensorplay/distributed/init.h"
#include "tensorplay/distributed/redis_store.h"
#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/tensor.h"
#include "tensorplay/util/temp_dir.h"
#include "test_util.h"

namespace dist = tp::distributed;
namespace mp = tp::multiprocessing;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kTimeout{20000};  // success cases: generous on a loaded machine

// "redis://127.0.0.1:PORT" of the server with_redis.py started.
std::string server() {
  const char* where = std::getenv("TP_TEST_REDIS");
  REQUIRE_MESSAGE(where != nullptr, "run me through tests/multinode/with_redis.py");
  return std::string("redis://") + where;
}

// A job id no other test run uses.
std::string job(const std::string& name) {
  return "tp-test-" + std::to_string(::getpid()) + "-" + name;
}

using test_util::check_sum;
using test_util::spawn_error_of;
using test_util::spawn_ranks;

}  // namespace

TEST_CASE("redis:// meets and all-reduces at world sizes 1 to 4") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    const std::string method = server() + "/" + job("w" + std::to_string(world));
    spawn_ranks(world, [&](int rank) {
      dist::init_process_group("gloo", rank, world, method, kTimeout);
      check_sum(rank, world);
      dist::destroy_process_group();
    });
  }
}

TEST_CASE("redis:// takes the job id from TP_JOB_ID, and without one says how to give it") {
  const std::string bare = server();
  const std::string id = job("from-env");  // here: job() reads the process id
  spawn_ranks(2, [&](int rank) {
    ::setenv("TP_JOB_ID", id.c_str(), 1);
    dist::init_process_group("gloo", rank, 2, bare, kTimeout);
    check_sum(rank, 2);
    dist::destroy_process_group();
  });
  ::unsetenv("TP_JOB_ID");
  CHECK_THROWS_WITH_AS(dist::init_process_group("gloo", 0, 2, bare, kTimeout),
                       doctest::Contains("names no job id, and TP_JOB_ID is not set"),
                       tp::DistributedError);
}

TEST_CASE("two jobs on one redis-server at once never mix, given different job ids") {
  // Four processes, two jobs of two ranks: process p is rank p % 2 of job p / 2.
  const std::string base = server() + "/" + job("side-by-side-");
  spawn_ranks(4, [&](int p) {
    dist::init_process_group("gloo", p % 2, 2, base + std::to_string(p / 2), kTimeout);
    check_sum(p % 2, 2);  // 3 in each job; a mixed job of four would give 10
    dist::destroy_process_group();
  });
}

TEST_CASE("a job id is free again once its job ended: the keys are deleted") {
  const std::string method = server() + "/" + job("reused");
  for (int run = 0; run < 2; ++run) {
    spawn_ranks(2, [&](int rank) {
      dist::init_process_group("gloo", rank, 2, method, kTimeout);
      check_sum(rank, 2);
      dist::destroy_process_group();
    });
  }
}

TEST_CASE("two processes of one job id claiming the same rank fail at once, naming it") {
  const std::string method = server() + "/" + job("claimed-twice");
  const mp::SpawnError e = test_util::spawn_error_of([&] {
    spawn_ranks(3, [&](int p) {  // processes 0 and 1 both say rank 0
      dist::init_process_group("gloo", p == 2 ? 1 : 0, 2, method, kTimeout);
      // The job that formed stays (and keeps its keys) until the loser's
      // error ends every process: its claim must meet the winner's.
      std::this_thread::sleep_for(std::chrono::seconds(30));
    });
  });
  CHECK(std::string(e.what()).find("rank 0 was already claimed in the redis-server at ") !=
        std::string::npos);
  // How old the claim is, so a user can tell a running job from a dead one.
  CHECK_MESSAGE(std::string(e.what()).find("(it expires in ") != std::string::npos, e.what());
}

namespace {

// host and port of the server with_redis.py started.
std::pair<std::string, int> host_port() {
  const std::string where = std::getenv("TP_TEST_REDIS");
  return {where.substr(0, where.rfind(':')), std::stoi(where.substr(where.rfind(':') + 1))};
}

// Whether job `id` has key `key` on the server now, asked from a process of
// its own (a store starts a thread, and this test process forks).
bool has_key(const std::string& id, const std::string& key) {
  mp::SpawnOptions options;
  options.timeout = std::chrono::seconds(30);
  return mp::spawn(options, [&](int) {
    const auto [host, port] = host_port();
    return dist::RedisStore(host, port, id, kTimeout).check({key});
  }, 1)[0];
}

// Polls has_key until it is false, at most `limit`; returns the time it took.
double seconds_until_gone(const std::string& id, const std::string& key,
                          std::chrono::seconds limit) {
  const auto start = std::chrono::steady_clock::now();
  while (has_key(id, key) && std::chrono::steady_clock::now() - start < limit) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("keys are renewed while their process lives, and expire within the lease once it is "
          "killed outright") {
  const std::string id = job("leased");
  mp::SpawnOptions options;
  options.timeout = std::chrono::seconds(60);
  const mp::SpawnError e = spawn_error_of([&] {
    mp::spawn(options, [&](int) {
      const auto [host, port] = host_port();
      dist::RedisStore store(host, port, id, kTimeout, std::chrono::seconds(2));
      store.set("k", "v");
      std::this_thread::sleep_for(std::chrono::seconds(4));  // two leases
      if (!store.check({"k"})) throw tp::Error("the key expired while its process lived");
      ::raise(SIGKILL);  // no handler, no destructor: only the lease ends it
    }, 1);
  });
  REQUIRE_MESSAGE(std::string(e.what()).find("killed by signal 9") != std::string::npos, e.what());
  CHECK(has_key(id, "k"));  // SIGKILL deletes nothing...
  const double gone = seconds_until_gone(id, "k", std::chrono::seconds(10));
  CHECK_MESSAGE(gone < 4.0, "the key outlived its 2 s lease by ", gone, " s");  // ...the lease does
}

namespace {

// Sends one inline command to the server on a connection of its own, and
// reads the reply line: how a test plays redis-cli.
std::string raw_command(const std::string& command) {
  const auto [host, port] = host_port();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    throw tp::Error("cannot connect to the test's redis-server");
  }
  const std::string line = command + "\r\n";
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    ::close(fd);
    throw tp::Error("cannot send to the test's redis-server");
  }
  char reply[256] = {};
  const ssize_t n = ::read(fd, reply, sizeof reply - 1);
  ::close(fd);
  return n > 0 ? std::string(reply, static_cast<std::size_t>(n)) : std::string();
}

}  // namespace

TEST_CASE("a store whose connections are killed reconnects: its keys are still renewed, and a "
          "signal still deletes them") {
  const std::string id = job("reconnect");
  tp::TempDir flags("tp-redis-reconnect");
  const std::string ready = flags.path() + "/ready";
  mp::SpawnOptions options;
  options.timeout = std::chrono::seconds(60);
  const mp::SpawnError e = spawn_error_of([&] {
    mp::spawn(options, [&](int rank) {
      if (rank == 0) {  // the job's process: a 6 s lease, renewed each 2 s
        const auto [host, port] = host_port();
        dist::RedisStore store(host, port, id, kTimeout, std::chrono::seconds(6));
        store.set("k", "v");
        std::FILE* f = std::fopen(ready.c_str(), "w");
        std::fclose(f);
        std::this_thread::sleep_for(std::chrono::seconds(11));
        ::raise(SIGTERM);  // through the handler's connection, killed at the start
        return;
      }
      while (::access(ready.c_str(), F_OK) != 0) {
        std::this_thread::sleep_for(milliseconds(20));
      }
      // Every connection of the job's process goes, as with `redis-cli client kill`.
      const std::string killed = raw_command("CLIENT KILL TYPE normal SKIPME yes");
      if (killed.rfind(":", 0) != 0 || killed == ":0\r\n") {
        throw tp::Error("CLIENT KILL killed nothing: " + killed);
      }
      // Past the 6 s lease: the key is there only if the keeper reconnected.
      std::this_thread::sleep_for(std::chrono::seconds(8));
      const auto [host, port] = host_port();
      if (!dist::RedisStore(host, port, id, kTimeout).check({"k"})) {
        throw tp::Error("the key expired: the keeper did not reconnect after its connection "
                        "was killed");
      }
    }, 2);
  });
  REQUIRE_MESSAGE(std::string(e.what()).find("rank 0 failed: killed by signal 15") !=
                      std::string::npos,
                  e.what());
  // Its TTL was at least 4 s when the signal came: only the handler's DEL,
  // on the connection the keeper reconnected, removes it this soon.
  CHECK_FALSE(has_key(id, "k"));
}

TEST_CASE("describe_key says when a key expires, whatever lease wrote it, and names one that "
          "never does") {
  const std::string id = job("describe");
  mp::SpawnOptions options;
  options.timeout = std::chrono::seconds(60);
  const std::vector<std::string> said = mp::spawn(options, [&](int) {
    const auto [host, port] = host_port();
    dist::RedisStore writer(host, port, id, kTimeout, std::chrono::seconds(600));
    writer.set("long", "v");
    raw_command("SET " + id + "/forever v");
    dist::RedisStore reader(host, port, id, kTimeout);  // a 20 s lease of its own
    const std::string both = reader.describe_key("long") + "|" + reader.describe_key("forever");
    raw_command("DEL " + id + "/forever");
    return both;
  }, 1);
  const std::string& both = said[0];
  // The writer's 600 s lease, read from the key, not the reader's 20 s.
  CHECK_MESSAGE((both.find("(it expires in 600 s") != std::string::npos ||
                 both.find("(it expires in 59") != std::string::npos),
                both);
  CHECK_MESSAGE(both.find("it never expires: written without a lease") != std::string::npos, both);
}

TEST_CASE("SIGINT, SIGTERM and SIGHUP delete a process's keys at once, and still end it by the "
          "signal") {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    CAPTURE(sig);
    const std::string id = job("signal-" + std::to_string(sig));
    mp::SpawnOptions options;
    options.timeout = std::chrono::seconds(60);
    const mp::SpawnError e = spawn_error_of([&] {
      mp::spawn(options, [&](int) {
        // As a program that did not take the signal: a test run under nohup
        // inherits SIGHUP ignored, and the store rightly leaves that alone.
        ::signal(sig, SIG_DFL);
        const auto [host, port] = host_port();
        dist::RedisStore store(host, port, id, kTimeout, std::chrono::seconds(600));
        store.set("k", "v");
        store.add("tp/claim/0", 1);
        ::raise(sig);
      }, 1);
    });
    REQUIRE_MESSAGE(std::string(e.what()).find("killed by signal " + std::to_string(sig)) !=
                        std::string::npos,
                    e.what());
    // A 600 s lease: only the handler's DEL can have removed them.
    CHECK(seconds_until_gone(id, "k", std::chrono::seconds(5)) < 2.0);
    CHECK_FALSE(has_key(id, "tp/claim/0"));
  }
}

TEST_CASE("a redis-server that is not there is an error naming its address") {
  const std::string where = std::getenv("TP_TEST_REDIS");
  // A port bound here and never listened on, so a connection is refused
  // and no other program (another test's Gloo pair, say) can listen there
  // while the check runs.
  const std::string host = where.substr(0, where.rfind(':'));
  const test_util::HeldPort held;
  const int port = held.port();
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(
      dist::RedisStore(host, port, "job", milliseconds(2000)),
      doctest::Contains(doctest::String(("cannot reach the redis-server at " + host + ":" +
                                         std::to_string(port))
                                            .c_str())),
      tp::DistributedError);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("a port where another service listens is named as not a Redis server, not as a lost "
          "one") {
  // A listener that answers whatever it is sent like a web server would.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;  // any free port
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(listener, 1) == 0);
  socklen_t length = sizeof address;
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  const int port = ntohs(address.sin_port);
  std::thread web([listener] {
    const int client = ::accept(listener, nullptr, nullptr);
    if (client < 0) return;
    char request[256];
    (void)::read(client, request, sizeof request);
    const char reply[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
    (void)::write(client, reply, sizeof reply - 1);
    ::close(client);
  });
  CHECK_THROWS_WITH_AS(
      dist::RedisStore("127.0.0.1", port, "job", milliseconds(2000)),
      doctest::Contains(doctest::String(("the server at 127.0.0.1:" + std::to_string(port) +
                                         " accepted the connection but does not answer as a "
                                         "Redis server")
                                            .c_str())),
      tp::DistributedError);
  web.join();
  ::close(listener);
}
