// tp::distributed::detail::prepare_rendezvous_dir: the checks on a file://
// rendezvous directory (rendezvous_dir.h), made before any rank waits on
// another, so that a directory no rank can use is an error at once.
#include "rendezvous_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "tensorplay/error.h"

namespace tp::distributed::detail {

void prepare_rendezvous_dir(const std::string& dir, int rank, const char* caller) {
  const auto fail = [&](const std::string& cause) {
    TP_THROW(DistributedError, caller, ": rank ", rank, ": rendezvous directory '", dir,
             "' is not writable (", cause,
             "); pass file://DIR with a directory every rank can write, such as a "
             "fresh tp::TempDir");
  };
  if (dir.empty()) fail("the path is empty");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // mkdir -p; fine if it exists
  if (ec) fail("cannot create it: " + ec.message());
  if (!std::filesystem::is_directory(dir, ec)) fail("it is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) fail(std::strerror(errno));
  // access() says yes to root almost everywhere (even in /proc); creating a
  // file is the test that cannot lie.
  const std::string probe = dir + "/.tp-write-probe-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) fail(std::string("cannot create a file in it: ") + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace tp::distributed::detail
