// Where ranks leave their collective counts for each other (count_board.h).
#include "count_board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "tensorplay/distributed/tcp_store.h"
#include "tensorplay/error.h"

namespace tp::distributed::detail {

using tp::detail::cat;

namespace {

std::string record_key(int rank, int slot) {
  return cat("tp-collective-count-", rank, "-", slot);
}

}  // namespace

StoreCountBoard::StoreCountBoard(std::shared_ptr<Store> store) : store_(std::move(store)) {
  // Rank 0 runs the server in its own process: nothing to wait for there.
  if (const auto* tcp = dynamic_cast<const TCPStore*>(store_.get()); tcp && !tcp->is_server()) {
    try {
      store_ = std::make_shared<TCPStore>(tcp->host(), tcp->port(), /*is_server=*/false,
                                          kStoreAnswer);
    } catch (const DistributedError&) {
      // Not connected within kStoreAnswer (a loaded machine): the group's
      // own connection serves, with the group's timeout.
    }
  }
}

void StoreCountBoard::write(int rank, int slot, int64_t value) {
  store_->add(record_key(rank, slot), value - written_[slot]);
  written_[slot] = value;
}

int64_t StoreCountBoard::read(int rank, int slot) {
  return store_->add(record_key(rank, slot), 0);  // one round trip; 0 while missing
}

int64_t StoreCountBoard::write_then_read(int rank, int slot, int64_t value, int other) {
  const std::vector<int64_t> values = store_->add_each(
      {{record_key(rank, slot), value - written_[slot]}, {record_key(other, slot), 0}});
  written_[slot] = value;
  return values[1];
}

FileCountBoard::FileCountBoard(const std::string& dir, int size)
    : bytes_(2 * static_cast<std::size_t>(size) * sizeof(int64_t)) {
  const std::string path = dir + "/collective-counts";
  const auto fail = [&](const char* what) {
    TP_THROW(DistributedError, "tp::distributed: cannot ", what, " '", path, "' (",
             std::strerror(errno), "), the file where the ranks of a file:// job compare "
             "their collective counts; is the rendezvous directory's disk full?");
  };
  const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) fail("create");
  // Every rank sizes it alike; a file grown by ftruncate reads as zeros.
  if (::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
    ::close(fd);
    fail("size");
  }
  void* mapped = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (mapped == MAP_FAILED) fail("map");
  words_ = static_cast<int64_t*>(mapped);
}

// Shared with the other ranks' processes: the word must be lock-free.
static_assert(std::atomic_ref<int64_t>::required_alignment == alignof(int64_t) &&
              std::atomic<int64_t>::is_always_lock_free);

FileCountBoard::~FileCountBoard() { ::munmap(words_, bytes_); }

void FileCountBoard::write(int rank, int slot, int64_t value) {
  std::atomic_ref<int64_t>(words_[2 * rank + slot]).store(value, std::memory_order_seq_cst);
}

int64_t FileCountBoard::read(int rank, int slot) {
  return std::atomic_ref<int64_t>(words_[2 * rank + slot]).load(std::memory_order_seq_cst);
}

}  // namespace tp::distributed::detail
