// The rendezvous in a store (Note [Rendezvous in a store]) and Gloo's view
// of a tp Store.
#include "store_rendezvous.h"

#include "network.h"
#include "../rank_list.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "tensorplay/error.h"

namespace tp::distributed::detail {

using std::chrono::milliseconds;

namespace {

std::string size_key(int rank) { return "tp/size/" + std::to_string(rank); }

}  // namespace

void check_same_job(Store& store, int rank, const std::string& job_id, milliseconds timeout) {
  if (rank == 0) {
    store.set("tp/job", job_id);
    return;
  }
  const std::string theirs = store.get("tp/job", timeout);
  if (theirs != job_id) {
    const auto name = [](const std::string& id) {
      return id.empty() ? std::string("no TP_JOB_ID") : "TP_JOB_ID '" + id + "'";
    };
    TP_THROW(DistributedError, "this rank belongs to another job: the store there is rank 0's "
             "of a job with ", name(theirs), ", and this rank was started with ", name(job_id),
             ". Two jobs use one master address and port; this rank left without joining it. "
             "Give each job its own MASTER_PORT (or start it with its own tprun, which gives "
             "every job an id of its own)");
  }
}

void meet_in_store(Store& store, int rank, int size, milliseconds timeout, const char* caller) {
  const std::string claim = "tp/claim/" + std::to_string(rank);
  const std::string claimer = "tp/claimer/" + std::to_string(rank);
  const std::string me = "pid " + std::to_string(::getpid()) + " on host " + host_name();
  const int64_t claims = store.add(claim, 1);
  if (claims > 1) {
    // Who holds the rank: the winner writes it right after its claim, so a
    // short wait finds it (a winner that died in between says nothing).
    std::string holder = "a process that has not said which";
    try {
      holder = store.get(claimer, std::min(timeout, milliseconds(2000)));
    } catch (const Error&) {
    }
    TP_THROW(DistributedError, caller, ": rank ", rank, " of ", size, ": rank ", rank,
             " was already claimed in ", store.describe(), store.describe_key(claim), " by ",
             holder, " (this process is ", me, "): two processes were given the same RANK, "
             "or an earlier job with the same address (or job id) is still running; give "
             "each process its own rank and each job its own MASTER_PORT or job id (tprun "
             "gives every job an id of its own)");
  }
  store.set(claimer, me);
  store.set(size_key(rank), std::to_string(size));

  std::vector<bool> seen(static_cast<std::size_t>(size), false);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    std::vector<int> arrived, missing;
    for (int r = 0; r < size; ++r) {
      if (!seen[r] && store.check({size_key(r)})) {
        const std::string theirs = store.get(size_key(r), timeout);
        if (theirs != std::to_string(size)) {
          TP_THROW(DistributedError, caller, ": rank ", rank, ": the ranks disagree on the "
                   "world size: rank ", r, " was started with world size ", theirs,
                   ", this rank with ", size, " (", store.describe(),
                   "); start every rank with the same WORLD_SIZE");
        }
        seen[r] = true;
      }
      (seen[r] ? arrived : missing).push_back(r);
    }
    if (missing.empty()) return;
    if (std::chrono::steady_clock::now() - start >= timeout) {
      TP_THROW(TimeoutError, caller, ": rank ", rank, " of ", size, " waited ",
               timeout.count(), " ms for the others at rendezvous in ", store.describe(),
               "; arrived: ", detail::rank_list(arrived),
               "; missing: ", detail::rank_list(missing),
               ". Did every rank start, with the same master address (or redis:// and job "
               "id) and WORLD_SIZE?");
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_.set("gloo/" + key, std::string(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  const std::string value = store_.get("gloo/" + key, timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  std::vector<std::string> prefixed;
  for (const std::string& key : keys) prefixed.push_back("gloo/" + key);
  store_.wait(prefixed, timeout);
}

}  // namespace tp::distributed::detail
