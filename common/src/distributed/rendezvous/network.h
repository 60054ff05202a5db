// Private to libtensorplay: which local address a rank's Gloo pairs listen
// on when its peers are on other machines (Note [Choosing the interface]),
// and this machine's name, for messages that must tell machines apart.
#pragma once

#include <string>

namespace tp::distributed::detail {

// Note [Choosing the interface]
// A rank tells its peers (through the store) the address its Gloo pairs
// listen on, so that address must be one the peers can reach. Like
// torch.distributed, the kit takes
//   1. the interface named by GLOO_SOCKET_IFNAME (or GlooOptions::
//      socket_ifname), when set: the fix when the default guesses wrong;
//   2. otherwise the address this machine would use to reach the master
//      (MASTER_ADDR, or the redis:// host): a route that reaches the master
//      from here usually reaches this machine from there. It is found by
//      connecting a UDP socket, which sends nothing.
// file:// stays on 127.0.0.1: all of its ranks are on one machine.

// The local address of the route to host:port. Throws tp::DistributedError
// naming `what` (for example "MASTER_ADDR") when host does not resolve or
// no route leads there.
std::string local_address_towards(const std::string& host, int port, const std::string& what);

// Throws tp::DistributedError unless this machine has an interface `name`
// with an address; the message lists the interfaces it has.
void check_interface(const std::string& name, const std::string& what);

// This machine's host name (gethostname), or "(unknown host)".
std::string host_name();

}  // namespace tp::distributed::detail
