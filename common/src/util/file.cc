// tp::write_file and tp::check_writable with POSIX calls, so that errno is
// the reason of the call that failed (an std::ofstream hides it).
#include "tensorplay/util/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tensorplay/error.h"

namespace tp {

namespace {

[[noreturn]] void fail(std::string_view doing, std::string_view what, const std::string& path,
                       int err) {
  TP_THROW(Error, "cannot ", doing, " ", what, " '", path, "': ", std::strerror(err),
           err == ENOSPC ? " (the disk is full)" : "",
           err == ENOENT ? " (does the directory exist?)" : "");
}

}  // namespace

void write_file(const std::string& path, std::string_view content, std::string_view what) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("open", what, path, errno);
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      fail("write", what, path, err);
    }
    done += static_cast<std::size_t>(n);
  }
  // Some filesystems (NFS, for one) report a full disk only here.
  if (::close(fd) != 0) fail("write", what, path, errno);
}

void check_writable(const std::string& path, std::string_view what) {
  struct stat before {};
  const bool existed = ::stat(path.c_str(), &before) == 0;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail("write", what, path, errno);
  ::close(fd);
  if (!existed) ::unlink(path.c_str());
}

}  // namespace tp
