#!/usr/bin/env python3
"""tools/tprun on one machine: environment, a failing rank, signals, bad options.

    tprun_test.py TPRUN

Ranks here are small shell scripts, so each case takes well under a second
(plus tprun's 0.5 s settle window where a rank fails). After each case no
process of the case may be left: every process the test starts carries a
marker in its environment (and every rank in its command line), and the test
looks for it in /proc.
"""
import os
import signal
import subprocess
import sys
import time

TPRUN = sys.argv[1]
MARKER = f"tprun-test-{os.getpid()}"  # in every rank's command line
# ... and in the environment of every process the test starts, so a rank's
# children (a `sleep` started by its shell) are found too.
os.environ["TPRUN_TEST_MARKER"] = MARKER


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def leftovers():
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if MARKER in cmd or MARKER.encode() in environ:
            found.append((int(pid), cmd.strip()))
    return found


def check_nothing_left(case):
    for _ in range(40):  # a killed process may take a moment to be reaped
        if not leftovers():
            return
        time.sleep(0.05)
    fail(f"{case}: processes left: {leftovers()}")


def wait_for_sleeps(count, seconds=60):
    """True once `count` of the case's `sleep` processes run."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if sum(cmd.startswith("sleep ") for _, cmd in leftovers()) >= count:
            return True
        time.sleep(0.05)
    return False


def rank_script(body):
    # $0 is the marker, so every process of the rank carries it.
    return ["sh", "-c", body, MARKER]


def run(args, timeout=30):
    start = time.monotonic()
    r = subprocess.run([TPRUN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=timeout)
    return r, time.monotonic() - start


# 1. The environment of each rank, as torchrun sets it.
r, _ = run(["--nnodes", "3", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr",
            "10.1.2.3", "--master-port", "29555", "--job-id", "j", "--",
            *rank_script('echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK '
                         '$MASTER_ADDR $MASTER_PORT $TP_JOB_ID"')])
lines = sorted(r.stdout.split("\n")[:-1])
expected = ["2 0 6 2 1 10.1.2.3 29555 j", "3 1 6 2 1 10.1.2.3 29555 j"]
if r.returncode != 0 or lines != expected:
    fail(f"environment: exit {r.returncode}, lines {lines}, expected {expected}\n{r.stderr}")
print("environment: ranks 2 and 3 of 6 on node 1 get RANK, LOCAL_RANK, WORLD_SIZE, ... right")

# 1a. Under Slurm (one tprun per node, started by srun), the node, the nodes,
# the master and the job id come from Slurm's variables.
slurm = dict(os.environ, SLURM_NNODES="3", SLURM_NODEID="1", SLURM_JOB_ID="77",
             SLURM_JOB_NODELIST="10.1.2.[3-5],gpu[07-08]")
r = subprocess.run([TPRUN, "--nproc-per-node", "2", "--master-port", "29555", "--",
                    *rank_script('echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE '
                                 '$GROUP_RANK $MASTER_ADDR $MASTER_PORT $TP_JOB_ID"')],
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30,
                   env=slurm)
lines = sorted(r.stdout.split("\n")[:-1])
expected = ["2 0 6 2 1 10.1.2.3 29555 slurm-77", "3 1 6 2 1 10.1.2.3 29555 slurm-77"]
if r.returncode != 0 or lines != expected:
    fail(f"under Slurm: exit {r.returncode}, lines {lines}, expected {expected}\n{r.stderr}")
print("under Slurm: node 1 of 3, master 10.1.2.3 and job id slurm-77 from Slurm's variables")

# 1b. Without --job-id, each one-node job gets an id of its own (env:// then
# refuses a rank of another job on the same port).
ids = []
for _ in range(2):
    r, _ = run(["--nproc-per-node", "2", "--", *rank_script('echo "$TP_JOB_ID"')])
    ids.append(sorted(set(r.stdout.split())))
if any(len(i) != 1 or not i[0].startswith("tprun-") for i in ids) or ids[0] == ids[1]:
    fail(f"default job ids: {ids}; expected one fresh tprun-... id per job")
print(f"default job ids: one per job ({ids[0][0]}, {ids[1][0]})")
r = subprocess.run([TPRUN, "--nnodes", "2", "--nproc-per-node", "1", "--",
                    *rank_script('echo "$TP_JOB_ID"')], stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, text=True, timeout=30,
                   env=dict(os.environ, TP_JOB_ID="mine"))
if r.returncode != 0 or r.stdout.split() != ["mine"]:
    fail(f"TP_JOB_ID as the default --job-id: exit {r.returncode}, {r.stdout!r}\n{r.stderr}")
print("TP_JOB_ID in the environment is the default --job-id, also across nodes")

# 1c. One OpenBLAS thread per rank unless the caller chose: OPENBLAS_NUM_THREADS
# or OMP_NUM_THREADS in tprun's environment wins.
for given, want in (({}, "1 -"), ({"OPENBLAS_NUM_THREADS": "2"}, "2 -"),
                    ({"OMP_NUM_THREADS": "3"}, "- 3")):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    r = subprocess.run([TPRUN, "--nproc-per-node", "2", "--",
                        *rank_script('echo "${OPENBLAS_NUM_THREADS:--} ${OMP_NUM_THREADS:--}"')],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30,
                       env=dict(env, **given))
    if r.returncode != 0 or r.stdout.split("\n")[:-1] != [want, want]:
        fail(f"BLAS threads with {given or 'nothing set'}: exit {r.returncode}, "
             f"{r.stdout!r}, expected {want!r} from each rank\n{r.stderr}")
print("OPENBLAS_NUM_THREADS: 1 for every rank, unless OPENBLAS_NUM_THREADS or "
      "OMP_NUM_THREADS is set")

# 2. A failing rank is named with its message; the others are ended at once.
r, seconds = run(["--nproc-per-node", "3", "--",
                  *rank_script('if [ "$RANK" = 1 ]; then echo "boom from rank 1" >&2; exit 3; '
                               'fi; sleep 60')])
want = "tprun: rank 1 (local rank 1 on node 0) failed: exit code 3: boom from rank 1"
if r.returncode != 1 or want not in r.stderr:
    fail(f"failing rank: exit {r.returncode}, stderr:\n{r.stderr}")
if "[rank 1] boom from rank 1" not in r.stderr:
    fail(f"failing rank: its stderr was not passed through:\n{r.stderr}")
if seconds > 10:
    fail(f"failing rank: tprun took {seconds:.1f} s (the others sleep 60 s)")
check_nothing_left("failing rank")
print(f"a failing rank: named with its message, the others ended; {seconds:.2f} s")

# 3. A rank killed by a signal.
r, seconds = run(["--nproc-per-node", "2", "--",
                  *rank_script('if [ "$RANK" = 0 ]; then kill -9 $$; fi; sleep 60')])
if r.returncode != 1 or "rank 0 (local rank 0 on node 0) failed: killed by signal 9 " \
                        "(SIGKILL)" not in r.stderr:
    fail(f"killed rank: exit {r.returncode}, stderr:\n{r.stderr}")
check_nothing_left("killed rank")
print(f"a rank killed by SIGKILL: named; {seconds:.2f} s")

# 4. SIGTERM and SIGINT to tprun reach every rank (and what they started).
for sig in (signal.SIGTERM, signal.SIGINT):
    p = subprocess.Popen([TPRUN, "--nproc-per-node", "2", "--grace", "1", "--",
                          *rank_script(f"sleep 60 & wait")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    # Until both ranks' sleeps run: tprun's handlers are in place before its
    # first rank starts. tprun itself carries the marker too, so count the
    # sleeps, and wait as long as a loaded machine needs (a fixed 5 s once
    # sent the signal to a tprun still starting, which died of it).
    if not wait_for_sleeps(2):
        p.kill()
        fail(f"{sig.name}: the ranks' sleeps did not start within 60 s: {leftovers()}")
    start = time.monotonic()
    p.send_signal(sig)
    _, err = p.communicate(timeout=30)
    seconds = time.monotonic() - start
    if p.returncode != 128 + sig or f"got {sig.name}" not in err:
        fail(f"{sig.name}: exit {p.returncode}, stderr:\n{err}")
    check_nothing_left(sig.name)
    print(f"{sig.name} to tprun: forwarded, every rank and child gone, exit {p.returncode}; "
          f"{seconds:.2f} s")

# 5. tprun killed outright: its ranks die with it (PR_SET_PDEATHSIG).
p = subprocess.Popen([TPRUN, "--nproc-per-node", "2", "--", *rank_script("exec sleep 60")],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if not wait_for_sleeps(2):
    p.kill()
    fail(f"tprun killed: the ranks' sleeps did not start within 60 s: {leftovers()}")
p.kill()
p.wait()
check_nothing_left("tprun killed")
print("tprun killed with SIGKILL: its ranks go too")

# 6. Bad options: exit 2, naming the option, nothing started.
for args, words in [
        (["--nnodes", "2", "--node-rank", "2", "--", "true"], "--node-rank 2 is out of range"),
        (["--master-port", "70000", "--", "true"], "--master-port 70000 is not a port"),
        (["--nproc-per-node", "2"], "no program to run"),
        (["--nnodes", "2", "--", "true"], "--nnodes 2 needs --job-id ID"),
        (["--", "/nonexistent/program"], "cannot start /nonexistent/program")]:
    r, _ = run(args)
    if r.returncode != 2 or words not in r.stderr:
        fail(f"bad options {args}: exit {r.returncode}, stderr:\n{r.stderr}")
print("bad options: exit 2 with the option named")

# 7. tprun's own stderr full (or closed): the ranks' stderr is still read, so
# a chatty rank is never blocked on a full pipe, and the job's exit code is
# its own. 20000 lines are about 600 KB, ten times a pipe's buffer.
CHATTY = ('i=0; while [ $i -lt 20000 ]; do echo "line $i from a chatty rank $RANK" >&2; '
          'i=$((i+1)); done; ')
for body, code in [(CHATTY + "exit 0", 0), (CHATTY + '[ "$RANK" = 1 ] && exit 3; exit 0', 1)]:
    with open("/dev/full", "w") as full:
        try:
            p = subprocess.run([TPRUN, "--nproc-per-node", "2", "--", *rank_script(body)],
                               stdout=subprocess.DEVNULL, stderr=full, timeout=30)
        except subprocess.TimeoutExpired:
            check_nothing_left("stderr full (after the timeout)")
            fail("stderr full: tprun did not end within 30 s (a rank blocked on its stderr pipe?)")
    if p.returncode != code:
        fail(f"stderr full: exit {p.returncode}, expected {code}")
    check_nothing_left("stderr full")
# The same with tprun's stderr closed (2>&-).
try:
    p = subprocess.run([TPRUN, "--nproc-per-node", "2", "--", *rank_script(CHATTY + "exit 0")],
                       stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(2), timeout=30)
except subprocess.TimeoutExpired:
    fail("stderr closed: tprun did not end within 30 s")
if p.returncode != 0:
    fail(f"stderr closed: exit {p.returncode}, expected 0")
check_nothing_left("stderr closed")
print("tprun's stderr full or closed: chatty ranks still finish; exit 0, or 1 when a rank fails")

# 9. A rank that leaves a process running outside its process group (setsid:
# a session of its own) and exits 0: tprun, a child subreaper, gets the
# orphan as its child and ends it with the job, and says so. A sleep that
# ignores SIGTERM would not matter: it gets SIGKILL. Each rank also leaves
# one in its group (ended by killpg, it reaches tprun as a zombie): the
# count names only the 2 that ran outside the groups.
def kill_leftovers():
    for pid, _ in leftovers():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


for end in ("exit 0", "exit 3"):
    try:
        # (An orphan left running keeps tprun's stdout open: the run would not end.)
        r, took = run(["--nproc-per-node", "2", "--",
                       *rank_script(f"sleep 300 & setsid sleep 300 & sleep 0.2; {end}")],
                      timeout=20)
    except subprocess.TimeoutExpired:
        kill_leftovers()
        fail(f"a rank's setsid child ({end}): the job did not end within 20 s; processes "
             "left running outside the ranks' groups (killed now)")
    want = 0 if end == "exit 0" else 1
    if r.returncode != want or "ended 2 process(es) the ranks had started" not in r.stderr:
        kill_leftovers()
        fail(f"a rank's setsid child ({end}): exit {r.returncode} (want {want}), "
             f"stderr {r.stderr!r}")
    check_nothing_left(f"a rank's setsid child ({end})")
print("a rank's process started with setsid (outside its group) ends with the job: tprun "
      "is a child subreaper")

# 9b. A child tprun had before it started the ranks (`sleep 300 & exec tprun`)
# is not the job's: it is left running.
p = subprocess.run(["sh", "-c", 'sleep 300 >/dev/null 2>&1 & exec "$0" --nproc-per-node 1 -- '
                    f'sh -c "exit 0" {MARKER}', TPRUN], stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, text=True, timeout=30)
mine = [pid for pid, cmd in leftovers() if cmd == "sleep 300"]
kill_leftovers()
if p.returncode != 0 or not mine or "ended" in p.stderr:
    fail(f"a child tprun had before the job: exit {p.returncode}, still running: {mine}, "
         f"stderr {p.stderr!r}; it must be left alone")
check_nothing_left("a child tprun had before the job")
print("a child tprun had before it started the ranks is left alone")
