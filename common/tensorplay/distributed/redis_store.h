// tp::distributed::RedisStore: the rendezvous of redis://host:port, on a
// redis-server every rank can reach, through Gloo's own RedisStore.
//
// Contract:
//   - Every key this store writes is "<job_id>/<key>", so jobs that share
//     one redis-server never read each other's keys. Two jobs started with
//     the same job id do meet; the rendezvous then fails at once, naming
//     the rank claimed twice (see ProcessGroupGloo).
//   - set() refuses a key that already exists (Gloo's RedisStore writes with
//     SETNX). Keys this process wrote are deleted when it is destroyed (the
//     group keeps it until destroy_process_group, when every rank has long
//     read them), and each expires an hour after it was written, so a job
//     that crashed does not block its job id forever.
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

class RedisStore : public Store {
 public:
  // REQUIRES: job_id not empty. Connecting, and every command after it, is
  // bounded by `timeout`.
  RedisStore(const std::string& host, int port, const std::string& job_id,
             std::chrono::milliseconds timeout);
  ~RedisStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  std::string describe() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tp::distributed
