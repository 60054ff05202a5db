// Private to libtensorplay: how ProcessGroupGloo meets the other ranks in a
// tp::distributed::Store (env://, tcp://, redis://), and Gloo's view of
// such a store.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "tensorplay/distributed/store.h"

namespace tp::distributed::detail {

// Note [Rendezvous in a store]
// The store counterpart of Note [Rendezvous in two steps]: before Gloo sees
// the store, every rank
//   1. claims its rank with add("tp/claim/<rank>", 1): a count above 1 means
//      two processes were given the same RANK (or an earlier job with the
//      same address or job id left its keys), an error at once;
//   2. writes its world size under "tp/size/<rank>";
//   3. waits until every rank of its world has written one, comparing each
//      as it appears: a rank started with another WORLD_SIZE is named at
//      once, and a missing rank, after `timeout`, in a list of who arrived
//      and who did not.
// Only then does Gloo exchange addresses, under keys of its own ("gloo/").
void meet_in_store(Store& store, int rank, int size, std::chrono::milliseconds timeout,
                   const char* caller);

// Note [One job per store]
// env:// ranks meet wherever MASTER_ADDR:MASTER_PORT points; a rank of
// another job started on the same port (a second launch, a stray process)
// would find rank 0's store, claim a rank there and train in the wrong job.
// So a job has an identity, TP_JOB_ID (tprun sets a fresh one per job; a
// bare env:// launch can set its own): rank 0 writes it under "tp/job" as
// soon as its store listens, and every other rank reads it before it claims
// anything, and leaves with an error naming both ids when they differ. A
// rank without TP_JOB_ID has the empty id, so jobs launched without one are
// told apart only by their rank claims. Call before meet_in_store.
void check_same_job(Store& store, int rank, const std::string& job_id,
                    std::chrono::milliseconds timeout);

// Gloo's Store interface over a tp Store; Gloo's keys get the prefix
// "gloo/". get() waits at most `timeout`, as Gloo's own stores do.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(tp::distributed::Store& store, std::chrono::milliseconds timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  tp::distributed::Store& store_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace tp::distributed::detail
