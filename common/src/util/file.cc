// tp::write_file and tp::check_writable with POSIX calls, so that errno is
// the reason of the call that failed (an std::ofstream hides it).
#include "tensorplay/util/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
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

// Writes all of `content` to `fd` and closes it; 0, or the errno of the
// step that failed (the descriptor is closed either way).
int write_all_and_close(int fd, std::string_view content) {
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      return err;
    }
    done += static_cast<std::size_t>(n);
  }
  // Some filesystems (NFS, for one) report a full disk only here.
  return ::close(fd) == 0 ? 0 : errno;
}

// The file a write to `path` replaces: the target of a symlink (so the
// link stays a link), else `path` itself.
std::string replaced_file(const std::string& path) {
  struct stat link {};
  if (::lstat(path.c_str(), &link) != 0 || !S_ISLNK(link.st_mode)) return path;
  char* target = ::realpath(path.c_str(), nullptr);
  if (target == nullptr) return path;  // a dangling link: write through it
  std::string out = target;
  std::free(target);
  return out;
}

}  // namespace

// Note [Replace whole or not at all]
// A temporary file next to the target, renamed over it once complete:
// rename() within one filesystem is atomic, so the path names either the
// old file or the whole new one. The temporary is in the same folder (not
// in TMPDIR) because rename() cannot cross filesystems. Devices and FIFOs
// are written in place: renaming over /dev/full would replace the device.
void write_file(const std::string& path, std::string_view content, std::string_view what) {
  const std::string target = replaced_file(path);
  struct stat existing {};
  if (::stat(target.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode)) {
    const int fd = ::open(target.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) fail("open", what, path, errno);
    if (const int err = write_all_and_close(fd, content); err != 0) fail("write", what, path, err);
    return;
  }
  const std::size_t slash = target.rfind('/');
  const std::string folder = slash == std::string::npos ? "" : target.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? target : target.substr(slash + 1);
  std::string temp = folder + "." + name + ".XXXXXX";
  const int fd = ::mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) fail("write", what, path, errno);
  // mkostemp makes 0600; an output file is for others to read too. (Not
  // 0644 & ~umask: reading the umask means setting it, which races with
  // other threads creating files.)
  ::fchmod(fd, 0644);
  if (const int err = write_all_and_close(fd, content); err != 0) {
    ::unlink(temp.c_str());
    fail("write", what, path, err);
  }
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    fail("write", what, path, err);
  }
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
