// tp::distributed::RedisStore over gloo::rendezvous::RedisStore (Debian's
// Gloo is built with it), plus the two commands Gloo's store lacks: INCRBY
// for add() and DEL for cleaning up.
#include "tensorplay/distributed/redis_store.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/redis_store.h>

#include <sys/time.h>

#include "tensorplay/error.h"

namespace tp::distributed {

using std::chrono::milliseconds;
using tp::detail::cat;

namespace {

constexpr const char* kWho = "tp::distributed::RedisStore";
// A crashed job's keys disappear after this long (see redis_store.h).
constexpr int kKeyLifetimeSeconds = 3600;

// Gloo's store with its connection in reach (redis_ is protected).
class GlooRedis : public gloo::rendezvous::RedisStore {
 public:
  using gloo::rendezvous::RedisStore::RedisStore;
  redisContext* raw() { return redis_; }
};

// One reply, freed when it goes out of scope.
struct FreeReply {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
using Reply = std::unique_ptr<redisReply, FreeReply>;

}  // namespace

struct RedisStore::Impl {
  std::string host;
  int port = 0;
  std::string prefix;  // "<job_id>/"
  std::unique_ptr<GlooRedis> redis;
  std::vector<std::string> written;  // full keys this process set, deleted at the end

  std::string where() const { return cat("the redis-server at ", host, ":", port); }

  // Runs one command through hiredis; throws naming the server when it fails.
  Reply command(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    Reply r(static_cast<redisReply*>(redisCommandArgv(redis->raw(), static_cast<int>(argv.size()), argv.data(),
                             lengths.data())));
    if (r == nullptr) {
      TP_THROW(DistributedError, kWho, ": ", args[0], " failed: lost ", where(), " (",
               redis->raw()->errstr, "); is redis-server still running and reachable?");
    }
    if (r->type == REDIS_REPLY_ERROR) {
      TP_THROW(DistributedError, kWho, ": ", args[0], " failed: ", where(), " answered: ",
               r->str);
    }
    return r;
  }
};

RedisStore::RedisStore(const std::string& host, int port, const std::string& job_id,
                       milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  if (job_id.empty()) {
    TP_THROW(DistributedError, kWho, ": the job id is empty; every job on a shared "
             "redis-server needs its own (redis://host:port/JOB, or TP_JOB_ID)");
  }
  impl_->host = host;
  impl_->port = port;
  impl_->prefix = job_id + "/";
  try {
    impl_->redis = std::make_unique<GlooRedis>(host, port);
  } catch (const std::exception& e) {
    TP_THROW(DistributedError, kWho, ": cannot reach ", impl_->where(), " (", e.what(),
             "); is redis-server running there (redis-server --port ", port,
             "), and can this host reach it?");
  }
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  redisSetTimeout(impl_->redis->raw(), tv);
  // Another service on that port (a web server, a typo in the port) accepts
  // the connection too; what it answers to PING tells it from redis-server.
  Reply pong(static_cast<redisReply*>(redisCommand(impl_->redis->raw(), "PING")));
  if (pong == nullptr) {
    TP_THROW(DistributedError, kWho, ": the server at ", host, ":", port, " accepted the "
             "connection but does not answer as a Redis server (PING: ",
             impl_->redis->raw()->errstr, "); is redis-server what listens on port ", port,
             ", and not another service?");
  }
  if (pong->type == REDIS_REPLY_ERROR) {
    TP_THROW(DistributedError, kWho, ": ", impl_->where(), " answered PING with an error: ",
             std::string(pong->str, pong->len));
  }
}

RedisStore::~RedisStore() {
  // Never throws: the server may be gone already.
  for (const std::string& key : impl_->written) {
    void* p = redisCommand(impl_->redis->raw(), "DEL %b", key.data(), key.size());
    if (p == nullptr) break;
    freeReplyObject(p);
  }
}

std::string RedisStore::describe() const {
  return cat(impl_->where(), " (job '", impl_->prefix.substr(0, impl_->prefix.size() - 1),
             "')");
}

void RedisStore::set(const std::string& key, const std::string& value) {
  const std::string full = impl_->prefix + key;
  try {
    impl_->redis->set(full, std::vector<char>(value.begin(), value.end()));
  } catch (const gloo::EnforceNotMet& e) {
    TP_THROW(DistributedError, kWho, ": key '", full, "' already exists on ", impl_->where(),
             ": another job runs with the same job id, or an earlier one crashed less "
             "than an hour ago; pick another job id (gloo: ", e.what(), ")");
  } catch (const std::exception& e) {
    TP_THROW(DistributedError, kWho, ": set '", full, "' failed on ", impl_->where(), ": ",
             e.what());
  }
  impl_->written.push_back(full);
  impl_->command({"EXPIRE", full, std::to_string(kKeyLifetimeSeconds)});
}

std::string RedisStore::get(const std::string& key, milliseconds timeout) {
  wait({key}, timeout);
  Reply r = impl_->command({"GET", impl_->prefix + key});
  if (r->type != REDIS_REPLY_STRING) {
    TP_THROW(DistributedError, kWho, ": key '", impl_->prefix + key, "' vanished from ",
             impl_->where(), " while this rank read it");
  }
  return std::string(r->str, r->len);
}

int64_t RedisStore::add(const std::string& key, int64_t delta) {
  const std::string full = impl_->prefix + key;
  Reply r = impl_->command({"INCRBY", full, std::to_string(delta)});
  impl_->written.push_back(full);
  impl_->command({"EXPIRE", full, std::to_string(kKeyLifetimeSeconds)});
  return r->integer;
}

bool RedisStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> args{"EXISTS"};
  for (const std::string& key : keys) args.push_back(impl_->prefix + key);
  Reply r = impl_->command(args);
  return r->integer == static_cast<long long>(keys.size());
}

}  // namespace tp::distributed
