// Private to libtensorplay: a tp::distributed::Store in a directory, for
// backends that need a Store where file:// gives only a directory (the NCCL
// backend's init_process_group("nccl", ..., "file://DIR")). Every rank of
// such a job runs on this machine, so files are enough.
//
// Each key is one file, "store-<key with / and % escaped>", written under a
// temporary name and renamed, so a reader never sees half a value. add()
// holds an flock on "store.lock" around its read-modify-write. get() and
// wait() poll every 5 ms, at most their timeout (then tp::TimeoutError
// naming the keys and the directory).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "tensorplay/distributed/store.h"

namespace tp::distributed::detail {

class DirStore : public Store {
 public:
  // REQUIRES: dir exists and is writable (prepare_rendezvous_dir).
  explicit DirStore(std::string dir) : dir_(std::move(dir)) {}

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  std::string describe() const override { return "the directory store in '" + dir_ + "'"; }
  const std::string& dir() const { return dir_; }

 private:
  std::string path(const std::string& key) const;
  const std::string dir_;
};

}  // namespace tp::distributed::detail
