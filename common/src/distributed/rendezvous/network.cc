// Local addresses and interfaces (Note [Choosing the interface]), and the
// host's name.
#include "network.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "tensorplay/error.h"

namespace tp::distributed::detail {

std::string local_address_towards(const std::string& host, int port, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    TP_THROW(DistributedError, "tp::distributed: ", what, " '", host, "' does not resolve (",
             ::gai_strerror(rc), "); set it to a host name or address of the master");
  }
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // connect() on a UDP socket only picks the route and the source address.
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof local;
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
        char text[INET6_ADDRSTRLEN] = {};
        const void* raw = local.ss_family == AF_INET6
                              ? static_cast<const void*>(
                                    &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                              : static_cast<const void*>(
                                    &reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
        ::inet_ntop(local.ss_family, raw, text, sizeof text);
        ::close(fd);
        ::freeaddrinfo(found);
        return text;
      }
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  TP_THROW(DistributedError, "tp::distributed: no route from this machine to ", what, " '",
           host, "' (", last_error, "); is the network up? Set GLOO_SOCKET_IFNAME to the "
           "interface that reaches the other machines");
}

void check_interface(const std::string& name, const std::string& what) {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return;  // cannot list them: let Gloo try
  bool found = false;
  std::set<std::string> names;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    names.insert(i->ifa_name);
    found = found || name == i->ifa_name;
  }
  ::freeifaddrs(all);
  if (found) return;
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  TP_THROW(DistributedError, "tp::distributed: ", what, " names interface '", name,
           "', which this machine does not have (or which has no address); interfaces "
           "with an address here: ", list);
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "(unknown host)";
  return name;
}

}  // namespace tp::distributed::detail
