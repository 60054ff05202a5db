// How the ranks of a ProcessGroupGloo meet and connect (gloo_rendezvous.h).
#include "gloo_rendezvous.h"

#include <fcntl.h>
#include <unistd.h>

#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "../collective_fingerprint.h"
#include "../rank_list.h"
#include "tensorplay/error.h"

namespace tp::distributed::detail {

using std::chrono::milliseconds;

constexpr const char* kWho = "tp::distributed::ProcessGroupGloo";

// Note [Rendezvous in two steps]
// Gloo's FileStore rendezvous reports a missing rank as "Wait timeout for
// key(s): [2]" (and measures its timeout in whole seconds). So before Gloo
// sees the directory, every rank drops a marker file and waits until all
// markers are there: a missing rank becomes an error that lists who arrived
// and who did not, and the Gloo step only connects processes known to be
// alive. A marker that already exists means the directory is being reused;
// Gloo would then read an earlier job's addresses, so that is an error too.
// Each marker holds its rank's world size (written to a temporary name, then
// renamed, so a marker is never seen half-written): ranks that disagree on it
// learn so at once, with both sizes, instead of Gloo's "136 vs 68".
// connectFullMesh can return on one rank while another is still connecting
// (its last pair's handshake in flight), and a rank that left at that moment
// would fail its peer inside the rendezvous. So the constructor ends with one
// Gloo barrier, not counted in counters() and without a user-visible sequence
// number: when it returns, every rank has connected.
namespace {

std::string marker_path(const std::string& dir, int rank) {
  return dir + "/tp-rank-" + std::to_string(rank) + ".arrived";
}

[[noreturn]] void marker_write_failed(const std::string& path, int rank, int err) {
  TP_THROW(DistributedError, kWho, ": rank ", rank, ": cannot write '", path, "' (",
           std::strerror(err), ")",
           err == ENOSPC ? ": the disk holding the rendezvous directory is full; free space "
                           "or set TMPDIR to another disk"
                         : "; pass file://DIR with a directory every rank can write");
}

// Drops this rank's marker, holding its world size.
void write_marker(const std::string& dir, int rank, int size) {
  const std::string mine = marker_path(dir, rank);
  if (::access(mine.c_str(), F_OK) == 0) {
    TP_THROW(DistributedError, kWho, ": rank ", rank, " of ", size,
             ": the rendezvous directory '", dir, "' already holds a marker for rank ",
             rank, ", left by an earlier job or by another process given the same rank; "
             "use a fresh directory for every job (tp::TempDir) and a distinct rank "
             "per process");
  }
  const std::string temporary = mine + ".writing-" + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) marker_write_failed(temporary, rank, errno);
  // A few bytes into a fresh file: one write() writes them all or fails (a
  // short count here can only mean the disk filled up).
  const std::string text = std::to_string(size) + "\n";
  const ssize_t n = ::write(fd, text.data(), text.size());
  int err = n < 0 ? errno : (n != static_cast<ssize_t>(text.size()) ? ENOSPC : 0);
  if (::close(fd) != 0 && err == 0) err = errno;  // some filesystems report ENOSPC here
  if (err != 0) {
    ::unlink(temporary.c_str());
    marker_write_failed(temporary, rank, err);
  }
  // link(), not rename(): it fails if the marker exists, so two processes
  // given the same rank cannot both get through.
  const int linked = ::link(temporary.c_str(), mine.c_str());
  const int link_err = errno;
  ::unlink(temporary.c_str());
  if (linked != 0 && link_err == EEXIST) {
    TP_THROW(DistributedError, kWho, ": rank ", rank, " of ", size, ": another process given "
             "rank ", rank, " arrived at the same moment in '", dir, "'; give every process "
             "a distinct rank");
  }
  if (linked != 0) marker_write_failed(mine, rank, link_err);
}

// The world size in rank r's marker; 0 if the marker is not there (yet).
int marker_world_size(const std::string& dir, int r) {
  const int fd = ::open(marker_path(dir, r).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[32] = {};
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  return n > 0 ? std::atoi(text) : 0;
}

}  // namespace

void wait_for_all_ranks(const std::string& dir, int rank, int size, milliseconds timeout) {
  write_marker(dir, rank, size);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    std::vector<int> arrived;
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      const int theirs = marker_world_size(dir, r);
      (theirs > 0 ? arrived : missing).push_back(r);
      if (theirs > 0 && theirs != size) {
        TP_THROW(DistributedError, kWho, ": rank ", rank, " was started with world size ",
                 size, " but rank ", r, " with world size ", theirs,
                 "; every rank of a job must be given the same world size");
      }
    }
    // A rank beyond this rank's world size that arrived says the same.
    if (const int theirs = marker_world_size(dir, size); theirs > 0) {
      TP_THROW(DistributedError, kWho, ": rank ", rank, " was started with world size ",
               size, " but rank ", size, " (outside it) arrived with world size ", theirs,
               "; every rank of a job must be given the same world size");
    }
    if (missing.empty()) return;
    if (std::chrono::steady_clock::now() - start >= timeout) {
      TP_THROW(DistributedError, kWho, ": rank ", rank, " of ", size, " waited ",
               timeout.count(), " ms for the others at rendezvous in '", dir,
               "'; arrived: ", rank_list(arrived),
               "; missing: ", rank_list(missing),
               ". Did every rank start and call init_process_group with the same "
               "file:// directory and world size?");
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
}

std::shared_ptr<gloo::Context> connect_mesh(gloo::rendezvous::Store& store,
                                            std::shared_ptr<gloo::transport::Device>& device,
                                            int rank, int size, milliseconds timeout,
                                            const ExplainFailure& explain) {
  try {
    auto connecting = std::make_shared<gloo::rendezvous::Context>(rank, size);
    connecting->setTimeout(timeout);
    connecting->connectFullMesh(store, device);
    // Return only once every rank has connected; run here, before the
    // communication thread exists, it is not a collective of the group: no
    // counter, no sequence number.
    gloo::BarrierOptions connected(connecting);
    connected.setTag(make_tag(0, {}));
    connected.setTimeout(timeout);
    gloo::barrier(connected);
    return connecting;
  } catch (const gloo::IoException& e) {
    if (mentions_timeout(e.what())) throw TimeoutError(explain(e));
    throw PeerFailedError(explain(e));
  } catch (const DistributedError&) {
    throw;  // the store's own error already says what happened
  } catch (const std::exception& e) {
    throw DistributedError(explain(e));
  }
}

bool mentions_timeout(const std::string& message) {
  std::string lower = message;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find("timed out") != std::string::npos ||
         lower.find("timeout") != std::string::npos;
}

}  // namespace tp::distributed::detail
