#!/usr/bin/env python3
"""N hosts on a shaped link: network namespaces joined through a switch,
each host's egress limited to a rate with tc's token bucket filter.

    with ShapedLink(2, "1gbit") as link:        # link.hosts[i]: namespaces.Host
        link.hosts[0].popen([...])              # a process on host 0
        throughput(link, 0, 1, 8 << 20)         # bits/s measured host 0 -> 1
        tc_rate(link.qdisc(0))                  # bits/s host 0's tbf is set to

Over loopback an all-reduce is CPU work: it competes with backward for the
same cores, and there is no idle time for overlap to hide (lesson 03). On a
cluster the link, not the CPU, is what the all-reduce waits for. A shaped
link brings that here: each rank sends at most RATE, so a sync takes the
time its bytes take on the wire, and the rank's core is free meanwhile.

The layout, a star as in a rack behind one switch:

    host h0: tp0 --veth-- s0 \
    host h1: tp0 --veth-- s1 -- br0, a bridge in the namespace "sw"
    ...                    /

Host i is the namespace "tp<pid>-h<i>" with the address 10.X.Y.(i+1)/24 on
its interface tp0 (X.Y from the pid, tools/namespaces.py), whose egress
queue is `tc qdisc ... root tbf rate RATE`: what host i sends leaves at
RATE at most, as from a NIC of that speed. Traffic into a host is limited
by its sender's queue. Every device, and so every qdisc, lives inside the
namespaces: leaving the `with` block (or SIGTERM, SIGHUP, SIGINT) deletes
them all (tools/namespaces.py has the contract). `netem` (delay, loss) is
not used: the kernels the kit runs on do not all have it; tbf is everywhere.

Differences from a real cluster: the "wire" is memory, so there is no
propagation delay beyond the queue's; all hosts share this machine's
cores (the compute does not get faster with more hosts); and tbf paces
bytes, not packets on a wire of that speed, so a burst of up to
burst_bytes(rate) goes through at memory speed.

Raises namespaces.Unavailable (not root, no `ip`, no `tc`, no tbf): callers
skip, and tests exit namespaces.SKIP (77).
"""

import collections
import os
import re
import shutil
import socket
import subprocess
import sys
import time

# tools/: the namespaces shared with tests/multinode/netns.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from namespaces import SKIP, Namespaces, Unavailable  # noqa: E402,F401

INTERFACE = "tp0"  # each host's end of its veth pair, inside its namespace
UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def parse_rate(text):
    """'100mbit', '1gbit', '2.5gbit' -> bits per second; ValueError otherwise."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)", text.strip().lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"a link rate is a positive number and a unit, kbit, mbit or gbit "
                         f"(as tc writes them: 100mbit, 1gbit, 2.5gbit); got '{text}'")
    return float(m.group(1)) * UNITS[m.group(2)]


def burst_bytes(bits_per_second):
    """The token bucket's depth: what may leave at once, above the rate.
    2 ms of the rate, and at least 64 KiB (a GSO segment of the veth; less
    and tbf would have to split every one)."""
    return max(64 << 10, int(bits_per_second / 8 * 2e-3))


class ShapedLink(Namespaces):
    def __init__(self, n, rate):
        if n < 1 or n > 200:
            raise ValueError(f"a shaped link has 1 to 200 hosts; got {n}")
        self.rate = rate
        self.bits_per_second = parse_rate(rate)
        super().__init__([f"h{i}" for i in range(n)] + ["sw"])
        *self.hosts, self.switch = self.namespaces
        for i, host in enumerate(self.hosts):
            host.address = f"{self.subnet}.{i + 1}"
            host.interface = INTERFACE

    def __enter__(self):
        if shutil.which("tc") is None:
            raise Unavailable("the tc command (Debian package iproute2) is not installed")
        return super().__enter__()

    def wire(self):
        sw = self.switch
        sw.run(["ip", "link", "add", "br0", "type", "bridge"])
        sw.run(["ip", "link", "set", "br0", "up"])
        for i, host in enumerate(self.hosts):
            port = f"s{i}"
            # Made inside the switch, the host's end moved straight into the
            # host: no device of the link ever exists outside the namespaces.
            sw.run(["ip", "link", "add", port, "type", "veth", "peer", "name", INTERFACE,
                    "netns", host.namespace])
            sw.run(["ip", "link", "set", port, "master", "br0"])
            sw.run(["ip", "link", "set", port, "up"])
            host.run(["ip", "addr", "add", host.address + "/24", "dev", INTERFACE])
            host.run(["ip", "link", "set", INTERFACE, "up"])
            r = host.run(["tc", "qdisc", "replace", "dev", INTERFACE, "root", "tbf",
                          "rate", self.rate, "burst", str(burst_bytes(self.bits_per_second)),
                          "latency", "50ms"], check=False)
            if r.returncode != 0:
                raise Unavailable(f"tc cannot add a tbf qdisc here: {r.stderr.strip()}")

    def qdisc(self, i):
        """Host i's egress qdisc as tc shows it, with its counters."""
        return self.hosts[i].run(["tc", "-s", "qdisc", "show", "dev", INTERFACE]).stdout


def tc_rate(qdisc):
    """The rate of the tbf in `tc qdisc show` output ("... tbf ... rate
    100Mbit ..."), in bits per second, or None when there is no tbf."""
    m = re.search(r"\btbf\b.*?\brate (\d+(?:\.\d+)?)([KMG]?)bit\b", qdisc)
    if not m:
        return None
    return float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]


def tc_sent_bytes(qdisc):
    """What the qdisc counted as sent (`tc -s qdisc show`: " Sent N bytes"),
    headers included, or None."""
    m = re.search(r"\bSent (\d+) bytes\b", qdisc)
    return int(m.group(1)) if m else None


# The receiving and sending ends of transfer(), run inside the namespaces.
# Their times are CLOCK_MONOTONIC, which every network namespace shares.
_RECEIVE = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
print("listening", flush=True)
c, _ = s.accept(); n = 0; first = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if first is None: first = time.monotonic()
    n += len(b); last = time.monotonic()
print(n, repr(first), repr(last), flush=True)
"""
_SEND = r"""
import socket, sys, time
print(repr(time.monotonic()), flush=True)
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
c.sendall(bytes(int(sys.argv[3]))); c.close()
"""


class Transfer(collections.namedtuple("Transfer", "nbytes started first last")):
    """One transfer of nbytes: `started` when the sender began to connect,
    `first` and `last` when the receiver had its first and its last bytes
    (seconds, CLOCK_MONOTONIC)."""

    @property
    def receiver_rate(self):
        """bits/s from the first byte received to the last: the connection's
        set-up is not in it, but a receiver scheduled late (a loaded machine)
        finds bytes already queued and so may see more than the link carried."""
        return self.nbytes * 8 / (self.last - self.first)

    @property
    def end_to_end_rate(self):
        """bits/s from the sender's start to the receiver's last byte: the
        bytes took at least this long, so the link carried them at this rate
        or faster. Load can only lower it; a shaper bounds it from above."""
        return self.nbytes * 8 / (self.last - self.started)


def transfer(link, src, dst, nbytes, port=5201):
    """Sends nbytes over TCP from host src to host dst; returns its Transfer.
    The first burst_bytes leave at memory speed: send many times that."""
    recv = link.hosts[dst].popen([sys.executable, "-c", _RECEIVE, link.hosts[dst].address,
                                  str(port)], stdout=subprocess.PIPE, text=True)
    try:
        if recv.stdout.readline().strip() != "listening":
            raise RuntimeError("throughput: the receiver did not start")
        sent = link.hosts[src].run([sys.executable, "-c", _SEND, link.hosts[dst].address,
                                    str(port), str(nbytes)])
        out, _ = recv.communicate(timeout=120)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    received, first, last = out.split()
    if int(received) != nbytes:
        raise RuntimeError(f"throughput: sent {nbytes} bytes, {received} arrived")
    return Transfer(nbytes, float(sent.stdout.split()[0]), float(first), float(last))


def throughput(link, src, dst, nbytes, port=5201):
    """Sends nbytes over TCP from host src to host dst; returns the rate the
    receiver saw, in bits per second, from its first byte to its last (so the
    connection's set-up is not in it; the first burst_bytes arrive at memory
    speed: send many times that). Transfer.receiver_rate."""
    return transfer(link, src, dst, nbytes, port).receiver_rate
