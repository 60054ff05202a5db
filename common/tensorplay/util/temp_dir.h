// tp::TempDir: a fresh directory under $TMPDIR (or /tmp), removed with its
// contents when the object is destroyed. Used for file:// rendezvous, trace
// files and per-rank results.
#pragma once

#include <string>

namespace tp {

class TempDir {
 public:
  // prefix becomes part of the name: /tmp/<prefix>-XXXXXX.
  explicit TempDir(const std::string& prefix = "tensorplay");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // "file://" + path(): an init_method for init_process_group.
  std::string file_init_method() const { return "file://" + path_; }
  // Keep the directory after destruction (for debugging).
  void keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_ = false;
};

}  // namespace tp
