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
meson reports as SKIPPED, never as passed.
"""

import os
import shutil
import signal
import subprocess
import time

SKIP = 77  # meson's exit code for a skipped test
INTERFACE = "tp0"  # each host's end of the veth pair, inside its namespace


class Unavailable(Exception):
    pass


def run(cmd, check=True):
    return subprocess.run(cmd, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


class Host:
    def __init__(self, namespace, veth, address):
        self.namespace = namespace
        self.veth = veth  # its end of the veth pair, before it moves in and becomes INTERFACE
        self.interface = INTERFACE
        self.address = address

    def command(self, argv):
        return ["ip", "netns", "exec", self.namespace] + list(argv)

    def popen(self, argv, **kwargs):
        return subprocess.Popen(self.command(argv), **kwargs)

    def pids(self):
        out = run(["ip", "netns", "pids", self.namespace], check=False).stdout
        return [int(p) for p in out.split()]

    def link(self, up):
        run(self.command(["ip", "link", "set", self.interface, "up" if up else "down"]))


class TwoHosts:
    def __init__(self):
        pid = os.getpid()
        self.tag = f"tp{pid}"
        subnet = f"10.{100 + pid % 100}.{(pid // 100) % 250}"
        self.a = Host(f"{self.tag}-a", f"{self.tag}a", f"{subnet}.1")
        self.b = Host(f"{self.tag}-b", f"{self.tag}b", f"{subnet}.2")
        self.made = []

    def __enter__(self):
        if shutil.which("ip") is None:
            raise Unavailable("the ip command (Debian package iproute2) is not installed")
        if os.geteuid() != 0:
            raise Unavailable("network namespaces need root (or CAP_SYS_ADMIN)")
        self.previous = signal.signal(signal.SIGTERM, self.on_term)
        try:
            for host in (self.a, self.b):
                r = run(["ip", "netns", "add", host.namespace], check=False)
                if r.returncode != 0:
                    raise Unavailable(f"ip netns add failed: {r.stderr.strip()}")
                self.made.append(host)
            run(["ip", "link", "add", self.a.veth, "type", "veth", "peer", "name", self.b.veth])
            for host in (self.a, self.b):
                run(["ip", "link", "set", host.veth, "netns", host.namespace])
                run(host.command(["ip", "link", "set", host.veth, "name", INTERFACE]))
                run(host.command(["ip", "addr", "add", host.address + "/24", "dev",
                                  host.interface]))
                run(host.command(["ip", "link", "set", host.interface, "up"]))
                run(host.command(["ip", "link", "set", "lo", "up"]))
        except subprocess.CalledProcessError as e:
            self.__exit__(None, None, None)
            raise Unavailable(f"{' '.join(e.cmd)} failed: {e.stderr.strip()}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def on_term(self, signum, frame):
        self.__exit__(None, None, None)
        raise SystemExit(128 + signum)

    def leftovers(self):
        """Processes still running in either namespace: [(host, pid, command)]."""
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
        for host in self.made:
            run(["ip", "netns", "del", host.namespace], check=False)
        self.made = []
        if getattr(self, "previous", None) is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None
        return False
