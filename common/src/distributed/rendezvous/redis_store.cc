// tp::distributed::RedisStore over gloo::rendezvous::RedisStore (Debian's
// Gloo is built with it), plus the commands Gloo's store lacks: INCRBY for
// add(), EXPIRE and TTL for the lease, DEL for cleaning up (Note [Leased
// keys] in redis_store.h).
#include "tensorplay/distributed/redis_store.h"

#include <gloo/rendezvous/redis_store.h>

#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "tensorplay/error.h"

namespace tp::distributed {

using std::chrono::milliseconds;
using tp::detail::cat;

namespace {

constexpr const char* kWho = "tp::distributed::RedisStore";

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

// One plain connection (the lease keeper's, the signal handler's), freed
// when it goes out of scope.
struct FreeContext {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, FreeContext>;

Context connect(const std::string& host, int port, milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  Context c(redisConnectWithTimeout(host.c_str(), port, tv));
  if (c == nullptr || c->err != 0) {
    TP_THROW(DistributedError, kWho, ": cannot open a second connection to the redis-server at ",
             host, ":", port, " (", c ? c->errstr : "out of memory", ")");
  }
  redisSetTimeout(c.get(), tv);
  return c;
}

// "DEL key ..." in Redis's wire protocol (RESP), ready for write(2).
std::string encode_del(const std::vector<std::string>& keys) {
  std::string out = cat("*", keys.size() + 1, "\r\n$3\r\nDEL\r\n");
  for (const std::string& key : keys) out += cat("$", key.size(), "\r\n", key, "\r\n");
  return out;
}

// ---- the signal handler of Note [Leased keys] -------------------------------
// Each live store's slot: the descriptor kept for the handler and its latest
// DEL command. A store fills its slot's command before its descriptor and
// empties the descriptor first, so the handler never writes a freed command.
struct CleanupSlot {
  std::atomic<int> fd{-1};
  std::atomic<const std::string*> command{nullptr};
};
constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGHUP};
const std::string kNoCommand;         // a taken slot's command before its first key
// More live stores than slots is unusual (one per process group made by
// redis://); the rest only lease their keys, and say so.
std::array<CleanupSlot, 16> g_slots;
std::mutex g_slots_mutex;             // guards taking and giving back slots, and installing
int g_stores_with_slots = 0;          // guarded by g_slots_mutex
std::array<bool, 3> g_installed{};    // guarded by g_slots_mutex

extern "C" void delete_keys_and_reraise(int sig) {
  const int saved_errno = errno;
  for (CleanupSlot& slot : g_slots) {
    const int fd = slot.fd.load(std::memory_order_acquire);
    const std::string* command = slot.command.load(std::memory_order_acquire);
    if (fd < 0 || command == nullptr) continue;
    const char* data = command->data();
    std::size_t left = command->size();
    while (left > 0) {
      const ssize_t n = ::write(fd, data, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      data += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  ::signal(sig, SIG_DFL);  // async-signal-safe, like write and raise
  errno = saved_errno;
  ::raise(sig);
}

// Installs the handler where the disposition is the default; returns the
// slot taken, or nullptr when all are in use.
CleanupSlot* take_slot() {
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (CleanupSlot& slot : g_slots) {
    if (slot.fd.load() >= 0 || slot.command.load() != nullptr) continue;
    if (g_stores_with_slots++ == 0) {
      for (std::size_t i = 0; i < kSignals.size(); ++i) {
        struct sigaction current {};
        ::sigaction(kSignals[i], nullptr, &current);
        if (current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO) != 0) continue;
        struct sigaction handler {};
        handler.sa_handler = delete_keys_and_reraise;
        sigemptyset(&handler.sa_mask);  // one handler at a time: block the others meanwhile
        for (int other : kSignals) sigaddset(&handler.sa_mask, other);
        g_installed[i] = ::sigaction(kSignals[i], &handler, nullptr) == 0;
      }
    }
    slot.command.store(&kNoCommand, std::memory_order_release);  // taken
    return &slot;
  }
  return nullptr;
}

void give_back(CleanupSlot* slot) {
  if (slot == nullptr) return;
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  slot->fd.store(-1, std::memory_order_release);
  slot->command.store(nullptr, std::memory_order_release);
  if (--g_stores_with_slots == 0) {
    for (std::size_t i = 0; i < kSignals.size(); ++i) {
      if (!g_installed[i]) continue;
      struct sigaction current {};
      ::sigaction(kSignals[i], nullptr, &current);
      if (current.sa_handler == delete_keys_and_reraise) ::signal(kSignals[i], SIG_DFL);
      g_installed[i] = false;
    }
  }
}

}  // namespace

struct RedisStore::Impl {
  std::string host;
  int port = 0;
  std::string prefix;  // "<job_id>/"
  std::chrono::seconds lease{RedisStore::kDefaultLease};
  std::unique_ptr<GlooRedis> redis;

  std::mutex mutex;                  // guards written, commands and stopping
  std::vector<std::string> written;  // full keys this process created: renewed, deleted at the end
  // Every DEL command handed to the signal handler: kept until the end, as
  // the handler may be reading an older one.
  std::vector<std::unique_ptr<std::string>> commands;
  bool stopping = false;
  std::condition_variable wake;      // ends the keeper's wait when stopping
  std::thread keeper;                // renews `written` every lease / 3
  Context keeper_connection;
  Context signal_connection;         // only ever written by the signal handler
  CleanupSlot* slot = nullptr;

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

  // Creates `full` with `value` and the lease in one command, unless it
  // exists; returns whether it did. A key created here is this process's:
  // renewed by the keeper, deleted at the end or by a signal.
  bool create(const std::string& full, const std::string& value) {
    Reply r = command({"SET", full, value, "NX", "EX", std::to_string(lease.count())});
    if (r->type == REDIS_REPLY_NIL) return false;  // it exists
    std::lock_guard<std::mutex> lock(mutex);
    written.push_back(full);
    if (slot != nullptr) {
      commands.push_back(std::make_unique<std::string>(encode_del(written)));
      slot->command.store(commands.back().get(), std::memory_order_release);
    }
    return true;
  }

  // The keeper thread: renews every key this process created, each lease / 3,
  // until stopping, and keeps the signal handler's connection alive (a
  // server with an idle `timeout` would close it). A connection that broke
  // (the server restarted, a client kill) is opened again at the next round;
  // the first failure is said once on stderr, as the keys then expire.
  void keep() {
    std::unique_lock<std::mutex> lock(mutex);
    const auto period = std::chrono::duration_cast<milliseconds>(lease) / 3;
    bool warned = false;
    while (!wake.wait_for(lock, period, [this] { return stopping; })) {
      const std::vector<std::string> keys = written;
      lock.unlock();
      bool ok = renew(keys);
      if (!ok && redisReconnect(keeper_connection.get()) == REDIS_OK) ok = renew(keys);
      ok = keep_signal_connection() && ok;
      if (!ok && !warned) {
        warned = true;
        std::fprintf(stderr, "%s: cannot renew this process's keys on %s (%s); they expire "
                     "%lld s after their last renewal\n", kWho, where().c_str(),
                     keeper_connection->errstr, static_cast<long long>(lease.count()));
      }
      lock.lock();
    }
  }

  bool renew(const std::vector<std::string>& keys) {
    for (const std::string& key : keys) {
      Reply r(static_cast<redisReply*>(redisCommand(keeper_connection.get(), "EXPIRE %b %lld",
                                                    key.data(), key.size(),
                                                    static_cast<long long>(lease.count()))));
      if (r == nullptr) return false;
    }
    return true;
  }

  // PINGs the handler's connection (its replies are read and dropped) and,
  // when it broke, reconnects it and hands the handler the new descriptor.
  bool keep_signal_connection() {
    Reply r(static_cast<redisReply*>(redisCommand(signal_connection.get(), "PING")));
    if (r != nullptr) return true;
    if (redisReconnect(signal_connection.get()) != REDIS_OK) return false;
    if (slot != nullptr) slot->fd.store(signal_connection->fd, std::memory_order_release);
    return true;
  }
};

RedisStore::RedisStore(const std::string& host, int port, const std::string& job_id,
                       milliseconds timeout, std::chrono::seconds lease)
    : impl_(std::make_unique<Impl>()) {
  if (job_id.empty()) {
    TP_THROW(DistributedError, kWho, ": the job id is empty; every job on a shared "
             "redis-server needs its own (redis://host:port/JOB, or TP_JOB_ID)");
  }
  if (lease.count() < 1) {
    TP_THROW(DistributedError, kWho, ": the lease must be at least 1 s (got ", lease.count(),
             " s)");
  }
  impl_->lease = lease;
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
  // Note [Leased keys]: the keeper's connection and thread, and the signal
  // handler's connection.
  impl_->keeper_connection = connect(host, port, timeout);
  impl_->signal_connection = connect(host, port, timeout);
  impl_->slot = take_slot();
  if (impl_->slot != nullptr) {
    impl_->slot->fd.store(impl_->signal_connection->fd, std::memory_order_release);
  } else {
    std::fprintf(stderr, "%s: more than %zu stores live in this process; the keys of this one "
                 "are not deleted on SIGINT, SIGTERM or SIGHUP, only leased\n", kWho,
                 g_slots.size());
  }
  impl_->keeper = std::thread([impl = impl_.get()] { impl->keep(); });
}

RedisStore::~RedisStore() {
  // Never throws: the server may be gone already.
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->keeper.joinable()) impl_->keeper.join();
  give_back(impl_->slot);
  for (const std::string& key : impl_->written) {
    void* p = redisCommand(impl_->redis->raw(), "DEL %b", key.data(), key.size());
    if (p == nullptr) break;
    freeReplyObject(p);
  }
}

std::string RedisStore::describe_key(const std::string& key) {
  // What the key's TTL says, and nothing it does not: a key written by
  // another process may have another lease, or none.
  try {
    const std::string full = impl_->prefix + key;
    Reply r = impl_->command({"TTL", full});
    if (r->type != REDIS_REPLY_INTEGER || r->integer == -2) return "";  // gone meanwhile
    if (r->integer == -1) {
      return cat(" (it never expires: written without a lease, by hand or by an older kit; "
                 "delete it with redis-cli -h ", impl_->host, " -p ", impl_->port, " del '",
                 full, "', or pick another job id)");
    }
    return cat(" (it expires in ", r->integer, " s unless the job that wrote it renews it; a "
               "running job renews its keys every ", impl_->lease.count() / 3,
               " s or so, so a job that died frees its id within its lease, ",
               impl_->lease.count(), " s by default)");
  } catch (const DistributedError&) {
    return "";
  }
}

std::string RedisStore::describe() const {
  return cat(impl_->where(), " (job '", impl_->prefix.substr(0, impl_->prefix.size() - 1),
             "')");
}

void RedisStore::set(const std::string& key, const std::string& value) {
  const std::string full = impl_->prefix + key;
  // One command creates the key with its lease, so no key ever exists
  // without one (Note [Leased keys]); NX: refused if it exists, as Gloo's
  // own SETNX does.
  if (!impl_->create(full, value)) {
    TP_THROW(DistributedError, kWho, ": key '", full, "' already exists on ", impl_->where(),
             describe_key(key), ": another job runs with the same job id, or one ended "
             "less than a lease ago; pick another job id");
  }
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
  // Created here (at 0, with its lease), the key is this process's to renew
  // and delete; a key that was there is its creator's, which renews it
  // while it runs (describe_key tells when it expires).
  impl_->create(full, "0");
  Reply r = impl_->command({"INCRBY", full, std::to_string(delta)});
  return r->integer;
}

bool RedisStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> args{"EXISTS"};
  for (const std::string& key : keys) args.push_back(impl_->prefix + key);
  Reply r = impl_->command(args);
  return r->integer == static_cast<long long>(keys.size());
}

}  // namespace tp::distributed
