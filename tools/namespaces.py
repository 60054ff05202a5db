"""Several "machines" on one: network namespaces that leave nothing behind.

    class MyHosts(Namespaces):          # a subclass wires them up
        def wire(self): ...             # veth pairs, addresses, qdiscs

    with MyHosts(["a", "b"]) as hosts:
        p = hosts.hosts[0].popen([...])  # a process inside host a

The shared part of tests/multinode/netns.py (two hosts joined by a veth
pair, for the multi-node tests) and bench/shaped_link.py (N hosts joined
through a rate-limited switch, for the benchmarks). It lives in tools/,
beside tools/tprun that both of them run, so that neither imports from
the other's folder: each puts tools/ on sys.path.

Contract:
  - Namespaces(names) names one namespace per host, "<tag>-<name>", where
    the tag "tp<pid>" comes from the process id, so that runs side by side
    never share a name. Subclasses make their links in wire(), always inside
    the namespaces, never in the machine's own: deleting the namespaces
    then deletes every veth, bridge and queueing discipline with them.
  - Entering makes the namespaces and calls wire(); if either fails,
    whatever was made is deleted again and Unavailable (not root, no `ip`,
    no CAP_SYS_ADMIN, or a command that failed, with its error) is raised.
    Callers that can run without namespaces exit SKIP (77): meson reports
    SKIPPED, never passed.
  - Leaving the `with` block, however it is left (an exception, SIGINT's
    KeyboardInterrupt), kills every process still in any of the namespaces
    (SIGKILL) and deletes them all. SIGTERM and SIGHUP do the same, then
    exit 128 + the signal number (the handlers are installed on entering and
    restored on leaving). SIGKILL of the Python process cannot be caught:
    clean_stale() deletes the namespaces of runs whose process is gone.
"""

import os
import re
import shutil
import signal
import subprocess
import time

SKIP = 77  # meson's exit code for a skipped test


class Unavailable(Exception):
    pass


def run(cmd, check=True):
    return subprocess.run(cmd, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def namespaces_now():
    """Every network namespace of the machine, by name."""
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def clean_stale():
    """Deletes the namespaces "tp<pid>-..." of processes that no longer run
    (a run killed by SIGKILL, which no handler sees), after killing what
    still runs in them; returns their names."""
    gone = []
    for name in namespaces_now():
        m = re.fullmatch(r"tp(\d+)-.+", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            host = Host(name)
            for pid in host.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            run(["ip", "netns", "del", name], check=False)
            gone.append(name)
    return gone


class Host:
    """One namespace: a "machine" with its own interfaces and addresses."""

    def __init__(self, namespace, address=None, interface=None):
        self.namespace = namespace
        self.address = address  # the host's address on the link, set by wire()
        self.interface = interface  # its end of the link, inside the namespace

    def command(self, argv):
        return ["ip", "netns", "exec", self.namespace] + list(argv)

    def run(self, argv, check=True):
        return run(self.command(argv), check=check)

    def popen(self, argv, **kwargs):
        return subprocess.Popen(self.command(argv), **kwargs)

    def pids(self):
        out = run(["ip", "netns", "pids", self.namespace], check=False).stdout
        return [int(p) for p in out.split()]

    def link(self, up):
        self.run(["ip", "link", "set", self.interface, "up" if up else "down"])


class Namespaces:
    """Hosts made of network namespaces; a subclass wires them (wire())."""

    HANDLED = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self, names):
        pid = os.getpid()
        self.tag = f"tp{pid}"
        # A /24 of its own per process: 10.X.Y.0, X.Y drawn from the pid.
        self.subnet = f"10.{100 + pid % 100}.{(pid // 100) % 250}"
        # Every namespace made; a subclass may call only some of them hosts
        # (a switch is a namespace, not a host).
        self.namespaces = [Host(f"{self.tag}-{name}") for name in names]
        self.hosts = list(self.namespaces)
        self.made = []
        self.previous = {}

    def wire(self):
        raise NotImplementedError

    def __enter__(self):
        if shutil.which("ip") is None:
            raise Unavailable("the ip command (Debian package iproute2) is not installed")
        if os.geteuid() != 0:
            raise Unavailable("network namespaces need root (or CAP_SYS_ADMIN)")
        for signum in self.HANDLED:
            self.previous[signum] = signal.signal(signum, self.on_signal)
        try:
            for host in self.namespaces:
                r = run(["ip", "netns", "add", host.namespace], check=False)
                if r.returncode != 0:
                    raise Unavailable(f"ip netns add failed: {r.stderr.strip()}")
                self.made.append(host)
                host.run(["ip", "link", "set", "lo", "up"])
            self.wire()
        except subprocess.CalledProcessError as e:
            self.__exit__(None, None, None)
            raise Unavailable(f"{' '.join(e.cmd)} failed: {e.stderr.strip()}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def on_signal(self, signum, frame):
        self.__exit__(None, None, None)
        raise SystemExit(128 + signum)

    def leftovers(self):
        """Processes still running in any of the namespaces: [(namespace, pid, command)]."""
        found = []
        for host in self.made:
            for pid in host.pids():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:
                    continue
                found.append((host.namespace, pid, cmd))
        return found

    def kill_all(self):
        for _ in range(50):
            pids = [pid for host in self.made for pid in host.pids()]
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def __exit__(self, *exc):
        self.kill_all()
        # Deleting a namespace deletes its interfaces; a veth's peer, in
        # another namespace, goes with it, and so does every qdisc on them.
        for host in self.made:
            run(["ip", "netns", "del", host.namespace], check=False)
        self.made = []
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)
        self.previous = {}
        return False
