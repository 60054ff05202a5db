// tp::distributed::TCPStore: a small key-value store over TCP, the
// rendezvous of env:// and tcp:// (torch.distributed's TCPStore, in small).
//
// Contract:
//   - One process (rank 0 under env://) is the server: it listens on `port`
//     of every local address (port 0: a free port, see port()) and serves
//     every client from threads of its own until it is destroyed. The
//     server is also a client of itself, so every rank uses the same calls.
//   - A client connects to host:port, retrying a refused connection (the
//     server may start later) until `timeout`; then it throws
//     tp::DistributedError naming host:port and the last reason. A host
//     name that does not resolve fails at once.
//   - Each request is one round trip under the client's own mutex; every
//     send and receive is bounded by `timeout`, so a server whose host
//     vanished (a link taken down) is an error, not a hang. A server that
//     closed the connection is a tp::PeerFailedError.
//   - get() and wait() poll check() every 10 ms, like Gloo's own stores: a
//     rendezvous waits for a handful of keys once per job.
//   - Wire format, both ways: a request is a command byte and
//     length-prefixed strings; see tcp_store.cc.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "tensorplay/distributed/store.h"

namespace tp::distributed {

class TCPStore : public Store {
 public:
  // REQUIRES: 0 <= port < 65536; port 0 only with is_server.
  // Throws tp::DistributedError when the server cannot listen (the port is
  // in use) or the client cannot connect within timeout.
  TCPStore(const std::string& host, int port, bool is_server,
           std::chrono::milliseconds timeout);
  ~TCPStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  // Every add in one message; the server answers them in order.
  std::vector<int64_t> add_each(const std::vector<std::pair<std::string, int64_t>>& adds) override;
  bool check(const std::vector<std::string>& keys) override;
  std::string describe() const override;

  // The port the server listens on (the chosen one when constructed with 0).
  int port() const { return port_; }
  // The host the client connects to.
  const std::string& host() const { return host_; }
  // Whether this object runs the server (rank 0's, under env://).
  bool is_server() const { return server_ != nullptr; }

 private:
  class Server;
  class Client;
  const std::string host_;
  int port_;
  std::unique_ptr<Server> server_;  // only in the serving process
  std::unique_ptr<Client> client_;
};

}  // namespace tp::distributed
