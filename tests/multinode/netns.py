"""Two "machines" on one: network namespaces joined by a veth pair.

    with TwoHosts() as hosts:          # hosts.a, hosts.b: Host objects
        p = hosts.a.popen(["tools/tprun", ...])

Each Host is a network namespace with loopback up and one end of a veth
pair, named INTERFACE ("tp0") inside both namespaces, as two machines may
both call their network "eth0", addressed 10.X.Y.1/24 (host a) and
10.X.Y.2/24 (host b), X.Y drawn
from the process id so that tests running side by side never share a
subnet or a name. Leaving the `with` block kills every process still in
either namespace (SIGKILL), then deletes both (the veth pair goes with
them), whatever happened inside; so does SIGTERM to the test.

TwoHosts() raises Unavailable with the reason when namespaces cannot be
made (not root, no `ip`, no CAP_SYS_ADMIN): the tests then exit 77, which
meson reports as SKIPPED, never as passed. The namespaces themselves, and
their clean-up, are tools/namespaces.py's (bench/shaped_link.py uses them
too).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from namespaces import SKIP, Host, Namespaces, Unavailable  # noqa: E402,F401

INTERFACE = "tp0"  # each host's end of the veth pair, inside its namespace


class TwoHosts(Namespaces):
    def __init__(self):
        super().__init__(["a", "b"])
        self.a, self.b = self.hosts
        self.a.address = f"{self.subnet}.1"
        self.b.address = f"{self.subnet}.2"

    def wire(self):
        # The pair is made with each end already in its namespace, as
        # INTERFACE: nothing of it ever sits in the machine's own namespace.
        self.a.run(["ip", "link", "add", INTERFACE, "type", "veth", "peer", "name", INTERFACE,
                    "netns", self.b.namespace])
        for host in (self.a, self.b):
            host.interface = INTERFACE
            host.run(["ip", "addr", "add", host.address + "/24", "dev", INTERFACE])
            host.run(["ip", "link", "set", INTERFACE, "up"])
