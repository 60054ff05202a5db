// Private to libtensorplay: where the ranks of a group leave their
// collective counts for each other, for ProcessGroup::check_collective_count
// (Note [Counting collectives] in process_group.cc). Two records per rank,
// for odd and even points, each a 64-bit value; 0 until written.
//
//   - StoreCountBoard keeps them in the group's rendezvous store (env://'s
//     TCP store, redis://): one round trip per check to a TCP store, four
//     to redis (each add is two commands there).
//   - FileCountBoard keeps them in a file of a file:// job's rendezvous
//     directory that every rank maps into memory (the ranks of such a job
//     share one machine): a check is two memory accesses. Files written and
//     renamed through the directory store cost several hundred microseconds
//     a check, too much for every step.
//
// A board is used by its rank's issuing thread only; its records are read
// by the other ranks at any time, each a single atomic 64-bit word.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "tensorplay/distributed/process_group.h"
#include "tensorplay/distributed/store.h"

namespace tp::distributed {

class CountBoard {
 public:
  virtual ~CountBoard() = default;
  // Rank `rank`'s record `slot` (0 or 1) becomes `value`. A rank writes
  // only its own records, each value larger than the one before.
  virtual void write(int rank, int slot, int64_t value) = 0;
  // Rank `rank`'s record `slot`, 0 while it has written none.
  virtual int64_t read(int rank, int slot) = 0;
  // write(rank, slot, value), then read(other, slot): what each check does.
  virtual int64_t write_then_read(int rank, int slot, int64_t value, int other) {
    write(rank, slot, value);
    return read(other, slot);
  }
};

namespace detail {

// Records as store keys, written with add() (the one write every store
// allows more than once: redis refuses a second set).
//
// A TCP store lives in rank 0's process. A check must not hang on a rank 0
// that is stopped or busy: it would hold every other rank at its step's end
// for the store's timeout (the collective timeout), outside any collective,
// before its next collective timed out in turn. So for a TCP store the
// board opens a connection of its own (except on rank 0, which runs the
// server) with a short timeout (kStoreAnswer):
// past it the check stops, saying so, and the rank goes on to the
// collective where the hang is named.
class StoreCountBoard : public CountBoard {
 public:
  // Far below a collective timeout, far above a loaded machine's stall.
  static constexpr std::chrono::milliseconds kStoreAnswer{2000};
  explicit StoreCountBoard(std::shared_ptr<Store> store);
  void write(int rank, int slot, int64_t value) override;
  int64_t read(int rank, int slot) override;
  // Both in one round trip where the store can (Store::add_each).
  int64_t write_then_read(int rank, int slot, int64_t value, int other) override;

 private:
  std::shared_ptr<Store> store_;
  int64_t written_[2] = {0, 0};  // what this rank's records hold (add() takes a difference)
};

// Records in "<dir>/collective-counts", 2 * size words, mapped by every
// rank. Throws tp::DistributedError naming the file when it cannot be made
// or mapped. REQUIRES: dir exists and is writable (prepare_rendezvous_dir).
class FileCountBoard : public CountBoard {
 public:
  FileCountBoard(const std::string& dir, int size);
  ~FileCountBoard() override;
  FileCountBoard(const FileCountBoard&) = delete;
  FileCountBoard& operator=(const FileCountBoard&) = delete;
  void write(int rank, int slot, int64_t value) override;
  int64_t read(int rank, int slot) override;

 private:
  int64_t* words_ = nullptr;  // 2 * size, record (rank, slot) at 2 * rank + slot
  std::size_t bytes_ = 0;
};

}  // namespace detail
}  // namespace tp::distributed
