// tp::distributed::RedisStore: the rendezvous of redis://host:port, on a
// redis-server every rank can reach, through Gloo's own RedisStore.
//
// Contract:
//   - Every key this store writes is "<job_id>/<key>", so jobs that share
//     one redis-server never read each other's keys. Two jobs started with
//     the same job id do meet; the rendezvous then fails at once, naming
//     the rank claimed twice (see ProcessGroupGloo).
//   - set() refuses a key that already exists (SET NX, as Gloo's own
//     RedisStore's SETNX). The keys this process created are its own: they are deleted
//     when it is destroyed (the group keeps it until destroy_process_group,
//     when every rank has long read them), and they are leased (Note
//     [Leased keys]), so a job that ends any other way frees its job id
//     within seconds, not never.
//   - describe_key(key) says when the key expires unless renewed, or that it
//     never does: what a rank refused as "already claimed" needs to know
//     whether the earlier job is still there.
//   - The constructor connects at once: a server that does not answer is a
//     tp::DistributedError naming host:port. A server that goes away later,
//     or stops answering for `timeout`, is a tp::DistributedError on the
//     next call.
//   - get() and wait() poll, like the other stores (store.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/distributed/store.h"

namespace tp::distributed {

// Note [Leased keys]
// A job's keys must outlive its rendezvous (a rank that claimed rank 0 holds
// it while the job runs, so a second job with the same id is refused) but not
// the job: a crashed or interrupted job would otherwise block its job id.
//   - Each key this process creates is created with its lease, in one
//     command (SET ... NX EX), so none ever exists without one; it expires
//     `lease` after it was written, and a thread of the store renews every
//     one each lease / 3, on a connection of its own, while the store lives
//     (reconnecting if the connection broke, and saying once on stderr if it
//     cannot). A process that dies (SIGKILL, a crash, a lost machine) stops
//     renewing: its keys are gone within the lease.
//   - SIGINT, SIGTERM and SIGHUP (Ctrl-C, kill, tprun passing either on)
//     delete them at once: while a RedisStore lives, a signal whose
//     disposition was the default gets a handler that writes one DEL of the
//     process's keys, encoded ahead of time, to a third connection kept for
//     it (write(2) is async-signal-safe; hiredis is not), then restores the
//     default and raises the signal again, so the process still ends by it.
//     A signal the program handles itself is left to it. The keeper PINGs
//     that connection each round, so a server's idle timeout does not close
//     it, and reconnects it if it broke. Up to 16 stores per process get the
//     handler (a store past that says so, and is only leased); a signal that
//     lands while a store is being destroyed may miss that store's keys,
//     which its destructor deletes anyway.
class RedisStore : public Store {
 public:
  static constexpr std::chrono::seconds kDefaultLease{20};

  // REQUIRES: job_id not empty, lease >= 1 s. Connecting, and every command
  // after it, is bounded by `timeout`.
  RedisStore(const std::string& host, int port, const std::string& job_id,
             std::chrono::milliseconds timeout, std::chrono::seconds lease = kDefaultLease);
  ~RedisStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  std::string describe() const override;
  std::string describe_key(const std::string& key) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tp::distributed
