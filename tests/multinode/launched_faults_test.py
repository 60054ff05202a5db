#!/usr/bin/env python3
"""Launched ranks that fail, hang or stray, and what tprun and env:// say.

    launched_faults_test.py TPRUN FAULT_RANK

FAULT_RANK is tests/multinode/fault_rank.cc: a rank that all-reduces and, on
one rank, throws, spins, stops, calls a barrier, all-reduces another size or
skips where its third all-reduce is due. Each case checks tprun's report names the rank at fault (first, as
"the likely cause", where the others only waited for it) and says where the
others were (from the ranks' status files), as spawn's report does for forked
ranks. The stray-rank case starts ranks by hand, as a bare env://
launch would.
"""
import os
import socket
import subprocess
import sys
import time

TPRUN, FAULT_RANK = sys.argv[1], sys.argv[2]
TIMEOUT_MS = 3000  # the ranks' collective timeout


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tprun(fault, world=2, faulty=1):
    start = time.monotonic()
    r = subprocess.run([TPRUN, "--nproc-per-node", str(world), "--master-port", str(free_port()),
                        "--grace", "1", "--", FAULT_RANK, fault, str(faulty), str(TIMEOUT_MS)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    report = [line for line in r.stderr.splitlines() if line.startswith("tprun:")]
    return r, "\n".join(report), time.monotonic() - start


def expect(case, r, report, code, *words):
    if r.returncode != code or any(w not in report for w in words):
        missing = [w for w in words if w not in report]
        fail(f"{case}: exit {r.returncode} (expected {code}); missing {missing} in tprun's "
             f"report:\n{report}\nstderr:\n{r.stderr}")


def expect_first(case, report, line):
    if not report or report.splitlines()[0] != line:
        fail(f"{case}: tprun's report does not begin with\n{line}\nit says:\n{report}")


# 1. A healthy job: exit 0, nothing reported.
r, report, seconds = tprun("none", world=3)
expect("healthy job", r, report, 0)
print(f"a healthy 3-rank job: exit 0; {seconds:.2f} s")

# 2. A rank stopped outside any collective (SIGSTOP): rank 0 times out in the
# collective rank 1 never joins, and the report says rank 1 was stopped.
r, report, seconds = tprun("stop")
expect("stopped rank", r, report, 1, "rank 0 (local rank 0 on node 0) failed",
       "allreduce #3 on rank 0 timed out",
       "meanwhile: rank 1 was stopped (SIGSTOP), not in a collective (last: allreduce #2)")
# The headline is the cause, not the rank that timed out waiting for it.
expect_first("stopped rank", report, "tprun: rank 1 is the likely cause: it was stopped "
             "(SIGSTOP), not in a collective (last: allreduce #2), while rank 0 waited for it")
print(f"a stopped rank: {report.splitlines()[0]}; {seconds:.2f} s")

# 3. A rank computing forever outside any collective.
r, report, seconds = tprun("spin")
expect("spinning rank", r, report, 1, "allreduce #3 on rank 0 timed out",
       "meanwhile: rank 1 was not in a collective (last: allreduce #2)")
expect_first("spinning rank", report, "tprun: rank 1 is the likely cause: it was not in a "
             "collective (last: allreduce #2) while rank 0 waited in a collective for it")
print(f"a spinning rank: {report.splitlines()[0]}; {seconds:.2f} s")

# 2b. Rank 0 stopped: the TCP store lives in its process. Where the others
# reach their step's end after it stopped (a race: they may have checked
# just before), their check of the collective counts cannot be answered;
# they give up on it within 2 s, saying so, and go on to the collective
# where rank 0 is named. Before, they waited the whole collective timeout
# there first, outside any collective ("did not answer within 3000 ms").
r, report, seconds = tprun("stop", world=3, faulty=0)
expect("rank 0 stopped", r, report, 1, "timed out")
if not report.splitlines()[0].startswith("tprun: rank 0 is the likely cause: it was stopped "
                                         "(SIGSTOP)") or \
        "did not answer within 3000 ms" in r.stderr or \
        ("no longer checked" in r.stderr) != ("did not answer within 2000 ms" in r.stderr):
    fail(f"rank 0 stopped: report:\n{report}\nstderr:\n{r.stderr}")
print(f"a stopped rank 0 (the store's host): {report.splitlines()[0][:60]}...; {seconds:.2f} s")

# 4. A barrier where the others all-reduce: both sides are named.
r, report, seconds = tprun("barrier")
expect("barrier vs allreduce", r, report, 1, "timed out",
       "the ranks issued different collectives as #3: allreduce on rank 0, barrier on rank 1")
if "likely cause" in report:  # one against one: nothing says which rank is wrong
    fail(f"barrier vs allreduce, 2 ranks: a likely cause was named:\n{report}")
print(f"a barrier against an all-reduce: {report.splitlines()[2]}; {seconds:.2f} s")
# 4b. The same among 3 ranks: the odd one out leads the report.
r, report, seconds = tprun("barrier", world=3)
expect("barrier vs allreduce, 3 ranks", r, report, 1, "timed out")
expect_first("barrier vs allreduce, 3 ranks", report, "tprun: rank 1 is the likely cause: it "
             "issued barrier as #3 where ranks 0 and 2 issued allreduce")
print(f"a barrier against two all-reduces: {report.splitlines()[0]}; {seconds:.2f} s")

# 4c. Two faults where only rank 1's status or count tells it apart, 3 ranks:
# an all-reduce of another size (the same name and number: the sizes in the
# status files name it), and an all-reduce left out whose next one has the
# same shape (nothing times out, the sums are wrong, and the step's
# collective counts name it, found by rank 0, the rank before it).
for fault, what, word, first in (
        ("size", "an all-reduce of another size", "timed out",
         "tprun: rank 1 is the likely cause: it issued allreduce of 9 float32 as #3 where ranks "
         "0 and 2 issued allreduce of 8 float32"),
        ("skip", "a skipped all-reduce", "rank 0 (local rank 0 on node 0) failed",
         "tprun: rank 1 is the likely cause: by the end of step 3 it had issued 2 collectives on "
         "this group where ranks 0 and 2 had issued 3: it skipped a collective the others issued "
         "(rank 0 found it)")):
    r, report, seconds = tprun(fault, world=3)
    expect(f"{what}, 3 ranks", r, report, 1, word)
    expect_first(f"{what}, 3 ranks", report, first)
    print(f"{what}: {report.splitlines()[0]}; {seconds:.2f} s")

# 5. A rank that throws is blamed, not its peers, which only lost their
# connection, also when no rank can write its error file; the report then
# says the file could not be written. Three ranks, so two consequences race
# the cause. Before the status files, tprun blamed whichever rank exited
# first there.
for fault in ("throw", "unwritable", "unwritable", "unwritable"):
    r, report, seconds = tprun(fault, world=3)
    # Without its error file, the message is its last stderr line.
    words = ["rank 1 (local rank 1 on node 0) failed: exit code 1: ", "planted fault: rank 1 threw"]
    if fault == "unwritable":
        words.append("rank 1 could not write its error file (Is a directory); its kind and "
                     "time came from its status file")
    expect(f"rank that throws ({fault})", r, report, 1, *words)
    print(f"a rank that throws ({fault} error file): blamed; {seconds:.2f} s")

# 5b. A temporary folder that fills up (an 8 KiB tmpfs as TMPDIR, in a mount
# namespace of the test's own: room for two status files of three): tprun
# still runs the job, saying so, instead of a traceback that left its ranks
# behind. Needs root (unshare -m).
probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
if probe.returncode != 0:
    print("a full temporary folder: SKIPPED (needs unshare -m, root)")
else:
    full = f"/tmp/tp-full-{os.getpid()}"
    os.makedirs(full, exist_ok=True)
    script = (f"mount -t tmpfs -o size=8k tmpfs {full} && "
              f"TMPDIR={full} {TPRUN} --nproc-per-node 3 --master-port {free_port()} -- "
              f"{FAULT_RANK} none -1 {TIMEOUT_MS}")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    os.rmdir(full)
    if r.returncode != 0 or "Traceback" in r.stderr or \
            "tprun: cannot write status files" not in r.stderr:
        fail(f"full temporary folder: exit {r.returncode}, stderr:\n{r.stderr}")
    print(f"a full temporary folder: exit {r.returncode}, "
          f"{[l for l in r.stderr.splitlines() if l.startswith('tprun:')][0][:110]}...")

# 6. A rank of another job on the same port is refused; the real job runs.
port = free_port()
env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="3")
env.pop("TP_STATUS_FILE", None)
env.pop("TP_ERROR_FILE", None)
argv = [FAULT_RANK, "none", "-1", "20000"]
job = [subprocess.Popen(argv, env=dict(env, RANK=str(rank), TP_JOB_ID="job-a"),
                        stderr=subprocess.PIPE, text=True) for rank in (0, 2)]
time.sleep(0.5)
stray = subprocess.run(argv, env=dict(env, RANK="1", TP_JOB_ID="job-b"), stderr=subprocess.PIPE,
                       text=True, timeout=30)
if stray.returncode != 1 or "this rank belongs to another job" not in stray.stderr or \
        "TP_JOB_ID 'job-a'" not in stray.stderr or "TP_JOB_ID 'job-b'" not in stray.stderr:
    for p in job:
        p.kill()
    fail(f"stray rank: exit {stray.returncode}, stderr:\n{stray.stderr}")
real = subprocess.run(argv, env=dict(env, RANK="1", TP_JOB_ID="job-a"), stderr=subprocess.PIPE,
                      text=True, timeout=30)
codes = [p.wait(timeout=30) for p in job]
if real.returncode != 0 or codes != [0, 0]:
    fail(f"the real job after the stray: rank 1 exit {real.returncode}, ranks 0 and 2 {codes}\n"
         f"{real.stderr}\n{job[0].stderr.read()}\n{job[1].stderr.read()}")
print(f"a stray rank of another job: refused ({stray.stderr.strip().splitlines()[-1][:120]}...); "
      "the real job then ran, exit 0 on every rank")
