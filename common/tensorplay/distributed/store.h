// tp::distributed::Store: the key-value store ranks meet in before they can
// talk to each other directly (the rendezvous of env://, tcp:// and redis://).
//
// Contract:
//   - Keys and values are byte strings. set() writes a key once per job:
//     rendezvous keys are written by one rank and read by the others, never
//     overwritten (a store may refuse a second set of the same key).
//   - add(key, delta) adds delta to the integer stored at key (0 when
//     missing), atomically across all clients, and returns the new value:
//     the store's way of counting, for example how many processes claimed
//     a rank.
//   - get() and wait() block until the key(s) exist, at most `timeout`;
//     then they throw tp::TimeoutError naming the missing keys and the
//     store. check() answers at once.
//   - A store that cannot be reached or that goes away throws
//     tp::DistributedError (tp::PeerFailedError when it went away after
//     answering before), naming where it was (describe()).
//   - One client object per process; its methods may be called from one
//     thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tp::distributed {

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` exists (at most timeout), then returns its value.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // add(key, delta) for each pair, in order, returning each new value: in
  // one round trip where the store can send them together (TCPStore), one
  // after another otherwise.
  virtual std::vector<int64_t> add_each(const std::vector<std::pair<std::string, int64_t>>& adds);
  // True when every key exists.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists, at most timeout.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  // Where the store is, for messages: "the TCP store at 10.0.0.1:29500".
  virtual std::string describe() const = 0;
  // What the store knows of when `key` was last written or renewed, for
  // messages (", renewed 4 s ago ..."); "" when it keeps no such record.
  virtual std::string describe_key(const std::string& /*key*/) { return ""; }
};

}  // namespace tp::distributed
