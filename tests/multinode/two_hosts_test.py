#!/usr/bin/env python3
"""A 2 x 2-rank job across two network namespaces, through tprun.

    two_hosts_test.py TPRUN DEMO env [CHECKER]
                                          the env:// job matches the one-machine run;
                                          the stage's checker passes its W = 4 cases
    two_hosts_test.py TPRUN DEMO redis    the same through a redis-server on host a
    two_hosts_test.py TPRUN DEMO faults   a rank SIGKILLed, a link taken down, the
                                          store's host killed, a host that never
                                          arrives, redis-server killed

DEMO is a lesson demo (the latest stage's). Two hosts (netns.py) each run
`tprun --nnodes 2 --nproc-per-node 2` with their --node-rank; host a is the
master. "Matches" means the --json output, every rank's loss at every step
and every final norm, is identical, bit for bit (the JSON prints 17
significant digits), to `DEMO --world-size 4` forking its ranks on one
machine: the same plan, reduced in the same order, gives the same numbers
whatever the transport. Each rank's memory peak is left out: it is a
measurement, not a result, and depends on when the communication thread
lets go of a collective's tensors (see without_memory_peaks).

Each fault case prints the time from the fault to each tprun's exit, its
exit code, its last line, and the processes left in the namespaces, and
fails unless both hosts end non-zero (or, where the job can survive, as the
case says), in time, naming the cause, with nothing left behind.

Exits 77 (SKIPPED) when namespaces cannot be made, saying why.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402

# Every tprun of a test ends within this many seconds, or the test fails.
JOB_DEADLINE = 90.0
# The fault cases' collective (and rendezvous) deadline: a lost peer that is
# not noticed from a closed connection is noticed after this long.
FAULT_TIMEOUT_MS = 5000
# A fault case's job trains for much longer than the case lasts.
LONG_STEPS = "100000"


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


class Job:
    """One tprun per host, started at once."""

    def __init__(self, hosts, tprun, demo, demo_args, which=("a", "b"), port=29500, env=None):
        self.procs = {}
        self.ended = {}
        self.outputs = {}
        self.files = {}
        for name in which:
            host = getattr(hosts, name)
            node = 0 if name == "a" else 1
            out = tempfile.TemporaryFile()
            self.files[name] = out
            argv = [tprun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                    "--master-addr", hosts.a.address, "--master-port", str(port),
                    "--job-id", f"tp-test-{os.getpid()}", "--grace", "1", "--", demo,
                    *demo_args]
            self.procs[name] = host.popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                          env=dict(os.environ, **(env or {})))
        self.started = time.monotonic()

    def wait(self, deadline=JOB_DEADLINE):
        """Waits for every tprun; returns {host: seconds since start}."""
        while len(self.ended) < len(self.procs):
            for name, p in self.procs.items():
                if name not in self.ended and p.poll() is not None:
                    self.ended[name] = time.monotonic()
            if time.monotonic() - self.started > deadline:
                for p in self.procs.values():
                    p.kill()
                self.collect()
                fail(f"the job did not end within {deadline} s: a hang\n{self.report()}")
            time.sleep(0.02)
        self.collect()
        return self.ended

    def collect(self):
        for name, f in self.files.items():
            f.seek(0)
            self.outputs[name] = f.read().decode(errors="replace")

    def code(self, name):
        return self.procs[name].returncode

    def last_line(self, name):
        lines = [l for l in self.outputs.get(name, "").splitlines() if l.startswith("tprun:")]
        return lines[0] if lines else "(tprun printed nothing)"

    def report(self):
        return "\n".join(f"--- host {n} (exit {self.procs[n].returncode}):\n{o}"
                         for n, o in self.outputs.items())


def without_memory_peaks(data):
    """The demo's JSON without ranks[].memory.peak_model_state_bytes. The
    bytes live at the end are the same on every run; the peak may differ by a
    tensor freed a moment earlier or later on the communication thread."""
    for rank in data.get("ranks", []):
        if rank.get("memory"):
            rank["memory"].pop("peak_model_state_bytes", None)
    return data


def one_machine_json(demo, extra):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "one.json")
        r = subprocess.run([demo, "--world-size", "4", "--json", path, *extra],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=JOB_DEADLINE)
        if r.returncode != 0:
            fail(f"the one-machine run failed:\n{r.stdout}")
        with open(path) as f:
            return without_memory_peaks(json.load(f))


def check_same_as_one_machine(hosts, tprun, demo, init_method, extra, env=None):
    expected = one_machine_json(demo, extra)
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o777)
        path = os.path.join(d, "two.json")
        job = Job(hosts, tprun, demo, ["--init-method", init_method, "--json", path, *extra],
                  env=env)
        ended = job.wait()
        for name in ("a", "b"):
            if job.code(name) != 0:
                fail(f"host {name}'s tprun exited {job.code(name)}\n{job.report()}")
        with open(path) as f:
            got = without_memory_peaks(json.load(f))
    if got != expected:
        for key in expected:
            if got.get(key) != expected[key]:
                fail(f"{init_method}: '{key}' differs from the one-machine run:\n"
                     f"  two hosts: {json.dumps(got.get(key))[:400]}\n"
                     f"  one machine: {json.dumps(expected[key])[:400]}")
    final = got["final"]
    how = f"{init_method} {' '.join(f'{k}={v}' for k, v in (env or {}).items())}".strip()
    print(f"{how}: 2 hosts x 2 ranks match the one-machine run bit for bit "
          f"({len(got['steps'])} steps, every rank; final: {json.dumps(final)[:200]}); "
          f"job took {max(ended.values()) - job.started:.1f} s")


def check_checker(hosts, tprun, checker):
    """The checker's cases for 4 ranks pass with the ranks on two hosts."""
    job = Job(hosts, tprun, checker, ["--init-method", "env://"])
    job.wait()
    out = job.outputs["a"]
    if job.code("a") != 0 or job.code("b") != 0 or "every case matches the reference" not in out:
        fail(f"the checker failed across two hosts\n{job.report()}")
    passes = out.count("PASS ")
    if passes == 0:
        fail(f"the checker ran no case across two hosts\n{job.report()}")
    print(f"checker across 2 hosts x 2 ranks: {passes} cases of world size 4 pass")


def start_redis(host):
    """redis-server inside host's namespace; returns (process, port)."""
    server = shutil.which("redis-server")
    if server is None:
        print("SKIPPED: redis-server is not installed (Debian package redis-server; "
              "./kit installs it)")
        sys.exit(netns.SKIP)
    port = 6390
    p = host.popen([server, "--port", str(port), "--bind", host.address, "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--protected-mode", "no"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        r = subprocess.run(host.command(["redis-cli", "-h", host.address, "-p", str(port),
                                         "ping"]), stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
        if r.stdout.strip() == "PONG":
            return p, port
        time.sleep(0.05)
    p.kill()
    fail("redis-server did not answer within 10 s")


# ---- faults ------------------------------------------------------------------------

def rank_pids(job, name):
    """The local ranks tprun on host `name` started: its children."""
    out = subprocess.run(["pgrep", "-P", str(job.procs[name].pid)], stdout=subprocess.PIPE,
                         text=True).stdout
    return [int(p) for p in out.split()]


def gloo_connections(host, store_ports=(29500, 6390)):
    """Established TCP connections in host's namespace, the stores' left out."""
    out = subprocess.run(host.command(["ss", "-Htn", "state", "established"]),
                         stdout=subprocess.PIPE, text=True).stdout
    count = 0
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 4 and not any(f.endswith(f":{p}") for f in fields[2:4]
                                        for p in store_ports):
            count += 1
    return count


def wait_for_training(job, hosts):
    # Host b's two ranks hold a full mesh: each has a pair with each of
    # host a's ranks (4 sockets) and one with each other (2 sockets, both
    # ends here). Once all 6 are up, rendezvous is over and training runs;
    # 0.5 s more puts the fault well inside it (the job trains for minutes).
    deadline = time.monotonic() + 30.0
    while gloo_connections(hosts.b) < 6:
        for name, p in job.procs.items():
            if p.poll() is not None:
                job.collect()
                fail(f"host {name} ended before the fault\n{job.report()}")
        if time.monotonic() > deadline:
            fail("the ranks did not connect within 30 s")
        time.sleep(0.05)
    time.sleep(0.5)


def fault_case(title, hosts, job, fault_at, expect, limit=FAULT_TIMEOUT_MS / 1000 + 10):
    """Waits for the job, prints the measurements, checks `expect`."""
    job.wait()
    left = hosts.leftovers()
    print(f"\n== {title}")
    for name in sorted(job.procs):
        seconds = job.ended[name] - fault_at
        print(f"  host {name}: tprun exit {job.code(name)} {seconds:.2f} s after the fault: "
              f"{job.last_line(name)}")
    print(f"  processes left in the namespaces: {len(left)} {left if left else ''}")
    if left:
        fail(f"{title}: processes left behind: {left}")
    for name, (code_ok, words) in expect.items():
        seconds = job.ended[name] - fault_at
        if not code_ok(job.code(name)):
            fail(f"{title}: host {name}'s tprun exit code {job.code(name)}\n{job.report()}")
        for w in words:
            if w not in job.outputs[name]:
                fail(f"{title}: host {name}'s output lacks '{w}'\n{job.report()}")
        # Every loss is noticed within the collective timeout (plus
        # tprun's grace and a loaded machine's slack).
        if seconds > limit:
            fail(f"{title}: host {name} took {seconds:.1f} s to end")


def nonzero(code):
    return code != 0


def run_faults(hosts, tprun, demo):
    long_job = ["--init-method", "env://", "--steps", LONG_STEPS,
                "--collective-timeout", str(FAULT_TIMEOUT_MS)]

    job = Job(hosts, tprun, demo, long_job)
    wait_for_training(job, hosts)
    victim = rank_pids(job, "b")[0]  # local rank 0 of host b: global rank 2
    fault_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    fault_case("rank 2 (host b) killed with SIGKILL mid-training", hosts, job, fault_at, {
        "b": (nonzero, ["tprun: rank 2 (local rank 0 on node 1) failed: killed by signal 9"]),
        "a": (nonzero, ["tprun: rank", "failed"]),
    })

    job = Job(hosts, tprun, demo, long_job)
    wait_for_training(job, hosts)
    fault_at = time.monotonic()
    hosts.a.link(up=False)
    fault_case("host a's link taken down (ip link set down) mid-training", hosts, job, fault_at, {
        "a": (nonzero, ["tprun: rank", "timed out", "network link is down"]),
        "b": (nonzero, ["tprun: rank", "timed out", "network link is down"]),
    })
    hosts.a.link(up=True)

    job = Job(hosts, tprun, demo, long_job)
    wait_for_training(job, hosts)
    fault_at = time.monotonic()
    job.procs["a"].send_signal(signal.SIGKILL)  # the master: its ranks die with it
    fault_case("the store's host (host a, rank 0) killed mid-training", hosts, job, fault_at, {
        "a": (lambda c: c == -signal.SIGKILL, []),
        "b": (nonzero, ["tprun: rank", "failed"]),
    })

    job = Job(hosts, tprun, demo, long_job, which=("a",))
    fault_at = job.started
    fault_case("host b never arrives (only host a starts)", hosts, job, fault_at, {
        "a": (nonzero, ["missing: ranks 2, 3"]),
    })

    job = Job(hosts, tprun, demo, long_job, which=("b",))
    fault_at = job.started
    fault_case("the master never arrives (only host b starts)", hosts, job, fault_at, {
        "b": (nonzero, ["could not connect to the TCP store at " + hosts.a.address]),
    })

    redis, port = start_redis(hosts.a)
    try:
        job = Job(hosts, tprun, demo, ["--init-method", f"redis://{hosts.a.address}:{port}",
                                       "--steps", "1000", "--collective-timeout",
                                       str(FAULT_TIMEOUT_MS)])
        wait_for_training(job, hosts)
        fault_at = time.monotonic()
        redis.kill()
        # After rendezvous the ranks talk directly: the store is not needed
        # any more, and the job finishes, its collective counts unchecked
        # from there on (each rank says so).
        unchecked = ["collective counts are no longer checked"]
        fault_case("redis-server killed after rendezvous: the job goes on", hosts, job,
                   fault_at, {"a": (lambda c: c == 0, unchecked),
                              "b": (lambda c: c == 0, unchecked)},
                   limit=JOB_DEADLINE)
    finally:
        redis.kill()
        redis.wait()


def main():
    tprun, demo, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    checker = sys.argv[4] if len(sys.argv) > 4 else None
    # Uneven inputs need join(): the latest stage that has one (FSDP has
    # none), the latest stage itself when not given.
    join_demo = sys.argv[5] if len(sys.argv) > 5 else demo
    try:
        with netns.TwoHosts() as hosts:
            if mode == "env":
                check_same_as_one_machine(hosts, tprun, demo, "env://", [])
                check_same_as_one_machine(hosts, tprun, join_demo, "env://",
                                          ["--batches", "10,7,4,9", "--steps", "10"])
                # The interface named, not guessed: both hosts call theirs tp0.
                check_same_as_one_machine(hosts, tprun, demo, "env://", [],
                                          env={"GLOO_SOCKET_IFNAME": netns.INTERFACE})
                if checker:
                    check_checker(hosts, tprun, checker)
            elif mode == "redis":
                redis, port = start_redis(hosts.a)
                try:
                    check_same_as_one_machine(hosts, tprun, demo,
                                              f"redis://{hosts.a.address}:{port}", [])
                finally:
                    redis.kill()
                    redis.wait()
            elif mode == "faults":
                run_faults(hosts, tprun, demo)
            else:
                fail(f"unknown mode {mode}")
            left = hosts.leftovers()
            if left:
                fail(f"processes left behind: {left}")
    except netns.Unavailable as e:
        print(f"SKIPPED: cannot make network namespaces: {e}")
        sys.exit(netns.SKIP)


if __name__ == "__main__":
    main()
