// tp::distributed::detail::DirStore: a Store in a directory (dir_store.h).
#include "dir_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "tensorplay/error.h"

namespace tp::distributed::detail {

namespace {

// Reads the whole file; false when it does not exist.
bool read_file(const std::string& path, std::string& value) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream text;
  text << in.rdbuf();
  value = text.str();
  return true;
}

}  // namespace

std::string DirStore::path(const std::string& key) const {
  std::string name = "store-";
  for (const char c : key) {
    if (c == '/') {
      name += "%2F";
    } else if (c == '%') {
      name += "%25";
    } else {
      name += c;
    }
  }
  return dir_ + "/" + name;
}

void DirStore::set(const std::string& key, const std::string& value) {
  const std::string target = path(key);
  const std::string temporary = target + ".writing-" + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << value;
    out.close();
    if (!out) {
      std::remove(temporary.c_str());
      TP_THROW(DistributedError, "tp::distributed: cannot write key '", key, "' in ",
               describe(), " (", std::strerror(errno), "); is the disk full?");
    }
  }
  if (std::rename(temporary.c_str(), target.c_str()) != 0) {
    const int err = errno;
    std::remove(temporary.c_str());
    TP_THROW(DistributedError, "tp::distributed: cannot write key '", key, "' in ", describe(),
             " (", std::strerror(err), ")");
  }
}

std::string DirStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  std::string value;
  while (!read_file(path(key), value)) {
    if (std::chrono::steady_clock::now() - start >= timeout) {
      TP_THROW(TimeoutError, "tp::distributed: key '", key, "' did not appear in ", describe(),
               " within ", timeout.count(), " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return value;
}

int64_t DirStore::add(const std::string& key, int64_t delta) {
  const std::string lock_path = dir_ + "/store.lock";
  const int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) {
    TP_THROW(DistributedError, "tp::distributed: cannot open '", lock_path, "' (",
             std::strerror(errno), ")");
  }
  while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  int64_t value = delta;
  try {
    std::string text;
    if (read_file(path(key), text)) value += std::stoll(text);
    set(key, std::to_string(value));
  } catch (...) {
    ::close(fd);  // releases the lock
    throw;
  }
  ::close(fd);
  return value;
}

bool DirStore::check(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    if (::access(path(key).c_str(), F_OK) != 0) return false;
  }
  return true;
}

}  // namespace tp::distributed::detail
