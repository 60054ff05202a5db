// tp::TempDir: mkdtemp(3) on the way in, a recursive remove on the way out.
#include "tensorplay/util/temp_dir.h"

#include <stdlib.h>  // mkdtemp

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <system_error>
#include <vector>

#include "tensorplay/error.h"

namespace tp {

namespace {

// $TMPDIR if it is set and non-empty (as mktemp(1) does), else /tmp.
std::string temp_root() {
  const char* tmpdir = std::getenv("TMPDIR");
  if (tmpdir != nullptr && tmpdir[0] != '\0') return tmpdir;
  return "/tmp";
}

// The live, not kept TempDirs of this process, for remove_all_live().
std::mutex g_live_mutex;
std::set<std::string>& live_paths() {
  static std::set<std::string> paths;
  return paths;
}

void forget(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  live_paths().erase(path);
}

}  // namespace

TempDir::TempDir(const std::string& prefix) {
  std::string root = temp_root();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  // mkdtemp needs a writable, NUL-terminated buffer ending in "XXXXXX";
  // it replaces the Xs with a unique suffix and creates the directory
  // (mode 0700) atomically, so two jobs never share a directory.
  std::string pattern = root + "/" + prefix + "-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) {
    const int err = errno;
    TP_THROW(Error, "tp::TempDir: cannot create a directory from the pattern '",
             pattern, "' (", std::strerror(err),
             "); set TMPDIR to a writable directory");
  }
  path_ = buffer.data();
  std::lock_guard<std::mutex> lock(g_live_mutex);
  live_paths().insert(path_);
}

void TempDir::keep() {
  keep_ = true;
  forget(path_);
}

void TempDir::remove_all_live() {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  for (const std::string& path : live_paths()) {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  live_paths().clear();
}

TempDir::~TempDir() {
  if (keep_ || path_.empty()) return;
  forget(path_);
  // A destructor must not throw: use the error_code overload and ignore
  // failures (a leftover directory in /tmp is harmless).
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace tp
