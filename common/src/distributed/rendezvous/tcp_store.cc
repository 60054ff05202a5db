// tp::distributed::TCPStore: a server that keeps a map in memory, and a
// client that asks it one request at a time.
//
// Wire format (both directions, integers little-endian as the hosts are):
//   request:  u8 command, then the command's fields
//     SET   key value        -> u8 1
//     GET   key              -> u8 found, value (empty when not found)
//     ADD   key i64 delta    -> i64 new value
//     CHECK u32 n, n keys    -> u8 1 when every key exists
//   a string is a u32 length and that many bytes.
// GET answers at once; waiting is the client's job (Store::wait polls
// check()), so the server never blocks on one client for another.
#include "tensorplay/distributed/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "tensorplay/error.h"

namespace tp::distributed {

using std::chrono::milliseconds;
using tp::detail::cat;

namespace {

constexpr const char* kWho = "tp::distributed::TCPStore";

enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4 };

// Keys and values are bounded so that a stray connection (a port scanner,
// an HTTP client pointed at MASTER_PORT) cannot make the server allocate
// gigabytes from a garbage length.
constexpr uint32_t kMaxString = 64u << 20;

// Thrown by the I/O helpers below; each side turns it into its own message.
struct IoFailure {
  std::string what;
  bool closed = false;  // the peer closed the connection (not a timeout)
};

void send_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) {
      const bool timed_out = sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      throw IoFailure{timed_out ? "no answer in time" : std::strerror(errno), !timed_out};
    }
    p += sent;
    n -= static_cast<std::size_t>(sent);
  }
}

void recv_all(int fd, void* data, std::size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got == 0) throw IoFailure{"the connection was closed", true};
    if (got < 0) {
      const bool timed_out = errno == EAGAIN || errno == EWOULDBLOCK;
      throw IoFailure{timed_out ? "no answer in time" : std::strerror(errno), !timed_out};
    }
    p += got;
    n -= static_cast<std::size_t>(got);
  }
}

template <typename T>
void send_value(int fd, T v) {
  send_all(fd, &v, sizeof v);
}

// A message of several fields, built in memory and sent with one send():
// with TCP_NODELAY every send() goes out as a packet of its own, and the
// peer wakes for each (an add is four fields: four packets, a round trip
// about twice as long, measured with bench_allreduce's BM_CountCheck).
class Outgoing {
 public:
  template <typename T>
  Outgoing& value(T v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Outgoing& string(const std::string& s) {
    value<uint32_t>(static_cast<uint32_t>(s.size()));
    bytes_ += s;
    return *this;
  }
  void send(int fd) const { send_all(fd, bytes_.data(), bytes_.size()); }

 private:
  std::string bytes_;
};

template <typename T>
T recv_value(int fd) {
  T v{};
  recv_all(fd, &v, sizeof v);
  return v;
}


std::string recv_string(int fd) {
  const uint32_t n = recv_value<uint32_t>(fd);
  if (n > kMaxString) throw IoFailure{cat("a string of ", n, " bytes is too long"), false};
  std::string s(n, '\0');
  recv_all(fd, s.data(), n);
  return s;
}

// Bounds every send and receive on fd by `timeout`.
void set_io_timeout(int fd, milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

}  // namespace

// ---- the server ------------------------------------------------------------------

class TCPStore::Server {
 public:
  // Listens on `port` (0: any free port) of every local address.
  explicit Server(int port) {
    listen_fd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool v6 = listen_fd_ >= 0;
    if (!v6) listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) fail(port, std::strerror(errno));
    const int one = 1, zero = 0;
    // A restarted job may reuse the port while the last job's connections
    // linger in TIME_WAIT; that is safe for a listening socket.
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (v6) {
      ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 too
      sockaddr_in6 addr{};
      addr.sin6_family = AF_INET6;
      addr.sin6_addr = in6addr_any;
      addr.sin6_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    } else {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
      addr.sin_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    }
    if (rc != 0 || ::listen(listen_fd_, 128) != 0) {
      const int err = errno;
      ::close(listen_fd_);
      fail(port, err == EADDRINUSE
                     ? cat("port ", port, " is in use (", std::strerror(err),
                           "): another job or program listens there; pick a free port")
                     : std::string(std::strerror(err)));
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
    port_ = ntohs(bound.ss_family == AF_INET6
                      ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                      : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  ~Server() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      // shutdown() wakes the threads blocked in accept() and recv().
      ::shutdown(listen_fd_, SHUT_RDWR);
      for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
    }
    accept_thread_.join();
    for (std::thread& t : client_threads_) t.join();
    for (int fd : client_fds_) ::close(fd);
    ::close(listen_fd_);
  }

  int port() const { return port_; }

 private:
  [[noreturn]] static void fail(int port, const std::string& cause) {
    TP_THROW(DistributedError, kWho, ": cannot listen on port ", port, ": ", cause);
  }

  void accept_loop() {
    for (;;) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      const int err = errno;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) {
          if (fd >= 0) ::close(fd);
          return;
        }
        if (fd >= 0) {
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          client_fds_.push_back(fd);
          client_threads_.emplace_back([this, fd] { serve(fd); });
          continue;
        }
      }
      // A connection reset before accept, EINTR: keep serving. Out of
      // descriptors: keep serving too, without spinning.
      if (err == EMFILE || err == ENFILE) std::this_thread::sleep_for(milliseconds(10));
    }
  }

  // Answers one client until it hangs up. A malformed request ends only
  // that client's connection; the store goes on serving the others.
  void serve(int fd) {
    try {
      for (;;) {
        const auto command = recv_value<uint8_t>(fd);
        switch (command) {
          case kSet: {
            std::string key = recv_string(fd);
            std::string value = recv_string(fd);
            {
              std::lock_guard<std::mutex> lock(mutex_);
              data_[std::move(key)] = std::move(value);
            }
            send_value<uint8_t>(fd, 1);
            break;
          }
          case kGet: {
            const std::string key = recv_string(fd);
            std::string value;
            bool found = false;
            {
              std::lock_guard<std::mutex> lock(mutex_);
              auto it = data_.find(key);
              if (it != data_.end()) {
                found = true;
                value = it->second;
              }
            }
            Outgoing().value<uint8_t>(found ? 1 : 0).string(value).send(fd);
            break;
          }
          case kAdd: {
            const std::string key = recv_string(fd);
            const auto delta = recv_value<int64_t>(fd);
            int64_t now = 0;
            {
              std::lock_guard<std::mutex> lock(mutex_);
              std::string& slot = data_[key];
              now = (slot.empty() ? 0 : std::stoll(slot)) + delta;
              slot = std::to_string(now);
            }
            send_value<int64_t>(fd, now);
            break;
          }
          case kCheck: {
            const auto n = recv_value<uint32_t>(fd);
            if (n > 1u << 20) return;
            bool all = true;
            for (uint32_t i = 0; i < n; ++i) {
              const std::string key = recv_string(fd);
              std::lock_guard<std::mutex> lock(mutex_);
              all = all && data_.count(key) > 0;
            }
            send_value<uint8_t>(fd, all ? 1 : 0);
            break;
          }
          default:
            return;  // not a TCPStore client
        }
      }
    } catch (const IoFailure&) {
      // The client left or sent garbage: nothing to answer.
    } catch (const std::exception&) {
      // ADD on a key that holds no integer: drop that client.
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;  // constant after construction
  std::mutex mutex_;
  std::map<std::string, std::string> data_;  // guarded by mutex_
  bool stopping_ = false;                    // guarded by mutex_
  std::vector<int> client_fds_;              // guarded by mutex_
  std::vector<std::thread> client_threads_;  // accept thread only, then the destructor
  std::thread accept_thread_;
};

// ---- the client ------------------------------------------------------------------

class TCPStore::Client {
 public:
  Client(const std::string& host, int port, milliseconds timeout)
      : where_(cat("the TCP store at ", host, ":", port)), timeout_(timeout) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string service = std::to_string(port);
    const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
    if (rc != 0) {
      TP_THROW(DistributedError, kWho, ": cannot resolve host '", host, "' (",
               ::gai_strerror(rc), "); pass a host name or address every rank can reach");
    }
    std::string last_error = "no address";
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (fd_ < 0) {
      for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
        fd_ = connect_once(a, deadline, last_error);
      }
      if (fd_ >= 0 || std::chrono::steady_clock::now() >= deadline) break;
      // Refused: the server is not listening yet (rank 0 starts later).
      std::this_thread::sleep_for(milliseconds(20));
    }
    ::freeaddrinfo(found);
    if (fd_ < 0) {
      TP_THROW(DistributedError, kWho, ": could not connect to ", where_, " within ",
               timeout.count(), " ms (last attempt: ", last_error, ")");
    }
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_io_timeout(fd_, timeout);
  }

  ~Client() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Runs one request: `ask` sends it and reads the answer.
  template <typename Ask>
  auto request(const char* what, Ask ask) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_.empty()) {
      TP_THROW(PeerFailedError, kWho, ": ", what, ": ", where_, " is gone (", broken_, ")");
    }
    try {
      return ask(fd_);
    } catch (const IoFailure& e) {
      broken_ = e.what;
      if (e.closed) {
        TP_THROW(PeerFailedError, kWho, ": ", what, ": lost ", where_, " (", e.what,
                 "); did the process hosting it (rank 0 under env://) exit?");
      }
      TP_THROW(DistributedError, kWho, ": ", what, ": ", where_, " did not answer within ",
               timeout_.count(), " ms (", e.what,
               "); is its host still reachable (network link, firewall)?");
    }
  }

  const std::string& where() const { return where_; }

 private:
  // One non-blocking connect, bounded by the deadline. Returns the socket or -1.
  static int connect_once(const addrinfo* a, std::chrono::steady_clock::time_point deadline,
                          std::string& last_error) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                            a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      return -1;
    }
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        const auto left = std::chrono::duration_cast<milliseconds>(
            deadline - std::chrono::steady_clock::now());
        pollfd p{fd, POLLOUT, 0};
        const int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
        if (ready <= 0) {
          err = ETIMEDOUT;
        } else {
          socklen_t len = sizeof err;
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        }
      }
    }
    if (err != 0) {
      last_error = err == ETIMEDOUT ? "no answer from the host: timed out" : std::strerror(err);
      ::close(fd);
      return -1;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // blocking from now on
    return fd;
  }

  const std::string where_;
  const milliseconds timeout_;
  std::mutex mutex_;
  int fd_ = -1;
  std::string broken_;  // guarded by mutex_: why the connection is unusable
};

// ---- TCPStore --------------------------------------------------------------------

TCPStore::TCPStore(const std::string& host, int port, bool is_server, milliseconds timeout)
    : host_(host), port_(port) {
  if (port < 0 || port > 65535 || (port == 0 && !is_server)) {
    TP_THROW(DistributedError, kWho, ": port ", port, " is not a port a client can connect "
             "to; pass 1 .. 65535");
  }
  if (timeout.count() <= 0) {
    TP_THROW(DistributedError, kWho, ": timeout must be positive (got ", timeout.count(),
             " ms)");
  }
  if (is_server) {
    server_ = std::make_unique<Server>(port);
    port_ = server_->port();
  }
  // The server's own client talks to it over loopback: the host name may
  // name an address this machine answers on only from outside (NAT).
  client_ = std::make_unique<Client>(is_server ? "localhost" : host, port_, timeout);
}

TCPStore::~TCPStore() {
  client_.reset();  // hang up before the server stops
  server_.reset();
}

std::string TCPStore::describe() const { return cat("the TCP store at ", host_, ":", port_); }

void TCPStore::set(const std::string& key, const std::string& value) {
  client_->request("set", [&](int fd) {
    Outgoing().value<uint8_t>(kSet).string(key).string(value).send(fd);
    return recv_value<uint8_t>(fd);
  });
}

std::string TCPStore::get(const std::string& key, milliseconds timeout) {
  wait({key}, timeout);
  return client_->request("get", [&](int fd) {
    Outgoing().value<uint8_t>(kGet).string(key).send(fd);
    recv_value<uint8_t>(fd);  // found: wait() just saw it, and keys are never removed
    return recv_string(fd);
  });
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  return client_->request("add", [&](int fd) {
    Outgoing().value<uint8_t>(kAdd).string(key).value<int64_t>(delta).send(fd);
    return recv_value<int64_t>(fd);
  });
}

std::vector<int64_t> TCPStore::add_each(
    const std::vector<std::pair<std::string, int64_t>>& adds) {
  return client_->request("add", [&](int fd) {
    Outgoing request;
    for (const auto& [key, delta] : adds) {
      request.value<uint8_t>(kAdd).string(key).value<int64_t>(delta);
    }
    request.send(fd);
    std::vector<int64_t> values;
    for (std::size_t i = 0; i < adds.size(); ++i) values.push_back(recv_value<int64_t>(fd));
    return values;
  });
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  return client_->request("check", [&](int fd) {
    Outgoing request;
    request.value<uint8_t>(kCheck).value<uint32_t>(static_cast<uint32_t>(keys.size()));
    for (const std::string& key : keys) request.string(key);
    request.send(fd);
    return recv_value<uint8_t>(fd) == 1;
  });
}

}  // namespace tp::distributed
