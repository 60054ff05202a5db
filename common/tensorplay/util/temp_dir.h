// tp::TempDir: a fresh directory under $TMPDIR (or /tmp), removed with its
// contents when the object is destroyed. Used for file:// rendezvous, trace
// files and per-rank results.
//
// A process ended by a signal runs no destructors, so every live TempDir is
// also listed process-wide: remove_all_live() removes them, and
// tp::multiprocessing::spawn calls it when SIGINT, SIGTERM or SIGHUP ends a
// job (Ctrl-C, or `kill` of ./kit), just before the process ends by that
// signal. Thread-safe.
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
  void keep();

  // Removes every live TempDir of this process that is not kept, with its
  // contents. For a process about to end by a signal; the objects stay valid
  // (their destructors find nothing left to remove).
  static void remove_all_live();

 private:
  std::string path_;
  bool keep_ = false;
};

}  // namespace tp
